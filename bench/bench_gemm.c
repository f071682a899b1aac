/* bench_gemm.c — the projection GEMMs of one configuration, libmha's
 * mha_gemm (as the fast path runs them: bench_fast.h) against OpenBLAS's
 * cblas_sgemm, paired in one process: rounds of one call of each, the
 * order alternating round by round, on the same input rows and the same
 * number of threads, with the FMA peak of the ISA mha's kernels use
 * measured before every round and after the last. Both see the same
 * spells of load from other processes, so their ratio is steadier than
 * one of times taken in different processes.
 *
 * OpenBLAS: row-major (M, K) x (K, N), the layer's weights side by side
 * (W_Q | W_K | W_V for the fused QKV), no bias (beta = 0: it has no fused
 * bias, and a second pass would charge it for an API choice; mha_gemm's
 * bias is fused, which favours OpenBLAS slightly). Which of its kernels
 * run is OpenBLAS's choice or OPENBLAS_CORETYPE's (read when it loads):
 * run.sh starts one process per core type. */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_fast.h"

typedef struct {
    float *c;       /* (M,N) */
    const float *a; /* (M,K) */
    const float *w; /* (K,N) */
    int M, K, N;
} sgemm_job;

static void run_sgemm(const sgemm_job *j) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, j->M, j->N, j->K, 1.0f, j->a, j->K, j->w,
                j->N, 0.0f, j->c, j->N);
}

/* w (K, N): the sections' weights (K, cols[s]) side by side, row by row. */
static float *weights_side_by_side(const float *const *ws, const int *cols, int n, int K) {
    int N = 0;
    for (int s = 0; s < n; s++) N += cols[s];
    float *w = bench_alloc((size_t)K * N);
    for (int k = 0; k < K; k++)
        for (int s = 0, col = 0; s < n; col += cols[s], s++)
            memcpy(w + (size_t)k * N + col, ws[s] + (size_t)k * cols[s], (size_t)cols[s] * sizeof(float));
    return w;
}

/* GFLOP/s of the FMA loop of the ISA mha's kernels use (AVX2's for any
 * other than AVX-512): ~4 ms, one pass. */
static double isa_peak(const char *isa, int threads) {
    const long iters = 2000000;
    return strcmp(isa, "avx512") ? bench_fma_peak_avx2(threads, iters, 1, NULL)
                                 : bench_fma_peak_avx512(threads, iters, 1, NULL);
}

/* Cores the process keeps busy (CPU seconds per second) in the 20 ms after
 * one call of fn: the library's idle workers spinning instead of sleeping,
 * on the cores the other library's next call needs. */
static double idle_cores_after(void (*fn)(void *), void *arg) {
    fn(arg);
    const double c0 = bench_cpu_now(), t0 = bench_now();
    nanosleep(&(struct timespec){0, 20000000}, NULL);
    return (bench_cpu_now() - c0) / (bench_now() - t0);
}

static void call_mha(void *g) { bench_run_gemm(g); }
static void call_blas(void *j) { run_sgemm(j); }

/* Times one case paired; prints its RESULT line. */
static void pair_case(const bench_prefill_cfg *c, bench_gemm_case *g, const sgemm_job *blas) {
    enum { MAX = 256 };
    double tm[MAX], tb[MAX], ratio[MAX], peak[MAX + 1];
    const int rounds = c->reps < MAX ? c->reps : MAX;
    const char *core = getenv("OPENBLAS_CORETYPE"), *isa = g->kern->name;
    const char *wait = getenv("OMP_WAIT_POLICY"), *timeout = getenv("OPENBLAS_THREAD_TIMEOUT");
    printf("RESULT kind=gemm_pair name=%s gemm=%s M=%d K=%d N=%d threads=%d kernels=%s openblas=%s corename=%s"
           " omp_wait=%s openblas_timeout=%s",
           c->name, g->gemm, g->M, g->K, g->N, c->threads, isa, core ? core : "auto", openblas_get_corename(),
           wait ? wait : "unset", timeout ? timeout : "unset");
    // --- warm-up: the packed-block pool, OpenBLAS's buffers, the pages of the outputs
    int bad = bench_run_gemm(g);
    run_sgemm(blas);
    int n = 0;
    const double start = bench_now();
    while (!bad && n < rounds && (n < 3 || bench_now() - start < c->budget)) {
        peak[n] = isa_peak(isa, c->threads);
        for (int i = 0; i < 2; i++) {
            const double t0 = bench_now();
            if ((i + n) % 2 == 0) { /* mha first in even rounds, OpenBLAS first in odd ones */
                bad |= bench_run_gemm(g);
                tm[n] = bench_now() - t0;
            } else {
                run_sgemm(blas);
                tb[n] = bench_now() - t0;
            }
        }
        ratio[n] = tb[n] / tm[n];
        n++;
    }
    if (bad) {
        printf(" error=\"%s\"\n", mha_last_error());
        fflush(stdout);
        return;
    }
    peak[n] = isa_peak(isa, c->threads);
    double best = peak[0];
    for (int i = 1; i <= n; i++) best = peak[i] > best ? peak[i] : best;
    printf(" peak_isa=%s peak_gflops=%.2f peak_median_gflops=%.2f", strcmp(isa, "avx512") ? "avx2" : "avx512",
           best, bench_median(peak, n + 1));
    bench_print_times_as("mha_", tm, n);
    bench_print_times_as("blas_", tb, n);
    printf(" ratio_median=%.4f", bench_median(ratio, n));
    const double idle_mha = idle_cores_after(call_mha, g), idle_blas = idle_cores_after(call_blas, (void *)blas);
    printf(" idle_cores_after_mha=%.2f idle_cores_after_blas=%.2f\n", idle_mha, idle_blas);
    fflush(stdout);
}

int bench_gemm_paired(const bench_prefill_cfg *c, const mha_weights *w, const float *x,
                      const float *kv) {
    bench_fast f;
    if (bench_fast_init(&f, c, w, x, kv)) return -1;
    uint64_t seed = 99;
    const size_t nz = (size_t)c->B * c->T * f.rc.n_heads * f.rc.d_v;
    bench_fill(f.z, nz, &seed, -1.0f, 1.0f); /* O's input: attention's output, in range */
    for (int i = 0; i < f.n_gemm; i++) {
        bench_gemm_case *g = &f.gemm[i];
        const int o = !strcmp(g->gemm, "o"), s0 = o ? 0 : g->args.s0, s1 = o ? 1 : g->args.s1;
        const float *const all[3] = {w->w_q, w->w_k, w->w_v};
        const float *const *ws = o ? &w->w_o : all + s0;
        const int *cols = o ? &f.rc.d_model : f.qkv.cols + s0;
        float *wb = weights_side_by_side(ws, cols, s1 - s0, g->K), *cb = bench_alloc((size_t)g->M * g->N);
        const sgemm_job blas = {cb, g->args.a, wb, g->M, g->K, g->N};
        pair_case(c, g, &blas);
        free(wb);
        free(cb);
    }
    bench_fast_free(&f);
    return 0;
}
