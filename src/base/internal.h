/* internal.h — the layer object and helpers shared inside libmha.
 * Legend: B batch, T queries, S keys, h heads, h_kv kv heads, d_k, d_v,
 * d_model, d_kv_in (see mha.h). */
#ifndef MHA_INTERNAL_H
#define MHA_INTERNAL_H

#include <stdatomic.h>

#include "mha.h"

/* Kinds of head blocks that carry labels (mha_block). */
#define MHA_N_BLOCKS 5

struct mha_fast_state; /* packed weights of the fast path (core/packing.h) */
struct mha_workspace;  /* scratch kept between forwards (compute/workspace.h) */
struct mha_wstore;     /* bf16 / int8 projection weights (core/weight_store.h) */

struct mha_layer {
    mha_config cfg;   /* resolved: no zero defaults left */
    float *w_q;       /* (d_model, h*d_k)    */
    float *w_k;       /* (d_kv_in, h_kv*d_k) */
    float *w_v;       /* (d_v_in, h_kv*d_v)  */
    float *w_o;       /* (h*d_v, d_model)    */
    float *b_q;       /* (h*d_k), zeros when !bias     */
    float *b_k;       /* (h_kv*d_k)                    */
    float *b_v;       /* (h_kv*d_v)                    */
    float *b_o;       /* (d_model)                     */
    float *bias_k;    /* (h_kv*d_k), zeros when !add_bias_kv */
    float *bias_v;    /* (h_kv*d_v)                    */
    float *alibi_slopes; /* (h), the default slopes unless given        */
    float *sinks;     /* (h) sink logits, zeros when !sinks            */
    float *q_norm;    /* (d_k), or (h*d_k) when qk_norm_per_head; ones when !qk_norm */
    float *k_norm;    /* (d_k), or (h_kv*d_k)                          */
    float *w_g;       /* (d_model, h*d_v) output gate, (0) without one */
    float *b_g;       /* (h*d_v), zeros without bias; (0) without a gate */
    int *labels[MHA_N_BLOCKS]; /* by mha_block: h, h_kv, h_kv, h, h entries */
    struct mha_fast_state *fast; /* NULL until the fast path prepares it */
    struct mha_workspace *ws;    /* the fast path's Q, K, V, Z blocks, kept for
                                    the next call; freed with the layer      */
    struct mha_wstore *wstore;   /* NULL: fp32 weights; else their bf16/int8
                                    form, w_q..w_o holding its exact values */
    unsigned long long version;  /* a number no other state of any layer of
                                    the process had: new at every change of
                                    the weights (mha_fast_prepare_from); a
                                    tape compares it */
    atomic_int calls;            /* the public calls on it now: -1 one that
                                    changes it, n > 0 n that read it, 0 none
                                    (mha_layer_begin)                     */
};

/* The check of mha.h's rule for layers, made by every public entry that
 * changes a layer (change = 1: set_weights, set_labels, permute_heads,
 * permute_block, convert_weights) or computes with it and returns a
 * status (change = 0: the forwards, backwards, tape, attribution,
 * contract, labels, the cached forward, set_memory): a change needs the
 * layer alone, the others share it. A change made while forwards ran
 * freed the packed weights under them (AddressSanitizer: heap-use-after-
 * free in the GEMM, the concurrency probe); now the call that finds the
 * layer busy fails with MHA_E_ARG (fn names it) and does nothing. One
 * atomic compare-and-swap per call; the layer is const to readers, the
 * count is not (it lives in the layer's own heap block). Every begin
 * that returned MHA_OK is paired with one mha_layer_end, which returns s.
 * Readers nest (a contract check runs a forward); a change never runs
 * another public entry on its layer. */
mha_status mha_layer_begin(const mha_layer *L, int change, const char *fn);
mha_status mha_layer_end(const mha_layer *L, int change, mha_status s);

/* GQA: query head r reads kv head r / (h / h_kv). Stated once, used everywhere. */
static inline int mha_kv_head(const mha_config *c, int r) {
    return r / (c->n_heads / c->n_kv_heads);
}

/* Number of keys attended: S plus the appended bias and zero rows. */
static inline int mha_total_keys(const mha_config *c, int S) {
    return S + c->add_bias_kv + c->add_zero_attn;
}

/* n rounded up to a multiple of m. */
static inline size_t mha_round_up(size_t n, size_t m) { return (n + m - 1) / m * m; }

/* sum of a[i]^2 over n floats, in double (NaN when any is NaN or Inf). */
static inline double mha_sum_squares(const float *a, int n) {
    double sq = 0.0;
    for (int i = 0; i < n; i++) sq += (double)a[i] * a[i];
    return sq;
}

/* Records a printf-style message for mha_last_error() and returns s. */
mha_status mha_fail(mha_status s, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
void mha_clear_error(void);

/* A 64-byte aligned block of `bytes` for large arrays, released with
 * free(); 2 MiB or more: backed by huge pages where the kernel allows
 * (memory.c). NULL when out of memory. */
void *mha_alloc_large(size_t bytes);
/* Test hook: set to n > 0, the n-th mha_alloc_large from then on returns
 * NULL, once, as when memory runs out (tests/test_permute.c makes each
 * allocation of a permutation fail in turn). 0, the default: none fails. */
extern _Atomic int mha_alloc_large_fail_in;

/* A zeroed, 64-byte aligned block of n * size bytes (the KV cache);
 * from 512 KiB on a fresh mapping of whole 2 MiB pages marked for huge
 * pages before anything touches it (a decode step reads the cache cold:
 * a page walk per 2 MiB, not per 4 KiB). Released with
 * mha_calloc_large_free, never free(). NULL when out of memory or when
 * n * size overflows. */
void *mha_calloc_large(size_t n, size_t size);
void mha_calloc_large_free(void *p);

/* Marks the whole 2 MiB ranges of [p, p + bytes) for huge pages where the
 * kernel allows (a hint; nothing happens elsewhere). */
void mha_advise_huge(void *p, size_t bytes);

/* Checks that n floats are finite; names the tensor and first bad index. */
mha_status mha_check_finite(const float *p, size_t n, const char *name);

/* The most elements of one tensor a call accepts (2^40 floats: 4 TiB).
 * Larger size products are wrapped arithmetic in the caller, not a real
 * tensor, and indexing them would run off the caller's buffers. */
#define MHA_MAX_ELEMENTS ((size_t)1 << 40)
/* Whether a * b * c * d (each >= 1; pass 1 for unused factors) is at
 * most MHA_MAX_ELEMENTS, computed without overflow. */
static inline int mha_elements_fit(size_t a, size_t b, size_t c, size_t d) {
    const size_t m = MHA_MAX_ELEMENTS;
    return a <= m && b <= m / a && c <= m / (a * b) && d <= m / (a * b * c);
}

/* snprintf and strtod in the C locale whatever the calling thread's
 * (numbers in files; base/c_locale.c). errno is strtod's. */
int mha_c_snprintf(char *buf, size_t size, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
double mha_c_strtod(const char *s, char **end);

/* Non-finite values mha_first_nonfinite lets through. */
#define MHA_SCAN_ALLOW_NAN 1u     /* the NaN mode's fully masked rows    */
#define MHA_SCAN_ALLOW_NEG_INF 2u /* "forbid" in additive masks and files */

/* Index of the first of n floats that is Inf or NaN and not let through
 * by `allow` (MHA_SCAN_ALLOW_*); n when there is none. */
size_t mha_first_nonfinite(const float *p, size_t n, unsigned allow);

#endif /* MHA_INTERNAL_H */
