/* test_cache_tree.c — tree speculative decoding on the KV cache: a tree of
 * draft tokens verified in one mha_forward_cached call (options.keep_mask
 * over the call's new tokens, each at its depth's position), then the
 * accepted path kept with mha_cache_compact and decoding continued.
 * Oracle: the reference path (mha_forward, path REFERENCE) over the whole
 * token list with a (T,T) keep mask written out here by the rules (causal
 * over the cache positions, the window and sink tokens, the tree's
 * ancestors) and the same positions; each sequence alone. After the
 * compaction, the reference of the prefix, the accepted path and the next
 * token as one causal sequence.
 * Legend: B sequences, P prefix tokens, N tree tokens, D = d_model. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "naive.h"
#include "test_util.h"
#include "tests.h"

enum { B = 2, P = 10, N = 6, D = 32, H = 8 }; /* P + N = 16: the last tree token closes a K panel */

/* Parents of the tree tokens of each sequence (-1: a root, child of the
 * prefix's last token), parents first; depth from them. Sequence 1 uses
 * only its first N_USED[1] tokens (n_new). */
static const int PARENT[B][N] = {{-1, 0, 0, 1, 2, 4}, {-1, -1, 0, 1, 2, 3}};
static const int N_USED[B] = {N, N - 1};
/* The accepted path of each sequence (indices of tree tokens, root first). */
static const int PATH[B][3] = {{0, 2, 4}, {1, 3, -1}};
static const int PATH_LEN[B] = {3, 2};

typedef struct {
    int h_kv, cap, window, n_sink;
    mha_cache_dtype kt, vt;
    int rope, alibi;
    int shared_mask; /* keep_mask.batch 1: sequence 0's tree for both */
} tree_case;

static int depth(int b, int i) {
    int d = 0;
    for (int p = PARENT[b][i]; p >= 0; p = PARENT[b][p]) d++;
    return d;
}

static int is_ancestor_or_self(int b, int j, int i) {
    for (int p = i; p >= 0; p = PARENT[b][p])
        if (p == j) return 1;
    return 0;
}

static double bound(const tree_case *tc) {
    const mha_cache_dtype worst = tc->kt > tc->vt ? tc->kt : tc->vt;
    return worst == MHA_CACHE_I8 ? 3e-2 : worst == MHA_CACHE_F16 ? 3e-3 : 2e-6;
}

/* Whether a token at position a attends the one at position c (both <
 * T): causal, the cache's window, its sink tokens. A tree token's
 * position is its depth's, so its window reaches as far back along its
 * path as a token decoded there would (its cache index counts siblings). */
static int visible(const tree_case *tc, int a, int c) {
    return c <= a && (!tc->window || a - c <= tc->window - 1 || c < tc->n_sink);
}

static int cfg_has_positions(const mha_layer *L) {
    const mha_config *c = mha_layer_config(L);
    return c->alibi || c->rope.dim > 0;
}

/* y_ref (T, D) of one sequence: x (T, D) with positions pos (T) and the
 * keep mask (T, T) built by the caller. */
static void reference(const mha_layer *L, double *scale, float *y_ref, const float *x, const int *pos,
                      const uint8_t *keep, int T) {
    mha_options o = naive_ref_options();
    o.keep_mask = (mha_mask){keep, 1, 1};
    o.positions = cfg_has_positions(L) ? pos : NULL;
    CHECK_OK(mha_forward(L, y_ref, NULL, x, NULL, 1, T, T, &o));
    for (int i = 0; i < T * D; i++) *scale = fmax(*scale, 1.0 + fabs(y_ref[i]));
}

static void tree_matches_reference(const tree_case *tc) {
    mha_config cf = naive_config(D, H, tc->h_kv, 8, 8, 1);
    cf.alibi = tc->alibi;
    if (tc->rope) cf.rope.pairing = MHA_ROPE_HALVES, cf.rope.dim = 8, cf.rope.theta = 100.0;
    cf = naive_resolve(cf);
    naive_weights w;
    uint64_t seed = 5;
    naive_weights_random(&w, &cf, &seed, 0.5f);
    mha_layer *L = naive_make_layer(&w);
    float *xp = naive_random_floats((size_t)B * P * D, &seed, -1, 1);   /* (B, P, D) prefix */
    float *xt = naive_random_floats((size_t)B * N * D, &seed, -1, 1);   /* (B, N, D) tree */
    float *xn = naive_random_floats((size_t)B * D, &seed, -1, 1);       /* (B, 1, D) next */
    float *yp = naive_alloc_floats((size_t)B * P * D), *yt = naive_alloc_floats((size_t)B * N * D);
    float *yn = naive_alloc_floats((size_t)B * D);
    uint8_t mask[B][N][N] = {{{0}}}; /* the tree masks of the cached call */
    int tpos[B * N];                 /* (B, N) positions P + depth */
    for (int b = 0; b < B; b++)
        for (int i = 0; i < N; i++) {
            const int tb = tc->shared_mask ? 0 : b;
            for (int j = 0; j < N; j++) mask[b][i][j] = (uint8_t)is_ancestor_or_self(tb, j, i);
            tpos[b * N + i] = P + depth(tb, i);
        }
    static const char *const sets[] = {"avx512", "avx2", "scalar"};
    mha_context *ctx = NULL;
    CHECK_OK(mha_context_create(&ctx));
    for (int k = 0; L && ctx && k < 3; k++) {
        if (mha_context_set_kernels(ctx, sets[k]) != MHA_OK) continue; /* not on this CPU */
        mha_cache *c = NULL;
        CHECK_OK(mha_cache_create_kv(&c, L, B, tc->cap, tc->kt, tc->vt, tc->window));
        if (!c) break;
        if (tc->n_sink) CHECK_OK(mha_cache_set_sink_tokens(c, tc->n_sink));
        mha_options o = mha_options_default();
        CHECK_OK(mha_forward_cached_ctx(ctx, L, c, yp, NULL, xp, P, NULL, &o));
        o.keep_mask = (mha_mask){mask, tc->shared_mask ? 1 : B, 1};
        o.positions = tc->rope || tc->alibi ? tpos : NULL; /* a layer without them refuses positions */
        CHECK_OK(mha_forward_cached_ctx(ctx, L, c, yt, NULL, xt, N, N_USED, &o));
        for (int b = 0; b < B; b++) {
            const int tb = tc->shared_mask ? 0 : b, T = P + N_USED[b];
            /* the tree call against the reference of prefix + tree */
            float *x = naive_alloc_floats((size_t)(P + N + 1) * D), *yr = naive_alloc_floats((size_t)(P + N + 1) * D);
            uint8_t *keep = calloc((size_t)(P + N + 1) * (P + N + 1), 1);
            int pos[P + N + 1];
            memcpy(x, xp + (size_t)b * P * D, sizeof(float) * P * D);
            memcpy(x + (size_t)P * D, xt + (size_t)b * N * D, sizeof(float) * N_USED[b] * D);
            for (int a = 0; a < T; a++) {
                pos[a] = a < P ? a : tpos[b * N + a - P];
                for (int e = 0; e < T; e++)
                    /* the window counts along the token's path: by positions (depths), not cache indices */
                    keep[a * T + e] = (uint8_t)(e <= a && visible(tc, pos[a], pos[e]) &&
                                                (a < P || e < P || is_ancestor_or_self(tb, e - P, a - P)));
            }
            double scale = 1.0;
            reference(L, &scale, yr, x, pos, keep, T);
            CHECK_ARRAY_NEAR(yt + (size_t)b * N * D, yr + (size_t)P * D, (size_t)N_USED[b] * D, bound(tc) * scale);
            for (int t = N_USED[b]; t < N; t++) CHECK(yt[((size_t)b * N + t) * D] == 0.0f); /* past n_new */
            /* keep the accepted path, then one more token after it */
            int keep_idx[3], n_keep = PATH_LEN[tb];
            for (int i = 0; i < n_keep; i++) keep_idx[i] = PATH[tb][i];
            CHECK_OK(mha_cache_compact(c, b, P, keep_idx, n_keep));
            CHECK_INT(mha_cache_length(c, b), P + n_keep);
            const int Tn = P + n_keep + 1;
            for (int i = 0; i < n_keep; i++) {
                memcpy(x + (size_t)(P + i) * D, xt + ((size_t)b * N + keep_idx[i]) * D, sizeof(float) * D);
                pos[P + i] = tpos[b * N + keep_idx[i]];
                CHECK_INT(pos[P + i], P + i); /* a path from a root has depths 0, 1, ... */
            }
            memcpy(x + (size_t)(Tn - 1) * D, xn + (size_t)b * D, sizeof(float) * D);
            pos[Tn - 1] = Tn - 1;
            for (int a = 0; a < Tn; a++)
                for (int e = 0; e < Tn; e++) keep[a * Tn + e] = (uint8_t)visible(tc, a, e);
            scale = 1.0;
            reference(L, &scale, yr, x, pos, keep, Tn);
            memcpy(x, yr + (size_t)(Tn - 1) * D, sizeof(float) * D); /* the next token's reference row */
            if (b == B - 1) { /* both sequences compacted: decode one token each */
                mha_options on = mha_options_default();
                CHECK_OK(mha_forward_cached_ctx(ctx, L, c, yn, NULL, xn, 1, NULL, &on));
            }
            memcpy(yr, x, sizeof(float) * D);
            if (b == 0) memcpy(yp, yr, sizeof(float) * D); /* sequence 0's expected row, kept for later */
            else {
                CHECK_ARRAY_NEAR(yn, yp, (size_t)D, bound(tc) * scale);
                CHECK_ARRAY_NEAR(yn + D, yr, (size_t)D, bound(tc) * scale);
            }
            free(x), free(yr), free(keep);
        }
        /* the same storage fed prefix + path directly: the compacted keys,
         * values, int8 scales and positions are those the path's tokens
         * store themselves (up to the projections' rounding): far tighter
         * than the bound against the reference (an int8 key moved without
         * its scales is within that bound) */
        mha_cache *d = NULL;
        CHECK_OK(mha_cache_create_kv(&d, L, B, tc->cap, tc->kt, tc->vt, tc->window));
        float *xpath = naive_alloc_floats((size_t)B * 3 * D), *yd = naive_alloc_floats((size_t)B * P * D); /* P > 3, 1 */
        if (d) {
            int n_path[B];
            for (int b = 0; b < B; b++) {
                const int tb = tc->shared_mask ? 0 : b;
                n_path[b] = PATH_LEN[tb];
                for (int i = 0; i < n_path[b]; i++)
                    memcpy(xpath + ((size_t)b * 3 + i) * D, xt + ((size_t)b * N + PATH[tb][i]) * D, sizeof(float) * D);
            }
            if (tc->n_sink) CHECK_OK(mha_cache_set_sink_tokens(d, tc->n_sink));
            mha_options od = mha_options_default();
            CHECK_OK(mha_forward_cached_ctx(ctx, L, d, yd, NULL, xp, P, NULL, &od));
            CHECK_OK(mha_forward_cached_ctx(ctx, L, d, yd, NULL, xpath, 3, n_path, &od));
            CHECK_OK(mha_forward_cached_ctx(ctx, L, d, yd, NULL, xn, 1, NULL, &od));
            double s1 = 1.0;
            for (int i = 0; i < B * D; i++) s1 = fmax(s1, fabs(yd[i]));
            CHECK_ARRAY_NEAR(yn, yd, (size_t)B * D, 1e-5 * s1); /* measured: the same bits */
        }
        mha_cache_free(d), free(xpath), free(yd);
        mha_cache_free(c);
    }
    mha_context_free(ctx);
    mha_layer_free(L), naive_weights_free(&w);
    free(xp), free(xt), free(xn), free(yp), free(yt), free(yn);
}

static void test_tree_plain(void) {
    tree_case tc = {H, 32, 0, 0, MHA_CACHE_F32, MHA_CACHE_F32, 0, 0, 0};
    tree_matches_reference(&tc);
}
/* GQA with RoPE: the tree's positions are its depths */
static void test_tree_gqa_rope(void) {
    tree_case tc = {2, 32, 0, 0, MHA_CACHE_F32, MHA_CACHE_F32, 1, 0, 0};
    tree_matches_reference(&tc);
}
/* MQA (the grouped kernels), ALiBi distances from the stored positions, fp16 */
static void test_tree_mqa_alibi_fp16(void) {
    tree_case tc = {1, 32, 0, 0, MHA_CACHE_F16, MHA_CACHE_F16, 0, 1, 0};
    tree_matches_reference(&tc);
}
/* int8 K/V, one mask for both sequences */
static void test_tree_int8_shared_mask(void) {
    tree_case tc = {4, 32, 0, 0, MHA_CACHE_I8, MHA_CACHE_I8, 1, 0, 1};
    tree_matches_reference(&tc);
}
/* a ring that wraps inside the tree (capacity 13 with 2 sink tokens and
 * window 6: the tree's positions 10..15 reach ring slot 2 at 13; a tree
 * call must fit one piece, capacity - sinks - window + 1 = 6) with RoPE:
 * the window of a token after its siblings reaches further back than its
 * cache index would */
static void test_tree_ring_sinks(void) {
    tree_case tc = {2, 13, 6, 2, MHA_CACHE_F32, MHA_CACHE_F16, 1, 0, 0};
    tree_matches_reference(&tc);
}

/* A 40-token tree (MHA: 40 query rows per kv head, two units of the
 * decode plan) on a window of 48 over a 60-token prefix: its late tokens
 * are roots or their children, whose windows reach 47 positions before
 * their depth, further back than the cache index of the second unit's
 * first row: every prefix key they need is in the unit's key range. */
static void test_tree_window_late_roots(void) {
    enum { P2 = 60, N2 = 40, T2 = P2 + N2, W2 = 48 };
    mha_config cf = naive_resolve(naive_config(D, H, H, 8, 8, 1));
    naive_weights w;
    uint64_t seed = 21;
    naive_weights_random(&w, &cf, &seed, 0.5f);
    mha_layer *L = naive_make_layer(&w);
    float *x = naive_random_floats((size_t)T2 * D, &seed, -1, 1); /* (1, T2, D) prefix then tree */
    float *y = naive_alloc_floats((size_t)T2 * D), *yr = naive_alloc_floats((size_t)T2 * D);
    uint8_t *mask = calloc((size_t)N2 * N2, 1), *keep = calloc((size_t)T2 * T2, 1);
    int parent[N2], pos[T2];
    const tree_case tc = {H, 128, W2, 0, MHA_CACHE_F32, MHA_CACHE_F32, 0, 0, 0};
    for (int i = 0; i < N2; i++) parent[i] = i < 20 ? i - 1 : i % 2 ? i - 1 : -1; /* a chain, then short branches */
    for (int a = 0; a < T2; a++) {
        int d = 0;
        for (int q = a < P2 ? -1 : parent[a - P2]; q >= 0; q = parent[q]) d++;
        pos[a] = a < P2 ? a : P2 + d;
    }
    for (int i = 0; i < N2; i++)
        for (int q = i; q >= 0; q = parent[q]) mask[i * N2 + q] = 1;
    for (int a = 0; a < T2; a++)
        for (int e = 0; e <= a; e++)
            keep[a * T2 + e] = (uint8_t)(visible(&tc, pos[a], pos[e]) && (a < P2 || e < P2 || mask[(a - P2) * N2 + e - P2]));
    mha_cache *c = NULL;
    if (L && mask && keep) CHECK_OK(mha_cache_create(&c, L, 1, tc.cap, MHA_CACHE_F32, W2));
    if (c) {
        double scale = 1.0;
        reference(L, &scale, yr, x, pos, keep, T2);
        mha_options o = mha_options_default();
        CHECK_OK(mha_forward_cached(L, c, y, NULL, x, P2, NULL, &o));
        o.keep_mask = (mha_mask){mask, 1, 1};
        CHECK_OK(mha_forward_cached(L, c, y, NULL, x + (size_t)P2 * D, N2, NULL, &o));
        CHECK_ARRAY_NEAR(y, yr + (size_t)P2 * D, (size_t)N2 * D, 2e-6 * scale);
    }
    mha_cache_free(c), mha_layer_free(L), naive_weights_free(&w);
    free(x), free(y), free(yr), free(mask), free(keep);
}

/* Trees over several ring pieces that the ring can hold (found by a
 * random search against numpy, tests/python/test_probe_tree.py): a row
 * that sees only itself on a window of 1 (its window starts below the
 * oldest stored cache position: only its own key), and rows whose path
 * puts a later new token at a sink's position. The reference over prefix
 * + tree with the mask written out by positions along each row's own
 * sequence (the new tokens its row keeps, ranked). */
static void test_tree_ring_pieces(void) {
    enum { TM = 12 };
    static const struct {
        int window, n_sink, cap, P, T;
        uint8_t m[8][8];
    } cases[] = {
        {1, 1, 3, 1, 4, {{0}, {1}, {1, 0, 1}, {0, 0, 0, 1}}},
        {2, 2, 4, 1, 3, {{1}, {0, 1}, {0, 1, 1}}},
        {2, 2, 5, 1, 4, {{1}, {1, 1}, {1, 1, 1}, {0, 0, 1, 1}}},
    };
    mha_config cf = naive_resolve(naive_config(D, 4, 2, 8, 8, 1));
    naive_weights w;
    uint64_t seed = 33;
    naive_weights_random(&w, &cf, &seed, 0.5f);
    mha_layer *L = naive_make_layer(&w);
    float *x = naive_random_floats((size_t)TM * D, &seed, -1, 1), *y = naive_alloc_floats((size_t)TM * D);
    float *yr = naive_alloc_floats((size_t)TM * D);
    for (size_t k = 0; L && k < sizeof cases / sizeof cases[0]; k++) {
        const int W = cases[k].window, ns = cases[k].n_sink, P = cases[k].P, T = cases[k].T, S = P + T;
        uint8_t mask[8][8], keep[TM][TM] = {{0}};
        int pos[TM];
        for (int a = 0; a < S; a++) pos[a] = a;
        for (int i = 0; i < T; i++) {
            int rank[8], n = 0; /* new token j's position past P along row i's sequence */
            for (int j = 0; j <= i; j++) mask[i][j] = cases[k].m[i][j], rank[j] = n, n += mask[i][j] != 0;
            for (int j = i + 1; j < T; j++) mask[i][j] = 0;
            const int pe = P + rank[i];
            for (int e = 0; e < S; e++) {
                const int ep = e < P ? e : P + rank[e - P];
                keep[P + i][e] = (uint8_t)((e < P || (e - P <= i && mask[i][e - P])) && (ep > pe - W || ep < ns));
            }
        }
        for (int a = 0; a < P; a++)
            for (int e = 0; e <= a; e++) keep[a][e] = (uint8_t)(e > a - W || e < ns);
        uint8_t *kc = malloc((size_t)S * S); /* (S, S) */
        for (int a = 0; kc && a < S; a++) memcpy(kc + (size_t)a * S, keep[a], (size_t)S);
        mha_cache *c = NULL;
        CHECK_OK(mha_cache_create(&c, L, 1, cases[k].cap, MHA_CACHE_F32, W));
        if (c && ns) CHECK_OK(mha_cache_set_sink_tokens(c, ns));
        if (c && kc) {
            double scale = 1.0;
            reference(L, &scale, yr, x, pos, kc, S);
            mha_options o = mha_options_default();
            if (P) CHECK_OK(mha_forward_cached(L, c, y, NULL, x, P, NULL, &o));
            uint8_t mt[8 * 8];
            for (int i = 0; i < T; i++) memcpy(mt + (size_t)i * T, mask[i], (size_t)T);
            o.keep_mask = (mha_mask){mt, 1, 1};
            CHECK_OK(mha_forward_cached(L, c, y, NULL, x + (size_t)P * D, T, NULL, &o));
            CHECK_ARRAY_NEAR(y, yr + (size_t)P * D, (size_t)T * D, 2e-6 * scale);
        }
        mha_cache_free(c), free(kc);
    }
    mha_layer_free(L), naive_weights_free(&w);
    free(x), free(y), free(yr);
}

/* The probabilities a tree call captures: zero where the tree hides a key,
 * the reference's elsewhere (column = cache position). */
static void test_tree_probs(void) {
    mha_config cf = naive_resolve(naive_config(D, 4, 2, 8, 8, 1));
    naive_weights w;
    uint64_t seed = 9;
    naive_weights_random(&w, &cf, &seed, 0.5f);
    mha_layer *L = naive_make_layer(&w);
    const int T = P + N, cap = 16;
    float *x = naive_random_floats((size_t)T * D, &seed, -1, 1); /* (1, T, D) */
    float *y = naive_alloc_floats((size_t)T * D), *pr = naive_alloc_floats((size_t)4 * T * T);
    float *pc = naive_alloc_floats((size_t)4 * N * cap);
    uint8_t mask[N][N], keep[P + N][P + N];
    for (int i = 0; i < N; i++)
        for (int j = 0; j < N; j++) mask[i][j] = (uint8_t)is_ancestor_or_self(0, j, i);
    for (int a = 0; a < T; a++)
        for (int e = 0; e < T; e++) keep[a][e] = (uint8_t)(e <= a && (a < P || e < P || mask[a - P][e - P]));
    mha_options o = naive_ref_options();
    o.keep_mask = (mha_mask){keep, 1, 1};
    mha_capture cr = {.probs = pr}, cc = {.probs = pc};
    mha_cache *c = NULL;
    if (L) CHECK_OK(mha_forward(L, y, &cr, x, NULL, 1, T, T, &o));
    if (L) CHECK_OK(mha_cache_create(&c, L, 1, cap, MHA_CACHE_F32, 0));
    if (c) {
        mha_options oc = mha_options_default();
        CHECK_OK(mha_forward_cached(L, c, y, NULL, x, P, NULL, &oc));
        oc.keep_mask = (mha_mask){mask, 1, 1};
        CHECK_OK(mha_forward_cached(L, c, y, &cc, x + (size_t)P * D, N, NULL, &oc));
        double worst = 0.0;
        int hidden_zero = 1;
        for (int r = 0; r < 4; r++)
            for (int i = 0; i < N; i++)
                for (int s = 0; s < cap; s++) {
                    const float got = pc[((size_t)r * N + i) * cap + s];
                    const float want = s < T ? pr[((size_t)r * T + P + i) * T + s] : 0.0f;
                    worst = fmax(worst, fabs(got - want));
                    if (s >= P && s < T && !mask[i][s - P]) hidden_zero &= got == 0.0f;
                }
        CHECK(worst <= 1e-5);
        CHECK(hidden_zero);
    }
    mha_cache_free(c), mha_layer_free(L), naive_weights_free(&w);
    free(x), free(y), free(pr), free(pc);
}

static void test_tree_refusals(void) {
    mha_config cf = naive_resolve(naive_config(D, 4, 2, 8, 8, 1));
    naive_weights w;
    uint64_t seed = 3;
    naive_weights_random(&w, &cf, &seed, 0.5f);
    mha_layer *L = naive_make_layer(&w);
    float *x = naive_random_floats((size_t)B * N * D, &seed, -1, 1), *y = naive_alloc_floats((size_t)B * N * D);
    mha_cache *c = NULL, *ring = NULL, *cross = NULL;
    if (L) CHECK_OK(mha_cache_create(&c, L, B, 32, MHA_CACHE_F32, 0));
    if (!c) goto done;
    uint8_t mask[B][N][N];
    memset(mask, 0, sizeof mask);
    for (int b = 0; b < B; b++)
        for (int i = 0; i < N; i++) mask[b][i][i] = 1;
    mha_options o = mha_options_default();
    o.keep_mask = (mha_mask){mask, B, 1};
    mask[1][2][4] = 1; /* above the diagonal: refused, nothing appended */
    CHECK_STATUS(mha_forward_cached(L, c, y, NULL, x, N, NULL, &o), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("keep_mask[1][2][4] = 1");
    CHECK_INT(mha_cache_length(c, 1), 0);
    const int n_new[B] = {N, 4}; /* past n_new[1]: not read */
    CHECK_OK(mha_forward_cached(L, c, y, NULL, x, N, n_new, &o));
    mask[1][2][4] = 0;
    o.keep_mask.heads = 4;
    CHECK_STATUS(mha_forward_cached(L, c, y, NULL, x, N, NULL, &o), MHA_E_SHAPE);
    CHECK_ERROR_MENTIONS("keep_mask.heads=4");
    o.keep_mask = (mha_mask){mask, 3, 1};
    CHECK_STATUS(mha_forward_cached(L, c, y, NULL, x, N, NULL, &o), MHA_E_SHAPE);
    CHECK_ERROR_MENTIONS("keep_mask.batch=3");
    o.keep_mask = (mha_mask){NULL, 1, 1};
    uint8_t kk[B * N] = {0};
    o.key_keep = kk;
    CHECK_STATUS(mha_forward_cached(L, c, y, NULL, x, N, NULL, &o), MHA_E_UNSUPPORTED);
    CHECK_ERROR_MENTIONS("key_keep is not supported");
    /* compaction: lengths are 6 and 4 */
    const int inc[3] = {0, 2, 1}, ok[2] = {1, 3}, past[1] = {4};
    CHECK_STATUS(mha_cache_compact(c, 0, 2, inc, 3), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("keep[2]=1; expected strictly increasing");
    CHECK_STATUS(mha_cache_compact(c, 1, 0, past, 1), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("keep[0]=4");
    CHECK_STATUS(mha_cache_compact(c, 1, 5, ok, 0), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("first=5 for sequence 1; expected 0..4");
    CHECK_STATUS(mha_cache_compact(c, 2, 0, ok, 1), MHA_E_ARG);
    CHECK_STATUS(mha_cache_compact(c, 0, 2, NULL, 1), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("keep NULL");
    CHECK_STATUS(mha_cache_compact(c, 0, 2, ok, 5), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("n_keep=5");
    CHECK_STATUS(mha_cache_compact(NULL, 0, 0, ok, 1), MHA_E_ARG);
    CHECK_INT(mha_cache_length(c, 0), N);
    CHECK_OK(mha_cache_compact(c, 1, 0, ok, 2));
    CHECK_INT(mha_cache_length(c, 1), 2);
    CHECK_OK(mha_cache_compact(c, 0, 4, NULL, 0)); /* a truncate */
    CHECK_INT(mha_cache_length(c, 0), 4);
    /* a window that evicted the positions to move */
    CHECK_OK(mha_cache_create(&ring, L, 1, 8, MHA_CACHE_F32, 4));
    float *x12 = naive_random_floats((size_t)12 * D, &seed, -1, 1);
    if (ring) {
        CHECK_OK(mha_forward_cached(L, ring, y, NULL, x12, 6, NULL, NULL));
        CHECK_OK(mha_forward_cached(L, ring, y, NULL, x12 + 6 * D, 6, NULL, NULL)); /* positions 4.. stored */
        CHECK_STATUS(mha_cache_compact(ring, 0, 2, ok, 2), MHA_E_ARG);
        CHECK_ERROR_MENTIONS("expected first >= 4");
        CHECK_INT(mha_cache_length(ring, 0), 12);
        CHECK_STATUS(mha_cache_compact(ring, 0, 4, ok, 1), MHA_E_ARG); /* the next window needs position 2 */
        CHECK_ERROR_MENTIONS("mha_cache_compact: sequence 0 to 5 tokens needs position 2");
        CHECK_OK(mha_cache_compact(ring, 0, 8, ok, 2));
        CHECK_INT(mha_cache_length(ring, 0), 10);
        /* the sink tokens are never evicted: a ring of 8 slots with 4 sinks and a
         * window of 3, holding positions 0..5 (oldest ring position 2), rolls
         * back to 3 tokens, whose next window needs position 1: a sink */
        mha_cache *sk = NULL;
        CHECK_OK(mha_cache_create(&sk, L, 1, 8, MHA_CACHE_F32, 3));
        if (sk) {
            CHECK_OK(mha_cache_set_sink_tokens(sk, 4));
            CHECK_OK(mha_forward_cached(L, sk, y, NULL, x12, 6, NULL, NULL));
            CHECK_OK(mha_cache_truncate(sk, 0, 3));
            CHECK_INT(mha_cache_length(sk, 0), 3);
        }
        mha_cache_free(sk);
        /* a tree in two pieces (ring 8, window 4: 5 tokens a piece): the root at
         * new token 5 needs position 1 for its window, which storing the second
         * piece overwrites; a chain's windows do not reach back: accepted */
        uint8_t m6[6][6] = {{0}};
        for (int i = 0; i < 5; i++)
            for (int j = 0; j <= i; j++) m6[i][j] = 1;
        m6[5][5] = 1;
        CHECK_OK(mha_cache_reset(ring, -1));
        CHECK_OK(mha_forward_cached(L, ring, y, NULL, x12, 4, NULL, NULL));
        o = mha_options_default();
        o.keep_mask = (mha_mask){m6, 1, 1};
        CHECK_STATUS(mha_forward_cached(L, ring, y, NULL, x12 + 4 * D, 6, NULL, &o), MHA_E_ARG);
        CHECK_ERROR_MENTIONS("new token 5 of sequence 0 sees 1 new tokens of the keep_mask and so needs position 1");
        CHECK_INT(mha_cache_length(ring, 0), 4);
        m6[5][4] = m6[5][3] = m6[5][2] = m6[5][1] = m6[5][0] = 1;
        CHECK_OK(mha_forward_cached(L, ring, y, NULL, x12 + 4 * D, 6, NULL, &o));
    }
    /* a new token at a sink's position on its path, overwritten in the ring
     * (capacity 5, 3 sinks, window 1: pieces of 2): new token 3 keeps 1, 2
     * and itself after a 2-token prefix, so token 1 (cache position 3, a ring
     * slot) stands at position 2 of its path, a sink; storing token 3 takes
     * its slot */
    mha_cache *sk = NULL;
    CHECK_OK(mha_cache_create(&sk, L, 1, 5, MHA_CACHE_F32, 1));
    if (sk) {
        static const uint8_t m4[4][4] = {{1, 0, 0, 0}, {1, 1, 0, 0}, {1, 1, 1, 0}, {0, 1, 1, 1}};
        CHECK_OK(mha_cache_set_sink_tokens(sk, 3));
        CHECK_OK(mha_forward_cached(L, sk, y, NULL, x12, 2, NULL, NULL));
        o = mha_options_default();
        o.keep_mask = (mha_mask){m4, 1, 1};
        CHECK_STATUS(mha_forward_cached(L, sk, y, NULL, x12 + 2 * D, 4, NULL, &o), MHA_E_ARG);
        CHECK_ERROR_MENTIONS("new token 3 of sequence 0 sees 3 new tokens of the keep_mask and so needs position 3");
        CHECK_INT(mha_cache_length(sk, 0), 2);
    }
    mha_cache_free(sk);
    free(x12);
    /* a cross-attention memory */
    CHECK_OK(mha_cache_create_cross(&cross, L, 1, 8, MHA_CACHE_F32, MHA_CACHE_F32));
    if (cross) {
        const int sl[1] = {3};
        CHECK_OK(mha_cache_set_memory(cross, L, x, NULL, 3, sl));
        CHECK_STATUS(mha_cache_compact(cross, 0, 0, ok, 1), MHA_E_ARG);
        CHECK_ERROR_MENTIONS("cross-attention memory");
        o = mha_options_default();
        o.keep_mask = (mha_mask){mask, 1, 1};
        CHECK_STATUS(mha_forward_cached(L, cross, y, NULL, x, 1, NULL, &o), MHA_E_UNSUPPORTED);
        CHECK_ERROR_MENTIONS("keep_mask on a cross-attention memory");
    }
done:
    mha_cache_free(c), mha_cache_free(ring), mha_cache_free(cross), mha_layer_free(L), naive_weights_free(&w);
    free(x), free(y);
}

static const test_case cases[] = {
    {"cache_tree_plain", test_tree_plain},
    {"cache_tree_gqa_rope", test_tree_gqa_rope},
    {"cache_tree_mqa_alibi_fp16", test_tree_mqa_alibi_fp16},
    {"cache_tree_int8_shared_mask", test_tree_int8_shared_mask},
    {"cache_tree_ring_sinks", test_tree_ring_sinks},
    {"cache_tree_window_late_roots", test_tree_window_late_roots},
    {"cache_tree_ring_pieces", test_tree_ring_pieces},
    {"cache_tree_probs", test_tree_probs},
    {"cache_tree_refusals", test_tree_refusals},
};

const test_case *tests_cache_tree(size_t *count) {
    *count = sizeof cases / sizeof cases[0];
    return cases;
}
