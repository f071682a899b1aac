/* test_cache_edges.c — the KV cache's low-level entries at their edges:
 * every argument error with its message, sizes against the formula,
 * append/attend against a softmax written out here (GQA, causal, explicit
 * and default scale), and truncate/reset/ring-window rules observed
 * through later attends. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "naive.h"
#include "tests.h"

enum { DM = 8, H = 2, HKV = 1, DK = 4 };

static mha_layer *gqa_layer(void) {
    mha_config cfg = mha_config_default(DM, H);
    cfg.n_kv_heads = HKV;
    mha_layer *L = NULL;
    CHECK_OK(mha_layer_create(&L, &cfg, NULL));
    return L;
}

/* z (T, H*DK) for queries q (T, H*DK) at positions first..first+T-1 over
 * keys k, values v (n_keys, DK) (one kv head), causal, keys >= lo only. */
static void oracle(float *z, const float *q, const float *k, const float *v, int T, int first, int lo,
                   float scale) {
    for (int t = 0; t < T; t++)
        for (int r = 0; r < H; r++) {
            const float *qr = q + ((size_t)t * H + r) * DK;
            int last = first + t;
            double m = -INFINITY, w[64], sum = 0;
            for (int j = lo; j <= last; j++) {
                double s = 0;
                for (int d = 0; d < DK; d++) s += (double)qr[d] * k[(size_t)j * DK + d];
                w[j] = s * scale;
                if (w[j] > m) m = w[j];
            }
            for (int j = lo; j <= last; j++) sum += (w[j] = exp(w[j] - m));
            for (int d = 0; d < DK; d++) {
                double acc = 0;
                for (int j = lo; j <= last; j++) acc += w[j] * v[(size_t)j * DK + d];
                z[((size_t)t * H + r) * DK + d] = (float)(acc / sum);
            }
        }
}

static double max_diff(const float *a, const float *b, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) m = fmax(m, fabs((double)a[i] - b[i]));
    return m;
}

static void test_cache_argument_errors(void) {
    mha_layer *L = gqa_layer();
    if (!L) return;
    mha_cache *c = NULL;
    CHECK_STATUS(mha_cache_create(NULL, L, 1, 8, MHA_CACHE_F32, 0), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("out is NULL");
    CHECK_STATUS(mha_cache_create(&c, NULL, 1, 8, MHA_CACHE_F32, 0), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("layer is NULL");
    CHECK_STATUS(mha_cache_create(&c, L, 1, 8, MHA_CACHE_F32, -1), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("window=-1; expected 0 (none) or 1..capacity=8");
    CHECK_STATUS(mha_cache_create(&c, L, 1 << 20, 1 << 30, MHA_CACHE_F32, 0), MHA_E_NOMEM);
    CHECK_ERROR_MENTIONS("is too large");
    CHECK(c == NULL);

    /* sizes: B * h_kv * (capacity rounded up to 128) * (d_k + d_v) * element */
    mha_config cfg = mha_config_default(DM, H);
    cfg.n_kv_heads = HKV;
    CHECK_INT(mha_cache_bytes_for(&cfg, 3, 130, MHA_CACHE_F16), 3 * HKV * 256 * (DK + DK) * 2);
    CHECK_INT(mha_cache_bytes_for(&cfg, 1, 1, MHA_CACHE_F32), 1 * HKV * 128 * (DK + DK) * 4);
    CHECK_INT(mha_cache_bytes_for(NULL, 1, 8, MHA_CACHE_F32), 0);
    CHECK_INT(mha_cache_bytes_for(&cfg, 0, 8, MHA_CACHE_F32), 0);
    CHECK_INT(mha_cache_bytes_for(&cfg, 1, 0, MHA_CACHE_F32), 0);
    CHECK_INT(mha_cache_bytes_for(&cfg, 1, 8, (mha_cache_dtype)9), 0);
    mha_config bad = cfg;
    bad.n_kv_heads = 3; /* does not divide h */
    CHECK_INT(mha_cache_bytes_for(&bad, 1, 8, MHA_CACHE_F32), 0);
    CHECK_INT(mha_cache_bytes(NULL), 0);

    CHECK_OK(mha_cache_create(&c, L, 2, 4, MHA_CACHE_F32, 0));
    if (!c) goto out;
    CHECK_INT(mha_cache_bytes(c), mha_cache_bytes_for(&cfg, 2, 4, MHA_CACHE_F32));
    CHECK_INT(mha_cache_length(NULL, 0), -1);
    CHECK_ERROR_MENTIONS("mha_cache_length: cache is NULL");
    CHECK_INT(mha_cache_length(c, 2), -1);
    CHECK_ERROR_MENTIONS("mha_cache_length: sequence 2; expected 0..1");
    CHECK_INT(mha_cache_length(c, -1), -1);
    CHECK_STATUS(mha_cache_reset(NULL, 0), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("mha_cache_reset: cache is NULL");
    CHECK_STATUS(mha_cache_reset(c, -2), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("sequence -2; expected 0..1 or -1 (all)");
    CHECK_STATUS(mha_cache_reset(c, 2), MHA_E_ARG);
    CHECK_STATUS(mha_cache_truncate(NULL, 0, 0), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("mha_cache_truncate: cache is NULL");
    CHECK_STATUS(mha_cache_truncate(c, 2, 0), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("mha_cache_truncate: sequence 2; expected 0..1");
    CHECK_STATUS(mha_cache_truncate(c, -1, 0), MHA_E_ARG);
    CHECK_STATUS(mha_cache_truncate(c, 0, 1), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("new_len=1 for sequence 0; expected 0..0 (its length)");
    CHECK_STATUS(mha_cache_truncate(c, 0, -1), MHA_E_ARG);
    int perm[H] = {1, 0}, dup[H] = {0, 0};
    CHECK_STATUS(mha_cache_permute_heads(NULL, perm), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("mha_cache_permute_heads: NULL cache");
    CHECK_STATUS(mha_cache_permute_heads(c, NULL), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("mha_cache_permute_heads: NULL perm");
    CHECK(mha_cache_permute_heads(c, dup) != MHA_OK);

    float k[2 * 4 * DK] = {0}, v[2 * 4 * DK] = {0}, q[2 * 4 * H * DK] = {0}, z[2 * 4 * H * DK];
    CHECK_STATUS(mha_cache_append(NULL, k, v, 1, NULL), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("mha_cache_append: NULL cache");
    CHECK_STATUS(mha_cache_append(c, NULL, v, 1, NULL), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("NULL k");
    CHECK_STATUS(mha_cache_append(c, k, NULL, 1, NULL), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("NULL v");
    CHECK_STATUS(mha_cache_append(c, k, v, 0, NULL), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("mha_cache_append: T=0; expected >= 1");
    int n_bad[2] = {1, 3}, n_neg[2] = {-1, 0};
    CHECK_STATUS(mha_cache_append(c, k, v, 2, n_bad), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("n_new[1]=3; expected 0..T=2");
    CHECK_STATUS(mha_cache_append(c, k, v, 2, n_neg), MHA_E_ARG);
    CHECK_STATUS(mha_cache_append(c, k, v, 4, NULL), MHA_OK);
    CHECK_STATUS(mha_cache_append(c, k, v, 1, NULL), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("sequence 0 holds 4 tokens, 1 more exceed the capacity 4");
    CHECK_INT(mha_cache_length(c, 1), 4); /* the refusal stored nothing */
    CHECK_STATUS(mha_cache_attend(NULL, z, q, 1, NULL, 0), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("mha_cache_attend: NULL cache");
    CHECK_STATUS(mha_cache_attend(c, NULL, q, 1, NULL, 0), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("NULL z");
    CHECK_STATUS(mha_cache_attend(c, z, NULL, 1, NULL, 0), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("NULL q");
    CHECK_STATUS(mha_cache_attend(c, z, q, 1, NULL, NAN), MHA_E_NONFINITE);
    CHECK_ERROR_MENTIONS("scale=nan; expected finite");
    CHECK_STATUS(mha_cache_attend(c, z, q, 0, NULL, 0), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("mha_cache_attend: T=0");
    CHECK_OK(mha_cache_reset(c, 1));
    CHECK_INT(mha_cache_length(c, 0), 4);
    CHECK_INT(mha_cache_length(c, 1), 0);
    CHECK_STATUS(mha_cache_attend(c, z, q, 1, NULL, 0), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("n_new[1]=1 but sequence 1 holds 0 tokens; append the queries' keys first");
    CHECK_OK(mha_cache_reset(c, -1));
    CHECK_INT(mha_cache_length(c, 0), 0);
out:
    mha_cache_free(c);
    mha_cache_free(NULL);
    mha_layer_free(L);
}

/* append then attend = the softmax above; truncate replaces the tail;
 * permuting query heads inside the one kv group keeps the kv storage. */
static void test_cache_attend_matches_oracle(void) {
    mha_layer *L = gqa_layer();
    if (!L) return;
    mha_cache *c = NULL;
    CHECK_OK(mha_cache_create(&c, L, 1, 8, MHA_CACHE_F32, 0));
    if (!c) {
        mha_layer_free(L);
        return;
    }
    uint64_t seed = 11;
    float *k = naive_random_floats(8 * DK, &seed, -1, 1), *v = naive_random_floats(8 * DK, &seed, -1, 1);
    float *q = naive_random_floats(8 * H * DK, &seed, -1, 1);
    float z[8 * H * DK], want[8 * H * DK];
    const float def = 1.0f / sqrtf((float)DK);
    CHECK_OK(mha_cache_append(c, k, v, 5, NULL));
    CHECK_OK(mha_cache_attend(c, z, q, 5, NULL, 0)); /* default scale */
    oracle(want, q, k, v, 5, 0, 0, def);
    CHECK(max_diff(z, want, 5 * H * DK) <= 1e-5);
    /* the last 2 positions only, explicit scale; rows past n_new untouched */
    int two[1] = {2};
    for (size_t i = 0; i < sizeof z / sizeof z[0]; i++) z[i] = 42.0f;
    CHECK_OK(mha_cache_attend(c, z, q, 3, two, 0.5f));
    oracle(want, q, k, v, 2, 3, 0, 0.5f);
    CHECK(max_diff(z, want, 2 * H * DK) <= 1e-5);
    CHECK(z[2 * H * DK] == 42.0f && z[3 * H * DK - 1] == 42.0f);
    /* truncate to 3 and append a new key 3: attends see the new one */
    CHECK_OK(mha_cache_truncate(c, 0, 3));
    CHECK_INT(mha_cache_length(c, 0), 3);
    for (int d = 0; d < DK; d++) k[3 * DK + d] = 2.0f * (float)(d + 1) / DK, v[3 * DK + d] = -3.0f;
    CHECK_OK(mha_cache_append(c, k + 3 * DK, v + 3 * DK, 1, NULL));
    CHECK_OK(mha_cache_attend(c, z, q + 3 * H * DK, 1, NULL, 0));
    oracle(want, q + 3 * H * DK, k, v, 1, 3, 0, def);
    CHECK(max_diff(z, want, H * DK) <= 1e-5);
    /* a valid perm within the group: storage unchanged */
    int perm[H] = {1, 0};
    CHECK_OK(mha_cache_permute_heads(c, perm));
    CHECK_OK(mha_cache_attend(c, z, q + 3 * H * DK, 1, NULL, 0));
    CHECK(max_diff(z, want, H * DK) <= 1e-5);
    /* truncate to 0 empties it */
    CHECK_OK(mha_cache_truncate(c, 0, 0));
    CHECK_INT(mha_cache_length(c, 0), 0);
    free(k), free(v), free(q);
    mha_cache_free(c);
    mha_layer_free(L);
}

/* A ring of 4 slots with window 2: at most 3 rows per call, old positions
 * forgotten; truncate and attend refuse what the ring no longer holds. */
static void test_cache_ring_window_edges(void) {
    mha_layer *L = gqa_layer();
    if (!L) return;
    mha_cache *c = NULL;
    CHECK_OK(mha_cache_create(&c, L, 1, 4, MHA_CACHE_F32, 2));
    if (!c) {
        mha_layer_free(L);
        return;
    }
    uint64_t seed = 12;
    float *k = naive_random_floats(8 * DK, &seed, -1, 1), *v = naive_random_floats(8 * DK, &seed, -1, 1);
    float *q = naive_random_floats(8 * H * DK, &seed, -1, 1);
    float z[8 * H * DK], want[8 * H * DK];
    CHECK_STATUS(mha_cache_append(c, k, v, 4, NULL), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("4 tokens for sequence 0 in one call; a ring of 4 slots with window 2 takes at most 3");
    CHECK_OK(mha_cache_append(c, k, v, 3, NULL));
    CHECK_OK(mha_cache_append(c, k + 3 * DK, v + 3 * DK, 3, NULL)); /* positions 3..5; ring keeps 2..5 */
    CHECK_INT(mha_cache_length(c, 0), 6);
    /* position 5 sees keys 4, 5 (window 2) */
    CHECK_OK(mha_cache_attend(c, z, q + 5 * H * DK, 1, NULL, 0));
    oracle(want, q + 5 * H * DK, k, v, 1, 5, 4, 1.0f / sqrtf((float)DK));
    CHECK(max_diff(z, want, H * DK) <= 1e-5);
    /* queries from position 1 need key 0, long overwritten */
    CHECK_STATUS(mha_cache_attend(c, z, q, 5, NULL, 0), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("needs position 0, already overwritten in the ring");
    /* truncating to 2 would need position 1 for the next token: gone */
    CHECK_STATUS(mha_cache_truncate(c, 0, 2), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("kept only positions >= 2; expected new_len >= 3 or <= 0");
    CHECK_INT(mha_cache_length(c, 0), 6);
    CHECK_OK(mha_cache_truncate(c, 0, 3));
    CHECK_INT(mha_cache_length(c, 0), 3);
    CHECK_OK(mha_cache_truncate(c, 0, 0));
    CHECK_INT(mha_cache_length(c, 0), 0);
    free(k), free(v), free(q);
    mha_cache_free(c);
    mha_layer_free(L);
}

/* options.sink_tokens on a cache that keeps none is refused saying so
 * (the message read "keeps 0; expected 0 or 0"), and so is a count other
 * than the ring's, which it names; the cache is left as it was. */
static void test_cache_sink_tokens_without(void) {
    mha_layer *L = gqa_layer();
    if (!L) return;
    float x[DM] = {0.5f, -1.0f, 0.25f, 2.0f, -0.5f, 1.0f, 0.75f, -2.0f}, y[DM];
    mha_options o = mha_options_default();
    o.causal = 1, o.window_left = 2, o.sink_tokens = 2;
    mha_cache *c = NULL;
    CHECK_OK(mha_cache_create(&c, L, 1, 8, MHA_CACHE_F32, 0));
    if (c) {
        CHECK_STATUS(mha_forward_cached(L, c, y, NULL, x, 1, NULL, &o), MHA_E_ARG);
        CHECK_ERROR_MENTIONS("options.sink_tokens=2 but the cache keeps none; expected 0, or a ring cache given "
                             "them by mha_cache_set_sink_tokens");
        CHECK_INT(mha_cache_length(c, 0), 0);
    }
    mha_cache_free(c);
    c = NULL;
    CHECK_OK(mha_cache_create(&c, L, 1, 6, MHA_CACHE_F32, 3));
    if (c) CHECK_OK(mha_cache_set_sink_tokens(c, 3));
    if (c) {
        CHECK_STATUS(mha_forward_cached(L, c, y, NULL, x, 1, NULL, &o), MHA_E_ARG);
        CHECK_ERROR_MENTIONS("options.sink_tokens=2 but the cache keeps 3; expected 0 or 3");
        o.sink_tokens = 3;
        CHECK_OK(mha_forward_cached(L, c, y, NULL, x, 1, NULL, &o));
        CHECK_INT(mha_cache_length(c, 0), 1);
    }
    mha_cache_free(c);
    mha_layer_free(L);
}

/* Rolling a ring back past its oldest stored position is fine when the
 * next token needs none of the ring's keys: a window of 1 (the token
 * alone), or a new length inside the sink tokens (the window then reaches
 * back only into the sinks, always kept). Both were refused ("needs
 * position 8" for a window of 1, "needs position 2" for a token at
 * position 1), though the token needs neither; the next token then
 * attends the keys a fresh cache fed the same tokens gives. */
static void test_cache_ring_rollback_past_the_ring(void) {
    mha_layer *L = gqa_layer();
    if (!L) return;
    uint64_t seed = 13;
    float *k = naive_random_floats(12 * DK, &seed, -1, 1), *v = naive_random_floats(12 * DK, &seed, -1, 1);
    float *q = naive_random_floats(H * DK, &seed, -1, 1);
    float z[H * DK], want[H * DK];
    const float def = 1.0f / sqrtf((float)DK);
    mha_cache *c = NULL;
    /* window 1 in one slot: positions 0..9, then back to 8 and a new key 8 */
    CHECK_OK(mha_cache_create(&c, L, 1, 1, MHA_CACHE_F32, 1));
    for (int t = 0; c && t < 10; t++) CHECK_OK(mha_cache_append(c, k + (size_t)t * DK, v + (size_t)t * DK, 1, NULL));
    if (c) {
        CHECK_OK(mha_cache_truncate(c, 0, 8));
        CHECK_INT(mha_cache_length(c, 0), 8);
        CHECK_OK(mha_cache_append(c, k + 10 * DK, v + 10 * DK, 1, NULL)); /* the new key at position 8 */
        CHECK_OK(mha_cache_attend(c, z, q, 1, NULL, 0));
        float kk[9 * DK], vv[9 * DK];
        memcpy(kk + 8 * DK, k + 10 * DK, sizeof(float) * DK), memcpy(vv + 8 * DK, v + 10 * DK, sizeof(float) * DK);
        oracle(want, q, kk, vv, 1, 8, 8, def);
        CHECK(max_diff(z, want, H * DK) <= 1e-6);
    }
    mha_cache_free(c);
    c = NULL;
    /* 2 sink tokens, window 3, 5 slots (a ring of 3, one token a call): after 10 positions it holds 7..9 */
    CHECK_OK(mha_cache_create(&c, L, 1, 5, MHA_CACHE_F32, 3));
    if (c) CHECK_OK(mha_cache_set_sink_tokens(c, 2));
    for (int t = 0; c && t < 10; t++) CHECK_OK(mha_cache_append(c, k + (size_t)t * DK, v + (size_t)t * DK, 1, NULL));
    if (c) {
        /* to 3: the token at 3 needs position 2 (window 1..3), overwritten */
        CHECK_STATUS(mha_cache_truncate(c, 0, 3), MHA_E_ARG);
        CHECK_ERROR_MENTIONS("to 3 tokens needs position 2 for its window of 3, but the ring (capacity 5, 2 sink "
                             "tokens) kept only positions >= 7; expected new_len >= 9 or <= 2");
        CHECK_INT(mha_cache_length(c, 0), 10);
        /* to 1: the token at 1 needs position 0, a sink */
        CHECK_OK(mha_cache_truncate(c, 0, 1));
        CHECK_OK(mha_cache_append(c, k + 11 * DK, v + 11 * DK, 1, NULL)); /* the new key at position 1 */
        CHECK_OK(mha_cache_attend(c, z, q, 1, NULL, 0));
        float kk[2 * DK], vv[2 * DK];
        memcpy(kk, k, sizeof(float) * DK), memcpy(vv, v, sizeof(float) * DK);
        memcpy(kk + DK, k + 11 * DK, sizeof(float) * DK), memcpy(vv + DK, v + 11 * DK, sizeof(float) * DK);
        oracle(want, q, kk, vv, 1, 1, 0, def);
        CHECK(max_diff(z, want, H * DK) <= 1e-6);
        /* and on: positions 2..6 wrap the ring again (keys 0, 1 and the new ones) */
        for (int t = 2; t < 7; t++) CHECK_OK(mha_cache_append(c, k + (size_t)t * DK, v + (size_t)t * DK, 1, NULL));
        CHECK_INT(mha_cache_length(c, 0), 7);
        CHECK_OK(mha_cache_attend(c, z, q, 1, NULL, 0)); /* position 6: keys 0, 1 (sinks) and 4..6 */
        float k5[5 * DK], v5[5 * DK];                     /* those five keys in order */
        memcpy(k5, kk, sizeof kk), memcpy(v5, vv, sizeof vv);
        memcpy(k5 + 2 * DK, k + 4 * DK, sizeof(float) * 3 * DK), memcpy(v5 + 2 * DK, v + 4 * DK, sizeof(float) * 3 * DK);
        oracle(want, q, k5, v5, 1, 4, 0, def);
        CHECK(max_diff(z, want, H * DK) <= 1e-6);
    }
    mha_cache_free(c);
    free(k), free(v), free(q);
    mha_layer_free(L);
}

/* The low-level attend keeps mha_forward_cached's range rule: scores
 * beyond the fp32 softmax's limit are refused, and so are queries whose
 * int8 block sums (before the block's scale: tiny keys, huge queries, a
 * small score) would overflow fp32 — a wrong, finite z before; an fp32
 * cache of the same numbers is fine. */
static void test_cache_attend_range(void) {
    mha_layer *L = gqa_layer();
    if (!L) return;
    float k[2 * DK], v[2 * DK], q[H * DK], z[H * DK];
    for (int i = 0; i < 2 * DK; i++) k[i] = 1.0f, v[i] = 0.5f;
    for (int i = 0; i < H * DK; i++) q[i] = 1e6f;
    mha_cache *c = NULL;
    CHECK_OK(mha_cache_create(&c, L, 1, 8, MHA_CACHE_F32, 0));
    if (c) {
        CHECK_OK(mha_cache_append(c, k, v, 2, NULL));
        CHECK_STATUS(mha_cache_attend(c, z, q, 1, NULL, 0), MHA_E_NONFINITE);
        CHECK_ERROR_MENTIONS("mha_cache_attend: scores of sequence 0 kv head 0 may reach");
        for (int i = 0; i < H * DK; i++) q[i] = 1.0f;
        CHECK_OK(mha_cache_attend(c, z, q, 1, NULL, 0));
    }
    mha_cache_free(c);
    for (int dt = 0; dt < 2; dt++) { /* scores of 4e3 (q 1e37, keys ~1e-33): the int8 block sums overflow */
        for (int i = 0; i < 2 * DK; i++) k[i] = 1e-33f * (float)(i % 3 + 1), v[i] = 0.5f;
        for (int i = 0; i < H * DK; i++) q[i] = 1e37f;
        c = NULL;
        CHECK_OK(mha_cache_create(&c, L, 1, 8, dt ? MHA_CACHE_I8 : MHA_CACHE_F32, 0));
        if (!c) continue;
        CHECK_OK(mha_cache_append(c, k, v, 2, NULL));
        if (dt) {
            CHECK_STATUS(mha_cache_attend(c, z, q, 1, NULL, 0), MHA_E_NONFINITE);
            CHECK_ERROR_MENTIONS("this cache's int8 keys sum q times codes up to 127 before their block scale");
        } else { /* the fp32 cache holds these products: every value is 0.5 */
            CHECK_OK(mha_cache_attend(c, z, q, 1, NULL, 0));
            CHECK(fabsf(z[0] - 0.5f) < 1e-6f && fabsf(z[H * DK - 1] - 0.5f) < 1e-6f);
        }
        mha_cache_free(c);
    }
    mha_layer_free(L);
}

/* The same rule in the cached forward: q = 1e37 from x's dim 0, keys
 * 1e-33 from dim 1 (scores 4e3 at scale 1/sqrt(4)... within the limit):
 * an int8 K refuses the step, nothing appended; an fp32 K computes it. */
static void test_cached_forward_q8_query_limit(void) {
    mha_config cfg = mha_config_default(DM, H);
    cfg.n_kv_heads = HKV, cfg.bias = 0;
    float wq[DM * H * DK] = {0}, wk[DM * HKV * DK] = {0}, wv[DM * HKV * DK] = {0}, wo[H * DK * DM] = {0};
    for (int j = 0; j < H * DK; j++) wq[j] = 1.0f;                       /* row 0: q = x0 */
    for (int j = 0; j < HKV * DK; j++) wk[1 * HKV * DK + j] = 1.0f; /* row 1: k = x1 */
    for (int j = 0; j < HKV * DK; j++) wv[2 * HKV * DK + j] = 1.0f;       /* row 2: v = x2 */
    for (int i = 0; i < H * DK && i < DM; i++) wo[i * DM + i] = 1.0f;
    const mha_weights w = {.w_q = wq, .w_k = wk, .w_v = wv, .w_o = wo};
    mha_layer *L = NULL;
    CHECK_OK(mha_layer_create(&L, &cfg, &w));
    float x[2 * DM] = {0}, y[2 * DM];
    x[1] = 1e-33f, x[2] = 0.5f;                 /* token 0: a tiny key */
    x[DM] = 1e37f, x[DM + 1] = 1e-33f, x[DM + 2] = 0.5f; /* token 1: a huge query */
    for (int dt = 0; L && dt < 2; dt++) {
        mha_cache *c = NULL;
        CHECK_OK(mha_cache_create(&c, L, 1, 8, dt ? MHA_CACHE_I8 : MHA_CACHE_F32, 0));
        if (!c) continue;
        CHECK_OK(mha_forward_cached(L, c, y, NULL, x, 1, NULL, NULL));
        const mha_status s = mha_forward_cached(L, c, y, NULL, x + DM, 1, NULL, NULL);
        if (dt) {
            CHECK_STATUS(s, MHA_E_NONFINITE);
            CHECK_ERROR_MENTIONS("is beyond what this cache's int8 keys hold");
            CHECK_INT(mha_cache_length(c, 0), 1);
        } else {
            CHECK_OK(s);
            CHECK(fabsf(y[0] - 0.5f) < 1e-5f); /* z = v = 0.5 through W_O's identity */
        }
        mha_cache_free(c);
    }
    mha_layer_free(L);
}

static const test_case cases[] = {
    {"cache_edges_argument_errors", test_cache_argument_errors},
    {"cache_edges_attend_matches_oracle", test_cache_attend_matches_oracle},
    {"cache_edges_ring_window", test_cache_ring_window_edges},
    {"cache_edges_ring_rollback_past_the_ring", test_cache_ring_rollback_past_the_ring},
    {"cache_edges_sink_tokens_on_a_cache_without", test_cache_sink_tokens_without},
    {"cache_edges_attend_range", test_cache_attend_range},
    {"cache_edges_forward_q8_query_limit", test_cached_forward_q8_query_limit},
};

const test_case *tests_cache_edges(size_t *count) {
    *count = sizeof cases / sizeof cases[0];
    return cases;
}
