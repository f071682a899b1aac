#!/bin/sh
# ab_decode.sh REV [REPS] [TYPES] [H_KV,..] [L,..] — builds bench/ab/ab_decode.c with the
# decode attention (src/cache/decode.c + src/kernels/avx512_decode.c and avx2_decode.c) of
# git revision REV as "old" and the working tree's as "new" (after `make
# lib`), then runs it: interleaved, best of REPS (default 15), 1 and 2
# threads. Everything is built under build/ab/.
# ab_decode.sh REV cold [REPS] [TYPES] [H_KV,..] [L,..] [THREADS] — the same two builds
# timed cold (the last-level cache evicted before every call) against a
# cold 2-thread read of the cache's bytes: % of that read, 2 threads
# (defaults: 15, all types, 32,8, 1024,4096,16384, 2 threads).
set -e
rev=${1:?usage: bench/ab/ab_decode.sh REV [REPS] [TYPES]}
out=build/ab
mkdir -p $out
CC="cc -std=c11 -O2 -g -fopenmp -Iinclude -Isrc -Ibench -D_DEFAULT_SOURCE"
AVX512="-mavx512f -mavx512bw -mavx512vl -mavx512dq -mfma -mf16c"
git show "$rev:src/cache/decode.c" > $out/decode_old.c
# the old files see REV's decode_kernels.h (the table's entry points may
# differ in their parameters): -iquote comes before -I for "..." includes
mkdir -p $out/old_inc/kernels
git show "$rev:src/kernels/decode_kernels.h" > $out/old_inc/kernels/decode_kernels.h
OLD_INC="-iquote $out/old_inc"
git show "$rev:src/kernels/avx512_decode.c" > $out/avx512_decode_old.c
# (the prefetch policy's functions renamed too, where REV has them)
$CC $OLD_INC -Dmha_decode_attend=mha_decode_attend_old -Dmha_decode_prefetch_policy=mha_decode_prefetch_policy_old \
    -Dmha_decode_force_prefetch_policy=mha_decode_force_prefetch_policy_old -c $out/decode_old.c -o $out/decode_old.o
# NEW_CFLAGS (environment): extra flags for the new decode.c only (-D knobs)
$CC ${NEW_CFLAGS:-} -Dmha_decode_attend=mha_decode_attend_new -c src/cache/decode.c -o $out/decode_new.o
# the old grouped kernels too (renamed), where REV has them
ren="-Dmha_scores_t_avx512=mha_scores_t_avx512_old -Dmha_softmax_t_avx512=mha_softmax_t_avx512_old
     -Dmha_accumulate_t_avx512=mha_accumulate_t_avx512_old -Dmha_from_q8_avx512=mha_from_q8_avx512_old
     -Dmha_merge_t_avx512=mha_merge_t_avx512_old"
grouped_old=
if git show "$rev:src/kernels/avx512_decode_grouped.c" > $out/avx512_decode_grouped_old.c 2>/dev/null; then
  $CC $OLD_INC $AVX512 $ren -c $out/avx512_decode_grouped_old.c -o $out/avx512_decode_grouped_old.o
  grouped_old="$ren"; extra=$out/avx512_decode_grouped_old.o
fi
$CC $OLD_INC $AVX512 $grouped_old -Dmha_decode_kernels_avx512=mha_decode_kernels_avx512_old -c $out/avx512_decode_old.c \
    -o $out/avx512_decode_old.o
# the old AVX2 table (its exported kernels renamed; the fp32 sweep it
# calls is avx2_gemm_wq.c's, the working tree's)
git show "$rev:src/kernels/avx2_decode.c" > $out/avx2_decode_old.c
$CC $OLD_INC -mavx2 -mfma -mf16c -Dmha_decode_kernels_avx2=mha_decode_kernels_avx2_old \
    -Dmha_scores_q8_avx2=mha_scores_q8_avx2_old -Dmha_accumulate_q8_avx2=mha_accumulate_q8_avx2_old \
    -Dmha_from_q8_avx2=mha_from_q8_avx2_old -c $out/avx2_decode_old.c -o $out/avx2_decode_old.o
# the library's objects (those whose source still exists) but its decode.o,
# whose entry point the harness provides
objs=$(for o in build/src/*/*.o build/src/*.o; do
  s=${o#build/}; s=${s%.o}.c
  [ -f "$s" ] && [ "$s" != src/cache/decode.c ] && echo "$o"
done)
$CC -mavx512f -c bench/machine_avx512.c -o $out/machine_avx512.o
$CC -mavx2 -mfma -c bench/machine_avx2.c -o $out/machine_avx2.o
$CC -o $out/ab_decode bench/ab/ab_decode.c bench/bench_util.c $out/machine_avx512.o $out/machine_avx2.o $out/decode_old.o $out/decode_new.o \
    $out/avx512_decode_old.o $out/avx2_decode_old.o ${extra:-} $objs -ljansson -lpng -lm
# REPS = kernels: the decode kernels on one L1-resident chunk instead (ab_decode.c)
# REPS = loop TYPE H_KV L THREADS CALLS [cold]: the new build alone, for perf (ab_decode.c)
[ "${2:-}" = kernels ] && exec $out/ab_decode kernels
[ "${2:-}" = loop ] && shift 2 && exec env OPENBLAS_NUM_THREADS=1 $out/ab_decode loop "$@"
[ "${2:-}" = cold ] && exec env OPENBLAS_NUM_THREADS=1 $out/ab_decode cold "${3:-15}" "${4:-fp32,fp16,int8,int8/fp16}" \
    "${5:-32,8}" "${6:-1024,4096,16384}" "${7:-2}"
OPENBLAS_NUM_THREADS=1 $out/ab_decode "${2:-15}" "${3:-fp32,fp16,int8,int8/fp16}" "${4:-32,8,1}" "${5:-1024,16384}"
