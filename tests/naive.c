/* naive.c — the tests' independent oracle (see naive.h). Each step is the
 * formula from mha.h written as plain loops over doubles.
 * Legend: B batch, T queries, S keys, h heads, h_kv kv heads, d_k, d_v,
 * d_model, d_kv_in (key source width), d_v_in (value source width). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "naive.h"
#include "test_util.h"

mha_config naive_resolve(mha_config c) {
    if (c.n_kv_heads == 0) c.n_kv_heads = c.n_heads;
    if (c.d_k == 0 && c.n_heads > 0) c.d_k = c.d_model / c.n_heads;
    if (c.d_v == 0) c.d_v = c.d_k;
    if (c.d_kv_in == 0) c.d_kv_in = c.d_model;
    if (c.d_v_in == 0) c.d_v_in = c.d_kv_in;
    return c;
}

float *naive_alloc_floats(size_t n) {
    float *p = calloc(n ? n : 1, sizeof *p);
    if (!p) abort();
    return p;
}

double *naive_alloc_doubles(size_t n) {
    double *p = calloc(n ? n : 1, sizeof *p);
    if (!p) abort();
    return p;
}

float *naive_random_floats(size_t n, uint64_t *seed, float lo, float hi) {
    float *p = naive_alloc_floats(n);
    test_fill_uniform(p, n, seed, lo, hi);
    return p;
}

double naive_max_diff(const float *a, const double *b, size_t n) {
    double m = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (d != d) return INFINITY;
        if (d > m) m = d;
    }
    return m;
}

float naive_round_f16(float x) {
    if (!isfinite(x)) return x;
    double a = fabs((double)x);
    if (a >= 65520.0) return copysignf(INFINITY, x); /* past 65504 + half an ulp */
    int e;
    frexp(a, &e);         /* a in [2^(e-1), 2^e): 11 significant bits, ulp 2^(e-11) */
    int q = e - 11 < -24 ? -24 : e - 11; /* subnormal halves: ulp 2^-24 */
    double r = nearbyint(ldexp(a, -q));  /* ties to even in the default rounding mode */
    return (float)copysign(ldexp(r, q), (double)x);
}

float naive_round_bf16(float x) {
    if (x == 0.0f) return x;
    int e;
    const double m = frexp((double)x, &e); /* x = m 2^e, 0.5 <= |m| < 1 */
    return (float)ldexp(nearbyint(ldexp(m, 8)), e - 8);
}

void naive_round_int8(float *w, int K, int N, int seg) {
    for (int s0 = 0; s0 < K; s0 += seg)
        for (int g0 = s0; g0 < s0 + seg; g0 += 32) {
            const int g1 = g0 + 32 < s0 + seg ? g0 + 32 : s0 + seg;
            for (int j = 0; j < N; j++) {
                float amax = 0.0f;
                for (int k = g0; k < g1; k++) amax = fmaxf(amax, fabsf(w[(size_t)k * N + j]));
                const float s = amax / 127.0f;
                for (int k = g0; k < g1; k++) {
                    const double r = s == 0.0f ? 0.0 : (double)(w[(size_t)k * N + j] / s);
                    double q = r < 0 ? -floor(-r + 0.5) : floor(r + 0.5);
                    q = q > 127 ? 127 : q < -127 ? -127 : q;
                    w[(size_t)k * N + j] = (float)(int)q * s;
                }
            }
        }
}

enum { N_WEIGHTS = 15 };

/* Sizes of the fifteen tensors, in naive_weights order. */
static void weight_sizes(const mha_config *c, size_t n[N_WEIGHTS]) {
    size_t h = (size_t)c->n_heads, hk = (size_t)c->n_kv_heads;
    n[0] = (size_t)c->d_model * h * c->d_k;
    n[1] = (size_t)c->d_kv_in * hk * c->d_k;
    n[2] = (size_t)c->d_v_in * hk * c->d_v;
    n[3] = h * c->d_v * c->d_model;
    n[4] = c->bias ? h * c->d_k : 0;
    n[5] = c->bias ? hk * c->d_k : 0;
    n[6] = c->bias ? hk * c->d_v : 0;
    n[7] = c->bias ? (size_t)c->d_model : 0;
    n[8] = c->add_bias_kv ? hk * c->d_k : 0;
    n[9] = c->add_bias_kv ? hk * c->d_v : 0;
    n[10] = c->sinks ? h : 0;
    n[11] = c->qk_norm == MHA_QK_NORM_NONE ? 0 : (c->qk_norm_per_head ? h : 1) * c->d_k;
    n[12] = c->qk_norm == MHA_QK_NORM_NONE ? 0 : (c->qk_norm_per_head ? hk : 1) * c->d_k;
    n[13] = c->output_gate ? (size_t)c->d_model * h * c->d_v : 0;
    n[14] = c->output_gate && c->bias ? h * c->d_v : 0;
}

static float **weight_slot(naive_weights *w, int i) {
    float **slots[N_WEIGHTS] = {&w->w_q, &w->w_k, &w->w_v, &w->w_o, &w->b_q, &w->b_k,
                                &w->b_v, &w->b_o, &w->bias_k, &w->bias_v, &w->sinks,
                                &w->q_norm, &w->k_norm, &w->w_g, &w->b_g};
    return slots[i];
}

void naive_weights_zero(naive_weights *w, const mha_config *resolved) {
    size_t n[N_WEIGHTS];
    memset(w, 0, sizeof *w);
    w->cfg = *resolved;
    weight_sizes(resolved, n);
    for (int i = 0; i < N_WEIGHTS; i++) *weight_slot(w, i) = n[i] ? naive_alloc_floats(n[i]) : NULL;
}

void naive_weights_random(naive_weights *w, const mha_config *resolved, uint64_t *seed,
                          float amp) {
    size_t n[N_WEIGHTS];
    naive_weights_zero(w, resolved);
    weight_sizes(resolved, n);
    for (int i = 0; i < N_WEIGHTS; i++)
        if (n[i]) test_fill_uniform(*weight_slot(w, i), n[i], seed, -amp, amp);
}

void naive_weights_free(naive_weights *w) {
    for (int i = 0; i < N_WEIGHTS; i++) {
        free(*weight_slot(w, i));
        *weight_slot(w, i) = NULL;
    }
}

mha_weights naive_weights_view(const naive_weights *w) {
    mha_weights v = {w->w_q, w->w_k, w->w_v, w->w_o, w->b_q,
                     w->b_k, w->b_v, w->b_o, w->bias_k, w->bias_v, NULL, w->sinks, w->q_norm, w->k_norm,
                     w->w_g, w->b_g};
    return v;
}

mha_layer *naive_make_layer(const naive_weights *w) {
    mha_layer *L = NULL;
    mha_weights v = naive_weights_view(w);
    CHECK_OK(mha_layer_create(&L, &w->cfg, &v));
    return L;
}

/* ------------------------------------------------------------------ masks */

/* Straight from the mha_options comments (see naive.h). */
int naive_key_allowed(const mha_options *o, int b, int r, int i, int j, int T, int S,
                      double *add) {
    long ai = o->align == MHA_ALIGN_BOTTOM_RIGHT ? (long)i + S - T : (long)i;
    *add = 0.0;
    if (o->causal && j > ai) return 0;
    if (o->window_left >= 0 && j < ai - o->window_left) return 0;
    if (o->window_right >= 0 && j > ai + o->window_right) return 0;
    if (o->keep_mask.data) {
        const uint8_t *m = o->keep_mask.data;
        int bb = o->keep_mask.batch == 1 ? 0 : b, rr = o->keep_mask.heads == 1 ? 0 : r;
        if (!m[(((size_t)bb * o->keep_mask.heads + rr) * T + i) * S + j]) return 0;
    }
    if (o->key_keep && !o->key_keep[(size_t)b * S + j]) return 0;
    if (o->additive_mask.data) {
        const float *m = o->additive_mask.data;
        int bb = o->additive_mask.batch == 1 ? 0 : b;
        int rr = o->additive_mask.heads == 1 ? 0 : r;
        *add += m[(((size_t)bb * o->additive_mask.heads + rr) * T + i) * S + j];
    }
    if (o->key_additive) *add += o->key_additive[(size_t)b * S + j];
    return !(isinf(*add) && *add < 0);
}

void naive_intervene(double *z, const mha_intervention *iv, int r, int h, int rows, int dv) {
    for (int e = 0; e < dv; e++) {
        double mean = 0.0;
        for (int t = 0; t < rows; t++) mean += z[(size_t)t * h * dv + (size_t)r * dv + e];
        mean /= (double)rows;
        for (int t = 0; t < rows; t++) {
            double *ze = z + (size_t)t * h * dv + (size_t)r * dv + e;
            if (iv->op == MHA_HEAD_ZERO) *ze = 0.0;
            if (iv->op == MHA_HEAD_SCALE) *ze *= (double)iv->scale;
            if (iv->op == MHA_HEAD_MEAN) *ze = mean;
            if (iv->op == MHA_HEAD_REPLACE) *ze = iv->value[(size_t)t * dv + e];
        }
    }
}

/* ---------------------------------------------------------------- forward */

/* out (rows, n) = in (rows, k) w (k, n) + b (n, may be NULL), in double. */
static void naive_linear(double *out, const float *in, const float *w, const float *b,
                         int rows, int k, int n) {
    for (int t = 0; t < rows; t++)
        for (int c = 0; c < n; c++) {
            double s = b ? (double)b[c] : 0.0;
            for (int i = 0; i < k; i++)
                s += (double)in[(size_t)t * k + i] * (double)w[(size_t)i * n + c];
            out[(size_t)t * n + c] = s;
        }
}

void naive_forward(double *y, double *z_out, double *probs, const naive_weights *w,
                   const float *x, const float *kv, int B, int T, int S,
                   const mha_options *opt) {
    naive_forward_kv(y, z_out, probs, w, x, kv, kv, B, T, S, opt);
}

void naive_forward_kv(double *y, double *z_out, double *probs, const naive_weights *w,
                      const float *x, const float *k_src, const float *v_src, int B, int T,
                      int S, const mha_options *opt) {
    const mha_config *c = &w->cfg;
    int h = c->n_heads, hk = c->n_kv_heads, dk = c->d_k, dv = c->d_v, dm = c->d_model;
    int extra = c->add_bias_kv + c->add_zero_attn, St = S + extra;
    mha_options o;
    if (opt) {
        o = *opt;
    } else {
        memset(&o, 0, sizeof o);
        o.window_left = o.window_right = -1;
    }
    double scale = o.scale != 0.0f ? (double)o.scale : 1.0 / sqrt((double)dk);
    /* K reads (B,S,kin) and V reads (B,S,vin); a missing source is the one before it */
    const float *ksrc = k_src ? k_src : x, *vsrc = v_src ? v_src : ksrc;
    int kin = k_src ? c->d_kv_in : dm, vin = v_src ? c->d_v_in : kin;

    double *q = naive_alloc_doubles((size_t)B * T * h * dk);    /* (B,T,h*d_k) */
    double *k = naive_alloc_doubles((size_t)B * St * hk * dk);  /* (B,S_total,h_kv*d_k) */
    double *v = naive_alloc_doubles((size_t)B * St * hk * dv);  /* (B,S_total,h_kv*d_v) */
    double *z = naive_alloc_doubles((size_t)B * T * h * dv);    /* (B,T,h*d_v) */
    double *kp = naive_alloc_doubles((size_t)S * hk * dk);
    double *vp = naive_alloc_doubles((size_t)S * hk * dv);
    double *p = naive_alloc_doubles((size_t)St);

    /* --- projections; extra rows: bias_k/bias_v as given, then zeros */
    for (int b = 0; b < B; b++) {
        naive_linear(q + (size_t)b * T * h * dk, x + (size_t)b * T * dm, w->w_q, w->b_q, T,
                     dm, h * dk);
        naive_linear(kp, ksrc + (size_t)b * S * kin, w->w_k, w->b_k, S, kin, hk * dk);
        naive_linear(vp, vsrc + (size_t)b * S * vin, w->w_v, w->b_v, S, vin, hk * dv);
        for (int j = 0; j < St; j++) {
            double *kr = k + ((size_t)b * St + j) * hk * dk;
            double *vr = v + ((size_t)b * St + j) * hk * dv;
            for (int e = 0; e < hk * dk; e++)
                kr[e] = j < S ? kp[(size_t)j * hk * dk + e]
                        : (c->add_bias_kv && j == S) ? (double)w->bias_k[e] : 0.0;
            for (int e = 0; e < hk * dv; e++)
                vr[e] = j < S ? vp[(size_t)j * hk * dv + e]
                        : (c->add_bias_kv && j == S) ? (double)w->bias_v[e] : 0.0;
        }
    }

    /* --- attention per head; g = r / (h / h_kv) */
    for (int b = 0; b < B; b++)
        for (int r = 0; r < h; r++) {
            int g = r / (h / hk);
            for (int i = 0; i < T; i++) {
                const double *qi = q + ((size_t)b * T + i) * h * dk + (size_t)r * dk;
                double mx = -INFINITY;
                int any = 0;
                for (int j = 0; j < St; j++) {
                    double add = 0.0;
                    int ok = j >= S ? 1 : naive_key_allowed(&o, b, r, i, j, T, S, &add);
                    if (!ok) {
                        p[j] = -INFINITY;
                        continue;
                    }
                    const double *kj = k + ((size_t)b * St + j) * hk * dk + (size_t)g * dk;
                    double s = 0.0;
                    for (int e = 0; e < dk; e++) s += qi[e] * kj[e];
                    p[j] = scale * s + add;
                    if (p[j] > mx) mx = p[j];
                    any = 1;
                }
                double sum = 0.0;
                for (int j = 0; j < St; j++) {
                    p[j] = any && p[j] != -INFINITY ? exp(p[j] - mx) : 0.0;
                    sum += p[j];
                }
                double fill = o.masked_row == MHA_MASKED_ROW_NAN ? NAN : 0.0;
                for (int j = 0; j < St; j++) p[j] = any ? p[j] / sum : fill;
                if (probs)
                    memcpy(probs + (((size_t)b * h + r) * T + i) * St, p, (size_t)St * sizeof *p);
                double *zi = z + ((size_t)b * T + i) * h * dv + (size_t)r * dv;
                for (int e = 0; e < dv; e++) {
                    double s = any ? 0.0 : fill;
                    for (int j = 0; any && j < St; j++)
                        s += p[j] * v[((size_t)b * St + j) * hk * dv + (size_t)g * dv + e];
                    zi[e] = s;
                }
            }
        }

    /* --- the output gate (gated attention): Z *= sigmoid(x W_G + b_G) */
    if (w->w_g) {
        double *g = naive_alloc_doubles((size_t)B * T * h * dv); /* (B,T,h*d_v) */
        naive_linear(g, x, w->w_g, w->b_g, B * T, dm, h * dv);
        for (size_t i = 0; i < (size_t)B * T * h * dv; i++) z[i] *= 1.0 / (1.0 + exp(-g[i]));
        free(g);
    }

    /* --- interventions on Z^(r) before concatenation */
    for (int r = 0; o.interventions && r < h; r++) naive_intervene(z, &o.interventions[r], r, h, B * T, dv);

    /* --- Y = Z W_O + b_O */
    for (int t = 0; t < B * T; t++)
        for (int o2 = 0; o2 < dm; o2++) {
            double s = w->b_o ? (double)w->b_o[o2] : 0.0;
            for (int e = 0; e < h * dv; e++)
                s += z[(size_t)t * h * dv + e] * (double)w->w_o[(size_t)e * dm + o2];
            y[(size_t)t * dm + o2] = s;
        }
    if (z_out) memcpy(z_out, z, (size_t)B * T * h * dv * sizeof *z);
    free(q), free(k), free(v), free(z), free(kp), free(vp), free(p);
}

/* ---------------------------------------------------------- comparison */

static double diff_nan_equal(const float *a, const double *b, size_t n) {
    double m = 0.0;
    for (size_t i = 0; i < n; i++) {
        int an = isnan(a[i]), bn = isnan(b[i]);
        if (an && bn) continue;
        if (an || bn) return INFINITY;
        double d = fabs((double)a[i] - b[i]);
        if (d > m) m = d;
    }
    return m;
}

double naive_compare(const mha_layer *L, const naive_weights *w, const float *x,
                     const float *kv, int B, int T, int S, const mha_options *opt) {
    return naive_compare_kv(L, w, x, kv, kv, B, T, S, opt);
}

double naive_compare_kv(const mha_layer *L, const naive_weights *w, const float *x,
                        const float *k_src, const float *v_src, int B, int T, int S,
                        const mha_options *opt) {
    const mha_config *c = &w->cfg;
    size_t ny = (size_t)B * T * c->d_model, nz = (size_t)B * T * c->n_heads * c->d_v;
    size_t np = (size_t)B * c->n_heads * T * (S + c->add_bias_kv + c->add_zero_attn);
    float *y = naive_alloc_floats(ny), *z = naive_alloc_floats(nz), *p = naive_alloc_floats(np);
    double *yd = naive_alloc_doubles(ny), *zd = naive_alloc_doubles(nz);
    double *pd = naive_alloc_doubles(np);
    mha_capture cap = {z, NULL, p};
    double m = INFINITY;
    mha_status st = mha_forward_kv(L, y, &cap, x, k_src, v_src, B, T, S, opt);
    CHECK_OK(st);
    if (st == MHA_OK) {
        naive_forward_kv(yd, zd, pd, w, x, k_src, v_src, B, T, S, opt);
        double dy = diff_nan_equal(y, yd, ny), dz = diff_nan_equal(z, zd, nz);
        double dp = diff_nan_equal(p, pd, np);
        m = dy > dz ? dy : dz;
        if (dp > m) m = dp;
    }
    free(y), free(z), free(p), free(yd), free(zd), free(pd);
    return m;
}

mha_config naive_config(int d_model, int h, int h_kv, int d_k, int d_v, int bias) {
    mha_config c = mha_config_default(d_model, h);
    c.n_kv_heads = h_kv, c.d_k = d_k, c.d_v = d_v, c.bias = bias;
    return c;
}

mha_options naive_ref_options(void) {
    mha_options o = mha_options_default();
    o.path = MHA_PATH_REFERENCE;
    return o;
}

void naive_bw_case_make(naive_bw_case *f, mha_config c, int B, int T, int S, int k_given, int v_given,
                        uint64_t seed) {
    memset(f, 0, sizeof *f);
    c = naive_resolve(c);
    naive_weights_random(&f->w, &c, &seed, 0.5f);
    f->B = B, f->T = T, f->S = S;
    f->x = naive_random_floats((size_t)B * T * c.d_model, &seed, -1.0f, 1.0f);
    if (k_given) f->k_src = naive_random_floats((size_t)B * S * c.d_kv_in, &seed, -1.0f, 1.0f);
    if (v_given) f->v_src = naive_random_floats((size_t)B * S * c.d_v_in, &seed, -1.0f, 1.0f);
    f->dy = naive_random_floats((size_t)B * T * c.d_model, &seed, -1.0f, 1.0f);
    f->y = naive_alloc_floats((size_t)B * T * c.d_model);
    f->L = naive_make_layer(&f->w);
    f->opt = mha_options_default();
}

void naive_bw_case_free(naive_bw_case *f) {
    mha_layer_free(f->L);
    naive_weights_free(&f->w);
    free(f->x), free(f->k_src), free(f->v_src), free(f->dy), free(f->y);
}

/* The cache's attention as a reference (naive.h). */
void naive_cache_attend(double *z, double *probs, const float *q, const float *k, const float *v, int B, int T,
                        int S, int p0, int h, int hk, int dk, int dv, int left, int dbl) {
    double *s = naive_alloc_doubles((size_t)S);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int r = 0; r < h; r++) {
                int g = r / (h / hk), p = p0 + t, j0 = left >= 0 && p - left > 0 ? p - left : 0;
                const float *qr = q + ((size_t)b * T + t) * h * dk + (size_t)r * dk;
                double mx = -INFINITY, sum = 0.0;
                for (int j = j0; j <= p; j++) {
                    const float *kj = k + ((size_t)b * S + j) * hk * dk + (size_t)g * dk;
                    double acc = 0.0;
                    float acc32 = 0.0f;
                    for (int e = 0; e < dk; e++) acc += (double)qr[e] * kj[e], acc32 += qr[e] * kj[e];
                    s[j] = dbl ? acc / sqrt((double)dk) : (double)(acc32 / sqrtf((float)dk));
                    mx = fmax(mx, s[j]);
                }
                for (int j = j0; j <= p; j++) {
                    s[j] = dbl ? exp(s[j] - mx) : (double)expf((float)(s[j] - mx));
                    sum += s[j];
                }
                double *zr = z + ((size_t)b * T + t) * h * dv + (size_t)r * dv;
                for (int e = 0; e < dv; e++) {
                    double acc = 0.0;
                    float acc32 = 0.0f;
                    for (int j = j0; j <= p; j++) {
                        float vj = v[((size_t)b * S + j) * hk * dv + (size_t)g * dv + e];
                        acc += s[j] * vj, acc32 += (float)s[j] * vj;
                    }
                    zr[e] = dbl ? acc / sum : (double)(acc32 / (float)sum);
                }
                if (probs)
                    for (int j = 0; j < S; j++)
                        probs[(((size_t)b * h + r) * T + t) * S + j] = j >= j0 && j <= p ? s[j] / sum : 0.0;
            }
    free(s);
}
