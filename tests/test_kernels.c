/* test_kernels.c — the micro-kernels against plain loops: the 6x16 GEMM
 * tile at every edge size and stride, the packed-projection driver with
 * each output layout, the vector exp's ulp error against exp() in
 * double over the range the softmax uses, and the softmax's own exp
 * (kernels.h: MHA_SOFTMAX_EXP_*) through attn_softmax; the driver's
 * input packing and transposed store against their loops; the fast path's
 * range check (key norms, |V| within a limit); the driver's
 * scratch is kept between calls (no page faults once warm). Every kernel table is tested
 * (avx2 and avx512 only where the CPU has them).
 * Legend: m x n tile (<= 6 x 16), K inner size, M rows, N columns. */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "compute/gemm.h"
#include "kernels/kernels.h"
#include "naive.h"
#include "test_util.h"
#include "tests.h"

static const mha_kernels *tables[3];
static int n_tables(void) {
    int n = 0;
    tables[n++] = &mha_kernels_scalar;
    if (mha_cpu_has_avx2()) tables[n++] = &mha_kernels_avx2;
    if (mha_cpu_has_avx512()) tables[n++] = &mha_kernels_avx512;
    return n;
}

/* c (m,n) = [rs*c +] a b [+ bias] in double, a element (i,k) at a[i*ars + k*acs]. */
static void gemm_ref(double *c, const float *c0, size_t ldc, const float *a, size_t ars, size_t acs,
                     const float *b, size_t ldb, const float *bias, const float *rs, int K, int m, int n) {
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            double acc = bias ? bias[j] : 0.0;
            for (int k = 0; k < K; k++) acc += (double)a[i * ars + k * acs] * b[(size_t)k * ldb + j];
            if (rs) acc += (double)rs[i] * c0[i * ldc + j];
            c[i * n + j] = acc;
        }
}

static void test_kernels_sgemm_edges(void) {
    uint64_t seed = 21;
    const int Ks[] = {1, 2, 7, 16, 64, 129};
    const int nt = n_tables();
    for (int t = 0; t < nt; t++)
        for (int ki = 0; ki < 6; ki++)
            for (int m = 1; m <= 6; m++)
                for (int n = 1; n <= 16; n++)
                    for (int mode = 0; mode < 3; mode++) { /* 0 packed a, 1 strided a + bias, 2 row scale */
                        const int K = Ks[ki];
                        const size_t ldc = 21, ldb = 16 + (mode == 1 ? 3 : 0);
                        const size_t ars = mode == 0 ? 1 : (size_t)K + 2, acs = mode == 0 ? 6 : 1;
                        float *a = naive_random_floats(6 * ((size_t)K + 2), &seed, -1.0f, 1.0f);
                        float *b = naive_random_floats((size_t)K * ldb, &seed, -1.0f, 1.0f);
                        float bias[16], rs[6], c[8 * 21], c0[8 * 21];
                        double want[6 * 16];
                        test_fill_uniform(bias, 16, &seed, -1.0f, 1.0f);
                        test_fill_uniform(rs, 6, &seed, -1.0f, 1.0f);
                        test_fill_uniform(c0, 8 * 21, &seed, -1.0f, 1.0f);
                        memcpy(c, c0, sizeof c);
                        const float *bp = mode == 1 ? bias : NULL, *rp = mode == 2 ? rs : NULL;
                        /* c starts one row in: row 0 and row m+1 are guards */
                        tables[t]->sgemm_6x16(c + ldc, ldc, a, ars, acs, b, ldb, bp, rp, K, m, n);
                        gemm_ref(want, c0 + ldc, ldc, a, ars, acs, b, ldb, bp, rp, K, m, n);
                        double err = 0.0;
                        int guards_ok = 1;
                        for (int i = 0; i < 8; i++)
                            for (int j = 0; j < 21; j++) {
                                int inside = i >= 1 && i <= m && j < n;
                                if (inside) {
                                    double d = fabs(c[i * ldc + j] - want[(i - 1) * n + j]);
                                    if (d > err) err = d;
                                } else if (c[i * ldc + j] != c0[i * ldc + j]) {
                                    guards_ok = 0;
                                }
                            }
                        if (err > 1e-6 * (K + 2) || !guards_ok)
                            test_report(__FILE__, __LINE__, "%s 6x16 m=%d n=%d K=%d mode=%d: err %.3g, guards %s",
                                        tables[t]->name, m, n, K, mode, err, guards_ok ? "ok" : "overwritten");
                        free(a), free(b);
                    }
}

/* The driver: three sections (odd widths), each layout, vs plain loops;
 * and 1 vs 2 threads bit-identical. */
static void test_kernels_gemm_driver(void) {
    uint64_t seed = 22;
    const int Ms[] = {1, 5, 73, 150}, Ks[] = {3, 17};
    const int nt = n_tables();
    for (int t = 0; t < nt; t++)
        for (int mi = 0; mi < 4; mi++)
            for (int ki = 0; ki < 2; ki++) {
                const int M = Ms[mi], K = Ks[ki], cols[3] = {21, 10, 35}; /* Q | K (2 heads of 5) | V (5 heads of 7) */
                const int rows = M % 2 == 0 ? M / 2 : M, nb = M / rows; /* 1 or 2 "batches" */
                float *w[3], *b[3];
                for (int s = 0; s < 3; s++) {
                    w[s] = naive_random_floats((size_t)K * cols[s], &seed, -1.0f, 1.0f);
                    b[s] = naive_random_floats((size_t)cols[s], &seed, -1.0f, 1.0f);
                }
                float *a = naive_random_floats((size_t)M * (K + 1), &seed, -1.0f, 1.0f);
                mha_packed p;
                const float *const wc[3] = {w[0], w[1], w[2]}, *const bc[3] = {b[0], b[1], b[2]};
                CHECK_OK(mha_pack(&p, K, 3, wc, bc, cols));
                const int rp = (rows + 15) / 16 * 16;
                float *outs[2][3];
                for (int rep = 0; rep < 2; rep++) {
                    outs[rep][0] = naive_alloc_floats((size_t)M * 21);
                    outs[rep][1] = naive_alloc_floats((size_t)nb * 2 * rp * 5);
                    outs[rep][2] = naive_alloc_floats((size_t)nb * 5 * rp * 8);
                    mha_dst dst[3] = {
                        {MHA_DST_ROWS, outs[rep][0], 21, 0, 0, 0, 0},
                        {MHA_DST_HEADS_T, outs[rep][1], 0, 5, 2, rows, (size_t)rp * 5},
                        {MHA_DST_HEADS, outs[rep][2], 8, 7, 5, rows, (size_t)rp * 8},
                    };
                    const mha_gemm_args g = {dst, a, K + 1, M, &p, 0, 3, 0, K, 1, 0};
                    CHECK_OK(mha_gemm(&g, tables[t], 1 + rep));
                }
                double err = 0.0;
                for (int m = 0; m < M; m++)
                    for (int s = 0; s < 3; s++)
                        for (int c = 0; c < cols[s]; c++) {
                            double acc = b[s][c];
                            for (int k = 0; k < K; k++) acc += (double)a[(size_t)m * (K + 1) + k] * w[s][(size_t)k * cols[s] + c];
                            int bb = m / rows, r = m % rows;
                            float got;
                            if (s == 0) got = outs[0][0][(size_t)m * 21 + c];
                            else if (s == 1) got = outs[0][1][((size_t)bb * 2 + c / 5) * rp * 5 + (r / 16) * 80 + (c % 5) * 16 + r % 16];
                            else got = outs[0][2][(((size_t)bb * 5 + c / 7) * rp + r) * 8 + c % 7];
                            if (fabs(got - acc) > err) err = fabs(got - acc);
                        }
                if (err > 1e-5 * K)
                    test_report(__FILE__, __LINE__, "%s driver M=%d K=%d: max err %.3g", tables[t]->name, M, K, err);
                CHECK(memcmp(outs[0][0], outs[1][0], sizeof(float) * M * 21) == 0);
                CHECK(memcmp(outs[0][1], outs[1][1], sizeof(float) * nb * 2 * rp * 5) == 0);
                CHECK(memcmp(outs[0][2], outs[1][2], sizeof(float) * nb * 5 * rp * 8) == 0);
                for (int rep = 0; rep < 2; rep++)
                    for (int s = 0; s < 3; s++) free(outs[rep][s]);
                for (int s = 0; s < 3; s++) free(w[s]), free(b[s]);
                free(a);
                mha_packed_free(&p);
            }
}

static long minor_faults(void) {
    struct rusage r;
    getrusage(RUSAGE_SELF, &r);
    return r.ru_minflt;
}

/* A warm projection allocates no scratch and faults in no new pages: the
 * threads' packed input blocks (72 x 1024 floats = 72 pages each here) are
 * kept between calls, not allocated per call (glibc returned them to the
 * system on free, so every call faulted them in again: about 80 faults a
 * call on 2 threads in a process of its own; whether it does depends on
 * malloc's state, so the allocations are counted too). */
static void test_kernels_gemm_scratch_kept(void) {
    uint64_t seed = 23;
    const int M = 512, K = 1024, N = 32, calls = 10;
    float *a = naive_random_floats((size_t)M * K, &seed, -1.0f, 1.0f); /* (M, K) */
    float *w = naive_random_floats((size_t)K * N, &seed, -1.0f, 1.0f); /* (K, N) */
    float *y = naive_alloc_floats((size_t)M * N);                      /* (M, N) */
    mha_packed p;
    const float *const wc[1] = {w}, *const bc[1] = {NULL};
    CHECK_OK(mha_pack(&p, K, 1, wc, bc, &N));
    const mha_dst dst = {MHA_DST_ROWS, y, (size_t)N, 0, 0, 0, 0};
    const mha_gemm_args g = {&dst, a, (size_t)K, M, &p, 0, 1, 0, K, 1, 0};
    const int nt = n_tables();
    for (int t = 0; t < nt; t++) {
        for (int i = 0; i < 3; i++) CHECK_OK(mha_gemm(&g, tables[t], 2)); /* warm: blocks, threads */
        const long before = minor_faults();
        const size_t allocs = mha_gemm_scratch_allocations();
        for (int i = 0; i < calls; i++) CHECK_OK(mha_gemm(&g, tables[t], 2));
        const long faults = minor_faults() - before;
        CHECK(mha_gemm_scratch_allocations() == allocs);
        /* a kept block that a thread took but never wrote (no task came
         * its way) faults in once, the first time it is used: <= 72 pages */
        if (faults > 2 * 72)
            test_report(__FILE__, __LINE__, "%s: %ld page faults in %d warm projections (want <= %d)",
                        tables[t]->name, faults, calls, 2 * 72);
    }
    mha_packed_free(&p);
    free(a), free(w), free(y);
}

/* ulp distance of float f from the double truth e */
static double ulp_err(float f, double e) {
    double ulp = e >= FLT_MIN ? ldexp(1.0, ilogb(e) - 23) : ldexp(1.0, -149);
    return fabs((double)f - e) / ulp;
}

/* The softmax evaluates exp on s - max <= 0, down to where e^x leaves the
 * normal floats; positive arguments up to 88.3 are checked too. */
static void test_kernels_vexp_ulp(void) {
    const int nt = n_tables();
    const size_t n = 1 << 20;
    float *x = malloc(n * sizeof(float)), *y = malloc(n * sizeof(float));
    for (int t = 0; t < nt; t++) {
        double worst = 0.0;
        float worst_x = 0.0f;
        for (int part = 0; part < 3; part++) {
            /* dense near 0 (most probabilities), then the whole range */
            const double lo = part == 0 ? -1.0 : part == 1 ? -87.3 : 0.0, hi = part == 0 ? 1.0 : part == 1 ? 0.0 : 88.3;
            for (size_t i = 0; i < n; i++) x[i] = (float)(lo + (hi - lo) * (double)i / (double)(n - 1));
            tables[t]->vexp(y, x, n);
            for (size_t i = 0; i < n; i++) {
                double e = ulp_err(y[i], exp((double)x[i]));
                if (e > worst) worst = e, worst_x = x[i];
            }
        }
        if (worst > 2.0)
            test_report(__FILE__, __LINE__, "%s exp: max error %.2f ulp at x=%.9g (want <= 2)", tables[t]->name, worst, (double)worst_x);
        /* the edges the softmax relies on */
        float e[5] = {0.0f, -INFINITY, -100.0f, -87.4f, 1e-8f};
        tables[t]->vexp(e, e, 5);
        CHECK(e[0] == 1.0f);
        CHECK(e[1] == 0.0f);
        CHECK(e[2] >= 0.0f && e[2] < FLT_MIN);
        CHECK(e[3] >= 0.0f && e[3] < 1.2e-38f);
        CHECK(e[4] == 1.0f);
    }
    free(x), free(y);
}

/* attn_softmax's probabilities are exp(s - max) with the softmax's own
 * exp (degree 5, kernels.h): within 2.5 ulp of exp() in double on
 * [MHA_SOFTMAX_FLUSH, 0] (the AVX-512 kernel gives 0 below), dense near 0
 * and across the range; column 0 of each row holds the max 0. */
static void test_kernels_softmax_exp_ulp(void) {
    enum { ROWS = 6, COLS = 128, N = 1 << 17 };
    const int nt = n_tables();
    float *s = malloc(sizeof(float) * ROWS * COLS), *x = malloc(sizeof(float) * ROWS * COLS);
    for (int t = 0; t < nt; t++) {
        double worst = 0.0;
        float worst_x = 0.0f;
        for (int k = 0; k < N; k += ROWS * (COLS - 1)) {
            float m[ROWS], l[ROWS], alpha[ROWS];
            for (int i = 0; i < ROWS; i++) {
                m[i] = -INFINITY, l[i] = 0.0f;
                for (int j = 0; j < COLS; j++) {
                    const int n = k + i * (COLS - 1) + j - 1; /* sample n of N: half in [-1, 0], half in [-44, 0] */
                    const double u = (double)(n % (N / 2)) / (double)(N / 2 - 1);
                    x[i * COLS + j] = j == 0 ? 0.0f : (float)(n < N / 2 ? -u : (double)MHA_SOFTMAX_FLUSH * u);
                }
            }
            memcpy(s, x, sizeof(float) * ROWS * COLS);
            tables[t]->attn_softmax(s, COLS, m, l, alpha, NULL, NULL, COLS, ROWS, COLS);
            for (int i = 0; i < ROWS * COLS; i++) {
                const double e = ulp_err(s[i], exp((double)x[i]));
                if (e > worst) worst = e, worst_x = x[i];
            }
            for (int i = 0; i < ROWS; i++) CHECK(m[i] == 0.0f && alpha[i] == 0.0f);
        }
        if (worst > 2.5)
            test_report(__FILE__, __LINE__, "%s softmax exp: max error %.2f ulp at x=%.9g (want <= 2.5)", tables[t]->name,
                        worst, (double)worst_x);
    }
    free(s), free(x);
}

/* The range check's loops (kernels.h: key_norm_max, all_within) of every
 * table against plain loops written here: the largest squared key norm
 * bit for bit (each key summed in e order in double) for 1-9 panels
 * (the vector kernels take 4 or 2 panels at a time, then one) and widths
 * 1-67, NaN when one key holds a NaN (in a first, middle and last panel
 * and lane), +inf for an infinite key; all_within at every length 0-150
 * with the one offending element at each place, at exactly the limit
 * (within) and one ulp past it, -limit, NaN and -inf. */
static void test_kernels_range_check(void) {
    const int nt = n_tables();
    enum { MAXP = 9, MAXD = 67, MAXN = 150 };
    float *kt = malloc(sizeof(float) * MAXP * MAXD * 16), x[MAXN];
    uint64_t seed = 17;
    for (int t = 0; t < nt; t++) {
        double (*norm)(const float *, int, int) = tables[t]->key_norm_max;
        int (*within)(const float *, size_t, float) = tables[t]->all_within;
        for (int n16 = 1; n16 <= MAXP; n16++)
            for (int d_k = 1; d_k <= MAXD; d_k += d_k < 8 ? 1 : 29) {
                const int n = n16 * d_k * 16;
                test_fill_uniform(kt, (size_t)n, &seed, -3.0f, 3.0f);
                double want = 0.0;
                for (int key = 0; key < n16 * 16; key++) {
                    double sq = 0.0;
                    for (int e = 0; e < d_k; e++) {
                        const double v = kt[(key / 16) * d_k * 16 + e * 16 + key % 16];
                        sq += v * v;
                    }
                    if (sq > want) want = sq;
                }
                const double got = norm(kt, n16, d_k);
                if (got != want)
                    test_report(__FILE__, __LINE__, "%s key_norm_max n16=%d d_k=%d: %.17g, want %.17g",
                                tables[t]->name, n16, d_k, got, want);
                const int at[3] = {0, n / 2 + 5 < n ? n / 2 + 5 : n - 1, n - 1};
                for (int w = 0; w < 3; w++) {
                    const float keep = kt[at[w]];
                    kt[at[w]] = NAN;
                    if (!isnan(norm(kt, n16, d_k)))
                        test_report(__FILE__, __LINE__, "%s key_norm_max n16=%d d_k=%d: NaN at %d not reported",
                                    tables[t]->name, n16, d_k, at[w]);
                    kt[at[w]] = -INFINITY;
                    CHECK(norm(kt, n16, d_k) == INFINITY);
                    kt[at[w]] = keep;
                }
            }
        const float lim = 2.5f, past = nextafterf(lim, INFINITY);
        const float bad[4] = {past, -past, NAN, -INFINITY};
        for (int n = 0; n <= MAXN; n++) {
            test_fill_uniform(x, (size_t)n, &seed, -lim, lim);
            if (n) x[n - 1] = lim, x[0] = -lim;
            if (!within(x, (size_t)n, lim))
                test_report(__FILE__, __LINE__, "%s all_within n=%d: values within the limit refused", tables[t]->name, n);
            for (int i = 0; i < n; i++)
                for (int b = 0; b < 4; b++) {
                    const float keep = x[i];
                    x[i] = bad[b];
                    if (within(x, (size_t)n, lim))
                        test_report(__FILE__, __LINE__, "%s all_within n=%d: %g at %d not caught", tables[t]->name, n,
                                    (double)bad[b], i);
                    x[i] = keep;
                }
        }
    }
    free(kt);
}

/* Every table's pack_a6 and store_t16 (where it has them) against the
 * loops their contracts state, and its attn_pack_q against the scalar one: the same bytes at every row count (1-6 and
 * 1-16), width 1-45 and column count 1-16, rows past `rows` zero, and not
 * one float written outside its place (sentinels around out and between
 * dst's columns, whose offsets are scattered and unordered as K^T's). */
static void test_kernels_pack_store(void) {
    const int nt = n_tables();
    enum { LDA = 53, MAXK = 45, LDS = 19, GAP = 23 };
    uint64_t seed = 29;
    float a[6 * LDA], src[16 * LDS], out[MAXK * 6 + 16], dst[16 * GAP + 8];
    test_fill_uniform(a, 6 * LDA, &seed, -1.0f, 1.0f);
    test_fill_uniform(src, 16 * LDS, &seed, -1.0f, 1.0f);
    const float sentinel = -7.25f;
    int checked = 0;
    for (int t = 0; t < nt; t++) {
        const mha_kernels *k = tables[t];
        for (int rows = 1; k->pack_a6 && rows <= 6; rows++)
            for (int kn = 1; kn <= MAXK; kn++) {
                for (size_t i = 0; i < sizeof out / sizeof out[0]; i++) out[i] = sentinel;
                k->pack_a6(out, a, LDA, rows, kn);
                int ok = 1;
                for (int kk = 0; kk < kn; kk++)
                    for (int i = 0; i < 6; i++) {
                        const float want = i < rows ? a[i * LDA + kk] : 0.0f;
                        ok &= memcmp(&out[kk * 6 + i], &want, sizeof want) == 0;
                    }
                for (size_t i = (size_t)kn * 6; i < sizeof out / sizeof out[0]; i++) ok &= out[i] == sentinel;
                if (!ok) test_report(__FILE__, __LINE__, "%s pack_a6 rows=%d kn=%d: wrong bytes", k->name, rows, kn);
                checked++;
            }
        for (int rows = 1; k->store_t16 && rows <= 16; rows++)
            for (int n = 1; n <= 16; n++) {
                size_t coff[16];
                for (int j = 0; j < 16; j++) coff[j] = (size_t)((j * 7) % 16) * GAP; /* a permutation of the columns */
                for (size_t i = 0; i < sizeof dst / sizeof dst[0]; i++) dst[i] = sentinel;
                k->store_t16(dst, coff, src, LDS, rows, n);
                int ok = 1;
                for (int j = 0; j < 16; j++)
                    for (int i = 0; i < GAP; i++) {
                        const float got = dst[coff[j] + (size_t)i];
                        ok &= j < n && i < rows ? memcmp(&got, &src[i * LDS + j], sizeof got) == 0 : got == sentinel;
                    }
                if (!ok) test_report(__FILE__, __LINE__, "%s store_t16 rows=%d n=%d: wrong bytes", k->name, rows, n);
                checked++;
            }
    }
    /* the vector tables have both (the scalar one runs the driver's loops) */
    CHECK(checked == (nt - 1) * (6 * MAXK + 16 * 16));
    /* the attention's query packing: every table's against the scalar one,
     * rows 1-13 in 6-row groups (and one more group of zeros), a scale that
     * rounds (0.3), d_k 1-45 */
    enum { MAXR = 13, LDQ = 47, CAP = 3 * 6 * MAXK + 16 };
    float *q = malloc(sizeof(float) * MAXR * LDQ), *want = malloc(sizeof(float) * CAP), *got = malloc(sizeof(float) * CAP);
    test_fill_uniform(q, (size_t)MAXR * LDQ, &seed, -2.0f, 2.0f);
    void (*ref)(float *, const float *, size_t, float, int, int, int) = mha_attn_pack_q_get(&mha_kernels_scalar);
    for (int t = 0; t < nt; t++)
        for (int rows = 1; rows <= MAXR; rows++)
            for (int d_k = 1; d_k <= MAXK; d_k += d_k < 9 ? 1 : 6) {
                const int rows6 = (rows + 5) / 6 * 6 + (rows % 2 ? 6 : 0);
                if ((size_t)rows6 * d_k > (size_t)3 * 6 * MAXK) continue;
                for (int i = 0; i < CAP; i++) want[i] = got[i] = sentinel;
                ref(want, q, LDQ, 0.3f, rows, rows6, d_k);
                mha_attn_pack_q_get(tables[t])(got, q, LDQ, 0.3f, rows, rows6, d_k);
                if (memcmp(want, got, sizeof(float) * CAP) != 0)
                    test_report(__FILE__, __LINE__, "%s attn_pack_q rows=%d rows6=%d d_k=%d: not the scalar bytes",
                                tables[t]->name, rows, rows6, d_k);
            }
    free(q), free(want), free(got);
}

/* Every table's ALiBi tile against the scalar one: the same bits for
 * distances up to 2^30 both ways and every column count 1-37 (masked
 * tails), nothing past cols touched. */
static void test_kernels_alibi_tables(void) {
    const int nt = n_tables();
    enum { ROWS = 4, COLS = 37, LDS = 48 };
    int qpos[ROWS] = {0, 1000, 1 << 30, 7}, kpos[LDS];
    for (int j = 0; j < LDS; j++) kpos[j] = j % 3 == 0 ? (1 << 30) - j : j * 37;
    uint64_t seed = 95;
    float *a = naive_random_floats(ROWS * LDS, &seed, -4, 4), *b = naive_alloc_floats(ROWS * LDS);
    float *c = naive_alloc_floats(ROWS * LDS);
    void (*ref)(float *, size_t, const int *, const int *, float, int, int) = mha_attn_alibi_get(&mha_kernels_scalar);
    for (int t = 0; t < nt; t++)
        for (int cols = 1; cols <= COLS; cols++) {
            memcpy(b, a, sizeof(float) * ROWS * LDS), memcpy(c, a, sizeof(float) * ROWS * LDS);
            mha_attn_alibi_get(tables[t])(b, LDS, qpos, kpos, 0.0625f, ROWS, cols);
            ref(c, LDS, qpos, kpos, 0.0625f, ROWS, cols);
            int ok = memcmp(b, c, sizeof(float) * ROWS * LDS) == 0;
            for (int i = 0; i < ROWS; i++) /* the columns past cols as they were */
                ok &= memcmp(b + i * LDS + cols, a + i * LDS + cols, sizeof(float) * (LDS - cols)) == 0;
            if (!ok) test_report(__FILE__, __LINE__, "%s alibi cols=%d: not the scalar bits", tables[t]->name, cols);
        }
    /* a far key: the bias itself, not only agreement */
    memcpy(b, a, sizeof(float) * ROWS * LDS);
    mha_attn_alibi_get(tables[nt - 1])(b, LDS, qpos, kpos, 0.0625f, ROWS, COLS);
    CHECK(b[3 * LDS + 3] == a[3 * LDS + 3] - 0.0625f * (float)((1 << 30) - 3 - 7));
    free(a), free(b), free(c);
}

static const test_case cases[] = {
    {"kernels_sgemm_edges", test_kernels_sgemm_edges},
    {"kernels_alibi_tables", test_kernels_alibi_tables},
    {"kernels_pack_store", test_kernels_pack_store},
    {"kernels_gemm_driver", test_kernels_gemm_driver},
    {"kernels_gemm_scratch_kept", test_kernels_gemm_scratch_kept},
    {"kernels_vexp_ulp", test_kernels_vexp_ulp},
    {"kernels_softmax_exp_ulp", test_kernels_softmax_exp_ulp},
    {"kernels_range_check", test_kernels_range_check},
};

const test_case *tests_kernels(size_t *count) {
    *count = sizeof cases / sizeof cases[0];
    return cases;
}
