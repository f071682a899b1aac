/* scalar_decode.c — portable decode kernels (see decode_kernels.h): the
 * fallback when the CPU lacks AVX2/FMA/F16C, and the readable statement of
 * what avx2_decode.c computes.
 * Legend: m query rows, n keys (or output columns), d = d_k, dv = d_v. */
#include <math.h>
#include <string.h>

#include "kernels/decode_kernels.h"

/* binary16 from binary32, round to nearest even, as F16C's vcvtps2ph. */
static uint16_t f32_to_f16(float f) {
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    uint32_t sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((ax >> 13) & 0x3ffu)); /* quiet NaN */
    if (ax >= 0x47800000u) return (uint16_t)(sign | 0x7c00u); /* >= 65536 (or inf): inf */
    if (ax < 0x38800000u) {
        /* below 2^-14: subnormal half; scaling by 2^24 is exact, rintf
         * rounds to nearest even in the default mode. 1024 encodes 2^-14. */
        float a;
        memcpy(&a, &ax, sizeof a);
        return (uint16_t)(sign | (uint32_t)rintf(a * 0x1p24f));
    }
    uint32_t h = ((ax >> 23) - 112u) << 10 | ((ax >> 13) & 0x3ffu);
    uint32_t rem = ax & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++; /* may carry into inf: right */
    return (uint16_t)(sign | h);
}

static float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, mant = h & 0x3ffu, x;
    if (e == 0) {
        float f = (float)mant * 0x1p-24f;
        return sign ? -f : f;
    }
    if (e == 31) x = sign | 0x7f800000u | (mant << 13);
    else x = sign | ((e + 112u) << 23) | (mant << 13);
    float f;
    memcpy(&f, &x, sizeof f);
    return f;
}

/* s (m, n) = q (m, d) . K^T, K in panels of 8 keys (n/8, d, 8). */
static void scores_scalar(float *s, int lds, const float *q, int ldq, const float *kp, int m,
                          int n, int d) {
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            const float *k = kp + (size_t)(j / MHA_KPANEL) * d * MHA_KPANEL + j % MHA_KPANEL;
            float acc = 0.0f;
            for (int c = 0; c < d; c++) acc = fmaf(q[(size_t)i * ldq + c], k[(size_t)c * MHA_KPANEL], acc);
            s[(size_t)i * lds + j] = acc;
        }
}

static void scores_h_scalar(float *s, int lds, const float *q, int ldq, const uint16_t *kp, int m,
                            int n, int d) {
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            const uint16_t *k = kp + (size_t)(j / MHA_KPANEL) * d * MHA_KPANEL + j % MHA_KPANEL;
            float acc = 0.0f;
            for (int c = 0; c < d; c++)
                acc = fmaf(q[(size_t)i * ldq + c], f16_to_f32(k[(size_t)c * MHA_KPANEL]), acc);
            s[(size_t)i * lds + j] = acc;
        }
}

/* Per block of 32 dims: blk = sum of q * (float)k in dim order, then
 * acc = fma(blk, the key's block scale, acc) (decode_kernels.h). */
static void scores_q8_scalar(float *s, int lds, const float *q, int ldq, const int8_t *kq, const float *ks,
                             int m, int n, int d) {
    const int nb = (d + MHA_Q8_BLOCK - 1) / MHA_Q8_BLOCK;
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            const size_t p = (size_t)(j / MHA_KPANEL), l = (size_t)(j % MHA_KPANEL);
            float acc = 0.0f;
            for (int c0 = 0; c0 < d; c0 += MHA_Q8_BLOCK) {
                const int c1 = c0 + MHA_Q8_BLOCK < d ? c0 + MHA_Q8_BLOCK : d;
                float blk = 0.0f;
                for (int c = c0; c < c1; c++)
                    blk = fmaf(q[(size_t)i * ldq + c], (float)kq[(p * d + c) * MHA_KPANEL + l], blk);
                acc = fmaf(blk, ks[(p * nb + (size_t)(c0 / MHA_Q8_BLOCK)) * MHA_KPANEL + l], acc);
            }
            s[(size_t)i * lds + j] = acc;
        }
}

static void softmax_scalar(float *s, int lds, float *mx, float *sum, int m, int n) {
    for (int i = 0; i < m; i++) {
        float *row = s + (size_t)i * lds;
        float M = -INFINITY, l = 0.0f;
        for (int j = 0; j < n; j++) M = row[j] > M ? row[j] : M;
        for (int j = 0; j < n; j++) {
            /* exp(-inf - -inf) would be NaN: a row with no allowed key is 0 */
            row[j] = M == -INFINITY ? 0.0f : expf(row[j] - M);
            l += row[j];
        }
        mx[i] = M;
        sum[i] = l;
    }
}

/* acc (m, dv) = p (m, n) v (n, dv) */
static void accumulate_scalar(float *acc, int ldacc, const float *p, int ldp, const float *v, int m,
                              int n, int dv) {
    for (int i = 0; i < m; i++) {
        float *a = acc + (size_t)i * ldacc;
        for (int c = 0; c < dv; c++) a[c] = 0.0f;
        for (int j = 0; j < n; j++) {
            float pj = p[(size_t)i * ldp + j];
            const float *vr = v + (size_t)j * dv;
            for (int c = 0; c < dv; c++) a[c] = fmaf(pj, vr[c], a[c]);
        }
    }
}

static void accumulate_h_scalar(float *acc, int ldacc, const float *p, int ldp, const uint16_t *v,
                                int m, int n, int dv) {
    for (int i = 0; i < m; i++) {
        float *a = acc + (size_t)i * ldacc;
        for (int c = 0; c < dv; c++) a[c] = 0.0f;
        for (int j = 0; j < n; j++) {
            float pj = p[(size_t)i * ldp + j];
            for (int c = 0; c < dv; c++) a[c] = fmaf(pj, f16_to_f32(v[(size_t)j * dv + c]), a[c]);
        }
    }
}

static void accumulate_q8_scalar(float *acc, int ldacc, const float *p, int ldp, const int8_t *vq,
                                const float *vs, int m, int n, int dv) {
    int nb = (dv + MHA_Q8_BLOCK - 1) / MHA_Q8_BLOCK;
    for (int i = 0; i < m; i++) {
        float *a = acc + (size_t)i * ldacc;
        for (int c = 0; c < dv; c++) a[c] = 0.0f;
        for (int j = 0; j < n; j++) {
            float pj = p[(size_t)i * ldp + j];
            for (int c = 0; c < dv; c++) /* the scale folded into the weight */
                a[c] = fmaf(pj * vs[(size_t)j * nb + c / MHA_Q8_BLOCK], (float)vq[(size_t)j * dv + c], a[c]);
        }
    }
}

/* y (m, n) += x (m, k) w (k, n), additions in the order of k. */
static void gemm_stream_scalar(float *y, int ldy, const float *x, int ldx, const float *w,
                               int ldw, int m, int k, int n) {
    for (int kk = 0; kk < k; kk++) {
        const float *wr = w + (size_t)kk * ldw;
        for (int r = 0; r < m; r++) {
            float xr = x[(size_t)r * ldx + kk];
            float *yr = y + (size_t)r * ldy;
            for (int j = 0; j < n; j++) yr[j] = fmaf(xr, wr[j], yr[j]);
        }
    }
}

static void gemm_tile_scalar(float *y, int ldy, const float *x, int ldx, const float *w, int ldw,
                             int m, int k, int n) {
    for (int r = 0; r < m; r++) memset(y + (size_t)r * ldy, 0, (size_t)n * sizeof(float));
    gemm_stream_scalar(y, ldy, x, ldx, w, ldw, m, k, n);
}

static void axpby_scalar(float *y, const float *x, float a, float b, int n) {
    for (int i = 0; i < n; i++) y[i] = y[i] * a + x[i] * b;
}

static void to_f16_scalar(uint16_t *dst, const float *src, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] = f32_to_f16(src[i]);
}

static void from_f16_scalar(float *dst, const uint16_t *src, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] = f16_to_f32(src[i]);
}

static void from_q8_scalar(float *dst, const int8_t *src, const float *scale, size_t rows, int d, int lanes) {
    int nb = (d + MHA_Q8_BLOCK - 1) / MHA_Q8_BLOCK;
    for (size_t r = 0; r < rows; r++)
        for (int c = 0; c < d; c++)
            for (int l = 0; l < lanes; l++)
                dst[(r * d + c) * lanes + l] =
                    (float)src[(r * d + c) * lanes + l] * scale[(r * nb + c / MHA_Q8_BLOCK) * lanes + l];
}

const mha_decode_kernels mha_decode_kernels_scalar = {
    "scalar",           scores_scalar,    scores_h_scalar, softmax_scalar, accumulate_scalar,
    accumulate_h_scalar, gemm_stream_scalar, gemm_tile_scalar, axpby_scalar, to_f16_scalar,
    from_f16_scalar,
    .scores_q8 = scores_q8_scalar, .accumulate_q8 = accumulate_q8_scalar, .from_q8 = from_q8_scalar,
    .gemm_stream_bf16 = mha_gemm_stream_bf16_scalar, .gemm_stream_i8 = mha_gemm_stream_i8_scalar,
};
