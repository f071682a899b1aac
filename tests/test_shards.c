/* test_shards.c — Hugging Face sharded checkpoints (src/io/shards.c): a
 * model.safetensors.index.json over two shards, one layer split across
 * them, loads as the same layer as one file holding every tensor (load,
 * load_config, load_heads); hostile indexes get errors naming the
 * problem. Legend: D = d_model, h, h_kv, d = d_k = d_v. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "naive.h"
#include "test_util.h"
#include "tests.h"

enum { D = 12, H = 4, HKV = 2, DH = 3, T = 5 };

static const char *dir_path(void) {
    static char dir[64];
    if (!dir[0]) {
        snprintf(dir, sizeof dir, "/tmp/mha_test_shards_XXXXXX");
        if (!mkdtemp(dir)) snprintf(dir, sizeof dir, ".");
    }
    return dir;
}

static void file_at(char *out, size_t n, const char *name) { snprintf(out, n, "%s/%s", dir_path(), name); }

static void write_text(const char *name, const char *text) {
    char p[160];
    file_at(p, sizeof p, name);
    FILE *f = fopen(p, "w");
    if (!f) {
        test_report(__FILE__, __LINE__, "cannot write %s", p);
        return;
    }
    fputs(text, f);
    fclose(f);
}

/* Layer l's q/k/v/o_proj (out, in) under model.layers.l.self_attn. plus
 * an MLP tensor, deterministic from l. */
static void layer_tensors(mha_tensors *t, int l, uint64_t seed) {
    static const char *const proj[4] = {"q_proj", "k_proj", "v_proj", "o_proj"};
    const int rows[4] = {H * DH, HKV * DH, HKV * DH, D}, cols[4] = {D, D, D, H * DH};
    char name[96];
    for (int m = 0; m < 4; m++) {
        float *w = naive_random_floats((size_t)rows[m] * cols[m], &seed, -0.5f, 0.5f);
        const int shape[2] = {rows[m], cols[m]};
        snprintf(name, sizeof name, "model.layers.%d.self_attn.%s.weight", l, proj[m]);
        CHECK_OK(mha_tensors_add_f32(t, name, w, 2, shape));
        free(w);
    }
    float mlp[D * 2] = {0};
    const int shape[2] = {D, 2};
    snprintf(name, sizeof name, "model.layers.%d.mlp.down_proj.weight", l);
    CHECK_OK(mha_tensors_add_f32(t, name, mlp, 2, shape));
}

/* The tensors of `all` named in names[0..n) written as shard `file`. */
static void write_shard(const mha_tensors *all, const char *file, const char *const *names, int n) {
    mha_tensors *t;
    CHECK_OK(mha_tensors_create(&t));
    for (int i = 0; i < n; i++) CHECK_OK(mha_tensors_add(t, names[i], mha_tensors_get(all, names[i])));
    CHECK_OK(mha_tensors_set_meta(t, "format", "pt"));
    char p[160];
    file_at(p, sizeof p, file);
    CHECK_OK(mha_safetensors_write(p, t));
    mha_tensors_free(t);
}

/* Layers 0 and 1 in two shards, layer 1's q/k_proj in the first and its
 * v/o_proj in the second; whole.safetensors holds everything. */
static void write_model(void) {
    mha_tensors *all;
    CHECK_OK(mha_tensors_create(&all));
    layer_tensors(all, 0, 2101), layer_tensors(all, 1, 2102);
    const int n = mha_tensors_count(all) < 16 ? mha_tensors_count(all) : 16, cut = 7; /* 5 per layer: layer 1's v_proj starts the second shard */
    const char *names[16] = {NULL};
    for (int i = 0; i < n; i++) names[i] = mha_tensors_name(all, i);
    write_shard(all, "model-00001-of-00002.safetensors", names, cut);
    write_shard(all, "model-00002-of-00002.safetensors", names + cut, n - cut);
    char p[160], index[2048] = "{\"metadata\": {\"total_size\": 1}, \"weight_map\": {";
    for (int i = 0; i < n; i++)
        snprintf(index + strlen(index), sizeof index - strlen(index), "%s\"%s\": \"model-0000%d-of-00002.safetensors\"",
                 i ? ", " : "", names[i], i < cut ? 1 : 2);
    strcat(index, "}}");
    write_text("model.safetensors.index.json", index);
    file_at(p, sizeof p, "whole.safetensors");
    CHECK_OK(mha_safetensors_write(p, all));
    mha_tensors_free(all);
}

/* Y of the layer at path (prefix) for a fixed x. */
static int forward_of(float *y, const char *name, const char *prefix) {
    char p[160];
    file_at(p, sizeof p, name);
    mha_layer *L = NULL;
    mha_load_options o = {.n_heads = H, .prefix = prefix};
    CHECK_OK(mha_layer_load(&L, p, &o));
    if (!L) return 0;
    uint64_t seed = 2103;
    float *x = naive_random_floats((size_t)T * D, &seed, -1.0f, 1.0f);
    mha_options opt = mha_options_default();
    opt.causal = 1;
    CHECK_OK(mha_forward(L, y, NULL, x, NULL, 1, T, T, &opt));
    free(x);
    mha_layer_free(L);
    return 1;
}

static void shards_layer_split_across_files(void) {
    write_model();
    static const char *const prefixes[3] = {"model.layers.1", "model.layers.0.", "model.layers.1.self_attn."};
    for (int i = 0; i < 3; i++) {
        float a[T * D], b[T * D];
        if (forward_of(a, "model.safetensors.index.json", prefixes[i]) && forward_of(b, "whole.safetensors", prefixes[i]))
            CHECK(memcmp(a, b, sizeof a) == 0);
    }
    char p[160];
    file_at(p, sizeof p, "model.safetensors.index.json");
    mha_config c;
    mha_load_options o = {.n_heads = H, .prefix = "model.layers.1"};
    CHECK_OK(mha_layer_load_config(&c, p, &o));
    CHECK_INT(c.n_kv_heads, HKV);
    CHECK_INT(c.d_k, DH);
    mha_layer *shard = NULL, *whole = NULL;
    mha_head_range r = {.first = 2, .count = 2};
    CHECK_OK(mha_layer_load_heads(&shard, p, &o, &r));
    CHECK_OK(mha_layer_load(&whole, p, &o));
    if (shard && whole) { /* heads 2, 3 read kv head 1: W_K's columns 3..5 */
        mha_weights sw, ww;
        mha_layer_get_weights(shard, &sw), mha_layer_get_weights(whole, &ww);
        int same = 1;
        for (int row = 0; row < D; row++) same &= !memcmp(sw.w_k + row * DH, ww.w_k + row * HKV * DH + DH, sizeof(float) * DH);
        CHECK(same);
    }
    mha_layer_free(shard), mha_layer_free(whole);
    mha_tensors *t = NULL; /* the reader alone: layer 1's attention (4 tensors, not its MLP), the first shard's metadata */
    CHECK_OK(mha_checkpoint_read(&t, p, "model.layers.1", 0));
    CHECK_INT(mha_tensors_count(t), 4);
    CHECK(t && mha_tensors_meta(t, "format") && strcmp(mha_tensors_meta(t, "format"), "pt") == 0);
    mha_tensors_free(t);
    CHECK_STATUS(mha_layer_load_config(&c, p, &(mha_load_options){.n_heads = H, .prefix = "model"}), MHA_E_FORMAT);
    CHECK(strstr(mha_last_error(), "model.safetensors.index.json: weight_map has 2") != NULL); /* the path once */
    CHECK(strstr(mha_last_error(), "index.json: /") == NULL);
    o.prefix = "model"; /* two layers inside */
    CHECK_STATUS(mha_layer_load(&whole, p, &o), MHA_E_FORMAT);
    CHECK_ERROR_MENTIONS("2 attention layers inside prefix 'model' ('model.layers.0.self_attn.', "
                         "'model.layers.1.self_attn.')");
    o.prefix = "model.layers.2";
    CHECK_STATUS(mha_layer_load(&whole, p, &o), MHA_E_FORMAT);
    CHECK_ERROR_MENTIONS("no attention layer inside prefix 'model.layers.2'");
    CHECK(whole == NULL);
}

/* Each bad index: the status and what the message must name. */
static void shards_hostile_indexes(void) {
    write_model(); /* the shards the indexes below point into */
    static const struct {
        const char *text, *mention;
        mha_status want;
    } bad[] = {
        {"{\"weight_map\": {\"a.q_proj.weight\": \"../model-00001-of-00002.safetensors\"}}", "beside the index", MHA_E_FORMAT},
        {"{\"weight_map\": {\"a.q_proj.weight\": 7}}", "not a string", MHA_E_FORMAT},
        {"{\"weight_map\": {\"a.q_proj.weight\": \"missing.safetensors\"}}", "missing.safetensors", MHA_E_IO},
        {"{\"weight_map\": {\"model.layers.0.self_attn.q_proj.weight\": \"model-00002-of-00002.safetensors\"}}",
         "has no tensor 'model.layers.0.self_attn.q_proj.weight'", MHA_E_FORMAT},
        {"{\"weight_map\": []}", "weight_map", MHA_E_FORMAT},
        {"{\"weight_map\": {}}", "no attention layer", MHA_E_FORMAT},
        {"{\"weight_map\": {\"a\": \"x\", \"a\": \"y\"}}", "expected a sharded checkpoint's JSON index", MHA_E_FORMAT},
        {"not json", "expected a sharded checkpoint's JSON index", MHA_E_FORMAT},
        /* OPT's layers hold two anchors each (q_proj, out_proj): still two layers */
        {"{\"weight_map\": {\"l.0.q_proj.weight\": \"a\", \"l.0.out_proj.weight\": \"a\", \"l.1.q_proj.weight\": "
         "\"a\", \"l.1.out_proj.weight\": \"a\"}}", "2 attention layers ('l.0.', 'l.1.')", MHA_E_FORMAT},
    };
    char p[160];
    file_at(p, sizeof p, "bad.index.json");
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        write_text("bad.index.json", bad[i].text);
        mha_layer *L = NULL;
        mha_load_options o = {.n_heads = H};
        CHECK_STATUS(mha_layer_load(&L, p, &o), bad[i].want);
        CHECK_ERROR_MENTIONS(bad[i].mention);
        CHECK(L == NULL);
    }
    mha_tensors *t = NULL;
    CHECK_STATUS(mha_checkpoint_read(&t, NULL, NULL, 0), MHA_E_ARG);
    file_at(p, sizeof p, "none.index.json");
    CHECK_STATUS(mha_checkpoint_read(&t, p, NULL, 0), MHA_E_IO);
    CHECK(t == NULL);
}

/* Loading one layer decodes and checks that layer's tensors only: a NaN
 * in layer 0 does not stop layer 1 (file or index), and still stops
 * layer 0 itself. */
static void shards_other_layers_not_decoded(void) {
    write_model();
    char p[160];
    file_at(p, sizeof p, "whole.safetensors");
    mha_tensors *t = NULL;
    CHECK_OK(mha_safetensors_read(&t, p, 0));
    if (!t) return;
    mha_array q = *mha_tensors_get(t, "model.layers.0.self_attn.q_proj.weight");
    q.f[4] = NAN;
    file_at(p, sizeof p, "nan.safetensors");
    CHECK_OK(mha_safetensors_write(p, t));
    mha_tensors_free(t);
    write_text("nan.safetensors.index.json",
               "{\"weight_map\": {\"model.layers.0.self_attn.q_proj.weight\": \"nan.safetensors\", "
               "\"model.layers.1.self_attn.q_proj.weight\": \"nan.safetensors\", "
               "\"model.layers.1.self_attn.k_proj.weight\": \"nan.safetensors\", "
               "\"model.layers.1.self_attn.v_proj.weight\": \"nan.safetensors\", "
               "\"model.layers.1.self_attn.o_proj.weight\": \"nan.safetensors\"}}");
    static const char *const files[2] = {"nan.safetensors", "nan.safetensors.index.json"};
    for (int i = 0; i < 2; i++) {
        file_at(p, sizeof p, files[i]);
        mha_layer *L = NULL;
        mha_load_options o = {.n_heads = H, .prefix = "model.layers.1"};
        CHECK_OK(mha_layer_load(&L, p, &o));
        mha_layer_free(L);
        L = NULL;
        o.prefix = "model.layers.0";
        CHECK_STATUS(mha_layer_load(&L, p, &o), MHA_E_NONFINITE);
        CHECK_ERROR_MENTIONS("model.layers.0.self_attn.q_proj.weight");
    }
}

/* A prefix names whole components: "model.layers.1" (final dot or not)
 * is not "model.layers.10", whose NaN is then never decoded; the torch
 * layout's lookups join prefix and name with that dot. */
static void shards_prefix_whole_components(void) {
    mha_tensors *all;
    CHECK_OK(mha_tensors_create(&all));
    layer_tensors(all, 1, 2103), layer_tensors(all, 10, 2104);
    const mha_array *q10 = mha_tensors_get(all, "model.layers.10.self_attn.q_proj.weight");
    if (q10) q10->f[0] = NAN;
    char p[160];
    file_at(p, sizeof p, "layers_1_10.safetensors");
    CHECK_OK(mha_safetensors_write(p, all));
    mha_tensors_free(all);
    static const char *const prefixes[2] = {"model.layers.1", "model.layers.1."};
    for (int i = 0; i < 2; i++) {
        mha_tensors *t = NULL;
        CHECK_OK(mha_checkpoint_read(&t, p, prefixes[i], 0));
        CHECK_INT(mha_tensors_count(t), 5); /* layer 1's attention and MLP */
        CHECK(t && !mha_tensors_get(t, "model.layers.10.self_attn.q_proj.weight"));
        mha_tensors_free(t);
        mha_layer *L = NULL;
        mha_load_options o = {.n_heads = H, .prefix = prefixes[i]};
        CHECK_OK(mha_layer_load(&L, p, &o));
        mha_layer_free(L);
    }
    write_model(); /* no NaN: the torch lookup's own message */
    file_at(p, sizeof p, "whole.safetensors");
    mha_layer *L = NULL;
    mha_load_options o = {.layout = MHA_LAYOUT_TORCH, .n_heads = H, .prefix = "model.layers.1"};
    CHECK_STATUS(mha_layer_load(&L, p, &o), MHA_E_FORMAT);
    CHECK_ERROR_MENTIONS("no tensor named 'model.layers.1.out_proj.weight'");
}

/* save_pretrained's directory: its model.safetensors, else its index;
 * a directory with neither is refused naming both. */
static void shards_directory(void) {
    write_model();
    char d[160], p[200], resolved[256];
    file_at(d, sizeof d, "saved");
    mkdir(d, 0700);
    CHECK_STATUS(mha_checkpoint_resolve(resolved, sizeof resolved, d), MHA_E_IO);
    CHECK_ERROR_MENTIONS("neither model.safetensors nor model.safetensors.index.json");
    mha_layer *L = NULL;
    mha_load_options o = {.n_heads = H, .prefix = "model.layers.1"};
    CHECK_STATUS(mha_layer_load(&L, d, &o), MHA_E_IO);
    float want[T * D], got[T * D];
    forward_of(want, "whole.safetensors", "model.layers.1");
    /* an index inside the directory, naming shards beside it */
    static const char *const shard[2] = {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"};
    for (int i = 0; i < 2; i++) {
        char from[200];
        file_at(from, sizeof from, shard[i]);
        snprintf(p, sizeof p, "%s/%s", d, shard[i]);
        CHECK(link(from, p) == 0);
    }
    file_at(p, sizeof p, "model.safetensors.index.json");
    char to[200];
    snprintf(to, sizeof to, "%s/model.safetensors.index.json", d);
    CHECK(link(p, to) == 0);
    CHECK_OK(mha_checkpoint_resolve(resolved, sizeof resolved, d));
    CHECK(strcmp(resolved, to) == 0);
    if (forward_of(got, "saved", "model.layers.1")) CHECK(memcmp(got, want, sizeof got) == 0);
    /* model.safetensors comes first */
    file_at(p, sizeof p, "whole.safetensors");
    snprintf(to, sizeof to, "%s/model.safetensors", d);
    CHECK(link(p, to) == 0);
    CHECK_OK(mha_checkpoint_resolve(resolved, sizeof resolved, d));
    CHECK(strcmp(resolved, to) == 0);
    if (forward_of(got, "saved/", "model.layers.1")) CHECK(memcmp(got, want, sizeof got) == 0);
    CHECK_STATUS(mha_checkpoint_resolve(resolved, 4, d), MHA_E_ARG);
}

/* A layer whose path is 600 bytes long (over the 511 an index once took)
 * loads from an index as from the single file, to the same Y. */
static void shards_long_layer_path(void) {
    mha_tensors *one, *all;
    CHECK_OK(mha_tensors_create(&one));
    CHECK_OK(mha_tensors_create(&all));
    layer_tensors(one, 0, 2105);
    char path[601], name[700];
    memset(path, 'a', 600), path[600] = 0;
    const size_t cap = 64 * 1024;
    char *index = malloc(cap);
    if (!index) return;
    snprintf(index, cap, "{\"weight_map\": {");
    for (int i = 0; i < mha_tensors_count(one); i++) {
        const char *old = mha_tensors_name(one, i); /* model.layers.0.<rest> */
        snprintf(name, sizeof name, "%s%s", path, old + strlen("model.layers.0"));
        CHECK_OK(mha_tensors_add(all, name, mha_tensors_get(one, old)));
        snprintf(index + strlen(index), cap - strlen(index), "%s\"%s\": \"long.safetensors\"", i ? ", " : "", name);
    }
    strcat(index, "}}");
    char p[160];
    file_at(p, sizeof p, "long.safetensors");
    CHECK_OK(mha_safetensors_write(p, all));
    write_text("long.safetensors.index.json", index);
    float a[T * D], b[T * D];
    if (forward_of(a, "long.safetensors.index.json", NULL) && forward_of(b, "long.safetensors", NULL))
        CHECK(memcmp(a, b, sizeof a) == 0);
    free(index);
    mha_tensors_free(one);
    mha_tensors_free(all);
}

static const test_case cases[] = {
    {"shards_long_layer_path", shards_long_layer_path},
    {"shards_directory", shards_directory},
    {"shards_other_layers_not_decoded", shards_other_layers_not_decoded},
    {"shards_prefix_whole_components", shards_prefix_whole_components},
    {"shards_layer_split_across_files", shards_layer_split_across_files},
    {"shards_hostile_indexes", shards_hostile_indexes},
};

const test_case *tests_shards(size_t *count) {
    *count = sizeof cases / sizeof cases[0];
    return cases;
}
