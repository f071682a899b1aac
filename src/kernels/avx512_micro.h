/* avx512_micro.h — the AVX-512 register tile, the 16-wide exp and the
 * horizontal max/sum, inlined into the avx512*.c kernel files (the only
 * ones built with -mavx512f/bw/vl/dq). Included by those files only.
 *
 * Legend: R rows x P panels is a register tile (R a multiple of 6 rows, P
 * panels of 16 columns, one zmm each); a row i of the tile lives in 6-row
 * group i/6 at a + (i/6)*a_ps, row i%6 of it at stride a_rs, k at stride
 * a_cs; panel p of b at b + p*b_ps, row k at stride ldb. */
#ifndef MHA_AVX512_MICRO_H
#define MHA_AVX512_MICRO_H

#include <immintrin.h>
#include <stddef.h>

#define MHA_AVX512_INLINE static inline __attribute__((always_inline))

/* exp(x) for 16 floats: the same steps and constants as mha_exp_avx2
 * (avx2_micro.h), so both give identical bits: x = n ln2 + r (Cody-Waite
 * split), e^r by a degree-6 polynomial, 2^n through the exponent bits;
 * x clamped to [-88, 88.38] (e^x = 0 below -87.68, subnormal between
 * -87.68 and ln(FLT_MIN)); within 2 ulp on [ln(FLT_MIN), 88.3]. */
MHA_AVX512_INLINE __m512 mha_exp_avx512_inrange(__m512 x);
MHA_AVX512_INLINE __m512 mha_exp_avx512(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-88.0f));
    x = _mm512_min_ps(x, _mm512_set1_ps(88.37626266f));
    return mha_exp_avx512_inrange(x);
}

/* The same steps without the clamp, for x already in [-88, 88.38] (the
 * softmax's x <= 0, whose callers zero x < -88 themselves): the bits of
 * mha_exp_avx512 there. */
MHA_AVX512_INLINE __m512 mha_exp_avx512_inrange(__m512 x) {
    const __m512 shift = _mm512_set1_ps(12583039.0f); /* 0x1.8p23 + 127 */
    __m512 t = _mm512_fmadd_ps(x, _mm512_set1_ps(1.44269504088896341f), shift);
    __m512 n = _mm512_sub_ps(t, shift);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(0x1.6ae6e0p-10f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0x1.1267d8p-7f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0x1.555824p-5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0x1.555418p-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0x1.fffffcp-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    __m512i e = _mm512_slli_epi32(_mm512_castps_si512(t), 23);
    return _mm512_mul_ps(p, _mm512_castsi512_ps(e));
}

/* lanes [0, live) of a 16-float vector, live clamped to [0, 16] */
MHA_AVX512_INLINE __mmask16 mha_mask16(int live) {
    return live >= 16 ? (__mmask16)0xffff : live <= 0 ? (__mmask16)0 : (__mmask16)((1u << live) - 1u);
}

/* y[0..16) = fma(xb, wv, y) (xb: one value in every lane; from 0 instead
 * of y when first): one 512-bit load and store of y, or two 256-bit
 * halves (halves, a constant at each call site). A decode stream adds
 * each weight row into y, which stays in L1; on Zen 4
 * (mha_cpu_halves_512) the step's projections streamed cold in
 * 0.83-0.94x the time (fp32, 2 threads; int8 0.65-0.98x, 1 thread
 * 0.51-0.79x) with the halves (bench/ab/ab_gemv.sh; bench/LIMITS.md,
 * round 16). Why is not settled: one loop over a single matrix showed no
 * such gap. The same FMA on every element: the same bits either way. */
MHA_AVX512_INLINE void mha_fma_into_avx512(float *y, __m512 xb, __m512 wv, int first, const int halves) {
    if (!halves) {
        _mm512_storeu_ps(y, _mm512_fmadd_ps(xb, wv, first ? _mm512_setzero_ps() : _mm512_loadu_ps(y)));
        return;
    }
    const __m256 x2 = _mm512_castps512_ps256(xb), z = _mm256_setzero_ps();
    _mm256_storeu_ps(y, _mm256_fmadd_ps(x2, _mm512_castps512_ps256(wv), first ? z : _mm256_loadu_ps(y)));
    _mm256_storeu_ps(y + 8, _mm256_fmadd_ps(x2, _mm512_extractf32x8_ps(wv, 1), first ? z : _mm256_loadu_ps(y + 8)));
}

/* c (m, n) = [row_scale[i] * c +] a (R, K) b (K, 16P) [+ bias (16P)],
 * m <= R, n <= 16P; only (m, n) of c is read or written (masked stores),
 * and only the panels that hold live columns are read. Each c element is
 * one fp32 FMA chain over k in order, then + bias, then the row scale: the
 * additions of the AVX2 6x16 tile, so both give identical bits.
 * acc_c (a constant at each call site): the chain starts from c's value
 * instead of 0, so a product split over K blocks, each block's sums
 * stored in c and the bias added after the last one, gives the bits of
 * one call over the whole K.
 * pf (NULL: none): K rows of 32 floats at stride ldb that the caller
 * reads next, prefetched into L2 one row per k step (two lines), so
 * they arrive spread over this tile's FMAs; a hint only, never data. */
MHA_AVX512_INLINE void mha_tile_avx512_pf(float *c, size_t ldc, const float *a, size_t a_ps,
                                         size_t a_rs, size_t a_cs, const float *b, size_t b_ps,
                                         size_t ldb, const float *bias, const float *row_scale,
                                         int K, int m, int n, const int R, const int P,
                                         const int acc_c, const float *pf) {
    __m512 acc[18][4];
    __mmask16 mk[4];
#pragma GCC unroll 4
    for (int p = 0; p < P; p++) mk[p] = mha_mask16(n - 16 * p);
#pragma GCC unroll 18
    for (int i = 0; i < R; i++)
#pragma GCC unroll 4
        for (int p = 0; p < P; p++)
            acc[i][p] = acc_c && i < m ? _mm512_maskz_loadu_ps(mk[p], c + (size_t)i * ldc + 16 * p)
                                       : _mm512_setzero_ps();
    const float *bk = b;
    const float *ak = a;
    for (int k = 0; k < K; k++) {
        __m512 bv[4];
#pragma GCC unroll 4
        for (int p = 0; p < P; p++) bv[p] = _mm512_loadu_ps(bk + p * b_ps);
#pragma GCC unroll 18
        for (int i = 0; i < R; i++) {
            __m512 x = _mm512_set1_ps(ak[(i / 6) * a_ps + (i % 6) * a_rs]);
#pragma GCC unroll 4
            for (int p = 0; p < P; p++) acc[i][p] = _mm512_fmadd_ps(x, bv[p], acc[i][p]);
        }
        if (pf) {
            _mm_prefetch((const char *)pf, _MM_HINT_T1);
            _mm_prefetch((const char *)(pf + 16), _MM_HINT_T1);
            pf += ldb;
        }
        bk += ldb;
        ak += a_cs;
    }
    if (bias) {
#pragma GCC unroll 4
        for (int p = 0; p < P; p++) {
            __m512 bb = _mm512_maskz_loadu_ps(mk[p], bias + 16 * p);
#pragma GCC unroll 18
            for (int i = 0; i < R; i++) acc[i][p] = _mm512_add_ps(acc[i][p], bb);
        }
    }
#pragma GCC unroll 18
    for (int i = 0; i < R; i++) {
        if (i >= m) break;
        float *ci = c + (size_t)i * ldc;
        if (row_scale) {
            __m512 s = _mm512_set1_ps(row_scale[i]);
#pragma GCC unroll 4
            for (int p = 0; p < P; p++)
                acc[i][p] = _mm512_fmadd_ps(s, _mm512_maskz_loadu_ps(mk[p], ci + 16 * p), acc[i][p]);
        }
#pragma GCC unroll 4
        for (int p = 0; p < P; p++) _mm512_mask_storeu_ps(ci + 16 * p, mk[p], acc[i][p]);
    }
}

/* The tile without a prefetch stream. */
MHA_AVX512_INLINE void mha_tile_avx512(float *c, size_t ldc, const float *a, size_t a_ps,
                                      size_t a_rs, size_t a_cs, const float *b, size_t b_ps,
                                      size_t ldb, const float *bias, const float *row_scale,
                                      int K, int m, int n, const int R, const int P, const int acc_c) {
    mha_tile_avx512_pf(c, ldc, a, a_ps, a_rs, a_cs, b, b_ps, ldb, bias, row_scale, K, m, n, R, P, acc_c, NULL);
}

MHA_AVX512_INLINE float mha_hmax16_avx512(__m512 v) {
    __m256 x = _mm256_max_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
    __m128 y = _mm_max_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    y = _mm_max_ps(y, _mm_movehl_ps(y, y));
    y = _mm_max_ss(y, _mm_shuffle_ps(y, y, 1));
    return _mm_cvtss_f32(y);
}

/* the sum of the 16 lanes: halves, quarters, pairs, then the last two */
MHA_AVX512_INLINE float mha_hsum16_avx512(__m512 v) {
    __m256 x = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
    __m128 y = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    y = _mm_add_ps(y, _mm_movehl_ps(y, y));
    y = _mm_add_ss(y, _mm_shuffle_ps(y, y, 1));
    return _mm_cvtss_f32(y);
}

#endif /* MHA_AVX512_MICRO_H */
