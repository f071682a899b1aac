/* bench_util.c — timing, repetition and data helpers of the bench binary. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench.h"

double bench_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

double bench_cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double bench_median(double *v, int n) {
    if (n <= 0) return 0.0;
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double bench_min(const double *v, int n) {
    double m = n > 0 ? v[0] : 0.0;
    for (int i = 1; i < n; i++)
        if (v[i] < m) m = v[i];
    return m;
}

void bench_print_times_as(const char *prefix, const double *t, int n) {
    double tmp[256];
    if (n > 256) n = 256;
    for (int i = 0; i < n; i++) tmp[i] = t[i];
    printf(" %smedian_s=%.6g %smin_s=%.6g %sruns=%d %stimes_s=", prefix, bench_median(tmp, n), prefix,
           bench_min(t, n), prefix, n, prefix);
    for (int i = 0; i < n; i++) printf("%s%.6g", i ? "," : "", t[i]);
}

void bench_print_times(const double *t, int n) { bench_print_times_as("", t, n); }

int bench_repeat(int (*fn)(void *), void *arg, double *times, int max_runs, double budget_s) {
    int n = 0;
    double t0 = bench_now();
    if (fn(arg)) return -1;
    double warm = bench_now() - t0;
    /* A run that is long compared with the budget needs no warm-up (caches
     * and page faults are amortized) and cannot afford one. */
    double start = bench_now();
    if (warm > budget_s / 4) {
        times[n++] = warm;
        start = t0; /* the warm-up spent part of the budget */
    }
    while (n < max_runs && (n == 0 || bench_now() - start < budget_s)) {
        double a = bench_now();
        if (fn(arg)) return -1;
        times[n++] = bench_now() - a;
    }
    return n;
}

int bench_rounds(int (*const *fn)(void *), void *const *arg, int k, double *times, int max_runs,
                 double budget_s) {
    int n = 0;
    double t0 = bench_now();
    for (int i = 0; i < k; i++) {
        const double a = bench_now();
        if (fn[i](arg[i])) return -1;
        times[(size_t)i * max_runs] = bench_now() - a;
    }
    double start = bench_now();
    if (bench_now() - t0 > budget_s / 4) n = 1, start = t0; /* long warm-ups count as round 0 */
    for (; n < max_runs && (n == 0 || bench_now() - start < budget_s); n++)
        for (int i = 0; i < k; i++) {
            const double a = bench_now();
            if (fn[i](arg[i])) return -1;
            times[(size_t)i * max_runs + n] = bench_now() - a;
        }
    return n;
}

void bench_fill(float *p, size_t n, uint64_t *seed, float lo, float hi) {
    for (size_t i = 0; i < n; i++) {
        uint64_t z = (*seed += 0x9E3779B97F4A7C15ull);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        z ^= z >> 31;
        p[i] = lo + (hi - lo) * (float)((double)(z >> 11) * 0x1.0p-53);
    }
}

float *bench_alloc(size_t n) {
    size_t bytes = (n * sizeof(float) + 63) / 64 * 64;
    void *p = aligned_alloc(64, bytes ? bytes : 64);
    if (!p) {
        fprintf(stderr, "bench_mha: out of memory allocating %zu bytes\n", bytes);
        exit(1);
    }
    memset(p, 0, bytes ? bytes : 64);
    return p;
}

static volatile float bench_sink; /* keeps the chains' results alive */

double bench_fma_rate(float (*chains)(long iters), double flops_per_iter, int threads, long iters,
                      int reps, double *median_out) {
    double rates[64];
    if (reps > 64) reps = 64;
    if (reps < 1) reps = 1;
    for (int r = 0; r < reps; r++) {
        float acc = 0.0f;
        double t0 = bench_now();
#pragma omp parallel num_threads(threads) reduction(+ : acc)
        acc += chains(iters);
        double dt = bench_now() - t0;
        bench_sink = acc;
        rates[r] = flops_per_iter * (double)iters * threads / dt * 1e-9;
    }
    double best = rates[0];
    for (int r = 1; r < reps; r++)
        if (rates[r] > best) best = rates[r];
    if (median_out) *median_out = bench_median(rates, reps);
    return best;
}
