/* avx2_gemm_wq.c — the decode weight streams over bf16 and int8 weights
 * (decode_kernels.h) with AVX2 + FMA, and on AMD Zen the fp32 stream's
 * sweep too (below), for one row or several (a batched decode step):
 * each weight is loaded and widened to fp32 once (bf16: the
 * bits shifted up 16; int8: sign-extended and converted; both exact) and
 * used for up to RB rows of x held in registers, so the weights' bytes
 * are read once however many rows the step has.
 * Per block of 32 weight rows (int8: one scale group), 16 columns, RB
 * rows: RB x 2 accumulators over the block's rows in k order,
 *   bf16: starting from y (the fp32 stream's bits on the widened values);
 *   int8: starting from 0, then y = fma(sum, scale, y).
 * Column tails of < 8 use fmaf in the lanes' order, so every table gives
 * the scalar table's bits. */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>

#include "base/bf16.h"
#include "kernels/decode_kernels.h"
#include "kernels/kernels.h"

#define ROWS 32 /* weight rows per block: 16 columns of them stay in L1 */
#define RB 4    /* rows of x per register block: 8 accumulators        */
#define NV 2    /* 8-float vectors of columns per register block        */
/* Columns ahead whose lines a tile starting a line requests into L1, row
 * by row (past the call's width: the next block of ROWS rows; a prefetch
 * never faults), as in avx512_gemm_wq.c: memory and arithmetic overlap
 * on a cold matrix (0.88-0.91x the time cold, bench/ab/ab_gemv.sh). */
#define PF_COLS 256

static inline __m256 widen8(const void *w, size_t at, int i8) {
    if (i8) return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)((const int8_t *)w + at))));
    __m256i u = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const uint16_t *)w + at)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(u, 16));
}

static inline float widen1(const void *w, size_t at, int i8) {
    return i8 ? (float)((const int8_t *)w)[at] : mha_bf16_bits_to_float(((const uint16_t *)w)[at]);
}

/* y (r, 8 nv) [+]= x (r, k) w (k, 8 nv), r <= RB, k <= ROWS; int8:
 * y += (x w) * scale. r, nv and i8 are constants at every call. pf: NULL,
 * or the weights PF_COLS columns ahead, one line requested per row. */
static inline __attribute__((always_inline)) void tile(float *y, size_t ldy, const float *x, size_t ldx,
                                                       const void *w, size_t ldw, const float *scale, int k,
                                                       const int r, const int nv, const int i8, uintptr_t pf) {
    __m256 a[RB][NV];
#pragma GCC unroll 4
    for (int i = 0; i < r; i++)
#pragma GCC unroll 2
        for (int v = 0; v < nv; v++) a[i][v] = i8 ? _mm256_setzero_ps() : _mm256_loadu_ps(y + i * ldy + 8 * v);
    for (int kk = 0; kk < k; kk++) {
        __m256 b[NV];
#pragma GCC unroll 2
        for (int v = 0; v < nv; v++) b[v] = widen8(w, kk * ldw + 8 * v, i8);
        if (pf) _mm_prefetch((const char *)(pf + kk * ldw * (i8 ? 1 : 2)), _MM_HINT_T0);
#pragma GCC unroll 4
        for (int i = 0; i < r; i++) {
            const __m256 xb = _mm256_set1_ps(x[i * ldx + kk]);
#pragma GCC unroll 2
            for (int v = 0; v < nv; v++) a[i][v] = _mm256_fmadd_ps(xb, b[v], a[i][v]);
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < r; i++)
#pragma GCC unroll 2
        for (int v = 0; v < nv; v++) {
            float *yv = y + i * ldy + 8 * v;
            _mm256_storeu_ps(yv, i8 ? _mm256_fmadd_ps(a[i][v], _mm256_loadu_ps(scale + 8 * v), _mm256_loadu_ps(yv))
                                    : a[i][v]);
        }
}

static inline __attribute__((always_inline)) void block(float *y, size_t ldy, const float *x, size_t ldx,
                                                        const void *w, size_t ldw, const float *scale, int k,
                                                        int r, int nv, const int i8, uintptr_t pf) {
    switch (r * 4 + nv) {
    case 4 + 2: tile(y, ldy, x, ldx, w, ldw, scale, k, 1, 2, i8, pf); break;
    case 8 + 2: tile(y, ldy, x, ldx, w, ldw, scale, k, 2, 2, i8, pf); break;
    case 12 + 2: tile(y, ldy, x, ldx, w, ldw, scale, k, 3, 2, i8, pf); break;
    case 16 + 2: tile(y, ldy, x, ldx, w, ldw, scale, k, 4, 2, i8, pf); break;
    case 4 + 1: tile(y, ldy, x, ldx, w, ldw, scale, k, 1, 1, i8, pf); break;
    case 8 + 1: tile(y, ldy, x, ldx, w, ldw, scale, k, 2, 1, i8, pf); break;
    case 12 + 1: tile(y, ldy, x, ldx, w, ldw, scale, k, 3, 1, i8, pf); break;
    default: tile(y, ldy, x, ldx, w, ldw, scale, k, 4, 1, i8, pf); break;
    }
}

/* y (m, n) += x (m, k) w (k, n) (int8: times scale, k <= 32): per block
 * of weight rows and 16 columns, every block of RB rows (the block's
 * weights from memory once, from L1 after); columns past the last 8 one
 * at a time with fmaf. */
static inline __attribute__((always_inline)) void stream(float *y, int ldy, const float *x, int ldx, const void *w,
                                                         int ldw, const float *scale, int m, int k, int n,
                                                         const int i8) {
    const size_t esz = i8 ? 1 : 2;
    for (int k0 = 0; k0 < k; k0 += ROWS) {
        const int kn = k - k0 < ROWS ? k - k0 : ROWS;
        const char *wk = (const char *)w + (size_t)k0 * ldw * esz;
        const float *xk = x + k0;
        int j = 0;
        for (; j + 8 <= n; j += n - j >= 16 ? 16 : 8) {
            const int ja = j + PF_COLS; /* past n: the next row block's first columns */
            const uintptr_t pf =
                (j * esz) % 64 ? 0 : (uintptr_t)wk + (ja < n ? (size_t)ja : (size_t)ROWS * ldw + ja - n) * esz;
            for (int i = 0; i < m; i += RB)
                block(y + (size_t)i * ldy + j, (size_t)ldy, xk + (size_t)i * ldx, (size_t)ldx, wk + j * esz,
                      (size_t)ldw, scale ? scale + j : NULL, kn, m - i < RB ? m - i : RB, n - j >= 16 ? 2 : 1, i8,
                      pf);
        }
        for (; j < n; j++)
            for (int i = 0; i < m; i++) {
                float a = i8 ? 0.0f : y[(size_t)i * ldy + j];
                for (int kk = 0; kk < kn; kk++)
                    a = fmaf(xk[(size_t)i * ldx + kk], widen1(wk, (size_t)kk * ldw + j, i8), a);
                y[(size_t)i * ldy + j] = i8 ? fmaf(a, scale[j], y[(size_t)i * ldy + j]) : a;
            }
    }
}

/* The sweep (AMD Zen, mha_cpu_row_sweep; m <= SM rows of x), for fp32,
 * bf16 and int8 weights (kind 0, 1, 2; the fp32 one serves the AVX2
 * table's gemm_stream, avx2_decode.c): the weight rows in address order
 * across all n columns, sr rows per pass (sr streams at the row stride,
 * each read in order), each weight vector widened once for the m rows, in
 * the tiles' order of additions: per element, a = fma(x_k, w_k, a) for k
 * in order (int8: the group sums s from 0, at most SWF / m columns at a
 * time, then y = fma(s, scale, y)); tails with fmaf. A pass loads and
 * stores y once for sr rows' weights: 4 rows for one or two rows of x, 2
 * for three or four (their broadcasts stay in 8 registers). One weight row
 * per pass, the round-30 form, took 1.3-1.5x the time (bench/LIMITS.md
 * round 31). */
#define SWF 8192 /* int8 group sums on the stack: 32 KiB for all rows */
#define SM 4     /* rows of x the fp32 sweep takes; more run the tiles */
#define SM_WQ 2  /* bf16 / int8: with three rows the sweep and the tiles
                  * took the same time, with four int8 1.16x the tiles' */

static inline __attribute__((always_inline)) __m256 sweep_load8(const void *w, size_t at, const int kind) {
    return kind == 0 ? _mm256_loadu_ps((const float *)w + at) : widen8(w, at, kind == 2);
}

static inline __attribute__((always_inline)) float sweep_load1(const void *w, size_t at, const int kind) {
    return kind == 0 ? ((const float *)w)[at] : widen1(w, at, kind == 2);
}

/* y (nx, n) [+]= x (nx, nr) w (nr, n), the nr weight rows at wk, in r order
 * (first: from 0); the next pass (pf rows on) requested meanwhile, a line
 * per row per 64 bytes; nr, pf, nx and kind constants at every call. */
static inline __attribute__((always_inline)) void sweep_rows(float *y, size_t ldy, const float *x, size_t ldx,
                                                             const void *wk, size_t ldw, int n, const int kind,
                                                             int first, const int nr, const int pf, const int nx) {
    const size_t esz = kind == 0 ? 4 : kind == 1 ? 2 : 1;
    __m256 xb[SM][4]; /* in registers: broadcast in the loop, they cost int8 1.1-1.2x */
#pragma GCC unroll 4
    for (int i = 0; i < nx; i++)
#pragma GCC unroll 4
        for (int r = 0; r < nr; r++) xb[i][r] = _mm256_set1_ps(x[i * ldx + r]);
    int j = 0;
    for (; j + 8 <= n; j += 8) {
        if (pf && (j * esz) % 64 == 0)
#pragma GCC unroll 4
            for (int r = 0; r < pf; r++) _mm_prefetch((const char *)wk + ((pf + r) * ldw + j) * esz, _MM_HINT_T0);
        __m256 wv[4];
#pragma GCC unroll 4
        for (int r = 0; r < nr; r++) wv[r] = sweep_load8(wk, r * ldw + j, kind);
#pragma GCC unroll 4
        for (int i = 0; i < nx; i++) {
            float *yi = y + i * ldy + j;
            __m256 a = first ? _mm256_setzero_ps() : _mm256_loadu_ps(yi);
#pragma GCC unroll 4
            for (int r = 0; r < nr; r++) a = _mm256_fmadd_ps(xb[i][r], wv[r], a);
            _mm256_storeu_ps(yi, a);
        }
    }
    for (; j < n; j++)
        for (int i = 0; i < nx; i++) {
            float a = first ? 0.0f : y[i * ldy + j];
            for (int r = 0; r < nr; r++) a = fmaf(x[i * ldx + r], sweep_load1(wk, r * ldw + j, kind), a);
            y[i * ldy + j] = a;
        }
}

/* y (nx, n) [+]= x (nx, k) w (k, n), sr rows a pass, the last < sr one at
 * a time */
static inline __attribute__((always_inline)) void sweep(float *y, size_t ldy, const float *x, size_t ldx,
                                                        const void *w, int ldw, int k, int n, const int kind,
                                                        int first, const int nx) {
    const size_t esz = kind == 0 ? 4 : kind == 1 ? 2 : 1;
    const int sr = nx <= 2 ? 4 : 2;
    int kk = 0;
    for (; kk + sr <= k; kk += sr, first = 0)
        sweep_rows(y, ldy, x + kk, ldx, (const char *)w + kk * (size_t)ldw * esz, (size_t)ldw, n, kind, first, sr,
                   sr, nx);
    for (; kk < k; kk++, first = 0)
        sweep_rows(y, ldy, x + kk, ldx, (const char *)w + kk * (size_t)ldw * esz, (size_t)ldw, n, kind, first, 1, 0,
                   nx);
}

static inline __attribute__((always_inline)) void sweep_i8(float *y, int ldy, const float *x, int ldx,
                                                           const int8_t *w, int ldw, const float *scale, int k, int n,
                                                           const int nx) {
    float s[SWF]; /* (nx, cw) group sums of the columns j0.. */
    const int cw = SWF / nx / 8 * 8;
    for (int j0 = 0; j0 < n; j0 += cw) {
        const int c = n - j0 < cw ? n - j0 : cw;
        sweep(s, (size_t)cw, x, (size_t)ldx, w + j0, ldw, k, c, 2, 1, nx);
        for (int i = 0; i < nx; i++) {
            float *yi = y + (size_t)i * ldy + j0;
            const float *si = s + (size_t)i * cw;
            int j = 0;
            for (; j + 8 <= c; j += 8)
                _mm256_storeu_ps(yi + j, _mm256_fmadd_ps(_mm256_loadu_ps(si + j), _mm256_loadu_ps(scale + j0 + j),
                                                         _mm256_loadu_ps(yi + j)));
            for (; j < c; j++) yi[j] = fmaf(si[j], scale[j0 + j], yi[j]);
        }
    }
}

/* The sweep of call(nx) for 1 <= m <= SM rows (a constant in each copy). */
#define SWEEP_ROWS(call)                                                                                              \
    switch (m) {                                                                                                      \
    case 1: call(1); break;                                                                                           \
    case 2: call(2); break;                                                                                           \
    case 3: call(3); break;                                                                                           \
    case 4: call(4); break;                                                                                           \
    default: break; /* the callers' checks keep m in 1..SM */                                                         \
    }

void mha_gemm_sweep_f32_avx2(float *y, int ldy, const float *x, int ldx, const float *w, int ldw, int m, int k,
                             int n) {
#define F32(nx) sweep(y, (size_t)ldy, x, (size_t)ldx, w, ldw, k, n, 0, 0, nx)
    SWEEP_ROWS(F32)
#undef F32
}

void mha_gemm_stream_bf16_avx2(float *y, int ldy, const float *x, int ldx, const uint16_t *w, int ldw, int m,
                               int k, int n) {
    if (m < 1 || m > SM_WQ || !mha_cpu_row_sweep()) {
        stream(y, ldy, x, ldx, w, ldw, NULL, m, k, n, 0);
        return;
    }
#define BF16(nx) sweep(y, (size_t)ldy, x, (size_t)ldx, w, ldw, k, n, 1, 0, nx)
    SWEEP_ROWS(BF16)
#undef BF16
}

void mha_gemm_stream_i8_avx2(float *y, int ldy, const float *x, int ldx, const int8_t *w, int ldw,
                             const float *scale, int m, int k, int n) {
    if (m < 1 || m > SM_WQ || k <= 0 || !mha_cpu_row_sweep()) {
        stream(y, ldy, x, ldx, w, ldw, scale, m, k, n, 1);
        return;
    }
#define I8(nx) sweep_i8(y, ldy, x, ldx, w, ldw, scale, k, n, nx)
    SWEEP_ROWS(I8)
#undef I8
}
