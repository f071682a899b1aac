/* gemm.h — packed projections of the fast path.
 * Legend: M rows of the input (B*T or B*S), K input width, N output width.
 * A weight (K, N) row-major is packed once into panels of 16 columns,
 * stored in pairs: pair q = (K, 32), row k holding row k of panel 2q then
 * of panel 2q+1, so a 32-column register tile streams one contiguous
 * block (two separate panels at a stride of K*64 bytes share L1 sets).
 * Several weights that read the same input (W_Q | W_K | W_V) are packed
 * as sections of one matrix; each section starts on a panel boundary, so
 * one pass over the input computes all of them. */
#ifndef MHA_GEMM_H
#define MHA_GEMM_H

#include "mha.h"
#include "kernels/kernels.h"

#define MHA_PACK_MAX_SECTIONS 3

typedef struct {
    int K;                                   /* rows of every section       */
    int n_sections;
    int cols[MHA_PACK_MAX_SECTIONS];         /* N of each section           */
    int first_panel[MHA_PACK_MAX_SECTIONS + 1]; /* section s: panels [first[s], first[s+1]) */
    float *panels;                           /* (ceil(n_panels/2), K, 32), zero padded */
    float *bias;                             /* (n_panels, 16), zero padded    */
    /* options.bf16_matmul on AMX (mha_pack_bf16_pairs): the same weights,
     * exact in bf16, as pair panels (n_panels + 1, k32/2, 16, 2): panel
     * gp's row kk holds rows 2kk and 2kk+1 of its 16 columns side by
     * side, zero past K and in the extra last panel. NULL: not built. */
    uint16_t *bf16;
    int k32;                                 /* K rounded up to 32             */
} mha_packed;

#define MHA_PACK_LDB (2 * MHA_NR) /* floats between rows k and k+1 of a panel */

/* Row k of panel gp: 16 floats. */
static inline float *mha_packed_panel(const mha_packed *p, int gp, int k) {
    return p->panels + ((size_t)(gp / 2) * p->K + k) * MHA_PACK_LDB + (size_t)(gp % 2) * MHA_NR;
}

/* One section's weight as the packer reads it, in the layout it is stored
 * in: element (k, n) of the logical (K, cols) weight is
 * w[k*k_stride + n*n_stride], so the source is packed without an
 * intermediate copy. The library's (in, out): k_stride = cols, n_stride = 1;
 * nn.Linear's (out, in): k_stride = 1, n_stride = K. b: (cols), NULL: 0. */
typedef struct {
    const float *w;
    size_t k_stride, n_stride;
    const float *b;
} mha_pack_source;

/* Packs sections src[s] of cols[s] columns each. Every packed value is a
 * copy of its source element: any source layout gives the same bits. */
mha_status mha_pack_from(mha_packed *p, int K, int n_sections, const mha_pack_source *src,
                         const int *cols);
/* Packs sections w[s] (K, cols[s]) row-major with biases b[s] (cols[s], NULL: 0). */
mha_status mha_pack(mha_packed *p, int K, int n_sections, const float *const *w,
                    const float *const *b, const int *cols);
/* dst (K, cols[s]) row-major, row stride ldd <- section s of p: the
 * inverse of packing (copies: the source's bits). Rows are read as one
 * sequential stream per pair, so this is the cheap way to get a weight
 * that arrived transposed into (in, out) once it is packed. Returns 1 when
 * every value is finite (NaN and Inf: 0). */
int mha_packed_unpack(const mha_packed *p, int s, float *dst, size_t ldd);
void mha_packed_free(mha_packed *p);
/* Builds p->bf16 from p's fp32 panels, whose values must all be exact in
 * bf16 (a layer with MHA_W_BF16 weights): each is cut to its upper 16
 * bits. MHA_E_NOMEM leaves p->bf16 NULL (the driver then runs the fp32
 * kernels on rounded inputs). */
mha_status mha_pack_bf16_pairs(mha_packed *p);

/* Where a section's output column n of input row m goes. */
typedef enum {
    MHA_DST_ROWS = 0,   /* base[m*ld + n]                                      */
    MHA_DST_HEADS = 1,  /* per (b, head) block (rows_pad, ld): row s, column c */
    MHA_DST_HEADS_T = 2 /* per (b, head) block of 16-row panels (rows_pad/16, dh, 16):
                           element (s, c) at [s/16][c][s%16] (K^T for attention) */
} mha_dst_kind;

typedef struct {
    mha_dst_kind kind;
    float *base;
    size_t ld;          /* ROWS: row stride; HEADS: row stride in a head block */
    int dh;             /* HEADS*: columns per head (n = head*dh + c)          */
    int n_heads;        /* HEADS*: heads in the section                        */
    int rows;           /* HEADS*: input rows per batch: m = b*rows + s        */
    size_t head_stride; /* HEADS*: floats per (b, head) block                  */
} mha_dst;

/* One packed product: for sections [s0, s1) of p,
 *   out_s (M, cols[s]) = a (M, kn) p_s[k0 : k0+kn, :] (+ bias when use_bias),
 * written through dst[s - s0]. k0/kn select rows of the packed weight
 * (W_O's row block r of one head: k0 = r*d_v, kn = d_v). */
typedef struct {
    const mha_dst *dst;   /* s1 - s0 destinations                  */
    const float *a;       /* (M, kn) input rows, row stride lda    */
    size_t lda;
    int M;
    const mha_packed *p;
    int s0, s1;           /* sections of p                         */
    int k0, kn;           /* rows of the packed weight             */
    int use_bias;
    int bf16;             /* 1: a is rounded to bf16 first (options.bf16_matmul;
                             the weights must be exact in bf16): AMX tiles
                             when p->bf16, kern->amx_tile, the CPU allows
                             them and k0 = 0, kn = K; else the fp32 kernels
                             on the rounded input                  */
} mha_gemm_args;

/* Each output element is reduced by one thread in k order, so the result
 * does not depend on the thread count. */
mha_status mha_gemm(const mha_gemm_args *g, const mha_kernels *kern, int n_threads);
/* How many mha_gemm calls ran on AMX tiles so far (tests). */
size_t mha_gemm_amx_calls(void);

/* The compute folder's process-wide scratch pool (the threads' packed
 * input blocks, decode_gemm.c's partial sums): a 64-byte aligned block of
 * at least `floats` floats, kept or new (NULL when out of memory), given
 * back for the next call. Safe from any number of threads. */
float *mha_gemm_scratch_take(size_t floats);
void mha_gemm_scratch_give(float *block);

/* How many blocks the pool has allocated so far; blocks are kept between
 * calls, so a warm call of a shape allocates none (tests). */
size_t mha_gemm_scratch_allocations(void);

#endif /* MHA_GEMM_H */
