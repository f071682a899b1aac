/* avx512_softcap.c — logit soft-capping s <- cap tanh(s / cap) over tiles
 * of scores, 16 wide: the steps and constants of avx2_softcap.c's tanh
 * (odd polynomial for |x| < 0.4, 1 - 2/(e^2|x| + 1) beyond), so both give
 * identical bits. Scores are mostly far below the cap (Gemma 2: cap 50,
 * |s| a few units), so a vector whose lanes are all small skips the exp
 * and the division: the polynomial alone is what the blend would pick. */
#include "kernels/kernels.h"
#include "kernels/avx512_micro.h"

MHA_AVX512_INLINE __m512 tanh_avx512(__m512 x) {
    const __m512 a = _mm512_min_ps(_mm512_abs_ps(x), _mm512_set1_ps(10.0f));
    /* small |x|: x (1 - x^2/3 + 2x^4/15 - 17x^6/315 + 62x^8/2835 - 1382x^10/155925) */
    const __m512 a2 = _mm512_mul_ps(a, a);
    __m512 p = _mm512_set1_ps(-1382.0f / 155925.0f);
    p = _mm512_fmadd_ps(p, a2, _mm512_set1_ps(62.0f / 2835.0f));
    p = _mm512_fmadd_ps(p, a2, _mm512_set1_ps(-17.0f / 315.0f));
    p = _mm512_fmadd_ps(p, a2, _mm512_set1_ps(2.0f / 15.0f));
    p = _mm512_fmadd_ps(p, a2, _mm512_set1_ps(-1.0f / 3.0f));
    p = _mm512_fmadd_ps(_mm512_mul_ps(p, a2), a, a);
    const __mmask16 small = _mm512_cmp_ps_mask(a, _mm512_set1_ps(0.4f), _CMP_LT_OQ);
    if (small != (__mmask16)0xffff) { /* large |x|: 1 - 2 / (e^2|x| + 1) */
        const __m512 e = mha_exp_avx512(_mm512_add_ps(a, a));
        const __m512 big = _mm512_sub_ps(_mm512_set1_ps(1.0f),
                                         _mm512_div_ps(_mm512_set1_ps(2.0f), _mm512_add_ps(e, _mm512_set1_ps(1.0f))));
        p = _mm512_mask_blend_ps(small, big, p);
    }
    /* the sign of x back onto |tanh| (p >= 0 here) */
    const __m512i sign = _mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32((int)0x80000000u));
    return _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(p), sign));
}

void mha_attn_softcap_avx512(float *s, size_t lds, float cap, int rows, int cols) {
    const __m512 c = _mm512_set1_ps(cap), inv = _mm512_set1_ps(1.0f / cap);
    const int padded = (cols + 15) / 16 * 16;
    for (int i = 0; i < rows; i++) {
        float *r = s + (size_t)i * lds;
        for (int j = 0; j < padded; j += 16)
            _mm512_storeu_ps(r + j, _mm512_mul_ps(c, tanh_avx512(_mm512_mul_ps(_mm512_loadu_ps(r + j), inv))));
    }
}
