"""Cache.save / Cache.load: a cache saved, loaded and continued gives the
bits of the original continued with the same tokens; the loaded object
knows its settings; files that are not caches, or caches of another layer,
raise by name. The C suite (tests/test_cache_file.c) edits files entry by
entry; here the binding's paths and errors.
"""
import pytest

from conftest import require

np = require("numpy")
import mha  # noqa: E402
from test_cache import random_layer  # noqa: E402


@pytest.mark.parametrize("kw", [
    dict(dtype="float32", capacity=16),
    dict(dtype="int8", v_dtype="float16", capacity=16),
    dict(dtype="float16", capacity=8, window=6, sink_tokens=2),  # the ring wraps
])
def test_saved_and_loaded_cache_continues_to_the_bit(tmp_path, kw):
    rng = np.random.default_rng(4)
    layer, _, c = random_layer(rng, d_model=32, n_heads=4, n_kv_heads=2, rope=dict(pairing="halves"))
    x = rng.standard_normal((2, 12, c["d_model"])).astype(np.float32)
    a = mha.Cache(layer, batch=2, **kw)
    a.forward(x[:, :9], n_new=[9, 4])
    a.truncate(1, 3)
    path = tmp_path / "prompt.safetensors"
    a.save(path)
    b = mha.Cache.load(str(path), layer)
    assert repr(b) == repr(a)
    assert (b.batch, b.capacity, b.window, b.sink_tokens, b.dtype, b.v_dtype, b.cross) == \
        (a.batch, a.capacity, a.window, a.sink_tokens, a.dtype, a.v_dtype, a.cross)
    for t in range(9, 12):
        ya, pa = a.forward(x[:, t:t + 1], capture=["probs"])
        yb, pb = b.forward(x[:, t:t + 1], capture=["probs"])
        assert np.array_equal(ya, yb) and np.array_equal(pa["probs"], pb["probs"])


def test_cross_memory_round_trip(tmp_path):
    rng = np.random.default_rng(2)
    layer, _, c = random_layer(rng, d_model=32, n_heads=4)
    mem = rng.standard_normal((2, 7, c["d_model"])).astype(np.float32)
    a = mha.Cache(layer, batch=2, capacity=8, dtype="int8", cross=True)
    a.set_memory(mem, lengths=[7, 3])
    a.save(tmp_path / "m.safetensors")
    b = mha.Cache.load(tmp_path / "m.safetensors", layer)
    assert b.cross and b.lengths() == [7, 3]
    q = rng.standard_normal((2, 2, c["d_model"])).astype(np.float32)
    assert np.array_equal(a.forward(q), b.forward(q))


def test_load_refuses_by_name(tmp_path):
    rng = np.random.default_rng(1)
    layer, _, c = random_layer(rng, d_model=32, n_heads=4)
    other, _, _ = random_layer(rng, d_model=32, n_heads=2)
    a = mha.Cache(layer, capacity=4)
    a.forward(rng.standard_normal((2, c["d_model"])).astype(np.float32))
    good = tmp_path / "c.safetensors"
    a.save(good)
    with pytest.raises(mha.ShapeError, match="expected the layer the cache was saved from"):
        mha.Cache.load(good, other)
    layer.save(tmp_path / "layer.safetensors")
    with pytest.raises(mha.FormatError, match="expected 'mha_cache'"):
        mha.Cache.load(tmp_path / "layer.safetensors", layer)
    (tmp_path / "junk").write_bytes(b"\x00" * 40)
    with pytest.raises(mha.FormatError):
        mha.Cache.load(tmp_path / "junk", layer)
    with pytest.raises(mha.FileError):
        mha.Cache.load(tmp_path / "missing.safetensors", layer)
    with pytest.raises(mha.ArgumentError, match="expected a mha.Layer"):
        mha.Cache.load(good, "layer")
    before = good.read_bytes()
    with pytest.raises(mha.FileError):
        a.save(tmp_path / "no-such-dir" / "c.safetensors")
    assert good.read_bytes() == before
