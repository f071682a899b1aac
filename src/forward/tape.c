/* tape.c — training: a forward that keeps what the fast backward reads
 * (mha_bwd_saved: Q, K, V, Z before the gate and the interventions, the
 * gate, lse), and the
 * backward that starts from it instead of recomputing the projections and
 * pass 1 (FlashAttention-2's split of the work). The kept state is the one
 * the stateless fast backward makes for itself (backward_fast.c), so both
 * give the same bits. The tape records what its forward was called with;
 * the backward refuses a layer, shape, source pattern or options that
 * differ (MHA_E_ARG), so a tape cannot silently serve another call.
 * Legend: B, T, S, Sx = S + extra keys, h, d_v, d_model; zw = h*d_v. */
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "compute/gemm.h"
#include "forward/backward.h"
#include "forward/backward_fast.h"

struct mha_tape {
    const mha_layer *layer; /* the forward's layer, its config and version then */
    mha_config cfg;
    unsigned long long version;
    mha_options opt;        /* resolved (NULL = the defaults)           */
    int k_is_x, v_is_x, v_is_k; /* which sources were one tensor        */
    mha_bwd_saved saved;    /* q, k, v, z, lse; B, T, S                 */
};

/* One member of a struct, compared as bytes (floats too: the tape wants
 * the forward's very value). */
typedef struct {
    const char *name;
    size_t at, size;
} member;
#define MEMBER(type, m) {#m, offsetof(type, m), sizeof(((type *)0)->m)}

/* Everything the forward read of its options (masks and interventions by
 * pointer: the tape keeps no copy of them) and of the layer's shape. */
static const member option_members[] = {
    MEMBER(mha_options, scale),         MEMBER(mha_options, causal),       MEMBER(mha_options, align),
    MEMBER(mha_options, window_left),   MEMBER(mha_options, window_right), MEMBER(mha_options, keep_mask),
    MEMBER(mha_options, additive_mask), MEMBER(mha_options, key_keep),     MEMBER(mha_options, key_additive),
    MEMBER(mha_options, masked_row),    MEMBER(mha_options, interventions), MEMBER(mha_options, path),
    MEMBER(mha_options, positions),     MEMBER(mha_options, key_positions), MEMBER(mha_options, sink_tokens),
    MEMBER(mha_options, chunk_size),    MEMBER(mha_options, cu_seqlens),   MEMBER(mha_options, n_seqs),
    MEMBER(mha_options, dropout_p),     MEMBER(mha_options, dropout_seed),
};
static const member config_members[] = {
    MEMBER(mha_config, d_model), MEMBER(mha_config, n_heads), MEMBER(mha_config, n_kv_heads),
    MEMBER(mha_config, d_k),     MEMBER(mha_config, d_v),     MEMBER(mha_config, d_kv_in),
    MEMBER(mha_config, d_v_in),  MEMBER(mha_config, bias),    MEMBER(mha_config, add_bias_kv),
    MEMBER(mha_config, add_zero_attn),
};

/* "" when a and b agree on the n members, else the first that differs. */
static const char *first_difference(const void *a, const void *b, const member *m, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (memcmp((const char *)a + m[i].at, (const char *)b + m[i].at, m[i].size)) return m[i].name;
    return "";
}

/* MHA_E_NONFINITE naming the first Inf or NaN of y (n floats): the tape
 * forward keeps no fully masked row under MHA_MASKED_ROW_NAN, so any NaN
 * is an overflow. */
static mha_status check_y(const float *y, size_t n) {
    const size_t i = mha_first_nonfinite(y, n, 0);
    if (i < n)
        return mha_fail(MHA_E_NONFINITE, "mha_forward_train: y[%zu] = %g overflowed its fp32 accumulation; "
                        "expected mha_forward_kv under MHA_PATH_AUTO for such inputs", i, (double)y[i]);
    return MHA_OK;
}

static mha_status forward_train_held(const mha_layer *L, float *y, mha_tape **tape, const float *x, const float *k_src,
                                     const float *v_src, int B, int T, int S, const mha_options *opt) {
    if (!tape) return mha_fail(MHA_E_ARG, "mha_forward_train: tape is NULL; expected where to put an mha_tape *");
    *tape = NULL;
    mha_options defaults;
    mha_status s = mha_refuse_bf16_matmul(opt, "mha_forward_train");
    if (!s) s = mha_forward_request("mha_forward_train", L, y, x, &k_src, &v_src, &opt, &defaults, B, T, S);
    if (s) return s;
    mha_exec ex;
    if ((s = mha_exec_resolve(&ex, NULL))) return s;
    mha_clear_error();
    if (opt->path == MHA_PATH_REFERENCE || (opt->path == MHA_PATH_AUTO && ex.reference))
        return mha_fail(MHA_E_UNSUPPORTED, "mha_forward_train: the %s runs the reference, which keeps no "
                        "tape; expected MHA_PATH_AUTO or _FAST (else mha_forward_kv, then mha_backward_kv)",
                        opt->path == MHA_PATH_REFERENCE ? "options' path" : "environment (MHA_KERNELS=reference)");
    const mha_config *c = &L->cfg;
    mha_tape *t = calloc(1, sizeof *t);
    if (!t) return mha_fail(MHA_E_NOMEM, "mha_forward_train: no memory for the tape");
    *t = (mha_tape){L, L->cfg, L->version, *opt, k_src == x, v_src == x, v_src == k_src, {0}};
    if ((s = mha_bwd_saved_make(&t->saved, &ex, L, x, k_src, v_src, B, T, S, opt, 0, "mha_forward_train"))) {
        free(t);
        return s;
    }
    // --- Y = Z' W_O + b_O, Z' = Z times the output gate, after the interventions (what W_O reads)
    const size_t rows = (size_t)B * T, zw = (size_t)c->n_heads * c->d_v;
    const float *zo;
    float *za = NULL; /* (B,T,zw) when Z' is not the tape's Z */
    if ((s = mha_bwd_z_read(&zo, &za, &t->saved, L, opt, "mha_forward_train"))) goto fail;
    const mha_dst out = {MHA_DST_ROWS, y, (size_t)c->d_model, 0, 0, 0, 0};
    const mha_gemm_args g = {&out, zo, zw, (int)rows, &L->fast->o, 0, 1, 0, (int)zw, 1, 0};
    if ((s = mha_gemm(&g, mha_exec_prefill(&ex), ex.n_threads)) ||
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

mha_status mha_forward_train(const mha_layer *L, float *y, mha_tape **tape, const float *x, const float *k_src,
                             const float *v_src, int B, int T, int S, const mha_options *opt) {
    if (!L) return forward_train_held(L, y, tape, x, k_src, v_src, B, T, S, opt);
    mha_status s = mha_layer_begin(L, 0, "mha_forward_train");
    return s ? s : mha_layer_end(L, 0, forward_train_held(L, y, tape, x, k_src, v_src, B, T, S, opt));
}

static mha_status backward_tape_held(const mha_layer *L, const mha_tape *tape, const mha_gradients *g, const float *dy,
                                     const float *x, const float *k_src, const float *v_src, int B, int T, int S,
                                     const mha_options *opt) {
    if (!tape) return mha_fail(MHA_E_ARG, "mha_backward_tape: tape is NULL; expected one from mha_forward_train");
    if (!L) return mha_fail(MHA_E_ARG, "mha_backward_tape: layer is NULL; expected the forward's layer");
    const char *what = first_difference(&L->cfg, &tape->cfg, config_members,
                                        sizeof config_members / sizeof config_members[0]);
    if (L != tape->layer || *what)
        return mha_fail(MHA_E_ARG, "mha_backward_tape: the tape was made by another layer%s%s%s; expected "
                        "the layer given to mha_forward_train", *what ? " (its config differs in " : "",
                        what, *what ? ")" : "");
    if (L->version != tape->version) /* its Q, K, V, Z are another layer's */
        return mha_fail(MHA_E_ARG, "mha_backward_tape: the layer's weights changed since mha_forward_train "
                        "(mha_layer_set_weights, _permute_heads, _permute_block or _convert_weights); expected "
                        "them unchanged, or a new mha_forward_train");
    const mha_bwd_saved *sv = &tape->saved;
    if (B != sv->B || T != sv->T || S != sv->S)
        return mha_fail(MHA_E_ARG, "mha_backward_tape: B=%d T=%d S=%d; expected the forward's B=%d T=%d S=%d",
                        B, T, S, sv->B, sv->T, sv->S);
    const mha_options defaults_now = mha_options_default(), *given = opt ? opt : &defaults_now;
    if (*(what = first_difference(given, &tape->opt, option_members,
                                  sizeof option_members / sizeof option_members[0])))
        return mha_fail(MHA_E_ARG, "mha_backward_tape: options.%s differs from the forward's; expected the "
                        "options given to mha_forward_train", what);
    /* the checks of mha_backward_kv (shapes, dy finite, wanted gradients) */
    mha_options defaults;
    mha_status s = mha_backward_validate("mha_backward_tape", L, g, dy, x, &k_src, &v_src, &opt, &defaults, B, T, S);
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
    if ((s = mha_bwd_from_saved(&ex, L, g, dy, sv, x, k_src, v_src, opt, 0))) return s; /* 0: the tape stays */
    return mha_backward_check_overflow(&L->cfg, g, B, T, S, "mha_backward_tape");
}

mha_status mha_backward_tape(const mha_layer *L, const mha_tape *tape, const mha_gradients *g, const float *dy,
                             const float *x, const float *k_src, const float *v_src, int B, int T, int S,
                             const mha_options *opt) {
    if (!L) return backward_tape_held(L, tape, g, dy, x, k_src, v_src, B, T, S, opt);
    mha_status s = mha_layer_begin(L, 0, "mha_backward_tape");
    return s ? s : mha_layer_end(L, 0, backward_tape_held(L, tape, g, dy, x, k_src, v_src, B, T, S, opt));
}

void mha_tape_free(mha_tape *tape) {
    if (!tape) return;
    mha_bwd_saved_free(&tape->saved);
    free(tape);
}
