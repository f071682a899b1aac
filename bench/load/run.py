#!/usr/bin/python3
"""run.py — what `make bench-load` runs: the whole `mha run` process on the
P1 checkpoint (B=4 T=512 d_model=768 h=12, nn.MultiheadAttention's torch
layout) against the in-process forward of the same layer, and where the
rest of the process's time goes (build/bench_load_phases).

    /usr/bin/python3 bench/load/run.py [--runs N] [--threads T] [--base OLD_MHA OLD_PHASES]

Every figure is the median of N fresh processes (default 11): wall time,
CPU time (user + sys of the child, robust when other processes share the
CPUs) and minor page faults. --base repeats everything with another build
(e.g. one of main) in interleaved order, for a before/after in one run.
The fixture (torch-initialised weights, X uniform in [-1, 1)) is written
once into build/bench/load/ with python3-torch."""
import argparse
import os
import resource
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(ROOT, "build", "bench", "load")
PHASES = ["weights_load", "input_read", "first_forward", "output_write"]
FLOOR = ["team", "map_read", "fresh", "write", "fsync", "rename"]
# P1: X and Y are (4, 512, 768) float32; the forward's Q, K, V and Z are
# each as large (d_k = d_v = 64, S = 512 already a multiple of 16)
P1_ACT = 4 * 512 * 768 * 4
FLOOR_OUT, FLOOR_FRESH = P1_ACT + 128, 5 * P1_ACT  # Y's .npy; Q, K, V, Z and Y


def make_fixture():
    ckpt, x = os.path.join(OUT, "p1.safetensors"), os.path.join(OUT, "x.npy")
    if os.path.exists(ckpt) and os.path.exists(x):
        return ckpt, x
    import numpy as np
    import torch
    sys.path.insert(0, os.path.join(ROOT, "tests", "python"))
    from io_helpers import write_safetensors
    torch.manual_seed(0)
    m = torch.nn.MultiheadAttention(768, 12, batch_first=True)
    write_safetensors(ckpt, {k: v.detach().numpy() for k, v in m.state_dict().items()},
                      {"n_heads": 12})
    np.save(x, (np.random.RandomState(0).rand(4, 512, 768) * 2 - 1).astype(np.float32))
    return ckpt, x


def timed(cmd, env):
    """(wall s, cpu s, minor faults, stdout) of one child process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if p.returncode:
        sys.exit(f"bench-load: {' '.join(cmd)} failed ({p.returncode}): {p.stderr.strip()}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, after.ru_minflt - before.ru_minflt, p.stdout


def parse_phases(line):
    kv = dict(f.split("=", 1) for f in line.split() if "=" in f)
    return {k: float(v) for k, v in kv.items() if k.endswith("_s")}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=11)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--base", nargs=2, metavar=("OLD_MHA", "OLD_PHASES"))
    a = ap.parse_args()
    os.makedirs(OUT, exist_ok=True)
    ckpt, x = make_fixture()
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads))
    builds = {"this": (os.path.join(ROOT, "build", "mha"), os.path.join(ROOT, "build", "bench_load_phases"))}
    floor_bin, floors = os.path.join(ROOT, "build", "bench_load_floor"), []
    if a.base:
        builds = {"base": tuple(a.base), **builds}
    res = {b: {"proc": [], "phases": []} for b in builds}
    for _ in range(a.runs):  # interleaved: both builds see the same noise
        for b, (mha, phases) in builds.items():
            y = os.path.join(OUT, f"y_{b}.npy")
            res[b]["proc"].append(timed([mha, "run", "--weights", ckpt, "--input", x, "--output", y], env)[:3])
            out = timed([phases, ckpt, x, os.path.join(OUT, f"yp_{b}.npy"), "7"], env)[3]
            res[b]["phases"].append(parse_phases(out))
        wall, _, _, out = timed([floor_bin, ckpt, x, os.path.join(OUT, "y_floor.npy"), str(FLOOR_OUT),
                                 str(FLOOR_FRESH)], env)
        floors.append(dict(parse_phases(out), proc_s=wall))
    with open("/proc/loadavg") as f:
        load = f.read().split()[0]
    print(f"# bench-load: P1 torch checkpoint, OMP_NUM_THREADS={a.threads}, {a.runs} runs, "
          f"load average {load} on {os.cpu_count()} CPUs (medians)")
    med = statistics.median
    for b, r in res.items():
        wall, cpu, flt = (med(v[i] for v in r["proc"]) for i in range(3))
        ph = {k: med(p[k] for p in r["phases"]) for k in r["phases"][0]}
        fw, fc = ph["forward_s"], ph["forward_cpu_s"]
        print(f"\n## {b}: {builds[b][0]}")
        print("| what | wall ms | cpu ms |\n|---|---:|---:|")
        print(f"| whole `mha run` process | {wall*1e3:.1f} | {cpu*1e3:.1f} |")
        print(f"| in-process forward (warm, median of 7) | {fw*1e3:.1f} | {fc*1e3:.1f} |")
        for k in PHASES:
            print(f"| phase: {k} | {ph[k + '_s']*1e3:.1f} | {ph[k + '_cpu_s']*1e3:.1f} |")
        print(f"\nprocess / forward: wall {wall/fw:.2f}x, cpu {cpu/fc:.2f}x; "
              f"minor page faults {flt:.0f}")
        print(f"RESULT kind=load build={b} proc_wall_s={wall:.6f} proc_cpu_s={cpu:.6f} "
              f"forward_s={fw:.6f} forward_cpu_s={fc:.6f} minflt={flt:.0f}")
    fl = {k: med(f[k] for f in floors) for k in floors[0]}
    fw = med(p["forward_s"] for p in res["this"]["phases"])
    print(f"\n## floor: what any P1 process pays besides the forward (build/bench_load_floor, no arithmetic)")
    print("| step | wall ms |\n|---|---:|")
    print(f"| whole floor process (exec, steps, exit) | {fl['proc_s']*1e3:.1f} |")
    for k in FLOOR:
        print(f"| {k} | {fl[k + '_s']*1e3:.1f} |")
    print(f"\nthe 1.4x target leaves 0.4 x {fw*1e3:.1f} = {0.4*fw*1e3:.1f} ms beside the forward; the floor "
          f"process takes {fl['proc_s']*1e3:.1f} ms ({fl['proc_s']/fw + 1:.2f}x the forward at best)")
    print(f"RESULT kind=load_floor_summary proc_s={fl['proc_s']:.6f} forward_s={fw:.6f} "
          + " ".join(f"{k}_s={fl[k + '_s']:.6f}" for k in FLOOR))


if __name__ == "__main__":
    main()
