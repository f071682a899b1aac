/* backward_fast.h — the pieces of the fast backward (backward_fast.c):
 * strided products (backward_gemm.c) and the tiled attention backward
 * (backward_attention.c), FlashAttention-2's algorithm.
 * Legend: B batch, T queries, S keys, Sx = S + extra keys (bias_kv row,
 * zero row), h, h_kv heads, d_k, d_v; qw = h*d_k, kw = h_kv*d_k,
 * vw = h_kv*d_v, zw = h*d_v. */
#ifndef MHA_BACKWARD_FAST_H
#define MHA_BACKWARD_FAST_H

#include "compute/exec.h"
#include "core/core.h"
#include "kernels/kernels.h"

/* A strided matrix: element (i, k) is p[i*rs + k*cs]. */
typedef struct {
    const float *p;
    size_t rs, cs;
} mha_view;

/* c (M,N) row stride ldc = a (M,K) b (K,N), or c += when accumulate; fp32,
 * each element one task's sum over k in a fixed order (thread-count free).
 * K = 0 with !accumulate writes zeros. */
mha_status mha_gemm_strided(float *c, size_t ldc, mha_view a, mha_view b, int M, int N, int K,
                            int accumulate, const mha_backward_kernels *bk, int n_threads);

/* out (n) [+]= sum over rows of a (rows, n) with row stride lda, in row order. */
void mha_column_sums(float *out, const float *a, size_t lda, size_t rows, int n, int accumulate);

/* The attention part of one backward. Every tensor is position-major with
 * head r (or kv head g) at columns [r*d, (r+1)*d); the key tensors hold
 * Sx rows per batch (extra keys at S..Sx-1) and GQA maps r -> g as mha.h.
 * dq may be z's buffer and dk, dv may be k's and v's (the backward writes
 * them after it has read what it needs). */
typedef struct {
    const mha_config *cfg;
    const mha_options *opt;
    const float *q;  /* (B,T,qw)                                          */
    const float *k;  /* (B,Sx,kw); the zero_attn row (if any) zero          */
    const float *v;  /* (B,Sx,vw)                                         */
    float *z;        /* (B,T,zw): attention output before interventions    */
    float *lse;      /* (B,h,T): log sum exp of each row's scores; +inf for
                        a row with no allowed key                          */
    const float *dz; /* (B,T,zw): dl/dZ before the interventions            */
    float *dq;       /* (B,T,qw)                                          */
    float *dk;       /* (B,Sx,kw): summed over each kv group's heads        */
    float *dv;       /* (B,Sx,vw)                                         */
    int B, T, S, Sx;
    float scale;
    float *row_max;  /* (B,h,T) or NULL. Given: pass 1 writes each row's max
                        score m here and lse = log l (the sum relative to
                        m), and pass 2 (which needs it) takes P = exp((s -
                        m) - log l). m + log l rounded to fp32 loses up to
                        half an ulp of m (5e-4 at |s| = 1e4), an error that
                        size in every P of the row and in the gradients.
                        NULL: lse = m + log l (mha_attend_lse).           */
    /* the variants inside the softmax (cfg->alibi, softcap, sinks): */
    const float *alibi_slopes; /* (h) when cfg->alibi                     */
    const float *sinks;        /* (h) when cfg->sinks                     */
    int keys_are_x;            /* keys take the query positions (ALiBi)   */
    float *d_sinks_part;       /* (B,h): pass 2 writes each (b, r)'s share
                                  of dl/dsink_r (when cfg->sinks)         */
} mha_bwd_attn;

/* The fast path's fp32 range rule (mha.h) on q (B,T,qw) and k (B,Sx,kw):
 * |scale| max|q| max|k| per (b, head) within MHA_FAST_SCORE_LIMIT, else
 * MHA_E_UNSUPPORTED naming `who` (AUTO callers then run the reference). */
mha_status mha_fast_check_scores(const float *q, const float *k, const mha_config *c, int B, int T, int Sx,
                                 float scale, const char *who);

/* Pass 1: z and lse from q, k, v (the forward's attention with an online
 * softmax on the prefill table's tiles: no (T,S) buffer); also mha_attend_lse's fast path. *masked_rows =
 * number of rows with no allowed key (their z is 0). bk is not read (may
 * be NULL). */
mha_status mha_bwd_attention_forward(const mha_bwd_attn *a, const mha_kernels *kern,
                                     const mha_backward_kernels *bk, int n_threads, long *masked_rows);

/* Tests: pass 1 keeps a kv head's packed keys per thread when they take
 * at most `bytes` (< 0: the built-in cap, 32 MiB); 0 packs every tile's
 * keys for that tile alone, the path of heads too long to keep. */
void mha_bwd_force_head_cache_cap(long bytes);

/* Pass 2: D = rowsum(dZ * Z), then per (batch, head) task the key blocks
 * in order, and for each the query blocks in order: the probabilities
 * recomputed from lse and FlashAttention-2's five tile products
 * (S = Q K^T, dP = dZ V^T, dV += P^T dZ, dK += dS^T Q, dQ += dS K). GQA
 * heads of a group write their own dK, dV, summed in head order after.
 * No atomics. */
mha_status mha_bwd_attention_backward(const mha_bwd_attn *a, const mha_kernels *kern,
                                      const mha_backward_kernels *bk, int n_threads);

/* What the fast backward reads of its forward: the projections and pass
 * 1's products. The stateless backward makes them itself; the training
 * forward keeps them in a tape (tape.c) for mha_backward_tape. */
typedef struct {
    float *q;   /* (B,T,qw)                                                */
    float *k;   /* (B,Sx,kw); key S = bias_k under add_bias_kv, the
                   zero_attn row zero                                      */
    float *v;   /* (B,Sx,vw)                                               */
    float *z;   /* (B,T,zw): Z before the interventions (room for
                   (B,T,qw) when made with dq_room)                        */
    float *lse; /* (B,h,T): log l of each row (+inf: no allowed key), then
                   row_max (B,h,T) in the same block (mha_bwd_attn)        */
    int B, T, S, Sx;
    float scale; /* the options' scale, resolved                           */
    float *row_max; /* (B,h,T): lse + B*h*T                                */
    float *q_pre; /* (B,T,qw) Q before QK-norm (NULL without qk_norm): q
                     holds norm then RoPE of it, what attention reads      */
    float *k_pre; /* (B,Sx,kw) K before QK-norm, likewise                  */
    unsigned char *clip_in; /* clip_qkv only (else NULL): 1 where the projection
                     was within [-c, c] (the clamp passes the gradient), q's
                     (B,T,qw) then k's (B,Sx,kw) then v's (B,Sx,vw)        */
    float *gate;  /* (B,T,zw) sigmoid(X W_G + b_G), config.output_gate only
                     (else NULL): W_O reads Z * gate                       */
} mha_bwd_saved;

/* sv from validated arguments (sources resolved): the projections on the
 * packed weights, the bias_kv row, QK-norm and RoPE (backward_qk.c), the
 * fp32 range rule and pass 1 (ALiBi, softcap and sinks in its tiles).
 * MHA_E_UNSUPPORTED (naming `who`, nothing kept) for what the fast
 * backward does not serve: no packed weights, int overflow, scores beyond
 * MHA_FAST_SCORE_LIMIT, MHA_MASKED_ROW_NAN with a fully masked row. */
mha_status mha_bwd_saved_make(mha_bwd_saved *sv, const mha_exec *ex, const mha_layer *L, const float *x,
                              const float *k_src, const float *v_src, int B, int T, int S,
                              const mha_options *opt, int dq_room, const char *who);
void mha_bwd_saved_free(mha_bwd_saved *sv);

/* *zo = Z as W_O reads it (B,T,zw): sv->z times the output gate, then
 * the interventions; sv->z itself (*owned NULL) when there is neither,
 * else a new array the caller frees (*owned). */
mha_status mha_bwd_z_read(const float **zo, float **owned, const mha_bwd_saved *sv, const mha_layer *L,
                          const mha_options *opt, const char *who);

/* The fast backward from sv: W_O, the gate, interventions, attention (pass 2),
 * projections, into g. overwrite: dQ goes into sv->z (made with dq_room),
 * dK, dV into sv->k, sv->v (sv is spent); else sv is left as it was and
 * can serve another backward. Same bits either way. */
mha_status mha_bwd_from_saved(const mha_exec *ex, const mha_layer *L, const mha_gradients *g, const float *dy,
                              const mha_bwd_saved *sv, const float *x, const float *k_src,
                              const float *v_src, const mha_options *opt, int overwrite);

/* QK-norm then RoPE on sv->q (B,T,qw) and sv->k (B,S,kw) in place, as
 * the fast forward applies them (mha_qk_transform: the same fp32 bits),
 * keeping the pre-norm rows in sv->q_pre, sv->k_pre when config.qk_norm.
 * keys_are_x: the keys take the query positions. (backward_qk.c) */
mha_status mha_bwd_qk_forward(mha_bwd_saved *sv, const mha_layer *L, const mha_options *opt, int keys_are_x,
                              int n_threads);

/* Their backward, in place on dq (B,T,qw) and dk (B,S,kw): RoPE's
 * transpose, then the norm's backward (double per row) from sv's pre-norm
 * rows; d_q_norm, d_k_norm (as the weights; NULL: not wanted) summed over
 * fixed chunks of rows in order, so the bits do not depend on the thread
 * count. (backward_qk.c) */
mha_status mha_bwd_qk_backward(float *dq, float *dk, float *d_q_norm, float *d_k_norm, const mha_bwd_saved *sv,
                               const mha_layer *L, const mha_options *opt, int keys_are_x, int n_threads);

#endif /* MHA_BACKWARD_FAST_H */
