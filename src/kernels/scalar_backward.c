/* scalar_backward.c — the portable attention-backward kernels
 * (backward_kernels.h): plain C loops, the fallback on every CPU. */
#include <math.h>

#include "kernels/backward_kernels.h"

static void scores_rows_scalar(float *s, size_t lds, const float *a, size_t lda, const float *b, int K,
                               int rows, int np) {
    for (int i = 0; i < rows; i++)
        for (int j = 0; j < 16 * np; j++) {
            const float *bp = b + (size_t)(j / 16) * K * 16 + j % 16;
            float acc = 0.0f;
            for (int k = 0; k < K; k++) acc = fmaf(a[(size_t)i * lda + k], bp[(size_t)k * 16], acc);
            s[(size_t)i * lds + j] = acc;
        }
}

static void probs_ds_scalar(float *s, float *dp, size_t lds, const float *lse, const float *m, const float *dd,
                            float scale, const int *lo, const int *hi, int extra, int rows, int cols) {
    const int width = (cols + 15) / 16 * 16;
    for (int i = 0; i < rows; i++) {
        float *sr = s + (size_t)i * lds, *dr = dp + (size_t)i * lds;
        for (int j = 0; j < width; j++) {
            const int allowed = j < cols && (!lo || (j >= lo[i] && j <= hi[i]) || j >= extra);
            const float p = allowed ? expf((sr[j] - m[i]) - lse[i]) : 0.0f;
            dr[j] = allowed ? scale * p * (dr[j] - dd[i]) : 0.0f;
            sr[j] = p;
        }
    }
}

static void accumulate_tn_scalar(float *c, size_t ldc, const float *a, size_t lda, const float *b,
                                 size_t ldb, int rows, int K, int d16) {
    for (int i = 0; i < rows; i++)
        for (int e = 0; e < d16; e++) {
            float acc = 0.0f;
            for (int k = 0; k < K; k++) acc = fmaf(a[(size_t)k * lda + i], b[(size_t)k * ldb + e], acc);
            c[(size_t)i * ldc + e] += acc;
        }
}

static void gemm_tile_scalar(float *c, size_t ldc, const float *a, const float *b, int K, int m, int n,
                             int accumulate) {
    for (int i = 0; i < m; i++)
        for (int e = 0; e < n; e++) {
            const float *ap = a + (size_t)(i / 6) * K * 6 + i % 6, *bp = b + (size_t)(e / 16) * K * 16 + e % 16;
            float acc = 0.0f;
            for (int k = 0; k < K; k++) acc = fmaf(ap[(size_t)k * 6], bp[(size_t)k * 16], acc);
            c[(size_t)i * ldc + e] = accumulate ? c[(size_t)i * ldc + e] + acc : acc;
        }
}

void mha_bwd_pack_panels_scalar(float *dst, const float *src, size_t ld, int n, int d) {
    for (int p = 0; p < n; p += 16) {
        float *panel = dst + (size_t)p * d;
        for (int i = 0; i < 16; i++)
            for (int e = 0; e < d; e++) panel[(size_t)e * 16 + i] = p + i < n ? src[(size_t)(p + i) * ld + e] : 0.0f;
    }
}

const mha_backward_kernels mha_backward_kernels_scalar = {"scalar", scores_rows_scalar, probs_ds_scalar, accumulate_tn_scalar, 6, 16,
                                                          gemm_tile_scalar, mha_bwd_pack_panels_scalar, NULL};
