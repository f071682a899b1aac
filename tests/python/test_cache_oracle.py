"""mha.Cache against an independent oracle: cache_oracle.attend64, float64
numpy written from the math (not the library's reference path), for GQA,
MQA with add_bias_kv and add_zero_attn, sliding windows, fp16 storage,
ragged batches and truncate.

Tolerances:
- fp32 cache: max|cached - oracle| <= TOL32 x max(1, max|oracle|): fp32
  sums in another order than float64 ones.
- fp16 cache: compared with the oracle whose K and V are rounded to
  binary16 to nearest, as the cache stores them; the allowance is
  TOL32 x scale + 0.5 x `effect`, effect = max|oracle rounded - oracle
  unrounded| measured on each test's data (1.1e-3 to 2.7e-3 at output scale
  4-5). The 0.5 covers the elements whose fp32 projection rounds to the
  other binary16 neighbour than the float64 one (measured up to 0.27 x
  effect in 9 seeds and configs). Truncating instead of rounding moves y by
  1.4 to 3 x effect (measured), so each fp16 test also checks on its own
  data that the truncating oracle would fail the bound by 2x.
"""
import pytest

from conftest import require

np = require("numpy")
import mha  # noqa: E402
from cache_oracle import attend64  # noqa: E402
from test_cache import CONFIGS, decode_all, random_layer  # noqa: E402

TOL32 = 1e-5
FLIP_ALLOWANCE = 0.5


def max_err(a, b):
    return float(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64)).max())


def check_against_oracle(got, w, c, x, dtype, what, window_left=None, rows=slice(None)):
    """got (B,S',d_model) from the cache vs rows `rows` (S' of them) of
    attend64 on x (B,S,d_model), with the tolerance of the module docstring
    for `dtype`."""
    def oracle(round_kv=None):
        return attend64(w, c, x, window_left, round_kv)[:, rows]
    exact = oracle()
    assert got.shape == exact.shape
    tol32 = TOL32 * max(1.0, float(np.abs(exact).max()))
    if dtype == "float32":
        err = max_err(got, exact)
        assert err <= tol32, f"{what}: max abs error {err:.3g} vs the float64 oracle > {tol32:.3g}"
        return
    nearest = oracle("nearest")
    effect = max_err(nearest, exact)
    tol = tol32 + FLIP_ALLOWANCE * effect
    err = max_err(got, nearest)
    assert err <= tol, (f"{what}: max abs error {err:.3g} vs the fp16-rounded oracle > {tol:.3g} "
                        f"(fp16 effect {effect:.3g})")
    assert max_err(got, exact) > tol32, f"{what}: fp16 storage gave fp32 accuracy: K and V were not rounded"
    truncated = max_err(oracle("truncate"), nearest)
    assert truncated > 2 * tol, (f"{what}: the bound {tol:.3g} is too loose to catch truncation "
                                 f"(it moves y by {truncated:.3g})")


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_prefill_then_decode_matches_the_float64_oracle(name, dtype):
    """MHA, GQA (h/h_kv = 4) and MQA with both extra keys, across the
    128-slot chunk boundary."""
    rng = np.random.default_rng(21)
    layer, w, c = random_layer(rng, **CONFIGS[name])
    x = rng.standard_normal((2, 140, c["d_model"])).astype(np.float32)
    with mha.Cache(layer, batch=2, capacity=160, dtype=dtype) as cache:
        got = decode_all(cache, layer, x, 9)
    check_against_oracle(got, w, c, x, dtype, f"{name} {dtype}")


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("name", ["gqa", "mqa"])
def test_sliding_window_ring_matches_the_float64_oracle(name, dtype):
    """A ring of 8 slots keeping W = 6 tokens (keys i-5..i), around the ring
    many times; then the window_left option on a plain cache."""
    rng = np.random.default_rng(22)
    layer, w, c = random_layer(rng, **CONFIGS[name])
    W, S = 6, 45
    x = rng.standard_normal((2, S, c["d_model"])).astype(np.float32)
    with mha.Cache(layer, batch=2, capacity=8, window=W, dtype=dtype) as cache:
        ys = [cache.forward(layer, x[:, :3])]
        ys += [cache.forward(layer, x[:, t:t + 1]) for t in range(3, 30)]
        ys += [cache.forward(layer, x[:, t:t + 3]) for t in range(30, S, 3)]
    check_against_oracle(np.concatenate(ys, axis=1), w, c, x, dtype, f"ring W={W}", window_left=W - 1)
    with mha.Cache(layer, batch=2, capacity=S, dtype=dtype) as cache:
        got = decode_all(cache, layer, x, 4, window_left=2)
    check_against_oracle(got, w, c, x, dtype, "window_left=2", window_left=2)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_ragged_batches_match_each_sequence_alone(dtype):
    """Different numbers of new tokens per sequence and call: each sequence's
    rows equal the oracle on that sequence alone."""
    rng = np.random.default_rng(23)
    layer, w, c = random_layer(rng, **CONFIGS["mqa"])
    steps = [[7, 3, 0], [1, 4, 2], [1, 0, 1], [2, 1, 5], 1]
    seqs, outs = [[] for _ in range(3)], [[] for _ in range(3)]
    with mha.Cache(layer, batch=3, capacity=32, dtype=dtype) as cache:
        for n in steps:
            counts = [n] * 3 if isinstance(n, int) else n
            x = rng.standard_normal((3, max(counts), c["d_model"])).astype(np.float32)
            y = cache.forward(layer, x, n_new=n)
            for b, k in enumerate(counts):
                seqs[b].append(x[b, :k])
                outs[b].append(y[b, :k])
    for b in range(3):
        xs = np.concatenate(seqs[b])[None]
        check_against_oracle(np.concatenate(outs[b])[None], w, c, xs, dtype, f"sequence {b}")


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_truncate_matches_the_sequence_without_the_rolled_back_tokens(dtype):
    """Speculative decoding: 3 draft tokens, 1 kept in sequence 0 and all 3
    in sequence 1; the tokens after the rollback see only what was kept."""
    rng = np.random.default_rng(24)
    layer, w, c = random_layer(rng, **CONFIGS["gqa"])
    prompt, draft, more = (rng.standard_normal((2, n, c["d_model"])).astype(np.float32) for n in (8, 3, 4))
    with mha.Cache(layer, batch=2, capacity=16, dtype=dtype) as cache:
        y_prompt = cache.forward(layer, prompt)
        cache.forward(layer, draft)
        cache.truncate(0, 9)
        y_more = decode_all(cache, layer, more, 1)
    for b, kept in ((0, 1), (1, 3)):
        xs = np.concatenate([prompt[b], draft[b, :kept], more[b]])[None]
        rows = np.r_[0:8, 8 + kept:8 + kept + 4]  # the rows computed through the cache above
        got = np.concatenate([y_prompt[b], y_more[b]])[None]
        check_against_oracle(got, w, c, xs, dtype, f"sequence {b}", rows=rows)
