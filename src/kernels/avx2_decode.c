/* avx2_decode.c — AVX2 + FMA + F16C decode kernels (see decode_kernels.h).
 * Built with -mavx2 -mfma -mf16c; called only after decode.c checked the
 * CPU. Tile shapes are chosen so that 8 independent FMA chains hide the
 * FMA latency: scores 4 rows x 2 panels or 1 row x 4 panels, accumulate 4
 * rows x 16 columns or 1 row x 64 columns.
 * Legend: m query rows, n keys (or output columns), d = d_k, dv = d_v. */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "kernels/decode_kernels.h"
#include "kernels/prefetch_stream.h"
#include "kernels/avx2_micro.h"
#include "kernels/kernels.h"

#define INLINE static inline __attribute__((always_inline))
/* the tiles' loops over rows and vectors have constant trip counts; fully
 * unrolled, their accumulators live in registers */
#define UNROLL _Pragma("GCC unroll 8")

/* ------------------------------------------------------------- scores */

/* 8 consecutive elements at index i of an fp32 (H = 0) or fp16 (H = 1)
 * array, as fp32: the fp16 cache is widened in registers, never copied. */
INLINE __m256 load8(const void *base, size_t i, int H) {
    if (H) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)base + i)));
    return _mm256_loadu_ps((const float *)base + i);
}

INLINE float load1(const void *base, size_t i, int H) {
    return H ? _cvtsh_ss(((const uint16_t *)base)[i]) : ((const float *)base)[i];
}

/* H = 2: int8 storage. 8 consecutive int8 at index i as fp32 (exact; the
 * scales are applied per block by the callers). */
INLINE __m256 load8q(const int8_t *base, size_t i) {
    __m128i b = _mm_loadl_epi64((const __m128i *)(base + i));
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
}

#define NB(d) (((d) + MHA_Q8_BLOCK - 1) / MHA_Q8_BLOCK)

/* R rows x P panels of fp32 (H = 0) or fp16 (H = 1) scores, panels from
 * element k0 on: one FMA chain per score in dim order from 0; R, P and H
 * are constants at each call site. */
INLINE void scores_tile(float *s, int lds, const float *q, int ldq, const void *kp, size_t k0, int d, int R, int P,
                        int H, pf_stream *pf) {
    __m256 acc[4][8];
    UNROLL
    for (int r = 0; r < R; r++)
        UNROLL
        for (int p = 0; p < P; p++) acc[r][p] = _mm256_setzero_ps();
    for (int c = 0; c < d; c++) {
        pf_step(pf);
        __m256 k[8];
        UNROLL
        for (int p = 0; p < P; p++) k[p] = load8(kp, k0 + (size_t)p * d * MHA_KPANEL + (size_t)c * MHA_KPANEL, H);
        UNROLL
        for (int r = 0; r < R; r++) {
            __m256 qb = _mm256_broadcast_ss(q + (size_t)r * ldq + c);
            UNROLL
            for (int p = 0; p < P; p++) acc[r][p] = _mm256_fmadd_ps(qb, k[p], acc[r][p]);
        }
    }
    UNROLL
    for (int r = 0; r < R; r++)
        UNROLL
        for (int p = 0; p < P; p++) _mm256_storeu_ps(s + (size_t)r * lds + p * MHA_KPANEL, acc[r][p]);
}

/* Groups of 4 rows with the panels outermost: a few K panels (3 x d x 8)
 * stay in L1 while every row group uses them (GQA/MQA share keys). Then
 * fp16: a group of 2 rows (4 panels a tile: each key widened once for
 * both, where two single rows widen it twice: GQA with 2, 3, 6 or 7 query
 * heads per kv head), then single rows (8 panels). */
INLINE void scores_impl(float *s, int lds, const float *q, int ldq, const void *kp, int m, int n, int d, int H,
                        pf_stream *pf) {
    /* pairs for fp16 only: fp32 pairs ran 1.06-1.11x slower at 2 threads
     * with the chunk streamed from memory (h_kv 16, L 4096, Zen 3) */
    const int np = n / MHA_KPANEL, m4 = m - m % 4, m2 = H == 1 ? m - m % 2 : m4;
    const size_t pstride = (size_t)d * MHA_KPANEL;
#define SCORES_TILE(i, p, R, P)                                                                                    \
    scores_tile(s + (size_t)(i) * lds + (p) * MHA_KPANEL, lds, q + (size_t)(i) * ldq, ldq, kp, (p) * pstride, d, \
                R, P, H, pf)
    int p = 0;
    for (; p + 3 <= np; p += 3) /* 12 accumulators: slack over the 8 FMAs in flight */
        for (int i = 0; i < m4; i += 4) SCORES_TILE(i, p, 4, 3);
    for (; p + 2 <= np; p += 2)
        for (int i = 0; i < m4; i += 4) SCORES_TILE(i, p, 4, 2);
    for (; p < np; p++)
        for (int i = 0; i < m4; i += 4) SCORES_TILE(i, p, 4, 1);
    for (int i = m4; i < m2; i += 2) {
        for (p = 0; p + 4 <= np; p += 4) SCORES_TILE(i, p, 2, 4);
        for (; p < np; p++) SCORES_TILE(i, p, 2, 1);
    }
    for (int i = m2; i < m; i++) {
        for (p = 0; p + 8 <= np; p += 8) SCORES_TILE(i, p, 1, 8);
        for (; p < np; p++) SCORES_TILE(i, p, 1, 1);
    }
#undef SCORES_TILE
}

static void scores_avx2(float *s, int lds, const float *q, int ldq, const float *kp, int m, int n,
                        int d) {
    PF_STREAMED(scores_impl(s, lds, q, ldq, kp, m, n, d, 0, pf));
}

static void scores_h_avx2(float *s, int lds, const float *q, int ldq, const uint16_t *kp, int m,
                          int n, int d) {
    PF_STREAMED(scores_impl(s, lds, q, ldq, kp, m, n, d, 1, pf));
}

/* int8: R rows x P panels of scores, block by block, the running score
 * kept in s between blocks (s = fma(blk, scale, s), from 0): only the R x
 * P block sums live in registers, so 8 of them hide the FMA latency where
 * scores_tile, which also holds the running scores, had room for 4 (4
 * rows x 1 panel: 0.55 of the FMA peak on a Zen 3). Per score the
 * operations and order of scores_q8 (decode_kernels.h): the scalar
 * table's bits. */
INLINE void scores_q8_tile(float *s, int lds, const float *q, int ldq, const int8_t *kq, const float *ks, size_t k0,
                           int d, int R, int P, pf_stream *pf) {
    for (int c0 = 0; c0 < d; c0 += MHA_Q8_BLOCK) {
        const int c1 = c0 + MHA_Q8_BLOCK < d ? c0 + MHA_Q8_BLOCK : d;
        __m256 blk[4][8];
        UNROLL
        for (int r = 0; r < R; r++)
            UNROLL
            for (int p = 0; p < P; p++) blk[r][p] = _mm256_setzero_ps();
        for (int c = c0; c < c1; c++) {
            pf_step(pf);
            __m256 k[8];
            UNROLL
            for (int p = 0; p < P; p++) k[p] = load8q(kq, k0 + (size_t)p * d * MHA_KPANEL + (size_t)c * MHA_KPANEL);
            UNROLL
            for (int r = 0; r < R; r++) {
                __m256 qb = _mm256_broadcast_ss(q + (size_t)r * ldq + c);
                UNROLL
                for (int p = 0; p < P; p++) blk[r][p] = _mm256_fmadd_ps(qb, k[p], blk[r][p]);
            }
        }
        UNROLL
        for (int p = 0; p < P; p++) {
            __m256 sc = _mm256_loadu_ps(ks + (k0 / (size_t)d + (size_t)p * MHA_KPANEL) * NB(d) +
                                        (size_t)(c0 / MHA_Q8_BLOCK) * MHA_KPANEL);
            UNROLL
            for (int r = 0; r < R; r++) {
                float *at = s + (size_t)r * lds + p * MHA_KPANEL;
                __m256 run = c0 ? _mm256_loadu_ps(at) : _mm256_setzero_ps();
                _mm256_storeu_ps(at, _mm256_fmadd_ps(blk[r][p], sc, run));
            }
        }
    }
}

/* Rows in groups of 4 (2 panels a tile), then 2 (4 panels), then 1 (4):
 * each key vector widened once for the rows of its group. */
INLINE void scores_q8_impl(float *s, int lds, const float *q, int ldq, const int8_t *kq, const float *ks, int m,
                           int n, int d, pf_stream *pf) {
    const int np = n / MHA_KPANEL;
    const size_t pstride = (size_t)d * MHA_KPANEL;
#define Q8_TILES(R, P)                                                                                          \
    for (; i + (R) <= m; i += (R)) {                                                                            \
        int p = 0;                                                                                              \
        for (; p + (P) <= np; p += (P))                                                                         \
            scores_q8_tile(s + (size_t)i * lds + p * MHA_KPANEL, lds, q + (size_t)i * ldq, ldq, kq, ks,        \
                           p * pstride, d, R, P, pf);                                                           \
        for (; p < np; p++)                                                                                     \
            scores_q8_tile(s + (size_t)i * lds + p * MHA_KPANEL, lds, q + (size_t)i * ldq, ldq, kq, ks,        \
                           p * pstride, d, R, 1, pf);                                                           \
    }
    int i = 0;
    Q8_TILES(4, 2)
    Q8_TILES(2, 4)
    Q8_TILES(1, 4)
#undef Q8_TILES
}

void mha_scores_q8_avx2(float *s, int lds, const float *q, int ldq, const int8_t *kq, const float *ks, int m, int n,
                        int d) {
    PF_STREAMED(scores_q8_impl(s, lds, q, ldq, kq, ks, m, n, d, pf));
}

/* ------------------------------------------------------------ softmax */

/* exp(x) for x <= 0 (scores minus their max): mha_exp_avx2 with this
 * kernel's own cut-off, exactly 0 below -87 (including -inf), where
 * mha_exp_avx2 alone still gives values down to FLT_MIN. */
INLINE __m256 exp_avx2(__m256 x) {
    __m256 keep = _mm256_cmp_ps(x, _mm256_set1_ps(-87.0f), _CMP_GE_OQ);
    return _mm256_and_ps(mha_exp_avx2(x), keep);
}

static void softmax_avx2(float *s, int lds, float *mx, float *sum, int m, int n) {
    for (int i = 0; i < m; i++) {
        float *row = s + (size_t)i * lds;
        __m256 vm = _mm256_set1_ps(-INFINITY);
        for (int j = 0; j < n; j += 8) vm = _mm256_max_ps(vm, _mm256_loadu_ps(row + j));
        float M = mha_hmax8_avx2(vm);
        if (M == -INFINITY) {
            memset(row, 0, (size_t)n * sizeof(float));
            mx[i] = M;
            sum[i] = 0.0f;
            continue;
        }
        __m256 vM = _mm256_set1_ps(M), vs = _mm256_setzero_ps();
        for (int j = 0; j < n; j += 8) {
            __m256 e = exp_avx2(_mm256_sub_ps(_mm256_loadu_ps(row + j), vM));
            _mm256_storeu_ps(row + j, e);
            vs = _mm256_add_ps(vs, e);
        }
        mx[i] = M;
        sum[i] = mha_hsum8_avx2(vs);
    }
}

/* --------------------------------------------------------- accumulate */

/* R rows x C vectors of acc = p v over n keys (v from column v0 on, row
 * stride dv; int8 scales vs (n, nb), each folded into the weight: the
 * callers keep vectors 4k .. 4k+3 in one block of 32). */
INLINE void acc_tile(float *acc, int ldacc, const float *p, int ldp, const void *v, const float *vs, size_t v0,
                     int dv, int n, int R, int C, int H, pf_stream *pf) {
    __m256 a[4][8];
    UNROLL
    for (int r = 0; r < R; r++)
        UNROLL
        for (int c = 0; c < C; c++) a[r][c] = _mm256_setzero_ps();
    for (int j = 0; j < n; j++) {
        pf_step(pf);
        __m256 vv[8];
        UNROLL
        for (int c = 0; c < C; c++) {
            size_t at = v0 + (size_t)j * dv + c * 8;
            vv[c] = H == 2 ? load8q((const int8_t *)v, at) : load8(v, at, H);
        }
        UNROLL
        for (int r = 0; r < R; r++) {
            const float pj = p[(size_t)r * ldp + j];
            __m256 pb = _mm256_broadcast_ss(p + (size_t)r * ldp + j);
            UNROLL
            for (int c = 0; c < C; c++) {
                /* int8: the block's scale folded into the weight, p * scale,
                 * once per block (the 4 vectors of a block share one) */
                if (H == 2 && c % 4 == 0)
                    pb = _mm256_set1_ps(pj * vs[(size_t)j * NB(dv) + (v0 + c * 8) / MHA_Q8_BLOCK]);
                a[r][c] = _mm256_fmadd_ps(pb, vv[c], a[r][c]);
            }
        }
    }
    UNROLL
    for (int r = 0; r < R; r++)
        UNROLL
        for (int c = 0; c < C; c++) _mm256_storeu_ps(acc + (size_t)r * ldacc + c * 8, a[r][c]);
}

/* Columns [c0, dv) of R rows one by one, fmaf in key order (the same
 * additions as a vector lane). */
INLINE void acc_tail(float *acc, int ldacc, const float *p, int ldp, const void *v, const float *vs, int dv,
                     int n, int R, int c0, int H) {
    for (int r = 0; r < R; r++)
        for (int c = c0; c < dv; c++) {
            float a = 0.0f;
            for (int j = 0; j < n; j++) {
                size_t at = (size_t)j * dv + c;
                if (H == 2) /* the scale folded into the weight, as acc_tile */
                    a = fmaf(p[(size_t)r * ldp + j] * vs[(size_t)j * NB(dv) + c / MHA_Q8_BLOCK],
                             (float)((const int8_t *)v)[at], a);
                else a = fmaf(p[(size_t)r * ldp + j], load1(v, at, H), a);
            }
            acc[(size_t)r * ldacc + c] = a;
        }
}

/* Column blocks outermost: a (n, 16) slab of V stays in L1 while every row
 * group uses it; then fp16 pairs of rows (32 columns a tile), then single
 * rows. */
INLINE void acc_impl(float *acc, int ldacc, const float *p, int ldp, const void *v, const float *vs, int m,
                     int n, int dv, int H, pf_stream *pf) {
    int m4 = m - m % 4, m2 = H == 1 ? m - m % 2 : m4, c = 0; /* pairs: fp16 only (scores_impl) */
    for (; H != 2 && c + 24 <= dv; c += 24) /* int8: 16 columns, one block */
        for (int i = 0; i < m4; i += 4)
            acc_tile(acc + (size_t)i * ldacc + c, ldacc, p + (size_t)i * ldp, ldp, v, vs, c, dv, n, 4, 3, H, pf);
    for (; c + 16 <= dv; c += 16)
        for (int i = 0; i < m4; i += 4)
            acc_tile(acc + (size_t)i * ldacc + c, ldacc, p + (size_t)i * ldp, ldp, v, vs, c, dv, n, 4, 2, H, pf);
    for (; c + 8 <= dv; c += 8)
        for (int i = 0; i < m4; i += 4)
            acc_tile(acc + (size_t)i * ldacc + c, ldacc, p + (size_t)i * ldp, ldp, v, vs, c, dv, n, 4, 1, H, pf);
    for (int i = 0; i < m4; i += 4)
        acc_tail(acc + (size_t)i * ldacc, ldacc, p + (size_t)i * ldp, ldp, v, vs, dv, n, 4, c, H);
    for (int i = m4; i < m2; i += 2) { /* a pair of rows: each value read once for both */
        float *a = acc + (size_t)i * ldacc;
        const float *pi = p + (size_t)i * ldp;
        for (c = 0; c + 32 <= dv; c += 32) acc_tile(a + c, ldacc, pi, ldp, v, vs, c, dv, n, 2, 4, H, pf);
        for (; c + 8 <= dv; c += 8) acc_tile(a + c, ldacc, pi, ldp, v, vs, c, dv, n, 2, 1, H, pf);
        acc_tail(a, ldacc, pi, ldp, v, vs, dv, n, 2, c, H);
    }
    for (int i = m2; i < m; i++) {
        float *a = acc + (size_t)i * ldacc;
        const float *pi = p + (size_t)i * ldp;
        c = 0;
        for (; c + 64 <= dv; c += 64) acc_tile(a + c, ldacc, pi, ldp, v, vs, c, dv, n, 1, 8, H, pf);
        for (; c + 8 <= dv; c += 8) acc_tile(a + c, ldacc, pi, ldp, v, vs, c, dv, n, 1, 1, H, pf);
        acc_tail(a, ldacc, pi, ldp, v, vs, dv, n, 1, c, H);
    }
}

static void accumulate_avx2(float *acc, int ldacc, const float *p, int ldp, const float *v, int m,
                            int n, int dv) {
    PF_STREAMED(acc_impl(acc, ldacc, p, ldp, v, NULL, m, n, dv, 0, pf));
}

static void accumulate_h_avx2(float *acc, int ldacc, const float *p, int ldp, const uint16_t *v,
                              int m, int n, int dv) {
    PF_STREAMED(acc_impl(acc, ldacc, p, ldp, v, NULL, m, n, dv, 1, pf));
}

/* int8 values for groups of rows: the weights of one block of columns,
 * pw (R, nk) = p * that block's scales (the product acc_tile folds in:
 * the same float), made once per block, key slice and row group, and
 * broadcast from memory by every vector of the block, where acc_tile
 * computes and broadcasts it again for each 16 columns of each key (on a
 * Zen 3 4 rows ran at 0.46 of the FMA peak). */
#define Q8_SLICE 128              /* keys per slice: pw and the scales' column in L1 */
#define Q8_COLUMN_FLOATS 2048     /* the scales' columns of one slice, (nb, keys)    */

/* R rows x C vectors of columns [v0, v0 + 8C) (one block) over keys
 * [0, nk) of the slice: acc = fma(pw, (float)v, acc), from 0 in the
 * first slice (first), else from acc. */
INLINE void acc_q8_tile(float *acc, int ldacc, const float *pw, int ldw, const int8_t *v, size_t v0, int dv, int nk,
                        int first, int R, int C) {
    __m256 a[4][4];
    UNROLL
    for (int r = 0; r < R; r++)
        UNROLL
        for (int c = 0; c < C; c++)
            a[r][c] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(acc + (size_t)r * ldacc + c * 8);
#pragma GCC unroll 2
    for (int j = 0; j < nk; j++) {
        __m256 vv[4];
        UNROLL
        for (int c = 0; c < C; c++) vv[c] = load8q(v, v0 + (size_t)j * dv + c * 8);
        UNROLL
        for (int r = 0; r < R; r++) {
            __m256 pb = _mm256_broadcast_ss(pw + (size_t)r * ldw + j);
            UNROLL
            for (int c = 0; c < C; c++) a[r][c] = _mm256_fmadd_ps(pb, vv[c], a[r][c]);
        }
    }
    UNROLL
    for (int r = 0; r < R; r++)
        UNROLL
        for (int c = 0; c < C; c++) _mm256_storeu_ps(acc + (size_t)r * ldacc + c * 8, a[r][c]);
}

/* Rows [i, i + R) x the columns of block b over the nk keys of a slice
 * (v: its first key, column: its scales of block b, (nk)). */
INLINE void acc_q8_block(float *acc, int ldacc, const float *p, int ldp, const int8_t *v, const float *column,
                         int dv, int nk, int b, int first, int R) {
    float pw[4 * Q8_SLICE];
    for (int r = 0; r < R; r++) {
        const float *pr = p + (size_t)r * ldp;
        int j = 0;
        for (; j + 8 <= nk; j += 8)
            _mm256_storeu_ps(pw + r * Q8_SLICE + j, _mm256_mul_ps(_mm256_loadu_ps(pr + j), _mm256_loadu_ps(column + j)));
        for (; j < nk; j++) pw[r * Q8_SLICE + j] = pr[j] * column[j];
    }
    const int c1 = (b + 1) * MHA_Q8_BLOCK < dv ? (b + 1) * MHA_Q8_BLOCK : dv;
    int c = b * MHA_Q8_BLOCK;
    if (R == 2)
        for (; c + 32 <= c1; c += 32) acc_q8_tile(acc + c, ldacc, pw, Q8_SLICE, v, (size_t)c, dv, nk, first, 2, 4);
    for (; c + 16 <= c1; c += 16) acc_q8_tile(acc + c, ldacc, pw, Q8_SLICE, v, (size_t)c, dv, nk, first, R, 2);
    for (; c + 8 <= c1; c += 8) acc_q8_tile(acc + c, ldacc, pw, Q8_SLICE, v, (size_t)c, dv, nk, first, R, 1);
    for (int r = 0; r < R; r++) /* columns past the last vector: fmaf in key order, as a lane */
        for (int t = c; t < c1; t++) {
            float a = first ? 0.0f : acc[(size_t)r * ldacc + t];
            for (int j = 0; j < nk; j++) a = fmaf(pw[r * Q8_SLICE + j], (float)v[(size_t)j * dv + t], a);
            acc[(size_t)r * ldacc + t] = a;
        }
}

/* Groups of 4 rows, then 2, over slices of keys (the scales of each
 * block gathered into a column per slice, shared by all rows); a last
 * single row takes acc_impl's 64-column tiles (one row converts every
 * value for one FMA: more columns in flight, not fewer multiplies, is
 * what it needs), and so do all rows of a V wider than 65536 (more blocks
 * than one key's scales fit in `column`). */
void mha_accumulate_q8_avx2(float *acc, int ldacc, const float *p, int ldp, const int8_t *vq,
                               const float *vs, int m, int n, int dv) {
    /* d_v past 65536, and no keys (acc = 0, as acc_impl writes it): acc_impl */
    const int nb = NB(dv), m2 = nb <= Q8_COLUMN_FLOATS && n > 0 ? m - m % 2 : 0;
    int slice = Q8_COLUMN_FLOATS / nb;
    if (slice > Q8_SLICE) slice = Q8_SLICE;
    if (slice < 1) slice = 1;
    float column[Q8_COLUMN_FLOATS]; /* (nb, slice): the scales of block b at [b * slice] */
    for (int j0 = 0; j0 < n && m2 > 0; j0 += slice) {
        const int nk = n - j0 < slice ? n - j0 : slice;
        for (int j = 0; j < nk; j++)
            for (int b = 0; b < nb; b++) column[b * slice + j] = vs[(size_t)(j0 + j) * nb + b];
        const int8_t *v = vq + (size_t)j0 * dv;
        for (int i = 0; i < m2;) {
            const int R = m2 - i >= 4 ? 4 : 2;
            for (int b = 0; b < nb; b++) {
                float *a = acc + (size_t)i * ldacc;
                const float *pi = p + (size_t)i * ldp + j0;
                if (R == 4) acc_q8_block(a, ldacc, pi, ldp, v, column + b * slice, dv, nk, b, j0 == 0, 4);
                else acc_q8_block(a, ldacc, pi, ldp, v, column + b * slice, dv, nk, b, j0 == 0, 2);
            }
            i += R;
        }
    }
    if (m2 < m) PF_STREAMED(acc_impl(acc + (size_t)m2 * ldacc, ldacc, p + (size_t)m2 * ldp, ldp, vq, vs, m - m2, n, dv, 2, pf));
}

/* --------------------------------------------------------------- gemm */

/* y (m, n) += x (m, k) w (k, n) (m <= 4 in one pass): one row of w at a
 * time, each vector loaded once and added into the m rows of y (in L1),
 * so the weights are read in address order, one stream (as
 * avx512_decode.c: four rows per pass read a cold matrix at ~70% of one
 * stream's rate on Zen 5). Each y element's additions stay in the order
 * of k; column tails with fmaf. On AMD Zen (an AVX2 one: Zen 1-3) the
 * sweep of avx2_gemm_wq.c runs instead, a few weight rows per pass with
 * the next pass requested ahead, one load and store of y per pass: on
 * the Zen 3 0.83-0.99x this loop's cold time for one row, 0.71-0.88x for
 * two to four (bench/LIMITS.md round 31). */
static inline __attribute__((always_inline)) void stream_rows(float *y, int ldy, const float *x, int ldx,
                                                              const float *w, int ldw, const int m, int k, int n) {
    for (int kk = 0; kk < k; kk++) {
        const float *wk = w + (size_t)kk * ldw;
        __m256 xb[4];
#pragma GCC unroll 4
        for (int r = 0; r < m; r++) xb[r] = _mm256_set1_ps(x[(size_t)r * ldx + kk]);
        int j = 0;
        for (; j + 8 <= n; j += 8) {
            const __m256 wv = _mm256_loadu_ps(wk + j);
#pragma GCC unroll 4
            for (int r = 0; r < m; r++) {
                float *yr = y + (size_t)r * ldy + j;
                _mm256_storeu_ps(yr, _mm256_fmadd_ps(xb[r], wv, _mm256_loadu_ps(yr)));
            }
        }
        for (; j < n; j++)
            for (int r = 0; r < m; r++) {
                float *yr = y + (size_t)r * ldy + j;
                *yr = fmaf(x[(size_t)r * ldx + kk], wk[j], *yr);
            }
    }
}

static void gemm_stream_avx2(float *y, int ldy, const float *x, int ldx, const float *w, int ldw,
                             int m, int k, int n) {
    if (m >= 1 && m <= 4 && mha_cpu_row_sweep()) { /* AMD Zen: weight rows a few per pass (avx2_gemm_wq.c) */
        mha_gemm_sweep_f32_avx2(y, ldy, x, ldx, w, ldw, m, k, n);
        return;
    }
    for (int r = 0; r < m; r += 4) { /* rows a constant in each copy: xb in registers */
        float *yr = y + (size_t)r * ldy;
        const float *xr = x + (size_t)r * ldx;
        switch (m - r) {
        case 1: stream_rows(yr, ldy, xr, ldx, w, ldw, 1, k, n); break;
        case 2: stream_rows(yr, ldy, xr, ldx, w, ldw, 2, k, n); break;
        case 3: stream_rows(yr, ldy, xr, ldx, w, ldw, 3, k, n); break;
        default: stream_rows(yr, ldy, xr, ldx, w, ldw, 4, k, n); break;
        }
    }
}

/* R rows x C vectors of y = x w over all of k. */
INLINE void gemm_tile_rc(float *y, int ldy, const float *x, int ldx, const float *w, int ldw, int k,
                         int R, int C) {
    __m256 a[4][2];
    UNROLL
    for (int r = 0; r < R; r++)
        UNROLL
        for (int c = 0; c < C; c++) a[r][c] = _mm256_setzero_ps();
    for (int kk = 0; kk < k; kk++) {
        __m256 wv[2];
        UNROLL
        for (int c = 0; c < C; c++) wv[c] = _mm256_loadu_ps(w + (size_t)kk * ldw + c * 8);
        UNROLL
        for (int r = 0; r < R; r++) {
            __m256 xb = _mm256_broadcast_ss(x + (size_t)r * ldx + kk);
            UNROLL
            for (int c = 0; c < C; c++) a[r][c] = _mm256_fmadd_ps(xb, wv[c], a[r][c]);
        }
    }
    UNROLL
    for (int r = 0; r < R; r++)
        UNROLL
        for (int c = 0; c < C; c++) _mm256_storeu_ps(y + (size_t)r * ldy + c * 8, a[r][c]);
}

static void gemm_tile_avx2(float *y, int ldy, const float *x, int ldx, const float *w, int ldw,
                           int m, int k, int n) {
    for (int i = 0; i < m; i += 4) {
        int R = m - i < 4 ? m - i : 4;
        const float *xi = x + (size_t)i * ldx;
        float *yi = y + (size_t)i * ldy;
        int j = 0;
        for (; j + 16 <= n; j += 16) {
            if (R == 4) gemm_tile_rc(yi + j, ldy, xi, ldx, w + j, ldw, k, 4, 2);
            else
                for (int r = 0; r < R; r++) gemm_tile_rc(yi + (size_t)r * ldy + j, ldy, xi + (size_t)r * ldx, ldx, w + j, ldw, k, 1, 2);
        }
        for (; j + 8 <= n; j += 8)
            for (int r = 0; r < R; r++) gemm_tile_rc(yi + (size_t)r * ldy + j, ldy, xi + (size_t)r * ldx, ldx, w + j, ldw, k, 1, 1);
        for (; j < n; j++)
            for (int r = 0; r < R; r++) {
                float a = 0.0f;
                for (int kk = 0; kk < k; kk++) a = fmaf(xi[(size_t)r * ldx + kk], w[(size_t)kk * ldw + j], a);
                yi[(size_t)r * ldy + j] = a;
            }
    }
}

/* y = a y + b x with the rounding of the scalar expression y*a + x*b
 * (a product, a product, a sum: no FMA), lane by lane. */
static void axpby_avx2(float *y, const float *x, float a, float b, int n) {
    __m256 va = _mm256_set1_ps(a), vb = _mm256_set1_ps(b);
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(y + i), va),
                                              _mm256_mul_ps(_mm256_loadu_ps(x + i), vb)));
    for (; i < n; i++) {
        float p = y[i] * a, q = x[i] * b;
        y[i] = p + q;
    }
}

/* --------------------------------------------------------------- fp16 */

static void to_f16_avx2(uint16_t *dst, const float *src, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(dst + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++) {
        __m128i h = _mm_cvtps_ph(_mm_set_ss(src[i]), _MM_FROUND_TO_NEAREST_INT);
        dst[i] = (uint16_t)_mm_extract_epi16(h, 0);
    }
}

static void from_f16_avx2(float *dst, const uint16_t *src, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
    for (; i < n; i++) dst[i] = _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(src[i])));
}

/* --------------------------------------------------------------- int8 */

/* See decode_kernels.h; 8 lanes (key panels) one vector per (row, dim),
 * otherwise (value rows) 8 columns of one block at a time. */
void mha_from_q8_avx2(float *dst, const int8_t *src, const float *scale, size_t rows, int d, int lanes) {
    int nb = NB(d);
    for (size_t r = 0; r < rows; r++)
        for (int c = 0; c < d;) {
            size_t at = (r * d + c) * lanes, sat = (r * nb + c / MHA_Q8_BLOCK) * lanes;
            if (lanes == MHA_KPANEL) {
                _mm256_storeu_ps(dst + at, _mm256_mul_ps(load8q(src, at), _mm256_loadu_ps(scale + sat)));
                c++;
            } else if (lanes == 1 && c % 8 == 0 && c + 8 <= d) {
                _mm256_storeu_ps(dst + at, _mm256_mul_ps(load8q(src, at), _mm256_broadcast_ss(scale + sat)));
                c += 8;
            } else {
                for (int l = 0; l < lanes; l++) dst[at + l] = (float)src[at + l] * scale[sat + l];
                c++;
            }
        }
}

/* ------------------------------------------------------ stream steps */

/* Tiles of t over n, then of r1 over what is left, then of r2 (0: none). */
static size_t tiles_of(int n, int t, int r1, int r2) {
    size_t k = (size_t)(n / t);
    n %= t;
    if (r1) k += (size_t)(n / r1), n %= r1;
    if (r2) k += (size_t)(n / r2);
    return k;
}

/* The pf_step calls of scores_impl / scores_q8_impl and acc_impl for a
 * chunk: one per dim of each scores tile, one per key of each values
 * tile (mha_accumulate_q8_avx2's row groups make none; a V wider than
 * 65536 aside). */
static size_t prefetch_steps_avx2(int m, int nk, int d_k, int d_v, int kt, int vt) {
    const int np = nk / MHA_KPANEL, g = m / 4;
    size_t s;
    if (kt == MHA_DK_I8) { /* 4 rows x 2 panels (1), 2 x 4 (1), 1 x 4 (1) */
        s = ((size_t)g * tiles_of(np, 2, 1, 0) + (size_t)((m % 4) / 2 + m % 2) * tiles_of(np, 4, 1, 0)) * (size_t)d_k;
    } else { /* 4 x 3 panels (2, 1); fp16 pairs 2 x 4 (1); single rows 1 x 8 (1) */
        const int pairs = kt == MHA_DK_F16 ? (m % 4) / 2 : 0, ones = m % 4 - 2 * pairs;
        s = ((size_t)g * tiles_of(np, 3, 2, 1) + (size_t)pairs * tiles_of(np, 4, 1, 0) +
             (size_t)ones * tiles_of(np, 8, 1, 0)) * (size_t)d_k;
    }
    if (vt == MHA_DK_I8) return s + (size_t)(m % 2) * tiles_of(d_v, 64, 8, 0) * (size_t)nk;
    /* 4 rows x 24 columns (16, 8); fp16 pairs x 32 (8); single rows x 64 (8) */
    const int pairs = vt == MHA_DK_F16 ? (m % 4) / 2 : 0, ones = m % 4 - 2 * pairs;
    return s + ((size_t)g * tiles_of(d_v, 24, 16, 8) + (size_t)pairs * tiles_of(d_v, 32, 8, 0) +
                (size_t)ones * tiles_of(d_v, 64, 8, 0)) * (size_t)nk;
}

/* The units the stream serves: where the kernels wait for memory. On the
 * Zen 3 (cold, 2 threads; bench/LIMITS.md round 33) fp32 with 4 rows
 * (GQA, h_kv 8 of 32) took 0.80-0.94x the time with it at L 16384
 * (0.95-1.05x at 4096), one fp16 row (MHA) 0.76-0.92x, a pair of fp16
 * rows (h_kv 16) 0.79-0.93x; where the arithmetic bounds the kernels its
 * steps cost more than they bring: one fp32 row 1.01-1.09x, fp32 with 8
 * or 32 rows 1.04-1.13x at L 4096 (2 rows: 0.93-1.02x, not taken), fp16
 * groups of 4 1.05-1.17x, int8 1.05-1.21x (those keep decode.c's bursts,
 * or none). */
static int prefetch_streams_avx2(int m, int kt, int vt) {
    if (kt != vt) return 0;
    return (kt == MHA_DK_F32 && m == 4) || (kt == MHA_DK_F16 && m <= 2);
}

const mha_decode_kernels mha_decode_kernels_avx2 = {
    "avx2",         scores_avx2, scores_h_avx2, softmax_avx2, accumulate_avx2, accumulate_h_avx2,
    gemm_stream_avx2, gemm_tile_avx2, axpby_avx2, to_f16_avx2, from_f16_avx2,
    .scores_q8 = mha_scores_q8_avx2, .accumulate_q8 = mha_accumulate_q8_avx2, .from_q8 = mha_from_q8_avx2,
    .gemm_stream_bf16 = mha_gemm_stream_bf16_avx2, .gemm_stream_i8 = mha_gemm_stream_i8_avx2,
    .prefetch_stream = pf_stream_start, .prefetch_steps = prefetch_steps_avx2,
    .prefetch_streams = prefetch_streams_avx2,
};
