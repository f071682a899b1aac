/* test_load_heads.c — mha_layer_load_heads: a shard of a checkpoint holds
 * exactly the full layer's blocks of its heads (bit for bit) in every
 * layout (native, hf, torch with in_proj or separate weights, gpt2,
 * megatron), shards sum to the full forward, a NaN in another head's bytes
 * does not stop a shard (it does stop the owner), the file's labels come
 * back, bad ranges are refused, and mha_layer_load_config reads the dims.
 * The files are written here, tensor by tensor, from the weights.
 * Legend: h, h_kv, d_k, d_v, D = d_model, E = h*d (torch, gpt2). */
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "naive.h"
#include "tests.h"

static char dir[64];

static const char *path_of(const char *name) {
    static char p[128];
    if (!dir[0]) {
        snprintf(dir, sizeof dir, "/tmp/mha_test_heads_XXXXXX");
        if (!mkdtemp(dir)) dir[0] = '\0';
    }
    snprintf(p, sizeof p, "%s/%s", dir[0] ? dir : ".", name);
    return p;
}

/* dst (cols, rows) = src (rows, cols) transposed. */
static float *transposed(const float *src, int rows, int cols) {
    float *t = naive_alloc_floats((size_t)rows * cols);
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) t[(size_t)c * rows + r] = src[(size_t)r * cols + c];
    return t;
}

static void put(mha_tensors *t, const char *name, const float *p, int d0, int d1) {
    const int shape[2] = {d0, d1};
    CHECK_OK(mha_tensors_add_f32(t, name, p, d1 ? 2 : 1, shape));
}

static void put_int(mha_tensors *t, const char *key, int v) {
    char b[16];
    snprintf(b, sizeof b, "%d", v);
    CHECK_OK(mha_tensors_set_meta(t, key, b));
}

/* Writes w in `layout` at path. torch and gpt2 need h = h_kv, d_k = d_v,
 * D = h*d_k; megatron d_k = d_v. */
static void write_layout(const char *path, const naive_weights *w, mha_layout layout) {
    const mha_config *c = &w->cfg;
    const int h = c->n_heads, hkv = c->n_kv_heads, dk = c->d_k, dv = c->d_v, D = c->d_model;
    const int qk = h * dk, kk = hkv * dk, vv = hkv * dv, ov = h * dv;
    mha_tensors *t;
    CHECK_OK(mha_tensors_create(&t));
    put_int(t, "n_heads", h), put_int(t, "n_kv_heads", hkv);
    float *tq = transposed(w->w_q, D, qk), *tk = transposed(w->w_k, c->d_kv_in, kk),
          *tv = transposed(w->w_v, c->d_kv_in, vv), *to = transposed(w->w_o, ov, D);
    float *fused = naive_alloc_floats((size_t)(qk + kk + vv) * D), *fb = naive_alloc_floats((size_t)(qk + kk + vv));
    switch (layout) {
    case MHA_LAYOUT_HF:
        put(t, "q_proj.weight", tq, qk, D), put(t, "k_proj.weight", tk, kk, c->d_kv_in);
        put(t, "v_proj.weight", tv, vv, c->d_kv_in), put(t, "o_proj.weight", to, D, ov);
        put(t, "q_proj.bias", w->b_q, qk, 0), put(t, "k_proj.bias", w->b_k, kk, 0);
        put(t, "v_proj.bias", w->b_v, vv, 0), put(t, "o_proj.bias", w->b_o, D, 0);
        break;
    case MHA_LAYOUT_TORCH: /* in_proj_weight (3E, E) = [W_q^T; W_k^T; W_v^T] */
        memcpy(fused, tq, sizeof(float) * qk * D), memcpy(fused + (size_t)qk * D, tk, sizeof(float) * kk * D);
        memcpy(fused + (size_t)(qk + kk) * D, tv, sizeof(float) * vv * D);
        memcpy(fb, w->b_q, sizeof(float) * qk), memcpy(fb + qk, w->b_k, sizeof(float) * kk);
        memcpy(fb + qk + kk, w->b_v, sizeof(float) * vv);
        put(t, "in_proj_weight", fused, 3 * D, D), put(t, "in_proj_bias", fb, 3 * D, 0);
        put(t, "out_proj.weight", to, D, D), put(t, "out_proj.bias", w->b_o, D, 0);
        break;
    case MHA_LAYOUT_GPT2: /* c_attn (D, 3E) = [W_q | W_k | W_v] */
        for (int r = 0; r < D; r++) {
            memcpy(fused + (size_t)r * 3 * D, w->w_q + (size_t)r * D, sizeof(float) * D);
            memcpy(fused + (size_t)r * 3 * D + D, w->w_k + (size_t)r * D, sizeof(float) * D);
            memcpy(fused + (size_t)r * 3 * D + 2 * D, w->w_v + (size_t)r * D, sizeof(float) * D);
        }
        memcpy(fb, w->b_q, sizeof(float) * qk), memcpy(fb + qk, w->b_k, sizeof(float) * kk);
        memcpy(fb + qk + kk, w->b_v, sizeof(float) * vv);
        put(t, "c_attn.weight", fused, D, 3 * D), put(t, "c_attn.bias", fb, 3 * D, 0);
        put(t, "c_proj.weight", w->w_o, ov, D), put(t, "c_proj.bias", w->b_o, D, 0);
        put(t, "mlp.c_proj.weight", to, D, ov); /* a GPT-2 block's MLP: not the attention's c_proj */
        break;
    case MHA_LAYOUT_MEGATRON: { /* rows per kv group g: [q heads of g, k_g, v_g] */
        const int rep = h / hkv;
        for (int g = 0, row = 0; g < hkv; g++) {
            for (int part = 0; part < 3; part++) {
                const float *src = part == 0 ? tq + (size_t)g * rep * dk * D : (part == 1 ? tk : tv) + (size_t)g * dk * D;
                const float *bsrc = part == 0 ? w->b_q + g * rep * dk : (part == 1 ? w->b_k : w->b_v) + g * dk;
                const int n = part == 0 ? rep * dk : dk;
                memcpy(fused + (size_t)row * D, src, sizeof(float) * n * D), memcpy(fb + row, bsrc, sizeof(float) * n);
                row += n;
            }
        }
        put(t, "query_key_value.weight", fused, qk + kk + vv, D), put(t, "query_key_value.bias", fb, qk + kk + vv, 0);
        put(t, "dense.weight", to, D, ov), put(t, "dense.bias", w->b_o, D, 0);
        break;
    }
    default: { /* native, with labels */
        mha_layer *L = naive_make_layer(w);
        mha_tensors_free(t);
        t = NULL;
        if (L) CHECK_OK(mha_layer_save(L, path));
        mha_layer_free(L);
    }
    }
    if (t) CHECK_OK(mha_safetensors_write(path, t));
    mha_tensors_free(t);
    free(tq), free(tk), free(tv), free(to), free(fused), free(fb);
}

/* Every shard of P ranks (loaded with opt): its weights are the full
 * layer's blocks of its heads, bit for bit (a gated layer's W_G and b_G
 * too); the shards' Y without b_O sum to the full Y. */
static void check_shards_opt(const char *path, const mha_load_options *opt, const mha_layer *full, int P,
                             const char *what) {
    const mha_config *c = mha_layer_config(full);
    const int h = c->n_heads, hkv = c->n_kv_heads, dk = c->d_k, dv = c->d_v, D = c->d_model, n = h / P;
    mha_weights fw;
    mha_layer_get_weights(full, &fw);
    uint64_t seed = 77;
    const int B = 2, T = 5;
    float *x = naive_random_floats((size_t)B * T * D, &seed, -1.0f, 1.0f);
    float *y = naive_alloc_floats((size_t)B * T * D), *sum = naive_alloc_floats((size_t)B * T * D),
          *yf = naive_alloc_floats((size_t)B * T * D);
    mha_options o = mha_options_default();
    o.causal = 1;
    CHECK_OK(mha_forward(full, yf, NULL, x, NULL, B, T, T, &o));
    for (int r = 0; r < P; r++) {
        mha_head_range rg = {.first = r * n, .count = n};
        mha_layer *L = NULL;
        CHECK_OK(mha_layer_load_heads(&L, path, opt, &rg));
        if (!L) continue;
        const int g0 = rg.kv_first, g = rg.kv_count;
        CHECK_INT(mha_layer_config(L)->n_heads, n);
        CHECK_INT(mha_layer_config(L)->n_kv_heads, g);
        CHECK_INT(g, hkv >= P ? hkv / P : 1);
        mha_weights sw;
        mha_layer_get_weights(L, &sw);
        int same = 1;
        for (int row = 0; row < D; row++)
            same &= !memcmp(sw.w_q + (size_t)row * n * dk, fw.w_q + (size_t)row * h * dk + (size_t)r * n * dk, sizeof(float) * n * dk);
        for (int row = 0; row < c->d_kv_in; row++) {
            same &= !memcmp(sw.w_k + (size_t)row * g * dk, fw.w_k + (size_t)row * hkv * dk + (size_t)g0 * dk, sizeof(float) * g * dk);
            same &= !memcmp(sw.w_v + (size_t)row * g * dv, fw.w_v + (size_t)row * hkv * dv + (size_t)g0 * dv, sizeof(float) * g * dv);
        }
        same &= !memcmp(sw.w_o, fw.w_o + (size_t)r * n * dv * D, sizeof(float) * n * dv * D);
        CHECK_INT(mha_layer_config(L)->bias, c->bias);
        if (c->bias && sw.b_q) {
            same &= !memcmp(sw.b_q, fw.b_q + r * n * dk, sizeof(float) * n * dk);
            same &= !memcmp(sw.b_k, fw.b_k + g0 * dk, sizeof(float) * g * dk);
            same &= !memcmp(sw.b_v, fw.b_v + g0 * dv, sizeof(float) * g * dv);
            same &= !memcmp(sw.b_o, fw.b_o, sizeof(float) * D);
        }
        CHECK_INT(mha_layer_config(L)->output_gate, c->output_gate);
        for (int row = 0; c->output_gate && sw.w_g && row < D; row++) /* W_G: the heads' column blocks, as W_Q's */
            same &= !memcmp(sw.w_g + (size_t)row * n * dv, fw.w_g + (size_t)row * h * dv + (size_t)r * n * dv, sizeof(float) * n * dv);
        if (c->output_gate && c->bias && sw.b_g) same &= !memcmp(sw.b_g, fw.b_g + r * n * dv, sizeof(float) * n * dv);
        if (!same) test_report(__FILE__, __LINE__, "%s, P=%d: shard %d differs from the full layer's blocks", what, P, r);
        CHECK_OK(mha_forward(L, y, NULL, x, NULL, B, T, T, &o));
        for (size_t i = 0; i < (size_t)B * T * D; i++) sum[i] += y[i] - (r && fw.b_o ? fw.b_o[i % D] : 0.0f);
        mha_layer_free(L);
    }
    double worst = 0.0;
    for (size_t i = 0; i < (size_t)B * T * D; i++) worst = fmax(worst, fabs((double)sum[i] - yf[i]));
    if (!(worst <= 1e-5)) test_report(__FILE__, __LINE__, "%s, P=%d: shards sum to Y within %.3g", what, P, worst);
    free(x), free(y), free(sum), free(yf);
}

static void check_shards(const char *path, const mha_layer *full, int P, const char *what) {
    check_shards_opt(path, NULL, full, P, what);
}

/* The file at p loads as w's layer, every weight and bias bit for bit,
 * and its shards for each P of Ps are blocks of it (check_shards). */
static void check_file_layer(const char *p, const naive_weights *w, const int *Ps, int nP, const char *what) {
    const mha_config *c = &w->cfg;
    mha_layer *full = NULL, *want = naive_make_layer(w);
    CHECK_OK(mha_layer_load(&full, p, NULL));
    if (full && want) {
        mha_weights a, e;
        mha_layer_get_weights(full, &a), mha_layer_get_weights(want, &e);
        const int D = c->d_model, h = c->n_heads, g = c->n_kv_heads, dk = c->d_k, dv = c->d_v;
        int same = !memcmp(a.w_q, e.w_q, sizeof(float) * D * h * dk) && !memcmp(a.w_k, e.w_k, sizeof(float) * D * g * dk) &&
                   !memcmp(a.w_v, e.w_v, sizeof(float) * D * g * dv) && !memcmp(a.w_o, e.w_o, sizeof(float) * h * dv * D);
        same &= !memcmp(a.b_q, e.b_q, sizeof(float) * h * dk) && !memcmp(a.b_k, e.b_k, sizeof(float) * g * dk) &&
                !memcmp(a.b_v, e.b_v, sizeof(float) * g * dv) && !memcmp(a.b_o, e.b_o, sizeof(float) * D);
        if (!same) test_report(__FILE__, __LINE__, "%s: the loaded layer differs from the written weights", what);
    }
    for (int i = 0; full && i < nP; i++) check_shards(p, full, Ps[i], what);
    mha_layer_free(full), mha_layer_free(want);
}

static void one_layout(mha_layout layout, const char *file, mha_config c, const int *Ps, int nP) {
    uint64_t seed = 1601 + (uint64_t)layout;
    naive_weights w;
    naive_weights_random(&w, &c, &seed, 0.6f);
    const char *path = path_of(file);
    write_layout(path, &w, layout);
    char p[128];
    snprintf(p, sizeof p, "%s", path);
    mha_layer *full = NULL;
    CHECK_OK(mha_layer_load(&full, p, NULL));
    mha_config got;
    CHECK_OK(mha_layer_load_config(&got, p, NULL));
    CHECK_INT(got.n_heads, c.n_heads);
    CHECK_INT(got.n_kv_heads, c.n_kv_heads);
    CHECK_INT(got.d_k, c.d_k);
    CHECK_INT(got.d_v, c.d_v);
    CHECK_INT(got.d_model, c.d_model);
    for (int i = 0; full && i < nP; i++) check_shards(p, full, Ps[i], mha_layout_name(layout));
    mha_layer_free(full);
    naive_weights_free(&w);
    unlink(p);
}

/* write_layout's megatron tensors under GPT-BigCode's names (nn.Linear
 * c_attn / c_proj), beside an MLP c_proj. */
static void write_bigcode(const char *path, const naive_weights *w) {
    write_layout(path, w, MHA_LAYOUT_MEGATRON);
    mha_tensors *t = NULL, *b;
    CHECK_OK(mha_safetensors_read(&t, path, 0));
    CHECK_OK(mha_tensors_create(&b));
    static const char *const from[4] = {"query_key_value.weight", "query_key_value.bias", "dense.weight", "dense.bias"};
    static const char *const to[4] = {"attn.c_attn.weight", "attn.c_attn.bias", "attn.c_proj.weight", "attn.c_proj.bias"};
    for (int i = 0; t && i < 4; i++) CHECK_OK(mha_tensors_add(b, to[i], mha_tensors_get(t, from[i])));
    if (t) CHECK_OK(mha_tensors_add(b, "mlp.c_proj.weight", mha_tensors_get(t, "dense.weight")));
    put_int(b, "n_heads", w->cfg.n_heads);
    CHECK_OK(mha_safetensors_write(path, b));
    mha_tensors_free(t), mha_tensors_free(b);
}

static void load_heads_every_layout(void) {
    const int gqa_P[] = {1, 2, 4, 8}, mha_P[] = {1, 2, 4};
    mha_config g = naive_resolve(naive_config(10, 8, 4, 3, 2, 1)); /* GQA, d_k != d_v */
    one_layout(MHA_LAYOUT_NATIVE, "native.safetensors", g, gqa_P, 4);
    one_layout(MHA_LAYOUT_HF, "hf.safetensors", g, gqa_P, 4);
    mha_config m = naive_resolve(naive_config(8, 4, 2, 2, 2, 1)); /* megatron: d_k = d_v */
    one_layout(MHA_LAYOUT_MEGATRON, "megatron.safetensors", m, mha_P, 3);
    mha_config t = naive_resolve(naive_config(8, 4, 4, 2, 2, 1)); /* torch, gpt2: E = D */
    one_layout(MHA_LAYOUT_TORCH, "torch.safetensors", t, mha_P, 3);
    one_layout(MHA_LAYOUT_GPT2, "gpt2.safetensors", t, mha_P, 3);
    /* GPT-BigCode, MQA: the gpt2 names with megatron's rows */
    uint64_t seed = 1641;
    mha_config q = naive_resolve(naive_config(8, 4, 1, 2, 2, 1));
    naive_weights w;
    naive_weights_random(&w, &q, &seed, 0.6f);
    char p[128];
    snprintf(p, sizeof p, "%s", path_of("bigcode.safetensors"));
    write_bigcode(p, &w);
    check_file_layer(p, &w, mha_P, 3, "gpt-bigcode");
    naive_weights_free(&w);
}

/* Phi-3's fused qkv_proj.weight ([Q; K; V] rows) under a decoder layer's
 * path, found by --prefix naming the layer: each shard's blocks are the
 * full layer's. */
static void load_heads_hf_fused_qkv(void) {
    uint64_t seed = 1621;
    mha_config c = naive_resolve(naive_config(10, 8, 4, 3, 3, 1));
    naive_weights w;
    naive_weights_random(&w, &c, &seed, 0.6f);
    const int D = 10, nq = 24, nk = 12;
    float *tq = transposed(w.w_q, D, nq), *tk = transposed(w.w_k, D, nk), *tv = transposed(w.w_v, D, nk),
          *to = transposed(w.w_o, nq, D);
    float *qkv = naive_alloc_floats((size_t)(nq + 2 * nk) * D), *b = naive_alloc_floats((size_t)(nq + 2 * nk));
    memcpy(qkv, tq, sizeof(float) * nq * D), memcpy(qkv + (size_t)nq * D, tk, sizeof(float) * nk * D);
    memcpy(qkv + (size_t)(nq + nk) * D, tv, sizeof(float) * nk * D);
    memcpy(b, w.b_q, sizeof(float) * nq), memcpy(b + nq, w.b_k, sizeof(float) * nk), memcpy(b + nq + nk, w.b_v, sizeof(float) * nk);
    mha_tensors *t;
    CHECK_OK(mha_tensors_create(&t));
    put(t, "model.layers.2.self_attn.qkv_proj.weight", qkv, nq + 2 * nk, D), put(t, "model.layers.2.self_attn.qkv_proj.bias", b, nq + 2 * nk, 0);
    put(t, "model.layers.2.self_attn.o_proj.weight", to, D, nq), put(t, "model.layers.2.self_attn.o_proj.bias", w.b_o, D, 0);
    put_int(t, "n_heads", 8);
    char p[128];
    snprintf(p, sizeof p, "%s", path_of("phi3.safetensors"));
    CHECK_OK(mha_safetensors_write(p, t));
    mha_tensors_free(t);
    mha_layer *full = NULL; /* found by the decoder layer's path */
    mha_load_options o = {.prefix = "model.layers.2"};
    CHECK_OK(mha_layer_load(&full, p, &o));
    mha_layer_free(full);
    const int Ps[3] = {1, 2, 4};
    check_file_layer(p, &w, Ps, 3, "hf fused qkv");
    naive_weights_free(&w);
    free(tq), free(tk), free(tv), free(to), free(qkv), free(b);
    unlink(p);
}

/* BERT's names (attention.self.query ... attention.output.dense) beside
 * the FFN's output.dense: shards of the attention named by its layer. */
static void load_heads_bert_names(void) {
    uint64_t seed = 1631;
    mha_config c = naive_resolve(naive_config(8, 4, 4, 2, 2, 1));
    naive_weights w;
    naive_weights_random(&w, &c, &seed, 0.6f);
    float *tw[4] = {transposed(w.w_q, 8, 8), transposed(w.w_k, 8, 8), transposed(w.w_v, 8, 8), transposed(w.w_o, 8, 8)};
    const float *tb[4] = {w.b_q, w.b_k, w.b_v, w.b_o};
    static const char *const names[4] = {"self.query", "self.key", "self.value", "output.dense"};
    mha_tensors *t;
    CHECK_OK(mha_tensors_create(&t));
    char name[96];
    for (int m = 0; m < 4; m++) {
        snprintf(name, sizeof name, "encoder.layer.0.attention.%s.weight", names[m]), put(t, name, tw[m], 8, 8);
        snprintf(name, sizeof name, "encoder.layer.0.attention.%s.bias", names[m]), put(t, name, tb[m], 8, 0);
    }
    put(t, "encoder.layer.0.output.dense.weight", tw[0], 8, 8), put_int(t, "n_heads", 4);
    char p[128];
    snprintf(p, sizeof p, "%s", path_of("bert.safetensors"));
    CHECK_OK(mha_safetensors_write(p, t));
    mha_tensors_free(t);
    const int Ps[2] = {2, 4};
    check_file_layer(p, &w, Ps, 2, "bert names");
    naive_weights_free(&w);
    for (int m = 0; m < 4; m++) free(tw[m]);
    unlink(p);
}

/* Head 5's W_Q column block and W_O row block hold NaN: heads 0..3 load,
 * heads 4..7 are refused naming the tensor, the whole layer too. */
static void load_heads_reads_only_its_heads(void) {
    uint64_t seed = 1611;
    mha_config c = naive_resolve(naive_config(10, 8, 4, 3, 2, 1));
    naive_weights w;
    naive_weights_random(&w, &c, &seed, 0.6f);
    for (int row = 0; row < 10; row++) w.w_q[(size_t)row * 24 + 5 * 3 + 1] = NAN;
    w.w_o[(size_t)(5 * 2) * 10 + 3] = NAN;
    mha_tensors *t;
    CHECK_OK(mha_tensors_create(&t));
    put(t, "w_q", w.w_q, 10, 24), put(t, "w_k", w.w_k, 10, 12), put(t, "w_v", w.w_v, 10, 8), put(t, "w_o", w.w_o, 16, 10);
    put(t, "b_o", w.b_o, 10, 0);
    put_int(t, "n_heads", 8), put_int(t, "n_kv_heads", 4);
    char p[128];
    snprintf(p, sizeof p, "%s", path_of("nan.safetensors"));
    CHECK_OK(mha_safetensors_write(p, t));
    mha_tensors_free(t);
    mha_layer *L = NULL;
    mha_head_range lo = {.first = 0, .count = 4}, hi = {.first = 4, .count = 4};
    CHECK_OK(mha_layer_load_heads(&L, p, NULL, &lo));
    CHECK(L != NULL);
    mha_layer_free(L);
    CHECK_STATUS(mha_layer_load_heads(&L, p, NULL, &hi), MHA_E_NONFINITE);
    CHECK_ERROR_MENTIONS("w_q");
    CHECK_ERROR_MENTIONS("shard of query heads 4..7 and kv heads 2..3 of the file"); /* whose index it is */
    CHECK(L == NULL);
    CHECK_STATUS(mha_layer_load(&L, p, NULL), MHA_E_NONFINITE);
    naive_weights_free(&w);
    unlink(p);
}

/* What the shard's own head count would change: ALiBi's default slopes
 * (metadata alibi = 1, no tensor) are those of its global heads in the
 * whole layer, and the add_zero_attn load option reaches the shard. */
static void load_heads_default_slopes_and_zero_attn(void) {
    uint64_t seed = 1631;
    mha_config c = naive_resolve(naive_config(10, 8, 4, 3, 2, 1));
    naive_weights w;
    naive_weights_random(&w, &c, &seed, 0.6f);
    char p[2][128];
    for (int alibi = 0; alibi < 2; alibi++) {
        mha_tensors *t;
        CHECK_OK(mha_tensors_create(&t));
        put(t, "w_q", w.w_q, 10, 24), put(t, "w_k", w.w_k, 10, 12), put(t, "w_v", w.w_v, 10, 8);
        put(t, "w_o", w.w_o, 16, 10), put_int(t, "n_heads", 8), put_int(t, "n_kv_heads", 4);
        if (alibi) put_int(t, "alibi", 1);
        snprintf(p[alibi], sizeof p[alibi], "%s", path_of(alibi ? "alibi.safetensors" : "plain.safetensors"));
        CHECK_OK(mha_safetensors_write(p[alibi], t));
        mha_tensors_free(t);
    }
    mha_layer *L = NULL, *S = NULL;
    mha_head_range rg = {.first = 4, .count = 2};
    CHECK_OK(mha_layer_load(&L, p[1], NULL));
    CHECK_OK(mha_layer_load_heads(&S, p[1], NULL, &rg));
    mha_weights wf, ws;
    mha_layer_get_weights(L, &wf), mha_layer_get_weights(S, &ws);
    CHECK_INT(mha_layer_config(S)->alibi, 1);
    for (int i = 0; i < 2; i++) CHECK(ws.alibi_slopes[i] == wf.alibi_slopes[4 + i]);
    mha_layer_free(S);
    mha_load_options zero = {.add_zero_attn = 1};
    CHECK_OK(mha_layer_load_heads(&S, p[0], &zero, &rg));
    CHECK_INT(mha_layer_config(S)->add_zero_attn, 1);
    mha_layer_free(L), mha_layer_free(S);
    naive_weights_free(&w);
    unlink(p[0]), unlink(p[1]);
}

/* An hf file's (h*d_k) q_norm.weight and (h_kv*d_k) k_norm.weight are one
 * RMSNorm over the whole width (OLMo 2): the shard of every head keeps it
 * whole and gives the full layer's Y (it read them as per-head weights). */
static void load_heads_hf_whole_norm(void) {
    uint64_t seed = 1637;
    mha_config c = naive_resolve(naive_config(8, 4, 4, 2, 2, 0));
    naive_weights w;
    naive_weights_random(&w, &c, &seed, 0.6f);
    float *tw[4] = {transposed(w.w_q, 8, 8), transposed(w.w_k, 8, 8), transposed(w.w_v, 8, 8), transposed(w.w_o, 8, 8)};
    float *norm = naive_random_floats(16, &seed, 0.5f, 1.5f);
    static const char *const names[4] = {"q_proj", "k_proj", "v_proj", "o_proj"};
    mha_tensors *t;
    CHECK_OK(mha_tensors_create(&t));
    char name[64];
    for (int i = 0; i < 4; i++) snprintf(name, sizeof name, "self_attn.%s.weight", names[i]), put(t, name, tw[i], 8, 8);
    put(t, "self_attn.q_norm.weight", norm, 8, 0), put(t, "self_attn.k_norm.weight", norm + 8, 8, 0);
    put_int(t, "n_heads", 4);
    char p[128];
    snprintf(p, sizeof p, "%s", path_of("olmo2.safetensors"));
    CHECK_OK(mha_safetensors_write(p, t));
    mha_tensors_free(t);
    mha_layer *full = NULL, *S = NULL;
    mha_head_range rg = {.first = 0, .count = 4};
    CHECK_OK(mha_layer_load(&full, p, NULL));
    CHECK_OK(mha_layer_load_heads(&S, p, NULL, &rg));
    if (full && S) {
        CHECK_INT(mha_layer_config(full)->qk_norm_whole, 1);
        CHECK_INT(mha_layer_config(S)->qk_norm_whole, 1);
        float *x = naive_random_floats(2 * 5 * 8, &seed, -1.0f, 1.0f), ya[80], yb[80];
        mha_options o = mha_options_default();
        CHECK_OK(mha_forward(full, ya, NULL, x, NULL, 2, 5, 5, &o));
        CHECK_OK(mha_forward(S, yb, NULL, x, NULL, 2, 5, 5, &o));
        double worst = 0.0;
        for (int i = 0; i < 80; i++) worst = fmax(worst, fabs((double)ya[i] - yb[i]));
        if (!(worst <= 1e-6)) test_report(__FILE__, __LINE__, "hf whole-width norm: the shard of every head is %.3g off", worst);
        free(x);
    }
    mha_layer_free(full), mha_layer_free(S);
    for (int i = 0; i < 4; i++) free(tw[i]);
    free(norm), naive_weights_free(&w);
    unlink(p);
}

/* A whole-width QK-norm (OLMo 2) spans every head: a shard of some heads
 * normalized over those alone and loaded, its Y then 0.27 off the full
 * layer's share (max |Y| 1.2, h = 4 in two shards); now refused, and the
 * shard of every head still loads. */
static void load_heads_whole_norm_split_refused(void) {
    uint64_t seed = 1901;
    mha_config c = mha_config_default(8, 4);
    c.n_kv_heads = 2, c.bias = 0, c.qk_norm = MHA_QK_NORM_RMS, c.qk_norm_per_head = 1, c.qk_norm_whole = 1;
    float *m = naive_random_floats(8 * 8 * 2 + 8 * 4 * 2, &seed, -0.6f, 0.6f); /* W_Q, W_O (8, 8); W_K, W_V (8, 4) */
    float *q_norm = naive_random_floats(8, &seed, 0.5f, 1.5f), *k_norm = naive_random_floats(4, &seed, 0.5f, 1.5f);
    mha_weights w = {.w_q = m, .w_o = m + 64, .w_k = m + 128, .w_v = m + 160, .q_norm = q_norm, .k_norm = k_norm};
    mha_layer *L = NULL, *S = NULL;
    CHECK_OK(mha_layer_create(&L, &c, &w));
    const char *p = path_of("whole.safetensors");
    if (L) CHECK_OK(mha_layer_save(L, p));
    mha_head_range half = {.first = 2, .count = 2}, all = {.first = 0, .count = 4};
    CHECK_STATUS(mha_layer_load_heads(&S, p, NULL, &half), MHA_E_UNSUPPORTED);
    CHECK_ERROR_MENTIONS("qk_norm_whole");
    CHECK(S == NULL);
    CHECK_OK(mha_layer_load_heads(&S, p, NULL, &all));
    mha_layer_free(S), mha_layer_free(L);
    free(m), free(q_norm), free(k_norm);
    unlink(p);
}

/* The file's labels of the shard's heads; ranges across kv groups refused. */
static void load_heads_labels_and_ranges(void) {
    uint64_t seed = 1621;
    mha_config c = naive_resolve(naive_config(10, 8, 4, 3, 2, 1));
    naive_weights w;
    naive_weights_random(&w, &c, &seed, 0.6f);
    mha_layer *L = naive_make_layer(&w);
    const int perm[8] = {2, 3, 0, 1, 6, 7, 4, 5}; /* kv groups swapped, whole */
    if (L) CHECK_OK(mha_layer_permute_heads(L, perm));
    char p[128];
    snprintf(p, sizeof p, "%s", path_of("labels.safetensors"));
    if (L) CHECK_OK(mha_layer_save(L, p));
    int want_q[8], want_k[4];
    if (L) {
        CHECK_OK(mha_layer_labels(L, MHA_BLOCK_Q, want_q));
        CHECK_OK(mha_layer_labels(L, MHA_BLOCK_K, want_k));
    }
    mha_layer_free(L);
    int lab[2 * 4 + 2 * 2];
    mha_head_range rg = {.first = 4, .count = 4, .labels = lab};
    mha_layer *S = NULL;
    CHECK_OK(mha_layer_load_heads(&S, p, NULL, &rg));
    mha_layer_free(S);
    CHECK_INT(rg.kv_first, 2);
    CHECK_INT(rg.kv_count, 2);
    for (int i = 0; i < 4; i++) {
        CHECK_INT(lab[i], want_q[4 + i]);
        CHECK_INT(lab[4 + i], want_q[4 + i]); /* O labels = Q labels in a consistent file */
    }
    for (int i = 0; i < 2; i++) {
        CHECK_INT(lab[8 + i], want_k[2 + i]);
        CHECK_INT(lab[10 + i], want_k[2 + i]);
    }
    mha_head_range inside = {.first = 3, .count = 1}, across = {.first = 1, .count = 2}, out = {.first = 6, .count = 4};
    CHECK_OK(mha_layer_load_heads(&S, p, NULL, &inside)); /* one head of group 1 */
    CHECK_INT(inside.kv_first, 1);
    CHECK_INT(inside.kv_count, 1);
    mha_layer_free(S);
    CHECK_STATUS(mha_layer_load_heads(&S, p, NULL, &across), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("whole kv groups");
    CHECK_STATUS(mha_layer_load_heads(&S, p, NULL, &out), MHA_E_ARG);
    mha_head_range wraps = {.first = INT_MAX, .count = 2}; /* first + count overflows int */
    CHECK_STATUS(mha_layer_load_heads(&S, p, NULL, &wraps), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("first=2147483647 count=2 of h=8");
    CHECK_STATUS(mha_layer_load_heads(&S, path_of("missing.safetensors"), NULL, &rg), MHA_E_IO);
    naive_weights_free(&w);
    unlink(p);
    rmdir(dir);
}

/* A gated q_proj (Qwen3-Next: each head's d query rows, then its d gate
 * rows; the bias alike) beside k/v/o_proj, from w; q_bias 0 leaves the
 * q_proj's bias out (the gate's bias is then 0). */
static void write_hf_gated(const char *path, const naive_weights *w, int q_bias) {
    const mha_config *c = &w->cfg;
    const int h = c->n_heads, hkv = c->n_kv_heads, d = c->d_k, D = c->d_model;
    mha_tensors *t;
    CHECK_OK(mha_tensors_create(&t));
    put_int(t, "n_heads", h), put_int(t, "n_kv_heads", hkv);
    float *tq = transposed(w->w_q, D, h * d), *tg = transposed(w->w_g, D, h * d), *tk = transposed(w->w_k, D, hkv * d),
          *tv = transposed(w->w_v, D, hkv * d), *to = transposed(w->w_o, h * d, D);
    float *q = naive_alloc_floats((size_t)2 * h * d * D), *bq = naive_alloc_floats((size_t)2 * h * d);
    for (int r = 0; r < h; r++) {
        memcpy(q + (size_t)2 * r * d * D, tq + (size_t)r * d * D, sizeof(float) * d * D);
        memcpy(q + (size_t)(2 * r + 1) * d * D, tg + (size_t)r * d * D, sizeof(float) * d * D);
        if (c->bias) memcpy(bq + 2 * r * d, w->b_q + r * d, sizeof(float) * d), memcpy(bq + (2 * r + 1) * d, w->b_g + r * d, sizeof(float) * d);
    }
    put(t, "q_proj.weight", q, 2 * h * d, D), put(t, "k_proj.weight", tk, hkv * d, D);
    put(t, "v_proj.weight", tv, hkv * d, D), put(t, "o_proj.weight", to, D, h * d);
    if (c->bias && q_bias) put(t, "q_proj.bias", bq, 2 * h * d, 0);
    if (c->bias) put(t, "k_proj.bias", w->b_k, hkv * d, 0), put(t, "v_proj.bias", w->b_v, hkv * d, 0), put(t, "o_proj.bias", w->b_o, D, 0);
    CHECK_OK(mha_safetensors_write(path, t));
    mha_tensors_free(t);
    free(tq), free(tg), free(tk), free(tv), free(to), free(q), free(bq);
}

/* Gated attention (config.output_gate) by heads: a native file (w_g, b_g,
 * metadata output_gate; also with its heads permuted) and an hf q_proj
 * holding each head's gate (mha_load_options.output_gate), MHA and GQA,
 * with and without biases: every shard holds W_G's and b_G's blocks of its
 * heads and the shards' Y sum to the whole layer's (before, both were
 * refused). A gated fused qkv and the gate flag with another layout stay
 * refused, as mha_layer_load refuses them. */
static void load_heads_gated(void) {
    static const struct {
        int h, hkv, dk, dv, bias, permute;
    } cases[] = {{4, 4, 3, 3, 1, 0}, {8, 2, 3, 3, 0, 0}, {8, 4, 3, 2, 1, 0}, {8, 4, 3, 3, 1, 1}};
    const int Ps[] = {1, 2, 4};
    const mha_load_options gate_opt = {.layout = MHA_LAYOUT_HF, .output_gate = 1};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        uint64_t seed = 1811 + k;
        mha_config c = naive_config(10, cases[k].h, cases[k].hkv, cases[k].dk, cases[k].dv, cases[k].bias);
        c.output_gate = 1;
        c = naive_resolve(c);
        naive_weights w;
        naive_weights_random(&w, &c, &seed, 0.6f);
        char p[128], what[64];
        // --- native: the file's w_g, b_g and metadata (in the file's head order)
        mha_layer *L = naive_make_layer(&w), *full = NULL;
        const int perm[8] = {2, 3, 0, 1, 6, 7, 4, 5}; /* whole kv groups swapped */
        if (L && cases[k].permute) CHECK_OK(mha_layer_permute_heads(L, perm));
        snprintf(p, sizeof p, "%s", path_of("gated.safetensors"));
        if (L) CHECK_OK(mha_layer_save(L, p));
        mha_layer_free(L);
        mha_config got;
        CHECK_OK(mha_layer_load_config(&got, p, NULL));
        CHECK_INT(got.output_gate, 1);
        CHECK_OK(mha_layer_load(&full, p, NULL));
        snprintf(what, sizeof what, "gated native h=%d h_kv=%d bias=%d", c.n_heads, c.n_kv_heads, c.bias);
        for (int i = 0; full && i < 3; i++) check_shards(p, full, Ps[i], what);
        mha_layer_free(full), full = NULL;
        unlink(p);
        // --- hf: the gate's rows inside q_proj (d_k = d_v only); q_proj's bias left out once
        for (int q_bias = 1; c.d_k == c.d_v && q_bias >= (c.bias ? 0 : 1); q_bias--) {
            snprintf(p, sizeof p, "%s", path_of("gated_hf.safetensors"));
            write_hf_gated(p, &w, q_bias);
            CHECK_OK(mha_layer_load_config(&got, p, &gate_opt));
            CHECK_INT(got.output_gate, 1);
            CHECK_INT(got.d_k, c.d_k);
            CHECK_INT(got.n_kv_heads, c.n_kv_heads);
            CHECK_OK(mha_layer_load(&full, p, &gate_opt));
            mha_weights fw;
            if (full) mha_layer_get_weights(full, &fw);
            if (full && q_bias) /* the whole layer is w's: the shards are compared with it */
                CHECK(!memcmp(fw.w_g, w.w_g, sizeof(float) * c.d_model * c.n_heads * c.d_v) &&
                      !memcmp(fw.w_q, w.w_q, sizeof(float) * c.d_model * c.n_heads * c.d_k));
            snprintf(what, sizeof what, "gated hf h=%d h_kv=%d bias=%d q_bias=%d", c.n_heads, c.n_kv_heads, c.bias, q_bias);
            for (int i = 0; full && i < 3; i++) check_shards_opt(p, &gate_opt, full, Ps[i], what);
            mha_layer_free(full), full = NULL;
            unlink(p);
        }
        naive_weights_free(&w);
    }
    // --- what stays refused
    uint64_t seed = 1821;
    mha_config c = naive_resolve(naive_config(8, 4, 4, 2, 2, 1));
    naive_weights w;
    naive_weights_random(&w, &c, &seed, 0.6f);
    char p[128];
    snprintf(p, sizeof p, "%s", path_of("gated_refused.safetensors"));
    mha_tensors *t;
    CHECK_OK(mha_tensors_create(&t));
    float *fused = naive_random_floats((size_t)3 * 8 * 8, &seed, -1, 1), *o = naive_random_floats(64, &seed, -1, 1);
    put(t, "qkv_proj.weight", fused, 24, 8), put(t, "o_proj.weight", o, 8, 8), put_int(t, "n_heads", 4);
    CHECK_OK(mha_safetensors_write(p, t));
    mha_tensors_free(t);
    mha_head_range rg = {.first = 0, .count = 2};
    mha_layer *S = NULL;
    CHECK_STATUS(mha_layer_load_heads(&S, p, &gate_opt, &rg), MHA_E_UNSUPPORTED);
    CHECK_ERROR_MENTIONS("output_gate with a fused qkv_proj.weight");
    write_layout(p, &w, MHA_LAYOUT_NATIVE);
    mha_load_options bad = {.layout = MHA_LAYOUT_NATIVE, .output_gate = 1};
    CHECK_STATUS(mha_layer_load_heads(&S, p, &bad, &rg), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("output_gate = 1 with the native layout");
    bad.output_gate = 2;
    CHECK_STATUS(mha_layer_load_config(&c, p, &bad), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("output_gate = 2");
    CHECK(S == NULL);
    free(fused), free(o), naive_weights_free(&w);
    unlink(p);
}

/* The bf16 and int8 native files (mha convert --to-dtype) of layer c load
 * by heads as they load whole: each shard keeps the dtype, its weights are
 * the full layer's blocks bit for bit (check_shards), for P = 2 and P = P2
 * ranks (h divisible by both); mha_layer_load_config reads the file too
 * (mha-mpi reads it before the shards). */
static void compact_files_by_heads(mha_config c, uint64_t seed, int P2, const char *what) {
    const mha_weight_dtype types[2] = {MHA_W_BF16, MHA_W_I8};
    const int h = c.n_heads;
    for (int i = 0; i < 2; i++) {
        naive_weights w;
        naive_weights_random(&w, &c, &seed, 0.6f);
        mha_layer *L = naive_make_layer(&w), *full = NULL;
        char name[64], label[64];
        snprintf(name, sizeof name, "%s_%s.safetensors", what, mha_weight_dtype_name(types[i]));
        snprintf(label, sizeof label, "%s %s", what, mha_weight_dtype_name(types[i]));
        const char *path = path_of(name);
        CHECK_OK(mha_layer_convert_weights(L, types[i]));
        CHECK_OK(mha_layer_save(L, path));
        CHECK_OK(mha_layer_load(&full, path, NULL));
        mha_config got;
        CHECK_OK(mha_layer_load_config(&got, path, NULL));
        CHECK_INT(got.output_gate, c.output_gate);
        CHECK_INT(got.d_v, c.d_v);
        for (int k = 0; full && k < 2; k++) {
            const int P = k ? P2 : 2;
            check_shards(path, full, P, label);
            mha_head_range rg = {.first = h - h / P, .count = h / P};
            mha_layer *S = NULL;
            CHECK_OK(mha_layer_load_heads(&S, path, NULL, &rg));
            CHECK_INT(mha_layer_weights_dtype(S), types[i]);
            mha_layer_free(S);
        }
        mha_layer_free(full), mha_layer_free(L), naive_weights_free(&w);
        unlink(path);
    }
}

/* int8: the columns' scales, and W_O's per-head groups, d_v = 40 being two
 * of them; P = 4 puts heads of one kv group in different shards. */
static void load_heads_compact_weights(void) {
    compact_files_by_heads(naive_resolve(naive_config(48, 4, 2, 24, 40, 1)), 1777, 4, "plain");
}

/* A gated layer's: w_g is stored like w_q (int8: its codes and a w_g_scale
 * of one scale per column and group of 32 inputs), so a shard takes its
 * heads' columns of both. d_model 50 (groups of 32 + 18 rows), d_v 33, GQA
 * h/h_kv = 3; shards of a kv group and of single heads. (Before: both
 * mha_layer_load_heads and mha_layer_load_config read w_g as a float
 * tensor and refused the file, 'w_g' is int8 / float32.) */
static void load_heads_compact_gated(void) {
    mha_config c = naive_config(50, 6, 2, 5, 33, 1);
    c.output_gate = 1;
    compact_files_by_heads(naive_resolve(c), 1779, 6, "gated");
}

/* CodeGen's qkv_proj (3E, E): 4 row blocks [q; v; k] of h/4 heads each,
 * out_proj (E, E), no biases; the layout is named, never detected (OpenELM
 * shares the names). Each shard's blocks are the whole layer's, over 1, 2,
 * 4 and 8 ranks (a shard inside one block, a whole block, blocks across);
 * h not a multiple of 4 and a bias are refused by name. */
static void load_heads_codegen(void) {
    enum { D = 16, H = 8, DH = 2, MP = 4 };
    mha_config c = naive_resolve(naive_config(D, H, H, DH, DH, 0));
    naive_weights w;
    uint64_t seed = 1661;
    naive_weights_random(&w, &c, &seed, 0.6f);
    float *tq = transposed(w.w_q, D, D), *tk = transposed(w.w_k, D, D), *tv = transposed(w.w_v, D, D);
    float *to = transposed(w.w_o, D, D), *qkv = naive_alloc_floats((size_t)3 * D * D);
    const int part = D / MP; /* rows of one block's q (v, k) */
    for (int b = 0; b < MP; b++) {
        memcpy(qkv + (size_t)(3 * b) * part * D, tq + (size_t)b * part * D, sizeof(float) * part * D);
        memcpy(qkv + (size_t)(3 * b + 1) * part * D, tv + (size_t)b * part * D, sizeof(float) * part * D);
        memcpy(qkv + (size_t)(3 * b + 2) * part * D, tk + (size_t)b * part * D, sizeof(float) * part * D);
    }
    mha_tensors *t = NULL;
    CHECK_OK(mha_tensors_create(&t));
    char p[128];
    snprintf(p, sizeof p, "%s", path_of("codegen.safetensors"));
    if (t) {
        put_int(t, "n_heads", H);
        put(t, "attn.qkv_proj.weight", qkv, 3 * D, D), put(t, "attn.out_proj.weight", to, D, D);
        CHECK_OK(mha_safetensors_write(p, t));
    }
    const mha_load_options opt = {.layout = MHA_LAYOUT_CODEGEN};
    mha_layer *full = NULL, *R = NULL;
    CHECK_OK(mha_layer_load(&full, p, &opt));
    if (full) {
        mha_weights a;
        mha_layer_get_weights(full, &a);
        CHECK(!memcmp(a.w_q, w.w_q, sizeof(float) * D * D) && !memcmp(a.w_k, w.w_k, sizeof(float) * D * D) &&
              !memcmp(a.w_v, w.w_v, sizeof(float) * D * D) && !memcmp(a.w_o, w.w_o, sizeof(float) * D * D));
    }
    const int Ps[] = {1, 2, 4, 8};
    for (int i = 0; full && i < 4; i++) check_shards_opt(p, &opt, full, Ps[i], "codegen");
    mha_head_range range = {.first = 0, .count = 2};
    if (t) {
        put(t, "attn.qkv_proj.bias", qkv, 3 * D, 0);
        CHECK_OK(mha_safetensors_write(p, t));
        CHECK_STATUS(mha_layer_load_heads(&R, p, &opt, &range), MHA_E_FORMAT);
        CHECK_ERROR_MENTIONS("tensor 'qkv_proj.bias' is present");
    }
    mha_tensors_free(t), t = NULL;
    CHECK_OK(mha_tensors_create(&t)); /* 6 heads of 2 on d_model 12: no 4 blocks of whole heads */
    if (t) {
        put(t, "attn.qkv_proj.weight", qkv, 36, 12), put(t, "attn.out_proj.weight", to, 12, 12);
        CHECK_OK(mha_safetensors_write(p, t));
        const mha_load_options six = {.layout = MHA_LAYOUT_CODEGEN, .n_heads = 6};
        CHECK_STATUS(mha_layer_load_heads(&R, p, &six, &range), MHA_E_SHAPE);
        CHECK_ERROR_MENTIONS("codegen layout: 6 heads do not split into qkv_proj's mp_num = 4 blocks");
    }
    CHECK(R == NULL);
    mha_tensors_free(t), mha_layer_free(full), naive_weights_free(&w);
    free(tq), free(tk), free(tv), free(to), free(qkv);
}

static const test_case cases[] = {
    {"load_heads_codegen", load_heads_codegen},
    {"load_heads_compact_weights", load_heads_compact_weights},
    {"load_heads_compact_gated", load_heads_compact_gated},
    {"load_heads_every_layout", load_heads_every_layout},
    {"load_heads_hf_fused_qkv", load_heads_hf_fused_qkv},
    {"load_heads_bert_names", load_heads_bert_names},
    {"load_heads_reads_only_its_heads", load_heads_reads_only_its_heads},
    {"load_heads_gated", load_heads_gated},
    {"load_heads_labels_and_ranges", load_heads_labels_and_ranges},
    {"load_heads_default_slopes_and_zero_attn", load_heads_default_slopes_and_zero_attn},
    {"load_heads_hf_whole_norm", load_heads_hf_whole_norm},
    {"load_heads_whole_norm_split_refused", load_heads_whole_norm_split_refused},
};

const test_case *tests_load_heads(size_t *count) {
    *count = sizeof cases / sizeof cases[0];
    return cases;
}
