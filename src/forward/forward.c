/* forward.c — one forward pass: validate the request once (core/options.c),
 * then run the reference or the fast path (project -> attend -> intervene -> concat ->
 * project out). Legend: B, T, S, h, d_model, d_kv_in (see mha.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "forward/forward.h"

/* MHA_KERNELS in the environment: "reference" forces the oracle under
 * AUTO; "scalar", "avx2" and "avx512" choose the fast path's kernels
 * (dispatch.c; avx512 where the CPU lacks it is an error).
 * Any other value is refused, so a typo does not silently run another path.
 * Sets *reference; returns MHA_E_ARG for an unknown value. */
static mha_status env_kernels(int *reference) {
    const char *e = getenv("MHA_KERNELS");
    *reference = e && strcmp(e, "reference") == 0;
    if (e && *e && !*reference && strcmp(e, "scalar") != 0 && strcmp(e, "avx2") != 0 &&
        strcmp(e, "avx512") != 0)
        return mha_fail(MHA_E_ARG, "MHA_KERNELS=%s in the environment; expected reference, scalar, avx2 or avx512 (or unset)", e);
    if (e && strcmp(e, "avx512") == 0 && !mha_cpu_has_avx512())
        return mha_fail(MHA_E_UNSUPPORTED, "MHA_KERNELS=avx512 in the environment, but this CPU or OS cannot run AVX-512 (needs AVX-512 F/BW/VL/DQ and zmm state enabled by the OS); expected avx2, scalar or reference");
    return MHA_OK;
}

mha_status mha_forward_kv(const mha_layer *L, float *y, const mha_capture *cap, const float *x,
                          const float *k_src, const float *v_src, int B, int T, int S,
                          const mha_options *opt) {
    mha_options defaults = mha_options_default();
    if (!opt) opt = &defaults;
    if (!k_src) k_src = x;
    if (!v_src) v_src = k_src;
    int env_reference = 0;
    mha_status s = mha_forward_validate(L, y, x, k_src, v_src, B, T, S, opt);
    if (s || (s = env_kernels(&env_reference))) return s;
    mha_clear_error();
    if (opt->path == MHA_PATH_REFERENCE || (opt->path == MHA_PATH_AUTO && env_reference))
        return mha_forward_reference(L, y, cap, x, k_src, v_src, B, T, S, opt);
    s = mha_forward_fast(L, y, cap, x, k_src, v_src, B, T, S, opt);
    if (s == MHA_E_UNSUPPORTED && opt->path == MHA_PATH_AUTO) {
        mha_clear_error();
        return mha_forward_reference(L, y, cap, x, k_src, v_src, B, T, S, opt);
    }
    return s;
}

mha_status mha_forward(const mha_layer *L, float *y, const mha_capture *cap, const float *x,
                       const float *kv, int B, int T, int S, const mha_options *opt) {
    return mha_forward_kv(L, y, cap, x, kv, kv, B, T, S, opt);
}
