/* test_tape.c — the training forward and its tape (mha_forward_train,
 * mha_backward_tape): bit-identical on 1 and 2 threads (per ISA), what it
 * refuses (MHA_E_UNSUPPORTED: nothing written, no tape) and the misuse it
 * catches (MHA_E_ARG naming what differs). Its gradients against the
 * stateless fast backward's bits and the reference's tolerance, for every
 * option, are in test_backward_fast.c's check_fast.
 * Legend: B, T, S, h, d_model; G = the 13 gradients of mha_gradients. */
#include <stdlib.h>
#include <string.h>

#include "naive.h"
#include "tests.h"

/* Every gradient the layer and the sources have, in one zeroed block. */
typedef struct {
    float *block;
    size_t n;
    mha_gradients g;
} grad_set;

static void grad_set_make(grad_set *s, const mha_config *c, int B, int T, int S, int k_given) {
    const size_t qw = (size_t)c->n_heads * c->d_k, kw = (size_t)c->n_kv_heads * c->d_k,
                 vw = (size_t)c->n_kv_heads * c->d_v, zw = (size_t)c->n_heads * c->d_v;
    const size_t n[] = {(size_t)B * T * c->d_model, k_given ? (size_t)B * S * c->d_kv_in : 0,
                        (size_t)c->d_model * qw, (size_t)c->d_kv_in * kw, (size_t)c->d_v_in * vw,
                        zw * c->d_model, c->bias ? qw + kw + vw + c->d_model : 0,
                        c->add_bias_kv ? kw + vw : 0};
    s->n = 0;
    for (size_t i = 0; i < sizeof n / sizeof n[0]; i++) s->n += n[i];
    float *p = s->block = naive_alloc_floats(s->n);
    memset(&s->g, 0, sizeof s->g);
    s->g.dx = p, p += n[0];
    if (k_given) s->g.dk_src = p, p += n[1];
    s->g.dw_q = p, p += n[2];
    s->g.dw_k = p, p += n[3];
    s->g.dw_v = p, p += n[4];
    s->g.dw_o = p, p += n[5];
    if (c->bias) s->g.db_q = p, s->g.db_k = p + qw, s->g.db_v = p + qw + kw, s->g.db_o = p + qw + kw + vw, p += n[6];
    if (c->add_bias_kv) s->g.dbias_k = p, s->g.dbias_v = p + kw;
}

/* mha_forward_train + mha_backward_tape on the current thread count. */
static void train_step(naive_bw_case *f, float *y, grad_set *gs) {
    mha_tape *tape = NULL;
    grad_set_make(gs, &f->w.cfg, f->B, f->T, f->S, f->k_src != NULL);
    CHECK_OK(mha_forward_train(f->L, y, &tape, f->x, f->k_src, NULL, f->B, f->T, f->S, &f->opt));
    CHECK_OK(mha_backward_tape(f->L, tape, &gs->g, f->dy, f->x, f->k_src, NULL, f->B, f->T, f->S, &f->opt));
    mha_tape_free(tape);
}

/* y and every gradient the same bits on 1 and 2 threads (GQA, causal,
 * cross attention, bias_kv: several tiles and tasks). */
static void tape_threads_bit_identical(void) {
    mha_config c = naive_config(24, 6, 2, 8, 8, 1);
    c.add_bias_kv = 1, c.d_kv_in = 20;
    naive_bw_case f;
    naive_bw_case_make(&f, c, 2, 150, 130, 1, 0, 1401);
    if (!f.L) return;
    f.opt.causal = 1, f.opt.align = MHA_ALIGN_BOTTOM_RIGHT;
    const size_t ny = (size_t)f.B * f.T * f.w.cfg.d_model;
    float *y1 = naive_alloc_floats(ny), *y2 = naive_alloc_floats(ny);
    const int saved = mha_get_num_threads();
    grad_set one, two;
    mha_set_num_threads(1);
    train_step(&f, y1, &one);
    mha_set_num_threads(2);
    train_step(&f, y2, &two);
    mha_set_num_threads(saved);
    CHECK(memcmp(y1, y2, ny * sizeof(float)) == 0);
    CHECK(memcmp(one.block, two.block, one.n * sizeof(float)) == 0);
    double total = 0.0;
    for (size_t i = 0; i < one.n; i++) total += fabs(one.block[i]);
    CHECK(total > 1.0); /* real gradients, not zeros */
    free(y1), free(y2), free(one.block), free(two.block);
    naive_bw_case_free(&f);
}

/* A forward the tape cannot serve: MHA_E_UNSUPPORTED naming why, *tape
 * NULL, y untouched. */
static void check_refused(naive_bw_case *f, const char *mention) {
    const size_t ny = (size_t)f->B * f->T * f->w.cfg.d_model;
    for (size_t i = 0; i < ny; i++) f->y[i] = 7.0f;
    mha_tape *tape = (mha_tape *)f; /* any non-NULL value: the call must reset it */
    CHECK_STATUS(mha_forward_train(f->L, f->y, &tape, f->x, f->k_src, NULL, f->B, f->T, f->S, &f->opt),
                 MHA_E_UNSUPPORTED);
    CHECK_ERROR_MENTIONS(mention);
    CHECK(tape == NULL);
    int untouched = 1;
    for (size_t i = 0; i < ny; i++) untouched &= f->y[i] == 7.0f;
    CHECK(untouched);
}

static void tape_refuses_what_the_fast_backward_does_not_serve(void) {
    naive_bw_case f;
    naive_bw_case_make(&f, naive_config(8, 2, 0, 0, 0, 1), 1, 6, 6, 0, 0, 1402);
    if (!f.L) return;
    f.opt.path = MHA_PATH_REFERENCE;
    check_refused(&f, "reference");
    f.opt.path = MHA_PATH_AUTO;
    uint8_t keep[36];
    for (int i = 0; i < 36; i++) keep[i] = (uint8_t)(i / 6 != 2); /* query 2 sees nothing */
    f.opt.keep_mask = (mha_mask){keep, 1, 1}, f.opt.masked_row = MHA_MASKED_ROW_NAN;
    check_refused(&f, "MHA_MASKED_ROW_NAN");
    f.opt = mha_options_default(), f.opt.scale = 1e5f;
    check_refused(&f, "scores");
    f.opt = mha_options_default();
    const char *old = getenv("MHA_KERNELS");
    char *saved = old ? strdup(old) : NULL;
    setenv("MHA_KERNELS", "reference", 1);
    check_refused(&f, "MHA_KERNELS=reference");
    if (saved) setenv("MHA_KERNELS", saved, 1);
    else unsetenv("MHA_KERNELS");
    free(saved);
    naive_bw_case_free(&f);
}

/* The backward refuses a tape that is not its forward's, naming what
 * differs, and writes nothing. */
static void tape_misuse_errors(void) {
    naive_bw_case f, other;
    naive_bw_case_make(&f, naive_config(8, 2, 0, 0, 0, 1), 1, 10, 12, 1, 0, 1404);
    naive_bw_case_make(&other, naive_config(8, 2, 0, 0, 0, 1), 1, 10, 12, 1, 0, 1404);
    if (!f.L || !other.L) return;
    f.opt.causal = 1;
    const int B = f.B, T = f.T, S = f.S;
    mha_tape *tape = NULL;
    CHECK_STATUS(mha_forward_train(f.L, f.y, NULL, f.x, f.k_src, NULL, B, T, S, &f.opt), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("tape is NULL");
    CHECK_STATUS(mha_forward_train(NULL, f.y, &tape, f.x, f.k_src, NULL, B, T, S, &f.opt), MHA_E_ARG);
    CHECK(tape == NULL);
    CHECK_OK(mha_forward_train(f.L, f.y, &tape, f.x, f.k_src, NULL, B, T, S, &f.opt));
    grad_set gs;
    grad_set_make(&gs, &f.w.cfg, B, T, S, 1);
    mha_gradients *g = &gs.g;
    CHECK_STATUS(mha_backward_tape(f.L, NULL, g, f.dy, f.x, f.k_src, NULL, B, T, S, &f.opt), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("tape is NULL");
    CHECK_STATUS(mha_backward_tape(f.L, tape, NULL, f.dy, f.x, f.k_src, NULL, B, T, S, &f.opt), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("mha_backward_tape: grad is NULL"); /* the call's own name */
    CHECK_STATUS(mha_backward_tape(f.L, tape, g, NULL, f.x, f.k_src, NULL, B, T, S, &f.opt), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("mha_backward_tape: dy is NULL");
    mha_gradients in_place = *g;
    in_place.dx = f.x;
    CHECK_STATUS(mha_backward_tape(f.L, tape, &in_place, f.dy, f.x, f.k_src, NULL, B, T, S, &f.opt), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("mha_backward_tape: grad.dx overlaps x");
    CHECK_STATUS(mha_backward_tape(other.L, tape, g, f.dy, f.x, f.k_src, NULL, B, T, S, &f.opt), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("another layer");
    CHECK_STATUS(mha_backward_tape(f.L, tape, g, f.dy, f.x, f.k_src, NULL, B, T - 1, S, &f.opt), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("T=9");
    mha_options o = f.opt;
    o.causal = 0;
    CHECK_STATUS(mha_backward_tape(f.L, tape, g, f.dy, f.x, f.k_src, NULL, B, T, S, &o), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("options.causal");
    CHECK_STATUS(mha_backward_tape(f.L, tape, g, f.dy, f.x, f.k_src, NULL, B, T, S, NULL), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("options.causal");
    o = f.opt, o.path = MHA_PATH_REFERENCE;
    CHECK_STATUS(mha_backward_tape(f.L, tape, g, f.dy, f.x, f.k_src, NULL, B, T, S, &o), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("options.path");
    o = f.opt, o.dropout_seed = 5; /* another step's dropout draw: another forward */
    CHECK_STATUS(mha_backward_tape(f.L, tape, g, f.dy, f.x, f.k_src, NULL, B, T, S, &o), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("options.dropout_seed");
    o = f.opt, o.dropout_p = 0.25f;
    CHECK_STATUS(mha_backward_tape(f.L, tape, g, f.dy, f.x, f.k_src, NULL, B, T, S, &o), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("options.dropout_p");
    /* values from a source apart where the forward read them from the keys' */
    CHECK_STATUS(mha_backward_tape(f.L, tape, g, f.dy, f.x, f.k_src, other.k_src, B, T, S, &f.opt), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("values from v_src");
    double total = 0.0; /* nothing written by the refused calls */
    for (size_t i = 0; i < gs.n; i++) total += fabs(gs.block[i]);
    CHECK(total == 0.0);
    /* a tape of a layer with another config names the member that differs */
    mha_tape_free(tape);
    free(gs.block);
    naive_bw_case_free(&other);
    naive_bw_case_make(&other, naive_config(16, 2, 0, 0, 0, 1), 1, 10, 12, 1, 0, 1405);
    if (other.L) {
        CHECK_OK(mha_forward_train(other.L, other.y, &tape, other.x, other.k_src, NULL, B, T, S, &other.opt));
        grad_set_make(&gs, &f.w.cfg, B, T, S, 1);
        CHECK_STATUS(mha_backward_tape(f.L, tape, &gs.g, f.dy, f.x, f.k_src, NULL, B, T, S, &f.opt), MHA_E_ARG);
        CHECK_ERROR_MENTIONS("d_model");
        mha_tape_free(tape);
        free(gs.block);
    }
    mha_tape_free(NULL); /* a no-op */
    naive_bw_case_free(&f), naive_bw_case_free(&other);
}

/* Run once per ISA (test_main.c's per_isa_areas). */
static const test_case isa_cases[] = {
    {"tape_threads_bit_identical", tape_threads_bit_identical},
};

const test_case *tests_tape_isa(size_t *count) {
    *count = sizeof isa_cases / sizeof isa_cases[0];
    return isa_cases;
}

/* A tape is the layer's as it was: after a permutation, new weights or a
 * weight dtype between mha_forward_train and mha_backward_tape, the tape's
 * Q, K, V and Z are another layer's (its gradients would be those of the
 * old weights, silently); each is refused, and a new forward serves again.
 * A permutation that moves nothing counts too (the layer cannot tell). */
static void tape_refused_after_the_weights_change(void) {
    naive_bw_case f;
    naive_bw_case_make(&f, naive_config(8, 2, 0, 0, 0, 1), 1, 6, 6, 0, 0, 1406);
    if (!f.L) return;
    const int B = f.B, T = f.T, S = f.S, swap[2] = {1, 0};
    const mha_weights w = naive_weights_view(&f.w); /* the case's first weights, apart from the layer's */
    for (int change = 0; change < 4; change++) {
        mha_tape *tape = NULL;
        CHECK_OK(mha_forward_train(f.L, f.y, &tape, f.x, NULL, NULL, B, T, S, &f.opt));
        grad_set gs;
        grad_set_make(&gs, &f.w.cfg, B, T, S, 0);
        if (change == 0) CHECK_OK(mha_layer_permute_heads(f.L, swap));
        if (change == 1) CHECK_OK(mha_layer_permute_block(f.L, MHA_BLOCK_O, swap));
        if (change == 2) CHECK_OK(mha_layer_set_weights(f.L, &w));
        if (change == 3) CHECK_OK(mha_layer_convert_weights(f.L, MHA_W_BF16));
        CHECK_STATUS(mha_backward_tape(f.L, tape, &gs.g, f.dy, f.x, NULL, NULL, B, T, S, &f.opt), MHA_E_ARG);
        CHECK_ERROR_MENTIONS("the layer's weights changed since mha_forward_train");
        mha_tape_free(tape);
        CHECK_OK(mha_forward_train(f.L, f.y, &tape, f.x, NULL, NULL, B, T, S, &f.opt)); /* a new tape serves */
        CHECK_OK(mha_backward_tape(f.L, tape, &gs.g, f.dy, f.x, NULL, NULL, B, T, S, &f.opt));
        mha_tape_free(tape);
        free(gs.block);
    }
    naive_bw_case_free(&f);
}

static const test_case cases[] = {
    {"tape_refuses_what_the_fast_backward_does_not_serve", tape_refuses_what_the_fast_backward_does_not_serve},
    {"tape_misuse_errors", tape_misuse_errors},
    {"tape_refused_after_the_weights_change", tape_refused_after_the_weights_change},
};

const test_case *tests_tape(size_t *count) {
    *count = sizeof cases / sizeof cases[0];
    return cases;
}
