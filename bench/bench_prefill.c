/* bench_prefill.c — one prefill/encoder configuration: the whole
 * mha_forward (default options, MHA_PATH_AUTO), the fast path's parts
 * timed apart (bench_internal.c: its GEMMs, its attention kernel), and its
 * projection GEMMs paired with OpenBLAS sgemm (bench_gemm.c).
 *
 * Projection shapes: self-attention fuses Q, K, V into one GEMM
 * (M = B*T, K = d_model, N = 3*d_model); cross-attention runs Q
 * (M = B*T, N = d_model) and fused K, V (M = B*S, N = 2*d_model); then O
 * (M = B*T, K = d_model, N = d_model). That is what mha_forward_fast runs.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "kernels/kernels.h"
#include "mha.h"

/* ------------------------------------------------------- mha_forward */

typedef struct {
    const mha_layer *layer;
    float *y;        /* (B,T,d_model) */
    const float *x;  /* (B,T,d_model) */
    const float *kv; /* (B,S,d_model) or NULL for self-attention */
    int B, T, S;
    const mha_options *opt;
    mha_status st;
} forward_job;

static int run_forward(void *arg) {
    forward_job *j = arg;
    j->st = mha_forward(j->layer, j->y, NULL, j->x, j->kv, j->B, j->T, j->S, j->opt);
    return j->st != MHA_OK;
}

/* Prints an error as a quoted value without the characters that would end it. */
static void print_error(const char *msg) {
    printf(" error=\"");
    for (const char *p = msg; *p; p++) putchar(*p == '"' || *p == '\n' ? '\'' : *p);
    printf("\"");
}

/* Which path MHA_PATH_AUTO takes: the reference when MHA_KERNELS=reference,
 * else the fast path unless it answers MHA_E_UNSUPPORTED for this request
 * (then AUTO falls back to the reference). One probing run decides. */
static const char *auto_path(forward_job *j) {
    const char *e = getenv("MHA_KERNELS");
    if (e && !strcmp(e, "reference")) return "reference";
    mha_options o = *j->opt;
    o.path = MHA_PATH_FAST;
    mha_status st = mha_forward(j->layer, j->y, NULL, j->x, j->kv, j->B, j->T, j->S, &o);
    return st == MHA_OK ? "fast" : st == MHA_E_UNSUPPORTED ? "reference(fallback)" : "error";
}

/* Times mha_forward on the layer made from w and prints its RESULT line. */
static void bench_forward(const bench_prefill_cfg *c, const mha_weights *w, const float *x,
                          const float *kv, float *y) {
    const int d = c->d_model, S = c->cross ? c->S : c->T;
    mha_config cfg = mha_config_default(d, c->h);
    cfg.bias = 1; /* as nn.MultiheadAttention's default */
    mha_set_num_threads(c->threads);
    mha_layer *layer = NULL;
    mha_status st = mha_layer_create(&layer, &cfg, w);
    if (!st && c->bf16) st = mha_layer_convert_weights(layer, MHA_W_BF16);
    printf("RESULT kind=prefill impl=%s name=%s B=%d T=%d S=%d d_model=%d h=%d causal=%d cross=%d",
           c->bf16 ? "mha_bf16" : "mha", c->name, c->B, c->T, S, d, c->h, c->causal, c->cross);
    if (c->bf16) printf(" amx=%d", mha_cpu_has_amx_bf16());
    if (st != MHA_OK) {
        print_error(mha_last_error());
        printf(" status=%d\n", (int)st);
    } else {
        mha_options opt = mha_options_default();
        opt.causal = c->causal;
        opt.bf16_matmul = c->bf16;
        forward_job j = {layer, y, x, kv, c->B, c->T, S, &opt, MHA_OK};
        const char *path = auto_path(&j);
        double t[256];
        int n = bench_repeat(run_forward, &j, t, c->reps, c->budget);
        if (n < 0) {
            print_error(mha_last_error());
            printf(" status=%d\n", (int)j.st);
        } else {
            /* A benchmark of a wrong answer is worthless: check it is finite. */
            size_t bad = 0, ny = (size_t)c->B * c->T * d;
            for (size_t i = 0; i < ny; i++) bad += !isfinite(y[i]);
            bench_print_times(t, n);
            printf(" nonfinite=%zu path=%s\n", bad, path);
        }
    }
    fflush(stdout);
    mha_layer_free(layer);

}

/* ------------------------------------------------- dump for the ORT peer */

/* dir/name.f32: n raw little-endian float32 values; 0 on success. */
static int dump_floats(const char *dir, const char *name, const float *p, size_t n) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s.f32", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f) return 1;
    size_t wrote = fwrite(p, sizeof(float), n, f);
    return (fclose(f) != 0) | (wrote != n);
}

/* The weights, x (kv) and mha_forward's y of this configuration, so that
 * bench/peer_ort.py builds its ONNX models from the same numbers and
 * checks ORT's output against libmha's before timing it. */
static void dump_case(const bench_prefill_cfg *c, const mha_weights *w, const float *x,
                      const float *kv, const float *y) {
    const size_t d = (size_t)c->d_model, dd = d * d, S = c->cross ? c->S : c->T;
    int bad = dump_floats(c->dump, "w_q", w->w_q, dd) | dump_floats(c->dump, "w_k", w->w_k, dd) |
              dump_floats(c->dump, "w_v", w->w_v, dd) | dump_floats(c->dump, "w_o", w->w_o, dd) |
              dump_floats(c->dump, "b_q", w->b_q, d) | dump_floats(c->dump, "b_k", w->b_k, d) |
              dump_floats(c->dump, "b_v", w->b_v, d) | dump_floats(c->dump, "b_o", w->b_o, d) |
              dump_floats(c->dump, "x", x, (size_t)c->B * c->T * d) |
              dump_floats(c->dump, "y", y, (size_t)c->B * c->T * d);
    if (kv) bad |= dump_floats(c->dump, "kv", kv, (size_t)c->B * S * d);
    printf("RESULT kind=dump name=%s dir=%s ok=%d\n", c->name, c->dump, !bad);
    fflush(stdout);
}

/* --------------------------------------------------------------- main */

int bench_prefill(const bench_prefill_cfg *c) {
    int d = c->d_model;
    uint64_t seed = 1234;
    size_t dd = (size_t)d * d;
    float *w_q = bench_alloc(dd), *w_k = bench_alloc(dd), *w_v = bench_alloc(dd), *w_o = bench_alloc(dd);
    float *b_q = bench_alloc(d), *b_k = bench_alloc(d), *b_v = bench_alloc(d), *b_o = bench_alloc(d);
    float lim = 1.0f / sqrtf((float)d);
    bench_fill(w_q, dd, &seed, -lim, lim);
    bench_fill(w_k, dd, &seed, -lim, lim);
    bench_fill(w_v, dd, &seed, -lim, lim);
    bench_fill(w_o, dd, &seed, -lim, lim);
    bench_fill(b_q, d, &seed, -0.1f, 0.1f);
    bench_fill(b_k, d, &seed, -0.1f, 0.1f);
    bench_fill(b_v, d, &seed, -0.1f, 0.1f);
    bench_fill(b_o, d, &seed, -0.1f, 0.1f);
    mha_weights w = {.w_q = w_q, .w_k = w_k, .w_v = w_v, .w_o = w_o, .b_q = b_q, .b_k = b_k, .b_v = b_v, .b_o = b_o};

    int S = c->cross ? c->S : c->T;
    float *x = bench_alloc((size_t)c->B * c->T * d);                 /* (B,T,d_model) */
    float *kv = c->cross ? bench_alloc((size_t)c->B * S * d) : NULL; /* (B,S,d_model) */
    float *y = bench_alloc((size_t)c->B * c->T * d);                 /* (B,T,d_model) */
    bench_fill(x, (size_t)c->B * c->T * d, &seed, -1.0f, 1.0f);
    if (kv) bench_fill(kv, (size_t)c->B * S * d, &seed, -1.0f, 1.0f);

    if (c->mha) bench_forward(c, &w, x, kv, y);
    if (c->mha && c->dump && !c->bf16) dump_case(c, &w, x, kv, y);

    if (c->blas && bench_gemm_paired(c, &w, x, kv))
        printf("RESULT kind=gemm_pair name=%s error=\"%s\"\n", c->name, mha_last_error());

    if (c->mha && !c->bf16 && bench_fast_parts(c, &w, x, kv))
        printf("RESULT kind=attn_only impl=mha name=%s error=\"%s\"\n", c->name, mha_last_error());

    free(w_q); free(w_k); free(w_v); free(w_o);
    free(b_q); free(b_k); free(b_v); free(b_o);
    free(x); free(kv); free(y);
    return 0;
}
