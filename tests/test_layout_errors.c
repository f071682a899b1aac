/* test_layout_errors.c — every checkpoint layout refuses damaged tensor
 * sets with a message naming what is wrong. From one valid set per layout
 * (native, hf, gpt2, megatron, torch), each tensor in turn is removed,
 * given one row too many, and flattened to rank 1; each native metadata
 * entry is spoiled. A removed bias may load (biases are optional), nothing
 * else may: the status must be an error and the message must name the
 * tensor (or the metadata key).
 * Legend: d_model, h heads, h_kv kv heads, d head width. */
#include <stdlib.h>
#include <string.h>

#include "naive.h"
#include "tests.h"

/* A copy of t with tensor `skip` left out (-1: none) and tensor `reshape`
 * given shape {shape[0] + 1, shape[1]...} (mode 1) or flattened (mode 2),
 * zero-filled. Metadata is copied, with `meta_key` set to `meta_value`. */
static mha_tensors *perturbed(const mha_tensors *t, int skip, int reshape, int mode,
                              const char *meta_key, const char *meta_value) {
    mha_tensors *o = NULL;
    CHECK_OK(mha_tensors_create(&o));
    for (int i = 0; o && i < mha_tensors_count(t); i++) {
        if (i == skip) continue;
        const char *name = mha_tensors_name(t, i);
        const mha_array *a = mha_tensors_get(t, name);
        if (i != reshape) {
            CHECK_OK(mha_tensors_add(o, name, a));
            continue;
        }
        int shape[MHA_ARRAY_MAX_RANK], rank = a->rank;
        memcpy(shape, a->shape, sizeof shape);
        if (mode == 1) shape[0] += 1;
        else shape[0] = (int)a->count, rank = 1;
        size_t n = 1;
        for (int d = 0; d < rank; d++) n *= (size_t)shape[d];
        float *z = naive_alloc_floats(n);
        CHECK_OK(mha_tensors_add_f32(o, name, z, rank, shape));
        free(z);
    }
    for (int i = 0; o && i < mha_tensors_meta_count(t); i++) {
        const char *k = mha_tensors_meta_key(t, i);
        CHECK_OK(mha_tensors_set_meta(o, k, meta_key && !strcmp(k, meta_key) ? meta_value : mha_tensors_meta(t, k)));
    }
    return o;
}

/* The last path component after the layout's prefix, as messages quote it. */
static const char *short_name(const char *name, const char *prefix) {
    size_t n = strlen(prefix);
    return strncmp(name, prefix, n) == 0 ? name + n : name;
}

/* Runs every tensor perturbation of t through mha_layer_from_tensors.
 * free_rows: tensors (short names, space-separated) whose first dimension
 * is a free model dimension (native w_k: d_kv_in), so one row more is
 * another valid layer. */
static void check_damage(const char *what, const mha_tensors *t, const mha_load_options *opt,
                         const char *prefix, const char *free_rows) {
    mha_layer *L = NULL;
    CHECK_OK(mha_layer_from_tensors(&L, t, opt)); /* the undamaged set loads */
    mha_layer_free(L);
    for (int i = 0; i < mha_tensors_count(t); i++) {
        const char *name = mha_tensors_name(t, i), *shortn = short_name(name, prefix);
        int optional = strstr(name, "bias") != NULL || strncmp(shortn, "b_", 2) == 0;
        char padded[80];
        snprintf(padded, sizeof padded, " %s ", shortn);
        int free_row = strstr(free_rows, padded) != NULL;
        for (int mode = 0; mode < 3; mode++) {
            if (mode == 2 && mha_tensors_get(t, name)->rank < 2) continue; /* already flat */
            mha_tensors *p = perturbed(t, mode == 0 ? i : -1, mode ? i : -1, mode, NULL, NULL);
            L = NULL;
            mha_status s = mha_layer_from_tensors(&L, p, opt);
            if (s == MHA_OK) {
                if (!(mode == 0 && optional) && !(mode == 1 && free_row))
                    test_report(__FILE__, __LINE__, "%s: %s %s loaded", what, name,
                                mode == 0 ? "removed" : mode == 1 ? "with a row too many" : "flattened");
                mha_layer_free(L);
            } else if (mode > 0 && !strstr(mha_last_error(), shortn) && !strstr(mha_last_error(), "has shape")) {
                /* a wrong shape names the tensor, or the tensor whose shape
                 * no longer agrees with the dimension it changed; a missing
                 * one may be reported as a layout that no longer fits */
                test_report(__FILE__, __LINE__, "%s: %s (mode %d): error \"%s\" does not name it", what,
                            name, mode, mha_last_error());
            } else if (!L && mha_last_error()[0] == '\0') {
                test_report(__FILE__, __LINE__, "%s: %s removed: empty message", what, name);
            }
            mha_tensors_free(p);
        }
    }
}

static mha_config config(int d_model, int h, int h_kv, int d) {
    mha_config c = mha_config_default(d_model, h);
    c.n_kv_heads = h_kv, c.d_k = d, c.d_v = d, c.bias = 1;
    return naive_resolve(c);
}

/* (rows, cols) -> (cols, rows) */
static float *transposed(const float *a, int rows, int cols) {
    float *t = naive_alloc_floats((size_t)rows * cols);
    for (int i = 0; i < rows; i++)
        for (int j = 0; j < cols; j++) t[(size_t)j * rows + i] = a[(size_t)i * cols + j];
    return t;
}

static void add(mha_tensors *t, const char *name, const float *d, int rank, int d0, int d1) {
    int s[2] = {d0, d1};
    CHECK_OK(mha_tensors_add_f32(t, name, d, rank, s));
}

static void test_layout_native_damaged(void) {
    uint64_t seed = 501;
    mha_config c = config(12, 4, 2, 3);
    c.add_bias_kv = 1;
    naive_weights w;
    naive_weights_random(&w, &c, &seed, 0.5f);
    mha_layer *L = naive_make_layer(&w);
    mha_tensors *t = NULL;
    CHECK_OK(mha_layer_to_tensors(&t, L));
    mha_load_options opt = {.layout = MHA_LAYOUT_NATIVE};
    if (t) check_damage("native", t, &opt, "", " w_k w_v ");
    /* each metadata entry spoiled: not a number, zero, negative, huge */
    static const char *bad[] = {"x", "0", "-3", "99999999999", "1.5"};
    for (int i = 0; t && i < mha_tensors_meta_count(t); i++) {
        const char *k = mha_tensors_meta_key(t, i);
        for (size_t v = 0; v < sizeof bad / sizeof bad[0]; v++) {
            mha_tensors *p = perturbed(t, -1, -1, 0, k, bad[v]);
            mha_layer *L2 = NULL;
            mha_status s = mha_layer_from_tensors(&L2, p, &opt);
            /* metadata the loader reads must be refused by name; a value
             * that merely repeats what the shapes say may not matter */
            if (s != MHA_OK && !strstr(mha_last_error(), k) && !strstr(mha_last_error(), "labels"))
                test_report(__FILE__, __LINE__, "native: meta %s=%s: \"%s\" does not name it", k, bad[v],
                            mha_last_error());
            if (s == MHA_OK && strncmp(k, "labels", 6) == 0)
                test_report(__FILE__, __LINE__, "native: meta %s=%s loaded", k, bad[v]);
            mha_layer_free(L2);
            mha_tensors_free(p);
        }
    }
    /* kv heads that fit an int but no head count: refused before any h_kv * d_k (2^30 * 3 overflowed int,
     * undefined, and the message spoke of a negative column count); 3 does not divide 4 either */
    static const char *kv[] = {"1073741824", "3", "8"};
    for (size_t v = 0; t && v < sizeof kv / sizeof kv[0]; v++) {
        mha_tensors *p = perturbed(t, -1, -1, 0, "n_kv_heads", kv[v]);
        mha_layer *L2 = NULL;
        CHECK_STATUS(mha_layer_from_tensors(&L2, p, &opt), MHA_E_SHAPE);
        CHECK_ERROR_MENTIONS("do not split into n_kv_heads = ");
        CHECK_ERROR_MENTIONS(kv[v]);
        mha_layer_free(L2);
        mha_tensors_free(p);
    }
    mha_tensors_free(t);
    mha_layer_free(L);
    naive_weights_free(&w);
}

static void test_layout_hf_damaged(void) {
    uint64_t seed = 502;
    mha_config c = config(8, 4, 2, 3);
    naive_weights w;
    naive_weights_random(&w, &c, &seed, 0.5f);
    int qd = 12, kd = 6;
    float *q = transposed(w.w_q, 8, qd), *k = transposed(w.w_k, 8, kd), *v = transposed(w.w_v, 8, kd),
          *o = transposed(w.w_o, qd, 8);
    mha_tensors *t = NULL;
    CHECK_OK(mha_tensors_create(&t));
    const char *P = "layers.0.self_attn.";
    char n[8][64];
    const char *suffix[8] = {"q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight",
                             "q_proj.bias", "k_proj.bias", "v_proj.bias", "o_proj.bias"};
    for (int i = 0; i < 8; i++) snprintf(n[i], sizeof n[i], "%s%s", P, suffix[i]);
    add(t, n[0], q, 2, qd, 8), add(t, n[1], k, 2, kd, 8), add(t, n[2], v, 2, kd, 8), add(t, n[3], o, 2, 8, qd);
    add(t, n[4], w.b_q, 1, qd, 0), add(t, n[5], w.b_k, 1, kd, 0), add(t, n[6], w.b_v, 1, kd, 0);
    add(t, n[7], w.b_o, 1, 8, 0);
    mha_load_options opt = {.layout = MHA_LAYOUT_HF, .n_heads = 4, .prefix = P};
    check_damage("hf", t, &opt, P, "");
    /* kv heads given and wrong; heads that do not divide */
    opt.n_kv_heads = 3;
    mha_layer *L = NULL;
    CHECK(mha_layer_from_tensors(&L, t, &opt) != MHA_OK);
    opt.n_kv_heads = 0, opt.n_heads = 5;
    CHECK(mha_layer_from_tensors(&L, t, &opt) != MHA_OK);
    CHECK(L == NULL);
    mha_tensors_free(t);
    free(q), free(k), free(v), free(o);
    naive_weights_free(&w);
}

static void test_layout_gpt2_damaged(void) {
    uint64_t seed = 503;
    mha_config c = config(6, 2, 2, 3);
    naive_weights w;
    naive_weights_random(&w, &c, &seed, 0.5f);
    int D = 6, E = 6;
    float *ca = naive_random_floats((size_t)D * 3 * E, &seed, -0.5f, 0.5f);
    float *cb = naive_random_floats((size_t)3 * E, &seed, -0.5f, 0.5f);
    mha_tensors *t = NULL;
    CHECK_OK(mha_tensors_create(&t));
    add(t, "h.0.attn.c_attn.weight", ca, 2, D, 3 * E);
    add(t, "h.0.attn.c_attn.bias", cb, 1, 3 * E, 0);
    add(t, "h.0.attn.c_proj.weight", w.w_o, 2, E, D);
    add(t, "h.0.attn.c_proj.bias", w.b_o, 1, D, 0);
    mha_load_options opt = {.layout = MHA_LAYOUT_GPT2, .n_heads = 2, .prefix = "h.0.attn."};
    check_damage("gpt2", t, &opt, "h.0.attn.", "");
    opt.n_heads = 4; /* 4 does not divide E = 6 */
    mha_layer *L = NULL;
    CHECK_STATUS(mha_layer_from_tensors(&L, t, &opt), MHA_E_SHAPE);
    CHECK_ERROR_MENTIONS("heads");
    mha_tensors_free(t);
    free(ca), free(cb);
    naive_weights_free(&w);
}

static void test_layout_megatron_damaged(void) {
    uint64_t seed = 504;
    int h = 4, hkv = 2, d = 2, D = 8, rows = (h + 2 * hkv) * d;
    float *qkv = naive_random_floats((size_t)rows * D, &seed, -0.5f, 0.5f);
    float *bqkv = naive_random_floats((size_t)rows, &seed, -0.5f, 0.5f);
    float *dense = naive_random_floats((size_t)D * h * d, &seed, -0.5f, 0.5f);
    float *bd = naive_random_floats((size_t)D, &seed, -0.5f, 0.5f);
    mha_tensors *t = NULL;
    CHECK_OK(mha_tensors_create(&t));
    add(t, "attention.query_key_value.weight", qkv, 2, rows, D);
    add(t, "attention.query_key_value.bias", bqkv, 1, rows, 0);
    add(t, "attention.dense.weight", dense, 2, D, h * d);
    add(t, "attention.dense.bias", bd, 1, D, 0);
    mha_load_options opt = {.layout = MHA_LAYOUT_MEGATRON, .n_heads = h, .n_kv_heads = hkv,
                            .prefix = "attention."};
    check_damage("megatron", t, &opt, "attention.", "");
    /* without n_kv_heads, the rows give it; without heads, nothing does */
    opt.n_kv_heads = 0;
    mha_layer *L = NULL;
    CHECK_OK(mha_layer_from_tensors(&L, t, &opt));
    if (L) CHECK_INT(mha_layer_config(L)->n_kv_heads, hkv);
    mha_layer_free(L);
    L = NULL;
    opt.n_heads = 0;
    CHECK_STATUS(mha_layer_from_tensors(&L, t, &opt), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("--heads");
    opt.n_heads = 3; /* 3 heads do not divide dense's 8 columns */
    CHECK(mha_layer_from_tensors(&L, t, &opt) != MHA_OK);
    mha_tensors_free(t);
    free(qkv), free(bqkv), free(dense), free(bd);
}

static void test_layout_torch_damaged(void) {
    uint64_t seed = 505;
    int E = 6;
    float *ipw = naive_random_floats((size_t)3 * E * E, &seed, -0.5f, 0.5f);
    float *ipb = naive_random_floats((size_t)3 * E, &seed, -0.5f, 0.5f);
    float *ow = naive_random_floats((size_t)E * E, &seed, -0.5f, 0.5f);
    float *ob = naive_random_floats((size_t)E, &seed, -0.5f, 0.5f);
    mha_tensors *t = NULL;
    CHECK_OK(mha_tensors_create(&t));
    add(t, "attn.in_proj_weight", ipw, 2, 3 * E, E);
    add(t, "attn.in_proj_bias", ipb, 1, 3 * E, 0);
    add(t, "attn.out_proj.weight", ow, 2, E, E);
    add(t, "attn.out_proj.bias", ob, 1, E, 0);
    mha_load_options opt = {.layout = MHA_LAYOUT_TORCH, .n_heads = 2, .prefix = "attn."};
    check_damage("torch", t, &opt, "attn.", "");
    mha_tensors_free(t);
    free(ipw), free(ipb), free(ow), free(ob);
}

/* mha_load_options.add_zero_attn (CLI --zero-attn): a state_dict does not
 * record torch's add_zero_attn, so the caller says it. The torch layout
 * given the option is the layer mha_layer_from_torch makes with
 * add_zero_attn = 1 (the same forward bits), a different layer from the
 * plain load; a native file (the plain layer saved) takes it too; any
 * value but 0 and 1 is refused naming it. */
static void test_layout_zero_attn_option(void) {
    uint64_t seed = 506;
    enum { E = 6, H = 2, T = 3 };
    float *ipw = naive_random_floats((size_t)3 * E * E, &seed, -0.5f, 0.5f);
    float *ipb = naive_random_floats((size_t)3 * E, &seed, -0.5f, 0.5f);
    float *ow = naive_random_floats((size_t)E * E, &seed, -0.5f, 0.5f);
    float *ob = naive_random_floats((size_t)E, &seed, -0.5f, 0.5f);
    float *x = naive_random_floats((size_t)T * E, &seed, -1.0f, 1.0f), y[3][T * E];
    mha_tensors *t = NULL, *nat = NULL;
    CHECK_OK(mha_tensors_create(&t));
    add(t, "attn.in_proj_weight", ipw, 2, 3 * E, E);
    add(t, "attn.in_proj_bias", ipb, 1, 3 * E, 0);
    add(t, "attn.out_proj.weight", ow, 2, E, E);
    add(t, "attn.out_proj.bias", ob, 1, E, 0);
    mha_torch_weights tw = {.embed_dim = E, .num_heads = H, .add_zero_attn = 1, .in_proj_weight = ipw,
                            .in_proj_bias = ipb, .out_proj_weight = ow, .out_proj_bias = ob};
    mha_load_options opt = {.layout = MHA_LAYOUT_TORCH, .n_heads = H, .prefix = "attn."};
    mha_layer *L[3] = {NULL, NULL, NULL}, *N = NULL;
    CHECK_OK(mha_layer_from_tensors(&L[0], t, &opt));
    opt.add_zero_attn = 1;
    CHECK_OK(mha_layer_from_tensors(&L[1], t, &opt));
    CHECK_OK(mha_layer_from_torch(&L[2], &tw));
    const mha_options fo = mha_options_default();
    for (int i = 0; i < 3; i++) CHECK_OK(L[i] ? mha_forward(L[i], y[i], NULL, x, NULL, 1, T, T, &fo) : MHA_E_ARG);
    if (L[0] && L[1] && L[2]) {
        CHECK_INT(mha_layer_config(L[0])->add_zero_attn, 0);
        CHECK_INT(mha_layer_config(L[1])->add_zero_attn, 1);
        CHECK(memcmp(y[1], y[2], sizeof y[1]) == 0);
        CHECK(memcmp(y[0], y[1], sizeof y[0]) != 0);
        CHECK_OK(mha_layer_to_tensors(&nat, L[0]));
        mha_load_options no = {.layout = MHA_LAYOUT_NATIVE, .add_zero_attn = 1};
        CHECK_OK(mha_layer_from_tensors(&N, nat, &no));
        if (N) CHECK_INT(mha_layer_config(N)->add_zero_attn, 1);
    }
    opt.add_zero_attn = 2;
    mha_layer *bad = NULL;
    CHECK_STATUS(mha_layer_from_tensors(&bad, t, &opt), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("add_zero_attn = 2");
    for (int i = 0; i < 3; i++) mha_layer_free(L[i]);
    mha_layer_free(N), mha_tensors_free(nat), mha_tensors_free(t);
    free(ipw), free(ipb), free(ow), free(ob), free(x);
}

static const test_case cases[] = {
    {"layout_native_damaged", test_layout_native_damaged},
    {"layout_hf_damaged", test_layout_hf_damaged},
    {"layout_gpt2_damaged", test_layout_gpt2_damaged},
    {"layout_megatron_damaged", test_layout_megatron_damaged},
    {"layout_torch_damaged", test_layout_torch_damaged},
    {"layout_zero_attn_option", test_layout_zero_attn_option},
};

const test_case *tests_layout_errors(size_t *count) {
    *count = sizeof cases / sizeof cases[0];
    return cases;
}
