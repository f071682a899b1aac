/* backward_fast.c — the fast backward (FlashAttention-2's algorithm), fp32:
 * recompute Q, K, V with the layer's packed weights (mha_gemm), recompute
 * Z and one logsumexp per (row, head) with a tiled pass (mha_bwd_saved:
 * the training forward keeps the same in a tape, tape.c), then walk the
 * forward back: W_O, interventions, attention (backward_attention.c),
 * projections (backward_gemm.c's strided products). Everything the
 * reference backward does, without a (T,S) buffer; each output element is
 * reduced by one thread in a fixed order.
 * The variants: QK-norm and RoPE on the recomputed Q, K and their backward
 * on dQ, dK (backward_qk.c); ALiBi, softcap and sinks in the attention's
 * tiles (backward_attention.c), dl/dsink from each row's sink share.
 * Unsupported (MHA_E_UNSUPPORTED, AUTO then runs the reference): a layer
 * without packed weights, sizes beyond int indexing, scores beyond
 * MHA_FAST_SCORE_LIMIT (the forward's fp32 range rule), and
 * MHA_MASKED_ROW_NAN with a fully masked row (the reference spreads its
 * NaN to every key).
 * Legend: B, T, S, Sx = S + extra keys, h, h_kv, d_k, d_v, D = d_model,
 * Dk = d_kv_in, Dv = d_v_in; qw = h*d_k, kw = h_kv*d_k, vw = h_kv*d_v,
 * zw = h*d_v. */
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "compute/gemm.h"
#include "core/variants.h"
#include "forward/backward.h"
#include "forward/backward_fast.h"
#include "forward/forward.h"

/* Q (B,T,qw), K (B,Sx,kw), V (B,Sx,vw) from the packed weights, as the
 * fast forward projects them; keys S.. of each batch are left alone. */
static mha_status project(float *q, float *k, float *v, const mha_layer *L, const float *x,
                          const float *k_src, const float *v_src, int B, int T, int S, int Sx,
                          const mha_kernels *kern, int nt) {
    const mha_config *c = &L->cfg;
    const struct mha_fast_state *f = L->fast;
    const size_t kw = (size_t)c->n_kv_heads * c->d_k, vw = (size_t)c->n_kv_heads * c->d_v;
    const int D = c->d_model, Dk = c->d_kv_in, Dv = c->d_v_in, rows = B * T, krows = B * S;
    /* one "head" as wide as the section, (S rows, then a gap) per batch */
    const mha_dst dst[3] = {
        {MHA_DST_ROWS, q, (size_t)c->n_heads * c->d_k, 0, 0, 0, 0},
        {MHA_DST_HEADS, k, kw, (int)kw, 1, S, (size_t)Sx * kw},
        {MHA_DST_HEADS, v, vw, (int)vw, 1, S, (size_t)Sx * vw},
    };
    const int self = k_src == x && v_src == x, shared_kv = k_src == v_src;
    /* Q (and K, V when they read x too) from x; then K and V from their sources */
    const mha_packed *pq = f->fused ? &f->qkv : &f->q;
    mha_gemm_args a = {dst, x, (size_t)D, rows, pq, 0, f->fused && self ? 3 : 1, 0, D, 1, 0};
    mha_status s = mha_gemm(&a, kern, nt);
    if (s || (f->fused && self)) return s;
    const mha_packed *pk = f->fused ? &f->qkv : &f->kv;
    const int k_sec = f->fused ? 1 : 0, kin = f->fused ? D : Dk;
    const int v_with_k = shared_kv && !f->split_v;
    a = (mha_gemm_args){dst + 1, k_src, (size_t)kin, krows, pk, k_sec, k_sec + (v_with_k ? 2 : 1), 0, kin, 1, 0};
    if ((s = mha_gemm(&a, kern, nt)) || v_with_k) return s;
    if (f->split_v) a = (mha_gemm_args){dst + 2, v_src, (size_t)Dv, krows, &f->v, 0, 1, 0, Dv, 1, 0};
    else a = (mha_gemm_args){dst + 2, v_src, (size_t)kin, krows, pk, k_sec + 1, k_sec + 2, 0, kin, 1, 0};
    return mha_gemm(&a, kern, nt);
}

/* Backward of an intervention on head r's block of dz (rows, h*d), in
 * place (the functions of mha.h: ZERO and REPLACE are constants, SCALE
 * multiplies, MEAN spreads the column means). */
static void intervene_backward(float *dz, const mha_intervention *iv, int r, int h, size_t rows, int d) {
    float *blk = dz + (size_t)r * d;
    const size_t zw = (size_t)h * d;
    for (int e = 0; e < d && iv->op != MHA_HEAD_KEEP; e++) {
        float mean = 0.0f;
        for (size_t t = 0; iv->op == MHA_HEAD_MEAN && t < rows; t++) mean += blk[t * zw + e];
        mean /= (float)rows;
        for (size_t t = 0; t < rows; t++) {
            float *p = &blk[t * zw + e];
            *p = iv->op == MHA_HEAD_SCALE ? *p * iv->scale : iv->op == MHA_HEAD_MEAN ? mean : 0.0f;
        }
    }
}

/* The gradients of one projection out = src W + b, given dout with the
 * extra keys' rows in between (B blocks of `rows` rows, `stride` rows
 * apart): dW = src^T dout, db = sum dout, dsrc (+)= dout W^T. */
typedef struct {
    const float *src, *w; /* (B*rows, k) (k, n) */
    const float *dout;    /* (B*stride, n)      */
    int B, rows, stride, k, n;
} proj_grad;

static mha_status proj_backward(float *dw, float *db, float *dsrc, int dsrc_accumulate, const proj_grad *p,
                                const mha_backward_kernels *bk, int nt) {
    mha_status s = MHA_OK;
    const size_t n = (size_t)p->n, k = (size_t)p->k;
    const int one_block = p->rows == p->stride; /* no extra rows: one product over all batches */
    for (int b = 0; b < (one_block ? 1 : p->B) && !s; b++) {
        const int m = one_block ? p->B * p->rows : p->rows;
        const float *src = p->src + (size_t)b * p->rows * k, *dout = p->dout + (size_t)b * p->stride * n;
        if (dw) s = mha_gemm_strided(dw, n, (mha_view){src, 1, k}, (mha_view){dout, n, 1}, p->k, p->n, m, b > 0,
                                     bk, nt);
        if (db) mha_column_sums(db, dout, n, (size_t)m, p->n, b > 0);
        if (dsrc && !s)
            s = mha_gemm_strided(dsrc + (size_t)b * p->rows * k, k, (mha_view){dout, n, 1}, (mha_view){p->w, 1, n},
                                 m, p->k, p->n, dsrc_accumulate, bk, nt);
    }
    return s;
}

/* dbias (n) = sum over batches of row S of d (B, Sx, n): the extra key row. */
static void extra_row_sum(float *dbias, const float *d, int B, int S, int Sx, size_t n) {
    for (size_t e = 0; e < n; e++) dbias[e] = 0.0f;
    for (int b = 0; b < B; b++)
        for (size_t e = 0; e < n; e++) dbias[e] += d[((size_t)b * Sx + S) * n + e];
}

/* clip_qkv: a (n) clamped to [-clip, clip] in place, in (n) = 1 where it
 * was within (torch's clamp passes the gradient at the bounds too). */
static void clip_keep(float *a, unsigned char *in, size_t n, float clip, int nt) {
    nt = n >= ((size_t)1 << 16) ? nt : 1;
#pragma omp parallel for schedule(static) num_threads(nt)
    for (size_t i = 0; i < n; i++) {
        in[i] = a[i] >= -clip && a[i] <= clip;
        a[i] = a[i] < -clip ? -clip : a[i] > clip ? clip : a[i];
    }
}

/* The clamp's backward: d (n) zeroed where the projection was outside. */
static void clip_backward(float *d, const unsigned char *in, size_t n, int nt) {
    nt = n >= ((size_t)1 << 16) ? nt : 1;
#pragma omp parallel for schedule(static) num_threads(nt)
    for (size_t i = 0; i < n; i++)
        if (!in[i]) d[i] = 0.0f;
}

/* The checks every fast backward makes before it computes anything. */
static mha_status fast_supported(const mha_layer *L, int B, int T, int S, const char *who) {
    const mha_config *c = &L->cfg;
    if (!L->fast) return mha_fail(MHA_E_UNSUPPORTED, "%s: the layer's packed weights are missing", who);
    const int Sx = mha_total_keys(c, S);
    if ((size_t)B * T > (size_t)INT_MAX / 2 || (size_t)B * Sx > (size_t)INT_MAX / 2)
        return mha_fail(MHA_E_UNSUPPORTED, "%s: B*T=%zu or B*S=%zu rows exceed its int indexing", who,
                        (size_t)B * T, (size_t)B * S);
    return MHA_OK;
}

/* ALiBi's term -slope |p_i - p_j| is outside the |scale q.k| bound of
 * mha_fast_check_scores: a query far from every key it may attend
 * (positions, key_positions) has all its scores far below zero, where fp32
 * keeps too few bits of their differences for the softmax. The range rule
 * then applies to each row's largest score (pass 1's row_max, 0 for a row
 * with no key): beyond it MHA_E_UNSUPPORTED, and AUTO runs the reference. */
static mha_status check_alibi_rows(const mha_bwd_saved *sv, const mha_config *c, const char *who) {
    const size_t n = (size_t)sv->B * c->n_heads * sv->T;
    for (size_t at = 0; at < n; at++)
        if (!(fabsf(sv->row_max[at]) <= MHA_FAST_SCORE_LIMIT)) {
            const size_t br = at / (size_t)sv->T;
            return mha_fail(MHA_E_UNSUPPORTED, "%s: with ALiBi the largest score of batch %zu head %zu query "
                            "%zu is %.3g (the query is far from every key it may attend), beyond the %g its "
                            "fp32 softmax keeps accurate; expected MHA_PATH_AUTO or _REFERENCE for such inputs",
                            who, br / (size_t)c->n_heads, br % (size_t)c->n_heads, at % (size_t)sv->T,
                            (double)sv->row_max[at], MHA_FAST_SCORE_LIMIT);
        }
    return MHA_OK;
}

void mha_bwd_saved_free(mha_bwd_saved *sv) {
    free(sv->q), free(sv->k), free(sv->v), free(sv->z), free(sv->lse), free(sv->q_pre), free(sv->k_pre);
    free(sv->clip_in), free(sv->gate);
    memset(sv, 0, sizeof *sv);
}

mha_status mha_bwd_saved_make(mha_bwd_saved *sv, const mha_exec *ex, const mha_layer *L, const float *x,
                              const float *k_src, const float *v_src, int B, int T, int S,
                              const mha_options *opt, int dq_room, const char *who) {
    const mha_config *c = &L->cfg;
    memset(sv, 0, sizeof *sv);
    mha_status s = fast_supported(L, B, T, S, who);
    if (s) return s;
    /* pass 1 runs on the prefill table's kernels; the backward table lends
     * it the transposing copy of the keys (a copy: the same bits on every
     * ISA, and the portable one took 4% of a P2 backward on a Zen 4) */
    const mha_kernels *kern = mha_exec_prefill(ex);
    const mha_backward_kernels *bwd = mha_exec_backward(ex);
    const int nt = ex->n_threads, h = c->n_heads, h_kv = c->n_kv_heads, d_k = c->d_k, d_v = c->d_v;
    const int Sx = mha_total_keys(c, S);
    const size_t qw = (size_t)h * d_k, kw = (size_t)h_kv * d_k, vw = (size_t)h_kv * d_v, zw = (size_t)h * d_v;
    const size_t rows = (size_t)B * T, zq = dq_room && qw > zw ? qw : zw;
    *sv = (mha_bwd_saved){malloc(sizeof(float) * rows * qw),            // (B,T,qw)
                          calloc((size_t)B * Sx * kw, sizeof(float)),   // (B,Sx,kw)
                          calloc((size_t)B * Sx * vw, sizeof(float)),   // (B,Sx,vw)
                          malloc(sizeof(float) * rows * zq),            // (B,T,zw)
                          malloc(sizeof(float) * (size_t)B * h * T * 2), // (B,h,T) twice
                          B, T, S, Sx,
                          opt->scale != 0.0f ? opt->scale : (float)(1.0 / sqrt((double)d_k)), NULL, NULL, NULL, NULL, NULL};
    if (!sv->q || !sv->k || !sv->v || !sv->z || !sv->lse) {
        mha_bwd_saved_free(sv);
        return mha_fail(MHA_E_NOMEM, "%s: no memory for Q, K, V, Z (B=%d T=%d S=%d)", who, B, T, S);
    }

    // --- Q = X W_Q + b_Q, K = Xk W_K + b_K, V = Xv W_V + b_V; key S is (bias_k, bias_v)
    if ((s = project(sv->q, sv->k, sv->v, L, x, k_src, v_src, B, T, S, Sx, kern, nt))) goto fail;
    for (int b = 0; c->add_bias_kv && b < B; b++) {
        memcpy(sv->k + ((size_t)b * Sx + S) * kw, L->bias_k, sizeof(float) * kw);
        memcpy(sv->v + ((size_t)b * Sx + S) * vw, L->bias_v, sizeof(float) * vw);
    }
    // --- output_gate: sigmoid(X W_G + b_G), the factor of Z that W_O reads
    if (c->output_gate) {
        if (!(sv->gate = malloc(sizeof(float) * rows * zw))) {
            s = mha_fail(MHA_E_NOMEM, "%s: no memory for the output gate (B=%d T=%d)", who, B, T);
            goto fail;
        }
        if ((s = mha_fast_gate_logits(sv->gate, L, x, rows, kern, nt))) goto fail;
        mha_gate_sigmoid(sv->gate, rows * zw, nt);
    }
    // --- clip_qkv: Q, K, V <- clamp(., -c, c), keeping where each was within (variants: Sx = S)
    if (c->clip_qkv != 0.0f) {
        const size_t nq = rows * qw, nk = (size_t)B * Sx * kw, nv = (size_t)B * Sx * vw;
        if (!(sv->clip_in = malloc(nq + nk + nv))) {
            s = mha_fail(MHA_E_NOMEM, "%s: no memory for clip_qkv's masks (B=%d T=%d S=%d)", who, B, T, S);
            goto fail;
        }
        clip_keep(sv->q, sv->clip_in, nq, c->clip_qkv, nt);
        clip_keep(sv->k, sv->clip_in + nq, nk, c->clip_qkv, nt);
        clip_keep(sv->v, sv->clip_in + nq + nk, nv, c->clip_qkv, nt);
    }
    // --- Q, K <- RoPE(norm(Q)), RoPE(norm(K)) (variants have no extra keys: Sx = S)
    if ((s = mha_bwd_qk_forward(sv, L, opt, k_src == x, nt))) goto fail;

    // --- Z^(r) = softmax(scale Q^(r) K^(g)^T + mask) V^(g) and lse
    if (sv->lse) sv->row_max = sv->lse + (size_t)B * h * T;
    const mha_bwd_attn att = {c,  opt, sv->q, sv->k, sv->v, sv->z,     sv->lse,    NULL, NULL, NULL, NULL,
                              B,  T,   S,     Sx,    sv->scale, sv->row_max, L->alibi_slopes, L->sinks, k_src == x,
                              NULL};
    if ((s = mha_fast_check_scores(sv->q, sv->k, c, B, T, Sx, sv->scale, who))) goto fail;
    long masked = 0;
    if ((s = mha_bwd_attention_forward(&att, kern, bwd, nt, &masked))) goto fail;
    if (masked && opt->masked_row == MHA_MASKED_ROW_NAN && !c->sinks) { /* with sinks such a row is 0 */
        s = mha_fail(MHA_E_UNSUPPORTED, "%s: %ld query rows have no allowed key under "
                     "MHA_MASKED_ROW_NAN; expected MHA_MASKED_ROW_ZERO (or the reference backward)", who, masked);
        goto fail;
    }
    if (c->alibi && (s = check_alibi_rows(sv, c, who))) goto fail;
    return MHA_OK;
fail:
    mha_bwd_saved_free(sv);
    return s;
}

mha_status mha_bwd_z_read(const float **zo, float **owned, const mha_bwd_saved *sv, const mha_layer *L,
                          const mha_options *opt, const char *who) {
    const mha_config *c = &L->cfg;
    const size_t rows = (size_t)sv->B * sv->T, zw = (size_t)c->n_heads * c->d_v;
    *zo = sv->z, *owned = NULL;
    if (!opt->interventions && !sv->gate) return MHA_OK;
    float *z = malloc(sizeof(float) * rows * zw); /* (B,T,zw) */
    if (!z) return mha_fail(MHA_E_NOMEM, "%s: no memory for Z as W_O reads it (B*T=%zu)", who, rows);
    for (size_t i = 0; i < rows * zw; i++) z[i] = sv->gate ? sv->z[i] * sv->gate[i] : sv->z[i];
    mha_status s = MHA_OK;
    for (int r = 0; opt->interventions && r < c->n_heads && !s; r++)
        s = mha_head_intervene(z, &opt->interventions[r], r, c->n_heads, (int)rows, c->d_v);
    if (s) {
        free(z);
        return s;
    }
    *zo = *owned = z;
    return MHA_OK;
}

/* The gate's backward on dz (n) in place: Z' = Z s, so dG = dZ' Z s
 * (1 - s) into dg (NULL: not wanted) and dZ = dZ' s. */
static void gate_backward(float *dg, float *dz, const float *z, const float *s, size_t n, int nt) {
    nt = n >= ((size_t)1 << 16) ? nt : 1;
#pragma omp parallel for schedule(static) num_threads(nt)
    for (size_t i = 0; i < n; i++) {
        if (dg) dg[i] = dz[i] * z[i] * s[i] * (1.0f - s[i]);
        dz[i] *= s[i];
    }
}

mha_status mha_bwd_from_saved(const mha_exec *ex, const mha_layer *L, const mha_gradients *g, const float *dy,
                              const mha_bwd_saved *sv, const float *x, const float *k_src,
                              const float *v_src, const mha_options *opt, int overwrite) {
    const mha_config *c = &L->cfg;
    const mha_kernels *kern = mha_exec_prefill(ex);
    const mha_backward_kernels *bk = mha_exec_backward(ex);
    const int nt = ex->n_threads, B = sv->B, T = sv->T, S = sv->S, Sx = sv->Sx;
    const int h = c->n_heads, h_kv = c->n_kv_heads, d_k = c->d_k, d_v = c->d_v, D = c->d_model;
    const size_t qw = (size_t)h * d_k, kw = (size_t)h_kv * d_k, vw = (size_t)h_kv * d_v, zw = (size_t)h * d_v;
    const size_t rows = (size_t)B * T;
    const int want_qkv = g->dx || g->dk_src || g->dv_src || g->dw_q || g->dw_k || g->dw_v || g->db_q ||
                         g->db_k || g->db_v || g->dbias_k || g->dbias_v || g->d_sinks || g->d_q_norm ||
                         g->d_k_norm;
    const int want_dgate = sv->gate && (g->dx || g->dw_g || g->db_g); /* dl/dG: its path's gradients */
    /* overwrite: dq reuses z's buffer, dk and dv overwrite k and v (the
     * stateless backward); else they are buffers of their own and sv stays */
    float *dz = malloc(sizeof(float) * rows * zw);                               // (B,T,zw)
    float *dq = overwrite ? sv->z : malloc(sizeof(float) * rows * qw);           // (B,T,qw)
    float *dk = overwrite ? sv->k : malloc(sizeof(float) * (size_t)B * Sx * kw); // (B,Sx,kw)
    float *dv = overwrite ? sv->v : malloc(sizeof(float) * (size_t)B * Sx * vw); // (B,Sx,vw)
    float *z_after = NULL;                                                       // (B,T,zw) gated, intervened
    float *dgate = want_dgate ? malloc(sizeof(float) * rows * zw) : NULL;        // (B,T,zw) dl/dG
    float *dsink = c->sinks ? malloc(sizeof(float) * (size_t)B * h) : NULL;      // (B,h) shares of dl/dsink
    mha_status s = MHA_OK;
    if (!dz || !dq || !dk || !dv || (c->sinks && !dsink) || (want_dgate && !dgate)) {
        s = mha_fail(MHA_E_NOMEM, "fast backward: no memory for dZ, dQ, dK, dV (B=%d T=%d S=%d)", B, T, S);
        goto done;
    }

    // --- the gate, then the interventions, on Z^(r): what W_O reads
    const float *zo = sv->z;
    if (g->dw_o && (s = mha_bwd_z_read(&zo, &z_after, sv, L, opt, "fast backward"))) goto done;

    // --- Y = Z W_O + b_O: dW_O = Z^T dY, db_O = sum dY, dZ = dY W_O^T
    if (g->dw_o && (s = mha_gemm_strided(g->dw_o, (size_t)D, (mha_view){zo, 1, zw}, (mha_view){dy, (size_t)D, 1},
                                         (int)zw, D, (int)rows, 0, bk, nt)))
        goto done;
    if (g->db_o) mha_column_sums(g->db_o, dy, (size_t)D, rows, D, 0);
    if (!want_qkv && !want_dgate) goto done;
    if ((s = mha_gemm_strided(dz, zw, (mha_view){dy, (size_t)D, 1}, (mha_view){L->w_o, 1, (size_t)D}, (int)rows,
                              (int)zw, D, 0, bk, nt)))
        goto done;

    // --- interventions: dZ before = dZ after through each head's function
    for (int r = 0; opt->interventions && r < h; r++)
        intervene_backward(dz, &opt->interventions[r], r, h, rows, d_v);

    // --- Z' = Z * s, s = sigmoid(G): dG = dZ' Z s (1 - s), dZ = dZ' s; G = X W_G + b_G:
    //     dW_G = X^T dG, db_G = sum dG (dX += dG W_G^T after the projections write dX)
    const proj_grad pg = {x, L->w_g, dgate, 1, (int)rows, (int)rows, D, (int)zw};
    if (sv->gate) {
        gate_backward(dgate, dz, sv->z, sv->gate, rows * zw, nt);
        if ((g->dw_g || g->db_g) && (s = proj_backward(g->dw_g, g->db_g, NULL, 0, &pg, bk, nt))) goto done;
    }
    if (!want_qkv) goto done;

    // --- attention: dQ, dK, dV (kv heads sum their group), D = rowsum(dZ * Z)
    const mha_bwd_attn att = {c,  opt, sv->q, sv->k, sv->v, sv->z,     sv->lse,    dz, dq, dk, dv,
                              B,  T,   S,     Sx,    sv->scale, sv->row_max, L->alibi_slopes, L->sinks, k_src == x,
                              dsink};
    if ((s = mha_bwd_attention_backward(&att, kern, bk, nt))) goto done;
    for (int r = 0; g->d_sinks && r < h; r++) { /* the batches' shares in order */
        double acc = 0.0;
        for (int b = 0; b < B; b++) acc += dsink[(size_t)b * h + r];
        g->d_sinks[r] = (float)acc;
    }

    // --- RoPE, then QK-norm, backward: dQ, dK before them; the norm weights' gradients
    if ((s = mha_bwd_qk_backward(dq, dk, g->d_q_norm, g->d_k_norm, sv, L, opt, k_src == x, nt))) goto done;
    // --- clip_qkv: the clamp passes dQ, dK, dV where the projection was within [-c, c]
    if (sv->clip_in) {
        const size_t nq = rows * qw, nk = (size_t)B * Sx * kw;
        clip_backward(dq, sv->clip_in, nq, nt);
        clip_backward(dk, sv->clip_in + nq, nk, nt);
        clip_backward(dv, sv->clip_in + nq + nk, (size_t)B * Sx * vw, nt);
    }

    // --- projections; a source that is x (or the key source) adds its
    //     path's gradient to that tensor's
    const proj_grad pq = {x, L->w_q, dq, 1, (int)rows, (int)rows, D, (int)qw};
    const proj_grad pk = {k_src, L->w_k, dk, B, S, Sx, c->d_kv_in, (int)kw};
    const proj_grad pv = {v_src, L->w_v, dv, B, S, Sx, c->d_v_in, (int)vw};
    float *dk_into = k_src == x ? g->dx : g->dk_src;
    float *dv_into = v_src == x ? g->dx : v_src == k_src ? dk_into : g->dv_src;
    if ((s = proj_backward(g->dw_q, g->db_q, g->dx, 0, &pq, bk, nt))) goto done;
    if ((s = proj_backward(g->dw_k, g->db_k, dk_into, k_src == x, &pk, bk, nt))) goto done;
    if ((s = proj_backward(g->dw_v, g->db_v, dv_into, v_src == x || v_src == k_src, &pv, bk, nt))) goto done;
    if (g->dbias_k) extra_row_sum(g->dbias_k, dk, B, S, Sx, kw);
    if (g->dbias_v) extra_row_sum(g->dbias_v, dv, B, S, Sx, vw);
    if (want_dgate && g->dx) s = proj_backward(NULL, NULL, g->dx, 1, &pg, bk, nt);

done:
    free(dz), free(z_after), free(dgate), free(dsink);
    if (!overwrite) free(dq), free(dk), free(dv);
    return s;
}

mha_status mha_backward_fast(const mha_exec *ex, const mha_layer *L, const mha_gradients *g, const float *dy,
                             const float *x, const float *k_src, const float *v_src, int B, int T, int S,
                             const mha_options *opt) {
    mha_bwd_saved sv; /* recomputed here: the API keeps no forward state */
    mha_status s = mha_bwd_saved_make(&sv, ex, L, x, k_src, v_src, B, T, S, opt, 1, "fast backward");
    if (s) return s;
    s = mha_bwd_from_saved(ex, L, g, dy, &sv, x, k_src, v_src, opt, 1);
    mha_bwd_saved_free(&sv);
    return s;
}
