/* avx2_gemm_wq.c — the decode weight streams over bf16 and int8 weights
 * (decode_kernels.h) with AVX2 + FMA: eight weights widened to fp32 in a
 * register (bf16: the bits shifted up 16; int8: sign-extended and
 * converted, both exact), then the fp32 stream's loop: four rows of w per
 * pass, each y element loaded and stored once per four FMAs, in k order;
 * column tails use fmaf in the same order, so the bits equal the scalar
 * table's. */
#include <immintrin.h>
#include <math.h>

#include "base/bf16.h"
#include "kernels/decode_kernels.h"

#define INLINE static inline __attribute__((always_inline))

/* Eight weights w[i..i+8) widened to fp32; i8 selects the type. */
INLINE __m256 widen8(const void *w, size_t i, int i8) {
    if (i8) return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)((const int8_t *)w + i))));
    __m256i u = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const uint16_t *)w + i)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(u, 16));
}

INLINE float widen1(const void *w, size_t i, int i8) {
    return i8 ? (float)((const int8_t *)w)[i] : mha_bf16_bits_to_float(((const uint16_t *)w)[i]);
}

INLINE void stream(float *y, int ldy, const float *x, int ldx, const void *w, int ldw, int m, int k, int n, int i8) {
    int kk = 0;
    for (; kk + 4 <= k; kk += 4) {
        const size_t r0 = (size_t)kk * ldw, r1 = r0 + ldw, r2 = r1 + ldw, r3 = r2 + ldw;
        for (int r = 0; r < m; r++) {
            const float *xr = x + (size_t)r * ldx + kk;
            float *yr = y + (size_t)r * ldy;
            const __m256 x0 = _mm256_set1_ps(xr[0]), x1 = _mm256_set1_ps(xr[1]);
            const __m256 x2 = _mm256_set1_ps(xr[2]), x3 = _mm256_set1_ps(xr[3]);
            int j = 0;
            for (; j + 8 <= n; j += 8) {
                __m256 a = _mm256_loadu_ps(yr + j);
                a = _mm256_fmadd_ps(x0, widen8(w, r0 + j, i8), a);
                a = _mm256_fmadd_ps(x1, widen8(w, r1 + j, i8), a);
                a = _mm256_fmadd_ps(x2, widen8(w, r2 + j, i8), a);
                a = _mm256_fmadd_ps(x3, widen8(w, r3 + j, i8), a);
                _mm256_storeu_ps(yr + j, a);
            }
            for (; j < n; j++) {
                float a = yr[j];
                a = fmaf(xr[0], widen1(w, r0 + j, i8), a);
                a = fmaf(xr[1], widen1(w, r1 + j, i8), a);
                a = fmaf(xr[2], widen1(w, r2 + j, i8), a);
                a = fmaf(xr[3], widen1(w, r3 + j, i8), a);
                yr[j] = a;
            }
        }
    }
    for (; kk < k; kk++) {
        const size_t r0 = (size_t)kk * ldw;
        for (int r = 0; r < m; r++) {
            const float xs = x[(size_t)r * ldx + kk];
            float *yr = y + (size_t)r * ldy;
            const __m256 x0 = _mm256_set1_ps(xs);
            int j = 0;
            for (; j + 8 <= n; j += 8)
                _mm256_storeu_ps(yr + j, _mm256_fmadd_ps(x0, widen8(w, r0 + j, i8), _mm256_loadu_ps(yr + j)));
            for (; j < n; j++) yr[j] = fmaf(xs, widen1(w, r0 + j, i8), yr[j]);
        }
    }
}

void mha_gemm_stream_bf16_avx2(float *y, int ldy, const float *x, int ldx, const uint16_t *w, int ldw, int m,
                               int k, int n) {
    stream(y, ldy, x, ldx, w, ldw, m, k, n, 0);
}

void mha_gemm_stream_i8_avx2(float *y, int ldy, const float *x, int ldx, const int8_t *w, int ldw, int m, int k,
                             int n) {
    stream(y, ldy, x, ldx, w, ldw, m, k, n, 1);
}
