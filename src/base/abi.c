/* abi.c — the sizes of the public structs as this library was built, so a
 * binding that declares them itself (python/mha/_lib.py's ctypes) can tell
 * a library of another version apart before it passes a struct of the
 * wrong size (mha_options_default would write past the caller's copy). */
#include <string.h>

#include "mha.h"

#define SIZE_OF(type) {#type, sizeof(type)}

size_t mha_struct_size(const char *name) {
    static const struct {
        const char *name;
        size_t size;
    } sizes[] = {
        SIZE_OF(mha_rope),         SIZE_OF(mha_config),      SIZE_OF(mha_weights),       SIZE_OF(mha_intervention),
        SIZE_OF(mha_mask),         SIZE_OF(mha_options),     SIZE_OF(mha_capture),       SIZE_OF(mha_contract_report),
        SIZE_OF(mha_gradients),    SIZE_OF(mha_array),       SIZE_OF(mha_load_options),  SIZE_OF(mha_head_range),
        SIZE_OF(mha_torch_weights), SIZE_OF(mha_cache_info),
    };
    for (size_t i = 0; name && i < sizeof sizes / sizeof sizes[0]; i++)
        if (strcmp(sizes[i].name, name) == 0) return sizes[i].size;
    return 0;
}
