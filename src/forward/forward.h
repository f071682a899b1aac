/* forward.h — the two forward engines behind mha_forward (forward.c). */
#ifndef MHA_FORWARD_H
#define MHA_FORWARD_H

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

/* The fast forward (forward_fast.c). Returns MHA_E_UNSUPPORTED when this
 * machine or build has no fast path for the request; the caller then falls
 * back to the reference under MHA_PATH_AUTO. */
mha_status mha_forward_fast(const mha_layer *L, float *y, const mha_capture *cap,
                            const float *x, const float *k_src, const float *v_src,
                            int B, int T, int S, const mha_options *opt);
#endif /* MHA_FORWARD_H */
