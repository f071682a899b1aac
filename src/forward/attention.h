/* attention.h — the fast path's fused attention (FlashAttention algorithm).
 * Legend: B batch, T queries, S keys, S_tot = S + extra keys (bias_kv,
 * zero_attn), S_pad = S_tot rounded up to 16, h, h_kv heads, d_k, d_v,
 * ldv = d_v rounded up to 16. */
#ifndef MHA_ATTENTION_H
#define MHA_ATTENTION_H

#include "core/core.h"
#include "kernels/kernels.h"

typedef struct {
    const mha_config *cfg; /* resolved layer config (heads, widths, GQA map) */
    const mha_options *opt;
    const float *q;  /* (B,T,h*d_k): head r at columns [r*d_k, (r+1)*d_k);
                        (B,h,T,d_k) when q_head_major                      */
    const float *kt; /* (B,h_kv,S_pad/16,d_k,16): K^T in panels of 16 keys     */
    const float *v;  /* (B,h_kv,S_pad,ldv): V rows, columns >= d_v are zero    */
    float *z;        /* (B,T,h*d_v): head r written at columns [r*d_v, ...)   */
    float *probs;    /* (B,h,T,S_tot) or NULL                                  */
    int B, T, S, S_tot, S_pad, ldv;
    float scale;
    int q_head_major; /* 1: q is (B,h,T,d_k) instead: each head's rows are
                         contiguous, which the query tiles read 5x faster */
    /* today's variants (cfg->softcap, cfg->alibi, cfg->sinks say which) */
    const float *alibi_slopes; /* (h) */
    const float *sinks;        /* (h) */
    int keys_are_x;            /* key positions default to the queries'    */
    int *alibi_far;            /* ALiBi: set to 1 when a row's largest score
                                  exceeds MHA_FAST_SCORE_LIMIT (NULL: not
                                  checked)                                 */
} mha_attn_args;

/* Z^(r) = softmax(softcap(scale * Q^(r) K^(g)^T) + alibi + mask, sink) V^(g)
 * for every (b, r) (q and k already normalized and rotated):
 * tiles of query rows against tiles of keys with an online softmax, no
 * (T, S) buffer unless probs is requested; key tiles that causal/window
 * masks exclude entirely are skipped. Rows with no allowed key get 0 or
 * NaN (opt->masked_row), in z and probs alike. */
mha_status mha_attention(const mha_attn_args *a, const mha_kernels *k, int n_threads);

#endif /* MHA_ATTENTION_H */
