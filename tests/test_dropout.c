/* test_dropout.c — attention dropout (options.dropout_p, dropout_seed:
 * training's dropout on the probabilities, torch's nn.MultiheadAttention
 * dropout). The fast path on every ISA against the reference (y and the
 * captured, dropped probabilities), the draw's statistics (the share
 * dropped is p, and the mean of y over seeds is the layer without
 * dropout: the 1 / (1 - p) scaling is unbiased), the draw is a function of
 * the seed and the entry alone (threads, tiles, paths), and the refusals.
 * The backward with dropout: test_backward.c (finite differences) and
 * test_backward_variants.c (fast and tape against the reference).
 * Legend: B, T, S, Sx = S + extra keys, h, D = d_model. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"
#include "naive.h"
#include "tests.h"

typedef struct {
    const char *what;
    int h, h_kv, B, T, S, cross, bias_kv, sinks, alibi, causal;
    float softcap, p;
} drop_case;

static const drop_case drop_cases[] = {
    {"mha causal", 4, 4, 2, 9, 9, 0, 0, 0, 0, 1, 0.0f, 0.3f},
    {"gqa cross, bias_kv and zero_attn keys", 4, 2, 2, 5, 7, 1, 1, 0, 0, 0, 0.0f, 0.5f},
    {"mqa, sinks, alibi, softcap, causal", 4, 1, 1, 6, 6, 0, 0, 1, 1, 1, 1.5f, 0.1f},
    {"tiles: T 150, S 140 cross", 2, 1, 1, 150, 140, 1, 0, 0, 0, 0, 0.0f, 0.25f},
};

static mha_layer *drop_layer(naive_weights *w, const drop_case *k, uint64_t seed) {
    mha_config c = naive_config(16, k->h, k->h_kv, 0, 0, 1);
    c.add_bias_kv = c.add_zero_attn = k->bias_kv;
    c.sinks = k->sinks, c.alibi = k->alibi, c.softcap = k->softcap;
    c = naive_resolve(c);
    naive_weights_random(w, &c, &seed, 0.8f);
    return naive_make_layer(w);
}

static size_t probs_size(const naive_weights *w, const drop_case *k) {
    const int Sx = k->S + 2 * k->bias_kv;
    return (size_t)k->B * w->cfg.n_heads * k->T * Sx;
}

/* y and probs of the fast path on each kernel set against the reference's,
 * with the same seed; the dropped entries are the same, exactly */
static void dropout_fast_matches_reference(void) {
    for (size_t n = 0; n < sizeof drop_cases / sizeof drop_cases[0]; n++) {
        const drop_case *k = &drop_cases[n];
        naive_weights w;
        mha_layer *L = drop_layer(&w, k, 40 + n);
        uint64_t seed = 7 + n;
        const size_t ny = (size_t)k->B * k->T * 16, np = probs_size(&w, k);
        float *x = naive_random_floats(ny, &seed, -1, 1);
        float *kv = k->cross ? naive_random_floats((size_t)k->B * k->S * 16, &seed, -1, 1) : NULL;
        float *yr = naive_alloc_floats(ny), *yf = naive_alloc_floats(ny);
        float *pr = naive_alloc_floats(np), *pf = naive_alloc_floats(np);
        mha_options o = naive_ref_options();
        o.causal = k->causal, o.dropout_p = k->p, o.dropout_seed = 0x1234567890abcdefull + n;
        mha_capture cr = {NULL, NULL, pr}, cf = {NULL, NULL, pf};
        if (L) CHECK_OK(mha_forward(L, yr, &cr, x, kv, k->B, k->T, k->S, &o));
        o.path = MHA_PATH_FAST;
        if (L) CHECK_OK(mha_forward(L, yf, &cf, x, kv, k->B, k->T, k->S, &o));
        if (test_max_abs_diff(yf, yr, ny) > 2e-5 || test_max_abs_diff(pf, pr, np) > 2e-6)
            test_report(__FILE__, __LINE__, "%s: fast y %.3g, probs %.3g from the reference's (kernels=%s)",
                        k->what, test_max_abs_diff(yf, yr, ny), test_max_abs_diff(pf, pr, np),
                        mha_kernels_get()->name);
        size_t dropped_r = 0, dropped_f = 0;
        for (size_t i = 0; i < np; i++) dropped_r += pr[i] == 0.0f, dropped_f += pf[i] == 0.0f;
        CHECK(dropped_r == dropped_f && dropped_r > 0);
        mha_layer_free(L), naive_weights_free(&w);
        free(x), free(kv), free(yr), free(yf), free(pr), free(pf);
    }
}

/* the share of dropped probabilities is p (within 5 sigma of the binomial)
 * and each kept one is the undropped probability times 1 / (1 - p) */
static void dropout_rate_and_scale(void) {
    const drop_case k = {"rate", 4, 4, 2, 64, 64, 0, 0, 0, 0, 0, 0.0f, 0.3f};
    naive_weights w;
    mha_layer *L = drop_layer(&w, &k, 3);
    uint64_t seed = 5;
    const size_t ny = (size_t)k.B * k.T * 16, np = probs_size(&w, &k);
    float *x = naive_random_floats(ny, &seed, -1, 1), *y = naive_alloc_floats(ny);
    float *p0 = naive_alloc_floats(np), *p1 = naive_alloc_floats(np);
    mha_options o = mha_options_default();
    mha_capture c0 = {NULL, NULL, p0}, c1 = {NULL, NULL, p1};
    if (L) CHECK_OK(mha_forward(L, y, &c0, x, NULL, k.B, k.T, k.S, &o));
    o.dropout_p = k.p, o.dropout_seed = 99;
    if (L) CHECK_OK(mha_forward(L, y, &c1, x, NULL, k.B, k.T, k.S, &o));
    size_t dropped = 0;
    double worst = 0.0;
    for (size_t i = 0; i < np; i++) {
        if (p1[i] == 0.0f) {
            dropped++;
            continue;
        }
        worst = fmax(worst, fabs(p1[i] - p0[i] / (1.0 - k.p)));
    }
    const double mean = k.p * np, sd = sqrt(np * k.p * (1 - k.p));
    if (!(fabs(dropped - mean) <= 5 * sd))
        test_report(__FILE__, __LINE__, "%zu of %zu dropped; expected %.0f +- %.0f (p = %g)", dropped, np, mean,
                    5 * sd, (double)k.p);
    CHECK(worst <= 1e-6);
    mha_layer_free(L), naive_weights_free(&w);
    free(x), free(y), free(p0), free(p1);
}

/* E[y] over seeds is y without dropout: the mean of N draws within 5
 * standard errors (per element, from the draws' own spread) */
static void dropout_unbiased(void) {
    const drop_case k = {"unbiased", 2, 2, 1, 4, 4, 0, 0, 0, 0, 1, 0.0f, 0.4f};
    enum { N = 4000 };
    naive_weights w;
    mha_layer *L = drop_layer(&w, &k, 11);
    uint64_t seed = 6;
    const size_t ny = (size_t)k.B * k.T * 16;
    float *x = naive_random_floats(ny, &seed, -1, 1), *y0 = naive_alloc_floats(ny), *y = naive_alloc_floats(ny);
    double *sum = naive_alloc_doubles(ny), *sq = naive_alloc_doubles(ny);
    mha_options o = mha_options_default();
    o.causal = 1;
    if (L) CHECK_OK(mha_forward(L, y0, NULL, x, NULL, k.B, k.T, k.S, &o));
    o.dropout_p = k.p;
    for (int s = 0; L && s < N; s++) {
        o.dropout_seed = 1000003ull * s;
        CHECK_OK(mha_forward(L, y, NULL, x, NULL, k.B, k.T, k.S, &o));
        for (size_t i = 0; i < ny; i++) sum[i] += y[i], sq[i] += (double)y[i] * y[i];
    }
    double worst = 0.0, spread = 0.0;
    for (size_t i = 0; L && i < ny; i++) {
        const double m = sum[i] / N, se = sqrt(fmax(sq[i] / N - m * m, 0.0) / N);
        worst = fmax(worst, fabs(m - y0[i]) / (se + 1e-7));
        spread = fmax(spread, se);
    }
    if (!(worst <= 5.0)) test_report(__FILE__, __LINE__, "mean of y over %d seeds is %.2f standard errors off", N, worst);
    CHECK(spread > 1e-3); /* the draws differ: the test sees dropout at all */
    mha_layer_free(L), naive_weights_free(&w);
    free(x), free(y0), free(y), free(sum), free(sq);
}

/* one seed, the same bits on 1 and 2 threads; another seed, another y;
 * p = 0 is no dropout to the bit, whatever the seed */
static void dropout_is_a_function_of_the_seed(void) {
    const drop_case *k = &drop_cases[3];
    naive_weights w;
    mha_layer *L = drop_layer(&w, k, 17);
    uint64_t seed = 8;
    const size_t ny = (size_t)k->B * k->T * 16;
    float *x = naive_random_floats(ny, &seed, -1, 1), *kv = naive_random_floats((size_t)k->B * k->S * 16, &seed, -1, 1);
    float *y1 = naive_alloc_floats(ny), *y2 = naive_alloc_floats(ny), *y3 = naive_alloc_floats(ny);
    mha_options o = mha_options_default();
    o.path = MHA_PATH_FAST;
    const int saved = mha_get_num_threads();
    if (L) CHECK_OK(mha_forward(L, y1, NULL, x, kv, k->B, k->T, k->S, &o));
    o.dropout_seed = 12345;
    if (L) CHECK_OK(mha_forward(L, y2, NULL, x, kv, k->B, k->T, k->S, &o));
    CHECK(memcmp(y1, y2, sizeof(float) * ny) == 0);
    o.dropout_p = 0.2f;
    mha_set_num_threads(1);
    if (L) CHECK_OK(mha_forward(L, y2, NULL, x, kv, k->B, k->T, k->S, &o));
    mha_set_num_threads(2);
    if (L) CHECK_OK(mha_forward(L, y3, NULL, x, kv, k->B, k->T, k->S, &o));
    mha_set_num_threads(saved);
    CHECK(memcmp(y2, y3, sizeof(float) * ny) == 0);
    CHECK(test_max_abs_diff(y1, y2, ny) > 1e-3);
    o.dropout_seed = 12346;
    if (L) CHECK_OK(mha_forward(L, y3, NULL, x, kv, k->B, k->T, k->S, &o));
    CHECK(test_max_abs_diff(y2, y3, ny) > 1e-3);
    mha_layer_free(L), naive_weights_free(&w);
    free(x), free(kv), free(y1), free(y2), free(y3);
}

/* p outside [0, 1) named; the entries without dropout refuse it */
static void dropout_refusals(void) {
    const drop_case *k = &drop_cases[0];
    naive_weights w;
    mha_layer *L = drop_layer(&w, k, 19);
    uint64_t seed = 9;
    const size_t ny = (size_t)k->B * k->T * 16;
    float *x = naive_random_floats(ny, &seed, -1, 1), *y = naive_alloc_floats(ny);
    float *lse = naive_alloc_floats((size_t)k->B * k->h * k->T);
    mha_options o = mha_options_default();
    const float bad[] = {-0.1f, 1.0f, 1.5f, NAN};
    for (int i = 0; L && i < 4; i++) {
        o.dropout_p = bad[i];
        CHECK_STATUS(mha_forward(L, y, NULL, x, NULL, k->B, k->T, k->T, &o), MHA_E_ARG);
        CHECK_ERROR_MENTIONS("options.dropout_p=");
        CHECK_ERROR_MENTIONS("expected 0 <= p < 1");
    }
    o.dropout_p = 0.1f;
    if (L) {
        CHECK_STATUS(mha_forward_lse(L, y, NULL, lse, x, NULL, NULL, k->B, k->T, k->T, &o), MHA_E_UNSUPPORTED);
        CHECK_ERROR_MENTIONS("mha_forward_lse: options.dropout_p=0.1 is not supported here");
        mha_cache *cache = NULL;
        CHECK_OK(mha_cache_create(&cache, L, k->B, 16, MHA_CACHE_F32, 0));
        CHECK_STATUS(mha_forward_cached(L, cache, y, NULL, x, k->T, NULL, &o), MHA_E_UNSUPPORTED);
        CHECK_ERROR_MENTIONS("mha_forward_cached: options.dropout_p");
        mha_cache_free(cache);
    }
    mha_layer_free(L), naive_weights_free(&w);
    free(x), free(y), free(lse);
}

static const test_case cases[] = {
    {"dropout_rate_and_scale", dropout_rate_and_scale},
    {"dropout_unbiased", dropout_unbiased},
    {"dropout_refusals", dropout_refusals},
};

static const test_case isa_cases[] = {
    {"dropout_fast_matches_reference", dropout_fast_matches_reference},
    {"dropout_is_a_function_of_the_seed", dropout_is_a_function_of_the_seed},
};

const test_case *tests_dropout(size_t *count) {
    *count = sizeof cases / sizeof cases[0];
    return cases;
}

const test_case *tests_dropout_isa(size_t *count) {
    *count = sizeof isa_cases / sizeof isa_cases[0];
    return isa_cases;
}
