/* test_backward_fast.c — the fast backward (MHA_PATH_FAST) against the
 * reference backward (MHA_PATH_REFERENCE, double, itself checked against
 * finite differences in test_backward.c) for every option it serves.
 * Tolerance per gradient tensor, the forward's rule: max|fast - ref| <=
 * 2 * max|naive32 - ref| + 1e-6, naive32 being the plain fp32 backward
 * written below from the math of docs/BACKWARD.md. Also: bit-identical
 * across 1 and 2 threads, every kernel ISA (per_isa_areas in test_main.c),
 * the kernels taken from mha_exec, the MHA_E_UNSUPPORTED
 * fallback, and the peak memory of forward then backward.
 * Legend: B, T, S, Sx = S + extra keys, h, h_kv, d_k, d_v, D = d_model,
 * Dk = d_kv_in, Dv = d_v_in. */
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "compute/exec.h"
#include "forward/backward.h"
#include "forward/backward_fast.h"
#include "kernels/kernels.h"
#include "naive.h"
#include "tests.h"

/* ------------------------------------------------ naive fp32 backward */

/* The 13 gradients in mha_gradients' order (dx .. dbias_v). */
enum { G_DX, G_DK_SRC, G_DV_SRC, G_DWQ, G_DWK, G_DWV, G_DWO, G_DBQ, G_DBK, G_DBV, G_DBO, G_DBIAS_K,
       G_DBIAS_V, G_N };
static const char *const grad_names[G_N] = {"dx", "dk_src", "dv_src", "dw_q", "dw_k", "dw_v", "dw_o",
                                            "db_q", "db_k", "db_v", "db_o", "dbias_k", "dbias_v"};

typedef struct {
    float *t[G_N];   /* NULL: the layer or the call has no such tensor */
    size_t n[G_N];
} grads;

static float **slot(mha_gradients *g, int i) {
    float **m[G_N] = {&g->dx, &g->dk_src, &g->dv_src, &g->dw_q, &g->dw_k, &g->dw_v, &g->dw_o,
                      &g->db_q, &g->db_k, &g->db_v, &g->db_o, &g->dbias_k, &g->dbias_v};
    return m[i];
}

static void grads_alloc(grads *g, const mha_config *c, int B, int T, int S, int k_given, int v_given) {
    const size_t qw = (size_t)c->n_heads * c->d_k, kw = (size_t)c->n_kv_heads * c->d_k,
                 vw = (size_t)c->n_kv_heads * c->d_v, zw = (size_t)c->n_heads * c->d_v;
    const size_t n[G_N] = {(size_t)B * T * c->d_model, k_given ? (size_t)B * S * c->d_kv_in : 0,
                           v_given ? (size_t)B * S * c->d_v_in : 0, (size_t)c->d_model * qw,
                           (size_t)c->d_kv_in * kw, (size_t)c->d_v_in * vw, zw * c->d_model,
                           c->bias ? qw : 0, c->bias ? kw : 0, c->bias ? vw : 0,
                           c->bias ? (size_t)c->d_model : 0, c->add_bias_kv ? kw : 0, c->add_bias_kv ? vw : 0};
    for (int i = 0; i < G_N; i++) {
        g->n[i] = n[i];
        g->t[i] = n[i] ? naive_alloc_floats(n[i]) : NULL;
    }
}

static void grads_free(grads *g) {
    for (int i = 0; i < G_N; i++) free(g->t[i]);
}

static mha_gradients grads_view(const grads *g) {
    mha_gradients v;
    memset(&v, 0, sizeof v);
    for (int i = 0; i < G_N; i++) *slot(&v, i) = g->t[i];
    return v;
}

/* out (rows, n) = in (rows, k) w (k, n) + b, fp32 in k order. */
static void lin(float *out, const float *in, const float *w, const float *b, int rows, int k, int n) {
    for (int t = 0; t < rows; t++)
        for (int o = 0; o < n; o++) {
            float acc = b ? b[o] : 0.0f;
            for (int i = 0; i < k; i++) acc += in[t * k + i] * w[i * n + o];
            out[t * n + o] = acc;
        }
}

/* Backward of out = in w + b: dw += in^T dout, db += sum dout, din += dout w^T. */
static void lin_back(float *din, float *dw, float *db, const float *in, const float *w, const float *dout,
                     int rows, int k, int n) {
    for (int t = 0; t < rows; t++)
        for (int i = 0; i < k; i++) {
            float acc = 0.0f;
            for (int o = 0; o < n; o++) {
                if (dw) dw[i * n + o] += in[t * k + i] * dout[t * n + o];
                acc += dout[t * n + o] * w[i * n + o];
            }
            if (din) din[t * k + i] += acc;
        }
    for (int t = 0; db && t < rows; t++)
        for (int o = 0; o < n; o++) db[o] += dout[t * n + o];
}

/* p (Sx) = softmax row of query i, head r; 0 for masked keys; all 0 (or
 * NaN) when no key is allowed. k is batch b's (Sx, h_kv*d_k). */
static void softmax_row(float *p, const float *qi, const float *k, const naive_weights *w, const mha_options *o,
                        float scale, int b, int r, int i, int T, int S) {
    const mha_config *c = &w->cfg;
    const int Sx = S + c->add_bias_kv + c->add_zero_attn, g = r / (c->n_heads / c->n_kv_heads);
    const int kw = c->n_kv_heads * c->d_k;
    float mx = -INFINITY, sum = 0.0f;
    for (int j = 0; j < Sx; j++) {
        double add = 0.0;
        p[j] = -INFINITY;
        if (j < S && !mha_mask_key(o, b, r, i, j, T, S, &add)) continue;
        float dot = 0.0f;
        for (int e = 0; e < c->d_k; e++) dot += qi[e] * k[j * kw + g * c->d_k + e];
        p[j] = scale * dot + (float)add;
        mx = fmaxf(mx, p[j]);
    }
    for (int j = 0; j < Sx; j++) {
        if (mx == -INFINITY) p[j] = o->masked_row == MHA_MASKED_ROW_NAN ? NAN : 0.0f;
        else sum += (p[j] = expf(p[j] - mx));
    }
    for (int j = 0; mx != -INFINITY && j < Sx; j++) p[j] /= sum;
}

/* Every gradient of g, in fp32, one formula per step. Sources as
 * mha_backward_kv: ks NULL = x, vs NULL = ks. */
static void naive32_backward(grads *gr, const naive_weights *w, const float *x, const float *ks, const float *vs,
                             const float *dy, int B, int T, int S, const mha_options *o) {
    const mha_config *c = &w->cfg;
    const int h = c->n_heads, hk = c->n_kv_heads, dk = c->d_k, dv = c->d_v, D = c->d_model;
    const int Dk = c->d_kv_in, Dv = c->d_v_in, Sx = S + c->add_bias_kv + c->add_zero_attn;
    const int qw = h * dk, kw = hk * dk, vw = hk * dv, zw = h * dv, rows = B * T;
    const float scale = o->scale != 0.0f ? o->scale : 1.0f / sqrtf((float)dk);
    const float *kx = ks ? ks : x, *vx = vs ? vs : kx;
    float *q = naive_alloc_floats((size_t)rows * qw), *k = naive_alloc_floats((size_t)B * Sx * kw);
    float *v = naive_alloc_floats((size_t)B * Sx * vw), *z = naive_alloc_floats((size_t)rows * zw);
    float *dz = naive_alloc_floats((size_t)rows * zw), *dq = naive_alloc_floats((size_t)rows * qw);
    float *dkk = naive_alloc_floats((size_t)B * Sx * kw), *dvv = naive_alloc_floats((size_t)B * Sx * vw);
    float *dxk = naive_alloc_floats((size_t)B * S * Dk), *dxv = naive_alloc_floats((size_t)B * S * Dv);
    float *p = naive_alloc_floats((size_t)Sx), *dp = naive_alloc_floats((size_t)Sx);
    for (int i = 0; i < G_N; i++)
        if (gr->t[i]) memset(gr->t[i], 0, gr->n[i] * sizeof(float));
    float *dx = naive_alloc_floats((size_t)rows * D);
    // Q = X W_Q + b_Q, K = Xk W_K + b_K, V = Xv W_V + b_V; row S: bias_k, bias_v
    lin(q, x, w->w_q, w->b_q, rows, D, qw);
    for (int b = 0; b < B; b++) {
        lin(k + b * Sx * kw, kx + b * S * Dk, w->w_k, w->b_k, S, Dk, kw);
        lin(v + b * Sx * vw, vx + b * S * Dv, w->w_v, w->b_v, S, Dv, vw);
        if (c->add_bias_kv) {
            memcpy(k + (b * Sx + S) * kw, w->bias_k, sizeof(float) * kw);
            memcpy(v + (b * Sx + S) * vw, w->bias_v, sizeof(float) * vw);
        }
    }
    // Z^(r) = P V^(g), then the interventions
    for (int b = 0; b < B; b++)
        for (int r = 0; r < h; r++)
            for (int i = 0; i < T; i++) {
                const int t = b * T + i, g = r / (h / hk);
                softmax_row(p, q + t * qw + r * dk, k + b * Sx * kw, w, o, scale, b, r, i, T, S);
                for (int j = 0; j < Sx; j++)
                    for (int e = 0; e < dv; e++) z[t * zw + r * dv + e] += p[j] * v[(b * Sx + j) * vw + g * dv + e];
            }
    float *za = naive_alloc_floats((size_t)rows * zw);
    memcpy(za, z, sizeof(float) * rows * zw);
    for (int r = 0; o->interventions && r < h; r++) {
        const mha_intervention *iv = &o->interventions[r];
        for (int e = 0; e < dv; e++) {
            float mean = 0.0f;
            for (int t = 0; t < rows; t++) mean += za[t * zw + r * dv + e] / (float)rows;
            for (int t = 0; t < rows; t++) {
                float *zz = &za[t * zw + r * dv + e];
                *zz = iv->op == MHA_HEAD_ZERO ? 0.0f : iv->op == MHA_HEAD_SCALE ? *zz * iv->scale
                      : iv->op == MHA_HEAD_MEAN ? mean : iv->op == MHA_HEAD_REPLACE ? iv->value[t * dv + e] : *zz;
            }
        }
    }
    // Y = Z W_O + b_O: dW_O = Z^T dY, db_O = sum dY, dZ = dY W_O^T
    float *dz_after = naive_alloc_floats((size_t)rows * zw);
    lin_back(dz_after, gr->t[G_DWO], gr->t[G_DBO], za, w->w_o, dy, rows, zw, D);
    // interventions: dZ before
    for (int r = 0; r < h; r++) {
        const mha_head_op op = o->interventions ? o->interventions[r].op : MHA_HEAD_KEEP;
        for (int e = 0; e < dv; e++) {
            float mean = 0.0f;
            for (int t = 0; t < rows; t++) mean += dz_after[t * zw + r * dv + e] / (float)rows;
            for (int t = 0; t < rows; t++) {
                const float d = dz_after[t * zw + r * dv + e];
                dz[t * zw + r * dv + e] = op == MHA_HEAD_KEEP ? d : op == MHA_HEAD_SCALE ? d * o->interventions[r].scale
                                          : op == MHA_HEAD_MEAN ? mean : 0.0f;
            }
        }
    }
    // dV += P^T dZ; dP = dZ V^T; dS = P (dP - rowsum(P dP)); dQ = scale dS K; dK += scale dS^T Q
    for (int b = 0; b < B; b++)
        for (int r = 0; r < h; r++)
            for (int i = 0; i < T; i++) {
                const int t = b * T + i, g = r / (h / hk);
                softmax_row(p, q + t * qw + r * dk, k + b * Sx * kw, w, o, scale, b, r, i, T, S);
                float rs = 0.0f;
                for (int j = 0; j < Sx; j++) {
                    dp[j] = 0.0f;
                    for (int e = 0; e < dv; e++) {
                        dp[j] += dz[t * zw + r * dv + e] * v[(b * Sx + j) * vw + g * dv + e];
                        dvv[(b * Sx + j) * vw + g * dv + e] += p[j] * dz[t * zw + r * dv + e];
                    }
                    rs += p[j] * dp[j];
                }
                for (int j = 0; j < Sx; j++) {
                    const float ds = scale * p[j] * (dp[j] - rs);
                    for (int e = 0; e < dk; e++) {
                        dq[t * qw + r * dk + e] += ds * k[(b * Sx + j) * kw + g * dk + e];
                        dkk[(b * Sx + j) * kw + g * dk + e] += ds * q[t * qw + r * dk + e];
                    }
                }
            }
    // projections; sources that are x (or the key source) add their path
    lin_back(dx, gr->t[G_DWQ], gr->t[G_DBQ], x, w->w_q, dq, rows, D, qw);
    for (int b = 0; b < B; b++) {
        lin_back(dxk + b * S * Dk, gr->t[G_DWK], gr->t[G_DBK], kx + b * S * Dk, w->w_k, dkk + b * Sx * kw, S, Dk, kw);
        lin_back(dxv + b * S * Dv, gr->t[G_DWV], gr->t[G_DBV], vx + b * S * Dv, w->w_v, dvv + b * Sx * vw, S, Dv, vw);
        for (int e = 0; gr->t[G_DBIAS_K] && e < kw; e++) gr->t[G_DBIAS_K][e] += dkk[(b * Sx + S) * kw + e];
        for (int e = 0; gr->t[G_DBIAS_V] && e < vw; e++) gr->t[G_DBIAS_V][e] += dvv[(b * Sx + S) * vw + e];
    }
    for (int i = 0; i < rows * D; i++) gr->t[G_DX][i] = dx[i] + (!ks ? dxk[i] : 0.0f) + (!ks && !vs ? dxv[i] : 0.0f);
    for (int i = 0; ks && i < B * S * Dk; i++) gr->t[G_DK_SRC][i] = dxk[i] + (!vs ? dxv[i] : 0.0f);
    for (int i = 0; vs && i < B * S * Dv; i++) gr->t[G_DV_SRC][i] = dxv[i];
    free(q), free(k), free(v), free(z), free(za), free(dz), free(dz_after), free(dq), free(dkk), free(dvv);
    free(dxk), free(dxv), free(p), free(dp), free(dx);
}

/* ------------------------------------------------------------ one case */

typedef naive_bw_case fixture;

static mha_status fx_backward(fixture *f, grads *g, mha_path path) {
    grads_alloc(g, &f->w.cfg, f->B, f->T, f->S, f->k_src != NULL, f->v_src != NULL);
    mha_gradients view = grads_view(g);
    mha_options o = f->opt;
    o.path = path;
    return mha_backward_kv(f->L, &view, f->dy, f->x, f->k_src, f->v_src, f->B, f->T, f->S, &o);
}

/* The tape's way: mha_forward_train (y into f->y), then mha_backward_tape
 * twice (the tape must come out unchanged: the second call's bits are
 * compared with the first's). */
static mha_status fx_backward_tape(fixture *f, grads *g) {
    grads_alloc(g, &f->w.cfg, f->B, f->T, f->S, f->k_src != NULL, f->v_src != NULL);
    mha_gradients view = grads_view(g);
    mha_tape *tape = NULL;
    mha_status s = mha_forward_train(f->L, f->y, &tape, f->x, f->k_src, f->v_src, f->B, f->T, f->S, &f->opt);
    if (s) return s;
    s = mha_backward_tape(f->L, tape, &view, f->dy, f->x, f->k_src, f->v_src, f->B, f->T, f->S, &f->opt);
    grads again;
    grads_alloc(&again, &f->w.cfg, f->B, f->T, f->S, f->k_src != NULL, f->v_src != NULL);
    mha_gradients view2 = grads_view(&again);
    if (!s) s = mha_backward_tape(f->L, tape, &view2, f->dy, f->x, f->k_src, f->v_src, f->B, f->T, f->S, &f->opt);
    for (int i = 0; !s && i < G_N; i++)
        if (g->t[i] && memcmp(g->t[i], again.t[i], g->n[i] * sizeof(float)) != 0)
            test_report(__FILE__, __LINE__, "a second mha_backward_tape on one tape changed %s", grad_names[i]);
    grads_free(&again);
    mha_tape_free(tape);
    return s;
}

/* max|a - b|; NaN equal to NaN counts 0, NaN against a number INFINITY. */
static double diff_nan(const float *a, const float *b, size_t n) {
    double m = 0.0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(a[i]) || isnan(b[i])) {
            if (isnan(a[i]) != isnan(b[i])) return INFINITY;
            continue;
        }
        m = fmax(m, fabs((double)a[i] - (double)b[i]));
    }
    return m;
}

/* The tape's y against the double oracle: within twice the fast
 * forward's own error (itself held to the rule by test_fast.c) + 1e-6. */
static void check_tape_forward(fixture *f, const char *what) {
    const mha_config *c = &f->w.cfg;
    const size_t ny = (size_t)f->B * f->T * c->d_model;
    float *y_fast = naive_alloc_floats(ny);
    double *y_ref = naive_alloc_doubles(ny);
    mha_options o = f->opt;
    o.path = MHA_PATH_FAST;
    CHECK_OK(mha_forward_kv(f->L, y_fast, NULL, f->x, f->k_src, f->v_src, f->B, f->T, f->S, &o));
    naive_forward_kv(y_ref, NULL, NULL, &f->w, f->x, f->k_src, f->v_src, f->B, f->T, f->S, &f->opt);
    const double et = naive_max_diff(f->y, y_ref, ny), ef = naive_max_diff(y_fast, y_ref, ny);
    if (!(et <= 2.0 * ef + 1e-6))
        test_report(__FILE__, __LINE__, "%s: mha_forward_train's y max|tape-ref| = %.3g > 2 * max|fast-ref| "
                    "(%.3g) + 1e-6 (kernels=%s)", what, et, ef, mha_kernels_get()->name);
    free(y_fast), free(y_ref);
}

/* Fast against reference within the rule, for every gradient tensor; the
 * tape backward (mha_forward_train + mha_backward_tape) the fast one's
 * bits, so within the rule as well. slack: the rule's 1e-6 becomes
 * max(1e-6, slack * the largest |reference gradient| of any tensor), for
 * tensors whose exact value is 0 (db_k: softmax ignores a per-row shift)
 * and so hold only the rounding of the others. */
static void check_fast_within(fixture *f, const char *what, double slack) {
    if (!f->L) return;
    grads ref, fast, n32, tape;
    CHECK_OK(fx_backward(f, &ref, MHA_PATH_REFERENCE));
    CHECK_OK(fx_backward(f, &fast, MHA_PATH_FAST));
    CHECK_OK(fx_backward_tape(f, &tape));
    check_tape_forward(f, what);
    for (int i = 0; i < G_N; i++)
        if (ref.t[i] && memcmp(tape.t[i], fast.t[i], ref.n[i] * sizeof(float)) != 0)
            test_report(__FILE__, __LINE__, "%s: the tape backward's %s is not the fast backward's bits (kernels=%s)",
                        what, grad_names[i], mha_kernels_get()->name);
    grads_free(&tape);
    grads_alloc(&n32, &f->w.cfg, f->B, f->T, f->S, f->k_src != NULL, f->v_src != NULL);
    naive32_backward(&n32, &f->w, f->x, f->k_src, f->v_src, f->dy, f->B, f->T, f->S, &f->opt);
    double floor = 0.0;
    for (int i = 0; i < G_N; i++)
        for (size_t e = 0; ref.t[i] && e < ref.n[i]; e++) floor = fmax(floor, slack * fabs(ref.t[i][e]));
    floor = fmax(floor, 1e-6);
    for (int i = 0; i < G_N; i++) {
        if (!ref.t[i]) continue;
        const double ef = diff_nan(fast.t[i], ref.t[i], ref.n[i]), en = diff_nan(n32.t[i], ref.t[i], ref.n[i]);
        if (!(ef <= 2.0 * en + floor))
            test_report(__FILE__, __LINE__, "%s: %s max|fast-ref| = %.3g > 2 * max|naive32-ref| (%.3g) + %.3g "
                        "(B=%d T=%d S=%d kernels=%s)", what, grad_names[i], ef, en, floor, f->B, f->T, f->S,
                        mha_kernels_get()->name);
    }
    grads_free(&ref), grads_free(&fast), grads_free(&n32);
}

static void check_fast(fixture *f, const char *what) { check_fast_within(f, what, 0.0); }

/* ------------------------------------------------------------ the cases */

/* Every option the fast backward serves, on shapes that cross its tiles
 * (96 queries x 96 keys): several blocks, partial blocks, skipped blocks. */
static void run_options(void) {
    fixture f;
    naive_bw_case_make(&f, naive_config(16, 2, 0, 0, 0, 1), 2, 100, 100, 0, 0, 1301);
    check_fast(&f, "self-attention");
    f.opt.causal = 1;
    check_fast(&f, "causal");
    f.opt.causal = 0, f.opt.scale = 0.3f, f.opt.window_left = 20, f.opt.window_right = 5;
    check_fast(&f, "window + scale");
    naive_bw_case_free(&f);

    mha_config c = naive_config(12, 3, 0, 5, 7, 0); /* d_k != d_v, no bias, cross with a separate value source */
    c.d_kv_in = 9, c.d_v_in = 6;
    naive_bw_case_make(&f, c, 2, 37, 200, 1, 1, 1302);
    check_fast(&f, "cross, separate value source");
    f.opt.causal = 1, f.opt.align = MHA_ALIGN_BOTTOM_RIGHT;
    check_fast(&f, "cross causal bottom-right");
    f.opt.align = MHA_ALIGN_TOP_LEFT;
    check_fast(&f, "cross causal top-left");
    naive_bw_case_free(&f);
    c.d_v_in = 9; /* one key/value source: dk_src carries both paths */
    naive_bw_case_make(&f, c, 1, 20, 33, 1, 0, 1303);
    check_fast(&f, "cross, one source");
    naive_bw_case_free(&f);

    naive_bw_case_make(&f, naive_config(16, 4, 2, 0, 0, 1), 2, 97, 97, 0, 0, 1304); /* GQA */
    f.opt.causal = 1;
    check_fast(&f, "GQA causal");
    naive_bw_case_free(&f);
    naive_bw_case_make(&f, naive_config(16, 4, 1, 8, 4, 1), 1, 50, 110, 1, 0, 1305); /* MQA */
    check_fast(&f, "MQA cross");
    naive_bw_case_free(&f);
    /* d_k a multiple of 16: dQ += dS K reads the keys where they are */
    naive_bw_case_make(&f, naive_config(64, 4, 2, 0, 0, 1), 2, 100, 100, 0, 0, 1317); /* d_k = 16, GQA */
    check_fast(&f, "d_k 16 GQA");
    f.opt.causal = 1;
    check_fast(&f, "d_k 16 GQA causal");
    naive_bw_case_free(&f);
    naive_bw_case_make(&f, naive_config(64, 2, 0, 0, 0, 1), 1, 100, 150, 1, 0, 1318); /* d_k = 32 */
    check_fast(&f, "d_k 32 cross");
    f.opt.causal = 1, f.opt.align = MHA_ALIGN_BOTTOM_RIGHT;
    check_fast(&f, "d_k 32 cross causal");
    naive_bw_case_free(&f);

    /* a wide layer: the projection products run several K chunks (d_model
     * and the widths past backward_gemm.c's 256) and row blocks (300 rows
     * past its 288) */
    naive_bw_case_make(&f, naive_config(272, 4, 2, 0, 0, 1), 1, 300, 300, 0, 0, 1319);
    check_fast(&f, "wide layer, GQA");
    naive_bw_case_free(&f);

    const int B = 2, T = 40, S = 120, h = 2;
    naive_bw_case_make(&f, naive_config(8, h, 0, 0, 0, 1), B, T, S, 1, 0, 1306);
    uint8_t *keep = malloc((size_t)B * h * T * S), key_keep[2 * 120];
    float *add = malloc(sizeof(float) * T * S), key_add[2 * 120];
    uint64_t seed = 77;
    for (int i = 0; i < B * h * T * S; i++) keep[i] = (uint8_t)((i * 7 + 3) % 5 != 0);
    test_fill_uniform(add, (size_t)T * S, &seed, -1.0f, 1.0f);
    test_fill_uniform(key_add, (size_t)B * S, &seed, -1.0f, 1.0f);
    for (int i = 0; i < T * S; i += 9) add[i] = -INFINITY;
    for (int i = 0; i < B * S; i++) key_keep[i] = (uint8_t)(i % 4 != 1);
    f.opt.keep_mask = (mha_mask){keep, B, h};
    check_fast(&f, "keep mask (B,h)");
    f.opt.keep_mask.data = NULL, f.opt.additive_mask = (mha_mask){add, 1, 1};
    check_fast(&f, "additive mask (1,1)");
    f.opt.additive_mask.data = NULL, f.opt.key_keep = key_keep, f.opt.key_additive = key_add;
    check_fast(&f, "key padding + key additive");
    f.opt.causal = 1, f.opt.align = MHA_ALIGN_BOTTOM_RIGHT;
    check_fast(&f, "key padding + causal");
    naive_bw_case_free(&f);
    free(keep), free(add);

    c = naive_config(8, 2, 0, 0, 0, 1);
    c.add_bias_kv = 1, c.add_zero_attn = 1;
    naive_bw_case_make(&f, c, 2, 30, 100, 1, 0, 1307);
    uint8_t kk[2 * 100];
    for (int i = 0; i < 200; i++) kk[i] = (uint8_t)(i >= 100 && i % 3 == 0); /* batch 0: only the extra keys */
    f.opt.key_keep = kk;
    check_fast(&f, "bias_kv + zero_attn");
    naive_bw_case_free(&f);
    c.add_zero_attn = 0, c.n_kv_heads = 1;
    naive_bw_case_make(&f, c, 1, 10, 10, 0, 0, 1308);
    f.opt.causal = 1;
    check_fast(&f, "bias_kv, MQA, causal");
    naive_bw_case_free(&f);

    naive_bw_case_make(&f, naive_config(16, 4, 0, 4, 4, 1), 2, 50, 50, 0, 0, 1309);
    float value[2 * 50 * 4]; // (B,T,d_v)
    test_fill_uniform(value, 400, &seed, -1.0f, 1.0f);
    mha_intervention iv[4] = {{MHA_HEAD_ZERO, 0, NULL}, {MHA_HEAD_SCALE, -1.5f, NULL},
                              {MHA_HEAD_MEAN, 0, NULL}, {MHA_HEAD_REPLACE, 0, value}};
    f.opt.interventions = iv;
    check_fast(&f, "interventions");
    naive_bw_case_free(&f);

    /* fully masked rows, MHA_MASKED_ROW_ZERO: zero gradient through them */
    naive_bw_case_make(&f, naive_config(8, 2, 0, 0, 0, 1), 1, 30, 30, 1, 0, 1310);
    f.opt.window_left = 0, f.opt.window_right = 0, f.opt.align = MHA_ALIGN_TOP_LEFT;
    uint8_t pad[30];
    for (int i = 0; i < 30; i++) pad[i] = (uint8_t)(i % 2);
    f.opt.key_keep = pad; /* even queries see only their own (masked) key */
    check_fast(&f, "fully masked rows (zero)");
    naive_bw_case_free(&f);
}

/* On the table the runner forced (test_main.c runs this area once per ISA). */
static void backward_fast_options(void) { run_options(); }

/* The checker itself: a fast gradient off by 1e-4 in one entry fails. */
static void backward_fast_rule_detects_error(void) {
    fixture f;
    naive_bw_case_make(&f, naive_config(8, 2, 0, 0, 0, 1), 1, 20, 20, 0, 0, 1311);
    grads ref, fast, n32;
    CHECK_OK(fx_backward(&f, &ref, MHA_PATH_REFERENCE));
    CHECK_OK(fx_backward(&f, &fast, MHA_PATH_FAST));
    grads_alloc(&n32, &f.w.cfg, 1, 20, 20, 0, 0);
    naive32_backward(&n32, &f.w, f.x, NULL, NULL, f.dy, 1, 20, 20, &f.opt);
    const double en = diff_nan(n32.t[G_DWK], ref.t[G_DWK], ref.n[G_DWK]);
    CHECK(diff_nan(fast.t[G_DWK], ref.t[G_DWK], ref.n[G_DWK]) <= 2.0 * en + 1e-6);
    fast.t[G_DWK][3] += 1e-4f;
    CHECK(!(diff_nan(fast.t[G_DWK], ref.t[G_DWK], ref.n[G_DWK]) <= 2.0 * en + 1e-6));
    grads_free(&ref), grads_free(&fast), grads_free(&n32);
    naive_bw_case_free(&f);
}

/* Scores far from 0 (x scaled up: |s| up to ~1e4, within the fast path's
 * limit): near one-hot rows, where dS = P (dP - D) must come out ~0, and
 * rows whose two best keys tie (a repeated token: l = 2, where m + log l
 * rounded to fp32 would lose half an ulp of m). The fast backward within
 * the rule against the reference; before D took dP's fmaf chain (and lse
 * kept log l apart from m), dW_Q was 3.4e-4 of its size off here, where
 * the naive fp32 backward is ~1e-7 (as torch's fp32). Tie cases: at T = 5
 * every query picks the repeated token (zero gradients through the
 * scores); T = 130 crosses the 96-row tiles with some ties. */
static void backward_fast_large_scores(void) {
    const struct {
        int T;
        float mag;
        int ties;
    } cases[] = {{5, 100.0f, 0}, {5, 100.0f, 1}, {130, 40.0f, 8}};
    for (int i = 0; i < 3; i++) {
        fixture f;
        const int T = cases[i].T, D = 12;
        naive_bw_case_make(&f, naive_config(D, 4, 0, 0, 0, 1), 1, T, T, 0, 0, 1320 + (uint64_t)i);
        for (int e = 0; e < T * D; e++) f.x[e] *= cases[i].mag;
        for (int j = 0; j < cases[i].ties; j++) /* token j + T/2 repeats token j */
            memcpy(f.x + (size_t)(j + T / 2) * D, f.x + (size_t)j * D, sizeof(float) * D);
        char what[64];
        snprintf(what, sizeof what, "large scores T=%d x%g ties=%d", T, (double)cases[i].mag, cases[i].ties);
        check_fast_within(&f, what, 1e-7); /* db_k: exactly 0, fp32 rounding of |grad| ~1e4 */
        naive_bw_case_free(&f);
    }
}

/* Each output element is reduced by one thread in a fixed order: 1 and 2
 * threads give the same bits (GQA, causal, cross, extra keys). */
static void backward_fast_threads_bit_identical(void) {
    mha_config c = naive_config(24, 6, 2, 8, 8, 1);
    c.add_bias_kv = 1, c.d_kv_in = 20;
    fixture f;
    naive_bw_case_make(&f, c, 2, 150, 130, 1, 0, 1312);
    f.opt.causal = 1, f.opt.align = MHA_ALIGN_BOTTOM_RIGHT;
    const int saved = mha_get_num_threads();
    grads one, two;
    mha_set_num_threads(1);
    CHECK_OK(fx_backward(&f, &one, MHA_PATH_FAST));
    mha_set_num_threads(2);
    CHECK_OK(fx_backward(&f, &two, MHA_PATH_FAST));
    mha_set_num_threads(saved);
    double total = 0.0;
    for (int i = 0; i < G_N; i++) {
        if (!one.t[i]) continue;
        if (memcmp(one.t[i], two.t[i], one.n[i] * sizeof(float)) != 0)
            test_report(__FILE__, __LINE__, "%s differs between 1 and 2 threads", grad_names[i]);
        for (size_t e = 0; e < one.n[i]; e++) total += fabs(one.t[i][e]);
    }
    CHECK(total > 1.0); /* real gradients, not zeros */
    grads_free(&one), grads_free(&two);
    naive_bw_case_free(&f);
}

/* Pass 1 keeps each kv head's packed keys per thread below a cap (32 MiB)
 * and packs a longer head's keys tile by tile: both give the same bits
 * (cap 0 forces the tile-by-tile path that only S > 65536 keys reach at
 * d_k 64). GQA, causal from the bottom right, three key blocks, two
 * threads. */
static void backward_fast_head_cache_fallback_bits(void) {
    mha_config c = naive_config(24, 6, 2, 8, 8, 1);
    fixture f;
    naive_bw_case_make(&f, c, 2, 110, 200, 1, 0, 4242);
    f.opt.causal = 1, f.opt.align = MHA_ALIGN_BOTTOM_RIGHT;
    const int saved = mha_get_num_threads();
    mha_set_num_threads(2);
    grads kept, tiled;
    CHECK_OK(fx_backward(&f, &kept, MHA_PATH_FAST));
    mha_bwd_force_head_cache_cap(0);
    CHECK_OK(fx_backward(&f, &tiled, MHA_PATH_FAST));
    mha_bwd_force_head_cache_cap(-1);
    mha_set_num_threads(saved);
    double total = 0.0;
    for (int i = 0; i < G_N; i++) {
        if (!kept.t[i]) continue;
        if (memcmp(kept.t[i], tiled.t[i], kept.n[i] * sizeof(float)) != 0)
            test_report(__FILE__, __LINE__, "%s differs with the head cache off", grad_names[i]);
        for (size_t e = 0; e < kept.n[i]; e++) total += fabs(kept.t[i][e]);
    }
    CHECK(total > 1.0); /* real gradients, not zeros */
    grads_free(&kept), grads_free(&tiled);
    naive_bw_case_free(&f);
}

/* MHA_MASKED_ROW_NAN with a fully masked row: FAST refuses with
 * MHA_E_UNSUPPORTED and writes nothing; AUTO falls back to the reference,
 * whose NaN reaches dW_O. */
static void backward_fast_unsupported_fallback(void) {
    fixture f;
    naive_bw_case_make(&f, naive_config(8, 2, 0, 0, 0, 1), 1, 6, 6, 1, 0, 1313);
    uint8_t keep[36];
    for (int i = 0; i < 36; i++) keep[i] = (uint8_t)(i / 6 != 2); /* query 2 sees nothing */
    f.opt.keep_mask = (mha_mask){keep, 1, 1};
    f.opt.masked_row = MHA_MASKED_ROW_NAN;
    grads g, ref;
    CHECK_STATUS(fx_backward(&f, &g, MHA_PATH_FAST), MHA_E_UNSUPPORTED);
    CHECK_ERROR_MENTIONS("MHA_MASKED_ROW_NAN");
    CHECK(g.t[G_DWO][0] == 0.0f); /* untouched (zeroed by the allocation) */
    grads_free(&g);
    CHECK_OK(fx_backward(&f, &g, MHA_PATH_AUTO));
    CHECK_OK(fx_backward(&f, &ref, MHA_PATH_REFERENCE));
    CHECK(isnan(g.t[G_DWO][0]));
    for (int i = 0; i < G_N; i++)
        if (ref.t[i] && memcmp(ref.t[i], g.t[i], ref.n[i] * sizeof(float)) != 0)
            test_report(__FILE__, __LINE__, "AUTO's %s is not the reference's", grad_names[i]);
    grads_free(&g), grads_free(&ref);
    /* scores beyond MHA_FAST_SCORE_LIMIT: FAST refuses, AUTO is the reference */
    f.opt.masked_row = MHA_MASKED_ROW_ZERO, f.opt.keep_mask.data = NULL, f.opt.scale = 1e5f;
    CHECK_STATUS(fx_backward(&f, &g, MHA_PATH_FAST), MHA_E_UNSUPPORTED);
    CHECK_ERROR_MENTIONS("scores");
    grads_free(&g);
    f.opt.scale = 0.0f, f.opt.keep_mask.data = keep;
    /* the same request in zero mode is served by the fast backward */
    f.opt.masked_row = MHA_MASKED_ROW_ZERO;
    CHECK_OK(fx_backward(&f, &g, MHA_PATH_FAST));
    grads_free(&g);
    naive_bw_case_free(&f);
}

/* dy near FLT_MAX: the fast backward's fp32 intermediates overflow where
 * the double reference's do not. FAST and the tape refuse (MHA_E_NONFINITE
 * naming the gradient) instead of returning Inf/NaN with status OK; AUTO
 * recomputes with the reference and returns its bits. */
static void backward_fast_overflow_fallback(void) {
    fixture f;
    naive_bw_case_make(&f, naive_config(8, 2, 1, 0, 0, 1), 1, 6, 6, 0, 0, 1315);
    float big = 0.0f;
    for (int i = 0; i < 6 * 8; i++) big = fmaxf(big, fabsf(f.dy[i]));
    for (int i = 0; i < 6 * 8; i++) f.dy[i] *= 3e38f / big;
    grads g, ref;
    CHECK_STATUS(fx_backward(&f, &g, MHA_PATH_FAST), MHA_E_NONFINITE);
    CHECK_ERROR_MENTIONS("overflowed");
    grads_free(&g);
    CHECK_STATUS(fx_backward_tape(&f, &g), MHA_E_NONFINITE);
    CHECK_ERROR_MENTIONS("mha_backward_tape");
    grads_free(&g);
    CHECK_OK(fx_backward(&f, &g, MHA_PATH_AUTO));
    CHECK_OK(fx_backward(&f, &ref, MHA_PATH_REFERENCE));
    CHECK(isfinite(ref.t[G_DX][0])); /* the double reference still has a finite dx */
    for (int i = 0; i < G_N; i++)
        if (ref.t[i] && memcmp(ref.t[i], g.t[i], ref.n[i] * sizeof(float)) != 0)
            test_report(__FILE__, __LINE__, "AUTO's %s is not the reference's", grad_names[i]);
    grads_free(&g), grads_free(&ref);
    naive_bw_case_free(&f);
}

/* AUTO runs the fast backward: its results are FAST's bit for bit. */
static void backward_fast_is_auto(void) {
    fixture f;
    naive_bw_case_make(&f, naive_config(8, 2, 0, 0, 0, 1), 1, 9, 9, 0, 0, 1314);
    grads a, b;
    CHECK_OK(fx_backward(&f, &a, MHA_PATH_AUTO));
    CHECK_OK(fx_backward(&f, &b, MHA_PATH_FAST));
    for (int i = 0; i < G_N; i++)
        if (a.t[i] && memcmp(a.t[i], b.t[i], a.n[i] * sizeof(float)) != 0)
            test_report(__FILE__, __LINE__, "AUTO's %s is not FAST's", grad_names[i]);
    grads_free(&a), grads_free(&b);
    naive_bw_case_free(&f);
}

/* mha_backward takes its kernels from the one chooser (compute/exec.h):
 * under each MHA_KERNELS value the call records the prefill and backward
 * tables of that ISA, as the forward does (test_concurrency.c), and
 * "reference" runs the oracle under AUTO (its bits, no table asked). */
static void check_backward_kernels(const char *env, const mha_isa *want) {
    fixture f;
    naive_bw_case_make(&f, naive_config(8, 2, 0, 0, 0, 1), 1, 9, 9, 0, 0, 1315);
    if (env) setenv("MHA_KERNELS", env, 1);
    else unsetenv("MHA_KERNELS");
    mha_exec ex;
    CHECK_OK(mha_exec_resolve(&ex, NULL));
    mha_exec_trace tr = {0};
    ex.trace = &tr;
    grads g, ref;
    grads_alloc(&g, &f.w.cfg, f.B, f.T, f.S, 0, 0);
    mha_gradients view = grads_view(&g);
    if (f.L) CHECK_OK(mha_backward_exec(&ex, f.L, &view, f.dy, f.x, NULL, NULL, f.B, f.T, f.S, &f.opt));
    if (!want) {
        CHECK(tr.prefill == NULL && tr.backward == NULL);
        CHECK_OK(fx_backward(&f, &ref, MHA_PATH_REFERENCE));
        for (int i = 0; i < G_N; i++)
            if (ref.t[i] && memcmp(ref.t[i], g.t[i], ref.n[i] * sizeof(float)) != 0)
                test_report(__FILE__, __LINE__, "MHA_KERNELS=reference: %s is not the reference's", grad_names[i]);
        grads_free(&ref);
    } else if (tr.prefill != want->prefill || tr.backward != want->backward) {
        test_report(__FILE__, __LINE__, "MHA_KERNELS=%s: backward ran %s/%s; want %s", env ? env : "(unset)",
                    tr.prefill ? tr.prefill->name : "-", tr.backward ? tr.backward->name : "-", want->name);
    }
    if (want && f.L) { /* pass 2 alone (from a saved pass 1, as the tape runs it) asks the exec too */
        mha_exec quiet = ex;
        quiet.trace = NULL;
        mha_bwd_saved sv;
        CHECK_OK(mha_bwd_saved_make(&sv, &quiet, f.L, f.x, f.x, f.x, f.B, f.T, f.S, &f.opt, 0, "test"));
        mha_exec_trace pass2 = {0};
        ex.trace = &pass2;
        grads g2;
        grads_alloc(&g2, &f.w.cfg, f.B, f.T, f.S, 0, 0);
        mha_gradients view2 = grads_view(&g2);
        CHECK_OK(mha_bwd_from_saved(&ex, f.L, &view2, f.dy, &sv, f.x, f.x, f.x, &f.opt, 0));
        if (pass2.backward != want->backward)
            test_report(__FILE__, __LINE__, "MHA_KERNELS=%s: pass 2 ran backward table %s; want %s",
                        env ? env : "(unset)", pass2.backward ? pass2.backward->name : "-", want->name);
        grads_free(&g2);
        mha_bwd_saved_free(&sv);
    }
    grads_free(&g);
    naive_bw_case_free(&f);
}

static void backward_kernels_from_exec(void) {
    const char *old = getenv("MHA_KERNELS");
    char *saved = old ? strdup(old) : NULL;
    const mha_isa *isa;
    check_backward_kernels(NULL, mha_isa_best());
    check_backward_kernels("reference", NULL);
    const char *names[] = {"scalar", "avx2", "avx512"};
    for (int i = 0; i < 3; i++)
        if (mha_isa_by_name(&isa, names[i]) == MHA_OK) check_backward_kernels(names[i], isa);
        else mha_clear_error();
    /* an unknown value is refused by name, as by the forward */
    setenv("MHA_KERNELS", "avx3", 1);
    fixture f;
    naive_bw_case_make(&f, naive_config(8, 2, 0, 0, 0, 1), 1, 4, 4, 0, 0, 1316);
    grads g;
    CHECK_STATUS(fx_backward(&f, &g, MHA_PATH_AUTO), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("MHA_KERNELS=avx3");
    grads_free(&g);
    naive_bw_case_free(&f);
    if (saved) setenv("MHA_KERNELS", saved, 1);
    else unsetenv("MHA_KERNELS");
    free(saved);
}

/* --------------------------------------------------- transposed panels */

/* Every ISA's pack_panels (the K^T and V^T tiles of the attention
 * backward) writes each element of its panels, src's where a row exists
 * and 0 past the last row, for widths across and off the 16-column
 * register blocks and row counts across the 16-row panels. */
static void backward_pack_panels_exact(void) {
    const char *names[] = {"scalar", "avx2", "avx512"};
    const int ns[] = {1, 7, 16, 17, 40}, ds[] = {1, 5, 16, 24, 64, 70};
    uint64_t seed = 23;
    for (int ii = 0; ii < 3; ii++) {
        const mha_isa *isa;
        if (mha_isa_by_name(&isa, names[ii]) != MHA_OK || !isa->available()) {
            mha_clear_error();
            continue;
        }
        for (size_t a = 0; a < sizeof ns / sizeof ns[0]; a++)
            for (size_t c = 0; c < sizeof ds / sizeof ds[0]; c++) {
                const int n = ns[a], d = ds[c], panels = (n + 15) / 16;
                const size_t ld = (size_t)d + 3, total = (size_t)panels * 16 * d;
                float *src = malloc(sizeof(float) * (size_t)n * ld), *dst = malloc(sizeof(float) * total);
                test_fill_uniform(src, (size_t)n * ld, &seed, -1.0f, 1.0f);
                for (size_t t = 0; t < total; t++) dst[t] = 12345.0f; /* not written: caught below */
                isa->backward->pack_panels(dst, src, ld, n, d);
                int bad = 0;
                for (int i = 0; i < panels * 16 && !bad; i++)
                    for (int e = 0; e < d && !bad; e++) {
                        const float want = i < n ? src[(size_t)i * ld + e] : 0.0f;
                        const float got = dst[(size_t)(i / 16) * 16 * d + (size_t)e * 16 + i % 16];
                        if (memcmp(&want, &got, sizeof want))
                            bad = 1, test_report(__FILE__, __LINE__, "%s pack_panels n=%d d=%d: (%d, %d) is %g; "
                                                 "want %g", isa->name, n, d, i, e, (double)got, (double)want);
                    }
                free(src), free(dst);
            }
    }
}

/* ------------------------------------------------------------- memory */

/* B=1, T, d_model=768, h=12, causal: forward then backward (fast path),
 * stateless (mha_forward, mha_backward) or with a tape (mha_forward_train,
 * mha_backward_tape: the tape's Q, K, V, Z live through the backward,
 * which adds dZ, dQ, dK, dV); peak RSS below twice the tensors that must
 * exist: x, Q, K, V, Z, Y, dY, dX and the weights and their gradients. T from MHA_TEST_MEMORY_T
 * (16384 in `make test-memory`), else 1024 (then the growth over the RSS
 * the suite already holds is checked). Skipped under
 * AddressSanitizer, whose shadow memory and quarantine are not the
 * library's. */
static void memory_peak(int with_tape) {
#if TEST_SANITIZED
    if (1) return;
#endif
    const char *env = getenv("MHA_TEST_MEMORY_T");
    const int T = env ? atoi(env) : 1024, D = 768;
    test_reset_peak_rss();
    /* the small default runs inside the whole suite, whose earlier tests
     * leave memory resident: it checks the growth; the full size (alone in
     * `make test-memory`) checks the whole peak */
    const double base = env ? 0.0 : test_peak_rss_bytes();
    mha_layer *L = NULL;
    mha_config c = mha_config_default(D, 12);
    CHECK_OK(mha_layer_create(&L, &c, NULL)); /* zero weights: RSS, not values, is measured */
    if (!L) return;
    const size_t act = (size_t)T * D * sizeof(float), wts = (size_t)4 * D * D * sizeof(float) + 4 * D * sizeof(float);
    float *x = malloc(act), *y = malloc(act), *dy = malloc(act), *dx = malloc(act);
    float *gw = malloc(wts); /* dW_Q dW_K dW_V dW_O db_Q db_K db_V db_O */
    uint64_t seed = 19;
    test_fill_uniform(x, (size_t)T * D, &seed, -1.0f, 1.0f);
    test_fill_uniform(dy, (size_t)T * D, &seed, -1.0f, 1.0f);
    memset(y, 0, act), memset(dx, 0, act), memset(gw, 0, wts);
    mha_options o = mha_options_default();
    o.causal = 1;
    o.path = MHA_PATH_FAST;
    const size_t dd = (size_t)D * D;
    mha_gradients g = {dx, NULL, NULL, gw, gw + dd, gw + 2 * dd, gw + 3 * dd,
                       gw + 4 * dd, gw + 4 * dd + D, gw + 4 * dd + 2 * D, gw + 4 * dd + 3 * D,
                       NULL, NULL, NULL, NULL, NULL, NULL, NULL};
    if (with_tape) {
        mha_tape *tape = NULL;
        CHECK_OK(mha_forward_train(L, y, &tape, x, NULL, NULL, 1, T, T, &o));
        CHECK_OK(mha_backward_tape(L, tape, &g, dy, x, NULL, NULL, 1, T, T, &o));
        mha_tape_free(tape);
    } else {
        CHECK_OK(mha_forward(L, y, NULL, x, NULL, 1, T, T, &o));
        CHECK_OK(mha_backward(L, &g, dy, x, NULL, 1, T, T, &o));
    }
    const double peak = test_peak_rss_bytes() - base, need = 8.0 * act + 2.0 * wts; /* x Q K V Z Y dY dX, W, dW */
    if (env)
        printf("RESULT kind=memory_backward%s T=%d peak_mib=%.1f need_mib=%.1f ratio=%.3f\n", with_tape ? "_tape" : "", T,
               peak / 1048576.0, need / 1048576.0, peak / need);
    CHECK(peak < 2.0 * need);
    free(x), free(y), free(dy), free(dx), free(gw);
    mha_layer_free(L);
}

static void backward_memory_peak(void) { memory_peak(0); }
static void tape_memory_peak(void) { memory_peak(1); }

/* Run once per ISA (test_main.c's per_isa_areas): fast vs reference for
 * every option, and 1 vs 2 threads. */
static const test_case isa_cases[] = {
    {"backward_fast_options", backward_fast_options},
    {"backward_fast_threads_bit_identical", backward_fast_threads_bit_identical},
    {"backward_fast_head_cache_fallback_bits", backward_fast_head_cache_fallback_bits},
    {"backward_fast_large_scores", backward_fast_large_scores},
};

const test_case *tests_backward_fast_isa(size_t *count) {
    *count = sizeof isa_cases / sizeof isa_cases[0];
    return isa_cases;
}

static const test_case cases[] = {
    {"backward_fast_rule_detects_error", backward_fast_rule_detects_error},
    {"backward_kernels_from_exec", backward_kernels_from_exec},
    {"backward_pack_panels_exact", backward_pack_panels_exact},
    {"backward_fast_unsupported_fallback", backward_fast_unsupported_fallback},
    {"backward_fast_is_auto", backward_fast_is_auto},
    {"backward_fast_overflow_fallback", backward_fast_overflow_fallback},
    {"backward_memory_peak", backward_memory_peak},
    {"tape_memory_peak", tape_memory_peak},
};

const test_case *tests_backward_fast(size_t *count) {
    *count = sizeof cases / sizeof cases[0];
    return cases;
}
