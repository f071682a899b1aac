/* bench/ab/gemm.c — A/B of the projection GEMM driver: `old` is
 * src/compute/gemm.c of an earlier commit (built by bench/ab/gemm.sh with
 * its symbols renamed *_old), `new` today's build/libmha.a, and OpenBLAS's
 * cblas_sgemm (set OPENBLAS_CORETYPE=SkylakeX to force its AVX-512
 * kernels) on the bench's projection shapes, written as the fast path
 * writes them (Q/V per head, K transposed, O rows). Each round runs old,
 * new, OpenBLAS in a rotating order with the AVX-512 FMA peak measured
 * before it; best of ROUNDS by wall clock and by process CPU time (all
 * threads: the work done, less sensitive to other processes). Checks old and new give the
 * same bits.
 *   ab_gemm ROUNDS [SHAPES] [THREADS]
 * SHAPES: substring list of P1qkv P1o P2qkv P2o P3q P3kv P3o. */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "compute/gemm.h"
#include "bench.h"

mha_status mha_gemm_old(const mha_gemm_args *g, const mha_kernels *kern, int n_threads);
void openblas_set_num_threads(int n);

/* name, B, T (rows per batch), d (K), sections: 3 = Q|K^T|V, 2 = K^T|V, 1 = Q heads, 0 = O rows */
typedef struct { const char *name; int B, T, d, kind; } shape;

int main(int argc, char **argv) {
    const int rounds = argc > 1 ? atoi(argv[1]) : 15;
    const char *only = argc > 2 ? argv[2] : "";
    const int nt = argc > 3 ? atoi(argv[3]) : 2;
    shape shapes[] = {{"P1qkv", 4, 512, 768, 3}, {"P1o", 4, 512, 768, 0}, {"P2qkv", 1, 4096, 768, 3},
                      {"P2o", 1, 4096, 768, 0},  {"P3q", 2, 256, 1024, 1}, {"P3kv", 2, 2048, 1024, 2},
                      {"P3o", 2, 256, 1024, 0}};
    const mha_kernels *kern = mha_kernels_get();
    openblas_set_num_threads(nt);
    for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++) {
        const shape c = shapes[si];
        if (*only && !strstr(only, c.name)) continue;
        const int D = c.d, h = D / 64, dh = 64, M = c.B * c.T, S_pad = (c.T + 15) / 16 * 16;
        const int ns = c.kind == 3 ? 3 : c.kind == 2 ? 2 : 1, N = ns * D;
        uint64_t seed = 7;
        float *x = bench_alloc((size_t)M * D), *w = bench_alloc((size_t)D * N), *b = bench_alloc(N);
        bench_fill(x, (size_t)M * D, &seed, -1, 1);
        bench_fill(w, (size_t)D * N, &seed, -0.1f, 0.1f);
        bench_fill(b, N, &seed, -0.1f, 0.1f);
        const float *ws[3], *bs[3];
        int cols[3];
        for (int s = 0; s < ns; s++) ws[s] = w + (size_t)s * D * D, bs[s] = b + s * D, cols[s] = D;
        mha_packed p;
        if (mha_pack(&p, D, ns, ws, bs, cols)) return 1;
        const size_t per = (size_t)c.B * h * S_pad * dh; /* one section's head-split output */
        float *o1 = bench_alloc(per * ns), *o2 = bench_alloc(per * ns), *ob = bench_alloc((size_t)M * N);
        mha_dst d1[3], d2[3];
        for (int s = 0; s < ns; s++) {
            int sec = c.kind == 3 ? s : c.kind == 2 ? s + 1 : c.kind == 1 ? 0 : -1; /* 0 Q, 1 K, 2 V */
            if (sec < 0) d1[s] = (mha_dst){MHA_DST_ROWS, o1, (size_t)D, 0, 0, 0, 0};
            else if (sec == 1)
                d1[s] = (mha_dst){MHA_DST_HEADS_T, o1 + s * per, 0, dh, h, c.T, (size_t)S_pad * dh};
            else d1[s] = (mha_dst){MHA_DST_HEADS, o1 + s * per, (size_t)dh, dh, h, c.T, (size_t)S_pad * dh};
            d2[s] = d1[s];
            d2[s].base = o2 + (d1[s].base - o1);
        }
        const mha_gemm_args ga = {d1, x, (size_t)D, M, &p, 0, ns, 0, D, 1, 0};
        mha_gemm_args gb = ga;
        gb.dst = d2;
        const double flops = 2.0 * M * (double)D * N;
        double best[3] = {1e30, 1e30, 1e30}, cbest[3] = {1e30, 1e30, 1e30}, pk = 0, ratio_o[128], ratio_b[128];
        int nr = 0;
        for (int r = 0; r < rounds; r++) {
            double pkr = bench_fma_peak_avx512(nt, 2000000, 1, NULL);
            if (pkr > pk) pk = pkr;
            double t[3], ct[3];
            for (int i = 0; i < 3; i++) {
                int which = (i + r) % 3;
                double t0 = bench_now(), c0 = bench_cpu_now();
                if (which == 0) mha_gemm_old(&ga, kern, nt);
                else if (which == 1) mha_gemm(&gb, kern, nt);
                else cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, N, D, 1.0f, x, D, w, N, 0.0f, ob, N);
                t[which] = bench_now() - t0, ct[which] = bench_cpu_now() - c0;
            }
            for (int i = 0; i < 3; i++) {
                if (t[i] < best[i]) best[i] = t[i];
                if (ct[i] < cbest[i]) cbest[i] = ct[i];
            }
            if (nr < 128) ratio_o[nr] = t[0] / t[1], ratio_b[nr] = t[2] / t[1], nr++;
        }
        const int same = memcmp(o1, o2, per * ns * sizeof(float)) == 0;
        printf("%-6s nt=%d peak=%.0f GF/s  old %.0f (%.0f%%)  new %.0f (%.0f%%)  blas %.0f (%.0f%%)  "
               "new/old best %.3f med %.3f  new/blas best %.3f med %.3f  %s  cpu-time old/new %.3f blas/new %.3f\n",
               c.name, nt, pk, flops / best[0] * 1e-9, flops / best[0] * 1e-9 / pk * 100,
               flops / best[1] * 1e-9, flops / best[1] * 1e-9 / pk * 100, flops / best[2] * 1e-9,
               flops / best[2] * 1e-9 / pk * 100, best[0] / best[1], bench_median(ratio_o, nr),
               best[2] / best[1], bench_median(ratio_b, nr), same ? "same-bits" : "DIFFERENT",
               cbest[0] / cbest[1], cbest[2] / cbest[1]);
        fflush(stdout);
        mha_packed_free(&p);
        free(x); free(w); free(b); free(o1); free(o2); free(ob);
    }
    return 0;
}
