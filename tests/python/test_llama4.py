"""Llama 4's attention layers (model_type llama4 / llama4_text, iRoPE)
through `mha run` and config.json alone, against a float64 oracle written
from Hugging Face's modeling_llama4: the rotary layers rotate q and k as
complex numbers of adjacent pairs (interleaved), then divide them by their
RMS (Llama4TextL2Norm, use_qk_norm, eps rms_norm_eps) and attend inside
chunks of attention_chunk_size (the chunked causal mask); every
no_rope_layer_interval-th layer (or no_rope_layers' zeros) has no rotary
and attends globally, its queries scaled by attn_temperature_tuning (1 +
attn_scale ln(1 + floor((p + 1) / floor_scale)) at position p). Before:
rotate_half, no norm and no chunk, silently; then the tuning refused from
position floor_scale - 1 on."""
import json
import math

import numpy as np
import pytest

from conftest import TORCH_SKIP_REASON, torch
from io_helpers import mha, write_safetensors

if torch is None:
    pytest.skip(TORCH_SKIP_REASON, allow_module_level=True)

D, H, HKV, DK, T = 32, 4, 2, 8, 13


def checkpoint(tmp_path, layer, nested=False, **text):
    """A Llama 4 layer `layer` (q/k/v/o_proj under model.layers.N.self_attn)
    with config.json; nested: the multimodal file's text_config."""
    rng = np.random.default_rng(40 + layer)
    w = {n: rng.uniform(-.4, .4, s).astype(np.float32)
         for n, s in (("q", (H * DK, D)), ("k", (HKV * DK, D)), ("v", (HKV * DK, D)), ("o", (D, H * DK)))}
    pre = "language_model.model.layers.%d.self_attn." % layer if nested else "model.layers.%d.self_attn." % layer
    write_safetensors(tmp_path / "model.safetensors", {pre + n + "_proj.weight": a for n, a in w.items()})
    cfg = {"model_type": "llama4_text", "hidden_size": D, "num_attention_heads": H, "num_key_value_heads": HKV,
           "head_dim": DK, "rope_theta": 500000.0, "rms_norm_eps": 1e-5, "num_hidden_layers": 8,
           "attention_chunk_size": 4, **text}
    if nested:
        cfg = {"model_type": "llama4", "text_config": cfg, "vision_config": {"model_type": "llama4_vision_model"}}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    x = np.random.default_rng(7).uniform(-1, 1, (T, D)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    return w, x, pre.rsplit(".self_attn.", 1)[0]


def oracle(w, x, rope, chunk, qk_norm, eps=1e-5, theta=500000.0, temperature=None, positions=None):
    """Llama4TextAttention's forward for one sequence, float64;
    temperature: (floor_scale, attn_scale) of a NoPE layer's tuning, at
    the queries' cache positions (arange(T), or `positions`)."""
    t = {n: torch.tensor(a, dtype=torch.float64) for n, a in w.items()}
    xs = torch.tensor(x, dtype=torch.float64)
    q = (xs @ t["q"].T).view(T, H, DK)
    k = (xs @ t["k"].T).view(T, HKV, DK)
    v = (xs @ t["v"].T).view(T, HKV, DK)
    if rope:  # apply_rotary_emb: view_as_complex of (..., DK/2, 2) times e^(i pos f)
        inv = 1.0 / theta ** (torch.arange(0, DK, 2, dtype=torch.float64) / DK)
        cis = torch.polar(torch.ones(T, DK // 2, dtype=torch.float64), torch.arange(T)[:, None] * inv)
        q = torch.view_as_real(torch.view_as_complex(q.reshape(T, H, DK // 2, 2)) * cis[:, None]).flatten(2)
        k = torch.view_as_real(torch.view_as_complex(k.reshape(T, HKV, DK // 2, 2)) * cis[:, None]).flatten(2)
    if qk_norm:  # Llama4TextL2Norm, after the rotation
        q = q * torch.rsqrt(q.pow(2).mean(-1, keepdim=True) + eps)
        k = k * torch.rsqrt(k.pow(2).mean(-1, keepdim=True) + eps)
    if temperature:  # as Hugging Face computes it, in float32
        cache_position = torch.arange(T) if positions is None else torch.tensor(positions)
        shift = 0.0 if temperature[2:] == ("ministral3",) else 1.0  # Ministral 3: floor(p / L)
        scales = torch.log1p(torch.floor((cache_position.float() + shift) / temperature[0])) * temperature[1] + 1.0
        q = q * scales.to(torch.float64)[:, None, None]
    k, v = k.repeat_interleave(H // HKV, 1), v.repeat_interleave(H // HKV, 1)
    s = torch.einsum("ihd,jhd->hij", q, k) / math.sqrt(DK)
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    allowed = (j <= i) & ((i // chunk == j // chunk) if chunk else True)
    s = s.masked_fill(~allowed, float("-inf"))
    z = torch.einsum("hij,jhd->ihd", torch.softmax(s, -1), v).reshape(T, H * DK)
    return (z @ t["o"].T).numpy()


def run(tmp_path, prefix, *flags, check=True):
    out = tmp_path / "y.npy"
    out.unlink(missing_ok=True)
    r = mha("run", "--weights", tmp_path / "model.safetensors", "--prefix", prefix, "--input", tmp_path / "x.npy",
            "--output", out, "--causal", *flags, check=check)
    return np.load(out) if check else r


@pytest.mark.parametrize("nested", [False, True])
def test_rotary_layer_interleaved_l2_norm_chunked(tmp_path, nested):
    w, x, prefix = checkpoint(tmp_path, 0, nested)
    got = run(tmp_path, prefix)
    want = oracle(w, x, rope=True, chunk=4, qk_norm=True)
    np.testing.assert_allclose(got, want, atol=2e-5 * np.abs(want).max())
    for wrong in (oracle(w, x, rope=True, chunk=0, qk_norm=True), oracle(w, x, rope=True, chunk=4, qk_norm=False)):
        assert np.abs(wrong - want).max() > 1e-3  # each part matters at this size
    # mha convert keeps the rotation and the norm in the native file and prints the chunk, a call option
    native = tmp_path / "native.safetensors"
    out = mha("convert", "--from", "hf", "--prefix", prefix, "--to", "native", tmp_path / "model.safetensors",
              native).stdout
    assert "run it with --chunk 4 for the source's Y" in out, out
    (tmp_path / "config.json").unlink()
    mha("run", "--weights", native, "--input", tmp_path / "x.npy", "--output", tmp_path / "n.npy", "--causal",
              "--chunk", 4)
    np.testing.assert_allclose(np.load(tmp_path / "n.npy"), want, atol=2e-5 * np.abs(want).max())


def test_nope_layer_global_with_temperature(tmp_path):
    """Layer 3 (interval 4): no rotary, no norm, global attention, and
    the queries' temperature: floor_scale 64 leaves T 13's queries at 1;
    floor_scale 4 gives them four factors (to 1 + 0.1 ln 4, and with
    attn_scale 0.5 to 1.69); off by false or 0; --attn-temperature wins
    over config.json; --positions set the factors; mha convert keeps it."""
    w, x, prefix = checkpoint(tmp_path, 3, floor_scale=64)
    plain = oracle(w, x, rope=False, chunk=0, qk_norm=False)
    np.testing.assert_allclose(run(tmp_path, prefix), plain, atol=2e-5)
    for text, temp in (({}, (4, 0.1)), ({"attn_scale": 0.5}, (4, 0.5))):
        checkpoint(tmp_path, 3, floor_scale=4, **text)
        want = oracle(w, x, rope=False, chunk=0, qk_norm=False, temperature=temp)
        assert np.abs(want - plain).max() > 1e-3
        np.testing.assert_allclose(run(tmp_path, prefix), want, atol=2e-6 * np.abs(want).max())
    for off in (False, 0):
        checkpoint(tmp_path, 3, floor_scale=4, attn_scale=0.5, attn_temperature_tuning=off)
        np.testing.assert_allclose(run(tmp_path, prefix), plain, atol=2e-5)
    # the flag: on a layer config.json leaves plain, and over config.json's own
    want = oracle(w, x, rope=False, chunk=0, qk_norm=False, temperature=(3, 0.25))
    np.testing.assert_allclose(run(tmp_path, prefix, "--attn-temperature", "3,0.25"), want,
                               atol=2e-6 * np.abs(want).max())
    checkpoint(tmp_path, 3, floor_scale=4)
    np.testing.assert_allclose(run(tmp_path, prefix, "--attn-temperature", "3,0.25"), want,
                               atol=2e-6 * np.abs(want).max())
    np.testing.assert_allclose(run(tmp_path, prefix, "--attn-temperature", "3,0.25,llama4"), want,
                               atol=2e-6 * np.abs(want).max())
    want = oracle(w, x, rope=False, chunk=0, qk_norm=False, temperature=(3, 0.25, "ministral3"))
    np.testing.assert_allclose(run(tmp_path, prefix, "--attn-temperature", "3,0.25,ministral3"), want,
                               atol=2e-6 * np.abs(want).max())
    # explicit positions choose each query's factor (Hugging Face's cache_position)
    pos = np.array([0, 40, 3, 7, 100, 2, 9, 15, 30, 1, 63, 64, 5], dtype=np.int32)
    np.save(tmp_path / "p.npy", pos)
    want = oracle(w, x, rope=False, chunk=0, qk_norm=False, temperature=(4, 0.1), positions=pos)
    np.testing.assert_allclose(run(tmp_path, prefix, "--positions", tmp_path / "p.npy"), want,
                               atol=2e-6 * np.abs(want).max())
    # a native file keeps the temperature in its metadata
    native = tmp_path / "native.safetensors"
    mha("convert", "--from", "hf", "--prefix", prefix, "--to", "native", tmp_path / "model.safetensors", native)
    (tmp_path / "config.json").unlink()
    mha("run", "--weights", native, "--input", tmp_path / "x.npy", "--output", tmp_path / "n.npy", "--causal")
    want = oracle(w, x, rope=False, chunk=0, qk_norm=False, temperature=(4, 0.1))
    np.testing.assert_allclose(np.load(tmp_path / "n.npy"), want, atol=2e-6 * np.abs(want).max())


@pytest.mark.parametrize("spec", ["4", "4,", "0,0.1", "4.5,0.1", "4,0", "4,-1", "4,nan", "4,1e-60", "4,0.1,2", "x,1",
                                  "4,0.1,qwen", "4,0.1,", "4,0.1,ministral3,1"])
def test_temperature_flag_refused(tmp_path, spec):
    _, _, prefix = checkpoint(tmp_path, 3, floor_scale=64)
    r = run(tmp_path, prefix, "--attn-temperature", spec, check=False)
    assert r.returncode == 2 and "--attn-temperature '%s'; expected FLOOR,SCALE[,llama4|ministral3]" % spec in r.stderr, \
        r.stderr
    assert not (tmp_path / "y.npy").exists()


def test_config_keys_choose_the_layers(tmp_path):
    """no_rope_layers and layer_types as the config gives them; use_qk_norm
    false (Maverick); attention_chunk_size null; --chunk and --qk-norm
    flags win; a prefix without a layer number is asked for."""
    w, x, prefix = checkpoint(tmp_path, 1, no_rope_layers=[1, 0, 1, 1, 1, 1, 1, 1])
    np.testing.assert_allclose(run(tmp_path, prefix), oracle(w, x, rope=False, chunk=0, qk_norm=False), atol=2e-5)
    w, x, prefix = checkpoint(tmp_path, 1, use_qk_norm=False,
                              layer_types=["full_attention"] * 8)
    np.testing.assert_allclose(run(tmp_path, prefix), oracle(w, x, rope=True, chunk=0, qk_norm=False), atol=2e-5)
    w, x, prefix = checkpoint(tmp_path, 2, attention_chunk_size=None)
    np.testing.assert_allclose(run(tmp_path, prefix), oracle(w, x, rope=True, chunk=0, qk_norm=True), atol=2e-5)
    np.testing.assert_allclose(run(tmp_path, prefix, "--chunk", 3), oracle(w, x, rope=True, chunk=3, qk_norm=True),
                               atol=2e-5)
    r = mha("run", "--weights", tmp_path / "model.safetensors", "--input", tmp_path / "x.npy",
            "--output", tmp_path / "y.npy", "--causal", check=False)
    assert r.returncode != 0 and "--prefix" in r.stderr, r.stderr


def test_vision_encoder_refused(tmp_path):
    """The multimodal file's vision tower (vision_config, model_type
    llama4_vision_model) rotates by 2-D patch positions: refused by name."""
    rng = np.random.default_rng(3)
    pre = "vision_model.model.layers.0.self_attn."
    write_safetensors(tmp_path / "model.safetensors", {pre + n + "_proj.weight": rng.uniform(-.4, .4, (D, D)).astype(
        np.float32) for n in "qkvo"})
    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "llama4", "text_config": {"model_type": "llama4_text", "hidden_size": D,
                                                "num_attention_heads": H},
        "vision_config": {"model_type": "llama4_vision_model", "hidden_size": D, "num_attention_heads": H}}))
    np.save(tmp_path / "x.npy", np.zeros((T, D), np.float32))
    r = mha("run", "--weights", tmp_path / "model.safetensors", "--prefix", "vision_model.model.layers.0",
            "--input", tmp_path / "x.npy", "--output", tmp_path / "y.npy", check=False)
    assert r.returncode == 1 and "llama4_vision_model" in r.stderr and not (tmp_path / "y.npy").exists(), r.stderr
