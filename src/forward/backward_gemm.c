/* backward_gemm.c — the backward's projection products: c (M,N) [+]= a (M,K)
 * b (K,N) where a and b are strided views, so the transposed products
 * (X^T dQ, dY W_O^T, dQ W_Q^T) read their operands in place. mha_gemm's
 * packed-B layout holds W (K,N) packed once per layer and overwrites its
 * output; the backward needs W^T, activations as B, and sums of products,
 * so this file packs both operands per block (BLIS style: a into (KC,6)
 * micro-panels, b into (KC,16) panels) and runs the backward table's
 * register tile (gemm_tile: 12x32 on AVX-512, 6x16 on AVX2) on them.
 * Deterministic: a task owns an (MC, NC) block of c and adds the KC chunks
 * of the k axis in order; the split does not depend on the thread count.
 * Legend: M, N output rows and columns, K inner width; MC, NC, KC blocks. */
#include <stdlib.h>
#include <string.h>

#include "forward/backward_fast.h"

#define GEMM_MC 288 /* rows of c per task (48 micro-rows): b, packed per
                       task, serves this many rows; 288 ran the P1 weight
                       gradients 3-10% faster than 144 on a Zen 4 (2
                       threads), as b's packing is repeated M / MC times */
#define GEMM_NC 256 /* columns of c per task (16 panels)        */
#define GEMM_KC 256 /* inner chunk: packed a and b stay in L2   */

/* a rows [m0, m0+mc) x k [k0, k0+kc) -> micro-panels (kc, 6), zero padded.
 * A copy, so every way gives the same bits; the two layouts the backward
 * passes take a contiguous path: a^T of a row-major matrix (rs 1: each
 * k's 6 values are adjacent) and a row-major matrix (cs 1: 6 rows
 * transposed, by the table's pack_a6 where it has one). */
static void pack_a(float *dst, mha_view a, int m0, int mc, int k0, int kc,
                   const mha_backward_kernels *bk) {
    for (int r = 0; r < mc; r += MHA_MR, dst += (size_t)kc * MHA_MR) {
        const int rows = mc - r < MHA_MR ? mc - r : MHA_MR;
        const float *src = a.p + (size_t)(m0 + r) * a.rs + (size_t)k0 * a.cs;
        if (a.cs == 1 && bk->pack_a6) {
            bk->pack_a6(dst, src, a.rs, rows, kc);
        } else if (a.rs == 1 && rows == MHA_MR) {
            for (int k = 0; k < kc; k++) memcpy(dst + (size_t)k * MHA_MR, src + (size_t)k * a.cs, sizeof(float) * MHA_MR);
        } else { /* any strides: the last micro-panel, and a row-major a without pack_a6 */
            for (int k = 0; k < kc; k++)
                for (int i = 0; i < MHA_MR; i++)
                    dst[(size_t)k * MHA_MR + i] = i < rows ? src[(size_t)k * a.cs + (size_t)i * a.rs] : 0.0f;
        }
    }
}

/* b k [k0, k0+kc) x columns [n0, n0+nc) -> panels (kc, 16), zero padded.
 * A copy; contiguous paths for a row-major b (cs 1: each k's 16 values
 * are adjacent) and for the transpose of one (rs 1: the table's
 * pack_panels, 16 columns of b are 16 rows of the source). */
static void pack_b(float *dst, mha_view b, int k0, int kc, int n0, int nc,
                   const mha_backward_kernels *bk) {
    if (b.rs == 1) {
        bk->pack_panels(dst, b.p + (size_t)n0 * b.cs + k0, b.cs, nc, kc);
        return;
    }
    for (int p = 0; p < nc; p += MHA_NR, dst += (size_t)kc * MHA_NR) {
        const int n = nc - p < MHA_NR ? nc - p : MHA_NR;
        for (int k = 0; k < kc; k++) {
            const float *src = b.p + (size_t)(k0 + k) * b.rs + (size_t)(n0 + p) * b.cs;
            float *out = dst + (size_t)k * MHA_NR;
            if (b.cs == 1 && n == MHA_NR) /* a constant size: vector moves, not rep movs */
                memcpy(out, src, sizeof(float) * MHA_NR);
            else
                for (int j = 0; j < n; j++) out[j] = src[(size_t)j * b.cs];
            for (int j = n; j < MHA_NR; j++) out[j] = 0.0f;
        }
    }
}

mha_status mha_gemm_strided(float *c, size_t ldc, mha_view a, mha_view b, int M, int N, int K,
                            int accumulate, const mha_backward_kernels *bk, int n_threads) {
    if (M <= 0 || N <= 0) return MHA_OK;
    const int nmb = (M + GEMM_MC - 1) / GEMM_MC, nnb = (N + GEMM_NC - 1) / GEMM_NC;
    const long ntasks = (long)nmb * nnb;
    int failed = 0;
    if (K <= 0) { /* an empty sum: c = 0 (or unchanged) */
        for (int i = 0; !accumulate && i < M; i++) memset(c + (size_t)i * ldc, 0, sizeof(float) * N);
        return MHA_OK;
    }
    /* packed blocks sized to the product (small layers: small blocks, no
     * mmap per call), and no more threads than tasks */
    const int tr = bk->tile_rows, tc = bk->tile_cols;
    const int mc_max = M < GEMM_MC ? (M + MHA_MR - 1) / MHA_MR * MHA_MR : GEMM_MC;
    const int nc_max = N < GEMM_NC ? (N + MHA_NR - 1) / MHA_NR * MHA_NR : GEMM_NC;
    const size_t kc_max = K < GEMM_KC ? (size_t)K : GEMM_KC;
#pragma omp parallel num_threads(ntasks < n_threads ? (int)ntasks : n_threads)
    {
        float *pa = aligned_alloc(64, (sizeof(float) * mc_max * kc_max + 63) / 64 * 64);
        float *pb = aligned_alloc(64, (sizeof(float) * nc_max * kc_max + 63) / 64 * 64);
        if (!pa || !pb) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(dynamic, 1)
        for (long t = 0; t < ntasks; t++) {
            if (!pa || !pb) continue;
            const int m0 = (int)(t / nnb) * GEMM_MC, n0 = (int)(t % nnb) * GEMM_NC;
            const int mc = M - m0 < GEMM_MC ? M - m0 : GEMM_MC, nc = N - n0 < GEMM_NC ? N - n0 : GEMM_NC;
            for (int k0 = 0; k0 < K; k0 += GEMM_KC) {
                const int kc = K - k0 < GEMM_KC ? K - k0 : GEMM_KC;
                pack_a(pa, a, m0, mc, k0, kc, bk);
                pack_b(pb, b, k0, kc, n0, nc, bk);
                for (int i = 0; i < mc; i += tr)
                    for (int j = 0; j < nc; j += tc)
                        bk->gemm_tile(c + (size_t)(m0 + i) * ldc + n0 + j, ldc, pa + (size_t)i * kc,
                                      pb + (size_t)j * kc, kc, mc - i < tr ? mc - i : tr, nc - j < tc ? nc - j : tc,
                                      accumulate || k0 > 0);
            }
        }
        free(pa);
        free(pb);
    }
    if (failed) return mha_fail(MHA_E_NOMEM, "fast backward: cannot allocate the GEMM's packed blocks");
    return MHA_OK;
}

/* Bias gradients sum thousands of rows: the sums run in double, in blocks
 * of columns, so that their rounding does not add to the error the rows
 * already carry (a float sum doubled db_q's error on the scalar kernels). */
void mha_column_sums(float *out, const float *a, size_t lda, size_t rows, int n, int accumulate) {
    enum { COLS = 256 };
    double acc[COLS];
    for (int j0 = 0; j0 < n; j0 += COLS) {
        const int w = n - j0 < COLS ? n - j0 : COLS;
        for (int j = 0; j < w; j++) acc[j] = accumulate ? (double)out[j0 + j] : 0.0;
        for (size_t t = 0; t < rows; t++)
            for (int j = 0; j < w; j++) acc[j] += (double)a[t * lda + (size_t)(j0 + j)];
        for (int j = 0; j < w; j++) out[j0 + j] = (float)acc[j];
    }
}
