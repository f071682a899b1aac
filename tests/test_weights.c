/* test_weights.c — bf16 / int8 projection weights (MHA_W_BF16, MHA_W_I8).
 *
 * The expected stored values are computed here from the math, not with
 * the library: bf16 by frexp/ldexp and nearbyint (ties to even, the
 * default rounding mode), int8 by max|column| / 127 and rounding half
 * away from zero with floor. The reference must compute with exactly
 * those values (bit-identical to an fp32 layer built from them); the
 * prefill (packed fp32 panels of the same values) likewise; the decode
 * streams read the compact form: bf16 widened exactly, so bit-identical
 * to the fp32 decode of the same values; int8 scaled once per column, so
 * held to the tolerance rule max|dec - ref| <= 2 max|dec32 - ref| + 1e-6.
 * The accuracy of each type against the original fp32 layer is held to
 * the bounds of docs/WEIGHTS.md.
 * Legend: B batch, T tokens, h, h_kv heads, D = d_model. */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "compute/decode_gemm.h"
#include "kernels/kernels.h"
#include "naive.h"
#include "test_util.h"
#include "tests.h"

/* ------------------------------------------------ reference quantizers */

/* The projection matrices of w quantized as dtype, in place. */
static void ref_quantize(naive_weights *w, const mha_config *c, mha_weight_dtype dt) {
    float *m[4] = {w->w_q, w->w_k, w->w_v, w->w_o};
    const int K[4] = {c->d_model, c->d_kv_in, c->d_v_in ? c->d_v_in : c->d_kv_in, c->n_heads * c->d_v};
    const int N[4] = {c->n_heads * c->d_k, c->n_kv_heads * c->d_k, c->n_kv_heads * c->d_v, c->d_model};
    for (int i = 0; i < 4; i++) {
        if (dt == MHA_W_I8) naive_round_int8(m[i], K[i], N[i], i == 3 ? c->d_v : K[i]); /* W_O: per head */
        else
            for (size_t e = 0; e < (size_t)K[i] * N[i]; e++) m[i][e] = naive_round_bf16(m[i][e]);
    }
}

/* Activations with outlier channels: uniform in [-1, 1), every 13th
 * channel 12x larger (the few large channels of LLM activations). */
static float *outlier_x(size_t rows, int D, uint64_t *seed) {
    float *x = naive_random_floats(rows * D, seed, -1.0f, 1.0f);
    for (size_t r = 0; r < rows; r++)
        for (int c = 5; c < D; c += 13) x[r * D + c] *= 12.0f;
    return x;
}

/* A layer of config c with random weights (kept in *w) and its copy
 * converted to dt; *exact is an fp32 layer made from the reference
 * quantization of the same weights. */
typedef struct {
    mha_config c;
    naive_weights w, wq;  /* original, quantized by the reference */
    mha_layer *orig, *conv, *exact;
} wcase;

static void wcase_make(wcase *f, int D, int h, int h_kv, mha_weight_dtype dt, uint64_t seed) {
    f->c = naive_resolve(naive_config(D, h, h_kv, 0, 0, 1));
    naive_weights_random(&f->w, &f->c, &seed, 0.3f);
    naive_weights_random(&f->wq, &f->c, &seed, 0.3f); /* biases differ; projections copied */
    size_t n[4] = {(size_t)D * h * f->c.d_k, (size_t)D * h_kv * f->c.d_k, (size_t)D * h_kv * f->c.d_v,
                   (size_t)h * f->c.d_v * D};
    memcpy(f->wq.b_q, f->w.b_q, (size_t)h * f->c.d_k * 4), memcpy(f->wq.b_o, f->w.b_o, (size_t)D * 4);
    memcpy(f->wq.b_k, f->w.b_k, (size_t)h_kv * f->c.d_k * 4), memcpy(f->wq.b_v, f->w.b_v, (size_t)h_kv * f->c.d_v * 4);
    memcpy(f->wq.w_q, f->w.w_q, n[0] * 4), memcpy(f->wq.w_k, f->w.w_k, n[1] * 4);
    memcpy(f->wq.w_v, f->w.w_v, n[2] * 4), memcpy(f->wq.w_o, f->w.w_o, n[3] * 4);
    ref_quantize(&f->wq, &f->c, dt);
    f->orig = naive_make_layer(&f->w);
    f->conv = naive_make_layer(&f->w);
    f->exact = naive_make_layer(&f->wq);
    CHECK_OK(mha_layer_convert_weights(f->conv, dt));
    CHECK_INT(mha_layer_weights_dtype(f->conv), dt);
}

static void wcase_free(wcase *f) {
    mha_layer_free(f->orig), mha_layer_free(f->conv), mha_layer_free(f->exact);
    naive_weights_free(&f->w), naive_weights_free(&f->wq);
}

/* y (B, T, D) of L through the cache, one token at a time (the decode
 * streams read the stored weights). */
static float *decode_all(const mha_layer *L, const float *x, int B, int T) {
    const int D = mha_layer_config(L)->d_model;
    float *y = naive_alloc_floats((size_t)B * T * D), *xs = naive_alloc_floats((size_t)B * D),
          *ys = naive_alloc_floats((size_t)B * D);
    mha_cache *c = NULL;
    CHECK_OK(mha_cache_create(&c, L, B, T, MHA_CACHE_F32, 0));
    for (int t = 0; c && t < T; t++) {
        for (int b = 0; b < B; b++) memcpy(xs + (size_t)b * D, x + ((size_t)b * T + t) * D, (size_t)D * 4);
        CHECK_OK(mha_forward_cached(L, c, ys, NULL, xs, 1, NULL, NULL));
        for (int b = 0; b < B; b++) memcpy(y + ((size_t)b * T + t) * D, ys + (size_t)b * D, (size_t)D * 4);
    }
    mha_cache_free(c);
    free(xs), free(ys);
    return y;
}

/* ------------------------------------------------------------ rounding */

static void test_bf16_rounding(void) {
    /* ties between two bf16 neighbours (ulp 2^-7 at 1): even wins */
    const float in[8] = {1.0f + 0x1p-8f,            /* tie: 1 (even) */
                         1.0f + 3 * 0x1p-8f,        /* tie: 1 + 2^-6 (even) */
                         1.0f + 0x1p-8f + 0x1p-20f, /* above the tie: 1 + 2^-7 */
                         -(1.0f + 0x1p-8f),         /* negative tie: -1 */
                         -(1.0f + 3 * 0x1p-8f),     /* -(1 + 2^-6) */
                         0.1f, -3.3e38f, 0.0f};
    const float want[8] = {1.0f, 1.0f + 0x1p-6f, 1.0f + 0x1p-7f, -1.0f, -(1.0f + 0x1p-6f), naive_round_bf16(0.1f),
                           naive_round_bf16(-3.3e38f), 0.0f};
    CHECK(naive_round_bf16(in[0]) == want[0] && naive_round_bf16(in[1]) == want[1] && naive_round_bf16(in[2]) == want[2]);
    mha_config c = mha_config_default(8, 1);
    c.bias = 0;
    float wq[64] = {0}, wk[64] = {0}, wv[64] = {0}, wo[64] = {0};
    memcpy(wq, in, sizeof in);
    mha_weights w = {.w_q = wq, .w_k = wk, .w_v = wv, .w_o = wo};
    mha_layer *L = NULL;
    CHECK_OK(mha_layer_create(&L, &c, &w));
    CHECK_OK(mha_layer_convert_weights(L, MHA_W_BF16));
    mha_weights v;
    mha_layer_get_weights(L, &v);
    for (int i = 0; i < 8; i++)
        if (v.w_q[i] != want[i]) test_report(__FILE__, __LINE__, "w_q[%d] = %a; expected %a", i, v.w_q[i], want[i]);
    /* a finite weight that rounds to infinity is refused; nothing changes */
    wq[9] = 3.4e38f;
    mha_layer *big = NULL;
    CHECK_OK(mha_layer_create(&big, &c, &w));
    CHECK_STATUS(mha_layer_convert_weights(big, MHA_W_BF16), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("w_q[9]");
    CHECK_INT(mha_layer_weights_dtype(big), MHA_W_F32);
    mha_layer_get_weights(big, &v);
    CHECK(v.w_q[9] == 3.4e38f && v.w_q[0] == in[0]);
    /* ... and set_weights on a bf16 layer refuses it before changing anything */
    CHECK_STATUS(mha_layer_set_weights(L, &w), MHA_E_ARG);
    mha_layer_get_weights(L, &v);
    CHECK(v.w_q[0] == want[0] && v.w_q[9] == 0.0f);
    /* NaN and Inf never reach the conversion: create/set refuse them */
    wq[9] = NAN;
    CHECK_STATUS(mha_layer_set_weights(L, &w), MHA_E_NONFINITE);
    wq[9] = INFINITY;
    CHECK_STATUS(mha_layer_set_weights(L, &w), MHA_E_NONFINITE);
    CHECK_INT(mha_layer_weights_dtype(L), MHA_W_BF16);
    CHECK_STATUS(mha_layer_convert_weights(L, (mha_weight_dtype)7), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("MHA_W_BF16");
    mha_layer_free(L), mha_layer_free(big);
}

static void test_int8_rounding(void) {
    /* column 0: max 1.27 -> scale 0.01, 0.005 / 0.01 = 0.5 -> 1 (away from 0);
     * W_K all zero -> scale 0, zeros, no NaN */
    mha_config c = mha_config_default(4, 1);
    c.bias = 0;
    float wq[16] = {0}, wk[16] = {0}, wv[16] = {0}, wo[16] = {0};
    wq[0] = 1.27f, wq[4] = -0.005f, wq[8] = 0.3333f, wq[12] = -1.0f;
    float want[16];
    memcpy(want, wq, sizeof wq);
    naive_round_int8(want, 4, 4, 4);
    CHECK(want[4] == -(float)1 * (1.27f / 127.0f)); /* half away from zero */
    mha_weights w = {.w_q = wq, .w_k = wk, .w_v = wv, .w_o = wo};
    mha_layer *L = NULL;
    CHECK_OK(mha_layer_create(&L, &c, &w));
    CHECK_OK(mha_layer_convert_weights(L, MHA_W_I8));
    mha_weights v;
    mha_layer_get_weights(L, &v);
    for (int i = 0; i < 16; i++)
        if (v.w_q[i] != want[i]) test_report(__FILE__, __LINE__, "w_q[%d] = %a; expected %a", i, v.w_q[i], want[i]);
    for (int i = 0; i < 16; i++) CHECK(v.w_k[i] == 0.0f && !signbit(v.w_k[i]));
    float x[8], y[8];
    for (int i = 0; i < 8; i++) x[i] = (float)i - 3.0f;
    CHECK_OK(mha_forward(L, y, NULL, x, NULL, 1, 2, 2, NULL));
    for (int i = 0; i < 8; i++) CHECK(isfinite(y[i]));
    CHECK(strcmp(mha_weight_dtype_name(MHA_W_I8), "int8") == 0);
    mha_weight_dtype d;
    CHECK_OK(mha_weight_dtype_parse(&d, "bf16"));
    CHECK_INT(d, MHA_W_BF16);
    CHECK_STATUS(mha_weight_dtype_parse(&d, "int4"), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("int4");
    mha_layer_free(L);
}

/* ---------------------------------------------- reference and prefill */

static void reference_and_prefill(mha_weight_dtype dt) {
    wcase f;
    wcase_make(&f, 48, 6, 2, dt, 11);
    uint64_t seed = 5;
    const int B = 2, T = 9, D = 48;
    float *x = outlier_x((size_t)B * T, D, &seed);
    mha_weights v, e;
    mha_layer_get_weights(f.conv, &v), mha_layer_get_weights(f.exact, &e);
    CHECK_SAME_BITS(v.w_q, e.w_q, (size_t)D * 6 * 8, "w_q");
    CHECK_SAME_BITS(v.w_o, e.w_o, (size_t)D * 48, "w_o");
    CHECK_SAME_BITS(v.w_k, e.w_k, (size_t)D * 2 * 8, "w_k");
    CHECK_SAME_BITS(v.w_v, e.w_v, (size_t)D * 2 * 8, "w_v");
    for (int p = MHA_PATH_REFERENCE; p <= MHA_PATH_FAST; p++) {
        float *yc = test_causal_forward(f.conv, x, B, T, (mha_path)p);
        float *ye = test_causal_forward(f.exact, x, B, T, (mha_path)p);
        CHECK_SAME_BITS(yc, ye, (size_t)B * T * D, p == MHA_PATH_FAST ? "fast Y" : "reference Y");
        free(yc), free(ye);
    }
    free(x);
    wcase_free(&f);
}
static void test_reference_prefill_bf16(void) { reference_and_prefill(MHA_W_BF16); }
static void test_reference_prefill_int8(void) { reference_and_prefill(MHA_W_I8); }

/* ------------------------------------------------------------- decode */

static void decode_case(mha_weight_dtype dt, int D, int h, int h_kv) {
    wcase f;
    wcase_make(&f, D, h, h_kv, dt, 23);
    uint64_t seed = 9;
    const int B = 1, T = 7; /* one row a step: the streams (two or more rows run the packed GEMM) */
    float *x = outlier_x((size_t)B * T, D, &seed);
    float *ref = test_causal_forward(f.exact, x, B, T, MHA_PATH_REFERENCE);
    float *dec = decode_all(f.conv, x, B, T), *dec32 = decode_all(f.exact, x, B, T);
    const size_t n = (size_t)B * T * D;
    if (dt == MHA_W_BF16) CHECK_SAME_BITS(dec, dec32, n, "bf16 decode vs fp32 decode of the bf16 values");
    const double err = test_max_abs_diff(dec, ref, n), err32 = test_max_abs_diff(dec32, ref, n);
    const double tol = 2 * err32 + 1e-6;
    if (!(err <= tol)) test_report(__FILE__, __LINE__, "max|decode - ref| = %.3g > %.3g", err, tol);
    /* the tolerance is far below the quantization's effect: a wrong scale
     * or rounding could not hide in it */
    float *y32 = test_causal_forward(f.orig, x, B, T, MHA_PATH_REFERENCE);
    const double eq = test_max_abs_diff(y32, ref, n);
    if (!(tol < eq / 20)) test_report(__FILE__, __LINE__, "tolerance %.3g is not << the quantization effect %.3g", tol, eq);
    /* permuted heads: the compact form moved with the fp32 one */
    int perm[8];
    for (int i = 0; i < h; i++) perm[i] = (i + h / h_kv) % h;
    CHECK_OK(mha_layer_permute_heads(f.conv, perm));
    CHECK_OK(mha_layer_permute_heads(f.exact, perm));
    free(dec), free(dec32);
    dec = decode_all(f.conv, x, B, T), dec32 = decode_all(f.exact, x, B, T);
    const double errp = test_max_abs_diff(dec, ref, n), tolp = 2 * test_max_abs_diff(dec32, ref, n) + 1e-6;
    if (!(errp <= tolp)) test_report(__FILE__, __LINE__, "permuted: max|decode - ref| = %.3g > %.3g", errp, tolp);
    free(x), free(ref), free(dec), free(dec32), free(y32);
    wcase_free(&f);
}
/* B rows a step (a batched decode): the compact weights stream once for
 * all rows (up to MHA_DECODE_COMPACT_MAX_ROWS; more run the packed fp32
 * GEMM). Each element gets the additions of the one-row stream, so every
 * sequence's rows equal, bit for bit, its own decode one row a step;
 * against the reference the tolerance rule (the fp32 layer's B-row decode
 * runs the packed GEMM); the same bits on 1 and 3 threads. */
static void decode_rows_case(mha_weight_dtype dt, int D, int h, int h_kv, int B) {
    wcase f;
    wcase_make(&f, D, h, h_kv, dt, 29);
    uint64_t seed = 13;
    const int T = 3;
    const size_t per = (size_t)T * D, n = (size_t)B * per;
    float *x = outlier_x((size_t)B * T, D, &seed);
    float *ref = test_causal_forward(f.exact, x, B, T, MHA_PATH_REFERENCE);
    mha_decode_set_min_parallel_work(0.0); /* small shapes: threads anyway */
    float *dec[2];
    for (int th = 0; th < 2; th++) {
        mha_set_num_threads(th ? 3 : 1);
        dec[th] = decode_all(f.conv, x, B, T);
    }
    mha_set_num_threads(0);
    mha_decode_set_min_parallel_work(262144.0);
    CHECK_SAME_BITS(dec[0], dec[1], n, "B-row decode on 1 vs 3 threads");
    for (int b = 0; b < B; b++) {
        float *one = decode_all(f.conv, x + b * per, 1, T);
        CHECK_SAME_BITS(dec[0] + b * per, one, per, "a sequence's rows in a B-row step vs one row a step");
        free(one);
    }
    float *dec32 = decode_all(f.exact, x, B, T);
    const double err = test_max_abs_diff(dec[0], ref, n), tol = 2 * test_max_abs_diff(dec32, ref, n) + 1e-6;
    if (!(err <= tol)) test_report(__FILE__, __LINE__, "B=%d: max|decode - ref| = %.3g > %.3g", B, err, tol);
    free(x), free(ref), free(dec[0]), free(dec[1]), free(dec32);
    wcase_free(&f);
}
/* 5 rows: a register block of 4 and one more; 16: the most that stream */
static void test_decode_rows_bf16(void) { decode_rows_case(MHA_W_BF16, 80, 4, 2, 5); }
static void test_decode_rows_int8(void) { decode_rows_case(MHA_W_I8, 80, 4, 2, 5); }
static void test_decode_rows16_bf16(void) { decode_rows_case(MHA_W_BF16, 64, 8, 8, MHA_DECODE_COMPACT_MAX_ROWS); }
static void test_decode_rows16_int8(void) { decode_rows_case(MHA_W_I8, 64, 8, 8, MHA_DECODE_COMPACT_MAX_ROWS); }

static void test_decode_bf16(void) { decode_case(MHA_W_BF16, 64, 8, 8); }
static void test_decode_bf16_gqa(void) { decode_case(MHA_W_BF16, 64, 8, 2); }
static void test_decode_int8(void) { decode_case(MHA_W_I8, 64, 8, 8); }
static void test_decode_int8_gqa(void) { decode_case(MHA_W_I8, 64, 8, 2); }
/* d_model 80, d_v 40: groups of 32 + 8 rows, W_O's restarting per head */
static void test_decode_int8_short_groups(void) { decode_case(MHA_W_I8, 80, 2, 2); }

const test_case *tests_weights_isa(size_t *count) {
    static const test_case cases[] = {
        {"weights_reference_prefill_bf16", test_reference_prefill_bf16},
        {"weights_reference_prefill_int8", test_reference_prefill_int8},
        {"weights_decode_bf16", test_decode_bf16},
        {"weights_decode_bf16_gqa", test_decode_bf16_gqa},
        {"weights_decode_int8", test_decode_int8},
        {"weights_decode_int8_gqa", test_decode_int8_gqa},
        {"weights_decode_int8_short_groups", test_decode_int8_short_groups},
        {"weights_decode_rows_bf16", test_decode_rows_bf16},
        {"weights_decode_rows_int8", test_decode_rows_int8},
        {"weights_decode_rows16_bf16", test_decode_rows16_bf16},
        {"weights_decode_rows16_int8", test_decode_rows16_int8},
    };
    *count = sizeof cases / sizeof cases[0];
    return cases;
}

/* ---------------------------------------------------- accuracy bounds */

/* rel = ||a - b|| / ||a|| and cosine of a and b (n values), held to the
 * bounds of docs/WEIGHTS.md; the error must be non-zero (the weights did
 * change). */
static void within_bound(const float *a, const float *b, size_t n, double max_rel, double min_cos, const char *what) {
    double num = 0, den = 0, dot = 0, nq = 0;
    for (size_t i = 0; i < n; i++) {
        const double d = (double)a[i] - b[i];
        num += d * d, den += (double)a[i] * a[i], dot += (double)a[i] * b[i], nq += (double)b[i] * b[i];
    }
    const double rel = sqrt(num / den), cosv = dot / sqrt(den * nq);
    if (!(rel <= max_rel && cosv >= min_cos))
        test_report(__FILE__, __LINE__, "%s: relative error %.3g (bound %.3g), cosine %.8f (bound %.8f)", what, rel,
                    max_rel, cosv, min_cos);
    CHECK(rel > 0);
}

/* Y of the converted layer against the fp32 layer, on activations with
 * outlier channels (d_model 256, 8 heads): the bounds of docs/WEIGHTS.md,
 * for the prefill (64 tokens) and for a batched decode (8 sequences of 8
 * tokens, 8 rows a step: the multi-row streams). */
static void accuracy(mha_weight_dtype dt, double max_rel, double min_cos) {
    wcase f;
    wcase_make(&f, 256, 8, 8, dt, 31);
    uint64_t seed = 3;
    const int T = 64, D = 256;
    float *x = outlier_x((size_t)T, D, &seed);
    float *y32 = test_causal_forward(f.orig, x, 1, T, MHA_PATH_FAST);
    float *yq = test_causal_forward(f.conv, x, 1, T, MHA_PATH_FAST);
    within_bound(y32, yq, (size_t)T * D, max_rel, min_cos, mha_weight_dtype_name(dt));
    free(y32), free(yq);
    y32 = decode_all(f.orig, x, 8, 8), yq = decode_all(f.conv, x, 8, 8);
    within_bound(y32, yq, (size_t)T * D, max_rel, min_cos, "batched decode");
    free(x), free(y32), free(yq);
    wcase_free(&f);
}
static void test_accuracy_bf16(void) { accuracy(MHA_W_BF16, 2e-2, 0.9998); }
static void test_accuracy_int8(void) { accuracy(MHA_W_I8, 4e-2, 0.9992); }

/* --------------------------------------------------------------- files */

static void roundtrip(mha_weight_dtype dt) {
    wcase f;
    wcase_make(&f, 32, 4, 2, dt, 41);
    char path[128];
    snprintf(path, sizeof path, "/tmp/mha-test-weights-%d-%d.safetensors", (int)getpid(), (int)dt);
    CHECK_OK(mha_layer_save(f.conv, path));
    mha_tensors *t = NULL;
    CHECK_OK(mha_safetensors_read(&t, path, 0));
    const mha_array *wq = t ? mha_tensors_get(t, "w_q") : NULL;
    CHECK(wq && wq->dtype == (dt == MHA_W_BF16 ? MHA_DTYPE_BF16 : MHA_DTYPE_I8));
    CHECK(t && strcmp(mha_tensors_meta(t, "weights_dtype"), mha_weight_dtype_name(dt)) == 0);
    CHECK(t && (mha_tensors_get(t, "w_o_scale") != NULL) == (dt == MHA_W_I8));
    mha_tensors_free(t);
    mha_layer *L = NULL;
    mha_load_options o = {0};
    CHECK_OK(mha_layer_load(&L, path, &o));
    if (L) {
        CHECK_INT(mha_layer_weights_dtype(L), dt);
        mha_weights a, b;
        mha_layer_get_weights(L, &a), mha_layer_get_weights(f.conv, &b);
        CHECK_SAME_BITS(a.w_q, b.w_q, 32 * 32, "loaded w_q");
        CHECK_SAME_BITS(a.w_o, b.w_o, 32 * 32, "loaded w_o");
        uint64_t seed = 1;
        float *x = outlier_x(8, 32, &seed);
        float *y0 = decode_all(f.conv, x, 1, 8), *y1 = decode_all(L, x, 1, 8);
        CHECK_SAME_BITS(y0, y1, 8 * 32, "decode after load");
        free(x), free(y0), free(y1);
    }
    mha_layer_free(L);
    remove(path);
    wcase_free(&f);
}
/* A weight of FLT_MAX reads back from int8 as 127 * (FLT_MAX / 127) =
 * inf: the conversion is refused naming it, and the layer stays fp32 with
 * its weights (the way bf16 refuses a weight that rounds to infinity). */
static void test_int8_flt_max(void) {
    mha_config r = naive_resolve(naive_config(32, 4, 2, 0, 0, 0));
    naive_weights w;
    uint64_t seed = 17;
    naive_weights_random(&w, &r, &seed, 0.3f);
    w.w_k[37] = -FLT_MAX;
    mha_layer *L = naive_make_layer(&w);
    CHECK_STATUS(mha_layer_convert_weights(L, MHA_W_I8), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("weights.w_k[37] = -3.40282e+38 reads back as infinity in int8");
    CHECK_INT(mha_layer_weights_dtype(L), MHA_W_F32);
    mha_weights v;
    mha_layer_get_weights(L, &v);
    CHECK(v.w_k[37] == -FLT_MAX && v.w_q[0] == w.w_q[0]);
    w.w_k[37] = -nextafterf(FLT_MAX, 0.0f); /* the next float down is held */
    CHECK_OK(mha_layer_set_weights(L, &(mha_weights){.w_q = w.w_q, .w_k = w.w_k, .w_v = w.w_v, .w_o = w.w_o}));
    CHECK_OK(mha_layer_convert_weights(L, MHA_W_I8));
    mha_layer_free(L), naive_weights_free(&w);
}

static void test_file_bf16(void) { roundtrip(MHA_W_BF16); }
static void test_file_int8(void) { roundtrip(MHA_W_I8); }

/* An int8 checkpoint's tensors with one thing broken, loaded. */
static void expect_refused(const char *what, const char *mention, mha_tensors *(*breakit)(mha_tensors *)) {
    wcase f;
    wcase_make(&f, 32, 4, 4, MHA_W_I8, 43);
    mha_tensors *t = NULL;
    CHECK_OK(mha_layer_to_tensors(&t, f.conv));
    t = breakit(t);
    mha_layer *L = NULL;
    mha_load_options o = {0};
    mha_status s = mha_layer_from_tensors(&L, t, &o);
    if (s != MHA_E_FORMAT) test_report(__FILE__, __LINE__, "%s: status %d; expected MHA_E_FORMAT", what, (int)s);
    else CHECK_ERROR_MENTIONS(mention);
    CHECK(L == NULL);
    mha_tensors_free(t);
    wcase_free(&f);
}

static float *scale_data(mha_tensors *t, const char *name) { return ((mha_array *)mha_tensors_get(t, name))->f; }
static mha_tensors *negative_scale(mha_tensors *t) { scale_data(t, "w_k_scale")[3] = -0.5f; return t; }
static mha_tensors *nan_scale(mha_tensors *t) { scale_data(t, "w_v_scale")[0] = NAN; return t; }
static mha_tensors *short_scale(mha_tensors *t) {
    ((mha_array *)mha_tensors_get(t, "w_q_scale"))->shape[1] = 31;
    return t;
}
/* the right 32 scales as a vector: the message shows the file's shape */
static mha_tensors *rank1_scale(mha_tensors *t) {
    mha_array *a = (mha_array *)mha_tensors_get(t, "w_q_scale");
    a->rank = 1, a->shape[0] = 32, a->shape[1] = 1;
    return t;
}
static mha_tensors *wrong_layout(mha_tensors *t) { mha_tensors_set_meta(t, "int8_scales", "per_output_column"); return t; }
static mha_tensors *wrong_dtype(mha_tensors *t) {
    ((mha_array *)mha_tensors_get(t, "w_o"))->dtype = MHA_DTYPE_F32;
    return t;
}
static mha_tensors *unknown_dtype(mha_tensors *t) { mha_tensors_set_meta(t, "weights_dtype", "int4"); return t; }
/* a copy of t without the tensor `drop` and the metadata key `drop_key`
 * (either may be NULL); t is freed */
static mha_tensors *copy_without(mha_tensors *t, const char *drop, const char *drop_key) {
    mha_tensors *c = NULL;
    mha_tensors_create(&c);
    for (int i = 0; i < mha_tensors_count(t); i++)
        if (!drop || strcmp(mha_tensors_name(t, i), drop))
            mha_tensors_add(c, mha_tensors_name(t, i), mha_tensors_get(t, mha_tensors_name(t, i)));
    for (int i = 0; i < mha_tensors_meta_count(t); i++)
        if (!drop_key || strcmp(mha_tensors_meta_key(t, i), drop_key))
            mha_tensors_set_meta(c, mha_tensors_meta_key(t, i), mha_tensors_meta(t, mha_tensors_meta_key(t, i)));
    mha_tensors_free(t);
    return c;
}
static mha_tensors *missing_scale(mha_tensors *t) { return copy_without(t, "w_o_scale", NULL); }
/* the int8 matrices and their scales, but no metadata saying so: read as
 * weights, the integers would be 1 / scale times too large */
static mha_tensors *undeclared_int8(mha_tensors *t) { return copy_without(t, NULL, "weights_dtype"); }
static mha_tensors *int8_bias(mha_tensors *t) {
    ((mha_array *)mha_tensors_get(t, "b_q"))->dtype = MHA_DTYPE_I8;
    return t;
}

/* codes the int8 rule never makes: refused, not cast (a float beyond
 * int8 cast to int8_t is undefined; -128 exceeds 127 * scale) */
static mha_tensors *set_code(mha_tensors *t, float code, const char *scale_name, float scale) {
    ((mha_array *)mha_tensors_get(t, "w_q"))->f[0] = code;
    if (scale_name) scale_data(t, scale_name)[0] = scale;
    return t;
}
static mha_tensors *code_minus_128(mha_tensors *t) { return set_code(t, -128.0f, NULL, 0.0f); }
static mha_tensors *code_beyond_int8(mha_tensors *t) { return set_code(t, 1000.0f, NULL, 0.0f); }
static mha_tensors *code_fraction(mha_tensors *t) { return set_code(t, 0.5f, NULL, 0.0f); }
static mha_tensors *code_with_zero_scale(mha_tensors *t) { return set_code(t, 5.0f, "w_q_scale", 0.0f); }
static mha_tensors *code_overflows(mha_tensors *t) { return set_code(t, 127.0f, "w_q_scale", 1e38f); }

static void test_file_refusals(void) {
    expect_refused("negative scale", "w_k_scale'[3] = -0.5", negative_scale);
    expect_refused("NaN scale", "w_v_scale'[0]", nan_scale);
    expect_refused("short scale", "expected F32 (1, 32)", short_scale);
    expect_refused("rank-1 scale", "'w_q_scale' is float32 of shape (32); expected F32 (1, 32)", rank1_scale);
    expect_refused("scale layout", "per_32_inputs", wrong_layout);
    expect_refused("tensor dtype", "'w_o' is float32", wrong_dtype);
    expect_refused("unknown dtype", "int4", unknown_dtype);
    expect_refused("missing scale", "w_o_scale", missing_scale);
    expect_refused("int8 without weights_dtype", "'w_q' is int8", undeclared_int8);
    expect_refused("int8 bias", "'b_q' is int8", int8_bias);
    expect_refused("code -128", "'w_q'[0][0] = -128", code_minus_128);
    expect_refused("code 1000", "expected an integer in [-127, 127]", code_beyond_int8);
    expect_refused("code 0.5", "'w_q'[0][0] = 0.5", code_fraction);
    expect_refused("code with scale 0", "expected 0, as its scale is 0", code_with_zero_scale);
    expect_refused("code * scale = inf", "q * scale is finite", code_overflows);
}

/* int8 weights in another layout (no scales can come with them): an
 * HF-named q_proj.weight of int8 is refused, not read as its integers. */
static void test_file_int8_other_layout(void) {
    enum { D = 32 };
    uint64_t seed = 5;
    float *v = naive_random_floats((size_t)D * D, &seed, -1.0f, 1.0f);
    float *q = malloc(sizeof(float) * D * D);
    for (int i = 0; q && i < D * D; i++) q[i] = (float)(int)(v[i] * 127.0f); /* int8 values held as float */
    mha_tensors *t = NULL;
    CHECK_OK(mha_tensors_create(&t));
    const char *names[4] = {"q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight"};
    for (int m = 0; t && q && m < 4; m++) {
        mha_array a = {.dtype = m == 0 ? MHA_DTYPE_I8 : MHA_DTYPE_F32, .rank = 2, .shape = {D, D, 1, 1},
                       .count = (size_t)D * D, .f = m == 0 ? q : v};
        CHECK_OK(mha_tensors_add(t, names[m], &a));
    }
    mha_layer *L = NULL;
    mha_load_options o = {0};
    o.n_heads = 4;
    CHECK_STATUS(mha_layer_from_tensors(&L, t, &o), MHA_E_FORMAT);
    CHECK_ERROR_MENTIONS("'q_proj.weight' is int8");
    CHECK(L == NULL);
    mha_layer_free(L);
    mha_tensors_free(t);
    free(q), free(v);
}

/* An fp32 layer saves no dtype metadata (its files are as before). */
static void test_file_f32_unchanged(void) {
    wcase f;
    wcase_make(&f, 16, 2, 2, MHA_W_BF16, 47);
    mha_tensors *t = NULL;
    CHECK_OK(mha_layer_to_tensors(&t, f.orig));
    CHECK(t && !mha_tensors_meta(t, "weights_dtype") && mha_tensors_get(t, "w_q")->dtype == MHA_DTYPE_F32);
    mha_tensors_free(t);
    /* converting back to f32 keeps the rounded values, as fp32 */
    CHECK_OK(mha_layer_convert_weights(f.conv, MHA_W_F32));
    CHECK_INT(mha_layer_weights_dtype(f.conv), MHA_W_F32);
    mha_weights a, b;
    mha_layer_get_weights(f.conv, &a), mha_layer_get_weights(f.exact, &b);
    CHECK_SAME_BITS(a.w_q, b.w_q, 16 * 16, "w_q after f32");
    wcase_free(&f);
}

/* ------------------------------------------------- the stream kernels */

/* Every table's bf16 and int8 streams give the scalar table's bits for
 * 1 to 17 rows (register blocks of 4 and their remainders), widths with
 * every column tail (64-, 16- and 8-wide vectors, masked and scalar
 * tails) and row strides past the width; and m rows at once give the
 * bits of m one-row calls (the weights are shared, not the sums), with
 * one row (AVX2: and two) taken as tiles and as a sweep
 * (mha_force_row_sweep). */
static void test_stream_kernels_rows(void) {
    const mha_decode_kernels *tab[3] = {&mha_decode_kernels_scalar, &mha_decode_kernels_avx2,
                                        &mha_decode_kernels_avx512};
    const int live[3] = {1, mha_cpu_has_avx2(), mha_cpu_has_avx512()};
    const int ms[] = {1, 2, 3, 4, 5, 9, 17}, ns[] = {7, 64, 93, 150}, K = 45, ld = 160;
    uint64_t seed = 77;
    float *x = naive_random_floats((size_t)17 * ld, &seed, -2.0f, 2.0f);
    float *wf = naive_random_floats((size_t)K * ld, &seed, -1.0f, 1.0f);
    float *sc = naive_random_floats(ld, &seed, 0.001f, 0.01f), *y0 = naive_random_floats((size_t)17 * ld, &seed, -1, 1);
    uint16_t *wb = malloc(sizeof(uint16_t) * K * ld);
    int8_t *wi = malloc((size_t)K * ld);
    for (int e = 0; e < K * ld; e++) {
        float r = naive_round_bf16(wf[e]);
        memcpy(&wb[e], (char *)&r + 2, 2); /* the high half: bf16 bits (little endian) */
        wi[e] = (int8_t)lrintf(wf[e] * 127.0f);
    }
    float *y[3], *y1 = naive_alloc_floats((size_t)17 * ld);
    for (int t = 0; t < 3; t++) y[t] = naive_alloc_floats((size_t)17 * ld);
    for (int form = 0; form < 4; form++) { /* int8 or bf16; one row as tiles or as a sweep */
        const int i8 = form & 1;
        mha_force_row_sweep(form >> 1);
        for (size_t a = 0; a < sizeof ms / sizeof ms[0]; a++)
            for (size_t b = 0; b < sizeof ns / sizeof ns[0]; b++) {
                /* int8: one scale group, or part of one; a k not a multiple of
                 * the sweeps' rows per pass (4) tests their last rows */
                const int m = ms[a], n = ns[b], k = i8 ? (n == 7 ? 3 : n % 2 ? 29 : 32) : (n % 2 ? K : K - 2);
                for (int t = 0; t < 3; t++) {
                    if (!live[t]) continue;
                    memcpy(y[t], y0, sizeof(float) * 17 * ld), memcpy(y1, y0, sizeof(float) * 17 * ld);
                    if (i8) tab[t]->gemm_stream_i8(y[t], ld, x, ld, wi, ld, sc, m, k, n);
                    else tab[t]->gemm_stream_bf16(y[t], ld, x, ld, wb, ld, m, k, n);
                    for (int r = 0; r < m; r++)
                        if (i8) tab[t]->gemm_stream_i8(y1 + r * ld, ld, x + r * ld, ld, wi, ld, sc, 1, k, n);
                        else tab[t]->gemm_stream_bf16(y1 + r * ld, ld, x + r * ld, ld, wb, ld, 1, k, n);
                    if (memcmp(y[t], y1, sizeof(float) * 17 * ld) != 0)
                        test_report(__FILE__, __LINE__, "%s %s: %d rows at once differ from one at a time (n %d)",
                                    tab[t]->name, i8 ? "int8" : "bf16", m, n);
                    if (memcmp(y[t], y[0], sizeof(float) * 17 * ld) != 0)
                        test_report(__FILE__, __LINE__, "%s %s: %d rows, n %d differ from the scalar table",
                                    tab[t]->name, i8 ? "int8" : "bf16", m, n);
                }
                CHECK(memcmp(y[0], y0, sizeof(float) * n) != 0); /* the kernel did write */
            }
    }
    mha_force_row_sweep(-1);
    free(x), free(wf), free(sc), free(y0), free(wb), free(wi), free(y1);
    for (int t = 0; t < 3; t++) free(y[t]);
}

const test_case *tests_weights(size_t *count) {
    static const test_case cases[] = {
        {"weights_bf16_rounding", test_bf16_rounding},
        {"weights_int8_rounding", test_int8_rounding},
        {"weights_stream_kernels_rows", test_stream_kernels_rows},
        {"weights_accuracy_bf16", test_accuracy_bf16},
        {"weights_accuracy_int8", test_accuracy_int8},
        {"weights_int8_flt_max", test_int8_flt_max},
        {"weights_file_bf16", test_file_bf16},
        {"weights_file_int8", test_file_int8},
        {"weights_file_refusals", test_file_refusals},
        {"weights_file_int8_other_layout", test_file_int8_other_layout},
        {"weights_file_f32_unchanged", test_file_f32_unchanged},
    };
    *count = sizeof cases / sizeof cases[0];
    return cases;
}
