/* avx512_gemm.c — the AVX-512 GEMM tiles: the table's 6x16 contract (any
 * strides), the 12x32 tile the packed-projection driver uses, its
 * packing of input rows into 6-row micro-panels and its transposed store
 * (K^T destinations). 12x32
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
        mha_tile_avx512(c, ldc, a, 0, 1, 6, b, 0, ldb, bias, row_scale, K, m, n, 6, 1, 0);
    else
        mha_tile_avx512(c, ldc, a, 0, a_rs, a_cs, b, 0, ldb, bias, row_scale, K, m, n, 6, 1, 0);
}

/* c (m, n) = [c +] a b [+ bias], m <= 12, n <= 32: a two packed
 * micro-panels (K, 6) at stride a_ps, b two panels of 16 columns at
 * stride b_ps, row k at k*ldb; accumulate: each sum continues from c (a K block after
 * the first). b_next: the B block the driver reads next, prefetched by a
 * whole 12x32 tile (edge tiles, which the driver does not ask, ignore it). */
#define TILE_12X32(ACC)                                                                  \
    do {                                                                                 \
        if (m > 6 && n > 16 && b_next)                                                   \
            mha_tile_avx512_pf(c, ldc, a, a_ps, 1, 6, b, b_ps, ldb, bias, NULL, K, m, n, 12, 2, ACC, b_next); \
        else if (m > 6 && n > 16)                                                        \
            mha_tile_avx512(c, ldc, a, a_ps, 1, 6, b, b_ps, ldb, bias, NULL, K, m, n, 12, 2, ACC); \
        else if (m > 6)                                                                  \
            mha_tile_avx512(c, ldc, a, a_ps, 1, 6, b, b_ps, ldb, bias, NULL, K, m, n, 12, 1, ACC); \
        else if (n > 16)                                                                 \
            mha_tile_avx512(c, ldc, a, a_ps, 1, 6, b, b_ps, ldb, bias, NULL, K, m, n, 6, 2, ACC);  \
        else                                                                             \
            mha_tile_avx512(c, ldc, a, a_ps, 1, 6, b, b_ps, ldb, bias, NULL, K, m, n, 6, 1, ACC);  \
    } while (0)

void mha_sgemm_avx512_12x32(float *c, size_t ldc, const float *a, size_t a_ps, const float *b,
                            size_t b_ps, size_t ldb, const float *bias, int K, int m, int n,
                            int accumulate, const float *b_next) {
    if (accumulate)
        TILE_12X32(1);
    else
        TILE_12X32(0);
}

/* rows (<= 6) rows of a (row stride lda) -> out (kn, 6), rows past `rows`
 * zero. 16 k per step: the rows are interleaved in pairs (r0 r1 | r2 r3 |
 * r4 r5, two permutes each), then each 16-float output vector takes its
 * pairs from two of them and the third (two permutes): 18 permutes and 6
 * stores per 96 floats, where a scalar transpose does 96 of each. */
void mha_pack_a6_avx512(float *out, const float *a, size_t lda, int rows, int kn) {
    int lo[16], hi[16], first[3][16], third[3][16];
    __mmask16 from_third[3] = {0, 0, 0};
    for (int l = 0; l < 16; l++) {
        lo[l] = (l & 1) * 16 + l / 2;     /* pairs k = 0..7 of (x, y) */
        hi[l] = (l & 1) * 16 + 8 + l / 2; /* pairs k = 8..15          */
    }
    for (int j = 0; j < 3; j++)
        for (int l = 0; l < 16; l++) {
            const int q = 16 * j + l, k = q / 6, s = q % 6 / 2, e = q % 2; /* out[q] = row 2s+e, k */
            first[j][l] = (s == 1 ? 16 : 0) + 2 * k + e;
            third[j][l] = 2 * k + e;
            if (s == 2) from_third[j] |= (__mmask16)(1u << l);
        }
    const __m512i vlo = _mm512_loadu_si512(lo), vhi = _mm512_loadu_si512(hi);
    __m512i vfirst[3], vthird[3];
    for (int j = 0; j < 3; j++)
        vfirst[j] = _mm512_loadu_si512(first[j]), vthird[j] = _mm512_loadu_si512(third[j]);
    for (int k = 0; k < kn; k += 16) {
        const int live = kn - k < 16 ? kn - k : 16;
        const __mmask16 mk = mha_mask16(live);
        __m512 r[6], pair[2][3];
        for (int i = 0; i < 6; i++)
            r[i] = i < rows ? _mm512_maskz_loadu_ps(mk, a + (size_t)i * lda + k) : _mm512_setzero_ps();
        for (int s = 0; s < 3; s++) {
            pair[0][s] = _mm512_permutex2var_ps(r[2 * s], vlo, r[2 * s + 1]);
            pair[1][s] = _mm512_permutex2var_ps(r[2 * s], vhi, r[2 * s + 1]);
        }
        float *o = out + (size_t)k * 6;
        for (int h = 0; h < 2; h++) /* k .. k+7, then k+8 .. k+15 */
            for (int j = 0; j < 3; j++) {
                __m512 v = _mm512_permutex2var_ps(pair[h][0], vfirst[j], pair[h][1]);
                v = _mm512_mask_permutexvar_ps(v, from_third[j], vthird[j], pair[h][2]);
                const int at = 48 * h + 16 * j; /* floats of this step before v */
                if (live == 16)
                    _mm512_storeu_ps(o + at, v);
                else
                    _mm512_mask_storeu_ps(o + at, mha_mask16(6 * live - at), v);
            }
    }
}

/* dst[coff[j] + i] = src[i * lds + j], i < rows <= 16, j < n <= 16: a 16x16
 * transpose in registers (pairs of rows, then quads, then 128-bit lanes
 * twice: 64 shuffles) and one masked store per column. */
void mha_store_t16_avx512(float *dst, const size_t *coff, const float *src, size_t lds, int rows,
                          int n) {
    const __mmask16 cols = mha_mask16(n), live = mha_mask16(rows);
    __m512 r[16], t[16], u[16];
    for (int i = 0; i < 16; i++)
        r[i] = i < rows ? _mm512_maskz_loadu_ps(cols, src + (size_t)i * lds) : _mm512_setzero_ps();
    for (int i = 0; i < 8; i++) { /* t[2i], t[2i+1]: rows 2i, 2i+1 interleaved */
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 4; i++) { /* u[4i+q], 128-bit lane L: column q+4L of rows 4i..4i+3 */
        const __m512d a = _mm512_castps_pd(t[4 * i]), b = _mm512_castps_pd(t[4 * i + 1]);
        const __m512d c = _mm512_castps_pd(t[4 * i + 2]), d = _mm512_castps_pd(t[4 * i + 3]);
        u[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
        u[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
        u[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
        u[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
    }
    for (int q = 0; q < 4; q++) { /* columns q, q+4, q+8, q+12 */
        const __m512 v1 = _mm512_shuffle_f32x4(u[q], u[4 + q], 0x88), v2 = _mm512_shuffle_f32x4(u[q], u[4 + q], 0xdd);
        const __m512 w1 = _mm512_shuffle_f32x4(u[8 + q], u[12 + q], 0x88), w2 = _mm512_shuffle_f32x4(u[8 + q], u[12 + q], 0xdd);
        const __m512 col[4] = {_mm512_shuffle_f32x4(v1, w1, 0x88), _mm512_shuffle_f32x4(v2, w2, 0x88),
                               _mm512_shuffle_f32x4(v1, w1, 0xdd), _mm512_shuffle_f32x4(v2, w2, 0xdd)};
        for (int e = 0; e < 4; e++)
            if (q + 4 * e < n) _mm512_mask_storeu_ps(dst + coff[q + 4 * e], live, col[e]);
    }
}
