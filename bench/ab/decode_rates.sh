#!/bin/sh
# decode_rates.sh [ROWS,..] — builds bench/ab/decode_rates.c against
# build/libmha.a (run `make lib` first) and runs it pinned to one core:
# the AVX-512 decode kernels' multiply-adds per ns on an L1-resident chunk
# per storage type and row count, against the core's FMA peak.
#   sh bench/ab/decode_rates.sh 1,4,8
set -e
out=build/ab
mkdir -p $out
CC="cc -std=c11 -O2 -g -fopenmp -Iinclude -Isrc -Ibench -D_DEFAULT_SOURCE"
$CC -mavx512f -c bench/machine_avx512.c -o $out/machine_avx512.o
$CC -mavx2 -mfma -c bench/machine_avx2.c -o $out/machine_avx2.o
$CC -o $out/decode_rates bench/ab/decode_rates.c bench/bench_util.c $out/machine_avx512.o $out/machine_avx2.o \
    build/libmha.a -ljansson -lpng -lm
exec taskset -c "${RATES_CPU:-1}" $out/decode_rates "${1:-1,4,8}"
