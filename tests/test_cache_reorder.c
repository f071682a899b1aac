/* test_cache_reorder.c — mha_cache_reorder (beam search) and
 * mha_cache_clone (a prompt's cache continued twice) against an
 * oracle that needs no reorder: a second cache fed, for each sequence b,
 * the whole history of the sequence src[b] it becomes (its prompt and
 * its steps) and then the same next steps. Each sequence's decode runs
 * on its own keys and values, so the two caches must give the same bits.
 * Legend: B sequences, T rows per call, d_model D, h / h_kv heads. */
#include <stdlib.h>
#include <string.h>

#include "naive.h"
#include "test_util.h"
#include "tests.h"

typedef struct {
    mha_cache_dtype kt, vt;
    int h_kv, cap, window, n_sink;
    int alibi, rope, positions; /* variants whose numbers depend on the stored positions */
    int permute;                /* heads permuted, the first cache's storage index with them */
} reorder_case;

enum { B = 4, D = 32, H = 4, T0 = 9, STEPS_BEFORE = 3, STEPS_AFTER = 4 };

static mha_layer *case_layer(const reorder_case *rc, naive_weights *w, uint64_t seed) {
    mha_config c = naive_config(D, H, rc->h_kv, 8, 8, 1);
    c.alibi = rc->alibi;
    if (rc->rope) c.rope.pairing = MHA_ROPE_HALVES, c.rope.dim = 8, c.rope.theta = 100.0;
    c = naive_resolve(c);
    naive_weights_random(w, &c, &seed, 0.5f);
    return naive_make_layer(w);
}

static mha_cache *case_cache(const reorder_case *rc, const mha_layer *L) {
    mha_cache *c = NULL;
    CHECK_OK(mha_cache_create_kv(&c, L, B, rc->cap, rc->kt, rc->vt, rc->window));
    if (c && rc->n_sink) CHECK_OK(mha_cache_set_sink_tokens(c, rc->n_sink));
    return c;
}

/* One cached call of T rows per sequence; positions (B,T) when the case
 * gives them: 1000 + 7b + its cache position, as a left-padded batch's
 * would be (a real position of its own, not the cache's). */
static mha_status step(const reorder_case *rc, const mha_layer *L, mha_cache *c, float *y, const float *x, int T,
                       const int *n_new, const int *seq_of) {
    int pos[B * T0];
    mha_options o = mha_options_default();
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) pos[b * T + t] = 1000 + 7 * seq_of[b] + mha_cache_length(c, b) + t;
    if (rc->positions) o.positions = pos;
    return mha_forward_cached(L, c, y, NULL, x, T, n_new, &o);
}

static void reorder_matches_fresh_cache(const reorder_case *rc) {
    naive_weights w;
    mha_layer *L = case_layer(rc, &w, 71);
    uint64_t seed = 5;
    const int n_prompt[B] = {9, 5, 7, 3}, src[B] = {1, 2, 0, 0}; /* a cycle 0<-1<-2<-0 and a repeat */
    const int ident[B] = {0, 1, 2, 3};
    float *prompt = naive_random_floats((size_t)B * T0 * D, &seed, -1.0f, 1.0f);        /* (B, T0, D) */
    float *before = naive_random_floats((size_t)STEPS_BEFORE * B * D, &seed, -1, 1);    /* (steps, B, 1, D) */
    float *after = naive_random_floats((size_t)STEPS_AFTER * B * D, &seed, -1, 1);      /* (steps, B, 1, D) */
    float *xr = naive_alloc_floats((size_t)B * T0 * D), *y = naive_alloc_floats((size_t)B * T0 * D);
    float *ya = naive_alloc_floats((size_t)STEPS_AFTER * B * D), *yb = naive_alloc_floats((size_t)STEPS_AFTER * B * D);
    int n_r[B], seq_r[B];
    /* permute: a is made for the layer's first head order and follows it
     * (its storage index permuted), o is made for the new order */
    static const int perm[H] = {2, 3, 0, 1};
    mha_cache *a = L ? case_cache(rc, L) : NULL;
    if (a && rc->permute) {
        CHECK_OK(mha_layer_permute_heads(L, perm));
        CHECK_OK(mha_cache_permute_heads(a, perm));
    }
    mha_cache *o = L ? case_cache(rc, L) : NULL;
    if (a && o) {
        /* a: the histories in their own rows, then the reorder */
        CHECK_OK(step(rc, L, a, y, prompt, T0, n_prompt, ident));
        for (int s = 0; s < STEPS_BEFORE; s++) CHECK_OK(step(rc, L, a, y, before + (size_t)s * B * D, 1, NULL, ident));
        CHECK_OK(mha_cache_reorder(a, src));
        /* o: sequence b given src[b]'s history from the start */
        for (int b = 0; b < B; b++) {
            memcpy(xr + (size_t)b * T0 * D, prompt + (size_t)src[b] * T0 * D, sizeof(float) * T0 * D);
            n_r[b] = n_prompt[src[b]], seq_r[b] = src[b];
        }
        CHECK_OK(step(rc, L, o, y, xr, T0, n_r, seq_r));
        for (int s = 0; s < STEPS_BEFORE; s++) {
            for (int b = 0; b < B; b++)
                memcpy(xr + (size_t)b * D, before + ((size_t)s * B + src[b]) * D, sizeof(float) * D);
            CHECK_OK(step(rc, L, o, y, xr, 1, NULL, seq_r));
        }
        for (int b = 0; b < B; b++) CHECK_INT(mha_cache_length(a, b), mha_cache_length(o, b));
        /* the same next tokens on both */
        for (int s = 0; s < STEPS_AFTER; s++) {
            const float *x = after + (size_t)s * B * D;
            CHECK_OK(step(rc, L, a, ya + (size_t)s * B * D, x, 1, NULL, seq_r));
            CHECK_OK(step(rc, L, o, yb + (size_t)s * B * D, x, 1, NULL, seq_r));
        }
        CHECK(memcmp(ya, yb, sizeof(float) * STEPS_AFTER * B * D) == 0);
        CHECK_ARRAY_NEAR(ya, yb, (size_t)STEPS_AFTER * B * D, 0.0); /* names the first difference */
    }
    mha_cache_free(a), mha_cache_free(o), mha_layer_free(L), naive_weights_free(&w);
    free(prompt), free(before), free(after), free(xr), free(y), free(ya), free(yb);
}

/* A clone continues on its own: the source, freed at once, and the clone
 * each decode other tokens and give the bits of a fresh cache fed the same
 * history (prompt, steps, then their own tokens). */
static void clone_continues_on_its_own(const reorder_case *rc) {
    naive_weights w;
    mha_layer *L = case_layer(rc, &w, 29);
    uint64_t seed = 8;
    const int n_prompt[B] = {9, 2, 6, 4}, ident[B] = {0, 1, 2, 3};
    float *prompt = naive_random_floats((size_t)B * T0 * D, &seed, -1, 1);                /* (B, T0, D) */
    float *steps = naive_random_floats((size_t)(STEPS_BEFORE + 2 * STEPS_AFTER) * B * D, &seed, -1, 1); /* (steps, B, 1, D) */
    float *y = naive_alloc_floats((size_t)B * T0 * D);
    float *got = naive_alloc_floats((size_t)2 * STEPS_AFTER * B * D), *want = naive_alloc_floats((size_t)2 * STEPS_AFTER * B * D);
    static const int perm[H] = {2, 3, 0, 1};
    mha_cache *src = L ? case_cache(rc, L) : NULL, *clone = NULL;
    if (src && rc->permute) { /* the source's storage index follows the layer's new order */
        CHECK_OK(mha_layer_permute_heads(L, perm));
        CHECK_OK(mha_cache_permute_heads(src, perm));
    }
    for (int side = 0; src && side < 2; side++) { /* side 0: the source, 1: the clone */
        mha_cache *o = case_cache(rc, L);
        if (!o) break;
        CHECK_OK(step(rc, L, o, y, prompt, T0, n_prompt, ident));
        for (int s = 0; s < STEPS_BEFORE; s++) CHECK_OK(step(rc, L, o, y, steps + (size_t)s * B * D, 1, NULL, ident));
        for (int s = 0; s < STEPS_AFTER; s++) {
            const float *x = steps + (size_t)(STEPS_BEFORE + side * STEPS_AFTER + s) * B * D;
            CHECK_OK(step(rc, L, o, want + ((size_t)side * STEPS_AFTER + s) * B * D, x, 1, NULL, ident));
        }
        mha_cache_free(o);
    }
    if (src) {
        CHECK_OK(step(rc, L, src, y, prompt, T0, n_prompt, ident));
        for (int s = 0; s < STEPS_BEFORE; s++) CHECK_OK(step(rc, L, src, y, steps + (size_t)s * B * D, 1, NULL, ident));
        CHECK_OK(mha_cache_clone(&clone, src));
        for (int s = 0; s < STEPS_AFTER; s++) /* the source goes on, then is freed */
            CHECK_OK(step(rc, L, src, got + (size_t)s * B * D, steps + (size_t)(STEPS_BEFORE + s) * B * D, 1, NULL, ident));
        mha_cache_free(src);
        for (int s = 0; clone && s < STEPS_AFTER; s++)
            CHECK_OK(step(rc, L, clone, got + ((size_t)STEPS_AFTER + s) * B * D,
                          steps + (size_t)(STEPS_BEFORE + STEPS_AFTER + s) * B * D, 1, NULL, ident));
        CHECK(clone && mha_cache_bytes(clone) > 0);
        CHECK_ARRAY_NEAR(got, want, (size_t)2 * STEPS_AFTER * B * D, 0.0);
    }
    CHECK_STATUS(mha_cache_clone(NULL, clone), MHA_E_ARG);
    mha_cache *none = (mha_cache *)&w;
    CHECK_STATUS(mha_cache_clone(&none, NULL), MHA_E_ARG);
    CHECK(none == NULL);
    mha_cache_free(clone), mha_layer_free(L), naive_weights_free(&w);
    free(prompt), free(steps), free(y), free(got), free(want);
}

static void test_clone_int8_permuted_heads(void) {
    reorder_case rc = {MHA_CACHE_I8, MHA_CACHE_F16, 2, 40, 0, 0, 0, 1, 1, 1};
    clone_continues_on_its_own(&rc);
}
static void test_clone_ring_with_sinks_alibi(void) {
    reorder_case rc = {MHA_CACHE_F32, MHA_CACHE_I8, 2, 8, 5, 2, 1, 0, 1, 0};
    clone_continues_on_its_own(&rc);
}

static void test_reorder_fp32(void) {
    reorder_case rc = {MHA_CACHE_F32, MHA_CACHE_F32, 4, 40, 0, 0, 0, 0, 0, 0};
    reorder_matches_fresh_cache(&rc);
}
static void test_reorder_fp16_gqa_rope(void) {
    reorder_case rc = {MHA_CACHE_F16, MHA_CACHE_F16, 2, 40, 0, 0, 0, 1, 0, 0};
    reorder_matches_fresh_cache(&rc);
}
static void test_reorder_int8_mqa_alibi_positions(void) {
    reorder_case rc = {MHA_CACHE_I8, MHA_CACHE_I8, 1, 200, 0, 0, 1, 0, 1, 0};
    reorder_matches_fresh_cache(&rc);
}
static void test_reorder_mixed_types_permuted_heads(void) {
    reorder_case rc = {MHA_CACHE_I8, MHA_CACHE_F16, 2, 40, 0, 0, 0, 1, 1, 1};
    reorder_matches_fresh_cache(&rc);
}
/* a ring that has wrapped (12 tokens in 8 slots) with two sink tokens */
static void test_reorder_ring_with_sinks(void) {
    reorder_case rc = {MHA_CACHE_F32, MHA_CACHE_I8, 2, 8, 5, 2, 1, 0, 0, 0};
    reorder_matches_fresh_cache(&rc);
}

/* Refusals leave the cache as it was; the identity changes nothing. */
static void test_reorder_refusals(void) {
    naive_weights w;
    const reorder_case rc = {MHA_CACHE_F32, MHA_CACHE_F32, 4, 16, 0, 0, 0, 0, 0, 0};
    mha_layer *L = case_layer(&rc, &w, 3);
    mha_cache *c = L ? case_cache(&rc, L) : NULL;
    uint64_t seed = 9;
    float *x = naive_random_floats((size_t)B * 3 * D, &seed, -1, 1), *y = naive_alloc_floats((size_t)B * 3 * D);
    float *y1 = naive_alloc_floats((size_t)B * D), *y2 = naive_alloc_floats((size_t)B * D);
    const int n[B] = {3, 1, 2, 0};
    if (c) {
        CHECK_OK(mha_forward_cached(L, c, y, NULL, x, 3, n, NULL));
        CHECK_STATUS(mha_cache_reorder(NULL, n), MHA_E_ARG);
        CHECK_ERROR_MENTIONS("mha_cache_reorder: NULL cache");
        CHECK_STATUS(mha_cache_reorder(c, NULL), MHA_E_ARG);
        CHECK_ERROR_MENTIONS("NULL src");
        CHECK_STATUS(mha_cache_reorder(c, (const int[B]){1, 0, 4, 2}), MHA_E_ARG);
        CHECK_ERROR_MENTIONS("src[2]=4; expected a sequence 0..3");
        CHECK_STATUS(mha_cache_reorder(c, (const int[B]){1, -1, 0, 0}), MHA_E_ARG);
        CHECK_ERROR_MENTIONS("src[1]=-1");
        for (int b = 0; b < B; b++) CHECK_INT(mha_cache_length(c, b), n[b]); /* untouched */
        CHECK_OK(mha_forward_cached(L, c, y1, NULL, x, 1, NULL, NULL));
        for (int b = 0; b < B; b++) CHECK_OK(mha_cache_truncate(c, b, n[b]));
        CHECK_OK(mha_cache_reorder(c, (const int[B]){0, 1, 2, 3}));
        CHECK_OK(mha_forward_cached(L, c, y2, NULL, x, 1, NULL, NULL));
        CHECK(memcmp(y1, y2, sizeof(float) * B * D) == 0);
    }
    mha_cache_free(c), mha_layer_free(L), naive_weights_free(&w);
    free(x), free(y), free(y1), free(y2);
}

/* The cache keeps a bound on its keys' norms per sequence to refuse
 * scores past the fp32 softmax's range; a sequence that takes another's
 * keys takes its bound: here sequence 1 takes sequence 0's keys, too large
 * for a query's scores, and its next token is refused as sequence 0's is. */
static void test_reorder_carries_the_key_bound(void) {
    naive_weights w;
    const reorder_case rc = {MHA_CACHE_F32, MHA_CACHE_F32, 4, 16, 0, 0, 0, 0, 0, 0};
    mha_layer *L = case_layer(&rc, &w, 3);
    mha_cache *c = L ? case_cache(&rc, L) : NULL;
    uint64_t seed = 13;
    float *x = naive_random_floats((size_t)B * 2 * D, &seed, -1, 1), *y = naive_alloc_floats((size_t)B * 2 * D);
    for (int i = 0; i < 2 * D; i++) x[i] *= 1e6f; /* sequence 0's two tokens: keys of norm ~1e6 */
    float *x1 = x + (size_t)2 * D * 3;           /* a token of ordinary size (sequence 3's first) */
    mha_options tiny = mha_options_default();
    tiny.scale = 1e-12f; /* the prompt's own scores stay small */
    if (c) {
        CHECK_OK(mha_forward_cached(L, c, y, NULL, x, 2, (const int[B]){1, 2, 2, 2}, &tiny));
        float xs[B * D] = {0};
        memcpy(xs, x1, sizeof(float) * D), memcpy(xs + D, x1, sizeof(float) * D);
        CHECK_STATUS(mha_forward_cached(L, c, y, NULL, xs, 1, (const int[B]){1, 0, 0, 0}, NULL), MHA_E_NONFINITE);
        CHECK_OK(mha_forward_cached(L, c, y, NULL, xs, 1, (const int[B]){0, 1, 0, 0}, NULL));
        CHECK_OK(mha_cache_reorder(c, (const int[B]){0, 0, 2, 3}));
        CHECK_STATUS(mha_forward_cached(L, c, y, NULL, xs, 1, (const int[B]){0, 1, 0, 0}, NULL), MHA_E_NONFINITE);
        CHECK_ERROR_MENTIONS("scores of sequence 1");
    }
    mha_cache_free(c), mha_layer_free(L), naive_weights_free(&w);
    free(x), free(y);
}

static const test_case cases[] = {
    {"cache_reorder_fp32", test_reorder_fp32},
    {"cache_reorder_fp16_gqa_rope", test_reorder_fp16_gqa_rope},
    {"cache_reorder_int8_mqa_alibi_positions", test_reorder_int8_mqa_alibi_positions},
    {"cache_reorder_mixed_types_permuted_heads", test_reorder_mixed_types_permuted_heads},
    {"cache_reorder_ring_with_sinks", test_reorder_ring_with_sinks},
    {"cache_reorder_refusals", test_reorder_refusals},
    {"cache_reorder_carries_the_key_bound", test_reorder_carries_the_key_bound},
    {"cache_clone_int8_permuted_heads", test_clone_int8_permuted_heads},
    {"cache_clone_ring_with_sinks_alibi", test_clone_ring_with_sinks_alibi},
};

const test_case *tests_cache_reorder(size_t *count) {
    *count = sizeof cases / sizeof cases[0];
    return cases;
}
