/* dispatch.c — picks the kernel table once: avx512 when CPUID and XCR0
 * allow it (cpu_avx512.c), else avx2 when CPUID reports AVX2 and FMA (and
 * the OS saves ymm state), scalar otherwise.
 * MHA_KERNELS=scalar|avx2|avx512 in the environment overrides the choice. */
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"

const mha_kernels mha_kernels_avx2 = {
    "avx2", mha_sgemm_avx2_6x16, mha_attn_scores_avx2, mha_attn_softmax_avx2,
    mha_attn_pv_avx2, mha_vexp_avx2, 6, 1, NULL, /* the driver tiles with sgemm_6x16 */
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
        int avx2 = mha_cpu_has_avx2(), avx512 = mha_cpu_has_avx512();
        if (env && strcmp(env, "scalar") == 0) avx2 = avx512 = 0;
        if (env && strcmp(env, "avx2") == 0) avx512 = 0;
        chosen = avx512 ? &mha_kernels_avx512 : avx2 ? &mha_kernels_avx2 : &mha_kernels_scalar;
    }
    return chosen;
}

void mha_kernels_force(const mha_kernels *k) {
    forced = (k == &mha_kernels_avx2 && !mha_cpu_has_avx2()) ? &mha_kernels_scalar : k;
    if (k == &mha_kernels_avx512 && !mha_cpu_has_avx512())
        forced = mha_cpu_has_avx2() ? &mha_kernels_avx2 : &mha_kernels_scalar;
}
