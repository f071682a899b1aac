/* demo_layer.c — sections 6 and 7 of `mha demo`: the lesson's shape
 * bookkeeping on a real layer, and a full causal layer whose head order is
 * permuted consistently (Y unchanged) and one-sidedly (Y changes, the
 * contract check names the block).
 * Legend: B batch, T tokens, h heads, d_k, d_v, d_model (see mha.h). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "demo.h"

void mha_demo_fill_uniform(float *p, size_t n, uint64_t *state, float lo, float hi) {
    for (size_t i = 0; i < n; i++) {
        uint64_t x = (*state += 0x9E3779B97F4A7C15ull);
        x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
        x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
        x ^= x >> 31;
        p[i] = lo + (hi - lo) * (float)((double)(x >> 11) / 9007199254740992.0);
    }
}

/* Owned weight arrays of a self-attention layer with biases. */
typedef struct {
    float *w_q, *w_k, *w_v, *w_o; /* (d_model, h*d_k) x3 (MHA), (h*d_v, d_model) */
    float *b_q, *b_k, *b_v, *b_o; /* (h*d_k) x2, (h*d_v), (d_model)              */
    float *all;
} demo_weights;

static int weights_random(demo_weights *w, const mha_config *c, uint64_t seed) {
    size_t dq = (size_t)c->n_heads * c->d_k, dk = (size_t)c->n_kv_heads * c->d_k;
    size_t dv = (size_t)c->n_kv_heads * c->d_v, dm = (size_t)c->d_model;
    size_t n[8] = {dm * dq, (size_t)c->d_kv_in * dk, (size_t)c->d_kv_in * dv, (size_t)c->n_heads * c->d_v * dm,
                   dq, dk, dv, dm};
    size_t total = 0;
    for (int i = 0; i < 8; i++) total += n[i];
    w->all = malloc(total * sizeof(float));
    if (!w->all) return 1;
    mha_demo_fill_uniform(w->all, total, &seed, -0.5f, 0.5f);
    float **dst[8] = {&w->w_q, &w->w_k, &w->w_v, &w->w_o, &w->b_q, &w->b_k, &w->b_v, &w->b_o};
    float *p = w->all;
    for (int i = 0; i < 8; i++) {
        *dst[i] = p;
        p += n[i];
    }
    return 0;
}

static mha_weights weights_view(const demo_weights *w) {
    mha_weights v = {.w_q = w->w_q, .w_k = w->w_k, .w_v = w->w_v, .w_o = w->w_o,
                     .b_q = w->b_q, .b_k = w->b_k, .b_v = w->b_v, .b_o = w->b_o};
    return v;
}

static const char *block_name(mha_block b) {
    switch (b) {
    case MHA_BLOCK_Q: return "W_Q column blocks";
    case MHA_BLOCK_K: return "W_K column blocks";
    case MHA_BLOCK_V: return "W_V column blocks";
    case MHA_BLOCK_O: return "W_O row blocks";
    case MHA_BLOCK_S: return "score parameters (ALiBi slopes, sinks)";
    }
    return "?";
}

/* Prints the labels of all four block kinds; returns 0 or 1 on error. */
static int print_labels(const mha_layer *L) {
    const mha_config *c = mha_layer_config(L);
    for (int b = MHA_BLOCK_Q; b <= MHA_BLOCK_O; b++) {
        int labels[64];
        int n = (b == MHA_BLOCK_K || b == MHA_BLOCK_V) ? c->n_kv_heads : c->n_heads;
        MHA_DEMO_TRY(mha_layer_labels(L, (mha_block)b, labels));
        mha_demo_labels(block_name((mha_block)b), labels, n);
    }
    return 0;
}

/* ------------------------------------------ 6. shape bookkeeping */

int mha_demo_shapes(mha_demo *d) {
    mha_demo_banner("6. Shape bookkeeping: n tokens, d_model = 8, two heads");
    enum { n = 3 };
    mha_config c = mha_config_default(8, 2);
    c.bias = 1;
    MHA_DEMO_TRY(mha_config_resolve(&c, &c));
    printf("  mha_config_resolve(d_model = 8, h = 2) -> d_k = %d, d_v = %d  (d_model / h)\n", c.d_k, c.d_v);

    demo_weights w;
    if (weights_random(&w, &c, 6)) return mha_demo_lib_error("malloc", MHA_E_NOMEM);
    float x[n * 8], y[n * 8], z[n * 8], y_again[n * 8], z_again[n * 8]; /* (n, d_model), (n, h*d_v) */
    float head0[n * 4], head1[n * 4];                                      /* (n, d_v) each */
    float *heads[2] = {head0, head1};
    uint64_t seed = 66;
    mha_demo_fill_uniform(x, (size_t)n * 8, &seed, -1.0f, 1.0f);

    mha_layer *L = NULL;
    mha_weights wv = weights_view(&w);
    mha_capture cap = {z, NULL, NULL};
    mha_status s = mha_layer_create(&L, &c, &wv);
    if (s == MHA_OK) s = mha_forward(L, y, &cap, x, NULL, 1, n, n, NULL);
    if (s == MHA_OK) s = mha_split_heads(heads, z, 2, n, c.d_v);
    if (s == MHA_OK) s = mha_concat_heads(z_again, (const float *const *)heads, NULL, 2, n, c.d_v);
    if (s == MHA_OK) s = mha_project_out(y_again, z, w.w_o, w.b_o, n, 2 * c.d_v, c.d_model);
    if (L) mha_layer_free(L);
    free(w.all);
    if (s != MHA_OK) return mha_demo_lib_error("section 6 (layer forward, split, concat, project)", s);

    printf("  For n = %d tokens (one sequence), from a real forward pass:\n", n);
    mha_demo_shape("X", "(n, d_model)", 2, (int[]){n, c.d_model});
    mha_demo_shape("head 1 output Z^(1)", "(n, d_v)", 2, (int[]){n, c.d_v});
    mha_demo_shape("head 2 output Z^(2)", "(n, d_v)", 2, (int[]){n, c.d_v});
    mha_demo_shape("Z = Concat(Z^(1), Z^(2))", "(n, h*d_v)", 2, (int[]){n, 2 * c.d_v});
    mha_demo_shape("W_O", "(h*d_v, d_model)", 2, (int[]){2 * c.d_v, c.d_model});
    mha_demo_shape("Y = Z W_O + b_O", "(n, d_model)", 2, (int[]){n, c.d_model});
    mha_demo_check(d, "splitting Z into heads and concatenating again gives Z",
                   mha_demo_max_diff(z_again, z, n * 8), 0.0, 1);
    mha_demo_check(d, "Z W_O + b_O reproduces the layer's Y", mha_demo_max_diff(y_again, y, n * 8), 1e-5, 1);

    mha_config big = mha_config_default(768, 12);
    MHA_DEMO_TRY(mha_config_resolve(&big, &big));
    printf("\n  Student task: d_model = 768 with 12 equal-width heads.\n");
    printf("  mha_config_resolve(d_model = 768, h = 12) -> head width d_k = %d, d_v = %d\n", big.d_k, big.d_v);
    mha_demo_check_that(d, "12 heads of that width fill d_model", big.n_heads * big.d_k == 768);
    mha_config odd = mha_config_default(768, 10);
    s = mha_config_resolve(&odd, &odd);
    printf("  d_model = 768 with 10 heads: %s\n    (%s)\n", s == MHA_OK ? "accepted" : mha_status_str(s),
           s == MHA_OK ? "no error" : mha_last_error());
    mha_demo_check_that(d, "768 is not split into 10 equal heads", s != MHA_OK);
    return 0;
}

/* ------------------------------------------ 7. a full layer */

enum { T7 = 4, DM7 = 8, H7 = 2 }; /* tokens, d_model, heads of section 7 */

/* One causal forward with every capture; probs (h, T, T), z (T, h*d_v),
 * contrib (h, T, d_model). */
static mha_status run_layer(const mha_layer *L, float *y, float *probs, float *z, float *contrib, const float *x) {
    mha_options opt = mha_options_default();
    opt.causal = 1;
    mha_capture cap = {z, contrib, probs};
    return mha_forward(L, y, &cap, x, NULL, 1, T7, T7, &opt);
}

static mha_status check(const mha_layer *L, const float *x, mha_contract_report *rep) {
    mha_options opt = mha_options_default();
    opt.causal = 1;
    return mha_layer_check_contract(L, x, NULL, 1, T7, T7, &opt, rep);
}

static void print_report(mha_status s, const mha_contract_report *r) {
    printf("  mha_layer_check_contract: %s\n", s == MHA_OK ? "ok" : mha_status_str(s));
    if (r->labels_ok) printf("    labels agree at every head position\n");
    else
        printf("    mismatch in %s at head position %d: expected label %d, found %d\n", block_name(r->bad_block),
               r->bad_position, r->expected_label, r->found_label);
    if (r->residual_checked)
        printf("    sum of head contributions + b_O vs Y: max |residual| = %.1e\n", r->max_residual);
    if (s != MHA_OK) printf("    message: %s\n", mha_last_error());
}

/* The body of section 7; L and L2 are freed by the caller. */
static int full_layer(mha_demo *d, mha_layer **L, mha_layer **L2, const demo_weights *w) {
    const int T = T7, dm = DM7, h = H7;
    mha_config c = mha_config_default(dm, h);
    c.bias = 1;
    MHA_DEMO_TRY(mha_config_resolve(&c, &c));
    const int dk = c.d_k, dv = c.d_v;
    float x[T7 * DM7], y[T7 * DM7], y2[T7 * DM7], y3[T7 * DM7]; /* (B=1, T, d_model) */
    float q[T7 * DM7];                                          /* (T, h*d_k) */
    float probs[H7 * T7 * T7], probs2[H7 * T7 * T7];           /* (h, T, T) */
    float z[T7 * DM7], contrib[H7 * T7 * DM7];                  /* (T, h*d_v), (h, T, d_model) */
    uint64_t seed = 7;
    mha_demo_fill_uniform(x, sizeof x / sizeof x[0], &seed, -1.0f, 1.0f);
    mha_weights wv = weights_view(w);
    MHA_DEMO_TRY(mha_layer_create(L, &c, &wv));

    printf("  A self-attention layer: B = 1, T = %d tokens, d_model = %d, h = %d heads,\n"
           "  d_k = d_v = %d, biases on, causal mask (token i sees tokens 0..i).\n\n", T, dm, h, dk);
    mha_demo_shape("X", "(B, T, d_model)", 3, (int[]){1, T, dm});
    mha_demo_shape("W_Q, W_K, W_V", "(d_model, h*d_k)", 2, (int[]){dm, h * dk});
    mha_demo_shape("W_O", "(h*d_v, d_model)", 2, (int[]){h * dv, dm});

    /* Q recomputed from the layer's own weights, to show head 1's block */
    mha_weights lw;
    mha_layer_get_weights(*L, &lw);
    MHA_DEMO_TRY(mha_project_out(q, x, lw.w_q, lw.b_q, T, dm, h * dk));
    mha_demo_shape("Q = X W_Q + b_Q", "(B, T, h*d_k)", 3, (int[]){1, T, h * dk});
    mha_demo_shape("  Q^(r), column block r", "(B, T, d_k) per head", 3, (int[]){1, T, dk});
    mha_demo_shape("K = X W_K + b_K", "(B, T, h*d_k)", 3, (int[]){1, T, h * dk});
    mha_demo_shape("  K^(r), column block r", "(B, T, d_k) per head", 3, (int[]){1, T, dk});
    mha_demo_shape("V = X W_V + b_V", "(B, T, h*d_v)", 3, (int[]){1, T, h * dv});
    mha_demo_shape("  V^(r), column block r", "(B, T, d_v) per head", 3, (int[]){1, T, dv});
    printf("  Q^(1) = head 1's column block of Q (columns 0..%d):\n", dk - 1);
    for (int i = 0; i < T; i++) {
        float row[8];
        memcpy(row, q + (size_t)i * h * dk, (size_t)dk * sizeof(float));
        char label[32];
        snprintf(label, sizeof label, "  token %d", i);
        mha_demo_vec(label, row, dk);
    }

    MHA_DEMO_TRY(run_layer(*L, y, probs, z, contrib, x));
    printf("\n");
    mha_demo_shape("scores^(r) = Q K^T / sqrt(d_k)", "(B, T, T) per head", 3, (int[]){1, T, T});
    mha_demo_shape("P = softmax(scores + mask)", "(B, h, T, T)", 4, (int[]){1, h, T, T});
    for (int r = 0; r < h; r++) {
        char label[128];
        snprintf(label, sizeof label, "P^(%d) (row i = query token i; zeros above the diagonal: causal)", r + 1);
        mha_demo_mat(label, probs + (size_t)r * T * T, T, T);
    }
    mha_demo_shape("Z = Concat(P^(r) V^(r))", "(B, T, h*d_v)", 3, (int[]){1, T, h * dv});
    mha_demo_shape("contributions Z^(r) W_O[r]", "(h, B, T, d_model)", 4, (int[]){h, 1, T, dm});
    mha_demo_shape("Y = sum_r contributions + b_O", "(B, T, d_model)", 3, (int[]){1, T, dm});
    mha_demo_mat("Y", y, T, dm);

    float sum[T7 * DM7];
    for (int i = 0; i < T * dm; i++) {
        sum[i] = lw.b_o[i % dm];
        for (int r = 0; r < h; r++) sum[i] += contrib[(size_t)r * T * dm + i];
    }
    mha_demo_check(d, "head contributions + b_O equal Y", mha_demo_max_diff(sum, y, T * dm), 1e-5, 1);

    printf("\n  Head labels (each block's head id in the original checkpoint):\n");
    if (print_labels(*L)) return 1;
    mha_contract_report rep;
    mha_status s = check(*L, x, &rep);
    print_report(s, &rep);
    mha_demo_check_that(d, "contract holds on the fresh layer", s == MHA_OK);

    /* --- consistent permutation: every block kind moves together */
    const int swap[2] = {1, 0};
    printf("\n  mha_layer_permute_heads(perm = [1, 0]): W_Q/W_K/W_V column blocks, biases\n"
           "  and W_O row blocks move together.\n");
    MHA_DEMO_TRY(mha_layer_permute_heads(*L, swap));
    MHA_DEMO_TRY(run_layer(*L, y2, probs2, z, contrib, x));
    if (print_labels(*L)) return 1;
    printf("  Y after the permutation: max |Y' - Y| = %.1e\n", mha_demo_max_diff(y2, y, T * dm));
    mha_demo_check(d, "consistent permutation leaves Y unchanged", mha_demo_max_diff(y2, y, T * dm), 1e-5, 1);
    mha_demo_check(d, "new head 1's attention is old head 2's",
                   mha_demo_max_diff(probs2, probs + (size_t)T * T, T * T), 1e-6, 1);
    s = check(*L, x, &rep);
    print_report(s, &rep);
    mha_demo_check_that(d, "contract holds after the consistent permutation", s == MHA_OK);

    /* --- one-sided permutation: the broken-converter mistake */
    printf("\n  A fresh copy of the layer, then mha_layer_permute_block(MHA_BLOCK_O, [1, 0]):\n"
           "  only W_O's row blocks move, as a checkpoint converter that reorders one\n"
           "  side would do.\n");
    MHA_DEMO_TRY(mha_layer_create(L2, &c, &wv));
    MHA_DEMO_TRY(mha_layer_permute_block(*L2, MHA_BLOCK_O, swap));
    MHA_DEMO_TRY(run_layer(*L2, y3, probs2, z, contrib, x));
    if (print_labels(*L2)) return 1;
    printf("  Y with mismatched blocks: max |Y' - Y| = %.1e\n", mha_demo_max_diff(y3, y, T * dm));
    mha_demo_check(d, "one-sided permutation changes Y", mha_demo_max_diff(y3, y, T * dm), 1e-3, 0);
    s = check(*L2, x, &rep);
    print_report(s, &rep);
    mha_demo_check_that(d, "contract check reports the W_O block mismatch",
                        s == MHA_E_CONTRACT && !rep.labels_ok && rep.bad_block == MHA_BLOCK_O);
    printf("  The computation ran without error: shapes cannot catch this, only labels can.\n");

    /* --- repair: the swap is its own inverse */
    MHA_DEMO_TRY(mha_layer_permute_block(*L2, MHA_BLOCK_O, swap));
    MHA_DEMO_TRY(run_layer(*L2, y3, probs2, z, contrib, x));
    s = check(*L2, x, &rep);
    printf("\n  Swapping W_O's row blocks back: contract %s, max |Y' - Y| = %.1e\n",
           s == MHA_OK ? "ok" : mha_status_str(s), mha_demo_max_diff(y3, y, T * dm));
    mha_demo_check(d, "repaired layer gives Y again", mha_demo_max_diff(y3, y, T * dm), 1e-6, 1);
    return 0;
}

int mha_demo_full_layer(mha_demo *d) {
    mha_demo_banner("7. A full layer: shapes, labels, and the head-order contract");
    mha_config c = mha_config_default(DM7, H7);
    c.bias = 1;
    MHA_DEMO_TRY(mha_config_resolve(&c, &c));
    demo_weights w;
    if (weights_random(&w, &c, 77)) return mha_demo_lib_error("malloc", MHA_E_NOMEM);
    mha_layer *L = NULL, *L2 = NULL;
    int rc = full_layer(d, &L, &L2, &w);
    if (L) mha_layer_free(L);
    if (L2) mha_layer_free(L2);
    free(w.all);
    return rc;
}
