#!/bin/sh
# fuzz/run.sh — builds the libFuzzer targets for the .npy and safetensors
# readers with clang (AddressSanitizer + UndefinedBehaviorSanitizer) and runs
# each for a bounded time from the seed corpus in fuzz/corpus/.
#   usage: sh fuzz/run.sh [SECONDS_TOTAL]   (default 60, split between targets)
# Exits non-zero on any crash, leak, sanitizer report or build failure.
set -e
total=${1:-60}
cd "$(dirname "$0")/.."
CLANG=${CLANG:-clang}
command -v "$CLANG" >/dev/null || { echo "fuzz: $CLANG not found (make setup installs clang and libclang-rt-14-dev)" >&2; exit 1; }
out=build/fuzz
mkdir -p "$out"
flags="-std=c11 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all -Iinclude -Isrc -D_DEFAULT_SOURCE"
# the readers and what they use; no OpenMP needed
src="src/io/array.c src/io/npy.c src/io/safetensors.c src/io/tensors.c src/base/error.c"
for t in npy safetensors; do
    "$CLANG" $flags -o "$out/fuzz_$t" fuzz/fuzz_$t.c $src -ljansson -lm
done
per=$((total / 2))
[ "$per" -ge 1 ] || per=1
status=0
for t in npy safetensors; do
    work="$out/corpus_$t"
    mkdir -p "$work"
    echo "fuzz: $t for ${per}s"
    # new inputs go to the scratch corpus; the checked-in seeds stay as they are
    "$out/fuzz_$t" -max_total_time="$per" -max_len=4096 -rss_limit_mb=1024 -timeout=10 \
        -dict="fuzz/$t.dict" -print_final_stats=1 "$work" "fuzz/corpus/$t" \
        >"$out/fuzz_$t.log" 2>&1 || { status=1; tail -40 "$out/fuzz_$t.log" >&2; }
    grep -E "^stat::number_of_executed_units|^Done " "$out/fuzz_$t.log" | head -2
done
[ "$status" -eq 0 ] && echo "fuzz: no crash"
exit "$status"
