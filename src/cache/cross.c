/* cross.c — the cross-attention memory of an encoder-decoder layer
 * (Whisper, BART, Marian): the keys and values of the encoder's output,
 * projected once per sequence and kept in a cache's storage, which every
 * decoder step then attends whole (mha_forward_cached on such a cache:
 * forward_cached.c).
 *
 *   pack the s_len[b] rows        kvc (N, d_kv_in), vc (N, d_v_in)
 *   project                       K = kvc W_K + b_K, V = vc W_V + b_V
 *   clip_qkv, QK-norm             on K (V: clip only), as the layer's
 *                                 forward does to its keys
 *   store                         positions 0 .. s_len[b]-1 of sequence b
 *
 * Legend: B sequences, S memory rows per sequence in kv, N packed rows,
 * h_kv kv heads, d_k, d_v. */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache/cache_internal.h"
#include "core/packing.h"
#include "core/variants.h"

/* The packed rows of one memory. */
typedef struct {
    int N;
    int *n, *row0;     /* (B) rows of sequence b, its first packed row */
    float *kvc, *vc;   /* (N, d_kv_in), (N, d_v_in): the sources' rows (kv itself when unpadded) */
    float *k, *v;      /* (N, h_kv*d_k), (N, h_kv*d_v) */
} memory_rows;

static void memory_free(memory_rows *m, const float *kv, const float *v_src) {
    if (m->kvc != kv) free(m->kvc);
    if (m->vc != v_src && m->vc != m->kvc) free(m->vc);
    free(m->n), free(m->k), free(m->v);
}

/* K = kvc W_K + b_K and V = vc W_V + b_V on the fast path's packed
 * weights (W_K | W_V share the fused Q|K|V matrix's sections 1, 2 when the
 * layer reads d_model-wide sources, else the kv matrix; split_v: its own). */
static mha_status project(const mha_exec *ex, const memory_rows *m, const mha_layer *L, const mha_cache *c) {
    const struct mha_fast_state *f = L->fast;
    if (!f) return mha_fail(MHA_E_UNSUPPORTED, "mha_cache_set_memory: the layer's packed weights are missing");
    const mha_dst dk = {MHA_DST_ROWS, m->k, (size_t)c->h_kv * c->d_k, 0, 0, 0, 0};
    const mha_dst dv = {MHA_DST_ROWS, m->v, (size_t)c->h_kv * c->d_v, 0, 0, 0, 0};
    const mha_packed *pk = f->fused ? &f->qkv : &f->kv;
    const int k_sec = f->fused ? 1 : 0, kin = f->fused ? c->d_model : c->d_kv_in;
    const mha_kernels *kern = mha_exec_prefill(ex);
    const int nt = mha_exec_threads_for(ex, (double)m->N * kin * c->h_kv * (c->d_k + c->d_v));
    mha_gemm_args g = {&dk, m->kvc, (size_t)kin, m->N, pk, k_sec, k_sec + 1, 0, kin, 1, 0};
    mha_status s = mha_gemm(&g, kern, nt);
    if (s) return s;
    if (f->split_v) g = (mha_gemm_args){&dv, m->vc, (size_t)c->d_v_in, m->N, &f->v, 0, 1, 0, c->d_v_in, 1, 0};
    else g = (mha_gemm_args){&dv, m->vc, (size_t)kin, m->N, pk, k_sec + 1, k_sec + 2, 0, kin, 1, 0};
    return mha_gemm(&g, kern, nt);
}

/* clip_qkv on K and V, then the layer's key norm on K (per kv head, or
 * OLMo 2's over a row's whole width): what its forward does to keys. */
static mha_status transform(const memory_rows *m, const mha_layer *L, const mha_cache *c) {
    const mha_config *f = &L->cfg;
    const size_t N = (size_t)m->N, wk = (size_t)c->h_kv * c->d_k;
    if (f->clip_qkv != 0.0f) {
        mha_clip(m->k, N * wk, f->clip_qkv, 1);
        mha_clip(m->v, N * c->h_kv * c->d_v, f->clip_qkv, 1);
    }
    if (f->qk_norm == MHA_QK_NORM_NONE) return MHA_OK;
    double *st = f->qk_norm_whole ? malloc(sizeof(double) * 2 * N) : NULL; /* (N, 2) */
    if (f->qk_norm_whole && !st) return mha_fail(MHA_E_NOMEM, "mha_cache_set_memory: no memory for %zu rows", N);
    if (st) mha_qk_norm_rows_stats(st, m->k, N, wk, f, 1);
    for (int g = 0; g < c->h_kv; g++) {
        const float *nw = L->k_norm + (f->qk_norm_per_head ? (size_t)g * c->d_k : 0);
        const mha_head_rows hr = {m->k + (size_t)g * c->d_k, wk, 1};
        mha_qk_transform(f, hr, m->N, nw, st, NULL, 0, NULL, NULL);
    }
    free(st);
    return MHA_OK;
}

/* Where element i of the packed K (side 0) or V (side 1) lies, written
 * as "sequence b, memory row j, kv head g" into buf: the refusals below
 * name the row of kv to look at. */
static const char *locate(char *buf, size_t size, const memory_rows *m, const mha_cache *c, size_t i, int side) {
    const int d = side ? c->d_v : c->d_k;
    const size_t width = (size_t)c->h_kv * d, r = i / width;
    int b = 0;
    while (b + 1 < c->B && (size_t)m->row0[b + 1] <= r) b++;
    snprintf(buf, size, "sequence %d, memory row %d, kv head %d", b, (int)(r - (size_t)m->row0[b]),
             (int)((i % width) / (size_t)d));
    return buf;
}

/* K and V within what their storage types hold, and V's weighted sums
 * within fp32 (as mha_forward_cached checks its new rows). */
static mha_status check_range(const memory_rows *m, const mha_cache *c) {
    const size_t nk = (size_t)m->N * c->h_kv * c->d_k, nv = (size_t)m->N * c->h_kv * c->d_v;
    double kabs = 0.0, vmax = 0.0;
    size_t ki = 0, vi = 0; /* where each is reached (the first NaN counts as the largest) */
    for (size_t i = 0; i < nk && !isnan(kabs); i++)
        if (fabs(m->k[i]) > kabs || isnan(m->k[i])) kabs = fabs(m->k[i]), ki = i;
    for (size_t i = 0; i < nv && !isnan(vmax); i++)
        if (fabs(m->v[i]) > vmax || isnan(m->v[i])) vmax = fabs(m->v[i]), vi = i;
    char at[96];
    if (!(kabs <= FLT_MAX) || !(vmax <= FLT_MAX)) {
        const int side = !(kabs <= FLT_MAX) ? 0 : 1;
        return mha_fail(MHA_E_NONFINITE, "mha_cache_set_memory: the projected %s overflowed fp32 (%s); nothing was "
                        "stored; expected kv rows whose projections stay finite", side ? "V" : "K",
                        locate(at, sizeof at, m, c, side ? vi : ki, side));
    }
    const int k_over = mha_cache_f16_overflows(c->kt, kabs) || mha_cache_q8_overflows(c->kt, kabs);
    if (k_over || mha_cache_f16_overflows(c->vt, vmax) || mha_cache_q8_overflows(c->vt, vmax))
        return mha_fail(MHA_E_NONFINITE, "mha_cache_set_memory: K reaches %g and V %g, beyond what this cache's "
                        "storage holds (float16: below 65520), %s at %s; nothing was stored; expected smaller "
                        "memory rows, or an fp32 cache", kabs, vmax, k_over ? "K" : "V",
                        locate(at, sizeof at, m, c, k_over ? ki : vi, !k_over));
    if (!(vmax <= FLT_MAX / (c->cap + 2.0)))
        return mha_fail(MHA_E_NONFINITE, "mha_cache_set_memory: V reaches %g (%s), beyond the fp32 range its "
                        "weighted sums need; nothing was stored", vmax, locate(at, sizeof at, m, c, vi, 1));
    return MHA_OK;
}

/* The counts s_len and the rows they name (finite), packed. */
static mha_status gather(memory_rows *m, const mha_cache *c, const float *kv, const float *v_src, int S,
                         const int *s_len) {
    if (!(m->n = malloc(sizeof(int) * 2 * (size_t)c->B)))
        return mha_fail(MHA_E_NOMEM, "mha_cache_set_memory: no memory");
    m->row0 = m->n + c->B;
    for (int b = 0; b < c->B; b++) {
        m->n[b] = s_len ? s_len[b] : S;
        if (m->n[b] < 1 || m->n[b] > S)
            return mha_fail(MHA_E_ARG, "mha_cache_set_memory: s_len[%d]=%d; expected 1..S=%d", b, m->n[b], S);
        m->row0[b] = m->N, m->N += m->n[b];
    }
    for (int side = 0; side < 2; side++) {
        const float *src = side ? v_src : kv;
        const int w = side ? c->d_v_in : c->d_kv_in;
        for (int b = 0; b < c->B; b++) {
            const size_t first = (size_t)b * S * w, count = (size_t)m->n[b] * w, i = mha_first_nonfinite(src + first, count, 0);
            if (i < count)
                return mha_fail(MHA_E_NONFINITE, "mha_cache_set_memory: %s[%zu] = %g (sequence %d); expected a finite "
                                "number", side && v_src != kv ? "v_src" : "kv", first + i, (double)src[first + i], b);
        }
    }
    const int packed = m->N != c->B * S;
    m->kvc = packed ? malloc(sizeof(float) * (size_t)m->N * c->d_kv_in) : (float *)kv;
    m->vc = v_src == kv ? m->kvc : packed ? malloc(sizeof(float) * (size_t)m->N * c->d_v_in) : (float *)v_src;
    m->k = malloc(sizeof(float) * (size_t)m->N * c->h_kv * c->d_k);
    m->v = malloc(sizeof(float) * (size_t)m->N * c->h_kv * c->d_v);
    if (!m->kvc || !m->vc || !m->k || !m->v)
        return mha_fail(MHA_E_NOMEM, "mha_cache_set_memory: no memory for %d rows", m->N);
    for (int b = 0; packed && b < c->B; b++) {
        memcpy(m->kvc + (size_t)m->row0[b] * c->d_kv_in, kv + (size_t)b * S * c->d_kv_in,
               sizeof(float) * m->n[b] * c->d_kv_in);
        if (m->vc != m->kvc)
            memcpy(m->vc + (size_t)m->row0[b] * c->d_v_in, v_src + (size_t)b * S * c->d_v_in,
                   sizeof(float) * m->n[b] * c->d_v_in);
    }
    return MHA_OK;
}

static mha_status cache_set_memory_held(mha_cache *c, const mha_layer *L, const float *kv, const float *v_src,
                                        int S, const int *s_len) {
    if (!c || !L || !kv)
        return mha_fail(MHA_E_ARG, "mha_cache_set_memory: NULL %s", !c ? "cache" : !L ? "layer" : "kv");
    if (!c->cross)
        return mha_fail(MHA_E_ARG, "mha_cache_set_memory: the cache is a self-attention cache; expected one made "
                        "by mha_cache_create_cross");
    mha_status s = mha_cache_check_layer(c, L, "mha_cache_set_memory");
    if (s) return s;
    if (!v_src && c->d_v_in != c->d_kv_in)
        return mha_fail(MHA_E_ARG, "mha_cache_set_memory: v_src is NULL but the layer's d_v_in=%d != d_kv_in=%d; "
                        "expected the (B,S,d_v_in) value source", c->d_v_in, c->d_kv_in);
    if (S < 1 || S > c->cap)
        return mha_fail(MHA_E_ARG, "mha_cache_set_memory: S=%d; expected 1..capacity=%d", S, c->cap);
    const int widest = c->d_kv_in > c->d_v_in ? c->d_kv_in : c->d_v_in;
    if (!mha_elements_fit((size_t)c->B, (size_t)S, (size_t)widest, sizeof(float)))
        return mha_fail(MHA_E_ARG, "mha_cache_set_memory: (B=%d, S=%d, %d) floats exceed the address space; "
                        "expected a smaller memory", c->B, S, widest);
    memory_rows m = {0};
    mha_exec ex;
    s = gather(&m, c, kv, v_src ? v_src : kv, S, s_len);
    if (!s) s = mha_exec_resolve(&ex, NULL);
    if (!s) s = project(&ex, &m, L, c);
    if (!s) s = transform(&m, L, c);
    if (!s) s = check_range(&m, c);
    if (!s) { /* the new memory replaces the old whole, in the layer's head order */
        mha_cache_clear(c, -1); /* held by this call: not mha_cache_reset */
        for (int g = 0; g < c->h_kv; g++) c->phys[g] = g;
        memcpy(c->labels_k, L->labels[MHA_BLOCK_K], sizeof(int) * c->h_kv);
        memcpy(c->labels_v, L->labels[MHA_BLOCK_V], sizeof(int) * c->h_kv);
        mha_cache_store(&ex, c, m.k, m.v, NULL, m.row0, 0, m.n);
    }
    memory_free(&m, kv, v_src ? v_src : kv);
    return s;
}

mha_status mha_cache_set_memory(mha_cache *c, const mha_layer *L, const float *kv, const float *v_src, int S,
                                const int *s_len) {
    if (!c || !L) return cache_set_memory_held(c, L, kv, v_src, S, s_len);
    mha_status s = mha_layer_begin(L, 0, "mha_cache_set_memory"); /* the layer read, the cache changed */
    if (s) return s;
    s = mha_cache_begin(c, 1, "mha_cache_set_memory");
    if (!s) s = mha_cache_end(c, 1, cache_set_memory_held(c, L, kv, v_src, S, s_len));
    return mha_layer_end(L, 0, s);
}
