/* test_permute.c — the head-order contract: consistent permutations leave Y
 * unchanged (MHA h = 12, GQA group-preserving), one-sided permutations
 * change Y and fail the contract check, labels travel with the blocks. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/internal.h" /* mha_alloc_large_fail_in */
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

/* ---- a permutation that runs out of memory leaves the layer as it was */

/* What a caller sees of a layer: its tensors and metadata (every weight,
 * the compact forms, the labels) and Y of both paths. */
typedef struct {
    mha_tensors *t;
    float *y_ref, *y_fast; /* (B,T,d_model) */
} layer_view;

static void view_take(layer_view *v, const mha_layer *L, const float *x, int B, int T) {
    const size_t ny = (size_t)B * T * mha_layer_config(L)->d_model;
    mha_options o = mha_options_default();
    v->y_ref = naive_alloc_floats(ny), v->y_fast = naive_alloc_floats(ny);
    CHECK_OK(mha_layer_to_tensors(&v->t, L));
    o.path = MHA_PATH_REFERENCE;
    CHECK_OK(mha_forward_kv(L, v->y_ref, NULL, x, x + ny, x + 2 * ny, B, T, T, &o)); /* x: 3 (B,T,d_model) */
    o.path = MHA_PATH_FAST;
    CHECK_OK(mha_forward_kv(L, v->y_fast, NULL, x, x + ny, x + 2 * ny, B, T, T, &o));
}

static void view_free(layer_view *v) {
    mha_tensors_free(v->t);
    free(v->y_ref), free(v->y_fast);
}

/* 1 when a and b hold the same bits everywhere. */
static int view_same(const layer_view *a, const layer_view *b, size_t ny) {
    if (memcmp(a->y_ref, b->y_ref, ny * sizeof(float)) || memcmp(a->y_fast, b->y_fast, ny * sizeof(float)))
        return 0;
    const int n = mha_tensors_count(a->t), m = mha_tensors_meta_count(a->t);
    if (n != mha_tensors_count(b->t) || m != mha_tensors_meta_count(b->t)) return 0;
    for (int i = 0; i < n; i++) {
        const char *name = mha_tensors_name(a->t, i);
        const mha_array *p = mha_tensors_get(a->t, name), *q = mha_tensors_get(b->t, name);
        if (!q || p->dtype != q->dtype || p->count != q->count) return 0;
        if ((p->f && memcmp(p->f, q->f, p->count * sizeof(float))) || (p->u8 && memcmp(p->u8, q->u8, p->count)))
            return 0;
    }
    for (int i = 0; i < m; i++) {
        const char *key = mha_tensors_meta_key(a->t, i), *w = mha_tensors_meta(b->t, key);
        if (!w || strcmp(mha_tensors_meta(a->t, key), w) != 0) return 0;
    }
    return 1;
}

/* A GQA layer with biases and every per-head array: ALiBi slopes, sinks,
 * per-head QK-norm; or, when cross, cross-attention widths and PyTorch's
 * bias_k/bias_v (extra keys take no variants). Stored as dtype. */
static mha_layer *oom_layer(int cross, mha_weight_dtype dtype, uint64_t seed) {
    mha_config c = mha_config_default(16, 8), r;
    c.n_kv_heads = 2, c.d_k = 4, c.d_v = 3;
    if (cross) c.d_kv_in = 12, c.d_v_in = 10, c.add_bias_kv = 1;
    else c.alibi = 1, c.sinks = 1, c.qk_norm = MHA_QK_NORM_RMS, c.qk_norm_per_head = 1;
    if (mha_config_resolve(&r, &c)) {
        fprintf(stderr, "    %s\n", mha_last_error());
        return NULL;
    }
    const int D = r.d_model, h = r.n_heads, hk = r.n_kv_heads, dk = r.d_k, dv = r.d_v;
    float *a[14] = {
        naive_random_floats((size_t)D * h * dk, &seed, -0.5f, 0.5f), naive_random_floats((size_t)r.d_kv_in * hk * dk, &seed, -0.5f, 0.5f),
        naive_random_floats((size_t)r.d_v_in * hk * dv, &seed, -0.5f, 0.5f), naive_random_floats((size_t)h * dv * D, &seed, -0.5f, 0.5f),
        naive_random_floats((size_t)h * dk, &seed, -0.5f, 0.5f), naive_random_floats((size_t)hk * dk, &seed, -0.5f, 0.5f),
        naive_random_floats((size_t)hk * dv, &seed, -0.5f, 0.5f), naive_random_floats((size_t)D, &seed, -0.5f, 0.5f),
        naive_random_floats((size_t)hk * dk, &seed, -0.5f, 0.5f), naive_random_floats((size_t)hk * dv, &seed, -0.5f, 0.5f),
        naive_random_floats((size_t)h, &seed, 0.1f, 1.0f), naive_random_floats((size_t)h, &seed, -1.0f, 2.0f),
        naive_random_floats((size_t)h * dk, &seed, 0.5f, 1.5f), naive_random_floats((size_t)hk * dk, &seed, 0.5f, 1.5f)};
    const mha_weights w = {a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], cross ? a[8] : NULL, cross ? a[9] : NULL,
                           cross ? NULL : a[10], cross ? NULL : a[11], cross ? NULL : a[12], cross ? NULL : a[13], NULL, NULL};
    mha_layer *L = NULL;
    CHECK_OK(mha_layer_create(&L, &r, &w));
    if (L && dtype != MHA_W_F32) CHECK_OK(mha_layer_convert_weights(L, dtype));
    for (int i = 0; i < 14; i++) free(a[i]);
    return L;
}

/* Fails the first, second, ... large allocation of a permutation until it
 * succeeds: each failure must leave the layer bit-identical to before
 * (tensors, labels, Y of both paths); the permutation must succeed in the
 * end. block < 0: mha_layer_permute_heads. */
static void oom_permute(int cross, mha_weight_dtype dtype, int block, const int *perm, uint64_t seed) {
    mha_layer *L = oom_layer(cross, dtype, seed);
    CHECK(L != NULL);
    if (!L) return;
    const mha_config *c = mha_layer_config(L);
    const int B = 2, T = 5;
    const size_t ny = (size_t)B * T * c->d_model;
    float *x = naive_random_floats(3 * ny, &seed, -1.0f, 1.0f); /* X, the keys' and the values' source */
    layer_view before;
    view_take(&before, L, x, B, T);
    mha_status s = MHA_E_NOMEM;
    int fails = 0;
    for (int n = 1; n < 64 && s == MHA_E_NOMEM; n++) {
        atomic_store(&mha_alloc_large_fail_in, n);
        s = block < 0 ? mha_layer_permute_heads(L, perm) : mha_layer_permute_block(L, (mha_block)block, perm);
        atomic_store(&mha_alloc_large_fail_in, 0);
        if (s != MHA_E_NOMEM) break;
        fails++;
        layer_view after;
        view_take(&after, L, x, B, T);
        if (!view_same(&before, &after, ny)) {
            fprintf(stderr, "    permutation failing at large allocation %d changed the layer\n", n);
            CHECK(0);
        }
        view_free(&after);
    }
    CHECK_OK(s);
    CHECK(fails >= 2); /* the scratch and at least one packed matrix */
    if (block < 0) check_labels(L, MHA_BLOCK_S, perm, c->n_heads); /* it did move, in the end */
    view_free(&before);
    free(x);
    mha_layer_free(L);
}

static void permute_out_of_memory_leaves_layer(void) {
    const int perm[8] = {2, 3, 0, 1, 7, 6, 5, 4}, kv[2] = {1, 0};
    oom_permute(0, MHA_W_F32, -1, perm, 301);
    oom_permute(1, MHA_W_F32, -1, perm, 302); /* unfused packing: Q, KV, V apart */
    oom_permute(0, MHA_W_I8, -1, perm, 303);  /* the compact weights and their scales */
    oom_permute(0, MHA_W_BF16, -1, perm, 304);
    oom_permute(0, MHA_W_F32, MHA_BLOCK_O, perm, 305);
    oom_permute(0, MHA_W_I8, MHA_BLOCK_K, kv, 306);
    oom_permute(0, MHA_W_F32, MHA_BLOCK_S, perm, 307);
    oom_permute(1, MHA_W_BF16, MHA_BLOCK_V, kv, 308);
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
    {"permute_out_of_memory_leaves_layer", permute_out_of_memory_leaves_layer},
};

const test_case *tests_permute(size_t *count) {
    *count = sizeof cases / sizeof cases[0];
    return cases;
}
