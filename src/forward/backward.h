/* backward.h — the backward engines behind mha_backward_kv (backward.c).
 * Legend: B, T, S, h, h_kv, d_k, d_v, d_model, d_kv_in, d_v_in (see mha.h). */
#ifndef MHA_BACKWARD_H
#define MHA_BACKWARD_H

#include "core/core.h"
#include "compute/exec.h"

/* The reference backward (backward_reference.c), accumulating in double.
 * Arguments already validated; k_src and v_src resolved (never NULL: a
 * source that is x is passed as x, and the gradient of every source that
 * aliases another is summed into the first one's output). */
mha_status mha_backward_reference(const mha_layer *L, const mha_gradients *g, const float *dy,
                                  const float *x, const float *k_src, const float *v_src,
                                  int B, int T, int S, const mha_options *opt);

/* The fast backward (backward_fast.c), fp32, FlashAttention-2's algorithm;
 * same arguments. MHA_E_UNSUPPORTED when it cannot serve the request: the
 * caller then runs the reference under MHA_PATH_AUTO. */
mha_status mha_backward_fast(const mha_exec *ex, const mha_layer *L, const mha_gradients *g, const float *dy,
                             const float *x, const float *k_src, const float *v_src,
                             int B, int T, int S, const mha_options *opt);

/* The checks of one backward request (mha_backward_kv's and
 * mha_backward_tape's, errors named as `who`): grad and dy given, dy
 * finite, the forward's checks of shapes, sources and masks, no gradient
 * without a tensor; resolves the NULL sources and options as
 * mha_forward_request. */
mha_status mha_backward_validate(const char *who, const mha_layer *L, const mha_gradients *g, const float *dy, const float *x,
                                 const float **k_src, const float **v_src, const mha_options **opt,
                                 mha_options *defaults, int B, int T, int S);

/* MHA_E_NONFINITE naming the first Inf or NaN among the gradients g wrote
 * (fp32 overflow: the fast backward serves no fully masked NaN-mode row). */
mha_status mha_backward_check_overflow(const mha_config *c, const mha_gradients *g, int B, int T, int S,
                                       const char *who);

/* mha_backward_kv on a resolved exec: its kernels (prefill and backward
 * tables), threads and MHA_KERNELS=reference choice (tests pass one with a
 * trace, as mha_forward_exec). */
mha_status mha_backward_exec(const mha_exec *ex, const mha_layer *L, const mha_gradients *g,
                             const float *dy, const float *x, const float *k_src, const float *v_src,
                             int B, int T, int S, const mha_options *opt);

#endif /* MHA_BACKWARD_H */
