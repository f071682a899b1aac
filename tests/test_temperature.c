/* test_temperature.c — Llama 4's attention temperature (config.temperature_
 * floor / temperature_scale, attn_temperature_tuning on its NoPE layers):
 * the query at position p is multiplied by s(p) = 1 + a ln(1 + floor((p +
 * 1) / F)) after QK-norm and RoPE. The oracle needs no second statement of
 * the code: a query row's output depends on its own q alone, so row i of
 * the layer equals row i of the plain layer whose W_Q and b_Q (or, with a
 * QK-norm, whose q_norm weights) are multiplied by s(p_i), with s written
 * here from the formula. The reference and the fast path on every ISA,
 * the cache's steps against the uncached forward, the fast backward
 * against the reference, and the refusals.
 * Legend: B, T, S, h, h_kv, d_k, D = d_model; F the floor, a the scale. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"
#include "naive.h"
#include "tests.h"

enum { D = 32, H = 4, HKV = 2, DK = D / H };

/* s(p) by hand, in double; Ministral 3's rule: floor(p / F) */
static double temperature(int F, double a, int p, int ministral) {
    return 1.0 + a * log(1.0 + floor((p + (ministral ? 0.0 : 1.0)) / F));
}

typedef struct {
    const char *what;
    int norm, rope, alibi, causal, positions, cross; /* positions: explicit, spread past several floors */
    float softcap;
    int ministral; /* MHA_TEMPERATURE_MINISTRAL3: floor(p / F) */
} temp_case;

static const temp_case temp_cases[] = {
    {"Llama 4 NoPE layer, GQA, causal", 0, 0, 0, 1, 0, 0, 0.0f, 0},
    {"explicit positions", 0, 0, 0, 0, 1, 0, 0.0f, 0},
    {"RoPE and RMS QK-norm (the order: norm, RoPE, temperature)", 1, 1, 0, 1, 0, 0, 0.0f, 0},
    {"ALiBi and softcap (the bias is not scaled)", 0, 0, 1, 1, 1, 0, 4.0f, 0},
    {"cross-attention", 0, 0, 0, 0, 0, 1, 0.0f, 0},
    {"Ministral 3's rule, RoPE", 0, 1, 0, 1, 0, 0, 0.0f, 1},
    {"Ministral 3's rule, explicit positions", 0, 0, 0, 0, 1, 0, 0.0f, 1},
};

/* the layer of a case from weights w; temperature F, a (0: none), and
 * W_Q, b_Q (or q_norm with a norm) times s (1: as given) */
static mha_layer *case_layer(const temp_case *k, const naive_weights *w, int F, float a, double s) {
    mha_config c = w->cfg;
    c.temperature_floor = F, c.temperature_scale = a;
    c.temperature_rule = F && k->ministral ? MHA_TEMPERATURE_MINISTRAL3 : MHA_TEMPERATURE_LLAMA4;
    naive_weights m = *w;
    const size_t nq = (size_t)D * H * DK;
    float *wq = malloc(sizeof(float) * nq), *bq = malloc(sizeof(float) * H * DK), *qn = malloc(sizeof(float) * DK);
    for (size_t i = 0; i < nq; i++) wq[i] = k->norm ? w->w_q[i] : (float)(w->w_q[i] * s);
    for (int i = 0; i < H * DK; i++) bq[i] = k->norm ? w->b_q[i] : (float)(w->b_q[i] * s);
    for (int i = 0; k->norm && i < DK; i++) qn[i] = (float)(w->q_norm[i] * s);
    m.w_q = wq, m.b_q = bq;
    if (k->norm) m.q_norm = qn;
    mha_weights v = naive_weights_view(&m);
    mha_layer *L = NULL;
    CHECK_OK(mha_layer_create(&L, &c, &v));
    free(wq), free(bq), free(qn);
    return L;
}

/* Both paths of the layer with a temperature against the plain layers
 * with the scaled queries, row by row. F 3, a 0.4: the queries of T 14
 * see five factors (1 to 1.72); explicit positions reach 40. */
static void temperature_matches_scaled_queries(void) {
    const int B = 2, T = 14, F = 3;
    const float a = 0.4f;
    for (size_t n = 0; n < sizeof temp_cases / sizeof temp_cases[0]; n++) {
        const temp_case *k = &temp_cases[n];
        const int S = k->cross ? 9 : T;
        mha_config c = naive_config(D, H, HKV, 0, 0, 1);
        if (k->rope) c.rope.pairing = MHA_ROPE_HALVES, c.rope.theta = 100.0;
        if (k->norm) c.qk_norm = MHA_QK_NORM_RMS, c.qk_norm_eps = 1e-5f;
        c.alibi = k->alibi, c.softcap = k->softcap;
        mha_config r = naive_resolve(c);
        naive_weights w;
        uint64_t seed = 300 + n;
        naive_weights_random(&w, &r, &seed, 0.5f);
        const size_t ny = (size_t)B * T * D;
        float *x = naive_random_floats(ny, &seed, -1, 1);
        float *kv = k->cross ? naive_random_floats((size_t)B * S * D, &seed, -1, 1) : NULL;
        float *want = naive_alloc_floats(ny), *got = naive_alloc_floats(ny), *row = naive_alloc_floats(ny);
        int pos[2 * 14], kpos[2 * 14];
        for (int i = 0; i < B * T; i++) pos[i] = (i * 7) % 41;
        for (int i = 0; i < B * S; i++) kpos[i] = (i * 5) % 37;
        mha_options o = mha_options_default();
        o.causal = k->causal;
        if (k->positions) o.positions = pos, o.key_positions = kv ? kpos : NULL;
        o.path = MHA_PATH_REFERENCE;
        /* the oracle: each query row from the plain layer scaled by its s
         * (the positions given to it only where it has RoPE or ALiBi) */
        mha_options po = o;
        if (!k->rope && !k->alibi) po.positions = po.key_positions = NULL;
        for (int b = 0; b < B; b++)
            for (int t = 0; t < T; t++) {
                const int p = k->positions ? pos[b * T + t] : t;
                mha_layer *P = case_layer(k, &w, 0, 0.0f, temperature(F, a, p, k->ministral));
                if (P) CHECK_OK(mha_forward(P, row, NULL, x, kv, B, T, S, &po));
                memcpy(want + ((size_t)b * T + t) * D, row + ((size_t)b * T + t) * D, sizeof(float) * D);
                mha_layer_free(P);
            }
        mha_layer *L = case_layer(k, &w, F, a, 1.0);
        for (int path = 0; L && path < 2; path++) {
            o.path = path ? MHA_PATH_FAST : MHA_PATH_REFERENCE;
            CHECK_OK(mha_forward(L, got, NULL, x, kv, B, T, S, &o));
            double err = 0, big = 0;
            for (size_t i = 0; i < ny; i++) err = fmax(err, fabs((double)got[i] - want[i])), big = fmax(big, fabs(want[i]));
            if (!(err <= 2e-6 * big + 1e-7))
                test_report(__FILE__, __LINE__, "%s %s: %.3g from the scaled-query oracle (kernels=%s)", k->what,
                            path ? "fast" : "reference", err, mha_kernels_get()->name);
        }
        /* the temperature matters: the plain layer gives another y */
        mha_layer *P = case_layer(k, &w, 0, 0.0f, 1.0);
        if (P) CHECK_OK(mha_forward(P, row, NULL, x, kv, B, T, S, &po));
        CHECK(test_max_abs_diff(row, want, ny) > 1e-3);
        mha_layer_free(P), mha_layer_free(L);
        naive_weights_free(&w);
        free(x), free(kv), free(want), free(got), free(row);
    }
}

/* The cache: a prefill of 5 then single steps to 30 (F 4: the factor
 * changes every 4 positions) give the rows of one uncached forward, for
 * fp32 and fp16 caches. */
static void temperature_cache_steps_match_forward(void) {
    const int T = 30;
    for (int half = 0; half < 2; half++) {
        mha_config c = naive_config(D, H, HKV, 0, 0, 1);
        c.temperature_floor = 4, c.temperature_scale = 0.5f;
        mha_config r = naive_resolve(c);
        naive_weights w;
        uint64_t seed = 320 + half;
        naive_weights_random(&w, &r, &seed, 0.5f);
        mha_weights v = naive_weights_view(&w);
        mha_layer *L = NULL;
        CHECK_OK(mha_layer_create(&L, &c, &v));
        float *x = naive_random_floats((size_t)T * D, &seed, -1, 1), *want = naive_alloc_floats((size_t)T * D);
        float *got = naive_alloc_floats((size_t)T * D);
        mha_options o = mha_options_default();
        o.causal = 1;
        mha_cache *cache = NULL;
        if (L) CHECK_OK(mha_forward(L, want, NULL, x, NULL, 1, T, T, &o));
        if (L) CHECK_OK(mha_cache_create(&cache, L, 1, 32, half ? MHA_CACHE_F16 : MHA_CACHE_F32, 0));
        for (int t = 0; cache && t < T;) {
            const int n = t == 0 ? 5 : 1;
            CHECK_OK(mha_forward_cached(L, cache, got + (size_t)t * D, NULL, x + (size_t)t * D, n, NULL, NULL));
            t += n;
        }
        if (cache) {
            const double e = test_max_abs_diff(got, want, (size_t)T * D), bound = half ? 2e-3 : 2e-6;
            if (!(e < bound))
                test_report(__FILE__, __LINE__, "%s cache: steps %.3g from the forward (kernels=%s)", half ? "fp16" : "fp32",
                            e, mha_kernels_get()->name);
        }
        mha_cache_free(cache);
        free(x), free(want), free(got);
        mha_layer_free(L);
        naive_weights_free(&w);
    }
}

static void expect_config_refused(int F, float a, int add_bias_kv, const char *mention) {
    mha_config c = naive_config(D, H, 0, 0, 0, 1);
    c.temperature_floor = F, c.temperature_scale = a, c.add_bias_kv = add_bias_kv;
    mha_config out;
    CHECK_STATUS(mha_config_resolve(&out, &c), MHA_E_ARG);
    CHECK_ERROR_MENTIONS(mention);
}

static void temperature_refusals(void) {
    expect_config_refused(-1, 0.1f, 0, "temperature_floor=-1 temperature_scale=0.1; expected both 0 (none)");
    expect_config_refused(0, 0.1f, 0, "temperature_floor=0 temperature_scale=0.1");
    expect_config_refused(8192, 0.0f, 0, "temperature_floor=8192 temperature_scale=0;");
    expect_config_refused(8192, -0.1f, 0, "temperature_scale=-0.1");
    expect_config_refused(8192, NAN, 0, "temperature_scale=nan");
    expect_config_refused(8192, 0.1f, 1, "add_bias_kv/add_zero_attn with rope, alibi, softcap, sinks, qk_norm, "
                          "clip_qkv or a temperature");
    mha_config rc = naive_config(D, H, 0, 0, 0, 1), rout;
    rc.temperature_rule = MHA_TEMPERATURE_MINISTRAL3; /* a rule without a floor */
    CHECK_STATUS(mha_config_resolve(&rout, &rc), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("temperature_rule=1 with temperature_floor=0");
    rc.temperature_floor = 4, rc.temperature_scale = 0.1f, rc.temperature_rule = (mha_temperature_rule)2;
    CHECK_STATUS(mha_config_resolve(&rout, &rc), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("temperature_rule=2");
    /* mha_attend_lse takes projected q: the temperature is the caller's */
    mha_config c = naive_config(D, H, 0, 0, 0, 1);
    c.temperature_floor = 4, c.temperature_scale = 0.1f;
    float q[DK * H] = {0}, kk[DK * H] = {0}, z[DK * H], lse[H];
    CHECK_STATUS(mha_attend_lse(&c, z, lse, q, kk, kk, 1, 1, 1, NULL), MHA_E_UNSUPPORTED);
    CHECK_ERROR_MENTIONS("temperature_floor=4");
    /* positions reach a NoPE layer with a temperature (they set its factors) */
    mha_config r = naive_resolve(c);
    naive_weights w;
    uint64_t seed = 330;
    naive_weights_random(&w, &r, &seed, 0.5f);
    mha_weights v = naive_weights_view(&w);
    mha_layer *L = NULL;
    CHECK_OK(mha_layer_create(&L, &c, &v));
    float x[2 * D] = {0.5f}, y[2 * D];
    int pos[2] = {100, 7};
    mha_options o = mha_options_default();
    o.positions = pos;
    if (L) CHECK_OK(mha_forward(L, y, NULL, x, NULL, 1, 2, 2, &o));
    mha_layer_free(L);
    naive_weights_free(&w);
}

static const test_case cases[] = {
    {"temperature_refusals", temperature_refusals},
};

static const test_case isa_cases[] = {
    {"temperature_matches_scaled_queries", temperature_matches_scaled_queries},
    {"temperature_cache_steps_match_forward", temperature_cache_steps_match_forward},
};

const test_case *tests_temperature(size_t *count) {
    *count = sizeof cases / sizeof cases[0];
    return cases;
}

const test_case *tests_temperature_isa(size_t *count) {
    *count = sizeof isa_cases / sizeof isa_cases[0];
    return isa_cases;
}
