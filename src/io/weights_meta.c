/* weights_meta.c — bf16 / int8 projection weights in a native checkpoint
 * (docs/FILES.md): W_Q..W_O (and a gated layer's W_G) as BF16 tensors, or
 * as I8 tensors with F32 scale tensors w_q_scale .. w_o_scale, w_g_scale
 * (groups, N), one per output column
 * and group of 32 inputs (W_O: groups restart at each head's d_v rows);
 * the metadata weights_dtype ("bf16", "int8") and int8_scales
 * ("per_32_inputs") record the layout. fp32 layers write neither, so
 * their files are as before.
 * Legend: K rows (inputs), N columns (outputs) of a matrix. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/weight_store.h"
#include "io/io_internal.h"
#include "io/tensors_internal.h"

static const char *const mat_names[MHA_N_MATS] = {"w_q", "w_k", "w_v", "w_o", "w_g"};
static const char *const scale_names[MHA_N_MATS] = {"w_q_scale", "w_k_scale", "w_v_scale", "w_o_scale", "w_g_scale"};
#define INT8_LAYOUT "per_32_inputs"

/* The scale tensor of matrix m inside the layer's prefix, or NULL. */
static const mha_array *find_scale(const mha_tensors *t, const char *prefix, int m) {
    return mha_io_find(t, prefix, scale_names[m]);
}

/* The scales of matrix m: an F32 (G, N) tensor of finite values >= 0,
 * copied into a new array. */
static mha_status read_scale(float **out, const mha_tensors *t, const char *prefix, int m, int G, int N) {
    const mha_array *a = find_scale(t, prefix, m);
    if (!a)
        return mha_fail(MHA_E_FORMAT, "weights_dtype = int8 but tensor '%s' is missing; expected the F32 "
                        "scales of %s, (%d, %d)", scale_names[m], mat_names[m], G, N);
    if (a->dtype != MHA_DTYPE_F32 || a->rank != 2 || a->shape[0] != G || a->shape[1] != N) {
        char shape[64] = "(";
        for (int i = 0; i < a->rank; i++) /* the file's shape, rank 0..4 */
            snprintf(shape + strlen(shape), sizeof shape - strlen(shape), i ? ", %d" : "%d", a->shape[i]);
        return mha_fail(MHA_E_FORMAT, "tensor '%s' is %s of shape %s); expected F32 (%d, %d): one scale per group of "
                        "32 inputs and output column of %s", scale_names[m], mha_dtype_name(a->dtype), shape, G, N,
                        mat_names[m]);
    }
    const size_t n = (size_t)G * N;
    for (size_t j = 0; j < n; j++)
        if (!isfinite(a->f[j]) || a->f[j] < 0.0f)
            return mha_fail(MHA_E_FORMAT, "tensor '%s'[%zu] = %g; expected a finite scale >= 0", scale_names[m], j,
                            (double)a->f[j]);
    *out = malloc(n * sizeof(float));
    if (!*out) return mha_fail(MHA_E_NOMEM, "cannot allocate the scales of %s", mat_names[m]);
    memcpy(*out, a->f, n * sizeof(float));
    return MHA_OK;
}

/* The codes of matrix m (K, N), I8 widened to float (or any float when
 * the tensors were built in memory): integers in [-127, 127], the
 * symmetric range the scales are defined for (-128 would exceed its
 * group's max |w| = 127 * scale; a non-integer or one beyond int8 has no
 * int8 form at all), and 0 wherever the scale is 0 (an all-zero group),
 * and each code times its scale finite. */
static mha_status check_codes(const mha_array *w, const float *scale, int m, int seg) {
    const int K = w->shape[0], N = w->shape[1];
    for (int k = 0; k < K; k++)
        for (int j = 0; j < N; j++) {
            const float q = w->f[(size_t)k * N + j];
            const float sc = scale[(size_t)mha_wstore_group_of(k, seg) * N + j];
            const char *why = !(q >= -127.0f && q <= 127.0f) || q != truncf(q) ? "an integer in [-127, 127]"
                              : sc == 0.0f && q != 0.0f                       ? "0, as its scale is 0"
                              : !isfinite(q * sc)                             ? "a code whose value q * scale is finite"
                                                                              : NULL;
            if (why)
                return mha_fail(MHA_E_FORMAT, "tensor '%s'[%d][%d] = %g (scale %g in %s); expected %s", mat_names[m],
                                k, j, (double)q, (double)sc, scale_names[m], why);
        }
    return MHA_OK;
}

/* Scales beside weights that are not int8: integer codes written as floats
 * with their scales but without weights_dtype = int8 would otherwise load
 * as weights about 1/scale times too large. */
static mha_status no_stray_scales(const mha_tensors *t, const char *prefix, const char *dtype) {
    for (int m = 0; m < MHA_N_MATS; m++)
        if (find_scale(t, prefix, m))
            return mha_fail(MHA_E_FORMAT, "tensor '%s' (int8 scales of %s) in a file whose weights_dtype is %s; "
                            "expected no scales, or weights_dtype = int8 with I8 weights", scale_names[m],
                            mat_names[m], dtype);
    return MHA_OK;
}

mha_status mha_io_weights_read(mha_weight_dtype *dtype, float *scale[MHA_N_MATS], const mha_tensors *t,
                               const char *prefix, const mha_array *const w[MHA_N_MATS], const mha_config *c) {
    *dtype = MHA_W_F32;
    const char *v = mha_tensors_meta(t, "weights_dtype");
    if (!v) return no_stray_scales(t, prefix, "absent (fp32)"); /* any floating dtype in the file, widened */
    mha_status s = mha_weight_dtype_parse(dtype, v);
    if (s) return mha_fail(MHA_E_FORMAT, "metadata weights_dtype = '%.20s'; expected f32, bf16 or int8", v);
    const mha_dtype want = *dtype == MHA_W_BF16 ? MHA_DTYPE_BF16 : *dtype == MHA_W_I8 ? MHA_DTYPE_I8 : MHA_DTYPE_F32;
    for (int m = 0; m < MHA_N_MATS; m++)
        if (w[m] && w[m]->dtype != want)
            return mha_fail(MHA_E_FORMAT, "tensor '%s' is %s but metadata weights_dtype = %s; expected %s",
                            mat_names[m], mha_dtype_name(w[m]->dtype), v, mha_dtype_name(want));
    if (*dtype != MHA_W_I8) return no_stray_scales(t, prefix, v);
    const char *lay = mha_tensors_meta(t, "int8_scales");
    if (!lay || strcmp(lay, INT8_LAYOUT) != 0)
        return mha_fail(MHA_E_FORMAT, "metadata int8_scales = '%.40s'; expected '" INT8_LAYOUT "'",
                        lay ? lay : "(missing)");
    for (int m = 0; m < MHA_N_MATS && !s; m++) {
        if (!w[m]) { /* no w_g: its scales would be stray */
            if (find_scale(t, prefix, m))
                s = mha_fail(MHA_E_FORMAT, "tensor '%s' without %s; expected both or neither", scale_names[m],
                             mat_names[m]);
            continue;
        }
        if (!(s = read_scale(&scale[m], t, prefix, m, mha_wstore_groups(c, m), w[m]->shape[1])))
            s = check_codes(w[m], scale[m], m, mha_wstore_segment(c, m));
    }
    return s;
}

mha_status mha_io_weights_write(mha_tensors *t, const mha_layer *L) {
    const mha_config *c = mha_layer_config(L);
    const mha_wstore *st = L->wstore;
    mha_weights w;
    mha_layer_get_weights(L, &w);
    const float *val[MHA_N_MATS] = {w.w_q, w.w_k, w.w_v, w.w_o, w.w_g};
    mha_status s = MHA_OK;
    for (int m = 0; m < MHA_N_MATS && !s; m++) {
        if (!mha_wstore_has(c, m)) continue;
        int K, N;
        mha_wstore_shape(c, m, &K, &N);
        const size_t count = (size_t)K * N;
        mha_array a = {.dtype = MHA_DTYPE_F32, .rank = 2, .shape = {K, N, 1, 1}, .count = count, .f = (float *)val[m]};
        float *q = NULL;
        if (st && st->dtype == MHA_W_BF16) a.dtype = MHA_DTYPE_BF16; /* the values are bf16: exact */
        if (st && st->dtype == MHA_W_I8) {
            if (!(q = malloc(count * sizeof(float) + 1))) return mha_fail(MHA_E_NOMEM, "cannot stage %s", mat_names[m]);
            for (size_t i = 0; i < count; i++) q[i] = (float)st->i8[m][i];
            a.dtype = MHA_DTYPE_I8, a.f = q;
        }
        s = mha_tensors_add(t, mat_names[m], &a);
        if (!s) t->items[t->n - 1].keep_dtype = a.dtype == MHA_DTYPE_BF16; /* not widened on writing */
        const int ss[2] = {mha_wstore_groups(c, m), N};
        if (!s && q) s = mha_tensors_add_f32(t, scale_names[m], st->scale[m], 2, ss);
        free(q);
    }
    if (!s && st) s = mha_tensors_set_meta(t, "weights_dtype", mha_weight_dtype_name(st->dtype));
    if (!s && st && st->dtype == MHA_W_I8) s = mha_tensors_set_meta(t, "int8_scales", INT8_LAYOUT);
    return s;
}
