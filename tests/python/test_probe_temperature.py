"""Adversarial probe of the query temperature (temperature_floor F,
temperature_scale a, temperature_rule) against a float64 oracle written
here from Hugging Face's two definitions:

  Llama 4 (Llama4TextAttention, attn_temperature_tuning on NoPE layers):
      q *= log(floor((cache_position + 1) / floor_scale) + 1) * attn_scale + 1
  Ministral 3 (_get_llama_4_attn_scale, every layer):
      q *= 1 + llama_4_scaling_beta * log(1 + floor(cache_position / original_max))

applied after QK-norm and RoPE, on the queries only. The oracle evaluates
the factor exactly (integer floor division, then double log1p): at
positions near 2^30 Hugging Face's float32 cache_position would round.

Random cases mix GQA/MQA, RoPE (plain, linear, dynamic NTK, LongRoPE),
QK-norm, ALiBi, soft-cap, sinks, clip_qkv, windows, chunks, cross
attention with key positions and explicit positions (near 2^30, near
multiples of F, F = 1), on every kernel set of the CPU, through
mha.nn.Attention (forward and autograd: the tape) and the KV cache
(prefill and decode across floors, ragged batches, fp32/fp16/int8,
rings, truncate and continue). PROBE_CASES=n runs n random cases per
group (default a few, to keep the suite quick).
"""
import math
import os

import numpy as np
import pytest

from conftest import TORCH_SKIP_REASON, torch

if torch is None:
    pytest.skip(TORCH_SKIP_REASON, allow_module_level=True)

import mha  # noqa: E402
import mha.nn  # noqa: E402
from io_helpers import mha as mha_cli, write_safetensors  # noqa: E402
from test_nn_modern import make  # noqa: E402  (every parameter random, none hiding)

CASES = int(os.environ.get("PROBE_CASES", "3"))
MAXPOS = 1 << 30
WORST = {}


# ------------------------------------------------------------------ oracle

def factor(p, temp):
    """The temperature of a query at integer position(s) p (int64 array)."""
    p = np.asarray(p, dtype=np.int64)
    F, a = temp[0], temp[1]
    shift = 0 if temp[2:] == ("ministral3",) else 1
    return 1.0 + a * np.log1p((p + shift) // F)


def rope_freqs(rope, d, seq):
    """(inv_freq (dim/2,), attention factor) of a call of sequence length seq."""
    dim, theta = rope.get("dim") or d, rope.get("theta") or 10000.0
    sc = rope.get("scaling", "none")
    L = rope.get("original_max_positions", 0)
    att = 1.0
    if sc == "dynamic" and seq > L:  # Hugging Face's dynamic NTK
        f = rope["factor"]
        theta = theta * (f * seq / L - (f - 1)) ** (dim / (dim - 2))
    inv = 1.0 / theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
    if sc == "linear":
        inv = inv / rope["factor"]
    if sc == "longrope":
        ext = np.array(rope["long_factor"] if seq > L else rope["short_factor"], dtype=np.float64)
        inv = inv / ext
        f = rope.get("factor") or 1.0
        att = rope.get("attn_factor") or (1.0 if f <= 1 else math.sqrt(1 + math.log(f) / math.log(L)))
    return inv, att


def rotate(x, pos, rope, inv, att):
    # x (B,heads,n,d); pos (B,n) ints
    dim = inv.shape[0] * 2
    ang = pos.astype(np.float64)[:, None, :, None] * inv  # (B,1,n,dim/2)
    c, s = np.cos(ang) * att, np.sin(ang) * att
    out = x.copy()
    if rope["pairing"] == "interleaved":
        a, b = x[..., 0:dim:2], x[..., 1:dim:2]
        out[..., 0:dim:2], out[..., 1:dim:2] = a * c - b * s, b * c + a * s
    else:
        a, b = x[..., :dim // 2], x[..., dim // 2:dim]
        out[..., :dim // 2], out[..., dim // 2:dim] = a * c - b * s, b * c + a * s
    return out


def oracle(p, kw, x, kv=None, causal=False, window=None, positions=None, key_positions=None, chunk=0):
    """y (B,T,d_model), float64 numpy, from the module's parameters p
    (name -> float64 numpy) and its constructor arguments kw: the torch
    oracle below on float64 tensors without gradients."""
    tp = {n: torch.from_numpy(np.asarray(a, np.float64)) for n, a in p.items()}
    return torch_oracle(tp, kw, torch.from_numpy(np.asarray(x, np.float64)),
                        None if kv is None else torch.from_numpy(np.asarray(kv, np.float64)), causal=causal,
                        window=window, positions=positions, key_positions=key_positions, chunk=chunk).numpy()


def params(m):
    p = {n: t.detach().double().numpy() for n, t in m.state_dict().items()}
    return p


def close(got, want, what, rtol, floor=0.0):
    got = np.asarray(got, np.float64)
    peak = max(np.abs(want).max(), floor)
    if peak == 0:  # e.g. sinks that take every weight at huge ALiBi distances
        assert np.abs(got).max() <= 1e-6, f"{what}: the oracle's y is 0; mha's is {np.abs(got).max():.3g}"
        return
    rel = np.abs(got - want).max() / peak
    WORST[what] = max(WORST.get(what, 0.0), rel)
    assert rel <= rtol, f"{what}: max|mha - oracle| / max|oracle| = {rel:.3g} > {rtol}"


# ------------------------------------------------------------------ random configs

def random_case(rng):
    """(constructor kw, call kw, B, T, S or None) of one random case."""
    h_kv = int(rng.choice([1, 2, 4]))
    h = h_kv * int(rng.choice([1, 2]))
    d = int(rng.choice([4, 8, 16]))
    kw = dict(d_model=h * d, n_heads=h, n_kv_heads=h_kv, head_dim=d, bias=bool(rng.integers(2)))
    F = int(rng.choice([1, 2, 3, 5, 8192, 1 << 20, MAXPOS]))
    a = float(rng.choice([0.1, 0.5, 1.3, 7.0]))
    kw["temperature"] = (F, a, "ministral3") if rng.integers(2) else (F, a)
    if rng.random() < 0.7:
        rope = {"pairing": str(rng.choice(["halves", "interleaved"]))}
        sc = str(rng.choice(["none", "linear", "dynamic", "longrope"]))
        if sc == "linear":
            rope.update(scaling="linear", factor=2.0)
        elif sc == "dynamic":
            rope.update(scaling="dynamic", factor=2.0, original_max_positions=int(rng.choice([4, 64])))
        elif sc == "longrope":
            pairs = d // 2
            rope.update(scaling="longrope", original_max_positions=int(rng.choice([4, 64])), factor=4.0,
                        short_factor=[float(np.float32(v)) for v in 1 + rng.random(pairs)],  # mha_rope keeps floats
                        long_factor=[float(np.float32(v)) for v in 2 + 3 * rng.random(pairs)])
        kw["rope"] = rope
    if rng.random() < 0.4:
        kw.update(qk_norm="rms", qk_norm_eps=1e-6)
    if rng.random() < 0.3:
        kw["alibi"] = True
    if rng.random() < 0.3:
        kw["softcap"] = float(rng.choice([2.0, 30.0]))
    if rng.random() < 0.3:
        kw["sinks"] = True
    if rng.random() < 0.2:
        kw["clip_qkv"] = 0.8
    B, T = int(rng.integers(1, 3)), int(rng.integers(1, 12))
    call = {}
    cross = rng.random() < 0.25
    S = int(rng.integers(1, 10)) if cross else None
    mode = rng.integers(4)
    if mode == 1:  # positions near multiples of F (either side of a floor)
        base = F * rng.integers(1, max(2, min(MAXPOS // F, 50)), size=(B, T)) - 1
        call["positions"] = np.clip(base + rng.integers(-2, 3, size=(B, T)), 0, MAXPOS).astype(np.int32)
    elif mode == 2:  # near 2^30
        call["positions"] = (MAXPOS - rng.integers(0, 40, size=(B, T))).astype(np.int32)
    elif mode == 3:  # consecutive, crossing floors
        start = int(rng.integers(0, MAXPOS - T))
        if F < 100:
            start = int(rng.integers(0, 4 * F + 1))
        call["positions"] = (start + np.arange(T)[None].repeat(B, 0)).astype(np.int32)
    if cross:
        if rng.random() < 0.7:
            call["key_positions"] = rng.integers(0, MAXPOS + 1, size=(B, S)).astype(np.int32) \
                if mode == 2 else rng.integers(0, 200, size=(B, S)).astype(np.int32)
    else:
        if rng.random() < 0.5:
            call["causal"] = True
        w = rng.random()
        if w < 0.2:
            call["window"] = int(rng.integers(1, 5))
        elif w < 0.3 and call.get("causal"):
            call["chunk_size"] = int(rng.integers(1, 5))
    return kw, call, B, T, S


def run_case(seed, grad=False):
    rng = np.random.default_rng(seed)
    kw, call, B, T, S = random_case(rng)
    m = make(seed, **kw)
    x = torch.rand(B, T, kw["d_model"], generator=torch.Generator().manual_seed(seed), dtype=torch.float32) * 2 - 1
    kv = None if S is None else torch.rand(B, S, kw["d_model"], generator=torch.Generator().manual_seed(seed + 1)) * 2 - 1
    tkw = {k: (torch.from_numpy(v) if isinstance(v, np.ndarray) else v) for k, v in call.items()}
    xg = x.clone().requires_grad_(grad)
    y = m(xg, kv, **tkw)
    p = params(m)
    ocall = dict(call)
    chunk = ocall.pop("chunk_size", 0)
    want = oracle(p, kw, x.double().numpy(), None if kv is None else kv.double().numpy(), chunk=chunk, **ocall)
    # near 2^30 the rotation's angles are large: cos/sin of p f in float lose ~p eps relative
    big = "positions" in call and call["positions"].max() > 1 << 20 and kw.get("rope")
    # ALiBi at distances of 1e4 and more: fp32 scores of |s| ~ 1e4..1e5 keep ~1e-3 absolute (the fast path)
    big = big or (kw.get("alibi") and ("positions" in call or "key_positions" in call) and np.abs(
        np.asarray(call.get("positions", np.arange(T)), np.int64).max() - np.asarray(
            call.get("key_positions", np.arange(S or T)), np.int64).min()) > 10000)
    close(y.detach().numpy(), want, "forward", 2e-3 if big else 2e-5)
    # the temperature matters: without it the oracle differs (unless every factor is 1)
    plain = oracle(p, dict(kw, temperature=None), x.double().numpy(), None if kv is None else kv.double().numpy(),
                   chunk=chunk, **ocall)
    pos = call.get("positions", np.broadcast_to(np.arange(T), (B, T)))
    effect = np.abs(want - plain).max() / max(np.abs(want).max(), 1e-30)  # what the temperature changed
    if np.all(factor(pos, kw["temperature"]) == 1.0):
        close(y.detach().numpy(), plain, "forward, factors 1", 2e-3 if big else 2e-5)
    if grad:
        g = torch.rand(y.shape, generator=torch.Generator().manual_seed(seed + 2), dtype=torch.float32) - 0.5
        (y * g).sum().backward()
        tp = {n: torch.tensor(a, requires_grad=True) for n, a in p.items()}
        xt = x.double().requires_grad_(True)
        yt = torch_oracle(tp, kw, xt, None if kv is None else kv.double(), chunk=chunk, **ocall)
        (yt * g.double()).sum().backward()
        close(xg.grad.numpy(), xt.grad.numpy(), "grad x", 2e-3 if big else 5e-5)
        # k's bias cancels in the softmax without RoPE/ALiBi: its true gradient is ~0; measure
        # every parameter against the largest gradient of all
        floor = max(np.abs(tp[n].grad.numpy()).max() for n in tp if tp[n].grad is not None)
        for n, t in m.named_parameters():
            close(t.grad.numpy(), tp[n].grad.numpy(), "grad " + n, 2e-3 if big else 5e-5, floor)
    return effect


def torch_oracle(p, kw, x, kv=None, causal=False, window=None, positions=None, key_positions=None, chunk=0):
    """The oracle again in torch float64, for autograd (same steps)."""
    h, h_kv = kw["n_heads"], kw.get("n_kv_heads") or kw["n_heads"]
    d = kw.get("head_dim") or kw["d_model"] // h
    B, T = x.shape[:2]
    src = x if kv is None else kv
    S = src.shape[1]

    def lin(n, a):
        b = p.get(n + ".bias")
        return a @ p[n + ".weight"].T + (0 if b is None else b)
    q, k, v = lin("q_proj", x), lin("k_proj", src), lin("v_proj", src)
    if kw.get("clip_qkv"):
        c = kw["clip_qkv"]
        q, k, v = q.clamp(-c, c), k.clamp(-c, c), v.clamp(-c, c)
    q = q.view(B, T, h, d).transpose(1, 2)
    k = k.view(B, S, h_kv, d).transpose(1, 2)
    v = v.view(B, S, h_kv, d).transpose(1, 2)
    if kw.get("qk_norm") == "rms":
        eps = kw.get("qk_norm_eps", 1e-6)
        q = q * torch.rsqrt(q.pow(2).mean(-1, keepdim=True) + eps) * p["q_norm.weight"]
        k = k * torch.rsqrt(k.pow(2).mean(-1, keepdim=True) + eps) * p["k_norm.weight"]
    pq = np.broadcast_to(np.arange(T), (B, T)) if positions is None else np.asarray(positions, np.int64)
    if key_positions is not None:
        pk = np.asarray(key_positions, np.int64)
    else:
        pk = pq if kv is None else np.broadcast_to(np.arange(S), (B, S))

    def trot(t, pos, inv, att):
        dim = inv.shape[0] * 2
        ang = torch.from_numpy(pos.astype(np.float64)[:, None, :, None] * inv)
        c, s = torch.cos(ang) * att, torch.sin(ang) * att
        if kw["rope"]["pairing"] == "interleaved":
            a, b = t[..., 0:dim:2], t[..., 1:dim:2]
            r = torch.stack((a * c - b * s, b * c + a * s), -1).flatten(-2)
        else:
            a, b = t[..., :dim // 2], t[..., dim // 2:dim]
            r = torch.cat((a * c - b * s, b * c + a * s), -1)
        return torch.cat((r, t[..., dim:]), -1)
    if kw.get("rope"):
        seq = int(max(pq.max(), pk.max())) + 1
        inv, att = rope_freqs(kw["rope"], d, seq)
        q, k = trot(q, pq, inv, att), trot(k, pk, inv, att)
    if kw.get("temperature"):
        q = q * torch.from_numpy(factor(pq, kw["temperature"]))[:, None, :, None]
    g = h // h_kv
    k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    s = q @ k.transpose(-1, -2) / math.sqrt(d)
    if kw.get("softcap"):
        s = kw["softcap"] * torch.tanh(s / kw["softcap"])
    if kw.get("alibi"):
        dist = torch.from_numpy(np.abs(pq[:, None, :, None] - pk[:, None, None, :]).astype(np.float64))
        s = s - p["alibi_slopes"][None, :, None, None] * dist
    i, j = torch.arange(T)[:, None], torch.arange(S)[None, :]
    ok = torch.ones(T, S, dtype=torch.bool)
    if causal:
        ok &= j <= i
    if window:
        ok &= j > i - window
    if chunk:
        ok &= (i // chunk) == (j // chunk)
    s = s.masked_fill(~ok, float("-inf"))
    if kw.get("sinks"):
        s = torch.cat((s, p["sinks"][None, :, None, None].expand(B, h, T, 1)), -1)
        prob = torch.softmax(s, -1)[..., :-1]
    else:
        prob = torch.softmax(s, -1)
    z = (prob @ v).transpose(1, 2).reshape(B, T, h * d)
    return lin("o_proj", z)


# ------------------------------------------------------------------ tests

def test_factor_definitions():
    """The oracle's factors at hand-checked points (F 4, a 0.1)."""
    p = np.array([0, 2, 3, 4, 6, 7, 8])
    np.testing.assert_allclose(factor(p, (4, 0.1)), 1 + 0.1 * np.log([1, 1, 2, 2, 2, 3, 3]))
    np.testing.assert_allclose(factor(p, (4, 0.1, "ministral3")), 1 + 0.1 * np.log([1, 1, 1, 2, 2, 2, 3]))
    assert factor(MAXPOS, (1, 1.0)) == 1 + math.log(MAXPOS + 2)


def test_forward_random(kernels):
    effects = [run_case(1000 + c) for c in range(CASES * 4)]
    assert sum(e > 1e-2 for e in effects) >= len(effects) // 3, effects  # the cases do exercise the factors


def test_gradients_random(kernels):
    for c in range(CASES * 2):
        run_case(5000 + c, grad=True)


def test_library_layer_paths_agree():
    """Layer.forward on the reference and the fast path, F 1 and huge
    scale (factors up to ~1e3 on the keys' scores)."""
    rng = np.random.default_rng(3)
    for temp in ((1, 100.0), (1, 100.0, "ministral3"), (2, 1e-3)):
        kw = dict(d_model=16, n_heads=4, n_kv_heads=2, head_dim=4, bias=True, temperature=temp,
                  rope={"pairing": "halves"})
        m = make(9, **kw)
        layer = m.to_layer()
        x = rng.uniform(-1, 1, (2, 9, 16)).astype(np.float32)
        want = oracle(params(m), kw, x.astype(np.float64), causal=True)
        for path in ("reference", "fast"):
            close(layer.forward(x, causal=True, path=path), want, "layer " + path, 2e-4)


# ------------------------------------------------------------------ cache

CACHE_TOL = {"float32": 2e-5, "float16": 3e-3, "int8": 3e-2}


@pytest.mark.parametrize("dtype", ["float32", "float16", "int8"])
def test_cache_prefill_decode_across_floors(kernels, dtype):
    """Prefill, then decode one token at a time across several floors; a
    ragged batch (sequence 1 one token behind); the ring's window."""
    rng = np.random.default_rng(11)
    for c in range(CASES):
        F = int(rng.choice([1, 2, 3]))
        temp = (F, 0.7, "ministral3") if c % 2 else (F, 0.7)
        kw = dict(d_model=16, n_heads=4, n_kv_heads=int(rng.choice([1, 2, 4])), head_dim=4, bias=True,
                  temperature=temp)
        if c % 3 != 2:
            kw["rope"] = {"pairing": "interleaved" if c % 2 else "halves"}
        if c % 3 == 1:
            kw.update(qk_norm="rms", qk_norm_eps=1e-6)
        m = make(20 + c, **kw)
        layer = m.to_layer()
        W = 3 if c % 2 else 0
        N = 10
        x = rng.uniform(-1, 1, (2, N, 16)).astype(np.float32)
        want0 = oracle(params(m), kw, x[:1].astype(np.float64), causal=True, window=W or None)[0]
        want1 = oracle(params(m), kw, x[1:, :N - 1].astype(np.float64), causal=True, window=W or None)[0]
        cache = mha.Cache(layer, batch=2, capacity=N if not W else W, dtype=dtype, window=W)
        pre = 4
        y = cache.forward(layer, x[:, :pre], n_new=[pre, pre - 1])
        close(y[0], want0[:pre], "cache prefill " + dtype, CACHE_TOL[dtype])
        close(y[1, :pre - 1], want1[:pre - 1], "cache prefill " + dtype, CACHE_TOL[dtype])
        got0, got1 = [], []
        for t in range(pre, N):  # sequence 1 decodes row t-1, a step behind
            step = np.stack([x[0, t:t + 1], x[1, t - 1:t]])
            y = cache.forward(layer, step)
            got0.append(y[0, 0]), got1.append(y[1, 0])
        close(np.array(got0), want0[pre:], "cache decode " + dtype, CACHE_TOL[dtype])
        close(np.array(got1), want1[pre - 1:], "cache decode " + dtype, CACHE_TOL[dtype])


def test_cache_positions_given_and_truncate():
    """Positions given per call set each new token's factor (as
    options.positions does); truncate then continue re-uses positions."""
    kw = dict(d_model=16, n_heads=4, n_kv_heads=2, head_dim=4, bias=True, temperature=(4, 0.9),
              rope={"pairing": "halves"}, alibi=True)
    m = make(31, **kw)
    layer = m.to_layer()
    rng = np.random.default_rng(5)
    x = rng.uniform(-1, 1, (1, 9, 16)).astype(np.float32)
    pos = np.array([[0, 3, 4, 7, 8, 100, MAXPOS - 8, MAXPOS - 1, MAXPOS]], np.int32)
    want = oracle(params(m), kw, x.astype(np.float64), causal=True, positions=pos)
    cache = mha.Cache(layer, batch=1, capacity=16)
    y1 = cache.forward(layer, x[:, :5], positions=pos[:, :5])
    y2 = cache.forward(layer, x[:, 5:], positions=pos[:, 5:])
    close(np.concatenate([y1, y2], 1), want, "cache positions", 2e-3)
    # truncate to 3 then continue at cache positions 3.. (new tokens)
    cache2 = mha.Cache(layer, batch=1, capacity=16)
    z = rng.uniform(-1, 1, (1, 6, 16)).astype(np.float32)
    cache2.forward(layer, x[:, :7])
    cache2.truncate(0, 3)
    y = cache2.forward(layer, z)
    full = np.concatenate([x[:, :3], z], 1)
    want = oracle(params(m), kw, full.astype(np.float64), causal=True)[:, 3:]
    close(y, want, "cache truncate", 2e-5)


# ------------------------------------------------------------------ files and CLI

def test_native_round_trip_and_cli(tmp_path):
    """Layer.save keeps F, a and the rule; mha run of the file gives the
    oracle's y; --attn-temperature on the command line wins over the
    file's; positions near floors and 2^30."""
    for temp in ((3, 0.4), (3, 0.4, "ministral3"), (1, 2.5)):
        kw = dict(d_model=16, n_heads=4, n_kv_heads=2, head_dim=4, bias=True, temperature=temp)
        m = make(41, **kw)
        layer = m.to_layer()
        path = tmp_path / "n.safetensors"
        layer.save(str(path))
        back = mha.Layer.load(str(path))
        c = back.config
        assert (c["temperature_floor"], c["temperature_rule"]) == (temp[0], temp[2] if temp[2:] else "llama4")
        assert c["temperature_scale"] == pytest.approx(temp[1], rel=1e-7)
        x = np.random.default_rng(4).uniform(-1, 1, (11, 16)).astype(np.float32)
        np.save(tmp_path / "x.npy", x)
        pos = np.array([0, 1, 2, 3, 5, 6, 8, 9, MAXPOS - 2, MAXPOS - 1, MAXPOS], np.int32)
        np.save(tmp_path / "p.npy", pos)
        out = tmp_path / "y.npy"
        mha_cli("run", "--weights", path, "--input", tmp_path / "x.npy", "--output", out, "--causal",
                "--positions", tmp_path / "p.npy")
        want = oracle(params(m), kw, x[None].astype(np.float64), causal=True, positions=pos[None])[0]
        close(np.load(out), want, "native cli", 2e-5)
        mha_cli("run", "--weights", path, "--input", tmp_path / "x.npy", "--output", out, "--causal",
                "--attn-temperature", "2,0.3,ministral3")
        want = oracle(params(m), dict(kw, temperature=(2, 0.3, "ministral3")), x[None].astype(np.float64),
                      causal=True)[0]
        close(np.load(out), want, "native cli flag", 2e-5)


@pytest.mark.parametrize("temp", [(MAXPOS + 1, 0.5), (2 ** 31 - 1, 0.5, "ministral3"), (1, 3.3e38),
                                  (7, float(np.finfo(np.float32).max))])
def test_save_load_the_configs_extremes(tmp_path, temp):
    """What the config takes, a file keeps: before, Layer.save wrote a
    floor above 2^30 or a scale of 3e38 and more that mha_layer_load then
    refused as malformed (temperature_floor in 1..2^30, scale < 3e38)."""
    layer = make(5, d_model=8, n_heads=2, bias=True, temperature=temp).to_layer()
    path = tmp_path / "n.safetensors"
    layer.save(str(path))
    back = mha.Layer.load(str(path)).config
    want = layer.config
    for k in ("temperature_floor", "temperature_scale", "temperature_rule"):
        assert back[k] == want[k], (k, back[k], want[k])
    x = np.random.default_rng(2).uniform(-1, 1, (1, 5, 8)).astype(np.float32)
    pos = np.array([[0, 1, MAXPOS - 1, MAXPOS - 1, MAXPOS]], np.int32)
    np.testing.assert_array_equal(mha.Layer.load(str(path)).forward(x, causal=True, positions=pos),
                                  layer.forward(x, causal=True, positions=pos))
    bad = tmp_path / "bad.safetensors"
    _edit_metadata(path, bad, (), temperature_floor=str(2 ** 31))  # beyond any int: still refused
    with pytest.raises(mha.FormatError, match="temperature_floor = '2147483648'"):
        mha.Layer.load(str(bad))


def _ministral_checkpoint(tmp_path, cfg_extra, nested=False):
    D, H, G, d = 16, 4, 2, 4
    rng = np.random.default_rng(8)
    w = {"q": rng.uniform(-.5, .5, (H * d, D)), "k": rng.uniform(-.5, .5, (G * d, D)),
         "v": rng.uniform(-.5, .5, (G * d, D)), "o": rng.uniform(-.5, .5, (D, H * d))}
    w = {n: a.astype(np.float32) for n, a in w.items()}
    pre = "model.language_model.layers.0.self_attn." if nested else "model.layers.0.self_attn."
    write_safetensors(tmp_path / "model.safetensors", {pre + n + "_proj.weight": a for n, a in w.items()})
    text = {"model_type": "ministral3", "hidden_size": D, "num_attention_heads": H, "num_key_value_heads": G,
            "head_dim": d, **cfg_extra}
    cfg = {"model_type": "mistral3", "text_config": text} if nested else text
    import json
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    p = {"q_proj.weight": w["q"], "k_proj.weight": w["k"], "v_proj.weight": w["v"], "o_proj.weight": w["o"]}
    p = {n: a.astype(np.float64) for n, a in p.items()}
    kw = dict(d_model=D, n_heads=H, n_kv_heads=G, head_dim=d)
    return pre.rsplit(".self_attn.", 1)[0], p, kw


@pytest.mark.parametrize("where", ["v5", "v4", "v5 nested"])
def test_ministral3_config(tmp_path, where):
    rope = {"rope_type": "default", "rope_theta": 1e6, "llama_4_scaling_beta": 0.6,
            "original_max_position_embeddings": 3}
    if where.startswith("v5"):
        extra = {"rope_parameters": rope}
    else:
        extra = {"rope_theta": 1e6, "rope_scaling": {k: v for k, v in rope.items() if k != "rope_theta"}}
    prefix, p, kw = _ministral_checkpoint(tmp_path, extra, nested="nested" in where)
    x = np.random.default_rng(2).uniform(-1, 1, (10, 16)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    out = tmp_path / "y.npy"
    r = mha_cli("run", "--weights", tmp_path / "model.safetensors", "--prefix", prefix, "--input",
                tmp_path / "x.npy", "--output", out, "--causal", check=False)
    assert r.returncode == 0, r.stderr
    kw = dict(kw, rope={"pairing": "halves", "theta": 1e6}, temperature=(3, 0.6, "ministral3"))
    want = oracle(p, kw, x[None].astype(np.float64), causal=True)[0]
    close(np.load(out), want, "ministral3 config", 2e-5)
    # mha convert keeps it in the native file
    native = tmp_path / "native.safetensors"
    mha_cli("convert", "--from", "hf", "--prefix", prefix, "--to", "native", tmp_path / "model.safetensors", native)
    c = mha.Layer.load(str(native)).config
    assert (c["temperature_floor"], c["temperature_rule"]) == (3, "ministral3")


# ------------------------------------------------------------------ hostile

@pytest.mark.parametrize("temp, match", [
    ((0, 0.1), "temperature"), ((4, 0.0), "temperature"), ((4, -1.0), "temperature"),
    ((4, float("nan")), "temperature"), ((4, float("inf")), "temperature"), ((-3, 0.1), "temperature"),
    ((4.5, 0.1), "floor_scale"), ((4.0, 0.1), "floor_scale"), ((True, 0.1), "floor_scale"),
    ((4, 0.1, "qwen"), "rule"), ((4, 0.1, 2), "rule"), ((4, 0.1, True), "rule"), ((4,), "expected"), ((4, 0.1, "llama4", 1), "expected"),
    ("4,0.1", "expected"), (4, "expected"), ((1 << 31, 0.1), "floor_scale"), ((4, 1e-60), "rounds to 0"),
    ((4, 1e39), "float32"), ((4, "0.1"), "attn_scale"),
    # before: a dict raised KeyError: 0 and a set TypeError (not subscriptable), from inside the binding
    ({"floor": 4, "scale": 0.1}, "expected None, \\(floor_scale, attn_scale\\)"),
    ({4, 0.1}, "expected None, \\(floor_scale, attn_scale\\)"), ({0: 4, 1: 0.1}, "expected None"),
])
def test_bad_python_temperature(temp, match):
    with pytest.raises((mha.ArgumentError, mha.MhaError), match=match):
        mha.Layer(8, 2, temperature=temp)
    with pytest.raises((mha.ArgumentError, mha.MhaError, ValueError), match=match):
        mha.nn.Attention(8, 2, temperature=temp)


def _edit_metadata(src, dst, drop=(), **meta):
    import json
    import struct
    raw = open(src, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    for k in drop:
        header["__metadata__"].pop(k, None)
    header["__metadata__"].update(meta)
    hb = json.dumps(header).encode()
    hb += b" " * (-len(hb) % 8)
    open(dst, "wb").write(struct.pack("<Q", len(hb)) + hb + raw[8 + n:])


@pytest.mark.parametrize("drop, meta", [
    (("temperature_scale",), {}), (("temperature_floor",), {}),
    (("temperature_floor", "temperature_scale"), {"temperature_rule": "ministral3"}),
    ((), {"temperature_floor": "4.5"}), ((), {"temperature_floor": "-4"}), ((), {"temperature_floor": "1e12"}),
    ((), {"temperature_floor": "0"}), ((), {"temperature_scale": "nan"}), ((), {"temperature_scale": "0"}),
    ((), {"temperature_scale": "-0.1"}), ((), {"temperature_scale": "1e-60"}), ((), {"temperature_scale": "inf"}),
    ((), {"temperature_scale": "1e39"}), ((), {"temperature_rule": "llama5"}), ((), {"temperature_floor": "4x"}),
    ((), {"temperature_scale": ""}), ((), {"temperature_floor": "2147483648"}),
])
def test_bad_metadata_refused(tmp_path, drop, meta):
    layer = make(3, d_model=8, n_heads=2, bias=True, temperature=(4, 0.3, "ministral3")).to_layer()
    path, bad = tmp_path / "n.safetensors", tmp_path / "bad.safetensors"
    layer.save(str(path))
    _edit_metadata(path, bad, drop, **meta)
    with pytest.raises(mha.MhaError) as e:
        mha.Layer.load(str(bad))
    assert "temperature" in str(e.value) and "\n" not in str(e.value).strip(), str(e.value)
    np.save(tmp_path / "x.npy", np.zeros((3, 8), np.float32))
    r = mha_cli("run", "--weights", bad, "--input", tmp_path / "x.npy", "--output", tmp_path / "y.npy", check=False)
    assert r.returncode != 0 and r.returncode < 128 and "temperature" in r.stderr, (r.returncode, r.stderr)
    assert not (tmp_path / "y.npy").exists()


@pytest.mark.parametrize("spec", ["0,1", "-1,0.1", "2147483648,0.1", "1073741825,0.1", "4,1e39", "4,inf", "4,-inf",
                                  "4,0.1 ", "4,,0.1", "4,0.1,LLAMA4", "4,0x1p-3junk", "", "nan,0.1", "4.0001,1",
                                  "4,0.1,ministral3,", "4,1e-50"])
def test_bad_flag_refused(tmp_path, spec):
    layer = make(3, d_model=8, n_heads=2, bias=True).to_layer()
    path = tmp_path / "n.safetensors"
    layer.save(str(path))
    np.save(tmp_path / "x.npy", np.zeros((3, 8), np.float32))
    r = mha_cli("run", "--weights", path, "--input", tmp_path / "x.npy", "--output", tmp_path / "y.npy",
                "--attn-temperature", spec, check=False)
    assert r.returncode == 2 and "--attn-temperature" in r.stderr, (spec, r.returncode, r.stderr)
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not (tmp_path / "y.npy").exists()


def test_flag_numbers_as_strtod_reads_them(tmp_path):
    """1e3 and 0x10 are whole floors (1000, 16): the same y as written out."""
    layer = make(3, d_model=8, n_heads=2, bias=True).to_layer()
    path = tmp_path / "n.safetensors"
    layer.save(str(path))
    np.save(tmp_path / "x.npy", np.random.default_rng(1).uniform(-1, 1, (40, 8)).astype(np.float32))
    ys = []
    for spec in ("1e1,0.5", "10,0.5", "0xa,0.5", "10,5e-1,llama4"):
        out = tmp_path / "y.npy"
        mha_cli("run", "--weights", path, "--input", tmp_path / "x.npy", "--output", out, "--causal",
                "--attn-temperature", spec)
        ys.append(np.load(out))
    for y in ys[1:]:
        np.testing.assert_array_equal(y, ys[0])


def test_huge_scale(kernels):
    """a up to float's largest: factors beyond float32 (ln 4 * 3e38). The
    reference (AUTO's fallback) keeps them in double and matches the
    oracle; the fast path and the cache refuse, never return inf or NaN;
    the gradient stays finite and matches autograd."""
    for temp in ((1, 1e20), (1, 3e38, "ministral3"), (2, 3e38)):
        kw = dict(d_model=8, n_heads=2, bias=True, temperature=temp)
        m = make(1, **kw)
        layer = m.to_layer()
        x = np.random.default_rng(0).uniform(-1, 1, (1, 9, 8)).astype(np.float32)
        want = oracle(params(m), kw, x.astype(np.float64), causal=True)
        close(layer.forward(x, causal=True), want, "huge scale", 2e-6)
        with pytest.raises(mha.NonFiniteError, match="beyond"):
            layer.forward(x, causal=True, path="fast")
        cache = mha.Cache(layer, batch=1, capacity=16)
        with pytest.raises(mha.NonFiniteError, match="beyond"):
            cache.forward(layer, x[0])
        assert cache.length(0) == 0
        xt = torch.from_numpy(x).requires_grad_(True)
        m(xt, causal=True).sum().backward()
        tp = {n: torch.tensor(a, requires_grad=True) for n, a in params(m).items()}
        xo = torch.from_numpy(x).double().requires_grad_(True)
        torch_oracle(tp, kw, xo, causal=True).sum().backward()
        close(xt.grad.numpy(), xo.grad.numpy(), "huge scale grad x", 1e-4)


def test_cache_random_variants(kernels):
    """Random layers (GQA/MQA, RoPE plain or linear, QK-norm, ALiBi,
    soft-cap, sinks, clip_qkv) through a cache: a prefill of random
    length, then decode steps of 1-3 tokens, against one full call."""
    rng = np.random.default_rng(77)
    for c in range(CASES * 2):
        kw, _, _, _, _ = random_case(rng)
        if kw.get("rope", {}).get("scaling") in ("dynamic", "longrope"):
            kw["rope"] = {"pairing": kw["rope"]["pairing"]}  # per-call rotations: test_rope_scaling's business
        F = int(rng.choice([1, 2, 3, 5]))
        kw["temperature"] = (F,) + kw["temperature"][1:]
        m = make(300 + c, **kw)
        layer = m.to_layer()
        N = int(rng.integers(4, 16))
        x = rng.uniform(-1, 1, (1, N, kw["d_model"])).astype(np.float32)
        want = oracle(params(m), kw, x.astype(np.float64), causal=True)[0]
        cache = mha.Cache(layer, batch=1, capacity=N)
        got, t = [], 0
        while t < N:
            n = int(rng.integers(1, 4)) if t else int(rng.integers(1, N))
            n = min(n, N - t)
            got.append(cache.forward(layer, x[0, t:t + n]))
            t += n
        close(np.concatenate(got), want, "cache random", 3e-5)


@pytest.mark.parametrize("text, message", [
    ({"floor_scale": 0}, "floor_scale"), ({"floor_scale": 4.5}, "floor_scale"), ({"floor_scale": -4}, "floor_scale"),
    ({"floor_scale": "4"}, "floor_scale"), ({"attn_scale": 0}, "attn_scale"), ({"attn_scale": -0.1}, "attn_scale"),
    ({"attn_scale": "0.1"}, "attn_scale"), ({"floor_scale": 1e12}, "floor_scale"),
    # before: a string (even "true") turned the temperature off silently; Python's truth of "false" is true
    ({"attn_temperature_tuning": "true", "floor_scale": 2}, "attn_temperature_tuning is not a boolean"),
    ({"attn_temperature_tuning": "false", "floor_scale": 2}, "attn_temperature_tuning is not a boolean"),
    ({"attn_temperature_tuning": [1], "floor_scale": 2}, "attn_temperature_tuning is not a boolean"),
])
def test_llama4_config_values_refused(tmp_path, text, message):
    """A NoPE layer's temperature keys out of range or of the wrong type:
    refused by name, no output."""
    import json
    D, H = 16, 4
    rng = np.random.default_rng(1)
    pre = "model.layers.3.self_attn."
    write_safetensors(tmp_path / "model.safetensors", {pre + n + "_proj.weight": rng.uniform(-.4, .4, (D, D)).astype(
        np.float32) for n in "qkvo"})
    cfg = {"model_type": "llama4_text", "hidden_size": D, "num_attention_heads": H, "num_key_value_heads": H,
           "head_dim": 4, "num_hidden_layers": 4, **text}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    np.save(tmp_path / "x.npy", np.zeros((3, D), np.float32))
    r = mha_cli("run", "--weights", tmp_path / "model.safetensors", "--prefix", "model.layers.3", "--input",
                tmp_path / "x.npy", "--output", tmp_path / "y.npy", "--causal", check=False)
    assert r.returncode != 0 and message in r.stderr, (r.returncode, r.stderr)
    assert not (tmp_path / "y.npy").exists()


@pytest.mark.parametrize("rope, message", [
    ({"llama_4_scaling_beta": -0.1, "original_max_position_embeddings": 4}, "llama_4_scaling_beta"),
    ({"llama_4_scaling_beta": "0.1", "original_max_position_embeddings": 4}, "llama_4_scaling_beta"),
    ({"llama_4_scaling_beta": 0.1, "original_max_position_embeddings": 4.5}, "original_max_position_embeddings"),
    ({"llama_4_scaling_beta": 0.1, "original_max_position_embeddings": 0}, "original_max_position_embeddings"),
    ({"llama_4_scaling_beta": 0.1}, "original_max_position_embeddings is missing"),
])
def test_ministral3_config_values_refused(tmp_path, rope, message):
    prefix, _, _ = _ministral_checkpoint(tmp_path, {"rope_parameters": dict(rope, rope_type="default",
                                                                            rope_theta=1e6)})
    np.save(tmp_path / "x.npy", np.zeros((3, 16), np.float32))
    r = mha_cli("run", "--weights", tmp_path / "model.safetensors", "--prefix", prefix, "--input",
                tmp_path / "x.npy", "--output", tmp_path / "y.npy", "--causal", check=False)
    assert r.returncode != 0 and message in r.stderr, (r.returncode, r.stderr)
    assert not (tmp_path / "y.npy").exists()


def yarn_inv_freq(dim, theta, factor, orig, beta_fast=32.0, beta_slow=1.0):
    """Hugging Face's _compute_yarn_parameters' frequencies (truncate true)."""
    def corr(n):
        return dim * math.log(orig / (n * 2 * math.pi)) / (2 * math.log(theta))
    lo, hi = max(math.floor(corr(beta_fast)), 0), min(math.ceil(corr(beta_slow)), dim - 1)
    if lo == hi:
        hi += 0.001
    ramp = np.clip((np.arange(dim // 2) - lo) / (hi - lo), 0, 1)
    extra = 1 - ramp  # the share of the unscaled frequency
    pos = theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
    return (1 / (factor * pos)) * (1 - extra) + (1 / pos) * extra


def test_ministral3_realistic_yarn_config(tmp_path):
    """Ministral 3's own rope_parameters (yarn, mscale = mscale_all_dim = 1:
    attention factor 1, llama_4_scaling_beta), nested in mistral3's
    text_config, small lengths so that both the YaRN ramp and the
    temperature act within T 12."""
    rope = {"rope_type": "yarn", "type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4,
            "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0, "rope_theta": 1e6,
            "llama_4_scaling_beta": 0.5}
    prefix, p, kw = _ministral_checkpoint(tmp_path, {"rope_parameters": rope, "max_position_embeddings": 16},
                                          nested=True)
    x = np.random.default_rng(6).uniform(-1, 1, (12, 16)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    out = tmp_path / "y.npy"
    mha_cli("run", "--weights", tmp_path / "model.safetensors", "--prefix", prefix, "--input", tmp_path / "x.npy",
            "--output", out, "--causal")
    d, h, g, T = 4, 4, 2, 12
    xs = x.astype(np.float64)
    q = (xs @ p["q_proj.weight"].T).reshape(T, h, d).transpose(1, 0, 2)[None]
    k = (xs @ p["k_proj.weight"].T).reshape(T, g, d).transpose(1, 0, 2)[None]
    v = (xs @ p["v_proj.weight"].T).reshape(T, g, d).transpose(1, 0, 2)[None]
    inv = yarn_inv_freq(d, 1e6, 4.0, 4)
    pos = np.arange(T)[None]
    q, k = rotate(q, pos, {"pairing": "halves"}, inv, 1.0), rotate(k, pos, {"pairing": "halves"}, inv, 1.0)
    q = q * factor(pos, (4, 0.5, "ministral3"))[:, None, :, None]
    k, v = np.repeat(k, 2, axis=1), np.repeat(v, 2, axis=1)
    s = q @ k.transpose(0, 1, 3, 2) / math.sqrt(d)
    s = np.where(np.tril(np.ones((T, T), bool)), s, -np.inf)
    e = np.exp(s - s.max(-1, keepdims=True))
    z = (e / e.sum(-1, keepdims=True)) @ v
    want = z[0].transpose(1, 0, 2).reshape(T, h * d) @ p["o_proj.weight"].T
    close(np.load(out), want, "ministral3 yarn", 2e-5)


@pytest.mark.parametrize("nested", [False, True])
def test_llama4_transformers5_placement(tmp_path, nested):
    """Llama 4 as transformers 5 writes it (rope_parameters with llama3
    scaling instead of rope_theta / rope_scaling): the NoPE layer (3 of
    interval 4) drops the rotation, attends globally and scales its
    queries by floor_scale 3 / attn_scale 0.7; --attn-temperature wins."""
    from test_llama4 import checkpoint
    v5 = {"rope_parameters": {"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0, "low_freq_factor": 1.0,
                              "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
          "floor_scale": 3, "attn_scale": 0.7, "attention_chunk_size": 4}
    w, x, prefix = checkpoint(tmp_path, 3, nested, **v5)
    cfg = (tmp_path / "config.json").read_text()
    assert "rope_parameters" in cfg
    p = {n + "_proj.weight": a.astype(np.float64) for n, a in w.items()}
    kw = dict(d_model=32, n_heads=4, n_kv_heads=2, head_dim=8, temperature=(3, 0.7))
    out = tmp_path / "y.npy"
    for flags, temp in (((), (3, 0.7)), (("--attn-temperature", "2,0.4,ministral3"), (2, 0.4, "ministral3"))):
        mha_cli("run", "--weights", tmp_path / "model.safetensors", "--prefix", prefix, "--input", tmp_path / "x.npy",
                "--output", out, "--causal", *flags)
        want = oracle(p, dict(kw, temperature=temp), x[None].astype(np.float64), causal=True)[0]
        close(np.load(out), want, "llama4 v5", 2e-5)


@pytest.mark.parametrize("temp", [None, (4, 0.25), (3, 0.5, "ministral3")])
def test_layer_from_another_layers_config(temp):
    """Layer(**other.config) makes the same layer: config gives the
    temperature as its three fields (temperature_floor, _scale, _rule),
    which the constructor takes as well as temperature=; both together
    are refused. Before: TypeError on temperature_floor for every layer."""
    a = mha.Layer(16, 4, n_kv_heads=2, rope={"pairing": "halves"}, temperature=temp)
    b = mha.Layer(**a.config)
    assert b.config == a.config
    if temp:
        with pytest.raises(mha.ArgumentError, match="given together"):
            mha.Layer(16, 4, temperature=temp, temperature_floor=temp[0], temperature_scale=temp[1])
