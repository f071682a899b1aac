/* attention.c — drives the flash-attention tiles: one task = (batch b,
 * head r, BR query rows); it walks key tiles of BC keys through the
 * kernels' scores -> online softmax -> o += p v steps and writes Z^(r)
 * straight into position-major Z. One thread owns a task and reduces its
 * keys in a fixed order, so results do not depend on the thread count.
 * Legend: see attention.h; BR query rows and BC keys per tile. */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "core/variants.h"
#include "forward/attention.h"
#include "forward/task_ranges.h"

#define MHA_ATT_BR 48 /* query rows per task, a multiple of MHA_MR */
#define MHA_ATT_BC 128 /* keys per tile, a multiple of 16 */

typedef struct {
    float *q;     /* (BR/6, d_k, 6) packed scaled queries */
    float *s;     /* (BR, BC) scores, then probabilities  */
    float *o;     /* (BR, ldv) unnormalized output        */
    float *m, *l, *alpha; /* (BR) running max, sum, rescale */
    int *lo, *hi;         /* (BR) allowed original keys [lo, hi] */
    int *tlo, *thi;       /* (BR) the same, relative to the tile */
    float *keyadd;        /* (BC) per-key additive term of a tile (-inf: masked) */
    int *kpos, *qpos;     /* (BC) key positions of a tile, (BR) query positions (ALiBi) */
} scratch;

static void *alloc64(size_t bytes) { return aligned_alloc(64, (bytes + 64) / 64 * 64); }

static int scratch_init(scratch *w, int d_k, int ldv) {
    const int br = MHA_ATT_BR;
    memset(w, 0, sizeof *w);
    w->q = alloc64(sizeof(float) * br * d_k);
    w->s = alloc64(sizeof(float) * br * MHA_ATT_BC);
    w->o = alloc64(sizeof(float) * br * ldv);
    w->m = alloc64(sizeof(float) * br * 3);
    w->lo = alloc64(sizeof(int) * br * 4);
    w->keyadd = alloc64(sizeof(float) * MHA_ATT_BC);
    w->kpos = alloc64(sizeof(int) * (MHA_ATT_BC + br));
    if (!w->q || !w->s || !w->o || !w->m || !w->lo || !w->keyadd || !w->kpos) return 0;
    w->l = w->m + br, w->alpha = w->m + 2 * br;
    w->hi = w->lo + br, w->tlo = w->lo + 2 * br, w->thi = w->lo + 3 * br;
    w->qpos = w->kpos + MHA_ATT_BC;
    return 1;
}

static void scratch_free(scratch *w) {
    free(w->q), free(w->s), free(w->o), free(w->m), free(w->lo), free(w->keyadd), free(w->kpos);
}

static int has_general_mask(const mha_options *o) {
    return o->keep_mask.data || o->additive_mask.data || o->key_keep || o->key_additive || o->sink_tokens > 0;
}

static int clampi(int x, int a, int b) { return x < a ? a : x > b ? b : x; }

/* Applies the masks beyond causal/window to the tile s (rows, nk) of
 * original keys j0..j0+nk-1, and causal/window too (so that a captured
 * probability row sees every mask): masked scores become -inf, additive
 * terms are added. (T,S) masks go through mask.c's mha_mask_key element by
 * element; the per-key padding masks (B,S), the common case, are turned
 * into one vector per tile. */
static void mask_tile(scratch *w, const mha_attn_args *a, int b, int r, int i0, int rows, int j0,
                      int nk) {
    const mha_options *o = a->opt;
    const int S = a->S;
    if (o->keep_mask.data || o->additive_mask.data || o->sink_tokens > 0) { /* sinks: a gap in the interval */
        for (int i = 0; i < rows; i++) {
            float *srow = w->s + (size_t)i * MHA_ATT_BC;
            for (int j = 0; j < nk; j++) {
                double add;
                if (mha_mask_key(o, b, r, i0 + i, j0 + j, a->T, S, &add))
                    srow[j] += (float)add;
                else
                    srow[j] = -INFINITY;
            }
        }
        return;
    }
    const int keymask = o->key_keep || o->key_additive;
    for (int j = 0; keymask && j < nk; j++) {
        /* mask.c: a false key_keep or an infinite additive term forbids */
        const size_t bj = (size_t)b * S + j0 + j;
        float add = o->key_additive ? o->key_additive[bj] : 0.0f;
        w->keyadd[j] = (o->key_keep && !o->key_keep[bj]) || isinf(add) ? -INFINITY : add;
    }
    for (int i = 0; i < rows; i++) {
        float *srow = w->s + (size_t)i * MHA_ATT_BC;
        const int lo = w->tlo[i] < 0 ? 0 : w->tlo[i], hi = w->thi[i] + 1 < nk ? w->thi[i] + 1 : nk;
        for (int j = 0; j < nk; j++)
            if (j < lo || j >= hi) srow[j] = -INFINITY;
            else if (keymask) srow[j] += w->keyadd[j];
    }
}

/* ALiBi on the tile s (rows, nk) of keys j0..: s -= slope_r |p_i - p_j|
 * by the kernel (the distance exact in int, positions <= 2^30); the
 * query positions w->qpos were filled once for the task. */
static void alibi_tile(scratch *w, const mha_attn_args *a, const mha_kernels *k, int b, int r, int rows,
                       int j0, int nk) {
    for (int j = 0; j < nk; j++) w->kpos[j] = mha_key_position(a->opt, a->keys_are_x, b, j0 + j, a->S);
    mha_attn_alibi_get(k)(w->s, MHA_ATT_BC, w->qpos, w->kpos, a->alibi_slopes[r], rows, nk);
}

/* Hints (no fault, no effect on results) for `rows` rows of `bytes`
 * bytes at stride `stride` floats: rw 1 fetches the lines for writing. */
static void prefetch_rows(const float *p, size_t stride, int rows, size_t bytes, int rw) {
    for (int i = 0; i < rows; i++)
        for (size_t o = 0; o < bytes; o += 64) {
            if (rw) __builtin_prefetch((const char *)(p + (size_t)i * stride) + o, 1, 3);
            else __builtin_prefetch((const char *)(p + (size_t)i * stride) + o, 0, 2);
        }
}

static void attend_task(const mha_attn_args *a, const mha_kernels *k, scratch *w, int b, int r,
                        int i0) {
    const mha_config *c = a->cfg;
    const mha_options *o = a->opt;
    const int T = a->T, S = a->S, S_tot = a->S_tot, h = c->n_heads, d_k = c->d_k, d_v = c->d_v;
    const int ldv = a->ldv, g = mha_kv_head(c, r);
    const int rows = T - i0 < MHA_ATT_BR ? T - i0 : MHA_ATT_BR;
    const int rows6 = (rows + MHA_MR - 1) / MHA_MR * MHA_MR;
    const int general = has_general_mask(o) || a->probs;
    const float *kt = a->kt + ((size_t)b * c->n_kv_heads + g) * a->S_pad * d_k; /* (S_pad/16, d_k, 16) */
    const float *v = a->v + ((size_t)b * c->n_kv_heads + g) * a->S_pad * ldv;   /* (S_pad, ldv) */

    // --- pack the scaled query rows into (rows6/6, d_k, 6) micro-panels
    const float *qsrc = a->q_head_major ? a->q + (((size_t)b * h + r) * T + i0) * d_k
                                        : a->q + ((size_t)b * T + i0) * h * d_k + (size_t)r * d_k;
    const size_t q_rs = a->q_head_major ? (size_t)d_k : (size_t)h * d_k;
    float *z0 = a->z + ((size_t)b * T + i0) * h * d_v + (size_t)r * d_v;
    mha_attn_pack_q_get(k)(w->q, qsrc, q_rs, a->scale, rows, rows6, d_k);

    // --- which keys the tile needs: the union of the rows' intervals
    int jb = S, je = 0;
    for (int i = 0; i < rows6; i++) {
        mha_mask_interval(o, i0 + (i < rows ? i : rows - 1), T, S, &w->lo[i], &w->hi[i]);
        if (i < rows && w->lo[i] <= w->hi[i]) {
            if (w->lo[i] < jb) jb = w->lo[i];
            if (w->hi[i] + 1 > je) je = w->hi[i] + 1;
        }
        w->m[i] = -INFINITY, w->l[i] = 0.0f;
    }
    for (int i = 0; c->alibi && i < rows; i++) w->qpos[i] = mha_query_position(o, b, i0 + i, T);
    if (jb >= je) jb = je = S; /* no original key: only the extra keys, if any */
    const int end = S_tot > S ? S_tot : je;
    memset(w->o, 0, sizeof(float) * rows6 * ldv);
    float *prow0 = a->probs ? a->probs + (((size_t)b * h + r) * T + i0) * S_tot : NULL;
    for (int i = 0; prow0 && i < rows; i++)
        for (int j = 0; j < S_tot; j++) prow0[(size_t)i * S_tot + j] = -INFINITY;

    // --- key tiles: scores, mask, online softmax, o = alpha o + p v
    for (int j0 = jb / 16 * 16; j0 < end; j0 += MHA_ATT_BC) {
        const int j1 = j0 + MHA_ATT_BC < end ? j0 + MHA_ATT_BC : end, nc = j1 - j0;
        if (j0 >= je && j1 <= S) continue; /* between the causal/window keys and the extra keys */
        if (j1 >= end) {
            /* Z and the next task's Q are cold (L3 or DRAM): during the
             * last tile, ask for the Z rows (for writing) and the query
             * rows of the block above in this head (the next task
             * mha_attention hands out) */
            prefetch_rows(z0, (size_t)h * d_v, rows, sizeof(float) * d_v, 1);
            if (i0 >= MHA_ATT_BR)
                prefetch_rows(qsrc - MHA_ATT_BR * q_rs, q_rs, MHA_ATT_BR, sizeof(float) * d_k, 0);
        }
        k->attn_scores(w->s, MHA_ATT_BC, w->q, kt + (size_t)(j0 / 16) * d_k * 16, d_k, rows6,
                       (nc + 15) / 16);
        const int extra = clampi(S - j0, 0, nc); /* tile columns >= extra are extra keys */
        if (c->softcap != 0.0f) mha_attn_softcap_get(k)(w->s, MHA_ATT_BC, c->softcap, rows6, nc);
        if (c->alibi) alibi_tile(w, a, k, b, r, rows, j0, nc);
        int bounded = 0;
        for (int i = 0; i < rows6; i++) {
            w->tlo[i] = clampi(w->lo[i] - j0, -1, nc);
            w->thi[i] = clampi(w->hi[i] - j0, -1, nc);
            if (extra > 0 && (w->tlo[i] > 0 || w->thi[i] < extra - 1)) bounded = 1;
        }
        if (general) {
            mask_tile(w, a, b, r, i0, rows, j0, extra);
            for (int i = 0; prow0 && i < rows; i++)
                memcpy(prow0 + (size_t)i * S_tot + j0, w->s + (size_t)i * MHA_ATT_BC, sizeof(float) * nc);
        }
        k->attn_softmax(w->s, MHA_ATT_BC, w->m, w->l, w->alpha, bounded ? w->tlo : NULL, w->thi,
                        extra, rows6, nc);
        for (int i = 0; o->dropout_p > 0.0f && i < rows; i++) /* after the row sums: P' = dropout(P) */
            mha_dropout_row(w->s + (size_t)i * MHA_ATT_BC, nc, o, h, T, b, r, i0 + i, j0);
        k->attn_pv(w->o, ldv, w->s, MHA_ATT_BC, v + (size_t)j0 * ldv, ldv, w->alpha, rows6, nc, ldv);
    }

    // --- Z^(r) = o / l into position-major Z; a row with no key: 0 or NaN
    //     (0 with sinks: the sink takes all the weight); a sink adds
    //     exp(sink_r - m) to the sum of a row that has keys
    const float fill = o->masked_row == MHA_MASKED_ROW_NAN && !c->sinks ? NAN : 0.0f;
    for (int i = 0; c->alibi && a->alibi_far && i < rows; i++) /* a row far from its keys: beyond the range */
        if (w->l[i] != 0.0f && !(fabsf(w->m[i]) <= MHA_FAST_SCORE_LIMIT)) {
#pragma omp atomic write
            *a->alibi_far = 1;
            break;
        }
    for (int i = 0; c->sinks && i < rows; i++)
        if (w->l[i] != 0.0f) w->l[i] += expf(a->sinks[r] - w->m[i]);
    for (int i = 0; i < rows; i++) {
        float *zrow = z0 + (size_t)i * h * d_v;
        const float *orow = w->o + (size_t)i * ldv;
        float *prow = prow0 ? prow0 + (size_t)i * S_tot : NULL;
        if (w->l[i] == 0.0f) {
            for (int e = 0; e < d_v; e++) zrow[e] = fill;
            for (int j = 0; prow && j < S_tot; j++) prow[j] = fill;
            continue;
        }
        const float inv = 1.0f / w->l[i];
#pragma omp simd /* -O2 leaves this loop scalar; it was ~4% of P1's attention */
        for (int e = 0; e < d_v; e++) zrow[e] = orow[e] * inv;
        for (int j = 0; prow && j < S_tot; j++) prow[j] = expf(prow[j] - w->m[i]) * inv;
        if (prow && o->dropout_p > 0.0f) mha_dropout_row(prow, S_tot, o, h, T, b, r, i0 + i, 0);
    }
}

mha_status mha_attention(const mha_attn_args *a, const mha_kernels *k, int n_threads) {
    const int nqt = (a->T + MHA_ATT_BR - 1) / MHA_ATT_BR, h = a->cfg->n_heads;
    const long ntasks = (long)a->B * h * nqt;
    /* Task t is query tile nqt-1 - t % nqt of head t / nqt (b-major), so a
     * run of tasks is whole heads: each thread reads the K/V of its own
     * heads (1 MiB per head at P3) from memory once, where under a dynamic
     * schedule both threads took turns on every head and each read every
     * head's K/V, and the next-query prefetch in attend_task fetches the
     * task this thread runs next. Later query tiles see more keys under
     * causal masks: they come first within a head, so the tasks taken
     * from the end of a run (task_ranges.h) are the small ones. */
    mha_task_ranges *queue = mha_task_ranges_new(ntasks, n_threads);
    int failed = !queue;
    if (queue) {
#pragma omp parallel num_threads(n_threads)
        {
            scratch w;
            int ok = scratch_init(&w, a->cfg->d_k, a->ldv);
            if (!ok) {
#pragma omp atomic write
                failed = 1;
            }
            for (long t; ok && (t = mha_task_ranges_next(queue, omp_get_thread_num())) >= 0;) {
                const int qt = nqt - 1 - (int)(t % nqt);
                const int r = (int)(t / nqt % h), b = (int)(t / nqt / h);
                attend_task(a, k, &w, b, r, qt * MHA_ATT_BR);
            }
            scratch_free(&w);
        }
    }
    mha_task_ranges_free(queue);
    if (failed)
        return mha_fail(MHA_E_NOMEM, "fast attention: cannot allocate per-thread tiles (d_k=%d, d_v=%d)",
                        a->cfg->d_k, a->cfg->d_v);
    return MHA_OK;
}
