/* avx512_attention.c — the three steps of one flash-attention tile
 * (AVX-512): scores s = q k^T on 12x32 register tiles (6-row tiles for a
 * last group of 6 rows), o = alpha o + p v on 6x64 ones, the online-softmax
 * update with opmask registers for the masks; and the ALiBi bias of a
 * tile. attention.c drives the tiles; the contracts are in kernels.h. */
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

/* exp(x) for the softmax (kernels.h: MHA_SOFTMAX_EXP_*), 0 for x <
 * MHA_SOFTMAX_FLUSH (kernels.h): probabilities and rescale factors that
 * small would only feed subnormal products to the p v tiles (ALiBi's far
 * keys, a max that keeps growing), each an FP assist of ~100 cycles on
 * Intel cores, while adding nothing above fp32 rounding to a row whose
 * sum l is >= 1. x <= 0 here (x = s - row max), so no clamp: -inf and NaN
 * fail the compare and the masked product gives 0 (the flush costs no
 * extra operation). avx2_attention.c's softmax_exp takes the same steps. */
MHA_AVX512_INLINE __m512 exp_flushed(__m512 x) {
    const __mmask16 keep = _mm512_cmp_ps_mask(x, _mm512_set1_ps(MHA_SOFTMAX_FLUSH), _CMP_GE_OQ);
    const __m512 shift = _mm512_set1_ps(12583039.0f); /* 0x1.8p23 + 127 */
    const __m512 t = _mm512_fmadd_ps(x, _mm512_set1_ps(1.44269504088896341f), shift);
    const __m512 n = _mm512_sub_ps(t, shift);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(MHA_SOFTMAX_EXP_C5);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(MHA_SOFTMAX_EXP_C4));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(MHA_SOFTMAX_EXP_C3));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(MHA_SOFTMAX_EXP_C2));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    const __m512i e = _mm512_slli_epi32(_mm512_castps_si512(t), 23);
    return _mm512_maskz_mul_ps(keep, p, _mm512_castsi512_ps(e));
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
        _mm512_mask_storeu_ps(alpha + i, live, exp_flushed(_mm512_sub_ps(vmo, mu)));
        _mm512_mask_storeu_ps(m + i, live, vmn);
    }
    /* pass 2: exp and row sum (two partial sums, then their sum) */
    for (int i = 0; i < rows; i++) {
        float *r = s + (size_t)i * lds;
        const __m512 vmu = _mm512_set1_ps(m[i] == -INFINITY ? 0.0f : m[i]);
        __m512 sum0 = _mm512_setzero_ps(), sum1 = _mm512_setzero_ps();
        int v = 0;
        for (; v + 1 < nv; v += 2) {
            const __m512 p0 = exp_flushed(_mm512_sub_ps(_mm512_loadu_ps(r + 16 * v), vmu));
            const __m512 p1 = exp_flushed(_mm512_sub_ps(_mm512_loadu_ps(r + 16 * v + 16), vmu));
            _mm512_storeu_ps(r + 16 * v, p0);
            _mm512_storeu_ps(r + 16 * v + 16, p1);
            sum0 = _mm512_add_ps(sum0, p0);
            sum1 = _mm512_add_ps(sum1, p1);
        }
        if (v < nv) {
            const __m512 p0 = exp_flushed(_mm512_sub_ps(_mm512_loadu_ps(r + 16 * v), vmu));
            _mm512_storeu_ps(r + 16 * v, p0);
            sum0 = _mm512_add_ps(sum0, p0);
        }
        l[i] = alpha[i] * l[i] + mha_hsum16_avx512(_mm512_add_ps(sum0, sum1));
    }
}

/* o (rows, dv16) = alpha o + p (rows, nk) v (nk, dv16): 6x64 tiles, then
 * 12x32 (6x32 for a last 6 rows), 16 columns for an odd last 16. */
void mha_attn_pv_avx512(float *o, size_t ldo, const float *p, size_t ldp, const float *v,
                        size_t ldv, const float *alpha, int rows, int nk, int dv16) {
    const size_t ps = (size_t)6 * ldp;
    int c = 0;
    /* 6 rows x 64 columns: each k loads 4 v panels for 6 broadcasts of p,
     * and a v row is read whole while it is in L1 (7% faster than 12x32
     * on a hot 48x128 tile); the FMA chains are the same */
    for (; c + 64 <= dv16; c += 64)
        for (int r = 0; r < rows; r += 6)
            mha_tile_avx512(o + (size_t)r * ldo + c, ldo, p + (size_t)r * ldp, ps, ldp, 1, v + c, 16, ldv,
                            NULL, alpha + r, nk, 6, 64, 6, 4, 0);
    for (; c + 32 <= dv16; c += 32) row_tiles(o + c, ldo, p, ps, ldp, 1, v + c, 16, ldv, alpha, nk, rows, 2);
    if (c < dv16) row_tiles(o + c, ldo, p, ps, ldp, 1, v + c, 16, ldv, alpha, nk, rows, 1);
}

/* s -= slope * |qpos_i - kpos_j|: the distance in int lanes, converted
 * to float with one rounding (as the scalar kernel's cast), then its
 * product and subtraction: the scalar kernel's bits. */
void mha_attn_alibi_avx512(float *s, size_t lds, const int *qpos, const int *kpos, float slope,
                           int rows, int cols) {
    const __m512 vs = _mm512_set1_ps(slope);
    for (int i = 0; i < rows; i++) {
        float *r = s + (size_t)i * lds;
        const __m512i pi = _mm512_set1_epi32(qpos[i]);
        for (int j = 0; j < cols; j += 16) {
            const __mmask16 k = mha_mask16(cols - j);
            const __m512i d = _mm512_abs_epi32(_mm512_sub_epi32(pi, _mm512_maskz_loadu_epi32(k, kpos + j)));
            const __m512 x = _mm512_maskz_loadu_ps(k, r + j);
            _mm512_mask_storeu_ps(r + j, k, _mm512_sub_ps(x, _mm512_mul_ps(vs, _mm512_cvtepi32_ps(d))));
        }
    }
}

/* Query packing: a full group of 6 rows is loaded 16 dims per row and
 * scaled (one product per element, as the scalar kernel), then
 * transposed in registers into the 96-float block of those 16 dims
 * (output t is row t%6, dim t/6): each output vector takes its lanes
 * from the three row pairs by three two-source permutes and two blends.
 * 3.8x faster than the 16-element gathers it replaces on Zen 5 (a head
 * of P1: 13.7 -> 3.6 us; bench/LIMITS.md, round 11). Partial groups and a d_k
 * tail go element by element. */
void mha_attn_pack_q_avx512(float *dst, const float *src, size_t src_rs, float scale, int rows, int rows6,
                            int d_k) {
    const __m512 vs = _mm512_set1_ps(scale);
    const int e16 = d_k / 16 * 16;
    __m512i idx[6];       /* output vector j: each lane's dim, + 16 for the odd row of its pair */
    __mmask16 from[6][3]; /* the lanes of output j that row pair p (rows 2p, 2p+1) fills */
    const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    for (int j = 0; j < 6; j++) {
        const __m512i t = _mm512_add_epi32(iota, _mm512_set1_epi32(16 * j));           /* 0 .. 95 */
        const __m512i dim = _mm512_srli_epi32(_mm512_mullo_epi32(t, _mm512_set1_epi32(43)), 8); /* t / 6 */
        const __m512i row = _mm512_sub_epi32(t, _mm512_mullo_epi32(dim, _mm512_set1_epi32(6)));
        idx[j] = _mm512_add_epi32(dim, _mm512_slli_epi32(_mm512_and_si512(row, _mm512_set1_epi32(1)), 4));
        for (int p = 0; p < 3; p++)
            from[j][p] = _mm512_cmpeq_epi32_mask(_mm512_srli_epi32(row, 1), _mm512_set1_epi32(p));
    }
    for (int g = 0; g < rows6 / 6; g++) {
        float *d = dst + (size_t)g * d_k * 6;
        const float *x = src + (size_t)g * 6 * src_rs;
        const int full = 6 * g + 6 <= rows;
        int e = 0;
        for (; full && e < e16; e += 16) {
            __m512 r[6];
            for (int i = 0; i < 6; i++) r[i] = _mm512_mul_ps(vs, _mm512_loadu_ps(x + (size_t)i * src_rs + e));
            for (int j = 0; j < 6; j++) {
                __m512 o = _mm512_permutex2var_ps(r[0], idx[j], r[1]);
                o = _mm512_mask_mov_ps(o, from[j][1], _mm512_permutex2var_ps(r[2], idx[j], r[3]));
                o = _mm512_mask_mov_ps(o, from[j][2], _mm512_permutex2var_ps(r[4], idx[j], r[5]));
                _mm512_storeu_ps(d + (size_t)e * 6 + 16 * j, o);
            }
        }
        for (; e < d_k; e++)
            for (int i = 0; i < 6; i++) d[(size_t)e * 6 + i] = 6 * g + i < rows ? scale * x[(size_t)i * src_rs + e] : 0.0f;
    }
}
