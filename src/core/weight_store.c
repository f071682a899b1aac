/* weight_store.c — projection weights in bf16 or int8 (weight_store.h):
 * conversion, dequantization, permutation, and the public entry points
 * mha_layer_convert_weights / mha_layer_weights_dtype.
 * Legend: K rows (inputs), N columns (outputs) of a matrix (in, out). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/bf16.h"
#include "core/core.h"
#include "core/weight_store.h"

static const char *mat_name[MHA_N_MATS] = {"w_q", "w_k", "w_v", "w_o", "w_g"};

void mha_wstore_shape(const mha_config *c, int m, int *rows, int *cols) {
    const int in[MHA_N_MATS] = {c->d_model, c->d_kv_in, c->d_v_in, c->n_heads * c->d_v, c->d_model};
    const int out[MHA_N_MATS] = {c->n_heads * c->d_k, c->n_kv_heads * c->d_k, c->n_kv_heads * c->d_v,
                                 c->d_model, c->output_gate ? c->n_heads * c->d_v : 0};
    *rows = in[m], *cols = out[m];
}

int mha_wstore_has(const mha_config *c, int m) { return m != MHA_MAT_G || c->output_gate; }

int mha_wstore_segment(const mha_config *c, int m) {
    int K, N;
    mha_wstore_shape(c, m, &K, &N);
    return m == MHA_MAT_O ? c->d_v : K;
}

int mha_wstore_groups(const mha_config *c, int m) {
    int K, N, seg = mha_wstore_segment(c, m);
    mha_wstore_shape(c, m, &K, &N);
    return K / seg * ((seg + MHA_W_I8_GROUP - 1) / MHA_W_I8_GROUP);
}

void mha_wstore_free(mha_wstore *s) {
    if (!s) return;
    for (int m = 0; m < MHA_N_MATS; m++) free(s->bf16[m]), free(s->i8[m]), free(s->scale[m]);
    free(s);
}

/* w (K, N) -> bf16 bits; MHA_E_ARG for a finite value that rounds to Inf. */
static mha_status to_bf16(uint16_t *dst, const float *w, size_t count, const char *name) {
    for (size_t i = 0; i < count; i++) {
        dst[i] = mha_bf16_round_bits(w[i]);
        if ((dst[i] & 0x7fffu) == 0x7f80u)
            return mha_fail(MHA_E_ARG, "weights.%s[%zu] = %g rounds to infinity in bfloat16; expected "
                            "|w| < 0x1.ffp127 (3.3961775e38)", name, i, (double)w[i]);
    }
    return MHA_OK;
}

/* w (K, N) -> q (K, N) and scale (groups, N): per output column and
 * group of inputs, symmetric, the rule of mha.h (MHA_W_I8). MHA_E_ARG for
 * a group whose largest |w| reads back as infinity: 127 * (max / 127)
 * rounds past FLT_MAX when max = FLT_MAX. */
static mha_status to_i8(int8_t *q, float *scale, const float *w, int K, int N, int seg, int groups,
                        const char *name) {
    for (size_t e = 0; e < (size_t)groups * N; e++) scale[e] = 0.0f;
    for (int k = 0; k < K; k++) /* max |w| of each (group, column) */
        for (int j = 0; j < N; j++) {
            float *s = &scale[(size_t)mha_wstore_group_of(k, seg) * N + j];
            *s = fmaxf(*s, fabsf(w[(size_t)k * N + j]));
        }
    for (size_t e = 0; e < (size_t)groups * N; e++) scale[e] /= 127.0f;
    for (int k = 0; k < K; k++) {
        const float *s = scale + (size_t)mha_wstore_group_of(k, seg) * N;
        for (int j = 0; j < N; j++) {
            float r = s[j] > 0.0f ? roundf(w[(size_t)k * N + j] / s[j]) : 0.0f; /* half away from 0 */
            q[(size_t)k * N + j] = (int8_t)(r > 127.0f ? 127 : r < -127.0f ? -127 : r);
            if (!isfinite((float)q[(size_t)k * N + j] * s[j]))
                return mha_fail(MHA_E_ARG, "weights.%s[%zu] = %g reads back as infinity in int8 (127 * (%g / 127)); "
                                "expected |w| < FLT_MAX", name, (size_t)k * N + j, (double)w[(size_t)k * N + j],
                                (double)w[(size_t)k * N + j]);
        }
    }
    return MHA_OK;
}

mha_status mha_wstore_build(mha_wstore **out, const mha_config *c, mha_weight_dtype dtype,
                            const float *const src[MHA_N_MATS]) {
    *out = NULL;
    mha_wstore *s = calloc(1, sizeof *s);
    if (!s) return mha_fail(MHA_E_NOMEM, "no memory for the %s weights", mha_weight_dtype_name(dtype));
    s->dtype = dtype;
    for (int m = 0; m < MHA_N_MATS; m++) {
        if (!mha_wstore_has(c, m)) continue;
        int K, N;
        mha_wstore_shape(c, m, &K, &N);
        size_t count = (size_t)K * N;
        mha_status st = MHA_OK;
        if (dtype == MHA_W_BF16) {
            s->bf16[m] = malloc(count * sizeof(uint16_t) + 1);
            st = s->bf16[m] ? to_bf16(s->bf16[m], src[m], count, mat_name[m]) : MHA_E_NOMEM;
        } else {
            const int groups = mha_wstore_groups(c, m);
            s->i8[m] = malloc(count + 1);
            s->scale[m] = malloc((size_t)groups * N * sizeof(float) + 1);
            st = s->i8[m] && s->scale[m] ? to_i8(s->i8[m], s->scale[m], src[m], K, N, mha_wstore_segment(c, m),
                                                 groups, mat_name[m])
                                          : MHA_E_NOMEM;
        }
        if (st) {
            mha_wstore_free(s);
            return st == MHA_E_NOMEM ? mha_fail(st, "no memory for the %s form of %s",
                                                mha_weight_dtype_name(dtype), mat_name[m])
                                     : st;
        }
    }
    *out = s;
    return MHA_OK;
}

mha_status mha_wstore_from_i8(mha_wstore **out, const mha_config *c, const float *const q[MHA_N_MATS],
                              const float *const scale[MHA_N_MATS]) {
    *out = NULL;
    mha_wstore *s = calloc(1, sizeof *s);
    int ok = s != NULL;
    for (int m = 0; ok && m < MHA_N_MATS; m++) {
        if (!mha_wstore_has(c, m)) continue;
        int K, N;
        mha_wstore_shape(c, m, &K, &N);
        const size_t ns = (size_t)mha_wstore_groups(c, m) * N;
        s->i8[m] = malloc((size_t)K * N + 1);
        s->scale[m] = malloc(ns * sizeof(float) + 1);
        ok = s->i8[m] && s->scale[m];
        for (size_t i = 0; ok && i < (size_t)K * N; i++) s->i8[m][i] = (int8_t)q[m][i];
        if (ok) memcpy(s->scale[m], scale[m], ns * sizeof(float));
    }
    if (!ok) {
        mha_wstore_free(s);
        return mha_fail(MHA_E_NOMEM, "no memory for the int8 weights");
    }
    s->dtype = MHA_W_I8;
    *out = s;
    return MHA_OK;
}

void mha_wstore_dequantize(const mha_wstore *s, const mha_config *c, float *const dst[MHA_N_MATS]) {
    for (int m = 0; m < MHA_N_MATS; m++) {
        if (!mha_wstore_has(c, m)) continue;
        int K, N, seg = mha_wstore_segment(c, m);
        mha_wstore_shape(c, m, &K, &N);
        for (int k = 0; k < K; k++) {
            const size_t r = (size_t)k * N;
            const float *sc = s->scale[m] ? s->scale[m] + (size_t)mha_wstore_group_of(k, seg) * N : NULL;
            for (size_t j = 0; j < (size_t)N; j++)
                dst[m][r + j] = s->dtype == MHA_W_BF16 ? mha_bf16_bits_to_float(s->bf16[m][r + j])
                                                       : (float)s->i8[m][r + j] * sc[j];
        }
    }
}

static float *const *layer_mats(mha_layer *L, float *m[MHA_N_MATS]) {
    m[0] = L->w_q, m[1] = L->w_k, m[2] = L->w_v, m[3] = L->w_o, m[4] = L->w_g;
    return m;
}

mha_status mha_layer_adopt_wstore(mha_layer *L, mha_wstore *s) {
    float *m[MHA_N_MATS];
    if (s) mha_wstore_dequantize(s, &L->cfg, layer_mats(L, m));
    mha_wstore_free(L->wstore);
    L->wstore = s;
    return mha_fast_prepare(L);
}

/* ------------------------------------------------------------ public */

const char *mha_weight_dtype_name(mha_weight_dtype d) {
    return d == MHA_W_F32 ? "f32" : d == MHA_W_BF16 ? "bf16" : d == MHA_W_I8 ? "int8" : "unknown";
}

mha_status mha_weight_dtype_parse(mha_weight_dtype *out, const char *name) {
    if (!out) return mha_fail(MHA_E_ARG, "mha_weight_dtype_parse: out is NULL");
    static const char *names[] = {"f32", "bf16", "int8"};
    for (int i = 0; name && i < 3; i++)
        if (strcmp(name, names[i]) == 0) return *out = (mha_weight_dtype)i, MHA_OK;
    return mha_fail(MHA_E_ARG, "weight dtype '%s' unknown; expected f32, bf16 or int8", name ? name : "(null)");
}

mha_weight_dtype mha_layer_weights_dtype(const mha_layer *L) {
    return L && L->wstore ? L->wstore->dtype : MHA_W_F32;
}

static mha_status layer_convert_weights_held(mha_layer *L, mha_weight_dtype dtype) {
    if (!L) return mha_fail(MHA_E_ARG, "mha_layer_convert_weights: NULL layer");
    if (dtype != MHA_W_F32 && dtype != MHA_W_BF16 && dtype != MHA_W_I8)
        return mha_fail(MHA_E_ARG, "mha_layer_convert_weights: dtype=%d; expected MHA_W_F32, MHA_W_BF16 or MHA_W_I8",
                        (int)dtype);
    if (dtype == MHA_W_F32) { /* the values already are the rounded ones */
        mha_wstore_free(L->wstore);
        L->wstore = NULL;
        return MHA_OK;
    }
    float *m[MHA_N_MATS];
    layer_mats(L, m);
    const float *const src[MHA_N_MATS] = {m[0], m[1], m[2], m[3], m[4]};
    mha_wstore *s;
    mha_status st = mha_wstore_build(&s, &L->cfg, dtype, src);
    return st ? st : mha_layer_adopt_wstore(L, s);
}

mha_status mha_layer_convert_weights(mha_layer *L, mha_weight_dtype dtype) {
    if (!L) return layer_convert_weights_held(L, dtype);
    mha_status s = mha_layer_begin(L, 1, "mha_layer_convert_weights");
    return s ? s : mha_layer_end(L, 1, layer_convert_weights_held(L, dtype));
}

/* ------------------------------------------------------- permutation */

void mha_permute_column_blocks(void *w, size_t elem, int rows, int n, int width, const int *perm, void *tmp) {
    const size_t row_len = (size_t)n * width * elem, blk = (size_t)width * elem;
    unsigned char *t = tmp;
    for (int r = 0; r < rows; r++) {
        unsigned char *row = (unsigned char *)w + (size_t)r * row_len;
        for (int i = 0; i < n; i++) memcpy(t + (size_t)i * blk, row + (size_t)perm[i] * blk, blk);
        memcpy(row, t, row_len);
    }
}

void mha_wstore_permute(mha_layer *L, int m, int rows, int n, int width, const int *perm, void *tmp) {
    mha_wstore *s = L->wstore;
    if (!s) return;
    if (s->dtype == MHA_W_BF16) {
        mha_permute_column_blocks(s->bf16[m], 2, rows, n, width, perm, tmp);
        return;
    }
    mha_permute_column_blocks(s->i8[m], 1, rows, n, width, perm, tmp);
    const int groups = mha_wstore_groups(&L->cfg, m);
    if (m != MHA_MAT_O) /* (groups, N): the columns' blocks */
        mha_permute_column_blocks(s->scale[m], sizeof(float), groups, n, width, perm, tmp);
    else /* W_O: each head's groups, groups/h whole rows of d_model scales */
        mha_permute_column_blocks(s->scale[m], sizeof(float), 1, n, groups / n * L->cfg.d_model, perm, tmp);
}

/* ------------------------------------------------------------ decode */

mha_decode_gemm_job mha_layer_decode_job(const mha_layer *L, int m, float *y) {
    const float *w[MHA_N_MATS] = {L->w_q, L->w_k, L->w_v, L->w_o, L->w_g};
    const float *b[MHA_N_MATS] = {L->b_q, L->b_k, L->b_v, L->b_o, L->b_g};
    int K, N;
    mha_wstore_shape(&L->cfg, m, &K, &N);
    mha_decode_gemm_job j = {y, w[m], b[m], N, NULL, NULL, NULL, 0};
    const mha_wstore *s = L->wstore;
    if (s && s->dtype == MHA_W_BF16) j.w_bf16 = s->bf16[m];
    if (s && s->dtype == MHA_W_I8) j.w_i8 = s->i8[m], j.w_scale = s->scale[m], j.w_seg = mha_wstore_segment(&L->cfg, m);
    return j;
}
