/* avx2_gemm_wq.c — the decode weight streams over bf16 and int8 weights
 * (decode_kernels.h) with AVX2 + FMA; weights are widened to fp32 in a
 * register (bf16: the bits shifted up 16; int8: sign-extended and
 * converted; both exact). Column tails use fmaf in the same order as the
 * lanes, so the bits equal the scalar table's.
 *   bf16: per block of 32 rows, 32 columns of y held in registers,
 *         summed in k order from y (the fp32 stream's bits on the
 *         widened values).
 *   int8: one scale group of rows (<= 32) at a time: 32 columns of sums
 *         in registers over the group's rows, then y += sum * scale. */
#include <immintrin.h>
#include <math.h>

#include "base/bf16.h"
#include "kernels/decode_kernels.h"

static inline __m256 widen8_bf16(const uint16_t *w) {
    __m256i u = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)w));
    return _mm256_castsi256_ps(_mm256_slli_epi32(u, 16));
}

static inline __m256 widen8_i8(const int8_t *w) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)w)));
}

#define ROWS 32 /* rows of w per block: 32 columns of them stay in L1 */

/* yr (n) += xr (k) w (k, n), k <= ROWS: 32 columns at a time held in
 * registers over the k rows, summed in k order starting from yr. */
static void stream_rows(float *yr, const float *xr, const uint16_t *w, int ldw, int k, int n) {
    int j = 0;
    for (; j + 32 <= n; j += 32) {
        __m256 a0 = _mm256_loadu_ps(yr + j), a1 = _mm256_loadu_ps(yr + j + 8);
        __m256 a2 = _mm256_loadu_ps(yr + j + 16), a3 = _mm256_loadu_ps(yr + j + 24);
        for (int kk = 0; kk < k; kk++) {
            const __m256 xb = _mm256_set1_ps(xr[kk]);
            const uint16_t *wr = w + (size_t)kk * ldw + j;
            a0 = _mm256_fmadd_ps(xb, widen8_bf16(wr), a0);
            a1 = _mm256_fmadd_ps(xb, widen8_bf16(wr + 8), a1);
            a2 = _mm256_fmadd_ps(xb, widen8_bf16(wr + 16), a2);
            a3 = _mm256_fmadd_ps(xb, widen8_bf16(wr + 24), a3);
        }
        _mm256_storeu_ps(yr + j, a0), _mm256_storeu_ps(yr + j + 8, a1);
        _mm256_storeu_ps(yr + j + 16, a2), _mm256_storeu_ps(yr + j + 24, a3);
    }
    for (; j + 8 <= n; j += 8) {
        __m256 a = _mm256_loadu_ps(yr + j);
        for (int kk = 0; kk < k; kk++)
            a = _mm256_fmadd_ps(_mm256_set1_ps(xr[kk]), widen8_bf16(w + (size_t)kk * ldw + j), a);
        _mm256_storeu_ps(yr + j, a);
    }
    for (; j < n; j++) {
        float a = yr[j];
        for (int kk = 0; kk < k; kk++) a = fmaf(xr[kk], mha_bf16_bits_to_float(w[(size_t)kk * ldw + j]), a);
        yr[j] = a;
    }
}

void mha_gemm_stream_bf16_avx2(float *y, int ldy, const float *x, int ldx, const uint16_t *w, int ldw, int m,
                               int k, int n) {
    for (int k0 = 0; k0 < k; k0 += ROWS)
        for (int r = 0; r < m; r++)
            stream_rows(y + (size_t)r * ldy, x + (size_t)r * ldx + k0, w + (size_t)k0 * ldw, ldw,
                        k - k0 < ROWS ? k - k0 : ROWS, n);
}

void mha_gemm_stream_i8_avx2(float *y, int ldy, const float *x, int ldx, const int8_t *w, int ldw,
                             const float *scale, int m, int k, int n) {
    for (int r = 0; r < m; r++) {
        const float *xr = x + (size_t)r * ldx;
        float *yr = y + (size_t)r * ldy;
        int j = 0;
        for (; j + 32 <= n; j += 32) {
            __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
            for (int kk = 0; kk < k; kk++) {
                const __m256 xb = _mm256_set1_ps(xr[kk]);
                const int8_t *wr = w + (size_t)kk * ldw + j;
                a0 = _mm256_fmadd_ps(xb, widen8_i8(wr), a0);
                a1 = _mm256_fmadd_ps(xb, widen8_i8(wr + 8), a1);
                a2 = _mm256_fmadd_ps(xb, widen8_i8(wr + 16), a2);
                a3 = _mm256_fmadd_ps(xb, widen8_i8(wr + 24), a3);
            }
            _mm256_storeu_ps(yr + j, _mm256_fmadd_ps(a0, _mm256_loadu_ps(scale + j), _mm256_loadu_ps(yr + j)));
            _mm256_storeu_ps(yr + j + 8, _mm256_fmadd_ps(a1, _mm256_loadu_ps(scale + j + 8), _mm256_loadu_ps(yr + j + 8)));
            _mm256_storeu_ps(yr + j + 16, _mm256_fmadd_ps(a2, _mm256_loadu_ps(scale + j + 16), _mm256_loadu_ps(yr + j + 16)));
            _mm256_storeu_ps(yr + j + 24, _mm256_fmadd_ps(a3, _mm256_loadu_ps(scale + j + 24), _mm256_loadu_ps(yr + j + 24)));
        }
        for (; j + 8 <= n; j += 8) {
            __m256 a = _mm256_setzero_ps();
            for (int kk = 0; kk < k; kk++) a = _mm256_fmadd_ps(_mm256_set1_ps(xr[kk]), widen8_i8(w + (size_t)kk * ldw + j), a);
            _mm256_storeu_ps(yr + j, _mm256_fmadd_ps(a, _mm256_loadu_ps(scale + j), _mm256_loadu_ps(yr + j)));
        }
        for (; j < n; j++) {
            float a = 0.0f;
            for (int kk = 0; kk < k; kk++) a = fmaf(xr[kk], (float)w[(size_t)kk * ldw + j], a);
            yr[j] = fmaf(a, scale[j], yr[j]);
        }
    }
}
