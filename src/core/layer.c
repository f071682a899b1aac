/* layer.c — configuration, create/free, weights, head labels, permutation.
 * Legend: h heads, h_kv kv heads, d_k, d_v, d_model, d_kv_in (see mha.h). */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compute/workspace.h"
#include "core/core.h"
#include "core/variants.h"
#include "core/weight_store.h"

/* Largest single dimension accepted; keeps every product well inside size_t
 * and every h*d product inside int. */
#define MHA_MAX_DIM (1 << 20)
/* Head counts are small in practice; the cap lets permutation scratch live
 * on the stack. */
#define MHA_MAX_HEADS 4096

/* ------------------------------------------------------------ config */

mha_config mha_config_default(int d_model, int n_heads) {
    mha_config c;
    memset(&c, 0, sizeof c);
    c.d_model = d_model;
    c.n_heads = n_heads;
    c.bias = 1;
    return c;
}

static mha_status check_dim(const char *name, int value, int allow_zero) {
    if (value < (allow_zero ? 0 : 1) || value > MHA_MAX_DIM)
        return mha_fail(MHA_E_ARG, "%s=%d is out of range; expected %s1..%d", name, value,
                        allow_zero ? "0 (default) or " : "", MHA_MAX_DIM);
    return MHA_OK;
}

static mha_status check_flag(const char *name, int value) {
    if (value != 0 && value != 1)
        return mha_fail(MHA_E_ARG, "%s=%d; expected 0 or 1", name, value);
    return MHA_OK;
}

mha_status mha_config_resolve(mha_config *out, const mha_config *in) {
    if (!out || !in) return mha_fail(MHA_E_ARG, "mha_config_resolve: NULL config pointer");
    mha_config c = *in;
    mha_status s;
    if ((s = check_dim("d_model", c.d_model, 0)) || (s = check_dim("n_heads", c.n_heads, 0)) ||
        (s = check_dim("n_kv_heads", c.n_kv_heads, 1)) || (s = check_dim("d_k", c.d_k, 1)) ||
        (s = check_dim("d_v", c.d_v, 1)) || (s = check_dim("d_kv_in", c.d_kv_in, 1)) || (s = check_dim("d_v_in", c.d_v_in, 1)) ||
        (s = check_flag("bias", c.bias)) || (s = check_flag("add_bias_kv", c.add_bias_kv)) ||
        (s = check_flag("add_zero_attn", c.add_zero_attn)))
        return s;
    if (c.d_model == 0) return mha_fail(MHA_E_ARG, "d_model=0; expected a positive width");
    if (c.n_heads == 0) return mha_fail(MHA_E_ARG, "n_heads=0; expected at least one head");
    if (c.n_heads > MHA_MAX_HEADS)
        return mha_fail(MHA_E_ARG, "n_heads=%d is out of range; expected 1..%d", c.n_heads, MHA_MAX_HEADS);
    if (c.n_kv_heads == 0) c.n_kv_heads = c.n_heads;
    if (c.n_kv_heads > c.n_heads || c.n_heads % c.n_kv_heads != 0)
        return mha_fail(MHA_E_ARG,
                        "n_kv_heads=%d does not divide n_heads=%d; expected a divisor "
                        "(%d for MHA, 1 for MQA, between for GQA)",
                        c.n_kv_heads, c.n_heads, c.n_heads);
    if (c.d_k == 0) {
        if (c.d_model % c.n_heads != 0)
            return mha_fail(MHA_E_ARG,
                            "n_heads=%d does not divide d_model=%d for equal-width heads; "
                            "pass d_k explicitly",
                            c.n_heads, c.d_model);
        c.d_k = c.d_model / c.n_heads;
    }
    if (c.d_v == 0) c.d_v = c.d_k;
    if (c.d_kv_in == 0) c.d_kv_in = c.d_model;
    if (c.d_v_in == 0) c.d_v_in = c.d_kv_in;
    if ((long long)c.n_heads * c.d_k > MHA_MAX_DIM * 16LL ||
        (long long)c.n_heads * c.d_v > MHA_MAX_DIM * 16LL)
        return mha_fail(MHA_E_ARG, "n_heads*d_k=%lld or n_heads*d_v=%lld is too large; expected <= %d",
                        (long long)c.n_heads * c.d_k, (long long)c.n_heads * c.d_v,
                        MHA_MAX_DIM * 16);
    if ((s = mha_variants_resolve(&c)) || (s = check_flag("output_gate", c.output_gate))) return s;
    *out = c;
    return MHA_OK;
}

/* ------------------------------------------------------------ weights */

/* The tensors of a layer, by the mha_weights member order. */
#define N_TENSORS 16

/* Which config switch a tensor belongs to (ALWAYS: every layer has it). */
typedef enum { ALWAYS, BIAS, BIAS_KV, ALIBI, SINKS, QK_NORM, GATE, GATE_BIAS } tensor_owner;

typedef struct {
    const char *name;
    size_t count;
    tensor_owner owner;
} weight_shape;

static const char *owner_flag(tensor_owner o) {
    static const char *f[] = {"", "bias", "add_bias_kv", "alibi", "sinks", "qk_norm", "output_gate",
                              "output_gate with bias"};
    return f[o];
}

static int owner_on(const mha_config *c, tensor_owner o) {
    switch (o) {
    case ALWAYS: return 1;
    case BIAS: return c->bias;
    case BIAS_KV: return c->add_bias_kv;
    case ALIBI: return c->alibi;
    case SINKS: return c->sinks;
    case QK_NORM: return c->qk_norm != MHA_QK_NORM_NONE;
    case GATE: return c->output_gate;
    case GATE_BIAS: return c->output_gate && c->bias;
    }
    return 0;
}

static void weight_shapes(const mha_config *c, weight_shape ws[N_TENSORS]) {
    size_t hk = (size_t)c->n_heads * c->d_k, hv = (size_t)c->n_heads * c->d_v;
    size_t gk = (size_t)c->n_kv_heads * c->d_k, gv = (size_t)c->n_kv_heads * c->d_v;
    size_t qn = c->qk_norm_per_head ? hk : (size_t)c->d_k, kn = c->qk_norm_per_head ? gk : (size_t)c->d_k;
    weight_shape t[N_TENSORS] = {
        {"w_q", (size_t)c->d_model * hk, ALWAYS}, {"w_k", (size_t)c->d_kv_in * gk, ALWAYS},
        {"w_v", (size_t)c->d_v_in * gv, ALWAYS}, {"w_o", hv * (size_t)c->d_model, ALWAYS},
        {"b_q", hk, BIAS}, {"b_k", gk, BIAS}, {"b_v", gv, BIAS}, {"b_o", (size_t)c->d_model, BIAS},
        {"bias_k", gk, BIAS_KV}, {"bias_v", gv, BIAS_KV},
        {"alibi_slopes", (size_t)c->n_heads, ALIBI}, {"sinks", (size_t)c->n_heads, SINKS},
        {"q_norm", qn, QK_NORM}, {"k_norm", kn, QK_NORM},
        {"w_g", c->output_gate ? (size_t)c->d_model * hv : 0, GATE}, {"b_g", c->output_gate ? hv : 0, GATE_BIAS},
    };
    memcpy(ws, t, sizeof t);
}

static float **layer_tensor(mha_layer *L, int i) {
    float **t[N_TENSORS] = {&L->w_q, &L->w_k, &L->w_v, &L->w_o, &L->b_q, &L->b_k, &L->b_v,
                            &L->b_o, &L->bias_k, &L->bias_v, &L->alibi_slopes, &L->sinks,
                            &L->q_norm, &L->k_norm, &L->w_g, &L->b_g};
    return t[i];
}

static const float *weights_member(const mha_weights *w, int i) {
    const float *m[N_TENSORS] = {w->w_q, w->w_k, w->w_v, w->w_o, w->b_q, w->b_k, w->b_v,
                                 w->b_o, w->bias_k, w->bias_v, w->alibi_slopes, w->sinks,
                                 w->q_norm, w->k_norm, w->w_g, w->b_g};
    return m[i];
}

/* What a tensor not given holds: the default ALiBi slopes, unit norm
 * weights, zeros for the rest. */
static void default_tensor(const mha_config *c, float *dst, const weight_shape *ws, int i) {
    if (!ws->count) return;
    if (i == 10) /* alibi_slopes */ mha_alibi_default_slopes(dst, c->n_heads);
    else if (ws->owner == QK_NORM) for (size_t e = 0; e < ws->count; e++) dst[e] = 1.0f;
    else memset(dst, 0, ws->count * sizeof(float));
}

/* Validates every source pointer and value before anything is copied, so
 * a failed call leaves the layer as it was. */
static mha_status validate_weights(const mha_config *c, const mha_weights *w) {
    weight_shape ws[N_TENSORS];
    weight_shapes(c, ws);
    for (int i = 0; i < N_TENSORS; i++) {
        const float *src = weights_member(w, i);
        int wanted = owner_on(c, ws[i].owner);
        /* ALiBi slopes may be left NULL: the paper's default */
        if (wanted && !src && ws[i].owner != ALIBI)
            return mha_fail(MHA_E_ARG, "weights.%s is NULL; expected %zu floats%s%s%s", ws[i].name,
                            ws[i].count, ws[i].owner ? " (config." : "", owner_flag(ws[i].owner),
                            ws[i].owner ? " is set)" : "");
        if (!wanted && src)
            return mha_fail(MHA_E_ARG, "weights.%s is given but config.%s is off; expected NULL",
                            ws[i].name, owner_flag(ws[i].owner));
        if (src) {
            mha_status s = mha_check_finite(src, ws[i].count, ws[i].name);
            if (s) return s;
        }
    }
    return MHA_OK;
}

static void copy_weights(mha_layer *L, const mha_weights *w) {
    weight_shape ws[N_TENSORS];
    weight_shapes(&L->cfg, ws);
    for (int i = 0; i < N_TENSORS; i++) {
        const float *src = w ? weights_member(w, i) : NULL;
        float *dst = *layer_tensor(L, i);
        if (src && ws[i].count) memcpy(dst, src, ws[i].count * sizeof(float));
        else default_tensor(&L->cfg, dst, &ws[i], i);
    }
}

/* A layer of resolved config c with every tensor allocated, none written. */
static mha_status layer_alloc(mha_layer **out, const mha_config *c) {
    mha_layer *L = calloc(1, sizeof *L);
    if (!L) return mha_fail(MHA_E_NOMEM, "mha_layer_create: no memory for the layer");
    L->cfg = *c;
    weight_shape ws[N_TENSORS];
    weight_shapes(c, ws);
    int ok = 1;
    for (int i = 0; i < N_TENSORS; i++) { /* a tensor of no element (no gate) stays NULL */
        *layer_tensor(L, i) = ws[i].count ? mha_alloc_large(ws[i].count * sizeof(float)) : NULL;
        ok = ok && (*layer_tensor(L, i) || !ws[i].count);
    }
    L->ws = mha_workspace_create();
    ok = ok && L->ws;
    int counts[MHA_N_BLOCKS] = {c->n_heads, c->n_kv_heads, c->n_kv_heads, c->n_heads, c->n_heads};
    for (int b = 0; b < MHA_N_BLOCKS; b++) {
        L->labels[b] = malloc((size_t)counts[b] * sizeof(int));
        ok = ok && L->labels[b];
        for (int i = 0; ok && i < counts[b]; i++) L->labels[b][i] = i;
    }
    if (!ok) {
        mha_layer_free(L);
        return mha_fail(MHA_E_NOMEM, "mha_layer_create: no memory for the weights");
    }
    *out = L;
    return MHA_OK;
}

mha_status mha_layer_create(mha_layer **out, const mha_config *cfg, const mha_weights *w) {
    if (!out) return mha_fail(MHA_E_ARG, "mha_layer_create: out is NULL");
    *out = NULL;
    mha_config c;
    mha_status s = mha_config_resolve(&c, cfg);
    if (s) return s;
    if (w && (s = validate_weights(&c, w))) return s;
    mha_layer *L;
    if ((s = layer_alloc(&L, &c))) return s;
    copy_weights(L, w);
    if ((s = mha_fast_prepare(L))) {
        mha_layer_free(L);
        return s;
    }
    *out = L;
    return MHA_OK;
}

mha_status mha_layer_alloc(mha_layer **out, const mha_config *cfg) {
    *out = NULL;
    mha_config c;
    mha_status s = mha_config_resolve(&c, cfg);
    if (s || (s = layer_alloc(out, &c))) return s;
    /* defaults for all but w_q, w_k, w_v, w_o (tensors 0..3), which the
     * caller overwrites: writing them here would touch every page twice */
    weight_shape ws[N_TENSORS];
    weight_shapes(&c, ws);
    for (int i = 4; i < N_TENSORS; i++) default_tensor(&c, *layer_tensor(*out, i), &ws[i], i);
    return MHA_OK;
}

void mha_layer_free(mha_layer *L) {
    if (!L) return;
    mha_fast_release(L);
    mha_wstore_free(L->wstore);
    for (int i = 0; i < N_TENSORS; i++) free(*layer_tensor(L, i));
    for (int b = 0; b < MHA_N_BLOCKS; b++) free(L->labels[b]);
    mha_workspace_free(L->ws);
    free(L);
}

mha_status mha_layer_begin(const mha_layer *L, int change, const char *fn) {
    atomic_int *calls = (atomic_int *)&L->calls; /* a heap object: const to readers only */
    int n = atomic_load(calls);
    do
        if (n < 0 || (change && n > 0))
            return mha_fail(MHA_E_ARG, "%s: another call is %s this layer right now; expected the calls that change "
                            "a layer (mha_layer_set_weights, _set_labels, _permute_heads, _permute_block, "
                            "_convert_weights) alone on it; nothing was done", fn, n < 0 ? "changing" : "using");
    while (!atomic_compare_exchange_weak(calls, &n, change ? -1 : n + 1));
    return MHA_OK;
}

mha_status mha_layer_end(const mha_layer *L, int change, mha_status s) {
    atomic_int *calls = (atomic_int *)&L->calls;
    if (change) atomic_store(calls, 0);
    else atomic_fetch_sub(calls, 1);
    return s;
}

static mha_status layer_set_weights_held(mha_layer *L, const mha_weights *w) {
    if (!L || !w) return mha_fail(MHA_E_ARG, "mha_layer_set_weights: NULL %s", L ? "weights" : "layer");
    mha_status s = validate_weights(&L->cfg, w);
    if (s) return s;
    /* bf16 / int8 layers keep their dtype: the new weights are converted
     * before anything changes, so a refused value leaves the layer as is */
    mha_wstore *store = NULL;
    const float *const src[MHA_N_MATS] = {w->w_q, w->w_k, w->w_v, w->w_o, w->w_g};
    if (L->wstore && (s = mha_wstore_build(&store, &L->cfg, L->wstore->dtype, src))) return s;
    copy_weights(L, w);
    return L->wstore ? mha_layer_adopt_wstore(L, store) : mha_fast_prepare(L);
}

mha_status mha_layer_set_weights(mha_layer *L, const mha_weights *w) {
    if (!L) return layer_set_weights_held(L, w);
    mha_status s = mha_layer_begin(L, 1, "mha_layer_set_weights");
    return s ? s : mha_layer_end(L, 1, layer_set_weights_held(L, w));
}

void mha_layer_get_weights(const mha_layer *L, mha_weights *v) {
    if (!L || !v) return;
    const mha_config *c = &L->cfg;
    v->w_q = L->w_q;
    v->w_k = L->w_k;
    v->w_v = L->w_v;
    v->w_o = L->w_o;
    v->b_q = c->bias ? L->b_q : NULL;
    v->b_k = c->bias ? L->b_k : NULL;
    v->b_v = c->bias ? L->b_v : NULL;
    v->b_o = c->bias ? L->b_o : NULL;
    v->bias_k = c->add_bias_kv ? L->bias_k : NULL;
    v->bias_v = c->add_bias_kv ? L->bias_v : NULL;
    v->alibi_slopes = c->alibi ? L->alibi_slopes : NULL;
    v->sinks = c->sinks ? L->sinks : NULL;
    v->q_norm = c->qk_norm ? L->q_norm : NULL;
    v->k_norm = c->qk_norm ? L->k_norm : NULL;
    v->w_g = c->output_gate ? L->w_g : NULL;
    v->b_g = c->output_gate && c->bias ? L->b_g : NULL;
}

const mha_config *mha_layer_config(const mha_layer *L) { return L ? &L->cfg : NULL; }

/* -------------------------------------------------------------- labels */

static const char *block_name(mha_block b) {
    static const char *names[MHA_N_BLOCKS] = {"Q", "K", "V", "O", "S"};
    return names[b];
}

static int block_count(const mha_layer *L, mha_block b) {
    return (b == MHA_BLOCK_K || b == MHA_BLOCK_V) ? L->cfg.n_kv_heads : L->cfg.n_heads;
}

static mha_status check_block(const mha_layer *L, mha_block b, const void *p, const char *fn) {
    if (!L || !p) return mha_fail(MHA_E_ARG, "%s: NULL %s", fn, L ? "array" : "layer");
    if ((int)b < 0 || (int)b >= MHA_N_BLOCKS)
        return mha_fail(MHA_E_ARG, "%s: block=%d; expected MHA_BLOCK_Q, _K, _V, _O or _S", fn, (int)b);
    return MHA_OK;
}

/* Checks that p[0..n) is a permutation of 0..n-1. */
static mha_status check_permutation(const int *p, int n, const char *what) {
    unsigned char *seen = calloc((size_t)n, 1);
    if (!seen) return mha_fail(MHA_E_NOMEM, "no memory to check %s", what);
    mha_status s = MHA_OK;
    for (int i = 0; i < n && !s; i++) {
        if (p[i] < 0 || p[i] >= n)
            s = mha_fail(MHA_E_ARG, "%s[%d]=%d is out of range; expected 0..%d", what, i, p[i], n - 1);
        else if (seen[p[i]]++)
            s = mha_fail(MHA_E_ARG, "%s[%d]=%d repeats an earlier entry; expected a permutation of 0..%d",
                         what, i, p[i], n - 1);
    }
    free(seen);
    return s;
}

/* check_block, then that p holds a permutation of the block's entries;
 * errors name p "<block> <noun>" ("Q labels", "K perm"). */
static mha_status check_block_permutation(const mha_layer *L, mha_block b, const int *p,
                                          const char *fn, const char *noun) {
    mha_status s = check_block(L, b, p, fn);
    if (s) return s;
    char what[32];
    snprintf(what, sizeof what, "%s %s", block_name(b), noun);
    return check_permutation(p, block_count(L, b), what);
}

static mha_status layer_labels_held(const mha_layer *L, mha_block b, int *labels) {
    mha_status s = check_block(L, b, labels, "mha_layer_labels");
    if (s) return s;
    memcpy(labels, L->labels[b], (size_t)block_count(L, b) * sizeof(int));
    return MHA_OK;
}

mha_status mha_layer_labels(const mha_layer *L, mha_block b, int *labels) {
    if (!L) return layer_labels_held(L, b, labels);
    mha_status s = mha_layer_begin(L, 0, "mha_layer_labels");
    return s ? s : mha_layer_end(L, 0, layer_labels_held(L, b, labels));
}

static mha_status layer_set_labels_held(mha_layer *L, mha_block b, const int *labels) {
    mha_status s = check_block_permutation(L, b, labels, "mha_layer_set_labels", "labels");
    if (s) return s;
    memcpy(L->labels[b], labels, (size_t)block_count(L, b) * sizeof(int));
    return MHA_OK;
}

mha_status mha_layer_set_labels(mha_layer *L, mha_block b, const int *labels) {
    if (!L) return layer_set_labels_held(L, b, labels);
    mha_status s = mha_layer_begin(L, 1, "mha_layer_set_labels");
    return s ? s : mha_layer_end(L, 1, layer_set_labels_held(L, b, labels));
}

/* --------------------------------------------------------- permutation */

/* Column blocks of fp32 w (rows, n*width); new block i = old block perm[i]. */
static void permute_column_blocks(float *w, int rows, int n, int width, const int *perm, void *tmp) {
    mha_permute_column_blocks(w, sizeof(float), rows, n, width, perm, tmp);
}

static void permute_labels(int *labels, int n, const int *perm) {
    int tmp[n];
    for (int i = 0; i < n; i++) tmp[i] = labels[perm[i]];
    memcpy(labels, tmp, (size_t)n * sizeof(int));
}

/* The bytes of the longest row permute_one moves for block kind b: W_O's
 * row blocks are one row of h*d_v*d_model (the compact forms' rows are no
 * longer than the fp32 ones). */
static size_t permute_row_bytes(const mha_layer *L, mha_block b) {
    const mha_config *c = &L->cfg;
    const size_t n = (size_t)block_count(L, b);
    switch (b) {
    case MHA_BLOCK_Q: /* W_G's column blocks (d_v) move with the query heads */
        return n * (c->output_gate && c->d_v > c->d_k ? c->d_v : c->d_k) * sizeof(float);
    case MHA_BLOCK_K: return n * c->d_k * sizeof(float);
    case MHA_BLOCK_V: return n * c->d_v * sizeof(float);
    case MHA_BLOCK_O: return n * c->d_v * c->d_model * sizeof(float);
    default: return n * sizeof(float);
    }
}

/* Moves one block kind without touching the others, through tmp
 * (permute_row_bytes of b): nothing here allocates, so a move is never
 * left half done. W_O's row blocks are column blocks of a single row of
 * length h*d_v*d_model. */
static void permute_one(mha_layer *L, mha_block b, const int *perm, void *tmp) {
    const mha_config *c = &L->cfg;
    int n = block_count(L, b);
    switch (b) {
    case MHA_BLOCK_Q:
        permute_column_blocks(L->w_q, c->d_model, n, c->d_k, perm, tmp);
        mha_wstore_permute(L, MHA_MAT_Q, c->d_model, n, c->d_k, perm, tmp);
        permute_column_blocks(L->b_q, 1, n, c->d_k, perm, tmp);
        if (c->qk_norm_per_head) permute_column_blocks(L->q_norm, 1, n, c->d_k, perm, tmp);
        if (c->output_gate) { /* head r's gate comes from its query's input, with it */
            permute_column_blocks(L->w_g, c->d_model, n, c->d_v, perm, tmp);
            mha_wstore_permute(L, MHA_MAT_G, c->d_model, n, c->d_v, perm, tmp);
            permute_column_blocks(L->b_g, 1, n, c->d_v, perm, tmp);
        }
        break;
    case MHA_BLOCK_K:
        permute_column_blocks(L->w_k, c->d_kv_in, n, c->d_k, perm, tmp);
        mha_wstore_permute(L, MHA_MAT_K, c->d_kv_in, n, c->d_k, perm, tmp);
        permute_column_blocks(L->b_k, 1, n, c->d_k, perm, tmp);
        permute_column_blocks(L->bias_k, 1, n, c->d_k, perm, tmp);
        if (c->qk_norm_per_head) permute_column_blocks(L->k_norm, 1, n, c->d_k, perm, tmp);
        break;
    case MHA_BLOCK_S:
        permute_column_blocks(L->alibi_slopes, 1, n, 1, perm, tmp);
        permute_column_blocks(L->sinks, 1, n, 1, perm, tmp);
        break;
    case MHA_BLOCK_V:
        permute_column_blocks(L->w_v, c->d_v_in, n, c->d_v, perm, tmp);
        mha_wstore_permute(L, MHA_MAT_V, c->d_v_in, n, c->d_v, perm, tmp);
        permute_column_blocks(L->b_v, 1, n, c->d_v, perm, tmp);
        permute_column_blocks(L->bias_v, 1, n, c->d_v, perm, tmp);
        break;
    case MHA_BLOCK_O:
        permute_column_blocks(L->w_o, 1, n, c->d_v * c->d_model, perm, tmp);
        mha_wstore_permute(L, MHA_MAT_O, 1, n, c->d_v * c->d_model, perm, tmp);
        break;
    }
    permute_labels(L->labels[b], n, perm);
}

/* Moves the block kinds kinds[0..n) by perms[k] as one transaction: the
 * scratch first, then the moves (which cannot fail), then the packed
 * weights built beside the old ones; when that fails, the moves are undone
 * by the inverse permutations, so a failure leaves the layer as it was. */
static mha_status permute_blocks(mha_layer *L, const mha_block *kinds, const int *const *perms, int n) {
    size_t bytes = 0;
    for (int k = 0; k < n; k++)
        if (permute_row_bytes(L, kinds[k]) > bytes) bytes = permute_row_bytes(L, kinds[k]);
    void *tmp = mha_alloc_large(bytes);
    if (!tmp) return mha_fail(MHA_E_NOMEM, "no memory to permute head blocks (%zu bytes); the layer is unchanged", bytes);
    for (int k = 0; k < n; k++) permute_one(L, kinds[k], perms[k], tmp);
    mha_status s = mha_fast_replace(L);
    for (int k = n - 1; s && k >= 0; k--) {
        int inv[MHA_MAX_HEADS];
        const int m = block_count(L, kinds[k]);
        for (int i = 0; i < m; i++) inv[perms[k][i]] = i;
        permute_one(L, kinds[k], inv, tmp);
    }
    free(tmp);
    return s;
}

static mha_status layer_permute_block_held(mha_layer *L, mha_block b, const int *perm) {
    mha_status s = check_block_permutation(L, b, perm, "mha_layer_permute_block", "perm");
    return s ? s : permute_blocks(L, &b, &perm, 1);
}

mha_status mha_layer_permute_block(mha_layer *L, mha_block b, const int *perm) {
    if (!L) return layer_permute_block_held(L, b, perm);
    mha_status s = mha_layer_begin(L, 1, "mha_layer_permute_block");
    return s ? s : mha_layer_end(L, 1, layer_permute_block_held(L, b, perm));
}

mha_status mha_kv_perm_from_heads(int *kv_perm, const int *perm, int h, int h_kv) {
    const int group = h / h_kv;
    mha_status s = check_permutation(perm, h, "perm");
    if (s) return s;
    /* The heads of new kv group g must all come from one old group; that
     * old group is the kv head that moves to position g. */
    for (int g = 0; g < h_kv; g++) {
        kv_perm[g] = perm[g * group] / group;
        for (int k = 1; k < group; k++)
            if (perm[g * group + k] / group != kv_perm[g])
                return mha_fail(MHA_E_ARG,
                                "perm[%d]=%d is in kv group %d but perm[%d]=%d is in kv group %d; "
                                "under GQA (%d query heads per kv head) a permutation must move "
                                "whole kv groups: each new group of %d consecutive heads must "
                                "come from one old group",
                                g * group, perm[g * group], kv_perm[g], g * group + k,
                                perm[g * group + k], perm[g * group + k] / group, group, group);
    }
    return MHA_OK;
}

static mha_status layer_permute_heads_held(mha_layer *L, const int *perm) {
    if (!L || !perm) return mha_fail(MHA_E_ARG, "mha_layer_permute_heads: NULL %s", L ? "perm" : "layer");
    int kv_perm[MHA_MAX_HEADS];
    mha_status s = mha_kv_perm_from_heads(kv_perm, perm, L->cfg.n_heads, L->cfg.n_kv_heads);
    if (s) return s;
    const mha_block kinds[5] = {MHA_BLOCK_Q, MHA_BLOCK_O, MHA_BLOCK_S, MHA_BLOCK_K, MHA_BLOCK_V};
    const int *const perms[5] = {perm, perm, perm, kv_perm, kv_perm};
    return permute_blocks(L, kinds, perms, 5);
}

mha_status mha_layer_permute_heads(mha_layer *L, const int *perm) {
    if (!L) return layer_permute_heads_held(L, perm);
    mha_status s = mha_layer_begin(L, 1, "mha_layer_permute_heads");
    return s ? s : mha_layer_end(L, 1, layer_permute_heads_held(L, perm));
}
