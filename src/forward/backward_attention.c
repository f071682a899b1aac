/* backward_attention.c — FlashAttention-2's backward on tiles of BQ query
 * rows x BK keys, never a (T,S) buffer:
 *   pass 1 (per query block): S = scale Q K^T + mask with an online softmax
 *          gives Z = P V and lse = m + log(l) per row;
 *   pass 2 (per key block of a kv head): P = exp(S - lse) recomputed,
 *          dP = dZ V^T, dS = P * (dP - D) with D = rowsum(dZ * Z),
 *          dV += P^T dZ and dK += scale dS^T Q over the group's heads;
 *   pass 3 (per query block): the same P and dS, dQ += scale dS K.
 * Every tile works transposed (keys as rows: S^T = K Q^T), so K and V are
 * read in place and one function (ds_tile) serves passes 2 and 3. A task
 * owns its output rows and walks its tiles in a fixed order: the result
 * does not depend on the thread count.
 * Legend: see backward_fast.h; i query, j key, e a head column;
 * dk16 / dv16 = d_k / d_v rounded up to 16. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "forward/backward_fast.h"

#define BQ 96 /* query rows per tile: a multiple of 16 (panels) and of 6 */
#define BK 96 /* keys per tile: a multiple of 6 (micro-rows) and of 16   */

/* row_scale of the micro-kernel: c = 1 * c + a b (it reads 6 entries) */
static const float ones[MHA_MR] = {1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f};

static int round16(int n) { return (n + 15) / 16 * 16; }

typedef struct {
    float *qt, *qn; /* Q_i^T scaled (BQ/16, d_k, 16); Q_i (dk16/16, BQ, 16)  */
    float *zt, *zn; /* dZ_i^T (BQ/16, d_v, 16); dZ_i (dv16/16, BQ, 16)       */
    float *kvn;     /* K_j (dk16/16, BK, 16) or V_j (dv16/16, BK, 16)         */
    float *kj, *vj; /* K_j (BK, d_k), V_j (BK, d_v) rows copied, zero padded  */
    float *st, *dt; /* (BK, BQ): S^T then P^T; dP^T then dS^T (scaled)       */
    float *acc1;    /* (max(BK, BQ), max(dk16, dv16)): dK_j, dQ_i or O_i      */
    float *acc2;    /* (BK, dv16): dV_j                                       */
    float *m, *l, *alpha, *lse, *dd; /* (BQ) per query row of the tile      */
    float *keyadd;  /* (BK) per-key padding term (-inf: masked)               */
    int *lo, *hi;   /* (BQ) causal/window key interval of each query row     */
    int eq, ek;     /* the live part of a tile: queries rounded up to 48
                       (<= BQ), keys rounded up to 6 (<= BK); small T, S
                       do not pay for whole tiles                          */
} scratch;

/* Sets the live extents for n query rows and nj keys. */
static void set_extent(scratch *w, int n, int nj) {
    w->eq = (n + 47) / 48 * 48, w->ek = (nj + MHA_MR - 1) / MHA_MR * MHA_MR;
    if (w->eq > BQ) w->eq = BQ;
}

static int scratch_init(scratch *w, int d_k, int d_v) {
    const int dk16 = round16(d_k), dv16 = round16(d_v), dmax = dk16 > dv16 ? dk16 : dv16;
    const size_t n[] = {(size_t)BQ * dk16, (size_t)BQ * dk16, (size_t)BQ * dv16, (size_t)BQ * dv16,
                        (size_t)BK * dmax, (size_t)BK * BQ, (size_t)BK * BQ,
                        (size_t)(BK > BQ ? BK : BQ) * dmax, (size_t)BK * dv16, (size_t)BQ * 5 + BK,
                        (size_t)BK * d_k, (size_t)BK * d_v};
    float **p[] = {&w->qt, &w->qn, &w->zt, &w->zn, &w->kvn, &w->st, &w->dt, &w->acc1, &w->acc2, &w->m,
                   &w->kj, &w->vj};
    int ok = 1;
    memset(w, 0, sizeof *w);
    for (size_t i = 0; i < sizeof n / sizeof n[0]; i++)
        ok &= (*p[i] = aligned_alloc(64, (n[i] * sizeof(float) + 63) / 64 * 64)) != NULL;
    w->lo = malloc(sizeof(int) * BQ * 2);
    if (!ok || !w->lo) return 0;
    memset(w->st, 0, sizeof(float) * BK * BQ), memset(w->dt, 0, sizeof(float) * BK * BQ);
    w->l = w->m + BQ, w->alpha = w->l + BQ, w->lse = w->alpha + BQ, w->dd = w->lse + BQ;
    w->keyadd = w->dd + BQ, w->hi = w->lo + BQ;
    return 1;
}

static void scratch_free(scratch *w) {
    free(w->qt), free(w->qn), free(w->zt), free(w->zn), free(w->kvn);
    free(w->st), free(w->dt), free(w->acc1), free(w->acc2), free(w->m), free(w->lo);
    free(w->kj), free(w->vj);
}

/* ------------------------------------------------------------ packing */

/* src rows [0, n) of width d (row stride ld) -> (d16/16, rows_pad, 16)
 * panels: element (row, e) at [e/16][row][e%16]; rows n..fill-1 zero. */
static void pack_rows(float *dst, const float *src, size_t ld, int n, int rows_pad, int fill, int d) {
    for (int p = 0; p < d; p += 16) {
        float *panel = dst + (size_t)p * rows_pad;
        for (int i = 0; i < fill; i++)
            for (int e = 0; e < 16; e++)
                panel[(size_t)i * 16 + e] = i < n && p + e < d ? src[(size_t)i * ld + p + e] : 0.0f;
    }
}

/* src rows [0, n) of width d -> transposed (eq/16, d, 16) panels scaled by
 * s: element (e, row) at [row/16][e][row%16]; zero padded. */
static void pack_cols(float *dst, const float *src, size_t ld, int n, int eq, int d, float s) {
    for (int p = 0; p < eq; p += 16) {
        float *panel = dst + (size_t)p * d;
        for (int i = 0; i < 16; i++)
            for (int e = 0; e < d; e++)
                panel[(size_t)e * 16 + i] = p + i < n ? s * src[(size_t)(p + i) * ld + e] : 0.0f;
    }
}

/* -------------------------------------------------------------- masks */

/* The keys [lo, hi] of 0..S-1 that causal and window allow for query i:
 * mha_mask_key's first three rules as an interval (lo > hi: none). */
static void key_interval(int *lo, int *hi, const mha_options *o, int i, int T, int S) {
    const long p = (long)i + (o->align == MHA_ALIGN_BOTTOM_RIGHT ? (long)S - T : 0);
    long a = 0, z = (long)S - 1;
    if (o->causal && p < z) z = p;
    if (o->window_left >= 0 && p - o->window_left > a) a = p - o->window_left;
    if (o->window_right >= 0 && p + o->window_right < z) z = p + o->window_right;
    *lo = a > S ? S : (int)a;
    *hi = z < -1 ? -1 : (int)z;
}

/* Fills w->lo/hi for query rows i0..i0+n-1; returns whether key block
 * [j0, j0+nj) holds a key that some row may attend (an extra key always). */
static int tile_live(scratch *w, const mha_bwd_attn *a, int i0, int n, int j0, int nj) {
    int any = j0 + nj > a->S;
    for (int i = 0; i < n; i++) {
        key_interval(&w->lo[i], &w->hi[i], a->opt, i0 + i, a->T, a->S);
        if (w->lo[i] <= w->hi[i] && w->lo[i] < j0 + nj && w->hi[i] >= j0) any = 1;
    }
    return any;
}

/* Applies every mask to st (BK, BQ) = S^T of query rows i0.. (n of them)
 * and keys j0.. (nj): forbidden entries and the padding become -inf,
 * additive terms are added. (T,S) masks go element by element through
 * mha_mask_key; otherwise the rows' intervals (tile_live) and one per-key
 * vector for the padding masks. Extra keys (j >= S) are always allowed. */
static void mask_tile(scratch *w, const mha_bwd_attn *a, int b, int r, int i0, int n, int j0, int nj) {
    const mha_options *o = a->opt;
    const int S = a->S, general = o->keep_mask.data || o->additive_mask.data;
    const int keymask = o->key_keep || o->key_additive;
    for (int j = 0; j < w->ek; j++) {
        float *row = w->st + (size_t)j * BQ;
        const int jj = j0 + j;
        if (j >= nj) {
            for (int i = 0; i < w->eq; i++) row[i] = -INFINITY;
            continue;
        }
        for (int i = n; i < w->eq; i++) row[i] = -INFINITY;
        if (jj >= S) continue;
        if (general) {
            for (int i = 0; i < n; i++) {
                double add;
                row[i] = mha_mask_key(o, b, r, i0 + i, jj, a->T, S, &add) ? row[i] + (float)add : -INFINITY;
            }
            continue;
        }
        float add = 0.0f;
        if (keymask) { /* mask.c: a false key_keep or an infinite additive term forbids */
            const size_t bj = (size_t)b * S + jj;
            add = o->key_additive ? o->key_additive[bj] : 0.0f;
            if ((o->key_keep && !o->key_keep[bj]) || isinf(add)) add = -INFINITY;
        }
        for (int i = 0; i < n; i++)
            row[i] = jj < w->lo[i] || jj > w->hi[i] ? -INFINITY : row[i] + add;
    }
}

/* -------------------------------------------------------------- tiles */

/* c (ek, eq) of a (BK, BQ) tile = x (ek, d) times the packed (eq/16, d, 16)
 * panels. */
static void rows_times_panels(float *c, const scratch *w, const float *x, const float *panels, int d,
                              const mha_kernels *kern) {
    for (int j = 0; j < w->ek; j += MHA_MR)
        for (int p = 0; p < w->eq; p += 16)
            kern->sgemm_6x16(c + (size_t)j * BQ + p, BQ, x + (size_t)j * d, (size_t)d, 1,
                             panels + (size_t)p * d, 16, NULL, NULL, d, MHA_MR, 16);
}

/* K_j and V_j of batch b, kv head g, keys j0.. (nj) into w->kj, w->vj,
 * zero padded to BK rows: the tiles never read another task's rows. */
static void load_keys(scratch *w, const mha_bwd_attn *a, int b, int g, int j0, int nj) {
    const mha_config *c = a->cfg;
    const int d_k = c->d_k, d_v = c->d_v;
    const size_t kw = (size_t)c->n_kv_heads * d_k, vw = (size_t)c->n_kv_heads * d_v;
    for (int j = 0; j < BK; j++) {
        float *kr = w->kj + (size_t)j * d_k, *vr = w->vj + (size_t)j * d_v;
        if (j >= nj) {
            memset(kr, 0, sizeof(float) * d_k), memset(vr, 0, sizeof(float) * d_v);
            continue;
        }
        memcpy(kr, a->k + ((size_t)b * a->Sx + j0 + j) * kw + (size_t)g * d_k, sizeof(float) * d_k);
        memcpy(vr, a->v + ((size_t)b * a->Sx + j0 + j) * vw + (size_t)g * d_v, sizeof(float) * d_v);
    }
}

/* acc (rows, d16) += a (rows, kn) b, a strided (element (i, k) at
 * a[i*rs + k*cs]), b packed (d16/16, b_rows, 16) of which kn rows are read. */
static void accumulate(float *acc, int d16, const float *a, size_t rs, size_t cs, int rows,
                       const float *b, int b_rows, int kn, const mha_kernels *kern) {
    for (int i = 0; i < rows; i += MHA_MR)
        for (int p = 0; p < d16; p += 16)
            kern->sgemm_6x16(acc + (size_t)i * d16 + p, d16, a + (size_t)i * rs, rs, cs,
                             b + (size_t)p * b_rows, 16, NULL, ones, kn, MHA_MR, 16);
}

/* Passes 2 and 3's shared step for head r, query rows i0.. (n), keys j0..
 * (nj), with w->qt, w->zt, w->lse, w->dd loaded for the rows and w->kj,
 * w->vj for the keys: st = P^T = exp(S^T - lse),
 * dt = scale * P^T * (dP^T - D). */
static void ds_tile(scratch *w, const mha_bwd_attn *a, const mha_kernels *kern, int b, int r, int i0,
                    int n, int j0, int nj) {
    const int d_k = a->cfg->d_k, d_v = a->cfg->d_v;
    rows_times_panels(w->st, w, w->kj, w->qt, d_k, kern);
    mask_tile(w, a, b, r, i0, n, j0, nj);
    for (int j = 0; j < w->ek; j++) {
        float *row = w->st + (size_t)j * BQ;
        for (int i = 0; i < w->eq; i++) row[i] -= w->lse[i];
        kern->vexp(row, row, (size_t)w->eq);
    }
    rows_times_panels(w->dt, w, w->vj, w->zt, d_v, kern);
    for (int j = 0; j < w->ek; j++)
        for (int i = 0; i < w->eq; i++) {
            const size_t ji = (size_t)j * BQ + i;
            w->dt[ji] = a->scale * w->st[ji] * (w->dt[ji] - w->dd[i]);
        }
}

/* Loads Q_i^T (scaled), dZ_i^T, and (with_rows) Q_i and dZ_i packed, and
 * lse, D of head r's query rows i0.. (n). */
static void load_queries(scratch *w, const mha_bwd_attn *a, const float *dd, int b, int r, int i0, int n,
                         int with_rows) {
    const mha_config *c = a->cfg;
    const int h = c->n_heads, d_k = c->d_k, d_v = c->d_v;
    const float *q = a->q + ((size_t)b * a->T + i0) * h * d_k + (size_t)r * d_k;
    const float *dz = a->dz + ((size_t)b * a->T + i0) * h * d_v + (size_t)r * d_v;
    pack_cols(w->qt, q, (size_t)h * d_k, n, w->eq, d_k, a->scale);
    pack_cols(w->zt, dz, (size_t)h * d_v, n, w->eq, d_v, 1.0f);
    if (with_rows) {
        pack_rows(w->qn, q, (size_t)h * d_k, n, BQ, w->eq, d_k);
        pack_rows(w->zn, dz, (size_t)h * d_v, n, BQ, w->eq, d_v);
    }
    const size_t row0 = ((size_t)b * h + r) * a->T + i0;
    for (int i = 0; i < BQ; i++) {
        w->lse[i] = i < n ? a->lse[row0 + i] : INFINITY; /* padding rows: P = 0 */
        w->dd[i] = i < n ? dd[row0 + i] : 0.0f;
    }
}

/* ------------------------------------------------------------- pass 1 */

static long forward_task(scratch *w, const mha_bwd_attn *a, const mha_kernels *kern, int b, int r, int i0) {
    const mha_config *c = a->cfg;
    const int h = c->n_heads, g = mha_kv_head(c, r), d_k = c->d_k, d_v = c->d_v, dv16 = round16(d_v);
    const int n = a->T - i0 < BQ ? a->T - i0 : BQ;
    set_extent(w, n, BK);
    pack_cols(w->qt, a->q + ((size_t)b * a->T + i0) * h * d_k + (size_t)r * d_k, (size_t)h * d_k, n, w->eq,
              d_k, a->scale);
    for (int i = 0; i < BQ; i++) w->m[i] = -INFINITY, w->l[i] = 0.0f;
    memset(w->acc1, 0, sizeof(float) * BQ * dv16);
    for (int j0 = 0; j0 < a->Sx; j0 += BK) {
        const int nj = a->Sx - j0 < BK ? a->Sx - j0 : BK;
        if (!tile_live(w, a, i0, n, j0, nj)) continue;
        set_extent(w, n, nj);
        load_keys(w, a, b, g, j0, nj);
        rows_times_panels(w->st, w, w->kj, w->qt, d_k, kern);
        mask_tile(w, a, b, r, i0, n, j0, nj);
        // --- online softmax: m_new = max(m, tile max); p = exp(s - m_new); l = alpha l + sum p
        float *mx = w->lse; /* the tile's column maxima, then m_new (0 for -inf) */
        for (int i = 0; i < BQ; i++) mx[i] = w->m[i];
        for (int j = 0; j < w->ek; j++)
            for (int i = 0; i < w->eq; i++) mx[i] = fmaxf(mx[i], w->st[(size_t)j * BQ + i]);
        for (int i = 0; i < BQ; i++) {
            const float mu = mx[i] == -INFINITY ? 0.0f : mx[i];
            w->alpha[i] = expf(w->m[i] - mu);
            w->m[i] = mx[i], mx[i] = mu;
        }
        for (int j = 0; j < w->ek; j++) {
            float *row = w->st + (size_t)j * BQ;
            for (int i = 0; i < w->eq; i++) row[i] -= mx[i];
            kern->vexp(row, row, (size_t)w->eq);
        }
        for (int i = 0; i < BQ; i++) w->l[i] *= w->alpha[i];
        for (int j = 0; j < w->ek; j++)
            for (int i = 0; i < w->eq; i++) w->l[i] += w->st[(size_t)j * BQ + i];
        // --- O = alpha O + P V_j (P = (P^T)^T read in place)
        pack_rows(w->kvn, w->vj, (size_t)d_v, w->ek, BK, w->ek, d_v);
        for (int i = 0; i < w->eq; i += MHA_MR)
            for (int p = 0; p < dv16; p += 16)
                kern->sgemm_6x16(w->acc1 + (size_t)i * dv16 + p, dv16, w->st + i, 1, BQ,
                                 w->kvn + (size_t)p * BK, 16, NULL, w->alpha + i, w->ek, MHA_MR, 16);
    }
    // --- Z = O / l, lse = m + log l; a row with no allowed key: Z = 0, lse = +inf
    long masked = 0;
    for (int i = 0; i < n; i++) {
        float *zrow = a->z + ((size_t)b * a->T + i0 + i) * h * d_v + (size_t)r * d_v;
        float *lse = &a->lse[((size_t)b * h + r) * a->T + i0 + i];
        if (w->l[i] == 0.0f) {
            masked++, *lse = INFINITY;
            for (int e = 0; e < d_v; e++) zrow[e] = 0.0f;
            continue;
        }
        *lse = w->m[i] + logf(w->l[i]);
        const float inv = 1.0f / w->l[i];
        for (int e = 0; e < d_v; e++) zrow[e] = w->acc1[(size_t)i * dv16 + e] * inv;
    }
    return masked;
}

/* ------------------------------------------------------- passes 2 and 3 */

/* dK_j, dV_j of kv head g: sums over the group's heads r and all query
 * blocks, in that order. */
static void kv_task(scratch *w, const mha_bwd_attn *a, const float *dd, const mha_kernels *kern, int b,
                    int g, int j0) {
    const mha_config *c = a->cfg;
    const int d_k = c->d_k, d_v = c->d_v, dk16 = round16(d_k), dv16 = round16(d_v);
    const int group = c->n_heads / c->n_kv_heads, nj = a->Sx - j0 < BK ? a->Sx - j0 : BK;
    const size_t kw = (size_t)c->n_kv_heads * d_k, vw = (size_t)c->n_kv_heads * d_v;
    memset(w->acc1, 0, sizeof(float) * BK * dk16);
    memset(w->acc2, 0, sizeof(float) * BK * dv16);
    load_keys(w, a, b, g, j0, nj);
    for (int r = g * group; r < (g + 1) * group; r++)
        for (int i0 = 0; i0 < a->T; i0 += BQ) {
            const int n = a->T - i0 < BQ ? a->T - i0 : BQ;
            if (!tile_live(w, a, i0, n, j0, nj)) continue;
            set_extent(w, n, nj);
            load_queries(w, a, dd, b, r, i0, n, 1);
            ds_tile(w, a, kern, b, r, i0, n, j0, nj);
            accumulate(w->acc2, dv16, w->st, BQ, 1, w->ek, w->zn, BQ, w->eq, kern); /* dV_j += P^T dZ_i  */
            accumulate(w->acc1, dk16, w->dt, BQ, 1, w->ek, w->qn, BQ, w->eq, kern); /* dK_j += dS^T Q_i */
        }
    for (int j = 0; j < nj; j++) {
        memcpy(a->dk + ((size_t)b * a->Sx + j0 + j) * kw + (size_t)g * d_k, w->acc1 + (size_t)j * dk16,
               sizeof(float) * d_k);
        memcpy(a->dv + ((size_t)b * a->Sx + j0 + j) * vw + (size_t)g * d_v, w->acc2 + (size_t)j * dv16,
               sizeof(float) * d_v);
    }
}

/* dQ_i of head r: sums over the key blocks in order. */
static void q_task(scratch *w, const mha_bwd_attn *a, const float *dd, const mha_kernels *kern, int b,
                   int r, int i0) {
    const mha_config *c = a->cfg;
    const int d_k = c->d_k, dk16 = round16(d_k), g = mha_kv_head(c, r);
    const int n = a->T - i0 < BQ ? a->T - i0 : BQ;
    const size_t qw = (size_t)c->n_heads * d_k;
    memset(w->acc1, 0, sizeof(float) * BQ * dk16);
    set_extent(w, n, BK);
    load_queries(w, a, dd, b, r, i0, n, 0);
    for (int j0 = 0; j0 < a->Sx; j0 += BK) {
        const int nj = a->Sx - j0 < BK ? a->Sx - j0 : BK;
        if (!tile_live(w, a, i0, n, j0, nj)) continue;
        set_extent(w, n, nj);
        load_keys(w, a, b, g, j0, nj);
        ds_tile(w, a, kern, b, r, i0, n, j0, nj);
        pack_rows(w->kvn, w->kj, (size_t)d_k, w->ek, BK, w->ek, d_k);
        accumulate(w->acc1, dk16, w->dt, 1, BQ, w->eq, w->kvn, BK, w->ek, kern); /* dQ_i += dS K_j */
    }
    for (int i = 0; i < n; i++)
        memcpy(a->dq + ((size_t)b * a->T + i0 + i) * qw + (size_t)r * d_k, w->acc1 + (size_t)i * dk16,
               sizeof(float) * d_k);
}

/* ------------------------------------------------------------- drivers */

enum { PASS_FORWARD, PASS_KV, PASS_Q };

static mha_status run_pass(int pass, const mha_bwd_attn *a, const float *dd, const mha_kernels *kern,
                           int n_threads, long *masked) {
    const int nqb = (a->T + BQ - 1) / BQ, nkb = (a->Sx + BK - 1) / BK;
    const int heads = pass == PASS_KV ? a->cfg->n_kv_heads : a->cfg->n_heads;
    const int nblk = pass == PASS_KV ? nkb : nqb;
    const long ntasks = (long)a->B * heads * nblk;
    long count = 0;
    int failed = 0;
#pragma omp parallel num_threads(ntasks < n_threads ? (int)ntasks : n_threads) reduction(+ : count)
    {
        scratch w;
        const int ok = scratch_init(&w, a->cfg->d_k, a->cfg->d_v);
        if (!ok) {
#pragma omp atomic write
            failed = 1;
        }
        /* the last blocks see the most keys (causal) or queries: first */
#pragma omp for schedule(dynamic, 1)
        for (long t = 0; t < ntasks; t++) {
            if (!ok) continue;
            const int blk = nblk - 1 - (int)(t % nblk), hd = (int)(t / nblk % heads), b = (int)(t / nblk / heads);
            const int kv_first = pass == PASS_KV && !a->opt->causal; /* causal: key block 0 is the longest */
            if (pass == PASS_FORWARD) count += forward_task(&w, a, kern, b, hd, blk * BQ);
            else if (pass == PASS_KV) kv_task(&w, a, dd, kern, b, hd, (kv_first ? blk : nblk - 1 - blk) * BK);
            else q_task(&w, a, dd, kern, b, hd, blk * BQ);
        }
        scratch_free(&w);
    }
    if (masked) *masked = count;
    if (failed)
        return mha_fail(MHA_E_NOMEM, "fast backward: cannot allocate per-thread tiles (d_k=%d, d_v=%d)",
                        a->cfg->d_k, a->cfg->d_v);
    return MHA_OK;
}

/* Largest L2 norm of head column block [c0, c0+d) over n rows of width w. */
static double max_norm(const float *a, size_t n, size_t w, size_t c0, int d) {
    double best = 0.0;
    for (size_t t = 0; t < n; t++) {
        double sq = 0.0;
        for (int e = 0; e < d; e++) sq += (double)a[t * w + c0 + e] * a[t * w + c0 + e];
        if (!(sq <= best)) best = sq; /* NaN wins */
    }
    return sqrt(best);
}

/* The fast forward's fp32 range rule (mha.h): scores |scale q.k| bounded by
 * MHA_FAST_SCORE_LIMIT, checked as |scale| max|q| max|k| per (b, head);
 * beyond it MHA_E_UNSUPPORTED, and AUTO runs the reference (double). */
mha_status mha_fast_check_scores(const float *q, const float *k, const mha_config *c, int B, int T, int Sx,
                                 float scale, const char *who) {
    const size_t qw = (size_t)c->n_heads * c->d_k, kw = (size_t)c->n_kv_heads * c->d_k;
    for (int b = 0; b < B; b++)
        for (int r = 0; r < c->n_heads; r++) {
            const int g = mha_kv_head(c, r);
            const double bound = fabs(scale) * max_norm(q + (size_t)b * T * qw, (size_t)T, qw, (size_t)r * c->d_k, c->d_k) *
                                 max_norm(k + (size_t)b * Sx * kw, (size_t)Sx, kw, (size_t)g * c->d_k, c->d_k);
            if (!(bound <= MHA_FAST_SCORE_LIMIT))
                return mha_fail(MHA_E_UNSUPPORTED, "%s: scores of batch %d head %d may reach %.3g, "
                                "beyond the %g its fp32 softmax keeps accurate; expected MHA_PATH_AUTO or "
                                "_REFERENCE for such inputs", who, b, r, bound, MHA_FAST_SCORE_LIMIT);
        }
    return MHA_OK;
}

mha_status mha_bwd_attention_forward(const mha_bwd_attn *a, const mha_kernels *kern, int n_threads,
                                     long *masked_rows) {
    return run_pass(PASS_FORWARD, a, NULL, kern, n_threads, masked_rows);
}

mha_status mha_bwd_attention_backward(const mha_bwd_attn *a, const mha_kernels *kern, int n_threads) {
    const mha_config *c = a->cfg;
    const int h = c->n_heads, d_v = c->d_v;
    const size_t rows = (size_t)a->B * a->T, zw = (size_t)h * d_v;
    float *dd = malloc(sizeof(float) * rows * h); /* (B,h,T) D = rowsum(dZ * Z) */
    if (!dd) return mha_fail(MHA_E_NOMEM, "fast backward: no memory for D (B*T*h=%zu)", rows * h);
#pragma omp parallel for num_threads(n_threads) schedule(static)
    for (long t = 0; t < (long)rows; t++)
        for (int r = 0; r < h; r++) {
            const float *z = a->z + (size_t)t * zw + (size_t)r * d_v, *dz = a->dz + (size_t)t * zw + (size_t)r * d_v;
            float acc = 0.0f;
            for (int e = 0; e < d_v; e++) acc += dz[e] * z[e];
            dd[((size_t)(t / a->T) * h + r) * a->T + t % a->T] = acc;
        }
    /* dq before dk, dv: pass 3 reads every key, pass 2 only its own block's
     * (copied first), so dk and dv may overwrite k and v */
    mha_status s = run_pass(PASS_Q, a, dd, kern, n_threads, NULL);
    if (!s) s = run_pass(PASS_KV, a, dd, kern, n_threads, NULL);
    free(dd);
    return s;
}
