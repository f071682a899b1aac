/* tensors_internal.h — the mha_tensors struct, shared by tensors.c,
 * safetensors.c and layouts.c. */
#ifndef MHA_TENSORS_INTERNAL_H
#define MHA_TENSORS_INTERNAL_H

#include "mha.h"

typedef struct {
    char *name;
    mha_array a;
} mha_named_array;

typedef struct {
    char *key, *value;
} mha_meta_entry;

struct mha_tensors {
    mha_named_array *items; /* insertion order */
    int n, cap;
    mha_meta_entry *meta;
    int n_meta;
};

/* Adds *a under name without copying; on success *a is zeroed (owned by t). */
mha_status mha_tensors_take(mha_tensors *t, const char *name, mha_array *a);

#endif
