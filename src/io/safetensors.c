/* safetensors.c — safetensors files: an 8-byte little-endian header length
 * N, N bytes of JSON {name: {dtype, shape, data_offsets}, "__metadata__":
 * {str: str}}, then the byte buffer the offsets index. The JSON is parsed
 * with jansson; every length, offset and shape is checked before a single
 * data byte is decoded, because the header is untrusted input. */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "io/io_internal.h"
#include "io/tensors_internal.h"

/* The header may be padded; 100 MB is the limit the format's authors use. */
#define MHA_ST_MAX_HEADER ((uint64_t)100 * 1000 * 1000)
/* Key-value pairs in the header JSON (a tensor has 4: its name, dtype,
 * shape and data_offsets; a metadata key 1). 2^18 allows 65536 tensors
 * (a whole large model has a few thousand) and keeps the worst parse near
 * 0.3 s; a header past it is refused before jansson builds its tree. */
#define MHA_ST_MAX_PAIRS 262144

/* Counts ':' outside strings: the pairs in every object of the header.
 * One pass, no allocation; a malformed string only makes the count
 * approximate, and jansson then reports the syntax error. */
static size_t count_pairs(const char *p, size_t n) {
    size_t pairs = 0;
    for (size_t i = 0; i < n; i++) {
        if (p[i] == ':') pairs++;
        else if (p[i] == '"')
            for (i++; i < n && p[i] != '"'; i++)
                if (p[i] == '\\') i++;
    }
    return pairs;
}

typedef struct {
    const char *name;
    mha_array a;      /* dtype, rank, shape, count; data filled later */
    uint64_t begin, end;
} st_entry;

static mha_status parse_dtype(mha_dtype *dt, const char *s, const char *file, const char *t) {
    if (strcmp(s, "F32") == 0) *dt = MHA_DTYPE_F32;
    else if (strcmp(s, "F16") == 0) *dt = MHA_DTYPE_F16;
    else if (strcmp(s, "BF16") == 0) *dt = MHA_DTYPE_BF16;
    else if (strcmp(s, "BOOL") == 0) *dt = MHA_DTYPE_BOOL;
    else if (strcmp(s, "U8") == 0) *dt = MHA_DTYPE_U8;
    else if (strcmp(s, "I8") == 0) *dt = MHA_DTYPE_I8;
    else
        return mha_fail(MHA_E_UNSUPPORTED,
                        "%s: tensor '%s' has dtype '%.16s'; expected F32, F16, BF16, BOOL, U8 or I8",
                        file, t, s);
    return MHA_OK;
}

/* Reads one {dtype, shape, data_offsets} entry; nothing else is allowed. */
static mha_status parse_entry(st_entry *e, json_t *v, const char *file) {
    if (!json_is_object(v))
        return mha_fail(MHA_E_FORMAT, "%s: header entry '%s' is not an object", file, e->name);
    const char *key;
    json_t *val;
    json_object_foreach(v, key, val) {
        if (strcmp(key, "dtype") && strcmp(key, "shape") && strcmp(key, "data_offsets"))
            return mha_fail(MHA_E_FORMAT,
                            "%s: tensor '%s' has unknown field '%.32s'; expected dtype, shape, "
                            "data_offsets",
                            file, e->name, key);
    }
    json_t *dt = json_object_get(v, "dtype"), *sh = json_object_get(v, "shape"),
           *off = json_object_get(v, "data_offsets");
    if (!json_is_string(dt) || !json_is_array(sh) || !json_is_array(off))
        return mha_fail(MHA_E_FORMAT,
                        "%s: tensor '%s' needs \"dtype\" (string), \"shape\" (array) and "
                        "\"data_offsets\" (array)",
                        file, e->name);
    mha_status s = parse_dtype(&e->a.dtype, json_string_value(dt), file, e->name);
    if (s) return s;
    size_t rank = json_array_size(sh);
    if (rank > MHA_ARRAY_MAX_RANK)
        return mha_fail(MHA_E_UNSUPPORTED, "%s: tensor '%s' has rank %zu; expected <= %d", file,
                        e->name, rank, MHA_ARRAY_MAX_RANK);
    e->a.rank = (int)rank;
    for (int i = 0; i < MHA_ARRAY_MAX_RANK; i++) e->a.shape[i] = 1;
    for (size_t i = 0; i < rank; i++) {
        json_t *d = json_array_get(sh, i);
        if (!json_is_integer(d) || json_integer_value(d) < 0 ||
            json_integer_value(d) > 0x7fffffff)
            return mha_fail(MHA_E_FORMAT,
                            "%s: tensor '%s' shape[%zu] is not an integer in [0, 2^31)", file,
                            e->name, i);
        e->a.shape[i] = (int)json_integer_value(d);
    }
    size_t es = mha_dtype_size(e->a.dtype);
    char what[320]; /* the message names the tensor (before: the file alone) */
    snprintf(what, sizeof what, "%.200s: tensor '%.80s'", file, e->name);
    if ((s = mha_shape_count(&e->a.count, e->a.shape, e->a.rank, es, what, MHA_E_FORMAT))) return s;
    json_t *b = json_array_get(off, 0), *en = json_array_get(off, 1);
    if (json_array_size(off) != 2 || !json_is_integer(b) || !json_is_integer(en) ||
        json_integer_value(b) < 0 || json_integer_value(en) < 0)
        return mha_fail(MHA_E_FORMAT,
                        "%s: tensor '%s' data_offsets must be [begin, end], two integers >= 0",
                        file, e->name);
    e->begin = (uint64_t)json_integer_value(b);
    e->end = (uint64_t)json_integer_value(en);
    if (e->end < e->begin)
        return mha_fail(MHA_E_FORMAT, "%s: tensor '%s' data_offsets [%llu, %llu] end before begin",
                        file, e->name, (unsigned long long)e->begin, (unsigned long long)e->end);
    if (e->end - e->begin != (uint64_t)e->a.count * es)
        return mha_fail(MHA_E_FORMAT,
                        "%s: tensor '%s' spans %llu bytes but its shape and dtype need %llu", file,
                        e->name, (unsigned long long)(e->end - e->begin),
                        (unsigned long long)((uint64_t)e->a.count * es));
    return MHA_OK;
}

static int by_begin(const void *pa, const void *pb) {
    const st_entry *a = *(st_entry *const *)pa, *b = *(st_entry *const *)pb;
    if (a->begin != b->begin) return a->begin < b->begin ? -1 : 1;
    return a->end < b->end ? -1 : a->end > b->end;
}

/* Offsets must stay inside the buffer, must not overlap, and must cover it
 * without holes (the format requires a fully indexed buffer). */
static mha_status check_extents(st_entry *e, int n, uint64_t buf_len, const char *file) {
    st_entry **order = malloc((size_t)(n ? n : 1) * sizeof *order);
    if (!order) return mha_fail(MHA_E_NOMEM, "cannot sort %d tensors", n);
    for (int i = 0; i < n; i++) order[i] = &e[i];
    qsort(order, (size_t)n, sizeof *order, by_begin);
    mha_status s = MHA_OK;
    uint64_t pos = 0;
    const char *prev = NULL;
    for (int i = 0; i < n && !s; i++) {
        st_entry *x = order[i];
        if (x->end > buf_len)
            s = mha_fail(MHA_E_FORMAT,
                         "%s: tensor '%s' data_offsets [%llu, %llu] run past the data (%llu "
                         "bytes; file truncated?)",
                         file, x->name, (unsigned long long)x->begin, (unsigned long long)x->end,
                         (unsigned long long)buf_len);
        else if (x->begin < pos && x->end > x->begin)
            s = mha_fail(MHA_E_FORMAT, "%s: tensors '%s' and '%s' overlap at byte %llu", file,
                         prev, x->name, (unsigned long long)x->begin);
        else if (x->begin > pos)
            s = mha_fail(MHA_E_FORMAT, "%s: bytes [%llu, %llu) of the data belong to no tensor",
                         file, (unsigned long long)pos, (unsigned long long)x->begin);
        if (x->end > x->begin || !prev) prev = x->name;
        if (x->end > pos) pos = x->end;
    }
    if (!s && pos != buf_len)
        s = mha_fail(MHA_E_FORMAT, "%s: %llu bytes after the last tensor belong to no tensor",
                     file, (unsigned long long)(buf_len - pos));
    free(order);
    return s;
}

static mha_status parse_metadata(mha_tensors *t, json_t *m, const char *file) {
    if (!json_is_object(m))
        return mha_fail(MHA_E_FORMAT, "%s: __metadata__ is not an object", file);
    const char *key;
    json_t *val;
    json_object_foreach(m, key, val) {
        if (!json_is_string(val))
            return mha_fail(MHA_E_FORMAT, "%s: __metadata__['%.40s'] is not a string", file, key);
        mha_status s = mha_tensors_set_meta(t, key, json_string_value(val));
        if (s) return s;
    }
    return MHA_OK;
}

/* One tensor's data: borrowed from the mapping when it is float32 in the
 * host's byte order, 4-byte aligned and not empty, else decoded into an
 * owned array. Either way checked (finiteness) before the set takes it. */
static mha_status st_take(mha_tensors *t, const st_entry *e, const unsigned char *src,
                          const mha_file_map *borrow, unsigned flags, const char *file) {
    mha_array a = e->a;
    mha_status s;
    const size_t n = strlen(e->name), f = strlen("masked_bias");
    if ((flags & MHA_IO_UNCHECKED_FILL) && (n == f || (n > f && e->name[n - f - 1] == '.')) &&
        strcmp(e->name + n - f, "masked_bias") == 0)
        flags |= MHA_IO_ALLOW_NONFINITE; /* a mask's fill value, never a weight (io_internal.h) */
    if (borrow && a.dtype == MHA_DTYPE_F32 && MHA_HOST_LE_F32 && a.count &&
        (uintptr_t)src % _Alignof(float) == 0) {
        a.f = (float *)(uintptr_t)src; /* read-only mapping: never written, never freed */
        a.u8 = NULL;
        if ((s = mha_array_check(&a, flags, file, e->name))) return s;
        if ((s = mha_tensors_take(t, e->name, &a))) return s;
        t->items[t->n - 1].borrowed = 1;
        return MHA_OK;
    }
    if ((s = mha_array_alloc(&a))) return s;
    s = mha_array_decode(&a, src, flags, file, e->name);
    if (!s) s = mha_tensors_take(t, e->name, &a);
    mha_array_free(&a);
    return s;
}

/* Parses buf[0..len); with borrow (the mapping buf lies in), float32 data
 * is borrowed instead of copied (st_take). only (NULL: every tensor): the
 * tensors inside that module (named only, without its final '.', then '.')
 * are the only ones decoded and checked; the header is validated whole. */
static mha_status st_parse(mha_tensors **out, const void *buf, size_t len, const char *name,
                           unsigned flags, const mha_file_map *borrow, const char *only) {
    if (!out || (!buf && len)) return mha_fail(MHA_E_ARG, "mha_safetensors_parse: NULL argument");
    *out = NULL;
    const char *file = name ? name : "<memory>";
    const unsigned char *b = buf;
    if (len < 8)
        return mha_fail(MHA_E_FORMAT, "%s: %zu bytes; a safetensors file starts with an 8-byte "
                        "header length", file, len);
    uint64_t n = mha_le64(b);
    if (n > (uint64_t)(len - 8))
        return mha_fail(MHA_E_FORMAT,
                        "%s: header length %llu is larger than the file (%zu bytes after the "
                        "length)",
                        file, (unsigned long long)n, len - 8);
    if (n > MHA_ST_MAX_HEADER)
        return mha_fail(MHA_E_FORMAT, "%s: header length %llu exceeds the 100 MB limit", file,
                        (unsigned long long)n);
    size_t pairs = count_pairs((const char *)b + 8, (size_t)n);
    if (pairs > MHA_ST_MAX_PAIRS)
        return mha_fail(MHA_E_UNSUPPORTED,
                        "%s: header has %zu key-value pairs; the limit is %d (65536 tensors of 4 "
                        "fields, or fewer with metadata)",
                        file, pairs, MHA_ST_MAX_PAIRS);
    json_error_t jerr;
    json_t *root = json_loadb((const char *)b + 8, (size_t)n, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        if (strstr(jerr.text, "duplicate"))
            return mha_fail(MHA_E_FORMAT, "%s: duplicate tensor name in the header (%s)", file,
                            jerr.text);
        return mha_fail(MHA_E_FORMAT, "%s: header is not valid JSON: %s (at byte %d)", file,
                        jerr.text, jerr.position);
    }
    mha_status s = MHA_OK;
    mha_tensors *t = NULL;
    st_entry *e = NULL;
    int ne = 0;
    if (!json_is_object(root)) {
        s = mha_fail(MHA_E_FORMAT, "%s: header is not a JSON object", file);
        goto done;
    }
    if ((s = mha_tensors_create(&t))) goto done;
    e = calloc(json_object_size(root) + 1, sizeof *e);
    if (!e) {
        s = mha_fail(MHA_E_NOMEM, "cannot allocate the tensor table");
        goto done;
    }
    const char *key;
    json_t *val;
    json_object_foreach(root, key, val) {
        if (strcmp(key, "__metadata__") == 0) {
            if ((s = parse_metadata(t, val, file))) goto done;
            continue;
        }
        if (key[0] == '\0') {
            s = mha_fail(MHA_E_FORMAT, "%s: a tensor has an empty name", file);
            goto done;
        }
        e[ne].name = key;
        if ((s = parse_entry(&e[ne], val, file))) goto done;
        ne++;
    }
    uint64_t buf_len = (uint64_t)(len - 8) - n;
    if ((s = check_extents(e, ne, buf_len, file))) goto done;
    /* every check passed: now decode */
    const unsigned char *data = b + 8 + n;
    size_t keep = only ? strlen(only) : 0;
    if (keep && only[keep - 1] == '.') keep--;
    for (int i = 0; i < ne && !s; i++) /* whole components: "layers.1" is not "layers.10" */
        if (!keep || (strncmp(e[i].name, only, keep) == 0 && e[i].name[keep] == '.'))
            s = st_take(t, &e[i], data + e[i].begin, borrow, flags, file);
done:
    free(e);
    json_decref(root); /* after the loop: e[].name points into root */
    if (s) {
        mha_tensors_free(t);
        return s;
    }
    *out = t;
    return MHA_OK;
}

mha_status mha_safetensors_parse(mha_tensors **out, const void *buf, size_t len,
                                 const char *name, unsigned flags) {
    return st_parse(out, buf, len, name, flags, NULL, NULL);
}

/* Maps path and parses it, borrowing (borrow = 1) or copying the data; the
 * size is checked again once every byte was read, and a borrowing set takes
 * the mapping. */
static mha_status st_read_mapped(mha_tensors **out, const char *path, unsigned flags, int borrow,
                                 const char *only) {
    if (!out || !path) return mha_fail(MHA_E_ARG, "mha_safetensors_read: NULL argument");
    *out = NULL;
    mha_file_map m;
    mha_status s = only ? mha_map_open_lazy(&m, path) : mha_map_open(&m, path); /* one layer: its pages only */
    if (s) return s;
    s = st_parse(out, m.p, m.len, path, flags, borrow ? &m : NULL, only);
    if (!s && (s = mha_map_check(&m, path))) {
        mha_tensors_free(*out);
        *out = NULL;
    }
    if (!s && borrow) (*out)->map = m; /* the set unmaps it when freed */
    else mha_map_close(&m);
    return s;
}

mha_status mha_safetensors_read(mha_tensors **out, const char *path, unsigned flags) {
    return st_read_mapped(out, path, flags, 0, NULL);
}

mha_status mha_safetensors_map(mha_tensors **out, const char *path, unsigned flags) {
    return st_read_mapped(out, path, flags, 1, NULL);
}

/* No tensor starting with `only`: every tensor, so that the caller's
 * error can list the file's names. */
static mha_status read_only(mha_tensors **out, const char *path, unsigned flags, int borrow, const char *only) {
    mha_status s = st_read_mapped(out, path, flags, borrow, only && *only ? only : NULL);
    if (s || !only || !*only || (*out)->n) return s;
    mha_tensors_free(*out);
    return st_read_mapped(out, path, flags, borrow, NULL);
}

mha_status mha_io_map_only(mha_tensors **out, const char *path, unsigned flags, const char *only) {
    return read_only(out, path, flags, 1, only);
}

mha_status mha_io_read_only(mha_tensors **out, const char *path, unsigned flags, const char *only) {
    return read_only(out, path, flags, 0, only);
}

/* Dtype written for an item: floating data as F32, except BF16 and F16
 * marked keep_dtype (rounded to nearest even; a KV cache's fp16 values
 * exactly) and I8 (the stored weights of a
 * bf16 / int8 layer); bool and bytes as they are. */
static mha_dtype file_dtype(const mha_named_array *it) {
    const mha_dtype d = it->a.dtype;
    if (d == MHA_DTYPE_BOOL || d == MHA_DTYPE_U8 || d == MHA_DTYPE_I8) return d;
    return (d == MHA_DTYPE_BF16 || d == MHA_DTYPE_F16) && it->keep_dtype ? d : MHA_DTYPE_F32;
}

static const char *st_dtype_name(mha_dtype dt) {
    return dt == MHA_DTYPE_F32 ? "F32" : dt == MHA_DTYPE_BOOL ? "BOOL" : dt == MHA_DTYPE_BF16 ? "BF16"
                                       : dt == MHA_DTYPE_F16 ? "F16"
                                       : dt == MHA_DTYPE_I8 ? "I8" : "U8";
}

/* Builds the JSON header; offsets follow insertion order. */
static json_t *build_header(const mha_tensors *t, uint64_t *total) {
    json_t *root = json_object();
    if (!root) return NULL;
    int bad = 0;
    if (t->n_meta) {
        json_t *m = json_object();
        bad |= !m || json_object_set_new(root, "__metadata__", m);
        for (int i = 0; i < t->n_meta && !bad; i++)
            bad |= json_object_set_new(m, t->meta[i].key, json_string(t->meta[i].value));
    }
    uint64_t pos = 0;
    for (int i = 0; i < t->n && !bad; i++) {
        const mha_array *a = &t->items[i].a;
        mha_dtype dt = file_dtype(&t->items[i]);
        uint64_t bytes = (uint64_t)a->count * mha_dtype_size(dt);
        json_t *shape = json_array();
        bad |= !shape;
        for (int d = 0; d < a->rank && !bad; d++)
            bad |= json_array_append_new(shape, json_integer(a->shape[d]));
        json_t *e = json_pack("{s:s, s:o, s:[I,I]}", "dtype", st_dtype_name(dt), "shape", shape,
                              "data_offsets", (json_int_t)pos, (json_int_t)(pos + bytes));
        bad |= !e || json_object_set_new(root, t->items[i].name, e);
        pos += bytes;
    }
    if (bad) {
        json_decref(root);
        return NULL;
    }
    *total = pos;
    return root;
}

mha_status mha_safetensors_write(const char *path, const mha_tensors *t) {
    if (!path || !t) return mha_fail(MHA_E_ARG, "mha_safetensors_write: NULL argument");
    for (int i = 0; i < t->n; i++)
        if (strcmp(t->items[i].name, "__metadata__") == 0)
            return mha_fail(MHA_E_ARG, "a tensor may not be named __metadata__");
    uint64_t total = 0;
    json_t *root = build_header(t, &total);
    if (!root) return mha_fail(MHA_E_NOMEM, "cannot build the safetensors header for '%s'", path);
    char *json = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    if (!json) return mha_fail(MHA_E_NOMEM, "cannot format the safetensors header for '%s'", path);
    size_t jl = strlen(json), hl = (jl + 7) / 8 * 8; /* pad with spaces to 8 bytes */
    unsigned char pre[8];
    for (int k = 0; k < 8; k++) pre[k] = (unsigned char)((uint64_t)hl >> (8 * k));
    static const char spaces[8] = "        ";
    mha_out_file o;
    mha_status s = mha_out_open(&o, path);
    if (s) {
        free(json);
        return s;
    }
    s = mha_out_write(&o, pre, 8);
    if (!s) s = mha_out_write(&o, json, jl);
    if (!s) s = mha_out_write(&o, spaces, hl - jl);
    free(json);
    for (int i = 0; i < t->n && !s; i++) s = mha_array_write(&o, &t->items[i].a, file_dtype(&t->items[i]));
    if (s) {
        mha_out_abort(&o);
        return s;
    }
    return mha_out_commit(&o);
}
