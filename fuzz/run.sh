#!/bin/sh
# fuzz/run.sh — builds the libFuzzer targets with clang (AddressSanitizer +
# UndefinedBehaviorSanitizer) and runs each for a bounded time from the seed
# corpus in fuzz/corpus/:
#   npy          the .npy reader
#   safetensors  the safetensors reader and writer
#   layouts      the checkpoint layout loaders over fuzzed safetensors
#   args         the CLI flag parser (tools/args.c)
#   cache        the KV cache file's reader (mha_cache_load) over fuzzed safetensors
#   usage: sh fuzz/run.sh [SECONDS_TOTAL]   (default 60, split between targets)
# Exits non-zero on any crash, leak, sanitizer report or build failure.
set -e
total=${1:-60}
cd "$(dirname "$0")/.."
CLANG=${CLANG:-clang}
command -v "$CLANG" >/dev/null || { echo "fuzz: $CLANG not found (make setup installs clang and libclang-rt-14-dev)" >&2; exit 1; }
out=build/fuzz
mkdir -p "$out/obj"
flags="-std=c11 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all -Iinclude -Isrc -Itools -D_DEFAULT_SOURCE"
# the readers and what they use; no OpenMP needed (array.c's pragma is then
# ignored: the conversion runs on one thread)
io="src/io/array.c src/io/map.c src/io/npy.c src/io/outfile.c src/io/safetensors.c src/io/tensors.c src/base/error.c src/base/memory.c"
"$CLANG" $flags -o "$out/fuzz_npy" fuzz/fuzz_npy.c $io -ljansson -lm
"$CLANG" $flags -o "$out/fuzz_safetensors" fuzz/fuzz_safetensors.c $io -ljansson -lm
"$CLANG" $flags -o "$out/fuzz_args" fuzz/fuzz_args.c tools/args.c -lm
# the layout loaders build layers: the whole library (fuzzer-instrumented
# objects; ISA flags on the kernel files only, as in the Makefile). CPUID
# checks read as "no": the scalar kernels suffice here, and clang 14 does
# not know every feature name gcc accepts.
# an object is stale when its source or any header is newer (a struct that
# grew in mha.h must rebuild every object that uses it)
newest_h=$(ls -t include/*.h src/*/*.h | head -1)
objs=""
for f in $(ls src/*.c src/*/*.c); do
    o="$out/obj/$(echo "$f" | tr / _).o"
    isa=""
    case "$f" in
        src/kernels/avx2*) isa="-mavx2 -mfma -mf16c" ;;
        src/kernels/avx512_amx*) isa="-mavx512f -mavx512bw -mavx512vl -mavx512dq -mfma -mf16c -mamx-tile -mamx-bf16" ;;
        src/kernels/avx512*) isa="-mavx512f -mavx512bw -mavx512vl -mavx512dq -mfma -mf16c" ;;
    esac
    [ "$o" -nt "$f" ] && [ "$o" -nt "$newest_h" ] || "$CLANG" $(echo "$flags" | sed 's/fuzzer,/fuzzer-no-link,/') -fopenmp $isa \
        '-D__builtin_cpu_supports(feature)=0' -c "$f" -o "$o"
    objs="$objs $o"
done
"$CLANG" $flags -fopenmp -o "$out/fuzz_layouts" fuzz/fuzz_layouts.c $objs -ljansson -lm
"$CLANG" $flags -fopenmp -o "$out/fuzz_cache" fuzz/fuzz_cache.c $objs -ljansson -lm
targets="npy safetensors layouts args cache"
per=$((total / 5))
[ "$per" -ge 1 ] || per=1
status=0
for t in $targets; do
    work="$out/corpus_$t"
    mkdir -p "$work"
    seeds="fuzz/corpus/$t"
    dict=""
    [ -f "fuzz/$t.dict" ] && dict="-dict=fuzz/$t.dict"
    [ "$t" = cache ] && dict="-dict=fuzz/safetensors.dict"
    [ "$t" = args ] && dict="-close_fd_mask=3"
    echo "fuzz: $t for ${per}s"
    # new inputs go to the scratch corpus; the checked-in seeds stay as they are
    OMP_NUM_THREADS=1 "$out/fuzz_$t" -max_total_time="$per" -max_len=4096 -rss_limit_mb=1024 -timeout=10 \
        $dict -print_final_stats=1 "$work" "$seeds" \
        >"$out/fuzz_$t.log" 2>&1 || { status=1; tail -40 "$out/fuzz_$t.log" >&2; }
    grep -E "^stat::number_of_executed_units|^Done " "$out/fuzz_$t.log" | head -2
done
[ "$status" -eq 0 ] && echo "fuzz: no crash"
exit "$status"
