/* lse.c — the log-sum-exp entries: a forward that also returns each query
 * row's log-sum-exp (on the reference, reference.c, which keeps the
 * scores' max and sum in double), and attention alone on projected heads,
 * which under MHA_PATH_AUTO / _FAST runs the fast backward's tiled pass 1
 * (backward_attention.c: an online softmax in fp32 that yields the lse)
 * and under MHA_PATH_REFERENCE the reference.
 * Legend: B, T, S, h, h_kv, d_k, d_v (see mha.h). */
#include <math.h>
#include <stdlib.h>

#include "forward/backward_fast.h"
#include "forward/forward.h"

static mha_status forward_lse_held(const mha_layer *L, float *y, const mha_capture *cap, float *lse,
                                   const float *x, const float *k_src, const float *v_src, int B, int T,
                                   int S, const mha_options *opt) {
    mha_options defaults;
    mha_status s = mha_forward_request("mha_forward_lse", L, y, x, &k_src, &v_src, &opt, &defaults, B, T, S);
    if (!s) s = mha_refuse_dropout(opt, "mha_forward_lse"); /* its Z merges with other key blocks' */
    if (s) return s;
    if (!lse) return mha_fail(MHA_E_ARG, "mha_forward_lse: lse is NULL; expected (B,h,T) floats");
    mha_clear_error();
    return mha_forward_reference_lse(L, y, cap, lse, x, k_src, v_src, B, T, S, opt);
}

mha_status mha_forward_lse(const mha_layer *L, float *y, const mha_capture *cap, float *lse,
                           const float *x, const float *k_src, const float *v_src, int B, int T,
                           int S, const mha_options *opt) {
    if (!L) return forward_lse_held(L, y, cap, lse, x, k_src, v_src, B, T, S, opt);
    mha_status s = mha_layer_begin(L, 0, "mha_forward_lse");
    return s ? s : mha_layer_end(L, 0, forward_lse_held(L, y, cap, lse, x, k_src, v_src, B, T, S, opt));
}

/* dst (n) = src (n) widened to double. */
static void widen(double *dst, const float *src, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] = src[i];
}

/* The fast path of mha_attend_lse on validated arguments: pass 1 writes
 * lse = +inf for a row with no allowed key, which is -inf here, and its z
 * 0 (NaN under MHA_MASKED_ROW_NAN, as the reference). MHA_E_UNSUPPORTED
 * when the scores leave fp32's safe range. */
static mha_status attend_lse_fast(const mha_exec *ex, const mha_config *c, float *z, float *lse,
                                  const float *q, const float *k, const float *v, int B, int T,
                                  int S, const mha_options *opt) {
    const float scale = opt->scale != 0.0f ? opt->scale : (float)(1.0 / sqrt((double)c->d_k));
    mha_status s = mha_fast_check_scores(q, k, c, B, T, S, scale, "mha_attend_lse (fast)");
    if (s) return s;
    const size_t nl = (size_t)B * c->n_heads * T;
    float *own = lse ? NULL : malloc(sizeof(float) * nl); // (B,h,T) when the caller wants none
    if (!lse && !own) return mha_fail(MHA_E_NOMEM, "mha_attend_lse: no memory for lse (B*h*T=%zu)", nl);
    float *l = lse ? lse : own;
    const mha_bwd_attn a = {.cfg = c, .opt = opt, .q = q, .k = k, .v = v, .z = z, .lse = l,
                            .B = B, .T = T, .S = S, .Sx = S, .scale = scale};
    long masked = 0;
    s = mha_bwd_attention_forward(&a, mha_exec_prefill(ex), mha_exec_backward(ex), ex->n_threads, &masked);
    const size_t zw = (size_t)c->n_heads * c->d_v;
    for (size_t i = 0; !s && masked && i < nl; i++) {
        if (l[i] != INFINITY) continue;
        l[i] = -INFINITY;
        const size_t b = i / ((size_t)c->n_heads * T), r = i / T % c->n_heads, t = i % T;
        for (int e = 0; opt->masked_row == MHA_MASKED_ROW_NAN && e < c->d_v; e++)
            z[(b * T + t) * zw + r * c->d_v + e] = NAN;
    }
    free(own);
    return s;
}

mha_status mha_attend_lse(const mha_config *cfg, float *z, float *lse, const float *q,
                          const float *k, const float *v, int B, int T, int S,
                          const mha_options *opt) {
    mha_options defaults = mha_options_default();
    if (!opt) opt = &defaults;
    if (!cfg) return mha_fail(MHA_E_ARG, "mha_attend_lse: cfg is NULL");
    mha_config c;
    mha_status s = mha_config_resolve(&c, cfg);
    if (s) return s;
    if (c.add_bias_kv || c.add_zero_attn)
        return mha_fail(MHA_E_ARG, "mha_attend_lse: add_bias_kv=%d add_zero_attn=%d; expected 0 (pass the extra rows in k and v)",
                        c.add_bias_kv, c.add_zero_attn);
    if (c.alibi || c.sinks || c.rope.pairing != MHA_ROPE_NONE || c.qk_norm != MHA_QK_NORM_NONE ||
        c.clip_qkv != 0.0f || c.temperature_floor != 0)
        return mha_fail(MHA_E_UNSUPPORTED,
                        "mha_attend_lse: alibi=%d sinks=%d rope=%d qk_norm=%d clip_qkv=%g temperature_floor=%d; "
                        "expected none (they are layer parameters: clamp q, k, v and apply QK-norm, RoPE and the "
                        "query temperature before the call)", c.alibi, c.sinks, (int)c.rope.pairing,
                        (int)c.qk_norm, (double)c.clip_qkv, c.temperature_floor);
    if (!z || !q || !k || !v)
        return mha_fail(MHA_E_ARG, "mha_attend_lse: %s is NULL", !z ? "z" : !q ? "q" : !k ? "k" : "v");
    if (B < 1 || T < 1 || S < 1)
        return mha_fail(MHA_E_SHAPE, "mha_attend_lse: B=%d T=%d S=%d; expected all >= 1", B, T, S);
    if (opt->interventions)
        return mha_fail(MHA_E_ARG, "mha_attend_lse: options.interventions given; expected NULL (apply them to the merged Z)");
    if ((s = mha_refuse_bf16_matmul(opt, "mha_attend_lse")) || (s = mha_refuse_dropout(opt, "mha_attend_lse"))) return s;
    const size_t dq = (size_t)(c.d_k > c.d_v ? c.d_k : c.d_v), hq = (size_t)c.n_heads;
    if (!mha_elements_fit((size_t)B, (size_t)(T > S ? T : S), hq, dq) ||
        !mha_elements_fit((size_t)B, hq, (size_t)T, (size_t)S))
        return mha_fail(MHA_E_SHAPE, "mha_attend_lse: B=%d T=%d S=%d with %d heads of width %zu make a tensor of "
                        "more than 2^40 elements; expected sizes of real buffers", B, T, S, c.n_heads, dq);
    const size_t nq = (size_t)B * T * c.n_heads * c.d_k, nk = (size_t)B * S * c.n_kv_heads * c.d_k,
                 nv = (size_t)B * S * c.n_kv_heads * c.d_v, nz = (size_t)B * T * c.n_heads * c.d_v;
    if ((s = mha_check_finite(q, nq, "q")) || (s = mha_check_finite(k, nk, "k")) ||
        (s = mha_check_finite(v, nv, "v")) || (s = mha_check_options(&c, opt, B, T, S)))
        return s;
    mha_exec ex;
    if ((s = mha_exec_resolve(&ex, NULL))) return s;
    if (opt->path == MHA_PATH_FAST || (opt->path == MHA_PATH_AUTO && !ex.reference)) {
        mha_clear_error();
        s = attend_lse_fast(&ex, &c, z, lse, q, k, v, B, T, S, opt);
        if (s != MHA_E_UNSUPPORTED || opt->path == MHA_PATH_FAST) return s;
    }
    double *buf = malloc((nq + nk + nv + nz) * sizeof(double)); // q | k | v | z
    if (!buf) return mha_fail(MHA_E_NOMEM, "mha_attend_lse: no memory for Q, K, V, Z (B=%d T=%d S=%d)", B, T, S);
    double *qd = buf, *kd = qd + nq, *vd = kd + nk, *zd = vd + nv;
    widen(qd, q, nq), widen(kd, k, nk), widen(vd, v, nv);
    mha_clear_error();
    s = mha_attend_reference(&c, NULL, zd, NULL, lse, qd, kd, vd, B, T, S, opt);
    for (size_t i = 0; !s && i < nz; i++) z[i] = (float)zd[i];
    free(buf);
    return s;
}
