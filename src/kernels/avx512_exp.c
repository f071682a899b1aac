/* avx512_exp.c — y = exp(x) over an array with the 16-wide exp of
 * avx512_micro.h (the backward, decode and softcap inline the same
 * function, the forward softmax a degree-5 one, kernels.h; this entry is
 * for tests). The tail is a masked load and store. */
#include "kernels/kernels.h"
#include "kernels/avx512_micro.h"

void mha_vexp_avx512(float *y, const float *x, size_t n) {
    size_t i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, mha_exp_avx512(_mm512_loadu_ps(x + i)));
    if (i < n) {
        const __mmask16 k = mha_mask16((int)(n - i));
        _mm512_mask_storeu_ps(y + i, k, mha_exp_avx512(_mm512_maskz_loadu_ps(k, x + i)));
    }
}
