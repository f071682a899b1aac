/* decode_gemm.h — projections of few rows (decode_gemm.c) and the thread
 * and kernel choice of the decode path (threads.c). */
#ifndef MHA_COMPUTE_DECODE_GEMM_H
#define MHA_COMPUTE_DECODE_GEMM_H

#include "base/internal.h"
#include "kernels/decode_kernels.h"

/* The kernels of this CPU (AVX2 when present, else scalar); tests may force
 * the scalar ones (force = 1) or restore automatic choice (force = 0). */
const mha_decode_kernels *mha_decode_kernels_get(void);
void mha_decode_force_scalar(int force);
/* Forces a decode table (tests run each ISA); NULL: automatic choice. */
void mha_decode_kernels_force(const mha_decode_kernels *k);
/* Threads for the decode path: mha_get_num_threads() or OpenMP's default.
 * _for(work): 1 when the work (multiply-adds) is below a threshold, where
 * a barrier costs more than it saves (much more on shared cores); tests set
 * the threshold to 0 to run tiny shapes on every thread. */
int mha_decode_threads(void);
int mha_decode_threads_for(double madds);
void mha_decode_set_min_parallel_work(double madds);

/* y (m, n) = x (m, k) w (k, n) + b (n, may be NULL), threaded, the same
 * bits for any thread count. _many runs up to MHA_DECODE_MAX_JOBS weights
 * that share x in one parallel region (Q, K and V of a decode step). */
typedef struct {
    float *y;       /* (m, n) */
    const float *w; /* (k, n) */
    const float *b; /* (n) or NULL */
    int n;
} mha_decode_gemm_job;
#define MHA_DECODE_MAX_JOBS 3
mha_status mha_decode_gemm_many(const mha_decode_gemm_job *jobs, int njobs, const float *x, int m,
                                int k);
mha_status mha_decode_gemm(float *y, const float *x, const float *w, const float *b, int m, int k,
                           int n);

#endif /* MHA_COMPUTE_DECODE_GEMM_H */
