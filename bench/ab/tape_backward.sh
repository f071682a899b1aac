#!/bin/sh
# Builds build/ab_tape_backward (bench/ab/tape_backward.c): `old` = the
# attention backward (src/forward/backward_attention.c,
# src/kernels/avx512_backward.c) at commit $1 (default HEAD), `new` =
# build/libmha.a (run `make lib` first).
#   sh bench/ab/tape_backward.sh 9f6fbfe && OMP_WAIT_POLICY=passive build/ab_tape_backward 15 P1P2 1 2
# shellcheck disable=SC2086 # $F is a list of flags, split on purpose
set -e
base=${1:-HEAD}
out=build/ab_tape_backward.d
mkdir -p "$out"
git show "$base":src/forward/backward_attention.c > "$out/old_backward_attention.c"
git show "$base":src/kernels/avx512_backward.c > "$out/old_avx512_backward.c"
F="-std=c11 -O2 -g -fopenmp -Iinclude -Isrc -Ibench -D_DEFAULT_SOURCE"
AVX512="-mavx512f -mavx512bw -mavx512vl -mavx512dq -mfma -mf16c"
cc $F -Dmha_bwd_attention_backward=mha_bwd_attention_backward_old \
   -Dmha_bwd_attention_forward=mha_bwd_attention_forward_old -Dmha_fast_check_scores=mha_fast_check_scores_old \
   -c "$out/old_backward_attention.c" -o "$out/old_backward_attention.o"
cc $F $AVX512 -Dmha_backward_kernels_avx512=mha_backward_kernels_avx512_old \
   -c "$out/old_avx512_backward.c" -o "$out/old_avx512_backward.o"
cc $F -c bench/ab/tape_backward.c -o "$out/ab_tape_backward.o"
cc $F $AVX512 -c bench/machine_avx512.c -o "$out/machine_avx512.o"
cc $F -c bench/bench_util.c -o "$out/bench_util.o"
cc -fopenmp -o build/ab_tape_backward "$out/ab_tape_backward.o" "$out/old_backward_attention.o" \
   "$out/old_avx512_backward.o" "$out/machine_avx512.o" "$out/bench_util.o" build/libmha.a -ljansson -lm
