/* avx512_decode_grouped.c — AVX-512 decode kernels for many query rows on
 * one kv head (MQA; see the scores_t entries of decode_kernels.h), and the
 * int8 widening of a chunk they read. Built with the AVX-512 flags.
 *
 * The scores are kept transposed, st (keys, rows): a key's element is one
 * embedded broadcast from memory and 16 query rows fill a zmm, so the
 * products need no lane shuffles (the row-major kernels insert two 8-key
 * panels per zmm) and the softmax handles 16 rows per vector. Each output
 * element is the fmaf chain of the row-major kernels, in the same order.
 * Legend: m query rows (<= 32), n keys, d = d_k, dv = d_v. */
#include <immintrin.h>
#include <math.h>

#include "kernels/decode_kernels.h"
#include "kernels/avx512_micro.h"

#define INLINE MHA_AVX512_INLINE
#define UNROLL _Pragma("GCC unroll 16")
#define KEY_BLOCK 32 /* keys of V per pass: (32, dv) stays in L1 for every row group */
/* (the buffers of the fp16 / int8 kinds: K one or two panels, 2 d 8 floats;
 * V KEY_BLOCK rows, KEY_BLOCK dv floats: decode_kernels.h) */

/* ------------------------------------------------------------- scores */

/* The one register tile of this file: out (R, 16 C) (+)= sum over k of
 * broadcast(s[k, r]) * b[k, 16 c ..], one fmaf chain per element in k
 * order (from out's values when cont, else from 0); s[k, r] at
 * s[k sk + r % 8 + (r / 8) sp] (8-key panels side by side, or plain rows
 * for R <= 8 and sp unused); b rows ldb apart, the last vector of a row
 * and of out masked by klast. Scores: r = key (broadcast from K), the
 * vectors are 16 query rows of qt; P.V: r = query row (broadcast from
 * the weights), the vectors 16 columns of V. */
INLINE void outer_tile(float *out, int ldo, const float *b, size_t ldb, const float *s, size_t sk, size_t sp,
                       int K, int cont, __mmask16 klast, int R, int C) {
    __m512 a[16][4];
    UNROLL
    for (int r = 0; r < R; r++)
        UNROLL
        for (int c = 0; c < C; c++)
            a[r][c] = cont ? _mm512_maskz_loadu_ps(c == C - 1 ? klast : (__mmask16)0xffff, out + (size_t)r * ldo + 16 * c)
                           : _mm512_setzero_ps();
    for (int k = 0; k < K; k++) {
        __m512 bv[4];
        UNROLL
        for (int c = 0; c < C; c++)
            bv[c] = _mm512_maskz_loadu_ps(c == C - 1 ? klast : (__mmask16)0xffff, b + (size_t)k * ldb + 16 * c);
        UNROLL
        for (int r = 0; r < R; r++) {
            const __m512 sb = _mm512_set1_ps(s[(size_t)k * sk + (size_t)(r % 8) + (size_t)(r / 8) * sp]);
            UNROLL
            for (int c = 0; c < C; c++) a[r][c] = _mm512_fmadd_ps(sb, bv[c], a[r][c]);
        }
    }
    UNROLL
    for (int r = 0; r < R; r++)
        UNROLL
        for (int c = 0; c < C; c++)
            _mm512_mask_storeu_ps(out + (size_t)r * ldo + 16 * c, c == C - 1 ? klast : (__mmask16)0xffff, a[r][c]);
}

/* J keys (one 8-key panel, or two side by side) x V vectors of 16 query
 * rows (the last masked by klast; masked rows read as 0). */
INLINE void scores_t_tile(float *st, int ldt, const float *qt, int ldq, const float *kp, int d, __mmask16 klast,
                          int J, int V) {
    outer_tile(st, ldt, qt, (size_t)ldq, kp, MHA_KPANEL, (size_t)d * MHA_KPANEL, d, 0, klast, J, V);
}

/* Panel p of K as fp32: in place (fp32) or widened into buf (d, 8):
 * fp16 exactly, int8 as from_q8 (one rounding), so the scores are those
 * of the chunk widened whole, while the panel stays in L1. */
INLINE const float *k_panel(float *buf, const void *k, const float *ks, int kind, int p, int d) {
    const size_t ps = (size_t)d * MHA_KPANEL;
    if (kind == MHA_DK_F32) return (const float *)k + p * ps;
    if (kind == MHA_DK_F16) {
        const uint16_t *h = (const uint16_t *)k + p * ps;
        size_t i = 0;
        for (; i + 16 <= ps; i += 16)
            _mm512_storeu_ps(buf + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(h + i))));
        if (i < ps) /* d * 8 is a multiple of 8 */
            _mm256_storeu_ps(buf + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + i))));
    } else {
        const int nb = (d + MHA_Q8_BLOCK - 1) / MHA_Q8_BLOCK;
        mha_from_q8_avx512(buf, (const int8_t *)k + p * ps, ks + (size_t)p * nb * MHA_KPANEL, 1, d, MHA_KPANEL);
    }
    return buf;
}

/* Requests the bytes [p, p + bytes) into L1 (they are read next, while
 * this tile computes: the chunk is larger than L1). Never faults. */
INLINE void prefetch_l1(const void *p, size_t bytes) {
    for (size_t o = 0; o < bytes; o += 64) _mm_prefetch((const char *)p + o, _MM_HINT_T0);
}

/* bytes of one element of a storage kind */
INLINE size_t kind_bytes(int kind) { return kind == MHA_DK_F32 ? 4 : kind == MHA_DK_F16 ? 2 : 1; }

void mha_scores_t_avx512(float *st, int ldt, const float *qt, int ldq, const void *k, const float *ks, int kind,
                         float *buf, int m, int n, int d) {
    const int np = n / MHA_KPANEL;
    const size_t ps = (size_t)d * MHA_KPANEL;
    if (m > 16) { /* 8 keys x 32 rows: 16 accumulators, 10 loads per 16 FMAs */
        const __mmask16 kl = mha_mask16(m - 16);
        const size_t pb = ps * kind_bytes(kind), nb = (size_t)(d + MHA_Q8_BLOCK - 1) / MHA_Q8_BLOCK;
        for (int p = 0; p < np; p++) {
            /* the next panel (after the last: what follows K, the chunk's V) */
            prefetch_l1((const char *)k + (size_t)(p + 1) * pb, pb);
            if (kind == MHA_DK_I8 && p + 1 < np) prefetch_l1(ks + (size_t)(p + 1) * nb * MHA_KPANEL, sizeof(float) * nb * MHA_KPANEL);
            scores_t_tile(st + (size_t)p * MHA_KPANEL * ldt, ldt, qt, ldq, k_panel(buf, k, ks, kind, p, d), d, kl, 8, 2);
        }
        return;
    }
    const __mmask16 kl = mha_mask16(m);
    int p = 0;
    for (; p + 2 <= np; p += 2) { /* 16 keys x 16 rows: two panels, side by side in buf when widened */
        const float *kp = kind == MHA_DK_F32 ? (const float *)k + p * ps : buf;
        if (kind != MHA_DK_F32) k_panel(buf, k, ks, kind, p, d), k_panel(buf + ps, k, ks, kind, p + 1, d);
        scores_t_tile(st + (size_t)p * MHA_KPANEL * ldt, ldt, qt, ldq, kp, d, kl, 16, 1);
    }
    if (p < np) scores_t_tile(st + (size_t)p * MHA_KPANEL * ldt, ldt, qt, ldq, k_panel(buf, k, ks, kind, p, d), d, kl, 8, 1);
}

/* ------------------------------------------------------------ softmax */

/* exp(x - sub) for x - sub <= 0: mha_exp_avx512's clamp at -88 (its upper
 * one is a no-op here), exactly 0 below -87 (and for NaN) as the
 * row-major softmax. */
INLINE __m512 exp_shifted(__m512 x, __m512 sub) {
    const __m512 y = _mm512_sub_ps(x, sub);
    const __mmask16 keep = _mm512_cmp_ps_mask(y, _mm512_set1_ps(-87.0f), _CMP_GE_OQ);
    return _mm512_maskz_mov_ps(keep, mha_exp_avx512_inrange(_mm512_max_ps(y, _mm512_set1_ps(-88.0f))));
}

/* V vectors of 16 rows (the last masked by kl) over n keys. Two keys per
 * step with their own max and sum chains (the chains' latency, not the
 * exp, bounded one chain per vector): sum = (even keys) + (odd keys). */
INLINE void softmax_t_rows(float *st, int ldt, float *mx, float *sum, int n, __mmask16 kl, int V) {
    __m512 m0[2], m1[2], s0[2], s1[2], sub[2];
    UNROLL
    for (int v = 0; v < V; v++) m0[v] = m1[v] = _mm512_set1_ps(-INFINITY), s0[v] = s1[v] = _mm512_setzero_ps();
    int j = 0;
    for (; j + 2 <= n; j += 2)
        UNROLL
        for (int v = 0; v < V; v++) {
            const __mmask16 k = v == V - 1 ? kl : (__mmask16)0xffff;
            m0[v] = _mm512_max_ps(m0[v], _mm512_maskz_loadu_ps(k, st + (size_t)j * ldt + 16 * v));
            m1[v] = _mm512_max_ps(m1[v], _mm512_maskz_loadu_ps(k, st + (size_t)(j + 1) * ldt + 16 * v));
        }
    for (; j < n; j++)
        UNROLL
        for (int v = 0; v < V; v++)
            m0[v] = _mm512_max_ps(m0[v], _mm512_maskz_loadu_ps(v == V - 1 ? kl : (__mmask16)0xffff, st + (size_t)j * ldt + 16 * v));
    /* a row with no allowed key: -inf - -inf = NaN, which exp_shifted's
     * ordered compare turns into 0 (sum 0, mx -inf) */
    UNROLL
    for (int v = 0; v < V; v++) sub[v] = m0[v] = _mm512_max_ps(m0[v], m1[v]);
    for (j = 0; j + 2 <= n; j += 2)
        UNROLL
        for (int v = 0; v < V; v++) {
            const __mmask16 k = v == V - 1 ? kl : (__mmask16)0xffff;
            float *a = st + (size_t)j * ldt + 16 * v, *b = a + ldt;
            const __m512 ea = exp_shifted(_mm512_maskz_loadu_ps(k, a), sub[v]);
            const __m512 eb = exp_shifted(_mm512_maskz_loadu_ps(k, b), sub[v]);
            _mm512_mask_storeu_ps(a, k, ea), _mm512_mask_storeu_ps(b, k, eb);
            s0[v] = _mm512_add_ps(s0[v], ea), s1[v] = _mm512_add_ps(s1[v], eb);
        }
    for (; j < n; j++)
        UNROLL
        for (int v = 0; v < V; v++) {
            const __mmask16 k = v == V - 1 ? kl : (__mmask16)0xffff;
            float *a = st + (size_t)j * ldt + 16 * v;
            const __m512 ea = exp_shifted(_mm512_maskz_loadu_ps(k, a), sub[v]);
            _mm512_mask_storeu_ps(a, k, ea);
            s0[v] = _mm512_add_ps(s0[v], ea);
        }
    UNROLL
    for (int v = 0; v < V; v++) {
        const __mmask16 k = v == V - 1 ? kl : (__mmask16)0xffff;
        _mm512_mask_storeu_ps(mx + 16 * v, k, m0[v]);
        _mm512_mask_storeu_ps(sum + 16 * v, k, _mm512_add_ps(s0[v], s1[v]));
    }
}

void mha_softmax_t_avx512(float *st, int ldt, float *mx, float *sum, int m, int n) {
    if (m > 16) softmax_t_rows(st, ldt, mx, sum, n, mha_mask16(m - 16), 2);
    else softmax_t_rows(st, ldt, mx, sum, n, mha_mask16(m), 1);
}

/* --------------------------------------------------------- accumulate */

/* R rows x C vectors of acc (+)= pt^T v over keys [j0, j1); cont: the
 * chains go on from acc's stored values (a later key block). */
INLINE void acc_t_tile(float *acc, int ldacc, const float *pt, int ldt, const float *v, int dv, int j0, int j1,
                       int cont, __mmask16 klast, int R, int C) {
    outer_tile(acc, ldacc, v + (size_t)j0 * dv, (size_t)dv, pt + (size_t)j0 * ldt, (size_t)ldt, 0, j1 - j0, cont,
               klast, R, C);
}

/* One (rows, columns) tile with R in {1..4} and C in {1..4} as constants. */
static void acc_t_any(float *acc, int ldacc, const float *pt, int ldt, const float *v, int dv, int j0, int j1,
                      int cont, __mmask16 kl, int R, int C) {
#define ACC_T_R(R_)                                                                        \
    switch (C) {                                                                           \
    case 1: acc_t_tile(acc, ldacc, pt, ldt, v, dv, j0, j1, cont, kl, R_, 1); break;        \
    case 2: acc_t_tile(acc, ldacc, pt, ldt, v, dv, j0, j1, cont, kl, R_, 2); break;        \
    case 3: acc_t_tile(acc, ldacc, pt, ldt, v, dv, j0, j1, cont, kl, R_, 3); break;        \
    default: acc_t_tile(acc, ldacc, pt, ldt, v, dv, j0, j1, cont, kl, R_, 4); break;       \
    }
    switch (R) {
    case 1: ACC_T_R(1) break;
    case 2: ACC_T_R(2) break;
    case 3: ACC_T_R(3) break;
    default: ACC_T_R(4) break;
    }
#undef ACC_T_R
}

void mha_accumulate_t_avx512(float *acc, int ldacc, const float *pt, int ldt, const void *v, const float *vs,
                             int kind, float *buf, int m, int n, int dv) {
    const int nb = (dv + MHA_Q8_BLOCK - 1) / MHA_Q8_BLOCK;
    for (int j0 = 0; j0 < n || j0 == 0; j0 += KEY_BLOCK) {
        const int j1 = j0 + KEY_BLOCK < n ? j0 + KEY_BLOCK : n;
        /* rows [j0, j1) of V as fp32, (j1 - j0, dv) from vb on: widened
         * into buf (L1) once for every row group */
        const float *vb = buf;
        if (kind == MHA_DK_F32) vb = (const float *)v + (size_t)j0 * dv;
        else if (kind == MHA_DK_F16) {
            const uint16_t *h = (const uint16_t *)v + (size_t)j0 * dv;
            const size_t cnt = (size_t)(j1 - j0) * dv;
            size_t i = 0;
            for (; i + 16 <= cnt; i += 16)
                _mm512_storeu_ps(buf + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(h + i))));
            for (; i < cnt; i += 16) {
                const __mmask16 km = mha_mask16((int)(cnt - i < 16 ? cnt - i : 16));
                _mm512_mask_storeu_ps(buf + i, km, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(km, h + i)));
            }
        } else mha_from_q8_avx512(buf, (const int8_t *)v + (size_t)j0 * dv, vs + (size_t)j0 * nb, (size_t)(j1 - j0), dv, 1);
        /* the next block's rows (after the last: the next chunk's K),
         * requested a share per row group */
        const size_t nbytes = (size_t)KEY_BLOCK * dv * kind_bytes(kind), groups = (size_t)(m + 3) / 4;
        const char *next = (const char *)v + (size_t)j1 * dv * kind_bytes(kind);
        for (int c0 = 0; c0 < dv; c0 += 64) {
            const int C = (dv - c0 + 15) / 16 < 4 ? (dv - c0 + 15) / 16 : 4;
            const __mmask16 kl = mha_mask16(dv - c0 - 16 * (C - 1));
            for (int i = 0; i < m; i += 4) {
                if (c0 == 0) {
                    const size_t a = nbytes * (size_t)(i / 4) / groups, b = nbytes * (size_t)(i / 4 + 1) / groups;
                    prefetch_l1(next + (a - a % 64), b - (a - a % 64));
                    if (kind == MHA_DK_I8 && i == 0 && j1 < n) prefetch_l1(vs + (size_t)j1 * nb, sizeof(float) * KEY_BLOCK * nb);
                }
                acc_t_any(acc + (size_t)i * ldacc + c0, ldacc, pt + (size_t)j0 * ldt + i, ldt, vb + c0, dv, 0,
                          j1 - j0, j0 > 0, kl, m - i < 4 ? m - i : 4, C);
            }
        }
    }
}

/* -------------------------------------------------------------- merge */

/* decode.c's chunk merge for grouped units (decode_kernels.h, merge_t):
 * the factors of 16 rows per vector exp instead of one expf per row (the
 * merges were 4.6% of a 1-thread MQA call; 0.94-0.99x its time at
 * L = 16384). */
void mha_merge_t_avx512(float *run, const float *part, int m, int dv) {
    const size_t pw = 2 + (size_t)dv;
    const __mmask16 kl = mha_mask16(dv % 16 ? dv % 16 : 16);
    for (int i0 = 0; i0 < m; i0 += 16) {
        const int n = m - i0 < 16 ? m - i0 : 16;
        float rm[16], rl[16], pm[16], pl[16], a[16], b[16];
        for (int i = 0; i < 16; i++) {
            const float *R = run + (size_t)(i0 + (i < n ? i : 0)) * pw, *P = part + (size_t)(i0 + (i < n ? i : 0)) * pw;
            rm[i] = R[0], rl[i] = R[1], pm[i] = P[0], pl[i] = P[1];
        }
        const __m512 vrm = _mm512_loadu_ps(rm), vpm = _mm512_loadu_ps(pm), mx = _mm512_max_ps(vrm, vpm);
        const __m512 va = exp_shifted(vrm, mx), vb = exp_shifted(vpm, mx);
        _mm512_storeu_ps(a, va), _mm512_storeu_ps(b, vb);
        _mm512_storeu_ps(rm, mx);
        _mm512_storeu_ps(rl, _mm512_fmadd_ps(_mm512_loadu_ps(rl), va, _mm512_mul_ps(_mm512_loadu_ps(pl), vb)));
        for (int i = 0; i < n; i++) {
            float *R = run + (size_t)(i0 + i) * pw;
            const float *P = part + (size_t)(i0 + i) * pw;
            const __m512 ai = _mm512_set1_ps(a[i]), bi = _mm512_set1_ps(b[i]);
            R[0] = rm[i], R[1] = rl[i];
            int c = 0;
            for (; c + 16 < dv; c += 16)
                _mm512_storeu_ps(R + 2 + c, _mm512_fmadd_ps(_mm512_loadu_ps(R + 2 + c), ai,
                                                            _mm512_mul_ps(_mm512_loadu_ps(P + 2 + c), bi)));
            _mm512_mask_storeu_ps(R + 2 + c, kl, _mm512_fmadd_ps(_mm512_maskz_loadu_ps(kl, R + 2 + c), ai,
                                                               _mm512_mul_ps(_mm512_maskz_loadu_ps(kl, P + 2 + c), bi)));
        }
    }
}

/* --------------------------------------------------------------- int8 */

/* dst = dequantized int8 (see from_q8 in decode_kernels.h): (float)q *
 * scale, one rounding, the bits of every table. Key panels (8 lanes): two
 * dims of a panel per zmm, their block's 8 scales twice; value rows: 16
 * columns of one block per zmm. */
/* Whole blocks of 32 (d % 32 == 0), R = rows x lanes / 16 zmm per block:
 * no tails, every scale vector a load (the common shapes, unrolled). */
INLINE void from_q8_blocks(float *dst, const int8_t *src, const float *scale, size_t rows, int nb, int lanes) {
    const size_t blk = (size_t)MHA_Q8_BLOCK * lanes; /* elements of one block */
    for (size_t rb = 0; rb < rows * (size_t)nb; rb++) {
        const __m512 sv = lanes == MHA_KPANEL ? _mm512_broadcast_f32x8(_mm256_loadu_ps(scale + rb * lanes))
                                              : _mm512_set1_ps(scale[rb]);
        UNROLL
        for (size_t i = 0; i < blk; i += 16) {
            const __m512 q = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(src + rb * blk + i))));
            _mm512_storeu_ps(dst + rb * blk + i, _mm512_mul_ps(q, sv));
        }
    }
}

void mha_from_q8_avx512(float *dst, const int8_t *src, const float *scale, size_t rows, int d, int lanes) {
    const int nb = (d + MHA_Q8_BLOCK - 1) / MHA_Q8_BLOCK;
    if (d % MHA_Q8_BLOCK == 0 && lanes == MHA_KPANEL) { /* the lane count a constant in each inlined copy */
        from_q8_blocks(dst, src, scale, rows, nb, MHA_KPANEL);
        return;
    }
    if (d % MHA_Q8_BLOCK == 0 && lanes == 1) {
        from_q8_blocks(dst, src, scale, rows, nb, 1);
        return;
    }
    const int step = lanes == MHA_KPANEL ? 2 : lanes == 1 ? 16 : 0; /* dims per zmm */
    for (size_t r = 0; r < rows; r++)
        for (int b = 0; b < nb; b++) { /* blocks outermost: one scale vector per block */
            const int c1 = (b + 1) * MHA_Q8_BLOCK < d ? (b + 1) * MHA_Q8_BLOCK : d;
            const float *sb = scale + (r * nb + (size_t)b) * lanes;
            const __m512 sv = lanes == MHA_KPANEL ? _mm512_broadcast_f32x8(_mm256_loadu_ps(sb)) : _mm512_set1_ps(sb[0]);
            int c = b * MHA_Q8_BLOCK;
            for (; step && c + step <= c1; c += step) {
                const size_t at = (r * d + c) * lanes;
                const __m512 q = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(src + at))));
                _mm512_storeu_ps(dst + at, _mm512_mul_ps(q, sv));
            }
            for (; c < c1; c++)
                for (int l = 0; l < lanes; l++)
                    dst[(r * d + c) * lanes + l] = (float)src[(r * d + c) * lanes + l] * sb[l];
        }
}

