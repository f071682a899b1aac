/* avx512_decode.c — AVX-512 decode kernels (see decode_kernels.h), built
 * with -mavx512f/bw/vl/dq -mfma -mf16c; chosen only after the CPU and the
 * OS were checked. One zmm holds 16 keys: two 8-key K panels side by side
 * (keys 8p..8p+15 are contiguous in s), or 16 columns of V / a weight.
 * Column tails are masked vector operations: each lane is the same FMA
 * chain in key (or k) order as a full vector, so results never depend on
 * where a caller splits the columns.
 * Legend: m query rows, n keys (or output columns), d = d_k, dv = d_v. */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "kernels/decode_kernels.h"
#include "kernels/prefetch_stream.h"
#include "kernels/avx512_micro.h"
#include "kernels/kernels.h"

#define INLINE MHA_AVX512_INLINE

#define UNROLL _Pragma("GCC unroll 8")

/* 16 fp32 values from two runs of 8 at element offsets i0 and i1 of an
 * fp32 (H = 0) or fp16 (H = 1) array (i1 < 0: the upper 8 lanes are 0). */
INLINE __m512 load_2x8(const void *base, size_t i0, long i1, int H) {
    if (H) {
        const uint16_t *h = base;
        __m256i x = _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(h + i0)));
        x = i1 >= 0 ? _mm256_inserti128_si256(x, _mm_loadu_si128((const __m128i *)(h + i1)), 1)
                    : _mm256_zextsi128_si256(_mm256_castsi256_si128(x));
        return _mm512_cvtph_ps(x);
    }
    const float *f = base;
    __m512 x = _mm512_zextps256_ps512(_mm256_loadu_ps(f + i0));
    return i1 >= 0 ? _mm512_insertf32x8(x, _mm256_loadu_ps(f + i1), 1) : x;
}

/* up to 16 consecutive elements (mask k) of an fp32 or fp16 array as fp32 */
INLINE __m512 load16(const void *base, size_t i, __mmask16 k, int H) {
    if (H) return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(k, (const uint16_t *)base + i));
    return _mm512_maskz_loadu_ps(k, (const float *)base + i);
}

/* ------------------------------------------------------------- scores */

/* 16 int8 values from two runs of 8 at element offsets i0 and i1 (i1 < 0:
 * the upper 8 lanes are 0) as fp32 (exact: no scale here). */
INLINE __m512 load_2x8q(const int8_t *kq, size_t i0, long i1) {
    __m128i b = _mm_loadl_epi64((const __m128i *)(kq + i0));
    if (i1 >= 0) b = _mm_unpacklo_epi64(b, _mm_loadl_epi64((const __m128i *)(kq + i1)));
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b));
}

#define NB(d) (((d) + MHA_Q8_BLOCK - 1) / MHA_Q8_BLOCK)

/* R rows x P zmm of scores (2P panels from panel p0 on; the last zmm holds
 * one panel when half is set); R, P, H are constants at each call site.
 * H = 2: int8 panels with their scales ks (paneled, see MHA_Q8_BLOCK):
 * each block of 32 dims sums q * (float)k into blk, then acc = fma(blk,
 * scale, acc): one scale per block, not per element (the rounding of
 * scores_q8 in decode_kernels.h). */
INLINE void scores_tile(float *s, int lds, const float *q, int ldq, const void *kp, const float *ks, int p0,
                        int d, int R, int P, int half, int H, pf_stream *pf) {
    const size_t ps = (size_t)d * MHA_KPANEL;
    __m512 acc[4][4], blk[4][4];
    UNROLL
    for (int r = 0; r < R; r++)
        UNROLL
        for (int p = 0; p < P; p++) acc[r][p] = _mm512_setzero_ps();
    for (int c0 = 0; c0 < d; c0 += MHA_Q8_BLOCK) {
        const int c1 = H == 2 && c0 + MHA_Q8_BLOCK < d ? c0 + MHA_Q8_BLOCK : d;
        UNROLL
        for (int r = 0; r < R; r++)
            UNROLL
            for (int p = 0; p < P; p++) blk[r][p] = H == 2 ? _mm512_setzero_ps() : acc[r][p];
        for (int c = c0; c < c1; c++) {
            pf_step(pf);
            __m512 k[4];
            UNROLL
            for (int p = 0; p < P; p++) {
                const size_t i0 = (size_t)(p0 + 2 * p) * ps + (size_t)c * MHA_KPANEL;
                const long i1 = (half && p == P - 1) ? -1 : (long)(i0 + ps);
                k[p] = H == 2 ? load_2x8q((const int8_t *)kp, i0, i1) : load_2x8(kp, i0, i1, H);
            }
            UNROLL
            for (int r = 0; r < R; r++) {
                const __m512 qb = _mm512_set1_ps(q[(size_t)r * ldq + c]);
                UNROLL
                for (int p = 0; p < P; p++) blk[r][p] = _mm512_fmadd_ps(qb, k[p], blk[r][p]);
            }
        }
        if (H != 2) {
            UNROLL
            for (int r = 0; r < R; r++)
                UNROLL
                for (int p = 0; p < P; p++) acc[r][p] = blk[r][p];
            break; /* fp32 / fp16: one pass over all of d */
        }
        UNROLL
        for (int p = 0; p < P; p++) {
            const size_t s0 = ((size_t)(p0 + 2 * p) * NB(d) + (size_t)(c0 / MHA_Q8_BLOCK)) * MHA_KPANEL;
            const __m512 sc = load_2x8(ks, s0, (half && p == P - 1) ? -1 : (long)(s0 + (size_t)NB(d) * MHA_KPANEL), 0);
            UNROLL
            for (int r = 0; r < R; r++) acc[r][p] = _mm512_fmadd_ps(blk[r][p], sc, acc[r][p]);
        }
    }
    UNROLL
    for (int r = 0; r < R; r++)
        UNROLL
        for (int p = 0; p < P; p++)
            _mm512_mask_storeu_ps(s + (size_t)r * lds + (size_t)(p0 + 2 * p) * MHA_KPANEL,
                                  (half && p == P - 1) ? (__mmask16)0xff : (__mmask16)0xffff, acc[r][p]);
}

/* Panels outermost: 6 K panels (6 x d x 8) stay in L1 while every row
 * group uses them (GQA/MQA share keys). */
INLINE void scores_impl(float *s, int lds, const float *q, int ldq, const void *kp, const float *ks, int m,
                        int n, int d, int H) {
    const int np = n / MHA_KPANEL, m4 = m - m % 4;
    pf_stream pf = pf_tls;
    int p = 0;
    for (; p + 6 <= np; p += 6)
        for (int i = 0; i < m4; i += 4)
            scores_tile(s + (size_t)i * lds, lds, q + (size_t)i * ldq, ldq, kp, ks, p, d, 4, 3, 0, H, &pf);
    for (; p + 4 <= np; p += 4)
        for (int i = 0; i < m4; i += 4)
            scores_tile(s + (size_t)i * lds, lds, q + (size_t)i * ldq, ldq, kp, ks, p, d, 4, 2, 0, H, &pf);
    for (; p + 2 <= np; p += 2)
        for (int i = 0; i < m4; i += 4)
            scores_tile(s + (size_t)i * lds, lds, q + (size_t)i * ldq, ldq, kp, ks, p, d, 4, 1, 0, H, &pf);
    if (p < np)
        for (int i = 0; i < m4; i += 4)
            scores_tile(s + (size_t)i * lds, lds, q + (size_t)i * ldq, ldq, kp, ks, p, d, 4, 1, 1, H, &pf);
    for (int i = m4; i < m; i++) {
        float *si = s + (size_t)i * lds;
        const float *qi = q + (size_t)i * ldq;
        p = 0;
        for (; p + 8 <= np; p += 8) scores_tile(si, lds, qi, ldq, kp, ks, p, d, 1, 4, 0, H, &pf);
        for (; p + 2 <= np; p += 2) scores_tile(si, lds, qi, ldq, kp, ks, p, d, 1, 1, 0, H, &pf);
        if (p < np) scores_tile(si, lds, qi, ldq, kp, ks, p, d, 1, 1, 1, H, &pf);
    }
    pf_tls.cur = pf.cur;
}

/* d_k = 64 (the common head size) as a constant: the panel offsets become
 * displacements, one pointer step per dimension instead of one per zmm
 * (scalar adds and compares share ports 0 and 5 with the vector work). */
#define D_SPECIAL 64

static void scores_avx512(float *s, int lds, const float *q, int ldq, const float *kp, int m, int n,
                          int d) {
    if (d == D_SPECIAL) scores_impl(s, lds, q, ldq, kp, NULL, m, n, D_SPECIAL, 0);
    else scores_impl(s, lds, q, ldq, kp, NULL, m, n, d, 0);
}

static void scores_h_avx512(float *s, int lds, const float *q, int ldq, const uint16_t *kp, int m,
                            int n, int d) {
    if (d == D_SPECIAL) scores_impl(s, lds, q, ldq, kp, NULL, m, n, D_SPECIAL, 1);
    else scores_impl(s, lds, q, ldq, kp, NULL, m, n, d, 1);
}

static void scores_q8_avx512(float *s, int lds, const float *q, int ldq, const int8_t *kq, const float *ks,
                             int m, int n, int d) {
    if (d == D_SPECIAL) scores_impl(s, lds, q, ldq, kq, ks, m, n, D_SPECIAL, 2);
    else scores_impl(s, lds, q, ldq, kq, ks, m, n, d, 2);
}

/* ------------------------------------------------------------ softmax */

/* exp(x) for x <= 0: exactly 0 below -87 (including -inf), as the AVX2
 * decode softmax does. */
INLINE __m512 exp_cut(__m512 x) {
    const __mmask16 keep = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.0f), _CMP_GE_OQ);
    return _mm512_maskz_mov_ps(keep, mha_exp_avx512(x));
}

/* R rows at a time (R a constant): their max and sum chains interleave,
 * each row's in key order as before (one row alone waits on the latency
 * of its one chain). A row of only -inf: M = -inf, x - M = NaN, which
 * exp_cut's ordered compare turns into 0: zeros, sum 0, mx -inf. */
INLINE void softmax_rows(float *s, int lds, float *mx, float *sum, int n, int R) {
    __m512 vm[4], vM[4], vs[4];
    UNROLL
    for (int r = 0; r < R; r++) vm[r] = _mm512_set1_ps(-INFINITY), vs[r] = _mm512_setzero_ps();
    for (int j = 0; j < n; j += 16) {
        const __mmask16 k = mha_mask16(n - j);
        UNROLL
        for (int r = 0; r < R; r++)
            vm[r] = _mm512_mask_max_ps(vm[r], k, vm[r], _mm512_maskz_loadu_ps(k, s + (size_t)r * lds + j));
    }
    UNROLL
    for (int r = 0; r < R; r++) mx[r] = mha_hmax16_avx512(vm[r]), vM[r] = _mm512_set1_ps(mx[r]);
    for (int j = 0; j < n; j += 16) {
        const __mmask16 k = mha_mask16(n - j);
        UNROLL
        for (int r = 0; r < R; r++) {
            float *row = s + (size_t)r * lds;
            const __m512 e = _mm512_maskz_mov_ps(k, exp_cut(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, row + j), vM[r])));
            _mm512_mask_storeu_ps(row + j, k, e);
            vs[r] = _mm512_add_ps(vs[r], e);
        }
    }
    UNROLL
    for (int r = 0; r < R; r++) sum[r] = mha_hsum16_avx512(vs[r]);
}

static void softmax_avx512(float *s, int lds, float *mx, float *sum, int m, int n) {
    int i = 0;
    for (; i + 4 <= m; i += 4) softmax_rows(s + (size_t)i * lds, lds, mx + i, sum + i, n, 4);
    for (; i < m; i++) softmax_rows(s + (size_t)i * lds, lds, mx + i, sum + i, n, 1);
}

/* --------------------------------------------------------- accumulate */

/* up to 16 consecutive int8 values (mask k) as fp32 (exact) */
INLINE __m512 load16q(const int8_t *v, size_t i, __mmask16 k) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(k, v + i)));
}

/* acc (R, 16 C) from column c0 on = the accumulators a, the last vector
 * of each row masked by klast. */
INLINE void store_acc(float *acc, int ldacc, __m512 a[4][4], int c0, __mmask16 klast, int R, int C) {
    UNROLL
    for (int r = 0; r < R; r++)
        UNROLL
        for (int c = 0; c < C; c++)
            _mm512_mask_storeu_ps(acc + (size_t)r * ldacc + c0 + 16 * c,
                                  c == C - 1 ? klast : (__mmask16)0xffff, a[r][c]);
}

/* R rows x C vectors of acc = p v over n keys (columns from c0 on, a
 * multiple of 16, so each vector lies in one block of 32, and of 32 when
 * H = 2 and C > 1, so vectors 2k and 2k+1 share a block; the last
 * vector masked by klast; v row stride dv; H = 2: int8 rows with scales
 * vs (n, ceil(dv/32)), each scale folded into the weight: p_j * scale). */
INLINE void acc_tile(float *acc, int ldacc, const float *p, int ldp, const void *v, const float *vs, int c0,
                     int dv, int n, __mmask16 klast, int R, int C, int H, pf_stream *pf) {
    __m512 a[4][4];
    UNROLL
    for (int r = 0; r < R; r++)
        UNROLL
        for (int c = 0; c < C; c++) a[r][c] = _mm512_setzero_ps();
    for (int j = 0; j < n; j++) {
        pf_step(pf);
        __m512 vv[4];
        UNROLL
        for (int c = 0; c < C; c++)
            vv[c] = H == 2 ? load16q((const int8_t *)v, (size_t)j * dv + c0 + 16 * c, c == C - 1 ? klast : (__mmask16)0xffff)
                           : load16(v, (size_t)j * dv + c0 + 16 * c, c == C - 1 ? klast : (__mmask16)0xffff, H);
        UNROLL
        for (int r = 0; r < R; r++) {
            const float pj = p[(size_t)r * ldp + j];
            __m512 pb = _mm512_set1_ps(pj);
            UNROLL
            for (int c = 0; c < C; c++) {
                /* int8: the block's scale folded into the weight, p * scale,
                 * once per block (vector pairs from c0 % 32 == 0 share one) */
                if (H == 2 && c % 2 == 0)
                    pb = _mm512_set1_ps(pj * vs[(size_t)j * NB(dv) + (size_t)c0 / MHA_Q8_BLOCK + (size_t)c / 2]);
                a[r][c] = _mm512_fmadd_ps(pb, vv[c], a[r][c]);
            }
        }
    }
    store_acc(acc, ldacc, a, c0, klast, R, C);
}

#define PW_KEYS 64 /* keys per block of precomputed int8 weights (acc_tile_q8) */

/* int8 V: R rows x C vectors of acc = p v as acc_tile with H = 2, the
 * scaled weights p_j * scale(j, block) computed first for PW_KEYS keys at
 * a time, 16 keys per vector product (the same fp32 product, so the same
 * bits), into pw: the FMA loop then broadcasts them from memory (a load)
 * instead of a scalar product and a register broadcast per row, key and
 * block, which took the FMA port (p5) from every other FMA. */
INLINE void acc_tile_q8(float *acc, int ldacc, const float *p, int ldp, const int8_t *v, const float *vs, int c0,
                        int dv, int n, __mmask16 klast, int R, int C, pf_stream *pf) {
    const int nb = NB(dv), b0 = c0 / MHA_Q8_BLOCK, NBL = (C + 1) / 2; /* blocks the tile covers */
    float pw[4][2][PW_KEYS] __attribute__((aligned(64)));
    __m512i idx = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                     _mm512_set1_epi32(nb));
    const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
    /* nb 4: from two rows of 4 keys x 4 scales, lane 2k + l = key k, block
     * b0 + l (k = 0..7, l = 0, 1): index 16 (k / 4) + 4 (k % 4) + b0 + l */
    const __m512i pick4 = _mm512_add_epi32(_mm512_setr_epi32(0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29),
                                           _mm512_set1_epi32(b0));
    __m512 a[4][4];
    UNROLL
    for (int r = 0; r < R; r++)
        UNROLL
        for (int c = 0; c < C; c++) a[r][c] = _mm512_setzero_ps();
    for (int j0 = 0; j0 < n; j0 += PW_KEYS) {
        const int nk = n - j0 < PW_KEYS ? n - j0 : PW_KEYS;
        for (int jj = 0; jj < nk; jj += 16) {
            const __mmask16 km = mha_mask16(nk - jj);
            /* d_v 64 or 128 (two or four blocks, the common head sizes):
             * the 16 keys' scale rows are two or four loads, their two
             * blocks picked by permutes (a 16-element gather costs ~20
             * cycles on Zen 5; two per 16 keys were 10% of this tile) */
            __m512 sc2[2];
            const int loads = NBL == 2 && (nb == 2 || nb == 4);
            if (loads) {
                const float *vj = vs + (size_t)(j0 + jj) * nb;
                const int live = nb * (nk - jj); /* floats of the live keys */
                __m512 z[4];
                for (int i = 0; i < nb; i++) z[i] = _mm512_maskz_loadu_ps(mha_mask16(live - 16 * i), vj + 16 * i);
                if (nb == 4) { /* keys 0-7 and 8-15, blocks b0, b0+1 interleaved */
                    z[0] = _mm512_permutex2var_ps(z[0], pick4, z[1]);
                    z[1] = _mm512_permutex2var_ps(z[2], pick4, z[3]);
                }
                sc2[0] = _mm512_permutex2var_ps(z[0], even, z[1]), sc2[1] = _mm512_permutex2var_ps(z[0], odd, z[1]);
            }
            UNROLL
            for (int bl = 0; bl < NBL; bl++) {
                const __m512 sc = loads ? sc2[bl]
                                        : _mm512_mask_i32gather_ps(_mm512_setzero_ps(), km, idx,
                                                                   vs + (size_t)(j0 + jj) * nb + b0 + bl, 4);
                UNROLL
                for (int r = 0; r < R; r++)
                    _mm512_store_ps(&pw[r][bl][jj],
                                    _mm512_mul_ps(_mm512_maskz_loadu_ps(km, p + (size_t)r * ldp + j0 + jj), sc));
            }
        }
        for (int j = 0; j < nk; j++) {
            pf_step(pf);
            __m512 vv[4];
            UNROLL
            for (int c = 0; c < C; c++)
                vv[c] = load16q(v, (size_t)(j0 + j) * dv + c0 + 16 * c, c == C - 1 ? klast : (__mmask16)0xffff);
            UNROLL
            for (int r = 0; r < R; r++)
                UNROLL
                for (int c = 0; c < C; c++) a[r][c] = _mm512_fmadd_ps(_mm512_set1_ps(pw[r][c / 2][j]), vv[c], a[r][c]);
        }
    }
    store_acc(acc, ldacc, a, c0, klast, R, C);
}

/* Column blocks outermost: an (n, 48) slab of V stays in L1 while every
 * row group uses it. */
INLINE void acc_impl(float *acc, int ldacc, const float *p, int ldp, const void *v, const float *vs, int m,
                     int n, int dv, int H) {
    const int m4 = m - m % 4;
    pf_stream pf = pf_tls;
    int c = 0;
    /* int8: tiles of more than one vector start at a multiple of 32 */
    for (; H == 2 && c + 64 <= dv; c += 64)
        for (int i = 0; i < m4; i += 4)
            acc_tile_q8(acc + (size_t)i * ldacc, ldacc, p + (size_t)i * ldp, ldp, v, vs, c, dv, n, 0xffff, 4, 4, &pf);
    for (; H != 2 && c + 64 <= dv; c += 64) /* 16 accumulators: 4 rows x 64 columns (GQA, d_v 64) */
        for (int i = 0; i < m4; i += 4)
            acc_tile(acc + (size_t)i * ldacc, ldacc, p + (size_t)i * ldp, ldp, v, vs, c, dv, n, 0xffff, 4, 4, H,
                     &pf);
    for (; H != 2 && c + 48 <= dv; c += 48)
        for (int i = 0; i < m4; i += 4)
            acc_tile(acc + (size_t)i * ldacc, ldacc, p + (size_t)i * ldp, ldp, v, vs, c, dv, n, 0xffff, 4, 3, H, &pf);
    for (; c < dv; c += 16)
        for (int i = 0; i < m4; i += 4)
            acc_tile(acc + (size_t)i * ldacc, ldacc, p + (size_t)i * ldp, ldp, v, vs, c, dv, n, mha_mask16(dv - c), 4,
                     1, H, &pf);
    for (int i = m4; i < m; i++) {
        float *a = acc + (size_t)i * ldacc;
        const float *pi = p + (size_t)i * ldp;
        c = 0;
        for (; c + 64 <= dv; c += 64) acc_tile(a, ldacc, pi, ldp, v, vs, c, dv, n, 0xffff, 1, 4, H, &pf);
        for (; c < dv; c += 16) acc_tile(a, ldacc, pi, ldp, v, vs, c, dv, n, mha_mask16(dv - c), 1, 1, H, &pf);
    }
    pf_tls.cur = pf.cur;
}

static void accumulate_avx512(float *acc, int ldacc, const float *p, int ldp, const float *v, int m,
                              int n, int dv) {
    if (dv == D_SPECIAL) acc_impl(acc, ldacc, p, ldp, v, NULL, m, n, D_SPECIAL, 0);
    else acc_impl(acc, ldacc, p, ldp, v, NULL, m, n, dv, 0);
}

static void accumulate_h_avx512(float *acc, int ldacc, const float *p, int ldp, const uint16_t *v,
                                int m, int n, int dv) {
    if (dv == D_SPECIAL) acc_impl(acc, ldacc, p, ldp, v, NULL, m, n, D_SPECIAL, 1);
    else acc_impl(acc, ldacc, p, ldp, v, NULL, m, n, dv, 1);
}

static void accumulate_q8_avx512(float *acc, int ldacc, const float *p, int ldp, const int8_t *vq,
                                 const float *vs, int m, int n, int dv) {
    if (dv == D_SPECIAL) acc_impl(acc, ldacc, p, ldp, vq, vs, m, n, D_SPECIAL, 2);
    else acc_impl(acc, ldacc, p, ldp, vq, vs, m, n, dv, 2);
}

/* --------------------------------------------------------------- gemm */

/* y (m, n) += x (m, k) w (k, n) (m <= 4 in one pass): one row of w at a
 * time, each vector loaded once and added into the m rows of y (in L1), so the
 * weights are read in address order, one stream (a task's rows are one
 * contiguous run). Four rows of w per pass (four streams at the row
 * stride) read a cold matrix at ~70% of the rate of one stream on Zen 5;
 * the extra y loads and stores cost nothing at memory speed, if made in
 * 256-bit halves on Zen 4 (mha_fma_into_avx512). Each y element's
 * additions stay in the order of k. */
INLINE void stream_rows(float *y, int ldy, const float *x, int ldx, const float *w, int ldw, const int m, int k,
                        int n, const int halves) {
    for (int kk = 0; kk < k; kk++) {
        const float *wk = w + (size_t)kk * ldw;
        __m512 xb[4];
        UNROLL
        for (int r = 0; r < m; r++) xb[r] = _mm512_set1_ps(x[(size_t)r * ldx + kk]);
        int j = 0;
        for (; j + 16 <= n; j += 16) {
            const __m512 wv = _mm512_loadu_ps(wk + j);
            UNROLL
            for (int r = 0; r < m; r++) mha_fma_into_avx512(y + (size_t)r * ldy + j, xb[r], wv, 0, halves);
        }
        if (j < n) {
            const __mmask16 km = mha_mask16(n - j);
            const __m512 wv = _mm512_maskz_loadu_ps(km, wk + j);
            UNROLL
            for (int r = 0; r < m; r++) {
                float *yr = y + (size_t)r * ldy + j;
                _mm512_mask_storeu_ps(yr, km, _mm512_fmadd_ps(xb[r], wv, _mm512_maskz_loadu_ps(km, yr)));
            }
        }
    }
}

static void gemm_stream_avx512(float *y, int ldy, const float *x, int ldx, const float *w, int ldw,
                               int m, int k, int n) {
    const int halves = mha_cpu_halves_512();
    for (int r = 0; r < m; r += 4) { /* rows and halves constants in each copy: xb in registers */
        float *yr = y + (size_t)r * ldy;
        const float *xr = x + (size_t)r * ldx;
        switch ((m - r < 4 ? m - r : 4) * 2 + halves) {
        case 2: stream_rows(yr, ldy, xr, ldx, w, ldw, 1, k, n, 0); break;
        case 3: stream_rows(yr, ldy, xr, ldx, w, ldw, 1, k, n, 1); break;
        case 4: stream_rows(yr, ldy, xr, ldx, w, ldw, 2, k, n, 0); break;
        case 5: stream_rows(yr, ldy, xr, ldx, w, ldw, 2, k, n, 1); break;
        case 6: stream_rows(yr, ldy, xr, ldx, w, ldw, 3, k, n, 0); break;
        case 7: stream_rows(yr, ldy, xr, ldx, w, ldw, 3, k, n, 1); break;
        case 8: stream_rows(yr, ldy, xr, ldx, w, ldw, 4, k, n, 0); break;
        default: stream_rows(yr, ldy, xr, ldx, w, ldw, 4, k, n, 1); break;
        }
    }
}

/* R rows x C vectors of y = x w over all of k (last vector masked). */
INLINE void gemm_tile_rc(float *y, int ldy, const float *x, int ldx, const float *w, int ldw, int k,
                         __mmask16 klast, int R, int C) {
    __m512 a[4][2];
    UNROLL
    for (int r = 0; r < R; r++)
        UNROLL
        for (int c = 0; c < C; c++) a[r][c] = _mm512_setzero_ps();
    for (int kk = 0; kk < k; kk++) {
        __m512 wv[2];
        UNROLL
        for (int c = 0; c < C; c++)
            wv[c] = _mm512_maskz_loadu_ps(c == C - 1 ? klast : (__mmask16)0xffff, w + (size_t)kk * ldw + c * 16);
        UNROLL
        for (int r = 0; r < R; r++) {
            const __m512 xb = _mm512_set1_ps(x[(size_t)r * ldx + kk]);
            UNROLL
            for (int c = 0; c < C; c++) a[r][c] = _mm512_fmadd_ps(xb, wv[c], a[r][c]);
        }
    }
    UNROLL
    for (int r = 0; r < R; r++)
        UNROLL
        for (int c = 0; c < C; c++)
            _mm512_mask_storeu_ps(y + (size_t)r * ldy + c * 16, c == C - 1 ? klast : (__mmask16)0xffff, a[r][c]);
}

static void gemm_tile_avx512(float *y, int ldy, const float *x, int ldx, const float *w, int ldw,
                             int m, int k, int n) {
    for (int i = 0; i < m; i += 4) {
        const int R = m - i < 4 ? m - i : 4;
        const float *xi = x + (size_t)i * ldx;
        float *yi = y + (size_t)i * ldy;
        int j = 0;
        for (; j + 32 <= n; j += 32) {
            if (R == 4) gemm_tile_rc(yi + j, ldy, xi, ldx, w + j, ldw, k, 0xffff, 4, 2);
            else
                for (int r = 0; r < R; r++)
                    gemm_tile_rc(yi + (size_t)r * ldy + j, ldy, xi + (size_t)r * ldx, ldx, w + j, ldw, k, 0xffff, 1, 2);
        }
        for (; j < n; j += 16) {
            const __mmask16 km = mha_mask16(n - j);
            if (R == 4) gemm_tile_rc(yi + j, ldy, xi, ldx, w + j, ldw, k, km, 4, 1);
            else
                for (int r = 0; r < R; r++)
                    gemm_tile_rc(yi + (size_t)r * ldy + j, ldy, xi + (size_t)r * ldx, ldx, w + j, ldw, k, km, 1, 1);
        }
    }
}

/* y = a y + b x with the rounding of the scalar expression y*a + x*b
 * (a product, a product, a sum: no FMA), lane by lane. */
static void axpby_avx512(float *y, const float *x, float a, float b, int n) {
    const __m512 va = _mm512_set1_ps(a), vb = _mm512_set1_ps(b);
    for (int i = 0; i < n; i += 16) {
        const __mmask16 k = mha_mask16(n - i);
        const __m512 p = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, y + i), va);
        const __m512 q = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, x + i), vb);
        _mm512_mask_storeu_ps(y + i, k, _mm512_add_ps(p, q));
    }
}

/* --------------------------------------------------------------- fp16 */

static void to_f16_avx512(uint16_t *dst, const float *src, size_t n) {
    for (size_t i = 0; i < n; i += 16) {
        const __mmask16 k = mha_mask16((int)(n - i < 16 ? n - i : 16));
        const __m256i h = _mm512_cvtps_ph(_mm512_maskz_loadu_ps(k, src + i),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        _mm256_mask_storeu_epi16(dst + i, k, h);
    }
}

static void from_f16_avx512(float *dst, const uint16_t *src, size_t n) {
    for (size_t i = 0; i < n; i += 16) {
        const __mmask16 k = mha_mask16((int)(n - i < 16 ? n - i : 16));
        _mm512_mask_storeu_ps(dst + i, k, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(k, src + i)));
    }
}

const mha_decode_kernels mha_decode_kernels_avx512 = {
    "avx512",           scores_avx512, scores_h_avx512, softmax_avx512, accumulate_avx512, accumulate_h_avx512,
    gemm_stream_avx512, gemm_tile_avx512, axpby_avx512, to_f16_avx512,  from_f16_avx512,
    .scores_q8 = scores_q8_avx512, .accumulate_q8 = accumulate_q8_avx512, .from_q8 = mha_from_q8_avx512,
    .gemm_stream_bf16 = mha_gemm_stream_bf16_avx512, .gemm_stream_i8 = mha_gemm_stream_i8_avx512,
    .scores_t = mha_scores_t_avx512, .softmax_t = mha_softmax_t_avx512, .accumulate_t = mha_accumulate_t_avx512, .merge_t = mha_merge_t_avx512,
    .prefetch_stream = pf_stream_start,
};
