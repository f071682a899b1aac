/* test_isa.c — the AVX-512 kernels against the AVX2 and scalar ones and
 * plain double loops: the 12x32 and 6x16 tiles at every edge size, the
 * packed GEMM driver (K blocks, packing, K^T store), the attention steps, the exp over every float of the softmax's range, the
 * decode kernels and the fp16 conversions; and the choice of the ISA
 * (CPUID/XCR0, MHA_KERNELS). Skipped where the CPU lacks AVX-512.
 * Where the AVX2 kernels make the same FMA chains (GEMM tiles, scores,
 * p v, exp, decode scores/accumulate/projections) the bits must agree.
 * Legend: m x n tile, K inner size, d = d_k, dv = d_v. */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "compute/gemm.h"
#include "kernels/decode_kernels.h"
#include "kernels/kernels.h"
#include "naive.h"
#include "test_util.h"
#include "tests.h"

static int have(void) { return mha_cpu_has_avx512() && mha_cpu_has_avx2(); }

/* The choice agrees with the compiler's own CPU model (which reads CPUID
 * and XCR0 independently), and auto picks the best ISA. */
static void test_isa_detect(void) {
    __builtin_cpu_init();
    int gcc = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
              __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
              __builtin_cpu_supports("fma") && test_machine_has("f16c");
    CHECK_INT(mha_cpu_has_avx512(), gcc);
    CHECK_INT((int)mha_cpu_amd_family(), (int)test_amd_family());
    mha_kernels_force(NULL);
    const char *env = getenv("MHA_KERNELS");
    if (!env || !*env) {
        const mha_kernels *want = mha_cpu_has_avx512() ? &mha_kernels_avx512
                                  : mha_cpu_has_avx2() ? &mha_kernels_avx2 : &mha_kernels_scalar;
        CHECK(mha_kernels_get() == want);
    }
    /* forcing a prefill table moves the decode path to the same ISA */
    const mha_kernels *tabs[3] = {&mha_kernels_avx512, &mha_kernels_avx2, &mha_kernels_scalar};
    const mha_decode_kernels *dec[3] = {&mha_decode_kernels_avx512, &mha_decode_kernels_avx2,
                                        &mha_decode_kernels_scalar};
    const int can[3] = {mha_cpu_has_avx512(), mha_cpu_has_avx2(), 1};
    for (int k = 0; k < 3; k++) {
        if (!can[k]) continue;
        mha_kernels_force(tabs[k]);
        const mha_isa *isa = NULL;
        int reference = 0;
        CHECK_OK(mha_isa_choose(&isa, &reference));
        CHECK(isa && isa->prefill == tabs[k] && isa->decode == dec[k]);
        mha_kernels_force(NULL);
    }
}

/* MHA_KERNELS=avx512 runs (the same bits as forcing the table) where the
 * CPU has it and is refused by name where it does not. */
static void test_isa_env_avx512(void) {
    enum { D = 16, T = 5 };
    const mha_config c = naive_resolve(mha_config_default(D, 2));
    uint64_t seed = 91;
    naive_weights w;
    naive_weights_random(&w, &c, &seed, 0.3f);
    mha_layer *L = naive_make_layer(&w);
    float *x = naive_random_floats(T * D, &seed, -1, 1), y1[T * D], y2[T * D];
    const char *old = getenv("MHA_KERNELS");
    char *saved = old ? strdup(old) : NULL;
    setenv("MHA_KERNELS", "avx512", 1);
    mha_status s = L ? mha_forward(L, y1, NULL, x, NULL, 1, T, T, NULL) : MHA_E_ARG;
    if (mha_cpu_has_avx512()) {
        CHECK_INT(s, MHA_OK);
        unsetenv("MHA_KERNELS");
        mha_kernels_force(&mha_kernels_avx512);
        if (L) CHECK_OK(mha_forward(L, y2, NULL, x, NULL, 1, T, T, NULL));
        mha_kernels_force(NULL);
        CHECK(memcmp(y1, y2, sizeof y1) == 0);
    } else {
        CHECK_INT(s, MHA_E_ARG);
        CHECK_ERROR_MENTIONS("MHA_KERNELS=avx512");
    }
    if (saved) setenv("MHA_KERNELS", saved, 1);
    else unsetenv("MHA_KERNELS");
    free(saved), free(x);
    mha_layer_free(L);
    naive_weights_free(&w);
}

/* The 12x32 tile: every m <= 12, n <= 32, several K, vs double sums, with
 * guard cells around c; and the same bits as AVX2's 6x16 tiles. */
static void test_isa_tile_12x32(void) {
    if (!have()) return;
    uint64_t seed = 92;
    const int Ks[] = {1, 3, 16, 67};
    enum { LDC = 37 };
    for (int ki = 0; ki < 4; ki++) {
        const int K = Ks[ki];
        const size_t a_ps = 6 * (size_t)K + 5, b_ps = 16 * (size_t)K + 3;
        float *a = naive_random_floats(2 * a_ps, &seed, -1, 1), *b = naive_random_floats(2 * b_ps, &seed, -1, 1);
        float bias[32], c[14 * LDC], c2[14 * LDC], guard[14 * LDC];
        test_fill_uniform(bias, 32, &seed, -1, 1);
        test_fill_uniform(guard, 14 * LDC, &seed, -1, 1);
        for (int m = 1; m <= 12; m++)
            for (int n = 1; n <= 32; n++)
                for (int use_bias = 0; use_bias < 2; use_bias++) {
                    const float *bp = use_bias ? bias : NULL;
                    memcpy(c, guard, sizeof c), memcpy(c2, guard, sizeof c2);
                    /* every other call with a prefetch stream (over b itself): a hint, same bits */
                    mha_sgemm_avx512_12x32(c + LDC, LDC, a, a_ps, b, b_ps, 16, bp, K, m, n, 0,
                                           (m + n) % 2 ? b : NULL);
                    /* AVX2: 6x16 tiles over the same packed operands */
                    for (int r = 0; r < m; r += 6)
                        for (int q = 0; q < n; q += 16)
                            mha_sgemm_avx2_6x16(c2 + LDC * (1 + r) + q, LDC, a + (r / 6) * a_ps, 1, 6,
                                                b + (q / 16) * b_ps, 16, bp ? bp + q : NULL, NULL, K,
                                                m - r < 6 ? m - r : 6, n - q < 16 ? n - q : 16);
                    double err = 0.0;
                    int guards = 1;
                    for (int i = 0; i < 14; i++)
                        for (int j = 0; j < LDC; j++) {
                            float got = c[i * LDC + j];
                            if (i >= 1 && i <= m && j < n) {
                                const int r = i - 1;
                                double want = bp ? bp[j] : 0.0;
                                for (int k = 0; k < K; k++)
                                    want += (double)a[(r / 6) * a_ps + (size_t)k * 6 + r % 6] *
                                            b[(j / 16) * b_ps + (size_t)k * 16 + j % 16];
                                if (fabs(got - want) > err) err = fabs(got - want);
                            } else if (got != guard[i * LDC + j]) {
                                guards = 0;
                            }
                        }
                    if (err > 1e-6 * (K + 2) || !guards || memcmp(c, c2, sizeof c) != 0)
                        test_report(__FILE__, __LINE__, "12x32 m=%d n=%d K=%d bias=%d: err %.3g, guards %s, %s AVX2",
                                    m, n, K, use_bias, err, guards ? "ok" : "overwritten",
                                    memcmp(c, c2, sizeof c) ? "differs from" : "equals");
                }
        free(a), free(b);
    }
}

/* Attention steps on odd shapes: scores and p v bit-identical to AVX2
 * (same FMA chains); softmax probabilities, m and alpha too (same exp),
 * l within rounding (16 lanes vs 8 lanes summed). */
static void test_isa_attention_steps(void) {
    if (!have()) return;
    uint64_t seed = 93;
    const int dks[] = {8, 13, 64}, rowss[] = {6, 18, 48}, colss[] = {16, 37, 128};
    for (int t = 0; t < 3; t++) {
        const int d_k = dks[t], rows = rowss[t], cols = colss[t], np = (cols + 15) / 16, dv16 = 16 * (t + 1);
        const size_t lds = 128;
        float *q = naive_random_floats((size_t)rows * d_k, &seed, -1, 1);
        float *kt = naive_random_floats((size_t)np * d_k * 16, &seed, -1, 1);
        float *s1 = naive_alloc_floats(rows * lds), *s2 = naive_alloc_floats(rows * lds);
        mha_attn_scores_avx512(s1, lds, q, kt, d_k, rows, np);
        mha_attn_scores_avx2(s2, lds, q, kt, d_k, rows, np);
        CHECK(memcmp(s1, s2, sizeof(float) * rows * lds) == 0);
        float m1[48], m2[48], l1[48], l2[48], a1[48], a2[48];
        int lo[48], hi[48];
        for (int i = 0; i < rows; i++) {
            m1[i] = m2[i] = i % 3 == 0 ? -INFINITY : 0.5f * (float)(i % 5);
            l1[i] = l2[i] = i % 3 == 0 ? 0.0f : 1.0f + (float)i;
            lo[i] = i % 4 == 1 ? cols : i % 7, hi[i] = i % 4 == 1 ? -1 : cols - 1 - i % 5;
        }
        for (int masked = 0; masked < 2; masked++) {
            float *p1 = naive_alloc_floats(rows * lds), *p2 = naive_alloc_floats(rows * lds);
            memcpy(p1, s1, sizeof(float) * rows * lds), memcpy(p2, s1, sizeof(float) * rows * lds);
            float mm1[48], mm2[48], ll1[48], ll2[48];
            memcpy(mm1, m1, sizeof mm1), memcpy(mm2, m2, sizeof mm2), memcpy(ll1, l1, sizeof ll1), memcpy(ll2, l2, sizeof ll2);
            mha_attn_softmax_avx512(p1, lds, mm1, ll1, a1, masked ? lo : NULL, hi, cols - 3, rows, cols);
            mha_attn_softmax_avx2(p2, lds, mm2, ll2, a2, masked ? lo : NULL, hi, cols - 3, rows, cols);
            for (int i = 0; i < rows; i++) /* AVX2 pads to 8 columns, AVX-512 to 16 */
                CHECK(memcmp(p1 + i * lds, p2 + i * lds, sizeof(float) * cols) == 0);
            CHECK(memcmp(mm1, mm2, sizeof(float) * rows) == 0);
            CHECK(memcmp(a1, a2, sizeof(float) * rows) == 0);
            for (int i = 0; i < rows; i++) CHECK_NEAR(ll1[i], ll2[i], 1e-6 * (fabs(ll2[i]) + 1.0));
            /* o = alpha o + p v */
            const size_t ldv = (size_t)dv16 + 3;
            float *v = naive_random_floats((size_t)cols * ldv, &seed, -1, 1);
            float *o1 = naive_random_floats((size_t)rows * ldv, &seed, -1, 1), *o2 = naive_alloc_floats((size_t)rows * ldv);
            memcpy(o2, o1, sizeof(float) * rows * ldv);
            mha_attn_pv_avx512(o1, ldv, p1, lds, v, ldv, a1, rows, cols, dv16);
            mha_attn_pv_avx2(o2, ldv, p1, lds, v, ldv, a1, rows, cols, dv16);
            CHECK(memcmp(o1, o2, sizeof(float) * rows * ldv) == 0);
            free(p1), free(p2), free(v), free(o1), free(o2);
        }
        free(q), free(kt), free(s1), free(s2);
    }
}

/* ulp distance of float f from the double truth e */
static double ulp_err(float f, double e) {
    double ulp = e >= FLT_MIN ? ldexp(1.0, ilogb(e) - 23) : ldexp(1.0, -149);
    return fabs((double)f - e) / ulp;
}

/* Floats x with ln(FLT_MIN) <= x <= 88.3, every 7th bit pattern (every
 * one with MHA_TEST_EXP_EVERY=1 in the environment, ~2.2e9, a minute): the
 * AVX-512 exp gives the AVX2 exp's bits; every 61st of those is also
 * checked against exp() in double (<= 2 ulp). */
static void test_isa_exp_every_float(void) {
    if (!have()) return;
    enum { CHUNK = 1 << 16 };
    float *x = malloc(CHUNK * sizeof(float)), *y1 = malloc(CHUNK * sizeof(float)), *y2 = malloc(CHUNK * sizeof(float));
    double worst = 0.0;
    float worst_x = 0.0f;
    size_t differ = 0;
    const char *every = getenv("MHA_TEST_EXP_EVERY");
    const uint64_t stride = every && strcmp(every, "1") == 0 ? 1 : 7;
    const float ends[2][2] = {{-0.0f, -87.33654f}, {0.0f, 88.3f}}; /* ln(FLT_MIN) = -87.33654 */
    for (int side = 0; side < 2; side++) {
        uint32_t u0, u1;
        memcpy(&u0, &ends[side][0], 4), memcpy(&u1, &ends[side][1], 4);
        for (uint64_t u = u0; u <= u1;) {
            size_t n = 0;
            for (; n < CHUNK && u <= u1; n++, u += stride) {
                uint32_t b = (uint32_t)u;
                memcpy(&x[n], &b, 4);
            }
            mha_vexp_avx512(y1, x, n);
            mha_vexp_avx2(y2, x, n);
            if (memcmp(y1, y2, n * sizeof(float)) != 0)
                for (size_t i = 0; i < n; i++) differ += memcmp(&y1[i], &y2[i], 4) != 0;
            for (size_t i = 0; i < n; i += 61) {
                double e = ulp_err(y1[i], exp((double)x[i]));
                if (e > worst) worst = e, worst_x = x[i];
            }
        }
    }
    if (differ) test_report(__FILE__, __LINE__, "avx512 exp differs from avx2 on %zu floats", differ);
    if (worst > 2.0)
        test_report(__FILE__, __LINE__, "avx512 exp: %.2f ulp at x=%.9g (want <= 2)", worst, (double)worst_x);
    free(x), free(y1), free(y2);
}

/* Decode kernels on odd shapes: scores, accumulate (fp32 and fp16) and
 * the projections bit-identical to AVX2; softmax equal to AVX2 in the
 * probabilities and max, the sums within rounding. */
static void test_isa_decode_kernels(void) {
    if (!have()) return;
    const mha_decode_kernels *x5 = &mha_decode_kernels_avx512, *x2 = &mha_decode_kernels_avx2;
    uint64_t seed = 94;
    const int ms[] = {1, 7, 9}, ns[] = {8, 24, 136}, ds[] = {13, 64, 5}, dvs[] = {19, 64, 70};
    for (int t = 0; t < 3; t++) {
        const int m = ms[t], n = ns[t], d = ds[t], dv = dvs[t], lds = n + 4;
        float *q = naive_random_floats((size_t)m * d, &seed, -1, 1), *k = naive_random_floats((size_t)n * d, &seed, -1, 1);
        float *v = naive_random_floats((size_t)n * dv, &seed, -1, 1);
        float *s1 = naive_alloc_floats((size_t)m * lds), *s2 = naive_alloc_floats((size_t)m * lds);
        uint16_t *kh = malloc(2 * (size_t)n * d), *vh = malloc(2 * (size_t)n * dv);
        x2->to_f16(kh, k, (size_t)n * d), x2->to_f16(vh, v, (size_t)n * dv);
        for (int H = 0; H < 2; H++) {
            if (H) x5->scores_h(s1, lds, q, d, kh, m, n, d), x2->scores_h(s2, lds, q, d, kh, m, n, d);
            else x5->scores(s1, lds, q, d, k, m, n, d), x2->scores(s2, lds, q, d, k, m, n, d);
            CHECK(memcmp(s1, s2, sizeof(float) * m * lds) == 0);
        }
        s1[1] = s2[1] = -INFINITY;
        float mx1[9], mx2[9], l1[9], l2[9];
        x5->softmax(s1, lds, mx1, l1, m, n);
        x2->softmax(s2, lds, mx2, l2, m, n);
        CHECK(memcmp(s1, s2, sizeof(float) * m * lds) == 0);
        CHECK(memcmp(mx1, mx2, sizeof(float) * m) == 0);
        for (int i = 0; i < m; i++) CHECK_NEAR(l1[i], l2[i], 1e-6 * l2[i]);
        float *a1 = naive_alloc_floats((size_t)m * (dv + 1)), *a2 = naive_alloc_floats((size_t)m * (dv + 1));
        for (int H = 0; H < 2; H++) {
            if (H) x5->accumulate_h(a1, dv + 1, s1, lds, vh, m, n, dv), x2->accumulate_h(a2, dv + 1, s1, lds, vh, m, n, dv);
            else x5->accumulate(a1, dv + 1, s1, lds, v, m, n, dv), x2->accumulate(a2, dv + 1, s1, lds, v, m, n, dv);
            CHECK(memcmp(a1, a2, sizeof(float) * m * (dv + 1)) == 0);
        }
        /* projections: y (m, dv) = v[:m] (m, dv) w (dv, dv), w = v's rows */
        const int mm = m < n ? m : n, rows = dv < n ? dv : n;
        x5->gemm_tile(a1, dv + 1, v, dv, v, dv, mm, rows, dv);
        x2->gemm_tile(a2, dv + 1, v, dv, v, dv, mm, rows, dv);
        CHECK(memcmp(a1, a2, sizeof(float) * mm * (dv + 1)) == 0);
        const int ms4 = mm < 4 ? mm : 4;
        x5->gemm_stream(a1, dv + 1, v, dv, v, dv, ms4, rows, dv);
        x2->gemm_stream(a2, dv + 1, v, dv, v, dv, ms4, rows, dv);
        CHECK(memcmp(a1, a2, sizeof(float) * ms4 * (dv + 1)) == 0);
        memcpy(a2, a1, sizeof(float) * dv);
        x5->axpby(a1, v, 0.3f, -1.7f, dv);
        x2->axpby(a2, v, 0.3f, -1.7f, dv);
        CHECK(memcmp(a1, a2, sizeof(float) * dv) == 0);
        free(q), free(k), free(v), free(s1), free(s2), free(kh), free(vh), free(a1), free(a2);
    }
}

/* The AVX-512 projection streams (fp32 for 1-4 rows, bf16 and int8 for
 * one) give the scalar table's bits with y updated whole or in 256-bit
 * halves, and bf16 / int8 as a row sweep or as tiles (each forced both
 * ways, column tails of every kind); the halves are chosen on Zen 4
 * alone (AMD family 0x19 with AVX-512), the sweep on AMD Zen (family
 * 0x17 on): read here from CPUID independently. */
static void test_isa_stream_halves(void) {
    if (!have()) return;
    mha_force_halves_512(-1);
    mha_force_row_sweep(-1);
    CHECK_INT(mha_cpu_halves_512(), test_amd_family() == 0x19);
    CHECK_INT(mha_cpu_row_sweep(), test_amd_family() >= 0x17);
    const mha_decode_kernels *x5 = &mha_decode_kernels_avx512, *sc = &mha_decode_kernels_scalar;
    enum { K = 37, LD = 160 };
    const int ns[] = {7, 16, 93, 150};
    uint64_t seed = 4711;
    float *x = naive_random_floats(4 * LD, &seed, -2.0f, 2.0f), *wf = naive_random_floats((size_t)K * LD, &seed, -1, 1);
    float *scale = naive_random_floats(LD, &seed, 0.001f, 0.01f), *y0 = naive_random_floats(4 * LD, &seed, -1, 1);
    float *y1 = naive_alloc_floats(4 * LD), *y2 = naive_alloc_floats(4 * LD);
    uint16_t wb[K * LD]; /* (K, LD) bf16: the high halves of wf */
    int8_t wi[K * LD];   /* (K, LD) int8 */
    for (int e = 0; e < K * LD; e++) memcpy(&wb[e], (char *)&wf[e] + 2, 2), wi[e] = (int8_t)lrintf(wf[e] * 127.0f);
    for (int form = 0; form < 4; form++) {
        const int halves = form & 1, sweep = form >> 1;
        mha_force_halves_512(halves);
        mha_force_row_sweep(sweep);
        CHECK_INT(mha_cpu_halves_512(), halves);
        CHECK_INT(mha_cpu_row_sweep(), sweep);
        for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++)
            for (int kind = 0; kind < 6; kind++) { /* fp32 rows 1-4, then bf16 and int8 one row */
                const int n = ns[i], m = kind < 4 ? kind + 1 : 1;
                memcpy(y1, y0, sizeof(float) * 4 * LD), memcpy(y2, y0, sizeof(float) * 4 * LD);
                if (kind < 4) x5->gemm_stream(y1, LD, x, LD, wf, LD, m, K, n), sc->gemm_stream(y2, LD, x, LD, wf, LD, m, K, n);
                else if (kind == 4)
                    x5->gemm_stream_bf16(y1, LD, x, LD, wb, LD, 1, K, n), sc->gemm_stream_bf16(y2, LD, x, LD, wb, LD, 1, K, n);
                else /* one scale group: 32 rows */
                    x5->gemm_stream_i8(y1, LD, x, LD, wi, LD, scale, 1, 32, n),
                        sc->gemm_stream_i8(y2, LD, x, LD, wi, LD, scale, 1, 32, n);
                if (memcmp(y1, y2, sizeof(float) * 4 * LD) != 0)
                    test_report(__FILE__, __LINE__, "stream kind %d, %d rows, n %d, halves %d, sweep %d: not the scalar bits",
                                kind, m, n, halves, sweep);
                CHECK(memcmp(y1 + (size_t)(m - 1) * LD, y0 + (size_t)(m - 1) * LD, sizeof(float) * n) != 0);
            }
    }
    mha_force_halves_512(-1);
    mha_force_row_sweep(-1);
    free(x), free(wf), free(scale), free(y0), free(y1), free(y2);
}

/* binary16: every half converts to the scalar kernel's float; floats (all
 * specials, every 4099th bit pattern, tails of every length) round to
 * the scalar kernel's bits. */
static void test_isa_f16_conversion(void) {
    if (!have()) return;
    const mha_decode_kernels *x5 = &mha_decode_kernels_avx512, *sc = &mha_decode_kernels_scalar;
    enum { N = 65536 };
    uint16_t *h = malloc(2 * N), *h1 = malloc(2 * N), *h2 = malloc(2 * N);
    float *f1 = malloc(4 * N), *f2 = malloc(4 * N), *x = malloc(4 * N);
    for (int i = 0; i < N; i++) h[i] = (uint16_t)i;
    x5->from_f16(f1, h, N);
    sc->from_f16(f2, h, N);
    for (int i = 0; i < N; i++)
        if (memcmp(&f1[i], &f2[i], 4) != 0 && !(isnan(f1[i]) && isnan(f2[i]))) {
            test_report(__FILE__, __LINE__, "half 0x%04x: avx512 %a, scalar %a", i, (double)f1[i], (double)f2[i]);
            break;
        }
    for (uint64_t start = 0; start < 4099; start += 1024) {
        for (int i = 0; i < N; i++) {
            uint32_t b = (uint32_t)(start + (uint64_t)i * 4099 * 16 % 0xffffffffull);
            memcpy(&x[i], &b, 4);
            if (isnan(x[i])) x[i] = 1.0f;
        }
        x5->to_f16(h1, x, N);
        sc->to_f16(h2, x, N);
        CHECK(memcmp(h1, h2, 2 * N) == 0);
    }
    for (int n = 1; n <= 33; n++) { /* masked tails leave the rest alone */
        memset(h1, 0xab, 2 * 40), memset(h2, 0xab, 2 * 40);
        x5->to_f16(h1, x, (size_t)n);
        sc->to_f16(h2, x, (size_t)n);
        CHECK(memcmp(h1, h2, 2 * 40) == 0);
    }
    free(h), free(h1), free(h2), free(f1), free(f2), free(x);
}

/* The variants' tile kernels: the AVX-512 softcap gives the AVX2 kernel's
 * bits (rows of only small, mixed and only large |s / cap|, infinities,
 * a masked tail), the AVX-512 ALiBi tile the scalar one's (distances up
 * to 2^30 both ways; columns past cols untouched). */
static void test_isa_variant_kernels(void) {
    if (!have()) return;
    enum { ROWS = 4, COLS = 37, LDS = 64 };
    float s1[ROWS * LDS], s2[ROWS * LDS];
    for (int i = 0; i < ROWS; i++)
        for (int j = 0; j < LDS; j++) /* row 0: |x| < 0.4; 1: mixed; 2: |x| >= 0.4; 3: wide */
            s1[i * LDS + j] = i == 0 ? 0.019f * (float)(j - 20) : i == 1 ? 0.31f * (float)(j - 18)
                              : i == 2 ? (j % 2 ? 1.0f : -1.0f) * (0.4f + 0.7f * (float)j) : 3.7f * (float)(j - 19);
    s1[3 * LDS + 5] = INFINITY, s1[3 * LDS + 6] = -INFINITY;
    memcpy(s2, s1, sizeof s1);
    mha_attn_softcap_avx512(s1, LDS, 2.0f, ROWS, COLS);
    mha_attn_softcap_avx2(s2, LDS, 2.0f, ROWS, COLS);
    for (int i = 0; i < ROWS; i++)
        if (memcmp(s1 + i * LDS, s2 + i * LDS, sizeof(float) * COLS) != 0)
            test_report(__FILE__, __LINE__, "softcap row %d: avx512 differs from avx2", i);
    int qpos[ROWS] = {0, 1000, 1 << 30, 7}, kpos[LDS];
    for (int j = 0; j < LDS; j++) kpos[j] = j % 3 == 0 ? (1 << 30) - j : j * 37;
    uint64_t seed = 95;
    float *a = naive_random_floats(ROWS * LDS, &seed, -4, 4), *b = naive_alloc_floats(ROWS * LDS);
    memcpy(b, a, sizeof(float) * ROWS * LDS);
    const float tail = a[COLS], biased = a[3 * LDS + 3];
    mha_attn_alibi_avx512(a, LDS, qpos, kpos, 0.0625f, ROWS, COLS);
    mha_attn_alibi_get(&mha_kernels_scalar)(b, LDS, qpos, kpos, 0.0625f, ROWS, COLS);
    CHECK(memcmp(a, b, sizeof(float) * ROWS * LDS) == 0);
    CHECK(a[COLS] == tail && a[3 * LDS + 3] == biased - 0.0625f * (float)((1 << 30) - 3 - 7)); /* tail kept; biased */
    free(a), free(b);
}

/* The AVX-512 softmax flushes exp(x) below MHA_SOFTMAX_FLUSH to 0 (no
 * subnormal products in p v), in p and in alpha, and otherwise gives the
 * AVX2 kernel's bits. */
static void test_isa_softmax_flush(void) {
    if (!have()) return;
    enum { COLS = 96 };
    float p1[2 * COLS], p2[2 * COLS], m1[2] = {0.0f, 0.0f}, m2[2] = {0.0f, 0.0f}, l1[2] = {1, 1}, l2[2] = {1, 1};
    float a1[2], a2[2];
    for (int j = 0; j < COLS; j++) { /* x = s - max from 0 down to -95: across the threshold and exp's clamp */
        p1[j] = 50.0f - (float)j;        /* row 0: max 50, alpha = e^-50 */
        p1[COLS + j] = 40.0f - (float)j; /* row 1: max 40, alpha = e^-40 */
    }
    memcpy(p2, p1, sizeof p1);
    mha_attn_softmax_avx512(p1, COLS, m1, l1, a1, NULL, NULL, COLS, 2, COLS);
    mha_attn_softmax_avx2(p2, COLS, m2, l2, a2, NULL, NULL, COLS, 2, COLS);
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < COLS; j++) {
            const float x = (float)(-j), want = x < MHA_SOFTMAX_FLUSH ? 0.0f : p2[i * COLS + j];
            if (memcmp(&p1[i * COLS + j], &want, 4) != 0 || (x < -40.0f && x >= MHA_SOFTMAX_FLUSH && want == 0.0f))
                test_report(__FILE__, __LINE__, "row %d x=%g: avx512 p %a, want %a", i, (double)x,
                            (double)p1[i * COLS + j], (double)want);
        }
    CHECK(a1[0] == 0.0f && a2[0] > 0.0f); /* e^-50: flushed */
    CHECK(memcmp(&a1[1], &a2[1], 4) == 0 && a1[1] > 0.0f); /* e^-40: kept */
    CHECK(memcmp(m1, m2, sizeof m1) == 0);
}

/* The AVX-512 query packing gives the scalar kernel's bits: full and
 * partial 6-row groups, padding rows, d_k with and without a 16-tail,
 * head-major and position-major row strides. */
static void test_isa_pack_q(void) {
    if (!have()) return;
    const int rowss[] = {48, 13, 6, 1}, dks[] = {64, 13, 72, 16};
    uint64_t seed = 96;
    for (int t = 0; t < 4; t++) {
        const int rows = rowss[t], rows6 = (rows + 5) / 6 * 6, d_k = dks[t];
        for (int stride = 0; stride < 2; stride++) {
            const size_t rs = stride ? (size_t)d_k * 12 + 3 : (size_t)d_k;
            float *src = naive_random_floats(rs * rows6, &seed, -3, 3);
            float *a = naive_alloc_floats((size_t)rows6 * d_k), *b = naive_alloc_floats((size_t)rows6 * d_k);
            for (int i = 0; i < rows6 * d_k; i++) a[i] = b[i] = 7.0f; /* padding must become 0 */
            mha_attn_pack_q_avx512(a, src, rs, 0.125f, rows, rows6, d_k);
            mha_attn_pack_q_get(&mha_kernels_scalar)(b, src, rs, 0.125f, rows, rows6, d_k);
            if (memcmp(a, b, sizeof(float) * rows6 * d_k) != 0)
                test_report(__FILE__, __LINE__, "pack_q rows=%d d_k=%d stride %zu: avx512 differs from scalar", rows,
                            d_k, rs);
            /* and the scalar kernel is the layout kernels.h states */
            const int i = rows - 1, e = d_k - 1;
            CHECK(b[(size_t)(i / 6) * d_k * 6 + (size_t)e * 6 + i % 6] == 0.125f * src[(size_t)i * rs + e]);
            if (rows6 > rows) CHECK(b[(size_t)(rows6 / 6 - 1) * d_k * 6 + 5] == 0.0f);
            free(src), free(a), free(b);
        }
    }
}

/* The packed projection driver on the AVX-512 table (K in blocks that
 * continue each sum through c, the input packed and K^T stored by its
 * kernels, 216-row blocks for weights over 6 MiB) gives the bits of the
 * AVX2 table (one pass over K, the portable loops), on 1 and 2 threads,
 * into every destination layout, for a weight row block k0 > 0 (W_O's
 * per-head rows); section 0 is also checked against double sums. */
static void test_isa_gemm_blocks(void) {
    if (!have()) return;
    uint64_t seed = 93;
    enum { KP = 640, K0 = 40, KN = 600, M = 230, ROWS = 115, RP = 128, LDA = KN + 3 };
    for (int big = 0; big < 2; big++) {
        /* Q (rows) | K^T (8 heads of 48) | V (7 heads of 40, ld 41: tiles across heads) */
        const int cols[3] = {big ? 2000 : 100, 8 * 48, 7 * 40};
        const size_t nout[3] = {(size_t)M * cols[0], (size_t)2 * 8 * RP * 48, (size_t)2 * 7 * RP * 41};
        float *w[3], *b[3], *out[3][3];
        for (int q = 0; q < 3; q++) {
            w[q] = naive_random_floats((size_t)KP * cols[q], &seed, -1, 1);
            b[q] = naive_random_floats((size_t)cols[q], &seed, -1, 1);
        }
        float *a = naive_random_floats((size_t)M * LDA, &seed, -1, 1);
        mha_packed p;
        const float *const wc[3] = {w[0], w[1], w[2]}, *const bc[3] = {b[0], b[1], b[2]};
        CHECK_OK(mha_pack(&p, KP, 3, wc, bc, cols));
        const mha_kernels *tab[3] = {&mha_kernels_avx2, &mha_kernels_avx512, &mha_kernels_avx512};
        for (int run = 0; run < 3; run++) {
            for (int q = 0; q < 3; q++) out[run][q] = naive_alloc_floats(nout[q]);
            const mha_dst dst[3] = {
                {MHA_DST_ROWS, out[run][0], (size_t)cols[0], 0, 0, 0, 0},
                {MHA_DST_HEADS_T, out[run][1], 0, 48, 8, ROWS, (size_t)RP * 48},
                {MHA_DST_HEADS, out[run][2], 41, 40, 7, ROWS, (size_t)RP * 41},
            };
            const mha_gemm_args g = {dst, a, LDA, M, &p, 0, 3, K0, KN, 1, 0};
            CHECK_OK(mha_gemm(&g, tab[run], run == 2 ? 2 : 1));
        }
        for (int run = 1; run < 3; run++)
            for (int q = 0; q < 3; q++)
                if (memcmp(out[0][q], out[run][q], sizeof(float) * nout[q]) != 0)
                    test_report(__FILE__, __LINE__, "weights %s, section %d: avx512 on %d thread(s) differs from avx2",
                                big ? "> 6 MiB" : "small", q, run);
        double err = 0.0;
        for (int m = 0; m < M && !big; m++)
            for (int c = 0; c < cols[0]; c++) {
                double acc = b[0][c];
                for (int k = 0; k < KN; k++)
                    acc += (double)a[(size_t)m * LDA + k] * w[0][(size_t)(K0 + k) * cols[0] + c];
                err = fmax(err, fabs(out[1][0][(size_t)m * cols[0] + c] - acc));
            }
        if (err > 1e-6 * KN)
            test_report(__FILE__, __LINE__, "k0 = %d, %d rows: max error %.3g vs double", K0, KN, err);
        for (int q = 0; q < 3; q++) {
            for (int run = 0; run < 3; run++) free(out[run][q]);
            free(w[q]), free(b[q]);
        }
        free(a);
        mha_packed_free(&p);
    }
}

static const test_case cases[] = {
    {"isa_detect", test_isa_detect},
    {"isa_env_avx512", test_isa_env_avx512},
    {"isa_tile_12x32", test_isa_tile_12x32},
    {"isa_gemm_blocks", test_isa_gemm_blocks},
    {"isa_attention_steps", test_isa_attention_steps},
    {"isa_exp_every_float", test_isa_exp_every_float},
    {"isa_decode_kernels", test_isa_decode_kernels},
    {"isa_f16_conversion", test_isa_f16_conversion},
    {"isa_stream_halves", test_isa_stream_halves},
    {"isa_variant_kernels", test_isa_variant_kernels},
    {"isa_softmax_flush", test_isa_softmax_flush},
    {"isa_pack_q", test_isa_pack_q},
};

const test_case *tests_isa(size_t *count) {
    *count = sizeof cases / sizeof cases[0];
    return cases;
}
