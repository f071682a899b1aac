/* test_merge_edges.c — the log-sum-exp entries and the merge at their
 * edges: every refused argument with its message, rows with no allowed
 * key, and a two-part merge against the formula evaluated here in double. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "tests.h"

enum { B_ = 1, T_ = 2, S_ = 3, H_ = 2, DK_ = 4 };

static void test_attend_lse_argument_errors(void) {
    mha_config cfg = mha_config_default(H_ * DK_, H_);
    float q[B_ * T_ * H_ * DK_] = {0}, k[B_ * S_ * H_ * DK_] = {0}, v[B_ * S_ * H_ * DK_] = {0};
    float z[B_ * T_ * H_ * DK_], lse[B_ * H_ * T_];
    CHECK_STATUS(mha_attend_lse(NULL, z, lse, q, k, v, B_, T_, S_, NULL), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("mha_attend_lse: cfg is NULL");
    mha_config bad = cfg;
    bad.n_heads = 3; /* does not divide d_model 8 */
    CHECK(mha_attend_lse(&bad, z, lse, q, k, v, B_, T_, S_, NULL) != MHA_OK);
    bad = cfg;
    bad.add_bias_kv = 1;
    CHECK_STATUS(mha_attend_lse(&bad, z, lse, q, k, v, B_, T_, S_, NULL), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("add_bias_kv=1 add_zero_attn=0; expected 0");
    bad = cfg;
    bad.add_zero_attn = 1;
    CHECK_STATUS(mha_attend_lse(&bad, z, lse, q, k, v, B_, T_, S_, NULL), MHA_E_ARG);
    bad = cfg;
    bad.alibi = 1;
    CHECK_STATUS(mha_attend_lse(&bad, z, lse, q, k, v, B_, T_, S_, NULL), MHA_E_UNSUPPORTED);
    CHECK_ERROR_MENTIONS("alibi=1 sinks=0 rope=0 qk_norm=0 clip_qkv=0 temperature_floor=0; expected none");
    bad = cfg;
    bad.clip_qkv = 2.0f; /* the clamp belongs to the projections: refused, not ignored */
    CHECK_STATUS(mha_attend_lse(&bad, z, lse, q, k, v, B_, T_, S_, NULL), MHA_E_UNSUPPORTED);
    CHECK_ERROR_MENTIONS("clip_qkv=2");
    bad = cfg;
    bad.sinks = 1;
    CHECK_STATUS(mha_attend_lse(&bad, z, lse, q, k, v, B_, T_, S_, NULL), MHA_E_UNSUPPORTED);
    bad = cfg;
    bad.rope.pairing = MHA_ROPE_HALVES;
    CHECK_STATUS(mha_attend_lse(&bad, z, lse, q, k, v, B_, T_, S_, NULL), MHA_E_UNSUPPORTED);
    CHECK_ERROR_MENTIONS("rope=1");
    bad = cfg;
    bad.qk_norm = MHA_QK_NORM_RMS;
    CHECK_STATUS(mha_attend_lse(&bad, z, lse, q, k, v, B_, T_, S_, NULL), MHA_E_UNSUPPORTED);
    CHECK_ERROR_MENTIONS("qk_norm=1");
    CHECK_STATUS(mha_attend_lse(&cfg, NULL, lse, q, k, v, B_, T_, S_, NULL), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("mha_attend_lse: z is NULL");
    CHECK_STATUS(mha_attend_lse(&cfg, z, lse, NULL, k, v, B_, T_, S_, NULL), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("q is NULL");
    CHECK_STATUS(mha_attend_lse(&cfg, z, lse, q, NULL, v, B_, T_, S_, NULL), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("k is NULL");
    CHECK_STATUS(mha_attend_lse(&cfg, z, lse, q, k, NULL, B_, T_, S_, NULL), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("v is NULL");
    CHECK_STATUS(mha_attend_lse(&cfg, z, lse, q, k, v, 0, T_, S_, NULL), MHA_E_SHAPE);
    CHECK_ERROR_MENTIONS("B=0 T=2 S=3; expected all >= 1");
    CHECK_STATUS(mha_attend_lse(&cfg, z, lse, q, k, v, B_, 0, S_, NULL), MHA_E_SHAPE);
    CHECK_STATUS(mha_attend_lse(&cfg, z, lse, q, k, v, B_, T_, 0, NULL), MHA_E_SHAPE);
    mha_options opt = mha_options_default();
    mha_intervention iv[H_];
    memset(iv, 0, sizeof iv);
    opt.interventions = iv;
    CHECK_STATUS(mha_attend_lse(&cfg, z, lse, q, k, v, B_, T_, S_, &opt), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("options.interventions given; expected NULL");
    float qn[B_ * T_ * H_ * DK_] = {0}, kn[B_ * S_ * H_ * DK_] = {0}, vn[B_ * S_ * H_ * DK_] = {0};
    qn[3] = NAN, kn[5] = INFINITY, vn[7] = NAN;
    CHECK_STATUS(mha_attend_lse(&cfg, z, lse, qn, k, v, B_, T_, S_, NULL), MHA_E_NONFINITE);
    CHECK_ERROR_MENTIONS("q");
    CHECK_STATUS(mha_attend_lse(&cfg, z, lse, q, kn, v, B_, T_, S_, NULL), MHA_E_NONFINITE);
    CHECK_STATUS(mha_attend_lse(&cfg, z, lse, q, k, vn, B_, T_, S_, NULL), MHA_E_NONFINITE);
    /* all-zero scores: uniform weights, lse = log S, z = mean of v rows */
    for (int i = 0; i < B_ * S_ * H_ * DK_; i++) v[i] = (float)(i % 7);
    CHECK_OK(mha_attend_lse(&cfg, z, lse, q, k, v, B_, T_, S_, NULL));
    for (int i = 0; i < B_ * H_ * T_; i++) CHECK_NEAR(lse[i], log(3.0), 1e-6);
    for (int t = 0; t < T_; t++)
        for (int e = 0; e < H_ * DK_; e++) {
            double m = 0;
            for (int j = 0; j < S_; j++) m += v[j * H_ * DK_ + e] / 3.0;
            CHECK_NEAR(z[t * H_ * DK_ + e], m, 1e-6);
        }
}

static void test_forward_lse_argument_errors(void) {
    mha_config cfg = mha_config_default(H_ * DK_, H_);
    mha_layer *L = NULL;
    CHECK_OK(mha_layer_create(&L, &cfg, NULL));
    if (!L) return;
    float x[B_ * T_ * H_ * DK_] = {0}, y[B_ * T_ * H_ * DK_], lse[B_ * H_ * T_];
    CHECK_STATUS(mha_forward_lse(L, y, NULL, NULL, x, NULL, NULL, B_, T_, T_, NULL), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("mha_forward_lse: lse is NULL; expected (B,h,T) floats");
    CHECK_STATUS(mha_forward_lse(NULL, y, NULL, lse, x, NULL, NULL, B_, T_, T_, NULL), MHA_E_ARG);
    /* zero weights: every score is 0, so lse = log(T) for self-attention */
    CHECK_OK(mha_forward_lse(L, y, NULL, lse, x, NULL, NULL, B_, T_, T_, NULL));
    for (int i = 0; i < B_ * H_ * T_; i++) CHECK_NEAR(lse[i], log((double)T_), 1e-6);
    mha_layer_free(L);
}

static void test_merge_argument_errors_and_formula(void) {
    enum { N = 2, ROWS = B_ * H_ * T_, ZN = B_ * T_ * H_ * DK_ };
    float z0[ZN], z1[ZN], l0[ROWS], l1[ROWS], z[ZN], lse[ROWS];
    for (int i = 0; i < ZN; i++) z0[i] = (float)i * 0.25f, z1[i] = 3.0f - (float)i;
    for (int i = 0; i < ROWS; i++) l0[i] = (float)i - 1.0f, l1[i] = 0.5f * (float)i;
    l0[1] = -INFINITY; /* part 0 saw no allowed key in that row */
    l0[3] = -INFINITY, l1[3] = -INFINITY; /* no part did */
    const float *zp[N] = {z0, z1}, *lp[N] = {l0, l1};
    CHECK_STATUS(mha_attention_merge(z, lse, zp, lp, 0, B_, T_, H_, DK_), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("n=0 B=1 T=2 h=2 d_v=4; expected all >= 1");
    CHECK_STATUS(mha_attention_merge(z, lse, zp, lp, N, B_, T_, H_, 0), MHA_E_ARG);
    CHECK_STATUS(mha_attention_merge(NULL, lse, zp, lp, N, B_, T_, H_, DK_), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("mha_attention_merge: NULL z");
    CHECK_STATUS(mha_attention_merge(z, lse, NULL, lp, N, B_, T_, H_, DK_), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("NULL z_parts");
    CHECK_STATUS(mha_attention_merge(z, lse, zp, NULL, N, B_, T_, H_, DK_), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("NULL lse_parts");
    const float *zp_null[N] = {z0, NULL}, *lp_null[N] = {NULL, l1};
    CHECK_STATUS(mha_attention_merge(z, lse, zp_null, lp, N, B_, T_, H_, DK_), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("part 1 has a NULL z");
    CHECK_STATUS(mha_attention_merge(z, lse, zp, lp_null, N, B_, T_, H_, DK_), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("part 0 has a NULL lse");
    float lbad[ROWS];
    memcpy(lbad, l1, sizeof lbad);
    lbad[2] = INFINITY;
    const float *lp_bad[N] = {l0, lbad};
    CHECK_STATUS(mha_attention_merge(z, lse, zp, lp_bad, N, B_, T_, H_, DK_), MHA_E_NONFINITE);
    CHECK_ERROR_MENTIONS("lse_parts[1][2] = inf; expected finite or -inf");
    lbad[2] = NAN;
    CHECK_STATUS(mha_attention_merge(z, lse, zp, lp_bad, N, B_, T_, H_, DK_), MHA_E_NONFINITE);

    CHECK_OK(mha_attention_merge(z, lse, zp, lp, N, B_, T_, H_, DK_));
    for (int r = 0; r < H_; r++)
        for (int t = 0; t < T_; t++) {
            int li = r * T_ + t;
            double e0 = exp((double)l0[li]), e1 = exp((double)l1[li]), s = e0 + e1;
            if (s == 0) {
                CHECK(isinf(lse[li]) && lse[li] < 0);
            } else {
                CHECK_NEAR(lse[li], log(s), 1e-5);
            }
            for (int e = 0; e < DK_; e++) {
                int zi = t * H_ * DK_ + r * DK_ + e;
                double want = s == 0 ? 0.0 : (e0 * z0[zi] + e1 * z1[zi]) / s;
                CHECK_NEAR(z[zi], want, 1e-5);
            }
        }
    /* lse NULL is allowed; z may alias part 0 */
    float zcopy[ZN];
    memcpy(zcopy, z, sizeof z);
    const float *zp_alias[N] = {z0, z1};
    CHECK_OK(mha_attention_merge(z0, NULL, zp_alias, lp, N, B_, T_, H_, DK_));
    CHECK(memcmp(z0, zcopy, sizeof zcopy) == 0);
}

static const test_case cases[] = {
    {"attend_lse_argument_errors", test_attend_lse_argument_errors},
    {"forward_lse_argument_errors", test_forward_lse_argument_errors},
    {"merge_edges_formula", test_merge_argument_errors_and_formula},
};

const test_case *tests_merge_edges(size_t *count) {
    *count = sizeof cases / sizeof cases[0];
    return cases;
}
