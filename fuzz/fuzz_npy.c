/* fuzz_npy.c — libFuzzer target for the .npy reader: any byte string must
 * give MHA_OK with a consistent array, or an error status with a message;
 * never a crash, a leak or an out-of-bounds read (built with ASan+UBSan). */
#include <stdlib.h>
#include <string.h>

#include "mha.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    /* a private copy, so reads past the end hit ASan's redzone */
    uint8_t *buf = malloc(size ? size : 1);
    if (!buf) return 0;
    if (size) memcpy(buf, data, size);
    for (unsigned flags = 0; flags <= MHA_IO_ALLOW_NONFINITE; flags += MHA_IO_ALLOW_NONFINITE) {
        mha_array a;
        mha_status s = mha_npy_parse(&a, buf, size, "fuzz.npy", flags);
        if (s == MHA_OK) {
            size_t n = 1;
            for (int i = 0; i < a.rank; i++) n *= (size_t)a.shape[i];
            if (n != a.count || a.rank < 0 || a.rank > MHA_ARRAY_MAX_RANK || (!a.f == !a.u8))
                abort();
            volatile float sink = 0; /* touch every element */
            for (size_t i = 0; i < a.count; i++) sink += a.f ? a.f[i] : (float)a.u8[i];
            (void)sink;
        } else if (!mha_last_error()[0]) {
            abort(); /* every failure explains itself */
        }
        mha_array_free(&a);
    }
    free(buf);
    return 0;
}
