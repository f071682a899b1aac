/* bench/ab/attention.c — A/B of the fast attention: `old` is
 * src/forward/attention.c of an earlier commit (built by bench/ab/attention.sh
 * with mha_attention renamed mha_attention_old, and its
 * kernels/avx512_attention.c with each function renamed old_*: where the
 * kernel table is AVX-512, `old` runs those attention kernels), `new`
 * today's build/libmha.a. Rounds alternate old, new, with
 * the AVX-512 FMA peak measured before each; best of N by wall clock and
 * by process CPU time (CPU time leaves out the time other processes take
 * the cores: the shared machine's load moves wall clock 2-4x), and new's
 * CPU time / (threads x wall) ("busy", run with OMP_WAIT_POLICY=passive:
 * 1 when no thread waited or lost its core). Also
 * checks that both give the same bits.
 *   ab_attention ROUNDS [CASES] [THREADS_FROM] [THREADS_TO]
 * CASES: substring list of P1 P2 P3 (bench/run.sh's full shapes), P1h
 * P2h P3h (one head, repeated: K, V, Q in L2), P1m P3m (one kv head: K/V
 * in L2, Q and Z from memory), Xc (the shape in AB_CASE="B,T,S,d,h,causal,
 * h_kv"; h_kv 0: h). Legend: B, T, S, h, d_k as attention.h. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "forward/attention.h"
#include "bench.h"

mha_status mha_attention_old(const mha_attn_args *a, const mha_kernels *k, int n_threads);
void old_mha_attn_scores_avx512(float *s, size_t lds, const float *q, const float *kt, int d_k, int rows,
                                int npanels);
void old_mha_attn_softmax_avx512(float *s, size_t lds, float *m, float *l, float *alpha, const int *lo,
                                 const int *hi, int extra, int rows, int cols);
void old_mha_attn_pv_avx512(float *o, size_t ldo, const float *p, size_t ldp, const float *v, size_t ldv,
                            const float *alpha, int rows, int nk, int dv16);
void old_mha_attn_alibi_avx512(float *s, size_t lds, const int *qpos, const int *kpos, float slope, int rows,
                               int cols);
void old_mha_attn_pack_q_avx512(float *dst, const float *src, size_t src_rs, float scale, int rows, int rows6,
                                int d_k);

typedef struct { const char *name; int B, T, S, d, h, causal, hkv; } cs;

static void fill(float *x, size_t n, unsigned *s) {
    for (size_t i = 0; i < n; i++) {
        *s = *s * 1664525u + 1013904223u;
        x[i] = ((*s >> 8) / 16777216.0f - 0.5f) * 2.0f;
    }
}

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 15;
    const char *only = argc > 2 ? argv[2] : "";
    int thr0 = argc > 3 ? atoi(argv[3]) : 1, thr1 = argc > 4 ? atoi(argv[4]) : 2;
    cs cases[] = {{"P1", 4, 512, 512, 768, 12, 0, 0}, {"P2", 1, 4096, 4096, 768, 12, 1, 0},
                  {"P3", 2, 256, 2048, 1024, 16, 0, 0}, {"P1h", 1, 512, 512, 64, 1, 0, 0},
                  {"P2h", 1, 1024, 1024, 64, 1, 1, 0}, {"P3h", 1, 256, 2048, 64, 1, 0, 0},
                  {"P1m", 4, 512, 512, 768, 12, 0, 1}, {"P3m", 2, 256, 2048, 1024, 16, 0, 1},
                  {"Xc", 0, 0, 0, 0, 0, 0, 0}};
    const char *xs = getenv("AB_CASE"); /* "B,T,S,d,h,causal,h_kv": the case Xc */
    cs *x = &cases[sizeof cases / sizeof *cases - 1];
    if (xs && sscanf(xs, "%d,%d,%d,%d,%d,%d,%d", &x->B, &x->T, &x->S, &x->d, &x->h, &x->causal, &x->hkv) != 7)
        return fprintf(stderr, "AB_CASE: expected B,T,S,d,h,causal,h_kv\n"), 1;
    const mha_kernels *kern = mha_kernels_get();
    mha_kernels old_kern = *kern; /* the base commit's AVX-512 attention kernels */
    if (kern->attn_scores == mha_attn_scores_avx512) {
        old_kern.attn_scores = old_mha_attn_scores_avx512, old_kern.attn_softmax = old_mha_attn_softmax_avx512;
        old_kern.attn_pv = old_mha_attn_pv_avx512, old_kern.attn_alibi = old_mha_attn_alibi_avx512;
        old_kern.attn_pack_q = old_mha_attn_pack_q_avx512;
    }
    for (size_t ci = 0; ci < sizeof cases / sizeof *cases; ci++) {
        cs c = cases[ci];
        const char *hit = *only ? strstr(only, c.name) : NULL;
        while (hit && !c.name[2] && (hit[2] == 'h' || hit[2] == 'm')) hit = strstr(hit + 1, c.name);
        if (*only && !hit) continue; /* "P1h" selects P1h, not P1 */
        if (!*only && c.name[2]) continue;
        if (!c.B) continue; /* Xc without AB_CASE */
        mha_config cfg = mha_config_default(c.d, c.h), rc; cfg.n_kv_heads = c.hkv;
        if (mha_config_resolve(&rc, &cfg)) return 1;
        int d_k = rc.d_k, S_pad = (c.S + 15) / 16 * 16, ldv = (rc.d_v + 15) / 16 * 16;
        size_t nq = (size_t)c.B * c.h * c.T * d_k, nk = (size_t)c.B * c.h * S_pad * d_k;
        /* q (B,h,T,d_k), kt (B,h_kv,S_pad/16,d_k,16), v (B,h_kv,S_pad,ldv): ldv = d_v = d_k here */
        float *q = bench_alloc(nq), *kt = bench_alloc(nk), *v = bench_alloc(nk);
        float *z1 = bench_alloc(nq), *z2 = bench_alloc(nq); /* old's and new's Z */
        unsigned s = 1; fill(q, nq, &s); fill(kt, nk, &s); fill(v, nk, &s);
        mha_options opt = mha_options_default(); opt.causal = c.causal;
        mha_attn_args a = {.cfg = &rc, .opt = &opt, .q = q, .kt = kt, .v = v, .z = z1, .B = c.B, .T = c.T,
                           .S = c.S, .S_tot = c.S, .S_pad = S_pad, .ldv = ldv,
                           .scale = (float)(1.0 / sqrt((double)d_k)), .q_head_major = 1};
        mha_attn_args a2 = a; a2.z = z2;
        double flops = 4.0 * c.B * c.h * c.T * (double)c.S * d_k / (c.causal ? 2 : 1);
        int reps = c.name[2] == 'h' ? 20 : 1; /* one hot head: repeated inside the timing */
        for (int nt = thr0; nt <= thr1; nt++) {
            double bo = 1e30, bn = 1e30, pk = 0, ratio[64], co = 1e30, cn = 1e30, pc = 0, busy[64]; int nr = 0;
            for (int r = 0; r < rounds; r++) {
                double p = bench_fma_peak_avx512(nt, 2000000, 1, NULL); if (p > pk) pk = p;
                double q0 = bench_fma_peak_avx512_cpu(nt); if (q0 > pc) pc = q0;
                double t0 = bench_now(), c0 = bench_cpu_now();
                for (int i = 0; i < reps; i++) mha_attention_old(&a, &old_kern, nt);
                double to = (bench_now() - t0) / reps, cto = (bench_cpu_now() - c0) / reps / nt;
                t0 = bench_now(), c0 = bench_cpu_now();
                for (int i = 0; i < reps; i++) mha_attention(&a2, kern, nt);
                double tn = (bench_now() - t0) / reps, ctn = (bench_cpu_now() - c0) / reps / nt;
                if (cto < co) co = cto;
                if (ctn < cn) cn = ctn;
                if (to < bo) bo = to;
                if (tn < bn) bn = tn;
                if (nr < 64) busy[nr] = ctn / tn, ratio[nr++] = to / tn;
            }
            int same = memcmp(z1, z2, nq * 4) == 0;
            const double go = flops / bo * 1e-9, gn = flops / bn * 1e-9;
            printf("%-4s nt=%d wall: peak=%.0f old %.2f ms %.0f%% | new %.2f ms %.0f%% | best old/new %.3f",
                   c.name, nt, pk, bo * 1e3, go / pk * 100, bn * 1e3, gn / pk * 100, bo / bn);
            printf(" median %.3f %s\n", bench_median(ratio, nr), same ? "same-bits" : "DIFFERENT");
            printf("     cpu-time: peak=%.0f old %.0f%% new %.0f%% old/new %.3f", pc,
                   flops / co * 1e-9 / pc * 100, flops / cn * 1e-9 / pc * 100, co / cn);
            /* new's CPU time / (threads x wall): < 1 where a thread waited or
             * lost its core (passive wait policy: a waiting thread sleeps) */
            printf(" | new busy: median %.3f\n", bench_median(busy, nr));
            fflush(stdout);
        }
        free(q); free(kt); free(v); free(z1); free(z2);
    }
    return 0;
}
