/* test_merge.c — the log-sum-exp outputs (mha_forward_lse, mha_attend_lse)
 * and mha_attention_merge: lse against scores computed here, attention on
 * projected heads against the full forward, and partial results over
 * disjoint key sets merged back into the full forward's Z and lse.
 * Legend: B, T, S, h, h_kv, d_k, d_v, d_model (see mha.h). */
#include <stdlib.h>
#include <string.h>

#include "naive.h"
#include "tests.h"

/* Max |a - b| over n lse values; equal infinities (masked rows) count 0. */
static double lse_diff(const float *a, const float *b, size_t n) {
    double m = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = a[i] == b[i] ? 0.0 : fabs((double)a[i] - (double)b[i]);
        if (!(d <= m)) m = d;
    }
    return m;
}

/* Q (B,T,h*d_k), K, V of a layer from its weights, via the public seed
 * step y = x w + b. */
static void project(float *out, const float *in, const float *w, const float *b, int rows, int din,
                    int dout) {
    CHECK_OK(mha_project_out(out, in, w, b, rows, din, dout));
}

/* W_Q = W_K = identity (d_model = h*d_k, no bias), so scores are
 * scale * x_i . x_j and the lse is computed here from x alone. */
static void lse_matches_scores_by_hand(void) {
    const int B = 2, T = 5, h = 2, d_k = 3, D = h * d_k;
    mha_config c = naive_resolve(mha_config_default(D, h));
    c.bias = 0;
    uint64_t seed = 1401;
    naive_weights w;
    naive_weights_random(&w, &c, &seed, 0.6f);
    memset(w.w_q, 0, sizeof(float) * D * D), memset(w.w_k, 0, sizeof(float) * D * D);
    for (int i = 0; i < D; i++) w.w_q[i * D + i] = w.w_k[i * D + i] = 1.0f;
    mha_layer *L = naive_make_layer(&w);
    float *x = naive_random_floats((size_t)B * T * D, &seed, -1.0f, 1.0f);
    float *y = naive_alloc_floats((size_t)B * T * D), *lse = naive_alloc_floats((size_t)B * h * T);
    mha_options o = mha_options_default();
    o.causal = 1;
    if (L) CHECK_OK(mha_forward_lse(L, y, NULL, lse, x, NULL, NULL, B, T, T, &o));
    double worst = 0.0, scale = 1.0 / sqrt((double)d_k);
    for (int b = 0; b < B; b++)
        for (int r = 0; r < h; r++)
            for (int i = 0; i < T; i++) {
                double sum = 0.0;
                for (int j = 0; j <= i; j++) { /* causal: keys 0..i */
                    double dot = 0.0;
                    for (int e = 0; e < d_k; e++)
                        dot += (double)x[((size_t)b * T + i) * D + r * d_k + e] *
                               x[((size_t)b * T + j) * D + r * d_k + e];
                    sum += exp(scale * dot);
                }
                double d = fabs(log(sum) - lse[((size_t)b * h + r) * T + i]);
                if (d > worst) worst = d;
            }
    CHECK(worst <= 1e-6);
    free(x), free(y), free(lse);
    mha_layer_free(L);
    naive_weights_free(&w);
}

/* A layer with sinks: lse is the keys' log-sum-exp by hand (W_Q = W_K =
 * identity), the sink left out (it was in: lse = log(sum_j exp(s_j) +
 * exp(sink)) in rows with a key, -inf in rows without one); and the merge
 * mha.h describes for such a layer (each part's Z times 1 + exp(sink -
 * lse_i), merged, divided by 1 + exp(sink - lse_m)) gives the whole
 * forward's Z. Parts: the keys 0..2 and 3..T-1, by key_keep. */
static void lse_with_sinks_leaves_the_sink_out(void) {
    const int B = 2, T = 6, h = 2, d_k = 3, D = h * d_k;
    mha_config c = mha_config_default(D, h);
    c.bias = 0, c.sinks = 1;
    c = naive_resolve(c);
    uint64_t seed = 1404;
    naive_weights w;
    naive_weights_random(&w, &c, &seed, 0.6f);
    memset(w.w_q, 0, sizeof(float) * D * D), memset(w.w_k, 0, sizeof(float) * D * D);
    for (int i = 0; i < D; i++) w.w_q[i * D + i] = w.w_k[i * D + i] = 1.0f;
    w.sinks[0] = 1.5f, w.sinks[1] = -0.75f;
    mha_layer *L = naive_make_layer(&w);
    float *x = naive_random_floats((size_t)B * T * D, &seed, -1.0f, 1.0f);
    const size_t ny = (size_t)B * T * D, nz = (size_t)B * T * h * d_k, nl = (size_t)B * h * T;
    float *y = naive_alloc_floats(ny), *z = naive_alloc_floats(nz), *lse = naive_alloc_floats(nl);
    float *zp[2] = {naive_alloc_floats(nz), naive_alloc_floats(nz)}, *lp[2] = {naive_alloc_floats(nl),
                                                                                naive_alloc_floats(nl)};
    uint8_t keep[2 * 6] = {1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0}; /* batch 1: no key */
    mha_options o = mha_options_default();
    o.causal = 1, o.key_keep = keep;
    mha_capture cap = {z, NULL, NULL};
    if (L) CHECK_OK(mha_forward_lse(L, y, &cap, lse, x, NULL, NULL, B, T, T, &o));
    double worst = 0.0, scale = 1.0 / sqrt((double)d_k);
    for (int r = 0; r < h; r++)
        for (int i = 0; i < T; i++) {
            double sum = 0.0;
            for (int j = 0; j <= i; j++) {
                double dot = 0.0;
                for (int e = 0; e < d_k; e++) dot += (double)x[(size_t)i * D + r * d_k + e] * x[(size_t)j * D + r * d_k + e];
                sum += exp(scale * dot);
            }
            double d = fabs(log(sum) - lse[(size_t)r * T + i]);
            if (!(d <= worst)) worst = d;
            CHECK(lse[((size_t)h + r) * T + i] == -INFINITY); /* batch 1 */
        }
    CHECK(worst <= 1e-6);
    /* the merge of the two parts' keys-only Z, then the sink once */
    uint8_t part_keep[2][2 * 6] = {{1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0}, {0, 0, 0, 1, 1, 1, 0, 0, 0, 0, 0, 0}};
    for (int p = 0; p < 2 && L; p++) {
        o.key_keep = part_keep[p];
        cap.z = zp[p];
        CHECK_OK(mha_forward_lse(L, y, &cap, lp[p], x, NULL, NULL, B, T, T, &o));
        for (size_t n = 0; n < nz; n++) {
            const size_t row = n / (size_t)(h * d_k), r = n / d_k % h, b = row / T, i = row % T;
            const float l = lp[p][(b * h + r) * T + i];
            if (l != -INFINITY) zp[p][n] *= (float)(1.0 + exp(w.sinks[r] - l));
        }
    }
    float *zm = naive_alloc_floats(nz), *lm = naive_alloc_floats(nl);
    CHECK_OK(mha_attention_merge(zm, lm, (const float *const *)zp, (const float *const *)lp, 2, B, T, h, d_k));
    for (size_t n = 0; n < nz; n++) {
        const size_t row = n / (size_t)(h * d_k), r = n / d_k % h, b = row / T, i = row % T;
        const float l = lm[(b * h + r) * T + i];
        if (l != -INFINITY) zm[n] = (float)(zm[n] / (1.0 + exp(w.sinks[r] - l)));
    }
    CHECK_ARRAY_NEAR(zm, z, nz, 1e-6);
    CHECK(lse_diff(lm, lse, nl) <= 1e-6);
    free(x), free(y), free(z), free(lse), free(zp[0]), free(zp[1]), free(lp[0]), free(lp[1]), free(zm), free(lm);
    mha_layer_free(L);
    naive_weights_free(&w);
}

/* A GQA cross-attention layer and its inputs, projected by hand. */
typedef struct {
    naive_weights w;
    mha_layer *L;
    int B, T, S;
    float *x, *kv;    /* (B,T,d_model), (B,S,d_kv_in) */
    float *q, *k, *v; /* (B,T,h*d_k), (B,S,h_kv*d_k), (B,S,h_kv*d_v) */
} fixture;

static int fixture_make(fixture *f, int B, int T, int S, uint64_t seed) {
    mha_config c = mha_config_default(12, 4);
    c.n_kv_heads = 2, c.d_k = 3, c.d_v = 5, c.d_kv_in = 7, c.bias = 1;
    c = naive_resolve(c);
    naive_weights_random(&f->w, &c, &seed, 0.7f);
    f->L = naive_make_layer(&f->w);
    f->B = B, f->T = T, f->S = S;
    f->x = naive_random_floats((size_t)B * T * 12, &seed, -1.5f, 1.5f);
    f->kv = naive_random_floats((size_t)B * S * 7, &seed, -1.5f, 1.5f);
    f->q = naive_alloc_floats((size_t)B * T * 12);
    f->k = naive_alloc_floats((size_t)B * S * 6);
    f->v = naive_alloc_floats((size_t)B * S * 10);
    project(f->q, f->x, f->w.w_q, f->w.b_q, B * T, 12, 12);
    project(f->k, f->kv, f->w.w_k, f->w.b_k, B * S, 7, 6);
    project(f->v, f->kv, f->w.w_v, f->w.b_v, B * S, 7, 10);
    return f->L != NULL;
}

static void fixture_free(fixture *f) {
    mha_layer_free(f->L);
    naive_weights_free(&f->w);
    free(f->x), free(f->kv), free(f->q), free(f->k), free(f->v);
}

/* mha_attend_lse on projected heads = the forward's Z and lse. */
static void attend_lse_equals_forward(void) {
    fixture f;
    if (!fixture_make(&f, 2, 4, 6, 1402)) return;
    const int B = 2, T = 4, S = 6, h = 4;
    const uint8_t keep[12] = {1, 1, 0, 1, 1, 1, 0, 0, 0, 0, 0, 0}; /* batch 1: all padded */
    mha_options o = mha_options_default();
    o.causal = 1, o.align = MHA_ALIGN_BOTTOM_RIGHT, o.key_keep = keep;
    size_t nz = (size_t)B * T * h * 5, nl = (size_t)B * h * T;
    float *y = naive_alloc_floats((size_t)B * T * 12), *z1 = naive_alloc_floats(nz), *z2 = naive_alloc_floats(nz);
    float *l1 = naive_alloc_floats(nl), *l2 = naive_alloc_floats(nl);
    mha_capture cap = {z1, NULL, NULL};
    CHECK_OK(mha_forward_lse(f.L, y, &cap, l1, f.x, f.kv, NULL, B, T, S, &o));
    CHECK_OK(mha_attend_lse(&f.w.cfg, z2, l2, f.q, f.k, f.v, B, T, S, &o));
    CHECK_ARRAY_NEAR(z1, z2, nz, 1e-5);
    CHECK(lse_diff(l1, l2, nl) <= 1e-5);
    for (size_t i = nl / 2; i < nl; i++) CHECK(l1[i] == -INFINITY); /* batch 1 */
    /* the forward's y is mha_forward's */
    float *y_ref = naive_alloc_floats((size_t)B * T * 12);
    o.path = MHA_PATH_REFERENCE;
    CHECK_OK(mha_forward(f.L, y_ref, NULL, f.x, f.kv, B, T, S, &o));
    CHECK_ARRAY_NEAR(y, y_ref, (size_t)B * T * 12, 0.0);
    free(y), free(y_ref), free(z1), free(z2), free(l1), free(l2);
    fixture_free(&f);
}

/* Keys split into 3 contiguous chunks (with per-chunk padding slices),
 * attended separately and merged = attention over all keys. One chunk of
 * batch 0 is fully padded (lse -inf, NaN rows under MASKED_ROW_NAN). */
static void merge_chunks_equals_full(void) {
    fixture f;
    if (!fixture_make(&f, 2, 3, 9, 1403)) return;
    const int B = 2, T = 3, S = 9, h = 4, h_kv = 2, d_k = 3, d_v = 5;
    const uint8_t keep[18] = {1, 1, 1, 0, 0, 0, 1, 0, 1, /* batch 0: chunk 1 padded */
                              1, 1, 0, 1, 1, 1, 1, 1, 1};
    mha_options o = mha_options_default();
    o.key_keep = keep;
    size_t nz = (size_t)B * T * h * d_v, nl = (size_t)B * h * T;
    float *z_full = naive_alloc_floats(nz), *l_full = naive_alloc_floats(nl);
    CHECK_OK(mha_attend_lse(&f.w.cfg, z_full, l_full, f.q, f.k, f.v, B, T, S, &o));
    const int n = 3, Sc = 3;
    float *zp[3], *lp[3];
    for (int p = 0; p < n; p++) {
        float *kc = naive_alloc_floats((size_t)B * Sc * h_kv * d_k), *vc = naive_alloc_floats((size_t)B * Sc * h_kv * d_v);
        uint8_t kk[6];
        for (int b = 0; b < B; b++) {
            memcpy(kc + (size_t)b * Sc * h_kv * d_k, f.k + ((size_t)b * S + p * Sc) * h_kv * d_k, sizeof(float) * Sc * h_kv * d_k);
            memcpy(vc + (size_t)b * Sc * h_kv * d_v, f.v + ((size_t)b * S + p * Sc) * h_kv * d_v, sizeof(float) * Sc * h_kv * d_v);
            memcpy(kk + b * Sc, keep + b * S + p * Sc, Sc);
        }
        mha_options oc = o;
        oc.key_keep = kk, oc.masked_row = MHA_MASKED_ROW_NAN;
        zp[p] = naive_alloc_floats(nz), lp[p] = naive_alloc_floats(nl);
        CHECK_OK(mha_attend_lse(&f.w.cfg, zp[p], lp[p], f.q, kc, vc, B, T, Sc, &oc));
        free(kc), free(vc);
    }
    CHECK(lp[1][0] == -INFINITY && isnan(zp[1][0]));
    float *z = naive_alloc_floats(nz), *l = naive_alloc_floats(nl);
    CHECK_OK(mha_attention_merge(z, l, (const float *const *)zp, (const float *const *)lp, n, B, T, h, d_v));
    CHECK_ARRAY_NEAR(z, z_full, nz, 1e-6);
    CHECK(lse_diff(l, l_full, nl) <= 1e-6);
    /* in place, two at a time, as a ring accumulates */
    CHECK_OK(mha_attention_merge(zp[0], lp[0], (const float *const[]){zp[0], zp[1]},
                                 (const float *const[]){lp[0], lp[1]}, 2, B, T, h, d_v));
    CHECK_OK(mha_attention_merge(zp[0], lp[0], (const float *const[]){zp[2], zp[0]},
                                 (const float *const[]){lp[2], lp[0]}, 2, B, T, h, d_v));
    CHECK_ARRAY_NEAR(zp[0], z_full, nz, 1e-6);
    CHECK(lse_diff(lp[0], l_full, nl) <= 1e-6);
    for (int p = 0; p < n; p++) free(zp[p]), free(lp[p]);
    free(z), free(l), free(z_full), free(l_full);
    fixture_free(&f);
}

/* Every part -inf: z = 0, lse = -inf. A NaN lse is refused, z untouched. */
static void merge_all_masked_and_errors(void) {
    float z1[2] = {NAN, NAN}, z2[2] = {NAN, 1.0f}, l1[1] = {-INFINITY}, l2[1] = {-INFINITY};
    float z[2] = {7, 7}, l[1] = {7};
    const float *zs[2] = {z1, z2}, *ls[2] = {l1, l2};
    CHECK_OK(mha_attention_merge(z, l, zs, ls, 2, 1, 1, 1, 2));
    CHECK(z[0] == 0.0f && z[1] == 0.0f && l[0] == -INFINITY);
    /* equal lse: the mean */
    float a[2] = {1, 2}, c[2] = {3, 6}, la[1] = {0.5f}, lc[1] = {0.5f};
    const float *zs2[2] = {a, c}, *ls2[2] = {la, lc};
    CHECK_OK(mha_attention_merge(z, l, zs2, ls2, 2, 1, 1, 1, 2));
    CHECK_NEAR(z[0], 2.0, 1e-7);
    CHECK_NEAR(z[1], 4.0, 1e-7);
    CHECK_NEAR(l[0], 0.5 + log(2.0), 1e-7);
    la[0] = NAN;
    z[0] = 7;
    CHECK_STATUS(mha_attention_merge(z, l, zs2, ls2, 2, 1, 1, 1, 2), MHA_E_NONFINITE);
    CHECK_ERROR_MENTIONS("lse_parts[0][0]");
    CHECK(z[0] == 7.0f);
    CHECK_STATUS(mha_attention_merge(z, l, zs2, ls2, 0, 1, 1, 1, 2), MHA_E_ARG);
}

static void attend_lse_errors(void) {
    mha_config c = mha_config_default(4, 2);
    float q[8] = {0}, k[8] = {0}, v[8] = {0}, z[8], lse[4];
    mha_intervention ivs[2] = {{MHA_HEAD_ZERO, 0, NULL}, {MHA_HEAD_KEEP, 0, NULL}};
    mha_options o = mha_options_default();
    o.interventions = ivs;
    CHECK_STATUS(mha_attend_lse(&c, z, lse, q, k, v, 1, 2, 2, &o), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("interventions");
    c.add_zero_attn = 1;
    CHECK_STATUS(mha_attend_lse(&c, z, lse, q, k, v, 1, 2, 2, NULL), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("add_zero_attn");
    c.add_zero_attn = 0;
    k[3] = NAN;
    CHECK_STATUS(mha_attend_lse(&c, z, lse, q, k, v, 1, 2, 2, NULL), MHA_E_NONFINITE);
    CHECK_OK(mha_attend_lse(&c, z, NULL, q, v, v, 1, 2, 2, NULL));
}

static const test_case cases[] = {
    {"lse_matches_scores_by_hand", lse_matches_scores_by_hand},
    {"lse_with_sinks_leaves_the_sink_out", lse_with_sinks_leaves_the_sink_out},
    {"lse_attend_equals_forward", attend_lse_equals_forward},
    {"lse_merge_chunks_equals_full", merge_chunks_equals_full},
    {"lse_merge_all_masked_and_errors", merge_all_masked_and_errors},
    {"lse_attend_errors", attend_lse_errors},
};

const test_case *tests_merge(size_t *count) {
    *count = sizeof cases / sizeof cases[0];
    return cases;
}
