/* backward.c — one backward pass: validate the request (the forward's own
 * validation plus dy and the gradient outputs), then run the fast backward
 * (AUTO, FAST) or the reference (REFERENCE, and AUTO where the fast one
 * returns MHA_E_UNSUPPORTED). Kernels and threads come from one mha_exec
 * (compute/exec.h), resolved at the entry like the forward's.
 * Legend: B, T, S, h, h_kv, d_k, d_v, d_model, d_kv_in, d_v_in (see mha.h). */
#include <stdint.h>
#include <string.h>

#include "forward/backward.h"
#include "core/variants.h"

/* A gradient the call has no tensor for is refused, so a forgotten flag or
 * an aliased source is caught instead of silently left unwritten. */
static mha_status check_wanted(const char *who, const mha_config *c, const mha_gradients *g, const float *x,
                               const float *k_src, const float *v_src) {
    if (!c->bias && (g->db_q || g->db_k || g->db_v || g->db_o))
        return mha_fail(MHA_E_ARG, "%s: db_%s given but the layer has no bias (config.bias=0); expected NULL", who,
                        g->db_q ? "q" : g->db_k ? "k" : g->db_v ? "v" : "o");
    if (!c->add_bias_kv && (g->dbias_k || g->dbias_v))
        return mha_fail(MHA_E_ARG, "%s: dbias_%s given but config.add_bias_kv=0; expected NULL", who,
                        g->dbias_k ? "k" : "v");
    if (!c->sinks && g->d_sinks)
        return mha_fail(MHA_E_ARG, "%s: d_sinks given but config.sinks=0; expected NULL", who);
    if (c->qk_norm == MHA_QK_NORM_NONE && (g->d_q_norm || g->d_k_norm))
        return mha_fail(MHA_E_ARG, "%s: d_%s_norm given but config.qk_norm is none; expected NULL", who,
                        g->d_q_norm ? "q" : "k");
    if (!c->output_gate && (g->dw_g || g->db_g))
        return mha_fail(MHA_E_ARG, "%s: d%s_g given but config.output_gate=0; expected NULL", who,
                        g->dw_g ? "w" : "b");
    if (!c->bias && g->db_g)
        return mha_fail(MHA_E_ARG, "%s: db_g given but the layer has no bias (config.bias=0); expected NULL", who);
    if (g->dk_src && k_src == x)
        return mha_fail(MHA_E_ARG, "%s: dk_src given but the key source is x (kv NULL); "
                                   "its gradient is part of dx; expected dk_src NULL", who);
    if (g->dv_src && (v_src == x || v_src == k_src))
        return mha_fail(MHA_E_ARG, "%s: dv_src given but the value source is %s; its gradient is part of %s; "
                                   "expected dv_src NULL", who, v_src == x ? "x" : "the key source",
                        v_src == x ? "dx" : "dk_src");
    return MHA_OK;
}

/* One array of a backward call: its name and its bytes. */
enum { N_GRADS = 18 }; /* the members of mha_gradients */
typedef struct {
    const char *name;
    const void *p;
    size_t bytes;
} span;

static int spans_overlap(const span *a, const span *b) {
    const uintptr_t a0 = (uintptr_t)a->p, b0 = (uintptr_t)b->p;
    return a->p && b->p && a->bytes && b->bytes && a0 < b0 + b->bytes && b0 < a0 + a->bytes;
}

/* The gradient outputs (N_GRADS spans, in mha_gradients' order) of a request. */
static void output_spans(span *o, const mha_config *c, const mha_gradients *g, int B, int T, int S) {
    const size_t f = sizeof(float), qw = (size_t)c->n_heads * c->d_k, kw = (size_t)c->n_kv_heads * c->d_k;
    const size_t vw = (size_t)c->n_kv_heads * c->d_v, zw = (size_t)c->n_heads * c->d_v;
    const size_t qn = c->qk_norm_per_head ? qw : (size_t)c->d_k, kn = c->qk_norm_per_head ? kw : (size_t)c->d_k;
    const span all[N_GRADS] = {
        {"dx", g->dx, (size_t)B * T * c->d_model * f},    {"dk_src", g->dk_src, (size_t)B * S * c->d_kv_in * f},
        {"dv_src", g->dv_src, (size_t)B * S * c->d_v_in * f}, {"dw_q", g->dw_q, (size_t)c->d_model * qw * f},
        {"dw_k", g->dw_k, (size_t)c->d_kv_in * kw * f},    {"dw_v", g->dw_v, (size_t)c->d_v_in * vw * f},
        {"dw_o", g->dw_o, zw * c->d_model * f},            {"db_q", g->db_q, qw * f},
        {"db_k", g->db_k, kw * f},                         {"db_v", g->db_v, vw * f},
        {"db_o", g->db_o, (size_t)c->d_model * f},         {"dbias_k", g->dbias_k, kw * f},
        {"dbias_v", g->dbias_v, vw * f},                   {"d_sinks", g->d_sinks, (size_t)c->n_heads * f},
        {"d_q_norm", g->d_q_norm, qn * f},                 {"d_k_norm", g->d_k_norm, kn * f},
        {"dw_g", g->dw_g, (size_t)c->d_model * zw * f},    {"db_g", g->db_g, zw * f},
    };
    memcpy(o, all, sizeof all);
}

/* What the backward reads besides the layer (10 spans); absent ones are NULL. */
static void input_spans(span *in, const mha_config *c, const float *dy, const float *x, const float *k_src,
                        const float *v_src, const mha_options *o, int B, int T, int S) {
    const size_t f = sizeof(float), ts = (size_t)T * S, bt = (size_t)B * T, bs = (size_t)B * S;
    const span all[10] = {
        {"x", x, bt * c->d_model * f},
        {"k_src", k_src, bs * c->d_kv_in * f},
        {"v_src", v_src, bs * c->d_v_in * f},
        {"dy", dy, bt * c->d_model * f},
        {"options.keep_mask", o->keep_mask.data, (size_t)o->keep_mask.batch * o->keep_mask.heads * ts},
        {"options.additive_mask", o->additive_mask.data, (size_t)o->additive_mask.batch * o->additive_mask.heads * ts * f},
        {"options.key_keep", o->key_keep, bs},
        {"options.key_additive", o->key_additive, bs * f},
        {"options.positions", o->positions, bt * sizeof(int)},
        {"options.key_positions", o->key_positions, bs * sizeof(int)},
    };
    memcpy(in, all, sizeof all);
}

/* Gradients are written while the inputs are still read (the fast
 * backward writes dx before the key and value paths read x), so an output
 * that overlaps an input or another output would give silently wrong
 * numbers: refused, naming both. */
static mha_status check_disjoint(const char *who, const mha_config *c, const mha_gradients *g, const float *dy,
                                 const float *x, const float *k_src, const float *v_src, const mha_options *o,
                                 int B, int T, int S) {
    span out[N_GRADS], in[10];
    output_spans(out, c, g, B, T, S);
    input_spans(in, c, dy, x, k_src, v_src, o, B, T, S);
    for (int i = 0; i < N_GRADS; i++) {
        for (int j = i + 1; j < N_GRADS; j++)
            if (spans_overlap(&out[i], &out[j]))
                return mha_fail(MHA_E_ARG, "%s: grad.%s overlaps grad.%s; expected separate arrays "
                                           "for the gradients", who, out[i].name, out[j].name);
        for (int j = 0; j < 10; j++)
            if (spans_overlap(&out[i], &in[j]))
                return mha_fail(MHA_E_ARG, "%s: grad.%s overlaps %s; expected gradients apart from "
                                           "the inputs (they are read while the gradients are written)", who,
                                out[i].name, in[j].name);
        for (int r = 0; o->interventions && r < c->n_heads; r++) {
            const span v = {"", o->interventions[r].value, (size_t)B * T * c->d_v * sizeof(float)};
            if (o->interventions[r].op == MHA_HEAD_REPLACE && spans_overlap(&out[i], &v))
                return mha_fail(MHA_E_ARG, "%s: grad.%s overlaps interventions[%d].value; expected "
                                           "gradients apart from the inputs", who, out[i].name, r);
        }
    }
    return MHA_OK;
}

mha_status mha_backward_check_overflow(const mha_config *c, const mha_gradients *g, int B, int T, int S,
                                       const char *who) {
    span out[N_GRADS];
    output_spans(out, c, g, B, T, S);
    for (int i = 0; i < N_GRADS; i++) {
        const float *p = out[i].p;
        const size_t n = out[i].bytes / sizeof(float), at = p ? mha_first_nonfinite(p, n, 0) : n;
        if (at < n)
            return mha_fail(MHA_E_NONFINITE, "%s: grad.%s[%zu] = %g overflowed its fp32 accumulation; expected "
                            "finite gradients from finite inputs (mha_backward_kv on MHA_PATH_AUTO recomputes "
                            "them in double)", who,
                            out[i].name, at, (double)p[at]);
    }
    return MHA_OK;
}

mha_status mha_backward_validate(const char *who, const mha_layer *L, const mha_gradients *g, const float *dy,
                                 const float *x, const float **k_src, const float **v_src, const mha_options **opt,
                                 mha_options *defaults, int B, int T, int S) {
    if (!g) return mha_fail(MHA_E_ARG, "%s: grad is NULL; expected an mha_gradients (NULL members = not wanted)", who);
    if (!dy) return mha_fail(MHA_E_ARG, "%s: dy is NULL; expected (B,T,d_model) floats", who);
    /* NULL sources and options as in mha_forward_kv; dy stands in for y:
     * the forward's checks of shapes, sources, masks */
    mha_status s = mha_refuse_bf16_matmul(*opt, who);
    if (!s) s = mha_forward_request(who, L, dy, x, k_src, v_src, opt, defaults, B, T, S);
    if (s || (s = mha_check_finite(dy, (size_t)B * T * L->cfg.d_model, "dy"))) return s;
    if ((s = check_wanted(who, &L->cfg, g, x, *k_src, *v_src))) return s;
    return check_disjoint(who, &L->cfg, g, dy, x, *k_src, *v_src, *opt, B, T, S);
}

mha_status mha_backward_exec(const mha_exec *ex, const mha_layer *L, const mha_gradients *g, const float *dy,
                             const float *x, const float *k_src, const float *v_src, int B, int T, int S,
                             const mha_options *opt) {
    mha_options defaults;
    mha_status s = mha_backward_validate("mha_backward", L, g, dy, x, &k_src, &v_src, &opt, &defaults, B, T, S);
    if (s) return s;
    mha_clear_error();
    /* MHA_KERNELS=reference (ex->reference) forces the oracle under AUTO, as in mha_forward */
    if (opt->path == MHA_PATH_REFERENCE || (opt->path == MHA_PATH_AUTO && ex->reference))
        return mha_backward_reference(L, g, dy, x, k_src, v_src, B, T, S, opt);
    s = mha_backward_fast(ex, L, g, dy, x, k_src, v_src, B, T, S, opt);
    /* fp32 intermediates (dZ, dP, the projections' sums) may overflow where
       the double reference does not: never an Inf or NaN with status OK */
    if (!s) s = mha_backward_check_overflow(&L->cfg, g, B, T, S, "fast backward");
    if ((s == MHA_E_UNSUPPORTED || s == MHA_E_NONFINITE) && opt->path == MHA_PATH_AUTO) {
        mha_clear_error();
        return mha_backward_reference(L, g, dy, x, k_src, v_src, B, T, S, opt);
    }
    return s;
}

static mha_status backward_kv_held(const mha_layer *L, const mha_gradients *g, const float *dy, const float *x,
                                   const float *k_src, const float *v_src, int B, int T, int S,
                                   const mha_options *opt) {
    mha_exec ex; /* kernels and threads as the forward chooses them (MHA_KERNELS, the CPU) */
    mha_status s = mha_exec_resolve(&ex, NULL);
    if (s) return s;
    return mha_backward_exec(&ex, L, g, dy, x, k_src, v_src, B, T, S, opt);
}

mha_status mha_backward_kv(const mha_layer *L, const mha_gradients *g, const float *dy, const float *x,
                           const float *k_src, const float *v_src, int B, int T, int S,
                           const mha_options *opt) {
    if (!L) return backward_kv_held(L, g, dy, x, k_src, v_src, B, T, S, opt);
    mha_status s = mha_layer_begin(L, 0, "mha_backward");
    return s ? s : mha_layer_end(L, 0, backward_kv_held(L, g, dy, x, k_src, v_src, B, T, S, opt));
}

mha_status mha_backward(const mha_layer *L, const mha_gradients *g, const float *dy, const float *x,
                        const float *kv, int B, int T, int S, const mha_options *opt) {
    return mha_backward_kv(L, g, dy, x, kv, kv, B, T, S, opt);
}
