/* bench_variants.c — `bench_mha variants`: what each attention variant of
 * issue 13 (RoPE, ALiBi, logit soft-capping, sinks) adds to a whole
 * mha_forward (default options, MHA_PATH_AUTO) of one configuration, P2 in
 * run.sh. One layer per variant from the same weights; the layers run
 * interleaved (plain, rope, alibi, softcap, sinks, plain, ...) so that all
 * see the same spells of load from other processes, and report.py compares
 * each with plain on the fastest runs and on the medians.
 * Legend: B, T, S = T, h, D = d_model. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "bench.h"

enum { N_VARIANTS = 5 };
static const char *const variant_names[N_VARIANTS] = {"plain", "rope", "alibi", "softcap", "sinks"};

/* The config of variant v: each switched on alone, with the settings
 * today's checkpoints use (RoPE halves over all of d_k, theta 10000;
 * ALiBi's default slopes; Gemma 2's attention cap 50; a sink per head). */
static mha_config variant_config(int d_model, int h, int v) {
    mha_config c = mha_config_default(d_model, h);
    c.bias = 1; /* as bench_prefill's layer */
    if (v == 1) c.rope.pairing = MHA_ROPE_HALVES;
    if (v == 2) c.alibi = 1;
    if (v == 3) c.softcap = 50.0f;
    if (v == 4) c.sinks = 1;
    return c;
}

int bench_variants(const bench_prefill_cfg *c) {
    const int D = c->d_model, h = c->h, B = c->B, T = c->T;
    const size_t dd = (size_t)D * D, n = (size_t)B * T * D;
    uint64_t seed = 1234;
    float *wq = bench_alloc(dd), *wk = bench_alloc(dd), *wv = bench_alloc(dd), *wo = bench_alloc(dd);
    float *bias = bench_alloc((size_t)4 * D), *sinks = bench_alloc((size_t)h);
    float *x = bench_alloc(n), *y = bench_alloc(n); /* (B,T,D) each */
    const float lim = 1.0f / sqrtf((float)D);
    bench_fill(wq, dd, &seed, -lim, lim), bench_fill(wk, dd, &seed, -lim, lim);
    bench_fill(wv, dd, &seed, -lim, lim), bench_fill(wo, dd, &seed, -lim, lim);
    bench_fill(bias, (size_t)4 * D, &seed, -0.1f, 0.1f);
    bench_fill(sinks, (size_t)h, &seed, -1.0f, 1.0f);
    bench_fill(x, n, &seed, -1.0f, 1.0f);
    mha_weights w = {.w_q = wq, .w_k = wk, .w_v = wv, .w_o = wo, .b_q = bias, .b_k = bias + D,
                     .b_v = bias + 2 * D, .b_o = bias + 3 * D};
    mha_set_num_threads(c->threads);
    mha_options opt = mha_options_default();
    opt.causal = c->causal;

    mha_layer *L[N_VARIANTS] = {NULL};
    static double t[N_VARIANTS][256];
    int ok = 1, runs = c->reps < 256 ? c->reps : 256;
    for (int v = 0; v < N_VARIANTS && ok; v++) {
        mha_config cfg = variant_config(D, h, v);
        w.sinks = cfg.sinks ? sinks : NULL; /* given only to the layer that has them */
        ok = mha_layer_create(&L[v], &cfg, &w) == MHA_OK &&
             mha_forward(L[v], y, NULL, x, NULL, B, T, T, &opt) == MHA_OK; /* warm-up */
    }
    /* rounds of one run per variant, until reps rounds or the budget */
    const double start = bench_now();
    int done = 0;
    for (; ok && done < runs && (done == 0 || bench_now() - start < c->budget); done++)
        for (int v = 0; v < N_VARIANTS && ok; v++) {
            const double t0 = bench_now();
            ok = mha_forward(L[v], y, NULL, x, NULL, B, T, T, &opt) == MHA_OK;
            t[v][done] = bench_now() - t0;
        }
    for (int v = 0; v < N_VARIANTS; v++) {
        printf("RESULT kind=variant impl=mha name=%s B=%d T=%d d_model=%d h=%d causal=%d variant=%s", c->name, B,
               T, D, h, c->causal, variant_names[v]);
        if (ok) bench_print_times(t[v], done), printf("\n");
        else printf(" error=\"%s\"\n", mha_last_error());
        mha_layer_free(L[v]);
    }
    fflush(stdout);
    free(wq), free(wk), free(wv), free(wo), free(bias), free(sinks), free(x), free(y);
    return ok ? 0 : 1;
}
