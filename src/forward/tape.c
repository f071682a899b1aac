/* tape.c — training: a forward that keeps what the fast backward reads
 * (mha_bwd_saved: Q, K, V, Z before the interventions, lse), and the
 * backward that starts from it instead of recomputing the projections and
 * pass 1 (FlashAttention-2's split of the work). The kept state is the one
 * the stateless fast backward makes for itself (backward_fast.c), so both
 * give the same bits. The tape records what its forward was called with;
 * the backward refuses a layer, shape, source pattern or options that
 * differ (MHA_E_ARG), so a tape cannot silently serve another call.
 * Legend: B, T, S, Sx = S + extra keys, h, d_v, d_model; zw = h*d_v. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "compute/gemm.h"
#include "forward/backward.h"
#include "forward/backward_fast.h"

struct mha_tape {
    const mha_layer *layer; /* the forward's layer, and its config then */
    mha_config cfg;
    mha_options opt;        /* resolved (NULL = the defaults)           */
    int k_is_x, v_is_x, v_is_k; /* which sources were one tensor        */
    mha_bwd_saved saved;    /* q, k, v, z, lse; B, T, S                 */
};

/* "" when a and b agree on everything the forward read, else the name of
 * the first option that differs (masks and interventions by pointer: the
 * tape keeps no copy of them). */
static const char *options_differ(const mha_options *a, const mha_options *b) {
    if (a->scale != b->scale) return "scale";
    if (a->causal != b->causal) return "causal";
    if (a->align != b->align) return "align";
    if (a->window_left != b->window_left) return "window_left";
    if (a->window_right != b->window_right) return "window_right";
    if (a->keep_mask.data != b->keep_mask.data || a->keep_mask.batch != b->keep_mask.batch ||
        a->keep_mask.heads != b->keep_mask.heads)
        return "keep_mask";
    if (a->additive_mask.data != b->additive_mask.data || a->additive_mask.batch != b->additive_mask.batch ||
        a->additive_mask.heads != b->additive_mask.heads)
        return "additive_mask";
    if (a->key_keep != b->key_keep) return "key_keep";
    if (a->key_additive != b->key_additive) return "key_additive";
    if (a->masked_row != b->masked_row) return "masked_row";
    if (a->interventions != b->interventions) return "interventions";
    if (a->path != b->path) return "path";
    if (a->positions != b->positions) return "positions";
    if (a->key_positions != b->key_positions) return "key_positions";
    if (a->sink_tokens != b->sink_tokens) return "sink_tokens";
    return "";
}

/* "" when the layer shapes agree, else the first member that differs. */
static const char *config_differs(const mha_config *a, const mha_config *b) {
    if (a->d_model != b->d_model) return "d_model";
    if (a->n_heads != b->n_heads) return "n_heads";
    if (a->n_kv_heads != b->n_kv_heads) return "n_kv_heads";
    if (a->d_k != b->d_k) return "d_k";
    if (a->d_v != b->d_v) return "d_v";
    if (a->d_kv_in != b->d_kv_in) return "d_kv_in";
    if (a->d_v_in != b->d_v_in) return "d_v_in";
    if (a->bias != b->bias) return "bias";
    if (a->add_bias_kv != b->add_bias_kv) return "add_bias_kv";
    if (a->add_zero_attn != b->add_zero_attn) return "add_zero_attn";
    return "";
}

/* MHA_E_NONFINITE naming the first Inf or NaN of y (n floats): the tape
 * forward keeps no fully masked row under MHA_MASKED_ROW_NAN, so any NaN
 * is an overflow. */
static mha_status check_y(const float *y, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!isfinite(y[i]))
            return mha_fail(MHA_E_NONFINITE, "mha_forward_train: y[%zu] = %g overflowed its fp32 accumulation; "
                            "expected mha_forward_kv under MHA_PATH_AUTO for such inputs", i, (double)y[i]);
    return MHA_OK;
}

mha_status mha_forward_train(const mha_layer *L, float *y, mha_tape **tape, const float *x, const float *k_src,
                             const float *v_src, int B, int T, int S, const mha_options *opt) {
    if (!tape) return mha_fail(MHA_E_ARG, "mha_forward_train: tape is NULL; expected where to put an mha_tape *");
    *tape = NULL;
    mha_options defaults;
    mha_status s = mha_forward_request(L, y, x, &k_src, &v_src, &opt, &defaults, B, T, S);
    if (s) return s;
    mha_exec ex;
    if ((s = mha_exec_resolve(&ex, NULL))) return s;
    mha_clear_error();
    if (opt->path == MHA_PATH_REFERENCE || (opt->path == MHA_PATH_AUTO && ex.reference))
        return mha_fail(MHA_E_UNSUPPORTED, "mha_forward_train: the %s runs the reference, which keeps no "
                        "tape; expected MHA_PATH_AUTO or _FAST (else mha_forward_kv, then mha_backward_kv)",
                        opt->path == MHA_PATH_REFERENCE ? "options' path" : "environment (MHA_KERNELS=reference)");
    if (opt->sink_tokens > 0)
        return mha_fail(MHA_E_UNSUPPORTED, "mha_forward_train: options.sink_tokens=%d has no fast backward; "
                        "expected 0 (else mha_forward_kv, then mha_backward_kv)", opt->sink_tokens);
    mha_tape *t = calloc(1, sizeof *t);
    if (!t) return mha_fail(MHA_E_NOMEM, "mha_forward_train: no memory for the tape");
    *t = (mha_tape){L, L->cfg, *opt, k_src == x, v_src == x, v_src == k_src, {0}};
    if ((s = mha_bwd_saved_make(&t->saved, &ex, L, x, k_src, v_src, B, T, S, opt, 0, "mha_forward_train"))) {
        free(t);
        return s;
    }
    // --- Y = Z' W_O + b_O, Z' = Z after the interventions (what W_O reads)
    const mha_config *c = &L->cfg;
    const size_t rows = (size_t)B * T, zw = (size_t)c->n_heads * c->d_v;
    float *za = NULL; /* (B,T,zw) */
    if (opt->interventions && !(za = malloc(sizeof(float) * rows * zw))) {
        s = mha_fail(MHA_E_NOMEM, "mha_forward_train: no memory for Z after the interventions (B*T=%zu)", rows);
        goto fail;
    }
    if (za) memcpy(za, t->saved.z, sizeof(float) * rows * zw);
    for (int r = 0; za && r < c->n_heads && !s; r++)
        s = mha_head_intervene(za, &opt->interventions[r], r, c->n_heads, (int)rows, c->d_v);
    const mha_dst out = {MHA_DST_ROWS, y, (size_t)c->d_model, 0, 0, 0, 0};
    const mha_gemm_args g = {&out, za ? za : t->saved.z, zw, (int)rows, &L->fast->o, 0, 1, 0, (int)zw, 1};
    if (s || (s = mha_gemm(&g, mha_exec_prefill(&ex), ex.n_threads)) ||
        (s = check_y(y, rows * c->d_model)))
        goto fail;
    free(za);
    *tape = t;
    return MHA_OK;
fail:
    free(za);
    mha_tape_free(t);
    return s;
}

mha_status mha_backward_tape(const mha_layer *L, const mha_tape *tape, const mha_gradients *g, const float *dy,
                             const float *x, const float *k_src, const float *v_src, int B, int T, int S,
                             const mha_options *opt) {
    if (!tape) return mha_fail(MHA_E_ARG, "mha_backward_tape: tape is NULL; expected one from mha_forward_train");
    if (!L) return mha_fail(MHA_E_ARG, "mha_backward_tape: layer is NULL; expected the forward's layer");
    const char *what = config_differs(&L->cfg, &tape->cfg);
    if (L != tape->layer || *what)
        return mha_fail(MHA_E_ARG, "mha_backward_tape: the tape was made by another layer%s%s%s; expected "
                        "the layer given to mha_forward_train", *what ? " (its config differs in " : "",
                        what, *what ? ")" : "");
    const mha_bwd_saved *sv = &tape->saved;
    if (B != sv->B || T != sv->T || S != sv->S)
        return mha_fail(MHA_E_ARG, "mha_backward_tape: B=%d T=%d S=%d; expected the forward's B=%d T=%d S=%d",
                        B, T, S, sv->B, sv->T, sv->S);
    const mha_options defaults_now = mha_options_default(), *given = opt ? opt : &defaults_now;
    if (*(what = options_differ(given, &tape->opt)))
        return mha_fail(MHA_E_ARG, "mha_backward_tape: options.%s differs from the forward's; expected the "
                        "options given to mha_forward_train", what);
    /* the checks of mha_backward_kv (shapes, dy finite, wanted gradients) */
    mha_options defaults;
    mha_status s = mha_backward_validate(L, g, dy, x, &k_src, &v_src, &opt, &defaults, B, T, S);
    if (s) return s;
    const int k_is_x = k_src == x, v_is_x = v_src == x, v_is_k = v_src == k_src;
    if (k_is_x != tape->k_is_x || v_is_x != tape->v_is_x || v_is_k != tape->v_is_k)
        return mha_fail(MHA_E_ARG, "mha_backward_tape: keys from %s, values from %s; expected the forward's "
                        "sources (keys from %s, values from %s)", k_is_x ? "x" : "k_src",
                        v_is_x ? "x" : v_is_k ? "the key source" : "v_src", tape->k_is_x ? "x" : "k_src",
                        tape->v_is_x ? "x" : tape->v_is_k ? "the key source" : "v_src");
    mha_exec ex;
    if ((s = mha_exec_resolve(&ex, NULL))) return s;
    mha_clear_error();
    return mha_bwd_from_saved(&ex, L, g, dy, sv, x, k_src, v_src, opt, 0); /* 0: the tape stays as it is */
}

void mha_tape_free(mha_tape *tape) {
    if (!tape) return;
    mha_bwd_saved_free(&tape->saved);
    free(tape);
}
