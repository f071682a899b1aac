/* test_rope_scaling.c — the RoPE scalings that depend on the call (dynamic
 * NTK, LongRoPE): frequencies worked out by hand, then equivalences that
 * need no second statement of the formulas: a dynamic layer is the plain
 * layer whose theta is the NTK base of the call's length; a LongRoPE
 * layer with one factor c for every pair is linear scaling by c with the
 * scores times attn_factor^2 (full rotary); the call's length picks short
 * or long factors. The fast path, the cache and the fast backward against
 * the reference on every ISA; the configuration's refusals.
 * (tests/python/test_rope_scaling.py checks per-pair factors and the cache
 * across the threshold against an oracle of Hugging Face's definitions.)
 * Legend: B, T, h, h_kv, d_k, D = d_model; r rotated dims; L the context
 * the scaling names (original_max_positions). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/variants.h"
#include "kernels/kernels.h"
#include "naive.h"
#include "tests.h"

enum { D = 32, H = 4, HKV = 2, DK = 8, CTX = 16 };

/* theta 10000, r = 8: f_i = 10000^(-i/4) = 1, 0.1, 0.01, 0.001 */
static void rope_scaling_by_hand(void) {
    mha_config c = mha_config_default(8, 1), r;
    c.rope.pairing = MHA_ROPE_HALVES, c.rope.scaling = MHA_ROPE_SCALE_DYNAMIC, c.rope.factor = 2;
    c.rope.original_max_positions = 16;
    CHECK_OK(mha_config_resolve(&r, &c));
    double f[4], ms;
    const double plain[4] = {1, 0.1, 0.01, 0.001};
    mha_rope_frequencies(f, &ms, &r, 16); /* within the context: unchanged */
    for (int i = 0; i < 4; i++) CHECK_NEAR(f[i], plain[i], 1e-15);
    CHECK_NEAR(ms, 1.0, 0);
    /* seq 32: base = 10000 (2 * 32/16 - 1)^(8/6) = 10000 * 3^(4/3) */
    mha_rope_frequencies(f, &ms, &r, 32);
    const double base = 10000.0 * pow(3.0, 4.0 / 3.0);
    for (int i = 0; i < 4; i++) CHECK_NEAR(f[i], pow(base, -i / 4.0), 1e-15);
    CHECK_NEAR(f[1], 0.1 / pow(3.0, 1.0 / 3.0), 1e-15); /* the same, one term worked out */

    c.rope.scaling = MHA_ROPE_SCALE_LONGROPE, c.rope.factor = 4;
    const float sh[4] = {1, 2, 4, 8}, lo[4] = {10, 20, 40, 80};
    memcpy(c.rope.short_factor, sh, sizeof sh), memcpy(c.rope.long_factor, lo, sizeof lo);
    CHECK_OK(mha_config_resolve(&r, &c));
    CHECK_NEAR(r.rope.attn_factor, sqrt(1.5), 1e-15); /* sqrt(1 + ln 4 / ln 16) */
    mha_rope_frequencies(f, &ms, &r, 16);
    for (int i = 0; i < 4; i++) CHECK_NEAR(f[i], plain[i] / sh[i], 1e-15);
    CHECK_NEAR(ms, sqrt(1.5), 1e-15);
    mha_rope_frequencies(f, &ms, &r, 17); /* one past the context: the long factors */
    for (int i = 0; i < 4; i++) CHECK_NEAR(f[i], plain[i] / lo[i], 1e-15);
    CHECK_NEAR(ms, sqrt(1.5), 1e-15);
    c.rope.factor = 0; /* 0 means 1: no growth, attn_factor 1 */
    CHECK_OK(mha_config_resolve(&r, &c));
    CHECK_NEAR(r.rope.attn_factor, 1.0, 0);
}

/* A layer of config c with random weights (seeded: the same weights for
 * every config of one shape). */
static mha_layer *layer_of(const mha_config *c, uint64_t seed) {
    mha_config r = naive_resolve(*c);
    naive_weights w;
    naive_weights_random(&w, &r, &seed, 0.5f);
    mha_weights v = naive_weights_view(&w);
    mha_layer *L = NULL;
    CHECK_OK(mha_layer_create(&L, c, &v));
    naive_weights_free(&w);
    return L;
}

static mha_config rope_config(mha_rope_scaling s, int dim) {
    mha_config c = naive_config(D, H, HKV, DK, 0, 1);
    c.rope.pairing = MHA_ROPE_HALVES, c.rope.dim = dim, c.rope.theta = 100.0;
    c.rope.scaling = s, c.rope.original_max_positions = CTX;
    return c;
}

/* y of L (B 2, T rows, causal) on the path, positions pos (NULL: t) */
static void forward(const mha_layer *L, float *y, const float *x, int T, const int *pos, mha_path path,
                    float scale) {
    mha_options o = mha_options_default();
    o.causal = 1, o.positions = pos, o.path = path, o.scale = scale;
    CHECK_OK(mha_forward(L, y, NULL, x, NULL, 2, T, T, &o));
}

/* The worst test_max_rel_diff over the reference and the fast path between layers
 * a and b of one shape (the same seeded weights) on one input (B 2, T
 * rows, positions pos or NULL; b's call takes scale_b); *path_out: the
 * path of the worst (1 fast). */
static double worst_of_paths(const mha_config *a, const mha_config *b, uint64_t weights_seed, uint64_t x_seed, int T,
                             const int *pos, float scale_b, int *path_out) {
    mha_layer *La = layer_of(a, weights_seed), *Lb = layer_of(b, weights_seed);
    const size_t n = (size_t)2 * T * D;
    float *x = naive_random_floats(n, &x_seed, -1, 1), *ya = naive_alloc_floats(n), *yb = naive_alloc_floats(n);
    double worst = La && Lb ? 0.0 : INFINITY;
    for (int path = 0; La && Lb && path < 2; path++) {
        const mha_path pa = path ? MHA_PATH_FAST : MHA_PATH_REFERENCE;
        forward(La, ya, x, T, pos, pa, 0);
        forward(Lb, yb, x, T, pos, pa, scale_b);
        const double e = test_max_rel_diff(ya, yb, n);
        if (!(e <= worst)) worst = e, *path_out = path;
    }
    free(x), free(ya), free(yb);
    mha_layer_free(La), mha_layer_free(Lb);
    return worst;
}

/* Dynamic NTK is plain RoPE with theta (factor seq/L - factor + 1)^(r/(r-2))
 * times larger for a call of length seq > L, and plain RoPE at or below L:
 * T 12 (within), T 40 (past), T 5 at positions up to 99 (seq 100). */
static void rope_scaling_dynamic_is_ntk_theta(void) {
    const int Ts[3] = {12, 40, 5}, dims[2] = {DK, 4};
    for (int d = 0; d < 2; d++)
        for (int k = 0; k < 3; k++) {
            const int T = Ts[k], r = dims[d];
            mha_config c = rope_config(MHA_ROPE_SCALE_DYNAMIC, r), p = rope_config(MHA_ROPE_SCALE_NONE, r);
            c.rope.factor = 4.0;
            int pos[2 * 5];
            for (int i = 0; i < 2 * T && k == 2; i++) pos[i] = 99 - 7 * (i % T) - (i / T);
            const double seq = k == 2 ? 100 : T;
            if (seq > CTX) p.rope.theta = 100.0 * pow(4.0 * seq / CTX - 3.0, r / (r - 2.0));
            int path = 0;
            const double e = worst_of_paths(&c, &p, 11, 12 + k, T, k == 2 ? pos : NULL, 0, &path);
            if (!(e < 2e-6))
                test_report(__FILE__, __LINE__, "dynamic r %d T %d %s: %.3g from the NTK-theta layer", r, T,
                            path ? "fast" : "reference", e);
        }
}

/* LongRoPE with every short factor cs and every long factor cl (full
 * rotary) is linear scaling by cs (calls within L) or cl (past it) with
 * the scores times attn_factor^2: cos and sin are scaled on q and on k. */
static void rope_scaling_longrope_constant_is_linear(void) {
    const int Ts[2] = {12, 40};
    const float cs = 1.5f, cl = 6.0f;
    for (int k = 0; k < 2; k++) {
        const int T = Ts[k];
        mha_config c = rope_config(MHA_ROPE_SCALE_LONGROPE, DK), p = rope_config(MHA_ROPE_SCALE_LINEAR, DK);
        c.rope.factor = 8.0;
        for (int i = 0; i < DK / 2; i++) c.rope.short_factor[i] = cs, c.rope.long_factor[i] = cl;
        p.rope.factor = T > CTX ? cl : cs, p.rope.original_max_positions = 0;
        const double a = sqrt(1.0 + log(8.0) / log((double)CTX));
        int path = 0;
        const double e = worst_of_paths(&c, &p, 21, 22 + k, T, NULL, (float)(a * a / sqrt((double)DK)), &path);
        if (!(e < 2e-6))
            test_report(__FILE__, __LINE__, "longrope T %d %s: %.3g from linear scaling by %g with scale "
                        "a^2/sqrt(d_k)", T, path ? "fast" : "reference", e, (double)p.rope.factor);
    }
}

/* Per-pair factors (partial rotary, interleaved), dynamic NTK (GQA): the
 * fast path against the reference across query tiles (T 70 > L) and
 * within the context (T 12); the cache prefilled in one call (the same
 * call length) gives the uncached forward's y. */
static void rope_scaling_fast_and_cache_vs_reference(void) {
    for (int k = 0; k < 4; k++) {
        const int T = k % 2 ? 70 : 12;
        mha_config c = rope_config(k < 2 ? MHA_ROPE_SCALE_LONGROPE : MHA_ROPE_SCALE_DYNAMIC, k < 2 ? 6 : DK);
        c.rope.pairing = k < 2 ? MHA_ROPE_INTERLEAVED : MHA_ROPE_HALVES, c.rope.factor = 8.0;
        for (int i = 0; k < 2 && i < 3; i++)
            c.rope.short_factor[i] = 1.0f + 0.5f * i, c.rope.long_factor[i] = 1.0f + 9.0f * i * i;
        mha_layer *L = layer_of(&c, 31);
        const size_t n = (size_t)2 * T * D;
        uint64_t seed = 32 + k;
        float *x = naive_random_floats(n, &seed, -1, 1), *yr = naive_alloc_floats(n), *yf = naive_alloc_floats(n);
        float *yc = naive_alloc_floats(n);
        if (L) {
            forward(L, yr, x, T, NULL, MHA_PATH_REFERENCE, 0);
            forward(L, yf, x, T, NULL, MHA_PATH_FAST, 0);
            mha_cache *cache = NULL;
            CHECK_OK(mha_cache_create(&cache, L, 2, 80, MHA_CACHE_F32, 0));
            mha_options o = mha_options_default();
            o.causal = 1;
            if (cache) CHECK_OK(mha_forward_cached(L, cache, yc, NULL, x, T, NULL, &o));
            mha_cache_free(cache);
            const double ef = test_max_rel_diff(yf, yr, n), ec = test_max_rel_diff(yc, yr, n);
            if (!(ef < 2e-6) || !(ec < 2e-6))
                test_report(__FILE__, __LINE__, "%s T %d: fast %.3g, cache %.3g from the reference (kernels=%s)",
                            k < 2 ? "longrope" : "dynamic", T, ef, ec, mha_kernels_get()->name);
        }
        free(x), free(yr), free(yf), free(yc);
        mha_layer_free(L);
    }
}

/* The call's length: 1 + the largest query or key position (explicit
 * key positions of a cross-attention call count; keys that are x take the
 * query positions), max(T, S) without explicit positions. */
static void rope_scaling_call_length(void) {
    mha_options o = mha_options_default();
    CHECK(mha_rope_call_length(&o, 1, 2, 5, 5) == 5);
    CHECK(mha_rope_call_length(&o, 0, 2, 3, 9) == 9);
    const int qpos[4] = {0, 1, 7, 2}, kpos[6] = {5, 40, 7, 1, 2, 3};
    o.positions = qpos;
    CHECK(mha_rope_call_length(&o, 1, 2, 2, 2) == 8);  /* keys are x: their positions are the queries' */
    CHECK(mha_rope_call_length(&o, 0, 2, 2, 3) == 8);  /* keys 0..2 */
    o.key_positions = kpos;
    CHECK(mha_rope_call_length(&o, 0, 2, 2, 3) == 41); /* a key at 40 */
    o.positions = NULL;
    CHECK(mha_rope_call_length(&o, 0, 2, 2, 3) == 41);
}

static void rope_scaling_errors(void) {
    mha_config c = rope_config(MHA_ROPE_SCALE_LONGROPE, DK), r;
    for (int i = 0; i < DK / 2; i++) c.rope.short_factor[i] = 1.0f, c.rope.long_factor[i] = 2.0f;
    CHECK_OK(mha_config_resolve(&r, &c));
    mha_config b = c;
    b.rope.long_factor[DK / 2] = 2.0f; /* a list one longer than the pairs */
    CHECK_STATUS(mha_config_resolve(&r, &b), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("rope.long_factor[4]=2; expected 0 beyond the dim/2=4 rotated pairs");
    b = c, b.rope.short_factor[DK / 2 - 1] = 0.0f; /* one shorter */
    CHECK_STATUS(mha_config_resolve(&r, &b), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("rope.short_factor[3]=0; expected a finite factor > 0");
    b = c, b.rope.short_factor[0] = NAN;
    CHECK_STATUS(mha_config_resolve(&r, &b), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("rope.short_factor[0]=nan");
    b = c, b.rope.factor = 4.0, b.rope.original_max_positions = 1; /* ln 1 = 0 */
    CHECK_STATUS(mha_config_resolve(&r, &b), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("rope.original_max_positions=1; expected the pre-training context length (>= 2)");
    b = c, b.rope.scaling = MHA_ROPE_SCALE_YARN, b.rope.factor = 2.0; /* factors kept from longrope */
    CHECK_STATUS(mha_config_resolve(&r, &b), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("rope.short_factor/long_factor[0] set with rope.scaling=3");
    b = c, b.rope.scaling = 6;
    CHECK_STATUS(mha_config_resolve(&r, &b), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("expected none, linear, llama3, yarn, dynamic or longrope");
    b = rope_config(MHA_ROPE_SCALE_DYNAMIC, 2), b.rope.factor = 2.0; /* r/(r-2) */
    CHECK_STATUS(mha_config_resolve(&r, &b), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("rope.dim=2 with dynamic scaling; expected >= 4");
    b = rope_config(MHA_ROPE_SCALE_DYNAMIC, DK), b.rope.factor = 2.0, b.rope.original_max_positions = 0;
    CHECK_STATUS(mha_config_resolve(&r, &b), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("for llama3, yarn and dynamic scaling");
    b = naive_config(D, H, HKV, 2 * MHA_ROPE_MAX_PAIRS + 2, 0, 1);
    b.rope.pairing = MHA_ROPE_HALVES, b.rope.scaling = MHA_ROPE_SCALE_LONGROPE, b.rope.original_max_positions = 4;
    CHECK_STATUS(mha_config_resolve(&r, &b), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("expected at most 256 rotated dims");
}

static const test_case cases[] = {
    {"rope_scaling_by_hand", rope_scaling_by_hand},
    {"rope_scaling_call_length", rope_scaling_call_length},
    {"rope_scaling_errors", rope_scaling_errors},
};

static const test_case isa_cases[] = {
    {"rope_scaling_dynamic_is_ntk_theta", rope_scaling_dynamic_is_ntk_theta},
    {"rope_scaling_longrope_constant_is_linear", rope_scaling_longrope_constant_is_linear},
    {"rope_scaling_fast_and_cache_vs_reference", rope_scaling_fast_and_cache_vs_reference},
};

const test_case *tests_rope_scaling(size_t *count) {
    *count = sizeof cases / sizeof cases[0];
    return cases;
}

const test_case *tests_rope_scaling_isa(size_t *count) {
    *count = sizeof isa_cases / sizeof isa_cases[0];
    return isa_cases;
}
