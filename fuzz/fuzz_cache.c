/* fuzz_cache.c — libFuzzer target for the KV cache file's reader
 * (mha_cache_load without the file: src/io/cache_file.h) over fuzzed
 * safetensors. The first byte chooses the layer the file is loaded for
 * (kv heads, RoPE: a cross memory must then be refused); the rest is the
 * file. Any input must give a cache that decodes a step and saves again,
 * or an error status with a message; never a crash, a leak or an
 * out-of-bounds access. */
#include <stdlib.h>
#include <string.h>

#include "io/cache_file.h"
#include "mha.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static mha_layer *make_layer(int h_kv, int rope) {
    mha_config c = mha_config_default(16, 2);
    c.n_kv_heads = h_kv, c.d_k = c.d_v = 8;
    if (rope) c.rope.pairing = MHA_ROPE_HALVES;
    mha_layer *L = NULL;
    if (mha_config_resolve(&c, &c) != MHA_OK || mha_layer_create(&L, &c, NULL) != MHA_OK) abort();
    return L;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static mha_layer *layers[4];
    if (!layers[0])
        for (int i = 0; i < 4; i++) layers[i] = make_layer(1 + (i & 1), i >> 1);
    if (size < 1) return 0;
    const mha_layer *L = layers[data[0] % 4];
    mha_tensors *t = NULL;
    if (mha_safetensors_parse(&t, data + 1, size - 1, "fuzz.safetensors", 0) != MHA_OK) {
        if (t || !mha_last_error()[0]) abort();
        return 0;
    }
    mha_cache *c = (mha_cache *)&t; /* must be left as it was on error */
    mha_status s = mha_cache_from_tensors(&c, L, t, "fuzz.safetensors");
    if (s != MHA_OK) {
        if (c != (mha_cache *)&t || !mha_last_error()[0]) abort();
    } else {
        mha_cache_info info;
        if (mha_cache_get_info(c, &info) != MHA_OK || info.batch < 1 || info.capacity < 1) abort();
        if (info.batch <= 8) { /* one step of each sequence over what was loaded */
            float x[8 * 16], y[8 * 16];
            for (int i = 0; i < 8 * 16; i++) x[i] = (float)((i * 7) % 13) / 13.0f - 0.5f;
            s = mha_forward_cached(L, c, y, NULL, x, 1, NULL, NULL);
            if (s != MHA_OK && !mha_last_error()[0]) abort();
        }
        mha_cache_free(c);
    }
    mha_tensors_free(t);
    return 0;
}
