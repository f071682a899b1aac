/* decode.c — flash-decoding attention of new queries over a KV cache.
 *
 * Legend: B sequences, rows of q/z (see cache_internal.h), h heads, h_kv kv heads,
 * n_rep = h / h_kv query heads per kv head, d_k, d_v.
 *
 * Work is cut into units (sequence b, kv head g, tile of up to QTILE query
 * rows of that group: rows are (token, rep) so the keys of one chunk are
 * read once for all n_rep heads sharing them - the point of GQA/MQA). The
 * keys of a unit are cut into chunks of MHA_DECODE_CHUNK cache slots. For
 * each (unit, chunk) a kernel computes the partial softmax state of every
 * row (max, sum, acc = sum_j exp(s_j - max) v_j); the partials are then
 * merged in chunk order with online-softmax rescaling:
 *     M = max(M1, M2),  L = L1 e^(M1-M) + L2 e^(M2-M),  A likewise,
 * and z = A / L, in fixed groups of chunks (group_partial: 4 chunks for
 * grouped units, 1 otherwise), the groups' results merged in order. When
 * there are few units (decode: B * h_kv small) the (unit, group) tasks
 * run in parallel and the merge follows; otherwise each unit runs its
 * groups in order. Both perform the same operations in the same order,
 * so the bits depend on the chunk and group sizes alone, never on the
 * thread count or on which mode ran.
 *
 * Grouped heads (a unit of at least GROUPED_ROWS rows, MQA and wide GQA,
 * where the table has the scores_t kernels): the chunk's K and V are
 * widened to fp32 once (fp16, int8; fp32 is read in place) and all rows
 * run against them with the scores stored transposed, keys by rows, so
 * that one key element meets 16 query rows per FMA (decode_kernels.h).
 * Which layout a chunk uses depends on the unit's rows alone.
 */
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
#include <limits.h>
#include <math.h>
#include <stdatomic.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "cache/cache_internal.h"
#include "forward/task_ranges.h"

_Static_assert((int)MHA_CACHE_F32 == (int)MHA_DK_F32 && (int)MHA_CACHE_F16 == (int)MHA_DK_F16 && (int)MHA_CACHE_I8 == (int)MHA_DK_I8,
               "the grouped kernels take the cache's storage type as their kind");

#define QTILE 32             /* query rows per unit                        */
#define FUSED_F16_ROWS 4     /* fp16 widened in registers up to this many rows */
#define FUSED_I8_ROWS 8      /* int8 likewise (8 rows: 1.6x the widened chunk,
                              * AVX-512, h_kv 1, bench/LIMITS.md)           */
#define GROUPED_ROWS 16       /* rows from which a unit runs grouped (above) */
#define SPLIT_BELOW_UNITS 64 /* split keys across tasks when units < this  */
#define SPLIT_MAX_FLOATS ((size_t)1 << 26) /* cap on partial storage       */
#define GROUP_CHUNKS 4       /* chunks a unit folds per task, at most (below) */
#define GROUP_MIN_TASKS 16   /* tasks a row unit keeps when it folds chunks */

/* ------------------------------------------------------------- plan */

typedef struct {
    int b, g, i0, i1;   /* rows [i0, i1) of the group's n[b]*n_rep rows     */
    int ulo, uhi;       /* positions any row of the unit may attend          */
    int first, count;   /* its chunks: chunk_of[first .. first+count)        */
    int group;          /* chunks per fold group (see group_partial)         */
    int tfirst, tcount; /* its tasks (fold groups): tfirst .. tfirst+tcount  */
} unit;

/* One attention call: its inputs, outputs and kernels. */
typedef struct {
    const mha_cache *c;
    const mha_decode_kernels *kr;
    const mha_decode_opts *o;
    const float *q;
    float *z, *stats;
    const int *n, *row0;
    int t0, n_rep;
    int policy; /* MHA_DECODE_PF_BURSTS, _STREAM or _STREAM_L2 (mha_decode_prefetch_policy) */
} decode_call;

static int row_position(const decode_call *dc, int b, int i) {
    return mha_cache_query_position(dc->c, b, dc->n[b], i / dc->n_rep);
}

/* Whether chunk ch overlaps the slots of positions [ulo, uhi] or of the
 * sink tokens (slots 0..n_sink-1, attended by every row). */
static int chunk_needed(const mha_cache *c, int ulo, int uhi, int ch) {
    int cs = ch * MHA_DECODE_CHUNK, ce = cs + MHA_DECODE_CHUNK, ns = c->n_sink;
    if (uhi < ulo) return 0;
    if (cs < ns) return 1; /* holds sink slots */
    if (ulo < ns) ulo = ns;
    int count = uhi - ulo + 1, a = mha_cache_slot_of(c, ulo);
    if (count <= 0) return 0;
    if (a + count <= c->cap) return cs < a + count && ce > a;
    return (cs < c->cap && ce > a) || (cs < ns + a + count - c->cap && ce > ns); /* wrapped to the ring's start */
}

/* ------------------------------------------------------ one partial */

typedef struct {
    float *qt;  /* (QTILE, d_k) the unit's queries          */
    float *qtt; /* (d_k, QTILE) the same transposed (grouped) */
    float *s;   /* (QTILE, CHUNK) scores, then weights; grouped:
                 * (CHUNK, QTILE), keys by rows              */
    int *pos;   /* (CHUNK) positions of the chunk's slots    */
    int *upos;  /* (CHUNK) their stored positions (ALiBi)    */
    float *kf;  /* (CHUNK, d_k) fp32 keys (fp16, int8 cache) */
    float *vf;  /* (CHUNK, d_v) fp32 values (fp16, int8)     */
    float *mx, *sum; /* (QTILE) max and sum of one chunk     */
    float *part;/* (QTILE, 2 + d_v) one partial              */
    float *grp; /* (QTILE, 2 + d_v) one group's fold         */
    float *run; /* (QTILE, 2 + d_v) running merge            */
} scratch;

/* Each array from a 64-byte line of its own, all in one block per thread:
 * with the heap evicted (a decode step after the other layers' traffic)
 * a malloc/free pair cost ~0.35 us (20 pairs: 7 us, one core, round 7),
 * and there were twelve per thread. The floats of one thread's block;
 * with b, its arrays placed from b on. */
static size_t scratch_layout(scratch *w, const mha_cache *c, float *b) {
    const size_t pw = 2 + (size_t)c->d_v, line = 64 / sizeof(float);
    /* elements of 4 bytes (float or int) of each array, in struct order */
    const size_t n[12] = {QTILE * (size_t)c->d_k, QTILE * (size_t)c->d_k, QTILE * MHA_DECODE_CHUNK,
                          MHA_DECODE_CHUNK, MHA_DECODE_CHUNK, MHA_DECODE_CHUNK * (size_t)c->d_k,
                          MHA_DECODE_CHUNK * (size_t)c->d_v, QTILE, QTILE, QTILE * pw, QTILE * pw, QTILE * pw};
    size_t at[12], total = 0;
    for (int i = 0; i < 12; i++) at[i] = total, total += (n[i] + line - 1) / line * line;
    _Static_assert(sizeof(int) == sizeof(float), "int and float arrays share the block's units");
    if (!b) return total;
    w->qt = b + at[0], w->qtt = b + at[1], w->s = b + at[2];
    w->pos = (int *)(b + at[3]), w->upos = (int *)(b + at[4]);
    w->kf = b + at[5], w->vf = b + at[6], w->mx = b + at[7], w->sum = b + at[8];
    w->part = b + at[9], w->grp = b + at[10], w->run = b + at[11];
    return total;
}

/* Whether the unit's chunks run grouped (see the top of this file). */
static int unit_grouped(const decode_call *dc, const unit *u) {
    return u->i1 - u->i0 >= GROUPED_ROWS && dc->kr->scores_t;
}

/* qt (rows, d_k) = scale * the unit's queries: scores need no second pass
 * (and only chunks that cut a row's range need a mask pass); grouped
 * units also get them transposed in qtt (d_k, QTILE). */
static void gather_queries(float *qt, float *qtt, const decode_call *dc, const unit *u) {
    const mha_cache *c = dc->c;
    for (int i = u->i0; i < u->i1; i++) {
        int t = dc->t0 + i / dc->n_rep, r = u->g * dc->n_rep + i % dc->n_rep;
        const float *src = dc->q + ((size_t)dc->row0[u->b] + t) * c->h * c->d_k + (size_t)r * c->d_k;
        float *dst = qt + (size_t)(i - u->i0) * c->d_k;
        for (int d = 0; d < c->d_k; d++) dst[d] = src[d] * dc->o->scale;
    }
    if (!unit_grouped(dc, u)) return;
    for (int i = 0; i < u->i1 - u->i0; i++)
        for (int d = 0; d < c->d_k; d++) qtt[(size_t)d * QTILE + i] = qt[(size_t)i * c->d_k + d];
}

#define PREFETCH_PARTS 4 /* the next chunk's pieces, one between each two kernels
                          * (one chunk ahead: 2 gave nothing; 5 pieces, the
                          * scores cut in two: no gain, round 7) */

/* One software prefetch into all cache levels, or into L2 and below
 * (to_l2). Written as an asm statement: GCC 12 finds a function whose
 * only effect is __builtin_prefetch "looping pure" and deletes the calls
 * to it (which it did to the whole-chunk prefetch this replaced: it never
 * ran). */
static inline void prefetch_line(const char *p, int to_l2) {
#if defined(__x86_64__) || defined(__i386__)
    if (to_l2) __asm__ volatile("prefetcht1 %0" : : "m"(*p));
    else __asm__ volatile("prefetcht0 %0" : : "m"(*p));
#else
    __builtin_prefetch(p, 0, to_l2 ? 2 : 3);
#endif
}

/* ------------------------------------------------ prefetch by CPU */

/* Which prefetch tuning the calls use. DECODE_PF_STREAM (round 8, AMD
 * Zen 5): the next chunk's bytes requested a line per loop step of this
 * chunk's kernels (unit_prefetches, prefetch_point). DECODE_PF_STREAM_L2:
 * the same into L2, where the L1D holds less than 48 KiB (Zen 1-4; Intel
 * before Ice Lake by analogy, not measured): the chunk requested ahead
 * (up to 64 KiB, 128 keys of fp32 K and V) is twice such an L1D, and
 * requests into it evicted the lines of the chunk being computed (Zen 4,
 * cold, 2 threads: 0.70-0.94x the time into L2; round 15).
 * DECODE_PF_BURSTS (the Xeon's of rounds 6-7): four bursts per chunk,
 * one-row fp32 units left to the hardware prefetchers. The stream won on
 * an Intel Xeon too (48 KiB L1D, cold, 2 threads: 0.67-0.83x the bursts'
 * time; bench/LIMITS.md, round 17), so every CPU streams; only AMD before
 * Zen keeps the bursts (not measured since). An L1D the CPU does not
 * report keeps the L1 stream. Probed once (mha_probed_once); no choice
 * changes bits: a prefetch only moves bytes between cache levels. */
static _Atomic int forced_policy = -1, probed_policy = -1;

static int cpu_policy(void) {
    const unsigned family = mha_cpu_amd_family(); /* 0: not AMD */
    if (family > 0 && family < 0x17) return MHA_DECODE_PF_BURSTS; /* AMD before Zen */
    const unsigned l1d_kib = mha_cpu_l1d_kib(); /* 0: not reported */
    return l1d_kib > 0 && l1d_kib < 48 ? MHA_DECODE_PF_STREAM_L2 : MHA_DECODE_PF_STREAM;
}

void mha_decode_force_prefetch_policy(int policy) { atomic_store(&forced_policy, policy); }

int mha_decode_prefetch_policy(void) { return mha_probed_once(&forced_policy, &probed_policy, cpu_policy); }

/* AMD Zen (family 0x17 on), probed once: unit_prefetches' fp32 rule. */
static _Atomic int forced_zen = -1, probed_zen = -1;
static int cpu_is_zen(void) { return mha_cpu_amd_family() >= 0x17; }

enum { PF_NONE, PF_BURSTS, PF_STREAM }; /* how a unit requests its next chunk */

/* Whether unit u prefetches its chunks. A cold chunk (a decode
 * step of a multi-layer model finds its cache evicted by the other
 * layers) is fetched by the hardware prefetchers only a few lines ahead
 * of the loads, so the kernels wait for memory and memory waits for the
 * kernels: their times add up. Requesting the next chunk in pieces while
 * this one is computed lets them overlap: 1.13-1.25x faster cold for fp16
 * and int8, 1.06-1.10x for fp32 with 4 rows. fp32 read by one row (MHA) is
 * memory-bound with the hardware prefetchers alone, and the extra requests
 * cost it 7%, the grouped kernels (MQA) with int8 5% (bench/LIMITS.md,
 * round 6): on the Xeon, with the bursts. With the stream one-row fp32
 * adds up too (Zen 5: 56% of the cold read, one thread); its requests
 * make it 0.78-0.85x (round 8), on the Xeon of round 17 0.97-1.02x. A
 * table may take the stream for some units only (prefetch_streams: the
 * AVX2 table for fp32 with 4 rows and one or two fp16 rows, round 33); the
 * others, and a table without a stream (scalar), request in bursts
 * whatever the policy, and one-row fp32 then keeps the bursts' rule (on
 * that Xeon, AVX2 with one-row fp32 requests: 1.11-1.13x slower). On AMD
 * Zen the bursts (into L2) gave fp32 GQA nothing at all: an AVX2 Zen 3,
 * h_kv 8, without them 0.88-0.96x the time cold and 0.88-0.91x hot
 * (bench/LIMITS.md round 32), so fp32 never bursts there; fp16 and int8
 * keep them (0.90-1.13x without, case by case: no rule beyond the host's
 * noise). Returns PF_NONE, PF_BURSTS or PF_STREAM. */
static int unit_prefetches(const decode_call *dc, const unit *u) {
    const mha_cache *c = dc->c;
    const int m = u->i1 - u->i0;
    if (unit_grouped(dc, u)) return PF_NONE;
    if (dc->policy != MHA_DECODE_PF_BURSTS && dc->kr->prefetch_stream &&
        (!dc->kr->prefetch_streams || dc->kr->prefetch_streams(m, (int)c->kt, (int)c->vt)))
        return PF_STREAM;
    const int fp32 = c->kt == MHA_CACHE_F32 && c->vt == MHA_CACHE_F32;
    if (fp32 && dc->policy != MHA_DECODE_PF_BURSTS && mha_probed_once(&forced_zen, &probed_zen, cpu_is_zen))
        return PF_NONE;
    return m > 1 || !fp32 ? PF_BURSTS : PF_NONE;
}

/* The chunk a thread computes after the current one, whose bytes it
 * requests meanwhile: the chunk at slot s0 of storage block kv; none when
 * s0 < 0 (the thread's next chunk is not known: another thread may take
 * it, and a request for it would only take bandwidth). */
typedef struct {
    size_t kv;
    int s0;
} next_chunk;

static const next_chunk no_next = {0, -1};

/* Piece `part` of PREFETCH_PARTS of the K/V bytes (and the int8 scales)
 * of chunk nx. */
static void prefetch_part(const mha_cache *c, const next_chunk *nx, int part, int to_l2) {
    const size_t kv = nx->kv;
    const int s0 = nx->s0;
    if (s0 < 0 || s0 >= c->slots) return;
    const char *p = (const char *)c->data + mha_cache_chunk_byte(c, kv, s0);
    size_t bytes = (size_t)MHA_DECODE_CHUNK * ((size_t)c->d_k * c->ek + (size_t)c->d_v * c->ev);
    for (size_t o = bytes * part / PREFETCH_PARTS / 64 * 64; o < bytes * (part + 1) / PREFETCH_PARTS; o += 64)
        prefetch_line(p + o, to_l2);
    if (!c->scales) return;
    const char *sp = (const char *)(c->scales + mha_cache_ks_off(c, kv, s0));
    bytes = sizeof(float) * MHA_DECODE_CHUNK * (size_t)(c->nbk + c->nbv);
    for (size_t o = bytes * part / PREFETCH_PARTS / 64 * 64; o < bytes * (part + 1) / PREFETCH_PARTS; o += 64)
        prefetch_line(sp + o, to_l2);
}

/* Tiles of the AVX-512 scores kernel (scores_impl) over np panels of 8
 * keys for a group of 4 rows or for one row: one prefetch step per dim
 * each. */
static size_t score_tiles(int np, int four_rows) {
    int t, r;
    if (four_rows) t = np / 6, r = np % 6, t += r / 4, r %= 4; /* 6, 4, 2, 1 panels (4 rows) */
    else t = np / 8, r = np % 8;                               /* 8, 2, 1 panels (one row)  */
    return (size_t)(t + r / 2 + r % 2);
}

/* The requests of chunk nx at prefetch point `part` (of PREFETCH_PARTS,
 * the first before the scores, the last after the values) of a chunk of
 * m rows and nk keys, as unit_prefetches chose (`how`). PF_STREAM: the
 * K/V bytes spread over this chunk's kernels (prefetch_stream), as many
 * lines per step as there are lines per step of their loops, to the
 * nearest (the table's prefetch_steps, else the AVX-512 kernels' tiles:
 * score_tiles, and the values one step per key per 64 columns of each
 * row group), at least one, the rest after the values; the int8 scales
 * (a few lines) at once. Counting the scores of 4 rows in tiles of 32
 * keys (they run 48) and rounding down left a third of an fp16 chunk of
 * 4 rows for the end (9% of a hot call's samples); rounding up instead
 * made fp32 GQA slower (round 15). PF_BURSTS: the four bursts (the
 * tuning of rounds 6-7). Cold, one thread, against the bursts:
 * bench/LIMITS.md, round 8. */
static void prefetch_point(const decode_call *dc, const next_chunk *nx, int how, int part, int m, int nk) {
    const mha_cache *c = dc->c;
    const int to_l2 = dc->policy == MHA_DECODE_PF_STREAM_L2;
    if (how == PF_BURSTS) {
        prefetch_part(c, nx, part, to_l2);
        return;
    }
    if (part != 0 && part != PREFETCH_PARTS - 1) return;
    const int live = nx->s0 >= 0 && nx->s0 < c->slots;
    const size_t bytes = (size_t)MHA_DECODE_CHUNK * ((size_t)c->d_k * c->ek + (size_t)c->d_v * c->ev);
    const char *p = live ? (const char *)c->data + mha_cache_chunk_byte(c, nx->kv, nx->s0) : NULL;
    if (part == 0) {
        const size_t g = (size_t)m / 4, r = (size_t)m % 4; /* 4-row groups, single rows */
        const int np = (nk + MHA_KPANEL - 1) / MHA_KPANEL;
        const size_t steps = dc->kr->prefetch_steps
                                 ? dc->kr->prefetch_steps(m, nk, c->d_k, c->d_v, (int)c->kt, (int)c->vt)
                                 : (g * score_tiles(np, 1) + r * score_tiles(np, 0)) * c->d_k +
                                       (g + r) * (size_t)nk * ((c->d_v + 63) / 64);
        const size_t per = (bytes / 64 + steps / 2) / steps;
        if (!live) return;
        dc->kr->prefetch_stream(p, p + bytes, per > 0 ? (int)per : 1, to_l2);
        if (!c->scales) return;
        const char *sp = (const char *)(c->scales + mha_cache_ks_off(c, nx->kv, nx->s0));
        for (size_t o = 0; o < sizeof(float) * MHA_DECODE_CHUNK * (size_t)(c->nbk + c->nbv); o += 64)
            prefetch_line(sp + o, to_l2);
        return;
    }
    const char *rest = dc->kr->prefetch_stream(NULL, NULL, 0, to_l2);
    for (; live && rest && rest < p + bytes; rest += 64) prefetch_line(rest, to_l2);
}

/* Soft-cap, then ALiBi, on the scores w->s of the m rows and nk keys whose
 * slots are w->pos[j0 ..], score (i, j) at w->s[i * rs + j * ks]:
 * s -= slope_r |p_i - p_j| with the positions the tokens were stored with
 * (exact in int). Slots that hold no live position are masked after this. */
static void variants_chunk(scratch *w, const decode_call *dc, const unit *u, int m, int j0, int nk, size_t rs,
                           size_t ks) {
    const mha_cache *c = dc->c;
    const mha_decode_opts *o = dc->o;
    if (o->softcap != 0.0f) { /* elementwise: the transposed scores are nk rows of m */
        if (ks == 1) mha_attn_softcap_get(o->prefill)(w->s, rs, o->softcap, m, nk);
        else mha_attn_softcap_get(o->prefill)(w->s, ks, o->softcap, nk, m);
    }
    if (!o->slopes) return;
    for (int j = 0; j < nk; j++) {
        int pj = w->pos[j0 + j];
        w->upos[j] = pj == INT_MIN ? 0 : mha_cache_user_position(c, u->b, mha_cache_slot_of(c, pj));
    }
    for (int i = 0; i < m; i++) {
        const int r = u->g * dc->n_rep + (u->i0 + i) % dc->n_rep;
        const int pi = mha_cache_user_position(c, u->b, mha_cache_slot_of(c, row_position(dc, u->b, u->i0 + i)));
        const float slope = o->slopes[r];
        float *row = w->s + (size_t)i * rs;
        for (int j = 0; j < nk; j++) row[(size_t)j * ks] -= slope * (float)abs(pi - w->upos[j]);
    }
}

/* The elements at offset off (in elements of type dt) of the cache as
 * fp32: in place for fp32, else widened into buf; rows x (d, lanes)
 * elements (K: panels of 8 lanes; V: rows), int8 with scales sc. */
static const float *widen(const decode_call *dc, mha_cache_dtype dt, float *buf, size_t off, const float *sc,
                          size_t rows, int d, int lanes) {
    if (dt == MHA_CACHE_F32) return (const float *)dc->c->data + off;
    if (dt == MHA_CACHE_F16) dc->kr->from_f16(buf, (const uint16_t *)dc->c->data + off, rows * d * lanes);
    else dc->kr->from_q8(buf, (const int8_t *)dc->c->data + off, sc, rows, d, lanes);
    return buf;
}

/* w->s (m, nk) = scores of the unit's m scaled queries w->qt against
 * keys jlo .. jlo+nk-1 of block kv, whatever K's storage type: fp32
 * read in place; fp16 / int8 widened in registers for few rows (each
 * element once per row group), else widened once into w->kf. The int8
 * kernels round differently from the fp32 ones on the widened chunk
 * (one scale per block): which one runs depends on the unit's rows
 * alone, never on the thread count. */
static void chunk_scores(scratch *w, const decode_call *dc, size_t kv, int jlo, int m, int nk) {
    const mha_cache *c = dc->c;
    const mha_decode_kernels *kr = dc->kr;
    size_t koff = mha_cache_k_off(c, kv, jlo);
    const float *ks = c->nbk ? c->scales + mha_cache_ks_off(c, kv, jlo) : NULL;
    if (c->kt == MHA_CACHE_I8 && m <= FUSED_I8_ROWS) {
        kr->scores_q8(w->s, MHA_DECODE_CHUNK, w->qt, c->d_k, (const int8_t *)c->data + koff, ks, m, nk, c->d_k);
        return;
    }
    if (c->kt == MHA_CACHE_F16 && m <= FUSED_F16_ROWS) {
        kr->scores_h(w->s, MHA_DECODE_CHUNK, w->qt, c->d_k, (const uint16_t *)c->data + koff, m, nk, c->d_k);
        return;
    }
    const float *kp = widen(dc, c->kt, w->kf, koff, ks, (size_t)nk / MHA_KPANEL, c->d_k, MHA_KPANEL);
    kr->scores(w->s, MHA_DECODE_CHUNK, w->qt, c->d_k, kp, m, nk, c->d_k);
}

/* acc (m, d_v), row stride ldacc, = the weights w->s (m, nk) times the
 * values jlo .. jlo+nk-1 of block kv, whatever V's storage type (as
 * chunk_scores: in registers for few rows, else widened into w->vf). */
static void chunk_values(float *acc, int ldacc, scratch *w, const decode_call *dc, size_t kv, int jlo, int m,
                         int nk) {
    const mha_cache *c = dc->c;
    const mha_decode_kernels *kr = dc->kr;
    size_t voff = mha_cache_v_off(c, kv, jlo);
    const float *vs = c->nbv ? c->scales + mha_cache_vs_off(c, kv, jlo) : NULL;
    if (c->vt == MHA_CACHE_I8 && m <= FUSED_I8_ROWS) {
        kr->accumulate_q8(acc, ldacc, w->s, MHA_DECODE_CHUNK, (const int8_t *)c->data + voff, vs, m, nk, c->d_v);
        return;
    }
    if (c->vt == MHA_CACHE_F16 && m <= FUSED_F16_ROWS) {
        kr->accumulate_h(acc, ldacc, w->s, MHA_DECODE_CHUNK, (const uint16_t *)c->data + voff, m, nk, c->d_v);
        return;
    }
    const float *vp = widen(dc, c->vt, w->vf, voff, vs, (size_t)nk, c->d_v, 1);
    kr->accumulate(acc, ldacc, w->s, MHA_DECODE_CHUNK, vp, m, nk, c->d_v);
}

/* Grouped: w->s (nk, QTILE) = the scores, keys by rows, of the m scaled
 * queries w->qtt against keys jlo .. jlo+nk-1 of block kv; fp16 / int8
 * K widened panel by panel into w->kf (L1), once for all rows. */
static void chunk_scores_t(scratch *w, const decode_call *dc, size_t kv, int jlo, int m, int nk) {
    const mha_cache *c = dc->c;
    const float *ks = c->nbk ? c->scales + mha_cache_ks_off(c, kv, jlo) : NULL;
    const char *k = (const char *)c->data + mha_cache_k_off(c, kv, jlo) * c->ek;
    dc->kr->scores_t(w->s, QTILE, w->qtt, QTILE, k, ks, (int)c->kt, w->kf, m, nk, c->d_k);
}

/* Grouped: acc (m, d_v) = the weights w->s (nk, QTILE) times the values,
 * fp16 / int8 V widened 32 rows at a time into w->vf, once for all rows. */
static void chunk_values_t(float *acc, int ldacc, scratch *w, const decode_call *dc, size_t kv, int jlo, int m,
                           int nk) {
    const mha_cache *c = dc->c;
    const float *vs = c->nbv ? c->scales + mha_cache_vs_off(c, kv, jlo) : NULL;
    const char *v = (const char *)c->data + mha_cache_v_off(c, kv, jlo) * c->ev;
    dc->kr->accumulate_t(acc, ldacc, w->s, QTILE, v, vs, (int)c->vt, w->vf, m, nk, c->d_v);
}

/* Whether slots [cs, ce) of sequence b hold the live positions cs .. ce-1
 * (no sink tokens, the ring not yet wrapped, nothing rolled back or
 * dropped there): what mha_cache_slot_positions computes slot by slot,
 * and the common decode case, whose per-slot loops cost a 1-row int8
 * chunk about a fifth of its computation. */
static int chunk_plain(const mha_cache *c, int b, int cs, int ce) {
    const int last = c->len[b] - 1;
    return c->n_sink == 0 && last < c->cap && ce <= c->cap && ce - 1 <= last && cs >= c->lo[b];
}

/* part (rows, 2 + d_v) = the softmax state of the unit's rows over chunk
 * ch: [max, sum, acc...] per row; rows with no allowed key get -inf, 0. */
static void chunk_partial(float *part, scratch *w, const decode_call *dc, const unit *u, int ch,
                          const next_chunk *nx) {
    const mha_cache *c = dc->c;
    int m = u->i1 - u->i0, pw = 2 + c->d_v;
    int cs = ch * MHA_DECODE_CHUNK, ce = cs + MHA_DECODE_CHUNK < c->slots ? cs + MHA_DECODE_CHUNK : c->slots;
    int jlo = ce, jhi = cs;
    const int plain = chunk_plain(c, u->b, cs, ce);
    if (plain) { /* the same jlo, jhi as the loop below, without it */
        for (int s = cs; s < ce; s++) w->pos[s - cs] = s;
        jlo = u->ulo > cs ? u->ulo : cs, jhi = u->uhi + 1 < ce ? u->uhi + 1 : ce;
    } else {
        mha_cache_slot_positions(w->pos, c, u->b, cs, ce - cs);
        for (int s = cs; s < ce; s++) {
            int p = w->pos[s - cs];
            if (p != INT_MIN && (p >= u->ulo || p < c->n_sink) && p <= u->uhi) {
                if (s < jlo) jlo = s;
                jhi = s + 1;
            }
        }
    }
    if (jlo >= jhi) {
        for (int i = 0; i < m; i++) {
            part[(size_t)i * pw] = -INFINITY;
            part[(size_t)i * pw + 1] = 0.0f;
            memset(part + (size_t)i * pw + 2, 0, sizeof(float) * c->d_v);
        }
        return;
    }
    jlo -= jlo % MHA_KPANEL; /* whole panels; slots is a multiple of 8 */
    jhi += (MHA_KPANEL - jhi % MHA_KPANEL) % MHA_KPANEL;
    int nk = jhi - jlo;
    size_t kv = mha_cache_kv_index(c, u->b, u->g);
    const int pf = unit_prefetches(dc, u);
    if (pf) prefetch_point(dc, nx, pf, 0, m, nk);
    /* score (i, j) at w->s[i * rs + j * ks]: rows of keys when grouped */
    const int grouped = unit_grouped(dc, u);
    const size_t rs = grouped ? 1 : MHA_DECODE_CHUNK, ks = grouped ? QTILE : 1;
    if (grouped) chunk_scores_t(w, dc, kv, jlo, m, nk);
    else chunk_scores(w, dc, kv, jlo, m, nk);
    if (pf) prefetch_point(dc, nx, pf, 1, m, nk);
    variants_chunk(w, dc, u, m, jlo - cs, nk, rs, ks);
    /* causal (bottom-right) and window: row i attends positions
     * [first key, its own position]; a chunk wholly inside needs no mask */
    int pmin = plain ? jlo : INT_MAX, pmax = plain ? jhi - 1 : INT_MIN, holes = 0;
    for (int j = 0; !plain && j < nk; j++) {
        int pj = w->pos[jlo - cs + j];
        holes |= pj == INT_MIN;
        if (pj != INT_MIN && pj < pmin) pmin = pj;
        if (pj > pmax) pmax = pj;
    }
    /* a tree mask (tree attention) among the call's new tokens, from base */
    const int base = c->len[u->b] - dc->n[u->b] - dc->t0, tree = dc->o->tree && pmax >= base;
    for (int i = 0; i < m; i++) {
        /* pe: the row's position in the sequence it sees (p without a tree rank) */
        const int p = row_position(dc, u->b, u->i0 + i), pe = mha_cache_tree_pos(dc->o, u->b, base, p, p);
        const int lo = mha_cache_row_first(c, dc->o, u->b, pe);
        if (!holes && !tree && pmin >= lo && pmax <= p) continue;
        float *row = w->s + (size_t)i * rs;
        for (int j = 0; j < nk; j++) {
            int pj = w->pos[jlo - cs + j];
            if (pj == INT_MIN || pj > p || !mha_cache_tree_keeps(dc->o, u->b, base, p, pj) ||
                !mha_cache_attends(c, mha_cache_tree_pos(dc->o, u->b, base, p, pj), lo, pe))
                row[(size_t)j * ks] = -INFINITY;
        }
    }
    if (grouped) {
        dc->kr->softmax_t(w->s, QTILE, w->mx, w->sum, m, nk);
        chunk_values_t(part + 2, (int)pw, w, dc, kv, jlo, m, nk);
    } else {
        dc->kr->softmax(w->s, MHA_DECODE_CHUNK, w->mx, w->sum, m, nk);
        if (pf) prefetch_point(dc, nx, pf, 2, m, nk);
        chunk_values(part + 2, (int)pw, w, dc, kv, jlo, m, nk);
    }
    if (pf) prefetch_point(dc, nx, pf, 3, m, nk);
    for (int i = 0; i < m; i++) {
        part[(size_t)i * pw] = w->mx[i];
        part[(size_t)i * pw + 1] = w->sum[i];
    }
}

/* run = merge(run, part) for m rows of width 2 + d_v. */
static void merge(const mha_decode_kernels *kr, float *restrict run, const float *restrict part,
                  int m, int d_v) {
    size_t pw = 2 + (size_t)d_v;
    for (int i = 0; i < m; i++) {
        float *R = run + i * pw;
        const float *P = part + i * pw;
        if (P[1] == 0.0f) continue;
        if (R[1] == 0.0f) {
            memcpy(R, P, sizeof(float) * pw);
            continue;
        }
        float M = R[0] > P[0] ? R[0] : P[0];
        /* the state holding the max keeps its scale: expf(0) is 1 exactly,
         * so the bits are those of two expf calls at one call's cost */
        const float da = R[0] - M, db = P[0] - M;
        float a = da == 0.0f ? 1.0f : expf(da), b = db == 0.0f ? 1.0f : expf(db);
        R[0] = M;
        R[1] = R[1] * a + P[1] * b;
        kr->axpby(R + 2, P + 2, a, b, d_v);
    }
}

/* run = merge(run, part) for the unit's rows: the vector merge of the
 * table for grouped units (16 rows per exp), else the scalar one; which
 * one depends on the unit's rows alone. */
static void merge_unit(const decode_call *dc, const unit *u, float *run, const float *part) {
    if (unit_grouped(dc, u) && dc->kr->merge_t) dc->kr->merge_t(run, part, u->i1 - u->i0, dc->c->d_v);
    else merge(dc->kr, run, part, u->i1 - u->i0, dc->c->d_v);
}

/* Chunks per fold group of unit u (see group_partial): a function of the
 * unit alone (its rows and its number of chunks), never of the thread
 * count or of the other units of the call, so a sequence's bits do not
 * depend on its batch. */
static int unit_group(const decode_call *dc, const unit *u) {
    if (unit_grouped(dc, u)) return GROUP_CHUNKS;
    const int g = u->count / GROUP_MIN_TASKS;
    return g < 1 ? 1 : g > GROUP_CHUNKS ? GROUP_CHUNKS : g;
}

/* gp (rows, 2 + d_v) = the unit's chunks chunks[k0 .. k1) folded in
 * order (the first one's partial, then merge by merge). A unit's chunk
 * list is cut into groups of u->group chunks, fixed by the position in
 * the list (never by the thread count); the groups' folds are then
 * merged in order. Grouped units (MQA: one unit, up to 128 chunks at
 * L = 16384) fold GROUP_CHUNKS per task, so the parallel tasks do 3 of
 * every 4 merges and the thread that finishes last only 1 in 4 (128
 * serial merges were ~8% of a 2-thread call). Row units fold up to as
 * many while they keep GROUP_MIN_TASKS tasks (32 chunks, L >= 4096, and
 * up): each split task's partial is written and merged again once per
 * fold instead of once per chunk (cold, 2 threads, GQA h_kv 8 at L 16384:
 * int8 0.91x the time, fp16 0.96x; bench/LIMITS.md round 12); shorter
 * units keep folds of one chunk. */
static void group_partial(float *gp, scratch *w, const decode_call *dc, const unit *u, const int *chunks, int k0,
                          int k1, const next_chunk *after) {
    const size_t kv = mha_cache_kv_index(dc->c, u->b, u->g);
    for (int k = k0; k < k1; k++) {
        const next_chunk nx = {kv, k + 1 < k1 ? chunks[k + 1] * MHA_DECODE_CHUNK : -1};
        chunk_partial(k == k0 ? gp : w->part, w, dc, u, chunks[k], k + 1 < k1 ? &nx : after);
        if (k > k0) merge_unit(dc, u, gp, w->part);
    }
}

static void run_init(float *run, int m, int d_v) {
    size_t pw = 2 + (size_t)d_v;
    for (int i = 0; i < m; i++) {
        run[i * pw] = -INFINITY;
        run[i * pw + 1] = 0.0f;
        memset(run + i * pw + 2, 0, sizeof(float) * d_v);
    }
}

/* Merges the extra keys (add_bias_kv, add_zero_attn) and writes z. */
static void finish_unit(const decode_call *dc, const unit *u, float *run, float *qt) {
    const mha_cache *c = dc->c;
    const mha_decode_opts *o = dc->o;
    int m = u->i1 - u->i0;
    size_t pw = 2 + (size_t)c->d_v;
    for (int i = 0; i < m; i++) {
        float *R = run + i * pw;
        if (o->extra_k) {
            const float *ek = o->extra_k + (size_t)u->g * c->d_k, *ev = o->extra_v + (size_t)u->g * c->d_v;
            float sc = 0.0f;
            for (int d = 0; d < c->d_k; d++) sc = fmaf(qt[(size_t)i * c->d_k + d], ek[d], sc); /* scaled q */
            float M = R[1] == 0.0f || sc > R[0] ? sc : R[0];
            float a = R[1] == 0.0f ? 0.0f : expf(R[0] - M), bb = expf(sc - M);
            R[0] = M;
            R[1] = R[1] * a + bb;
            for (int j = 0; j < c->d_v; j++) R[2 + j] = R[2 + j] * a + ev[j] * bb;
        }
        if (o->zero_attn) {
            float M = R[1] == 0.0f || 0.0f > R[0] ? 0.0f : R[0];
            float a = R[1] == 0.0f ? 0.0f : expf(R[0] - M), bb = expf(-M);
            R[0] = M;
            R[1] = R[1] * a + bb;
            for (int j = 0; j < c->d_v; j++) R[2 + j] = R[2 + j] * a;
        }
        int t = dc->t0 + (u->i0 + i) / dc->n_rep, r = u->g * dc->n_rep + (u->i0 + i) % dc->n_rep;
        if (o->sinks && R[1] != 0.0f) R[1] += expf(o->sinks[r] - R[0]); /* joins the sum, no value */
        size_t row = ((size_t)dc->row0[u->b] + t) * c->h + r;
        float *zr = dc->z + row * c->d_v;
        float inv = R[1] > 0.0f ? 1.0f / R[1] : 0.0f;
        for (int j = 0; j < c->d_v; j++)
            zr[j] = R[1] > 0.0f ? R[2 + j] * inv : (o->nan_rows ? NAN : 0.0f);
        if (dc->stats) {
            dc->stats[row * 2] = R[0];
            dc->stats[row * 2 + 1] = R[1];
        }
    }
}

/* --------------------------------------------------------- the driver */

/* The work of one call: units, their chunks, the tasks (unit, fold group
 * of its chunks) and, when the tasks run split, where each task's partial
 * goes. */
typedef struct {
    unit *units;
    size_t n_units, n_chunks, n_tasks;
    int *chunk_of;           /* (n_chunks) chunks of unit u at u->first ..  */
    int *unit_of, *k0_of;    /* (n_tasks) unit of task t, its first chunk's
                              * index in the unit's list                    */
    float *parts;            /* partials of split tasks, NULL: units whole */
    size_t *part_at;         /* (n_tasks + 1) offset of task t's partial   */
    int *done;               /* (n_units) tasks finished, for the merge    */
    scratch *ws;             /* (nth) per-thread scratch                   */
    float *block;            /* the scratch and the partials, from pool    */
    mha_workspace *pool;     /* the cache's: kept for its next call        */
    size_t parts_floats;     /* floats of the partials (0: units whole)    */
    int nth;
    int run;                 /* split tasks per scheduling run (below)     */
    mha_task_ranges *ranges; /* stream: split tasks in one run per thread  */
} decode_plan;

static void plan_free(decode_plan *pl) {
    if (pl->block) mha_workspace_give(pl->pool, pl->block);
    free(pl->ws), free(pl->part_at), free(pl->done);
    free(pl->units), free(pl->chunk_of), free(pl->unit_of), free(pl->k0_of);
    mha_task_ranges_free(pl->ranges);
}

// --- plan: units and their chunks, in a fixed order
static int plan_units(decode_plan *pl, const decode_call *dc) {
    const mha_cache *c = dc->c;
    const int nch = (c->slots + MHA_DECODE_CHUNK - 1) / MHA_DECODE_CHUNK;
    for (int b = 0; b < c->B; b++) pl->n_units += (size_t)c->h_kv * ((dc->n[b] * dc->n_rep + QTILE - 1) / QTILE);
    if (pl->n_units == 0) return 1;
    pl->units = malloc(sizeof(unit) * pl->n_units);
    pl->chunk_of = malloc(sizeof(int) * pl->n_units * nch);
    pl->unit_of = malloc(sizeof(int) * pl->n_units * nch);
    pl->k0_of = malloc(sizeof(int) * pl->n_units * nch);
    if (!pl->units || !pl->chunk_of || !pl->unit_of || !pl->k0_of) return 0;
    size_t nu = 0;
    for (int b = 0; b < c->B; b++)
        for (int g = 0, rows = dc->n[b] * dc->n_rep; g < c->h_kv; g++)
            for (int i0 = 0; i0 < rows; i0 += QTILE) {
                unit *u = &pl->units[nu++];
                u->b = b, u->g = g, u->i0 = i0, u->i1 = i0 + QTILE < rows ? i0 + QTILE : rows;
                /* a tree's rows stand at least at the call's first position in the sequences they see */
                const int p0 = dc->o->tree_rank ? c->len[b] - dc->n[b] - dc->t0 : row_position(dc, b, u->i0);
                u->ulo = mha_cache_first_key(c, b, p0, dc->o->left, dc->o->chunk);
                u->uhi = row_position(dc, b, u->i1 - 1);
                u->first = (int)pl->n_chunks, u->count = 0;
                for (int ch = 0; ch < nch; ch++)
                    if (chunk_needed(c, u->ulo, u->uhi, ch)) pl->chunk_of[pl->n_chunks++] = ch, u->count++;
                u->group = unit_group(dc, u);
                u->tfirst = (int)pl->n_tasks, u->tcount = 0;
                for (int k = 0; k < u->count; k += u->group, u->tcount++)
                    pl->unit_of[pl->n_tasks] = (int)(nu - 1), pl->k0_of[pl->n_tasks++] = k;
            }
    return 1;
}

/* Few units (decode): room for every task's partial, so that the chunks
 * of one unit run in parallel. Many units, or too much room: NULL. */
static void plan_split(decode_plan *pl, const mha_cache *c) {
    size_t pw = 2 + (size_t)c->d_v, total = 0;
    if (pl->n_units >= SPLIT_BELOW_UNITS || !(pl->part_at = malloc(sizeof(size_t) * (pl->n_tasks + 1))) ||
        !(pl->done = calloc(pl->n_units, sizeof(int))))
        return;
    for (size_t t = 0; t < pl->n_tasks; t++) {
        pl->part_at[t] = total;
        total += (size_t)(pl->units[pl->unit_of[t]].i1 - pl->units[pl->unit_of[t]].i0) * pw;
    }
    if (total <= SPLIT_MAX_FLOATS) pl->parts_floats = total > 0 ? total : 1;
}

/* Small work (tests, tiny layers) on one thread: a barrier costs more than
 * it saves, a lot more when the cores are shared. The bits do not depend
 * on the thread count either way. */
static int plan_threads(decode_plan *pl, const mha_exec *ex, const mha_cache *c) {
    double work = 0.0;
    for (size_t i = 0; i < pl->n_units; i++)
        work += (double)(pl->units[i].i1 - pl->units[i].i0) * pl->units[i].count * MHA_DECODE_CHUNK * (c->d_k + c->d_v);
    pl->nth = mha_exec_threads_for(ex, work);
    if (!(pl->ws = calloc((size_t)pl->nth, sizeof(scratch)))) return 0;
    /* one block: each thread's scratch, then the partials (or, short of
     * memory for them, the units run whole). Taken from the cache's
     * workspace and given back: allocated and freed per call, glibc gave
     * the heap's top back to the kernel and each step faulted it in anew
     * (cold attention at h_kv 8, L 1024: 0.18-0.24 ms, kept: 0.08-0.14;
     * bench/LIMITS.md round 11) */
    const size_t per = scratch_layout(NULL, c, NULL), own = per * (size_t)pl->nth;
    pl->pool = c->ws;
    if (pl->parts_floats && !(pl->block = mha_workspace_take(pl->pool, own + pl->parts_floats))) pl->parts_floats = 0;
    if (!pl->block && !(pl->block = mha_workspace_take(pl->pool, own))) return 0;
    for (int i = 0; i < pl->nth; i++) scratch_layout(&pl->ws[i], c, pl->block + per * (size_t)i);
    if (pl->parts_floats) pl->parts = pl->block + own;
    return 1;
}

/* The chunks of task t: [k0, k1) of its unit's list. */
static void task_chunks(const decode_plan *pl, const unit *u, long t, int *k0, int *k1) {
    *k0 = pl->k0_of[t];
    *k1 = *k0 + u->group < u->count ? *k0 + u->group : u->count;
}

/* The first chunk of task t. */
static next_chunk task_start(const decode_plan *pl, const decode_call *dc, long t) {
    const unit *u = &pl->units[pl->unit_of[t]];
    const next_chunk nx = {mha_cache_kv_index(dc->c, u->b, u->g),
                           pl->chunk_of[u->first + pl->k0_of[t]] * MHA_DECODE_CHUNK};
    return nx;
}

// --- run, split: (unit, fold group) tasks in any order; the thread that
// finishes a unit's last task merges its groups' partials, in order
static void run_split_task(const decode_plan *pl, const decode_call *dc, scratch *w, long t, long *last) {
    const unit *u = &pl->units[pl->unit_of[t]];
    int k0, k1;
    if (pl->unit_of[t] != *last) gather_queries(w->qt, w->qtt, dc, u), *last = pl->unit_of[t];
    task_chunks(pl, u, t, &k0, &k1);
    /* the next task is this thread's when it continues the run (the
     * schedule hands out runs of pl->run tasks from task 0; with
     * pl->ranges, one run per thread: at its end, or when this task was
     * stolen from another run's back, the request is one chunk of
     * bandwidth spent for nothing) or when the thread is alone: its first
     * chunk follows in memory (or starts the next kv head's stream) */
    const int mine = t + 1 < (long)pl->n_tasks && (pl->nth == 1 || pl->ranges || (t + 1) % pl->run != 0);
    const next_chunk after = mine ? task_start(pl, dc, t + 1) : no_next;
    group_partial(pl->parts + pl->part_at[t], w, dc, u, pl->chunk_of + u->first, k0, k1, &after);
    int finished;
#pragma omp atomic capture seq_cst
    finished = ++pl->done[pl->unit_of[t]];
    if (finished != u->tcount) return;
    const int m = u->i1 - u->i0;
    run_init(w->run, m, dc->c->d_v);
    for (int k = 0; k < u->tcount; k++) merge_unit(dc, u, w->run, pl->parts + pl->part_at[u->tfirst + k]);
    finish_unit(dc, u, w->run, w->qt);
}

// --- run, whole: each unit runs its groups in order (the same merges)
static void run_unit(const decode_plan *pl, const decode_call *dc, scratch *w, long ui) {
    const unit *u = &pl->units[ui];
    const int m = u->i1 - u->i0;
    gather_queries(w->qt, w->qtt, dc, u);
    run_init(w->run, m, dc->c->d_v);
    for (int t = u->tfirst; t < u->tfirst + u->tcount; t++) {
        int k0, k1;
        task_chunks(pl, u, t, &k0, &k1);
        /* the unit's next task, or (one thread) the next unit's first */
        const long nt = t + 1 < u->tfirst + u->tcount ? t + 1 : pl->nth == 1 && ui + 1 < (long)pl->n_units ? t + 1 : -1;
        const next_chunk after = nt >= 0 ? task_start(pl, dc, nt) : no_next;
        group_partial(w->grp, w, dc, u, pl->chunk_of + u->first, k0, k1, &after);
        merge_unit(dc, u, w->run, w->grp);
    }
    finish_unit(dc, u, w->run, w->qt);
}

mha_status mha_decode_attend(const mha_exec *ex, float *z, float *stats, const mha_cache *c, const float *q,
                             const int *row0, int t0, const int *n, const mha_decode_opts *o) {
    const decode_call dc = {c, mha_exec_decode(ex), o, q, z, stats, n, row0, t0, c->h / c->h_kv,
                            mha_decode_prefetch_policy()};
    decode_plan pl = {0};
    if (!plan_units(&pl, &dc)) {
        plan_free(&pl);
        return mha_fail(MHA_E_NOMEM, "mha_forward_cached: no memory for the decode plan (%zu units)", pl.n_units);
    }
    if (pl.n_units == 0) return MHA_OK;
    plan_split(&pl, c);
    if (!plan_threads(&pl, ex, c)) {
        plan_free(&pl);
        return mha_fail(MHA_E_NOMEM, "mha_forward_cached: no memory for decode scratch");
    }
    /* Runs of split tasks of up to 8 chunks keep each thread streaming
     * through consecutive chunks of one kv head. One barrier in all (the
     * region's end): with two cores shared with other processes every
     * barrier can wait a scheduler time slice. */
    int run = (int)(pl.n_chunks / (4 * (size_t)pl.nth)), group = 1;
    for (size_t i = 0; i < pl.n_units; i++) group = pl.units[i].group > group ? pl.units[i].group : group;
    run = run < 1 ? 1 : run > 8 ? 8 : run;
    run = run / group < 1 ? 1 : run / group;
    pl.run = run;
    /* Streams: each thread reads one contiguous run of the split tasks (runs
     * of 8 chunks handed out in turn left every 8th chunk of a thread
     * unrequested, cold, at 2 threads; bench/LIMITS.md, round 8). Out of
     * memory: the dynamic schedule. */
    if (pl.parts && pl.nth > 1 && dc.policy != MHA_DECODE_PF_BURSTS)
        pl.ranges = mha_task_ranges_new((long)pl.n_tasks, pl.nth);
#pragma omp parallel num_threads(pl.nth)
    {
        scratch *w = &pl.ws[omp_get_thread_num()];
        long last = -1;
        if (pl.ranges) {
            for (long t; (t = mha_task_ranges_next(pl.ranges, omp_get_thread_num())) >= 0;)
                run_split_task(&pl, &dc, w, t, &last);
        } else if (pl.parts) {
#pragma omp for schedule(dynamic, run) nowait
            for (long t = 0; t < (long)pl.n_tasks; t++) run_split_task(&pl, &dc, w, t, &last);
        } else {
#pragma omp for schedule(dynamic, 1) nowait
            for (long ui = 0; ui < (long)pl.n_units; ui++) run_unit(&pl, &dc, w, ui);
        }
    }
    plan_free(&pl);
    return MHA_OK;
}
