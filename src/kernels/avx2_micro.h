/* avx2_micro.h — the 6x16 FMA register tile, the vector exp, the
 * horizontal max/sum and the tail mask, inlined into the avx2*.c kernel
 * files (the only ones built with -mavx2 -mfma), which alone include it. */
#ifndef MHA_AVX2_MICRO_H
#define MHA_AVX2_MICRO_H

#include <immintrin.h>
#include <stddef.h>

/* exp(x) for 8 floats, within 2 ulp on [ln(FLT_MIN), 88.3]: x = n ln2 + r
 * with |r| <= ln2/2 (Cody-Waite split of ln2, so r is nearly exact), e^r by
 * a degree-6 polynomial fitted for least relative error on that interval
 * (2e-9, a sixtieth of an ulp), then scaled by 2^n through the exponent
 * bits. n comes from one FMA: adding 1.5*2^23 + 127 rounds x log2e to an
 * integer and leaves n + 127 in the low mantissa bits, which a shift moves
 * into the exponent field (no round/convert). x is clamped to [-88, 88.38]:
 * at -88, n = -127 makes the scale +0, so e^x = 0 for x < -87.68 and
 * exp(-inf) = 0 (softmax needs e^x for x <= 0 only); between -87.68 and
 * ln(FLT_MIN) the result is subnormal. */
static inline __m256 mha_exp_avx2(__m256 x) {
    const __m256 shift = _mm256_set1_ps(12583039.0f); /* 0x1.8p23 + 127 */
    x = _mm256_max_ps(x, _mm256_set1_ps(-88.0f));
    x = _mm256_min_ps(x, _mm256_set1_ps(88.37626266f));
    __m256 t = _mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), shift);
    __m256 n = _mm256_sub_ps(t, shift);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(0x1.6ae6e0p-10f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0x1.1267d8p-7f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0x1.555824p-5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0x1.555418p-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0x1.fffffcp-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    __m256i e = _mm256_slli_epi32(_mm256_castps_si256(t), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

/* Lanes j < live of 8 set: the mask of maskload / maskstore, which neither
 * read nor write the other lanes (a tail of live < 8 elements). */
static inline __m256i mha_lanes_below_avx2(int live) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(live), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* max and sum of the 8 lanes of v: halves, then pairs, then the last two. */
static inline float mha_hmax8_avx2(__m256 v) {
    __m128 x = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_max_ps(x, _mm_movehl_ps(x, x));
    x = _mm_max_ss(x, _mm_shuffle_ps(x, x, 1));
    return _mm_cvtss_f32(x);
}

static inline float mha_hsum8_avx2(__m256 v) {
    __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    x = _mm_add_ss(x, _mm_shuffle_ps(x, x, 1));
    return _mm_cvtss_f32(x);
}

/* c (m,n) = [row_scale * c +] a (6,K) b (K,16) [+ bias]; see kernels.h.
 * Inlined so that constant strides (packed a: a_rs = 1, a_cs = 6) fold. */
static inline __attribute__((always_inline)) void mha_sgemm_avx2_6x16_body(float *c, size_t ldc, const float *a, size_t a_rs,
                                            size_t a_cs, const float *b, size_t ldb,
                                            const float *bias, const float *row_scale, int K,
                                            int m, int n) {
    __m256 c00 = _mm256_setzero_ps(), c01 = _mm256_setzero_ps();
    __m256 c10 = _mm256_setzero_ps(), c11 = _mm256_setzero_ps();
    __m256 c20 = _mm256_setzero_ps(), c21 = _mm256_setzero_ps();
    __m256 c30 = _mm256_setzero_ps(), c31 = _mm256_setzero_ps();
    __m256 c40 = _mm256_setzero_ps(), c41 = _mm256_setzero_ps();
    __m256 c50 = _mm256_setzero_ps(), c51 = _mm256_setzero_ps();
    const float *a0 = a, *a3 = a + 3 * a_rs;
#pragma GCC unroll 4
    for (int k = 0; k < K; k++) {
        __m256 b0 = _mm256_loadu_ps(b), b1 = _mm256_loadu_ps(b + 8), x;
        x = _mm256_broadcast_ss(a0);
        c00 = _mm256_fmadd_ps(x, b0, c00); c01 = _mm256_fmadd_ps(x, b1, c01);
        x = _mm256_broadcast_ss(a0 + a_rs);
        c10 = _mm256_fmadd_ps(x, b0, c10); c11 = _mm256_fmadd_ps(x, b1, c11);
        x = _mm256_broadcast_ss(a0 + 2 * a_rs);
        c20 = _mm256_fmadd_ps(x, b0, c20); c21 = _mm256_fmadd_ps(x, b1, c21);
        x = _mm256_broadcast_ss(a3);
        c30 = _mm256_fmadd_ps(x, b0, c30); c31 = _mm256_fmadd_ps(x, b1, c31);
        x = _mm256_broadcast_ss(a3 + a_rs);
        c40 = _mm256_fmadd_ps(x, b0, c40); c41 = _mm256_fmadd_ps(x, b1, c41);
        x = _mm256_broadcast_ss(a3 + 2 * a_rs);
        c50 = _mm256_fmadd_ps(x, b0, c50); c51 = _mm256_fmadd_ps(x, b1, c51);
        a0 += a_cs; a3 += a_cs; b += ldb;
    }
    if (bias) {
        __m256 b0 = _mm256_loadu_ps(bias), b1 = _mm256_loadu_ps(bias + 8);
        c00 = _mm256_add_ps(c00, b0); c01 = _mm256_add_ps(c01, b1);
        c10 = _mm256_add_ps(c10, b0); c11 = _mm256_add_ps(c11, b1);
        c20 = _mm256_add_ps(c20, b0); c21 = _mm256_add_ps(c21, b1);
        c30 = _mm256_add_ps(c30, b0); c31 = _mm256_add_ps(c31, b1);
        c40 = _mm256_add_ps(c40, b0); c41 = _mm256_add_ps(c41, b1);
        c50 = _mm256_add_ps(c50, b0); c51 = _mm256_add_ps(c51, b1);
    }
    /* Partial tiles go through a 6x16 buffer so that no byte outside (m,n)
     * of c is read or written. */
    float tmp[6 * 16];
    float *cc = c;
    size_t ld = ldc;
    int full = (m == 6 && n == 16);
    if (!full) {
        cc = tmp;
        ld = 16;
        if (row_scale)
            for (int i = 0; i < 6; i++)
                for (int j = 0; j < 16; j++) tmp[i * 16 + j] = (i < m && j < n) ? c[i * ldc + j] : 0.0f;
    }
    if (row_scale) {
        __m256 s;
        s = _mm256_broadcast_ss(row_scale + 0);
        c00 = _mm256_fmadd_ps(s, _mm256_loadu_ps(cc + 0 * ld), c00);
        c01 = _mm256_fmadd_ps(s, _mm256_loadu_ps(cc + 0 * ld + 8), c01);
        s = _mm256_broadcast_ss(row_scale + 1);
        c10 = _mm256_fmadd_ps(s, _mm256_loadu_ps(cc + 1 * ld), c10);
        c11 = _mm256_fmadd_ps(s, _mm256_loadu_ps(cc + 1 * ld + 8), c11);
        s = _mm256_broadcast_ss(row_scale + 2);
        c20 = _mm256_fmadd_ps(s, _mm256_loadu_ps(cc + 2 * ld), c20);
        c21 = _mm256_fmadd_ps(s, _mm256_loadu_ps(cc + 2 * ld + 8), c21);
        s = _mm256_broadcast_ss(row_scale + 3);
        c30 = _mm256_fmadd_ps(s, _mm256_loadu_ps(cc + 3 * ld), c30);
        c31 = _mm256_fmadd_ps(s, _mm256_loadu_ps(cc + 3 * ld + 8), c31);
        s = _mm256_broadcast_ss(row_scale + 4);
        c40 = _mm256_fmadd_ps(s, _mm256_loadu_ps(cc + 4 * ld), c40);
        c41 = _mm256_fmadd_ps(s, _mm256_loadu_ps(cc + 4 * ld + 8), c41);
        s = _mm256_broadcast_ss(row_scale + 5);
        c50 = _mm256_fmadd_ps(s, _mm256_loadu_ps(cc + 5 * ld), c50);
        c51 = _mm256_fmadd_ps(s, _mm256_loadu_ps(cc + 5 * ld + 8), c51);
    }
    _mm256_storeu_ps(cc + 0 * ld, c00); _mm256_storeu_ps(cc + 0 * ld + 8, c01);
    _mm256_storeu_ps(cc + 1 * ld, c10); _mm256_storeu_ps(cc + 1 * ld + 8, c11);
    _mm256_storeu_ps(cc + 2 * ld, c20); _mm256_storeu_ps(cc + 2 * ld + 8, c21);
    _mm256_storeu_ps(cc + 3 * ld, c30); _mm256_storeu_ps(cc + 3 * ld + 8, c31);
    _mm256_storeu_ps(cc + 4 * ld, c40); _mm256_storeu_ps(cc + 4 * ld + 8, c41);
    _mm256_storeu_ps(cc + 5 * ld, c50); _mm256_storeu_ps(cc + 5 * ld + 8, c51);
    if (!full)
        for (int i = 0; i < m; i++)
            for (int j = 0; j < n; j++) c[i * ldc + j] = tmp[i * 16 + j];
}

#endif /* MHA_AVX2_MICRO_H */
