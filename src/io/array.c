/* array.c — owned arrays, element codecs (float32/float16/bfloat16/bool/
 * uint8/int8, little-endian), shared by npy.c and safetensors.c. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/bf16.h"
#include "io/io_internal.h"

size_t mha_dtype_size(mha_dtype dt) {
    switch (dt) {
    case MHA_DTYPE_F32: return 4;
    case MHA_DTYPE_F16:
    case MHA_DTYPE_BF16: return 2;
    case MHA_DTYPE_BOOL:
    case MHA_DTYPE_U8:
    case MHA_DTYPE_I8: return 1;
    case MHA_DTYPE_I32: return 4;
    case MHA_DTYPE_I64: return 8;
    }
    return 0;
}

const char *mha_dtype_name(mha_dtype dt) {
    switch (dt) {
    case MHA_DTYPE_F32: return "float32";
    case MHA_DTYPE_F16: return "float16";
    case MHA_DTYPE_BF16: return "bfloat16";
    case MHA_DTYPE_BOOL: return "bool";
    case MHA_DTYPE_U8: return "uint8";
    case MHA_DTYPE_I32: return "int32";
    case MHA_DTYPE_I64: return "int64";
    case MHA_DTYPE_I8: return "int8";
    }
    return "unknown";
}

static float bits_to_float(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint32_t float_to_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

float mha_half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
    if (exp == 0) { /* zero or subnormal: mant * 2^-24 */
        float v = ldexpf((float)mant, -24);
        return sign ? -v : v;
    }
    if (exp == 31) return bits_to_float(sign | 0x7f800000u | (mant << 13));
    return bits_to_float(sign | ((exp - 15 + 127) << 23) | (mant << 13));
}

uint16_t mha_float_to_half(float f) {
    uint32_t x = float_to_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    x &= 0x7fffffffu;
    if (x >= 0x7f800000u) return sign | 0x7c00 | (x > 0x7f800000u ? 0x200 : 0);
    if (x < 0x38800000u) /* below 2^-14: a subnormal half, units of 2^-24 */
        return sign | (uint16_t)rintf(fabsf(f) * 16777216.0f);
    uint32_t h = ((((x >> 23) - 127 + 15)) << 10) | ((x & 0x7fffff) >> 13);
    uint32_t rem = x & 0x1fff; /* the 13 dropped bits: round to nearest even */
    if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) h++; /* may carry to Inf */
    if (h > 0x7c00) h = 0x7c00;
    return sign | (uint16_t)h;
}

float mha_bf16_to_float(uint16_t b) { return bits_to_float((uint32_t)b << 16); }

void mha_array_free(mha_array *a) {
    if (!a) return;
    free(a->f);
    free(a->u8);
    free(a->i64);
    memset(a, 0, sizeof *a);
}

mha_status mha_array_alloc(mha_array *out) {
    size_t n = out->count ? out->count : 1; /* malloc(0) may return NULL */
    out->i64 = NULL;
    if (out->dtype == MHA_DTYPE_I32 || out->dtype == MHA_DTYPE_I64) {
        out->f = NULL, out->u8 = NULL;
        if (n > SIZE_MAX / sizeof(int64_t)) return mha_fail(MHA_E_NOMEM, "array of %zu integers is too large", n);
        out->i64 = malloc(n * sizeof(int64_t));
        if (!out->i64) return mha_fail(MHA_E_NOMEM, "cannot allocate %zu integers", n);
    } else if (out->dtype == MHA_DTYPE_BOOL || out->dtype == MHA_DTYPE_U8) {
        out->f = NULL;
        out->u8 = malloc(n);
        if (!out->u8) return mha_fail(MHA_E_NOMEM, "cannot allocate %zu bytes", n);
    } else {
        out->u8 = NULL;
        if (n > SIZE_MAX / sizeof(float))
            return mha_fail(MHA_E_NOMEM, "array of %zu floats is too large", n);
        out->f = mha_alloc_large(n * sizeof(float));
        if (!out->f) return mha_fail(MHA_E_NOMEM, "cannot allocate %zu floats", n);
    }
    return MHA_OK;
}

mha_status mha_shape_count(size_t *count, const int *shape, int rank, size_t elem_size,
                           const char *what, mha_status bad) {
    size_t n = 1;
    for (int i = 0; i < rank; i++) {
        if (shape[i] < 0)
            return mha_fail(bad, "%s: dimension %d is %d; expected >= 0", what, i,
                            shape[i]);
        if (shape[i] != 0 && n > SIZE_MAX / 4 / elem_size / (size_t)shape[i])
            return mha_fail(bad, "%s: shape overflows the address space; expected at most %zu bytes in all", what,
                            SIZE_MAX / 4);
        n *= (size_t)shape[i];
    }
    *count = n;
    return MHA_OK;
}

/* Elements per conversion chunk: 256 KiB of float, a unit of work big
 * enough to amortize a thread's start and small enough to balance. */
#define MHA_CONVERT_CHUNK ((size_t)1 << 16)

/* Index of the first element of f[0..n) the flags refuse, or n (the
 * library's block scan, base/error.c). */
static size_t first_refused(const float *f, size_t n, unsigned flags) {
    if (flags & MHA_IO_ALLOW_NONFINITE) return n;
    return mha_first_nonfinite(f, n, flags & MHA_IO_ALLOW_NEG_INF ? MHA_SCAN_ALLOW_NEG_INF : 0);
}

/* dst[0..n) <- n elements of floating dtype dt at src. */
static void decode_floats(float *dst, const unsigned char *src, size_t n, mha_dtype dt) {
    switch (dt) {
    case MHA_DTYPE_F32:
        if (MHA_HOST_LE_F32) memcpy(dst, src, n * sizeof(float));
        else
            for (size_t i = 0; i < n; i++) dst[i] = bits_to_float(mha_le32(src + 4 * i));
        break;
    case MHA_DTYPE_F16:
        for (size_t i = 0; i < n; i++) dst[i] = mha_half_to_float(mha_le16(src + 2 * i));
        break;
    case MHA_DTYPE_BF16:
        for (size_t i = 0; i < n; i++) dst[i] = mha_bf16_to_float(mha_le16(src + 2 * i));
        break;
    case MHA_DTYPE_I8: /* quantized weights: held as float, exactly */
        for (size_t i = 0; i < n; i++) dst[i] = (float)(int8_t)src[i];
        break;
    default: break;
    }
}

/* Decodes n elements of dt at src into dst (when dst is given) and checks
 * vals[0..n) (dst, or data borrowed from a mapping), in chunks, in parallel
 * for large float16/bfloat16 arrays. Returns the index of the first refused element
 * (the minimum over chunks, so the same for any thread count) or n. */
static size_t convert_floats(float *dst, const float *vals, const unsigned char *src, size_t n,
                             mha_dtype dt, unsigned flags) {
    const size_t es = mha_dtype_size(dt);
    const size_t chunks = (n + MHA_CONVERT_CHUNK - 1) / MHA_CONVERT_CHUNK;
    /* Threads only for the widening decodes (a few ns an element): a float32
     * copy or check is bound by memory, and a team started early spins
     * through the serial steps that follow (measured in bench/LOAD.md). */
    const int widen = dst && !(dt == MHA_DTYPE_F32 && MHA_HOST_LE_F32);
    size_t bad = n;
#pragma omp parallel for schedule(static) reduction(min : bad) if (widen && chunks >= 4)
    for (size_t c = 0; c < chunks; c++) {
        size_t i0 = c * MHA_CONVERT_CHUNK, m = n - i0 < MHA_CONVERT_CHUNK ? n - i0 : MHA_CONVERT_CHUNK;
        if (dst) decode_floats(dst + i0, src + es * i0, m, dt);
        size_t j = first_refused(vals + i0, m, flags);
        if (j < m && i0 + j < bad) bad = i0 + j;
    }
    return bad;
}

static mha_status refused(const mha_array *a, size_t i, unsigned flags, const char *what,
                          const char *tensor) {
    return mha_fail(MHA_E_NONFINITE, "%s: %s[%zu] = %g; expected a finite number%s", what,
                    tensor, i, (double)a->f[i], (flags & MHA_IO_ALLOW_NEG_INF) ? " or -inf" : "");
}

mha_status mha_array_decode(mha_array *a, const unsigned char *src, unsigned flags,
                            const char *what, const char *tensor) {
    size_t n = a->count;
    switch (a->dtype) {
    case MHA_DTYPE_BOOL:
        for (size_t i = 0; i < n; i++) {
            if (src[i] > 1)
                return mha_fail(MHA_E_FORMAT, "%s: %s[%zu] is byte %u; a bool must be 0 or 1",
                                what, tensor, i, src[i]);
            a->u8[i] = src[i];
        }
        return MHA_OK;
    case MHA_DTYPE_U8:
        memcpy(a->u8, src, n);
        return MHA_OK;
    case MHA_DTYPE_I32: /* little-endian two's complement */
        for (size_t i = 0; i < n; i++) a->i64[i] = (int64_t)(int32_t)mha_le32(src + 4 * i);
        return MHA_OK;
    case MHA_DTYPE_I64:
        for (size_t i = 0; i < n; i++)
            a->i64[i] = (int64_t)mha_le64(src + 8 * i);
        return MHA_OK;
    default: break;
    }
    size_t bad = convert_floats(a->f, a->f, src, n, a->dtype, flags);
    return bad < n ? refused(a, bad, flags, what, tensor) : MHA_OK;
}

mha_status mha_array_check(const mha_array *a, unsigned flags, const char *what,
                           const char *tensor) {
    if (!a->f) return MHA_OK;
    size_t bad = convert_floats(NULL, a->f, NULL, a->count, a->dtype, flags);
    return bad < a->count ? refused(a, bad, flags, what, tensor) : MHA_OK;
}

/* Encodes elements [first, first + n) of a into dst in file dtype dt. */
static void encode_range(unsigned char *dst, const mha_array *a, size_t first, size_t n,
                         mha_dtype dt) {
    for (size_t j = 0; j < n; j++) {
        size_t i = first + j;
        switch (dt) {
        case MHA_DTYPE_F32: {
            uint32_t u = float_to_bits(a->f[i]);
            for (int k = 0; k < 4; k++) dst[4 * j + k] = (unsigned char)(u >> (8 * k));
            break;
        }
        case MHA_DTYPE_F16: {
            uint16_t u = mha_float_to_half(a->f[i]);
            dst[2 * j] = (unsigned char)u;
            dst[2 * j + 1] = (unsigned char)(u >> 8);
            break;
        }
        case MHA_DTYPE_BF16: { /* to nearest even (exact for a bf16 layer's weights) */
            uint16_t u = mha_bf16_round_bits(a->f[i]);
            dst[2 * j] = (unsigned char)u;
            dst[2 * j + 1] = (unsigned char)(u >> 8);
            break;
        }
        case MHA_DTYPE_BOOL: dst[j] = a->u8[i] ? 1 : 0; break;
        case MHA_DTYPE_U8: dst[j] = a->u8[i]; break;
        case MHA_DTYPE_I32: /* read-only dtypes: the writers refuse them first */
        case MHA_DTYPE_I64: break;
        case MHA_DTYPE_I8: /* integers in [-128, 127] (the layer writes only those) */
            dst[j] = (unsigned char)(int8_t)lrintf(fminf(fmaxf(a->f[i], -128.0f), 127.0f));
            break;
        }
    }
}

mha_status mha_array_write(mha_out_file *o, const mha_array *a, mha_dtype dt) {
    /* float32 already in the file's byte order: one write, no copy */
    if (dt == MHA_DTYPE_F32 && MHA_HOST_LE_F32 && a->f)
        return mha_out_write(o, a->f, a->count * sizeof(float));
    enum { CHUNK = 4096 }; /* elements per write: 16 KiB of float32 */
    unsigned char buf[CHUNK * 4];
    size_t es = mha_dtype_size(dt);
    for (size_t first = 0; first < a->count; first += CHUNK) {
        size_t n = a->count - first < CHUNK ? a->count - first : CHUNK;
        encode_range(buf, a, first, n, dt);
        mha_status s = mha_out_write(o, buf, n * es);
        if (s) return s;
    }
    return MHA_OK;
}
