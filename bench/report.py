#!/usr/bin/python3
"""report.py — turns the RESULT lines of one bench/run.sh run into tables:
printed on stdout and written (with the machine, date, command and method
notes) to bench/RESULTS.md, or build/bench/RESULTS-quick.md for --quick.

Definitions (all times are medians of the runs in the same run.sh call):
- useful FLOPs, projections: self-attention 8*B*T*d_model^2; cross-attention
  2*B*T*d^2 (Q) + 2*B*S*d^2 (K) + 2*B*S*d^2 (V) + 2*B*T*d^2 (O).
- useful FLOPs, attention: 4*B*h*T*S*d_k, halved when causal.
- "x torch" = torch time / mha time (above 1: mha is faster).
- attention-only time: an internal entry point's time when bench_mha prints
  one (kind=attn_only), else t(mha_forward) minus the library's own GEMM time
  on the projection shapes (mha_project_out, the fused QKV or Q + fused KV
  GEMM plus the O GEMM).
- FMA peak: best of the AVX2 FMA loop over the run (2 measurements, each the
  best of 7), all threads; AVX-512 shown for context only.
- decode bandwidth: bytes read per step / time; attention reads the K and V
  cache of L tokens, the whole step also the fp32 weights. It is compared with
  the streaming read bandwidth measured at the smallest buffer size that is
  at least as large as those bytes (the largest size when none is).
"""
import argparse
import datetime
import os
import re
import shlex
import subprocess
import sys


def parse(path):
    rows = []
    with open(path) as f:
        for line in f:
            if not line.startswith("RESULT "):
                continue
            row = {}
            for tok in shlex.split(line[len("RESULT "):]):
                k, _, v = tok.partition("=")
                row[k] = v
            rows.append(row)
    return rows


def num(row, key):
    try:
        return float(row[key])
    except (KeyError, TypeError, ValueError):
        return None


def find(rows, **kw):
    return [r for r in rows if all(r.get(k) == str(v) for k, v in kw.items())]


def one(rows, **kw):
    m = find(rows, **kw)
    return m[-1] if m else None


def fmt_ms(s):
    return "n/a" if s is None else f"{s * 1e3:.3f}" if s < 0.1 else f"{s * 1e3:.1f}"


def fmt(v, spec=".1f", none="n/a"):
    return none if v is None else format(v, spec)


def table(header, body):
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in body]
    return "\n".join(lines)


def machine_text():
    model, flags = "unknown", []
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
        for line in out.splitlines():
            k, _, v = line.partition(":")
            if k.strip() == "Model name":
                model = v.strip()
            if k.strip() == "Flags":
                flags = v.split()
    except OSError:
        pass
    want = ["avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_bf16", "avx512_fp16", "amx_tile"]
    have = [f for f in want if f in flags]
    return model, have, os.cpu_count()


def git_rev():
    try:
        r = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
        rev = r.stdout.strip() if r.returncode == 0 else "no commit"
        d = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True).stdout.strip()
        return rev + (" + uncommitted changes" if d else "")
    except OSError:
        return "unknown"


def flops_prefill(r):
    B, T, S, d, h = (int(r[k]) for k in ("B", "T", "S", "d_model", "h"))
    cross, causal = r["cross"] == "1", r["causal"] == "1"
    proj = (4 * B * T * d * d + 4 * B * S * d * d) if cross else 8 * B * T * d * d
    attn = 4 * B * h * T * S * (d // h) / (2 if causal else 1)
    return proj, attn


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--raw", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--command", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--mode", default="full")
    ap.add_argument("--seconds", type=int, default=0)
    a = ap.parse_args()
    rows = parse(a.raw)

    # ------------------------------------------------------------ machine
    fma = [num(r, "best_gflops") for r in find(rows, kind="machine", key="fma_avx2")]
    fma = [v for v in fma if v]
    peak = max(fma) if fma else None
    f512 = [num(r, "best_gflops") for r in find(rows, kind="machine", key="fma_avx512")]
    f512 = [v for v in f512 if v]
    streams = sorted((int(r["mib"]), num(r, "median_gbs"), num(r, "best_gbs"))
                     for r in find(rows, kind="machine", key="stream_read"))
    ob = one(rows, kind="machine", key="openblas") or {}
    tp = one(rows, kind="peer", impl="torch") or {}
    model, flags, ncpu = machine_text()
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    kernels = os.environ.get("MHA_KERNELS", "default (not set)")

    def bw_for(nbytes):
        if not streams:
            return None, None
        for mib, med, _ in streams:
            if mib * (1 << 20) >= nbytes:
                return med, mib
        return streams[-1][1], streams[-1][0]

    md = []
    md.append(f"# mha benchmark results ({a.mode})\n")
    md.append("Generated by bench/report.py; do not edit by hand.\n")
    md.append(f"- Command: `{a.command}` (run from the repository root; {a.seconds} s)")
    md.append(f"- Date: {now}; source: {git_rev()}")
    md.append(f"- Machine: {model}, {ncpu} CPUs; flags: {' '.join(flags)}")
    md.append(f"- Threads: {a.threads} for every implementation (OMP_NUM_THREADS, "
              f"mha_set_num_threads, openblas_set_num_threads, torch.set_num_threads)")
    md.append(f"- libmha path: mha_forward default options (MHA_PATH_AUTO); MHA_KERNELS={kernels}")
    md.append(f"- OpenBLAS: core {ob.get('corename', '?')}, {ob.get('threads', '?')} threads "
              f"({ob.get('config', '?')})")
    md.append(f"- PyTorch: {tp.get('version', '?')}, {tp.get('threads', '?')} threads, "
              f"interop {tp.get('interop_threads', '?')}")
    md.append(f"- AVX2 FMA peak (measured, {a.threads} threads): "
              + (", ".join(f"{v:.1f}" for v in fma) + f" GFLOP/s -> peak {peak:.1f}" if fma else "n/a")
              + (f"; AVX-512 FMA (context only): {max(f512):.1f} GFLOP/s" if f512 else ""))
    md.append("- Streaming read bandwidth (median of 7 passes): "
              + (", ".join(f"{mib} MiB: {med:.1f} GB/s" for mib, med, _ in streams) if streams else "n/a"))
    md.append("")

    # ------------------------------------------------------------ prefill
    body, gbody, targets = [], [], []
    notes = []
    for name in ["P1", "P2", "P3"]:
        m = one(rows, kind="prefill", impl="mha", name=name)
        t = one(rows, kind="prefill", impl="torch", name=name)
        ref = m or t
        if not ref:
            continue
        proj_f, attn_f = flops_prefill(ref)
        shape = (f"B={ref['B']} T={ref['T']} S={ref['S']} d={ref['d_model']} h={ref['h']}"
                 + (" causal" if ref["causal"] == "1" else "") + (" cross" if ref["cross"] == "1" else ""))
        tm = num(m, "median_s") if m else None
        tt = num(t, "median_s") if t else None
        if m and "error" in m:
            notes.append(f"{name}: mha_forward failed: {m['error']}")
        if m and m.get("nonfinite", "0") != "0":
            notes.append(f"{name}: mha output has {m['nonfinite']} non-finite values")
        gemms = find(rows, kind="gemm", name=name)
        mp = [g for g in gemms if g["impl"] == "mha_project_out"]
        direct = one(rows, kind="attn_only", impl="mha", name=name)
        attn, method = None, ""
        if direct and num(direct, "median_s"):
            attn, method = num(direct, "median_s"), direct.get("method", "internal entry")
        elif tm and mp and all(num(g, "median_s") for g in mp):
            est = tm - sum(num(g, "median_s") for g in mp)
            if est > 0.05 * tm:
                attn, method = est, "total - project_out"
            else:
                method = "n/a: project_out >= 95% of total"
        gf = (proj_f + attn_f) / tm * 1e-9 if tm else None
        agf = attn_f / attn * 1e-9 if attn else None
        speed = tt / tm if tm and tt else None
        body.append([name, shape, fmt_ms(tm), m.get("runs", "-") if m else "-", fmt(gf),
                     fmt(gf / peak * 100 if gf and peak else None, ".0f") + "%",
                     fmt_ms(tt), (t or {}).get("torch_path", "-"), fmt(speed, ".2f"),
                     fmt_ms(attn), fmt(agf), fmt(agf / peak * 100 if agf and peak else None, ".0f") + "%",
                     method or "-"])
        for gname in ["qkv", "q", "kv", "o"]:
            o = one(rows, kind="gemm", impl="openblas", name=name, gemm=gname)
            p = one(rows, kind="gemm", impl="mha_project_out", name=name, gemm=gname)
            if not o and not p:
                continue
            g = o or p
            M, K, N = int(g["M"]), int(g["K"]), int(g["N"])
            fl = 2.0 * M * K * N
            to, tp_ = num(o, "median_s") if o else None, num(p, "median_s") if p else None
            gbody.append([name, gname, f"{M}x{K}x{N}", fmt_ms(to), fmt(fl / to * 1e-9 if to else None),
                          fmt_ms(tp_), fmt(fl / tp_ * 1e-9 if tp_ else None),
                          fmt(to / tp_ if to and tp_ else None, ".2f")])
            if p and "error" in p:
                notes.append(f"{name} {gname}: mha_project_out failed: {p['error']}")
        if name == "P1":
            targets.append(["P1 >= 4x PyTorch", fmt(speed, ".2f") + "x", verdict(speed, 4)])
            og = one(rows, kind="gemm", impl="openblas", name=name, gemm="qkv")
            pg = one(rows, kind="gemm", impl="mha_project_out", name=name, gemm="qkv")
            r = num(og, "median_s") / num(pg, "median_s") if og and pg and num(pg, "median_s") else None
            targets.append(["P1 projection GEMM (fused QKV) >= OpenBLAS", fmt(r, ".2f") + "x", verdict(r, 1)])
        if name == "P2":
            targets.append(["P2 >= 8x PyTorch", fmt(speed, ".2f") + "x", verdict(speed, 8)])
            fr = agf / peak if agf and peak else None
            targets.append(["P2 attention-only >= 60% of FMA peak",
                            fmt(fr * 100 if fr else None, ".0f") + "%", verdict(fr, 0.6)])

    pre_tab = table(["config", "shape", "mha ms", "runs", "GFLOP/s", "% peak", "torch ms", "torch path",
                     "x torch", "attn-only ms", "attn GFLOP/s", "attn % peak", "attn method"], body)
    gemm_tab = table(["config", "GEMM", "MxKxN", "OpenBLAS ms", "GFLOP/s", "mha_project_out ms",
                      "GFLOP/s", "mha speed / OpenBLAS"], gbody)

    # ------------------------------------------------------------- decode
    dbody = []
    dec = find(rows, kind="decode")
    keys = sorted({(r["cache"], int(r["h_kv"]), int(r["L"])) for r in dec},
                  key=lambda k: (k[0], -k[1], k[2]))
    h = next((int(r["h"]) for r in dec), None)
    for cache, hkv, L in keys:
        t = one(rows, kind="decode", impl="torch", cache=cache, h_kv=hkv, L=L)
        m = one(rows, kind="decode", impl="mha", cache=cache, h_kv=hkv, L=L)
        cb = num(t, "cache_bytes") if t else num(m, "cache_bytes") if m else None
        wb = num(t, "weight_bytes") if t else None
        ts, ta = (num(t, "step_median_s"), num(t, "attn_median_s")) if t else (None, None)
        ms_, ma = (num(m, "step_median_s"), num(m, "attn_median_s")) if m else (None, None)
        bw_attn, mib_a = bw_for(cb or 0)
        bw_step, _ = bw_for((cb or 0) + (wb or 0))

        def gbs(nb, s):
            return nb / s * 1e-9 if nb and s else None

        pending = m is not None and m.get("status") == "pending"
        dbody.append([cache, hkv, L, fmt(cb / 2**20 if cb else None),
                      fmt_ms(ts), fmt_ms(ta), fmt(gbs(cb, ta)),
                      fmt(gbs(cb, ta) / bw_attn * 100 if gbs(cb, ta) and bw_attn else None, ".0f") + "%",
                      "pending" if pending else fmt_ms(ms_), "pending" if pending else fmt_ms(ma),
                      "pending" if pending else fmt(gbs(cb, ma)),
                      "pending" if pending else fmt(gbs(cb, ma) / bw_attn * 100 if gbs(cb, ma) and bw_attn else None, ".0f") + "%",
                      "pending" if pending else fmt(ts / ms_ if ts and ms_ else None, ".2f"),
                      f"{mib_a} MiB" if mib_a else "n/a"])
    dec_tab = table(["cache", "h_kv", "L", "cache MiB", "torch step ms", "torch attn ms", "torch attn GB/s",
                     "torch attn % BW", "mha step ms", "mha attn ms", "mha attn GB/s", "mha attn % BW",
                     "x torch (step)", "BW ref. buffer"], dbody)

    # GQA / MQA speed-ups against MHA at the longest context, per implementation.
    sbody = []
    if keys and h:
        Lmax = max(k[2] for k in keys)
        for impl in ("torch", "mha"):
            for cache in sorted({k[0] for k in keys}):
                base = one(rows, kind="decode", impl=impl, cache=cache, h_kv=h, L=Lmax)
                for hkv in sorted({k[1] for k in keys if k[1] != h}, reverse=True):
                    r = one(rows, kind="decode", impl=impl, cache=cache, h_kv=hkv, L=Lmax)
                    if not base or not r or r.get("status") == "pending":
                        if r and r.get("status") == "pending":
                            sbody.append([impl, cache, f"{h}->{hkv}", Lmax, "pending", "pending"])
                        continue
                    sa = num(base, "attn_median_s") / num(r, "attn_median_s")
                    ss = num(base, "step_median_s") / num(r, "step_median_s")
                    sbody.append([impl, cache, f"{h}->{hkv}", Lmax, fmt(sa, ".2f"), fmt(ss, ".2f")])
    sp_tab = table(["impl", "cache", "h_kv", "L", "attn speed-up vs MHA", "step speed-up vs MHA"], sbody)
    if dec and all(r.get("status") == "pending" for r in find(rows, kind="decode", impl="mha")):
        targets.append(["decode targets (80% BW, GQA 3.5x, MQA 10x, 3x PyTorch)", "-",
                        "pending (KV cache API)"])
    tgt_tab = table(["target", "measured", "status"], targets)

    errors = find(rows, kind="error")
    for e in errors:
        notes.append(f"command failed (rc {e.get('rc')}): `{e.get('cmd')}`")

    md += ["## Prefill / encoder (issue 3)\n", pre_tab, "", "### Projection GEMMs\n", gemm_tab, "",
           "## Decode, one token per step at context L (issue 5)\n", dec_tab, "",
           "### Grouped / multi-query speed-up at the longest context\n", sp_tab, "",
           "## Targets\n", tgt_tab, ""]
    if notes:
        md += ["## Problems in this run\n"] + [f"- {n}" for n in notes] + [""]
    md += ["## Method\n", __doc__.split("Definitions", 1)[1].strip().replace("\n- ", "\n\n- "), "",
           "Peers: PyTorch nn.MultiheadAttention (eval, torch.no_grad(), need_weights=False, "
           "batch_first=True, causal as a float attn_mask); `torch path` says whether torch 1.13 ran "
           "its fused native kernel (read from the profiler). OpenBLAS cblas_sgemm without bias "
           "(beta=0); mha_project_out adds the bias. The decode peer is a hand-written PyTorch step "
           "(addmm projections, a preallocated (B,h_kv,L,d_head) cache written in place at slot L-1, "
           "matmul-softmax-matmul per kv-head group; fp16 caches widened with .float() because "
           "torch 1.13 has no CPU fp16 matmul). Raw lines: " + a.raw + ".", ""]
    text = "\n".join(md)
    os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
    with open(a.out, "w") as f:
        f.write(text)
    print(text)
    print(f"\nwritten: {a.out}")
    return 1 if errors else 0


def verdict(v, need):
    if v is None:
        return "not measured"
    return "met" if v >= need else "NOT met"


if __name__ == "__main__":
    sys.exit(main())
