/* test_overflow.c — no silently wrong number from the fp32 paths (issue 9,
 * item 4): where scores may leave the range fp32 keeps accurate
 * (MHA_FAST_SCORE_LIMIT) or a sum overflows, MHA_PATH_FAST and the cached
 * forward fail with MHA_E_NONFINITE naming the position, and
 * MHA_PATH_AUTO recomputes the call with the reference. A fuzz over
 * magnitudes 1e-30 .. 1e30 in inputs and weights holds every path to
 * that rule. Legend: B batch, T tokens, D = d_model, h heads. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "naive.h"
#include "test_util.h"
#include "tests.h"

/* The issue's case: one element of x at 1e22 (d_model 8, 2 heads). */
static void test_overflow_issue9(void) {
    const int B = 1, T = 6, D = 8;
    mha_config rc = naive_resolve(mha_config_default(D, 2));
    naive_weights w;
    uint64_t seed = 11;
    naive_weights_random(&w, &rc, &seed, 0.5f);
    mha_layer *L = naive_make_layer(&w);
    float *x = naive_random_floats((size_t)B * T * D, &seed, -1.0f, 1.0f);
    x[3 * D + 5] = 1e22f; /* x[0,3,5] */
    float *yr = naive_alloc_floats((size_t)B * T * D), *ya = naive_alloc_floats((size_t)B * T * D);
    float *yf = naive_alloc_floats((size_t)B * T * D);
    double *yn = naive_alloc_doubles((size_t)B * T * D);
    mha_options o = mha_options_default();
    o.path = MHA_PATH_REFERENCE;
    CHECK_OK(mha_forward(L, yr, NULL, x, NULL, B, T, T, &o));
    naive_forward(yn, NULL, NULL, &w, x, NULL, B, T, T, NULL);
    double scale = 0.0; /* the reference matches the independent double oracle */
    for (int i = 0; i < B * T * D; i++) scale = fmax(scale, fabs(yn[i]));
    CHECK(naive_max_diff(yr, yn, (size_t)B * T * D) <= 1e-6 * scale);
    o.path = MHA_PATH_AUTO; /* recomputed by the reference: the same bits */
    CHECK_OK(mha_forward(L, ya, NULL, x, NULL, B, T, T, &o));
    CHECK(memcmp(ya, yr, sizeof(float) * B * T * D) == 0);
    o.path = MHA_PATH_FAST; /* refused, naming where */
    CHECK_STATUS(mha_forward(L, yf, NULL, x, NULL, B, T, T, &o), MHA_E_NONFINITE);
    CHECK(strstr(mha_last_error(), "batch 0 head") != NULL);
    /* the cached path refuses before appending anything */
    mha_cache *c = NULL;
    CHECK_OK(mha_cache_create(&c, L, B, T, MHA_CACHE_F32, 0));
    if (c) {
        CHECK_STATUS(mha_forward_cached(L, c, yf, NULL, x, T, NULL, NULL), MHA_E_NONFINITE);
        CHECK(strstr(mha_last_error(), "nothing was appended") != NULL);
        CHECK_INT(mha_cache_length(c, 0), 0);
        x[3 * D + 5] = 0.5f; /* a sane prompt still runs on the same cache */
        CHECK_OK(mha_forward_cached(L, c, yf, NULL, x, T, NULL, NULL));
        CHECK_INT(mha_cache_length(c, 0), T);
    }
    mha_cache_free(c);
    free(x), free(yr), free(ya), free(yf), free(yn);
    mha_layer_free(L);
    naive_weights_free(&w);
}

/* 10^e for e uniform in [lo, hi]. */
static float magnitude(uint64_t *seed, float lo, float hi) {
    float e;
    test_fill_uniform(&e, 1, seed, lo, hi);
    return powf(10.0f, e);
}

/* |a - b| <= tol * max|b| element-wise, non-finite equal only to itself. */
static int close_to(const float *a, const float *b, size_t n, double tol) {
    double big = 0.0;
    for (size_t i = 0; i < n; i++)
        if (isfinite(b[i])) big = fmax(big, fabs(b[i]));
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(a[i]) || !isfinite(b[i])) {
            if (!(a[i] == b[i] || (isnan(a[i]) && isnan(b[i])))) return 0;
        } else if (!(fabs((double)a[i] - b[i]) <= tol * big + 1e-30)) {
            return 0;
        }
    }
    return 1;
}

/* Inputs and weights scaled by 10^e, e in [-30, 30]: AUTO equals the
 * reference (bits, when it recomputed) or is within 5% of its largest
 * output (the fp32 error MHA_FAST_SCORE_LIMIT allows: 1.6% per
 * probability, a few rounding steps more through W_O); FAST and the cached
 * path return that or MHA_E_NONFINITE, never another number. */
static void test_overflow_fuzz(void) {
    const int B = 2, T = 7, D = 16, h = 4;
    uint64_t seed = 2024;
    int refused = 0, ran = 0;
    for (int it = 0; it < 60; it++) {
        mha_config c = mha_config_default(D, h);
        c.bias = 1;
        c.n_kv_heads = it % 2 ? 2 : 4;
        mha_config rc = naive_resolve(c);
        naive_weights w;
        naive_weights_random(&w, &rc, &seed, magnitude(&seed, -30.0f, 30.0f));
        mha_layer *L = naive_make_layer(&w);
        float *x = naive_random_floats((size_t)B * T * D, &seed, -1.0f, 1.0f);
        const float xs = magnitude(&seed, -30.0f, 30.0f);
        const int outliers = it % 3 == 0; /* every 5th element at its own magnitude */
        for (int i = 0; i < B * T * D; i++) x[i] *= outliers && i % 5 == 0 ? magnitude(&seed, -30.0f, 30.0f) : xs;
        float *yr = naive_alloc_floats((size_t)B * T * D), *ya = naive_alloc_floats((size_t)B * T * D);
        float *yf = naive_alloc_floats((size_t)B * T * D), *yc = naive_alloc_floats((size_t)B * T * D);
        mha_options o = mha_options_default();
        o.causal = 1;
        o.path = MHA_PATH_REFERENCE;
        CHECK_OK(mha_forward(L, yr, NULL, x, NULL, B, T, T, &o));
        o.path = MHA_PATH_AUTO;
        CHECK_OK(mha_forward(L, ya, NULL, x, NULL, B, T, T, &o));
        if (!close_to(ya, yr, (size_t)B * T * D, 0.05))
            test_report(__FILE__, __LINE__, "case %d: AUTO differs from the reference", it);
        o.path = MHA_PATH_FAST;
        mha_status s = mha_forward(L, yf, NULL, x, NULL, B, T, T, &o);
        CHECK(s == MHA_OK || s == MHA_E_NONFINITE);
        if (s == MHA_OK && !close_to(yf, yr, (size_t)B * T * D, 0.05))
            test_report(__FILE__, __LINE__, "case %d: FAST returned a wrong number silently", it);
        refused += s != MHA_OK, ran += s == MHA_OK;
        mha_cache *cache = NULL;
        CHECK_OK(mha_cache_create(&cache, L, B, T, MHA_CACHE_F32, 0));
        s = cache ? mha_forward_cached(L, cache, yc, NULL, x, T, NULL, NULL) : MHA_E_NOMEM;
        CHECK(s == MHA_OK || s == MHA_E_NONFINITE);
        if (s == MHA_OK && !close_to(yc, yr, (size_t)B * T * D, 0.05))
            test_report(__FILE__, __LINE__, "case %d: the cached path returned a wrong number silently", it);
        mha_cache_free(cache);
        free(x), free(yr), free(ya), free(yf), free(yc);
        mha_layer_free(L);
        naive_weights_free(&w);
    }
    if (!(refused > 5 && ran > 5)) /* the fuzz reaches both sides of the limit */
        test_report(__FILE__, __LINE__, "refused %d, ran %d; expected both > 5", refused, ran);
}

/* The fast path's range rule at its border: identity projections make
 * q = k = x, so a row of x holding a alone gives the bound a^2 scale
 * exactly; a bound 0.1% under MHA_FAST_SCORE_LIMIT runs, 0.1% over is
 * refused naming the head and its query row, on every thread count. */
static void test_overflow_limit_border(void) {
    const int B = 2, T = 5, D = 16, h = 2, d_k = D / h;
    mha_config rc = naive_resolve(mha_config_default(D, h));
    naive_weights w;
    naive_weights_zero(&w, &rc);
    for (int i = 0; i < D; i++) w.w_q[i * D + i] = w.w_k[i * D + i] = w.w_v[i * D + i] = w.w_o[i * D + i] = 1.0f;
    mha_layer *L = naive_make_layer(&w);
    const double scale = 1.0 / sqrt((double)d_k);
    const double rel[4] = {0.999, 1.001, 0.9, 1.3};
    const int saved = mha_get_num_threads();
    for (int c = 0; c < 4; c++)
        for (int nt = 1; nt <= 2; nt++) {
            float *x = naive_alloc_floats((size_t)B * T * D), *y = naive_alloc_floats((size_t)B * T * D);
            for (int i = 0; i < B * T * D; i++) x[i] = 0.01f * (float)(i % 7);
            const int row = 3; /* batch 1, query 3, head 1's first column */
            x[((size_t)1 * T + row) * D + d_k] = (float)sqrt(131072.0 /* MHA_FAST_SCORE_LIMIT */ * rel[c] / scale);
            mha_set_num_threads(nt);
            mha_options o = mha_options_default();
            o.path = MHA_PATH_FAST;
            mha_status s = mha_forward(L, y, NULL, x, NULL, B, T, T, &o);
            if (rel[c] < 1.0) {
                CHECK_OK(s);
            } else {
                CHECK_STATUS(s, MHA_E_NONFINITE);
                CHECK(strstr(mha_last_error(), "batch 1 head 1") != NULL);
                CHECK(strstr(mha_last_error(), "at query 3") != NULL);
            }
            free(x), free(y);
        }
    mha_set_num_threads(saved);
    mha_layer_free(L);
    naive_weights_free(&w);
}

/* A non-finite output is named by its first index, also when it lies in
 * the second thread's part of the scan: y (2, 4096, 16) with W_O = I plus
 * 3e38 from z[., 5] into y[., 9]; every key of batch 1 has v[., 5] = 2, so
 * z[., 5] = 2 and y[., 9] = Inf on each of its rows, batch 0 stays 0: the
 * first bad element is y[4096 * 16 + 9] = y[65545], past the middle. */
static void test_overflow_output_first_index(void) {
    const int B = 2, T = 4096, D = 16, h = 2;
    mha_config rc = naive_resolve(mha_config_default(D, h));
    naive_weights w;
    naive_weights_zero(&w, &rc);
    for (int i = 0; i < D; i++) w.w_q[i * D + i] = w.w_k[i * D + i] = w.w_v[i * D + i] = w.w_o[i * D + i] = 1.0f;
    w.w_o[5 * D + 9] = 3e38f;
    mha_layer *L = naive_make_layer(&w);
    float *x = naive_alloc_floats((size_t)B * T * D), *y = naive_alloc_floats((size_t)B * T * D);
    for (int r = T; r < B * T; r++) x[(size_t)r * D + 5] = 2.0f;
    const int saved = mha_get_num_threads();
    for (int nt = 1; nt <= 2; nt++) {
        mha_set_num_threads(nt);
        mha_options o = mha_options_default();
        o.path = MHA_PATH_FAST;
        CHECK_STATUS(mha_forward(L, y, NULL, x, NULL, B, T, T, &o), MHA_E_NONFINITE);
        CHECK(strstr(mha_last_error(), "y[65545] = inf") != NULL);
    }
    mha_set_num_threads(saved);
    free(x), free(y);
    mha_layer_free(L);
    naive_weights_free(&w);
}


/* A layer (d_model 8, one head, d_k = d_v = 4) whose q reads x's first
 * four dims and whose k and v read its last four (y = z in the first
 * four): each token's query and key are set apart. */
static mha_layer *split_layer(void) {
    enum { D = 8, DK = 4 };
    static float wq[D * DK], wk[D * DK], wo[DK * D];
    memset(wq, 0, sizeof wq), memset(wk, 0, sizeof wk), memset(wo, 0, sizeof wo);
    for (int i = 0; i < DK; i++) {
        wq[(size_t)i * DK + i] = 1.0f;        /* q = x[0:4] */
        wk[(size_t)(DK + i) * DK + i] = 1.0f; /* k = v = x[4:8] */
        wo[(size_t)i * D + i] = 1.0f;
    }
    mha_config c = mha_config_default(D, 1);
    c.d_k = c.d_v = DK, c.bias = 0;
    const mha_weights w = {.w_q = wq, .w_k = wk, .w_v = wk, .w_o = wo};
    mha_layer *L = NULL;
    CHECK_OK(mha_layer_create(&L, &c, &w));
    return L;
}

/* x (n, 8) of tokens: query magnitude q, key magnitude k, in dims 0 / 4 */
static void split_tokens(float *x, int n, float q, float k) {
    for (int t = 0; t < n; t++)
        for (int e = 0; e < 8; e++) x[t * 8 + e] = e == 0 ? q : e == 4 ? k : 0.01f * (float)(t + e);
}

/* fp16 storage overflows at 65520: K or V that large is refused before
 * anything is appended (it was stored as inf: a silently wrong Y for K,
 * a stuck sequence for V); fp32 and int8 caches hold it. */
static void test_overflow_cache_f16_range(void) {
    mha_layer *L = split_layer();
    if (!L) return;
    float x[2 * 8], y[2 * 8];
    split_tokens(x, 2, 1e-6f, 1.0f);
    x[8 + 5] = 70000.0f; /* token 1's key and value, dim 1 */
    const mha_cache_dtype kinds[3][2] = {{MHA_CACHE_F16, MHA_CACHE_F32}, {MHA_CACHE_F32, MHA_CACHE_F16},
                                         {MHA_CACHE_F16, MHA_CACHE_F16}};
    for (int i = 0; i < 3; i++) {
        mha_cache *c = NULL;
        CHECK_OK(mha_cache_create_kv(&c, L, 1, 8, kinds[i][0], kinds[i][1], 0));
        if (!c) continue;
        CHECK_STATUS(mha_forward_cached(L, c, y, NULL, x, 2, NULL, NULL), MHA_E_NONFINITE);
        CHECK_ERROR_MENTIONS(kinds[i][0] == MHA_CACHE_F16 ? "K of sequence 0 kv head 0 reaches 70000" : "V of sequence 0");
        CHECK_ERROR_MENTIONS("float16's largest 65504");
        CHECK_INT(mha_cache_length(c, 0), 0);
        x[8 + 5] = 65000.0f; /* below the limit: stored (as 64992) */
        CHECK_OK(mha_forward_cached(L, c, y, NULL, x, 2, NULL, NULL));
        CHECK(isfinite(y[8 + 1]) && fabsf(y[8 + 1]) > 1000.0f);
        x[8 + 5] = 70000.0f;
        mha_cache_free(c);
    }
    const mha_cache_dtype wide[2] = {MHA_CACHE_F32, MHA_CACHE_I8};
    for (int i = 0; i < 2; i++) {
        mha_cache *c = NULL;
        CHECK_OK(mha_cache_create(&c, L, 1, 8, wide[i], 0));
        if (c) CHECK_OK(mha_forward_cached(L, c, y, NULL, x, 2, NULL, NULL));
        mha_cache_free(c);
    }
    /* the low-level append, the same rule */
    mha_cache *c = NULL;
    CHECK_OK(mha_cache_create(&c, L, 1, 8, MHA_CACHE_F16, 0));
    float k[4] = {1, 2, -70000.0f, 4}, v[4] = {1, 2, 3, 4};
    if (c) {
        CHECK_STATUS(mha_cache_append(c, k, v, 1, NULL), MHA_E_NONFINITE);
        CHECK_ERROR_MENTIONS("mha_cache_append: k[2] = -70000 (sequence 0) is beyond float16's largest 65504");
        k[2] = -65000.0f;
        CHECK_OK(mha_cache_append(c, k, v, 1, NULL));
    }
    mha_cache_free(c);
    mha_layer_free(L);
}

/* The score bound counts the keys the cache still holds: a large key
 * rolled back by truncate, or overwritten in the ring, no longer refuses a
 * later query (kmax only grew since the last reset). */
static void test_overflow_cache_bound_forgets(void) {
    mha_layer *L = split_layer();
    if (!L) return;
    float x[6 * 8], y[6 * 8], y_fresh[8]; /* y: a call's T rows */
    split_tokens(x, 6, 0.1f, 0.2f);
    float outlier[8], query[8];
    split_tokens(outlier, 1, 0.0f, 2000.0f); /* key 2000, query 0 */
    split_tokens(query, 1, 400.0f, 0.3f);     /* |q| 400: 400 * 2000 / 2 past 131072 */
    mha_cache *c = NULL, *fresh = NULL;
    CHECK_OK(mha_cache_create(&c, L, 1, 8, MHA_CACHE_F32, 0));
    CHECK_OK(mha_cache_create(&fresh, L, 1, 8, MHA_CACHE_F32, 0));
    if (c && fresh) {
        CHECK_OK(mha_forward_cached(L, c, y, NULL, x, 1, NULL, NULL));
        CHECK_OK(mha_forward_cached(L, c, y, NULL, outlier, 1, NULL, NULL));
        CHECK_STATUS(mha_forward_cached(L, c, y, NULL, query, 1, NULL, NULL), MHA_E_NONFINITE); /* a real excess */
        CHECK_ERROR_MENTIONS("may reach");
        CHECK_OK(mha_cache_truncate(c, 0, 1)); /* the outlier is rolled back */
        CHECK_OK(mha_forward_cached(L, c, y, NULL, query, 1, NULL, NULL));
        CHECK_OK(mha_forward_cached(L, fresh, y_fresh, NULL, x, 1, NULL, NULL));
        CHECK_OK(mha_forward_cached(L, fresh, y_fresh, NULL, query, 1, NULL, NULL));
        CHECK(memcmp(y, y_fresh, sizeof y_fresh) == 0); /* as if the outlier had never been */
    }
    mha_cache_free(c);
    mha_cache_free(fresh);
    /* a ring of 4 slots keeping 2 tokens: while the outlier is stored, a
     * truncate could bring it back into the window, so it still counts;
     * once overwritten, the query runs */
    CHECK_OK(mha_cache_create(&c, L, 1, 4, MHA_CACHE_F32, 2));
    if (c) {
        CHECK_OK(mha_forward_cached(L, c, y, NULL, outlier, 1, NULL, NULL)); /* position 0 */
        CHECK_OK(mha_forward_cached(L, c, y, NULL, x, 3, NULL, NULL));       /* 1, 2, 3 */
        CHECK_STATUS(mha_forward_cached(L, c, y, NULL, query, 1, NULL, NULL), MHA_E_NONFINITE);
        CHECK_OK(mha_cache_truncate(c, 0, 1)); /* the window of position 1 reads position 0 again */
        CHECK_STATUS(mha_forward_cached(L, c, y, NULL, query, 1, NULL, NULL), MHA_E_NONFINITE);
        CHECK_OK(mha_forward_cached(L, c, y, NULL, x, 3, NULL, NULL)); /* 1, 2, 3 */
        CHECK_OK(mha_forward_cached(L, c, y, NULL, x + 24, 1, NULL, NULL)); /* 4 overwrites the outlier's slot */
        CHECK_OK(mha_forward_cached(L, c, y, NULL, query, 1, NULL, NULL)); /* 5 */
        mha_options o = naive_ref_options(); /* the same window through the uncached reference */
        o.causal = 1, o.window_left = 1;
        float seq[6 * 8], ys[6 * 8];
        memcpy(seq, outlier, sizeof outlier), memcpy(seq + 8, x, 32 * sizeof(float));
        memcpy(seq + 40, query, sizeof query);
        CHECK_OK(mha_forward(L, ys, NULL, seq, NULL, 1, 6, 6, &o));
        for (int e = 0; e < 8; e++) CHECK(fabsf(y[e] - ys[40 + e]) <= 1e-5f * (1.0f + fabsf(ys[40 + e])));
    }
    mha_cache_free(c);
    mha_layer_free(L);
}

/* A NaN in sequence 1's rows is named at x's own index, with the sequence
 * (not at its index within that sequence, which sequence 0 shares). */
static void test_overflow_cache_x_index(void) {
    mha_layer *L = split_layer();
    mha_cache *c = NULL;
    if (L) CHECK_OK(mha_cache_create(&c, L, 2, 8, MHA_CACHE_F32, 0));
    if (c) {
        float x[2 * 3 * 8], y[2 * 3 * 8];
        split_tokens(x, 6, 0.1f, 0.2f);
        x[1 * 24 + 1 * 8 + 3] = NAN; /* x[1, 1, 3]: index 35 */
        CHECK_STATUS(mha_forward_cached(L, c, y, NULL, x, 3, NULL, NULL), MHA_E_NONFINITE);
        CHECK_ERROR_MENTIONS("x[35] = nan (sequence 1)");
        CHECK_INT(mha_cache_length(c, 0), 0);
    }
    mha_cache_free(c);
    mha_layer_free(L);
}

static const test_case cases[] = {
    {"overflow_issue9", test_overflow_issue9},
    {"overflow_fuzz", test_overflow_fuzz},
    {"overflow_limit_border", test_overflow_limit_border},
    {"overflow_output_first_index", test_overflow_output_first_index},
    {"overflow_cache_f16_range", test_overflow_cache_f16_range},
    {"overflow_cache_bound_forgets", test_overflow_cache_bound_forgets},
    {"overflow_cache_x_index", test_overflow_cache_x_index},
};

const test_case *tests_overflow(size_t *count) {
    *count = sizeof cases / sizeof cases[0];
    return cases;
}
