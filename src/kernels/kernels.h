/* kernels.h — the micro-kernels behind the fast path, one table per ISA.
 * Kernels know nothing about layers: they see pointers, strides and sizes.
 * dispatch.c picks the table once (CPUID); scalar.c is the portable one.
 *
 * Legend: MR x NR = 6 x 16 is the register tile of the GEMM micro-kernel
 * (12 ymm accumulators + 2 B vectors + 1 broadcast = 15 of 16 registers).
 * Attention tiles: rows = query rows (a multiple of MR, zero padded),
 * cols = keys of one tile, d_k / dv16 = head widths (dv16 a multiple of 16). */
#ifndef MHA_KERNELS_H
#define MHA_KERNELS_H

#include <stddef.h>

#define MHA_MR 6
#define MHA_NR 16

typedef struct mha_kernels {
    const char *name;

    /* c (m,n) = [row_scale[i] * c +] a (6,K) b (K,16) [+ bias (16)], m <= 6, n <= 16.
     * a element (i,k) is a[i*a_rs + k*a_cs] for all 6 rows (callers pad);
     * b row k is b + k*ldb with 16 readable floats. row_scale == NULL:
     * c is overwritten. Each c element is one fp32 sum over k in order. */
    void (*sgemm_6x16)(float *c, size_t ldc, const float *a, size_t a_rs, size_t a_cs,
                       const float *b, size_t ldb, const float *bias,
                       const float *row_scale, int K, int m, int n);

    /* s (rows, 16*npanels) = q k^T: q is rows/6 packed micro-panels, each
     * (d_k, 6); kt is npanels panels, each (d_k, 16) (16 keys per panel). */
    void (*attn_scores)(float *s, size_t lds, const float *q, const float *kt,
                        int d_k, int rows, int npanels);

    /* Online-softmax update of one tile s (rows, cols), in place: column j
     * of row i is kept when j < cols and, when lo != NULL, when
     * lo[i] <= j <= hi[i] or j >= extra; others become -inf. Then with
     * m_new = max(m[i], row max) (0 used in place of -inf):
     *   s = exp(s - m_new), alpha[i] = exp(m[i] - m_new),
     *   l[i] = alpha[i] * l[i] + sum_j s, m[i] = m_new.
     * s has room for cols rounded up to 16. */
    void (*attn_softmax)(float *s, size_t lds, float *m, float *l, float *alpha,
                         const int *lo, const int *hi, int extra, int rows, int cols);

    /* o (rows, dv16) = alpha[i] * o + p (rows, nk) v (nk, dv16). */
    void (*attn_pv)(float *o, size_t ldo, const float *p, size_t ldp, const float *v,
                    size_t ldv, const float *alpha, int rows, int nk, int dv16);

    /* y = exp(x), n floats (used by tests; the softmax inlines it). */
    void (*vexp)(float *y, const float *x, size_t n);

    /* The projection driver's register tile, tile_rows (a multiple of 6)
     * x 16*tile_panels; NULL: the driver uses sgemm_6x16 on 6 x 16.
     * c (m, n) = a b [+ bias], m <= tile_rows, n <= 16*tile_panels: a is
     * tile_rows/6 packed micro-panels (K, 6) at stride a_ps, b packed
     * panels (K, 16) at stride b_ps (only those with live columns are
     * read). Each c element is one fp32 sum over k in order, + bias. */
    int tile_rows, tile_panels;
    void (*sgemm_tile)(float *c, size_t ldc, const float *a, size_t a_ps, const float *b,
                       size_t b_ps, const float *bias, int K, int m, int n);
} mha_kernels;

extern const mha_kernels mha_kernels_scalar;
extern const mha_kernels mha_kernels_avx2;
extern const mha_kernels mha_kernels_avx512;

/* The avx2 table's entries (avx2_gemm.c, avx2_attention.c, avx2_exp.c);
 * call them only after mha_cpu_has_avx2(). */
void mha_sgemm_avx2_6x16(float *c, size_t ldc, const float *a, size_t a_rs, size_t a_cs,
                         const float *b, size_t ldb, const float *bias,
                         const float *row_scale, int K, int m, int n);
void mha_attn_scores_avx2(float *s, size_t lds, const float *q, const float *kt, int d_k,
                          int rows, int npanels);
void mha_attn_softmax_avx2(float *s, size_t lds, float *m, float *l, float *alpha,
                           const int *lo, const int *hi, int extra, int rows, int cols);
void mha_attn_pv_avx2(float *o, size_t ldo, const float *p, size_t ldp, const float *v,
                      size_t ldv, const float *alpha, int rows, int nk, int dv16);
void mha_vexp_avx2(float *y, const float *x, size_t n);

/* The avx512 table's entries (avx512_*.c); call them only after
 * mha_cpu_has_avx512(). */
void mha_sgemm_avx512_6x16(float *c, size_t ldc, const float *a, size_t a_rs, size_t a_cs,
                           const float *b, size_t ldb, const float *bias,
                           const float *row_scale, int K, int m, int n);
void mha_sgemm_avx512_12x32(float *c, size_t ldc, const float *a, size_t a_ps, const float *b,
                            size_t b_ps, const float *bias, int K, int m, int n);
void mha_attn_scores_avx512(float *s, size_t lds, const float *q, const float *kt, int d_k,
                            int rows, int npanels);
void mha_attn_softmax_avx512(float *s, size_t lds, float *m, float *l, float *alpha,
                             const int *lo, const int *hi, int extra, int rows, int cols);
void mha_attn_pv_avx512(float *o, size_t ldo, const float *p, size_t ldp, const float *v,
                        size_t ldv, const float *alpha, int rows, int nk, int dv16);
void mha_vexp_avx512(float *y, const float *x, size_t n);

/* The table for this CPU: AVX-512 when CPUID and the OS allow it, else
 * AVX2+FMA, else scalar. MHA_KERNELS=scalar|avx2|avx512 in the
 * environment overrides (an unavailable ISA falls back to the best one
 * below it; forward.c refuses it with an error first). */
const mha_kernels *mha_kernels_get(void);
/* Forces a table (tests compare both); NULL returns to automatic choice. */
void mha_kernels_force(const mha_kernels *k);
/* 1 when this CPU can run the avx2 table. */
int mha_cpu_has_avx2(void);
/* 1 when this CPU can run the avx512 table: CPUID reports AVX-512
 * F/BW/VL/DQ, FMA and F16C, and XCR0 shows that the OS saves the x87/SSE,
 * AVX, opmask and zmm state (bits 1, 2, 5, 6, 7). cpu_avx512.c. */
int mha_cpu_has_avx512(void);

#endif /* MHA_KERNELS_H */
