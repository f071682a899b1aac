/* decode_rates.c — the decode table's attention kernels on one chunk that
 * stays in L1 (128 keys, d_k = d_v = 64): multiply-adds per ns of one
 * core for each storage type (fp32, fp16, int8) and row count, and that
 * rate as a share of the core's FMA peak. What a kernel reaches here is
 * the most it can reach on a cold cache, whose lines it must also wait
 * for: where a type's rate is far below the FMA peak, its decode attention
 * is bound by the widening, not by the bytes (bench/LIMITS.md, round 16).
 * Built by decode_rates.sh against build/libmha.a.
 *   usage: decode_rates ROWS,..  (default 1,4,8; pin it: taskset -c 1)
 * Legend: m query rows, n keys, d dims. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "kernels/decode_kernels.h"
#include "kernels/kernels.h"

#define N_KEYS 128 /* one MHA_DECODE_CHUNK */
#define D 64
#define CALLS 20000
#define ROUNDS 7

typedef struct {
    const mha_decode_kernels *K;
    int m, which; /* which: see kernel_names */
    float *s, *q, *p, *acc, *kf, *vf, *ks, *vs; /* s (m, n), q (m, d), p (m, n), acc (m, d) */
    uint16_t *kh, *vh;                          /* fp16 panels (n/8, d, 8) and rows (n, d) */
    int8_t *kq, *vq;                            /* int8 likewise, scales (n/8, 2, 8), (n, 2)  */
} rate_case;

static const char *const kernel_names[6] = {"scores fp32", "scores fp16", "scores int8",
                                            "accumulate fp32", "accumulate fp16", "accumulate int8"};

static void run_calls(const rate_case *c) {
    const mha_decode_kernels *K = c->K;
    for (int r = 0; r < CALLS; r++) switch (c->which) {
        case 0: K->scores(c->s, N_KEYS, c->q, D, c->kf, c->m, N_KEYS, D); break;
        case 1: K->scores_h(c->s, N_KEYS, c->q, D, c->kh, c->m, N_KEYS, D); break;
        case 2: K->scores_q8(c->s, N_KEYS, c->q, D, c->kq, c->ks, c->m, N_KEYS, D); break;
        case 3: K->accumulate(c->acc, D, c->p, N_KEYS, c->vf, c->m, N_KEYS, D); break;
        case 4: K->accumulate_h(c->acc, D, c->p, N_KEYS, c->vh, c->m, N_KEYS, D); break;
        default: K->accumulate_q8(c->acc, D, c->p, N_KEYS, c->vq, c->vs, c->m, N_KEYS, D); break;
        }
}

int main(int argc, char **argv) {
    if (!mha_cpu_has_avx512()) {
        fprintf(stderr, "decode_rates: this CPU has no AVX-512\n");
        return 1;
    }
    const char *rows = argc > 1 ? argv[1] : "1,4,8";
    const double peak_macs = bench_fma_peak_avx512(1, 20000000, 5, NULL) / 2.0; /* multiply-adds per ns, one core */
    uint64_t seed = 7;
    const size_t nd = (size_t)N_KEYS * D, mmax = 32;
    rate_case c = {.K = &mha_decode_kernels_avx512};
    float **f[] = {&c.s, &c.q, &c.p, &c.acc, &c.kf, &c.vf, &c.ks, &c.vs};
    const size_t fn[] = {mmax * N_KEYS, mmax * D, mmax * N_KEYS, mmax * D, nd, nd, N_KEYS * 2, N_KEYS * 2};
    for (int i = 0; i < 8; i++) *f[i] = bench_alloc(fn[i]), bench_fill(*f[i], fn[i], &seed, 0.0f, 1.0f);
    c.kh = malloc(nd * 2), c.vh = malloc(nd * 2), c.kq = malloc(nd), c.vq = malloc(nd);
    if (!c.kh || !c.vh || !c.kq || !c.vq) return 1;
    for (size_t i = 0; i < nd; i++) /* fp16 0.5 .. 1.5; int8 -64 .. 63 */
        c.kh[i] = c.vh[i] = (uint16_t)(0x3800 + i % 1024), c.kq[i] = c.vq[i] = (int8_t)(i * 37 % 128 - 64);
    printf("decode kernels on one L1-resident chunk (%d keys, d %d), one core; FMA peak %.1f multiply-adds/ns\n",
           N_KEYS, D, peak_macs);
    printf("kernel | rows | ns per call | multiply-adds/ns | %% of the FMA peak\n");
    for (const char *r = rows; *r; r = strchr(r, ',') ? strchr(r, ',') + 1 : "") {
        c.m = atoi(r);
        if (c.m < 1 || c.m > (int)mmax) {
            fprintf(stderr, "decode_rates: rows %d not in 1..%zu\n", c.m, mmax);
            return 1;
        }
        for (c.which = 0; c.which < 6; c.which++) {
            double best = 1e30;
            for (int round = 0; round < ROUNDS; round++) {
                const double t0 = bench_now();
                run_calls(&c);
                const double t = bench_now() - t0;
                best = t < best ? t : best;
            }
            const double ns = best / CALLS * 1e9, rate = (double)c.m * N_KEYS * D / ns;
            printf("%s | %d | %.1f | %.1f | %.0f%%\n", kernel_names[c.which], c.m, ns, rate, 100.0 * rate / peak_macs);
        }
    }
    return 0;
}
