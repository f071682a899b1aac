/* avx512_gemm_bf16.c — the AVX-512 decode stream over bf16 weights
 * (MHA_W_BF16): sixteen weights widened to fp32 in a register (the bits
 * shifted up 16, exact); per block of 32 rows, 64 columns of y held in
 * registers, masked column tails, additions in k order starting from y:
 * the scalar table's bits (and the fp32 stream's on the widened values). A decode step reads each weight once, so the
 * stream is bound by memory and the widening is free; VDPBF16PS would
 * also round the activations to bf16 (docs/WEIGHTS.md). */
#include <immintrin.h>
#include <stdint.h>

#include "kernels/avx512_micro.h"
#include "kernels/decode_kernels.h"

static inline __m512 widen16_bf16(const uint16_t *w, __mmask16 km) {
    __m512i u = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(km, w));
    return _mm512_castsi512_ps(_mm512_slli_epi32(u, 16));
}

#define ROWS 32 /* rows of w per block: 64 columns of them stay in L1 */

/* yr (n) += xr (k) w (k, n), k <= ROWS: 64 columns at a time held in
 * registers over the k rows, summed in k order starting from yr. */
static void stream_rows(float *yr, const float *xr, const uint16_t *w, int ldw, int k, int n) {
    int j = 0;
    for (; j + 64 <= n; j += 64) {
        __m512 a0 = _mm512_loadu_ps(yr + j), a1 = _mm512_loadu_ps(yr + j + 16);
        __m512 a2 = _mm512_loadu_ps(yr + j + 32), a3 = _mm512_loadu_ps(yr + j + 48);
        for (int kk = 0; kk < k; kk++) {
            const __m512 xb = _mm512_set1_ps(xr[kk]);
            const uint16_t *wr = w + (size_t)kk * ldw + j;
            a0 = _mm512_fmadd_ps(xb, widen16_bf16(wr, 0xffff), a0);
            a1 = _mm512_fmadd_ps(xb, widen16_bf16(wr + 16, 0xffff), a1);
            a2 = _mm512_fmadd_ps(xb, widen16_bf16(wr + 32, 0xffff), a2);
            a3 = _mm512_fmadd_ps(xb, widen16_bf16(wr + 48, 0xffff), a3);
        }
        _mm512_storeu_ps(yr + j, a0), _mm512_storeu_ps(yr + j + 16, a1);
        _mm512_storeu_ps(yr + j + 32, a2), _mm512_storeu_ps(yr + j + 48, a3);
    }
    for (; j < n; j += 16) {
        const __mmask16 km = mha_mask16(n - j);
        __m512 a = _mm512_maskz_loadu_ps(km, yr + j);
        for (int kk = 0; kk < k; kk++)
            a = _mm512_fmadd_ps(_mm512_set1_ps(xr[kk]), widen16_bf16(w + (size_t)kk * ldw + j, km), a);
        _mm512_mask_storeu_ps(yr + j, km, a);
    }
}

void mha_gemm_stream_bf16_avx512(float *y, int ldy, const float *x, int ldx, const uint16_t *w, int ldw, int m,
                                 int k, int n) {
    for (int k0 = 0; k0 < k; k0 += ROWS)
        for (int r = 0; r < m; r++)
            stream_rows(y + (size_t)r * ldy, x + (size_t)r * ldx + k0, w + (size_t)k0 * ldw, ldw,
                        k - k0 < ROWS ? k - k0 : ROWS, n);
}
