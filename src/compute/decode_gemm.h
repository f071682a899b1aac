/* decode_gemm.h — projections of few rows (decode_gemm.c), on the decode
 * kernels and threads of ex (exec.h). */
#ifndef MHA_COMPUTE_DECODE_GEMM_H
#define MHA_COMPUTE_DECODE_GEMM_H

#include "compute/exec.h"

/* y (m, n) = x (m, k) w (k, n) + b (n, may be NULL), threaded, the same
 * bits for any thread count. _many runs up to MHA_DECODE_MAX_JOBS weights
 * that share x in one parallel region (Q, K and V of a decode step). */
typedef struct {
    float *y;       /* (m, n) */
    const float *w; /* (k, n) */
    const float *b; /* (n) or NULL */
    int n;
    /* The same weights stored compactly (MHA_W_BF16 / MHA_W_I8), streamed
     * instead of w by the few-row mode when set: w_bf16 (k, n) bf16 bits;
     * or w_i8 (k, n) with w_scale (groups, n): one scale per column and
     * group of MHA_DECODE_I8_GROUP rows, groups restarting every w_seg
     * rows (core/weight_store.h). */
    const uint16_t *w_bf16;
    const int8_t *w_i8;
    const float *w_scale;
    int w_seg;
} mha_decode_gemm_job;
#define MHA_DECODE_I8_GROUP 32 /* = MHA_W_I8_GROUP */
#define MHA_DECODE_MAX_JOBS 3
/* Rows up to which jobs with compact weights run the stream mode (fp32
 * weights: 4); mha_forward_cached sends a converted layer's steps of up
 * to this many rows here instead of to the packed fp32 GEMM
 * (docs/WEIGHTS.md has the measurement behind the number). */
#define MHA_DECODE_COMPACT_MAX_ROWS 16
mha_status mha_decode_gemm_many(const mha_exec *ex, const mha_decode_gemm_job *jobs, int njobs, const float *x, int m,
                                int k);
mha_status mha_decode_gemm(const mha_exec *ex, float *y, const float *x, const float *w, const float *b, int m, int k,
                           int n);

#endif /* MHA_COMPUTE_DECODE_GEMM_H */
