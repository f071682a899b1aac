/* naive.h — a second oracle for the tests: the attention layer written
 * straight from the math in mha.h, in double, with no code shared with
 * src/. Slow and obvious on purpose. Also the random-layer fixtures the
 * test areas share.
 *
 * Legend: B batch, T queries, S keys, h heads, h_kv kv heads, d_k, d_v,
 * d_model, d_kv_in (key source width), d_v_in (value source width).
 */
#ifndef MHA_TEST_NAIVE_H
#define MHA_TEST_NAIVE_H

#include <stdint.h>

#include "mha.h"

/* Owned weights plus the fully resolved config they belong to. Bias
 * pointers are NULL when cfg.bias == 0 (bias_k/bias_v when !add_bias_kv). */
typedef struct {
    mha_config cfg;
    float *w_q;    /* (d_model, h*d_k)    */
    float *w_k;    /* (d_kv_in, h_kv*d_k) */
    float *w_v;    /* (d_v_in, h_kv*d_v)  */
    float *w_o;    /* (h*d_v, d_model)    */
    float *b_q;    /* (h*d_k)             */
    float *b_k;    /* (h_kv*d_k)          */
    float *b_v;    /* (h_kv*d_v)          */
    float *b_o;    /* (d_model)           */
    float *bias_k; /* (h_kv*d_k)          */
    float *bias_v; /* (h_kv*d_v)          */
    float *sinks;  /* (h), cfg.sinks only */
    float *q_norm; /* (d_k) or (h*d_k) per head, cfg.qk_norm only */
    float *k_norm; /* (d_k) or (h_kv*d_k) per head                 */
    float *w_g;    /* (d_model, h*d_v), cfg.output_gate only        */
    float *b_g;    /* (h*d_v), output_gate with bias                */
} naive_weights;

/* Fills the 0 defaults of a config by the rules written in mha.h, without
 * asking the library (so the tests do not trust mha_config_resolve). */
mha_config naive_resolve(mha_config c);

/* Allocates weights for a resolved config, uniform in [-amp, amp). */
void naive_weights_random(naive_weights *w, const mha_config *resolved, uint64_t *seed,
                          float amp);
/* Allocates all-zero weights (biases present iff the config asks). */
void naive_weights_zero(naive_weights *w, const mha_config *resolved);
void naive_weights_free(naive_weights *w);
/* Borrowed view for mha_layer_create. */
mha_weights naive_weights_view(const naive_weights *w);
/* mha_layer_create on the view; NULL (and a test failure) on error. */
mha_layer *naive_make_layer(const naive_weights *w);

/* mha_config_default(d_model, h) with n_kv_heads, d_k, d_v (0: defaults)
 * and bias set. */
mha_config naive_config(int d_model, int h, int h_kv, int d_k, int d_v, int bias);

/* mha_options_default() with path = MHA_PATH_REFERENCE. */
mha_options naive_ref_options(void);

/* The oracle. y (B,T,d_model); z (B,T,h*d_v) after interventions, may be
 * NULL; probs (B,h,T,S_total), may be NULL. kv NULL means kv = x. opt NULL
 * means the header's defaults (no mask, scale 1/sqrt(d_k), zero rows). */
void naive_forward(double *y, double *z, double *probs, const naive_weights *w,
                   const float *x, const float *kv, int B, int T, int S,
                   const mha_options *opt);
/* The same with separate sources, as mha_forward_kv: k_src (B,S,d_kv_in)
 * feeds W_K, v_src (B,S,d_v_in) feeds W_V; k_src NULL means x, v_src NULL
 * means k_src. naive_forward is this with v_src = kv. */
void naive_forward_kv(double *y, double *z, double *probs, const naive_weights *w,
                      const float *x, const float *k_src, const float *v_src, int B, int T,
                      int S, const mha_options *opt);

/* The oracle's pieces, for the tests' fp32 layers (which must not call
 * the library's own mask and intervention code):
 * whether query i may see original key j (0 <= j < S) of batch b, head r
 * under o's causal/window/keep masks; *add receives the additive terms
 * (a -inf one also forbids the key). */
int naive_key_allowed(const mha_options *o, int b, int r, int i, int j, int T, int S,
                      double *add);
/* Applies iv to head r's block of z (rows, h*d_v) in place; MEAN averages
 * over the rows. */
void naive_intervene(double *z, const mha_intervention *iv, int r, int h, int rows, int dv);

/* Runs mha_forward on L (with opt as given; the caller sets the path) and
 * the oracle on w, capturing y, z and probs from both. Returns the largest
 * |difference| over the three (NaN equal to NaN, NaN vs number = INFINITY);
 * a non-OK status is a test failure and returns INFINITY. */
double naive_compare(const mha_layer *L, const naive_weights *w, const float *x,
                     const float *kv, int B, int T, int S, const mha_options *opt);
/* The same through mha_forward_kv and naive_forward_kv. */
double naive_compare_kv(const mha_layer *L, const naive_weights *w, const float *x,
                        const float *k_src, const float *v_src, int B, int T, int S,
                        const mha_options *opt);

/* Attention over a KV cache's keys, as mha_cache_attend computes it:
 * z (B*T, h*dv) for queries q (B*T, h*dk) at positions p0 .. p0+T-1,
 * each attending keys j in [max(0, p - left), p] (left < 0: no window)
 * of k (B*S, hk*dk), v (B*S, hk*dv), head r reading kv head r / (h / hk),
 * scale 1/sqrt(dk). dbl = 1: in double; 0: plain fp32 (naive32). probs
 * (B,h,T,S) too when not NULL. */
void naive_cache_attend(double *z, double *probs, const float *q, const float *k, const float *v, int B, int T,
                        int S, int p0, int h, int hk, int dk, int dv, int left, int dbl);

/* x rounded to IEEE binary16 (nearest, ties to even; overflow to inf) and
 * widened back: the value an fp16 KV cache must store, computed with
 * frexp/nearbyint rather than bit manipulation (the library's way). */
float naive_round_f16(float x);

/* x rounded to bfloat16 (8 significant bits), ties to even, with frexp /
 * nearbyint (the library shifts bits): a bf16 weight's value. */
float naive_round_bf16(float x);

/* w (K, N) in place -> its int8 weights' values: one scale max|w| / 127
 * per column and group of 32 rows, groups starting afresh at every
 * multiple of seg rows (W_O: each head's rows), q rounded half away from
 * 0 with floor and clamped to +-127, written back as q * scale. */
void naive_round_int8(float *w, int K, int N, int seg);

/* Helpers for comparing float results with double oracles. */
double naive_max_diff(const float *a, const double *b, size_t n); /* NaN -> INF */
float *naive_alloc_floats(size_t n);   /* zeroed, aborts on failure */
double *naive_alloc_doubles(size_t n); /* zeroed, aborts on failure */
float *naive_random_floats(size_t n, uint64_t *seed, float lo, float hi);

/* One backward test case: a random layer, inputs and dY, shared by the
 * reference and the fast backward suites. */
typedef struct {
    naive_weights w;
    mha_layer *L;
    float *x, *k_src, *v_src, *dy; /* (B,T,d_model) (B,S,d_kv_in)|NULL (B,S,d_v_in)|NULL (B,T,d_model) */
    float *y;                      /* (B,T,d_model) scratch for a forward */
    int B, T, S;
    mha_options opt;               /* mha_options_default() */
} naive_bw_case;

/* config c resolved; key and value sources apart when k_given / v_given */
void naive_bw_case_make(naive_bw_case *f, mha_config c, int B, int T, int S, int k_given, int v_given,
                        uint64_t seed);
void naive_bw_case_free(naive_bw_case *f);

#endif
