/* avx512_attention.c — the three steps of one flash-attention tile
 * (AVX-512): scores s = q k^T and o = alpha o + p v on 12x32 register
 * tiles (6-row tiles for a last group of 6 rows), and the online-softmax
 * update with opmask registers for the masks. attention.c drives the
 * tiles; the contracts are in kernels.h. */
#include <math.h>

#include "kernels/kernels.h"
#include "kernels/avx512_micro.h"

/* c (rows, 16P) = [alpha c +] a b over K: 12-row tiles, then a 6-row
 * tile for a last 6 rows (rows is a multiple of 6); rows 6g.. of a start
 * at a + g*a_ps; P is a constant at each call site. */
MHA_AVX512_INLINE void row_tiles(float *c, size_t ldc, const float *a, size_t a_ps, size_t a_rs,
                                 size_t a_cs, const float *b, size_t b_ps, size_t ldb,
                                 const float *alpha, int K, int rows, int P) {
    int r = 0;
    for (; r + 12 <= rows; r += 12)
        mha_tile_avx512(c + (size_t)r * ldc, ldc, a + (size_t)(r / 6) * a_ps, a_ps, a_rs, a_cs, b, b_ps,
                        ldb, NULL, alpha ? alpha + r : NULL, K, 12, 16 * P, 12, P, 0);
    if (r < rows)
        mha_tile_avx512(c + (size_t)r * ldc, ldc, a + (size_t)(r / 6) * a_ps, a_ps, a_rs, a_cs, b, b_ps,
                        ldb, NULL, alpha ? alpha + r : NULL, K, 6, 16 * P, 6, P, 0);
}

/* s (rows, 16*npanels) = q k^T; q packed (rows/6, d_k, 6), kt (npanels, d_k, 16):
 * 32 keys (two panels) per tile, 16 for an odd last panel. */
void mha_attn_scores_avx512(float *s, size_t lds, const float *q, const float *kt, int d_k,
                            int rows, int npanels) {
    const size_t ks = (size_t)16 * d_k, qs = (size_t)6 * d_k;
    int p = 0;
    for (; p + 2 <= npanels; p += 2)
        row_tiles(s + (size_t)p * 16, lds, q, qs, 1, 6, kt + (size_t)p * ks, ks, 16, NULL, d_k, rows, 2);
    if (p < npanels)
        row_tiles(s + (size_t)p * 16, lds, q, qs, 1, 6, kt + (size_t)p * ks, ks, 16, NULL, d_k, rows, 1);
}

/* Row max of each row (masking as kernels.h says), then alpha for 16 rows
 * per vector exp, then exp and row sum per row. */
void mha_attn_softmax_avx512(float *s, size_t lds, float *m, float *l, float *alpha,
                             const int *lo, const int *hi, int extra, int rows, int cols) {
    const __m512 ninf = _mm512_set1_ps(-INFINITY);
    const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const int nv = (cols + 15) / 16, nfull = cols / 16;
    /* pass 1: mask and row max, parked in alpha */
    for (int i = 0; i < rows; i++) {
        float *r = s + (size_t)i * lds;
        __m512 mx = ninf;
        if (lo) {
            const __m512i vlo = _mm512_set1_epi32(lo[i]), vhi = _mm512_set1_epi32(hi[i]);
            const __m512i vex = _mm512_set1_epi32(extra), vcols = _mm512_set1_epi32(cols);
            for (int v = 0; v < nv; v++) {
                const __m512i j = _mm512_add_epi32(iota, _mm512_set1_epi32(16 * v));
                __mmask16 in = _mm512_cmpge_epi32_mask(j, vlo) & _mm512_cmple_epi32_mask(j, vhi);
                in = (in | _mm512_cmpge_epi32_mask(j, vex)) & _mm512_cmplt_epi32_mask(j, vcols);
                const __m512 x = _mm512_mask_loadu_ps(ninf, in, r + 16 * v);
                _mm512_storeu_ps(r + 16 * v, x);
                mx = _mm512_max_ps(mx, x);
            }
        } else {
            for (int v = 0; v < nfull; v++) mx = _mm512_max_ps(mx, _mm512_loadu_ps(r + 16 * v));
            if (nfull < nv) {
                const __m512 x = _mm512_mask_loadu_ps(ninf, mha_mask16(cols - 16 * nfull), r + 16 * nfull);
                _mm512_storeu_ps(r + 16 * nfull, x);
                mx = _mm512_max_ps(mx, x);
            }
        }
        alpha[i] = mha_hmax16_avx512(mx);
    }
    /* m_new = max(m, row max); alpha = exp(m - mu) with mu = m_new, or 0
     * while every key so far is masked (exp(-inf - 0) = 0): 16 rows at once */
    for (int i = 0; i < rows; i += 16) {
        const __mmask16 live = mha_mask16(rows - i);
        const __m512 vmo = _mm512_maskz_loadu_ps(live, m + i);
        const __m512 vmn = _mm512_max_ps(vmo, _mm512_maskz_loadu_ps(live, alpha + i));
        const __m512 mu = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(vmn, ninf, _CMP_NEQ_UQ), vmn);
        _mm512_mask_storeu_ps(alpha + i, live, mha_exp_avx512(_mm512_sub_ps(vmo, mu)));
        _mm512_mask_storeu_ps(m + i, live, vmn);
    }
    /* pass 2: exp and row sum (two partial sums, then their sum) */
    for (int i = 0; i < rows; i++) {
        float *r = s + (size_t)i * lds;
        const __m512 vmu = _mm512_set1_ps(m[i] == -INFINITY ? 0.0f : m[i]);
        __m512 sum0 = _mm512_setzero_ps(), sum1 = _mm512_setzero_ps();
        int v = 0;
        for (; v + 1 < nv; v += 2) {
            const __m512 p0 = mha_exp_avx512(_mm512_sub_ps(_mm512_loadu_ps(r + 16 * v), vmu));
            const __m512 p1 = mha_exp_avx512(_mm512_sub_ps(_mm512_loadu_ps(r + 16 * v + 16), vmu));
            _mm512_storeu_ps(r + 16 * v, p0);
            _mm512_storeu_ps(r + 16 * v + 16, p1);
            sum0 = _mm512_add_ps(sum0, p0);
            sum1 = _mm512_add_ps(sum1, p1);
        }
        if (v < nv) {
            const __m512 p0 = mha_exp_avx512(_mm512_sub_ps(_mm512_loadu_ps(r + 16 * v), vmu));
            _mm512_storeu_ps(r + 16 * v, p0);
            sum0 = _mm512_add_ps(sum0, p0);
        }
        l[i] = alpha[i] * l[i] + mha_hsum16_avx512(_mm512_add_ps(sum0, sum1));
    }
}

/* o (rows, dv16) = alpha o + p (rows, nk) v (nk, dv16): 32 columns per
 * tile, 16 for an odd last 16. */
void mha_attn_pv_avx512(float *o, size_t ldo, const float *p, size_t ldp, const float *v,
                        size_t ldv, const float *alpha, int rows, int nk, int dv16) {
    const size_t ps = (size_t)6 * ldp;
    int c = 0;
    for (; c + 32 <= dv16; c += 32) row_tiles(o + c, ldo, p, ps, ldp, 1, v + c, 16, ldv, alpha, nk, rows, 2);
    if (c < dv16) row_tiles(o + c, ldo, p, ps, ldp, 1, v + c, 16, ldv, alpha, nk, rows, 1);
}
