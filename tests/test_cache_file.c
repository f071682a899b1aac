/* test_cache_file.c — mha_cache_save / mha_cache_load. The oracle needs no
 * file: a cache saved, loaded and continued with more tokens gives the
 * bits of the original continued with the same tokens (every storage
 * type, GQA / MQA, RoPE, ALiBi with explicit positions, permuted heads, a
 * wrapped ring with sink tokens rolled back, ragged lengths, a
 * cross-attention memory), and saving the loaded cache writes the same
 * bytes. Then files edited entry by entry through the tensors API: each
 * refused by name, nothing returned.
 * Legend: B sequences, D = d_model, T new tokens per call. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "naive.h"
#include "test_util.h"
#include "tests.h"

enum { B = 3, D = 32, H = 4 };

static char dir[64];

static void cleanup(void) {
    static const char *const names[] = {"a.safetensors", "b.safetensors", "bad.safetensors"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char p[128];
        snprintf(p, sizeof p, "%s/%s", dir, names[i]);
        unlink(p);
    }
    rmdir(dir);
}

static const char *path_of(const char *name) {
    static char p[3][128];
    static int k;
    if (!dir[0]) {
        snprintf(dir, sizeof dir, "/tmp/mha_test_cache_file_XXXXXX");
        if (mkdtemp(dir)) atexit(cleanup);
        else snprintf(dir, sizeof dir, ".");
    }
    k = (k + 1) % 3;
    snprintf(p[k], sizeof p[k], "%s/%s", dir, name);
    return p[k];
}

typedef struct {
    mha_cache_dtype kt, vt;
    int h_kv, cap, window, n_sink;
    int rope, alibi, permute, cross;
} file_case;

static mha_layer *case_layer(const file_case *fc, naive_weights *w) {
    mha_config c = naive_config(D, H, fc->h_kv, 8, 8, 1);
    c.alibi = fc->alibi;
    if (fc->rope) c.rope.pairing = MHA_ROPE_HALVES, c.rope.dim = 8, c.rope.theta = 100.0;
    c = naive_resolve(c);
    uint64_t seed = 21;
    naive_weights_random(w, &c, &seed, 0.5f);
    mha_layer *L = naive_make_layer(w);
    if (L && fc->permute) { /* heads in another order (kv groups kept whole) */
        int perm[H];
        for (int r = 0; r < H; r++) perm[r] = fc->h_kv == H ? H - 1 - r : (r + H / fc->h_kv) % H;
        CHECK_OK(mha_layer_permute_heads(L, perm));
    }
    return L;
}

/* cache's history: calls of 5, 1 and 4 tokens with ragged n_new (positions
 * explicit for ALiBi), or the cross memory; then a rollback of sequence 1 */
static void feed(const file_case *fc, const mha_layer *L, mha_cache *c, uint64_t *seed) {
    float *x = naive_random_floats((size_t)B * 7 * D, seed, -1, 1), *y = naive_alloc_floats((size_t)B * 7 * D);
    if (fc->cross) {
        const int s_len[B] = {7, 3, 5};
        CHECK_OK(mha_cache_set_memory(c, L, x, NULL, 7, s_len));
    } else {
        static const int Ts[3] = {5, 1, 4};
        const int n_new[B] = {5, 3, 4};
        for (int call = 0, base = 0; call < 3; call++) {
            int pos[B * 5];
            for (int i = 0; i < B * 5; i++) pos[i] = 2 * (base + i % 5) + 1;
            mha_options o = mha_options_default();
            o.positions = fc->alibi ? pos : NULL;
            CHECK_OK(mha_forward_cached(L, c, y, NULL, x, Ts[call], call == 0 ? n_new : NULL, &o));
            base += Ts[call];
        }
        CHECK_OK(mha_cache_truncate(c, 1, mha_cache_length(c, 1) - 1));
    }
    free(x), free(y);
}

static long file_size(const char *path, unsigned char **bytes) {
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    *bytes = malloc((size_t)n + 1);
    if (!*bytes || fread(*bytes, 1, (size_t)n, f) != (size_t)n) n = -1;
    fclose(f);
    return n;
}

static void round_trip(const file_case *fc) {
    naive_weights w;
    mha_layer *L = case_layer(fc, &w);
    mha_cache *a = NULL, *b = NULL;
    if (L && fc->cross) CHECK_OK(mha_cache_create_cross(&a, L, B, fc->cap, fc->kt, fc->vt));
    else if (L) CHECK_OK(mha_cache_create_kv(&a, L, B, fc->cap, fc->kt, fc->vt, fc->window));
    if (!a) goto done;
    if (fc->n_sink) CHECK_OK(mha_cache_set_sink_tokens(a, fc->n_sink));
    uint64_t seed = 8;
    feed(fc, L, a, &seed);
    CHECK_OK(mha_cache_save(a, path_of("a.safetensors")));
    CHECK_OK(mha_cache_load(&b, L, path_of("a.safetensors")));
    if (!b) goto done;
    CHECK(mha_cache_bytes(b) == mha_cache_bytes(a));
    for (int s = 0; s < B; s++) CHECK_INT(mha_cache_length(b, s), mha_cache_length(a, s));
    /* the loaded cache saves to the same bytes */
    CHECK_OK(mha_cache_save(b, path_of("b.safetensors")));
    unsigned char *fa = NULL, *fb = NULL;
    const long na = file_size(path_of("a.safetensors"), &fa), nb = file_size(path_of("b.safetensors"), &fb);
    CHECK(na > 0 && na == nb && memcmp(fa, fb, (size_t)na) == 0);
    free(fa), free(fb);
    /* both continued alike give the same bits, step after step */
    float *x = naive_random_floats((size_t)B * 3 * D, &seed, -1, 1);
    float *ya = naive_alloc_floats((size_t)B * 3 * D), *yb = naive_alloc_floats((size_t)B * 3 * D);
    for (int step = 0; step < 3; step++) {
        const int T = step == 1 ? 3 : 1;
        int pos[B * 3];
        for (int s = 0; s < B; s++)
            for (int t = 0; t < T; t++) pos[s * T + t] = 100 + 3 * step + t;
        mha_options o = mha_options_default();
        o.positions = fc->alibi ? pos : NULL;
        CHECK_OK(mha_forward_cached(L, a, ya, NULL, x, T, NULL, &o));
        CHECK_OK(mha_forward_cached(L, b, yb, NULL, x, T, NULL, &o));
        CHECK(memcmp(ya, yb, sizeof(float) * B * T * D) == 0);
    }
    /* the range rule knows the loaded keys: a query past it refused by both */
    const int wq = H * 8;
    float *q = naive_alloc_floats((size_t)B * wq), *z = naive_alloc_floats((size_t)B * wq);
    for (int i = 0; i < B * wq; i++) q[i] = 1e30f;
    const mha_status sa = mha_cache_attend(a, z, q, 1, NULL, 0.0f), sb = mha_cache_attend(b, z, q, 1, NULL, 0.0f);
    CHECK_INT(sa, MHA_E_NONFINITE);
    CHECK_INT(sb, MHA_E_NONFINITE);
    free(x), free(ya), free(yb), free(q), free(z);
done:
    mha_cache_free(a), mha_cache_free(b), mha_layer_free(L), naive_weights_free(&w);
}

static void test_file_fp32(void) {
    file_case fc = {MHA_CACHE_F32, MHA_CACHE_F32, H, 24, 0, 0, 0, 0, 0, 0};
    round_trip(&fc);
}
static void test_file_fp16_gqa_rope_permuted(void) {
    file_case fc = {MHA_CACHE_F16, MHA_CACHE_F16, 2, 24, 0, 0, 1, 0, 1, 0};
    round_trip(&fc);
}
static void test_file_int8_mqa_alibi_positions(void) {
    file_case fc = {MHA_CACHE_I8, MHA_CACHE_I8, 1, 24, 0, 0, 0, 1, 0, 0};
    round_trip(&fc);
}
/* a ring of 8 slots keeping 5 with 2 sink tokens: wrapped by the 10 tokens */
static void test_file_ring_sinks_mixed(void) {
    file_case fc = {MHA_CACHE_I8, MHA_CACHE_F16, 2, 8, 5, 2, 1, 0, 1, 0};
    round_trip(&fc);
}
static void test_file_cross_memory(void) {
    file_case fc = {MHA_CACHE_I8, MHA_CACHE_F32, 2, 9, 0, 0, 0, 0, 0, 1};
    round_trip(&fc);
}

/* ---------------------------------------------------- hostile files */

typedef void (*edit_fn)(mha_tensors *t, const char *name, mha_array *a);

/* path_of("bad.safetensors") = the file at src with edit applied to each
 * tensor (a copy) and to the metadata (name NULL, a NULL) before writing. */
static void rewrite(const char *src, edit_fn edit) {
    mha_tensors *in = NULL, *out = NULL;
    CHECK_OK(mha_safetensors_read(&in, src, 0));
    CHECK_OK(mha_tensors_create(&out));
    if (!in || !out) goto done;
    for (int i = 0; i < mha_tensors_meta_count(in); i++) {
        const char *k = mha_tensors_meta_key(in, i);
        CHECK_OK(mha_tensors_set_meta(out, k, mha_tensors_meta(in, k)));
    }
    edit(out, NULL, NULL);
    for (int i = 0; i < mha_tensors_count(in); i++) {
        const char *name = mha_tensors_name(in, i);
        const mha_array *a = mha_tensors_get(in, name);
        mha_array copy = *a;
        size_t bytes = a->count * (a->f ? sizeof(float) : 1);
        void *data = malloc(bytes + 1);
        memcpy(data, a->f ? (void *)a->f : (void *)a->u8, bytes);
        if (a->f) copy.f = data;
        else copy.u8 = data;
        edit(out, name, &copy);
        if (copy.rank >= 0) CHECK_OK(mha_tensors_add(out, name, &copy));
        free(data);
    }
    CHECK_OK(mha_safetensors_write(path_of("bad.safetensors"), out));
done:
    mha_tensors_free(in), mha_tensors_free(out);
}

static void meta(mha_tensors *t, const char *key, const char *value) {
    CHECK_OK(mha_tensors_set_meta(t, key, value));
}

static void e_lengths(mha_tensors *t, const char *n, mha_array *a) { if (!n) meta(t, "lengths", "5,99,4"); (void)a; }
static void e_oldest(mha_tensors *t, const char *n, mha_array *a) { if (!n) meta(t, "oldest", "6,0,0"); (void)a; }
static void e_labels(mha_tensors *t, const char *n, mha_array *a) { if (!n) meta(t, "labels_k", "1,1"); (void)a; }
static void e_list(mha_tensors *t, const char *n, mha_array *a) { if (!n) meta(t, "lengths", "5,3"); (void)a; }
static void e_int(mha_tensors *t, const char *n, mha_array *a) { if (!n) meta(t, "capacity", "24x"); (void)a; }
static void e_format(mha_tensors *t, const char *n, mha_array *a) { if (!n) meta(t, "format", "mha_layer"); (void)a; }
static void e_version(mha_tensors *t, const char *n, mha_array *a) { if (!n) meta(t, "format_version", "2"); (void)a; }
static void e_dtype(mha_tensors *t, const char *n, mha_array *a) { if (!n) meta(t, "k_dtype", "int4"); (void)a; }
static void e_shape(mha_tensors *t, const char *n, mha_array *a) {
    (void)t;
    if (n && strcmp(n, "v") == 0) a->shape[2] = a->shape[2] / 2, a->count /= 2;
}
static void e_missing(mha_tensors *t, const char *n, mha_array *a) {
    (void)t;
    if (n && strcmp(n, "k_scale") == 0) a->rank = -1; /* dropped */
}
static void e_code(mha_tensors *t, const char *n, mha_array *a) {
    (void)t;
    if (n && strcmp(n, "k") == 0) a->f[3] = -128.0f; /* sequence 0, kv head 0, slot 0: live */
}
static void e_scale(mha_tensors *t, const char *n, mha_array *a) {
    (void)t;
    if (n && strcmp(n, "v_scale") == 0) a->f[1] = -0.5f;
}
static void e_scale_overflow(mha_tensors *t, const char *n, mha_array *a) {
    (void)t;
    if (n && strcmp(n, "k_scale") == 0) a->f[0] = 3e38f; /* its block holds a code of 127: 127 x 3e38 = inf */
}
static void e_scale_zero(mha_tensors *t, const char *n, mha_array *a) {
    (void)t;
    if (n && strcmp(n, "v_scale") == 0) a->f[0] = 0.0f; /* under the block's codes, one of them +-127 */
}
static void e_position(mha_tensors *t, const char *n, mha_array *a) {
    (void)t;
    if (n && strcmp(n, "positions") == 0) memset(a->u8 + 4 * 2, 0xff, 4); /* slot 2 of sequence 0: -1 */
}
static void e_nothing(mha_tensors *t, const char *n, mha_array *a) { (void)t, (void)n, (void)a; }
static void e_ring_short(mha_tensors *t, const char *n, mha_array *a) { if (!n) meta(t, "lengths", "5,5,5"); (void)a; }

static void test_file_refusals(void) {
    naive_weights w;
    file_case fc = {MHA_CACHE_I8, MHA_CACHE_I8, 2, 24, 0, 0, 0, 0, 0, 0};
    mha_layer *L = case_layer(&fc, &w), *other = NULL, *rope = NULL;
    mha_cache *a = NULL, *b = NULL;
    if (L) CHECK_OK(mha_cache_create_kv(&a, L, B, 24, MHA_CACHE_I8, MHA_CACHE_I8, 0));
    if (!a) goto done;
    uint64_t seed = 4;
    feed(&fc, L, a, &seed);
    char good[128];
    snprintf(good, sizeof good, "%s", path_of("a.safetensors")); /* path_of's buffers rotate */
    CHECK_OK(mha_cache_save(a, good));
    static const struct {
        edit_fn edit;
        mha_status want;
        const char *says;
    } cases[] = {
        {e_nothing, MHA_OK, ""},
        {e_lengths, MHA_E_FORMAT, "sequence 1 has length 99"},
        {e_oldest, MHA_E_FORMAT, "sequence 0 has length 10 and oldest stored position 6"},
        {e_labels, MHA_E_FORMAT, "expected a permutation of the kv heads"},
        {e_list, MHA_E_FORMAT, "metadata lengths = '5,3'; expected 3 comma-separated integers"},
        {e_int, MHA_E_FORMAT, "metadata capacity = '24x'; expected an integer"},
        {e_format, MHA_E_FORMAT, "expected 'mha_cache'"},
        {e_version, MHA_E_UNSUPPORTED, "format_version '2'"},
        {e_dtype, MHA_E_FORMAT, "k_dtype = 'int4'"},
        {e_shape, MHA_E_FORMAT, "tensor 'v' is"},
        {e_missing, MHA_E_FORMAT, "tensor 'k_scale' is missing"},
        {e_code, MHA_E_FORMAT, "k[0][0][0][3] = -128; expected an int8 code in -127..127"},
        {e_scale, MHA_E_FORMAT, "v_scale[0][0][1][0] = -0.5; expected a finite scale >= 0"},
        {e_position, MHA_E_FORMAT, "positions[0][2] = -1; expected >= 0"},
        /* before, both loaded: the next call overflowed (V: after appending) */
        {e_scale_overflow, MHA_E_FORMAT, "(k_scale[0][0][0][0]); expected a code whose value code * scale is finite"},
        {e_scale_zero, MHA_E_FORMAT, "(v_scale[0][0][0][0]); expected 0, as its scale is 0"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        rewrite(good, cases[i].edit);
        b = (mha_cache *)&b; /* set: the call must clear it */
        CHECK_STATUS(mha_cache_load(&b, L, path_of("bad.safetensors")), cases[i].want);
        if (cases[i].want) {
            CHECK_ERROR_MENTIONS(cases[i].says);
            CHECK(b == NULL);
        }
        mha_cache_free(cases[i].want ? NULL : b);
        b = NULL;
    }
    /* another layer shape; a cross memory for a RoPE layer; no file; not safetensors */
    naive_weights w2, w3;
    mha_config c2 = naive_resolve(naive_config(D, H, 4, 8, 8, 1)), c3 = naive_resolve(naive_config(D, H, 2, 8, 8, 1));
    c3.rope.pairing = MHA_ROPE_HALVES, c3.rope.dim = 8, c3.rope.theta = 100.0;
    c3 = naive_resolve(c3);
    naive_weights_random(&w2, &c2, &seed, 0.5f), naive_weights_random(&w3, &c3, &seed, 0.5f);
    other = naive_make_layer(&w2), rope = naive_make_layer(&w3);
    CHECK_STATUS(mha_cache_load(&b, other, good), MHA_E_SHAPE);
    CHECK_ERROR_MENTIONS("expected the layer the cache was saved from");
    mha_cache *cross = NULL;
    CHECK_OK(mha_cache_create_cross(&cross, L, 1, 4, MHA_CACHE_F32, MHA_CACHE_F32));
    if (cross) CHECK_OK(mha_cache_save(cross, path_of("b.safetensors")));
    CHECK_STATUS(mha_cache_load(&b, rope, path_of("b.safetensors")), MHA_E_UNSUPPORTED);
    CHECK_ERROR_MENTIONS("the layer has RoPE");
    CHECK_STATUS(mha_cache_load(&b, L, path_of("none.safetensors")), MHA_E_IO);
    FILE *f = fopen(path_of("bad.safetensors"), "wb");
    if (f) fputs("not a file of tensors", f), fclose(f);
    CHECK_STATUS(mha_cache_load(&b, L, path_of("bad.safetensors")), MHA_E_FORMAT);
    CHECK_STATUS(mha_cache_load(NULL, L, good), MHA_E_ARG);
    CHECK_STATUS(mha_cache_load(&b, NULL, good), MHA_E_ARG);
    CHECK_STATUS(mha_cache_save(NULL, good), MHA_E_ARG);
    /* a failed save leaves the old file whole */
    unsigned char *before = NULL, *after = NULL;
    const long n0 = file_size(good, &before);
    CHECK(mha_cache_save(a, "/nonexistent-dir/x.safetensors") != MHA_OK);
    const long n1 = file_size(good, &after);
    CHECK(n0 > 0 && n0 == n1 && memcmp(before, after, (size_t)n0) == 0);
    free(before), free(after);
    /* a ring (8 slots, window 5) holding positions 2..9: a length of 5 would
     * need position 1 for its next token's window */
    mha_cache *ring = NULL;
    CHECK_OK(mha_cache_create_kv(&ring, L, B, 8, MHA_CACHE_F32, MHA_CACHE_F32, 5));
    if (ring) {
        float *x = naive_random_floats((size_t)B * 10 * D, &seed, -1, 1), *y = naive_alloc_floats((size_t)B * 10 * D);
        CHECK_OK(mha_forward_cached(L, ring, y, NULL, x, 10, NULL, NULL));
        CHECK_OK(mha_cache_save(ring, path_of("b.safetensors")));
        char rp[128];
        snprintf(rp, sizeof rp, "%s", path_of("b.safetensors"));
        rewrite(rp, e_ring_short);
        CHECK_STATUS(mha_cache_load(&b, L, path_of("bad.safetensors")), MHA_E_FORMAT);
        CHECK_ERROR_MENTIONS("sequence 0 has length 5 and oldest stored position 2");
        free(x), free(y);
    }
    mha_cache_free(ring);
    mha_cache_free(cross), mha_layer_free(other), mha_layer_free(rope);
    naive_weights_free(&w2), naive_weights_free(&w3);
done:
    mha_cache_free(a), mha_layer_free(L), naive_weights_free(&w);
}

static const test_case cases[] = {
    {"cache_file_fp32", test_file_fp32},
    {"cache_file_fp16_gqa_rope_permuted", test_file_fp16_gqa_rope_permuted},
    {"cache_file_int8_mqa_alibi_positions", test_file_int8_mqa_alibi_positions},
    {"cache_file_ring_sinks_mixed", test_file_ring_sinks_mixed},
    {"cache_file_cross_memory", test_file_cross_memory},
    {"cache_file_refusals", test_file_refusals},
};

const test_case *tests_cache_file(size_t *count) {
    *count = sizeof cases / sizeof cases[0];
    return cases;
}
