#!/bin/sh
# decode_builds.sh OLD NEW [ROUNDS] — two builds of bench_mha (e.g. one
# built at an earlier commit and copied aside) alternated per decode case
# (d_model 2048, h 32, d_head 64, 2 threads; h_kv 8, 1, 32; L 1024, 4096;
# fp32, int8, fp16 caches): one line per run with the cold attention and
# cold step medians and their cold reads, in ms. Unlike ab_decode.sh the
# whole library differs between the two (allocation, projections), and
# each run is a fresh process, as `make bench` runs it.
old=${1:?usage: bench/ab/decode_builds.sh OLD_BENCH_MHA NEW_BENCH_MHA [ROUNDS]}
new=${2:?usage: bench/ab/decode_builds.sh OLD_BENCH_MHA NEW_BENCH_MHA [ROUNDS]}
rounds=${3:-2}
for hk in 8 1 32; do for L in 1024 4096; do for a in fp32 int8 fp16; do
  flag=""; [ "$a" = fp32 ] || flag="--$a"
  r=1
  while [ $r -le "$rounds" ]; do
    for b in old new; do
      bin=$old; [ $b = new ] && bin=$new
      # shellcheck disable=SC2086 # $flag is empty or one flag
      OPENBLAS_NUM_THREADS=1 "$bin" decode --d 2048 --h 32 --h-kv $hk --d-head 64 --L $L --steps 20 --threads 2 $flag 2>&1 |
        grep "kind=decode_cold impl=mha" |
        awk -v b=$b -v hk=$hk -v L=$L -v a=$a '{for (i = 1; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
          printf "%s h_kv=%s L=%s %s attn_cold=%.4f read=%.4f step_cold=%.4f read=%.4f\n", b, hk, L, a,
                 v["cold_attn_median_s"] * 1e3, v["cold_read_attn_median_s"] * 1e3,
                 v["cold_step_median_s"] * 1e3, v["cold_read_step_median_s"] * 1e3}'
    done
    r=$((r + 1))
  done
done; done; done
