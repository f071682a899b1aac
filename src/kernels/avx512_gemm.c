/* avx512_gemm.c — the AVX-512 GEMM tiles: the table's 6x16 contract (any
 * strides) and the 12x32 tile the packed-projection driver uses. 12x32
 * (24 zmm accumulators, 2 B vectors, 1 broadcast) was chosen by measuring
 * 6x32, 6x48, 6x64, 12x16, 12x32, 12x48 and 18x16 on the driver's block
 * (72 x 768 x 768, packed): all but 12x48 reach the FMA peak out of L2;
 * 12x32 reads the fewest B panels per FMA among those that keep two
 * 6-row micro-panels (the driver's MC = 72 is a multiple of 12). */
#include "kernels/kernels.h"
#include "kernels/avx512_micro.h"

void mha_sgemm_avx512_6x16(float *c, size_t ldc, const float *a, size_t a_rs, size_t a_cs,
                           const float *b, size_t ldb, const float *bias,
                           const float *row_scale, int K, int m, int n) {
    if (a_rs == 1 && a_cs == 6) /* packed a: constant strides */
        mha_tile_avx512(c, ldc, a, 0, 1, 6, b, 0, ldb, bias, row_scale, K, m, n, 6, 1);
    else
        mha_tile_avx512(c, ldc, a, 0, a_rs, a_cs, b, 0, ldb, bias, row_scale, K, m, n, 6, 1);
}

/* c (m, n) = a b [+ bias], m <= 12, n <= 32: a two packed micro-panels
 * (K, 6) at stride a_ps, b two packed panels (K, 16) at stride b_ps. */
void mha_sgemm_avx512_12x32(float *c, size_t ldc, const float *a, size_t a_ps, const float *b,
                            size_t b_ps, const float *bias, int K, int m, int n) {
    if (m > 6 && n > 16)
        mha_tile_avx512(c, ldc, a, a_ps, 1, 6, b, b_ps, 16, bias, NULL, K, m, n, 12, 2);
    else if (m > 6)
        mha_tile_avx512(c, ldc, a, a_ps, 1, 6, b, b_ps, 16, bias, NULL, K, m, n, 12, 1);
    else if (n > 16)
        mha_tile_avx512(c, ldc, a, a_ps, 1, 6, b, b_ps, 16, bias, NULL, K, m, n, 6, 2);
    else
        mha_tile_avx512(c, ldc, a, a_ps, 1, 6, b, b_ps, 16, bias, NULL, K, m, n, 6, 1);
}
