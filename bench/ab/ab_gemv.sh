#!/bin/sh
# ab_gemv.sh REV [REPS] [TYPES] [H_KV,..] [THREADS] [M] — builds
# bench/ab/ab_gemv.c with the decode projections (src/compute/decode_gemm.c
# and the AVX-512 / AVX2 decode tables with their bf16 / int8 streams) of
# git revision REV as "old" and the working tree's as "new" (after `make
# lib`), then times a decode step's four projections cold, interleaved
# (ab_gemv.c). Defaults: 15 reps, fp32,bf16,int8, h_kv 32,8,1, 1 thread,
# M 1 row. MHA_KERNELS=avx2 runs both on the AVX2 tables. Built under
# build/ab/.
set -e
rev=${1:?usage: bench/ab/ab_gemv.sh REV [REPS] [TYPES] [H_KV,..] [THREADS] [M]}
out=build/ab
mkdir -p $out
CC="cc -std=c11 -O2 -g -fopenmp -Iinclude -Isrc -Ibench -D_DEFAULT_SOURCE"
AVX512="-mavx512f -mavx512bw -mavx512vl -mavx512dq -mfma -mf16c"
AVX2="-mavx2 -mfma -mf16c"
ren="-Dmha_decode_gemm_many=mha_decode_gemm_many_old -Dmha_decode_gemm=mha_decode_gemm_old
     -Dmha_decode_kernels_avx512=mha_decode_kernels_avx512_old -Dmha_decode_kernels_avx2=mha_decode_kernels_avx2_old
     -Dmha_gemm_stream_bf16_avx512=mha_gemm_stream_bf16_avx512_old -Dmha_gemm_stream_i8_avx512=mha_gemm_stream_i8_avx512_old
     -Dmha_gemm_stream_bf16_avx2=mha_gemm_stream_bf16_avx2_old -Dmha_gemm_stream_i8_avx2=mha_gemm_stream_i8_avx2_old
     -Dmha_scores_q8_avx2=mha_scores_q8_avx2_old -Dmha_accumulate_q8_avx2=mha_accumulate_q8_avx2_old
     -Dmha_from_q8_avx2=mha_from_q8_avx2_old"
for f in compute/decode_gemm kernels/avx512_decode kernels/avx512_gemm_wq kernels/avx2_decode kernels/avx2_gemm_wq; do
  b=$(basename $f)
  git show "$rev:src/$f.c" > $out/${b}_old.c
  case $b in avx512*) fl=$AVX512 ;; avx2*) fl=$AVX2 ;; *) fl= ;; esac
  $CC $fl $ren -c $out/${b}_old.c -o $out/${b}_gv_old.o
done
objs=$(for o in build/src/*/*.o build/src/*.o; do
  s=${o#build/}; s=${s%.o}.c
  [ -f "$s" ] && echo "$o"
done)
$CC -mavx512f -c bench/machine_avx512.c -o $out/machine_avx512.o
$CC -mavx2 -mfma -c bench/machine_avx2.c -o $out/machine_avx2.o
$CC -o $out/ab_gemv bench/ab/ab_gemv.c bench/bench_util.c $out/machine_avx512.o $out/machine_avx2.o \
    $out/*_gv_old.o $objs -ljansson -lpng -lm
[ -n "${AB_BUILD_ONLY:-}" ] && exit 0
exec env OPENBLAS_NUM_THREADS=1 $out/ab_gemv "${2:-15}" "${3:-fp32,bf16,int8}" "${4:-32,8,1}" "${5:-1}" "${6:-1}"
