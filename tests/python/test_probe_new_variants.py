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
