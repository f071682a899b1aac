/* test_backward_variants.c — the fast backward of today's variants (RoPE,
 * ALiBi, softcap, sinks, QK-norm; alone and together, with GQA/MQA, cross
 * attention, windows, StreamingLLM's sink tokens, padding masks, explicit
 * positions, query and key tiles beyond one block) against the reference backward (double,
 * itself checked against finite differences in test_backward.c), on
 * every kernel ISA (per_isa_areas in test_main.c); clip_qkv's clamp and its
 * masked gradient too (OLMo 1, DBRX); the output gate (Qwen3-Next).
 * Tolerance per gradient tensor: max|fast - ref| <= REL * (the largest
 * |ref| of that tensor) + 1e-6. REL = 1e-5: these cases stay within
 * 1.1e-6 of it on every ISA (measured), and a dropped term (the softcap's
 * derivative, a sink's gradient, RoPE's transpose, a norm's mean) costs
 * 1e-2 or more. Also: the tape's bits are the stateless
 * backward's, 1 and 2 threads give the same bits, and AUTO is the fast
 * path (no fallback to the reference).
 * Legend: B, T, S, h, h_kv, d_k, d_v, D = d_model. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"
#include "naive.h"
#include "tests.h"

#define REL 1e-5

/* The 18 gradients, in mha_gradients' order. */
enum { NG = 18 };
static const char *const names[NG] = {"dx",   "dk_src", "dv_src", "dw_q", "dw_k", "dw_v",
                                      "dw_o", "db_q",   "db_k",   "db_v", "db_o", "dbias_k",
                                      "dbias_v", "d_sinks", "d_q_norm", "d_k_norm", "dw_g", "db_g"};

typedef struct {
    float *t[NG]; /* NULL: the layer or the call has none */
    size_t n[NG];
} grads;

static float **slot(mha_gradients *g, int i) {
    float **m[NG] = {&g->dx,   &g->dk_src, &g->dv_src, &g->dw_q,    &g->dw_k,    &g->dw_v,
                     &g->dw_o, &g->db_q,   &g->db_k,   &g->db_v,    &g->db_o,    &g->dbias_k,
                     &g->dbias_v, &g->d_sinks, &g->d_q_norm, &g->d_k_norm, &g->dw_g, &g->db_g};
    return m[i];
}

static void grads_alloc(grads *g, const naive_bw_case *f) {
    const mha_config *c = &f->w.cfg;
    const size_t h = (size_t)c->n_heads, hk = (size_t)c->n_kv_heads, qw = h * c->d_k, kw = hk * c->d_k;
    const size_t vw = hk * c->d_v, zw = h * c->d_v, norm = c->qk_norm != MHA_QK_NORM_NONE;
    const size_t n[NG] = {(size_t)f->B * f->T * c->d_model, f->k_src ? (size_t)f->B * f->S * c->d_kv_in : 0,
                          f->v_src ? (size_t)f->B * f->S * c->d_v_in : 0, (size_t)c->d_model * qw,
                          (size_t)c->d_kv_in * kw, (size_t)c->d_v_in * vw, zw * c->d_model,
                          c->bias ? qw : 0, c->bias ? kw : 0, c->bias ? vw : 0, c->bias ? (size_t)c->d_model : 0,
                          0, 0, c->sinks ? h : 0, norm ? (c->qk_norm_per_head ? qw : (size_t)c->d_k) : 0,
                          norm ? (c->qk_norm_per_head ? kw : (size_t)c->d_k) : 0,
                          c->output_gate ? (size_t)c->d_model * zw : 0, c->output_gate && c->bias ? zw : 0};
    for (int i = 0; i < NG; i++) g->n[i] = n[i], g->t[i] = n[i] ? naive_alloc_floats(n[i]) : NULL;
}

static void grads_free(grads *g) {
    for (int i = 0; i < NG; i++) free(g->t[i]);
}

static mha_gradients view(const grads *g) {
    mha_gradients v;
    memset(&v, 0, sizeof v);
    for (int i = 0; i < NG; i++) *slot(&v, i) = g->t[i];
    return v;
}

static mha_status run(naive_bw_case *f, grads *g, mha_path path) {
    grads_alloc(g, f);
    const mha_gradients v = view(g);
    mha_options o = f->opt;
    o.path = path;
    return mha_backward_kv(f->L, &v, f->dy, f->x, f->k_src, f->v_src, f->B, f->T, f->S, &o);
}

/* mha_forward_train then mha_backward_tape; y into f->y. */
static mha_status run_tape(naive_bw_case *f, grads *g) {
    grads_alloc(g, f);
    const mha_gradients v = view(g);
    mha_tape *tape = NULL;
    mha_status s = mha_forward_train(f->L, f->y, &tape, f->x, f->k_src, f->v_src, f->B, f->T, f->S, &f->opt);
    if (!s) s = mha_backward_tape(f->L, tape, &v, f->dy, f->x, f->k_src, f->v_src, f->B, f->T, f->S, &f->opt);
    mha_tape_free(tape);
    return s;
}

/* Fast (FAST and AUTO), tape and reference of one case, within the rule. */
static void check_case(naive_bw_case *f, const char *what) {
    if (!f->L) return;
    grads ref, fast, aut, tape;
    CHECK_OK(run(f, &ref, MHA_PATH_REFERENCE));
    CHECK_OK(run(f, &fast, MHA_PATH_FAST));
    CHECK_OK(run(f, &aut, MHA_PATH_AUTO));
    CHECK_OK(run_tape(f, &tape));
    // --- the tape's y: the fast forward's, within its own error
    const size_t ny = (size_t)f->B * f->T * f->w.cfg.d_model;
    float *y_fast = naive_alloc_floats(ny);
    mha_options o = f->opt;
    o.path = MHA_PATH_FAST;
    CHECK_OK(mha_forward_kv(f->L, y_fast, NULL, f->x, f->k_src, f->v_src, f->B, f->T, f->S, &o));
    double ey = 0.0, my = 0.0;
    for (size_t i = 0; i < ny; i++) ey = fmax(ey, fabs((double)f->y[i] - y_fast[i])), my = fmax(my, fabs(y_fast[i]));
    if (!(ey <= 1e-5 * my + 1e-6))
        test_report(__FILE__, __LINE__, "%s: the tape forward's y is %.3g from the fast forward's (max|y| %.3g, "
                    "kernels=%s)", what, ey, my, mha_kernels_get()->name);
    free(y_fast);
    double total = 0.0;
    for (int i = 0; i < NG; i++) {
        if (!ref.t[i]) continue;
        if (memcmp(fast.t[i], aut.t[i], ref.n[i] * sizeof(float)) || memcmp(fast.t[i], tape.t[i], ref.n[i] * sizeof(float)))
            test_report(__FILE__, __LINE__, "%s: %s differs between FAST, AUTO and the tape (kernels=%s)", what,
                        names[i], mha_kernels_get()->name);
        double err = 0.0, big = 0.0;
        for (size_t e = 0; e < ref.n[i]; e++) {
            err = fmax(err, fabs((double)fast.t[i][e] - ref.t[i][e]));
            big = fmax(big, fabs((double)ref.t[i][e]));
        }
        total += big;
        if (getenv("MHA_TEST_VERBOSE")) printf("    %s %s: rel %.3g (max %.3g)\n", what, names[i], err / big, big);
        if (!(err <= REL * big + 1e-6))
            test_report(__FILE__, __LINE__, "%s: %s max|fast-ref| = %.3g > %g * %.3g + 1e-6 (B=%d T=%d S=%d "
                        "kernels=%s)", what, names[i], err, REL, big, f->B, f->T, f->S, mha_kernels_get()->name);
    }
    CHECK(total > 1e-3); /* real gradients, not zeros */
    grads_free(&ref), grads_free(&fast), grads_free(&aut), grads_free(&tape);
}

typedef struct {
    const char *what;
    int d_model, h, h_kv, d_k, d_v;
    int B, T, S, cross;          /* cross: keys and values from their own sources */
    int rope;                    /* 0 none, 1 halves, 2 interleaved (partial: dim d_k/2) */
    int alibi, sinks, norm;      /* norm: 0 none, 1 RMS shared, 2 LayerNorm per head, 3 RMS whole */
    float softcap;
    int causal, window, positions, padding;
    int sink_tokens;             /* StreamingLLM's kept first keys (with a window) */
    float clip_qkv;              /* 0: none; about half of Q, K, V clamped at 0.5 */
    int gate;                    /* output_gate (Qwen3-Next) */
} variant_case;

static const variant_case variant_cases[] = {
    {"rope halves", 32, 4, 0, 0, 0, 2, 7, 7, 0, 1, 0, 0, 0, 0.0f, 1, 0, 0, 0, 0, 0.0f, 0},
    {"rope interleaved partial, positions", 24, 2, 0, 12, 8, 2, 5, 5, 0, 2, 0, 0, 0, 0.0f, 0, 0, 1, 0, 0, 0.0f, 0},
    {"alibi causal", 16, 4, 2, 0, 0, 2, 9, 9, 0, 0, 1, 0, 0, 0.0f, 1, 0, 0, 0, 0, 0.0f, 0},
    {"alibi cross, key positions", 16, 4, 0, 0, 0, 1, 4, 7, 1, 0, 1, 0, 0, 0.0f, 0, 0, 1, 0, 0, 0.0f, 0},
    {"softcap", 16, 2, 0, 0, 0, 2, 6, 6, 0, 0, 0, 0, 0, 0.5f, 0, 0, 0, 0, 0, 0.0f, 0},
    {"sinks, padding", 16, 4, 0, 0, 0, 2, 5, 5, 0, 0, 0, 1, 0, 0.0f, 0, 0, 0, 1, 0, 0.0f, 0},
    {"qk-norm rms shared", 16, 2, 0, 0, 0, 1, 6, 6, 0, 0, 0, 0, 1, 0.0f, 1, 0, 0, 0, 0, 0.0f, 0},
    {"qk-norm layernorm per head, d_k 6", 12, 2, 0, 6, 10, 2, 4, 6, 1, 0, 0, 0, 2, 0.0f, 0, 0, 0, 0, 0, 0.0f, 0},
    {"qk-norm whole, gqa", 16, 4, 2, 0, 0, 1, 5, 5, 0, 0, 0, 0, 3, 0.0f, 1, 0, 0, 0, 0, 0.0f, 0},
    {"clip_qkv, causal", 16, 4, 0, 0, 0, 2, 6, 6, 0, 0, 0, 0, 0, 0.0f, 1, 0, 0, 0, 0, 0.5f, 0},
    {"clip_qkv, rope, qk-norm, gqa, cross", 16, 4, 2, 0, 0, 2, 5, 7, 1, 1, 0, 0, 1, 0.0f, 0, 0, 0, 0, 0, 0.6f, 0},
    {"everything, gqa, window", 32, 4, 2, 0, 0, 2, 11, 11, 0, 1, 1, 1, 2, 1.5f, 1, 4, 0, 0, 2, 0.0f, 0},
    {"sink tokens, window, tiles", 32, 4, 2, 0, 0, 1, 130, 130, 0, 1, 0, 0, 0, 0.0f, 1, 20, 0, 0, 4, 0.0f, 0},
    {"everything, mqa, long", 48, 4, 1, 20, 12, 1, 130, 150, 1, 1, 1, 1, 1, 3.0f, 0, 0, 1, 1, 0, 1.0f, 0},
    {"output gate, causal", 16, 4, 0, 0, 0, 2, 6, 6, 0, 0, 0, 0, 0, 0.0f, 1, 0, 0, 0, 0, 0.0f, 1},
    {"output gate, rope, qk-norm, gqa, cross (Qwen3-Next)", 32, 4, 2, 0, 0, 2, 5, 7, 1, 1, 0, 0, 1, 0.0f, 0, 0, 1, 0, 0, 0.0f, 1},
    {"output gate, everything, mqa, long", 48, 4, 1, 20, 12, 1, 130, 150, 1, 1, 1, 1, 1, 3.0f, 0, 0, 1, 1, 0, 1.0f, 1},
};

static void make_case(naive_bw_case *f, const variant_case *v, uint64_t seed) {
    mha_config c = naive_config(v->d_model, v->h, v->h_kv, v->d_k, v->d_v, 1);
    const int d_k = v->d_k ? v->d_k : v->d_model / v->h;
    if (v->rope) {
        c.rope.pairing = v->rope == 1 ? MHA_ROPE_HALVES : MHA_ROPE_INTERLEAVED;
        c.rope.dim = v->rope == 2 ? d_k / 2 / 2 * 2 : 0, c.rope.theta = 500.0f;
    }
    c.alibi = v->alibi, c.sinks = v->sinks, c.softcap = v->softcap, c.clip_qkv = v->clip_qkv;
    c.output_gate = v->gate;
    if (v->norm) {
        c.qk_norm = v->norm == 2 ? MHA_QK_NORM_LAYER : MHA_QK_NORM_RMS;
        c.qk_norm_per_head = v->norm >= 2, c.qk_norm_whole = v->norm == 3, c.qk_norm_eps = 1e-5f;
    }
    naive_bw_case_make(f, c, v->B, v->T, v->S, v->cross, v->cross, seed);
    f->opt = mha_options_default();
    f->opt.causal = v->causal, f->opt.window_left = v->window ? v->window : -1;
    f->opt.sink_tokens = v->sink_tokens;
}

/* positions (B,T) and key positions (B,S), shuffled and spread out; the
 * padding mask (B,S) drops every third key of batch 0 and every key of
 * batch 1 (rows with no key: zero output, zero gradient, no sink share). */
static void case_arrays(naive_bw_case *f, const variant_case *v, int **pos, int **kpos, uint8_t **keep) {
    *pos = *kpos = NULL, *keep = NULL;
    if (v->positions) {
        *pos = malloc(sizeof(int) * (size_t)v->B * v->T), *kpos = malloc(sizeof(int) * (size_t)v->B * v->S);
        for (int i = 0; i < v->B * v->T; i++) (*pos)[i] = (i * 37) % 101 + 1000 * (i % 3);
        for (int i = 0; i < v->B * v->S; i++) (*kpos)[i] = (i * 53) % 89;
        f->opt.positions = *pos;
        f->opt.key_positions = v->cross ? *kpos : NULL;
    }
    if (v->padding) {
        *keep = malloc((size_t)v->B * v->S);
        for (int i = 0; i < v->B * v->S; i++) (*keep)[i] = i % 3 != 1;
        for (int j = 0; v->B > 1 && j < v->S; j++) (*keep)[v->S + j] = 0;
        f->opt.key_keep = *keep;
    }
}

static void backward_variants_fast_matches_reference(void) {
    for (size_t i = 0; i < sizeof variant_cases / sizeof variant_cases[0]; i++) {
        const variant_case *v = &variant_cases[i];
        naive_bw_case f;
        make_case(&f, v, 4100 + i);
        int *pos, *kpos;
        uint8_t *keep;
        case_arrays(&f, v, &pos, &kpos, &keep);
        check_case(&f, v->what);
        free(pos), free(kpos), free(keep);
        naive_bw_case_free(&f);
    }
}

/* Dynamic NTK and LongRoPE (per-pair factors, partial rotary): the
 * backward's recomputed rows take the frequencies of the forward's call
 * (T 40 past L 16, and T 12 within; explicit positions past L); two of
 * them chunked (options.chunk_size 8: the rows' intervals). */
static void backward_variants_rope_scalings(void) {
    for (int k = 0; k < 6; k++) {
        mha_config c = naive_config(32, 4, 2, 0, 0, 1);
        c.rope.pairing = k % 2 ? MHA_ROPE_INTERLEAVED : MHA_ROPE_HALVES, c.rope.theta = 500.0;
        c.rope.original_max_positions = 16, c.rope.factor = 4.0;
        c.rope.scaling = k < 3 ? MHA_ROPE_SCALE_DYNAMIC : MHA_ROPE_SCALE_LONGROPE;
        if (k >= 3) {
            c.rope.dim = 6;
            for (int i = 0; i < 3; i++) c.rope.short_factor[i] = 1.0f + 0.5f * i, c.rope.long_factor[i] = 2.0f + 5.0f * i;
        }
        const int T = k % 3 == 0 ? 12 : k % 3 == 1 ? 40 : 5;
        naive_bw_case f;
        naive_bw_case_make(&f, c, 2, T, T, 0, 0, 4300 + k);
        f.opt = mha_options_default();
        f.opt.causal = 1;
        int pos[10];
        for (int i = 0; i < 10; i++) pos[i] = 30 + 3 * i; /* seq 58 > L */
        if (T == 5) f.opt.positions = pos;
        if (k == 1 || k == 4) f.opt.chunk_size = 8; /* Llama 4's chunked attention, too */
        check_case(&f, k < 3 ? "rope dynamic" : "rope longrope");
        naive_bw_case_free(&f);
    }
}

/* Llama 4's query temperature (floor 4, scale 0.3: T 40's queries see
 * eleven factors): alone on a GQA NoPE layer as Llama 4 has it, with RoPE,
 * a whole-width QK-norm and explicit positions past 1000, and cross-attention. */
static void backward_variants_temperature(void) {
    for (int k = 0; k < 3; k++) {
        mha_config c = naive_config(32, 4, 2, 0, 0, k == 1); /* b_K's gradient is 0 but for RoPE, norm: no bias */
        c.temperature_floor = 4, c.temperature_scale = 0.3f;
        if (k == 1) {
            c.rope.pairing = MHA_ROPE_HALVES, c.rope.theta = 500.0;
            c.qk_norm = MHA_QK_NORM_RMS, c.qk_norm_per_head = 1, c.qk_norm_whole = 1;
        }
        const int T = k == 1 ? 7 : 40, S = k == 2 ? 23 : T;
        naive_bw_case f;
        naive_bw_case_make(&f, c, 2, T, S, k == 2, k == 2, 4400 + k);
        f.opt = mha_options_default();
        f.opt.causal = k != 2;
        int pos[2 * 7];
        for (int i = 0; i < 2 * 7; i++) pos[i] = 1000 + 37 * i;
        if (k == 1) f.opt.positions = pos;
        check_case(&f, k == 0 ? "temperature" : k == 1 ? "temperature, rope, whole qk-norm, positions"
                                                       : "temperature, cross");
        naive_bw_case_free(&f);
    }
}

/* The biggest case on 1 and 2 threads: the same bits. */
static void backward_variants_threads_bit_identical(void) {
    const variant_case *v = &variant_cases[sizeof variant_cases / sizeof variant_cases[0] - 1];
    naive_bw_case f;
    make_case(&f, v, 4200);
    int *pos, *kpos;
    uint8_t *keep;
    case_arrays(&f, v, &pos, &kpos, &keep);
    const int saved = mha_get_num_threads();
    grads one, two;
    mha_set_num_threads(1);
    CHECK_OK(run(&f, &one, MHA_PATH_FAST));
    mha_set_num_threads(2);
    CHECK_OK(run(&f, &two, MHA_PATH_FAST));
    mha_set_num_threads(saved);
    for (int i = 0; i < NG; i++)
        if (one.t[i] && memcmp(one.t[i], two.t[i], one.n[i] * sizeof(float)))
            test_report(__FILE__, __LINE__, "%s differs between 1 and 2 threads (kernels=%s)", names[i],
                        mha_kernels_get()->name);
    grads_free(&one), grads_free(&two);
    free(pos), free(kpos), free(keep);
    naive_bw_case_free(&f);
}

/* Attention dropout (options.dropout_p) on the fast backward and the tape
 * against the reference: a plain causal layer, GQA cross-attention with
 * RoPE and QK-norm, every variant with a window and sink tokens, and the
 * long MQA case (query and key tiles beyond one block). */
static void backward_variants_dropout(void) {
    const size_t n = sizeof variant_cases / sizeof variant_cases[0];
    const size_t which[] = {9, 10, 11, 12, n - 2, n - 4};
    for (size_t k = 0; k < sizeof which / sizeof which[0]; k++) {
        const variant_case *v = &variant_cases[which[k]];
        naive_bw_case f;
        make_case(&f, v, 4600 + k);
        int *pos, *kpos;
        uint8_t *keep;
        case_arrays(&f, v, &pos, &kpos, &keep);
        f.opt.dropout_p = 0.1f + 0.15f * (float)k, f.opt.dropout_seed = 0xfeedull * (k + 1);
        char what[128];
        snprintf(what, sizeof what, "dropout %.2f, %s", (double)f.opt.dropout_p, v->what);
        check_case(&f, what);
        free(pos), free(kpos), free(keep);
        naive_bw_case_free(&f);
    }
}

/* Each gradient asked for alone is the whole request's, bit for bit, on
 * FAST and the tape: what one gradient needs of the others' path (dZ
 * times the gate for dW_Q alone; dl/dG for dW_G alone) is computed
 * whichever are given. On the gated cross case and a sinks + QK-norm one. */
static void backward_variants_partial_requests(void) {
    const variant_case *cases[2] = {&variant_cases[sizeof variant_cases / sizeof variant_cases[0] - 2],
                                    &variant_cases[11]};
    for (int k = 0; k < 2; k++) {
        naive_bw_case f;
        make_case(&f, cases[k], 4500 + k);
        int *pos, *kpos;
        uint8_t *keep;
        case_arrays(&f, cases[k], &pos, &kpos, &keep);
        for (int tape = 0; tape < 2 && f.L; tape++) {
            grads all;
            CHECK_OK(tape ? run_tape(&f, &all) : run(&f, &all, MHA_PATH_FAST));
            for (int i = 0; i < NG; i++) {
                if (!all.t[i]) continue;
                float *one = naive_alloc_floats(all.n[i]);
                mha_gradients v;
                memset(&v, 0, sizeof v);
                *slot(&v, i) = one;
                mha_options o = f.opt;
                o.path = MHA_PATH_FAST;
                mha_tape *t = NULL;
                if (tape) CHECK_OK(mha_forward_train(f.L, f.y, &t, f.x, f.k_src, f.v_src, f.B, f.T, f.S, &o));
                CHECK_OK(tape ? mha_backward_tape(f.L, t, &v, f.dy, f.x, f.k_src, f.v_src, f.B, f.T, f.S, &o)
                              : mha_backward_kv(f.L, &v, f.dy, f.x, f.k_src, f.v_src, f.B, f.T, f.S, &o));
                mha_tape_free(t);
                if (memcmp(one, all.t[i], all.n[i] * sizeof(float)))
                    test_report(__FILE__, __LINE__, "%s: %s alone differs from the whole request's (%s, kernels=%s)",
                                cases[k]->what, names[i], tape ? "tape" : "fast", mha_kernels_get()->name);
                free(one);
            }
            grads_free(&all);
        }
        free(pos), free(kpos), free(keep);
        naive_bw_case_free(&f);
    }
}

/* ALiBi whose nearest allowed key is far (queries at positions near 2^30,
 * keys at 0..S-1, cross-attention): every score of a row is about
 * -slope 2^30, where fp32 keeps no bit of the differences the softmax
 * needs. The |scale q.k| range rule does not see ALiBi's term, so the
 * row maxima are checked too: FAST and the tape refuse
 * (MHA_E_UNSUPPORTED), AUTO's backward and forward are the reference's,
 * and a layer with the same positions but slopes small enough keeps the
 * fast path. */
static void backward_variants_alibi_far_keys_refused(void) {
    const variant_case v = {"alibi far keys", 16, 4, 2, 0, 0, 2, 6, 9, 1, 0, 1, 0, 0, 0.0f, 0, 0, 0, 0, 0, 0.0f, 0};
    naive_bw_case f;
    make_case(&f, &v, 4300);
    int *pos = malloc(sizeof(int) * (size_t)v.B * v.T), *kpos = malloc(sizeof(int) * (size_t)v.B * v.S);
    for (int i = 0; i < v.B * v.T; i++) pos[i] = (1 << 30) - 3 * (i % v.T);
    for (int i = 0; i < v.B * v.S; i++) kpos[i] = i % v.S;
    f.opt.positions = pos, f.opt.key_positions = kpos;
    grads ref, fast, aut, tape;
    CHECK_OK(run(&f, &ref, MHA_PATH_REFERENCE));
    CHECK(run(&f, &fast, MHA_PATH_FAST) == MHA_E_UNSUPPORTED);
    CHECK(strstr(mha_last_error(), "ALiBi") != NULL);
    CHECK(run_tape(&f, &tape) == MHA_E_UNSUPPORTED);
    CHECK_OK(run(&f, &aut, MHA_PATH_AUTO));
    for (int i = 0; i < NG; i++)
        if (ref.t[i] && memcmp(ref.t[i], aut.t[i], ref.n[i] * sizeof(float)))
            test_report(__FILE__, __LINE__, "alibi far keys: AUTO's %s is not the reference's (kernels=%s)",
                        names[i], mha_kernels_get()->name);
    // --- the forward: FAST refuses, AUTO gives the reference's y
    const size_t ny = (size_t)v.B * v.T * v.d_model;
    float *y_ref = naive_alloc_floats(ny), *y_auto = naive_alloc_floats(ny);
    mha_options o = f.opt;
    o.path = MHA_PATH_REFERENCE;
    CHECK_OK(mha_forward_kv(f.L, y_ref, NULL, f.x, f.k_src, f.v_src, v.B, v.T, v.S, &o));
    o.path = MHA_PATH_FAST;
    CHECK(mha_forward_kv(f.L, y_auto, NULL, f.x, f.k_src, f.v_src, v.B, v.T, v.S, &o) == MHA_E_NONFINITE);
    o.path = MHA_PATH_AUTO;
    CHECK_OK(mha_forward_kv(f.L, y_auto, NULL, f.x, f.k_src, f.v_src, v.B, v.T, v.S, &o));
    CHECK(memcmp(y_ref, y_auto, ny * sizeof(float)) == 0);
    free(y_ref), free(y_auto);
    grads_free(&ref), grads_free(&fast), grads_free(&aut), grads_free(&tape);
    // --- slopes 1e-9: scores within the range, the fast path serves the same positions
    float slopes[4] = {1e-9f, 2e-9f, 3e-9f, 4e-9f};
    mha_weights w = naive_weights_view(&f.w);
    w.alibi_slopes = slopes;
    CHECK_OK(mha_layer_set_weights(f.L, &w));
    check_case(&f, "alibi far keys, small slopes");
    free(pos), free(kpos);
    naive_bw_case_free(&f);
}

/* A layer with sinks under MHA_MASKED_ROW_NAN: a query with no allowed key
 * puts all its weight on the sink, so Z = 0 there as in ZERO mode (torch's
 * softmax over the scores and the sink logit, gpt-oss) and nothing is NaN:
 * y's rows of batch 1 (every key padded) are b_O on the reference and
 * fast paths, and the fast backward serves the call (not refused as a
 * NaN-mode masked row) within the rule. */
static void backward_variants_sinks_nan_mode_rows_are_zero(void) {
    const variant_case *v = &variant_cases[5]; /* sinks, padding: batch 1 has no key */
    naive_bw_case f;
    make_case(&f, v, 4300);
    int *pos, *kpos;
    uint8_t *keep;
    case_arrays(&f, v, &pos, &kpos, &keep);
    f.opt.masked_row = MHA_MASKED_ROW_NAN;
    const int D = f.w.cfg.d_model;
    float *y = naive_alloc_floats((size_t)f.B * f.T * D);
    for (int path = 0; f.L && path < 2; path++) {
        mha_options o = f.opt;
        o.path = path ? MHA_PATH_FAST : MHA_PATH_REFERENCE;
        CHECK_OK(mha_forward(f.L, y, NULL, f.x, NULL, f.B, f.T, f.T, &o));
        double off = 0.0;
        for (int t = 0; t < f.T; t++)
            for (int e = 0; e < D; e++) {
                const double d = fabs((double)y[((size_t)f.T + t) * D + e] - f.w.b_o[e]);
                if (!(d <= off)) off = d; /* NaN kept */
            }
        if (!(off <= 1e-6))
            test_report(__FILE__, __LINE__, "%s: y of a query with no key is %.3g from b_O (want Z = 0; NaN: %d)",
                        path ? "fast" : "reference", off, off != off);
    }
    check_case(&f, "sinks, NaN mode, rows with no key");
    free(y), free(pos), free(kpos), free(keep);
    naive_bw_case_free(&f);
}

static const test_case isa_cases[] = {
    {"backward_variants_sinks_nan_mode_rows_are_zero", backward_variants_sinks_nan_mode_rows_are_zero},
    {"backward_variants_fast_matches_reference", backward_variants_fast_matches_reference},
    {"backward_variants_rope_scalings", backward_variants_rope_scalings},
    {"backward_variants_temperature", backward_variants_temperature},
    {"backward_variants_threads_bit_identical", backward_variants_threads_bit_identical},
    {"backward_variants_partial_requests", backward_variants_partial_requests},
    {"backward_variants_dropout", backward_variants_dropout},
    {"backward_variants_alibi_far_keys_refused", backward_variants_alibi_far_keys_refused},
};

const test_case *tests_backward_variants_isa(size_t *count) {
    *count = sizeof isa_cases / sizeof isa_cases[0];
    return isa_cases;
}
