"""Probes of the Python surface with the inputs users pass (numpy arrays of
every layout, torch tensors into mha.nn, torch's argument conventions)
that found defects; each test failed before its fix.

- a library message that names another function than the call was
  prefixed again: 'mha_forward_kv: mha_forward: B=2 T=5 S=0 ...' (S = 0
  keys through mha.nn or Layer.forward with a value source);
- mha.nn.MultiheadAttention and torch_forward reported a query, key or
  value of the wrong width or batch as 'x' or 'kv' (names the caller
  never used) with the batch-first shape, not the (L,N,E) one passed;
- mha.nn: a numpy array as query read 'got float32 on -'; embed_dim 16.0,
  '16' or True, and kdim -1 or 2.5 failed inside torch.empty naming no
  argument, and kdim=0 made a module whose every forward failed naming w_k;
- Layer(weights=[]) and set_weights([]) raised AttributeError ('list'
  object has no attribute 'get'), set_weights('w_q') listed its letters
  as unknown weight names;
- head_intervene(z, ['replace', a], ...), a list as Layer.forward's
  interventions take it, was refused as 'expected (1,rows,d)';
- Cache.forward(n_new=[True, 1]) read True as 1 token (the binding's rule:
  a bool is not an integer).
- a sparse (or mkldnn) tensor failed inside torch naming no argument (a
  sparse key_padding_mask with NotImplementedError from aten::eq); a numpy
  masked array was read with its masked entries as data.
- additive_mask and key_additive both at finfo(float32).min (Hugging
  Face's masking value): the fast path adds their sum in float (-inf: the
  key forbidden), the reference judged it in double (finite): a fully
  masked row got zeros or NaN on one path, uniform weights on the other.
  A sum beyond +FLT_MAX (+inf in float, NaN on the fast path) is refused.
"""

import numpy as np
import pytest

from conftest import TORCH_SKIP_REASON, torch

if torch is None:
    pytest.skip(TORCH_SKIP_REASON, allow_module_level=True)

import mha  # noqa: E402
import mha.nn  # noqa: E402

E, H, B, T, S = 16, 4, 2, 5, 7


def data(shape, seed=1):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


# ------------------------------------------------- the library's own prefix

def test_zero_keys_through_mha_forward_kv_is_named_once():
    layer = mha.Layer(E, H)
    x = np.ones((B, T, E), np.float32)
    with pytest.raises(mha.ShapeError) as err:
        layer.forward(x, np.ones((B, 0, E), np.float32), np.ones((B, 0, E), np.float32))
    assert str(err.value).startswith("mha_forward: B=2 T=5 S=0; expected all >= 1"), str(err.value)
    m = mha.nn.MultiheadAttention(E, H, batch_first=True)
    k = data((B, 0, E))
    with pytest.raises(mha.ShapeError) as err:
        m(data((B, T, E)), k, data((B, 0, E)))
    assert str(err.value).startswith("mha_forward: B=2 T=5 S=0"), str(err.value)


# ------------------------------- query/key/value named as the caller passed them

QKV_CASES = [  # (batch_first, query, key, value, name, expected): all shapes in the caller's layout
    (True, (B, T, E + 1), (B, S, E), (B, S, E), "query", "(N,L,E=16)"),
    (False, (T, B, E + 1), (S, B, E), (S, B, E), "query", "(L,N,E=16)"),
    (True, (B, T, E), (B, S, E + 1), (B, S, E + 1), "key", "(N=2,S,kdim=16)"),
    (False, (T, B, E), (S, B, E + 1), (S, B, E + 1), "key", "(S,N=2,kdim=16)"),
    (False, (T, B, E), (S, B + 1, E), (S, B + 1, E), "key", "(S,N=2,kdim=16)"),
    (False, (T, B, E), (S, B, E), (S, B, E + 3), "value", "(S=7,N=2,vdim=16)"),
    (False, (T, 0, E), (S, 0, E + 3), (S, 0, E + 3), "key", "(S,N=0,kdim=16)"),  # empty batch too
    (None, (T, E), (S, E), (S, E - 1), "value", "(S=7,vdim=16) unbatched"),
]


def _qkv_message(name, shape, expected):
    return rf"^{name} has shape \({', '.join(map(str, shape))}\); expected {expected.replace('(', '[(]').replace(')', '[)]')}"


@pytest.mark.parametrize("bf, q, k, v, name, expected", QKV_CASES)
def test_nn_module_names_query_key_value_in_the_callers_layout(bf, q, k, v, name, expected):
    m = mha.nn.MultiheadAttention(E, H, batch_first=bool(bf))
    shape = {"query": q, "key": k, "value": v}[name]
    with pytest.raises(mha.ShapeError, match=_qkv_message(name, shape, expected)):
        m(data(q), data(k), data(v))


@pytest.mark.parametrize("bf, q, k, v, name, expected", QKV_CASES)
def test_torch_forward_names_query_key_value_in_the_callers_layout(bf, q, k, v, name, expected):
    layer = mha.Layer(E, H)
    shape = {"query": q, "key": k, "value": v}[name]
    arrays = [np.ones(s, np.float32) for s in (q, k, v)]
    with pytest.raises(mha.ShapeError, match=_qkv_message(name, shape, expected)):
        layer.torch_forward(*arrays, batch_first=bool(bf))


def test_kdim_vdim_module_names_the_width_it_expected():
    m = mha.nn.MultiheadAttention(E, H, kdim=6, vdim=9, batch_first=True)
    with pytest.raises(mha.ShapeError, match=r"^value has shape \(2, 7, 6\); expected \(N=2,S=7,vdim=9\)"):
        m(data((B, T, E)), data((B, S, 6)), data((B, S, 6)))  # value is not key: its own width is checked
    y, _ = m(data((B, T, E)), data((B, S, 6)), data((B, S, 9)))  # the right widths still run
    assert y.shape == (B, T, E)


# ----------------------------------------------- mha.nn's constructor and inputs

def test_numpy_query_is_named_as_numpy_not_as_float32_on_nothing():
    m = mha.nn.MultiheadAttention(E, H, batch_first=True)
    x = np.ones((B, T, E), np.float32)
    with pytest.raises(TypeError, match=r"query is a numpy\.ndarray, not a tensor; expected a float32 CPU "
                                        r"tensor \(torch\.from_numpy\(query\)"):
        m(x, x, x)
    with pytest.raises(TypeError, match="x is a numpy.ndarray, not a tensor"):
        mha.nn.Attention(E, H)(x)
    with pytest.raises(TypeError, match=r"query must be a float32 CPU tensor; got torch\.float64 on cpu"):
        m(*(data((B, T, E)).double(),) * 3)  # a tensor of another dtype: as before


@pytest.mark.parametrize("kw, words", [
    (dict(embed_dim=16.0), "embed_dim=16.0 is a float"),
    (dict(embed_dim="16"), "embed_dim='16' is a str"),
    (dict(embed_dim=True), "embed_dim=True is a bool"),
    (dict(num_heads=0), "num_heads=0 is out of range; expected an integer in 1.."),
    (dict(kdim=0), "kdim=0 is out of range; expected an integer in 1.."),
    (dict(kdim=-1), "kdim=-1 is out of range"),
    (dict(vdim=2.5), "vdim=2.5 is a float"),
])
def test_constructor_sizes_follow_the_bindings_integer_rule(kw, words):
    args = dict(embed_dim=E, num_heads=H, **{k: v for k, v in kw.items() if k in ("kdim", "vdim")})
    args.update({k: v for k, v in kw.items() if k in ("embed_dim", "num_heads")})
    with pytest.raises(mha.ArgumentError, match=words):
        mha.nn.MultiheadAttention(**args)


def test_constructor_still_takes_numpy_integers_and_refuses_a_non_multiple():
    m = mha.nn.MultiheadAttention(np.int64(E), np.int32(H), kdim=np.int64(6))
    assert (m.embed_dim, m.num_heads, m.kdim) == (E, H, 6) and type(m.embed_dim) is int
    with pytest.raises(ValueError, match="embed_dim=16 must be a positive multiple of num_heads=3"):
        mha.nn.MultiheadAttention(E, 3)


# --------------------------------------------------------- weights as a mapping

@pytest.mark.parametrize("weights", [[], [("w_q", np.zeros((E, E), np.float32))], "w_q", 5])
def test_weights_that_are_not_a_mapping_are_named(weights):
    layer = mha.Layer(E, H)
    with pytest.raises(mha.ArgumentError, match=f"weights is a {type(weights).__name__}; expected a dict"):
        layer.set_weights(weights)
    with pytest.raises(mha.ArgumentError, match=f"weights is a {type(weights).__name__}; expected a dict"):
        mha.Layer(E, H, weights=weights)


def test_weights_from_an_npz_file_still_load(tmp_path):
    rng = np.random.default_rng(0)
    src = mha.Layer(E, H)
    src.set_weights({n: rng.standard_normal(w.shape).astype(np.float32) for n, w in src.weights().items()})
    np.savez(tmp_path / "w.npz", **src.weights())
    with np.load(tmp_path / "w.npz") as npz:  # NpzFile: a mapping that is not a dict
        layer = mha.Layer(E, H, weights=npz)
    x = rng.standard_normal((B, T, E)).astype(np.float32)
    assert np.array_equal(layer.forward(x), src.forward(x))


# ------------------------------------------------------------ head_intervene

def test_head_intervene_replace_as_a_list_like_forwards_interventions():
    rng = np.random.default_rng(2)
    z = rng.standard_normal((3, 8)).astype(np.float32)
    v = rng.standard_normal((3, 4))
    want = mha.head_intervene(z, ("replace", v), 1, 2)
    got = mha.head_intervene(z, ["replace", v], 1, 2)
    assert np.array_equal(got, want) and np.array_equal(got[:, 4:], v.astype(np.float32))
    with pytest.raises(mha.ShapeError, match=r"value has shape \(2,4\); expected \(3,4\)"):
        mha.head_intervene(z, ["replace", v[:2]], 1, 2)  # the caller's (rows, d), not (1, rows, d)


# ------------------------------------------------------------------ Cache n_new

@pytest.mark.parametrize("n_new", [[True, 1], (1, False)])
def test_cache_n_new_bool_is_not_a_count(n_new):
    layer = mha.Layer(E, H)
    x = np.ones((B, 1, E), np.float32)
    with mha.Cache(layer, batch=B, capacity=8) as cache:
        with pytest.raises(mha.ArgumentError, match=r"n_new\[\d\]=(True|False) is a bool; expected an integer"):
            cache.forward(None, x, n_new=n_new)
        assert cache.lengths() == [0, 0]  # nothing appended
        cache.forward(None, x, n_new=[np.int64(1), 0])  # numpy integers still count
        assert cache.lengths() == [1, 0]


# ------------------------------------- sparse tensors, masked arrays: refused by name

def test_sparse_tensors_are_named_not_left_to_torch():
    m = mha.nn.MultiheadAttention(E, H, batch_first=True)
    x = data((B, T, E))
    with pytest.raises(TypeError, match=r"query has layout torch\.sparse_coo; expected a dense"):
        m(x.to_sparse(), x, x)
    with pytest.raises(TypeError, match=r"key_padding_mask has layout torch\.sparse_coo; expected a dense"):
        m(x, x, x, key_padding_mask=torch.zeros(B, T, dtype=torch.bool).to_sparse())
    with pytest.raises(TypeError, match=r"x has layout torch\.sparse_coo"):
        mha.nn.Attention(E, H)(x.to_sparse())
    layer = mha.Layer(E, H)
    with pytest.raises(mha.ArgumentError, match=r"x is a tensor of layout torch\.sparse_coo; expected a dense"):
        layer.forward(x.to_sparse())
    with pytest.raises(mha.ArgumentError, match=r"key_keep is a tensor of layout torch\.sparse_coo"):
        layer.forward(x.numpy(), key_keep=torch.ones(B, T, dtype=torch.bool).to_sparse())


def test_masked_array_with_masked_entries_is_refused_not_read_as_data():
    layer = mha.Layer(E, H, weights={n: np.full(w.shape, 0.1, np.float32) for n, w in mha.Layer(E, H).weights().items()})
    x = np.ma.masked_array(np.ones((B, T, E), np.float32))
    y = layer.forward(x)  # no entry masked: the data as it is
    assert np.array_equal(y, layer.forward(np.ones((B, T, E), np.float32)))
    x[0, 1] = np.ma.masked
    with pytest.raises(mha.ArgumentError, match=r"x is a numpy masked array with 16 masked entries, whose mask "
                                                r"would be ignored"):
        layer.forward(x)
    with pytest.raises(mha.ArgumentError, match="key_padding_mask is a numpy masked array"):
        layer.torch_forward(np.ones((T, B, E), np.float32),
                            key_padding_mask=np.ma.masked_array(np.zeros((B, T), bool), mask=np.eye(B, T, dtype=bool)))


# ------------------------------- two finite additive masks whose sum overflows float32

def _ones_layer(seed=3):
    rng = np.random.default_rng(seed)
    layer = mha.Layer(E, H)
    layer.set_weights({n: rng.uniform(-0.3, 0.3, w.shape).astype(np.float32) for n, w in layer.weights().items()})
    return layer, rng.standard_normal((B, T, E)).astype(np.float32)


@pytest.mark.parametrize("masked_row", ["zero", "nan"])
def test_finfo_min_in_both_additive_masks_forbids_the_key_in_every_path(masked_row):
    """HF masks with torch.finfo(float32).min; given as both additive_mask and
    key_additive the sum is below -FLT_MAX: -inf in float, as the fast path
    (and torch in fp32) adds it. The reference judged the double sum finite
    and gave the fully masked rows uniform weights, the fast path zeros/NaN."""
    layer, x = _ones_layer()
    lo = np.finfo(np.float32).min
    am = np.zeros((T, T), np.float32)
    am[:, :2] = lo
    kp = np.zeros((B, T), np.float32)
    kp[1] = lo  # batch 1: every key below -FLT_MAX in the sum for keys 0, 1; lo alone for the rest
    ys = {p: layer.forward(x, additive_mask=am, key_additive=kp, masked_row=masked_row, capture="probs", path=p)
          for p in ("reference", "fast", "auto")}
    y, probs = ys["reference"][0], ys["reference"][1]["probs"]
    for p in ("fast", "auto"):
        np.testing.assert_allclose(ys[p][0], y, atol=2e-6, err_msg=p)
        np.testing.assert_allclose(ys[p][1]["probs"], probs, atol=2e-6, err_msg=p)
    assert np.all(probs[1][..., :2] == 0)  # keys 0, 1 of batch 1 forbidden (their sums -inf in float)
    assert np.allclose(probs[1][..., 2:].sum(-1), 1)  # the other keys: lo alone is finite, they share the row
    assert np.all(probs[0][..., :2] == 0) and np.allclose(probs[0].sum(-1), 1)


@pytest.mark.parametrize("masked_row", ["zero", "nan"])
def test_finfo_min_in_both_masks_on_every_key_is_a_fully_masked_row(masked_row):
    layer, x = _ones_layer(4)
    lo = np.finfo(np.float32).min
    am = np.full((T, T), lo, np.float32)
    kp = np.zeros((B, T), np.float32)
    kp[1] = lo  # batch 1: every key's sum below -FLT_MAX
    ys = [layer.forward(x, additive_mask=am, key_additive=kp, masked_row=masked_row, path=p)
          for p in ("reference", "fast")]
    b_o = layer.weights()["b_o"]
    for y in ys:
        if masked_row == "nan":
            assert np.isnan(y[1]).all() and not np.isnan(y[0]).any()
        else:
            np.testing.assert_allclose(y[1], np.broadcast_to(b_o, y[1].shape), atol=1e-6)  # Z = 0: b_O
    np.testing.assert_allclose(ys[0][0], ys[1][0], atol=2e-6)  # batch 0: lo alone, uniform weights


def test_additive_masks_whose_sum_overflows_to_plus_inf_are_refused():
    layer, x = _ones_layer()
    am = np.zeros((T, T), np.float32)
    am[:, 1] = 3e38
    kp = np.zeros((B, T), np.float32)
    kp[:, 1] = 3e38
    for p in ("reference", "fast"):
        with pytest.raises(mha.ArgumentError, match=r"additive_mask \(up to 3e\+38\) plus key_additive \(up to "
                                                    r"3e\+38\) overflows float32 to \+inf"):
            layer.forward(x, additive_mask=am, key_additive=kp, path=p)
    kp[:, 1] = 4e37  # 3.4e38 in all: within float32, still runs
    assert np.isfinite(layer.forward(x, additive_mask=am, key_additive=kp)).all()
