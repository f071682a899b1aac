"""Adversarial probe of the call-dependent RoPE scalings, chunked attention,
clip_qkv and the new checkpoint families: values that would reach the
library silently changed (a non-zero float that rounds to 0 in float32 and
then reads as "none" or "the default"; a fractional context length in a
native file's metadata, truncated) must be refused, naming the value."""
import json
import struct

import numpy as np
import pytest

import mha
from io_helpers import mha as mha_cli

D, H = 8, 2


def test_tiny_floats_refused_not_rounded_to_none():
    """clip_qkv=1e-50 rounds to 0 in float32, which the library reads as no
    clamp: mha.nn.Attention printed clip_qkv=1e-50 and ran unclamped. Now
    every float option that rounds to 0 is refused, naming it."""
    for kw in ({"clip_qkv": 1e-50}, {"softcap": 1e-50}, {"clip_qkv": -1e-50}):
        with pytest.raises(mha.ArgumentError, match="rounds to 0 in float32"):
            mha.Layer(D, H, **kw)
    x = np.ones((1, 2, D), np.float32)
    with pytest.raises(mha.ArgumentError, match="scale=1e-50 rounds to 0"):
        mha.Layer(D, H).forward(x, scale=1e-50)  # 0 is 1/sqrt(d_k): another y
    # float32's subnormals still hold a bound: kept as given
    assert mha.Layer(D, H, clip_qkv=1e-40).config["clip_qkv"] == pytest.approx(1e-40, rel=1e-2)
    assert mha.Layer(D, H, clip_qkv=0.0).config["clip_qkv"] == 0.0
    torch = pytest.importorskip("torch")
    from mha.nn import Attention
    with pytest.raises(mha.ArgumentError, match="rounds to 0 in float32"):
        Attention(D, H, clip_qkv=1e-50)
    del torch


def _edit_metadata(src, dst, **meta):
    raw = open(src, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    header["__metadata__"].update(meta)
    hb = json.dumps(header).encode()
    hb += b" " * (-len(hb) % 8)
    open(dst, "wb").write(struct.pack("<Q", len(hb)) + hb + raw[8 + n:])


@pytest.fixture
def longrope_native(tmp_path):
    """A native file of a LongRoPE layer with clip_qkv, written by Layer.save."""
    rng = np.random.default_rng(2)
    rope = dict(pairing="halves", dim=4, scaling="longrope", original_max_positions=8, factor=4.0,
                short_factor=[1.0, 1.5], long_factor=[2.0, 9.0])
    layer = mha.Layer(D, H, rope=rope, clip_qkv=0.5, softcap=30.0,
                      weights={n: rng.uniform(-.5, .5, (D, D)).astype(np.float32)
                               for n in ("w_q", "w_k", "w_v", "w_o")}, bias=False)
    path = tmp_path / "n.safetensors"
    layer.save(str(path))
    x = rng.uniform(-1, 1, (12, D)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    return path, layer, x


@pytest.mark.parametrize("key, value, message", [
    ("clip_qkv", "1e-50", "metadata clip_qkv = '1e-50'"),
    ("softcap", "1e-50", "softcap or qk_norm_eps is > 0 but rounds to 0"),
    ("rope_original_max_positions", "8.7", "rope_original_max_positions = '8.7' is not a whole number"),
    ("rope_dim", "4.5", "rope_dim = '4.5' is not a whole number"),
])
def test_native_metadata_that_would_change_silently_is_refused(tmp_path, longrope_native, key, value, message):
    """Before: clip_qkv 1e-50 became 0 (no clamp), softcap 1e-50 none,
    rope_original_max_positions 8.7 the threshold 8 (LongRoPE's long
    factors one position early), rope_dim 4.5 four dims; each ran."""
    path, layer, x = longrope_native
    want = layer.forward(x[None], causal=True)[0]
    out = tmp_path / "y.npy"
    mha_cli("run", "--weights", path, "--input", tmp_path / "x.npy", "--output", out, "--causal")
    np.testing.assert_allclose(np.load(out), want, atol=1e-6)  # the file as written runs the layer
    bad = tmp_path / "bad.safetensors"
    _edit_metadata(path, bad, **{key: value})
    r = mha_cli("run", "--weights", bad, "--input", tmp_path / "x.npy", "--output", tmp_path / "z.npy", "--causal",
                check=False)
    assert r.returncode != 0 and message in r.stderr, r.stderr
    with pytest.raises(mha.MhaError, match=message.split(" = ")[0].split(" or ")[0]):
        mha.Layer.load(str(bad))


def _longrope_oracle(w, x, pos, H, G, dk, theta, short, long, L, mscale):
    """float64 numpy of Hugging Face's longrope attention (rotate_half on
    every dim, cos and sin times mscale), causal, one sequence."""
    seq = int(pos.max()) + 1
    ext = np.array(long if seq > L else short)
    inv = 1.0 / (ext * theta ** (np.arange(0, dk, 2) / dk))
    ang = pos[:, None] * inv[None]
    cos, sin = np.cos(np.concatenate([ang, ang], -1)) * mscale, np.sin(np.concatenate([ang, ang], -1)) * mscale

    def rot(m, n):
        m = m.reshape(len(x), n, dk)
        half = np.concatenate([-m[..., dk // 2:], m[..., :dk // 2]], -1)
        return m * cos[:, None] + half * sin[:, None]
    q, k, v = rot(x @ w["q"].T, H), rot(x @ w["k"].T, G), (x @ w["v"].T).reshape(len(x), G, dk)
    z = np.zeros((len(x), H, dk))
    for r in range(H):
        s = q[:, r] @ k[:, r // (H // G)].T / np.sqrt(dk)
        s = np.where(np.arange(len(x))[None] > np.arange(len(x))[:, None], -np.inf, s)
        p = np.exp(s - s.max(-1, keepdims=True))
        z[:, r] = (p / p.sum(-1, keepdims=True)) @ v[:, r // (H // G)]
    return z.reshape(len(x), -1) @ w["o"].T


@pytest.mark.parametrize("top", [12, 400])
def test_phimoe_longrope_mscale(tmp_path, top):
    """Phi-3.5-MoE (model_type phimoe) scales cos and sin by rope_scaling's
    short_mscale / long_mscale (PhimoeRotaryEmbedding), 1.2432 in its
    config, not by sqrt(1 + ln(factor) / ln(L)) = 1.1902: the scores were
    off by (1.2432/1.1902)^2 = 9%. Equal mscales are applied, unequal ones
    refused (one attention factor per layer)."""
    from io_helpers import write_safetensors
    rng = np.random.default_rng(6)
    D, H, G, dk = 32, 4, 2, 8
    w = {n: rng.uniform(-.5, .5, (G * dk if n in "kv" else D, D)) for n in "qkvo"}
    p = "model.layers.0.self_attn."
    write_safetensors(tmp_path / "model.safetensors", {p + n + "_proj.weight": w[n].astype(np.float32) for n in w})
    short, long = [1.0, 1.1, 1.3, 2.0], [1.0, 4.0, 9.0, 30.0]
    rs = {"type": "longrope", "short_factor": short, "long_factor": long, "short_mscale": 1.243163121016122,
          "long_mscale": 1.243163121016122, "original_max_position_embeddings": 16}
    cfg = {"model_type": "phimoe", "hidden_size": D, "num_attention_heads": H, "num_key_value_heads": G,
           "rope_theta": 100.0, "max_position_embeddings": 512, "original_max_position_embeddings": 16,
           "rope_scaling": rs}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    x = rng.uniform(-1, 1, (9, D)).astype(np.float32)
    pos = np.arange(9) * (top // 8)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "p.npy", pos.astype(np.int64))
    args = ("run", "--weights", tmp_path, "--prefix", "model.layers.0", "--input", tmp_path / "x.npy",
            "--output", tmp_path / "y.npy", "--causal", "--positions", tmp_path / "p.npy")
    mha_cli(*args)
    want = _longrope_oracle(w, x.astype(np.float64), pos, H, G, dk, 100.0, short, long, 16, 1.243163121016122)
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), want, atol=3e-5)
    # Phi-3 (model_type phi3) has no mscale: Hugging Face's Phi3 ignores the keys, and so does mha
    (tmp_path / "config.json").write_text(json.dumps(dict(cfg, model_type="phi3")))
    mha_cli(*args)
    want = _longrope_oracle(w, x.astype(np.float64), pos, H, G, dk, 100.0, short, long, 16,
                            np.sqrt(1 + np.log(32) / np.log(16)))
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), want, atol=3e-5)
    (tmp_path / "config.json").write_text(json.dumps(dict(cfg, rope_scaling=dict(rs, long_mscale=1.5))))
    r = mha_cli(*args, check=False)
    assert r.returncode != 0 and "short_mscale = 1.24316 and long_mscale = 1.5 differ" in r.stderr, r.stderr


@pytest.mark.parametrize("attn_config", ["alibi", [1], 3])
def test_mpt_attn_config_not_an_object_is_refused(tmp_path, attn_config):
    """MPT's / DBRX's attn_config holds ALiBi, kv_n_heads and clip_qkv; a
    malformed one (not an object) was skipped, so the layer ran without
    ALiBi or the clamp, exit 0. null still means the defaults."""
    from io_helpers import write_safetensors
    rng = np.random.default_rng(8)
    p = "transformer.blocks.0.attn."
    write_safetensors(tmp_path / "model.safetensors",
                      {p + "Wqkv.weight": rng.uniform(-.3, .3, (48, 16)).astype(np.float32),
                       p + "out_proj.weight": rng.uniform(-.3, .3, (16, 16)).astype(np.float32)})
    np.save(tmp_path / "x.npy", rng.uniform(-1, 1, (5, 16)).astype(np.float32))
    args = ("run", "--weights", tmp_path, "--prefix", "transformer.blocks.0", "--input", tmp_path / "x.npy",
            "--output", tmp_path / "y.npy", "--causal")
    cfg = {"model_type": "mpt", "d_model": 16, "n_heads": 4}
    (tmp_path / "config.json").write_text(json.dumps(dict(cfg, attn_config=None)))
    mha_cli(*args)
    (tmp_path / "y.npy").unlink()
    (tmp_path / "config.json").write_text(json.dumps(dict(cfg, attn_config=attn_config)))
    r = mha_cli(*args, check=False)
    assert r.returncode != 0 and "attn_config is not an object" in r.stderr, r.stderr
    assert not (tmp_path / "y.npy").exists()


@pytest.mark.parametrize("mscale, mscale_all_dim, attn", [(0.707, 0.707, 1.0), (1.0, 0.5, None), (1.0, 0, None)])
def test_yarn_mscale_and_mscale_all_dim(tmp_path, mscale, mscale_all_dim, attn):
    """YaRN's rope_scaling with mscale and mscale_all_dim both set (DeepSeek-
    style configs) has Hugging Face's attention factor get_mscale(factor,
    mscale) / get_mscale(factor, mscale_all_dim), 1 when they are equal; it
    ran 0.1 ln(factor) + 1 (1.37 for factor 40: scores x 1.87). One of them
    unset (0 or absent): the default, as Hugging Face."""
    from io_helpers import write_safetensors
    rng = np.random.default_rng(9)
    p = "model.layers.0.self_attn."
    write_safetensors(tmp_path / "model.safetensors",
                      {p + n + "_proj.weight": rng.uniform(-.3, .3, (8 if n in "kv" else 16, 16)).astype(np.float32)
                       for n in "qkvo"})
    np.save(tmp_path / "x.npy", rng.uniform(-1, 1, (7, 16)).astype(np.float32))
    yarn = {"rope_type": "yarn", "factor": 40.0, "original_max_position_embeddings": 64, "mscale": mscale,
            "mscale_all_dim": mscale_all_dim}
    cfg = {"model_type": "llama", "hidden_size": 16, "num_attention_heads": 4, "num_key_value_heads": 2,
           "rope_theta": 100.0, "max_position_embeddings": 2560, "rope_scaling": yarn}
    (tmp_path / "config.json").write_text(json.dumps(cfg))

    def run(*flags, weights=tmp_path):
        mha_cli("run", "--weights", weights, "--input", tmp_path / "x.npy", "--output", tmp_path / "y.npy",
                "--causal", *flags)
        return np.load(tmp_path / "y.npy")
    got = run()
    (tmp_path / "config.json").unlink()
    flags = ("--heads", 4, "--rope", "halves", "--rope-theta", 100)
    spec = "yarn:factor=40,original_max_position_embeddings=64"
    default = run(*flags, "--rope-scale", spec, weights=tmp_path / "model.safetensors")
    if attn is None:
        want = default
        ratio = (0.1 * mscale * np.log(40) + 1) / (0.1 * mscale_all_dim * np.log(40) + 1)
        if mscale_all_dim:
            want = run(*flags, "--rope-scale", f"{spec},attention_factor={ratio!r}",
                       weights=tmp_path / "model.safetensors")
    else:
        want = run(*flags, "--rope-scale", f"{spec},attention_factor={attn}", weights=tmp_path / "model.safetensors")
        assert np.abs(want - default).max() > 1e-3  # the factor matters here
    np.testing.assert_allclose(got, want, atol=1e-6)
