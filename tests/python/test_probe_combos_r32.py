"""Combination probe, round 32: today's variants together, against a float64
torch oracle written from docs/VARIANTS.md and include/mha.h
(combo_oracle.py), never against the library's own output.

Seeded random layers combine GQA / MQA / MHA, RoPE (both pairings,
partial rotary, linear / llama3 / YaRN / dynamic / LongRoPE), ALiBi
(default or given slopes), soft-capping, sink logits, QK-norm (RMS or
LayerNorm; shared, per head, whole width), clip_qkv, the query
temperature (both rules), the output gate, d_k != d_v and cross-attention;
random calls combine causal (both alignments), windows with StreamingLLM's
sink tokens, chunks, packed sequences, key padding (bool and float), bool and float masks
broadcast over batch or heads, explicit query and key positions, the score
scale and NaN rows. Each is checked

- forward: the reference, the fast path on the scalar and AVX2 tables
  (when this CPU runs them), fp32 / bf16 / int8 weights, bf16_matmul,
  captured probabilities;
- the KV cache: prefill then decode (ragged batches, truncate, reset,
  beam reorder, copy, save / load), fp32 / fp16 / int8 K and V each, ring
  windows with sink tokens, explicit positions, window_left and chunks,
  captured probabilities by slot, against an incremental oracle that
  stores K and V as each type reads them back; the cross-attention memory;
- backward: mha.nn.Attention's gradients and the library's tape and
  stateless backward (d_k != d_v, a value source of its own) against
  torch autograd of the oracle;
- mha_forward_lse with every variant (the sink left out of lse: the
  defect of this round) and the merge of a sinks layer's parts.

Tolerances are relative to max |y| (or the gradient's): 2e-5 for the
double reference, 3e-4 for fp32 fast paths (bf16_matmul: one bf16 flip
of an element of Z is 4e-3 of it), the cache's storage modelled in the
oracle (fp16 2e-3, int8 3e-2: an element at a rounding tie may flip).
Run time: about 40 s on 2 shared cores.
"""
import copy
import ctypes
import math

import numpy as np
import pytest

from conftest import KERNELS, require

torch = require("torch")
import mha  # noqa: E402
import mha.nn  # noqa: E402
from mha import _lib  # noqa: E402
from mha import nn as mnn  # noqa: E402
from mha._arrays import fptr  # noqa: E402
from mha.errors import check  # noqa: E402

import combo_oracle as O  # noqa: E402
from combo_oracle import divisors, rand_weights  # noqa: E402

FAST_KERNELS = [k for k in KERNELS if k in ("scalar", "avx2")]


# ------------------------------------------------------------- generators

def rand_rope(rng, d_k):
    r = d_k if rng.random() < 0.4 else int(rng.choice(list(range(2, d_k + 1, 2))))
    rope = dict(pairing=str(rng.choice(["halves", "interleaved"])), dim=r,
                theta=float(rng.choice([10000.0, 100.0, 500000.0])))
    sc = str(rng.choice(["none", "none", "linear", "llama3", "yarn", "dynamic", "longrope"]))
    if sc == "dynamic" and r < 4:
        sc = "none"  # refused: its base grows by a power r / (r - 2)
    if sc == "linear":
        rope.update(scaling="linear", factor=float(rng.choice([2.0, 4.0])))
    elif sc == "llama3":
        rope.update(scaling="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                    original_max_positions=int(rng.choice([16, 64])))
    elif sc == "yarn":
        rope.update(scaling="yarn", factor=4.0, original_max_positions=int(rng.choice([16, 64])))
        if rng.random() < 0.3:
            rope.update(beta_fast=8.0, beta_slow=2.0)
    elif sc == "dynamic":
        rope.update(scaling="dynamic", factor=2.0, original_max_positions=int(rng.choice([6, 10])))
    elif sc == "longrope":
        rope.update(scaling="longrope", original_max_positions=int(rng.choice([6, 10])),
                    factor=float(rng.choice([1.0, 4.0])),
                    short_factor=list(rng.uniform(1, 2, r // 2).round(3)),
                    long_factor=list(rng.uniform(1, 8, r // 2).round(3)))
    return rope


def rand_cfg(rng, cross=None, gate=True, big=False):
    h = int(rng.choice([1, 2, 3, 4, 6, 8]))
    g = int(rng.choice(divisors(h)))
    if big:  # several of the kernels' tiles and vector widths, partial ones
        d_k = int(rng.choice([16, 32, 40, 64, 80, 128]))
        d_v = d_k if rng.random() < 0.6 else int(rng.choice([8, 24, 33, 64, 96]))
        d_model = int(rng.choice([32, 64, 96, 130]))
    else:
        d_k = int(rng.choice([2, 4, 6, 8, 12, 16]))
        d_v = d_k if rng.random() < 0.6 else int(rng.choice([2, 4, 5, 8, 12]))
        d_model = int(rng.choice([8, 12, 16, 32]))
    cross = rng.random() < 0.25 if cross is None else cross
    cfg = dict(d_model=d_model, n_heads=h, n_kv_heads=g, d_k=d_k, d_v=d_v,
               d_kv_in=int(rng.choice([d_model, 6, 20])) if cross else 0, bias=bool(rng.random() < 0.5))
    if rng.random() < 0.55:
        cfg["rope"] = rand_rope(rng, d_k)
    if rng.random() < 0.4:
        cfg["alibi"] = True
    if rng.random() < 0.4:
        cfg["softcap"] = float(rng.choice([0.7, 2.0, 5.0, 30.0]))
    if rng.random() < 0.4:
        cfg["sinks"] = True
    if rng.random() < 0.4:
        cfg["qk_norm"] = str(rng.choice(["rms", "layer"]))
        kind = rng.choice(["shared", "per_head", "whole"])
        cfg["qk_norm_per_head"] = bool(kind != "shared")
        cfg["qk_norm_whole"] = bool(kind == "whole")
        if rng.random() < 0.3:
            cfg["qk_norm_eps"] = 1e-3
    if rng.random() < 0.3:
        cfg["clip_qkv"] = float(rng.choice([0.3, 0.8, 2.0]))
    if rng.random() < 0.25:
        cfg["temperature"] = (int(rng.choice([1, 2, 3, 5])), float(rng.choice([0.1, 0.7])),
                              str(rng.choice(["llama4", "ministral3"])))
    if gate and rng.random() < 0.2:
        cfg["output_gate"] = True
    return cfg



def rand_call(rng, cfg, B, T, S, cross, big=False):
    h = cfg["n_heads"]
    call = {}
    if rng.random() < 0.55:
        call["causal"] = True
    if cross and rng.random() < 0.5:
        call["align"] = "bottom_right"
    if rng.random() < 0.35:
        call["window_left"] = int(rng.integers(0, max(S, 2) if not big or rng.random() < 0.5 else 40))
        if rng.random() < 0.5:
            call["sink_tokens"] = int(rng.integers(1, 4 if not big else 40))
    if rng.random() < 0.15:
        call["window_right"] = int(rng.integers(0, max(S, 2)))
    if "sink_tokens" not in call and rng.random() < 0.15:
        call["chunk_size"] = int(rng.integers(1, 5 if not big else 70))
    if rng.random() < 0.25:
        call["key_keep"] = rng.random((B, S)) < 0.75
    if rng.random() < 0.2:
        ka = rng.normal(0, 1, (B, S)).astype(np.float32)
        ka[rng.random((B, S)) < 0.15] = -np.inf
        call["key_additive"] = ka
    if rng.random() < 0.2:
        call["keep_mask"] = rng.random((int(rng.choice([1, B])), int(rng.choice([1, h])), T, S)) < 0.7
    if rng.random() < 0.2:
        shp = (int(rng.choice([1, B])), int(rng.choice([1, h])), T, S)
        am = rng.normal(0, 1, shp).astype(np.float32)
        am[rng.random(shp) < 0.1] = -np.inf
        call["additive_mask"] = am
    pos_ok = cfg.get("rope") or cfg.get("alibi") or cfg.get("temperature")
    if pos_ok and rng.random() < 0.45:
        if rng.random() < 0.5:
            call["positions"] = np.sort(rng.integers(0, 40 if not big else 400, (B, T)), axis=1).astype(np.int32)
        else:
            call["positions"] = (np.arange(T)[None] + rng.integers(0, 30, (B, 1))).astype(np.int32)
    if pos_ok and rng.random() < (0.4 if cross else 0.15):
        call["key_positions"] = rng.integers(0, 40, (B, S)).astype(np.int32)
    if rng.random() < 0.25:
        call["masked_row"] = "nan"
    if rng.random() < 0.2:
        call["scale"] = float(rng.choice([0.1, 0.5, 1.0]))
    return call


def packed(rng, call, T, cross):
    """Sometimes packed sequences (cu_seqlens) on a self-attention call
    without sink tokens or chunks (which they refuse)."""
    if cross or T < 2 or "sink_tokens" in call or "chunk_size" in call or rng.random() >= 0.15:
        return call
    n = int(rng.integers(1, min(T, 4) + 1))
    call["cu_seqlens"] = [0] + sorted(int(c) for c in rng.choice(np.arange(1, T), n - 1, replace=False)) + [T]
    return call


def t64(a):
    return torch.as_tensor(np.asarray(a, np.float64))


def quantized(w, cfg, dtype):
    """The weights as a bf16 or int8 layer stores them, rounded here."""
    out = dict(w)
    for n in ("w_q", "w_k", "w_v", "w_g", "w_o"):
        if n in w:
            out[n] = O.bf16_round(w[n]) if dtype == "bf16" else O.int8_round(w[n], cfg["d_v"] if n == "w_o" else None)
    return out


def rel_err(got, want):
    """max |got - want| / (max |want| + 1e-3), NaNs required in the same places."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert np.array_equal(np.isnan(got), np.isnan(want)), "NaN rows differ"
    if np.isnan(want).all():
        return 0.0
    return float(np.nanmax(np.abs(got - want)) / (np.nanmax(np.abs(want)) + 1e-3))


@pytest.fixture
def kernel_env(monkeypatch):
    def use(name):
        monkeypatch.setenv("MHA_KERNELS", name)
    return use


# ---------------------------------------------------------------- forward
@pytest.mark.parametrize("wdtype, big", [("f32", False), ("bf16", False), ("int8", False), ("f32", True),
                                         ("int8", True)])
def test_forward_combinations(wdtype, big, kernel_env):
    """big: T, S up to 200, d_k up to 128 (several tiles of the fast
    path, partial ones, threads)."""
    worst = {}
    for it in range(200 if not big else 16):
        rng = np.random.default_rng(32_000 + 1000 * ["f32", "bf16", "int8"].index(wdtype) + 500 * big + it)
        cfg = rand_cfg(rng, big=big)
        cross = bool(cfg["d_kv_in"]) or rng.random() < 0.15
        n = 200 if big else 11
        B, T = int(rng.integers(1, 3)), int(rng.integers(1, n))
        S = int(rng.integers(1, n)) if cross else T
        layer = mha.Layer(**cfg)
        w = rand_weights(rng, layer)
        layer.set_weights(w)
        if wdtype != "f32":
            layer.convert_weights(wdtype)
            w = quantized(w, cfg, wdtype)
            got_w = layer.weights()
            for n in w:  # the stored values are the rounding written here, bit for bit
                assert np.array_equal(got_w[n], w[n]), (it, n)
        x = rng.normal(0, 1, (B, T, cfg["d_model"])).astype(np.float32)
        kv = rng.normal(0, 1, (B, S, cfg["d_kv_in"] or cfg["d_model"])).astype(np.float32) if cross else None
        call = packed(rng, rand_call(rng, cfg, B, T, S, cross, big), T, cross)
        b16 = wdtype == "bf16" and not cfg.get("output_gate") and rng.random() < 0.6
        want, probs = O.forward(cfg, {n: t64(a) for n, a in w.items()}, t64(x), None if kv is None else t64(kv),
                                call=call, need_probs=True, bf16_matmul=b16)
        runs = [("reference", "reference")] + [(k, "fast") for k in FAST_KERNELS]
        for kern, path in runs:
            kernel_env(kern)
            y, cap = layer.forward(x, kv, path=path, capture="probs", bf16_matmul=b16, **call)
            tol = 2e-5 if path == "reference" else 2e-3 if b16 else 3e-4  # b16: one bf16 flip of Z
            e = rel_err(y, want.numpy())
            worst[kern] = max(worst.get(kern, 0.0), e)
            assert e <= tol, (it, kern, e, cfg, sorted(call))
            assert rel_err(cap["probs"], probs.numpy()) <= (2e-5 if path == "reference" else 1e-4), (it, kern)
    print(f"forward {wdtype}{' large' if big else ''}: worst relative error {worst}")


# ------------------------------------------------------------- the cache
class History:
    """One sequence of the incremental oracle: its rows' K (after QK-norm,
    RoPE, as the storage reads it back), V and positions."""

    def __init__(self):
        self.k, self.v, self.pos = [], [], []

    def truncate(self, n):
        self.k, self.v, self.pos = self.k[:n], self.v[:n], self.pos[:n]


def project_rows(cfg, w, x, pos, seq):
    """q (n,h,d_k) (temperature applied), k (n,g,d_k), v (n,g,d_v), gate or
    None, of the rows x (n,d_model) at positions pos, through the oracle."""
    h, g, dk, dv = cfg["n_heads"], cfg["n_kv_heads"], cfg["d_k"], cfg["d_v"]
    W = {n: t64(a) for n, a in w.items()}
    X = t64(x)[None]
    n = X.shape[1]
    q = X @ W["w_q"] + (W["b_q"] if "b_q" in W else 0)
    k = X @ W["w_k"] + (W["b_k"] if "b_k" in W else 0)
    v = X @ W["w_v"] + (W["b_v"] if "b_v" in W else 0)
    c = cfg.get("clip_qkv") or 0.0
    if c:
        q, k, v = q.clamp(-c, c), k.clamp(-c, c), v.clamp(-c, c)
    q, k, v = q.reshape(1, n, h, dk), k.reshape(1, n, g, dk), v.reshape(1, n, g, dv)
    kind = cfg.get("qk_norm", "none")
    if kind != "none":
        eps = cfg.get("qk_norm_eps") or 1e-6
        ph, wh = cfg.get("qk_norm_per_head", False), cfg.get("qk_norm_whole", False)
        q, k = O.qk_norm(q, W["q_norm"], kind, ph, wh, eps), O.qk_norm(k, W["k_norm"], kind, ph, wh, eps)
    P = np.asarray(pos)[None]
    if cfg.get("rope"):
        q, k = O.rope_apply(q, P, cfg["rope"], seq), O.rope_apply(k, P, cfg["rope"], seq)
    tf = O.temperature(P, cfg.get("temperature"))
    if tf is not None:
        q = q * tf[:, :, None, None]
    gate = None
    if cfg.get("output_gate"):
        gate = torch.sigmoid(X @ W["w_g"] + (W["b_g"] if "b_g" in W else 0))[0].numpy()
    return q[0].numpy(), k[0].numpy(), v[0].numpy(), gate


def decode_step(cfg, w, hist, x, pos, kdt, vdt, window, n_sink, seq, window_left=None, chunk=0):
    """Appends x (n,d_model) at pos to hist; returns y (n,d_model) and the
    probabilities (n,h,len) over hist's rows: each new row attends rows
    j <= its own index inside the window (or j < n_sink), window_left and
    its chunk of C indices."""
    h, g, dk, dv = cfg["n_heads"], cfg["n_kv_heads"], cfg["d_k"], cfg["d_v"]
    slopes = None
    if cfg.get("alibi"):
        slopes = np.asarray(w["alibi_slopes"] if "alibi_slopes" in w else O.alibi_default(h), np.float64)
    q, k, v, gate = project_rows(cfg, w, x, pos, seq)
    L0 = len(hist.k)
    hist.k += list(O.round_store(k, kdt, dk))
    hist.v += list(O.round_store(v, vdt, dv))
    hist.pos += list(pos)
    K, V, P = np.array(hist.k), np.array(hist.v), np.array(hist.pos)
    n = len(x)
    z = np.zeros((n, h, dv))
    probs = np.zeros((n, h, len(K)))
    scale = 1.0 / math.sqrt(dk)
    cap = cfg.get("softcap") or 0.0
    for i in range(n):
        t = L0 + i
        j = np.arange(t + 1)
        ok = np.ones(t + 1, bool)
        if window:
            ok &= (j >= t - (window - 1)) | (j < n_sink)
        if window_left is not None:
            ok &= (j >= t - window_left) | (j < n_sink)
        if chunk:
            ok &= (j // chunk) == (t // chunk)
        for r in range(h):
            gr = r // (h // g)
            s = K[:t + 1, gr] @ q[i, r] * scale
            if cap:
                s = cap * np.tanh(s / cap)
            if slopes is not None:
                s = s - slopes[r] * np.abs(P[t] - P[:t + 1])
            s = np.where(ok, s, -np.inf)
            m = s.max()
            if cfg.get("sinks"):
                m = max(m, float(w["sinks"][r]))
            e = np.where(ok, np.exp(s - m), 0.0)
            den = e.sum() + (math.exp(float(w["sinks"][r]) - m) if cfg.get("sinks") else 0.0)
            probs[i, r, :t + 1] = e / den
            z[i, r] = probs[i, r, :t + 1] @ V[:t + 1, gr]
    z = z.reshape(n, h * dv)
    if gate is not None:
        z = z * gate
    y = z @ np.asarray(w["w_o"], np.float64) + (np.asarray(w["b_o"], np.float64) if "b_o" in w else 0.0)
    return y, probs


STORE_TOL = {"float32": 2e-5, "float16": 2e-3, "int8": 3e-2}


@pytest.mark.parametrize("big", [False, True], ids=["small", "large"])
def test_cache_combinations(big, kernel_env, tmp_path):
    """large: prefills of 60-200 tokens, rings of 20-150 wide over 128-slot
    storage chunks, d_k up to 128."""
    worst = {}
    for it in range(150 if not big else 10):
        rng = np.random.default_rng(35_000 + 500 * big + it)
        kern = FAST_KERNELS[it % len(FAST_KERNELS)] if FAST_KERNELS else "reference"
        kernel_env(kern)
        cfg = rand_cfg(rng, cross=False, big=big)
        layer = mha.Layer(**cfg)
        w = rand_weights(rng, layer)
        layer.set_weights(w)
        wdt = str(rng.choice(["f32", "f32", "bf16", "int8"]))
        if wdt != "f32":
            layer.convert_weights(wdt)
            w = quantized(w, cfg, wdt)
        B = int(rng.integers(1, 4))
        kdt = str(rng.choice(["float32", "float16", "int8"]))
        vdt = kdt if rng.random() < 0.6 else str(rng.choice(["float32", "float16", "int8"]))
        window = int(rng.integers(1, 7) if not big else rng.integers(20, 150)) if rng.random() < 0.5 else 0
        n_sink = int(rng.integers(1, 3 if not big else 20)) if window and rng.random() < 0.5 else 0
        cap = window + n_sink + int(rng.integers(0, 4 if not big else 60)) if window else 40 if not big else 400
        explicit = bool(cfg.get("rope") or cfg.get("alibi") or cfg.get("temperature")) and rng.random() < 0.4
        wl = int(rng.integers(0, 6)) if rng.random() < 0.15 else None
        chunk = int(rng.integers(1, 5)) if not n_sink and rng.random() < 0.15 else 0
        cache = mha.Cache(layer, batch=B, capacity=cap, dtype=kdt, v_dtype=vdt, window=window, sink_tokens=n_sink)
        hist = [History() for _ in range(B)]
        nextpos = [0] * B
        errs = []
        for step in range(9):
            r = rng.random()
            if step > 1 and r < 0.06:
                b = int(rng.integers(-1, B))
                cache.reset(b)
                for bb in range(B):
                    if b in (-1, bb):
                        hist[bb].truncate(0)
                        nextpos[bb] = 0
                continue
            if step > 1 and r < 0.12:
                src = [int(v) for v in rng.integers(0, B, B)]
                cache.reorder(src)
                hist, nextpos = [copy.deepcopy(hist[v]) for v in src], [nextpos[v] for v in src]
                continue
            if step > 1 and r < 0.16:
                if rng.random() < 0.5:
                    cache = cache.copy()
                else:
                    path = str(tmp_path / f"c{it}.safetensors")
                    cache.save(path)
                    cache = mha.Cache.load(path, layer)
                continue
            if step > 1 and r < 0.28:
                b = int(rng.integers(0, B))
                near = rng.random() < 0.7  # else anywhere back, into the sinks or past the ring
                n = int(rng.integers(max(0, len(hist[b].k) - (4 if not big else 60)) if near else 0, len(hist[b].k) + 1))
                try:
                    cache.truncate(b, n)
                except mha.ArgumentError as e:  # a ring keeps only what the next window needs
                    assert "window" in str(e) and "expected new_len" in str(e)
                    continue
                hist[b].truncate(n)
                nextpos[b] = hist[b].pos[-1] + 1 if explicit and n else n
                continue
            if big:
                T = int(rng.integers(60, 200)) if step == 0 else int(rng.choice([1, 1, 2, 3, 40, 130]))
            else:
                T = int(rng.integers(1, 6)) if step == 0 else int(rng.choice([1, 1, 2, 3]))
            ragged = B > 1 and rng.random() < 0.3
            n_new = [int(rng.integers(0, T + 1)) if ragged else T for _ in range(B)]
            n_new[0] = n_new[0] or T
            if not window and any(len(hist[b].k) + n_new[b] > cap for b in range(B)):
                break
            x = rng.normal(0, 1, (B, T, cfg["d_model"])).astype(np.float32)
            pos = np.zeros((B, T), np.int32)
            for b in range(B):
                gaps = rng.integers(1, 4, T) if explicit else np.ones(T, int)
                pos[b] = nextpos[b] + np.cumsum(gaps) - gaps[0]
            kw = dict(positions=pos) if explicit else {}
            if wl is not None:
                kw["window_left"] = wl
            if chunk:
                kw["chunk_size"] = chunk
            y, capd = cache.forward(layer, x, n_new=n_new if ragged else None, capture="probs", **kw)
            live = [b for b in range(B) if n_new[b]]
            seq = 1 + max(int(pos[b, :n_new[b]].max()) for b in live)  # the call's new tokens
            for b in live:
                want, probs = decode_step(cfg, w, hist[b], x[b, :n_new[b]], pos[b, :n_new[b]], kdt, vdt, window,
                                          n_sink, seq, wl, chunk)
                errs.append((np.abs(y[b, :n_new[b]] - want).max(), np.abs(want).max()))
                assert not np.any(y[b, n_new[b]:]), "padding rows are 0"
                L1 = len(hist[b].k)
                stored = range(L1) if not window else [j for j in range(L1) if j < n_sink or j >= L1 - (cap - n_sink)]
                if window and n_new[b] > cap - n_sink - window + 1:
                    stored = []  # stored in pieces: early rows' slots were overwritten since
                for j in stored:  # slot of row j: j, or a sink's, or the ring's
                    slot = j if not window or j < n_sink else n_sink + (j - n_sink) % (cap - n_sink)
                    dp = np.abs(capd["probs"][b, :, :n_new[b], slot] - probs[:, :, j].T).max()
                    assert dp <= (1e-5 if kdt == "float32" else 3e-2), (it, b, j, slot, dp)
                nextpos[b] = int(pos[b, n_new[b] - 1]) + 1
        if errs:
            e = max(a for a, _ in errs) / (max(m for _, m in errs) + 1e-3)
            tol = max(STORE_TOL[kdt], STORE_TOL[vdt], 3e-4 if wdt != "f32" else 0)
            worst[kdt + "/" + vdt] = max(worst.get(kdt + "/" + vdt, 0.0), e)
            assert e <= tol, (it, e, cfg, dict(B=B, kdt=kdt, vdt=vdt, window=window, sinks=n_sink, cap=cap,
                                                   explicit=explicit, wl=wl, chunk=chunk, wdt=wdt))
    print(f"cache{' large' if big else ''}: worst relative error {worst}")


@pytest.mark.parametrize("window, capacity, sinks, back_to", [(1, 1, 0, 8), (1, 3, 0, 2), (3, 5, 2, 1), (3, 5, 2, 2),
                                                             (4, 7, 3, 0)])
def test_ring_rollback_past_the_ring(window, capacity, sinks, back_to):
    """A ring rolled back past its oldest stored position, where the next
    token needs none of the ring's keys (a window of 1; a length inside the
    sink tokens), then decoding on: the oracle of the kept history. Before
    this round the truncate was refused ("needs position 8 for its window
    of 1")."""
    rng = np.random.default_rng(34_200 + window + back_to)
    cfg = dict(d_model=16, n_heads=4, n_kv_heads=2, d_k=4, d_v=4, bias=True, alibi=True, sinks=True,
               rope=dict(pairing="halves"))
    layer = mha.Layer(**cfg)
    w = rand_weights(rng, layer)
    layer.set_weights(w)
    for kdt in ("float32", "int8"):
        cache = mha.Cache(layer, 1, capacity, kdt, window=window, sink_tokens=sinks)
        hist = History()
        for t in range(10):
            x = rng.normal(0, 1, (1, 1, 16)).astype(np.float32)
            cache.forward(layer, x)
            decode_step(cfg, w, hist, x[0], [t], kdt, kdt, window, sinks, t + 1)
        cache.truncate(0, back_to)
        hist.truncate(back_to)
        for t in range(back_to, back_to + 6):
            x = rng.normal(0, 1, (1, 1, 16)).astype(np.float32)
            y = cache.forward(layer, x)
            want, _ = decode_step(cfg, w, hist, x[0], [t], kdt, kdt, window, sinks, t + 1)
            assert np.abs(y[0] - want).max() <= STORE_TOL[kdt] * (np.abs(want).max() + 1e-3), (kdt, t)


def test_cross_memory_combinations(kernel_env):
    worst = {}
    for it in range(80):
        rng = np.random.default_rng(36_000 + it)
        kernel_env(FAST_KERNELS[it % len(FAST_KERNELS)] if FAST_KERNELS else "reference")
        cfg = rand_cfg(rng, cross=True)
        for k in ("rope", "alibi", "temperature"):  # refused on a memory: they need relative positions
            cfg.pop(k, None)
        layer = mha.Layer(**cfg)
        w = rand_weights(rng, layer)
        layer.set_weights(w)
        wdt = str(rng.choice(["f32", "bf16", "int8"]))
        if wdt != "f32":
            layer.convert_weights(wdt)
            w = quantized(w, cfg, wdt)
        B, S = int(rng.integers(1, 4)), int(rng.integers(1, 12))
        kdt, vdt = str(rng.choice(["float32", "float16", "int8"])), str(rng.choice(["float32", "float16", "int8"]))
        cache = mha.Cache(layer, batch=B, capacity=S + int(rng.integers(0, 5)), dtype=kdt, v_dtype=vdt, cross=True)
        kv = rng.normal(0, 1, (B, S, cfg["d_kv_in"])).astype(np.float32)
        lengths = [int(rng.integers(1, S + 1)) for _ in range(B)] if rng.random() < 0.5 else None
        cache.set_memory(kv, lengths=lengths)
        keep = np.ones((B, S), bool)
        for b, n in enumerate(lengths or []):
            keep[b, n:] = False
        for _ in range(3):
            x = rng.normal(0, 1, (B, int(rng.choice([1, 1, 3])), cfg["d_model"])).astype(np.float32)
            y = cache.forward(layer, x)
            want = O.forward(cfg, {n: t64(a) for n, a in w.items()}, t64(x), t64(kv), call=dict(key_keep=keep),
                             kv_store=(kdt, vdt)).numpy()
            e = rel_err(y, want)
            worst[kdt + "/" + vdt] = max(worst.get(kdt + "/" + vdt, 0.0), e)
            assert e <= max(STORE_TOL[kdt], STORE_TOL[vdt]) / 4, (it, e, cfg, kdt, vdt, wdt)
    print(f"cross memory: worst relative error {worst}")


# ---------------------------------------------------------------- backward
GRADS = dict(dw_q="w_q", dw_k="w_k", dw_v="w_v", dw_o="w_o", db_q="b_q", db_k="b_k", db_v="b_v", db_o="b_o",
             d_sinks="sinks", d_q_norm="q_norm", d_k_norm="k_norm", dw_g="w_g", db_g="b_g")


@pytest.mark.parametrize("mode", ["tape", "stateless", "reference"])
def test_backward_combinations(mode, kernel_env):
    """The library's gradients (mha_backward_tape after mha_forward_train,
    the stateless mha_backward_kv, the reference path) of <dy, y>, d_k !=
    d_v, a value source of its own and attention dropout included, against
    torch autograd of the oracle."""
    worst = {}
    for it in range(120):
        rng = np.random.default_rng(37_000 + 1000 * ["tape", "stateless", "reference"].index(mode) + it)
        kernel_env("avx2" if "avx2" in FAST_KERNELS and it % 2 else "scalar")
        cfg = rand_cfg(rng)
        cross = bool(cfg["d_kv_in"]) or rng.random() < 0.2
        own_v = cross and rng.random() < 0.4
        if own_v:
            cfg["d_v_in"] = int(rng.choice([5, 9, cfg["d_model"]]))
        layer = mha.Layer(**cfg)
        w = rand_weights(rng, layer)
        layer.set_weights(w)
        B, T = int(rng.integers(1, 3)), int(rng.integers(1, 9))
        S = int(rng.integers(1, 9)) if cross else T
        call = packed(rng, rand_call(rng, cfg, B, T, S, cross), T, cross)
        call.pop("masked_row", None)
        if mode == "reference":
            call["path"] = "reference"
        x = rng.normal(0, 1, (B, T, cfg["d_model"])).astype(np.float32)
        kv = rng.normal(0, 1, (B, S, cfg["d_kv_in"] or cfg["d_model"])).astype(np.float32) if cross else None
        val = rng.normal(0, 1, (B, S, cfg["d_v_in"])).astype(np.float32) if own_v else None
        dy = rng.normal(0, 1, (B, T, cfg["d_model"])).astype(np.float32)
        xs = [x, kv, val]
        drop = None
        if rng.random() < 0.3:  # attention dropout: the factors each key drew, read from the probabilities
            p, seed = float(rng.choice([0.2, 0.5])), int(rng.integers(0, 2 ** 62))
            plain = layer.forward(x, kv, val, capture="probs", **dict(call, path="reference"))[1]["probs"]
            call.update(dropout_p=p, dropout_seed=seed)
            dropped = layer.forward(x, kv, val, capture="probs", **dict(call, path="reference"))[1]["probs"]
            drop = np.where((plain > 0) & (dropped > 0.5 * plain), 1 / (1 - p), 0.0)
        wanted = {"dx"} | ({"dk_src"} if cross else set()) | ({"dv_src"} if own_v else set())
        wanted |= {g for g, n in GRADS.items() if n in w}
        y, _, train = mnn._forward_arrays(layer, xs, call, False, mode == "tape")
        ctx = type("Ctx", (), dict(layer=layer, inputs=xs, train=train))
        g = mnn._backward_arrays(ctx, call, torch.from_numpy(dy), wanted)
        W = {n: t64(a).requires_grad_(True) for n, a in w.items()}
        X = t64(x).requires_grad_(True)
        KV = t64(kv).requires_grad_(True) if cross else None
        VV = t64(val).requires_grad_(True) if own_v else None
        want = O.forward(cfg, W, X, KV, VV, call=call, drop=drop)
        (want * t64(dy)).sum().backward()
        assert rel_err(y, want.detach().numpy()) <= (2e-5 if mode == "reference" else 3e-4), it
        every = max([X.grad.abs().max().item()] + [W[n].grad.abs().max().item() for n in W if W[n].grad is not None])
        every = max([every] + [t.grad.abs().max().item() for t in (KV, VV) if t is not None])
        for name, got in g.items():
            ref = {"dx": X, "dk_src": KV, "dv_src": VV}[name] if name in ("dx", "dk_src", "dv_src") else W[GRADS[name]]
            r = ref.grad.numpy().reshape(got.shape)
            # against the gradient's own scale, floored at 1e-3 of the largest (d b_k is 0 up to rounding)
            e = float(np.abs(got - r).max() / (np.abs(r).max() + 1e-3 * every + 1e-6))
            worst[name] = max(worst.get(name, 0.0), e)
            # fp32: a gradient 1e-4 of the largest, through probabilities near 0 or 1, keeps ~1% of its digits
            assert e <= (1e-5 if mode == "reference" else 2e-3), (it, name, e, cfg, sorted(call))
    print(f"backward {mode}: worst relative error " + ", ".join(f"{k} {v:.2g}" for k, v in sorted(worst.items())))


def test_nn_attention_combinations(kernel_env):
    """mha.nn.Attention (Hugging Face's parameter names; torch's mask
    convention) against autograd of the oracle, every variant in play."""
    worst = 0.0
    for it in range(80):
        rng = np.random.default_rng(40_000 + it)
        kernel_env(FAST_KERNELS[it % len(FAST_KERNELS)] if FAST_KERNELS else "reference")
        cfg = rand_cfg(rng)
        cfg["d_v"] = cfg["d_k"]
        cross = bool(cfg["d_kv_in"]) or rng.random() < 0.15
        h, g, d, dm = cfg["n_heads"], cfg["n_kv_heads"], cfg["d_k"], cfg["d_model"]
        kv_dim = cfg["d_kv_in"] or dm
        bias = [False, True, "qkv"][int(rng.integers(0, 3))]
        kw = {k: cfg[k] for k in ("rope", "alibi", "softcap", "sinks", "qk_norm", "qk_norm_per_head", "qk_norm_whole",
                                  "qk_norm_eps", "clip_qkv", "temperature", "output_gate") if k in cfg}
        m = mha.nn.Attention(dm, h, n_kv_heads=g, head_dim=d, bias=bias, kv_dim=kv_dim if cross else None, **kw)
        gen = torch.Generator().manual_seed(it)
        with torch.no_grad():
            for n, p in m.named_parameters():
                if n == "sinks":
                    p.copy_(torch.rand(p.shape, generator=gen) * 4 - 2)
                elif "norm" in n:
                    p.copy_(torch.rand(p.shape, generator=gen) + 0.5)
                elif n.endswith("weight"):
                    p.copy_((torch.rand(p.shape, generator=gen) * 2 - 1) * 1.8 / math.sqrt(p.shape[1]))
                else:
                    p.copy_((torch.rand(p.shape, generator=gen) * 2 - 1) * 0.3)
        B, T = int(rng.integers(1, 3)), int(rng.integers(1, 9))
        S = int(rng.integers(1, 9)) if cross else T
        call = rand_call(rng, cfg, B, T, S, cross)
        for k in ("masked_row", "window_right", "scale"):
            call.pop(k, None)
        if call.get("window_left") is None:
            call.pop("sink_tokens", None)
        mcall = dict(causal=call.get("causal", False), align=call.get("align", "top_left"))
        if "window_left" in call:
            mcall["window"] = call["window_left"] + 1
        for k in ("sink_tokens", "chunk_size", "positions", "key_positions"):
            if k in call:
                mcall[k] = call[k]
        if "keep_mask" in call:  # one attn_mask and one key_padding_mask, torch's convention
            call.pop("additive_mask", None)
            mcall["attn_mask"] = torch.from_numpy(~call["keep_mask"])
        elif "additive_mask" in call:
            mcall["attn_mask"] = torch.from_numpy(call["additive_mask"])
        if "key_keep" in call:
            call.pop("key_additive", None)
            mcall["key_padding_mask"] = torch.from_numpy(~call["key_keep"])
        elif "key_additive" in call:
            mcall["key_padding_mask"] = torch.from_numpy(call["key_additive"])
        x = torch.tensor(rng.normal(0, 1, (B, T, dm)).astype(np.float32), requires_grad=True)
        kv = torch.tensor(rng.normal(0, 1, (B, S, kv_dim)).astype(np.float32), requires_grad=True) if cross else None
        G = torch.tensor(rng.normal(0, 1, (B, T, dm)))
        y = m(x, kv, **mcall)
        (y.double() * G).sum().backward()
        P = {n: p.detach().double().clone().requires_grad_(True) for n, p in m.named_parameters()}
        X = x.detach().double().requires_grad_(True)
        KV = kv.detach().double().requires_grad_(True) if cross else None
        W = {}
        if cfg.get("output_gate"):  # q_proj: each head's d query rows, then its d gate rows
            rows = P["q_proj.weight"].view(h, 2, d, dm)
            W["w_q"], W["w_g"] = rows[:, 0].reshape(h * d, dm).T, rows[:, 1].reshape(h * d, dm).T
            if "q_proj.bias" in P:
                bq = P["q_proj.bias"].view(h, 2, d)
                W["b_q"], W["b_g"] = bq[:, 0].reshape(-1), bq[:, 1].reshape(-1)
        else:
            W["w_q"] = P["q_proj.weight"].T
            if "q_proj.bias" in P:
                W["b_q"] = P["q_proj.bias"]
        W["w_k"], W["w_v"], W["w_o"] = P["k_proj.weight"].T, P["v_proj.weight"].T, P["o_proj.weight"].T
        for a, b in (("b_k", "k_proj.bias"), ("b_v", "v_proj.bias"), ("b_o", "o_proj.bias"), ("sinks", "sinks"),
                     ("q_norm", "q_norm.weight"), ("k_norm", "k_norm.weight")):
            if b in P:
                W[a] = P[b]
        if m.alibi_slopes is not None:
            W["alibi_slopes"] = m.alibi_slopes.double()
        want = O.forward(cfg, W, X, KV, call=call)
        (want * G).sum().backward()
        assert rel_err(y.detach().numpy(), want.detach().numpy()) <= 3e-4, it
        every = max(p.grad.abs().max().item() for p in P.values())
        for n, p in m.named_parameters():
            r = P[n].grad
            e = (p.grad.double() - r).abs().max().item() / (r.abs().max().item() + 1e-3 * every + 1e-6)
            worst = max(worst, e)
            assert e <= 5e-4, (it, n, e, cfg)
        assert (x.grad.double() - X.grad).abs().max().item() <= 5e-4 * (X.grad.abs().max().item() + 1e-3)
    print(f"mha.nn.Attention: worst relative gradient error {worst:.2g}")


# ---------------------------------------------------- mha_forward_lse
def forward_lse(layer, x, kv=None, **opts):
    """y and lse (B,h,T) of mha_forward_lse (no Python binding: ctypes)."""
    fn = _lib.lib["mha_forward_lse"]  # a function object of its own: lib.mha_forward_lse is shared
    fn.restype = ctypes.c_int
    fn.argtypes = [_lib.LayerP, _lib.F32P, ctypes.POINTER(_lib.Capture), _lib.F32P, _lib.F32P, _lib.F32P,
                   _lib.F32P, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.POINTER(_lib.Options)]
    c, xx, k_src, v_src, B, T, S = layer._inputs(x, kv)
    keep = [xx, k_src, v_src]
    o = layer._options(c, B, T, S, keep, **opts)
    y = np.empty((B, T, c["d_model"]), np.float32)
    z = np.empty((B, T, c["n_heads"] * c["d_v"]), np.float32)
    lse = np.empty((B, c["n_heads"], T), np.float32)
    cap = _lib.Capture(fptr(z), None, None)
    with layer._borrow() as ptr:
        st = fn(ptr, fptr(y), ctypes.byref(cap), fptr(lse), fptr(xx), fptr(k_src), fptr(v_src), B, T, S,
                ctypes.byref(o))
    check(st, "mha_forward_lse")
    return y, z, lse


def test_forward_lse_with_every_variant():
    """lse is the keys' log-sum-exp of the layer's scores (soft-cap,
    ALiBi, masks, positions); a sink logit is no key. Before this round a
    layer with sinks had exp(sink) inside lse in rows with a key (-inf in
    rows without), so two key blocks' parts merged counted it twice."""
    worst = 0.0
    for it in range(150):
        rng = np.random.default_rng(41_000 + it)
        cfg = rand_cfg(rng)
        if it % 3 == 0:
            cfg["sinks"] = True
        cross = bool(cfg["d_kv_in"]) or rng.random() < 0.15
        B, T = int(rng.integers(1, 3)), int(rng.integers(1, 9))
        S = int(rng.integers(1, 9)) if cross else T
        layer = mha.Layer(**cfg)
        w = rand_weights(rng, layer)
        layer.set_weights(w)
        x = rng.normal(0, 1, (B, T, cfg["d_model"])).astype(np.float32)
        kv = rng.normal(0, 1, (B, S, cfg["d_kv_in"] or cfg["d_model"])).astype(np.float32) if cross else None
        call = rand_call(rng, cfg, B, T, S, cross)
        call.pop("masked_row", None)
        y, _, lse = forward_lse(layer, x, kv, **call)
        want, want_lse = O.forward(cfg, {n: t64(a) for n, a in w.items()}, t64(x), None if kv is None else t64(kv),
                                   call=call, need_lse=True)
        want_lse = want_lse.numpy()
        assert np.array_equal(np.isinf(lse), np.isinf(want_lse)), it
        fin = np.isfinite(want_lse)
        if fin.any():
            worst = max(worst, float(np.abs(lse[fin] - want_lse[fin]).max()))
        assert worst <= 1e-5, (it, worst, cfg)
        assert rel_err(y, want.numpy()) <= 2e-5
    print(f"forward_lse: worst |lse - oracle| {worst:.2g}")


def test_forward_lse_merge_of_a_sinks_layer():
    """The merge mha.h gives for a layer with sinks: each key block's Z
    times 1 + exp(sink - lse_i), mha_attention_merge, then divided by
    1 + exp(sink - lse_m), is the whole forward's Z (GQA, soft-cap, ALiBi,
    RoPE, causal; one sequence whose first block is padded away)."""
    rng = np.random.default_rng(34_100)
    cfg = dict(d_model=16, n_heads=4, n_kv_heads=2, d_k=4, d_v=4, bias=True, sinks=True, softcap=5.0, alibi=True,
               rope=dict(pairing="halves"))
    layer = mha.Layer(**cfg)
    layer.set_weights(rand_weights(rng, layer))
    B, T, h = 2, 9, 4
    x = rng.normal(0, 1, (B, T, 16)).astype(np.float32)
    keep = np.ones((B, T), bool)
    keep[1, :4] = False
    _, z, lse = forward_lse(layer, x, causal=True, key_keep=keep)
    sinks = layer.weights()["sinks"].astype(np.float64)
    parts = []
    for lo, hi in ((0, 4), (4, T)):
        kk = keep.copy()
        kk[:, :lo] = False
        kk[:, hi:] = False
        _, zi, li = forward_lse(layer, x, causal=True, key_keep=kk)
        zi = zi.reshape(B, T, h, 4).astype(np.float64)
        own = np.where(np.isfinite(li), 1 + np.exp(sinks[None, :, None] - li), 1.0)  # (B,h,T)
        parts.append(((zi * own.transpose(0, 2, 1)[..., None]).reshape(B, T, h * 4), li.astype(np.float64)))
    lm = np.logaddexp(parts[0][1], parts[1][1])
    zm = sum(np.where(np.isfinite(li), np.exp(li - np.where(np.isfinite(lm), lm, 0)), 0.0).transpose(0, 2, 1)
             .repeat(4, axis=2) * zi for zi, li in parts)
    zm = zm / np.where(np.isfinite(lm), 1 + np.exp(sinks[None, :, None] - lm), 1.0).transpose(0, 2, 1).repeat(4, 2)
    assert np.abs(zm - z).max() <= 1e-5
    assert np.array_equal(np.isinf(lm), np.isinf(lse)) and np.isinf(lse).any()  # row 0 of batch 1: no key
    fin = np.isfinite(lse)
    assert np.abs(lm[fin] - lse[fin]).max() <= 1e-5


# --------------------------------------------------------------- refusals
@pytest.mark.parametrize("make, words", [
    (lambda: mha.Layer(16, 2, add_bias_kv=True, rope=dict(pairing="halves")), ["add_bias_kv", "rope", "expected"]),
    (lambda: mha.Layer(16, 2, rope=dict(pairing="halves", dim=3)), ["rope.dim=3", "expected an even number"]),
    (lambda: mha.Layer(16, 2, rope=dict(pairing="halves", dim=2, scaling="dynamic", factor=2.0,
                                        original_max_positions=8)), ["rope.dim=2", "dynamic", "expected >= 4"]),
    (lambda: mha.Layer(16, 2, temperature=(4, 0.0)), ["temperature_scale=0", "expected"]),
    (lambda: mha.Layer(16, 2, alibi=True).forward(np.ones((1, 3, 16), np.float32), causal=True, window_left=1,
                                                    sink_tokens=1, chunk_size=2), ["chunk_size=2", "sink_tokens=1"]),
    (lambda: mha.Layer(16, 2).forward(np.ones((1, 3, 16), np.float32), positions=np.zeros((1, 3), int)),
     ["positions", "neither rope, alibi nor a query temperature", "expected NULL"]),
    (lambda: mha.Layer(16, 2, alibi=True).forward(np.ones((1, 3, 16), np.float32), causal=True, sink_tokens=1),
     ["sink_tokens=1", "window_left=-1", "expected"]),
    (lambda: mha.Cache(mha.Layer(16, 2, alibi=True), 1, 8, window=6, sink_tokens=3),
     ["n_sink=3", "expected 0..capacity - window = 2"]),
    (lambda: mha.Cache(mha.Layer(16, 2, rope=dict(pairing="halves")), 1, 8, cross=True), ["RoPE", "expected"]),
    (lambda: mha.Cache(mha.Layer(16, 2, temperature=(2, 0.5)), 1, 8, cross=True), ["temperature", "expected"]),
    (lambda: mha.Cache(mha.Layer(16, 2, softcap=5.0), 1, 8, window=4, sink_tokens=2).forward(
        None, np.ones((1, 2, 16), np.float32), chunk_size=2), ["chunk_size=2", "sink tokens", "expected"]),
])
def test_refused_combinations_name_what_and_what_was_expected(make, words):
    with pytest.raises(mha.MhaError) as e:
        make()
    for word in words:
        assert word in str(e.value), (word, str(e.value))
