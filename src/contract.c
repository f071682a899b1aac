/* contract.c — the head-order contract check: labels of every block agree,
 * and, given an input, the per-head contributions plus b_O reproduce Y. It
 * runs a whole forward pass, so it sits above forward/ and cache/.
 * Legend: B, T, S, h, h_kv, d_model (see mha.h). */
#include <math.h>
#include <stdlib.h>

#include "base/internal.h"

/* Label agreement: O equals Q at each position (and S, with ALiBi or
 * sinks), V equals K, and query head label q sits over kv head label
 * q / group. */
static int labels_agree(const mha_layer *L, mha_contract_report *rep) {
    const mha_config *c = &L->cfg;
    int group = c->n_heads / c->n_kv_heads;
    int *const *lab = L->labels;
    for (int r = 0; r < c->n_heads; r++) {
        if (lab[MHA_BLOCK_O][r] != lab[MHA_BLOCK_Q][r]) {
            *rep = (mha_contract_report){0, MHA_BLOCK_O, r, lab[MHA_BLOCK_Q][r], lab[MHA_BLOCK_O][r], 0, 0.0};
            return 0;
        }
        /* S labels matter only when the layer has score parameters */
        if ((c->alibi || c->sinks) && lab[MHA_BLOCK_S][r] != lab[MHA_BLOCK_Q][r]) {
            *rep = (mha_contract_report){0, MHA_BLOCK_S, r, lab[MHA_BLOCK_Q][r], lab[MHA_BLOCK_S][r], 0, 0.0};
            return 0;
        }
        int g = mha_kv_head(c, r);
        if (lab[MHA_BLOCK_K][g] != lab[MHA_BLOCK_Q][r] / group) {
            *rep = (mha_contract_report){0, MHA_BLOCK_K, g, lab[MHA_BLOCK_Q][r] / group, lab[MHA_BLOCK_K][g], 0, 0.0};
            return 0;
        }
    }
    for (int g = 0; g < c->n_kv_heads; g++)
        if (lab[MHA_BLOCK_V][g] != lab[MHA_BLOCK_K][g]) {
            *rep = (mha_contract_report){0, MHA_BLOCK_V, g, lab[MHA_BLOCK_K][g], lab[MHA_BLOCK_V][g], 0, 0.0};
            return 0;
        }
    rep->labels_ok = 1;
    return 1;
}

mha_status mha_layer_check_contract(const mha_layer *L, const float *x, const float *kv, int B, int T,
                                    int S, const mha_options *opt, mha_contract_report *report) {
    return mha_layer_check_contract_kv(L, x, kv, kv, B, T, S, opt, report);
}

static mha_status layer_check_contract_kv_held(const mha_layer *L, const float *x, const float *k_src,
                                               const float *v_src, int B, int T, int S, const mha_options *opt,
                                               mha_contract_report *report) {
    mha_contract_report rep = {1, MHA_BLOCK_Q, -1, -1, -1, 0, 0.0};
    if (!L) return mha_fail(MHA_E_ARG, "mha_layer_check_contract: NULL layer");
    if (!labels_agree(L, &rep)) {
        if (report) *report = rep;
        static const char *names[MHA_N_BLOCKS] = {"W_Q column", "W_K column", "W_V column", "W_O row",
                                                  "score parameter (ALiBi slope, sink)"};
        return mha_fail(MHA_E_CONTRACT,
                        "head-order contract violated: %s block %d carries label %d; expected %d "
                        "(the label of the matching %s block)",
                        names[rep.bad_block], rep.bad_position, rep.found_label, rep.expected_label,
                        rep.bad_block == MHA_BLOCK_V ? "W_K" : rep.bad_block == MHA_BLOCK_K ? "query head's kv" : "W_Q");
    }
    if (!x) {
        if (report) *report = rep;
        return MHA_OK;
    }
    /* Residual: sum_r Z^(r) W_O[r] + b_O must reproduce Y. */
    const mha_config *c = &L->cfg;
    if (B < 1 || T < 1) return mha_fail(MHA_E_ARG, "mha_layer_check_contract: B=%d T=%d; expected >= 1", B, T);
    size_t rows = (size_t)B * T;
    float *y = malloc(rows * c->d_model * sizeof(float));
    float *contrib = malloc((size_t)c->n_heads * rows * c->d_model * sizeof(float));
    mha_status s = MHA_E_NOMEM;
    if (!y || !contrib) {
        mha_fail(s, "mha_layer_check_contract: no memory for Y and contributions");
        goto done;
    }
    mha_capture cap = {NULL, contrib, NULL};
    if ((s = mha_forward_kv(L, y, &cap, x, k_src, v_src, B, T, S, opt))) goto done;
    double max_y = 0.0, max_res = 0.0;
    for (size_t t = 0; t < rows; t++)
        for (int o = 0; o < c->d_model; o++) {
            double sum = L->b_o[o];
            for (int r = 0; r < c->n_heads; r++) sum += contrib[((size_t)r * rows + t) * c->d_model + o];
            double yv = y[t * c->d_model + o];
            max_y = fmax(max_y, fabs(yv));
            /* NaN-mode fully masked rows are NaN on both sides: agreement. */
            double res = (isnan(sum) && isnan(yv)) ? 0.0 : fabs(sum - yv);
            if (isnan(res)) res = INFINITY;
            max_res = fmax(max_res, res);
        }
    rep.residual_checked = 1;
    rep.max_residual = max_res;
    if (!(max_res <= 1e-4 * (1.0 + max_y)))
        s = mha_fail(MHA_E_CONTRACT,
                     "head contributions plus b_O differ from Y by %.3g; expected <= %.3g", max_res,
                     1e-4 * (1.0 + max_y));
done:
    if (report) *report = rep;
    free(y);
    free(contrib);
    return s;
}

mha_status mha_layer_check_contract_kv(const mha_layer *L, const float *x, const float *k_src,
                                       const float *v_src, int B, int T, int S, const mha_options *opt,
                                       mha_contract_report *report) {
    if (!L) return layer_check_contract_kv_held(L, x, k_src, v_src, B, T, S, opt, report);
    mha_status s = mha_layer_begin(L, 0, "mha_layer_check_contract");
    return s ? s : mha_layer_end(L, 0, layer_check_contract_kv_held(L, x, k_src, v_src, B, T, S, opt, report));
}
