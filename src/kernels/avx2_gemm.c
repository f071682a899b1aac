/* avx2_gemm.c — the 6x16 single-precision GEMM micro-kernel (AVX2 + FMA).
 * The body lives in avx2_micro.h so the attention kernels inline it too. */
#include "kernels/kernels.h"
#include "kernels/avx2_micro.h"

void mha_sgemm_avx2_6x16(float *c, size_t ldc, const float *a, size_t a_rs, size_t a_cs,
                         const float *b, size_t ldb, const float *bias,
                         const float *row_scale, int K, int m, int n) {
    /* The GEMM driver always passes packed a (a_rs = 1, a_cs = 6): give the
     * compiler that case with constant strides. */
    if (a_rs == 1 && a_cs == 6)
        mha_sgemm_avx2_6x16_body(c, ldc, a, 1, 6, b, ldb, bias, row_scale, K, m, n);
    else
        mha_sgemm_avx2_6x16_body(c, ldc, a, a_rs, a_cs, b, ldb, bias, row_scale, K, m, n);
}
