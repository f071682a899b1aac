/* scalar_gemm_wq.c — the decode weight streams over bf16 and int8 weights
 * (decode_kernels.h), portable C, for one row or several: per weight row
 * and chunk of CB columns, the weights are widened once and used for
 * every row of x (the chunk stays in L1), so the weights' bytes are read
 * once however many rows the step has. One fmaf per weight in k order,
 * the order every vector table keeps; int8 sums one scale group from 0,
 * then y = fmaf(sum, scale, y). */
#include <math.h>

#include "base/bf16.h"
#include "kernels/decode_kernels.h"

#define CB 64 /* columns per chunk */
#define RB 8  /* rows of x per chunk's sums (int8) */

void mha_gemm_stream_bf16_scalar(float *y, int ldy, const float *x, int ldx, const uint16_t *w, int ldw, int m,
                                 int k, int n) {
    float wf[CB];
    for (int j0 = 0; j0 < n; j0 += CB) {
        const int cn = n - j0 < CB ? n - j0 : CB;
        for (int kk = 0; kk < k; kk++) {
            const uint16_t *wr = w + (size_t)kk * ldw + j0;
            for (int j = 0; j < cn; j++) wf[j] = mha_bf16_bits_to_float(wr[j]);
            for (int r = 0; r < m; r++) {
                const float xr = x[(size_t)r * ldx + kk];
                float *yr = y + (size_t)r * ldy + j0;
                for (int j = 0; j < cn; j++) yr[j] = fmaf(xr, wf[j], yr[j]);
            }
        }
    }
}

void mha_gemm_stream_i8_scalar(float *y, int ldy, const float *x, int ldx, const int8_t *w, int ldw,
                               const float *scale, int m, int k, int n) {
    float wf[CB], acc[RB][CB];
    for (int j0 = 0; j0 < n; j0 += CB) {
        const int cn = n - j0 < CB ? n - j0 : CB;
        for (int r0 = 0; r0 < m; r0 += RB) {
            const int rn = m - r0 < RB ? m - r0 : RB;
            for (int r = 0; r < rn; r++)
                for (int j = 0; j < cn; j++) acc[r][j] = 0.0f;
            for (int kk = 0; kk < k; kk++) {
                const int8_t *wr = w + (size_t)kk * ldw + j0;
                for (int j = 0; j < cn; j++) wf[j] = (float)wr[j];
                for (int r = 0; r < rn; r++) {
                    const float xr = x[(size_t)(r0 + r) * ldx + kk];
                    for (int j = 0; j < cn; j++) acc[r][j] = fmaf(xr, wf[j], acc[r][j]);
                }
            }
            for (int r = 0; r < rn; r++) {
                float *yr = y + (size_t)(r0 + r) * ldy + j0;
                for (int j = 0; j < cn; j++) yr[j] = fmaf(acc[r][j], scale[j0 + j], yr[j]);
            }
        }
    }
}
