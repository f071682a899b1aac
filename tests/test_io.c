/* test_io.c — files in, files out: .npy and safetensors readers/writers
 * (hand-built byte strings from the two formats' specifications, round
 * trips, every bad-file case), and the checkpoint layouts (each layout's
 * tensors are built here from the math, independently of layouts.c, and
 * the loaded layer must match the naive oracle on the original weights). */
#include <dirent.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "naive.h"
#include "tests.h"

/* ------------------------------------------------------------ helpers */

/* Files go to one private directory, removed at exit. */
static char tmp_dir[64];
static char tmp_files[32][160];
static int n_tmp_files;

static void tmp_cleanup(void) {
    for (int i = 0; i < n_tmp_files; i++) remove(tmp_files[i]);
    if (tmp_dir[0]) rmdir(tmp_dir);
}

/* The private directory, made on first use (any test may run alone);
 * NULL when it cannot be made. */
static const char *tmp_dir_made(void) {
    if (!tmp_dir[0]) {
        snprintf(tmp_dir, sizeof tmp_dir, "/tmp/mha_test_io_XXXXXX");
        if (!mkdtemp(tmp_dir)) {
            tmp_dir[0] = '\0';
            return NULL;
        }
        atexit(tmp_cleanup);
    }
    return tmp_dir;
}

static const char *tmp_path(const char *name) {
    if (!tmp_dir_made()) return name; /* current directory as a fallback */
    char path[160];
    snprintf(path, sizeof path, "%s/%s", tmp_dir, name);
    for (int i = 0; i < n_tmp_files; i++)
        if (strcmp(tmp_files[i], path) == 0) return tmp_files[i];
    if (n_tmp_files == 32) return name;
    memcpy(tmp_files[n_tmp_files], path, sizeof path);
    return tmp_files[n_tmp_files++];
}

/* A .npy v1.0 file: magic, version, u16 header length, dict, data. */
static unsigned char *npy_bytes(const char *dict, const void *data, size_t n, size_t *len) {
    size_t hl = strlen(dict);
    *len = 10 + hl + n;
    unsigned char *b = malloc(*len);
    memcpy(b, "\x93NUMPY\x01\x00", 8);
    b[8] = (unsigned char)(hl & 0xff);
    b[9] = (unsigned char)(hl >> 8);
    memcpy(b + 10, dict, hl);
    if (n) memcpy(b + 10 + hl, data, n);
    return b;
}

/* A safetensors file: u64 LE header length, JSON, data. */
static unsigned char *st_bytes(const char *json, const void *data, size_t n, size_t *len) {
    size_t hl = strlen(json);
    *len = 8 + hl + n;
    unsigned char *b = malloc(*len);
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)((uint64_t)hl >> (8 * i));
    memcpy(b + 8, json, hl);
    if (n) memcpy(b + 8 + hl, data, n);
    return b;
}

static mha_status npy_parse_str(const char *dict, const void *data, size_t n, mha_array *a,
                                unsigned flags) {
    size_t len;
    unsigned char *b = npy_bytes(dict, data, n, &len);
    mha_status s = mha_npy_parse(a, b, len, "t.npy", flags);
    free(b);
    return s;
}

static mha_status st_parse_str(const char *json, const void *data, size_t n, mha_tensors **t) {
    size_t len;
    unsigned char *b = st_bytes(json, data, n, &len);
    mha_status s = mha_safetensors_parse(t, b, len, "t.safetensors", 0);
    free(b);
    return s;
}

/* ------------------------------------------------------------- .npy */

static void test_npy_round_trip_ranks(void) {
    uint64_t seed = 11;
    float data[120];
    test_fill_uniform(data, 120, &seed, -3, 3);
    int shapes[5][4] = {{0}, {7}, {3, 5}, {2, 3, 4}, {2, 3, 2, 5}};
    size_t counts[5] = {1, 7, 15, 24, 60};
    for (int r = 0; r <= 4; r++) {
        const char *p = tmp_path("r.npy");
        CHECK_OK(mha_npy_write_f32(p, data, r, shapes[r]));
        mha_array a;
        CHECK_OK(mha_npy_read(&a, p, 0));
        CHECK_INT(a.rank, r);
        CHECK_INT(a.dtype, MHA_DTYPE_F32);
        CHECK_INT(a.count, counts[r]);
        for (int i = 0; i < r; i++) CHECK_INT(a.shape[i], shapes[r][i]);
        if (a.f) CHECK_ARRAY_NEAR(a.f, data, counts[r], 0);
        mha_array_free(&a);
    }
}

static void test_npy_hand_built_dtypes(void) {
    mha_array a;
    /* float16 bits: 0x3C00 = 1, 0xC000 = -2, 0x3555 = 0.333251953125, 0x0001 = 2^-24 */
    const unsigned char f16[8] = {0x00, 0x3C, 0x00, 0xC0, 0x55, 0x35, 0x01, 0x00};
    CHECK_OK(npy_parse_str("{'descr': '<f2', 'fortran_order': False, 'shape': (2, 2), }", f16, 8, &a, 0));
    CHECK_INT(a.dtype, MHA_DTYPE_F16);
    if (a.f) {
        CHECK_NEAR(a.f[0], 1.0, 0);
        CHECK_NEAR(a.f[1], -2.0, 0);
        CHECK_NEAR(a.f[2], 0.333251953125, 0);
        CHECK_NEAR(a.f[3], 5.9604644775390625e-08, 0);
    }
    mha_array_free(&a);
    const unsigned char b1[3] = {1, 0, 1};
    CHECK_OK(npy_parse_str("{\"descr\": \"|b1\", \"fortran_order\": False, \"shape\": (3,)}", b1, 3, &a, 0));
    CHECK_INT(a.dtype, MHA_DTYPE_BOOL);
    CHECK(a.u8 && a.u8[0] == 1 && a.u8[1] == 0 && a.u8[2] == 1);
    mha_array_free(&a);
    const unsigned char u1[2] = {200, 7};
    CHECK_OK(npy_parse_str("{'descr': '|u1', 'fortran_order': False, 'shape': (1, 2), }", u1, 2, &a, 0));
    CHECK(a.u8 && a.u8[0] == 200 && a.u8[1] == 7);
    mha_array_free(&a);
    /* float32 bits 0x3FC00000 = 1.5, little-endian */
    const unsigned char f4[4] = {0x00, 0x00, 0xC0, 0x3F};
    CHECK_OK(npy_parse_str("{'descr': '<f4', 'fortran_order': False, 'shape': (), }", f4, 4, &a, 0));
    CHECK_INT(a.rank, 0);
    if (a.f) CHECK_NEAR(a.f[0], 1.5, 0);
    mha_array_free(&a);
}

static void test_npy_write_f16_bool(void) {
    /* float16 write rounds to nearest even: 1 + 2^-11 is a tie -> 1;
     * 1 + 3*2^-11 is a tie -> 1 + 2^-9 (even mantissa); 70000 -> inf */
    float v[5] = {1.0f + 0x1p-11f, 1.0f + 3 * 0x1p-11f, -0.5f, 65504.0f, 1e-8f};
    mha_array a = {.dtype = MHA_DTYPE_F16, .rank = 1, .shape = {5, 1, 1, 1}, .count = 5, .f = v};
    const char *p = tmp_path("h.npy");
    CHECK_OK(mha_npy_write(p, &a));
    mha_array r;
    CHECK_OK(mha_npy_read(&r, p, 0));
    CHECK_INT(r.dtype, MHA_DTYPE_F16);
    if (r.f) {
        CHECK_NEAR(r.f[0], 1.0, 0);
        CHECK_NEAR(r.f[1], 1.0 + 0x1p-9, 0);
        CHECK_NEAR(r.f[2], -0.5, 0);
        CHECK_NEAR(r.f[3], 65504.0, 0);
        CHECK_NEAR(r.f[4], 0x1p-24 * 0, 0x1p-24); /* 1e-8 < 2^-25: rounds to 0 */
    }
    mha_array_free(&r);
    uint8_t m[6] = {1, 0, 0, 1, 1, 0};
    mha_array b = {.dtype = MHA_DTYPE_BOOL, .rank = 2, .shape = {2, 3, 1, 1}, .count = 6, .u8 = m};
    p = tmp_path("b.npy");
    CHECK_OK(mha_npy_write(p, &b));
    CHECK_OK(mha_npy_read(&r, p, 0));
    CHECK_INT(r.dtype, MHA_DTYPE_BOOL);
    CHECK(r.u8 && memcmp(r.u8, m, 6) == 0);
    mha_array_free(&r);
}

static void test_npy_refuses_bad_files(void) {
    mha_array a;
    const unsigned char z[64] = {0};
    CHECK_STATUS(npy_parse_str("{'descr': '>f4', 'fortran_order': False, 'shape': (2,), }", z, 8, &a, 0),
                 MHA_E_UNSUPPORTED);
    CHECK_ERROR_MENTIONS("big-endian");
    CHECK_STATUS(npy_parse_str("{'descr': '<f8', 'fortran_order': False, 'shape': (2,), }", z, 16, &a, 0),
                 MHA_E_UNSUPPORTED);
    CHECK_ERROR_MENTIONS("'<f8'");
    CHECK_STATUS(npy_parse_str("{'descr': '<i4', 'fortran_order': False, 'shape': (2,), }", z, 8, &a, 0),
                 MHA_E_UNSUPPORTED);
    // --- integers with MHA_IO_INTEGERS: little-endian two's complement into int64
    const unsigned char i4[8] = {0xfe, 0xff, 0xff, 0xff, 0x01, 0x02, 0x00, 0x40}; /* -2, 0x40000201 */
    CHECK_OK(npy_parse_str("{'descr': '<i4', 'fortran_order': False, 'shape': (2,), }", i4, 8, &a, MHA_IO_INTEGERS));
    CHECK(a.dtype == MHA_DTYPE_I32 && a.i64 && !a.f && !a.u8 && a.i64[0] == -2 && a.i64[1] == 0x40000201);
    mha_tensors *ti = NULL;
    CHECK_OK(mha_tensors_create(&ti));
    CHECK_STATUS(mha_tensors_add(ti, "pos", &a), MHA_E_UNSUPPORTED); /* no writer takes integers */
    CHECK_ERROR_MENTIONS("int32");
    mha_tensors_free(ti);
    mha_array_free(&a);
    const unsigned char i8[16] = {0x05, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f};
    CHECK_OK(npy_parse_str("{'descr': '<i8', 'fortran_order': False, 'shape': (2,), }", i8, 16, &a, MHA_IO_INTEGERS));
    CHECK(a.dtype == MHA_DTYPE_I64 && a.i64[0] == 5 && a.i64[1] == INT64_MAX);
    CHECK(strcmp(mha_dtype_name(a.dtype), "int64") == 0);
    mha_array_free(&a);
    CHECK_STATUS(npy_parse_str("{'descr': '<i2', 'fortran_order': False, 'shape': (2,), }", z, 4, &a, MHA_IO_INTEGERS),
                 MHA_E_UNSUPPORTED);
    CHECK_ERROR_MENTIONS("'<i8' (int64)");
    CHECK_STATUS(npy_parse_str("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 2), }", z, 16, &a, 0),
                 MHA_E_UNSUPPORTED);
    CHECK_ERROR_MENTIONS("Fortran");
    CHECK_STATUS(npy_parse_str("{'descr': '<f4', 'fortran_order': False, 'shape': (1, 1, 1, 1, 2), }", z, 8, &a, 0),
                 MHA_E_UNSUPPORTED);
    CHECK_ERROR_MENTIONS("rank");
    CHECK_STATUS(npy_parse_str("{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }", z, 8, &a, 0),
                 MHA_E_FORMAT);
    CHECK_ERROR_MENTIONS("truncated");
    CHECK_STATUS(npy_parse_str("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }", z, 8, &a, 0),
                 MHA_E_FORMAT);
    CHECK_ERROR_MENTIONS("trailing");
    CHECK_STATUS(npy_parse_str("{'descr': '<f4', 'shape': (1,), }", z, 4, &a, 0), MHA_E_FORMAT);
    CHECK_ERROR_MENTIONS("fortran_order");
    CHECK_STATUS(npy_parse_str("{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (1,)}", z, 4, &a, 0),
                 MHA_E_FORMAT);
    CHECK_STATUS(npy_parse_str("{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999,), }", z, 4, &a, 0),
                 MHA_E_FORMAT);
    CHECK_STATUS(npy_parse_str("{'descr': '<f4', 'fortran_order': False, 'shape': (2,-1), }", z, 4, &a, 0),
                 MHA_E_FORMAT);
    const unsigned char b2[2] = {1, 2};
    CHECK_STATUS(npy_parse_str("{'descr': '|b1', 'fortran_order': False, 'shape': (2,), }", b2, 2, &a, 0),
                 MHA_E_FORMAT);
    CHECK_ERROR_MENTIONS("0 or 1");
    /* magic, version, header length past the end */
    CHECK_STATUS(mha_npy_parse(&a, "NUMPY\x01\x00\x10\x00{}", 12, "m.npy", 0), MHA_E_FORMAT);
    CHECK_STATUS(mha_npy_parse(&a, "\x93NUMPY\x04\x00\x02\x00{}", 12, "v.npy", 0), MHA_E_UNSUPPORTED);
    CHECK_STATUS(mha_npy_parse(&a, "\x93NUMPY\x01\x00\xff\x00{}", 12, "h.npy", 0), MHA_E_FORMAT);
    CHECK_ERROR_MENTIONS("exceeds the file");
    CHECK_STATUS(mha_npy_parse(&a, "\x93NU", 4, "s.npy", 0), MHA_E_FORMAT);
    CHECK_STATUS(mha_npy_read(&a, tmp_path("does_not_exist.npy"), 0), MHA_E_IO);
    CHECK_ERROR_MENTIONS("does_not_exist.npy");
}

static void test_npy_nonfinite(void) {
    mha_array a;
    const float bad[3] = {1.0f, NAN, 2.0f};
    CHECK_STATUS(npy_parse_str("{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }", bad, 12, &a, 0),
                 MHA_E_NONFINITE);
    CHECK_ERROR_MENTIONS("[1]");
    CHECK_OK(npy_parse_str("{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }", bad, 12, &a,
                           MHA_IO_ALLOW_NONFINITE));
    mha_array_free(&a);
    const float ninf[2] = {-INFINITY, 0.0f}, pinf[2] = {INFINITY, 0.0f};
    CHECK_STATUS(npy_parse_str("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }", ninf, 8, &a, 0),
                 MHA_E_NONFINITE);
    CHECK_OK(npy_parse_str("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }", ninf, 8, &a,
                           MHA_IO_ALLOW_NEG_INF));
    mha_array_free(&a);
    CHECK_STATUS(npy_parse_str("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }", pinf, 8, &a,
                               MHA_IO_ALLOW_NEG_INF),
                 MHA_E_NONFINITE);
}

/* ------------------------------------------------------- safetensors */

static void test_st_round_trip(void) {
    mha_tensors *t, *r;
    CHECK_OK(mha_tensors_create(&t));
    float a[6] = {1, 2, 3, 4, 5, 6}, b[3] = {-1, 0.5f, 9};
    int sa[2] = {2, 3}, sb[1] = {3};
    CHECK_OK(mha_tensors_add_f32(t, "layer.a", a, 2, sa));
    CHECK_OK(mha_tensors_add_f32(t, "b", b, 1, sb));
    CHECK_STATUS(mha_tensors_add_f32(t, "b", b, 1, sb), MHA_E_ARG);
    CHECK_OK(mha_tensors_set_meta(t, "n_heads", "4"));
    CHECK_OK(mha_tensors_set_meta(t, "n_heads", "2"));
    const char *p = tmp_path("rt.safetensors");
    CHECK_OK(mha_safetensors_write(p, t));
    CHECK_OK(mha_safetensors_read(&r, p, 0));
    CHECK_INT(mha_tensors_count(r), 2);
    const mha_array *ra = mha_tensors_get(r, "layer.a"), *rb = mha_tensors_get(r, "b");
    CHECK(ra && ra->rank == 2 && ra->shape[0] == 2 && ra->shape[1] == 3);
    CHECK(rb && rb->rank == 1 && rb->count == 3);
    if (ra && ra->f) CHECK_ARRAY_NEAR(ra->f, a, 6, 0);
    if (rb && rb->f) CHECK_ARRAY_NEAR(rb->f, b, 3, 0);
    CHECK(mha_tensors_meta(r, "n_heads") && strcmp(mha_tensors_meta(r, "n_heads"), "2") == 0);
    CHECK(mha_tensors_get(r, "missing") == NULL);
    /* the header length is a multiple of 8 and the JSON is what jansson wrote */
    unsigned char head[8];
    FILE *f = fopen(p, "rb");
    CHECK(f && fread(head, 1, 8, f) == 8);
    if (f) fclose(f);
    CHECK_INT(head[0] % 8, 0);
    mha_tensors_free(t);
    mha_tensors_free(r);
}

static void test_st_hand_built_dtypes(void) {
    /* F16 1.0 = 0x3C00; BF16 1.0 = 0x3F80, -3.0 = 0xC040; U8; BOOL */
    const unsigned char data[] = {0x00, 0x3C, 0x80, 0x3F, 0x40, 0xC0, 9, 1};
    mha_tensors *t = NULL;
    CHECK_OK(st_parse_str("{\"__metadata__\":{\"format\":\"pt\"},"
                          "\"h\":{\"dtype\":\"F16\",\"shape\":[1],\"data_offsets\":[0,2]},"
                          "\"bf\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[2,6]},"
                          "\"u\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[6,7]},"
                          "\"m\":{\"dtype\":\"BOOL\",\"shape\":[1,1],\"data_offsets\":[7,8]}}",
                          data, sizeof data, &t));
    const mha_array *h = mha_tensors_get(t, "h"), *bf = mha_tensors_get(t, "bf"),
                    *u = mha_tensors_get(t, "u"), *m = mha_tensors_get(t, "m");
    CHECK(h && h->f && h->f[0] == 1.0f && h->dtype == MHA_DTYPE_F16);
    CHECK(bf && bf->f && bf->f[0] == 1.0f && bf->f[1] == -3.0f && bf->dtype == MHA_DTYPE_BF16);
    CHECK(u && u->u8 && u->u8[0] == 9);
    CHECK(m && m->u8 && m->u8[0] == 1 && m->rank == 2);
    CHECK(mha_tensors_meta(t, "format") && strcmp(mha_tensors_meta(t, "format"), "pt") == 0);
    mha_tensors_free(t);
}

typedef struct {
    const char *json;
    size_t data_len;
    mha_status want;
    const char *mention;
} st_case;

static void test_st_refuses_bad_files(void) {
    static const st_case cases[] = {
        /* data_offsets past the data: a truncated file */
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 8, MHA_E_FORMAT, "truncated"},
        /* overlapping tensors */
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
         "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 12, MHA_E_FORMAT, "overlap"},
        /* a hole */
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, MHA_E_FORMAT, "no tensor"},
        /* bytes after the last tensor */
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 8, MHA_E_FORMAT, "after the last"},
        /* duplicate names */
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
         "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, MHA_E_FORMAT, "duplicate"},
        /* unsupported dtype */
        {"{\"a\":{\"dtype\":\"I64\",\"shape\":[1],\"data_offsets\":[0,8]}}", 8, MHA_E_UNSUPPORTED, "I64"},
        /* span disagrees with shape x dtype */
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8, MHA_E_FORMAT, "need 12"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,8]}}", 8, MHA_E_FORMAT, "need 4"},
        /* end before begin, negative offsets, wrong arity */
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,0]}}", 8, MHA_E_FORMAT, "end before"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[-4,0]}}", 8, MHA_E_FORMAT, "data_offsets"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}", 4, MHA_E_FORMAT, "data_offsets"},
        /* shapes */
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1],\"data_offsets\":[0,4]}}", 4, MHA_E_UNSUPPORTED, "rank"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4, MHA_E_FORMAT, "shape[0]"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[65536,65536,65536,65536],\"data_offsets\":[0,4]}}", 4,
         MHA_E_FORMAT, "overflow"},
        /* structure */
        {"[1,2]", 0, MHA_E_FORMAT, "not a JSON object"},
        {"{\"a\":", 0, MHA_E_FORMAT, "not valid JSON"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4, MHA_E_FORMAT, "data_offsets"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],\"x\":1}}", 4, MHA_E_FORMAT, "unknown field"},
        {"{\"__metadata__\":{\"n\":4}}", 0, MHA_E_FORMAT, "not a string"},
    };
    unsigned char zeros[32] = {0};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        mha_tensors *t = (mha_tensors *)1;
        mha_status s = st_parse_str(cases[i].json, zeros, cases[i].data_len, &t);
        if (s != cases[i].want || !strstr(mha_last_error(), cases[i].mention))
            test_report(__FILE__, __LINE__, "case %zu: status %d (%s), want %d mentioning '%s'", i,
                        (int)s, mha_last_error(), (int)cases[i].want, cases[i].mention);
        CHECK(t == NULL);
    }
    /* header length larger than the file; no room for the length */
    mha_tensors *t;
    unsigned char big[16] = {0xff, 0xff, 0, 0, 0, 0, 0, 0, '{', '}'};
    CHECK_STATUS(mha_safetensors_parse(&t, big, 10, "big.safetensors", 0), MHA_E_FORMAT);
    CHECK_ERROR_MENTIONS("larger than the file");
    CHECK_STATUS(mha_safetensors_parse(&t, big, 5, "short.safetensors", 0), MHA_E_FORMAT);
    /* NaN in a weight */
    float nan1 = NAN;
    CHECK_STATUS(st_parse_str("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", &nan1, 4, &t),
                 MHA_E_NONFINITE);
    CHECK_ERROR_MENTIONS("w[0]");
}

/* ------------------------------------------------------------ layouts */

typedef struct {
    naive_weights w;
    float *x; /* (B,T,d_model) */
    int B, T;
} fixture;

static void fixture_make(fixture *f, int d_model, int h, int h_kv, int d_k, int d_v, int bias,
                         uint64_t seed) {
    mha_config c = mha_config_default(d_model, h);
    c.n_kv_heads = h_kv;
    c.d_k = d_k;
    c.d_v = d_v;
    c.bias = bias;
    c = naive_resolve(c);
    naive_weights_random(&f->w, &c, &seed, 0.5f);
    f->B = 2, f->T = 4;
    f->x = naive_random_floats((size_t)f->B * f->T * d_model, &seed, -1, 1);
}

static void fixture_free(fixture *f) {
    naive_weights_free(&f->w);
    free(f->x);
}

/* The loaded layer must reproduce the oracle on the original weights. */
static void check_layer_matches(mha_layer *L, const fixture *f) {
    if (!L) return;
    const mha_config *c = mha_layer_config(L);
    CHECK_INT(c->n_heads, f->w.cfg.n_heads);
    CHECK_INT(c->n_kv_heads, f->w.cfg.n_kv_heads);
    CHECK_INT(c->d_k, f->w.cfg.d_k);
    CHECK_INT(c->d_v, f->w.cfg.d_v);
    /* Y only: a consistently permuted layer has permuted Z and probs */
    size_t ny = (size_t)f->B * f->T * c->d_model;
    float *y = naive_alloc_floats(ny);
    double *want = naive_alloc_doubles(ny);
    mha_options o = naive_ref_options();
    CHECK_OK(mha_forward(L, y, NULL, f->x, NULL, f->B, f->T, f->T, &o));
    naive_forward(want, NULL, NULL, &f->w, f->x, NULL, f->B, f->T, f->T, &o);
    double d = naive_max_diff(y, want, ny);
    if (!(d <= 1e-5)) test_report(__FILE__, __LINE__, "max|Y - oracle| = %.3g > 1e-5", d);
    free(y);
    free(want);
}

/* (rows, cols) -> (cols, rows): the library's (in, out) to nn.Linear's (out, in). */
static float *transpose(const float *a, int rows, int cols) {
    float *t = naive_alloc_floats((size_t)rows * cols);
    for (int i = 0; i < rows; i++)
        for (int j = 0; j < cols; j++) t[(size_t)j * rows + i] = a[(size_t)i * cols + j];
    return t;
}

static void add2(mha_tensors *t, const char *name, const float *d, int r, int c) {
    int s[2] = {r, c};
    CHECK_OK(mha_tensors_add_f32(t, name, d, 2, s));
}

static void add1(mha_tensors *t, const char *name, const float *d, int n) {
    CHECK_OK(mha_tensors_add_f32(t, name, d, 1, &n));
}

static void test_layout_native_round_trip(void) {
    fixture f;
    fixture_make(&f, 12, 4, 2, 3, 5, 1, 101);
    mha_layer *L = naive_make_layer(&f.w), *L2 = NULL;
    int perm[4] = {2, 3, 0, 1}; /* keeps kv groups */
    CHECK_OK(mha_layer_permute_heads(L, perm));
    const char *p = tmp_path("native.safetensors");
    CHECK_OK(mha_layer_save(L, p));
    mha_load_options o = {0};
    CHECK_OK(mha_layer_load(&L2, p, &o));
    check_layer_matches(L2, &f);
    int lab[4];
    if (L2) {
        CHECK_OK(mha_layer_labels(L2, MHA_BLOCK_O, lab));
        CHECK(lab[0] == 2 && lab[1] == 3 && lab[2] == 0 && lab[3] == 1);
        CHECK_OK(mha_layer_labels(L2, MHA_BLOCK_K, lab));
        CHECK(lab[0] == 1 && lab[1] == 0);
    }
    /* the native reader needs n_heads: drop it and the error says --heads */
    mha_tensors *t;
    CHECK_OK(mha_safetensors_read(&t, p, 0));
    mha_tensors *t2;
    CHECK_OK(mha_tensors_create(&t2));
    for (int i = 0; i < mha_tensors_count(t); i++)
        CHECK_OK(mha_tensors_add(t2, mha_tensors_name(t, i), mha_tensors_get(t, mha_tensors_name(t, i))));
    mha_layer *L3 = NULL;
    CHECK_STATUS(mha_layer_from_tensors(&L3, t2, &o), MHA_E_FORMAT);
    CHECK_ERROR_MENTIONS("--heads");
    o.n_heads = 4;
    o.n_kv_heads = 2;
    CHECK_OK(mha_layer_from_tensors(&L3, t2, &o));
    check_layer_matches(L3, &f); /* labels default to 0..h-1: weights are permuted, Y is not */
    mha_layer_free(L3);
    mha_tensors_free(t);
    mha_tensors_free(t2);
    mha_layer_free(L);
    mha_layer_free(L2);
    fixture_free(&f);
}

static void test_layout_hf_gqa(void) {
    fixture f;
    fixture_make(&f, 8, 4, 2, 3, 3, 1, 202);
    const mha_config *c = &f.w.cfg;
    int qd = c->n_heads * c->d_k, kd = c->n_kv_heads * c->d_k, vd = c->n_kv_heads * c->d_v,
        od = c->n_heads * c->d_v;
    float *q = transpose(f.w.w_q, c->d_model, qd), *k = transpose(f.w.w_k, c->d_kv_in, kd),
          *v = transpose(f.w.w_v, c->d_kv_in, vd), *o = transpose(f.w.w_o, od, c->d_model);
    mha_tensors *t;
    CHECK_OK(mha_tensors_create(&t));
    add2(t, "model.layers.0.self_attn.q_proj.weight", q, qd, c->d_model);
    add2(t, "model.layers.0.self_attn.k_proj.weight", k, kd, c->d_kv_in);
    add2(t, "model.layers.0.self_attn.v_proj.weight", v, vd, c->d_kv_in);
    add2(t, "model.layers.0.self_attn.o_proj.weight", o, c->d_model, od);
    add1(t, "model.layers.0.self_attn.q_proj.bias", f.w.b_q, qd);
    add1(t, "model.layers.0.self_attn.k_proj.bias", f.w.b_k, kd);
    add1(t, "model.layers.0.self_attn.v_proj.bias", f.w.b_v, vd);
    add1(t, "model.layers.0.self_attn.o_proj.bias", f.w.b_o, c->d_model);
    mha_layout det;
    CHECK_OK(mha_layout_detect(&det, t));
    CHECK_INT(det, MHA_LAYOUT_HF);
    mha_layer *L = NULL;
    mha_load_options opt = {.layout = MHA_LAYOUT_AUTO};
    CHECK_STATUS(mha_layer_from_tensors(&L, t, &opt), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("--heads");
    opt.n_heads = 4; /* h_kv = 2 follows from k_proj's rows */
    CHECK_OK(mha_layer_from_tensors(&L, t, &opt));
    check_layer_matches(L, &f);
    mha_layer_free(L);
    L = NULL;
    /* a second layer makes the suffix ambiguous until a prefix is given */
    add2(t, "model.layers.1.self_attn.q_proj.weight", q, qd, c->d_model);
    CHECK_STATUS(mha_layer_from_tensors(&L, t, &opt), MHA_E_FORMAT);
    CHECK_ERROR_MENTIONS("--prefix");
    opt.prefix = "model.layers.0.self_attn.";
    CHECK_OK(mha_layer_from_tensors(&L, t, &opt));
    check_layer_matches(L, &f);
    mha_layer_free(L);
    L = NULL;
    /* shapes that do not fit: o_proj with the wrong width */
    mha_tensors *bad;
    CHECK_OK(mha_tensors_create(&bad));
    add2(bad, "q_proj.weight", q, qd, c->d_model);
    add2(bad, "k_proj.weight", k, kd, c->d_kv_in);
    add2(bad, "v_proj.weight", v, vd, c->d_kv_in);
    add2(bad, "o_proj.weight", o, od, c->d_model - 2 > 0 ? c->d_model - 2 : 1);
    opt.prefix = NULL;
    CHECK_STATUS(mha_layer_from_tensors(&L, bad, &opt), MHA_E_SHAPE);
    CHECK_ERROR_MENTIONS("o_proj.weight");
    mha_tensors_free(bad);
    mha_tensors_free(t);
    free(q), free(k), free(v), free(o);
    fixture_free(&f);
}

/* OPT / BART / Whisper / GPT-J names: q_proj, k_proj, v_proj and
 * out_proj (not o_proj); Whisper's k_proj has no bias (zero), the others
 * do. An encoder-decoder layer's two attentions are told apart by prefix. */
static void test_layout_hf_out_proj(void) {
    fixture f;
    fixture_make(&f, 8, 4, 4, 2, 2, 1, 222);
    const mha_config *c = &f.w.cfg;
    const int D = c->d_model, n = c->n_heads * c->d_k;
    memset(f.w.b_k, 0, sizeof(float) * (size_t)n); /* what a missing k_proj.bias means */
    float *w[4] = {transpose(f.w.w_q, D, n), transpose(f.w.w_k, D, n), transpose(f.w.w_v, D, n),
                   transpose(f.w.w_o, n, D)};
    const float *b[4] = {f.w.b_q, NULL, f.w.b_v, f.w.b_o};
    static const char *const proj[4] = {"q_proj", "k_proj", "v_proj", "out_proj"};
    static const char *const attn[2] = {"model.decoder.layers.0.self_attn.", "model.decoder.layers.0.encoder_attn."};
    mha_tensors *t;
    CHECK_OK(mha_tensors_create(&t));
    char name[96];
    for (int a = 0; a < 2; a++)
        for (int m = 0; m < 4; m++) {
            snprintf(name, sizeof name, "%s%s.weight", attn[a], proj[m]);
            add2(t, name, a ? w[3 - m] : w[m], m == 3 ? D : n, m == 3 ? n : D); /* encoder_attn: other weights */
            snprintf(name, sizeof name, "%s%s.bias", attn[a], proj[m]);
            if (b[m]) add1(t, name, b[m], m == 3 ? D : n);
        }
    mha_layout det;
    CHECK_OK(mha_layout_detect(&det, t));
    CHECK_INT(det, MHA_LAYOUT_HF);
    mha_layer *L = NULL;
    mha_load_options opt = {.n_heads = 4, .prefix = "model.decoder.layers.0.self_attn"};
    CHECK_OK(mha_layer_from_tensors(&L, t, &opt));
    check_layer_matches(L, &f);
    mha_layer_free(L);
    L = NULL;
    opt.prefix = "model.decoder.layers.0";
    CHECK_STATUS(mha_layer_from_tensors(&L, t, &opt), MHA_E_FORMAT);
    CHECK_ERROR_MENTIONS("2 layers lie inside prefix 'model.decoder.layers.0'");
    mha_tensors_free(t);
    for (int m = 0; m < 4; m++) free(w[m]);
    fixture_free(&f);
}

/* Encoder models' names, a whole layer each (attention, its LayerNorm,
 * the FFN whose output.dense.weight also ends like the attention's):
 * BERT (attention.self.query ... attention.output.dense), ViT
 * (attention.attention.query ...), DistilBERT (attention.q_lin ...
 * out_lin). --prefix names the encoder layer; layer 0 holds other
 * weights. */
static void test_layout_hf_encoders(void) {
    fixture f;
    fixture_make(&f, 8, 2, 2, 4, 4, 1, 232);
    const mha_config *c = &f.w.cfg;
    const int D = c->d_model, n = c->n_heads * c->d_k; /* D = n = 8 */
    float *w[4] = {transpose(f.w.w_q, D, n), transpose(f.w.w_k, D, n), transpose(f.w.w_v, D, n),
                   transpose(f.w.w_o, n, D)};
    const float *b[4] = {f.w.b_q, f.w.b_k, f.w.b_v, f.w.b_o};
    static const struct {
        const char *layer, *names[4], *extra;
    } models[3] = {
        {"bert.encoder.layer.%d.", {"attention.self.query", "attention.self.key", "attention.self.value",
                                    "attention.output.dense"}, "output.dense"},
        {"vit.encoder.layer.%d.", {"attention.attention.query", "attention.attention.key", "attention.attention.value",
                                   "attention.output.dense"}, "output.dense"},
        {"distilbert.transformer.layer.%d.", {"attention.q_lin", "attention.k_lin", "attention.v_lin", "attention.out_lin"},
         "ffn.lin2"},
    };
    for (int m = 0; m < 3; m++) {
        mha_tensors *t;
        CHECK_OK(mha_tensors_create(&t));
        char layer[64], name[128];
        for (int l = 0; l < 2; l++) {
            snprintf(layer, sizeof layer, models[m].layer, l);
            for (int p = 0; p < 4; p++) {
                snprintf(name, sizeof name, "%s%s.weight", layer, models[m].names[p]);
                add2(t, name, w[l ? p : 3 - p], D, n); /* layer 0: other weights */
                snprintf(name, sizeof name, "%s%s.bias", layer, models[m].names[p]);
                add1(t, name, b[p], D);
            }
            snprintf(name, sizeof name, "%s%s.weight", layer, models[m].extra);
            add2(t, name, w[0], D, n);
            snprintf(name, sizeof name, "%sattention.output.LayerNorm.weight", layer);
            add1(t, name, b[0], D);
        }
        mha_layout det;
        CHECK_OK(mha_layout_detect(&det, t));
        CHECK_INT(det, MHA_LAYOUT_HF);
        snprintf(layer, sizeof layer, models[m].layer, 1);
        mha_layer *L = NULL;
        mha_load_options opt = {.n_heads = 2, .prefix = layer};
        CHECK_OK(mha_layer_from_tensors(&L, t, &opt));
        check_layer_matches(L, &f);
        mha_layer_free(L);
        L = NULL;
        opt.prefix = NULL; /* two layers */
        CHECK_STATUS(mha_layer_from_tensors(&L, t, &opt), MHA_E_FORMAT);
        mha_tensors_free(t);
    }
    for (int p = 0; p < 4; p++) free(w[p]);
    fixture_free(&f);
}

/* Phi-3's fused qkv_proj.weight: rows of every query head, then every kv
 * head's K, then V ([Q; K; V], (out, in)), o_proj.weight; GQA with d_k =
 * d_v, h_kv from the rows. With and without biases (qkv_proj.bias). */
static void test_layout_hf_fused_qkv(void) {
    fixture f;
    fixture_make(&f, 8, 6, 2, 3, 3, 1, 212);
    const mha_config *c = &f.w.cfg;
    const int D = c->d_model, nq = c->n_heads * c->d_k, nk = c->n_kv_heads * c->d_k;
    float *q = transpose(f.w.w_q, D, nq), *k = transpose(f.w.w_k, D, nk), *v = transpose(f.w.w_v, D, nk),
          *o = transpose(f.w.w_o, nq, D);
    float *qkv = naive_alloc_floats((size_t)(nq + 2 * nk) * D), *b = naive_alloc_floats((size_t)(nq + 2 * nk));
    memcpy(qkv, q, sizeof(float) * nq * D), memcpy(qkv + (size_t)nq * D, k, sizeof(float) * nk * D);
    memcpy(qkv + (size_t)(nq + nk) * D, v, sizeof(float) * nk * D);
    memcpy(b, f.w.b_q, sizeof(float) * nq), memcpy(b + nq, f.w.b_k, sizeof(float) * nk);
    memcpy(b + nq + nk, f.w.b_v, sizeof(float) * nk);
    for (int bias = 1; bias >= 0; bias--) {
        mha_tensors *t;
        CHECK_OK(mha_tensors_create(&t));
        add2(t, "model.layers.0.self_attn.qkv_proj.weight", qkv, nq + 2 * nk, D);
        add2(t, "model.layers.0.self_attn.o_proj.weight", o, D, nq);
        add2(t, "model.layers.0.mlp.gate_up_proj.weight", qkv, nq + 2 * nk, D);
        if (bias) add1(t, "model.layers.0.self_attn.qkv_proj.bias", b, nq + 2 * nk);
        if (bias) add1(t, "model.layers.0.self_attn.o_proj.bias", f.w.b_o, D);
        mha_layout det;
        CHECK_OK(mha_layout_detect(&det, t));
        CHECK_INT(det, MHA_LAYOUT_HF);
        mha_layer *L = NULL;
        mha_load_options opt = {.n_heads = 6, .prefix = "model.layers.0"};
        CHECK_OK(mha_layer_from_tensors(&L, t, &opt));
        if (bias) check_layer_matches(L, &f);
        if (L) CHECK_INT(mha_layer_config(L)->bias, bias);
        mha_layer_free(L);
        L = NULL;
        opt.n_kv_heads = 3; /* 30 rows are not (6 + 2*3)*3 */
        CHECK_STATUS(mha_layer_from_tensors(&L, t, &opt), MHA_E_SHAPE);
        CHECK_ERROR_MENTIONS("qkv_proj.weight");
        mha_tensors_free(t);
    }
    free(q), free(k), free(v), free(o), free(qkv), free(b);
    fixture_free(&f);
}

/* A GPT-2 block's tensors under path: attention (c_attn Conv1D (in, out),
 * columns [Q | K | V]; c_proj) and the MLP, whose c_proj.weight also ends
 * in "c_proj.weight". decoy: the weights times -1 (another layer). */
static void add_gpt2_block(mha_tensors *t, const char *path, const naive_weights *w, int decoy) {
    const mha_config *c = &w->cfg;
    const int E = c->n_heads * c->d_k, D = c->d_model;
    const float sign = decoy ? -1.0f : 1.0f;
    float *ca = naive_alloc_floats((size_t)D * 3 * E), *cb = naive_alloc_floats((size_t)3 * E);
    float *co = naive_alloc_floats((size_t)E * D), *mlp = naive_alloc_floats((size_t)4 * D * D);
    const float *const part[3] = {w->w_q, w->w_k, w->w_v}, *const bias[3] = {w->b_q, w->b_k, w->b_v};
    for (int p = 0; p < 3; p++) {
        for (int i = 0; i < D; i++)
            for (int j = 0; j < E; j++) ca[(size_t)i * 3 * E + p * E + j] = sign * part[p][(size_t)i * E + j];
        for (int j = 0; j < E; j++) cb[p * E + j] = sign * bias[p][j];
    }
    for (size_t i = 0; i < (size_t)E * D; i++) co[i] = sign * w->w_o[i];
    for (size_t i = 0; i < (size_t)4 * D * D; i++) mlp[i] = 0.01f * (float)(i % 7);
    char name[96];
    static const char *const suffix[6] = {"attn.c_attn.weight", "attn.c_attn.bias", "attn.c_proj.weight",
                                          "attn.c_proj.bias", "mlp.c_fc.weight", "mlp.c_proj.weight"};
    const float *const data[6] = {ca, cb, co, w->b_o, mlp, mlp};
    const int rows[6] = {D, 3 * E, E, D, D, 4 * D}, cols[6] = {3 * E, 0, D, 0, 4 * D, D};
    for (int k = 0; k < 6; k++) {
        snprintf(name, sizeof name, "%s%s", path, suffix[k]);
        if (cols[k]) add2(t, name, data[k], rows[k], cols[k]);
        else add1(t, name, data[k], rows[k]);
    }
    free(ca), free(cb), free(co), free(mlp);
}

/* A whole model's names: --prefix may name the layer's block ("h.1",
 * "h.1.") or its attention ("h.1.attn", "h.1.attn."); the MLP's
 * c_proj.weight in the same block is not the attention's. */
static void test_layout_gpt2(void) {
    fixture f;
    fixture_make(&f, 12, 3, 3, 4, 4, 1, 303);
    mha_tensors *t;
    CHECK_OK(mha_tensors_create(&t));
    add_gpt2_block(t, "h.0.", &f.w, 1);
    add_gpt2_block(t, "h.1.", &f.w, 0);
    add_gpt2_block(t, "h.10.", &f.w, 1); /* "h.1" is not inside it */
    mha_layer *L = NULL;
    static const char *const fits[4] = {"h.1", "h.1.", "h.1.attn", "h.1.attn."};
    for (int i = 0; i < 4; i++) {
        mha_load_options opt = {.layout = i % 2 ? MHA_LAYOUT_GPT2 : MHA_LAYOUT_AUTO, .n_heads = 3, .prefix = fits[i]};
        CHECK_OK(mha_layer_from_tensors(&L, t, &opt));
        check_layer_matches(L, &f);
        mha_layer_free(L);
        L = NULL;
    }
    mha_load_options two = {.n_heads = 3, .prefix = "h"};
    CHECK_STATUS(mha_layer_from_tensors(&L, t, &two), MHA_E_FORMAT);
    CHECK_ERROR_MENTIONS("3 layers lie inside prefix 'h' ('h.0.attn.', 'h.1.attn.', 'h.10.attn.')");
    two.prefix = NULL;
    CHECK_STATUS(mha_layer_from_tensors(&L, t, &two), MHA_E_FORMAT);
    CHECK_ERROR_MENTIONS("--prefix");
    two.prefix = "h.1.at"; /* not a module of the file */
    CHECK_STATUS(mha_layer_from_tensors(&L, t, &two), MHA_E_FORMAT);
    CHECK_ERROR_MENTIONS("inside prefix 'h.1.at'");
    mha_tensors_free(t);
    CHECK_OK(mha_tensors_create(&t)); /* one block alone: no prefix needed */
    add_gpt2_block(t, "", &f.w, 0);
    mha_load_options one = {.n_heads = 3};
    CHECK_OK(mha_layer_from_tensors(&L, t, &one));
    check_layer_matches(L, &f);
    mha_layer_free(L);
    mha_tensors_free(t);
    fixture_free(&f);
}

/* Megatron's fused QKV, (out, in), rows per kv group g: the q heads of g,
 * then k_g, then v_g. */
static float *megatron_fused(const naive_weights *w, float **bias) {
    const mha_config *c = &w->cfg;
    int h = c->n_heads, g = c->n_kv_heads, d = c->d_k, D = c->d_model, rep = h / g;
    int rows = (h + 2 * g) * d;
    float *m = naive_alloc_floats((size_t)rows * D);
    *bias = naive_alloc_floats((size_t)rows);
    int r = 0;
    for (int grp = 0; grp < g; grp++) {
        for (int qh = grp * rep; qh < (grp + 1) * rep; qh++)
            for (int j = 0; j < d; j++, r++) {
                for (int i = 0; i < D; i++) m[(size_t)r * D + i] = w->w_q[(size_t)i * h * d + qh * d + j];
                (*bias)[r] = w->b_q[qh * d + j];
            }
        for (int j = 0; j < d; j++, r++) {
            for (int i = 0; i < D; i++) m[(size_t)r * D + i] = w->w_k[(size_t)i * g * d + grp * d + j];
            (*bias)[r] = w->b_k[grp * d + j];
        }
        for (int j = 0; j < d; j++, r++) {
            for (int i = 0; i < D; i++) m[(size_t)r * D + i] = w->w_v[(size_t)i * g * d + grp * d + j];
            (*bias)[r] = w->b_v[grp * d + j];
        }
    }
    return m;
}

static void test_layout_megatron_gqa(void) {
    fixture f;
    fixture_make(&f, 10, 6, 2, 4, 4, 1, 404);
    const mha_config *c = &f.w.cfg;
    float *bq, *m = megatron_fused(&f.w, &bq);
    float *dense = transpose(f.w.w_o, c->n_heads * c->d_v, c->d_model);
    int rows = (c->n_heads + 2 * c->n_kv_heads) * c->d_k;
    mha_tensors *t;
    CHECK_OK(mha_tensors_create(&t));
    add2(t, "self_attention.query_key_value.weight", m, rows, c->d_model);
    add1(t, "self_attention.query_key_value.bias", bq, rows);
    add2(t, "self_attention.dense.weight", dense, c->d_model, c->n_heads * c->d_v);
    add1(t, "self_attention.dense.bias", f.w.b_o, c->d_model);
    mha_layer *L = NULL;
    mha_load_options opt = {.layout = MHA_LAYOUT_MEGATRON, .n_heads = 6};
    CHECK_OK(mha_layer_from_tensors(&L, t, &opt)); /* h_kv = 2 from the rows */
    check_layer_matches(L, &f);
    mha_layer_free(L);
    L = NULL;
    /* a kv-head count that does not fit the rows */
    opt.n_kv_heads = 3;
    CHECK(mha_layer_from_tensors(&L, t, &opt) != MHA_OK);
    CHECK(L == NULL);
    mha_tensors_free(t);
    free(m), free(bq), free(dense);
    fixture_free(&f);
}

/* GPT-BigCode (StarCoder): GPT-2's names, but nn.Linear (out, in): c_attn
 * holds megatron's rows per kv group, MQA ([all q heads; k; v]) or one
 * group per head; c_proj is W_O^T. Beside the block's MLP (c_proj.weight
 * there too), found by --prefix naming the block. */
static void test_layout_gpt_bigcode(void) {
    for (int mqa = 1; mqa >= 0; mqa--) {
        fixture f;
        fixture_make(&f, 8, 4, mqa ? 1 : 4, 2, 2, 1, 414);
        const mha_config *c = &f.w.cfg;
        float *bq, *m = megatron_fused(&f.w, &bq);
        float *proj = transpose(f.w.w_o, c->n_heads * c->d_v, c->d_model);
        const int rows = (c->n_heads + 2 * c->n_kv_heads) * c->d_k, E = c->n_heads * c->d_v;
        mha_tensors *t;
        CHECK_OK(mha_tensors_create(&t));
        add2(t, "transformer.h.0.attn.c_attn.weight", m, rows, c->d_model);
        add1(t, "transformer.h.0.attn.c_attn.bias", bq, rows);
        add2(t, "transformer.h.0.attn.c_proj.weight", proj, c->d_model, E);
        add1(t, "transformer.h.0.attn.c_proj.bias", f.w.b_o, c->d_model);
        add2(t, "transformer.h.0.mlp.c_proj.weight", proj, c->d_model, E);
        mha_layer *L = NULL;
        mha_load_options opt = {.n_heads = 4, .prefix = "transformer.h.0"};
        CHECK_OK(mha_layer_from_tensors(&L, t, &opt)); /* h_kv from the rows */
        if (L) CHECK_INT(mha_layer_config(L)->n_kv_heads, c->n_kv_heads);
        check_layer_matches(L, &f);
        mha_layer_free(L);
        mha_tensors_free(t);
        free(m), free(bq), free(proj);
        fixture_free(&f);
    }
}

static void test_layout_torch_via_converter(void) {
    fixture f;
    fixture_make(&f, 8, 2, 2, 4, 4, 1, 505);
    const mha_config *c = &f.w.cfg;
    int E = c->d_model;
    /* in_proj_weight (3E, E) = [W_q^T; W_k^T; W_v^T] */
    float *ipw = naive_alloc_floats((size_t)3 * E * E), *ipb = naive_alloc_floats((size_t)3 * E);
    const float *ws[3] = {f.w.w_q, f.w.w_k, f.w.w_v}, *bs[3] = {f.w.b_q, f.w.b_k, f.w.b_v};
    for (int part = 0; part < 3; part++) {
        float *tr = transpose(ws[part], E, E);
        memcpy(ipw + (size_t)part * E * E, tr, (size_t)E * E * 4);
        memcpy(ipb + (size_t)part * E, bs[part], (size_t)E * 4);
        free(tr);
    }
    float *ow = transpose(f.w.w_o, E, E);
    mha_tensors *t;
    CHECK_OK(mha_tensors_create(&t));
    add2(t, "in_proj_weight", ipw, 3 * E, E);
    add1(t, "in_proj_bias", ipb, 3 * E);
    add2(t, "out_proj.weight", ow, E, E);
    add1(t, "out_proj.bias", f.w.b_o, E);
    CHECK_OK(mha_tensors_set_meta(t, "n_heads", "2"));
    mha_layer *L = NULL;
    CHECK_OK(mha_layer_from_tensors(&L, t, NULL));
    check_layer_matches(L, &f);
    mha_layer_free(L);
    L = NULL;
    mha_load_options opt = {.n_heads = 4};
    CHECK_STATUS(mha_layer_from_tensors(&L, t, &opt), MHA_E_ARG); /* disagrees with metadata */
    CHECK_ERROR_MENTIONS("metadata");
    mha_tensors_free(t);
    free(ipw), free(ipb), free(ow);
    fixture_free(&f);
}

static void test_layout_detection(void) {
    float one[4] = {0};
    int s2[2] = {2, 2};
    mha_tensors *t;
    mha_layout l;
    CHECK_OK(mha_tensors_create(&t));
    CHECK_OK(mha_tensors_add_f32(t, "foo", one, 2, s2));
    CHECK_STATUS(mha_layout_detect(&l, t), MHA_E_FORMAT);
    CHECK_ERROR_MENTIONS("no layout fits");
    CHECK_ERROR_MENTIONS("foo");
    const char *names[] = {"w_q", "w_k", "w_v", "w_o", "q_proj.weight", "k_proj.weight", "v_proj.weight",
                           "o_proj.weight"};
    for (int i = 0; i < 8; i++) CHECK_OK(mha_tensors_add_f32(t, names[i], one, 2, s2));
    CHECK_STATUS(mha_layout_detect(&l, t), MHA_E_FORMAT);
    CHECK_ERROR_MENTIONS("native, hf");
    CHECK_ERROR_MENTIONS("--layout");
    mha_tensors_free(t);
    CHECK_OK(mha_tensors_create(&t));
    CHECK_OK(mha_tensors_add_f32(t, "transformer.h.3.attn.c_attn.weight", one, 2, s2));
    CHECK_OK(mha_tensors_add_f32(t, "transformer.h.3.attn.c_proj.weight", one, 2, s2));
    CHECK_OK(mha_layout_detect(&l, t));
    CHECK_INT(l, MHA_LAYOUT_GPT2);
    mha_tensors_free(t);
    CHECK_OK(mha_layout_parse(&l, "megatron"));
    CHECK_INT(l, MHA_LAYOUT_MEGATRON);
    CHECK_STATUS(mha_layout_parse(&l, "llama"), MHA_E_ARG);
    CHECK(strcmp(mha_layout_name(MHA_LAYOUT_HF), "hf") == 0);
}


/* ------------------------------------------------- safe output files */

/* The bytes of a file (NULL when unreadable); *len its size. */
static unsigned char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    unsigned char *b = malloc(1 << 20);
    *len = b ? fread(b, 1, 1 << 20, f) : 0;
    fclose(f);
    return b;
}

/* Entries of tmp_dir other than "." and "..". */
static int dir_entries(void) {
    DIR *d = opendir(tmp_dir);
    int n = 0;
    if (!d) return -1;
    for (struct dirent *e; (e = readdir(d));) n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
    closedir(d);
    return n;
}

/* A write that fails half-way (the file-size limit, with SIGXFSZ ignored so
 * write() returns EFBIG) leaves the existing target byte-identical and no
 * temporary behind; the same write without the limit replaces it whole. */
static void test_write_failure_keeps_target(void) {
    const char *p = tmp_path("keep.npy");
    float small[4] = {1, 2, 3, 4};
    int s1[1] = {4};
    CHECK_OK(mha_npy_write_f32(p, small, 1, s1));
    size_t n0, n1;
    unsigned char *before = slurp(p, &n0);
    int before_entries = dir_entries();
    enum { N = 100000 }; /* 400 KB, above the 64 KiB limit below */
    float *big = calloc(N, sizeof *big);
    int sb[1] = {N};
    struct rlimit old, lim = {64 * 1024, 64 * 1024};
    void (*old_handler)(int) = signal(SIGXFSZ, SIG_IGN);
    CHECK(getrlimit(RLIMIT_FSIZE, &old) == 0);
    lim.rlim_max = old.rlim_max;
    CHECK(setrlimit(RLIMIT_FSIZE, &lim) == 0);
    CHECK_STATUS(mha_npy_write_f32(p, big, 1, sb), MHA_E_IO);
    CHECK_ERROR_MENTIONS("File too large");
    CHECK_ERROR_MENTIONS(p);
    mha_tensors *t;
    CHECK_OK(mha_tensors_create(&t));
    CHECK_OK(mha_tensors_add_f32(t, "big", big, 1, sb));
    CHECK_STATUS(mha_safetensors_write(p, t), MHA_E_IO);
    CHECK(setrlimit(RLIMIT_FSIZE, &old) == 0);
    signal(SIGXFSZ, old_handler);
    unsigned char *after = slurp(p, &n1);
    CHECK(before && after && n0 == n1 && memcmp(before, after, n0) == 0);
    CHECK_INT(dir_entries(), before_entries); /* no temporary left */
    free(after);
    /* without the limit the same write replaces the target whole */
    CHECK_OK(mha_npy_write_f32(p, big, 1, sb));
    mha_array a;
    CHECK_OK(mha_npy_read(&a, p, 0));
    CHECK_INT(a.count, N);
    mha_array_free(&a);
    CHECK_INT(dir_entries(), before_entries);
    mha_tensors_free(t);
    free(before);
    free(big);
}

/* I/O errors say why (strerror), and a directory is refused as a target
 * and as an input before anything is read or allocated. */
static void test_io_errors_say_why(void) {
    float v[2] = {1, 2};
    int s1[1] = {2};
    char missing[200];
    CHECK(tmp_dir_made() != NULL);
    snprintf(missing, sizeof missing, "%s/no_such_dir/y.npy", tmp_dir);
    CHECK_STATUS(mha_npy_write_f32(missing, v, 1, s1), MHA_E_IO);
    CHECK_ERROR_MENTIONS("No such file or directory");
    CHECK_STATUS(mha_npy_write_f32(tmp_dir, v, 1, s1), MHA_E_IO);
    CHECK_ERROR_MENTIONS("is a directory");
    mha_array a;
    CHECK_STATUS(mha_npy_read(&a, tmp_dir, 0), MHA_E_IO);
    CHECK_ERROR_MENTIONS("expected a regular file");
    mha_tensors *t;
    CHECK_STATUS(mha_safetensors_read(&t, tmp_dir, 0), MHA_E_IO);
    CHECK_ERROR_MENTIONS("expected a regular file");
    CHECK_STATUS(mha_npy_read(&a, missing, 0), MHA_E_IO);
    CHECK_ERROR_MENTIONS("No such file or directory");
    /* a pipe (or a device) is not replaced by a regular file */
    const char *fifo = tmp_path("pipe");
    CHECK(mkfifo(fifo, 0600) == 0);
    CHECK_STATUS(mha_npy_write_f32(fifo, v, 1, s1), MHA_E_IO);
    CHECK_ERROR_MENTIONS("not a regular file");
    struct stat st;
    CHECK(stat(fifo, &st) == 0 && S_ISFIFO(st.st_mode));
}

/* The streaming writer: sizes that are not a multiple of its chunk round
 * trip exactly, in every file dtype. */
static void test_npy_streamed_sizes(void) {
    uint64_t seed = 5;
    size_t sizes[3] = {4095, 4097, 3 * 4096 + 1};
    for (int k = 0; k < 3; k++) {
        size_t n = sizes[k];
        float *d = malloc(n * sizeof *d);
        test_fill_uniform(d, n, &seed, -2, 2);
        int sh[1] = {(int)n};
        const char *p = tmp_path("stream.npy");
        CHECK_OK(mha_npy_write_f32(p, d, 1, sh));
        mha_array a;
        CHECK_OK(mha_npy_read(&a, p, 0));
        CHECK_INT(a.count, n);
        if (a.f) CHECK_ARRAY_NEAR(a.f, d, n, 0);
        mha_array_free(&a);
        free(d);
    }
}

/* Metadata keeps insertion order; set on an existing key replaces its
 * value in place; meta_key outside [0, count) is NULL; a round trip
 * through a file keeps every key. */
static void test_tensors_meta_keys(void) {
    mha_tensors *t, *r;
    CHECK_OK(mha_tensors_create(&t));
    CHECK_INT(mha_tensors_meta_count(t), 0);
    CHECK(mha_tensors_meta_key(t, 0) == NULL);
    const char *keys[3] = {"n_heads", "d_k", "labels_q"}, *vals[3] = {"4", "8", "0,1,2,3"};
    for (int i = 0; i < 3; i++) CHECK_OK(mha_tensors_set_meta(t, keys[i], vals[i]));
    CHECK_OK(mha_tensors_set_meta(t, "d_k", "16"));
    CHECK_INT(mha_tensors_meta_count(t), 3);
    for (int i = 0; i < 3; i++)
        CHECK(mha_tensors_meta_key(t, i) && strcmp(mha_tensors_meta_key(t, i), keys[i]) == 0);
    CHECK(mha_tensors_meta_key(t, 3) == NULL && mha_tensors_meta_key(t, -1) == NULL);
    CHECK(mha_tensors_meta_key(NULL, 0) == NULL && mha_tensors_meta_count(NULL) == 0);
    CHECK(strcmp(mha_tensors_meta(t, "d_k"), "16") == 0);
    const char *p = tmp_path("meta.safetensors");
    CHECK_OK(mha_safetensors_write(p, t));
    CHECK_OK(mha_safetensors_read(&r, p, 0));
    CHECK_INT(mha_tensors_meta_count(r), 3);
    for (int i = 0; i < mha_tensors_meta_count(r); i++) {
        const char *k = mha_tensors_meta_key(r, i);
        CHECK(k && mha_tensors_meta(r, k) && strcmp(mha_tensors_meta(r, k), mha_tensors_meta(t, k)) == 0);
    }
    mha_tensors_free(t);
    mha_tensors_free(r);
}

/* CPU seconds of this process: a busy machine does not slow the clock. */
static double seconds_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* A header of n_meta metadata keys and n zero-size tensors. */
static char *many_entries_json(int n, int n_meta) {
    size_t cap = (size_t)(n + n_meta) * 80 + 64, len = 0;
    char *json = malloc(cap);
    len += (size_t)snprintf(json + len, cap - len, "{\"__metadata__\":{");
    for (int i = 0; i < n_meta; i++)
        len += (size_t)snprintf(json + len, cap - len, "%s\"key%d\":\"v%d\"", i ? "," : "", i, i);
    len += (size_t)snprintf(json + len, cap - len, "}");
    for (int i = 0; i < n; i++)
        len += (size_t)snprintf(json + len, cap - len,
                                ",\"t%d\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]}", i);
    snprintf(json + len, cap - len, "}");
    return json;
}

/* Parsing is linear in the header: 50k tensors plus 50k metadata keys
 * (below the documented limit of 2^18 header pairs) parse in under a
 * second of CPU time, and 200k of each are refused, also within a second, naming the
 * limit. The quadratic lookups took minutes. MHA_TEST_PARSE_LIMIT_S
 * overrides the second for sanitizer builds. */
static void test_st_many_entries_linear(void) {
    const char *env = getenv("MHA_TEST_PARSE_LIMIT_S");
    double limit = env ? atof(env) : 1.0;
    int sizes[2] = {50000, 200000};
    for (int k = 0; k < 2; k++) {
        int n = sizes[k];
        char *json = many_entries_json(n, n);
        mha_tensors *t = NULL;
        double t0 = seconds_now();
        mha_status s = st_parse_str(json, NULL, 0, &t);
        double dt = seconds_now() - t0;
        if (!(dt < limit))
            test_report(__FILE__, __LINE__, "%d entries: parsing took %.2f s, limit %.2f s", n, dt, limit);
        if (k == 0) {
            CHECK_OK(s);
            CHECK_INT(mha_tensors_count(t), n);
            CHECK_INT(mha_tensors_meta_count(t), n);
            CHECK(mha_tensors_get(t, "t49999") && mha_tensors_get(t, "t0"));
            CHECK(mha_tensors_meta(t, "key12345") && strcmp(mha_tensors_meta(t, "key12345"), "v12345") == 0);
        } else {
            CHECK_STATUS(s, MHA_E_UNSUPPORTED);
            CHECK_ERROR_MENTIONS("the limit is 262144");
        }
        mha_tensors_free(t);
        free(json);
    }
}

static const test_case cases[] = {
    {"io_npy_round_trip_ranks", test_npy_round_trip_ranks},
    {"io_npy_hand_built_dtypes", test_npy_hand_built_dtypes},
    {"io_npy_write_f16_bool", test_npy_write_f16_bool},
    {"io_npy_refuses_bad_files", test_npy_refuses_bad_files},
    {"io_npy_nonfinite", test_npy_nonfinite},
    {"io_st_round_trip", test_st_round_trip},
    {"io_st_hand_built_dtypes", test_st_hand_built_dtypes},
    {"io_st_refuses_bad_files", test_st_refuses_bad_files},
    {"io_layout_native_round_trip", test_layout_native_round_trip},
    {"io_layout_hf_gqa", test_layout_hf_gqa},
    {"io_layout_hf_out_proj", test_layout_hf_out_proj},
    {"io_layout_hf_encoders", test_layout_hf_encoders},
    {"io_layout_hf_fused_qkv", test_layout_hf_fused_qkv},
    {"io_layout_gpt2", test_layout_gpt2},
    {"io_layout_gpt_bigcode", test_layout_gpt_bigcode},
    {"io_layout_megatron_gqa", test_layout_megatron_gqa},
    {"io_layout_torch_via_converter", test_layout_torch_via_converter},
    {"io_layout_detection", test_layout_detection},
    {"io_write_failure_keeps_target", test_write_failure_keeps_target},
    {"io_errors_say_why", test_io_errors_say_why},
    {"io_npy_streamed_sizes", test_npy_streamed_sizes},
    {"io_tensors_meta_keys", test_tensors_meta_keys},
    {"io_st_many_entries_linear", test_st_many_entries_linear},
};

const test_case *tests_io(size_t *count) {
    *count = sizeof cases / sizeof cases[0];
    return cases;
}
