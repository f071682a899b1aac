"""An oracle for the CLI tests, independent of the library: computes the
attention layer from the math in float64 with numpy, from the (in, out)
weights the fixtures were built from (an .npz, never read by libmha),
and checks a Y written by `mha run` against it.

    python3 mha_oracle.py WEIGHTS.npz H H_KV X.npy Y.npy [--kv KV.npy]
        [--causal] [--kpm P.npy] [--mask M.npy] [--ablate R=zero|R=scale:F]
        [--tol 1e-5]

Q = X W_Q + b_Q, K = Xkv W_K + b_K, V = Xkv W_V + b_V; query head r reads
kv head r // (H / H_KV); scores / sqrt(d_k); bool masks follow PyTorch
(True = may NOT attend); --causal is top-left (key j <= query i); a row with
no allowed key gives zero; --ablate changes Z^(r) before W_O.
Exits 1, printing the largest difference, when Y is not within --tol.
"""
import argparse
import sys

import numpy as np


def oracle(w, h, h_kv, x, kv, causal, kpm, mask, ablate):
    x = x.astype(np.float64)
    kv = x if kv is None else kv.astype(np.float64)
    unbatched = x.ndim == 2
    if unbatched:
        x, kv = x[None], kv[None]
    B, T, _ = x.shape
    S = kv.shape[1]
    W = {k: v.astype(np.float64) for k, v in w.items()}
    d_k = W["w_q"].shape[1] // h
    d_v = W["w_o"].shape[0] // h
    q = x @ W["w_q"] + W.get("b_q", 0)
    k = kv @ W["w_k"] + W.get("b_k", 0)
    v = kv @ W["w_v"] + W.get("b_v", 0)
    allowed = np.ones((B, T, S), bool)
    if causal:
        allowed &= np.tril(np.ones((T, S), bool))[None]
    if kpm is not None:
        allowed &= ~(kpm.reshape(B, 1, S).astype(bool))
    if mask is not None:
        allowed &= ~(mask.astype(bool).reshape(1, T, S))
    z = np.zeros((B, T, h * d_v))
    for r in range(h):
        g = r // (h // h_kv)
        s = q[..., r * d_k:(r + 1) * d_k] @ k[..., g * d_k:(g + 1) * d_k].transpose(0, 2, 1)
        s = np.where(allowed, s / np.sqrt(d_k), -np.inf)
        m = s.max(-1, keepdims=True)
        e = np.where(allowed, np.exp(s - np.where(np.isfinite(m), m, 0)), 0.0)
        den = e.sum(-1, keepdims=True)
        p = np.divide(e, den, out=np.zeros_like(e), where=den > 0)
        zr = p @ v[..., g * d_v:(g + 1) * d_v]
        op = ablate.get(r)
        if op == "zero":
            zr = zr * 0
        elif op is not None:
            zr = zr * float(op.split(":", 1)[1])
        z[..., r * d_v:(r + 1) * d_v] = zr
    y = z @ W["w_o"] + W.get("b_o", 0)
    return y[0] if unbatched else y


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("weights")
    ap.add_argument("h", type=int)
    ap.add_argument("h_kv", type=int)
    ap.add_argument("x")
    ap.add_argument("y")
    ap.add_argument("--kv")
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--kpm")
    ap.add_argument("--mask")
    ap.add_argument("--ablate", action="append", default=[])
    ap.add_argument("--tol", type=float, default=1e-5)
    a = ap.parse_args()
    w = dict(np.load(a.weights))
    load = lambda p: None if p is None else np.load(p)
    ablate = {int(s.split("=")[0]): s.split("=", 1)[1] for s in a.ablate}
    want = oracle(w, a.h, a.h_kv, np.load(a.x), load(a.kv), a.causal, load(a.kpm), load(a.mask), ablate)
    got = np.load(a.y)
    if got.shape != want.shape:
        print("shape %s, oracle %s" % (got.shape, want.shape))
        sys.exit(1)
    err = np.abs(got - want).max()
    if not err <= a.tol:
        print("max |Y - oracle| = %.3g > %.3g" % (err, a.tol))
        sys.exit(1)


if __name__ == "__main__":
    main()
