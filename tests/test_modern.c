/* test_modern.c — today's attention variants (RoPE, ALiBi, soft-capping,
 * sinks, QK-norm): hand-derived numbers, an independent oracle written the
 * way the model families publish them (HF rotate_half / GPT-J
 * rotate_every_two, BLOOM's slope rule and bias slope * key position,
 * Gemma 2's soft-cap, gpt-oss's sink column), the reference against it and
 * the fast path against the reference on every ISA (tolerance rule).
 * Legend: B, T, h, h_kv, d_k, d_model (see mha.h); r rotated dims. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "compute/exec.h"
#include "core/variants.h"
#include "naive.h"
#include "test_util.h"
#include "tests.h"

/* ------------------------------------------------------ the oracle */

typedef struct {
    mha_config c;    /* resolved by hand (every default filled)             */
    float *wq, *wk, *wv, *wo; /* (D,h*d_k) (D,h_kv*d_k) (D,h_kv*d_v) (h*d_v,D) */
    float *slopes, *sinks;    /* (h)                                        */
    float *qn, *kn;           /* (h*d_k or d_k), (h_kv*d_k or d_k)           */
} modern_case;

/* rounds to fp32 when the oracle plays the naive fp32 computation */
static double rnd(int fp32, double v) { return fp32 ? (double)(float)v : v; }

/* 1 / theta^(2i/r), then the scaling as checkpoints' configs describe it */
static double oracle_freq(const mha_rope *rp, int i) {
    double f = 1.0 / pow(rp->theta, (2.0 * i) / rp->dim);
    if (rp->scaling == MHA_ROPE_SCALE_LINEAR) return f / rp->factor;
    if (rp->scaling == MHA_ROPE_SCALE_LLAMA3) {
        double wavelen = 2 * M_PI / f, L = rp->original_max_positions;
        if (wavelen < L / rp->high_freq_factor) return f;
        if (wavelen > L / rp->low_freq_factor) return f / rp->factor;
        double sm = (L / wavelen - rp->low_freq_factor) / (rp->high_freq_factor - rp->low_freq_factor);
        return (1 - sm) * f / rp->factor + sm * f;
    }
    return f;
}

/* q_embed = q cos + rotate(q) sin over the first r dims, HF style:
 * halves: cos = cat(freqs, freqs), rotate_half(x) = cat(-x2, x1);
 * interleaved: cos repeated per pair, rotate_every_two(x) = (-x1, x0, ...) */
static void oracle_rope(double *x, const mha_rope *rp, int pos) {
    const int r = rp->dim, half = r / 2;
    double out[r], rot[r], cs[r], sn[r];
    for (int e = 0; e < r; e++) {
        int i = rp->pairing == MHA_ROPE_HALVES ? e % half : e / 2;
        cs[e] = cos(pos * oracle_freq(rp, i));
        sn[e] = sin(pos * oracle_freq(rp, i));
        if (rp->pairing == MHA_ROPE_HALVES) rot[e] = e < half ? -x[e + half] : x[e - half];
        else rot[e] = e % 2 == 0 ? -x[e + 1] : x[e - 1];
    }
    for (int e = 0; e < r; e++) out[e] = x[e] * cs[e] + rot[e] * sn[e];
    memcpy(x, out, sizeof out);
}

static void oracle_norm(double *x, int d, const float *w, mha_qk_norm kind, double eps) {
    double mu = 0, ms = 0;
    for (int e = 0; kind == MHA_QK_NORM_LAYER && e < d; e++) mu += x[e] / d;
    for (int e = 0; e < d; e++) ms += (x[e] - mu) * (x[e] - mu) / d;
    for (int e = 0; e < d; e++) x[e] = (x[e] - mu) / sqrt(ms + eps) * w[e];
}

/* The rows (heads, d) of one token as a KV cache of type kv stores them
 * (docs/CACHE.md): fp16 rounded to nearest even (naive_round_f16); int8
 * per block of 32 along d, scale = max|x| / 127 in float, q = x / scale
 * rounded half away from zero, read back as q * scale. */
static void store_kv(double *rows, int heads, int d, mha_cache_dtype kv) {
    for (int r = 0; r < heads && kv != MHA_CACHE_F32; r++)
        for (int b0 = 0; b0 < d; b0 += 32) {
            double *x = rows + (size_t)r * d;
            const int b1 = b0 + 32 < d ? b0 + 32 : d;
            float amax = 0;
            for (int e = b0; e < b1; e++) amax = fmaxf(amax, fabsf((float)x[e]));
            const float sc = amax / 127.0f;
            for (int e = b0; e < b1; e++)
                x[e] = kv == MHA_CACHE_F16 ? naive_round_f16((float)x[e])
                       : sc > 0 ? (double)((float)round((float)x[e] / sc) * sc) : 0.0;
        }
}

/* y (B,T,D) of causal self-attention at positions pos (B,T) (NULL: t).
 * ALiBi as the paper writes it for causal attention: -slope (p_i - p_j)
 * (BLOOM's + slope p_j differs by a constant per row: the same softmax
 * without sinks; tests/python/test_modern.py checks that form). */
static void oracle(double *y, const modern_case *m, const float *x, int B, int T, const int *pos,
                   int causal, int fp32, mha_cache_dtype kv) {
    const mha_config *c = &m->c;
    const int h = c->n_heads, hk = c->n_kv_heads, dk = c->d_k, dv = c->d_v, D = c->d_model;
    double *q = calloc((size_t)B * T * h * dk, sizeof *q), *k = calloc((size_t)B * T * hk * dk, sizeof *k);
    double *v = calloc((size_t)B * T * hk * dv, sizeof *v), *z = calloc((size_t)B * T * h * dv, sizeof *z);
    for (int bt = 0; bt < B * T; bt++) {
        const float *xr = x + (size_t)bt * D;
        for (int o = 0; o < h * dk; o++) {
            double a = 0; for (int i = 0; i < D; i++) a += (double)xr[i] * m->wq[(size_t)i * h * dk + o];
            q[(size_t)bt * h * dk + o] = rnd(fp32, a);
        }
        for (int o = 0; o < hk * dk; o++) {
            double a = 0; for (int i = 0; i < D; i++) a += (double)xr[i] * m->wk[(size_t)i * hk * dk + o];
            k[(size_t)bt * hk * dk + o] = rnd(fp32, a);
        }
        for (int o = 0; o < hk * dv; o++) {
            double a = 0; for (int i = 0; i < D; i++) a += (double)xr[i] * m->wv[(size_t)i * hk * dv + o];
            v[(size_t)bt * hk * dv + o] = rnd(fp32, a);
        }
        const int p = pos ? pos[bt] : bt % T;
        if (c->clip_qkv > 0) { /* OLMo 1, DBRX, MPT: q, k, v = .clamp(min=-clip_qkv, max=clip_qkv) */
            double *rows[3] = {q + (size_t)bt * h * dk, k + (size_t)bt * hk * dk, v + (size_t)bt * hk * dv};
            const int width[3] = {h * dk, hk * dk, hk * dv};
            for (int a = 0; a < 3; a++)
                for (int e = 0; e < width[a]; e++) rows[a][e] = fmin(fmax(rows[a][e], -c->clip_qkv), c->clip_qkv);
        }
        if (c->qk_norm_whole) { /* OLMo 2: RMSNorm of the token's whole q (h*d_k) and k (h_kv*d_k) */
            oracle_norm(q + (size_t)bt * h * dk, h * dk, m->qn, c->qk_norm, c->qk_norm_eps);
            oracle_norm(k + (size_t)bt * hk * dk, hk * dk, m->kn, c->qk_norm, c->qk_norm_eps);
        }
        for (int r = 0; r < h + hk; r++) {
            double *row = r < h ? q + ((size_t)bt * h + r) * dk : k + ((size_t)bt * hk + r - h) * dk;
            const float *w = r < h ? m->qn : m->kn;
            if (c->qk_norm && !c->qk_norm_whole) oracle_norm(row, dk, w + (c->qk_norm_per_head ? (size_t)(r < h ? r : r - h) * dk : 0), c->qk_norm, c->qk_norm_eps);
            if (c->rope.pairing) oracle_rope(row, &c->rope, p);
            for (int e = 0; fp32 && e < dk; e++) row[e] = rnd(1, row[e]);
        }
        store_kv(k + (size_t)bt * hk * dk, hk, dk, kv); /* K stored rotated */
        store_kv(v + (size_t)bt * hk * dv, hk, dv, kv);
    }
    const double scale = 1.0 / sqrt((double)dk);
    double *lg = malloc(sizeof(double) * (T + 1));
    for (int b = 0; b < B; b++)
        for (int r = 0; r < h; r++)
            for (int i = 0; i < T; i++) {
                const int g = r / (h / hk), n = causal ? i + 1 : T;
                for (int j = 0; j < n; j++) {
                    double s = 0;
                    for (int e = 0; e < dk; e++) s += q[(((size_t)b * T + i) * h + r) * dk + e] * k[(((size_t)b * T + j) * hk + g) * dk + e];
                    s *= scale;
                    if (c->softcap > 0) s = c->softcap * tanh(s / c->softcap); /* Gemma 2 */
                    if (c->alibi) s -= m->slopes[r] * ((pos ? pos[b * T + i] : i) - (pos ? pos[b * T + j] : j));
                    lg[j] = rnd(fp32, s);
                }
                lg[n] = c->sinks ? m->sinks[r] : -INFINITY; /* gpt-oss: the sink column */
                double mx = -INFINITY, sum = 0;
                for (int j = 0; j <= n; j++) mx = fmax(mx, lg[j]);
                for (int j = 0; j <= n; j++) sum += exp(lg[j] - mx);
                for (int j = 0; j < n; j++)
                    for (int e = 0; e < dv; e++)
                        z[(((size_t)b * T + i) * h + r) * dv + e] += rnd(fp32, exp(lg[j] - mx) / sum) * v[(((size_t)b * T + j) * hk + g) * dv + e];
            }
    for (int bt = 0; bt < B * T; bt++)
        for (int o = 0; o < D; o++) {
            double a = 0;
            for (int i = 0; i < h * dv; i++) a += rnd(fp32, z[(size_t)bt * h * dv + i]) * m->wo[(size_t)i * D + o];
            y[(size_t)bt * D + o] = a;
        }
    free(q), free(k), free(v), free(z), free(lg);
}

/* BLOOM's slope rule: start = 2^(-2^-(log2 n - 3)), slopes start * start^i;
 * a non-power of two takes the closest lower power's slopes, then every
 * other slope of twice that power. */
static void bloom_slopes(double *out, int n) {
    int p = 1;
    while (p * 2 <= n) p *= 2;
    double start = pow(2.0, -pow(2.0, -(log2((double)p) - 3)));
    for (int i = 0; i < p; i++) out[i] = start * pow(start, i);
    if (p == n) return;
    double more[2 * p];
    bloom_slopes(more, 2 * p);
    for (int i = 0; i < n - p; i++) out[p + i] = more[2 * i];
}

static void case_make(modern_case *m, mha_config c, uint64_t seed) {
    mha_config r;
    if (mha_config_resolve(&r, &c)) { CHECK(0); return; }
    m->c = r;
    const int D = r.d_model, h = r.n_heads, hk = r.n_kv_heads, dk = r.d_k, dv = r.d_v;
    m->wq = naive_random_floats((size_t)D * h * dk, &seed, -0.5f, 0.5f);
    m->wk = naive_random_floats((size_t)D * hk * dk, &seed, -0.5f, 0.5f);
    m->wv = naive_random_floats((size_t)D * hk * dv, &seed, -0.5f, 0.5f);
    m->wo = naive_random_floats((size_t)h * dv * D, &seed, -0.5f, 0.5f);
    m->slopes = naive_alloc_floats((size_t)h);
    double s[h];
    bloom_slopes(s, h);
    for (int i = 0; i < h; i++) m->slopes[i] = (float)s[i];
    m->sinks = naive_random_floats((size_t)h, &seed, -1.0f, 2.0f);
    m->qn = naive_random_floats((size_t)h * dk, &seed, 0.5f, 1.5f);
    m->kn = naive_random_floats((size_t)hk * dk, &seed, 0.5f, 1.5f);
}

static void case_free(modern_case *m) {
    free(m->wq), free(m->wk), free(m->wv), free(m->wo), free(m->slopes), free(m->sinks), free(m->qn), free(m->kn);
}

static mha_layer *case_layer(const modern_case *m) {
    mha_weights w = {.w_q = m->wq, .w_k = m->wk, .w_v = m->wv, .w_o = m->wo,
                     .alibi_slopes = m->c.alibi ? m->slopes : NULL, .sinks = m->c.sinks ? m->sinks : NULL,
                     .q_norm = m->c.qk_norm ? m->qn : NULL, .k_norm = m->c.qk_norm ? m->kn : NULL};
    mha_layer *L = NULL;
    CHECK_OK(mha_layer_create(&L, &m->c, &w));
    return L;
}

/* The configurations every comparison walks (here and in
 * test_modern_cache.c): each variant alone, then combinations, under MHA
 * and GQA. */
mha_config modern_variant_config(int i) {
    mha_config c = mha_config_default(24, 4);
    c.bias = 0, c.d_k = 8;
    switch (i) {
    case 0: c.rope.pairing = MHA_ROPE_HALVES; break;
    case 1: c.rope.pairing = MHA_ROPE_INTERLEAVED, c.rope.dim = 4, c.rope.theta = 500000; break;
    case 2: c.rope.pairing = MHA_ROPE_HALVES, c.rope.scaling = MHA_ROPE_SCALE_LINEAR, c.rope.factor = 4; break;
    case 3: c.rope.pairing = MHA_ROPE_HALVES, c.rope.scaling = MHA_ROPE_SCALE_LLAMA3, c.rope.factor = 8,
            c.rope.original_max_positions = 16, c.rope.theta = 500000; break;
    case 4: c.alibi = 1; break;
    case 5: c.softcap = 1.5f; break;
    case 6: c.sinks = 1; break;
    case 7: c.qk_norm = MHA_QK_NORM_RMS; break;
    case 8: c.qk_norm = MHA_QK_NORM_LAYER, c.qk_norm_per_head = 1, c.qk_norm_eps = 1e-5f; break;
    case 9: c.n_heads = 6, c.d_k = 4, c.alibi = 1, c.sinks = 1, c.softcap = 2.0f; break; /* 6 heads: non-power-of-two slopes */
    case 11: c.n_kv_heads = 2, c.rope.pairing = MHA_ROPE_HALVES, c.qk_norm = MHA_QK_NORM_RMS, /* OLMo 2 */
             c.qk_norm_per_head = 1, c.qk_norm_whole = 1; break;
    case 12: c.clip_qkv = 0.5f; break; /* about half of Q, K, V clamped */
    case 13: c.n_kv_heads = 2, c.rope.pairing = MHA_ROPE_HALVES, c.clip_qkv = 0.6f, /* DBRX: GQA, RoPE */
             c.qk_norm = MHA_QK_NORM_RMS; break; /* and a norm: the clamp comes first */
    default: c.n_kv_heads = 2, c.rope.pairing = MHA_ROPE_HALVES, c.rope.dim = 6, c.qk_norm = MHA_QK_NORM_RMS,
             c.qk_norm_per_head = 1, c.sinks = 1, c.softcap = 3.0f; break;
    }
    return c;
}

/* ---------------------------------------------------------- by hand */

/* d_k = 2, W = I, scale 1: x = (1, 0) at positions 0 and 1. RoPE turns
 * q_1 and k_1 by 1 radian, so the scores of query 1 are (cos 1, 1) and of
 * query 0 are (1, cos 1). */
static void modern_rope_by_hand(void) {
    const float eye[4] = {1, 0, 0, 1}, x[4] = {1, 0, 1, 0};
    for (int pairing = MHA_ROPE_HALVES; pairing <= MHA_ROPE_INTERLEAVED; pairing++) {
        mha_config c = mha_config_default(2, 1);
        c.bias = 0, c.rope.pairing = (mha_rope_pairing)pairing;
        mha_weights w = {.w_q = eye, .w_k = eye, .w_v = eye, .w_o = eye};
        mha_layer *L = NULL;
        CHECK_OK(mha_layer_create(&L, &c, &w));
        if (!L) return;
        float y[4], probs[4];
        mha_capture cap = {.probs = probs};
        mha_options o = naive_ref_options();
        o.scale = 1.0f;
        CHECK_OK(mha_forward(L, y, &cap, x, NULL, 1, 2, 2, &o));
        const double e = exp(1.0 - cos(1.0)); /* p(key 1 | query 1) / p(key 0 | query 1) */
        CHECK_NEAR(probs[0], e / (1 + e), 1e-6);
        CHECK_NEAR(probs[3], e / (1 + e), 1e-6);
        /* V is not rotated: both values are (1, 0) */
        CHECK_NEAR(y[2], 1.0, 1e-6);
        CHECK_NEAR(y[3], 0.0, 1e-6);
        mha_layer_free(L);
    }
}

/* d_model = d_k = 1, q = k = x, scale 1, x = (1, 2): query 1 scores 2, 4.
 * softcap 3: 3 tanh(2/3), 3 tanh(4/3); sink 0.5 joins the denominator. */
static void modern_softcap_sink_by_hand(void) {
    const float one = 1.0f, x[2] = {1, 2}, sink = 0.5f;
    mha_config c = mha_config_default(1, 1);
    c.bias = 0, c.softcap = 3.0f, c.sinks = 1;
    mha_weights w = {.w_q = &one, .w_k = &one, .w_v = &one, .w_o = &one, .sinks = &sink};
    mha_layer *L = NULL;
    CHECK_OK(mha_layer_create(&L, &c, &w));
    if (!L) return;
    float y[2], probs[4];
    mha_capture cap = {.probs = probs};
    for (int path = MHA_PATH_REFERENCE; path <= MHA_PATH_FAST; path++) {
        mha_options o = mha_options_default();
        o.scale = 1.0f, o.path = (mha_path)path;
        CHECK_OK(mha_forward(L, y, &cap, x, NULL, 1, 2, 2, &o));
        const double a = exp(3 * tanh(2.0 / 3)), b = exp(3 * tanh(4.0 / 3)), s = exp(0.5);
        CHECK_NEAR(probs[2], a / (a + b + s), 1e-6);
        CHECK_NEAR(probs[3], b / (a + b + s), 1e-6);
        CHECK_NEAR(y[1], (a * 1 + b * 2) / (a + b + s), 1e-6);
    }
    mha_layer_free(L);
}

/* ALiBi with 1 head: slope 0.5 (2^-8/1 = 2^-8? no: n = 1 gives 2^-8);
 * given slope 0.5, q = k = 0: query 2 scores -1, -0.5, 0 (causal). */
static void modern_alibi_by_hand(void) {
    const float one = 1.0f, zero = 0.0f, x[3] = {1, 2, 3}, slope = 0.5f;
    mha_config c = mha_config_default(1, 1);
    c.bias = 0, c.alibi = 1;
    mha_weights w = {.w_q = &zero, .w_k = &zero, .w_v = &one, .w_o = &one, .alibi_slopes = &slope};
    mha_layer *L = NULL;
    CHECK_OK(mha_layer_create(&L, &c, &w));
    if (!L) return;
    float y[3];
    for (int path = MHA_PATH_REFERENCE; path <= MHA_PATH_FAST; path++) {
        mha_options o = mha_options_default();
        o.causal = 1, o.path = (mha_path)path;
        CHECK_OK(mha_forward(L, y, NULL, x, NULL, 1, 3, 3, &o));
        const double a = exp(-1.0), b = exp(-0.5);
        CHECK_NEAR(y[2], (a * 1 + b * 2 + 3) / (a + b + 1), 1e-6);
        CHECK_NEAR(y[1], (b * 1 + 2) / (b + 1), 1e-6);
        /* explicit positions 0, 4, 5: query 2 sees distances 5, 1, 0 */
        const int pos[3] = {0, 4, 5};
        o.positions = pos;
        CHECK_OK(mha_forward(L, y, NULL, x, NULL, 1, 3, 3, &o));
        const double a5 = exp(-2.5);
        CHECK_NEAR(y[2], (a5 * 1 + b * 2 + 3) / (a5 + b + 1), 1e-6);
    }
    mha_layer_free(L);
}

static void modern_alibi_default_slopes(void) {
    const int counts[5] = {1, 8, 6, 12, 40};
    for (int k = 0; k < 5; k++) {
        const int n = counts[k];
        mha_config c = mha_config_default(n * 2, n);
        c.alibi = 1;
        mha_layer *L = NULL;
        CHECK_OK(mha_layer_create(&L, &c, NULL));
        if (!L) return;
        mha_weights w;
        mha_layer_get_weights(L, &w);
        double want[n];
        bloom_slopes(want, n);
        for (int i = 0; i < n; i++) CHECK_NEAR(w.alibi_slopes[i], want[i], 1e-7 * want[i]);
        float pub[40]; /* the public mha_alibi_slopes gives the layer's bits */
        CHECK_OK(mha_alibi_slopes(pub, n));
        CHECK(memcmp(pub, w.alibi_slopes, sizeof(float) * (size_t)n) == 0);
        mha_layer_free(L);
    }
    float s6[6]; /* by hand: 4 heads' 2^-2, 2^-4, 2^-6, 2^-8, then 8 heads' odd ones 2^-1, 2^-3 */
    CHECK_OK(mha_alibi_slopes(s6, 6));
    const float want6[6] = {0.25f, 0.0625f, 0.015625f, 0.00390625f, 0.5f, 0.125f};
    CHECK(memcmp(s6, want6, sizeof s6) == 0);
    CHECK_STATUS(mha_alibi_slopes(NULL, 4), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("slopes is NULL");
    CHECK_STATUS(mha_alibi_slopes(s6, 0), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("n_heads=0");
}

/* llama3 and YaRN frequencies against their published formulas, one
 * frequency in each regime worked out here. theta 10000, r = 8: f_i =
 * 10000^(-i/4) = 1, 0.1, 0.01, 0.001; wavelengths 6.28, 62.8, 628, 6283. */
static void modern_rope_scaling_by_hand(void) {
    mha_config c = mha_config_default(8, 1);
    c.rope.pairing = MHA_ROPE_HALVES, c.rope.scaling = MHA_ROPE_SCALE_LLAMA3, c.rope.factor = 8;
    c.rope.original_max_positions = 1024; /* low wl 1024, high wl 256 */
    mha_config r;
    CHECK_OK(mha_config_resolve(&r, &c));
    double f[4], ms;
    mha_rope_frequencies(f, &ms, &r, 0);
    CHECK_NEAR(f[0], 1.0, 1e-15);   /* 6.28 < 256: kept */
    CHECK_NEAR(f[1], 0.1, 1e-15);   /* 62.8 < 256: kept */
    const double sm = (1024 / (2 * M_PI / 0.01) - 1) / (4 - 1); /* 628 between: blended */
    CHECK_NEAR(f[2], (1 - sm) * 0.01 / 8 + sm * 0.01, 1e-15);
    CHECK_NEAR(f[3], 0.001 / 8, 1e-15); /* 6283 > 1024: divided */
    CHECK_NEAR(ms, 1.0, 0);
    c.rope.scaling = MHA_ROPE_SCALE_YARN, c.rope.original_max_positions = 64, c.rope.factor = 4;
    CHECK_OK(mha_config_resolve(&r, &c));
    mha_rope_frequencies(f, &ms, &r, 0);
    /* correction dims: 8 ln(64/(2 pi rot)) / (2 ln 10000): rot 32 -> -0.50 (floor -1 -> 0),
       rot 1 -> 1.008 (ceil 2); ramp (i - 0) / 2 clamped: 0, 1/2, 1, 1 */
    const double base[4] = {1, 0.1, 0.01, 0.001};
    for (int i = 0; i < 4; i++) {
        const double ramp = i < 2 ? i / 2.0 : 1.0;
        CHECK_NEAR(f[i], base[i] / 4 * ramp + base[i] * (1 - ramp), 1e-15);
    }
    CHECK_NEAR(ms, 0.1 * log(4.0) + 1, 1e-15);
}

/* ------------------------------------------------ against the oracle */

static void modern_reference_vs_oracle(void) {
    const int B = 2, T = 9;
    for (int i = 0; i < MODERN_N_CONFIGS; i++) {
        modern_case m;
        case_make(&m, modern_variant_config(i), 500 + i);
        mha_layer *L = case_layer(&m);
        if (!L) return;
        uint64_t seed = 900 + i;
        float *x = naive_random_floats((size_t)B * T * m.c.d_model, &seed, -1, 1), *y = naive_alloc_floats((size_t)B * T * m.c.d_model);
        double *want = naive_alloc_doubles((size_t)B * T * m.c.d_model);
        int pos[B * T];
        for (int t = 0; t < B * T; t++) pos[t] = t % T * 3 + (t / T) * 7; /* packed, offset */
        for (int explicit_pos = 0; explicit_pos < 2; explicit_pos++) {
            mha_options o = naive_ref_options();
            o.causal = 1;
            o.positions = explicit_pos && (m.c.rope.pairing || m.c.alibi) ? pos : NULL;
            CHECK_OK(mha_forward(L, y, NULL, x, NULL, B, T, T, &o));
            oracle(want, &m, x, B, T, o.positions, 1, 0, MHA_CACHE_F32);
            double d = naive_max_diff(y, want, (size_t)B * T * m.c.d_model);
            if (!(d < 2e-6)) test_report(__FILE__, __LINE__, "config %d positions %d: |ref - oracle| = %g", i, explicit_pos, d);
        }
        free(x), free(y), free(want);
        mha_layer_free(L);
        case_free(&m);
    }
}

/* fast vs reference: error <= 2 x the naive fp32 error + 1e-6 */
static void fast_vs_reference(const mha_kernels *k) {
    mha_kernels_force(k);
    const int B = 2, T = 70; /* more than one query tile (48) */
    for (int i = 0; i < MODERN_N_CONFIGS; i++) {
        modern_case m;
        case_make(&m, modern_variant_config(i), 700 + i);
        mha_layer *L = case_layer(&m);
        if (!L) break;
        const size_t n = (size_t)B * T * m.c.d_model;
        uint64_t seed = 1100 + i;
        float *x = naive_random_floats(n, &seed, -1, 1), *yf = naive_alloc_floats(n), *yr = naive_alloc_floats(n);
        double *want = naive_alloc_doubles(n), *naive32 = naive_alloc_doubles(n);
        int pos[B * T];
        for (int t = 0; t < B * T; t++) pos[t] = t % T + 1000 * (t / T);
        for (int variant = 0; variant < 2; variant++) {
            mha_options o = mha_options_default();
            o.causal = 1;
            o.positions = variant && (m.c.rope.pairing || m.c.alibi) ? pos : NULL;
            o.path = MHA_PATH_FAST;
            CHECK_OK(mha_forward(L, yf, NULL, x, NULL, B, T, T, &o));
            o.path = MHA_PATH_REFERENCE;
            CHECK_OK(mha_forward(L, yr, NULL, x, NULL, B, T, T, &o));
            oracle(want, &m, x, B, T, o.positions, 1, 0, MHA_CACHE_F32);
            oracle(naive32, &m, x, B, T, o.positions, 1, 1, MHA_CACHE_F32);
            double fast_err = naive_max_diff(yf, want, n), ref_err = naive_max_diff(yr, want, n);
            double n32 = 0;
            for (size_t e = 0; e < n; e++) n32 = fmax(n32, fabs(naive32[e] - want[e]));
            if (!(fast_err <= 2 * n32 + 1e-6) || !(ref_err < 2e-6))
                test_report(__FILE__, __LINE__, "%s config %d positions %d: fast err %g, naive fp32 err %g, ref err %g",
                            k->name, i, variant, fast_err, n32, ref_err);
        }
        free(x), free(yf), free(yr), free(want), free(naive32);
        mha_layer_free(L);
        case_free(&m);
    }
    mha_kernels_force(NULL);
}

/* Every variant through a KV cache storing fp16 or int8 (prefill 5, then
 * 15 decode steps) against the oracle whose K (rotated) and V are stored
 * the same way: the storage is the only difference the oracle lets
 * through. Tolerance 2 x the fp32 cache's error + e_q / 5 (e_q the
 * storage's own effect, oracle stored vs not; an element rounded near a
 * tie may flip, as docs/CACHE.md says: measured up to e_q / 7 for fp16,
 * most configs at 1e-6), required below e_q / 2 so that a cache that
 * stored other values than these, or K before RoPE, fails. */
static void modern_cache_storage_vs_oracle(void) {
    enum { T = 20 };
    for (int i = 0; i < MODERN_N_CONFIGS; i++) {
        modern_case m;
        case_make(&m, modern_variant_config(i), 600 + i);
        mha_layer *L = case_layer(&m);
        if (!L) return;
        const int D = m.c.d_model;
        uint64_t seed = 610 + i;
        float *x = naive_random_floats((size_t)T * D, &seed, -1, 1), *y = naive_alloc_floats((size_t)T * D);
        double *plain = naive_alloc_doubles((size_t)T * D), *stored = naive_alloc_doubles((size_t)T * D);
        oracle(plain, &m, x, 1, T, NULL, 1, 0, MHA_CACHE_F32);
        double err32 = 0;
        for (int dt = MHA_CACHE_F32; dt <= MHA_CACHE_I8; dt++) {
            mha_cache *c = NULL;
            CHECK_OK(mha_cache_create(&c, L, 1, T, (mha_cache_dtype)dt, 0));
            for (int t = 0; c && t < T;) {
                const int n = t == 0 ? 5 : 1;
                CHECK_OK(mha_forward_cached(L, c, y + (size_t)t * D, NULL, x + (size_t)t * D, n, NULL, NULL));
                t += n;
            }
            mha_cache_free(c);
            oracle(stored, &m, x, 1, T, NULL, 1, 0, (mha_cache_dtype)dt);
            const double err = naive_max_diff(y, stored, (size_t)T * D);
            if (dt == MHA_CACHE_F32) {
                err32 = err;
                continue;
            }
            double e_q = 0;
            for (size_t e = 0; e < (size_t)T * D; e++) e_q = fmax(e_q, fabs(stored[e] - plain[e]));
            const double tol = 2 * err32 + 1e-6 + e_q / 5;
            if (!(err <= tol) || !(tol < e_q / 2))
                test_report(__FILE__, __LINE__, "config %d dtype %d: cache vs stored oracle %g, tolerance %g, "
                            "storage effect e_q %g", i, dt, err, tol, e_q);
        }
        free(x), free(y), free(plain), free(stored);
        mha_layer_free(L);
        case_free(&m);
    }
}

static void modern_fast_vs_reference_scalar(void) { fast_vs_reference(&mha_kernels_scalar); }
static void modern_fast_vs_reference_avx2(void) {
    if (!mha_cpu_has_avx2()) return; /* the scalar run covers this machine */
    fast_vs_reference(&mha_kernels_avx2);
}
static void modern_fast_vs_reference_avx512(void) {
    if (!mha_cpu_has_avx512()) return; /* the runs above cover this machine */
    fast_vs_reference(&mha_kernels_avx512);
}

/* the vector tanh of the softcap kernel: relative error < 3e-7 */
static void modern_softcap_kernel_accuracy(void) {
    const mha_kernels *tables[3] = {&mha_kernels_scalar, &mha_kernels_avx2, &mha_kernels_avx512};
    for (int t = 0; t < 3; t++) {
        if ((t == 1 && !mha_cpu_has_avx2()) || (t == 2 && !mha_cpu_has_avx512())) continue;
        float s[64 * 16];
        for (int i = 0; i < 64 * 16; i++) s[i] = (float)((i - 512) * 0.02); /* -10.24 .. 10.22 */
        float in[64 * 16];
        memcpy(in, s, sizeof s);
        mha_attn_softcap_get(tables[t])(s, 16, 1.0f, 64, 16);
        double worst = 0;
        for (int i = 0; i < 64 * 16; i++) {
            double want = tanh((double)in[i]);
            if (want != 0) worst = fmax(worst, fabs(s[i] - want) / fabs(want));
        }
        if (!(worst < 3e-7)) test_report(__FILE__, __LINE__, "%s tanh: relative error %g", tables[t]->name, worst);
    }
}

/* ------------------------------------------------ the head contract */

static void modern_permute_and_contract(void) {
    modern_case m;
    mha_config c = modern_variant_config(10); /* GQA, rope, per-head norms, sinks */
    c.alibi = 1;
    case_make(&m, c, 42);
    mha_layer *L = case_layer(&m);
    if (!L) return;
    const int B = 1, T = 11, D = m.c.d_model;
    uint64_t seed = 43;
    float *x = naive_random_floats((size_t)B * T * D, &seed, -1, 1), *y0 = naive_alloc_floats((size_t)B * T * D),
          *y1 = naive_alloc_floats((size_t)B * T * D);
    mha_options o = mha_options_default();
    o.causal = 1;
    CHECK_OK(mha_forward(L, y0, NULL, x, NULL, B, T, T, &o));
    const int perm[4] = {2, 3, 0, 1}; /* whole kv groups */
    CHECK_OK(mha_layer_permute_heads(L, perm));
    CHECK_OK(mha_forward(L, y1, NULL, x, NULL, B, T, T, &o));
    CHECK_ARRAY_NEAR(y1, y0, (size_t)B * T * D, 1e-5);
    CHECK_OK(mha_layer_check_contract(L, x, NULL, B, T, T, &o, NULL));
    /* the slopes and sinks moved alone: Y changes and the check names them */
    const int swap[4] = {1, 0, 2, 3};
    CHECK_OK(mha_layer_permute_block(L, MHA_BLOCK_S, swap));
    CHECK_OK(mha_forward(L, y1, NULL, x, NULL, B, T, T, &o));
    CHECK(test_max_abs_diff(y1, y0, (size_t)B * T * D) > 1e-4);
    mha_contract_report rep;
    CHECK_STATUS(mha_layer_check_contract(L, NULL, NULL, B, T, T, &o, &rep), MHA_E_CONTRACT);
    CHECK_INT(rep.bad_block, MHA_BLOCK_S);
    CHECK_INT(rep.bad_position, 0);
    CHECK_ERROR_MENTIONS("ALiBi slope, sink");
    free(x), free(y0), free(y1);
    mha_layer_free(L);
    case_free(&m);
}

/* ---------------------------------------------------------- errors */

/* clip_qkv = 2, d_model = d_k = 1, W = 1, b_Q = b_K = b_V = 0.5, b_O = 0,
 * scale 1, causal: x = (1, 3, -3) projects to (1.5, 3.5, -2.5), clamped
 * to (1.5, 2, -2) for q, k and v alike. Query 1: scores 2 * 1.5 = 3 and
 * 2 * 2 = 4; query 2: -3, -4, 4. Both paths, and the cache (prefill 1,
 * then one token at a time), which must store the clamped K and V. */
static void modern_clip_qkv_by_hand(void) {
    const float one = 1.0f, half = 0.5f, zero = 0.0f, x[3] = {1, 3, -3};
    mha_config c = mha_config_default(1, 1);
    c.clip_qkv = 2.0f;
    mha_weights w = {.w_q = &one, .w_k = &one, .w_v = &one, .w_o = &one,
                     .b_q = &half, .b_k = &half, .b_v = &half, .b_o = &zero};
    mha_layer *L = NULL;
    CHECK_OK(mha_layer_create(&L, &c, &w));
    if (!L) return;
    const double e3 = exp(3.0), e4 = exp(4.0), em3 = exp(-3.0), em4 = exp(-4.0);
    const double want[3] = {1.5, (1.5 * e3 + 2 * e4) / (e3 + e4),
                            (1.5 * em3 + 2 * em4 - 2 * e4) / (em3 + em4 + e4)};
    for (int path = MHA_PATH_REFERENCE; path <= MHA_PATH_FAST; path++) {
        float y[3] = {0};
        mha_options o = naive_ref_options();
        o.scale = 1.0f, o.causal = 1, o.path = (mha_path)path;
        CHECK_OK(mha_forward(L, y, NULL, x, NULL, 1, 3, 3, &o));
        for (int t = 0; t < 3; t++) CHECK_NEAR(y[t], want[t], 2e-6);
    }
    mha_cache *kc = NULL;
    CHECK_OK(mha_cache_create(&kc, L, 1, 3, MHA_CACHE_F32, 0));
    mha_options o = mha_options_default();
    o.scale = 1.0f;
    for (int t = 0; kc && t < 3; t++) {
        float y = 0;
        CHECK_OK(mha_forward_cached(L, kc, &y, NULL, x + t, 1, NULL, &o));
        CHECK_NEAR(y, want[t], 2e-6);
    }
    mha_cache_free(kc);
    mha_layer_free(L);
}

static void modern_errors(void) {
    mha_config c = mha_config_default(16, 2), r;
    /* clip_qkv: negative, NaN, inf refused naming it; not with PyTorch's extra keys */
    const float bad_clip[3] = {-1.0f, NAN, INFINITY};
    for (int i = 0; i < 3; i++) {
        c.clip_qkv = bad_clip[i];
        CHECK_STATUS(mha_config_resolve(&r, &c), MHA_E_ARG);
        CHECK_ERROR_MENTIONS("clip_qkv=");
    }
    c.clip_qkv = 8.0f, c.add_zero_attn = 1;
    CHECK_STATUS(mha_config_resolve(&r, &c), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("clip_qkv");
    c = mha_config_default(16, 2);
    c.rope.pairing = MHA_ROPE_HALVES, c.rope.dim = 5;
    CHECK_STATUS(mha_config_resolve(&r, &c), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("rope.dim=5");
    c.rope.dim = 0, c.add_bias_kv = 1;
    CHECK_STATUS(mha_config_resolve(&r, &c), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("add_bias_kv");
    c = mha_config_default(16, 2), c.softcap = -1;
    CHECK_STATUS(mha_config_resolve(&r, &c), MHA_E_ARG);
    c = mha_config_default(16, 2), c.rope.theta = 5;
    CHECK_STATUS(mha_config_resolve(&r, &c), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("MHA_ROPE_NONE");
    c = mha_config_default(16, 2), c.rope.pairing = MHA_ROPE_HALVES, c.rope.scaling = MHA_ROPE_SCALE_YARN, c.rope.factor = 4;
    CHECK_STATUS(mha_config_resolve(&r, &c), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("original_max_positions");
    /* sinks on: weights.sinks is required; alibi off: slopes refused */
    c = mha_config_default(4, 2), c.bias = 0, c.sinks = 1;
    float w16[16] = {0};
    mha_weights w = {.w_q = w16, .w_k = w16, .w_v = w16, .w_o = w16};
    mha_layer *L = NULL;
    CHECK_STATUS(mha_layer_create(&L, &c, &w), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("weights.sinks");
    w.sinks = w16, w.alibi_slopes = w16;
    CHECK_STATUS(mha_layer_create(&L, &c, &w), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("alibi_slopes");
    w.alibi_slopes = NULL;
    CHECK_OK(mha_layer_create(&L, &c, &w));
    if (!L) return;
    /* positions without rope or alibi, a negative position */
    float x[8] = {0}, y[8], dy[8] = {0}, dx[8];
    int pos[2] = {0, 1};
    mha_options o = mha_options_default();
    o.positions = pos;
    CHECK_STATUS(mha_forward(L, y, NULL, x, NULL, 1, 2, 2, &o), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("positions");
    o.positions = NULL;
    mha_gradients g = {.dx = dx};
    CHECK_OK(mha_backward(L, &g, dy, x, NULL, 1, 2, 2, &o)); /* sinks: AUTO runs the reference backward */
    mha_layer_free(L);
    c = mha_config_default(4, 2), c.rope.pairing = MHA_ROPE_HALVES;
    CHECK_OK(mha_layer_create(&L, &c, NULL));
    pos[1] = -3;
    o.positions = pos;
    CHECK_STATUS(mha_forward(L, y, NULL, x, NULL, 1, 2, 2, &o), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("positions[1]=-3");
    mha_layer_free(L);
}

static const test_case cases[] = {
    {"modern_rope_by_hand", modern_rope_by_hand},
    {"modern_softcap_sink_by_hand", modern_softcap_sink_by_hand},
    {"modern_alibi_by_hand", modern_alibi_by_hand},
    {"modern_alibi_default_slopes", modern_alibi_default_slopes},
    {"modern_rope_scaling_by_hand", modern_rope_scaling_by_hand},
    {"modern_reference_vs_oracle", modern_reference_vs_oracle},
    {"modern_fast_vs_reference_scalar", modern_fast_vs_reference_scalar},
    {"modern_fast_vs_reference_avx2", modern_fast_vs_reference_avx2},
    {"modern_fast_vs_reference_avx512", modern_fast_vs_reference_avx512},
    {"modern_softcap_kernel_accuracy", modern_softcap_kernel_accuracy},
    {"modern_permute_and_contract", modern_permute_and_contract},
    {"modern_cache_storage_vs_oracle", modern_cache_storage_vs_oracle},
    {"modern_clip_qkv_by_hand", modern_clip_qkv_by_hand},
    {"modern_errors", modern_errors},
};

const test_case *tests_modern(size_t *count) {
    *count = sizeof cases / sizeof cases[0];
    return cases;
}
