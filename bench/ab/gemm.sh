#!/bin/sh
# Builds build/ab_gemm (bench/ab/gemm.c): `old` = src/compute/gemm.c at
# commit $1 (default main), or the file $1, `new` = build/libmha.a (run `make lib` first).
#   sh bench/ab/gemm.sh main && OMP_WAIT_POLICY=passive OPENBLAS_THREAD_TIMEOUT=4 \
#     OPENBLAS_CORETYPE=SkylakeX build/ab_gemm 15 "" 2
# (both pools sleep when their call ends: see report.py, isolation)
# shellcheck disable=SC2086 # $F is a list of flags, split on purpose
set -e
base=${1:-main}
out=build/ab_gemm.d
mkdir -p "$out"
if [ -f "$base" ]; then cp "$base" "$out/old_gemm.c"; else git show "$base":src/compute/gemm.c > "$out/old_gemm.c"; fi
F="-std=c11 -O2 -g -fopenmp -Iinclude -Isrc -Ibench -D_DEFAULT_SOURCE"
R="-Dmha_gemm=mha_gemm_old -Dmha_pack=mha_pack_old -Dmha_pack_from=mha_pack_from_old"
R="$R -Dmha_gemm_scratch_allocations=mha_gemm_scratch_allocations_old"
R="$R -Dmha_gemm_scratch_take=mha_gemm_scratch_take_old -Dmha_gemm_scratch_give=mha_gemm_scratch_give_old"
cc $F $R -Dmha_packed_free=mha_packed_free_old -c "$out/old_gemm.c" -o "$out/old_gemm.o"
cc $F -c bench/ab/gemm.c -o "$out/ab_gemm.o"
cc $F -mavx512f -c bench/machine_avx512.c -o "$out/machine_avx512.o"
cc $F -c bench/bench_util.c -o "$out/bench_util.o"
cc -fopenmp -o build/ab_gemm "$out/ab_gemm.o" "$out/old_gemm.o" "$out/machine_avx512.o" \
   "$out/bench_util.o" build/libmha.a -lopenblas -ljansson -lm
