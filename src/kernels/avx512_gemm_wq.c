/* avx512_gemm_wq.c — the AVX-512 decode streams over bf16 and int8
 * weights (decode_kernels.h), for one row or several (a batched decode
 * step): each weight is loaded and widened to fp32 once (bf16: the bits
 * shifted up 16; int8: sign-extended and converted; both exact) and used
 * for up to RB rows of x held in registers, so the weights' bytes are
 * read once however many rows the step has.
 * Per block of 32 weight rows (int8: one scale group), 64 columns, RB
 * rows: RB x 4 accumulators over the block's rows in k order,
 *   bf16: starting from y (the fp32 stream's bits on the widened values);
 *   int8: starting from 0, then y = fma(sum, scale, y).
 * Masked column tails; every element's additions are the scalar table's,
 * so the bits are too. Each tile requests the weights PF_COLS columns
 * ahead, so that memory and arithmetic overlap on a cold matrix.
 * VDPBF16PS / VNNI would round the activations to bf16 / int8
 * (docs/WEIGHTS.md). */
#include <immintrin.h>
#include <stdint.h>

#include "kernels/avx512_micro.h"
#include "kernels/decode_kernels.h"
#include "kernels/kernels.h"

#define ROWS 32 /* weight rows per block: 64 columns of them stay in L1 */
#define RB 4    /* rows of x per register block: 16 accumulators       */
#define NV 4    /* 16-float vectors of columns per register block       */
/* Columns ahead whose lines each tile requests into L1, row by row as it
 * reads its own (past the call's width: the next block of ROWS rows, which
 * for int8 is the next call's; held as an integer address, as it may lie
 * past the matrix, and a prefetch never faults). Without it a
 * cold weight matrix arrived only as loaded, and the step's arithmetic and
 * memory times added up (int8 at 50%, bf16 at 70% of a cold read of the
 * same bytes, one thread); sweeping 4 rows across 512 columns (long
 * contiguous runs) instead of 32-row tiles measured the same, so the
 * request ahead, not the walk's order, is what overlaps them. 4 tiles
 * ahead (8 KiB int8, 16 KiB bf16): 0.70x and 0.78x the time cold
 * (bench/ab/ab_gemv.sh, 2026-12-01); 128 or 448 columns gain the same. */
#define PF_COLS 256

static inline __m512 widen16(const void *w, size_t at, __mmask16 km, int i8) {
    if (i8) return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(km, (const int8_t *)w + at)));
    __m512i u = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(km, (const uint16_t *)w + at));
    return _mm512_castsi512_ps(_mm512_slli_epi32(u, 16));
}

/* y (r, c) [+]= x (r, k) w (k, c), r <= RB rows, c = 16 (nv - 1) +
 * popcount(km) columns, k <= ROWS; int8: y += (x w) * scale (c). r, nv
 * and i8 are constants at every call, so the arrays live in registers.
 * pf: the weights PF_COLS columns ahead, requested row by row. */
static inline __attribute__((always_inline)) void tile(float *y, size_t ldy, const float *x, size_t ldx,
                                                       const void *w, size_t ldw, const float *scale, int k,
                                                       const int r, const int nv, __mmask16 km, const int i8,
                                                       uintptr_t pf) {
    __m512 a[RB][NV];
#pragma GCC unroll 4
    for (int i = 0; i < r; i++)
#pragma GCC unroll 4
        for (int v = 0; v < nv; v++)
            a[i][v] = i8 ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(v == nv - 1 ? km : 0xffff, y + i * ldy + 16 * v);
    for (int kk = 0; kk < k; kk++) {
        __m512 b[NV];
#pragma GCC unroll 4
        for (int v = 0; v < nv; v++) b[v] = widen16(w, kk * ldw + 16 * v, v == nv - 1 ? km : 0xffff, i8);
        _mm_prefetch((const char *)(pf + kk * ldw * (i8 ? 1 : 2)), _MM_HINT_T0);
        if (!i8) _mm_prefetch((const char *)(pf + kk * ldw * 2 + 64), _MM_HINT_T0); /* 64 bf16 columns: two lines */
#pragma GCC unroll 4
        for (int i = 0; i < r; i++) {
            const __m512 xb = _mm512_set1_ps(x[i * ldx + kk]);
#pragma GCC unroll 4
            for (int v = 0; v < nv; v++) a[i][v] = _mm512_fmadd_ps(xb, b[v], a[i][v]);
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < r; i++)
#pragma GCC unroll 4
        for (int v = 0; v < nv; v++) {
            const __mmask16 mv = v == nv - 1 ? km : 0xffff;
            float *yv = y + i * ldy + 16 * v;
            const __m512 s = i8 ? _mm512_fmadd_ps(a[i][v], _mm512_maskz_loadu_ps(mv, scale + 16 * v),
                                                  _mm512_maskz_loadu_ps(mv, yv))
                                : a[i][v];
            _mm512_mask_storeu_ps(yv, mv, s);
        }
}

/* One register block of r rows at columns j: 64 columns (nv 4) or a
 * masked tail of up to 16 (nv 1). */
static inline __attribute__((always_inline)) void block(float *y, size_t ldy, const float *x, size_t ldx,
                                                        const void *w, size_t ldw, const float *scale, int k,
                                                        int r, int nv, __mmask16 km, const int i8, uintptr_t pf) {
    switch (r * 8 + nv) {
    case 8 + 4: tile(y, ldy, x, ldx, w, ldw, scale, k, 1, 4, km, i8, pf); break;
    case 16 + 4: tile(y, ldy, x, ldx, w, ldw, scale, k, 2, 4, km, i8, pf); break;
    case 24 + 4: tile(y, ldy, x, ldx, w, ldw, scale, k, 3, 4, km, i8, pf); break;
    case 32 + 4: tile(y, ldy, x, ldx, w, ldw, scale, k, 4, 4, km, i8, pf); break;
    case 8 + 1: tile(y, ldy, x, ldx, w, ldw, scale, k, 1, 1, km, i8, pf); break;
    case 16 + 1: tile(y, ldy, x, ldx, w, ldw, scale, k, 2, 1, km, i8, pf); break;
    case 24 + 1: tile(y, ldy, x, ldx, w, ldw, scale, k, 3, 1, km, i8, pf); break;
    default: tile(y, ldy, x, ldx, w, ldw, scale, k, 4, 1, km, i8, pf); break;
    }
}

/* y (m, n) += x (m, k) w (k, n) (int8: times scale, k <= 32): per block
 * of weight rows and 64 columns, every block of RB rows, so the block's
 * weights (4 KiB bf16) come from memory once and from L1 after. */
static inline __attribute__((always_inline)) void stream(float *y, int ldy, const float *x, int ldx, const void *w,
                                                         int ldw, const float *scale, int m, int k, int n,
                                                         const int i8) {
    const size_t esz = i8 ? 1 : 2;
    for (int k0 = 0; k0 < k; k0 += ROWS) {
        const int kn = k - k0 < ROWS ? k - k0 : ROWS;
        const char *wk = (const char *)w + (size_t)k0 * ldw * esz;
        for (int j = 0; j < n;) {
            const int nv = n - j >= 64 ? 4 : 1, c = nv == 4 ? 64 : n - j < 16 ? n - j : 16;
            const __mmask16 km = mha_mask16(c - 16 * (nv - 1));
            const int ja = j + PF_COLS; /* past n: the next row block's first columns */
            const uintptr_t pf = (uintptr_t)wk + (ja < n ? (size_t)ja : (size_t)ROWS * ldw + ja - n) * esz;
            for (int i = 0; i < m; i += RB)
                block(y + (size_t)i * ldy + j, (size_t)ldy, x + (size_t)i * ldx + k0, (size_t)ldx, wk + j * esz,
                      (size_t)ldw, scale ? scale + j : NULL, kn, m - i < RB ? m - i : RB, nv, km, i8, pf);
            j += c;
        }
    }
}

/* The one-row sweep (m = 1, on AMD Zen: mha_cpu_row_sweep): one weight
 * row at a time across all n columns, so the weights are read in address
 * order, one stream (a task's rows are contiguous). The 32-row tiles read
 * 32 rows at once (32 streams at the row stride), which Zen 5 fetches
 * cold at about half the rate of one stream even with the request ahead;
 * an Intel Xeon fetches them with the request ahead faster than the
 * sweep (bench/LIMITS.md, round 17), and keeps the tiles. Each y element
 * gets the tiles' additions in the same order:
 *   bf16: y = fma(x_k, w_k, y) for k in order;
 *   int8: s = 0, s = fma(x_k, w_k, s) over the call's rows (one scale
 *   group), then y = fma(s, scale, y); s is SW columns at a time. */
#define SW 4096 /* int8 group sums on the stack: 16 KiB */

/* y (c) [+]= x w (k, c) at columns j.. (i8: into s, from 0 at row 0); full
 * vectors unmasked (a masked store that a later masked load reads back is
 * slow on Zen) and in 256-bit halves where the CPU splits 512-bit
 * operations (mha_fma_into_avx512), the tail masked. */
static inline __attribute__((always_inline)) void sweep_row(float *y, __m512 xb, const void *wk, int n, const int i8,
                                                            int first, const int halves) {
    int j = 0;
    for (; j + 16 <= n; j += 16) mha_fma_into_avx512(y + j, xb, widen16(wk, j, 0xffff, i8), first, halves);
    if (j < n) {
        const __mmask16 km = mha_mask16(n - j);
        const __m512 a = first ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(km, y + j);
        _mm512_mask_storeu_ps(y + j, km, _mm512_fmadd_ps(xb, widen16(wk, j, km, i8), a));
    }
}

static inline __attribute__((always_inline)) void sweep_bf16(float *y, const float *x, const uint16_t *w, int ldw,
                                                             int k, int n, const int halves) {
    for (int kk = 0; kk < k; kk++) sweep_row(y, _mm512_set1_ps(x[kk]), w + (size_t)kk * ldw, n, 0, 0, halves);
}

static inline __attribute__((always_inline)) void sweep_i8(float *y, const float *x, const int8_t *w, int ldw,
                                                           const float *scale, int k, int n, const int halves) {
    float s[SW]; /* (c) group sums of the columns j0.. */
    for (int j0 = 0; j0 < n; j0 += SW) {
        const int c = n - j0 < SW ? n - j0 : SW;
        sweep_row(s, _mm512_set1_ps(x[0]), w + j0, c, 1, 1, halves);
        for (int kk = 1; kk < k; kk++) sweep_row(s, _mm512_set1_ps(x[kk]), w + (size_t)kk * ldw + j0, c, 1, 0, halves);
        int j = 0;
        for (; j + 16 <= c; j += 16)
            _mm512_storeu_ps(y + j0 + j, _mm512_fmadd_ps(_mm512_loadu_ps(s + j), _mm512_loadu_ps(scale + j0 + j),
                                                         _mm512_loadu_ps(y + j0 + j)));
        if (j < c) {
            const __mmask16 km = mha_mask16(c - j);
            float *yj = y + j0 + j;
            _mm512_mask_storeu_ps(yj, km, _mm512_fmadd_ps(_mm512_maskz_loadu_ps(km, s + j),
                                                          _mm512_maskz_loadu_ps(km, scale + j0 + j),
                                                          _mm512_maskz_loadu_ps(km, yj)));
        }
    }
}

void mha_gemm_stream_bf16_avx512(float *y, int ldy, const float *x, int ldx, const uint16_t *w, int ldw, int m,
                                 int k, int n) {
    const int sweep = m == 1 && mha_cpu_row_sweep();
    if (sweep && mha_cpu_halves_512()) sweep_bf16(y, x, w, ldw, k, n, 1);
    else if (sweep) sweep_bf16(y, x, w, ldw, k, n, 0);
    else stream(y, ldy, x, ldx, w, ldw, NULL, m, k, n, 0);
}

void mha_gemm_stream_i8_avx512(float *y, int ldy, const float *x, int ldx, const int8_t *w, int ldw,
                               const float *scale, int m, int k, int n) {
    const int sweep = m == 1 && k > 0 && mha_cpu_row_sweep();
    if (sweep && mha_cpu_halves_512()) sweep_i8(y, x, w, ldw, scale, k, n, 1);
    else if (sweep) sweep_i8(y, x, w, ldw, scale, k, n, 0);
    else stream(y, ldy, x, ldx, w, ldw, scale, m, k, n, 1);
}
