/* avx2_attention.c — the three steps of one flash-attention tile (AVX2+FMA):
 * scores s = q k^T, the online-softmax update, and o = alpha o + p v; and
 * the ALiBi bias of a tile.
 * attention.c drives the tiles; the contracts are in kernels.h. */
#include <math.h>

#include "kernels/kernels.h"
#include "kernels/avx2_micro.h"

/* s (rows, 16*npanels) = q k^T; q packed (rows/6, d_k, 6), kt (npanels, d_k, 16). */
void mha_attn_scores_avx2(float *s, size_t lds, const float *q, const float *kt, int d_k,
                          int rows, int npanels) {
    for (int p = 0; p < npanels; p++)
        for (int r = 0; r < rows; r += 6)
            mha_sgemm_avx2_6x16_body(s + (size_t)r * lds + (size_t)p * 16, lds,
                                     q + (size_t)r * d_k, 1, 6, kt + (size_t)p * d_k * 16, 16,
                                     NULL, NULL, d_k, 6, 16);
}

/* exp(x) for the softmax: mha_exp_avx2's clamp and split with the
 * softmax's degree-5 polynomial (kernels.h: MHA_SOFTMAX_EXP_*), the steps
 * of the AVX-512 softmax's exp, so both give the same bits for x >= -44. */
static inline __m256 softmax_exp(__m256 x) {
    const __m256 shift = _mm256_set1_ps(12583039.0f); /* 0x1.8p23 + 127 */
    x = _mm256_max_ps(x, _mm256_set1_ps(-88.0f));
    x = _mm256_min_ps(x, _mm256_set1_ps(88.37626266f));
    const __m256 t = _mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), shift);
    const __m256 n = _mm256_sub_ps(t, shift);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(MHA_SOFTMAX_EXP_C5);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(MHA_SOFTMAX_EXP_C4));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(MHA_SOFTMAX_EXP_C3));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(MHA_SOFTMAX_EXP_C2));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    const __m256i e = _mm256_slli_epi32(_mm256_castps_si256(t), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

/* Row max of each row (masking as kernels.h says), then alpha for 8 rows
 * per vector exp, then exp and row sum per row. */
void mha_attn_softmax_avx2(float *s, size_t lds, float *m, float *l, float *alpha,
                           const int *lo, const int *hi, int extra, int rows, int cols) {
    const __m256 ninf = _mm256_set1_ps(-INFINITY);
    const __m256i iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i vcols = _mm256_set1_epi32(cols);
    const int nv = (cols + 7) / 8, nfull = cols / 8;
    /* pass 1: mask and row max, parked in alpha */
    for (int i = 0; i < rows; i++) {
        float *r = s + (size_t)i * lds;
        __m256 mx = ninf;
        if (lo) {
            const __m256i vlo = _mm256_set1_epi32(lo[i] - 1), vhi = _mm256_set1_epi32(hi[i] + 1);
            const __m256i vex = _mm256_set1_epi32(extra - 1);
            for (int v = 0; v < nv; v++) {
                __m256i j = _mm256_add_epi32(iota, _mm256_set1_epi32(8 * v));
                __m256i in = _mm256_and_si256(_mm256_cmpgt_epi32(j, vlo), _mm256_cmpgt_epi32(vhi, j));
                in = _mm256_or_si256(in, _mm256_cmpgt_epi32(j, vex));
                in = _mm256_and_si256(in, _mm256_cmpgt_epi32(vcols, j));
                __m256 x = _mm256_blendv_ps(ninf, _mm256_loadu_ps(r + 8 * v), _mm256_castsi256_ps(in));
                _mm256_storeu_ps(r + 8 * v, x);
                mx = _mm256_max_ps(mx, x);
            }
        } else {
            for (int v = 0; v < nfull; v++) mx = _mm256_max_ps(mx, _mm256_loadu_ps(r + 8 * v));
            if (nfull < nv) {
                __m256i j = _mm256_add_epi32(iota, _mm256_set1_epi32(8 * nfull));
                __m256 in = _mm256_castsi256_ps(_mm256_cmpgt_epi32(vcols, j));
                __m256 x = _mm256_blendv_ps(ninf, _mm256_loadu_ps(r + 8 * nfull), in);
                _mm256_storeu_ps(r + 8 * nfull, x);
                mx = _mm256_max_ps(mx, x);
            }
        }
        alpha[i] = mha_hmax8_avx2(mx);
    }
    /* m_new = max(m, row max); alpha = exp(m - mu) with mu = m_new, or 0
     * while every key so far is masked (exp(-inf - 0) = 0): 8 rows at once */
    for (int i = 0; i < rows; i += 8) {
        float mo[8] = {0}, mx[8] = {0}, mn[8], t[8];
        const int n8 = rows - i < 8 ? rows - i : 8;
        for (int q = 0; q < n8; q++) mo[q] = m[i + q], mx[q] = alpha[i + q];
        const __m256 vmo = _mm256_loadu_ps(mo);
        const __m256 vmn = _mm256_max_ps(vmo, _mm256_loadu_ps(mx));
        const __m256 mu = _mm256_andnot_ps(_mm256_cmp_ps(vmn, ninf, _CMP_EQ_OQ), vmn);
        _mm256_storeu_ps(mn, vmn);
        _mm256_storeu_ps(t, softmax_exp(_mm256_sub_ps(vmo, mu)));
        for (int q = 0; q < n8; q++) alpha[i + q] = t[q], m[i + q] = mn[q];
    }
    /* pass 2: exp and row sum (two partial sums, then their sum) */
    for (int i = 0; i < rows; i++) {
        float *r = s + (size_t)i * lds;
        const __m256 vmu = _mm256_set1_ps(m[i] == -INFINITY ? 0.0f : m[i]);
        __m256 sum0 = _mm256_setzero_ps(), sum1 = _mm256_setzero_ps();
        int v = 0;
        for (; v + 1 < nv; v += 2) {
            __m256 p0 = softmax_exp(_mm256_sub_ps(_mm256_loadu_ps(r + 8 * v), vmu));
            __m256 p1 = softmax_exp(_mm256_sub_ps(_mm256_loadu_ps(r + 8 * v + 8), vmu));
            _mm256_storeu_ps(r + 8 * v, p0);
            _mm256_storeu_ps(r + 8 * v + 8, p1);
            sum0 = _mm256_add_ps(sum0, p0);
            sum1 = _mm256_add_ps(sum1, p1);
        }
        if (v < nv) {
            __m256 p0 = softmax_exp(_mm256_sub_ps(_mm256_loadu_ps(r + 8 * v), vmu));
            _mm256_storeu_ps(r + 8 * v, p0);
            sum0 = _mm256_add_ps(sum0, p0);
        }
        l[i] = alpha[i] * l[i] + mha_hsum8_avx2(_mm256_add_ps(sum0, sum1));
    }
}

/* ALiBi on a tile (kernels.h: attn_alibi), 8 keys per vector: the
 * distance exact in int32, one fp32 product, one fp32 subtraction, the
 * scalar kernel's bits; the last vector masked to cols. The scalar loop
 * cost a P2 forward 19% on the Zen 3 (bench/LIMITS.md, round 30). */
void mha_attn_alibi_avx2(float *s, size_t lds, const int *qpos, const int *kpos, float slope, int rows,
                         int cols) {
    const __m256 vs = _mm256_set1_ps(slope);
    for (int i = 0; i < rows; i++) {
        float *r = s + (size_t)i * lds;
        const __m256i pi = _mm256_set1_epi32(qpos[i]);
        int j = 0;
        for (; j + 8 <= cols; j += 8) {
            const __m256i d = _mm256_abs_epi32(_mm256_sub_epi32(pi, _mm256_loadu_si256((const __m256i *)(kpos + j))));
            _mm256_storeu_ps(r + j, _mm256_sub_ps(_mm256_loadu_ps(r + j), _mm256_mul_ps(vs, _mm256_cvtepi32_ps(d))));
        }
        if (j < cols) {
            const __m256i k = mha_lanes_below_avx2(cols - j);
            const __m256i d = _mm256_abs_epi32(_mm256_sub_epi32(pi, _mm256_maskload_epi32(kpos + j, k)));
            _mm256_maskstore_ps(r + j, k, _mm256_sub_ps(_mm256_maskload_ps(r + j, k), _mm256_mul_ps(vs, _mm256_cvtepi32_ps(d))));
        }
    }
}

/* o (rows, dv16) = alpha o + p (rows, nk) v (nk, dv16). */
void mha_attn_pv_avx2(float *o, size_t ldo, const float *p, size_t ldp, const float *v,
                      size_t ldv, const float *alpha, int rows, int nk, int dv16) {
    for (int r = 0; r < rows; r += 6)
        for (int c = 0; c < dv16; c += 16)
            mha_sgemm_avx2_6x16_body(o + (size_t)r * ldo + c, ldo, p + (size_t)r * ldp, ldp, 1,
                                     v + c, ldv, NULL, alpha + r, nk, 6, 16);
}
