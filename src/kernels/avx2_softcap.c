/* avx2_softcap.c — logit soft-capping s <- cap tanh(s / cap) over tiles of
 * scores, with an 8-wide tanh: an odd Taylor polynomial (to x^11) for
 * |x| < 0.4, where 1 - 2/(e^2x + 1) would cancel, and that form with
 * avx2_micro.h's exp elsewhere (|x| clamped to 10: tanh 10 is 1 in fp32).
 * Relative error below 3e-7 over the whole range (tests/test_modern.c).
 * As in avx512_softcap.c, a vector whose lanes are all small skips the exp
 * and the division (scores mostly sit far below the cap): the blend would
 * pick the polynomial anyway, so the bits are the same. Without the skip
 * soft-capping cost a P2 forward 18.6% on the Zen 3 (bench/LIMITS.md,
 * round 30). */
#include "kernels/kernels.h"
#include "kernels/avx2_micro.h"

static inline __m256 tanh_avx2(__m256 x) {
    const __m256 sign = _mm256_and_ps(x, _mm256_set1_ps(-0.0f));
    __m256 a = _mm256_min_ps(_mm256_andnot_ps(_mm256_set1_ps(-0.0f), x), _mm256_set1_ps(10.0f));
    /* small |x|: x (1 - x^2/3 + 2x^4/15 - 17x^6/315 + 62x^8/2835 - 1382x^10/155925) */
    const __m256 a2 = _mm256_mul_ps(a, a);
    __m256 p = _mm256_set1_ps(-1382.0f / 155925.0f);
    p = _mm256_fmadd_ps(p, a2, _mm256_set1_ps(62.0f / 2835.0f));
    p = _mm256_fmadd_ps(p, a2, _mm256_set1_ps(-17.0f / 315.0f));
    p = _mm256_fmadd_ps(p, a2, _mm256_set1_ps(2.0f / 15.0f));
    p = _mm256_fmadd_ps(p, a2, _mm256_set1_ps(-1.0f / 3.0f));
    p = _mm256_fmadd_ps(_mm256_mul_ps(p, a2), a, a);
    const __m256 small = _mm256_cmp_ps(a, _mm256_set1_ps(0.4f), _CMP_LT_OQ);
    if (_mm256_movemask_ps(small) != 0xff) { /* large |x|: 1 - 2 / (e^2|x| + 1) */
        const __m256 e = mha_exp_avx2(_mm256_add_ps(a, a));
        const __m256 big = _mm256_sub_ps(_mm256_set1_ps(1.0f),
                                         _mm256_div_ps(_mm256_set1_ps(2.0f), _mm256_add_ps(e, _mm256_set1_ps(1.0f))));
        p = _mm256_blendv_ps(big, p, small);
    }
    return _mm256_or_ps(p, sign);
}

void mha_attn_softcap_avx2(float *s, size_t lds, float cap, int rows, int cols) {
    const __m256 c = _mm256_set1_ps(cap), inv = _mm256_set1_ps(1.0f / cap);
    const int padded = (cols + 7) / 8 * 8;
    for (int i = 0; i < rows; i++) {
        float *r = s + (size_t)i * lds;
        for (int j = 0; j < padded; j += 8)
            _mm256_storeu_ps(r + j, _mm256_mul_ps(c, tanh_avx2(_mm256_mul_ps(_mm256_loadu_ps(r + j), inv))));
    }
}
