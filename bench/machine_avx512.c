/* machine_avx512.c — AVX-512 FMA throughput, for context only: libmha's
 * kernels are AVX2, so the AVX2 peak is the ceiling its fractions are
 * quoted against, but OpenBLAS and PyTorch may use AVX-512 on a CPU that
 * has it, and the table says so. Built with -mavx512f; run only after
 * CPUID confirms AVX-512F. */
#include <immintrin.h>

#include "bench.h"

/* 16 chains: latency 4 x 2 ports = 8 needed; 32 zmm registers hold them. */
static float fma_chains_avx512(long iters) {
    __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-7f);
    __m512 c[16];
    for (int k = 0; k < 16; k++) c[k] = _mm512_set1_ps(1.0f + 0.1f * (float)k);
    for (long i = 0; i < iters; i++) {
        c[0] = _mm512_fmadd_ps(c[0], a, b);
        c[1] = _mm512_fmadd_ps(c[1], a, b);
        c[2] = _mm512_fmadd_ps(c[2], a, b);
        c[3] = _mm512_fmadd_ps(c[3], a, b);
        c[4] = _mm512_fmadd_ps(c[4], a, b);
        c[5] = _mm512_fmadd_ps(c[5], a, b);
        c[6] = _mm512_fmadd_ps(c[6], a, b);
        c[7] = _mm512_fmadd_ps(c[7], a, b);
        c[8] = _mm512_fmadd_ps(c[8], a, b);
        c[9] = _mm512_fmadd_ps(c[9], a, b);
        c[10] = _mm512_fmadd_ps(c[10], a, b);
        c[11] = _mm512_fmadd_ps(c[11], a, b);
        c[12] = _mm512_fmadd_ps(c[12], a, b);
        c[13] = _mm512_fmadd_ps(c[13], a, b);
        c[14] = _mm512_fmadd_ps(c[14], a, b);
        c[15] = _mm512_fmadd_ps(c[15], a, b);
    }
    __m512 s = c[0];
    for (int k = 1; k < 16; k++) s = _mm512_add_ps(s, c[k]);
    return _mm512_reduce_add_ps(s);
}

double bench_fma_peak_avx512(int threads, long iters, int reps, double *median_out) {
    if (median_out) *median_out = 0.0;
    if (!__builtin_cpu_supports("avx512f")) return 0.0;
    /* 16 chains x 16 lanes x 2 flops per iteration per thread */
    return bench_fma_rate(fma_chains_avx512, 16.0 * 16.0 * 2.0, threads, iters, reps, median_out);
}

double bench_fma_peak_avx512_cpu(int threads) {
    const long it = 1000000;
    const double c0 = bench_cpu_now();
    bench_fma_peak_avx512(threads, it, 1, NULL);
    return 512.0 * it * threads / (bench_cpu_now() - c0) * 1e-9 * threads;
}
