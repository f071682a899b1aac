/* avx512_range.c — the fast path's fp32 range check (kernels.h:
 * key_norm_max, all_within) with AVX-512: a read of K and V that every
 * forward pays, which the scalar loops ran at 2 doubles per operation
 * (the P3 check took 3-4 ms of a 135 ms layer, round 18 of
 * bench/LIMITS.md). Each key's sum of squares keeps the scalar order (e
 * ascending, one lane per key) and x*x is exact in double, so an FMA
 * rounds as the scalar add does: the same bits. */
#include <math.h>

#include "kernels/kernels.h"
#include "kernels/avx512_micro.h"

/* Squared norms of the 16 keys of `panels` consecutive panels (d_k, 16),
 * P of them at once (8 independent add chains for P = 4), folded into
 * best / nan. */
MHA_AVX512_INLINE void panel_norms(const float *kt, int d_k, const int P, __m512d *best, __mmask8 *nan) {
    __m512d s[4][2];
#pragma GCC unroll 4
    for (int p = 0; p < P; p++) s[p][0] = s[p][1] = _mm512_setzero_pd();
    for (int e = 0; e < d_k; e++)
#pragma GCC unroll 4
        for (int p = 0; p < P; p++) {
            const float *x = kt + (size_t)p * d_k * 16 + (size_t)e * 16;
            const __m512d lo = _mm512_cvtps_pd(_mm256_loadu_ps(x)), hi = _mm512_cvtps_pd(_mm256_loadu_ps(x + 8));
            s[p][0] = _mm512_fmadd_pd(lo, lo, s[p][0]);
            s[p][1] = _mm512_fmadd_pd(hi, hi, s[p][1]);
        }
#pragma GCC unroll 4
    for (int p = 0; p < P; p++)
        for (int h = 0; h < 2; h++) {
            *nan |= _mm512_cmp_pd_mask(s[p][h], s[p][h], _CMP_UNORD_Q);
            *best = _mm512_max_pd(*best, s[p][h]);
        }
}

double mha_key_norm_max_avx512(const float *kt, int n16, int d_k) {
    __m512d best = _mm512_setzero_pd();
    __mmask8 nan = 0;
    int j = 0;
    for (; j + 4 <= n16; j += 4) panel_norms(kt + (size_t)j * d_k * 16, d_k, 4, &best, &nan);
    for (; j < n16; j++) panel_norms(kt + (size_t)j * d_k * 16, d_k, 1, &best, &nan);
    return nan ? (double)NAN : _mm512_reduce_max_pd(best);
}

int mha_all_within_avx512(const float *x, size_t n, float limit) {
    const __m512 lim = _mm512_set1_ps(limit);
    __mmask16 bad = 0; /* lanes with |x| > limit or NaN (not-less-or-equal, unordered: true) */
    size_t i = 0;
    for (; i + 64 <= n; i += 64)
#pragma GCC unroll 4
        for (int u = 0; u < 4; u++)
            bad |= _mm512_cmp_ps_mask(_mm512_abs_ps(_mm512_loadu_ps(x + i + 16 * u)), lim, _CMP_NLE_UQ);
    for (; i < n; i += 16) {
        const __mmask16 live = mha_mask16(n - i < 16 ? (int)(n - i) : 16);
        bad |= _mm512_mask_cmp_ps_mask(live, _mm512_abs_ps(_mm512_maskz_loadu_ps(live, x + i)), lim, _CMP_NLE_UQ);
    }
    return !bad;
}
