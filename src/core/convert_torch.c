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
 * no head reordering is needed: labels start as 0..h-1.
 *
 * Two passes, no intermediate buffer: the weights are packed for the fast
 * path straight from their (out, in) layout (mha_fast_prepare_from: 16
 * source rows stream in, panel rows stream out), then the layer's own
 * (in, out) tensors are copied out of the panels (mha_fast_unpack: one
 * sequential stream per panel pair) and checked for finiteness on the way;
 * the named scans run only to word an error. A direct (out, in) -> (in, out)
 * transpose walks one side at a 4*in-byte stride: 4.5x slower than this on
 * the P1 weights (bench/LOAD.md). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"

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

    return MHA_OK;
}

/* Finiteness under PyTorch's names, in attribute order: the first bad
 * element is the one reported. Run only when the conversion found one. */
static mha_status check_torch_finite(const mha_torch_weights *tw, int kdim, int vdim) {
    size_t e = (size_t)tw->embed_dim;
    struct { const float *p; size_t n; const char *name; } t[] = {
        {tw->in_proj_weight, 3 * e * e, "in_proj_weight"},
        {tw->q_proj_weight, e * e, "q_proj_weight"},
        {tw->k_proj_weight, e * (size_t)kdim, "k_proj_weight"},
        {tw->v_proj_weight, e * (size_t)vdim, "v_proj_weight"},
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

/* Copies n floats of a bias; 1 when all are finite. */
static int copy_bias(float *dst, const float *src, size_t n) {
    int ok = 1;
    for (size_t i = 0; i < n; i++) ok &= isfinite(src[i]) != 0;
    memcpy(dst, src, n * sizeof(float));
    return ok;
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
    /* the library's size limits are checked before anything is allocated */
    mha_layer *L;
    if ((s = mha_layer_alloc(&L, &cfg))) return s;

    /* --- the (out, in) sources: rows [0,E) q, [E,2E) k, [2E,3E) v of
     * in_proj_weight, or the three separate weights */
    const float *wq = tw->q_proj_weight, *wk = tw->k_proj_weight, *wv = tw->v_proj_weight;
    if (tw->in_proj_weight) wq = tw->in_proj_weight, wk = wq + e * e, wv = wk + e * e;
    int finite = 1;
    /* in_proj_bias stays packed (3E) even with separate weights; absent
     * biases keep the zeros mha_layer_alloc wrote */
    if (tw->in_proj_bias) {
        finite &= copy_bias(L->b_q, tw->in_proj_bias, e);
        finite &= copy_bias(L->b_k, tw->in_proj_bias + e, e);
        finite &= copy_bias(L->b_v, tw->in_proj_bias + 2 * e, e);
    }
    if (tw->out_proj_bias) finite &= copy_bias(L->b_o, tw->out_proj_bias, e);
    /* bias_k/bias_v (1,1,E): the same E features as one key/value row */
    if (tw->bias_k) finite &= copy_bias(L->bias_k, tw->bias_k, e) & copy_bias(L->bias_v, tw->bias_v, e);

    /* --- the fast path's panels, packed from the (out, in) sources:
     * logical (in, out) element (k, n) is src[n*in + k] */
    const mha_pack_source src[4] = {
        {.w = wq, .k_stride = 1, .n_stride = e, .b = L->b_q},
        {.w = wk, .k_stride = 1, .n_stride = (size_t)kdim, .b = L->b_k},
        {.w = wv, .k_stride = 1, .n_stride = (size_t)vdim, .b = L->b_v},
        {.w = tw->out_proj_weight, .k_stride = 1, .n_stride = e, .b = L->b_o},
    };
    if ((s = mha_fast_prepare_from(L, src))) {
        mha_layer_free(L);
        return s;
    }
    /* --- the layer's (in, out) copies, out of the panels, checked on the way */
    finite &= mha_fast_unpack(L);
    if (!finite) {
        mha_layer_free(L);
        s = check_torch_finite(tw, kdim, vdim);
        return s ? s : mha_fail(MHA_E_NONFINITE, "torch layout: a weight is not finite");
    }
    *out = L;
    return MHA_OK;
}
