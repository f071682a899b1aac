/* tensors.c — mha_tensors: named arrays plus string metadata, the
 * in-memory form of one safetensors file. Linear lookups: a layer
 * checkpoint holds a handful of tensors. */
#include <stdlib.h>
#include <string.h>

#include "io/io_internal.h"
#include "io/tensors_internal.h"

mha_status mha_tensors_create(mha_tensors **out) {
    if (!out) return mha_fail(MHA_E_ARG, "mha_tensors_create: out is NULL");
    *out = calloc(1, sizeof **out);
    if (!*out) return mha_fail(MHA_E_NOMEM, "cannot allocate a tensor set");
    return MHA_OK;
}

void mha_tensors_free(mha_tensors *t) {
    if (!t) return;
    for (int i = 0; i < t->n; i++) {
        free(t->items[i].name);
        mha_array_free(&t->items[i].a);
    }
    for (int i = 0; i < t->n_meta; i++) {
        free(t->meta[i].key);
        free(t->meta[i].value);
    }
    free(t->items);
    free(t->meta);
    free(t);
}

int mha_tensors_count(const mha_tensors *t) { return t ? t->n : 0; }

const char *mha_tensors_name(const mha_tensors *t, int i) {
    return (t && i >= 0 && i < t->n) ? t->items[i].name : NULL;
}

const mha_array *mha_tensors_get(const mha_tensors *t, const char *name) {
    if (!t || !name) return NULL;
    for (int i = 0; i < t->n; i++)
        if (strcmp(t->items[i].name, name) == 0) return &t->items[i].a;
    return NULL;
}

static char *dup_str(const char *s) {
    size_t n = strlen(s) + 1;
    char *p = malloc(n);
    if (p) memcpy(p, s, n);
    return p;
}

mha_status mha_tensors_take(mha_tensors *t, const char *name, mha_array *a) {
    if (!t || !name || !a) return mha_fail(MHA_E_ARG, "mha_tensors_add: NULL argument");
    if (mha_tensors_get(t, name))
        return mha_fail(MHA_E_ARG, "tensor name '%s' is already used; names must be unique", name);
    if (t->n == t->cap) {
        int cap = t->cap ? 2 * t->cap : 8;
        mha_named_array *p = realloc(t->items, (size_t)cap * sizeof *p);
        if (!p) return mha_fail(MHA_E_NOMEM, "cannot grow a tensor set");
        t->items = p;
        t->cap = cap;
    }
    char *nm = dup_str(name);
    if (!nm) return mha_fail(MHA_E_NOMEM, "cannot copy a tensor name");
    t->items[t->n].name = nm;
    t->items[t->n].a = *a;
    t->n++;
    memset(a, 0, sizeof *a);
    return MHA_OK;
}

mha_status mha_tensors_add(mha_tensors *t, const char *name, const mha_array *a) {
    if (!t || !name || !a) return mha_fail(MHA_E_ARG, "mha_tensors_add: NULL argument");
    if (a->rank < 0 || a->rank > MHA_ARRAY_MAX_RANK)
        return mha_fail(MHA_E_ARG, "tensor '%s' has rank %d; expected 0..%d", name, a->rank,
                        MHA_ARRAY_MAX_RANK);
    mha_array c = *a;
    c.f = NULL;
    c.u8 = NULL;
    mha_status s = mha_shape_count(&c.count, c.shape, c.rank, mha_dtype_size(c.dtype), name);
    if (s) return s;
    if (c.count != a->count)
        return mha_fail(MHA_E_ARG, "tensor '%s': count %zu disagrees with its shape (%zu)", name,
                        a->count, c.count);
    if ((s = mha_array_alloc(&c))) return s;
    if (c.f) {
        if (!a->f) goto nodata;
        memcpy(c.f, a->f, c.count * sizeof(float));
    } else {
        if (!a->u8) goto nodata;
        memcpy(c.u8, a->u8, c.count);
    }
    s = mha_tensors_take(t, name, &c);
    mha_array_free(&c);
    return s;
nodata:
    mha_array_free(&c);
    return mha_fail(MHA_E_ARG, "tensor '%s' has no data", name);
}

mha_status mha_tensors_add_f32(mha_tensors *t, const char *name, const float *data, int rank,
                               const int *shape) {
    if (rank < 0 || rank > MHA_ARRAY_MAX_RANK || (rank && !shape))
        return mha_fail(MHA_E_ARG, "tensor '%s': rank %d; expected 0..%d", name ? name : "?",
                        rank, MHA_ARRAY_MAX_RANK);
    mha_array a = {.dtype = MHA_DTYPE_F32, .rank = rank, .f = (float *)data};
    for (int i = 0; i < MHA_ARRAY_MAX_RANK; i++) a.shape[i] = i < rank ? shape[i] : 1;
    mha_status s = mha_shape_count(&a.count, a.shape, rank, 4, name ? name : "?");
    if (s) return s;
    return mha_tensors_add(t, name, &a);
}

mha_status mha_tensors_set_meta(mha_tensors *t, const char *key, const char *value) {
    if (!t || !key || !value) return mha_fail(MHA_E_ARG, "mha_tensors_set_meta: NULL argument");
    char *v = dup_str(value);
    if (!v) return mha_fail(MHA_E_NOMEM, "cannot copy metadata");
    for (int i = 0; i < t->n_meta; i++)
        if (strcmp(t->meta[i].key, key) == 0) {
            free(t->meta[i].value);
            t->meta[i].value = v;
            return MHA_OK;
        }
    mha_meta_entry *p = realloc(t->meta, (size_t)(t->n_meta + 1) * sizeof *p);
    char *k = dup_str(key);
    if (!p || !k) {
        if (p) t->meta = p;
        free(k);
        free(v);
        return mha_fail(MHA_E_NOMEM, "cannot grow metadata");
    }
    t->meta = p;
    t->meta[t->n_meta].key = k;
    t->meta[t->n_meta].value = v;
    t->n_meta++;
    return MHA_OK;
}

const char *mha_tensors_meta(const mha_tensors *t, const char *key) {
    if (!t || !key) return NULL;
    for (int i = 0; i < t->n_meta; i++)
        if (strcmp(t->meta[i].key, key) == 0) return t->meta[i].value;
    return NULL;
}

int mha_tensors_meta_count(const mha_tensors *t) { return t ? t->n_meta : 0; }

const char *mha_tensors_meta_key(const mha_tensors *t, int i) {
    return (t && i >= 0 && i < t->n_meta) ? t->meta[i].key : NULL;
}
