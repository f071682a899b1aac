"""A float64 torch oracle of today's attention layer with every variant at
once, written from docs/VARIANTS.md and include/mha.h (never from src/):

    Q, K, V = clamp(X W + b, -c, c)
    q = temperature(RoPE(norm_q(Q), p_i)),  k = RoPE(norm_k(K), p_j)
    s = scale q.k;  s = cap tanh(s / cap);  s = s - slope |p_i - p_j| + masks
    Z = sum exp(s) V / (sum exp(s) + exp(sink));  Z *= sigmoid(x W_G + b_G)
    Y = Z W_O + b_O

Weights are the library's (in, out) arrays; autograd of the result gives
the gradients the backward must reproduce. Masks follow the library's
convention (keep: True = may attend). A row with no key gives zero
(masked_row 'zero').
"""
import math

import numpy as np
import torch

T64 = torch.float64


def alibi_default(n):
    p = 1 << (n.bit_length() - 1)
    s = [2.0 ** (-8.0 * (r + 1) / p) for r in range(p)]
    s += [2.0 ** (-8.0 * (2 * (r - p) + 1) / (2 * p)) for r in range(p, n)]
    return np.array(s, np.float32)


def inv_freq(rope, r, seq):
    """(r/2,) float64 frequencies and the cos/sin factor, Hugging Face's rules."""
    theta = rope.get("theta") or 10000.0
    scaling = rope.get("scaling", "none")
    factor = rope.get("factor") or 1.0
    L = rope.get("original_max_positions", 0)
    i = np.arange(0, r, 2, dtype=np.float64)
    mscale = 1.0
    if scaling == "dynamic" and seq > L:
        theta = theta * (factor * seq / L - factor + 1) ** (r / (r - 2))
    f = 1.0 / theta ** (i / r)
    if scaling == "linear":
        f = f / factor
    elif scaling == "llama3":
        lo, hi = rope.get("low_freq_factor") or 1.0, rope.get("high_freq_factor") or 4.0
        wl = 2 * math.pi / f
        g = np.where(wl > L / lo, f / factor, f)
        smooth = (L / wl - lo) / (hi - lo)
        med = ~(wl < L / hi) & ~(wl > L / lo)
        f = np.where(med, (1 - smooth) * g / factor + smooth * g, g)
    elif scaling == "yarn":
        bf, bs = rope.get("beta_fast") or 32.0, rope.get("beta_slow") or 1.0
        d = lambda n: r * math.log(L / (n * 2 * math.pi)) / (2 * math.log(theta))  # noqa: E731
        lo, hi = max(math.floor(d(bf)), 0), min(math.ceil(d(bs)), r - 1)
        if lo == hi:
            hi += 0.001
        ramp = np.clip((np.arange(r // 2) - lo) / (hi - lo), 0, 1)
        f = (f / factor) * ramp + f * (1 - ramp)
        mscale = rope.get("attn_factor") or (0.1 * math.log(factor) + 1.0)
    elif scaling == "longrope":
        ext = np.array(rope["long_factor"] if seq > L else rope["short_factor"], np.float32).astype(np.float64)
        f = f / ext
        fac = rope.get("factor") or 1.0
        mscale = rope.get("attn_factor") or (math.sqrt(1 + math.log(fac) / math.log(L)) if fac > 1 else 1.0)
    return f, mscale


def rope_apply(x, pos, rope, seq):
    """x (B,N,n,d) rotated at pos (B,N) on its first r dims."""
    if not rope:
        return x
    d = x.shape[-1]
    r = rope.get("dim") or d
    f, m = inv_freq(rope, r, seq)
    ang = torch.as_tensor(np.array(pos), dtype=T64)[..., None] * torch.as_tensor(f)  # (B,N,r/2)
    cos, sin = (torch.cos(ang) * m)[:, :, None], (torch.sin(ang) * m)[:, :, None]
    rot, rest = x[..., :r], x[..., r:]
    if rope.get("pairing", "halves") == "halves":
        a, b = rot[..., :r // 2], rot[..., r // 2:]
        out = torch.cat([a * cos - b * sin, b * cos + a * sin], -1)
    else:
        a, b = rot[..., 0::2], rot[..., 1::2]
        out = torch.stack([a * cos - b * sin, b * cos + a * sin], -1).reshape(rot.shape)
    return torch.cat([out, rest], -1)


def qk_norm(x, w, kind, per_head, whole, eps):
    """x (B,N,n,d); w (d) shared or (n*d) per head / whole."""
    if kind == "none":
        return x
    B, N, n, d = x.shape
    y = x.reshape(B, N, n * d) if whole else x
    if kind == "rms":
        y = y / torch.sqrt((y * y).mean(-1, keepdim=True) + eps)
    else:
        mu = y.mean(-1, keepdim=True)
        y = (y - mu) / torch.sqrt(((y - mu) ** 2).mean(-1, keepdim=True) + eps)
    y = y.reshape(B, N, n, d)
    return y * (w.reshape(n, d) if (per_head or whole) else w)


def temperature(pos, temp):
    if not temp:
        return None
    F, a, rule = (tuple(temp) + ("llama4",))[:3]
    p = np.asarray(pos, np.int64)
    fl = (p + 1) // F if rule == "llama4" else p // F
    return torch.as_tensor(1 + a * np.log1p(fl.astype(np.float64)), dtype=T64)


def allowed_mask(B, h, T, S, call):
    """(B,h,T,S) bool: every by-index rule of the call."""
    i = np.arange(T)[:, None]
    j = np.arange(S)[None, :]
    ai = i + (S - T if call.get("align") == "bottom_right" else 0)
    ok = np.ones((T, S), bool)
    if call.get("causal"):
        ok &= j <= ai
    wl, wr = call.get("window_left"), call.get("window_right")
    n = call.get("sink_tokens", 0)
    if wl is not None and wl >= 0:
        inside = j >= ai - wl
        if n:
            inside |= j < n
        ok &= inside
    if wr is not None and wr >= 0:
        ok &= j <= ai + wr
    C = call.get("chunk_size", 0)
    if C:
        ok &= (ai // C) == (j // C)
    cu = call.get("cu_seqlens")
    if cu is not None:
        seq = np.zeros(T, int)
        for s in range(len(cu) - 1):
            seq[cu[s]:cu[s + 1]] = s
        ok &= seq[:, None] == seq[None, :]
    ok = np.broadcast_to(ok, (B, h, T, S)).copy()
    km = call.get("keep_mask")
    if km is not None:
        ok &= np.broadcast_to(km.reshape((-1, km.shape[-3] if km.ndim == 4 else 1, T, S)).astype(bool)
                              if km.ndim == 4 else km.astype(bool), (B, h, T, S))
    kk = call.get("key_keep")
    if kk is not None:
        ok &= kk.astype(bool)[:, None, None, :]
    return ok


def additive(B, h, T, S, call):
    add = np.zeros((B, h, T, S))
    am = call.get("additive_mask")
    if am is not None:
        add = add + np.broadcast_to(am.astype(np.float64), (B, h, T, S))
    ka = call.get("key_additive")
    if ka is not None:
        add = add + ka.astype(np.float64)[:, None, None, :]
    return add


def forward(cfg, w, x, kv=None, value=None, call=None, need_probs=False, bf16_matmul=False,
            kv_store=None, need_lse=False, drop=None):
    """y (B,T,d_model) as a float64 torch tensor (w: dict of torch tensors,
    float64, requires_grad where gradients are wanted; x, kv the same).
    cfg: the Layer's keyword arguments (h, h_kv, d_k, d_v, rope, alibi,
    softcap, sinks, qk_norm, qk_norm_per_head, qk_norm_whole, qk_norm_eps,
    clip_qkv, temperature, output_gate)."""
    call = call or {}
    if bf16_matmul:  # the projections' inputs rounded to bf16 (x, the sources, Z before W_O)
        rnd = lambda t: None if t is None else torch.as_tensor(bf16_round(t.detach().numpy()), dtype=T64)  # noqa: E731
        x, kv, value = rnd(x), rnd(kv), rnd(value)
    h, g, dk, dv = cfg["n_heads"], cfg.get("n_kv_heads") or cfg["n_heads"], cfg["d_k"], cfg["d_v"]
    B, T, _ = x.shape
    ksrc = x if kv is None else kv
    vsrc = ksrc if value is None else value
    S = ksrc.shape[1]
    zero = lambda n: 0  # noqa: E731
    q = x @ w["w_q"] + (w["b_q"] if "b_q" in w else zero(0))
    k = ksrc @ w["w_k"] + (w["b_k"] if "b_k" in w else 0)
    v = vsrc @ w["w_v"] + (w["b_v"] if "b_v" in w else 0)
    c = cfg.get("clip_qkv") or 0.0
    if c:
        q, k, v = q.clamp(-c, c), k.clamp(-c, c), v.clamp(-c, c)
    q, k, v = q.reshape(B, T, h, dk), k.reshape(B, S, g, dk), v.reshape(B, S, g, dv)
    kind = cfg.get("qk_norm", "none")
    eps = cfg.get("qk_norm_eps") or 1e-6
    ph, wh = cfg.get("qk_norm_per_head", False), cfg.get("qk_norm_whole", False)
    if kind != "none":
        q = qk_norm(q, w["q_norm"], kind, ph, wh, eps)
        k = qk_norm(k, w["k_norm"], kind, ph, wh, eps)
    pos = call.get("positions")
    pos = np.broadcast_to(np.arange(T), (B, T)) if pos is None else np.asarray(pos)
    kpos = call.get("key_positions")
    if kpos is None:
        kpos = pos if kv is None else np.broadcast_to(np.arange(S), (B, S))
    kpos = np.asarray(kpos)
    rope = cfg.get("rope")
    if rope:
        seq = 1 + int(max(pos.max(), kpos.max()))
        q, k = rope_apply(q, pos, rope, seq), rope_apply(k, kpos, rope, seq)
    if kv_store:  # what a cache of these storage types reads back (K after QK-norm and RoPE)
        k = torch.as_tensor(round_store(k.detach().numpy(), kv_store[0], dk))
        v = torch.as_tensor(round_store(v.detach().numpy(), kv_store[1], dv))
    tf = temperature(pos, cfg.get("temperature"))
    if tf is not None:
        q = q * tf[:, :, None, None]
    scale = call.get("scale") or 1.0 / math.sqrt(dk)
    rep = h // g
    kk = k.repeat_interleave(rep, dim=2)  # (B,S,h,dk)
    vv = v.repeat_interleave(rep, dim=2)
    s = torch.einsum("bthd,bshd->bhts", q, kk) * scale
    cap = cfg.get("softcap") or 0.0
    if cap:
        s = cap * torch.tanh(s / cap)
    if cfg.get("alibi"):
        slopes = w["alibi_slopes"] if "alibi_slopes" in w else torch.as_tensor(alibi_default(h), dtype=T64)
        dist = torch.as_tensor(np.abs(pos[:, :, None] - kpos[:, None, :]), dtype=T64)  # (B,T,S)
        s = s - slopes[None, :, None, None] * dist[:, None]
    ok = torch.as_tensor(allowed_mask(B, h, T, S, call))
    s = s + torch.as_tensor(additive(B, h, T, S, call))
    ok = ok & torch.isfinite(s)
    s = torch.where(ok, s, torch.full_like(s, -math.inf))
    lse = torch.logsumexp(s, -1)  # (B,h,T): the keys' log-sum-exp (the sink is no key); -inf for no key
    m = torch.where(ok.any(-1, keepdim=True), s.max(-1, keepdim=True).values, torch.zeros_like(s[..., :1]))
    if cfg.get("sinks"):
        sink = w["sinks"][None, :, None, None].expand(B, h, T, 1)
        m = torch.maximum(m, sink)
    e = torch.where(ok, torch.exp(s - m), torch.zeros_like(s))
    den = e.sum(-1, keepdim=True)
    if cfg.get("sinks"):
        den = den + torch.exp(sink - m)
    p = torch.where(den > 0, e / torch.where(den > 0, den, torch.ones_like(den)), torch.zeros_like(e))
    if call.get("masked_row") == "nan" and not cfg.get("sinks"):  # a row with no key: NaN
        p = torch.where(ok.any(-1, keepdim=True), p, torch.full_like(p, math.nan))
    if drop is not None:  # attention dropout: each probability times its factor (0 or 1 / (1 - p))
        p = p * torch.as_tensor(drop, dtype=T64)
    z = torch.einsum("bhts,bshd->bthd", p, vv).reshape(B, T, h * dv)
    if cfg.get("output_gate"):
        gate = x @ w["w_g"] + (w["b_g"] if "b_g" in w else 0)
        z = z * torch.sigmoid(gate)
    if bf16_matmul:
        z = rnd(z.to(torch.float32))
    y = z @ w["w_o"] + (w["b_o"] if "b_o" in w else 0)
    out = (y,) + ((p,) if need_probs else ()) + ((lse,) if need_lse else ())
    return out if len(out) > 1 else y


def bf16_round(a):
    a = np.ascontiguousarray(a, np.float32)
    u = a.view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    return r.astype(np.uint32).view(np.float32)


def int8_round(w, rows_per_segment=None):
    """Group quantization along the input dim (rows): groups of 32 rows per
    output column, restarting at each segment of rows_per_segment (W_O's
    per-head d_v rows); scale = max|w|/127, q = round half away, clamp 127."""
    w = np.asarray(w, np.float32)
    n = w.shape[0]
    seg = rows_per_segment or n
    out = np.zeros_like(w)
    for s0 in range(0, n, seg):
        for g0 in range(s0, min(s0 + seg, n), 32):
            g1 = min(g0 + 32, s0 + seg, n)
            blk = w[g0:g1]
            sc = (np.abs(blk).max(0) / np.float32(127)).astype(np.float32)
            safe = np.where(sc > 0, sc, 1)
            qf = (blk / safe).astype(np.float64)
            qv = np.clip(np.floor(np.abs(qf) + 0.5) * np.sign(qf), -127, 127)
            out[g0:g1] = np.where(sc > 0, qv.astype(np.float32) * sc, 0)
    return out


def round_store(a, kind, d):
    """a (..., d) float64 as a KV cache of `kind` reads it back: float32,
    float16 (to nearest even) or int8 (blocks of 32 along d: scale =
    max|x| / 127 in fp32, codes rounded half away from zero)."""
    a32 = np.asarray(a).astype(np.float32)
    if kind == "float32":
        return a32.astype(np.float64)
    if kind == "float16":
        return a32.astype(np.float16).astype(np.float64)
    out = np.zeros_like(a32)
    for b0 in range(0, d, 32):
        blk = a32[..., b0:b0 + 32]
        sc = (np.abs(blk).max(-1, keepdims=True) / np.float32(127)).astype(np.float32)
        safe = np.where(sc > 0, sc, np.float32(1))
        qf = (blk / safe).astype(np.float64)
        qv = np.clip(np.floor(np.abs(qf) + 0.5) * np.sign(qf), -127, 127).astype(np.float32)
        out[..., b0:b0 + 32] = np.where(sc > 0, qv * sc, 0)
    return out.astype(np.float64)


# ---- random layers shared by the probes that use this oracle
# (test_probe_combos_r32.py, cache_walk.py)

def divisors(n):
    return [d for d in range(1, n + 1) if n % d == 0]


def rand_weights(rng, layer):
    """Weights for `layer` (a mha.Layer) at scales that keep every variant
    in play: ALiBi slopes half the time the paper's default, sink logits in
    [-2, 2], norm weights near 1, projections near unit gain."""
    w = {}
    for n, a in layer.weights().items():
        if n == "alibi_slopes":
            if rng.random() < 0.5:
                continue  # the paper's default slopes
            w[n] = rng.uniform(0.05, 1.0, a.shape).astype(np.float32)
        elif n == "sinks":
            w[n] = rng.uniform(-2, 2, a.shape).astype(np.float32)
        elif n in ("q_norm", "k_norm"):
            w[n] = rng.uniform(0.5, 1.5, a.shape).astype(np.float32)
        elif n.startswith("w_"):
            w[n] = (rng.uniform(-1, 1, a.shape) * 1.8 / np.sqrt(a.shape[0])).astype(np.float32)
        else:
            w[n] = rng.uniform(-0.3, 0.3, a.shape).astype(np.float32)
    return w
