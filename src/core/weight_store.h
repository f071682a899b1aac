/* weight_store.h — projection weights stored in bf16 or int8
 * (weight_store.c, MHA_W_BF16 / MHA_W_I8 in mha.h).
 *
 * The layer keeps two forms of W_Q, W_K, W_V, W_O (and W_G of a gated
 * layer, config.output_gate): the compact one
 * here, which the decode projections stream (a decode step reads every
 * weight once: fewer bytes, a faster step), and the fp32 arrays w_q..w_g,
 * which hold exactly the values the compact form represents. The
 * reference, the backward and the packed prefill GEMM read those, so every
 * path computes with the same weights and the fast paths are tested
 * against the reference as for fp32.
 * Legend: K input width (rows), N output width (columns) of a matrix. */
#ifndef MHA_CORE_WEIGHT_STORE_H
#define MHA_CORE_WEIGHT_STORE_H

#include "base/internal.h"
#include "compute/decode_gemm.h"

enum { MHA_MAT_Q = 0, MHA_MAT_K = 1, MHA_MAT_V = 2, MHA_MAT_O = 3, MHA_MAT_G = 4, MHA_N_MATS = 5 };

typedef struct mha_wstore {
    mha_weight_dtype dtype;      /* MHA_W_BF16 or MHA_W_I8                    */
    uint16_t *bf16[MHA_N_MATS];  /* BF16: (K, N) bit patterns, row-major     */
    int8_t *i8[MHA_N_MATS];      /* I8: (K, N) quantized, row-major          */
    float *scale[MHA_N_MATS];    /* I8: (groups, N), see below               */
} mha_wstore;

/* int8 scales: one per output column and group of MHA_W_I8_GROUP inputs.
 * Groups tile each segment of a matrix's rows: the whole K for W_Q, W_K,
 * W_V, W_G; each head's d_v rows for W_O, so that a head's scales move with
 * its row block (mha_layer_permute_heads). A segment's last group may be
 * shorter. */
#define MHA_W_I8_GROUP 32

/* Rows and columns of matrix m of a layer config (W_G: 0 columns
 * without config.output_gate). */
void mha_wstore_shape(const mha_config *c, int m, int *rows, int *cols);
/* Whether the layer has matrix m: every one but W_G, and W_G with
 * config.output_gate. */
int mha_wstore_has(const mha_config *c, int m);
/* The rows of one segment of matrix m, and its number of scale rows. */
int mha_wstore_segment(const mha_config *c, int m);
int mha_wstore_groups(const mha_config *c, int m);
/* The scale row of input row k, in a matrix of segments of seg rows. */
static inline int mha_wstore_group_of(int k, int seg) {
    return (k / seg) * ((seg + MHA_W_I8_GROUP - 1) / MHA_W_I8_GROUP) + (k % seg) / MHA_W_I8_GROUP;
}

/* A store of dtype for src[m] (rows, cols by mha_wstore_shape), or
 * MHA_E_ARG (a value bf16 or int8 cannot hold) / MHA_E_NOMEM; nothing else
 * changes. */
mha_status mha_wstore_build(mha_wstore **out, const mha_config *c, mha_weight_dtype dtype,
                            const float *const src[MHA_N_MATS]);
/* An I8 store holding q[m] (K, N) (integers in [-127, 127], as float: a
 * file's I8 tensors, checked by the reader) and scale[m] (groups, N) as given. */
mha_status mha_wstore_from_i8(mha_wstore **out, const mha_config *c, const float *const q[MHA_N_MATS],
                              const float *const scale[MHA_N_MATS]);
void mha_wstore_free(mha_wstore *s);
/* dst[m] (rows, cols) = the values store s represents. */
void mha_wstore_dequantize(const mha_wstore *s, const mha_config *c, float *const dst[MHA_N_MATS]);

/* Installs s (owned from now on, NULL: fp32) in L: w_q..w_g get its
 * values, the packed weights are rebuilt. */
mha_status mha_layer_adopt_wstore(mha_layer *L, mha_wstore *s);

/* Column blocks of w (rows, n*width) of elem-byte elements: new block i =
 * old block perm[i], through tmp (one row: n*width*elem bytes, given by the
 * caller, so that a move cannot fail half done). Shared by the fp32 and the
 * compact weights. */
void mha_permute_column_blocks(void *w, size_t elem, int rows, int n, int width, const int *perm, void *tmp);
/* Applies the same column-block move to L's compact matrix m (a no-op
 * for fp32): rows and width as for the fp32 matrix; int8 scales move with
 * their columns (W_Q, W_K, W_V, W_G) or with their head's rows (W_O: rows = 1).
 * tmp: n*width*4 bytes, as for the fp32 matrix (no row here is longer). */
void mha_wstore_permute(mha_layer *L, int m, int rows, int n, int width, const int *perm, void *tmp);

/* The decode projection job of matrix m: y (rows, N) from the layer's
 * weights in their stored form, with its bias. */
mha_decode_gemm_job mha_layer_decode_job(const mha_layer *L, int m, float *y);

#endif /* MHA_CORE_WEIGHT_STORE_H */
