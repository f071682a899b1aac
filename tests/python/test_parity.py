"""Conformance of mha with torch.nn.MultiheadAttention (eval mode), option
for option, through the Python binding.

Every case builds a PyTorch module with random weights (fixed seeds), loads
its state dict with mha.from_torch_state_dict (the C conversion), and runs
the same inputs through torch and through mha on the reference path, the
AUTO path and the fast path. Tolerance: max |mha - torch| <= 1e-5 x the
output's scale (max |torch output|). NaN positions must agree exactly.

torch 1.13's forward has no is_causal argument: causal parity is checked
against the boolean mask torch.triu(ones(L,S), 1) it expects instead.
"""
import math

import pytest

from conftest import FAST_DECLINED, require

np = require("numpy")
torch = require("torch")
import mha  # noqa: E402  (after the skip: the binding itself needs no torch)

PATHS = ("reference", "auto", "fast")
RTOL = 1e-5


# ------------------------------------------------------------------ helpers

def torch_module(E, h, *, bias=True, add_bias_kv=False, add_zero_attn=False, kdim=None, vdim=None,
                 batch_first=False, seed=0):
    """An eval-mode nn.MultiheadAttention with every parameter random
    (PyTorch initializes biases to zero, which would hide bias bugs)."""
    torch.manual_seed(seed)
    m = torch.nn.MultiheadAttention(E, h, bias=bias, add_bias_kv=add_bias_kv,
                                    add_zero_attn=add_zero_attn, kdim=kdim, vdim=vdim,
                                    batch_first=batch_first)
    gen = torch.Generator().manual_seed(1000 + seed)
    with torch.no_grad():
        for name, p in m.named_parameters():
            # weights ~ U(+-2/sqrt(fan_in)) make attention peaked enough that a
            # wrong mask or head order shows; biases ~ U(+-1)
            bound = 1.0 if "bias" in name else 2.0 / math.sqrt(p.shape[-1])
            p.copy_((torch.rand(p.shape, generator=gen) * 2 - 1) * bound)
    return m.eval()


def state_dict(m):
    return {k: v.detach().numpy().copy() for k, v in m.state_dict().items()}


def mha_from(m, **kw):
    return mha.from_torch_state_dict(state_dict(m), m.num_heads, add_zero_attn=m.add_zero_attn,
                                     batch_first=m.batch_first, **kw)


def run_torch(m, q, k=None, v=None, **kw):
    """torch's outputs as numpy. Gradients stay enabled, so torch takes its
    documented Python path (F.multi_head_attention_forward), not the native
    fused kernel."""
    tq = torch.from_numpy(q)
    tk = tq if k is None or k is q else torch.from_numpy(k)
    tv = tk if v is None or v is k else torch.from_numpy(v)
    kw = {n: torch.from_numpy(np.asarray(a)) if isinstance(a, np.ndarray) else a for n, a in kw.items()}
    out, w = m(tq, tk, tv, **kw)
    return out.detach().numpy(), None if w is None else w.detach().numpy()


def assert_close(got, want, what):
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, f"{what}: shape {got.shape}, torch {want.shape}"
    gn, wn = np.isnan(got), np.isnan(want)
    if not np.array_equal(gn, wn):
        bad = np.argwhere(gn != wn)
        raise AssertionError(f"{what}: NaN pattern differs at {len(bad)} places, first {bad[:3].tolist()} "
                             f"(mha NaN: {gn.sum()}, torch NaN: {wn.sum()})")
    fin = ~wn
    if not fin.any():
        return
    scale = float(np.abs(want[fin]).max())
    err = float(np.abs(got[fin].astype(np.float64) - want[fin]).max())
    assert err <= RTOL * scale, (f"{what}: max abs error {err:.3g} > {RTOL:g} x output scale "
                                 f"{scale:.3g}")


def each_path(request, run):
    """run(path) -> tuple of arrays, for every path. A fast-path decline
    (MHA_E_UNSUPPORTED) is recorded for the summary and the request is
    answered through AUTO, whose fallback must then still match."""
    out = {}
    for path in PATHS:
        try:
            out[path] = run(path)
        except mha.UnsupportedError as e:
            if path != "fast":
                raise
            FAST_DECLINED.append((request.node.nodeid, e.message))
            out[path] = run("auto")
    return out


def check_paths(request, run, want, names=("output", "weights")):
    for path, got in each_path(request, run).items():
        for g, w, n in zip(got, want, names):
            if w is None:
                assert g is None, f"{n} on path {path}: torch gives None"
            else:
                assert_close(g, w, f"{n} on path {path}")


def inputs(rng, B, L, E, batch_first):
    shape = (B, L, E) if batch_first else (L, B, E)
    return rng.standard_normal(shape).astype(np.float32)


def random_keep(rng, shape, p_masked=0.4):
    """Bool 'masked' array (PyTorch convention: True = not allowed) with at
    least one allowed key in every row."""
    masked = rng.random(shape) < p_masked
    rows = masked.reshape(-1, shape[-1])
    rows[np.arange(rows.shape[0]), rng.integers(0, shape[-1], rows.shape[0])] = False
    return rows.reshape(shape)


def random_additive(rng, shape):
    """Float mask: finite values and some -inf, every row with a finite entry."""
    m = (rng.standard_normal(shape) * 1.5).astype(np.float32)
    m[random_keep(rng, shape, 0.3)] = -np.inf
    return m


# ------------------------------------------------------------ self-attention

SIZES = [  # E, h, B, T
    (8, 1, 2, 5),
    (8, 2, 1, 1),
    (16, 4, 3, 7),
    (12, 3, 2, 6),
    (32, 8, 2, 4),
    (64, 4, 1, 9),
    (128, 8, 2, 70),
]


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("batch_first", [True, False], ids=["bf", "seqfirst"])
@pytest.mark.parametrize("E,h,B,T", SIZES, ids=[f"E{e}h{h}B{b}T{t}" for e, h, b, t in SIZES])
def test_self_attention(request, E, h, B, T, batch_first, bias):
    m = torch_module(E, h, bias=bias, batch_first=batch_first, seed=E * 31 + h)
    x = inputs(np.random.default_rng(E + T), B, T, E, batch_first)
    want = run_torch(m, x, x, x)
    layer = mha_from(m)
    assert layer.config["bias"] == int(bias)
    check_paths(request, lambda p: layer.torch_forward(x, x, x, path=p), want)


def test_unbatched_input(request):
    m = torch_module(16, 2, seed=3)
    rng = np.random.default_rng(3)
    x = rng.standard_normal((5, 16)).astype(np.float32)
    kpm = np.array([False, True, False, False, True])
    am = random_keep(rng, (2, 5, 5))  # (h, L, S) when unbatched
    want = run_torch(m, x, x, x, key_padding_mask=kpm, attn_mask=am, average_attn_weights=False)
    layer = mha_from(m)
    check_paths(request, lambda p: layer.torch_forward(x, key_padding_mask=kpm, attn_mask=am,
                                                       average_attn_weights=False, path=p), want)


@pytest.mark.parametrize("B,T,S", [(0, 3, 4), (2, 0, 4)], ids=["empty batch", "no queries"])
@pytest.mark.parametrize("extra", [False, True], ids=["plain", "bias_kv+zero_attn"])
def test_empty_inputs_give_empty_results_like_torch(request, B, T, S, extra):
    """B = 0 or T = 0 (the library refuses them): torch's empty output and
    weights, both averaged and per head; the key's shape still checked."""
    m = torch_module(16, 2, batch_first=True, add_bias_kv=extra, add_zero_attn=extra, seed=5)
    rng = np.random.default_rng(5)
    x, kv = inputs(rng, B, T, 16, True), inputs(rng, B, S, 16, True)
    layer = mha_from(m)
    for average in (True, False):
        want = run_torch(m, x, kv, kv, average_attn_weights=average) if B else (  # torch 1.13 fails at B = 0
            np.zeros((0, T, 16), np.float32), np.zeros((0, T, S + 2 * extra) if average else (0, 2, T, S + 2 * extra)))
        check_paths(request, lambda p: layer.torch_forward(x, kv, kv, average_attn_weights=average, path=p), want)
    with pytest.raises(mha.ShapeError, match="key has shape"):
        layer.torch_forward(x, inputs(rng, B + 1, S, 16, True))


def test_batch_first_from_layer_or_argument(request):
    m = torch_module(8, 2, batch_first=True, seed=4)
    x = inputs(np.random.default_rng(4), 2, 3, 8, True)
    want = run_torch(m, x)
    layer = mha_from(m)
    assert layer.batch_first
    y_default, _ = layer.torch_forward(x)
    layer.batch_first = False
    y_arg, _ = layer.torch_forward(x, batch_first=True)
    y_seq, _ = layer.torch_forward(np.ascontiguousarray(x.transpose(1, 0, 2)))
    assert_close(y_default, want[0], "batch_first from the layer")
    assert_close(y_arg, want[0], "batch_first argument")
    assert_close(y_seq.transpose(1, 0, 2), want[0], "sequence-first input")


# ------------------------------------------------------------ cross-attention

@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("batch_first", [True, False], ids=["bf", "seqfirst"])
@pytest.mark.parametrize("kdim", [16, 10, 24], ids=["kdimE", "kdim10", "kdim24"])
def test_cross_attention(request, kdim, batch_first, bias):
    """key/value source of width kdim = vdim (!= E for 10, 24) and S != T;
    kdim == E is cross-attention with the packed in_proj_weight."""
    E, h, B, T, S = 16, 4, 2, 5, 7
    m = torch_module(E, h, bias=bias, kdim=kdim, vdim=kdim, batch_first=batch_first, seed=kdim)
    rng = np.random.default_rng(kdim)
    q = inputs(rng, B, T, E, batch_first)
    mem = inputs(rng, B, S, kdim, batch_first)
    am = random_keep(rng, (T, S))
    kpm = random_keep(rng, (B, S), 0.3)
    want = run_torch(m, q, mem, mem, attn_mask=am, key_padding_mask=kpm, average_attn_weights=False)
    layer = mha_from(m)
    assert layer.config["d_kv_in"] == kdim
    check_paths(request, lambda p: layer.torch_forward(q, mem, mem, attn_mask=am, key_padding_mask=kpm,
                                                       average_attn_weights=False, path=p), want)


# ------------------------------------------- a value source apart from the key

KV_DIMS = [(6, 10), (10, 6), (16, 24), (24, 16)]  # kdim, vdim (E = 16: one of them may equal E)


@pytest.mark.parametrize("extra", ["plain", "nobias", "bias_kv_zero_attn"])
@pytest.mark.parametrize("batch_first", [True, False], ids=["bf", "seqfirst"])
@pytest.mark.parametrize("kdim,vdim", KV_DIMS, ids=[f"k{k}v{v}" for k, v in KV_DIMS])
def test_kdim_ne_vdim(request, kdim, vdim, batch_first, extra):
    """kdim != vdim: PyTorch projects K from `key` (kdim) and V from `value`
    (vdim); the converted layer has d_kv_in = kdim, d_v_in = vdim and
    torch_forward passes value as its own source (mha_forward_kv)."""
    E, h, B, T, S = 16, 4, 2, 5, 7
    m = torch_module(E, h, bias=extra != "nobias", add_bias_kv=extra == "bias_kv_zero_attn",
                     add_zero_attn=extra == "bias_kv_zero_attn", kdim=kdim, vdim=vdim,
                     batch_first=batch_first, seed=kdim * 7 + vdim)
    rng = np.random.default_rng(kdim + vdim)
    q = inputs(rng, B, T, E, batch_first)
    key, value = inputs(rng, B, S, kdim, batch_first), inputs(rng, B, S, vdim, batch_first)
    am = random_keep(rng, (T, S))
    kpm = random_keep(rng, (B, S), 0.3)
    kw = dict(attn_mask=am, key_padding_mask=kpm, average_attn_weights=False)
    want = run_torch(m, q, key, value, **kw)
    layer = mha_from(m)
    assert (layer.config["d_kv_in"], layer.config["d_v_in"]) == (kdim, vdim)
    check_paths(request, lambda p: layer.torch_forward(q, key, value, path=p, **kw), want)


@pytest.mark.parametrize("batch_first", [True, False], ids=["bf", "seqfirst"])
@pytest.mark.parametrize("kdim", [None, 12], ids=["kdimE", "kdim12"])
def test_value_differing_from_key(request, kdim, batch_first):
    """kdim == vdim (the packed in_proj_weight when both are E): a value
    array that is not the key is still PyTorch's value, so the output
    follows it; also long enough to cross the fast path's tiles."""
    E, h, B, T, S = 32, 4, 2, 37, 75
    m = torch_module(E, h, kdim=kdim, vdim=kdim, batch_first=batch_first, seed=6)
    rng = np.random.default_rng(6)
    q = inputs(rng, B, T, E, batch_first)
    key, value = (inputs(rng, B, S, kdim or E, batch_first) for _ in range(2))
    want = run_torch(m, q, key, value, average_attn_weights=False)
    layer = mha_from(m)
    check_paths(request, lambda p: layer.torch_forward(q, key, value, average_attn_weights=False,
                                                       path=p), want)
    # the value matters: with value = key the output changes, the weights do not
    same_y, same_w = layer.torch_forward(q, key, key, average_attn_weights=False)
    assert np.abs(same_y - want[0]).max() > 1e-2 * np.abs(want[0]).max()
    assert_close(same_w, want[1], "weights with value = key")


def test_value_differing_from_self_attention_key(request):
    """key is query (self-attention keys) but value is another array of the
    same length, batched and unbatched."""
    E, h, B, T = 16, 2, 2, 6
    m = torch_module(E, h, seed=21)
    rng = np.random.default_rng(21)
    x, value = inputs(rng, B, T, E, False), inputs(rng, B, T, E, False)
    causal = np.triu(np.ones((T, T), dtype=bool), 1)
    want = run_torch(m, x, x, value, attn_mask=causal)
    layer = mha_from(m)
    check_paths(request, lambda p: layer.torch_forward(x, x, value, attn_mask=causal, path=p), want)
    want1 = run_torch(m, x[:, 0], x[:, 0], value[:, 0])
    check_paths(request, lambda p: layer.torch_forward(x[:, 0], x[:, 0], value[:, 0], path=p), want1)


def test_value_source_errors_name_the_problem():
    """A missing value for a layer whose vdim differs from kdim, and a value
    whose length differs from the key's, are errors naming what is wrong."""
    m = torch_module(16, 4, kdim=6, vdim=10, seed=5)
    layer = mha_from(m)
    rng = np.random.default_rng(5)
    q, key, value = inputs(rng, 2, 3, 16, False), inputs(rng, 2, 4, 6, False), inputs(rng, 2, 4, 10, False)
    with pytest.raises(mha.ShapeError, match="d_v_in=10"):
        layer.torch_forward(q, key, None)
    with pytest.raises(mha.ShapeError, match="value has shape"):
        layer.torch_forward(q, key, value[:3])
    with pytest.raises(mha.ShapeError, match=r"value has shape \(4, 2, 6\); expected \(S=4,N=2,vdim=10\)"):
        layer.torch_forward(q, key, inputs(rng, 2, 4, 6, False))  # named in torch's words and layout
    bad = value.copy()
    bad[1, 0, 2] = np.nan
    with pytest.raises(mha.NonFiniteError, match="v_src"):
        layer.torch_forward(q, key, bad)


@pytest.mark.parametrize("batch_first", [True, False], ids=["bf", "seqfirst"])
def test_long_sequences_all_options(request, batch_first):
    """Lengths that cross any tile size of the fast path (T=37, S=75), with
    a 3D bool mask, padding, both extra keys and per-head weights."""
    E, h, B, T, S, kdim = 64, 4, 2, 37, 75, 48
    m = torch_module(E, h, add_bias_kv=True, add_zero_attn=True, kdim=kdim, vdim=kdim,
                     batch_first=batch_first, seed=19)
    rng = np.random.default_rng(19)
    q, mem = inputs(rng, B, T, E, batch_first), inputs(rng, B, S, kdim, batch_first)
    am = random_keep(rng, (B * h, T, S), 0.5)
    kpm = np.zeros((B, S), dtype=bool)
    kpm[1, 60:] = True
    want = run_torch(m, q, mem, mem, attn_mask=am, key_padding_mask=kpm, average_attn_weights=False)
    layer = mha_from(m)
    check_paths(request, lambda p: layer.torch_forward(q, mem, mem, attn_mask=am, key_padding_mask=kpm,
                                                       average_attn_weights=False, path=p), want)


# --------------------------------------------------- add_bias_kv, add_zero_attn

EXTRA = [(True, False), (False, True), (True, True)]


@pytest.mark.parametrize("batch_first", [True, False], ids=["bf", "seqfirst"])
@pytest.mark.parametrize("add_bias_kv,add_zero_attn", EXTRA, ids=["bias_kv", "zero_attn", "both"])
def test_extra_keys(request, add_bias_kv, add_zero_attn, batch_first):
    """The appended bias row then zero row, visible in the per-head weights
    (S + 1 or S + 2 columns); they are never masked, so a query whose S keys
    are all masked still attends to them."""
    E, h, B, T = 16, 4, 2, 5
    m = torch_module(E, h, add_bias_kv=add_bias_kv, add_zero_attn=add_zero_attn,
                     batch_first=batch_first, seed=7 + add_bias_kv + 2 * add_zero_attn)
    rng = np.random.default_rng(7)
    x = inputs(rng, B, T, E, batch_first)
    am = random_keep(rng, (T, T))
    am[2, :] = True  # every original key hidden from query 2
    kpm = random_keep(rng, (B, T), 0.2)
    want = run_torch(m, x, x, x, attn_mask=am, key_padding_mask=kpm, average_attn_weights=False)
    assert want[1].shape[-1] == T + add_bias_kv + add_zero_attn
    assert not np.isnan(want[0]).any()
    layer = mha_from(m)
    cfg = layer.config
    assert (cfg["add_bias_kv"], cfg["add_zero_attn"]) == (int(add_bias_kv), int(add_zero_attn))
    check_paths(request, lambda p: layer.torch_forward(x, attn_mask=am, key_padding_mask=kpm,
                                                       average_attn_weights=False, path=p), want)


# ------------------------------------------------------------------- masks

@pytest.mark.parametrize("batch_first", [True, False], ids=["bf", "seqfirst"])
@pytest.mark.parametrize("dims", [2, 3], ids=["2d", "3d"])
@pytest.mark.parametrize("kind", ["bool", "float"])
def test_attn_mask(request, kind, dims, batch_first):
    E, h, B, T = 16, 4, 3, 6
    m = torch_module(E, h, batch_first=batch_first, seed=8)
    rng = np.random.default_rng(8 + dims)
    x = inputs(rng, B, T, E, batch_first)
    shape = (T, T) if dims == 2 else (B * h, T, T)
    am = random_keep(rng, shape) if kind == "bool" else random_additive(rng, shape)
    want = run_torch(m, x, attn_mask=am, average_attn_weights=False)
    layer = mha_from(m)
    check_paths(request, lambda p: layer.torch_forward(x, attn_mask=am, average_attn_weights=False,
                                                       path=p), want)


def test_attn_mask_3d_index_is_batch_times_heads_plus_head(request):
    """PyTorch's 3D mask entry n*h + r belongs to batch n, head r: hide a
    different single key in each (n, r) and compare per-head weights."""
    E, h, B, T = 8, 2, 2, 4
    m = torch_module(E, h, batch_first=True, seed=9)
    x = inputs(np.random.default_rng(9), B, T, E, True)
    am = np.zeros((B * h, T, T), dtype=bool)
    for i in range(B * h):
        am[i, :, i] = True
    want = run_torch(m, x, attn_mask=am, average_attn_weights=False)
    y, w = mha_from(m).torch_forward(x, attn_mask=am, average_attn_weights=False, path="reference")
    for n in range(B):
        for r in range(h):
            assert np.all(w[n, r, :, n * h + r] == 0.0)
    assert_close(y, want[0], "output")
    assert_close(w, want[1], "weights")


KPM_CASES = [  # key_padding_mask kind, attn_mask kind (None: absent); the combos torch 1.13 supports
    ("bool", None), ("float", None), ("bool", "bool"), ("bool", "float"),
]


@pytest.mark.parametrize("batch_first", [True, False], ids=["bf", "seqfirst"])
@pytest.mark.parametrize("kpm_kind,am_kind", KPM_CASES, ids=[f"kpm_{a}-am_{b}" for a, b in KPM_CASES])
def test_key_padding_mask(request, kpm_kind, am_kind, batch_first):
    E, h, B, T, S = 16, 2, 3, 5, 6
    m = torch_module(E, h, batch_first=batch_first, seed=10)
    rng = np.random.default_rng(10)
    q = inputs(rng, B, T, E, batch_first)
    kv = inputs(rng, B, S, E, batch_first)
    if kpm_kind == "bool":
        kpm = np.zeros((B, S), dtype=bool)
        for n in range(B):
            kpm[n, S - 1 - n:] = True  # trailing padding, as a real batch has
    else:
        kpm = random_additive(rng, (B, S))
    am = None if am_kind is None else (random_keep(rng, (T, S), 0.2) if am_kind == "bool"
                                       else random_additive(rng, (B * h, T, S)))
    if am is not None:
        # key 0 is never padding; allow it in attn_mask too, so no row is empty
        am[..., 0] = False if am.dtype == bool else 0.5
    kw = dict(key_padding_mask=kpm, average_attn_weights=False)
    if am is not None:
        kw["attn_mask"] = am
    want = run_torch(m, q, kv, kv, **kw)
    assert not np.isnan(want[0]).any()
    layer = mha_from(m)
    check_paths(request, lambda p: layer.torch_forward(q, kv, kv, path=p, **kw), want)


# ------------------------------------------------------------------ causal

@pytest.mark.parametrize("batch_first", [True, False], ids=["bf", "seqfirst"])
def test_causal_self_attention(request, batch_first):
    """is_causal (the library's causal option) equals torch with the causal
    mask triu(ones(L,L), 1); also with that mask passed too, as PyTorch 2's
    is_causal hint expects, and through Layer.forward(causal=True)."""
    E, h, B, T = 16, 4, 2, 7
    m = torch_module(E, h, batch_first=batch_first, seed=11)
    x = inputs(np.random.default_rng(11), B, T, E, batch_first)
    causal = np.triu(np.ones((T, T), dtype=bool), 1)
    want = run_torch(m, x, attn_mask=causal, average_attn_weights=False)
    layer = mha_from(m)
    check_paths(request, lambda p: layer.torch_forward(x, is_causal=True, average_attn_weights=False,
                                                       path=p), want)
    check_paths(request, lambda p: layer.torch_forward(x, attn_mask=causal, is_causal=True,
                                                       average_attn_weights=False, path=p), want)
    xb = x if batch_first else np.ascontiguousarray(x.transpose(1, 0, 2))
    yb = want[0] if batch_first else want[0].transpose(1, 0, 2)
    check_paths(request, lambda p: (layer.forward(xb, causal=True, path=p),), (yb,))


@pytest.mark.parametrize("align,diagonal", [("top_left", 1), ("bottom_right", 1 + 9 - 4)],
                         ids=["top_left", "bottom_right"])
def test_causal_alignment_cross(request, align, diagonal):
    """S != T: top-left hides key j > i, bottom-right hides j > i + S - T;
    torch gets the equivalent boolean mask."""
    E, h, B, T, S = 8, 2, 2, 4, 9
    m = torch_module(E, h, batch_first=True, seed=12)
    rng = np.random.default_rng(12)
    q, kv = inputs(rng, B, T, E, True), inputs(rng, B, S, E, True)
    mask = np.triu(np.ones((T, S), dtype=bool), diagonal)
    want = run_torch(m, q, kv, kv, attn_mask=mask, average_attn_weights=False)
    layer = mha_from(m)

    def run(p):
        y, cap = layer.forward(q, kv, causal=True, align=align, path=p, capture=("probs",))
        return y, cap["probs"]
    check_paths(request, run, want)


# ------------------------------------------------------------ need_weights

@pytest.mark.parametrize("batch_first", [True, False], ids=["bf", "seqfirst"])
@pytest.mark.parametrize("average", [True, False], ids=["avg", "perhead"])
def test_need_weights(request, average, batch_first):
    E, h, B, T = 24, 3, 2, 5
    m = torch_module(E, h, batch_first=batch_first, seed=13)
    x = inputs(np.random.default_rng(13), B, T, E, batch_first)
    want = run_torch(m, x, need_weights=True, average_attn_weights=average)
    assert want[1].shape == ((B, T, T) if average else (B, h, T, T))
    layer = mha_from(m)
    check_paths(request, lambda p: layer.torch_forward(x, need_weights=True,
                                                       average_attn_weights=average, path=p), want)
    # the same numbers straight from the captured probabilities (B,h,T,S)
    xb = x if batch_first else np.ascontiguousarray(x.transpose(1, 0, 2))
    _, cap = layer.forward(xb, capture=("probs",), path="reference")
    probs = cap["probs"].mean(axis=1) if average else cap["probs"]
    assert_close(probs, want[1], "captured probs")
    y, w = layer.torch_forward(x, need_weights=False)
    assert w is None and run_torch(m, x, need_weights=False)[1] is None
    assert_close(y, want[0], "output with need_weights=False")


# ------------------------------------------------------- fully masked rows

def _masked_case(source, rng, B, h, T):
    """attn_mask / key_padding_mask kwargs that hide every key from some
    rows, and a (B,h,T) array of which (batch, head, query) rows are empty."""
    empty = np.zeros((B, h, T), dtype=bool)
    if source == "attn_mask_2d":
        am = random_keep(rng, (T, T))
        am[1, :] = True
        empty[:, :, 1] = True
        return dict(attn_mask=am), empty
    if source == "attn_mask_3d_one_head":
        am = random_keep(rng, (B * h, T, T))
        am[1 * h + 2, 3, :] = True  # batch 1, head 2, query 3
        empty[1, 2, 3] = True
        return dict(attn_mask=am), empty
    kpm = np.zeros((B, T), dtype=bool)
    kpm[0, :] = True  # batch 0 is all padding
    empty[0] = True
    return dict(key_padding_mask=kpm), empty


SOURCES = ["attn_mask_2d", "attn_mask_3d_one_head", "key_padding_all"]


@pytest.mark.parametrize("mode", [{}, {"masked_row": "nan"}], ids=["default", "nan"])
@pytest.mark.parametrize("source", SOURCES)
def test_fully_masked_rows_nan_mode_matches_torch(request, source, mode):
    """torch_forward returns what PyTorch returns, NaN for a query with no
    allowed key, by default (docs/PYTHON.md, README)."""
    E, h, B, T = 16, 4, 2, 5
    m = torch_module(E, h, batch_first=True, seed=14)
    rng = np.random.default_rng(14)
    x = inputs(rng, B, T, E, True)
    kw, empty = _masked_case(source, rng, B, h, T)
    want = run_torch(m, x, average_attn_weights=False, **kw)
    assert np.isnan(want[0]).any(), "torch 1.13 gives NaN for a query with no allowed key"
    layer = mha_from(m)
    check_paths(request, lambda p: layer.torch_forward(x, average_attn_weights=False, path=p, **mode, **kw),
                want)


@pytest.mark.parametrize("source", SOURCES)
def test_fully_masked_rows_zero_mode(request, source):
    """masked_row="zero", the library's mode: an empty (batch, head, query) row gets Z^(r) = 0
    and zero weights. Expected values come from torch itself: the same
    module with that head's out_proj columns zeroed (Z^(r) W_O[r] = 0) and
    the empty row's mask lifted (so torch has no NaN to propagate)."""
    E, h, B, T = 16, 4, 2, 5
    d = E // h
    m = torch_module(E, h, batch_first=True, seed=15)
    rng = np.random.default_rng(15)
    x = inputs(rng, B, T, E, True)
    kw, empty = _masked_case(source, rng, B, h, T)
    want_y, want_w = run_torch(m, x, average_attn_weights=False, **kw)
    rows = empty.any(axis=1)  # (B,T) output rows touched by an empty head
    # expected rows: for each touched (n, i), torch without the empty heads
    for n, i in zip(*np.nonzero(rows)):
        heads = np.nonzero(empty[n, :, i])[0]
        m2 = torch_module(E, h, batch_first=True, seed=15)
        with torch.no_grad():
            for r in heads:
                m2.out_proj.weight[:, r * d:(r + 1) * d] = 0.0
        lifted = {}
        if "attn_mask" in kw:
            am = kw["attn_mask"].copy()
            if am.ndim == 2:
                am[i, :] = False
            else:
                for r in heads:
                    am[n * h + r, i, :] = False
            lifted["attn_mask"] = am
        # an all-padding batch: run that batch element alone without padding
        y2, _ = run_torch(m2, x, **lifted)
        want_y[n, i] = y2[n, i]
        want_w[n, heads, i, :] = 0.0
    if source == "attn_mask_2d" or source == "key_padding_all":
        # every head empty: the row is exactly b_O (hand-derived)
        b_o = m.out_proj.bias.detach().numpy()
        for n, i in zip(*np.nonzero(rows)):
            assert np.allclose(want_y[n, i], b_o, rtol=0, atol=1e-6)
    assert not np.isnan(want_y).any() and not np.isnan(want_w).any()
    layer = mha_from(m)
    check_paths(request, lambda p: layer.torch_forward(x, average_attn_weights=False, masked_row="zero",
                                                       path=p, **kw), (want_y, want_w))


# --------------------------------------------------------- head permutation

@pytest.mark.parametrize("batch_first", [True, False], ids=["bf", "seqfirst"])
def test_permute_heads_round_trip(request, batch_first):
    """Permuting heads (Q/K/V columns, W_O rows, labels together) leaves the
    output equal to PyTorch's; moving W_O's rows alone breaks it and the
    contract check names the disagreeing label; moving them back restores it."""
    E, h, B, T = 16, 4, 2, 6
    m = torch_module(E, h, batch_first=batch_first, seed=16)
    x = inputs(np.random.default_rng(16), B, T, E, batch_first)
    want = run_torch(m, x, average_attn_weights=True)
    layer = mha_from(m)
    perm = [2, 0, 3, 1]
    layer.permute_heads(perm)
    assert layer.labels("q") == perm and layer.labels("o") == perm
    check_paths(request, lambda p: layer.torch_forward(x, path=p), want)
    xb = x if batch_first else np.ascontiguousarray(x.transpose(1, 0, 2))
    assert layer.check_contract(xb).ok

    swap = [1, 0, 2, 3]
    layer.permute_block("o", swap)
    y_bad, _ = layer.torch_forward(x, path="reference")
    scale = np.abs(want[0]).max()
    assert np.abs(y_bad - want[0]).max() > 1e-3 * scale
    rep = layer.check_contract(xb)
    assert not rep.ok and not rep.labels_ok and rep.bad_block == "O" and rep.message
    layer.permute_block("o", swap)  # a swap is its own inverse
    assert layer.check_contract(xb).ok
    check_paths(request, lambda p: layer.torch_forward(x, path=p), want)


# ----------------------------------------------------------- state dicts

def test_state_dict_with_prefix_and_torch_tensors(request):
    """A larger module's state dict (tensors, not numpy): the attention's
    entries are found by their unique prefix."""
    torch.manual_seed(17)
    enc = torch.nn.TransformerEncoderLayer(16, 4, dim_feedforward=8, batch_first=True).eval()
    with torch.no_grad():
        enc.self_attn.in_proj_bias.uniform_(-1, 1)
        enc.self_attn.out_proj.bias.uniform_(-1, 1)
    x = inputs(np.random.default_rng(17), 2, 5, 16, True)
    want = run_torch(enc.self_attn, x)
    layer = mha.from_torch_state_dict(enc.state_dict(), 4, batch_first=True)
    with pytest.raises(mha.ArgumentError, match="linear1"):
        mha.from_torch_state_dict(enc.state_dict(), 4, prefix="")
    check_paths(request, lambda p: layer.torch_forward(x, path=p), want)



def test_state_dict_prefix_may_name_the_block(request):
    """prefix= may name the encoder layer that holds the attention
    ('layers.1'), with or without the final dot, as well as the attention's
    own path; a prefix holding two attention layers is refused naming them."""
    torch.manual_seed(19)
    enc = torch.nn.TransformerEncoder(
        torch.nn.TransformerEncoderLayer(16, 4, dim_feedforward=8, batch_first=True), 2).eval()
    with torch.no_grad():
        enc.layers[1].self_attn.in_proj_weight.mul_(-1.5)  # the two layers differ
    x = inputs(np.random.default_rng(19), 2, 5, 16, True)
    want = run_torch(enc.layers[1].self_attn, x)
    for prefix in ("layers.1", "layers.1.", "layers.1.self_attn", "layers.1.self_attn."):
        layer = mha.from_torch_state_dict(enc.state_dict(), 4, batch_first=True, prefix=prefix)
        check_paths(request, lambda p: layer.torch_forward(x, path=p), want)
    with pytest.raises(mha.ArgumentError, match=r"2 .* inside prefix 'layers' \['layers.0.self_attn.', 'layers.1.self_attn.'\]"):
        mha.from_torch_state_dict(enc.state_dict(), 4, prefix="layers")

def test_state_dict_errors_name_the_tensor():
    m = torch_module(8, 2, seed=18)
    sd = state_dict(m)
    sd["out_proj.weight"][3, 1] = np.nan
    with pytest.raises(mha.NonFiniteError, match=r"out_proj\.weight\["):
        mha.from_torch_state_dict(sd, 2)
    sd = state_dict(m)
    sd["in_proj_weight"] = sd["in_proj_weight"][:-1]
    with pytest.raises(mha.ShapeError, match="in_proj_weight"):
        mha.from_torch_state_dict(sd, 2)
    with pytest.raises(mha.ArgumentError, match="num_heads=3"):
        mha.from_torch_state_dict(state_dict(m), 3)


# ------------------------------------------------------------------ docs

def test_docs_python_examples_run_and_match_torch(monkeypatch):
    """docs/PYTHON.md's code blocks, run in order: the five-line example
    must give what the PyTorch module gives."""
    import os
    import re
    from conftest import ROOT
    text = open(os.path.join(ROOT, "docs", "PYTHON.md")).read()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert len(blocks) >= 3
    monkeypatch.chdir(ROOT)
    ns = {}
    exec(compile(blocks[0], "docs/PYTHON.md", "exec"), ns)
    assert len(blocks[0].strip().splitlines()) == 5
    yt, wt = run_torch(ns["m"], ns["x"])
    assert_close(ns["y"], yt, "docs example output")
    assert_close(ns["w"], wt, "docs example weights")
    for code in blocks[1:]:
        exec(compile(code, "docs/PYTHON.md", "exec"), ns)


# --------------------------------------------------------- checkpoint files

def _write_safetensors(path, tensors, metadata):
    """A minimal safetensors writer from the format's description: u64
    little-endian header length, JSON header, then the raw F32 data."""
    import json
    import struct
    header, blobs, pos = {"__metadata__": {k: str(v) for k, v in metadata.items()}}, [], 0
    for name, a in tensors.items():
        b = np.ascontiguousarray(a, dtype="<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [pos, pos + len(b)]}
        blobs.append(b)
        pos += len(b)
    h = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


CKPT = [  # add_bias_kv, add_zero_attn, kdim, vdim
    (False, False, None, None), (True, True, None, None), (False, False, 12, 12), (True, False, 12, 9),
]


@pytest.mark.parametrize("add_bias_kv,add_zero_attn,kdim,vdim", CKPT,
                         ids=["plain", "extra_keys", "kdim12", "kdim12_vdim9"])
def test_torch_checkpoint_file_through_the_loader(request, tmp_path, add_bias_kv, add_zero_attn, kdim,
                                                  vdim):
    """A PyTorch state dict saved as safetensors and read by mha_layer_load
    (the CLI's loader, torch layout, which calls mha_layer_from_torch);
    with vdim != kdim the value source keeps its own width."""
    E, h, B, T, S = 16, 4, 2, 5, 6
    m = torch_module(E, h, add_bias_kv=add_bias_kv, add_zero_attn=add_zero_attn, kdim=kdim, vdim=vdim,
                     batch_first=True, seed=20)
    rng = np.random.default_rng(20)
    q, mem = inputs(rng, B, T, E, True), inputs(rng, B, S, kdim or E, True)
    val = mem if vdim == kdim else inputs(rng, B, S, vdim, True)
    want = run_torch(m, q, mem, val, average_attn_weights=False)
    path = tmp_path / "attn.safetensors"
    _write_safetensors(path, {"encoder.attn." + k: v for k, v in state_dict(m).items()},
                       {"n_heads": h, "add_zero_attn": int(add_zero_attn)})
    for layout in ("torch", "auto"):
        layer = mha.Layer.load(path, layout=layout)
        layer.batch_first = True
        assert layer.config["d_v_in"] == (vdim or E)
        check_paths(request, lambda p: layer.torch_forward(q, mem, val, average_attn_weights=False, path=p),
                    want)


def test_torch_state_dict_without_metadata_takes_add_zero_attn(tmp_path):
    """A bare state dict (no metadata: torch does not record
    add_zero_attn) of an add_zero_attn=True module: loaded plain it is a
    different layer (its output differs from torch's); with
    add_zero_attn=True (the CLI's --zero-attn) it is torch's layer."""
    E, h, B, T = 16, 4, 2, 5
    m = torch_module(E, h, add_zero_attn=True, batch_first=True, seed=21)
    rng = np.random.default_rng(21)
    q = inputs(rng, B, T, E, True)
    want = run_torch(m, q, q, q, average_attn_weights=False)
    path = tmp_path / "bare.safetensors"
    _write_safetensors(path, state_dict(m), {})
    plain = mha.Layer.load(path, layout="torch", n_heads=h)
    zero = mha.Layer.load(path, layout="torch", n_heads=h, add_zero_attn=True)
    assert plain.config["add_zero_attn"] == 0 and zero.config["add_zero_attn"] == 1
    for layer in (plain, zero):
        layer.batch_first = True
    y_plain = plain.torch_forward(q, q, q, average_attn_weights=False)[0]
    y_zero = zero.torch_forward(q, q, q, average_attn_weights=False)[0]
    assert np.max(np.abs(np.asarray(y_plain) - want[0])) > 1e-3
    np.testing.assert_allclose(y_zero, want[0], rtol=0, atol=1e-5)
