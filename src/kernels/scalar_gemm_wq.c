/* scalar_gemm_wq.c — the decode weight streams over bf16 and int8 weights
 * (decode_kernels.h), portable C: one fmaf per weight in k order, the
 * order every vector table keeps; int8 sums one scale group, then scales. */
#include <math.h>

#include "base/bf16.h"
#include "kernels/decode_kernels.h"

void mha_gemm_stream_bf16_scalar(float *y, int ldy, const float *x, int ldx, const uint16_t *w, int ldw, int m,
                                 int k, int n) {
    for (int kk = 0; kk < k; kk++) {
        const uint16_t *wr = w + (size_t)kk * ldw;
        for (int r = 0; r < m; r++) {
            const float xr = x[(size_t)r * ldx + kk];
            float *yr = y + (size_t)r * ldy;
            for (int j = 0; j < n; j++) yr[j] = fmaf(xr, mha_bf16_bits_to_float(wr[j]), yr[j]);
        }
    }
}

void mha_gemm_stream_i8_scalar(float *y, int ldy, const float *x, int ldx, const int8_t *w, int ldw,
                               const float *scale, int m, int k, int n) {
    for (int r = 0; r < m; r++)
        for (int j = 0; j < n; j++) {
            float acc = 0.0f;
            for (int kk = 0; kk < k; kk++) acc = fmaf(x[(size_t)r * ldx + kk], (float)w[(size_t)kk * ldw + j], acc);
            y[(size_t)r * ldy + j] = fmaf(acc, scale[j], y[(size_t)r * ldy + j]);
        }
}
