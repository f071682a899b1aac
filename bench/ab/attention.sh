#!/bin/sh
# Builds build/ab_attention (bench/ab/attention.c): `old` = attention.c and
# kernels/avx512_attention.c at commit $1 (default HEAD; its functions
# renamed old_*), `new` = build/libmha.a (run `make lib` first).
#   sh bench/ab/attention.sh 0f74ac9 && OMP_WAIT_POLICY=passive build/ab_attention 15 P1P2P3 1 2
# shellcheck disable=SC2086 # $F is a list of flags, split on purpose
set -e
base=${1:-HEAD}
out=build/ab_attention.d
mkdir -p "$out"
git show "$base":src/forward/attention.c > "$out/old_attention.c"
F="-std=c11 -O2 -g -fopenmp -Iinclude -Isrc -Ibench -D_DEFAULT_SOURCE"
cc $F -Dmha_attention=mha_attention_old -c "$out/old_attention.c" -o "$out/old_attention.o"
git show "$base":src/kernels/avx512_attention.c > "$out/old_avx512_attention.c"
R=""
for f in scores softmax pv alibi pack_q; do R="$R -Dmha_attn_${f}_avx512=old_mha_attn_${f}_avx512"; done
cc $F $R -mavx512f -mavx512bw -mavx512vl -mavx512dq -mfma -c "$out/old_avx512_attention.c" \
   -o "$out/old_avx512_attention.o"
cc $F -c bench/ab/attention.c -o "$out/ab_attention.o"
cc $F -mavx512f -c bench/machine_avx512.c -o "$out/machine_avx512.o"
cc $F -c bench/bench_util.c -o "$out/bench_util.o"
cc -fopenmp -o build/ab_attention "$out/ab_attention.o" "$out/old_attention.o" "$out/old_avx512_attention.o" \
   "$out/machine_avx512.o" \
   "$out/bench_util.o" build/libmha.a -ljansson -lm
