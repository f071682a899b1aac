"""The config.json Hugging Face stores beside model.safetensors: `mha run`
on an hf checkpoint takes the head counts and the rotary settings
(rope_theta, rope_scaling, partial_rotary_factor) from it, flags override
it, and a bad value is refused naming the key. The expectations come from
PyTorch code written from the published formulas (test_modern*.py)."""
import json

import numpy as np
import pytest

from conftest import TORCH_SKIP_REASON, torch
from io_helpers import mha

if torch is None:
    pytest.skip(TORCH_SKIP_REASON, allow_module_level=True)

from test_modern import torch_attention  # noqa: E402
from test_modern_cli import T, base_inv_freq, llama3_inv_freq, llama_checkpoint, run  # noqa: E402

LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 1000}


def checkpoint(tmp_path, **config):
    """The Llama-style layer of test_modern_cli (4 heads, 2 kv heads, d_k 8)
    with a config.json written beside it; positions far apart saved as p.npy."""
    path, w, x = llama_checkpoint(tmp_path)
    base = {"architectures": ["LlamaForCausalLM"], "hidden_size": 32, "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": 8, "torch_dtype": "float32", "vocab_size": 128256}
    base.update(config)
    (tmp_path / "config.json").write_text(json.dumps({k: v for k, v in base.items() if v is not None}))
    pos = (np.arange(T) * 97 + 5).astype(np.int64)
    np.save(tmp_path / "p.npy", pos)
    return path, w, x, pos[None]


def test_llama3_config_alone_reproduces_torch(tmp_path):
    path, w, x, pos = checkpoint(tmp_path, rope_theta=500000.0, rope_scaling=LLAMA3)
    want = torch_attention(w, x[None], 4, 2, 8, pos=pos,
                           rope=(8, 500000.0, False, llama3_inv_freq(8, 500000.0, 8, 1, 4, 1000), 1.0))[0]
    got = run(tmp_path, "--weights", path, "--positions", tmp_path / "p.npy")  # no --heads, no rope flag
    np.testing.assert_allclose(got, want, atol=3e-5)
    unscaled = torch_attention(w, x[None], 4, 2, 8, pos=pos, rope=(8, 500000.0, False))[0]
    other_theta = torch_attention(w, x[None], 4, 2, 8, pos=pos, rope=(8, 10000.0, False))[0]
    assert np.abs(want - unscaled).max() > 1e-3 and np.abs(want - other_theta).max() > 1e-3
    # the explicit layout reads it too
    np.testing.assert_allclose(run(tmp_path, "--weights", path, "--layout", "hf", "--positions",
                                   tmp_path / "p.npy"), want, atol=3e-5)



def test_directory_and_sharded_index_read_config(tmp_path):
    """save_pretrained's directory (--weights DIR: its model.safetensors)
    and a sharded checkpoint's index take config.json beside them: no
    --heads, no rope flag, the same Y as the single file."""
    import shutil
    path, w, x, pos = checkpoint(tmp_path, rope_theta=500000.0, rope_scaling=LLAMA3)
    want = run(tmp_path, "--weights", path, "--positions", tmp_path / "p.npy")
    d = tmp_path / "saved"
    d.mkdir()
    shutil.copy(path, d / "model.safetensors")
    shutil.copy(tmp_path / "config.json", d / "config.json")
    np.testing.assert_array_equal(run(tmp_path, "--weights", d, "--positions", tmp_path / "p.npy"), want)
    names = ["model.layers.0.self_attn.%s_proj.weight" % n for n in "qkvo"]
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {n: path.name for n in names}}))
    np.testing.assert_array_equal(run(tmp_path, "--weights", tmp_path / "model.safetensors.index.json",
                                      "--positions", tmp_path / "p.npy"), want)
    torchless = torch_attention(w, x[None], 4, 2, 8, pos=pos, rope=(8, 500000.0, False))[0]
    assert np.abs(want - torchless).max() > 1e-3  # the config's llama3 scaling was applied


def test_gemma2_scale_and_softcap_from_config(tmp_path):
    """Gemma 2's config.json: the scores are scaled by
    query_pre_attn_scalar^-1/2 (not head_dim's) and soft-capped at
    attn_logit_softcapping; --scale and --softcap override them;
    Granite's attention_multiplier is the scale itself."""
    path, w, x, pos = checkpoint(tmp_path, rope_theta=10000.0, query_pre_attn_scalar=20, attn_logit_softcapping=2.0)
    flags = ("--weights", path, "--positions", tmp_path / "p.npy")
    rope = (8, 10000.0, False)
    want = torch_attention(w, x[None], 4, 2, 8, pos=pos, rope=rope, softcap=2.0, scale=20 ** -0.5)[0]
    np.testing.assert_allclose(run(tmp_path, *flags), want, atol=3e-5)
    plain = torch_attention(w, x[None], 4, 2, 8, pos=pos, rope=rope, softcap=2.0)[0]
    assert np.abs(want - plain).max() > 1e-3  # the scale matters
    over = torch_attention(w, x[None], 4, 2, 8, pos=pos, rope=rope, softcap=5.0, scale=0.3)[0]
    np.testing.assert_allclose(run(tmp_path, *flags, "--scale", 0.3, "--softcap", 5), over, atol=3e-5)
    path, w, x, pos = checkpoint(tmp_path, rope_theta=10000.0, attention_multiplier=0.0625)
    want = torch_attention(w, x[None], 4, 2, 8, pos=pos, rope=rope, scale=0.0625)[0]
    np.testing.assert_allclose(run(tmp_path, *flags), want, atol=3e-5)
    checkpoint(tmp_path, query_pre_attn_scalar=-4)
    with pytest.raises(AssertionError, match="query_pre_attn_scalar"):
        run(tmp_path, *flags)

def test_convert_keeps_what_config_gives_the_layer(tmp_path):
    """mha convert of an hf checkpoint writes config.json's RoPE (llama3
    scaling) and soft-cap into the native file: running it gives the
    source's Y without the config (before: the rotary settings were lost,
    Y 0.1 off, silently). The score scale and a sliding window are call
    options a native file does not keep: convert prints them, and the
    native file run with them gives the source's Y."""
    path, w, x, pos = checkpoint(tmp_path, model_type="mistral", rope_theta=500000.0, rope_scaling=LLAMA3,
                                 attn_logit_softcapping=2.0, query_pre_attn_scalar=20, sliding_window=5)
    want = run(tmp_path, "--weights", path, "--positions", tmp_path / "p.npy")
    native = tmp_path / "native.safetensors"
    out = mha("convert", "--from", "hf", "--to", "native", path, native).stdout
    assert "run it with --window 5 --scale 0.223606795 for the source's Y" in out
    (tmp_path / "config.json").unlink()  # the native file alone
    got = run(tmp_path, "--weights", native, "--positions", tmp_path / "p.npy", "--window", 5, "--scale", 0.223606795)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
    plain = run(tmp_path, "--weights", native, "--positions", tmp_path / "p.npy")
    assert np.abs(plain - want).max() > 1e-3  # the call options matter, and are the user's to pass


def test_flags_override_config(tmp_path):
    path, w, x, pos = checkpoint(tmp_path, rope_theta=500000.0, rope_scaling=LLAMA3)
    flags = ("--weights", path, "--positions", tmp_path / "p.npy")
    want = torch_attention(w, x[None], 4, 2, 8, pos=pos,
                           rope=(8, 10000.0, False, base_inv_freq(8, 10000.0) / 2, 1.0))[0]
    got = run(tmp_path, *flags, "--rope-theta", 10000, "--rope-scale", "linear:factor=2")
    np.testing.assert_allclose(got, want, atol=3e-5)
    inter = torch_attention(w, x[None], 4, 2, 8, pos=pos,
                            rope=(8, 500000.0, True, llama3_inv_freq(8, 500000.0, 8, 1, 4, 1000), 1.0))[0]
    np.testing.assert_allclose(run(tmp_path, *flags, "--rope", "interleaved"), inter, atol=3e-5)


def test_partial_rotary_and_yarn_defaults(tmp_path):
    """partial_rotary_factor 0.5 of head_dim 8 rotates 4 dims; YaRN without
    original_max_position_embeddings uses max_position_embeddings."""
    path, w, x, pos = checkpoint(tmp_path, rope_theta=10000.0, partial_rotary_factor=0.5)
    want = torch_attention(w, x[None], 4, 2, 8, pos=pos, rope=(4, 10000.0, False))[0]
    np.testing.assert_allclose(run(tmp_path, "--weights", path, "--positions", tmp_path / "p.npy"), want,
                               atol=3e-5)
    path, w, x, pos = checkpoint(tmp_path, rope_theta=10000.0, max_position_embeddings=64,
                                 rope_scaling={"type": "yarn", "factor": 4.0})
    spec = run(tmp_path, "--weights", path, "--heads", 4, "--rope", "halves", "--rope-theta", 10000, "--positions",
               tmp_path / "p.npy", "--rope-scale", "yarn:factor=4,original_max_position_embeddings=64")
    np.testing.assert_allclose(run(tmp_path, "--weights", path, "--positions", tmp_path / "p.npy"), spec, atol=1e-6)


@pytest.mark.parametrize("config, message", [
    ({"rope_theta": 500000.0, "rope_scaling": {"rope_type": "ntk", "factor": 2.0}},
     "rope_scaling.rope_type is \"ntk\"; expected \"linear\", \"llama3\", \"yarn\", \"dynamic\""),
    ({"rope_theta": 500000.0, "rope_scaling": {"rope_type": "dynamic", "factor": 2.0}},
     "max_position_embeddings missing; expected the context beyond which dynamic NTK scales"),
    ({"rope_theta": 500000.0, "rope_scaling": {"rope_type": "llama3", "factor": 8.0}},
     "rope_scaling.original_max_position_embeddings missing"),
    ({"rope_theta": 500000.0, "rope_scaling": {"rope_type": "linear", "factor": "2"}},
     "rope_scaling.factor is not a number; expected a number"),
    ({"rope_theta": 500000.0, "rope_scaling": {"rope_type": "linear", "factor": 0.5}},
     "rope_scaling.factor is out of range; expected a number in 1.."),
    ({"rope_theta": 500000.0, "rope_scaling": [8.0]}, "rope_scaling is not an object"),
    ({"rope_theta": "big"}, "rope_theta is not a number"),
    ({"num_attention_heads": 4.5}, "num_attention_heads is out of range; expected an integer"),
    ({"rope_theta": 10000.0, "partial_rotary_factor": 0.3}, "partial_rotary_factor 0.3 of head_dim 8"),
    ({"rope_theta": 10000.0, "head_dim": 16, "hidden_size": None}, "head_dim 16; expected the checkpoint's d_k = 8"),
    # the file of another model: refused at load, with or without rotary settings
    ({"head_dim": 16, "hidden_size": None}, "head_dim 16; expected the checkpoint's d_k = 8"),
    ({"hidden_size": 64}, "hidden_size 64; expected the checkpoint's d_model = 32"),
    ({"num_attention_heads": 2, "head_dim": None},
     "hidden_size / num_attention_heads 16; expected the checkpoint's d_k = 8"),
])
def test_bad_config_refused_naming_the_key(tmp_path, config, message):
    path, _, _, _ = checkpoint(tmp_path, **config)
    if config.get("head_dim") == 16 or config.get("num_attention_heads") == 2:
        # heads from the flags: the load must reach the head_dim check
        config_heads = ("--heads", 4, "--kv-heads", 2)
    else:
        config_heads = ()
    r = mha("run", "--weights", path, *config_heads, "--input", tmp_path / "x.npy", "--output", tmp_path / "y.npy",
            check=False)
    assert r.returncode == 1 and "config.json" in r.stderr and message in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not (tmp_path / "y.npy").exists()


def test_malformed_json_refused_and_other_layouts_ignore_it(tmp_path):
    path, w, x, _ = checkpoint(tmp_path, rope_theta=500000.0)
    (tmp_path / "config.json").write_text('{"rope_theta": 500000,')
    r = mha("run", "--weights", path, "--input", tmp_path / "x.npy", "--output", tmp_path / "y.npy", check=False)
    assert r.returncode == 1 and "config.json: line 1:" in r.stderr and "expected Hugging Face" in r.stderr, r.stderr
    # a native file beside a config.json is not an hf checkpoint: no rope from the file
    native = tmp_path / "native.safetensors"
    (tmp_path / "config.json").unlink()  # (convert would write its rope into the native file)
    mha("convert", "--from", "hf", "--heads", 4, "--to", "native", path, native)
    (tmp_path / "config.json").write_text('{"rope_theta": 500000}')
    want = torch_attention(w, x[None], 4, 2, 8)[0]
    np.testing.assert_allclose(run(tmp_path, "--weights", native), want, atol=3e-5)


def test_audit_reads_config(tmp_path):
    """`mha audit` on the same checkpoint: no flag needed to reproduce the
    PyTorch reference; one computed with the other pairing is named."""
    path, w, x, _ = checkpoint(tmp_path, rope_theta=500000.0)
    def audit(ref):
        np.save(tmp_path / "yref.npy", ref.astype(np.float32))
        return mha("audit", "--weights", path, "--input", tmp_path / "x.npy", "--reference", tmp_path / "yref.npy",
                   "--causal", check=False)
    r = audit(torch_attention(w, x[None], 4, 2, 8, rope=(8, 500000.0, False))[0])
    assert r.returncode == 0 and "rotary" not in r.stdout, r.stdout + r.stderr
    r = audit(torch_attention(w, x[None], 4, 2, 8, rope=(8, 500000.0, True))[0])
    assert r.returncode == 1 and "rotary convention mismatch" in r.stdout and "--rope interleaved" in r.stdout, \
        r.stdout + r.stderr


def test_layer_load_warns_that_it_does_not_apply_config_json(tmp_path):
    """mha.Layer.load reads the weights alone; with a config.json beside an
    hf checkpoint (file, directory, sharded index) it warns, naming the file
    and the commands that apply it (before: a Llama layer loaded without its
    RoPE, silently); 'error' refuses, 'ignore' is silent; a native file or a
    checkpoint without config.json loads without a word."""
    import shutil
    import warnings

    import mha as mha_binding
    path, w, x, pos = checkpoint(tmp_path, rope_theta=500000.0)
    d = tmp_path / "saved"
    d.mkdir()
    shutil.copy(path, d / "model.safetensors")
    shutil.copy(tmp_path / "config.json", d / "config.json")
    names = ["model.layers.0.self_attn.%s_proj.weight" % n for n in "qkvo"]
    index = tmp_path / "model.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": {n: path.name for n in names}}))
    for where, layout in ((path, "auto"), (path, "hf"), (d, "auto"), (index, "auto")):
        with pytest.warns(mha_binding.ConfigNotAppliedWarning, match=r"config.json lies beside this checkpoint "
                          r"and is not read here.*mha convert .* OUT.safetensors --to native"):
            layer = mha_binding.Layer.load(where, layout=layout, n_heads=4)
        np.testing.assert_array_equal(layer.weights()["w_q"], w["w_q"])  # the weights, without RoPE
        assert layer.config["rope"]["pairing"] == "none"
        with pytest.raises(mha_binding.ArgumentError, match="config.json lies beside"):
            mha_binding.Layer.load(where, layout=layout, n_heads=4, config_json="error")
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            mha_binding.Layer.load(where, layout=layout, n_heads=4, config_json="ignore")
    with pytest.raises(mha_binding.ArgumentError, match="config_json='always'; expected 'warn', 'error' or 'ignore'"):
        mha_binding.Layer.load(path, n_heads=4, config_json="always")
    # the advice works: convert writes the config's RoPE into a native file (here beside config.json)
    native = tmp_path / "native.safetensors"
    mha("convert", path, native, "--to", "native")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        layer = mha_binding.Layer.load(native)
    assert layer.config["rope"]["theta"] == 500000.0
    want = run(tmp_path, "--weights", path)
    np.testing.assert_allclose(layer.forward(x[None], causal=True)[0], want, rtol=0, atol=2e-6)
    (tmp_path / "config.json").unlink()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        mha_binding.Layer.load(path, n_heads=4)


def test_layer_load_names_a_bad_file_before_the_config_beside_it(tmp_path):
    """A malformed checkpoint with a config.json beside it is the loader's
    to name (FormatError), in every config_json mode; the check of
    config.json never reads the header in a way that raises first (before:
    AttributeError from a header that is a JSON list)."""
    import struct

    import mha as mha_binding
    (tmp_path / "config.json").write_text("{}")
    for header in (b"[1,2]", b"5", b'{"a": 5}'):
        (tmp_path / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header)
        for mode in ("warn", "error", "ignore"):
            with pytest.raises(mha_binding.FormatError, match="model.safetensors: header"):
                mha_binding.Layer.load(tmp_path / "model.safetensors", n_heads=2, config_json=mode)
