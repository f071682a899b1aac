/* test_heads.c — per-head views of the layer: captured Z, contributions,
 * attention probabilities, and the interventions (ZERO, SCALE, MEAN,
 * REPLACE) checked by hand from the captured Z; the standalone head steps. */
#include <stdlib.h>
#include <string.h>

#include "naive.h"
#include "tests.h"

enum { DM = 12, H = 4, DV = 3, B = 2, T = 4 };
#define NY ((size_t)B * T * DM)
#define NZ ((size_t)B * T * H * DV)

typedef struct {
    naive_weights w;
    mha_layer *L;
    float *x;             /* (B,T,DM)     */
    float y[NY];          /* (B,T,DM)     */
    float z[NZ];          /* (B,T,H*DV)   */
    float contrib[H * NY];/* (H,B,T,DM)   */
    float probs[B * H * T * T]; /* (B,H,T,T) */
} fixture;

static fixture *fixture_new(uint64_t seed) {
    fixture *f = calloc(1, sizeof *f);
    mha_config c = naive_resolve(mha_config_default(DM, H));
    c.bias = 1;
    naive_weights_random(&f->w, &c, &seed, 0.6f);
    f->x = naive_random_floats(NY, &seed, -1.5f, 1.5f);
    f->L = naive_make_layer(&f->w);
    if (!f->L) {
        naive_weights_free(&f->w);
        free(f->x), free(f);
        return NULL;
    }
    return f;
}

static void fixture_free(fixture *f) {
    mha_layer_free(f->L);
    naive_weights_free(&f->w);
    free(f->x), free(f);
}

/* Runs the reference forward capturing everything into f. */
static void fixture_run(fixture *f, const mha_intervention *ivs) {
    mha_options o = naive_ref_options();
    o.interventions = ivs;
    mha_capture cap = {f->z, f->contrib, f->probs};
    CHECK_OK(mha_forward(f->L, f->y, &cap, f->x, NULL, B, T, T, &o));
}

/* y (B*T, DM) = z W_O + b_O, in double, from a float z. */
static void project_by_hand(double *y, const double *z, const naive_weights *w) {
    for (int t = 0; t < B * T; t++)
        for (int o = 0; o < DM; o++) {
            double s = w->b_o[o];
            for (int e = 0; e < H * DV; e++) s += z[t * H * DV + e] * (double)w->w_o[e * DM + o];
            y[t * DM + o] = s;
        }
}

static void heads_contributions_sum_to_y(void) {
    fixture *f = fixture_new(201);
    if (!f) return;
    fixture_run(f, NULL);
    for (size_t i = 0; i < NY; i++) {
        double s = f->w.b_o[i % DM];
        for (int r = 0; r < H; r++) s += f->contrib[r * NY + i];
        CHECK_NEAR(s, f->y[i], 1e-5);
    }
    /* each contribution is Z^(r) W_O[r], recomputed by hand from captured Z */
    for (int r = 0; r < H; r++)
        for (int t = 0; t < B * T; t++)
            for (int o = 0; o < DM; o++) {
                double s = 0;
                for (int e = 0; e < DV; e++)
                    s += (double)f->z[t * H * DV + r * DV + e] * f->w.w_o[(r * DV + e) * DM + o];
                CHECK_NEAR(f->contrib[r * NY + t * DM + o], s, 1e-5);
            }
    /* the standalone step gives the same blocks */
    float *c2 = naive_alloc_floats(H * NY);
    CHECK_OK(mha_head_contributions(c2, f->z, f->w.w_o, H, B * T, DV, DM));
    CHECK_ARRAY_NEAR(c2, f->contrib, H * NY, 1e-5);
    free(c2);
    fixture_free(f);
}

static void heads_capture_matches_naive(void) {
    fixture *f = fixture_new(202);
    if (!f) return;
    mha_options o = naive_ref_options();
    CHECK(naive_compare(f->L, &f->w, f->x, NULL, B, T, T, &o) <= 1e-5);
    fixture_free(f);
}

static void heads_probs_rows_sum_to_one(void) {
    fixture *f = fixture_new(203);
    if (!f) return;
    fixture_run(f, NULL);
    for (int row = 0; row < B * H * T; row++) {
        double s = 0;
        for (int j = 0; j < T; j++) {
            float p = f->probs[row * T + j];
            CHECK(p >= 0 && p <= 1);
            s += p;
        }
        CHECK_NEAR(s, 1, 1e-5);
    }
    /* causal: zero above the diagonal, rows still sum to 1 */
    mha_options o = naive_ref_options();
    o.causal = 1;
    mha_capture cap = {NULL, NULL, f->probs};
    CHECK_OK(mha_forward(f->L, f->y, &cap, f->x, NULL, B, T, T, &o));
    for (int row = 0; row < B * H * T; row++) {
        int i = row % T;
        double s = 0;
        for (int j = 0; j < T; j++) {
            if (j > i) CHECK_NEAR(f->probs[row * T + j], 0, 0);
            s += f->probs[row * T + j];
        }
        CHECK_NEAR(s, 1, 1e-5);
    }
    fixture_free(f);
}

/* Ablating head r (ZERO) changes Y by exactly minus r's contribution. */
static void heads_zero_removes_contribution(void) {
    fixture *f = fixture_new(204);
    if (!f) return;
    fixture_run(f, NULL);
    float y0[NY], c0[H * NY];
    memcpy(y0, f->y, sizeof y0);
    memcpy(c0, f->contrib, sizeof c0);
    for (int r = 0; r < H; r++) {
        mha_intervention ivs[H] = {{MHA_HEAD_KEEP, 0, NULL}};
        for (int k = 0; k < H; k++) ivs[k].op = MHA_HEAD_KEEP;
        ivs[r].op = MHA_HEAD_ZERO;
        fixture_run(f, ivs);
        for (size_t i = 0; i < NY; i++) CHECK_NEAR(f->y[i], y0[i] - c0[r * NY + i], 1e-5);
        for (int t = 0; t < B * T; t++)
            for (int e = 0; e < DV; e++) CHECK_NEAR(f->z[t * H * DV + r * DV + e], 0, 0);
        /* the ablated head's contribution is now zero, the others unchanged */
        for (size_t i = 0; i < NY; i++) CHECK_NEAR(f->contrib[r * NY + i], 0, 0);
        int other = (r + 1) % H;
        CHECK_ARRAY_NEAR(f->contrib + other * NY, c0 + other * NY, NY, 1e-6);
    }
    fixture_free(f);
}

/* SCALE, MEAN and REPLACE on different heads in one pass, against Z' and
 * Y' = Z' W_O + b_O computed here from the unablated captured Z. */
static void heads_scale_mean_replace_by_hand(void) {
    fixture *f = fixture_new(205);
    if (!f) return;
    fixture_run(f, NULL);
    double zh[NZ], yh[NY];
    for (size_t i = 0; i < NZ; i++) zh[i] = f->z[i];
    uint64_t seed = 77;
    float *value = naive_random_floats(B * T * DV, &seed, -2, 2); /* (B,T,d_v) */
    const float scale = -0.37f;
    for (int e = 0; e < DV; e++) {
        double mean = 0;
        for (int t = 0; t < B * T; t++) mean += zh[t * H * DV + 2 * DV + e];
        mean /= B * T;
        for (int t = 0; t < B * T; t++) {
            zh[t * H * DV + 0 * DV + e] *= scale;              /* head 0: SCALE   */
            zh[t * H * DV + 2 * DV + e] = mean;                /* head 2: MEAN    */
            zh[t * H * DV + 3 * DV + e] = value[t * DV + e];   /* head 3: REPLACE */
        }
    }
    project_by_hand(yh, zh, &f->w);
    mha_intervention ivs[H] = {{MHA_HEAD_SCALE, scale, NULL},
                               {MHA_HEAD_KEEP, 0, NULL},
                               {MHA_HEAD_MEAN, 0, NULL},
                               {MHA_HEAD_REPLACE, 0, value}};
    fixture_run(f, ivs);
    CHECK(naive_max_diff(f->z, zh, NZ) <= 1e-6);
    CHECK(naive_max_diff(f->y, yh, NY) <= 1e-5);
    /* the oracle, too */
    mha_options o = naive_ref_options();
    o.interventions = ivs;
    CHECK(naive_compare(f->L, &f->w, f->x, NULL, B, T, T, &o) <= 1e-5);
    free(value);
    fixture_free(f);
}

/* Each op alone, one at a time, on head 1. */
static void heads_each_op_alone(void) {
    fixture *f = fixture_new(206);
    if (!f) return;
    fixture_run(f, NULL);
    float z0[NZ];
    memcpy(z0, f->z, sizeof z0);
    uint64_t seed = 78;
    float *value = naive_random_floats(B * T * DV, &seed, -1, 1);
    const mha_head_op ops[4] = {MHA_HEAD_KEEP, MHA_HEAD_SCALE, MHA_HEAD_MEAN, MHA_HEAD_REPLACE};
    for (int k = 0; k < 4; k++) {
        mha_intervention ivs[H];
        for (int r = 0; r < H; r++) ivs[r] = (mha_intervention){MHA_HEAD_KEEP, 0, NULL};
        ivs[1] = (mha_intervention){ops[k], 2.5f, value};
        fixture_run(f, ivs);
        double zh[NZ], yh[NY];
        for (size_t i = 0; i < NZ; i++) zh[i] = z0[i];
        for (int e = 0; e < DV; e++) {
            double mean = 0;
            for (int t = 0; t < B * T; t++) mean += zh[t * H * DV + DV + e];
            mean /= B * T;
            for (int t = 0; t < B * T; t++) {
                double *p = &zh[t * H * DV + DV + e];
                if (ops[k] == MHA_HEAD_SCALE) *p *= 2.5;
                if (ops[k] == MHA_HEAD_MEAN) *p = mean;
                if (ops[k] == MHA_HEAD_REPLACE) *p = value[t * DV + e];
            }
        }
        project_by_hand(yh, zh, &f->w);
        CHECK(naive_max_diff(f->z, zh, NZ) <= 1e-6);
        CHECK(naive_max_diff(f->y, yh, NY) <= 1e-5);
    }
    free(value);
    fixture_free(f);
}

/* The standalone mha_head_intervene on a tiny z (rows 3, n 2, d 2). */
static void heads_intervene_standalone(void) {
    const float z0[12] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
    float z[12];
    mha_intervention iv = {MHA_HEAD_MEAN, 0, NULL};
    memcpy(z, z0, sizeof z);
    CHECK_OK(mha_head_intervene(z, &iv, 1, 2, 3, 2));
    /* head 1 columns 2,3: means (3+7+11)/3 = 7 and (4+8+12)/3 = 8 */
    const float mean_hand[12] = {1, 2, 7, 8, 5, 6, 7, 8, 9, 10, 7, 8};
    CHECK_ARRAY_NEAR(z, mean_hand, 12, 1e-6);
    memcpy(z, z0, sizeof z);
    iv = (mha_intervention){MHA_HEAD_SCALE, 0.5f, NULL};
    CHECK_OK(mha_head_intervene(z, &iv, 0, 2, 3, 2));
    const float scale_hand[12] = {0.5f, 1, 3, 4, 2.5f, 3, 7, 8, 4.5f, 5, 11, 12};
    CHECK_ARRAY_NEAR(z, scale_hand, 12, 0);
    const float value[6] = {-1, -2, -3, -4, -5, -6};
    memcpy(z, z0, sizeof z);
    iv = (mha_intervention){MHA_HEAD_REPLACE, 0, value};
    CHECK_OK(mha_head_intervene(z, &iv, 1, 2, 3, 2));
    const float repl_hand[12] = {1, 2, -1, -2, 5, 6, -3, -4, 9, 10, -5, -6};
    CHECK_ARRAY_NEAR(z, repl_hand, 12, 0);
    memcpy(z, z0, sizeof z);
    iv = (mha_intervention){MHA_HEAD_ZERO, 0, NULL};
    CHECK_OK(mha_head_intervene(z, &iv, 0, 2, 3, 2));
    const float zero_hand[12] = {0, 0, 3, 4, 0, 0, 7, 8, 0, 0, 11, 12};
    CHECK_ARRAY_NEAR(z, zero_hand, 12, 0);
    memcpy(z, z0, sizeof z);
    iv = (mha_intervention){MHA_HEAD_KEEP, 0, NULL};
    CHECK_OK(mha_head_intervene(z, &iv, 0, 2, 3, 2));
    CHECK_ARRAY_NEAR(z, z0, 12, 0);
}

/* Concat with an order, split, and the contributions of a tiny example:
 * 2 rows, 3 heads of width 1, d_out 2. */
static void heads_concat_split_contrib_standalone(void) {
    const float a[2] = {1, 2}, b[2] = {3, 4}, c[2] = {5, 6};
    const float *heads[3] = {a, b, c};
    const int order[3] = {2, 0, 1};
    float z[6];
    CHECK_OK(mha_concat_heads(z, heads, order, 3, 2, 1));
    const float want[6] = {5, 1, 3, 6, 2, 4}; /* row-major (rows, n*d) */
    CHECK_ARRAY_NEAR(z, want, 6, 0);
    float s0[2], s1[2], s2[2];
    float *outs[3] = {s0, s1, s2};
    CHECK_OK(mha_split_heads(outs, z, 3, 2, 1));
    CHECK_ARRAY_NEAR(s0, c, 2, 0);
    CHECK_ARRAY_NEAR(s1, a, 2, 0);
    CHECK_ARRAY_NEAR(s2, b, 2, 0);
    const float w[6] = {1, 2, 3, 4, 5, 6}; /* (3, 2) */
    const float bias[2] = {0.5f, -0.5f};
    float contrib[12], y[4];
    CHECK_OK(mha_head_contributions(contrib, z, w, 3, 2, 1, 2));
    /* block r, row t = z[t][r] * w[r][:] */
    const float chand[12] = {5, 10, 6, 12, 3, 4, 6, 8, 15, 18, 20, 24};
    CHECK_ARRAY_NEAR(contrib, chand, 12, 0);
    CHECK_OK(mha_project_out(y, z, w, bias, 2, 3, 2));
    const float yhand[4] = {23.5f, 31.5f, 32.5f, 43.5f};
    CHECK_ARRAY_NEAR(y, yhand, 4, 0);
}

/* mha_project_out gives the bits of the textbook loop written here: each
 * y element sums b then z_i w_i for i = 0, 1, ... in double. */
static void heads_project_out_textbook_bits(void) {
    uint64_t seed = 2801;
    const int rows = 5, din = 37, dout = 19;
    float *z = naive_random_floats((size_t)rows * din, &seed, -2.0f, 2.0f);
    float *w = naive_random_floats((size_t)din * dout, &seed, -2.0f, 2.0f);
    float *b = naive_random_floats((size_t)dout, &seed, -2.0f, 2.0f);
    float *y = naive_alloc_floats((size_t)rows * dout), *want = naive_alloc_floats((size_t)rows * dout);
    for (int t = 0; t < rows; t++)
        for (int o = 0; o < dout; o++) {
            double acc = b[o];
            for (int i = 0; i < din; i++) acc += (double)z[t * din + i] * w[i * dout + o];
            want[t * dout + o] = (float)acc;
        }
    CHECK_OK(mha_project_out(y, z, w, b, rows, din, dout));
    CHECK(memcmp(y, want, sizeof(float) * rows * dout) == 0);
    free(z), free(w), free(b), free(y), free(want);
}

static const test_case cases[] = {
    {"heads_project_out_textbook_bits", heads_project_out_textbook_bits},
    {"heads_contributions_sum_to_y", heads_contributions_sum_to_y},
    {"heads_capture_matches_naive", heads_capture_matches_naive},
    {"heads_probs_rows_sum_to_one", heads_probs_rows_sum_to_one},
    {"heads_zero_removes_contribution", heads_zero_removes_contribution},
    {"heads_scale_mean_replace_by_hand", heads_scale_mean_replace_by_hand},
    {"heads_each_op_alone", heads_each_op_alone},
    {"heads_intervene_standalone", heads_intervene_standalone},
    {"heads_concat_split_contrib_standalone", heads_concat_split_contrib_standalone},
};

const test_case *tests_heads(size_t *count) {
    *count = sizeof cases / sizeof cases[0];
    return cases;
}
