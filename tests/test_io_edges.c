/* test_io_edges.c — hostile and unusual .npy and safetensors input, parsed
 * from memory: every header parse error is refused with its status and a
 * message naming what was wrong; every dtype decodes to values written
 * down here from the IEEE encodings (not from the library's codecs); the
 * writers refuse bad arrays and round-trip every dtype they write. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tests.h"

#define TMP_DIR "/tmp"

/* A .npy buffer: magic, version `major`, the header text as given (no
 * padding), then `data_len` data bytes. Returns the length; buf >= 512. */
static size_t npy_buf(unsigned char *buf, int major, const char *header,
                      const void *data, size_t data_len) {
    size_t hl = strlen(header), start = major == 1 ? 10 : 12;
    memcpy(buf, "\x93NUMPY", 6);
    buf[6] = (unsigned char)major;
    buf[7] = 0;
    for (size_t k = 0; k < start - 8; k++) buf[8 + k] = (unsigned char)(hl >> (8 * k));
    memcpy(buf + start, header, hl);
    if (data_len) memcpy(buf + start + hl, data, data_len);
    return start + hl + data_len;
}

/* Parses a version-1 .npy with `header` and `n` data bytes; expects `want`
 * and, on failure, a message containing `mention`. */
static void npy_expect(const char *header, const void *data, size_t n, unsigned flags,
                       mha_status want, const char *mention) {
    unsigned char buf[512];
    size_t len = npy_buf(buf, 1, header, data, n);
    mha_array a;
    mha_status s = mha_npy_parse(&a, buf, len, "h.npy", flags);
    if (s != want)
        test_report(__FILE__, __LINE__, "header %s: status %d (%s), want %d", header, (int)s,
                    mha_last_error(), (int)want);
    if (s == MHA_OK) {
        mha_array_free(&a);
        return;
    }
    if (mention && !strstr(mha_last_error(), mention))
        test_report(__FILE__, __LINE__, "header %s: error \"%s\" does not mention \"%s\"", header,
                    mha_last_error(), mention);
}

#define H(descr, order, shape)                                                 \
    "{'descr': " descr ", 'fortran_order': " order ", 'shape': " shape ", }"

static void test_npy_header_errors(void) {
    const float one = 1.0f;
    struct {
        const char *header;
        mha_status want;
        const char *mention;
    } cases[] = {
        {"[1, 2]", MHA_E_FORMAT, "header is not a dict"},
        {"{descr: '<f4'}", MHA_E_FORMAT, "expected a quoted key"},
        {"{'des\\cr': '<f4'}", MHA_E_FORMAT, "key is not a short plain string"},
        {"{'a_key_longer_than_the_thirty_two_bytes_allowed': 1}", MHA_E_FORMAT,
         "key is not a short plain string"},
        {"{'descr", MHA_E_FORMAT, "unterminated key"},
        {"{'descr' '<f4'}", MHA_E_FORMAT, "expected ':' after 'descr'"},
        {"{'descr': <f4}", MHA_E_FORMAT, "expected a quoted descr"},
        {H("'>f4'", "False", "(1,)"), MHA_E_UNSUPPORTED, "'>f4' is big-endian"},
        {H("'>i8'", "False", "(1,)"), MHA_E_UNSUPPORTED, "'>i8' is big-endian"},
        {H("'<i4'", "False", "(1,)"), MHA_E_UNSUPPORTED, "dtype '<i4' is not supported"},
        {H("'<f8'", "False", "(1,)"), MHA_E_UNSUPPORTED, "expected '<f4' (float32)"},
        {H("'<f4'", "True", "(1,)"), MHA_E_UNSUPPORTED, "Fortran order; expected C order"},
        {H("'<f4'", "0", "(1,)"), MHA_E_FORMAT, "fortran_order must be False"},
        {H("'<f4'", "Fal", "(1,)"), MHA_E_FORMAT, "fortran_order must be False"},
        {H("'<f4'", "False", "[1]"), MHA_E_FORMAT, "'shape' must be a tuple"},
        {H("'<f4'", "False", "(a,)"), MHA_E_FORMAT, "shape entries must be integers >= 0"},
        {H("'<f4'", "False", "(-1,)"), MHA_E_FORMAT, "shape entries must be integers >= 0"},
        {H("'<f4'", "False", "(2147483648,)"), MHA_E_FORMAT, "a dimension exceeds 2^31-1"},
        {H("'<f4'", "False", "(1, 1, 1, 1, 1)"), MHA_E_UNSUPPORTED, "rank > 4"},
        {H("'<f4'", "False", "(1 1)"), MHA_E_FORMAT, "expected ',' or ')' in shape"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (1,), 'x': 1}", MHA_E_FORMAT,
         "unexpected or repeated key 'x'"},
        {"{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (1,)}", MHA_E_FORMAT,
         "unexpected or repeated key 'descr'"},
        {"{'descr': '<f4' 'fortran_order': False}", MHA_E_FORMAT, "expected ',' or '}'"},
        {H("'<f4'", "False", "(1,)") " x", MHA_E_FORMAT, "text after the dict"},
        {"{'fortran_order': False, 'shape': (1,)}", MHA_E_FORMAT, "lacks 'descr'"},
        {"{'descr': '<f4', 'shape': (1,)}", MHA_E_FORMAT, "lacks 'fortran_order'"},
        {"{'descr': '<f4', 'fortran_order': False}", MHA_E_FORMAT, "lacks 'shape'"},
        {H("'<f4'", "False", "(2,)"), MHA_E_FORMAT, "truncated: 4 data bytes, expected 8"},
        {H("'<f4'", "False", "()"), MHA_OK, NULL},
        {H("'<f4'", "False", "(1, )"), MHA_OK, NULL},
        {"{\"descr\":\"<f4\",\"fortran_order\":False,\"shape\":(1,)}", MHA_OK, NULL},
        {"\t{ 'descr' : '<f4' ,\r\n 'fortran_order' : False , 'shape' : ( 1 , ) } \n", MHA_OK, NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        npy_expect(cases[i].header, &one, 4, 0, cases[i].want, cases[i].mention);
    /* a scalar with two data elements: trailing bytes, named as scalar */
    const float two[2] = {1, 2};
    npy_expect(H("'<f4'", "False", "()"), two, 8, 0, MHA_E_FORMAT, "4 trailing bytes");
    npy_expect(H("'<f4'", "False", "(3,)"), two, 8, 0, MHA_E_FORMAT, "float32 array");
    npy_expect(H("'<f4'", "False", "(1, 3)"), two, 4, 0, MHA_E_FORMAT, "float32 array");
}

static void test_npy_preamble_errors(void) {
    unsigned char buf[512] = {0};
    mha_array a;
    CHECK_STATUS(mha_npy_parse(NULL, buf, 10, NULL, 0), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("mha_npy_parse: NULL argument");
    CHECK_STATUS(mha_npy_parse(&a, NULL, 10, NULL, 0), MHA_E_ARG);
    CHECK_STATUS(mha_npy_parse(&a, NULL, 0, NULL, 0), MHA_E_FORMAT);
    CHECK_ERROR_MENTIONS("<memory>: not a .npy file");
    CHECK_STATUS(mha_npy_parse(&a, "\x93NUMPX\x01\x00\x00\x00", 10, "m", 0), MHA_E_FORMAT);
    CHECK_ERROR_MENTIONS("m: not a .npy file (no \\x93NUMPY magic)");
    CHECK_STATUS(mha_npy_parse(&a, "\x93NUMPY\x01\x00\x00", 9, "m", 0), MHA_E_FORMAT);
    /* version 2 needs a 4-byte header length */
    CHECK_STATUS(mha_npy_parse(&a, "\x93NUMPY\x02\x00\x00\x00\x00", 11, "m", 0), MHA_E_FORMAT);
    CHECK_ERROR_MENTIONS("truncated .npy preamble");
    CHECK_STATUS(mha_npy_parse(&a, "\x93NUMPY\x04\x01\x00\x00\x00\x00", 12, "m", 0),
                 MHA_E_UNSUPPORTED);
    CHECK_ERROR_MENTIONS(".npy version 4.1; expected 1.0, 2.0 or 3.0");
    size_t len = npy_buf(buf, 1, H("'<f4'", "False", "(1,)"), NULL, 0);
    CHECK_STATUS(mha_npy_parse(&a, buf, len - 1, "m", 0), MHA_E_FORMAT);
    char want[96];
    snprintf(want, sizeof want, "header length %zu exceeds the file (%zu bytes)", len - 10, len - 1);
    CHECK_ERROR_MENTIONS(want);
    /* versions 2 and 3: same header, 4-byte length; values come through */
    const float v[3] = {0.5f, -2.0f, 1e30f};
    for (int major = 2; major <= 3; major++) {
        len = npy_buf(buf, major, H("'<f4'", "False", "(3,)"), v, sizeof v);
        CHECK_OK(mha_npy_parse(&a, buf, len, NULL, 0));
        CHECK(a.dtype == MHA_DTYPE_F32 && a.rank == 1 && a.shape[0] == 3 && a.count == 3);
        CHECK(a.f && a.f[0] == 0.5f && a.f[1] == -2.0f && a.f[2] == 1e30f);
        CHECK(a.shape[1] == 1 && a.shape[3] == 1);
        mha_array_free(&a);
    }
    mha_array_free(NULL); /* allowed */
    CHECK_STATUS(mha_npy_read(NULL, "x.npy", 0), MHA_E_ARG);
    CHECK_STATUS(mha_npy_read(&a, NULL, 0), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("mha_npy_read: NULL argument");
    CHECK_STATUS(mha_npy_read(&a, TMP_DIR, 0), MHA_E_IO);
    CHECK_ERROR_MENTIONS("it is a directory");
    CHECK_STATUS(mha_npy_read(&a, "/dev/null", 0), MHA_E_IO);
    CHECK_ERROR_MENTIONS("not a regular file");
}

/* Little-endian bytes of a uint16 list. */
static void le16(unsigned char *dst, const uint16_t *h, size_t n) {
    for (size_t i = 0; i < n; i++) {
        dst[2 * i] = (unsigned char)h[i];
        dst[2 * i + 1] = (unsigned char)(h[i] >> 8);
    }
}

static void test_npy_dtypes_decode(void) {
    unsigned char buf[512], d[32];
    mha_array a;
    /* float16 bit patterns and their values from the IEEE binary16 layout */
    const uint16_t h[6] = {0x3c00, 0xc000, 0x0001, 0x8001, 0x7bff, 0x3555};
    const float want[6] = {1.0f, -2.0f, 5.9604644775390625e-08f, -5.9604644775390625e-08f,
                           65504.0f, 0.333251953125f};
    le16(d, h, 6);
    size_t len = npy_buf(buf, 1, H("'<f2'", "False", "(2, 3)"), d, 12);
    CHECK_OK(mha_npy_parse(&a, buf, len, "h", 0));
    CHECK(a.dtype == MHA_DTYPE_F16 && a.rank == 2 && a.count == 6);
    for (int i = 0; i < 6 && a.f; i++) CHECK(a.f[i] == want[i]);
    mha_array_free(&a);
    /* float16 Inf and NaN: refused by default, -inf allowed by its flag */
    const uint16_t ninf = 0xfc00, pinf = 0x7c00, nan16 = 0x7e00;
    le16(d, &ninf, 1);
    npy_expect(H("'<f2'", "False", "(1,)"), d, 2, 0, MHA_E_NONFINITE, "array[0] = -inf; expected a finite number");
    npy_expect(H("'<f2'", "False", "(1,)"), d, 2, MHA_IO_ALLOW_NEG_INF, MHA_OK, NULL);
    le16(d, &pinf, 1);
    npy_expect(H("'<f2'", "False", "(1,)"), d, 2, MHA_IO_ALLOW_NEG_INF, MHA_E_NONFINITE,
               "expected a finite number or -inf");
    le16(d, &nan16, 1);
    len = npy_buf(buf, 1, H("'<f2'", "False", "(1,)"), d, 2);
    CHECK_OK(mha_npy_parse(&a, buf, len, "h", MHA_IO_ALLOW_NONFINITE));
    CHECK(a.f && a.f[0] != a.f[0]);
    mha_array_free(&a);
    /* bool: 0/1 only; uint8 under every byte-order mark NumPy may write */
    const unsigned char b[4] = {0, 1, 1, 0}, bad[2] = {1, 2};
    len = npy_buf(buf, 1, H("'|b1'", "False", "(4,)"), b, 4);
    CHECK_OK(mha_npy_parse(&a, buf, len, "b", 0));
    CHECK(a.dtype == MHA_DTYPE_BOOL && a.u8 && !a.f && a.u8[1] == 1 && a.u8[3] == 0);
    mha_array_free(&a);
    npy_expect(H("'|b1'", "False", "(2,)"), bad, 2, 0, MHA_E_FORMAT,
               "array[1] is byte 2; a bool must be 0 or 1");
    const unsigned char u[3] = {0, 200, 255};
    const char *u8_headers[3] = {H("'|u1'", "False", "(3,)"), H("'<u1'", "False", "(3,)"),
                                 H("'>u1'", "False", "(3,)")};
    for (int k = 0; k < 3; k++) {
        len = npy_buf(buf, 1, u8_headers[k], u, 3);
        CHECK_OK(mha_npy_parse(&a, buf, len, "u", 0));
        CHECK(a.dtype == MHA_DTYPE_U8 && a.u8 && a.u8[1] == 200 && a.u8[2] == 255);
        mha_array_free(&a);
    }
    /* a zero-size array is valid and owns a (1-element) buffer */
    len = npy_buf(buf, 1, H("'<f4'", "False", "(0, 5)"), NULL, 0);
    CHECK_OK(mha_npy_parse(&a, buf, len, "z", 0));
    CHECK(a.count == 0 && a.rank == 2 && a.shape[1] == 5 && a.f);
    mha_array_free(&a);
}

static void tmp_path(char *p, size_t cap, const char *name) {
    snprintf(p, cap, TMP_DIR "/mha-io-edges-%d-%s", (int)getpid(), name);
}

/* A symbolic link output is written through (the link stays, its target
 * gets the bytes; a dangling one is refused), and a 253-byte name, legal,
 * keeps its temporary's name legal too. */
static void test_npy_write_link_and_long_name(void) {
    char target[256], link_path[256], dangling[256], name[300];
    tmp_path(target, sizeof target, "target.npy");
    tmp_path(link_path, sizeof link_path, "link.npy");
    tmp_path(dangling, sizeof dangling, "dangling.npy");
    const float f[2] = {1, 2};
    const int shape[1] = {2};
    CHECK_OK(mha_npy_write_f32(target, f, 1, shape));
    unlink(link_path), unlink(dangling);
    CHECK(symlink(target, link_path) == 0);
    const float g[3] = {3, 4, 5};
    const int shape3[1] = {3};
    CHECK_OK(mha_npy_write_f32(link_path, g, 1, shape3));
    struct stat st;
    CHECK(lstat(link_path, &st) == 0 && S_ISLNK(st.st_mode));
    mha_array a = {0};
    CHECK_OK(mha_npy_read(&a, target, 0));
    CHECK(a.f && a.count == 3 && a.f[2] == 5);
    mha_array_free(&a);
    CHECK(symlink("no-such-target.npy", dangling) == 0);
    CHECK_STATUS(mha_npy_write_f32(dangling, g, 1, shape3), MHA_E_IO);
    CHECK_ERROR_MENTIONS("symbolic link whose target cannot be resolved");
    unlink(target), unlink(link_path), unlink(dangling);
    int n = snprintf(name, sizeof name, TMP_DIR "/"), k = snprintf(name + n, 32, "mha-io-edges-%d-", (int)getpid());
    memset(name + n + k, 'a', (size_t)(250 - k));
    memcpy(name + n + 250, ".st", 4); /* a 253-byte name */
    CHECK_OK(mha_npy_write_f32(name, f, 1, shape));
    CHECK(stat(name, &st) == 0);
    unlink(name);
}

static void test_npy_write_edges(void) {
    char p[256];
    tmp_path(p, sizeof p, "w.npy");
    float f[4] = {1, 2, 3, 4};
    int shape4[4] = {1, 2, 1, 2};
    mha_array a = {.dtype = MHA_DTYPE_F32, .rank = 1, .shape = {4, 1, 1, 1}, .count = 4, .f = f};
    CHECK_STATUS(mha_npy_write(NULL, &a), MHA_E_ARG);
    CHECK_STATUS(mha_npy_write(p, NULL), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("mha_npy_write: NULL argument");
    a.dtype = MHA_DTYPE_BF16;
    CHECK_STATUS(mha_npy_write(p, &a), MHA_E_UNSUPPORTED);
    CHECK_ERROR_MENTIONS(".npy has no bfloat16");
    a.dtype = MHA_DTYPE_F32;
    a.rank = 5;
    CHECK_STATUS(mha_npy_write(p, &a), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("rank 5 or no data");
    a.rank = -1;
    CHECK_STATUS(mha_npy_write(p, &a), MHA_E_ARG);
    a.rank = 1;
    a.f = NULL;
    CHECK_STATUS(mha_npy_write(p, &a), MHA_E_ARG);
    a.f = f;
    a.dtype = MHA_DTYPE_U8; /* bytes but no u8 buffer */
    CHECK_STATUS(mha_npy_write(p, &a), MHA_E_ARG);
    a.dtype = MHA_DTYPE_F32;
    a.shape[0] = -3;
    CHECK_STATUS(mha_npy_write(p, &a), MHA_E_ARG); /* the caller's shape: not a malformed file */
    CHECK_ERROR_MENTIONS("dimension 0 is -3");
    a.shape[0] = 3;
    CHECK_STATUS(mha_npy_write(p, &a), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("array count 4 disagrees with its shape (3)");
    CHECK(access(p, F_OK) != 0); /* no refusal left a file */
    CHECK_STATUS(mha_npy_write_f32(p, NULL, 1, shape4), MHA_E_ARG);
    CHECK_STATUS(mha_npy_write_f32(p, f, 5, shape4), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("rank 5 outside 0..4");
    CHECK_STATUS(mha_npy_write_f32(p, f, -1, shape4), MHA_E_ARG);
    CHECK_STATUS(mha_npy_write_f32(p, f, 2, NULL), MHA_E_ARG);
    int negative[1] = {-1};
    CHECK_STATUS(mha_npy_write_f32(p, f, 1, negative), MHA_E_ARG);
    CHECK_STATUS(mha_npy_write_f32("/nonexistent-mha-dir/w.npy", f, 1, shape4 + 1), MHA_E_IO);

    /* rank 0 and rank 4 float32 */
    mha_array r;
    CHECK_OK(mha_npy_write_f32(p, f, 0, NULL));
    CHECK_OK(mha_npy_read(&r, p, 0));
    CHECK(r.rank == 0 && r.count == 1 && r.f && r.f[0] == 1.0f);
    mha_array_free(&r);
    CHECK_OK(mha_npy_write_f32(p, f, 4, shape4));
    CHECK_OK(mha_npy_read(&r, p, 0));
    CHECK(r.rank == 4 && r.shape[1] == 2 && r.shape[3] == 2 && r.count == 4 && r.f && r.f[3] == 4.0f);
    mha_array_free(&r);

    /* float16: round to nearest even, overflow to Inf, subnormals, NaN;
     * expected halves worked out by hand from the binary16 grid */
    float h_in[8] = {1.0f + 1.0f / 2048, 1.0f + 3.0f / 2048, 65520.0f, -1e-6f,
                     9.5367431640625e-07f, 0.0f, -0.0f, 0.0f};
    h_in[7] = h_in[7] / h_in[7]; /* NaN */
    const float h_out[7] = {1.0f, 1.0f + 2.0f / 1024, 0 /* inf */, -1.0132789611816406e-06f,
                            9.5367431640625e-07f, 0.0f, -0.0f};
    mha_array h = {.dtype = MHA_DTYPE_F16, .rank = 1, .shape = {8, 1, 1, 1}, .count = 8, .f = h_in};
    CHECK_OK(mha_npy_write(p, &h));
    CHECK_STATUS(mha_npy_read(&r, p, 0), MHA_E_NONFINITE);
    CHECK_ERROR_MENTIONS("[2] = inf");
    CHECK_OK(mha_npy_read(&r, p, MHA_IO_ALLOW_NONFINITE));
    CHECK(r.dtype == MHA_DTYPE_F16 && r.count == 8);
    if (r.f) {
        CHECK(r.f[0] == h_out[0] && r.f[1] == h_out[1]);
        CHECK(isinf(r.f[2]) && r.f[2] > 0);
        CHECK(r.f[3] == h_out[3] && r.f[4] == h_out[4]);
        CHECK(r.f[5] == 0.0f && !signbit(r.f[5]) && r.f[6] == 0.0f && signbit(r.f[6]));
        CHECK(isnan(r.f[7]));
    }
    mha_array_free(&r);

    /* bool (non-zero bytes written as 1) and uint8 */
    unsigned char bytes[5] = {0, 7, 1, 255, 0};
    mha_array b = {.dtype = MHA_DTYPE_BOOL, .rank = 2, .shape = {1, 5, 1, 1}, .count = 5, .u8 = bytes};
    CHECK_OK(mha_npy_write(p, &b));
    CHECK_OK(mha_npy_read(&r, p, 0));
    CHECK(r.dtype == MHA_DTYPE_BOOL && r.u8 && r.u8[0] == 0 && r.u8[1] == 1 && r.u8[3] == 1);
    mha_array_free(&r);
    b.dtype = MHA_DTYPE_U8;
    CHECK_OK(mha_npy_write(p, &b));
    CHECK_OK(mha_npy_read(&r, p, 0));
    CHECK(r.dtype == MHA_DTYPE_U8 && r.u8 && r.u8[1] == 7 && r.u8[3] == 255);
    mha_array_free(&r);
    unlink(p);
}

/* A safetensors buffer: 8-byte length, the JSON, then `n` data bytes. */
static size_t st_buf(unsigned char *buf, const char *json, const void *data, size_t n) {
    size_t jl = strlen(json);
    for (int k = 0; k < 8; k++) buf[k] = (unsigned char)((uint64_t)jl >> (8 * k));
    memcpy(buf + 8, json, jl);
    if (n) memcpy(buf + 8 + jl, data, n);
    return 8 + jl + n;
}

static void st_expect(const char *json, size_t n, mha_status want, const char *mention) {
    static unsigned char buf[4096];
    unsigned char data[64] = {0};
    size_t len = st_buf(buf, json, data, n);
    mha_tensors *t = (mha_tensors *)1;
    mha_status s = mha_safetensors_parse(&t, buf, len, "s.st", 0);
    if (s != want)
        test_report(__FILE__, __LINE__, "json %s: status %d (%s), want %d", json, (int)s,
                    mha_last_error(), (int)want);
    if (s == MHA_OK) {
        mha_tensors_free(t);
        return;
    }
    if (t != NULL) test_report(__FILE__, __LINE__, "json %s: *out not NULL after a refusal", json);
    if (mention && !strstr(mha_last_error(), mention))
        test_report(__FILE__, __LINE__, "json %s: error \"%s\" does not mention \"%s\"", json,
                    mha_last_error(), mention);
}

static void test_safetensors_header_errors(void) {
    struct {
        const char *json;
        size_t data;
        mha_status want;
        const char *mention;
    } cases[] = {
        {"{\"a\":", 0, MHA_E_FORMAT, "header is not valid JSON"},
        {"[1,2]", 0, MHA_E_FORMAT, "header is not a JSON object"},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[],\"data_offsets\":[0,1]},"
         "\"a\":{\"dtype\":\"U8\",\"shape\":[],\"data_offsets\":[0,1]}}",
         1, MHA_E_FORMAT, "duplicate tensor name"},
        {"{\"__metadata__\":[1]}", 0, MHA_E_FORMAT, "__metadata__ is not an object"},
        {"{\"__metadata__\":{\"k\":3}}", 0, MHA_E_FORMAT, "__metadata__['k'] is not a string"},
        {"{\"\":{\"dtype\":\"U8\",\"shape\":[],\"data_offsets\":[0,1]}}", 1, MHA_E_FORMAT,
         "a tensor has an empty name"},
        {"{\"a\":5}", 0, MHA_E_FORMAT, "header entry 'a' is not an object"},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[],\"data_offsets\":[0,1],\"x\":1}}", 1, MHA_E_FORMAT,
         "unknown field 'x'"},
        {"{\"a\":{\"shape\":[],\"data_offsets\":[0,1]}}", 1, MHA_E_FORMAT, "needs \"dtype\" (string)"},
        {"{\"a\":{\"dtype\":1,\"shape\":[],\"data_offsets\":[0,1]}}", 1, MHA_E_FORMAT, "needs \"dtype\""},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":1,\"data_offsets\":[0,1]}}", 1, MHA_E_FORMAT, "\"shape\" (array)"},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[],\"data_offsets\":0}}", 1, MHA_E_FORMAT, "\"data_offsets\" (array)"},
        {"{\"a\":{\"dtype\":\"I32\",\"shape\":[],\"data_offsets\":[0,4]}}", 4, MHA_E_UNSUPPORTED,
         "tensor 'a' has dtype 'I32'; expected F32, F16, BF16, BOOL, U8 or I8"},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1],\"data_offsets\":[0,1]}}", 1,
         MHA_E_UNSUPPORTED, "tensor 'a' has rank 5; expected <= 4"},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[1,-1],\"data_offsets\":[0,1]}}", 1, MHA_E_FORMAT,
         "shape[1] is not an integer in [0, 2^31)"},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[1.5],\"data_offsets\":[0,1]}}", 1, MHA_E_FORMAT, "shape[0]"},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[2147483648],\"data_offsets\":[0,1]}}", 1, MHA_E_FORMAT,
         "shape[0] is not an integer"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2147483647,2147483647,2147483647],\"data_offsets\":[0,1]}}",
         1, MHA_E_FORMAT, "tensor 'a': shape overflows the address space; expected at most"},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0]}}", 1, MHA_E_FORMAT,
         "data_offsets must be [begin, end]"},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1,2]}}", 1, MHA_E_FORMAT, "data_offsets must be"},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[\"0\",1]}}", 1, MHA_E_FORMAT, "data_offsets must be"},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,\"1\"]}}", 1, MHA_E_FORMAT, "data_offsets must be"},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[-1,0]}}", 1, MHA_E_FORMAT, "two integers >= 0"},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,-1]}}", 1, MHA_E_FORMAT, "two integers >= 0"},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[1,0]}}", 1, MHA_E_FORMAT,
         "data_offsets [1, 0] end before begin"},
        {"{\"a\":{\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[0,2]}}", 2, MHA_E_FORMAT,
         "tensor 'a' spans 2 bytes but its shape and dtype need 4"},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]}}", 3, MHA_E_FORMAT,
         "data_offsets [0, 4] run past the data (3 bytes; file truncated?)"},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]},"
         "\"b\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[1,3]}}",
         3, MHA_E_FORMAT, "tensors 'a' and 'b' overlap at byte 1"},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
         "\"b\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[2,3]}}",
         3, MHA_E_FORMAT, "bytes [1, 2) of the data belong to no tensor"},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 3, MHA_E_FORMAT,
         "2 bytes after the last tensor belong to no tensor"},
        {"{\"b\":{\"dtype\":\"BOOL\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1, MHA_OK, NULL},
        /* zero-size tensors may share an offset with each other and with a
         * tensor that starts there; strings with escaped quotes and ':' do
         * not count as pairs */
        {"{\"z:\\\"1\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[2,2]},"
         "\"z2\":{\"dtype\":\"U8\",\"shape\":[0,3],\"data_offsets\":[2,2]},"
         "\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]},"
         "\"c\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[2,3]}}",
         3, MHA_OK, NULL},
        {"{}", 0, MHA_OK, NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        st_expect(cases[i].json, cases[i].data, cases[i].want, cases[i].mention);
}

static void test_safetensors_preamble_errors(void) {
    unsigned char buf[64] = {0};
    mha_tensors *t = NULL;
    CHECK_STATUS(mha_safetensors_parse(NULL, buf, 8, NULL, 0), MHA_E_ARG);
    CHECK_STATUS(mha_safetensors_parse(&t, NULL, 8, NULL, 0), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("mha_safetensors_parse: NULL argument");
    CHECK_STATUS(mha_safetensors_parse(&t, "\x02\0\0\0\0\0\0", 7, NULL, 0), MHA_E_FORMAT);
    CHECK_ERROR_MENTIONS("<memory>: 7 bytes; a safetensors file starts with an 8-byte header length");
    size_t len = st_buf(buf, "{}", NULL, 0);
    CHECK_STATUS(mha_safetensors_parse(&t, buf, len - 1, "f", 0), MHA_E_FORMAT);
    CHECK_ERROR_MENTIONS("header length 2 is larger than the file (1 bytes after the length)");
    CHECK(t == NULL);
    /* more key-value pairs than the limit: refused before JSON parsing */
    size_t n = 262145 + 2;
    unsigned char *big = malloc(8 + n);
    if (!big) return;
    for (int k = 0; k < 8; k++) big[k] = (unsigned char)((uint64_t)n >> (8 * k));
    big[8] = '{';
    memset(big + 9, ':', n - 2);
    big[8 + n - 1] = '}';
    CHECK_STATUS(mha_safetensors_parse(&t, big, 8 + n, "f", 0), MHA_E_UNSUPPORTED);
    CHECK_ERROR_MENTIONS("header has 262145 key-value pairs; the limit is 262144");
    free(big);
    CHECK_STATUS(mha_safetensors_read(NULL, "x", 0), MHA_E_ARG);
    CHECK_STATUS(mha_safetensors_read(&t, NULL, 0), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("mha_safetensors_read: NULL argument");
    CHECK_STATUS(mha_safetensors_read(&t, "/nonexistent-mha-dir/x.safetensors", 0), MHA_E_IO);
    CHECK_ERROR_MENTIONS("cannot open");
}

static void test_safetensors_every_dtype(void) {
    /* F32 1.5 | F16 -2, 0.5 | BF16 1.0, -3.0 | BOOL 1 0 | U8 9 — from the
     * IEEE layouts: F16 0xc000 = -2, 0x3800 = 0.5; BF16 0x3f80 = 1,
     * 0xc040 = -3 */
    const unsigned char data[4 + 4 + 4 + 2 + 1] = {0x00, 0x00, 0xc0, 0x3f, 0x00, 0xc0, 0x00, 0x38,
                                                   0x80, 0x3f, 0x40, 0xc0, 1, 0, 9};
    const char *json =
        "{\"__metadata__\":{\"format\":\"pt\",\"k\":\"v\"},"
        "\"f\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]},"
        "\"h\":{\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[4,8]},"
        "\"g\":{\"dtype\":\"BF16\",\"shape\":[1,2],\"data_offsets\":[8,12]},"
        "\"b\":{\"dtype\":\"BOOL\",\"shape\":[2,1,1],\"data_offsets\":[12,14]},"
        "\"u\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1],\"data_offsets\":[14,15]}}";
    static unsigned char buf[1024];
    size_t len = st_buf(buf, json, data, sizeof data);
    mha_tensors *t = NULL;
    CHECK_OK(mha_safetensors_parse(&t, buf, len, NULL, 0));
    if (!t) return;
    CHECK_INT(mha_tensors_count(t), 5);
    CHECK_INT(mha_tensors_meta_count(t), 2);
    CHECK(mha_tensors_meta(t, "format") && strcmp(mha_tensors_meta(t, "format"), "pt") == 0);
    const mha_array *f = mha_tensors_get(t, "f"), *h = mha_tensors_get(t, "h"),
                    *g = mha_tensors_get(t, "g"), *b = mha_tensors_get(t, "b"),
                    *u = mha_tensors_get(t, "u");
    CHECK(f && f->dtype == MHA_DTYPE_F32 && f->rank == 0 && f->f[0] == 1.5f);
    CHECK(h && h->dtype == MHA_DTYPE_F16 && h->f[0] == -2.0f && h->f[1] == 0.5f);
    CHECK(g && g->dtype == MHA_DTYPE_BF16 && g->rank == 2 && g->f[0] == 1.0f && g->f[1] == -3.0f);
    CHECK(b && b->dtype == MHA_DTYPE_BOOL && b->u8[0] == 1 && b->u8[1] == 0 && b->shape[0] == 2);
    CHECK(u && u->dtype == MHA_DTYPE_U8 && u->u8[0] == 9 && u->rank == 4);

    /* written back: floats as F32, bytes as they are, metadata kept */
    char p[256];
    tmp_path(p, sizeof p, "rt.safetensors");
    CHECK_OK(mha_safetensors_write(p, t));
    mha_tensors *r = NULL;
    CHECK_OK(mha_safetensors_read(&r, p, 0));
    if (r) {
        const mha_array *rh = mha_tensors_get(r, "h"), *rg = mha_tensors_get(r, "g"),
                        *rb = mha_tensors_get(r, "b"), *ru = mha_tensors_get(r, "u");
        CHECK(rh && rh->dtype == MHA_DTYPE_F32 && rh->f[0] == -2.0f);
        CHECK(rg && rg->dtype == MHA_DTYPE_F32 && rg->f[1] == -3.0f && rg->shape[0] == 1);
        CHECK(rb && rb->dtype == MHA_DTYPE_BOOL && rb->u8[0] == 1);
        CHECK(ru && ru->dtype == MHA_DTYPE_U8 && ru->u8[0] == 9);
        CHECK(mha_tensors_meta(r, "k") && strcmp(mha_tensors_meta(r, "k"), "v") == 0);
        mha_tensors_free(r);
    }
    CHECK_STATUS(mha_safetensors_write(NULL, t), MHA_E_ARG);
    CHECK_STATUS(mha_safetensors_write(p, NULL), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("mha_safetensors_write: NULL argument");
    CHECK_STATUS(mha_safetensors_write("/nonexistent-mha-dir/x.safetensors", t), MHA_E_IO);
    float one = 1;
    int one_shape[1] = {1};
    CHECK_OK(mha_tensors_add_f32(t, "__metadata__", &one, 1, one_shape));
    CHECK_STATUS(mha_safetensors_write(p, t), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("a tensor may not be named __metadata__");
    mha_tensors_free(t);
    unlink(p);

    /* bool bytes > 1 and non-finite floats are refused after every check */
    const unsigned char two = 2;
    len = st_buf(buf, "{\"b\":{\"dtype\":\"BOOL\",\"shape\":[1],\"data_offsets\":[0,1]}}", &two, 1);
    CHECK_STATUS(mha_safetensors_parse(&t, buf, len, "f", 0), MHA_E_FORMAT);
    CHECK_ERROR_MENTIONS("f: b[0] is byte 2; a bool must be 0 or 1");
    const unsigned char bf_ninf[2] = {0x80, 0xff};
    len = st_buf(buf, "{\"m\":{\"dtype\":\"BF16\",\"shape\":[1],\"data_offsets\":[0,2]}}", bf_ninf, 2);
    CHECK_STATUS(mha_safetensors_parse(&t, buf, len, "f", 0), MHA_E_NONFINITE);
    CHECK_ERROR_MENTIONS("f: m[0] = -inf");
    CHECK_OK(mha_safetensors_parse(&t, buf, len, "f", MHA_IO_ALLOW_NEG_INF));
    if (t) {
        const mha_array *m = mha_tensors_get(t, "m");
        CHECK(m && isinf(m->f[0]) && m->f[0] < 0);
        mha_tensors_free(t);
    }
}

/* A pipe is refused at once by every reader (opening one to read waited
 * for a writer forever), and an empty output name before any file is
 * made (its temporary went to the working directory). alarm() turns a
 * reader that blocks again into a failure instead of a hung suite. */
static void test_pipe_and_empty_name(void) {
    char fifo[256], index[256];
    tmp_path(fifo, sizeof fifo, "fifo.npy");
    tmp_path(index, sizeof index, "fifo.safetensors.index.json");
    unlink(fifo), unlink(index);
    if (mkfifo(fifo, 0600) != 0 || mkfifo(index, 0600) != 0) {
        fprintf(stderr, "test_io_edges: SKIPPED the pipe cases: mkfifo is not permitted here\n");
    } else {
        alarm(60);
        mha_array a = {0};
        CHECK_STATUS(mha_npy_read(&a, fifo, 0), MHA_E_IO);
        CHECK_ERROR_MENTIONS("not a regular file");
        mha_tensors *t = NULL;
        CHECK_STATUS(mha_safetensors_read(&t, fifo, 0), MHA_E_IO);
        CHECK_ERROR_MENTIONS("not a regular file");
        mha_layer *L = NULL;
        CHECK_STATUS(mha_layer_load(&L, index, NULL), MHA_E_IO);
        CHECK_ERROR_MENTIONS("not a regular file");
        alarm(0);
    }
    unlink(fifo), unlink(index);
    const float f[1] = {1};
    const int shape[1] = {1};
    CHECK_STATUS(mha_npy_write_f32("", f, 1, shape), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("an empty file name");
}

/* A replaced file keeps its permission bits and owner (the temporary was
 * created 0666 & ~umask by the writer: a private 0600 file came back
 * readable by all, a user's file replaced by root owned by root). */
static void test_write_keeps_mode(void) {
    char p[256];
    tmp_path(p, sizeof p, "mode.npy");
    const float f[1] = {1};
    const int shape[1] = {1};
    CHECK_OK(mha_npy_write_f32(p, f, 1, shape));
    CHECK(chmod(p, 0600) == 0);
    CHECK_OK(mha_npy_write_f32(p, f, 1, shape));
    struct stat st;
    CHECK(stat(p, &st) == 0 && (st.st_mode & 0777) == 0600);
    /* and its owner, when root replaces another user's file */
    if (getuid() == 0 && chown(p, 65534, 65534) == 0) {
        CHECK_OK(mha_npy_write_f32(p, f, 1, shape));
        CHECK(stat(p, &st) == 0 && st.st_uid == 65534 && st.st_gid == 65534);
    } else {
        fprintf(stderr, "test_io_edges: SKIPPED the owner case of write_keeps_mode: it needs root\n");
    }
    unlink(p);
}

static const test_case cases[] = {
    {"npy_header_errors", test_npy_header_errors},
    {"npy_preamble_errors", test_npy_preamble_errors},
    {"npy_dtypes_decode", test_npy_dtypes_decode},
    {"npy_write_edges", test_npy_write_edges},
    {"npy_write_link_and_long_name", test_npy_write_link_and_long_name},
    {"safetensors_header_errors", test_safetensors_header_errors},
    {"safetensors_preamble_errors", test_safetensors_preamble_errors},
    {"safetensors_every_dtype", test_safetensors_every_dtype},
    {"pipe_and_empty_name", test_pipe_and_empty_name},
    {"write_keeps_mode", test_write_keeps_mode},
};

const test_case *tests_io_edges(size_t *count) {
    *count = sizeof cases / sizeof cases[0];
    return cases;
}
