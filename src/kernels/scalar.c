/* scalar.c — the portable kernels: the same contracts as the avx2 table
 * (kernels.h) in plain C, for CPUs without AVX2/FMA. */
#include <math.h>
#include <stdlib.h>

#include "kernels/kernels.h"

/* One fmaf per product, as the vector tables' FMA: a multiply and an add
 * rounded apart made the scalar backward's bias gradients exceed the
 * tolerance rule (GQA causal, d_k 16). glibc's fmaf is the FMA instruction
 * where the CPU has one. */
static void sgemm_scalar_6x16(float *c, size_t ldc, const float *a, size_t a_rs, size_t a_cs,
                              const float *b, size_t ldb, const float *bias,
                              const float *row_scale, int K, int m, int n) {
    float acc[6][16] = {{0}};
    for (int k = 0; k < K; k++) {
        const float *bk = b + (size_t)k * ldb;
        for (int i = 0; i < 6; i++) {
            float x = a[i * a_rs + (size_t)k * a_cs];
            for (int j = 0; j < 16; j++) acc[i][j] = fmaf(x, bk[j], acc[i][j]);
        }
    }
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            float v = acc[i][j] + (bias ? bias[j] : 0.0f);
            if (row_scale) v += row_scale[i] * c[i * ldc + j];
            c[i * ldc + j] = v;
        }
}

static void scores_scalar(float *s, size_t lds, const float *q, const float *kt, int d_k,
                          int rows, int npanels) {
    for (int p = 0; p < npanels; p++)
        for (int r = 0; r < rows; r += 6)
            sgemm_scalar_6x16(s + (size_t)r * lds + (size_t)p * 16, lds, q + (size_t)r * d_k, 1, 6,
                              kt + (size_t)p * d_k * 16, 16, NULL, NULL, d_k, 6, 16);
}

static void softmax_scalar(float *s, size_t lds, float *m, float *l, float *alpha,
                           const int *lo, const int *hi, int extra, int rows, int cols) {
    int padded = (cols + 15) / 16 * 16;
    for (int i = 0; i < rows; i++) {
        float *r = s + (size_t)i * lds;
        float mx = -INFINITY;
        for (int j = 0; j < padded; j++) {
            int keep = j < cols && (!lo || (j >= lo[i] && j <= hi[i]) || j >= extra);
            if (!keep) r[j] = -INFINITY;
            mx = fmaxf(mx, r[j]);
        }
        float m_new = fmaxf(m[i], mx);
        float mu = (m_new == -INFINITY) ? 0.0f : m_new;
        alpha[i] = expf(m[i] - mu);
        float sum = 0.0f;
        for (int j = 0; j < padded; j++) {
            r[j] = expf(r[j] - mu);
            sum += r[j];
        }
        l[i] = alpha[i] * l[i] + sum;
        m[i] = m_new;
    }
}

static void pv_scalar(float *o, size_t ldo, const float *p, size_t ldp, const float *v,
                      size_t ldv, const float *alpha, int rows, int nk, int dv16) {
    for (int r = 0; r < rows; r += 6)
        for (int c = 0; c < dv16; c += 16)
            sgemm_scalar_6x16(o + (size_t)r * ldo + c, ldo, p + (size_t)r * ldp, ldp, 1, v + c, ldv,
                              NULL, alpha + r, nk, 6, 16);
}

static void vexp_scalar(float *y, const float *x, size_t n) {
    for (size_t i = 0; i < n; i++) y[i] = expf(x[i]);
}

static void softcap_scalar(float *s, size_t lds, float cap, int rows, int cols) {
    for (int i = 0; i < rows; i++)
        for (int j = 0; j < cols; j++) s[(size_t)i * lds + j] = cap * tanhf(s[(size_t)i * lds + j] / cap);
}

void (*mha_attn_softcap_get(const mha_kernels *k))(float *, size_t, float, int, int) {
    return k->attn_softcap ? k->attn_softcap : softcap_scalar;
}

static void alibi_scalar(float *s, size_t lds, const int *qpos, const int *kpos, float slope, int rows,
                         int cols) {
    for (int i = 0; i < rows; i++)
        for (int j = 0; j < cols; j++) s[(size_t)i * lds + j] -= slope * (float)abs(qpos[i] - kpos[j]);
}

void (*mha_attn_alibi_get(const mha_kernels *k))(float *, size_t, const int *, const int *, float, int, int) {
    return k->attn_alibi ? k->attn_alibi : alibi_scalar;
}

static void pack_q_scalar(float *dst, const float *src, size_t src_rs, float scale, int rows, int rows6,
                          int d_k) {
    for (int i = 0; i < rows6; i++) {
        float *d = dst + (size_t)(i / MHA_MR) * d_k * MHA_MR + i % MHA_MR;
        const float *x = src + (size_t)i * src_rs;
        for (int e = 0; e < d_k; e++) d[(size_t)e * MHA_MR] = i < rows ? scale * x[e] : 0.0f;
    }
}

void (*mha_attn_pack_q_get(const mha_kernels *k))(float *, const float *, size_t, float, int, int, int) {
    return k->attn_pack_q ? k->attn_pack_q : pack_q_scalar;
}

static double key_norm_max_scalar(const float *kt, int n16, int d_k) {
    double best = 0.0;
    for (int j = 0; j < n16; j++) {
        double sq[16] = {0};
        const float *panel = kt + (size_t)j * d_k * 16;
        for (int e = 0; e < d_k; e++)
            for (int l = 0; l < 16; l++) sq[l] += (double)panel[e * 16 + l] * panel[e * 16 + l];
        for (int l = 0; l < 16; l++) best = sq[l] > best || isnan(sq[l]) ? sq[l] : best; /* NaN sticks */
    }
    return best;
}

static int all_within_scalar(const float *x, size_t n, float limit) {
    int bad = 0; /* NaN compares false: counted as bad */
#pragma omp simd reduction(| : bad)
    for (size_t i = 0; i < n; i++) bad |= !(fabsf(x[i]) <= limit);
    return !bad;
}

const mha_kernels mha_kernels_scalar = {
    "scalar", sgemm_scalar_6x16, scores_scalar, softmax_scalar, pv_scalar, vexp_scalar, softcap_scalar,
    alibi_scalar, pack_q_scalar, 6, 1, NULL, NULL, NULL, key_norm_max_scalar, all_within_scalar,
    NULL, NULL, NULL, NULL, /* no AMX */
};
