/* internal.h — the layer object and helpers shared inside libmha.
 * Legend: B batch, T queries, S keys, h heads, h_kv kv heads, d_k, d_v,
 * d_model, d_kv_in (see mha.h). */
#ifndef MHA_INTERNAL_H
#define MHA_INTERNAL_H

#include "mha.h"

struct mha_fast_state; /* packed weights of the fast path (forward_fast.c) */

struct mha_layer {
    mha_config cfg;   /* resolved: no zero defaults left */
    float *w_q;       /* (d_model, h*d_k)    */
    float *w_k;       /* (d_kv_in, h_kv*d_k) */
    float *w_v;       /* (d_v_in, h_kv*d_v)  */
    float *w_o;       /* (h*d_v, d_model)    */
    float *b_q;       /* (h*d_k), zeros when !bias     */
    float *b_k;       /* (h_kv*d_k)                    */
    float *b_v;       /* (h_kv*d_v)                    */
    float *b_o;       /* (d_model)                     */
    float *bias_k;    /* (h_kv*d_k), zeros when !add_bias_kv */
    float *bias_v;    /* (h_kv*d_v)                    */
    int *labels[4];   /* by mha_block: h, h_kv, h_kv, h entries */
    struct mha_fast_state *fast; /* NULL until the fast path prepares it */
};

/* GQA: query head r reads kv head r / (h / h_kv). Stated once, used everywhere. */
static inline int mha_kv_head(const mha_config *c, int r) {
    return r / (c->n_heads / c->n_kv_heads);
}

/* Number of keys attended: S plus the appended bias and zero rows. */
static inline int mha_total_keys(const mha_config *c, int S) {
    return S + c->add_bias_kv + c->add_zero_attn;
}

/* Checks that perm (h entries, new head i = old head perm[i]) is a
 * permutation that moves whole kv groups (h / h_kv consecutive heads) and
 * writes the induced kv-head permutation into kv_perm (h_kv entries).
 * Shared by mha_layer_permute_heads and mha_cache_permute_heads. */
mha_status mha_kv_perm_from_heads(int *kv_perm, const int *perm, int h, int h_kv);

/* Records a printf-style message for mha_last_error() and returns s. */
mha_status mha_fail(mha_status s, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
void mha_clear_error(void);

/* Checks that n floats are finite; names the tensor and first bad index. */
mha_status mha_check_finite(const float *p, size_t n, const char *name);

/* Validates h interventions (NULL: none) for rows = B*T positions of
 * width d_v: known op, finite scale, a finite REPLACE value (rows, d_v).
 * Shared by mha_forward and mha_forward_cached. */
mha_status mha_check_interventions(const mha_intervention *ivs, int h, size_t rows, int d_v);

/* Validates the arguments of one forward pass against the layer. */
mha_status mha_forward_validate(const mha_layer *L, const float *y, const float *x,
                                const float *k_src, const float *v_src, int B, int T, int S,
                                const mha_options *opt);

/* Whether query i may attend original key j (0 <= j < S) of batch b, head r,
 * counting causal, window, keep masks and key padding, and the additive
 * terms (mask + key_additive) to add to its scaled score. Extra keys
 * (j >= S) are always allowed with no additive term. */
int mha_mask_key(const mha_options *opt, int b, int r, int i, int j, int T, int S,
                 double *additive);

/* The reference forward (reference.c); arguments already validated and
 * k_src, v_src resolved (never NULL: x for self-attention). */
mha_status mha_forward_reference(const mha_layer *L, float *y, const mha_capture *cap,
                                 const float *x, const float *k_src, const float *v_src,
                                 int B, int T, int S, const mha_options *opt);

/* The fast forward (forward_fast.c). Returns MHA_E_UNSUPPORTED when this
 * machine or build has no fast path for the request; the caller then falls
 * back to the reference under MHA_PATH_AUTO. */
mha_status mha_forward_fast(const mha_layer *L, float *y, const mha_capture *cap,
                            const float *x, const float *k_src, const float *v_src,
                            int B, int T, int S, const mha_options *opt);
/* Called after the layer's weights change (create, set, permute) and on
 * free (with the intent to release). */
mha_status mha_fast_prepare(mha_layer *L);
void mha_fast_release(mha_layer *L);

/* ---- KV-cache prefill (issue 5; forward_cached.c) ----------------------
 * Many new rows of a cached forward are projected with the fast path's
 * packed weights (mha_gemm, gemm.h) instead of packing them again. The
 * fused W_Q | W_K | W_V matrix (sections 0, 1, 2) exists when
 * d_kv_in == d_v_in == d_model, which every cache layer has; NULL when the
 * layer has no fast state or no fused packing. W_O: NULL without state. */
#include "gemm.h"
const mha_packed *mha_fast_packed_qkv(const mha_layer *L);
const mha_packed *mha_fast_packed_o(const mha_layer *L);

#endif /* MHA_INTERNAL_H */
