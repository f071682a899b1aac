/* test_variants.c — GQA, MQA, cross-attention (S != T, d_kv_in != d_model),
 * a separate value source (v_src, d_v_in), d_v != d_k, add_bias_kv /
 * add_zero_attn, scale override; against the naive oracle, hand-derived
 * numbers and equivalent MHA layers. */
#include <stdlib.h>
#include <string.h>

#include "naive.h"
#include "tests.h"

typedef struct {
    naive_weights w;
    mha_layer *L;
    float *x, *kv; /* (B,T,d_model), (B,S,d_kv_in) or NULL */
    int B, T, S;
} fixture;

static int fixture_make(fixture *f, mha_config c, int B, int T, int S, int cross,
                        uint64_t seed) {
    c = naive_resolve(c);
    naive_weights_random(&f->w, &c, &seed, 0.7f);
    f->B = B, f->T = T, f->S = S;
    f->x = naive_random_floats((size_t)B * T * c.d_model, &seed, -1.5f, 1.5f);
    f->kv = cross ? naive_random_floats((size_t)B * S * c.d_kv_in, &seed, -1.5f, 1.5f) : NULL;
    f->L = naive_make_layer(&f->w);
    return f->L != NULL;
}

static void fixture_free(fixture *f) {
    mha_layer_free(f->L);
    naive_weights_free(&f->w);
    free(f->x), free(f->kv);
}

static double vs_naive(const fixture *f, const mha_options *o) {
    return naive_compare(f->L, &f->w, f->x, f->kv, f->B, f->T, f->S, o);
}

static mha_config cfg(int d_model, int h, int h_kv, int d_k, int d_v, int d_kv_in, int bias) {
    mha_config c = mha_config_default(d_model, h);
    c.n_kv_heads = h_kv, c.d_k = d_k, c.d_v = d_v, c.d_kv_in = d_kv_in, c.bias = bias;
    return c;
}

static void variants_cross_attention(void) {
    fixture f;
    /* d_model 8, h 2, d_k 3, d_v 5, d_kv_in 6, T 3, S 7 */
    if (!fixture_make(&f, cfg(8, 2, 0, 3, 5, 6, 1), 2, 3, 7, 1, 401)) return;
    mha_options o = naive_ref_options();
    CHECK(vs_naive(&f, &o) <= 1e-5);
    o.causal = 1, o.align = MHA_ALIGN_BOTTOM_RIGHT;
    CHECK(vs_naive(&f, &o) <= 1e-5);
    fixture_free(&f);
}

static void variants_dv_ne_dk_self(void) {
    fixture f;
    if (!fixture_make(&f, cfg(10, 3, 0, 4, 2, 0, 1), 2, 5, 5, 0, 402)) return;
    mha_options o = naive_ref_options();
    CHECK(vs_naive(&f, &o) <= 1e-5);
    o.causal = 1;
    CHECK(vs_naive(&f, &o) <= 1e-5);
    fixture_free(&f);
}

/* Expands GQA kv weights (h_kv blocks) into MHA weights (h blocks): block r
 * of the result is block r / (h / h_kv) of the source. */
static float *repeat_blocks(const float *src, int rows, int h, int h_kv, int d) {
    if (!src) return NULL;
    float *dst = naive_alloc_floats((size_t)rows * h * d);
    for (int i = 0; i < rows; i++)
        for (int r = 0; r < h; r++)
            memcpy(dst + ((size_t)i * h + r) * d, src + ((size_t)i * h_kv + r / (h / h_kv)) * d,
                   (size_t)d * sizeof(float));
    return dst;
}

/* GQA (and MQA) equals MHA whose K/V weights repeat each kv head per group. */
static void check_gqa_equals_repeated(int h, int h_kv, int add_bias_kv, uint64_t seed) {
    fixture f;
    mha_config c = cfg(16, h, h_kv, 2, 3, 12, 1);
    c.add_bias_kv = add_bias_kv;
    if (!fixture_make(&f, c, 2, 4, 6, 1, seed)) return;
    const mha_config *g = &f.w.cfg;
    naive_weights m = f.w;
    m.cfg.n_kv_heads = h;
    m.w_k = repeat_blocks(f.w.w_k, g->d_kv_in, h, h_kv, g->d_k);
    m.w_v = repeat_blocks(f.w.w_v, g->d_kv_in, h, h_kv, g->d_v);
    m.b_k = repeat_blocks(f.w.b_k, 1, h, h_kv, g->d_k);
    m.b_v = repeat_blocks(f.w.b_v, 1, h, h_kv, g->d_v);
    m.bias_k = repeat_blocks(f.w.bias_k, 1, h, h_kv, g->d_k);
    m.bias_v = repeat_blocks(f.w.bias_v, 1, h, h_kv, g->d_v);
    mha_layer *M = naive_make_layer(&m);
    if (M) {
        mha_options o = naive_ref_options();
        o.causal = 1, o.align = MHA_ALIGN_BOTTOM_RIGHT;
        size_t ny = (size_t)2 * 4 * 16, np = (size_t)2 * h * 4 * (6 + add_bias_kv);
        float *y1 = naive_alloc_floats(ny), *y2 = naive_alloc_floats(ny);
        float *p1 = naive_alloc_floats(np), *p2 = naive_alloc_floats(np);
        mha_capture c1 = {NULL, NULL, p1}, c2 = {NULL, NULL, p2};
        CHECK_OK(mha_forward(f.L, y1, &c1, f.x, f.kv, 2, 4, 6, &o));
        CHECK_OK(mha_forward(M, y2, &c2, f.x, f.kv, 2, 4, 6, &o));
        double dy = test_max_abs_diff(y1, y2, ny), dp = test_max_abs_diff(p1, p2, np);
        if (!(dy <= 1e-5) || !(dp <= 1e-6))
            test_report(__FILE__, __LINE__, "h=%d h_kv=%d: |dy| %.3g, |dprobs| %.3g", h, h_kv,
                        dy, dp);
        double dn = vs_naive(&f, &o);
        if (!(dn <= 1e-5))
            test_report(__FILE__, __LINE__, "h=%d h_kv=%d: vs naive %.3g", h, h_kv, dn);
        free(y1), free(y2), free(p1), free(p2);
        mha_layer_free(M);
    }
    free(m.w_k), free(m.w_v), free(m.b_k), free(m.b_v), free(m.bias_k), free(m.bias_v);
    fixture_free(&f);
}

static void variants_gqa_equals_repeated_mha(void) {
    check_gqa_equals_repeated(8, 2, 0, 403);
    check_gqa_equals_repeated(8, 4, 1, 404);
}

static void variants_mqa_equals_repeated_mha(void) {
    check_gqa_equals_repeated(4, 1, 0, 405);
    check_gqa_equals_repeated(4, 1, 1, 406);
}

/* GQA self-attention with masks and interventions, against the oracle. */
static void variants_gqa_with_options(void) {
    fixture f;
    if (!fixture_make(&f, cfg(12, 6, 3, 2, 0, 0, 1), 2, 5, 5, 0, 407)) return;
    mha_intervention ivs[6];
    for (int r = 0; r < 6; r++) ivs[r] = (mha_intervention){MHA_HEAD_KEEP, 0, NULL};
    ivs[1].op = MHA_HEAD_ZERO;
    ivs[4] = (mha_intervention){MHA_HEAD_SCALE, 1.5f, NULL};
    ivs[5].op = MHA_HEAD_MEAN;
    const uint8_t kk[10] = {1, 1, 1, 0, 1, 1, 1, 1, 1, 0};
    mha_options o = naive_ref_options();
    o.causal = 1, o.window_left = 2;
    o.key_keep = kk;
    o.interventions = ivs;
    CHECK(vs_naive(&f, &o) <= 1e-5);
    /* a keep mask per query head (heads = h), two heads sharing a kv head */
    uint8_t keep[6 * 5 * 5];
    for (int i = 0; i < 6 * 5 * 5; i++) keep[i] = (i * 7 % 11) != 0;
    o.keep_mask = (mha_mask){keep, 1, 6};
    CHECK(vs_naive(&f, &o) <= 1e-5);
    fixture_free(&f);
}

/* Scores in the thousands: the softmax must subtract the row maximum. */
static void variants_large_scores_stable(void) {
    fixture f;
    if (!fixture_make(&f, cfg(8, 2, 0, 0, 0, 0, 1), 2, 5, 5, 0, 413)) return;
    for (int i = 0; i < 2 * 5 * 8; i++) f.x[i] *= 60.0f;
    mha_options o = naive_ref_options();
    float y[80];
    CHECK_OK(mha_forward(f.L, y, NULL, f.x, NULL, 2, 5, 5, &o));
    for (int i = 0; i < 80; i++) CHECK(isfinite(y[i]));
    CHECK(vs_naive(&f, &o) <= 1e-3); /* |y| ~ 50 here: relative 2e-5 */
    fixture_free(&f);
}

/* Hand-derived: d_model 2, one head, identity weights, x = [1, 0]:
 * q = k = v = [1, 0], score s = 1/sqrt(2). */
static void variants_extra_keys_by_hand(void) {
    const float eye[4] = {1, 0, 0, 1}, bk[2] = {0, 1}, bv[2] = {0, 2}, x[2] = {1, 0};
    const double s = 1.0 / sqrt(2.0);
    for (int mode = 0; mode < 3; mode++) {
        mha_config c = mha_config_default(2, 1);
        c.bias = 0;
        c.add_zero_attn = mode != 1;
        c.add_bias_kv = mode != 0;
        mha_weights w = {.w_q = eye, .w_k = eye, .w_v = eye, .w_o = eye, .bias_k = mode ? bk : NULL,
                         .bias_v = mode ? bv : NULL};
        mha_layer *L = NULL;
        CHECK_OK(mha_layer_create(&L, &c, &w));
        if (!L) continue;
        float y[2], p[3];
        mha_options o = naive_ref_options();
        mha_capture cap = {NULL, NULL, p};
        CHECK_OK(mha_forward(L, y, &cap, x, NULL, 1, 1, 1, &o));
        /* keys: k0 = [1,0] (score s), bias key [0,1] (score 0), zero key (score 0) */
        double e0 = exp(s), n = e0 + (c.add_bias_kv ? 1 : 0) + (c.add_zero_attn ? 1 : 0);
        double p0 = e0 / n, pe = 1 / n;
        CHECK_NEAR(p[0], p0, 1e-6);
        CHECK_NEAR(p[1], pe, 1e-6);
        if (mode == 2) CHECK_NEAR(p[2], pe, 1e-6);
        /* z = p0 [1,0] + (bias row) pe [0,2] + (zero row) 0 */
        CHECK_NEAR(y[0], p0, 1e-6);
        CHECK_NEAR(y[1], c.add_bias_kv ? 2 * pe : 0, 1e-6);
        mha_layer_free(L);
    }
}

/* The extra keys are never masked: a fully masked row still sees them. */
static void variants_extra_keys_vs_naive(void) {
    for (int mode = 0; mode < 3; mode++) {
        fixture f;
        mha_config c = cfg(8, 2, 0, 4, 3, 5, 1);
        c.add_zero_attn = mode != 1;
        c.add_bias_kv = mode != 0;
        if (!fixture_make(&f, c, 2, 3, 4, 1, 408 + (uint64_t)mode)) continue;
        mha_options o = naive_ref_options();
        CHECK(vs_naive(&f, &o) <= 1e-5);
        uint8_t keep[3 * 4] = {1, 1, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1}; /* row 1 masked */
        o.keep_mask = (mha_mask){keep, 1, 1};
        o.causal = 1;
        o.masked_row = MHA_MASKED_ROW_NAN; /* must not trigger: extras remain */
        CHECK(vs_naive(&f, &o) <= 1e-5);
        int St = 4 + c.add_bias_kv + c.add_zero_attn;
        float y[2 * 3 * 8], *p = naive_alloc_floats((size_t)2 * 2 * 3 * St);
        mha_capture cap = {NULL, NULL, p};
        CHECK_OK(mha_forward(f.L, y, &cap, f.x, f.kv, 2, 3, 4, &o));
        for (int i = 0; i < 2 * 3 * 8; i++) CHECK(isfinite(y[i]));
        for (int row = 0; row < 2 * 2 * 3; row++) {
            double sum = 0;
            for (int j = 0; j < St; j++) sum += p[row * St + j];
            CHECK_NEAR(sum, 1, 1e-5);
        }
        free(p);
        fixture_free(&f);
    }
}

/* scale = c / sqrt(d_k) equals the default scale with W_Q and b_Q times c. */
static void variants_scale_override(void) {
    fixture f;
    if (!fixture_make(&f, cfg(8, 2, 0, 4, 0, 0, 1), 2, 4, 4, 0, 411)) return;
    mha_options o = naive_ref_options();
    o.scale = 1.7f / 2.0f; /* c = 1.7, sqrt(d_k) = 2 */
    CHECK(vs_naive(&f, &o) <= 1e-5);
    naive_weights m = f.w;
    m.w_q = naive_alloc_floats(64), m.b_q = naive_alloc_floats(8);
    for (int i = 0; i < 64; i++) m.w_q[i] = f.w.w_q[i] * 1.7f;
    for (int i = 0; i < 8; i++) m.b_q[i] = f.w.b_q[i] * 1.7f;
    mha_layer *M = naive_make_layer(&m);
    if (M) {
        float y1[64], y2[64], y3[64];
        mha_options d = naive_ref_options();
        CHECK_OK(mha_forward(f.L, y1, NULL, f.x, NULL, 2, 4, 4, &o));
        CHECK_OK(mha_forward(M, y2, NULL, f.x, NULL, 2, 4, 4, &d));
        CHECK_ARRAY_NEAR(y1, y2, 64, 1e-5);
        CHECK_OK(mha_forward(f.L, y3, NULL, f.x, NULL, 2, 4, 4, &d));
        CHECK(test_max_abs_diff(y1, y3, 64) > 1e-4); /* the override matters */
        mha_layer_free(M);
    }
    free(m.w_q), free(m.b_q);
    fixture_free(&f);
}

/* Self-attention given as kv = x equals kv == NULL. */
static void variants_kv_null_is_self(void) {
    fixture f;
    if (!fixture_make(&f, cfg(8, 2, 0, 0, 0, 0, 1), 2, 5, 5, 0, 412)) return;
    float y1[80], y2[80];
    mha_options o = naive_ref_options();
    CHECK_OK(mha_forward(f.L, y1, NULL, f.x, NULL, 2, 5, 5, &o));
    CHECK_OK(mha_forward(f.L, y2, NULL, f.x, f.x, 2, 5, 5, &o));
    CHECK_ARRAY_NEAR(y1, y2, 80, 0);
    fixture_free(&f);
}

/* ------------------------------------------------ separate value source */

/* A layer with its own value width d_v_in and inputs x (B,T,d_model),
 * k (B,S,d_kv_in) or NULL (keys from x), v (B,S,d_v_in). */
typedef struct {
    naive_weights w;
    mha_layer *L;
    float *x, *k, *v;
    int B, T, S;
} kv_fixture;

static int kv_fixture_make(kv_fixture *f, mha_config c, int B, int T, int S, int keys_from_x,
                           uint64_t seed) {
    c = naive_resolve(c);
    naive_weights_random(&f->w, &c, &seed, 0.7f);
    f->B = B, f->T = T, f->S = S;
    f->x = naive_random_floats((size_t)B * T * c.d_model, &seed, -1.5f, 1.5f);
    f->k = keys_from_x ? NULL : naive_random_floats((size_t)B * S * c.d_kv_in, &seed, -1.5f, 1.5f);
    f->v = naive_random_floats((size_t)B * S * c.d_v_in, &seed, -1.5f, 1.5f);
    f->L = naive_make_layer(&f->w);
    return f->L != NULL;
}

static void kv_fixture_free(kv_fixture *f) {
    mha_layer_free(f->L);
    naive_weights_free(&f->w);
    free(f->x), free(f->k), free(f->v);
}

static double kv_vs_naive(const kv_fixture *f, const mha_options *o) {
    return naive_compare_kv(f->L, &f->w, f->x, f->k, f->v, f->B, f->T, f->S, o);
}

/* Reference vs the naive oracle with v_src != k_src: widths d_v_in !=
 * d_kv_in (and == d_kv_in), with and without biases, MHA and GQA, the
 * extra keys, masks and a causal bottom-right alignment. */
static void variants_separate_value_source(void) {
    static const struct {
        int d_model, h, h_kv, d_k, d_v, d_kv_in, d_v_in, bias, bias_kv, zero_attn;
    } cases[] = {
        {8, 2, 0, 3, 5, 6, 9, 1, 0, 0},  /* d_v_in > d_kv_in */
        {8, 2, 0, 3, 5, 6, 4, 0, 0, 0},  /* d_v_in < d_kv_in, no bias */
        {12, 6, 2, 2, 3, 7, 11, 1, 1, 0}, /* GQA, add_bias_kv */
        {12, 4, 1, 3, 0, 5, 5, 0, 1, 1}, /* MQA, shared width, both extra keys */
        {8, 2, 0, 0, 0, 8, 8, 1, 0, 1},  /* every width = d_model, k_src != v_src */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        mha_config c = cfg(cases[i].d_model, cases[i].h, cases[i].h_kv, cases[i].d_k, cases[i].d_v,
                           cases[i].d_kv_in, cases[i].bias);
        c.d_v_in = cases[i].d_v_in;
        c.add_bias_kv = cases[i].bias_kv, c.add_zero_attn = cases[i].zero_attn;
        kv_fixture f;
        if (!kv_fixture_make(&f, c, 2, 3, 7, 0, 430 + (uint64_t)i)) continue;
        mha_options o = naive_ref_options();
        double d0 = kv_vs_naive(&f, &o);
        o.causal = 1, o.align = MHA_ALIGN_BOTTOM_RIGHT;
        double d1 = kv_vs_naive(&f, &o);
        uint8_t kk[2 * 7] = {1, 1, 0, 1, 1, 1, 0, 0, 1, 1, 1, 0, 1, 1};
        o.key_keep = kk;
        o.causal = 0;
        double d2 = kv_vs_naive(&f, &o);
        if (!(d0 <= 1e-5) || !(d1 <= 1e-5) || !(d2 <= 1e-5))
            test_report(__FILE__, __LINE__, "case %zu: vs naive %.3g, causal %.3g, key_keep %.3g", i,
                        d0, d1, d2);
        kv_fixture_free(&f);
    }
}

/* Keys from x (k_src NULL) with values from a source of another width. */
static void variants_value_source_with_self_keys(void) {
    kv_fixture f;
    mha_config c = cfg(8, 2, 0, 4, 3, 0, 1);
    c.d_v_in = 5;
    if (!kv_fixture_make(&f, c, 2, 4, 4, 1, 440)) return;
    mha_options o = naive_ref_options();
    CHECK(kv_vs_naive(&f, &o) <= 1e-5);
    o.causal = 1;
    CHECK(kv_vs_naive(&f, &o) <= 1e-5);
    kv_fixture_free(&f);
}

/* The value source changes V only: the probabilities are those of keys
 * alone, Y differs from the one-source forward, and mha_forward(kv) equals
 * mha_forward_kv(kv, kv) exactly. */
static void variants_value_source_changes_values_only(void) {
    kv_fixture f;
    mha_config c = cfg(8, 2, 0, 3, 4, 6, 1);
    c.d_v_in = 6; /* same width, so the one-source forward is defined too */
    if (!kv_fixture_make(&f, c, 2, 3, 5, 0, 441)) return;
    enum { NY = 2 * 3 * 8, NP = 2 * 2 * 3 * 5 };
    float y1[NY], y2[NY], y3[NY], p1[NP], p2[NP];
    mha_capture c1 = {NULL, NULL, p1}, c2 = {NULL, NULL, p2};
    for (int path = MHA_PATH_REFERENCE; path <= MHA_PATH_FAST; path++) {
        mha_options o = mha_options_default();
        o.path = (mha_path)path;
        CHECK_OK(mha_forward_kv(f.L, y1, &c1, f.x, f.k, f.v, 2, 3, 5, &o));
        CHECK_OK(mha_forward(f.L, y2, &c2, f.x, f.k, 2, 3, 5, &o));
        CHECK_ARRAY_NEAR(p1, p2, NP, 0);
        CHECK(test_max_abs_diff(y1, y2, NY) > 1e-3);
        CHECK_OK(mha_forward_kv(f.L, y3, NULL, f.x, f.k, f.k, 2, 3, 5, &o));
        CHECK_ARRAY_NEAR(y2, y3, NY, 0);
        CHECK_OK(mha_forward_kv(f.L, y3, NULL, f.x, f.k, NULL, 2, 3, 5, &o));
        CHECK_ARRAY_NEAR(y2, y3, NY, 0);
    }
    kv_fixture_free(&f);
}

/* A consistent head permutation leaves Y unchanged with d_v_in != d_kv_in
 * (W_V has d_v_in rows, not d_kv_in). */
static void variants_value_source_permute(void) {
    kv_fixture f;
    mha_config c = cfg(8, 4, 2, 2, 3, 5, 1);
    c.d_v_in = 7;
    if (!kv_fixture_make(&f, c, 2, 3, 4, 0, 442)) return;
    enum { NY = 2 * 3 * 8 };
    float y0[NY], y1[NY];
    mha_options o = naive_ref_options();
    CHECK_OK(mha_forward_kv(f.L, y0, NULL, f.x, f.k, f.v, 2, 3, 4, &o));
    const int perm[4] = {2, 3, 0, 1};
    CHECK_OK(mha_layer_permute_heads(f.L, perm));
    CHECK_OK(mha_forward_kv(f.L, y1, NULL, f.x, f.k, f.v, 2, 3, 4, &o));
    CHECK_ARRAY_NEAR(y0, y1, NY, 1e-5);
    kv_fixture_free(&f);
}

/* The contract check with separate sources: labels and the residual are
 * verified through mha_layer_check_contract_kv; the one-source form cannot
 * feed this layer and says so; a one-sided W_O permutation is caught. */
static void variants_value_source_contract(void) {
    kv_fixture f;
    mha_config c = cfg(8, 4, 2, 2, 3, 5, 1);
    c.d_v_in = 7;
    if (!kv_fixture_make(&f, c, 2, 3, 4, 0, 443)) return;
    mha_options o = naive_ref_options();
    mha_contract_report rep;
    CHECK_OK(mha_layer_check_contract_kv(f.L, f.x, f.k, f.v, 2, 3, 4, &o, &rep));
    CHECK_INT(rep.residual_checked, 1);
    CHECK(rep.max_residual <= 1e-5);
    CHECK_STATUS(mha_layer_check_contract(f.L, f.x, f.k, 2, 3, 4, &o, &rep), MHA_E_SHAPE);
    CHECK_ERROR_MENTIONS("d_v_in=7");
    const int swap[4] = {1, 0, 2, 3};
    CHECK_OK(mha_layer_permute_block(f.L, MHA_BLOCK_O, swap));
    CHECK_STATUS(mha_layer_check_contract_kv(f.L, f.x, f.k, f.v, 2, 3, 4, &o, &rep), MHA_E_CONTRACT);
    CHECK_INT(rep.labels_ok, 0);
    CHECK_INT(rep.bad_block, MHA_BLOCK_O);
    kv_fixture_free(&f);
}

/* Errors name what is wrong: a missing value source when d_v_in differs,
 * and a non-finite value in v_src; on both paths. */
static void variants_value_source_errors(void) {
    kv_fixture f;
    mha_config c = cfg(8, 2, 0, 4, 0, 6, 1);
    c.d_v_in = 5;
    if (!kv_fixture_make(&f, c, 2, 3, 4, 0, 443)) return;
    float y[2 * 3 * 8];
    for (int path = MHA_PATH_REFERENCE; path <= MHA_PATH_FAST; path++) {
        mha_options o = mha_options_default();
        o.path = (mha_path)path;
        CHECK_STATUS(mha_forward_kv(f.L, y, NULL, f.x, f.k, NULL, 2, 3, 4, &o), MHA_E_SHAPE);
        CHECK_ERROR_MENTIONS("d_v_in=5");
        CHECK_STATUS(mha_forward(f.L, y, NULL, f.x, f.k, 2, 3, 4, &o), MHA_E_SHAPE);
        CHECK_ERROR_MENTIONS("d_v_in");
        f.v[13] = NAN;
        CHECK_STATUS(mha_forward_kv(f.L, y, NULL, f.x, f.k, f.v, 2, 3, 4, &o), MHA_E_NONFINITE);
        CHECK_ERROR_MENTIONS("v_src[13]");
        f.v[13] = 0.25f;
        CHECK_OK(mha_forward_kv(f.L, y, NULL, f.x, f.k, f.v, 2, 3, 4, &o));
    }
    /* keys from x (d_kv_in = d_model) but d_v_in != d_model: v_src is needed */
    mha_config s = cfg(8, 2, 0, 4, 0, 0, 1);
    s.d_v_in = 5;
    kv_fixture g;
    if (kv_fixture_make(&g, s, 1, 3, 3, 1, 444)) {
        mha_options o = naive_ref_options();
        CHECK_STATUS(mha_forward_kv(g.L, y, NULL, g.x, NULL, NULL, 1, 3, 3, &o), MHA_E_SHAPE);
        CHECK_ERROR_MENTIONS("d_v_in");
        CHECK_OK(mha_forward_kv(g.L, y, NULL, g.x, NULL, g.v, 1, 3, 3, &o));
        kv_fixture_free(&g);
    }
    kv_fixture_free(&f);
}

static const test_case cases[] = {
    {"variants_cross_attention", variants_cross_attention},
    {"variants_dv_ne_dk_self", variants_dv_ne_dk_self},
    {"variants_gqa_equals_repeated_mha", variants_gqa_equals_repeated_mha},
    {"variants_mqa_equals_repeated_mha", variants_mqa_equals_repeated_mha},
    {"variants_gqa_with_options", variants_gqa_with_options},
    {"variants_extra_keys_by_hand", variants_extra_keys_by_hand},
    {"variants_extra_keys_vs_naive", variants_extra_keys_vs_naive},
    {"variants_scale_override", variants_scale_override},
    {"variants_kv_null_is_self", variants_kv_null_is_self},
    {"variants_large_scores_stable", variants_large_scores_stable},
    {"variants_separate_value_source", variants_separate_value_source},
    {"variants_value_source_with_self_keys", variants_value_source_with_self_keys},
    {"variants_value_source_changes_values_only", variants_value_source_changes_values_only},
    {"variants_value_source_permute", variants_value_source_permute},
    {"variants_value_source_errors", variants_value_source_errors},
    {"variants_value_source_contract", variants_value_source_contract},
};

const test_case *tests_variants(size_t *count) {
    *count = sizeof cases / sizeof cases[0];
    return cases;
}
