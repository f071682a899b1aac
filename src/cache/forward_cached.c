/* forward_cached.c — mha_forward_cached: one prefill or decode step of a
 * causal self-attention layer over a KV cache.
 *
 *   pack the new rows of x        xc (N, d_model), N = sum_b n[b]
 *   project                       Q = xc W_Q + b_Q, K = .. W_K, V = .. W_V
 *                                 (decode_gemm.c for one row, or up to
 *                                 16 with bf16/int8 weights; the fast
 *                                 path's packed mha_gemm for more)
 *   clip_qkv, QK-norm, RoPE       on the new q, k (v: clip only); then
 *   the query temperature         on the new q
 *   append K, V; attend           Z (N, h*d_v)   (decode.c, by pieces when
 *                                 a ring must not overwrite needed keys)
 *   intervene                     Z^(r) per opt->interventions
 *   project out                   Y = Z W_O + b_O, unpacked to (B,T,d_model)
 *
 * Legend: B sequences, T rows per sequence in x/y, N packed new rows,
 * h heads, h_kv kv heads, d_k, d_v, d_model.
 */
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/bf16.h"
#include "cache/cache_internal.h"
#include "core/variants.h"
#include "core/weight_store.h"
#include "forward/forward.h"

/* ------------------------------------------------------- validation */

mha_status mha_cache_check_layer(const mha_cache *c, const mha_layer *L, const char *fn) {
    const mha_config *f = &L->cfg;
    if (c->d_model != f->d_model || c->h != f->n_heads || c->h_kv != f->n_kv_heads ||
        c->d_k != f->d_k || c->d_v != f->d_v || f->d_kv_in != c->d_kv_in || f->d_v_in != c->d_v_in)
        return mha_fail(MHA_E_SHAPE,
                        "%s: cache made for d_model=%d h=%d h_kv=%d d_k=%d d_v=%d d_kv_in=%d d_v_in=%d, "
                        "layer has d_model=%d h=%d h_kv=%d d_k=%d d_v=%d d_kv_in=%d d_v_in=%d; expected "
                        "the same shape", fn, c->d_model, c->h, c->h_kv, c->d_k, c->d_v, c->d_kv_in, c->d_v_in,
                        f->d_model, f->n_heads, f->n_kv_heads, f->d_k, f->d_v, f->d_kv_in, f->d_v_in);
    if (c->cross && (f->rope.pairing != MHA_ROPE_NONE || f->alibi || f->temperature_floor))
        return mha_fail(MHA_E_UNSUPPORTED, "%s: a cross-attention memory with a layer that has RoPE, ALiBi or a "
                        "query temperature (they need the keys' positions); expected a layer without them", fn);
    return MHA_OK;
}

/* The cache holds K/V computed by the layer's kv heads in the order the
 * cache's labels record; a permuted layer would read another head's keys. */
static mha_status check_labels(mha_cache *c, const mha_layer *L) {
    int empty = 1;
    for (int b = 0; b < c->B; b++) empty &= c->len[b] == 0;
    const int *lk = L->labels[MHA_BLOCK_K], *lv = L->labels[MHA_BLOCK_V];
    if (empty) { /* nothing cached yet: adopt the layer's order */
        memcpy(c->labels_k, lk, sizeof(int) * c->h_kv);
        memcpy(c->labels_v, lv, sizeof(int) * c->h_kv);
        return MHA_OK;
    }
    for (int g = 0; g < c->h_kv; g++)
        if (lk[g] != c->labels_k[g] || lv[g] != c->labels_v[g])
            return mha_fail(MHA_E_CONTRACT,
                            "mha_forward_cached: kv head %d of the cache holds K/V of label %d/%d but "
                            "the layer's W_K/W_V block %d has label %d/%d; after permuting the layer, "
                            "apply the same perm with mha_cache_permute_heads (or reset the cache)",
                            g, c->labels_k[g], c->labels_v[g], g, lk[g], lv[g]);
    return MHA_OK;
}

static mha_status check_options(const mha_options *o, const mha_cache *c, const mha_layer *L, int T) {
    if (o->additive_mask.data || o->key_keep || o->key_additive)
        return mha_fail(MHA_E_UNSUPPORTED,
                        "mha_forward_cached: %s is not supported with a KV cache (attention is causal "
                        "over the cached tokens; keep_mask masks the new tokens among themselves; use "
                        "mha_forward for arbitrary masks)",
                        o->additive_mask.data ? "additive_mask" : o->key_keep ? "key_keep" : "key_additive");
    if (o->keep_mask.data && c->cross)
        return mha_fail(MHA_E_UNSUPPORTED, "mha_forward_cached: keep_mask on a cross-attention memory (a tree "
                        "mask masks new tokens among themselves; a memory appends none); expected NULL");
    if (o->keep_mask.data && (o->keep_mask.batch != 1 && o->keep_mask.batch != c->B))
        return mha_fail(MHA_E_SHAPE, "mha_forward_cached: keep_mask.batch=%d; expected 1 (broadcast) or B=%d",
                        o->keep_mask.batch, c->B);
    if (o->keep_mask.data && o->keep_mask.heads != 1)
        return mha_fail(MHA_E_SHAPE, "mha_forward_cached: keep_mask.heads=%d; expected 1 (one (T,T) tree mask "
                        "of the new tokens for every head)", o->keep_mask.heads);
    if (o->cu_seqlens || o->n_seqs)
        return mha_fail(MHA_E_UNSUPPORTED, "mha_forward_cached: options.cu_seqlens is not supported with a KV cache "
                        "(its sequences are the cache's batch rows); expected NULL");
    if (o->key_positions)
        return mha_fail(MHA_E_UNSUPPORTED, "mha_forward_cached: options.key_positions is not supported with a "
                        "KV cache (each cached key keeps the position it was stored with); expected NULL");
    if (o->chunk_size < 0 || (o->chunk_size > 0 && (c->n_sink > 0 || o->sink_tokens > 0)))
        return mha_fail(MHA_E_ARG, "mha_forward_cached: options.chunk_size=%d with a cache keeping %d sink tokens; "
                        "expected 0 (none), or > 0 on a cache without sink tokens", o->chunk_size, c->n_sink);
    if (o->sink_tokens != 0 && o->sink_tokens != c->n_sink) {
        if (c->n_sink == 0)
            return mha_fail(MHA_E_ARG, "mha_forward_cached: options.sink_tokens=%d but the cache keeps none; expected "
                            "0, or a ring cache given them by mha_cache_set_sink_tokens", o->sink_tokens);
        return mha_fail(MHA_E_ARG, "mha_forward_cached: options.sink_tokens=%d but the cache keeps %d; expected 0 "
                        "or %d (mha_cache_set_sink_tokens sets them)", o->sink_tokens, c->n_sink, c->n_sink);
    }
    if (c->cross && (o->window_left >= 0 || o->chunk_size > 0 || o->positions))
        return mha_fail(MHA_E_ARG, "mha_forward_cached: options.%s on a cross-attention memory, whose keys have no "
                        "order relative to the queries (every query attends all of them); expected %s",
                        o->window_left >= 0 ? "window_left" : o->chunk_size > 0 ? "chunk_size" : "positions",
                        o->window_left >= 0 ? "-1" : o->chunk_size > 0 ? "0" : "NULL");
    mha_status s = mha_check_positions(&L->cfg, o, c->B, T, T);
    /* REPLACE values are (B,T,d_v), as in mha_forward */
    if (!s) s = mha_check_common_options(o, c->h, (size_t)c->B * T, c->d_v);
    if (!s) s = mha_refuse_dropout(o, "mha_forward_cached");
    return !s && o->bf16_matmul ? mha_check_bf16_weights(L) : s;
}

/* ------------------------------------------------------- the plan */

/* The buffers of one call. Rows are packed: sequence b's n[b] new rows
 * are rows row0[b] .. row0[b] + n[b] - 1 of N. */
typedef struct {
    int B, T, N;
    int *n, *row0, *np;   /* (B) new rows, first packed row, rows of a piece */
    int *pos;             /* (N) each new row's position: options.positions
                             or its cache position                          */
    size_t *value_row;    /* (N) row of a (B,T,...) array: b*T + t           */
    float *xc, *yc;       /* (N, d_model) packed x and y (x, y when N = B*T)  */
    float *q, *k, *v, *z; /* (N, h*d_k), (N, h_kv*d_k), (N, h_kv*d_v), (N, h*d_v) */
    float *stats;         /* (N, h, 2) row max and sum, when probs are captured */
    float *cc;            /* (h, N, d_model) contributions, when captured   */
    int *trank;           /* NULL, or (keep_mask.batch, T, T) the tree's ranks
                             (mha_decode_opts.tree_rank) under a window or chunk */
    int nan_rows;         /* masked_row NAN: NaN rows of y are expected     */
    int bf16;             /* options.bf16_matmul: projections of bf16 inputs */
} cached_plan;

static void plan_free(cached_plan *p) {
    free(p->n), free(p->pos), free(p->value_row), free(p->q), free(p->k), free(p->v), free(p->z);
    free(p->stats), free(p->cc), free(p->trank);
    if (p->N != p->B * p->T) free(p->xc), free(p->yc);
}

// --- validate: the counts n_new, finite x, room in the cache, labels

/* The count elements of x from `first` that sequence b's new rows hold
 * are finite; the message names x's own index and the sequence. */
static mha_status x_rows_finite(const float *x, size_t first, size_t count, int b) {
    const size_t i = mha_first_nonfinite(x + first, count, 0);
    if (i < count)
        return mha_fail(MHA_E_NONFINITE, "x[%zu] = %g (sequence %d); expected a finite number", first + i,
                        (double)x[first + i], b);
    return MHA_OK;
}
/* The rows of mask entry mb (batch 1: the one shared by every sequence)
 * that are read: those below n_new of its sequence, or of any sequence. */
static int tree_rows(const mha_mask *m, const int *n, int B, int mb) {
    int rows = n[mb];
    for (int b = 1; m->batch == 1 && b < B; b++) rows = n[b] > rows ? n[b] : rows;
    return rows;
}

/* A tree mask (options.keep_mask, (batch, T, T)) lets a new token attend
 * only earlier new tokens: its causal position already hides later ones,
 * so a nonzero entry above the diagonal is a tree given children first. */
static mha_status tree_ordered(const mha_mask *m, const int *n, int B, int T) {
    for (int b = 0; m->data && b < (m->batch == 1 ? 1 : B); b++) {
        const int nb = tree_rows(m, n, B, b);
        const uint8_t *mb = (const uint8_t *)m->data + (size_t)b * T * T;
        for (int i = 0; i < nb; i++)
            for (int j = i + 1; j < nb; j++)
                if (mb[(size_t)i * T + j])
                    return mha_fail(MHA_E_ARG, "mha_forward_cached: keep_mask[%d][%d][%d] = %d lets new token %d "
                                    "attend the later token %d; expected 0 above the diagonal (order the "
                                    "tree's tokens parents first)", b, i, j, mb[(size_t)i * T + j], i, j);
    }
    return MHA_OK;
}

/* Under a window, window_left or chunk_size, the ranks of a tree mask m
 * ((batch, T, T)): trank[b][t][j] = nonzero entries of row t before
 * column j (j <= t), the position past the call's base at which new token
 * j stands in the sequence new token t sees (mha_cache_tree_pos). On a
 * ring, a row whose window reaches further back than its cache position's
 * (a tree token after its siblings) needs prefix keys that storing the
 * call's later pieces may overwrite: refused, naming it. */
static mha_status tree_ranks(cached_plan *p, const mha_cache *c, const mha_options *o) {
    const mha_mask *m = &o->keep_mask;
    if (!m->data || (!c->window && o->window_left < 0 && o->chunk_size <= 0)) return MHA_OK;
    const int T = p->T, nb = m->batch == 1 ? 1 : p->B;
    const size_t cells = (size_t)nb * T * T; /* nb*T <= INT_MAX: below 2^62, but its bytes may wrap */
    p->trank = cells <= SIZE_MAX / sizeof(int) ? malloc(sizeof(int) * cells) : NULL;
    if (!p->trank) return mha_fail(MHA_E_NOMEM, "mha_forward_cached: no memory for the ranks of a %d-token tree", T);
    for (int mb = 0; mb < nb; mb++) {
        const int rows = tree_rows(m, p->n, p->B, mb);
        for (int t = 0; t < rows; t++) {
            const size_t row = (size_t)mb * T + (size_t)t;
            const uint8_t *mr = (const uint8_t *)m->data + row * T;
            int *rr = p->trank + row * T, n = 0;
            for (int j = 0; j <= t; j++) rr[j] = n, n += mr[j] != 0;
        }
    }
    const int piece = c->window ? mha_cache_ring(c) - c->window + 1 : T;
    for (int b = 0; c->window && b < p->B; b++)
        for (int t = piece; t < p->n[b]; t++) { /* the first piece is stored whole before any row reads */
            const int base = c->len[b], row = (m->batch == 1 ? 0 : b) * T + t;
            const int pe = base + p->trank[(size_t)row * T + t];
            const int first = mha_cache_window_first(c, pe, o->window_left, o->chunk_size);
            const int end = t - t % piece + piece < p->n[b] ? t - t % piece + piece : p->n[b]; /* its piece's end */
            const int kept = base + end - mha_cache_ring(c); /* the oldest ring position left after storing it */
            /* the oldest ring position it attends: of the prefix, from its window's first on; of the new
             * tokens it keeps, those in its window or at a sink's position on its path */
            int need = first > c->n_sink ? first : c->n_sink;
            if (need >= base) need = INT_MAX;
            const uint8_t *mr = (const uint8_t *)m->data + (size_t)row * T;
            for (int j = 0; j < t && need >= kept; j++) {
                const int e = base + p->trank[(size_t)row * T + j];
                if (mr[j] && (e >= first || e < c->n_sink) && base + j >= c->n_sink && base + j < need) need = base + j;
            }
            if (need < kept)
                return mha_fail(MHA_E_ARG, "mha_forward_cached: new token %d of sequence %d sees %d new tokens of the "
                                "keep_mask and so needs position %d for its window or sink tokens, which storing the "
                                "call's tokens up to %d in the ring (%d slots past %d sink tokens) overwrites; expected "
                                "at most %d new tokens per call with a tree mask on this cache (capacity - sink tokens "
                                "- window + 1), or a larger capacity", t, b, pe - base + 1, need, base + end - 1,
                                mha_cache_ring(c), c->n_sink, piece);
        }
    return MHA_OK;
}

static mha_status validate(cached_plan *p, const mha_layer *L, mha_cache *c, const float *x,
                           const int *n_new, const mha_options *opt) {
    mha_status s = MHA_OK;
    for (int b = 0; b < p->B && !s; b++) {
        p->n[b] = n_new ? n_new[b] : p->T;
        p->row0[b] = p->N;
        if (p->n[b] < 0 || p->n[b] > p->T)
            s = mha_fail(MHA_E_ARG, "mha_forward_cached: n_new[%d]=%d; expected 0..T=%d", b, p->n[b], p->T);
        else
            s = x_rows_finite(x, (size_t)b * p->T * c->d_model, (size_t)p->n[b] * c->d_model, b);
        if (!s && p->bf16) {
            char name[64]; /* the index the check names counts from this sequence's first row */
            snprintf(name, sizeof name, "x (sequence %d, from x[%zu])", b, (size_t)b * p->T * c->d_model);
            s = mha_check_bf16_input(x + (size_t)b * p->T * c->d_model, (size_t)p->n[b] * c->d_model, name);
        }
        p->N += p->n[b];
    }
    /* without a window everything must fit; a ring takes pieces; a memory
     * appends nothing but must be set */
    for (int b = 0; !s && c->cross && b < p->B; b++)
        if (p->n[b] && !c->len[b])
            s = mha_fail(MHA_E_ARG, "mha_forward_cached: sequence %d of the cross-attention memory is empty; expected "
                         "mha_cache_set_memory first", b);
    if (!s && !c->window && !c->cross) s = mha_cache_check_room(c, p->n, "mha_forward_cached");
    if (!s) s = tree_ordered(&opt->keep_mask, p->n, p->B, p->T);
    if (!s) s = tree_ranks(p, c, opt);
    return s ? s : check_labels(c, L);
}

// --- plan: packed buffers for the N new rows
static mha_status plan_buffers(cached_plan *p, const mha_cache *c, const float *x, float *y,
                               const mha_capture *cap, const mha_options *opt) {
    const size_t N = (size_t)p->N, D = (size_t)c->d_model;
    const int packed = p->N != p->B * p->T;
    p->xc = packed ? malloc(sizeof(float) * N * D) : (float *)x;
    p->yc = packed ? malloc(sizeof(float) * N * D) : y;
    p->value_row = malloc(sizeof(size_t) * N);
    p->pos = malloc(sizeof(int) * N);
    p->q = malloc(sizeof(float) * N * c->h * c->d_k), p->z = malloc(sizeof(float) * N * c->h * c->d_v);
    if (!c->cross) /* a memory's K and V are stored already */
        p->k = malloc(sizeof(float) * N * c->h_kv * c->d_k), p->v = malloc(sizeof(float) * N * c->h_kv * c->d_v);
    p->stats = cap && cap->probs ? malloc(sizeof(float) * N * c->h * 2) : NULL;
    p->cc = cap && cap->contributions ? malloc(sizeof(float) * c->h * N * D) : NULL;
    if (!p->xc || !p->yc || !p->value_row || !p->pos || !p->q || (!c->cross && (!p->k || !p->v)) || !p->z ||
        (cap && cap->probs && !p->stats) || (cap && cap->contributions && !p->cc))
        return mha_fail(MHA_E_NOMEM, "mha_forward_cached: no memory for %d rows", p->N);
    for (int b = 0; b < p->B; b++)
        for (int t = 0; t < p->n[b]; t++) {
            p->value_row[p->row0[b] + t] = (size_t)b * p->T + t;
            p->pos[p->row0[b] + t] = opt->positions ? opt->positions[(size_t)b * p->T + t] : c->len[b] + t;
        }
    for (int b = 0; packed && b < p->B; b++)
        memcpy(p->xc + (size_t)p->row0[b] * D, x + (size_t)b * p->T * D, sizeof(float) * p->n[b] * D);
    return MHA_OK;
}

/* ------------------------------------------------------- the steps */

/* Probabilities of the rows just attended (piece rows t0 .. t0+np[b]-1),
 * from the final max and sum of each row: column s = cache slot s. */
static mha_status capture_probs(const mha_exec *ex, float *probs, const mha_cache *c, const mha_layer *L,
                                const float *q, const float *stats, const int *row0, int t0, const int *np,
                                int T, const mha_decode_opts *o) {
    const mha_decode_kernels *kr = mha_exec_decode(ex);
    int *spos = malloc(sizeof(int) * c->cap); /* (cap) position of each slot */
    if (!spos) return mha_fail(MHA_E_NOMEM, "mha_forward_cached: no memory for probabilities");
    int n_rep = c->h / c->h_kv, width = c->cap + L->cfg.add_bias_kv + L->cfg.add_zero_attn;
    for (int b = 0; b < c->B; b++) {
        mha_cache_slot_positions(spos, c, b, 0, c->cap);
        for (int i = 0; i < np[b]; i++) {
            int t = t0 + i, p = mha_cache_query_position(c, b, np[b], i), base = c->len[b] - np[b] - t0;
            const int pe = mha_cache_tree_pos(o, b, base, p, p); /* in the sequence it sees */
            int first = mha_cache_row_first(c, o, b, pe), pu = mha_cache_user_position(c, b, mha_cache_slot_of(c, p));
            for (int r = 0; r < c->h; r++) {
                int g = r / n_rep;
                size_t row = (size_t)row0[b] + t;
                const float *qr = q + (row * c->h + r) * c->d_k;
                float M = stats[(row * c->h + r) * 2], Ls = stats[(row * c->h + r) * 2 + 1];
                float *pr = probs + (((size_t)b * c->h + r) * T + t) * width;
                size_t kv = mha_cache_kv_index(c, b, g);
                for (int s = 0; s < c->cap; s++) {
                    int ps = spos[s];
                    pr[s] = 0.0f;
                    if (ps == INT_MIN || ps > p || !mha_cache_tree_keeps(o, b, base, p, ps) ||
                        !mha_cache_attends(c, mha_cache_tree_pos(o, b, base, p, ps), first, pe))
                        continue;
                    size_t k0 = mha_cache_k_off(c, kv, s);
                    float dot = 0.0f;
                    for (int d = 0; d < c->d_k; d++) dot = fmaf(qr[d], mha_cache_key_at(c, kr, k0, kv, s, d), dot);
                    float sc = dot * o->scale;
                    if (o->softcap != 0.0f) sc = o->softcap * tanhf(sc / o->softcap);
                    if (o->slopes) sc -= o->slopes[r] * (float)abs(pu - mha_cache_user_position(c, b, s));
                    pr[s] = expf(sc - M) / Ls;
                }
                int col = c->cap;
                if (o->extra_k) {
                    float dot = 0.0f;
                    for (int d = 0; d < c->d_k; d++) dot = fmaf(qr[d], o->extra_k[(size_t)g * c->d_k + d], dot);
                    pr[col++] = expf(dot * o->scale - M) / Ls;
                }
                if (o->zero_attn) pr[col] = expf(-M) / Ls;
            }
        }
    }
    free(spos);
    return MHA_OK;
}

/* 1 when the projections of N new rows stream the layer's weights in
 * their stored form (decode_gemm.c): one row, or up to
 * MHA_DECODE_COMPACT_MAX_ROWS with bf16 / int8 weights (a batched decode
 * step then reads the compact bytes once); else the fast path's GEMM with
 * the packed fp32 weights (N >= MHA_PREFILL_MIN_ROWS, cache_internal.h). */
static int stream_projections(const mha_layer *L, int N) {
    return N < MHA_PREFILL_MIN_ROWS || (mha_layer_weights_dtype(L) != MHA_W_F32 && N <= MHA_DECODE_COMPACT_MAX_ROWS);
}

/* The stream of decode_gemm.c over the n-wide rows a (N, n), rounded to
 * bf16 first under options.bf16_matmul (the packed GEMM rounds its own). */
static mha_status stream(const mha_exec *ex, const mha_decode_gemm_job *jobs, int n_jobs, const float *a, int N,
                         int n, int bf16) {
    float *r = bf16 ? malloc(sizeof(float) * (size_t)N * n) : NULL; /* (N, n) */
    if (bf16 && !r) return mha_fail(MHA_E_NOMEM, "mha_forward_cached: no memory for %d rounded rows", N);
    if (r) mha_bf16_round_array(r, a, (size_t)N * n);
    mha_status s = mha_decode_gemm_many(ex, jobs, n_jobs, r ? r : a, N, n);
    free(r);
    return s;
}

/* q (N, h*d_k), k (N, h_kv*d_k), v (N, h_kv*d_v) = x (N, d_model) W + b,
 * on the stream or the packed GEMM (stream_projections; the same split
 * for W_O below). */
static mha_status project_qkv(const mha_exec *ex, const cached_plan *p, const mha_layer *L,
                              const mha_cache *c) {
    const int wq = c->h * c->d_k, wk = c->h_kv * c->d_k, wv = c->h_kv * c->d_v, N = p->N;
    if (c->cross) { /* the queries alone: K and V are the memory's */
        const mha_dst dq = {MHA_DST_ROWS, p->q, (size_t)wq, 0, 0, 0, 0};
        const mha_packed *pq = stream_projections(L, N) ? NULL : mha_fast_packed_q(L);
        const mha_gemm_args g = {&dq, p->xc, (size_t)c->d_model, N, pq, 0, 1, 0, c->d_model, 1, p->bf16};
        const mha_decode_gemm_job jq = mha_layer_decode_job(L, MHA_MAT_Q, p->q);
        return pq ? mha_gemm(&g, mha_exec_prefill(ex), mha_exec_threads_for(ex, (double)N * c->d_model * wq))
                  : stream(ex, &jq, 1, p->xc, N, c->d_model, p->bf16);
    }
    const mha_packed *pk = stream_projections(L, N) ? NULL : mha_fast_packed_qkv(L);
    if (pk) {
        const mha_dst dst[3] = {{MHA_DST_ROWS, p->q, (size_t)wq, 0, 0, 0, 0},
                                {MHA_DST_ROWS, p->k, (size_t)wk, 0, 0, 0, 0},
                                {MHA_DST_ROWS, p->v, (size_t)wv, 0, 0, 0, 0}};
        const mha_gemm_args g = {dst, p->xc, (size_t)c->d_model, N, pk, 0, 3, 0, c->d_model, 1, p->bf16};
        return mha_gemm(&g, mha_exec_prefill(ex), mha_exec_threads_for(ex, (double)N * c->d_model * (wq + wk + wv)));
    }
    /* the weights in their stored form (fp32, bf16 or int8) */
    mha_decode_gemm_job qkv[3] = {mha_layer_decode_job(L, MHA_MAT_Q, p->q), mha_layer_decode_job(L, MHA_MAT_K, p->k),
                                  mha_layer_decode_job(L, MHA_MAT_V, p->v)};
    return stream(ex, qkv, 3, p->xc, N, c->d_model, p->bf16);
}

// --- clip_qkv: the new q, k, v clamped to [-c, c] before anything else
// reads them (the cache stores the clamped K and V)
static mha_status clip_qkv(const mha_exec *ex, const cached_plan *p, const mha_layer *L, const mha_cache *c) {
    const float clip = L->cfg.clip_qkv;
    if (clip == 0.0f) return MHA_OK;
    const size_t N = (size_t)p->N;
    const int nt = mha_exec_threads_for(ex, (double)N * (c->h + 2 * c->h_kv) * c->d_k);
    mha_clip(p->q, N * c->h * c->d_k, clip, nt);
    if (c->cross) return MHA_OK; /* the memory's K, V were clamped when it was set */
    mha_clip(p->k, N * c->h_kv * c->d_k, clip, nt);
    mha_clip(p->v, N * c->h_kv * c->d_v, clip, nt);
    return MHA_OK;
}

// --- variants on the new q and k: QK-norm, then RoPE at each row's
// position (the cache stores rotated K), as the fast path does
static mha_status transform_qk(const cached_plan *p, const mha_layer *L, const mha_cache *c) {
    const mha_config *f = &L->cfg;
    const int rope = f->rope.pairing != MHA_ROPE_NONE, norm = f->qk_norm != MHA_QK_NORM_NONE;
    if (!rope && !norm && f->temperature_floor == 0) return MHA_OK;
    long long seq = 0; /* the call's length: its new rows' largest position + 1 (dynamic, LongRoPE) */
    for (int i = 0; i < p->N; i++)
        if (p->pos[i] >= seq) seq = (long long)p->pos[i] + 1;
    float *tab = rope ? mha_rope_table(f, p->pos, p->N, seq) : NULL; /* rows: the packed rows */
    double *st = f->qk_norm_whole ? malloc(sizeof(double) * 4 * (size_t)p->N) : NULL; /* (2, N, 2): q, k */
    float *temp = f->temperature_floor ? malloc(sizeof(float) * (size_t)p->N) : NULL; /* (N) queries' temperatures */
    if ((rope && !tab) || (f->qk_norm_whole && !st) || (f->temperature_floor && !temp)) {
        free(tab), free(st), free(temp);
        return mha_fail(MHA_E_NOMEM, "mha_forward_cached: no memory for the rotary table");
    }
    for (int i = 0; temp && i < p->N; i++) temp[i] = (float)mha_query_temperature(f, p->pos[i]);
    const int sides = c->cross ? 1 : 2; /* q, and k unless a memory holds the keys */
    for (int key = 0; st && key < sides; key++) /* OLMo 2: each row's stats over all heads */
        mha_qk_norm_rows_stats(st + (key ? 2 * (size_t)p->N : 0), key ? p->k : p->q, (size_t)p->N,
                               (size_t)(key ? c->h_kv : c->h) * c->d_k, f, 1);
    for (int r = 0; r < c->h + (sides - 1) * c->h_kv; r++) {
        const int key = r >= c->h, head = key ? r - c->h : r, width = key ? c->h_kv : c->h;
        const float *nw = !norm ? NULL : (key ? L->k_norm : L->q_norm) + (f->qk_norm_per_head ? (size_t)head * c->d_k : 0);
        mha_head_rows hr = {(key ? p->k : p->q) + (size_t)head * c->d_k, (size_t)width * c->d_k, 1};
        mha_qk_transform(f, hr, p->N, nw, st ? st + (key ? 2 * (size_t)p->N : 0) : NULL, tab, p->N, NULL,
                         key ? NULL : temp);
    }
    free(tab), free(st), free(temp);
    return MHA_OK;
}

// --- check the range before anything is stored: K and V within what
// their storage type holds (float16: below 65520), and |scale q.k| within
// MHA_FAST_SCORE_LIMIT over the cached keys, the new ones and bias_k


/* Largest |element| of the new rows of sequence b, kv head g, in a
 * (N, h_kv, d) array. */
static double new_rows_max(const cached_plan *p, const mha_cache *c, const float *a, int d, int b, int g) {
    double m = 0.0;
    for (int i = 0; i < p->n[b]; i++) {
        const float *row = a + ((size_t)p->row0[b] + i) * c->h_kv * d + (size_t)g * d;
        for (int e = 0; e < d; e++) m = fabs(row[e]) > m || isnan(row[e]) ? fabs(row[e]) : m;
    }
    return m;
}

static mha_status check_range(const mha_exec *ex, const cached_plan *p, mha_cache *c, const mha_layer *L,
                              float scale) {
    for (int b = 0; b < p->B; b++)
        for (int g = 0; g < c->h_kv; g++) {
            double knew = 0.0; /* largest L2 norm of a new key (and bias_k) */
            for (int i = 0; !c->cross && i < p->n[b]; i++) {
                const float *kr = p->k + ((size_t)p->row0[b] + i) * c->h_kv * c->d_k + (size_t)g * c->d_k;
                const double kn = sqrt(mha_sum_squares(kr, c->d_k));
                if (!(kn <= knew)) knew = kn;
            }
            if (L->cfg.add_bias_kv) /* the extra key */
                knew = fmax(knew, sqrt(mha_sum_squares(L->bias_k + (size_t)g * c->d_k, c->d_k)));
            const double kabs = c->cross ? 0.0 : new_rows_max(p, c, p->k, c->d_k, b, g); /* a memory: checked when set */
            const double vmax = c->cross ? 0.0 : new_rows_max(p, c, p->v, c->d_v, b, g);
            const int k_over = mha_cache_f16_overflows(c->kt, kabs);
            if (k_over || mha_cache_f16_overflows(c->vt, vmax))
                return mha_fail(MHA_E_NONFINITE, "mha_forward_cached: %s of sequence %d kv head %d reaches %g, beyond "
                                "float16's largest 65504 (this cache stores it in float16); nothing was appended; "
                                "expected |%s| < 65520, or an fp32 or int8 cache", k_over ? "K" : "V", b, g,
                                k_over ? kabs : vmax, k_over ? "K" : "V");
            const int k_q8 = mha_cache_q8_overflows(c->kt, kabs);
            if (k_q8 || mha_cache_q8_overflows(c->vt, vmax))
                return mha_fail(MHA_E_NONFINITE, "mha_forward_cached: %s of sequence %d kv head %d reaches %g, which "
                                "this cache's int8 reads back as 127 * (%g / 127) = inf; nothing was appended; "
                                "expected |%s| < FLT_MAX, or an fp32 cache", k_q8 ? "K" : "V", b, g,
                                k_q8 ? kabs : vmax, k_q8 ? kabs : vmax, k_q8 ? "K" : "V");
            if (!(vmax <= FLT_MAX / (c->cap + 2.0)))
                return mha_fail(MHA_E_NONFINITE, "mha_forward_cached: V of sequence %d kv head %d reaches %g, "
                                "beyond the fp32 range its weighted sums need; nothing was appended", b, g, vmax);
            mha_score_excess bad;
            const double kmax = fmax(c->kmax[mha_cache_kv_index(c, b, g)], knew);
            if (mha_cache_scores_fit(c, p->q, p->row0, p->n, b, g, kmax, scale, &bad)) continue;
            /* kmax only grows: the keys the cache still holds may be smaller */
            const double live = fmax(mha_cache_kmax_live(c, mha_exec_decode(ex), b, g), knew);
            if (mha_cache_scores_fit(c, p->q, p->row0, p->n, b, g, live, scale, &bad)) continue;
            const char *kept = c->cross ? "the memory is unchanged" : "nothing was appended";
            if (bad.bound <= MHA_FAST_SCORE_LIMIT) /* the score fits: the query's norm is what an int8 K cannot hold */
                return mha_fail(MHA_E_NONFINITE, "mha_forward_cached: the query of sequence %d head %d at new token %d "
                                "is beyond what this cache's int8 keys hold (their block sums of q times codes up to "
                                "127 overflow fp32 past a norm of %.3g); %s; expected smaller queries, or an fp16 / "
                                "fp32 K", b, bad.r, bad.t, mha_cache_q8_query_limit(c), kept);
            return mha_fail(MHA_E_NONFINITE, "mha_forward_cached: scores of sequence %d head %d may reach %.3g at new "
                            "token %d, beyond the %g its fp32 softmax keeps accurate; %s", b, bad.r, bad.bound, bad.t,
                            MHA_FAST_SCORE_LIMIT, kept);
        }
    return MHA_OK;
}

// --- run: append and attend, in pieces a ring can hold
static mha_status attend_pieces(const mha_exec *ex, cached_plan *p, mha_cache *c, const mha_layer *L,
                                const mha_capture *cap, const mha_decode_opts *o) {
    const int piece = c->window ? mha_cache_ring(c) - c->window + 1 : p->T;
    mha_status s = MHA_OK;
    for (int t0 = 0; t0 < p->T && !s; t0 += piece) {
        int any = 0;
        for (int b = 0; b < p->B; b++) {
            p->np[b] = p->n[b] - t0 < 0 ? 0 : p->n[b] - t0 > piece ? piece : p->n[b] - t0;
            any |= p->np[b] > 0;
        }
        if (!any) break;
        if (!c->cross) mha_cache_store(ex, c, p->k, p->v, p->pos, p->row0, t0, p->np);
        s = mha_decode_attend(ex, p->z, p->stats, c, p->q, p->row0, t0, p->np, o);
        if (!s && p->stats) s = capture_probs(ex, cap->probs, c, L, p->q, p->stats, p->row0, t0, p->np, p->T, o);
    }
    return s;
}

/* gated attention: z (N, h*d_v) *= sigmoid(x W_G + b_G) of the new rows */
static mha_status gate(const mha_exec *ex, const cached_plan *p, const mha_layer *L, const mha_cache *c) {
    const size_t zw = (size_t)c->h * c->d_v, n = (size_t)p->N * zw;
    float *g = malloc(sizeof(float) * n); /* (N, h*d_v) */
    if (!g) return mha_fail(MHA_E_NOMEM, "mha_forward_cached: no memory for the output gate (%d rows)", p->N);
    /* few rows: the stream of W_G as stored (fp32, bf16, int8); many (a
     * prefill): the packed GEMM, as project_qkv (the stream's tile mode
     * took 3-5x as long) */
    const int packed = !stream_projections(L, p->N) && mha_fast_packed_g(L);
    const mha_decode_gemm_job job = mha_layer_decode_job(L, MHA_MAT_G, g);
    mha_status s = packed ? mha_fast_gate_logits(g, L, p->xc, (size_t)p->N, mha_exec_prefill(ex),
                                                 mha_exec_threads_for(ex, (double)n * c->d_model))
                          : mha_decode_gemm_many(ex, &job, 1, p->xc, p->N, c->d_model);
    if (!s) mha_gate_apply(p->z, g, n, mha_exec_threads_for(ex, (double)n));
    free(g);
    return s;
}

/* y (N, d_model) = z (N, h*d_v) W_O + b_O (the stream of decode_gemm.c
 * or the fast path's packed GEMM: stream_projections); cc (h, N, d_model),
 * when not NULL, = Z^(r) W_O[r] (no bias), on the packed GEMM. */
static mha_status project_out(const mha_exec *ex, const cached_plan *p, const mha_layer *L, const mha_cache *c) {
    const int wz = c->h * c->d_v, D = c->d_model, N = p->N;
    const mha_packed *po = mha_fast_packed_o(L);
    if (!po) return mha_fail(MHA_E_UNSUPPORTED, "mha_forward_cached: the layer's packed W_O is missing");
    const mha_kernels *kern = mha_exec_prefill(ex);
    const int nt = mha_exec_threads_for(ex, (double)N * wz * D);
    mha_dst out = {MHA_DST_ROWS, p->yc, (size_t)D, 0, 0, 0, 0};
    mha_gemm_args g = {&out, p->z, (size_t)wz, N, po, 0, 1, 0, wz, 1, p->bf16};
    const mha_decode_gemm_job jo = mha_layer_decode_job(L, MHA_MAT_O, p->yc);
    mha_status s = stream_projections(L, N) ? stream(ex, &jo, 1, p->z, N, wz, p->bf16) : mha_gemm(&g, kern, nt);
    g.kn = c->d_v, g.use_bias = 0; /* rows r*d_v .. of W_O, no bias */
    for (int r = 0; p->cc && r < c->h && !s; r++) {
        out.base = p->cc + (size_t)r * N * D;
        g.a = p->z + (size_t)r * c->d_v, g.k0 = r * c->d_v;
        s = mha_gemm(&g, kern, nt);
    }
    for (size_t i = 0; !s && i < (size_t)N * D; i++)
        if (isinf(p->yc[i]) || (isnan(p->yc[i]) && !p->nan_rows))
            s = mha_fail(MHA_E_NONFINITE, "mha_forward_cached: y of new row %zu overflowed its fp32 sum; "
                         "its K/V were appended", i / D);
    return s;
}

/* Unpacks rows (N, w) into (B, T, w) with zeros past n[b]. */
static void unpack(float *dst, const float *src, const int *n, int B, int T, size_t w) {
    size_t at = 0;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            float *d = dst + ((size_t)b * T + t) * w;
            if (t < n[b]) memcpy(d, src + (at++) * w, sizeof(float) * w);
            else memset(d, 0, sizeof(float) * w);
        }
}

// --- merge: packed rows back to (B,T,...) outputs, zero rows past n[b]
static void merge_outputs(const cached_plan *p, const mha_cache *c, const mha_layer *L, float *y,
                          const mha_capture *cap) {
    const int B = p->B, T = p->T, D = c->d_model;
    for (int r = 0; p->cc && r < c->h; r++)
        unpack(cap->contributions + (size_t)r * B * T * D, p->cc + (size_t)r * p->N * D, p->n, B, T, (size_t)D);
    if (p->yc != y) unpack(y, p->yc, p->n, B, T, (size_t)D);
    if (cap && cap->z) unpack(cap->z, p->z, p->n, B, T, (size_t)c->h * c->d_v);
    if (cap && cap->probs) {
        const size_t width = (size_t)c->cap + L->cfg.add_bias_kv + L->cfg.add_zero_attn;
        for (int b = 0; b < B; b++)
            for (int r = 0; r < c->h; r++)
                for (int t = p->n[b]; t < T; t++)
                    memset(cap->probs + (((size_t)b * c->h + r) * T + t) * width, 0, sizeof(float) * width);
    }
}

/* No new rows: every output is zero. */
static void zero_outputs(const mha_cache *c, const mha_layer *L, float *y, const mha_capture *cap, int T) {
    const size_t rows = (size_t)c->B * T;
    memset(y, 0, sizeof(float) * rows * c->d_model);
    if (cap && cap->z) memset(cap->z, 0, sizeof(float) * rows * c->h * c->d_v);
    if (cap && cap->contributions) memset(cap->contributions, 0, sizeof(float) * c->h * rows * c->d_model);
    if (cap && cap->probs)
        memset(cap->probs, 0, sizeof(float) * rows * c->h * (size_t)(c->cap + L->cfg.add_bias_kv + L->cfg.add_zero_attn));
}

static mha_decode_opts decode_opts(const mha_exec *ex, const mha_layer *L, const mha_cache *c, const mha_options *opt,
                                   int T) {
    const int extra = L->cfg.add_bias_kv;
    return (mha_decode_opts){opt->scale != 0.0f ? opt->scale : 1.0f / sqrtf((float)c->d_k), L->cfg.softcap,
                             L->cfg.alibi ? L->alibi_slopes : NULL, L->cfg.sinks ? L->sinks : NULL,
                             mha_exec_prefill(ex), opt->window_left, opt->chunk_size,
                             extra ? L->bias_k : NULL, extra ? L->bias_v : NULL, L->cfg.add_zero_attn,
                             opt->masked_row == MHA_MASKED_ROW_NAN && !L->cfg.sinks, /* sink: 0 */
                             opt->keep_mask.data, T, opt->keep_mask.batch, NULL};
}

static mha_status forward_cached_exec(const mha_exec *ex, const mha_layer *L, mha_cache *c, float *y,
                                      const mha_capture *cap, const float *x, int T, const int *n_new,
                                      const mha_options *opt) {
    cached_plan p = {.B = c->B, .T = T, .bf16 = opt->bf16_matmul};
    mha_status s = (p.n = malloc(sizeof(int) * 3 * c->B)) ? MHA_OK
                   : mha_fail(MHA_E_NOMEM, "mha_forward_cached: no memory");
    if (!s) p.row0 = p.n + c->B, p.np = p.n + 2 * c->B, p.xc = (float *)x, p.yc = y;
    if (!s) s = validate(&p, L, c, x, n_new, opt);
    if (!s && p.N == 0) zero_outputs(c, L, y, cap, T);
    if (s || p.N == 0) {
        free(p.n), free(p.trank);
        return s;
    }
    mha_decode_opts o = decode_opts(ex, L, c, opt, T);
    o.tree_rank = p.trank;
    p.nan_rows = o.nan_rows;
    if (!(s = plan_buffers(&p, c, x, y, cap, opt)) && !(s = project_qkv(ex, &p, L, c)) && !(s = clip_qkv(ex, &p, L, c)) &&
        !(s = transform_qk(&p, L, c)) &&
        !(s = check_range(ex, &p, c, L, o.scale)) && !(s = attend_pieces(ex, &p, c, L, cap, &o)) &&
        !(s = L->cfg.output_gate ? gate(ex, &p, L, c) : MHA_OK)) {
        for (int r = 0; opt->interventions && r < c->h && !s; r++)
            s = mha_head_intervene_rows(p.z, &opt->interventions[r], r, c->h, p.N, c->d_v, p.value_row);
        if (!s) s = project_out(ex, &p, L, c);
        if (!s) merge_outputs(&p, c, L, y, cap);
    }
    plan_free(&p);
    return s;
}

/* mha_forward_cached_exec with the cache held (mha_cache_begin). */
static mha_status forward_cached_held(const mha_exec *ex, const mha_layer *L, mha_cache *c, float *y,
                                      const mha_capture *cap, const float *x, int T, const int *n_new,
                                      const mha_options *opt) {
    if (T < 1) return mha_fail(MHA_E_ARG, "mha_forward_cached: T=%d; expected >= 1", T);
    const size_t widest = (size_t)c->h * (size_t)(c->d_k > c->d_v ? c->d_k : c->d_v) + (size_t)c->d_model;
    if ((long long)c->B * T > INT_MAX || !mha_elements_fit((size_t)c->B, (size_t)T, widest, 1))
        return mha_fail(MHA_E_ARG, "mha_forward_cached: T=%d with %d sequences; expected B*T <= %d and (B,T,d_model) "
                        "of at most 2^40 elements", T, c->B, INT_MAX);
    mha_options defaults = mha_options_default();
    if (!opt) opt = &defaults;
    mha_status s = mha_cache_check_layer(c, L, "mha_forward_cached");
    if (!s) s = check_options(opt, c, L, T);
    return s ? s : forward_cached_exec(ex, L, c, y, cap, x, T, n_new, opt);
}

mha_status mha_forward_cached_exec(const mha_exec *ex, const mha_layer *L, mha_cache *c, float *y,
                                   const mha_capture *cap, const float *x, int T, const int *n_new,
                                   const mha_options *opt) {
    if (!L || !c || !y || !x)
        return mha_fail(MHA_E_ARG, "mha_forward_cached: NULL %s; expected (B,T,d_model) floats",
                        !L ? "layer" : !c ? "cache" : !y ? "y" : "x");
    mha_status s = mha_layer_begin(L, 0, "mha_forward_cached"); /* the layer read, the cache changed */
    if (s) return s;
    s = mha_cache_begin(c, 1, "mha_forward_cached");
    if (!s) s = mha_cache_end(c, 1, forward_cached_held(ex, L, c, y, cap, x, T, n_new, opt));
    return mha_layer_end(L, 0, s);
}

mha_status mha_forward_cached_ctx(const mha_context *ctx, const mha_layer *L, mha_cache *c, float *y,
                                  const mha_capture *cap, const float *x, int T, const int *n_new,
                                  const mha_options *opt) {
    mha_exec ex;
    mha_status s = mha_exec_resolve(&ex, ctx);
    return s ? s : mha_forward_cached_exec(&ex, L, c, y, cap, x, T, n_new, opt);
}

mha_status mha_forward_cached(const mha_layer *L, mha_cache *c, float *y, const mha_capture *cap,
                              const float *x, int T, const int *n_new, const mha_options *opt) {
    return mha_forward_cached_ctx(NULL, L, c, y, cap, x, T, n_new, opt);
}
