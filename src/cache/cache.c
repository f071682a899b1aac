/* cache.c — the KV cache object: create, size, reset, truncate, permute,
 * store, and the low-level append/attend entries. The cached forward
 * (projections, interventions, captures) is in forward_cached.c, the
 * attention over the cache in decode.c.
 * Legend: B sequences, T rows per sequence, h heads, h_kv kv heads,
 * d_k, d_v, d_model; slots = capacity rounded up to MHA_DECODE_CHUNK
 * (128 keys, whole chunks). */
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cache/cache_internal.h"

static size_t cache_elt(mha_cache_dtype dt) { return dt == MHA_CACHE_I8 ? 1 : dt == MHA_CACHE_F16 ? 2 : 4; }

static int q8_blocks(int d) { return (d + MHA_Q8_BLOCK - 1) / MHA_Q8_BLOCK; }

static int dtype_ok(mha_cache_dtype dt) {
    return dt == MHA_CACHE_F32 || dt == MHA_CACHE_F16 || dt == MHA_CACHE_I8;
}

/* Bytes of one slot of one kv head: its key in type kt and value in vt,
 * plus the fp32 block scales of each int8 one. */
static size_t slot_bytes(mha_cache_dtype kt, mha_cache_dtype vt, int d_k, int d_v) {
    size_t b = (size_t)d_k * cache_elt(kt) + (size_t)d_v * cache_elt(vt);
    if (kt == MHA_CACHE_I8) b += sizeof(float) * (size_t)q8_blocks(d_k);
    if (vt == MHA_CACHE_I8) b += sizeof(float) * (size_t)q8_blocks(d_v);
    return b;
}

/* whole chunks: a kv head's chunks then form one contiguous stream */
static size_t round_slots(int capacity) { return mha_round_up((size_t)capacity, MHA_DECODE_CHUNK); }

/* Bytes of sequence b's storage in data (its h_kv kv heads are blocks
 * b*h_kv .. b*h_kv + h_kv - 1 whatever the head permutation) and floats
 * of its int8 scales: each sequence is one contiguous span of each. */
static size_t row_data_bytes(const mha_cache *c) {
    return (size_t)c->h_kv * c->slots * ((size_t)c->d_k * c->ek + (size_t)c->d_v * c->ev);
}
static size_t row_scale_floats(const mha_cache *c) {
    return (size_t)c->h_kv * c->slots * (size_t)(c->nbk + c->nbv);
}

/* c's arrays for its shape (B, cap, slots, h_kv, types): K/V storage and
 * scales zeroed (slots never written hold finite numbers, so a weight of
 * exactly 0 on them, a masked key, contributes exactly 0; unwritten int8
 * slots dequantize to 0), lengths, positions and key bounds zeroed, a
 * workspace of its own. 0 when out of memory (mha_cache_free cleans up). */
static int cache_arrays(mha_cache *c) {
    const size_t rows = (size_t)c->B, hk = (size_t)c->h_kv;
    c->data = mha_calloc_large(rows, row_data_bytes(c));
    c->scales = c->nbk + c->nbv ? mha_calloc_large(rows, row_scale_floats(c) * sizeof(float)) : NULL;
    c->len = calloc(rows, sizeof(int)), c->lo = calloc(rows, sizeof(int));
    c->upos = calloc(rows * (size_t)c->cap, sizeof(int)), c->kmax = calloc(rows * hk, sizeof(float));
    c->phys = malloc(sizeof(int) * hk), c->labels_k = malloc(sizeof(int) * hk), c->labels_v = malloc(sizeof(int) * hk);
    c->ws = mha_workspace_create(); /* scratch is per cache, never shared */
    c->calls = malloc(sizeof *c->calls);  /* so is the count of its calls: a clone starts idle */
    if (c->calls) atomic_init(c->calls, 0);
    return c->data && (!(c->nbk + c->nbv) || c->scales) && c->len && c->lo && c->upos && c->kmax && c->phys &&
           c->labels_k && c->labels_v && c->ws && c->calls;
}

mha_status mha_cache_begin(const mha_cache *c, int change, const char *fn) {
    int n = atomic_load(c->calls);
    do
        if (n < 0 || (change && n > 0))
            return mha_fail(MHA_E_ARG, "%s: another call is %s this cache right now; expected one call at a time on "
                            "a cache that a call changes (mha_forward_cached*, mha_cache_append, _reset, _truncate, "
                            "...), readers only with readers; nothing was done", fn,
                            n < 0 ? "changing" : "reading");
    while (!atomic_compare_exchange_weak(c->calls, &n, change ? -1 : n + 1));
    return MHA_OK;
}

mha_status mha_cache_end(const mha_cache *c, int change, mha_status s) {
    if (change) atomic_store(c->calls, 0);
    else atomic_fetch_sub(c->calls, 1);
    return s;
}

size_t mha_cache_bytes_for_kv(const mha_config *cfg, int batch, int capacity, mha_cache_dtype k_dtype,
                              mha_cache_dtype v_dtype) {
    mha_config c;
    if (!cfg || batch < 1 || capacity < 1 || !dtype_ok(k_dtype) || !dtype_ok(v_dtype)) return 0;
    if (mha_config_resolve(&c, cfg) != MHA_OK) return 0;
    const size_t slots = round_slots(capacity), row = slot_bytes(k_dtype, v_dtype, c.d_k, c.d_v);
    if (slots > INT_MAX || !mha_elements_fit((size_t)batch, (size_t)c.n_kv_heads, slots, row))
        return 0; /* more than mha_cache_create allows: no such cache */
    return (size_t)batch * c.n_kv_heads * slots * row;
}

size_t mha_cache_bytes_for(const mha_config *cfg, int batch, int capacity, mha_cache_dtype dtype) {
    return mha_cache_bytes_for_kv(cfg, batch, capacity, dtype, dtype);
}

size_t mha_cache_bytes(const mha_cache *c) {
    if (!c) return 0;
    return (size_t)c->B * c->h_kv * (size_t)c->slots * slot_bytes(c->kt, c->vt, c->d_k, c->d_v);
}

void mha_cache_free(mha_cache *c) {
    if (!c) return;
    mha_calloc_large_free(c->data), mha_calloc_large_free(c->scales), mha_workspace_free(c->ws);
    free(c->len), free(c->lo), free(c->upos), free(c->phys), free(c->labels_k), free(c->labels_v), free(c->kmax);
    free(c->calls);
    free(c);
}

/* cache_create with the layer held as a reader. */
static mha_status cache_create_held(mha_cache **out, const mha_layer *L, int batch, int capacity, mha_cache_dtype kt,
                                    mha_cache_dtype vt, int window, int cross, const char *fn) {
    const mha_config *cf = &L->cfg;
    if (batch < 1) return mha_fail(MHA_E_ARG, "%s: batch=%d; expected >= 1", fn, batch);
    if (capacity < 1)
        return mha_fail(MHA_E_ARG, "%s: capacity=%d; expected >= 1 token", fn, capacity);
    for (int i = 0; i < 2; i++)
        if (!dtype_ok(i ? vt : kt))
            return mha_fail(MHA_E_ARG, "%s: %s=%d; expected MHA_CACHE_F32, MHA_CACHE_F16 or MHA_CACHE_I8", fn,
                            kt == vt ? "dtype" : i ? "v_dtype" : "k_dtype", (int)(i ? vt : kt));
    if (window < 0 || window > capacity)
        return mha_fail(MHA_E_ARG, "%s: window=%d; expected 0 (none) or 1..capacity=%d", fn,
                        window, capacity);
    if (cross && (cf->rope.pairing != MHA_ROPE_NONE || cf->alibi || cf->temperature_floor))
        return mha_fail(MHA_E_UNSUPPORTED, "%s: the layer has %s, which needs the keys' positions relative to the "
                        "queries; expected a cross-attention layer without RoPE, ALiBi or a query temperature "
                        "(encoder-decoder layers add positions before attention)", fn,
                        cf->rope.pairing != MHA_ROPE_NONE ? "RoPE" : cf->alibi ? "ALiBi" : "a query temperature");
    if (!cross && cf->d_kv_in != cf->d_model)
        return mha_fail(MHA_E_SHAPE,
                        "%s: d_kv_in=%d != d_model=%d; a KV cache serves causal "
                        "self-attention (keys from the same tokens)", fn, cf->d_kv_in, cf->d_model);
    if (!cross && cf->d_v_in != cf->d_model)
        return mha_fail(MHA_E_SHAPE,
                        "%s: d_v_in=%d != d_model=%d; a KV cache serves causal "
                        "self-attention (values from the same tokens)", fn, cf->d_v_in, cf->d_model);
    const size_t slots = round_slots(capacity), blocks = (size_t)batch * cf->n_kv_heads,
                 slot = slot_bytes(kt, vt, cf->d_k, cf->d_v);
    if (slots > INT_MAX || !mha_elements_fit(blocks, slots, slot, 1))
        return mha_fail(MHA_E_NOMEM, "%s: batch=%d capacity=%d is too large", fn, batch, capacity);

    mha_cache *c = calloc(1, sizeof *c);
    if (!c) return mha_fail(MHA_E_NOMEM, "%s: no memory", fn);
    c->B = batch, c->cap = capacity, c->slots = (int)slots, c->window = window;
    c->h = cf->n_heads, c->h_kv = cf->n_kv_heads, c->d_k = cf->d_k, c->d_v = cf->d_v;
    c->d_model = cf->d_model, c->kt = kt, c->vt = vt, c->ek = cache_elt(kt), c->ev = cache_elt(vt);
    c->cross = cross, c->d_kv_in = cf->d_kv_in, c->d_v_in = cf->d_v_in;
    c->nbk = kt == MHA_CACHE_I8 ? q8_blocks(cf->d_k) : 0;
    c->nbv = vt == MHA_CACHE_I8 ? q8_blocks(cf->d_v) : 0;
    if (!cache_arrays(c)) {
        mha_cache_free(c);
        return mha_fail(MHA_E_NOMEM, "%s: no memory for %zu bytes of K/V", fn, blocks * slots * slot);
    }
    for (int g = 0; g < c->h_kv; g++) c->phys[g] = g;
    memcpy(c->labels_k, L->labels[MHA_BLOCK_K], sizeof(int) * c->h_kv);
    memcpy(c->labels_v, L->labels[MHA_BLOCK_V], sizeof(int) * c->h_kv);
    *out = c;
    return MHA_OK;
}

/* mha_cache_create and mha_cache_create_kv; fn names the entry in errors.
 * A reader of the layer (mha_layer_begin): the cache takes the layer's
 * kv head labels, which a permutation running meanwhile rewrites. */
static mha_status cache_create(mha_cache **out, const mha_layer *L, int batch, int capacity, mha_cache_dtype kt,
                               mha_cache_dtype vt, int window, int cross, const char *fn) {
    if (!out) return mha_fail(MHA_E_ARG, "%s: out is NULL", fn);
    *out = NULL;
    if (!L) return mha_fail(MHA_E_ARG, "%s: layer is NULL", fn);
    mha_status s = mha_layer_begin(L, 0, fn);
    return s ? s : mha_layer_end(L, 0, cache_create_held(out, L, batch, capacity, kt, vt, window, cross, fn));
}

mha_status mha_cache_create(mha_cache **out, const mha_layer *L, int batch, int capacity, mha_cache_dtype dtype,
                            int window) {
    return cache_create(out, L, batch, capacity, dtype, dtype, window, 0, "mha_cache_create");
}

mha_status mha_cache_create_kv(mha_cache **out, const mha_layer *L, int batch, int capacity,
                               mha_cache_dtype k_dtype, mha_cache_dtype v_dtype, int window) {
    return cache_create(out, L, batch, capacity, k_dtype, v_dtype, window, 0, "mha_cache_create_kv");
}

mha_status mha_cache_create_cross(mha_cache **out, const mha_layer *L, int batch, int capacity,
                                  mha_cache_dtype k_dtype, mha_cache_dtype v_dtype) {
    return cache_create(out, L, batch, capacity, k_dtype, v_dtype, 0, 1, "mha_cache_create_cross");
}

static mha_status cache_set_sink_tokens_held(mha_cache *c, int n_sink) {
    if (!c->window)
        return mha_fail(MHA_E_ARG, "mha_cache_set_sink_tokens: the cache has no window; expected a cache "
                        "created with window >= 1 (without one nothing is evicted)");
    if (n_sink < 0 || n_sink > c->cap - c->window)
        return mha_fail(MHA_E_ARG, "mha_cache_set_sink_tokens: n_sink=%d; expected 0..capacity - window = %d "
                        "(the ring past the sinks must hold the window of %d)", n_sink, c->cap - c->window,
                        c->window);
    for (int b = 0; b < c->B; b++)
        if (c->len[b])
            return mha_fail(MHA_E_ARG, "mha_cache_set_sink_tokens: sequence %d holds %d tokens; expected an "
                            "empty cache (set the sinks before the first token, or reset)", b, c->len[b]);
    c->n_sink = n_sink;
    return MHA_OK;
}

mha_status mha_cache_set_sink_tokens(mha_cache *c, int n_sink) {
    if (!c) return mha_fail(MHA_E_ARG, "mha_cache_set_sink_tokens: cache is NULL");
    mha_status s = mha_cache_begin(c, 1, "mha_cache_set_sink_tokens");
    return s ? s : mha_cache_end(c, 1, cache_set_sink_tokens_held(c, n_sink));
}

int mha_cache_length(const mha_cache *c, int b) {
    if (!c) {
        mha_fail(MHA_E_ARG, "mha_cache_length: cache is NULL");
        return -1;
    }
    if (b < 0 || b >= c->B) {
        mha_fail(MHA_E_ARG, "mha_cache_length: sequence %d; expected 0..%d", b, c->B - 1);
        return -1;
    }
    return c->len[b];
}

void mha_cache_clear(mha_cache *c, int b) {
    for (int i = 0; i < c->B; i++)
        if (b == -1 || i == b) {
            c->len[i] = c->lo[i] = 0;
            for (int g = 0; g < c->h_kv; g++) c->kmax[(size_t)i * c->h_kv + g] = 0.0f;
        }
}

static mha_status cache_reset_held(mha_cache *c, int b) {
    if (b < -1 || b >= c->B)
        return mha_fail(MHA_E_ARG, "mha_cache_reset: sequence %d; expected 0..%d or -1 (all)", b, c->B - 1);
    mha_cache_clear(c, b);
    return MHA_OK;
}

mha_status mha_cache_reset(mha_cache *c, int b) {
    if (!c) return mha_fail(MHA_E_ARG, "mha_cache_reset: cache is NULL");
    mha_status s = mha_cache_begin(c, 1, "mha_cache_reset");
    return s ? s : mha_cache_end(c, 1, cache_reset_held(c, b));
}

/* MHA_OK when sequence b may be rolled back to new_len tokens (fn names
 * the caller): the window of the next token (position new_len) needs the
 * keys from new_len - (W-1) up to new_len - 1 that are no sink, which
 * the ring must still hold; none when the window is 1 or reaches back
 * only into the sinks (which are always kept). */
static mha_status check_rollback(const mha_cache *c, int b, int new_len, const char *fn) {
    if (b < 0 || b >= c->B) return mha_fail(MHA_E_ARG, "%s: sequence %d; expected 0..%d", fn, b, c->B - 1);
    if (new_len < 0 || new_len > c->len[b])
        return mha_fail(MHA_E_ARG, "%s: new_len=%d for sequence %d; expected 0..%d (its length)", fn, new_len, b,
                        c->len[b]);
    const int need = mha_cache_next_needs(c, new_len);
    if (new_len > 0 && need < new_len && need < c->lo[b])
        return mha_fail(MHA_E_ARG,
                        "%s: sequence %d to %d tokens needs position %d for its "
                        "window of %d, but the ring (capacity %d, %d sink tokens) kept only positions >= %d; "
                        "expected new_len >= %d or <= %d",
                        fn, b, new_len, need, c->window, c->cap, c->n_sink, c->lo[b], c->lo[b] + c->window - 1,
                        c->n_sink);
    return MHA_OK;
}

/* Sequence b's length becomes new_len (checked); 0 empties it. Going
 * back past the oldest position the ring holds (allowed when the next
 * token needs none of them) leaves none of the ring's positions live:
 * the oldest is then new_len, the next one stored. */
static void roll_back(mha_cache *c, int b, int new_len) {
    c->len[b] = new_len;
    if (c->lo[b] > new_len) c->lo[b] = new_len;
    if (new_len > 0) return;
    c->lo[b] = 0;
    for (int g = 0; g < c->h_kv; g++) c->kmax[(size_t)b * c->h_kv + g] = 0.0f;
}

static mha_status cache_truncate_held(mha_cache *c, int b, int new_len) {
    mha_status s = check_rollback(c, b, new_len, "mha_cache_truncate");
    if (!s) roll_back(c, b, new_len);
    return s;
}

mha_status mha_cache_truncate(mha_cache *c, int b, int new_len) {
    if (!c) return mha_fail(MHA_E_ARG, "mha_cache_truncate: cache is NULL");
    mha_status s = mha_cache_begin(c, 1, "mha_cache_truncate");
    return s ? s : mha_cache_end(c, 1, cache_truncate_held(c, b, new_len));
}

/* Slot `to` of sequence b's every kv head = slot `from`: the key (its
 * panel lanes, stride 8), the value row, their int8 scales and the stored
 * position. */
static void slot_copy(mha_cache *c, int b, int to, int from) {
    char *data = c->data;
    for (int g = 0; g < c->h_kv; g++) {
        const size_t kv = (size_t)b * c->h_kv + (size_t)g; /* every storage block of b */
        const size_t kt = mha_cache_k_off(c, kv, to), kf = mha_cache_k_off(c, kv, from);
        for (int d = 0; d < c->d_k; d++)
            memcpy(data + (kt + (size_t)d * MHA_KPANEL) * c->ek, data + (kf + (size_t)d * MHA_KPANEL) * c->ek, c->ek);
        memcpy(data + mha_cache_v_off(c, kv, to) * c->ev, data + mha_cache_v_off(c, kv, from) * c->ev,
               (size_t)c->d_v * c->ev);
        for (int k = 0; k < c->nbk; k++)
            c->scales[mha_cache_ks_off(c, kv, to) + (size_t)k * MHA_KPANEL] =
                c->scales[mha_cache_ks_off(c, kv, from) + (size_t)k * MHA_KPANEL];
        if (c->nbv)
            memcpy(c->scales + mha_cache_vs_off(c, kv, to), c->scales + mha_cache_vs_off(c, kv, from),
                   sizeof(float) * (size_t)c->nbv);
    }
    c->upos[(size_t)b * c->cap + to] = c->upos[(size_t)b * c->cap + from];
}

static mha_status cache_compact_held(mha_cache *c, int b, int first, const int *keep, int n_keep) {
    if (c->cross)
        return mha_fail(MHA_E_ARG, "mha_cache_compact: a cross-attention memory has no appended tokens to keep; "
                        "expected a self-attention cache");
    if (b < 0 || b >= c->B) return mha_fail(MHA_E_ARG, "mha_cache_compact: sequence %d; expected 0..%d", b, c->B - 1);
    if (first < 0 || first > c->len[b])
        return mha_fail(MHA_E_ARG, "mha_cache_compact: first=%d for sequence %d; expected 0..%d (its length)", first, b,
                        c->len[b]);
    if (n_keep < 0 || n_keep > c->len[b] - first || (n_keep > 0 && !keep))
        return mha_fail(MHA_E_ARG, "mha_cache_compact: n_keep=%d%s for sequence %d; expected 0..%d (its length %d "
                        "minus first %d) indices", n_keep, n_keep > 0 && !keep ? " with keep NULL" : "", b,
                        c->len[b] - first, c->len[b], first);
    for (int i = 0; i < n_keep; i++)
        if (keep[i] < (i ? keep[i - 1] + 1 : 0) || keep[i] >= c->len[b] - first)
            return mha_fail(MHA_E_ARG, "mha_cache_compact: keep[%d]=%d; expected strictly increasing indices in "
                            "%d..%d (positions first .. length-1 less first)", i, keep[i], i ? keep[i - 1] + 1 : 0,
                            c->len[b] - first - 1);
    /* every position from `first` on must still be stored to be moved */
    if (n_keep > 0 && first < c->lo[b] && c->lo[b] > c->n_sink)
        return mha_fail(MHA_E_ARG, "mha_cache_compact: sequence %d keeps only positions >= %d (its window "
                        "evicted the older ones); expected first >= %d", b, c->lo[b], c->lo[b]);
    mha_status s = check_rollback(c, b, first + n_keep, "mha_cache_compact");
    if (s) return s;
    /* in order: a target position is never after its source, and the
     * positions from `first` on fit the ring, so no source is overwritten
     * before it is read */
    for (int i = 0; i < n_keep; i++)
        if (keep[i] != i) slot_copy(c, b, mha_cache_slot_of(c, first + i), mha_cache_slot_of(c, first + keep[i]));
    roll_back(c, b, first + n_keep);
    return MHA_OK;
}

mha_status mha_cache_compact(mha_cache *c, int b, int first, const int *keep, int n_keep) {
    if (!c) return mha_fail(MHA_E_ARG, "mha_cache_compact: cache is NULL");
    mha_status s = mha_cache_begin(c, 1, "mha_cache_compact");
    return s ? s : mha_cache_end(c, 1, cache_compact_held(c, b, first, keep, n_keep));
}

static mha_status cache_permute_heads_held(mha_cache *c, const int *perm) {
    int *kvp = malloc(sizeof(int) * 2 * c->h_kv), *tmp = kvp + c->h_kv;
    if (!kvp) return mha_fail(MHA_E_NOMEM, "mha_cache_permute_heads: no memory");
    mha_status s = mha_kv_perm_from_heads(kvp, perm, c->h, c->h_kv);
    for (int pass = 0; !s && pass < 3; pass++) { /* storage index and both label rows */
        int *a = pass == 0 ? c->phys : pass == 1 ? c->labels_k : c->labels_v;
        for (int g = 0; g < c->h_kv; g++) tmp[g] = a[kvp[g]];
        memcpy(a, tmp, sizeof(int) * c->h_kv);
    }
    free(kvp);
    return s;
}

mha_status mha_cache_permute_heads(mha_cache *c, const int *perm) {
    if (!c || !perm) return mha_fail(MHA_E_ARG, "mha_cache_permute_heads: NULL %s", c ? "perm" : "cache");
    mha_status s = mha_cache_begin(c, 1, "mha_cache_permute_heads");
    return s ? s : mha_cache_end(c, 1, cache_permute_heads_held(c, perm));
}

/* ---------------------------------------------------------- reorder */

/* Copies sequence `from`'s whole state (K/V, scales, slot positions, key
 * norms; not len / lo) from the arrays given to sequence `to` of c. */
static void row_copy(mha_cache *c, int to, const char *data, const float *scales, const int *upos,
                     const float *kmax, size_t from) {
    const size_t rd = row_data_bytes(c), rs = row_scale_floats(c);
    memcpy((char *)c->data + (size_t)to * rd, data + from * rd, rd);
    if (c->scales) memcpy(c->scales + (size_t)to * rs, scales + from * rs, rs * sizeof(float));
    memcpy(c->upos + (size_t)to * c->cap, upos + from * c->cap, sizeof(int) * (size_t)c->cap);
    memcpy(c->kmax + (size_t)to * c->h_kv, kmax + from * c->h_kv, sizeof(float) * (size_t)c->h_kv);
}

/* Beam search: new sequence b = old sequence src[b]. Only the sequences
 * that are overwritten while another still reads them are saved first,
 * and everything is allocated before anything moves (out of memory
 * leaves the cache as it was). */
static mha_status cache_reorder_held(mha_cache *c, const int *src) {
    for (int b = 0; b < c->B; b++)
        if (src[b] < 0 || src[b] >= c->B)
            return mha_fail(MHA_E_ARG, "mha_cache_reorder: src[%d]=%d; expected a sequence 0..%d", b, src[b],
                            c->B - 1);
    /* slot[r]: where old sequence r is saved (-1: read in place) */
    int *slot = malloc(sizeof(int) * 3 * (size_t)c->B), *len = slot + c->B, *lo = len + c->B;
    if (!slot) return mha_fail(MHA_E_NOMEM, "mha_cache_reorder: no memory");
    size_t n_saved = 0;
    for (int r = 0; r < c->B; r++) slot[r] = -1;
    for (int b = 0; b < c->B; b++) {
        const int r = src[b];
        if (r != b && src[r] != r && slot[r] < 0) slot[r] = (int)n_saved++;
    }
    const size_t rd = row_data_bytes(c), rs = row_scale_floats(c);
    char *data = n_saved ? malloc(n_saved * rd) : NULL;
    float *scales = n_saved && c->scales ? malloc(n_saved * rs * sizeof(float)) : NULL;
    int *upos = n_saved ? malloc(n_saved * sizeof(int) * (size_t)c->cap) : NULL;
    float *kmax = n_saved ? malloc(n_saved * sizeof(float) * (size_t)c->h_kv) : NULL;
    if (n_saved && (!data || (c->scales && !scales) || !upos || !kmax)) {
        free(slot), free(data), free(scales), free(upos), free(kmax);
        return mha_fail(MHA_E_NOMEM, "mha_cache_reorder: no memory to save %zu of %d sequences (%zu bytes)",
                        n_saved, c->B, n_saved * (rd + rs * sizeof(float)));
    }
    memcpy(len, c->len, sizeof(int) * (size_t)c->B);
    memcpy(lo, c->lo, sizeof(int) * (size_t)c->B);
    mha_cache saved = *c; /* the saved sequences, addressed as sequences 0 .. n_saved-1 */
    saved.data = data, saved.scales = scales, saved.upos = upos, saved.kmax = kmax;
    for (int r = 0; r < c->B; r++)
        if (slot[r] >= 0) row_copy(&saved, slot[r], c->data, c->scales, c->upos, c->kmax, (size_t)r);
    for (int b = 0; b < c->B; b++) {
        const int r = src[b];
        if (r == b) continue;
        if (slot[r] >= 0) row_copy(c, b, data, scales, upos, kmax, (size_t)slot[r]);
        else row_copy(c, b, c->data, c->scales, c->upos, c->kmax, (size_t)r);
        c->len[b] = len[r], c->lo[b] = lo[r];
    }
    free(slot), free(data), free(scales), free(upos), free(kmax);
    return MHA_OK;
}

mha_status mha_cache_reorder(mha_cache *c, const int *src) {
    if (!c || !src) return mha_fail(MHA_E_ARG, "mha_cache_reorder: NULL %s", c ? "src" : "cache");
    mha_status s = mha_cache_begin(c, 1, "mha_cache_reorder");
    return s ? s : mha_cache_end(c, 1, cache_reorder_held(c, src));
}

/* ------------------------------------------------------------ clone */

static mha_status cache_clone_held(mha_cache **out, const mha_cache *src) {
    mha_cache *c = calloc(1, sizeof *c);
    if (!c) return mha_fail(MHA_E_NOMEM, "mha_cache_clone: no memory");
    *c = *src; /* the shape and settings; every array is the clone's own */
    const size_t rows = (size_t)src->B, blocks = rows * src->h_kv, hk = (size_t)src->h_kv;
    if (!cache_arrays(c)) {
        mha_cache_free(c);
        return mha_fail(MHA_E_NOMEM, "mha_cache_clone: no memory for %zu bytes of K/V", mha_cache_bytes(src));
    }
    memcpy(c->data, src->data, rows * row_data_bytes(src));
    if (src->scales) memcpy(c->scales, src->scales, rows * row_scale_floats(src) * sizeof(float));
    memcpy(c->len, src->len, sizeof(int) * rows), memcpy(c->lo, src->lo, sizeof(int) * rows);
    memcpy(c->upos, src->upos, sizeof(int) * rows * src->cap), memcpy(c->kmax, src->kmax, sizeof(float) * blocks);
    memcpy(c->phys, src->phys, sizeof(int) * hk), memcpy(c->labels_k, src->labels_k, sizeof(int) * hk);
    memcpy(c->labels_v, src->labels_v, sizeof(int) * hk);
    *out = c;
    return MHA_OK;
}

mha_status mha_cache_clone(mha_cache **out, const mha_cache *src) {
    if (!out) return mha_fail(MHA_E_ARG, "mha_cache_clone: out is NULL");
    *out = NULL;
    if (!src) return mha_fail(MHA_E_ARG, "mha_cache_clone: src is NULL");
    mha_status s = mha_cache_begin(src, 0, "mha_cache_clone");
    return s ? s : mha_cache_end(src, 0, cache_clone_held(out, src));
}

/* ---------------------------------------------------------- storing */

/* x (d) -> q (d, stride qs) int8 with one scale per block of
 * MHA_Q8_BLOCK values (stride ss): scale = max|x| / 127, q = x / scale
 * rounded to nearest, ties away from zero (roundf: the same bits under
 * any floating-point rounding mode). A block of zeros (or one so small
 * that max|x| / 127 underflows to 0) gets scale 0 and q = 0. */
static void quantize_q8(int8_t *q, size_t qs, float *scale, size_t ss, const float *x, int d) {
    for (int b0 = 0, blk = 0; b0 < d; b0 += MHA_Q8_BLOCK, blk++) {
        int b1 = b0 + MHA_Q8_BLOCK < d ? b0 + MHA_Q8_BLOCK : d;
        float amax = 0.0f;
        for (int i = b0; i < b1; i++) amax = fabsf(x[i]) > amax ? fabsf(x[i]) : amax;
        float sc = amax / 127.0f;
        scale[(size_t)blk * ss] = sc;
        for (int i = b0; i < b1; i++) {
            float r = sc > 0.0f ? roundf(x[i] / sc) : 0.0f;
            q[(size_t)i * qs] = (int8_t)(r > 127.0f ? 127.0f : r < -127.0f ? -127.0f : r);
        }
    }
}

/* x (d) stored at dst (d elements of type dt, stride `stride`; int8:
 * its block scales at scale, the same stride). */
static void store_row(const mha_decode_kernels *kr, mha_cache_dtype dt, void *dst,
                      size_t stride, float *scale, const float *x, int d) {
    if (dt == MHA_CACHE_I8) {
        quantize_q8(dst, stride, scale, stride, x, d);
    } else if (dt == MHA_CACHE_F32) {
        for (int i = 0; i < d; i++) ((float *)dst)[(size_t)i * stride] = x[i];
    } else if (stride == 1) {
        kr->to_f16(dst, x, (size_t)d);
    } else {
        uint16_t h[256];
        for (int d0 = 0; d0 < d; d0 += 256) {
            int nd = d - d0 < 256 ? d - d0 : 256;
            kr->to_f16(h, x + d0, (size_t)nd);
            for (int i = 0; i < nd; i++) ((uint16_t *)dst)[(size_t)(d0 + i) * stride] = h[i];
        }
    }
}

void mha_cache_store(const mha_exec *ex, mha_cache *c, const float *k, const float *v, const int *pos,
                     const int *row0, int t0, const int *n) {
    const mha_decode_kernels *kr = mha_exec_decode(ex);
    for (int b = 0; b < c->B; b++) {
        for (int i = 0; i < n[b]; i++) {
            int slot = mha_cache_slot_of(c, c->len[b] + i);
            c->upos[(size_t)b * c->cap + slot] = pos ? pos[row0[b] + t0 + i] : c->len[b] + i;
            const float *kr_row = k + ((size_t)row0[b] + t0 + i) * c->h_kv * c->d_k;
            const float *vr_row = v + ((size_t)row0[b] + t0 + i) * c->h_kv * c->d_v;
            for (int g = 0; g < c->h_kv; g++) {
                size_t kv = mha_cache_kv_index(c, b, g);
                /* K: dim d of this key at its panel lane, stride 8 */
                size_t kbase = mha_cache_k_off(c, kv, slot), vbase = mha_cache_v_off(c, kv, slot);
                const float *src = kr_row + (size_t)g * c->d_k;
                const float kn = (float)sqrt(mha_sum_squares(src, c->d_k));
                if (!(kn <= c->kmax[kv])) c->kmax[kv] = kn;
                store_row(kr, c->kt, (char *)c->data + kbase * c->ek, MHA_KPANEL,
                          c->scales ? c->scales + mha_cache_ks_off(c, kv, slot) : NULL, src, c->d_k);
                store_row(kr, c->vt, (char *)c->data + vbase * c->ev, 1,
                          c->scales ? c->scales + mha_cache_vs_off(c, kv, slot) : NULL,
                          vr_row + (size_t)g * c->d_v, c->d_v);
            }
        }
        c->len[b] += n[b];
        if (c->len[b] - mha_cache_ring(c) > c->lo[b]) c->lo[b] = c->len[b] - mha_cache_ring(c);
    }
}

double mha_cache_kmax_live(mha_cache *c, const mha_decode_kernels *kr, int b, int g) {
    const double best = mha_cache_kmax_scan(c, kr, b, g);
    float f = (float)best;
    c->kmax[mha_cache_kv_index(c, b, g)] = f < best ? nextafterf(f, INFINITY) : f; /* still a bound */
    return best;
}

double mha_cache_kmax_scan(const mha_cache *c, const mha_decode_kernels *kr, int b, int g) {
    const size_t kv = mha_cache_kv_index(c, b, g);
    double best = 0.0;
    enum { SPAN = 64 };
    int pos[SPAN];
    for (int s0 = 0; s0 < c->cap; s0 += SPAN) {
        const int n = c->cap - s0 < SPAN ? c->cap - s0 : SPAN;
        mha_cache_slot_positions(pos, c, b, s0, n);
        for (int i = 0; i < n; i++) {
            if (pos[i] == INT_MIN) continue; /* not a live key */
            const size_t k0 = mha_cache_k_off(c, kv, s0 + i);
            double sq = 0.0;
            for (int d = 0; d < c->d_k; d++) {
                const double e = mha_cache_key_at(c, kr, k0, kv, s0 + i, d);
                sq += e * e;
            }
            if (sqrt(sq) > best) best = sqrt(sq);
        }
    }
    return best;
}

/* ------------------------------------------------- low-level entries */

/* n_new (B entries or NULL) -> n, with range checks; row0[b] = b*T. */
static mha_status counts(int *n, int *row0, const mha_cache *c, int T, const int *n_new,
                         const char *fn) {
    if (T < 1) return mha_fail(MHA_E_ARG, "%s: T=%d; expected >= 1", fn, T);
    if ((long long)c->B * T > INT_MAX) /* row0[b] = b*T must not wrap */
        return mha_fail(MHA_E_ARG, "%s: T=%d with %d sequences; expected B*T <= %d", fn, T, c->B, INT_MAX);
    for (int b = 0; b < c->B; b++) {
        n[b] = n_new ? n_new[b] : T;
        row0[b] = b * T;
        if (n[b] < 0 || n[b] > T)
            return mha_fail(MHA_E_ARG, "%s: n_new[%d]=%d; expected 0..T=%d", fn, b, n[b], T);
    }
    return MHA_OK;
}

/* MHA_OK when the rows a call reads of a (B, T, width) input are finite
 * and, to be stored as dt, within its range: rows row0[b] .. row0[b] +
 * n[b] - 1 (the rest may be anything). */
static mha_status rows_finite(const float *a, const mha_cache *c, const int *n, const int *row0, int width,
                              mha_cache_dtype dt, const char *name) {
    for (int b = 0; b < c->B; b++) {
        const size_t first = (size_t)row0[b] * width, count = (size_t)n[b] * width;
        const size_t i = mha_first_nonfinite(a + first, count, 0);
        if (i < count)
            return mha_fail(MHA_E_NONFINITE, "%s[%zu] = %g (sequence %d); expected a finite number", name, first + i,
                            (double)a[first + i], b);
        for (size_t j = 0; dt == MHA_CACHE_F16 && j < count; j++)
            if (mha_cache_f16_overflows(dt, fabsf(a[first + j])))
                return mha_fail(MHA_E_NONFINITE, "%s[%zu] = %g (sequence %d) is beyond float16's largest 65504 (this "
                                "cache stores it in float16); expected |value| < 65520, or an fp32 or int8 cache",
                                name, first + j, (double)a[first + j], b);
        for (size_t j = 0; dt == MHA_CACHE_I8 && j < count; j++)
            if (mha_cache_q8_overflows(dt, fabsf(a[first + j])))
                return mha_fail(MHA_E_NONFINITE, "%s[%zu] = %g (sequence %d): this cache stores it in int8, which "
                                "reads it back as 127 * (%g / 127) = inf; expected |value| < FLT_MAX, or an fp32 cache",
                                name, first + j, (double)a[first + j], b, (double)a[first + j]);
    }
    return MHA_OK;
}

/* Whether n[b] more tokens fit (capacity, or the ring's window rule). */
mha_status mha_cache_check_room(const mha_cache *c, const int *n, const char *fn) {
    for (int b = 0; b < c->B; b++) {
        if (!c->window && c->len[b] + n[b] > c->cap)
            return mha_fail(MHA_E_ARG,
                            "%s: sequence %d holds %d tokens, %d more exceed the capacity %d; "
                            "create a larger cache, truncate, or use a window", fn, b, c->len[b], n[b], c->cap);
        if (c->window && n[b] > mha_cache_ring(c) - c->window + 1)
            return mha_fail(MHA_E_ARG,
                            "%s: %d tokens for sequence %d in one call; a ring of %d slots with "
                            "window %d takes at most %d per call", fn, n[b], b, mha_cache_ring(c), c->window,
                            mha_cache_ring(c) - c->window + 1);
    }
    return MHA_OK;
}

static mha_status cache_append_held(mha_cache *c, const float *k, const float *v, int T, const int *n_new) {
    if (!c || !k || !v)
        return mha_fail(MHA_E_ARG, "mha_cache_append: NULL %s", !c ? "cache" : !k ? "k" : "v");
    if (c->cross)
        return mha_fail(MHA_E_ARG, "mha_cache_append: the cache is a cross-attention memory; expected "
                        "mha_cache_set_memory, which replaces it whole");
    int *n = malloc(sizeof(int) * 2 * c->B);
    if (!n) return mha_fail(MHA_E_NOMEM, "mha_cache_append: no memory");
    mha_status s = counts(n, n + c->B, c, T, n_new, "mha_cache_append");
    if (!s) s = rows_finite(k, c, n, n + c->B, c->h_kv * c->d_k, c->kt, "mha_cache_append: k");
    if (!s) s = rows_finite(v, c, n, n + c->B, c->h_kv * c->d_v, c->vt, "mha_cache_append: v");
    if (!s) s = mha_cache_check_room(c, n, "mha_cache_append");
    mha_exec ex;
    if (!s) s = mha_exec_resolve(&ex, NULL);
    if (!s) mha_cache_store(&ex, c, k, v, NULL, n + c->B, 0, n);
    free(n);
    return s;
}

mha_status mha_cache_append(mha_cache *c, const float *k, const float *v, int T, const int *n_new) {
    if (!c) return mha_fail(MHA_E_ARG, "mha_cache_append: NULL cache");
    mha_status s = mha_cache_begin(c, 1, "mha_cache_append");
    return s ? s : mha_cache_end(c, 1, cache_append_held(c, k, v, T, n_new));
}

int mha_cache_scores_fit(const mha_cache *c, const float *q, const int *row0, const int *n, int b, int g, double kmax,
                         float scale, mha_score_excess *bad) {
    const int n_rep = c->h / c->h_kv;
    for (int i = 0; i < n[b] * n_rep; i++) {
        const int t = i / n_rep, r = g * n_rep + i % n_rep;
        const float *qr = q + ((size_t)row0[b] + t) * c->h * c->d_k + (size_t)r * c->d_k;
        const double qn = sqrt(mha_sum_squares(qr, c->d_k)), bound = qn * kmax * fabs(scale);
        if (!(bound <= MHA_FAST_SCORE_LIMIT) || !(qn <= mha_cache_q8_query_limit(c))) {
            *bad = (mha_score_excess){r, t, qn, bound};
            return 0;
        }
    }
    return 1;
}

/* mha_cache_attend's queries under the range rule: the stored key bound
 * first, else the live keys' norm scanned again without storing it (an
 * attend only reads the cache). */
static mha_status attend_scores_fit(const mha_cache *c, const mha_decode_kernels *kr, const float *q, const int *n,
                                    const int *row0, float scale) {
    for (int b = 0; b < c->B; b++)
        for (int g = 0; g < c->h_kv; g++) {
            mha_score_excess bad;
            if (mha_cache_scores_fit(c, q, row0, n, b, g, c->kmax[mha_cache_kv_index(c, b, g)], scale, &bad) ||
                mha_cache_scores_fit(c, q, row0, n, b, g, mha_cache_kmax_scan(c, kr, b, g), scale, &bad))
                continue;
            if (bad.bound <= MHA_FAST_SCORE_LIMIT) /* the score fits: the query's norm is what an int8 K cannot hold */
                return mha_fail(MHA_E_NONFINITE, "mha_cache_attend: a query of sequence %d kv head %d has norm %.3g; "
                                "this cache's int8 keys sum q times codes up to 127 before their block scale, which "
                                "fp32 holds for norms up to %.3g; expected smaller queries, or an fp16 / fp32 K", b, g,
                                bad.norm, mha_cache_q8_query_limit(c));
            return mha_fail(MHA_E_NONFINITE, "mha_cache_attend: scores of sequence %d kv head %d may reach %.3g, beyond "
                            "the %g its fp32 softmax keeps accurate; expected smaller q, keys or scale", b, g,
                            bad.bound, MHA_FAST_SCORE_LIMIT);
        }
    return MHA_OK;
}

static mha_status cache_attend_held(const mha_cache *c, float *z, const float *q, int T, const int *n_new,
                            float scale) {
    if (!c || !z || !q)
        return mha_fail(MHA_E_ARG, "mha_cache_attend: NULL %s", !c ? "cache" : !z ? "z" : "q");
    if (!isfinite(scale)) return mha_fail(MHA_E_NONFINITE, "mha_cache_attend: scale=%g; expected finite", (double)scale);
    int *n = malloc(sizeof(int) * 2 * c->B);
    if (!n) return mha_fail(MHA_E_NOMEM, "mha_cache_attend: no memory");
    mha_status s = counts(n, n + c->B, c, T, n_new, "mha_cache_attend");
    if (!s) s = rows_finite(q, c, n, n + c->B, c->h * c->d_k, MHA_CACHE_F32, "mha_cache_attend: q");
    for (int b = 0; b < c->B && !s; b++) {
        int first = c->cross ? (n[b] && !c->len[b] ? -1 : 0) : c->len[b] - n[b]; /* a memory: any queries */
        int need = c->window ? first - (c->window - 1) : 0;
        if (need < c->n_sink) need = c->n_sink; /* never evicted */
        if (first < 0)
            s = mha_fail(MHA_E_ARG, "mha_cache_attend: n_new[%d]=%d but sequence %d holds %d tokens; %s", b, n[b], b,
                         c->len[b], c->cross ? "expected mha_cache_set_memory first" : "append the queries' keys first");
        else if ((need > 0 ? need : 0) < c->lo[b])
            s = mha_fail(MHA_E_ARG, "mha_cache_attend: the first of %d queries of sequence %d needs "
                         "position %d, already overwritten in the ring", n[b], b, need);
    }
    mha_exec ex;
    if (!s) s = mha_exec_resolve(&ex, NULL);
    const float sc = scale != 0.0f ? scale : 1.0f / sqrtf((float)c->d_k);
    if (!s) s = attend_scores_fit(c, mha_exec_decode(&ex), q, n, n + c->B, sc);
    if (!s) {
        mha_decode_opts o = {.scale = sc, .left = -1};
        s = mha_decode_attend(&ex, z, NULL, c, q, n + c->B, 0, n, &o);
    }
    free(n);
    return s;
}

mha_status mha_cache_attend(const mha_cache *c, float *z, const float *q, int T, const int *n_new,
                            float scale) {
    if (!c) return mha_fail(MHA_E_ARG, "mha_cache_attend: NULL cache");
    mha_status s = mha_cache_begin(c, 0, "mha_cache_attend");
    return s ? s : mha_cache_end(c, 0, cache_attend_held(c, z, q, T, n_new, scale));
}
