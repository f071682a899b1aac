/* test_cache_cross.c — the cross-attention memory (mha_cache_create_cross,
 * mha_cache_set_memory) against the reference path's cross-attention:
 * mha_forward(layer, .., kv, v_src, B, T, S) with options.key_keep
 * marking each sequence's first s_len[b] keys. Every query attends the
 * whole memory, so T queries at once, one at a time, and on every kernel
 * set give the reference's y within the storage type's bound.
 * Legend: B sequences, T queries, S memory rows, d_model D. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "naive.h"
#include "test_util.h"
#include "tests.h"

enum { B = 3, T = 5, S = 11 };
static const int S_LEN[B] = {11, 4, 7};

typedef struct {
    int h, h_kv, D, d_kv_in, d_v_in; /* d_v_in 0: the value source is kv */
    mha_cache_dtype kt, vt;
    int extras, sinks, rms_norm, whole_norm;
    float softcap, clip;
    mha_weight_dtype wdt;
} cross_case;

/* Bound of |y - y_ref| / (1 + max|y_ref|) by the memory's storage type:
 * fp32 rounding; fp16 and int8 K/V (as tests/test_cache_i8.c measures). */
static double bound(const cross_case *cc) {
    const mha_cache_dtype worst = cc->kt > cc->vt ? cc->kt : cc->vt;
    return worst == MHA_CACHE_I8 ? 3e-2 : worst == MHA_CACHE_F16 ? 3e-3 : 2e-6;
}

static mha_layer *case_layer(const cross_case *cc, naive_weights *w) {
    mha_config c = naive_config(cc->D, cc->h, cc->h_kv, 8, 8, 1);
    c.d_kv_in = cc->d_kv_in, c.d_v_in = cc->d_v_in ? cc->d_v_in : cc->d_kv_in;
    c.add_bias_kv = c.add_zero_attn = cc->extras;
    c.sinks = cc->sinks, c.softcap = cc->softcap, c.clip_qkv = cc->clip;
    if (cc->rms_norm) c.qk_norm = MHA_QK_NORM_RMS, c.qk_norm_per_head = 1, c.qk_norm_whole = cc->whole_norm;
    c = naive_resolve(c);
    uint64_t seed = 11;
    naive_weights_random(w, &c, &seed, 0.5f);
    mha_layer *L = naive_make_layer(w);
    if (L && cc->wdt != MHA_W_F32) CHECK_OK(mha_layer_convert_weights(L, cc->wdt));
    return L;
}

static void memory_matches_reference(const cross_case *cc) {
    naive_weights w;
    mha_layer *L = case_layer(cc, &w);
    const int dvin = cc->d_v_in ? cc->d_v_in : cc->d_kv_in;
    uint64_t seed = 23;
    float *x = naive_random_floats((size_t)B * T * cc->D, &seed, -1, 1);            /* (B, T, D) */
    float *kv = naive_random_floats((size_t)B * S * cc->d_kv_in, &seed, -1, 1);     /* (B, S, d_kv_in) */
    float *vs = cc->d_v_in ? naive_random_floats((size_t)B * S * dvin, &seed, -1, 1) : kv; /* (B, S, d_v_in) */
    for (int b = 0; b < B; b++) /* padding rows past s_len may hold anything */
        for (int j = S_LEN[b]; j < S; j++) kv[((size_t)b * S + j) * cc->d_kv_in] = NAN;
    uint8_t keep[B * S];
    for (int b = 0; b < B; b++)
        for (int j = 0; j < S; j++) keep[b * S + j] = j < S_LEN[b];
    float *kv_ref = malloc(sizeof(float) * B * S * cc->d_kv_in); /* the reference refuses NaN even where masked */
    memcpy(kv_ref, kv, sizeof(float) * B * S * cc->d_kv_in);
    for (size_t i = 0; i < (size_t)B * S * cc->d_kv_in; i++)
        if (isnan(kv_ref[i])) kv_ref[i] = 0.0f;
    const size_t ny = (size_t)B * T * cc->D;
    float *yref = naive_alloc_floats(ny), *y = naive_alloc_floats(ny), *y1 = naive_alloc_floats((size_t)B * cc->D);
    mha_options o = naive_ref_options();
    o.key_keep = keep;
    mha_cache *c = NULL;
    if (L) CHECK_OK(mha_forward_kv(L, yref, NULL, x, kv_ref, cc->d_v_in ? vs : kv_ref, B, T, S, &o));
    if (L) CHECK_OK(mha_cache_create_cross(&c, L, B, S + 3, cc->kt, cc->vt));
    if (c) CHECK_OK(mha_cache_set_memory(c, L, kv, cc->d_v_in ? vs : NULL, S, S_LEN));
    double scale = 1.0;
    for (size_t i = 0; i < ny; i++) scale = fmax(scale, 1.0 + fabs(yref[i]));
    static const char *const sets[] = {"avx512", "avx2", "scalar"};
    mha_context *ctx = NULL;
    CHECK_OK(mha_context_create(&ctx));
    for (int k = 0; c && ctx && k < 3; k++) {
        if (mha_context_set_kernels(ctx, sets[k]) != MHA_OK) continue; /* not on this CPU */
        CHECK_OK(mha_forward_cached_ctx(ctx, L, c, y, NULL, x, T, NULL, NULL)); /* T queries at once */
        CHECK_ARRAY_NEAR(y, yref, ny, bound(cc) * scale);
        for (int t = 0; t < T; t++) { /* one at a time, in another order: nothing is appended */
            const int tt = T - 1 - t;
            float xt[B * 64];
            for (int b = 0; b < B; b++) memcpy(xt + b * cc->D, x + ((size_t)b * T + tt) * cc->D, sizeof(float) * cc->D);
            CHECK_OK(mha_forward_cached_ctx(ctx, L, c, y1, NULL, xt, 1, NULL, NULL));
            for (int b = 0; b < B; b++)
                memcpy(y + ((size_t)b * T + tt) * cc->D, y1 + (size_t)b * cc->D, sizeof(float) * cc->D);
        }
        CHECK_ARRAY_NEAR(y, yref, ny, bound(cc) * scale);
        for (int b = 0; b < B; b++) CHECK_INT(mha_cache_length(c, b), S_LEN[b]);
    }
    /* the low-level entry: mha_cache_attend of the projected queries is the z the forward captures
     * (no extra keys there: only for layers without them) */
    if (c && !cc->extras && cc->wdt == MHA_W_F32 && !cc->rms_norm && cc->clip == 0.0f && cc->softcap == 0.0f &&
        !cc->sinks) {
        const int wq = cc->h * 8, wz = cc->h * 8;
        float *q = naive_alloc_floats((size_t)B * T * wq), *z = naive_alloc_floats((size_t)B * T * wz);
        float *zc = naive_alloc_floats((size_t)B * T * wz);
        for (int r = 0; r < B * T; r++) /* q = x W_Q + b_Q, in double */
            for (int j = 0; j < wq; j++) {
                double acc = w.b_q ? w.b_q[j] : 0.0;
                for (int e = 0; e < cc->D; e++) acc += (double)x[(size_t)r * cc->D + e] * w.w_q[(size_t)e * wq + j];
                q[(size_t)r * wq + j] = (float)acc;
            }
        mha_capture cz = {.z = zc};
        CHECK_OK(mha_forward_cached(L, c, y, &cz, x, T, NULL, NULL));
        CHECK_OK(mha_cache_attend(c, z, q, T, NULL, 0.0f));
        CHECK(test_max_rel_diff(z, zc, (size_t)B * T * wz) <= 1e-5);
        free(q), free(z), free(zc);
    }
    /* the probabilities: memory column j is slot j, the extra keys at capacity, capacity+1 */
    const int ex = cc->extras * 2, wr = S + ex, wc = S + 3 + ex;
    float *pr = naive_alloc_floats((size_t)B * cc->h * T * wr), *pc = naive_alloc_floats((size_t)B * cc->h * T * wc);
    mha_capture capr = {.probs = pr}, capc = {.probs = pc};
    if (c) {
        CHECK_OK(mha_forward_kv(L, yref, &capr, x, kv_ref, cc->d_v_in ? vs : kv_ref, B, T, S, &o));
        CHECK_OK(mha_forward_cached(L, c, y, &capc, x, T, NULL, NULL));
        double worst = 0.0;
        for (size_t row = 0; row < (size_t)B * cc->h * T; row++)
            for (int j = 0; j < wc; j++) {
                const double want = j < S ? pr[row * wr + j] : j >= S + 3 ? pr[row * wr + S + (j - S - 3)] : 0.0;
                worst = fmax(worst, fabs(pc[row * wc + j] - want));
            }
        CHECK(worst <= bound(cc) * 10); /* probabilities are at most 1 */
    }
    free(pr), free(pc);
    mha_context_free(ctx);
    mha_cache_free(c), mha_layer_free(L), naive_weights_free(&w);
    free(x), free(kv), free(kv_ref), free(yref), free(y), free(y1);
    if (cc->d_v_in) free(vs);
}

static void test_cross_plain(void) {
    cross_case cc = {4, 4, 32, 32, 0, MHA_CACHE_F32, MHA_CACHE_F32, 0, 0, 0, 0, 0, 0, MHA_W_F32};
    memory_matches_reference(&cc);
}
/* encoder wider than the decoder, GQA, values from their own source */
static void test_cross_gqa_own_widths(void) {
    cross_case cc = {4, 2, 32, 48, 24, MHA_CACHE_F32, MHA_CACHE_F32, 0, 0, 0, 0, 0, 0, MHA_W_F32};
    memory_matches_reference(&cc);
}
/* torch's add_bias_kv / add_zero_attn keys after the memory's */
static void test_cross_extra_keys_fp16(void) {
    cross_case cc = {4, 4, 32, 40, 0, MHA_CACHE_F16, MHA_CACHE_F16, 1, 0, 0, 0, 0, 0, MHA_W_F32};
    memory_matches_reference(&cc);
}
static void test_cross_variants_int8(void) {
    cross_case cc = {4, 1, 32, 32, 0, MHA_CACHE_I8, MHA_CACHE_F16, 0, 1, 1, 0, 4.0f, 0.9f, MHA_W_F32};
    memory_matches_reference(&cc);
}
static void test_cross_whole_norm_bf16_weights(void) {
    cross_case cc = {4, 2, 32, 32, 0, MHA_CACHE_F32, MHA_CACHE_F32, 0, 0, 1, 1, 0, 0, MHA_W_BF16};
    memory_matches_reference(&cc);
}

/* What a memory refuses, and that a refused call leaves it as it was. */
static void test_cross_refusals(void) {
    naive_weights w;
    const cross_case cc = {4, 2, 32, 32, 0, MHA_CACHE_F32, MHA_CACHE_F32, 0, 0, 0, 0, 0, 0, MHA_W_F32};
    mha_layer *L = case_layer(&cc, &w);
    uint64_t seed = 5;
    float *x = naive_random_floats((size_t)B * T * 32, &seed, -1, 1), *kv = naive_random_floats((size_t)B * S * 32, &seed, -1, 1);
    float *y = naive_alloc_floats((size_t)B * T * 32), *y2 = naive_alloc_floats((size_t)B * T * 32);
    mha_cache *c = NULL, *self = NULL;
    if (L) CHECK_OK(mha_cache_create_cross(&c, L, B, S, MHA_CACHE_F32, MHA_CACHE_F32));
    if (L) CHECK_OK(mha_cache_create(&self, L, B, S, MHA_CACHE_F32, 0));
    if (c && self) {
        CHECK_STATUS(mha_forward_cached(L, c, y, NULL, x, T, NULL, NULL), MHA_E_ARG);
        CHECK_ERROR_MENTIONS("sequence 0 of the cross-attention memory is empty");
        float q0[B * 4 * 8] = {0}, z0[B * 4 * 8];
        CHECK_STATUS(mha_cache_attend(c, z0, q0, 1, NULL, 0.0f), MHA_E_ARG);
        CHECK_ERROR_MENTIONS("holds 0 tokens; expected mha_cache_set_memory first");
        CHECK_STATUS(mha_cache_set_memory(self, L, kv, NULL, S, NULL), MHA_E_ARG);
        CHECK_ERROR_MENTIONS("expected one made by mha_cache_create_cross");
        CHECK_STATUS(mha_cache_set_memory(c, L, kv, NULL, S + 1, NULL), MHA_E_ARG);
        CHECK_ERROR_MENTIONS("S=12; expected 1..capacity=11");
        CHECK_STATUS(mha_cache_set_memory(c, L, kv, NULL, S, (const int[B]){3, 0, 2}), MHA_E_ARG);
        CHECK_ERROR_MENTIONS("s_len[1]=0; expected 1..S=11");
        CHECK_OK(mha_cache_set_memory(c, L, kv, NULL, S, NULL));
        CHECK_OK(mha_forward_cached(L, c, y, NULL, x, T, NULL, NULL));
        kv[S * 32 + 5] = INFINITY; /* sequence 1, row 0 */
        CHECK_STATUS(mha_cache_set_memory(c, L, kv, NULL, S, NULL), MHA_E_NONFINITE);
        CHECK_ERROR_MENTIONS("kv[357] = inf (sequence 1)");
        CHECK_STATUS(mha_cache_append(c, x, x, 1, NULL), MHA_E_ARG);
        CHECK_ERROR_MENTIONS("cross-attention memory");
        mha_options o = mha_options_default();
        o.window_left = 2;
        CHECK_STATUS(mha_forward_cached(L, c, y2, NULL, x, T, NULL, &o), MHA_E_ARG);
        CHECK_ERROR_MENTIONS("options.window_left on a cross-attention memory");
        CHECK_OK(mha_forward_cached(L, c, y2, NULL, x, T, NULL, NULL));
        CHECK(memcmp(y, y2, sizeof(float) * B * T * 32) == 0); /* the refused calls changed nothing */
        /* beam search: the memory follows its sequence */
        CHECK_OK(mha_cache_reorder(c, (const int[B]){2, 0, 0}));
        CHECK_OK(mha_forward_cached(L, c, y2, NULL, x, T, NULL, NULL));
        for (int b = 0; b < B; b++) CHECK_INT(mha_cache_length(c, b), S);
        float *kr = naive_alloc_floats((size_t)B * S * 32), *yr = naive_alloc_floats((size_t)B * T * 32);
        kv[S * 32 + 5] = 0.25f;
        mha_cache *fresh = NULL;
        CHECK_OK(mha_cache_set_memory(c, L, kv, NULL, S, NULL)); /* the finite memory again, then reordered */
        CHECK_OK(mha_cache_reorder(c, (const int[B]){2, 0, 0}));
        CHECK_OK(mha_forward_cached(L, c, y2, NULL, x, T, NULL, NULL));
        for (int b = 0; b < B; b++) memcpy(kr + (size_t)b * S * 32, kv + (size_t)(b == 0 ? 2 : 0) * S * 32, sizeof(float) * S * 32);
        CHECK_OK(mha_cache_create_cross(&fresh, L, B, S, MHA_CACHE_F32, MHA_CACHE_F32));
        if (fresh) CHECK_OK(mha_cache_set_memory(fresh, L, kr, NULL, S, NULL));
        if (fresh) CHECK_OK(mha_forward_cached(L, fresh, yr, NULL, x, T, NULL, NULL));
        CHECK(memcmp(y2, yr, sizeof(float) * B * T * 32) == 0);
        mha_cache_free(fresh), free(kr), free(yr);
        /* a finite memory row whose projection the storage cannot hold: refused naming that row */
        float *big = naive_alloc_floats((size_t)B * S * 32);
        memcpy(big, kv, sizeof(float) * B * S * 32);
        big[(1 * S + 2) * 32 + 5] = 3e38f; /* V about 1e38: beyond FLT_MAX / (capacity + 2) */
        CHECK_STATUS(mha_cache_set_memory(c, L, big, NULL, S, NULL), MHA_E_NONFINITE);
        CHECK_ERROR_MENTIONS("(sequence 1, memory row 2, kv head");
        mha_cache *half = NULL;
        CHECK_OK(mha_cache_create_cross(&half, L, B, S, MHA_CACHE_F16, MHA_CACHE_F16));
        big[(1 * S + 2) * 32 + 5] = 0.0f, big[(2 * S + 6) * 32 + 1] = 1e6f; /* K beyond float16's 65520 */
        if (half) CHECK_STATUS(mha_cache_set_memory(half, L, big, NULL, S, NULL), MHA_E_NONFINITE);
        CHECK_ERROR_MENTIONS("K at sequence 2, memory row 6, kv head");
        CHECK_OK(mha_forward_cached(L, c, y, NULL, x, T, NULL, NULL));
        CHECK(memcmp(y, y2, sizeof(float) * B * T * 32) == 0); /* the refusals kept the memory */
        mha_cache_free(half), free(big);
    }
    /* layers whose scores need positions */
    mha_layer *R = NULL;
    mha_config rc = naive_config(32, 4, 4, 8, 8, 0);
    rc.rope.pairing = MHA_ROPE_HALVES;
    naive_weights rw;
    rc = naive_resolve(rc);
    naive_weights_random(&rw, &rc, &seed, 0.5f);
    R = naive_make_layer(&rw);
    mha_cache *rcache = NULL;
    if (R) CHECK_STATUS(mha_cache_create_cross(&rcache, R, B, S, MHA_CACHE_F32, MHA_CACHE_F32), MHA_E_UNSUPPORTED);
    CHECK_ERROR_MENTIONS("the layer has RoPE");
    CHECK(rcache == NULL);
    mha_layer_free(R), naive_weights_free(&rw);
    mha_cache_free(c), mha_cache_free(self), mha_layer_free(L), naive_weights_free(&w);
    free(x), free(kv), free(y), free(y2);
}

static const test_case cases[] = {
    {"cache_cross_plain", test_cross_plain},
    {"cache_cross_gqa_own_widths", test_cross_gqa_own_widths},
    {"cache_cross_extra_keys_fp16", test_cross_extra_keys_fp16},
    {"cache_cross_variants_int8", test_cross_variants_int8},
    {"cache_cross_whole_norm_bf16_weights", test_cross_whole_norm_bf16_weights},
    {"cache_cross_refusals", test_cross_refusals},
};

const test_case *tests_cache_cross(size_t *count) {
    *count = sizeof cases / sizeof cases[0];
    return cases;
}
