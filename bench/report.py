#!/usr/bin/python3
"""report.py — turns the RESULT lines of one bench/run.sh run into tables:
printed on stdout and written (with the machine, date, command and method
notes) to bench/RESULTS.md, or build/bench/RESULTS-quick.md for --quick.

Definitions (times are medians over all runs of a configuration in the
same run.sh call; the rounds of a configuration alternate mha and torch):
- useful FLOPs, projections: self-attention 8*B*T*d_model^2; cross-attention
  2*B*T*d^2 (Q) + 2*B*S*d^2 (K) + 2*B*S*d^2 (V) + 2*B*T*d^2 (O).
- useful FLOPs, attention: 4*B*h*T*S*d_k, halved when causal.
- torch runs under the default OMP_WAIT_POLICY and under "passive" (with 2
  cores its OpenMP pool and OpenBLAS's threads otherwise spin against each
  other); the setting with the lower median is used, per configuration.
- "x torch" = torch time / mha time (above 1: mha is faster); "x torch
  (min)" is the same ratio of the fastest runs, less sensitive to other
  processes on a shared machine.
- attention-only: the fast path's attention kernel (mha_attention,
  src/forward/attention.h) timed alone, on Q, K, V that the fast path's own GEMM
  projected into the layouts mha_forward_fast uses (bench/bench_internal.c):
  Q K^T, masks, online softmax and P V, nothing else. "other ms" = forward -
  projection GEMMs - attention - O GEMM (allocation, validation, finiteness
  checks); medians are subtracted, so noise can make it slightly negative.
- GEMMs: mha_gemm (the fast path's packed GEMM; weights packed untimed, as
  at layer creation; bias fused; output in attention's layouts:
  bench/bench_fast.h) against OpenBLAS cblas_sgemm (row-major, the layer's
  weights side by side, no bias) on the same M x K x N and the same input
  rows, paired in one process (bench/bench_gemm.c, `bench_mha prefill
  --gemm-only`): rounds of one call of each, the order alternating round
  by round, up to 3 x reps rounds (15) or the budget, with the FMA loop of
  the ISA mha's kernels use (~4 ms) run before every round and after the
  last. One such process per OpenBLAS kernel set: the kernels it picks for
  this CPU (0.3.21 does not know every new CPU and may fall back to old
  kernels: its core name is printed), OPENBLAS_CORETYPE=Haswell (AVX2) and
  SkylakeX (AVX-512). "OpenBLAS ... ms": the median of its process's
  rounds. "mha / OpenBLAS ... (paired)": the median over that process's
  rounds of OpenBLAS time / mha time (above 1: mha is faster); "best" is
  the kernel set whose OpenBLAS median was lowest. "mha_gemm ms" and "mha %
  peak" come from that best process: mha's median over the best FMA loop of
  the same process (taken next to the calls, so it sees the same machine;
  the run's peak is measured minutes away; the GEMM rows' roofline uses
  the same peak). "mha_gemm alone ms": the same
  GEMM timed alone in the bench_mha --mha-only process (bench_internal.c),
  the check that pairing does not slow mha_gemm down, and its share of
  the run's FMA peak ("alone % peak"). The "GEMM >= OpenBLAS" targets use
  the paired ratios; the "% of peak" targets the alone time: the paired
  processes run OMP_WAIT_POLICY=passive (isolation, below), so each
  mha_gemm call there wakes its sleeping threads, a cost libmha's users
  (default policy) do not pay; the paired share is printed beside it. Self-attention: fused QKV (N = 3*d_model);
  cross-attention: Q (N = d_model over B*T rows) and fused KV (N =
  2*d_model over B*S rows); then O (N = d_model).
- isolation: libmha (and the FMA and bandwidth loops) run with
  OPENBLAS_NUM_THREADS=1: bench_mha links OpenBLAS, whose idle thread pool
  otherwise competes with libmha's OpenMP threads on 2 cores (a 5-step decode
  measured 100x slower). The paired GEMM processes run both pools with the
  bench's threads, under OMP_WAIT_POLICY=passive (libgomp's workers sleep
  when a parallel region ends; by default they spin for some milliseconds)
  and OPENBLAS_THREAD_TIMEOUT=4 (Debian's OpenBLAS 0.3.21: idle workers
  sleep after 2^4 cycles instead of spinning for 2^28, ~0.1 s): otherwise
  the library that ran last keeps up to a core busy while the other's
  call runs. Each process checks it: the CPU time the process uses in the
  20 ms after one call of each (idle_cores_after_mha / _blas in its
  RESULT line; over 0.05 cores is listed under the run's problems).
- FMA peak: best of the FMA loops (AVX2: 12 independent chains per thread;
  AVX-512: 16; all threads) over the run (measured at its start and end,
  each the best of 7). '% peak' columns use the peak of the ISA libmha's
  kernels ran with (the kernels= field of bench_mha's lines).
- roofline: the time the case's FLOPs allow at that FMA peak and its bytes
  at the measured read bandwidth (prefill and GEMMs: the streaming read of
  the smallest measured buffer at least as large as the bytes; decode: a
  cold read of the same bytes, below), whichever is longer; '% roofline' = roofline time / measured time. Bytes: full layer x
  (and kv), the four weights and y; attention Q, K, V and Z; a GEMM its
  three matrices; decode attention the K and V cache as stored (fp32, fp16,
  int8 with its scales, or K int8 + V fp16; FLOPs 4*h*L*d_head); the decode
  step that cache plus the four weights as stored (2 FLOPs per weight, in
  every storage type). MQA attention (h_kv = 1) is bound by its FLOPs, not
  its bytes: 32 query rows per key.
- ONNX Runtime: onnxruntime-node (CPU, MLAS kernels) run by node on models
  built with python3-onnx from the weights and inputs bench_mha dumped
  (bench/peer_ort.py): full layer = MatMul projections +
  com.microsoft.MultiHeadAttention (Q/K/V bias as its bias input, causal by
  unidirectional=1) + MatMul/Add; attention alone = MultiHeadAttention on
  Q, K, V. The layer's output is checked against libmha's (max abs error
  <= 1e-3), attention's against a float64 softmax(QK^T/sqrt(d_k))V (1e-4),
  before timing; "x ORT" = ORT time / mha time.
- backward (issue 12): mha_backward (MHA_PATH_AUTO: the fast backward),
  every gradient requested (dx, dW_*, db_*), self-attention; "fwd+bwd" runs
  mha_forward then mha_backward. "tape" rows: mha_backward_tape from a tape
  of mha_forward_train (no recomputation), "fwd+bwd" mha_forward_train then
  mha_backward_tape; both kinds interleaved round by round. Peer: torch nn.MultiheadAttention autograd
  (train mode, need_weights=False, causal as a float attn_mask) with the
  same gradients (peer_torch.py backward), in the same rounds; the faster
  OMP_WAIT_POLICY is used as for prefill. Attention alone: the fast
  backward's two passes (src/forward/backward_attention.c) on random Q, K,
  V, dZ; useful FLOPs = FlashAttention-2's backward count, 2.5x the
  forward's 4*B*h*T*S*d_k (halved when causal); executed FLOPs = the 7
  tile products it runs (pass 1 recomputes Z and lse), 5 for the tape row
  (pass 2 alone: the tape holds Z and lse); % peak against the FMA peak of
  the ISA it ran on.
- variants: `bench_mha variants` times mha_forward with RoPE (halves,
  theta 10000), ALiBi (default slopes), softcap (50) and sinks, one layer
  each from the same weights, round by round with the plain layer;
  overhead = fastest variant run / fastest plain run - 1.
  `bench_mha variants-backward` does the same for mha_backward (the fast
  backward; every gradient the layer has, dsinks and the QK-norm weights'
  included) on P1, with RMS QK-norm (weights shared by the heads) as a
  sixth variant; clip_qkv (8, DBRX's) and Llama 4's query temperature
  (floor 64, scale 0.1) are two more in both.
- decode, hot and cold: the step and attention alone are timed hot
  (repeated, as the torch peer is: the cache and the weights may stay in
  the last-level cache between calls; the GB/s and "x torch" columns) and
  cold: before each call the LLC is evicted by one pass over a 1 GiB
  buffer (over 3x this host's 300 MiB L3, shared with other tenants), as a
  model's other layers evict this layer's weights and cache between its
  decode steps. Each cold call alternates with a cold read, by the same
  threads, of the same number of bytes from a buffer of that size (the
  cache for attention; the cache and the stored weights for the step).
  Decode roofline = that cold read's time or the FLOPs at the FMA peak,
  whichever is longer (medians over the cold rounds); '% roofline' = it /
  the cold call's median. The read is measured per case and next to it
  because this host's memory bandwidth depends on the size read and on the
  neighbours: a hot 64 MiB buffer read at 21-49 GB/s in three quiet runs.
  'step serial bound': the most of that roofline a step can reach when
  its attention cannot overlap the weights' streams (it needs q, hence
  W_Q read first; W_O needs its output): the weights at the cold read's
  rate, plus the longer of the attention's FLOPs at the FMA peak and its
  cache's cold read. Below 80% (MQA at long context, where the attention
  is bound by arithmetic) the 80% target is out of reach for any kernel
  that keeps that order (bench/LIMITS.md, round 12).
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


def times_of(rows, **kw):
    """All run times of the matching rows (rounds of one configuration are
    merged before taking the median)."""
    out = []
    for r in find(rows, **kw):
        if r.get("times_s"):
            out += [float(t) for t in r["times_s"].split(",") if t]
        elif num(r, "median_s") is not None:
            out.append(num(r, "median_s"))
    return out


def best_decode(rows, impl, cache, h_kv, L):
    """The decode row with the lowest step median (torch is measured under
    two OMP_WAIT_POLICY settings; mha has one row)."""
    c = [r for r in find(rows, kind="decode", impl=impl, cache=cache, h_kv=h_kv, L=L)]
    timed = [r for r in c if num(r, "step_median_s")]
    return min(timed, key=lambda r: num(r, "step_median_s")) if timed else (c[-1] if c else None)


def best_torch_times(rows, name):
    """torch's runs under the OMP_WAIT_POLICY whose median is lower (run.sh
    measures both), and that policy's name."""
    groups = {}
    for r in find(rows, kind="prefill", impl="torch", name=name):
        groups.setdefault(r.get("omp_wait", "default"), []).extend(
            times_of([r], kind="prefill"))
    if not groups:
        return [], "-"
    wait = min(groups, key=lambda k: med(groups[k]))
    return groups[wait], wait


def med(v):
    if not v:
        return None
    s = sorted(v)
    n = len(s)
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


def fmt_ms(s):
    return "n/a" if s is None else f"{s * 1e3:.3f}" if s < 0.1 else f"{s * 1e3:.1f}"


def fmt(v, spec=".1f", none="n/a", suffix=""):
    return none if v is None else format(v, spec) + suffix


def decode_flops(r):
    """FLOPs a decode step of row r must do: attention 4*h*L*d_head (q k and
    p v, 2 each per key and dim, every head) plus one row through W_Q, W_K,
    W_V, W_O (2 per weight, whatever their storage type)."""
    D, h, hk, dh, L = (int(r[k]) for k in ("d_model", "h", "h_kv", "d_head", "L"))
    return 4.0 * h * L * dh, 2.0 * (D * (h + 2 * hk) * dh + h * dh * D)


def cold_roofline(cold, key, flops, peak):
    """(cold call seconds, roofline seconds) of the decode_cold row `cold`
    for key 'step' or 'attn': the roofline is the cold read of the same
    bytes (bench_decode.c, measured next to the call) or the FLOPs at the
    FMA peak, whichever is longer. Medians over the cold rounds."""
    if not cold:
        return None, None
    t, rd = num(cold, f"cold_{key}_median_s"), num(cold, f"cold_read_{key}_median_s")
    terms = [v for v in (rd, flops / (peak * 1e9) if peak and flops else None) if v]
    return t, (max(terms) if terms else None)


def serial_bound(cold, flops_attn, roofline, peak):
    """The most of its cold roofline a decode step can reach when its
    attention cannot overlap the weights' streams (it needs q, which needs
    W_Q read; W_O needs its output z): the weights at the cold read's rate
    (the step's read minus the cache's), then the attention at the longer of
    its FLOPs at the FMA peak and its cache's read. roofline / that time,
    or None."""
    if not cold or not roofline or not flops_attn or not peak:
        return None
    rs, ra = num(cold, "cold_read_step_median_s"), num(cold, "cold_read_attn_median_s")
    if not rs or not ra:
        return None
    return roofline / (rs - ra + max(flops_attn / (peak * 1e9), ra))


def weights_decode_table(rows, peak):
    """Decode steps with bf16 / int8 projection weights (kind=decode_weights)
    beside the fp32-weight step of the same shape (kind=decode, fp32 cache):
    bytes read (cache + stored weights), hot step time and speed-up, and
    '% roofline' = the cold roofline (cold_roofline) over the cold step."""
    body = []
    wrows = sorted(find(rows, kind="decode_weights"), key=lambda r: (r.get("weights"), -int(r["h_kv"]), int(r["L"])))
    for r in wrows:
        base = one(rows, kind="decode", impl="mha", cache=r.get("cache"), h_kv=r["h_kv"], L=r["L"])
        cold = one(rows, kind="decode_weights_cold", weights=r.get("weights"), cache=r.get("cache"),
                   h_kv=r["h_kv"], L=r["L"])
        t, t32 = num(r, "step_median_s"), num(base, "step_median_s") if base else None
        nb = (num(r, "cache_bytes") or 0) + (num(r, "weight_bytes") or 0)
        nb32 = (num(base, "cache_bytes") or 0) + (num(base, "weight_bytes") or 0) if base else None
        fa, fw = decode_flops(r)
        tc, rt = cold_roofline(cold, "step", fa + fw, peak)
        body.append([r.get("weights"), r["h_kv"], r["L"], fmt(num(r, "weight_bytes") / 2**20 if num(r, "weight_bytes") else None),
                     fmt(nb / 2**20), fmt_ms(t), fmt_ms(t32), fmt(t32 / t if t and t32 else None, ".2f"),
                     fmt(nb32 / nb if nb32 and nb else None, ".2f"),
                     fmt(nb / t * 1e-9 if t else None), fmt_ms(tc), fmt_ms(rt),
                     fmt(rt / tc * 100 if rt and tc else None, ".0f", suffix="%")])
    return table(["weights", "h_kv", "L", "weight MiB", "step MiB (K,V+W)", "step ms", "fp32-weight step ms",
                  "speed-up", "bytes fp32 / bytes", "step GB/s", "cold step ms", "cold roofline ms",
                  "% roofline (cold)"], body)


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


def bf16_prefill_table(rows, peak_isa, amx_peak, notes):
    """Prefill with bf16 weights and options.bf16_matmul (AMX where the CPU
    has it) against libmha's fp32 layer, PyTorch's bf16 module and, for
    scale, the fp32 peers. Roofline: the projections' FLOPs at the AMX
    peak (the FMA peak without AMX) plus attention's at the FMA peak."""
    body = []
    for name in ("P1", "P2", "P3"):
        b = one(rows, kind="prefill", impl="mha_bf16", name=name)
        if not b:
            continue
        if "error" in b:
            notes.append(f"{name}: bf16 prefill failed: {b['error']}")
            continue
        proj_f, attn_f = flops_prefill(b)
        tb = med(times_of(rows, kind="prefill", impl="mha_bf16", name=name))
        tm = med(times_of(rows, kind="prefill", impl="mha", name=name))
        ttb = med(times_of(rows, kind="prefill", impl="torch_bf16", name=name))
        tt, _ = best_torch_times(rows, name)
        tt = med(tt)
        to = med(times_of(rows, kind="prefill", impl="ort", name=name))
        amx = b.get("amx") == "1"
        proj_peak = amx_peak if amx and amx_peak else peak_isa
        lroof = (proj_f / (proj_peak * 1e9) + attn_f / (peak_isa * 1e9)) if proj_peak and peak_isa else None
        body.append([name, "AMX" if amx else "fp32 kernels", fmt_ms(tm), fmt_ms(tb),
                     fmt(tm / tb if tm and tb else None, ".2f", suffix="x"), fmt_ms(lroof),
                     fmt(lroof / tb * 100 if lroof and tb else None, ".0f", suffix="%"),
                     fmt_ms(ttb), fmt(ttb / tb if ttb and tb else None, ".2f"),
                     fmt(tt / tb if tt and tb else None, ".2f"), fmt(to / tb if to and tb else None, ".2f")])
    if not body:
        return "(not measured)"
    return table(["config", "projections on", "mha fp32 ms", "mha bf16 ms", "speed-up", "roofline ms",
                  "% roofline", "torch bf16 ms", "x torch bf16", "x torch fp32", "x ORT fp32"], body)


def variants_section(rows, targets, notes, kind="variant"):
    """Issue 13's variant overhead: bench_mha variants times mha_forward of
    one configuration with each variant on, interleaved with the plain
    layer (one run of each per round). Overhead = the variant's fastest run
    over plain's fastest run - 1 (the target's measure); the median of the
    per-round ratios is shown beside it (both see the same load). kind
    "variant_backward": bench_mha variants-backward's mha_backward (no
    target of its own; the forward's 10% is the yardstick)."""
    vrows = find(rows, kind=kind, impl="mha")
    if not vrows:
        return "(not measured in this run)"
    body, worst = [], None
    for name in sorted({r["name"] for r in vrows}):
        base = one(rows, kind=kind, impl="mha", name=name, variant="plain")
        bt = times_of([base], kind=kind) if base else []
        for r in find(rows, kind=kind, impl="mha", name=name):
            if r.get("error"):
                notes.append(f"{kind} {name} {r.get('variant')}: {r['error']}")
                continue
            t = times_of([r], kind=kind)
            over = min(t) / min(bt) - 1 if t and bt else None
            paired = med([a / b for a, b in zip(t, bt)]) - 1 if t and bt else None
            shape = f"B={r['B']} T={r['T']} d={r['d_model']} h={r['h']}" + (" causal" if r.get("causal") == "1" else "")
            body.append([name, shape, r["variant"], fmt_ms(med(t)), fmt_ms(min(t) if t else None), len(t),
                         fmt(over * 100 if over is not None else None, "+.1f", suffix="%"),
                         fmt(paired * 100 if paired is not None else None, "+.1f", suffix="%")])
            if kind == "variant" and r["variant"] != "plain" and name == "P2" and over is not None and \
                    (worst is None or over > worst[0]):
                worst = (over, r["variant"])
    if worst:
        targets.append(["variant overhead <= 10% on P2 (RoPE, ALiBi, softcap, sinks; the worst)",
                        f"{worst[0] * 100:+.1f}% ({worst[1]})", "met" if worst[0] <= 0.10 else "NOT met"])
    return table(["config", "shape", "variant", "mha ms (median)", "mha ms (min)", "runs",
                  "overhead vs plain (min)", "overhead (median of paired ratios)"], body)


def nn_modern_section(rows):
    """bench/nn_modern_step.py: forward + backward of one layer with RoPE,
    RMS QK-norm and GQA, causal, from PyTorch: mha.nn.Attention (libmha's
    tape) and the same layer written in PyTorch, alternating round by
    round after checking they agree."""
    body = []
    for r in find(rows, kind="nn_modern_step", impl="mha"):
        t = one(rows, kind="nn_modern_step", impl="torch", B=r["B"], T=r["T"], d_model=r["d_model"])
        if not t:
            continue
        body.append([f"B={r['B']} T={r['T']} d={r['d_model']} h={r['h']} h_kv={r['h_kv']}",
                     fmt_ms(num(t, "median_s")), fmt_ms(num(r, "median_s")),
                     fmt(num(t, "median_s") / num(r, "median_s"), ".2f", suffix="x"),
                     fmt(num(t, "min_s") / num(r, "min_s"), ".2f", suffix="x")])
    if not body:
        return "(not measured in this run)"
    return table(["shape", "torch ms (median)", "mha.nn ms (median)", "x torch (median)", "x torch (min)"], body)


# OpenBLAS kernels of the --gemm-only processes: OPENBLAS_CORETYPE (the
# gemm_pair line's openblas=) and how the GEMM table names them.
GEMM_CORES = (("auto", None), ("Haswell", "AVX2"), ("SkylakeX", "AVX-512"))


def gemm_auto_core(rows):
    """The core OpenBLAS picked by itself (the auto process's corename)."""
    r = one(rows, kind="gemm_pair", openblas="auto")
    return r.get("corename", "?") if r else "?"


def gemm_pair(rows, name, gname, core):
    """One --gemm-only process's paired measurement of a GEMM: (mha times,
    OpenBLAS times, median of the per-round OpenBLAS / mha ratios, the
    process's FMA peak, its row), or None."""
    r = one(rows, kind="gemm_pair", name=name, gemm=gname, openblas=core)
    if not r or not r.get("mha_times_s") or not r.get("blas_times_s"):
        return None
    tm = [float(v) for v in r["mha_times_s"].split(",") if v]
    tb = [float(v) for v in r["blas_times_s"].split(",") if v]
    return tm, tb, med([b / m for m, b in zip(tm, tb)]), num(r, "peak_gflops"), r


def gemm_rows(rows, name, isa, roof, targets, notes):
    """The Projection GEMMs rows of one configuration and their targets,
    from the paired measurement (bench_gemm.c): each --gemm-only process
    times mha_gemm and one OpenBLAS core type round by round, so every
    "mha / OpenBLAS" ratio compares times of the same process and rounds
    (median of the per-round ratios). "best" is the core type whose
    OpenBLAS median was lowest; mha's ms and % peak come from that process
    (its median over its FMA peak, measured around the rounds)."""
    body = []
    for gname in ("qkv", "q", "kv", "o"):
        pairs = {core: gemm_pair(rows, name, gname, core) for core, _ in GEMM_CORES}
        for r in find(rows, kind="gemm_pair", name=name, gemm=gname):
            if r.get("error"):
                notes.append(f"{name} {gname} GEMM paired with OpenBLAS {r.get('openblas')}: {r['error']}")
            spin = max(num(r, "idle_cores_after_mha") or 0, num(r, "idle_cores_after_blas") or 0)
            if spin > 0.05:
                notes.append(f"{name} {gname} GEMM paired with OpenBLAS {r.get('openblas')}: idle workers kept "
                             f"{spin:.2f} cores busy after a call (OMP_WAIT_POLICY={r.get('omp_wait')}, "
                             f"OPENBLAS_THREAD_TIMEOUT={r.get('openblas_timeout')}): the pair competed for the cores")
        g = next((p[4] for p in pairs.values() if p), None)
        alone = med(times_of(rows, kind="gemm", impl="mha_gemm", name=name, gemm=gname))
        if not g:
            continue
        M, K, N = int(g["M"]), int(g["K"]), int(g["N"])
        fl = 2.0 * M * K * N
        bt = {core: med(p[1]) if p else None for core, p in pairs.items()}
        ratio = {core: p[2] if p else None for core, p in pairs.items()}
        best = min((c for c in bt if bt[c]), key=lambda c: bt[c])
        pt, pk = med(pairs[best][0]), pairs[best][3]
        gfr = fl / pt * 1e-9 / pk if pt and pk else None
        # the roofline at the same process's FMA peak (the bytes at the run's bandwidth)
        groof = max(fl / (pk * 1e9) if pk else 0, roof(0, 4 * (M * K + K * N + M * N)) or 0) or None
        cells = [name, gname, f"{M}x{K}x{N}"]
        for core, _ in GEMM_CORES:
            cells += [fmt_ms(bt[core]), fmt(fl / bt[core] * 1e-9 if bt[core] else None)]
        cells += [fmt_ms(pt), fmt(fl / pt * 1e-9), fmt(gfr * 100 if gfr else None, ".0f", suffix="%"),
                  fmt_ms(groof), fmt(groof / pt * 100 if groof else None, ".0f", suffix="%"), fmt_ms(alone)]
        # alone: libmha as its users run it (default OpenMP wait policy, no
        # OpenBLAS pool), at the run's FMA peak: roof(FLOPs, 0 bytes)
        galone = roof(fl, 0) / alone if alone and roof(fl, 0) else None
        cells += [fmt(galone * 100 if galone else None, ".0f", suffix="%")]
        best_name = pairs[best][4].get("corename", best)
        cells += [fmt(ratio[core], ".2f") for core, _ in GEMM_CORES] + [f"{fmt(ratio[best], '.2f')} ({best_name})"]
        body.append(cells)
        targets.append([f"{name} {gname} GEMM >= 75% of the {isa} FMA peak (mha_gemm alone; paired: "
                        f"{fmt(gfr * 100 if gfr else None, '.0f', suffix='%')})",
                        fmt(galone * 100 if galone else None, ".0f", suffix="%"), verdict(galone, 0.75)])
        targets.append([f"{name} {gname} GEMM >= OpenBLAS's best kernel (paired in one process; best: {best_name})",
                        fmt(ratio[best], ".2f", suffix="x"), verdict(ratio[best], 1)])
        if name == "P1" and gname == "qkv":
            for core, label in (("auto", "OpenBLAS"), ("Haswell", "OpenBLAS with its AVX2 kernels (context)")):
                targets.append([f"P1 projection GEMM (fused QKV) >= {label}, paired",
                                fmt(ratio[core], ".2f", suffix="x"), verdict(ratio[core], 1)])
    return body


def gemm_table(body, auto_core, isa):
    head = ["config", "GEMM", "MxKxN"]
    for core, simd in GEMM_CORES:
        label = auto_core if core == "auto" else f"{core}, {simd}"
        head += [f"OpenBLAS ({label}) ms", "GFLOP/s"]
    head += ["mha_gemm ms (paired with the best)", "GFLOP/s", f"mha % {isa} peak (paired run's peak)",
             "roofline ms", "% roofline", "mha_gemm alone ms", f"alone % {isa} peak", "mha / OpenBLAS (paired)",
             "mha / OpenBLAS AVX2 (paired)", "mha / OpenBLAS AVX-512 (paired)", "mha / OpenBLAS best (paired)"]
    return table(head, body)


def memory_line(rows):
    """Issue 3's peak-RSS check (tests/test_fast.c fast_memory_peak)."""
    m = one(rows, kind="memory")
    if not m:
        return "(not measured in this run: --quick skips it)"
    return (f"Causal forward, B=1, T={m['T']}, d_model=768, h=12 (fast path): peak RSS "
            f"{m['peak_mib']} MiB against {m['need_mib']} MiB of tensors it must hold "
            f"(X, Q, K, V, Z, Y and the weights): ratio {m['ratio']} (limit 2).")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--raw", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--command", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--mode", default="full")
    ap.add_argument("--seconds", type=int, default=0)
    ap.add_argument("--source", help="the commit the raw lines were measured on, when the report is "
                    "rebuilt later from them (default: the checkout's HEAD)")
    a = ap.parse_args()
    rows = parse(a.raw)

    # ------------------------------------------------------------ machine
    fma = [num(r, "best_gflops") for r in find(rows, kind="machine", key="fma_avx2")]
    fma = [v for v in fma if v]
    peak = max(fma) if fma else None
    f512 = [num(r, "best_gflops") for r in find(rows, kind="machine", key="fma_avx512")]
    f512 = [v for v in f512 if v]
    amx_peaks = [num(r, "best_gflops") for r in find(rows, kind="machine", key="amx_bf16")]
    amx_peak = max([v for v in amx_peaks if v], default=None)
    # the ISA libmha's kernels ran with (bench_internal.c prints it) and its FMA peak
    isa = next((r["kernels"] for r in rows if r.get("kernels")), "avx2")
    peak_isa = max(f512) if isa == "avx512" and f512 else peak
    streams = sorted((int(r["mib"]), num(r, "median_gbs"), num(r, "best_gbs"))
                     for r in find(rows, kind="machine", key="stream_read"))
    ob = one(rows, kind="machine", key="openblas") or {}
    tp = one(rows, kind="peer", impl="torch") or {}
    model, flags, ncpu = machine_text()
    run = one(rows, kind="run") or {}
    now = run.get("date") or datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    kernels = os.environ.get("MHA_KERNELS", "default (not set)")

    def bw_for(nbytes):
        if not streams:
            return None, None
        for mib, med, _ in streams:
            if mib * (1 << 20) >= nbytes:
                return med, mib
        return streams[-1][1], streams[-1][0]

    def roof(flops, nbytes):
        """The time the FLOPs allow at the ISA's FMA peak and the bytes at the
        measured read bandwidth, whichever is longer (None when unmeasured)."""
        bw, _ = bw_for(nbytes)
        t = [v for v in (flops / (peak_isa * 1e9) if peak_isa else None,
                         nbytes / (bw * 1e9) if bw else None) if v is not None]
        return max(t) if t else None

    def pct(r, t):
        return fmt(r / t * 100 if r and t else None, ".0f", suffix="%")

    md = []
    md.append(f"# mha benchmark results ({a.mode})\n")
    md.append("Generated by bench/report.py; do not edit by hand.\n")
    md.append(f"- Command: `{a.command}` (run from the repository root; {a.seconds} s)")
    md.append(f"- Date: {now}; source: " + (f"{a.source} (report rebuilt at {git_rev()})" if a.source else git_rev()))
    md.append(f"- Machine: {model}, {ncpu} CPUs; flags: {' '.join(flags)}")
    md.append(f"- Threads: {a.threads} for every implementation (OMP_NUM_THREADS, "
              f"mha_set_num_threads, openblas_set_num_threads, torch.set_num_threads)")
    md.append(f"- libmha path: mha_forward default options (MHA_PATH_AUTO); MHA_KERNELS={kernels}")
    forced = run.get("openblas_coretype_env", "unset")
    md.append(f"- OpenBLAS: core {ob.get('corename', '?')} (its own choice), {ob.get('threads', '?')} threads "
              f"({ob.get('config', '?')})"
              + (f"; the environment sets OPENBLAS_CORETYPE={forced}, which PyTorch and the mha-side"
                 " processes inherit" if forced != "unset" else ""))
    md.append(f"- PyTorch: {tp.get('version', '?')}, {tp.get('threads', '?')} threads, "
              f"interop {tp.get('interop_threads', '?')}")
    md.append(f"- AVX2 FMA (measured, {a.threads} threads, start and end of the run): "
              + (", ".join(f"{v:.1f}" for v in fma) + f" GFLOP/s -> peak {peak:.1f}" if fma else "n/a")
              + (f"; AVX-512 FMA: {max(f512):.1f} GFLOP/s" if f512 else "")
              + (f"; AMX-BF16 (TDPBF16PS): {amx_peak:.1f} GFLOP/s" if amx_peak else "")
              + f". libmha's kernels: {isa}; '% peak' and the roofline use the {isa} peak"
              + (f" ({peak_isa:.1f} GFLOP/s)" if peak_isa else ""))
    ortv = next((r["ort_version"] for r in rows if r.get("ort_version")), None)
    md.append(f"- ONNX Runtime: {('onnxruntime-node ' + ortv) if ortv else 'not run'}, "
              f"{a.threads} intra-op threads, graph optimizations all, run by node (bench/peer_ort.py)")
    md.append("- Streaming read bandwidth (median of 7 passes): "
              + (", ".join(f"{mib} MiB: {med:.1f} GB/s" for mib, med, _ in streams) if streams else "n/a"))
    fae = one(rows, kind="machine", key="fma_after_evict") or {}
    if num(fae, "first_gflops") and num(fae, "steady_gflops"):
        md.append(f"- AVX2 FMA rate of a 0.1 ms burst right after the decode table's cold-round eviction "
                  f"({fae.get('evict_mib', '?')} MiB read): {num(fae, 'first_gflops'):.1f} GFLOP/s, "
                  f"{num(fae, 'first_gflops') / num(fae, 'steady_gflops'):.2f}x the "
                  f"{num(fae, 'steady_gflops'):.1f} of a burst 3 ms later (below 1: the core's clock "
                  f"after a long read, which the cold steps' arithmetic meets; bench/LIMITS.md round 32)")
    lds = {r["phase"]: r for r in find(rows, kind="load")}
    ls, le = lds.get("start", {}), lds.get("end", {})
    cmd_busy = [int(num(r, "others_pct")) if num(r, "others_pct") >= 0 else "-"
                for r in find(rows, kind="load", phase="cmd") if num(r, "others_pct") is not None]
    md.append(f"- Other load: CPUs {ls.get('busy_pct', '?')}% busy before the run (after waiting "
              f"{ls.get('waited_s', '?')} s for quiet), {le.get('busy_pct', '?')}% after it; share of the CPUs other "
              f"processes used during each measurement command: {' '.join(map(str, cmd_busy)) or 'n/a'} %; load average "
              f"{ls.get('loadavg', '?')} -> {le.get('loadavg', '?')}")
    md.append("")
    quality = []
    if num(ls, "busy_pct") is not None and num(ls, "busy_pct") > 15:
        quality.append(f"other processes kept the CPUs {ls['busy_pct']}% busy when the run started")
    if num(le, "busy_pct") is not None and num(le, "busy_pct") > 15:
        quality.append(f"other processes kept the CPUs {le['busy_pct']}% busy when the run ended")
    cmds = find(rows, kind="load", phase="cmd")
    disturbed = [r for r in cmds if (num(r, "others_pct") if "others_pct" in r else num(r, "busy_pct") or 0) > 10]
    if disturbed:
        quality.append(f"other processes used over 10% of the CPUs during {len(disturbed)} of {len(cmds)} "
                       "measurement commands (" + ", ".join(
                           f"{r.get('cmd', '?')} {r.get('others_pct', r.get('busy_pct'))}%" for r in disturbed[:8])
                       + (", ..." if len(disturbed) > 8 else "") + ")")
    if len(fma) >= 2 and min(fma) < 0.85 * max(fma):
        quality.append(f"the FMA peak changed from {fma[0]:.0f} to {fma[-1]:.0f} GFLOP/s between start and end")
    if quality:
        md.append("**Warning: this run is not reliable** — " + "; ".join(quality) + ". With 2 cores, "
                  "one competing process stalls every 2-thread parallel region; rerun on a quiet machine.")
        md.append("")

    # ------------------------------------------------------------ prefill
    body, gbody, targets = [], [], []
    notes = []
    for name in ["P1", "P2", "P3"]:
        m = one(rows, kind="prefill", impl="mha", name=name)
        t = one(rows, kind="prefill", impl="torch", name=name)
        ref = m or t
        if not ref:
            gbody += gemm_rows(rows, name, isa, roof, targets, notes)
            continue
        proj_f, attn_f = flops_prefill(ref)
        shape = (f"B={ref['B']} T={ref['T']} S={ref['S']} d={ref['d_model']} h={ref['h']}"
                 + (" causal" if ref["causal"] == "1" else "") + (" cross" if ref["cross"] == "1" else ""))
        tms = times_of(rows, kind="prefill", impl="mha", name=name)
        tts, twait = best_torch_times(rows, name)
        tm, tt = med(tms), med(tts)
        for r in find(rows, kind="prefill", impl="mha", name=name):
            if "error" in r:
                notes.append(f"{name}: mha_forward failed: {r['error']}")
            if r.get("nonfinite", "0") != "0":
                notes.append(f"{name}: mha output has {r['nonfinite']} non-finite values")
            if r.get("path") and r["path"] != "fast":
                notes.append(f"{name}: mha_forward ran the {r['path']} path")
        for r in find(rows, kind="attn_only", impl="mha", name=name):
            if "error" in r:
                notes.append(f"{name}: attention-only timing failed: {r['error']}")
        attn = med(times_of(rows, kind="attn_only", impl="mha", name=name))
        parts = [med(times_of(rows, kind="gemm", impl="mha_gemm", name=name, gemm=g))
                 for g in ("qkv", "q", "kv", "o")
                 if find(rows, kind="gemm", impl="mha_gemm", name=name, gemm=g)]
        other = tm - attn - sum(parts) if tm and attn and parts and all(parts) else None
        gf = (proj_f + attn_f) / tm * 1e-9 if tm else None
        agf = attn_f / attn * 1e-9 if attn else None
        speed = tt / tm if tm and tt else None
        speed_min = min(tts) / min(tms) if tms and tts else None
        to = med(times_of(rows, kind="prefill", impl="ort", name=name))
        tao = med(times_of(rows, kind="attn_only", impl="ort", name=name))
        for r in find(rows, kind="prefill", impl="ort", name=name) + find(rows, kind="attn_only", impl="ort", name=name):
            if "error" in r:
                notes.append(f"{name}: ONNX Runtime ({r['kind']}): {r['error']}")
        xo = to / tm if to and tm else None
        axo = tao / attn if tao and attn else None
        B_, T_, S_, d_ = (int(ref[k]) for k in ("B", "T", "S", "d_model"))
        cross_ = ref["cross"] == "1"
        # bytes: x (and kv), the four weights, y; attention: Q, K, V read, Z written
        lbytes = 4 * (B_ * T_ * d_ * 2 + (B_ * S_ * d_ if cross_ else 0) + 4 * d_ * d_)
        abytes = 4 * (2 * B_ * T_ * d_ + 2 * B_ * S_ * d_)
        lroof, aroof = roof(proj_f + attn_f, lbytes), roof(attn_f, abytes)
        body.append([name, shape, (m or {}).get("path", "-"), fmt_ms(tm), len(tms), fmt(gf),
                     fmt(gf / peak_isa * 100 if gf and peak_isa else None, ".0f", suffix="%"),
                     fmt_ms(lroof), pct(lroof, tm),
                     fmt_ms(tt), f"{(t or {}).get('torch_path', '-')}, {twait}", fmt(speed, ".2f"),
                     fmt(speed_min, ".2f"), fmt_ms(to), fmt(xo, ".2f"),
                     fmt_ms(attn), fmt(agf), fmt(agf / peak_isa * 100 if agf and peak_isa else None, ".0f", suffix="%"),
                     fmt_ms(aroof), pct(aroof, attn), fmt_ms(tao), fmt(axo, ".2f"),
                     fmt_ms(other)])
        need_ort = {"P1": 1.5, "P2": 2.5, "P3": 1.5}[name] if name in ("P1", "P2", "P3") else None
        if need_ort:
            # what the target asks of the machine: the whole layer's FLOPs
            # in ORT's time / need_ort, as a share of the FMA peak
            ask = (proj_f + attn_f) / (to / need_ort) * 1e-9 / peak_isa if to and peak_isa else None
            targets.append([f"{name} full layer >= {need_ort}x ONNX Runtime (needs "
                            f"{fmt(ask * 100 if ask else None, '.0f', suffix='%')} of the {isa} FMA peak for "
                            f"the whole layer; libmha: {fmt(gf / peak_isa * 100 if gf and peak_isa else None, '.0f', suffix='%')})",
                            fmt(xo, ".2f", suffix="x"),
                            verdict(xo, need_ort) + (" (past the FMA peak: out of this machine's reach)"
                                                     if ask and ask > 1.0 and xo and xo < need_ort else "")])
            afr = agf / peak_isa if agf and peak_isa else None
            targets.append([f"{name} attention alone >= 65% of the {isa} FMA peak",
                            fmt(afr * 100 if afr else None, ".0f", suffix="%"), verdict(afr, 0.65)])
        gbody += gemm_rows(rows, name, isa, roof, targets, notes)
        if name == "P1":
            targets.append(["P1 >= 4x PyTorch", fmt(speed, ".2f", suffix="x"), verdict(speed, 4)])
        if name == "P2":
            targets.append(["P2 >= 8x PyTorch", fmt(speed, ".2f", suffix="x"), verdict(speed, 8)])
            # issue 3's target, against the peak of the ISA libmha ran (the AVX2 peak
            # on an AVX-512 run read 136% for a kernel at 68% of the machine)
            fr = agf / peak_isa if agf and peak_isa else None
            targets.append([f"P2 attention-only >= 60% of the {isa} FMA peak (issue 3)",
                            fmt(fr * 100 if fr else None, ".0f", suffix="%"), verdict(fr, 0.6)])

    pre_tab = table(["config", "shape", "mha path", "mha ms", "runs", "GFLOP/s", "% peak", "roofline ms",
                     "% roofline", "torch ms", "torch path", "x torch", "x torch (min)", "ORT ms", "x ORT",
                     "attn-only ms", "attn GFLOP/s", "attn % peak", "attn roofline ms", "attn % roofline",
                     "ORT attn ms", "attn x ORT", "other ms"], body)
    gemm_tab = gemm_table(gbody, ob.get("corename") or gemm_auto_core(rows), isa)
    bf16_tab = bf16_prefill_table(rows, peak_isa, amx_peak, notes)

    # ------------------------------------------------------------- decode
    dbody, dec_points, step_points = [], [], []
    dec = find(rows, kind="decode")
    keys = sorted({(r["cache"], int(r["h_kv"]), int(r["L"])) for r in dec},
                  key=lambda k: (k[0], -k[1], k[2]))
    h = next((int(r["h"]) for r in dec), None)
    for cache, hkv, L in keys:
        tcands = [r for r in find(rows, kind="decode", impl="torch", cache=cache, h_kv=hkv, L=L)
                  if num(r, "step_median_s")]
        t = min(tcands, key=lambda r: num(r, "step_median_s")) if tcands else None
        m = one(rows, kind="decode", impl="mha", cache=cache, h_kv=hkv, L=L)
        cb = num(t, "cache_bytes") if t else num(m, "cache_bytes") if m else None
        wb = num(t, "weight_bytes") if t else num(m, "weight_bytes") if m else None
        ts, ta = (num(t, "step_median_s"), num(t, "attn_median_s")) if t else (None, None)
        ms_, ma = (num(m, "step_median_s"), num(m, "attn_median_s")) if m else (None, None)
        def gbs(nb, s):
            return nb / s * 1e-9 if nb and s else None

        pending = m is not None and m.get("status") == "pending"
        if m and m.get("status") == "error":
            notes.append(f"decode {cache} h_kv={hkv} L={L}: {m.get('error')}")
        if m and m.get("nonfinite", "0") != "0":
            notes.append(f"decode {cache} h_kv={hkv} L={L}: mha output has {m['nonfinite']} non-finite values")
        mcb = num(m, "cache_bytes") if m else None
        p_ = (lambda v: "pending" if pending else v)
        # attention alone, then the whole step (decode_flops), each cold
        # against its cold roofline (cold_roofline)
        fa, fw = decode_flops(m) if m else (None, None)
        cold = one(rows, kind="decode_cold", impl="mha", cache=cache, h_kv=hkv, L=L)
        ca, ra = cold_roofline(cold, "attn", fa, peak_isa)
        cs, rs = cold_roofline(cold, "step", (fa or 0) + (fw or 0), peak_isa)
        sb = serial_bound(cold, fa, rs, peak_isa)
        dbody.append([cache, hkv, L, fmt(cb / 2**20 if cb else None),
                      fmt_ms(ts), fmt_ms(ta), fmt(gbs(cb, ta)),
                      p_(fmt_ms(ms_)), p_(fmt_ms(ma)), p_(fmt(gbs(mcb, ma))),
                      p_(fmt(gbs((mcb or 0) + (wb or 0), ms_))),
                      p_(fmt(ts / ms_ if ts and ms_ else None, ".2f")),
                      p_(fmt(num(t, "step_min_s") / num(m, "step_min_s")
                             if t and m and num(t, "step_min_s") and num(m, "step_min_s") else None, ".2f")),
                      p_(fmt(ta / ma if ta and ma else None, ".2f")),
                      p_(fmt_ms(ca)), p_(fmt_ms(ra)), p_(pct(ra, ca)),
                      p_(fmt_ms(cs)), p_(fmt_ms(rs)), p_(pct(rs, cs)),
                      p_(fmt(sb * 100 if sb else None, ".0f", suffix="%")), (t or {}).get("omp_wait", "-")])
        if m and ca and ra:
            targets.append([f"decode attention {cache} h_kv={hkv} L={L} >= 80% of roofline (cold)",
                            pct(ra, ca), verdict(ra / ca, 0.8)])
        if m and cs and rs:
            step_points.append((f"{cache} h_kv={hkv} L={L}", rs / cs, sb))
        if m and ma:
            dec_points.append((cache, hkv, L, ts / ms_ if ts and ms_ else None))
    if step_points:
        worst = min(step_points, key=lambda p: p[1])
        met = sum(1 for p in step_points if p[1] >= 0.8)
        capped = [p[0] for p in step_points if p[1] < 0.8 and p[2] is not None and p[2] < 0.8]
        capped_text = f"; serial bound below 80% for {len(capped)} of the misses: {', '.join(capped)}" if capped else ""
        targets.append([f"decode step >= 80% of roofline (cold), every case ({met} of {len(step_points)} met; "
                        f"worst {worst[0]}{capped_text})", f"{worst[1] * 100:.0f}%", verdict(worst[1], 0.8)])
    dec_tab = table(["cache", "h_kv", "L", "cache MiB", "torch step ms", "torch attn ms", "torch attn GB/s",
                     "mha step ms", "mha attn ms", "mha attn GB/s", "mha step GB/s (K,V+W)",
                     "x torch (step)", "x torch (step, min)", "x torch (attn)",
                     "mha attn cold ms", "attn roofline ms (cold read)", "mha attn % roofline",
                     "mha step cold ms", "step roofline ms (cold read)", "mha step % roofline",
                     "step serial bound % of roofline", "torch OMP wait"], dbody)

    # Fewer bytes per element at long context: the int8 and mixed caches
    # against fp16 (time ratios > 1: the int8 storage is faster).
    rbody = []
    if keys:
        Lmax = max(k[2] for k in keys)
        for hkv in sorted({k[1] for k in keys}, reverse=True):
            f16 = one(rows, kind="decode", impl="mha", cache="fp16", h_kv=hkv, L=Lmax)
            for other in ("int8", "int8/fp16"):
                r = one(rows, kind="decode", impl="mha", cache=other, h_kv=hkv, L=Lmax)
                if not f16 or not r or not num(r, "attn_median_s") or not num(f16, "attn_median_s"):
                    continue
                rbody.append([f"{other} vs fp16", hkv, Lmax,
                              fmt(num(f16, "cache_bytes") / num(r, "cache_bytes"), ".2f"),
                              fmt(num(f16, "attn_median_s") / num(r, "attn_median_s"), ".2f"),
                              fmt(num(f16, "step_median_s") / num(r, "step_median_s"), ".2f")])
    ratio_tab = table(["caches", "h_kv", "L", "fp16 bytes / bytes", "attn speed ratio (fp16 ms / ms)",
                       "step speed ratio"], rbody)

    # GQA / MQA speed-ups against MHA at the longest context, per implementation.
    sbody = []
    if keys and h:
        Lmax = max(k[2] for k in keys)
        for impl in ("torch", "mha"):
            for cache in sorted({k[0] for k in keys}):
                base = best_decode(rows, impl, cache, h, Lmax)
                for hkv in sorted({k[1] for k in keys if k[1] != h}, reverse=True):
                    r = best_decode(rows, impl, cache, hkv, Lmax)
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
    elif dec_points:
        Lmax = max(p[2] for p in dec_points)
        top = [p for p in dec_points if p[2] == Lmax]
        for cache in sorted({p[0] for p in top}):
            base = one(rows, kind="decode", impl="mha", cache=cache, h_kv=h, L=Lmax)
            for hkv, need, label in ((h // 4, 3.5, f"GQA h_kv={h // 4}"), (1, 10, "MQA h_kv=1")):
                r = one(rows, kind="decode", impl="mha", cache=cache, h_kv=hkv, L=Lmax)
                sp = (num(base, "attn_median_s") / num(r, "attn_median_s")
                      if base and r and num(base, "attn_median_s") and num(r, "attn_median_s") else None)
                targets.append([f"{label} attention >= {need}x MHA at L={Lmax} ({cache})",
                                fmt(sp, ".2f", suffix="x"), verdict(sp, need)])
        xs = [p[3] for p in dec_points if p[3]]
        worst_x = min(xs) if xs else None
        targets.append(["decode step >= 3x PyTorch at every point (worst point)",
                        fmt(worst_x, ".2f", suffix="x"), verdict(worst_x, 3)])
    bwd_tab = backward_section(rows, peak, max(f512) if f512 else None, targets)
    var_tab = variants_section(rows, targets, notes)
    var_bwd_tab = variants_section(rows, targets, notes, kind="variant_backward")
    nn_tab = nn_modern_section(rows)
    if quality:
        for t_ in targets:
            if t_[2] in ("met", "NOT met"):
                t_[2] += " (unreliable run)"
    tgt_tab = table(["target", "measured", "status"], targets)

    wdec_tab = weights_decode_table(rows, peak_isa)

    errors = find(rows, kind="error")
    for e in errors:
        notes.append(f"command failed (rc {e.get('rc')}): `{e.get('cmd')}`")

    md += ["## Prefill / encoder (issue 3)\n", pre_tab, "", "### Projection GEMMs\n", gemm_tab, "",
           "### bf16 projections (issue 15: bf16 weights, options.bf16_matmul; torch: the module in bf16)\n",
           bf16_tab, "",
           "### Attention variants (issue 13): whole forward, each variant alone, interleaved with plain\n",
           var_tab, "",
           "## Decode, one token per step at context L (issue 5)\n", dec_tab, "",
           "### Grouped / multi-query speed-up at the longest context\n", sp_tab, "",
           "### int8 and mixed (K int8, V fp16) caches against fp16 at the longest context\n", ratio_tab, "",
           "### bf16 / int8 weights (issue 15), fp32 cache\n", wdec_tab, "",
           "## Memory (issue 3)\n", memory_line(rows), "",
           "## Backward, training step of one layer (issue 12)\n", bwd_tab, "",
           "### Attention variants on the backward: mha_backward (every gradient), each variant alone, "
           "interleaved with plain\n", var_bwd_tab, "",
           "### Today's layer trained from PyTorch: mha.nn.Attention against the layer in PyTorch\n",
           nn_tab, "",
           "## Targets\n" + ("\n(--quick shapes: the issues' targets are stated for the full shapes "
                              "and do not apply here.)\n" if a.mode == "quick" else ""), tgt_tab, ""]
    if notes:
        md += ["## Problems in this run\n"] + [f"- {n}" for n in notes] + [""]
    md += ["## Method\n", "Definitions" + __doc__.split("Definitions", 1)[1].rstrip(), "",
           "Peers: PyTorch nn.MultiheadAttention (eval, torch.no_grad(), need_weights=False, "
           "batch_first=True, causal as a float attn_mask); `torch path` says whether torch 1.13 ran "
           "its fused native kernel (read from the profiler). OpenBLAS cblas_sgemm without bias "
           "(beta=0); mha_gemm adds the bias. The decode peer is a hand-written PyTorch step "
           "(addmm projections, a preallocated (B,h_kv,L,d_head) cache written in place at slot L-1, "
           "matmul-softmax-matmul per kv-head group; fp16 caches widened by copy_() into preallocated "
           "fp32 buffers because torch 1.13 has no CPU fp16 matmul). mha decode: mha_forward_cached "
           "(whole step, then mha_cache_truncate back to L-1, O(1)) and mha_cache_attend (attention "
           "alone) over a cache filled with mha_cache_append. Raw lines: " + a.raw + ".", ""]
    # The measured analysis of the targets this hardware rules out is kept by
    # hand in bench/LIMITS.md (it quotes perf and the FLOP arithmetic).
    limits = os.path.join(os.path.dirname(os.path.abspath(__file__)), "LIMITS.md")
    if os.path.exists(limits):
        with open(limits) as f:
            md += ["", f.read().rstrip(), ""]
    text = "\n".join(md)
    os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
    with open(a.out, "w") as f:
        f.write(text)
    print(text)
    print(f"\nwritten: {a.out}")
    return 1 if errors else 0


def best_torch_backward(rows, name, part):
    """torch's backward runs (part backward or forward_backward) under the
    OMP_WAIT_POLICY whose median is lower."""
    groups = {}
    for r in find(rows, kind="backward", impl="torch", name=name, part=part):
        groups.setdefault(r.get("omp_wait", "default"), []).extend(times_of([r]))
    return min(groups.values(), key=med) if groups else []


def backward_section(rows, peak_avx2, peak_avx512, targets):
    """The backward table (issue 12) and its targets: >= 2x torch on P1,
    >= 4x on P2 (causal), attention >= 50% of the FMA peak. One row for the
    stateless backward (mha_backward) and one for the tape's
    (mha_forward_train + mha_backward_tape), measured in the same rounds."""
    body = []
    for name, need in (("P1", 2), ("P2", 4)):
        m = one(rows, kind="backward", impl="mha", name=name, part="backward")
        if not m:
            continue
        tb = med(best_torch_backward(rows, name, "backward"))
        tf = med(best_torch_backward(rows, name, "forward_backward"))
        for sfx, label in (("", name), ("_tape", f"{name} tape")):
            mb = med(times_of(rows, kind="backward", impl="mha", name=name, part="backward" + sfx))
            if mb is None:
                continue
            mf = med(times_of(rows, kind="backward", impl="mha", name=name, part="forward_backward" + sfx))
            att = find(rows, kind="backward", impl="mha", name=name, part="attention" + sfx)
            ta = med(times_of(att))
            a0 = att[-1] if att else {}
            kern = a0.get("kernels", "avx2")
            pk = peak_avx512 if kern == "avx512" and peak_avx512 else peak_avx2
            uf, ef = num(a0, "useful_gflop"), num(a0, "executed_gflop")
            useful = uf / ta / pk if uf and ta and pk else None
            executed = ef / ta / pk if ef and ta and pk else None
            xb = tb / mb if tb and mb else None
            xf = tf / mf if tf and mf else None
            causal = " causal" if m.get("causal") == "1" else ""
            body.append([label, f"B={m['B']} T={m['T']} d={m['d_model']} h={m['h']}{causal}", fmt_ms(mb),
                         fmt_ms(tb), fmt(xb, ".2f", suffix="x"), fmt_ms(mf), fmt_ms(tf), fmt(xf, ".2f", suffix="x"),
                         fmt_ms(ta), fmt(uf / ta if uf and ta else None, ".1f"),
                         fmt(useful * 100 if useful else None, ".0f", suffix="%"),
                         fmt(executed * 100 if executed else None, ".0f", suffix="%"), kern])
            targets.append([f"{label} backward >= {need}x PyTorch autograd", fmt(xb, ".2f", suffix="x"),
                            verdict(xb, need)])
            targets.append([f"{label} backward attention >= 50% of the {kern} FMA peak (useful FLOPs; executed "
                            f"{fmt(executed * 100 if executed else None, '.0f', suffix='%')})",
                            fmt(useful * 100 if useful else None, ".0f", suffix="%"), verdict(useful, 0.5)])
    if not body:
        return "(not run)"
    return table(["config", "shape", "mha bwd ms", "torch bwd ms", "x torch", "mha fwd+bwd ms",
                  "torch fwd+bwd ms", "x torch", "attn bwd ms", "attn useful GFLOP/s", "useful % peak",
                  "executed % peak", "kernels"], body)


def verdict(v, need):
    if v is None:
        return "not measured"
    return "met" if v >= need else "NOT met"


if __name__ == "__main__":
    sys.exit(main())
