"""Tree speculative decoding through the binding: Cache.forward(keep_mask=)
verifies a tree of draft tokens in one call, Cache.compact keeps the
accepted path, and decoding goes on.

Oracles: a float64 numpy attention over the whole token list with the
mask written out from the tree (independent of libmha: projections,
grouped heads, softmax and W_O in numpy), and, for RoPE, the library's
reference path over the same token list with keep_mask and positions.
Tolerance as test_cache.py's fp32 cache: 1e-5 x max(1, max|ref|).
Legend: B sequences, P prefix tokens, N tree tokens.
"""
import pytest

from conftest import require

np = require("numpy")
import mha  # noqa: E402
from test_cache import err_scale, random_layer  # noqa: E402

TOL32 = 1e-5
# parents of the tree tokens (-1: child of the prefix's last token), parents first
PARENTS = [[-1, 0, 0, 1, 2, 4], [-1, -1, 0, 1, 2, 3]]
PATHS = [[0, 2, 4], [1, 3]]


def ancestors(parent, i):
    out = set()
    while i >= 0:
        out.add(i)
        i = parent[i]
    return out


def tree_mask(parent):
    n = len(parent)
    return np.array([[j in ancestors(parent, i) for j in range(n)] for i in range(n)])


def depths(parent):
    return [len(ancestors(parent, i)) - 1 for i in range(len(parent))]


def attend64(w, c, x, allow):
    """y (S,d_model) of one sequence x (S,d_model) where row i attends the
    rows allow[i] marks (bool (S,S)), in float64."""
    h, g, dk, dv = c["n_heads"], c["n_kv_heads"], c["d_k"], c["d_v"]
    x = x.astype(np.float64)
    get = lambda n, size: w[n].astype(np.float64) if n in w else np.zeros(size)  # noqa: E731
    q = (x @ w["w_q"].astype(np.float64) + get("b_q", h * dk)).reshape(-1, h, dk)
    k = (x @ w["w_k"].astype(np.float64) + get("b_k", g * dk)).reshape(-1, g, dk)
    v = (x @ w["w_v"].astype(np.float64) + get("b_v", g * dv)).reshape(-1, g, dv)
    z = np.zeros((x.shape[0], h, dv))
    for r in range(h):
        kv = r // (h // g)
        s = q[:, r] @ k[:, kv].T / np.sqrt(dk)
        s = np.where(allow, s, -np.inf)
        p = np.exp(s - s.max(axis=1, keepdims=True))
        z[:, r] = (p / p.sum(axis=1, keepdims=True)) @ v[:, kv]
    return z.reshape(x.shape[0], h * dv) @ w["w_o"].astype(np.float64) + get("b_o", c["d_model"])


def full_allow(P, parent):
    """(P+N, P+N): the prefix causal, every tree token sees the prefix and its ancestors."""
    n = len(parent)
    allow = np.tril(np.ones((P + n, P + n), dtype=bool))
    allow[P:, P:] = tree_mask(parent)
    return allow


def test_tree_verify_accept_continue_matches_numpy(kernels):
    rng = np.random.default_rng(17)
    layer, w, c = random_layer(rng, d_model=32, n_heads=8, n_kv_heads=2)
    B, P, N, D = 2, 7, 6, c["d_model"]
    xp = rng.standard_normal((B, P, D)).astype(np.float32)
    xt = rng.standard_normal((B, N, D)).astype(np.float32)
    xn = rng.standard_normal((B, 1, D)).astype(np.float32)
    masks = np.stack([tree_mask(p) for p in PARENTS])
    with mha.Cache(layer, batch=B, capacity=32) as cache:
        cache.forward(layer, xp)
        yt = cache.forward(layer, xt, keep_mask=masks)
        for b in range(B):
            want = attend64(w, c, np.concatenate([xp[b], xt[b]]), full_allow(P, PARENTS[b]))[P:]
            err, scale = err_scale(yt[b], want)
            assert err <= TOL32 * scale, (b, err)
            cache.compact(b, P, PATHS[b])
        assert cache.lengths() == [P + len(p) for p in PATHS]
        yn = cache.forward(layer, xn)
        for b in range(B):
            seq = np.concatenate([xp[b], xt[b][PATHS[b]], xn[b]])
            want = attend64(w, c, seq, np.tril(np.ones((len(seq), len(seq)), dtype=bool)))[-1:]
            err, scale = err_scale(yn[b], want)
            assert err <= TOL32 * scale, (b, err)


def test_tree_with_rope_positions_matches_the_reference_path():
    """RoPE: each tree token at position P + depth; after the compaction the
    path's positions are P, P+1, ... and decoding continues from there."""
    rng = np.random.default_rng(5)
    layer, _, c = random_layer(rng, d_model=32, n_heads=4, n_kv_heads=2, rope=dict(pairing="halves"))
    P, N, D, parent = 5, 6, c["d_model"], PARENTS[0]
    x = rng.standard_normal((P + N + 1, D)).astype(np.float32)
    pos = np.array(list(range(P)) + [P + d for d in depths(parent)], dtype=np.int32)
    with mha.Cache(layer, capacity=16) as cache:
        cache.forward(x[:P])
        yt = cache.forward(x[P:P + N], keep_mask=tree_mask(parent), positions=pos[P:])
        want = layer.forward(x[None, :P + N], keep_mask=full_allow(P, parent), positions=pos[None],
                             path="reference")[0, P:]
        err, scale = err_scale(yt, want)
        assert err <= TOL32 * scale, err
        path = PATHS[0]
        cache.compact(0, P, path)
        y_next = cache.forward(x[P + N:])
        seq = np.concatenate([x[:P], x[P:P + N][path], x[P + N:]])
        want = layer.forward(seq[None], causal=True, path="reference")[0, -1:]
        err, scale = err_scale(y_next, want)
        assert err <= TOL32 * scale, err


def test_tree_refusals_name_the_problem_and_keep_the_cache():
    rng = np.random.default_rng(2)
    layer, _, c = random_layer(rng, d_model=32, n_heads=4)
    x = rng.standard_normal((2, 4, c["d_model"])).astype(np.float32)
    cache = mha.Cache(layer, batch=2, capacity=16)
    bad = np.eye(4, dtype=bool)
    bad[1, 3] = True
    with pytest.raises(mha.ArgumentError, match=r"keep_mask\[0\]\[1\]\[3\] = 1"):
        cache.forward(layer, x, keep_mask=bad)
    assert cache.lengths() == [0, 0]
    with pytest.raises(mha.ShapeError, match=r"keep_mask has shape \(4,3\); expected \(T=4,T=4\)"):
        cache.forward(layer, x, keep_mask=np.ones((4, 3), dtype=bool))
    with pytest.raises(mha.ShapeError, match="keep_mask has shape"):
        cache.forward(layer, x, keep_mask=np.ones((3, 4, 4), dtype=bool))
    with pytest.raises(mha.DTypeError, match="keep_mask"):
        cache.forward(layer, x, keep_mask=np.ones((4, 4), dtype=np.float32))
    cache.forward(layer, x, keep_mask=np.tril(np.ones((4, 4), dtype=bool)))  # a chain: plain causal
    with pytest.raises(mha.ArgumentError, match=r"keep\[1\]=0; expected strictly increasing"):
        cache.compact(0, 1, [1, 0])
    with pytest.raises(mha.ArgumentError, match="first=5 for sequence 1"):
        cache.compact(1, 5, [0])
    with pytest.raises(mha.ShapeError, match="expected a list of integer indices"):
        cache.compact(0, 1, [[1]])
    assert cache.lengths() == [4, 4]
    cache.compact(0, 1, [])  # nothing kept: a truncate
    cache.compact(1, 1, np.array([0, 2]))
    assert cache.lengths() == [1, 3]
