/* avx2_pack.c — the GEMM driver's data movement on AVX2: packing input
 * rows into 6-row micro-panels (pack_a6; the attention's scaled queries
 * the same way: attn_pack_q) and the transposed store of K^T destinations
 * and (out, in) weights (store_t16), all on 8x8 transposes in registers.
 * Without them the driver's element loops ran: 4.6% of a whole `mha run`
 * process on the P1 checkpoint on a Zen 3 (perf; the packing 55% of that,
 * the K^T scatter 27%). The same bytes as the loops. */
#include <immintrin.h>
#include <string.h>

#include "kernels/kernels.h"
#include "kernels/avx2_micro.h"

/* r[i] (8 rows of 8) -> r[j] = column j: pairs of rows interleaved, then
 * quads, then the 128-bit lanes exchanged (24 shuffles). */
static inline __attribute__((always_inline)) void transpose8(__m256 r[8]) {
    __m256 t[8], u[8];
#pragma GCC unroll 8
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);     /* columns 0 1 | 4 5 of rows i, i+1 */
        t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]); /* columns 2 3 | 6 7 */
    }
#pragma GCC unroll 8
    for (int q = 0; q < 8; q += 4) { /* u[q + c]: column c | c + 4 of rows q .. q+3 */
        u[q] = _mm256_shuffle_ps(t[q], t[q + 2], 0x44);
        u[q + 1] = _mm256_shuffle_ps(t[q], t[q + 2], 0xee);
        u[q + 2] = _mm256_shuffle_ps(t[q + 1], t[q + 3], 0x44);
        u[q + 3] = _mm256_shuffle_ps(t[q + 1], t[q + 3], 0xee);
    }
#pragma GCC unroll 8
    for (int c = 0; c < 4; c++) {
        r[c] = _mm256_permute2f128_ps(u[c], u[4 + c], 0x20);
        r[c + 4] = _mm256_permute2f128_ps(u[c], u[4 + c], 0x31);
    }
}

/* r[i] = the lanes `cols` of row i at p + i*stride for i < rows, zeros
 * below (masked-out lanes are not read). */
static inline __attribute__((always_inline)) void load_rows8(__m256 r[8], const float *p, size_t stride, int rows,
                                                             __m256i cols) {
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) r[i] = i < rows ? _mm256_maskload_ps(p + (size_t)i * stride, cols) : _mm256_setzero_ps();
}

/* The first 6 floats of v at p (4 + 2): nothing past p + 6 is written. */
static inline void store6(float *p, __m256 v) {
    _mm_storeu_ps(p, _mm256_castps256_ps128(v));
    _mm_storel_pi((__m64 *)(p + 4), _mm256_extractf128_ps(v, 1));
}

/* rows (<= 6) rows of a (row stride lda) -> out (kn, 6), times scale when
 * scaled (one fp32 product per element), rows past `rows` zero. 8 k per
 * step: the rows (two zero ones added) transposed, then each k's 6 floats
 * stored as 8 that the next k's store overwrites; the last k of a step
 * stores 4 + 2, so nothing past out's kn * 6 is written. */
static inline __attribute__((always_inline)) void pack6(float *out, const float *a, size_t lda, int rows, int kn,
                                                        float scale, const int scaled) {
    const __m256 vs = _mm256_set1_ps(scale);
    for (int k = 0; k < kn; k += 8) {
        const int live = kn - k < 8 ? kn - k : 8;
        __m256 r[8];
        load_rows8(r, a + k, lda, rows, mha_lanes_below_avx2(live));
#pragma GCC unroll 8
        for (int i = 0; i < 8; i++)
            if (scaled && i < rows) r[i] = _mm256_mul_ps(vs, r[i]);
        transpose8(r);
        float *o = out + (size_t)k * MHA_MR;
        if (live == 8) { /* constant indices: r stays in registers */
#pragma GCC unroll 8
            for (int j = 0; j < 7; j++) _mm256_storeu_ps(o + (size_t)j * MHA_MR, r[j]);
            store6(o + 7 * MHA_MR, r[7]);
            continue;
        }
        for (int j = 0; j + 1 < live; j++) _mm256_storeu_ps(o + (size_t)j * MHA_MR, r[j]);
        store6(o + (size_t)(live - 1) * MHA_MR, r[live - 1]);
    }
}

void mha_pack_a6_avx2(float *out, const float *a, size_t lda, int rows, int kn) {
    pack6(out, a, lda, rows, kn, 1.0f, 0);
}

/* The attention's query packing (kernels.h: attn_pack_q): each group of 6
 * rows packed as pack_a6 packs them, times scale; the scalar loop did 6
 * strided stores per dim (0.5% of a P1 forward on the Zen 3). */
void mha_attn_pack_q_avx2(float *dst, const float *src, size_t src_rs, float scale, int rows, int rows6,
                          int d_k) {
    for (int g = 0; g < rows6 / MHA_MR; g++) {
        const int live = rows - MHA_MR * g;
        pack6(dst + (size_t)g * d_k * MHA_MR, src + (size_t)g * MHA_MR * src_rs, src_rs,
              live < 0 ? 0 : live < MHA_MR ? live : MHA_MR, d_k, scale, 1);
    }
}

/* dst[coff[j] + i] = src[i * lds + j], i < rows <= 16, j < n <= 16: four
 * 8x8 blocks, each loaded (masked to n), transposed in registers and
 * stored one column per vector (masked to rows). */
void mha_store_t16_avx2(float *dst, const size_t *coff, const float *src, size_t lds, int rows, int n) {
    for (int i0 = 0; i0 < rows; i0 += 8) {
        const int ni = rows - i0 < 8 ? rows - i0 : 8;
        const __m256i mi = mha_lanes_below_avx2(ni);
        for (int j0 = 0; j0 < n; j0 += 8) {
            const int nj = n - j0 < 8 ? n - j0 : 8;
            __m256 r[8];
            load_rows8(r, src + (size_t)i0 * lds + j0, lds, ni, mha_lanes_below_avx2(nj));
            transpose8(r);
            if (ni == 8 && nj == 8) { /* constant indices: r stays in registers */
#pragma GCC unroll 8
                for (int j = 0; j < 8; j++) _mm256_storeu_ps(dst + coff[j0 + j] + i0, r[j]);
                continue;
            }
            for (int j = 0; j < nj; j++) {
                float *d = dst + coff[j0 + j] + i0;
                if (ni == 8) _mm256_storeu_ps(d, r[j]);
                else _mm256_maskstore_ps(d, mi, r[j]);
            }
        }
    }
}

/* backward_kernels.h's pack_panels: rows [0, n) of src (width d, stride
 * ld) into panels of 16 rows transposed, (ceil(n/16), d, 16), the last
 * panel's missing rows 0. 16 x 16 blocks through store_t16. The backward's
 * dX = dQ W^T packs W^T this way for every row block (scalar: 7% of the
 * P1 input gradients' time on a Zen 3). */
void mha_bwd_pack_panels_avx2(float *dst, const float *src, size_t ld, int n, int d) {
    size_t coff[16];
    for (int j = 0; j < 16; j++) coff[j] = (size_t)j * 16;
    for (int p = 0; p < n; p += 16) {
        float *panel = dst + (size_t)p * d;
        const int rows = n - p < 16 ? n - p : 16;
        if (rows < 16) memset(panel, 0, sizeof(float) * 16 * (size_t)d);
        for (int e0 = 0; e0 < d; e0 += 16)
            mha_store_t16_avx2(panel + (size_t)e0 * 16, coff, src + (size_t)p * ld + e0, ld, rows,
                               d - e0 < 16 ? d - e0 : 16);
    }
}
