/* cache_file.c — a KV cache saved to and loaded from a safetensors file
 * (mha_cache_save, mha_cache_load): a prompt's cache computed once and
 * reused by later processes. The state comes from cache/snapshot.h as
 * plain arrays; this file only knows the file's form (docs/CACHE.md):
 *   metadata  format "mha_cache", format_version "1", the shape (d_model,
 *             n_heads, n_kv_heads, d_k, d_v, d_kv_in, d_v_in), batch,
 *             capacity, window, sink_tokens, cross, k_dtype, v_dtype
 *             ("float32" | "float16" | "int8"), lengths, oldest (B
 *             comma-separated ints), labels_k, labels_v (h_kv ints)
 *   k (B, h_kv, R, d_k) and v (B, h_kv, R, d_v) in the storage type (F32,
 *             F16 or I8 codes), slot by slot; k_scale (B, h_kv, R, nbk),
 *             v_scale F32 for int8; positions (B, R, 4) U8: the
 *             little-endian int32 position each slot was stored with.
 * Legend: B sequences, R capacity slots, h_kv kv heads. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache/snapshot.h"
#include "io/cache_file.h"
#include "io/tensors_internal.h"

#define CACHE_FORMAT "mha_cache"
#define CACHE_VERSION "1"

static const char *dtype_word(mha_cache_dtype dt) {
    return dt == MHA_CACHE_F16 ? "float16" : dt == MHA_CACHE_I8 ? "int8" : "float32";
}

static mha_dtype file_dtype(mha_cache_dtype dt) {
    return dt == MHA_CACHE_F16 ? MHA_DTYPE_F16 : dt == MHA_CACHE_I8 ? MHA_DTYPE_I8 : MHA_DTYPE_F32;
}

/* The state's arrays for its shape (zeroed), or 0 when out of memory. */
static int state_alloc(mha_cache_state *s) {
    const size_t blocks = (size_t)s->B * s->h_kv * s->cap;
    s->k = calloc(blocks * s->d_k + 1, sizeof(float)), s->v = calloc(blocks * s->d_v + 1, sizeof(float));
    s->k_scale = s->nbk ? calloc(blocks * s->nbk, sizeof(float)) : NULL;
    s->v_scale = s->nbv ? calloc(blocks * s->nbv, sizeof(float)) : NULL;
    s->pos = calloc((size_t)s->B * s->cap + 1, sizeof(int));
    s->len = calloc((size_t)s->B, sizeof(int)), s->lo = calloc((size_t)s->B, sizeof(int));
    s->labels_k = calloc((size_t)s->h_kv, sizeof(int)), s->labels_v = calloc((size_t)s->h_kv, sizeof(int));
    return s->k && s->v && (!s->nbk || s->k_scale) && (!s->nbv || s->v_scale) && s->pos && s->len && s->lo &&
           s->labels_k && s->labels_v;
}

static void state_free(mha_cache_state *s) {
    free(s->k), free(s->v), free(s->k_scale), free(s->v_scale), free(s->pos), free(s->len), free(s->lo);
    free(s->labels_k), free(s->labels_v);
}

/* ------------------------------------------------------------- save */

/* "a,b,c" of n ints into a new string (NULL: out of memory). */
static char *int_list(const int *v, int n) {
    char *out = malloc((size_t)n * 12 + 1), *p = out;
    if (!out) return NULL;
    *p = '\0';
    for (int i = 0; i < n; i++) p += sprintf(p, i ? ",%d" : "%d", v[i]);
    return out;
}

static mha_status meta_int(mha_tensors *t, const char *key, int v) {
    char buf[16];
    snprintf(buf, sizeof buf, "%d", v);
    return mha_tensors_set_meta(t, key, buf);
}

static mha_status meta_list(mha_tensors *t, const char *key, const int *v, int n) {
    char *s = int_list(v, n);
    if (!s) return mha_fail(MHA_E_NOMEM, "mha_cache_save: no memory for metadata %s", key);
    mha_status st = mha_tensors_set_meta(t, key, s);
    free(s);
    return st;
}

/* Adds data (rank 4 of shape sh) under name, written as dtype dt. */
static mha_status add4(mha_tensors *t, const char *name, float *data, const int *sh, mha_dtype dt) {
    mha_array a = {.dtype = dt, .rank = 4, .shape = {sh[0], sh[1], sh[2], sh[3]},
                   .count = (size_t)sh[0] * sh[1] * sh[2] * sh[3], .f = data};
    mha_status s = mha_tensors_add(t, name, &a);
    if (!s) t->items[t->n - 1].keep_dtype = dt == MHA_DTYPE_F16; /* not widened on writing */
    return s;
}

static mha_status build_file(mha_tensors *t, const mha_cache_state *s) {
    static const char *const shape_keys[] = {"d_model", "n_heads", "n_kv_heads", "d_k", "d_v", "d_kv_in", "d_v_in",
                                             "batch", "capacity", "window", "sink_tokens", "cross"};
    const int shape_vals[] = {s->d_model, s->h, s->h_kv, s->d_k, s->d_v, s->d_kv_in, s->d_v_in,
                              s->B, s->cap, s->window, s->n_sink, s->cross};
    mha_status st = mha_tensors_set_meta(t, "format", CACHE_FORMAT);
    if (!st) st = mha_tensors_set_meta(t, "format_version", CACHE_VERSION);
    for (size_t i = 0; i < sizeof shape_vals / sizeof shape_vals[0] && !st; i++) st = meta_int(t, shape_keys[i], shape_vals[i]);
    if (!st) st = mha_tensors_set_meta(t, "k_dtype", dtype_word(s->kt));
    if (!st) st = mha_tensors_set_meta(t, "v_dtype", dtype_word(s->vt));
    if (!st) st = meta_list(t, "lengths", s->len, s->B);
    if (!st) st = meta_list(t, "oldest", s->lo, s->B);
    if (!st) st = meta_list(t, "labels_k", s->labels_k, s->h_kv);
    if (!st) st = meta_list(t, "labels_v", s->labels_v, s->h_kv);
    const int kd[4] = {s->B, s->h_kv, s->cap, s->d_k}, vd[4] = {s->B, s->h_kv, s->cap, s->d_v};
    const int ksd[4] = {s->B, s->h_kv, s->cap, s->nbk}, vsd[4] = {s->B, s->h_kv, s->cap, s->nbv};
    if (!st) st = add4(t, "k", s->k, kd, file_dtype(s->kt));
    if (!st) st = add4(t, "v", s->v, vd, file_dtype(s->vt));
    if (!st && s->nbk) st = add4(t, "k_scale", s->k_scale, ksd, MHA_DTYPE_F32);
    if (!st && s->nbv) st = add4(t, "v_scale", s->v_scale, vsd, MHA_DTYPE_F32);
    if (st) return st;
    const size_t np = (size_t)s->B * s->cap;
    uint8_t *bytes = malloc(np * 4 + 1);
    if (!bytes) return mha_fail(MHA_E_NOMEM, "mha_cache_save: no memory for the positions");
    for (size_t i = 0; i < np; i++)
        for (int k = 0; k < 4; k++) bytes[4 * i + k] = (uint8_t)((uint32_t)s->pos[i] >> (8 * k));
    mha_array a = {.dtype = MHA_DTYPE_U8, .rank = 3, .shape = {s->B, s->cap, 4, 1}, .count = np * 4, .u8 = bytes};
    st = mha_tensors_add(t, "positions", &a);
    free(bytes);
    return st;
}

mha_status mha_cache_save(const mha_cache *cache, const char *path) {
    if (!cache || !path) return mha_fail(MHA_E_ARG, "mha_cache_save: NULL %s", cache ? "path" : "cache");
    mha_cache_state s = {0};
    mha_cache_state_shape(&s, cache);
    mha_tensors *t = NULL;
    mha_status st = state_alloc(&s) ? MHA_OK : mha_fail(MHA_E_NOMEM, "mha_cache_save: no memory for the cache's state");
    if (!st) st = mha_cache_state_export(&s, cache);
    if (!st) st = mha_tensors_create(&t);
    if (!st) st = build_file(t, &s);
    state_free(&s);
    if (!st) st = mha_safetensors_write(path, t); /* whole or not at all */
    mha_tensors_free(t);
    return st;
}

/* ------------------------------------------------------------- load */

/* The metadata value of key as an int in lo..hi, strictly decimal. */
static mha_status read_int(const mha_tensors *t, const char *key, int lo, int hi, int *out, const char *path) {
    const char *v = mha_tensors_meta(t, key);
    if (!v) return mha_fail(MHA_E_FORMAT, "%s: metadata '%s' is missing; expected an mha_cache_save file", path, key);
    char *end = NULL;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (!*v || *end || errno || x < lo || x > hi || (v[0] != '-' && (v[0] < '0' || v[0] > '9')))
        return mha_fail(MHA_E_FORMAT, "%s: metadata %s = '%.40s'; expected an integer in %d..%d", path, key, v, lo, hi);
    *out = (int)x;
    return MHA_OK;
}

/* n comma-separated ints (each in lo..hi) of metadata key into out. */
static mha_status read_list(const mha_tensors *t, const char *key, int n, int lo, int hi, int *out, const char *path) {
    const char *v = mha_tensors_meta(t, key), *p = v;
    if (!v) return mha_fail(MHA_E_FORMAT, "%s: metadata '%s' is missing; expected %d integers", path, key, n);
    for (int i = 0; i < n; i++) {
        char *end = NULL;
        errno = 0;
        long x = (*p >= '0' && *p <= '9') ? strtol(p, &end, 10) : -1;
        if (!end || errno || x < lo || x > hi || (i + 1 < n ? *end != ',' : *end != '\0'))
            return mha_fail(MHA_E_FORMAT, "%s: metadata %s = '%.60s'; expected %d comma-separated integers in %d..%d "
                            "(entry %d)", path, key, v, n, lo, hi, i);
        out[i] = (int)x;
        p = end + 1;
    }
    return MHA_OK;
}

static mha_status read_dtype(const mha_tensors *t, const char *key, mha_cache_dtype *dt, const char *path) {
    const char *v = mha_tensors_meta(t, key);
    if (v && strcmp(v, "float32") == 0) *dt = MHA_CACHE_F32;
    else if (v && strcmp(v, "float16") == 0) *dt = MHA_CACHE_F16;
    else if (v && strcmp(v, "int8") == 0) *dt = MHA_CACHE_I8;
    else
        return mha_fail(MHA_E_FORMAT, "%s: metadata %s = '%.20s'; expected float32, float16 or int8", path, key,
                        v ? v : "(missing)");
    return MHA_OK;
}

/* The array `name` when it is rank 4 of shape want and file dtype dt. */
static mha_status check4(const mha_tensors *t, const char *name, const int *want, mha_dtype dt, const char *path) {
    const mha_array *a = mha_tensors_get(t, name);
    if (!a) return mha_fail(MHA_E_FORMAT, "%s: tensor '%s' is missing", path, name);
    if (a->dtype != dt || a->rank != 4 || a->shape[0] != want[0] || a->shape[1] != want[1] || a->shape[2] != want[2] ||
        a->shape[3] != want[3] || !a->f)
        return mha_fail(MHA_E_FORMAT, "%s: tensor '%s' is %s (%d,%d,%d,%d) of rank %d; expected %s (%d,%d,%d,%d)", path,
                        name, mha_dtype_name(a->dtype), a->shape[0], a->shape[1], a->shape[2], a->shape[3], a->rank,
                        mha_dtype_name(dt), want[0], want[1], want[2], want[3]);
    return MHA_OK;
}

/* The tensors the metadata s announces, with their shapes and dtypes
 * (before anything the size of the cache is allocated: a file cannot ask
 * for more memory than its own tensors hold). */
static mha_status check_tensors(const mha_tensors *t, const mha_cache_state *s, const char *path) {
    const int kd[4] = {s->B, s->h_kv, s->cap, s->d_k}, vd[4] = {s->B, s->h_kv, s->cap, s->d_v};
    const int ksd[4] = {s->B, s->h_kv, s->cap, s->nbk}, vsd[4] = {s->B, s->h_kv, s->cap, s->nbv};
    mha_status st = check4(t, "k", kd, file_dtype(s->kt), path);
    if (!st) st = check4(t, "v", vd, file_dtype(s->vt), path);
    if (!st && s->nbk) st = check4(t, "k_scale", ksd, MHA_DTYPE_F32, path);
    if (!st && s->nbv) st = check4(t, "v_scale", vsd, MHA_DTYPE_F32, path);
    const mha_array *p = mha_tensors_get(t, "positions");
    if (!st && (!p || p->dtype != MHA_DTYPE_U8 || p->rank != 3 || p->shape[0] != s->B || p->shape[1] != s->cap ||
                p->shape[2] != 4 || !p->u8))
        st = mha_fail(MHA_E_FORMAT, "%s: tensor 'positions' is %s; expected U8 (%d,%d,4): each slot's stored "
                      "position as little-endian int32", path, p ? mha_dtype_name(p->dtype) : "missing", s->B, s->cap);
    return st;
}

/* s's arrays (allocated for its shape) from the file's tensors and lists. */
static mha_status read_state(mha_cache_state *s, const mha_tensors *t, const char *path) {
    mha_status st = read_list(t, "lengths", s->B, 0, INT_MAX, s->len, path);
    if (!st) st = read_list(t, "oldest", s->B, 0, INT_MAX, s->lo, path);
    if (!st) st = read_list(t, "labels_k", s->h_kv, 0, s->h_kv - 1, s->labels_k, path);
    if (!st) st = read_list(t, "labels_v", s->h_kv, 0, s->h_kv - 1, s->labels_v, path);
    if (st) return st;
    const size_t blocks = (size_t)s->B * s->h_kv * s->cap;
    memcpy(s->k, mha_tensors_get(t, "k")->f, sizeof(float) * blocks * s->d_k);
    memcpy(s->v, mha_tensors_get(t, "v")->f, sizeof(float) * blocks * s->d_v);
    if (s->nbk) memcpy(s->k_scale, mha_tensors_get(t, "k_scale")->f, sizeof(float) * blocks * s->nbk);
    if (s->nbv) memcpy(s->v_scale, mha_tensors_get(t, "v_scale")->f, sizeof(float) * blocks * s->nbv);
    const uint8_t *b = mha_tensors_get(t, "positions")->u8;
    for (size_t i = 0; i < (size_t)s->B * s->cap; i++) {
        uint32_t u = 0;
        for (int k = 0; k < 4; k++) u |= (uint32_t)b[4 * i + k] << (8 * k);
        s->pos[i] = u > (uint32_t)INT_MAX ? -1 : (int)u; /* negative: refused for a live slot */
    }
    return MHA_OK;
}

mha_status mha_cache_from_tensors(mha_cache **out, const mha_layer *layer, const mha_tensors *t, const char *path) {
    const char *fmt = mha_tensors_meta(t, "format"), *ver = mha_tensors_meta(t, "format_version");
    if (!fmt || strcmp(fmt, CACHE_FORMAT) != 0)
        return mha_fail(MHA_E_FORMAT, "%s: metadata format = '%.20s'; expected '%s' (a file mha_cache_save wrote)", path,
                        fmt ? fmt : "(missing)", CACHE_FORMAT);
    if (!ver || strcmp(ver, CACHE_VERSION) != 0)
        return mha_fail(MHA_E_UNSUPPORTED, "%s: format_version '%.20s'; this library reads version %s", path,
                        ver ? ver : "(missing)", CACHE_VERSION);
    mha_cache_state s = {0};
    static const char *const keys[] = {"d_model", "n_heads", "n_kv_heads", "d_k", "d_v", "d_kv_in", "d_v_in",
                                       "batch", "capacity", "window", "sink_tokens", "cross"};
    int *vals[] = {&s.d_model, &s.h, &s.h_kv, &s.d_k, &s.d_v, &s.d_kv_in, &s.d_v_in,
                   &s.B, &s.cap, &s.window, &s.n_sink, &s.cross};
    mha_status st = MHA_OK;
    for (int i = 0; i < 12 && !st; i++) st = read_int(t, keys[i], i >= 9 ? 0 : 1, i == 11 ? 1 : INT_MAX, vals[i], path);
    if (!st) st = read_dtype(t, "k_dtype", &s.kt, path);
    if (!st) st = read_dtype(t, "v_dtype", &s.vt, path);
    s.nbk = s.kt == MHA_CACHE_I8 ? (s.d_k + 31) / 32 : 0, s.nbv = s.vt == MHA_CACHE_I8 ? (s.d_v + 31) / 32 : 0;
    if (!st) st = check_tensors(t, &s, path);
    const mha_config *f = mha_layer_config(layer);
    if (!st && (f->d_model != s.d_model || f->n_heads != s.h || f->n_kv_heads != s.h_kv || f->d_k != s.d_k ||
                f->d_v != s.d_v || f->d_kv_in != s.d_kv_in || f->d_v_in != s.d_v_in))
        st = mha_fail(MHA_E_SHAPE, "%s: a cache of d_model=%d h=%d h_kv=%d d_k=%d d_v=%d d_kv_in=%d d_v_in=%d; the "
                      "layer has d_model=%d h=%d h_kv=%d d_k=%d d_v=%d d_kv_in=%d d_v_in=%d; expected the layer the "
                      "cache was saved from", path, s.d_model, s.h, s.h_kv, s.d_k, s.d_v, s.d_kv_in, s.d_v_in,
                      f->d_model, f->n_heads, f->n_kv_heads, f->d_k, f->d_v, f->d_kv_in, f->d_v_in);
    mha_cache *c = NULL;
    /* the library's own checks of capacity, window, sinks and the layer */
    if (!st) st = s.cross ? mha_cache_create_cross(&c, layer, s.B, s.cap, s.kt, s.vt)
                          : mha_cache_create_kv(&c, layer, s.B, s.cap, s.kt, s.vt, s.window);
    if (!st && s.n_sink) st = mha_cache_set_sink_tokens(c, s.n_sink);
    if (!st && !state_alloc(&s)) st = mha_fail(MHA_E_NOMEM, "%s: no memory for the cache's state", path);
    if (!st) st = read_state(&s, t, path);
    if (!st) st = mha_cache_state_import(c, &s, path);
    state_free(&s);
    if (st) mha_cache_free(c);
    else *out = c;
    return st;
}

mha_status mha_cache_load(mha_cache **out, const mha_layer *layer, const char *path) {
    if (!out) return mha_fail(MHA_E_ARG, "mha_cache_load: out is NULL");
    *out = NULL;
    if (!layer || !path) return mha_fail(MHA_E_ARG, "mha_cache_load: NULL %s", layer ? "path" : "layer");
    mha_tensors *t = NULL;
    mha_status st = mha_safetensors_read(&t, path, 0);
    if (!st) st = mha_cache_from_tensors(out, layer, t, path);
    mha_tensors_free(t);
    return st;
}
