/* avx2_exp.c — y = exp(x) over an array with the 8-wide exp of avx2_micro.h
 * (the backward, decode and softcap inline the same function, the forward
 * softmax a degree-5 one, kernels.h; this entry is for tests). */
#include "kernels/kernels.h"
#include "kernels/avx2_micro.h"

void mha_vexp_avx2(float *y, const float *x, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, mha_exp_avx2(_mm256_loadu_ps(x + i)));
    if (i < n) {
        float t[8] = {0};
        for (size_t j = i; j < n; j++) t[j - i] = x[j];
        _mm256_storeu_ps(t, mha_exp_avx2(_mm256_loadu_ps(t)));
        for (size_t j = i; j < n; j++) y[j] = t[j - i];
    }
}
