"""Hostile-input probe, round 31: the newest readers attacked as an
independent checker would (q/k norms under LFM2's and Ling's names, the
gated and int8 native files, config.json's per-layer lists, the flags).
Each test states the input, what happened before its fix, and checks the
refusal names the problem; inputs that were found handled keep one
regression test each. The expectations come from docs/FILES.md and from
the modeling code the docs cite (Hugging Face's config classes), not from
the library."""
import json
import os
import subprocess

import numpy as np
import pytest

import mha
from io_helpers import MHA, ROOT, write_safetensors, write_safetensors_raw

ASAN_MHA = os.path.join(ROOT, "build-asan", "mha")
D, H, G, DK = 32, 4, 2, 8
P = "model.layers.0.self_attn."


def hf_layer(seed=0, prefix=P):
    rng = np.random.default_rng(seed)
    return {prefix + "q_proj.weight": (rng.standard_normal((H * DK, D)) * 0.2).astype(np.float32),
            prefix + "k_proj.weight": (rng.standard_normal((G * DK, D)) * 0.2).astype(np.float32),
            prefix + "v_proj.weight": (rng.standard_normal((G * DK, D)) * 0.2).astype(np.float32),
            prefix + "o_proj.weight": (rng.standard_normal((D, H * DK)) * 0.2).astype(np.float32)}


def run_cli(*args, binary=MHA):
    return subprocess.run([binary] + [str(a) for a in args], capture_output=True, text=True, timeout=120)


def binaries():
    return [b for b in (MHA, ASAN_MHA) if os.path.exists(b)]


def refused_by_cli(tmp_path, weights, words, *flags):
    """mha run (and its ASan build, when built) refuses weights: exit 1, no
    output, no sanitizer report, one line naming every word."""
    x = tmp_path / "x.npy"
    np.save(x, np.random.default_rng(5).standard_normal((1, 6, D)).astype(np.float32))
    for binary in binaries():
        y = tmp_path / "y.npy"
        r = run_cli("run", "--weights", weights, "--input", x, "--output", y, *flags, binary=binary)
        assert r.returncode == 1 and not y.exists(), (binary, r.returncode, r.stderr)
        assert "Sanitizer" not in r.stderr and "runtime error" not in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr
        for w in words:
            assert w in r.stderr, (w, r.stderr)


# ------------------------------------------------------ q/k norms (hf)

@pytest.mark.parametrize("q_name,k_name", [("q_norm.weight", "k_norm.weight"),
                                           ("q_layernorm.weight", "k_layernorm.weight"),  # LFM2
                                           ("query_layernorm.weight", "key_layernorm.weight")])  # Ling
def test_shared_q_norm_beside_per_head_k_norm(tmp_path, q_name, k_name):
    """q's norm (d_k), one shared by every head, beside k's (h_kv*d_k), one
    per kv head. Before: k's size switched the layer to per-head norms after
    q's d_k floats were copied, and the layer read h*d_k floats from them (a
    heap over-read under ASan, garbage norms otherwise; exit 0). Now refused
    naming q's tensor and the per-head shape it must then have."""
    path = tmp_path / "model.safetensors"
    write_safetensors(path, {**hf_layer(), P + q_name: np.ones(DK, np.float32),
                             P + k_name: np.ones(G * DK, np.float32)})
    with pytest.raises(mha.ShapeError, match=r"%s has 8 elements .*expected \(heads, d_k\)" % q_name):
        mha.Layer.load(path, n_heads=H, n_kv_heads=G, config_json="ignore")
    refused_by_cli(tmp_path, path, [q_name, "(heads, d_k)"], "--heads", H, "--kv-heads", G)
    # both per head, or both shared, load
    for q, k in ((np.ones(H * DK), np.ones(G * DK)), (np.ones(DK), np.ones(DK))):
        write_safetensors(path, {**hf_layer(), P + q_name: q.astype(np.float32), P + k_name: k.astype(np.float32)})
        mha.Layer.load(path, n_heads=H, n_kv_heads=G, config_json="ignore")


@pytest.mark.parametrize("norm", ["query_layernorm", "key_layernorm"])
def test_ling_named_norm_with_bias_refused(tmp_path, norm):
    """Ling's names with a bias beside the weight (a LayerNorm with bias,
    which no reader implements). Before: the bias was not read and the layer
    ran the RMSNorm without it (exit 0), where q_layernorm.bias (LFM2's
    names) was refused. Now refused naming the tensor."""
    path = tmp_path / "model.safetensors"
    w = {**hf_layer(), P + "query_layernorm.weight": np.ones(DK, np.float32),
         P + "key_layernorm.weight": np.ones(DK, np.float32), P + norm + ".bias": np.zeros(DK, np.float32)}
    write_safetensors(path, w)
    with pytest.raises(mha.FormatError, match="a q/k LayerNorm .*bias is not implemented"):
        mha.Layer.load(path, n_heads=H, n_kv_heads=G, config_json="ignore")
    refused_by_cli(tmp_path, path, ["layernorm", "with a bias" if norm == "key_layernorm" else "bias"],
                   "--heads", H, "--kv-heads", G)


# ------------------------------------------- config.json's per-layer keys

def config_checkpoint(tmp_path, layer=5, **config):
    """An hf layer at model.layers.<layer> with config.json beside it."""
    path = tmp_path / "model.safetensors"
    write_safetensors(path, hf_layer(prefix="model.layers.%d.self_attn." % layer))
    base = {"model_type": "llama", "hidden_size": D, "num_attention_heads": H, "num_key_value_heads": G,
            "head_dim": DK, "rope_theta": 10000.0}
    base.update(config)
    (tmp_path / "config.json").write_text(json.dumps(base))
    return path


def run_layer(tmp_path, path, layer=5):
    x = tmp_path / "x.npy"
    np.save(x, np.random.default_rng(3).standard_normal((1, 12, D)).astype(np.float32))
    y = tmp_path / "y.npy"
    if y.exists():
        y.unlink()
    r = run_cli("run", "--weights", path, "--prefix", "model.layers.%d" % layer, "--input", x, "--output", y,
                "--causal")
    return r, (np.load(y) if r.returncode == 0 else None)


@pytest.mark.parametrize("key,value,words", [
    # shorter than the layer's number: before, layer 5 read as full attention (exit 0)
    ("layer_types", ["sliding_attention"] * 3, ["layer_types has 3 entries", "layer 5", "one per layer"]),
    ("layer_types", ["sliding_attention"] * 5 + [None], ["layer_types[5] is not a string"]),
    ("layer_types", [0, 1, 2, 3, 4, 5], ["layer_types[0] is not a string"]),
    ("layer_types", "sliding_attention", ["layer_types is not a list"]),
    # before, layer 5 rotated (HF indexes the list by the layer: an IndexError there)
    ("no_rope_layers", [1, 1, 1], ["no_rope_layers has 3 entries", "layer 5"]),
    ("no_rope_layers", ["1"] * 6, ["no_rope_layers[0] is not a number", "1 (rotary) or 0"]),
    ("no_rope_layers", 1, ["no_rope_layers is not a list"]),
    # before: (long long) of 2.5 made layer 2 slide (Qwen2: 2 >= 2.5 is false); 1e300 made every layer slide
    ("max_window_layers", 2.5, ["max_window_layers is out of range", "integer"]),
    ("max_window_layers", 1e300, ["max_window_layers is out of range"]),
])
def test_per_layer_keys_of_the_wrong_length_or_type(tmp_path, key, value, words):
    t = {"no_rope_layers": "smollm3", "max_window_layers": "qwen2"}.get(key, "mistral")
    path = config_checkpoint(tmp_path, model_type=t, sliding_window=4, use_sliding_window=True, **{key: value})
    r, _ = run_layer(tmp_path, path)
    assert r.returncode == 1 and "config.json: " in r.stderr, r.stderr
    for w in words:
        assert w in r.stderr, (w, r.stderr)
    assert not (tmp_path / "y.npy").exists()


def test_no_rope_layers_false_is_nope(tmp_path):
    """no_rope_layers [true, ..., false]: SmolLM 3 and Llama 4 test the
    entry's truth, so false is NoPE as 0 is. Before: false rotated (only a
    number 0 was read as off), silently."""
    outs = {}
    for name, lst in (("zero", [1] * 5 + [0]), ("false", [True] * 5 + [False]), ("one", [1] * 6)):
        r, outs[name] = run_layer(tmp_path, config_checkpoint(tmp_path, model_type="smollm3", no_rope_layers=lst))
        assert r.returncode == 0, r.stderr
    np.testing.assert_array_equal(outs["false"], outs["zero"])
    assert np.abs(outs["one"] - outs["zero"]).max() > 1e-3  # the rotary matters at these positions


def test_layer_types_in_range_still_read(tmp_path):
    """A list holding the layer is read at its index (sliding vs full)."""
    full = config_checkpoint(tmp_path, model_type="mistral", sliding_window=2, layer_types=["full_attention"] * 6)
    _, y_full = run_layer(tmp_path, full)
    slide = config_checkpoint(tmp_path, model_type="mistral", sliding_window=2,
                              layer_types=["full_attention"] * 5 + ["sliding_attention"])
    _, y_slide = run_layer(tmp_path, slide)
    assert y_full is not None and y_slide is not None
    assert np.abs(y_full - y_slide).max() > 1e-3


# ------------------------------------------------------- head counts

@pytest.mark.parametrize("kv", ["1073741824", "2147483647", "3", "8"])
def test_metadata_kv_heads_that_divide_no_head_count(tmp_path, kv):
    """A native file whose n_kv_heads fits an int but divides no head
    count. Before: 2^30 kv heads times d_k overflowed int (undefined; UBSan
    stops the ASan build) and the message spoke of (d_kv_in, 0) columns;
    3 and 8 were refused by w_k's shape, not by name. Now MHA_E_SHAPE
    naming both counts, before any product."""
    rng = np.random.default_rng(1)
    w = {m: (rng.standard_normal(s) * 0.2).astype(np.float32)
         for m, s in (("w_q", (D, H * DK)), ("w_k", (D, H * DK)), ("w_v", (D, H * DK)), ("w_o", (H * DK, D)))}
    path = tmp_path / "n.safetensors"
    write_safetensors(path, w, {"n_heads": str(H), "n_kv_heads": kv})
    with pytest.raises(mha.ShapeError, match="n_heads = 4 do not split into n_kv_heads = %s groups" % kv):
        mha.Layer.load(path)
    refused_by_cli(tmp_path, path, ["n_kv_heads = %s" % kv, "dividing n_heads"])


def test_config_kv_heads_not_dividing_names_config(tmp_path):
    """config.json's num_key_value_heads 4096 beside 4 heads: refused naming
    the counts and that config.json gave them."""
    path = config_checkpoint(tmp_path, num_key_value_heads=4096)
    r, _ = run_layer(tmp_path, path)
    assert r.returncode == 1, r.stderr
    for w in ("n_kv_heads = 4096", "from the config.json beside the checkpoint"):
        assert w in r.stderr, r.stderr


# ------------------------------------- found right: kept as regressions

def _int8(a):
    """per-column int8 codes of a (K, N) and their (ceil(K/32), N) scales."""
    K = a.shape[0]
    sc = np.stack([np.abs(a[g:g + 32]).max(0) / 127 for g in range(0, K, 32)]).astype(np.float32)
    q = np.concatenate([np.round(a[g:g + 32] / sc[g // 32]) for g in range(0, K, 32)])
    return q.astype(np.int8), sc


@pytest.mark.parametrize("case,words", [
    ("no w_g_scale", ["w_g_scale", "missing", "(1, 32)"]),
    ("w_g_scale (2, 32)", ["w_g_scale", "(2, 32)", "expected F32 (1, 32)"]),
    ("w_g F32", ["w_g", "int8"]),
])
def test_gated_int8_file_refusals(tmp_path, case, words):
    """An int8 native file of a gated layer (output_gate = 1, w_g with its
    w_g_scale): a missing or misshapen scale, or a w_g whose dtype is not
    the file's, is refused naming w_g's tensors (found right)."""
    rng = np.random.default_rng(2)
    e, d = {}, 32
    for m, s in (("w_q", (d, d)), ("w_k", (d, d)), ("w_v", (d, d)), ("w_o", (d, d)), ("w_g", (d, d))):
        a = (rng.standard_normal(s) * 0.2).astype(np.float32)
        if m == "w_o":  # groups restart at each head's d_v = 8 rows: 4 groups
            q, sc = zip(*(_int8(a[r:r + 8]) for r in range(0, d, 8)))
            q, sc = np.concatenate(q), np.concatenate(sc)
        else:
            q, sc = _int8(a)
        e[m] = ("I8", q.shape, q.tobytes())
        e[m + "_scale"] = ("F32", sc.shape, sc.astype("<f4").tobytes())
    if case == "no w_g_scale":
        del e["w_g_scale"]
    elif case == "w_g_scale (2, 32)":
        e["w_g_scale"] = ("F32", (2, 32), np.ones((2, 32), "<f4").tobytes())
    else:
        e["w_g"] = ("F32", (d, d), np.zeros((d, d), "<f4").tobytes())
    path = tmp_path / "g8.safetensors"
    meta = {"n_heads": "4", "output_gate": "1", "weights_dtype": "int8", "int8_scales": "per_32_inputs"}
    write_safetensors_raw(path, e, meta)
    with pytest.raises(mha.FormatError) as err:
        mha.Layer.load(path)
    for w in words:
        assert w in str(err.value), (w, str(err.value))
    refused_by_cli(tmp_path, path, words[:1])


def test_dropout_p_outside_0_1_refused():
    """options.dropout_p NaN, negative, 1: MHA_E_ARG naming the value and
    the range on both paths (found right)."""
    rng = np.random.default_rng(4)
    w = {m: (rng.standard_normal((D, D)) * 0.3).astype(np.float32) for m in ("w_q", "w_k", "w_v", "w_o")}
    layer = mha.Layer(D, H, bias=False, weights=w)
    x = rng.standard_normal((1, 5, D)).astype(np.float32)
    for p in (float("nan"), -0.1, 1.0):
        for path in ("reference", "fast"):
            with pytest.raises(mha.ArgumentError, match=r"dropout_p=.*expected 0 <= p < 1"):
                layer.forward(x, dropout_p=p, path=path)


@pytest.mark.parametrize("key,value,words", [
    # before: layer 5 of a 2-layer list read as global (exit 0)
    ("attention_layers", ["global", "local"], ["attention_layers gives 2 layers", "layer 5"]),
    ("attention_types", [[["global", "local"], 1]], ["attention_types gives 2 layers", "layer 5"]),
    ("attention_layers", ["global"] * 5 + [1], ["attention_layers holds an entry of another type"]),
    ("attention_types", [[["global", "local"], "3"]], ["attention_types holds an entry of another type"]),
])
def test_gpt_neo_layer_lists_of_the_wrong_length_or_type(tmp_path, key, value, words):
    """GPT-Neo's per-layer kinds follow layer_types' rule: a list that does
    not hold the layer --prefix names, or an entry of another type, is
    refused by name (GPTNeoConfig requires one kind per layer)."""
    path = config_checkpoint(tmp_path, model_type="gpt_neo", window_size=4, **{key: value})
    r, _ = run_layer(tmp_path, path)
    assert r.returncode == 1 and "config.json: GPT-Neo's " in r.stderr, r.stderr
    for w in words:
        assert w in r.stderr, (w, r.stderr)
    assert not (tmp_path / "y.npy").exists()


@pytest.mark.parametrize("present,missing", [("query_layernorm", "key_layernorm.weight"),
                                             ("k_layernorm", "q_layernorm.weight")])
def test_lone_aliased_norm_names_its_partner(tmp_path, present, missing):
    """One q/k norm under Ling's or LFM2's names without the other: refused
    naming the missing norm under the same family's name (before: Qwen's
    k_norm.weight / q_norm.weight, which the file never used)."""
    path = tmp_path / "model.safetensors"
    write_safetensors(path, {**hf_layer(), P + present + ".weight": np.ones(DK, np.float32)})
    with pytest.raises(mha.FormatError, match="lacks " + missing.replace(".", r"\.")):
        mha.Layer.load(path, n_heads=H, n_kv_heads=G, config_json="ignore")
