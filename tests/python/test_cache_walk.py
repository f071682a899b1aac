"""Model-based random walks over the KV cache API (cache_walk.py): long
seeded sequences of every cache operation - prefill, decode, ragged
batches, truncate, reset, reorder, clone, save / load, head permutation,
tree calls (any lower-triangular keep_mask) and compaction anywhere,
append / attend, refused calls of every kind - each step checked against
a float64 oracle of the sequence's whole visible history, on fp32 / fp16
/ int8 / mixed caches, rings with and without sink tokens, GQA / MQA /
MHA, the variants, every kernel set this CPU runs and 1 or 2 threads.
About 15 s; a longer soak by hand:

    cd tests/python && PYTHONPATH=../../python python3 cache_walk.py FIRST SEEDS STEPS [LONG_SHARE]
"""
import pytest

from conftest import require

require("torch")
import cache_walk  # noqa: E402


@pytest.mark.parametrize("first", [0, 35])
def test_cache_walks(first, tmp_path):
    """35 walks of 60 steps each (short and ring-sized caches)."""
    worst = {}
    for seed in range(first, first + 35):
        stats = cache_walk.walk(50_000 + seed, 60, str(tmp_path))
        for k, v in stats["worst"].items():
            worst[k] = max(worst.get(k, 0.0), v)
    print(f"walks {first}..: worst relative error {worst}")


def test_cache_walks_long(tmp_path):
    """Caches of several 128-slot storage chunks, rings of 60-300 wrapping,
    prefills of up to 200 tokens, 16 and 32 query heads."""
    for seed in range(2):
        cache_walk.walk(51_000 + seed, 40, str(tmp_path), long_share=1.0)
