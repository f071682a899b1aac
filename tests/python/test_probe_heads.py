"""Adversarial probe of the head-order operations across the variants.

An oracle of its own (float64 numpy, written from mha.h and docs/VARIANTS.md,
not from the library) checks, over seeded random small configs on every
kernel set this CPU runs, that:
- mha_layer_permute_heads leaves Y unchanged and moves every per-head thing
  with its head (GQA kv groups, ALiBi slopes, sinks, per-head QK-norm
  weights, biases, bf16 / int8 stored weights, labels, the KV cache, files);
- interventions and captures equal the oracle's Z with head blocks changed
  before W_O, on the reference and fast paths and in the cache;
- the contract check and `mha audit` name a one-sided swap and stay quiet
  on a legitimately permuted layer;
- hostile permutations are refused and leave the layer as it was.
"""
import os
import subprocess

import numpy as np
import pytest

import mha
from io_helpers import mha as mha_cli


# ------------------------------------------------------------------ oracle

def default_slopes(n):
    """ALiBi's paper slopes: 2^(-8(r+1)/n) for n a power of two, else the
    lower power p's, then every other one of 2p's (BLOOM)."""
    p = 1 << (n.bit_length() - 1)
    s = [2.0 ** (-8.0 * (r + 1) / p) for r in range(p)]
    s += [2.0 ** (-8.0 * k / (2 * p)) for k in range(1, 2 * (n - p), 2)]
    return np.array(s[:n])


def _norm(x, w, kind, eps):
    # x (..., n) normalized over its last axis; w broadcast over the rows
    if kind == "rms":
        return x / np.sqrt(np.mean(x * x, -1, keepdims=True) + eps) * w
    mu = np.mean(x, -1, keepdims=True)
    return (x - mu) / np.sqrt(np.mean((x - mu) ** 2, -1, keepdims=True) + eps) * w


def _rope(x, pos, pairing, dim, theta):
    # x (B, T, n, d_k); the first dim dims rotate by pos (T,)
    half = dim // 2
    f = theta ** (-2.0 * np.arange(half) / dim)
    ang = pos[:, None] * f[None, :]            # (T, half)
    c, s = np.cos(ang)[None, :, None, :], np.sin(ang)[None, :, None, :]
    out = x.copy()
    if pairing == "halves":
        a, b = x[..., :half], x[..., half:dim]
    else:
        a, b = x[..., 0:dim:2], x[..., 1:dim:2]
    ra, rb = a * c - b * s, b * c + a * s
    if pairing == "halves":
        out[..., :half], out[..., half:dim] = ra, rb
    else:
        out[..., 0:dim:2], out[..., 1:dim:2] = ra, rb
    return out


def oracle(cfg, W, x, opt, interventions=None):
    """Y (B,T,d_model), Z (B,T,h*d_v) after interventions, contributions
    (h,B,T,d_model), probs (B,h,T,S) in float64; self-attention, keys at
    positions 0..T-1, top-left aligned."""
    x = x.astype(np.float64)
    B, T, D = x.shape
    h, hk, dk, dv = cfg["h"], cfg["hk"], cfg["dk"], cfg["dv"]
    g = {k: np.asarray(v, np.float64) for k, v in W.items()}
    Q = x @ g["w_q"] + g.get("b_q", 0)
    K = x @ g["w_k"] + g.get("b_k", 0)
    V = x @ g["w_v"] + g.get("b_v", 0)
    if cfg.get("clip"):
        Q, K, V = (np.clip(a, -cfg["clip"], cfg["clip"]) for a in (Q, K, V))
    eps = 1e-6
    if cfg.get("qk") and cfg.get("whole"):
        Q = _norm(Q, g["q_norm"], cfg["qk"], eps)
        K = _norm(K, g["k_norm"], cfg["qk"], eps)
    Q, K, V = Q.reshape(B, T, h, dk), K.reshape(B, T, hk, dk), V.reshape(B, T, hk, dv)
    if cfg.get("qk") and not cfg.get("whole"):
        qn, kn = g["q_norm"], g["k_norm"]
        if cfg.get("per_head"):
            qn, kn = qn.reshape(h, dk), kn.reshape(hk, dk)
        Q, K = _norm(Q, qn, cfg["qk"], eps), _norm(K, kn, cfg["qk"], eps)
    pos = np.arange(T, dtype=np.float64)
    if cfg.get("rope"):
        pairing, dim = cfg["rope"]
        Q, K = _rope(Q, pos, pairing, dim, 10000.0), _rope(K, pos, pairing, dim, 10000.0)
    grp = h // hk
    i, j = np.arange(T)[:, None], np.arange(T)[None, :]
    allow = np.ones((T, T), bool)
    if opt.get("causal"):
        allow &= j <= i
    if opt.get("window_left") is not None:
        allow &= (j >= i - opt["window_left"]) | (j < opt.get("sink_tokens", 0))
    if opt.get("window_right") is not None:
        allow &= j <= i + opt["window_right"]
    if opt.get("chunk_size"):
        allow &= (i // opt["chunk_size"]) == (j // opt["chunk_size"])
    Z = np.zeros((B, T, h, dv))
    P = np.zeros((B, h, T, T))
    for r in range(h):
        kvh = r // grp
        s = np.einsum("btd,bsd->bts", Q[:, :, r], K[:, :, kvh]) / np.sqrt(dk)
        if cfg.get("softcap"):
            s = cfg["softcap"] * np.tanh(s / cfg["softcap"])
        if cfg.get("alibi"):
            s = s - g["alibi_slopes"][r] * np.abs(i - j)[None]
        s = np.where(allow[None], s, -np.inf)
        m = np.max(s, -1, keepdims=True)
        if cfg.get("sinks"):
            m = np.maximum(m, g["sinks"][r])
        m = np.where(np.isfinite(m), m, 0.0)
        e = np.where(allow[None], np.exp(s - m), 0.0)
        den = e.sum(-1, keepdims=True)
        if cfg.get("sinks"):
            den = den + np.exp(g["sinks"][r] - m)
        p = np.where(den > 0, e / np.where(den > 0, den, 1), 0.0)
        P[:, r] = p
        Z[:, :, r] = np.einsum("bts,bsd->btd", p, V[:, :, kvh])
    for r, iv in (interventions or {}).items():
        op, arg = (iv, None) if isinstance(iv, str) else iv
        if op == "zero":
            Z[:, :, r] = 0
        elif op == "scale":
            Z[:, :, r] *= np.float32(arg)
        elif op == "mean":
            Z[:, :, r] = Z[:, :, r].mean((0, 1), keepdims=True)
        elif op == "replace":
            Z[:, :, r] = arg
    Zf = Z.reshape(B, T, h * dv)
    Wo = g["w_o"].reshape(h, dv, D)
    C = np.einsum("btrd,rdo->rbto", Z, Wo)
    Y = C.sum(0) + g.get("b_o", 0)
    return Y, Zf, C, P


# ------------------------------------------------------------ random configs

def random_config(rng):
    hk = int(rng.choice([1, 1, 2, 3, 4]))
    grp = int(rng.choice([1, 2, 3])) if hk < 4 else int(rng.choice([1, 2]))
    h = hk * grp
    dk = int(rng.choice([2, 4, 6, 8]))
    dv = int(rng.choice([2, 3, 5, 8, 33, 40]))
    D = int(rng.choice([4, 6, 8, 12, 36]))
    cfg = dict(h=h, hk=hk, dk=dk, dv=dv, D=D, bias=bool(rng.integers(2)))
    if rng.random() < 0.4:
        cfg["rope"] = (str(rng.choice(["halves", "interleaved"])), int(rng.choice([2, dk])) if dk > 2 else 2)
    if rng.random() < 0.4:
        cfg["alibi"] = True
        cfg["explicit_slopes"] = bool(rng.integers(2))
    if rng.random() < 0.3:
        cfg["softcap"] = float(rng.choice([1.5, 5.0]))
    if rng.random() < 0.4:
        cfg["sinks"] = True
    if rng.random() < 0.5:
        cfg["qk"] = str(rng.choice(["rms", "layer"]))
        mode = int(rng.integers(3))  # shared (d_k), per head (h, d_k), whole width
        cfg["per_head"] = mode >= 1
        cfg["whole"] = mode == 2
    if rng.random() < 0.3:
        cfg["clip"] = float(rng.choice([0.3, 1.0]))
    return cfg


def random_weights(rng, cfg):
    h, hk, dk, dv, D = cfg["h"], cfg["hk"], cfg["dk"], cfg["dv"], cfg["D"]
    u = lambda *s: rng.uniform(-0.6, 0.6, s).astype(np.float32)
    W = {"w_q": u(D, h * dk), "w_k": u(D, hk * dk), "w_v": u(D, hk * dv), "w_o": u(h * dv, D)}
    if cfg["bias"]:
        W.update(b_q=u(h * dk), b_k=u(hk * dk), b_v=u(hk * dv), b_o=u(D))
    if cfg.get("alibi") and cfg.get("explicit_slopes"):
        W["alibi_slopes"] = rng.uniform(0.05, 1.0, h).astype(np.float32)
    if cfg.get("sinks"):
        W["sinks"] = rng.uniform(-1, 2, h).astype(np.float32)
    if cfg.get("qk"):
        nq, nk = (h * dk, hk * dk) if cfg["per_head"] else (dk, dk)
        W["q_norm"] = rng.uniform(0.5, 1.5, nq).astype(np.float32)
        W["k_norm"] = rng.uniform(0.5, 1.5, nk).astype(np.float32)
    return W


def make_layer(cfg, W):
    kw = dict(n_kv_heads=cfg["hk"], d_k=cfg["dk"], d_v=cfg["dv"], bias=cfg["bias"], weights=W)
    if cfg.get("rope"):
        kw["rope"] = {"pairing": cfg["rope"][0], "dim": cfg["rope"][1]}
    if cfg.get("alibi"):
        kw["alibi"] = True
    if cfg.get("softcap"):
        kw["softcap"] = cfg["softcap"]
    if cfg.get("sinks"):
        kw["sinks"] = True
    if cfg.get("qk"):
        kw.update(qk_norm=cfg["qk"], qk_norm_per_head=cfg["per_head"], qk_norm_whole=cfg["whole"])
    if cfg.get("clip"):
        kw["clip_qkv"] = cfg["clip"]
    return mha.Layer(cfg["D"], cfg["h"], **kw)


def layer_weights(layer, cfg):
    """The layer's weights as the oracle reads them (dequantized; the
    default ALiBi slopes filled in)."""
    W = layer.weights()
    if cfg.get("alibi") and "alibi_slopes" not in W:
        W["alibi_slopes"] = default_slopes(cfg["h"]).astype(np.float32)
    return W


def random_options(rng, T):
    o = {}
    if rng.random() < 0.5:
        o["causal"] = True
    if rng.random() < 0.3:
        o["window_left"] = int(rng.integers(0, T))
    if rng.random() < 0.2:
        o["window_right"] = int(rng.integers(0, T))
    if rng.random() < 0.25:
        o["chunk_size"] = int(rng.integers(1, T + 1))
    return o


def group_perm(rng, h, hk):
    """A permutation of 0..h-1 keeping kv groups whole (any order inside)."""
    grp = h // hk
    order = rng.permutation(hk)
    return [int(order[g] * grp + k) for g in range(hk) for k in rng.permutation(grp)]


def permuted_weights(W, cfg, perm):
    """The oracle's own permutation: head blocks of every per-head tensor."""
    h, hk, dk, dv = cfg["h"], cfg["hk"], cfg["dk"], cfg["dv"]
    grp = h // hk
    kvp = [perm[g * grp] // grp for g in range(hk)]
    cols = lambda a, p, w: a.reshape(*a.shape[:-1], len(p), w)[..., p, :].reshape(a.shape)
    out = dict(W)
    out["w_q"], out["w_k"], out["w_v"] = cols(W["w_q"], perm, dk), cols(W["w_k"], kvp, dk), cols(W["w_v"], kvp, dv)
    out["w_o"] = W["w_o"].reshape(h, dv, -1)[perm].reshape(W["w_o"].shape)
    for n, p, w in (("b_q", perm, dk), ("b_k", kvp, dk), ("b_v", kvp, dv), ("alibi_slopes", perm, 1),
                    ("sinks", perm, 1)):
        if n in W:
            out[n] = cols(W[n], p, w)
    if cfg.get("qk") and cfg["per_head"]:
        out["q_norm"], out["k_norm"] = cols(W["q_norm"], perm, dk), cols(W["k_norm"], kvp, dk)
    return out, kvp


def tol(ref):
    return 2e-4 * (1 + np.max(np.abs(ref)))


N_CASES = int(os.environ.get("PROBE_CASES", 24))


def _case(seed):
    rng = np.random.default_rng(1000 + seed)
    cfg = random_config(rng)
    W = random_weights(rng, cfg)
    B, T = int(rng.integers(1, 3)), int(rng.integers(1, 7))
    x = rng.uniform(-1, 1, (B, T, cfg["D"])).astype(np.float32)
    return rng, cfg, W, x, random_options(rng, T)


# ------------------------------------------------------------------- tests

@pytest.mark.parametrize("dtype", ["f32", "bf16", "int8"])
@pytest.mark.parametrize("seed", range(N_CASES))
def test_permute_matches_oracle_and_keeps_y(seed, dtype, kernels):
    rng, cfg, W, x, opt = _case(seed)
    L = make_layer(cfg, W)
    if dtype != "f32":
        L.convert_weights(dtype)
    W0 = layer_weights(L, cfg)
    y_ref, *_ = oracle(cfg, W0, x, opt)
    y0 = L.forward(x, **opt)
    np.testing.assert_allclose(y0, y_ref, atol=tol(y_ref), err_msg=f"{cfg} {opt}")
    perm = group_perm(rng, cfg["h"], cfg["hk"])
    L.permute_heads(perm)
    assert L.weights_dtype == dtype
    W1 = layer_weights(L, cfg)
    want, kvp = permuted_weights(W0, cfg, perm)
    for n in want:  # exact: the stored values move, nothing is re-rounded
        np.testing.assert_array_equal(W1[n], want[n], err_msg=f"{n} after permute {perm} {cfg}")
    assert L.labels("q") == perm and L.labels("o") == perm and L.labels("s") == perm
    assert L.labels("k") == kvp and L.labels("v") == kvp
    y1 = L.forward(x, **opt)
    np.testing.assert_allclose(y1, y0, atol=tol(y_ref), err_msg=f"Y moved: {cfg} {perm}")
    assert L.check_contract(x, **opt).ok


@pytest.mark.parametrize("seed", range(N_CASES))
def test_interventions_and_captures(seed, kernels):
    rng, cfg, W, x, opt = _case(seed)
    L = make_layer(cfg, W)
    B, T, _ = x.shape
    h, dv = cfg["h"], cfg["dv"]
    ops = {}
    for r in range(h):
        k = int(rng.integers(5))
        ops[r] = [None, "zero", ("scale", float(rng.uniform(-2, 2))), "mean",
                  ("replace", rng.uniform(-1, 1, (B, T, dv)).astype(np.float32))][k]
    ivs = {r: v for r, v in ops.items() if v is not None}
    W0 = layer_weights(L, cfg)
    for path in ("reference", "fast", "auto"):
        y, cap = L.forward(x, capture=True, interventions=ops, path=path, **opt)
        Y, Z, C, P = oracle(cfg, W0, x, opt, ivs)
        t = tol(Y)
        np.testing.assert_allclose(y, Y, atol=t, err_msg=f"{path} {cfg} {opt} {ops}")
        np.testing.assert_allclose(cap["z"], Z, atol=t)
        np.testing.assert_allclose(cap["contributions"], C, atol=t)
        np.testing.assert_allclose(cap["probs"], P, atol=2e-5)
        np.testing.assert_allclose(cap["contributions"].sum(0) + W0.get("b_o", 0), y, atol=t)
        rows = P.sum(-1)  # 1, or less by the sink's weight, or 0 when masked
        np.testing.assert_allclose(cap["probs"].sum(-1), rows, atol=1e-5)
        if not cfg.get("sinks"):
            assert np.all((np.abs(rows - 1) < 1e-9) | (rows == 0))
    # intervening on position r after a permutation = on old head perm[r] before
    perm = group_perm(rng, cfg["h"], cfg["hk"])
    y_before = L.forward(x, interventions=ops, **opt)
    L.permute_heads(perm)
    moved = {i: ops[perm[i]] for i in range(h)}
    np.testing.assert_allclose(L.forward(x, interventions=moved, **opt), y_before, atol=tol(y_before))


def _self_cache_oracle(cfg, W, xs):
    # causal self-attention over the whole sequence: the cache's answer
    return oracle(cfg, W, xs, {"causal": True})[0]


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("seed", range(N_CASES))
def test_cache_permuted_between_steps(seed, dtype, kernels):
    rng, cfg, W, _, _ = _case(seed)
    L = make_layer(cfg, W)
    W0 = layer_weights(L, cfg)
    B, T0, T1 = 2, int(rng.integers(1, 5)), int(rng.integers(1, 4))
    xs = rng.uniform(-1, 1, (B, T0 + 2 * T1, cfg["D"])).astype(np.float32)
    Y = _self_cache_oracle(cfg, W0, xs)
    c = mha.Cache(L, batch=B, capacity=32, dtype=dtype)
    y0 = c.forward(xs[:, :T0])
    perm = group_perm(rng, cfg["h"], cfg["hk"])
    L.permute_heads(perm)
    kvp = permuted_weights(W0, cfg, perm)[1]
    if kvp != sorted(kvp):
        with pytest.raises(mha.ContractError):  # the cache knows it holds the old kv order
            c.forward(xs[:, T0:T0 + T1])
    assert c.lengths() == [T0, T0]
    c.permute_heads(perm)
    r = int(rng.integers(cfg["h"]))
    y1, cap = c.forward(xs[:, T0:T0 + T1], capture=True, interventions={r: "zero"})
    y2 = c.forward(xs[:, T0 + T1:])
    t = tol(Y) * (20 if dtype == "float16" else 1)
    np.testing.assert_allclose(y0, Y[:, :T0], atol=t)
    np.testing.assert_allclose(y2, Y[:, T0 + T1:], atol=t)
    # the zeroed position r is old head perm[r]: Y loses exactly its contribution
    _, _, C, _ = oracle(cfg, W0, xs, {"causal": True})
    np.testing.assert_allclose(y1, Y[:, T0:T0 + T1] - C[perm[r], :, T0:T0 + T1], atol=t)
    np.testing.assert_allclose(cap["contributions"][r], 0, atol=0)
    np.testing.assert_allclose(cap["contributions"].sum(0) + W0.get("b_o", 0), y1, atol=t)


@pytest.mark.parametrize("dtype", ["f32", "bf16", "int8"])
@pytest.mark.parametrize("seed", range(0, N_CASES, 3))
def test_save_load_after_permute(tmp_path, seed, dtype):
    rng, cfg, W, x, opt = _case(seed)
    L = make_layer(cfg, W)
    if dtype != "f32":
        L.convert_weights(dtype)
    y0 = L.forward(x, **opt)
    perm = group_perm(rng, cfg["h"], cfg["hk"])
    L.permute_heads(perm)
    p = tmp_path / "p.safetensors"
    L.save(str(p))
    M = mha.Layer.load(str(p))
    assert M.weights_dtype == dtype
    for b in "qkvo" + ("s" if cfg.get("alibi") or cfg.get("sinks") else ""):  # S: only with slopes, sinks
        assert M.labels(b) == L.labels(b), b
    np.testing.assert_allclose(M.forward(x, **opt), y0, atol=tol(y0))
    assert M.check_contract(x, **opt).ok
    W1, W2 = L.weights(), M.weights()
    for n in W1:
        np.testing.assert_array_equal(W1[n], W2[n], err_msg=n)


@pytest.mark.parametrize("seed", range(0, N_CASES, 2))
def test_cli_permute_then_audit(tmp_path, seed):
    rng, cfg, W, x, opt = _case(seed)
    L = make_layer(cfg, W)
    src = tmp_path / "a.safetensors"
    L.save(str(src))
    x2 = x.reshape(-1, cfg["D"])[: max(2, x.shape[1])]
    x2 = rng.uniform(-1, 1, (6, cfg["D"])).astype(np.float32)
    np.save(tmp_path / "x.npy", x2)
    y_ref = L.forward(x2[None])[0]
    np.save(tmp_path / "y.npy", y_ref)
    perm = group_perm(rng, cfg["h"], cfg["hk"])
    dst = tmp_path / "b.safetensors"
    mha_cli("permute", "--order", ",".join(map(str, perm)), src, dst)
    M = mha.Layer.load(str(dst))
    assert M.labels("q") == perm and M.labels("o") == perm
    if cfg.get("alibi") or cfg.get("sinks"):
        assert M.labels("s") == perm
    np.testing.assert_allclose(M.forward(x2[None])[0], y_ref, atol=tol(y_ref))
    p = mha_cli("audit", "--weights", dst, "--input", tmp_path / "x.npy", "--reference", tmp_path / "y.npy",
                check=False)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "labels: consistent" in p.stdout
    # a one-sided W_O swap of two heads: audit names W_O and prints the repair
    if cfg["h"] >= 2:
        a, b = rng.choice(cfg["h"], 2, replace=False)
        sw = list(range(cfg["h"]))
        sw[a], sw[b] = sw[b], sw[a]
        bad = tmp_path / "bad.safetensors"
        mha_cli("permute", "--block", "o", "--order", ",".join(map(str, sw)), dst, bad)
        B_ = mha.Layer.load(str(bad))
        rep = B_.check_contract()
        assert not rep.ok and rep.bad_block == "O" and rep.bad_position == min(a, b), rep
        p = mha_cli("audit", "--weights", bad, "--input", tmp_path / "x.npy", "--reference",
                    tmp_path / "y.npy", check=False)
        assert p.returncode == 1, p.stdout + p.stderr
        assert "labels: disagree: W_O block" in p.stdout


@pytest.mark.parametrize("seed", range(N_CASES))
def test_one_sided_swaps_are_named(seed):
    rng, cfg, W, x, opt = _case(seed)
    h, hk = cfg["h"], cfg["hk"]
    L = make_layer(cfg, W)
    L.permute_heads(group_perm(rng, h, hk))  # a legitimate permutation first
    assert L.check_contract(x, **opt).ok
    kinds = [("o", "O", h), ("q", "O", h), ("k", "K", hk), ("v", "V", hk)]
    if cfg.get("alibi") or cfg.get("sinks"):
        kinds.append(("s", "S", h))
    for name, code, n in kinds:
        if n < 2:
            continue
        L2 = make_layer(cfg, W)
        L2.permute_heads(L.labels("q"))
        a, b = sorted(rng.choice(n, 2, replace=False))
        sw = list(range(n))
        sw[a], sw[b] = sw[b], sw[a]
        L2.permute_block(name, sw)
        rep = L2.check_contract()
        assert not rep.ok, (name, rep)
        # the first disagreeing position; a moved Q block disagrees with O there
        assert rep.bad_block == code and rep.bad_position == a, (name, rep)
        assert f"block {a} carries label" in rep.message


def _snapshot(L):
    return L.weights(), {b: L.labels(b) for b in "qkvos"}


@pytest.mark.parametrize("seed", range(N_CASES))
def test_hostile_permutations_refused_layer_unchanged(seed):
    rng, cfg, W, x, opt = _case(seed)
    h, hk = cfg["h"], cfg["hk"]
    L = make_layer(cfg, W)
    w0, l0 = _snapshot(L)
    bad = [list(range(h - 1)) + [h], list(range(h + 1)), list(range(h - 1)) if h > 1 else [],
           [-1] + list(range(1, h))]
    if h >= 2:
        bad += [[0] * h, [1, 1] + list(range(2, h))]
    grp = h // hk
    if 1 < grp and hk > 1:  # a group split: heads of two old groups in one new group
        p = list(range(h))
        p[grp - 1], p[grp] = p[grp], p[grp - 1]
        bad.append(p)
    for p in bad:
        with pytest.raises((mha.ArgumentError, mha.ShapeError)):
            L.permute_heads(p)
        c = mha.Cache(L, batch=1, capacity=8)
        with pytest.raises((mha.ArgumentError, mha.ShapeError)):
            c.permute_heads(p)
    w1, l1 = _snapshot(L)
    assert l1 == l0
    for n in w0:
        np.testing.assert_array_equal(w1[n], w0[n])


def _audit_broken(tmp_path, cfg, W, move, n_ref=40, seed=0):
    """A file whose blocks `move(layer)` reordered while every label says
    identity (a conversion mistake); audits it against the intact layer's
    Y. Returns (the audit's CompletedProcess, x, y_ref)."""
    rng = np.random.default_rng(seed)
    L = make_layer(cfg, W)
    x = rng.uniform(-1, 1, (n_ref, cfg["D"])).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    y = L.forward(x[None])[0]
    np.save(tmp_path / "y.npy", y)
    M = make_layer(cfg, W)
    move(M)
    for b in "qkvos":
        M.set_labels(b, list(range(cfg["hk"] if b in "kv" else cfg["h"])))
    bad = tmp_path / "bad.safetensors"
    M.save(str(bad))
    p = mha_cli("audit", "--weights", bad, "--input", tmp_path / "x.npy", "--reference", tmp_path / "y.npy",
                check=False)
    return p, x, y


def _apply_fix(tmp_path, p, x, y):
    fix = [ln for ln in p.stdout.splitlines() if ln.startswith("fix: mha permute")]
    assert p.returncode == 1 and fix, p.stdout + p.stderr
    args = fix[0].split()[3:]  # after "fix: mha permute"
    mha_cli("permute", *args)
    F = mha.Layer.load(str(tmp_path / "bad_fixed.safetensors"))
    np.testing.assert_allclose(F.forward(x[None])[0], y, atol=tol(y))
    assert F.check_contract().ok
    return fix[0]


@pytest.mark.parametrize("seed", [18, 25, 29, 32, 34, 45, 52, 56, 17, 20])
def test_audit_finds_score_parameter_swaps(tmp_path, seed):
    """Swapped sink logits (or ALiBi slopes) with labels that say nothing:
    a head's terms under different sinks are nearly parallel (a sink
    rescales each row of its output), so the fit spread its coefficients
    and audit said "cannot tell ... identical on this input" for every
    sinks case here (8 of 8). Now it searches the pairings and prints the
    repair, which reproduces Y."""
    rng, cfg, W, x, opt = _case(seed)
    if not (cfg.get("sinks") or cfg.get("alibi")):
        cfg["sinks"] = True
        W = random_weights(np.random.default_rng(seed), cfg)
    h = cfg["h"]
    a, b = sorted(np.random.default_rng(seed).choice(h, 2, replace=False))
    sw = list(range(h))
    sw[a], sw[b] = sw[b], sw[a]
    if cfg.get("sinks"):  # sinks far enough apart that the swap shows in Y
        W = dict(W, sinks=W["sinks"].copy())
        W["sinks"][b] = W["sinks"][a] + 1.5
    p, x, y = _audit_broken(tmp_path, cfg, W, lambda M: M.permute_block("s", sw), seed=seed)
    fix = _apply_fix(tmp_path, p, x, y)
    assert "--block s --order " + ",".join(map(str, sw)) in fix, p.stdout


def test_audit_identical_heads_still_ambiguous(tmp_path):
    """The search does not pick an order among heads that are identical on
    the input: two heads with the same weights and the same sink."""
    cfg = dict(h=2, hk=2, dk=4, dv=4, D=8, bias=False, sinks=True)
    W = random_weights(np.random.default_rng(3), cfg)
    W["w_q"][:, 4:] = W["w_q"][:, :4]
    W["w_k"][:, 4:] = W["w_k"][:, :4]
    W["w_v"][:, 4:] = W["w_v"][:, :4]
    W["w_o"][4:] = W["w_o"][:4]
    W["sinks"][:] = 0.5
    W2 = dict(W, sinks=np.array([0.5, 2.0], np.float32))  # the reference: another sink at head 1
    rng = np.random.default_rng(4)
    x = rng.uniform(-1, 1, (20, 8)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", make_layer(cfg, W2).forward(x[None])[0])
    make_layer(cfg, W).save(str(tmp_path / "w.safetensors"))
    p = mha_cli("audit", "--weights", tmp_path / "w.safetensors", "--input", tmp_path / "x.npy",
                "--reference", tmp_path / "y.npy", check=False)
    assert p.returncode == 1 and "fix:" not in p.stdout, p.stdout


def _per_head_norm_cases(n, min_kv=1):
    out = []
    for seed in range(400):
        rng, cfg, W, x, opt = _case(seed)
        if cfg.get("qk") and cfg["per_head"] and cfg["h"] >= 2 and cfg["hk"] >= min_kv:
            out.append(seed)
        if len(out) == n:
            return out
    return out


def _move_proj(M, cfg, W, which, sw):
    """A conversion that wrote q_proj (or k_proj) out of order, its norm right."""
    h, hk, dk = cfg["h"], cfg["hk"], cfg["dk"]
    n = h if which == "q" else hk
    W2 = M.weights()
    W2[f"w_{which}"] = W2[f"w_{which}"].reshape(cfg["D"], n, dk)[:, sw].reshape(cfg["D"], n * dk)
    if f"b_{which}" in W2:
        W2[f"b_{which}"] = W2[f"b_{which}"].reshape(n, dk)[sw].reshape(-1)
    M.set_weights(W2)


@pytest.mark.parametrize("seed", _per_head_norm_cases(12))
def test_audit_finds_w_q_swap_with_per_head_norms(tmp_path, seed):
    """W_Q's column blocks (and b_Q) out of order, the per-head q_norm
    right: audit tried only moves that take q_norm along (Q's blocks) and
    said "not a permutation: no reordering of W_O, W_Q ... explains the
    mismatch" for 113 of 113 such cases. Now it fits W_Q alone and prints
    `--block q-proj`, which repairs the file."""
    rng, cfg, W, x, opt = _case(seed)
    h = cfg["h"]
    a, b = sorted(np.random.default_rng(seed).choice(h, 2, replace=False))
    sw = list(range(h))
    sw[a], sw[b] = sw[b], sw[a]
    p, x, y = _audit_broken(tmp_path, cfg, W, lambda M: _move_proj(M, cfg, W, "q", sw), seed=seed)
    fix = _apply_fix(tmp_path, p, x, y)
    assert "--block q-proj" in fix or "--block o" in fix, p.stdout  # within a kv group W_O's swap is the same Y


@pytest.mark.parametrize("seed", _per_head_norm_cases(6, min_kv=2))
def test_audit_finds_w_k_swap_with_per_head_norms(tmp_path, seed):
    rng, cfg, W, x, opt = _case(seed)
    hk = cfg["hk"]
    a, b = sorted(np.random.default_rng(seed).choice(hk, 2, replace=False))
    sw = list(range(hk))
    sw[a], sw[b] = sw[b], sw[a]
    p, x, y = _audit_broken(tmp_path, cfg, W, lambda M: _move_proj(M, cfg, W, "k", sw), seed=seed)
    fix = _apply_fix(tmp_path, p, x, y)
    assert "--block k-proj" in fix, p.stdout


@pytest.mark.parametrize("dtype", ["f32", "bf16", "int8"])
@pytest.mark.parametrize("block", ["q-proj", "k-proj", "kv-proj"])
def test_permute_proj_blocks_keep_the_norms(tmp_path, block, dtype):
    cfg = dict(h=4, hk=2, dk=4, dv=4, D=8, bias=True, qk="rms", per_head=True, whole=False)
    W = random_weights(np.random.default_rng(7), cfg)
    L = make_layer(cfg, W)
    if dtype != "f32":
        L.convert_weights(dtype)
    src = tmp_path / "a.safetensors"
    L.save(str(src))
    n = cfg["h"] if block == "q-proj" else cfg["hk"]
    sw = [1, 0] + list(range(2, n))
    mha_cli("permute", "--block", block, "--order", ",".join(map(str, sw)), src, tmp_path / "b.safetensors")
    M = mha.Layer.load(str(tmp_path / "b.safetensors"))
    assert M.weights_dtype == dtype
    w0, w1 = L.weights(), M.weights()
    np.testing.assert_array_equal(w1["q_norm"], w0["q_norm"])
    np.testing.assert_array_equal(w1["k_norm"], w0["k_norm"])
    moved = {"q-proj": ["w_q", "b_q"], "k-proj": ["w_k", "b_k"], "kv-proj": ["w_k", "b_k", "w_v", "b_v"]}[block]
    for name in moved:
        d = cfg["dk"]
        a = w0[name].reshape(*w0[name].shape[:-1], n, d)[..., sw, :].reshape(w0[name].shape)
        np.testing.assert_allclose(w1[name], a, rtol=1e-6 if dtype == "int8" else 0, err_msg=name)
    for name in set(w0) - set(moved) - {"q_norm", "k_norm"}:
        np.testing.assert_allclose(w1[name], w0[name], rtol=1e-6 if dtype == "int8" else 0, err_msg=name)
    kind = "q" if block == "q-proj" else "k"
    assert M.labels(kind) == sw
    assert not M.check_contract().ok  # a one-sided move, as --block q


def test_audit_finds_a_sink_derangement(tmp_path):
    """Nine sink logits, eight of them in another head's place: the
    descent from the identity alone stopped in a local minimum ("cannot
    tell"); the greedy and fixed pseudo-random starts reach the order."""
    rng, cfg, W, x, opt = _case(86)
    sw = [0, 2, 7, 1, 5, 6, 3, 8, 4]
    assert cfg["h"] == 9 and cfg.get("sinks")
    p, x, y = _audit_broken(tmp_path, cfg, W, lambda M: M.permute_block("s", sw), seed=0)
    fix = _apply_fix(tmp_path, p, x, y)
    inv = [sw.index(i) for i in range(9)]  # the repair undoes sw
    assert "--block s --order " + ",".join(map(str, inv)) in fix, p.stdout


@pytest.mark.parametrize("seed", _per_head_norm_cases(3, min_kv=2))
def test_audit_finds_kv_swap_with_per_head_k_norm(tmp_path, seed):
    rng, cfg, W, x, opt = _case(seed)
    sw = [1, 0] + list(range(2, cfg["hk"]))

    def move(M):
        _move_proj(M, cfg, W, "k", sw)
        M.permute_block("v", sw)
    p, x, y = _audit_broken(tmp_path, cfg, W, move, seed=seed)
    assert "--block kv-proj" in _apply_fix(tmp_path, p, x, y), p.stdout
