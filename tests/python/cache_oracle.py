"""A float64 numpy oracle for the KV cache, written from the math of mha.h
and docs/CACHE.md, not from the library: causal self-attention of every
position of a sequence over the positions before it (and itself), with
GQA (query head r reads kv head r // (h/h_kv)), a sliding window (keys
j >= i - window_left), the add_bias_kv / add_zero_attn keys after the
sequence (visible to every query), and K and V optionally rounded to
binary16 as an fp16 cache stores them (to nearest, or truncated toward
zero: the rounding bug a test must be able to catch).
"""
import numpy as np


def round_fp16(a, mode):
    """a (float64) through binary16: 'nearest' (ties to even, IEEE) or
    'truncate' (toward zero: the neighbour of smaller magnitude)."""
    h = a.astype(np.float16)
    if mode == "truncate":
        over = np.abs(h.astype(np.float64)) > np.abs(a)  # rounded away from zero: step back
        h = np.where(over, np.nextafter(h, np.float16(0)), h)
    return h.astype(np.float64)


def attend64(w, c, x, window_left=None, round_kv=None):
    """y (B,S,d_model) for x (B,S,d_model): row i attends rows 0..i (and,
    with window_left, only rows >= i - window_left) plus the extra keys;
    round_kv None | 'nearest' | 'truncate' applies to the rows' K and V
    (the extra keys are the layer's, never stored in the cache)."""
    h, g, dk, dv = c["n_heads"], c["n_kv_heads"], c["d_k"], c["d_v"]
    x = x.astype(np.float64)
    B, S, _ = x.shape
    get = lambda n, size: w[n].astype(np.float64) if n in w else np.zeros(size)  # noqa: E731
    q = x @ w["w_q"].astype(np.float64) + get("b_q", h * dk)          # (B,S,h*d_k)
    k = x @ w["w_k"].astype(np.float64) + get("b_k", g * dk)          # (B,S,h_kv*d_k)
    v = x @ w["w_v"].astype(np.float64) + get("b_v", g * dv)          # (B,S,h_kv*d_v)
    if round_kv:
        k, v = round_fp16(k, round_kv), round_fp16(v, round_kv)
    extra_k, extra_v = [], []
    if c["add_bias_kv"]:
        extra_k.append(get("bias_k", g * dk)), extra_v.append(get("bias_v", g * dv))
    if c["add_zero_attn"]:
        extra_k.append(np.zeros(g * dk)), extra_v.append(np.zeros(g * dv))
    n_x = len(extra_k)
    if n_x:
        k = np.concatenate([k, np.broadcast_to(np.stack(extra_k), (B, n_x, g * dk))], axis=1)
        v = np.concatenate([v, np.broadcast_to(np.stack(extra_v), (B, n_x, g * dv))], axis=1)
    i, j = np.arange(S)[:, None], np.arange(S)[None, :]
    allowed = j <= i                                                    # (S,S) causal
    if window_left is not None:
        allowed &= j >= i - window_left
    allowed = np.concatenate([allowed, np.ones((S, n_x), dtype=bool)], axis=1)  # (S,S+n_x)
    z = np.zeros((B, S, h * dv))
    for r in range(h):
        gr = r // (h // g)
        s = np.einsum("btd,bsd->bts", q[..., r * dk:(r + 1) * dk], k[..., gr * dk:(gr + 1) * dk]) / np.sqrt(dk)
        s = np.where(allowed, s, -np.inf)
        p = np.exp(s - s.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        z[..., r * dv:(r + 1) * dv] = np.einsum("bts,bsd->btd", p, v[..., gr * dv:(gr + 1) * dv])
    return z @ w["w_o"].astype(np.float64) + get("b_o", c["d_model"])
