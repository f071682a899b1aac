/* test_cache_i8.c — the int8 KV cache (MHA_CACHE_I8), and caches with K
 * and V in different types (mha_cache_create_kv: K int8 / V fp16 and the
 * other pairs, "cache_mixed_*"), against a reference written here from
 * the math (fp16: naive_round_f16, the tests' own rounding): K and V rounded to fp32, quantized per
 * block of 32 values (scale = max|x| / 127, q = round half away from
 * zero of x / scale, clamp to +-127, scale 0 for a zero block),
 * dequantized (q * scale), then attention (naive_cache_attend, naive.c)
 * and W_O in double. Nothing of src/ is used by the reference.
 *
 * Tolerances:
 *  attend level (the cache gets exactly our K/V): the fp32 rule on the
 *    dequantized data, max|cache - ref| <= 2 * max|naive32 - ref| + 1e-6,
 *    naive32 being fp32 attention over the same dequantized K/V. The test
 *    also measures the quantization effect e_q = max|ref - ref on the
 *    unquantized K/V| and requires the tolerance to be < e_q / 50, so a
 *    wrong rounding (truncation) or a wrong block scale cannot pass.
 *  forward level (the cache projects K/V itself, in another order, so an
 *    element near a rounding tie may land on the other integer): the
 *    fp32 cache's own error against the unquantized reference, doubled,
 *    plus e_q / 10 for such rare flips; again tol < e_q / 2 is checked.
 * Legend: B sequences, T tokens, h, h_kv heads, d_k, d_v, D = d_model. */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cache/cache_internal.h"
#include "naive.h"
#include "test_util.h"
#include "tests.h"

/* ---------------------------------------------- reference quantizer */

/* x (d) in place -> its dequantized value, block by block; q and scale
 * (ceil(d/32)) receive the stored form when not NULL. */
static void ref_quantize(float *x, int d, int8_t *q, float *scale) {
    for (int b0 = 0; b0 < d; b0 += 32) {
        int n = d - b0 < 32 ? d - b0 : 32;
        float amax = 0.0f;
        for (int i = 0; i < n; i++) amax = fmaxf(amax, fabsf(x[b0 + i]));
        float s = amax / 127.0f;
        if (scale) scale[b0 / 32] = s;
        for (int i = 0; i < n; i++) {
            double r = s == 0.0f ? 0.0 : (double)(x[b0 + i] / s);
            double qi = r < 0 ? -floor(-r + 0.5) : floor(r + 0.5); /* half away from 0 */
            qi = qi > 127 ? 127 : qi < -127 ? -127 : qi;
            if (q) q[b0 + i] = (int8_t)qi;
            x[b0 + i] = (float)(int)qi * s; /* via int: -0.0 becomes 0, as stored */
        }
    }
}

/* The storage types of the caches the attend and forward-level tests
 * create (the mixed cases set them around a run, then restore int8). */
static mha_cache_dtype g_kt = MHA_CACHE_I8, g_vt = MHA_CACHE_I8;

/* x (d) in place -> the value a cache of type dt gives back. */
static void ref_store(float *x, int d, mha_cache_dtype dt) {
    if (dt == MHA_CACHE_I8) ref_quantize(x, d, NULL, NULL);
    for (int i = 0; dt == MHA_CACHE_F16 && i < d; i++) x[i] = naive_round_f16(x[i]);
}

/* Activations with outlier channels: uniform noise in [-1, 1) and every
 * 13th channel 12x larger (as the few large channels of LLM keys). */
static float *outlier_floats(size_t rows, int width, uint64_t *seed) {
    float *x = naive_random_floats(rows * width, seed, -1.0f, 1.0f);
    for (size_t r = 0; r < rows; r++)
        for (int c = 5; c < width; c += 13) x[r * width + c] *= 12.0f;
    return x;
}

/* ---------------------------------------------------- attend level */

/* Appends random K/V (outlier channels) with mha_cache_append, attends
 * all T queries (prefill) and then the last query alone (decode) with
 * mha_cache_attend, against naive_cache_attend on the dequantized K/V. */
static void attend_case(int h, int hk, int dk, int dv, int T) {
    mha_config cfg = naive_config(64, h, hk, dk, dv, 0);
    naive_weights w;
    uint64_t seed = 101 + (uint64_t)(h * 7 + hk + dk);
    mha_config r = naive_resolve(cfg);
    naive_weights_random(&w, &r, &seed, 0.3f);
    mha_layer *L = naive_make_layer(&w);
    float *q = outlier_floats((size_t)T, h * dk, &seed), *k = outlier_floats((size_t)T, hk * dk, &seed);
    float *v = outlier_floats((size_t)T, hk * dv, &seed);
    float *kd = malloc(sizeof(float) * T * hk * dk), *vd = malloc(sizeof(float) * T * hk * dv);
    memcpy(kd, k, sizeof(float) * T * hk * dk), memcpy(vd, v, sizeof(float) * T * hk * dv);
    for (int i = 0; i < T * hk; i++) ref_store(kd + (size_t)i * dk, dk, g_kt), ref_store(vd + (size_t)i * dv, dv, g_vt);
    size_t nz = (size_t)T * h * dv;
    double *zr = naive_alloc_doubles(nz), *z32 = naive_alloc_doubles(nz), *zu = naive_alloc_doubles(nz);
    naive_cache_attend(zr, NULL, q, kd, vd, 1, T, T, 0, h, hk, dk, dv, -1, 1);
    naive_cache_attend(z32, NULL, q, kd, vd, 1, T, T, 0, h, hk, dk, dv, -1, 0);
    naive_cache_attend(zu, NULL, q, k, v, 1, T, T, 0, h, hk, dk, dv, -1, 1);
    float *z = naive_alloc_floats(nz);
    double e32 = 0.0, eq = 0.0;
    for (size_t i = 0; i < nz; i++) {
        e32 = fmax(e32, fabs(z32[i] - zr[i]));
        eq = fmax(eq, fabs(zu[i] - zr[i]));
    }
    double tol = 2.0 * e32 + 1e-6;
    CHECK(tol < eq / 50.0); /* tight: a wrong rounding or scale moves z by ~eq */
    for (int ker = 0; ker < 2; ker++) {
        mha_decode_force_scalar(ker);
        mha_cache *c = NULL;
        CHECK_OK(mha_cache_create_kv(&c, L, 1, T, g_kt, g_vt, 0));
        if (!c) break;
        CHECK_OK(mha_cache_append(c, k, v, T, NULL));
        CHECK_OK(mha_cache_attend(c, z, q, T, NULL, 0.0f));
        CHECK(naive_max_diff(z, zr, nz) <= tol);
        /* decode: the last query alone */
        CHECK_OK(mha_cache_attend(c, z, q + (size_t)(T - 1) * h * dk, 1, NULL, 0.0f));
        CHECK(naive_max_diff(z, zr + nz - (size_t)h * dv, (size_t)h * dv) <= tol);
        mha_cache_free(c);
    }
    mha_decode_force_scalar(0);
    mha_layer_free(L), naive_weights_free(&w);
    free(q), free(k), free(v), free(kd), free(vd), free(zr), free(z32), free(zu), free(z);
}

/* MHA and GQA (<= 4 rows per kv head: fused kernels), MQA (8 rows: the
 * chunk is widened once), d not a multiple of 32 (shorter last block),
 * d_v = 72 (the 1 x 64 column tile and a tail), two chunks and a part. */
static void test_attend_mha(void) { attend_case(4, 4, 40, 72, 300); }
static void test_attend_gqa(void) { attend_case(8, 2, 64, 24, 200); }
static void test_attend_mqa(void) { attend_case(8, 1, 20, 72, 260); }
/* 32 heads on one kv head: a one-token decode is 32 rows, run grouped
 * (the chunk widened once, scores keys by rows; decode.c) */
static void test_attend_mqa32(void) { attend_case(32, 1, 64, 72, 300); }

/* A long MQA decode: 32 rows on one kv head (grouped on AVX-512) over 9
 * chunks, which the tasks fold in groups of chunks (decode.c,
 * GROUP_CHUNKS: 4, 4 and 1) merged in order. Per storage type: within
 * the fp32 tolerance of the double reference on the stored K/V; 1 and 2
 * threads bit-identical; and a prefill of the last 64 queries (64 units:
 * each runs its groups in order on one thread, not split) gives the
 * decode's bits for its last query (and so passes the same check). */
static void test_grouped_fold(void) {
    enum { H = 32, DK = 32, DV = 40, S = 1100, T = 64, R = 8 /* queries the reference computes */ };
    const mha_cache_dtype kts[4] = {MHA_CACHE_F32, MHA_CACHE_F16, MHA_CACHE_I8, MHA_CACHE_I8};
    const mha_cache_dtype vts[4] = {MHA_CACHE_F32, MHA_CACHE_F16, MHA_CACHE_I8, MHA_CACHE_F16};
    mha_config cfg = naive_config(64, H, 1, DK, DV, 0);
    naive_weights w;
    uint64_t seed = 331;
    mha_config r = naive_resolve(cfg);
    naive_weights_random(&w, &r, &seed, 0.3f);
    mha_layer *L = naive_make_layer(&w);
    float *q = outlier_floats((size_t)T, H * DK, &seed), *k = outlier_floats((size_t)S, DK, &seed);
    float *v = outlier_floats((size_t)S, DV, &seed);
    float *kd = malloc(sizeof(float) * S * DK), *vd = malloc(sizeof(float) * S * DV);
    const size_t nz = (size_t)T * H * DV, nd = (size_t)H * DV;
    double *zr = naive_alloc_doubles(R * nd), *z32 = naive_alloc_doubles(R * nd);
    const float *ql = q + (size_t)(T - 1) * H * DK; /* the last query, position S - 1 */
    float *zp = naive_alloc_floats(nz), *zd[2] = {naive_alloc_floats(nd), naive_alloc_floats(nd)};
    for (int ty = 0; ty < 4; ty++) {
        memcpy(kd, k, sizeof(float) * S * DK), memcpy(vd, v, sizeof(float) * S * DV);
        for (int i = 0; i < S; i++) ref_store(kd + (size_t)i * DK, DK, kts[ty]), ref_store(vd + (size_t)i * DV, DV, vts[ty]);
        /* the last R queries (the tolerance from more than one token) */
        naive_cache_attend(zr, NULL, ql - (R - 1) * H * DK, kd, vd, 1, R, S, S - R, H, 1, DK, DV, -1, 1);
        naive_cache_attend(z32, NULL, ql - (R - 1) * H * DK, kd, vd, 1, R, S, S - R, H, 1, DK, DV, -1, 0);
        double e32 = 0.0;
        for (size_t i = 0; i < R * nd; i++) e32 = fmax(e32, fabs(z32[i] - zr[i]));
        const double tol = 2.0 * e32 + 1e-6;
        mha_cache *c = NULL;
        CHECK_OK(mha_cache_create_kv(&c, L, 1, S, kts[ty], vts[ty], 0));
        if (!c) break;
        CHECK_OK(mha_cache_append(c, k, v, S, NULL));
        CHECK_OK(mha_cache_attend(c, zp, q, T, NULL, 0.0f));
        CHECK(naive_max_diff(zp + nz - R * nd, zr, R * nd) <= tol);
        mha_decode_set_min_parallel_work(0.0); /* 2 threads even where the work is small */
        for (int th = 0; th < 2; th++) {
            mha_set_num_threads(th + 1);
            CHECK_OK(mha_cache_attend(c, zd[th], ql, 1, NULL, 0.0f));
            CHECK(naive_max_diff(zd[th], zr + (R - 1) * nd, nd) <= tol);
        }
        mha_set_num_threads(0);
        mha_decode_set_min_parallel_work(262144.0);
        CHECK(memcmp(zd[0], zd[1], sizeof(float) * nd) == 0);
        CHECK(memcmp(zd[0], zp + nz - nd, sizeof(float) * nd) == 0);
        mha_cache_free(c);
    }
    mha_layer_free(L), naive_weights_free(&w);
    free(q), free(k), free(v), free(kd), free(vd), free(zr), free(z32), free(zp), free(zd[0]), free(zd[1]);
}

/* ------------------------------------------------- storage format */

/* The stored bytes and scales equal the reference quantizer's, bit for
 * bit: ties (2.5 -> 3, -2.5 -> -3, 1.5 -> 2), a zero block (scale 0),
 * a shorter last block (d_k = 40: blocks of 32 and 8), and a tiny block. */
static void test_storage_format(void) {
    int dk = 40, dv = 33;
    mha_config cfg = naive_config(16, 2, 1, dk, dv, 0);
    naive_weights w;
    uint64_t seed = 5;
    mha_config r = naive_resolve(cfg);
    naive_weights_random(&w, &r, &seed, 0.3f);
    mha_layer *L = naive_make_layer(&w);
    enum { T = 3 };
    float *k = naive_random_floats((size_t)T * dk, &seed, -3.0f, 3.0f), *v = naive_random_floats((size_t)T * dv, &seed, -1.0f, 1.0f);
    k[0] = 127.0f, k[1] = 2.5f, k[2] = -2.5f, k[3] = 1.5f, k[4] = 0.5f, k[5] = -126.5f; /* scale 1: ties */
    for (int i = 32; i < 40; i++) k[dk + i] = 0.0f;                                /* zero block */
    for (int i = 0; i < 32; i++) v[2 * dv + i] = 1e-39f * (float)(i - 16);          /* subnormal block */
    mha_cache *c = NULL;
    CHECK_OK(mha_cache_create(&c, L, 1, 8, MHA_CACHE_I8, 0));
    if (c) {
        CHECK_OK(mha_cache_append(c, k, v, T, NULL));
        for (int t = 0; t < T; t++) {
            int8_t q[64];
            float sc[2], x[64];
            memcpy(x, k + (size_t)t * dk, sizeof(float) * dk);
            ref_quantize(x, dk, q, sc);
            const int8_t *d8 = c->data;
            for (int d = 0; d < dk; d++) CHECK_INT(d8[mha_cache_k_off(c, 0, t) + (size_t)d * MHA_KPANEL], q[d]);
            for (int b = 0; b < 2; b++) CHECK(c->scales[mha_cache_ks_off(c, 0, t) + (size_t)b * MHA_KPANEL] == sc[b]);
            memcpy(x, v + (size_t)t * dv, sizeof(float) * dv);
            ref_quantize(x, dv, q, sc);
            for (int d = 0; d < dv; d++) CHECK_INT(d8[mha_cache_v_off(c, 0, t) + d], q[d]);
            for (int b = 0; b < 2; b++) CHECK(c->scales[mha_cache_vs_off(c, 0, t) + b] == sc[b]);
        }
        const int8_t *d8 = c->data;
        CHECK_INT(d8[mha_cache_k_off(c, 0, 0) + 1 * MHA_KPANEL], 3);    /* 2.5: away from 0 */
        CHECK_INT(d8[mha_cache_k_off(c, 0, 0) + 2 * MHA_KPANEL], -3);
        CHECK_INT(d8[mha_cache_k_off(c, 0, 0) + 3 * MHA_KPANEL], 2);
        CHECK_INT(d8[mha_cache_k_off(c, 0, 0) + 4 * MHA_KPANEL], 1);
        CHECK_INT(d8[mha_cache_k_off(c, 0, 0) + 5 * MHA_KPANEL], -127); /* -126.5 */
        CHECK(c->scales[mha_cache_ks_off(c, 0, 0)] == 1.0f);
        CHECK(c->scales[mha_cache_ks_off(c, 0, 1) + MHA_KPANEL] == 0.0f); /* zero block */
        CHECK_INT(d8[mha_cache_k_off(c, 0, 1) + 35 * MHA_KPANEL], 0);
    }
    mha_cache_free(c), mha_layer_free(L), naive_weights_free(&w);
    free(k), free(v);
}

/* max |x - ref| over the (rows, cols) block of x (row stride ldx) */
static double block_err(const float *x, int ldx, const double *ref, int rows, int cols) {
    double e = 0.0;
    for (int i = 0; i < rows; i++)
        for (int j = 0; j < cols; j++) e = fmax(e, fabs((double)x[(size_t)i * ldx + j] - ref[(size_t)i * cols + j]));
    return e;
}

/* r and r32 (m, n) = a (m, k) times b, element (j, kk) of b at
 * [j * bj + kk * bk]: in double, and in naive fp32 (a product, a sum). */
static void ref_products(double *r, float *r32, const float *a, const float *b, int m, int n, int k, size_t bj,
                         size_t bk) {
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            double t = 0.0;
            float t32 = 0.0f;
            for (int kk = 0; kk < k; kk++) {
                t += (double)a[(size_t)i * k + kk] * b[j * bj + kk * bk];
                t32 += a[(size_t)i * k + kk] * b[j * bj + kk * bk];
            }
            r[(size_t)i * n + j] = t, r32[(size_t)i * n + j] = t32;
        }
}

/* The decode tables this CPU runs into tabs (scalar, AVX2, AVX-512 in that
 * order); returns how many. */
static int i8_tables(const mha_decode_kernels *tabs[3]) {
    tabs[0] = &mha_decode_kernels_scalar, tabs[1] = &mha_decode_kernels_avx2, tabs[2] = &mha_decode_kernels_avx512;
    return mha_cpu_has_avx512() ? 3 : mha_cpu_has_avx2() ? 2 : 1;
}

/* The int8 kernels apply one scale per block (scores) or fold it into
 * the weight (values), so they are held to the fp32 rule against a
 * double reference on the dequantized data: error <= 2 x the error of
 * naive fp32 on the same data + 1e-6; every table gives the scalar
 * table's bits; the chunk widening (from_q8) equals the reference
 * dequantization exactly. A scale applied twice, or missing on one
 * block, is off by far more than the tolerance. */
static void kernels_bits_case(int m, int n, int d, int dv, uint64_t seed) {
    const int nbk = (d + 31) / 32, nbv = (dv + 31) / 32, lds = n + 8, ldacc = dv + 5; /* d <= 128 */
    float *q = naive_random_floats((size_t)m * d, &seed, -1, 1), *p = naive_random_floats((size_t)m * n, &seed, 0, 1);
    float *kf = outlier_floats((size_t)n, d, &seed), *vf = outlier_floats((size_t)n, dv, &seed);
    int8_t *kq = malloc((size_t)n * d), *vq = malloc((size_t)n * dv), tmp[128];
    float *ks = malloc(sizeof(float) * n * nbk), *vs = malloc(sizeof(float) * n * nbv), sc[4];
    float *kp = naive_alloc_floats((size_t)n * d); /* dequantized keys in panels */
    for (int j = 0; j < n; j++) {
        ref_quantize(kf + (size_t)j * d, d, tmp, sc);
        for (int c = 0; c < d; c++) {
            size_t at = (size_t)(j / 8) * d * 8 + (size_t)c * 8 + j % 8;
            kq[at] = tmp[c], kp[at] = kf[(size_t)j * d + c];
        }
        for (int b = 0; b < nbk; b++) ks[(size_t)(j / 8) * nbk * 8 + b * 8 + j % 8] = sc[b];
        ref_quantize(vf + (size_t)j * dv, dv, vq + (size_t)j * dv, vs + (size_t)j * nbv);
    }
    /* references on the dequantized kf (n, d) / vf (n, dv): double, and
     * naive fp32 (a product, a sum, in order) for the tolerance */
    double *sr = naive_alloc_doubles((size_t)m * n), *ar = naive_alloc_doubles((size_t)m * dv);
    float *s32 = naive_alloc_floats((size_t)m * n), *a32 = naive_alloc_floats((size_t)m * dv);
    ref_products(sr, s32, q, kf, m, n, d, (size_t)d, 1);   /* q kf^T */
    ref_products(ar, a32, p, vf, m, dv, n, 1, (size_t)dv); /* p vf   */
    const double stol = 2.0 * block_err(s32, n, sr, m, n) + 1e-6, atol = 2.0 * block_err(a32, dv, ar, m, dv) + 1e-6;
    float *a = naive_alloc_floats((size_t)m * lds), *b = naive_alloc_floats((size_t)m * ldacc);
    float *s0 = naive_alloc_floats((size_t)m * lds), *a0 = naive_alloc_floats((size_t)m * ldacc);
    const mha_decode_kernels *tabs[3];
    const int ntab = i8_tables(tabs);
    for (int t = 0; t < ntab; t++) {
        const mha_decode_kernels *K = tabs[t];
        K->scores_q8(a, lds, q, d, kq, ks, m, n, d);
        CHECK(block_err(a, lds, sr, m, n) <= stol);
        K->accumulate_q8(b, ldacc, p, n, vq, vs, m, n, dv);
        CHECK(block_err(b, ldacc, ar, m, dv) <= atol);
        if (t == 0) memcpy(s0, a, sizeof(float) * m * lds), memcpy(a0, b, sizeof(float) * m * ldacc);
        for (int i = 0; i < m; i++) { /* the scalar table's bits */
            CHECK(memcmp(a + (size_t)i * lds, s0 + (size_t)i * lds, sizeof(float) * n) == 0);
            CHECK(memcmp(b + (size_t)i * ldacc, a0 + (size_t)i * ldacc, sizeof(float) * dv) == 0);
        }
        float *w1 = naive_alloc_floats((size_t)n * dv), *w2 = naive_alloc_floats((size_t)n * d);
        K->from_q8(w1, vq, vs, (size_t)n, dv, 1);
        CHECK(memcmp(w1, vf, sizeof(float) * n * dv) == 0);
        K->from_q8(w2, kq, ks, (size_t)n / 8, d, 8);
        CHECK(memcmp(w2, kp, sizeof(float) * n * d) == 0);
        free(w1), free(w2);
    }
    free(sr), free(ar), free(s32), free(a32), free(s0), free(a0);
    free(q), free(p), free(kf), free(vf), free(kq), free(vq), free(ks), free(vs), free(kp), free(a), free(b);
}

/* Shapes: odd sizes (partial blocks, a 3-block V row); and d = d_v = 64
 * and 128, the common heads, with the row counts of GQA tiles (8, 4) over
 * a whole decode chunk (128 keys: 4-panel and 6-panel tiles, two blocks
 * of precomputed weights) and over 40 keys (partial vectors of scales). */
static void test_kernels_bits(void) {
    kernels_bits_case(7, 24, 45, 75, 9);
    kernels_bits_case(8, 128, 64, 64, 10);
    kernels_bits_case(4, 40, 64, 64, 11);
    kernels_bits_case(4, 128, 128, 128, 12);
    kernels_bits_case(5, 40, 128, 128, 13);
    /* the AVX2 row groups (4, 2, then one row: 2, 3, 6 rows), and keys
     * past one slice of its value weights: 264 keys, and a 2112-wide V
     * (66 blocks) whose slices are 31 keys; a V too wide for any slice */
    kernels_bits_case(2, 40, 128, 128, 14);
    kernels_bits_case(3, 24, 45, 75, 15);
    kernels_bits_case(6, 264, 64, 75, 16);
    kernels_bits_case(4, 80, 64, 2112, 17);
    kernels_bits_case(3, 8, 64, 65600, 18); /* 2050 blocks: more than a slice's scales hold */
    /* no keys: accumulate_q8 overwrites acc with zeros (decode_kernels.h),
     * in every row group of every table */
    const mha_decode_kernels *tabs[3];
    const int ntab = i8_tables(tabs);
    float acc[7 * 40], p = 0.5f, vs = 1.0f;
    const int8_t vq = 1;
    for (int t = 0; t < ntab; t++) {
        for (int i = 0; i < 7 * 40; i++) acc[i] = NAN;
        tabs[t]->accumulate_q8(acc, 40, &p, 1, &vq, &vs, 7, 0, 37);
        int zeros = 1;
        for (int i = 0; i < 7; i++)
            for (int c = 0; c < 37; c++) zeros &= acc[i * 40 + c] == 0.0f;
        if (!zeros) test_report(__FILE__, __LINE__, "%s accumulate_q8 over no keys left acc unwritten", tabs[t]->name);
    }
}

/* ---------------------------------------------------- forward level */

typedef struct {
    naive_weights w;
    mha_layer *L;
    int D, h, hk, dk, dv;
} layer_fx;

static void layer_make(layer_fx *f, int D, int h, int hk, int dk, int dv, uint64_t seed) {
    mha_config r = naive_resolve(naive_config(D, h, hk, dk, dv, 1));
    naive_weights_random(&f->w, &r, &seed, 0.4f);
    f->L = naive_make_layer(&f->w);
    f->D = D, f->h = h, f->hk = hk, f->dk = r.d_k, f->dv = r.d_v;
}

/* out (rows, n) = x (rows, k) W + b, in double, rounded to fp32. */
static float *project(const float *x, const float *W, const float *bias, int rows, int k, int n) {
    float *out = naive_alloc_floats((size_t)rows * n);
    for (int t = 0; t < rows; t++)
        for (int o = 0; o < n; o++) {
            double acc = bias ? bias[o] : 0.0;
            for (int i = 0; i < k; i++) acc += (double)x[(size_t)t * k + i] * W[(size_t)i * n + o];
            out[(size_t)t * n + o] = (float)acc;
        }
    return out;
}

/* y (T, D) of one sequence x (T, D), causal with window `left`, K/V
 * quantized (quant = 1) or not; probs (h, T, T) when not NULL. */
static void ref_forward(double *y, double *probs, const layer_fx *f, const float *x, int T, int left, int quant) {
    float *q = project(x, f->w.w_q, f->w.b_q, T, f->D, f->h * f->dk);
    float *k = project(x, f->w.w_k, f->w.b_k, T, f->D, f->hk * f->dk);
    float *v = project(x, f->w.w_v, f->w.b_v, T, f->D, f->hk * f->dv);
    for (int i = 0; quant && i < T * f->hk; i++)
        ref_store(k + (size_t)i * f->dk, f->dk, g_kt), ref_store(v + (size_t)i * f->dv, f->dv, g_vt);
    double *z = naive_alloc_doubles((size_t)T * f->h * f->dv);
    naive_cache_attend(z, probs, q, k, v, 1, T, T, 0, f->h, f->hk, f->dk, f->dv, left, 1);
    for (int t = 0; t < T; t++)
        for (int o = 0; o < f->D; o++) {
            double acc = f->w.b_o[o];
            for (int cc = 0; cc < f->h * f->dv; cc++) acc += z[(size_t)t * f->h * f->dv + cc] * f->w.w_o[(size_t)cc * f->D + o];
            y[(size_t)t * f->D + o] = acc;
        }
    free(q), free(k), free(v), free(z);
}

/* One sequence through a cache in pieces steps[] (the last repeats). */
static void feed(float *y, const layer_fx *f, mha_cache *c, const float *x, int T, const int *steps, int ns) {
    for (int t = 0, s = 0; t < T; s++) {
        int n = steps[s < ns ? s : ns - 1];
        n = n < T - t ? n : T - t;
        CHECK_OK(mha_forward_cached(f->L, c, y + (size_t)t * f->D, NULL, x + (size_t)t * f->D, n, NULL, NULL));
        t += n;
    }
}

/* The forward-level tolerance of the header for sequence x (T, D): the
 * fp32 cache's error, doubled, + e_q / 10; yq receives the int8 reference. */
static double forward_tol(double *yq, const layer_fx *f, const float *x, int T, int left, int window) {
    size_t ny = (size_t)T * f->D;
    double *yu = naive_alloc_doubles(ny);
    ref_forward(yq, NULL, f, x, T, left, 1);
    ref_forward(yu, NULL, f, x, T, left, 0);
    float *y32 = naive_alloc_floats(ny);
    mha_cache *c = NULL;
    CHECK_OK(mha_cache_create(&c, f->L, 1, window ? window + 8 : T, MHA_CACHE_F32, window));
    int steps[] = {T / 2, 1};
    if (c) feed(y32, f, c, x, T, steps, 2);
    mha_cache_free(c);
    double eq = 0.0;
    for (size_t i = 0; i < ny; i++) eq = fmax(eq, fabs(yq[i] - yu[i]));
    double tol = 2.0 * naive_max_diff(y32, yu, ny) + 1e-6 + eq / 10.0;
    CHECK(tol < eq / 2.0);
    free(yu), free(y32);
    return tol;
}

/* Prefill, then decode one token at a time across a chunk boundary, for
 * MHA, GQA and MQA; 1 and 2 threads give the same bits. */
static void test_prefill_decode(void) {
    int hks[3] = {4, 2, 1};
    for (int i = 0; i < 3; i++) {
        layer_fx f;
        layer_make(&f, 48, 4, hks[i], 40, 36, 201 + i);
        int T = 150;
        uint64_t seed = 7 + i;
        float *x = outlier_floats((size_t)T, f.D, &seed);
        double *yq = naive_alloc_doubles((size_t)T * f.D);
        double tol = forward_tol(yq, &f, x, T, -1, 0);
        float *y[2] = {naive_alloc_floats((size_t)T * f.D), naive_alloc_floats((size_t)T * f.D)};
        int steps[] = {122, 1, 3, 1};
        mha_decode_set_min_parallel_work(0.0);
        for (int th = 0; th < 2; th++) {
            mha_set_num_threads(th + 1);
            mha_cache *c = NULL;
            CHECK_OK(mha_cache_create_kv(&c, f.L, 1, T, g_kt, g_vt, 0));
            if (c) feed(y[th], &f, c, x, T, steps, 4);
            mha_cache_free(c);
        }
        mha_set_num_threads(0);
        mha_decode_set_min_parallel_work(262144.0);
        CHECK(naive_max_diff(y[0], yq, (size_t)T * f.D) <= tol);
        CHECK(memcmp(y[0], y[1], sizeof(float) * T * f.D) == 0);
        free(x), free(yq), free(y[0]), free(y[1]);
        mha_layer_free(f.L), naive_weights_free(&f.w);
    }
}

/* Ragged batch: three sequences fed with different n_new per call (some
 * 0), each equal to its own reference. */
static void test_ragged(void) {
    layer_fx f;
    layer_make(&f, 32, 4, 2, 40, 0, 211);
    int len[3] = {70, 33, 51}, T = 70;
    uint64_t seed = 13;
    float *x = outlier_floats((size_t)3 * T, f.D, &seed), *y = naive_alloc_floats((size_t)3 * T * f.D);
    mha_cache *c = NULL;
    CHECK_OK(mha_cache_create_kv(&c, f.L, 3, T, g_kt, g_vt, 0));
    int done[3] = {0, 0, 0};
    for (int round = 0; c && (done[0] < len[0] || done[1] < len[1] || done[2] < len[2]); round++) {
        int Tn = round == 0 ? 20 : 1 + round % 3, n[3];
        for (int b = 0; b < 3; b++) {
            int want = round == 0 ? 6 * (b + 1) : (b + round) % 3;
            want = want > Tn ? Tn : want;
            n[b] = len[b] - done[b] < want ? len[b] - done[b] : want;
        }
        float *xs = naive_alloc_floats((size_t)3 * Tn * f.D), *ys = naive_alloc_floats((size_t)3 * Tn * f.D);
        for (int b = 0; b < 3; b++)
            memcpy(xs + (size_t)b * Tn * f.D, x + ((size_t)b * T + done[b]) * f.D, sizeof(float) * n[b] * f.D);
        CHECK_OK(mha_forward_cached(f.L, c, ys, NULL, xs, Tn, n, NULL));
        for (int b = 0; b < 3; b++) {
            memcpy(y + ((size_t)b * T + done[b]) * f.D, ys + (size_t)b * Tn * f.D, sizeof(float) * n[b] * f.D);
            done[b] += n[b];
        }
        free(xs), free(ys);
    }
    for (int b = 0; b < 3; b++) {
        double *yq = naive_alloc_doubles((size_t)len[b] * f.D);
        double tol = forward_tol(yq, &f, x + (size_t)b * T * f.D, len[b], -1, 0);
        CHECK(naive_max_diff(y + (size_t)b * T * f.D, yq, (size_t)len[b] * f.D) <= tol);
        free(yq);
    }
    mha_cache_free(c);
    free(x), free(y);
    mha_layer_free(f.L), naive_weights_free(&f.w);
}

/* One sequence of T outlier tokens through an int8 cache against the
 * int8 reference (causal, window `left`); the tests feed y themselves. */
typedef struct {
    layer_fx f;
    int T;
    float *x, *y; /* (T, D) */
    double *yq;   /* (T, D) reference */
    double tol;
} seq_case;

static mha_cache *seq_begin(seq_case *sc, int hk, uint64_t layer_seed, int T, int left, int cap, int window) {
    layer_make(&sc->f, 32, 4, hk, 40, 0, layer_seed);
    uint64_t seed = layer_seed + 1;
    sc->T = T;
    sc->x = outlier_floats((size_t)T, sc->f.D, &seed), sc->y = naive_alloc_floats((size_t)T * sc->f.D);
    sc->yq = naive_alloc_doubles((size_t)T * sc->f.D);
    sc->tol = forward_tol(sc->yq, &sc->f, sc->x, T, left, window);
    mha_cache *c = NULL;
    CHECK_OK(mha_cache_create_kv(&c, sc->f.L, 1, cap, g_kt, g_vt, window));
    return c;
}

static void seq_end(seq_case *sc, mha_cache *c) {
    CHECK(naive_max_diff(sc->y, sc->yq, (size_t)sc->T * sc->f.D) <= sc->tol);
    mha_cache_free(c);
    free(sc->x), free(sc->y), free(sc->yq);
    mha_layer_free(sc->f.L), naive_weights_free(&sc->f.w);
}

/* Speculative tokens rolled back with truncate, then other tokens. */
static void test_truncate(void) {
    seq_case sc;
    mha_cache *c = seq_begin(&sc, 4, 221, 60, -1, 60, 0);
    int D = sc.f.D;
    uint64_t seed = 17;
    float *junk = outlier_floats(6, D, &seed), *ys = naive_alloc_floats((size_t)6 * D);
    if (c) {
        CHECK_OK(mha_forward_cached(sc.f.L, c, sc.y, NULL, sc.x, 30, NULL, NULL));
        CHECK_OK(mha_forward_cached(sc.f.L, c, ys, NULL, junk, 6, NULL, NULL));
        CHECK_OK(mha_cache_truncate(c, 0, 30));
        int steps[] = {1, 2};
        feed(sc.y + (size_t)30 * D, &sc.f, c, sc.x + (size_t)30 * D, sc.T - 30, steps, 2);
    }
    free(junk), free(ys);
    seq_end(&sc, c);
}

/* A ring of W + 8 slots keeping the last W tokens (wrapping many times)
 * against the reference with window_left = W - 1. */
static void test_window(void) {
    seq_case sc;
    int W = 40;
    mha_cache *c = seq_begin(&sc, 1, 231, 300, W - 1, W + 8, W);
    int steps[] = {70, 1, 5, 1};
    if (c) feed(sc.y, &sc.f, c, sc.x, sc.T, steps, 4);
    seq_end(&sc, c);
}

/* Heads permuted (GQA groups whole) under a live cache: decoding goes on
 * with the outputs of the unpermuted layer. */
static void test_permute(void) {
    seq_case sc;
    mha_cache *c = seq_begin(&sc, 2, 241, 50, -1, 50, 0);
    int perm[4] = {3, 2, 0, 1}, D = sc.f.D;
    if (c) {
        CHECK_OK(mha_forward_cached(sc.f.L, c, sc.y, NULL, sc.x, 25, NULL, NULL));
        CHECK_OK(mha_layer_permute_heads(sc.f.L, perm));
        CHECK_OK(mha_cache_permute_heads(c, perm));
        int steps[] = {1};
        feed(sc.y + (size_t)25 * D, &sc.f, c, sc.x + (size_t)25 * D, sc.T - 25, steps, 1);
    }
    seq_end(&sc, c);
}

/* Probabilities captured during decode equal the reference's on the
 * dequantized keys; their tolerance: 10x the gap between fp32 and int8
 * probabilities is far above, 1e-5 is the fp32 rule's size here. */
static void test_probs(void) {
    layer_fx f;
    layer_make(&f, 32, 4, 2, 40, 0, 251);
    int T = 20, cap = 24;
    uint64_t seed = 31;
    float *x = outlier_floats((size_t)T, f.D, &seed), *y = naive_alloc_floats((size_t)T * f.D);
    double *pq = naive_alloc_doubles((size_t)f.h * T * T), *pu = naive_alloc_doubles((size_t)f.h * T * T);
    double *yr = naive_alloc_doubles((size_t)T * f.D);
    ref_forward(yr, pq, &f, x, T, -1, 1);
    ref_forward(yr, pu, &f, x, T, -1, 0);
    float *pc = naive_alloc_floats((size_t)f.h * 12 * cap);
    mha_capture cc = {NULL, NULL, pc};
    mha_cache *c = NULL;
    CHECK_OK(mha_cache_create_kv(&c, f.L, 1, cap, g_kt, g_vt, 0));
    if (c) {
        CHECK_OK(mha_forward_cached(f.L, c, y, NULL, x, 8, NULL, NULL));
        CHECK_OK(mha_forward_cached(f.L, c, y, &cc, x + (size_t)8 * f.D, 12, NULL, NULL));
    }
    double worst = 0.0, gap = 0.0;
    for (int r = 0; r < f.h; r++)
        for (int t = 0; t < 12; t++)
            for (int j = 0; j < cap; j++) {
                double want = j < T ? pq[((size_t)r * T + 8 + t) * T + j] : 0.0;
                worst = fmax(worst, fabs(pc[((size_t)r * 12 + t) * cap + j] - want));
                if (j < T) gap = fmax(gap, fabs(want - pu[((size_t)r * T + 8 + t) * T + j]));
            }
    CHECK(worst < 1e-5);
    CHECK(gap > 1e-4); /* the check can tell int8 from fp32 keys */
    mha_cache_free(c);
    free(x), free(y), free(pq), free(pu), free(yr), free(pc);
    mha_layer_free(f.L), naive_weights_free(&f.w);
}

/* Bytes: (d_k + d_v) int8 plus one fp32 scale per 32 of each per slot. */
static void test_bytes(void) {
    mha_config cfg = mha_config_default(2048, 32);
    cfg.n_kv_heads = 8;
    CHECK_INT(mha_cache_bytes_for(&cfg, 1, 4096, MHA_CACHE_I8), (size_t)4096 * 8 * (128 + 4 * 4));
    layer_fx f;
    layer_make(&f, 32, 4, 2, 40, 33, 261);
    mha_cache *c = NULL;
    CHECK_OK(mha_cache_create(&c, f.L, 3, 16, MHA_CACHE_I8, 0)); /* 16 -> one chunk of 128 slots */
    CHECK_INT(mha_cache_bytes(c), (size_t)3 * 2 * MHA_DECODE_CHUNK * (40 + 33 + 4 * (2 + 2)));
    CHECK_INT(mha_cache_bytes(c), mha_cache_bytes_for(&f.w.cfg, 3, 16, MHA_CACHE_I8));
    mha_cache_free(c);
    CHECK_STATUS(mha_cache_create(&c, f.L, 1, 16, (mha_cache_dtype)3, 0), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("MHA_CACHE_I8");
    CHECK_INT(mha_cache_bytes_for(&f.w.cfg, 1, 16, (mha_cache_dtype)3), 0);
    mha_layer_free(f.L), naive_weights_free(&f.w);
}

/* ------------------------------------------------ K and V mixed */

/* fn run on caches of K type kt and V type vt. */
static void with_types(mha_cache_dtype kt, mha_cache_dtype vt, void (*fn)(void)) {
    g_kt = kt, g_vt = vt;
    fn();
    g_kt = g_vt = MHA_CACHE_I8;
}

/* Fused kernels (<= 4 rows per kv head), the widened chunk (MQA: 8
 * rows) and the grouped one (32 rows) with each side in its own type. */
static void test_mixed_attend_i8_f16(void) {
    with_types(MHA_CACHE_I8, MHA_CACHE_F16, test_attend_mha);
    with_types(MHA_CACHE_I8, MHA_CACHE_F16, test_attend_mqa);
    with_types(MHA_CACHE_I8, MHA_CACHE_F16, test_attend_mqa32);
}
static void test_mixed_attend_f16_i8(void) {
    with_types(MHA_CACHE_F16, MHA_CACHE_I8, test_attend_gqa);
    with_types(MHA_CACHE_F16, MHA_CACHE_I8, test_attend_mqa);
}
static void test_mixed_attend_f32(void) {
    with_types(MHA_CACHE_I8, MHA_CACHE_F32, test_attend_mqa);
    with_types(MHA_CACHE_F32, MHA_CACHE_I8, test_attend_mha);
}
static void test_mixed_prefill_decode(void) {
    with_types(MHA_CACHE_I8, MHA_CACHE_F16, test_prefill_decode);
    with_types(MHA_CACHE_F16, MHA_CACHE_I8, test_prefill_decode);
}
static void test_mixed_ragged(void) { with_types(MHA_CACHE_I8, MHA_CACHE_F16, test_ragged); }
static void test_mixed_truncate(void) { with_types(MHA_CACHE_I8, MHA_CACHE_F16, test_truncate); }
static void test_mixed_window(void) { with_types(MHA_CACHE_F16, MHA_CACHE_I8, test_window); }
static void test_mixed_permute(void) { with_types(MHA_CACHE_I8, MHA_CACHE_F16, test_permute); }
/* probabilities depend on K alone: an int8 K keeps the gap check meaningful */
static void test_mixed_probs(void) { with_types(MHA_CACHE_I8, MHA_CACHE_F32, test_probs); }

/* Bytes per slot: d_k in K's type + d_v in V's + the scales of the int8
 * side only; mha_cache_create_kv(t, t) is mha_cache_create(t); a bad type
 * of either side is named. */
static void test_mixed_bytes(void) {
    mha_config cfg = mha_config_default(2048, 32);
    cfg.n_kv_heads = 8;
    CHECK_INT(mha_cache_bytes_for_kv(&cfg, 1, 4096, MHA_CACHE_I8, MHA_CACHE_F16), (size_t)4096 * 8 * (64 + 2 * 4 + 128));
    CHECK_INT(mha_cache_bytes_for_kv(&cfg, 1, 4096, MHA_CACHE_F32, MHA_CACHE_I8), (size_t)4096 * 8 * (256 + 64 + 2 * 4));
    CHECK_INT(mha_cache_bytes_for_kv(&cfg, 2, 100, MHA_CACHE_F16, MHA_CACHE_F16),
              mha_cache_bytes_for(&cfg, 2, 100, MHA_CACHE_F16));
    layer_fx f;
    layer_make(&f, 32, 4, 2, 40, 33, 271);
    mha_cache *c = NULL;
    CHECK_OK(mha_cache_create_kv(&c, f.L, 3, 16, MHA_CACHE_F16, MHA_CACHE_I8, 0));
    CHECK_INT(mha_cache_bytes(c), (size_t)3 * 2 * MHA_DECODE_CHUNK * (40 * 2 + 33 + 4 * 2));
    CHECK_INT(mha_cache_bytes(c), mha_cache_bytes_for_kv(&f.w.cfg, 3, 16, MHA_CACHE_F16, MHA_CACHE_I8));
    mha_cache_free(c);
    CHECK_STATUS(mha_cache_create_kv(&c, f.L, 1, 16, MHA_CACHE_I8, (mha_cache_dtype)5, 0), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("mha_cache_create_kv: v_dtype=5; expected MHA_CACHE_F32, MHA_CACHE_F16 or MHA_CACHE_I8");
    CHECK(c == NULL);
    CHECK_STATUS(mha_cache_create_kv(&c, f.L, 1, 16, (mha_cache_dtype)-1, MHA_CACHE_F32, 0), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("k_dtype=-1");
    CHECK_INT(mha_cache_bytes_for_kv(&f.w.cfg, 1, 16, MHA_CACHE_F32, (mha_cache_dtype)3), 0);
    mha_layer_free(f.L), naive_weights_free(&f.w);
}

/* ------------------------------------------------------- FLT_MAX */

/* FLT_MAX reads back from int8 as 127 * (FLT_MAX / 127) = inf (the only
 * finite float that does): refused before anything is stored, by append
 * (V) and by the cached forward (K = b_k with W_Q = 0, so that no score
 * bound refuses it first); an fp32 cache takes the same call. */
static void test_flt_max(void) {
    mha_config r = naive_resolve(naive_config(16, 2, 1, 8, 8, 1));
    naive_weights w;
    uint64_t seed = 21;
    naive_weights_random(&w, &r, &seed, 0.3f);
    memset(w.w_q, 0, sizeof(float) * 16 * 16), memset(w.b_q, 0, sizeof(float) * 16);
    w.b_k[3] = FLT_MAX;
    mha_layer *L = naive_make_layer(&w);
    float *x = naive_random_floats(2 * 16, &seed, -1.0f, 1.0f), y[2 * 16]; /* x (2, 16): two tokens */
    const mha_cache_dtype types[3][2] = {{MHA_CACHE_I8, MHA_CACHE_I8}, {MHA_CACHE_I8, MHA_CACHE_F16},
                                         {MHA_CACHE_F32, MHA_CACHE_F32}};
    for (int i = 0; i < 3; i++) {
        mha_cache *c = NULL;
        CHECK_OK(mha_cache_create_kv(&c, L, 1, 8, types[i][0], types[i][1], 0));
        if (!c) continue;
        const mha_status s = mha_forward_cached(L, c, y, NULL, x, 2, NULL, NULL);
        if (i < 2) {
            CHECK_INT(s, MHA_E_NONFINITE);
            CHECK_ERROR_MENTIONS("K of sequence 0 kv head 0 reaches 3.40282e+38, which this cache's int8 reads back");
            CHECK_INT(mha_cache_length(c, 0), 0);
        } else {
            CHECK_INT(s, MHA_OK);
            CHECK(mha_first_nonfinite(y, 2 * 16, 0) == 2 * 16);
        }
        mha_cache_free(c);
    }
    float kv[8] = {1.0f, -2.0f, 0.5f, 0.0f, 3.0f, 1.0f, 1.0f, 1.0f}, big[8] = {1.0f, -FLT_MAX, 0.5f};
    mha_cache *c = NULL;
    CHECK_OK(mha_cache_create_kv(&c, L, 1, 8, MHA_CACHE_F32, MHA_CACHE_I8, 0));
    if (c) {
        CHECK_STATUS(mha_cache_append(c, kv, big, 1, NULL), MHA_E_NONFINITE);
        CHECK_ERROR_MENTIONS("v[1] = -3.40282e+38 (sequence 0): this cache stores it in int8");
        CHECK_INT(mha_cache_length(c, 0), 0);
        CHECK_OK(mha_cache_append(c, big, kv, 1, NULL)); /* K is fp32 here */
    }
    mha_cache_free(c), mha_layer_free(L), naive_weights_free(&w);
    free(x);
}

static const test_case cases[] = {
    {"cache_i8_flt_max", test_flt_max},
    {"cache_i8_storage_format", test_storage_format},
    {"cache_i8_kernels_bits", test_kernels_bits},
    {"cache_i8_attend_mha", test_attend_mha},
    {"cache_i8_attend_gqa", test_attend_gqa},
    {"cache_i8_attend_mqa", test_attend_mqa},
    {"cache_i8_attend_mqa32", test_attend_mqa32},
    {"cache_grouped_fold", test_grouped_fold},
    {"cache_i8_prefill_decode", test_prefill_decode},
    {"cache_i8_ragged", test_ragged},
    {"cache_i8_truncate", test_truncate},
    {"cache_i8_window", test_window},
    {"cache_i8_permute", test_permute},
    {"cache_i8_probs", test_probs},
    {"cache_i8_bytes", test_bytes},
    {"cache_mixed_attend_i8_f16", test_mixed_attend_i8_f16},
    {"cache_mixed_attend_f16_i8", test_mixed_attend_f16_i8},
    {"cache_mixed_attend_f32", test_mixed_attend_f32},
    {"cache_mixed_prefill_decode", test_mixed_prefill_decode},
    {"cache_mixed_ragged", test_mixed_ragged},
    {"cache_mixed_truncate", test_mixed_truncate},
    {"cache_mixed_window", test_mixed_window},
    {"cache_mixed_permute", test_mixed_permute},
    {"cache_mixed_probs", test_mixed_probs},
    {"cache_mixed_bytes", test_mixed_bytes},
};

const test_case *tests_cache_i8(size_t *count) {
    *count = sizeof cases / sizeof cases[0];
    return cases;
}
