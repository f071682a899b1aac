/* bench/ab/tape_backward.c — A/B of the tape backward's attention (pass 2
 * of backward_attention.c, FlashAttention-2's backward): `old` is
 * backward_attention.c and avx512_backward.c of an earlier commit (built
 * by bench/ab/tape_backward.sh with their symbols renamed *_old), `new`
 * today's build/libmha.a. Rounds alternate old, new; best of N by wall
 * clock and by process CPU time per thread (CPU time leaves out the time
 * other processes take the cores), against the AVX-512 FMA loop of the
 * bench measured the same way before each round. Also checks that both
 * give the same bits. The FLOP count is bench_backward.c's useful one
 * (FlashAttention-2's: 5 products of 2*pairs*d).
 *   ab_tape_backward ROUNDS [CASES] [THREADS_FROM] [THREADS_TO]
 * CASES: substring list of P1 P2 (bench/run.sh's shapes).
 * Legend: B, T, h, d as bench_backward.c. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "forward/backward_fast.h"

mha_status mha_bwd_attention_backward_old(const mha_bwd_attn *a, const mha_kernels *kern,
                                          const mha_backward_kernels *bk, int n_threads);
extern const mha_backward_kernels mha_backward_kernels_avx512_old;

typedef struct { const char *name; int B, T, d, h, causal; } cs;

int main(int argc, char **argv) {
    const int rounds = argc > 1 ? atoi(argv[1]) : 15;
    const char *only = argc > 2 ? argv[2] : "P1";
    const int thr0 = argc > 3 ? atoi(argv[3]) : 1, thr1 = argc > 4 ? atoi(argv[4]) : 2;
    const cs cases[] = {{"P1", 4, 512, 768, 12, 0}, {"P2", 1, 4096, 768, 12, 1}};
    const mha_kernels *kern = mha_kernels_get();
    for (size_t ci = 0; ci < sizeof cases / sizeof *cases; ci++) {
        const cs c = cases[ci];
        if (!strstr(only, c.name)) continue;
        const int B = c.B, T = c.T, D = c.d, h = c.h, d = D / h;
        const size_t act = (size_t)B * T * D;
        mha_config rc = mha_config_default(D, h);
        rc.n_kv_heads = h, rc.d_k = rc.d_v = d, rc.d_kv_in = rc.d_v_in = D;
        mha_options opt = mha_options_default();
        opt.causal = c.causal;
        uint64_t seed = 42;
        float *q = bench_alloc(act), *k = bench_alloc(act), *v = bench_alloc(act), *z = bench_alloc(act);
        const size_t nl = (size_t)B * h * T;
        float *dz = bench_alloc(act), *lse = bench_alloc(2 * nl); /* log l, then the row max */
        float *dq[2], *dk[2], *dv[2];
        for (int i = 0; i < 2; i++) dq[i] = bench_alloc(act), dk[i] = bench_alloc(act), dv[i] = bench_alloc(act);
        bench_fill(q, act, &seed, -1.0f, 1.0f), bench_fill(k, act, &seed, -1.0f, 1.0f);
        bench_fill(v, act, &seed, -1.0f, 1.0f), bench_fill(dz, act, &seed, -1.0f, 1.0f);
        mha_bwd_attn a[2] = {{&rc, &opt, q, k, v, z, lse, dz, dq[0], dk[0], dv[0], B, T, T, T, 1.0f / 8.0f, lse + nl},
                             {&rc, &opt, q, k, v, z, lse, dz, dq[1], dk[1], dv[1], B, T, T, T, 1.0f / 8.0f, lse + nl}};
        long masked;
        if (mha_bwd_attention_forward(&a[0], kern, NULL, 2, &masked)) return 1;
        const double pairs = (double)B * h * T * T * (c.causal ? 0.5 : 1.0), flops = 5.0 * 2.0 * pairs * d;
        for (int nt = thr0; nt <= thr1; nt++) {
            double bo = 1e30, bn = 1e30, co = 1e30, cn = 1e30, pk = 0, pc = 0, ratio[256];
            int nr = 0;
            for (int r = 0; r < rounds; r++) {
                const double p = bench_fma_peak_avx512(nt, 2000000, 1, NULL), p2 = bench_fma_peak_avx512_cpu(nt);
                if (p > pk) pk = p;
                if (p2 > pc) pc = p2;
                double t[2], ct[2];
                for (int w = 0; w < 2; w++) {
                    const double t0 = bench_now(), c0 = bench_cpu_now();
                    if (w == 0) mha_bwd_attention_backward_old(&a[0], kern, &mha_backward_kernels_avx512_old, nt);
                    else mha_bwd_attention_backward(&a[1], kern, &mha_backward_kernels_avx512, nt);
                    t[w] = bench_now() - t0, ct[w] = (bench_cpu_now() - c0) / nt;
                }
                if (t[0] < bo) bo = t[0];
                if (t[1] < bn) bn = t[1];
                if (ct[0] < co) co = ct[0];
                if (ct[1] < cn) cn = ct[1];
                if (nr < 256) ratio[nr++] = t[0] / t[1];
            }
            const int same = !memcmp(dq[0], dq[1], act * 4) && !memcmp(dk[0], dk[1], act * 4) &&
                             !memcmp(dv[0], dv[1], act * 4);
            printf("%s nt=%d wall: peak=%.0f old %.2f ms %.1f%% | new %.2f ms %.1f%% | best old/new %.3f "
                   "median %.3f %s\n", c.name, nt, pk, bo * 1e3, flops / bo * 1e-9 / pk * 100, bn * 1e3,
                   flops / bn * 1e-9 / pk * 100, bo / bn, bench_median(ratio, nr), same ? "same-bits" : "DIFFERENT");
            printf("   cpu-time: peak=%.0f old %.1f%% new %.1f%% old/new %.3f\n", pc, flops / co * 1e-9 / pc * 100,
                   flops / cn * 1e-9 / pc * 100, co / cn);
            fflush(stdout);
        }
        free(q), free(k), free(v), free(z), free(dz), free(lse);
        for (int i = 0; i < 2; i++) free(dq[i]), free(dk[i]), free(dv[i]);
    }
    return 0;
}
