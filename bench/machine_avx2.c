/* machine_avx2.c — the machine's own ceilings, measured in the same run as
 * the benchmarks: AVX2 FMA throughput and streaming read bandwidth.
 * Built with -mavx2 -mfma (bench/ only; the library scopes its ISA flags to
 * src/kernels/avx2*.c). */
#include <immintrin.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>

#include "bench.h"

/* 12 independent accumulators: FMA latency (4 cycles) x 2 FMA ports needs
 * at least 8 chains in flight; 12 leaves slack and still fits the 16 ymm
 * registers with the two operands. */
static float fma_chains_avx2(long iters) {
    __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
    __m256 c0 = _mm256_set1_ps(1.0f), c1 = _mm256_set1_ps(1.1f), c2 = _mm256_set1_ps(1.2f);
    __m256 c3 = _mm256_set1_ps(1.3f), c4 = _mm256_set1_ps(1.4f), c5 = _mm256_set1_ps(1.5f);
    __m256 c6 = _mm256_set1_ps(1.6f), c7 = _mm256_set1_ps(1.7f), c8 = _mm256_set1_ps(1.8f);
    __m256 c9 = _mm256_set1_ps(1.9f), c10 = _mm256_set1_ps(2.0f), c11 = _mm256_set1_ps(2.1f);
    for (long i = 0; i < iters; i++) {
        c0 = _mm256_fmadd_ps(c0, a, b);
        c1 = _mm256_fmadd_ps(c1, a, b);
        c2 = _mm256_fmadd_ps(c2, a, b);
        c3 = _mm256_fmadd_ps(c3, a, b);
        c4 = _mm256_fmadd_ps(c4, a, b);
        c5 = _mm256_fmadd_ps(c5, a, b);
        c6 = _mm256_fmadd_ps(c6, a, b);
        c7 = _mm256_fmadd_ps(c7, a, b);
        c8 = _mm256_fmadd_ps(c8, a, b);
        c9 = _mm256_fmadd_ps(c9, a, b);
        c10 = _mm256_fmadd_ps(c10, a, b);
        c11 = _mm256_fmadd_ps(c11, a, b);
    }
    __m256 s = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(c0, c1), _mm256_add_ps(c2, c3)),
                             _mm256_add_ps(_mm256_add_ps(c4, c5), _mm256_add_ps(c6, c7)));
    s = _mm256_add_ps(s, _mm256_add_ps(_mm256_add_ps(c8, c9), _mm256_add_ps(c10, c11)));
    float out[8];
    _mm256_storeu_ps(out, s);
    return out[0] + out[7];
}

double bench_fma_peak_avx2(int threads, long iters, int reps, double *median_out) {
    /* 12 chains x 8 lanes x 2 flops per iteration per thread */
    return bench_fma_rate(fma_chains_avx2, 12.0 * 8.0 * 2.0, threads, iters, reps, median_out);
}

/* Sums the buffer with 8 accumulators so the adds are never the limit. */
static float read_sum_avx2(const float *p, size_t n) {
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0, s4 = s0, s5 = s0, s6 = s0, s7 = s0;
    size_t i = 0;
    for (; i + 64 <= n; i += 64) {
        s0 = _mm256_add_ps(s0, _mm256_load_ps(p + i));
        s1 = _mm256_add_ps(s1, _mm256_load_ps(p + i + 8));
        s2 = _mm256_add_ps(s2, _mm256_load_ps(p + i + 16));
        s3 = _mm256_add_ps(s3, _mm256_load_ps(p + i + 24));
        s4 = _mm256_add_ps(s4, _mm256_load_ps(p + i + 32));
        s5 = _mm256_add_ps(s5, _mm256_load_ps(p + i + 40));
        s6 = _mm256_add_ps(s6, _mm256_load_ps(p + i + 48));
        s7 = _mm256_add_ps(s7, _mm256_load_ps(p + i + 56));
    }
    __m256 s = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)),
                             _mm256_add_ps(_mm256_add_ps(s4, s5), _mm256_add_ps(s6, s7)));
    float out[8];
    _mm256_storeu_ps(out, s);
    float r = out[0] + out[1] + out[2] + out[3] + out[4] + out[5] + out[6] + out[7];
    for (; i < n; i++) r += p[i];
    return r;
}

static volatile float bench_sink; /* keeps the sums alive */

/* [lo, hi) of n floats for the calling thread of an OpenMP team: parts
 * of whole 64-float blocks, the last one taking the tail. */
static void thread_part(size_t n, size_t *lo, size_t *hi) {
    const size_t t = (size_t)omp_get_thread_num(), nt = (size_t)omp_get_num_threads();
    *lo = n / 64 * t / nt * 64;
    *hi = t == nt - 1 ? n : n / 64 * (t + 1) / nt * 64;
}

double bench_read_pass(const float *buf, size_t n, int threads) {
    float acc = 0.0f;
    double t0 = bench_now();
#pragma omp parallel num_threads(threads) reduction(+ : acc)
    {
        size_t lo, hi;
        thread_part(n, &lo, &hi);
        acc += read_sum_avx2(buf + lo, hi - lo);
    }
    double dt = bench_now() - t0;
    bench_sink = acc;
    return dt;
}

/* Each thread fills, and later reads, the same part of the buffer, so a
 * NUMA machine would place the pages near their reader. huge: 2 MiB
 * aligned and marked for huge pages before the first touch (the fill), as
 * the KV cache (mha_calloc_large) and the weights (mha_alloc_large) are:
 * the reference read pays the page walks they pay, no more. */
static float *read_buffer(size_t bytes, int threads, size_t *n_out, int huge) {
    const size_t n = (bytes + sizeof(float) - 1) / sizeof(float), page = huge ? (size_t)2 << 20 : 64;
    const size_t alloc = ((n ? n : 1) * sizeof(float) + page - 1) / page * page;
    float *buf = aligned_alloc(page, alloc);
    if (!buf) {
        fprintf(stderr, "bench_mha: out of memory allocating %zu bytes\n", alloc);
        exit(1);
    }
#ifdef MADV_HUGEPAGE
    if (huge) (void)madvise(buf, alloc, MADV_HUGEPAGE); /* a hint: failure is fine */
#endif
#pragma omp parallel num_threads(threads)
    {
        size_t lo, hi;
        thread_part(n, &lo, &hi);
        for (size_t i = lo; i < hi; i++) buf[i] = (float)(i & 7) * 0.125f;
    }
    *n_out = n;
    return buf;
}

float *bench_read_buffer(size_t bytes, int threads, size_t *n_out) { return read_buffer(bytes, threads, n_out, 1); }

long bench_evict_mib(void) {
    const char *e = getenv("BENCH_EVICT_MIB");
    return e && atol(e) > 0 ? atol(e) : 1024;
}

/* The eviction buffer, made on first use. */
static float *evict_buf;
static size_t evict_n;

void bench_evict(int threads) {
    /* 4 KiB pages: the pass also displaces the TLB entries of what it
     * evicts (512 huge pages would leave the cache's in the STLB) */
    if (!evict_buf) evict_buf = read_buffer((size_t)bench_evict_mib() << 20, threads, &evict_n, 0);
    bench_read_pass(evict_buf, evict_n, threads);
}

/* The FMA rate of one short burst (~0.1 ms) right after bench_evict, and
 * of the same burst after ~3 ms of others, medians over `reps` rounds:
 * the clock the cold decode rounds (bench_decode.c) meet. On the Zen 3 VM
 * of round 32 a burst right after the 1 GiB eviction ran at 0.62x the
 * steady rate, recovering over 1-4 ms of work; after 64 MiB, 1.0x. */
void bench_fma_after_evict(int threads, int reps, double *first_out, double *steady_out) {
    enum { BURST = 50000, WARM = 30, MAX_REPS = 64 };
    double first[MAX_REPS], steady[MAX_REPS];
    if (reps > MAX_REPS) reps = MAX_REPS;
    if (reps < 1) reps = 1;
    for (int r = 0; r < reps; r++) {
        bench_evict(threads);
        for (int b = 0; b <= WARM; b++) { /* one burst a call: bench_fma_peak_avx2's loop */
            const double rate = bench_fma_rate(fma_chains_avx2, 12.0 * 8.0 * 2.0, threads, BURST, 1, NULL);
            if (b == 0) first[r] = rate;
            if (b == WARM) steady[r] = rate;
        }
    }
    *first_out = bench_median(first, reps);
    *steady_out = bench_median(steady, reps);
}

double bench_stream_read(int threads, size_t bytes, int reps, double *best_out) {
    size_t n;
    float *buf = bench_read_buffer(bytes / (64 * sizeof(float)) * (64 * sizeof(float)), threads, &n);
    double rates[64];
    if (reps > 64) reps = 64;
    if (reps < 1) reps = 1;
    for (int r = 0; r < reps; r++) rates[r] = (double)n * sizeof(float) / bench_read_pass(buf, n, threads) * 1e-9;
    double best = rates[0];
    for (int r = 1; r < reps; r++)
        if (rates[r] > best) best = rates[r];
    if (best_out) *best_out = best;
    double med = bench_median(rates, reps);
    free(buf);
    return med;
}
