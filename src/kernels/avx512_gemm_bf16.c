/* avx512_gemm_bf16.c — the AVX-512 decode stream over bf16 weights
 * (MHA_W_BF16): widened in registers and FMA'd in fp32 (avx512_wstream.h).
 * A decode step reads each weight once, so the stream is bound by memory
 * and the widening (one shift) is free; VDPBF16PS would also round the
 * activations to bf16 (docs/WEIGHTS.md). */
#include "kernels/avx512_wstream.h"
#include "kernels/decode_kernels.h"

void mha_gemm_stream_bf16_avx512(float *y, int ldy, const float *x, int ldx, const uint16_t *w, int ldw, int m,
                                 int k, int n) {
    mha_wstream_avx512(y, ldy, x, ldx, w, ldw, m, k, n, 0);
}
