/* options.c — the defaults of mha_options and the validation of one forward
 * request against the layer (shapes, masks, finiteness, interventions),
 * shared by the plain and the cached forward.
 * Legend: B, T, S, h, d_model, d_kv_in, d_v_in (see mha.h). */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/bf16.h"
#include "core/core.h"
#include "core/variants.h"
#include "kernels/kernels.h"

mha_options mha_options_default(void) {
    mha_options o;
    memset(&o, 0, sizeof o);
    o.window_left = -1;
    o.window_right = -1;
    return o;
}

/* An input is finite: the best ISA's vector scan first (a P3 forward
 * reads 16 MiB of kv here), the element-wise one to name the first bad
 * element only when it fails. */
static mha_status check_input(const float *p, size_t n, const char *name) {
    if (mha_isa_best()->prefill->all_within(p, n, FLT_MAX)) return MHA_OK;
    return mha_check_finite(p, n, name);
}

/* NaN and +Inf are refused; -Inf is a legal "forbid" in additive masks. */
static mha_status check_additive(const float *p, size_t n, const char *name) {
    const size_t i = mha_first_nonfinite(p, n, MHA_SCAN_ALLOW_NEG_INF);
    if (i < n)
        return mha_fail(MHA_E_NONFINITE, "%s[%zu] = %g; expected a finite number or -inf", name, i, (double)p[i]);
    return MHA_OK;
}

static double max_value(const float *p, size_t n) {
    double m = -INFINITY;
    for (size_t i = 0; i < n; i++) m = p[i] > m ? p[i] : m;
    return m;
}

/* additive_mask + key_additive reaches a score in float (mask.c): a sum
 * beyond +FLT_MAX would be +inf there, which no path can softmax (NaN in
 * the fast path, a finite row in the reference's double), so it is
 * refused; a sum below -FLT_MAX forbids the key, as -inf does. */
static mha_status check_additive_sum(const mha_options *o, int B, int T, int S) {
    if (!o->additive_mask.data || !o->key_additive) return MHA_OK;
    /* the (B, S) key terms first: at most 0 (padding masks are), no sum
     * exceeds the finite mask's own largest term, and the (B|1, h|1, T, S)
     * mask is not read a second time */
    const double k = max_value(o->key_additive, (size_t)B * S);
    if (k <= 0) return MHA_OK;
    const double a = max_value(o->additive_mask.data, (size_t)o->additive_mask.batch * o->additive_mask.heads * T * S);
    if (isinf((float)(a + k)) && a + k > 0)
        return mha_fail(MHA_E_ARG, "additive_mask (up to %g) plus key_additive (up to %g) overflows float32 to "
                        "+inf; expected their sum within +-%g (-inf forbids a key)", a, k, (double)FLT_MAX);
    return MHA_OK;
}

static mha_status check_mask(const mha_mask *m, const char *name, int B, int h) {
    if (!m->data) return MHA_OK;
    if (m->batch != 1 && m->batch != B)
        return mha_fail(MHA_E_SHAPE, "%s.batch=%d; expected 1 (broadcast) or B=%d", name, m->batch, B);
    if (m->heads != 1 && m->heads != h)
        return mha_fail(MHA_E_SHAPE, "%s.heads=%d; expected 1 (broadcast) or n_heads=%d", name, m->heads, h);
    return MHA_OK;
}

mha_status mha_check_cu_seqlens(const mha_options *o, int T, int S) {
    if (!o->cu_seqlens && o->n_seqs == 0) return MHA_OK;
    if (!o->cu_seqlens || o->n_seqs < 1)
        return mha_fail(MHA_E_ARG, "options.cu_seqlens is %s with n_seqs=%d; expected both (n_seqs >= 1) or neither",
                        o->cu_seqlens ? "given" : "NULL", o->n_seqs);
    if (S != T)
        return mha_fail(MHA_E_ARG, "options.cu_seqlens with T=%d queries and S=%d keys; expected packed "
                        "self-attention sequences (S = T)", T, S);
    if (o->sink_tokens > 0 || o->chunk_size > 0)
        return mha_fail(MHA_E_ARG, "options.cu_seqlens with %s; expected 0 (they would cut across the packed "
                        "sequences)", o->sink_tokens > 0 ? "sink_tokens" : "chunk_size");
    const int *cu = o->cu_seqlens, n = o->n_seqs;
    if (n > T || cu[0] != 0 || cu[n] != T)
        return mha_fail(MHA_E_ARG, "options.cu_seqlens[0]=%d, [n_seqs=%d]=%d; expected 0 and T=%d (n_seqs <= T)",
                        cu[0], n, n <= T ? cu[n] : -1, T);
    for (int s = 0; s < n; s++)
        if (cu[s + 1] <= cu[s])
            return mha_fail(MHA_E_ARG, "options.cu_seqlens[%d]=%d after [%d]=%d; expected strictly increasing "
                            "boundaries (every sequence at least one row)", s + 1, cu[s + 1], s, cu[s]);
    return MHA_OK;
}

mha_status mha_check_options(const mha_config *c, const mha_options *o, int B, int T, int S) {
    mha_status s;
    if (o->causal != 0 && o->causal != 1) return mha_fail(MHA_E_ARG, "options.causal=%d; expected 0 or 1", o->causal);
    if (o->align != MHA_ALIGN_TOP_LEFT && o->align != MHA_ALIGN_BOTTOM_RIGHT)
        return mha_fail(MHA_E_ARG, "options.align=%d; expected MHA_ALIGN_TOP_LEFT or MHA_ALIGN_BOTTOM_RIGHT", (int)o->align);
    if (o->path < MHA_PATH_AUTO || o->path > MHA_PATH_FAST)
        return mha_fail(MHA_E_ARG, "options.path=%d; expected MHA_PATH_AUTO, _REFERENCE or _FAST", (int)o->path);
    if (o->sink_tokens < 0 || (o->sink_tokens > 0 && o->window_left < 0))
        return mha_fail(MHA_E_ARG, "options.sink_tokens=%d with window_left=%d; expected 0, or > 0 with a "
                        "window (window_left >= 0)", o->sink_tokens, o->window_left);
    if ((s = mha_check_cu_seqlens(o, T, S))) return s;
    if (o->chunk_size < 0 || (o->chunk_size > 0 && o->sink_tokens > 0))
        return mha_fail(MHA_E_ARG, "options.chunk_size=%d with sink_tokens=%d; expected 0 (none), or > 0 "
                        "without sink tokens", o->chunk_size, o->sink_tokens);
    if ((s = check_mask(&o->keep_mask, "keep_mask", B, c->n_heads)) ||
        (s = check_mask(&o->additive_mask, "additive_mask", B, c->n_heads)))
        return s;
    if (o->additive_mask.data &&
        (s = check_additive(o->additive_mask.data,
                            (size_t)o->additive_mask.batch * o->additive_mask.heads * T * S, "additive_mask")))
        return s;
    if (o->key_additive && (s = check_additive(o->key_additive, (size_t)B * S, "key_additive"))) return s;
    if ((s = check_additive_sum(o, B, T, S))) return s;
    if ((s = mha_check_positions(c, o, B, T, S))) return s;
    return mha_check_common_options(o, c->n_heads, (size_t)B * T, c->d_v);
}

mha_status mha_check_common_options(const mha_options *o, int h, size_t rows, int d_v) {
    if (!isfinite(o->scale))
        return mha_fail(MHA_E_NONFINITE, "options.scale=%g; expected finite (0 = 1/sqrt(d_k))", (double)o->scale);
    if (!(o->dropout_p >= 0.0f && o->dropout_p < 1.0f))
        return mha_fail(MHA_E_ARG, "options.dropout_p=%g; expected 0 <= p < 1 (0: no dropout)", (double)o->dropout_p);
    if (o->masked_row != MHA_MASKED_ROW_ZERO && o->masked_row != MHA_MASKED_ROW_NAN)
        return mha_fail(MHA_E_ARG, "options.masked_row=%d; expected MHA_MASKED_ROW_ZERO or MHA_MASKED_ROW_NAN", (int)o->masked_row);
    if (o->bf16_matmul != 0 && o->bf16_matmul != 1)
        return mha_fail(MHA_E_ARG, "options.bf16_matmul=%d; expected 0 (fp32) or 1 (bf16 projections)", o->bf16_matmul);
    return mha_check_interventions(o->interventions, h, rows, d_v);
}

mha_status mha_refuse_bf16_matmul(const mha_options *o, const char *who) {
    if (!o || !o->bf16_matmul) return MHA_OK;
    return mha_fail(MHA_E_UNSUPPORTED, "%s: options.bf16_matmul=%d is not supported here; expected 0 "
                    "(bf16 projections run in mha_forward*, mha_forward_lse and mha_forward_cached*)", who,
                    o->bf16_matmul);
}

mha_status mha_refuse_dropout(const mha_options *o, const char *who) {
    if (!o || o->dropout_p == 0.0f) return MHA_OK;
    return mha_fail(MHA_E_UNSUPPORTED, "%s: options.dropout_p=%g is not supported here; expected 0 (attention "
                    "dropout runs in mha_forward*, mha_forward_train and the backward: training)", who,
                    (double)o->dropout_p);
}

mha_status mha_check_bf16_input(const float *p, size_t n, const char *name) {
    if (mha_isa_best()->prefill->all_within(p, n, MHA_BF16_ROUNDS_FINITE)) return MHA_OK;
    for (size_t i = 0; i < n; i++)
        if (!(fabsf(p[i]) <= MHA_BF16_ROUNDS_FINITE))
            return mha_fail(MHA_E_NONFINITE, "%s[%zu] = %g rounds to infinity in bf16 (options.bf16_matmul=1); "
                            "expected |value| < 0x1.ffp127 (3.3961e38)", name, i, (double)p[i]);
    return MHA_OK;
}

mha_status mha_check_bf16_weights(const mha_layer *L) {
    if (L->cfg.output_gate) /* the gate's product runs in fp32 on every path: no bf16 form of it to match */
        return mha_fail(MHA_E_UNSUPPORTED, "options.bf16_matmul=1 with an output gate (config.output_gate): the "
                        "gate's projection has no bf16 product; expected bf16_matmul=0 (bf16 weights still serve "
                        "the fp32 products)");
    if (mha_layer_weights_dtype(L) == MHA_W_BF16) return MHA_OK;
    return mha_fail(MHA_E_ARG, "options.bf16_matmul=1 needs bf16 weights; this layer's are %s (convert them "
                    "with mha_layer_convert_weights(layer, MHA_W_BF16), or `--weights-dtype bf16`)",
                    mha_weight_dtype_name(mha_layer_weights_dtype(L)));
}

/* options.bf16_matmul: the layer's weights are bf16 and the projections'
 * inputs round to finite bf16 values. */
static mha_status check_bf16_request(const mha_layer *L, const float *x, const float *k_src, const float *v_src,
                                     int B, int T, int S) {
    const mha_config *c = &L->cfg;
    mha_status s = mha_check_bf16_weights(L);
    if (!s) s = mha_check_bf16_input(x, (size_t)B * T * c->d_model, "x");
    if (!s && k_src != x) s = mha_check_bf16_input(k_src, (size_t)B * S * c->d_kv_in, "kv");
    if (!s && v_src != x && v_src != k_src) s = mha_check_bf16_input(v_src, (size_t)B * S * c->d_v_in, "v_src");
    return s;
}

mha_status mha_check_interventions(const mha_intervention *ivs, int h, size_t rows, int d_v) {
    for (int r = 0; ivs && r < h; r++) {
        const mha_intervention *iv = &ivs[r];
        if ((int)iv->op < MHA_HEAD_KEEP || (int)iv->op > MHA_HEAD_REPLACE)
            return mha_fail(MHA_E_ARG, "interventions[%d].op=%d; expected MHA_HEAD_KEEP..MHA_HEAD_REPLACE", r, (int)iv->op);
        if (iv->op == MHA_HEAD_SCALE && !isfinite(iv->scale))
            return mha_fail(MHA_E_NONFINITE, "interventions[%d].scale=%g; expected finite", r, (double)iv->scale);
        if (iv->op == MHA_HEAD_REPLACE) {
            if (!iv->value) return mha_fail(MHA_E_ARG, "interventions[%d]: REPLACE needs value (B,T,d_v); got NULL", r);
            char name[48];
            snprintf(name, sizeof name, "interventions[%d].value", r);
            mha_status s = mha_check_finite(iv->value, rows * (size_t)d_v, name);
            if (s) return s;
        }
    }
    return MHA_OK;
}

mha_status mha_forward_validate(const char *who, const mha_layer *L, const float *y, const float *x,
                                const float *k_src, const float *v_src, int B, int T, int S, const mha_options *o) {
    if (!L) return mha_fail(MHA_E_ARG, "%s: layer is NULL", who);
    if (!y) return mha_fail(MHA_E_ARG, "%s: y is NULL; expected (B,T,d_model) floats", who);
    if (!x) return mha_fail(MHA_E_ARG, "%s: x is NULL; expected (B,T,d_model) floats", who);
    const mha_config *c = &L->cfg;
    if (B < 1 || T < 1 || S < 1)
        return mha_fail(MHA_E_SHAPE, "%s: B=%d T=%d S=%d; expected all >= 1", who, B, T, S);
    /* A source that is x must have x's length and width. */
    if ((k_src == x || v_src == x) && S != T)
        return mha_fail(MHA_E_SHAPE, "%s: self-attention (kv NULL) with S=%d != T=%d; pass kv (B,S,d_kv_in) or S=T", who, S, T);
    if (k_src == x && c->d_kv_in != c->d_model)
        return mha_fail(MHA_E_SHAPE, "%s: kv is NULL but d_kv_in=%d != d_model=%d; pass kv (B,S,%d)", who,
                        c->d_kv_in, c->d_model, c->d_kv_in);
    if (v_src == x && c->d_v_in != c->d_model)
        return mha_fail(MHA_E_SHAPE, "%s: the value source is x but d_v_in=%d != d_model=%d; pass v_src (B,S,%d)", who,
                        c->d_v_in, c->d_model, c->d_v_in);
    if (v_src == k_src && c->d_v_in != c->d_kv_in)
        return mha_fail(MHA_E_SHAPE, "%s: one key/value source but d_v_in=%d != d_kv_in=%d; pass v_src (B,S,%d) to mha_forward_kv", who,
                        c->d_v_in, c->d_kv_in, c->d_v_in);
    size_t big = (size_t)B * T > (size_t)B * S ? (size_t)B * T : (size_t)B * S;
    size_t widest = (size_t)c->n_heads * (c->d_k > c->d_v ? c->d_k : c->d_v);
    if (widest < (size_t)c->d_model) widest = (size_t)c->d_model;
    if (widest < (size_t)c->d_kv_in) widest = (size_t)c->d_kv_in;
    if (widest < (size_t)c->d_v_in) widest = (size_t)c->d_v_in;
    if (!mha_elements_fit(big, widest, 1, 1) ||
        !mha_elements_fit((size_t)B, (size_t)c->n_heads, (size_t)T, (size_t)S)) /* the (B,h,T,S) scores */
        return mha_fail(MHA_E_SHAPE, "%s: B=%d T=%d S=%d is too large for this layer", who, B, T, S);
    mha_status s = check_input(x, (size_t)B * T * c->d_model, "x");
    if (s) return s;
    if (k_src != x && (s = check_input(k_src, (size_t)B * S * c->d_kv_in, "kv"))) return s;
    if (v_src != x && v_src != k_src && (s = check_input(v_src, (size_t)B * S * c->d_v_in, "v_src")))
        return s;
    if ((s = mha_check_options(c, o, B, T, S))) return s;
    return o->bf16_matmul ? check_bf16_request(L, x, k_src, v_src, B, T, S) : MHA_OK;
}


mha_status mha_forward_request(const char *who, const mha_layer *L, const float *out, const float *x,
                               const float **k_src, const float **v_src, const mha_options **opt,
                               mha_options *defaults, int B, int T, int S) {
    if (!*opt) *defaults = mha_options_default(), *opt = defaults;
    if (!*k_src) *k_src = x;
    if (!*v_src) *v_src = *k_src;
    return mha_forward_validate(who, L, out, x, *k_src, *v_src, B, T, S, *opt);
}
