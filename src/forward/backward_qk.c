/* backward_qk.c — QK-norm and RoPE in the fast backward. Forward: on the
 * recomputed Q and K rows, as the fast forward applies them after its
 * projections (mha_qk_transform: the same fp32 bits), keeping the pre-norm
 * rows the norm's backward reads. Backward: on dQ, dK in place, RoPE's
 * transpose (the rotation by the negated angle, same YaRN factor), then the
 * norm's backward in double per row, as backward_reference.c states it.
 * The norm weights' gradients are summed over a fixed number of row chunks,
 * chunk by chunk in order: the bits do not depend on the thread count.
 * Legend: B, T, S (no extra keys with variants: Sx = S), h, h_kv, d_k;
 * qw = h*d_k, kw = h_kv*d_k; r = rope.dim rotated dims. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "forward/backward_fast.h"
#include "core/variants.h"

/* One projection's rows m (B, n, heads*d_k) in place: norm with weights w
 * (NULL: none), RoPE with table rows rows_of (B*n; NULL: none), then each
 * row times temp (B*n; NULL: none; the queries' temperature). */
static mha_status transform(float *m, const mha_config *c, int B, int n, int heads, const float *w,
                            const mha_rope_rows *rr, const int *rows_of, const float *temp, int nt) {
    const int d_k = c->d_k;
    const size_t width = (size_t)heads * d_k, nrows = (size_t)B * n;
    double *st = w && c->qk_norm_whole ? malloc(sizeof(double) * 2 * nrows) : NULL; /* (B*n, 2) */
    if (w && c->qk_norm_whole && !st)
        return mha_fail(MHA_E_NOMEM, "fast backward: no memory for the q/k norm statistics (%zu rows)", nrows);
    if (st) mha_qk_norm_rows_stats(st, m, nrows, width, c, nt);
#pragma omp parallel for schedule(static) num_threads(nt)
    for (long u = 0; u < (long)B * heads; u++) {
        const int b = (int)(u / heads), r = (int)(u % heads);
        /* per head (and whole, which is per head): the head's slice of (heads*d_k) */
        const float *nw = w ? w + (c->qk_norm_per_head ? (size_t)r * d_k : 0) : NULL;
        const mha_head_rows hr = {m + (size_t)b * n * width + (size_t)r * d_k, width, 1};
        mha_qk_transform(c, hr, n, nw, st ? st + 2 * (size_t)b * n : NULL, rr->tab, rr->n,
                         rows_of ? rows_of + (size_t)b * n : NULL, temp ? temp + (size_t)b * n : NULL);
    }
    free(st);
    return MHA_OK;
}

mha_status mha_bwd_qk_forward(mha_bwd_saved *sv, const mha_layer *L, const mha_options *opt, int keys_are_x,
                              int nt) {
    const mha_config *c = &L->cfg;
    const int norm = c->qk_norm != MHA_QK_NORM_NONE, B = sv->B, T = sv->T, S = sv->S;
    if (!norm && c->rope.pairing == MHA_ROPE_NONE && c->temperature_floor == 0) return MHA_OK;
    const size_t nq = (size_t)B * T * c->n_heads * c->d_k, nk = (size_t)B * S * c->n_kv_heads * c->d_k;
    if (norm) {
        sv->q_pre = malloc(sizeof(float) * nq), sv->k_pre = malloc(sizeof(float) * nk);
        if (!sv->q_pre || !sv->k_pre)
            return mha_fail(MHA_E_NOMEM, "fast backward: no memory for Q, K before the norm (B=%d T=%d S=%d)", B,
                            T, S);
        memcpy(sv->q_pre, sv->q, sizeof(float) * nq), memcpy(sv->k_pre, sv->k, sizeof(float) * nk);
    }
    mha_rope_rows rr;
    float *temp = NULL; /* (B*T) */
    mha_status s = mha_rope_rows_make(&rr, c, opt, keys_are_x, B, T, S, "fast backward");
    if (!s) s = mha_query_temperatures(&temp, c, opt, B, T, "fast backward");
    if (!s) s = transform(sv->q, c, B, T, c->n_heads, norm ? L->q_norm : NULL, &rr, rr.qrow, temp, nt);
    if (!s) s = transform(sv->k, c, B, S, c->n_kv_heads, norm ? L->k_norm : NULL, &rr, rr.krow, NULL, nt);
    mha_rope_rows_free(&rr), free(temp);
    return s;
}

/* RoPE's transpose on one head row x (d_k) with table row cs | sn (r/2
 * each, times mscale): pair (a, b) <- (a cos + b sin, b cos - a sin). */
static void rope_transpose(float *x, const mha_config *c, const float *cs, const float *sn) {
    const int half = c->rope.dim / 2;
    const int a_step = c->rope.pairing == MHA_ROPE_INTERLEAVED ? 2 : 1;
    const int b_off = c->rope.pairing == MHA_ROPE_INTERLEAVED ? 1 : half;
    for (int i = 0; i < half; i++) {
        float *pa = x + i * a_step, *pb = pa + b_off;
        const float a = *pa, b = *pb;
        *pa = a * cs[i] + b * sn[i];
        *pb = b * cs[i] - a * sn[i];
    }
}

/* The norm's backward on one row segment of width d: y = (x - mean) inv w
 * (mean 0 for RMS), inv = 1/sqrt(var + eps), from the pre-norm x. With
 * xhat = (x - mean) inv and g = dy w: dw += dy xhat (double) and dy <-
 * inv (g - mean(g) - xhat mean(g xhat)), mean(g) only for LayerNorm. */
static void norm_row_backward(float *dy, double *dw, const float *x, const float *w, int d, const mha_config *c) {
    const int layer = c->qk_norm == MHA_QK_NORM_LAYER;
    double mean = 0.0, var = 0.0, mg = 0.0, mgx = 0.0;
    for (int e = 0; layer && e < d; e++) mean += x[e];
    mean /= d;
    for (int e = 0; e < d; e++) var += ((double)x[e] - mean) * ((double)x[e] - mean);
    const double inv = 1.0 / sqrt(var / d + (double)c->qk_norm_eps);
    for (int e = 0; e < d; e++) {
        const double xhat = ((double)x[e] - mean) * inv, ge = (double)dy[e] * w[e];
        if (dw) dw[e] += (double)dy[e] * xhat;
        mg += ge, mgx += ge * xhat;
    }
    mg = layer ? mg / d : 0.0, mgx /= d;
    for (int e = 0; e < d; e++)
        dy[e] = (float)(inv * ((double)dy[e] * w[e] - mg - ((double)x[e] - mean) * inv * mgx));
}

#define NORM_CHUNKS 64 /* row chunks of the weight gradient's fixed-order sum */

/* Backward of transform() on dm (B, n, heads*d_k) in place from the
 * pre-norm rows pre; dw (as w; NULL: not wanted). */
static mha_status transform_backward(float *dm, float *dw, const float *pre, const mha_config *c, int B, int n,
                                     int heads, const float *w, const mha_rope_rows *rr, const int *rows_of,
                                     const float *temp, int nt) {
    const int d_k = c->d_k, half = c->rope.dim / 2;
    const size_t width = (size_t)heads * d_k, nrows = (size_t)B * n;
    const int whole = c->qk_norm_whole, shared = w && !c->qk_norm_per_head; /* whole implies per head */
    const size_t nw = !w ? 0 : shared ? (size_t)d_k : width; /* the weights' size */
    const long chunks = nrows < NORM_CHUNKS ? (long)nrows : NORM_CHUNKS;
    double *part = dw ? calloc((size_t)chunks * nw, sizeof(double)) : NULL; /* (chunks, nw) */
    if (dw && !part) return mha_fail(MHA_E_NOMEM, "fast backward: no memory for the norm weights' gradient");
#pragma omp parallel for schedule(static) num_threads(nt)
    for (long ch = 0; ch < chunks; ch++) {
        double *pw = part ? part + (size_t)ch * nw : NULL;
        for (size_t t = nrows * ch / chunks; t < nrows * (ch + 1) / chunks; t++) {
            float *row = dm + t * width;
            for (size_t e = 0; temp && e < width; e++) row[e] *= temp[t]; /* a scalar per row: its own backward */
            if (rr->tab) {
                const size_t tr = (size_t)rows_of[t];
                const float *cs = rr->tab + tr * half, *sn = rr->tab + ((size_t)rr->n + tr) * half;
                for (int r = 0; r < heads; r++) rope_transpose(row + (size_t)r * d_k, c, cs, sn);
            }
            if (!w) continue;
            if (whole) {
                norm_row_backward(row, pw, pre + t * width, w, (int)width, c);
                continue;
            }
            for (int r = 0; r < heads; r++) {
                const size_t wo = shared ? 0 : (size_t)r * d_k;
                norm_row_backward(row + (size_t)r * d_k, pw ? pw + wo : NULL, pre + t * width + (size_t)r * d_k,
                                  w + wo, d_k, c);
            }
        }
    }
    for (size_t e = 0; dw && e < nw; e++) {
        double acc = 0.0;
        for (long ch = 0; ch < chunks; ch++) acc += part[(size_t)ch * nw + e];
        dw[e] = (float)acc;
    }
    free(part);
    return MHA_OK;
}

mha_status mha_bwd_qk_backward(float *dq, float *dk, float *d_q_norm, float *d_k_norm, const mha_bwd_saved *sv,
                               const mha_layer *L, const mha_options *opt, int keys_are_x, int nt) {
    const mha_config *c = &L->cfg;
    const int norm = c->qk_norm != MHA_QK_NORM_NONE, B = sv->B, T = sv->T, S = sv->S;
    if (!norm && c->rope.pairing == MHA_ROPE_NONE && c->temperature_floor == 0) return MHA_OK;
    mha_rope_rows rr;
    float *temp = NULL; /* (B*T) */
    mha_status s = mha_rope_rows_make(&rr, c, opt, keys_are_x, B, T, S, "fast backward");
    if (!s) s = mha_query_temperatures(&temp, c, opt, B, T, "fast backward");
    if (!s)
        s = transform_backward(dq, d_q_norm, sv->q_pre, c, B, T, c->n_heads, norm ? L->q_norm : NULL, &rr, rr.qrow,
                               temp, nt);
    if (!s)
        s = transform_backward(dk, d_k_norm, sv->k_pre, c, B, S, c->n_kv_heads, norm ? L->k_norm : NULL, &rr,
                               rr.krow, NULL, nt);
    mha_rope_rows_free(&rr), free(temp);
    return s;
}
