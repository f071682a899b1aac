/* bench_backward.c — `bench_mha backward`: the training step of one layer.
 * Times mha_backward (MHA_PATH_AUTO: the fast backward) with every
 * gradient requested (dx, dW_*, db_*), forward then backward, and the
 * attention part of the fast backward alone (backward_attention.c's two
 * passes on the same layouts backward_fast.c uses, with the kernels the
 * chooser picks), against the FMA peak of that ISA (AVX-512 or AVX2)
 * measured in the same process. peer_torch.py backward times torch's
 * nn.MultiheadAttention autograd on the same shapes.
 *
 * FLOP counts (causal counts the T*S/2 allowed pairs, as FlashAttention):
 *   useful  = FlashAttention-2's backward count, 2.5x the forward's
 *             4*B*h*T*S*d: S recomputed, dP, dV, dK, dQ;
 *   executed = what the two passes run: S and P V (pass 1: the API keeps no
 *             forward state, so lse is recomputed), then those five
 *             (pass 2) = 7 products of 2*B*h*T*S*d.
 * Legend: B, T, S = T, h, d = d_model / h, D = d_model. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "compute/exec.h"
#include "forward/backward_fast.h"

typedef struct {
    const mha_layer *L;
    const mha_gradients *g;
    float *y;                 /* (B,T,D) */
    const float *x, *dy;      /* (B,T,D) */
    int B, T, with_forward;
    const mha_options *opt;
} step_job;

static int run_step(void *arg) {
    const step_job *j = arg;
    if (j->with_forward && mha_forward(j->L, j->y, NULL, j->x, NULL, j->B, j->T, j->T, j->opt)) return 1;
    return mha_backward(j->L, j->g, j->dy, j->x, NULL, j->B, j->T, j->T, j->opt) != MHA_OK;
}

typedef struct {
    const mha_bwd_attn *a;
    const mha_kernels *kern;
    const mha_backward_kernels *bk;
    int nt;
} attn_job;

static int run_attention(void *arg) {
    const attn_job *j = arg;
    long masked;
    return mha_bwd_attention_forward(j->a, j->kern, j->bk, j->nt, &masked) ||
           mha_bwd_attention_backward(j->a, j->kern, j->bk, j->nt);
}

int bench_backward(const bench_prefill_cfg *c) {
    const int B = c->B, T = c->T, D = c->d_model, h = c->h, d = D / h;
    const size_t act = (size_t)B * T * D;
    uint64_t seed = 42;
    mha_config cfg = mha_config_default(D, h);
    mha_layer *L = NULL;
    float *w = bench_alloc((size_t)4 * D * D + 4 * D);           /* W_Q W_K W_V W_O, biases */
    float *gw = bench_alloc((size_t)4 * D * D + 4 * D);          /* their gradients */
    float *x = bench_alloc(act), *dy = bench_alloc(act), *y = bench_alloc(act), *dx = bench_alloc(act);
    bench_fill(w, (size_t)4 * D * D + 4 * D, &seed, -0.05f, 0.05f);
    bench_fill(x, act, &seed, -1.0f, 1.0f);
    bench_fill(dy, act, &seed, -1.0f, 1.0f);
    const size_t dd = (size_t)D * D;
    mha_weights wv = {.w_q = w, .w_k = w + dd, .w_v = w + 2 * dd, .w_o = w + 3 * dd,
                      .b_q = w + 4 * dd, .b_k = w + 4 * dd + D, .b_v = w + 4 * dd + 2 * D,
                      .b_o = w + 4 * dd + 3 * D};
    if (mha_layer_create(&L, &cfg, &wv)) {
        fprintf(stderr, "bench backward: %s\n", mha_last_error());
        return 1;
    }
    mha_set_num_threads(c->threads);
    mha_options opt = mha_options_default();
    opt.causal = c->causal;
    mha_gradients g = {dx, NULL, NULL, gw, gw + dd, gw + 2 * dd, gw + 3 * dd,
                       gw + 4 * dd, gw + 4 * dd + D, gw + 4 * dd + 2 * D, gw + 4 * dd + 3 * D,
                       NULL, NULL, NULL, NULL, NULL};
    double t[256];
    const char *parts[2] = {"backward", "forward_backward"};
    for (int p = 0; p < 2; p++) {
        step_job j = {L, &g, y, x, dy, B, T, p, &opt};
        int n = bench_repeat(run_step, &j, t, c->reps, c->budget);
        printf("RESULT kind=backward impl=mha part=%s name=%s B=%d T=%d d_model=%d h=%d causal=%d", parts[p],
               c->name, B, T, D, h, c->causal);
        if (n < 0) printf(" error=\"%s\"\n", mha_last_error());
        else bench_print_times(t, n), printf(" threads=%d\n", c->threads);
        fflush(stdout);
    }

    // --- the attention part alone, on random Q, K, V, dZ
    float *q = bench_alloc(act), *k = bench_alloc(act), *v = bench_alloc(act), *z = bench_alloc(act);
    float *dz = bench_alloc(act), *lse = bench_alloc((size_t)B * h * T);
    bench_fill(q, act, &seed, -1.0f, 1.0f), bench_fill(k, act, &seed, -1.0f, 1.0f);
    bench_fill(v, act, &seed, -1.0f, 1.0f), bench_fill(dz, act, &seed, -1.0f, 1.0f);
    mha_config rc = cfg;
    rc.n_kv_heads = h, rc.d_k = rc.d_v = d, rc.d_kv_in = rc.d_v_in = D;
    /* dq into z's buffer and dk, dv into k, v, as backward_fast.c does; the
     * values drift between runs but stay finite, the cost does not change */
    const mha_bwd_attn a = {&rc, &opt, q, k, v, z, lse, dz, z, k, v, B, T, T, T, 1.0f / 8.0f};
    mha_exec ex;
    if (mha_exec_resolve(&ex, NULL)) ex.isa = mha_isa_best();
    attn_job aj = {&a, mha_exec_prefill(&ex), mha_exec_backward(&ex), c->threads};
    int n = bench_repeat(run_attention, &aj, t, c->reps, c->budget);
    const double pairs = (double)B * h * T * T * (c->causal ? 0.5 : 1.0);
    const double useful = 2.5 * 4.0 * pairs * d, executed = 7.0 * 2.0 * pairs * d;
    const int avx512 = !strcmp(aj.kern->name, "avx512");
    double peak_med, peak = avx512 ? bench_fma_peak_avx512(c->threads, 20000000, 5, &peak_med)
                                   : bench_fma_peak_avx2(c->threads, 20000000, 5, &peak_med);
    printf("RESULT kind=backward impl=mha part=attention name=%s B=%d T=%d d_model=%d h=%d causal=%d", c->name,
           B, T, D, h, c->causal);
    if (n < 0) {
        printf(" error=\"%s\"\n", mha_last_error());
    } else {
        const double best = bench_min(t, n);
        bench_print_times(t, n);
        printf(" useful_gflop=%.3f executed_gflop=%.3f useful_gflops=%.2f executed_gflops=%.2f "
               "fma_peak_gflops=%.2f useful_of_peak=%.3f executed_of_peak=%.3f kernels=%s threads=%d\n",
               useful * 1e-9, executed * 1e-9, useful * 1e-9 / best, executed * 1e-9 / best, peak,
               useful * 1e-9 / best / peak, executed * 1e-9 / best / peak, aj.kern->name,
               c->threads);
    }
    fflush(stdout);
    free(q), free(k), free(v), free(z), free(dz), free(lse);
    free(w), free(gw), free(x), free(dy), free(y), free(dx);
    mha_layer_free(L);
    return n < 0;
}
