/* forward_fast.c — the fast forward pass: packed projections (gemm.c),
 * fused flash attention (attention.c), interventions (heads.c), captures
 * and the output projection, on the kernels dispatch.c picks. forward.c
 * has validated the arguments; this file only computes.
 * Legend: B, T, S, S_tot = S + extra keys, S_pad = S_tot rounded up to 16,
 * h, h_kv, d_k, d_v, ldv = d_v rounded up to 16, d_model, d_kv_in. */
#include <limits.h>
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "forward/attention.h"
#include "forward/forward.h"

static size_t round_up(size_t n, size_t m) { return (n + m - 1) / m * m; }

/* ------------------------------------------------------------ workspace */

/* Z, Q, K^T and V live in one block that is kept for the next call (one
 * block per process, any layer): freeing and re-allocating tens of MiB per
 * call costs a page fault per 4 KiB, 5% of a prefill on this machine.
 * Blocks above MHA_WS_KEEP_MAX are returned to the system instead. */
#define MHA_WS_KEEP_MAX ((size_t)256 << 20)

typedef struct {
    size_t floats; /* capacity after the 64-byte header */
} ws_header;

static _Atomic(ws_header *) ws_kept;

static float *ws_data(ws_header *w) { return (float *)((char *)w + 64); }

static ws_header *ws_take(size_t floats) {
    ws_header *w = atomic_exchange(&ws_kept, NULL);
    if (w && w->floats >= floats) return w;
    free(w);
    w = aligned_alloc(64, 64 + round_up(floats * sizeof(float), 64));
    if (w) w->floats = floats;
    return w;
}

static void ws_give(ws_header *w) {
    if (!w) return;
    if (w->floats * sizeof(float) > MHA_WS_KEEP_MAX) {
        free(w);
        return;
    }
    free(atomic_exchange(&ws_kept, w)); /* another thread's block, if any */
}

mha_status mha_forward_fast(const mha_layer *L, float *y, const mha_capture *cap, const float *x,
                            const float *k_src, const float *v_src, int B, int T, int S,
                            const mha_options *opt) {
    const mha_config *c = &L->cfg;
    const struct mha_fast_state *f = L->fast;
    if (!f) return mha_fail(MHA_E_UNSUPPORTED, "fast path: the layer's packed weights are missing");
    const mha_kernels *kern = mha_kernels_get();
    const int nt = mha_get_num_threads();
    const int h = c->n_heads, h_kv = c->n_kv_heads, d_k = c->d_k, d_v = c->d_v, D = c->d_model;
    const int S_tot = mha_total_keys(c, S), S_pad = (int)round_up((size_t)S_tot, 16);
    const int ldv = (int)round_up((size_t)d_v, 16);
    const size_t rows = (size_t)B * T;
    const int self = k_src == x && v_src == x, shared_kv = k_src == v_src;
    if (rows > (size_t)INT_MAX / 2 || (size_t)B * S_pad > (size_t)INT_MAX / 2)
        return mha_fail(MHA_E_UNSUPPORTED, "fast path: B*T=%zu or B*S=%zu rows exceed its int indexing",
                        rows, (size_t)B * S);

    const size_t nz = cap && cap->z ? 0 : round_up(rows * h * d_v, 16);
    const size_t nq = round_up(rows * h * d_k, 16), nk = round_up((size_t)B * h_kv * S_pad * d_k, 16);
    const size_t nv = (size_t)B * h_kv * S_pad * ldv;
    ws_header *work = ws_take(nz + nq + nk + nv);
    mha_status s = MHA_OK;
    if (!work) return mha_fail(MHA_E_NOMEM, "fast path: no memory for Q, K, V, Z (B=%d T=%d S=%d)", B, T, S);
    float *z = nz ? ws_data(work) : cap->z;  // (B,T,h*d_v)
    float *q = ws_data(work) + nz;           // (B,h,T,d_k)
    float *kt = q + nq;                      // (B,h_kv,S_pad/16,d_k,16)
    float *v = kt + nk;                      // (B,h_kv,S_pad,ldv)

    /* the projections write keys 0..S-1 and columns 0..d_v-1; the rest
     * (padding, extra keys) must be zero: the kernels read it */
    for (size_t bg = 0; bg < (size_t)B * h_kv; bg++) {
        float *kb = kt + bg * S_pad * d_k, *vb = v + bg * S_pad * ldv;
        for (int e = 0; e < d_k; e++)
            for (int j = S; j < S_pad; j++) kb[(size_t)(j / 16) * d_k * 16 + (size_t)e * 16 + j % 16] = 0.0f;
        for (int j = 0; j < S_pad; j++)
            for (int e = j < S ? d_v : 0; e < ldv; e++) vb[(size_t)j * ldv + e] = 0.0f;
    }

    // --- projections: Q = X W_Q + b_Q, K/V = Xkv W + b in attention's layouts
    const mha_dst dst[3] = {
        {MHA_DST_HEADS, q, (size_t)d_k, d_k, h, T, (size_t)T * d_k}, /* (B,h,T,d_k) */
        {MHA_DST_HEADS_T, kt, 0, d_k, h_kv, S, (size_t)S_pad * d_k},
        {MHA_DST_HEADS, v, (size_t)ldv, d_v, h_kv, S, (size_t)S_pad * ldv},
    };
    const int din = c->d_kv_in, dvin = c->d_v_in;
    if (f->fused && self) {
        s = mha_gemm(dst, x, D, (int)rows, &f->qkv, 0, 3, 0, D, 1, kern, nt);
    } else if (f->fused) {
        s = mha_gemm(dst, x, D, (int)rows, &f->qkv, 0, 1, 0, D, 1, kern, nt);
        if (!s) s = mha_gemm(dst + 1, k_src, D, B * S, &f->qkv, 1, shared_kv ? 3 : 2, 0, D, 1, kern, nt);
        if (!s && !shared_kv) s = mha_gemm(dst + 2, v_src, D, B * S, &f->qkv, 2, 3, 0, D, 1, kern, nt);
    } else {
        s = mha_gemm(dst, x, D, (int)rows, &f->q, 0, 1, 0, D, 1, kern, nt);
        if (!s) s = mha_gemm(dst + 1, k_src, din, B * S, &f->kv, 0, shared_kv ? 2 : 1, 0, din, 1, kern, nt);
        if (!s && !shared_kv)
            s = f->split_v ? mha_gemm(dst + 2, v_src, dvin, B * S, &f->v, 0, 1, 0, dvin, 1, kern, nt)
                           : mha_gemm(dst + 2, v_src, din, B * S, &f->kv, 1, 2, 0, din, 1, kern, nt);
    }
    if (s) goto done;
    /* extra keys: key S is the learned (bias_k, bias_v) row; zero_attn's
     * row after it stays zero */
    for (int b = 0; c->add_bias_kv && b < B; b++)
        for (int g = 0; g < h_kv; g++) {
            float *kb = kt + ((size_t)b * h_kv + g) * S_pad * d_k + (size_t)(S / 16) * d_k * 16 + S % 16;
            float *vb = v + (((size_t)b * h_kv + g) * S_pad + S) * ldv;
            for (int e = 0; e < d_k; e++) kb[(size_t)e * 16] = L->bias_k[(size_t)g * d_k + e];
            for (int e = 0; e < d_v; e++) vb[e] = L->bias_v[(size_t)g * d_v + e];
        }

    // --- attention: Z^(r) = softmax(scale Q^(r) K^(g)^T + mask) V^(g), into Z
    const mha_attn_args att = {
        c, opt, q, kt, v, z, cap ? cap->probs : NULL, B, T, S, S_tot, S_pad, ldv,
        opt->scale != 0.0f ? opt->scale : (float)(1.0 / sqrt((double)d_k)), 1,
    };
    s = mha_attention(&att, kern, nt);
    if (s) goto done;

    // --- interventions on Z^(r), before W_O reads them
    for (int r = 0; opt->interventions && r < h; r++)
        if ((s = mha_head_intervene(z, &opt->interventions[r], r, h, (int)rows, d_v))) goto done;

    // --- captures: Z (already in place when cap->z) and Z^(r) W_O[r]
    mha_dst out = {MHA_DST_ROWS, NULL, (size_t)D, 0, 0, 0, 0};
    for (int r = 0; cap && cap->contributions && r < h; r++) {
        out.base = cap->contributions + (size_t)r * rows * D;
        s = mha_gemm(&out, z + (size_t)r * d_v, (size_t)h * d_v, (int)rows, &f->o, 0, 1, r * d_v,
                     d_v, 0, kern, nt);
        if (s) goto done;
    }

    // --- output projection: Y = Z W_O + b_O
    out.base = y;
    s = mha_gemm(&out, z, (size_t)h * d_v, (int)rows, &f->o, 0, 1, 0, h * d_v, 1, kern, nt);

done:
    ws_give(work);
    return s;
}

/* ---- accessors for the KV-cache prefill (issue 5, forward_cached.c) ----
 * Read-only views of the packings above, so the cache projects many new
 * rows with the same packed weights instead of a second copy. */
