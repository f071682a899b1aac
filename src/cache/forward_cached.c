/* forward_cached.c — mha_forward_cached: one prefill or decode step of a
 * causal self-attention layer over a KV cache.
 *
 *   pack the new rows of x        xc (N, d_model), N = sum_b n[b]
 *   project                       Q = xc W_Q + b_Q, K = .. W_K, V = .. W_V
 *                                 (decode_gemm.c for one row, the fast
 *                                 path's packed mha_gemm for more)
 *   append K, V; attend           Z (N, h*d_v)   (decode.c, by pieces when
 *                                 a ring must not overwrite needed keys)
 *   intervene                     Z^(r) per opt->interventions
 *   project out                   Y = Z W_O + b_O, unpacked to (B,T,d_model)
 *
 * Legend: B sequences, T rows per sequence in x/y, N packed new rows,
 * h heads, h_kv kv heads, d_k, d_v, d_model.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cache/cache_internal.h"

/* ------------------------------------------------------- validation */

static mha_status check_cache_layer(const mha_cache *c, const mha_layer *L) {
    const mha_config *f = &L->cfg;
    if (c->d_model != f->d_model || c->h != f->n_heads || c->h_kv != f->n_kv_heads ||
        c->d_k != f->d_k || c->d_v != f->d_v || f->d_kv_in != f->d_model || f->d_v_in != f->d_model)
        return mha_fail(MHA_E_SHAPE,
                        "mha_forward_cached: cache made for d_model=%d h=%d h_kv=%d d_k=%d d_v=%d, "
                        "layer has d_model=%d h=%d h_kv=%d d_k=%d d_v=%d d_kv_in=%d d_v_in=%d; expected "
                        "the same shape (and d_kv_in = d_v_in = d_model)", c->d_model, c->h, c->h_kv,
                        c->d_k, c->d_v, f->d_model, f->n_heads, f->n_kv_heads, f->d_k, f->d_v,
                        f->d_kv_in, f->d_v_in);
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

static mha_status check_options(const mha_options *o, const mha_cache *c, int T) {
    if (!isfinite(o->scale))
        return mha_fail(MHA_E_NONFINITE, "options.scale=%g; expected finite (0 = 1/sqrt(d_k))", (double)o->scale);
    if (o->masked_row != MHA_MASKED_ROW_ZERO && o->masked_row != MHA_MASKED_ROW_NAN)
        return mha_fail(MHA_E_ARG, "options.masked_row=%d; expected MHA_MASKED_ROW_ZERO or _NAN", (int)o->masked_row);
    if (o->keep_mask.data || o->additive_mask.data || o->key_keep || o->key_additive)
        return mha_fail(MHA_E_UNSUPPORTED,
                        "mha_forward_cached: %s is not supported with a KV cache (attention is causal "
                        "over the cached tokens; use mha_forward for arbitrary masks)",
                        o->keep_mask.data ? "keep_mask" : o->additive_mask.data ? "additive_mask"
                        : o->key_keep ? "key_keep" : "key_additive");
    /* REPLACE values are (B,T,d_v), as in mha_forward */
    return mha_check_interventions(o->interventions, c->h, (size_t)c->B * T, c->d_v);
}

/* ------------------------------------------------------- the steps */

/* q (N, h*d_k), k (N, h_kv*d_k), v (N, h_kv*d_v) = x (N, d_model) W + b.
 * Many new rows (N >= MHA_PREFILL_MIN_ROWS, cache_internal.h) run on the
 * fast path's GEMM with the layer's packed weights, one row on
 * decode_gemm.c; the same split for W_O below. */
static mha_status project_qkv(float *q, float *k, float *v, const mha_layer *L, const mha_cache *c,
                              const float *x, int N) {
    const int wq = c->h * c->d_k, wk = c->h_kv * c->d_k, wv = c->h_kv * c->d_v;
    const mha_packed *p = N >= MHA_PREFILL_MIN_ROWS ? mha_fast_packed_qkv(L) : NULL;
    if (p) {
        const mha_dst dst[3] = {{MHA_DST_ROWS, q, (size_t)wq, 0, 0, 0, 0},
                                {MHA_DST_ROWS, k, (size_t)wk, 0, 0, 0, 0},
                                {MHA_DST_ROWS, v, (size_t)wv, 0, 0, 0, 0}};
        int nt = mha_decode_threads_for((double)N * c->d_model * (wq + wk + wv));
        return mha_gemm(dst, x, (size_t)c->d_model, N, p, 0, 3, 0, c->d_model, 1, mha_kernels_get(), nt);
    }
    mha_decode_gemm_job qkv[3] = {{q, L->w_q, L->b_q, wq}, {k, L->w_k, L->b_k, wk}, {v, L->w_v, L->b_v, wv}};
    return mha_decode_gemm_many(qkv, 3, x, N, c->d_model);
}

/* y (N, d_model) = z (N, h*d_v) W_O + b_O; cc (h, N, d_model), when not
 * NULL, = Z^(r) W_O[r] (no bias), the per-head contributions. */
static mha_status project_out(float *y, float *cc, const mha_layer *L, const mha_cache *c,
                              const float *z, int N) {
    const int wz = c->h * c->d_v, D = c->d_model;
    const mha_packed *p = N >= MHA_PREFILL_MIN_ROWS ? mha_fast_packed_o(L) : NULL;
    if (!p) {
        mha_status s = mha_decode_gemm(y, z, L->w_o, L->b_o, N, wz, D);
        return !s && cc ? mha_head_contributions(cc, z, L->w_o, c->h, N, c->d_v, D) : s;
    }
    const mha_kernels *kern = mha_kernels_get();
    int nt = mha_decode_threads_for((double)N * wz * D);
    mha_dst out = {MHA_DST_ROWS, y, (size_t)D, 0, 0, 0, 0};
    mha_status s = mha_gemm(&out, z, (size_t)wz, N, p, 0, 1, 0, wz, 1, kern, nt);
    for (int r = 0; cc && r < c->h && !s; r++) { /* rows r*d_v .. of W_O, no bias */
        out.base = cc + (size_t)r * N * D;
        s = mha_gemm(&out, z + (size_t)r * c->d_v, (size_t)wz, N, p, 0, 1, r * c->d_v, c->d_v, 0, kern, nt);
    }
    return s;
}

/* Probabilities of the rows just attended (piece rows t0 .. t0+np[b]-1),
 * from the final max and sum of each row: column s = cache slot s. */
static mha_status capture_probs(float *probs, const mha_cache *c, const mha_layer *L, const float *q,
                                const float *stats, const int *row0, int t0, const int *np, int T,
                                const mha_decode_opts *o) {
    const mha_decode_kernels *kr = mha_decode_kernels_get();
    int *spos = malloc(sizeof(int) * c->cap); /* (cap) position of each slot */
    if (!spos) return mha_fail(MHA_E_NOMEM, "mha_forward_cached: no memory for probabilities");
    int n_rep = c->h / c->h_kv, width = c->cap + L->cfg.add_bias_kv + L->cfg.add_zero_attn;
    int left = o->left;
    if (c->window && (left < 0 || left > c->window - 1)) left = c->window - 1;
    for (int b = 0; b < c->B; b++) {
        mha_cache_slot_positions(spos, c, b, 0, c->cap);
        for (int i = 0; i < np[b]; i++) {
            int t = t0 + i, p = c->len[b] - np[b] + i;
            int first = left >= 0 && p - left > c->lo[b] ? p - left : c->lo[b];
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
                    if (ps == INT_MIN || ps < first || ps > p) continue;
                    size_t k0 = mha_cache_k_off(c, kv, s);
                    float dot = 0.0f;
                    for (int d = 0; d < c->d_k; d++) {
                        float kd;
                        size_t at = k0 + (size_t)d * MHA_KPANEL;
                        if (c->dtype == MHA_CACHE_F16) kr->from_f16(&kd, (const uint16_t *)c->data + at, 1);
                        else kd = ((const float *)c->data)[at];
                        dot = fmaf(qr[d], kd, dot);
                    }
                    pr[s] = expf(dot * o->scale - M) / Ls;
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

/* Applies opt's interventions to z (N, h*d_v); REPLACE values (B,T,d_v)
 * are packed like z. */
static mha_status intervene(float *z, const mha_options *opt, const mha_cache *c, const int *n,
                            int T, int N) {
    float *packed = NULL;
    mha_status s = MHA_OK;
    for (int r = 0; r < c->h && !s; r++) {
        mha_intervention iv = opt->interventions[r];
        if (iv.op == MHA_HEAD_KEEP) continue;
        if (iv.op == MHA_HEAD_REPLACE) {
            if (!packed && !(packed = malloc(sizeof(float) * (size_t)N * c->d_v)))
                return mha_fail(MHA_E_NOMEM, "mha_forward_cached: no memory for interventions");
            size_t at = 0;
            for (int b = 0; b < c->B; b++)
                for (int t = 0; t < n[b]; t++, at++)
                    memcpy(packed + at * c->d_v, iv.value + ((size_t)b * T + t) * c->d_v, sizeof(float) * c->d_v);
            iv.value = packed;
        }
        s = mha_head_intervene(z, &iv, r, c->h, N, c->d_v);
    }
    free(packed);
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

mha_status mha_forward_cached(const mha_layer *L, mha_cache *c, float *y, const mha_capture *cap,
                              const float *x, int T, const int *n_new, const mha_options *opt) {
    if (!L || !c || !y || !x)
        return mha_fail(MHA_E_ARG, "mha_forward_cached: NULL %s; expected (B,T,d_model) floats",
                        !L ? "layer" : !c ? "cache" : !y ? "y" : "x");
    if (T < 1) return mha_fail(MHA_E_ARG, "mha_forward_cached: T=%d; expected >= 1", T);
    mha_options defaults = mha_options_default();
    if (!opt) opt = &defaults;
    mha_status s = check_cache_layer(c, L);
    if (!s) s = check_options(opt, c, T);
    if (s) return s;

    int B = c->B, N = 0;
    int *n = malloc(sizeof(int) * 3 * B); /* n, row0 (packed), np (piece) */
    if (!n) return mha_fail(MHA_E_NOMEM, "mha_forward_cached: no memory");
    int *row0 = n + B, *np = n + 2 * B;
    for (int b = 0; b < B && !s; b++) {
        n[b] = n_new ? n_new[b] : T;
        row0[b] = N;
        if (n[b] < 0 || n[b] > T)
            s = mha_fail(MHA_E_ARG, "mha_forward_cached: n_new[%d]=%d; expected 0..T=%d", b, n[b], T);
        else
            s = mha_check_finite(x + (size_t)b * T * c->d_model, (size_t)n[b] * c->d_model, "x");
        N += n[b];
    }
    /* without a window everything must fit; a ring takes pieces */
    if (!s && !c->window) s = mha_cache_check_room(c, n, "mha_forward_cached");
    if (!s) s = check_labels(c, L);
    if (s || N == 0) {
        free(n);
        if (!s) { /* nothing new: outputs are zero rows */
            memset(y, 0, sizeof(float) * (size_t)B * T * c->d_model);
            if (cap && cap->z) memset(cap->z, 0, sizeof(float) * (size_t)B * T * c->h * c->d_v);
            if (cap && cap->contributions)
                memset(cap->contributions, 0, sizeof(float) * (size_t)c->h * B * T * c->d_model);
            if (cap && cap->probs)
                memset(cap->probs, 0, sizeof(float) * (size_t)B * c->h * T *
                                          (size_t)(c->cap + L->cfg.add_bias_kv + L->cfg.add_zero_attn));
        }
        return s;
    }

    const mha_config *f = &L->cfg;
    size_t wq = (size_t)c->h * c->d_k, wk = (size_t)c->h_kv * c->d_k, wv = (size_t)c->h_kv * c->d_v,
           wz = (size_t)c->h * c->d_v;
    int packed = N != B * T;
    float *xc = packed ? malloc(sizeof(float) * (size_t)N * c->d_model) : NULL;
    float *q = malloc(sizeof(float) * N * wq), *k = malloc(sizeof(float) * N * wk);
    float *v = malloc(sizeof(float) * N * wv), *z = malloc(sizeof(float) * N * wz);
    float *yc = packed ? malloc(sizeof(float) * (size_t)N * c->d_model) : y;
    float *stats = cap && cap->probs ? malloc(sizeof(float) * N * c->h * 2) : NULL;
    if ((packed && (!xc || !yc)) || !q || !k || !v || !z || (cap && cap->probs && !stats)) {
        s = mha_fail(MHA_E_NOMEM, "mha_forward_cached: no memory for %d rows", N);
        goto done;
    }
    if (packed)
        for (int b = 0; b < B; b++)
            memcpy(xc + (size_t)row0[b] * c->d_model, x + (size_t)b * T * c->d_model,
                   sizeof(float) * (size_t)n[b] * c->d_model);
    const float *xs = packed ? xc : x;

    // --- project: Q (N, h*d_k), K (N, h_kv*d_k), V (N, h_kv*d_v)
    if ((s = project_qkv(q, k, v, L, c, xs, N))) goto done;

    // --- append and attend, in pieces a ring can hold
    mha_decode_opts o;
    o.scale = opt->scale != 0.0f ? opt->scale : 1.0f / sqrtf((float)c->d_k);
    o.left = opt->window_left;
    o.extra_k = f->add_bias_kv ? L->bias_k : NULL;
    o.extra_v = f->add_bias_kv ? L->bias_v : NULL;
    o.zero_attn = f->add_zero_attn;
    o.nan_rows = opt->masked_row == MHA_MASKED_ROW_NAN;
    int piece = c->window ? c->cap - c->window + 1 : T;
    for (int t0 = 0; t0 < T && !s; t0 += piece) {
        int any = 0;
        for (int b = 0; b < B; b++) {
            np[b] = n[b] - t0 < 0 ? 0 : n[b] - t0 > piece ? piece : n[b] - t0;
            any |= np[b] > 0;
        }
        if (!any) break;
        mha_cache_store(c, k, v, row0, t0, np);
        s = mha_decode_attend(z, stats, c, q, row0, t0, np, &o);
        if (!s && stats) s = capture_probs(cap->probs, c, L, q, stats, row0, t0, np, T, &o);
    }
    if (s) goto done;

    // --- interventions on Z, then Y = Z W_O + b_O
    if (opt->interventions && (s = intervene(z, opt, c, n, T, N))) goto done;
    float *cc = NULL; /* (h, N, d_model) contributions, packed rows */
    if (cap && cap->contributions && !(cc = malloc(sizeof(float) * (size_t)c->h * N * c->d_model))) {
        s = mha_fail(MHA_E_NOMEM, "mha_forward_cached: no memory for contributions");
        goto done;
    }
    s = project_out(yc, cc, L, c, z, N);
    for (int r = 0; cc && r < c->h && !s; r++)
        unpack(cap->contributions + (size_t)r * B * T * c->d_model, cc + (size_t)r * N * c->d_model,
               n, B, T, (size_t)c->d_model);
    free(cc);
    if (s) goto done;
    if (packed) unpack(y, yc, n, B, T, (size_t)c->d_model);
    if (cap && cap->z) unpack(cap->z, z, n, B, T, wz);
    if (cap && cap->probs) { /* rows past n[b]: zero */
        size_t width = (size_t)c->cap + f->add_bias_kv + f->add_zero_attn;
        for (int b = 0; b < B; b++)
            for (int r = 0; r < c->h; r++)
                for (int t = n[b]; t < T; t++)
                    memset(cap->probs + (((size_t)b * c->h + r) * T + t) * width, 0, sizeof(float) * width);
    }
done:
    free(n), free(xc), free(q), free(k), free(v), free(z), free(stats);
    if (packed) free(yc);
    return s;
}
