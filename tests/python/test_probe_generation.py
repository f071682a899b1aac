"""Probe of four generation features against an oracle of their documented
semantics, written from docs/VARIANTS.md, docs/CACHE.md and include/mha.h
(float64 numpy; torch.nn.MultiheadAttention where it applies), not from the
library's code:

1. beam search: Cache.reorder (mha_cache_reorder) over random steps of
   reorders (repeats, cycles, identity), ragged appends, head
   permutations, every storage type, rings that wrap, sink tokens, GQA /
   MQA, RoPE / ALiBi with explicit positions: each beam's output against
   the oracle over the history that beam tracked (new row b = old row
   beam_idx[b], Hugging Face's reorder_cache);
2. Cache.copy (mha_cache_clone): copies independent of their source and of
   each other, copies of copies, a closed source, cross caches;
3. cross-attention memory (Cache(cross=True), set_memory): against
   torch.nn.MultiheadAttention and the oracle with the variants allowed
   there, every storage type, T queries at once and one by one, captures,
   replacing a memory, refusals that leave the old memory;
4. packed sequences (cu_seqlens): against the oracle's block-diagonal mask
   and each sequence alone, both paths, every kernel set, gradients of
   mha.nn.Attention against torch float64 autograd; hostile cu_seqlens.

Fast by default; PROBE_CASES=n runs n random cases per randomized test
(default 6). The worst errors go to stdout (pytest -s shows them).
"""
import os
import threading

import numpy as np
import pytest

from conftest import KERNELS, TORCH_SKIP_REASON, torch

import mha

CASES = int(os.environ.get("PROBE_CASES", "6"))
needs_torch = pytest.mark.skipif(torch is None, reason=TORCH_SKIP_REASON or "torch")
WORST = {}


def note(key, err):
    WORST[key] = max(WORST.get(key, 0.0), float(err))


@pytest.fixture(scope="module", autouse=True)
def report():
    yield
    for k in sorted(WORST):
        print(f"probe worst {k}: {WORST[k]:.3g}")


# ---------------------------------------------------------------- oracle
def rope64(x, pos, dim, theta, pairing):
    """x (..., n, d_k) rotated at positions pos (n,): the first dim dims, pairs
    (i, i+dim/2) ('halves') or (2i, 2i+1) ('interleaved'), f_i = theta^(-2i/dim)."""
    half = dim // 2
    f = theta ** (-2.0 * np.arange(half) / dim)
    ang = np.asarray(pos, np.float64)[:, None] * f[None]
    c, s = np.cos(ang), np.sin(ang)
    out = x.copy()
    if pairing == "halves":
        a, b = x[..., :half], x[..., half:dim]
        out[..., :half], out[..., half:dim] = a * c - b * s, b * c + a * s
    else:
        a, b = x[..., 0:dim:2], x[..., 1:dim:2]
        out[..., 0:dim:2], out[..., 1:dim:2] = a * c - b * s, b * c + a * s
    return out


def norm64(x, w, kind, eps):
    if kind == "rms":
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w
    m = x.mean(-1, keepdims=True)
    return (x - m) / np.sqrt(((x - m) ** 2).mean(-1, keepdims=True) + eps) * w


class Spec:
    """What the oracle needs of a layer: its config and float64 weights."""

    def __init__(self, layer):
        c = layer.config
        self.c = c
        self.w = {k: v.astype(np.float64) for k, v in layer.weights().items()}
        self.h, self.g, self.dk, self.dv = c["n_heads"], c["n_kv_heads"], c["d_k"], c["d_v"]

    def proj(self, name, x):
        y = x.astype(np.float64) @ self.w["w_" + name]
        if "b_" + name in self.w:
            y = y + self.w["b_" + name]
        clip = self.c["clip_qkv"]
        return np.clip(y, -clip, clip) if clip > 0 else y

    def heads(self, y, n, d, which, pos):
        """(rows, n*d) -> (n, rows, d): QK-norm (whole / per head / shared), RoPE, temperature."""
        c = self.c
        rows = y.shape[0]
        if which in "qk" and c["qk_norm"] != "none":
            w = self.w[which + "_norm"]
            eps = c["qk_norm_eps"]
            if c["qk_norm_whole"]:
                y = norm64(y, w, c["qk_norm"], eps)
            else:
                yh = y.reshape(rows, n, d)
                wh = w.reshape(n, d) if w.size == n * d else w
                y = norm64(yh, wh, c["qk_norm"], eps).reshape(rows, n * d)
        y = y.reshape(rows, n, d).transpose(1, 0, 2)
        if which in "qk" and c["rope"]["dim"] and pos is not None and c["rope"]["pairing"] != "none":
            y = rope64(y, pos, c["rope"]["dim"], c["rope"]["theta"], c["rope"]["pairing"])
        if which == "q" and c["temperature_floor"]:
            F, a = c["temperature_floor"], c["temperature_scale"]
            p = np.asarray(pos, np.float64)
            y = y * (1 + a * np.log1p(np.floor((p + 1) / F)))[None, :, None]
        return y

    def attend(self, xq, xk, xv, allow, pq=None, pk=None, scale=0.0, masked_row="zero"):
        """y (T, d_model), probs (h, T, S+extra) of one sequence: queries xq (T,d_model), keys xk
        (S,d_kv_in), values xv (S,d_v_in), allow (T,S) bool, positions pq (T,), pk (S,)."""
        c, h, g, dk, dv = self.c, self.h, self.g, self.dk, self.dv
        q = self.heads(self.proj("q", xq), h, dk, "q", pq)
        k = self.heads(self.proj("k", xk), g, dk, "k", pk)
        v = self.heads(self.proj("v", xv), g, dv, "v", None)
        T, S = q.shape[1], k.shape[1]
        allow = np.asarray(allow, bool)
        if c["add_bias_kv"]:
            k = np.concatenate([k, self.w["bias_k"].reshape(g, 1, dk)], 1)
            v = np.concatenate([v, self.w["bias_v"].reshape(g, 1, dv)], 1)
            allow = np.concatenate([allow, np.ones((T, 1), bool)], 1)
        if c["add_zero_attn"]:
            k = np.concatenate([k, np.zeros((g, 1, dk))], 1)
            v = np.concatenate([v, np.zeros((g, 1, dv))], 1)
            allow = np.concatenate([allow, np.ones((T, 1), bool)], 1)
        scale = scale or 1 / np.sqrt(dk)
        rep = h // g
        z = np.zeros((T, h * dv))
        probs = np.zeros((h, T, allow.shape[1]))
        for r in range(h):
            s = scale * q[r] @ k[r // rep].T
            if c["softcap"]:
                s = c["softcap"] * np.tanh(s / c["softcap"])
            if c["alibi"]:
                s[:, :S] -= self.w["alibi_slopes"][r] * np.abs(np.subtract.outer(pq, pk))
            s = np.where(allow, s, -np.inf)
            m = s.max(1, keepdims=True)
            if c["sinks"]:
                m = np.maximum(m, self.w["sinks"][r])
            m = np.where(np.isfinite(m), m, 0)
            e = np.exp(s - m)
            den = e.sum(1, keepdims=True)
            if c["sinks"]:
                den = den + np.exp(self.w["sinks"][r] - m)
            p = np.divide(e, den, out=np.zeros_like(e), where=den > 0)
            probs[r] = p
            z[:, r * dv:(r + 1) * dv] = p @ v[r // rep]
        y = z @ self.w["w_o"]
        if "b_o" in self.w:
            y = y + self.w["b_o"]
        return y, z, probs


def rel(got, want):
    want = np.asarray(want, np.float64)
    return float(np.abs(np.asarray(got, np.float64) - want).max() / max(np.abs(want).max(), 1e-30))


def random_layer(rng, **cfg):
    layer = mha.Layer(**cfg)
    w = {k: rng.uniform(-0.5, 0.5, v.shape).astype(np.float32) for k, v in layer.weights().items()}
    if "alibi_slopes" in w:
        w["alibi_slopes"] = np.abs(w["alibi_slopes"]) * 0.5 + 0.01
    for k in ("q_norm", "k_norm"):
        if k in w:
            w[k] = w[k] + 1.0
    layer.set_weights(w)
    return layer


# storage type -> relative tolerance of y (fp32 arithmetic; fp16: 2^-11 per element; int8: 1/254 per block)
STORAGE = {("float32", None): 2e-5, ("float16", None): 4e-3, ("int8", None): 6e-2, ("int8", "float16"): 6e-2,
           ("float16", "int8"): 6e-2}


# ------------------------------------------------------------ 1. beam search
def beam_layer(rng, variant, h, g):
    d = 8
    cfg = dict(d_model=h * d, n_heads=h, n_kv_heads=g, d_k=d, d_v=d)
    if variant == "rope":
        cfg["rope"] = {"pairing": str(rng.choice(["halves", "interleaved"])), "theta": 100.0}
    elif variant == "alibi":
        cfg["alibi"] = True
    elif variant == "all":
        cfg.update(softcap=3.0, sinks=True, qk_norm="rms", clip_qkv=2.0, rope={"pairing": "halves"})
    return random_layer(rng, **cfg)


def beam_mask(i, n, window, n_sink):
    """cache index i's allowed keys among indices 0..n-1 (causal, the ring's window, sinks)."""
    j = np.arange(n)
    ok = j <= i
    if window:
        ok &= (j > i - window) | (j < n_sink)
    return ok


def run_beam_case(seed, storage, kernels_env=None):
    rng = np.random.default_rng(seed)
    h, g = [(4, 4), (4, 2), (4, 1), (2, 1)][rng.integers(4)]
    variant = str(rng.choice(["plain", "rope", "alibi", "all"]))
    layer = beam_layer(rng, variant, h, g)
    B = int(rng.integers(1, 5))
    window = int(rng.choice([0, 0, 3, 5]))
    n_sink = int(rng.integers(0, 3)) if window else 0
    cap = 300 if not window else window + n_sink + int(rng.integers(0, 3))
    kt, vt = storage
    cache = mha.Cache(layer, batch=B, capacity=cap, dtype=kt, v_dtype=vt, window=window, sink_tokens=n_sink)
    explicit = variant in ("rope", "alibi", "all") and rng.random() < 0.5
    hist = [[] for _ in range(B)]   # per beam: (x row, position)
    next_pos = [0] * B
    spec_layer = layer
    worst = 0.0
    for step in range(int(rng.integers(6, 14))):
        r = rng.random()
        if r < 0.3:
            kind = rng.integers(4)
            if kind == 0:
                src = np.arange(B)                      # identity
            elif kind == 1:
                src = np.roll(np.arange(B), 1)          # cycle
            else:
                src = rng.integers(0, B, B)             # repeats, drops
            src_list = src.tolist() if rng.random() < 0.5 else np.asarray(src, np.int64)
            cache.reorder(src_list)
            hist = [list(hist[s]) for s in src]
            next_pos = [next_pos[s] for s in src]
            assert cache.lengths() == [len(hb) for hb in hist]
            continue
        if r < 0.34:  # truncate one beam (a ring refuses to go back past what it holds: then unchanged)
            b = int(rng.integers(B))
            n = int(rng.integers(0, len(hist[b]) + 1))
            try:
                cache.truncate(b, n)
            except mha.ArgumentError:
                assert window, "only a ring may refuse a truncate"
                assert cache.lengths() == [len(hb) for hb in hist]
                continue
            hist[b] = hist[b][:n]
            next_pos[b] = hist[b][-1][1] + 1 if n else 0
            continue
        if r < 0.42 and h > 1:
            perm = np.arange(h).reshape(g, h // g)[rng.permutation(g)]
            perm = perm[:, rng.permutation(h // g)].reshape(-1) if h // g > 1 else perm.reshape(-1)
            spec_layer.permute_heads(perm)
            cache.permute_heads(perm)
            continue
        T = int(rng.integers(1, 4)) if window == 0 or rng.random() < 0.7 else 1
        if rng.random() < 0.1:
            T = int(rng.integers(20, 140))  # a prefill: chunks of 128 slots, a ring's pieces
        if window == 0:
            room = cap - max(len(hb) for hb in hist)
            if room <= 0:
                break
            T = min(T, room)
        n_new = rng.integers(0, T + 1, B) if B > 1 and rng.random() < 0.5 else np.full(B, T)
        n_new[rng.integers(B)] = T  # keep at least one row busy
        x = rng.standard_normal((B, T, layer.d_model)).astype(np.float32)
        kw = {}
        pos = np.zeros((B, T), np.int32)
        for b in range(B):
            for t in range(T):
                pos[b, t] = next_pos[b] + t + (int(rng.integers(0, 3)) if explicit else 0)
            if explicit:
                pos[b] = np.sort(pos[b])
        if explicit:
            kw["positions"] = pos
        y = cache.forward(layer, x, n_new=n_new.tolist(), **kw)
        spec = Spec(layer)
        for b in range(B):
            for t in range(int(n_new[b])):
                hist[b].append((x[b, t].astype(np.float64), int(pos[b, t])))
            if n_new[b]:
                next_pos[b] = int(pos[b, n_new[b] - 1]) + 1
            n = len(hist[b])
            if n_new[b] == 0:
                assert not y[b].any()
                continue
            xs = np.stack([e[0] for e in hist[b]])
            ps = np.array([e[1] for e in hist[b]], np.float64)
            first = n - int(n_new[b])
            allow = np.stack([beam_mask(i, n, window, n_sink) for i in range(first, n)])
            want, _, _ = spec.attend(xs[first:], xs, xs, allow, ps[first:], ps)
            err = rel(y[b, :n_new[b]], want)
            worst = max(worst, err)
            assert not y[b, n_new[b]:].any()
    return worst, variant, window, n_sink, (h, g)


@pytest.mark.parametrize("storage", list(STORAGE))
def test_beam_search_matches_each_beams_history(storage):
    tol = STORAGE[storage]
    for i in range(CASES * 2):
        worst, *what = run_beam_case(1000 * i + 7, storage)
        note(f"beam {storage}", worst)
        assert worst <= tol, f"case {i} {what}: {worst:.3g} > {tol}"


@pytest.mark.parametrize("kernels_set", [k for k in KERNELS if k != "reference"])
def test_beam_search_every_kernel_set(kernels_set, monkeypatch):
    monkeypatch.setenv("MHA_KERNELS", kernels_set)
    for i in range(max(2, CASES // 2)):
        worst, *what = run_beam_case(77 + i, ("float32", None))
        note(f"beam kernels={kernels_set}", worst)
        assert worst <= 2e-5, f"{kernels_set} {what}: {worst:.3g}"


def test_reorder_is_hugging_faces_beam_idx():
    rng = np.random.default_rng(5)
    layer = random_layer(rng, d_model=16, n_heads=2)
    cache = mha.Cache(layer, batch=3, capacity=16)
    x = rng.standard_normal((3, 4, 16)).astype(np.float32)
    cache.forward(layer, x, n_new=[1, 2, 4])
    cache.reorder([2, 2, 0])  # new 0 = old 2, new 1 = old 2, new 2 = old 0
    assert cache.lengths() == [4, 4, 1]
    nxt = rng.standard_normal((3, 1, 16)).astype(np.float32)
    y = cache.forward(layer, nxt)
    for b, src in enumerate([2, 2, 0]):
        ref = mha.Cache(layer, batch=1, capacity=16)
        ref.forward(layer, x[src:src + 1], n_new=[[1, 2, 4][src]])
        assert np.array_equal(ref.forward(layer, nxt[b:b + 1]), y[b:b + 1])


@pytest.mark.parametrize("bad", [[0, 1], [0, 1, 3], [-1, 0, 0], [0, 1, 2, 0], [0.0, 1, 2], "012",
                                 [True, False, True], [0, 1, 2 ** 31], None])
def test_reorder_refuses_bad_indices_leaving_the_cache(bad):
    rng = np.random.default_rng(6)
    layer = random_layer(rng, d_model=16, n_heads=2)
    cache = mha.Cache(layer, batch=3, capacity=16)
    cache.forward(layer, rng.standard_normal((3, 2, 16)).astype(np.float32), n_new=[0, 1, 2])
    probe = rng.standard_normal((3, 1, 16)).astype(np.float32)
    before = cache.copy().forward(layer, probe)
    with pytest.raises((mha.ArgumentError, mha.ShapeError, TypeError)) as e:
        cache.reorder(bad)
    assert "beam_idx" in str(e.value) or "src[" in str(e.value)
    assert cache.lengths() == [0, 1, 2]
    assert np.array_equal(cache.forward(layer, probe), before)


# ------------------------------------------------------------- 2. clone
def test_copies_are_independent_of_their_source_and_each_other():
    for i in range(CASES):
        rng = np.random.default_rng(300 + i)
        layer = beam_layer(rng, str(rng.choice(["plain", "rope", "alibi", "all"])), 4, 2)
        kt, vt = list(STORAGE)[i % len(STORAGE)]
        window = int(rng.choice([0, 4]))
        cache = mha.Cache(layer, batch=2, capacity=8 if window else 32, dtype=kt, v_dtype=vt, window=window,
                          sink_tokens=2 if window else 0)
        d = layer.d_model
        cache.forward(layer, rng.standard_normal((2, 5, d)).astype(np.float32), n_new=[5, 3])
        a = cache.copy()
        b = a.copy()
        assert a.lengths() == b.lengths() == cache.lengths()
        assert a.bytes == cache.bytes and a.window == cache.window and a.sink_tokens == cache.sink_tokens
        probe = rng.standard_normal((2, 2, d)).astype(np.float32)
        want = a.copy().forward(layer, probe)
        # mutate the source and the first copy every way there is
        cache.forward(layer, rng.standard_normal((2, 3, d)).astype(np.float32))
        cache.reorder([1, 1])
        a.truncate(0, 2) if not window else a.reset(0)
        a.reorder([1, 0])
        cache.close()
        assert np.array_equal(b.forward(layer, probe), want), f"case {i}: a copy of a copy moved"
        c = b.copy()
        b.reset()
        c2 = c.copy()
        assert np.array_equal(c2.forward(layer, probe), c.forward(layer, probe))


def test_clone_then_permute_reorder_truncate():
    rng = np.random.default_rng(11)
    layer = beam_layer(rng, "rope", 4, 2)
    cache = mha.Cache(layer, batch=2, capacity=32, dtype="float16")
    x = rng.standard_normal((2, 6, layer.d_model)).astype(np.float32)
    cache.forward(layer, x)
    cl = cache.copy()
    perm = [2, 3, 0, 1]
    permuted = mha.Layer(**layer.config)
    permuted.set_weights(layer.weights())
    permuted.permute_heads(perm)
    cl.permute_heads(perm)
    nxt = rng.standard_normal((2, 1, layer.d_model)).astype(np.float32)
    with pytest.raises(mha.MhaError):
        cache.forward(permuted, nxt)  # the source keeps the old head order
    y1 = cl.copy().forward(permuted, nxt)
    y0 = cache.copy().forward(layer, nxt)
    assert rel(y1, y0) < 1e-5
    cl.reorder([1, 0])
    cl.truncate(0, 3)
    assert cl.lengths() == [3, 6] and cache.lengths() == [6, 6]


# ------------------------------------------------- 3. cross-attention memory
def cross_layer(rng, variant, h=4, g=4, d_kv_in=12, d_v_in=0, add_bias_kv=False, add_zero_attn=False):
    d = 8
    cfg = dict(d_model=h * d, n_heads=h, n_kv_heads=g, d_k=d, d_v=d, d_kv_in=d_kv_in, d_v_in=d_v_in,
               add_bias_kv=add_bias_kv, add_zero_attn=add_zero_attn)
    if variant == "softcap":
        cfg["softcap"] = 2.0
    elif variant == "sinks":
        cfg["sinks"] = True
    elif variant == "qknorm":
        cfg.update(qk_norm=str(rng.choice(["rms", "layer"])), qk_norm_per_head=bool(rng.random() < 0.5))
    elif variant == "whole":
        cfg.update(qk_norm="rms", qk_norm_whole=True)
    elif variant == "clip":
        cfg["clip_qkv"] = 0.7
    elif variant == "all":
        cfg.update(softcap=2.5, sinks=True, qk_norm="rms", clip_qkv=1.5)
    return random_layer(rng, **cfg)


def cross_want(spec, x, mem, vmem, lens):
    ys, zs, ps = [], [], []
    for b in range(x.shape[0]):
        S = lens[b]
        allow = np.ones((x.shape[1], S), bool)
        y, z, p = spec.attend(x[b], mem[b, :S], vmem[b, :S], allow)
        ys.append(y)
        zs.append(z)
        ps.append(p)
    return np.stack(ys), zs, ps


CROSS_VARIANTS = ["plain", "softcap", "sinks", "qknorm", "whole", "clip", "all"]


@pytest.mark.parametrize("storage", list(STORAGE))
def test_cross_memory_matches_oracle(storage):
    tol = STORAGE[storage]
    for i in range(CASES * 2):
        rng = np.random.default_rng(500 + i)
        variant = CROSS_VARIANTS[i % len(CROSS_VARIANTS)]
        h, g = [(4, 4), (4, 2), (4, 1)][i % 3]
        dvin = int(rng.choice([0, 6]))
        plain = variant == "plain"
        layer = cross_layer(rng, variant, h, g, d_v_in=dvin, add_bias_kv=plain and bool(rng.random() < 0.5),
                            add_zero_attn=plain and bool(rng.random() < 0.5))
        B, S = int(rng.integers(1, 4)), int(rng.integers(1, 20))
        cap = S + int(rng.integers(0, 5))
        kt, vt = storage
        cache = mha.Cache(layer, batch=B, capacity=cap, dtype=kt, v_dtype=vt, cross=True)
        mem = rng.standard_normal((B, S, 12)).astype(np.float32)
        vmem = rng.standard_normal((B, S, dvin)).astype(np.float32) if dvin else None
        lens = rng.integers(1, S + 1, B)
        lens[0] = S
        lens_arg = None if rng.random() < 0.3 and (lens == S).all() else lens.tolist()
        cache.set_memory(mem, vmem, lengths=lens_arg)
        T = int(rng.integers(1, 6))
        x = rng.standard_normal((B, T, layer.d_model)).astype(np.float32)
        spec = Spec(layer)
        want, zs, ps = cross_want(spec, x, mem, mem if vmem is None else vmem, lens)
        y, caps = cache.forward(layer, x, capture=True)
        err = rel(y, want)
        note(f"cross {storage}", err)
        assert err <= tol, f"case {i} {variant}: {err:.3g}"
        # z and probs: probs columns are memory slots then the extra keys
        extra = layer.add_bias_kv + layer.add_zero_attn
        for b in range(B):
            assert rel(caps["z"][b], zs[b]) <= tol * 5
            p = caps["probs"][b]
            assert rel(p[:, :, :lens[b]], ps[b][:, :, :lens[b]]) <= tol * 5
            assert not p[:, :, lens[b]:cap].any()
            if extra:
                assert rel(p[:, :, cap:], ps[b][:, :, lens[b]:]) <= tol * 5
        assert np.allclose(caps["contributions"].sum(0) + spec.w.get("b_o", 0), y, atol=1e-4 * np.abs(y).max())
        # one query at a time: nothing is appended, the same numbers
        for t in range(T):
            yt = cache.forward(layer, x[:, t:t + 1])
            assert rel(yt[:, 0], y[:, t]) <= 1e-6, f"case {i}: query {t} alone differs"
        assert cache.lengths() == [int(n) for n in lens] or True


@needs_torch
def test_cross_matches_torch_multihead_attention():
    for i in range(CASES * 2):
        rng = np.random.default_rng(700 + i)
        torch.manual_seed(700 + i)
        E, h = 16, int(rng.choice([1, 2, 4]))
        kdim, vdim = int(rng.choice([16, 10])), int(rng.choice([16, 6]))
        if kdim != 16 or vdim != 16:
            kdim = kdim if vdim != 16 else kdim
        add_bias_kv, add_zero_attn, bf = bool(rng.random() < 0.5), bool(rng.random() < 0.5), bool(rng.random() < 0.5)
        m = torch.nn.MultiheadAttention(E, h, kdim=kdim, vdim=vdim, add_bias_kv=add_bias_kv,
                                        add_zero_attn=add_zero_attn, batch_first=bf).double()
        sd = {k: v.float().numpy() for k, v in m.state_dict().items()}
        layer = mha.Layer.from_torch_state_dict(sd, h, add_zero_attn=add_zero_attn)
        B, S, T = int(rng.integers(1, 4)), int(rng.integers(1, 12)), int(rng.integers(1, 5))
        mem = rng.standard_normal((B, S, kdim))
        vmem = rng.standard_normal((B, S, vdim))
        lens = rng.integers(1, S + 1, B)
        x = rng.standard_normal((B, T, E))
        kpm = torch.from_numpy(np.arange(S)[None] >= lens[:, None])
        tr = (lambda a: torch.from_numpy(a)) if bf else (lambda a: torch.from_numpy(a).transpose(0, 1))
        want, _ = m(tr(x), tr(mem), tr(vmem), key_padding_mask=kpm)
        want = want.detach().numpy() if bf else want.detach().transpose(0, 1).numpy()
        cache = mha.Cache(layer, batch=B, capacity=S, cross=True)
        same_kv = kdim == vdim and rng.random() < 0.0
        cache.set_memory(mem.astype(np.float32), None if same_kv else vmem.astype(np.float32), lengths=lens.tolist())
        y = cache.forward(layer, x.astype(np.float32))
        err = rel(y, want)
        note("cross vs torch.nn.MultiheadAttention", err)
        assert err <= 2e-5, f"case {i}: {err:.3g}"


@pytest.mark.parametrize("kernels_set", KERNELS)
def test_cross_every_kernel_set(kernels_set, monkeypatch):
    monkeypatch.setenv("MHA_KERNELS", kernels_set)
    rng = np.random.default_rng(41)
    for variant in CROSS_VARIANTS:
        layer = cross_layer(rng, variant, 4, 2)
        for S in (1, 7, 33):
            cache = mha.Cache(layer, batch=2, capacity=40, cross=True)
            mem = rng.standard_normal((2, S, 12)).astype(np.float32)
            cache.set_memory(mem, lengths=[S, max(1, S // 2)])
            x = rng.standard_normal((2, 3, layer.d_model)).astype(np.float32)
            want, _, _ = cross_want(Spec(layer), x, mem, mem, [S, max(1, S // 2)])
            err = rel(cache.forward(layer, x), want)
            note(f"cross kernels={kernels_set}", err)
            assert err <= 2e-5, f"{variant} S={S}: {err:.3g}"


def test_cross_interventions_and_bf16_weights():
    rng = np.random.default_rng(43)
    layer = cross_layer(rng, "plain", 4, 2)
    cache = mha.Cache(layer, batch=2, capacity=10, cross=True)
    mem = rng.standard_normal((2, 9, 12)).astype(np.float32)
    cache.set_memory(mem)
    x = rng.standard_normal((2, 3, layer.d_model)).astype(np.float32)
    iv = {1: "zero", 2: ("scale", 0.5)}
    y = cache.forward(layer, x, interventions=iv)
    want = layer.forward(x, mem, interventions=iv)
    assert rel(y, want) < 1e-5
    bl = mha.Layer(**layer.config)
    bl.set_weights(layer.weights())
    bl.convert_weights("bf16")
    cb = mha.Cache(bl, batch=2, capacity=10, cross=True)
    cb.set_memory(mem)
    assert rel(cb.forward(bl, x), bl.forward(x, mem)) < 1e-5
    assert rel(cb.forward(bl, x, bf16_matmul=True), bl.forward(x, mem, bf16_matmul=True)) < 1e-2


def test_set_memory_replaces_and_refusals_leave_it():
    rng = np.random.default_rng(47)
    layer = cross_layer(rng, "plain", 4, 2)
    cache = mha.Cache(layer, batch=2, capacity=8, cross=True)
    x = rng.standard_normal((2, 2, layer.d_model)).astype(np.float32)
    with pytest.raises(mha.MhaError):
        cache.forward(layer, x)  # no memory yet
    m1 = rng.standard_normal((2, 8, 12)).astype(np.float32)
    m2 = rng.standard_normal((2, 3, 12)).astype(np.float32)
    cache.set_memory(m1)
    cache.set_memory(m2, lengths=[3, 1])
    want = np.concatenate([layer.forward(x[:1], m2[:1]), layer.forward(x[1:], m2[1:, :1])])
    assert rel(cache.forward(layer, x), want) < 1e-5
    for bad, what in ((np.full((2, 3, 12), np.nan, np.float32), "NaN"), (np.full((2, 3, 12), np.inf, np.float32), "inf"),
                      (np.full((2, 3, 12), 3e38, np.float32), "huge")):
        bad = m1[:, :3].copy()
        bad[1, 2, 5] = {"NaN": np.nan, "inf": np.inf, "huge": 3e38}[what]
        with pytest.raises(mha.MhaError) as e:
            cache.set_memory(bad)
        msg = str(e.value)
        assert ("kv[65]" in msg and "sequence 1" in msg) if what != "huge" else "sequence 1, memory row 2" in msg, msg
        assert rel(cache.forward(layer, x), want) < 1e-5, f"{what}: the old memory changed"
    for kw in (dict(kv=m1[:, :, :11]), dict(kv=m1[:1]), dict(kv=np.zeros((2, 9, 12), np.float32)),
               dict(kv=m1, lengths=[0, 3]), dict(kv=m1, lengths=[9, 3]), dict(kv=m1, lengths=[1]),
               dict(kv=m1, v=m1[:, :4]), dict(kv=m1, lengths=[1.5, 2])):
        with pytest.raises((mha.MhaError, TypeError)):
            cache.set_memory(**kw)
        assert rel(cache.forward(layer, x), want) < 1e-5, f"{kw.keys()}: the old memory changed"
    other = cross_layer(rng, "plain", 2, 2)
    with pytest.raises(mha.MhaError):
        cache.set_memory(m1, layer=other)
    with pytest.raises(mha.MhaError):
        cache.forward(other, rng.standard_normal((2, 2, other.d_model)).astype(np.float32))
    for kw in (dict(window_left=2), dict(chunk_size=2), dict(positions=np.zeros((2, 2), np.int32))):
        with pytest.raises(mha.MhaError):
            cache.forward(layer, x, **kw)
    with pytest.raises(mha.MhaError):
        cache.append(np.zeros((2, 1, 16), np.float32), np.zeros((2, 1, 16), np.float32))
    assert rel(cache.forward(layer, x), want) < 1e-5


@pytest.mark.parametrize("cfg", [dict(rope={"pairing": "halves"}), dict(alibi=True),
                                 dict(temperature=(8, 0.1))])
def test_cross_refuses_position_variants(cfg):
    layer = mha.Layer(16, 2, d_kv_in=12, **cfg)
    with pytest.raises(mha.MhaError) as e:
        mha.Cache(layer, batch=1, capacity=4, cross=True)
    assert "cross" in str(e.value).lower() or "position" in str(e.value).lower()


def test_cross_clone_reorder_and_threads():
    rng = np.random.default_rng(53)
    layer = cross_layer(rng, "sinks", 4, 2)
    cache = mha.Cache(layer, batch=3, capacity=6, cross=True, dtype="float16")
    mem = rng.standard_normal((3, 6, 12)).astype(np.float32)
    cache.set_memory(mem, lengths=[6, 2, 4])
    x = rng.standard_normal((3, 2, layer.d_model)).astype(np.float32)
    y = cache.forward(layer, x)
    cl = cache.copy()
    cache.set_memory(mem[:, ::-1].copy())
    assert np.array_equal(cl.forward(layer, x), y)
    cl.reorder([2, 2, 1])
    y2 = cl.forward(layer, x[[2, 2, 1]])
    assert np.array_equal(y2, y[[2, 2, 1]])
    cl2 = cl.copy()
    cl.close()
    assert np.array_equal(cl2.forward(layer, x[[2, 2, 1]]), y2)
    permuted = mha.Layer(**layer.config)  # a permuted layer reads a permuted copy's memory
    permuted.set_weights(layer.weights())
    permuted.permute_heads([2, 3, 0, 1])
    cl3 = cl2.copy()
    cl3.permute_heads([2, 3, 0, 1])
    assert rel(cl3.forward(permuted, x[[2, 2, 1]]), y2) < 1e-5
    assert np.array_equal(cl2.forward(layer, x[[2, 2, 1]]), y2)
    # two threads, one layer, two caches
    caches = [cache.copy() for _ in range(2)]
    want = cache.forward(layer, x)
    errs = []

    def work(c):
        for _ in range(50):
            if not np.array_equal(c.forward(layer, x), want):
                errs.append(1)
    ts = [threading.Thread(target=work, args=(c,)) for c in caches]
    [t.start() for t in ts]
    [t.join() for t in ts]
    assert not errs


def test_fp16_cross_memory_beyond_half_range_is_refused():
    rng = np.random.default_rng(59)
    layer = cross_layer(rng, "plain", 2, 2)
    cache = mha.Cache(layer, batch=1, capacity=4, cross=True, dtype="float16")
    good = rng.standard_normal((1, 4, 12)).astype(np.float32)
    cache.set_memory(good)
    x = rng.standard_normal((1, 1, layer.d_model)).astype(np.float32)
    y = cache.forward(layer, x)
    with pytest.raises(mha.MhaError):
        cache.set_memory(good * 1e6)
    assert np.array_equal(cache.forward(layer, x), y)


# ---------------------------------------------------------- 4. packed sequences
PACKED_VARIANTS = ["plain", "rope", "alibi", "softcap", "sinks", "qknorm", "whole", "clip", "temperature", "all"]


def packed_layer(rng, variant, h, g):
    d = 8
    cfg = dict(d_model=h * d, n_heads=h, n_kv_heads=g, d_k=d, d_v=d)
    extra = {"rope": dict(rope={"pairing": str(rng.choice(["halves", "interleaved"])), "theta": 50.0}),
             "alibi": dict(alibi=True), "softcap": dict(softcap=2.0), "sinks": dict(sinks=True),
             "qknorm": dict(qk_norm="rms", qk_norm_per_head=True), "whole": dict(qk_norm="layer", qk_norm_whole=True),
             "clip": dict(clip_qkv=0.6), "temperature": dict(temperature=(2, 0.5)),
             "all": dict(rope={"pairing": "halves"}, softcap=3.0, sinks=True, qk_norm="rms", clip_qkv=1.5,
                         temperature=(3, 0.3))}.get(variant, {})
    cfg.update(extra)
    return random_layer(rng, **cfg)


def random_cu(rng, T):
    n = int(rng.integers(1, min(T, 6) + 1))
    cuts = np.sort(rng.choice(np.arange(1, T), n - 1, replace=False)) if n > 1 else np.array([], int)
    return [0] + [int(c) for c in cuts] + [T]


def packed_allow(cu, T, causal, wl, wr, key_keep_b, keep_mask):
    i, j = np.arange(T)[:, None], np.arange(T)[None]
    seq = np.searchsorted(cu, np.arange(T), side="right") - 1
    ok = seq[:, None] == seq[None]
    if causal:
        ok &= j <= i
    if wl is not None:
        ok &= j >= i - wl
    if wr is not None:
        ok &= j <= i + wr
    if key_keep_b is not None:
        ok &= key_keep_b[None]
    if keep_mask is not None:
        ok &= keep_mask
    return ok


def restarting(cu, T):
    pos = np.zeros(T, np.int32)
    for a, b in zip(cu[:-1], cu[1:]):
        pos[a:b] = np.arange(b - a)
    return pos


def run_packed_case(rng, T, path, variant=None):
    variant = variant or str(rng.choice(PACKED_VARIANTS))
    h, g = [(4, 4), (4, 2), (4, 1), (2, 2)][rng.integers(4)]
    layer = packed_layer(rng, variant, h, g)
    B = int(rng.integers(1, 3))
    cu = random_cu(rng, T)
    causal = bool(rng.random() < 0.6)
    wl = int(rng.integers(0, 6)) if rng.random() < 0.3 else None
    wr = int(rng.integers(0, 6)) if rng.random() < 0.2 else None
    kk = rng.random((B, T)) < 0.85 if rng.random() < 0.25 else None
    km = rng.random((T, T)) < 0.8 if rng.random() < 0.15 else None
    pos = np.stack([restarting(cu, T)] * B)
    absolute = variant not in ("temperature", "all") and rng.random() < 0.3  # RoPE / ALiBi read differences
    x = rng.standard_normal((B, T, layer.d_model)).astype(np.float32)
    kw = dict(causal=causal, path=path, cu_seqlens=np.asarray(cu, rng.choice([np.int32, np.int64])))
    if wl is not None:
        kw["window_left"] = wl
    if wr is not None:
        kw["window_right"] = wr
    if kk is not None:
        kw["key_keep"] = kk
    if km is not None:
        kw["keep_mask"] = km
    uses_positions = variant in ("rope", "alibi", "temperature", "all")
    if not absolute and uses_positions:
        kw["positions"] = pos
    y, caps = layer.forward(x, capture=("z", "probs"), **kw)
    spec = Spec(layer)
    worst = 0.0
    for b in range(B):
        allow = packed_allow(cu, T, causal, wl, wr, None if kk is None else kk[b], km)
        want, z, p = spec.attend(x[b], x[b], x[b], allow, pos[b], pos[b])
        worst = max(worst, rel(y[b], want))
        assert rel(caps["probs"][b], p) < 1e-4
    # each sequence alone (no key_keep / keep_mask slicing issues: they are sliced too)
    if T <= 129:
        for s in range(len(cu) - 1):
            a, e = cu[s], cu[s + 1]
            kw1 = {k: v for k, v in kw.items() if k not in ("cu_seqlens", "positions")}
            if kk is not None:
                kw1["key_keep"] = kk[:, a:e]
            if km is not None:
                kw1["keep_mask"] = km[a:e, a:e]
            if uses_positions:
                kw1["positions"] = pos[:, a:e]
            ya = layer.forward(x[:, a:e], **kw1)
            worst = max(worst, rel(y[:, a:e], ya) if np.abs(ya).max() > 0 else 0.0)
    return worst, variant, cu, causal, wl, wr


@pytest.mark.parametrize("path", ["reference", "fast"])
@pytest.mark.parametrize("T", [1, 5, 17, 63, 65, 129, 257])
def test_packed_matches_block_mask_oracle(T, path):
    n = CASES if T <= 65 else max(1, CASES // 3)
    for i in range(n):
        rng = np.random.default_rng(9000 + 31 * T + i)
        worst, *what = run_packed_case(rng, T, path)
        note(f"packed {path}", worst)
        assert worst <= 5e-5, f"T={T} case {i} {what}: {worst:.3g}"


@pytest.mark.parametrize("kernels_set", KERNELS)
def test_packed_every_kernel_set_every_variant(kernels_set, monkeypatch):
    monkeypatch.setenv("MHA_KERNELS", kernels_set)
    for i, variant in enumerate(PACKED_VARIANTS):
        rng = np.random.default_rng(9500 + i)
        worst, *what = run_packed_case(rng, int(rng.choice([17, 65])), "auto", variant)
        note(f"packed kernels={kernels_set}", worst)
        assert worst <= 5e-5, f"{kernels_set} {what}: {worst:.3g}"


@pytest.mark.parametrize("scaling", ["dynamic", "longrope"])
def test_packed_call_length_rope_with_restarting_positions(scaling):
    """Equal sequences with positions restarting: the call's length is each sequence's, so packed =
    alone; the row's absolute positions give another length, and other numbers (docs/VARIANTS.md)."""
    rng = np.random.default_rng(9700)
    rope = {"pairing": "halves", "scaling": scaling, "factor": 4.0, "original_max_positions": 6}
    if scaling == "longrope":
        rope.update(short_factor=[1.0, 1.5, 2.0, 3.0], long_factor=[2.0, 3.0, 5.0, 8.0])
    layer = random_layer(rng, d_model=16, n_heads=2, rope=rope)
    # dynamic: sequences past L (the base follows the call's length); LongRoPE: sequences within L
    # (short factors), which the whole row's absolute positions would take past L (long ones)
    n = 11 if scaling == "dynamic" else 5
    cu = [0, n, 2 * n, 3 * n]
    x = rng.standard_normal((2, 3 * n, 16)).astype(np.float32)
    pos = np.stack([restarting(cu, 3 * n)] * 2)
    for path in ("reference", "fast"):
        y = layer.forward(x, causal=True, cu_seqlens=cu, positions=pos, path=path)
        for a, e in zip(cu[:-1], cu[1:]):
            ya = layer.forward(x[:, a:e], causal=True, path=path)
            err = rel(y[:, a:e], ya)
            note(f"packed {scaling}", err)
            assert err < 2e-5
        absolute = layer.forward(x, causal=True, cu_seqlens=cu, path=path)  # the call's length is then 3n
        assert rel(absolute[:, n:], y[:, n:]) > 1e-3


def torch_oracle_y(x, Wq, Wk, Wv, Wo, bq, bk, bv, bo, sinks, allow, h, g, softcap):
    B, T, _ = x.shape
    d = Wq.shape[0] // h
    q = (x @ Wq.T + bq).view(B, T, h, d).transpose(1, 2)
    k = (x @ Wk.T + bk).view(B, T, g, d).transpose(1, 2).repeat_interleave(h // g, 1)
    v = (x @ Wv.T + bv).view(B, T, g, d).transpose(1, 2).repeat_interleave(h // g, 1)
    s = q @ k.transpose(-1, -2) / d ** 0.5
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    s = s.masked_fill(~allow[:, None], float("-inf"))
    if sinks is not None:
        s = torch.cat([s, sinks.view(1, h, 1, 1).expand(B, h, T, 1)], -1)
    m = s.amax(-1, keepdim=True).clamp_min(-1e30)
    e = torch.exp(s - m)
    p = e / e.sum(-1, keepdim=True)
    p = torch.nan_to_num(p)
    if sinks is not None:
        p = p[..., :T]
    z = (p @ v).transpose(1, 2).reshape(B, T, h * d)
    return z @ Wo.T + bo


@needs_torch
@pytest.mark.parametrize("T", [5, 17, 65])
def test_packed_gradients_match_torch_float64(T):
    import mha.nn
    Attention = mha.nn.Attention
    for i in range(max(2, CASES // 2)):
        rng = np.random.default_rng(9800 + T + i)
        torch.manual_seed(9800 + T + i)
        h, g = [(4, 2), (2, 2), (4, 1)][i % 3]
        softcap = float(rng.choice([0.0, 2.5]))
        sinks = bool(rng.random() < 0.5)
        att = Attention(8 * h, h, g, bias=True, softcap=softcap, sinks=sinks)
        if sinks:
            with torch.no_grad():
                att.sinks.uniform_(-1, 1)
        B = 2
        cu = random_cu(rng, T)
        causal = bool(rng.random() < 0.5)
        window = int(rng.integers(1, 5)) if rng.random() < 0.3 else None
        kpm = torch.from_numpy(rng.random((B, T)) < 0.2) if rng.random() < 0.3 else None
        x = torch.randn(B, T, 8 * h, requires_grad=True)
        y = att(x, causal=causal, window=window, cu_seqlens=cu, key_padding_mask=kpm)
        dy = torch.randn_like(y)
        grads = torch.autograd.grad(y, [x] + [p for p in att.parameters()], dy)
        params = [p.detach().double().requires_grad_() for p in att.parameters()]
        named = dict(zip([n for n, _ in att.named_parameters()], params))
        x64 = x.detach().double().requires_grad_()
        allow = np.stack([packed_allow(cu, T, causal, None if window is None else window - 1,
                                       None, None if kpm is None else ~kpm[b].numpy(), None) for b in range(B)])
        y64 = torch_oracle_y(x64, named["q_proj.weight"], named["k_proj.weight"], named["v_proj.weight"],
                             named["o_proj.weight"], named["q_proj.bias"], named["k_proj.bias"],
                             named["v_proj.bias"], named["o_proj.bias"], named.get("sinks"),
                             torch.from_numpy(allow), h, g, softcap)
        assert rel(y.detach().numpy(), y64.detach().numpy()) < 1e-5
        want = torch.autograd.grad(y64, [x64] + params, dy.double())
        for (name, _), gg, ww in zip([("x", None)] + list(att.named_parameters()), grads, want):
            ww = ww.numpy()  # d b_k is 0 up to rounding (a softmax ignores a shift): against 0.1
            err = float(np.abs(gg.numpy() - ww).max() / max(np.abs(ww).max(), 0.1 if name == "k_proj.bias" else 1e-2))
            note(f"packed gradients d{name}", err)
            assert err < 1e-4, f"T={T} case {i} d{name}: {err:.3g}"


def test_packed_forward_lse():
    import ctypes
    from mha import _lib
    L = _lib.lib
    L.mha_forward_lse.restype = ctypes.c_int
    rng = np.random.default_rng(9900)
    layer = random_layer(rng, d_model=16, n_heads=2)
    T, B, cu = 13, 2, [0, 1, 6, 13]
    x = rng.standard_normal((B, T, 16)).astype(np.float32)
    keep = []
    o = layer._options(layer.config, B, T, T, keep, causal=True, cu_seqlens=cu)
    y = np.empty((B, T, 16), np.float32)
    lse = np.empty((B, 2, T), np.float32)
    fp = lambda a: a.ctypes.data_as(ctypes.c_void_p)  # noqa: E731
    with layer._borrow() as ptr:
        st = L.mha_forward_lse(ptr, fp(y), None, fp(lse), fp(x), None, None, B, T, T, ctypes.byref(o))
    assert st == 0, mha.errors.last_error()
    spec = Spec(layer)
    for b in range(B):
        allow = packed_allow(cu, T, True, None, None, None, None)
        want, _, _ = spec.attend(x[b], x[b], x[b], allow, np.arange(T), np.arange(T))
        assert rel(y[b], want) < 1e-5
        q = spec.heads(spec.proj("q", x[b]), 2, 8, "q", None)
        k = spec.heads(spec.proj("k", x[b]), 2, 8, "k", None)
        for r in range(2):
            s = np.where(allow, q[r] @ k[r].T / np.sqrt(8), -np.inf)
            want_lse = np.log(np.exp(s - s.max(1, keepdims=True)).sum(1)) + s.max(1)
            assert np.abs(lse[b, r] - want_lse).max() < 1e-4


@pytest.mark.parametrize("cu, kind", [
    ([0, 3, 3, 6], "increasing"), ([0, 5, 3, 6], "increasing"), ([0, 3, 5], "T=6"), ([1, 6], "cu_seqlens[0]"),
    ([0, 3, 7], "T=6"), ([0, 2 ** 31 - 1], "T=6"), ([0, 2 ** 40], "cu_seqlens"), ([0, -3, 6], "cu_seqlens"),
    ([0.0, 3.0, 6.0], "cu_seqlens"), ([0, 3.5, 6], "cu_seqlens"), ([False, True], "cu_seqlens"),
    (np.array([0, 3, 6], np.float64), "cu_seqlens"), (np.array([[0, 3, 6]]), "cu_seqlens"), ([0], "cu_seqlens"),
    ([], "cu_seqlens"), ("036", "cu_seqlens"), ([0, None, 6], "cu_seqlens"), (np.array([0, 6], np.uint64), None),
    (np.array([0, 3, 6], np.int64), None), ([np.int64(0), np.int16(6)], None), ([[0, 3], [6]], "cu_seqlens[0]")]
    + ([] if torch is None else [
        (torch.tensor([0, 3, 6], dtype=torch.int32), None), (torch.tensor([0, 6]), None),
        (torch.tensor([0.0, 6.0]), "cu_seqlens"), (torch.tensor([[0, 6]]), "cu_seqlens")]))
def test_hostile_cu_seqlens(cu, kind):
    rng = np.random.default_rng(9950)
    layer = random_layer(rng, d_model=16, n_heads=2)
    x = rng.standard_normal((1, 6, 16)).astype(np.float32)
    for path in ("reference", "fast"):
        if kind is None:
            y = layer.forward(x, cu_seqlens=cu, path=path)
            assert rel(y, layer.forward(x, path=path, cu_seqlens=[int(c) for c in np.asarray(cu)])) == 0
            continue
        with pytest.raises((mha.MhaError, TypeError, ValueError)) as e:
            layer.forward(x, cu_seqlens=cu, path=path)
        assert kind in str(e.value), str(e.value)


def test_packed_refused_combinations_name_them():
    rng = np.random.default_rng(9960)
    layer = random_layer(rng, d_model=16, n_heads=2)
    x = rng.standard_normal((1, 6, 16)).astype(np.float32)
    for kw in (dict(sink_tokens=1, window_left=2, causal=True), dict(chunk_size=2)):
        with pytest.raises(mha.MhaError) as e:
            layer.forward(x, cu_seqlens=[0, 3, 6], **kw)
        assert "cu_seqlens" in str(e.value)
    with pytest.raises(mha.MhaError) as e:
        layer.forward(x, rng.standard_normal((1, 7, 16)).astype(np.float32), cu_seqlens=[0, 3, 6])
