/* test_torch_layout.c — mha_layer_from_torch: PyTorch's (out, in) tensors
 * become the layer's (in, out) weights element for element, the optional
 * tensors map to config flags, and bad inputs are refused with messages
 * naming PyTorch's tensor. (Numerical parity with torch itself is in
 * tests/python/test_parity.py.)
 * Legend: E embed_dim, h heads, kdim key source width (KD), vdim value
 * source width (VD). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/packing.h"
#include "tests.h"

enum { E = 6, H = 2, KD = 4, VD = 5 };

/* Distinct values per tensor so a mixed-up tensor or index shows. */
static void fill_index(float *p, size_t n, float base) {
    for (size_t i = 0; i < n; i++) p[i] = base + 0.001f * (float)i;
}

static void torch_packed_elements(void) {
    float ipw[3 * E * E], ipb[3 * E], ow[E * E], ob[E], bk[E], bv[E];
    fill_index(ipw, 3 * E * E, 1.0f);
    fill_index(ipb, 3 * E, 2.0f);
    fill_index(ow, E * E, 3.0f);
    fill_index(ob, E, 4.0f);
    fill_index(bk, E, 5.0f);
    fill_index(bv, E, 6.0f);
    mha_torch_weights tw = {.embed_dim = E, .num_heads = H, .add_zero_attn = 1,
                            .in_proj_weight = ipw, .in_proj_bias = ipb, .out_proj_weight = ow,
                            .out_proj_bias = ob, .bias_k = bk, .bias_v = bv};
    mha_layer *L = NULL;
    CHECK_OK(mha_layer_from_torch(&L, &tw));
    if (!L) return;
    const mha_config *c = mha_layer_config(L);
    CHECK_INT(c->d_model, E);
    CHECK_INT(c->n_heads, H);
    CHECK_INT(c->d_k, E / H);
    CHECK_INT(c->d_kv_in, E);
    CHECK_INT(c->bias, 1);
    CHECK_INT(c->add_bias_kv, 1);
    CHECK_INT(c->add_zero_attn, 1);
    mha_weights w;
    mha_layer_get_weights(L, &w);
    int bad = 0;
    /* W_q[i][o] = in_proj_weight[o][i]; W_k rows E..2E; W_v rows 2E..3E */
    for (int i = 0; i < E; i++)
        for (int o = 0; o < E; o++) {
            bad += w.w_q[i * E + o] != ipw[o * E + i];
            bad += w.w_k[i * E + o] != ipw[(E + o) * E + i];
            bad += w.w_v[i * E + o] != ipw[(2 * E + o) * E + i];
            bad += w.w_o[i * E + o] != ow[o * E + i];
        }
    for (int o = 0; o < E; o++) {
        bad += w.b_q[o] != ipb[o];
        bad += w.b_k[o] != ipb[E + o];
        bad += w.b_v[o] != ipb[2 * E + o];
        bad += w.b_o[o] != ob[o];
        bad += w.bias_k[o] != bk[o];
        bad += w.bias_v[o] != bv[o];
    }
    CHECK_INT(bad, 0);
    mha_layer_free(L);
}

static void torch_separate_weights_kdim(void) {
    float qw[E * E], kw[E * KD], vw[E * KD], ow[E * E];
    fill_index(qw, E * E, 1.0f);
    fill_index(kw, E * KD, 2.0f);
    fill_index(vw, E * KD, 3.0f);
    fill_index(ow, E * E, 4.0f);
    mha_torch_weights tw = {.embed_dim = E, .num_heads = H, .kdim = KD, .vdim = KD,
                            .q_proj_weight = qw, .k_proj_weight = kw, .v_proj_weight = vw,
                            .out_proj_weight = ow};
    mha_layer *L = NULL;
    CHECK_OK(mha_layer_from_torch(&L, &tw));
    if (!L) return;
    const mha_config *c = mha_layer_config(L);
    CHECK_INT(c->d_kv_in, KD);
    CHECK_INT(c->bias, 0);
    CHECK_INT(c->add_bias_kv, 0);
    CHECK_INT(c->add_zero_attn, 0);
    mha_weights w;
    mha_layer_get_weights(L, &w);
    CHECK(w.b_q == NULL && w.bias_k == NULL);
    int bad = 0;
    for (int o = 0; o < E; o++) {
        for (int i = 0; i < E; i++) bad += w.w_q[i * E + o] != qw[o * E + i];
        for (int i = 0; i < KD; i++) {
            bad += w.w_k[i * E + o] != kw[o * KD + i];
            bad += w.w_v[i * E + o] != vw[o * KD + i];
        }
    }
    CHECK_INT(bad, 0);
    mha_layer_free(L);
}

/* The converted layer computes what a layer built from hand-transposed
 * weights computes (same floats in, same path): identical outputs. */
static void torch_forward_matches_hand_transposed(void) {
    uint64_t seed = 41;
    float ipw[3 * E * E], ipb[3 * E], ow[E * E], ob[E];
    test_fill_uniform(ipw, 3 * E * E, &seed, -1, 1);
    test_fill_uniform(ipb, 3 * E, &seed, -1, 1);
    test_fill_uniform(ow, E * E, &seed, -1, 1);
    test_fill_uniform(ob, E, &seed, -1, 1);
    float wq[E * E], wk[E * E], wv[E * E], wo[E * E];
    for (int i = 0; i < E; i++)
        for (int o = 0; o < E; o++) {
            wq[i * E + o] = ipw[o * E + i];
            wk[i * E + o] = ipw[(E + o) * E + i];
            wv[i * E + o] = ipw[(2 * E + o) * E + i];
            wo[i * E + o] = ow[o * E + i];
        }
    mha_config cfg = mha_config_default(E, H);
    mha_weights w = {wq, wk, wv, wo, ipb, ipb + E, ipb + 2 * E, ob, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL};
    mha_torch_weights tw = {.embed_dim = E, .num_heads = H, .in_proj_weight = ipw,
                            .in_proj_bias = ipb, .out_proj_weight = ow, .out_proj_bias = ob};
    mha_layer *a = NULL, *b = NULL;
    CHECK_OK(mha_layer_create(&a, &cfg, &w));
    CHECK_OK(mha_layer_from_torch(&b, &tw));
    if (a && b) {
        enum { B = 2, T = 3 };
        float x[B * T * E], ya[B * T * E], yb[B * T * E];
        test_fill_uniform(x, B * T * E, &seed, -1, 1);
        mha_options opt = mha_options_default();
        opt.path = MHA_PATH_REFERENCE;
        CHECK_OK(mha_forward(a, ya, NULL, x, NULL, B, T, T, &opt));
        CHECK_OK(mha_forward(b, yb, NULL, x, NULL, B, T, T, &opt));
        CHECK_ARRAY_NEAR(ya, yb, B * T * E, 0.0);
    }
    mha_layer_free(a);
    mha_layer_free(b);
}

/* kdim != vdim: K from `key` (kdim = d_kv_in), V from `value` (vdim =
 * d_v_in), element for element; the forward with separate sources equals
 * a layer built from the hand-transposed weights. */
static void torch_kdim_ne_vdim(void) {
    uint64_t seed = 42;
    float qw[E * E], kw[E * KD], vw[E * VD], ow[E * E], ipb[3 * E], ob[E];
    fill_index(qw, E * E, 1.0f);
    fill_index(kw, E * KD, 2.0f);
    fill_index(vw, E * VD, 3.0f);
    fill_index(ow, E * E, 4.0f);
    test_fill_uniform(ipb, 3 * E, &seed, -1, 1);
    test_fill_uniform(ob, E, &seed, -1, 1);
    mha_torch_weights tw = {.embed_dim = E, .num_heads = H, .kdim = KD, .vdim = VD,
                            .q_proj_weight = qw, .k_proj_weight = kw, .v_proj_weight = vw,
                            .out_proj_weight = ow, .in_proj_bias = ipb, .out_proj_bias = ob};
    mha_layer *L = NULL;
    CHECK_OK(mha_layer_from_torch(&L, &tw));
    if (!L) return;
    const mha_config *c = mha_layer_config(L);
    CHECK_INT(c->d_kv_in, KD);
    CHECK_INT(c->d_v_in, VD);
    mha_weights w;
    mha_layer_get_weights(L, &w);
    int bad = 0;
    float wq[E * E], wk[KD * E], wv[VD * E], wo[E * E];
    for (int o = 0; o < E; o++) {
        for (int i = 0; i < E; i++) bad += w.w_q[i * E + o] != qw[o * E + i];
        for (int i = 0; i < KD; i++) bad += w.w_k[i * E + o] != kw[o * KD + i];
        for (int i = 0; i < VD; i++) bad += w.w_v[i * E + o] != vw[o * VD + i];
        for (int i = 0; i < E; i++) wq[i * E + o] = qw[o * E + i], wo[i * E + o] = ow[o * E + i];
        for (int i = 0; i < KD; i++) wk[i * E + o] = kw[o * KD + i];
        for (int i = 0; i < VD; i++) wv[i * E + o] = vw[o * VD + i];
    }
    CHECK_INT(bad, 0);
    mha_config hc = mha_config_default(E, H);
    hc.d_kv_in = KD, hc.d_v_in = VD;
    mha_weights hw = {wq, wk, wv, wo, ipb, ipb + E, ipb + 2 * E, ob, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL};
    mha_layer *M = NULL;
    CHECK_OK(mha_layer_create(&M, &hc, &hw));
    if (M) {
        enum { B = 2, T = 3, S = 4 };
        float x[B * T * E], k[B * S * KD], v[B * S * VD], ya[B * T * E], yb[B * T * E];
        test_fill_uniform(x, B * T * E, &seed, -1, 1);
        test_fill_uniform(k, B * S * KD, &seed, -1, 1);
        test_fill_uniform(v, B * S * VD, &seed, -1, 1);
        mha_options opt = mha_options_default();
        opt.path = MHA_PATH_REFERENCE;
        CHECK_OK(mha_forward_kv(L, ya, NULL, x, k, v, B, T, S, &opt));
        CHECK_OK(mha_forward_kv(M, yb, NULL, x, k, v, B, T, S, &opt));
        CHECK_ARRAY_NEAR(ya, yb, B * T * E, 0.0);
        /* one source cannot serve both widths */
        CHECK_STATUS(mha_forward(L, ya, NULL, x, k, B, T, S, &opt), MHA_E_SHAPE);
        CHECK_ERROR_MENTIONS("d_v_in");
        mha_layer_free(M);
    }
    mha_layer_free(L);
}

/* The checkpoint path keeps vdim: a torch state dict with kdim != vdim
 * loads (layout detected) with d_v_in = vdim, and the native safetensors
 * written from it reads back with W_V (d_v_in, E) and the same outputs. */
static void torch_vdim_through_files(void) {
    uint64_t seed = 43;
    float qw[E * E], kw[E * KD], vw[E * VD], ow[E * E];
    test_fill_uniform(qw, E * E, &seed, -1, 1);
    test_fill_uniform(kw, E * KD, &seed, -1, 1);
    test_fill_uniform(vw, E * VD, &seed, -1, 1);
    test_fill_uniform(ow, E * E, &seed, -1, 1);
    mha_tensors *t = NULL, *nat = NULL;
    mha_layer *a = NULL, *b = NULL, *c = NULL;
    CHECK_OK(mha_tensors_create(&t));
    if (!t) return;
    const int sq[2] = {E, E}, sk[2] = {E, KD}, sv[2] = {E, VD};
    CHECK_OK(mha_tensors_add_f32(t, "attn.q_proj_weight", qw, 2, sq));
    CHECK_OK(mha_tensors_add_f32(t, "attn.k_proj_weight", kw, 2, sk));
    CHECK_OK(mha_tensors_add_f32(t, "attn.v_proj_weight", vw, 2, sv));
    CHECK_OK(mha_tensors_add_f32(t, "attn.out_proj.weight", ow, 2, sq));
    CHECK_OK(mha_tensors_set_meta(t, "n_heads", "2"));
    CHECK_OK(mha_layer_from_tensors(&a, t, NULL));
    if (a) {
        CHECK_INT(mha_layer_config(a)->d_kv_in, KD);
        CHECK_INT(mha_layer_config(a)->d_v_in, VD);
        CHECK_OK(mha_layer_to_tensors(&nat, a));
    }
    if (nat) {
        const mha_array *wv = mha_tensors_get(nat, "w_v");
        CHECK(wv && wv->rank == 2 && wv->shape[0] == VD && wv->shape[1] == E);
        CHECK_OK(mha_layer_from_tensors(&b, nat, NULL));
    }
    char path[] = "/tmp/mha_test_vdim_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    if (fd >= 0) close(fd);
    if (a && fd >= 0) {
        CHECK_OK(mha_layer_save(a, path));
        CHECK_OK(mha_layer_load(&c, path, NULL));
    }
    if (fd >= 0) remove(path);
    for (mha_layer *m = b; m; m = m == b ? c : NULL) {
        CHECK_INT(mha_layer_config(m)->d_v_in, VD);
        enum { B = 2, T = 3, S = 5 };
        float x[B * T * E], k[B * S * KD], v[B * S * VD], ya[B * T * E], yb[B * T * E];
        test_fill_uniform(x, B * T * E, &seed, -1, 1);
        test_fill_uniform(k, B * S * KD, &seed, -1, 1);
        test_fill_uniform(v, B * S * VD, &seed, -1, 1);
        CHECK_OK(mha_forward_kv(a, ya, NULL, x, k, v, B, T, S, NULL));
        CHECK_OK(mha_forward_kv(m, yb, NULL, x, k, v, B, T, S, NULL));
        CHECK_ARRAY_NEAR(ya, yb, B * T * E, 0.0);
    }
    mha_layer_free(a), mha_layer_free(b), mha_layer_free(c);
    mha_tensors_free(t), mha_tensors_free(nat);
}

static void torch_refusals_name_the_problem(void) {
    float ipw[3 * E * E] = {0}, ow[E * E] = {0}, qw[E * E] = {0};
    float bk[E] = {0};
    mha_layer *L = (mha_layer *)&L; /* must be reset to NULL on failure */
    /* in_proj_weight exists only when kdim == vdim == E */
    mha_torch_weights tw = {.embed_dim = E, .num_heads = H, .vdim = VD, .in_proj_weight = ipw,
                            .out_proj_weight = ow};
    CHECK_STATUS(mha_layer_from_torch(&L, &tw), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("vdim=5");
    CHECK(L == NULL);

    tw = (mha_torch_weights){.embed_dim = E, .num_heads = H, .kdim = KD, .vdim = -1,
                             .in_proj_weight = ipw, .out_proj_weight = ow};
    CHECK_STATUS(mha_layer_from_torch(&L, &tw), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("vdim=-1");

    tw = (mha_torch_weights){.embed_dim = E, .num_heads = 4, .in_proj_weight = ipw, .out_proj_weight = ow};
    CHECK_STATUS(mha_layer_from_torch(&L, &tw), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("num_heads=4");

    tw = (mha_torch_weights){.embed_dim = E, .num_heads = H, .in_proj_weight = ipw};
    CHECK_STATUS(mha_layer_from_torch(&L, &tw), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("out_proj_weight");

    tw = (mha_torch_weights){.embed_dim = E, .num_heads = H, .out_proj_weight = ow, .q_proj_weight = qw};
    CHECK_STATUS(mha_layer_from_torch(&L, &tw), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("k_proj_weight");

    tw = (mha_torch_weights){.embed_dim = E, .num_heads = H, .kdim = KD, .vdim = KD,
                             .in_proj_weight = ipw, .out_proj_weight = ow};
    CHECK_STATUS(mha_layer_from_torch(&L, &tw), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("in_proj_weight");

    tw = (mha_torch_weights){.embed_dim = E, .num_heads = H, .in_proj_weight = ipw,
                             .out_proj_weight = ow, .bias_k = bk};
    CHECK_STATUS(mha_layer_from_torch(&L, &tw), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("bias_v");

    tw = (mha_torch_weights){.embed_dim = E, .num_heads = H, .in_proj_weight = ipw,
                             .out_proj_weight = ow, .add_zero_attn = 2};
    CHECK_STATUS(mha_layer_from_torch(&L, &tw), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("add_zero_attn");

    ow[7] = NAN;
    tw = (mha_torch_weights){.embed_dim = E, .num_heads = H, .in_proj_weight = ipw, .out_proj_weight = ow};
    CHECK_STATUS(mha_layer_from_torch(&L, &tw), MHA_E_NONFINITE);
    CHECK_ERROR_MENTIONS("out_proj.weight[7]");
    CHECK_STATUS(mha_layer_from_torch(NULL, &tw), MHA_E_ARG);
    CHECK_STATUS(mha_layer_from_torch(&L, NULL), MHA_E_ARG);
}

/* ------------------------------------------- conversion straight to packing */

/* Sizes past one 16x16 transpose tile and one 16-column panel, with ragged
 * edges: E = 40 (h = 4), kdim = 37, vdim = 21. */
enum { BE = 40, BH = 4, BKD = 37, BVD = 21 };

/* src (n_out, n_in) -> (n_in, n_out), written here independently. */
static float *hand_transposed(const float *src, int n_out, int n_in) {
    float *t = malloc((size_t)n_out * n_in * sizeof *t);
    for (int o = 0; o < n_out; o++)
        for (int i = 0; i < n_in; i++) t[(size_t)i * n_out + o] = src[(size_t)o * n_in + i];
    return t;
}

static int packed_equal(const mha_packed *a, const mha_packed *b) {
    if (a->K != b->K || a->n_sections != b->n_sections) return 0;
    if (memcmp(a->cols, b->cols, sizeof a->cols) || memcmp(a->first_panel, b->first_panel, sizeof a->first_panel))
        return 0;
    size_t np = (size_t)a->first_panel[a->n_sections];
    if (np == 0) return 1;
    return memcmp(a->panels, b->panels, np * a->K * 16 * sizeof(float)) == 0 &&
           memcmp(a->bias, b->bias, np * 16 * sizeof(float)) == 0;
}

/* Every packed matrix and every weight of a equals b's, bit for bit. */
static int layers_equal(const mha_layer *a, const mha_layer *b) {
    const struct mha_fast_state *fa = a->fast, *fb = b->fast;
    if (!fa || !fb || fa->fused != fb->fused || fa->split_v != fb->split_v) return 0;
    int same = packed_equal(&fa->o, &fb->o) &&
               (fa->fused ? packed_equal(&fa->qkv, &fb->qkv)
                          : packed_equal(&fa->q, &fb->q) && packed_equal(&fa->kv, &fb->kv) &&
                                (!fa->split_v || packed_equal(&fa->v, &fb->v)));
    mha_weights wa, wb;
    mha_layer_get_weights(a, &wa);
    mha_layer_get_weights(b, &wb);
    const mha_config *c = mha_layer_config(a);
    size_t hk = (size_t)c->n_heads * c->d_k;
    same = same && memcmp(wa.w_q, wb.w_q, (size_t)c->d_model * hk * 4) == 0 &&
           memcmp(wa.w_k, wb.w_k, (size_t)c->d_kv_in * hk * 4) == 0 &&
           memcmp(wa.w_v, wb.w_v, (size_t)c->d_v_in * hk * 4) == 0 &&
           memcmp(wa.w_o, wb.w_o, hk * c->d_model * 4) == 0;
    if (c->bias)
        same = same && memcmp(wa.b_q, wb.b_q, hk * 4) == 0 && memcmp(wa.b_k, wb.b_k, hk * 4) == 0 &&
               memcmp(wa.b_v, wb.b_v, hk * 4) == 0 && memcmp(wa.b_o, wb.b_o, (size_t)c->d_model * 4) == 0;
    if (c->add_bias_kv)
        same = same && memcmp(wa.bias_k, wb.bias_k, hk * 4) == 0 && memcmp(wa.bias_v, wb.bias_v, hk * 4) == 0;
    return same;
}

/* The torch layout is packed straight from its (out, in) tensors and
 * transposed into the layer in the same call: the packed panels and the
 * layer's weights are the bits that the native layout (hand-transposed
 * weights through mha_layer_create) gives, for the fused in_proj_weight
 * and for separate q/k/v weights of widths kdim != vdim, with 1 and 2
 * threads. */
static void torch_packing_matches_native(void) {
    uint64_t seed = 77;
    const size_t e = BE;
    float *ipw = malloc(3 * e * e * 4), *ow = malloc(e * e * 4), *ipb = malloc(3 * e * 4),
          *ob = malloc(e * 4), *bk = malloc(e * 4), *bv = malloc(e * 4), *qw = malloc(e * e * 4),
          *kw = malloc(e * BKD * 4), *vw = malloc(e * BVD * 4);
    test_fill_uniform(ipw, 3 * e * e, &seed, -1, 1);
    test_fill_uniform(ow, e * e, &seed, -1, 1);
    test_fill_uniform(ipb, 3 * e, &seed, -1, 1);
    test_fill_uniform(ob, e, &seed, -1, 1);
    test_fill_uniform(bk, e, &seed, -1, 1);
    test_fill_uniform(bv, e, &seed, -1, 1);
    test_fill_uniform(qw, e * e, &seed, -1, 1);
    test_fill_uniform(kw, e * BKD, &seed, -1, 1);
    test_fill_uniform(vw, e * BVD, &seed, -1, 1);
    int saved = mha_get_num_threads();
    for (int form = 0; form < 2; form++) {
        mha_torch_weights tw = {.embed_dim = BE, .num_heads = BH, .out_proj_weight = ow};
        mha_config cfg = mha_config_default(BE, BH);
        float *t[4];
        if (form == 0) { /* fused: in_proj_weight (3E, E), all biases, bias_k/v */
            tw.in_proj_weight = ipw, tw.in_proj_bias = ipb, tw.out_proj_bias = ob;
            tw.bias_k = bk, tw.bias_v = bv;
            cfg.add_bias_kv = 1;
            for (int p = 0; p < 3; p++) t[p] = hand_transposed(ipw + p * e * e, BE, BE);
        } else { /* separate, kdim != vdim, no bias */
            tw.kdim = BKD, tw.vdim = BVD;
            tw.q_proj_weight = qw, tw.k_proj_weight = kw, tw.v_proj_weight = vw;
            cfg.d_kv_in = BKD, cfg.d_v_in = BVD, cfg.bias = 0;
            t[0] = hand_transposed(qw, BE, BE);
            t[1] = hand_transposed(kw, BE, BKD);
            t[2] = hand_transposed(vw, BE, BVD);
        }
        t[3] = hand_transposed(ow, BE, BE);
        mha_weights w = {.w_q = t[0], .w_k = t[1], .w_v = t[2], .w_o = t[3]};
        if (form == 0) {
            w.b_q = ipb, w.b_k = ipb + e, w.b_v = ipb + 2 * e, w.b_o = ob;
            w.bias_k = bk, w.bias_v = bv;
        }
        mha_layer *native = NULL;
        CHECK_OK(mha_layer_create(&native, &cfg, &w));
        /* every kernel table the CPU runs: the packer's transposed store
         * (avx512) and the element loops (avx2, scalar) give the same bytes */
        const mha_kernels *tables[3] = {&mha_kernels_avx512, &mha_kernels_avx2, &mha_kernels_scalar};
        const int can[3] = {mha_cpu_has_avx512(), mha_cpu_has_avx2(), 1};
        for (int k = 0; k < 3; k++)
            for (int th = 1; th <= 2 && native && can[k]; th++) {
                mha_set_num_threads(th);
                mha_kernels_force(tables[k]);
                mha_layer *L = NULL;
                CHECK_OK(mha_layer_from_torch(&L, &tw));
                mha_kernels_force(NULL);
                if (L && !layers_equal(L, native)) {
                    printf("    form %d, %s, %d thread(s): torch layout differs from native\n", form,
                           tables[k]->name, th);
                    CHECK(0);
                }
                mha_layer_free(L);
            }
        mha_layer_free(native);
        for (int p = 0; p < 4; p++) free(t[p]);
    }
    mha_set_num_threads(saved);
    free(ipw), free(ow), free(ipb), free(ob), free(bk), free(bv), free(qw), free(kw), free(vw);
}

/* The finiteness check rides on the copy out of the packed panels (and
 * the bias copies): a value anywhere, inside a full panel or on a ragged
 * edge, is refused with PyTorch's name and its index in PyTorch's (out, in)
 * layout; the first in attribute order wins. With 1 and 2 threads, on
 * every kernel table the CPU runs (each has its own all_within). */
static void torch_nonfinite_named_once(void) {
    uint64_t seed = 78;
    const size_t e = BE;
    float *ipw = malloc(3 * e * e * 4), *ow = malloc(e * e * 4), *ipb = malloc(3 * e * 4),
          *bk = malloc(e * 4), *bv = malloc(e * 4), *kw = malloc(e * BKD * 4);
    const struct {
        float *p;
        size_t at;
        float val;
        const char *named;
    } cases[] = {
        {ipw, 50 * e + 17, NAN, "in_proj_weight[2017]"},      /* a full tile */
        {ipw, 3 * e * e - 1, INFINITY, "in_proj_weight[4799]"}, /* the last element */
        {ow, 39 * e + 38, -INFINITY, "out_proj.weight[1598]"}, /* a ragged edge */
        {ipb, 100, NAN, "in_proj_bias[100]"},
        {bv, 3, INFINITY, "bias_v[3]"},
        {kw, 20 * BKD + 36, NAN, "k_proj_weight[776]"},
    };
    int saved = mha_get_num_threads();
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++)
        for (int th = 1; th <= 2; th++) {
            mha_set_num_threads(th);
            test_fill_uniform(ipw, 3 * e * e, &seed, -1, 1);
            test_fill_uniform(ow, e * e, &seed, -1, 1);
            test_fill_uniform(ipb, 3 * e, &seed, -1, 1);
            test_fill_uniform(bk, e, &seed, -1, 1);
            test_fill_uniform(bv, e, &seed, -1, 1);
            test_fill_uniform(kw, e * BKD, &seed, -1, 1);
            cases[k].p[cases[k].at] = cases[k].val;
            /* out_proj.weight comes later in attribute order than the
             * input projections and in_proj_bias: a NaN there is not the one named */
            if (cases[k].p == ipw || cases[k].p == ipb || cases[k].p == kw) ow[0] = NAN;
            mha_torch_weights tw = {.embed_dim = BE, .num_heads = BH, .out_proj_weight = ow,
                                    .bias_k = bk, .bias_v = bv};
            float *qv = NULL;
            if (cases[k].p == kw) { /* separate weights: q and v finite */
                qv = malloc(e * e * 4);
                test_fill_uniform(qv, e * e, &seed, -1, 1);
                tw.kdim = BKD, tw.vdim = BE;
                tw.q_proj_weight = qv, tw.k_proj_weight = kw, tw.v_proj_weight = qv;
            } else {
                tw.in_proj_weight = ipw, tw.in_proj_bias = ipb;
            }
            mha_layer *L = NULL;
            CHECK_STATUS(mha_layer_from_torch(&L, &tw), MHA_E_NONFINITE);
            CHECK_ERROR_MENTIONS(cases[k].named);
            CHECK(L == NULL);
            free(qv);
        }
    mha_set_num_threads(saved);
    free(ipw), free(ow), free(ipb), free(bk), free(bv), free(kw);
}

static void torch_nonfinite_named_after_one_pass(void) {
    const mha_kernels *tables[3] = {&mha_kernels_avx512, &mha_kernels_avx2, &mha_kernels_scalar};
    const int can[3] = {mha_cpu_has_avx512(), mha_cpu_has_avx2(), 1};
    for (int k = 0; k < 3; k++) {
        if (!can[k]) continue;
        mha_kernels_force(tables[k]);
        torch_nonfinite_named_once();
        mha_kernels_force(NULL);
    }
}

static const test_case cases[] = {
    {"torch_packing_matches_native", torch_packing_matches_native},
    {"torch_nonfinite_named_after_one_pass", torch_nonfinite_named_after_one_pass},
    {"torch_packed_elements", torch_packed_elements},
    {"torch_separate_weights_kdim", torch_separate_weights_kdim},
    {"torch_forward_matches_hand_transposed", torch_forward_matches_hand_transposed},
    {"torch_kdim_ne_vdim", torch_kdim_ne_vdim},
    {"torch_vdim_through_files", torch_vdim_through_files},
    {"torch_refusals_name_the_problem", torch_refusals_name_the_problem},
};

const test_case *tests_torch_layout(size_t *count) {
    *count = sizeof cases / sizeof cases[0];
    return cases;
}
