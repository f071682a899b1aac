/* bench_fast.h — the fast path's projection GEMMs set up as
 * mha_forward_fast runs them (weights packed as at layer creation, outputs
 * in attention's layouts), shared by bench_internal.c (each part timed
 * alone) and bench_gemm.c (paired with OpenBLAS). It includes the
 * library's internal headers: only the bench binary uses it.
 * Legend: B, T, S, S_pad = S rounded up to 16, h, h_kv, d_k, d_v,
 * ldv = d_v rounded up to 16, D = d_model. */
#ifndef MHA_BENCH_FAST_H
#define MHA_BENCH_FAST_H

#include "bench.h"
#include "compute/gemm.h"

/* One projection GEMM: run with bench_run_gemm(&case). */
typedef struct {
    const char *gemm;   /* "qkv", "q", "kv" or "o" */
    int M, K, N;        /* out (M, N) = in (M, K) W (K, N) + b */
    mha_gemm_args args; /* args.dst points into the bench_fast that made it */
    const mha_kernels *kern;
    int nt;
} bench_gemm_case;

/* Runs one case's mha_gemm; nonzero when it failed. */
int bench_run_gemm(void *gemm_case);

/* Not to be copied once set up: the cases point into it. */
typedef struct {
    mha_config rc;           /* the layer's resolved config */
    mha_packed qkv, o;       /* W_Q|W_K|W_V and W_O packed */
    float *q, *kt, *v;       /* (B,h,T,d_k), (B,h_kv,S_pad/16,d_k,16), (B,h_kv,S_pad,ldv) */
    float *z, *y;            /* (B,T,h*d_v) attention's output, (B,T,D) */
    mha_dst dst[3], out;     /* Q, K^T, V and Y as the fast path writes them */
    int S, S_pad, ldv;
    bench_gemm_case gemm[3]; /* the fast path's order: qkv, o or q, kv, o */
    int n_gemm;
} bench_fast;

/* Packs w, allocates the outputs and describes the GEMMs reading x
 * (B,T,D) and kv (B,S,D) (NULL: self-attention); O reads z, which holds
 * zeros until attention writes it. 0 on success, else -1 (mha_last_error). */
int bench_fast_init(bench_fast *f, const bench_prefill_cfg *c, const mha_weights *w, const float *x,
                    const float *kv);
void bench_fast_free(bench_fast *f);

#endif /* MHA_BENCH_FAST_H */
