/* ab_gemv.c — interleaved A/B of two builds of the decode projections
 * (issue 15 measurement tool, built by bench/ab/ab_gemv.sh, not by make):
 * "old" is src/compute/decode_gemm.c and the AVX-512 / AVX2 decode tables
 * (their fp32, bf16 and int8 streams) of a git revision, renamed; "new"
 * the working tree's, linked into one process.
 *
 * One case = the projections of a decode step of bench_decode.c's shape
 * (d_model 2048, h 32, d_head 64, M rows): Q, K, V in one call
 * (mha_decode_gemm_many, 3 jobs sharing x), then O, on random weights
 * stored as fp32, bf16 or int8 (one scale per 32 rows and column).
 * Timed cold: rounds of (evict, cold read of the weights' bytes from a
 * buffer of their size), (evict, old), (evict, new) in rotating order
 * (bench_evict: a pass over 1 GiB); best-of and median of REPS;
 * % = read time / call time (the cold roofline of the projections).
 * On 1 thread the calling thread's CPU time is printed too (what other
 * processes take does not count). Old and new must give the same bits:
 * `same` compares their outputs byte for byte.
 * Arguments: REPS TYPES(fp32,bf16,int8) H_KV(32,8,1) THREADS M; AB_HOT=1 in
 * the environment: no eviction (the weights from the LLC). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench.h"
#include "compute/decode_gemm.h"
#include "compute/exec.h"
#include "mha.h"

extern const mha_decode_kernels mha_decode_kernels_avx512_old, mha_decode_kernels_avx2_old;
mha_status mha_decode_gemm_many_old(const mha_exec *, const mha_decode_gemm_job *, int, const float *, int, int);

static double thread_cpu_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec * 1e-6;
}

typedef struct {
    mha_decode_gemm_job j[4]; /* q, k, v, o */
    float *x, *y[2][4];       /* x (M, 2048); y per build and job (M, n) */
    size_t bytes;             /* the weights' stored bytes (and scales) */
} gv_case;

static void job_make(gv_case *c, int i, int k, int n, int type, int M, uint64_t *seed) {
    mha_decode_gemm_job *J = &c->j[i];
    memset(J, 0, sizeof *J);
    J->n = n;
    float *w = bench_alloc((size_t)k * n);
    bench_fill(w, (size_t)k * n, seed, -0.02f, 0.02f);
    J->w = w;
    if (type == 1) {
        uint16_t *b = malloc(2 * (size_t)k * n);
        for (size_t e = 0; e < (size_t)k * n; e++) {
            uint32_t u;
            memcpy(&u, &w[e], 4);
            b[e] = (uint16_t)(u >> 16);
        }
        J->w_bf16 = b, c->bytes += 2 * (size_t)k * n;
    } else if (type == 2) {
        int8_t *q = malloc((size_t)k * n);
        float *s = bench_alloc((size_t)k / 32 * n);
        for (size_t e = 0; e < (size_t)k * n; e++) q[e] = (int8_t)(w[e] * 6000.0f);
        bench_fill(s, (size_t)k / 32 * n, seed, 1e-4f, 4e-4f);
        J->w_i8 = q, J->w_scale = s, J->w_seg = k, c->bytes += (size_t)k * n + 4 * (size_t)k / 32 * n;
    } else c->bytes += 4 * (size_t)k * n;
    for (int b = 0; b < 2; b++) c->y[b][i] = bench_alloc((size_t)M * n);
}

/* Whether name is one of the comma-separated list. */
static int listed(const char *list, const char *name) {
    char want[16], have[128];
    snprintf(want, sizeof want, ",%s,", name);
    snprintf(have, sizeof have, ",%s,", list);
    return strstr(have, want) != NULL;
}

static mha_status run(const mha_exec *ex, gv_case *c, int b, int M) {
    mha_status (*f)(const mha_exec *, const mha_decode_gemm_job *, int, const float *, int, int) =
        b ? mha_decode_gemm_many : mha_decode_gemm_many_old;
    mha_decode_gemm_job j[4];
    memcpy(j, c->j, sizeof j);
    for (int i = 0; i < 4; i++) j[i].y = c->y[b][i];
    mha_status s = f(ex, j, 3, c->x, M, 2048);
    return s ? s : f(ex, j + 3, 1, c->y[b][0], M, 2048); /* O's input: Q's output, as z would be */
}

int main(int argc, char **argv) {
    const int reps0 = argc > 1 ? atoi(argv[1]) : 15;
    const char *types = argc > 2 ? argv[2] : "fp32,bf16,int8";
    int hk[3] = {32, 8, 1}, nh = argc > 3 ? sscanf(argv[3], "%d,%d,%d", &hk[0], &hk[1], &hk[2]) : 3;
    const int nth = argc > 4 ? atoi(argv[4]) : 1, M = argc > 5 ? atoi(argv[5]) : 1;
    const int hot = getenv("AB_HOT") != NULL; /* AB_HOT=1: no eviction (weights from the LLC or L2) */
    const int reps = reps0 < 1 ? 1 : reps0 > 999 ? 999 : reps0;
    static const char *const names[3] = {"fp32", "bf16", "int8"};
    mha_set_num_threads(nth);
    mha_exec ex[2];
    if (mha_exec_resolve(&ex[1], NULL)) return printf("error: %s\n", mha_last_error()), 1;
    mha_isa isa_old = *ex[1].isa;
    if (isa_old.decode == &mha_decode_kernels_avx512) isa_old.decode = &mha_decode_kernels_avx512_old;
    else if (isa_old.decode == &mha_decode_kernels_avx2) isa_old.decode = &mha_decode_kernels_avx2_old;
    ex[0] = ex[1], ex[0].isa = &isa_old;
    bench_evict(nth); /* makes the eviction buffer, untimed */
    printf("projections %s, %d threads, M %d, best of / median of %d; %% = read of the weights' bytes / call\n",
           hot ? "hot" : "cold", nth, M, reps);
    printf("weights h_kv MiB | best ms: read old new | best %%: old new | median ms: read old new | median %%: old new "
           "| new/old median same");
    printf(nth == 1 ? " | cpu median %%: old new new/old\n" : "\n");
    for (int ty = 0; ty < 3; ty++)
        for (int a = 0; a < nh && listed(types, names[ty]); a++) {
            gv_case c;
            uint64_t seed = 11;
            memset(&c, 0, sizeof c);
            job_make(&c, 0, 2048, 2048, ty, M, &seed), job_make(&c, 1, 2048, 64 * hk[a], ty, M, &seed);
            job_make(&c, 2, 2048, 64 * hk[a], ty, M, &seed), job_make(&c, 3, 2048, 2048, ty, M, &seed);
            c.x = bench_alloc((size_t)M * 2048);
            bench_fill(c.x, (size_t)M * 2048, &seed, -1.0f, 1.0f);
            size_t n;
            float *rb = bench_read_buffer(c.bytes, nth, &n);
            static double t[3][999], tc[3][999];
            for (int r = 0; r < reps; r++)
                for (int s0 = 0; s0 < 3; s0++) {
                    const int s = (s0 + r) % 3; /* 0 read, 1 old, 2 new */
                    if (!hot) bench_evict(nth);
                    const double c0 = thread_cpu_ms(), w0 = bench_now();
                    if (s == 0) bench_read_pass(rb, n, nth);
                    else if (run(&ex[s - 1], &c, s - 1, M)) return printf("error: %s\n", mha_last_error()), 1;
                    t[s][r] = (bench_now() - w0) * 1e3, tc[s][r] = thread_cpu_ms() - c0;
                }
            int same = 1;
            for (int i = 0; i < 4; i++) same &= !memcmp(c.y[0][i], c.y[1][i], sizeof(float) * M * c.j[i].n);
            double best[3], med[3], cmed[3];
            for (int s = 0; s < 3; s++) {
                best[s] = t[s][0];
                for (int r = 1; r < reps; r++) best[s] = fmin(best[s], t[s][r]);
                med[s] = bench_median(t[s], reps), cmed[s] = bench_median(tc[s], reps);
            }
            printf("%s %d %.1f | %.4f %.4f %.4f | %.0f %.0f | %.4f %.4f %.4f | %.0f %.0f | %.3f %s", names[ty], hk[a],
                   (double)c.bytes / (1 << 20), best[0], best[1], best[2], 100 * best[0] / best[1],
                   100 * best[0] / best[2], med[0], med[1], med[2], 100 * med[0] / med[1], 100 * med[0] / med[2],
                   med[2] / med[1], same ? "yes" : "NO");
            if (nth == 1)
                printf(" | %.0f %.0f %.3f", 100 * cmed[0] / cmed[1], 100 * cmed[0] / cmed[2], cmed[2] / cmed[1]);
            printf("\n");
            fflush(stdout);
            free(rb), free(c.x);
            for (int i = 0; i < 4; i++) {
                free((void *)c.j[i].w), free((void *)c.j[i].w_bf16), free((void *)c.j[i].w_i8);
                free((void *)c.j[i].w_scale), free(c.y[0][i]), free(c.y[1][i]);
            }
        }
    return 0;
}
