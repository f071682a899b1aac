#!/bin/sh
# ab_mqa.sh REV [REPS] [TYPES] [L,..] [THREADS,..] — the MQA cases (h_kv 1)
# of the decode attention, old (git revision REV) against new (the working
# tree, after `make lib`), hot and cold, with their roofline %
# (bench/ab/ab_mqa.c). Builds the old/new objects with ab_decode.sh (no
# cases run there), then links ab_mqa.c against them. `ab_mqa.sh REV loop
# TYPE L THREADS CALLS` runs new alone (for perf record).
set -e
rev=${1:?usage: bench/ab/ab_mqa.sh REV [REPS] [TYPES] [L,..] [THREADS,..]}
out=build/ab
sh bench/ab/ab_decode.sh "$rev" 0 none > /dev/null
objs=$(for o in build/src/*/*.o build/src/*.o; do
  s=${o#build/}; s=${s%.o}.c
  [ -f "$s" ] && [ "$s" != src/cache/decode.c ] && echo "$o"
done)
old_grouped=
[ -f $out/avx512_decode_grouped_old.o ] && old_grouped=$out/avx512_decode_grouped_old.o
cc -std=c11 -O2 -fopenmp -Iinclude -Isrc -Ibench -D_DEFAULT_SOURCE -o $out/ab_mqa bench/ab/ab_mqa.c \
   bench/bench_util.c $out/machine_avx512.o $out/machine_avx2.o $out/decode_old.o $out/decode_new.o \
   $out/avx512_decode_old.o $out/avx2_decode_old.o $old_grouped $objs -ljansson -lpng -lm
shift
OPENBLAS_NUM_THREADS=1 exec $out/ab_mqa "$@"
