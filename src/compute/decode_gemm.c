/* decode_gemm.c — the projections of the cached forward: y = x w + b with
 * w (k, n) row-major (in, out), threaded; several weights sharing one x
 * (Q, K, V) run in one parallel region.
 *
 * Decode multiplies one row (or a few) by each weight matrix, so it is a
 * stream over the weights and memory-bound: rows of w are read
 * contiguously, split across threads by fixed blocks of KBLK input rows
 * whose partial sums are added in block order (a fixed order: the same
 * bits for any thread count). Compact weights (bf16, int8) stream up to
 * MHA_DECODE_COMPACT_MAX_ROWS rows this way (a batched decode step): their
 * kernels widen each weight once for all rows, so the step reads half or
 * a quarter of the fp32 bytes. Many rows use register tiles over column
 * blocks instead, one thread per output element; mha_forward_cached sends
 * those (N >= MHA_PREFILL_MIN_ROWS) to the fast path's packed mha_gemm,
 * 3-5x faster, so the tile mode is only the fallback for a layer without
 * packed weights.
 * Legend: m rows, k inputs, n outputs.
 */
#include <stdlib.h>
#include <string.h>

#include "compute/decode_gemm.h"
#include "compute/gemm.h"

#define KBLK 256  /* input rows per partial sum (stream mode)        */
#define CMIN 256  /* fewest output columns per task (stream mode)    */
#define TPT 2     /* tasks per thread and job the column split aims at */
#define MBLK 32   /* rows per task (tile mode)                       */
#define TBLK 64   /* output columns per task (tile mode)             */
#define STREAM_MAX_ROWS 4

static int blocks(int n, int b) { return (n + b - 1) / b; }

/* Output columns per stream task of a job n wide: whole rows (one
 * contiguous run of KBLK rows, which the hardware prefetchers follow
 * across pages; 2 KiB pieces at an 8 KiB stride streamed at ~30 GB/s
 * on Zen 5, whose prefetchers restart at each 4 KiB page) unless the
 * nkb k-blocks give fewer than TPT tasks per thread; then a multiple
 * of 64 columns, at least CMIN. The split does not change any sum. */
static int col_block(int n, int nkb, int nth) {
    const int want = blocks(TPT * nth, nkb); /* column blocks wanted */
    int c = blocks(blocks(n, want), 64) * 64;
    return c < CMIN ? CMIN : c;
}

/* p (m, jn) += x (m, rows k0..k0+kn) dequant(q) for int8 weights, one
 * kernel call per piece of the rows that shares a scale group (groups of
 * MHA_DECODE_I8_GROUP rows, restarting every w_seg rows). */
static void stream_i8_groups(const mha_decode_kernels *kr, float *p, const mha_decode_gemm_job *J, const float *x,
                             int k, int m, int k0, int kn, int j0, int jn) {
    const int seg = J->w_seg, gps = blocks(seg, MHA_DECODE_I8_GROUP);
    for (int a = k0, b; a < k0 + kn; a = b) {
        const int in_seg = a % seg, g = (a / seg) * gps + in_seg / MHA_DECODE_I8_GROUP;
        b = a - in_seg % MHA_DECODE_I8_GROUP + MHA_DECODE_I8_GROUP; /* the group's end ... */
        if (b > a - in_seg + seg) b = a - in_seg + seg;            /* ... or the segment's */
        if (b > k0 + kn) b = k0 + kn;
        kr->gemm_stream_i8(p, J->n, x + a, k, J->w_i8 + (size_t)a * J->n + j0, J->n,
                           J->w_scale + (size_t)g * J->n + j0, m, b - a, jn);
    }
}

/* y (m, columns j0..j0+jn) of job J = bias (or 0) + the nkb partials p
 * (nkb, m, J->n) in block order, a block at a time across the columns
 * (unit-stride loops the compiler vectorizes; each element's additions
 * in the same order as one element at a time). */
static void add_partials(const mha_decode_gemm_job *J, const float *p, int nkb, int m, int j0, int jn) {
    const size_t plane = (size_t)m * J->n;
    for (int r = 0; r < m; r++) {
        float *y = J->y + (size_t)r * J->n + j0;
        const float *pr = p + (size_t)r * J->n + j0;
        for (int j = 0; j < jn; j++) y[j] = J->b ? J->b[j0 + j] : 0.0f;
        for (int b = 0; b < nkb; b++)
            for (int j = 0; j < jn; j++) y[j] += pr[b * plane + j];
    }
}

mha_status mha_decode_gemm_many(const mha_exec *ex, const mha_decode_gemm_job *jobs, int njobs, const float *x, int m,
                                int k) {
    const mha_decode_kernels *kr = mha_exec_decode(ex);
    if (m <= 0) return MHA_OK;
    double work = 0.0; /* multiply-adds; small ones run on one thread */
    for (int i = 0; i < njobs; i++) work += (double)m * k * jobs[i].n;
    int nth = mha_exec_threads_for(ex, work), stream_max = STREAM_MAX_ROWS;
    for (int i = 0; i < njobs; i++) /* compact weights: their streams reuse each weight for every row */
        if (jobs[i].w_bf16 || jobs[i].w_i8) stream_max = MHA_DECODE_COMPACT_MAX_ROWS;
    if (m <= stream_max) {
        /* partial sums (nkb, m, n) of every job, one buffer */
        int nkb = blocks(k, KBLK), first[MHA_DECODE_MAX_JOBS + 1], cw[MHA_DECODE_MAX_JOBS];
        size_t at[MHA_DECODE_MAX_JOBS + 1];
        first[0] = 0, at[0] = 0;
        for (int i = 0; i < njobs; i++) {
            cw[i] = col_block(jobs[i].n, nkb, nth);
            first[i + 1] = first[i] + nkb * blocks(jobs[i].n, cw[i]);
            at[i + 1] = at[i] + (size_t)nkb * m * jobs[i].n;
        }
        /* kept between calls (gemm.c's pool): 8 x 6144 floats at d_model
         * 2048, which glibc mapped, or took from a heap top it then gave
         * back, faulted in anew by every step */
        float *part = mha_gemm_scratch_take(at[njobs] ? at[njobs] : 1);
        int ntask = first[njobs], nred = 0, cb_first[MHA_DECODE_MAX_JOBS + 1];
        for (int i = 0; i < njobs; i++) cb_first[i] = nred, nred += blocks(jobs[i].n, cw[i]);
        cb_first[njobs] = nred;
        int *done = calloc((size_t)(nred > 0 ? nred : 1), sizeof(int)); /* k-blocks done per column block */
        if (!part || !done) {
            if (part) mha_gemm_scratch_give(part);
            free(done);
            return mha_fail(MHA_E_NOMEM, "mha_forward_cached: no memory for projection partials");
        }
        /* the thread that completes a column block's last k-block adds its
         * partials in block order: no barrier between the two phases */
#pragma omp parallel for schedule(dynamic, 1) num_threads(nth) /* jobs differ in width */
        for (int t = 0; t < ntask; t++) {
            int i = 0;
            while (t >= first[i + 1]) i++;
            const mha_decode_gemm_job *J = &jobs[i];
            int ncb = blocks(J->n, cw[i]), kb = (t - first[i]) / ncb, cb = (t - first[i]) % ncb;
            int k0 = kb * KBLK, kn = k - k0 < KBLK ? k - k0 : KBLK;
            int j0 = cb * cw[i], jn = J->n - j0 < cw[i] ? J->n - j0 : cw[i];
            size_t plane = (size_t)m * J->n;
            float *p = part + at[i] + kb * plane + j0;
            for (int r = 0; r < m; r++) memset(p + (size_t)r * J->n, 0, sizeof(float) * jn);
            const size_t w0 = (size_t)k0 * J->n + j0;
            if (J->w_bf16) kr->gemm_stream_bf16(p, J->n, x + k0, k, J->w_bf16 + w0, J->n, m, kn, jn);
            else if (J->w_i8) stream_i8_groups(kr, p, J, x, k, m, k0, kn, j0, jn);
            else kr->gemm_stream(p, J->n, x + k0, k, J->w + w0, J->n, m, kn, jn);
            int finished;
#pragma omp atomic capture seq_cst
            finished = ++done[cb_first[i] + cb];
            if (finished == nkb) add_partials(J, part + at[i], nkb, m, j0, jn);
        }
        free(done);
        mha_gemm_scratch_give(part);
        return MHA_OK;
    }
    int nrb = blocks(m, MBLK), first[MHA_DECODE_MAX_JOBS + 1];
    first[0] = 0;
    for (int i = 0; i < njobs; i++) first[i + 1] = first[i] + nrb * blocks(jobs[i].n, TBLK);
#pragma omp parallel for schedule(static) num_threads(nth)
    for (int t = 0; t < first[njobs]; t++) {
        int i = 0;
        while (t >= first[i + 1]) i++;
        const mha_decode_gemm_job *J = &jobs[i];
        int ncb = blocks(J->n, TBLK), u = t - first[i];
        int i0 = (u / ncb) * MBLK, in = m - i0 < MBLK ? m - i0 : MBLK;
        int j0 = (u % ncb) * TBLK, jn = J->n - j0 < TBLK ? J->n - j0 : TBLK;
        float *yb = J->y + (size_t)i0 * J->n + j0;
        kr->gemm_tile(yb, J->n, x + (size_t)i0 * k, k, J->w + j0, J->n, in, k, jn);
        if (J->b)
            for (int r = 0; r < in; r++)
                for (int j = 0; j < jn; j++) yb[(size_t)r * J->n + j] += J->b[j0 + j];
    }
    return MHA_OK;
}

mha_status mha_decode_gemm(const mha_exec *ex, float *y, const float *x, const float *w, const float *b, int m, int k,
                           int n) {
    mha_decode_gemm_job j = {y, w, b, n, NULL, NULL, NULL, 0};
    return mha_decode_gemm_many(ex, &j, 1, x, m, k);
}
