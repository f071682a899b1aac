/* test_hostile_api.c — the public API under arguments no real caller has
 * but a buggy one passes: size products that wrap (they would index far
 * past any buffer), a dtype outside mha_dtype, thread counts beyond the
 * machine, non-finite keys, values and queries handed to the cache's
 * low-level entries. Each is refused with a status and a message naming
 * it, before any element is read. Legend: h heads, d head width. */
#include <limits.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "naive.h"
#include "tests.h"

/* Sizes whose products pass 2^40 elements: refused before the buffers
 * (64 floats here) are read. */
static void hostile_sizes_wrap(void) {
    float buf[64] = {0}, lse[64] = {0};
    const float *zp[1] = {buf}, *lp[1] = {lse};
    CHECK_STATUS(mha_attention_merge(buf, lse, zp, lp, 1, 1, 1 << 22, 1 << 22, 1 << 22), MHA_E_SHAPE);
    CHECK_ERROR_MENTIONS("more than 2^40 elements");
    CHECK_STATUS(mha_attention_merge(buf, lse, zp, lp, 1, INT_MAX, INT_MAX, INT_MAX, INT_MAX), MHA_E_SHAPE);
    CHECK_OK(mha_attention_merge(buf, lse, zp, lp, 1, 1, 2, 2, 4)); /* a real size still runs */
    buf[5] = NAN; /* (b 0, t 0, head 1) of a row with keys: refused */
    CHECK_STATUS(mha_attention_merge(buf, lse, zp, lp, 1, 1, 2, 2, 4), MHA_E_NONFINITE);
    CHECK_ERROR_MENTIONS("z_parts[0][5] = nan where its lse is finite");
    lse[2] = -INFINITY; /* lse (B,h,T): head 1, t 0 has no key: its Z may hold anything */
    CHECK_OK(mha_attention_merge(buf, lse, zp, lp, 1, 1, 2, 2, 4));
    CHECK(buf[5] == 0.0f); /* a row without keys gets z = 0 */

    mha_config c = mha_config_default(16, 16);
    c.d_k = c.d_v = 1 << 20;
    mha_options o = mha_options_default();
    CHECK_STATUS(mha_attend_lse(&c, buf, lse, buf, buf, buf, 1 << 30, 1 << 30, 1 << 30, &o), MHA_E_SHAPE);
    CHECK_ERROR_MENTIONS("more than 2^40 elements");
    o.path = MHA_PATH_REFERENCE;
    CHECK_STATUS(mha_attend_lse(&c, buf, lse, buf, buf, buf, 1, 1 << 17, 1, &o), MHA_E_SHAPE); /* Q: 2^41 */

    const mha_intervention mean = {.op = MHA_HEAD_MEAN};
    CHECK_STATUS(mha_head_intervene(buf, &mean, 0, INT_MAX, INT_MAX, INT_MAX), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("2^40");
    CHECK_STATUS(mha_head_contributions(buf, buf, buf, 1 << 20, 1 << 20, 2, 1), MHA_E_ARG);
    CHECK_STATUS(mha_head_contributions(buf, buf, buf, 1 << 10, 2, 2, INT_MAX), MHA_E_ARG);
    CHECK_STATUS(mha_project_out(buf, buf, buf, NULL, 1 << 30, 2, 1 << 20), MHA_E_ARG);
    CHECK_OK(mha_head_intervene(buf, &mean, 1, 2, 4, 8)); /* (4, 2*8) */

    /* the cache's size for planning: 0 where mha_cache_create refuses */
    mha_config cc = mha_config_default(64, 4);
    CHECK(mha_cache_bytes_for(&cc, 1, INT_MAX, MHA_CACHE_F32) == 0);
    CHECK(mha_cache_bytes_for(&cc, INT_MAX, INT_MAX - 200, MHA_CACHE_F32) == 0);
    CHECK(mha_cache_bytes_for(&cc, 1, 1000, MHA_CACHE_F32) > 0);
    mha_layer *L = NULL;
    mha_cache *C = NULL;
    CHECK_OK(mha_layer_create(&L, &cc, NULL));
    CHECK_STATUS(mha_cache_create(&C, L, 1, INT_MAX, MHA_CACHE_F32, 0), MHA_E_NOMEM);
    CHECK_OK(mha_cache_create(&C, L, 3, 100, MHA_CACHE_F32, 0));
    CHECK(mha_cache_bytes(C) == mha_cache_bytes_for(&cc, 3, 100, MHA_CACHE_F32));
    const int none[3] = {0, 0, 0};
    CHECK_STATUS(mha_cache_append(C, buf, buf, 1 << 30, none), MHA_E_ARG); /* 3 * 2^30 rows wrap an int */
    CHECK_ERROR_MENTIONS("B*T");
    CHECK_STATUS(mha_cache_attend(C, buf, buf, 1 << 30, none, 0.0f), MHA_E_ARG);
    CHECK_STATUS(mha_forward_cached(L, C, buf, NULL, buf, 1 << 30, none, NULL), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("mha_forward_cached: T=1073741824 with 3 sequences");
    mha_cache_free(C);
    mha_layer_free(L);
}

/* mha_cache_append / mha_cache_attend read only rows 0..n_new[b]-1 of
 * each sequence; a non-finite one there is refused and nothing is
 * stored, one past n_new[b] is not read. */
static void hostile_cache_nonfinite(void) {
    enum { D = 8, H = 2, DK = 4, B = 2, T = 3 };
    mha_config c = mha_config_default(D, H);
    mha_layer *L = NULL;
    mha_cache *C = NULL;
    CHECK_OK(mha_layer_create(&L, &c, NULL));
    CHECK_OK(mha_cache_create(&C, L, B, 8, MHA_CACHE_F16, 0));
    if (!C) {
        mha_layer_free(L);
        return;
    }
    uint64_t seed = 91;
    float *k = naive_random_floats(B * T * H * DK, &seed, -1, 1), *v = naive_random_floats(B * T * H * DK, &seed, -1, 1);
    float *q = naive_random_floats(B * T * H * DK, &seed, -1, 1), z[B * T * H * DK];
    const int n[B] = {2, 3};
    k[(size_t)(1 * T + 2) * H * DK + 1] = NAN; /* sequence 1, row 2: read */
    CHECK_STATUS(mha_cache_append(C, k, v, T, n), MHA_E_NONFINITE);
    CHECK_ERROR_MENTIONS("mha_cache_append: k[");
    CHECK_ERROR_MENTIONS("sequence 1");
    CHECK_INT(mha_cache_length(C, 0), 0); /* nothing stored */
    k[(size_t)(1 * T + 2) * H * DK + 1] = 0.5f;
    v[(size_t)(0 * T + 1) * H * DK] = INFINITY;
    CHECK_STATUS(mha_cache_append(C, k, v, T, n), MHA_E_NONFINITE);
    CHECK_ERROR_MENTIONS("mha_cache_append: v[");
    v[(size_t)(0 * T + 1) * H * DK] = 0.25f;
    v[(size_t)(0 * T + 2) * H * DK] = NAN; /* sequence 0, row 2: past n[0], not read */
    CHECK_OK(mha_cache_append(C, k, v, T, n));
    CHECK_INT(mha_cache_length(C, 1), 3);
    q[(size_t)(1 * T) * H * DK + 3] = -INFINITY;
    CHECK_STATUS(mha_cache_attend(C, z, q, T, n, 0.0f), MHA_E_NONFINITE);
    CHECK_ERROR_MENTIONS("mha_cache_attend: q[");
    q[(size_t)(1 * T) * H * DK + 3] = 0.0f;
    q[(size_t)(0 * T + 2) * H * DK] = NAN; /* past n[0] */
    CHECK_OK(mha_cache_attend(C, z, q, T, n, 0.0f));
    free(k), free(v), free(q);
    mha_cache_free(C);
    mha_layer_free(L);
}

/* Thread counts far beyond the machine: the context setter refuses them,
 * the process-wide one takes its ceiling (libgomp would exit() the
 * process trying to create INT_MAX threads), and a forward still runs. */
static void hostile_thread_counts(void) {
    const int before = mha_get_num_threads();
    mha_context *ctx = NULL;
    CHECK_OK(mha_context_create(&ctx));
    CHECK_STATUS(mha_context_set_num_threads(ctx, INT_MAX), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("n=2147483647");
    CHECK_OK(mha_context_set_num_threads(ctx, 3));
    mha_context_free(ctx);
    mha_set_num_threads(INT_MAX);
    const int procs = omp_get_num_procs(), cap = procs > 16 ? 4 * procs : 64;
    CHECK_INT(mha_get_num_threads(), cap);
    mha_config c = mha_config_default(16, 4);
    mha_layer *L = NULL;
    CHECK_OK(mha_layer_create(&L, &c, NULL));
    float x[2 * 3 * 16] = {0}, y[2 * 3 * 16];
    mha_options o = mha_options_default();
    CHECK_OK(mha_forward(L, y, NULL, x, NULL, 2, 3, 3, &o));
    mha_layer_free(L);
    mha_set_num_threads(before);
}

/* Arguments that name the wrong thing unless checked first. */
static void hostile_arguments_named(void) {
    mha_tensors *t = NULL;
    CHECK_OK(mha_tensors_create(&t));
    float f[4] = {0};
    mha_array a = {.dtype = (mha_dtype)99, .rank = 1, .shape = {4}, .count = 4, .f = f};
    CHECK_STATUS(mha_tensors_add(t, "g", &a), MHA_E_ARG); /* was a division by the dtype's size 0 */
    CHECK_ERROR_MENTIONS("dtype 99");
    /* a caller's shape is an argument error (MHA_E_ARG), not a malformed
     * file (MHA_E_FORMAT, which the readers give for the same shape; the
     * .npy writer's case is in test_io_edges.c) */
    const int negative[2] = {2, -1}, huge[4] = {1 << 20, 1 << 20, 1 << 20, 1 << 20};
    CHECK_STATUS(mha_tensors_add_f32(t, "n", f, 2, negative), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("dimension 1 is -1");
    CHECK_STATUS(mha_tensors_add_f32(t, "o", f, 4, huge), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("overflows");
    mha_tensors_free(t);
    CHECK_STATUS(mha_weight_dtype_parse(NULL, "bf16"), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("out is NULL");
}

static const test_case cases[] = {
    {"hostile_sizes_wrap", hostile_sizes_wrap},
    {"hostile_cache_nonfinite", hostile_cache_nonfinite},
    {"hostile_thread_counts", hostile_thread_counts},
    {"hostile_arguments_named", hostile_arguments_named},
};

const test_case *tests_hostile_api(size_t *count) {
    *count = sizeof cases / sizeof cases[0];
    return cases;
}
