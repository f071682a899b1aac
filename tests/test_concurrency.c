/* test_concurrency.c — the thread-safety contract of mha.h, tested: forwards
 * (fast, reference, cached on separate caches) running at the same time on
 * one layer and on different layers give the bits one thread gets doing
 * them in turn; and the one kernel chooser: MHA_KERNELS (or a context)
 * picks the kernels of every path (prefill, cached prefill, decode).
 * Each call runs on one OpenMP thread (a context), so that the only
 * threads are the test's pthreads: `make test-tsan` runs these tests under
 * ThreadSanitizer, which reports libgomp's own barriers as false races.
 * Legend: B batch, T tokens, D = d_model, h heads. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cache/cache_internal.h"
#include "forward/forward.h"
#include "naive.h"
#include "test_util.h"
#include "tests.h"

#define N_THREADS 4
#define B 2
#define T 40
#define D 32
#define STEPS 3 /* decode steps after the prompt */

typedef struct {
    const mha_layer *L;
    const mha_context *ctx;
    const float *x;  /* (B, T + STEPS, D) */
    float *y_fast;   /* (B, T, D) */
    float *y_ref;    /* (B, T, D) */
    float *y_cache;  /* (B, T + STEPS, D): prompt, then one row per step */
    int failed;
} job;

/* The work of one thread: a fast and a reference forward, then a cached
 * prefill of T tokens and STEPS one-token steps on a cache of its own. */
static void *run_job(void *arg) {
    job *j = arg;
    mha_options fast = mha_options_default(), ref = mha_options_default();
    fast.causal = ref.causal = 1;
    fast.path = MHA_PATH_FAST, ref.path = MHA_PATH_REFERENCE;
    float *x = malloc(sizeof(float) * B * T * D), *ys = malloc(sizeof(float) * B * T * D);
    mha_cache *c = NULL;
    if (!x || !ys || mha_cache_create(&c, j->L, B, T + STEPS, MHA_CACHE_F32, 0)) goto fail;
    for (int b = 0; b < B; b++) memcpy(x + (size_t)b * T * D, j->x + (size_t)b * (T + STEPS) * D, sizeof(float) * T * D);
    if (mha_forward_ctx(j->ctx, j->L, j->y_fast, NULL, x, NULL, NULL, B, T, T, &fast) ||
        mha_forward_ctx(j->ctx, j->L, j->y_ref, NULL, x, NULL, NULL, B, T, T, &ref) ||
        mha_forward_cached_ctx(j->ctx, j->L, c, ys, NULL, x, T, NULL, NULL))
        goto fail;
    for (int b = 0; b < B; b++) memcpy(j->y_cache + (size_t)b * (T + STEPS) * D, ys + (size_t)b * T * D, sizeof(float) * T * D);
    for (int s = 0; s < STEPS; s++) {
        for (int b = 0; b < B; b++) memcpy(x + (size_t)b * D, j->x + ((size_t)b * (T + STEPS) + T + s) * D, sizeof(float) * D);
        if (mha_forward_cached_ctx(j->ctx, j->L, c, ys, NULL, x, 1, NULL, NULL)) goto fail;
        for (int b = 0; b < B; b++) memcpy(j->y_cache + ((size_t)b * (T + STEPS) + T + s) * D, ys + (size_t)b * D, sizeof(float) * D);
    }
    mha_cache_free(c), free(x), free(ys);
    return NULL;
fail:
    j->failed = 1;
    mha_cache_free(c), free(x), free(ys);
    return NULL;
}

static void job_alloc(job *j, const mha_layer *L, const mha_context *ctx, const float *x) {
    j->L = L, j->ctx = ctx, j->x = x, j->failed = 0;
    j->y_fast = naive_alloc_floats((size_t)B * T * D);
    j->y_ref = naive_alloc_floats((size_t)B * T * D);
    j->y_cache = naive_alloc_floats((size_t)B * (T + STEPS) * D);
}

static void job_free(job *j) { free(j->y_fast), free(j->y_ref), free(j->y_cache); }

static int same_bits(const job *a, const job *b) {
    return !memcmp(a->y_fast, b->y_fast, sizeof(float) * B * T * D) &&
           !memcmp(a->y_ref, b->y_ref, sizeof(float) * B * T * D) &&
           !memcmp(a->y_cache, b->y_cache, sizeof(float) * B * (T + STEPS) * D);
}

/* Threads i run on layer layer_of[i] with input i % 2; each result must
 * equal the one computed alone, in turn, beforehand. */
static void run_concurrently(mha_layer *const *layers, const int *layer_of) {
    mha_context *ctx = NULL;
    CHECK_OK(mha_context_create(&ctx));
    CHECK_OK(mha_context_set_num_threads(ctx, 1));
    uint64_t seed = 99;
    float *x[2] = {naive_random_floats((size_t)B * (T + STEPS) * D, &seed, -1.0f, 1.0f),
                   naive_random_floats((size_t)B * (T + STEPS) * D, &seed, -1.0f, 1.0f)};
    job alone[N_THREADS], together[N_THREADS];
    pthread_t th[N_THREADS];
    for (int i = 0; i < N_THREADS; i++) {
        job_alloc(&alone[i], layers[layer_of[i]], ctx, x[i % 2]);
        job_alloc(&together[i], layers[layer_of[i]], ctx, x[i % 2]);
        run_job(&alone[i]);
        CHECK(!alone[i].failed);
    }
    for (int i = 0; i < N_THREADS; i++) CHECK_INT(pthread_create(&th[i], NULL, run_job, &together[i]), 0);
    for (int i = 0; i < N_THREADS; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < N_THREADS; i++) {
        CHECK(!together[i].failed);
        if (!same_bits(&alone[i], &together[i])) test_report(__FILE__, __LINE__, "thread %d: results differ from the sequential run", i);
        job_free(&alone[i]), job_free(&together[i]);
    }
    free(x[0]), free(x[1]);
    mha_context_free(ctx);
}

static mha_layer *make_layer(uint64_t seed_value, naive_weights *w) {
    mha_config c = mha_config_default(D, 4);
    c.n_kv_heads = 2;
    c.bias = 1;
    mha_config rc = naive_resolve(c);
    uint64_t seed = seed_value;
    naive_weights_random(w, &rc, &seed, 0.3f);
    return naive_make_layer(w);
}

static void test_concurrency_one_layer(void) {
    naive_weights w;
    mha_layer *L = make_layer(5, &w);
    const int layer_of[N_THREADS] = {0, 0, 0, 0};
    if (L) run_concurrently(&L, layer_of);
    mha_layer_free(L);
    naive_weights_free(&w);
}

static void test_concurrency_two_layers(void) {
    naive_weights w[2];
    mha_layer *L[2] = {make_layer(5, &w[0]), make_layer(6, &w[1])};
    const int layer_of[N_THREADS] = {0, 1, 0, 1};
    if (L[0] && L[1]) run_concurrently(L, layer_of);
    mha_layer_free(L[0]), mha_layer_free(L[1]);
    naive_weights_free(&w[0]), naive_weights_free(&w[1]);
}

/* ------------------------------------------------- the kernel chooser */

/* Runs the three paths on ex and returns what each asked for. */
static void trace_paths(const mha_exec *base, const mha_layer *L, const float *x,
                        mha_exec_trace *fast, mha_exec_trace *prefill, mha_exec_trace *decode) {
    mha_exec ex = *base;
    float *y = naive_alloc_floats((size_t)B * T * D);
    mha_options o = mha_options_default();
    o.path = MHA_PATH_FAST;
    mha_cache *c = NULL;
    CHECK_OK(mha_cache_create(&c, L, B, T + 1, MHA_CACHE_F16, 0));
    ex.trace = fast;
    CHECK_OK(mha_forward_exec(&ex, L, y, NULL, x, NULL, NULL, B, T, T, &o));
    ex.trace = prefill;
    if (c) CHECK_OK(mha_forward_cached_exec(&ex, L, c, y, NULL, x, T, NULL, NULL));
    ex.trace = decode;
    if (c) CHECK_OK(mha_forward_cached_exec(&ex, L, c, y, NULL, x, 1, NULL, NULL));
    mha_cache_free(c);
    free(y);
}

static void check_every_path(const char *env, const mha_kernels *want, const mha_decode_kernels *want_d) {
    naive_weights w;
    mha_layer *L = make_layer(8, &w);
    uint64_t seed = 3;
    float *x = naive_random_floats((size_t)B * T * D, &seed, -1.0f, 1.0f);
    if (env) setenv("MHA_KERNELS", env, 1);
    else unsetenv("MHA_KERNELS");
    mha_exec ex;
    CHECK_OK(mha_exec_resolve(&ex, NULL));
    mha_exec_trace tf = {0}, tp = {0}, td = {0};
    if (L) trace_paths(&ex, L, x, &tf, &tp, &td);
    CHECK(tf.prefill == want);           /* projections and flash attention */
    CHECK(tp.prefill == want && tp.decode == want_d); /* cached prefill: packed GEMM, attention */
    CHECK(td.decode == want_d);          /* decode: one-row projections, attention */
    if (tf.prefill != want || tp.prefill != want || tp.decode != want_d || td.decode != want_d)
        test_report(__FILE__, __LINE__, "MHA_KERNELS=%s: fast %s, cached prefill %s/%s, decode %s; want %s",
                    env ? env : "(unset)", tf.prefill ? tf.prefill->name : "-", tp.prefill ? tp.prefill->name : "-",
                    tp.decode ? tp.decode->name : "-", td.decode ? td.decode->name : "-", want->name);
    free(x);
    mha_layer_free(L);
    naive_weights_free(&w);
}

static void test_kernels_env_every_path(void) {
    const char *old = getenv("MHA_KERNELS");
    char *saved = old ? strdup(old) : NULL;
    check_every_path("scalar", &mha_kernels_scalar, &mha_decode_kernels_scalar);
    check_every_path(NULL, mha_isa_best()->prefill, mha_isa_best()->decode);
    if (mha_cpu_has_avx2()) check_every_path("avx2", &mha_kernels_avx2, &mha_decode_kernels_avx2);
    if (mha_cpu_has_avx512()) check_every_path("avx512", &mha_kernels_avx512, &mha_decode_kernels_avx512);
    /* an unknown value fails every entry by name */
    naive_weights w;
    mha_layer *L = make_layer(8, &w);
    float *x = naive_alloc_floats((size_t)B * T * D), *y = naive_alloc_floats((size_t)B * T * D);
    mha_cache *c = NULL;
    if (L) CHECK_OK(mha_cache_create(&c, L, B, T, MHA_CACHE_F32, 0));
    setenv("MHA_KERNELS", "avx3", 1);
    CHECK_STATUS(mha_forward(L, y, NULL, x, NULL, B, T, T, NULL), MHA_E_ARG);
    CHECK(strstr(mha_last_error(), "MHA_KERNELS=avx3") != NULL);
    if (c) CHECK_STATUS(mha_forward_cached(L, c, y, NULL, x, T, NULL, NULL), MHA_E_ARG);
    CHECK(mha_context_kernels(NULL) == NULL);
    if (saved) setenv("MHA_KERNELS", saved, 1);
    else unsetenv("MHA_KERNELS");
    free(saved), free(x), free(y);
    mha_cache_free(c);
    mha_layer_free(L);
    naive_weights_free(&w);
}

/* A context's kernels win over MHA_KERNELS; unknown names are refused. */
static void test_kernels_context(void) {
    mha_context *ctx = NULL;
    CHECK_OK(mha_context_create(&ctx));
    if (!ctx) return;
    CHECK_STATUS(mha_context_set_kernels(ctx, "avx3"), MHA_E_ARG);
    CHECK(strstr(mha_last_error(), "expected reference, scalar") != NULL);
    CHECK_STATUS(mha_context_set_num_threads(ctx, -1), MHA_E_ARG);
    CHECK_OK(mha_context_set_kernels(ctx, "scalar"));
    CHECK(mha_context_kernels(ctx) && strcmp(mha_context_kernels(ctx), "scalar") == 0);
    CHECK_OK(mha_context_set_kernels(ctx, "reference"));
    CHECK(mha_context_kernels(ctx) && strcmp(mha_context_kernels(ctx), "reference") == 0);
    CHECK_OK(mha_context_set_kernels(ctx, NULL)); /* back to MHA_KERNELS, else the best ISA */
    const char *env = getenv("MHA_KERNELS");
    CHECK(mha_context_kernels(ctx) && strcmp(mha_context_kernels(ctx), env && *env ? env : mha_isa_best()->name) == 0);
    /* scalar through the context = scalar through the test override, bit for bit */
    naive_weights w;
    mha_layer *L = make_layer(9, &w);
    uint64_t seed = 4;
    float *x = naive_random_floats((size_t)B * T * D, &seed, -1.0f, 1.0f);
    float *y1 = naive_alloc_floats((size_t)B * T * D), *y2 = naive_alloc_floats((size_t)B * T * D);
    CHECK_OK(mha_context_set_kernels(ctx, "scalar"));
    mha_options fast = mha_options_default(); /* the fast path even under MHA_KERNELS=reference */
    fast.path = MHA_PATH_FAST;
    CHECK_OK(mha_forward_ctx(ctx, L, y1, NULL, x, NULL, NULL, B, T, T, &fast));
    mha_kernels_force(&mha_kernels_scalar);
    CHECK_OK(mha_forward(L, y2, NULL, x, NULL, B, T, T, &fast));
    mha_kernels_force(NULL);
    CHECK(memcmp(y1, y2, sizeof(float) * B * T * D) == 0);
    free(x), free(y1), free(y2);
    mha_layer_free(L);
    naive_weights_free(&w);
    mha_context_free(ctx);
}

/* The cache's readers at the same time on one cache: mha_cache_attend
 * (two threads) and mha_cache_clone, each clone then decoding a token of
 * its own (two threads); every result has the bits of the same call made
 * alone beforehand, and the source is never written (its length stays). */
typedef struct {
    mha_cache *c;
    const mha_layer *L;
    const mha_context *ctx;
    const float *q, *x; /* (B, 1, h*d_k) queries; (B, 1, D) a token */
    float *out;         /* (B, 1, h*d_v) z, or (B, 1, D) y of the clone's step */
    int clone, failed;
} reader;

static void *read_cache(void *arg) {
    reader *r = arg;
    for (int it = 0; it < 4 && !r->failed; it++) {
        if (!r->clone) {
            r->failed |= mha_cache_attend(r->c, r->out, r->q, 1, NULL, 0.0f) != MHA_OK;
            continue;
        }
        mha_cache *copy = NULL;
        r->failed |= mha_cache_clone(&copy, r->c) != MHA_OK;
        if (copy) r->failed |= mha_forward_cached_ctx(r->ctx, r->L, copy, r->out, NULL, r->x, 1, NULL, NULL) != MHA_OK;
        mha_cache_free(copy);
    }
    return NULL;
}

static void test_concurrency_cache_readers(void) {
    naive_weights w;
    mha_layer *L = make_layer(21, &w);
    mha_context *ctx = NULL;
    CHECK_OK(mha_context_create(&ctx));
    CHECK_OK(mha_context_set_num_threads(ctx, 1));
    uint64_t seed = 31;
    const int hd = 4 * (D / 4);
    float *x = naive_random_floats((size_t)B * T * D, &seed, -1, 1), *y = naive_alloc_floats((size_t)B * T * D);
    float *q = naive_random_floats((size_t)B * hd, &seed, -1, 1), *tok = naive_random_floats((size_t)B * D, &seed, -1, 1);
    mha_cache *c = NULL;
    if (L) CHECK_OK(mha_cache_create(&c, L, B, T + 8, MHA_CACHE_I8, 0));
    if (c) CHECK_OK(mha_forward_cached_ctx(ctx, L, c, y, NULL, x, T, NULL, NULL));
    reader alone[N_THREADS], together[N_THREADS];
    pthread_t th[N_THREADS];
    for (int i = 0; c && i < N_THREADS; i++) {
        const int clone = i % 2;
        alone[i] = (reader){c, L, ctx, q, tok, naive_alloc_floats((size_t)B * (clone ? D : hd)), clone, 0};
        together[i] = alone[i], together[i].out = naive_alloc_floats((size_t)B * (clone ? D : hd));
        read_cache(&alone[i]);
        CHECK(!alone[i].failed);
    }
    for (int i = 0; c && i < N_THREADS; i++) CHECK_INT(pthread_create(&th[i], NULL, read_cache, &together[i]), 0);
    for (int i = 0; c && i < N_THREADS; i++) pthread_join(th[i], NULL);
    for (int i = 0; c && i < N_THREADS; i++) {
        const size_t n = (size_t)B * (together[i].clone ? D : hd);
        CHECK(!together[i].failed);
        if (memcmp(alone[i].out, together[i].out, sizeof(float) * n))
            test_report(__FILE__, __LINE__, "reader %d (%s): results differ from the call made alone", i,
                        together[i].clone ? "clone + step" : "attend");
        free(alone[i].out), free(together[i].out);
    }
    for (int b = 0; c && b < B; b++) CHECK_INT(mha_cache_length(c, b), T); /* never written */
    mha_cache_free(c), mha_context_free(ctx), mha_layer_free(L), naive_weights_free(&w);
    free(x), free(y), free(q), free(tok);
}

/* ------------------------------------- one call at a time on a cache */

/* mha.h: "A cache is used by one call at a time" by the calls that change
 * it. Threads that broke the rule used to race on the lengths: steps of
 * one token on one cache from eight threads ended at lengths 66-70 of a
 * capacity of 64 (steps that all found room for the last token), and left
 * a cache whose file mha_cache_load refused (the concurrency probe). Now a call
 * that finds the cache busy fails (MHA_E_ARG "another call is ...") and
 * changes nothing: every step that succeeded is in the length, which never
 * passes the capacity, whatever the interleaving. */
#define GUARD_CAP 16
#define GUARD_ROUNDS 100
#define GUARD_THREADS 8

typedef struct {
    const mha_layer *L;
    const mha_context *ctx;
    mha_cache *c;
    const float *tok; /* (B, 1, D) */
    int ok, busy, full, other;
    char other_msg[200];
} stepper;

static void *step_until_full(void *arg) {
    stepper *st = arg;
    float *y = naive_alloc_floats((size_t)B * D);
    while (!st->full && !st->other) {
        if (mha_forward_cached_ctx(st->ctx, st->L, st->c, y, NULL, st->tok, 1, NULL, NULL) == MHA_OK) st->ok++;
        else if (strstr(mha_last_error(), "another call is")) st->busy++;
        else if (strstr(mha_last_error(), "exceed the capacity")) st->full = 1;
        else st->other = 1, snprintf(st->other_msg, sizeof st->other_msg, "%s", mha_last_error());
    }
    free(y);
    return NULL;
}

static void test_concurrency_cache_one_call_at_a_time(void) {
    naive_weights w;
    mha_layer *L = make_layer(23, &w);
    mha_context *ctx = NULL;
    CHECK_OK(mha_context_create(&ctx));
    CHECK_OK(mha_context_set_num_threads(ctx, 1));
    uint64_t seed = 41;
    float *tok = naive_random_floats((size_t)B * D, &seed, -1, 1);
    mha_cache *c = NULL;
    if (L) CHECK_OK(mha_cache_create(&c, L, B, GUARD_CAP, MHA_CACHE_F32, 0));
    int busy = 0;
    for (int round = 0; c && round < GUARD_ROUNDS; round++) {
        CHECK_OK(mha_cache_reset(c, -1));
        stepper st[GUARD_THREADS];
        pthread_t th[GUARD_THREADS];
        for (int i = 0; i < GUARD_THREADS; i++) {
            st[i] = (stepper){.L = L, .ctx = ctx, .c = c, .tok = tok};
            CHECK_INT(pthread_create(&th[i], NULL, step_until_full, &st[i]), 0);
        }
        int ok = 0;
        for (int i = 0; i < GUARD_THREADS; i++) {
            pthread_join(th[i], NULL);
            ok += st[i].ok, busy += st[i].busy;
            if (st[i].other) test_report(__FILE__, __LINE__, "round %d thread %d: '%s'", round, i, st[i].other_msg);
        }
        for (int b = 0; b < B; b++)
            if (mha_cache_length(c, b) != ok || ok != GUARD_CAP) {
                test_report(__FILE__, __LINE__, "round %d: sequence %d holds %d tokens after %d steps succeeded; "
                            "expected both %d (the capacity)", round, b, mha_cache_length(c, b), ok, GUARD_CAP);
                round = GUARD_ROUNDS;
                break;
            }
    }
    (void)busy; /* how often a step found another running: any number passes */
    mha_cache_free(c), mha_context_free(ctx), mha_layer_free(L), naive_weights_free(&w);
    free(tok);
}

/* The same rule without a race to wait for: a cache held by a call that
 * changes it (mha_cache_begin, what every such entry does first) refuses
 * every other call, readers too, and is left as it was; held by a reader
 * it refuses the calls that change it and serves the other readers; let
 * go, it serves all again. */
static void test_concurrency_cache_busy_refusals(void) {
    naive_weights w;
    mha_layer *L = make_layer(24, &w);
    uint64_t seed = 43;
    const int hd = 4 * (D / 4), kvd = 2 * (D / 4);
    float *x = naive_random_floats((size_t)B * T * D, &seed, -1, 1), *y = naive_alloc_floats((size_t)B * T * D);
    float *q = naive_random_floats((size_t)B * hd, &seed, -1, 1), *z = naive_alloc_floats((size_t)B * hd);
    float *k = naive_random_floats((size_t)B * kvd, &seed, -1, 1), *v = naive_random_floats((size_t)B * kvd, &seed, -1, 1);
    mha_cache *c = NULL, *copy = NULL;
    mha_cache_info info;
    const int perm[4] = {0, 1, 2, 3}, src[B] = {1, 0}, keep[1] = {0};
    char path[64];
    snprintf(path, sizeof path, "/tmp/mha_guard_%d.safetensors", (int)getpid());
    if (L) CHECK_OK(mha_cache_create(&c, L, B, T + 8, MHA_CACHE_F16, 0));
    if (c) CHECK_OK(mha_forward_cached(L, c, y, NULL, x, T, NULL, NULL));
    for (int holder = 1; c && holder >= 0; holder--) { /* 1: a call that changes it; 0: a reader */
        CHECK_OK(mha_cache_begin(c, holder, "test"));
        const char *want = holder ? "another call is changing this cache" : "another call is reading this cache";
#define REFUSED(call)                                                                                          \
    do {                                                                                                       \
        CHECK_STATUS(call, MHA_E_ARG);                                                                         \
        if (!strstr(mha_last_error(), want)) test_report(__FILE__, __LINE__, "%s: '%s'", #call, mha_last_error()); \
    } while (0)
        REFUSED(mha_forward_cached(L, c, y, NULL, x, 1, NULL, NULL));
        REFUSED(mha_cache_append(c, k, v, 1, NULL));
        REFUSED(mha_cache_reset(c, -1));
        REFUSED(mha_cache_truncate(c, 0, 1));
        REFUSED(mha_cache_compact(c, 0, 0, keep, 1));
        REFUSED(mha_cache_permute_heads(c, perm));
        REFUSED(mha_cache_reorder(c, src));
        if (holder) {
            REFUSED(mha_cache_attend(c, z, q, 1, NULL, 0.0f));
            REFUSED(mha_cache_clone(&copy, c));
            REFUSED(mha_cache_get_info(c, &info));
            REFUSED(mha_cache_save(c, path));
        } else {
            CHECK_OK(mha_cache_attend(c, z, q, 1, NULL, 0.0f));
            CHECK_OK(mha_cache_clone(&copy, c));
            CHECK_OK(mha_cache_get_info(c, &info));
            CHECK_OK(mha_cache_save(c, path));
            if (copy) CHECK_OK(mha_forward_cached(L, copy, y, NULL, x, 1, NULL, NULL)); /* a clone starts free */
            mha_cache_free(copy);
            copy = NULL;
        }
#undef REFUSED
        CHECK(copy == NULL);
        for (int b = 0; b < B; b++) CHECK_INT(mha_cache_length(c, b), T); /* nothing was done */
        mha_cache_end(c, holder, MHA_OK);
    }
    if (c) { /* free again: every call serves */
        CHECK_OK(mha_cache_attend(c, z, q, 1, NULL, 0.0f));
        CHECK_OK(mha_forward_cached(L, c, y, NULL, x, 1, NULL, NULL));
        CHECK_OK(mha_cache_reset(c, -1));
    }
    remove(path);
    mha_cache_free(c), mha_layer_free(L), naive_weights_free(&w);
    free(x), free(y), free(q), free(z), free(k), free(v);
}


/* ------------------------------------------ changes of a layer alone */

/* mha.h: set_weights, set_labels, the permutations and convert_weights
 * need the layer alone. One made while forwards ran freed the packed
 * weights under them (AddressSanitizer: heap-use-after-free in the GEMM;
 * the concurrency probe) or mixed two sets of weights in one result. Now
 * the call that finds the layer busy fails (MHA_E_ARG "another call is
 * ...") and does nothing: while the main thread sets weights A and B in
 * turn, every forward that succeeds gives exactly A's bits or B's. */
#define LAYER_GUARD_FORWARDS 300 /* per thread, each tried while weights change */

typedef struct {
    const mha_layer *L;
    const mha_context *ctx;
    const float *x, *ya, *yb; /* (B, T, D) input and the two answers */
    int *running; /* threads still forwarding (atomic) */
    int ok, busy, mixed, other;
    char other_msg[200];
} forwarder;

static void *forward_until_stopped(void *arg) {
    forwarder *f = arg;
    float *y = naive_alloc_floats((size_t)B * T * D);
    mha_options o = mha_options_default();
    o.path = MHA_PATH_FAST;
    for (int it = 0; it < LAYER_GUARD_FORWARDS && !f->other; it++) {
        if (mha_forward_ctx(f->ctx, f->L, y, NULL, f->x, NULL, NULL, B, T, T, &o) == MHA_OK) {
            f->ok++;
            f->mixed += memcmp(y, f->ya, sizeof(float) * B * T * D) && memcmp(y, f->yb, sizeof(float) * B * T * D);
        } else if (strstr(mha_last_error(), "another call is")) f->busy++;
        else f->other = 1, snprintf(f->other_msg, sizeof f->other_msg, "%s", mha_last_error());
    }
    __atomic_sub_fetch(f->running, 1, __ATOMIC_RELEASE);
    free(y);
    return NULL;
}

static void test_concurrency_layer_changes_alone(void) {
    naive_weights wa, wb;
    mha_layer *L = make_layer(25, &wa), *LB = make_layer(26, &wb);
    mha_context *ctx = NULL;
    CHECK_OK(mha_context_create(&ctx));
    CHECK_OK(mha_context_set_num_threads(ctx, 1));
    uint64_t seed = 47;
    float *x = naive_random_floats((size_t)B * T * D, &seed, -1, 1);
    float *ya = naive_alloc_floats((size_t)B * T * D), *yb = naive_alloc_floats((size_t)B * T * D);
    mha_options o = mha_options_default();
    o.path = MHA_PATH_FAST;
    if (!L || !LB) goto done;
    CHECK_OK(mha_forward_ctx(ctx, L, ya, NULL, x, NULL, NULL, B, T, T, &o));
    CHECK_OK(mha_forward_ctx(ctx, LB, yb, NULL, x, NULL, NULL, B, T, T, &o));
    const mha_weights views[2] = {naive_weights_view(&wa), naive_weights_view(&wb)};
    int running = N_THREADS, changed = 0, refused = 0;
    forwarder f[N_THREADS];
    pthread_t th[N_THREADS];
    for (int i = 0; i < N_THREADS; i++) {
        f[i] = (forwarder){.L = L, .ctx = ctx, .x = x, .ya = ya, .yb = yb, .running = &running};
        CHECK_INT(pthread_create(&th[i], NULL, forward_until_stopped, &f[i]), 0);
    }
    for (int k = 0; __atomic_load_n(&running, __ATOMIC_ACQUIRE) > 0; k++) {
        const mha_status s = mha_layer_set_weights(L, &views[(k + 1) % 2]);
        if (s == MHA_OK) changed++;
        else if (strstr(mha_last_error(), "another call is")) refused++;
        else test_report(__FILE__, __LINE__, "set_weights: '%s'", mha_last_error());
    }
    int ok = 0, mixed = 0;
    for (int i = 0; i < N_THREADS; i++) {
        pthread_join(th[i], NULL);
        ok += f[i].ok, mixed += f[i].mixed;
        if (f[i].other) test_report(__FILE__, __LINE__, "thread %d: '%s'", i, f[i].other_msg);
    }
    if (mixed)
        test_report(__FILE__, __LINE__, "%d of %d forwards gave neither weights' result (%d changes made, %d refused)",
                    mixed, ok, changed, refused);
done:
    mha_context_free(ctx), mha_layer_free(L), mha_layer_free(LB);
    naive_weights_free(&wa), naive_weights_free(&wb);
    free(x), free(ya), free(yb);
}

/* Without a race to wait for: a layer held by a change refuses every
 * checked call; held by a forward it refuses the changes and serves the
 * other readers; let go, it serves all. */
static void test_concurrency_layer_busy_refusals(void) {
    char path[64];
    snprintf(path, sizeof path, "/tmp/mha_busy_%d.safetensors", (int)getpid());
    naive_weights w;
    mha_layer *L = make_layer(27, &w);
    uint64_t seed = 53;
    float *x = naive_random_floats((size_t)B * T * D, &seed, -1, 1), *y = naive_alloc_floats((size_t)B * T * D);
    const int perm[4] = {2, 3, 0, 1}, kv_perm[2] = {1, 0};
    int labels[4];
    mha_cache *c = NULL;
    if (L) CHECK_OK(mha_cache_create(&c, L, B, T + 1, MHA_CACHE_F32, 0));
    const mha_weights view = naive_weights_view(&w);
    for (int holder = 1; c && holder >= 0; holder--) { /* 1: a change; 0: a reader */
        CHECK_OK(mha_layer_begin(L, holder, "test"));
        const char *want = holder ? "another call is changing this layer" : "another call is using this layer";
#define REFUSED(call)                                                                                          \
    do {                                                                                                       \
        CHECK_STATUS(call, MHA_E_ARG);                                                                         \
        if (!strstr(mha_last_error(), want)) test_report(__FILE__, __LINE__, "%s: '%s'", #call, mha_last_error()); \
    } while (0)
        REFUSED(mha_layer_set_weights(L, &view));
        REFUSED(mha_layer_set_labels(L, MHA_BLOCK_K, kv_perm));
        REFUSED(mha_layer_permute_heads(L, perm));
        REFUSED(mha_layer_permute_block(L, MHA_BLOCK_O, perm));
        REFUSED(mha_layer_convert_weights(L, MHA_W_BF16));
        if (holder) {
            REFUSED(mha_forward(L, y, NULL, x, NULL, B, T, T, NULL));
            REFUSED(mha_forward_cached(L, c, y, NULL, x, T, NULL, NULL));
            REFUSED(mha_layer_labels(L, MHA_BLOCK_Q, labels));
            REFUSED(mha_layer_check_contract(L, x, NULL, B, T, T, NULL, NULL));
            /* a save would copy a change half done: refused before it reads
             * a weight (not later, at the labels it reads last) */
            mha_tensors *t = NULL;
            REFUSED(mha_layer_to_tensors(&t, L));
            CHECK(t == NULL && strncmp(mha_last_error(), "mha_layer_to_tensors: ", 22) == 0);
            REFUSED(mha_layer_save(L, path));
            CHECK(strncmp(mha_last_error(), "mha_layer_to_tensors: ", 22) == 0);
            mha_cache *c2 = NULL; /* it takes the kv head labels a permutation rewrites */
            REFUSED(mha_cache_create(&c2, L, B, T, MHA_CACHE_F16, 0));
            CHECK(c2 == NULL);
        } else {
            CHECK_OK(mha_forward(L, y, NULL, x, NULL, B, T, T, NULL));
            CHECK_OK(mha_forward_cached(L, c, y, NULL, x, T, NULL, NULL));
            CHECK_OK(mha_layer_labels(L, MHA_BLOCK_Q, labels));
            CHECK_OK(mha_layer_check_contract(L, x, NULL, B, T, T, NULL, NULL)); /* readers nest: it runs a forward */
            CHECK_OK(mha_layer_save(L, path)); /* a reader: its labels are read inside */
            mha_cache *c2 = NULL;
            CHECK_OK(mha_cache_create(&c2, L, B, T, MHA_CACHE_F16, 0));
            mha_cache_free(c2);
        }
#undef REFUSED
        CHECK(mha_layer_weights_dtype(L) == MHA_W_F32); /* nothing was done */
        mha_layer_end(L, holder, MHA_OK);
    }
    if (c) { /* free again: the changes run */
        CHECK_OK(mha_layer_permute_heads(L, perm));
        CHECK_OK(mha_layer_set_weights(L, &view));
        CHECK_OK(mha_forward(L, y, NULL, x, NULL, B, T, T, NULL));
    }
    mha_cache_free(c), mha_layer_free(L), naive_weights_free(&w);
    free(x), free(y);
    remove(path);
}

static const test_case cases[] = {
    {"concurrency_one_layer", test_concurrency_one_layer},
    {"concurrency_cache_readers", test_concurrency_cache_readers},
    {"concurrency_two_layers", test_concurrency_two_layers},
    {"concurrency_cache_one_call_at_a_time", test_concurrency_cache_one_call_at_a_time},
    {"concurrency_cache_busy_refusals", test_concurrency_cache_busy_refusals},
    {"concurrency_layer_changes_alone", test_concurrency_layer_changes_alone},
    {"concurrency_layer_busy_refusals", test_concurrency_layer_busy_refusals},
    {"kernels_env_every_path", test_kernels_env_every_path},
    {"kernels_context", test_kernels_context},
};

const test_case *tests_concurrency(size_t *count) {
    *count = sizeof cases / sizeof cases[0];
    return cases;
}
