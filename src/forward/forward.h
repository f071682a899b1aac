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

/* mha_forward_reference that also writes lse (B,h,T) when not NULL: the
 * log-sum-exp of each query row's allowed scores (-inf: none allowed). */
mha_status mha_forward_reference_lse(const mha_layer *L, float *y, const mha_capture *cap,
                                     float *lse, const float *x, const float *k_src,
                                     const float *v_src, int B, int T, int S,
                                     const mha_options *opt);

/* The layer's per-head score terms for the attention step: ALiBi slopes
 * (h) and sink logits (h), read only when c->alibi / c->sinks; keys_are_x:
 * key positions are the queries' (self-attention). */
typedef struct {
    const float *alibi_slopes; /* (h) or NULL */
    const float *sinks;        /* (h) or NULL */
    int keys_are_x;
} mha_head_terms;

/* The reference's attention step alone, on double Q (B,T,h*d_k),
 * K (B,Sx,h_kv*d_k), V (B,Sx,h_kv*d_v) with Sx = S + extra keys of c
 * (already normed and rotated): z (B,T,h*d_v); probs (B,h,T,Sx) and lse
 * (B,h,T) when not NULL (with a sink, lse counts its term). ht may be
 * NULL: no ALiBi, no sinks. */
mha_status mha_attend_reference(const mha_config *c, const mha_head_terms *ht, double *z,
                                float *probs, float *lse, const double *q, const double *k,
                                const double *v, int B, int T, int S, const mha_options *opt);

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

/* The output gate's logits g (rows, h*d_v) = x (rows, d_model) W_G + b_G
 * on the layer's packed W_G (config.output_gate), as the fast forward
 * computes them. */
mha_status mha_fast_gate_logits(float *g, const mha_layer *L, const float *x, size_t rows, const mha_kernels *kern,
                                int nt);

/* mha_forward_kv on a resolved exec (tests pass one with a trace). */
mha_status mha_forward_exec(const mha_exec *ex, const mha_layer *L, float *y,
                            const mha_capture *cap, const float *x, const float *k_src,
                            const float *v_src, int B, int T, int S, const mha_options *opt);

#define MHA_FAST_RANGE_HINT "MHA_PATH_AUTO recomputes such calls with the reference (double)"

#endif /* MHA_FORWARD_H */
