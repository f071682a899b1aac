/* test_decode_stream.c — the projections' stream mode (decode_gemm.c,
 * few rows) against its defined order of additions, bit for bit.
 *
 * Each output element is, by definition: per block of KBLK = 256 input
 * rows a partial sum from 0 (fp32 / bf16: fma over the rows in order;
 * int8: per scale group of 32 rows a sum from 0, then fma(sum, scale,
 * partial)), and y = bias (or 0) plus the partials in block order. That
 * is computed here with fmaf; the library must give exactly those bits
 * whatever its task split: on 1, 2 and 5 threads (2 and 5 split the wide
 * job's columns into 512- and 256-wide tasks, 5 with a short last one),
 * with the sweeps forced on and off (AVX2: fp32 up to 4 rows, bf16 and
 * int8 up to 2; AVX-512: one row) and the tiles for the rest.
 * Legend: m rows, k inputs, n outputs. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "compute/decode_gemm.h"
#include "kernels/kernels.h"
#include "naive.h"
#include "test_util.h"
#include "tests.h"

enum { K = 301, NJ = 3, KB = 256, GRP = 32 }; /* 256 + 45 rows: a block and a group end off the sweeps' 4-row passes */
static const int widths[NJ] = {1000, 64, 130}; /* one wide job, two narrow (K, V of a GQA layer) */

/* The weight element w (e, j) as the kernels see it (fp32). */
static float weight_at(const mha_decode_gemm_job *J, int e, int j) {
    const size_t at = (size_t)e * J->n + j;
    if (J->w_i8) return (float)J->w_i8[at];
    if (J->w_bf16) {
        uint32_t u = (uint32_t)J->w_bf16[at] << 16;
        float f;
        memcpy(&f, &u, sizeof f);
        return f;
    }
    return J->w[at];
}

/* y (m, n) of job J in the defined order (the header). */
static void expected(const mha_decode_gemm_job *J, const float *x, int m, float *y) {
    for (int r = 0; r < m; r++)
        for (int j = 0; j < J->n; j++) {
            float acc = J->b ? J->b[j] : 0.0f;
            for (int k0 = 0; k0 < K; k0 += KB) {
                const int k1 = k0 + KB < K ? k0 + KB : K;
                float p = 0.0f;
                for (int g0 = k0; g0 < k1; g0 += GRP) {
                    const int g1 = g0 + GRP < k1 ? g0 + GRP : k1;
                    float s = 0.0f;
                    for (int e = g0; e < g1; e++) {
                        const float xe = x[(size_t)r * K + e], we = weight_at(J, e, j);
                        if (J->w_i8) s = fmaf(xe, we, s);
                        else p = fmaf(xe, we, p);
                    }
                    if (J->w_i8) p = fmaf(s, J->w_scale[(size_t)(g0 / GRP) * J->n + j], p);
                }
                acc += p;
            }
            y[(size_t)r * J->n + j] = acc;
        }
}

/* Jobs of one weight type (0 fp32, 1 bf16, 2 int8) with biases. */
static void make_jobs(mha_decode_gemm_job *jobs, int type, uint64_t *seed) {
    for (int i = 0; i < NJ; i++) {
        mha_decode_gemm_job *J = &jobs[i];
        const int n = widths[i];
        memset(J, 0, sizeof *J);
        J->n = n;
        J->b = naive_random_floats((size_t)n, seed, -1.0f, 1.0f);
        float *w = naive_random_floats((size_t)K * n, seed, -1.0f, 1.0f);
        if (type == 0) {
            J->w = w;
            continue;
        }
        if (type == 1) {
            uint16_t *b = malloc(sizeof(uint16_t) * K * n);
            for (size_t e = 0; e < (size_t)K * n; e++) {
                uint32_t u;
                memcpy(&u, &w[e], sizeof u);
                b[e] = (uint16_t)(u >> 16);
            }
            J->w_bf16 = b;
        } else {
            int8_t *q = malloc((size_t)K * n);
            for (size_t e = 0; e < (size_t)K * n; e++) q[e] = (int8_t)(w[e] * 127.0f);
            J->w_i8 = q, J->w_seg = K;
            J->w_scale = naive_random_floats((size_t)(K + GRP - 1) / GRP * n, seed, 0.001f, 0.01f);
        }
        free(w);
    }
}

static void free_jobs(mha_decode_gemm_job *jobs) {
    for (int i = 0; i < NJ; i++) {
        free(jobs[i].y), free((void *)jobs[i].w), free((void *)jobs[i].b), free((void *)jobs[i].w_bf16);
        free((void *)jobs[i].w_i8), free((void *)jobs[i].w_scale);
    }
}

static void check_type(int type, int m) {
    uint64_t seed = 97 + 7 * (uint64_t)type + (uint64_t)m;
    mha_decode_gemm_job jobs[NJ];
    make_jobs(jobs, type, &seed);
    float *x = naive_random_floats((size_t)m * K, &seed, -1.0f, 1.0f);
    static const int threads[3] = {1, 2, 5};
    for (int t = 0; t < 6; t++) { /* each thread count with the one-row sweeps forced off and on */
        mha_force_row_sweep(t / 3);
        mha_exec ex;
        CHECK_OK(mha_exec_resolve(&ex, NULL));
        ex.min_parallel_work = 0.0, ex.n_threads = threads[t % 3];
        for (int i = 0; i < NJ; i++) {
            free(jobs[i].y);
            jobs[i].y = naive_alloc_floats((size_t)m * jobs[i].n);
        }
        CHECK_OK(mha_decode_gemm_many(&ex, jobs, NJ, x, m, K));
        for (int i = 0; i < NJ; i++) {
            float *want = naive_alloc_floats((size_t)m * jobs[i].n);
            expected(&jobs[i], x, m, want);
            CHECK(memcmp(want, jobs[i].y, sizeof(float) * m * jobs[i].n) == 0);
            free(want);
        }
    }
    mha_force_row_sweep(-1);
    free(x);
    free_jobs(jobs);
}

static void test_stream_fp32(void) {
    check_type(0, 1);
    check_type(0, 3);
}

static void test_stream_bf16(void) {
    check_type(1, 1);
    check_type(1, 5);
}

static void test_stream_int8(void) {
    check_type(2, 1);
    check_type(2, 5);
}

const test_case *tests_decode_stream_isa(size_t *count) {
    static const test_case cases[] = {
        {"decode_stream_fp32_order", test_stream_fp32},
        {"decode_stream_bf16_order", test_stream_bf16},
        {"decode_stream_int8_order", test_stream_int8},
    };
    *count = sizeof cases / sizeof cases[0];
    return cases;
}
