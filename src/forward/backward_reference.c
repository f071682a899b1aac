/* backward_reference.c — the backward oracle: plain loops in double that
 * differentiate the forward of mha.h line by line (each step quotes the
 * forward line it differentiates). It recomputes Q, K, V, P and Z from the
 * inputs, so it needs nothing saved by the forward.
 * Legend: B batch, T queries, S keys, Sx = S + extra keys (bias_kv row,
 * zero row), h heads, h_kv kv heads, d_k, d_v, D = d_model, d_kv_in, d_v_in. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "forward/backward.h"
#include "forward/forward.h"
#include "core/variants.h"

/* Backward of out = in w + b for dout (rows, n): dw (k, n) += in^T dout,
 * db (n) += sum_t dout, din (rows, k) += dout w^T. */
static void linear_backward(double *din, double *dw, double *db, const float *in, const float *w,
                            const double *dout, size_t rows, int k, int n) {
    for (size_t t = 0; t < rows; t++) {
        const double *dt = dout + t * n;
        for (int o = 0; o < n; o++) db[o] += dt[o];
        for (int i = 0; i < k; i++) {
            double xi = in[t * k + i], acc = 0.0;
            const float *wi = w + (size_t)i * n;
            for (int o = 0; o < n; o++) {
                dw[(size_t)i * n + o] += xi * dt[o];
                acc += dt[o] * wi[o];
            }
            din[t * k + i] += acc;
        }
    }
}

/* RoPE (transpose 0) or its transpose (1) on every head of the rows
 * m (B, n, heads*d_k) of q (keys 0) or k (keys 1), at the forward's positions
 * and frequencies (a call of length seq). */
static void rope_heads(double *m, const mha_config *c, int B, int n, int heads, const mha_options *opt, int keys,
                       int keys_are_x, int T, long long seq, int transpose) {
    const int half = c->rope.dim / 2;
    double inv_freq[half > 0 ? half : 1], mscale;
    mha_rope_frequencies(inv_freq, &mscale, c, seq);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < n; t++) {
            const int pos = keys ? mha_key_position(opt, keys_are_x, b, t, n) : mha_query_position(opt, b, t, T);
            for (int r = 0; r < heads; r++)
                mha_rope_rotate_double(m + (((size_t)b * n + t) * heads + r) * c->d_k, c, inv_freq, mscale, pos,
                                       transpose);
        }
}

/* Backward of one norm row y = (x - mean) * inv * w (mean 0 for RMS), inv =
 * 1/sqrt(var + eps), width d, from the pre-norm x (d): with xhat = (x - mean)
 * inv and g = dy w, dw += dy xhat and dx = inv (g - mean(g) - xhat mean(g
 * xhat)), mean(g) only for LayerNorm. dy (d) is replaced by dx. */
static void norm_row_backward(double *dy, double *dw, const double *x, const float *w, int d, const mha_config *c) {
    double mean = 0.0, var = 0.0, mg = 0.0, mgx = 0.0;
    const int layer = c->qk_norm == MHA_QK_NORM_LAYER;
    for (int e = 0; layer && e < d; e++) mean += x[e];
    mean /= d;
    for (int e = 0; e < d; e++) var += (x[e] - mean) * (x[e] - mean);
    const double inv = 1.0 / sqrt(var / d + (double)c->qk_norm_eps);
    for (int e = 0; e < d; e++) {
        const double xhat = (x[e] - mean) * inv, ge = dy[e] * w[e];
        dw[e] += dy[e] * xhat;
        mg += ge, mgx += ge * xhat;
    }
    mg = layer ? mg / d : 0.0, mgx /= d;
    for (int e = 0; e < d; e++) dy[e] = inv * (dy[e] * w[e] - mg - (x[e] - mean) * inv * mgx);
}

/* QK-norm backward on every row of dm (B*n, heads*d_k), in place, from the
 * pre-norm rows pre (same shape): per head (weights shared or per head)
 * or over the whole width (qk_norm_whole); dw as w. */
static void norm_backward(double *dm, double *dw, const double *pre, const float *w, const mha_config *c,
                          size_t rows, int heads) {
    const int d = c->d_k;
    const size_t width = (size_t)heads * d;
    for (size_t t = 0; t < rows; t++) {
        if (c->qk_norm_whole) {
            norm_row_backward(dm + t * width, dw, pre + t * width, w, (int)width, c);
            continue;
        }
        for (int r = 0; r < heads; r++) {
            const size_t wo = c->qk_norm_per_head ? (size_t)r * d : 0;
            norm_row_backward(dm + t * width + (size_t)r * d, dw + wo, pre + t * width + (size_t)r * d, w + wo, d, c);
        }
    }
}

/* One query row of attention: p (Sx) = softmax(softcap(scale * q K^T) +
 * alibi + mask) over the allowed keys, 0 elsewhere. A row with no allowed
 * key gets p = fill everywhere (0, or NaN in MHA_MASKED_ROW_NAN mode), so
 * that NaN reaches every gradient it touches, as it does in PyTorch. kb is
 * batch b's keys (Sx, h_kv*d_k), head g at columns [g*d_k, (g+1)*d_k).
 * dcap (Sx) = d softcap(u) / du at each score (1 without a cap).
 * *p_sink = the sink's share exp(sink_r) / denominator (0 without sinks). */
static void prob_row(double *p, double *dcap, double *p_sink, const double *qi, const double *kb, const mha_layer *L,
                     int keys_are_x, const mha_options *opt, double scale, int b, int r, int i, int T, int S) {
    const mha_config *c = &L->cfg;
    const int Sx = mha_total_keys(c, S), g = mha_kv_head(c, r), d_k = c->d_k;
    const size_t kw = (size_t)c->n_kv_heads * d_k;
    double max = -INFINITY;
    for (int j = 0; j < Sx; j++) {
        double add = 0.0;
        if (!(j >= S || mha_mask_key(opt, b, r, i, j, T, S, &add))) {
            p[j] = -INFINITY;
            continue;
        }
        double dot = 0.0;
        for (int e = 0; e < d_k; e++) dot += qi[e] * kb[j * kw + (size_t)g * d_k + e];
        p[j] = scale * dot;
        dcap[j] = 1.0;
        if (c->softcap != 0.0f) { /* cap tanh(u / cap): derivative 1 - tanh^2 */
            const double th = tanh(p[j] / c->softcap);
            p[j] = c->softcap * th, dcap[j] = 1.0 - th * th;
        }
        if (c->alibi) /* -slope_r |p_i - p_j|: a constant, no gradient */
            p[j] -= L->alibi_slopes[r] * fabs((double)mha_query_position(opt, b, i, T) -
                                              mha_key_position(opt, keys_are_x, b, j, S));
        p[j] += add;
        if (p[j] > max) max = p[j];
    }
    if (max == -INFINITY) { /* with a sink: p = 0 and the sink's share 1, in either mode */
        double fill = opt->masked_row == MHA_MASKED_ROW_NAN && !c->sinks ? NAN : 0.0;
        for (int j = 0; j < Sx; j++) p[j] = fill;
        *p_sink = c->sinks ? 1.0 : fill;
        return;
    }
    /* a sink joins the denominator: exp(sink_r), no value */
    if (c->sinks && L->sinks[r] > max) max = L->sinks[r];
    double sum = c->sinks ? (*p_sink = exp(L->sinks[r] - max)) : (*p_sink = 0.0);
    for (int j = 0; j < Sx; j++) sum += (p[j] = exp(p[j] - max));
    for (int j = 0; j < Sx; j++) p[j] /= sum;
    *p_sink /= sum;
}

/* Backward of the intervention on head r's block of dz (rows, h*d), in
 * place: d(Z_after)/d(Z_before) as the functions of mha.h. */
static void intervene_backward(double *dz, const mha_intervention *iv, int r, int h, size_t rows, int d) {
    double *blk = dz + (size_t)r * d;
    const size_t zw = (size_t)h * d;
    for (int e = 0; e < d; e++) {
        double mean = 0.0; /* Z_after[t] = mean_t' Z_before[t'] -> dZ_before[t] = mean_t' dZ_after[t'] */
        for (size_t t = 0; iv->op == MHA_HEAD_MEAN && t < rows; t++) mean += blk[t * zw + e];
        mean /= (double)rows;
        for (size_t t = 0; t < rows; t++) {
            double *v = &blk[t * zw + e];
            switch (iv->op) {
            case MHA_HEAD_KEEP: break;
            case MHA_HEAD_ZERO: /* fallthrough: a constant passes no gradient */
            case MHA_HEAD_REPLACE: *v = 0.0; break;
            case MHA_HEAD_SCALE: *v *= iv->scale; break;
            case MHA_HEAD_MEAN: *v = mean; break;
            }
        }
    }
}

/* The clamp's backward: d (n) zeroed where raw (n) is outside [-clip, clip]. */
static void clip_backward(double *d, const double *raw, size_t n, double clip) {
    for (size_t i = 0; i < n; i++)
        if (!(raw[i] >= -clip && raw[i] <= clip)) d[i] = 0.0;
}

/* Rounds n doubles (sum of up to three arrays; NULL terms are skipped) into out. */
static void store(float *out, const double *a, const double *b, const double *c, size_t n) {
    for (size_t i = 0; out && i < n; i++)
        out[i] = (float)(a[i] + (b ? b[i] : 0.0) + (c ? c[i] : 0.0));
}

mha_status mha_backward_reference(const mha_layer *L, const mha_gradients *g, const float *dy,
                                  const float *x, const float *k_src, const float *v_src, int B, int T,
                                  int S, const mha_options *opt) {
    const mha_config *c = &L->cfg;
    const int h = c->n_heads, h_kv = c->n_kv_heads, d_k = c->d_k, d_v = c->d_v, D = c->d_model;
    const int Sx = mha_total_keys(c, S), Dk = c->d_kv_in, Dv = c->d_v_in;
    const size_t qw = (size_t)h * d_k, kw = (size_t)h_kv * d_k, vw = (size_t)h_kv * d_v, zw = (size_t)h * d_v;
    const size_t rows = (size_t)B * T;
    const double scale = opt->scale != 0.0f ? opt->scale : 1.0 / sqrt((double)d_k);
    const int norm = c->qk_norm != MHA_QK_NORM_NONE;
    const size_t qn = !norm ? 0 : c->qk_norm_per_head ? qw : (size_t)d_k; /* q_norm's size */
    const size_t kn = !norm ? 0 : c->qk_norm_per_head ? kw : (size_t)d_k; /* k_norm's size */
    const double clip = c->clip_qkv;
    const int gate = c->output_gate;

    /* Every buffer in double; the d-prefixed ones are gradients (zeroed). */
    size_t n_of[] = {
        rows * qw, (size_t)B * Sx * kw, (size_t)B * Sx * vw, rows * zw, /* q k v z */
        rows * zw, rows * qw, (size_t)B * Sx * kw, (size_t)B * Sx * vw, /* dz dq dk dv */
        rows * D, (size_t)B * S * Dk, (size_t)B * S * Dv,                /* dxq dxk dxv */
        (size_t)D * qw, (size_t)Dk * kw, (size_t)Dv * vw, zw * D,        /* dwq dwk dwv dwo */
        qw, kw, vw, (size_t)D, (size_t)Sx, (size_t)Sx, (size_t)Sx,        /* dbq dbk dbv dbo p dp dcap */
        (size_t)h, rows * qw, (size_t)B * Sx * kw,                        /* dsink qpre kpre */
        qn, kn,                                                           /* dq_norm dk_norm */
        clip ? rows * qw : 0, clip ? (size_t)B * Sx * kw : 0, clip ? (size_t)B * Sx * vw : 0, /* qraw kraw vraw */
        gate ? rows * zw : 0, gate ? rows * zw : 0, gate ? (size_t)D * zw : 0, gate ? zw : 0, /* sg za dwg dbg */
    };
    enum { NBUF = sizeof n_of / sizeof n_of[0] };
    double *buf[NBUF];
    int ok = 1;
    for (int i = 0; i < NBUF; i++) ok &= (buf[i] = calloc(n_of[i] ? n_of[i] : 1, sizeof(double))) != NULL;
    double *q = buf[0], *k = buf[1], *v = buf[2], *z = buf[3];     // (B,T,qw) (B,Sx,kw) (B,Sx,vw) (B,T,zw)
    double *dz = buf[4], *dq = buf[5], *dk = buf[6], *dv = buf[7]; // shapes as z, q, k, v
    double *dxq = buf[8], *dxk = buf[9], *dxv = buf[10];            // (B,T,D) (B,S,Dk) (B,S,Dv)
    double *dwq = buf[11], *dwk = buf[12], *dwv = buf[13], *dwo = buf[14];
    double *dbq = buf[15], *dbk = buf[16], *dbv = buf[17], *dbo = buf[18];
    double *p = buf[19], *dp = buf[20], *dcap = buf[21]; // (Sx) one query row
    double *dsink = buf[22], p_sink = 0.0;                // (h); the sink's share of one row
    double *qpre = buf[23], *kpre = buf[24];              // as q, k: before QK-norm (qk_norm only)
    double *dqn = buf[25], *dkn = buf[26];                // (qn) (kn): as q_norm, k_norm
    double *qraw = buf[27], *kraw = buf[28], *vraw = buf[29]; // as q, k, v: before the clamp (clip_qkv only)
    double *sg = buf[30], *za = buf[31];                      // (B,T,zw): sigmoid(G), Z before it (output_gate)
    double *dwg = buf[32], *dbg = buf[33];                    // (D,zw) (zw): as w_g, b_g
    mha_status s = MHA_OK;
    if (!ok) {
        s = mha_fail(MHA_E_NOMEM, "reference backward: no memory for the double buffers (B=%d T=%d S=%d)", B, T, S);
        goto done;
    }

    // --- recompute: Q = X W_Q + b_Q; K = Xk W_K + b_K; V = Xv W_V + b_V; extra rows
    mha_linear_double(q, x, L->w_q, L->b_q, rows, D, (int)qw);
    for (int b = 0; b < B; b++) {
        mha_linear_double(k + (size_t)b * Sx * kw, k_src + (size_t)b * S * Dk, L->w_k, L->b_k, (size_t)S, Dk, (int)kw);
        mha_linear_double(v + (size_t)b * Sx * vw, v_src + (size_t)b * S * Dv, L->w_v, L->b_v, (size_t)S, Dv, (int)vw);
        if (c->add_bias_kv) { /* key S is the learned bias row; the zero row (if any) stays 0 */
            for (size_t e = 0; e < kw; e++) k[((size_t)b * Sx + S) * kw + e] = L->bias_k[e];
            for (size_t e = 0; e < vw; e++) v[((size_t)b * Sx + S) * vw + e] = L->bias_v[e];
        }
    }
    // --- recompute: Q, K, V <- clamp(., -c, c) (clip_qkv; no extra keys with variants: Sx = S)
    if (clip != 0.0) {
        memcpy(qraw, q, rows * qw * sizeof(double));
        memcpy(kraw, k, (size_t)B * Sx * kw * sizeof(double));
        memcpy(vraw, v, (size_t)B * Sx * vw * sizeof(double));
        mha_clip_double(q, rows * qw, clip);
        mha_clip_double(k, (size_t)B * Sx * kw, clip);
        mha_clip_double(v, (size_t)B * Sx * vw, clip);
    }
    // --- recompute: Q, K <- RoPE(norm(Q)), RoPE(norm(K)) (no extra keys with variants: Sx = S)
    if (norm) {
        memcpy(qpre, q, rows * qw * sizeof(double));
        memcpy(kpre, k, (size_t)B * Sx * kw * sizeof(double));
    }
    const long long seq = mha_rope_call_length(opt, k_src == x, B, T, S);
    mha_qk_transform_double(q, c, B, T, h, L->q_norm, opt, 0, k_src == x, T, seq);
    mha_qk_transform_double(k, c, B, S, h_kv, L->k_norm, opt, 1, k_src == x, T, seq);
    // --- recompute: Z^(r) = dropout(P) V^(g), then the gate and the interventions (what W_O reads)
    for (int b = 0; b < B; b++)
        for (int r = 0; r < h; r++)
            for (int i = 0; i < T; i++) {
                const size_t t = (size_t)b * T + i;
                const double *vb = v + (size_t)b * Sx * vw + (size_t)mha_kv_head(c, r) * d_v;
                prob_row(p, dcap, &p_sink, q + t * qw + (size_t)r * d_k, k + (size_t)b * Sx * kw, L, k_src == x,
                         opt, scale, b, r, i, T, S);
                for (int j = 0; j < Sx; j++)
                    for (int e = 0; e < d_v; e++)
                        z[t * zw + (size_t)r * d_v + e] += p[j] * mha_dropout_factor(opt, h, T, b, r, i, j) * vb[j * vw + e];
            }
    // --- recompute: Z' = Z * sigmoid(G), G = X W_G + b_G (output_gate), before the interventions
    if (gate) {
        mha_linear_double(sg, x, L->w_g, L->b_g, rows, D, (int)zw);
        memcpy(za, z, rows * zw * sizeof(double));
        for (size_t i = 0; i < rows * zw; i++) z[i] *= (sg[i] = 1.0 / (1.0 + exp(-sg[i])));
    }
    for (int r = 0; opt->interventions && r < h; r++) {
        const mha_intervention *iv = &opt->interventions[r];
        for (size_t t = 0; t < rows; t++) {
            double *zr = z + t * zw + (size_t)r * d_v;
            for (int e = 0; e < d_v; e++)
                if (iv->op == MHA_HEAD_ZERO) zr[e] = 0.0;
                else if (iv->op == MHA_HEAD_SCALE) zr[e] *= iv->scale;
                else if (iv->op == MHA_HEAD_REPLACE) zr[e] = iv->value[t * d_v + e];
        }
        for (int e = 0; iv->op == MHA_HEAD_MEAN && e < d_v; e++) {
            double mean = 0.0;
            for (size_t t = 0; t < rows; t++) mean += z[t * zw + (size_t)r * d_v + e];
            for (size_t t = 0; t < rows; t++) z[t * zw + (size_t)r * d_v + e] = mean / (double)rows;
        }
    }

    // --- Y = Z W_O + b_O:  dW_O = Z^T dY, db_O = sum dY, dZ = dY W_O^T
    for (size_t t = 0; t < rows; t++)
        for (size_t e = 0; e < zw; e++) {
            double acc = 0.0;
            for (int o = 0; o < D; o++) {
                dwo[e * D + o] += z[t * zw + e] * dy[t * D + o];
                acc += dy[t * D + o] * (double)L->w_o[e * D + o];
            }
            dz[t * zw + e] = acc;
        }
    for (size_t t = 0; t < rows; t++)
        for (int o = 0; o < D; o++) dbo[o] += dy[t * D + o];

    // --- interventions: dZ before = dZ after through each head's function
    for (int r = 0; opt->interventions && r < h; r++)
        intervene_backward(dz, &opt->interventions[r], r, h, rows, d_v);

    // --- Z' = Z * s, s = sigmoid(G): dG = dZ' * Z * s (1 - s) (kept in za), dZ = dZ' * s;
    //     G = X W_G + b_G: dW_G = X^T dG, db_G = sum dG, dX += dG W_G^T
    if (gate) {
        for (size_t i = 0; i < rows * zw; i++) {
            za[i] *= dz[i] * sg[i] * (1.0 - sg[i]);
            dz[i] *= sg[i];
        }
        linear_backward(dxq, dwg, dbg, x, L->w_g, za, rows, D, (int)zw);
    }

    // --- Z^(r) = P' V^(g), P' = dropout(P) = P m, P = softmax(scale * Q^(r) K^(g)^T + mask, sink):
    //     dV += P'^T dZ; dP = (dZ V^T) m; dS = P * (dP - rowsum(P * dP)) * softcap';
    //     the sink has no value (its dP is 0): dsink_r -= p_sink * rowsum(P * dP);
    //     dQ = scale * dS K; dK += scale * dS^T Q   (kv heads sum their group)
    for (int b = 0; b < B; b++)
        for (int r = 0; r < h; r++) {
            const size_t kg = (size_t)mha_kv_head(c, r) * d_k, vg = (size_t)mha_kv_head(c, r) * d_v;
            const double *kb = k + (size_t)b * Sx * kw, *vb = v + (size_t)b * Sx * vw;
            double *dkb = dk + (size_t)b * Sx * kw, *dvb = dv + (size_t)b * Sx * vw;
            for (int i = 0; i < T; i++) {
                const size_t t = (size_t)b * T + i;
                const double *qi = q + t * qw + (size_t)r * d_k, *dzi = dz + t * zw + (size_t)r * d_v;
                double *dqi = dq + t * qw + (size_t)r * d_k;
                prob_row(p, dcap, &p_sink, qi, kb, L, k_src == x, opt, scale, b, r, i, T, S);
                double rowsum = 0.0;
                for (int j = 0; j < Sx; j++) {
                    const double m = mha_dropout_factor(opt, h, T, b, r, i, j); /* P' = P m */
                    double acc = 0.0;
                    for (int e = 0; e < d_v; e++) {
                        acc += dzi[e] * vb[j * vw + vg + e];
                        dvb[j * vw + vg + e] += p[j] * m * dzi[e];
                    }
                    dp[j] = acc * m; /* dl/dP = dl/dP' m */
                    rowsum += p[j] * dp[j];
                }
                dsink[r] -= p_sink * rowsum;
                for (int j = 0; j < Sx; j++) {
                    double ds = scale * p[j] * (dp[j] - rowsum) * dcap[j];
                    for (int e = 0; e < d_k; e++) {
                        dqi[e] += ds * kb[j * kw + kg + e];
                        dkb[j * kw + kg + e] += ds * qi[e];
                    }
                }
            }
        }

    // --- query temperature: Q_t = s(pos) Q_rot per row, so dQ_rot = s dQ_t
    for (int b = 0; c->temperature_floor && b < B; b++)
        for (int i = 0; i < T; i++) {
            const double ts = mha_query_temperature(c, mha_query_position(opt, b, i, T));
            for (size_t e = 0; e < qw; e++) dq[((size_t)b * T + i) * qw + e] *= ts;
        }
    // --- RoPE: Q_rot = Q R (per row), so dQ = dQ_rot R^T; the same for K
    if (c->rope.pairing != MHA_ROPE_NONE) {
        rope_heads(dq, c, B, T, h, opt, 0, k_src == x, T, seq, 1);
        rope_heads(dk, c, B, S, h_kv, opt, 1, k_src == x, T, seq, 1);
    }
    // --- QK-norm: Q_n = norm(Q) w_q_norm, the same for K
    if (norm) {
        norm_backward(dq, dqn, qpre, L->q_norm, c, rows, h);
        norm_backward(dk, dkn, kpre, L->k_norm, c, (size_t)B * S, h_kv);
    }
    // --- Q_c = clamp(Q, -c, c): dQ = dQ_c where -c <= Q <= c (torch passes the bounds), else 0; K, V alike
    if (clip != 0.0) {
        clip_backward(dq, qraw, rows * qw, clip);
        clip_backward(dk, kraw, (size_t)B * Sx * kw, clip);
        clip_backward(dv, vraw, (size_t)B * Sx * vw, clip);
    }
    // --- projections: Q = X W_Q + b_Q, K = Xk W_K + b_K, V = Xv W_V + b_V;
    //     the extra key S is bias_k / bias_v, the zero key passes nothing
    linear_backward(dxq, dwq, dbq, x, L->w_q, dq, rows, D, (int)qw);
    for (int b = 0; b < B; b++) {
        linear_backward(dxk + (size_t)b * S * Dk, dwk, dbk, k_src + (size_t)b * S * Dk, L->w_k,
                        dk + (size_t)b * Sx * kw, (size_t)S, Dk, (int)kw);
        linear_backward(dxv + (size_t)b * S * Dv, dwv, dbv, v_src + (size_t)b * S * Dv, L->w_v,
                        dv + (size_t)b * Sx * vw, (size_t)S, Dv, (int)vw);
    }
    for (size_t e = 0; g->dbias_k && e < kw; e++) {
        double acc = 0.0;
        for (int b = 0; b < B; b++) acc += dk[((size_t)b * Sx + S) * kw + e];
        g->dbias_k[e] = (float)acc;
    }
    for (size_t e = 0; g->dbias_v && e < vw; e++) {
        double acc = 0.0;
        for (int b = 0; b < B; b++) acc += dv[((size_t)b * Sx + S) * vw + e];
        g->dbias_v[e] = (float)acc;
    }

    // --- the sources' gradients: a source that is x (or the key source)
    //     adds its path's gradient to that tensor's
    store(g->dx, dxq, k_src == x ? dxk : NULL, v_src == x ? dxv : NULL, rows * D);
    store(g->dk_src, dxk, v_src == k_src ? dxv : NULL, NULL, (size_t)B * S * Dk);
    store(g->dv_src, dxv, NULL, NULL, (size_t)B * S * Dv);
    store(g->dw_q, dwq, NULL, NULL, (size_t)D * qw);
    store(g->dw_k, dwk, NULL, NULL, (size_t)Dk * kw);
    store(g->dw_v, dwv, NULL, NULL, (size_t)Dv * vw);
    store(g->dw_o, dwo, NULL, NULL, zw * D);
    store(g->db_q, dbq, NULL, NULL, qw);
    store(g->db_k, dbk, NULL, NULL, kw);
    store(g->db_v, dbv, NULL, NULL, vw);
    store(g->db_o, dbo, NULL, NULL, (size_t)D);
    store(g->d_sinks, dsink, NULL, NULL, (size_t)h);
    store(g->d_q_norm, dqn, NULL, NULL, qn);
    store(g->d_k_norm, dkn, NULL, NULL, kn);
    store(g->dw_g, dwg, NULL, NULL, (size_t)D * zw);
    store(g->db_g, dbg, NULL, NULL, zw);
done:
    for (int i = 0; i < NBUF; i++) free(buf[i]);
    return s;
}
