/* avx2_range.c — the fast path's fp32 range check (kernels.h:
 * key_norm_max, all_within) with AVX2: avx512_range.c's loops 4 doubles
 * (8 floats) wide, the same bits as the scalar table (each key's sum in
 * e order; x*x exact in double, so the FMA rounds as the scalar add). */
#include <immintrin.h>
#include <math.h>

#include "kernels/kernels.h"

/* Squared norms of the 16 keys of P consecutive panels (d_k, 16), folded
 * into best / nan (P = 2: 8 independent add chains). */
static inline __attribute__((always_inline)) void panel_norms(const float *kt, int d_k, const int P, __m256d *best,
                                                              __m256d *nan) {
    __m256d s[2][4];
    for (int p = 0; p < P; p++)
        for (int q = 0; q < 4; q++) s[p][q] = _mm256_setzero_pd();
    for (int e = 0; e < d_k; e++)
        for (int p = 0; p < P; p++)
            for (int q = 0; q < 4; q++) {
                const __m256d x = _mm256_cvtps_pd(_mm_loadu_ps(kt + (size_t)p * d_k * 16 + (size_t)e * 16 + 4 * q));
                s[p][q] = _mm256_fmadd_pd(x, x, s[p][q]);
            }
    for (int p = 0; p < P; p++)
        for (int q = 0; q < 4; q++) {
            *nan = _mm256_or_pd(*nan, _mm256_cmp_pd(s[p][q], s[p][q], _CMP_UNORD_Q));
            *best = _mm256_max_pd(*best, s[p][q]);
        }
}

double mha_key_norm_max_avx2(const float *kt, int n16, int d_k) {
    __m256d best = _mm256_setzero_pd(), nan = _mm256_setzero_pd();
    int j = 0;
    for (; j + 2 <= n16; j += 2) panel_norms(kt + (size_t)j * d_k * 16, d_k, 2, &best, &nan);
    for (; j < n16; j++) panel_norms(kt + (size_t)j * d_k * 16, d_k, 1, &best, &nan);
    if (_mm256_movemask_pd(nan)) return (double)NAN;
    double lanes[4], m = 0.0;
    _mm256_storeu_pd(lanes, best);
    for (int l = 0; l < 4; l++) m = lanes[l] > m ? lanes[l] : m;
    return m;
}

int mha_all_within_avx2(const float *x, size_t n, float limit) {
    const __m256 lim = _mm256_set1_ps(limit), sign = _mm256_set1_ps(-0.0f);
    __m256 bad = _mm256_setzero_ps(); /* lanes with |x| > limit or NaN (not-less-or-equal, unordered) */
    size_t i = 0;
    for (; i + 32 <= n; i += 32)
        for (int u = 0; u < 4; u++)
            bad = _mm256_or_ps(bad, _mm256_cmp_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(x + i + 8 * u)), lim,
                                                  _CMP_NLE_UQ));
    int any = _mm256_movemask_ps(bad);
    for (; i < n; i++) any |= !(fabsf(x[i]) <= limit);
    return !any;
}
