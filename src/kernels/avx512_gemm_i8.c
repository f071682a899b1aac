/* avx512_gemm_i8.c — the AVX-512 decode stream over int8 weights
 * (MHA_W_I8): one scale group of rows (<= 32) at a time, 64 columns of
 * sums in registers (weights sign-extended and converted to fp32, exact,
 * FMA'd with fp32 activations in k order), then y += sum * scale; masked
 * column tails, so the bits equal the scalar table's. VNNI would need
 * int8 activations (docs/WEIGHTS.md). */
#include <immintrin.h>
#include <stdint.h>

#include "kernels/avx512_micro.h"
#include "kernels/decode_kernels.h"

static inline __m512 widen16_i8(const int8_t *w, __mmask16 km) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(km, w)));
}

void mha_gemm_stream_i8_avx512(float *y, int ldy, const float *x, int ldx, const int8_t *w, int ldw,
                               const float *scale, int m, int k, int n) {
    for (int r = 0; r < m; r++) {
        const float *xr = x + (size_t)r * ldx;
        float *yr = y + (size_t)r * ldy;
        int j = 0;
        for (; j + 64 <= n; j += 64) {
            __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
            for (int kk = 0; kk < k; kk++) {
                const __m512 xb = _mm512_set1_ps(xr[kk]);
                const int8_t *wr = w + (size_t)kk * ldw + j;
                a0 = _mm512_fmadd_ps(xb, widen16_i8(wr, 0xffff), a0);
                a1 = _mm512_fmadd_ps(xb, widen16_i8(wr + 16, 0xffff), a1);
                a2 = _mm512_fmadd_ps(xb, widen16_i8(wr + 32, 0xffff), a2);
                a3 = _mm512_fmadd_ps(xb, widen16_i8(wr + 48, 0xffff), a3);
            }
            _mm512_storeu_ps(yr + j, _mm512_fmadd_ps(a0, _mm512_loadu_ps(scale + j), _mm512_loadu_ps(yr + j)));
            _mm512_storeu_ps(yr + j + 16, _mm512_fmadd_ps(a1, _mm512_loadu_ps(scale + j + 16), _mm512_loadu_ps(yr + j + 16)));
            _mm512_storeu_ps(yr + j + 32, _mm512_fmadd_ps(a2, _mm512_loadu_ps(scale + j + 32), _mm512_loadu_ps(yr + j + 32)));
            _mm512_storeu_ps(yr + j + 48, _mm512_fmadd_ps(a3, _mm512_loadu_ps(scale + j + 48), _mm512_loadu_ps(yr + j + 48)));
        }
        for (; j < n; j += 16) {
            const __mmask16 km = mha_mask16(n - j);
            __m512 a = _mm512_setzero_ps();
            for (int kk = 0; kk < k; kk++) a = _mm512_fmadd_ps(_mm512_set1_ps(xr[kk]), widen16_i8(w + (size_t)kk * ldw + j, km), a);
            _mm512_mask_storeu_ps(yr + j, km, _mm512_fmadd_ps(a, _mm512_maskz_loadu_ps(km, scale + j),
                                                              _mm512_maskz_loadu_ps(km, yr + j)));
        }
    }
}
