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


def saved_layer(tmp_path, seed, d_model, T):
    """A random fp32 layer saved as a.safetensors and an input x.npy (1,T,d_model)
    in tmp_path, for the CLI; skips when build/mha is missing."""
    if not os.path.exists(MHA_BIN):
        pytest.skip("build/mha is not built")
    rng = np.random.default_rng(seed)
    layer, _, _ = random_layer(rng, d_model=d_model, n_heads=4)
    src = tmp_path / "a.safetensors"
    layer.save(src)
    x = rng.standard_normal((1, T, d_model)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    return src, x


def test_cli_convert_and_run(tmp_path):
    src, x = saved_layer(tmp_path, 4, 16, 6)
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


def numpy_bf16_forward(w, x, h, causal):
    """options.bf16_matmul by hand: x and Z rounded to bf16 (numpy's own
    rounding above), the weights bf16 already, projections and attention
    in float64, Z as float32 before its rounding."""
    xr = bf16(x).astype(np.float64)
    q = xr @ w["w_q"] + w["b_q"]
    k = xr @ w["w_k"] + w["b_k"]
    v = xr @ w["w_v"] + w["b_v"]
    B, T, _ = x.shape
    dk, dv = q.shape[-1] // h, v.shape[-1] // h
    z = np.empty((B, T, h * dv))
    for r in range(h):
        s = q[..., r * dk:(r + 1) * dk] @ k[..., r * dk:(r + 1) * dk].transpose(0, 2, 1) / np.sqrt(dk)
        if causal:
            s = np.where(np.tril(np.ones((T, T), bool)), s, -np.inf)
        p = np.exp(s - s.max(-1, keepdims=True))
        z[..., r * dv:(r + 1) * dv] = (p / p.sum(-1, keepdims=True)) @ v[..., r * dv:(r + 1) * dv]
    zr = bf16(z.astype(np.float32)).astype(np.float64)
    return zr @ w["w_o"] + w["b_o"], z


@pytest.mark.parametrize("path", ["reference", "fast"])
def test_bf16_matmul_against_numpy(path):
    rng = np.random.default_rng(12)
    layer, _, _ = random_layer(rng, d_model=40, n_heads=4)
    layer.convert_weights("bf16")
    w = layer.weights()
    x = rng.standard_normal((2, 9, 40)).astype(np.float32)
    x[..., 3::11] *= 9.0  # outlier channels
    y = layer.forward(x, causal=True, path=path, bf16_matmul=True)
    want, z = numpy_bf16_forward(w, x, 4, causal=True)
    # Z may land on the other bf16 neighbour where float32 sums differ in the last bit
    flips = 4 * 2.0 ** -8 * np.abs(z).max() * np.abs(w["w_o"]).max()
    assert np.abs(y - want).max() <= flips + 1e-5 * np.abs(want).max()
    # the option changes the numbers: fp32 projections differ by more than that
    y32 = layer.forward(x, causal=True, path=path)
    assert np.abs(y32 - want).max() > 1e-3


def test_bf16_matmul_refusals():
    rng = np.random.default_rng(13)
    layer, _, _ = random_layer(rng, d_model=16, n_heads=2)
    x = rng.standard_normal((1, 3, 16)).astype(np.float32)
    with pytest.raises(mha.ArgumentError, match="bf16 weights"):
        layer.forward(x, bf16_matmul=True)
    with pytest.raises(mha.ArgumentError, match="bf16_matmul"):
        layer.forward(x, bf16_matmul=3)


def test_cli_bf16_matmul(tmp_path):
    src, x = saved_layer(tmp_path, 14, 32, 7)
    subprocess.run([MHA_BIN, "run", "--weights", str(src), "--input", str(tmp_path / "x.npy"), "--output",
                    str(tmp_path / "y.npy"), "--weights-dtype", "bf16", "--bf16-matmul"], check=True,
                   capture_output=True)
    want = mha.Layer.load(src)
    want.convert_weights("bf16")
    np.testing.assert_array_equal(np.load(tmp_path / "y.npy"), want.forward(x, bf16_matmul=True))
    # fp32 weights: refused, naming the fix, and no output written
    r = subprocess.run([MHA_BIN, "run", "--weights", str(src), "--input", str(tmp_path / "x.npy"), "--output",
                        str(tmp_path / "y2.npy"), "--bf16-matmul"], capture_output=True, text=True)
    assert r.returncode != 0 and "bf16 weights" in r.stderr and not (tmp_path / "y2.npy").exists()


def test_cache_bf16_matmul_matches_forward():
    """A prefill then decode steps through the cache with bf16_matmul equal
    the whole causal forward's, but for Z elements on the other bf16
    neighbour; and without bf16 weights the cache refuses it."""
    rng = np.random.default_rng(15)
    layer, _, _ = random_layer(rng, d_model=32, n_heads=4, n_kv_heads=2)
    x = rng.standard_normal((1, 12, 32)).astype(np.float32)
    with pytest.raises(mha.ArgumentError, match="bf16 weights"):
        mha.Cache(layer, batch=1, capacity=12).forward(x[:, :4], bf16_matmul=True)
    layer.convert_weights("bf16")
    want, cap = layer.forward(x, causal=True, path="reference", bf16_matmul=True, capture=["z"])
    cache = mha.Cache(layer, batch=1, capacity=12)
    got = [cache.forward(x[:, :8], bf16_matmul=True)] + [cache.forward(x[:, t:t + 1], bf16_matmul=True)
                                                       for t in range(8, 12)]
    flips = 4 * 2.0 ** -8 * np.abs(cap["z"]).max() * np.abs(layer.weights()["w_o"]).max()
    assert np.abs(np.concatenate(got, axis=1) - want).max() <= flips + 1e-5
