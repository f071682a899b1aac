/* tensors_internal.h — the mha_tensors struct, shared by tensors.c,
 * safetensors.c and layouts.c. */
#ifndef MHA_TENSORS_INTERNAL_H
#define MHA_TENSORS_INTERNAL_H

#include "io/io_internal.h"

typedef struct {
    char *name;
    mha_array a;
    int borrowed; /* 1: a.f points into the set's mapping, not owned */
    int keep_dtype; /* written in a.dtype, not widened to F32: the BF16
                       weights of a bf16 layer (weights_meta.c), a KV
                       cache's F16 keys and values (cache_file.c) */
} mha_named_array;

typedef struct {
    char *key, *value;
} mha_meta_entry;

/* An open-addressing hash index over names stored elsewhere: slot holds
 * 1 + the entry's position, 0 = empty; cap is a power of two, at least
 * twice the entries, so lookups and inserts take constant expected time
 * (a header with 10^5 names must not cost 10^10 string compares). */
typedef struct {
    int *slot;
    size_t cap;
} mha_name_index;

struct mha_tensors {
    mha_named_array *items; /* insertion order */
    int n, cap;
    mha_meta_entry *meta;   /* insertion order */
    int n_meta, meta_cap;
    mha_name_index item_index, meta_index;
    mha_file_map map; /* mha_safetensors_map: the file borrowed arrays point into */
};

/* Adds *a under name without copying; on success *a is zeroed (owned by t,
 * or borrowed from t->map when a->f points into it: set items[n-1].borrowed
 * after the call). */
mha_status mha_tensors_take(mha_tensors *t, const char *name, mha_array *a);

#endif
