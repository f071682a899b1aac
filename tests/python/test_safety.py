"""The binding under hostile use: close() and mutations from another thread
during long forwards, integers that ctypes would wrap modulo 2^32, values
of the wrong type, float64 data beyond float32's range, and torch tensors
that require grad. Every case must end in the binding's own clear error
(or a correct result), never a crash or a silently different call."""
import threading

import pytest

from conftest import require

np = require("numpy")
import mha  # noqa: E402

INT_MAX = 2 ** 31 - 1


def random_layer(rng, d_model=128, n_heads=8, **cfg):
    layer = mha.Layer(d_model, n_heads, **cfg)
    layer.set_weights({n: rng.uniform(-0.2, 0.2, w.shape).astype(np.float32)
                       for n, w in layer.weights().items()})
    return layer


# ------------------------------------------------------ threads and close

def run_until_closed(call, started, results, errors):
    """Calls call() until it raises; keeps results and the final error."""
    try:
        while True:
            results.append(call())
            started.set()
    except Exception as e:  # the one expected: ArgumentError "... was closed"
        errors.append(e)
        started.set()


def start_workers(n, call):
    started, results, errors = threading.Event(), [], []
    threads = [threading.Thread(target=run_until_closed, args=(call, started, results, errors))
               for _ in range(n)]
    for t in threads:
        t.start()
    return threads, started, results, errors


def finish(threads, errors, kind):
    for t in threads:
        t.join(timeout=60)
        assert not t.is_alive(), "a worker is stuck after close()"
    assert len(errors) == len(threads)
    for e in errors:
        assert isinstance(e, mha.ArgumentError) and f"the {kind} was closed" in str(e), repr(e)


@pytest.mark.parametrize("path", ["reference", "fast"])
def test_close_from_another_thread_during_long_forwards(path):
    """Three threads run ~30 ms forwards in a loop while the main thread
    closes the layer, ten times: close() waits for the forwards in C, the
    calls after it raise 'the layer was closed', every result is right."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((1, 192, 128)).astype(np.float32)
    for _ in range(10):
        layer = random_layer(rng)
        want = layer.forward(x, path=path)
        threads, started, results, errors = start_workers(3, lambda: layer.forward(x, path=path))
        started.wait(timeout=60)  # at least one forward done: the others are in flight
        layer.close()
        assert layer.closed
        finish(threads, errors, "layer")
        assert results and all(np.array_equal(y, want) for y in results)
        layer.close()  # twice is fine


def test_close_a_cache_and_its_layer_during_cached_forwards():
    rng = np.random.default_rng(2)
    for round_ in range(6):
        layer = random_layer(rng)
        cache = mha.Cache(layer, batch=2, capacity=1024)
        x = rng.standard_normal((2, 4, 128)).astype(np.float32)

        def step():
            if cache.length(0) + 4 > 1024:
                cache.reset()
            return cache.forward(layer, x)
        threads, started, results, errors = start_workers(2, step)
        started.wait(timeout=60)
        (cache if round_ % 2 else layer).close()
        finish(threads, errors, "cache" if round_ % 2 else "layer")
        cache.close()
        layer.close()


def test_set_weights_and_permute_wait_for_forwards_in_flight():
    """Each forward sees the weights before or after a set_weights, never a
    mix: every result is bitwise one of the two outputs."""
    rng = np.random.default_rng(3)
    layer = random_layer(rng)
    wa = layer.weights()
    wb = {n: rng.uniform(-0.2, 0.2, w.shape).astype(np.float32) for n, w in wa.items()}
    x = rng.standard_normal((1, 256, 128)).astype(np.float32)
    ya = layer.forward(x, path="reference")
    layer.set_weights(wb)
    yb = layer.forward(x, path="reference")
    threads, started, results, errors = start_workers(2, lambda: layer.forward(x, path="reference"))
    started.wait(timeout=60)
    for i in range(12):
        layer.set_weights(wa if i % 2 else wb)
        layer.permute_heads([1, 0, 2, 3, 4, 5, 7, 6])  # Y unchanged, but rewrites every block
    layer.close()
    finish(threads, errors, "layer")
    assert results
    for y in results:
        assert np.array_equal(y, ya) or np.array_equal(y, yb), "a forward saw half-written weights"


def test_closing_inside_a_call_on_the_same_thread_is_an_error_not_a_deadlock():
    layer = random_layer(np.random.default_rng(4), 16, 2)
    with layer._borrow():
        with pytest.raises(mha.ArgumentError, match="inside another call"):
            layer.close()
    assert not layer.closed
    layer.close()
    with pytest.raises(mha.ArgumentError, match="the layer was closed"):
        layer.forward(np.zeros((1, 2, 16), np.float32))


def test_a_copy_would_free_the_c_object_twice_so_it_is_refused():
    import copy
    import pickle
    layer = random_layer(np.random.default_rng(11), 16, 2)
    for make in (copy.copy, copy.deepcopy, pickle.dumps):
        with pytest.raises(TypeError, match="owns C memory"):
            make(layer)
    with pytest.raises(TypeError, match="cache owns C memory"):  # a cache copies its C object (Cache.copy)
        pickle.dumps(mha.Cache(layer, capacity=8))


# ------------------------------------------------- integers ctypes would wrap

@pytest.mark.parametrize("kwargs,name", [
    (dict(n_heads=2 ** 32 + 4), "n_heads"), (dict(d_model=2 ** 32 + 32), "d_model"),
    (dict(n_kv_heads=2 ** 32 + 2), "n_kv_heads"), (dict(d_k=-2 ** 32 + 8), "d_k"),
    (dict(d_v_in=2 ** 31), "d_v_in"),
])
def test_layer_dimensions_beyond_a_c_int_are_refused(kwargs, name):
    args = {**dict(d_model=32, n_heads=4), **kwargs}
    with pytest.raises(mha.ArgumentError, match=rf"{name}=-?\d+ is out of range; expected an integer in "):
        mha.Layer(**args)


def test_forward_options_beyond_a_c_int_are_refused():
    layer = random_layer(np.random.default_rng(5), 16, 2)
    x = np.random.default_rng(5).standard_normal((1, 6, 16)).astype(np.float32)
    for name in ("window_left", "window_right"):
        with pytest.raises(mha.ArgumentError, match=rf"{name}=4294967296 is out of range; expected an "
                                                    rf"integer in -1..{INT_MAX}"):
            layer.forward(x, **{name: 2 ** 32})  # would act as window 0
        with pytest.raises(mha.ArgumentError, match=rf"{name}=-2 is out of range"):
            layer.forward(x, **{name: -2})
    # the largest legal window is no window at all: same as None
    assert np.array_equal(layer.forward(x, window_left=INT_MAX), layer.forward(x))
    with pytest.raises(mha.ArgumentError, match=r"perm\[0\]=4294967297 is out of range"):
        layer.permute_heads([2 ** 32 + 1, 0])
    with pytest.raises(mha.ArgumentError, match="n=4294967296 is out of range"):
        mha.set_num_threads(2 ** 32)
    with pytest.raises(mha.ArgumentError, match="r=4294967296 is out of range; expected an integer in 0..1"):
        mha.head_intervene(np.zeros((2, 4), np.float32), "zero", 2 ** 32, 2)


def test_cache_sizes_and_positions_beyond_a_c_int_are_refused():
    layer = random_layer(np.random.default_rng(6), 16, 2)
    with pytest.raises(mha.ArgumentError, match=rf"capacity=4294967312 is out of range; expected an "
                                                rf"integer in 0..{INT_MAX}"):
        mha.Cache(layer, capacity=2 ** 32 + 16)  # would get 16 slots
    for kw in (dict(batch=2 ** 32 + 1), dict(window=2 ** 32 + 1)):
        with pytest.raises(mha.ArgumentError, match=f"{next(iter(kw))}=.* is out of range"):
            mha.Cache(layer, capacity=8, **kw)
    with pytest.raises(mha.ArgumentError, match="capacity=4294967312 is out of range"):
        mha.cache_bytes_for(layer, 1, 2 ** 32 + 16)
    cache = mha.Cache(layer, batch=2, capacity=8)
    x = np.zeros((2, 1, 16), np.float32)
    for call, name in ((lambda: cache.length(2 ** 32), "b"), (lambda: cache.reset(2 ** 32), "b"),
                       (lambda: cache.truncate(0, 2 ** 32), "n"),
                       (lambda: cache.forward(layer, x, n_new=2 ** 32 + 1), "n_new"),
                       (lambda: cache.forward(layer, x, n_new=[0, 2 ** 32 + 1]), r"n_new\[1\]"),
                       (lambda: cache.forward(layer, x, window_left=2 ** 32), "window_left")):
        with pytest.raises(mha.ArgumentError, match=f"{name}=.* is out of range"):
            call()
    assert cache.lengths() == [0, 0]


# ------------------------------------------------------------ strict types

def test_n_heads_as_a_float_is_refused_not_truncated():
    for value in (4.5, 4.0, "4", True):
        with pytest.raises(mha.ArgumentError, match=r"n_heads=.* is a \w+; expected an integer"):
            mha.Layer(32, value)
    assert mha.Layer(32, np.int64(4)).n_heads == 4  # numpy integers are integers


def test_flags_take_bools_or_zero_and_one_only():
    layer = random_layer(np.random.default_rng(7), 16, 2)
    x = np.random.default_rng(7).standard_normal((1, 5, 16)).astype(np.float32)
    for bad in ("no", "False", 2, 0.0, None):
        with pytest.raises(mha.ArgumentError, match=r"causal=.*; expected True, False, 1 or 0"):
            layer.forward(x, causal=bad)
    assert np.array_equal(layer.forward(x, causal=1), layer.forward(x, causal=True))
    assert np.array_equal(layer.forward(x, causal=np.bool_(False)), layer.forward(x))
    with pytest.raises(mha.ArgumentError, match="bias='no'"):
        mha.Layer(16, 2, bias="no")
    with pytest.raises(mha.ArgumentError, match="is_causal='yes'"):
        layer.torch_forward(x[0], is_causal="yes")
    with pytest.raises(mha.ArgumentError, match="path=1.0"):
        layer.forward(x, path=1.0)


def test_capture_names_are_names_not_letters():
    layer = random_layer(np.random.default_rng(8), 16, 2)
    x = np.random.default_rng(8).standard_normal((1, 5, 16)).astype(np.float32)
    _, one = layer.forward(x, capture="probs")
    _, listed = layer.forward(x, capture=["probs"])
    assert list(one) == ["probs"] and np.array_equal(one["probs"], listed["probs"])
    _, gen = layer.forward(x, capture=(n for n in ("z", "probs")))
    assert sorted(gen) == ["probs", "z"]
    for bad, shown in (("prob", "'prob'"), (["z", "weights"], "'weights'"), ([1], "1")):
        with pytest.raises(mha.ArgumentError, match=f"capture \\[{shown}\\]; expected names among"):
            layer.forward(x, capture=bad)
    with pytest.raises(mha.ArgumentError, match="capture=5"):
        layer.forward(x, capture=5)
    cache = mha.Cache(layer, capacity=8)
    _, cap = cache.forward(layer, x[0], capture="z")
    assert list(cap) == ["z"]
    with pytest.raises(mha.ArgumentError, match=r"capture \['zz'\]"):
        cache.forward(layer, x[0, :1], capture="zz")


# ------------------------------------------------------ float64 and grads

def test_float64_rounds_to_float32_but_never_overflows_silently():
    rng = np.random.default_rng(9)
    layer = random_layer(rng, 16, 2)
    x64 = rng.standard_normal((1, 5, 16))
    assert np.array_equal(layer.forward(x64), layer.forward(x64.astype(np.float32)))
    x64[0, 3, 5] = 1e300
    with pytest.raises(mha.ArgumentError, match=r"x\[0,3,5\] = 1e\+300 is beyond float32's range"):
        layer.forward(x64)
    x64[0, 3, 5] = -np.inf  # already infinite: passed on, the library names it
    with pytest.raises(mha.NonFiniteError, match="non-finite"):
        layer.forward(x64)
    w = layer.weights()
    w["w_o"] = w["w_o"].astype(np.float64)
    w["w_o"][2, 1] = -4e38
    with pytest.raises(mha.ArgumentError, match=r"w_o\[2,1\] = -4e\+38 is beyond float32's range"):
        layer.set_weights(w)
    with pytest.raises(mha.ArgumentError, match="scale=1e\\+300 is beyond float32's range"):
        layer.forward(np.zeros((1, 5, 16)), scale=1e300)
    with pytest.raises(mha.ArgumentError, match=r"interventions\[1\] scale=1e\+39"):
        layer.forward(np.zeros((1, 5, 16)), interventions={1: ("scale", 1e39)})


def test_a_tensor_that_requires_grad_gets_the_bindings_error():
    torch = require("torch")
    layer = random_layer(np.random.default_rng(10), 16, 2)
    x = torch.zeros((1, 5, 16), requires_grad=True)
    with pytest.raises(mha.ArgumentError, match=r"x is a tensor that requires grad; .* x.detach\(\)"):
        layer.forward(x)
    with pytest.raises(mha.ArgumentError, match="query is a tensor that requires grad"):
        layer.torch_forward(x[0])
    assert np.array_equal(layer.forward(x.detach()), layer.forward(np.zeros((1, 5, 16), np.float32)))
    m = torch.nn.MultiheadAttention(16, 2)  # parameters require grad: a state dict is copied
    assert mha.from_torch_state_dict(dict(m.named_parameters()), num_heads=2).n_heads == 2


# ------------------------------------------------- error messages, threads

def test_a_path_that_is_not_utf8_gets_the_file_error_not_a_decode_error(tmp_path):
    """The message quotes the path: a name that is not UTF-8 (os.listdir's
    surrogate escapes, or bytes) and a long one the library cuts at 511
    bytes raised UnicodeDecodeError instead of FileError."""
    for path in [str(tmp_path) + "/\udce9\udce9.safetensors", (str(tmp_path) + "/\xe9.safetensors").encode("latin-1"),
                 str(tmp_path) + "/" + "é" * 250 + "/x.safetensors", str(tmp_path) + "/a" + "é" * 250 + "/x"]:
        with pytest.raises(mha.FileError) as e:
            mha.Layer.load(path)
        assert "cannot open" in e.value.message or "not found" in e.value.message or str(tmp_path) in e.value.message


def test_each_thread_raises_its_own_error_while_others_fail():
    """mha_last_error is per thread: eight threads fail at once, each with
    a shape of its own, and each exception names that thread's shape."""
    rng = np.random.default_rng(3)
    layer = random_layer(rng, d_model=64, n_heads=4)
    wrong = []

    def fail(i):
        x = np.zeros((1, 3, 64 + 1 + i), dtype=np.float32)
        for _ in range(50):
            try:
                layer.forward(x)
            except mha.MhaError as e:
                if str(64 + 1 + i) not in e.message:
                    wrong.append((i, e.message))
            else:
                wrong.append((i, "no error"))

    threads = [threading.Thread(target=fail, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not wrong, wrong[:3]


def test_an_unknown_forward_option_is_named():
    # Layer.forward(x, casual=True) raised TypeError naming the private Layer._options()
    layer = mha.Layer(16, 4)
    x = np.zeros((1, 3, 16), np.float32)
    with pytest.raises(mha.ArgumentError, match=r"unknown option 'casual'; expected keyword arguments among .*causal"):
        layer.forward(x, casual=True)
    with pytest.raises(mha.ArgumentError, match=r"unknown option 'window'"):
        layer.check_contract(x, window=3)
    assert layer.forward(x, causal=True).shape == (1, 3, 16)
