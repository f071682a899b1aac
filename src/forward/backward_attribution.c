/* backward_attribution.c — per-head attribution for a linear metric
 * m = <dy, Y>: since Y = sum_r Z^(r) W_O[r] + b_O, dm/dZ^(r) = dy W_O[r]^T
 * and Z^(r) . dZ^(r) is exactly what m loses when Z^(r) is zeroed.
 * Legend: B, T, S, h, d_v, d_model (see mha.h); rows = B*T. */
#include <stdlib.h>

#include "forward/backward.h"

static mha_status head_attribution_held(const mha_layer *L, float *attribution, float *dz_out, const float *dy,
                                        const float *x, const float *k_src, const float *v_src, int B, int T,
                                        int S, const mha_options *opt) {
    if (!L) return mha_fail(MHA_E_ARG, "mha_head_attribution: layer is NULL");
    if (!attribution) return mha_fail(MHA_E_ARG, "mha_head_attribution: attribution is NULL; expected (h,B,T) floats");
    if (!dy) return mha_fail(MHA_E_ARG, "mha_head_attribution: dy is NULL; expected (B,T,d_model) floats");
    if (B < 1 || T < 1) return mha_fail(MHA_E_SHAPE, "mha_head_attribution: B=%d T=%d; expected both >= 1", B, T);
    const mha_config *c = &L->cfg;
    const int h = c->n_heads, d_v = c->d_v, D = c->d_model;
    const size_t rows = (size_t)B * T, zw = (size_t)h * d_v;
    mha_status s = mha_check_finite(dy, rows * D, "dy");
    if (s) return s;
    float *y = malloc(rows * D * sizeof(float)); // (B,T,d_model), unused beyond the forward
    float *z = malloc(rows * zw * sizeof(float)); // (B,T,h*d_v): Z as W_O reads it
    if (!y || !z) {
        s = mha_fail(MHA_E_NOMEM, "mha_head_attribution: no memory for Y and Z (B=%d T=%d)", B, T);
        goto done;
    }
    mha_capture cap = {z, NULL, NULL};
    if ((s = mha_forward_kv(L, y, &cap, x, k_src, v_src, B, T, S, opt))) goto done;
    // --- Y = Z W_O + b_O:  dZ^(r) = dy W_O[r]^T;  A[r,t] = sum_e Z^(r)[t,e] dZ^(r)[t,e]
    for (size_t t = 0; t < rows; t++)
        for (int r = 0; r < h; r++) {
            double a = 0.0;
            for (int e = 0; e < d_v; e++) {
                const size_t ze = (size_t)r * d_v + e;
                double dze = 0.0;
                for (int o = 0; o < D; o++) dze += (double)dy[t * D + o] * L->w_o[ze * D + o];
                if (dz_out) dz_out[t * zw + ze] = (float)dze;
                a += (double)z[t * zw + ze] * dze;
            }
            attribution[(size_t)r * rows + t] = (float)a;
        }
done:
    free(y);
    free(z);
    return s;
}

mha_status mha_head_attribution(const mha_layer *L, float *attribution, float *dz_out, const float *dy,
                                const float *x, const float *k_src, const float *v_src, int B, int T,
                                int S, const mha_options *opt) {
    if (!L) return head_attribution_held(L, attribution, dz_out, dy, x, k_src, v_src, B, T, S, opt);
    mha_status s = mha_layer_begin(L, 0, "mha_head_attribution");
    return s ? s
             : mha_layer_end(L, 0, head_attribution_held(L, attribution, dz_out, dy, x, k_src, v_src, B, T, S, opt));
}
