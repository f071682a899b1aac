/* dispatch.c — picks the kernel table once: avx2 when CPUID reports
 * AVX2 and FMA (and the OS saves ymm state), scalar otherwise.
 * MHA_KERNELS=scalar|avx2 in the environment overrides the choice. */
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"

const mha_kernels mha_kernels_avx2 = {
    "avx2", mha_sgemm_avx2_6x16, mha_attn_scores_avx2, mha_attn_softmax_avx2,
    mha_attn_pv_avx2, mha_vexp_avx2,
};

static const mha_kernels *forced;

int mha_cpu_has_avx2(void) {
#if defined(__x86_64__) || defined(__i386__)
    /* gcc's cpu model checks OSXSAVE/XGETBV before reporting AVX features */
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
    return 0;
#endif
}

const mha_kernels *mha_kernels_get(void) {
    if (forced) return forced;
    static const mha_kernels *chosen; /* a benign race: every thread computes the same */
    if (!chosen) {
        const char *env = getenv("MHA_KERNELS");
        int avx2 = mha_cpu_has_avx2();
        if (env && strcmp(env, "scalar") == 0) avx2 = 0;
        chosen = avx2 ? &mha_kernels_avx2 : &mha_kernels_scalar;
    }
    return chosen;
}

void mha_kernels_force(const mha_kernels *k) {
    forced = (k == &mha_kernels_avx2 && !mha_cpu_has_avx2()) ? &mha_kernels_scalar : k;
}
