/* merge.c — combining partial attention results over disjoint key sets:
 * lse = log sum_i exp(lse_i), Z = sum_i exp(lse_i - lse) Z_i, in double.
 * Legend: B batch, T queries, h heads, d_v value width, n parts. */
#include <math.h>
#include <stdlib.h>

#include "base/internal.h"

mha_status mha_attention_merge(float *z, float *lse, const float *const *z_parts,
                               const float *const *lse_parts, int n, int B, int T, int h, int d_v) {
    if (n < 1 || B < 1 || T < 1 || h < 1 || d_v < 1)
        return mha_fail(MHA_E_ARG, "mha_attention_merge: n=%d B=%d T=%d h=%d d_v=%d; expected all >= 1",
                        n, B, T, h, d_v);
    if (!z || !z_parts || !lse_parts) return mha_fail(MHA_E_ARG, "mha_attention_merge: NULL %s", !z ? "z" : !z_parts ? "z_parts" : "lse_parts");
    if (!mha_elements_fit((size_t)B, (size_t)T, (size_t)h, (size_t)d_v))
        return mha_fail(MHA_E_SHAPE, "mha_attention_merge: B=%d T=%d h=%d d_v=%d make Z of more than 2^40 "
                        "elements; expected sizes of real buffers", B, T, h, d_v);
    const size_t rows = (size_t)B * h * T; /* lse entries per part */
    for (int p = 0; p < n; p++) {
        if (!z_parts[p] || !lse_parts[p])
            return mha_fail(MHA_E_ARG, "mha_attention_merge: part %d has a NULL %s", p, !z_parts[p] ? "z" : "lse");
        for (size_t i = 0; i < rows; i++)
            if (isnan(lse_parts[p][i]) || lse_parts[p][i] == INFINITY)
                return mha_fail(MHA_E_NONFINITE, "mha_attention_merge: lse_parts[%d][%zu] = %g; expected finite or -inf",
                                p, i, (double)lse_parts[p][i]);
        /* a row with keys (finite lse) has a finite Z; one without may hold anything */
        for (int b = 0; b < B; b++)
            for (int r = 0; r < h; r++)
                for (int t = 0; t < T; t++) {
                    if (lse_parts[p][((size_t)b * h + r) * T + t] == -INFINITY) continue;
                    const size_t zi = ((size_t)b * T + t) * h * d_v + (size_t)r * d_v; /* (B,T,h*d_v) */
                    const size_t e = mha_first_nonfinite(z_parts[p] + zi, (size_t)d_v, 0);
                    if (e < (size_t)d_v)
                        return mha_fail(MHA_E_NONFINITE, "mha_attention_merge: z_parts[%d][%zu] = %g where its lse "
                                        "is finite; expected a finite Z", p, zi + e, (double)z_parts[p][zi + e]);
                }
    }
    double *w = malloc((size_t)n * sizeof(double)); // (n) weights of one row
    if (!w) return mha_fail(MHA_E_NOMEM, "mha_attention_merge: no memory for %d weights", n);
    const size_t zw = (size_t)h * d_v;
    for (int b = 0; b < B; b++)
        for (int r = 0; r < h; r++)
            for (int t = 0; t < T; t++) {
                const size_t li = ((size_t)b * h + r) * T + t;            /* (B,h,T) */
                const size_t zi = ((size_t)b * T + t) * zw + (size_t)r * d_v; /* (B,T,h*d_v) */
                double m = -INFINITY, sum = 0.0;
                for (int p = 0; p < n; p++)
                    if (lse_parts[p][li] > m) m = lse_parts[p][li];
                for (int p = 0; p < n; p++) {
                    w[p] = m == -INFINITY ? 0.0 : exp((double)lse_parts[p][li] - m);
                    sum += w[p];
                }
                /* each element reads every part before it is written, so z
                 * may alias a part */
                for (int e = 0; e < d_v; e++) {
                    double acc = 0.0;
                    for (int p = 0; p < n; p++)
                        if (w[p] != 0.0) acc += w[p] * z_parts[p][zi + e];
                    z[zi + e] = sum > 0.0 ? (float)(acc / sum) : 0.0f;
                }
                if (lse) lse[li] = sum > 0.0 ? (float)(m + log(sum)) : -INFINITY;
            }
    free(w);
    return MHA_OK;
}
