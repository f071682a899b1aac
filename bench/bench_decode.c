/* bench_decode.c — one decode configuration (issue 5): per-token time of a
 * decode step at context L, for the whole layer (mha_forward_cached) and
 * for attention alone (mha_cache_attend), through the public cache API.
 *
 * The cache holds L-1 random tokens (filled with mha_cache_append, not by
 * a prefill: a 16K-token prefill per configuration would dominate the
 * run). A timed step appends token L-1 and attends over L keys; the cache
 * is then truncated back to L-1 (O(1)), so every step sees context L —
 * the PyTorch peer does the same by overwriting slot L-1.
 *
 * Shapes: x (B,1,d_model) per step; the cache's own layout (see mha.h).
 * Bytes read per step, which report.py divides by the time: the cache
 * (mha_cache_bytes, 2*B*L*h_kv*d_head*elt) for attention alone, plus the
 * fp32 weights W_Q, W_K, W_V, W_O for the whole layer.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "bench.h"
#include "mha.h"

typedef struct {
    const mha_layer *layer;
    mha_cache *cache;
    float *y;        /* (B,1,d_model) */
    const float *x;  /* (B,1,d_model) */
    float *z;        /* (B,1,h*d_v)   */
    const float *q;  /* (B,1,h*d_k)   */
    int B, L;
} decode_job;

/* One decode step at context L, then the roll-back to L-1 tokens. */
static int run_step(void *arg) {
    decode_job *j = arg;
    if (mha_forward_cached(j->layer, j->cache, j->y, NULL, j->x, 1, NULL, NULL)) return 1;
    for (int b = 0; b < j->B; b++)
        if (mha_cache_truncate(j->cache, b, j->L - 1)) return 1;
    return 0;
}

/* Attention alone for the query of position L-1 over the L cached keys. */
static int run_attend(void *arg) {
    decode_job *j = arg;
    return mha_cache_attend(j->cache, j->z, j->q, 1, NULL, 0.0f) != MHA_OK;
}

static void print_error(const char *what) {
    printf(" status=error error=\"%s: ", what);
    for (const char *p = mha_last_error(); *p; p++) putchar(*p == '"' || *p == '\n' ? '\'' : *p);
    printf("\"\n");
    fflush(stdout);
}

int bench_decode(const bench_decode_cfg *c) {
    printf("RESULT kind=decode impl=mha d_model=%d h=%d h_kv=%d d_head=%d L=%d B=%d cache=%s",
           c->d_model, c->h, c->h_kv, c->d_head, c->L, c->B, c->fp16 ? "fp16" : "fp32");
    const int D = c->d_model, nq = c->h * c->d_head, nkv = c->h_kv * c->d_head, B = c->B, L = c->L;
    uint64_t seed = 99;
    float lim = 1.0f / sqrtf((float)D);
    float *w_q = bench_alloc((size_t)D * nq), *w_k = bench_alloc((size_t)D * nkv);
    float *w_v = bench_alloc((size_t)D * nkv), *w_o = bench_alloc((size_t)nq * D);
    float *b_q = bench_alloc(nq), *b_k = bench_alloc(nkv), *b_v = bench_alloc(nkv), *b_o = bench_alloc(D);
    bench_fill(w_q, (size_t)D * nq, &seed, -lim, lim);
    bench_fill(w_k, (size_t)D * nkv, &seed, -lim, lim);
    bench_fill(w_v, (size_t)D * nkv, &seed, -lim, lim);
    bench_fill(w_o, (size_t)nq * D, &seed, -lim, lim);
    bench_fill(b_q, nq, &seed, -0.1f, 0.1f);
    bench_fill(b_k, nkv, &seed, -0.1f, 0.1f);
    bench_fill(b_v, nkv, &seed, -0.1f, 0.1f);
    bench_fill(b_o, D, &seed, -0.1f, 0.1f);
    mha_weights w = {w_q, w_k, w_v, w_o, b_q, b_k, b_v, b_o, NULL, NULL};
    mha_config cfg = mha_config_default(D, c->h);
    cfg.n_kv_heads = c->h_kv;
    cfg.d_k = c->d_head;
    cfg.bias = 1;

    mha_set_num_threads(c->threads);
    mha_layer *layer = NULL;
    mha_cache *cache = NULL;
    float *kfill = NULL, *vfill = NULL, *x = NULL, *y = NULL, *z = NULL, *q = NULL;
    if (mha_layer_create(&layer, &cfg, &w)) {
        print_error("mha_layer_create");
        goto done;
    }
    if (mha_cache_create(&cache, layer, B, L, c->fp16 ? MHA_CACHE_F16 : MHA_CACHE_F32, 0)) {
        print_error("mha_cache_create");
        goto done;
    }
    /* L-1 cached tokens of random K (B,L-1,h_kv*d_k) and V (B,L-1,h_kv*d_v) */
    kfill = bench_alloc((size_t)B * (L - 1) * nkv + 1);
    vfill = bench_alloc((size_t)B * (L - 1) * nkv + 1);
    bench_fill(kfill, (size_t)B * (L - 1) * nkv, &seed, -1.0f, 1.0f);
    bench_fill(vfill, (size_t)B * (L - 1) * nkv, &seed, -1.0f, 1.0f);
    if (L > 1 && mha_cache_append(cache, kfill, vfill, L - 1, NULL)) {
        print_error("mha_cache_append");
        goto done;
    }
    x = bench_alloc((size_t)B * D);
    y = bench_alloc((size_t)B * D);
    z = bench_alloc((size_t)B * nq);
    q = bench_alloc((size_t)B * nq);
    bench_fill(x, (size_t)B * D, &seed, -1.0f, 1.0f);
    bench_fill(q, (size_t)B * nq, &seed, -1.0f, 1.0f);
    decode_job j = {layer, cache, y, x, z, q, B, L};
    double ts[256], ta[256];
    int ns = bench_repeat(run_step, &j, ts, c->steps, 10.0);
    if (ns < 0) {
        print_error("mha_forward_cached");
        goto done;
    }
    size_t bad = 0;
    for (size_t i = 0; i < (size_t)B * D; i++) bad += !isfinite(y[i]);
    /* position L-1 present for attention alone: append one token (its K/V
     * are the step's own, already computed; random ones serve as well) */
    if (mha_cache_append(cache, kfill, vfill, 1, NULL)) {
        print_error("mha_cache_append");
        goto done;
    }
    int na = bench_repeat(run_attend, &j, ta, c->steps, 10.0);
    if (na < 0) {
        print_error("mha_cache_attend");
        goto done;
    }
    bench_print_times_as("step_", ts, ns);
    bench_print_times_as("attn_", ta, na);
    printf(" cache_bytes=%zu weight_bytes=%zu nonfinite=%zu attn_method=mha_cache_attend threads=%d\n",
           mha_cache_bytes(cache), sizeof(float) * ((size_t)D * nq * 2 + (size_t)D * nkv * 2), bad,
           c->threads);
    fflush(stdout);

done:
    mha_cache_free(cache);
    mha_layer_free(layer);
    free(kfill); free(vfill); free(x); free(y); free(z); free(q);
    free(w_q); free(w_k); free(w_v); free(w_o);
    free(b_q); free(b_k); free(b_v); free(b_o);
    return 0;
}
