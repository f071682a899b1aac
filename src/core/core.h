/* core.h — what core/ offers the engines above it: request validation
 * (options.c), mask semantics (mask.c), the GQA permutation rule (layer.c)
 * and the packed weights (packing.h). */
#ifndef MHA_CORE_H
#define MHA_CORE_H

#include "base/internal.h"
#include "core/packing.h"

/* The fp32 paths (fast, cached) refuse a call whose scaled scores may
 * exceed this in magnitude, bounded by |scale| * |q| * |k| (L2 norms,
 * Cauchy-Schwarz): an fp32 score near 2^17 is rounded to 2^-6, which moves
 * a probability by up to 1.6%, and past 3.4e38 it overflows (issue 9:
 * x = 1e22 gave a 65% error with no sign). Trained models stay far below
 * (|q| |k| / sqrt(d_k) ~ 1e2); tests reach logits of 1e4. */
#define MHA_FAST_SCORE_LIMIT 131072.0

/* A layer of config cfg (resolved here) with every tensor allocated: the
 * small ones hold their defaults (zero biases, default slopes, unit
 * norms); w_q, w_k, w_v, w_o are NOT written and there is no fast state.
 * For converters that write the weights straight into place
 * (convert_torch.c): they fill the four weights and any bias, then pack
 * (mha_fast_prepare or mha_fast_prepare_from). */
mha_status mha_layer_alloc(mha_layer **out, const mha_config *cfg);

/* Checks that perm (h entries, new head i = old head perm[i]) is a
 * permutation that moves whole kv groups (h / h_kv consecutive heads) and
 * writes the induced kv-head permutation into kv_perm (h_kv entries).
 * Shared by mha_layer_permute_heads and mha_cache_permute_heads. */
mha_status mha_kv_perm_from_heads(int *kv_perm, const int *perm, int h, int h_kv);

/* Validates h interventions (NULL: none) for rows = B*T positions of
 * width d_v: known op, finite scale, a finite REPLACE value (rows, d_v).
 * Shared by mha_forward and mha_forward_cached. */
mha_status mha_check_interventions(const mha_intervention *ivs, int h, size_t rows, int d_v);

/* Validates options (scale, flags, mask shapes and values, interventions)
 * for a (B,T,S) request of config c; part of mha_forward_validate. */
mha_status mha_check_options(const mha_config *c, const mha_options *o, int B, int T, int S);
/* options.cu_seqlens / n_seqs: both or neither, S = T, 0 = cu[0] < ... <
 * cu[n_seqs] = T, no sink_tokens or chunk_size (part of mha_check_options). */
mha_status mha_check_cu_seqlens(const mha_options *o, int T, int S);

/* mha_head_intervene (mha.h) with REPLACE reading value row value_row[t]
 * for z row t (NULL: row t): the cached forward packs its rows. */
mha_status mha_head_intervene_rows(float *z, const mha_intervention *iv, int r, int n, int rows, int d,
                                   const size_t *value_row);

/* The options every forward honours: finite scale, a known masked_row,
 * valid interventions for rows = B*T positions of width d_v. */
mha_status mha_check_common_options(const mha_options *o, int h, size_t rows, int d_v);
/* MHA_E_UNSUPPORTED naming who when o asks for bf16 projections (an
 * entry that only has fp32 ones); MHA_OK for NULL or 0. */
mha_status mha_refuse_bf16_matmul(const mha_options *o, const char *who);
/* options.bf16_matmul's conditions: the layer's weights are bf16
 * (MHA_E_ARG naming the fix); an input's n values round to finite bf16
 * ones (MHA_E_NONFINITE naming the first that does not). */
mha_status mha_check_bf16_weights(const mha_layer *L);
mha_status mha_check_bf16_input(const float *p, size_t n, const char *name);

/* The keys [*lo, *hi] of 0..S-1 that causal and the windows allow for
 * query i (aligned as o->align says); *lo > *hi when none. The one
 * statement of that rule: mha_mask_key and the fast tiles use it. With
 * sink_tokens (and window_left) it is the hull from key 0: the keys
 * between the sinks and the window need mha_mask_key. */
void mha_mask_interval(const mha_options *o, int i, int T, int S, int *lo, int *hi);

/* Validates the arguments of one forward pass against the layer; messages
 * start with who (the public entry: "mha_forward", "mha_backward", ...). */
mha_status mha_forward_validate(const char *who, const mha_layer *L, const float *y, const float *x,
                                const float *k_src, const float *v_src, int B, int T, int S,
                                const mha_options *opt);

/* A forward request's NULL arguments resolved in place (opt NULL: *defaults,
 * filled here; k_src NULL: x; v_src NULL: k_src), then validated as above
 * (out stands for Y, (B,T,d_model)). Shared by every entry that takes a
 * forward request: mha_forward, mha_forward_lse, mha_backward. */
mha_status mha_forward_request(const char *who, const mha_layer *L, const float *out, const float *x,
                               const float **k_src, const float **v_src, const mha_options **opt,
                               mha_options *defaults, int B, int T, int S);

/* Whether query i may attend original key j (0 <= j < S) of batch b, head r,
 * counting causal, window, keep masks and key padding, and the additive
 * terms (mask + key_additive) to add to its scaled score. Extra keys
 * (j >= S) are always allowed with no additive term. */
int mha_mask_key(const mha_options *opt, int b, int r, int i, int j, int T, int S,
                 double *additive);

/* Attention dropout (options.dropout_p): the factor m of probability
 * (b, r, i, j) of a call with h heads and T queries, P' = P m, in double:
 * 1 / (1 - p) where the draw keeps it, 0 where it drops it, 1 without
 * dropout. The draw is a hash of dropout_seed, the row (b h + r) T + i and
 * the key j (mask.c): 32 bits at or above p 2^32. The one statement of
 * the draw: the reference forward and backward call this, the fast tiles
 * and the backward mha_dropout_row. */
double mha_dropout_factor(const mha_options *o, int h, int T, int b, int r, int i, int j);
/* p[j] *= 1 / (1 - dropout_p) where the draw keeps (.., j0 + j), else 0,
 * for j < n: one row of a fast tile (query i of batch b, head r). */
void mha_dropout_row(float *p, int n, const mha_options *o, int h, int T, int b, int r, int i, int j0);
/* MHA_E_UNSUPPORTED naming who when o asks for dropout (an entry without
 * it: the KV cache, the lse forwards); MHA_OK for NULL or 0. */
mha_status mha_refuse_dropout(const mha_options *o, const char *who);

#endif /* MHA_CORE_H */
