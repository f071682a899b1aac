/* heads.c — the seed steps as standalone functions (concat, split, output
 * projection, per-head contributions, interventions). The contract check
 * that runs a forward lives above the engine, in src/contract.c. Legend: rows = B*T, n heads of width d, d_out = d_model. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"

static mha_status check_sizes(const char *fn, int n, int rows, int d) {
    if (n < 1 || rows < 1 || d < 1)
        return mha_fail(MHA_E_ARG, "%s: n=%d rows=%d d=%d; expected all >= 1", fn, n, rows, d);
    if (!mha_elements_fit((size_t)n, (size_t)rows, (size_t)d, 1))
        return mha_fail(MHA_E_ARG, "%s: n=%d rows=%d d=%d make more than 2^40 elements; expected sizes of real "
                        "buffers", fn, n, rows, d);
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
    if (d_out < 1 || !mha_elements_fit((size_t)rows + (size_t)d_in, (size_t)d_out, 1, 1))
        return mha_fail(MHA_E_ARG, "mha_project_out: d_out=%d with rows=%d d_in=%d; expected >= 1 and y, w "
                        "of at most 2^40 elements", d_out, rows, d_in);
    if (!y || !z || !w) return mha_fail(MHA_E_ARG, "mha_project_out: NULL %s", !y ? "y" : !z ? "z" : "w");
    /* one row of sums, w read row by row (contiguous): each y element still
     * sums b then i = 0, 1, ... in double, as the textbook loop does */
    double *acc = malloc(sizeof(double) * (size_t)d_out); // (d_out)
    if (!acc) return mha_fail(MHA_E_NOMEM, "mha_project_out: no memory for %d sums", d_out);
    for (int t = 0; t < rows; t++) {
        for (int o = 0; o < d_out; o++) acc[o] = b ? b[o] : 0.0;
        for (int i = 0; i < d_in; i++) {
            const double zi = z[(size_t)t * d_in + i];
            const float *wi = w + (size_t)i * d_out;
            for (int o = 0; o < d_out; o++) acc[o] += zi * wi[o];
        }
        for (int o = 0; o < d_out; o++) y[(size_t)t * d_out + o] = (float)acc[o];
    }
    free(acc);
    return MHA_OK;
}

mha_status mha_head_contributions(float *contrib, const float *z, const float *w, int n, int rows,
                                  int d, int d_out) {
    // contrib is (n, rows, d_out); z is (rows, n*d); w is (n*d, d_out)
    mha_status s = check_sizes("mha_head_contributions", n, rows, d);
    if (s) return s;
    if (d_out < 1 || !mha_elements_fit((size_t)n, (size_t)rows + (size_t)d, (size_t)d_out, 1))
        return mha_fail(MHA_E_ARG, "mha_head_contributions: d_out=%d with n=%d rows=%d d=%d; expected >= 1 and "
                        "contributions, w of at most 2^40 elements", d_out, n, rows, d);
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
    return mha_head_intervene_rows(z, iv, r, n, rows, d, NULL);
}

mha_status mha_head_intervene_rows(float *z, const mha_intervention *iv, int r, int n, int rows, int d,
                                   const size_t *value_row) {
    // z is (rows, n*d); head r's block is columns [r*d, (r+1)*d); value row of z row t: value_row[t]
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
        for (int t = 0; t < rows; t++)
            memcpy(blk + t * zw, iv->value + (value_row ? value_row[t] : (size_t)t) * d, (size_t)d * sizeof(float));
        return MHA_OK;
    }
    return mha_fail(MHA_E_ARG, "intervention on head %d: op=%d; expected MHA_HEAD_KEEP..MHA_HEAD_REPLACE",
                    r, (int)iv->op);
}
