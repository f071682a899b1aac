/* threads.c — the thread count of the fast path: the setter's value, or
 * OpenMP's default (OMP_NUM_THREADS) when 0. */
#include <omp.h>

#include <stdlib.h>

#include "compute/decode_gemm.h"
#include "kernels/kernels.h"

static int num_threads; /* 0: OpenMP's default */

void mha_set_num_threads(int n) { num_threads = n > 0 ? n : 0; }

int mha_get_num_threads(void) { return num_threads > 0 ? num_threads : omp_get_max_threads(); }

/* The decode path: its kernel table and its thread counts. */
static int force_scalar_flag;
static const mha_decode_kernels *forced_decode; /* NULL: automatic */
static double min_parallel_work = 262144.0; /* multiply-adds (~30 us) */

void mha_decode_force_scalar(int force) { force_scalar_flag = force; }

void mha_decode_kernels_force(const mha_decode_kernels *k) { forced_decode = k; }

void mha_decode_set_min_parallel_work(double madds) { min_parallel_work = madds; }

int mha_decode_threads_for(double madds) {
    return madds < min_parallel_work ? 1 : mha_decode_threads();
}

/* The same ISA as the fast path's table (MHA_KERNELS included). */
const mha_decode_kernels *mha_decode_kernels_get(void) {
    if (forced_decode) return forced_decode;
    if (!force_scalar_flag && mha_kernels_get() == &mha_kernels_avx512)
        return &mha_decode_kernels_avx512;
    if (!force_scalar_flag && mha_kernels_get() != &mha_kernels_scalar &&
        __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
        __builtin_cpu_supports("f16c"))
        return &mha_decode_kernels_avx2;
    return &mha_decode_kernels_scalar;
}

int mha_decode_threads(void) {
    int n = mha_get_num_threads();
    return n > 0 ? n : omp_get_max_threads();
}

