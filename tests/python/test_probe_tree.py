"""Probe of tree speculative decoding on the KV cache (Cache.forward with
keep_mask, Cache.compact) against an oracle written from docs/CACHE.md and
include/mha.h, not from the library: float64 numpy over each new token's
own sequence.

The rule the oracle encodes: new token i of a call sees the tokens cached
before the call, then the new tokens j < i its mask row keeps, in order,
then itself (when mask[i][i]): the sequence a token decoded on its path
would see. Its window (the cache's window, window_left) and its chunk
(chunk_size) count positions along that sequence, so a draft after its
siblings reaches as far back as its depth, not its cache index; sink
tokens stay visible. RoPE and ALiBi take the positions given (base +
depth). After compact(b, base, path) the path holds positions base,
base+1, ... and decoding goes on over prefix + path.

Covered: MHA / GQA / MQA, RoPE halves and interleaved (full and partial
dim), ALiBi, Llama 4's query temperature, softcap + attention sinks +
QK-norm + clip_qkv,
add_bias_kv + add_zero_attn; windows and rings with sink tokens (trees
that wrap the ring; trees longer than a ring piece: refused by name or
answered right), window_left, chunk_size; per-sequence n_new; B > 1 with
different trees and one shared mask; random trees, random acceptance,
several verify/compact rounds with single- and multi-token decode steps
between them; capture z and probs; copy() and reorder() after a
compaction; every storage type (measured worst error per type printed)
and every kernel set. Hostile inputs: masks of wrong shape / dtype /
layout / values, NaN in x, huge T, bad compactions, cross caches.

Fast by default; PROBE_CASES=n runs n random cases per storage type
(default 4). The worst errors go to stdout (pytest -s shows them).
Legend: B sequences, n cached tokens, T new tokens, h heads, g kv heads.
"""
import os

import pytest

from conftest import KERNELS, require

np = require("numpy")
import mha  # noqa: E402

CASES = int(os.environ.get("PROBE_CASES", "4"))
WORST = {}


def note(key, err):
    WORST[key] = max(WORST.get(key, 0.0), float(err))


@pytest.fixture(scope="module", autouse=True)
def report():
    yield
    for k in sorted(WORST):
        print(f"probe tree worst {k}: {WORST[k]:.3g}")


# ---------------------------------------------------------------- oracle
def rope64(x, pos, dim, theta, pairing):
    """x (..., n, d) rotated at positions pos (n,): dims < dim, pairs (i, i+dim/2)
    or (2i, 2i+1), frequency theta^(-2i/dim)."""
    half = dim // 2
    ang = np.asarray(pos, np.float64)[:, None] * theta ** (-2.0 * np.arange(half) / dim)[None]
    c, s = np.cos(ang), np.sin(ang)
    out = x.copy()
    if pairing == "halves":
        a, b = x[..., :half], x[..., half:dim]
        out[..., :half], out[..., half:dim] = a * c - b * s, b * c + a * s
    else:
        a, b = x[..., 0:dim:2], x[..., 1:dim:2]
        out[..., 0:dim:2], out[..., 1:dim:2] = a * c - b * s, b * c + a * s
    return out


def stored(a, dtype):
    """a (g, n, d) float64 as the cache stores it: fp32, then binary16 (to
    nearest even) or int8 per block of 32 along d (scale = max|x| / 127 in
    fp32, codes rounded half away from zero), read back as float64."""
    a = a.astype(np.float32)
    if dtype == "float16":
        return a.astype(np.float16).astype(np.float64)
    if dtype == "int8":
        out = np.empty_like(a)
        for b0 in range(0, a.shape[-1], 32):
            blk = a[..., b0:b0 + 32]
            sc = (np.abs(blk).max(-1, keepdims=True) / np.float32(127)).astype(np.float32)
            r = np.divide(blk, sc, out=np.zeros_like(blk), where=sc > 0).astype(np.float32)
            out[..., b0:b0 + 32] = np.clip(np.sign(r) * np.floor(np.abs(r) + np.float32(0.5)), -127, 127) * sc
        return out.astype(np.float64)
    return a.astype(np.float64)


class Oracle:
    """The layer's math in float64 from its config and weights."""

    def __init__(self, layer):
        self.c = c = layer.config
        self.w = {k: v.astype(np.float64) for k, v in layer.weights().items()}
        self.h, self.g, self.dk, self.dv = c["n_heads"], c["n_kv_heads"], c["d_k"], c["d_v"]

    def _proj(self, name, x):
        y = x @ self.w["w_" + name] + self.w.get("b_" + name, 0.0)
        clip = self.c["clip_qkv"]
        return np.clip(y, -clip, clip) if clip > 0 else y

    def _heads(self, y, n, d, which, pos):
        """(rows, n*d) -> (n, rows, d) with QK-norm and RoPE for q and k."""
        c, rows = self.c, y.shape[0]
        if which in "qk" and c["qk_norm"] != "none":
            w = self.w[which + "_norm"]
            if c["qk_norm_whole"]:
                y = y / np.sqrt((y * y).mean(-1, keepdims=True) + c["qk_norm_eps"]) * w
            else:
                yh = y.reshape(rows, n, d)
                wh = w.reshape(n, d) if w.size == n * d else w
                y = (yh / np.sqrt((yh * yh).mean(-1, keepdims=True) + c["qk_norm_eps"]) * wh).reshape(rows, n * d)
        y = y.reshape(rows, n, d).transpose(1, 0, 2)
        if which in "qk" and c["rope"]["pairing"] != "none":
            y = rope64(y, pos, c["rope"]["dim"], c["rope"]["theta"], c["rope"]["pairing"])
        if which == "q" and c["temperature_floor"]:  # Llama 4: 1 + a log(1 + floor((p + 1) / F))
            F, a = c["temperature_floor"], c["temperature_scale"]
            y = y * (1 + a * np.log1p(np.floor((np.asarray(pos, np.float64) + 1) / F)))[None, :, None]
        return y

    def project(self, x, pos):
        x = np.asarray(x, np.float64)
        return (self._heads(self._proj("q", x), self.h, self.dk, "q", pos),
                self._heads(self._proj("k", x), self.g, self.dk, "k", pos),
                self._heads(self._proj("v", x), self.g, self.dv, "v", pos))

    def call(self, hx, hp, nx, npos, mask, window=0, n_sink=0, left=None, chunk=0, storage=(None, None)):
        """One cached call of one sequence: history hx (n,D) at positions hp
        (n,), cache indices 0..n-1; new tokens nx (T,D) at npos (T,) with the
        tree mask (T,T) bool. -> y (T,D), z (T,h*dv), probs (h,T,n+T+extra)
        by cache index (history, then the new tokens, then the extra keys)."""
        c, h, g, dk, dv = self.c, self.h, self.g, self.dk, self.dv
        n, T = len(hx), len(nx)
        X = np.concatenate([np.reshape(hx, (n, np.shape(nx)[1])), nx]).astype(np.float64)
        P = np.concatenate([np.asarray(hp, np.int64), np.asarray(npos, np.int64)])
        q, k, v = self.project(X, P)
        kt, vt = storage  # None: exact; else K and V as the cache stores them
        if kt:
            k, v = stored(k, kt), stored(v, vt or kt)
        extra_k, extra_v = [], []
        if c["add_bias_kv"]:
            extra_k.append(self.w["bias_k"].reshape(g, 1, dk)), extra_v.append(self.w["bias_v"].reshape(g, 1, dv))
        if c["add_zero_attn"]:
            extra_k.append(np.zeros((g, 1, dk))), extra_v.append(np.zeros((g, 1, dv)))
        n_x = len(extra_k)
        K, V = np.concatenate([k] + extra_k, 1), np.concatenate([v] + extra_v, 1)
        lefts = [x for x in (window - 1 if window else None, left) if x is not None]
        left_eff = min(lefts) if lefts else None
        z = np.zeros((T, h * dv))
        probs = np.zeros((h, T, n + T + n_x))
        for i in range(T):
            vis = [j for j in range(i) if mask[i, j]]
            e = np.full(n + T, -1, np.int64)        # positions along token i's own sequence
            allow = np.zeros(n + T, bool)
            e[:n], allow[:n] = np.arange(n), True
            for r, j in enumerate(vis):
                e[n + j], allow[n + j] = n + r, True
            eq = n + len(vis)
            if mask[i, i]:
                e[n + i], allow[n + i] = eq, True
            if left_eff is not None:
                allow &= (e >= eq - left_eff) | (e < n_sink)
            if chunk:
                allow &= e >= eq - eq % chunk
            allow = np.concatenate([allow, np.ones(n_x, bool)])
            for r in range(h):
                gr = r // (h // g)
                s = K[gr] @ q[r, n + i] / np.sqrt(dk)
                if c["softcap"]:
                    s = c["softcap"] * np.tanh(s / c["softcap"])
                if c["alibi"]:
                    s[:n + T] -= self.w["alibi_slopes"][r] * np.abs(P - P[n + i])
                s = np.where(allow, s, -np.inf)
                m = s.max()
                sink = self.w["sinks"][r] if c["sinks"] else None
                if sink is not None:
                    m = max(m, sink)
                m = m if np.isfinite(m) else 0.0
                ex = np.exp(s - m)
                den = ex.sum() + (np.exp(sink - m) if sink is not None else 0.0)
                p = ex / den if den > 0 else np.zeros_like(ex)
                probs[r, i] = p
                z[i, r * dv:(r + 1) * dv] = p @ V[gr]
        y = z @ self.w["w_o"] + self.w.get("b_o", 0.0)
        return y, z, probs


# ---------------------------------------------------------------- trees
def random_parents(rng, N):
    """Parents first: parent[i] in -1 (a root: child of the cached prefix) .. i-1."""
    return [int(rng.integers(-1, i)) if i else -1 for i in range(N)]


def tree_mask(parent):
    N = len(parent)
    m = np.zeros((N, N), bool)
    for i in range(N):
        j = i
        while j >= 0:
            m[i, j] = True
            j = parent[j]
    return m


def depths(parent):
    d = []
    for i, p in enumerate(parent):
        d.append(0 if p < 0 else d[p] + 1)
    return d


def path_to(parent, node):
    out = []
    while node >= 0:
        out.append(node)
        node = parent[node]
    return out[::-1]


def rel(got, want):
    want = np.asarray(want, np.float64)
    return float(np.abs(np.asarray(got, np.float64) - want).max() / max(np.abs(want).max(), 1.0))


# storage -> bound on rel() (fp32 arithmetic; fp16 K/V: 2^-11 per element; int8: 1/254 of a block's max)
STORAGE = {("float32", None): 2e-5, ("float16", None): 4e-3, ("int8", None): 6e-2, ("int8", "float16"): 6e-2,
           ("float16", "int8"): 6e-2}
# the same against K and V stored as the cache stores them (Oracle.call's storage): what is left is
# fp32 arithmetic and a rare element whose fp32 value sits on the other side of a rounding boundary
# (one binary16 ulp, or one int8 code of its block)
AS_STORED = {("float32", None): 2e-5, ("float16", None): 2e-3, ("int8", None): 6e-3, ("int8", "float16"): 6e-3,
             ("float16", "int8"): 6e-3}
VARIANTS = ["plain", "rope_halves", "rope_interleaved", "rope_partial", "alibi", "modern", "extra", "temperature"]


def make_layer(rng, variant, h, g, d=8, d_model=None):
    cfg = dict(d_model=d_model or (h * d if rng.random() < 0.5 else 24), n_heads=h, n_kv_heads=g, d_k=d, d_v=d)
    if variant.startswith("rope"):
        cfg["rope"] = {"pairing": "interleaved" if variant == "rope_interleaved" else "halves", "theta": 100.0}
        if variant == "rope_partial":
            cfg["rope"]["dim"] = d // 2
    elif variant == "alibi":
        cfg["alibi"] = True
    elif variant == "modern":
        cfg.update(softcap=3.0, sinks=True, qk_norm="rms", qk_norm_per_head=bool(rng.random() < 0.5),
                   clip_qkv=2.5, rope={"pairing": "halves", "theta": 50.0})
    elif variant == "extra":
        cfg.update(add_bias_kv=True, add_zero_attn=True)
    elif variant == "temperature":  # Llama 4's NoPE layers: the query scaled by its position
        cfg.update(temperature_floor=3, temperature_scale=0.4)
    layer = mha.Layer(**cfg)
    w = {k: rng.uniform(-0.7, 0.7, v.shape).astype(np.float32) for k, v in layer.weights().items()}
    if "alibi_slopes" in w:
        w["alibi_slopes"] = np.abs(w["alibi_slopes"]) * 0.5 + 0.05
    for k in ("q_norm", "k_norm"):
        if k in w:
            w[k] = w[k] + 1.0
    layer.set_weights(w)
    return layer


class Seq:
    """What sequence b of the cache holds, for the oracle: x rows and positions."""

    def __init__(self, D):
        self.x, self.pos = np.zeros((0, D)), []

    def add(self, rows, pos):
        self.x = np.concatenate([self.x, np.asarray(rows, np.float64).reshape(len(pos), self.x.shape[1])])
        self.pos = self.pos + [int(p) for p in pos]

    def copy(self):
        s = Seq(self.x.shape[1])
        s.x, s.pos = self.x.copy(), list(self.pos)
        return s


def run_case(seed, storage, variant=None, shape=None):
    """One random session: prefill, then rounds of (tree verify, check,
    compact, check the lengths, decode steps, sometimes copy / reorder).
    Returns the worst rel() and a description."""
    rng = np.random.default_rng(seed)
    h, g = shape or [(4, 4), (4, 2), (4, 1), (2, 1)][rng.integers(4)]
    variant = variant or str(rng.choice(VARIANTS))
    layer = make_layer(rng, variant, h, g)
    spec = Oracle(layer)
    D = layer.d_model
    has_pos = variant.startswith("rope") or variant in ("alibi", "modern", "temperature")
    B = int(rng.integers(1, 4))
    window = int(rng.choice([0, 0, 5, 8, 40]))
    n_sink = int(rng.integers(0, 5)) if window else 0
    cap = 200 if not window else window + n_sink + (int(rng.integers(0, 8)) if rng.random() < 0.7 else 48)
    piece = cap - n_sink - window + 1 if window else 10 ** 9
    left = int(rng.integers(2, 7)) if rng.random() < 0.25 else None
    chunk = int(rng.integers(3, 8)) if not n_sink and rng.random() < 0.25 else 0
    kt, vt = storage
    cache = mha.Cache(layer, batch=B, capacity=cap, dtype=kt, v_dtype=vt, window=window, sink_tokens=n_sink)
    seqs = [Seq(D) for _ in range(B)]
    what = dict(variant=variant, h=h, g=g, B=B, window=window, n_sink=n_sink, cap=cap, left=left, chunk=chunk)
    worst = worst_model = 0.0
    kw = dict(window_left=left, chunk_size=chunk)
    model = storage if storage != ("float32", None) else (None, None)

    def check_rows(got, *args):
        """rel() of y rows against the exact oracle (worst) and against the
        oracle that stores K, V as the cache does (worst_model); returns
        the latter's (y, z, probs)."""
        nonlocal worst, worst_model
        exact = spec.call(*args)
        as_stored = spec.call(*args, storage=model) if model[0] else exact
        worst = max(worst, rel(got, exact[0]))
        worst_model = max(worst_model, rel(got, as_stored[0]))
        return as_stored

    def plain_step(T):
        nonlocal worst
        x = rng.standard_normal((B, T, D)).astype(np.float32)
        n_new = rng.integers(0, T + 1, B) if B > 1 and rng.random() < 0.4 else np.full(B, T)
        y = cache.forward(layer, x, n_new=n_new.tolist(), **kw)
        for b in range(B):
            nb = int(n_new[b])
            if not nb:
                continue
            s = seqs[b]
            base = len(s.pos)
            check_rows(y[b, :nb], s.x, s.pos, x[b, :nb], list(range(base, base + nb)),
                       np.tril(np.ones((nb, nb), bool)), window, n_sink, left, chunk)
            s.add(x[b, :nb], range(base, base + nb))
            assert not y[b, nb:].any()

    plain_step(int(rng.integers(1, 9)))
    for _ in range(int(rng.integers(2, 5))):
        # mostly small trees; sometimes one of more than 32 query rows a kv head (two decode units)
        N = int(rng.integers(1, 9)) if rng.random() < 0.85 else int(rng.integers(20, 41))
        if not window and max(len(s.pos) for s in seqs) + N + 8 > cap:
            break
        shared = rng.random() < 0.3
        parents = [random_parents(rng, N)] * B if shared else [random_parents(rng, N) for _ in range(B)]
        masks = np.stack([tree_mask(p) for p in parents])
        n_new = rng.integers(0, N + 1, B) if B > 1 and rng.random() < 0.4 else np.full(B, N)
        x = rng.standard_normal((B, N, D)).astype(np.float32)
        base = [len(s.pos) for s in seqs]
        pos = np.array([[base[b] + d for d in depths(parents[b])] for b in range(B)], np.int32)
        call = dict(kw, keep_mask=masks[:1] if shared else masks, n_new=n_new.tolist())
        if has_pos:
            call["positions"] = pos
        # column s is cache slot s: position s without a window; on a ring each
        # key a query may attend holds a slot of its own while the call fits one piece
        probs_ok = not window or max(n_new) <= piece
        cap_names = ["z", "probs"] if probs_ok and rng.random() < 0.5 else (["z"] if rng.random() < 0.3 else [])
        try:
            out = cache.forward(layer, x, capture=cap_names, **call) if cap_names else cache.forward(layer, x, **call)
        except mha.ArgumentError as e:
            # only a tree longer than a ring's piece may be refused, naming the token; nothing stored
            assert window and N > piece, (what, str(e))
            assert "expected at most" in str(e) and "new tokens per call with a tree mask" in str(e), str(e)
            assert cache.lengths() == base
            continue
        y, caps = out if cap_names else (out, {})
        for b in range(B):
            nb = int(n_new[b])
            if not nb:
                assert not y[b].any()
                continue
            s = seqs[b]
            _, z, pr = check_rows(y[b, :nb], s.x, s.pos, x[b, :nb], pos[b, :nb], masks[b][:nb, :nb], window, n_sink,
                                  left, chunk)
            assert not y[b, nb:].any()
            if "z" in caps:
                worst_model = max(worst_model, rel(caps["z"][b, :nb], z))
                assert not caps["z"][b, nb:].any()
            if "probs" in caps:
                got = caps["probs"][b]                           # (h, T, cap + extra)
                n_x = pr.shape[2] - base[b] - nb
                full = np.zeros((h, nb, cap + n_x))
                for k in range(base[b] + nb):  # position k -> its slot
                    full[:, :, k if k < n_sink or not window else n_sink + (k - n_sink) % (cap - n_sink)] += pr[:, :, k]
                full[:, :, cap:] = pr[:, :, base[b] + nb:]
                worst_model = max(worst_model, float(np.abs(got[:, :nb] - full).max()))
                if not window:
                    hidden = ~masks[b][:nb, :nb]                 # keys the tree hides: exactly 0
                    assert not got[:, :nb, base[b]:base[b] + nb][:, hidden].any()
        # accept a random path (or none) per sequence
        for b in range(B):
            nb = int(n_new[b])
            node = int(rng.integers(-1, nb)) if nb else -1
            path = path_to(parents[b], node) if node >= 0 else []
            try:
                cache.compact(b, base[b], path)
            except mha.ArgumentError as e:
                assert window and nb > piece + len(path), (what, str(e))
                cache.reset(b)
                seqs[b] = Seq(D)
                continue
            assert cache.length(b) == base[b] + len(path)
            seqs[b].add(x[b, path], [base[b] + i for i in range(len(path))])
        for _ in range(int(rng.integers(0, 3))):
            plain_step(int(rng.integers(1, 4)))
        r = rng.random()
        if r < 0.2:  # a copy continues as the original does
            other = cache.copy()
            xn = rng.standard_normal((B, 2, D)).astype(np.float32)
            a, b2 = cache.forward(layer, xn, **kw), other.forward(layer, xn, **kw)
            assert np.array_equal(a, b2)
            for b in range(B):
                bs = len(seqs[b].pos)
                seqs[b].add(xn[b], range(bs, bs + 2))
            other.close()
        elif r < 0.35 and B > 1:
            src = rng.integers(0, B, B)
            cache.reorder(src.tolist())
            seqs = [seqs[s].copy() for s in src]
        assert cache.lengths() == [len(s.pos) for s in seqs]
    plain_step(1)  # one more token after the last round
    cache.close()
    what["as_stored"] = worst_model
    return worst, what


@pytest.mark.parametrize("storage", list(STORAGE), ids=lambda s: "/".join(x for x in s if x))
def test_random_trees_against_the_oracle(storage):
    tol = STORAGE[storage]
    for i in range(CASES * 3):
        worst, what = run_case(9000 + 31 * i + 7 * list(STORAGE).index(storage), storage)
        name = "/".join(x for x in storage if x)
        note(name, worst)
        note(name + " against K, V stored as the cache does", what["as_stored"])
        assert worst <= tol, f"case {i} {what}: {worst:.3g} > {tol}"
        assert what["as_stored"] <= AS_STORED[storage], f"case {i} {what}: as stored > {AS_STORED[storage]}"


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_variant_fp32(variant):
    for i in range(max(1, CASES // 2)):
        worst, what = run_case(500 + 13 * i + VARIANTS.index(variant), ("float32", None), variant=variant)
        note(f"variant {variant}", worst)
        assert worst <= 2e-5, f"{what}: {worst:.3g}"


def test_every_kernel_set(kernels):
    for i in range(max(1, CASES // 2)):
        worst, what = run_case(77 + i, ("float32", None))
        note(f"kernels={kernels}", worst)
        assert worst <= 2e-5, f"{kernels} {what}: {worst:.3g}"
        worst, what = run_case(177 + i, ("int8", "float16"), shape=(4, 1))  # MQA: the grouped kernels
        assert worst <= 6e-2, f"{kernels} {what}: {worst:.3g}"


# ------------------------------------------------------- targeted cases
def plain_layer(seed=3, h=2, d_model=16):
    return make_layer(np.random.default_rng(seed), "plain", h, h, d_model // h, d_model)


def test_window_counts_along_the_path_not_the_cache_index():
    """A second root of the tree (cache index base+1, depth 0) decodes as the
    next token would: window 4 reaches base-3, not base-2 (the defect: its
    sibling's index hid prefix token base-3)."""
    layer = plain_layer()
    rng = np.random.default_rng(1)
    x = rng.standard_normal((13, 16)).astype(np.float32)
    for window, sinks in ((4, 0), (4, 1), (5, 2)):
        c = mha.Cache(layer, capacity=window + sinks + 3, window=window, sink_tokens=sinks)
        c.forward(x[:10])
        y = c.forward(x[10:13], keep_mask=np.array([[1, 0, 0], [0, 1, 0], [0, 1, 1]], bool))
        for i, path in ((1, [11]), (2, [11, 12])):
            s = mha.Cache(layer, capacity=window + sinks + 3, window=window, sink_tokens=sinks)
            s.forward(x[:10])
            want = s.forward(x[path])[-1]
            assert np.abs(y[i] - want).max() <= 1e-5, (window, sinks, i)


def test_window_left_and_chunk_count_along_the_path():
    layer = plain_layer(5)
    rng = np.random.default_rng(2)
    x = rng.standard_normal((14, 16)).astype(np.float32)
    m = np.array([[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0], [0, 0, 1, 1]], bool)  # three roots, then a child
    for opt in (dict(window_left=2), dict(chunk_size=4), dict(chunk_size=3, window_left=1)):
        c = mha.Cache(layer, capacity=32)
        c.forward(x[:10], **opt)
        y = c.forward(x[10:14], keep_mask=m, **opt)
        for i, path in ((1, [11]), (2, [12]), (3, [12, 13])):
            s = mha.Cache(layer, capacity=32)
            s.forward(x[:10], **opt)
            want = s.forward(x[path], **opt)[-1]
            assert np.abs(y[i] - want).max() <= 1e-5, (opt, i)


def test_a_chain_mask_is_plain_causal_over_many_ring_pieces(kernels):
    """A lower-triangular mask of 300 tokens on a ring (pieces of 9): the
    same numbers as the call without a mask."""
    rng = np.random.default_rng(4)
    layer = make_layer(rng, "alibi", 4, 2)
    x = rng.standard_normal((2, 300, layer.d_model)).astype(np.float32)
    a = mha.Cache(layer, batch=2, capacity=16, window=8, sink_tokens=1)
    b = mha.Cache(layer, batch=2, capacity=16, window=8, sink_tokens=1)
    a.forward(x[:, :5])
    b.forward(x[:, :5])
    ya = a.forward(x[:, 5:], keep_mask=np.tril(np.ones((295, 295), bool)), n_new=[295, 200])
    yb = b.forward(x[:, 5:], n_new=[295, 200])
    assert np.array_equal(ya, yb)


def test_tree_longer_than_a_ring_piece():
    """Ring of 8 slots, window 4: pieces of 5. A root at new token 5 needs a
    prefix key the second piece overwrites: refused by name, nothing stored.
    A tree whose late tokens are deep enough fits: answered right."""
    layer = plain_layer(6)
    rng = np.random.default_rng(3)
    x = rng.standard_normal((12, 16)).astype(np.float32)
    c = mha.Cache(layer, capacity=8, window=4)
    c.forward(x[:4])
    m = np.tril(np.ones((6, 6), bool))
    m[5, :5] = False
    with pytest.raises(mha.ArgumentError, match="new token 5 of sequence 0 sees 1 new tokens of the keep_mask"):
        c.forward(x[4:10], keep_mask=m)
    assert c.lengths() == [4]
    m[5, 2:5] = True  # depth 3 (sees 2, 3, 4): its window starts at its own chain
    y = c.forward(x[4:10], keep_mask=m)
    want = Oracle(layer).call(x[:4], range(4), x[4:10], range(4, 10), m, window=4)[0]
    assert rel(y, want) <= 2e-5


def test_mask_rows_without_keys_and_general_masks():
    """A row with its diagonal off and nothing cached: no key (y = b_o, as
    masked_row 'zero'); with add_zero_attn it attends the zero key. A mask
    that is not a tree closure (a token seeing a grandparent but not its
    parent) follows the rule too."""
    rng = np.random.default_rng(8)
    for variant in ("plain", "extra", "modern"):
        layer = make_layer(rng, variant, 4, 2)
        spec = Oracle(layer)
        x = rng.standard_normal((5, layer.d_model)).astype(np.float32)
        m = np.array([[0, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 0, 0, 0, 0], [1, 0, 1, 1, 0], [0, 1, 0, 1, 1]], bool)
        for window in (0, 3):
            c = mha.Cache(layer, capacity=16, window=window)
            y = c.forward(x, keep_mask=m)
            want = spec.call(np.zeros((0, layer.d_model)), [], x, range(5), m, window=window)[0]
            assert rel(y, want) <= 2e-5, (variant, window)


def test_rounds_with_probs_every_storage_and_mixed_trees():
    """Several rounds on one cache with both sequences' trees differing, one
    of them using only part of its tree (n_new), probabilities captured."""
    for storage, tol in STORAGE.items():
        for seed in range(2):
            worst, what = run_case(4242 + seed, storage, variant="rope_halves", shape=(4, 2))
            assert worst <= tol, (storage, what, worst)


# ------------------------------------------------------- hostile inputs
@pytest.fixture
def small():
    layer = plain_layer(9, h=2, d_model=16)
    rng = np.random.default_rng(0)
    return layer, rng.standard_normal((2, 4, 16)).astype(np.float32)


@pytest.mark.parametrize("mask, exc, msg", [
    (np.ones((4, 3), bool), mha.ShapeError, r"keep_mask has shape \(4,3\)"),
    (np.ones((3, 4, 4), bool), mha.ShapeError, "keep_mask has shape"),
    (np.ones((1, 1, 4, 4), bool), mha.ShapeError, "keep_mask has shape"),
    (np.ones(4, bool), mha.ShapeError, "keep_mask has shape"),
    (np.ones((0, 0), bool), mha.ShapeError, "keep_mask has shape"),
    (np.ones((4, 4), np.float32), mha.DTypeError, "keep_mask"),
    (np.ones((4, 4), np.int64), mha.DTypeError, "keep_mask"),
    (np.ones((4, 4), np.int8), mha.DTypeError, "keep_mask"),
    (np.triu(np.ones((4, 4), np.uint8) * 9), mha.ArgumentError, r"keep_mask\[0\]\[0\]\[1\] = 1"),
])
def test_bad_masks_are_refused_and_store_nothing(small, mask, exc, msg):
    layer, x = small
    c = mha.Cache(layer, batch=2, capacity=16)
    with pytest.raises(exc, match=msg):
        c.forward(layer, x, keep_mask=mask)
    assert c.lengths() == [0, 0]


def test_mask_values_and_layouts(small):
    """uint8 values other than 0/1 count as 'keep'; non-contiguous and
    reversed-stride views give the numbers of their contiguous copy; a
    per-sequence mask entry above the diagonal names the sequence."""
    layer, x = small
    tri = np.tril(np.ones((4, 4), bool))
    tri[3, 1] = False
    ref = mha.Cache(layer, batch=2, capacity=16).forward(layer, x, keep_mask=tri)
    big = np.zeros((4, 8), np.uint8)
    big[:, ::2] = tri * np.array([1, 7, 200, 255], np.uint8)[:, None]
    flip = np.ascontiguousarray(tri[::-1])[::-1]
    for m in (big[:, ::2], flip, tri.T.T, np.broadcast_to(tri, (2, 4, 4))):
        got = mha.Cache(layer, batch=2, capacity=16).forward(layer, x, keep_mask=m)
        assert np.array_equal(got, ref)
    per = np.stack([tri, tri])
    per[1, 0, 2] = True
    c = mha.Cache(layer, batch=2, capacity=16)
    with pytest.raises(mha.ArgumentError, match=r"keep_mask\[1\]\[0\]\[2\] = 1"):
        c.forward(layer, x, keep_mask=per)
    # an entry above the diagonal past n_new is not read
    per = np.stack([tri, tri])
    per[1, 2, 3] = True
    c.forward(layer, x, keep_mask=per, n_new=[4, 3])
    assert c.lengths() == [4, 3]


def test_nan_huge_t_and_empty_calls(small):
    layer, x = small
    c = mha.Cache(layer, batch=2, capacity=16)
    bad = x.copy()
    bad[1, 2, 5] = np.nan
    with pytest.raises(mha.NonFiniteError, match="sequence 1"):
        c.forward(layer, bad, keep_mask=np.eye(4, dtype=bool))
    assert c.lengths() == [0, 0]
    big = np.zeros((2, 40, 16), np.float32)
    with pytest.raises(mha.ArgumentError, match="capacity"):
        c.forward(layer, big, keep_mask=np.tril(np.ones((40, 40), bool)))
    y = c.forward(layer, x, keep_mask=np.eye(4, dtype=bool), n_new=[0, 0])
    assert not y.any() and c.lengths() == [0, 0]
    # a long tree on a ring: refused or right, never a crash
    r = mha.Cache(layer, batch=2, capacity=40, window=8)
    r.forward(layer, x)
    T = 600
    xx = np.random.default_rng(1).standard_normal((2, T, 16)).astype(np.float32)
    parent = random_parents(np.random.default_rng(2), T)
    with pytest.raises(mha.ArgumentError, match="new tokens per call with a tree mask"):
        r.forward(layer, xx, keep_mask=tree_mask(parent))
    assert r.lengths() == [4, 4]


def test_bad_compactions_change_nothing(small):
    layer, x = small
    c = mha.Cache(layer, batch=2, capacity=16)
    c.forward(layer, x)
    for b, first, keep, exc in [
        (0, 1, [2, 1], mha.ArgumentError), (0, 1, [1, 1], mha.ArgumentError), (0, 1, [-1], mha.ArgumentError),
        (0, 1, [3], mha.ArgumentError), (0, 0, [0, 1, 2, 3, 4], mha.ArgumentError), (0, -1, [0], mha.ArgumentError),
        (0, 5, [], mha.ArgumentError), (2, 0, [0], mha.ArgumentError), (-1, 0, [0], mha.ArgumentError),
        (0, 0, [2 ** 40], mha.MhaError), (0, 0, [0.0, 1.0], mha.ShapeError), (0, 0, [True], mha.ShapeError),
        (0, 0, [[0]], mha.ShapeError), (0, 0, "01", mha.MhaError), (0, 2 ** 33, [0], mha.MhaError),
    ]:
        with pytest.raises(exc):
            c.compact(b, first, keep)
        assert c.lengths() == [4, 4], (b, first, keep)
    after = c.copy()
    y1 = c.forward(layer, x[:, :1])
    y2 = after.forward(layer, x[:, :1])
    assert np.array_equal(y1, y2)  # nothing moved by the refused compactions


def test_compaction_after_eviction_and_on_a_cross_cache(small):
    layer, x = small
    r = mha.Cache(layer, capacity=6, window=3)
    xs = np.random.default_rng(5).standard_normal((12, 16)).astype(np.float32)
    r.forward(layer, xs[:4])
    r.forward(layer, xs[4:8])  # positions 2.. stored
    with pytest.raises(mha.ArgumentError, match="expected first >= "):
        r.compact(0, 0, [1, 2])
    with pytest.raises(mha.ArgumentError, match="needs position"):
        r.compact(0, 2, [0])  # the next window needs evicted positions
    assert r.lengths() == [8]
    r.compact(0, 6, [1])
    assert r.lengths() == [7]
    cr = mha.Cache(layer, capacity=8, cross=True)
    cr.set_memory(xs[:5])
    with pytest.raises(mha.ArgumentError, match="cross-attention memory"):
        cr.compact(0, 0, [1])
    with pytest.raises(mha.MhaError, match="keep_mask on a cross-attention memory"):
        cr.forward(layer, xs[:2], keep_mask=np.eye(2, dtype=bool))
    assert cr.lengths() == [5]


def test_thread_counts_give_the_same_bits():
    """The decode split depends on the chunks alone: a 40-token tree on a
    window of 48 (two decode units a kv head) and its compaction give the
    same bits at 1 and 3 threads."""
    rng = np.random.default_rng(12)
    layer = make_layer(rng, "alibi", 4, 4)
    x = rng.standard_normal((2, 140, layer.d_model)).astype(np.float32)
    parent = [i - 1 if i < 20 or i % 2 else -1 for i in range(40)]
    pos = np.array([[100 + d for d in depths(parent)]] * 2, np.int32)
    before = mha.get_num_threads()
    outs = []
    try:
        for nt in (1, 3):
            mha.set_num_threads(nt)
            c = mha.Cache(layer, batch=2, capacity=200, window=48, dtype="int8")
            ys = [c.forward(x[:, :100]), c.forward(x[:, 100:], keep_mask=tree_mask(parent), positions=pos)]
            c.compact(0, 100, path_to(parent, 39))
            c.compact(1, 100, path_to(parent, 38))
            ys.append(c.forward(x[:, :1]))
            outs.append(ys)
    finally:
        mha.set_num_threads(before)
    for a, b in zip(*outs):
        assert np.array_equal(a, b)


def test_general_masks_on_tiny_rings():
    """Random lower-triangular masks (diagonals on or off, not tree closures)
    on rings of a few slots with sink tokens, window_left and chunk_size,
    after a prefix: each call is answered as the oracle says (probabilities
    too, without a window) or refused by name with nothing stored; on a
    ring of window + sinks + T - 1 slots or more, never refused. Found the
    defects of a new token at a sink's position on its path (overwritten
    in a ring piece) and of a row's window start clamped to the oldest
    stored cache position (its own key masked)."""
    rng = np.random.default_rng(31)
    layer = make_layer(rng, "alibi", 2, 1, 8, 16)
    spec = Oracle(layer)
    answered = 0
    for _ in range(CASES * 40):
        W = int(rng.integers(0, 6))
        ns = int(rng.integers(0, 4)) if W else 0
        T = int(rng.integers(1, 13))
        roomy = rng.random() < 0.25
        cap = (W + ns + (T - 1 if roomy else int(rng.integers(0, 4)))) if W else 40
        left = int(rng.integers(0, 5)) if rng.random() < 0.3 else None
        chunk = int(rng.integers(1, 6)) if not ns and rng.random() < 0.3 else 0
        P = int(rng.integers(0, 9))
        m = np.tril(rng.random((T, T)) < rng.uniform(0.2, 0.95))
        if rng.random() < 0.7:
            np.fill_diagonal(m, True)
        x = rng.standard_normal((P + T, 16)).astype(np.float32)
        c = mha.Cache(layer, capacity=max(cap, 1), window=W, sink_tokens=ns)
        kw = dict(window_left=left, chunk_size=chunk)
        if P:
            c.forward(x[:P], **kw)
        try:
            y, cp = c.forward(x[P:], keep_mask=m, capture=["probs"], **kw)
        except mha.ArgumentError as e:
            assert W and not roomy and "new tokens per call with a tree mask" in str(e), str(e)
            assert c.lengths() == [P]
            continue
        want, _, pr = spec.call(x[:P], range(P), x[P:], range(P, P + T), m, window=W, n_sink=ns, left=left,
                                chunk=chunk)
        what = dict(W=W, ns=ns, cap=cap, P=P, T=T, left=left, chunk=chunk, mask=m.astype(int).tolist())
        assert rel(y, want) <= 2e-5, what
        if not W:
            full = np.zeros_like(cp["probs"])
            full[:, :, :P + T] = pr
            assert np.abs(full - cp["probs"]).max() <= 2e-5, what
        answered += 1
    assert answered >= CASES * 10
