/* forward.h — the two forward engines behind mha_forward (forward.c). */
#ifndef MHA_FORWARD_H
#define MHA_FORWARD_H

#include "compute/exec.h"
#include "core/core.h"

/* The reference forward (reference.c); arguments already validated and
 * k_src, v_src resolved (never NULL: x for self-attention). */
mha_status mha_forward_reference(const mha_layer *L, float *y, const mha_capture *cap,
                                 const float *x, const float *k_src, const float *v_src,
                                 int B, int T, int S, const mha_options *opt);

/* out (rows, n) = in (rows, k) w (k, n) + b (n), accumulated in double:
 * the projections of the reference forward and backward (reference.c). */
void mha_linear_double(double *out, const float *in, const float *w, const float *b, size_t rows,
                       int k, int n);

/* The fast forward (fast.c) on ex's kernels and threads. Returns
 * MHA_E_UNSUPPORTED when this machine or build has no fast path for the
 * request, MHA_E_NONFINITE when fp32 cannot hold the request's numbers
 * (scores beyond MHA_FAST_SCORE_LIMIT, an overflowing sum); the caller
 * then runs the reference under MHA_PATH_AUTO. */
mha_status mha_forward_fast(const mha_exec *ex, const mha_layer *L, float *y,
                            const mha_capture *cap, const float *x, const float *k_src,
                            const float *v_src, int B, int T, int S, const mha_options *opt);

/* mha_forward_kv on a resolved exec (tests pass one with a trace). */
mha_status mha_forward_exec(const mha_exec *ex, const mha_layer *L, float *y,
                            const mha_capture *cap, const float *x, const float *k_src,
                            const float *v_src, int B, int T, int S, const mha_options *opt);

#define MHA_FAST_RANGE_HINT "MHA_PATH_AUTO recomputes such calls with the reference (double)"

#endif /* MHA_FORWARD_H */
