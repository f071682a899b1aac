/* reference.c — the oracle: plain loops that mirror the math in mha.h,
 * accumulating in double. Every option exists here first; the fast path is
 * tested against it. Readability over speed.
 * Legend: B batch, T queries, S keys, Sx = S + extra keys, h heads,
 * h_kv kv heads, d_k, d_v, d_model, d_kv_in. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/bf16.h"
#include "core/variants.h"
#include "forward/forward.h"

void mha_linear_double(double *out, const float *in, const float *w, const float *b, size_t rows,
                          int k, int n) {
    for (size_t t = 0; t < rows; t++)
        for (int o = 0; o < n; o++) {
            double acc = b[o];
            for (int i = 0; i < k; i++) acc += (double)in[t * k + i] * w[(size_t)i * n + o];
            out[t * n + o] = acc;
        }
}

/* options.bf16_matmul: a projection's input rounded to bf16 (n values;
 * forward validation has checked that they round to finite ones). */
static float *bf16_copy(const float *src, size_t n) {
    float *r = malloc(n * sizeof(float));
    if (r) mha_bf16_round_array(r, src, n);
    return r;
}

/* The interventions of mha.h applied to head r's block of z (rows, h*d). */
static void intervene_double(double *z, const mha_intervention *iv, int r, int h, size_t rows, int d) {
    double *blk = z + (size_t)r * d;
    size_t zw = (size_t)h * d;
    for (int i = 0; i < d; i++) {
        double mean = 0.0;
        if (iv->op == MHA_HEAD_MEAN) {
            for (size_t t = 0; t < rows; t++) mean += blk[t * zw + i];
            mean /= (double)rows;
        }
        for (size_t t = 0; t < rows; t++) {
            double *e = &blk[t * zw + i];
            switch (iv->op) {
            case MHA_HEAD_KEEP: break;
            case MHA_HEAD_ZERO: *e = 0.0; break;
            case MHA_HEAD_SCALE: *e *= iv->scale; break;
            case MHA_HEAD_MEAN: *e = mean; break;
            case MHA_HEAD_REPLACE: *e = iv->value[t * d + i]; break;
            }
        }
    }
}

/* z (B,T,h*d_v) = attention of q (B,T,h*d_k) over k (B,Sx,h_kv*d_k) and
 * v (B,Sx,h_kv*d_v), S original keys then the extra ones; probs
 * (B,h,T,Sx) and lse (B,h,T) when not NULL. lse is log sum_j exp(score_j)
 * over the allowed keys, -inf for a row with none. */
mha_status mha_attend_reference(const mha_config *c, const mha_head_terms *ht, double *z,
                                float *probs, float *lse, const double *q, const double *k,
                                const double *v, int B, int T, int S, const mha_options *opt) {
    const float *slopes = c->alibi && ht ? ht->alibi_slopes : NULL;
    const float *sinks = c->sinks && ht ? ht->sinks : NULL;
    const int keys_are_x = ht ? ht->keys_are_x : 0;
    const int h = c->n_heads, d_k = c->d_k, d_v = c->d_v;
    const int Sx = mha_total_keys(c, S);
    const size_t qw = (size_t)h * d_k, kw = (size_t)c->n_kv_heads * d_k,
                 vw = (size_t)c->n_kv_heads * d_v, zw = (size_t)h * d_v;
    const double scale = opt->scale != 0.0f ? opt->scale : 1.0 / sqrt((double)d_k);
    double *score = malloc((size_t)Sx * sizeof(double)); // (Sx) one query row
    int *allowed = malloc((size_t)Sx * sizeof(int));     // (Sx)
    if (!score || !allowed) {
        free(score), free(allowed);
        return mha_fail(MHA_E_NOMEM, "reference attention: no memory for one score row (S=%d)", Sx);
    }

    // --- Z^(r) = dropout(softmax(softcap(scale * Q^(r) K^(g)^T) + alibi + mask, sink)) V^(g)
    for (int b = 0; b < B; b++)
        for (int r = 0; r < h; r++) {
            const int g = mha_kv_head(c, r);
            for (int i = 0; i < T; i++) {
                const double *qi = q + ((size_t)b * T + i) * qw + (size_t)r * d_k;
                double *zi = z + ((size_t)b * T + i) * zw + (size_t)r * d_v;
                double max = -INFINITY;
                for (int j = 0; j < Sx; j++) {
                    double add = 0.0;
                    allowed[j] = j >= S || mha_mask_key(opt, b, r, i, j, T, S, &add);
                    if (!allowed[j]) continue;
                    const double *kj = k + ((size_t)b * Sx + j) * kw + (size_t)g * d_k;
                    double dot = 0.0;
                    for (int e = 0; e < d_k; e++) dot += qi[e] * kj[e];
                    score[j] = scale * dot;
                    if (c->softcap != 0.0f) score[j] = c->softcap * tanh(score[j] / c->softcap);
                    if (slopes) /* -slope_r * |p_i - p_j| */
                        score[j] -= slopes[r] * fabs((double)mha_query_position(opt, b, i, T) -
                                                     mha_key_position(opt, keys_are_x, b, j, S));
                    score[j] += add;
                    if (score[j] > max) max = score[j];
                }
                float *prow = probs ? probs + (((size_t)b * h + r) * T + i) * Sx : NULL;
                float *lrow = lse ? lse + ((size_t)b * h + r) * T + i : NULL;
                if (max == -INFINITY) { /* no key allowed: zero or NaN row (zero with a sink: it takes all) */
                    double fill = opt->masked_row == MHA_MASKED_ROW_NAN && !sinks ? NAN : 0.0;
                    for (int e = 0; e < d_v; e++) zi[e] = fill;
                    for (int j = 0; prow && j < Sx; j++) prow[j] = (float)fill;
                    if (lrow) *lrow = -INFINITY;
                    continue;
                }
                /* lse covers the keys (mha.h): a sink is no key, so it is left out of lse */
                if (lrow && sinks) {
                    double keys = 0.0;
                    for (int j = 0; j < Sx; j++)
                        if (allowed[j]) keys += exp(score[j] - max);
                    *lrow = (float)(max + log(keys));
                }
                /* a sink joins the denominator: exp(sink_r) with no value */
                if (sinks && sinks[r] > max) max = sinks[r];
                double sum = sinks ? exp(sinks[r] - max) : 0.0;
                for (int j = 0; j < Sx; j++) {
                    score[j] = allowed[j] ? exp(score[j] - max) : 0.0;
                    sum += score[j];
                }
                if (lrow && !sinks) *lrow = (float)(max + log(sum));
                for (int e = 0; e < d_v; e++) zi[e] = 0.0;
                for (int j = 0; j < Sx; j++) {
                    double p = score[j] / sum;
                    if (opt->dropout_p > 0.0f) /* dropout after the softmax: dropped 0, kept 1 / (1 - p) */
                        p *= mha_dropout_factor(opt, h, T, b, r, i, j);
                    if (prow) prow[j] = (float)p;
                    if (p == 0.0) continue;
                    const double *vj = v + ((size_t)b * Sx + j) * vw + (size_t)g * d_v;
                    for (int e = 0; e < d_v; e++) zi[e] += p * vj[e];
                }
            }
        }

    free(score), free(allowed);
    return MHA_OK;
}

mha_status mha_forward_reference_lse(const mha_layer *L, float *y, const mha_capture *cap,
                                     float *lse, const float *x, const float *k_src,
                                     const float *v_src, int B, int T, int S,
                                     const mha_options *opt) {
    const mha_config *c = &L->cfg;
    const int h = c->n_heads, h_kv = c->n_kv_heads, d_k = c->d_k, d_v = c->d_v, D = c->d_model;
    const int Sx = mha_total_keys(c, S);
    const size_t qw = (size_t)h * d_k, kw = (size_t)h_kv * d_k, vw = (size_t)h_kv * d_v, zw = (size_t)h * d_v;

    double *q = malloc((size_t)B * T * qw * sizeof(double));   // (B,T,h*d_k)
    double *k = calloc((size_t)B * Sx * kw, sizeof(double));   // (B,Sx,h_kv*d_k)
    double *v = calloc((size_t)B * Sx * vw, sizeof(double));   // (B,Sx,h_kv*d_v)
    double *z = malloc((size_t)B * T * zw * sizeof(double));   // (B,T,h*d_v)
    /* bf16 projections: x, k_src, v_src rounded (each source once) */
    const int bf16 = opt->bf16_matmul;
    float *xr = bf16 ? bf16_copy(x, (size_t)B * T * D) : NULL;                                 // (B,T,d_model)
    float *kr = bf16 && k_src != x ? bf16_copy(k_src, (size_t)B * S * c->d_kv_in) : NULL;     // (B,S,d_kv_in)
    float *vr = bf16 && v_src != x && v_src != k_src ? bf16_copy(v_src, (size_t)B * S * c->d_v_in) : NULL;
    if (!q || !k || !v || !z || (bf16 && (!xr || (k_src != x && !kr) || (v_src != x && v_src != k_src && !vr)))) {
        free(q), free(k), free(v), free(z), free(xr), free(kr), free(vr);
        return mha_fail(MHA_E_NOMEM, "reference forward: no memory for Q, K, V, Z (B=%d T=%d S=%d)", B, T, S);
    }
    const int keys_are_x = k_src == x;
    if (bf16) {
        const float *ks = k_src == x ? xr : kr;
        v_src = v_src == x ? xr : v_src == k_src ? ks : vr;
        k_src = ks, x = xr;
    }

    // --- projections: Q = X W_Q + b_Q; K = Xk W_K + b_K; V = Xv W_V + b_V; extra rows
    mha_linear_double(q, x, L->w_q, L->b_q, (size_t)B * T, D, (int)qw);
    for (int b = 0; b < B; b++) {
        mha_linear_double(k + (size_t)b * Sx * kw, k_src + (size_t)b * S * c->d_kv_in, L->w_k, L->b_k,
                      (size_t)S, c->d_kv_in, (int)kw);
        mha_linear_double(v + (size_t)b * Sx * vw, v_src + (size_t)b * S * c->d_v_in, L->w_v, L->b_v,
                      (size_t)S, c->d_v_in, (int)vw);
        if (c->add_bias_kv) { /* key S is the learned bias row; a zero row (if any) follows */
            for (size_t i = 0; i < kw; i++) k[((size_t)b * Sx + S) * kw + i] = L->bias_k[i];
            for (size_t i = 0; i < vw; i++) v[((size_t)b * Sx + S) * vw + i] = L->bias_v[i];
        }
    }

    // --- clip_qkv: Q, K, V clamped to [-c, c] (extra keys never coexist with it: Sx = S)
    if (c->clip_qkv != 0.0f) {
        mha_clip_double(q, (size_t)B * T * qw, c->clip_qkv);
        mha_clip_double(k, (size_t)B * Sx * kw, c->clip_qkv);
        mha_clip_double(v, (size_t)B * Sx * vw, c->clip_qkv);
    }

    // --- today's variants on q and k: QK-norm, then RoPE (extra keys never coexist with them)
    const long long seq = mha_rope_call_length(opt, keys_are_x, B, T, S); /* dynamic, LongRoPE */
    mha_qk_transform_double(q, c, B, T, h, L->q_norm, opt, 0, keys_are_x, T, seq);
    mha_qk_transform_double(k, c, B, S, h_kv, L->k_norm, opt, 1, keys_are_x, T, seq);

    // --- attention: Z^(r) = softmax(softcap(scale * Q^(r) K^(g)^T) + alibi + mask, sink) V^(g)
    const mha_head_terms ht = {L->alibi_slopes, L->sinks, keys_are_x};
    mha_status s = mha_attend_reference(c, &ht, z, cap ? cap->probs : NULL, lse, q, k, v, B, T, S, opt);
    const size_t rows = (size_t)B * T;
    // --- gated attention: Z^(r) *= sigmoid(X W_G + b_G)^(r), element by element
    double *g = !s && c->output_gate ? malloc(rows * zw * sizeof(double)) : NULL; // (B,T,h*d_v)
    if (!s && c->output_gate && !g) s = mha_fail(MHA_E_NOMEM, "reference forward: no memory for the gate (B=%d T=%d)", B, T);
    if (g) {
        mha_linear_double(g, x, L->w_g, L->b_g, rows, D, (int)zw);
        for (size_t i = 0; i < rows * zw; i++) z[i] *= 1.0 / (1.0 + exp(-g[i]));
        free(g);
    }
    free(xr), free(kr), free(vr);
    if (s) {
        free(q), free(k), free(v), free(z);
        return s;
    }

    // --- interventions on Z^(r), before concatenation is read by W_O
    for (int r = 0; opt->interventions && r < h; r++)
        intervene_double(z, &opt->interventions[r], r, h, rows, d_v);
    if (cap && cap->z)
        for (size_t i = 0; i < rows * zw; i++) cap->z[i] = (float)z[i];
    /* bf16 projections: W_O reads Z as fp32 rounded to bf16 */
    for (size_t i = 0; bf16 && i < rows * zw; i++) {
        const float zf = (float)z[i];
        if (!(fabsf(zf) <= MHA_BF16_ROUNDS_FINITE) && !isnan(zf)) {
            free(q), free(k), free(v), free(z);
            return mha_fail(MHA_E_NONFINITE, "reference forward: Z[%zu] = %g rounds to infinity in bf16 "
                            "(options.bf16_matmul=1); expected |Z| < 0x1.ffp127", i, (double)zf);
        }
        z[i] = mha_bf16_round(zf);
    }

    // --- output projection: Y = Z W_O + b_O = sum_r Z^(r) W_O[r] + b_O
    for (size_t t = 0; t < rows; t++)
        for (int o = 0; o < D; o++) {
            double acc = L->b_o[o];
            for (int r = 0; r < h; r++) {
                double part = 0.0;
                for (int e = 0; e < d_v; e++)
                    part += z[t * zw + (size_t)r * d_v + e] * L->w_o[((size_t)r * d_v + e) * D + o];
                if (cap && cap->contributions) cap->contributions[((size_t)r * rows + t) * D + o] = (float)part;
                acc += part;
            }
            y[t * D + o] = (float)acc;
        }

    free(q), free(k), free(v), free(z);
    return MHA_OK;
}

mha_status mha_forward_reference(const mha_layer *L, float *y, const mha_capture *cap, const float *x,
                                 const float *k_src, const float *v_src, int B, int T, int S,
                                 const mha_options *opt) {
    return mha_forward_reference_lse(L, y, cap, NULL, x, k_src, v_src, B, T, S, opt);
}
