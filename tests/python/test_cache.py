"""mha.Cache (the KV cache through the binding) against one causal
Layer.forward over the whole sequence on the reference path, and against
torch.nn.MultiheadAttention with a causal mask.

Tolerances:
- fp32 cache: max|cached - ref| <= 1e-5 x max(1, max|ref|) (TOL32): both
  are fp32 computations of the same sums in different orders.
- fp16 cache: TOL32 plus the first-order effect of rounding K and V to
  binary16 (u = 2^-11, relative), computed from each test's data
  (fp16_bound): a score moves by at most E_s = u * scale * max sum_c
  |q_c k_c|, so z moves by at most max|v| * (u + 2 E_s) (the V rounding,
  plus the softmax's response to the score changes, sum_j p_j |ds_j -
  E_p ds| <= 2 E_s), and y by that times max_o sum_c |W_O[c,o]|; x 1.5 for
  second-order terms. That worst case is loose (about 0.2 x the output
  scale here), so the test also asserts the error is at most TOL32 plus
  1.5 x the effect fp16 rounding of K and V has on this data in float64
  arithmetic (cache_oracle.attend64 with and without the rounding; the 1.5
  covers the few elements whose fp32 projection rounds to the other
  binary16 neighbour than the float64 one; measured: the cache's error
  equals the effect to 3 digits, 1.2e-3 to 1.5e-3 at output scale 4-5).
  test_cache_oracle.py checks the cache against the rounded float64 oracle
  itself, tightly enough that truncation instead of rounding fails.
"""
import gc

import pytest

from conftest import require

np = require("numpy")
import mha  # noqa: E402
from cache_oracle import attend64  # noqa: E402

TOL32 = 1e-5
U16 = 2.0 ** -11

CONFIGS = {  # h / h_kv = 1, 4, 4 (MQA with extra keys)
    "mha": dict(d_model=32, n_heads=4),
    "gqa": dict(d_model=32, n_heads=8, n_kv_heads=2),
    "mqa": dict(d_model=32, n_heads=4, n_kv_heads=1, add_bias_kv=True, add_zero_attn=True),
}


# ------------------------------------------------------------------ helpers

def random_layer(rng, **cfg):
    """A layer with every weight and bias random: W ~ U(+-2/sqrt(fan_in)) so
    attention is peaked enough that a wrong key set shows, biases ~ U(+-1)."""
    layer = mha.Layer(**cfg)
    c = layer.config
    w = {}
    for name, shape in mha.Layer._weight_shapes(type("C", (), c)).items():
        if name.startswith("b_") and not c["bias"] or name.startswith("bias_") and not c["add_bias_kv"]:
            continue
        bound = 2.0 / np.sqrt(shape[0]) if name.startswith("w_") else 1.0
        w[name] = rng.uniform(-bound, bound, shape).astype(np.float32)
    layer.set_weights(w)
    return layer, w, c


def reference(layer, x, **opt):
    """One causal forward over the whole sequence x (B,S,d_model): the oracle."""
    return layer.forward(x, causal=True, path="reference", **opt)


def err_scale(got, want):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape, f"shape {got.shape}, want {want.shape}"
    return float(np.abs(got - want).max()), max(1.0, float(np.abs(want).max()))


def assert_close(got, want, what, tol=None):
    err, scale = err_scale(got, want)
    limit = TOL32 * scale if tol is None else tol
    assert err <= limit, f"{what}: max abs error {err:.3g} > {limit:.3g}"


def fp16_bound(w, c, x):
    """The first-order bound on |y_fp16cache - y_fp32| stated in the module
    docstring, in float64 from the weights and the inputs x (B,S,d_model)."""
    h, g, dk, dv = c["n_heads"], c["n_kv_heads"], c["d_k"], c["d_v"]
    x = x.astype(np.float64)
    get = lambda n, size: w[n].astype(np.float64) if n in w else np.zeros(size)  # noqa: E731
    q = (x @ w["w_q"] + get("b_q", h * dk)).reshape(*x.shape[:2], h, dk)
    k = (x @ w["w_k"] + get("b_k", g * dk)).reshape(*x.shape[:2], g, dk)
    v = x @ w["w_v"] + get("b_v", g * dv)
    vmax = max(float(np.abs(v).max()), float(np.abs(get("bias_v", 1)).max()))
    rep = h // g
    # max over heads r, queries t, keys s of sum_c |q_trc k_s,g(r),c| (all pairs: an upper bound)
    qk = np.einsum("btrc,bsrc->btsr", np.abs(q), np.abs(np.repeat(k, rep, axis=2)))
    e_s = U16 * float(qk.max()) / np.sqrt(dk)
    dz = vmax * (U16 + 2.0 * e_s)
    wo = float(np.abs(w["w_o"].astype(np.float64)).sum(0).max())
    return 1.5 * dz * wo


def decode_all(cache, layer, x, prefill, **opt):
    """y (B,S,d_model): x[:, :prefill] in one call, then one token per call."""
    ys = [cache.forward(layer, x[:, :prefill], **opt)]
    for t in range(prefill, x.shape[1]):
        ys.append(cache.forward(layer, x[:, t:t + 1], **opt))
    return np.concatenate(ys, axis=1)


# --------------------------------------------- prefill + decode = one forward

@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_prefill_then_decode_equals_one_causal_forward(name, dtype):
    """Across the 128-slot chunk boundary of the cache layout."""
    rng = np.random.default_rng(1)
    layer, w, c = random_layer(rng, **CONFIGS[name])
    B, S, P = 2, 140, 9
    x = rng.standard_normal((B, S, c["d_model"])).astype(np.float32)
    want = reference(layer, x)
    with mha.Cache(layer, batch=B, capacity=160, dtype=dtype) as cache:
        got = decode_all(cache, layer, x, P)
        assert cache.lengths() == [S, S]
    tol32 = TOL32 * max(1.0, float(np.abs(want).max()))
    if dtype == "float32":
        assert_close(got, want, f"{name} {dtype}", tol32)
        assert_close(attend64(w, c, x), want, "the reference path against float64")  # the oracle's oracle
        return
    assert_close(got, want, f"{name} {dtype} (first-order bound)", tol32 + fp16_bound(w, c, x))
    effect = float(np.abs(attend64(w, c, x, round_kv="nearest") - attend64(w, c, x)).max())
    assert_close(got, want, f"{name} {dtype} (measured fp16 effect {effect:.3g})", tol32 + 1.5 * effect)
    err, _ = err_scale(got, want)
    assert err > tol32, "fp16 storage gave fp32 accuracy: K and V were not rounded"


def test_batch_of_one_takes_and_returns_2d_rows():
    rng = np.random.default_rng(2)
    layer, _, c = random_layer(rng, **CONFIGS["gqa"])
    x = rng.standard_normal((7, c["d_model"])).astype(np.float32)
    want = reference(layer, x[None])[0]
    cache = mha.Cache(layer, capacity=16)
    y0, cap = cache.forward(layer, x[:4], capture=True)
    y1 = cache(x[4:])  # the cache's own layer
    cache.truncate(0, 4)
    repl = rng.standard_normal((3, c["d_v"])).astype(np.float32)
    y2, cap2 = cache.forward(layer, x[4:], interventions={2: ("replace", repl)}, capture=("z",))
    assert np.array_equal(cap2["z"][:, 2 * 4:3 * 4], repl)  # (T,d_v) rows like x's
    assert y0.shape == (4, c["d_model"]) and y1.shape == (3, c["d_model"])
    assert cap["z"].shape == (4, 8 * 4) and cap["contributions"].shape == (8, 4, c["d_model"])
    assert cap["probs"].shape == (8, 4, 16)
    assert_close(np.concatenate([y0, y1]), want, "2-D rows")


# -------------------------------------------------------------- vs PyTorch

def test_decode_equals_torch_multihead_attention_with_causal_mask():
    torch = require("torch")
    E, h, B, S, P = 32, 4, 2, 20, 6
    torch.manual_seed(3)
    m = torch.nn.MultiheadAttention(E, h, batch_first=True)
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, p in m.named_parameters():  # random biases too (PyTorch's are 0)
            bound = 1.0 if "bias" in name else 2.0 / np.sqrt(p.shape[-1])
            p.copy_((torch.rand(p.shape, generator=gen) * 2 - 1) * bound)
    m.eval()
    x = np.random.default_rng(3).standard_normal((B, S, E)).astype(np.float32)
    causal = torch.triu(torch.ones(S, S, dtype=torch.bool), 1)  # True = not allowed
    tx = torch.from_numpy(x)
    want = m(tx, tx, tx, attn_mask=causal, need_weights=False)[0].detach().numpy()
    sd = {k: v.detach().numpy().copy() for k, v in m.state_dict().items()}
    layer = mha.from_torch_state_dict(sd, num_heads=h, batch_first=True)
    with mha.Cache(layer, batch=B, capacity=S) as cache:
        got = decode_all(cache, layer, x, P)
    err, _ = err_scale(got, want)
    scale = float(np.abs(want).max())
    assert err <= TOL32 * scale, f"vs torch: max abs error {err:.3g} > {TOL32:g} x {scale:.3g}"


@pytest.mark.parametrize("extras", [False, True])
def test_cross_attention_memory_equals_torch_multihead_attention(extras):
    """Encoder-decoder decoding: the decoder's cross-attention keeps the
    encoder output's K and V (mha.Cache(cross=True).set_memory) and each
    step's queries attend all of it; torch.nn.MultiheadAttention with
    kdim / vdim, a key_padding_mask for each sequence's padding and
    (extras) add_bias_kv / add_zero_attn recomputes K and V every call."""
    torch = require("torch")
    E, h, B, S, T, kdim, vdim = 32, 4, 3, 9, 4, 40, 24
    lengths = [9, 3, 6]
    torch.manual_seed(7)
    m = torch.nn.MultiheadAttention(E, h, batch_first=True, kdim=kdim, vdim=vdim,
                                    add_bias_kv=extras, add_zero_attn=extras)
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, p in m.named_parameters():
            bound = 1.0 if "bias" in name else 2.0 / np.sqrt(p.shape[-1])
            p.copy_((torch.rand(p.shape, generator=gen) * 2 - 1) * bound)
    m.eval()
    rng = np.random.default_rng(7)
    x = rng.standard_normal((B, T, E)).astype(np.float32)
    mem_k = rng.standard_normal((B, S, kdim)).astype(np.float32)
    mem_v = rng.standard_normal((B, S, vdim)).astype(np.float32)
    pad = torch.tensor([[j >= n for j in range(S)] for n in lengths])  # True = padding
    want = m(torch.from_numpy(x), torch.from_numpy(mem_k), torch.from_numpy(mem_v), key_padding_mask=pad,
             need_weights=False)[0].detach().numpy()
    sd = {k: v.detach().numpy().copy() for k, v in m.state_dict().items()}
    layer = mha.from_torch_state_dict(sd, num_heads=h, batch_first=True, add_zero_attn=extras)
    for b, n in enumerate(lengths):
        mem_k[b, n:] = np.nan  # padding rows are never read
    with mha.Cache(layer, batch=B, capacity=16, cross=True) as cache:
        cache.set_memory(mem_k, mem_v, lengths=lengths)
        assert cache.lengths() == lengths
        steps = np.concatenate([cache.forward(x[:, t:t + 1]) for t in range(T)], axis=1)
        whole = cache.forward(x)
    for got, what in ((steps, "one query a step"), (whole, "T queries")):
        assert_close(got, want, f"cross memory vs torch, {what}")


def test_cross_memory_refusals():
    rng = np.random.default_rng(9)
    layer, _, c = random_layer(rng, **CONFIGS["gqa"])
    with pytest.raises(mha.ArgumentError, match="cross=True with window=4"):
        mha.Cache(layer, batch=1, capacity=8, cross=True, window=4)
    rope = mha.Layer(d_model=32, n_heads=4, rope=dict(pairing="halves"))
    with pytest.raises(mha.UnsupportedError, match="the layer has RoPE"):
        mha.Cache(rope, batch=1, capacity=8, cross=True)
    cache = mha.Cache(layer, batch=2, capacity=8, cross=True)
    x = rng.standard_normal((2, 1, c["d_model"])).astype(np.float32)
    with pytest.raises(mha.ArgumentError, match="memory is empty; expected mha_cache_set_memory first"):
        cache.forward(x)
    with pytest.raises(mha.ShapeError, match=r"kv has shape \(2,9,31\)"):
        cache.set_memory(np.zeros((2, 9, 31), np.float32))
    with pytest.raises(mha.ArgumentError, match="S=9; expected 1..capacity=8"):
        cache.set_memory(np.zeros((2, 9, 32), np.float32))
    with pytest.raises(mha.ArgumentError, match="cross-attention memory"):
        cache.append(np.zeros((2, 1, 8), np.float32), np.zeros((2, 1, 8), np.float32))
    self_cache = mha.Cache(layer, batch=2, capacity=8)
    with pytest.raises(mha.ArgumentError, match="expected one made by mha_cache_create_cross"):
        self_cache.set_memory(np.zeros((2, 3, 32), np.float32))


# ------------------------------------------------------------ ragged batches

def test_ragged_n_new_each_sequence_matches_its_own_forward():
    rng = np.random.default_rng(4)
    layer, _, c = random_layer(rng, **CONFIGS["gqa"])
    D = c["d_model"]
    steps = [[7, 3, 0], [1, 4, 2], [1, 0, 1], [2, 1, 5], 1]  # n_new per call (an int: all)
    seqs = [[] for _ in range(3)]
    outs = [[] for _ in range(3)]
    cache = mha.Cache(layer, batch=3, capacity=32)
    for n in steps:
        counts = [n] * 3 if isinstance(n, int) else n
        T = max(counts)
        x = rng.standard_normal((3, T, D)).astype(np.float32)
        y = cache.forward(layer, x, n_new=n)
        for b, k in enumerate(counts):
            seqs[b].append(x[b, :k])
            outs[b].append(y[b, :k])
            assert not y[b, k:].any(), f"padding rows of sequence {b} are not 0"
    for b in range(3):
        xs = np.concatenate(seqs[b])
        assert cache.length(b) == len(xs)
        assert_close(np.concatenate(outs[b]), reference(layer, xs[None])[0], f"sequence {b}")


# --------------------------------------------------------------- truncate

def test_truncate_then_continue_as_if_the_rolled_back_tokens_never_came():
    """Speculative decoding: 3 draft tokens, 1 accepted in sequence 0; the
    untouched sequence 1 keeps all of them."""
    rng = np.random.default_rng(5)
    layer, _, c = random_layer(rng, **CONFIGS["mqa"])
    D = c["d_model"]
    prompt = rng.standard_normal((2, 8, D)).astype(np.float32)
    draft = rng.standard_normal((2, 3, D)).astype(np.float32)
    more = rng.standard_normal((2, 2, D)).astype(np.float32)
    cache = mha.Cache(layer, batch=2, capacity=16, dtype="float32")
    cache.forward(layer, prompt)
    cache.forward(layer, draft)
    cache.truncate(0, 9)
    assert cache.lengths() == [9, 11]
    y = np.concatenate([cache.forward(layer, more[:, t:t + 1]) for t in range(2)], axis=1)
    seq0 = np.concatenate([prompt[0], draft[0, :1], more[0]])
    seq1 = np.concatenate([prompt[1], draft[1], more[1]])
    assert_close(y[0], reference(layer, seq0[None])[0, -2:], "truncated sequence")
    assert_close(y[1], reference(layer, seq1[None])[0, -2:], "untouched sequence")
    with pytest.raises(mha.ArgumentError, match="new_len=20"):
        cache.truncate(0, 20)
    cache.reset(1)
    assert cache.lengths() == [11, 0]
    cache.reset()
    assert cache.lengths() == [0, 0]


@pytest.mark.parametrize("name", ["gqa", "mqa"])
def test_beam_search_reorder_follows_each_beams_history(name):
    """Beam search: each step reorders the beams (repeats, drops, a cycle)
    and appends one token per beam; every beam's output is the causal
    forward of the history it now has (tracked here, not by the cache)."""
    rng = np.random.default_rng(17)
    layer, _, c = random_layer(rng, **CONFIGS[name])
    D, B = c["d_model"], 3
    hist = [rng.standard_normal((n, D)).astype(np.float32) for n in (6, 4, 5)]
    cache = mha.Cache(layer, batch=B, capacity=16, dtype="float32")
    x = np.zeros((B, 6, D), np.float32)
    for b in range(B):
        x[b, :len(hist[b])] = hist[b]
    cache.forward(layer, x, n_new=[len(h) for h in hist])
    for beam_idx in ([1, 2, 0], [0, 0, 2], np.array([2, 2, 1]), (1, 0, 1)):
        cache.reorder(beam_idx)
        hist = [hist[int(i)] for i in beam_idx]
        assert cache.lengths() == [len(h) for h in hist]
        tok = rng.standard_normal((B, 1, D)).astype(np.float32)
        y = cache.forward(layer, tok)
        hist = [np.concatenate([h, tok[b]]) for b, h in enumerate(hist)]
        for b in range(B):
            assert_close(y[b, 0], reference(layer, hist[b][None])[0, -1], f"beam {b} after {beam_idx}")


def test_copy_continues_on_its_own():
    """A prompt's cache computed once, then continued by two requests: the
    copy (Cache.copy, copy.copy, copy.deepcopy) and the source each follow
    their own history, also after the source is closed."""
    import copy
    rng = np.random.default_rng(21)
    layer, _, c = random_layer(rng, **CONFIGS["gqa"])
    D = c["d_model"]
    prompt = rng.standard_normal((2, 5, D)).astype(np.float32)
    cache = mha.Cache(layer, batch=2, capacity=12, dtype="float16")
    cache.forward(layer, prompt)
    for make in (lambda k: k.copy(), copy.copy, copy.deepcopy):
        twin = make(cache)
        assert twin.lengths() == [5, 5] and twin.dtype == "float16" and twin._ptr != cache._ptr
        a, b = (rng.standard_normal((2, 1, D)).astype(np.float32) for _ in range(2))
        ya, yb = cache.forward(layer, a), twin.forward(layer, b)
        for tok, y in ((a, ya), (b, yb)):
            want = reference(layer, np.concatenate([prompt, tok], axis=1))[:, -1:]
            assert_close(y, want, "copy", tol=2e-2)  # fp16 K/V
        cache.truncate(0, 5), cache.truncate(1, 5)
    twin = cache.copy()
    cache.close()
    y = twin.forward(layer, prompt[:, :1])
    assert np.isfinite(y).all() and twin.lengths() == [6, 6]


def test_reorder_refuses_bad_beam_indices_and_keeps_the_cache():
    rng = np.random.default_rng(3)
    layer, _, c = random_layer(rng, **CONFIGS["mha"])
    cache = mha.Cache(layer, batch=2, capacity=8)
    cache.forward(layer, rng.standard_normal((2, 3, c["d_model"])).astype(np.float32), n_new=[3, 1])
    with pytest.raises(mha.ArgumentError, match=r"src\[1\]=2; expected a sequence 0..1"):
        cache.reorder([0, 2])
    with pytest.raises(mha.ShapeError, match="expected 2 integers"):
        cache.reorder([0, 1, 1])
    with pytest.raises(mha.ArgumentError, match="is a float; expected an integer"):
        cache.reorder([0.0, 1.0])
    with pytest.raises(mha.ArgumentError):
        cache.reorder([True, 0])
    assert cache.lengths() == [3, 1]
    cache.reorder([1, 1])
    assert cache.lengths() == [1, 1]


# ----------------------------------------------------------------- windows

def test_sliding_window_ring_equals_forward_with_window_left():
    """A ring of 8 slots keeping W = 6: a 10-token prompt (split internally),
    one token per call around the ring many times, then pieces of 3."""
    rng = np.random.default_rng(6)
    layer, _, c = random_layer(rng, **CONFIGS["gqa"])
    W, S = 6, 50
    x = rng.standard_normal((2, S, c["d_model"])).astype(np.float32)
    with mha.Cache(layer, batch=2, capacity=8, window=W) as cache:
        ys = [cache.forward(layer, x[:, :10])]
        ys += [cache.forward(layer, x[:, t:t + 1]) for t in range(10, 41)]
        ys += [cache.forward(layer, x[:, t:t + 3]) for t in range(41, S, 3)]
        assert cache.lengths() == [S, S]
    assert_close(np.concatenate(ys, axis=1), reference(layer, x, window_left=W - 1), "ring W=6")


def test_window_left_option_alone_and_with_the_cache_window():
    rng = np.random.default_rng(7)
    layer, _, c = random_layer(rng, **CONFIGS["mha"])
    x = rng.standard_normal((1, 24, c["d_model"])).astype(np.float32)
    got = decode_all(mha.Cache(layer, capacity=24), layer, x, 5, window_left=3)
    assert_close(got, reference(layer, x, window_left=3), "window_left=3")
    got = decode_all(mha.Cache(layer, capacity=8, window=6), layer, x, 3, window_left=2)
    assert_close(got, reference(layer, x, window_left=2), "window 6 and window_left=2")


# ------------------------------------------- options and captures in decode

def test_interventions_scale_and_captures_during_decode():
    rng = np.random.default_rng(8)
    layer, _, c = random_layer(rng, **CONFIGS["gqa"])
    h, S, P, cap_len = c["n_heads"], 12, 5, 16
    x = rng.standard_normal((2, S, c["d_model"])).astype(np.float32)
    repl = rng.standard_normal((2, S, c["d_v"])).astype(np.float32)
    ivs = lambda a, b: {1: "zero", 6: ("scale", -0.5), 3: ("replace", repl[:, a:b])}  # noqa: E731
    want, wcap = reference(layer, x, interventions=ivs(0, S), scale=0.2, capture=True)
    cache = mha.Cache(layer, batch=2, capacity=cap_len)
    parts = [cache.forward(layer, x[:, :P], interventions=ivs(0, P), scale=0.2, capture=True)]
    parts += [cache.forward(layer, x[:, t:t + 1], interventions=ivs(t, t + 1), scale=0.2, capture=True)
              for t in range(P, S)]
    assert_close(np.concatenate([p[0] for p in parts], axis=1), want, "y")
    for name in ("z", "contributions"):
        ax = 2 if name == "contributions" else 1
        assert_close(np.concatenate([p[1][name] for p in parts], axis=ax), wcap[name], name)
    probs = np.concatenate([p[1]["probs"] for p in parts], axis=2)  # (B,h,S,capacity)
    assert probs.shape == (2, h, S, cap_len)
    assert_close(probs[..., :S], wcap["probs"], "probs (column = position)")
    assert not probs[..., S:].any()


def test_permuting_heads_of_a_layer_with_a_live_cache():
    """GQA: whole kv groups move (new head i = old head perm[i])."""
    rng = np.random.default_rng(9)
    layer, _, c = random_layer(rng, **CONFIGS["gqa"])
    x = rng.standard_normal((1, 10, c["d_model"])).astype(np.float32)
    want = reference(layer, x)
    cache = mha.Cache(layer, capacity=10)
    y0 = cache.forward(layer, x[:, :6])
    perm = [5, 4, 7, 6, 1, 0, 3, 2]
    layer.permute_heads(perm)
    with pytest.raises(mha.ContractError, match="label"):
        cache.forward(layer, x[:, 6:7])
    assert cache.length(0) == 6
    cache.permute_heads(perm)
    y1 = decode_all(cache, layer, x[:, 6:], 1)
    assert_close(np.concatenate([y0, y1], axis=1), want, "after permutation")
    with pytest.raises(mha.ShapeError, match="perm"):
        cache.permute_heads([0, 1])


def test_another_layer_of_the_same_shape_with_extra_keys():
    """The cache is not tied to its layer object: a layer of the same shape
    with add_bias_kv and add_zero_attn uses it, its probs get 2 columns more."""
    rng = np.random.default_rng(14)
    plain, _, c = random_layer(rng, **CONFIGS["mha"])
    extra, _, _ = random_layer(rng, **CONFIGS["mha"], add_bias_kv=True, add_zero_attn=True)
    x = rng.standard_normal((1, 5, c["d_model"])).astype(np.float32)
    cache = mha.Cache(plain, capacity=8)
    y, cap = cache.forward(extra, x, capture=("probs",))
    _, want = reference(extra, x, capture=("probs",))
    assert cap["probs"].shape == (1, c["n_heads"], 5, 8 + 2)
    assert_close(y, reference(extra, x), "y of the other layer")
    assert_close(cap["probs"][..., :5], want["probs"][..., :5], "probs of the cached keys")
    assert_close(cap["probs"][..., 8:], want["probs"][..., 5:], "probs of bias_k and the zero key")


# ------------------------------------------------------- append and attend

def test_append_attend_equal_the_cached_forwards_z():
    rng = np.random.default_rng(10)
    layer, w, c = random_layer(rng, **CONFIGS["gqa"])
    h, g, dk = c["n_heads"], c["n_kv_heads"], c["d_k"]
    x = rng.standard_normal((2, 9, c["d_model"])).astype(np.float32)
    q = x @ w["w_q"] + w["b_q"]
    k = x @ w["w_k"] + w["b_k"]
    v = x @ w["w_v"] + w["b_v"]
    n1, n2 = [6, 2], [3, 7]  # ragged: rows 0..n-1 of each call
    cache = mha.Cache(layer, batch=2, capacity=16)
    cache.append(k[:, :7], v[:, :7], n_new=n1)
    z1 = cache.attend(q[:, :7], n_new=n1)
    assert cache.lengths() == n1
    rest = [np.concatenate([x[b, n1[b]:n1[b] + n2[b]], np.zeros((7 - n2[b], c["d_model"]))])
            for b in range(2)]  # the next rows of each sequence, zero-padded to T = 7
    ks = np.stack([rest[b] @ w["w_k"] + w["b_k"] for b in range(2)]).astype(np.float32)
    vs = np.stack([rest[b] @ w["w_v"] + w["b_v"] for b in range(2)]).astype(np.float32)
    qs = np.stack([rest[b] @ w["w_q"] + w["b_q"] for b in range(2)]).astype(np.float32)
    cache.append(ks, vs, n_new=n2)
    z2 = cache.attend(qs, n_new=n2)
    for b in range(2):
        seq = x[b, :n1[b] + n2[b]]
        _, cap = reference(layer, seq[None], capture=("z",))
        got = np.concatenate([z1[b, :n1[b]], z2[b, :n2[b]]])
        assert_close(got, cap["z"][0], f"z of sequence {b}")
        assert not z1[b, n1[b]:].any() and not z2[b, n2[b]:].any()
    assert z1.shape == (2, 7, h * c["d_v"]) and k.shape[-1] == g * dk
    with pytest.raises(mha.ShapeError, match=r"v has shape \(2,7,7\)"):
        cache.append(ks, vs[..., :7])
    with pytest.raises(mha.ArgumentError, match="n_new"):
        cache.attend(qs, n_new=[8, 0])


# ---------------------------------------------------------------- size

@pytest.mark.parametrize("h_kv", [4, 2, 1])
@pytest.mark.parametrize("dtype,elt", [("float32", 4), ("float16", 2)])
def test_bytes_is_2_B_capacity_hkv_dhead_bytes(h_kv, dtype, elt):
    rng = np.random.default_rng(11)
    layer, _, c = random_layer(rng, d_model=32, n_heads=4, n_kv_heads=h_kv)
    d_head = c["d_k"]
    for B, capacity in ((1, 128), (2, 256), (3, 384)):
        want = 2 * B * capacity * h_kv * d_head * elt
        with mha.Cache(layer, batch=B, capacity=capacity, dtype=dtype) as cache:
            assert cache.bytes == want
        assert mha.Cache.bytes_for(layer, B, capacity, dtype) == want
        assert mha.cache_bytes_for(dict(d_model=32, n_heads=4, n_kv_heads=h_kv), B, capacity, dtype) == want
    # other capacities round up to whole 128-slot chunks
    assert mha.Cache(layer, batch=1, capacity=130, dtype=dtype).bytes == 2 * 256 * h_kv * d_head * elt


# ---------------------------------------------------------------- errors

def test_errors_carry_the_library_message_and_change_nothing():
    rng = np.random.default_rng(12)
    layer, _, c = random_layer(rng, **CONFIGS["mha"])
    D = c["d_model"]
    cache = mha.Cache(layer, batch=2, capacity=8)
    cache.forward(layer, rng.standard_normal((2, 6, D)).astype(np.float32))
    # past the capacity: nothing appended
    with pytest.raises(mha.ArgumentError, match="sequence 0 holds 6 tokens, 3 more exceed the capacity 8"):
        cache.forward(layer, np.zeros((2, 3, D), np.float32))
    assert cache.lengths() == [6, 6]
    cache.forward(layer, np.zeros((2, 3, D), np.float32), n_new=[2, 0])  # what fits is fine
    assert cache.lengths() == [8, 6]
    # sequence index out of range
    for call in (lambda: cache.length(2), lambda: cache.truncate(-1, 0), lambda: cache.reset(5)):
        with pytest.raises(mha.ArgumentError, match="sequence"):
            call()
    # inputs the C side cannot check
    with pytest.raises(mha.DTypeError, match="x has dtype int64"):
        cache.forward(layer, np.zeros((2, 1, D), np.int64))
    with pytest.raises(mha.ShapeError, match=r"x has shape \(2,1,31\); expected \(B=2,T>=1,d_model=32\)"):
        cache.forward(layer, np.zeros((2, 1, D - 1), np.float32))
    with pytest.raises(mha.ShapeError, match=r"x has shape \(1,32\)"):
        cache.forward(layer, np.zeros((1, D), np.float32))  # 2-D rows need batch 1
    with pytest.raises(mha.ShapeError, match="n_new"):
        cache.forward(layer, np.zeros((2, 1, D), np.float32), n_new=[1, 1, 1])
    with pytest.raises(mha.ArgumentError, match=r"n_new\[1\]=2; expected 0..T=1"):
        cache.forward(layer, np.zeros((2, 1, D), np.float32), n_new=[1, 2])
    x = np.zeros((2, 1, D), np.float32)
    x[1, 0, 3] = np.nan
    with pytest.raises(mha.NonFiniteError):
        cache.forward(layer, x, n_new=[0, 1])
    with pytest.raises(mha.ArgumentError, match="capture"):
        cache.forward(layer, x, capture=("weights",))
    assert cache.lengths() == [8, 6]
    # a layer of another shape, a cross-attention layer, bad construction
    other, _, _ = random_layer(rng, d_model=32, n_heads=8)
    with pytest.raises(mha.ShapeError):
        cache.forward(other, np.zeros((2, 1, D), np.float32), n_new=[0, 1])
    with pytest.raises(mha.ShapeError, match="d_kv_in=12"):
        mha.Cache(mha.Layer(32, 4, d_kv_in=12), capacity=8)
    with pytest.raises(mha.ArgumentError, match="dtype='int4'"):
        mha.Cache(layer, capacity=8, dtype="int4")
    with pytest.raises(mha.ArgumentError, match="capacity=0"):
        mha.Cache(layer, capacity=0)
    with pytest.raises(mha.ArgumentError, match="window=9"):
        mha.Cache(layer, capacity=8, window=9)
    with pytest.raises(mha.ArgumentError, match="capacity=0"):
        mha.cache_bytes_for(layer, 1, 0)
    with pytest.raises(mha.ArgumentError, match="expected a mha.Layer"):
        mha.Cache("layer", capacity=8)
    cache.close()
    with pytest.raises(mha.ArgumentError, match="closed"):
        cache.length(0)


def test_the_cache_keeps_its_layer_alive_and_frees_itself():
    rng = np.random.default_rng(13)
    x = rng.standard_normal((1, 3, 32)).astype(np.float32)
    cache = mha.Cache(random_layer(rng, **CONFIGS["mha"])[0], capacity=8)  # no other reference
    gc.collect()
    y = cache(x)
    assert_close(y, reference(cache.layer, x), "layer kept alive by the cache")
    with cache:
        pass
    assert repr(cache) == "Cache(closed)"
    cache.close()  # twice is fine


# ------------------------------------------------------------------ docs

def test_docs_kv_cache_example_runs():
    """docs/PYTHON.md's "KV cache from Python" block, on its own (no torch)."""
    import os
    import re
    from conftest import ROOT
    text = open(os.path.join(ROOT, "docs", "PYTHON.md")).read()
    section = text.split("## KV cache from Python", 1)[1]
    block = re.findall(r"```python\n(.*?)```", section, flags=re.S)[0]
    ns = {}
    exec(compile(block, "docs/PYTHON.md", "exec"), ns)
    assert "cache" in ns
