/* test_seed.c — every number of the seed lessons, computed by the library:
 * the two-head trace (concat, identity W_O, mixing W_O, swaps, ablation),
 * the exercise, the lesson's worked example and the head-width task.
 * Expected numbers are the lessons' own, or derived by hand in comments. */
#include <stdlib.h>
#include <string.h>

#include "naive.h"
#include "tests.h"

/* The two heads' outputs for the third query of the lesson's trace. */
static const float seed_z1[2] = {0.752f, 0.752f};
static const float seed_z2[2] = {-0.546f, 0.926f};
/* The lesson's mixing W_O (h*d_v = 4, d_model = 4), rows = input features. */
static const float seed_wo[16] = {1, 0, 0.5f, 0, 0, 1, 0, 0.5f, 0.5f, 0, 1, 0, 0, 0.5f, 0, 1};
static const float eye4[16] = {1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1};
/* y_3 = z_3 W_O as printed by the lesson (rounded to 3 decimals). */
static const float seed_y3_lesson[4] = {0.479f, 1.215f, -0.170f, 1.302f};

static void seed_concat_two_heads(void) {
    const float *heads[2] = {seed_z1, seed_z2};
    float z[4];
    CHECK_OK(mha_concat_heads(z, heads, NULL, 2, 1, 2));
    /* z_3 = [0.752, 0.752, -0.546, 0.926]: head blocks side by side, not averaged */
    CHECK_INT(z[0] == 0.752f && z[1] == 0.752f && z[2] == -0.546f && z[3] == 0.926f, 1);
    float back1[2], back2[2];
    float *outs[2] = {back1, back2};
    CHECK_OK(mha_split_heads(outs, z, 2, 1, 2));
    CHECK_ARRAY_NEAR(back1, seed_z1, 2, 0);
    CHECK_ARRAY_NEAR(back2, seed_z2, 2, 0);
}

static void seed_identity_wo_returns_z(void) {
    const float *heads[2] = {seed_z1, seed_z2};
    float z[4], y[4];
    CHECK_OK(mha_concat_heads(z, heads, NULL, 2, 1, 2));
    CHECK_OK(mha_project_out(y, z, eye4, NULL, 1, 4, 4));
    CHECK_ARRAY_NEAR(y, z, 4, 0);
}

static void seed_mixing_wo(void) {
    const float *heads[2] = {seed_z1, seed_z2};
    float z[4], y[4];
    CHECK_OK(mha_concat_heads(z, heads, NULL, 2, 1, 2));
    CHECK_OK(mha_project_out(y, z, seed_wo, NULL, 1, 4, 4));
    /* by hand: y0 = 0.752 + 0.5*(-0.546) = 0.479,  y1 = 0.752 + 0.5*0.926 = 1.215,
     *          y2 = 0.5*0.752 - 0.546 = -0.170,    y3 = 0.5*0.752 + 0.926 = 1.302 */
    const float hand[4] = {0.479f, 1.215f, -0.170f, 1.302f};
    CHECK_ARRAY_NEAR(y, hand, 4, 1e-6);
    CHECK_ARRAY_NEAR(y, seed_y3_lesson, 4, 1e-3);
}

/* A full layer whose two heads output exactly the seed values at every
 * query: every token carries x[0] = 1 and only W_V's row 0 is nonzero, so
 * all value rows are equal and any attention pattern averages to them. */
static mha_layer *seed_layer(const float *w_o, float *w_v, float *w_q, float *w_k) {
    mha_config c = mha_config_default(4, 2);
    c.bias = 0;
    uint64_t seed = 7;
    test_fill_uniform(w_q, 16, &seed, -1, 1);
    test_fill_uniform(w_k, 16, &seed, -1, 1);
    memset(w_v, 0, 16 * sizeof *w_v);
    memcpy(w_v, seed_z1, sizeof seed_z1);
    memcpy(w_v + 2, seed_z2, sizeof seed_z2);
    mha_weights w = {.w_q = w_q, .w_k = w_k, .w_v = w_v, .w_o = w_o};
    mha_layer *L = NULL;
    CHECK_OK(mha_layer_create(&L, &c, &w));
    return L;
}

/* x (1,3,4): three tokens; the trace's "z_3" is the third query. */
static const float seed_x[12] = {1, 0.3f, -0.2f, 0.5f, 1, -0.7f, 0.1f, 0.9f, 1, 0.4f, 0.8f, -0.6f};

static void seed_full_layer_trace(void) {
    float wq[16], wk[16], wv[16], y[12], z[12];
    mha_options opt = mha_options_default();
    opt.path = MHA_PATH_REFERENCE;
    mha_capture cap = {z, NULL, NULL};
    mha_layer *L = seed_layer(eye4, wv, wq, wk);
    if (!L) return;
    CHECK_OK(mha_forward(L, y, &cap, seed_x, NULL, 1, 3, 3, &opt));
    const float z3[4] = {0.752f, 0.752f, -0.546f, 0.926f};
    CHECK_ARRAY_NEAR(z + 8, z3, 4, 1e-6);
    CHECK_ARRAY_NEAR(y + 8, z3, 4, 1e-6); /* identity W_O */
    CHECK_OK(mha_layer_set_weights(L, &(mha_weights){.w_q = wq, .w_k = wk, .w_v = wv,
                                                     .w_o = seed_wo}));
    CHECK_OK(mha_forward(L, y, NULL, seed_x, NULL, 1, 3, 3, &opt));
    CHECK_ARRAY_NEAR(y + 8, seed_y3_lesson, 4, 1e-3);
    mha_layer_free(L);
}

static void seed_swap_blocks_and_rows_unchanged(void) {
    const float *heads[2] = {seed_z1, seed_z2};
    const int swap[2] = {1, 0};
    float z[4], zs[4], y[4], ys[4], wo_swapped[16];
    CHECK_OK(mha_concat_heads(z, heads, NULL, 2, 1, 2));
    CHECK_OK(mha_concat_heads(zs, heads, swap, 2, 1, 2));
    const float zs_hand[4] = {-0.546f, 0.926f, 0.752f, 0.752f};
    CHECK_ARRAY_NEAR(zs, zs_hand, 4, 0);
    /* W_O' = P^T W_O: row block 0 <- old rows 2,3; row block 1 <- old rows 0,1 */
    memcpy(wo_swapped, seed_wo + 8, 8 * sizeof(float));
    memcpy(wo_swapped + 8, seed_wo, 8 * sizeof(float));
    CHECK_OK(mha_project_out(y, z, seed_wo, NULL, 1, 4, 4));
    CHECK_OK(mha_project_out(ys, zs, wo_swapped, NULL, 1, 4, 4));
    CHECK_ARRAY_NEAR(ys, y, 4, 1e-6);

    /* the same through the layer: permute heads consistently */
    float wq[16], wk[16], wv[16], y1[12], y2[12];
    mha_options opt = mha_options_default();
    opt.path = MHA_PATH_REFERENCE;
    mha_layer *L = seed_layer(seed_wo, wv, wq, wk);
    if (!L) return;
    CHECK_OK(mha_forward(L, y1, NULL, seed_x, NULL, 1, 3, 3, &opt));
    CHECK_OK(mha_layer_permute_heads(L, swap));
    CHECK_OK(mha_forward(L, y2, NULL, seed_x, NULL, 1, 3, 3, &opt));
    CHECK_ARRAY_NEAR(y2, y1, 12, 1e-6);
    CHECK_OK(mha_layer_check_contract(L, seed_x, NULL, 1, 3, 3, &opt, NULL));
    mha_layer_free(L);
}

static void seed_swap_only_blocks_changes(void) {
    const float *heads[2] = {seed_z1, seed_z2};
    const int swap[2] = {1, 0};
    float zs[4], ys[4];
    CHECK_OK(mha_concat_heads(zs, heads, swap, 2, 1, 2));
    CHECK_OK(mha_project_out(ys, zs, seed_wo, NULL, 1, 4, 4));
    /* by hand: [-0.546, 0.926, 0.752, 0.752] W_O = [-0.170, 1.302, 0.479, 1.215] */
    const float hand[4] = {-0.170f, 1.302f, 0.479f, 1.215f};
    CHECK_ARRAY_NEAR(ys, hand, 4, 1e-6);
    CHECK(test_max_abs_diff(ys, seed_y3_lesson, 4) > 0.5);

    /* through the layer: only W_O's row blocks move -> Y changes, contract fails */
    float wq[16], wk[16], wv[16], y1[12], y2[12];
    mha_options opt = mha_options_default();
    opt.path = MHA_PATH_REFERENCE;
    mha_layer *L = seed_layer(seed_wo, wv, wq, wk);
    if (!L) return;
    CHECK_OK(mha_forward(L, y1, NULL, seed_x, NULL, 1, 3, 3, &opt));
    CHECK_OK(mha_layer_permute_block(L, MHA_BLOCK_O, swap));
    CHECK_OK(mha_forward(L, y2, NULL, seed_x, NULL, 1, 3, 3, &opt));
    CHECK_ARRAY_NEAR(y2 + 8, hand, 4, 1e-5);
    mha_contract_report rep;
    CHECK_STATUS(mha_layer_check_contract(L, NULL, NULL, 1, 3, 3, &opt, &rep), MHA_E_CONTRACT);
    CHECK_INT(rep.labels_ok, 0);
    CHECK_INT(rep.bad_block, MHA_BLOCK_O);
    CHECK_INT(rep.bad_position, 0);
    CHECK_INT(rep.expected_label, 0);
    CHECK_INT(rep.found_label, 1);
    mha_layer_free(L);
}

static void seed_ablate_head2(void) {
    const float *heads[2] = {seed_z1, seed_z2};
    float z[4], y[4], ya[4], contrib[8];
    CHECK_OK(mha_concat_heads(z, heads, NULL, 2, 1, 2));
    CHECK_OK(mha_project_out(y, z, seed_wo, NULL, 1, 4, 4));
    CHECK_OK(mha_head_contributions(contrib, z, seed_wo, 2, 1, 2, 4));
    mha_intervention zero = {MHA_HEAD_ZERO, 0, NULL};
    CHECK_OK(mha_head_intervene(z, &zero, 1, 2, 1, 2));
    const float ablated[4] = {0.752f, 0.752f, 0, 0};
    CHECK_ARRAY_NEAR(z, ablated, 4, 0);
    CHECK_OK(mha_project_out(ya, z, seed_wo, NULL, 1, 4, 4));
    /* by hand: [0.752, 0.752, 0, 0] W_O = [0.752, 0.752, 0.376, 0.376] */
    const float hand[4] = {0.752f, 0.752f, 0.376f, 0.376f};
    CHECK_ARRAY_NEAR(ya, hand, 4, 1e-6);
    /* y - y_ablated = head 2's direct contribution z^(2) W_O[rows 2,3] */
    float d[4];
    for (int i = 0; i < 4; i++) d[i] = y[i] - ya[i];
    CHECK_ARRAY_NEAR(d, contrib + 4, 4, 1e-6);
    const float c2_hand[4] = {-0.273f, 0.463f, -0.546f, 0.926f};
    CHECK_ARRAY_NEAR(contrib + 4, c2_hand, 4, 1e-6);

    /* the same through the layer's intervention option */
    float wq[16], wk[16], wv[16], y1[12], y2[12], cap_c[2 * 12], z2[12];
    mha_intervention ivs[2] = {{MHA_HEAD_KEEP, 0, NULL}, {MHA_HEAD_ZERO, 0, NULL}};
    mha_options opt = mha_options_default();
    opt.path = MHA_PATH_REFERENCE;
    mha_layer *L = seed_layer(seed_wo, wv, wq, wk);
    if (!L) return;
    mha_capture cap = {NULL, cap_c, NULL};
    CHECK_OK(mha_forward(L, y1, &cap, seed_x, NULL, 1, 3, 3, &opt));
    opt.interventions = ivs;
    mha_capture cap2 = {z2, NULL, NULL};
    CHECK_OK(mha_forward(L, y2, &cap2, seed_x, NULL, 1, 3, 3, &opt));
    CHECK_ARRAY_NEAR(z2 + 8, ablated, 4, 1e-6);
    CHECK_ARRAY_NEAR(y2 + 8, hand, 4, 1e-5);
    for (int i = 0; i < 12; i++) CHECK_NEAR(y1[i] - y2[i], cap_c[12 + i], 1e-6);
    mha_layer_free(L);
}

static void seed_exercise_identity_third_coord(void) {
    const float a[2] = {1, -2}, b[2] = {3, 4};
    const float *heads[2] = {a, b};
    float z[4], y[4];
    CHECK_OK(mha_concat_heads(z, heads, NULL, 2, 1, 2));
    CHECK_OK(mha_project_out(y, z, eye4, NULL, 1, 4, 4));
    CHECK_NEAR(y[2], 3, 0); /* concat [1,-2,3,4]: third coordinate 3 */
}

static void seed_lesson_worked_example(void) {
    const float a[2] = {1, 2}, b[2] = {3, 4};
    const float *heads[2] = {a, b};
    const float w[16] = {1, 0, 1, 0, 0, 1, 0, 1, 1, 0, -1, 0, 0, 1, 0, -1};
    float z[4], y[4];
    CHECK_OK(mha_concat_heads(z, heads, NULL, 2, 1, 2));
    const float joined[4] = {1, 2, 3, 4};
    CHECK_ARRAY_NEAR(z, joined, 4, 0);
    CHECK_OK(mha_project_out(y, z, w, NULL, 1, 4, 4));
    /* by hand: [1+3, 2+4, 1-3, 2-4] */
    const float hand[4] = {4, 6, -2, -2};
    CHECK_ARRAY_NEAR(y, hand, 4, 0);
    /* student task 2: identity W predicts the concatenation itself */
    CHECK_OK(mha_project_out(y, z, eye4, NULL, 1, 4, 4));
    CHECK_ARRAY_NEAR(y, joined, 4, 0);
    /* concatenation keeps order (unlike an average): swapping heads changes z */
    const int swap[2] = {1, 0};
    CHECK_OK(mha_concat_heads(z, heads, swap, 2, 1, 2));
    const float swapped[4] = {3, 4, 1, 2};
    CHECK_ARRAY_NEAR(z, swapped, 4, 0);
}

static void seed_head_width(void) {
    mha_config c = mha_config_default(768, 12), r;
    CHECK_OK(mha_config_resolve(&r, &c));
    CHECK_INT(r.d_k, 64); /* 768 / 12 */
    CHECK_INT(r.d_v, 64);
    CHECK_INT(r.n_kv_heads, 12);
    CHECK_INT(r.d_kv_in, 768);
    /* shape bookkeeping: d_model 8, two heads -> n by 4 per head, n by 8 concat */
    c = mha_config_default(8, 2);
    CHECK_OK(mha_config_resolve(&c, &c));
    CHECK_INT(c.d_k, 4);
    CHECK_INT(c.n_heads * c.d_v, 8);
}

static const test_case cases[] = {
    {"seed_concat_two_heads", seed_concat_two_heads},
    {"seed_identity_wo_returns_z", seed_identity_wo_returns_z},
    {"seed_mixing_wo", seed_mixing_wo},
    {"seed_full_layer_trace", seed_full_layer_trace},
    {"seed_swap_blocks_and_rows_unchanged", seed_swap_blocks_and_rows_unchanged},
    {"seed_swap_only_blocks_changes", seed_swap_only_blocks_changes},
    {"seed_ablate_head2", seed_ablate_head2},
    {"seed_exercise_identity_third_coord", seed_exercise_identity_third_coord},
    {"seed_lesson_worked_example", seed_lesson_worked_example},
    {"seed_head_width", seed_head_width},
};

const test_case *tests_seed(size_t *count) {
    *count = sizeof cases / sizeof cases[0];
    return cases;
}
