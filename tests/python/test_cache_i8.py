"""mha.Cache(dtype="int8") against the float64 oracle of cache_oracle.py
with K and V quantized as the int8 cache stores them (docs/CACHE.md): per
block of 32 values of each head's row, scale = max|x| / 127, q = x / scale
rounded to nearest (ties away from zero), clamped to +-127; a zero block
has scale 0. The oracle's rounding hook (round_fp16) is pointed at this
quantizer for the test.

Tolerance: TOL32 x output scale (the fp32 rule of test_cache.py) plus
e_q / 10, e_q being the measured effect of the quantization on y (oracle
with and without it) — room for the few elements whose fp32 projection
lands on the other side of a rounding tie than the float64 one. The same
check against the oracle with truncation instead of rounding must fail:
the tolerance is tight enough to tell the two apart.
"""
import pytest

from conftest import require

np = require("numpy")
import mha  # noqa: E402
import cache_oracle  # noqa: E402
from test_cache import CONFIGS, TOL32, decode_all, err_scale, random_layer  # noqa: E402


def quantize_i8(a, d, mode):
    """a (..., n*d) float64 -> dequantized int8 per block of 32 of each
    d-wide row; mode 'nearest' (half away from zero) or 'truncate'."""
    rows = a.reshape(-1, d).astype(np.float32)
    out = np.zeros_like(rows)
    for b0 in range(0, d, 32):
        blk = rows[:, b0:b0 + 32]
        scale = np.abs(blk).max(axis=1, keepdims=True) / np.float32(127)
        with np.errstate(divide="ignore", invalid="ignore"):
            r = np.where(scale > 0, blk / np.where(scale > 0, scale, 1), 0).astype(np.float64)
        q = np.trunc(r) if mode == "truncate" else np.sign(r) * np.floor(np.abs(r) + 0.5)
        out[:, b0:b0 + 32] = np.clip(q, -127, 127).astype(np.float32) * scale
    return out.astype(np.float64).reshape(a.shape)


def oracle(monkeypatch, w, c, x, mode, window_left=None):
    """attend64 with the int8 quantizer in place of the fp16 rounding."""
    widths = {c["n_kv_heads"] * c["d_k"]: c["d_k"], c["n_kv_heads"] * c["d_v"]: c["d_v"]}
    assert len(widths) == 2 or c["d_k"] == c["d_v"]
    monkeypatch.setattr(cache_oracle, "round_fp16", lambda a, m: quantize_i8(a, widths[a.shape[-1]], m))
    return cache_oracle.attend64(w, c, x, window_left=window_left, round_kv=mode)


def outlier_inputs(rng, B, S, D):
    """Activations with a few large channels (as LLM residual streams)."""
    x = rng.standard_normal((B, S, D))
    x[..., ::11] *= 8.0
    return x.astype(np.float32)


@pytest.mark.parametrize("window", [0, 24])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_int8_cache_matches_quantized_oracle(monkeypatch, name, window):
    cfg = dict(CONFIGS[name], d_k=40, d_v=40)  # two blocks: 32 and a shorter 8
    rng = np.random.default_rng(3)
    layer, w, c = random_layer(rng, **cfg)
    x = outlier_inputs(rng, 2, 150, c["d_model"])
    cache = mha.Cache(layer, batch=2, capacity=32 if window else 150, dtype="int8", window=window)
    assert cache.dtype == "int8"
    y = decode_all(cache, layer, x, 130)
    left = window - 1 if window else None
    want = oracle(monkeypatch, w, c, x, "nearest", left)
    effect = float(np.abs(want - cache_oracle.attend64(w, c, x, window_left=left)).max())
    err, scale = err_scale(y, want)
    tol = TOL32 * scale + effect / 10
    assert err <= tol, f"int8 cache: max abs error {err:.3g} > {tol:.3g} (quantization effect {effect:.3g})"
    err_t, _ = err_scale(y, oracle(monkeypatch, w, c, x, "truncate", left))
    assert err_t > tol, f"truncating oracle within tolerance ({err_t:.3g} <= {tol:.3g}): the test is too loose"


def test_int8_ragged_and_truncate(monkeypatch):
    rng = np.random.default_rng(5)
    layer, w, c = random_layer(rng, **CONFIGS["gqa"])
    x = outlier_inputs(rng, 2, 40, c["d_model"])
    cache = mha.Cache(layer, batch=2, capacity=48, dtype="int8")
    y0 = cache.forward(layer, x[:, :20], n_new=[20, 12])
    junk = outlier_inputs(rng, 2, 4, c["d_model"])
    cache.forward(layer, junk, n_new=[4, 4])
    cache.truncate(0, 20), cache.truncate(1, 12)
    y1 = cache.forward(layer, np.stack([x[0, 20:40], np.concatenate([x[1, 12:32], x[1, :0]])]))
    want0 = oracle(monkeypatch, w, c, x[:1], "nearest")
    want1 = oracle(monkeypatch, w, c, x[1:, :32], "nearest")
    got0 = np.concatenate([y0[0], y1[0]])
    got1 = np.concatenate([y0[1, :12], y1[1]])
    for got, want in ((got0, want0[0]), (got1, want1[0])):
        err, scale = err_scale(got, want)
        assert err <= 1e-3 * scale, f"ragged/truncate int8: max abs error {err:.3g}"


def test_int8_bytes_and_errors():
    cfg = dict(d_model=2048, n_heads=32, n_kv_heads=8)
    # (64 + 64) int8 + 4 fp32 scales (2 blocks each of K and V) per slot per kv head
    assert mha.cache_bytes_for(cfg, 1, 4096, "int8") == 4096 * 8 * (128 + 16)
    assert mha.cache_bytes_for(cfg, 1, 4096, "int8") * 2 < mha.cache_bytes_for(cfg, 1, 4096, "float16") * 1.2
    layer = mha.Layer(d_model=32, n_heads=4)
    assert mha.Cache(layer, capacity=8, dtype="int8").bytes == mha.cache_bytes_for(layer, 1, 8, "int8")
    with pytest.raises(mha.ArgumentError, match="'int8'"):
        mha.Cache(layer, capacity=8, dtype="int4")


@pytest.mark.parametrize("kt,vt", [("int8", "float16"), ("float16", "int8")])
def test_mixed_cache_matches_its_oracle(monkeypatch, kt, vt):
    """K and V in types of their own (mha_cache_create_kv): the oracle
    quantizes K as kt and V as vt; swapping the two roles must fail."""
    cfg = dict(CONFIGS["gqa"], d_k=40, d_v=40)
    rng = np.random.default_rng(7)
    layer, w, c = random_layer(rng, **cfg)
    x = outlier_inputs(rng, 2, 140, c["d_model"])
    cache = mha.Cache(layer, batch=2, capacity=140, dtype=kt, v_dtype=vt)
    assert (cache.dtype, cache.v_dtype) == (kt, vt) and f"v_dtype={vt!r}" in repr(cache)
    y = decode_all(cache, layer, x, 120)

    def store(types):
        """the oracle's rounding hook: attend64 rounds K, then V"""
        def rnd(a, mode):
            t = types.pop(0)
            return quantize_i8(a, c["d_k"], mode) if t == "int8" else a.astype(np.float16).astype(np.float64)
        return rnd

    monkeypatch.setattr(cache_oracle, "round_fp16", store([kt, vt]))
    want = cache_oracle.attend64(w, c, x, round_kv="nearest")
    monkeypatch.setattr(cache_oracle, "round_fp16", store([vt, kt]))
    swapped = cache_oracle.attend64(w, c, x, round_kv="nearest")
    monkeypatch.undo()
    effect = float(np.abs(want - cache_oracle.attend64(w, c, x)).max())
    err, scale = err_scale(y, want)
    tol = TOL32 * scale + effect / 10
    assert err <= tol, f"{kt}/{vt} cache: max abs error {err:.3g} > {tol:.3g} (storage effect {effect:.3g})"
    err_s, _ = err_scale(y, swapped)
    assert err_s > tol, f"the oracle with K and V types swapped is within tolerance ({err_s:.3g} <= {tol:.3g})"


def test_mixed_bytes_and_errors():
    cfg = dict(d_model=2048, n_heads=32, n_kv_heads=8)
    # K: 64 int8 + 2 fp32 scales; V: 64 fp16, per slot per kv head
    assert mha.cache_bytes_for(cfg, 1, 4096, "int8", v_dtype="float16") == 4096 * 8 * (64 + 8 + 128)
    assert mha.cache_bytes_for(cfg, 1, 4096, "float16", v_dtype="float16") == mha.cache_bytes_for(cfg, 1, 4096, "float16")
    layer = mha.Layer(d_model=32, n_heads=4)
    cache = mha.Cache(layer, capacity=8, dtype="float32", v_dtype="int8")
    assert cache.bytes == mha.cache_bytes_for(layer, 1, 8, "float32", "int8")
    with pytest.raises(mha.ArgumentError, match="dtype='int4'"):
        mha.Cache(layer, capacity=8, dtype="int8", v_dtype="int4")
