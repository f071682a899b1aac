/* machine_amx.c — AMX-BF16 throughput (TDPBF16PS), the ceiling of the
 * bf16 projections (options.bf16_matmul) on a CPU that has AMX: four
 * independent 16x16 fp32 accumulator tiles fed by two A and two B tiles
 * loaded once, as the library's 32x32 tile runs them (configured by its
 * amx_begin). Built with -mamx-tile -mamx-bf16; run only after
 * mha_cpu_has_amx_bf16() (CPUID, XCR0 and the kernel's permission, which
 * that call asks for). */
#include <immintrin.h>
#include <stdint.h>

#include "bench.h"
#include "kernels/kernels.h"

static float amx_chains(long iters) {
    static _Alignas(64) uint16_t ones[16 * 32]; /* bf16 tiles of small values */
    for (int i = 0; i < 16 * 32; i++) ones[i] = 0x3c00; /* 2^-7 */
    mha_kernels_avx512.amx_begin(); /* the library's tile configuration */
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    _tile_loadd(4, ones, 64);
    _tile_loadd(5, ones, 64);
    _tile_loadd(6, ones, 64);
    _tile_loadd(7, ones, 64);
    for (long i = 0; i < iters; i++) {
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
    }
    _Alignas(64) float out[16 * 16];
    _tile_stored(0, out, 64);
    mha_kernels_avx512.amx_end();
    return out[0];
}

double bench_amx_peak_bf16(int threads, long iters, int reps, double *median_out) {
    if (median_out) *median_out = 0.0;
    if (!mha_cpu_has_amx_bf16()) return 0.0;
    /* 4 tiles x 16 x 16 outputs x 32 products x 2 flops per iteration */
    return bench_fma_rate(amx_chains, 4.0 * 16 * 16 * 32 * 2, threads, iters, reps, median_out);
}
