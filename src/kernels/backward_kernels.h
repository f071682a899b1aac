/* backward_kernels.h — the attention backward's per-ISA kernels (issue 12):
 * the products S = Q K^T and dP = dZ V^T on unpacked query rows, the
 * elementwise step of one tile (P and dS from the recomputed scores), the
 * transposed products dV += P^T dZ, dK += dS^T Q (dQ += dS K is the
 * prefill table's attn_pv), the projection products' register tile and
 * the transposing copy of the key panels (pack_panels).
 * Implementations: scalar_backward.c, avx2_backward.c, avx512_backward.c;
 * dispatch.c lists each with its ISA (mha_isa.backward).
 * Legend: a tile is rows query rows x cols keys (row stride lds, room for
 * cols rounded up to 16); d16 = a head width rounded up to 16. */
#ifndef MHA_BACKWARD_KERNELS_H
#define MHA_BACKWARD_KERNELS_H

#include <stddef.h>

typedef struct mha_backward_kernels {
    const char *name;

    /* s (rows, 16*np) = a (rows, K) b: a row-major with row stride lda
     * (rows a multiple of 6, all readable), b np packed panels (K, 16) one
     * after another (16 keys each). Each s element is one fp32 FMA chain
     * over k in order (the chain of attn_scores). */
    void (*scores_rows)(float *s, size_t lds, const float *a, size_t lda, const float *b, int K,
                        int rows, int np);

    /* In place on one tile: s (rows, cols) holds scale q k^T + masks, dp
     * (rows, cols) holds dZ V^T. Column j of row i is allowed when j < cols
     * and, when lo != NULL, lo[i] <= j <= hi[i] or j >= extra (the rule of
     * attn_softmax). Then
     *   s  <- P  = exp((s - m[i]) - lse[i])    (0 where not allowed),
     *   dp <- dS = scale * P * (dp - dd[i])    (0 where not allowed),
     * and columns cols.. of the rounded-up width become 0. */
    void (*probs_ds)(float *s, float *dp, size_t lds, const float *lse, const float *m, const float *dd,
                     float scale, const int *lo, const int *hi, int extra, int rows, int cols);

    /* c (rows, d16) += a^T b: a (K, rows) with element (k, i) at
     * a[k*lda + i] (rows a multiple of 6, all readable), b (K, d16) with
     * row stride ldb. Each c element gets one fp32 sum over k in order,
     * then that sum is added to it. */
    void (*accumulate_tn)(float *c, size_t ldc, const float *a, size_t lda, const float *b,
                          size_t ldb, int rows, int K, int d16);

    /* The projection products' register tile (backward_gemm.c), tile_rows
     * (a multiple of 6) x tile_cols (a multiple of 16):
     * c (m, n) [+]= a b, m <= tile_rows, n <= tile_cols; a is
     * ceil(m/6) packed micro-panels (K, 6) one after another, b ceil(n/16)
     * packed panels (K, 16) one after another; only (m, n) of c is read or
     * written. Each c element gets one fp32 sum over k in order, then
     * (accumulate) that sum is added to it. */
    int tile_rows, tile_cols;
    void (*gemm_tile)(float *c, size_t ldc, const float *a, const float *b, int K, int m, int n,
                      int accumulate);

    /* Rows [0, n) of src (width d, row stride ld) into panels of 16 rows
     * transposed, (ceil(n/16), d, 16): element (i, e) at
     * dst[(i/16)*16d + e*16 + i%16]; rows n.. of the last panel zero. A
     * copy: every ISA gives the same bits. */
    void (*pack_panels)(float *dst, const float *src, size_t ld, int n, int d);

    /* rows (<= 6) rows of a (row stride lda) -> out (kn, 6): element (i, k)
     * at out[k*6 + i], rows past `rows` zero (the prefill table's pack_a6).
     * A copy; NULL: backward_gemm.c's portable loop. */
    void (*pack_a6)(float *out, const float *a, size_t lda, int rows, int kn);
} mha_backward_kernels;

/* The portable pack_panels (scalar_backward.c). */
void mha_bwd_pack_panels_scalar(float *dst, const float *src, size_t ld, int n, int d);

extern const mha_backward_kernels mha_backward_kernels_scalar;
extern const mha_backward_kernels mha_backward_kernels_avx2;   /* after mha_cpu_has_avx2()   */
extern const mha_backward_kernels mha_backward_kernels_avx512; /* after mha_cpu_has_avx512() */

#endif /* MHA_BACKWARD_KERNELS_H */
