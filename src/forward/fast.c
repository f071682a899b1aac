/* fast.c — the fast forward pass: packed projections (compute/gemm.c),
 * fused flash attention (attention.c), interventions (core/heads.c),
 * captures and the output projection, on the kernels of ex's ISA.
 * forward.c has validated the arguments; this file only computes, in
 * named steps: plan -> project -> check the fp32 range -> attend ->
 * intervene -> project out.
 * Legend: B, T, S, S_tot = S + extra keys, S_pad = S_tot rounded up to 16,
 * h, h_kv, d_k, d_v, ldv = d_v rounded up to 16, d_model, d_kv_in. */
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "compute/workspace.h"
#include "core/variants.h"
#include "forward/attention.h"
#include "forward/forward.h"

/* Q, K^T, V and Z of one call, in one block of the layer's workspace. */
typedef struct {
    const mha_config *c;
    int B, T, S, S_tot, S_pad, ldv;
    size_t rows;      /* B*T                                   */
    float scale;
    float *block;     /* the workspace block (NULL: none taken) */
    float *z;         /* (B,T,h*d_v), cap->z when captured     */
    float *q;         /* (B,h,T,d_k)                           */
    float *kt;        /* (B,h_kv,S_pad/16,d_k,16)              */
    float *v;         /* (B,h_kv,S_pad,ldv)                    */
} fast_plan;

// --- plan: sizes and the workspace block
static mha_status plan(fast_plan *p, const mha_layer *L, const mha_capture *cap, int B, int T, int S,
                       const mha_options *opt) {
    const mha_config *c = &L->cfg;
    const int h = c->n_heads, h_kv = c->n_kv_heads, d_k = c->d_k, d_v = c->d_v;
    memset(p, 0, sizeof *p);
    p->c = c, p->B = B, p->T = T, p->S = S, p->rows = (size_t)B * T;
    p->S_tot = mha_total_keys(c, S), p->S_pad = (int)mha_round_up((size_t)p->S_tot, 16);
    p->ldv = (int)mha_round_up((size_t)d_v, 16);
    p->scale = opt->scale != 0.0f ? opt->scale : (float)(1.0 / sqrt((double)d_k));
    if (p->rows > (size_t)INT_MAX / 2 || (size_t)B * p->S_pad > (size_t)INT_MAX / 2)
        return mha_fail(MHA_E_UNSUPPORTED, "fast path: B*T=%zu or B*S=%zu rows exceed its int indexing",
                        p->rows, (size_t)B * S);
    const size_t nz = cap && cap->z ? 0 : mha_round_up(p->rows * h * d_v, 16);
    const size_t nq = mha_round_up(p->rows * h * d_k, 16);
    const size_t nk = mha_round_up((size_t)B * h_kv * p->S_pad * d_k, 16);
    const size_t nv = (size_t)B * h_kv * p->S_pad * p->ldv;
    if (!(p->block = mha_workspace_take(L->ws, nz + nq + nk + nv)))
        return mha_fail(MHA_E_NOMEM, "fast path: no memory for Q, K, V, Z (B=%d T=%d S=%d)", B, T, S);
    p->z = nz ? p->block : cap->z;
    p->q = p->block + nz, p->kt = p->q + nq, p->v = p->kt + nk;
    return MHA_OK;
}

/* The projections write keys 0..S-1 and columns 0..d_v-1; the rest
 * (padding, extra keys) must be zero: the kernels read it. Key S is the
 * learned (bias_k, bias_v) row under add_bias_kv; zero_attn's row stays 0. */
static void fill_padding(const fast_plan *p, const mha_layer *L) {
    const int d_k = p->c->d_k, d_v = p->c->d_v, S = p->S, S_pad = p->S_pad, ldv = p->ldv;
    for (size_t bg = 0; bg < (size_t)p->B * p->c->n_kv_heads; bg++) {
        float *kb = p->kt + bg * S_pad * d_k, *vb = p->v + bg * S_pad * ldv;
        const int g = (int)(bg % p->c->n_kv_heads);
        for (int e = 0; e < d_k; e++)
            for (int j = S; j < S_pad; j++)
                kb[(size_t)(j / 16) * d_k * 16 + (size_t)e * 16 + j % 16] =
                    j == S && p->c->add_bias_kv ? L->bias_k[(size_t)g * d_k + e] : 0.0f;
        for (int j = 0; j < S_pad; j++)
            for (int e = j < S ? d_v : 0; e < ldv; e++)
                vb[(size_t)j * ldv + e] = j == S && p->c->add_bias_kv && e < d_v ? L->bias_v[(size_t)g * d_v + e] : 0.0f;
    }
}

// --- project: Q = X W_Q + b_Q, K/V = Xkv W + b in attention's layouts
static mha_status project(const fast_plan *p, const mha_layer *L, const float *x, const float *k_src,
                          const float *v_src, int bf16, const mha_kernels *kern, int nt) {
    const mha_config *c = p->c;
    const struct mha_fast_state *f = L->fast;
    const int B = p->B, T = p->T, S = p->S, D = c->d_model, din = c->d_kv_in, dvin = c->d_v_in;
    const int self = k_src == x && v_src == x, shared_kv = k_src == v_src;
    const mha_dst dst[3] = {
        {MHA_DST_HEADS, p->q, (size_t)c->d_k, c->d_k, c->n_heads, T, (size_t)T * c->d_k},
        {MHA_DST_HEADS_T, p->kt, 0, c->d_k, c->n_kv_heads, S, (size_t)p->S_pad * c->d_k},
        {MHA_DST_HEADS, p->v, (size_t)p->ldv, c->d_v, c->n_kv_heads, S, (size_t)p->S_pad * p->ldv},
    };
    /* Q (and K, V when they read x too) from x; then K and V from their sources */
    const mha_packed *pq = f->fused ? &f->qkv : &f->q;
    mha_gemm_args g = {dst, x, (size_t)D, (int)p->rows, pq, 0, f->fused && self ? 3 : 1, 0, D, 1, bf16};
    mha_status s = mha_gemm(&g, kern, nt);
    if (s || (f->fused && self)) return s;
    const mha_packed *pk = f->fused ? &f->qkv : &f->kv;
    const int k_sec = f->fused ? 1 : 0, kin = f->fused ? D : din;
    const int v_with_k = shared_kv && !f->split_v;
    g = (mha_gemm_args){dst + 1, k_src, (size_t)kin, B * S, pk, k_sec, k_sec + (v_with_k ? 2 : 1), 0, kin, 1, bf16};
    if ((s = mha_gemm(&g, kern, nt)) || v_with_k) return s;
    if (f->split_v) g = (mha_gemm_args){dst + 2, v_src, (size_t)dvin, B * S, &f->v, 0, 1, 0, dvin, 1, bf16};
    else g = (mha_gemm_args){dst + 2, v_src, (size_t)kin, B * S, pk, k_sec + 1, k_sec + 2, 0, kin, 1, bf16};
    return mha_gemm(&g, kern, nt);
}

// --- clip_qkv: Q, K, V clamped to [-c, c], padding included (zeros stay
// zero: clip_qkv has no extra keys); nothing at all when clip_qkv is 0
static void clip_qkv(const fast_plan *p, int nt) {
    const mha_config *c = p->c;
    if (c->clip_qkv == 0.0f) return;
    const size_t kv = (size_t)p->B * c->n_kv_heads * p->S_pad;
    mha_clip(p->q, p->rows * c->n_heads * c->d_k, c->clip_qkv, nt);
    mha_clip(p->kt, kv * c->d_k, c->clip_qkv, nt);
    mha_clip(p->v, kv * p->ldv, c->clip_qkv, nt);
}

/* qk_norm_whole (OLMo 2): st (B*T, 2) for q (B,h,T,d_k) and (B*S, 2) for
 * the keys in (S_pad/16, d_k, 16) panels per (b, kv head): each token's
 * mha_qk_norm_stats over all its heads, summed in double in a fixed order. */
static double *whole_norm_stats(const fast_plan *p) {
    const mha_config *c = p->c;
    const int B = p->B, T = p->T, S = p->S, h = c->n_heads, h_kv = c->n_kv_heads, d_k = c->d_k;
    double *st = malloc(sizeof(double) * 2 * (size_t)B * (T + S));
    for (long row = 0; st && row < (long)B * (T + S); row++) {
        const int key = row >= (long)B * T;
        const long br = key ? row - (long)B * T : row;
        const int n = key ? S : T, b = (int)(br / n), t = (int)(br % n), heads = key ? h_kv : h;
        double sum = 0.0, sq = 0.0;
        for (int r = 0; r < heads; r++)
            for (int e = 0; e < d_k; e++) {
                const double x = key ? p->kt[((size_t)b * h_kv + r) * p->S_pad * d_k + (size_t)(t / 16) * d_k * 16 +
                                             (size_t)e * 16 + t % 16]
                                     : p->q[(((size_t)b * h + r) * T + t) * d_k + e];
                sum += x, sq += x * x;
            }
        mha_qk_norm_stats(st + 2 * row, c, sum, sq, heads * d_k);
    }
    return st;
}

// --- variants on q and k: QK-norm, then RoPE from a table of the call's positions
static mha_status transform_qk(const fast_plan *p, const mha_layer *L, const mha_options *opt, int keys_are_x,
                               int nt) {
    const mha_config *c = p->c;
    const int B = p->B, T = p->T, S = p->S, h = c->n_heads, h_kv = c->n_kv_heads, d_k = c->d_k;
    const int rope = c->rope.pairing != MHA_ROPE_NONE, norm = c->qk_norm != MHA_QK_NORM_NONE;
    if (!rope && !norm && c->temperature_floor == 0) return MHA_OK;
    mha_rope_rows rr; /* the table and each query's and key's row in it */
    float *temp = NULL; /* (B*T) the queries' temperatures, or NULL */
    mha_status s = mha_rope_rows_make(&rr, c, opt, keys_are_x, B, T, S, "fast path");
    if (!s && (s = mha_query_temperatures(&temp, c, opt, B, T, "fast path"))) mha_rope_rows_free(&rr);
    if (s) return s;
    double *st = c->qk_norm_whole ? whole_norm_stats(p) : NULL; /* (B*(T+S), 2) */
    if (c->qk_norm_whole && !st) {
        mha_rope_rows_free(&rr), free(temp);
        return mha_fail(MHA_E_NOMEM, "fast path: no memory for the q/k norm statistics");
    }
    const long nq = (long)B * h, nk = (long)B * h_kv;
#pragma omp parallel for schedule(static) num_threads(nt)
    for (long u = 0; u < nq + nk; u++) {
        const int key = u >= nq;
        const long bh = key ? u - nq : u;
        const int b = (int)(bh / (key ? h_kv : h)), head = (int)(bh % (key ? h_kv : h));
        const float *nw = !norm ? NULL : (key ? L->k_norm : L->q_norm) + (c->qk_norm_per_head ? (size_t)head * d_k : 0);
        if (!key) { /* (B,h,T,d_k): contiguous rows */
            mha_head_rows hr = {p->q + (size_t)bh * T * d_k, (size_t)d_k, 1};
            mha_qk_transform(c, hr, T, nw, st ? st + 2 * (size_t)b * T : NULL, rr.tab, rr.n,
                             rr.qrow ? rr.qrow + (size_t)b * T : NULL, temp ? temp + (size_t)b * T : NULL);
            continue;
        }
        float *kb = p->kt + (size_t)bh * p->S_pad * d_k; /* (S_pad/16, d_k, 16) panels */
        for (int j0 = 0; j0 < S; j0 += 16) {
            mha_head_rows hr = {kb + (size_t)(j0 / 16) * d_k * 16, 1, 16};
            mha_qk_transform(c, hr, S - j0 < 16 ? S - j0 : 16, nw,
                             st ? st + 2 * ((size_t)B * T + (size_t)b * S + j0) : NULL, rr.tab, rr.n,
                             rr.krow ? rr.krow + (size_t)b * S + j0 : NULL, NULL);
        }
    }
    mha_rope_rows_free(&rr), free(st), free(temp);
    return MHA_OK;
}

// --- check the fp32 range: |scale q.k| <= MHA_FAST_SCORE_LIMIT, finite V
static mha_status check_range(const fast_plan *p, const mha_kernels *kern, int nt) {
    const mha_config *c = p->c;
    const int h = c->n_heads, h_kv = c->n_kv_heads, d_k = c->d_k, T = p->T;
    const long n_bg = (long)p->B * h_kv, n_br = (long)p->B * h;
    double *kmax = malloc(sizeof(double) * (size_t)(n_bg + 2 * n_br)), *qmax = kmax + n_bg, *qarg = qmax + n_br;
    if (!kmax) return mha_fail(MHA_E_NOMEM, "fast path: no memory for the range check");
    const float v_limit = FLT_MAX / (float)p->S_tot; /* sum of S_tot weighted values */
    int v_ok = 1;
#pragma omp parallel for schedule(static) num_threads(nt) reduction(&& : v_ok)
    for (long bg = 0; bg < n_bg; bg++) { /* the largest |k| of the block (S_pad/16, d_k, 16); V finite */
        kmax[bg] = sqrt(kern->key_norm_max(p->kt + bg * p->S_pad * d_k, p->S_pad / 16, d_k));
        v_ok = kern->all_within(p->v + bg * p->S_pad * p->ldv, (size_t)p->S_pad * p->ldv, v_limit) && v_ok;
    }
#pragma omp parallel for schedule(static) num_threads(nt)
    for (long br = 0; br < n_br; br++) {
        qmax[br] = 0.0, qarg[br] = 0;
        for (int t = 0; t < T; t++) {
            const float *qr = p->q + ((size_t)br * T + t) * d_k;
            double sq = 0.0;
#pragma omp simd reduction(+ : sq) /* -O2 leaves the reduction scalar: 2-3% of a P1 forward */
            for (int e = 0; e < d_k; e++) sq += (double)qr[e] * qr[e];
            if (!(sq <= qmax[br])) qmax[br] = sq, qarg[br] = t;
            if (isnan(sq)) break;
        }
    }
    mha_status s = v_ok ? MHA_OK : mha_fail(MHA_E_NONFINITE, "fast path: V holds values beyond the fp32 "
                                             "range its weighted sums need; %s", MHA_FAST_RANGE_HINT);
    for (long br = 0; !s && br < n_br; br++) {
        const double bound = sqrt(qmax[br]) * kmax[br / h * h_kv + mha_kv_head(c, (int)(br % h))] * fabs(p->scale);
        if (!(bound <= MHA_FAST_SCORE_LIMIT))
            s = mha_fail(MHA_E_NONFINITE, "fast path: scores of batch %ld head %ld may reach %.3g at query %d "
                         "(|q| %.3g, largest |k| %.3g, scale %g), beyond the %g its fp32 softmax keeps "
                         "accurate; %s", br / h, br % h, bound, (int)qarg[br], sqrt(qmax[br]),
                         kmax[br / h * h_kv + mha_kv_head(c, (int)(br % h))], (double)p->scale,
                         MHA_FAST_SCORE_LIMIT, MHA_FAST_RANGE_HINT);
    }
    free(kmax);
    return s;
}

/* MHA_E_NONFINITE naming the first element of a (rows, w) output that is
 * Inf, or NaN outside the NaN mode's fully masked rows. */
static mha_status check_output(const float *a, size_t n, const char *name, const mha_options *opt, int nt) {
    const unsigned allow = opt->masked_row == MHA_MASKED_ROW_NAN ? MHA_SCAN_ALLOW_NAN : 0;
    size_t i = n; /* the first bad element of all: the smallest of each slice's first */
    nt = n >= ((size_t)1 << 16) ? nt : 1; /* a scan of y costs ~1.5% of a P1 forward on one thread */
#pragma omp parallel for schedule(static) num_threads(nt) reduction(min : i)
    for (int t = 0; t < nt; t++) {
        const size_t lo = n * t / nt, hi = n * (t + 1) / nt, at = mha_first_nonfinite(a + lo, hi - lo, allow);
        if (at < hi - lo) i = lo + at;
    }
    if (i < n)
        return mha_fail(MHA_E_NONFINITE, "fast path: %s[%zu] = %g overflowed its fp32 accumulation; %s", name,
                        i, (double)a[i], MHA_FAST_RANGE_HINT);
    return MHA_OK;
}

mha_status mha_fast_gate_logits(float *g, const mha_layer *L, const float *x, size_t rows, const mha_kernels *kern,
                                int nt) {
    const mha_config *c = &L->cfg;
    const mha_dst out = {MHA_DST_ROWS, g, (size_t)c->n_heads * c->d_v, 0, 0, 0, 0};
    const mha_gemm_args a = {&out, x, (size_t)c->d_model, (int)rows, mha_fast_packed_g(L), 0, 1, 0, c->d_model, 1, 0};
    return mha_gemm(&a, kern, nt);
}

// --- gated attention: Z *= sigmoid(X W_G + b_G), element by element
static mha_status gate(const fast_plan *p, const mha_layer *L, const float *x, const mha_kernels *kern, int nt) {
    const size_t rows = p->rows, zw = (size_t)p->c->n_heads * p->c->d_v;
    float *g = mha_alloc_large(rows * zw * sizeof(float)); /* (B,T,h*d_v) */
    if (!g) return mha_fail(MHA_E_NOMEM, "fast path: no memory for the output gate (B*T=%zu rows)", rows);
    mha_status s = mha_fast_gate_logits(g, L, x, rows, kern, nt);
    if (!s) mha_gate_apply(p->z, g, rows * zw, nt);
    free(g);
    return s;
}

// --- project out: the contributions Z^(r) W_O[r] (captured) and Y = Z W_O + b_O
static mha_status project_out(const fast_plan *p, const mha_layer *L, float *y, const mha_capture *cap,
                              const mha_options *opt, const mha_kernels *kern, int nt) {
    const mha_config *c = p->c;
    const int h = c->n_heads, d_v = c->d_v, D = c->d_model;
    const size_t rows = p->rows, zw = (size_t)h * d_v;
    mha_dst out = {MHA_DST_ROWS, NULL, (size_t)D, 0, 0, 0, 0};
    mha_gemm_args g = {&out, NULL, zw, (int)rows, &L->fast->o, 0, 1, 0, d_v, 0, opt->bf16_matmul};
    mha_status s = MHA_OK;
    for (int r = 0; cap && cap->contributions && r < h && !s; r++) {
        out.base = cap->contributions + (size_t)r * rows * D;
        g.a = p->z + (size_t)r * d_v, g.k0 = r * d_v;
        if (!(s = mha_gemm(&g, kern, nt)))
            s = check_output(out.base, rows * D, "contributions", opt, nt);
    }
    if (s) return s;
    out.base = y;
    g = (mha_gemm_args){&out, p->z, zw, (int)rows, &L->fast->o, 0, 1, 0, (int)zw, 1, opt->bf16_matmul};
    if ((s = mha_gemm(&g, kern, nt))) return s;
    return check_output(y, rows * D, "y", opt, nt);
}

mha_status mha_forward_fast(const mha_exec *ex, const mha_layer *L, float *y, const mha_capture *cap,
                            const float *x, const float *k_src, const float *v_src, int B, int T,
                            int S, const mha_options *opt) {
    if (!L->fast) return mha_fail(MHA_E_UNSUPPORTED, "fast path: the layer's packed weights are missing");
    const mha_kernels *kern = mha_exec_prefill(ex);
    const int nt = ex->n_threads;
    fast_plan p;
    mha_status s = plan(&p, L, cap, B, T, S, opt);
    if (s) goto done;
    fill_padding(&p, L);
    if ((s = project(&p, L, x, k_src, v_src, opt->bf16_matmul, kern, nt))) goto done;
    clip_qkv(&p, nt);
    if ((s = transform_qk(&p, L, opt, k_src == x, nt)) || (s = check_range(&p, kern, nt))) goto done;

    // --- attend: Z^(r) = softmax(scale Q^(r) K^(g)^T + mask) V^(g), into Z
    int alibi_far = 0; /* ALiBi's term is outside check_range's bound: each row's max is checked */
    const mha_attn_args att = {
        p.c, opt, p.q, p.kt, p.v, p.z, cap ? cap->probs : NULL, B, T, S, p.S_tot, p.S_pad, p.ldv, p.scale, 1,
        L->alibi_slopes, L->sinks, k_src == x, &alibi_far,
    };
    if ((s = mha_attention(&att, kern, nt))) goto done;
    if (alibi_far) {
        s = mha_fail(MHA_E_NONFINITE, "fast path: with ALiBi a query far from every key it may attend "
                     "(positions, key_positions) has scores beyond the %g its fp32 softmax keeps accurate; %s",
                     MHA_FAST_SCORE_LIMIT, MHA_FAST_RANGE_HINT);
        goto done;
    }

    if (p.c->output_gate && (s = gate(&p, L, x, kern, nt))) goto done;

    // --- intervene on Z^(r), before W_O reads them
    for (int r = 0; opt->interventions && r < p.c->n_heads && !s; r++)
        s = mha_head_intervene(p.z, &opt->interventions[r], r, p.c->n_heads, (int)p.rows, p.c->d_v);
    if (!s) s = project_out(&p, L, y, cap, opt, kern, nt);
done:
    mha_workspace_give(L->ws, p.block);
    return s;
}
