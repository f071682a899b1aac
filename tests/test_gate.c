/* test_gate.c — gated attention (config.output_gate: Z *= sigmoid(x W_G +
 * b_G) before W_O, Qwen3-Next). The reference path against the second
 * oracle (tests/naive.c, which gates in its own words), the fast path on
 * every kernel set and the KV cache against the reference, the head
 * permutation moving W_G with the query heads, and the refusals.
 * Legend: B, T, S, D = d_model, h heads. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/internal.h"
#include "naive.h"
#include "test_util.h"
#include "tests.h"

enum { B = 2, T = 7, D = 32 };

static mha_layer *gated(naive_weights *w, int h, int h_kv, int bias, int d_kv_in, uint64_t seed) {
    mha_config c = naive_config(D, h, h_kv, 8, 8, bias);
    c.output_gate = 1, c.d_kv_in = d_kv_in;
    c = naive_resolve(c);
    naive_weights_random(w, &c, &seed, 0.6f);
    return naive_make_layer(w);
}

/* the reference and the fast path against the oracle; causal self-attention
 * with an ablation, and cross-attention from another source */
static void test_gate_against_oracle(void) {
    static const struct {
        int h, h_kv, bias, d_kv_in;
    } cases[] = {{4, 4, 1, 0}, {4, 2, 0, 0}, {4, 1, 1, 24}};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        naive_weights w;
        mha_layer *L = gated(&w, cases[k].h, cases[k].h_kv, cases[k].bias, cases[k].d_kv_in, 3 + k);
        uint64_t seed = 9;
        const int S = cases[k].d_kv_in ? 5 : T, din = cases[k].d_kv_in ? cases[k].d_kv_in : D;
        float *x = naive_random_floats((size_t)B * T * D, &seed, -1, 1);
        float *kv = cases[k].d_kv_in ? naive_random_floats((size_t)B * S * din, &seed, -1, 1) : NULL;
        mha_intervention iv[4] = {{0}};
        iv[1].op = MHA_HEAD_ZERO;
        for (int path = 0; L && path < 2; path++) {
            mha_options o = path ? mha_options_default() : naive_ref_options();
            o.causal = !cases[k].d_kv_in;
            o.interventions = iv;
            o.path = path ? MHA_PATH_FAST : MHA_PATH_REFERENCE;
            const double err = naive_compare(L, &w, x, kv, B, T, S, &o);
            CHECK(err <= (path ? 2e-5 : 1e-6));
        }
        /* the gate matters: the same weights without it differ */
        mha_config plain = w.cfg;
        plain.output_gate = 0;
        mha_weights v = naive_weights_view(&w);
        v.w_g = v.b_g = NULL;
        mha_layer *P = NULL;
        CHECK_OK(mha_layer_create(&P, &plain, &v));
        float *y1 = naive_alloc_floats((size_t)B * T * D), *y2 = naive_alloc_floats((size_t)B * T * D);
        if (L && P) {
            CHECK_OK(mha_forward(L, y1, NULL, x, kv, B, T, S, NULL));
            CHECK_OK(mha_forward(P, y2, NULL, x, kv, B, T, S, NULL));
            CHECK(test_max_abs_diff(y1, y2, (size_t)B * T * D) > 1e-2);
        }
        mha_layer_free(P), mha_layer_free(L), naive_weights_free(&w);
        free(x), free(kv), free(y1), free(y2);
    }
}

/* every kernel set's fast path against the reference, with the captures */
static void test_gate_fast_every_isa(void) {
    naive_weights w;
    mha_layer *L = gated(&w, 4, 2, 1, 0, 5);
    uint64_t seed = 2;
    const size_t ny = (size_t)B * T * D, nz = (size_t)B * T * 4 * 8, nc = 4 * ny;
    float *x = naive_random_floats(ny, &seed, -1, 1);
    float *yr = naive_alloc_floats(ny), *zr = naive_alloc_floats(nz), *cr = naive_alloc_floats(nc);
    float *yf = naive_alloc_floats(ny), *zf = naive_alloc_floats(nz), *cf = naive_alloc_floats(nc);
    mha_options o = naive_ref_options();
    o.causal = 1;
    mha_capture capr = {zr, cr, NULL}, capf = {zf, cf, NULL};
    if (L) CHECK_OK(mha_forward(L, yr, &capr, x, NULL, B, T, T, &o));
    static const char *const sets[] = {"avx512", "avx2", "scalar"};
    mha_context *ctx = NULL;
    CHECK_OK(mha_context_create(&ctx));
    o.path = MHA_PATH_FAST;
    for (int k = 0; L && ctx && k < 3; k++) {
        if (mha_context_set_kernels(ctx, sets[k]) != MHA_OK) continue;
        CHECK_OK(mha_forward_ctx(ctx, L, yf, &capf, x, NULL, NULL, B, T, T, &o));
        CHECK_ARRAY_NEAR(yf, yr, ny, 2e-5);
        CHECK_ARRAY_NEAR(zf, zr, nz, 2e-6);
        CHECK_ARRAY_NEAR(cf, cr, nc, 2e-5);
    }
    /* out of memory at each large allocation in turn: NOMEM, or the right Y */
    for (int n = 1; L && n <= 6; n++) {
        memset(yf, 0, sizeof(float) * ny);
        mha_alloc_large_fail_in = n;
        const mha_status s = mha_forward(L, yf, NULL, x, NULL, B, T, T, &o);
        mha_alloc_large_fail_in = 0;
        CHECK(s == MHA_E_NOMEM || (s == MHA_OK && test_max_abs_diff(yf, yr, ny) <= 2e-5));
    }
    mha_context_free(ctx), mha_layer_free(L), naive_weights_free(&w);
    free(x), free(yr), free(zr), free(cr), free(yf), free(zf), free(cf);
}

/* the KV cache (prefill, then one token at a time; fp32 and int8) against
 * the reference's causal forward of the whole sequence */
static void test_gate_cache(void) {
    naive_weights w;
    mha_layer *L = gated(&w, 4, 2, 1, 0, 7);
    uint64_t seed = 4;
    const size_t ny = (size_t)B * T * D;
    float *x = naive_random_floats(ny, &seed, -1, 1), *yr = naive_alloc_floats(ny), *y = naive_alloc_floats(ny);
    float *xs = naive_alloc_floats((size_t)B * D), *ys = naive_alloc_floats((size_t)B * D);
    mha_options o = naive_ref_options();
    o.causal = 1;
    if (L) CHECK_OK(mha_forward(L, yr, NULL, x, NULL, B, T, T, &o));
    for (int dt = 0; L && dt < 2; dt++) {
        mha_cache *c = NULL;
        CHECK_OK(mha_cache_create(&c, L, B, 16, dt ? MHA_CACHE_I8 : MHA_CACHE_F32, 0));
        if (!c) break;
        const int P = 4;
        float *xp = naive_alloc_floats((size_t)B * P * D), *yp = naive_alloc_floats((size_t)B * P * D);
        for (int b = 0; b < B; b++) memcpy(xp + (size_t)b * P * D, x + (size_t)b * T * D, sizeof(float) * P * D);
        CHECK_OK(mha_forward_cached(L, c, yp, NULL, xp, P, NULL, NULL));
        for (int b = 0; b < B; b++) memcpy(y + (size_t)b * T * D, yp + (size_t)b * P * D, sizeof(float) * P * D);
        for (int t = P; t < T; t++) {
            for (int b = 0; b < B; b++) memcpy(xs + (size_t)b * D, x + ((size_t)b * T + t) * D, sizeof(float) * D);
            CHECK_OK(mha_forward_cached(L, c, ys, NULL, xs, 1, NULL, NULL));
            for (int b = 0; b < B; b++) memcpy(y + ((size_t)b * T + t) * D, ys + (size_t)b * D, sizeof(float) * D);
        }
        CHECK_ARRAY_NEAR(y, yr, ny, dt ? 3e-2 : 2e-5);
        free(xp), free(yp);
        mha_cache_free(c);
    }
    /* a cross-attention memory: the gate reads the queries' input */
    mha_cache *m = NULL;
    const int S = 5, s_len[B] = {5, 3};
    float *kv = naive_random_floats((size_t)B * S * D, &seed, -1, 1);
    uint8_t keep[B * 5];
    for (int b = 0; b < B; b++)
        for (int j = 0; j < S; j++) keep[b * S + j] = j < s_len[b];
    mha_options ok = naive_ref_options();
    ok.key_keep = keep;
    if (L) CHECK_OK(mha_forward_kv(L, yr, NULL, x, kv, kv, B, T, S, &ok));
    if (L) CHECK_OK(mha_cache_create_cross(&m, L, B, 8, MHA_CACHE_F32, MHA_CACHE_F32));
    if (m) {
        CHECK_OK(mha_cache_set_memory(m, L, kv, NULL, S, s_len));
        CHECK_OK(mha_forward_cached(L, m, y, NULL, x, T, NULL, NULL));
        CHECK_ARRAY_NEAR(y, yr, ny, 2e-5);
    }
    mha_cache_free(m), free(kv);
    mha_layer_free(L), naive_weights_free(&w);
    free(x), free(yr), free(y), free(xs), free(ys);
}

/* permuting the heads moves each head's gate with its query: the same Y;
 * moving the query block alone (gate with it, W_O not) breaks the contract */
static void test_gate_permutation(void) {
    naive_weights w;
    mha_layer *L = gated(&w, 4, 2, 1, 0, 8);
    uint64_t seed = 6;
    const size_t ny = (size_t)B * T * D;
    float *x = naive_random_floats(ny, &seed, -1, 1), *y0 = naive_alloc_floats(ny), *y1 = naive_alloc_floats(ny);
    const int perm[4] = {2, 3, 0, 1};
    if (L) {
        CHECK_OK(mha_forward(L, y0, NULL, x, NULL, B, T, T, NULL));
        CHECK_OK(mha_layer_permute_heads(L, perm));
        CHECK_OK(mha_forward(L, y1, NULL, x, NULL, B, T, T, NULL));
        CHECK_ARRAY_NEAR(y1, y0, ny, 2e-6);
        mha_weights v;
        mha_layer_get_weights(L, &v);
        CHECK(v.w_g[2 * 8] == w.w_g[0]); /* head 0's first gate column is now head 2's */
        const int swap[4] = {1, 0, 2, 3};
        CHECK_OK(mha_layer_permute_block(L, MHA_BLOCK_O, swap));
        CHECK_OK(mha_forward(L, y1, NULL, x, NULL, B, T, T, NULL));
        CHECK(test_max_abs_diff(y1, y0, ny) > 1e-3);
    }
    mha_layer_free(L), naive_weights_free(&w);
    free(x), free(y0), free(y1);
}

static void test_gate_refusals(void) {
    naive_weights w;
    mha_layer *L = gated(&w, 4, 4, 1, 0, 1);
    mha_config c = w.cfg;
    mha_weights v = naive_weights_view(&w);
    mha_layer *R = NULL;
    v.w_g = NULL;
    CHECK_STATUS(mha_layer_create(&R, &c, &v), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("weights.w_g is NULL");
    v = naive_weights_view(&w);
    v.b_g = NULL;
    CHECK_STATUS(mha_layer_create(&R, &c, &v), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("weights.b_g is NULL");
    c.output_gate = 0;
    v = naive_weights_view(&w);
    v.b_g = NULL;
    CHECK_STATUS(mha_layer_create(&R, &c, &v), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("weights.w_g is given but config.output_gate is off");
    c.output_gate = 2;
    CHECK_STATUS(mha_config_resolve(&c, &c), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("output_gate=2");
    if (L) {
        uint64_t seed = 1;
        float *x = naive_random_floats((size_t)T * D, &seed, -1, 1), *y = naive_alloc_floats((size_t)T * D);
        float *dx = naive_alloc_floats((size_t)T * D);
        /* the backward: db_g of a gated layer without bias, dw_g or db_g of an ungated one */
        naive_weights w0, w1;
        mha_config plain = naive_resolve(naive_config(D, 4, 4, 8, 8, 1));
        uint64_t s1 = 9;
        naive_weights_random(&w1, &plain, &s1, 0.5f);
        mha_layer *no_bias = gated(&w0, 4, 4, 0, 0, 2), *ungated = naive_make_layer(&w1);
        float *dwg = naive_alloc_floats((size_t)D * 4 * 8);
        mha_gradients g = {0};
        g.dx = dx, g.db_g = dwg;
        CHECK_STATUS(mha_backward(no_bias, &g, y, x, NULL, 1, T, T, NULL), MHA_E_ARG);
        CHECK_ERROR_MENTIONS("db_g given but the layer has no bias");
        CHECK_STATUS(mha_backward(ungated, &g, y, x, NULL, 1, T, T, NULL), MHA_E_ARG);
        CHECK_ERROR_MENTIONS("db_g given but config.output_gate=0");
        g.db_g = NULL, g.dw_g = dwg;
        CHECK_STATUS(mha_backward(ungated, &g, y, x, NULL, 1, T, T, NULL), MHA_E_ARG);
        CHECK_ERROR_MENTIONS("dw_g given but config.output_gate=0");
        g.dw_g = dx; /* overlapping dx */
        CHECK_STATUS(mha_backward(L, &g, y, x, NULL, 1, T, T, NULL), MHA_E_ARG);
        CHECK_ERROR_MENTIONS("grad.dx overlaps grad.dw_g");
        mha_layer_free(no_bias), mha_layer_free(ungated), naive_weights_free(&w0), naive_weights_free(&w1);
        free(x), free(y), free(dx), free(dwg);
    }
    mha_layer_free(L), naive_weights_free(&w);
}

/* Decodes x (B,T,D) one token at a time after a prefill of 3 on a
 * fresh fp32 cache of L: y (B,T,D). The steps stream the layer's
 * weights in their stored form (bf16, int8: W_G too). */
static void decode_all(const mha_layer *L, float *y, const float *x) {
    mha_cache *c = NULL;
    CHECK_OK(mha_cache_create(&c, L, B, 16, MHA_CACHE_F32, 0));
    float *xs = naive_alloc_floats((size_t)B * T * D), *ys = naive_alloc_floats((size_t)B * T * D);
    for (int t0 = 0, n = 3; c && t0 < T; t0 += n, n = 1) {
        for (int b = 0; b < B; b++)
            memcpy(xs + (size_t)b * n * D, x + ((size_t)b * T + t0) * D, sizeof(float) * n * D);
        CHECK_OK(mha_forward_cached(L, c, ys, NULL, xs, n, NULL, NULL));
        for (int b = 0; b < B; b++)
            memcpy(y + ((size_t)b * T + t0) * D, ys + (size_t)b * n * D, sizeof(float) * n * D);
    }
    mha_cache_free(c), free(xs), free(ys);
}

/* bf16 and int8 weights of a gated layer: W_G is stored like W_Q (int8:
 * one scale per column and group of 32 inputs), its fp32 copy holds the
 * stored values, decode steps stream it, head permutations move it, files
 * keep it; options.bf16_matmul is refused (the gate has no bf16 product) */
static void test_gate_compact_weights(void) {
    for (int k = 0; k < 2; k++) {
        const mha_weight_dtype dt = k ? MHA_W_I8 : MHA_W_BF16;
        naive_weights w;
        mha_layer *L = gated(&w, 4, 2, 1, 0, 21 + k), *F = NULL, *R = NULL;
        uint64_t seed = 6;
        const size_t ny = (size_t)B * T * D, ng = (size_t)D * 4 * 8;
        float *x = naive_random_floats(ny, &seed, -1, 1), *yr = naive_alloc_floats(ny), *yd = naive_alloc_floats(ny);
        float *y2 = naive_alloc_floats(ny);
        if (!L) goto next;
        CHECK_OK(mha_layer_convert_weights(L, dt));
        CHECK_INT(mha_layer_weights_dtype(L), dt);
        mha_weights v;
        mha_layer_get_weights(L, &v);
        double moved = 0.0; /* W_G took the stored values: rounded, not the fp32 ones */
        int on_grid = 1;
        for (size_t i = 0; i < ng; i++) {
            moved = fmax(moved, fabs(v.w_g[i] - w.w_g[i]));
            uint32_t bits;
            memcpy(&bits, &v.w_g[i], 4);
            if (!k && (bits & 0xffffu)) on_grid = 0;
        }
        CHECK(moved > 0.0 && moved < (k ? 0.6 / 127 : 0.6 / 128));
        CHECK(on_grid);
        /* an fp32 layer of the stored values: the same Y, and the decode steps of the compact layer */
        CHECK_OK(mha_layer_create(&F, mha_layer_config(L), &v));
        mha_options o = naive_ref_options();
        o.causal = 1;
        if (F) CHECK_OK(mha_forward(F, yr, NULL, x, NULL, B, T, T, &o));
        CHECK_OK(mha_forward(L, y2, NULL, x, NULL, B, T, T, &o));
        CHECK(memcmp(y2, yr, sizeof(float) * ny) == 0);
        decode_all(L, yd, x);
        CHECK_ARRAY_NEAR(yd, yr, ny, 2e-5);
        /* heads permuted: W_G's stored columns (and int8 scales) move with the queries */
        const int perm[4] = {3, 2, 0, 1}; /* whole kv groups, reversed inside one */
        CHECK_OK(mha_layer_permute_heads(L, perm));
        decode_all(L, yd, x);
        CHECK_ARRAY_NEAR(yd, yr, ny, 2e-5);
        /* a native file keeps the dtype, W_G included, and the values */
        char path[64];
        snprintf(path, sizeof path, "/tmp/mha_test_gate_w%d_%d.safetensors", k, (int)getpid());
        CHECK_OK(mha_layer_save(L, path));
        mha_tensors *t = NULL;
        CHECK_OK(mha_safetensors_read(&t, path, 0));
        if (t) {
            const mha_array *g = mha_tensors_get(t, "w_g");
            CHECK(g && g->dtype == (k ? MHA_DTYPE_I8 : MHA_DTYPE_BF16));
            CHECK((mha_tensors_get(t, "w_g_scale") != NULL) == k);
        }
        mha_tensors_free(t);
        CHECK_OK(mha_layer_load(&R, path, NULL));
        if (R) {
            CHECK_INT(mha_layer_weights_dtype(R), dt);
            CHECK_OK(mha_forward(R, y2, NULL, x, NULL, B, T, T, &o));
            CHECK_ARRAY_NEAR(y2, yr, ny, 1e-6);
            decode_all(R, yd, x);
            CHECK_ARRAY_NEAR(yd, yr, ny, 2e-5);
        }
        unlink(path);
        if (k) { /* an ungated int8 file with a w_g_scale: refused, not ignored */
            mha_config pc = naive_resolve(naive_config(D, 4, 2, 8, 8, 1));
            naive_weights pw;
            uint64_t s2 = 3;
            naive_weights_random(&pw, &pc, &s2, 0.5f);
            mha_layer *P = naive_make_layer(&pw), *Q = NULL;
            mha_tensors *pt = NULL;
            const int gs[2] = {1, 32};
            const mha_load_options native = {.layout = MHA_LAYOUT_NATIVE};
            if (P && !mha_layer_convert_weights(P, MHA_W_I8) && !mha_layer_to_tensors(&pt, P) &&
                !mha_tensors_add_f32(pt, "w_g_scale", pw.w_q, 2, gs)) {
                CHECK_STATUS(mha_layer_from_tensors(&Q, pt, &native), MHA_E_FORMAT);
                CHECK_ERROR_MENTIONS("tensor 'w_g_scale' without w_g");
            } else {
                CHECK(0);
            }
            mha_tensors_free(pt), mha_layer_free(P), mha_layer_free(Q), naive_weights_free(&pw);
            /* an int8 gated file whose w_g has more rows than d_model (its scales too): refused by
             * shape before any code is checked against a scale row the config has not (ASan: no read
             * past the scales) */
            mha_tensors *src = NULL, *bad = NULL;
            CHECK_OK(mha_layer_to_tensors(&src, L));
            CHECK_OK(mha_tensors_create(&bad));
            const int tall[2] = {4 * D, 1}, sc[2] = {1, 1};
            float *codes = naive_alloc_floats((size_t)4 * D), one = 1.0f;
            for (int i = 0; src && bad && i < mha_tensors_count(src); i++) {
                const char *n = mha_tensors_name(src, i);
                if (strcmp(n, "w_g") && strcmp(n, "w_g_scale")) CHECK_OK(mha_tensors_add(bad, n, mha_tensors_get(src, n)));
            }
            for (int i = 0; src && bad && i < mha_tensors_meta_count(src); i++)
                CHECK_OK(mha_tensors_set_meta(bad, mha_tensors_meta_key(src, i),
                                              mha_tensors_meta(src, mha_tensors_meta_key(src, i))));
            const mha_array tall_codes = {.dtype = MHA_DTYPE_I8, .rank = 2, .shape = {tall[0], tall[1], 1, 1},
                                          .count = (size_t)tall[0] * tall[1], .f = codes};
            if (bad && !mha_tensors_add(bad, "w_g", &tall_codes) && !mha_tensors_add_f32(bad, "w_g_scale", &one, 2, sc)) {
                CHECK_STATUS(mha_layer_from_tensors(&Q, bad, &native), MHA_E_SHAPE);
                CHECK_ERROR_MENTIONS("tensor 'w_g' has shape");
            }
            mha_tensors_free(src), mha_tensors_free(bad), free(codes);
        }
        o.bf16_matmul = 1, o.path = MHA_PATH_AUTO;
        CHECK_STATUS(mha_forward(L, y2, NULL, x, NULL, B, T, T, &o), k ? MHA_E_UNSUPPORTED : MHA_E_UNSUPPORTED);
        CHECK_ERROR_MENTIONS("bf16_matmul=1 with an output gate");
    next:
        mha_layer_free(L), mha_layer_free(F), mha_layer_free(R), naive_weights_free(&w);
        free(x), free(yr), free(yd), free(y2);
    }
}

/* a native file keeps the gate (metadata output_gate, w_g, b_g); edited
 * files refused; a shard of heads keeps it */
static void test_gate_file(void) {
    naive_weights w;
    mha_layer *L = gated(&w, 4, 2, 1, 0, 12), *R = NULL;
    uint64_t seed = 3;
    const size_t ny = (size_t)B * T * D;
    float *x = naive_random_floats(ny, &seed, -1, 1), *y0 = naive_alloc_floats(ny), *y1 = naive_alloc_floats(ny);
    mha_tensors *t = NULL;
    if (L) CHECK_OK(mha_layer_to_tensors(&t, L));
    if (!t) goto done;
    CHECK(mha_tensors_meta(t, "output_gate") && strcmp(mha_tensors_meta(t, "output_gate"), "1") == 0);
    const mha_load_options native = {.layout = MHA_LAYOUT_NATIVE};
    CHECK_OK(mha_layer_from_tensors(&R, t, &native));
    if (R) {
        CHECK_OK(mha_forward(L, y0, NULL, x, NULL, B, T, T, NULL));
        CHECK_OK(mha_forward(R, y1, NULL, x, NULL, B, T, T, NULL));
        CHECK(memcmp(y0, y1, sizeof(float) * ny) == 0);
    }
    mha_layer_free(R), R = NULL;
    /* the flag without its tensor, the tensor without its flag */
    CHECK_OK(mha_tensors_set_meta(t, "output_gate", "0"));
    CHECK_STATUS(mha_layer_from_tensors(&R, t, &native), MHA_E_FORMAT);
    CHECK_ERROR_MENTIONS("tensor w_g without metadata output_gate = 1");
    mha_tensors *u = NULL;
    CHECK_OK(mha_tensors_create(&u));
    for (int i = 0; u && i < mha_tensors_count(t); i++) {
        const char *n = mha_tensors_name(t, i);
        if (strcmp(n, "w_g") != 0) CHECK_OK(mha_tensors_add(u, n, mha_tensors_get(t, n)));
    }
    for (int i = 0; u && i < mha_tensors_meta_count(t); i++)
        CHECK_OK(mha_tensors_set_meta(u, mha_tensors_meta_key(t, i), mha_tensors_meta(t, mha_tensors_meta_key(t, i))));
    if (u) CHECK_OK(mha_tensors_set_meta(u, "output_gate", "1"));
    if (u) CHECK_STATUS(mha_layer_from_tensors(&R, u, &native), MHA_E_FORMAT);
    CHECK_ERROR_MENTIONS("metadata output_gate = 1 but the checkpoint has no w_g");
    mha_tensors_free(u);
    /* a shard of heads */
    char path[64];
    snprintf(path, sizeof path, "/tmp/mha_test_gate_%d.safetensors", (int)getpid());
    CHECK_OK(mha_layer_save(L, path));
    mha_config lc;
    CHECK_OK(mha_layer_load_config(&lc, path, NULL)); /* the config of a gated file says so */
    CHECK_INT(lc.output_gate, 1);
    mha_head_range range = {.first = 0, .count = 2}; /* gated too (test_load_heads.c: load_heads_gated) */
    CHECK_OK(mha_layer_load_heads(&R, path, NULL, &range));
    CHECK(R && mha_layer_config(R)->output_gate == 1);
    mha_layer_free(R), R = NULL;
    unlink(path);
done:
    mha_tensors_free(t), mha_layer_free(L), naive_weights_free(&w);
    free(x), free(y0), free(y1);
}

static const test_case cases[] = {
    {"gate_file", test_gate_file},
    {"gate_against_oracle", test_gate_against_oracle},
    {"gate_fast_every_isa", test_gate_fast_every_isa},
    {"gate_cache", test_gate_cache},
    {"gate_permutation", test_gate_permutation},
    {"gate_refusals", test_gate_refusals},
    {"gate_compact_weights", test_gate_compact_weights},
};

const test_case *tests_gate(size_t *count) {
    *count = sizeof cases / sizeof cases[0];
    return cases;
}
