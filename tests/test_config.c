/* test_config.c — configuration defaults and resolution, option defaults,
 * status strings, layer creation, weight views and the plain MHA forward
 * against the naive oracle. */
#include <stdlib.h>
#include <string.h>

#include "naive.h"
#include "tests.h"

static void config_default_and_resolve(void) {
    mha_config c = mha_config_default(768, 12), r;
    CHECK_INT(c.d_model, 768);
    CHECK_INT(c.n_heads, 12);
    CHECK_OK(mha_config_resolve(&r, &c));
    CHECK_INT(r.n_kv_heads, 12);
    CHECK_INT(r.d_k, 64);
    CHECK_INT(r.d_v, 64);
    CHECK_INT(r.d_kv_in, 768);
    /* in is not touched when out differs */
    CHECK_INT(c.d_model, 768);
    CHECK_INT(c.n_heads, 12);
}

static void config_resolve_keeps_explicit_fields(void) {
    mha_config c = mha_config_default(32, 8);
    c.n_kv_heads = 2;
    c.d_v = 3;
    c.d_kv_in = 20;
    CHECK_OK(mha_config_resolve(&c, &c)); /* out may equal in */
    CHECK_INT(c.d_model, 32);
    CHECK_INT(c.n_heads, 8);
    CHECK_INT(c.n_kv_heads, 2);
    CHECK_INT(c.d_k, 4);
    CHECK_INT(c.d_v, 3);
    CHECK_INT(c.d_kv_in, 20);
    /* d_v = 0 follows an explicit d_k, not d_model / h */
    c = mha_config_default(32, 8);
    c.d_k = 5;
    CHECK_OK(mha_config_resolve(&c, &c));
    CHECK_INT(c.d_k, 5);
    CHECK_INT(c.d_v, 5);
}

/* h need only divide d_model when d_k is derived from it. */
static void config_explicit_dk_needs_no_divisibility(void) {
    mha_config c = mha_config_default(10, 3);
    c.d_k = 4;
    CHECK_OK(mha_config_resolve(&c, &c));
    CHECK_INT(c.d_k, 4);
    CHECK_INT(c.d_v, 4);
}

static void options_default_fields(void) {
    mha_options o = mha_options_default();
    CHECK(o.scale == 0.0f);
    CHECK_INT(o.causal, 0);
    CHECK_INT(o.align, MHA_ALIGN_TOP_LEFT);
    CHECK(o.window_left < 0);
    CHECK(o.window_right < 0);
    CHECK(o.keep_mask.data == NULL);
    CHECK(o.additive_mask.data == NULL);
    CHECK(o.key_keep == NULL);
    CHECK(o.key_additive == NULL);
    CHECK_INT(o.masked_row, MHA_MASKED_ROW_ZERO);
    CHECK(o.interventions == NULL);
    CHECK_INT(o.path, MHA_PATH_AUTO);
}

static void status_strings_distinct(void) {
    const mha_status all[] = {MHA_OK,          MHA_E_ARG,      MHA_E_SHAPE,
                              MHA_E_NOMEM,     MHA_E_CONTRACT, MHA_E_NONFINITE,
                              MHA_E_IO,        MHA_E_FORMAT,   MHA_E_UNSUPPORTED};
    size_t n = sizeof all / sizeof all[0];
    for (size_t i = 0; i < n; i++) {
        const char *s = mha_status_str(all[i]);
        CHECK(s != NULL && s[0] != '\0');
        for (size_t j = 0; j < i && s; j++) CHECK(strcmp(s, mha_status_str(all[j])) != 0);
    }
    CHECK(mha_status_str((mha_status)-99) != NULL);
    CHECK(mha_last_error() != NULL);
}

static void layer_config_is_resolved(void) {
    mha_config c = mha_config_default(12, 3);
    c.bias = 0;
    mha_layer *L = NULL;
    CHECK_OK(mha_layer_create(&L, &c, NULL));
    if (!L) return;
    const mha_config *r = mha_layer_config(L);
    CHECK_INT(r->d_k, 4);
    CHECK_INT(r->d_v, 4);
    CHECK_INT(r->n_kv_heads, 3);
    CHECK_INT(r->d_kv_in, 12);
    mha_layer_free(L);
    mha_layer_free(NULL); /* free(NULL) semantics */
}

/* w == NULL gives all-zero weights: Y = 0 for any x. */
static void layer_null_weights_give_zero(void) {
    mha_config c = mha_config_default(8, 2);
    mha_layer *L = NULL;
    CHECK_OK(mha_layer_create(&L, &c, NULL));
    if (!L) return;
    uint64_t seed = 3;
    float *x = naive_random_floats(2 * 3 * 8, &seed, -1, 1), y[48];
    mha_options o = naive_ref_options();
    memset(y, 0x7f, sizeof y);
    CHECK_OK(mha_forward(L, y, NULL, x, NULL, 2, 3, 3, &o));
    for (int i = 0; i < 48; i++) CHECK_NEAR(y[i], 0, 0);
    mha_layer_free(L);
    free(x);
}

/* Weights are copied: the view shows them, and changing the caller's
 * arrays afterwards changes nothing. */
static void layer_copies_weights(void) {
    mha_config c = naive_resolve(mha_config_default(8, 2));
    c.bias = 1;
    naive_weights w;
    uint64_t seed = 11;
    naive_weights_random(&w, &c, &seed, 0.5f);
    mha_layer *L = naive_make_layer(&w);
    if (!L) return;
    mha_weights v;
    mha_layer_get_weights(L, &v);
    CHECK_ARRAY_NEAR(v.w_q, w.w_q, 64, 0);
    CHECK_ARRAY_NEAR(v.w_k, w.w_k, 64, 0);
    CHECK_ARRAY_NEAR(v.w_v, w.w_v, 64, 0);
    CHECK_ARRAY_NEAR(v.w_o, w.w_o, 64, 0);
    CHECK_ARRAY_NEAR(v.b_q, w.b_q, 8, 0);
    CHECK_ARRAY_NEAR(v.b_k, w.b_k, 8, 0);
    CHECK_ARRAY_NEAR(v.b_v, w.b_v, 8, 0);
    CHECK_ARRAY_NEAR(v.b_o, w.b_o, 8, 0);
    CHECK(v.w_q != w.w_q);
    float *x = naive_random_floats(1 * 4 * 8, &seed, -1, 1), y1[32], y2[32];
    mha_options o = naive_ref_options();
    CHECK_OK(mha_forward(L, y1, NULL, x, NULL, 1, 4, 4, &o));
    w.w_o[3] += 1.0f;
    w.b_q[0] += 1.0f;
    CHECK_OK(mha_forward(L, y2, NULL, x, NULL, 1, 4, 4, &o));
    CHECK_ARRAY_NEAR(y2, y1, 32, 0);
    mha_layer_free(L);
    naive_weights_free(&w);
    free(x);
}

static void layer_set_weights_replaces(void) {
    mha_config c = naive_resolve(mha_config_default(8, 2));
    c.bias = 1;
    naive_weights w1, w2;
    uint64_t seed = 12;
    naive_weights_random(&w1, &c, &seed, 0.5f);
    naive_weights_random(&w2, &c, &seed, 0.5f);
    mha_layer *L = naive_make_layer(&w1);
    if (!L) return;
    mha_weights v2 = naive_weights_view(&w2);
    CHECK_OK(mha_layer_set_weights(L, &v2));
    float *x = naive_random_floats(2 * 3 * 8, &seed, -1, 1);
    mha_options o = naive_ref_options();
    CHECK(naive_compare(L, &w2, x, NULL, 2, 3, 3, &o) <= 1e-5);
    mha_layer_free(L);
    naive_weights_free(&w1);
    naive_weights_free(&w2);
    free(x);
}

/* bias = 0 means "all biases are zero". mha.h says biases "may be NULL"
 * then; bias pointers passed anyway are either ignored or rejected with a
 * message naming them, never silently used. */
static void layer_bias0_ignores_bias_pointers(void) {
    mha_config c = naive_resolve(mha_config_default(8, 2));
    c.bias = 1;
    naive_weights wb;
    uint64_t seed = 13;
    naive_weights_random(&wb, &c, &seed, 0.5f);
    mha_config c0 = c;
    c0.bias = 0;
    mha_weights v = naive_weights_view(&wb);
    mha_layer *L = NULL;
    mha_status st = mha_layer_create(&L, &c0, &v);
    if (st == MHA_E_ARG) {
        CHECK_ERROR_MENTIONS("b_q");
        CHECK(L == NULL);
        v.b_q = v.b_k = v.b_v = v.b_o = NULL;
        naive_weights_free(&wb);
        return;
    }
    CHECK_OK(st);
    if (!L) return;
    naive_weights w0 = wb; /* same matrices, no biases */
    w0.cfg = c0;
    w0.b_q = w0.b_k = w0.b_v = w0.b_o = NULL;
    float *x = naive_random_floats(1 * 5 * 8, &seed, -1, 1);
    mha_options o = naive_ref_options();
    CHECK(naive_compare(L, &w0, x, NULL, 1, 5, 5, &o) <= 1e-5);
    mha_layer_free(L);
    naive_weights_free(&wb);
    free(x);
}

static void forward_mha_matches_naive(void) {
    for (int bias = 0; bias <= 1; bias++) {
        mha_config c = naive_resolve(mha_config_default(16, 4));
        c.bias = bias;
        naive_weights w;
        uint64_t seed = 20 + (uint64_t)bias;
        naive_weights_random(&w, &c, &seed, 0.5f);
        mha_layer *L = naive_make_layer(&w);
        if (!L) continue;
        float *x = naive_random_floats(2 * 6 * 16, &seed, -2, 2);
        mha_options o = naive_ref_options();
        double d = naive_compare(L, &w, x, NULL, 2, 6, 6, &o);
        CHECK(d <= 1e-5);
        /* cap and opt may be NULL */
        float y[2 * 6 * 16], y2[2 * 6 * 16];
        CHECK_OK(mha_forward(L, y, NULL, x, NULL, 2, 6, 6, &o));
        CHECK_OK(mha_forward(L, y2, NULL, x, NULL, 2, 6, 6, NULL));
        CHECK_ARRAY_NEAR(y2, y, 2 * 6 * 16, 1e-5);
        mha_layer_free(L);
        naive_weights_free(&w);
        free(x);
    }
}

/* Batches are independent: one call with B = 3 equals three calls. */
static void forward_batches_independent(void) {
    mha_config c = naive_resolve(mha_config_default(8, 2));
    c.bias = 1;
    naive_weights w;
    uint64_t seed = 30;
    naive_weights_random(&w, &c, &seed, 0.5f);
    mha_layer *L = naive_make_layer(&w);
    if (!L) return;
    float *x = naive_random_floats(3 * 4 * 8, &seed, -1, 1), y[96], yb[32];
    mha_options o = naive_ref_options();
    CHECK_OK(mha_forward(L, y, NULL, x, NULL, 3, 4, 4, &o));
    for (int b = 0; b < 3; b++) {
        CHECK_OK(mha_forward(L, yb, NULL, x + b * 32, NULL, 1, 4, 4, &o));
        CHECK_ARRAY_NEAR(yb, y + b * 32, 32, 1e-6);
    }
    mha_layer_free(L);
    naive_weights_free(&w);
    free(x);
}

/* the library's struct sizes (what bindings check against their own
 * declarations) are the header's, and unknown names give 0 */
static void struct_sizes_are_the_headers(void) {
    CHECK(mha_struct_size("mha_options") == sizeof(mha_options));
    CHECK(mha_struct_size("mha_config") == sizeof(mha_config));
    CHECK(mha_struct_size("mha_weights") == sizeof(mha_weights));
    CHECK(mha_struct_size("mha_gradients") == sizeof(mha_gradients));
    CHECK(mha_struct_size("mha_load_options") == sizeof(mha_load_options));
    CHECK(mha_struct_size("mha_cache_info") == sizeof(mha_cache_info));
    CHECK(mha_struct_size("mha_torch_weights") == sizeof(mha_torch_weights));
    CHECK(mha_struct_size("mha_rope") == sizeof(mha_rope));
    CHECK(mha_struct_size("mha_layer") == 0); /* opaque */
    CHECK(mha_struct_size("") == 0 && mha_struct_size(NULL) == 0 && mha_struct_size("mha_option") == 0);
}

static const test_case cases[] = {
    {"config_struct_sizes_are_the_headers", struct_sizes_are_the_headers},
    {"config_default_and_resolve", config_default_and_resolve},
    {"config_resolve_keeps_explicit_fields", config_resolve_keeps_explicit_fields},
    {"config_explicit_dk_needs_no_divisibility", config_explicit_dk_needs_no_divisibility},
    {"config_options_default_fields", options_default_fields},
    {"config_status_strings_distinct", status_strings_distinct},
    {"config_layer_config_is_resolved", layer_config_is_resolved},
    {"config_layer_null_weights_give_zero", layer_null_weights_give_zero},
    {"config_layer_copies_weights", layer_copies_weights},
    {"config_layer_set_weights_replaces", layer_set_weights_replaces},
    {"config_layer_bias0_ignores_bias_pointers", layer_bias0_ignores_bias_pointers},
    {"config_forward_mha_matches_naive", forward_mha_matches_naive},
    {"config_forward_batches_independent", forward_batches_independent},
};

const test_case *tests_config(size_t *count) {
    *count = sizeof cases / sizeof cases[0];
    return cases;
}
