"""bf16 / int8 projection weights through the binding and the CLI
(docs/WEIGHTS.md). The expected stored values are computed here with
numpy: bf16 by integer round-to-nearest-even on the float32 bits, int8 per
output column (scale = max|w| / 127, ties away from zero)."""
import os
import subprocess

import pytest

from conftest import require

np = require("numpy")
import mha  # noqa: E402
from test_cache import random_layer  # noqa: E402

MHA_BIN = os.path.join(os.path.dirname(__file__), "..", "..", "build", "mha")


def bf16(a):
    u = a.astype(np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16 << 16
    return u.astype(np.uint32).view(np.float32)


def int8(a, seg=None):
    """one scale per column and group of 32 rows, groups restarting every
    seg rows (W_O: d_v)."""
    out = np.empty_like(a)
    seg = seg or a.shape[0]
    for s0 in range(0, a.shape[0], seg):
        for g0 in range(s0, s0 + seg, 32):
            b = a[g0:min(g0 + 32, s0 + seg)]
            s = (np.abs(b).max(axis=0) / np.float32(127)).astype(np.float32)
            r = np.where(s > 0, b / np.where(s > 0, s, 1), 0).astype(np.float32)
            q = np.clip(np.sign(r) * np.floor(np.abs(r) + 0.5), -127, 127)
            out[g0:g0 + len(b)] = (q.astype(np.float32) * s).astype(np.float32)
    return out


@pytest.mark.parametrize("dtype", ["bf16", "int8"])
def test_convert_stores_the_rounded_values(dtype):
    rng = np.random.default_rng(1)
    layer, w, _ = random_layer(rng, d_model=80, n_heads=2, n_kv_heads=1)
    layer.convert_weights(dtype)
    assert layer.weights_dtype == dtype
    got = layer.weights()
    for name in ("w_q", "w_k", "w_v", "w_o"):
        seg = 40 if name == "w_o" and dtype == "int8" else None  # d_v rows per head
        np.testing.assert_array_equal(got[name], bf16(w[name]) if dtype == "bf16" else int8(w[name], seg))
    np.testing.assert_array_equal(got["b_q"], w["b_q"])  # biases stay fp32


@pytest.mark.parametrize("dtype", ["bf16", "int8"])
def test_permute_save_load_keep_y(tmp_path, dtype):
    rng = np.random.default_rng(2)
    layer, _, _ = random_layer(rng, d_model=32, n_heads=4, n_kv_heads=2)
    layer.convert_weights(dtype)
    x = rng.standard_normal((2, 5, 32)).astype(np.float32)
    y = layer.forward(x, causal=True)
    path = tmp_path / "l.safetensors"
    layer.save(path)
    back = mha.Layer.load(path)
    assert back.weights_dtype == dtype
    np.testing.assert_array_equal(back.forward(x, causal=True), y)
    back.permute_heads([2, 3, 0, 1])
    np.testing.assert_allclose(back.forward(x, causal=True), y, atol=1e-5)
    assert list(back.labels("Q")) == [2, 3, 0, 1]


def test_unknown_dtype_refused():
    layer, _, _ = random_layer(np.random.default_rng(3), d_model=8, n_heads=2)
    with pytest.raises(mha.ArgumentError, match="bf16"):
        layer.convert_weights("int4")
    assert layer.weights_dtype == "f32"


def test_cli_convert_and_run(tmp_path):
    if not os.path.exists(MHA_BIN):
        pytest.skip("build/mha is not built")
    rng = np.random.default_rng(4)
    layer, w, _ = random_layer(rng, d_model=16, n_heads=4)
    src = tmp_path / "a.safetensors"
    layer.save(src)
    x = rng.standard_normal((1, 6, 16)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    out8 = tmp_path / "a8.safetensors"
    subprocess.run([MHA_BIN, "convert", "--from", "native", "--to", "native", "--to-dtype", "int8",
                    str(src), str(out8)], check=True, capture_output=True)
    subprocess.run([MHA_BIN, "run", "--weights", str(src), "--input", str(tmp_path / "x.npy"),
                    "--output", str(tmp_path / "yb.npy"), "--weights-dtype", "bf16"], check=True, capture_output=True)
    subprocess.run([MHA_BIN, "run", "--weights", str(out8), "--input", str(tmp_path / "x.npy"),
                    "--output", str(tmp_path / "y8.npy")], check=True, capture_output=True)
    for dt, f in (("bf16", "yb.npy"), ("int8", "y8.npy")):
        want = mha.Layer.load(src)
        want.convert_weights(dt)
        np.testing.assert_array_equal(np.load(tmp_path / f), want.forward(x))
