/* snapshot.c — a cache's state to and from plain arrays (snapshot.h): the
 * storage layout (K panels, chunks, head permutation, int8 scales) stays
 * in cache/, the file format in io/cache_file.c.
 * Legend: as snapshot.h. */
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cache/cache_internal.h"
#include "cache/snapshot.h"

/* fp16 <-> fp32 of the portable table: the same bits as every table's */
static const mha_decode_kernels *conv(void) { return &mha_decode_kernels_scalar; }

void mha_cache_state_shape(mha_cache_state *s, const mha_cache *c) {
    s->B = c->B, s->cap = c->cap, s->window = c->window, s->n_sink = c->n_sink, s->cross = c->cross;
    s->d_model = c->d_model, s->h = c->h, s->h_kv = c->h_kv, s->d_k = c->d_k, s->d_v = c->d_v;
    s->d_kv_in = c->d_kv_in, s->d_v_in = c->d_v_in, s->kt = c->kt, s->vt = c->vt, s->nbk = c->nbk, s->nbv = c->nbv;
}

static mha_status cache_get_info_held(const mha_cache *c, mha_cache_info *info) {
    *info = (mha_cache_info){c->B, c->cap, c->window, c->n_sink, c->cross, c->kt, c->vt};
    return MHA_OK;
}

mha_status mha_cache_get_info(const mha_cache *c, mha_cache_info *info) {
    if (!c || !info) return mha_fail(MHA_E_ARG, "mha_cache_get_info: NULL %s", c ? "info" : "cache");
    mha_status s = mha_cache_begin(c, 0, "mha_cache_get_info");
    return s ? s : mha_cache_end(c, 0, cache_get_info_held(c, info));
}

/* Element (row, e) of the storage at element offset at of type dt, as a
 * float (int8: the code). */
static float stored(const void *data, mha_cache_dtype dt, size_t at) {
    if (dt == MHA_CACHE_F32) return ((const float *)data)[at];
    if (dt == MHA_CACHE_I8) return (float)((const int8_t *)data)[at];
    float f;
    conv()->from_f16(&f, (const uint16_t *)data + at, 1);
    return f;
}

/* The index of (b, g, slot s, element e) in an (B, h_kv, R, w) array. */
static size_t at4(const mha_cache_state *s, int b, int g, int slot, int w, int e) {
    return (((size_t)b * s->h_kv + (size_t)g) * s->cap + (size_t)slot) * (size_t)w + (size_t)e;
}

static mha_status state_export_held(mha_cache_state *s, const mha_cache *c);

/* mha_cache_save's read of the cache (io/cache_file.c): held as a reader */
mha_status mha_cache_state_export(mha_cache_state *s, const mha_cache *c) {
    mha_status st = mha_cache_begin(c, 0, "mha_cache_save");
    return st ? st : mha_cache_end(c, 0, state_export_held(s, c));
}

static mha_status state_export_held(mha_cache_state *s, const mha_cache *c) {
    int *live = malloc(sizeof(int) * (size_t)c->cap);
    if (!live) return mha_fail(MHA_E_NOMEM, "mha_cache_save: no memory");
    const size_t per_b = (size_t)c->h_kv * c->cap;
    memset(s->k, 0, sizeof(float) * c->B * per_b * c->d_k);
    memset(s->v, 0, sizeof(float) * c->B * per_b * c->d_v);
    if (s->k_scale) memset(s->k_scale, 0, sizeof(float) * c->B * per_b * c->nbk);
    if (s->v_scale) memset(s->v_scale, 0, sizeof(float) * c->B * per_b * c->nbv);
    memset(s->pos, 0, sizeof(int) * (size_t)c->B * c->cap);
    for (int b = 0; b < c->B; b++) {
        s->len[b] = c->len[b], s->lo[b] = c->lo[b];
        mha_cache_slot_positions(live, c, b, 0, c->cap);
        for (int slot = 0; slot < c->cap; slot++) {
            if (live[slot] == INT_MIN) continue;
            s->pos[(size_t)b * c->cap + slot] = mha_cache_user_position(c, b, slot);
            for (int g = 0; g < c->h_kv; g++) {
                const size_t kv = mha_cache_kv_index(c, b, g), k0 = mha_cache_k_off(c, kv, slot),
                             v0 = mha_cache_v_off(c, kv, slot);
                for (int e = 0; e < c->d_k; e++)
                    s->k[at4(s, b, g, slot, c->d_k, e)] = stored(c->data, c->kt, k0 + (size_t)e * MHA_KPANEL);
                for (int e = 0; e < c->d_v; e++) s->v[at4(s, b, g, slot, c->d_v, e)] = stored(c->data, c->vt, v0 + e);
                for (int e = 0; e < c->nbk; e++)
                    s->k_scale[at4(s, b, g, slot, c->nbk, e)] = c->scales[mha_cache_ks_off(c, kv, slot) + (size_t)e * MHA_KPANEL];
                for (int e = 0; e < c->nbv; e++)
                    s->v_scale[at4(s, b, g, slot, c->nbv, e)] = c->scales[mha_cache_vs_off(c, kv, slot) + (size_t)e];
            }
        }
    }
    free(live);
    memcpy(s->labels_k, c->labels_k, sizeof(int) * c->h_kv);
    memcpy(s->labels_v, c->labels_v, sizeof(int) * c->h_kv);
    return MHA_OK;
}

/* MHA_OK when length len and oldest position lo are a state the cache's
 * calls can reach (store, truncate, reset): positions past the sinks fit
 * the ring, and the next token's window needs none that is gone. */
static mha_status check_lengths(const mha_cache_state *s, const mha_cache *c, int b, const char *name) {
    const int len = s->len[b], lo = s->lo[b], ring = s->cap - s->n_sink;
    const int first_ring = lo > s->n_sink ? lo : s->n_sink, need = mha_cache_next_needs(c, len);
    const int ok = len >= 0 && lo >= 0 && lo <= len && (s->window ? len - first_ring <= ring : lo == 0 && len <= s->cap) &&
                   (len == 0 || need >= lo);
    if (!ok)
        return mha_fail(MHA_E_FORMAT, "%s: sequence %d has length %d and oldest stored position %d; expected 0 <= "
                        "oldest <= length, positions past the %d sink tokens within the ring of %d slots%s", name, b,
                        len, lo, s->n_sink, ring, s->window ? " and the window's keys still stored" : " (no window: oldest 0)");
    return MHA_OK;
}

/* MHA_OK when v (a value read for type dt) is one the type holds: a
 * finite fp32, an fp16 value (rounding it to fp16 gives it back), an int8
 * code in [-127, 127]; a scale finite and >= 0. */
static int value_ok(mha_cache_dtype dt, float v) {
    if (!isfinite(v)) return 0;
    if (dt == MHA_CACHE_I8) return v == nearbyintf(v) && v >= -127.0f && v <= 127.0f;
    if (dt == MHA_CACHE_F16) {
        uint16_t h;
        float back;
        conv()->to_f16(&h, &v, 1);
        conv()->from_f16(&back, &h, 1);
        return back == v;
    }
    return 1;
}

/* The first entry of a (B, h_kv, R, w) array in a live slot that type dt
 * cannot hold (scale: a block scale), or MHA_OK; with positions, each
 * sequence's negative stored positions after its entries (the first
 * array's pass). live (B, R): the position each slot holds, INT_MIN none. */
static mha_status check_values(const mha_cache_state *s, const int *live, const float *a, int w, mha_cache_dtype dt,
                               int scale, int positions, const char *what, const char *name) {
    mha_status st = MHA_OK;
    for (int b = 0; b < s->B && !st; b++) {
        const int *lb = live + (size_t)b * s->cap;
        for (int slot = 0; slot < s->cap && !st; slot++)
            for (int g = 0; lb[slot] != INT_MIN && g < s->h_kv && !st; g++)
                for (int e = 0; e < w && !st; e++) {
                    const float v = a[at4(s, b, g, slot, w, e)];
                    if (scale ? !(isfinite(v) && v >= 0.0f) : !value_ok(dt, v))
                        st = mha_fail(MHA_E_FORMAT, "%s: %s[%d][%d][%d][%d] = %g; expected %s", name, what, b, g, slot,
                                      e, (double)v, scale ? "a finite scale >= 0"
                                      : dt == MHA_CACHE_I8 ? "an int8 code in -127..127"
                                      : dt == MHA_CACHE_F16 ? "a float16 value" : "a finite number");
                }
        for (int slot = 0; positions && slot < s->cap && !st; slot++)
            if (lb[slot] != INT_MIN && s->pos[(size_t)b * s->cap + slot] < 0)
                st = mha_fail(MHA_E_FORMAT, "%s: positions[%d][%d] = %d; expected >= 0", name, b, slot,
                              s->pos[(size_t)b * s->cap + slot]);
    }
    return st;
}

/* int8 (a, codes of width w, with their scales sc, nb blocks of MHA_Q8_BLOCK
 * per row): in each live slot every code times its block's scale finite, and
 * 0 under a 0 scale, as the cache's quantizer stores them (scale = max|x| /
 * 127, q = 0 when it is 0; values whose 127 * scale overflows refused).
 * Before, a file's 127 x 3e38 loaded, and the next call found the overflow
 * (for V after appending its K/V). */
static mha_status check_products(const mha_cache_state *s, const int *live, const float *a, const float *sc, int w,
                                 int nb, const char *what, const char *name) {
    for (int b = 0; b < s->B; b++)
        for (int slot = 0; slot < s->cap; slot++)
            for (int g = 0; live[(size_t)b * s->cap + slot] != INT_MIN && g < s->h_kv; g++)
                for (int e = 0; e < w; e++) {
                    const float q = a[at4(s, b, g, slot, w, e)], k = sc[at4(s, b, g, slot, nb, e / MHA_Q8_BLOCK)];
                    if ((k == 0.0f && q != 0.0f) || !isfinite(q * k))
                        return mha_fail(MHA_E_FORMAT, "%s: %s[%d][%d][%d][%d] = %g with scale %g (%s_scale[%d][%d][%d]"
                                        "[%d]); expected %s", name, what, b, g, slot, e, (double)q, (double)k, what, b,
                                        g, slot, e / MHA_Q8_BLOCK, k == 0.0f ? "0, as its scale is 0"
                                                                       : "a code whose value code * scale is finite");
                }
    return MHA_OK;
}

/* Writes element e of (b, g, slot) from the state into c's storage. */
static void put(mha_cache *c, const mha_cache_state *s, int b, int g, int slot) {
    const size_t kv = mha_cache_kv_index(c, b, g), k0 = mha_cache_k_off(c, kv, slot), v0 = mha_cache_v_off(c, kv, slot);
    for (int half = 0; half < 2; half++) {
        const mha_cache_dtype dt = half ? c->vt : c->kt;
        const int w = half ? c->d_v : c->d_k;
        const size_t base = half ? v0 : k0, step = half ? 1 : MHA_KPANEL;
        const float *src = (half ? s->v : s->k) + at4(s, b, g, slot, w, 0);
        for (int e = 0; e < w; e++) {
            const size_t at = base + (size_t)e * step;
            if (dt == MHA_CACHE_F32) ((float *)c->data)[at] = src[e];
            else if (dt == MHA_CACHE_I8) ((int8_t *)c->data)[at] = (int8_t)src[e];
            else conv()->to_f16((uint16_t *)c->data + at, src + e, 1);
        }
    }
    for (int e = 0; e < c->nbk; e++)
        c->scales[mha_cache_ks_off(c, kv, slot) + (size_t)e * MHA_KPANEL] = s->k_scale[at4(s, b, g, slot, c->nbk, e)];
    for (int e = 0; e < c->nbv; e++) c->scales[mha_cache_vs_off(c, kv, slot) + (size_t)e] = s->v_scale[at4(s, b, g, slot, c->nbv, e)];
}

mha_status mha_cache_state_import(mha_cache *c, const mha_cache_state *s, const char *name) {
    mha_status st = MHA_OK;
    for (int b = 0; b < s->B && !st; b++) st = check_lengths(s, c, b, name);
    for (int g = 0; g < s->h_kv && !st; g++) { /* each a permutation of the kv heads */
        int dup = 0;
        for (int e = 0; e < g; e++) dup |= s->labels_k[e] == s->labels_k[g] || s->labels_v[e] == s->labels_v[g];
        if (dup || s->labels_k[g] < 0 || s->labels_k[g] >= s->h_kv || s->labels_v[g] < 0 || s->labels_v[g] >= s->h_kv)
            st = mha_fail(MHA_E_FORMAT, "%s: labels_k[%d] = %d, labels_v[%d] = %d; expected a permutation of the kv "
                          "heads 0..%d", name, g, s->labels_k[g], g, s->labels_v[g], s->h_kv - 1);
    }
    if (st) return st;
    /* the lengths decide which slots are live: set them, find the live
     * slots once, check, undo on error */
    int *live = malloc(sizeof(int) * (size_t)s->B * s->cap + 1); /* (B, R) */
    if (!live) return mha_fail(MHA_E_NOMEM, "%s: no memory", name);
    memcpy(c->len, s->len, sizeof(int) * s->B), memcpy(c->lo, s->lo, sizeof(int) * s->B);
    for (int b = 0; b < s->B; b++) mha_cache_slot_positions(live + (size_t)b * s->cap, c, b, 0, s->cap);
    st = check_values(s, live, s->k, s->d_k, s->kt, 0, 1, "k", name);
    if (!st) st = check_values(s, live, s->v, s->d_v, s->vt, 0, 0, "v", name);
    if (!st && s->nbk) st = check_values(s, live, s->k_scale, s->nbk, s->kt, 1, 0, "k_scale", name);
    if (!st && s->nbv) st = check_values(s, live, s->v_scale, s->nbv, s->vt, 1, 0, "v_scale", name);
    if (!st && s->nbk) st = check_products(s, live, s->k, s->k_scale, s->d_k, s->nbk, "k", name);
    if (!st && s->nbv) st = check_products(s, live, s->v, s->v_scale, s->d_v, s->nbv, "v", name);
    if (st) {
        memset(c->len, 0, sizeof(int) * s->B), memset(c->lo, 0, sizeof(int) * s->B);
        free(live);
        return st;
    }
    for (int b = 0; b < s->B; b++) {
        for (int slot = 0; slot < s->cap; slot++) {
            if (live[(size_t)b * s->cap + slot] == INT_MIN) continue;
            c->upos[(size_t)b * c->cap + slot] = s->pos[(size_t)b * s->cap + slot];
            for (int g = 0; g < s->h_kv; g++) put(c, s, b, g, slot);
        }
        for (int g = 0; g < s->h_kv; g++) mha_cache_kmax_live(c, conv(), b, g);
    }
    free(live);
    memcpy(c->labels_k, s->labels_k, sizeof(int) * s->h_kv);
    memcpy(c->labels_v, s->labels_v, sizeof(int) * s->h_kv);
    return MHA_OK;
}
