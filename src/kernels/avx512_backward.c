/* avx512_backward.c — the attention-backward kernels (backward_kernels.h)
 * for AVX-512: P and dS of a tile 16 keys per vector with opmask
 * registers for the masks, and the transposed products on the 12x32
 * register tile of avx512_micro.h. */
#include <math.h>

#include "kernels/backward_kernels.h"
#include "kernels/kernels.h"
#include "kernels/avx512_micro.h"

/* c (rows, 16P) [+]= a b: 12-row tiles, then a 6-row tile for a last 6
 * rows; row i of a at a + (i/6)*a_ps + (i%6)*a_rs, k at stride a_cs; P is
 * a constant at each call site. */
MHA_AVX512_INLINE void row_pass(float *c, size_t ldc, const float *a, size_t a_ps, size_t a_rs, size_t a_cs,
                                const float *b, size_t b_ps, size_t ldb, const float *acc, int K, int rows,
                                int P) {
    int r = 0;
    for (; r + 12 <= rows; r += 12)
        mha_tile_avx512(c + (size_t)r * ldc, ldc, a + (size_t)(r / 6) * a_ps, a_ps, a_rs, a_cs, b, b_ps, ldb,
                        NULL, acc, K, 12, 16 * P, 12, P, 0);
    if (r < rows)
        mha_tile_avx512(c + (size_t)r * ldc, ldc, a + (size_t)(r / 6) * a_ps, a_ps, a_rs, a_cs, b, b_ps, ldb,
                        NULL, acc, K, 6, 16 * P, 6, P, 0);
}

static const float ones[12] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};

/* 32 keys (two panels) per register tile, 16 for an odd last panel. */
static void scores_rows_avx512(float *s, size_t lds, const float *a, size_t lda, const float *b, int K,
                               int rows, int np) {
    const size_t b_ps = (size_t)16 * K, a_ps = (size_t)6 * lda;
    int p = 0;
    for (; p + 2 <= np; p += 2) row_pass(s + 16 * p, lds, a, a_ps, lda, 1, b + p * b_ps, b_ps, 16, NULL, K, rows, 2);
    if (p < np) row_pass(s + 16 * p, lds, a, a_ps, lda, 1, b + p * b_ps, b_ps, 16, NULL, K, rows, 1);
}

static void probs_ds_avx512(float *s, float *dp, size_t lds, const float *lse, const float *m, const float *dd,
                            float scale, const int *lo, const int *hi, int extra, int rows, int cols) {
    const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512 vscale = _mm512_set1_ps(scale);
    const int nv = (cols + 15) / 16;
    for (int i = 0; i < rows; i++) {
        float *sr = s + (size_t)i * lds, *dr = dp + (size_t)i * lds;
        const __m512 vl = _mm512_set1_ps(lse[i]), vm = _mm512_set1_ps(m[i]), vd = _mm512_set1_ps(dd[i]);
        for (int v = 0; v < nv; v++) {
            __mmask16 in = mha_mask16(cols - 16 * v);
            if (lo) {
                const __m512i j = _mm512_add_epi32(iota, _mm512_set1_epi32(16 * v));
                const __mmask16 band = _mm512_cmpge_epi32_mask(j, _mm512_set1_epi32(lo[i])) &
                                       _mm512_cmple_epi32_mask(j, _mm512_set1_epi32(hi[i]));
                in &= band | _mm512_cmpge_epi32_mask(j, _mm512_set1_epi32(extra));
            }
            const __m512 p = _mm512_maskz_mov_ps(in, mha_exp_avx512(_mm512_sub_ps(_mm512_sub_ps(_mm512_loadu_ps(sr + 16 * v), vm), vl)));
            const __m512 ds = _mm512_mul_ps(_mm512_mul_ps(vscale, p), _mm512_sub_ps(_mm512_loadu_ps(dr + 16 * v), vd));
            _mm512_storeu_ps(sr + 16 * v, p);
            _mm512_storeu_ps(dr + 16 * v, _mm512_maskz_mov_ps(in, ds));
        }
    }
}

/* c (rows, d16) += a^T b: row i of the tile reads a + i + k*lda; 32
 * columns per tile, 16 for an odd last 16. */
static void accumulate_tn_avx512(float *c, size_t ldc, const float *a, size_t lda, const float *b,
                                 size_t ldb, int rows, int K, int d16) {
    int e = 0;
    for (; e + 32 <= d16; e += 32) row_pass(c + e, ldc, a, 6, 1, lda, b + e, 16, ldb, ones, K, rows, 2);
    if (e < d16) row_pass(c + e, ldc, a, 6, 1, lda, b + e, 16, ldb, ones, K, rows, 1);
}

/* 12 x 32 (24 zmm accumulators: enough independent FMA chains for both
 * ports), 6-row and 16-column variants for the edges, so that no panel
 * beyond the live ones is read. */
static void gemm_tile_avx512(float *c, size_t ldc, const float *a, const float *b, int K, int m, int n,
                             int accumulate) {
    const float *rs = accumulate ? ones : NULL;
    const size_t a_ps = (size_t)6 * K, b_ps = (size_t)16 * K;
    if (m > 6 && n > 16) mha_tile_avx512(c, ldc, a, a_ps, 1, 6, b, b_ps, 16, NULL, rs, K, m, n, 12, 2, 0);
    else if (m > 6) mha_tile_avx512(c, ldc, a, a_ps, 1, 6, b, b_ps, 16, NULL, rs, K, m, n, 12, 1, 0);
    else if (n > 16) mha_tile_avx512(c, ldc, a, a_ps, 1, 6, b, b_ps, 16, NULL, rs, K, m, n, 6, 2, 0);
    else mha_tile_avx512(c, ldc, a, a_ps, 1, 6, b, b_ps, 16, NULL, rs, K, m, n, 6, 1, 0);
}

/* 16 rows x 16 columns per step: rows loaded (zero past n, columns
 * masked past d), transposed in registers (32-bit, then 64-bit
 * interleaves within 128-bit lanes, then two lane shuffles), each column
 * stored as one panel row. */
static void pack_panels_avx512(float *dst, const float *src, size_t ld, int n, int d) {
    for (int p = 0; p < n; p += 16) {
        float *panel = dst + (size_t)p * d;
        const int rows = n - p < 16 ? n - p : 16;
        for (int e0 = 0; e0 < d; e0 += 16) {
            const __mmask16 live = mha_mask16(d - e0);
            __m512 r[16], t[16];
            for (int i = 0; i < 16; i++)
                r[i] = i < rows ? _mm512_maskz_loadu_ps(live, src + (size_t)(p + i) * ld + e0) : _mm512_setzero_ps();
            for (int i = 0; i < 16; i += 2) /* (i, i+1) rows' columns 4L+c, c = 0,1 and 2,3 */
                t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]), t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
            for (int i = 0; i < 16; i += 4) /* r[i + c]: rows i..i+3 of column 4L+c in lane L */
                for (int c = 0; c < 4; c++)
                    r[i + c] = _mm512_castpd_ps(
                        c % 2 ? _mm512_unpackhi_pd(_mm512_castps_pd(t[i + c / 2]), _mm512_castps_pd(t[i + 2 + c / 2]))
                              : _mm512_unpacklo_pd(_mm512_castps_pd(t[i + c / 2]), _mm512_castps_pd(t[i + 2 + c / 2])));
            const int cols = d - e0 < 16 ? d - e0 : 16;
            for (int c = 0; c < 4; c++) {
                const __m512 w0 = _mm512_shuffle_f32x4(r[c], r[4 + c], 0x44), w1 = _mm512_shuffle_f32x4(r[c], r[4 + c], 0xEE);
                const __m512 w2 = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0x44);
                const __m512 w3 = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0xEE);
                const __m512 col[4] = {_mm512_shuffle_f32x4(w0, w2, 0x88), _mm512_shuffle_f32x4(w0, w2, 0xDD),
                                       _mm512_shuffle_f32x4(w1, w3, 0x88), _mm512_shuffle_f32x4(w1, w3, 0xDD)};
                for (int L = 0; L < 4; L++)
                    if (4 * L + c < cols) _mm512_storeu_ps(panel + (size_t)(e0 + 4 * L + c) * 16, col[L]);
            }
        }
    }
}

const mha_backward_kernels mha_backward_kernels_avx512 = {"avx512", scores_rows_avx512, probs_ds_avx512, accumulate_tn_avx512, 12, 32,
                                                          gemm_tile_avx512, pack_panels_avx512,
                                                          mha_pack_a6_avx512};
