/* bench_variants.c — `bench_mha variants`: what each attention variant of
 * issue 13 (RoPE, ALiBi, logit soft-capping, sinks) adds to a whole
 * mha_forward (default options, MHA_PATH_AUTO) of one configuration, P2 in
 * run.sh; `bench_mha variants-backward`: the same for mha_backward (the
 * fast backward, every gradient the layer has: dx, dW_*, db_*, dsinks,
 * the QK-norm weights'); clip_qkv and the query temperature in both, QK-norm in the backward's
 * alone. One layer per variant from the same weights; the layers run interleaved (plain, rope, alibi,
 * ..., plain, ...) so that all see the same spells of load from other
 * processes, and report.py compares each with plain on the fastest runs
 * and on the medians.
 * Legend: B, T, S = T, h, D = d_model, d = D / h. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "bench.h"

enum { N_VARIANTS = 8 };
static const char *const variant_names[N_VARIANTS] = {"plain", "rope", "alibi", "softcap", "sinks", "clip",
                                                      "temp", "qknorm"};

/* The config of variant v: each switched on alone, with the settings
 * today's checkpoints use (RoPE halves over all of d_k, theta 10000;
 * ALiBi's default slopes; Gemma 2's attention cap 50; a sink per head;
 * Qwen 3's RMS QK-norm, weights shared by the heads; DBRX's clip_qkv 8;
 * Llama 4's query temperature with a floor of 64 instead of 8192, so that
 * the benchmark's queries see several factors). */
static mha_config variant_config(int d_model, int h, int v) {
    mha_config c = mha_config_default(d_model, h);
    c.bias = 1; /* as bench_prefill's layer */
    if (v == 1) c.rope.pairing = MHA_ROPE_HALVES;
    if (v == 2) c.alibi = 1;
    if (v == 3) c.softcap = 50.0f;
    if (v == 4) c.sinks = 1;
    if (v == 5) c.clip_qkv = 8.0f;
    if (v == 6) c.temperature_floor = 64, c.temperature_scale = 0.1f;
    if (v == 7) c.qk_norm = MHA_QK_NORM_RMS;
    return c;
}

/* One layer per variant, its buffers and the call's options. */
typedef struct {
    mha_layer *L[N_VARIANTS];
    float *w, *x, *y, *dy; /* weights (4 D^2 + 4 D + h + 2 d), x, y, dy (B,T,D) */
    mha_options opt;
} variant_set;

static void set_free(variant_set *s) {
    for (int v = 0; v < N_VARIANTS; v++) mha_layer_free(s->L[v]);
    free(s->w), free(s->x), free(s->y), free(s->dy);
}

/* The layers of the first n variants from one set of random weights; 0 when one fails. */
static int set_make(variant_set *s, const bench_prefill_cfg *c, int n) {
    const int D = c->d_model, h = c->h, d = D / h;
    const size_t dd = (size_t)D * D, nx = (size_t)c->B * c->T * D;
    uint64_t seed = 1234;
    s->w = bench_alloc(4 * dd + 4 * (size_t)D + (size_t)h + 2 * (size_t)d);
    s->x = bench_alloc(nx), s->y = bench_alloc(nx), s->dy = bench_alloc(nx);
    float *wq = s->w, *wk = wq + dd, *wv = wk + dd, *wo = wv + dd, *bias = wo + dd, *sinks = bias + 4 * D;
    float *norms = sinks + h; /* q_norm (d), k_norm (d) */
    const float lim = 1.0f / sqrtf((float)D);
    bench_fill(wq, 4 * dd, &seed, -lim, lim);
    bench_fill(bias, (size_t)4 * D, &seed, -0.1f, 0.1f);
    bench_fill(sinks, (size_t)h, &seed, -1.0f, 1.0f);
    bench_fill(norms, 2 * (size_t)d, &seed, 0.5f, 1.5f);
    bench_fill(s->x, nx, &seed, -1.0f, 1.0f);
    bench_fill(s->dy, nx, &seed, -1.0f, 1.0f);
    mha_weights w = {.w_q = wq, .w_k = wk, .w_v = wv, .w_o = wo, .b_q = bias, .b_k = bias + D,
                     .b_v = bias + 2 * D, .b_o = bias + 3 * D};
    s->opt = mha_options_default();
    s->opt.causal = c->causal;
    mha_set_num_threads(c->threads);
    for (int v = 0; v < n; v++) {
        const mha_config cfg = variant_config(D, h, v);
        w.sinks = cfg.sinks ? sinks : NULL; /* given only to the layers that have them */
        w.q_norm = cfg.qk_norm ? norms : NULL, w.k_norm = cfg.qk_norm ? norms + d : NULL;
        if (mha_layer_create(&s->L[v], &cfg, &w) != MHA_OK) return 0;
    }
    return 1;
}

/* What one timed call runs: the forward, or the backward with every gradient. */
typedef struct {
    const variant_set *s;
    const bench_prefill_cfg *c;
    float *g;            /* gradient buffers, one block */
    mha_gradients grads; /* into g; d_sinks / norms set per layer */
} call_args;

static int run_forward(const call_args *a, int v) {
    const variant_set *s = a->s;
    return mha_forward(s->L[v], s->y, NULL, s->x, NULL, a->c->B, a->c->T, a->c->T, &s->opt) == MHA_OK;
}

static int run_backward(const call_args *a, int v) {
    const variant_set *s = a->s;
    mha_gradients g = a->grads;
    const mha_config *c = mha_layer_config(s->L[v]); /* the gradients this variant's layer has */
    if (!c->sinks) g.d_sinks = NULL;
    if (!c->qk_norm) g.d_q_norm = g.d_k_norm = NULL;
    return mha_backward(s->L[v], &g, s->dy, s->x, NULL, a->c->B, a->c->T, a->c->T, &s->opt) == MHA_OK;
}

/* Rounds of one call per variant (n of them), until reps rounds or the
 * budget; RESULT lines of kind `kind`. */
static int time_rounds(const call_args *a, int (*call)(const call_args *, int), int n, const char *kind) {
    const bench_prefill_cfg *c = a->c;
    static double t[N_VARIANTS][256];
    const int runs = c->reps < 256 ? c->reps : 256;
    int ok = 1;
    for (int v = 0; v < n && ok; v++) ok = call(a, v); /* warm-up */
    const double start = bench_now();
    int done = 0;
    for (; ok && done < runs && (done == 0 || bench_now() - start < c->budget); done++)
        for (int v = 0; v < n && ok; v++) {
            const double t0 = bench_now();
            ok = call(a, v);
            t[v][done] = bench_now() - t0;
        }
    for (int v = 0; v < n; v++) {
        printf("RESULT kind=%s impl=mha name=%s B=%d T=%d d_model=%d h=%d causal=%d variant=%s", kind, c->name,
               c->B, c->T, c->d_model, c->h, c->causal, variant_names[v]);
        if (ok) bench_print_times(t[v], done), printf("\n");
        else printf(" error=\"%s\"\n", mha_last_error());
    }
    fflush(stdout);
    return ok;
}

int bench_variants(const bench_prefill_cfg *c) {
    variant_set s = {0};
    int ok = set_make(&s, c, N_VARIANTS - 1); /* the forward's table: the four of issue 13, clip_qkv, temperature */
    const call_args a = {&s, c, NULL, {0}};
    if (ok) ok = time_rounds(&a, run_forward, N_VARIANTS - 1, "variant");
    else printf("RESULT kind=variant impl=mha name=%s error=\"%s\"\n", c->name, mha_last_error());
    set_free(&s);
    return ok ? 0 : 1;
}

int bench_variants_backward(const bench_prefill_cfg *c) {
    const int D = c->d_model, h = c->h, d = D / h;
    const size_t dd = (size_t)D * D, nx = (size_t)c->B * c->T * D;
    variant_set s = {0};
    int ok = set_make(&s, c, N_VARIANTS);
    call_args a = {&s, c, bench_alloc(nx + 4 * dd + 4 * (size_t)D + (size_t)h + 2 * (size_t)d), {0}};
    float *g = a.g; /* dx (B,T,D), dW_Q..dW_O (D,D) each, db_* (D) each, d_sinks (h), d_q/k_norm (d) */
    a.grads = (mha_gradients){.dx = g, .dw_q = g + nx, .dw_k = g + nx + dd, .dw_v = g + nx + 2 * dd,
                              .dw_o = g + nx + 3 * dd, .db_q = g + nx + 4 * dd, .db_k = g + nx + 4 * dd + D,
                              .db_v = g + nx + 4 * dd + 2 * D, .db_o = g + nx + 4 * dd + 3 * D,
                              .d_sinks = g + nx + 4 * dd + 4 * D, .d_q_norm = g + nx + 4 * dd + 4 * D + h,
                              .d_k_norm = g + nx + 4 * dd + 4 * D + h + d};
    if (ok) ok = time_rounds(&a, run_backward, N_VARIANTS, "variant_backward");
    else printf("RESULT kind=variant_backward impl=mha name=%s error=\"%s\"\n", c->name, mha_last_error());
    set_free(&s);
    free(a.g);
    return ok ? 0 : 1;
}
