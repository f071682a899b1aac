"""The Python binding without torch: every option of the C API through
numpy, checked against a float64 numpy oracle written here from the math
in mha.h, and the error path (exceptions carrying mha_last_error())."""
import ctypes

import pytest

from conftest import require

np = require("numpy")
import mha  # noqa: E402

TOL = 1e-5


# ------------------------------------------------------------ numpy oracle

def oracle(w, cfg, x, kv=None, value=None, *, scale=0.0, causal=False, align="top_left", window_left=None,
           window_right=None, keep_mask=None, additive_mask=None, key_keep=None, key_additive=None,
           masked_row="zero", interventions=None):
    """y, z, contributions, probs in float64, straight from mha.h's formulas;
    K from kv (None: x), V from value (None: kv)."""
    h, g, dk, dv = cfg["n_heads"], cfg["n_kv_heads"], cfg["d_k"], cfg["d_v"]
    x = x.astype(np.float64)
    kv = x if kv is None else kv.astype(np.float64)
    value = kv if value is None else value.astype(np.float64)
    B, T, _ = x.shape
    S = kv.shape[1]
    get = lambda n, size: w[n].astype(np.float64) if n in w else np.zeros(size)  # noqa: E731
    q = x @ w["w_q"] + get("b_q", h * dk)
    k = kv @ w["w_k"] + get("b_k", g * dk)
    v = value @ w["w_v"] + get("b_v", g * dv)
    if cfg["add_bias_kv"]:
        k = np.concatenate([k, np.broadcast_to(w["bias_k"], (B, 1, g * dk))], axis=1)
        v = np.concatenate([v, np.broadcast_to(w["bias_v"], (B, 1, g * dv))], axis=1)
    if cfg["add_zero_attn"]:
        k = np.concatenate([k, np.zeros((B, 1, g * dk))], axis=1)
        v = np.concatenate([v, np.zeros((B, 1, g * dv))], axis=1)
    Sx = k.shape[1]
    sc = scale or 1.0 / np.sqrt(dk)
    i = np.arange(T)[:, None] + (S - T if align == "bottom_right" else 0)
    j = np.arange(S)[None, :]
    allowed = np.ones((B, h, T, S), dtype=bool)
    add = np.zeros((B, h, T, S))
    if causal:
        allowed &= j <= i
    if window_left is not None:
        allowed &= j >= i - window_left
    if window_right is not None:
        allowed &= j <= i + window_right
    if keep_mask is not None:
        allowed &= (keep_mask[None, None] if keep_mask.ndim == 2 else keep_mask).astype(bool)
    if key_keep is not None:
        allowed &= key_keep.astype(bool)[:, None, None, :]
    if additive_mask is not None:
        add = add + (additive_mask if additive_mask.ndim == 4 else additive_mask[None, None])
    if key_additive is not None:
        add = add + key_additive[:, None, None, :]
    allowed &= ~np.isneginf(add)
    extra = Sx - S
    allowed = np.concatenate([allowed, np.ones((B, h, T, extra), dtype=bool)], axis=-1)
    add = np.concatenate([np.where(np.isneginf(add), 0.0, add), np.zeros((B, h, T, extra))], axis=-1)
    z = np.zeros((B, T, h * dv))
    probs = np.zeros((B, h, T, Sx))
    for r in range(h):
        gr = r // (h // g)
        s = sc * np.einsum("btd,bsd->bts", q[..., r * dk:(r + 1) * dk], k[..., gr * dk:(gr + 1) * dk])
        s = np.where(allowed[:, r], s + add[:, r], -np.inf)
        empty = ~allowed[:, r].any(-1)
        mx = np.where(empty, 0.0, s.max(-1))
        e = np.exp(s - mx[..., None])
        p = e / np.where(empty, 1.0, e.sum(-1))[..., None]
        fill = np.nan if masked_row == "nan" else 0.0
        p[empty] = fill
        probs[:, r] = p
        z[..., r * dv:(r + 1) * dv] = np.einsum("bts,bsd->btd", np.nan_to_num(p, nan=0.0),
                                                v[..., gr * dv:(gr + 1) * dv])
        zr = z[..., r * dv:(r + 1) * dv]
        zr[empty] = fill
    for r, op in enumerate(interventions or []):
        blk = z[..., r * dv:(r + 1) * dv]
        if op == "zero":
            blk[...] = 0.0
        elif op == "mean":
            blk[...] = blk.reshape(-1, dv).mean(0)
        elif isinstance(op, tuple) and op[0] == "scale":
            blk *= op[1]
        elif isinstance(op, tuple) and op[0] == "replace":
            blk[...] = op[1]
    wo = w["w_o"].astype(np.float64)
    contrib = np.stack([z[..., r * dv:(r + 1) * dv] @ wo[r * dv:(r + 1) * dv] for r in range(h)])
    y = contrib.sum(0) + get("b_o", cfg["d_model"])
    return y, z, contrib, probs


def random_layer(rng, **cfg_kw):
    layer = mha.Layer(**cfg_kw)
    c = layer.config
    shapes = mha.Layer._weight_shapes(type("C", (), c))
    w = {n: rng.uniform(-0.7, 0.7, s).astype(np.float32) for n, s in shapes.items()
         if (n[0] == "w") or (n.startswith("b_") and c["bias"]) or (n.startswith("bias_") and c["add_bias_kv"])}
    layer.set_weights(w)
    return layer, w, c


def assert_close(got, want, what):
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    assert got.shape == want.shape, f"{what}: shape {got.shape}, want {want.shape}"
    assert np.array_equal(np.isnan(got), np.isnan(want)), f"{what}: NaN pattern differs"
    fin = ~np.isnan(want)
    scale = max(1.0, float(np.abs(want[fin]).max())) if fin.any() else 1.0
    err = float(np.abs(got[fin] - want[fin]).max()) if fin.any() else 0.0
    assert err <= TOL * scale, f"{what}: max abs error {err:.3g} > {TOL * scale:.3g}"


# ------------------------------------------------------------ forward options

CONFIGS = [
    dict(d_model=12, n_heads=4),
    dict(d_model=12, n_heads=4, n_kv_heads=2, d_k=5, d_v=3, d_kv_in=7, bias=False),
    dict(d_model=8, n_heads=2, n_kv_heads=1, add_bias_kv=True, add_zero_attn=True, d_kv_in=6),
]


@pytest.mark.parametrize("cfg", CONFIGS, ids=["mha", "gqa_widths", "mqa_extra_keys"])
def test_forward_options_match_oracle(cfg):
    rng = np.random.default_rng(1)
    layer, w, c = random_layer(rng, **cfg)
    B, T, S, h = 2, 4, 6, c["n_heads"]
    x = rng.standard_normal((B, T, c["d_model"])).astype(np.float32)
    kv = rng.standard_normal((B, S, c["d_kv_in"])).astype(np.float32)
    keep = rng.random((B, 1, T, S)) > 0.3
    add = rng.standard_normal((1, h, T, S)).astype(np.float32)
    add[0, 0, 1, :2] = -np.inf
    key_keep = np.ones((B, S), dtype=bool)
    key_keep[1, -2:] = False
    key_add = rng.standard_normal((B, S)).astype(np.float32)
    repl = rng.standard_normal((B, T, c["d_v"])).astype(np.float32)
    ivs = [("scale", 0.5), "zero", "mean", ("replace", repl)][:h] if h == 4 else ["keep", ("scale", -2.0)]
    opts = [
        dict(),
        dict(causal=True, align="bottom_right"),
        dict(causal=True, align="top_left", scale=0.3),
        dict(window_left=1, window_right=2, align="bottom_right"),
        dict(keep_mask=keep, additive_mask=add),
        dict(key_keep=key_keep, key_additive=key_add, masked_row="nan"),
        dict(keep_mask=np.zeros((T, S), dtype=bool), masked_row="nan"),
        dict(keep_mask=np.zeros((T, S), dtype=bool)),
        dict(interventions=ivs),
    ]
    for o in opts:
        for path in ("reference", "auto"):
            y, cap = layer.forward(x, kv, capture=True, path=path, **o)
            wy, wz, wc, wp = oracle(w, c, x, kv, **o)
            what = f"{sorted(o)} on {path}"
            assert_close(y, wy, f"y {what}")
            assert_close(cap["z"], wz, f"z {what}")
            assert_close(cap["probs"], wp, f"probs {what}")
            if not np.isnan(wy).any():
                assert_close(cap["contributions"], wc, f"contributions {what}")
                # the head contract: contributions sum (plus b_O) to Y
                b_o = w.get("b_o", np.zeros(c["d_model"]))
                assert_close(cap["contributions"].sum(0) + b_o, y, f"sum of contributions {what}")


def test_interventions_as_dict_and_zero_removes_contribution():
    rng = np.random.default_rng(2)
    layer, w, c = random_layer(rng, d_model=8, n_heads=2)
    x = rng.standard_normal((1, 3, 8)).astype(np.float32)
    y, cap = layer.forward(x, capture=("contributions",))
    y0 = layer.forward(x, interventions={1: "zero"})
    assert_close(y0, y - cap["contributions"][1], "zeroing head 1")
    with pytest.raises(mha.ArgumentError, match="head positions"):
        layer.forward(x, interventions={2: "zero"})


def test_self_attention_kv_none_equals_kv_x():
    rng = np.random.default_rng(3)
    layer, _, _ = random_layer(rng, d_model=8, n_heads=2)
    x = rng.standard_normal((2, 5, 8)).astype(np.float32)
    assert np.array_equal(layer(x), layer.forward(x, x))


# ------------------------------------------- a value source apart from the key

VALUE_CONFIGS = [
    dict(d_model=12, n_heads=4, n_kv_heads=2, d_k=5, d_v=3, d_kv_in=7, d_v_in=9),
    dict(d_model=8, n_heads=2, d_kv_in=6, d_v_in=6, bias=False, add_bias_kv=True, add_zero_attn=True),
    dict(d_model=8, n_heads=2, d_v_in=5),  # keys from x, values from elsewhere
]


@pytest.mark.parametrize("cfg", VALUE_CONFIGS, ids=["gqa_dvin9", "same_width_extra_keys", "self_keys"])
def test_value_source_matches_oracle(cfg):
    """forward(x, kv, value): K from kv (or x), V from value of width d_v_in."""
    rng = np.random.default_rng(8)
    layer, w, c = random_layer(rng, **cfg)
    assert c["d_v_in"] == cfg["d_v_in"] and w["w_v"].shape[0] == cfg["d_v_in"]
    B, T = 2, 4
    self_keys = c["d_kv_in"] == c["d_model"] and "d_kv_in" not in cfg
    S = T if self_keys else 6
    x = rng.standard_normal((B, T, c["d_model"])).astype(np.float32)
    kv = None if self_keys else rng.standard_normal((B, S, c["d_kv_in"])).astype(np.float32)
    value = rng.standard_normal((B, S, c["d_v_in"])).astype(np.float32)
    key_keep = np.ones((B, S), dtype=bool)
    key_keep[1, :2] = False
    for o in (dict(), dict(causal=True, align="bottom_right", key_keep=key_keep)):
        wy, wz, wc, wp = oracle(w, c, x, kv, value, **o)
        for path in ("reference", "auto", "fast"):
            y, cap = layer.forward(x, kv, value, capture=True, path=path, **o)
            what = f"{sorted(o)} on {path}"
            assert_close(y, wy, f"y {what}")
            assert_close(cap["z"], wz, f"z {what}")
            assert_close(cap["probs"], wp, f"probs {what}")
            assert_close(cap["contributions"], wc, f"contributions {what}")
            assert_close(layer(x, kv, value=value, path=path, **o), wy, f"value= keyword {what}")


def test_value_source_errors_and_files(tmp_path):
    rng = np.random.default_rng(9)
    layer, w, c = random_layer(rng, d_model=8, n_heads=2, d_kv_in=6, d_v_in=5)
    x = rng.standard_normal((2, 3, 8)).astype(np.float32)
    kv = rng.standard_normal((2, 4, 6)).astype(np.float32)
    value = rng.standard_normal((2, 4, 5)).astype(np.float32)
    with pytest.raises(mha.ShapeError, match="d_v_in=5"):
        layer(x, kv)  # one source cannot feed both widths
    with pytest.raises(mha.ShapeError, match=r"value has shape \(2, 3, 5\)"):
        layer(x, kv, value[:, :3])
    with pytest.raises(mha.ShapeError, match="d_v_in=5"):
        layer(x, kv, kv)
    value[1, 2, 3] = np.inf
    with pytest.raises(mha.NonFiniteError, match=r"v_src\[") as e:
        layer(x, kv, value)
    assert e.value.message.startswith("mha_forward_kv: ")
    value[1, 2, 3] = 0.5
    with pytest.raises(mha.ShapeError, match="w_v"):
        layer.set_weights(dict(w, w_v=np.zeros((6, 8), np.float32)))
    # the native checkpoint keeps d_v_in (W_V's rows)
    path = tmp_path / "value_source.safetensors"
    layer.save(path)
    back = mha.Layer.load(path)
    assert back.config == layer.config and back.config["d_v_in"] == 5
    assert np.array_equal(back(x, kv, value), layer(x, kv, value))


# ------------------------------------------------------ labels, contract

def test_labels_permutation_and_contract():
    rng = np.random.default_rng(4)
    layer, w, c = random_layer(rng, d_model=12, n_heads=4, n_kv_heads=2)
    x = rng.standard_normal((1, 3, 12)).astype(np.float32)
    y = layer(x)
    assert layer.labels("q") == [0, 1, 2, 3] and layer.labels("K") == [0, 1]
    layer.permute_heads([2, 3, 0, 1])
    assert layer.labels("q") == [2, 3, 0, 1] and layer.labels("k") == [1, 0]
    assert_close(layer(x), y, "after permute_heads")
    assert layer.check_contract().ok and layer.check_contract(x).residual_checked
    with pytest.raises(mha.ArgumentError, match="kv group"):
        layer.permute_heads([0, 2, 1, 3])  # mixes kv groups under GQA
    layer.permute_block("o", [1, 0, 2, 3])
    rep = layer.check_contract(x)
    assert not rep.ok and rep.bad_block == "O" and rep.bad_position == 0
    assert "label" in rep.message
    layer.set_labels("o", [2, 3, 0, 1])  # relabel only: labels agree again, weights do not
    assert layer.check_contract().labels_ok
    with pytest.raises(mha.ArgumentError, match="repeats"):
        layer.set_labels("q", [0, 0, 1, 2])
    with pytest.raises(mha.ArgumentError, match="block"):
        layer.labels("x")
    # a bool is no head index, even where numpy would make the list integers
    before = layer.labels("q")
    for bad in ([True, False, 3, 2], (2, 3, False, True)):
        with pytest.raises(mha.ArgumentError, match=r"perm\[\d\]=(True|False) is a bool"):
            layer.permute_heads(bad)
    with pytest.raises(mha.ArgumentError, match=r"labels\[0\]=True is a bool"):
        layer.set_labels("q", [True, 0, 2, 3])
    assert layer.labels("q") == before


def test_weights_round_trip():
    rng = np.random.default_rng(5)
    layer, w, c = random_layer(rng, d_model=8, n_heads=2, add_bias_kv=True)
    got = layer.weights()
    assert sorted(got) == sorted(w)
    for n in w:
        assert np.array_equal(got[n], w[n]), n
    assert "b_q" not in mha.Layer(8, 2, bias=False).weights()


def test_save_load_keeps_weights_and_labels(tmp_path):
    rng = np.random.default_rng(7)
    layer, w, c = random_layer(rng, d_model=12, n_heads=4, n_kv_heads=2, add_zero_attn=True)
    layer.permute_heads([2, 3, 0, 1])
    path = tmp_path / "layer.safetensors"
    layer.save(path)
    back = mha.Layer.load(path)
    assert back.config == layer.config
    assert all(back.labels(b) == layer.labels(b) for b in "qkvo")
    for n, a in layer.weights().items():
        assert np.array_equal(back.weights()[n], a), n
    with pytest.raises(mha.FileError, match="missing.safetensors"):
        mha.Layer.load(tmp_path / "missing.safetensors")
    with pytest.raises(mha.ArgumentError, match="layout"):
        mha.Layer.load(path, layout="keras")



def test_load_a_sharded_checkpoint_by_its_index(tmp_path):
    """Layer.load of model.safetensors.index.json with the decoder layer as
    prefix: layer 1's attention, split between two shards, loads as from
    one file; the index's shard names may not leave its directory."""
    import json
    from io_helpers import write_safetensors
    rng = np.random.default_rng(8)
    D, h, h_kv, d = 16, 4, 2, 4
    t = {}
    for lay in range(2):
        p = f"model.layers.{lay}.self_attn."
        t.update({p + "q_proj.weight": rng.uniform(-.5, .5, (h * d, D)), p + "k_proj.weight": rng.uniform(-.5, .5, (h_kv * d, D)),
                  p + "v_proj.weight": rng.uniform(-.5, .5, (h_kv * d, D)), p + "o_proj.weight": rng.uniform(-.5, .5, (D, h * d))})
    t = {k: v.astype(np.float32) for k, v in t.items()}
    names = list(t)
    shards = {"model-00001-of-00002.safetensors": names[:6], "model-00002-of-00002.safetensors": names[6:]}
    for f, ns in shards.items():
        write_safetensors(tmp_path / f, {n: t[n] for n in ns})
    index = tmp_path / "model.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": {n: f for f, ns in shards.items() for n in ns}}))
    write_safetensors(tmp_path / "whole.safetensors", t)
    x = rng.standard_normal((2, 5, D)).astype(np.float32)
    got = mha.Layer.load(index, n_heads=h, prefix="model.layers.1").forward(x, causal=True)
    want = mha.Layer.load(tmp_path / "whole.safetensors", n_heads=h, prefix="model.layers.1").forward(x, causal=True)
    assert np.array_equal(got, want)
    index.write_text(json.dumps({"weight_map": {n: "../" + f for f, ns in shards.items() for n in ns}}))
    with pytest.raises(mha.MhaError, match="beside the index"):
        mha.Layer.load(index, n_heads=h, prefix="model.layers.1")

# ------------------------------------------------------------- errors

def test_errors_carry_the_library_message():
    layer = mha.Layer(8, 2)
    x = np.zeros((1, 3, 8), dtype=np.float32)
    x[0, 1, 2] = np.nan
    with pytest.raises(mha.NonFiniteError) as e:
        layer(x)
    assert "x[10]" in str(e.value) and e.value.status == -5
    assert e.value.message.startswith("mha_forward: ") and mha.last_error() in e.value.message
    add = np.zeros((3, 3), dtype=np.float32)
    add[0, 0] = np.nan
    with pytest.raises(mha.NonFiniteError, match="additive_mask"):
        layer(np.zeros((1, 3, 8)), additive_mask=add)
    with pytest.raises(mha.ArgumentError, match="n_heads=3 does not divide d_model=8"):
        mha.Layer(8, 3)
    with pytest.raises(mha.ShapeError, match=r"expected \(B,T,d_model=8\)"):
        layer(np.zeros((1, 3, 7)))
    with pytest.raises(mha.ShapeError, match="kv"):
        layer(np.zeros((1, 3, 8)), np.zeros((2, 3, 8)))
    with pytest.raises(mha.DTypeError, match="int64"):
        layer(np.zeros((1, 3, 8), dtype=np.int64))
    with pytest.raises(mha.DTypeError, match="keep_mask"):
        layer(np.zeros((1, 3, 8)), keep_mask=np.zeros((3, 3), dtype=np.float32))
    with pytest.raises(mha.ShapeError, match="keep_mask"):
        layer(np.zeros((1, 3, 8)), keep_mask=np.ones((3, 4), dtype=bool))
    with pytest.raises(mha.ArgumentError, match="masked_row"):
        layer(np.zeros((1, 3, 8)), masked_row="inf")
    with pytest.raises(mha.ArgumentError, match="weights.w_k is NULL"):
        layer.set_weights({"w_q": np.zeros((8, 8))})
    assert isinstance(mha.ShapeError("m"), ValueError)


def test_fast_path_request():
    """MHA_PATH_FAST either answers like the reference or declines with
    UnsupportedError (then AUTO falls back to the reference)."""
    rng = np.random.default_rng(6)
    layer, _, _ = random_layer(rng, d_model=16, n_heads=4)
    x = rng.standard_normal((2, 5, 16)).astype(np.float32)
    ref = layer(x, path="reference")
    try:
        fast = layer(x, path="fast")
    except mha.UnsupportedError as e:
        assert e.status == -8 and e.message
        assert np.array_equal(layer(x, path="auto"), ref)
    else:
        assert_close(fast, ref, "fast path")


# ------------------------------------------------------ the seed steps

def test_seed_steps():
    """The lesson's example: heads [1,2] and [3,4] concatenated and mixed by
    W; expected numbers are the lesson's: [1,2,3,4] and [4,6,-2,-2]."""
    z = mha.concat_heads([np.array([[1, 2]], np.float32), np.array([[3, 4]], np.float32)])
    assert z.tolist() == [[1, 2, 3, 4]]
    W = np.array([[1, 0, 1, 0], [0, 1, 0, 1], [1, 0, -1, 0], [0, 1, 0, -1]], np.float32)
    assert mha.project_out(z, W).tolist() == [[4, 6, -2, -2]]
    assert mha.concat_heads([z[:, :2], z[:, 2:]], order=[1, 0]).tolist() == [[3, 4, 1, 2]]
    a, b = mha.split_heads(z, 2)
    assert a.tolist() == [[1, 2]] and b.tolist() == [[3, 4]]
    contrib = mha.head_contributions(z, W, 2)
    assert np.array_equal(contrib.sum(0), mha.project_out(z, W))
    assert mha.head_intervene(z, "zero", 1, 2).tolist() == [[1, 2, 0, 0]]
    assert mha.head_intervene(z, ("scale", 2.0), 0, 2).tolist() == [[2, 4, 3, 4]]
    assert mha.head_intervene(z, ("replace", [[7, 8]]), 0, 2).tolist() == [[7, 8, 3, 4]]


def test_num_threads_and_library_symbols():
    from mha import _lib
    assert _lib.missing == [], f"libmha.so lacks {_lib.missing}"
    mha.set_num_threads(1)
    assert mha.get_num_threads() == 1
    mha.set_num_threads(0)  # OpenMP's default
    assert mha.get_num_threads() >= 1


def test_the_binding_uses_only_functions_declared_public_in_mha_h():
    """libmha.so exports only what include/mha.h declares with MHA_API."""
    import os
    import re
    from conftest import ROOT
    from mha import _lib
    header = open(os.path.join(ROOT, "include", "mha.h")).read()
    public = set(re.findall(r"MHA_API[^;{]*?\b(mha_\w+)\s*\(", header))
    src = open(_lib.__file__).read()
    bound = set(re.findall(r'_sig\("(mha_\w+)"', src))
    assert len(bound) > 30, bound
    assert bound <= public, f"not declared MHA_API in mha.h: {sorted(bound - public)}"


def test_struct_sizes_checked_against_the_library():
    """Every struct the binding declares has the library's size; a library
    whose structs differ (another version) is refused by name at import."""
    from mha import _lib
    for name, cls in _lib.STRUCTS.items():
        assert _lib.lib.mha_struct_size(name.encode()) == ctypes.sizeof(cls), name
    _lib.check_struct_sizes(lambda name: _lib.lib.mha_struct_size(name.encode()))  # no error: the same
    grown = lambda name: ctypes.sizeof(_lib.STRUCTS[name]) + (8 if name == "mha_options" else 0)  # noqa: E731
    with pytest.raises(ImportError, match="declares mha_options as .* bytes, this binding as .* another version"):
        _lib.check_struct_sizes(grown)
