/* test_errors.c — every error path of the public API: the status returned
 * and that mha_last_error() names the offending value. Where mha.h leaves
 * the code open between two (a bad dimension is both an out-of-range
 * argument and a shape), either is accepted, never MHA_OK. */
#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include "base/internal.h"
#include "naive.h"
#include "tests.h"

/* Case-insensitive: does the last error mention s? */
static int msg_has(const char *s) {
    const char *m = mha_last_error();
    size_t n = strlen(s);
    for (; *m; m++) {
        size_t i = 0;
        while (i < n && m[i] && tolower((unsigned char)m[i]) == tolower((unsigned char)s[i])) i++;
        if (i == n) return 1;
    }
    return 0;
}

#define CHECK_MSG(s)                                                                       \
    do {                                                                                   \
        if (!msg_has(s))                                                                   \
            test_report(__FILE__, __LINE__, "error \"%s\" does not mention \"%s\"",        \
                        mha_last_error(), (s));                                            \
    } while (0)

#define CHECK_STATUS2(expr, a, b)                                                          \
    do {                                                                                   \
        mha_status got_ = (expr);                                                          \
        if (got_ != (a) && got_ != (b))                                                    \
            test_report(__FILE__, __LINE__, "%s = %d (%s), want %d or %d; error: %s",     \
                        #expr, (int)got_, mha_status_str(got_), (int)(a), (int)(b),        \
                        mha_last_error());                                                 \
    } while (0)

/* A small valid layer and inputs: d_model 8, h 4, B 2, T = S = 3. */
typedef struct {
    naive_weights w;
    mha_layer *L;
    float x[2 * 3 * 8];
    float y[2 * 3 * 8];
} fixture;

static int fixture_make(fixture *f, int h_kv) {
    mha_config c = mha_config_default(8, 4);
    c.bias = 1;
    c.n_kv_heads = h_kv;
    c = naive_resolve(c);
    uint64_t seed = 501;
    naive_weights_random(&f->w, &c, &seed, 0.5f);
    test_fill_uniform(f->x, sizeof f->x / sizeof f->x[0], &seed, -1, 1);
    f->L = naive_make_layer(&f->w);
    return f->L != NULL;
}

static void fixture_free(fixture *f) {
    mha_layer_free(f->L);
    naive_weights_free(&f->w);
}

static mha_status resolve(mha_config c) {
    mha_config r;
    return mha_config_resolve(&r, &c);
}

static void errors_config_values(void) {
    mha_config c = mha_config_default(768, 5);
    CHECK_STATUS2(resolve(c), MHA_E_ARG, MHA_E_SHAPE);
    CHECK_MSG("n_heads=5");
    CHECK_MSG("d_model=768");
    c = mha_config_default(0, 2);
    CHECK_STATUS2(resolve(c), MHA_E_ARG, MHA_E_SHAPE);
    CHECK_MSG("d_model");
    c = mha_config_default(-8, 2);
    CHECK_STATUS2(resolve(c), MHA_E_ARG, MHA_E_SHAPE);
    CHECK_MSG("-8");
    c = mha_config_default(8, 0);
    CHECK_STATUS2(resolve(c), MHA_E_ARG, MHA_E_SHAPE);
    CHECK_MSG("n_heads");
    c = mha_config_default(32, 8);
    c.n_kv_heads = 3;
    CHECK_STATUS2(resolve(c), MHA_E_ARG, MHA_E_SHAPE);
    CHECK_MSG("n_kv_heads=3");
    c.n_kv_heads = 16; /* more kv heads than heads */
    CHECK_STATUS2(resolve(c), MHA_E_ARG, MHA_E_SHAPE);
    CHECK_MSG("n_kv_heads=16");
    c.n_kv_heads = -2;
    CHECK_STATUS2(resolve(c), MHA_E_ARG, MHA_E_SHAPE);
    CHECK_MSG("n_kv_heads");
    c = mha_config_default(32, 8);
    c.d_k = -4;
    CHECK_STATUS2(resolve(c), MHA_E_ARG, MHA_E_SHAPE);
    CHECK_MSG("d_k");
    c = mha_config_default(32, 8);
    c.d_v = -1;
    CHECK_STATUS2(resolve(c), MHA_E_ARG, MHA_E_SHAPE);
    CHECK_MSG("d_v");
    c = mha_config_default(32, 8);
    c.d_kv_in = -5;
    CHECK_STATUS2(resolve(c), MHA_E_ARG, MHA_E_SHAPE);
    CHECK_MSG("d_kv_in");
    c = mha_config_default(32, 8);
    CHECK_STATUS(mha_config_resolve(NULL, &c), MHA_E_ARG);
    mha_config r;
    CHECK_STATUS(mha_config_resolve(&r, NULL), MHA_E_ARG);
}

static void errors_create(void) {
    mha_config c = mha_config_default(768, 5);
    mha_layer *L = NULL;
    CHECK_STATUS2(mha_layer_create(&L, &c, NULL), MHA_E_ARG, MHA_E_SHAPE);
    CHECK_MSG("n_heads=5");
    CHECK(L == NULL);
    c = mha_config_default(8, 2);
    CHECK_STATUS(mha_layer_create(NULL, &c, NULL), MHA_E_ARG);
    CHECK_STATUS(mha_layer_create(&L, NULL, NULL), MHA_E_ARG);
    CHECK(L == NULL);

    /* weights: missing matrices, missing biases when bias = 1, NaN/Inf */
    c = naive_resolve(c);
    c.bias = 1;
    naive_weights w;
    uint64_t seed = 502;
    naive_weights_random(&w, &c, &seed, 0.5f);
    mha_weights v = naive_weights_view(&w);
    v.w_q = NULL;
    CHECK_STATUS(mha_layer_create(&L, &c, &v), MHA_E_ARG);
    CHECK_MSG("w_q");
    CHECK(L == NULL);
    v = naive_weights_view(&w);
    v.w_o = NULL;
    CHECK_STATUS(mha_layer_create(&L, &c, &v), MHA_E_ARG);
    CHECK_MSG("w_o");
    v = naive_weights_view(&w);
    v.b_k = NULL;
    CHECK_STATUS(mha_layer_create(&L, &c, &v), MHA_E_ARG);
    CHECK_MSG("b_k");
    CHECK(L == NULL);
    v = naive_weights_view(&w);
    w.w_v[13] = NAN;
    CHECK_STATUS(mha_layer_create(&L, &c, &v), MHA_E_NONFINITE);
    CHECK_MSG("w_v");
    CHECK_MSG("13");
    CHECK(L == NULL);
    w.w_v[13] = 0.25f;
    w.b_o[6] = INFINITY;
    CHECK_STATUS(mha_layer_create(&L, &c, &v), MHA_E_NONFINITE);
    CHECK_MSG("b_o");
    w.b_o[6] = 0.25f;
    /* add_bias_kv needs bias_k and bias_v */
    mha_config ck = c;
    ck.add_bias_kv = 1;
    CHECK_STATUS(mha_layer_create(&L, &ck, &v), MHA_E_ARG);
    CHECK_MSG("bias_k");
    CHECK(L == NULL);
    /* the valid weights then create fine, and set_weights checks the same */
    CHECK_OK(mha_layer_create(&L, &c, &v));
    if (L) {
        w.w_k[2] = NAN;
        CHECK_STATUS(mha_layer_set_weights(L, &v), MHA_E_NONFINITE);
        CHECK_MSG("w_k");
        w.w_k[2] = 0;
        CHECK_STATUS(mha_layer_set_weights(L, NULL), MHA_E_ARG);
        CHECK_STATUS(mha_layer_set_weights(NULL, &v), MHA_E_ARG);
        mha_layer_free(L);
    }
    naive_weights_free(&w);
}

static void errors_forward_args(void) {
    fixture f;
    if (!fixture_make(&f, 0)) return;
    mha_options o = naive_ref_options();
    CHECK_STATUS(mha_forward(NULL, f.y, NULL, f.x, NULL, 2, 3, 3, &o), MHA_E_ARG);
    CHECK_STATUS(mha_forward(f.L, NULL, NULL, f.x, NULL, 2, 3, 3, &o), MHA_E_ARG);
    CHECK_STATUS(mha_forward(f.L, f.y, NULL, NULL, NULL, 2, 3, 3, &o), MHA_E_ARG);
    CHECK_STATUS2(mha_forward(f.L, f.y, NULL, f.x, NULL, 0, 3, 3, &o), MHA_E_ARG, MHA_E_SHAPE);
    CHECK_MSG("B");
    CHECK_STATUS2(mha_forward(f.L, f.y, NULL, f.x, NULL, 2, -1, 3, &o), MHA_E_ARG, MHA_E_SHAPE);
    CHECK_MSG("-1");
    CHECK_STATUS2(mha_forward(f.L, f.y, NULL, f.x, f.x, 2, 3, 0, &o), MHA_E_ARG, MHA_E_SHAPE);
    CHECK_MSG("S");
    /* self-attention needs S == T */
    CHECK_STATUS2(mha_forward(f.L, f.y, NULL, f.x, NULL, 1, 3, 5, &o), MHA_E_ARG, MHA_E_SHAPE);
    CHECK_MSG("5");
    mha_options bad = o;
    bad.path = (mha_path)9;
    CHECK_STATUS(mha_forward(f.L, f.y, NULL, f.x, NULL, 2, 3, 3, &bad), MHA_E_ARG);
    CHECK_MSG("9");
    bad = o;
    bad.align = (mha_align)7;
    CHECK_STATUS(mha_forward(f.L, f.y, NULL, f.x, NULL, 2, 3, 3, &bad), MHA_E_ARG);
    CHECK_MSG("7");
    bad = o;
    bad.masked_row = (mha_masked_row)6;
    CHECK_STATUS(mha_forward(f.L, f.y, NULL, f.x, NULL, 2, 3, 3, &bad), MHA_E_ARG);
    CHECK_MSG("6");
    fixture_free(&f);
}

/* kv == NULL also needs d_kv_in == d_model. */
static void errors_kv_null_cross_layer(void) {
    mha_config c = mha_config_default(8, 2);
    c.d_kv_in = 6;
    mha_layer *L = NULL;
    CHECK_OK(mha_layer_create(&L, &c, NULL));
    if (!L) return;
    float x[24] = {0}, y[24];
    mha_options o = naive_ref_options();
    CHECK_STATUS2(mha_forward(L, y, NULL, x, NULL, 1, 3, 3, &o), MHA_E_ARG, MHA_E_SHAPE);
    CHECK_MSG("d_kv_in");
    mha_layer_free(L);
}

static void errors_nonfinite_inputs(void) {
    fixture f;
    if (!fixture_make(&f, 0)) return;
    mha_options o = naive_ref_options();
    f.x[17] = NAN;
    CHECK_STATUS(mha_forward(f.L, f.y, NULL, f.x, NULL, 2, 3, 3, &o), MHA_E_NONFINITE);
    CHECK_MSG("x");
    CHECK_MSG("17");
    f.x[17] = INFINITY;
    CHECK_STATUS(mha_forward(f.L, f.y, NULL, f.x, NULL, 2, 3, 3, &o), MHA_E_NONFINITE);
    f.x[17] = 0.5f;
    float kv[2 * 3 * 8];
    memcpy(kv, f.x, sizeof kv);
    kv[20] = NAN;
    CHECK_STATUS(mha_forward(f.L, f.y, NULL, f.x, kv, 2, 3, 3, &o), MHA_E_NONFINITE);
    CHECK_MSG("kv");
    CHECK_MSG("20");
    float add[3 * 3] = {0};
    add[4] = NAN;
    o.additive_mask = (mha_mask){add, 1, 1};
    CHECK_STATUS(mha_forward(f.L, f.y, NULL, f.x, NULL, 2, 3, 3, &o), MHA_E_NONFINITE);
    CHECK_MSG("additive");
    add[4] = -INFINITY; /* allowed: forbids the key */
    CHECK_OK(mha_forward(f.L, f.y, NULL, f.x, NULL, 2, 3, 3, &o));
    o = naive_ref_options();
    float kadd[2 * 3] = {0};
    kadd[5] = NAN;
    o.key_additive = kadd;
    CHECK_STATUS(mha_forward(f.L, f.y, NULL, f.x, NULL, 2, 3, 3, &o), MHA_E_NONFINITE);
    CHECK_MSG("key_additive");
    fixture_free(&f);
}

static void errors_mask_shapes(void) {
    fixture f;
    if (!fixture_make(&f, 0)) return;
    uint8_t keep[5 * 4 * 3 * 3];
    float add[5 * 4 * 3 * 3];
    memset(keep, 1, sizeof keep);
    memset(add, 0, sizeof add);
    const int shapes[][2] = {{5, 1}, {1, 3}, {0, 1}, {1, 0}, {-1, 4}};
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
        char num[16];
        int bad = shapes[k][0] == 1 ? shapes[k][1] : shapes[k][0];
        snprintf(num, sizeof num, "%d", bad);
        mha_options o = naive_ref_options();
        o.keep_mask = (mha_mask){keep, shapes[k][0], shapes[k][1]};
        CHECK_STATUS2(mha_forward(f.L, f.y, NULL, f.x, NULL, 2, 3, 3, &o), MHA_E_SHAPE,
                      MHA_E_ARG);
        CHECK_MSG("keep");
        CHECK_MSG(num);
        o = naive_ref_options();
        o.additive_mask = (mha_mask){add, shapes[k][0], shapes[k][1]};
        CHECK_STATUS2(mha_forward(f.L, f.y, NULL, f.x, NULL, 2, 3, 3, &o), MHA_E_SHAPE,
                      MHA_E_ARG);
        CHECK_MSG("additive");
        CHECK_MSG(num);
    }
    /* the valid shapes pass: (1|B, 1|h) */
    const int ok[][2] = {{1, 1}, {2, 1}, {1, 4}, {2, 4}};
    for (size_t k = 0; k < 4; k++) {
        mha_options o = naive_ref_options();
        o.keep_mask = (mha_mask){keep, ok[k][0], ok[k][1]};
        o.additive_mask = (mha_mask){add, ok[k][0], ok[k][1]};
        CHECK_OK(mha_forward(f.L, f.y, NULL, f.x, NULL, 2, 3, 3, &o));
    }
    fixture_free(&f);
}

static void errors_interventions(void) {
    fixture f;
    if (!fixture_make(&f, 0)) return;
    mha_intervention ivs[4];
    for (int r = 0; r < 4; r++) ivs[r] = (mha_intervention){MHA_HEAD_KEEP, 0, NULL};
    mha_options o = naive_ref_options();
    o.interventions = ivs;
    ivs[2].op = (mha_head_op)9;
    CHECK_STATUS(mha_forward(f.L, f.y, NULL, f.x, NULL, 2, 3, 3, &o), MHA_E_ARG);
    CHECK_MSG("9");
    ivs[2].op = MHA_HEAD_REPLACE; /* value NULL */
    CHECK_STATUS(mha_forward(f.L, f.y, NULL, f.x, NULL, 2, 3, 3, &o), MHA_E_ARG);
    CHECK_MSG("value");
    ivs[2] = (mha_intervention){MHA_HEAD_SCALE, NAN, NULL};
    CHECK_STATUS2(mha_forward(f.L, f.y, NULL, f.x, NULL, 2, 3, 3, &o), MHA_E_NONFINITE,
                  MHA_E_ARG);
    CHECK_MSG("scale");
    float value[2 * 3 * 2] = {0};
    value[3] = INFINITY;
    ivs[2] = (mha_intervention){MHA_HEAD_REPLACE, 0, value};
    CHECK_STATUS2(mha_forward(f.L, f.y, NULL, f.x, NULL, 2, 3, 3, &o), MHA_E_NONFINITE,
                  MHA_E_ARG);
    /* standalone */
    float z[3 * 4 * 2] = {0};
    mha_intervention iv = {MHA_HEAD_ZERO, 0, NULL};
    CHECK_STATUS(mha_head_intervene(z, &iv, 4, 4, 3, 2), MHA_E_ARG);
    CHECK_MSG("4");
    CHECK_STATUS(mha_head_intervene(z, &iv, -1, 4, 3, 2), MHA_E_ARG);
    CHECK_STATUS(mha_head_intervene(NULL, &iv, 0, 4, 3, 2), MHA_E_ARG);
    CHECK_STATUS(mha_head_intervene(z, NULL, 0, 4, 3, 2), MHA_E_ARG);
    iv.op = MHA_HEAD_REPLACE;
    CHECK_STATUS(mha_head_intervene(z, &iv, 0, 4, 3, 2), MHA_E_ARG);
    iv.op = (mha_head_op)-3;
    CHECK_STATUS(mha_head_intervene(z, &iv, 0, 4, 3, 2), MHA_E_ARG);
    fixture_free(&f);
}

static void errors_permutations(void) {
    fixture f;
    if (!fixture_make(&f, 2)) return; /* GQA: h 4, h_kv 2 */
    const int dup[4] = {0, 0, 2, 3}, range[4] = {0, 1, 2, 4}, neg[4] = {-1, 1, 2, 3};
    CHECK_STATUS(mha_layer_permute_heads(f.L, dup), MHA_E_ARG);
    CHECK_MSG("0");
    CHECK_STATUS(mha_layer_permute_heads(f.L, range), MHA_E_ARG);
    CHECK_MSG("4");
    CHECK_STATUS(mha_layer_permute_heads(f.L, neg), MHA_E_ARG);
    CHECK_MSG("-1");
    CHECK_STATUS(mha_layer_permute_heads(f.L, NULL), MHA_E_ARG);
    const int ok[4] = {1, 0, 2, 3};
    CHECK_STATUS(mha_layer_permute_heads(NULL, ok), MHA_E_ARG);
    const int mix[4] = {0, 2, 1, 3}; /* splits both kv groups */
    CHECK_STATUS(mha_layer_permute_heads(f.L, mix), MHA_E_ARG);
    /* one-sided: h entries for Q/O, h_kv for K/V */
    CHECK_STATUS(mha_layer_permute_block(f.L, MHA_BLOCK_O, dup), MHA_E_ARG);
    const int kv_bad[2] = {0, 2}, kv_dup[2] = {1, 1};
    CHECK_STATUS(mha_layer_permute_block(f.L, MHA_BLOCK_K, kv_bad), MHA_E_ARG);
    CHECK_MSG("2");
    CHECK_STATUS(mha_layer_permute_block(f.L, MHA_BLOCK_V, kv_dup), MHA_E_ARG);
    CHECK_STATUS(mha_layer_permute_block(f.L, (mha_block)7, ok), MHA_E_ARG);
    CHECK_MSG("7");
    CHECK_STATUS(mha_layer_permute_block(f.L, MHA_BLOCK_Q, NULL), MHA_E_ARG);
    /* nothing above changed the layer */
    int lab[4];
    for (int b = 0; b < 4; b++) {
        int n = (b == MHA_BLOCK_K || b == MHA_BLOCK_V) ? 2 : 4;
        CHECK_OK(mha_layer_labels(f.L, (mha_block)b, lab));
        for (int i = 0; i < n; i++) CHECK_INT(lab[i], i);
    }
    mha_options o = naive_ref_options();
    CHECK(naive_compare(f.L, &f.w, f.x, NULL, 2, 3, 3, &o) <= 1e-5);
    fixture_free(&f);
}

static void errors_labels(void) {
    fixture f;
    if (!fixture_make(&f, 0)) return;
    const int dup[4] = {0, 1, 1, 3}, neg[4] = {0, -2, 1, 3};
    int lab[4];
    CHECK_STATUS(mha_layer_set_labels(f.L, MHA_BLOCK_Q, dup), MHA_E_ARG);
    CHECK_MSG("1");
    CHECK_STATUS(mha_layer_set_labels(f.L, MHA_BLOCK_O, neg), MHA_E_ARG);
    CHECK_MSG("-2");
    CHECK_STATUS(mha_layer_set_labels(f.L, MHA_BLOCK_K, NULL), MHA_E_ARG);
    CHECK_STATUS(mha_layer_set_labels(f.L, (mha_block)4, dup), MHA_E_ARG);
    CHECK_STATUS(mha_layer_set_labels(NULL, MHA_BLOCK_Q, dup), MHA_E_ARG);
    CHECK_STATUS(mha_layer_labels(f.L, MHA_BLOCK_Q, NULL), MHA_E_ARG);
    CHECK_STATUS(mha_layer_labels(f.L, (mha_block)-1, lab), MHA_E_ARG);
    CHECK_STATUS(mha_layer_labels(NULL, MHA_BLOCK_Q, lab), MHA_E_ARG);
    CHECK_OK(mha_layer_labels(f.L, MHA_BLOCK_Q, lab));
    for (int i = 0; i < 4; i++) CHECK_INT(lab[i], i);
    CHECK_STATUS(mha_layer_check_contract(NULL, NULL, NULL, 1, 1, 1, NULL, NULL), MHA_E_ARG);
    fixture_free(&f);
}

static void errors_standalone_steps(void) {
    const float a[2] = {1, 2}, b[2] = {3, 4}, w[4] = {1, 0, 0, 1};
    const float *heads[2] = {a, b};
    float z[4], y[4], c[8], s0[2], s1[2];
    float *outs[2] = {s0, s1};
    const int bad_order[2] = {0, 2};
    CHECK_STATUS(mha_concat_heads(NULL, heads, NULL, 2, 1, 2), MHA_E_ARG);
    CHECK_STATUS(mha_concat_heads(z, NULL, NULL, 2, 1, 2), MHA_E_ARG);
    CHECK_STATUS(mha_concat_heads(z, heads, bad_order, 2, 1, 2), MHA_E_ARG);
    CHECK_MSG("2");
    CHECK_STATUS2(mha_concat_heads(z, heads, NULL, 0, 1, 2), MHA_E_ARG, MHA_E_SHAPE);
    CHECK_STATUS(mha_split_heads(NULL, z, 2, 1, 2), MHA_E_ARG);
    CHECK_STATUS(mha_split_heads(outs, NULL, 2, 1, 2), MHA_E_ARG);
    CHECK_STATUS2(mha_split_heads(outs, z, 2, 1, -2), MHA_E_ARG, MHA_E_SHAPE);
    CHECK_STATUS(mha_project_out(NULL, z, w, NULL, 1, 2, 2), MHA_E_ARG);
    CHECK_STATUS(mha_project_out(y, z, NULL, NULL, 1, 2, 2), MHA_E_ARG);
    CHECK_STATUS2(mha_project_out(y, z, w, NULL, 0, 2, 2), MHA_E_ARG, MHA_E_SHAPE);
    CHECK_STATUS(mha_head_contributions(NULL, z, w, 2, 1, 1, 2), MHA_E_ARG);
    CHECK_STATUS(mha_head_contributions(c, z, NULL, 2, 1, 1, 2), MHA_E_ARG);
    CHECK_STATUS2(mha_head_contributions(c, z, w, 2, 1, 1, 0), MHA_E_ARG, MHA_E_SHAPE);
}

/* An unknown MHA_KERNELS value is refused by name, not silently ignored;
 * the known values run (reference equals the forced reference path). */
static void errors_env_kernels(void) {
    fixture f;
    if (!fixture_make(&f, 4)) return;
    const char *old = getenv("MHA_KERNELS");
    char *saved = old ? strdup(old) : NULL;
    float y_ref[sizeof f.y / sizeof f.y[0]];
    mha_options o = mha_options_default();
    o.path = MHA_PATH_REFERENCE;
    CHECK_OK(mha_forward(f.L, y_ref, NULL, f.x, NULL, 2, 3, 3, &o));
    setenv("MHA_KERNELS", "refrence", 1);
    CHECK_STATUS(mha_forward(f.L, f.y, NULL, f.x, NULL, 2, 3, 3, NULL), MHA_E_ARG);
    CHECK_MSG("MHA_KERNELS=refrence");
    CHECK_MSG("expected reference, scalar, avx2 or avx512");
    setenv("MHA_KERNELS", "reference", 1);
    CHECK_OK(mha_forward(f.L, f.y, NULL, f.x, NULL, 2, 3, 3, NULL));
    CHECK_ARRAY_NEAR(f.y, y_ref, sizeof f.y / sizeof f.y[0], 0);
    if (saved) setenv("MHA_KERNELS", saved, 1);
    else unsetenv("MHA_KERNELS");
    free(saved);
    fixture_free(&f);
}

/* mha_first_nonfinite scans blocks of 4096 without a branch: the first
 * bad index, not a later one, in either block of a boundary, each mode
 * (ALLOW_NAN: NaN passes, Inf does not; ALLOW_NEG_INF: -Inf passes, NaN
 * and +Inf do not), counted against a plain loop. */
static void errors_first_nonfinite_scan(void) {
    const size_t n = 3 * 4096 + 7;
    float *a = malloc(n * sizeof *a);
    for (size_t i = 0; i < n; i++) a[i] = (float)i - 5000.0f;
    CHECK(mha_first_nonfinite(a, n, 0) == n && mha_first_nonfinite(a, n, MHA_SCAN_ALLOW_NAN) == n);
    CHECK(mha_first_nonfinite(a, 0, 0) == 0);
    const size_t at[] = {0, 4095, 4096, 8191, 12288, n - 1};
    for (size_t k = 0; k < sizeof at / sizeof at[0]; k++) {
        a[at[k]] = NAN;
        if (at[k] + 3 < n) a[at[k] + 3] = INFINITY; /* a later bad value must not win */
        size_t want_strict = n, want_nan_ok = n;
        for (size_t i = n; i-- > 0;) {
            if (!isfinite(a[i])) want_strict = i;
            if (isinf(a[i])) want_nan_ok = i;
        }
        CHECK(mha_first_nonfinite(a, n, 0) == want_strict && want_strict == at[k]);
        CHECK(mha_first_nonfinite(a, n, MHA_SCAN_ALLOW_NAN) == want_nan_ok);
        CHECK(mha_first_nonfinite(a, n, MHA_SCAN_ALLOW_NEG_INF) == at[k]);
        a[at[k]] = 1.0f;
        if (at[k] + 3 < n) a[at[k] + 3] = 1.0f;
    }
    /* -Inf throughout (an additive mask): let through only by ALLOW_NEG_INF */
    for (size_t i = 0; i < n; i += 2) a[i] = -INFINITY;
    CHECK(mha_first_nonfinite(a, n, MHA_SCAN_ALLOW_NEG_INF) == n);
    CHECK(mha_first_nonfinite(a, n, MHA_SCAN_ALLOW_NAN) == 0 && mha_first_nonfinite(a, n, 0) == 0);
    a[9001] = INFINITY;
    CHECK(mha_first_nonfinite(a, n, MHA_SCAN_ALLOW_NEG_INF) == 9001);
    a[n - 1] = -INFINITY;
    CHECK(mha_first_nonfinite(a, n, MHA_SCAN_ALLOW_NAN) == 0);
    free(a);
}

static const test_case cases[] = {
    {"errors_config_values", errors_config_values},
    {"errors_create", errors_create},
    {"errors_forward_args", errors_forward_args},
    {"errors_kv_null_cross_layer", errors_kv_null_cross_layer},
    {"errors_nonfinite_inputs", errors_nonfinite_inputs},
    {"errors_first_nonfinite_scan", errors_first_nonfinite_scan},
    {"errors_mask_shapes", errors_mask_shapes},
    {"errors_interventions", errors_interventions},
    {"errors_permutations", errors_permutations},
    {"errors_labels", errors_labels},
    {"errors_standalone_steps", errors_standalone_steps},
    {"errors_env_kernels", errors_env_kernels},
};

const test_case *tests_errors(size_t *count) {
    *count = sizeof cases / sizeof cases[0];
    return cases;
}
