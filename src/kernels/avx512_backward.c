/* avx512_backward.c — the attention-backward kernels (backward_kernels.h)
 * for AVX-512: P and dS of a tile 16 keys per vector with opmask
 * registers for the masks, and the transposed products on the 12x32
 * register tile of avx512_micro.h. */
#include <math.h>

#include "kernels/backward_kernels.h"
#include "kernels/avx512_micro.h"

/* 12 rows x 32 keys per register tile (a 6-row tile for a last 6 rows,
 * one panel for an odd last 16 keys). */
static void scores_rows_avx512(float *s, size_t lds, const float *a, size_t lda, const float *b, int K,
                               int rows, int np) {
    const size_t b_ps = (size_t)16 * K, a_ps = (size_t)6 * lda;
    for (int p = 0; p < np; p += 2) {
        const float *bp = b + (size_t)p * b_ps;
        float *sp = s + (size_t)16 * p;
        int r = 0;
        if (p + 2 <= np) {
            for (; r + 12 <= rows; r += 12)
                mha_tile_avx512(sp + (size_t)r * lds, lds, a + (size_t)r * lda, a_ps, lda, 1, bp, b_ps, 16, NULL,
                                NULL, K, 12, 32, 12, 2);
            if (r < rows)
                mha_tile_avx512(sp + (size_t)r * lds, lds, a + (size_t)r * lda, a_ps, lda, 1, bp, b_ps, 16, NULL,
                                NULL, K, 6, 32, 6, 2);
        } else {
            for (; r + 12 <= rows; r += 12)
                mha_tile_avx512(sp + (size_t)r * lds, lds, a + (size_t)r * lda, a_ps, lda, 1, bp, b_ps, 16, NULL,
                                NULL, K, 12, 16, 12, 1);
            if (r < rows)
                mha_tile_avx512(sp + (size_t)r * lds, lds, a + (size_t)r * lda, a_ps, lda, 1, bp, b_ps, 16, NULL,
                                NULL, K, 6, 16, 6, 1);
        }
    }
}

static void probs_ds_avx512(float *s, float *dp, size_t lds, const float *lse, const float *dd,
                            float scale, const int *lo, const int *hi, int extra, int rows, int cols) {
    const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512 vscale = _mm512_set1_ps(scale);
    const int nv = (cols + 15) / 16;
    for (int i = 0; i < rows; i++) {
        float *sr = s + (size_t)i * lds, *dr = dp + (size_t)i * lds;
        const __m512 vl = _mm512_set1_ps(lse[i]), vd = _mm512_set1_ps(dd[i]);
        for (int v = 0; v < nv; v++) {
            __mmask16 in = mha_mask16(cols - 16 * v);
            if (lo) {
                const __m512i j = _mm512_add_epi32(iota, _mm512_set1_epi32(16 * v));
                const __mmask16 band = _mm512_cmpge_epi32_mask(j, _mm512_set1_epi32(lo[i])) &
                                       _mm512_cmple_epi32_mask(j, _mm512_set1_epi32(hi[i]));
                in &= band | _mm512_cmpge_epi32_mask(j, _mm512_set1_epi32(extra));
            }
            const __m512 p = _mm512_maskz_mov_ps(in, mha_exp_avx512(_mm512_sub_ps(_mm512_loadu_ps(sr + 16 * v), vl)));
            const __m512 ds = _mm512_mul_ps(_mm512_mul_ps(vscale, p), _mm512_sub_ps(_mm512_loadu_ps(dr + 16 * v), vd));
            _mm512_storeu_ps(sr + 16 * v, p);
            _mm512_storeu_ps(dr + 16 * v, _mm512_maskz_mov_ps(in, ds));
        }
    }
}

/* c (rows, d16) += a^T b: 12-row tiles (a 6-row one last) of 32 columns
 * (16 for an odd last 16); row i of the tile reads a + i + k*lda. */
static void accumulate_tn_avx512(float *c, size_t ldc, const float *a, size_t lda, const float *b,
                                 size_t ldb, int rows, int K, int d16) {
    static const float ones[12] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
    for (int r = 0; r < rows; r += 12) {
        float *cr = c + (size_t)r * ldc;
        int e = 0;
        if (r + 12 <= rows) {
            for (; e + 32 <= d16; e += 32)
                mha_tile_avx512(cr + e, ldc, a + r, 6, 1, lda, b + e, 16, ldb, NULL, ones, K, 12, 32, 12, 2);
            if (e < d16) mha_tile_avx512(cr + e, ldc, a + r, 6, 1, lda, b + e, 16, ldb, NULL, ones, K, 12, 16, 12, 1);
        } else {
            for (; e + 32 <= d16; e += 32)
                mha_tile_avx512(cr + e, ldc, a + r, 6, 1, lda, b + e, 16, ldb, NULL, ones, K, 6, 32, 6, 2);
            if (e < d16) mha_tile_avx512(cr + e, ldc, a + r, 6, 1, lda, b + e, 16, ldb, NULL, ones, K, 6, 16, 6, 1);
        }
    }
}

/* 12 x 32 (24 zmm accumulators: enough independent FMA chains for both
 * ports), 6-row and 16-column variants for the edges, so that no panel
 * beyond the live ones is read. */
static void gemm_tile_avx512(float *c, size_t ldc, const float *a, const float *b, int K, int m, int n,
                             int accumulate) {
    static const float ones[12] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
    const float *rs = accumulate ? ones : NULL;
    const size_t a_ps = (size_t)6 * K, b_ps = (size_t)16 * K;
    if (m > 6 && n > 16) mha_tile_avx512(c, ldc, a, a_ps, 1, 6, b, b_ps, 16, NULL, rs, K, m, n, 12, 2);
    else if (m > 6) mha_tile_avx512(c, ldc, a, a_ps, 1, 6, b, b_ps, 16, NULL, rs, K, m, n, 12, 1);
    else if (n > 16) mha_tile_avx512(c, ldc, a, a_ps, 1, 6, b, b_ps, 16, NULL, rs, K, m, n, 6, 2);
    else mha_tile_avx512(c, ldc, a, a_ps, 1, 6, b, b_ps, 16, NULL, rs, K, m, n, 6, 1);
}

const mha_backward_kernels mha_backward_kernels_avx512 = {"avx512", scores_rows_avx512, probs_ds_avx512, accumulate_tn_avx512, 12, 32,
                                                          gemm_tile_avx512};
