/* test_compact_shapes.c — compact storage (bf16 / int8 projection weights,
 * fp16 / int8 / mixed KV caches) on awkward shapes, through the whole
 * stack: d_model, d_k, d_v and kv widths that are not multiples of 8, 16
 * or 32 (int8 groups of 32 inputs that end early, W_O's groups restarting
 * at each head's d_v rows, a group straddling the stream's 256-row
 * blocks), d_k != d_v, GQA (h/h_kv = 3), MQA, gated layers (W_G), bias
 * on and off.
 *
 * Oracles: an fp32 layer built from the values the converted layer shows
 * (mha_layer_get_weights), themselves checked bit for bit against a
 * quantization computed from the math of mha.h (tests/naive.c's
 * naive_round_bf16 / naive_round_int8: frexp / floor, no library code);
 * the reference path. What must hold (docs/WEIGHTS.md):
 *  - reference and prefill of the converted layer: the fp32 layer's bits;
 *  - bf16 decode one row a step: the fp32 layer's bits, whatever the
 *    cache type (the K/V appended are the same bits);
 *  - int8 decode: max|dec - ref| <= 2 max|dec32 - ref| + 1e-6, a tolerance
 *    below 1/20 of the quantization's effect;
 *  - a batched, ragged step (rows of several sequences, up to 16 rows
 *    streamed) gives each sequence the bits of its own run, on 1 and 2
 *    threads alike;
 *  - permutations, save / load and cache operations keep all of this.
 * Legend: D d_model, h, h_kv heads, dk, dv head widths. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "compute/exec.h"
#include "naive.h"
#include "test_util.h"
#include "tests.h"

typedef struct {
    int D, h, hkv, dk, dv, bias, gate;
} cshape;

/* Every feature once, none of the widths a multiple of 8 where avoidable. */
static const cshape SHAPES[] = {
    {35, 5, 5, 7, 7, 1, 0},    /* MHA: 35 = 32 + 3 inputs per group pair */
    {50, 6, 2, 5, 3, 1, 1},    /* GQA 3 per kv head, d_k != d_v, gated   */
    {35, 3, 1, 33, 40, 0, 1},  /* MQA, kv widths 33 and 40, no bias      */
    {70, 2, 2, 100, 72, 1, 0}, /* W_O segments of 72 rows: 32 + 32 + 8   */
    {40, 3, 3, 96, 100, 1, 1}, /* W_O 300 rows: group 232..263 crosses 256 */
    {33, 1, 1, 1, 1, 1, 0},    /* d_head 1                               */
};
#define N_SHAPES ((int)(sizeof SHAPES / sizeof SHAPES[0]))

/* ------------------------------------------------------------- fixtures */

typedef struct {
    mha_config c;
    naive_weights w;
    mha_layer *conv, *exact; /* converted; fp32 of the converted values */
} cfix;

static mha_config shape_config(const cshape *s) {
    mha_config c = naive_config(s->D, s->h, s->hkv, s->dk, s->dv, s->bias);
    c.output_gate = s->gate;
    return naive_resolve(c);
}

static int mat_rows(const mha_config *c, int m) {
    const int r[5] = {c->d_model, c->d_kv_in, c->d_v_in, c->n_heads * c->d_v, c->d_model};
    return r[m];
}
static int mat_cols(const mha_config *c, int m) {
    const int n[5] = {c->n_heads * c->d_k, c->n_kv_heads * c->d_k, c->n_kv_heads * c->d_v, c->d_model,
                      c->n_heads * c->d_v};
    return n[m];
}

/* The converted layer's stored values are the quantizer's, bit for bit
 * (W_G too); exact is an fp32 layer of them. */
static void cfix_make(cfix *f, const cshape *s, mha_weight_dtype dt, uint64_t seed) {
    f->c = shape_config(s);
    naive_weights_random(&f->w, &f->c, &seed, 0.3f);
    for (int j = 0; j < f->c.n_heads * f->c.d_k; j++) f->w.w_q[3 * f->c.n_heads * f->c.d_k + j] *= 8.0f; /* a large row */
    f->conv = naive_make_layer(&f->w);
    CHECK_OK(mha_layer_convert_weights(f->conv, dt));
    mha_weights v;
    mha_layer_get_weights(f->conv, &v);
    const float *orig[5] = {f->w.w_q, f->w.w_k, f->w.w_v, f->w.w_o, f->w.w_g};
    const float *got[5] = {v.w_q, v.w_k, v.w_v, v.w_o, v.w_g};
    for (int m = 0; m < 5; m++) {
        if (m == 4 && !f->c.output_gate) continue;
        const int K = mat_rows(&f->c, m), N = mat_cols(&f->c, m);
        float *want = naive_alloc_floats((size_t)K * N);
        memcpy(want, orig[m], sizeof(float) * K * N);
        if (dt == MHA_W_I8) naive_round_int8(want, K, N, m == 3 ? f->c.d_v : K);
        else
            for (size_t e = 0; e < (size_t)K * N; e++) want[e] = naive_round_bf16(want[e]);
        char what[64];
        snprintf(what, sizeof what, "%s matrix %d of D=%d dk=%d dv=%d", mha_weight_dtype_name(dt), m, f->c.d_model,
                 f->c.d_k, f->c.d_v);
        CHECK_SAME_BITS(got[m], want, (size_t)K * N, what);
        free(want);
    }
    f->exact = NULL;
    CHECK_OK(mha_layer_create(&f->exact, &f->c, &v));
}

static void cfix_free(cfix *f) {
    mha_layer_free(f->conv), mha_layer_free(f->exact);
    naive_weights_free(&f->w);
}

/* ------------------------------------------------ reference and prefill */

static void test_paths(void) {
    for (int si = 0; si < N_SHAPES; si++)
        for (int dt = MHA_W_BF16; dt <= MHA_W_I8; dt++) {
            cfix f;
            cfix_make(&f, &SHAPES[si], (mha_weight_dtype)dt, 100 + (uint64_t)si);
            uint64_t seed = 7;
            const int B = 2, T = 19, D = f.c.d_model; /* 38 rows: the packed GEMM's tiles and tails */
            float *x = naive_random_floats((size_t)B * T * D, &seed, -1.0f, 1.0f);
            for (int p = MHA_PATH_REFERENCE; p <= MHA_PATH_FAST; p++) {
                float *a = test_causal_forward(f.conv, x, B, T, (mha_path)p);
                float *b = test_causal_forward(f.exact, x, B, T, (mha_path)p);
                CHECK_SAME_BITS(a, b, (size_t)B * T * D, p == MHA_PATH_FAST ? "fast path" : "reference");
                free(a), free(b);
            }
            free(x);
            cfix_free(&f);
        }
}

/* ---------------------------------------------------------------- decode */

/* A cache script: per call T rows and each sequence's n_new. */
typedef struct {
    int T, n[3];
} cstep;

/* y of every call, concatenated (B, T, D) per call; x likewise. */
static float *run_script(const mha_layer *L, int B, const cstep *sc, int ns, const float *x, mha_cache_dtype kt,
                         mha_cache_dtype vt, size_t *count) {
    const int D = mha_layer_config(L)->d_model;
    size_t total = 0;
    for (int s = 0; s < ns; s++) total += (size_t)B * sc[s].T * D;
    float *y = naive_alloc_floats(total);
    mha_cache *c = NULL;
    CHECK_OK(mha_cache_create_kv(&c, L, B, 32, kt, vt, 0));
    for (size_t s = 0, at = 0; c && s < (size_t)ns; at += (size_t)B * sc[s].T * D, s++)
        CHECK_OK(mha_forward_cached(L, c, y + at, NULL, x + at, sc[s].T, sc[s].n, NULL));
    mha_cache_free(c);
    *count = total;
    return y;
}

static const mha_cache_dtype KT[4] = {MHA_CACHE_F32, MHA_CACHE_F16, MHA_CACHE_I8, MHA_CACHE_I8};
static const mha_cache_dtype VT[4] = {MHA_CACHE_F32, MHA_CACHE_F16, MHA_CACHE_I8, MHA_CACHE_F16};

/* One row a step (B = 1): bf16 gives the fp32 layer's bits in every cache
 * type; int8 the tolerance rule against the reference (fp32 cache), far
 * below the quantization's effect. */
static void one_row_steps(const cfix *f, mha_weight_dtype dt, const float *x) {
    enum { T = 9 };
    const int D = f->c.d_model;
    cstep sc[T];
    for (int t = 0; t < T; t++) sc[t] = (cstep){1, {1, 0, 0}};
    for (int ci = 0; ci < 4; ci++) {
        size_t n;
        float *a = run_script(f->conv, 1, sc, T, x, KT[ci], VT[ci], &n), *b = run_script(f->exact, 1, sc, T, x, KT[ci], VT[ci], &n);
        if (dt == MHA_W_BF16) CHECK_SAME_BITS(a, b, n, "bf16 one-row decode vs the fp32 layer's");
        if (dt == MHA_W_I8 && ci == 0) {
            float *ref = test_causal_forward(f->exact, x, 1, T, MHA_PATH_REFERENCE);
            mha_layer *orig = naive_make_layer(&f->w);
            float *y32 = test_causal_forward(orig, x, 1, T, MHA_PATH_REFERENCE);
            const double err = test_max_abs_diff(a, ref, n), tol = 2 * test_max_abs_diff(b, ref, n) + 1e-6;
            const double effect = test_max_abs_diff(y32, ref, n);
            if (!(err <= tol && tol < effect / 20))
                test_report(__FILE__, __LINE__, "int8 decode D=%d dk=%d dv=%d: max|dec - ref| = %.3g, tol %.3g, "
                            "quantization effect %.3g", D, f->c.d_k, f->c.d_v, err, tol, effect);
            free(ref), free(y32);
            mha_layer_free(orig);
        }
        free(a), free(b);
    }
}

/* Three sequences, ragged: each sequence's rows are the bits of its own
 * run (its rows alone, the same calls); with cache type `threaded` also
 * on 2 threads (threads even for these small calls) against 1. */
static void ragged_steps(const cfix *f, const float *x, int threaded) {
    static const cstep sc[5] = {{5, {5, 0, 3}}, {1, {1, 1, 1}}, {2, {2, 1, 0}}, {4, {1, 4, 2}}, {1, {1, 1, 1}}};
    const int D = f->c.d_model;
    for (int ci = 0; ci < 4; ci++) {
        size_t n;
        mha_set_num_threads(1);
        float *one = run_script(f->conv, 3, sc, 5, x, KT[ci], VT[ci], &n);
        if (ci == threaded) {
            mha_decode_set_min_parallel_work(0.0);
            mha_set_num_threads(2);
            float *two = run_script(f->conv, 3, sc, 5, x, KT[ci], VT[ci], &n);
            mha_decode_set_min_parallel_work(262144.0);
            CHECK_SAME_BITS(one, two, n, "ragged steps on 1 vs 2 threads");
            free(two);
        }
        for (int b = 0; b < 3; b++) { /* sequence b alone: its rows of every call */
            float *xs = naive_alloc_floats(n);
            cstep s1[5];
            size_t at = 0, at1 = 0;
            for (int s = 0; s < 5; s++) {
                s1[s] = (cstep){sc[s].T, {sc[s].n[b], 0, 0}};
                memcpy(xs + at1, x + at + (size_t)b * sc[s].T * D, sizeof(float) * sc[s].T * D);
                at += (size_t)3 * sc[s].T * D, at1 += (size_t)sc[s].T * D;
            }
            size_t n1;
            float *alone = run_script(f->conv, 1, s1, 5, xs, KT[ci], VT[ci], &n1);
            at = at1 = 0;
            for (int s = 0; s < 5; s++) {
                CHECK_SAME_BITS(one + at + (size_t)b * sc[s].T * D, alone + at1, (size_t)sc[s].T * D,
                          "a sequence's rows in a ragged batch vs alone");
                at += (size_t)3 * sc[s].T * D, at1 += (size_t)sc[s].T * D;
            }
            free(xs), free(alone);
        }
        mha_set_num_threads(0);
        free(one);
    }
}

static void test_decode(void) {
    for (int si = 0; si < N_SHAPES; si++)
        for (int dt = MHA_W_BF16; dt <= MHA_W_I8; dt++) {
            cfix f;
            cfix_make(&f, &SHAPES[si], (mha_weight_dtype)dt, 200 + (uint64_t)si);
            uint64_t seed = 9;
            float *x = naive_random_floats((size_t)3 * 13 * f.c.d_model, &seed, -1.0f, 1.0f);
            one_row_steps(&f, (mha_weight_dtype)dt, x);
            ragged_steps(&f, x, si % 4);
            free(x);
            cfix_free(&f);
        }
}

/* --------------------------------------------------------- cache ops */

/* y (B=2, D) of one step of x rows */
static void step(const mha_layer *L, mha_cache *c, float *y, const float *x) {
    CHECK_OK(mha_forward_cached(L, c, y, NULL, x, 1, NULL, NULL));
}

/* The same operations on caches of the converted and the fp32 layer, one
 * row a step: a ring window wrapping, a truncate inside it, a beam
 * reorder with a repeat, the layers' and caches' heads permuted. bf16:
 * the same bits throughout (the stream of bf16 weights is the fp32
 * stream's); int8: within fp32 rounding of the fp32 layer's steps. */
static void test_cache_ops(void) {
    for (int si = 1; si < N_SHAPES; si += 2) /* GQA gated, d_v 72, d_v 100 */
        for (int dt = MHA_W_BF16; dt <= MHA_W_I8; dt++)
            for (int ci = 0; ci < 4; ci += dt == MHA_W_BF16 ? 1 : 4) {
                cfix f;
                cfix_make(&f, &SHAPES[si], (mha_weight_dtype)dt, 300 + (uint64_t)si);
                const int D = f.c.d_model, h = f.c.n_heads, rep = h / f.c.n_kv_heads;
                uint64_t seed = 11;
                float *x = naive_random_floats((size_t)2 * 16 * D, &seed, -1.0f, 1.0f);
                float *y[2] = {naive_alloc_floats((size_t)2 * D), naive_alloc_floats((size_t)2 * D)};
                mha_layer *L[2] = {f.conv, f.exact};
                mha_cache *c[2] = {NULL, NULL};
                double worst = 0.0, ymax = 0.0;
                for (int k = 0; k < 2; k++) CHECK_OK(mha_cache_create_kv(&c[k], L[k], 2, 8, KT[ci], VT[ci], 5));
                for (int t = 0; c[0] && c[1] && t < 16; t++) {
                    for (int k = 0; k < 2; k++) {
                        if (t == 9) CHECK_OK(mha_cache_truncate(c[k], 1, 7));
                        if (t == 11) CHECK_OK(mha_cache_reorder(c[k], (const int[]){1, 1}));
                        if (t == 13) { /* kv groups rotated, heads reversed inside each */
                            int perm[16];
                            for (int i = 0; i < h; i++)
                                perm[i] = ((i / rep + 1) % f.c.n_kv_heads) * rep + rep - 1 - i % rep;
                            CHECK_OK(mha_layer_permute_heads(L[k], perm));
                            CHECK_OK(mha_cache_permute_heads(c[k], perm));
                        }
                        step(L[k], c[k], y[k], x + (size_t)t * 2 * D);
                    }
                    if (dt == MHA_W_BF16) CHECK_SAME_BITS(y[0], y[1], (size_t)2 * D, "bf16 cache ops vs the fp32 layer");
                    worst = fmax(worst, test_max_abs_diff(y[0], y[1], (size_t)2 * D));
                    for (int e = 0; e < 2 * D; e++) ymax = fmax(ymax, fabs(y[1][e]));
                }
                if (!(worst <= 1e-5 * (1.0 + ymax)))
                    test_report(__FILE__, __LINE__, "int8 cache ops: max|conv - fp32| = %.3g (max|y| %.3g)", worst, ymax);
                for (int k = 0; k < 2; k++) mha_cache_free(c[k]);
                free(x), free(y[0]), free(y[1]);
                cfix_free(&f);
            }
}

/* Cross-attention memory of a converted layer whose key and value
 * sources have widths of their own (d_kv_in 70, d_v_in 50): against the
 * reference of the fp32 layer with the memory's padding as key_keep.
 * bf16: the fp32 layer's cached bits; int8: the tolerance rule. */
static void test_cross(void) {
    for (int dt = MHA_W_BF16; dt <= MHA_W_I8; dt++) {
        mha_config c = naive_config(35, 6, 2, 5, 33, 1);
        c.d_kv_in = 70, c.d_v_in = 50;
        c = naive_resolve(c);
        naive_weights w;
        uint64_t seed = 401;
        naive_weights_random(&w, &c, &seed, 0.3f);
        mha_layer *conv = naive_make_layer(&w), *exact = NULL;
        CHECK_OK(mha_layer_convert_weights(conv, (mha_weight_dtype)dt));
        mha_weights v;
        mha_layer_get_weights(conv, &v);
        CHECK_OK(mha_layer_create(&exact, &c, &v));
        enum { B = 2, S = 7, T = 3 };
        const int D = 35, len[B] = {7, 4};
        float *kv = naive_random_floats((size_t)B * S * 70, &seed, -1, 1), *vs = naive_random_floats((size_t)B * S * 50, &seed, -1, 1);
        float *x = naive_random_floats((size_t)B * T * D, &seed, -1, 1), *ref = naive_alloc_floats((size_t)B * T * D);
        uint8_t keep[B * S];
        for (int e = 0; e < B * S; e++) keep[e] = e % S < len[e / S];
        mha_options o = naive_ref_options();
        o.key_keep = keep;
        CHECK_OK(mha_forward_kv(exact, ref, NULL, x, kv, vs, B, T, S, &o));
        float *y[2];
        mha_layer *L[2] = {conv, exact};
        for (int k = 0; k < 2; k++) {
            mha_cache *m = NULL;
            y[k] = naive_alloc_floats((size_t)B * T * D);
            float *xs = naive_alloc_floats((size_t)B * D), *ys = naive_alloc_floats((size_t)B * D);
            CHECK_OK(mha_cache_create_cross(&m, L[k], B, 8, MHA_CACHE_F32, MHA_CACHE_F32));
            CHECK_OK(mha_cache_set_memory(m, L[k], kv, vs, S, len));
            for (int t = 0; m && t < T; t++) { /* one query a step: the streams */
                for (int b = 0; b < B; b++) memcpy(xs + b * D, x + ((size_t)b * T + t) * D, sizeof(float) * D);
                CHECK_OK(mha_forward_cached(L[k], m, ys, NULL, xs, 1, NULL, NULL));
                for (int b = 0; b < B; b++) memcpy(y[k] + ((size_t)b * T + t) * D, ys + b * D, sizeof(float) * D);
            }
            mha_cache_free(m), free(xs), free(ys);
        }
        const size_t n = (size_t)B * T * D;
        if (dt == MHA_W_BF16) CHECK_SAME_BITS(y[0], y[1], n, "bf16 cross memory vs the fp32 layer");
        const double err = test_max_abs_diff(y[0], ref, n), tol = 2 * test_max_abs_diff(y[1], ref, n) + 1e-6;
        if (!(err <= tol)) test_report(__FILE__, __LINE__, "%s cross: max|y - ref| = %.3g > %.3g",
                                       mha_weight_dtype_name((mha_weight_dtype)dt), err, tol);
        free(kv), free(vs), free(x), free(ref), free(y[0]), free(y[1]);
        mha_layer_free(conv), mha_layer_free(exact), naive_weights_free(&w);
    }
}

const test_case *tests_compact_shapes_isa(size_t *count) {
    static const test_case cases[] = {
        {"compact_shapes_paths", test_paths},
        {"compact_shapes_decode", test_decode},
        {"compact_shapes_cache_ops", test_cache_ops},
        {"compact_shapes_cross", test_cross},
    };
    *count = sizeof cases / sizeof cases[0];
    return cases;
}

/* ------------------------------------------- permutations and files */

static const char *const STORED[10] = {"w_q", "w_k", "w_v", "w_o", "w_g",
                                       "w_q_scale", "w_k_scale", "w_v_scale", "w_o_scale", "w_g_scale"};

/* dst = src with column blocks (cols per block, n blocks, rows rows) or
 * row blocks (rows per block) moved: new block i = old block perm[i]. */
static void move_blocks(float *dst, const float *src, int rows, int cols, int n, const int *perm, int by_rows) {
    if (by_rows) {
        const int br = rows / n;
        for (int i = 0; i < n; i++)
            memcpy(dst + (size_t)i * br * cols, src + (size_t)perm[i] * br * cols, sizeof(float) * br * cols);
        return;
    }
    const int bc = cols / n;
    for (int r = 0; r < rows; r++)
        for (int i = 0; i < n; i++)
            memcpy(dst + (size_t)r * cols + (size_t)i * bc, src + (size_t)r * cols + (size_t)perm[i] * bc,
                   sizeof(float) * bc);
}

/* The stored tensors of L (as mha_layer_to_tensors writes them: bf16
 * values, or int8 codes and their scales) equal those of `before` with
 * the heads moved by perm (kv heads by kvp). */
static void stored_moved(const mha_layer *L, const mha_layer *before, const int *perm, const int *kvp,
                         const char *what) {
    mha_tensors *a = NULL, *b = NULL;
    CHECK_OK(mha_layer_to_tensors(&a, L));
    CHECK_OK(mha_layer_to_tensors(&b, before));
    const mha_config *c = mha_layer_config(L);
    for (int i = 0; a && b && i < 10; i++) {
        const mha_array *x = mha_tensors_get(a, STORED[i]), *y = mha_tensors_get(b, STORED[i]);
        if (!x && !y) continue;
        if (!x || !y || x->count != y->count || x->dtype != y->dtype || x->rank != 2) {
            test_report(__FILE__, __LINE__, "%s: tensor %s missing or of another form", what, STORED[i]);
            continue;
        }
        const int m = i % 5, kv = m == 1 || m == 2, n = kv ? c->n_kv_heads : c->n_heads;
        float *want = naive_alloc_floats(y->count);
        move_blocks(want, y->f, y->shape[0], y->shape[1], n, kv ? kvp : perm, m == 3);
        char msg[96];
        snprintf(msg, sizeof msg, "%s: %s", what, STORED[i]);
        CHECK_SAME_BITS(x->f, want, x->count, msg);
        free(want);
    }
    mha_tensors_free(a), mha_tensors_free(b);
}

static float *decode_rows(const mha_layer *L, const float *x, int T) {
    const int D = mha_layer_config(L)->d_model;
    float *y = naive_alloc_floats((size_t)T * D);
    mha_cache *c = NULL;
    CHECK_OK(mha_cache_create(&c, L, 1, T, MHA_CACHE_F32, 0));
    for (int t = 0; c && t < T; t++) CHECK_OK(mha_forward_cached(L, c, y + (size_t)t * D, NULL, x + (size_t)t * D, 1, NULL, NULL));
    mha_cache_free(c);
    return y;
}

/* Head permutations move the compact form with the fp32 one (int8 scales
 * with their columns, W_O's per-head groups with its rows); the inverse
 * and one-sided moves and back restore it; decode after the permutation
 * is the unpermuted decode to fp32 rounding; a saved and loaded layer
 * holds the same tensors and decodes to the bit. */
static void test_permute_and_files(void) {
    for (int si = 0; si < N_SHAPES; si++)
        for (int dt = MHA_W_BF16; dt <= MHA_W_I8; dt++) {
            cfix f;
            cfix_make(&f, &SHAPES[si], (mha_weight_dtype)dt, 500 + (uint64_t)si);
            mha_layer *orig = naive_make_layer(&f.w);
            CHECK_OK(mha_layer_convert_weights(orig, (mha_weight_dtype)dt));
            const int D = f.c.d_model, h = f.c.n_heads, hkv = f.c.n_kv_heads, rep = h / hkv;
            uint64_t seed = 13;
            float *x = naive_random_floats((size_t)6 * D, &seed, -1.0f, 1.0f), *y0 = decode_rows(f.conv, x, 6);
            int perm[16], inv[16], kvp[16];
            for (int i = 0; i < h; i++) perm[i] = ((i / rep + 1) % hkv) * rep + rep - 1 - i % rep;
            for (int g = 0; g < hkv; g++) kvp[g] = (g + 1) % hkv;
            for (int i = 0; i < h; i++) inv[perm[i]] = i;
            CHECK_OK(mha_layer_permute_heads(f.conv, perm));
            stored_moved(f.conv, orig, perm, kvp, "permuted heads");
            float *y1 = decode_rows(f.conv, x, 6);
            double ymax = 0.0;
            for (int e = 0; e < 6 * D; e++) ymax = fmax(ymax, fabs(y0[e]));
            const double d = test_max_abs_diff(y0, y1, (size_t)6 * D);
            if (!(d <= 1e-5 * (1.0 + ymax)))
                test_report(__FILE__, __LINE__, "decode after a permutation: %.3g off (max|y| %.3g)", d, ymax);
            char path[96];
            snprintf(path, sizeof path, "/tmp/mha-test-compact-%d-%d-%d.safetensors", (int)getpid(), si, dt);
            CHECK_OK(mha_layer_save(f.conv, path));
            mha_layer *back = NULL;
            CHECK_OK(mha_layer_load(&back, path, NULL));
            remove(path);
            if (back) {
                const int id[16] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
                CHECK_INT(mha_layer_weights_dtype(back), dt);
                stored_moved(back, f.conv, id, id, "saved and loaded");
                float *y2 = decode_rows(back, x, 6);
                CHECK_SAME_BITS(y2, y1, (size_t)6 * D, "decode of the loaded layer");
                free(y2);
                mha_layer_free(back);
            }
            CHECK_OK(mha_layer_permute_heads(f.conv, inv));
            const int id[16] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
            stored_moved(f.conv, orig, id, id, "permuted back");
            for (int b = MHA_BLOCK_Q; b <= MHA_BLOCK_O; b++) { /* one side, and back */
                const int n = b == MHA_BLOCK_K || b == MHA_BLOCK_V ? hkv : h;
                int p[16], q[16];
                for (int i = 0; i < n; i++) p[i] = (i + 1) % n;
                for (int i = 0; i < n; i++) q[p[i]] = i;
                CHECK_OK(mha_layer_permute_block(f.conv, (mha_block)b, p));
                CHECK_OK(mha_layer_permute_block(f.conv, (mha_block)b, q));
            }
            stored_moved(f.conv, orig, id, id, "one-sided moves and back");
            free(x), free(y0), free(y1);
            mha_layer_free(orig);
            cfix_free(&f);
        }
}

const test_case *tests_compact_shapes(size_t *count) {
    static const test_case cases[] = {
        {"compact_shapes_permute_and_files", test_permute_and_files},
    };
    *count = sizeof cases / sizeof cases[0];
    return cases;
}
