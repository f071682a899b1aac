/* forward_fast.c — placeholder until the fast path lands: reports
 * MHA_E_UNSUPPORTED so that MHA_PATH_AUTO falls back to the reference. */
#include "internal.h"

mha_status mha_forward_fast(const mha_layer *L, float *y, const mha_capture *cap, const float *x,
                            const float *kv, int B, int T, int S, const mha_options *opt) {
    (void)L, (void)y, (void)cap, (void)x, (void)kv, (void)B, (void)T, (void)S, (void)opt;
    return mha_fail(MHA_E_UNSUPPORTED, "the fast path is not built; use MHA_PATH_REFERENCE");
}

mha_status mha_fast_prepare(mha_layer *L) {
    (void)L;
    return MHA_OK;
}

void mha_fast_release(mha_layer *L) { (void)L; }
