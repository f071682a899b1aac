/* sequence.c — sequence-parallel attention (ring attention). Rows are cut
 * into 2P chunks and rank r owns chunks r and 2P-1-r (zigzag), so under a
 * causal mask every rank attends as many (query, key) pairs as any other.
 * Each rank projects its own rows; its K/V block (both key chunks) then
 * travels around the ring, sent with MPI_Isend/MPI_Irecv while the block in
 * hand is attended, and the partial (Z, lse) of each block is merged with
 * mha_attention_merge. Legend: B, T, S, h, h_kv, d_k, d_v, D = d_model,
 * d_in = d_kv_in; Tc/Sc rows of one query/key chunk, Tl = this rank's
 * query rows, ne extra keys (add_bias_kv, add_zero_attn). */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mpi_internal.h"

void mha_mpi_chunks_of(int start[2], int len[2], int n, int rank, int P) {
    if (!start || !len) return;
    if (P < 1 || rank < 0 || rank >= P || n < 0) { /* no chunks (P = 0 divided by zero) */
        start[0] = start[1] = len[0] = len[1] = 0;
        return;
    }
    for (int k = 0; k < 2; k++) {
        long c = k == 0 ? rank : 2L * P - 1 - rank;
        long a = c * n / (2L * P), b = (c + 1) * n / (2L * P);
        start[k] = (int)a, len[k] = (int)(b - a);
    }
}

/* clip_qkv: q (nq) and the K/V block (nkv) clamped to [-clip, clip], as
 * mha_forward clamps its projections (torch's clamp). */
static void clip_rows(float *q, size_t nq, float *kv, size_t nkv, float clip) {
    for (size_t i = 0; i < nq; i++) q[i] = q[i] < -clip ? -clip : q[i] > clip ? clip : q[i];
    for (size_t i = 0; i < nkv; i++) kv[i] = kv[i] < -clip ? -clip : kv[i] > clip ? clip : kv[i];
}

/* dst (B, len, w) = rows [start, start+len) of src (B, n, w). */
static void take_rows(float *dst, const float *src, int B, int n, int start, int len, int w) {
    for (int b = 0; b < B; b++)
        memcpy(dst + (size_t)b * len * w, src + ((size_t)b * n + start) * w, sizeof(float) * (size_t)len * w);
}

/* The options of one (query chunk, key chunk) tile: the caller's masks cut
 * to the tile, causal and window turned into a keep mask on global
 * positions. Returns 0 when no (query, key) pair of the tile is allowed by
 * position (the tile is skipped), 1 otherwise; *fail on allocation
 * failure. The tile owns keep/add/kk/ka (free them). */
typedef struct {
    mha_options o;
    uint8_t *keep, *kk;
    float *add, *ka;
} tile_opts;

/* Whether query position p may attend key `key` by position alone: the
 * statement of core/mask.c's rule (causal, the window, the chunk,
 * StreamingLLM's sink keys kept besides the left edge) on global positions. */
static int pair_allowed(const mha_options *g, long p, long key) {
    if ((g->causal && key > p) || (g->window_right >= 0 && key > p + g->window_right)) return 0;
    const long C = g->chunk_size; /* Llama 4: one chunk (floor division: p may be < 0) */
    if (C > 0 && (p >= 0 ? p / C : -((-p + C - 1) / C)) != key / C) return 0;
    return !(g->window_left >= 0 && key < p - g->window_left) || key < g->sink_tokens;
}

static int tile_make(tile_opts *t, const mha_options *g, int B, int T, int S, int i0, int Tc, int j0,
                     int Sc, int *fail) {
    memset(t, 0, sizeof *t);
    t->o = mha_options_default();
    t->o.scale = g->scale;
    const long shift = g->align == MHA_ALIGN_BOTTOM_RIGHT ? (long)S - T : 0;
    int any = 0, all = 1;
    for (int i = 0; i < Tc; i++)
        for (int j = 0; j < Sc; j++) {
            int ok = pair_allowed(g, i0 + i + shift, j0 + j);
            any |= ok, all &= ok;
        }
    if (!any) return 0;
    const mha_mask *km = &g->keep_mask, *am = &g->additive_mask;
    const size_t tile = (size_t)Tc * Sc;
    if (!all || km->data) {
        int Bm = km->data ? km->batch : 1, Hm = km->data ? km->heads : 1;
        if (!(t->keep = malloc((size_t)Bm * Hm * tile))) return *fail = 1, 1;
        for (int bh = 0; bh < Bm * Hm; bh++)
            for (int i = 0; i < Tc; i++)
                for (int j = 0; j < Sc; j++) {
                    int ok = pair_allowed(g, i0 + i + shift, j0 + j);
                    if (ok && km->data) ok = ((const uint8_t *)km->data)[((size_t)bh * T + i0 + i) * S + j0 + j] != 0;
                    t->keep[(size_t)bh * tile + (size_t)i * Sc + j] = (uint8_t)ok;
                }
        t->o.keep_mask = (mha_mask){t->keep, Bm, Hm};
    }
    if (am->data) {
        if (!(t->add = malloc(sizeof(float) * (size_t)am->batch * am->heads * tile))) return *fail = 1, 1;
        for (int bh = 0; bh < am->batch * am->heads; bh++)
            for (int i = 0; i < Tc; i++)
                memcpy(t->add + (size_t)bh * tile + (size_t)i * Sc,
                       (const float *)am->data + ((size_t)bh * T + i0 + i) * S + j0, sizeof(float) * Sc);
        t->o.additive_mask = (mha_mask){t->add, am->batch, am->heads};
    }
    if (g->key_keep) {
        if (!(t->kk = malloc((size_t)B * Sc))) return *fail = 1, 1;
        for (int b = 0; b < B; b++) memcpy(t->kk + (size_t)b * Sc, g->key_keep + (size_t)b * S + j0, (size_t)Sc);
        t->o.key_keep = t->kk;
    }
    if (g->key_additive) {
        if (!(t->ka = malloc(sizeof(float) * B * Sc))) return *fail = 1, 1;
        take_rows(t->ka, g->key_additive, B, S, j0, Sc, 1);
        t->o.key_additive = t->ka;
    }
    return 1;
}

static void tile_free(tile_opts *t) { free(t->keep), free(t->kk), free(t->add), free(t->ka); }

/* z (B,Tc,h*d_v), lse (B,h,Tc) of one query chunk merged with the tile's
 * partial (zt, lt), in place. */
static mha_status merge_into(float *z, float *lse, const float *zt, const float *lt, int B, int Tc, int h, int d_v) {
    const float *zs[2] = {z, zt}, *ls[2] = {lse, lt};
    return mha_attention_merge(z, lse, zs, ls, 2, B, Tc, h, d_v);
}

/* Floats of rank p's K/V block: both key chunks' K then V. */
static size_t block_floats(int p, int B, int S, int P, const mha_config *c) {
    int st[2], len[2];
    mha_mpi_chunks_of(st, len, S, p, P);
    return (size_t)B * (len[0] + len[1]) * c->n_kv_heads * (c->d_k + c->d_v);
}

/* Rank 0: dst (outer, B, n, w) gets rank p's rows src (outer, B, nl, w)
 * at its two chunks' places. */
static void place_rows(float *dst, const float *src, int p, int outer, int B, int n, int P, int w) {
    int st[2], len[2];
    mha_mpi_chunks_of(st, len, n, p, P);
    const int nl = len[0] + len[1];
    for (int o = 0; o < outer; o++)
        for (int b = 0; b < B; b++)
            for (int k = 0, off = 0; k < 2; off += len[k], k++)
                memcpy(dst + (((size_t)o * B + b) * n + st[k]) * w, src + (((size_t)o * B + b) * nl + off) * w,
                       sizeof(float) * (size_t)len[k] * w);
}

/* Gathers every rank's rows (outer, B, Tl_p, w) into dst (outer, B, T, w)
 * on rank 0. */
static mha_status gather_rows(float *dst, const float *mine, int outer, int B, int T, int w, MPI_Comm comm) {
    int rank, P;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &P);
    int *counts = malloc(sizeof(int) * 2 * (size_t)P), *displs = counts ? counts + P : NULL;
    size_t total = (size_t)outer * B * T * w;
    float *all = rank == 0 ? malloc(sizeof(float) * (total ? total : 1)) : NULL;
    int ok = counts && (rank != 0 || all);
    MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, comm);
    if (!ok) {
        free(counts), free(all);
        return mha_mpi_fail(MHA_E_NOMEM, "no memory to gather the output rows (%zu floats)", total);
    }
    for (int p = 0, d = 0; p < P; p++) {
        int st[2], len[2];
        mha_mpi_chunks_of(st, len, T, p, P);
        counts[p] = outer * B * (len[0] + len[1]) * w, displs[p] = d, d += counts[p];
    }
    MPI_Gatherv(mine, counts[rank], MPI_FLOAT, all, counts, displs, MPI_FLOAT, 0, comm);
    for (int p = 0; rank == 0 && p < P; p++) place_rows(dst, all + displs[p], p, outer, B, T, P, w);
    free(counts), free(all);
    return MHA_OK;
}

/* Interventions on this rank's rows z (rows, h*d_v); MEAN averages over
 * every rank's rows (rows_total), so it is one allreduce. REPLACE reads the
 * rank's rows of its (B,T,d_v) value. */
static mha_status intervene(float *z, const mha_intervention *ivs, int h, int d_v, int B, int T, int Tl,
                            const int qs[2], const int ql[2], MPI_Comm comm) {
    const size_t rows = (size_t)B * Tl, zw = (size_t)h * d_v;
    double *mean = calloc((size_t)h * d_v, sizeof(double));
    float *val = malloc(sizeof(float) * rows * d_v);
    int ok = mean && val;
    MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, comm);
    mha_status s = ok ? MHA_OK : mha_mpi_fail(MHA_E_NOMEM, "no memory for the interventions' means");
    for (int r = 0; ok && r < h; r++)
        for (size_t t = 0; ivs[r].op == MHA_HEAD_MEAN && t < rows; t++)
            for (int e = 0; e < d_v; e++) mean[(size_t)r * d_v + e] += z[t * zw + (size_t)r * d_v + e];
    if (ok) MPI_Allreduce(MPI_IN_PLACE, mean, h * d_v, MPI_DOUBLE, MPI_SUM, comm);
    for (int r = 0; ok && !s && r < h; r++) {
        mha_intervention iv = ivs[r];
        if (iv.op == MHA_HEAD_MEAN) {
            for (size_t t = 0; t < rows; t++)
                for (int e = 0; e < d_v; e++) z[t * zw + (size_t)r * d_v + e] = (float)(mean[(size_t)r * d_v + e] / ((double)B * T));
            continue;
        }
        if (iv.op == MHA_HEAD_REPLACE) {
            for (int b = 0; b < B; b++)
                for (int k = 0, off = 0; k < 2; off += ql[k], k++)
                    memcpy(val + ((size_t)b * Tl + off) * d_v, iv.value + ((size_t)b * T + qs[k]) * d_v,
                           sizeof(float) * (size_t)ql[k] * d_v);
            iv.value = val;
        }
        if (iv.op != MHA_HEAD_KEEP && (s = mha_head_intervene(z, &iv, r, h, (int)rows, d_v)))
            s = mha_mpi_fail(s, "%s", mha_last_error());
    }
    free(mean), free(val);
    return s;
}

/* Gated attention on this rank's rows: z (B, Tl, zw) *= sigmoid(x_r W_G
 * + b_G), x_r (B, Tl, D) the rank's rows of x (its query chunks qs/ql),
 * each row gated by its own query's input. */
static mha_status gate_rows(float *z, const float *x, const mha_weights *w, int B, int T, int D, int zw,
                            const int qs[2], const int ql[2]) {
    const int Tl = ql[0] + ql[1];
    const size_t rows = (size_t)B * Tl;
    float *xr = malloc(sizeof(float) * rows * D), *gt = malloc(sizeof(float) * rows * zw); // (B,Tl,D), (B,Tl,zw)
    mha_status s = xr && gt ? MHA_OK : mha_mpi_fail(MHA_E_NOMEM, "no memory for the output gate of %zu rows", rows);
    for (int b = 0; !s && b < B; b++)
        for (int k = 0, off = 0; k < 2; off += ql[k], k++)
            memcpy(xr + ((size_t)b * Tl + off) * D, x + ((size_t)b * T + qs[k]) * D, sizeof(float) * (size_t)ql[k] * D);
    if (!s && (s = mha_project_out(gt, xr, w->w_g, w->b_g, (int)rows, D, zw))) s = mha_mpi_fail(s, "%s", mha_last_error());
    for (size_t i = 0; !s && i < rows * zw; i++) z[i] *= 1.0f / (1.0f + expf(-gt[i]));
    free(xr), free(gt);
    return s;
}

/* What the ring cannot do for this layer and these options, in words a
 * user of either the C API or `mha-mpi run` can act on; "" when none. The
 * ring attends projected q and k (mha_attend_lse), so variants that act on
 * q, k or a head's scores are not applied there. */
static void ring_limits(char *msg, size_t cap, const mha_config *c, const mha_options *g) {
    const char *what = c->rope.pairing ? "RoPE" : c->alibi ? "ALiBi" : c->sinks ? "attention sinks"
                       : c->qk_norm ? "QK-norm" : c->temperature_floor ? "query temperature" : NULL;
    if (what)
        snprintf(msg, cap, "--split sequence (mha_mpi_forward_sequence) does not support the layer's %s; expected "
                 "--split heads (mha_mpi_forward_heads)", what);
    else if (g->bf16_matmul)
        snprintf(msg, cap, "--split sequence (mha_mpi_forward_sequence): options.bf16_matmul = %d is not supported "
                 "(the ring projects in fp32); expected 0, or --split heads (mha_mpi_forward_heads)", g->bf16_matmul);
    else if (g->dropout_p != 0.0f)
        snprintf(msg, cap, "--split sequence (mha_mpi_forward_sequence): options.dropout_p = %g is not supported "
                 "(training's dropout draws by the whole layer's rows); expected 0", (double)g->dropout_p);
    else if (g->cu_seqlens || g->n_seqs)
        snprintf(msg, cap, "--split sequence (mha_mpi_forward_sequence): options.cu_seqlens (packed sequences) is not "
                 "supported (the ring cuts the rows by position); expected NULL, or --split heads "
                 "(mha_mpi_forward_heads)");
}

/* The first non-finite entry of this rank's rows of an input, named by
 * its place in the whole (B, n, w) array; "" when all are finite. */
static void check_rows(char *msg, size_t cap, const float *a, const char *name, int B, int n, int w,
                       const int st[2], const int len[2]) {
    for (int b = 0; b < B; b++)
        for (int k = 0; k < 2; k++)
            for (size_t i = (size_t)(b * (size_t)n + st[k]) * w; i < ((size_t)b * n + st[k] + len[k]) * w; i++)
                if (!isfinite(a[i])) {
                    snprintf(msg, cap, "%s[%d][%d][%d] = %g; expected finite inputs", name, b, (int)(i / w % n),
                             (int)(i % w), a[i]);
                    return;
                }
}

/* The masks as mha_forward checks them, whole (every rank holds them):
 * their batch and heads, then an additive entry NaN or +inf, named by its
 * index in the whole array. Each tile checks only its own part: a NaN in
 * a tile the causal mask skips ran with MHA_OK, and an error named the
 * tile's index. "" when they are fine; else *s. */
static void check_masks(char *msg, size_t cap, mha_status *s, const mha_options *g, int B, int T, int S, int h) {
    const mha_mask *m[2] = {&g->keep_mask, &g->additive_mask};
    const char *name[2] = {"keep_mask", "additive_mask"};
    for (int k = 0; k < 2; k++) {
        if (!m[k]->data) continue;
        if (m[k]->batch != 1 && m[k]->batch != B)
            *s = MHA_E_SHAPE, snprintf(msg, cap, "%s.batch=%d; expected 1 (broadcast) or B=%d", name[k], m[k]->batch, B);
        else if (m[k]->heads != 1 && m[k]->heads != h)
            *s = MHA_E_SHAPE, snprintf(msg, cap, "%s.heads=%d; expected 1 (broadcast) or n_heads=%d", name[k], m[k]->heads, h);
        if (*msg) return;
    }
    const float *a[2] = {g->additive_mask.data, g->key_additive};
    const size_t n[2] = {g->additive_mask.data ? (size_t)g->additive_mask.batch * g->additive_mask.heads * T * S : 0,
                         (size_t)B * S};
    const char *an[2] = {"additive_mask", "key_additive"};
    for (int k = 0; k < 2; k++)
        for (size_t i = 0; a[k] && i < n[k]; i++)
            if (isnan(a[k][i]) || a[k][i] == INFINITY) {
                *s = MHA_E_NONFINITE, snprintf(msg, cap, "%s[%zu] = %g; expected a finite number or -inf", an[k], i,
                                               (double)a[k][i]);
                return;
            }
}

mha_status mha_mpi_forward_sequence(const mha_layer *layer, float *y, const mha_capture *cap,
                                    const float *x, const float *kv, int B, int T, int S,
                                    const mha_options *opt, MPI_Comm comm, mha_mpi_stats *stats) {
    int rank, P;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &P);
    double t0 = MPI_Wtime(), busy = 0.0;
    const int bad = !layer || !x || (rank == 0 && !y);
    mha_status s0 = mha_mpi_agree(comm, bad ? MHA_E_ARG : MHA_OK,
                                  "mha_mpi_forward_sequence: layer or x is NULL, or y on rank 0; expected them given");
    if (s0) return s0;
    const mha_options g = opt ? *opt : mha_options_default();
    const mha_config *c = mha_layer_config(layer);
    const int h = c->n_heads, h_kv = c->n_kv_heads, d_k = c->d_k, d_v = c->d_v, D = c->d_model;
    const int self = kv == NULL, d_in = self ? D : c->d_kv_in;
    const int want_z = cap && cap->z, want_c = cap && cap->contributions;
    const long long same[] = {B, T, S, D, h, h_kv, d_k, d_v, self, want_z, want_c, g.causal, (long long)g.align,
                              (long long)g.masked_row, g.keep_mask.data != NULL, g.additive_mask.data != NULL,
                              g.key_keep != NULL, g.key_additive != NULL, g.interventions != NULL,
                              g.window_left, g.window_right, g.sink_tokens, g.chunk_size,
                              mha_mpi_call_checksum(c, mha_layer_weights_dtype(layer), &g, h)};
    const char *names[] = {"B", "T", "S", "d_model", "h", "h_kv", "d_k", "d_v", "self-attention", "--save-z",
                           "--save-contributions", "causal", "causal alignment", "masked rows", "attn_mask (bool)",
                           "attn_mask (float)", "key padding (bool)", "key padding (float)", "--ablate",
                           "window_left", "window_right", "sink_tokens", "chunk_size", MHA_MPI_CALL_CHECKSUM_NAME};
    mha_status s = mha_mpi_check_same(comm, same, (int)(sizeof same / sizeof same[0]), names);
    if (s) return s;
    char msg[512] = "";
    /* the largest single MPI message: a K/V block, or one gather of y, Z or the contributions (int counts) */
    const double biggest = fmax(fmax((double)B * S * h_kv * (d_k + d_v), (double)B * T * D),
                                fmax(want_z ? (double)B * T * h * d_v : 0.0, want_c ? (double)h * B * T * D : 0.0));
    if (B < 1)
        s = MHA_E_SHAPE, snprintf(msg, sizeof msg, "mha_mpi_forward_sequence: B=%d; expected >= 1", B);
    else if (T < 2 * P || S < 2 * P)
        s = MHA_E_SHAPE, snprintf(msg, sizeof msg, "--split sequence over P=%d ranks cuts T=%d queries and S=%d keys into %d chunks; expected T >= %d and S >= %d", P, T, S, 2 * P, 2 * P, 2 * P);
    else if (biggest > INT_MAX)
        s = MHA_E_SHAPE, snprintf(msg, sizeof msg, "mha_mpi_forward_sequence: B=%d T=%d S=%d give %.0f floats in one "
                                  "message (a K/V block, or a gather of y or a capture); expected at most %d (MPI's "
                                  "int count)", B, T, S, biggest, INT_MAX);
    else if (cap && cap->probs)
        s = MHA_E_UNSUPPORTED, snprintf(msg, sizeof msg, "--split sequence does not capture attention probabilities (each rank sees one key block at a time); use --split heads");
    else if (self && S != T)
        s = MHA_E_SHAPE, snprintf(msg, sizeof msg, "self-attention with S=%d != T=%d; expected kv (B,S,d_kv_in)", S, T);
    else if (c->d_v_in != d_in)
        s = MHA_E_UNSUPPORTED, snprintf(msg, sizeof msg, "--split sequence needs one key/value source (d_v_in=%d, key source width %d)", c->d_v_in, d_in);
    else if (g.sink_tokens < 0 || (g.sink_tokens > 0 && g.window_left < 0)) /* mha_forward's rule */
        s = MHA_E_ARG, snprintf(msg, sizeof msg, "options.sink_tokens=%d with window_left=%d; expected 0, or > 0 with a window (window_left >= 0)", g.sink_tokens, g.window_left);
    else if (g.chunk_size < 0 || (g.chunk_size > 0 && g.sink_tokens > 0))
        s = MHA_E_ARG, snprintf(msg, sizeof msg, "options.chunk_size=%d with sink_tokens=%d; expected 0 (none), or > 0 without sink tokens", g.chunk_size, g.sink_tokens);
    if (!s) ring_limits(msg, sizeof msg, c, &g);
    if (!s && *msg) s = MHA_E_UNSUPPORTED;
    if ((s = mha_mpi_agree(comm, s, msg))) return s;

    // --- this rank's rows: query chunks qs/ql of T, key chunks ks/kl of S
    int qs[2], ql[2], ks[2], kl[2];
    mha_mpi_chunks_of(qs, ql, T, rank, P);
    mha_mpi_chunks_of(ks, kl, S, rank, P);
    check_rows(msg, sizeof msg, x, "x", B, T, D, qs, ql);
    if (!*msg && !self) check_rows(msg, sizeof msg, kv, "kv", B, S, d_in, ks, kl);
    s = *msg ? MHA_E_NONFINITE : MHA_OK;
    if (!*msg) check_masks(msg, sizeof msg, &s, &g, B, T, S, h);
    if (!*msg) s = mha_mpi_check_interventions(msg, sizeof msg, g.interventions, h, (size_t)B * T, d_v);
    if ((s = mha_mpi_agree(comm, s, msg))) return s;
    const int Tl = ql[0] + ql[1], qw = h * d_k, kw = h_kv * d_k, vw = h_kv * d_v, zw = h * d_v;
    size_t most = 0;
    for (int p = 0; p < P; p++)
        if (block_floats(p, B, S, P, c) > most) most = block_floats(p, B, S, P, c);
    const int Tmax = ql[0] > ql[1] ? ql[0] : ql[1];
    const size_t rows = (size_t)B * Tl;
    float *buf = mha_mpi_alloc_fault(comm) ? NULL :
        malloc(sizeof(float) * (rows * qw + 2 * most + rows * zw + (size_t)B * h * Tl + (size_t)B * Tmax * (zw + h) +
                                (size_t)B * (S > T ? S : T) * (d_in > zw ? d_in : zw) + rows * D));
    if (!buf) {
        s = MHA_E_NOMEM, snprintf(msg, sizeof msg, "no memory for this rank's Q, K/V blocks and Z (B=%d, %d rows)", B, Tl);
        return mha_mpi_agree(comm, s, msg);
    }
    float *q = buf;                        // (B,Tl) rows in two chunks: chunk k is (B,ql[k],h*d_k)
    float *blk[2] = {q + rows * qw, q + rows * qw + most}; // K/V blocks: [K0|K1|V0|V1]
    float *z = blk[1] + most;              // chunk k: (B,ql[k],h*d_v)
    float *lse = z + rows * zw;            // chunk k: (B,h,ql[k])
    float *zt = lse + (size_t)B * h * Tl;  // (B,Tmax,h*d_v) one tile's partial
    float *lt = zt + (size_t)B * Tmax * zw;    // (B,h,Tmax)
    float *rowbuf = lt + (size_t)B * h * Tmax; // (B, rows, width) staging
    float *yl = rowbuf + (size_t)B * (S > T ? S : T) * (d_in > zw ? d_in : zw); // (B,Tl,D)

    // --- projections of this rank's rows: Q = X W_Q + b_Q, K/V = Xkv W + b
    double tc = MPI_Wtime();
    mha_weights w;
    mha_layer_get_weights(layer, &w);
    const float *src = self ? x : kv;
    float *qk = q, *kk = blk[0], *vk = blk[0] + (size_t)B * (kl[0] + kl[1]) * kw;
    for (int k = 0; k < 2 && !s; k++) {
        take_rows(rowbuf, x, B, T, qs[k], ql[k], D);
        s = mha_project_out(qk, rowbuf, w.w_q, w.b_q, B * ql[k], D, qw);
        qk += (size_t)B * ql[k] * qw;
        take_rows(rowbuf, src, B, S, ks[k], kl[k], d_in);
        if (!s) s = mha_project_out(kk, rowbuf, w.w_k, w.b_k, B * kl[k], d_in, kw);
        if (!s) s = mha_project_out(vk, rowbuf, w.w_v, w.b_v, B * kl[k], d_in, vw);
        kk += (size_t)B * kl[k] * kw, vk += (size_t)B * kl[k] * vw;
    }
    if (c->clip_qkv != 0.0f) /* OLMo 1, DBRX, MPT: this rank's Q, K, V clamped before they travel */
        clip_rows(q, rows * qw, blk[0], (size_t)B * (kl[0] + kl[1]) * (kw + vw), c->clip_qkv);
    for (size_t i = 0; i < rows * zw; i++) z[i] = 0.0f;
    for (size_t i = 0; i < (size_t)B * h * Tl; i++) lse[i] = -INFINITY;
    busy += MPI_Wtime() - tc;
    if (s) snprintf(msg, sizeof msg, "%s", mha_last_error());
    if ((s = mha_mpi_agree(comm, s, msg))) return free(buf), s;

    // --- the ring: attend the block in hand while the next one arrives
    mha_config ca = *c;
    ca.add_bias_kv = ca.add_zero_attn = 0, ca.clip_qkv = 0.0f; /* clamped above */
    const int right = (rank + 1) % P, left = (rank + P - 1) % P;
    double sent = 0.0;
    for (int step = 0; step < P; step++) {
        const int owner = (rank - step + P) % P, next = (owner + P - 1) % P;
        MPI_Request req[2];
        int nreq = 0;
        if (step < P - 1) {
            size_t nsend = block_floats(owner, B, S, P, c), nrecv = block_floats(next, B, S, P, c);
            MPI_Irecv(blk[1], (int)nrecv, MPI_FLOAT, left, step, comm, &req[nreq++]);
            MPI_Isend(blk[0], (int)nsend, MPI_FLOAT, right, step, comm, &req[nreq++]);
            sent += (double)nsend * sizeof(float);
        }
        tc = MPI_Wtime();
        int os[2], ol[2];
        mha_mpi_chunks_of(os, ol, S, owner, P);
        const float *kb = blk[0], *vb = blk[0] + (size_t)B * (ol[0] + ol[1]) * kw;
        for (int kk2 = 0; kk2 < 2; kb += (size_t)B * ol[kk2] * kw, vb += (size_t)B * ol[kk2] * vw, kk2++) {
            float *qc = q, *zc = z, *lc = lse;
            for (int kq = 0; kq < 2 && !s; kq++) {
                tile_opts t;
                int fail = 0;
                if (tile_make(&t, &g, B, T, S, qs[kq], ql[kq], os[kk2], ol[kk2], &fail)) {
                    if (fail) s = mha_mpi_fail(MHA_E_NOMEM, "no memory for the masks of one tile");
                    if (!s && (s = mha_attend_lse(&ca, zt, lt, qc, kb, vb, B, ql[kq], ol[kk2], &t.o)))
                        s = mha_mpi_fail(s, "%s", mha_last_error());
                    if (!s && (s = merge_into(zc, lc, zt, lt, B, ql[kq], h, d_v))) /* an lse of +inf */
                        s = mha_mpi_fail(s, "%s: the scores of a tile overflow fp32 (|q.k| x scale near 3.4e38) "
                                         "in the ring's merge; expected smaller inputs or weights, or --split heads",
                                         mha_last_error());
                }
                tile_free(&t);
                qc += (size_t)B * ql[kq] * qw, zc += (size_t)B * ql[kq] * zw, lc += (size_t)B * h * ql[kq];
            }
        }
        busy += MPI_Wtime() - tc;
        MPI_Waitall(nreq, req, MPI_STATUSES_IGNORE); /* a failed rank keeps passing blocks: no one waits forever */
        float *swap = blk[0];
        blk[0] = blk[1], blk[1] = swap;
    }
    if ((s = mha_mpi_agree(comm, s, s ? mha_mpi_last_error() : NULL))) return free(buf), s;

    // --- the extra keys (bias_k/bias_v row, zero row), never masked: one more part
    const int ne = c->add_bias_kv + c->add_zero_attn;
    if (ne) {
        float *ke = blk[1], *ve = ke + (size_t)B * ne * kw; /* (B,ne,h_kv*d_k), (B,ne,h_kv*d_v) */
        memset(ke, 0, sizeof(float) * (size_t)B * ne * (kw + vw));
        for (int b = 0; c->add_bias_kv && b < B; b++) {
            memcpy(ke + (size_t)b * ne * kw, w.bias_k, sizeof(float) * kw);
            memcpy(ve + (size_t)b * ne * vw, w.bias_v, sizeof(float) * vw);
        }
        mha_options oe = mha_options_default();
        oe.scale = g.scale;
        float *qc = q, *zc = z, *lc = lse;
        for (int kq = 0; kq < 2 && !s; kq++) {
            s = mha_attend_lse(&ca, zt, lt, qc, ke, ve, B, ql[kq], ne, &oe);
            if (!s) s = merge_into(zc, lc, zt, lt, B, ql[kq], h, d_v);
            qc += (size_t)B * ql[kq] * qw, zc += (size_t)B * ql[kq] * zw, lc += (size_t)B * h * ql[kq];
        }
        if (s) s = mha_mpi_fail(s, "%s", mha_last_error());
        if ((s = mha_mpi_agree(comm, s, s ? mha_mpi_last_error() : NULL))) return free(buf), s;
    }

    // --- Z in (B,Tl,h*d_v) row order; rows with no allowed key: 0 or NaN
    float *zl = rowbuf; /* chunk-major (chunk, B, Tc) -> (B, Tl) */
    {
        float *zc = z, *lc = lse;
        for (int k = 0, off = 0; k < 2; off += ql[k], zc += (size_t)B * ql[k] * zw, lc += (size_t)B * h * ql[k], k++)
            for (int b = 0; b < B; b++)
                for (int i = 0; i < ql[k]; i++) {
                    float *dst = zl + ((size_t)b * Tl + off + i) * zw;
                    memcpy(dst, zc + ((size_t)b * ql[k] + i) * zw, sizeof(float) * zw);
                    for (int r = 0; g.masked_row == MHA_MASKED_ROW_NAN && r < h; r++)
                        if (lc[((size_t)b * h + r) * ql[k] + i] == -INFINITY)
                            for (int e = 0; e < d_v; e++) dst[(size_t)r * d_v + e] = NAN;
                }
    }
    if (c->output_gate) { /* before the interventions, as mha_forward; agreed: MEAN's allreduce follows */
        tc = MPI_Wtime();
        s = gate_rows(zl, x, &w, B, T, D, zw, qs, ql);
        busy += MPI_Wtime() - tc;
        if ((s = mha_mpi_agree(comm, s, s ? mha_mpi_last_error() : NULL))) return free(buf), s;
    }
    if (g.interventions)
        s = intervene(zl, g.interventions, h, d_v, B, T, Tl, qs, ql, comm);
    if ((s = mha_mpi_agree(comm, s, s ? mha_mpi_last_error() : NULL))) return free(buf), s;

    // --- Y = Z W_O + b_O for this rank's rows, then rank 0 gathers them
    tc = MPI_Wtime();
    s = mha_project_out(yl, zl, w.w_o, w.b_o, (int)rows, zw, D);
    float *cl = NULL;
    if (!s && want_c) {
        cl = malloc(sizeof(float) * (size_t)h * rows * D); // (h,B,Tl,D)
        s = !cl ? MHA_E_NOMEM : mha_head_contributions(cl, zl, w.w_o, h, (int)rows, d_v, D);
    }
    busy += MPI_Wtime() - tc;
    if (s) snprintf(msg, sizeof msg, "%s", s == MHA_E_NOMEM && !cl ? "no memory for the contributions" : mha_last_error());
    if (!(s = mha_mpi_agree(comm, s, msg))) {
        s = gather_rows(y, yl, 1, B, T, D, comm);
        if (!s && want_z) s = gather_rows(cap->z, zl, 1, B, T, zw, comm);
        if (!s && want_c) s = gather_rows(cap->contributions, cl, h, B, T, D, comm);
        s = mha_mpi_agree(comm, s, s ? mha_mpi_last_error() : NULL);
    }
    if (stats) {
        stats->sent_bytes = sent;
        stats->formula_bytes = (double)(P - 1) * B * ((double)S / P) * h_kv * (d_k + d_v) * sizeof(float);
        stats->compute_s = busy;
        stats->total_s = MPI_Wtime() - t0;
    }
    free(cl), free(buf);
    return s;
}
