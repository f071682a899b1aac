"""Accuracy of bf16 and int8 projection weights against the fp32 layer
(docs/WEIGHTS.md), the sibling of cache_accuracy.py.

Layer: d_model 1024, 16 heads, 4 kv heads (GQA), d_head 64, weights
U(+-1/sqrt(1024)) with 4 input rows of every matrix x8 (the large rows
that meet outlier channels in trained models). x: N(0, 1) with 6 of 1024
channels x20 (massive activations). Per cache length L: prefill L-16
tokens, decode 16 one at a time (the decode streams read the stored
weights); Y of the 16 decode steps against the fp32 layer's. Rows 8: 8
sequences decoded together, 8 rows a step (the multi-row streams, against
the fp32 layer's batched step on its packed GEMM).
Also, in numpy, the alternatives to the library's groups of 32 inputs:
one scale per output column, and per group of 64 inputs, each run as an
fp32 layer with those dequantized weights (the per-32 simulation must
match the library's row: a check of both).

Run: PYTHONPATH=python /usr/bin/python3 bench/weights_accuracy.py
"""
import numpy as np

import mha

D, H, HKV, DH, STEPS = 1024, 16, 4, 64, 16
ROWS = [11, 200, 555, 1000]


def weights(rng):
    lim = 1.0 / np.sqrt(D)
    w = {"w_q": rng.uniform(-lim, lim, (D, H * DH)), "w_k": rng.uniform(-lim, lim, (D, HKV * DH)),
         "w_v": rng.uniform(-lim, lim, (D, HKV * DH)), "w_o": rng.uniform(-lim, lim, (H * DH, D)),
         "b_q": np.zeros(H * DH), "b_k": np.zeros(HKV * DH), "b_v": np.zeros(HKV * DH), "b_o": np.zeros(D)}
    for k in ("w_q", "w_k", "w_v", "w_o"):
        w[k][ROWS, :] *= 8.0
    return {k: v.astype(np.float32) for k, v in w.items()}


def layer_of(w, dtype="f32"):
    layer = mha.Layer(d_model=D, n_heads=H, n_kv_heads=HKV)
    layer.set_weights(w)
    if dtype != "f32":
        layer.convert_weights(dtype)
    return layer


def group_int8(a, g):
    """a (K, N) quantized with one fp32 scale per g inputs of a column
    (W_O: d_head = 64 rows per head, so groups of 32 and 64 stay inside
    a head, as the library's do)."""
    b = a.reshape(a.shape[0] // g, g, a.shape[1])
    s = (np.abs(b).max(1, keepdims=True) / np.float32(127)).astype(np.float32)
    r = np.where(s > 0, b / np.where(s > 0, s, 1), 0)
    q = np.clip(np.sign(r) * np.floor(np.abs(r) + 0.5), -127, 127)
    return (q * s).astype(np.float32).reshape(a.shape)


def activations(rng, L, batch=1):
    x = rng.standard_normal((batch, L, D))
    x[..., [7, 100, 333, 512, 700, 901]] *= 20.0
    return x.astype(np.float32)


def decode_y(layer, x):
    L = x.shape[1]
    cache = mha.Cache(layer, batch=x.shape[0], capacity=L, dtype="float32")
    cache.forward(layer, x[:, :L - STEPS])
    y = np.concatenate([cache.forward(layer, x[:, t:t + 1]) for t in range(L - STEPS, L)], axis=1)
    return y.reshape(-1, D)  # (batch * STEPS, D)


def main():
    rng = np.random.default_rng(0)
    w = weights(rng)
    layers = {"fp32": layer_of(w), "bf16": layer_of(w, "bf16"), "int8 (library: per 32 inputs)": layer_of(w, "int8")}
    for g, name in ((D, "per output column"), (64, "per 64 inputs"), (32, "per 32 inputs")):
        wg = dict(w)
        for k in ("w_q", "w_k", "w_v", "w_o"):
            wg[k] = group_int8(w[k], g if k != "w_o" or g <= DH else DH)
        layers[f"int8 {name} (numpy)"] = layer_of(wg)
    print("| L | rows a step | weights | max abs | rel. L2 | min cosine | max abs / max abs(Y) |")
    print("|---|---|---|---|---|---|---|")
    for L, rows in ((128, 1), (128, 8), (1024, 1), (1024, 8)):
        x = activations(rng, L, rows)
        ref = decode_y(layers["fp32"], x).astype(np.float64)
        for name, layer in layers.items():
            if name == "fp32" or (rows > 1 and "numpy" in name):
                continue
            y = decode_y(layer, x).astype(np.float64)
            d = y - ref
            cos = (y * ref).sum(1) / np.sqrt((y * y).sum(1) * (ref * ref).sum(1))
            print(f"| {L} | {rows} | {name} | {np.abs(d).max():.3g} | {np.sqrt((d * d).sum() / (ref * ref).sum()):.3g} | "
                  f"{cos.min():.6f} | {np.abs(d).max() / np.abs(ref).max():.3g} |")


if __name__ == "__main__":
    main()
