/* fuzz_safetensors.c — libFuzzer target for the safetensors reader: any
 * byte string must give MHA_OK with consistent tensors, or an error status
 * with a message; never a crash, a leak or an out-of-bounds read. A file
 * that reads back is also written and read again (the writer's output must
 * be accepted), by the copying and by the mapping (borrowing) reader. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "io/io_internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    uint8_t *buf = malloc(size ? size : 1);
    if (!buf) return 0;
    if (size) memcpy(buf, data, size);
    mha_tensors *t = NULL;
    mha_status s = mha_safetensors_parse(&t, buf, size, "fuzz.safetensors", MHA_IO_ALLOW_NONFINITE);
    if (s != MHA_OK) {
        if (t || !mha_last_error()[0]) abort();
        free(buf);
        return 0;
    }
    for (int i = 0; i < mha_tensors_count(t); i++) {
        const mha_array *a = mha_tensors_get(t, mha_tensors_name(t, i));
        if (!a) abort();
        size_t n = 1;
        for (int k = 0; k < a->rank; k++) n *= (size_t)a->shape[k];
        if (n != a->count || (!a->f == !a->u8)) abort();
        volatile float sink = 0;
        for (size_t k = 0; k < a->count; k++) sink += a->f ? a->f[k] : (float)a->u8[k];
        (void)sink;
    }
    for (int i = 0; i < mha_tensors_meta_count(t); i++)
        if (!mha_tensors_meta(t, mha_tensors_meta_key(t, i))) abort();
    /* write what was read, and read it back */
    char path[64];
    snprintf(path, sizeof path, "/tmp/mha_fuzz_%d.safetensors", (int)getpid());
    if (mha_safetensors_write(path, t) == MHA_OK) {
        mha_tensors *r = NULL;
        if (mha_safetensors_read(&r, path, MHA_IO_ALLOW_NONFINITE) != MHA_OK) abort();
        if (mha_tensors_count(r) != mha_tensors_count(t)) abort();
        /* the borrowing reader (mha_layer_load's) gives the same values */
        mha_tensors *m = NULL;
        if (mha_safetensors_map(&m, path, MHA_IO_ALLOW_NONFINITE) != MHA_OK) abort();
        for (int i = 0; i < mha_tensors_count(r); i++) {
            const mha_array *x = mha_tensors_get(r, mha_tensors_name(r, i)),
                            *y = mha_tensors_get(m, mha_tensors_name(r, i));
            if (!y || x->count != y->count || !x->f != !y->f) abort();
            if (x->f ? memcmp(x->f, y->f, x->count * sizeof(float))
                     : memcmp(x->u8, y->u8, x->count))
                abort();
        }
        mha_tensors_free(m);
        mha_tensors_free(r);
    }
    remove(path);
    mha_tensors_free(t);
    free(buf);
    return 0;
}
