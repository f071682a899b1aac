/* heads.c — the seed steps as standalone functions (concat, split, output
 * projection, per-head contributions, interventions) and the head-order
 * contract check. Legend: rows = B*T, n heads of width d, d_out = d_model. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

static mha_status check_sizes(const char *fn, int n, int rows, int d) {
    if (n < 1 || rows < 1 || d < 1)
        return mha_fail(MHA_E_ARG, "%s: n=%d rows=%d d=%d; expected all >= 1", fn, n, rows, d);
    return MHA_OK;
}

mha_status mha_concat_heads(float *z, const float *const *heads, const int *order, int n, int rows,
                            int d) {
    // z is (rows, n*d); heads[i] is (rows, d); block j of z <- heads[order[j]]
    mha_status s = check_sizes("mha_concat_heads", n, rows, d);
    if (s) return s;
    if (!z || !heads) return mha_fail(MHA_E_ARG, "mha_concat_heads: NULL %s", z ? "heads" : "z");
    for (int j = 0; j < n; j++) {
        int src = order ? order[j] : j;
        if (src < 0 || src >= n)
            return mha_fail(MHA_E_ARG, "mha_concat_heads: order[%d]=%d; expected 0..%d", j, src, n - 1);
        if (!heads[src]) return mha_fail(MHA_E_ARG, "mha_concat_heads: heads[%d] is NULL", src);
    }
    for (int t = 0; t < rows; t++)
        for (int j = 0; j < n; j++)
            memcpy(z + (size_t)t * n * d + (size_t)j * d, heads[order ? order[j] : j] + (size_t)t * d,
                   (size_t)d * sizeof(float));
    return MHA_OK;
}

mha_status mha_split_heads(float *const *heads, const float *z, int n, int rows, int d) {
    // z is (rows, n*d); heads[i] is (rows, d)
    mha_status s = check_sizes("mha_split_heads", n, rows, d);
    if (s) return s;
    if (!z || !heads) return mha_fail(MHA_E_ARG, "mha_split_heads: NULL %s", z ? "heads" : "z");
    for (int i = 0; i < n; i++)
        if (!heads[i]) return mha_fail(MHA_E_ARG, "mha_split_heads: heads[%d] is NULL", i);
    for (int t = 0; t < rows; t++)
        for (int i = 0; i < n; i++)
            memcpy(heads[i] + (size_t)t * d, z + (size_t)t * n * d + (size_t)i * d,
                   (size_t)d * sizeof(float));
    return MHA_OK;
}

mha_status mha_project_out(float *y, const float *z, const float *w, const float *b, int rows,
                           int d_in, int d_out) {
    // y is (rows, d_out), z is (rows, d_in), w is (d_in, d_out), b is (d_out)
    mha_status s = check_sizes("mha_project_out", 1, rows, d_in);
    if (s) return s;
    if (d_out < 1) return mha_fail(MHA_E_ARG, "mha_project_out: d_out=%d; expected >= 1", d_out);
    if (!y || !z || !w) return mha_fail(MHA_E_ARG, "mha_project_out: NULL %s", !y ? "y" : !z ? "z" : "w");
    for (int t = 0; t < rows; t++)
        for (int o = 0; o < d_out; o++) {
            double acc = b ? b[o] : 0.0;
            for (int i = 0; i < d_in; i++) acc += (double)z[(size_t)t * d_in + i] * w[(size_t)i * d_out + o];
            y[(size_t)t * d_out + o] = (float)acc;
        }
    return MHA_OK;
}

mha_status mha_head_contributions(float *contrib, const float *z, const float *w, int n, int rows,
                                  int d, int d_out) {
    // contrib is (n, rows, d_out); z is (rows, n*d); w is (n*d, d_out)
    mha_status s = check_sizes("mha_head_contributions", n, rows, d);
    if (s) return s;
    if (d_out < 1) return mha_fail(MHA_E_ARG, "mha_head_contributions: d_out=%d; expected >= 1", d_out);
    if (!contrib || !z || !w)
        return mha_fail(MHA_E_ARG, "mha_head_contributions: NULL %s",
                        !contrib ? "contributions" : !z ? "z" : "w");
    size_t zw = (size_t)n * d;
    for (int r = 0; r < n; r++)
        for (int t = 0; t < rows; t++)
            for (int o = 0; o < d_out; o++) {
                // Z^(r) W_O[r]: head r's block of z times W_O's row block r
                double acc = 0.0;
                for (int i = 0; i < d; i++)
                    acc += (double)z[(size_t)t * zw + (size_t)r * d + i] * w[((size_t)r * d + i) * d_out + o];
                contrib[((size_t)r * rows + t) * d_out + o] = (float)acc;
            }
    return MHA_OK;
}

mha_status mha_head_intervene(float *z, const mha_intervention *iv, int r, int n, int rows, int d) {
    // z is (rows, n*d); head r's block is columns [r*d, (r+1)*d); value is (rows, d)
    mha_status s = check_sizes("mha_head_intervene", n, rows, d);
    if (s) return s;
    if (!z || !iv) return mha_fail(MHA_E_ARG, "mha_head_intervene: NULL %s", z ? "intervention" : "z");
    if (r < 0 || r >= n) return mha_fail(MHA_E_ARG, "mha_head_intervene: head %d; expected 0..%d", r, n - 1);
    size_t zw = (size_t)n * d;
    float *blk = z + (size_t)r * d;
    switch (iv->op) {
    case MHA_HEAD_KEEP:
        return MHA_OK;
    case MHA_HEAD_ZERO:
        for (int t = 0; t < rows; t++) memset(blk + t * zw, 0, (size_t)d * sizeof(float));
        return MHA_OK;
    case MHA_HEAD_SCALE:
        if (!isfinite(iv->scale))
            return mha_fail(MHA_E_NONFINITE, "intervention on head %d: scale=%g; expected finite", r, (double)iv->scale);
        for (int t = 0; t < rows; t++)
            for (int i = 0; i < d; i++) blk[t * zw + i] *= iv->scale;
        return MHA_OK;
    case MHA_HEAD_MEAN:
        for (int i = 0; i < d; i++) {
            double acc = 0.0;
            for (int t = 0; t < rows; t++) acc += blk[t * zw + i];
            float mean = (float)(acc / rows);
            for (int t = 0; t < rows; t++) blk[t * zw + i] = mean;
        }
        return MHA_OK;
    case MHA_HEAD_REPLACE:
        if (!iv->value)
            return mha_fail(MHA_E_ARG, "intervention on head %d: REPLACE needs value (B,T,d_v); got NULL", r);
        for (int t = 0; t < rows; t++) memcpy(blk + t * zw, iv->value + (size_t)t * d, (size_t)d * sizeof(float));
        return MHA_OK;
    }
    return mha_fail(MHA_E_ARG, "intervention on head %d: op=%d; expected MHA_HEAD_KEEP..MHA_HEAD_REPLACE",
                    r, (int)iv->op);
}

/* --------------------------------------------------------- the contract */

/* Label agreement: O equals Q at each position, V equals K, and query head
 * label q sits over kv head label q / group. */
static int labels_agree(const mha_layer *L, mha_contract_report *rep) {
    const mha_config *c = &L->cfg;
    int group = c->n_heads / c->n_kv_heads;
    int *const *lab = L->labels;
    for (int r = 0; r < c->n_heads; r++) {
        if (lab[MHA_BLOCK_O][r] != lab[MHA_BLOCK_Q][r]) {
            *rep = (mha_contract_report){0, MHA_BLOCK_O, r, lab[MHA_BLOCK_Q][r], lab[MHA_BLOCK_O][r], 0, 0.0};
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

mha_status mha_layer_check_contract_kv(const mha_layer *L, const float *x, const float *k_src,
                                       const float *v_src, int B, int T, int S, const mha_options *opt,
                                       mha_contract_report *report) {
    mha_contract_report rep = {1, MHA_BLOCK_Q, -1, -1, -1, 0, 0.0};
    if (!L) return mha_fail(MHA_E_ARG, "mha_layer_check_contract: NULL layer");
    if (!labels_agree(L, &rep)) {
        if (report) *report = rep;
        static const char *names[4] = {"W_Q column", "W_K column", "W_V column", "W_O row"};
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
