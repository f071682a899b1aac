/* avx512_gemm_i8.c — the AVX-512 decode stream over int8 weights
 * (MHA_W_I8): sign-extended, converted to fp32 and FMA'd with fp32
 * activations (avx512_wstream.h); the caller applies the per-column
 * scales. VNNI would need int8 activations (docs/WEIGHTS.md). */
#include "kernels/avx512_wstream.h"
#include "kernels/decode_kernels.h"

void mha_gemm_stream_i8_avx512(float *y, int ldy, const float *x, int ldx, const int8_t *w, int ldw, int m, int k,
                               int n) {
    mha_wstream_avx512(y, ldy, x, ldx, w, ldw, m, k, n, 1);
}
