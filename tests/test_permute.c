/* test_permute.c — the head-order contract: consistent permutations leave Y
 * unchanged (MHA h = 12, GQA group-preserving), one-sided permutations
 * change Y and fail the contract check, labels travel with the blocks. */
#include <stdlib.h>
#include <string.h>

#include "naive.h"
#include "tests.h"

/* Fisher-Yates from the test RNG; deterministic per seed. */
static void random_perm(int *p, int n, uint64_t *seed) {
    for (int i = 0; i < n; i++) p[i] = i;
    for (int i = n - 1; i > 0; i--) {
        float u;
        test_fill_uniform(&u, 1, seed, 0, 1);
        int j = (int)(u * (float)(i + 1));
        if (j > i) j = i;
        int t = p[i];
        p[i] = p[j], p[j] = t;
    }
}

typedef struct {
    naive_weights w;
    mha_layer *L;
    float *x; /* (B,T,d_model) */
    int B, T;
} fixture;

static int fixture_make(fixture *f, int d_model, int h, int h_kv, int d_k, int add_bias_kv,
                        uint64_t seed) {
    mha_config c = mha_config_default(d_model, h);
    c.n_kv_heads = h_kv;
    c.d_k = d_k;
    c.bias = 1;
    c.add_bias_kv = add_bias_kv;
    c = naive_resolve(c);
    naive_weights_random(&f->w, &c, &seed, 0.6f);
    f->B = 2, f->T = 5;
    f->x = naive_random_floats((size_t)f->B * f->T * d_model, &seed, -1.5f, 1.5f);
    f->L = naive_make_layer(&f->w);
    return f->L != NULL;
}

static void fixture_free(fixture *f) {
    mha_layer_free(f->L);
    naive_weights_free(&f->w);
    free(f->x);
}

static float *fixture_forward(const fixture *f) {
    float *y = naive_alloc_floats((size_t)f->B * f->T * f->w.cfg.d_model);
    mha_options o = naive_ref_options();
    CHECK_OK(mha_forward(f->L, y, NULL, f->x, NULL, f->B, f->T, f->T, &o));
    return y;
}

static size_t fixture_ny(const fixture *f) { return (size_t)f->B * f->T * f->w.cfg.d_model; }

static void check_labels(const mha_layer *L, mha_block blk, const int *want, int n) {
    int got[64];
    CHECK_OK(mha_layer_labels(L, blk, got));
    for (int i = 0; i < n; i++) CHECK_INT(got[i], want[i]);
}

/* Checks the contract report after a one-sided permutation. */
static void check_contract_fails(const fixture *f, int want_block, int want_pos,
                                 int want_expected, int want_found) {
    mha_contract_report rep;
    mha_options o = naive_ref_options();
    memset(&rep, 0, sizeof rep);
    rep.labels_ok = 1;
    CHECK_STATUS(mha_layer_check_contract(f->L, NULL, NULL, f->B, f->T, f->T, &o, &rep),
                 MHA_E_CONTRACT);
    CHECK_INT(rep.labels_ok, 0);
    CHECK(rep.bad_block != MHA_BLOCK_Q); /* Q is the reference the others agree with */
    if (want_block >= 0) {
        CHECK_INT(rep.bad_block, want_block);
        CHECK_INT(rep.bad_position, want_pos);
        CHECK_INT(rep.expected_label, want_expected);
        CHECK_INT(rep.found_label, want_found);
        char num[16];
        snprintf(num, sizeof num, "%d", want_found);
        CHECK_ERROR_MENTIONS(num); /* the message names the label it found */
    }
    CHECK(mha_last_error()[0] != '\0');
}

static void permute_h12_leaves_y(void) {
    fixture f;
    if (!fixture_make(&f, 24, 12, 0, 2, 0, 101)) return;
    float *y0 = fixture_forward(&f);
    uint64_t seed = 5;
    int perm[12];
    random_perm(perm, 12, &seed);
    CHECK_OK(mha_layer_permute_heads(f.L, perm));
    float *y1 = fixture_forward(&f);
    CHECK_ARRAY_NEAR(y1, y0, fixture_ny(&f), 1e-5);
    /* labels started 0..h-1, so they now read perm itself, on every block */
    for (int b = 0; b < 4; b++) check_labels(f.L, (mha_block)b, perm, 12);
    mha_contract_report rep;
    mha_options o = naive_ref_options();
    CHECK_OK(mha_layer_check_contract(f.L, f.x, NULL, f.B, f.T, f.T, &o, &rep));
    CHECK_INT(rep.labels_ok, 1);
    CHECK_INT(rep.residual_checked, 1);
    CHECK(rep.max_residual <= 1e-4);
    /* and the oracle agrees with the permuted layer's own weights */
    mha_weights v;
    mha_layer_get_weights(f.L, &v);
    naive_weights pw = f.w;
    pw.w_q = (float *)v.w_q, pw.w_k = (float *)v.w_k, pw.w_v = (float *)v.w_v;
    pw.w_o = (float *)v.w_o, pw.b_q = (float *)v.b_q, pw.b_k = (float *)v.b_k;
    pw.b_v = (float *)v.b_v, pw.b_o = (float *)v.b_o;
    CHECK(naive_compare(f.L, &pw, f.x, NULL, f.B, f.T, f.T, &o) <= 1e-5);
    free(y0), free(y1);
    fixture_free(&f);
}

/* The weights move, not only the labels: new block i = old block perm[i]. */
static void permute_moves_weight_blocks(void) {
    fixture f;
    if (!fixture_make(&f, 12, 4, 0, 3, 1, 102)) return;
    const int perm[4] = {2, 0, 3, 1};
    CHECK_OK(mha_layer_permute_heads(f.L, perm));
    mha_weights v;
    mha_layer_get_weights(f.L, &v);
    int dm = 12, n = 12, dk = 3; /* h*d_k = h*d_v = 12 */
    for (int i = 0; i < 4; i++)
        for (int e = 0; e < dk; e++) {
            int nc = i * dk + e, oc = perm[i] * dk + e;
            for (int row = 0; row < dm; row++) {
                CHECK(v.w_q[row * n + nc] == f.w.w_q[row * n + oc]);
                CHECK(v.w_k[row * n + nc] == f.w.w_k[row * n + oc]);
                CHECK(v.w_v[row * n + nc] == f.w.w_v[row * n + oc]);
                CHECK(v.w_o[nc * dm + row] == f.w.w_o[oc * dm + row]);
            }
            CHECK(v.b_q[nc] == f.w.b_q[oc]);
            CHECK(v.b_k[nc] == f.w.b_k[oc]);
            CHECK(v.b_v[nc] == f.w.b_v[oc]);
            CHECK(v.bias_k[nc] == f.w.bias_k[oc]);
            CHECK(v.bias_v[nc] == f.w.bias_v[oc]);
        }
    CHECK_ARRAY_NEAR(v.b_o, f.w.b_o, 12, 0);
    fixture_free(&f);
}

static void permute_gqa_group_preserving(void) {
    fixture f;
    if (!fixture_make(&f, 16, 8, 2, 2, 1, 103)) return;
    float *y0 = fixture_forward(&f);
    /* new group 0 <- old group 1 (heads 4..7), new group 1 <- old group 0 */
    const int perm[8] = {5, 4, 7, 6, 1, 0, 3, 2};
    CHECK_OK(mha_layer_permute_heads(f.L, perm));
    float *y1 = fixture_forward(&f);
    CHECK_ARRAY_NEAR(y1, y0, fixture_ny(&f), 1e-5);
    check_labels(f.L, MHA_BLOCK_Q, perm, 8);
    check_labels(f.L, MHA_BLOCK_O, perm, 8);
    const int kv_perm[2] = {1, 0};
    check_labels(f.L, MHA_BLOCK_K, kv_perm, 2);
    check_labels(f.L, MHA_BLOCK_V, kv_perm, 2);
    mha_options o = naive_ref_options();
    CHECK_OK(mha_layer_check_contract(f.L, f.x, NULL, f.B, f.T, f.T, &o, NULL));
    free(y0), free(y1);
    fixture_free(&f);
}

static void permute_gqa_within_groups(void) {
    fixture f;
    if (!fixture_make(&f, 16, 8, 4, 2, 0, 104)) return;
    float *y0 = fixture_forward(&f);
    const int perm[8] = {1, 0, 2, 3, 7, 6, 4, 5}; /* new group 2 <- old 3, 3 <- 2 */
    CHECK_OK(mha_layer_permute_heads(f.L, perm));
    float *y1 = fixture_forward(&f);
    CHECK_ARRAY_NEAR(y1, y0, fixture_ny(&f), 1e-5);
    const int kv_perm[4] = {0, 1, 3, 2};
    check_labels(f.L, MHA_BLOCK_K, kv_perm, 4);
    free(y0), free(y1);
    fixture_free(&f);
}

static void permute_gqa_mixing_groups_rejected(void) {
    fixture f;
    if (!fixture_make(&f, 16, 8, 2, 2, 0, 105)) return;
    float *y0 = fixture_forward(&f);
    const int bad[8] = {0, 4, 1, 2, 3, 5, 6, 7}; /* new group 0 takes old heads of both */
    CHECK_STATUS(mha_layer_permute_heads(f.L, bad), MHA_E_ARG);
    /* a rejected permutation leaves the layer as it was */
    float *y1 = fixture_forward(&f);
    CHECK_ARRAY_NEAR(y1, y0, fixture_ny(&f), 0);
    const int ident[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    check_labels(f.L, MHA_BLOCK_Q, ident, 8);
    free(y0), free(y1);
    fixture_free(&f);
}

static void permute_only_o_changes_y(void) {
    fixture f;
    if (!fixture_make(&f, 24, 12, 0, 2, 0, 106)) return;
    float *y0 = fixture_forward(&f);
    int perm[12] = {0, 1, 2, 3, 4, 9, 6, 7, 8, 5, 10, 11}; /* swap row blocks 5, 9 */
    CHECK_OK(mha_layer_permute_block(f.L, MHA_BLOCK_O, perm));
    float *y1 = fixture_forward(&f);
    CHECK(test_max_abs_diff(y1, y0, fixture_ny(&f)) > 1e-3);
    check_contract_fails(&f, MHA_BLOCK_O, 5, 5, 9);
    /* undoing it (a swap is its own inverse) restores Y and the contract */
    CHECK_OK(mha_layer_permute_block(f.L, MHA_BLOCK_O, perm));
    float *y2 = fixture_forward(&f);
    CHECK_ARRAY_NEAR(y2, y0, fixture_ny(&f), 0);
    mha_options o = naive_ref_options();
    CHECK_OK(mha_layer_check_contract(f.L, f.x, NULL, f.B, f.T, f.T, &o, NULL));
    free(y0), free(y1), free(y2);
    fixture_free(&f);
}

static void permute_only_q_changes_y(void) {
    fixture f;
    if (!fixture_make(&f, 24, 12, 0, 2, 0, 107)) return;
    float *y0 = fixture_forward(&f);
    uint64_t seed = 9;
    int perm[12];
    random_perm(perm, 12, &seed);
    CHECK_OK(mha_layer_permute_block(f.L, MHA_BLOCK_Q, perm));
    check_labels(f.L, MHA_BLOCK_Q, perm, 12);
    float *y1 = fixture_forward(&f);
    CHECK(test_max_abs_diff(y1, y0, fixture_ny(&f)) > 1e-3);
    /* O keeps 0..h-1: the first moved Q block is the first disagreement */
    int first = 0;
    while (first < 11 && perm[first] == first) first++;
    check_contract_fails(&f, MHA_BLOCK_O, first, perm[first], first);
    free(y0), free(y1);
    fixture_free(&f);
}

/* One kv block (K or V) moved alone: the other still agrees with Q, so
 * only the check of that block's labels can see it. */
static void one_kv_block_moved(mha_block blk, uint64_t seed) {
    fixture f;
    if (!fixture_make(&f, 16, 8, 2, 2, 0, seed)) return;
    float *y0 = fixture_forward(&f);
    const int kv_perm[2] = {1, 0};
    CHECK_OK(mha_layer_permute_block(f.L, blk, kv_perm));
    float *y1 = fixture_forward(&f);
    CHECK(test_max_abs_diff(y1, y0, fixture_ny(&f)) > 1e-3);
    check_contract_fails(&f, blk, 0, 0, 1); /* block 0 wants kv label 0 */
    CHECK_ERROR_MENTIONS(blk == MHA_BLOCK_K ? "W_K column block 0" : "W_V column block 0");
    free(y0), free(y1);
    fixture_free(&f);
}

static void permute_only_k_changes_y(void) { one_kv_block_moved(MHA_BLOCK_K, 108); }
static void permute_only_v_changes_y(void) { one_kv_block_moved(MHA_BLOCK_V, 112); }

/* K and V moved together: they agree with each other, not with Q. A check
 * that skipped the K labels would compare V with K and pass. */
static void permute_k_and_v_together_fails_on_k(void) {
    fixture f;
    if (!fixture_make(&f, 16, 8, 2, 2, 0, 111)) return;
    float *y0 = fixture_forward(&f);
    const int kv_perm[2] = {1, 0};
    CHECK_OK(mha_layer_permute_block(f.L, MHA_BLOCK_K, kv_perm));
    CHECK_OK(mha_layer_permute_block(f.L, MHA_BLOCK_V, kv_perm));
    check_labels(f.L, MHA_BLOCK_V, kv_perm, 2);
    float *y1 = fixture_forward(&f);
    CHECK(test_max_abs_diff(y1, y0, fixture_ny(&f)) > 1e-3);
    check_contract_fails(&f, MHA_BLOCK_K, 0, 0, 1);
    CHECK_ERROR_MENTIONS("W_K column block 0");
    free(y0), free(y1);
    fixture_free(&f);
}

/* Labels set from checkpoint metadata travel with a consistent permutation. */
static void permute_labels_travel(void) {
    fixture f;
    if (!fixture_make(&f, 12, 6, 0, 2, 0, 109)) return;
    const int ck[6] = {5, 3, 1, 0, 2, 4}; /* checkpoint ids of the stored blocks */
    for (int b = 0; b < 4; b++) CHECK_OK(mha_layer_set_labels(f.L, (mha_block)b, ck));
    mha_options o = naive_ref_options();
    CHECK_OK(mha_layer_check_contract(f.L, NULL, NULL, f.B, f.T, f.T, &o, NULL));
    const int perm[6] = {3, 2, 4, 1, 5, 0}; /* sorts the heads by checkpoint id */
    CHECK_OK(mha_layer_permute_heads(f.L, perm));
    const int sorted[6] = {0, 1, 2, 3, 4, 5};
    for (int b = 0; b < 4; b++) check_labels(f.L, (mha_block)b, sorted, 6);
    CHECK_OK(mha_layer_check_contract(f.L, f.x, NULL, f.B, f.T, f.T, &o, NULL));
    /* mismatched metadata on O alone is a contract violation at position 0 */
    const int wrong[6] = {1, 0, 2, 3, 4, 5};
    CHECK_OK(mha_layer_set_labels(f.L, MHA_BLOCK_O, wrong));
    check_contract_fails(&f, MHA_BLOCK_O, 0, 0, 1);
    fixture_free(&f);
}

static void permute_identity_is_noop(void) {
    fixture f;
    if (!fixture_make(&f, 12, 4, 0, 3, 0, 110)) return;
    float *y0 = fixture_forward(&f);
    const int id[4] = {0, 1, 2, 3};
    CHECK_OK(mha_layer_permute_heads(f.L, id));
    CHECK_OK(mha_layer_permute_block(f.L, MHA_BLOCK_O, id));
    float *y1 = fixture_forward(&f);
    CHECK_ARRAY_NEAR(y1, y0, fixture_ny(&f), 0);
    free(y0), free(y1);
    fixture_free(&f);
}

static const test_case cases[] = {
    {"permute_h12_leaves_y", permute_h12_leaves_y},
    {"permute_moves_weight_blocks", permute_moves_weight_blocks},
    {"permute_gqa_group_preserving", permute_gqa_group_preserving},
    {"permute_gqa_within_groups", permute_gqa_within_groups},
    {"permute_gqa_mixing_groups_rejected", permute_gqa_mixing_groups_rejected},
    {"permute_only_o_changes_y", permute_only_o_changes_y},
    {"permute_only_q_changes_y", permute_only_q_changes_y},
    {"permute_only_k_changes_y", permute_only_k_changes_y},
    {"permute_only_v_changes_y", permute_only_v_changes_y},
    {"permute_k_and_v_together_fails_on_k", permute_k_and_v_together_fails_on_k},
    {"permute_labels_travel", permute_labels_travel},
    {"permute_identity_is_noop", permute_identity_is_noop},
};

const test_case *tests_permute(size_t *count) {
    *count = sizeof cases / sizeof cases[0];
    return cases;
}
