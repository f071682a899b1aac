/* test_bf16_matmul.c — options.bf16_matmul: projections on bf16 inputs.
 *
 * The reference is checked against numbers built here: the inputs rounded
 * to bf16 by frexp/nearbyint (not the library's integer rounding), the
 * reference's fp32 forward on them for Z, Z rounded the same way, and
 * Y = Z W_O + b_O summed in double by the test. The fast path (AMX tiles
 * where the CPU has them, else the fp32 kernels on rounded inputs) is
 * checked against the reference on every ISA: Q, K, V differ only by the
 * order of fp32 sums of exact products; Z may round to the other bf16
 * neighbour where fast and reference Z differ in their last fp32 bit, so
 * Y is held to a few such flips (2^-8 |Z| |W_O| each) and to the fp32
 * order error. Refusals: fp32 weights, bad values, inputs bf16 cannot
 * hold, and the entries that have no bf16 projections. The cached
 * forward (prefill on the packed GEMM, decode steps on the weight
 * streams) against the reference, stage by stage.
 * Legend: B batch, T queries, S keys, D = d_model, h heads. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "compute/gemm.h"
#include "kernels/kernels.h"
#include "naive.h"
#include "test_util.h"
#include "tests.h"

static float *rounded(const float *x, size_t n) {
    float *r = naive_alloc_floats(n);
    for (size_t i = 0; i < n; i++) r[i] = naive_round_bf16(x[i]);
    return r;
}

/* Activations with outlier channels (every 11th x9). */
static float *activations(size_t rows, int width, uint64_t *seed) {
    float *x = naive_random_floats(rows * width, seed, -1.0f, 1.0f);
    for (size_t r = 0; r < rows; r++)
        for (int c = 3; c < width; c += 11) x[r * width + c] *= 9.0f;
    return x;
}

/* A bf16 layer of config c (random weights; the bf16 values in *w). */
static mha_layer *bf16_layer(naive_weights *w, mha_config c, uint64_t seed) {
    c = naive_resolve(c);
    naive_weights_random(w, &c, &seed, 0.4f);
    mha_layer *L = naive_make_layer(w);
    CHECK_OK(mha_layer_convert_weights(L, MHA_W_BF16));
    mha_weights v;
    mha_layer_get_weights(L, &v); /* the rounded weights, for the expected Y */
    memcpy(w->w_o, v.w_o, sizeof(float) * (size_t)c.n_heads * c.d_v * c.d_model);
    return L;
}

static void test_reference(void) {
    /* cross-attention with a separate value source: all three inputs round */
    mha_config c = naive_config(24, 3, 3, 8, 6, 1);
    c.d_kv_in = 20, c.d_v_in = 12;
    naive_weights w;
    mha_layer *L = bf16_layer(&w, c, 71);
    const int B = 2, T = 5, S = 7, D = 24, zw = 3 * 6;
    uint64_t seed = 5;
    float *x = activations((size_t)B * T, D, &seed), *kv = activations((size_t)B * S, 20, &seed),
          *vs = activations((size_t)B * S, 12, &seed);
    float *xr = rounded(x, (size_t)B * T * D), *kvr = rounded(kv, (size_t)B * S * 20),
          *vsr = rounded(vs, (size_t)B * S * 12);
    float *y = naive_alloc_floats((size_t)B * T * D), *y32 = naive_alloc_floats((size_t)B * T * D),
          *z = naive_alloc_floats((size_t)B * T * zw);
    mha_options o = naive_ref_options();
    const mha_capture cap = {.z = z};
    CHECK_OK(mha_forward_kv(L, y32, &cap, xr, kvr, vsr, B, T, S, &o)); /* fp32 on rounded inputs */
    o.bf16_matmul = 1;
    CHECK_OK(mha_forward_kv(L, y, NULL, x, kv, vs, B, T, S, &o));
    double worst = 0.0, effect = 0.0;
    for (int t = 0; t < B * T; t++)
        for (int j = 0; j < D; j++) {
            double want = w.b_o[j];
            for (int i = 0; i < zw; i++) want += (double)naive_round_bf16(z[(size_t)t * zw + i]) * w.w_o[(size_t)i * D + j];
            worst = fmax(worst, fabs(y[(size_t)t * D + j] - want) / (1.0 + fabs(want)));
            effect = fmax(effect, fabs((double)y32[(size_t)t * D + j] - y[(size_t)t * D + j]));
        }
    if (!(worst <= 1e-6)) test_report(__FILE__, __LINE__, "reference bf16 Y off by %.3g (relative) from the hand-built one", worst);
    CHECK(effect > 1e-4); /* Z's rounding shows in Y */
    /* the plain fp32 forward on the unrounded inputs differs by more than fp32 noise */
    o.bf16_matmul = 0;
    CHECK_OK(mha_forward_kv(L, y32, NULL, x, kv, vs, B, T, S, &o));
    CHECK(test_max_abs_diff(y, y32, (size_t)B * T * D) > 1e-3);
    mha_layer_free(L), naive_weights_free(&w);
    free(x), free(kv), free(vs), free(xr), free(kvr), free(vsr), free(y), free(y32), free(z);
}

static void test_refusals(void) {
    naive_weights w;
    mha_config c = naive_config(16, 2, 2, 0, 0, 1);
    mha_layer *L = bf16_layer(&w, c, 3);
    mha_layer *F = naive_make_layer(&w); /* fp32 weights */
    const int B = 1, T = 3, D = 16;
    uint64_t seed = 9;
    float *x = activations((size_t)B * T, D, &seed), *y = naive_alloc_floats((size_t)B * T * D);
    mha_options o = mha_options_default();
    o.bf16_matmul = 1;
    CHECK_STATUS(mha_forward(F, y, NULL, x, NULL, B, T, T, &o), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("bf16 weights");
    o.bf16_matmul = 2;
    CHECK_STATUS(mha_forward(L, y, NULL, x, NULL, B, T, T, &o), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("bf16_matmul=2");
    o.bf16_matmul = 1;
    CHECK_OK(mha_forward(L, y, NULL, x, NULL, B, T, T, &o));
    x[7] = 0x1.ffp127f; /* finite in fp32, infinite in bf16 */
    CHECK_STATUS(mha_forward(L, y, NULL, x, NULL, B, T, T, &o), MHA_E_NONFINITE);
    CHECK_ERROR_MENTIONS("x[7]");
    x[7] = 0x1.fefffep127f; /* the largest that rounds to a finite bf16: accepted by validation */
    o.path = MHA_PATH_REFERENCE;
    const mha_status big = mha_forward(L, y, NULL, x, NULL, B, T, T, &o);
    CHECK(big == MHA_OK || big == MHA_E_NONFINITE); /* its products may overflow later, named */
    x[7] = 0.5f;
    /* the entries without bf16 projections */
    float *g = naive_alloc_floats((size_t)16 * 16);
    const mha_gradients grad = {.dx = g};
    CHECK_STATUS(mha_backward(L, &grad, y, x, NULL, B, T, T, &o), MHA_E_UNSUPPORTED);
    CHECK_ERROR_MENTIONS("bf16_matmul");
    mha_tape *tape = NULL;
    CHECK_STATUS(mha_forward_train(L, y, &tape, x, NULL, NULL, B, T, T, &o), MHA_E_UNSUPPORTED);
    CHECK(tape == NULL);
    mha_cache *cache = NULL;
    CHECK_OK(mha_cache_create(&cache, F, B, 8, MHA_CACHE_F32, 0));
    CHECK_STATUS(mha_forward_cached(F, cache, y, NULL, x, T, NULL, &o), MHA_E_ARG); /* fp32 weights */
    CHECK_ERROR_MENTIONS("bf16 weights");
    CHECK_INT(mha_cache_length(cache, 0), 0);
    mha_config hc = *mha_layer_config(L);
    CHECK_STATUS(mha_attend_lse(&hc, y, NULL, x, x, x, 1, 1, 1, &o), MHA_E_UNSUPPORTED);
    mha_cache_free(cache);
    mha_layer_free(L), mha_layer_free(F), naive_weights_free(&w);
    free(x), free(y), free(g);
}

/* One case on the forced ISA: fast (AMX or not) against the reference. */
typedef struct {
    mha_config c;
    int B, T, S;
    int cross;    /* 1: kv (and value) sources of their own */
    int capture;  /* 1: per-head contributions (W_O row blocks: the rounded fp32 kernels) */
} bcase;

static void run_case(const bcase *k, int amx) {
    naive_weights w;
    mha_layer *L = bf16_layer(&w, k->c, 1000u + (uint64_t)k->T);
    const mha_config *c = mha_layer_config(L);
    const int B = k->B, T = k->T, S = k->cross ? k->S : k->T, D = c->d_model;
    uint64_t seed = 77;
    float *x = activations((size_t)B * T, D, &seed);
    float *kv = k->cross ? activations((size_t)B * S, c->d_kv_in, &seed) : NULL;
    float *vs = k->cross ? activations((size_t)B * S, c->d_v_in, &seed) : NULL;
    const size_t ny = (size_t)B * T * D, nz = (size_t)B * T * c->n_heads * c->d_v;
    float *yr = naive_alloc_floats(ny), *yf = naive_alloc_floats(ny), *y1 = naive_alloc_floats(ny),
          *z = naive_alloc_floats(nz), *cr = k->capture ? naive_alloc_floats(ny * c->n_heads) : NULL,
          *cf = k->capture ? naive_alloc_floats(ny * c->n_heads) : NULL;
    mha_options o = naive_ref_options();
    o.bf16_matmul = 1, o.causal = !k->cross;
    mha_capture cap = {.z = z, .contributions = cr};
    CHECK_OK(mha_forward_kv(L, yr, &cap, x, kv, vs, B, T, S, &o));
    double zmax = 0.0, wmax = 0.0;
    for (size_t i = 0; i < nz; i++) zmax = fmax(zmax, fabs(z[i]));
    for (size_t i = 0; i < (size_t)c->n_heads * c->d_v * D; i++) wmax = fmax(wmax, fabs(w.w_o[i]));
    o.path = MHA_PATH_FAST;
    cap.contributions = cf;
    const size_t before = mha_gemm_amx_calls();
    CHECK_OK(mha_forward_kv(L, yf, &cap, x, kv, vs, B, T, S, &o));
    const size_t ran = mha_gemm_amx_calls() - before;
    /* AMX ran every whole-K projection (Q|K|V or Q, K, V and Y) when asked, none otherwise */
    if (amx && ran < 2) test_report(__FILE__, __LINE__, "%zu projections ran on AMX; expected at least 2", ran);
    if (!amx && ran) test_report(__FILE__, __LINE__, "%zu projections ran on AMX with it off", ran);
    const double tol = 4.0 * 0x1p-8 * zmax * wmax + 2e-5 * (1.0 + zmax * wmax * c->n_heads * c->d_v);
    const double err = test_max_abs_diff(yf, yr, ny);
    if (!(err <= tol))
        test_report(__FILE__, __LINE__, "%s%s fast Y differs from the reference by %.3g > %.3g (T=%d D=%d)",
                    mha_kernels_get()->name, amx ? "+amx" : "", err, tol, T, D);
    if (k->capture) {
        const double ce = test_max_abs_diff(cf, cr, ny * c->n_heads);
        if (!(ce <= tol)) test_report(__FILE__, __LINE__, "contributions differ by %.3g > %.3g", ce, tol);
    }
    /* each output element is one task's sum: the thread count changes no bit */
    const int threads = mha_get_num_threads();
    mha_set_num_threads(threads > 1 ? 1 : 2);
    CHECK_OK(mha_forward_kv(L, y1, NULL, x, kv, vs, B, T, S, &o));
    mha_set_num_threads(threads);
    CHECK(memcmp(y1, yf, ny * sizeof(float)) == 0);
    mha_layer_free(L), naive_weights_free(&w);
    free(x), free(kv), free(vs), free(yr), free(yf), free(y1), free(z), free(cr), free(cf);
}

static void test_fast(void) {
    bcase cases[5];
    memset(cases, 0, sizeof cases);
    /* fused Q|K|V, rows not a multiple of 32 */
    cases[0] = (bcase){naive_config(64, 4, 4, 0, 0, 1), 2, 37, 0, 0, 0};
    /* GQA, K = 80 (not a multiple of 32), odd panel counts */
    cases[1] = (bcase){naive_config(80, 4, 2, 20, 12, 1), 1, 45, 0, 0, 0};
    /* cross-attention with a value source of its own; several row blocks */
    cases[2] = (bcase){naive_config(48, 2, 2, 24, 16, 1), 1, 300, 29, 1, 0};
    cases[2].c.d_kv_in = 40, cases[2].c.d_v_in = 36;
    /* contributions: W_O's row blocks (k0 > 0) run the rounded fp32 kernels */
    cases[3] = (bcase){naive_config(32, 2, 2, 0, 0, 0), 2, 19, 0, 0, 1};
    /* no bias, one row */
    cases[4] = (bcase){naive_config(96, 3, 1, 0, 0, 0), 1, 1, 0, 0, 0};
    const int has_amx = mha_kernels_get()->amx_tile && mha_cpu_has_amx_bf16();
    for (int i = 0; i < 5; i++) {
        run_case(&cases[i], has_amx);
        if (!has_amx) continue;
        mha_force_amx(0); /* the same ISA's fp32 kernels on rounded inputs */
        run_case(&cases[i], 0);
        mha_force_amx(-1);
    }
}

/* mha_gemm with bf16 = 1 against double sums of the rounded input: the
 * only difference is fp32's order of the exact products, <= K 2^-24
 * sum|a w| per element; without the input's rounding the sums move by
 * up to 2^-9 sum|a w|, which the second check requires to show. */
static void test_gemm(void) {
    enum { M = 45, K = 80, N0 = 40, N1 = 24 };
    uint64_t seed = 17;
    float *a = activations(M, K, &seed);
    float *w0 = naive_random_floats((size_t)K * N0, &seed, -0.5f, 0.5f), *w1 = naive_random_floats((size_t)K * N1, &seed, -0.5f, 0.5f);
    float *b0 = naive_random_floats(N0, &seed, -1.0f, 1.0f);
    for (int i = 0; i < K * N0; i++) w0[i] = naive_round_bf16(w0[i]);
    for (int i = 0; i < K * N1; i++) w1[i] = naive_round_bf16(w1[i]);
    const float *ws[2] = {w0, w1}, *bs[2] = {b0, NULL};
    const int cols[2] = {N0, N1};
    mha_packed p;
    CHECK_OK(mha_pack(&p, K, 2, ws, bs, cols));
    const int amx = mha_kernels_get()->amx_tile && mha_cpu_has_amx_bf16();
    if (amx) CHECK_OK(mha_pack_bf16_pairs(&p));
    float *y0 = naive_alloc_floats((size_t)M * N0), *y1 = naive_alloc_floats((size_t)M * N1);
    const mha_dst dst[2] = {{MHA_DST_ROWS, y0, N0, 0, 0, 0, 0}, {MHA_DST_ROWS, y1, N1, 0, 0, 0, 0}};
    const mha_gemm_args g = {dst, a, K, M, &p, 0, 2, 0, K, 1, 1};
    for (int pass = 0; pass <= amx; pass++) { /* with AMX where the CPU has it, then without */
        const int on = amx && pass == 0;
        mha_force_amx(on ? -1 : 0);
        memset(y0, 0, sizeof(float) * M * N0), memset(y1, 0, sizeof(float) * M * N1);
        const size_t before = mha_gemm_amx_calls();
        CHECK_OK(mha_gemm(&g, mha_kernels_get(), 2));
        CHECK_INT(mha_gemm_amx_calls() - before, on);
        double worst = 0.0, moved = 0.0; /* in units of the element's bound */
        for (int s = 0; s < 2; s++)
            for (int m = 0; m < M; m++)
                for (int n = 0; n < cols[s]; n++) {
                    const float *w = ws[s];
                    double want = bs[s] ? bs[s][n] : 0.0, plain = want, mag = fabs(want);
                    for (int k = 0; k < K; k++) {
                        want += (double)naive_round_bf16(a[m * K + k]) * w[k * cols[s] + n];
                        plain += (double)a[m * K + k] * w[k * cols[s] + n];
                        mag += fabs((double)a[m * K + k] * w[k * cols[s] + n]);
                    }
                    const double got = (s ? y1 : y0)[m * cols[s] + n], bound = K * 0x1p-24 * mag + 1e-30;
                    worst = fmax(worst, fabs(got - want) / bound);
                    moved = fmax(moved, fabs(plain - want) / bound);
                }
        if (!(worst <= 1.0))
            test_report(__FILE__, __LINE__, "%s%s: bf16 GEMM off by %.3g of its fp32 bound", mha_kernels_get()->name,
                        on ? "+amx" : "", worst);
        CHECK(moved > 4.0); /* the rounding is visible at this bound */
    }
    mha_force_amx(-1);
    mha_packed_free(&p);
    free(a), free(w0), free(w1), free(b0), free(y0), free(y1);
}

/* The cached forward under bf16_matmul: a prefill of 30 tokens (the
 * packed GEMM, AMX where the CPU has it) then 10 decode steps (the bf16
 * weight streams on rounded rows). Two tight checks instead of one loose
 * one: Z against the reference's Z (Q, K, V from the same rounded x: only
 * fp32 order and attention rounding apart), and Y against bf16(Z) W_O +
 * b_O summed here in double (the W_O stage's own rounding). */
static void test_cached(void) {
    enum { B = 2, T0 = 30, T = 40, D = 64, H = 4, HKV = 2 };
    naive_weights w;
    mha_layer *L = bf16_layer(&w, naive_config(D, H, HKV, 0, 0, 1), 91);
    const mha_config *c = mha_layer_config(L);
    const int zw = H * c->d_v;
    uint64_t seed = 23;
    float *x = activations((size_t)B * T, D, &seed);
    float *yr = naive_alloc_floats((size_t)B * T * D), *zr = naive_alloc_floats((size_t)B * T * zw);
    float *yc = naive_alloc_floats((size_t)B * T * D), *zc = naive_alloc_floats((size_t)B * T * zw);
    mha_options o = naive_ref_options();
    o.bf16_matmul = 1, o.causal = 1;
    const mha_capture capr = {.z = zr};
    CHECK_OK(mha_forward(L, yr, &capr, x, NULL, B, T, T, &o));
    mha_cache *cache = NULL;
    CHECK_OK(mha_cache_create(&cache, L, B, T, MHA_CACHE_F32, 0));
    o = mha_options_default();
    o.bf16_matmul = 1;
    float *xs = naive_alloc_floats((size_t)B * T0 * D), *ys = naive_alloc_floats((size_t)B * T0 * D),
          *zs = naive_alloc_floats((size_t)B * T0 * zw);
    const size_t before = mha_gemm_amx_calls();
    for (int t0 = 0; t0 < T; t0 += t0 ? 1 : T0) { /* one prefill, then single tokens */
        const int n = t0 ? 1 : T0;
        for (int b = 0; b < B; b++)
            memcpy(xs + (size_t)b * n * D, x + ((size_t)b * T + t0) * D, sizeof(float) * n * D);
        const mha_capture cap = {.z = zs};
        CHECK_OK(mha_forward_cached(L, cache, ys, &cap, xs, n, NULL, &o));
        for (int b = 0; b < B; b++) {
            memcpy(yc + ((size_t)b * T + t0) * D, ys + (size_t)b * n * D, sizeof(float) * n * D);
            memcpy(zc + ((size_t)b * T + t0) * zw, zs + (size_t)b * n * zw, sizeof(float) * n * zw);
        }
    }
    if (mha_kernels_get()->amx_tile && mha_cpu_has_amx_bf16()) CHECK(mha_gemm_amx_calls() > before);
    double zmax = 0.0, zerr = 0.0, yerr = 0.0; /* yerr: in units of each element's fp32 bound */
    for (size_t i = 0; i < (size_t)B * T * zw; i++) zmax = fmax(zmax, fabs(zr[i]));
    for (size_t i = 0; i < (size_t)B * T * zw; i++) zerr = fmax(zerr, fabs(zc[i] - zr[i]));
    for (int t = 0; t < B * T; t++)
        for (int j = 0; j < D; j++) {
            double want = w.b_o[j], mag = fabs(want);
            for (int i = 0; i < zw; i++) {
                const double term = (double)naive_round_bf16(zc[(size_t)t * zw + i]) * w.w_o[(size_t)i * D + j];
                want += term, mag += fabs(term);
            }
            yerr = fmax(yerr, fabs(yc[(size_t)t * D + j] - want) / (2.0 * zw * 0x1p-24 * mag + 1e-30));
        }
    if (!(zerr <= 2e-5 * (1.0 + zmax)))
        test_report(__FILE__, __LINE__, "%s: cached Z differs from the reference's by %.3g", mha_kernels_get()->name, zerr);
    if (!(yerr <= 1.0))
        test_report(__FILE__, __LINE__, "%s: cached Y off bf16(Z) W_O + b_O by %.3g of its fp32 bound",
                    mha_kernels_get()->name, yerr);
    /* and Y as a whole against the reference: a few Z flips at most */
    double wmax = 0.0;
    for (int i = 0; i < zw * D; i++) wmax = fmax(wmax, fabs(w.w_o[i]));
    CHECK(test_max_abs_diff(yc, yr, (size_t)B * T * D) <= 4.0 * 0x1p-8 * zmax * wmax + 1e-4);
    mha_cache_free(cache);
    mha_layer_free(L), naive_weights_free(&w);
    free(x), free(yr), free(zr), free(yc), free(zc), free(xs), free(ys), free(zs);
}

const test_case *tests_bf16_matmul(size_t *count) {
    static const test_case cases[] = {
        {"bf16_matmul_reference", test_reference},
        {"bf16_matmul_refusals", test_refusals},
    };
    *count = sizeof cases / sizeof cases[0];
    return cases;
}

const test_case *tests_bf16_matmul_isa(size_t *count) {
    static const test_case cases[] = {
        {"bf16_matmul_gemm", test_gemm},
        {"bf16_matmul_fast", test_fast},
        {"bf16_matmul_cached", test_cached},
    };
    *count = sizeof cases / sizeof cases[0];
    return cases;
}
