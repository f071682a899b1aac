/* avx2_backward.c — the attention-backward kernels (backward_kernels.h)
 * for AVX2 + FMA: P and dS of a tile 8 keys per vector, masks as compare
 * results, and the transposed products on the 6x16 tile of avx2_micro.h. */
#include <math.h>

#include "kernels/backward_kernels.h"
#include "kernels/kernels.h"
#include "kernels/avx2_micro.h"

static void scores_rows_avx2(float *s, size_t lds, const float *a, size_t lda, const float *b, int K,
                             int rows, int np) {
    for (int p = 0; p < np; p++)
        for (int r = 0; r < rows; r += 6)
            mha_sgemm_avx2_6x16_body(s + (size_t)r * lds + 16 * p, lds, a + (size_t)r * lda, lda, 1,
                                     b + (size_t)p * K * 16, 16, NULL, NULL, K, 6, 16);
}

static void probs_ds_avx2(float *s, float *dp, size_t lds, const float *lse, const float *m, const float *dd,
                          float scale, const int *lo, const int *hi, int extra, int rows, int cols) {
    const __m256i iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256 vscale = _mm256_set1_ps(scale);
    const int nv = (cols + 15) / 16 * 2; /* the rounded-up width, 8 per vector */
    for (int i = 0; i < rows; i++) {
        float *sr = s + (size_t)i * lds, *dr = dp + (size_t)i * lds;
        const __m256 vl = _mm256_set1_ps(lse[i]), vm = _mm256_set1_ps(m[i]), vd = _mm256_set1_ps(dd[i]);
        /* allowed: j < cols, and lo <= j <= hi or j >= extra (as lo-1 < j < hi+1) */
        const __m256i vcols = _mm256_set1_epi32(cols);
        const __m256i vlo = _mm256_set1_epi32(lo ? lo[i] - 1 : -1), vhi = _mm256_set1_epi32(lo ? hi[i] + 1 : cols);
        const __m256i vex = _mm256_set1_epi32(lo ? extra - 1 : cols);
        for (int v = 0; v < nv; v++) {
            const __m256i j = _mm256_add_epi32(iota, _mm256_set1_epi32(8 * v));
            const __m256i band = _mm256_and_si256(_mm256_cmpgt_epi32(j, vlo), _mm256_cmpgt_epi32(vhi, j));
            const __m256i in = _mm256_and_si256(_mm256_cmpgt_epi32(vcols, j), _mm256_or_si256(band, _mm256_cmpgt_epi32(j, vex)));
            const __m256 keep = _mm256_castsi256_ps(in);
            const __m256 p = _mm256_and_ps(keep, mha_exp_avx2(_mm256_sub_ps(_mm256_sub_ps(_mm256_loadu_ps(sr + 8 * v), vm), vl)));
            const __m256 ds = _mm256_mul_ps(_mm256_mul_ps(vscale, p), _mm256_sub_ps(_mm256_loadu_ps(dr + 8 * v), vd));
            _mm256_storeu_ps(sr + 8 * v, p);
            _mm256_storeu_ps(dr + 8 * v, _mm256_and_ps(keep, ds));
        }
    }
}

/* c (rows, d16) += a^T b on 6x16 tiles: row i of a tile reads a + i + k*lda. */
static void accumulate_tn_avx2(float *c, size_t ldc, const float *a, size_t lda, const float *b,
                               size_t ldb, int rows, int K, int d16) {
    static const float ones[6] = {1, 1, 1, 1, 1, 1};
    for (int r = 0; r < rows; r += 6)
        for (int e = 0; e < d16; e += 16)
            mha_sgemm_avx2_6x16_body(c + (size_t)r * ldc + e, ldc, a + r, 1, lda, b + e, ldb, NULL, ones, K, 6, 16);
}

static void gemm_tile_avx2(float *c, size_t ldc, const float *a, const float *b, int K, int m, int n,
                           int accumulate) {
    static const float ones[6] = {1, 1, 1, 1, 1, 1};
    mha_sgemm_avx2_6x16_body(c, ldc, a, 1, 6, b, 16, NULL, accumulate ? ones : NULL, K, m, n);
}

const mha_backward_kernels mha_backward_kernels_avx2 = {"avx2", scores_rows_avx2, probs_ds_avx2, accumulate_tn_avx2, 6, 16,
                                                        gemm_tile_avx2, mha_bwd_pack_panels_avx2, mha_pack_a6_avx2};
