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

#include "bench_fast.h"
#include "forward/attention.h"
#include "forward/forward.h"

int bench_run_gemm(void *arg) {
    const bench_gemm_case *g = arg;
    return mha_gemm(&g->args, g->kern, g->nt) != MHA_OK;
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

int bench_fast_init(bench_fast *f, const bench_prefill_cfg *c, const mha_weights *w, const float *x,
                    const float *kv) {
    *f = (bench_fast){0};
    mha_config cfg = mha_config_default(c->d_model, c->h);
    cfg.bias = 1;
    if (mha_config_resolve(&f->rc, &cfg)) return -1;
    const mha_config *rc = &f->rc;
    const mha_kernels *kern = mha_kernels_get();
    const int nt = c->threads, D = rc->d_model, h = rc->n_heads, h_kv = rc->n_kv_heads;
    const int d_k = rc->d_k, d_v = rc->d_v, B = c->B, T = c->T, S = c->cross ? c->S : c->T;
    const int S_pad = (int)round16((size_t)S), ldv = (int)round16((size_t)d_v);
    const int rows = B * T;
    f->S = S, f->S_pad = S_pad, f->ldv = ldv;

    /* packed as mha_fast_prepare packs them (d_kv_in == d_model: fused) */
    const float *const wq[3] = {w->w_q, w->w_k, w->w_v}, *const bq[3] = {w->b_q, w->b_k, w->b_v};
    const int cols[3] = {h * d_k, h_kv * d_k, h_kv * d_v};
    const float *const wo[1] = {w->w_o}, *const bo[1] = {w->b_o};
    if (mha_pack(&f->qkv, D, 3, wq, bq, cols)) return -1;
    if (mha_pack(&f->o, h * d_v, 1, wo, bo, &D)) {
        mha_packed_free(&f->qkv);
        return -1;
    }

    f->q = bench_alloc((size_t)rows * h * d_k);                /* (B,h,T,d_k), head-major   */
    f->kt = bench_alloc((size_t)B * h_kv * S_pad * d_k);       /* (B,h_kv,S_pad/16,d_k,16) */
    f->v = bench_alloc((size_t)B * h_kv * S_pad * ldv);        /* (B,h_kv,S_pad,ldv)        */
    f->z = bench_alloc((size_t)rows * h * d_v);                /* (B,T,h*d_v)               */
    f->y = bench_alloc((size_t)rows * D);                      /* (B,T,D)                   */
    f->dst[0] = (mha_dst){MHA_DST_HEADS, f->q, (size_t)d_k, d_k, h, T, (size_t)T * d_k};
    f->dst[1] = (mha_dst){MHA_DST_HEADS_T, f->kt, 0, d_k, h_kv, S, (size_t)S_pad * d_k};
    f->dst[2] = (mha_dst){MHA_DST_HEADS, f->v, (size_t)ldv, d_v, h_kv, S, (size_t)S_pad * ldv};
    f->out = (mha_dst){MHA_DST_ROWS, f->y, (size_t)D, 0, 0, 0, 0};

    // --- projections Q, K, V into attention's layouts (one fused pass for self-attention), then O
    bench_gemm_case *g = f->gemm;
    if (!c->cross) {
        *g++ = (bench_gemm_case){"qkv", rows, D, cols[0] + cols[1] + cols[2],
                                 {f->dst, x, (size_t)D, rows, &f->qkv, 0, 3, 0, D, 1, 0}, kern, nt};
    } else {
        *g++ = (bench_gemm_case){"q", rows, D, cols[0], {f->dst, x, (size_t)D, rows, &f->qkv, 0, 1, 0, D, 1, 0},
                                 kern, nt};
        *g++ = (bench_gemm_case){"kv", B * S, D, cols[1] + cols[2],
                                 {f->dst + 1, kv, (size_t)D, B * S, &f->qkv, 1, 3, 0, D, 1, 0}, kern, nt};
    }
    *g++ = (bench_gemm_case){"o", rows, h * d_v, D,
                             {&f->out, f->z, (size_t)h * d_v, rows, &f->o, 0, 1, 0, h * d_v, 1, 0}, kern, nt};
    f->n_gemm = (int)(g - f->gemm);
    return 0;
}

void bench_fast_free(bench_fast *f) {
    mha_packed_free(&f->qkv);
    mha_packed_free(&f->o);
    free(f->q); free(f->kt); free(f->v); free(f->z); free(f->y);
}

static void report_gemm(const bench_prefill_cfg *c, const bench_gemm_case *g, const double *t, int n) {
    printf("RESULT kind=gemm impl=mha_gemm name=%s gemm=%s M=%d K=%d N=%d bias=1", c->name, g->gemm, g->M,
           g->K, g->N);
    if (n < 0) {
        printf(" error=\"%s\"\n", mha_last_error());
    } else {
        bench_print_times(t, n);
        printf(" kernels=%s\n", g->kern->name);
    }
    fflush(stdout);
}

int bench_fast_parts(const bench_prefill_cfg *c, const mha_weights *w, const float *x,
                     const float *kv) {
    bench_fast f;
    if (bench_fast_init(&f, c, w, x, kv)) return -1;
    const mha_kernels *kern = mha_kernels_get();
    double t[256];
    int n;

    // --- projections Q, K, V (every case but the last, O)
    for (int i = 0; i + 1 < f.n_gemm; i++) {
        n = bench_repeat(bench_run_gemm, &f.gemm[i], t, c->reps, c->budget);
        report_gemm(c, &f.gemm[i], t, n);
    }

    // --- attention alone on the projected Q, K, V
    mha_options opt = mha_options_default();
    opt.causal = c->causal;
    const mha_attn_args att = {
        .cfg = &f.rc, .opt = &opt, .q = f.q, .kt = f.kt, .v = f.v, .z = f.z, .probs = NULL,
        .B = c->B, .T = c->T, .S = f.S, .S_tot = f.S, .S_pad = f.S_pad, .ldv = f.ldv,
        .scale = (float)(1.0 / sqrt((double)f.rc.d_k)), .q_head_major = 1,
    };
    attn_call ac = {&att, kern, c->threads};
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
    bench_gemm_case *go = &f.gemm[f.n_gemm - 1];
    n = bench_repeat(bench_run_gemm, go, t, c->reps, c->budget);
    report_gemm(c, go, t, n);

    bench_fast_free(&f);
    return 0;
}
