/* decode_gemm.c — the projections of the cached forward: y = x w + b with
 * w (k, n) row-major (in, out), threaded.
 *
 * Decode multiplies one row (or a few) by each weight matrix, so it is a
 * stream over the weights and memory-bound: rows of w are read
 * contiguously, split across threads by fixed blocks of KBLK input rows
 * whose partial sums are added in block order (a fixed order: the same
 * bits for any thread count). Many rows (prefill) use register tiles over
 * column blocks instead, one thread per output element.
 * Legend: m rows, k inputs, n outputs.
 */
#include <stdlib.h>
#include <string.h>

#include "cache_internal.h"

#define KBLK 256 /* input rows per partial sum (stream mode)       */
#define NBLK 2048 /* output columns per task (stream mode)         */
#define MBLK 32  /* rows per task (tile mode)                      */
#define TBLK 64  /* output columns per task (tile mode)            */
#define STREAM_MAX_ROWS 4

mha_status mha_decode_gemm(float *y, const float *x, const float *w, const float *b, int m, int k,
                           int n) {
    const mha_decode_kernels *kr = mha_decode_kernels_get();
    int nth = mha_decode_threads();
    if (m <= 0 || n <= 0) return MHA_OK;
    if (m <= STREAM_MAX_ROWS) {
        int nkb = (k + KBLK - 1) / KBLK, ncb = (n + NBLK - 1) / NBLK;
        size_t plane = (size_t)m * n;
        float *part = calloc((size_t)(nkb > 0 ? nkb : 1) * plane, sizeof(float)); /* (nkb, m, n) */
        if (!part) return mha_fail(MHA_E_NOMEM, "mha_forward_cached: no memory for projection partials");
#pragma omp parallel num_threads(nth)
        {
#pragma omp for schedule(static)
            for (int t = 0; t < nkb * ncb; t++) {
                int kb = t / ncb, cb = t % ncb;
                int k0 = kb * KBLK, kn = k - k0 < KBLK ? k - k0 : KBLK;
                int j0 = cb * NBLK, jn = n - j0 < NBLK ? n - j0 : NBLK;
                kr->gemm_stream(part + kb * plane + j0, n, x + k0, k, w + (size_t)k0 * n + j0, n, m, kn, jn);
            }
#pragma omp for schedule(static)
            for (int cb = 0; cb < ncb; cb++) {
                int j0 = cb * NBLK, jn = n - j0 < NBLK ? n - j0 : NBLK;
                for (int r = 0; r < m; r++)
                    for (int j = j0; j < j0 + jn; j++) {
                        float acc = b ? b[j] : 0.0f;
                        for (int kb = 0; kb < nkb; kb++) acc += part[kb * plane + (size_t)r * n + j];
                        y[(size_t)r * n + j] = acc;
                    }
            }
        }
        free(part);
        return MHA_OK;
    }
    int nrb = (m + MBLK - 1) / MBLK, ncb = (n + TBLK - 1) / TBLK;
#pragma omp parallel for schedule(static) num_threads(nth)
    for (int t = 0; t < nrb * ncb; t++) {
        int i0 = (t / ncb) * MBLK, in = m - i0 < MBLK ? m - i0 : MBLK;
        int j0 = (t % ncb) * TBLK, jn = n - j0 < TBLK ? n - j0 : TBLK;
        float *yb = y + (size_t)i0 * n + j0;
        kr->gemm_tile(yb, n, x + (size_t)i0 * k, k, w + j0, n, in, k, jn);
        if (b)
            for (int i = 0; i < in; i++)
                for (int j = 0; j < jn; j++) yb[(size_t)i * n + j] += b[j0 + j];
    }
    return MHA_OK;
}
