/* variants.h — today's attention variants (mha.h "configuration"): their
 * configuration rules, the ALiBi default slopes, the RoPE frequencies and
 * the fp32 q/k transform (QK-norm, then RoPE) the fast and cached paths
 * apply once after their projections.
 * Legend: h heads, h_kv kv heads, d_k, r = rope.dim rotated dims. */
#ifndef MHA_CORE_VARIANTS_H
#define MHA_CORE_VARIANTS_H

#include "base/internal.h"

/* Fills the variants' defaults into *c (rope.dim, theta, factors, eps) and
 * validates them against the resolved widths. */
mha_status mha_variants_resolve(mha_config *c);

/* 1 when any variant is on (rope, alibi, softcap, sinks, qk_norm, clip_qkv). */
int mha_variants_any(const mha_config *c);

/* The paper's ALiBi slopes for n heads into slopes (n): for n a power of
 * two 2^(-8(r+1)/n); else the n' = 2^floor(log2 n) slopes of n', then the
 * 1st, 3rd, 5th, ... slopes of 2n', 2^(-4(2k+1)/n'), until n are filled. */
void mha_alibi_default_slopes(float *slopes, int n);

/* The rotation frequency of each pair i < r/2 (inv_freq (r/2)) after the
 * config's scaling, and the factor cos/sin are multiplied by (1 but for
 * YaRN and LongRoPE), for a call of length seq (mha_rope_call_length:
 * dynamic and LongRoPE depend on it). The one statement of the scaling
 * formulas, in double. */
void mha_rope_frequencies(double *inv_freq, double *mscale, const mha_config *c, long long seq);

/* 1 + the largest position among a call's B*T queries and B*S keys
 * (options.positions / key_positions, else 0..T-1 and 0..S-1): the
 * sequence length Hugging Face's dynamic and LongRoPE scalings read. */
long long mha_rope_call_length(const mha_options *opt, int keys_are_x, int B, int T, int S);

/* Llama 4's query temperature at position pos: 1 + temperature_scale *
 * ln(1 + floor((pos + 1) / temperature_floor)) (Ministral 3's rule:
 * floor(pos / temperature_floor)); 1 when the layer has none. */
double mha_query_temperature(const mha_config *c, int pos);

/* *scales (B*T) <- the temperature of each query of a call (positions
 * options.positions, else 0..T-1); NULL for a layer without one.
 * MHA_E_NOMEM naming who. */
mha_status mha_query_temperatures(float **scales, const mha_config *c, const mha_options *opt, int B, int T,
                                  const char *who);

/* Element (t, e) of a head row block is x[t*row_stride + e*elt_stride]. */
typedef struct {
    float *x;
    size_t row_stride, elt_stride;
} mha_head_rows;

/* cos and sin of pos * inv_freq times mscale for n positions: (n, r/2)
 * each; pos NULL means positions 0..n-1; the frequencies of a call of
 * length seq. NULL when out of memory. */
float *mha_rope_table(const mha_config *c, const int *pos, int n, long long seq);

/* The rotary table of one call and each projection row's row in it:
 * explicit positions (options.positions or key_positions) give every
 * query and key row a table row of its own (queries b*T + t, keys
 * B*T + b*S + j), else the rows are the positions 0..max(T, S)-1. All
 * NULL for a layer without RoPE; out of memory: MHA_E_NOMEM naming who. */
typedef struct {
    float *tab;       /* cos (n, r/2) | sin (n, r/2), mha_rope_table      */
    int n;            /* table rows                                       */
    int *qrow, *krow; /* (B*T), (B*S): the table row of each query, key   */
} mha_rope_rows;
mha_status mha_rope_rows_make(mha_rope_rows *rr, const mha_config *c, const mha_options *opt, int keys_are_x,
                              int B, int T, int S, const char *who);
void mha_rope_rows_free(mha_rope_rows *rr);

/* RoPE of one head row x (d_k) at position pos in double: pair i (dims
 * i, i + r/2 for halves; 2i, 2i+1 interleaved) rotated by pos * inv_freq[i]
 * and scaled by mscale (YaRN); dims >= r untouched. transpose: R^T instead
 * (the angle negated, same mscale), the backward of the rotation. */
void mha_rope_rotate_double(double *x, const mha_config *c, const double *inv_freq, double mscale, int pos,
                            int transpose);

/* In double, on the rows m (B, n, heads*d_k) of one projection: QK-norm
 * with weights w (when config.qk_norm), then RoPE (when config.rope), then
 * on queries the temperature (when config.temperature_floor), at
 * the query positions (keys 0; T queries) or the key positions (keys 1;
 * keys_are_x: the keys are x, so they take the query positions), with
 * the frequencies of a call of length seq (mha_rope_call_length). */
void mha_qk_transform_double(double *m, const mha_config *c, int B, int n, int heads, const float *w,
                             const mha_options *opt, int keys, int keys_are_x, int T, long long seq);

/* st = (mean, 1/sqrt(var + eps)) of a row of `width` values from their
 * sum and sum of squares (RMS: mean 0, var = mean square): the statistics
 * of qk_norm_whole, one per token over all heads. */
void mha_qk_norm_stats(double st[2], const mha_config *c, double sum, double sumsq, int width);
/* st (n, 2) = mha_qk_norm_stats of each of n contiguous rows m (n, w),
 * summed in double in index order (fast.c's whole_norm_stats takes the
 * same sums from its panels); nt threads. */
void mha_qk_norm_rows_stats(double *st, const float *m, size_t n, size_t w, const mha_config *c, int nt);

/* In place on n rows of one head (d_k wide): norm with weight w (d_k;
 * NULL: no norm), RoPE with table rows tab_row[t] (NULL: rows 0..n-1)
 * of the table for tab_n positions (NULL table: no RoPE), then row t times
 * row_scale[t] (n; NULL: none; the queries' temperature). stats (n, 2),
 * when not NULL, are each row's mha_qk_norm_stats over the whole width
 * (qk_norm_whole) instead of the head's own. */
void mha_qk_transform(const mha_config *c, mha_head_rows rows, int n, const float *w, const double *stats,
                      const float *table, int tab_n, const int *tab_row, const float *row_scale);

/* clip_qkv (OLMo 1, DBRX, MPT): the n values of a projection clamped in
 * place to [-clip, clip], torch's clamp(min=-clip, max=clip) (a NaN stays
 * NaN). clip > 0; callers skip the call when config.clip_qkv is 0. */
void mha_clip_double(double *a, size_t n, double clip);
void mha_clip(float *a, size_t n, float clip, int n_threads);

/* Gated attention (config.output_gate) in fp32: z[i] *= sigmoid(g[i]) for
 * the n values of Z and of the gate's logits G = x W_G + b_G (the fast
 * path and the KV cache; the reference gates in double). */
void mha_gate_apply(float *z, const float *g, size_t n, int n_threads);
/* g[i] = sigmoid(g[i]) in place, the factor mha_gate_apply multiplies by
 * (the same bits): the fast backward keeps it. */
void mha_gate_sigmoid(float *g, size_t n, int n_threads);

/* Largest position accepted in options.positions (angles stay exact in
 * double, distances in int). */
#define MHA_MAX_POSITION (1 << 30)

/* Position of query i of batch b: options.positions or i. */
static inline int mha_query_position(const mha_options *o, int b, int i, int T) {
    return o->positions ? o->positions[(size_t)b * T + i] : i;
}
/* Position of key j of batch b: options.key_positions, else the query
 * positions when the keys are x (keys_are_x), else j. */
static inline int mha_key_position(const mha_options *o, int keys_are_x, int b, int j, int S) {
    if (o->key_positions) return o->key_positions[(size_t)b * S + j];
    return keys_are_x && o->positions ? o->positions[(size_t)b * S + j] : j;
}

/* Checks options.positions (B,T) and key_positions (B,S) (NULL: fine):
 * 0 <= p <= MHA_MAX_POSITION, and given only for a layer with rope or
 * alibi. */
mha_status mha_check_positions(const mha_config *c, const mha_options *o, int B, int T, int S);

#endif /* MHA_CORE_VARIANTS_H */
