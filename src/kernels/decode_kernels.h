/* decode_kernels.h — microkernels of the KV-cache decode path (issue 5).
 *
 * Legend: m query rows of one kv group (n_rep heads x new tokens), n keys
 * of one chunk, d = d_k, dv = d_v, k/n of a projection (in, out).
 * Kernels know nothing about caches or layers: plain fp32 arrays, row
 * strides in elements. Three tables of one type: scalar_decode.c
 * (portable C, the fallback), avx2_decode.c (AVX2 + FMA + F16C) and
 * avx512_decode.c (+ avx512_decode_grouped.c: the grouped-heads kernels,
 * AVX-512 only); each ISA's files alone are built with its flags.
 * dispatch.c chooses one together with the prefill table (kernels.h,
 * mha_isa).
 *
 * Determinism: every output element is produced by one call in a fixed
 * order of additions, so results never depend on how callers split work
 * across threads (column tails use fmaf in the same order as the vector
 * lanes).
 */
#ifndef MHA_DECODE_KERNELS_H
#define MHA_DECODE_KERNELS_H

#include <stddef.h>
#include <stdint.h>

/* K is stored in panels of 8 keys: panel p holds (d, 8), element (key
 * 8p+i, dim c) at [p*d*8 + c*8 + i], so one 8-wide load reads dim c of 8
 * keys and a score needs no horizontal sum. */
#define MHA_KPANEL 8

/* int8 storage (MHA_CACHE_I8): one fp32 scale per block of this many
 * values along d (a shorter last block when d % 32 != 0); a value is
 * (float)q * scale, one rounding, the same in every implementation. Key
 * scales are paneled like the keys: panel p holds (nb, 8), the scale of
 * key 8p+i, block b at [p*nb*8 + b*8 + i] (nb = ceil(d/32)); value
 * scales are rows: (n, nbv). */
#define MHA_Q8_BLOCK 32

/* Storage kinds of the grouped kernels (the values of mha_cache_dtype). */
enum { MHA_DK_F32 = 0, MHA_DK_F16 = 1, MHA_DK_I8 = 2 };

typedef struct {
    const char *name;
    /* s (m, n), row stride lds: s[i][j] = q_i . key j.
     * q (m, d) with row stride ldq; kp: n/8 panels of (d, 8); n % 8 == 0. */
    void (*scores)(float *s, int lds, const float *q, int ldq, const float *kp, int m, int n,
                   int d);
    /* The same over fp16 panels, widened in registers (few rows: each key
     * is converted once per 4 rows). */
    void (*scores_h)(float *s, int lds, const float *q, int ldq, const uint16_t *kp, int m, int n,
                     int d);
    /* In place on s (m, n): s[i][j] <- exp(s[i][j] - mx[i]) with mx[i] the
     * row max; sum[i] = sum_j of the result. A row of only -inf gets
     * mx = -inf, sum = 0 and zeros. n % 8 == 0. */
    void (*softmax)(float *s, int lds, float *mx, float *sum, int m, int n);
    /* acc (m, dv) = p (m, n) v (n, dv); acc row stride ldacc, p ldp.
     * Overwrites acc. */
    void (*accumulate)(float *acc, int ldacc, const float *p, int ldp, const float *v, int m, int n,
                       int dv);
    void (*accumulate_h)(float *acc, int ldacc, const float *p, int ldp, const uint16_t *v, int m,
                         int n, int dv);
    /* y (m, n) += x (m, k) w (k, n) for few rows (m <= 4): streams w once,
     * rows of w in order; y row stride ldy, x ldx, w ldw. */
    void (*gemm_stream)(float *y, int ldy, const float *x, int ldx, const float *w, int ldw,
                        int m, int k, int n);
    /* y (m, n) = x (m, k) w (k, n) for many rows: register tiles. */
    void (*gemm_tile)(float *y, int ldy, const float *x, int ldx, const float *w, int ldw, int m,
                      int k, int n);
    /* y (n) = a * y + b * x: merging two partial softmax states. */
    void (*axpby)(float *y, const float *x, float a, float b, int n);
    /* IEEE binary16 conversions, round to nearest even (identical bits in
     * both implementations). */
    void (*to_f16)(uint16_t *dst, const float *src, size_t n);
    void (*from_f16)(float *dst, const uint16_t *src, size_t n);
    /* ---- int8 cache (MHA_CACHE_I8); last, so tables written in order
     * before it stay valid; a table without its own int8 kernels takes
     * these three from the scalar or AVX2 table. */
    /* scores over int8 panels kq with scales ks (see MHA_Q8_BLOCK), one
     * scale per block, not per element: per block of 32 dims blk = sum
     * of q * (float)k in dim order (fma), then s = fma(blk, scale, s).
     * Not the bits of scores on the dequantized keys (held to the fp32
     * tolerance against them instead); the same bits in every table. */
    void (*scores_q8)(float *s, int lds, const float *q, int ldq, const int8_t *kq, const float *ks,
                      int m, int n, int d);
    /* int8 rows vq (n, dv) with scales vs (n, ceil(dv/32)), the scale
     * folded into the weight: acc = fma(p_j * scale(j, block), (float)v,
     * acc) in key order; the same bits in every table. */
    void (*accumulate_q8)(float *acc, int ldacc, const float *p, int ldp, const int8_t *vq,
                          const float *vs, int m, int n, int dv);
    /* dst = dequantized int8 rows: rows x (d, lanes) elements, element
     * (r, c, l) at [(r*d + c)*lanes + l], its scale at
     * [(r*nb + c/32)*lanes + l] (lanes 8: key panels, 1: value rows). */
    void (*from_q8)(float *dst, const int8_t *src, const float *scale, size_t rows, int d, int lanes);
    /* ---- bf16 / int8 projection weights (MHA_W_BF16, MHA_W_I8 in mha.h):
     * gemm_stream over w (k, n) stored as bf16 bit patterns, widened to
     * fp32 (exact) in registers: the same additions in the same order as
     * gemm_stream on the widened values. Any m: each weight is widened
     * once for all m rows (a batched decode step reads the weights once). */
    void (*gemm_stream_bf16)(float *y, int ldy, const float *x, int ldx, const uint16_t *w, int ldw,
                             int m, int k, int n);
    /* y (m, n) += (x (m, k) q (k, n)) * scale (n), k rows of one scale
     * group (k <= 32): per element acc = fmaf(x, (float)q, acc) in k order
     * from 0, then y = fmaf(acc, scale, y). Every table gives these bits. */
    void (*gemm_stream_i8)(float *y, int ldy, const float *x, int ldx, const int8_t *w, int ldw,
                           const float *scale, int m, int k, int n);
    /* ---- grouped heads (many query rows on one kv head: MQA): the scores
     * stored transposed, keys by rows, so that one key's scalar meets a
     * vector of 16 query rows (no horizontal sums, no lane shuffles) and
     * the softmax runs 16 rows per vector. NULL in a table: decode.c uses
     * the row-major kernels above. m <= 32 rows. The AVX-512 kernels also
     * request the bytes after each K panel / V block into L1 (the next
     * panel, block or chunk of the stream; a prefetch never faults). */
    /* st (n, ldt): st[j][i] = q_i . key j, q given transposed, qt (d, ldq);
     * keys k in panels of the storage `kind` (MHA_DK_*; int8 with the
     * paneled scales ks), widened panel by panel into buf (2 d 8 floats;
     * unused for fp32) exactly as from_f16 / from_q8 widen them; n % 8 ==
     * 0. Each score is one fmaf chain in dim order from 0: the bits of
     * scores on the widened keys (and of scores_scalar). */
    void (*scores_t)(float *st, int ldt, const float *qt, int ldq, const void *k, const float *ks, int kind,
                     float *buf, int m, int n, int d);
    /* softmax over the keys of each row (column of st): the max and the
     * exponentials of softmax (same bits); sum[i] = (terms of even keys,
     * in order) + (odd keys, in order), not softmax's order. A row of only
     * -inf: mx = -inf, sum = 0 and zeros. */
    void (*softmax_t)(float *st, int ldt, float *mx, float *sum, int m, int n);
    /* acc (m, dv) = pt^T v: pt (n, ldt) the weights by keys, v (n, dv)
     * rows of the storage `kind` (int8: scales vs (n, ceil(dv/32))),
     * widened 32 rows at a time into buf (32 dv floats; unused for fp32).
     * One fmaf chain per element in key order from 0: the bits of
     * accumulate on the widened values. */
    void (*accumulate_t)(float *acc, int ldacc, const float *pt, int ldt, const void *v, const float *vs,
                         int kind, float *buf, int m, int n, int dv);
    /* run = merge(run, part) of m rows (<= 32) of softmax states [max,
     * sum, acc (dv)], row stride 2 + dv (decode.c's chunk merge): M =
     * max(m_r, m_p), factors a = exp(m_r - M), b = exp(m_p - M) of 16
     * rows per vector (the softmax's exp: exactly 1 for the state that
     * holds M, 0 for an empty state, whose max is -inf, and below
     * e^-87), sum = fma(sum_r, a, sum_p b), acc = fma(acc_r, a, acc_p
     * b). NULL: decode.c's scalar merge. */
    void (*merge_t)(float *run, const float *part, int m, int dv);
    /* ---- spread prefetch (decode.c; round 8 on AVX-512, 33 on AVX2): the row-major
     * kernels above (scores*, accumulate*) that this thread calls next
     * request the lines of [p, end) into L1 (into L2 alone with to_l2),
     * `per` lines per step of their inner loops, in order; returns where
     * the previous stream stopped (the caller requests the rest; its end
     * is the caller's to keep). p = end = NULL stops the stream. Only
     * moves bytes between cache levels: no bits change. NULL in a table:
     * no stream. */
    const char *(*prefetch_stream)(const char *p, const char *end, int per, int to_l2);
    /* The steps of the stream that this table's row-major scores and
     * accumulate make for m rows and nk keys (a multiple of 8) of a chunk
     * whose K and V are stored as kt and vt (MHA_DK_*), over which the
     * caller spreads the next chunk's lines. NULL: the AVX-512 table's
     * tiling (decode.c). */
    size_t (*prefetch_steps)(int m, int nk, int d_k, int d_v, int kt, int vt);
    /* Whether units of m rows of such a cache take the stream; NULL: all
     * (row-major) units. The others keep decode.c's rule without it. */
    int (*prefetch_streams)(int m, int kt, int vt);
} mha_decode_kernels;

extern const mha_decode_kernels mha_decode_kernels_scalar;
extern const mha_decode_kernels mha_decode_kernels_avx2;
extern const mha_decode_kernels mha_decode_kernels_avx512; /* avx512_decode.c */

/* The AVX2 int8 kernels; the AVX-512 table has its own. */
void mha_scores_q8_avx2(float *s, int lds, const float *q, int ldq, const int8_t *kq, const float *ks,
                        int m, int n, int d);
void mha_accumulate_q8_avx2(float *acc, int ldacc, const float *p, int ldp, const int8_t *vq,
                            const float *vs, int m, int n, int dv);
void mha_from_q8_avx2(float *dst, const int8_t *src, const float *scale, size_t rows, int d, int lanes);
/* The AVX2 fp32 stream's sweep on AMD Zen (avx2_gemm_wq.c): gemm_stream's
 * contract for 1 <= m <= 4 rows. */
void mha_gemm_sweep_f32_avx2(float *y, int ldy, const float *x, int ldx, const float *w, int ldw, int m, int k,
                             int n);
/* The bf16 / int8 weight streams of each table (scalar_gemm_wq.c,
 * avx2_gemm_wq.c, avx512_gemm_wq.c). */
void mha_gemm_stream_bf16_scalar(float *y, int ldy, const float *x, int ldx, const uint16_t *w, int ldw, int m,
                                 int k, int n);
void mha_gemm_stream_i8_scalar(float *y, int ldy, const float *x, int ldx, const int8_t *w, int ldw,
                               const float *scale, int m, int k, int n);
void mha_gemm_stream_bf16_avx2(float *y, int ldy, const float *x, int ldx, const uint16_t *w, int ldw, int m,
                               int k, int n);
void mha_gemm_stream_i8_avx2(float *y, int ldy, const float *x, int ldx, const int8_t *w, int ldw,
                             const float *scale, int m, int k, int n);
void mha_gemm_stream_bf16_avx512(float *y, int ldy, const float *x, int ldx, const uint16_t *w, int ldw, int m,
                                 int k, int n);
void mha_gemm_stream_i8_avx512(float *y, int ldy, const float *x, int ldx, const int8_t *w, int ldw,
                               const float *scale, int m, int k, int n);
/* The AVX-512 grouped-heads kernels and int8 widening (avx512_decode_grouped.c). */
void mha_scores_t_avx512(float *st, int ldt, const float *qt, int ldq, const void *k, const float *ks, int kind,
                         float *buf, int m, int n, int d);
void mha_softmax_t_avx512(float *st, int ldt, float *mx, float *sum, int m, int n);
void mha_accumulate_t_avx512(float *acc, int ldacc, const float *pt, int ldt, const void *v, const float *vs,
                             int kind, float *buf, int m, int n, int dv);
void mha_from_q8_avx512(float *dst, const int8_t *src, const float *scale, size_t rows, int d, int lanes);
void mha_merge_t_avx512(float *run, const float *part, int m, int dv);
/* The decode attention's prefetch tuning (src/cache/decode.c): four
 * bursts per chunk (the Xeon's of rounds 6-7), a stream spread over the
 * kernels' loop steps (round 8), or that stream into L2 (an L1D under 48
 * KiB, Zen 4: round 15), chosen by CPUID; forcing one (tests, A/B; < 0:
 * by CPUID again) changes no bits. */
enum { MHA_DECODE_PF_BURSTS = 0, MHA_DECODE_PF_STREAM = 1, MHA_DECODE_PF_STREAM_L2 = 2 };
int mha_decode_prefetch_policy(void);
void mha_decode_force_prefetch_policy(int policy);
#endif /* MHA_DECODE_KERNELS_H */
