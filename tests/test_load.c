/* test_load.c — the mapped load path (src/io/map.c and the borrowing
 * safetensors reader): float32 tensors borrow the mapping only when they
 * may (aligned, float32), a layer outlives the file it was loaded from, a
 * file that is short on disk or changes size gives a clean error, and the
 * parallel conversion gives the same values and the same first bad index
 * for any thread count. */
#include <fcntl.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "io/tensors_internal.h"
#include "tests.h"

static char dir[64];
static const char *const file_names[] = {"borrow.safetensors", "nan.safetensors",
                                         "layer.safetensors", "short.safetensors",
                                         "empty.safetensors", "short.npy", "grow.bin"};

static const char *path_in_dir(const char *name);

/* Every file of this area lives in one private directory, removed at exit. */
static void cleanup(void) {
    for (size_t i = 0; i < sizeof file_names / sizeof file_names[0]; i++)
        unlink(path_in_dir(file_names[i]));
    rmdir(dir);
}

static const char *path_in_dir(const char *name) {
    static char p[4][128];
    static int k;
    if (!dir[0]) {
        snprintf(dir, sizeof dir, "/tmp/mha_test_load_XXXXXX");
        if (mkdtemp(dir)) atexit(cleanup);
        else dir[0] = '\0';
    }
    k = (k + 1) % 4;
    snprintf(p[k], sizeof p[k], "%s/%s", dir[0] ? dir : ".", name);
    return p[k];
}

static void write_bytes(const char *path, const void *b, size_t n) {
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL);
    if (!f) return;
    CHECK(fwrite(b, 1, n, f) == n);
    fclose(f);
}

/* A safetensors file: u64 LE header length, header (length a multiple of 8
 * so data starts 8-aligned in the file), data. */
static void write_st(const char *path, const char *json, const void *data, size_t n) {
    size_t hl = strlen(json), padded = (hl + 7) / 8 * 8;
    unsigned char *b = malloc(8 + padded + n);
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)((uint64_t)padded >> (8 * i));
    memcpy(b + 8, json, hl);
    memset(b + 8 + hl, ' ', padded - hl);
    memcpy(b + 8 + padded, data, n);
    write_bytes(path, b, 8 + padded + n);
    free(b);
}

static int in_mapping(const mha_tensors *t, const void *p) {
    const unsigned char *c = p;
    return t->map.p && c >= t->map.p && c < t->map.p + t->map.len;
}

/* "a" F32 at offset 0 (aligned: borrowed), "b" U8 1 byte, "c" F32 at offset
 * 9 (unaligned: copied), "d" F16 (decoded). Values equal the copying reader's. */
static void test_map_borrows_only_aligned_f32(void) {
    unsigned char data[8 + 1 + 8 + 4];
    float a[2] = {1.5f, -2.25f}, c[2] = {3.0f, 0.125f};
    memcpy(data, a, 8);
    data[8] = 7;
    memcpy(data + 9, c, 8);
    data[17] = 0x00, data[18] = 0x3c; /* half 1.0 */
    data[19] = 0x00, data[20] = 0xc0; /* half -2.0 */
    const char *p = path_in_dir("borrow.safetensors");
    write_st(p,
             "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
             "\"b\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[8,9]},"
             "\"c\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[9,17]},"
             "\"d\":{\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[17,21]}}",
             data, sizeof data);
    mha_tensors *m = NULL, *r = NULL;
    CHECK_OK(mha_safetensors_map(&m, p, 0));
    CHECK_OK(mha_safetensors_read(&r, p, 0));
    if (!m || !r) return;
    const mha_array *ma = mha_tensors_get(m, "a"), *mc = mha_tensors_get(m, "c"),
                    *md = mha_tensors_get(m, "d"), *mb = mha_tensors_get(m, "b");
    CHECK(ma && mb && mc && md);
    if (!ma || !mb || !mc || !md) return;
    CHECK(in_mapping(m, ma->f));  /* aligned float32: borrowed */
    CHECK(!in_mapping(m, mc->f)); /* unaligned: an owned copy */
    CHECK(!in_mapping(m, md->f)); /* float16: decoded */
    CHECK(!in_mapping(m, mb->u8));
    CHECK(r->map.p == NULL); /* the copying reader keeps no mapping */
    const char *names[4] = {"a", "b", "c", "d"};
    for (int i = 0; i < 4; i++) {
        const mha_array *x = mha_tensors_get(m, names[i]), *y = mha_tensors_get(r, names[i]);
        CHECK_INT(x->count, y->count);
        if (x->f) CHECK(memcmp(x->f, y->f, x->count * sizeof(float)) == 0);
        else CHECK(memcmp(x->u8, y->u8, x->count) == 0);
    }
    CHECK_NEAR(mc->f[1], 0.125f, 0);
    CHECK_NEAR(md->f[1], -2.0f, 0);
    mha_tensors_free(m); /* unmaps; frees only the owned arrays (ASan checks) */
    mha_tensors_free(r);
}

/* Borrowed data is checked like copied data: a NaN in a mapped float32
 * tensor is refused with the same message. */
static void test_map_checks_borrowed_finite(void) {
    float d[3] = {1.0f, NAN, 2.0f};
    const char *p = path_in_dir("nan.safetensors");
    write_st(p, "{\"w\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,12]}}", d, sizeof d);
    mha_tensors *t = NULL;
    CHECK_STATUS(mha_safetensors_map(&t, p, 0), MHA_E_NONFINITE);
    CHECK_ERROR_MENTIONS("w[1]");
    CHECK(t == NULL);
    CHECK_OK(mha_safetensors_map(&t, p, MHA_IO_ALLOW_NONFINITE));
    mha_tensors_free(t);
}

/* mha_layer_load borrows the mapping while it builds the layer; the layer
 * owns its weights: the file removed and another written in its place
 * leave it unchanged. */
static void test_layer_outlives_its_file(void) {
    mha_config c = mha_config_default(16, 4);
    mha_layer *L0 = NULL, *L1 = NULL, *L2 = NULL;
    CHECK_OK(mha_layer_create(&L0, &c, NULL));
    CHECK_OK(mha_layer_create(&L2, &c, NULL));
    if (!L0 || !L2) return;
    uint64_t seed = 3;
    mha_weights w;
    float *buf = malloc(4 * 16 * 16 * sizeof(float) + 4 * 16 * sizeof(float));
    test_fill_uniform(buf, 4 * 16 * 16 + 4 * 16, &seed, -1, 1);
    w = (mha_weights){.w_q = buf, .w_k = buf + 256, .w_v = buf + 512, .w_o = buf + 768,
                      .b_q = buf + 1024, .b_k = buf + 1040, .b_v = buf + 1056, .b_o = buf + 1072};
    CHECK_OK(mha_layer_set_weights(L0, &w));
    const char *p = path_in_dir("layer.safetensors");
    CHECK_OK(mha_layer_save(L0, p));
    CHECK_OK(mha_layer_load(&L1, p, NULL));
    CHECK(unlink(p) == 0);
    CHECK_OK(mha_layer_save(L2, p)); /* other weights at the same path */
    if (L1) {
        mha_weights a, b;
        mha_layer_get_weights(L0, &a);
        mha_layer_get_weights(L1, &b);
        CHECK(memcmp(a.w_q, b.w_q, 256 * sizeof(float)) == 0);
        CHECK(memcmp(a.w_o, b.w_o, 256 * sizeof(float)) == 0);
        CHECK(memcmp(a.b_v, b.b_v, 16 * sizeof(float)) == 0);
    }
    free(buf);
    mha_layer_free(L0);
    mha_layer_free(L1);
    mha_layer_free(L2);
}

/* Files short on disk (the header promises more than the file holds) and
 * empty files: clean errors from every mapped reader, never a fault. */
static void test_short_files_on_disk(void) {
    float d[4] = {1, 2, 3, 4};
    const char *p = path_in_dir("short.safetensors");
    write_st(p, "{\"w_q\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", d, 8);
    mha_tensors *t = NULL;
    mha_layer *L = NULL;
    CHECK_STATUS(mha_safetensors_map(&t, p, 0), MHA_E_FORMAT);
    CHECK_ERROR_MENTIONS("truncated");
    CHECK_STATUS(mha_safetensors_read(&t, p, 0), MHA_E_FORMAT);
    CHECK_STATUS(mha_layer_load(&L, p, NULL), MHA_E_FORMAT);
    CHECK_ERROR_MENTIONS("truncated");
    const char *e = path_in_dir("empty.safetensors");
    write_bytes(e, "", 0);
    CHECK_STATUS(mha_layer_load(&L, e, NULL), MHA_E_FORMAT);
    CHECK_ERROR_MENTIONS("0 bytes");
    /* a .npy whose data stops short of its shape */
    const char *n = path_in_dir("short.npy");
    int shape[1] = {64};
    float x[64] = {0};
    CHECK_OK(mha_npy_write_f32(n, x, 1, shape));
    CHECK(truncate(n, 128 + 100) == 0);
    mha_array a;
    CHECK_STATUS(mha_npy_read(&a, n, 0), MHA_E_FORMAT);
    CHECK_ERROR_MENTIONS("truncated");
    CHECK(t == NULL && L == NULL);
}

/* The size is taken at open and checked again after decoding: a file that
 * grew or shrank in between is refused (no byte past the first size is
 * ever touched). */
static void test_map_size_change_refused(void) {
    const char *p = path_in_dir("grow.bin");
    write_bytes(p, "12345678", 8);
    mha_file_map m;
    CHECK_OK(mha_map_open(&m, p));
    CHECK_INT(m.len, 8);
    CHECK_OK(mha_map_check(&m, p));
    CHECK(truncate(p, 4096) == 0);
    CHECK_STATUS(mha_map_check(&m, p), MHA_E_IO);
    CHECK_ERROR_MENTIONS("changed size");
    CHECK(truncate(p, 8) == 0);
    CHECK_OK(mha_map_check(&m, p));
    mha_map_close(&m);
    CHECK_STATUS(mha_map_open(&m, dir[0] ? dir : "."), MHA_E_IO);
    CHECK_ERROR_MENTIONS("directory");
    CHECK(m.p == NULL && m.fd == -1);
}

/* The chunked, parallel conversion: a float16 array of several chunks
 * decodes to the same bytes for 1, 2 and 3 threads, and the error names
 * the first bad element (in the second chunk, before one in the fourth). */
static void test_parallel_decode_thread_free(void) {
    const size_t n = 5 * 65536 + 123;
    uint16_t *h = malloc(n * sizeof *h);
    for (size_t i = 0; i < n; i++) h[i] = (uint16_t)(0x3c00 + (i * 7919) % 0x3ff); /* [1, 2) */
    char dict[96];
    snprintf(dict, sizeof dict, "{'descr': '<f2', 'fortran_order': False, 'shape': (%zu,), }", n);
    size_t hl = strlen(dict), len = 10 + hl + 2 * n;
    unsigned char *b = malloc(len);
    memcpy(b, "\x93NUMPY\x01\x00", 8);
    b[8] = (unsigned char)(hl & 0xff), b[9] = (unsigned char)(hl >> 8);
    memcpy(b + 10, dict, hl);
    memcpy(b + 10 + hl, h, 2 * n);
    int saved = omp_get_max_threads();
    mha_array ref = {0};
    for (int th = 1; th <= 3; th++) {
        omp_set_num_threads(th);
        mha_array a;
        CHECK_OK(mha_npy_parse(&a, b, len, "p.npy", 0));
        if (th == 1) ref = a;
        else {
            CHECK(a.f && memcmp(a.f, ref.f, n * sizeof(float)) == 0);
            mha_array_free(&a);
        }
    }
    CHECK_NEAR(ref.f[0], 1.0f, 0);
    /* NaN (0x7e00) at 3*65536+5 and 65536+9: the lower index is named */
    unsigned char *d = b + 10 + hl;
    size_t bad[2] = {3 * 65536 + 5, 65536 + 9};
    for (int k = 0; k < 2; k++) d[2 * bad[k]] = 0x00, d[2 * bad[k] + 1] = 0x7e;
    for (int th = 1; th <= 3; th++) {
        omp_set_num_threads(th);
        mha_array a;
        CHECK_STATUS(mha_npy_parse(&a, b, len, "p.npy", 0), MHA_E_NONFINITE);
        CHECK_ERROR_MENTIONS("array[65545]");
    }
    omp_set_num_threads(saved);
    mha_array_free(&ref);
    free(b);
    free(h);
}

/* The finiteness scan passes whole blocks of 1024 floats with a vector
 * test and looks at single elements only in a block that fails it (and in
 * the tail): whatever the block, the first refused element is named, and
 * an allowed -inf does not hide a NaN after it in the same block. */
static void test_finite_scan_blocks(void) {
    enum { N = 2 * 1024 + 300 };
    char dict[96];
    snprintf(dict, sizeof dict, "{'descr': '<f4', 'fortran_order': False, 'shape': (%d,), }", N);
    size_t hl = strlen(dict), len = 10 + hl + 4 * (size_t)N;
    unsigned char *b = malloc(len);
    float *v = malloc(N * sizeof *v);
    if (!b || !v) return;
    memcpy(b, "\x93NUMPY\x01\x00", 8);
    b[8] = (unsigned char)(hl & 0xff), b[9] = (unsigned char)(hl >> 8);
    memcpy(b + 10, dict, hl);
    const struct {
        size_t at[2];
        float val[2];
        unsigned flags;
        const char *named; /* NULL: accepted */
    } cases[] = {
        {{0, 0}, {1.0f, 1.0f}, 0, NULL},
        {{1030, 1030}, {-INFINITY, -INFINITY}, MHA_IO_ALLOW_NEG_INF, NULL},
        {{1030, 1030}, {-INFINITY, -INFINITY}, 0, "array[1030]"},
        {{1030, 1500}, {-INFINITY, NAN}, MHA_IO_ALLOW_NEG_INF, "array[1500]"},
        {{2300, 2300}, {INFINITY, INFINITY}, 0, "array[2300]"}, /* the tail */
        {{5, 2000}, {NAN, NAN}, 0, "array[5]"},
        {{2047, 2048}, {NAN, NAN}, MHA_IO_ALLOW_NEG_INF, "array[2047]"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        for (int i = 0; i < N; i++) v[i] = 0.5f + (float)(i % 7);
        for (int j = 0; j < 2; j++) v[cases[k].at[j]] = cases[k].val[j];
        memcpy(b + 10 + hl, v, 4 * (size_t)N);
        mha_array a;
        if (!cases[k].named) {
            CHECK_OK(mha_npy_parse(&a, b, len, "p.npy", cases[k].flags));
            CHECK(a.f && memcmp(a.f, v, 4 * (size_t)N) == 0);
            mha_array_free(&a);
        } else {
            CHECK_STATUS(mha_npy_parse(&a, b, len, "p.npy", cases[k].flags), MHA_E_NONFINITE);
            CHECK_ERROR_MENTIONS(cases[k].named);
        }
    }
    free(v);
    free(b);
}

static const test_case cases[] = {
    {"load_finite_scan_blocks", test_finite_scan_blocks},
    {"load_map_borrows_only_aligned_f32", test_map_borrows_only_aligned_f32},
    {"load_map_checks_borrowed_finite", test_map_checks_borrowed_finite},
    {"load_layer_outlives_its_file", test_layer_outlives_its_file},
    {"load_short_files_on_disk", test_short_files_on_disk},
    {"load_map_size_change_refused", test_map_size_change_refused},
    {"load_parallel_decode_thread_free", test_parallel_decode_thread_free},
};

const test_case *tests_load(size_t *count) {
    *count = sizeof cases / sizeof cases[0];
    return cases;
}
