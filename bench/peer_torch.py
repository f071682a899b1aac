#!/usr/bin/python3
"""peer_torch.py — the PyTorch peers of bench_mha, printing the same
machine-readable RESULT lines (see bench/bench.h) for bench/report.py.

  peer_torch.py info
  peer_torch.py prefill --name P1 --B 4 --T 512 [--S 2048] --d 768 --h 12
                        [--causal] [--reps 7] [--budget 20] [--threads 2]
  peer_torch.py backward --name P1 --B 4 --T 512 --d 768 --h 12 [--causal]
  peer_torch.py decode  --d 2048 --h 32 --d-head 64 --h-kv 32,8,1
                        --L 1024,4096,16384 --cache fp32,fp16 [--steps 20]

Run with Debian's /usr/bin/python3 (python3-torch 1.13). Prefill times
nn.MultiheadAttention in eval mode under torch.no_grad(), need_weights=False,
batch_first=True (the layout mha uses, and the one that lets torch 1.13 take
its fused native path for self-attention without a mask); causal masks are
given as a float (T,T) attn_mask (torch 1.13 has no is_causal). Decode
times a hand-written GQA decode step over a preallocated KV cache.
"""
import argparse
import inspect
import math
import sys
import time

import torch
import torch.nn as nn


def repeat(fn, reps, budget):
    """Same policy as bench_repeat() in bench/bench_util.c: one untimed
    warm-up unless it took more than budget/4, then runs until reps or the
    budget (seconds) is spent, at least one."""
    times = []
    t0 = time.perf_counter()
    fn()
    warm = time.perf_counter() - t0
    start = time.perf_counter()
    if warm > budget / 4:
        times.append(warm)
        start = t0  # the warm-up spent part of the budget
    while len(times) < reps and (not times or time.perf_counter() - start < budget):
        a = time.perf_counter()
        fn()
        times.append(time.perf_counter() - a)
    return times


def median(v):
    s = sorted(v)
    n = len(s)
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


def times_fields(prefix, times):
    return (f"{prefix}median_s={median(times):.6g} {prefix}min_s={min(times):.6g} "
            f"{prefix}runs={len(times)}")


def cmd_info(args):
    print(f"RESULT kind=peer impl=torch version={torch.__version__} "
          f"threads={torch.get_num_threads()} "
          f"interop_threads={torch.get_num_interop_threads()} "
          f"mkldnn={int(torch.backends.mkldnn.is_available())}")


def used_native_mha(fn):
    """Whether torch ran its fused native MHA kernel, read from the profiler
    rather than guessed from the documented fast-path conditions."""
    with torch.autograd.profiler.profile() as prof:
        fn()
    names = {e.name for e in prof.function_events}
    return any("native_multi_head_attention" in n for n in names)


def cmd_prefill(args):
    torch.manual_seed(0)
    d, h, B, T = args.d, args.h, args.B, args.T
    cross = args.S is not None
    S = args.S if cross else T
    m = nn.MultiheadAttention(d, h, bias=True, batch_first=True).eval()
    x = torch.rand(B, T, d) * 2 - 1
    kv = torch.rand(B, S, d) * 2 - 1 if cross else x
    if args.bf16:  # a bf16 model (weights, activations, outputs): oneDNN's bf16 kernels, AMX where the CPU has it
        m, x, kv = m.to(torch.bfloat16), x.to(torch.bfloat16), kv.to(torch.bfloat16)
    kwargs = {"need_weights": False}
    if args.causal:
        # top-left alignment, as mha's default (same as bottom-right when S == T)
        kwargs["attn_mask"] = torch.triu(torch.full((T, S), float("-inf")), diagonal=1).to(x.dtype)
        if "is_causal" in inspect.signature(m.forward).parameters:
            kwargs["is_causal"] = True

    def run():
        with torch.no_grad():
            y, _ = m(x, kv, kv, **kwargs)
        return y

    y = run()
    nonfinite = int((~torch.isfinite(y)).sum())
    native = used_native_mha(run)
    times = repeat(run, args.reps, args.budget)
    print(f"RESULT kind=prefill impl={'torch_bf16' if args.bf16 else 'torch'} name={args.name} B={B} T={T} S={S} d_model={d} h={h} "
          f"causal={int(args.causal)} cross={int(cross)} {times_fields('', times)} "
          f"nonfinite={nonfinite} torch_path={'native_mha' if native else 'composite'} "
          f"threads={torch.get_num_threads()} omp_wait={omp_wait()}")
    sys.stdout.flush()


def cmd_backward(args):
    """nn.MultiheadAttention's autograd (train mode, dropout 0,
    need_weights=False): backward alone (y.backward(dy) after an untimed
    forward) and forward + backward, gradients to x and every parameter,
    as bench_mha backward asks of libmha."""
    torch.manual_seed(0)
    d, h, B, T = args.d, args.h, args.B, args.T
    m = nn.MultiheadAttention(d, h, bias=True, batch_first=True).train()
    x = (torch.rand(B, T, d) * 2 - 1).requires_grad_()
    dy = torch.rand(B, T, d) * 2 - 1
    kwargs = {"need_weights": False}
    if args.causal:
        kwargs["attn_mask"] = torch.triu(torch.full((T, T), float("-inf")), diagonal=1)
    state = {}

    def forward():
        x.grad = None
        for p in m.parameters():
            p.grad = None
        state["y"], _ = m(x, x, x, **kwargs)

    def backward():
        state["y"].backward(dy)

    def both():
        forward()
        backward()

    both()  # warm-up
    bt, start = [], time.perf_counter()
    while len(bt) < args.reps and (not bt or time.perf_counter() - start < args.budget):
        forward()  # untimed
        a = time.perf_counter()
        backward()
        bt.append(time.perf_counter() - a)
    ft = repeat(both, args.reps, args.budget)
    for part, times in (("backward", bt), ("forward_backward", ft)):
        print(f"RESULT kind=backward impl=torch part={part} name={args.name} B={B} T={T} d_model={d} h={h} "
              f"causal={int(args.causal)} {times_fields('', times)} threads={torch.get_num_threads()} "
              f"omp_wait={omp_wait()}")
    sys.stdout.flush()


def omp_wait():
    """OMP_WAIT_POLICY of this process: run.sh measures torch both ways
    (its OpenMP pool and OpenBLAS's threads spin against each other on 2
    cores by default) and report.py keeps the faster, so the peer is not
    handicapped by a setting."""
    import os
    return os.environ.get("OMP_WAIT_POLICY", "default") or "default"


class DecodeLayer:
    """One attention layer decoding against a preallocated cache
    K, V (B, h_kv, capacity, d_head) in the cache dtype. fp16 caches are
    widened to fp32 before the products: torch 1.13 has no fp16 matmul on
    the CPU ("addmm_impl_cpu_ not implemented for 'Half'"), and widening on
    load is also what mha does (fp32 accumulation). The widening goes into
    preallocated fp32 buffers with copy_(): .float() allocates afresh each
    step, and the page faults of that allocation made the step up to 100x
    slower on this VM, which would make the peer look worse than it is."""

    def __init__(self, d, h, h_kv, dh, capacity, B, dtype, gen):
        lim = 1.0 / math.sqrt(d)
        rnd = lambda *s: (torch.rand(*s, generator=gen) * 2 - 1) * lim
        self.d, self.h, self.h_kv, self.dh, self.B = d, h, h_kv, dh, B
        self.w_q, self.b_q = rnd(d, h * dh), rnd(h * dh)          # (d_model, h*d_k)
        self.w_k, self.b_k = rnd(d, h_kv * dh), rnd(h_kv * dh)    # (d_model, h_kv*d_k)
        self.w_v, self.b_v = rnd(d, h_kv * dh), rnd(h_kv * dh)    # (d_model, h_kv*d_v)
        self.w_o, self.b_o = rnd(h * dh, d), rnd(d)               # (h*d_v, d_model)
        self.k = torch.empty(B, h_kv, capacity, dh, dtype=dtype)  # (B,h_kv,cap,d_k)
        self.v = torch.empty(B, h_kv, capacity, dh, dtype=dtype)  # (B,h_kv,cap,d_v)
        self.scale = 1.0 / math.sqrt(dh)
        wide = dtype != torch.float32
        self.k32 = torch.empty(B, h_kv, capacity, dh) if wide else None  # widened K
        self.v32 = torch.empty(B, h_kv, capacity, dh) if wide else None  # widened V

    def weight_bytes(self):
        return 4 * sum(t.numel() for t in (self.w_q, self.w_k, self.w_v, self.w_o))

    def attend(self, q, n):
        """z (B,h*d_v) from q (B,h*d_k) over the first n cached tokens."""
        B, h_kv, dh = self.B, self.h_kv, self.dh
        g = self.h // h_kv
        k, v = self.k[:, :, :n], self.v[:, :, :n]                  # (B,h_kv,n,d)
        if self.k32 is not None:
            k = self.k32[:, :, :n].copy_(k)
            v = self.v32[:, :, :n].copy_(v)
        qg = q.view(B, h_kv, g, dh)                                # (B,h_kv,g,d_k)
        s = torch.matmul(qg, k.transpose(-1, -2)) * self.scale    # (B,h_kv,g,n)
        p = torch.softmax(s, dim=-1)
        return torch.matmul(p, v).reshape(B, self.h * dh)         # (B,h*d_v)

    def step(self, x, pos):
        """y (B,d_model) for one new token x (B,d_model) written at pos."""
        B, h_kv, dh = self.B, self.h_kv, self.dh
        q = torch.addmm(self.b_q, x, self.w_q)
        self.k[:, :, pos] = torch.addmm(self.b_k, x, self.w_k).view(B, h_kv, dh)
        self.v[:, :, pos] = torch.addmm(self.b_v, x, self.w_v).view(B, h_kv, dh)
        z = self.attend(q, pos + 1)
        return torch.addmm(self.b_o, z, self.w_o)


def ints(s):
    return [int(t) for t in s.split(",") if t]


def cmd_decode(args):
    gen = torch.Generator().manual_seed(0)
    for cache in args.cache.split(","):
        dtype = {"fp32": torch.float32, "fp16": torch.float16}[cache]
        elt = 4 if cache == "fp32" else 2
        for h_kv in ints(args.h_kv):
            for L in ints(args.L):
                layer = DecodeLayer(args.d, args.h, h_kv, args.d_head, L, args.B, dtype, gen)
                # L-1 tokens already cached; each timed step writes token L-1
                # and attends over L keys, so every step sees context L.
                layer.k[:, :, : L - 1] = torch.rand(args.B, h_kv, L - 1, args.d_head, generator=gen) * 2 - 1
                layer.v[:, :, : L - 1] = torch.rand(args.B, h_kv, L - 1, args.d_head, generator=gen) * 2 - 1
                x = torch.rand(args.B, args.d, generator=gen) * 2 - 1
                q = torch.rand(args.B, args.h * args.d_head, generator=gen) * 2 - 1
                with torch.no_grad():
                    y = layer.step(x, L - 1)
                    nonfinite = int((~torch.isfinite(y)).sum())
                    st = repeat(lambda: layer.step(x, L - 1), args.steps, args.budget)
                    at = repeat(lambda: layer.attend(q, L), args.steps, args.budget)
                cache_bytes = 2 * args.B * L * h_kv * args.d_head * elt
                print(f"RESULT kind=decode impl=torch d_model={args.d} h={args.h} h_kv={h_kv} "
                      f"d_head={args.d_head} L={L} B={args.B} cache={cache} "
                      f"{times_fields('step_', st)} {times_fields('attn_', at)} "
                      f"cache_bytes={cache_bytes} weight_bytes={layer.weight_bytes()} "
                      f"nonfinite={nonfinite} threads={torch.get_num_threads()} omp_wait={omp_wait()}")
                sys.stdout.flush()
                del layer


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("info")
    p = sub.add_parser("prefill")
    p.add_argument("--name", default="custom")
    for k in ("B", "T", "d", "h"):
        p.add_argument("--" + k, type=int, required=True)
    p.add_argument("--S", type=int, default=None)
    p.add_argument("--causal", action="store_true")
    p.add_argument("--bf16", action="store_true", help="the module and inputs in bfloat16 (impl=torch_bf16)")
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--budget", type=float, default=20.0)
    p = sub.add_parser("backward")
    p.add_argument("--name", default="custom")
    for k in ("B", "T", "d", "h"):
        p.add_argument("--" + k, type=int, required=True)
    p.add_argument("--causal", action="store_true")
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--budget", type=float, default=20.0)
    p = sub.add_parser("decode")
    p.add_argument("--d", type=int, default=2048)
    p.add_argument("--h", type=int, default=32)
    p.add_argument("--d-head", type=int, default=64)
    p.add_argument("--h-kv", default="32,8,1")
    p.add_argument("--L", default="1024,4096,16384")
    p.add_argument("--B", type=int, default=1)
    p.add_argument("--cache", default="fp32,fp16")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--budget", type=float, default=10.0)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    {"info": cmd_info, "prefill": cmd_prefill, "backward": cmd_backward, "decode": cmd_decode}[args.cmd](args)


if __name__ == "__main__":
    main()
