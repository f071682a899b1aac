/* test_backward.c — the reference backward against central finite
 * differences of the reference forward, for every forward option; the
 * per-head attribution against the ZERO intervention; argument checks.
 *
 * The loss is l = <dy, Y> summed in double. Finite differences use the
 * float actually stored (x+h and x-h rounded), so the only errors are the
 * rounding of Y (|dY| |Y| 2^-24 per element, twice, over the step) and the
 * truncation (c h^2, estimated from the same difference at step 2h: the
 * two differ by about 3 c h^2). The tolerance is the sum of those bounds.
 * Legend: B, T, S, h, h_kv, d_k, d_v, d_model, d_kv_in, d_v_in (see mha.h). */
#include <stdlib.h>
#include <string.h>

#include "naive.h"
#include "tests.h"

#define FD_STEP 0.015625 /* 2^-6: balances rounding (~1/h) and truncation (~h^2) */

typedef naive_bw_case bw_fixture;

/* a case on the reference path: the finite differences of this file */
static void bw_make(bw_fixture *f, mha_config c, int B, int T, int S, int k_given, int v_given,
                    uint64_t seed) {
    naive_bw_case_make(f, c, B, T, S, k_given, v_given, seed);
    f->opt = naive_ref_options();
}

/* l = <dy, Y> of the reference forward at the fixture's current values. */
static double bw_loss(bw_fixture *f) {
    const mha_config *c = &f->w.cfg;
    if (mha_forward_kv(f->L, f->y, NULL, f->x, f->k_src, f->v_src, f->B, f->T, f->S, &f->opt) != MHA_OK)
        return NAN;
    double l = 0.0;
    for (size_t i = 0; i < (size_t)f->B * f->T * c->d_model; i++) l += (double)f->dy[i] * f->y[i];
    return l;
}

/* Rounding bound of one loss evaluation: sum |dy| |Y| 2^-24 (plus a floor). */
static double bw_loss_rounding(bw_fixture *f) {
    double e = 0.0;
    bw_loss(f);
    for (size_t i = 0; i < (size_t)f->B * f->T * f->w.cfg.d_model; i++)
        e += fabs((double)f->dy[i] * f->y[i]);
    return e * 0x1p-24 + 1e-15;
}

/* One tensor to differentiate: its values (inside the fixture), its length,
 * the analytic gradient, and whether the layer must be reloaded after a change. */
typedef struct {
    const char *name;
    float *values;
    size_t n;
    const float *grad;
    int is_weight;
} bw_tensor;

/* Central difference at step h on entry i; returns dl/dvalue. */
static double bw_central(bw_fixture *f, const bw_tensor *t, size_t i, double h) {
    const float orig = t->values[i];
    const float up = (float)(orig + h), down = (float)(orig - h);
    mha_weights view = naive_weights_view(&f->w);
    t->values[i] = up;
    if (t->is_weight) mha_layer_set_weights(f->L, &view);
    double l_up = bw_loss(f);
    t->values[i] = down;
    if (t->is_weight) mha_layer_set_weights(f->L, &view);
    double l_down = bw_loss(f);
    t->values[i] = orig;
    if (t->is_weight) mha_layer_set_weights(f->L, &view);
    return (l_up - l_down) / ((double)up - (double)down);
}

/* Worst excess of |grad - fd| over its tolerance across the tensor (<= 0:
 * pass); reports the first failing entry. */
static double bw_check_tensor(bw_fixture *f, const bw_tensor *t, int report) {
    const double eps_l = bw_loss_rounding(f);
    double worst = -INFINITY;
    for (size_t i = 0; i < t->n; i++) {
        double fd = bw_central(f, t, i, FD_STEP), fd2 = bw_central(f, t, i, 2 * FD_STEP);
        double tol = 2 * eps_l / FD_STEP + 2 * eps_l / (2 * FD_STEP) + fabs(fd - fd2) +
                     fabs(t->grad[i]) * 0x1p-22;
        double excess = fabs(t->grad[i] - fd) - tol;
        if (!(excess <= 0.0) && report && worst <= 0.0)
            test_report(__FILE__, __LINE__, "d%s[%zu] = %.9g, finite difference %.9g (tol %.3g)",
                        t->name, i, (double)t->grad[i], fd, tol);
        if (!(excess <= worst)) worst = isnan(excess) ? INFINITY : excess;
    }
    return worst;
}

/* Gradient arrays for everything the fixture's layer and sources have. */
typedef struct {
    mha_gradients g;
    float *all[18];
} bw_grads;

static float *bw_alloc(bw_grads *gr, int *k, size_t n) {
    return gr->all[(*k)++] = calloc(n, sizeof(float));
}

static void bw_grads_make(bw_grads *gr, const bw_fixture *f) {
    const mha_config *c = &f->w.cfg;
    const size_t qw = (size_t)c->n_heads * c->d_k, kw = (size_t)c->n_kv_heads * c->d_k,
                 vw = (size_t)c->n_kv_heads * c->d_v, zw = (size_t)c->n_heads * c->d_v;
    int k = 0;
    memset(gr, 0, sizeof *gr);
    gr->g.dx = bw_alloc(gr, &k, (size_t)f->B * f->T * c->d_model);
    if (f->k_src) gr->g.dk_src = bw_alloc(gr, &k, (size_t)f->B * f->S * c->d_kv_in);
    if (f->v_src) gr->g.dv_src = bw_alloc(gr, &k, (size_t)f->B * f->S * c->d_v_in);
    gr->g.dw_q = bw_alloc(gr, &k, (size_t)c->d_model * qw);
    gr->g.dw_k = bw_alloc(gr, &k, (size_t)c->d_kv_in * kw);
    gr->g.dw_v = bw_alloc(gr, &k, (size_t)c->d_v_in * vw);
    gr->g.dw_o = bw_alloc(gr, &k, zw * c->d_model);
    if (c->bias) {
        gr->g.db_q = bw_alloc(gr, &k, qw);
        gr->g.db_k = bw_alloc(gr, &k, kw);
        gr->g.db_v = bw_alloc(gr, &k, vw);
        gr->g.db_o = bw_alloc(gr, &k, (size_t)c->d_model);
    }
    if (c->add_bias_kv) {
        gr->g.dbias_k = bw_alloc(gr, &k, kw);
        gr->g.dbias_v = bw_alloc(gr, &k, vw);
    }
    if (c->sinks) gr->g.d_sinks = bw_alloc(gr, &k, (size_t)c->n_heads);
    if (c->qk_norm != MHA_QK_NORM_NONE) {
        gr->g.d_q_norm = bw_alloc(gr, &k, (size_t)(c->qk_norm_per_head ? c->n_heads : 1) * c->d_k);
        gr->g.d_k_norm = bw_alloc(gr, &k, (size_t)(c->qk_norm_per_head ? c->n_kv_heads : 1) * c->d_k);
    }
    if (c->output_gate) gr->g.dw_g = bw_alloc(gr, &k, (size_t)c->d_model * zw);
    if (c->output_gate && c->bias) gr->g.db_g = bw_alloc(gr, &k, zw);
}

static void bw_grads_free(bw_grads *gr) {
    for (int i = 0; i < 18; i++) free(gr->all[i]);
}

/* The analytic backward, then every entry of every input and weight
 * against its finite difference. Returns the worst excess (<= 0: pass). */
static double bw_check_all(bw_fixture *f, bw_grads *gr, int report) {
    const mha_config *c = &f->w.cfg;
    const size_t qw = (size_t)c->n_heads * c->d_k, kw = (size_t)c->n_kv_heads * c->d_k,
                 vw = (size_t)c->n_kv_heads * c->d_v, zw = (size_t)c->n_heads * c->d_v;
    const mha_gradients *g = &gr->g;
    bw_tensor ts[] = {
        {"x", f->x, (size_t)f->B * f->T * c->d_model, g->dx, 0},
        {"k_src", f->k_src, (size_t)f->B * f->S * c->d_kv_in, g->dk_src, 0},
        {"v_src", f->v_src, (size_t)f->B * f->S * c->d_v_in, g->dv_src, 0},
        {"w_q", f->w.w_q, (size_t)c->d_model * qw, g->dw_q, 1},
        {"w_k", f->w.w_k, (size_t)c->d_kv_in * kw, g->dw_k, 1},
        {"w_v", f->w.w_v, (size_t)c->d_v_in * vw, g->dw_v, 1},
        {"w_o", f->w.w_o, zw * c->d_model, g->dw_o, 1},
        {"b_q", f->w.b_q, qw, g->db_q, 1},
        {"b_k", f->w.b_k, kw, g->db_k, 1},
        {"b_v", f->w.b_v, vw, g->db_v, 1},
        {"b_o", f->w.b_o, (size_t)c->d_model, g->db_o, 1},
        {"bias_k", f->w.bias_k, kw, g->dbias_k, 1},
        {"bias_v", f->w.bias_v, vw, g->dbias_v, 1},
        {"sinks", f->w.sinks, (size_t)c->n_heads, g->d_sinks, 1},
        {"q_norm", f->w.q_norm, (size_t)(c->qk_norm_per_head ? c->n_heads : 1) * c->d_k, g->d_q_norm, 1},
        {"k_norm", f->w.k_norm, (size_t)(c->qk_norm_per_head ? c->n_kv_heads : 1) * c->d_k, g->d_k_norm, 1},
        {"w_g", f->w.w_g, (size_t)c->d_model * zw, g->dw_g, 1},
        {"b_g", f->w.b_g, zw, g->db_g, 1},
    };
    double worst = -INFINITY;
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) {
        if (!ts[i].values || !ts[i].grad) continue;
        double e = bw_check_tensor(f, &ts[i], report);
        if (e > worst) worst = e;
    }
    return worst;
}

/* Every gradient the fixture has, from the backward with its options. */
static void bw_backward(bw_fixture *f, bw_grads *gr) {
    bw_grads_make(gr, f);
    CHECK_OK(mha_backward_kv(f->L, &gr->g, f->dy, f->x, f->k_src, f->v_src, f->B, f->T, f->S, &f->opt));
}

/* Runs the backward and the finite-difference check on a prepared fixture. */
static void bw_run(bw_fixture *f) {
    if (!f->L) return;
    bw_grads gr;
    bw_backward(f, &gr);
    CHECK(bw_check_all(f, &gr, 1) <= 0.0);
    bw_grads_free(&gr);
}

/* ------------------------------------------------------------ the cases */

static void backward_fd_self_attention(void) {
    bw_fixture f;
    bw_make(&f, naive_config(8, 2, 0, 0, 0, 1), 2, 3, 3, 0, 0, 1201);
    bw_run(&f); /* dx carries the Q, K and V paths */
    naive_bw_case_free(&f);
}

static void backward_fd_no_bias_scale(void) {
    bw_fixture f;
    bw_make(&f, naive_config(6, 3, 0, 2, 3, 0), 1, 4, 4, 0, 0, 1202);
    f.opt.scale = 0.8f;
    bw_run(&f);
    naive_bw_case_free(&f);
}

static void backward_fd_cross_separate_value(void) {
    bw_fixture f;
    mha_config c = naive_config(8, 2, 0, 3, 5, 1);
    c.d_kv_in = 6, c.d_v_in = 5;
    bw_make(&f, c, 2, 3, 4, 1, 1, 1203);
    bw_run(&f);
    naive_bw_case_free(&f);
    /* one key/value source: dk_src carries the K and V paths */
    c.d_v_in = 6;
    bw_make(&f, c, 1, 2, 5, 1, 0, 1204);
    bw_run(&f);
    naive_bw_case_free(&f);
}

static void backward_fd_gqa_mqa(void) {
    bw_fixture f;
    bw_make(&f, naive_config(8, 4, 2, 2, 2, 1), 2, 3, 3, 0, 0, 1205); /* GQA: kv heads sum 2 heads */
    f.opt.causal = 1;
    bw_run(&f);
    naive_bw_case_free(&f);
    bw_make(&f, naive_config(8, 4, 1, 2, 3, 1), 1, 3, 4, 1, 0, 1206); /* MQA, cross */
    bw_run(&f);
    naive_bw_case_free(&f);
}

static void backward_fd_causal_alignments_window(void) {
    bw_fixture f;
    bw_make(&f, naive_config(6, 2, 0, 0, 0, 1), 1, 3, 5, 1, 0, 1207);
    f.opt.causal = 1, f.opt.align = MHA_ALIGN_BOTTOM_RIGHT;
    bw_run(&f);
    f.opt.align = MHA_ALIGN_TOP_LEFT; /* rows see 1..3 of 5 keys */
    bw_run(&f);
    f.opt.causal = 0, f.opt.window_left = 1, f.opt.window_right = 1; /* sliding window */
    bw_run(&f);
    naive_bw_case_free(&f);
}

static void backward_fd_masks(void) {
    bw_fixture f;
    const int B = 2, T = 3, S = 4, h = 2;
    bw_make(&f, naive_config(6, h, 0, 0, 0, 1), B, T, S, 1, 0, 1208);
    uint8_t keep[2 * 2 * 3 * 4];     // (B,h,T,S)
    float add[3 * 4];                // (1,1,T,S)
    uint8_t key_keep[2 * 4] = {1, 1, 0, 1, 1, 0, 1, 1}; // (B,S)
    float key_add[2 * 4] = {0.3f, -0.2f, 0.0f, 0.5f, -1.0f, 0.0f, 0.25f, 0.0f};
    for (size_t i = 0; i < sizeof keep; i++) keep[i] = (uint8_t)((i * 7 + 3) % 5 != 0);
    for (size_t i = 0; i < 12; i++) add[i] = (i % 4 == 1) ? -INFINITY : 0.1f * (float)i - 0.4f;
    f.opt.keep_mask = (mha_mask){keep, B, h};
    bw_run(&f);
    f.opt.keep_mask.data = NULL;
    f.opt.additive_mask = (mha_mask){add, 1, 1};
    bw_run(&f);
    f.opt.additive_mask.data = NULL;
    f.opt.key_keep = key_keep, f.opt.key_additive = key_add;
    bw_run(&f);
    naive_bw_case_free(&f);
}

static void backward_fd_bias_kv_zero_attn(void) {
    bw_fixture f;
    mha_config c = naive_config(6, 2, 0, 0, 0, 1);
    c.add_bias_kv = 1, c.add_zero_attn = 1;
    bw_make(&f, c, 2, 3, 3, 0, 0, 1209);
    uint8_t key_keep[2 * 3] = {0, 0, 0, 1, 0, 1}; /* batch 0 sees only the extra keys */
    f.opt.key_keep = key_keep;
    bw_run(&f);
    naive_bw_case_free(&f);
    c.add_zero_attn = 0, c.n_kv_heads = 1; /* bias_kv alone, MQA */
    bw_make(&f, c, 1, 2, 3, 1, 0, 1210);
    bw_run(&f);
    naive_bw_case_free(&f);
}

static void backward_fd_interventions(void) {
    bw_fixture f;
    bw_make(&f, naive_config(8, 4, 0, 2, 2, 1), 2, 3, 3, 0, 0, 1211);
    float value[2 * 3 * 2]; // (B,T,d_v)
    uint64_t seed = 9;
    test_fill_uniform(value, 12, &seed, -1.0f, 1.0f);
    mha_intervention iv[4] = {{MHA_HEAD_ZERO, 0, NULL}, {MHA_HEAD_SCALE, -1.5f, NULL},
                              {MHA_HEAD_MEAN, 0, NULL}, {MHA_HEAD_REPLACE, 0, value}};
    f.opt.interventions = iv;
    bw_run(&f);
    naive_bw_case_free(&f);
}

/* The fast backward serves a variant layer (FAST gives AUTO's bits; its
 * error against the reference is test_backward_variants.c's). */
static void bw_check_fast_serves(bw_fixture *f) {
    if (!f->L) return;
    bw_grads a, b;
    mha_options o = f->opt;
    bw_grads_make(&a, f), bw_grads_make(&b, f);
    o.path = MHA_PATH_FAST;
    CHECK_OK(mha_backward_kv(f->L, &a.g, f->dy, f->x, f->k_src, f->v_src, f->B, f->T, f->S, &o));
    o.path = MHA_PATH_AUTO;
    CHECK_OK(mha_backward_kv(f->L, &b.g, f->dy, f->x, f->k_src, f->v_src, f->B, f->T, f->S, &o));
    CHECK(memcmp(a.g.dx, b.g.dx, sizeof(float) * (size_t)f->B * f->T * f->w.cfg.d_model) == 0);
    bw_grads_free(&a), bw_grads_free(&b);
}

/* Attention dropout (options.dropout_p, one seed): the drawn entries are
 * constants of the loss, so finite differences see the dropped layer:
 * causal self-attention with an intervention, GQA cross-attention with
 * the bias_kv and zero keys, sinks with ALiBi. */
static void backward_fd_dropout(void) {
    bw_fixture f;
    bw_make(&f, naive_config(8, 4, 0, 2, 2, 1), 2, 4, 4, 0, 0, 1281);
    mha_intervention iv[4] = {{MHA_HEAD_KEEP, 0, NULL}, {MHA_HEAD_SCALE, -1.5f, NULL}, {MHA_HEAD_KEEP, 0, NULL},
                              {MHA_HEAD_KEEP, 0, NULL}};
    f.opt.interventions = iv;
    f.opt.causal = 1, f.opt.dropout_p = 0.3f, f.opt.dropout_seed = 77;
    bw_run(&f);
    naive_bw_case_free(&f);
    mha_config c = naive_config(8, 4, 2, 2, 2, 1);
    c.add_bias_kv = c.add_zero_attn = 1, c.d_kv_in = 5;
    bw_make(&f, c, 2, 3, 4, 1, 0, 1282);
    f.opt.dropout_p = 0.5f, f.opt.dropout_seed = 78;
    bw_run(&f);
    naive_bw_case_free(&f);
    c = naive_config(8, 2, 1, 4, 4, 1);
    c.sinks = c.alibi = 1;
    bw_make(&f, c, 1, 5, 5, 0, 0, 1283);
    f.opt.causal = 1, f.opt.dropout_p = 0.2f, f.opt.dropout_seed = 79;
    bw_run(&f);
    bw_check_fast_serves(&f);
    naive_bw_case_free(&f);
}

/* Gated attention (Qwen3-Next): Z' = Z * sigmoid(x W_G + b_G) before the
 * interventions and W_O; self-attention with every intervention, GQA
 * cross-attention from two sources without bias, and MQA with RoPE and
 * QK-norm (Qwen3-Next's own combination). */
static void backward_fd_output_gate(void) {
    bw_fixture f;
    mha_config c = naive_config(8, 4, 0, 2, 2, 1);
    c.output_gate = 1;
    bw_make(&f, c, 2, 3, 3, 0, 0, 1271);
    float value[2 * 3 * 2]; // (B,T,d_v)
    uint64_t seed = 11;
    test_fill_uniform(value, 12, &seed, -1.0f, 1.0f);
    mha_intervention iv[4] = {{MHA_HEAD_KEEP, 0, NULL}, {MHA_HEAD_SCALE, -1.5f, NULL},
                              {MHA_HEAD_MEAN, 0, NULL}, {MHA_HEAD_REPLACE, 0, value}};
    f.opt.interventions = iv;
    f.opt.causal = 1;
    bw_run(&f);
    naive_bw_case_free(&f);
    c = naive_config(8, 4, 2, 2, 3, 0);
    c.output_gate = 1, c.d_kv_in = 5, c.d_v_in = 6;
    bw_make(&f, c, 2, 3, 4, 1, 1, 1272);
    bw_run(&f);
    naive_bw_case_free(&f);
    c = naive_config(8, 2, 1, 4, 4, 1);
    c.output_gate = 1, c.qk_norm = MHA_QK_NORM_RMS, c.rope.pairing = MHA_ROPE_HALVES;
    bw_make(&f, c, 1, 4, 4, 0, 0, 1273);
    f.opt.causal = 1;
    bw_run(&f);
    bw_check_fast_serves(&f);
    naive_bw_case_free(&f);
}

/* ALiBi (a constant bias: no gradient of its own) and soft-capping (dS
 * times 1 - tanh^2) on the reference backward, self and cross attention,
 * causal; the fast backward serves them too. */
static void backward_fd_alibi_softcap(void) {
    bw_fixture f;
    mha_config c = naive_config(8, 2, 0, 0, 0, 1);
    c.alibi = 1, c.softcap = 0.75f;
    bw_make(&f, c, 1, 4, 4, 0, 0, 1217);
    f.opt.causal = 1;
    bw_run(&f);
    bw_check_fast_serves(&f);
    naive_bw_case_free(&f);
    c.softcap = 0.0f; /* cross attention: key positions are the key source's */
    bw_make(&f, c, 2, 3, 5, 1, 0, 1218);
    bw_run(&f);
    naive_bw_case_free(&f);
    c.alibi = 0, c.softcap = 0.5f;
    bw_make(&f, c, 1, 3, 3, 0, 0, 1219);
    bw_run(&f);
    naive_bw_case_free(&f);
}


/* RoPE: dQ = dQ_rot R^T (the inverse rotation), the same for K. Both
 * pairings, partial rotary, GQA, causal, explicit query and key positions
 * on cross attention, and the three scalings (YaRN also scales by mscale). */
static void backward_fd_rope(void) {
    bw_fixture f;
    mha_config c = naive_config(8, 4, 2, 4, 0, 1);
    c.rope.pairing = MHA_ROPE_HALVES;
    bw_make(&f, c, 1, 4, 4, 0, 0, 1231);
    f.opt.causal = 1;
    bw_run(&f);
    bw_check_fast_serves(&f);
    naive_bw_case_free(&f);
    c.rope.pairing = MHA_ROPE_INTERLEAVED, c.rope.dim = 2, c.rope.theta = 10.0; /* partial: dims 2, 3 pass */
    bw_make(&f, c, 2, 3, 4, 1, 0, 1232);
    const int pos[2 * 3] = {5, 1, 9, 0, 7, 3}, kpos[2 * 4] = {2, 8, 4, 6, 1, 0, 11, 3};
    f.opt.positions = pos, f.opt.key_positions = kpos;
    bw_run(&f);
    naive_bw_case_free(&f);
    c = naive_config(8, 2, 0, 4, 0, 0);
    c.rope.pairing = MHA_ROPE_HALVES, c.rope.theta = 100.0;
    c.rope.scaling = MHA_ROPE_SCALE_YARN, c.rope.factor = 4.0, c.rope.original_max_positions = 8;
    bw_make(&f, c, 1, 5, 5, 0, 0, 1233);
    bw_run(&f);
    naive_bw_case_free(&f);
    c.rope.scaling = MHA_ROPE_SCALE_LLAMA3, c.rope.pairing = MHA_ROPE_INTERLEAVED;
    bw_make(&f, c, 1, 3, 3, 0, 0, 1234);
    bw_run(&f);
    naive_bw_case_free(&f);
}

/* Llama 4's query temperature: dQ before it is s(p) dQ after it, row by
 * row; a NoPE GQA layer whose positions (floor 2) give three factors, and
 * one with RoPE and an RMS QK-norm before the temperature at explicit
 * positions (factors 1 to 2.4 at scale 0.5). */
static void backward_fd_temperature(void) {
    bw_fixture f;
    mha_config c = naive_config(8, 4, 2, 4, 0, 1);
    c.temperature_floor = 2, c.temperature_scale = 0.5f;
    bw_make(&f, c, 2, 5, 5, 0, 0, 1241);
    f.opt.causal = 1;
    bw_run(&f);
    bw_check_fast_serves(&f);
    naive_bw_case_free(&f);
    c.rope.pairing = MHA_ROPE_HALVES, c.qk_norm = MHA_QK_NORM_RMS;
    bw_make(&f, c, 2, 3, 4, 1, 0, 1242);
    const int pos[2 * 3] = {5, 1, 9, 0, 7, 30}, kpos[2 * 4] = {2, 8, 4, 6, 1, 0, 11, 3};
    f.opt.positions = pos, f.opt.key_positions = kpos;
    bw_run(&f);
    naive_bw_case_free(&f);
}

/* Sinks: dS unchanged in form (the sink has no dP), and
 * dsink_r = -sum over rows of p_sink * rowsum(P * dP), checked by finite
 * differences of the sink logits; GQA, causal, padded keys, with RoPE. */
static void backward_fd_sinks(void) {
    bw_fixture f;
    mha_config c = naive_config(8, 4, 2, 0, 0, 1);
    c.sinks = 1;
    bw_make(&f, c, 2, 4, 4, 0, 0, 1241);
    f.opt.causal = 1;
    bw_run(&f);
    bw_check_fast_serves(&f);
    naive_bw_case_free(&f);
    bw_make(&f, c, 2, 3, 4, 1, 1, 1242);
    const uint8_t keep[2 * 4] = {1, 1, 0, 1, 1, 0, 0, 0}; // (B,S): padded keys
    f.opt.key_keep = keep;
    bw_run(&f);
    naive_bw_case_free(&f);
    c.rope.pairing = MHA_ROPE_HALVES, c.softcap = 1.5f, c.alibi = 1;
    bw_make(&f, c, 1, 4, 4, 0, 0, 1243);
    for (int r = 0; f.L && r < 4; r++) f.w.sinks[r] *= 4.0f; /* a sink that dominates some rows */
    mha_weights view = naive_weights_view(&f.w);
    if (f.L) CHECK_OK(mha_layer_set_weights(f.L, &view));
    bw_run(&f);
    naive_bw_case_free(&f);
}

/* QK-norm: the backward through RMSNorm / LayerNorm to the pre-norm Q and
 * K, and the norm weights' gradients; shared and per-head weights, the
 * whole-width norm (OLMo 2), with RoPE after it; GQA, causal, padding. */
static void backward_fd_qk_norm(void) {
    bw_fixture f;
    mha_config c = naive_config(8, 4, 2, 4, 0, 1); /* d_k 4: a LayerNorm over 2 dims is a sign */
    c.qk_norm = MHA_QK_NORM_RMS;
    bw_make(&f, c, 2, 3, 3, 0, 0, 1251);
    f.opt.causal = 1;
    bw_run(&f);
    bw_check_fast_serves(&f);
    naive_bw_case_free(&f);
    c.qk_norm = MHA_QK_NORM_LAYER, c.qk_norm_per_head = 1, c.rope.pairing = MHA_ROPE_HALVES;
    bw_make(&f, c, 2, 3, 4, 1, 0, 1252);
    const uint8_t keep[2 * 4] = {1, 0, 1, 1, 1, 1, 0, 0}; // (B,S): padded keys
    f.opt.key_keep = keep;
    bw_run(&f);
    naive_bw_case_free(&f);
    c.qk_norm = MHA_QK_NORM_RMS, c.qk_norm_whole = 1, c.rope.pairing = MHA_ROPE_INTERLEAVED;
    bw_make(&f, c, 1, 4, 4, 0, 0, 1253);
    f.opt.causal = 1;
    bw_run(&f);
    naive_bw_case_free(&f);
    c.qk_norm = MHA_QK_NORM_LAYER, c.rope.pairing = MHA_ROPE_NONE; /* whole-width LayerNorm */
    bw_make(&f, c, 1, 3, 3, 0, 0, 1254);
    bw_run(&f);
    naive_bw_case_free(&f);
}

/* The sources and the Q, K, V weights and biases rounded to multiples of
 * 1/2: every projection is a multiple of 1/4, 1/8 from a clip_qkv bound
 * of 5/8 (a step of 2 FD_STEP moves it by at most 2 FD_STEP |x| = 1/32). */
static void bw_grid(bw_fixture *f) {
    const mha_config *c = &f->w.cfg;
    const size_t qw = (size_t)c->n_heads * c->d_k, kw = (size_t)c->n_kv_heads * c->d_k,
                 vw = (size_t)c->n_kv_heads * c->d_v;
    float *t[8] = {f->x, f->k_src, f->v_src, f->w.w_q, f->w.w_k, f->w.w_v, f->w.b_q, f->w.b_k};
    const size_t n[8] = {(size_t)f->B * f->T * c->d_model, (size_t)f->B * f->S * c->d_kv_in,
                         (size_t)f->B * f->S * c->d_v_in, (size_t)c->d_model * qw, (size_t)c->d_kv_in * kw,
                         (size_t)c->d_v_in * vw, qw, kw};
    for (int a = 0; a < 8; a++)
        for (size_t i = 0; t[a] && i < n[a]; i++) t[a][i] = roundf(t[a][i] * 2.0f) / 2.0f;
    for (size_t i = 0; i < vw; i++) f->w.b_v[i] = roundf(f->w.b_v[i] * 2.0f) / 2.0f;
    mha_weights view = naive_weights_view(&f->w);
    if (f->L) CHECK_OK(mha_layer_set_weights(f->L, &view));
}

/* clip_qkv: Q, K, V clamped to [-c, c] after the projections; the
 * gradient passes where the projection was within and is 0 outside, so
 * dW and db of the projections take the masked gradient. On bw_grid's
 * values with c = 5/8 no difference step crosses a bound, and some of Q,
 * K and V are clamped (checked); self and cross attention, with RoPE and
 * QK-norm after the clamp (OLMo 1, DBRX). */
static void backward_fd_clip_qkv(void) {
    bw_fixture f;
    mha_config c = naive_config(8, 4, 2, 4, 0, 1);
    c.clip_qkv = 0.625f;
    for (int round = 0; round < 2; round++) {
        if (round) c.rope.pairing = MHA_ROPE_HALVES, c.qk_norm = MHA_QK_NORM_RMS;
        bw_make(&f, c, 2, 3, round ? 4 : 3, round, round, 1261 + round);
        f.opt.causal = !round;
        bw_grid(&f);
        /* the clamp matters: y differs from the same layer without it */
        mha_config off = f.w.cfg;
        off.clip_qkv = 0.0f;
        mha_weights view = naive_weights_view(&f.w);
        mha_layer *L0 = NULL;
        CHECK_OK(mha_layer_create(&L0, &off, &view));
        const size_t ny = (size_t)f.B * f.T * c.d_model;
        float *y0 = naive_alloc_floats(ny), *y1 = naive_alloc_floats(ny);
        if (L0 && f.L) {
            CHECK_OK(mha_forward_kv(L0, y0, NULL, f.x, f.k_src, f.v_src, f.B, f.T, f.S, &f.opt));
            CHECK_OK(mha_forward_kv(f.L, y1, NULL, f.x, f.k_src, f.v_src, f.B, f.T, f.S, &f.opt));
            double d = 0.0;
            for (size_t i = 0; i < ny; i++) d = fmax(d, fabs((double)y0[i] - y1[i]));
            CHECK(d > 1e-2);
        }
        free(y0), free(y1);
        mha_layer_free(L0);
        bw_run(&f);
        if (!round) bw_check_fast_serves(&f);
        naive_bw_case_free(&f);
    }
}

/* torch's clamp passes the gradient at the bounds (min <= x <= max): a
 * clip_qkv equal to the largest |Q|, |K| or |V| (bw_grid's values: exact
 * in fp32) clamps nothing, so y and every gradient, reference and fast,
 * are those of the same layer without the clamp, although some entries
 * sit on a bound. */
static void backward_clip_qkv_bounds_pass(void) {
    bw_fixture f;
    mha_config c = naive_config(8, 4, 2, 4, 0, 1);
    c.clip_qkv = 1.0f; /* replaced below by the largest |projection| */
    bw_make(&f, c, 2, 3, 3, 0, 0, 1263);
    if (!f.L) return;
    bw_grid(&f);
    const mha_config *r = &f.w.cfg;
    const int D = r->d_model, qw = r->n_heads * r->d_k, kw = r->n_kv_heads * r->d_k;
    double big = 0.0;
    for (int t = 0; t < f.B * f.T; t++) {
        const float *mats[3] = {f.w.w_q, f.w.w_k, f.w.w_v}, *bias[3] = {f.w.b_q, f.w.b_k, f.w.b_v};
        const int width[3] = {qw, kw, kw};
        for (int m = 0; m < 3; m++)
            for (int o = 0; o < width[m]; o++) {
                double a = bias[m][o];
                for (int i = 0; i < D; i++) a += (double)f.x[(size_t)t * D + i] * mats[m][(size_t)i * width[m] + o];
                big = fmax(big, fabs(a));
            }
    }
    mha_config on = *r, off = *r;
    on.clip_qkv = (float)big, off.clip_qkv = 0.0f;
    CHECK(on.clip_qkv == big && big > 0.0);
    mha_weights view = naive_weights_view(&f.w);
    mha_layer *L_on = NULL, *L_off = NULL;
    CHECK_OK(mha_layer_create(&L_on, &on, &view));
    CHECK_OK(mha_layer_create(&L_off, &off, &view));
    for (int path = MHA_PATH_REFERENCE; L_on && L_off && path <= MHA_PATH_FAST; path++) {
        mha_options o = f.opt;
        o.causal = 1, o.path = (mha_path)path;
        bw_grads a, b;
        mha_layer *saved = f.L;
        f.L = L_on, bw_grads_make(&a, &f);
        CHECK_OK(mha_backward_kv(L_on, &a.g, f.dy, f.x, NULL, NULL, f.B, f.T, f.S, &o));
        f.L = L_off, bw_grads_make(&b, &f);
        CHECK_OK(mha_backward_kv(L_off, &b.g, f.dy, f.x, NULL, NULL, f.B, f.T, f.S, &o));
        f.L = saved;
        const size_t n[5] = {(size_t)f.B * f.T * D, (size_t)D * qw, (size_t)D * kw, (size_t)D * kw, (size_t)qw};
        const float *ga[5] = {a.g.dx, a.g.dw_q, a.g.dw_k, a.g.dw_v, a.g.db_q}, *gb[5] = {b.g.dx, b.g.dw_q, b.g.dw_k, b.g.dw_v, b.g.db_q};
        for (int i = 0; i < 5; i++)
            if (memcmp(ga[i], gb[i], n[i] * sizeof(float)))
                test_report(__FILE__, __LINE__, "path %d: gradient %d with clip_qkv = max |projection| = %g "
                            "differs from the unclamped layer's", path, i, big);
        bw_grads_free(&a), bw_grads_free(&b);
    }
    mha_layer_free(L_on), mha_layer_free(L_off);
    naive_bw_case_free(&f);
}

static void backward_fully_masked_row(void) {
    bw_fixture f;
    const int B = 1, T = 3, S = 4;
    bw_make(&f, naive_config(6, 2, 0, 0, 0, 1), B, T, S, 1, 0, 1212);
    uint8_t keep[3 * 4] = {1, 1, 0, 1, 0, 0, 0, 0, 0, 1, 1, 1}; // (1,1,T,S): row 1 sees nothing
    f.opt.keep_mask = (mha_mask){keep, 1, 1};
    bw_run(&f);
    bw_grads gr;
    bw_backward(&f, &gr);
    double row1 = 0.0, row0 = 0.0;
    for (int e = 0; e < 6; e++) row1 += fabs(gr.g.dx[6 + e]), row0 += fabs(gr.g.dx[e]);
    CHECK(row1 == 0.0);
    CHECK(row0 > 0.0);
    f.opt.masked_row = MHA_MASKED_ROW_NAN;
    CHECK_OK(mha_backward_kv(f.L, &gr.g, f.dy, f.x, f.k_src, NULL, B, T, S, &f.opt));
    CHECK(isnan(gr.g.dx[6]) && isnan(gr.g.dw_o[0]));
    CHECK(!isnan(gr.g.db_o[0])); /* db_O = sum dY does not read Z */
    bw_grads_free(&gr);
    naive_bw_case_free(&f);
}

/* The checker itself: a gradient off by 1e-3 in one entry must fail. */
static void backward_fd_detects_wrong_gradient(void) {
    bw_fixture f;
    bw_make(&f, naive_config(6, 2, 0, 0, 0, 1), 1, 3, 3, 0, 0, 1213);
    bw_grads gr;
    bw_backward(&f, &gr);
    CHECK(bw_check_all(&f, &gr, 1) <= 0.0);
    gr.g.dw_q[5] += 1e-3f;
    CHECK(bw_check_all(&f, &gr, 0) > 0.0);
    bw_grads_free(&gr);
    naive_bw_case_free(&f);
}

/* Only the wanted gradients are written; the rest equal a full call's. */
static void backward_partial_request(void) {
    bw_fixture f;
    bw_make(&f, naive_config(6, 2, 0, 0, 0, 1), 1, 3, 3, 0, 0, 1214);
    bw_grads all;
    bw_backward(&f, &all);
    float dw_o[6 * 6];
    mha_gradients one = {0};
    one.dw_o = dw_o;
    CHECK_OK(mha_backward(f.L, &one, f.dy, f.x, NULL, 1, 3, 3, &f.opt)); /* the same path */
    CHECK_ARRAY_NEAR(dw_o, all.g.dw_o, 36, 0.0);
    bw_grads_free(&all);
    naive_bw_case_free(&f);
}

static void backward_errors(void) {
    bw_fixture f;
    bw_make(&f, naive_config(6, 2, 0, 0, 0, 0), 1, 2, 2, 0, 0, 1215);
    float buf[64], db[6];
    mha_gradients g = {0};
    g.dx = buf;
    CHECK_STATUS(mha_backward(f.L, NULL, f.dy, f.x, NULL, 1, 2, 2, NULL), MHA_E_ARG);
    CHECK_STATUS(mha_backward(f.L, &g, NULL, f.x, NULL, 1, 2, 2, NULL), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("dy");
    g.db_o = db;
    CHECK_STATUS(mha_backward(f.L, &g, f.dy, f.x, NULL, 1, 2, 2, NULL), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("no bias");
    g.db_o = NULL, g.dbias_k = db;
    CHECK_STATUS(mha_backward(f.L, &g, f.dy, f.x, NULL, 1, 2, 2, NULL), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("add_bias_kv");
    g.dbias_k = NULL, g.dk_src = buf;
    CHECK_STATUS(mha_backward(f.L, &g, f.dy, f.x, NULL, 1, 2, 2, NULL), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("dk_src");
    g.dk_src = NULL;
    CHECK_STATUS(mha_backward(f.L, &g, f.dy, f.x, NULL, 1, 2, 3, NULL), MHA_E_SHAPE);
    CHECK_ERROR_MENTIONS("mha_backward: self-attention"); /* the entry called, not mha_forward */
    CHECK_STATUS(mha_backward(NULL, &g, f.dy, f.x, NULL, 1, 2, 2, NULL), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("mha_backward: layer is NULL");
    mha_tape *tape = NULL;
    CHECK_STATUS(mha_forward_train(f.L, f.y, &tape, f.x, NULL, NULL, 0, 2, 2, NULL), MHA_E_SHAPE);
    CHECK_ERROR_MENTIONS("mha_forward_train: B=0");
    f.dy[3] = NAN;
    CHECK_STATUS(mha_backward(f.L, &g, f.dy, f.x, NULL, 1, 2, 2, NULL), MHA_E_NONFINITE);
    CHECK_ERROR_MENTIONS("dy[3]");
    f.dy[3] = 0.0f;
    mha_options o = mha_options_default();
    o.path = MHA_PATH_FAST;
    CHECK_OK(mha_backward(f.L, &g, f.dy, f.x, NULL, 1, 2, 2, &o)); /* the fast backward */
    naive_bw_case_free(&f);
}

/* A gradient written over an input (an in-place dx = x, dk_src = k_src,
 * dx = dy) or over another gradient is refused on every path, naming both,
 * before anything is written: the fast backward writes dx while the key
 * and value paths still read x, which gave dW_V 100% off with status OK. */
static void backward_overlapping_outputs_refused(void) {
    bw_fixture f;
    bw_make(&f, naive_config(8, 2, 1, 0, 0, 1), 2, 5, 5, 1, 0, 1216); /* keys from k_src (B,S,d_kv_in) */
    bw_grads gr;
    bw_grads_make(&gr, &f);
    const size_t nx = (size_t)2 * 5 * 8;
    float *x0 = malloc(nx * sizeof(float)), *dw_k = gr.g.dw_k, *dx = gr.g.dx, *dk = gr.g.dk_src;
    memcpy(x0, f.x, nx * sizeof(float));
    static const mha_path paths[] = {MHA_PATH_FAST, MHA_PATH_REFERENCE, MHA_PATH_AUTO};
    for (int p = 0; p < 3; p++) {
        f.opt.path = paths[p];
        gr.g.dx = f.x; /* in place */
        CHECK_STATUS(mha_backward_kv(f.L, &gr.g, f.dy, f.x, f.k_src, NULL, 2, 5, 5, &f.opt), MHA_E_ARG);
        CHECK_ERROR_MENTIONS("grad.dx overlaps x");
        CHECK_ARRAY_NEAR(f.x, x0, nx, 0.0); /* nothing written */
        gr.g.dx = f.dy;
        CHECK_STATUS(mha_backward_kv(f.L, &gr.g, f.dy, f.x, f.k_src, NULL, 2, 5, 5, &f.opt), MHA_E_ARG);
        CHECK_ERROR_MENTIONS("overlaps dy");
        gr.g.dx = dx, gr.g.dk_src = f.k_src + 3; /* partly */
        CHECK_STATUS(mha_backward_kv(f.L, &gr.g, f.dy, f.x, f.k_src, NULL, 2, 5, 5, &f.opt), MHA_E_ARG);
        CHECK_ERROR_MENTIONS("grad.dk_src overlaps k_src");
        gr.g.dk_src = dk, gr.g.dw_k = gr.g.dw_q; /* one buffer for two gradients */
        CHECK_STATUS(mha_backward_kv(f.L, &gr.g, f.dy, f.x, f.k_src, NULL, 2, 5, 5, &f.opt), MHA_E_ARG);
        CHECK_ERROR_MENTIONS("grad.dw_q overlaps grad.dw_k");
        gr.g.dw_k = dw_k;
        CHECK_OK(mha_backward_kv(f.L, &gr.g, f.dy, f.x, f.k_src, NULL, 2, 5, 5, &f.opt)); /* apart: fine */
    }
    free(x0);
    bw_grads_free(&gr);
    naive_bw_case_free(&f);
}

/* ------------------------------------------------------------ attribution */

/* attribution[r,b,t] = <dy, Y>[b,t] - <dy, Y with head r zeroed>[b,t],
 * per position, computed independently from two forwards. */
static void attribution_equals_zero_ablation(void) {
    bw_fixture f;
    const int B = 2, T = 3, h = 4, D = 8;
    bw_make(&f, naive_config(D, h, 2, 2, 3, 1), B, T, T, 0, 0, 1216);
    f.opt.causal = 1;
    float attr[4 * 2 * 3], dz[2 * 3 * 4 * 3], y[2 * 3 * 8], ya[2 * 3 * 8]; // (h,B,T) (B,T,h*d_v) (B,T,D)x2
    CHECK_OK(mha_head_attribution(f.L, attr, dz, f.dy, f.x, NULL, NULL, B, T, T, &f.opt));
    CHECK_OK(mha_forward(f.L, y, NULL, f.x, NULL, B, T, T, &f.opt));
    double total = 0.0;
    for (int r = 0; r < h; r++) {
        mha_intervention iv[4] = {{0}};
        iv[r].op = MHA_HEAD_ZERO;
        mha_options o = f.opt;
        o.interventions = iv;
        CHECK_OK(mha_forward(f.L, ya, NULL, f.x, NULL, B, T, T, &o));
        for (int t = 0; t < B * T; t++) {
            double change = 0.0;
            for (int e = 0; e < D; e++) change += (double)f.dy[t * D + e] * ((double)y[t * D + e] - ya[t * D + e]);
            CHECK_NEAR(attr[r * B * T + t], change, 1e-5);
            total += fabs(change);
        }
    }
    CHECK(total > 0.1); /* the heads matter: the equality is not 0 = 0 */
    /* dZ is the gradient of <dy, Y> with respect to Z: the backward's dW_O = Z^T dZ route agrees */
    float z[2 * 3 * 12];
    mha_capture cap = {z, NULL, NULL};
    CHECK_OK(mha_forward(f.L, y, &cap, f.x, NULL, B, T, T, &f.opt));
    for (int r = 0; r < h; r++) {
        double a = 0.0;
        for (int e = 0; e < 3; e++) a += (double)z[4 * 12 + r * 3 + e] * dz[4 * 12 + r * 3 + e];
        CHECK_NEAR(attr[r * B * T + 4], a, 1e-6);
    }
    naive_bw_case_free(&f);
}

static void attribution_errors(void) {
    bw_fixture f;
    bw_make(&f, naive_config(6, 2, 0, 0, 0, 1), 1, 2, 2, 0, 0, 1217);
    float attr[4];
    CHECK_STATUS(mha_head_attribution(f.L, NULL, NULL, f.dy, f.x, NULL, NULL, 1, 2, 2, NULL), MHA_E_ARG);
    CHECK_STATUS(mha_head_attribution(f.L, attr, NULL, NULL, f.x, NULL, NULL, 1, 2, 2, NULL), MHA_E_ARG);
    CHECK_STATUS(mha_head_attribution(f.L, attr, NULL, f.dy, f.x, NULL, NULL, 1, 2, 3, NULL), MHA_E_SHAPE);
    f.dy[0] = INFINITY;
    CHECK_STATUS(mha_head_attribution(f.L, attr, NULL, f.dy, f.x, NULL, NULL, 1, 2, 2, NULL), MHA_E_NONFINITE);
    naive_bw_case_free(&f);
}

static const test_case cases[] = {
    {"backward_fd_self_attention", backward_fd_self_attention},
    {"backward_fd_no_bias_scale", backward_fd_no_bias_scale},
    {"backward_fd_cross_separate_value", backward_fd_cross_separate_value},
    {"backward_fd_gqa_mqa", backward_fd_gqa_mqa},
    {"backward_fd_causal_alignments_window", backward_fd_causal_alignments_window},
    {"backward_fd_masks", backward_fd_masks},
    {"backward_fd_bias_kv_zero_attn", backward_fd_bias_kv_zero_attn},
    {"backward_fd_interventions", backward_fd_interventions},
    {"backward_fd_alibi_softcap", backward_fd_alibi_softcap},
    {"backward_fd_rope", backward_fd_rope},
    {"backward_fd_sinks", backward_fd_sinks},
    {"backward_fd_qk_norm", backward_fd_qk_norm},
    {"backward_fd_clip_qkv", backward_fd_clip_qkv},
    {"backward_fd_temperature", backward_fd_temperature},
    {"backward_fd_output_gate", backward_fd_output_gate},
    {"backward_fd_dropout", backward_fd_dropout},
    {"backward_clip_qkv_bounds_pass", backward_clip_qkv_bounds_pass},
    {"backward_fully_masked_row", backward_fully_masked_row},
    {"backward_fd_detects_wrong_gradient", backward_fd_detects_wrong_gradient},
    {"backward_partial_request", backward_partial_request},
    {"backward_errors", backward_errors},
    {"backward_overlapping_outputs_refused", backward_overlapping_outputs_refused},
    {"attribution_equals_zero_ablation", attribution_equals_zero_ablation},
    {"attribution_errors", attribution_errors},
};

const test_case *tests_backward(size_t *count) {
    *count = sizeof cases / sizeof cases[0];
    return cases;
}
