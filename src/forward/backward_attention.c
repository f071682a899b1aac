/* backward_attention.c — FlashAttention-2's backward on tiles of BQ query
 * rows x BK keys, never a (T,S) buffer:
 *   pass 1 (per query block): S = scale Q K^T + mask with an online softmax
 *          (the prefill table's attn_scores, attn_softmax, attn_pv) gives
 *          Z = P V, and per row its max m and log(l) (row_max; else
 *          lse = m + log(l) in one float);
 *   pass 2 (per batch and head): D = rowsum(dZ * Z); for each key block j
 *          in order, for each query block i in order, the five products
 *          S = (scale Q_i) K_j^T, dP = dZ_i V_j^T (scores_rows),
 *          P = exp((S - m) - log l), dS' = P (dP - D) (probs_ds),
 *          dV_j += P^T dZ_i, dK_j += dS'^T (scale Q_i) (accumulate_tn),
 *          dQ_i += dS' K_j (attn_pv), times scale when written out.
 * The next key block's K, V rows and this block's dK, dV rows are
 * prefetched into L2 while its products run (prefetch_rows).
 * A task owns its head's dQ and its key blocks' dK, dV (the heads of a GQA
 * group write their own, summed in head order afterwards) and walks its
 * tiles in a fixed order: the result does not depend on the thread count.
 * Legend: see backward_fast.h; i query, j key, e a head column;
 * dk16 / dv16 = d_k / d_v rounded up to 16, Tp = T rounded up to BQ. */
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "core/variants.h"
#include "forward/backward_fast.h"

#ifndef BQ
#define BQ 96 /* query rows per tile: a multiple of 12 (register tiles) */
#endif
#ifndef BK
#define BK 96 /* keys per tile: a multiple of 16 (panels) and of 6      */
#endif

static int round16(int n) { return (n + 15) / 16 * 16; }
static int round6(int n) { return (n + MHA_MR - 1) / MHA_MR * MHA_MR; }
static int clampi(int x, int a, int b) { return x < a ? a : x > b ? b : x; }

typedef struct {
    float *qs;        /* pass 1: scale Q_i as (BQ/6, d_k, 6) micro-panels        */
    /* pass 2: one head's queries, Tp rows */
    float *qr, *zr;   /* scale Q (Tp, dk16), dZ (Tp, dv16) rows, zero padded     */
    float *lse, *dd, *rm; /* (Tp): log l, D, m; +inf, 0, 0 on the padding rows (P = dS = 0) */
    float *dq;        /* (Tp, dk16)                                          */
    int *lo, *hi;     /* (Tp) allowed original keys [lo, hi] of each row       */
    /* one key block */
    float *kt, *vt;   /* K_j^T (BK/16, d_k, 16), V_j^T (BK/16, d_v, 16) panels  */
    float *kr;        /* K_j (BK, dk16) rows; pass 1: V_j (BK, dv16)           */
    float *acck, *accv; /* dK_j (BK, dk16), dV_j (BK, dv16); pass 1: O in acck  */
    /* one tile */
    float *s, *dp;    /* (BQ, BK): S then P; dP then dS                        */
    float *m, *l, *alpha, *ones; /* (BQ)                                       */
    int *tlo, *thi;   /* (BQ) [lo, hi] relative to the key block               */
    float *keyadd;    /* (BK) per-key padding term (-inf: masked)              */
    float *dcap;      /* (BQ, BK) softcap's derivative 1 - tanh^2 (softcap only) */
    int *qpos, *kpos; /* (Tp) query and (BK) key positions (ALiBi)             */
    /* pass 1: one kv head's K^T panels and V rows, key blocks packed as
     * first used (head_cache) */
    float *head_kt, *head_vr; /* (Sx16/16, d_k, 16), (Sx, dv16)                 */
    char *head_done;          /* (Sx/BK) which key blocks are packed           */
    long head_of;             /* 1 + b * h_kv + g of the head held; 0: none     */
} scratch;

static void *alloc64(size_t floats) { return aligned_alloc(64, (floats * sizeof(float) + 63) / 64 * 64); }

/* T: the query rows one task holds (BQ in pass 1, the sequence in pass 2). */
static int scratch_init(scratch *w, const mha_config *c, int T) {
    const int d_k = c->d_k, d_v = c->d_v, dk16 = round16(d_k), dv16 = round16(d_v);
    const int dmax = dk16 > dv16 ? dk16 : dv16;
    const size_t tp = (size_t)(T + BQ - 1) / BQ * BQ;
    memset(w, 0, sizeof *w);
    float **p[] = {&w->qs, &w->qr, &w->zr, &w->lse, &w->dq, &w->kt, &w->vt, &w->kr,
                   &w->acck, &w->accv, &w->s, &w->dp, &w->m, &w->keyadd, &w->dcap};
    const size_t n[] = {(size_t)BQ * d_k, tp * dk16, tp * dv16, tp * 3, tp * dk16, (size_t)BK * d_k,
                        (size_t)BK * d_v, (size_t)BK * dmax, (size_t)(BK > BQ ? BK : BQ) * dmax,
                        (size_t)BK * dv16, (size_t)BQ * BK, (size_t)BQ * BK, (size_t)BQ * 4, BK,
                        c->softcap != 0.0f ? (size_t)BQ * BK : 1};
    int ok = 1;
    for (size_t i = 0; i < sizeof n / sizeof n[0]; i++) ok &= (*p[i] = alloc64(n[i])) != NULL;
    w->lo = malloc(sizeof(int) * (tp * 3 + BQ * 2 + BK));
    if (!ok || !w->lo) return 0;
    w->dd = w->lse + tp, w->rm = w->dd + tp, w->hi = w->lo + tp, w->tlo = w->hi + tp, w->thi = w->tlo + BQ;
    w->qpos = w->thi + BQ, w->kpos = w->qpos + tp;
    w->l = w->m + BQ, w->alpha = w->l + BQ, w->ones = w->alpha + BQ;
    for (int i = 0; i < BQ; i++) w->ones[i] = 1.0f;
    /* the transposed products read up to 6 columns past a tile's keys (the
     * rows they compute there are dropped): finite, never uninitialized */
    memset(w->s, 0, sizeof(float) * BQ * BK), memset(w->dp, 0, sizeof(float) * BQ * BK);
    return 1;
}

static void scratch_free(scratch *w) {
    free(w->qs), free(w->qr), free(w->zr), free(w->lse), free(w->dq), free(w->kt);
    free(w->vt), free(w->kr), free(w->acck), free(w->accv), free(w->s), free(w->dp), free(w->m);
    free(w->keyadd), free(w->dcap), free(w->lo), free(w->head_kt), free(w->head_vr), free(w->head_done);
}

/* ------------------------------------------------------------ packing */

/* Rows [r0, r1) of a (width d, row stride ld) into L2 ahead of their use
 * (write: for writing); a hint only. The rows of one head are 256 bytes
 * apart by a row of all heads, beyond the hardware prefetchers' reach. */
#define PF_ROWS 24 /* rows ahead that the packing loops prefetch */
static void prefetch_rows(const float *a, size_t ld, int r0, int r1, int d, int write) {
    for (int i = r0; i < r1; i++)
        for (int e = 0; e < d; e += 16) {
            if (write) __builtin_prefetch(a + (size_t)i * ld + e, 1, 2);
            else __builtin_prefetch(a + (size_t)i * ld + e, 0, 2);
        }
}

/* rows [0, n) of src (width d, row stride ld), times s, into micro-panels
 * (rows6/6, d, 6): element (i, e) at [(i/6)*6d + e*6 + i%6]; rows n.. zero. */
static void pack_micro(float *dst, const float *src, size_t ld, int n, int rows6, int d, float s) {
    for (int i = 0; i < rows6; i++) {
        float *o = dst + (size_t)(i / MHA_MR) * d * MHA_MR + i % MHA_MR;
        for (int e = 0; e < d; e++) o[(size_t)e * MHA_MR] = i < n ? s * src[(size_t)i * ld + e] : 0.0f;
    }
}

/* rows [0, n) of src (width d), times s, into (rows, d16) rows; the rest zero. */
static void pack_rows(float *dst, const float *src, size_t ld, int n, int rows, int d, float s) {
    const int d16 = round16(d);
    for (int i = 0; i < rows; i++) {
        float *o = dst + (size_t)i * d16;
        if (i + PF_ROWS < n) prefetch_rows(src, ld, i + PF_ROWS, i + PF_ROWS + 1, d, 0);
        int e = 0;
        if (i < n) {
            const float *r = src + (size_t)i * ld;
#pragma omp simd
            for (int f = 0; f < d; f++) o[f] = s * r[f];
            e = d;
        }
        for (; e < d16; e++) o[e] = 0.0f;
    }
}

/* -------------------------------------------------------------- masks */

static int has_general_mask(const mha_options *o) {
    return o->keep_mask.data || o->additive_mask.data || o->key_keep || o->key_additive || o->sink_tokens > 0;
}

/* w->lo, w->hi from index at: query rows i0.. (n of them; the padding
 * rows up to rows6 copy the last). */
static void row_intervals(scratch *w, const mha_bwd_attn *a, int at, int i0, int n, int rows6) {
    for (int i = 0; i < rows6; i++)
        mha_mask_interval(a->opt, i0 + (i < n ? i : n - 1), a->T, a->S, &w->lo[at + i], &w->hi[at + i]);
}

/* Whether key block [j0, j0+nj) holds a key some query row (n of them,
 * intervals at w->lo + at) may attend (an extra key always is one); sets
 * the block-relative intervals and *bounded (0: every row allows all of
 * the block's original keys). */
static int tile_live(scratch *w, const mha_bwd_attn *a, int at, int n, int rows6, int j0, int nj, int *bounded) {
    const int extra = clampi(a->S - j0, 0, nj);
    int any = extra < nj;
    *bounded = 0;
    for (int i = 0; i < rows6; i++) {
        const int lo = w->lo[at + i], hi = w->hi[at + i];
        w->tlo[i] = clampi(lo - j0, -1, nj), w->thi[i] = clampi(hi - j0, -1, nj);
        if (i < n && lo <= hi && lo < j0 + nj && hi >= j0) any = 1;
        if (extra > 0 && (w->tlo[i] > 0 || w->thi[i] < extra - 1)) *bounded = 1;
    }
    return any;
}

/* The masks beyond causal/window (which the kernels apply from the
 * intervals) on the scores s (BQ, BK) of rows i0.. (n), original keys
 * j0..j0+extra-1: (T,S) masks and sink tokens (the interval is the hull
 * of the sinks and the window) element by element through mha_mask_key,
 * the per-key padding masks as one vector. */
static void mask_tile(scratch *w, const mha_bwd_attn *a, int b, int r, int i0, int n, int j0, int extra) {
    const mha_options *o = a->opt;
    if (o->keep_mask.data || o->additive_mask.data || o->sink_tokens > 0) {
        for (int i = 0; i < n; i++)
            for (int j = 0; j < extra; j++) {
                double add;
                float *sij = &w->s[(size_t)i * BK + j];
                *sij = mha_mask_key(o, b, r, i0 + i, j0 + j, a->T, a->S, &add) ? *sij + (float)add : -INFINITY;
            }
        return;
    }
    for (int j = 0; j < extra; j++) { /* mask.c: a false key_keep or an infinite additive term forbids */
        const size_t bj = (size_t)b * a->S + j0 + j;
        const float add = o->key_additive ? o->key_additive[bj] : 0.0f;
        w->keyadd[j] = (o->key_keep && !o->key_keep[bj]) || isinf(add) ? -INFINITY : add;
    }
    for (int i = 0; i < n; i++)
        for (int j = 0; j < extra; j++) w->s[(size_t)i * BK + j] += w->keyadd[j];
}

/* The variants inside the softmax on the scores s (rows6, nj) of query
 * rows with positions qpos (n) and keys j0..: softcap, then ALiBi, as the
 * forward's tiles (attention.c), with the same kernels. want_dcap: also
 * w->dcap = d(cap tanh(u / cap))/du = 1 - tanh^2 for pass 2's dS. */
static void score_variants(scratch *w, const mha_bwd_attn *a, const mha_kernels *kern, int b, int r,
                           const int *qpos, int n, int rows6, int j0, int nj, int want_dcap) {
    const mha_config *c = a->cfg;
    if (c->softcap != 0.0f) {
        const float cap = c->softcap;
        mha_attn_softcap_get(kern)(w->s, BK, cap, rows6, nj);
        for (int i = 0; want_dcap && i < rows6; i++)
            for (int j = 0; j < nj; j++) {
                const float th = w->s[(size_t)i * BK + j] / cap;
                w->dcap[(size_t)i * BK + j] = 1.0f - th * th;
            }
    }
    if (c->alibi) {
        for (int j = 0; j < nj; j++) w->kpos[j] = mha_key_position(a->opt, a->keys_are_x, b, j0 + j, a->S);
        mha_attn_alibi_get(kern)(w->s, BK, qpos, w->kpos, a->alibi_slopes[r], n, nj);
    }
}

/* Of batch b, kv head g, keys j0.. (nj): K_j^T into kt and V_j^T into vt
 * (panels), V_j into vr and K_j into kr (rows); vt, vr, kr NULL: not
 * wanted. bk's transposing copy (the portable one when bk is NULL). Pass 1
 * reads K_j^T and V_j's rows; pass 2 K_j^T, V_j^T, and K_j's rows where
 * they are (keys_in_place) when d_k is a multiple of 16, else from w->kr. */
static int keys_in_place(const mha_config *c) { return c->d_k % 16 == 0; }
static void load_keys(float *kt, float *vt, float *vr, float *kr, const mha_bwd_attn *a,
                      const mha_backward_kernels *bk, int b, int g, int j0, int nj) {
    const mha_config *c = a->cfg;
    void (*pack_panels)(float *, const float *, size_t, int, int) = bk ? bk->pack_panels : mha_bwd_pack_panels_scalar;
    const size_t kw = (size_t)c->n_kv_heads * c->d_k, vw = (size_t)c->n_kv_heads * c->d_v;
    const float *k = a->k + ((size_t)b * a->Sx + j0) * kw + (size_t)g * c->d_k;
    const float *v = a->v + ((size_t)b * a->Sx + j0) * vw + (size_t)g * c->d_v;
    pack_panels(kt, k, kw, nj, c->d_k);
    if (vt) pack_panels(vt, v, vw, nj, c->d_v);
    if (vr) pack_rows(vr, v, vw, nj, nj, c->d_v, 1.0f);
    if (kr) pack_rows(kr, k, kw, nj, nj, c->d_k, 1.0f);
}

/* ------------------------------------------------------------- pass 1 */

/* Pass 1 packed every key block once per query block and head (3-4% of a
 * P1 or P2 backward's samples on the Zen 4, round 15): a thread keeps the
 * last kv head it used, each key block packed the first time one of its
 * query blocks needs it (the tasks of one head follow each other). At
 * most HEAD_CACHE_MAX_BYTES per thread (the memory bound of the backward
 * allows no copy of all of K and V); above it, or out of memory, 0:
 * the block is packed for this tile alone. */
#define HEAD_CACHE_MAX_BYTES ((size_t)32 << 20)
static _Atomic long forced_head_cache_cap = -1; /* tests: < 0 keeps the cap above */

void mha_bwd_force_head_cache_cap(long bytes) { atomic_store(&forced_head_cache_cap, bytes); }

static int head_cache(scratch *w, const mha_bwd_attn *a, int b, int g) {
    const mha_config *c = a->cfg;
    const size_t sx16 = (size_t)round16(a->Sx), nk = sx16 * c->d_k, nv = (size_t)a->Sx * round16(c->d_v);
    const size_t nkb = (size_t)(a->Sx + BK - 1) / BK;
    const long of = 1 + (long)b * c->n_kv_heads + g;
    const long forced = atomic_load(&forced_head_cache_cap);
    if ((nk + nv) * sizeof(float) > (forced < 0 ? HEAD_CACHE_MAX_BYTES : (size_t)forced)) return 0;
    if (!w->head_kt) {
        w->head_kt = alloc64(nk), w->head_vr = alloc64(nv);
        w->head_done = malloc(nkb);
        if (!w->head_kt || !w->head_vr || !w->head_done) {
            free(w->head_kt), free(w->head_vr), free(w->head_done);
            w->head_kt = w->head_vr = NULL, w->head_done = NULL;
            return 0;
        }
        w->head_of = 0;
    }
    if (w->head_of != of) memset(w->head_done, 0, nkb), w->head_of = of;
    return 1;
}

static long forward_task(scratch *w, const mha_bwd_attn *a, const mha_kernels *kern, const mha_backward_kernels *bk,
                         int b, int r, int i0) {
    const mha_config *c = a->cfg;
    const int h = c->n_heads, g = mha_kv_head(c, r), d_k = c->d_k, d_v = c->d_v, dv16 = round16(d_v);
    const int n = a->T - i0 < BQ ? a->T - i0 : BQ, rows6 = round6(n), general = has_general_mask(a->opt);
    pack_micro(w->qs, a->q + ((size_t)b * a->T + i0) * h * d_k + (size_t)r * d_k, (size_t)h * d_k, n, rows6,
               d_k, a->scale);
    row_intervals(w, a, 0, i0, n, rows6);
    for (int i = 0; i < rows6; i++) w->m[i] = -INFINITY, w->l[i] = 0.0f;
    for (int i = 0; c->alibi && i < n; i++) w->qpos[i] = mha_query_position(a->opt, b, i0 + i, a->T);
    memset(w->acck, 0, sizeof(float) * rows6 * dv16);
    const int cached = head_cache(w, a, b, g);
    for (int j0 = 0; j0 < a->Sx; j0 += BK) {
        const int nj = a->Sx - j0 < BK ? a->Sx - j0 : BK, extra = clampi(a->S - j0, 0, nj);
        int bounded;
        if (!tile_live(w, a, 0, n, rows6, j0, nj, &bounded)) continue;
        float *kt = w->kt, *vr = w->kr; /* K_j^T panels, V_j rows */
        if (cached) kt = w->head_kt + (size_t)j0 * d_k, vr = w->head_vr + (size_t)j0 * dv16;
        if (!cached || !w->head_done[j0 / BK]) load_keys(kt, NULL, vr, NULL, a, bk, b, g, j0, nj);
        if (cached) w->head_done[j0 / BK] = 1;
        kern->attn_scores(w->s, BK, w->qs, kt, d_k, rows6, (nj + 15) / 16);
        score_variants(w, a, kern, b, r, w->qpos, n, rows6, j0, nj, 0);
        if (general) mask_tile(w, a, b, r, i0, n, j0, extra);
        kern->attn_softmax(w->s, BK, w->m, w->l, w->alpha, bounded ? w->tlo : NULL, w->thi, extra, rows6, nj);
        for (int i = 0; a->opt->dropout_p > 0.0f && i < n; i++) /* after the row sums: P' = dropout(P) */
            mha_dropout_row(w->s + (size_t)i * BK, nj, a->opt, h, a->T, b, r, i0 + i, j0);
        kern->attn_pv(w->acck, dv16, w->s, BK, vr, dv16, w->alpha, rows6, nj, dv16);
    }
    // --- Z = O / l; m and log l (row_max), else lse = m + log l; a row with no allowed key: Z = 0, lse = +inf;
    //     a sink adds exp(sink_r - m) to the sum of a row that has keys (as attention.c)
    for (int i = 0; c->sinks && i < n; i++)
        if (w->l[i] != 0.0f) w->l[i] += expf(a->sinks[r] - w->m[i]);
    long masked = 0;
    for (int i = 0; i < n; i++) {
        float *zrow = a->z + ((size_t)b * a->T + i0 + i) * h * d_v + (size_t)r * d_v;
        const size_t at = ((size_t)b * h + r) * a->T + i0 + i;
        float *lse = &a->lse[at];
        if (a->row_max) a->row_max[at] = w->l[i] == 0.0f ? 0.0f : w->m[i];
        if (w->l[i] == 0.0f) {
            masked++, *lse = INFINITY;
            for (int e = 0; e < d_v; e++) zrow[e] = 0.0f;
            continue;
        }
        *lse = a->row_max ? logf(w->l[i]) : w->m[i] + logf(w->l[i]);
        const float inv = 1.0f / w->l[i];
        for (int e = 0; e < d_v; e++) zrow[e] = w->acck[(size_t)i * dv16 + e] * inv;
    }
    return masked;
}

/* ------------------------------------------------------------- pass 2 */

/* Head r of batch b: its query rows packed once, then the key blocks.
 * dK, dV of each block go to dk_out, dv_out (row stride ldk, ldv; Sx rows),
 * dQ to a->dq. */
static void backward_task(scratch *w, const mha_bwd_attn *a, const float *dd, const mha_kernels *kern,
                          const mha_backward_kernels *bk, int b, int r, float *dk_out, size_t ldk,
                          float *dv_out, size_t ldv) {
    const mha_config *c = a->cfg;
    const int h = c->n_heads, g = mha_kv_head(c, r), d_k = c->d_k, d_v = c->d_v;
    const int dk16 = round16(d_k), dv16 = round16(d_v), T = a->T, T6 = round6(T);
    const int tp = (T + BQ - 1) / BQ * BQ, general = has_general_mask(a->opt), drop = a->opt->dropout_p > 0.0f;
    const size_t qw = (size_t)h * d_k, zw = (size_t)h * d_v, row0 = ((size_t)b * h + r) * T;
    const float *q = a->q + (size_t)b * T * qw + (size_t)r * d_k, *dz = a->dz + (size_t)b * T * zw + (size_t)r * d_v;
    const size_t kw = (size_t)c->n_kv_heads * d_k, vw = (size_t)c->n_kv_heads * d_v;
    const float *k = a->k + (size_t)b * a->Sx * kw + (size_t)g * d_k, *v = a->v + (size_t)b * a->Sx * vw + (size_t)g * d_v;
    float *dq_out = a->dq + (size_t)b * T * qw + (size_t)r * d_k;
    const int in_place = keys_in_place(c);
    const int nj0 = a->Sx < BK ? a->Sx : BK; /* the first key block's rows come while the queries pack */
    prefetch_rows(k, kw, 0, nj0, d_k, 0), prefetch_rows(v, vw, 0, nj0, d_v, 0);
    pack_rows(w->qr, q, qw, T, tp, d_k, a->scale);
    pack_rows(w->zr, dz, zw, T, tp, d_v, 1.0f);
    for (int i = 0; i < tp; i++) {
        w->lse[i] = i < T ? a->lse[row0 + i] : INFINITY;
        w->rm[i] = i < T ? a->row_max[row0 + i] : 0.0f;
        w->dd[i] = i < T ? dd[row0 + i] : 0.0f;
    }
    for (int i0 = 0; i0 < T; i0 += BQ) {
        const int n = T - i0 < BQ ? T - i0 : BQ;
        row_intervals(w, a, i0, i0, n, round6(n));
    }
    for (int i = 0; c->alibi && i < T; i++) w->qpos[i] = mha_query_position(a->opt, b, i, T);
    // --- the sink's share p_sink = exp(sink_r - m - log l) of each row; its dP is 0: dl/dsink_r = -sum p_sink D
    if (c->sinks) {
        double acc = 0.0;
        for (int i = 0; i < T; i++)
            if (w->lse[i] != INFINITY) acc += exp((double)a->sinks[r] - w->rm[i] - w->lse[i]) * w->dd[i];
        a->d_sinks_part[(size_t)b * h + r] = (float)-acc;
    }
    memset(w->dq, 0, sizeof(float) * (size_t)T6 * dk16);
    for (int j0 = 0; j0 < a->Sx; j0 += BK) {
        const int nj = a->Sx - j0 < BK ? a->Sx - j0 : BK, nj6 = round6(nj), np = (nj + 15) / 16;
        const int extra = clampi(a->S - j0, 0, nj);
        int loaded = 0;
        memset(w->acck, 0, sizeof(float) * BK * dk16);
        memset(w->accv, 0, sizeof(float) * BK * dv16);
        const int j1 = j0 + nj, nj1 = a->Sx - j1 < BK ? a->Sx - j1 : BK, nqb = (T + BQ - 1) / BQ;
        for (int i0 = 0; i0 < T; i0 += BQ) {
            const int n = T - i0 < BQ ? T - i0 : BQ, rows6 = round6(n), qb = i0 / BQ;
            // --- a share of what comes next into L2: this block's dK, dV rows, the next block's K, V rows
            prefetch_rows(dk_out + (size_t)j0 * ldk, ldk, nj * qb / nqb, nj * (qb + 1) / nqb, d_k, 1);
            prefetch_rows(dv_out + (size_t)j0 * ldv, ldv, nj * qb / nqb, nj * (qb + 1) / nqb, d_v, 1);
            if (nj1 > 0) {
                prefetch_rows(k + (size_t)j1 * kw, kw, nj1 * qb / nqb, nj1 * (qb + 1) / nqb, d_k, 0);
                prefetch_rows(v + (size_t)j1 * vw, vw, nj1 * qb / nqb, nj1 * (qb + 1) / nqb, d_v, 0);
            } else {
                prefetch_rows(dq_out, qw, T * qb / nqb, T * (qb + 1) / nqb, d_k, 1);
            }
            int bounded;
            if (!tile_live(w, a, i0, n, rows6, j0, nj, &bounded)) continue;
            if (!loaded) load_keys(w->kt, w->vt, NULL, keys_in_place(c) ? NULL : w->kr, a, bk, b, g, j0, nj), loaded = 1;
            bk->scores_rows(w->s, BK, w->qr + (size_t)i0 * dk16, dk16, w->kt, d_k, rows6, np);  /* S  */
            bk->scores_rows(w->dp, BK, w->zr + (size_t)i0 * dv16, dv16, w->vt, d_v, rows6, np); /* dP */
            score_variants(w, a, kern, b, r, w->qpos + i0, n, rows6, j0, nj, 1);
            if (general) mask_tile(w, a, b, r, i0, n, j0, extra);
            for (int i = 0; drop && i < n; i++) /* dropout: dl/dP = (dZ V^T) m */
                mha_dropout_row(w->dp + (size_t)i * BK, nj, a->opt, h, T, b, r, i0 + i, j0);
            bk->probs_ds(w->s, w->dp, BK, w->lse + i0, w->rm + i0, w->dd + i0, 1.0f, bounded ? w->tlo : NULL, w->thi,
                         extra, rows6, nj);
            for (int i = 0; drop && i < n; i++) /* dV reads P' = P m */
                mha_dropout_row(w->s + (size_t)i * BK, nj, a->opt, h, T, b, r, i0 + i, j0);
            for (int i = 0; c->softcap != 0.0f && i < rows6; i++) /* dS of the raw score: times softcap' */
                for (int j = 0; j < nj; j++) w->dp[(size_t)i * BK + j] *= w->dcap[(size_t)i * BK + j];
            bk->accumulate_tn(w->accv, dv16, w->s, BK, w->zr + (size_t)i0 * dv16, dv16, nj6, rows6, dv16);
            bk->accumulate_tn(w->acck, dk16, w->dp, BK, w->qr + (size_t)i0 * dk16, dk16, nj6, rows6, dk16);
            kern->attn_pv(w->dq + (size_t)i0 * dk16, dk16, w->dp, BK, in_place ? k + (size_t)j0 * kw : w->kr,
                          in_place ? kw : (size_t)dk16, w->ones, rows6, nj, dk16);
        }
        for (int j = 0; j < nj; j++) {
            memcpy(dk_out + (size_t)(j0 + j) * ldk, w->acck + (size_t)j * dk16, sizeof(float) * d_k);
            memcpy(dv_out + (size_t)(j0 + j) * ldv, w->accv + (size_t)j * dv16, sizeof(float) * d_v);
        }
    }
    for (int i = 0; i < T; i++) {
        float *out = dq_out + (size_t)i * qw;
        const float *in = w->dq + (size_t)i * dk16;
#pragma omp simd
        for (int e = 0; e < d_k; e++) out[e] = a->scale * in[e];
    }
}

/* ------------------------------------------------------------- drivers */

/* What one pass's tasks read: the attention, the tables, D and the GQA
 * per-head dK, dV (pass 2). */
typedef struct {
    const mha_bwd_attn *a;
    const mha_kernels *kern;
    const mha_backward_kernels *bk;
    const float *dd;
    float *part, *part_v;
} pass_args;

/* Pass 1 task t: query block (from the last: causal gives the last blocks
 * the most keys, so they go first), head, batch. Returns its masked rows. */
static long forward_one(scratch *w, const pass_args *p, long t) {
    const int nqb = (p->a->T + BQ - 1) / BQ, h = p->a->cfg->n_heads;
    const int blk = nqb - 1 - (int)(t % nqb), r = (int)(t / nqb % h), b = (int)(t / nqb / h);
    return forward_task(w, p->a, p->kern, p->bk, b, r, blk * BQ);
}

/* Pass 2 task t: head t % h of batch t / h. */
static long backward_one(scratch *w, const pass_args *p, long t) {
    const mha_bwd_attn *a = p->a;
    const mha_config *c = a->cfg;
    const int h = c->n_heads, d_k = c->d_k, d_v = c->d_v, b = (int)(t / h), r = (int)(t % h), g = mha_kv_head(c, r);
    const size_t Sx = (size_t)a->Sx, kw = (size_t)c->n_kv_heads * d_k, vw = (size_t)c->n_kv_heads * d_v;
    if (p->part)
        backward_task(w, a, p->dd, p->kern, p->bk, b, r, p->part + ((size_t)b * h + r) * Sx * d_k, (size_t)d_k,
                      p->part_v + ((size_t)b * h + r) * Sx * d_v, (size_t)d_v);
    else
        backward_task(w, a, p->dd, p->kern, p->bk, b, r, a->dk + (size_t)b * Sx * kw + (size_t)g * d_k, kw,
                      a->dv + (size_t)b * Sx * vw + (size_t)g * d_v, vw);
    return 0;
}

/* Runs tasks 0..ntasks-1 of one pass on nth threads, each with its own
 * scratch for `rows` query rows; *sum = the sum of what they return. */
static mha_status run_tasks(long (*task)(scratch *, const pass_args *, long), const pass_args *p, long ntasks,
                            int nth, int rows, long *sum) {
    long count = 0;
    int failed = 0;
#pragma omp parallel num_threads(ntasks < nth ? (int)ntasks : nth) reduction(+ : count)
    {
        scratch w;
        const int ok = scratch_init(&w, p->a->cfg, rows);
        if (!ok) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(dynamic, 1)
        for (long t = 0; t < ntasks; t++)
            if (ok) count += task(&w, p, t);
        scratch_free(&w);
    }
    *sum = count;
    if (failed)
        return mha_fail(MHA_E_NOMEM, "fast backward: cannot allocate per-thread tiles (T=%d, d_k=%d, d_v=%d)",
                        rows, p->a->cfg->d_k, p->a->cfg->d_v);
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

mha_status mha_bwd_attention_forward(const mha_bwd_attn *a, const mha_kernels *kern,
                                     const mha_backward_kernels *bk, int n_threads, long *masked_rows) {
    const pass_args p = {a, kern, bk, NULL, NULL, NULL};
    const long ntasks = (long)a->B * a->cfg->n_heads * ((a->T + BQ - 1) / BQ);
    return run_tasks(forward_one, &p, ntasks, n_threads, BQ, masked_rows);
}

/* dd (B,h,T) = rowsum(dZ * Z) per row and head: one fmaf chain in e order,
 * the chain scores_rows gives dP = dZ V^T, so that where Z is one key's V
 * (a row whose softmax is one-hot: one allowed key, or scores far apart)
 * D equals that key's dP to the bit and dS = P (dP - D) is 0, as it is
 * exactly. A multiply and an add rounded apart left dS at ~1e-7 |dP|,
 * which the keys' norm carries into dQ and dW_Q, dW_K: 3.4e-4 relative
 * gradient error at scores near 1.7e4, where torch's fp32 gives 7e-8. */
static void row_dots(float *dd, const mha_bwd_attn *a, int n_threads) {
    const int h = a->cfg->n_heads, d_v = a->cfg->d_v;
    const size_t rows = (size_t)a->B * a->T, zw = (size_t)h * d_v;
#pragma omp parallel for num_threads(n_threads) schedule(static)
    for (long t = 0; t < (long)rows; t++)
        for (int r = 0; r < h; r++) {
            const float *z = a->z + (size_t)t * zw + (size_t)r * d_v, *dz = a->dz + (size_t)t * zw + (size_t)r * d_v;
            float acc = 0.0f;
            for (int e = 0; e < d_v; e++) acc = fmaf(dz[e], z[e], acc);
            dd[((size_t)(t / a->T) * h + r) * a->T + t % a->T] = acc;
        }
}

mha_status mha_bwd_attention_backward(const mha_bwd_attn *a, const mha_kernels *kern,
                                      const mha_backward_kernels *bk, int n_threads) {
    const mha_config *c = a->cfg;
    const int h = c->n_heads, h_kv = c->n_kv_heads, group = h / h_kv, d_k = c->d_k, d_v = c->d_v;
    const size_t kw = (size_t)h_kv * d_k, vw = (size_t)h_kv * d_v, Sx = (size_t)a->Sx;
    float *dd = malloc(sizeof(float) * (size_t)a->B * a->T * h); /* (B,h,T) */
    /* GQA: each head's dK (B,h,Sx,d_k) and dV (B,h,Sx,d_v), summed below */
    float *part = group > 1 ? malloc(sizeof(float) * (size_t)a->B * h * Sx * (d_k + d_v)) : NULL;
    if (!dd || (group > 1 && !part)) {
        free(dd), free(part);
        return mha_fail(MHA_E_NOMEM, "fast backward: no memory for D or the per-head dK, dV (B=%d T=%d h=%d)",
                        a->B, a->T, h);
    }
    row_dots(dd, a, n_threads);
    float *part_v = part ? part + (size_t)a->B * h * Sx * d_k : NULL;
    const long ntasks = (long)a->B * h;
    /* a thread holds one head's packed queries (about (2 d_k + d_v) T
     * floats): beyond 64 MiB of them, no more threads than two Q-sized
     * buffers pay for, so that the peak memory does not grow with the core
     * count (the result does not depend on the thread count) */
    const double per_thread = (double)(a->T + BQ) * (2 * round16(d_k) + round16(d_v) + 4) + 4.0 * BQ * BK;
    const double budget = fmax(2.0 * a->B * a->T * h * d_k, 16.0 * 1024 * 1024);
    int nth = ntasks < n_threads ? (int)ntasks : n_threads;
    if (nth > 1 && per_thread * nth > budget) nth = budget / per_thread > 1.0 ? (int)(budget / per_thread) : 1;
    /* dk, dv may overwrite k, v: without GQA a task alone reads its kv
     * head, and writes a key block after its last read of it */
    const pass_args p = {a, kern, bk, dd, part, part_v};
    long unused;
    const mha_status s = run_tasks(backward_one, &p, ntasks, nth, a->T, &unused);
    // --- GQA: dK^(g), dV^(g) = the group's heads summed in head order
#pragma omp parallel for num_threads(n_threads) schedule(static) if (part && !s)
    for (long t = 0; t < (long)(part && !s ? a->B * Sx : 0); t++) {
        const size_t b = (size_t)t / Sx, j = (size_t)t % Sx;
        for (int g = 0; g < h_kv; g++) {
            float *dk = a->dk + t * kw + (size_t)g * d_k, *dv = a->dv + t * vw + (size_t)g * d_v;
            for (int r = g * group; r < (g + 1) * group; r++) {
                const float *pk = part + ((b * h + r) * Sx + j) * d_k, *pv = part_v + ((b * h + r) * Sx + j) * d_v;
                for (int e = 0; e < d_k; e++) dk[e] = r == g * group ? pk[e] : dk[e] + pk[e];
                for (int e = 0; e < d_v; e++) dv[e] = r == g * group ? pv[e] : dv[e] + pv[e];
            }
        }
    }
    free(dd), free(part);
    return s;
}
