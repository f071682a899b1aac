/* backward.c — one backward pass: validate the request (the forward's own
 * validation plus dy and the gradient outputs), then run the fast backward
 * (AUTO, FAST) or the reference (REFERENCE, and AUTO where the fast one
 * returns MHA_E_UNSUPPORTED). Kernels and threads come from one mha_exec
 * (compute/exec.h), resolved at the entry like the forward's.
 * Legend: B, T, S, h, h_kv, d_k, d_v, d_model, d_kv_in, d_v_in (see mha.h). */
#include "forward/backward.h"
#include "core/variants.h"

/* A gradient the call has no tensor for is refused, so a forgotten flag or
 * an aliased source is caught instead of silently left unwritten. */
static mha_status check_wanted(const mha_config *c, const mha_gradients *g, const float *x,
                               const float *k_src, const float *v_src) {
    if (!c->bias && (g->db_q || g->db_k || g->db_v || g->db_o))
        return mha_fail(MHA_E_ARG, "mha_backward: db_%s given but the layer has no bias (config.bias=0); expected NULL",
                        g->db_q ? "q" : g->db_k ? "k" : g->db_v ? "v" : "o");
    if (!c->add_bias_kv && (g->dbias_k || g->dbias_v))
        return mha_fail(MHA_E_ARG, "mha_backward: dbias_%s given but config.add_bias_kv=0; expected NULL",
                        g->dbias_k ? "k" : "v");
    if (!c->sinks && g->d_sinks)
        return mha_fail(MHA_E_ARG, "mha_backward: d_sinks given but config.sinks=0; expected NULL");
    if (c->qk_norm == MHA_QK_NORM_NONE && (g->d_q_norm || g->d_k_norm))
        return mha_fail(MHA_E_ARG, "mha_backward: d_%s_norm given but config.qk_norm is none; expected NULL",
                        g->d_q_norm ? "q" : "k");
    if (g->dk_src && k_src == x)
        return mha_fail(MHA_E_ARG, "mha_backward: dk_src given but the key source is x (kv NULL); "
                                   "its gradient is part of dx; expected dk_src NULL");
    if (g->dv_src && (v_src == x || v_src == k_src))
        return mha_fail(MHA_E_ARG, "mha_backward: dv_src given but the value source is %s; its gradient is part of %s; "
                                   "expected dv_src NULL", v_src == x ? "x" : "the key source",
                        v_src == x ? "dx" : "dk_src");
    return MHA_OK;
}

mha_status mha_backward_validate(const mha_layer *L, const mha_gradients *g, const float *dy, const float *x,
                                 const float **k_src, const float **v_src, const mha_options **opt,
                                 mha_options *defaults, int B, int T, int S) {
    if (!g) return mha_fail(MHA_E_ARG, "mha_backward: grad is NULL; expected an mha_gradients (NULL members = not wanted)");
    if (!dy) return mha_fail(MHA_E_ARG, "mha_backward: dy is NULL; expected (B,T,d_model) floats");
    /* NULL sources and options as in mha_forward_kv; dy stands in for y:
     * the forward's checks of shapes, sources, masks */
    mha_status s = mha_refuse_bf16_matmul(*opt, "mha_backward");
    if (!s) s = mha_forward_request(L, dy, x, k_src, v_src, opt, defaults, B, T, S);
    if (s || (s = mha_check_finite(dy, (size_t)B * T * L->cfg.d_model, "dy"))) return s;
    return check_wanted(&L->cfg, g, x, *k_src, *v_src);
}

mha_status mha_backward_exec(const mha_exec *ex, const mha_layer *L, const mha_gradients *g, const float *dy,
                             const float *x, const float *k_src, const float *v_src, int B, int T, int S,
                             const mha_options *opt) {
    mha_options defaults;
    mha_status s = mha_backward_validate(L, g, dy, x, &k_src, &v_src, &opt, &defaults, B, T, S);
    if (s) return s;
    /* rope, sinks, qk_norm, alibi, softcap: the reference backward only (FAST refuses, AUTO falls back) */
    mha_clear_error();
    /* MHA_KERNELS=reference (ex->reference) forces the oracle under AUTO, as in mha_forward */
    if (opt->sink_tokens > 0 && opt->path == MHA_PATH_FAST) /* its tiles take the window as one interval */
        return mha_fail(MHA_E_UNSUPPORTED, "mha_backward: options.sink_tokens=%d on the fast path; expected "
                        "MHA_PATH_AUTO or MHA_PATH_REFERENCE (the reference backward)", opt->sink_tokens);
    if (opt->path == MHA_PATH_REFERENCE || opt->sink_tokens > 0 || (opt->path == MHA_PATH_AUTO && ex->reference))
        return mha_backward_reference(L, g, dy, x, k_src, v_src, B, T, S, opt);
    s = mha_backward_fast(ex, L, g, dy, x, k_src, v_src, B, T, S, opt);
    if (s == MHA_E_UNSUPPORTED && opt->path == MHA_PATH_AUTO) {
        mha_clear_error();
        return mha_backward_reference(L, g, dy, x, k_src, v_src, B, T, S, opt);
    }
    return s;
}

mha_status mha_backward_kv(const mha_layer *L, const mha_gradients *g, const float *dy, const float *x,
                           const float *k_src, const float *v_src, int B, int T, int S,
                           const mha_options *opt) {
    mha_exec ex; /* kernels and threads as the forward chooses them (MHA_KERNELS, the CPU) */
    mha_status s = mha_exec_resolve(&ex, NULL);
    if (s) return s;
    return mha_backward_exec(&ex, L, g, dy, x, k_src, v_src, B, T, S, opt);
}

mha_status mha_backward(const mha_layer *L, const mha_gradients *g, const float *dy, const float *x,
                        const float *kv, int B, int T, int S, const mha_options *opt) {
    return mha_backward_kv(L, g, dy, x, kv, kv, B, T, S, opt);
}
