/* npy.c — NumPy .npy files: versions 1.0-3.0, C order, rank <= 4,
 * little-endian float32/float16, bool and uint8. The header is a Python
 * dict literal; this parser accepts exactly the three keys NumPy writes
 * and refuses everything else rather than guessing. */
#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include "io/io_internal.h"

/* A cursor over the header text [p, end). */
typedef struct {
    const char *p, *end;
    const char *name; /* file name for messages */
} cursor;

static void skip_ws(cursor *c) {
    while (c->p < c->end && (*c->p == ' ' || *c->p == '\t' || *c->p == '\n' || *c->p == '\r'))
        c->p++;
}

static int accept(cursor *c, char ch) {
    skip_ws(c);
    if (c->p < c->end && *c->p == ch) {
        c->p++;
        return 1;
    }
    return 0;
}

/* A quoted Python string without escapes, copied into out (cap bytes). */
static mha_status parse_string(cursor *c, char *out, size_t cap, const char *what) {
    skip_ws(c);
    if (c->p >= c->end || (*c->p != '\'' && *c->p != '"'))
        return mha_fail(MHA_E_FORMAT, "%s: .npy header: expected a quoted %s", c->name, what);
    char q = *c->p++;
    size_t n = 0;
    while (c->p < c->end && *c->p != q) {
        if (*c->p == '\\' || n + 1 >= cap)
            return mha_fail(MHA_E_FORMAT, "%s: .npy header: %s is not a short plain string",
                            c->name, what);
        out[n++] = *c->p++;
    }
    if (c->p >= c->end)
        return mha_fail(MHA_E_FORMAT, "%s: .npy header: unterminated %s", c->name, what);
    c->p++;
    out[n] = '\0';
    return MHA_OK;
}

/* '(' [int (',' int)* [',']] ')' with at most MHA_ARRAY_MAX_RANK ints. */
static mha_status parse_shape(cursor *c, int *shape, int *rank) {
    if (!accept(c, '('))
        return mha_fail(MHA_E_FORMAT, "%s: .npy header: 'shape' must be a tuple", c->name);
    *rank = 0;
    for (;;) {
        if (accept(c, ')')) return MHA_OK;
        skip_ws(c);
        if (c->p >= c->end || !isdigit((unsigned char)*c->p))
            return mha_fail(MHA_E_FORMAT, "%s: .npy header: shape entries must be integers >= 0",
                            c->name);
        long long v = 0;
        while (c->p < c->end && isdigit((unsigned char)*c->p)) {
            v = v * 10 + (*c->p++ - '0');
            if (v > 0x7fffffff)
                return mha_fail(MHA_E_FORMAT, "%s: .npy header: a dimension exceeds 2^31-1",
                                c->name);
        }
        if (*rank == MHA_ARRAY_MAX_RANK)
            return mha_fail(MHA_E_UNSUPPORTED, "%s: rank > %d; expected an array of rank <= %d",
                            c->name, MHA_ARRAY_MAX_RANK, MHA_ARRAY_MAX_RANK);
        shape[(*rank)++] = (int)v;
        if (accept(c, ')')) return MHA_OK;
        if (!accept(c, ','))
            return mha_fail(MHA_E_FORMAT, "%s: .npy header: expected ',' or ')' in shape",
                            c->name);
    }
}

static mha_status parse_descr(const char *d, mha_dtype *dt, const char *name, unsigned flags) {
    if (d[0] == '>' && (d[1] == 'f' || d[1] == 'i' || d[1] == 'u'))
        if (strcmp(d + 1, "u1") != 0)
            return mha_fail(MHA_E_UNSUPPORTED,
                            "%s: dtype '%s' is big-endian; expected little-endian '<f4' or '<f2'",
                            name, d);
    if (strcmp(d, "<f4") == 0) *dt = MHA_DTYPE_F32;
    else if (strcmp(d, "<f2") == 0) *dt = MHA_DTYPE_F16;
    else if (strcmp(d, "|b1") == 0) *dt = MHA_DTYPE_BOOL;
    else if (strcmp(d, "|u1") == 0 || strcmp(d, "<u1") == 0 || strcmp(d, ">u1") == 0)
        *dt = MHA_DTYPE_U8;
    else if ((flags & MHA_IO_INTEGERS) && strcmp(d, "<i4") == 0) *dt = MHA_DTYPE_I32;
    else if ((flags & MHA_IO_INTEGERS) && strcmp(d, "<i8") == 0) *dt = MHA_DTYPE_I64;
    else
        return mha_fail(MHA_E_UNSUPPORTED,
                        "%s: dtype '%s' is not supported; expected '<f4' (float32), '<f2' "
                        "(float16), '|b1' (bool) or '|u1' (uint8)%s",
                        name, d, flags & MHA_IO_INTEGERS ? ", '<i4' (int32) or '<i8' (int64)" : "");
    return MHA_OK;
}

static mha_status parse_header(cursor *c, mha_array *a, unsigned flags) {
    int seen_descr = 0, seen_order = 0, seen_shape = 0;
    if (!accept(c, '{'))
        return mha_fail(MHA_E_FORMAT, "%s: .npy header is not a dict", c->name);
    for (;;) {
        if (accept(c, '}')) break;
        char key[32];
        mha_status s = parse_string(c, key, sizeof key, "key");
        if (s) return s;
        if (!accept(c, ':'))
            return mha_fail(MHA_E_FORMAT, "%s: .npy header: expected ':' after '%s'", c->name, key);
        if (strcmp(key, "descr") == 0 && !seen_descr) {
            char d[32];
            if ((s = parse_string(c, d, sizeof d, "descr"))) return s;
            if ((s = parse_descr(d, &a->dtype, c->name, flags))) return s;
            seen_descr = 1;
        } else if (strcmp(key, "fortran_order") == 0 && !seen_order) {
            skip_ws(c);
            size_t left = (size_t)(c->end - c->p);
            if (left >= 5 && memcmp(c->p, "False", 5) == 0) {
                c->p += 5;
            } else if (left >= 4 && memcmp(c->p, "True", 4) == 0) {
                return mha_fail(MHA_E_UNSUPPORTED,
                                "%s: array is in Fortran order; expected C order "
                                "(save np.ascontiguousarray(x))",
                                c->name);
            } else {
                return mha_fail(MHA_E_FORMAT, "%s: .npy header: fortran_order must be False",
                                c->name);
            }
            seen_order = 1;
        } else if (strcmp(key, "shape") == 0 && !seen_shape) {
            if ((s = parse_shape(c, a->shape, &a->rank))) return s;
            seen_shape = 1;
        } else {
            return mha_fail(MHA_E_FORMAT, "%s: .npy header: unexpected or repeated key '%s'",
                            c->name, key);
        }
        if (accept(c, '}')) break;
        if (!accept(c, ','))
            return mha_fail(MHA_E_FORMAT, "%s: .npy header: expected ',' or '}'", c->name);
    }
    skip_ws(c);
    if (c->p != c->end)
        return mha_fail(MHA_E_FORMAT, "%s: .npy header has text after the dict", c->name);
    if (!seen_descr || !seen_order || !seen_shape)
        return mha_fail(MHA_E_FORMAT,
                        "%s: .npy header lacks %s; expected 'descr', 'fortran_order' and 'shape'",
                        c->name, !seen_descr ? "'descr'" : !seen_order ? "'fortran_order'" : "'shape'");
    return MHA_OK;
}

mha_status mha_npy_parse(mha_array *out, const void *buf, size_t len, const char *name,
                         unsigned flags) {
    if (!out || (!buf && len)) return mha_fail(MHA_E_ARG, "mha_npy_parse: NULL argument");
    memset(out, 0, sizeof *out);
    if (!name) name = "<memory>";
    const unsigned char *b = buf;
    if (len < 10 || memcmp(b, "\x93NUMPY", 6) != 0)
        return mha_fail(MHA_E_FORMAT, "%s: not a .npy file (no \\x93NUMPY magic)", name);
    unsigned major = b[6];
    size_t hlen, start;
    if (major == 1) {
        hlen = mha_le16(b + 8);
        start = 10;
    } else if (major == 2 || major == 3) {
        if (len < 12) return mha_fail(MHA_E_FORMAT, "%s: truncated .npy preamble", name);
        hlen = mha_le32(b + 8);
        start = 12;
    } else {
        return mha_fail(MHA_E_UNSUPPORTED, "%s: .npy version %u.%u; expected 1.0, 2.0 or 3.0",
                        name, major, b[7]);
    }
    if (hlen > len - start)
        return mha_fail(MHA_E_FORMAT, "%s: .npy header length %zu exceeds the file (%zu bytes)",
                        name, hlen, len);
    mha_array a = {0};
    cursor c = {(const char *)b + start, (const char *)b + start + hlen, name};
    mha_status s = parse_header(&c, &a, flags);
    if (s) return s;
    for (int i = a.rank; i < MHA_ARRAY_MAX_RANK; i++) a.shape[i] = 1;
    size_t es = mha_dtype_size(a.dtype);
    if ((s = mha_shape_count(&a.count, a.shape, a.rank, es, name, MHA_E_FORMAT))) return s;
    size_t have = len - start - hlen, want = a.count * es;
    if (have < want)
        return mha_fail(MHA_E_FORMAT, "%s: truncated: %zu data bytes, expected %zu for %s %s",
                        name, have, want, mha_dtype_name(a.dtype),
                        a.rank ? "array" : "scalar");
    if (have > want)
        return mha_fail(MHA_E_FORMAT, "%s: %zu trailing bytes after the %zu data bytes", name,
                        have - want, want);
    if ((s = mha_array_alloc(&a))) return s;
    if ((s = mha_array_decode(&a, b + start + hlen, flags, name, "array"))) {
        mha_array_free(&a);
        return s;
    }
    *out = a;
    return MHA_OK;
}

mha_status mha_npy_read(mha_array *out, const char *path, unsigned flags) {
    if (!out || !path) return mha_fail(MHA_E_ARG, "mha_npy_read: NULL argument");
    memset(out, 0, sizeof *out);
    /* mapped, so the data is decoded straight from the page cache: one copy */
    mha_file_map m;
    mha_status s = mha_map_open(&m, path);
    if (s) return s;
    s = mha_npy_parse(out, m.p, m.len, path, flags);
    if (!s && (s = mha_map_check(&m, path))) mha_array_free(out);
    mha_map_close(&m);
    return s;
}

mha_status mha_npy_write(const char *path, const mha_array *a) {
    if (!path || !a) return mha_fail(MHA_E_ARG, "mha_npy_write: NULL argument");
    const char *descr;
    switch (a->dtype) {
    case MHA_DTYPE_F32: descr = "<f4"; break;
    case MHA_DTYPE_F16: descr = "<f2"; break;
    case MHA_DTYPE_BOOL: descr = "|b1"; break;
    case MHA_DTYPE_U8: descr = "|u1"; break;
    default:
        return mha_fail(MHA_E_UNSUPPORTED, "%s: .npy has no %s; expected float32, float16, "
                        "bool or uint8", path, mha_dtype_name(a->dtype));
    }
    int floating = a->dtype == MHA_DTYPE_F32 || a->dtype == MHA_DTYPE_F16;
    if (a->rank < 0 || a->rank > MHA_ARRAY_MAX_RANK || (floating ? !a->f : !a->u8))
        return mha_fail(MHA_E_ARG, "%s: array has rank %d or no data; expected rank 0..%d",
                        path, a->rank, MHA_ARRAY_MAX_RANK);
    size_t count;
    mha_status s = mha_shape_count(&count, a->shape, a->rank, 4, path, MHA_E_ARG);
    if (s) return s;
    if (count != a->count)
        return mha_fail(MHA_E_ARG, "%s: array count %zu disagrees with its shape (%zu)", path,
                        a->count, count);

    char shape[128] = "";
    size_t n = 0;
    for (int i = 0; i < a->rank; i++)
        n += (size_t)snprintf(shape + n, sizeof shape - n, "%d,%s", a->shape[i],
                              (a->rank > 1 && i + 1 < a->rank) ? " " : "");
    if (a->rank > 1) shape[n - 1] = '\0'; /* (3, 4) but (3,) */
    char header[256];
    int hl = snprintf(header, sizeof header,
                      "{'descr': '%s', 'fortran_order': False, 'shape': (%s), }", descr, shape);
    /* pad with spaces and a newline so the data starts at a multiple of 64 */
    size_t total = 10 + (size_t)hl + 1;
    size_t pad = (64 - total % 64) % 64;
    memset(header + hl, ' ', pad);
    header[hl + pad] = '\n';
    size_t hlen = (size_t)hl + pad + 1;

    unsigned char pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0,
                             (unsigned char)(hlen & 0xff), (unsigned char)(hlen >> 8)};
    mha_out_file o;
    if ((s = mha_out_open(&o, path))) return s;
    s = mha_out_write(&o, pre, 10);
    if (!s) s = mha_out_write(&o, header, hlen);
    if (!s) s = mha_array_write(&o, a, a->dtype);
    if (s) {
        mha_out_abort(&o);
        return s;
    }
    return mha_out_commit(&o);
}

mha_status mha_npy_write_f32(const char *path, const float *data, int rank, const int *shape) {
    if (!data || rank < 0 || rank > MHA_ARRAY_MAX_RANK || (rank && !shape))
        return mha_fail(MHA_E_ARG, "mha_npy_write_f32: NULL data or rank %d outside 0..%d", rank,
                        MHA_ARRAY_MAX_RANK);
    mha_array a = {.dtype = MHA_DTYPE_F32, .rank = rank, .f = (float *)data};
    for (int i = 0; i < MHA_ARRAY_MAX_RANK; i++) a.shape[i] = i < rank ? shape[i] : 1;
    mha_status s = mha_shape_count(&a.count, a.shape, rank, 4, path, MHA_E_ARG);
    if (s) return s;
    return mha_npy_write(path, &a);
}
