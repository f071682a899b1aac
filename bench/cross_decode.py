#!/usr/bin/python3
"""cross_decode.py — one decoder step of an encoder-decoder's cross-attention
(Whisper, BART, Marian): B sequences (beams), one new query each, over an
encoder output of S rows, measured in one process, interleaved:

  torch_mha      torch.nn.MultiheadAttention(x, mem, mem): what the module
                 does at every step (K and V of the whole memory projected
                 again)
  torch_cached   the same layer in torch with K and V projected once
                 (as Hugging Face's EncoderDecoderCache keeps them): the
                 query's projection, q K^T, softmax, P V, W_O
  mha            mha.Cache(cross=True): set_memory once, forward per step

The outputs are checked against each other first. Each line gives the
median step time, libmha's ratio to each peer, and the bytes libmha's step
must read (the memory's K and V and W_Q, W_O, fp32) as GB/s and as a share
of the streaming read bandwidth given by --read-gbs (bench_mha machine's
stream_read median on this machine).

  OMP_NUM_THREADS=2 /usr/bin/python3 bench/cross_decode.py --read-gbs 40
"""
import argparse
import os
import sys
import time

# torch's OpenMP threads spin after each op unless told to sleep, taking the
# cores libmha's threads run on in the same process (bench/peer_torch.py too)
os.environ.setdefault("OMP_WAIT_POLICY", "passive")

import numpy as np  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import mha  # noqa: E402


def median(v):
    s = sorted(v)
    return s[len(s) // 2] if len(s) % 2 else 0.5 * (s[len(s) // 2 - 1] + s[len(s) // 2])


def case(d, h, S, B, rounds, steps, read_gbs):
    torch.manual_seed(0)
    m = torch.nn.MultiheadAttention(d, h, batch_first=True).eval()
    sd = {k: v.detach().numpy().copy() for k, v in m.state_dict().items()}
    layer = mha.from_torch_state_dict(sd, num_heads=h, batch_first=True)
    rng = np.random.default_rng(0)
    mem = rng.standard_normal((B, S, d)).astype(np.float32)
    xs = rng.standard_normal((steps, B, 1, d)).astype(np.float32)
    tmem = torch.from_numpy(mem)
    w_in, b_in = m.in_proj_weight.detach(), m.in_proj_bias.detach()
    w_o, b_o = m.out_proj.weight.detach(), m.out_proj.bias.detach()
    dh = d // h
    with torch.no_grad():  # torch_cached's K, V (B, h, S, dh), projected once
        k = (tmem @ w_in[d:2 * d].T + b_in[d:2 * d]).view(B, S, h, dh).transpose(1, 2)
        v = (tmem @ w_in[2 * d:].T + b_in[2 * d:]).view(B, S, h, dh).transpose(1, 2)
    cache = mha.Cache(layer, batch=B, capacity=S, cross=True)
    cache.set_memory(mem)

    def torch_mha(x):
        with torch.no_grad():
            return m(torch.from_numpy(x), tmem, tmem, need_weights=False)[0].numpy()

    def torch_cached(x):
        with torch.no_grad():
            q = (torch.from_numpy(x) @ w_in[:d].T + b_in[:d]).view(B, 1, h, dh).transpose(1, 2)
            p = torch.softmax(q @ k.transpose(-1, -2) / dh ** 0.5, dim=-1)
            return ((p @ v).transpose(1, 2).reshape(B, 1, d) @ w_o.T + b_o).numpy()

    def mha_step(x):
        return cache.forward(x)

    impls = {"torch_mha": torch_mha, "torch_cached": torch_cached, "mha": mha_step}
    want = torch_mha(xs[0])
    for name, fn in impls.items():
        err = float(np.abs(fn(xs[0]) - want).max())
        assert err <= 1e-4 * max(1.0, float(np.abs(want).max())), f"{name} differs from torch by {err:.3g}"
    times = {name: [] for name in impls}
    for _ in range(rounds):  # interleaved: each round times every impl over the same steps
        for name, fn in impls.items():
            t0 = time.perf_counter()
            for x in xs:
                fn(x)
            times[name].append((time.perf_counter() - t0) / steps)
    med = {name: median(t) for name, t in times.items()}
    nbytes = 4 * (2 * B * S * d + 2 * d * d)
    gbs = nbytes / med["mha"] / 1e9
    share = f"{100 * gbs / read_gbs:.0f}%" if read_gbs else "-"
    print(f"| {d} | {h} | {S} | {B} | {1e3 * med['torch_mha']:.3f} | {1e3 * med['torch_cached']:.3f} | "
          f"{1e3 * med['mha']:.3f} | {med['torch_mha'] / med['mha']:.2f} | {med['torch_cached'] / med['mha']:.2f} | "
          f"{nbytes / 2 ** 20:.1f} | {gbs:.1f} | {share} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "2")))
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--read-gbs", type=float, default=0.0)
    ap.add_argument("--shapes", default="512:8:1500:1,512:8:1500:4,768:12:1500:4,1024:16:1500:5",
                    help="d:h:S:B items (Whisper base / small / medium encoders' 1500 frames)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    mha.set_num_threads(a.threads)
    print(f"torch {torch.__version__}, {a.threads} threads, {a.rounds} interleaved rounds of {a.steps} steps")
    print("| d | h | S | B | torch_mha ms | torch_cached ms | mha ms | x torch_mha | x torch_cached | "
          "mha reads MiB | mha GB/s | % of read bandwidth |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for item in a.shapes.split(","):
        d, h, S, B = (int(v) for v in item.split(":"))
        case(d, h, S, B, a.rounds, a.steps, a.read_gbs)


if __name__ == "__main__":
    main()
