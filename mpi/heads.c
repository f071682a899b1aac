/* heads.c — head-parallel attention (Megatron-LM's tensor parallelism as
 * the head contract states it): rank r keeps its heads' column blocks of
 * W_Q/W_K/W_V (and W_G, b_G of a gated layer) and row blocks of W_O,
 * computes Y_r = sum over its heads of Z^(i) W_O[i] (Z^(i) gated by
 * sigmoid(x W_G[i] + b_G[i]) when the layer has the gate), and Y = sum_r
 * Y_r + b_O after one MPI_Allreduce.
 * Legend: B, T, S, S_tot = S + extra keys, h, h_kv, hl = h/P and
 * gl kv heads per rank, d_k, d_v, d_model = D, d_kv_in. */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mpi_internal.h"

void mha_mpi_shard_mismatch(char *msg, size_t cap, const char *who, const mha_layer *local,
                            const mha_mpi_heads *hd, int rank) {
    const mha_config *c = mha_layer_config(local);
    if (hd->count < 1 || hd->count != c->n_heads || hd->kv_count != c->n_kv_heads || hd->first != rank * hd->count)
        snprintf(msg, cap, "%s: heads [%d, %d) with %d kv heads on rank %d, but the local layer has %d heads and %d "
                 "kv heads; expected the shard and heads mha_mpi_shard_heads or mha_mpi_load_heads gave this rank "
                 "(heads [rank count, (rank + 1) count), count the shard's h)", who, hd->first,
                 hd->first + hd->count, hd->kv_count, rank, c->n_heads, c->n_kv_heads);
}

int mha_mpi_alloc_fault(MPI_Comm comm) {
    const char *e = getenv("MHA_MPI_FAIL_ALLOC");
    int rank;
    MPI_Comm_rank(comm, &rank);
    return e && *e && atoi(e) == rank;
}

void mha_mpi_sum_partials(float *y, const float *yl, size_t rows, int D, const float *b_o, MPI_Comm comm) {
    MPI_Allreduce(yl, y, (int)(rows * D), MPI_FLOAT, MPI_SUM, comm);
    for (size_t t = 0; b_o && t < rows; t++)
        for (int e = 0; e < D; e++) y[t * D + e] += b_o[e];
}

mha_status mha_mpi_heads_of(mha_mpi_heads *out, const mha_config *c, int rank, int P) {
    if (!out || !c) return mha_mpi_fail(MHA_E_ARG, "mha_mpi_heads_of: NULL argument");
    if (P < 1 || rank < 0 || rank >= P)
        return mha_mpi_fail(MHA_E_ARG, "mha_mpi_heads_of: rank %d of P=%d; expected P >= 1 and 0 <= rank < P", rank, P);
    const int h = c->n_heads, h_kv = c->n_kv_heads;
    if (h < 1 || h_kv < 1 || h % h_kv)
        return mha_mpi_fail(MHA_E_ARG, "mha_mpi_heads_of: h=%d, h_kv=%d; expected h_kv >= 1 dividing h", h, h_kv);
    /* OLMo 2's norm spans all h heads' q (and k): no rank holds them */
    if (c->qk_norm != MHA_QK_NORM_NONE && c->qk_norm_whole && P > 1)
        return mha_mpi_fail(MHA_E_UNSUPPORTED,
                            "qk_norm_whole (a QK-norm over all %d heads' q and k, OLMo 2) needs every head's q and "
                            "k, but a head split over P=%d ranks gives each rank h/P of them; expected a per-head "
                            "or shared (d_k) QK-norm, or P = 1", h, P);
    if (h_kv % P == 0) { /* whole kv groups per rank */
        out->count = h / P, out->kv_count = h_kv / P;
        out->first = rank * out->count, out->kv_first = rank * out->kv_count;
        return MHA_OK;
    }
    if (P % h_kv == 0 && h % P == 0) { /* each rank inside one group: a copy of its kv head */
        out->count = h / P, out->kv_count = 1;
        out->first = rank * out->count, out->kv_first = out->first / (h / h_kv);
        return MHA_OK;
    }
    return mha_mpi_fail(MHA_E_SHAPE,
                        "--split heads over P=%d ranks: h=%d query heads with h_kv=%d kv heads cannot be "
                        "split; expected P to divide h_kv (whole kv groups per rank), or h_kv to divide P "
                        "and P to divide h", P, h, h_kv);
}

/* dst (rows, n*w) = columns [first*w, (first+n)*w) of src (rows, N*w). */
static void take_columns(float *dst, const float *src, int rows, int N, int first, int n, int w) {
    for (int i = 0; i < rows; i++)
        memcpy(dst + (size_t)i * n * w, src + (size_t)i * N * w + (size_t)first * w,
               sizeof(float) * (size_t)n * w);
}

/* The contract's label rule on this rank's heads only: q, o hold the
 * labels of its query heads (hd->count), k, v of its kv heads
 * (hd->kv_count); sl, NULL or the labels of its heads' score parameters
 * (ALiBi slopes, sinks: given when the layer has them), as src/contract.c
 * reads them; group = h / h_kv. */
static mha_status check_shard_labels(const int *q, const int *o, const int *k, const int *v, const int *sl,
                                     const mha_mpi_heads *hd, int group, char *msg, size_t cap) {
    for (int j = 0; j < hd->count; j++) {
        const int i = hd->first + j, g = i / group, gl = g - hd->kv_first;
        if (q[j] != o[j])
            return snprintf(msg, cap, "head contract broken in this rank's shard: W_O row block %d has label %d; expected %d (the label of W_Q column block %d)", i, o[j], q[j], i), MHA_E_CONTRACT;
        if (sl && sl[j] != q[j])
            return snprintf(msg, cap, "head contract broken in this rank's shard: the score parameters (ALiBi slope, sink) of head %d have label %d; expected %d (the label of W_Q column block %d)", i, sl[j], q[j], i), MHA_E_CONTRACT;
        if (k[gl] != v[gl])
            return snprintf(msg, cap, "head contract broken in this rank's shard: W_V column block %d has label %d; expected %d (the label of W_K column block %d)", g, v[gl], k[gl], g), MHA_E_CONTRACT;
        if (q[j] / group != k[gl])
            return snprintf(msg, cap, "head contract broken in this rank's shard: query head %d (label %d) reads kv head %d labelled %d; expected label %d", i, q[j], g, k[gl], q[j] / group), MHA_E_CONTRACT;
    }
    return MHA_OK;
}

/* Rank 0 gathers every rank's query labels (mine: hd->count of them):
 * together they must name each of the h heads once. */
static mha_status check_gathered_labels(const int *mine, const mha_mpi_heads *hd, int h, MPI_Comm comm,
                                        char *msg, size_t cap) {
    int rank;
    MPI_Comm_rank(comm, &rank);
    int *all = malloc(sizeof(int) * (size_t)h * 2), *seen = all ? all + h : NULL;
    int ok = all != NULL, gathered_ok = 1;
    MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, comm);
    if (!ok) {
        free(all);
        return snprintf(msg, cap, "no memory for %d labels", h), MHA_E_NOMEM;
    }
    MPI_Gather(mine, hd->count, MPI_INT, all, hd->count, MPI_INT, 0, comm);
    if (rank == 0) {
        memset(seen, 0, sizeof(int) * (size_t)h);
        for (int i = 0; i < h && gathered_ok; i++) {
            if (all[i] < 0 || all[i] >= h || seen[all[i]]++)
                gathered_ok = 0, snprintf(msg, cap, "gathered W_Q labels: head %d has label %d, given twice or out of 0..%d; expected every rank to load the same checkpoint", i, all[i], h - 1);
        }
    }
    free(all);
    return gathered_ok ? MHA_OK : MHA_E_CONTRACT;
}

/* Both label checks, agreed: q, o, k, v, sl as check_shard_labels. */
static mha_status check_labels(const int *q, const int *o, const int *k, const int *v, const int *sl,
                               const mha_mpi_heads *hd, int h, int h_kv, MPI_Comm comm) {
    char msg[512] = "";
    mha_status s = check_shard_labels(q, o, k, v, sl, hd, h / h_kv, msg, sizeof msg);
    if ((s = mha_mpi_agree(comm, s, msg))) return s;
    s = check_gathered_labels(q, hd, h, comm, msg, sizeof msg);
    return mha_mpi_agree(comm, s, msg);
}

mha_status mha_mpi_shard_heads(mha_layer **local, mha_mpi_heads *hd, const mha_layer *full, MPI_Comm comm) {
    int rank, P;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &P);
    const int bad = !local || !hd || !full;
    if (local) *local = NULL;
    mha_status s = mha_mpi_agree(comm, bad ? MHA_E_ARG : MHA_OK, "mha_mpi_shard_heads: NULL argument; expected local, heads and full");
    if (s) return s;
    char msg[512] = "";
    const mha_config *c = mha_layer_config(full);
    /* the same layer on every rank: else each cut another split (the label gather's counts differed: an abort) */
    const long long same[] = {c->d_model, c->n_heads, c->n_kv_heads, c->d_k, c->d_v,
                              mha_mpi_call_checksum(c, mha_layer_weights_dtype(full), NULL, 0)};
    const char *names[] = {"d_model", "h", "h_kv", "d_k", "d_v",
                           "checksum of the layer's configuration (shapes, variants, weight storage)"};
    if ((s = mha_mpi_check_same(comm, same, 6, names))) return s;
    s = mha_mpi_heads_of(hd, c, rank, P);
    if ((s = mha_mpi_agree(comm, s, s ? mha_mpi_last_error() : NULL))) return s;
    {
        const int h = c->n_heads, h_kv = c->n_kv_heads;
        int *lab = malloc(sizeof(int) * (size_t)(3 * h + 2 * h_kv)), *q = lab, *o = q + h, *k = o + h, *v = k + h_kv,
            *sl = v + h_kv;
        if ((s = mha_mpi_agree(comm, lab ? MHA_OK : MHA_E_NOMEM, "no memory for the labels"))) return free(lab), s;
        mha_layer_labels(full, MHA_BLOCK_Q, q), mha_layer_labels(full, MHA_BLOCK_O, o);
        mha_layer_labels(full, MHA_BLOCK_K, k), mha_layer_labels(full, MHA_BLOCK_V, v);
        mha_layer_labels(full, MHA_BLOCK_S, sl);
        s = check_labels(q + hd->first, o + hd->first, k + hd->kv_first, v + hd->kv_first,
                         c->alibi || c->sinks ? sl + hd->first : NULL, hd, h, h_kv, comm);
        free(lab);
        if (s) return s;
    }

    // --- this rank's blocks: columns of W_Q/W_K/W_V (and of W_G: head i's
    //     gate reads the query's input, as its W_Q block), rows of W_O
    const int hl = hd->count, gl = hd->kv_count, d_k = c->d_k, d_v = c->d_v, D = c->d_model;
    mha_weights w;
    mha_layer_get_weights(full, &w);
    mha_config lc = *c;
    lc.n_heads = hl, lc.n_kv_heads = gl;
    const size_t nq = (size_t)D * hl * d_k, nk = (size_t)c->d_kv_in * gl * d_k,
                 nv = (size_t)c->d_v_in * gl * d_v, no = (size_t)hl * d_v * D;
    const size_t nb = (size_t)hl * d_k + (size_t)gl * (d_k + d_v) * 2 + D;
    const size_t ng = c->output_gate ? ((size_t)D + 1) * hl * d_v : 0; /* W_G (D, hl*d_v), b_G (hl*d_v) */
    const size_t total = nq + nk + nv + no + nb + ng;
    float *buf = mha_mpi_alloc_fault(comm) ? NULL : malloc(sizeof(float) * total);
    if (!buf) {
        s = MHA_E_NOMEM;
        snprintf(msg, sizeof msg, "no memory for this rank's shard of the layer (%zu floats)", total);
    } else {
        float *wq = buf, *wk = wq + nq, *wv = wk + nk, *wo = wv + nv, *bq = wo + no, *bk = bq + (size_t)hl * d_k,
              *bv = bk + (size_t)gl * d_k, *bias_k = bv + (size_t)gl * d_v, *bias_v = bias_k + (size_t)gl * d_k,
              *bo = bias_v + (size_t)gl * d_v, *wg = bo + D, *bg = wg + (size_t)D * hl * d_v;
        take_columns(wq, w.w_q, D, c->n_heads, hd->first, hl, d_k);
        take_columns(wk, w.w_k, c->d_kv_in, c->n_kv_heads, hd->kv_first, gl, d_k);
        take_columns(wv, w.w_v, c->d_v_in, c->n_kv_heads, hd->kv_first, gl, d_v);
        memcpy(wo, w.w_o + (size_t)hd->first * d_v * D, sizeof(float) * no); /* rows of W_O */
        memset(bo, 0, sizeof(float) * (size_t)D); /* b_O is added once, after the sum */
        mha_weights lw = {.w_q = wq, .w_k = wk, .w_v = wv, .w_o = wo};
        /* per-head parameters are contiguous by head: this rank's rows */
        if (c->alibi) lw.alibi_slopes = w.alibi_slopes + hd->first;
        if (c->sinks) lw.sinks = w.sinks + hd->first;
        if (c->qk_norm != MHA_QK_NORM_NONE) {
            lw.q_norm = w.q_norm + (c->qk_norm_per_head ? (size_t)hd->first * d_k : 0);
            lw.k_norm = w.k_norm + (c->qk_norm_per_head ? (size_t)hd->kv_first * d_k : 0);
        }
        if (c->bias) {
            take_columns(bq, w.b_q, 1, c->n_heads, hd->first, hl, d_k);
            take_columns(bk, w.b_k, 1, c->n_kv_heads, hd->kv_first, gl, d_k);
            take_columns(bv, w.b_v, 1, c->n_kv_heads, hd->kv_first, gl, d_v);
            lw.b_q = bq, lw.b_k = bk, lw.b_v = bv, lw.b_o = bo;
        }
        if (c->output_gate) {
            take_columns(wg, w.w_g, D, c->n_heads, hd->first, hl, d_v);
            lw.w_g = wg;
            if (c->bias) take_columns(bg, w.b_g, 1, c->n_heads, hd->first, hl, d_v), lw.b_g = bg;
        }
        if (c->add_bias_kv) {
            take_columns(bias_k, w.bias_k, 1, c->n_kv_heads, hd->kv_first, gl, d_k);
            take_columns(bias_v, w.bias_v, 1, c->n_kv_heads, hd->kv_first, gl, d_v);
            lw.bias_k = bias_k, lw.bias_v = bias_v;
        }
        s = mha_layer_create(local, &lc, &lw);
        /* a bf16 / int8 layer's shard in the same storage: its blocks are
         * the stored values, whose conversion gives them back exactly
         * (int8 groups restart at each head's W_O rows, as in the full
         * layer) */
        const mha_weight_dtype dt = mha_layer_weights_dtype(full);
        if (!s && dt != MHA_W_F32) s = mha_layer_convert_weights(*local, dt);
        if (s) snprintf(msg, sizeof msg, "%s", mha_last_error());
        free(buf);
    }
    s = mha_mpi_agree(comm, s, msg);
    if (s) mha_layer_free(*local), *local = NULL;
    return s;
}

mha_status mha_mpi_load_heads(mha_layer **local, mha_mpi_heads *hd, mha_config *cfg, float **b_o,
                              const char *path, const mha_load_options *opt, MPI_Comm comm) {
    int rank, P;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &P);
    const int bad = !local || !hd || !cfg || !b_o || !path;
    if (local) *local = NULL;
    if (b_o) *b_o = NULL;
    mha_status s = mha_mpi_agree(comm, bad ? MHA_E_ARG : MHA_OK,
                                 "mha_mpi_load_heads: NULL argument; expected local, heads, cfg, b_o and path");
    if (s) return s;
    s = mha_layer_load_config(cfg, path, opt);
    if ((s = mha_mpi_agree(comm, s, NULL))) return s;
    /* the same layer on every rank: else each cut another split (the label gather's counts differed: an abort) */
    const long long same[] = {cfg->d_model, cfg->n_heads, cfg->n_kv_heads, cfg->d_k, cfg->d_v,
                              mha_mpi_call_checksum(cfg, MHA_W_F32, NULL, 0)};
    const char *names[] = {"d_model", "h", "h_kv", "d_k", "d_v",
                           "checksum of the checkpoint's configuration (shapes, variants)"};
    if ((s = mha_mpi_check_same(comm, same, 6, names))) return s;
    s = mha_mpi_heads_of(hd, cfg, rank, P);
    if ((s = mha_mpi_agree(comm, s, s ? mha_mpi_last_error() : NULL))) return s;

    // --- this rank's heads, straight from the file, with the file's labels
    int *lab = mha_mpi_alloc_fault(comm) ? NULL : malloc(sizeof(int) * (3 * (size_t)hd->count + 2 * (size_t)hd->kv_count));
    mha_head_range rg = {.first = hd->first, .count = hd->count, .labels = lab,
                         .s_labels = lab ? lab + 2 * (hd->count + hd->kv_count) : NULL};
    mha_layer *shard = NULL;
    s = lab ? mha_layer_load_heads(&shard, path, opt, &rg) : MHA_E_NOMEM;
    if (!s && (rg.kv_first != hd->kv_first || rg.kv_count != hd->kv_count))
        s = mha_mpi_fail(MHA_E_SHAPE, "the loaded shard reads kv heads [%d, %d); expected [%d, %d)", rg.kv_first,
                         rg.kv_first + rg.kv_count, hd->kv_first, hd->kv_first + hd->kv_count);
    else if (s) mha_mpi_fail(s, "%s", lab ? mha_last_error() : "no memory for this rank's labels");
    if (!(s = mha_mpi_agree(comm, s, s ? mha_mpi_last_error() : NULL))) {
        const int n = hd->count, g = hd->kv_count;
        s = check_labels(lab, lab + n, lab + 2 * n, lab + 2 * n + g, cfg->alibi || cfg->sinks ? rg.s_labels : NULL, hd,
                         cfg->n_heads, cfg->n_kv_heads, comm);
    }
    free(lab);

    // --- b_O leaves the shard: it is added once, after the sum
    if (!s) {
        mha_weights w;
        mha_layer_get_weights(shard, &w);
        const mha_config *lc = mha_layer_config(shard);
        const int D = lc->d_model;
        if (!w.b_o) { /* nothing to take out */
            *local = shard, shard = NULL;
        } else {
            float *zero = calloc((size_t)D, sizeof(float));
            *b_o = zero ? malloc(sizeof(float) * D) : NULL;
            if (!*b_o) {
                s = mha_mpi_fail(MHA_E_NOMEM, "no memory for b_O");
            } else {
                memcpy(*b_o, w.b_o, sizeof(float) * D);
                w.b_o = zero;
                if ((s = mha_layer_create(local, lc, &w))) mha_mpi_fail(s, "%s", mha_last_error());
            }
            free(zero);
        }
        s = mha_mpi_agree(comm, s, s ? mha_mpi_last_error() : NULL);
    }
    mha_layer_free(shard);
    if (s) mha_layer_free(*local), *local = NULL, free(*b_o), *b_o = NULL;
    return s;
}

/* dst (Bm, hl, T, S) = heads [first, first+hl) of a (Bm, h, T, S) mask. */
static void *slice_mask_heads(const mha_mask *m, size_t elem, int h, int first, int hl, size_t ts) {
    char *dst = malloc(elem * (size_t)m->batch * hl * ts);
    for (int b = 0; dst && b < m->batch; b++)
        memcpy(dst + elem * (size_t)b * hl * ts, (const char *)m->data + elem * ((size_t)b * h + first) * ts,
               elem * (size_t)hl * ts);
    return dst;
}

/* Rank 0 puts the gathered per-rank blocks (P, outer, inner) back as
 * (outer, P*inner): rank p's block at columns [p*inner, (p+1)*inner). */
static void interleave(float *dst, const float *src, int P, size_t outer, size_t inner) {
    for (int p = 0; p < P; p++)
        for (size_t o = 0; o < outer; o++)
            memcpy(dst + (o * P + p) * inner, src + ((size_t)p * outer + o) * inner, sizeof(float) * inner);
}

mha_status mha_mpi_forward_heads(const mha_layer *local, const mha_mpi_heads *hd, const float *b_o,
                                 float *y, const mha_capture *cap, const float *x, const float *kv,
                                 int B, int T, int S, const mha_options *opt, MPI_Comm comm,
                                 mha_mpi_stats *stats) {
    int rank, P;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &P);
    double t0 = MPI_Wtime();
    const int bad = !local || !hd || !x || !y;
    mha_status s = mha_mpi_agree(comm, bad ? MHA_E_ARG : MHA_OK,
                                 "mha_mpi_forward_heads: NULL argument; expected local, heads, x and y");
    if (s) return s;
    const mha_config *c = mha_layer_config(local);
    const int hl = hd->count, h = hl * P, D = c->d_model, d_v = c->d_v;
    const int S_tot = S + c->add_bias_kv + c->add_zero_attn;
    const int want_z = cap && cap->z, want_c = cap && cap->contributions, want_p = cap && cap->probs;
    /* y and the captures travel as one MPI message each (an int count) */
    const double most = fmax(fmax((double)B * T * D, want_z ? (double)B * T * hl * d_v : 0.0),
                             fmax(want_c ? (double)hl * B * T * D : 0.0, want_p ? (double)B * hl * T * S_tot : 0.0));
    char why[400] = "";
    mha_mpi_shard_mismatch(why, sizeof why, "mha_mpi_forward_heads", local, hd, rank);
    s = *why ? MHA_E_ARG : MHA_OK;
    if (!s && (B < 1 || T < 1 || S < 1))
        s = MHA_E_SHAPE, snprintf(why, sizeof why, "mha_mpi_forward_heads: B=%d T=%d S=%d; expected all >= 1", B, T, S);
    else if (!s && most > INT_MAX)
        s = MHA_E_SHAPE, snprintf(why, sizeof why, "mha_mpi_forward_heads: B=%d T=%d S=%d give %.0f floats in one "
                                  "message of y or a capture; expected at most %d (MPI's int count)", B, T, S, most,
                                  INT_MAX);
    /* a mask of the whole layer's heads (or one for all): a shard of h/P heads took one of h/P as its own */
    const mha_mask none = {0}, *mk = opt ? &opt->keep_mask : &none, *ma = opt ? &opt->additive_mask : &none;
    const int bad_k = mk->data && mk->heads != 1 && mk->heads != h, bad_a = ma->data && ma->heads != 1 && ma->heads != h;
    if (!s && (bad_k || bad_a))
        s = MHA_E_SHAPE, snprintf(why, sizeof why, "mha_mpi_forward_heads: %s.heads=%d; expected 1 (broadcast) or the "
                                  "whole layer's h=%d (each rank takes its heads' planes)",
                                  bad_k ? "keep_mask" : "additive_mask", bad_k ? mk->heads : ma->heads, h);
    if (!s && opt) /* by global head: a shard named its own index */
        s = mha_mpi_check_interventions(why, sizeof why, opt->interventions, h, (size_t)B * T, d_v);
    if ((s = mha_mpi_agree(comm, s, why))) return s;
    const long long same[] = {B, T, S, D, h, hl, want_z, want_c, want_p, kv != NULL,
                              mha_mpi_call_checksum(c, mha_layer_weights_dtype(local), opt, h),
                              mha_mpi_bytes_checksum(x, sizeof(float) * B * T * D),
                              mha_mpi_bytes_checksum(kv, sizeof(float) * B * S * c->d_kv_in)};
    const char *names[] = {"B", "T", "S", "d_model", "h", "heads per rank", "--save-z", "--save-contributions",
                           "--save-probs", "--kv-input", MHA_MPI_CALL_CHECKSUM_NAME, "checksum of x",
                           "checksum of kv"};
    if ((s = mha_mpi_check_same(comm, same, 13, names))) return s;
    /* dropout's draw is a function of the whole layer's head index: a shard would draw another */
    if ((s = mha_mpi_agree(comm, opt && opt->dropout_p != 0.0f ? MHA_E_UNSUPPORTED : MHA_OK,
                           "mha_mpi_forward_heads: options.dropout_p is not supported (training's dropout draws "
                           "by the whole layer's heads); expected 0")))
        return s;

    // --- this rank's view of the options: its interventions and mask heads
    mha_options o = opt ? *opt : mha_options_default();
    if (o.interventions) o.interventions += hd->first;
    void *km = NULL, *am = NULL;
    const size_t ts = (size_t)T * S;
    const int slice_km = o.keep_mask.data && o.keep_mask.heads == h && h > 1,
              slice_am = o.additive_mask.data && o.additive_mask.heads == h && h > 1;
    if (slice_km)
        o.keep_mask.data = km = slice_mask_heads(&o.keep_mask, 1, h, hd->first, hl, ts), o.keep_mask.heads = hl;
    if (slice_am)
        o.additive_mask.data = am = slice_mask_heads(&o.additive_mask, sizeof(float), h, hd->first, hl, ts),
        o.additive_mask.heads = hl;

    const size_t rows = (size_t)B * T, nz = rows * hl * d_v, nc = (size_t)hl * rows * D,
                 np = (size_t)B * hl * T * S_tot;
    float *yl = mha_mpi_alloc_fault(comm) ? NULL : malloc(sizeof(float) * rows * D); // (B,T,D) partial
    mha_capture cl = {want_z ? malloc(sizeof(float) * nz) : NULL,        // (B,T,hl*d_v)
                      want_c ? malloc(sizeof(float) * nc) : NULL,        // (hl,B,T,D)
                      want_p ? malloc(sizeof(float) * np) : NULL};       // (B,hl,T,S_tot)
    char msg[512] = "";
    if (!yl || (want_z && !cl.z) || (want_c && !cl.contributions) || (want_p && !cl.probs) ||
        (slice_km && !km) || (slice_am && !am)) {
        s = MHA_E_NOMEM;
        snprintf(msg, sizeof msg, "no memory for this rank's partial Y and captures (B=%d T=%d d_model=%d)", B, T, D);
    } else {
        double tc = MPI_Wtime();
        s = mha_forward(local, yl, &cl, x, kv, B, T, S, &o);
        if (stats) stats->compute_s = MPI_Wtime() - tc;
        if (s) snprintf(msg, sizeof msg, "%s", mha_last_error());
    }
    if (!(s = mha_mpi_agree(comm, s, msg))) {
        mha_mpi_sum_partials(y, yl, rows, D, b_o, comm); /* Y = sum_r Y_r + b_O */
        double sent = (double)rows * D * sizeof(float);
        // --- captures: rank 0 assembles every rank's heads
        float *g = NULL;
        size_t most = nz > nc ? nz : nc;
        if (np > most) most = np;
        int ok = 1;
        if (rank == 0 && (want_z || want_c || want_p)) ok = (g = malloc(sizeof(float) * most * P)) != NULL;
        MPI_Bcast(&ok, 1, MPI_INT, 0, comm);
        if (!ok) {
            s = mha_mpi_fail(MHA_E_NOMEM, "rank 0: no memory to assemble the captures (%zu floats)", most * P);
        } else {
            if (want_z) {
                MPI_Gather(cl.z, (int)nz, MPI_FLOAT, g, (int)nz, MPI_FLOAT, 0, comm);
                if (rank == 0) interleave(cap->z, g, P, rows, (size_t)hl * d_v);

            }
            if (want_c) { /* (P, hl, B,T,D) is already (h,B,T,D) */
                MPI_Gather(cl.contributions, (int)nc, MPI_FLOAT, rank == 0 ? cap->contributions : NULL,
                           (int)nc, MPI_FLOAT, 0, comm);

            }
            if (want_p) {
                MPI_Gather(cl.probs, (int)np, MPI_FLOAT, g, (int)np, MPI_FLOAT, 0, comm);
                if (rank == 0) interleave(cap->probs, g, P, (size_t)B, (size_t)hl * T * S_tot);

            }
        }
        free(g);
        if (stats) {
            /* one rank sends nothing: MPI copies in place */
            stats->sent_bytes = P > 1 ? sent : 0.0;
            stats->formula_bytes = P > 1 ? (double)B * T * D * sizeof(float) : 0.0;
        }
    }
    free(yl), free(cl.z), free(cl.contributions), free(cl.probs), free(km), free(am);
    if (stats) stats->total_s = MPI_Wtime() - t0;
    return s;
}
