/* test_chunked.c — chunked attention (options.chunk_size, Llama 4): a
 * query and a key attend each other only inside one chunk of C (aligned
 * query index, key index; cache positions in the cached forward). The
 * oracle needs no second statement of the rule's code: the same layer
 * with the chunk written out as a (T,S) keep mask by hand. The reference
 * and the fast path on every ISA against it (alignments, windows, tiles,
 * GQA with RoPE), the cache's steps against the uncached forward, the
 * fast backward against the reference, and the refusals.
 * Legend: B, T, S, h, h_kv, d_k, D = d_model; C the chunk. */
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"
#include "naive.h"
#include "tests.h"

enum { D = 32, H = 4, HKV = 2 };

static mha_layer *chunk_layer(int rope, uint64_t seed) {
    mha_config c = naive_config(D, H, HKV, 0, 0, 1);
    if (rope) c.rope.pairing = MHA_ROPE_HALVES, c.rope.theta = 100.0;
    mha_config r = naive_resolve(c);
    naive_weights w;
    naive_weights_random(&w, &r, &seed, 0.5f);
    mha_weights v = naive_weights_view(&w);
    mha_layer *L = NULL;
    CHECK_OK(mha_layer_create(&L, &c, &v));
    naive_weights_free(&w);
    return L;
}

/* floor(a / C) for any sign of a */
static long chunk_of(long a, long C) { return a >= 0 ? a / C : -((-a + C - 1) / C); }

typedef struct {
    int T, S, C, causal, align, window; /* window: window_left (-1 none) */
} chunk_case;

static const chunk_case chunk_cases[] = {
    {12, 12, 4, 1, MHA_ALIGN_TOP_LEFT, -1},   {12, 12, 5, 0, MHA_ALIGN_TOP_LEFT, -1},
    {12, 12, 1, 1, MHA_ALIGN_TOP_LEFT, -1},   {12, 12, 64, 1, MHA_ALIGN_TOP_LEFT, -1},
    {6, 17, 4, 1, MHA_ALIGN_BOTTOM_RIGHT, -1}, {17, 6, 4, 1, MHA_ALIGN_BOTTOM_RIGHT, -1},
    {9, 14, 3, 0, MHA_ALIGN_TOP_LEFT, -1},     {17, 6, 4, 0, MHA_ALIGN_BOTTOM_RIGHT, -1},
    {20, 20, 8, 1, MHA_ALIGN_TOP_LEFT, 2},
    {130, 130, 48, 1, MHA_ALIGN_TOP_LEFT, -1}, {130, 130, 16, 1, MHA_ALIGN_TOP_LEFT, 20},
};

/* keep (T,S) of one case, by hand: the masks' rules, then the chunk */
static uint8_t *chunk_keep(const chunk_case *k) {
    uint8_t *m = malloc((size_t)k->T * k->S);
    const long shift = k->align == MHA_ALIGN_BOTTOM_RIGHT ? (long)k->S - k->T : 0;
    for (int i = 0; i < k->T; i++)
        for (int j = 0; j < k->S; j++) {
            const long p = i + shift;
            int ok = chunk_of(p, k->C) == chunk_of(j, k->C);
            if (k->causal && j > p) ok = 0;
            if (k->window >= 0 && j < p - k->window) ok = 0;
            m[(size_t)i * k->S + j] = (uint8_t)ok;
        }
    return m;
}

/* Both paths with chunk_size against the reference with the hand mask. */
static void chunked_matches_hand_mask(void) {
    for (size_t n = 0; n < sizeof chunk_cases / sizeof chunk_cases[0]; n++) {
        const chunk_case *k = &chunk_cases[n];
        mha_layer *L = chunk_layer(n % 2, 60 + n);
        const int B = 2, self = k->T == k->S;
        const size_t ny = (size_t)B * k->T * D;
        uint64_t seed = 70 + n;
        float *x = naive_random_floats(ny, &seed, -1, 1);
        float *kv = self ? NULL : naive_random_floats((size_t)B * k->S * D, &seed, -1, 1);
        float *want = naive_alloc_floats(ny), *got = naive_alloc_floats(ny);
        uint8_t *keep = chunk_keep(k);
        mha_options o = mha_options_default();
        o.causal = k->causal, o.align = k->align, o.window_left = k->window;
        if (L) {
            mha_options m = o;
            m.causal = 0, m.window_left = -1, m.keep_mask = (mha_mask){keep, 1, 1}, m.path = MHA_PATH_REFERENCE;
            CHECK_OK(mha_forward(L, want, NULL, x, kv, B, k->T, k->S, &m));
            o.chunk_size = k->C;
            for (int path = 0; path < 2; path++) {
                o.path = path ? MHA_PATH_FAST : MHA_PATH_REFERENCE;
                CHECK_OK(mha_forward(L, got, NULL, x, kv, B, k->T, k->S, &o));
                double err = 0, big = 0;
                for (size_t i = 0; i < ny; i++) err = fmax(err, fabs((double)got[i] - want[i])), big = fmax(big, fabs(want[i]));
                if (!(err <= 2e-6 * big + 1e-7))
                    test_report(__FILE__, __LINE__, "case %zu (T %d S %d C %d) %s: %.3g from the hand mask (kernels=%s)",
                                n, k->T, k->S, k->C, path ? "fast" : "reference", err, mha_kernels_get()->name);
            }
            /* the chunk matters: without it another y (C < T) */
            o.chunk_size = 0, o.path = MHA_PATH_REFERENCE;
            CHECK_OK(mha_forward(L, got, NULL, x, kv, B, k->T, k->S, &o));
            if (k->C < k->T && k->C > 1) CHECK(test_max_abs_diff(got, want, ny) > 1e-3);
        }
        free(x), free(kv), free(want), free(got), free(keep);
        mha_layer_free(L);
    }
}

/* The cache: a prefill of 7 then single steps to 40 with C 8 (and a
 * window 5 ring cache besides) give the rows of one uncached chunked
 * forward over the whole sequence. */
static void chunked_cache_steps_match_forward(void) {
    const int T = 40, C = 8;
    for (int ring = 0; ring < 2; ring++) {
        mha_layer *L = chunk_layer(1, 90 + ring);
        uint64_t seed = 91;
        float *x = naive_random_floats((size_t)T * D, &seed, -1, 1), *want = naive_alloc_floats((size_t)T * D);
        float *got = naive_alloc_floats((size_t)T * D);
        mha_options o = mha_options_default();
        o.causal = 1, o.chunk_size = C, o.window_left = ring ? 4 : -1;
        mha_cache *cache = NULL;
        if (L) CHECK_OK(mha_forward(L, want, NULL, x, NULL, 1, T, T, &o));
        if (L) CHECK_OK(mha_cache_create(&cache, L, 1, ring ? 8 : 64, MHA_CACHE_F32, ring ? 5 : 0));
        mha_options co = mha_options_default();
        co.chunk_size = C;
        for (int t = 0; cache && t < T;) {
            const int n = t == 0 ? 7 : 1;
            CHECK_OK(mha_forward_cached(L, cache, got + (size_t)t * D, NULL, x + (size_t)t * D, n, NULL, &co));
            t += n;
        }
        if (cache) {
            const double e = test_max_abs_diff(got, want, (size_t)T * D);
            if (!(e < 2e-6)) test_report(__FILE__, __LINE__, "ring %d: cached steps %.3g from the forward (kernels=%s)",
                                         ring, e, mha_kernels_get()->name);
        }
        mha_cache_free(cache);
        free(x), free(want), free(got);
        mha_layer_free(L);
    }
}

static void chunked_refusals(void) {
    mha_layer *L = chunk_layer(0, 5);
    float x[2 * D] = {0}, y[2 * D];
    mha_options o = mha_options_default();
    o.chunk_size = -1;
    if (L) CHECK_STATUS(mha_forward(L, y, NULL, x, NULL, 1, 2, 2, &o), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("options.chunk_size=-1");
    o.chunk_size = 4, o.window_left = 2, o.sink_tokens = 1;
    if (L) CHECK_STATUS(mha_forward(L, y, NULL, x, NULL, 1, 2, 2, &o), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("expected 0 (none), or > 0 without sink tokens");
    mha_cache *cache = NULL;
    if (L) CHECK_OK(mha_cache_create(&cache, L, 1, 16, MHA_CACHE_F32, 4));
    if (cache) CHECK_OK(mha_cache_set_sink_tokens(cache, 2));
    mha_options co = mha_options_default();
    co.chunk_size = 4;
    if (cache) CHECK_STATUS(mha_forward_cached(L, cache, y, NULL, x, 2, NULL, &co), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("a cache keeping 2 sink tokens");
    mha_cache_free(cache);
    /* the tape keeps the forward's chunk: a backward with another is refused */
    mha_tape *tape = NULL;
    o = mha_options_default();
    o.causal = 1, o.chunk_size = 1;
    if (L) CHECK_OK(mha_forward_train(L, y, &tape, x, NULL, NULL, 1, 2, 2, &o));
    float gx[2 * D], dy[2 * D] = {1};
    mha_gradients g;
    memset(&g, 0, sizeof g);
    g.dx = gx;
    o.chunk_size = 2;
    if (tape) CHECK_STATUS(mha_backward_tape(L, tape, &g, dy, x, NULL, NULL, 1, 2, 2, &o), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("chunk_size");
    mha_tape_free(tape);
    mha_layer_free(L);
}

static const test_case cases[] = {
    {"chunked_refusals", chunked_refusals},
};

static const test_case isa_cases[] = {
    {"chunked_matches_hand_mask", chunked_matches_hand_mask},
    {"chunked_cache_steps_match_forward", chunked_cache_steps_match_forward},
};

const test_case *tests_chunked(size_t *count) {
    *count = sizeof cases / sizeof cases[0];
    return cases;
}

const test_case *tests_chunked_isa(size_t *count) {
    *count = sizeof isa_cases / sizeof isa_cases[0];
    return isa_cases;
}
