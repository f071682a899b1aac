/* avx512_amx.c — the bf16 projection tile on AMX (TDPBF16PS) and its input
 * packing: the avx512 table's entries for options.bf16_matmul. Built with
 * AMX-TILE / AMX-BF16 as well; called only after mha_cpu_has_amx_bf16()
 * (CPUID, XCR0 bits 17-18, and the kernel's permission for tile data).
 * Legend: K32 the input width rounded up to 32 (one tile's depth in bf16),
 * a "pair panel" (K32/2, 16, 2): 16 columns, row kk holding inputs 2kk and
 * 2kk+1 of each column side by side, as TDPBF16PS reads B. */
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "kernels/kernels.h"

/* LDTILECFG's 64-byte operand (palette 1). */
typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16]; /* bytes per row of tile t */
    uint8_t rows[16];   /* rows of tile t          */
} amx_config;

/* Tiles 0-3: C (16 x 16 fp32); 4-5: A (16 rows x 32 bf16); 6-7: B (16
 * pairs x 16 columns): every one 16 rows of 64 bytes. A constant in
 * memory: GCC 12 drops the stores of a local one before LDTILECFG (it
 * sees the instruction read one byte), and the tiles then fault. */
static const _Alignas(64) amx_config tile_config = {
    .palette = 1,
    .colsb = {64, 64, 64, 64, 64, 64, 64, 64},
    .rows = {16, 16, 16, 16, 16, 16, 16, 16},
};

void mha_amx_begin_avx512(void) { _tile_loadconfig(&tile_config); }

void mha_amx_end_avx512(void) { _tile_release(); }

/* 16 floats -> 16 bf16 bit patterns, to nearest even (base/bf16.h's
 * integer rounding, so every path rounds alike; NaN stays NaN). */
static inline __m256i round16(__m512 x) {
    const __m512i u = _mm512_castps_si512(x);
    const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    const __m512i r = _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), odd);
    return _mm512_cvtepi32_epi16(_mm512_srli_epi32(r, 16));
}

void mha_amx_pack_rows_avx512(uint16_t *out, const float *a, size_t lda, int rows, int rows32, int kn, int k32) {
    for (int i = 0; i < rows32; i++) {
        uint16_t *o = out + (size_t)i * k32;
        if (i >= rows) {
            memset(o, 0, (size_t)k32 * sizeof *o);
            continue;
        }
        const float *r = a + (size_t)i * lda;
        for (int k = 0; k < k32; k += 16) { /* k32 is a multiple of 16; zeros past kn */
            const int live = kn - k >= 16 ? 16 : kn - k > 0 ? kn - k : 0;
            const __m512 x = _mm512_maskz_loadu_ps((__mmask16)((1u << live) - 1u), r + k);
            _mm256_storeu_si256((__m256i *)(o + k), round16(x));
        }
    }
}

void mha_amx_tile_avx512(float *c, size_t ldc, const uint16_t *a, size_t lda, const uint16_t *b0,
                         const uint16_t *b1, const float *bias, int k32, int m, int n) {
    /* c's lines are written at the end: ask for them now, so their misses
     * overlap the products instead of stalling the stores (a 32 x 32 block
     * of a large Y touches 32 rows far apart) */
    for (int i = 0; i < m; i++) {
        __builtin_prefetch(c + (size_t)i * ldc, 1, 3);
        if (n > 16) __builtin_prefetch(c + (size_t)i * ldc + 16, 1, 3);
    }
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    const size_t sa = lda * sizeof(uint16_t);
    for (int k = 0; k < k32; k += 32) {
        _tile_loadd(4, a + k, sa);                     /* rows 0-15, inputs k..k+31  */
        _tile_loadd(5, a + 16 * lda + k, sa);          /* rows 16-31                 */
        _tile_loadd(6, b0 + (size_t)k * 16, 64);       /* pairs k/2..k/2+15, panel 0 */
        _tile_loadd(7, b1 + (size_t)k * 16, 64);       /* panel 1                    */
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
    }
    _Alignas(64) float acc[32 * 32]; /* (32, 32): the four C tiles */
    _tile_stored(0, acc, 128);
    _tile_stored(1, acc + 16, 128);
    _tile_stored(2, acc + 16 * 32, 128);
    _tile_stored(3, acc + 16 * 32 + 16, 128);
    for (int j = 0; j < n; j += 16) {
        const __mmask16 mask = (__mmask16)(n - j >= 16 ? 0xffffu : (1u << (n - j)) - 1u);
        const __m512 bj = bias ? _mm512_maskz_loadu_ps(mask, bias + j) : _mm512_setzero_ps();
        for (int i = 0; i < m; i++)
            _mm512_mask_storeu_ps(c + (size_t)i * ldc + j, mask, _mm512_add_ps(_mm512_load_ps(acc + i * 32 + j), bj));
    }
}
