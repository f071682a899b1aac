/* forward.c — one forward pass: validate the request once (core/options.c),
 * resolve how it runs (compute/exec.h: kernels, threads), then run the
 * reference or the fast path. Under MHA_PATH_AUTO a request the fast path
 * cannot serve (MHA_E_UNSUPPORTED) or cannot hold in fp32
 * (MHA_E_NONFINITE: scores beyond MHA_FAST_SCORE_LIMIT, an overflowing
 * sum) is recomputed by the reference, so no call returns a silently
 * wrong number. Legend: B, T, S, h, d_model, d_kv_in (see mha.h). */
#include "forward/forward.h"

mha_status mha_forward_exec(const mha_exec *ex, const mha_layer *L, float *y, const mha_capture *cap,
                            const float *x, const float *k_src, const float *v_src, int B, int T,
                            int S, const mha_options *opt) {
    mha_options defaults;
    mha_status s = mha_forward_request("mha_forward", L, y, x, &k_src, &v_src, &opt, &defaults, B, T, S);
    if (s) return s;
    mha_clear_error();
    if (opt->path == MHA_PATH_REFERENCE || (opt->path == MHA_PATH_AUTO && ex->reference))
        return mha_forward_reference(L, y, cap, x, k_src, v_src, B, T, S, opt);
    s = mha_forward_fast(ex, L, y, cap, x, k_src, v_src, B, T, S, opt);
    if ((s == MHA_E_UNSUPPORTED || s == MHA_E_NONFINITE) && opt->path == MHA_PATH_AUTO) {
        mha_clear_error();
        return mha_forward_reference(L, y, cap, x, k_src, v_src, B, T, S, opt);
    }
    return s;
}

static mha_status forward_ctx_held(const mha_context *ctx, const mha_layer *L, float *y, const mha_capture *cap,
                                   const float *x, const float *k_src, const float *v_src, int B, int T, int S,
                                   const mha_options *opt) {
    mha_exec ex;
    mha_status s = mha_exec_resolve(&ex, ctx);
    if (s) return s;
    return mha_forward_exec(&ex, L, y, cap, x, k_src, v_src, B, T, S, opt);
}

mha_status mha_forward_ctx(const mha_context *ctx, const mha_layer *L, float *y, const mha_capture *cap,
                           const float *x, const float *k_src, const float *v_src, int B, int T, int S,
                           const mha_options *opt) {
    if (!L) return forward_ctx_held(ctx, L, y, cap, x, k_src, v_src, B, T, S, opt);
    mha_status s = mha_layer_begin(L, 0, "mha_forward");
    return s ? s : mha_layer_end(L, 0, forward_ctx_held(ctx, L, y, cap, x, k_src, v_src, B, T, S, opt));
}

mha_status mha_forward_kv(const mha_layer *L, float *y, const mha_capture *cap, const float *x,
                          const float *k_src, const float *v_src, int B, int T, int S,
                          const mha_options *opt) {
    return mha_forward_ctx(NULL, L, y, cap, x, k_src, v_src, B, T, S, opt);
}

mha_status mha_forward(const mha_layer *L, float *y, const mha_capture *cap, const float *x,
                       const float *kv, int B, int T, int S, const mha_options *opt) {
    return mha_forward_kv(L, y, cap, x, kv, kv, B, T, S, opt);
}
