/* convert_torch.c — a layer from torch.nn.MultiheadAttention's tensors.
 * Legend: E embed_dim = d_model = h*d_k = h*d_v, h heads, kdim/vdim widths of
 * PyTorch's key and value sources, which become the layer's d_kv_in and
 * d_v_in (see mha.h): PyTorch projects K from `key` and V from `value`, as
 * mha_forward_kv does from k_src and v_src.
 *
 * PyTorch stores nn.Linear weights as (out, in) and computes x W^T + b; the
 * library stores (in, out) and computes x W + b. So every weight is
 * transposed here, once, at the boundary. Head r owns output features
 * [r*d_k, (r+1)*d_k) of the q/k/v projections in both layouts (PyTorch views
 * q as (T, B*h, d_k)), and input features [r*d_v, (r+1)*d_v) of out_proj, so
 * no head reordering is needed: labels start as 0..h-1. */
#include <stdlib.h>
#include <string.h>

#include "base/internal.h"

/* dst (in, out) = src (out, in) transposed. */
static void transpose_out_in(float *dst, const float *src, int n_out, int n_in) {
    for (int o = 0; o < n_out; o++)
        for (int i = 0; i < n_in; i++)
            dst[(size_t)i * n_out + o] = src[(size_t)o * n_in + i];
}

/* Validates the module's sizes and which tensors are present; fills the
 * resolved kdim/vdim. Names PyTorch's attribute in every message. */
static mha_status check_torch(const mha_torch_weights *tw, int *kdim, int *vdim) {
    int E = tw->embed_dim, h = tw->num_heads;
    if (E <= 0 || h <= 0 || E % h != 0)
        return mha_fail(MHA_E_ARG,
                        "torch layout: embed_dim=%d, num_heads=%d; expected positive sizes "
                        "with num_heads dividing embed_dim (head_dim = embed_dim / num_heads)",
                        E, h);
    if (tw->kdim < 0 || tw->vdim < 0)
        return mha_fail(MHA_E_ARG, "torch layout: kdim=%d, vdim=%d; expected 0 (= embed_dim) or a positive width",
                        tw->kdim, tw->vdim);
    *kdim = tw->kdim ? tw->kdim : E;
    *vdim = tw->vdim ? tw->vdim : E;
    if (tw->add_zero_attn != 0 && tw->add_zero_attn != 1)
        return mha_fail(MHA_E_ARG, "torch layout: add_zero_attn=%d; expected 0 or 1", tw->add_zero_attn);
    int separate = tw->q_proj_weight || tw->k_proj_weight || tw->v_proj_weight;
    if (tw->in_proj_weight && separate)
        return mha_fail(MHA_E_ARG,
                        "torch layout: both in_proj_weight and q/k/v_proj_weight are given; "
                        "expected one form (packed when kdim == vdim == embed_dim)");
    /* PyTorch packs in_proj_weight only when kdim == vdim == embed_dim */
    if (tw->in_proj_weight && (*kdim != E || *vdim != E))
        return mha_fail(MHA_E_ARG,
                        "torch layout: in_proj_weight (3E,E) is given but kdim=%d, vdim=%d != "
                        "embed_dim=%d; expected q_proj_weight, k_proj_weight, v_proj_weight",
                        *kdim, *vdim, E);
    if (!tw->in_proj_weight &&
        (!tw->q_proj_weight || !tw->k_proj_weight || !tw->v_proj_weight))
        return mha_fail(MHA_E_ARG,
                        "torch layout: %s is NULL; expected in_proj_weight (3E,E) or all of "
                        "q_proj_weight (E,E), k_proj_weight (E,kdim), v_proj_weight (E,vdim)",
                        !tw->q_proj_weight ? "q_proj_weight"
                        : !tw->k_proj_weight ? "k_proj_weight" : "v_proj_weight");
    if (!tw->out_proj_weight)
        return mha_fail(MHA_E_ARG, "torch layout: out_proj_weight is NULL; expected (E,E) = (%d,%d)", E, E);
    if (!tw->bias_k != !tw->bias_v)
        return mha_fail(MHA_E_ARG,
                        "torch layout: %s is given without %s; expected both (add_bias_kv) or neither",
                        tw->bias_k ? "bias_k" : "bias_v", tw->bias_k ? "bias_v" : "bias_k");

    /* Finiteness under PyTorch's names, before the library reports its own. */
    size_t e = (size_t)E;
    struct { const float *p; size_t n; const char *name; } t[] = {
        {tw->in_proj_weight, 3 * e * e, "in_proj_weight"},
        {tw->q_proj_weight, e * e, "q_proj_weight"},
        {tw->k_proj_weight, e * (size_t)*kdim, "k_proj_weight"},
        {tw->v_proj_weight, e * (size_t)*vdim, "v_proj_weight"},
        {tw->in_proj_bias, 3 * e, "in_proj_bias"},
        {tw->out_proj_weight, e * e, "out_proj.weight"},
        {tw->out_proj_bias, e, "out_proj.bias"},
        {tw->bias_k, e, "bias_k"},
        {tw->bias_v, e, "bias_v"},
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        mha_status s = t[i].p ? mha_check_finite(t[i].p, t[i].n, t[i].name) : MHA_OK;
        if (s) return s;
    }
    return MHA_OK;
}

mha_status mha_layer_from_torch(mha_layer **out, const mha_torch_weights *tw) {
    if (!out) return mha_fail(MHA_E_ARG, "mha_layer_from_torch: out is NULL");
    *out = NULL;
    if (!tw) return mha_fail(MHA_E_ARG, "mha_layer_from_torch: weights are NULL");
    int kdim = 0, vdim = 0;
    mha_status s = check_torch(tw, &kdim, &vdim);
    if (s) return s;
    int E = tw->embed_dim;
    size_t e = (size_t)E;

    mha_config cfg = mha_config_default(E, tw->num_heads);
    cfg.d_kv_in = kdim;
    cfg.d_v_in = vdim;
    /* PyTorch's bias flag covers in_proj_bias and out_proj.bias together;
     * if only one is present, the other is zero. */
    cfg.bias = tw->in_proj_bias || tw->out_proj_bias;
    cfg.add_bias_kv = tw->bias_k != NULL;
    cfg.add_zero_attn = tw->add_zero_attn;
    /* The library's size limits, checked before anything is allocated. */
    mha_config resolved;
    if ((s = mha_config_resolve(&resolved, &cfg))) return s;

    /* w_q (E,E), w_k (kdim,E), w_v (vdim,E), w_o (E,E), biases (E) x 4 */
    size_t n_w = e * e + (size_t)kdim * e + (size_t)vdim * e + e * e;
    float *buf = calloc(n_w + 4 * e, sizeof(float));
    if (!buf) return mha_fail(MHA_E_NOMEM, "mha_layer_from_torch: no memory for the transposed weights");
    float *w_q = buf, *w_k = w_q + e * e, *w_v = w_k + (size_t)kdim * e, *w_o = w_v + (size_t)vdim * e;
    float *b_q = w_o + e * e, *b_k = b_q + e, *b_v = b_k + e, *b_o = b_v + e;

    /* --- input projections: rows [0,E) q, [E,2E) k, [2E,3E) v of in_proj */
    if (tw->in_proj_weight) {
        transpose_out_in(w_q, tw->in_proj_weight, E, E);
        transpose_out_in(w_k, tw->in_proj_weight + e * e, E, E);
        transpose_out_in(w_v, tw->in_proj_weight + 2 * e * e, E, E);
    } else {
        transpose_out_in(w_q, tw->q_proj_weight, E, E);
        transpose_out_in(w_k, tw->k_proj_weight, E, kdim);
        transpose_out_in(w_v, tw->v_proj_weight, E, vdim);
    }
    /* in_proj_bias stays packed (3E) even with separate weights. */
    if (tw->in_proj_bias) memcpy(b_q, tw->in_proj_bias, 3 * e * sizeof(float));
    /* --- output projection */
    transpose_out_in(w_o, tw->out_proj_weight, E, E);
    if (tw->out_proj_bias) memcpy(b_o, tw->out_proj_bias, e * sizeof(float));

    mha_weights w = {
        .w_q = w_q, .w_k = w_k, .w_v = w_v, .w_o = w_o,
        .b_q = cfg.bias ? b_q : NULL, .b_k = cfg.bias ? b_k : NULL,
        .b_v = cfg.bias ? b_v : NULL, .b_o = cfg.bias ? b_o : NULL,
        /* bias_k/bias_v (1,1,E): the same E features as one key/value row */
        .bias_k = tw->bias_k, .bias_v = tw->bias_v,
    };
    s = mha_layer_create(out, &cfg, &w);
    free(buf);
    return s;
}
