/* bench_internal.c — the fast path taken apart: its projection GEMMs
 * (mha_gemm, src/compute/gemm.h) and its fused attention (mha_attention,
 * src/forward/attention.h) timed separately, on the same layouts src/forward/fast.c
 * uses. This is how bench reports attention-only time without guessing:
 * the attention kernel itself is timed, nothing is subtracted.
 *
 * It mirrors the call sequence of mha_forward_fast(); when that changes
 * (new layouts, new arguments), this file changes with it. Only the bench
 * binary depends on these internal headers.
 * Legend: B, T, S, S_pad = S rounded up to 16, h, h_kv, d_k, d_v,
 * ldv = d_v rounded up to 16, D = d_model. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "forward/attention.h"
#include "bench.h"
#include "compute/gemm.h"
#include "forward/forward.h"

typedef struct {
    const mha_dst *dst;
    const float *a;
    size_t lda;
    int M;
    const mha_packed *p;
    int s0, s1, K;
    const mha_kernels *kern;
    int nt;
} gemm_call;

static int run_gemm(void *arg) {
    const gemm_call *g = arg;
    const mha_gemm_args args = {g->dst, g->a, g->lda, g->M, g->p, g->s0, g->s1, 0, g->K, 1};
    return mha_gemm(&args, g->kern, g->nt) != MHA_OK;
}

typedef struct {
    const mha_attn_args *args;
    const mha_kernels *kern;
    int nt;
} attn_call;

static int run_attn(void *arg) {
    const attn_call *c = arg;
    return mha_attention(c->args, c->kern, c->nt) != MHA_OK;
}

static size_t round16(size_t n) { return (n + 15) / 16 * 16; }

static void report_gemm(const bench_prefill_cfg *c, const char *gemm, int M, int K, int N,
                        const double *t, int n) {
    printf("RESULT kind=gemm impl=mha_gemm name=%s gemm=%s M=%d K=%d N=%d bias=1", c->name, gemm, M, K, N);
    if (n < 0) {
        printf(" error=\"%s\"\n", mha_last_error());
    } else {
        bench_print_times(t, n);
        printf(" kernels=%s\n", mha_kernels_get()->name);
    }
    fflush(stdout);
}

int bench_fast_parts(const bench_prefill_cfg *c, const mha_weights *w, const float *x,
                     const float *kv) {
    mha_config cfg = mha_config_default(c->d_model, c->h), rc;
    cfg.bias = 1;
    if (mha_config_resolve(&rc, &cfg)) return -1;
    const mha_kernels *kern = mha_kernels_get();
    const int nt = c->threads, D = rc.d_model, h = rc.n_heads, h_kv = rc.n_kv_heads;
    const int d_k = rc.d_k, d_v = rc.d_v, B = c->B, T = c->T, S = c->cross ? c->S : c->T;
    const int S_pad = (int)round16((size_t)S), ldv = (int)round16((size_t)d_v);
    const size_t rows = (size_t)B * T;

    /* packed as mha_fast_prepare packs them (d_kv_in == d_model: fused) */
    mha_packed qkv, o;
    const float *const wq[3] = {w->w_q, w->w_k, w->w_v}, *const bq[3] = {w->b_q, w->b_k, w->b_v};
    const int cols[3] = {h * d_k, h_kv * d_k, h_kv * d_v};
    const float *const wo[1] = {w->w_o}, *const bo[1] = {w->b_o};
    if (mha_pack(&qkv, D, 3, wq, bq, cols) || mha_pack(&o, h * d_v, 1, wo, bo, &D)) return -1;

    float *q = bench_alloc(rows * h * d_k);                 /* (B,h,T,d_k), head-major   */
    float *kt = bench_alloc((size_t)B * h_kv * S_pad * d_k); /* (B,h_kv,S_pad/16,d_k,16) */
    float *v = bench_alloc((size_t)B * h_kv * S_pad * ldv);  /* (B,h_kv,S_pad,ldv)        */
    float *z = bench_alloc(rows * h * d_v);                 /* (B,T,h*d_v)               */
    float *y = bench_alloc(rows * D);                       /* (B,T,D)                   */
    const mha_dst dst[3] = {
        {MHA_DST_HEADS, q, (size_t)d_k, d_k, h, T, (size_t)T * d_k},
        {MHA_DST_HEADS_T, kt, 0, d_k, h_kv, S, (size_t)S_pad * d_k},
        {MHA_DST_HEADS, v, (size_t)ldv, d_v, h_kv, S, (size_t)S_pad * ldv},
    };
    double t[256];
    int n;

    // --- projections Q, K, V into attention's layouts (one fused pass for self-attention)
    if (!c->cross) {
        gemm_call g = {dst, x, (size_t)D, (int)rows, &qkv, 0, 3, D, kern, nt};
        n = bench_repeat(run_gemm, &g, t, c->reps, c->budget);
        report_gemm(c, "qkv", (int)rows, D, cols[0] + cols[1] + cols[2], t, n);
    } else {
        gemm_call g = {dst, x, (size_t)D, (int)rows, &qkv, 0, 1, D, kern, nt};
        n = bench_repeat(run_gemm, &g, t, c->reps, c->budget);
        report_gemm(c, "q", (int)rows, D, cols[0], t, n);
        gemm_call g2 = {dst + 1, kv, (size_t)D, B * S, &qkv, 1, 3, D, kern, nt};
        n = bench_repeat(run_gemm, &g2, t, c->reps, c->budget);
        report_gemm(c, "kv", B * S, D, cols[1] + cols[2], t, n);
    }

    // --- attention alone on the projected Q, K, V
    mha_options opt = mha_options_default();
    opt.causal = c->causal;
    const mha_attn_args att = {
        .cfg = &rc, .opt = &opt, .q = q, .kt = kt, .v = v, .z = z, .probs = NULL,
        .B = B, .T = T, .S = S, .S_tot = S, .S_pad = S_pad, .ldv = ldv,
        .scale = (float)(1.0 / sqrt((double)d_k)), .q_head_major = 1,
    };
    attn_call ac = {&att, kern, nt};
    n = bench_repeat(run_attn, &ac, t, c->reps, c->budget);
    printf("RESULT kind=attn_only impl=mha name=%s method=\"mha_attention (internal)\"", c->name);
    if (n < 0) {
        printf(" error=\"%s\"\n", mha_last_error());
    } else {
        bench_print_times(t, n);
        printf(" kernels=%s\n", kern->name);
    }
    fflush(stdout);

    // --- output projection Y = Z W_O + b_O
    mha_dst out = {MHA_DST_ROWS, y, (size_t)D, 0, 0, 0, 0};
    gemm_call go = {&out, z, (size_t)h * d_v, (int)rows, &o, 0, 1, h * d_v, kern, nt};
    n = bench_repeat(run_gemm, &go, t, c->reps, c->budget);
    report_gemm(c, "o", (int)rows, h * d_v, D, t, n);

    mha_packed_free(&qkv);
    mha_packed_free(&o);
    free(q); free(kt); free(v); free(z); free(y);
    return 0;
}
