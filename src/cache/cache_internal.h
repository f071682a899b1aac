/* cache_internal.h — the KV cache object and the decode steps shared by
 * cache.c (object, storing), decode.c (flash-decoding attention) and
 * forward_cached.c (the cached forward).
 * Legend: B sequences, T new tokens per sequence (rows of the arrays),
 * R ring/capacity slots, h heads, h_kv kv heads, d_k, d_v, d_model. */
#ifndef MHA_CACHE_INTERNAL_H
#define MHA_CACHE_INTERNAL_H

#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdatomic.h>

#include "compute/decode_gemm.h"
#include "compute/workspace.h"
#include "core/core.h"

/* Slots of K/V are allocated in multiples of this many keys: the flash-
 * decoding chunk. The split of a sequence into chunks depends on it alone
 * (never on the thread count), so results are bit-identical for any
 * number of threads. */
#define MHA_DECODE_CHUNK 128

struct mha_cache {
    int B, cap, slots;   /* slots = cap rounded up to MHA_DECODE_CHUNK      */
    int window;          /* 0: none; else attend the last `window` tokens   */
    int n_sink;          /* windowed: positions 0..n_sink-1 stay in slots
                            0..n_sink-1 (StreamingLLM); the rest share the
                            ring of slots n_sink..cap-1                     */
    int h, h_kv, d_k, d_v, d_model;
    int cross;           /* 1: cross-attention memory (mha_cache_create_cross):
                            K/V of an encoder's output set whole by
                            mha_cache_set_memory; every query attends all of
                            its sequence's keys, nothing is appended        */
    int d_kv_in, d_v_in; /* the key / value source widths it was made for   */
    mha_cache_dtype kt, vt; /* storage type of K and of V (may differ)     */
    size_t ek, ev;       /* bytes of one K / V element: 4, 2 or 1 (int8)     */
    void *data;          /* (B, h_kv, slots/CHUNK) chunks, each one
                            [K (CHUNK/8, d_k, 8) panels of 8 keys |
                             V (CHUNK, d_v) rows]: one stream per kv head   */
    float *scales;       /* NULL unless K or V is int8: (B, h_kv, slots/CHUNK)
                            chunks of [K scales (CHUNK/8, nbk, 8) paneled
                            like K | V scales (CHUNK, nbv)], MHA_Q8_BLOCK  */
    int nbk, nbv;        /* scale blocks per key / value row: ceil(d/32) for
                            an int8 K / V, else 0                           */
    int *len;            /* (B) tokens appended so far (next position)       */
    int *lo;             /* (B) oldest position still stored (ring, truncate) */
    int *upos;           /* (B, cap) the position slot s was stored with (its
                            cache position or options.positions): ALiBi
                            distances; RoPE is already in the stored K      */
    int *phys;           /* (h_kv) storage index of kv head g (permutation)  */
    int *labels_k;       /* (h_kv) labels of the layer's K blocks it holds   */
    int *labels_v;       /* (h_kv)                                           */
    float *kmax;         /* (B*h_kv, by storage index) largest L2 norm of a
                            key stored since the last reset: bounds scores
                            (only grows: mha_cache_kmax_live tightens it)   */
    mha_workspace *ws;   /* the decode calls' scratch, kept from one call to
                            the next (decode.c)                             */
    atomic_int *calls;   /* the public calls on it now: -1 one that changes
                            it, n > 0 n that read it, 0 none (the misuse
                            check of mha_cache_begin; its own allocation so
                            that a clone's copy of the struct never reads
                            what other calls are changing)                 */
};

/* The one check of mha.h's rule for caches, made by every public entry
 * that changes a cache (change = 1: mha_forward_cached*, append, reset,
 * truncate, compact, permute_heads, reorder, set_memory,
 * set_sink_tokens) or reads it with a status to report (change = 0:
 * attend, clone, get_info, save): a change needs the cache alone, reads
 * share it. Threads stepping one cache used to race on its lengths (a
 * length past the capacity, a saved file mha_cache_load refused),
 * silently; now the call that finds the cache busy fails with MHA_E_ARG
 * (fn names it) and changes nothing. One atomic compare-and-swap per call. Every begin
 * that returned MHA_OK is paired with one mha_cache_end (which returns s,
 * for `return mha_cache_end(c, 1, body(...))`). Internal code never calls
 * the public entries on a cache it holds (mha_cache_clear for a reset). */
mha_status mha_cache_begin(const mha_cache *c, int change, const char *fn);
mha_status mha_cache_end(const mha_cache *c, int change, mha_status s);
/* Empties sequence b (-1: all), checked: mha_cache_reset's work. */
void mha_cache_clear(mha_cache *c, int b);

/* Storage block (b, kv head g) of K and V, through the permutation index. */
static inline size_t mha_cache_kv_index(const mha_cache *c, int b, int g) {
    return (size_t)b * c->h_kv + (size_t)c->phys[g];
}

/* Offsets in data of block kv: the chunk holding slot s, in bytes; K of
 * slot s, dim 0, in K elements (dim d at + d*MHA_KPANEL; a panel start
 * when s % 8 == 0, and the panels of one chunk are consecutive); V row of
 * slot s, in V elements (rows of one chunk consecutive). A chunk's bytes
 * are CHUNK * (d_k ek + d_v ev), a multiple of 4 (CHUNK is), so both
 * element offsets are whole for any pair of types. */
static inline size_t mha_cache_chunk_byte(const mha_cache *c, size_t kv, int s) {
    return (kv * (size_t)c->slots + (size_t)(s - s % MHA_DECODE_CHUNK)) * ((size_t)c->d_k * c->ek + (size_t)c->d_v * c->ev);
}
static inline size_t mha_cache_k_off(const mha_cache *c, size_t kv, int s) {
    int j = s % MHA_DECODE_CHUNK;
    return mha_cache_chunk_byte(c, kv, s) / c->ek + (size_t)(j - j % MHA_KPANEL) * c->d_k + (size_t)(j % MHA_KPANEL);
}
static inline size_t mha_cache_v_off(const mha_cache *c, size_t kv, int s) {
    return (mha_cache_chunk_byte(c, kv, s) + (size_t)MHA_DECODE_CHUNK * c->d_k * c->ek) / c->ev +
           (size_t)(s % MHA_DECODE_CHUNK) * c->d_v;
}

/* The same for the int8 scales (in floats of c->scales): the scales of
 * K of slot s, block 0 (block b at + b*MHA_KPANEL), and of its V row. */
static inline size_t mha_cache_ks_off(const mha_cache *c, size_t kv, int s) {
    int j = s % MHA_DECODE_CHUNK;
    size_t chunk = (kv * (size_t)c->slots + (size_t)(s - j)) * (size_t)(c->nbk + c->nbv);
    return chunk + (size_t)(j - j % MHA_KPANEL) * c->nbk + (size_t)(j % MHA_KPANEL);
}
static inline size_t mha_cache_vs_off(const mha_cache *c, size_t kv, int s) {
    int j = s % MHA_DECODE_CHUNK;
    size_t chunk = (kv * (size_t)c->slots + (size_t)(s - j)) * (size_t)(c->nbk + c->nbv);
    return chunk + (size_t)MHA_DECODE_CHUNK * c->nbk + (size_t)j * c->nbv;
}

/* Dim d of the key stored at element offset k0 (mha_cache_k_off of block
 * kv, slot s) as fp32, whatever the storage type. */
static inline float mha_cache_key_at(const mha_cache *c, const mha_decode_kernels *kr, size_t k0, size_t kv,
                                     int s, int d) {
    size_t at = k0 + (size_t)d * MHA_KPANEL;
    if (c->kt == MHA_CACHE_F32) return ((const float *)c->data)[at];
    if (c->kt == MHA_CACHE_I8)
        return (float)((const int8_t *)c->data)[at] *
               c->scales[mha_cache_ks_off(c, kv, s) + (size_t)(d / MHA_Q8_BLOCK) * MHA_KPANEL];
    float f;
    kr->from_f16(&f, (const uint16_t *)c->data + at, 1);
    return f;
}

/* Whether a finite magnitude m stored as dt would become infinity:
 * float16 rounds |x| >= 65520 up to inf (65504 is its largest); fp32
 * holds every finite float. */
static inline int mha_cache_f16_overflows(mha_cache_dtype dt, double m) {
    return dt == MHA_CACHE_F16 && !(m < 65520.0);
}

/* The same for int8: a block whose largest magnitude is m reads back as
 * 127 * (m / 127) in fp32, two roundings that pass FLT_MAX for m = FLT_MAX
 * (every smaller float stays finite); the quantizer's own arithmetic. */
static inline int mha_cache_q8_overflows(mha_cache_dtype dt, double m) {
    return dt == MHA_CACHE_I8 && !isfinite(127.0f * ((float)m / 127.0f));
}

/* The largest L2 norm of the keys sequence b's kv head g still holds (its
 * live positions: a key rolled back by truncate or overwritten in the ring
 * no longer counts), in double; stored into kmax. The exact value behind
 * a refusal that kmax alone would make. Every live key counts, not only
 * the window's: a truncate may bring a stored key back into the window. */
double mha_cache_kmax_live(mha_cache *c, const mha_decode_kernels *kr, int b, int g);
/* The same norm without storing it (a reader's, e.g. mha_cache_attend). */
double mha_cache_kmax_scan(const mha_cache *c, const mha_decode_kernels *kr, int b, int g);

/* Slots of the ring that the positions past the sink tokens share. */
static inline int mha_cache_ring(const mha_cache *c) { return c->cap - c->n_sink; }

/* The slot of position p: p itself for a sink token (and without a
 * window, where p < cap), else n_sink + (p - n_sink) mod ring. */
static inline int mha_cache_slot_of(const mha_cache *c, int p) {
    return p < c->n_sink ? p : c->n_sink + (p - c->n_sink) % mha_cache_ring(c);
}

/* pos[i] = the position now stored in slot s0 + i of sequence b, for
 * i < n, or INT_MIN for a padding slot or one not holding a live position
 * (never written since the reset, overwritten, or rolled back by
 * truncate). One division per call: the ring's slots hold consecutive
 * positions with a single wrap; the sink slots hold their own. */
static inline void mha_cache_slot_positions(int *pos, const mha_cache *c, int b, int s0, int n) {
    int last = c->len[b] - 1, ns = c->n_sink, R = mha_cache_ring(c);
    int lo = c->lo[b] > ns ? c->lo[b] : ns; /* oldest live ring position */
    if (last < 0) {
        for (int i = 0; i < n; i++) pos[i] = INT_MIN;
        return;
    }
    int lr = last - ns; /* ring index of `last` (< 0: still in the sinks) */
    int base = lr < 0 ? 0 : lr / R * R, wrap = lr < 0 ? -1 : lr % R;
    for (int i = 0; i < n; i++) {
        int s = s0 + i, k = s - ns, p;
        if (s >= c->cap) p = INT_MIN;
        else if (s < ns) p = s <= last ? s : INT_MIN;
        else p = k <= wrap ? ns + base + k : lr < 0 || base == 0 ? INT_MIN : ns + base - R + k;
        pos[i] = p == INT_MIN || (p >= ns && p < lo) ? INT_MIN : p;
    }
}

/* The first position of the window and chunk of a query at position p
 * (INT_MIN: neither), whatever the cache still stores: also for positions
 * along a tree token's own sequence (mha_cache_tree_pos), which sit below
 * the cache positions that lo counts. */
static inline int mha_cache_window_first(const mha_cache *c, int p, int left, int chunk) {
    if (c->window && (left < 0 || left > c->window - 1)) left = c->window - 1;
    int first = left >= 0 ? p - left : INT_MIN;
    if (chunk > 0 && p - p % chunk > first) first = p - p % chunk;
    return first;
}

/* First position a query at position p of sequence b attends: the oldest
 * stored, within the tighter of the cache's window and left (< 0: none),
 * and inside p's chunk of `chunk` positions (0: none; options.chunk_size). */
static inline int mha_cache_first_key(const mha_cache *c, int b, int p, int left, int chunk) {
    const int first = mha_cache_window_first(c, p, left, chunk);
    return first > c->lo[b] ? first : c->lo[b];
}

/* Whether a query at position p, whose window starts at `first`, attends
 * the key at position pj (INT_MIN: none): causal, in the window or a sink. */
static inline int mha_cache_attends(const mha_cache *c, int pj, int first, int p) {
    return pj != INT_MIN && pj <= p && (pj >= first || pj < c->n_sink);
}

/* The position of query i of the n[b] newest of sequence b: causal, the
 * newest keys; in a cross-attention memory every query stands after all
 * of its sequence's keys (so it attends each of them). */
static inline int mha_cache_query_position(const mha_cache *c, int b, int n, int i) {
    return c->cross ? c->len[b] - 1 : c->len[b] - n + i;
}

/* The largest query norm an int8 K lets through: its decode kernels sum
 * q . codes over a block of MHA_Q8_BLOCK dims (codes up to 127) before the
 * block's scale, a sum fp32 must hold whatever the scale (tiny keys give
 * tiny scales: the score's bound cannot see it); INFINITY for other K. */
static inline double mha_cache_q8_query_limit(const mha_cache *c) {
    const int w = c->d_k < MHA_Q8_BLOCK ? c->d_k : MHA_Q8_BLOCK;
    return c->kt == MHA_CACHE_I8 ? FLT_MAX / (2.0 * 127.0 * sqrt((double)w)) : INFINITY;
}

/* The oldest position the next token of a sequence of len tokens still
 * reads (its window's first, never below the sink tokens, which are never
 * evicted): a length whose need lies below the oldest stored position is
 * one no cache can continue (mha_cache_truncate, mha_cache_load). */
static inline int mha_cache_next_needs(const mha_cache *c, int len) {
    int need = c->window ? len - (c->window - 1) : 0;
    if (need < 0) need = 0;
    return need < c->n_sink ? c->n_sink : need;
}

/* The position slot s of sequence b was stored with. */
static inline int mha_cache_user_position(const mha_cache *c, int b, int s) {
    return c->upos[(size_t)b * c->cap + s];
}

/* Options of one attention call over the cache. */
typedef struct {
    float scale;          /* multiplies q . k                                 */
    float softcap;        /* 0: none; else s -> softcap tanh(s / softcap)     */
    const float *slopes;  /* (h) ALiBi slopes or NULL                         */
    const float *sinks;   /* (h) sink logits or NULL                          */
    const mha_kernels *prefill; /* its attn_softcap (softcap != 0)            */
    int left;             /* <0: unbounded; else keys p >= position - left
                             (the cache's own window applies as well)         */
    int chunk;            /* 0: none; else keys in the query's chunk of that
                             many positions (options.chunk_size)              */
    const float *extra_k; /* (h_kv, d_k) appended key (add_bias_kv) or NULL  */
    const float *extra_v; /* (h_kv, d_v)                                      */
    int zero_attn;        /* 1: a zero key/value row after everything         */
    int nan_rows;         /* 1: a row with no allowed key gets NaN, else 0    */
    const uint8_t *tree;  /* NULL, or (tree_batch, tree_T, tree_T): the call's
                             new tokens among themselves (options.keep_mask
                             of the cached forward: tree attention)        */
    int tree_T, tree_batch; /* tree_batch 1: one mask for every sequence    */
    const int *tree_rank; /* NULL, or (tree_batch, tree_T, tree_T) when a
                             window or chunk applies to a tree: entry (t, j)
                             counts the new tokens row t sees before j, so
                             new token j stands at position base + (t, j)
                             in the sequence t sees (mha_cache_tree_pos) */
} mha_decode_opts;

/* Whether the tree mask lets the query at position p of sequence b attend
 * the key at position pj <= p; base: the sequence's first position of the
 * call (its length before it). Keys cached before the call are not masked. */
static inline int mha_cache_tree_keeps(const mha_decode_opts *o, int b, int base, int p, int pj) {
    if (!o->tree || pj < base) return 1;
    const size_t row = (size_t)(o->tree_batch == 1 ? 0 : b) * o->tree_T + (size_t)(p - base);
    return o->tree[row * o->tree_T + (size_t)(pj - base)] != 0;
}

/* The position of the key at cache position pj in the sequence the query
 * at cache position p of sequence b sees (pj <= p, a key the tree keeps;
 * pj == p: the query's own): the cached tokens, then the new tokens its
 * tree row keeps, in order. A window or chunk counts positions along that
 * sequence, so a token of a tree sees the tokens before the call that it
 * would see on its path (its cache position counts its siblings too).
 * Without tree_rank (no tree, or no window or chunk): pj. */
static inline int mha_cache_tree_pos(const mha_decode_opts *o, int b, int base, int p, int pj) {
    if (!o->tree_rank || pj < base) return pj;
    const size_t row = (size_t)(o->tree_batch == 1 ? 0 : b) * o->tree_T + (size_t)(p - base);
    return base + o->tree_rank[row * o->tree_T + (size_t)(pj - base)];
}

/* The first position a query at pe (mha_cache_tree_pos of its own) of
 * sequence b attends, for mha_cache_attends with the keys' tree
 * positions: a tree row's is not clamped to the oldest stored cache
 * position (a key no longer stored reads as INT_MIN anyway). */
static inline int mha_cache_row_first(const mha_cache *c, const mha_decode_opts *o, int b, int pe) {
    return o->tree_rank ? mha_cache_window_first(c, pe, o->left, o->chunk)
                        : mha_cache_first_key(c, b, pe, o->left, o->chunk);
}

/* Row arrays: sequence b's tokens are rows row0[b], row0[b]+1, ... of
 * k (rows, h_kv*d_k), v (rows, h_kv*d_v), q (rows, h*d_k), z (rows, h*d_v)
 * (row0[b] = b*T for a (B,T,...) array; prefix sums for packed rows).
 *
 * Stores rows row0[b] + t0 .. + n[b]-1 at sequence b's next positions;
 * len[b] += n[b]. pos (rows) gives each row's position for ALiBi (NULL:
 * its cache position). Arguments are already validated (capacity,
 * window). */
void mha_cache_store(const mha_exec *ex, mha_cache *c, const float *k, const float *v, const int *pos,
                     const int *row0, int t0, const int *n);

/* MHA_E_ARG unless n[b] more tokens fit every sequence (the capacity
 * without a window; at most capacity - window + 1 per call with one). */
mha_status mha_cache_check_room(const mha_cache *c, const int *n, const char *fn);

/* z rows row0[b] + t0 .. + n[b]-1 = attention of the queries q in the same
 * rows, which sit at the last n[b] positions of sequence b, over the
 * cached keys (causal, bottom-right). stats, when not NULL, receives
 * (rows, h, 2): each row's max score and softmax sum (for probabilities).
 * Runs on ex's decode kernels and threads. Returns MHA_E_NOMEM or MHA_OK. */
mha_status mha_decode_attend(const mha_exec *ex, float *z, float *stats, const mha_cache *c, const float *q,
                             const int *row0, int t0, const int *n, const mha_decode_opts *o);

/* The range rule of attending over the cache ("Numbers" in mha.h): whether
 * every query of sequence b reading kv head g (q (rows, h*d_k), its rows
 * row0[b] .. + n[b]-1) keeps its scores' bound |q| kmax |scale| within
 * MHA_FAST_SCORE_LIMIT and its norm within mha_cache_q8_query_limit; else
 * *bad names the first that does not (head r, query t, its norm and
 * bound). mha_forward_cached and mha_cache_attend both ask it. */
typedef struct { int r, t; double norm, bound; } mha_score_excess;
int mha_cache_scores_fit(const mha_cache *c, const float *q, const int *row0, const int *n, int b, int g, double kmax,
                         float scale, mha_score_excess *bad);

/* MHA_E_SHAPE unless the layer has the shape the cache was made for
 * (d_model, heads, d_k, d_v, d_kv_in, d_v_in); fn names the entry. */
mha_status mha_cache_check_layer(const mha_cache *c, const mha_layer *L, const char *fn);

/* mha_forward_cached on a resolved exec (tests pass one with a trace). */
mha_status mha_forward_cached_exec(const mha_exec *ex, const mha_layer *L, mha_cache *c, float *y,
                                   const mha_capture *cap, const float *x, int T, const int *n_new,
                                   const mha_options *opt);

/* New rows of one mha_forward_cached call (N = sum of n_new) from which
 * the projections run on the fast path's packed GEMM (mha_gemm, gemm.h,
 * with the weights mha_fast_prepare packed once per layer) instead of
 * mha_decode_gemm below. Measured (d_model 2048, h 32, h_kv 8, 2 threads,
 * weights hot in the 480 MiB L3, medians of 21; Q|K|V, W_O alike):
 *   N        1     2     4     5     8    16    32  (ms)
 *   decode  0.49  0.68  1.01  3.00  3.30  6.13  13.4
 *   mha_gemm 0.68 0.61  0.69  1.12  1.78  2.38  3.64
 * One row is a pure stream over the weights, where decode_gemm's k-split
 * wins; from two rows mha_gemm's 6x16 register tiles win. The choice
 * depends on N alone, never on the thread count: bits stay thread-free. */
#define MHA_PREFILL_MIN_ROWS 2

#endif /* MHA_CACHE_INTERNAL_H */
