/* test_cache.c — the KV cache and incremental decoding (issue 5) against
 * one causal forward over the whole sequence on the reference path.
 *
 * Tolerances (stated once, used by every comparison of y):
 *  fp32 cache: max|cached - ref| <= 2 * max|naive32 - ref| + 1e-6, where
 *    naive32 is the plain fp32 causal layer below (the fast-path rule).
 *  fp16 cache: compared with naive32 run on K and V rounded to binary16
 *    by the tests' own rounding (naive_round_f16), within the fp32 bound
 *    plus 0.05 x the measured effect of fp16 storage on y (max|naive16 -
 *    ref|, 4e-4..2e-3 here). Weights and inputs are dyadic (see dyadic()),
 *    so K and V are exact in fp32 and both sides round the same bits.
 *    Truncating instead of rounding moves y by about 1 x the effect, so it
 *    fails (tests/mutants: f16_*_truncates).
 * Legend: B sequences, T tokens, h, h_kv heads, d_k, d_v, d_model. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache/cache_internal.h"
#include "naive.h"
#include "test_util.h"
#include "tests.h"

/* ------------------------------------------------------------ fixture */

typedef struct {
    naive_weights w;
    mha_layer *L;
    int B, T, D, h, h_kv, d_k, d_v;
} fixture;

/* Rounds p (n) to multiples of 2^-8. With |x| < 1, |w| < 0.5 and
 * d_model <= 32, every projection of such data is exact in fp32 whatever
 * the summation order, so K and V reach the fp16 rounding with the same
 * bits in the library and in naive32, and the fp16 comparison needs no
 * slack for values that round the other way (ties, frequent at this
 * resolution, must go to even). */
static float *dyadic(float *p, size_t n) {
    for (size_t i = 0; i < n; i++) p[i] = ldexpf(nearbyintf(ldexpf(p[i], 8)), -8);
    return p;
}

static void fixture_make(fixture *f, int B, int T, int D, int h, int h_kv, int d_k, int d_v,
                         int extras, uint64_t seed) {
    mha_config c = mha_config_default(D, h);
    c.n_kv_heads = h_kv, c.d_k = d_k, c.d_v = d_v, c.bias = 1;
    c.add_bias_kv = extras, c.add_zero_attn = extras;
    mha_config r = naive_resolve(c);
    naive_weights_random(&f->w, &r, &seed, 0.5f);
    naive_weights *w = &f->w;
    float *const all[10] = {w->w_q, w->w_k, w->w_v, w->w_o, w->b_q, w->b_k, w->b_v, w->b_o, w->bias_k, w->bias_v};
    size_t hk = (size_t)r.n_heads * r.d_k, gk = (size_t)r.n_kv_heads * r.d_k, gv = (size_t)r.n_kv_heads * r.d_v;
    const size_t n[10] = {(size_t)D * hk, (size_t)D * gk, (size_t)D * gv, (size_t)r.n_heads * r.d_v * D, hk, gk, gv,
                          (size_t)D, gk, gv};
    for (int i = 0; i < 10; i++)
        if (all[i]) dyadic(all[i], n[i]);
    f->L = naive_make_layer(&f->w);
    f->B = B, f->T = T, f->D = D, f->h = h, f->h_kv = h_kv, f->d_k = r.d_k, f->d_v = r.d_v;
}

static void fixture_free(fixture *f) {
    mha_layer_free(f->L);
    naive_weights_free(&f->w);
}

static mha_options causal_ref(int window_left) {
    mha_options o = naive_ref_options();
    o.causal = 1;
    o.window_left = window_left;
    return o;
}

/* ------------------------------------------- naive fp32 causal layer */

/* out (rows, n) = in (rows, k) w (k, n) + b in fp32, k order. */
static void lin32(float *out, const float *in, const float *w, const float *b, int rows, int k, int n) {
    for (int t = 0; t < rows; t++)
        for (int o = 0; o < n; o++) {
            float acc = b ? b[o] : 0.0f;
            for (int i = 0; i < k; i++) acc += in[(size_t)t * k + i] * w[(size_t)i * n + o];
            out[(size_t)t * n + o] = acc;
        }
}

/* y (B,T,D) of the causal self-attention layer in plain fp32, keys
 * j in [i - left, i] (left < 0: all j <= i), plus the extra keys. With
 * kv_f16, K and V are rounded to binary16 after projection, as an fp16
 * cache stores them (naive_round_f16: the tests' own rounding); the extra
 * keys' bias_k/bias_v are not cached and stay fp32. */
static void naive32_causal(float *y, const fixture *f, const float *x, int left, int kv_f16) {
    const mha_config *c = &f->w.cfg;
    int B = f->B, T = f->T, D = f->D, h = f->h, hk = f->h_kv, dk = f->d_k, dv = f->d_v;
    int n_rep = h / hk;
    float scale = 1.0f / sqrtf((float)dk);
    float *q = naive_alloc_floats((size_t)B * T * h * dk), *k = naive_alloc_floats((size_t)B * T * hk * dk);
    float *v = naive_alloc_floats((size_t)B * T * hk * dv), *z = naive_alloc_floats((size_t)B * T * h * dv);
    float *sc = naive_alloc_floats((size_t)T + 2);
    lin32(q, x, f->w.w_q, f->w.b_q, B * T, D, h * dk);
    lin32(k, x, f->w.w_k, f->w.b_k, B * T, D, hk * dk);
    lin32(v, x, f->w.w_v, f->w.b_v, B * T, D, hk * dv);
    for (size_t i = 0; kv_f16 && i < (size_t)B * T * hk * dk; i++) k[i] = naive_round_f16(k[i]);
    for (size_t i = 0; kv_f16 && i < (size_t)B * T * hk * dv; i++) v[i] = naive_round_f16(v[i]);
    for (int b = 0; b < B; b++)
        for (int r = 0; r < h; r++)
            for (int i = 0; i < T; i++) {
                int g = r / n_rep, j0 = left >= 0 && i - left > 0 ? i - left : 0, n = 0;
                const float *qi = q + ((size_t)b * T + i) * h * dk + (size_t)r * dk;
                float mx = -INFINITY, sum = 0.0f;
                for (int j = j0; j <= i; j++, n++) {
                    const float *kj = k + ((size_t)b * T + j) * hk * dk + (size_t)g * dk;
                    float dot = 0.0f;
                    for (int e = 0; e < dk; e++) dot += qi[e] * kj[e];
                    sc[n] = scale * dot;
                }
                if (c->add_bias_kv) {
                    float dot = 0.0f;
                    for (int e = 0; e < dk; e++) dot += qi[e] * f->w.bias_k[(size_t)g * dk + e];
                    sc[n++] = scale * dot;
                }
                if (c->add_zero_attn) sc[n++] = 0.0f;
                for (int j = 0; j < n; j++) mx = fmaxf(mx, sc[j]);
                for (int j = 0; j < n; j++) sum += sc[j] = expf(sc[j] - mx);
                float *zi = z + ((size_t)b * T + i) * h * dv + (size_t)r * dv;
                for (int e = 0; e < dv; e++) {
                    float acc = 0.0f;
                    int m = 0;
                    for (int j = j0; j <= i; j++, m++) acc += sc[m] * v[((size_t)b * T + j) * hk * dv + (size_t)g * dv + e];
                    if (c->add_bias_kv) acc += sc[m] * f->w.bias_v[(size_t)g * dv + e];
                    zi[e] = acc / sum;
                }
            }
    lin32(y, z, f->w.w_o, f->w.b_o, B * T, h * dv, D);
    free(q), free(k), free(v), free(z), free(sc);
}

/* ref y (and z) of the whole sequence; returns the fp32 tolerance. With
 * y16 (B,T,D) not NULL, also the fp16 oracle: y16 = naive32 with K and V
 * rounded to fp16, and *tol16 its bound (see the header comment). */
static double reference(float *y, float *z, float *y16, double *tol16, const fixture *f, const float *x,
                        int left) {
    size_t ny = (size_t)f->B * f->T * f->D;
    mha_options o = causal_ref(left);
    mha_capture cap = {z, NULL, NULL};
    CHECK_OK(mha_forward(f->L, y, &cap, x, NULL, f->B, f->T, f->T, &o));
    float *y32 = naive_alloc_floats(ny);
    naive32_causal(y32, f, x, left, 0);
    double tol = 2.0 * test_max_abs_diff(y32, y, ny) + 1e-6;
    if (y16) {
        naive32_causal(y16, f, x, left, 1);
        double e16 = test_max_abs_diff(y16, y, ny); /* the effect of fp16 storage */
        CHECK(e16 > 10.0 * tol);                    /* ...is visible above fp32 noise */
        *tol16 = tol + 0.05 * e16;
    }
    free(y32);
    return tol;
}

/* Runs x (B,T,D) through the cache in pieces of sizes steps[0..], copying
 * y (and z) of each piece into the whole-sequence arrays. */
static void run_cached(float *y, float *z, const fixture *f, mha_cache *c, const float *x,
                       const int *steps, int nsteps, const mha_options *opt) {
    int t = 0, D = f->D, zw = f->h * f->d_v;
    for (int s = 0; s < nsteps && t < f->T; s++) {
        int n = steps[s] < f->T - t ? steps[s] : f->T - t;
        float *xs = naive_alloc_floats((size_t)f->B * n * D), *ys = naive_alloc_floats((size_t)f->B * n * D);
        float *zs = naive_alloc_floats((size_t)f->B * n * zw);
        for (int b = 0; b < f->B; b++)
            memcpy(xs + (size_t)b * n * D, x + ((size_t)b * f->T + t) * D, sizeof(float) * n * D);
        mha_capture cap = {zs, NULL, NULL};
        CHECK_OK(mha_forward_cached(f->L, c, ys, &cap, xs, n, NULL, opt));
        for (int b = 0; b < f->B; b++) {
            memcpy(y + ((size_t)b * f->T + t) * D, ys + (size_t)b * n * D, sizeof(float) * n * D);
            if (z) memcpy(z + ((size_t)b * f->T + t) * zw, zs + (size_t)b * n * zw, sizeof(float) * n * zw);
        }
        free(xs), free(ys), free(zs);
        t += n;
    }
    CHECK_INT(t, f->T);
}

/* Prefill `prefill` tokens, then decode one at a time, vs the reference. */
static void prefill_then_decode(int h, int h_kv, mha_cache_dtype dt, int extras) {
    fixture f;
    fixture_make(&f, 2, 150, 24, h, h_kv, 6, 0, extras, 42 + h_kv);
    uint64_t seed = 7;
    float *x = dyadic(naive_random_floats((size_t)f.B * f.T * f.D, &seed, -1.0f, 1.0f), (size_t)f.B * f.T * f.D);
    size_t ny = (size_t)f.B * f.T * f.D, nz = (size_t)f.B * f.T * f.h * f.d_v;
    float *yr = naive_alloc_floats(ny), *zr = naive_alloc_floats(nz);
    float *yc = naive_alloc_floats(ny), *zc = naive_alloc_floats(nz);
    float *y16 = naive_alloc_floats(ny);
    double tol16, tol = reference(yr, zr, y16, &tol16, &f, x, -1);
    mha_cache *c = NULL;
    CHECK_OK(mha_cache_create(&c, f.L, f.B, f.T, dt, 0));
    int steps[32];
    steps[0] = 122; /* decoding crosses the chunk boundary (MHA_DECODE_CHUNK) */
    CHECK(steps[0] < MHA_DECODE_CHUNK * 2 && f.T > MHA_DECODE_CHUNK);
    for (int i = 1; i < 32; i++) steps[i] = i < 4 ? 1 : i == 4 ? 3 : 1;
    if (c) run_cached(yc, zc, &f, c, x, steps, 32, NULL);
    CHECK_ARRAY_NEAR(yc, dt == MHA_CACHE_F16 ? y16 : yr, ny, dt == MHA_CACHE_F16 ? tol16 : tol);
    CHECK(tol < 1e-4);
    if (dt == MHA_CACHE_F32) CHECK_ARRAY_NEAR(zc, zr, nz, tol);
    CHECK_INT(mha_cache_length(c, 1), f.T);
    mha_cache_free(c);
    free(x), free(yr), free(zr), free(yc), free(zc), free(y16);
    fixture_free(&f);
}

static void test_decode_mha_f32(void) { prefill_then_decode(8, 8, MHA_CACHE_F32, 0); }
static void test_decode_gqa_f32(void) { prefill_then_decode(8, 2, MHA_CACHE_F32, 0); }
static void test_decode_mqa_f32(void) { prefill_then_decode(8, 1, MHA_CACHE_F32, 0); }
static void test_decode_mha_f16(void) { prefill_then_decode(8, 8, MHA_CACHE_F16, 0); }
static void test_decode_gqa_f16(void) { prefill_then_decode(8, 2, MHA_CACHE_F16, 0); }
static void test_decode_mqa_f16(void) { prefill_then_decode(8, 1, MHA_CACHE_F16, 0); }
static void test_decode_bias_kv_zero_attn(void) { prefill_then_decode(4, 2, MHA_CACHE_F32, 1); }

/* Decode steps keep their scratch: after warm steps, more steps allocate
 * no new block, neither for the attention (the cache's workspace: each
 * thread's scratch and the split partials) nor for the projections'
 * partial sums (gemm.c's process-wide pool). Allocated and freed per call,
 * glibc could give them back to the kernel and fault them in again on
 * every step (bench/LIMITS.md round 11). 2 threads, split tasks (few
 * units), GQA and an int8 cache. */
static void test_decode_scratch_kept(void) {
    fixture f;
    fixture_make(&f, 1, 300, 32, 8, 2, 8, 0, 0, 61);
    uint64_t seed = 11;
    float *x = naive_random_floats((size_t)f.T * f.D, &seed, -1.0f, 1.0f), *y = naive_alloc_floats((size_t)f.T * f.D);
    mha_context *ctx = NULL;
    CHECK_OK(mha_context_create(&ctx));
    if (ctx) CHECK_OK(mha_context_set_num_threads(ctx, 2));
    mha_decode_set_min_parallel_work(0.0); /* tiny shapes: threads anyway */
    mha_cache *c = NULL;
    CHECK_OK(mha_cache_create(&c, f.L, 1, f.T, MHA_CACHE_I8, 0));
    if (!c || !ctx) goto done;
    CHECK_OK(mha_forward_cached_ctx(ctx, f.L, c, y, NULL, x, 200, NULL, NULL));
    for (int t = 200; t < 203; t++) CHECK_OK(mha_forward_cached_ctx(ctx, f.L, c, y, NULL, x + (size_t)t * f.D, 1, NULL, NULL));
    const size_t att = mha_workspace_allocations(c->ws), proj = mha_gemm_scratch_allocations();
    CHECK(att >= 1 && proj >= 1);
    for (int t = 203; t < 300; t++) CHECK_OK(mha_forward_cached_ctx(ctx, f.L, c, y, NULL, x + (size_t)t * f.D, 1, NULL, NULL));
    CHECK(mha_workspace_allocations(c->ws) == att);
    CHECK(mha_gemm_scratch_allocations() == proj);
done:
    mha_decode_set_min_parallel_work(262144.0);
    mha_cache_free(c);
    mha_context_free(ctx);
    free(x), free(y);
    fixture_free(&f);
}

/* The scalar kernels (the non-AVX2 fallback) pass the same check. */
static void test_decode_scalar_kernels(void) {
    mha_decode_force_scalar(1);
    prefill_then_decode(8, 2, MHA_CACHE_F32, 0);
    prefill_then_decode(8, 1, MHA_CACHE_F16, 0); /* fp16 widened per chunk */
    prefill_then_decode(8, 8, MHA_CACHE_F16, 0); /* fp16 widened per element */
    mha_decode_force_scalar(0);
}

/* Pieces of several sizes (a long prefill, then 3, then 1s) and d_v != d_k. */
static void test_decode_uneven_pieces(void) {
    fixture f;
    fixture_make(&f, 1, 150, 16, 4, 1, 8, 5, 0, 3);
    uint64_t seed = 11;
    float *x = dyadic(naive_random_floats((size_t)f.T * f.D, &seed, -1.0f, 1.0f), (size_t)f.T * f.D);
    float *yr = naive_alloc_floats((size_t)f.T * f.D), *yc = naive_alloc_floats((size_t)f.T * f.D);
    double tol = reference(yr, NULL, NULL, NULL, &f, x, -1);
    mha_cache *c = NULL;
    CHECK_OK(mha_cache_create(&c, f.L, 1, 160, MHA_CACHE_F32, 0));
    int steps[] = {130, 3, 1, 5, 1, 1, 2, 7};
    if (c) run_cached(yc, NULL, &f, c, x, steps, 8, NULL);
    CHECK_ARRAY_NEAR(yc, yr, (size_t)f.T * f.D, tol);
    mha_cache_free(c);
    free(x), free(yr), free(yc);
    fixture_free(&f);
}

/* ------------------------------------------------------ ragged batches */

/* Three sequences of different lengths fed in steps of different sizes
 * (n_new per sequence), each equal to its own reference forward. */
static void test_ragged_batch(void) {
    fixture f;
    fixture_make(&f, 3, 40, 16, 4, 2, 4, 0, 0, 5);
    int len[3] = {40, 23, 31};
    uint64_t seed = 13;
    float *x = dyadic(naive_random_floats((size_t)f.B * f.T * f.D, &seed, -1.0f, 1.0f), (size_t)f.B * f.T * f.D);
    float *y = naive_alloc_floats((size_t)f.B * f.T * f.D);
    mha_cache *c = NULL;
    CHECK_OK(mha_cache_create(&c, f.L, 3, 40, MHA_CACHE_F16, 0));
    int done[3] = {0, 0, 0}, round = 0;
    while (c && (done[0] < len[0] || done[1] < len[1] || done[2] < len[2])) {
        int Tn = 1 + round % 4, n[3];
        for (int b = 0; b < 3; b++) {
            int want = round == 0 ? 5 * (b + 1) : (b + round) % 3; /* some 0s */
            if (want > Tn && round) want = Tn;
            n[b] = len[b] - done[b] < want ? len[b] - done[b] : want;
        }
        int T = round == 0 ? 15 : Tn;
        float *xs = naive_alloc_floats((size_t)3 * T * f.D), *ys = naive_alloc_floats((size_t)3 * T * f.D);
        for (int i = 0; i < 3 * T * f.D; i++) ys[i] = 99.0f; /* padding rows must become 0 */
        for (int b = 0; b < 3; b++)
            memcpy(xs + (size_t)b * T * f.D, x + ((size_t)b * f.T + done[b]) * f.D, sizeof(float) * n[b] * f.D);
        CHECK_OK(mha_forward_cached(f.L, c, ys, NULL, xs, T, n, NULL));
        for (int b = 0; b < 3; b++) {
            memcpy(y + ((size_t)b * f.T + done[b]) * f.D, ys + (size_t)b * T * f.D, sizeof(float) * n[b] * f.D);
            for (int i = n[b] * f.D; i < T * f.D; i++) CHECK(ys[(size_t)b * T * f.D + i] == 0.0f);
            done[b] += n[b];
            CHECK_INT(mha_cache_length(c, b), done[b]);
        }
        free(xs), free(ys);
        round++;
    }
    /* each sequence alone through the reference */
    for (int b = 0; b < 3; b++) {
        fixture one = f;
        one.B = 1, one.T = len[b];
        float *yr = naive_alloc_floats((size_t)len[b] * f.D), *y16 = naive_alloc_floats((size_t)len[b] * f.D);
        double tol16;
        reference(yr, NULL, y16, &tol16, &one, x + (size_t)b * f.T * f.D, -1);
        CHECK_ARRAY_NEAR(y + (size_t)b * f.T * f.D, y16, (size_t)len[b] * f.D, tol16);
        free(yr), free(y16);
    }
    mha_cache_free(c);
    free(x), free(y);
    fixture_free(&f);
}

/* ------------------------------------------------------------ truncate */

/* Decode 6 speculative tokens, roll back 4 of them, continue with other
 * tokens: equals the reference over the accepted sequence. */
static void test_truncate_then_continue(void) {
    fixture f;
    fixture_make(&f, 1, 40, 16, 4, 4, 4, 0, 0, 21);
    uint64_t seed = 17;
    float *x = dyadic(naive_random_floats((size_t)f.T * f.D, &seed, -1.0f, 1.0f), (size_t)f.T * f.D);
    float *junk = naive_random_floats((size_t)6 * f.D, &seed, -3.0f, 3.0f);
    float *yr = naive_alloc_floats((size_t)f.T * f.D), *yc = naive_alloc_floats((size_t)f.T * f.D);
    float *ys = naive_alloc_floats((size_t)6 * f.D);
    double tol = reference(yr, NULL, NULL, NULL, &f, x, -1);
    mha_cache *c = NULL;
    CHECK_OK(mha_cache_create(&c, f.L, 1, 40, MHA_CACHE_F32, 0));
    if (c) {
        CHECK_OK(mha_forward_cached(f.L, c, yc, NULL, x, 22, NULL, NULL));
        /* accept 2 of 6 speculative tokens: they equal x[22], x[23] */
        memcpy(junk, x + (size_t)22 * f.D, sizeof(float) * 2 * f.D);
        CHECK_OK(mha_forward_cached(f.L, c, ys, NULL, junk, 6, NULL, NULL));
        CHECK_INT(mha_cache_length(c, 0), 28);
        CHECK_OK(mha_cache_truncate(c, 0, 24));
        CHECK_INT(mha_cache_length(c, 0), 24);
        memcpy(yc + (size_t)22 * f.D, ys, sizeof(float) * 2 * f.D);
        for (int t = 24; t < f.T; t++)
            CHECK_OK(mha_forward_cached(f.L, c, yc + (size_t)t * f.D, NULL, x + (size_t)t * f.D, 1, NULL, NULL));
        CHECK_ARRAY_NEAR(yc, yr, (size_t)f.T * f.D, tol);
        /* reset starts over */
        CHECK_OK(mha_cache_reset(c, -1));
        CHECK_INT(mha_cache_length(c, 0), 0);
        CHECK_OK(mha_forward_cached(f.L, c, yc, NULL, x, 10, NULL, NULL));
        CHECK_ARRAY_NEAR(yc, yr, (size_t)10 * f.D, tol);
    }
    mha_cache_free(c);
    free(x), free(junk), free(yr), free(yc), free(ys);
    fixture_free(&f);
}

/* -------------------------------------------------------------- window */

/* A ring of `cap` slots keeping the last W tokens vs the reference with
 * window_left = W - 1: a long prefill (split into pieces inside), decode
 * steps that wrap the ring, and a truncate inside the ring. */
static void window_case(mha_cache_dtype dt, int h_kv, int cap, int W, int T, int prefill) {
    fixture f;
    fixture_make(&f, 2, T, 16, 4, h_kv, 8, 0, 0, 31);
    uint64_t seed = 19;
    float *x = dyadic(naive_random_floats((size_t)f.B * f.T * f.D, &seed, -1.0f, 1.0f), (size_t)f.B * f.T * f.D);
    size_t ny = (size_t)f.B * f.T * f.D;
    float *yr = naive_alloc_floats(ny), *yc = naive_alloc_floats(ny), *y16 = naive_alloc_floats(ny);
    double tol16, tol = reference(yr, NULL, y16, &tol16, &f, x, W - 1);
    double t = dt == MHA_CACHE_F16 ? tol16 : tol;
    const float *want = dt == MHA_CACHE_F16 ? y16 : yr; /* (B,T,D) */
    mha_cache *c = NULL;
    CHECK_OK(mha_cache_create(&c, f.L, f.B, cap, dt, W));
    int steps[400];
    steps[0] = prefill;
    for (int i = 1; i < 400; i++) steps[i] = i % 5 == 0 ? 3 : 1;
    if (c) run_cached(yc, NULL, &f, c, x, steps, 400, NULL);
    CHECK_ARRAY_NEAR(yc, want, ny, t);
    CHECK_INT(mha_cache_length(c, 0), f.T);
    /* slots: the capacity in whole chunks of MHA_DECODE_CHUNK */
    size_t slots = (size_t)(cap + MHA_DECODE_CHUNK - 1) / MHA_DECODE_CHUNK * MHA_DECODE_CHUNK;
    CHECK_INT(mha_cache_bytes(c), (size_t)f.B * slots * h_kv * 16 * (dt == MHA_CACHE_F16 ? 2 : 4));
    int back = cap - W + 1; /* the most a ring can roll back */
    if (c) {
        CHECK_OK(mha_cache_truncate(c, 0, f.T - back));
        CHECK_OK(mha_cache_truncate(c, 1, f.T - back));
        float *xs = naive_alloc_floats((size_t)f.B * back * f.D), *ys = naive_alloc_floats((size_t)f.B * back * f.D);
        for (int b = 0; b < f.B; b++)
            memcpy(xs + (size_t)b * back * f.D, x + ((size_t)b * f.T + f.T - back) * f.D, sizeof(float) * back * f.D);
        CHECK_OK(mha_forward_cached(f.L, c, ys, NULL, xs, back, NULL, NULL));
        for (int b = 0; b < f.B; b++)
            CHECK_ARRAY_NEAR(ys + (size_t)b * back * f.D, want + ((size_t)b * f.T + f.T - back) * f.D,
                             (size_t)back * f.D, t);
        free(xs), free(ys);
        /* too far back: the window of the next token was overwritten */
        CHECK_STATUS(mha_cache_truncate(c, 0, f.T - back - 1), MHA_E_ARG);
        CHECK_ERROR_MENTIONS("window");
    }
    mha_cache_free(c);
    free(x), free(yr), free(yc), free(y16);
    fixture_free(&f);
}

/* a ring inside one chunk; a ring of several chunks (MHA_DECODE_CHUNK) */
static void test_window_f32(void) {
    window_case(MHA_CACHE_F32, 2, 21, 16, 130, 47);
    CHECK(300 > 2 * MHA_DECODE_CHUNK);
    window_case(MHA_CACHE_F32, 4, 300, 200, 700, 450);
}
static void test_window_f16(void) { window_case(MHA_CACHE_F16, 1, 21, 16, 130, 47); }

/* window_left in the options on a cache without window. */
static void test_window_option(void) {
    fixture f;
    fixture_make(&f, 1, 90, 16, 4, 4, 4, 0, 0, 37);
    uint64_t seed = 23;
    float *x = dyadic(naive_random_floats((size_t)f.T * f.D, &seed, -1.0f, 1.0f), (size_t)f.T * f.D);
    float *yr = naive_alloc_floats((size_t)f.T * f.D), *yc = naive_alloc_floats((size_t)f.T * f.D);
    double tol = reference(yr, NULL, NULL, NULL, &f, x, 9);
    mha_cache *c = NULL;
    CHECK_OK(mha_cache_create(&c, f.L, 1, 90, MHA_CACHE_F32, 0));
    mha_options o = mha_options_default();
    o.window_left = 9;
    int steps[] = {70, 1, 1, 1, 17};
    if (c) run_cached(yc, NULL, &f, c, x, steps, 5, &o);
    CHECK_ARRAY_NEAR(yc, yr, (size_t)f.T * f.D, tol);
    mha_cache_free(c);
    free(x), free(yr), free(yc);
    fixture_free(&f);
}

/* ------------------------------------------------------- interventions */

/* Interventions applied at every decode step equal the reference forward
 * with the same interventions (REPLACE values sliced per position); the
 * contributions captured during decode sum (with b_O) to y. */
static void test_interventions_during_decode(void) {
    fixture f;
    fixture_make(&f, 2, 30, 16, 4, 2, 4, 0, 0, 41);
    uint64_t seed = 29;
    size_t ny = (size_t)f.B * f.T * f.D;
    float *x = dyadic(naive_random_floats(ny, &seed, -1.0f, 1.0f), ny);
    float *val = naive_random_floats((size_t)f.B * f.T * f.d_v, &seed, -1.0f, 1.0f);
    mha_intervention iv[4] = {{MHA_HEAD_KEEP, 0, NULL}, {MHA_HEAD_ZERO, 0, NULL},
                              {MHA_HEAD_SCALE, -2.5f, NULL}, {MHA_HEAD_REPLACE, 0, val}};
    mha_options ro = causal_ref(-1);
    ro.interventions = iv;
    float *yr = naive_alloc_floats(ny), *yc = naive_alloc_floats(ny);
    CHECK_OK(mha_forward(f.L, yr, NULL, x, NULL, f.B, f.T, f.T, &ro));
    double tol = reference(yc, NULL, NULL, NULL, &f, x, -1); /* fp32 rule of this layer */
    mha_cache *c = NULL;
    CHECK_OK(mha_cache_create(&c, f.L, f.B, f.T, MHA_CACHE_F32, 0));
    float *xs = naive_alloc_floats((size_t)f.B * f.D), *ys = naive_alloc_floats((size_t)f.B * f.D);
    float *vs = naive_alloc_floats((size_t)f.B * f.d_v);
    float *contrib = naive_alloc_floats((size_t)f.h * f.B * f.D);
    for (int t = 0; c && t < f.T; t++) {
        for (int b = 0; b < f.B; b++) {
            memcpy(xs + (size_t)b * f.D, x + ((size_t)b * f.T + t) * f.D, sizeof(float) * f.D);
            memcpy(vs + (size_t)b * f.d_v, val + ((size_t)b * f.T + t) * f.d_v, sizeof(float) * f.d_v);
        }
        mha_intervention ivs[4];
        memcpy(ivs, iv, sizeof ivs);
        ivs[3].value = vs;
        mha_options o = mha_options_default();
        o.interventions = ivs;
        mha_capture cap = {NULL, contrib, NULL};
        CHECK_OK(mha_forward_cached(f.L, c, ys, &cap, xs, 1, NULL, &o));
        for (int b = 0; b < f.B; b++) {
            memcpy(yc + ((size_t)b * f.T + t) * f.D, ys + (size_t)b * f.D, sizeof(float) * f.D);
            for (int e = 0; e < f.D; e++) {
                double s = f.w.b_o[e];
                for (int r = 0; r < f.h; r++) s += contrib[((size_t)r * f.B + b) * f.D + e];
                CHECK_NEAR(s, ys[(size_t)b * f.D + e], 1e-5);
            }
        }
        /* head 1 is zeroed: its contribution is exactly 0 */
        for (int i = 0; i < f.B * f.D; i++) CHECK(contrib[(size_t)1 * f.B * f.D + i] == 0.0f);
    }
    CHECK_ARRAY_NEAR(yc, yr, ny, tol);

    /* MEAN averages over the rows of the call: a prefill of the whole
     * sequence equals the reference's mean over all positions */
    mha_intervention mean[4] = {{MHA_HEAD_MEAN, 0, NULL}, {MHA_HEAD_KEEP, 0, NULL},
                                {MHA_HEAD_KEEP, 0, NULL}, {MHA_HEAD_MEAN, 0, NULL}};
    ro.interventions = mean;
    CHECK_OK(mha_forward(f.L, yr, NULL, x, NULL, f.B, f.T, f.T, &ro));
    mha_options o = mha_options_default();
    o.interventions = mean;
    CHECK_OK(mha_cache_reset(c, -1));
    CHECK_OK(mha_forward_cached(f.L, c, yc, NULL, x, f.T, NULL, &o));
    CHECK_ARRAY_NEAR(yc, yr, ny, tol);
    mha_cache_free(c);
    free(x), free(val), free(yr), free(yc), free(xs), free(ys), free(vs), free(contrib);
    fixture_free(&f);
}

/* Probabilities captured during decode (column = position) equal the
 * reference's row of the whole-sequence forward. */
static void test_probs_during_decode(void) {
    fixture f;
    fixture_make(&f, 1, 20, 16, 4, 2, 4, 0, 1, 43);
    uint64_t seed = 31;
    float *x = dyadic(naive_random_floats((size_t)f.T * f.D, &seed, -1.0f, 1.0f), (size_t)f.T * f.D);
    int Sx = f.T + 2;
    float *pr = naive_alloc_floats((size_t)f.h * f.T * Sx), *y = naive_alloc_floats((size_t)f.T * f.D);
    mha_options ro = causal_ref(-1);
    mha_capture rc = {NULL, NULL, pr};
    CHECK_OK(mha_forward(f.L, y, &rc, x, NULL, 1, f.T, f.T, &ro));
    mha_cache *c = NULL;
    int cap = 24; /* probs columns: 24 slots + 2 extra keys */
    CHECK_OK(mha_cache_create(&c, f.L, 1, cap, MHA_CACHE_F32, 0));
    float *pc = naive_alloc_floats((size_t)f.h * 12 * (cap + 2));
    mha_capture cc = {NULL, NULL, pc};
    if (c) {
        CHECK_OK(mha_forward_cached(f.L, c, y, NULL, x, 8, NULL, NULL));
        CHECK_OK(mha_forward_cached(f.L, c, y, &cc, x + (size_t)8 * f.D, 12, NULL, NULL));
    }
    double worst = 0.0;
    for (int r = 0; r < f.h; r++)
        for (int t = 0; t < 12; t++)
            for (int j = 0; j < cap + 2; j++) {
                float got = pc[((size_t)r * 12 + t) * (cap + 2) + j];
                int rj = j < f.T ? j : j < cap ? -1 : f.T + (j - cap);
                float want = rj < 0 ? 0.0f : pr[((size_t)r * f.T + 8 + t) * Sx + rj];
                double d = fabs((double)got - want);
                if (d > worst) worst = d;
            }
    CHECK(worst < 1e-5);
    mha_cache_free(c);
    free(x), free(pr), free(y), free(pc);
    fixture_free(&f);
}

/* ----------------------------------------------------- permutation */

/* Prefill, permute the layer's heads (groups kept whole), decode: the
 * stale cache is refused; after mha_cache_permute_heads decoding goes on
 * with the outputs of the unpermuted layer. */
static void permute_case(int h_kv) {
    fixture f;
    fixture_make(&f, 1, 40, 16, 4, h_kv, 4, 0, 0, 47);
    uint64_t seed = 37;
    float *x = dyadic(naive_random_floats((size_t)f.T * f.D, &seed, -1.0f, 1.0f), (size_t)f.T * f.D);
    float *yr = naive_alloc_floats((size_t)f.T * f.D), *yc = naive_alloc_floats((size_t)f.T * f.D);
    float *y16 = naive_alloc_floats((size_t)f.T * f.D);
    double tol16;
    reference(yr, NULL, y16, &tol16, &f, x, -1);
    mha_cache *c = NULL;
    CHECK_OK(mha_cache_create(&c, f.L, 1, f.T, MHA_CACHE_F16, 0));
    int perm_mha[4] = {2, 0, 3, 1}, perm_gqa[4] = {3, 2, 0, 1}; /* gqa: groups {2,3},{0,1} swap */
    const int *perm = h_kv == 4 ? perm_mha : perm_gqa;
    if (c) {
        CHECK_OK(mha_forward_cached(f.L, c, yc, NULL, x, 25, NULL, NULL));
        CHECK_OK(mha_layer_permute_heads(f.L, perm));
        CHECK_STATUS(mha_forward_cached(f.L, c, yc + (size_t)25 * f.D, NULL, x + (size_t)25 * f.D, 1, NULL, NULL),
                     MHA_E_CONTRACT);
        CHECK_ERROR_MENTIONS("mha_cache_permute_heads");
        CHECK_INT(mha_cache_length(c, 0), 25); /* refused: nothing appended */
        CHECK_OK(mha_cache_permute_heads(c, perm));
        for (int t = 25; t < f.T; t++)
            CHECK_OK(mha_forward_cached(f.L, c, yc + (size_t)t * f.D, NULL, x + (size_t)t * f.D, 1, NULL, NULL));
        CHECK_ARRAY_NEAR(yc, y16, (size_t)f.T * f.D, tol16);
        /* a perm that splits a kv group is refused */
        if (h_kv == 2) {
            int bad[4] = {0, 2, 1, 3};
            CHECK_STATUS(mha_cache_permute_heads(c, bad), MHA_E_ARG);
            CHECK_ERROR_MENTIONS("groups");
        }
    }
    mha_cache_free(c);
    free(x), free(yr), free(yc), free(y16);
    fixture_free(&f);
}

static void test_permute_live_cache_mha(void) { permute_case(4); }
static void test_permute_live_cache_gqa(void) { permute_case(2); }

/* -------------------------------------------------------- threads */

/* 1 and 2 threads give the same bits: prefill and decode, MHA and MQA,
 * fp32 and fp16 (the chunk split does not depend on the thread count). */
static void test_threads_bit_identical(void) {
    for (int v = 0; v < 5; v++) { /* h_kv 1: 8 rows a token, prompts and 4-token steps run grouped */
        int h_kv = v == 0 ? 8 : v == 1 ? 2 : 1;
        mha_cache_dtype dt = v == 1 || v == 3 ? MHA_CACHE_F16 : v == 4 ? MHA_CACHE_I8 : MHA_CACHE_F32;
        fixture f;
        fixture_make(&f, 2, 150, 64, 8, h_kv, 8, 0, 0, 53 + v);
        uint64_t seed = 41;
        size_t ny = (size_t)f.B * f.T * f.D;
        float *x = dyadic(naive_random_floats(ny, &seed, -1.0f, 1.0f), ny);
        float *y[2] = {naive_alloc_floats(ny), naive_alloc_floats(ny)};
        int steps[] = {140, 1, 1, 1, 4, 1, 1, 1};
        mha_decode_set_min_parallel_work(0.0); /* tiny shapes: threads anyway */
        for (int th = 0; th < 2; th++) {
            mha_set_num_threads(th + 1);
            mha_cache *c = NULL;
            CHECK_OK(mha_cache_create(&c, f.L, f.B, f.T, dt, 0));
            if (c) run_cached(y[th], NULL, &f, c, x, steps, 8, NULL);
            mha_cache_free(c);
        }
        mha_set_num_threads(0);
        mha_decode_set_min_parallel_work(262144.0);
        CHECK(memcmp(y[0], y[1], ny * sizeof(float)) == 0);
        free(x), free(y[0]), free(y[1]);
        fixture_free(&f);
    }
}

/* ---------------------------------------------------- long contexts */

/* Units of few rows over many chunks fold several chunks per task
 * (decode.c unit_group): L = 4608 (36 chunks: folds of 2) and 8320 (65:
 * folds of 4, the last of 1), 1 and 4 rows per kv head, fp32 / fp16 /
 * int8. One query per head after L appended keys: the same bits on 1, 2
 * and 3 threads and for the sequence alone or beside a shorter one (the
 * fold depends on the unit alone); fp32 and fp16 within 1e-7 of a double
 * softmax over the stored K/V (fp16: rounded by the tests' own rounding). */
static void test_long_context_folds(void) {
    enum { D = 32, H = 8, DK = 8, SHORT = 700 };
    for (int v = 0; v < 12; v++) {
        const int L = v % 2 ? 8320 : 4608, h_kv = v / 2 % 2 ? 2 : 8;
        const mha_cache_dtype dt = v < 4 ? MHA_CACHE_F32 : v < 8 ? MHA_CACHE_F16 : MHA_CACHE_I8;
        fixture f;
        fixture_make(&f, 1, 1, D, H, h_kv, DK, 0, 0, 91 + v);
        uint64_t seed = 97 + v;
        const size_t kw = (size_t)h_kv * DK, nkv = 2 * (size_t)L * kw, zw = (size_t)H * DK;
        float *k = naive_random_floats(nkv, &seed, -1.0f, 1.0f), *val = naive_random_floats(nkv, &seed, -1.0f, 1.0f);
        float *q = naive_random_floats(2 * zw, &seed, -1.0f, 1.0f), *z[4];
        mha_decode_set_min_parallel_work(0.0); /* threads at any size */
        for (int run = 0; run < 4; run++) { /* 1, 2, 3 threads alone; 2 threads beside a shorter sequence */
            const int B = run == 3 ? 2 : 1, n_new[2] = {L, SHORT};
            z[run] = naive_alloc_floats(2 * zw);
            mha_set_num_threads(run == 3 ? 2 : run + 1);
            mha_cache *c = NULL;
            CHECK_OK(mha_cache_create(&c, f.L, B, L, dt, 0));
            if (c) CHECK_OK(mha_cache_append(c, k, val, L, B == 2 ? n_new : NULL));
            if (c) CHECK_OK(mha_cache_attend(c, z[run], q, 1, NULL, 0.0f));
            mha_cache_free(c);
        }
        mha_set_num_threads(0);
        mha_decode_set_min_parallel_work(262144.0);
        for (int run = 1; run < 4; run++) CHECK(memcmp(z[0], z[run], sizeof(float) * zw) == 0);
        if (dt != MHA_CACHE_I8) {
            for (size_t i = 0; dt == MHA_CACHE_F16 && i < (size_t)L * kw; i++)
                k[i] = naive_round_f16(k[i]), val[i] = naive_round_f16(val[i]);
            double ref[H * DK];
            naive_cache_attend(ref, NULL, q, k, val, 1, 1, L, L - 1, H, h_kv, DK, DK, -1, 1);
            double worst = 0.0;
            for (size_t i = 0; i < zw; i++) worst = fmax(worst, fabs(z[0][i] - ref[i]));
            CHECK(worst <= 1e-7);
        }
        for (int run = 0; run < 4; run++) free(z[run]);
        free(k), free(val), free(q);
        fixture_free(&f);
    }
}

/* ------------------------------------------------- prefetch policy */

/* The bursts and the stream prefetch tunings, into L1 or L2 (decode.c),
 * give the same bits: MHA (one row: the stream prefetches fp32 too), GQA
 * (4 rows), MQA (grouped), fp32 / fp16 / int8 (and fp16 MHA, which the
 * AVX2 table streams), a cache of several chunks, 1 and 2 threads. */
static void test_prefetch_policy_bits(void) {
    for (int v = 0; v < 7; v++) {
        const int h_kv = v % 3 == 0 ? 8 : v % 3 == 1 ? 2 : 1;
        const mha_cache_dtype dt = v < 3 ? MHA_CACHE_F32 : v == 3 ? MHA_CACHE_I8 : MHA_CACHE_F16;
        fixture f;
        fixture_make(&f, 1, 300, 64, 8, h_kv, 64, 0, 0, 71 + v);
        uint64_t seed = 43;
        size_t ny = (size_t)f.B * f.T * f.D;
        float *x = dyadic(naive_random_floats(ny, &seed, -1.0f, 1.0f), ny);
        float *y[6];
        int steps[] = {290, 1, 1, 1, 4, 1, 1, 1};
        mha_decode_set_min_parallel_work(0.0);
        const int policy[3] = {MHA_DECODE_PF_BURSTS, MHA_DECODE_PF_STREAM, MHA_DECODE_PF_STREAM_L2};
        for (int r = 0; r < 6; r++) { /* policy r % 3, r / 3 + 1 threads */
            y[r] = naive_alloc_floats(ny);
            mha_decode_force_prefetch_policy(policy[r % 3]);
            mha_set_num_threads(r / 3 + 1);
            mha_cache *c = NULL;
            CHECK_OK(mha_cache_create(&c, f.L, f.B, f.T, dt, 0));
            if (c) run_cached(y[r], NULL, &f, c, x, steps, 8, NULL);
            mha_cache_free(c);
        }
        mha_decode_force_prefetch_policy(-1);
        mha_set_num_threads(0);
        mha_decode_set_min_parallel_work(262144.0);
        for (int r = 1; r < 6; r++) CHECK(memcmp(y[0], y[r], ny * sizeof(float)) == 0);
        for (int r = 0; r < 6; r++) free(y[r]);
        free(x);
        fixture_free(&f);
    }
}

/* The L1D of CPU 0 in KiB as Linux's sysfs reports it (index entries of
 * level 1, type Data), 0 where it does not: a source apart from the
 * library's CPUID reading. */
static unsigned sysfs_l1d_kib(void) {
    for (int i = 0; i < 8; i++) {
        char path[96], level[16] = "", type[32] = "", size[32] = "";
        const char *field[3] = {"level", "type", "size"};
        char *out[3] = {level, type, size};
        for (int f = 0; f < 3; f++) {
            snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/%s", i, field[f]);
            FILE *fp = fopen(path, "r");
            if (!fp) return 0;
            if (!fgets(out[f], 16, fp)) out[f][0] = 0;
            fclose(fp);
        }
        if (atoi(level) == 1 && strncmp(type, "Data", 4) == 0) return (unsigned)atoi(size); /* "48K" */
    }
    return 0;
}

/* The policy follows the CPU: the bursts on AMD before Zen (family
 * 0x17), else the stream, into L2 where the L1D holds less than 48 KiB
 * (family from CPUID and the L1D from sysfs, read here apart from the
 * library; the library's L1D reading is checked against sysfs too). */
static void test_prefetch_policy_cpu(void) {
    const unsigned family = test_amd_family(), l1d_kib = sysfs_l1d_kib();
    if (l1d_kib > 0) CHECK(mha_cpu_l1d_kib() == l1d_kib);
    int want = l1d_kib > 0 && l1d_kib < 48 ? MHA_DECODE_PF_STREAM_L2 : MHA_DECODE_PF_STREAM;
    if (family > 0 && family < 0x17) want = MHA_DECODE_PF_BURSTS;
    if (l1d_kib == 0 && mha_cpu_l1d_kib() > 0) want = mha_decode_prefetch_policy(); /* no sysfs: nothing to compare */
    mha_decode_force_prefetch_policy(-1);
    CHECK(mha_decode_prefetch_policy() == want);
    mha_decode_force_prefetch_policy(MHA_DECODE_PF_STREAM);
    CHECK(mha_decode_prefetch_policy() == MHA_DECODE_PF_STREAM);
    mha_decode_force_prefetch_policy(MHA_DECODE_PF_STREAM_L2);
    CHECK(mha_decode_prefetch_policy() == MHA_DECODE_PF_STREAM_L2);
    mha_decode_force_prefetch_policy(MHA_DECODE_PF_BURSTS);
    CHECK(mha_decode_prefetch_policy() == MHA_DECODE_PF_BURSTS);
    mha_decode_force_prefetch_policy(-1);
}

/* The AVX-512 kernels walk a prefetch stream: one line per loop step
 * with per = 1 (one row, d 64, 128 keys: the scores 2 x 64 steps, the
 * values 128), stopping at its end, and report where they stopped;
 * into L1 or L2 alike. */
static void test_prefetch_stream(void) {
    if (!mha_cpu_has_avx512()) SKIP(TEST_SKIP_ISA, "avx512f", "no AVX-512: no prefetch stream");
    const mha_decode_kernels *kr = &mha_decode_kernels_avx512;
    enum { N = 128, D = 64 };
    static char buf[64 * 1024] __attribute__((aligned(64)));
    float *q = naive_alloc_floats(D), *k = naive_alloc_floats((size_t)N * D), *s = naive_alloc_floats(N);
    float *acc = naive_alloc_floats(D);
    for (int l2 = 0; l2 < 2; l2++) {
        kr->prefetch_stream(buf, buf + sizeof buf, 1, l2);
        kr->scores(s, N, q, D, k, 1, N, D);
        CHECK(kr->prefetch_stream(buf, buf + sizeof buf, 1, l2) == buf + 64 * 2 * D);
        kr->accumulate(acc, D, s, N, k, 1, N, D);
        CHECK(kr->prefetch_stream(buf, buf + 4096, 1, l2) == buf + 64 * N);
        kr->scores(s, N, q, D, k, 1, N, D); /* 128 steps, 64 lines */
        CHECK(kr->prefetch_stream(NULL, NULL, 0, l2) == buf + 4096);
    }
    free(q), free(k), free(s), free(acc);
}

/* The AVX2 kernels walk the stream too (round 33): for every storage of
 * K and V, 1-9 rows, 8-128 keys and odd head sizes, the lines a scores
 * and an accumulate call consume with per = 1 are the steps the table's
 * prefetch_steps counts (over which decode.c spreads a chunk), and the
 * kernels give the same bits with the stream as without it. */
static void test_prefetch_steps_avx2(void) {
    if (!mha_cpu_has_avx2()) SKIP(TEST_SKIP_ISA, "avx2", "this CPU has no AVX2");
    const mha_decode_kernels *kr = &mha_decode_kernels_avx2;
    CHECK(kr->prefetch_stream && kr->prefetch_steps && kr->prefetch_streams);
    if (!kr->prefetch_stream || !kr->prefetch_steps) return;
    enum { NK = 128, DMAX = 104, LINES = 1 << 14 };
    static char buf[64 * LINES] __attribute__((aligned(64)));
    const int nks[3] = {8, 24, NK}, dks[3] = {8, 40, 72}, dvs[3] = {8, 64, 104};
    uint64_t seed = 7;
    float *q = naive_random_floats(9 * DMAX, &seed, -1.0f, 1.0f), *k = naive_random_floats((size_t)NK * DMAX, &seed, -1.0f, 1.0f);
    float *w = naive_random_floats(9 * NK, &seed, 0.0f, 1.0f), *sc = naive_random_floats((size_t)NK * 4, &seed, 0.01f, 0.1f);
    float *s[2] = {naive_alloc_floats(9 * NK), naive_alloc_floats(9 * NK)};
    float *acc[2] = {naive_alloc_floats(9 * DMAX), naive_alloc_floats(9 * DMAX)};
    uint16_t *kh = calloc((size_t)NK * DMAX, sizeof *kh);
    int8_t *kq = calloc((size_t)NK * DMAX, 1);
    for (size_t i = 0; i < (size_t)NK * DMAX; i++) {
        kh[i] = (uint16_t)(0x3800 + (i * 37) % 0x800); /* fp16 0.5 .. 1 */
        kq[i] = (int8_t)((int)(i * 29 % 255) - 127);
    }
    int bad = 0;
    for (int kt = 0; kt < 3; kt++)
        for (int vt = 0; vt < 3; vt++)
            for (int m = 1; m <= 9; m++)
                for (int c = 0; c < 27; c++) {
                    const int nk = nks[c % 3], dk = dks[c / 3 % 3], dv = dvs[c / 9];
                    for (int with = 0; with < 2; with++) { /* without, then with a stream */
                        kr->prefetch_stream(with ? buf : NULL, with ? buf + sizeof buf : NULL, 1, 1);
                        if (kt == MHA_DK_F32) kr->scores(s[with], NK, q, DMAX, k, m, nk, dk);
                        else if (kt == MHA_DK_F16) kr->scores_h(s[with], NK, q, DMAX, kh, m, nk, dk);
                        else kr->scores_q8(s[with], NK, q, DMAX, kq, sc, m, nk, dk);
                        if (vt == MHA_DK_F32) kr->accumulate(acc[with], DMAX, w, NK, k, m, nk, dv);
                        else if (vt == MHA_DK_F16) kr->accumulate_h(acc[with], DMAX, w, NK, kh, m, nk, dv);
                        else kr->accumulate_q8(acc[with], DMAX, w, NK, kq, sc, m, nk, dv);
                        const char *end = kr->prefetch_stream(NULL, NULL, 0, 1);
                        const size_t steps = kr->prefetch_steps(m, nk, dk, dv, kt, vt);
                        if (with && (size_t)(end - buf) != 64 * steps && bad++ < 5)
                            fprintf(stderr, "  K %d V %d m %d nk %d d_k %d d_v %d: %zu lines, %zu steps counted\n", kt, vt,
                                    m, nk, dk, dv, (size_t)(end - buf) / 64, steps);
                    }
                    for (int i = 0; i < m; i++) {
                        bad += memcmp(s[0] + (size_t)i * NK, s[1] + (size_t)i * NK, sizeof(float) * nk) != 0;
                        bad += memcmp(acc[0] + (size_t)i * DMAX, acc[1] + (size_t)i * DMAX, sizeof(float) * dv) != 0;
                    }
                }
    CHECK(bad == 0);
    free(q), free(k), free(w), free(s[0]), free(s[1]), free(acc[0]), free(acc[1]), free(sc), free(kh), free(kq);
}

/* ---------------------------------------------- prefill on mha_gemm */

/* K of sequence b, kv head g, positions 0..n-1 as stored in an fp32 cache:
 * out (n, d_k). */
static void read_k(float *out, const mha_cache *c, int b, int g, int n) {
    size_t kv = mha_cache_kv_index(c, b, g);
    for (int p = 0; p < n; p++)
        for (int d = 0; d < c->d_k; d++)
            out[(size_t)p * c->d_k + d] =
                ((const float *)c->data)[mha_cache_k_off(c, kv, p) + (size_t)d * MHA_KPANEL];
}

/* Which projection ran is visible in the bits of the cached keys when
 * d_model > 256: decode_gemm's one-row stream adds partial sums of 256
 * inputs, mha_gemm sums all inputs in order. A prompt (N >= the
 * threshold) must give mha_gemm's bits, a one-row decode step
 * decode_gemm's (each computed here with that routine on the same x, and
 * each differing from the other somewhere, or the check proves nothing).
 * The one-row step is bit-identical for 1 and 2 threads too. */
static void test_prefill_branch_bits(void) {
    enum { P = 16, D = 320 };
    CHECK(P >= MHA_PREFILL_MIN_ROWS && 1 < MHA_PREFILL_MIN_ROWS);
    fixture f;
    fixture_make(&f, 1, P + 1, D, 4, 2, 8, 0, 0, 83);
    uint64_t seed = 79;
    size_t ny = (size_t)f.T * D;
    int wq = f.h * f.d_k, wk = f.h_kv * f.d_k, wv = f.h_kv * f.d_v;
    float *x = naive_random_floats(ny, &seed, -1.0f, 1.0f); /* not dyadic: the branches must round differently */
    float *y[2] = {naive_alloc_floats(ny), naive_alloc_floats(ny)};
    float *q = naive_alloc_floats((size_t)f.T * wq), *kg = naive_alloc_floats((size_t)f.T * wk);
    float *v = naive_alloc_floats((size_t)f.T * wv), *ks = naive_alloc_floats((size_t)f.T * wk);
    float *kc = naive_alloc_floats((size_t)f.T * f.d_k);
    const mha_packed *pk = mha_fast_packed_qkv(f.L);
    CHECK(pk != NULL && mha_fast_packed_o(f.L) != NULL);
    if (pk) { /* every row both ways */
        const mha_dst dst[3] = {{MHA_DST_ROWS, q, (size_t)wq, 0, 0, 0, 0},
                                {MHA_DST_ROWS, kg, (size_t)wk, 0, 0, 0, 0},
                                {MHA_DST_ROWS, v, (size_t)wv, 0, 0, 0, 0}};
        const mha_gemm_args g = {dst, x, (size_t)D, f.T, pk, 0, 3, 0, D, 1, 0};
        CHECK_OK(mha_gemm(&g, mha_kernels_get(), 1));
    }
    mha_exec ex;
    CHECK_OK(mha_exec_resolve(&ex, NULL));
    for (int t = 0; t < f.T; t++)
        CHECK_OK(mha_decode_gemm(&ex, ks + (size_t)t * wk, x + (size_t)t * D, f.w.w_k, f.w.b_k, 1, D, wk));
    int steps[] = {P, 1};
    mha_decode_set_min_parallel_work(0.0); /* tiny shapes: threads anyway */
    for (int th = 0; th < 2; th++) {
        mha_set_num_threads(th + 1);
        mha_cache *c = NULL;
        CHECK_OK(mha_cache_create(&c, f.L, 1, f.T, MHA_CACHE_F32, 0));
        if (c) run_cached(y[th], NULL, &f, c, x, steps, 2, NULL);
        for (int g = 0; c && pk && g < f.h_kv; g++) {
            read_k(kc, c, 0, g, f.T);
            int as_gemm = 1, as_stream = 1, differ = 0;
            for (int p = 0; p < f.T; p++)
                for (int d = 0; d < f.d_k; d++) {
                    float got = kc[(size_t)p * f.d_k + d];
                    size_t at = (size_t)p * wk + (size_t)g * f.d_k + d;
                    float eg = kg[at], es = ks[at];
                    differ |= eg != es;
                    if (p < P) as_gemm &= got == eg;
                    else as_stream &= got == es;
                }
            CHECK(differ && as_gemm && as_stream);
        }
        mha_cache_free(c);
    }
    mha_set_num_threads(0);
    mha_decode_set_min_parallel_work(262144.0);
    CHECK(memcmp(y[0], y[1], ny * sizeof(float)) == 0);
    free(x), free(y[0]), free(y[1]), free(q), free(kg), free(v), free(ks), free(kc);
    fixture_free(&f);
}

/* A prompt long enough for the packed projections, then decode rows and a
 * few rows, against the reference for MHA, GQA, MQA in fp32 and fp16; 1
 * and 2 threads give identical bits; the contributions captured in the
 * prompt (W_O's packed rows per head) equal the reference's. */
static void test_prefill_fast_gemm(void) {
    enum { P = 64 }; /* prompt rows per sequence */
    CHECK(P >= MHA_PREFILL_MIN_ROWS);
    for (int v = 0; v < 6; v++) {
        int h_kv = v % 3 == 0 ? 8 : v % 3 == 1 ? 2 : 1;
        mha_cache_dtype dt = v < 3 ? MHA_CACHE_F32 : MHA_CACHE_F16;
        fixture f;
        fixture_make(&f, 2, P + 6, 32, 8, h_kv, 8, 0, 0, 71 + v);
        uint64_t seed = 61 + v;
        size_t ny = (size_t)f.B * f.T * f.D, nc = (size_t)f.h * f.B * P * f.D;
        float *x = dyadic(naive_random_floats(ny, &seed, -1.0f, 1.0f), ny);
        float *yr = naive_alloc_floats(ny), *y[2] = {naive_alloc_floats(ny), naive_alloc_floats(ny)};
        float *y16 = naive_alloc_floats(ny);
        double tol16, tol = reference(yr, NULL, y16, &tol16, &f, x, -1);
        int steps[] = {P, 1, 5}; /* prompt, one token per sequence, a few */
        mha_decode_set_min_parallel_work(0.0); /* tiny shapes: threads anyway */
        for (int th = 0; th < 2; th++) {
            mha_set_num_threads(th + 1);
            mha_cache *c = NULL;
            CHECK_OK(mha_cache_create(&c, f.L, f.B, f.T, dt, 0));
            if (c) run_cached(y[th], NULL, &f, c, x, steps, 3, NULL);
            mha_cache_free(c);
        }
        mha_set_num_threads(0);
        mha_decode_set_min_parallel_work(262144.0);
        CHECK(memcmp(y[0], y[1], ny * sizeof(float)) == 0);
        CHECK_ARRAY_NEAR(y[0], dt == MHA_CACHE_F16 ? y16 : yr, ny, dt == MHA_CACHE_F16 ? tol16 : tol);
        CHECK(tol < 1e-4);

        if (dt == MHA_CACHE_F32) { /* contributions of the prompt */
            size_t np = (size_t)f.B * P * f.D;
            float *xp = naive_alloc_floats(np), *yp = naive_alloc_floats(np), *ypr = naive_alloc_floats(np);
            float *cr = naive_alloc_floats(nc), *cc = naive_alloc_floats(nc);
            for (int b = 0; b < f.B; b++)
                memcpy(xp + (size_t)b * P * f.D, x + (size_t)b * f.T * f.D, sizeof(float) * P * f.D);
            mha_options ro = causal_ref(-1);
            mha_capture rcap = {NULL, cr, NULL}, ccap = {NULL, cc, NULL};
            CHECK_OK(mha_forward(f.L, ypr, &rcap, xp, NULL, f.B, P, P, &ro));
            mha_cache *c = NULL;
            CHECK_OK(mha_cache_create(&c, f.L, f.B, P, dt, 0));
            if (c) CHECK_OK(mha_forward_cached(f.L, c, yp, &ccap, xp, P, NULL, NULL));
            CHECK_ARRAY_NEAR(cc, cr, nc, tol);
            for (size_t i = 0; i < np; i++) {
                double sum = f.w.b_o[i % f.D];
                for (int r = 0; r < f.h; r++) sum += cc[(size_t)r * np + i];
                CHECK_NEAR(sum, yp[i], 1e-5);
            }
            mha_cache_free(c);
            free(xp), free(yp), free(ypr), free(cr), free(cc);
        }
        free(x), free(yr), free(y[0]), free(y[1]), free(y16);
        fixture_free(&f);
    }
}

/* ------------------------------------------------------------ kernels */

/* binary16 conversion: AVX2 (F16C) and scalar give identical bits on
 * ties, subnormals, overflow and random values; round trip is exact. */
static void test_f16_conversion(void) {
    const mha_decode_kernels *a = &mha_decode_kernels_avx2, *s = &mha_decode_kernels_scalar;
    enum { N = 4096 };
    float *x = naive_alloc_floats(N);
    uint64_t seed = 43;
    test_fill_uniform(x, N, &seed, -2.0f, 2.0f);
    float special[] = {0.0f, -0.0f, 1.0f, 65504.0f, 65519.0f, 65520.0f, 1e6f, -1e6f,
                       0x1p-14f, 0x1p-24f, 0x1p-25f, 0x1.8p-25f, 0x1p-26f, 1e-30f,
                       1.0f + 0x1p-11f, 1.0f + 0x1.8p-11f, 1.0f + 0x3p-11f, 0x1.ffcp-15f,
                       INFINITY, -INFINITY, 3.14159f, -2.71828f, 0x1.0p-20f, 0x1.7p-20f};
    size_t ns = sizeof special / sizeof special[0];
    memcpy(x, special, sizeof special);
    for (int i = (int)ns; i < 2 * (int)ns; i++) x[i] = x[i - ns] * 1.0e-3f; /* more subnormals */
    uint16_t *hs = malloc(2 * N), *ha = malloc(2 * N);
    float *back = naive_alloc_floats(N), *back_a = naive_alloc_floats(N);
    s->to_f16(hs, x, N);
    if (test_machine_has("avx2") && test_machine_has("f16c")) {
        a->to_f16(ha, x, N);
        CHECK(memcmp(hs, ha, 2 * N) == 0);
        a->from_f16(back_a, hs, N);
    }
    s->from_f16(back, hs, N);
    for (int i = 0; i < N; i++) {
        double ax = fabs((double)x[i]);
        if (ax <= 65504.0) /* rounding error: half an ulp (2^-11 relative, 2^-25 absolute) */
            CHECK(fabs((double)back[i] - x[i]) <= fmax(ax * ldexp(1.0, -11), ldexp(1.0, -25)));
        else
            CHECK(isinf(back[i]) || ax < 65520.0);
    }
    if (test_machine_has("avx2") && test_machine_has("f16c"))
        CHECK(memcmp(back, back_a, sizeof(float) * N) == 0);
    int wrong = 0, first = -1; /* against the tests' own rounding, value by value */
    for (int i = 0; i < N; i++)
        if (!(back[i] == naive_round_f16(x[i])) && wrong++ == 0) first = i;
    if (wrong)
        test_report(__FILE__, __LINE__, "%d of %d fp16 roundings differ from naive_round_f16, first x=%a -> %a, want %a",
                    wrong, N, (double)x[first], (double)back[first], (double)naive_round_f16(x[first]));
    CHECK(back[2] == 1.0f && back[8] == 0x1p-14f && back[9] == 0x1p-24f);
    CHECK(back[10] == 0.0f);                  /* 2^-25: tie to even (0) */
    CHECK(back[11] == 0x1p-24f);              /* 1.5 * 2^-25 rounds up */
    CHECK(back[14] == 1.0f);                  /* 1 + 2^-11: tie to even */
    CHECK(back[15] == 1.0f + 0x1p-10f);       /* above the tie */
    free(x), free(hs), free(ha), free(back), free(back_a);
}

/* AVX2 and scalar attention kernels agree on odd shapes (n <= 40): m rows
 * in the AVX2 tiles' groups (7: 4, 2 and 1; 6: 4 and 2), dv = 72: the fp16
 * pairs' 32-column tiles and an 8-column one. */
static void kernels_agree_case(int m, int n, int d, int dv, uint64_t seed) {
    const mha_decode_kernels *a = &mha_decode_kernels_avx2, *s = &mha_decode_kernels_scalar;
    float *q = naive_random_floats((size_t)m * d, &seed, -1, 1), *k = naive_random_floats((size_t)n * d, &seed, -1, 1);
    float *v = naive_random_floats((size_t)n * dv, &seed, -1, 1);
    float *s1 = naive_alloc_floats((size_t)m * 40), *s2 = naive_alloc_floats((size_t)m * 40);
    a->scores(s1, 40, q, d, k, m, n, d);
    s->scores(s2, 40, q, d, k, m, n, d);
    CHECK_ARRAY_NEAR(s1, s2, (size_t)m * 40, 1e-5);
    s1[5] = s2[5] = -INFINITY;
    float mx1[8], mx2[8], l1[8], l2[8];
    a->softmax(s1, 40, mx1, l1, m, n);
    s->softmax(s2, 40, mx2, l2, m, n);
    CHECK_ARRAY_NEAR(s1, s2, (size_t)m * 40, 1e-6);
    CHECK_ARRAY_NEAR(l1, l2, (size_t)m, 1e-5);
    CHECK(s1[5] == 0.0f);
    float *a1 = naive_alloc_floats((size_t)m * dv), *a2 = naive_alloc_floats((size_t)m * dv);
    a->accumulate(a1, dv, s1, 40, v, m, n, dv);
    s->accumulate(a2, dv, s1, 40, v, m, n, dv);
    CHECK_ARRAY_NEAR(a1, a2, (size_t)m * dv, 1e-5);
    /* fp16 kernels = fp32 kernels on the widened data, bit for bit */
    uint16_t *kh = malloc(2 * (size_t)n * d), *vh = malloc(2 * (size_t)n * dv);
    float *kw = naive_alloc_floats((size_t)n * d), *vw = naive_alloc_floats((size_t)n * dv);
    const size_t hn = (size_t)m * (dv > 40 ? dv : 40);
    float *h1 = naive_alloc_floats(hn), *h2 = naive_alloc_floats(hn);
    s->to_f16(kh, k, (size_t)n * d), s->from_f16(kw, kh, (size_t)n * d);
    s->to_f16(vh, v, (size_t)n * dv), s->from_f16(vw, vh, (size_t)n * dv);
    for (int ker = 0; ker < 2; ker++) {
        const mha_decode_kernels *K = ker ? s : a;
        K->scores(h1, 40, q, d, kw, m, n, d);
        K->scores_h(h2, 40, q, d, kh, m, n, d);
        CHECK(memcmp(h1, h2, sizeof(float) * m * 40) == 0);
        K->accumulate(h1, dv, s1, 40, vw, m, n, dv);
        K->accumulate_h(h2, dv, s1, 40, vh, m, n, dv);
        CHECK(memcmp(h1, h2, sizeof(float) * m * dv) == 0);
    }
    free(kh), free(vh), free(kw), free(vw), free(h1), free(h2);
    float *y1 = naive_alloc_floats((size_t)m * dv), *y2 = naive_alloc_floats((size_t)m * dv);
    const int kk = dv < n ? dv : n; /* (m, kk) x (kk, dv): v's first rows */
    a->gemm_tile(y1, dv, v, dv, v, dv, m, kk, dv);
    s->gemm_tile(y2, dv, v, dv, v, dv, m, kk, dv);
    CHECK_ARRAY_NEAR(y1, y2, (size_t)m * dv, 1e-5);
    memset(y1, 0, sizeof(float) * m * dv), memset(y2, 0, sizeof(float) * m * dv);
    a->gemm_stream(y1, dv, v, dv, v, dv, 3, kk, dv);
    s->gemm_stream(y2, dv, v, dv, v, dv, 3, kk, dv);
    CHECK_ARRAY_NEAR(y1, y2, (size_t)3 * dv, 1e-5);
    free(q), free(k), free(v), free(s1), free(s2), free(a1), free(a2), free(y1), free(y2);
}

static void test_kernels_agree(void) {
    if (!__builtin_cpu_supports("avx2")) SKIP(TEST_SKIP_ISA, "avx2", "this CPU has no AVX2");
    if (!__builtin_cpu_supports("fma")) SKIP(TEST_SKIP_ISA, "fma", "this CPU has no FMA");
    kernels_agree_case(7, 24, 13, 19, 47);
    kernels_agree_case(6, 40, 45, 72, 48);
}

/* The grouped-heads kernels (MQA: scores stored keys by rows) against the
 * row-major ones: scores_t and accumulate_t give the scalar table's bits
 * (one fmaf chain in the same order), softmax_t the AVX-512 softmax's max
 * and exponentials, its sum within rounding; a row of only -inf gets
 * mx = -inf, sum 0 and zeros. 32 rows (two vectors) and 13 (one, masked);
 * 40 keys (5 panels: a 16-key tile and an 8-key one; two V key blocks);
 * dv = 72 (a 4-vector column tile, then a masked one); d = 45; fp16
 * storage widened inside the kernels. (int8: cache_i8_attend_mqa32.) */
static void test_grouped_kernels(void) {
    if (!mha_cpu_has_avx512()) SKIP(TEST_SKIP_ISA, "avx512f", "this CPU has no AVX-512");
    const mha_decode_kernels *g = &mha_decode_kernels_avx512, *s = &mha_decode_kernels_scalar;
    enum { N = 40, D = 45, DV = 72, LDT = 32 };
    uint64_t seed = 61;
    float *q = naive_random_floats((size_t)32 * D, &seed, -1, 1), *kp = naive_random_floats((size_t)N * D, &seed, -1, 1);
    float *v = naive_random_floats((size_t)N * DV, &seed, -1, 1), *qt = naive_alloc_floats((size_t)D * LDT);
    float *st = naive_alloc_floats((size_t)N * LDT), *sr = naive_alloc_floats((size_t)32 * N);
    float *a1 = naive_alloc_floats((size_t)32 * DV), *a2 = naive_alloc_floats((size_t)32 * DV);
    uint16_t *kh = malloc(2 * (size_t)N * D), *vh = malloc(2 * (size_t)N * DV);
    float *kw = naive_alloc_floats((size_t)N * D), *vw = naive_alloc_floats((size_t)N * DV);
    float *buf = naive_alloc_floats((size_t)32 * DV + 2 * D * 8);
    for (int i = 0; i < 32; i++)
        for (int c = 0; c < D; c++) qt[(size_t)c * LDT + i] = q[(size_t)i * D + c];
    for (int m = 32; m > 0; m -= 19) {
        g->scores_t(st, LDT, qt, LDT, kp, NULL, 0, NULL, m, N, D);
        s->scores(sr, N, q, D, kp, m, N, D);
        int same = 1;
        for (int i = 0; i < m; i++)
            for (int j = 0; j < N; j++) same &= memcmp(&st[(size_t)j * LDT + i], &sr[(size_t)i * N + j], 4) == 0;
        CHECK(same);
        for (int j = 0; j < N; j++) st[(size_t)j * LDT + 3] = sr[(size_t)3 * N + j] = -INFINITY; /* row 3: no key */
        float mx1[32], mx2[32], l1[32], l2[32];
        g->softmax_t(st, LDT, mx1, l1, m, N);
        g->softmax(sr, N, mx2, l2, m, N);
        for (int i = 0; i < m; i++) {
            for (int j = 0; j < N; j++) same &= memcmp(&st[(size_t)j * LDT + i], &sr[(size_t)i * N + j], 4) == 0;
            CHECK(mx1[i] == mx2[i] || (i == 3 && mx1[i] == -INFINITY));
            CHECK(fabsf(l1[i] - l2[i]) <= 1e-6f * l2[i]);
        }
        CHECK(same);
        CHECK(l1[3] == 0.0f && mx1[3] == -INFINITY && st[3] == 0.0f);
        g->accumulate_t(a1, DV, st, LDT, v, NULL, 0, NULL, m, N, DV);
        s->accumulate(a2, DV, sr, N, v, m, N, DV);
        CHECK(memcmp(a1, a2, sizeof(float) * (size_t)m * DV) == 0);
        /* fp16 storage, widened panel by panel (K) and 32 rows at a time
         * (V): the bits of the fp32 kernels on the widened values */
        s->to_f16(kh, kp, (size_t)N * D), s->from_f16(kw, kh, (size_t)N * D);
        s->to_f16(vh, v, (size_t)N * DV), s->from_f16(vw, vh, (size_t)N * DV);
        g->scores_t(sr, LDT, qt, LDT, kh, NULL, 1, buf, m, N, D);
        g->scores_t(st, LDT, qt, LDT, kw, NULL, 0, NULL, m, N, D);
        for (int j = 0; j < N; j++) same &= memcmp(sr + (size_t)j * LDT, st + (size_t)j * LDT, sizeof(float) * m) == 0;
        CHECK(same);
        g->accumulate_t(a1, DV, st, LDT, vh, NULL, 1, buf, m, N, DV);
        g->accumulate_t(a2, DV, st, LDT, vw, NULL, 0, NULL, m, N, DV);
        CHECK(memcmp(a1, a2, sizeof(float) * (size_t)m * DV) == 0);
    }
    free(q), free(kp), free(v), free(qt), free(st), free(sr), free(a1), free(a2);
    free(kh), free(vh), free(kw), free(vw), free(buf);
}

/* -------------------------------------------- low-level, sizes, errors */

/* append + attend with the caller's own projections equal the cached
 * forward's z. */
/* The projections' tile mode (more than a few rows), which
 * mha_forward_cached reaches only for a layer without packed weights:
 * called directly with m = 37 rows (two row blocks), n = 150 columns
 * (three column blocks), against a double product. fp32 accumulation of
 * k terms errs by at most k u sum_i |x_i w_i| (u = 2^-24), plus the bias
 * add; the same bits on 1 and 3 threads and with the scalar kernels. */
static void test_decode_gemm_tile_mode(void) {
    enum { M = 37, K = 70, N = 150 };
    uint64_t seed = 83;
    float *x = naive_random_floats((size_t)M * K, &seed, -1.0f, 1.0f);
    float *w = naive_random_floats((size_t)K * N, &seed, -1.0f, 1.0f);
    float *b = naive_random_floats(N, &seed, -1.0f, 1.0f);
    float *y[3] = {naive_alloc_floats((size_t)M * N), naive_alloc_floats((size_t)M * N),
                   naive_alloc_floats((size_t)M * N)};
    for (int with_bias = 0; with_bias < 2; with_bias++) {
        const float *bb = with_bias ? b : NULL;
        mha_exec ex; /* the call's choices, set by hand: threads, ISA */
        CHECK_OK(mha_exec_resolve(&ex, NULL));
        ex.min_parallel_work = 0.0;
        ex.n_threads = 1;
        CHECK_OK(mha_decode_gemm(&ex, y[0], x, w, bb, M, K, N));
        ex.n_threads = 3;
        CHECK_OK(mha_decode_gemm(&ex, y[1], x, w, bb, M, K, N));
        mha_decode_force_scalar(1);
        CHECK_OK(mha_exec_resolve(&ex, NULL));
        mha_decode_force_scalar(0);
        CHECK_OK(mha_decode_gemm(&ex, y[2], x, w, bb, M, K, N));
        CHECK(memcmp(y[0], y[1], sizeof(float) * M * N) == 0);
        double worst = 0.0; /* max over entries of |y - exact| / bound */
        for (int kind = 0; kind < 3; kind += 2)
            for (int i = 0; i < M; i++)
                for (int j = 0; j < N; j++) {
                    double exact = bb ? bb[j] : 0.0, mag = bb ? fabs(bb[j]) : 0.0;
                    for (int e = 0; e < K; e++) {
                        double t = (double)x[(size_t)i * K + e] * w[(size_t)e * N + j];
                        exact += t, mag += fabs(t);
                    }
                    double bound = (K + 1) * ldexp(1.0, -24) * mag + 1e-7;
                    double r = fabs(y[kind][(size_t)i * N + j] - exact) / bound;
                    if (!(r <= worst)) worst = r;
                }
        CHECK(worst <= 1.0);
    }
    free(x), free(w), free(b), free(y[0]), free(y[1]), free(y[2]);
}

static void test_append_attend(void) {
    fixture f;
    fixture_make(&f, 2, 12, 16, 4, 2, 4, 0, 0, 59);
    uint64_t seed = 53;
    size_t rows = (size_t)f.B * f.T;
    float *x = dyadic(naive_random_floats(rows * f.D, &seed, -1.0f, 1.0f), rows * f.D);
    float *q = naive_alloc_floats(rows * f.h * f.d_k), *k = naive_alloc_floats(rows * f.h_kv * f.d_k);
    float *v = naive_alloc_floats(rows * f.h_kv * f.d_v), *z1 = naive_alloc_floats(rows * f.h * f.d_v);
    float *z2 = naive_alloc_floats(rows * f.h * f.d_v), *y = naive_alloc_floats(rows * f.D);
    lin32(q, x, f.w.w_q, f.w.b_q, (int)rows, f.D, f.h * f.d_k);
    lin32(k, x, f.w.w_k, f.w.b_k, (int)rows, f.D, f.h_kv * f.d_k);
    lin32(v, x, f.w.w_v, f.w.b_v, (int)rows, f.D, f.h_kv * f.d_v);
    mha_cache *c1 = NULL, *c2 = NULL;
    CHECK_OK(mha_cache_create(&c1, f.L, f.B, f.T, MHA_CACHE_F32, 0));
    CHECK_OK(mha_cache_create(&c2, f.L, f.B, f.T, MHA_CACHE_F32, 0));
    if (c1 && c2) {
        CHECK_OK(mha_cache_append(c1, k, v, f.T, NULL));
        CHECK_OK(mha_cache_attend(c1, z1, q, f.T, NULL, 0.0f));
        mha_capture cap = {z2, NULL, NULL};
        CHECK_OK(mha_forward_cached(f.L, c2, y, &cap, x, f.T, NULL, NULL));
        CHECK_ARRAY_NEAR(z1, z2, rows * f.h * f.d_v, 1e-5);
        int n[2] = {2, 0};
        CHECK_STATUS(mha_cache_append(c1, k, v, f.T, n), MHA_E_ARG); /* full: no room */
        CHECK_ERROR_MENTIONS("capacity");
    }
    mha_cache_free(c1), mha_cache_free(c2);
    free(x), free(q), free(k), free(v), free(z1), free(z2), free(y);
    fixture_free(&f);
}

/* Cache bytes: 2 * B * capacity * h_kv * d_head * bytes; MHA vs GQA vs MQA. */
static void test_cache_bytes(void) {
    int hkv[3] = {32, 8, 1};
    for (int i = 0; i < 3; i++) {
        mha_config cfg = mha_config_default(2048, 32);
        cfg.n_kv_heads = hkv[i];
        size_t want = (size_t)2 * 1 * 4096 * hkv[i] * 64 * 2;
        CHECK_INT(mha_cache_bytes_for(&cfg, 1, 4096, MHA_CACHE_F16), want);
        CHECK_INT(mha_cache_bytes_for(&cfg, 1, 4096, MHA_CACHE_F32), 2 * want);
    }
    fixture f;
    fixture_make(&f, 3, 8, 16, 4, 2, 6, 5, 0, 61);
    mha_cache *c = NULL;
    CHECK_OK(mha_cache_create(&c, f.L, 3, 2 * MHA_DECODE_CHUNK, MHA_CACHE_F32, 0));
    CHECK_INT(mha_cache_bytes(c), (size_t)3 * 2 * MHA_DECODE_CHUNK * 2 * (6 + 5) * 4);
    CHECK_INT(mha_cache_bytes(c), mha_cache_bytes_for(&f.w.cfg, 3, 2 * MHA_DECODE_CHUNK, MHA_CACHE_F32));
    mha_cache_free(c);
    /* a capacity that is not a whole number of chunks is rounded up */
    CHECK_OK(mha_cache_create(&c, f.L, 3, 16, MHA_CACHE_F32, 0));
    CHECK_INT(mha_cache_bytes(c), (size_t)3 * MHA_DECODE_CHUNK * 2 * (6 + 5) * 4);
    CHECK_INT(mha_cache_bytes(c), mha_cache_bytes_for(&f.w.cfg, 3, 16, MHA_CACHE_F32));
    mha_cache_free(c);
    mha_config bad = mha_config_default(10, 3);
    CHECK_INT(mha_cache_bytes_for(&bad, 1, 16, MHA_CACHE_F32), 0);
    fixture_free(&f);
}

static void test_errors(void) {
    fixture f, g;
    fixture_make(&f, 2, 8, 16, 4, 2, 4, 0, 0, 67);
    fixture_make(&g, 2, 8, 16, 4, 4, 4, 0, 0, 71); /* another shape (h_kv) */
    uint64_t seed = 59;
    float *x = dyadic(naive_random_floats((size_t)2 * 8 * 16, &seed, -1.0f, 1.0f), (size_t)2 * 8 * 16);
    float *y = naive_alloc_floats((size_t)2 * 8 * 16);
    mha_cache *c = NULL;
    CHECK_STATUS(mha_cache_create(NULL, f.L, 2, 8, MHA_CACHE_F32, 0), MHA_E_ARG);
    CHECK_STATUS(mha_cache_create(&c, NULL, 2, 8, MHA_CACHE_F32, 0), MHA_E_ARG);
    CHECK_STATUS(mha_cache_create(&c, f.L, 0, 8, MHA_CACHE_F32, 0), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("batch");
    CHECK_STATUS(mha_cache_create(&c, f.L, 2, 0, MHA_CACHE_F32, 0), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("capacity");
    CHECK_STATUS(mha_cache_create(&c, f.L, 2, 8, (mha_cache_dtype)7, 0), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("dtype");
    CHECK_STATUS(mha_cache_create(&c, f.L, 2, 8, MHA_CACHE_F32, 9), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("window");
    CHECK(c == NULL);
    { /* cross-attention layers have no self-attention cache */
        mha_config cc = mha_config_default(16, 4);
        cc.d_kv_in = 8;
        mha_layer *X = NULL;
        CHECK_OK(mha_layer_create(&X, &cc, NULL));
        CHECK_STATUS(mha_cache_create(&c, X, 1, 8, MHA_CACHE_F32, 0), MHA_E_SHAPE);
        CHECK_ERROR_MENTIONS("d_kv_in");
        mha_layer_free(X);
        cc.d_kv_in = 0, cc.d_v_in = 8; /* keys from the tokens, values from elsewhere */
        CHECK_OK(mha_layer_create(&X, &cc, NULL));
        CHECK_STATUS(mha_cache_create(&c, X, 1, 8, MHA_CACHE_F32, 0), MHA_E_SHAPE);
        CHECK_ERROR_MENTIONS("d_v_in=8");
        mha_layer_free(X);
    }
    CHECK_OK(mha_cache_create(&c, f.L, 2, 8, MHA_CACHE_F32, 0));
    if (!c) goto out;
    /* a cache made for another layer shape */
    CHECK_STATUS(mha_forward_cached(g.L, c, y, NULL, x, 1, NULL, NULL), MHA_E_SHAPE);
    CHECK_ERROR_MENTIONS("h_kv=2");
    /* sequence index out of range */
    CHECK_INT(mha_cache_length(c, 2), -1);
    CHECK_ERROR_MENTIONS("sequence 2");
    CHECK_INT(mha_cache_length(c, -1), -1);
    CHECK_INT(mha_cache_length(NULL, 0), -1);
    CHECK_STATUS(mha_cache_reset(c, 2), MHA_E_ARG);
    CHECK_STATUS(mha_cache_reset(c, -2), MHA_E_ARG);
    CHECK_STATUS(mha_cache_truncate(c, 5, 0), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("sequence 5");
    CHECK_STATUS(mha_cache_truncate(c, 0, 1), MHA_E_ARG); /* longer than it is */
    CHECK_ERROR_MENTIONS("new_len=1");
    CHECK_STATUS(mha_cache_truncate(c, 0, -1), MHA_E_ARG);
    /* n_new out of range, NULLs, T */
    int n_bad[2] = {2, 1};
    CHECK_STATUS(mha_forward_cached(f.L, c, y, NULL, x, 1, n_bad, NULL), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("n_new[0]=2");
    n_bad[0] = -1;
    CHECK_STATUS(mha_forward_cached(f.L, c, y, NULL, x, 1, n_bad, NULL), MHA_E_ARG);
    CHECK_STATUS(mha_forward_cached(f.L, c, y, NULL, x, 0, NULL, NULL), MHA_E_ARG);
    CHECK_STATUS(mha_forward_cached(NULL, c, y, NULL, x, 1, NULL, NULL), MHA_E_ARG);
    CHECK_STATUS(mha_forward_cached(f.L, NULL, y, NULL, x, 1, NULL, NULL), MHA_E_ARG);
    CHECK_STATUS(mha_forward_cached(f.L, c, NULL, NULL, x, 1, NULL, NULL), MHA_E_ARG);
    CHECK_STATUS(mha_forward_cached(f.L, c, y, NULL, NULL, 1, NULL, NULL), MHA_E_ARG);
    /* appending past capacity: nothing is appended */
    CHECK_OK(mha_forward_cached(f.L, c, y, NULL, x, 6, NULL, NULL));
    CHECK_STATUS(mha_forward_cached(f.L, c, y, NULL, x, 3, NULL, NULL), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("capacity 8");
    CHECK_INT(mha_cache_length(c, 0), 6);
    int n_ok[2] = {2, 0};
    CHECK_OK(mha_forward_cached(f.L, c, y, NULL, x, 2, n_ok, NULL)); /* exactly full */
    CHECK_STATUS(mha_forward_cached(f.L, c, y, NULL, x, 1, (int[]){1, 0}, NULL), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("sequence 0 holds 8");
    /* non-finite input, unsupported masks, bad options */
    x[16 + 3] = NAN; /* row 0 of sequence 1 (T = 1) */
    CHECK_STATUS(mha_forward_cached(f.L, c, y, NULL, x, 1, (int[]){0, 1}, NULL), MHA_E_NONFINITE);
    x[16 + 3] = 0.5f;
    mha_options o = mha_options_default();
    uint8_t keep[16] = {1};
    o.key_keep = keep;
    CHECK_STATUS(mha_forward_cached(f.L, c, y, NULL, x, 1, (int[]){0, 1}, &o), MHA_E_UNSUPPORTED);
    CHECK_ERROR_MENTIONS("key_keep");
    o = mha_options_default();
    o.scale = INFINITY;
    CHECK_STATUS(mha_forward_cached(f.L, c, y, NULL, x, 1, (int[]){0, 1}, &o), MHA_E_NONFINITE);
    o = mha_options_default();
    mha_intervention iv[4] = {{MHA_HEAD_REPLACE, 0, NULL}};
    o.interventions = iv;
    CHECK_STATUS(mha_forward_cached(f.L, c, y, NULL, x, 1, (int[]){0, 1}, &o), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("REPLACE");
    float nan_value[256] = {NAN}; /* (B=2, T=1, d_v): a NaN replacement is refused, as in mha_forward */
    iv[0].value = nan_value;
    CHECK_STATUS(mha_forward_cached(f.L, c, y, NULL, x, 1, (int[]){0, 1}, &o), MHA_E_NONFINITE);
    CHECK_ERROR_MENTIONS("interventions[0].value[0]");
    /* permutations */
    CHECK_STATUS(mha_cache_permute_heads(c, (int[]){0, 0, 1, 2}), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("permutation");
    CHECK_STATUS(mha_cache_permute_heads(NULL, (int[]){0, 1, 2, 3}), MHA_E_ARG);
    /* low level */
    CHECK_STATUS(mha_cache_attend(c, y, x, 7, (int[]){0, 7}, 0.0f), MHA_E_ARG); /* seq 1 holds 6 */
    CHECK_ERROR_MENTIONS("append");
    CHECK_STATUS(mha_cache_attend(NULL, y, x, 1, NULL, 0.0f), MHA_E_ARG);
    CHECK_STATUS(mha_cache_append(c, NULL, x, 1, NULL), MHA_E_ARG);
    mha_cache_free(c);
    /* a windowed ring takes at most capacity - window + 1 per append */
    CHECK_OK(mha_cache_create(&c, f.L, 2, 8, MHA_CACHE_F16, 6));
    if (c) {
        float *kv = naive_alloc_floats((size_t)2 * 4 * 8);
        CHECK_STATUS(mha_cache_append(c, kv, kv, 4, NULL), MHA_E_ARG);
        CHECK_ERROR_MENTIONS("at most 3");
        CHECK_OK(mha_cache_append(c, kv, kv, 3, NULL));
        free(kv);
        /* but the cached forward takes any length (pieces inside) */
        CHECK_OK(mha_forward_cached(f.L, c, y, NULL, x, 8, NULL, NULL));
        CHECK_INT(mha_cache_length(c, 1), 11);
    }
    mha_cache_free(c);
    mha_cache_free(NULL);
out:
    free(x), free(y);
    fixture_free(&f), fixture_free(&g);
}

static const test_case cases[] = {
    {"cache_decode_scratch_kept", test_decode_scratch_kept},
    {"cache_decode_mha_f32", test_decode_mha_f32},
    {"cache_decode_gqa_f32", test_decode_gqa_f32},
    {"cache_decode_mqa_f32", test_decode_mqa_f32},
    {"cache_decode_mha_f16", test_decode_mha_f16},
    {"cache_decode_gqa_f16", test_decode_gqa_f16},
    {"cache_decode_mqa_f16", test_decode_mqa_f16},
    {"cache_decode_bias_kv_zero_attn", test_decode_bias_kv_zero_attn},
    {"cache_decode_scalar_kernels", test_decode_scalar_kernels},
    {"cache_decode_uneven_pieces", test_decode_uneven_pieces},
    {"cache_ragged_batch", test_ragged_batch},
    {"cache_truncate_then_continue", test_truncate_then_continue},
    {"cache_window_f32", test_window_f32},
    {"cache_window_f16", test_window_f16},
    {"cache_window_option", test_window_option},
    {"cache_interventions_during_decode", test_interventions_during_decode},
    {"cache_probs_during_decode", test_probs_during_decode},
    {"cache_permute_live_cache_mha", test_permute_live_cache_mha},
    {"cache_permute_live_cache_gqa", test_permute_live_cache_gqa},
    {"cache_threads_bit_identical", test_threads_bit_identical},
    {"cache_long_context_folds", test_long_context_folds},
    {"cache_prefetch_policy_bits", test_prefetch_policy_bits},
    {"cache_prefetch_policy_cpu", test_prefetch_policy_cpu},
    {"cache_prefetch_stream", test_prefetch_stream},
    {"cache_prefetch_steps_avx2", test_prefetch_steps_avx2},
    {"cache_prefill_fast_gemm", test_prefill_fast_gemm},
    {"cache_prefill_branch_bits", test_prefill_branch_bits},
    {"cache_f16_conversion", test_f16_conversion},
    {"cache_kernels_agree", test_kernels_agree},
    {"cache_grouped_kernels", test_grouped_kernels},
    {"cache_decode_gemm_tile_mode", test_decode_gemm_tile_mode},
    {"cache_append_attend", test_append_attend},
    {"cache_bytes", test_cache_bytes},
    {"cache_errors", test_errors},
};

const test_case *tests_cache(size_t *count) {
    *count = sizeof cases / sizeof cases[0];
    return cases;
}
