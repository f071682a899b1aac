/* fuzz_layouts.c — libFuzzer target for the checkpoint layout loaders
 * (src/io/layouts.c) over fuzzed safetensors: the first two bytes choose
 * the layout, the head counts and the prefix; the rest is the file. Any
 * input must give a layer whose config is self-consistent, or an error
 * status with a message; never a crash, a leak or an out-of-bounds read.
 * A layer that loads is also written back as native tensors and loaded
 * again (mha_layer_to_tensors must give what the native loader accepts). */
#include <stdlib.h>
#include <string.h>

#include "mha.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* exact layer paths, and modules holding layers (mha_io_layer_path) */
static const char *const prefixes[8] = {NULL, "", "model.layers.0.self_attn.", "h.0.attn.", "h.0", "model.layers.0",
                                        "h", "h.0.attn"};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 2) return 0;
    mha_load_options o = {0};
    o.layout = (mha_layout)(data[0] % 7); /* AUTO, NATIVE, TORCH, HF, GPT2, MEGATRON, CODEGEN */
    o.n_heads = (data[0] >> 3) % 5;        /* 0 = from the metadata */
    o.n_kv_heads = data[1] % 3;
    o.prefix = prefixes[(data[1] >> 2) % 8];
    mha_tensors *t = NULL;
    if (mha_safetensors_parse(&t, data + 2, size - 2, "fuzz.safetensors", 0) != MHA_OK) {
        if (t || !mha_last_error()[0]) abort();
        return 0;
    }
    mha_layout detected;
    if (mha_layout_detect(&detected, t) != MHA_OK && !mha_last_error()[0]) abort();
    mha_layer *L = NULL;
    mha_status s = mha_layer_from_tensors(&L, t, &o);
    if (s != MHA_OK) {
        if (L || !mha_last_error()[0]) abort();
    } else {
        const mha_config *c = mha_layer_config(L);
        if (!c || c->n_heads < 1 || c->n_kv_heads < 1 || c->n_heads % c->n_kv_heads) abort();
        mha_tensors *n = NULL;
        if (mha_layer_to_tensors(&n, L) == MHA_OK) {
            mha_load_options native = {.layout = MHA_LAYOUT_NATIVE};
            mha_layer *R = NULL;
            if (mha_layer_from_tensors(&R, n, &native) != MHA_OK) abort();
            if (mha_layer_config(R)->n_heads != c->n_heads) abort();
            mha_layer_free(R);
        }
        mha_tensors_free(n);
        mha_layer_free(L);
    }
    mha_tensors_free(t);
    return 0;
}
