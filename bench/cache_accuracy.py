"""Accuracy of the fp16, int8 and mixed (K int8 / V fp16 and the
reverse) KV caches against the fp32 cache on
activations with outlier channels (docs/CACHE.md, "int8 storage").

Layer: d_model 1024, 16 heads, 4 kv heads (GQA), d_head 64, weights
U(+-1/sqrt(1024)), 3 columns of W_K per kv head scaled x4 (outlier key
channels). x: N(0, 1) with 6 of 1024 channels x20 (massive activations).
Per cache length L: prefill L-16 tokens, decode 16 one at a time; Y of the
16 decode steps against the fp32 cache's. Also the quantization error of
K and V themselves with fp32 scales (the library's) and with fp16 scales
(the alternative), in numpy.

Run: PYTHONPATH=python /usr/bin/python3 bench/cache_accuracy.py
"""
import numpy as np

import mha

D, H, HKV, DH, STEPS = 1024, 16, 4, 64, 16


def make_layer(rng):
    lim = 1.0 / np.sqrt(D)
    w = {"w_q": rng.uniform(-lim, lim, (D, H * DH)), "w_k": rng.uniform(-lim, lim, (D, HKV * DH)),
         "w_v": rng.uniform(-lim, lim, (D, HKV * DH)), "w_o": rng.uniform(-lim, lim, (H * DH, D)),
         "b_q": np.zeros(H * DH), "b_k": np.zeros(HKV * DH), "b_v": np.zeros(HKV * DH), "b_o": np.zeros(D)}
    for g in range(HKV):
        w["w_k"][:, g * DH + np.array([3, 17, 40])] *= 4.0
    w = {k: v.astype(np.float32) for k, v in w.items()}
    layer = mha.Layer(d_model=D, n_heads=H, n_kv_heads=HKV)
    layer.set_weights(w)
    return layer, w


def activations(rng, L):
    x = rng.standard_normal((1, L, D))
    x[..., [7, 100, 333, 512, 700, 901]] *= 20.0
    return x.astype(np.float32)


def decode_y(layer, x, dtype):
    """dtype: one type for K and V, or a pair (K's, V's)."""
    L = x.shape[1]
    kt, vt = dtype if isinstance(dtype, tuple) else (dtype, dtype)
    cache = mha.Cache(layer, batch=1, capacity=L, dtype=kt, v_dtype=vt)
    cache.forward(layer, x[:, :L - STEPS])
    return np.concatenate([cache.forward(layer, x[:, t:t + 1]) for t in range(L - STEPS, L)], axis=1)[0]


def quant_error(a, scale_dtype):
    """relative RMS error of int8 per-32 quantization of rows a (n, 64)."""
    blocks = a.reshape(-1, 32).astype(np.float32)
    s = (np.abs(blocks).max(1, keepdims=True) / np.float32(127)).astype(scale_dtype).astype(np.float32)
    q = np.clip(np.sign(blocks / s) * np.floor(np.abs(blocks / s) + 0.5), -127, 127)
    return float(np.sqrt(((q * s - blocks) ** 2).mean() / (blocks ** 2).mean()))


def main():
    rng = np.random.default_rng(0)
    layer, w = make_layer(rng)
    print("| L | cache | max abs | rel. L2 | min cosine | max abs / max abs(Y) |")
    print("|---|---|---|---|---|---|")
    for L in (128, 1024, 4096):
        x = activations(rng, L)
        y32 = decode_y(layer, x, "float32")
        for dt in ("float16", "int8", ("int8", "float16"), ("float16", "int8")):
            y = decode_y(layer, x, dt)
            name = dt if isinstance(dt, str) else f"K {dt[0]}, V {dt[1]}"
            d = (y - y32).astype(np.float64)
            cos = (y * y32).sum(1) / np.linalg.norm(y, axis=1) / np.linalg.norm(y32, axis=1)
            print(f"| {L} | {name} | {np.abs(d).max():.3g} | {np.linalg.norm(d) / np.linalg.norm(y32):.3g} "
                  f"| {cos.min():.8f} | {np.abs(d).max() / np.abs(y32).max():.3g} |")
    x = activations(rng, 512)[0].astype(np.float64)
    k, v = x @ w["w_k"], x @ w["w_v"]
    for name, a in (("K", k), ("V", v)):
        print(f"{name}: relative RMS quantization error, fp32 scales {quant_error(a, np.float32):.4g}, "
              f"fp16 scales {quant_error(a, np.float16):.4g}")


if __name__ == "__main__":
    main()
