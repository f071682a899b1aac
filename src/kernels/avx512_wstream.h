/* avx512_wstream.h — the AVX-512 decode weight stream over compact
 * weights, shared by avx512_gemm_bf16.c and avx512_gemm_i8.c (only files
 * built with AVX-512 flags include it): sixteen weights widened to fp32
 * in a register (exact), then the fp32 stream's loop (avx512_decode.c):
 * four rows of w per pass, masked column tails, additions in k order —
 * the scalar table's bits. */
#ifndef MHA_AVX512_WSTREAM_H
#define MHA_AVX512_WSTREAM_H

#include <immintrin.h>
#include <stdint.h>

#include "kernels/avx512_micro.h"

/* Sixteen weights w[i..), the first `live` lanes read (km), widened. */
static inline __attribute__((always_inline)) __m512 mha_widen16(const void *w, size_t i, __mmask16 km, int i8) {
    if (i8) return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(km, (const int8_t *)w + i)));
    __m512i u = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(km, (const uint16_t *)w + i));
    return _mm512_castsi512_ps(_mm512_slli_epi32(u, 16));
}

/* y (m, n) += x (m, k) widen(w) (k, n), m <= 4; i8 selects the type. */
static inline __attribute__((always_inline)) void mha_wstream_avx512(float *y, int ldy, const float *x, int ldx,
                                                                     const void *w, int ldw, int m, int k, int n,
                                                                     int i8) {
    int kk = 0;
    for (; kk + 4 <= k; kk += 4) {
        const size_t r0 = (size_t)kk * ldw, r1 = r0 + ldw, r2 = r1 + ldw, r3 = r2 + ldw;
        for (int r = 0; r < m; r++) {
            const float *xr = x + (size_t)r * ldx + kk;
            float *yr = y + (size_t)r * ldy;
            const __m512 x0 = _mm512_set1_ps(xr[0]), x1 = _mm512_set1_ps(xr[1]);
            const __m512 x2 = _mm512_set1_ps(xr[2]), x3 = _mm512_set1_ps(xr[3]);
            for (int j = 0; j < n; j += 16) {
                const __mmask16 km = mha_mask16(n - j);
                __m512 a = _mm512_maskz_loadu_ps(km, yr + j);
                a = _mm512_fmadd_ps(x0, mha_widen16(w, r0 + j, km, i8), a);
                a = _mm512_fmadd_ps(x1, mha_widen16(w, r1 + j, km, i8), a);
                a = _mm512_fmadd_ps(x2, mha_widen16(w, r2 + j, km, i8), a);
                a = _mm512_fmadd_ps(x3, mha_widen16(w, r3 + j, km, i8), a);
                _mm512_mask_storeu_ps(yr + j, km, a);
            }
        }
    }
    for (; kk < k; kk++) {
        const size_t r0 = (size_t)kk * ldw;
        for (int r = 0; r < m; r++) {
            const __m512 x0 = _mm512_set1_ps(x[(size_t)r * ldx + kk]);
            float *yr = y + (size_t)r * ldy;
            for (int j = 0; j < n; j += 16) {
                const __mmask16 km = mha_mask16(n - j);
                _mm512_mask_storeu_ps(yr + j, km, _mm512_fmadd_ps(x0, mha_widen16(w, r0 + j, km, i8),
                                                                  _mm512_maskz_loadu_ps(km, yr + j)));
            }
        }
    }
}

#endif /* MHA_AVX512_WSTREAM_H */
