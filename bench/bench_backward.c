/* bench_backward.c — `bench_mha backward`: the training step of one layer.
 * Times, interleaved round by round, with every gradient requested (dx,
 * dW_*, db_*): the stateless mha_backward (MHA_PATH_AUTO: the fast
 * backward, which recomputes the forward's Q, K, V, Z and lse), mha_forward
 * then mha_backward, mha_backward_tape from a tape made once, and
 * mha_forward_train then mha_backward_tape; then the attention part of the
 * fast backward alone (backward_attention.c on the layouts backward_fast.c
 * uses, with the kernels the chooser picks), both passes (stateless) and
 * pass 2 alone (the tape's), against the FMA peak of that ISA (AVX-512 or
 * AVX2) measured in the same process. peer_torch.py backward times torch's
 * nn.MultiheadAttention autograd on the same shapes.
 *
 * FLOP counts (causal counts the T*S/2 allowed pairs, as FlashAttention):
 *   useful  = FlashAttention-2's backward count, 2.5x the forward's
 *             4*B*h*T*S*d: S recomputed, dP, dV, dK, dQ;
 *   executed = the products of 2*B*h*T*S*d each run: 7 stateless (pass 1's
 *             S and P V recompute Z and lse, then pass 2's five), 5 from a
 *             tape (pass 2 alone: executed = useful).
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
    int B, T;
    const mha_options *opt;
    const mha_tape *tape;     /* for the tape backward alone: made once */
} step_job;

static int run_backward(void *arg) {
    const step_job *j = arg;
    return mha_backward(j->L, j->g, j->dy, j->x, NULL, j->B, j->T, j->T, j->opt) != MHA_OK;
}

static int run_forward_backward(void *arg) {
    const step_job *j = arg;
    return mha_forward(j->L, j->y, NULL, j->x, NULL, j->B, j->T, j->T, j->opt) || run_backward(arg);
}

static int run_backward_tape(void *arg) {
    const step_job *j = arg;
    return mha_backward_tape(j->L, j->tape, j->g, j->dy, j->x, NULL, NULL, j->B, j->T, j->T, j->opt) != MHA_OK;
}

static int run_forward_backward_tape(void *arg) {
    const step_job *j = arg;
    mha_tape *tape = NULL;
    const int bad = mha_forward_train(j->L, j->y, &tape, j->x, NULL, NULL, j->B, j->T, j->T, j->opt) ||
                    mha_backward_tape(j->L, tape, j->g, j->dy, j->x, NULL, NULL, j->B, j->T, j->T, j->opt);
    mha_tape_free(tape);
    return bad;
}

typedef struct {
    const mha_bwd_attn *a;
    const mha_kernels *kern;
    const mha_backward_kernels *bk;
    int nt;
} attn_job;

/* Both passes: Z and lse recomputed, then the gradients (stateless). */
static int run_attention(void *arg) {
    const attn_job *j = arg;
    long masked;
    return mha_bwd_attention_forward(j->a, j->kern, j->bk, j->nt, &masked) ||
           mha_bwd_attention_backward(j->a, j->kern, j->bk, j->nt);
}

/* Pass 2 alone, from the Z and lse a tape holds. */
static int run_attention_tape(void *arg) {
    const attn_job *j = arg;
    return mha_bwd_attention_backward(j->a, j->kern, j->bk, j->nt) != MHA_OK;
}

#define MAX_RUNS 256

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
                       NULL, NULL, NULL, NULL, NULL, NULL, NULL};
    static double t[4 * MAX_RUNS];
    const int runs = c->reps < MAX_RUNS ? c->reps : MAX_RUNS;
    mha_tape *tape = NULL;
    if (mha_forward_train(L, y, &tape, x, NULL, NULL, B, T, T, &opt)) {
        fprintf(stderr, "bench backward: %s\n", mha_last_error());
        return 1;
    }
    step_job j = {L, &g, y, x, dy, B, T, &opt, tape};
    const char *parts[4] = {"backward", "forward_backward", "backward_tape", "forward_backward_tape"};
    int (*const steps[4])(void *) = {run_backward, run_forward_backward, run_backward_tape, run_forward_backward_tape};
    void *const step_args[4] = {&j, &j, &j, &j};
    int n = bench_rounds(steps, step_args, 4, t, runs, 4 * c->budget);
    for (int p = 0; p < 4; p++) {
        printf("RESULT kind=backward impl=mha part=%s name=%s B=%d T=%d d_model=%d h=%d causal=%d", parts[p],
               c->name, B, T, D, h, c->causal);
        if (n < 0) printf(" error=\"%s\"\n", mha_last_error());
        else bench_print_times(t + (size_t)p * runs, n), printf(" threads=%d\n", c->threads);
        fflush(stdout);
    }
    mha_tape_free(tape);

    // --- the attention part alone, on random Q, K, V, dZ
    float *q = bench_alloc(act), *k = bench_alloc(act), *v = bench_alloc(act), *z = bench_alloc(act);
    const size_t nl = (size_t)B * h * T;
    float *dz = bench_alloc(act), *lse = bench_alloc(2 * nl); /* log l, then the row max (B,h,T) */
    float *dq = bench_alloc(act), *dk = bench_alloc(act), *dv = bench_alloc(act);
    bench_fill(q, act, &seed, -1.0f, 1.0f), bench_fill(k, act, &seed, -1.0f, 1.0f);
    bench_fill(v, act, &seed, -1.0f, 1.0f), bench_fill(dz, act, &seed, -1.0f, 1.0f);
    mha_config rc = cfg;
    rc.n_kv_heads = h, rc.d_k = rc.d_v = d, rc.d_kv_in = rc.d_v_in = D;
    /* stateless: dq into z's buffer and dk, dv into k, v, as backward_fast.c
     * does (the values drift between runs but stay finite, the cost does not
     * change); the tape's pass 2 reads a Z and lse made once and writes
     * buffers of their own, as mha_backward_tape does */
    const mha_bwd_attn a = {&rc, &opt, q, k, v, z, lse, dz, z, k, v, B, T, T, T, 1.0f / 8.0f, lse + nl, NULL, NULL, 0, NULL};
    float *q2 = bench_alloc(act), *k2 = bench_alloc(act), *v2 = bench_alloc(act), *z2 = bench_alloc(act);
    float *lse2 = bench_alloc(2 * nl);
    memcpy(q2, q, act * sizeof(float)), memcpy(k2, k, act * sizeof(float)), memcpy(v2, v, act * sizeof(float));
    const mha_bwd_attn a2 = {&rc, &opt, q2, k2, v2, z2, lse2, dz, dq, dk, dv, B, T, T, T, 1.0f / 8.0f, lse2 + nl, NULL, NULL, 0, NULL};
    mha_exec ex;
    if (mha_exec_resolve(&ex, NULL)) ex.isa = mha_isa_best();
    attn_job aj = {&a, mha_exec_prefill(&ex), mha_exec_backward(&ex), c->threads}, aj2 = aj;
    aj2.a = &a2;
    long masked;
    n = mha_bwd_attention_forward(&a2, aj2.kern, aj2.bk, c->threads, &masked) ? -1 : 0;
    int (*const passes[2])(void *) = {run_attention, run_attention_tape};
    void *const pass_args[2] = {&aj, &aj2};
    if (n == 0) n = bench_rounds(passes, pass_args, 2, t, runs, 2 * c->budget);
    const double pairs = (double)B * h * T * T * (c->causal ? 0.5 : 1.0);
    const double useful = 2.5 * 4.0 * pairs * d, executed[2] = {7.0 * 2.0 * pairs * d, 5.0 * 2.0 * pairs * d};
    const int avx512 = !strcmp(aj.kern->name, "avx512");
    double peak_med, peak = avx512 ? bench_fma_peak_avx512(c->threads, 20000000, 5, &peak_med)
                                   : bench_fma_peak_avx2(c->threads, 20000000, 5, &peak_med);
    for (int p = 0; p < 2; p++) {
        printf("RESULT kind=backward impl=mha part=%s name=%s B=%d T=%d d_model=%d h=%d causal=%d",
               p ? "attention_tape" : "attention", c->name, B, T, D, h, c->causal);
        if (n < 0) {
            printf(" error=\"%s\"\n", mha_last_error());
            continue;
        }
        const double best = bench_min(t + (size_t)p * runs, n);
        bench_print_times(t + (size_t)p * runs, n);
        printf(" useful_gflop=%.3f executed_gflop=%.3f useful_gflops=%.2f executed_gflops=%.2f "
               "fma_peak_gflops=%.2f useful_of_peak=%.3f executed_of_peak=%.3f kernels=%s threads=%d\n",
               useful * 1e-9, executed[p] * 1e-9, useful * 1e-9 / best, executed[p] * 1e-9 / best, peak,
               useful * 1e-9 / best / peak, executed[p] * 1e-9 / best / peak, aj.kern->name, c->threads);
    }
    fflush(stdout);
    free(q), free(k), free(v), free(z), free(dz), free(lse), free(dq), free(dk), free(dv);
    free(q2), free(k2), free(v2), free(z2), free(lse2);
    free(w), free(gw), free(x), free(dy), free(y), free(dx);
    mha_layer_free(L);
    return n < 0;
}
