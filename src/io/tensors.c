/* tensors.c — mha_tensors: named arrays plus string metadata, the
 * in-memory form of one safetensors file. Names and metadata keys are
 * hashed: a file is untrusted input, and may hold 10^5 entries. */
#include <stdlib.h>
#include <string.h>

#include "io/io_internal.h"
#include "io/tensors_internal.h"

mha_status mha_tensors_create(mha_tensors **out) {
    if (!out) return mha_fail(MHA_E_ARG, "mha_tensors_create: out is NULL");
    *out = calloc(1, sizeof **out);
    if (!*out) return mha_fail(MHA_E_NOMEM, "cannot allocate a tensor set");
    (*out)->map.fd = -1; /* no mapping */
    return MHA_OK;
}

void mha_tensors_free(mha_tensors *t) {
    if (!t) return;
    for (int i = 0; i < t->n; i++) {
        free(t->items[i].name);
        if (!t->items[i].borrowed) mha_array_free(&t->items[i].a);
    }
    for (int i = 0; i < t->n_meta; i++) {
        free(t->meta[i].key);
        free(t->meta[i].value);
    }
    free(t->items);
    free(t->meta);
    free(t->item_index.slot);
    free(t->meta_index.slot);
    mha_map_close(&t->map); /* after the items: borrowed arrays die with it */
    free(t);
}

int mha_tensors_count(const mha_tensors *t) { return t ? t->n : 0; }

const char *mha_tensors_name(const mha_tensors *t, int i) {
    return (t && i >= 0 && i < t->n) ? t->items[i].name : NULL;
}

/* --- the name index --- */

static size_t hash_str(const char *s) { /* FNV-1a, 64-bit */
    uint64_t h = 1469598103934665603u;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211u;
    return (size_t)(h ^ (h >> 29));
}

/* Position of key among names[0..), or -1; *at = the slot where it is or
 * would go. names(i) gives entry i's name. */
typedef const char *(*name_of_fn)(const mha_tensors *t, int i);
static const char *item_name(const mha_tensors *t, int i) { return t->items[i].name; }
static const char *meta_key(const mha_tensors *t, int i) { return t->meta[i].key; }

static int index_find(const mha_name_index *x, const mha_tensors *t, name_of_fn name_of,
                      const char *key, size_t *at) {
    if (!x->cap) return -1;
    size_t mask = x->cap - 1, k = hash_str(key) & mask;
    for (; x->slot[k]; k = (k + 1) & mask)
        if (strcmp(name_of(t, x->slot[k] - 1), key) == 0) break;
    if (at) *at = k;
    return x->slot[k] - 1;
}

/* Makes room for entry n (0-based) and inserts it; n+1 entries afterwards. */
static mha_status index_add(mha_name_index *x, const mha_tensors *t, name_of_fn name_of, int n) {
    if ((size_t)(n + 1) * 2 > x->cap) { /* grow and rehash */
        size_t cap = x->cap ? 2 * x->cap : 16;
        int *slot = calloc(cap, sizeof *slot);
        if (!slot) return mha_fail(MHA_E_NOMEM, "cannot grow a name index to %zu slots", cap);
        free(x->slot);
        x->slot = slot;
        x->cap = cap;
        for (int i = 0; i < n; i++) {
            size_t at;
            index_find(x, t, name_of, name_of(t, i), &at);
            x->slot[at] = i + 1;
        }
    }
    size_t at;
    index_find(x, t, name_of, name_of(t, n), &at);
    x->slot[at] = n + 1;
    return MHA_OK;
}

const mha_array *mha_tensors_get(const mha_tensors *t, const char *name) {
    if (!t || !name) return NULL;
    int i = index_find(&t->item_index, t, item_name, name, NULL);
    return i >= 0 ? &t->items[i].a : NULL;
}

static char *dup_str(const char *s) {
    size_t n = strlen(s) + 1;
    char *p = malloc(n);
    if (p) memcpy(p, s, n);
    return p;
}

/* Integer arrays (.npy with MHA_IO_INTEGERS) have no file writer. */
static int is_integer(const mha_array *a) { return a->dtype == MHA_DTYPE_I32 || a->dtype == MHA_DTYPE_I64; }
static mha_status refuse_integer(const char *name, const mha_array *a) {
    return mha_fail(MHA_E_UNSUPPORTED, "tensor '%s' is %s; expected a float, bool or uint8 tensor (integer "
                    "arrays are read from .npy only, e.g. positions)", name, mha_dtype_name(a->dtype));
}

mha_status mha_tensors_take(mha_tensors *t, const char *name, mha_array *a) {
    if (!t || !name || !a) return mha_fail(MHA_E_ARG, "mha_tensors_add: NULL argument");
    if (is_integer(a)) return refuse_integer(name, a);
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
    mha_status s = index_add(&t->item_index, t, item_name, t->n);
    if (s) {
        free(nm);
        return s;
    }
    t->items[t->n].a = *a;
    t->items[t->n].borrowed = 0;
    t->items[t->n].keep_dtype = 0;
    t->n++;
    memset(a, 0, sizeof *a);
    return MHA_OK;
}

mha_status mha_tensors_add(mha_tensors *t, const char *name, const mha_array *a) {
    if (!t || !name || !a) return mha_fail(MHA_E_ARG, "mha_tensors_add: NULL argument");
    if (a->rank < 0 || a->rank > MHA_ARRAY_MAX_RANK)
        return mha_fail(MHA_E_ARG, "tensor '%s' has rank %d; expected 0..%d", name, a->rank,
                        MHA_ARRAY_MAX_RANK);
    if (is_integer(a)) return refuse_integer(name, a);
    if (!mha_dtype_size(a->dtype))
        return mha_fail(MHA_E_ARG, "tensor '%s' has dtype %d; expected one of mha_dtype", name, (int)a->dtype);
    mha_array c = *a;
    c.f = NULL;
    c.u8 = NULL;
    mha_status s = mha_shape_count(&c.count, c.shape, c.rank, mha_dtype_size(c.dtype), name,
                                  MHA_E_ARG);
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
    mha_status s = mha_shape_count(&a.count, a.shape, rank, 4, name ? name : "?", MHA_E_ARG);
    if (s) return s;
    return mha_tensors_add(t, name, &a);
}

mha_status mha_tensors_set_meta(mha_tensors *t, const char *key, const char *value) {
    if (!t || !key || !value) return mha_fail(MHA_E_ARG, "mha_tensors_set_meta: NULL argument");
    char *v = dup_str(value);
    if (!v) return mha_fail(MHA_E_NOMEM, "cannot copy metadata");
    int i = index_find(&t->meta_index, t, meta_key, key, NULL);
    if (i >= 0) {
        free(t->meta[i].value);
        t->meta[i].value = v;
        return MHA_OK;
    }
    if (t->n_meta == t->meta_cap) {
        int cap = t->meta_cap ? 2 * t->meta_cap : 8;
        mha_meta_entry *p = realloc(t->meta, (size_t)cap * sizeof *p);
        if (!p) {
            free(v);
            return mha_fail(MHA_E_NOMEM, "cannot grow metadata");
        }
        t->meta = p;
        t->meta_cap = cap;
    }
    char *k = dup_str(key);
    if (!k) {
        free(v);
        return mha_fail(MHA_E_NOMEM, "cannot copy a metadata key");
    }
    t->meta[t->n_meta].key = k;
    mha_status s = index_add(&t->meta_index, t, meta_key, t->n_meta);
    if (s) {
        free(k);
        free(v);
        return s;
    }
    t->meta[t->n_meta].value = v;
    t->n_meta++;
    return MHA_OK;
}

const char *mha_tensors_meta(const mha_tensors *t, const char *key) {
    if (!t || !key) return NULL;
    int i = index_find(&t->meta_index, t, meta_key, key, NULL);
    return i >= 0 ? t->meta[i].value : NULL;
}

int mha_tensors_meta_count(const mha_tensors *t) { return t ? t->n_meta : 0; }

const char *mha_tensors_meta_key(const mha_tensors *t, int i) {
    return (t && i >= 0 && i < t->n_meta) ? t->meta[i].key : NULL;
}
