/* load_heads.c — a shard of a checkpoint: query heads [first, first+count)
 * and the kv heads they read, copied straight from the file's mapping
 * (column blocks of W_Q/W_K/W_V and their biases, of a gated layer's W_G
 * and b_G, row blocks of W_O), so
 * no buffer ever holds the whole layer and the other heads' bytes are
 * never checked or copied. Each layout says where head i's block starts;
 * the blocks become a native tensor set of count heads, which the native
 * loader (layouts.c) turns into a layer with all its checks and variants.
 * Legend: h, h_kv, d_k, d_v, D = d_model, n = count, g = kv_count. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/variants.h"
#include "io/io_internal.h"
#include "io/tensors_internal.h"

/* One block kind in the file: head i's first column (trans 0: an (in, out)
 * matrix or a bias) or row (trans 1: an (out, in) matrix) is
 * base + (i / per) * gstride + (i % per) * d (megatron interleaves kv
 * groups; every other layout has per = 1, gstride = d). */
typedef struct {
    const mha_array *a; /* NULL: absent (biases) */
    int trans, base, per, gstride;
} part;

typedef struct {
    mha_config c;
    part w[3], b[3]; /* Q, K, V weights and biases */
    part o;          /* W_O: trans 0 = (h*d_v, D) head rows; 1 = (D, h*d_v) head columns */
    part g, bg;      /* W_G and b_G of a gated layer: d_v-wide blocks by query head (absent: .a NULL) */
    int hf_gate;     /* hf q_proj rows per head [query d; gate d] (mha_load_options.output_gate) */
    const mha_array *b_o, *bias_k, *bias_v;
    int hf;          /* QK-norm tensors named q_norm.weight / k_norm.weight */
    const char *prefix; /* the layer's own path (mha_io_layer_path): in path, or NULL */
    char path[4096];
} source;

static size_t head_at(const part *p, int i, int d) {
    return (size_t)p->base + (size_t)(i / p->per) * p->gstride + (size_t)(i % p->per) * d;
}

static part plain(const mha_array *a, int trans, int base, int d) { return (part){a, trans, base, 1, d}; }

/* The one tensor named prefix+suffix (or ending in "."suffix); NULL when
 * absent, an error when required or ambiguous. */
static mha_status find_of(const mha_array **out, const mha_tensors *t, const char *prefix, const char *suffix,
                          int required, int i8) {
    *out = NULL;
    for (int i = 0; i < t->n; i++) {
        if (!mha_io_name_fits(t->items[i].name, prefix, suffix)) continue;
        if (*out) return mha_fail(MHA_E_FORMAT, "several tensors end in '%s'; pass a prefix to choose one layer", suffix);
        *out = &t->items[i].a;
    }
    if (!*out && required) return mha_fail(MHA_E_FORMAT, "no tensor named '[prefix.]%s'", suffix);
    return *out && !(i8 && (*out)->dtype == MHA_DTYPE_I8) ? mha_io_want_real(*out, suffix) : MHA_OK;
}

static mha_status find(const mha_array **out, const mha_tensors *t, const char *prefix, const char *suffix,
                       int required) {
    return find_of(out, t, prefix, suffix, required, 0);
}

static mha_status want(const mha_array *a, const char *name, int d0, int d1) {
    if (!a) return MHA_OK;
    if (d1 ? a->rank == 2 && a->shape[0] == d0 && a->shape[1] == d1 : a->count == (size_t)d0) return MHA_OK;
    return mha_fail(MHA_E_SHAPE, "tensor '%s' has %zu elements (rank %d, dim 0 = %d); expected (%d%s%d)", name,
                    a->count, a->rank, a->rank ? a->shape[0] : 0, d0, d1 ? ", " : ",", d1 ? d1 : 0);
}

static mha_status split(int *q, long total, int by, const char *what) {
    if (by <= 0 || total % by || total / by < 1)
        return mha_fail(MHA_E_SHAPE, "%s: %ld does not split into %d heads", what, total, by);
    *q = (int)(total / by);
    return MHA_OK;
}

/* ------------------------------------------------------------- layouts */

/* A fused Q/K/V tensor of (h + 2*h_kv)*d rows and W_O (out, in) of h*d
 * columns: d from W_O, h_kv from the rows unless given (megatron, Phi-3). */
static mha_status fused_dims(int *d, int *hkv, const mha_array *fused, const mha_array *out, int h, const char *layout) {
    if (fused->rank != 2 || out->rank != 2) return mha_fail(MHA_E_SHAPE, "%s layout: weights must be matrices", layout);
    mha_status s = split(d, out->shape[1], h, "W_O columns");
    if (s) return s;
    if (!*hkv && fused->shape[0] % *d == 0 && (fused->shape[0] / *d - h) % 2 == 0) *hkv = (fused->shape[0] / *d - h) / 2;
    if (*hkv <= 0 || h % *hkv) return mha_fail(MHA_E_SHAPE, "%s layout: %d kv heads do not divide %d heads", layout, *hkv, h);
    return MHA_OK;
}

/* a[0]: fused rows per kv group g [q heads of g, k_g, v_g] (out, in) as
 * megatron and GPT-BigCode store them, a[3]: W_O (out, in), a[4]: the
 * fused bias or NULL. */
static mha_status fused_groups(source *src, const mha_array *const *a, int h, int *hkv, const char *bias,
                               const char *layout) {
    mha_config *c = &src->c;
    int d;
    mha_status s = fused_dims(&d, hkv, a[0], a[3], h, layout);
    if (s) return s;
    c->d_model = c->d_kv_in = c->d_v_in = a[0]->shape[1], c->d_k = c->d_v = d;
    const int rep = h / *hkv, gs = (rep + 2) * d;
    src->w[0] = (part){a[0], 1, 0, rep, gs}, src->w[1] = (part){a[0], 1, rep * d, 1, gs};
    src->w[2] = (part){a[0], 1, (rep + 1) * d, 1, gs};
    for (int i = 0; a[4] && i < 3; i++) src->b[i] = src->w[i], src->b[i].a = a[4], src->b[i].trans = 0;
    src->o = plain(a[3], 1, 0, d);
    return want(a[4], bias, (h + 2 * *hkv) * d, 0);
}

static mha_status describe(source *src, const mha_tensors *t, const mha_load_options *o) {
    const char *P = o->prefix;
    mha_config *c = &src->c;
    const mha_array *a[6] = {NULL};
    int h, hkv, E;
    mha_status s;
    if ((s = mha_io_pick_heads(&h, &hkv, o, t)) || (s = mha_io_meta_int(&c->add_zero_attn, t, "add_zero_attn")))
        return s;
    c->add_zero_attn |= o->add_zero_attn;
    if (!h) return mha_fail(MHA_E_ARG, "the number of heads is not in the file; pass --heads");
    c->n_heads = h;
    /* native int8 only where the metadata declares the weights' dtype, as
     * mha_layer_load: the native loader then checks the shard */
    const int i8 = mha_tensors_meta(t, "weights_dtype") != NULL;
    switch (o->layout) {
    case MHA_LAYOUT_NATIVE: /* w_* (in, out), w_o (h*d_v, D) */
        if ((s = find_of(&a[0], t, P, "w_q", 1, i8)) || (s = find_of(&a[1], t, P, "w_k", 1, i8)) ||
            (s = find_of(&a[2], t, P, "w_v", 1, i8)) || (s = find_of(&a[3], t, P, "w_o", 1, i8)))
            return s;
        if (a[0]->rank != 2 || a[1]->rank != 2 || a[2]->rank != 2 || a[3]->rank != 2)
            return mha_fail(MHA_E_SHAPE, "native layout: w_q, w_k, w_v, w_o must be matrices");
        c->d_model = a[0]->shape[0], c->d_kv_in = a[1]->shape[0], c->d_v_in = a[2]->shape[0];
        if ((s = split(&c->d_k, a[0]->shape[1], h, "w_q columns")) || (s = split(&c->d_v, a[3]->shape[0], h, "w_o rows")))
            return s;
        int mk, mv; /* the metadata's head widths must be the tensors', as mha_layer_load requires */
        if ((s = mha_io_meta_count(&mk, t, "d_k")) || (s = mha_io_meta_count(&mv, t, "d_v"))) return s;
        if ((mk && mk != c->d_k) || (mv && mv != c->d_v))
            return mha_fail(MHA_E_SHAPE, "metadata d_k = %d, d_v = %d but w_q has %d columns and w_o %d rows per head",
                            mk, mv, c->d_k, c->d_v);
        if (!hkv && (s = split(&hkv, a[1]->shape[1], c->d_k, "w_k columns (d_k wide)"))) return s;
        src->w[0] = plain(a[0], 0, 0, c->d_k), src->w[1] = plain(a[1], 0, 0, c->d_k), src->w[2] = plain(a[2], 0, 0, c->d_v);
        src->o = plain(a[3], 0, 0, c->d_v);
        static const char *const nb[3] = {"b_q", "b_k", "b_v"};
        for (int i = 0; i < 3; i++) {
            if ((s = find(&a[4], t, P, nb[i], 0))) return s;
            src->b[i] = plain(a[4], 0, 0, i ? (i == 1 ? c->d_k : c->d_v) : c->d_k);
        }
        if ((s = find(&src->b_o, t, P, "b_o", 0)) || (s = find(&src->bias_k, t, P, "bias_k", 0)) ||
            (s = find(&src->bias_v, t, P, "bias_v", 0)) || (s = find_of(&a[5], t, P, "w_g", 0, i8)) ||
            (s = find(&a[4], t, P, "b_g", 0)))
            return s;
        src->g = plain(a[5], 0, 0, c->d_v), src->bg = plain(a[4], 0, 0, c->d_v); /* as W_Q's, d_v wide */
        if ((s = want(a[5], "w_g", c->d_model, h * c->d_v)) || (s = want(a[4], "b_g", h * c->d_v, 0))) return s;
        break;
    case MHA_LAYOUT_HF: { /* *_proj.weight (out, in) */
        src->hf = 1;
        const mha_hf_names *hn = mha_io_hf_names(t, P);
        char w[4][48], b[4][48]; /* q, k, v, o: .weight and .bias */
        const char *const base[4] = {hn->q, hn->k, hn->v, hn->o};
        for (int m = 0; m < 4; m++) snprintf(w[m], sizeof w[m], "%s.weight", base[m]), snprintf(b[m], sizeof b[m], "%s.bias", base[m]);
        if ((s = find(&a[0], t, P, w[0], 0))) return s;
        const mha_hf_fused_names *fn = a[0] ? NULL : mha_io_hf_fused(t, P);
        if (fn && o->output_gate)
            return mha_fail(MHA_E_UNSUPPORTED, "hf layout: output_gate with a fused %s.weight; expected q_proj "
                            "holding each head's query then its gate (Qwen3-Next)", fn->qkv);
        if (fn) { /* Phi-3, Baichuan, MPT: rows [Q; K; V], d_k = d_v */
            char fw[4][48];
            snprintf(fw[0], 48, "%s.weight", fn->qkv), snprintf(fw[1], 48, "%s.bias", fn->qkv);
            snprintf(fw[2], 48, "%s.weight", fn->o), snprintf(fw[3], 48, "%s.bias", fn->o);
            if ((s = find(&a[0], t, P, fw[0], 1)) || (s = find(&a[3], t, P, fw[2], 1)) ||
                (s = find(&a[4], t, P, fw[1], 0)) || (s = find(&src->b_o, t, P, fw[3], 0)))
                return s;
            int d;
            if ((s = fused_dims(&d, &hkv, a[0], a[3], h, "hf"))) return s;
            c->d_model = c->d_kv_in = c->d_v_in = a[0]->shape[1], c->d_k = c->d_v = d;
            src->w[0] = plain(a[0], 1, 0, d), src->w[1] = plain(a[0], 1, h * d, d), src->w[2] = plain(a[0], 1, (h + hkv) * d, d);
            src->o = plain(a[3], 1, 0, d);
            for (int i = 0; i < 3; i++) src->b[i] = plain(a[4], 0, i ? (h + (i - 1) * hkv) * d : 0, d);
            break;
        }
        if ((s = find(&a[0], t, P, w[0], 1)) || (s = find(&a[1], t, P, w[1], 1)) || (s = find(&a[2], t, P, w[2], 1)) ||
            (s = find(&a[3], t, P, w[3], 1)) || (s = find(&a[4], t, P, b[0], 0)) || (s = find(&a[5], t, P, b[1], 0)))
            return s;
        if (a[0]->rank != 2 || a[1]->rank != 2 || a[2]->rank != 2 || a[3]->rank != 2)
            return mha_fail(MHA_E_SHAPE, "hf layout: the four *_proj.weight must be matrices");
        c->d_model = a[0]->shape[1], c->d_kv_in = c->d_v_in = a[1]->shape[1];
        const int gated = src->hf_gate = c->output_gate = o->output_gate; /* Qwen3-Next */
        if ((s = split(&c->d_k, a[0]->shape[0], gated ? 2 * h : h, w[0]))) return s;
        if (!hkv && (s = split(&hkv, a[1]->shape[0], c->d_k, w[1]))) return s;
        if ((s = split(&c->d_v, a[2]->shape[0], hkv, w[2]))) return s;
        if (gated && (a[1]->shape[0] != hkv * c->d_k || c->d_v != c->d_k))
            return mha_fail(MHA_E_SHAPE, "hf layout: %s's %d rows read as %d heads' query and gate give d_k = %d, "
                            "but %s has %d rows and %s %d for %d kv heads; expected q_proj of h*2*head_dim rows "
                            "(each head's query, then its gate: attn_output_gate) and d_v = d_k", w[0],
                            a[0]->shape[0], h, c->d_k, w[1], a[1]->shape[0], w[2], a[2]->shape[0], hkv);
        /* gated: head i's query rows start at 2*i*d, its gate's d rows later */
        const int qs = gated ? 2 * c->d_k : c->d_k;
        src->w[0] = (part){a[0], 1, 0, 1, qs}, src->w[1] = plain(a[1], 1, 0, c->d_k), src->w[2] = plain(a[2], 1, 0, c->d_v);
        src->o = plain(a[3], 1, 0, c->d_v);
        src->b[0] = (part){a[4], 0, 0, 1, qs}, src->b[1] = plain(a[5], 0, 0, c->d_k);
        if (gated) src->g = (part){a[0], 1, c->d_k, 1, qs}, src->bg = (part){a[4], 0, c->d_k, 1, qs};
        if (gated && (s = want(a[4], b[0], 2 * h * c->d_k, 0))) return s;
        if ((s = find(&a[4], t, P, b[2], 0)) || (s = find(&src->b_o, t, P, b[3], 0))) return s;
        src->b[2] = plain(a[4], 0, 0, c->d_v);
        break;
    }
    case MHA_LAYOUT_TORCH: /* nn.MultiheadAttention: (out, in), d_k = d_v = E/h, no GQA */
        if ((s = find(&a[3], t, P, "out_proj.weight", 1)) || (s = find(&a[0], t, P, "in_proj_weight", 0)) ||
            (s = find(&a[4], t, P, "in_proj_bias", 0)) || (s = find(&src->b_o, t, P, "out_proj.bias", 0)) ||
            (s = find(&src->bias_k, t, P, "bias_k", 0)) || (s = find(&src->bias_v, t, P, "bias_v", 0)))
            return s;
        E = a[3]->shape[0];
        if (hkv && hkv != h) return mha_fail(MHA_E_ARG, "torch layout has no GQA; got n_kv_heads = %d", hkv);
        hkv = h, c->d_model = E;
        if ((s = split(&c->d_k, E, h, "embed_dim"))) return s;
        c->d_v = c->d_k;
        if (a[0]) { /* W_q; W_k; W_v stacked along rows */
            if ((s = want(a[0], "in_proj_weight", 3 * E, E))) return s;
            c->d_kv_in = c->d_v_in = E;
            for (int i = 0; i < 3; i++) src->w[i] = plain(a[0], 1, i * E, c->d_k);
        } else {
            static const char *const nw[3] = {"q_proj_weight", "k_proj_weight", "v_proj_weight"};
            for (int i = 0; i < 3; i++) {
                if ((s = find(&a[i], t, P, nw[i], 1))) return s;
                if (a[i]->rank != 2) return mha_fail(MHA_E_SHAPE, "torch layout: %s must be a matrix", nw[i]);
                src->w[i] = plain(a[i], 1, 0, c->d_k);
            }
            c->d_kv_in = a[1]->shape[1], c->d_v_in = a[2]->shape[1];
        }
        for (int i = 0; a[4] && i < 3; i++) src->b[i] = plain(a[4], 0, i * E, c->d_k);
        if ((s = want(a[4], "in_proj_bias", 3 * E, 0))) return s;
        src->o = plain(a[3], 1, 0, c->d_v);
        break;
    case MHA_LAYOUT_GPT2: /* Conv1D (in, out): c_attn columns [Q | K | V] */
        if ((s = find(&a[0], t, P, "c_attn.weight", 1)) || (s = find(&a[3], t, P, "c_proj.weight", 1)) ||
            (s = find(&a[4], t, P, "c_attn.bias", 0)) || (s = find(&src->b_o, t, P, "c_proj.bias", 0)))
            return s;
        if (a[0]->rank == 2 && a[0]->shape[0] > a[0]->shape[1]) { /* nn.Linear (out, in): GPT-BigCode */
            if ((s = fused_groups(src, a, h, &hkv, "c_attn.bias", "gpt2 (GPT-BigCode)"))) return s;
            break;
        }
        if (a[0]->rank != 2 || a[0]->shape[1] % 3) return mha_fail(MHA_E_SHAPE, "gpt2 layout: c_attn.weight must be (d_model, 3E)");
        if (hkv && hkv != h) return mha_fail(MHA_E_ARG, "gpt2 layout has one kv head per head; got n_kv_heads = %d", hkv);
        E = a[0]->shape[1] / 3, hkv = h, c->d_model = c->d_kv_in = c->d_v_in = a[0]->shape[0];
        if ((s = split(&c->d_k, E, h, "c_attn.weight (one third)"))) return s;
        c->d_v = c->d_k;
        for (int i = 0; i < 3; i++) src->w[i] = plain(a[0], 0, i * E, c->d_k);
        for (int i = 0; a[4] && i < 3; i++) src->b[i] = plain(a[4], 0, i * E, c->d_k);
        if ((s = want(a[4], "c_attn.bias", 3 * E, 0))) return s;
        src->o = plain(a[3], 0, 0, c->d_v);
        break;
    case MHA_LAYOUT_MEGATRON: { /* fused rows per kv group: [q heads of g, k_g, v_g]; InternLM2: wqkv, wo */
        const int intern = strcmp(mha_io_megatron_qkv(t, P), "wqkv") == 0;
        const char *qw = intern ? "wqkv.weight" : "query_key_value.weight";
        const char *qb = intern ? "wqkv.bias" : "query_key_value.bias";
        if ((s = find(&a[0], t, P, qw, 1)) || (s = find(&a[3], t, P, intern ? "wo.weight" : "dense.weight", 1)) ||
            (s = find(&a[4], t, P, qb, 0)) || (s = find(&src->b_o, t, P, intern ? "wo.bias" : "dense.bias", 0)) ||
            (s = fused_groups(src, a, h, &hkv, qb, "megatron")))
            return s;
        break;
    }
    case MHA_LAYOUT_CODEGEN: { /* qkv_proj (3E, E): 4 row blocks [q; v; k] of h/4 heads each; out_proj (E, E) */
        enum { MP = 4 };       /* CodeGenAttention's mp_num (layouts.c: load_codegen) */
        const mha_array *bq, *bo;
        if ((s = find(&a[0], t, P, "qkv_proj.weight", 1)) || (s = find(&a[3], t, P, "out_proj.weight", 1)) ||
            (s = find(&bq, t, P, "qkv_proj.bias", 0)) || (s = find(&bo, t, P, "out_proj.bias", 0)))
            return s;
        if (bq || bo)
            return mha_fail(MHA_E_FORMAT, "codegen layout: tensor '%s' is present; expected none: CodeGen's qkv_proj "
                            "and out_proj have no bias", bq ? "qkv_proj.bias" : "out_proj.bias");
        if (hkv && hkv != h) return mha_fail(MHA_E_ARG, "codegen layout has one kv head per head; got n_kv_heads = %d", hkv);
        if (h % MP)
            return mha_fail(MHA_E_SHAPE, "codegen layout: %d heads do not split into qkv_proj's mp_num = %d blocks; "
                            "expected a multiple of %d heads", h, MP, MP);
        if (a[0]->rank != 2 || a[3]->rank != 2) return mha_fail(MHA_E_SHAPE, "codegen layout: weights must be matrices");
        E = a[0]->shape[1], hkv = h, c->d_model = c->d_kv_in = c->d_v_in = E;
        if ((s = split(&c->d_k, E, h, "qkv_proj.weight columns")) || (s = want(a[0], "qkv_proj.weight", 3 * E, E)))
            return s;
        c->d_v = c->d_k;
        const int per = h / MP, block = 3 * per * c->d_k; /* a block's heads, its rows */
        src->w[0] = (part){a[0], 1, 0, per, block};                 /* q: the block's first part */
        src->w[1] = (part){a[0], 1, 2 * per * c->d_k, per, block};  /* k: its third */
        src->w[2] = (part){a[0], 1, per * c->d_k, per, block};      /* v: its second */
        src->o = plain(a[3], 1, 0, c->d_v);
        break;
    }
    default: return mha_fail(MHA_E_ARG, "layout %d is not one of mha_layout", (int)o->layout);
    }
    c->n_kv_heads = hkv;
    c->bias = src->b[0].a || src->b[1].a || src->b[2].a || src->b_o;
    c->add_bias_kv = src->bias_k != NULL;
    const int D = c->d_model, qk = h * c->d_k, kk = hkv * c->d_k, vv = hkv * c->d_v, ov = h * c->d_v;
    /* the whole file's shapes, so that every block read below is inside its tensor */
    const part *w = src->w;
    if ((s = want(w[0].a, "W_Q", w[0].trans ? w[0].a->shape[0] : D, w[0].trans ? D : w[0].a->shape[1])) ||
        (s = want(w[1].a, "W_K", w[1].trans ? w[1].a->shape[0] : c->d_kv_in, w[1].trans ? c->d_kv_in : w[1].a->shape[1])) ||
        (s = want(w[2].a, "W_V", w[2].trans ? w[2].a->shape[0] : c->d_v_in, w[2].trans ? c->d_v_in : w[2].a->shape[1])) ||
        (s = want(src->o.a, "W_O", src->o.trans ? D : ov, src->o.trans ? ov : D)) ||
        (s = want(src->b_o, "b_O", D, 0)) || (s = want(src->bias_k, "bias_k", kk, 0)) ||
        (s = want(src->bias_v, "bias_v", vv, 0)))
        return s;
    const int rows[3] = {w[0].trans ? w[0].a->shape[0] : w[0].a->shape[1], w[1].trans ? w[1].a->shape[0] : w[1].a->shape[1],
                         w[2].trans ? w[2].a->shape[0] : w[2].a->shape[1]};
    const int heads[3] = {h, hkv, hkv}, dims[3] = {c->d_k, c->d_k, c->d_v};
    const int need[3] = {src->hf_gate ? 2 * qk : qk, kk, vv}; /* a gated q_proj holds the gate's rows too */
    for (int i = 0; i < 3; i++) { /* the last head's block ends inside the tensor */
        size_t end = head_at(&w[i], heads[i] - 1, dims[i]) + dims[i];
        if (end > (size_t)rows[i] || (w[0].a != w[1].a && rows[i] != need[i])) /* a fused tensor holds Q, K, V */
            return mha_fail(MHA_E_SHAPE, "%s: %d heads of width %d need %zu %s; the tensor has %d", i ? (i == 1 ? "W_K" : "W_V") : "W_Q",
                            heads[i], dims[i], end, w[i].trans ? "rows" : "columns", rows[i]);
        if (src->b[i].a && head_at(&src->b[i], heads[i] - 1, dims[i]) + dims[i] > src->b[i].a->count)
            return mha_fail(MHA_E_SHAPE, "the bias of %s has %zu entries; expected %d", i ? (i == 1 ? "W_K" : "W_V") : "W_Q",
                            src->b[i].a->count, need[i]);
    }
    return MHA_OK;
}

/* -------------------------------------------------------------- copies */

/* dst (din, n*d) <- heads [h0, h0+n) of W: column blocks (trans 0) or row
 * blocks transposed (trans 1). */
static void take_w(float *dst, const part *p, int din, int h0, int n, int d) {
    const float *a = p->a->f;
    const size_t ld = (size_t)p->a->shape[1], w = (size_t)n * d;
    for (int i = 0; i < n; i++) {
        const size_t at = head_at(p, h0 + i, d);
        for (int r = 0; r < din; r++)
            for (int e = 0; e < d; e++)
                dst[(size_t)r * w + (size_t)i * d + e] = p->trans ? a[(at + e) * ld + r] : a[(size_t)r * ld + at + e];
    }
}

/* dst (n*d_v, D) <- W_O's head rows (trans 0) or head columns transposed (trans 1). */
static void take_o(float *dst, const part *p, int D, int h0, int n, int d) {
    const float *a = p->a->f;
    const size_t ld = (size_t)p->a->shape[1];
    for (int i = 0; i < n; i++)
        for (int e = 0; e < d; e++) {
            const size_t row = head_at(p, h0 + i, d) + e;
            float *out = dst + ((size_t)i * d + e) * D;
            for (int c = 0; c < D; c++) out[c] = p->trans ? a[(size_t)c * ld + row] : a[row * ld + c];
        }
}

/* dst (n*d) <- the heads' entries of a bias (or of a per-head vector). */
static void take_b(float *dst, const part *p, int h0, int n, int d) {
    for (int i = 0; i < n; i++) memcpy(dst + (size_t)i * d, p->a->f + head_at(p, h0 + i, d), sizeof(float) * (size_t)d);
}

/* Adds a new F32 tensor of the given shape to t and returns its data (NULL
 * and a failure status on error). */
static float *add(mha_tensors *t, const char *name, int d0, int d1, mha_status *s) {
    if (*s) return NULL;
    mha_array a = {.dtype = MHA_DTYPE_F32, .rank = d1 ? 2 : 1, .shape = {d0, d1 ? d1 : 1}, .count = (size_t)d0 * (d1 ? d1 : 1)};
    if ((*s = mha_array_alloc(&a))) return NULL;
    float *data = a.f;
    if ((*s = mha_tensors_take(t, name, &a))) return mha_array_free(&a), NULL; /* take clears a on success */
    return data;
}

/* The file's labels of one block (n entries), or 0..n-1 when it has none. */
static mha_status file_labels(int *out, const mha_tensors *t, const char *key, int n) {
    const char *v = mha_tensors_meta(t, key), *p = v;
    for (int k = 0; k < n; k++) {
        if (!v) {
            out[k] = k;
            continue;
        }
        char *end;
        errno = 0;
        long x = strtol(p, &end, 10);
        if (end == p || errno || x < 0 || x >= n || (*end != ',' && (*end || k + 1 < n)))
            return mha_fail(MHA_E_FORMAT, "metadata %s = '%.60s'; expected %d comma-separated head labels", key, v, n);
        out[k] = (int)x, p = end + 1;
    }
    return MHA_OK;
}

/* ALiBi with the paper's slopes (no alibi_slopes tensor): the default
 * slopes depend on h, so the shard gets those of its global heads
 * [first, first+n) of the whole layer, written as a tensor, as
 * mha_mpi_shard_heads takes them from the whole layer's. */
static mha_status default_slopes(mha_tensors *nt, const mha_config *c, int first, int n) {
    mha_status s = MHA_OK;
    if (!c->alibi || mha_tensors_get(nt, "alibi_slopes")) return s;
    float *all = malloc(sizeof(float) * (size_t)c->n_heads), *p;
    if (!all) return mha_fail(MHA_E_NOMEM, "no memory for %d ALiBi slopes", c->n_heads);
    mha_alibi_default_slopes(all, c->n_heads);
    if ((p = add(nt, "alibi_slopes", n, 0, &s))) memcpy(p, all + first, sizeof(float) * (size_t)n);
    free(all);
    return s;
}

/* A bf16 or int8 native file's shard keeps its stored form: the copied
 * matrices keep the file's dtype (their floats are the bf16 values or the
 * int8 codes) and each int8 scale tensor (groups, N) gives the shard's
 * columns (W_Q, W_K, W_V and a gated layer's W_G: the heads' column
 * blocks) or rows (W_O: each head's ceil(d_v/32) groups); a scale of
 * another shape, beside weights that are not int8 or without its matrix
 * (w_g_scale of an ungated file), goes as it is, for the native loader
 * to name. */
static mha_status narrow_stored(mha_tensors *nt, const source *src, const mha_tensors *t, const char *prefix,
                                int first, int n, int g0, int g) {
    static const char *const wn[5] = {"w_q", "w_k", "w_v", "w_o", "w_g"};
    static const char *const sn[5] = {"w_q_scale", "w_k_scale", "w_v_scale", "w_o_scale", "w_g_scale"};
    const mha_config *c = &src->c;
    const int d[5] = {c->d_k, c->d_k, c->d_v, (c->d_v + 31) / 32, c->d_v}; /* W_O: scale rows per head */
    const int h0[5] = {first, g0, g0, first, first}, cnt[5] = {n, g, g, n, n};
    const int rows[5] = {(c->d_model + 31) / 32, (c->d_kv_in + 31) / 32, (c->d_v_in + 31) / 32, c->n_heads * d[3],
                         (c->d_model + 31) / 32};
    const int cols[5] = {c->n_heads * c->d_k, c->n_kv_heads * c->d_k, c->n_kv_heads * c->d_v, c->d_model,
                         c->n_heads * c->d_v};
    mha_status s = MHA_OK;
    for (int m = 0; m < 5 && !s; m++) {
        const mha_array *file = m < 3 ? src->w[m].a : m == 3 ? src->o.a : src->g.a, *sc;
        mha_array *shard = (mha_array *)mha_tensors_get(nt, wn[m]);
        if (file && shard) shard->dtype = file->dtype; /* the values are unchanged */
        if ((s = find(&sc, t, prefix, sn[m], 0)) || !sc) continue;
        if (!file || !shard || file->dtype != MHA_DTYPE_I8 || sc->dtype != MHA_DTYPE_F32 || sc->rank != 2 ||
            sc->shape[0] != rows[m] || sc->shape[1] != cols[m]) {
            s = mha_tensors_add(nt, sn[m], sc);
            continue;
        }
        const part pp = plain(sc, 0, 0, d[m]);
        float *p;
        if (m != 3 && (p = add(nt, sn[m], rows[m], cnt[m] * d[m], &s))) take_w(p, &pp, rows[m], h0[m], cnt[m], d[m]);
        if (m == 3 && (p = add(nt, sn[m], cnt[m] * d[m], cols[m], &s))) take_o(p, &pp, cols[m], h0[m], cnt[m], d[m]);
    }
    return s;
}

/* The native tensor set of heads [first, first+n) and kv heads [g0, g0+g). */
static mha_status narrow(mha_tensors **out, const source *src, const mha_tensors *t, const char *prefix,
                         int first, int n, int g0, int g) {
    const mha_config *c = &src->c;
    const int D = c->d_model, dk = c->d_k, dv = c->d_v;
    mha_status s = mha_tensors_create(out);
    if (s) return s;
    mha_tensors *nt = *out;
    float *p;
    if ((p = add(nt, "w_q", D, n * dk, &s))) take_w(p, &src->w[0], D, first, n, dk);
    if ((p = add(nt, "w_k", c->d_kv_in, g * dk, &s))) take_w(p, &src->w[1], c->d_kv_in, g0, g, dk);
    if ((p = add(nt, "w_v", c->d_v_in, g * dv, &s))) take_w(p, &src->w[2], c->d_v_in, g0, g, dv);
    if ((p = add(nt, "w_o", n * dv, D, &s))) take_o(p, &src->o, D, first, n, dv);
    static const char *const nb[3] = {"b_q", "b_k", "b_v"};
    for (int i = 0; i < 3; i++) {
        const int h0 = i ? g0 : first, cnt = i ? g : n, d = i == 2 ? dv : dk;
        if (src->b[i].a && (p = add(nt, nb[i], cnt * d, 0, &s))) take_b(p, &src->b[i], h0, cnt, d);
    }
    if (src->b_o && (p = add(nt, "b_o", D, 0, &s))) memcpy(p, src->b_o->f, sizeof(float) * (size_t)D);
    // --- the gate: W_G's and b_G's blocks of the query heads, as W_Q's
    if (src->g.a && (p = add(nt, "w_g", D, n * dv, &s))) take_w(p, &src->g, D, first, n, dv);
    if (src->bg.a && (p = add(nt, "b_g", n * dv, 0, &s))) take_b(p, &src->bg, first, n, dv);
    /* hf: a bias elsewhere and none in the gated q_proj is b_G = 0, as mha_layer_load reads it */
    if (src->hf_gate && !src->bg.a && c->bias && (p = add(nt, "b_g", n * dv, 0, &s))) memset(p, 0, sizeof(float) * (size_t)n * dv);
    if (!s && src->hf_gate) s = mha_tensors_set_meta(nt, "output_gate", "1");
    if (!s) s = narrow_stored(nt, src, t, prefix, first, n, g0, g); /* after w_g */
    const part bk = plain(src->bias_k, 0, 0, dk), bv = plain(src->bias_v, 0, 0, dv);
    if (src->bias_k && (p = add(nt, "bias_k", g * dk, 0, &s))) take_b(p, &bk, g0, g, dk);
    if (src->bias_v && (p = add(nt, "bias_v", g * dv, 0, &s))) take_b(p, &bv, g0, g, dv);
    // --- per-head variant tensors: this shard's entries; a shared norm as it is
    static const char *const nv[4] = {"alibi_slopes", "sinks", "q_norm", "k_norm"};
    for (int i = 0; i < 4 && !s; i++) {
        const mha_array *a;
        char hfname[16];
        snprintf(hfname, sizeof hfname, "%s.weight", nv[i]);
        if ((s = find(&a, t, prefix, i >= 2 && src->hf ? hfname : nv[i], 0)) || !a) continue;
        const int h0 = i == 3 ? g0 : first, cnt = i == 3 ? g : n, total = i == 3 ? c->n_kv_heads : c->n_heads;
        const int w = i < 2 ? 1 : dk, per_head = a->count == (size_t)total * w && !(i >= 2 && total == 1);
        if ((p = add(nt, nv[i], per_head ? cnt * w : (int)a->count, 0, &s))) {
            const part pa = plain(a, 0, 0, w);
            if (per_head) take_b(p, &pa, h0, cnt, w);
            else memcpy(p, a->f, sizeof(float) * a->count);
        }
    }
    for (int i = 2; i < 4 && !s && src->hf && c->qk_norm == MHA_QK_NORM_LAYER && !mha_tensors_get(nt, nv[i]); i++) {
        float *all = NULL; /* StableLM's per-head norms: this shard's rows of the gathered (heads, d_k) */
        const int h0 = i == 3 ? g0 : first, cnt = i == 3 ? g : n;
        s = mha_io_per_head_norms(&all, t, prefix, i == 2 ? "q" : "k", i == 3 ? c->n_kv_heads : c->n_heads, dk);
        if (!s && all && (p = add(nt, nv[i], cnt * dk, 0, &s)))
            memcpy(p, all + (size_t)h0 * dk, sizeof(float) * (size_t)cnt * dk);
        free(all);
    }
    if (!s) s = default_slopes(nt, c, first, n);
    // --- metadata: the file's, with this shard's head counts, no labels, and
    //     add_zero_attn as the file and the load option say together
    for (int i = 0; i < t->n_meta && !s; i++) {
        const char *k = t->meta[i].key;
        if (strncmp(k, "labels_", 7) && strcmp(k, "n_heads") && strcmp(k, "n_kv_heads") && strcmp(k, "d_k") &&
            strcmp(k, "d_v") && strcmp(k, "add_zero_attn"))
            s = mha_tensors_set_meta(nt, k, t->meta[i].value);
    }
    char v[16];
    snprintf(v, sizeof v, "%d", n);
    if (!s) s = mha_tensors_set_meta(nt, "n_heads", v);
    snprintf(v, sizeof v, "%d", g);
    if (!s) s = mha_tensors_set_meta(nt, "n_kv_heads", v);
    if (!s && c->add_zero_attn) s = mha_tensors_set_meta(nt, "add_zero_attn", "1");
    if (!s && src->hf && (mha_tensors_get(nt, "q_norm") || mha_tensors_get(nt, "k_norm")) && !mha_tensors_meta(t, "qk_norm"))
        s = mha_tensors_set_meta(nt, "qk_norm", c->qk_norm == MHA_QK_NORM_LAYER ? "layer" : "rms"); /* hf: q_norm.weight
                                                   means RMS QK-norm, StableLM's norms.N a LayerNorm per head */
    if (!s && src->hf && c->qk_norm == MHA_QK_NORM_LAYER && !mha_tensors_meta(t, "qk_norm_eps")) {
        char e[32];
        snprintf(e, sizeof e, "%.9g", c->qk_norm_eps);
        if (!(s = mha_tensors_set_meta(nt, "qk_norm_eps", e))) s = mha_tensors_set_meta(nt, "qk_norm_per_head", "1");
    }
    /* hf: (h*d_k) norm weights are one norm over the whole width (OLMo 2);
     * the native shard would read them as per-head weights without this
     * (P = 1, the only head split that takes it: Y 0.6 off, silently) */
    if (!s && src->hf && c->qk_norm_whole && !mha_tensors_meta(t, "qk_norm_whole"))
        s = mha_tensors_set_meta(nt, "qk_norm_whole", "1");
    return s;
}

/* ---------------------------------------------------------- front door */

/* The mapped file (nothing checked or copied yet) and its description. */
static mha_status open_source(mha_tensors **t, source *src, const char *path, const mha_load_options *opt) {
    mha_load_options o = {0};
    if (opt) o = *opt;
    memset(src, 0, sizeof *src);
    if (o.output_gate != 0 && o.output_gate != 1) /* mha_layer_load's checks, before the file */
        return mha_fail(MHA_E_ARG, "output_gate = %d; expected 0 or 1 (the hf q_proj holds each head's gate)",
                        o.output_gate);
    mha_status s = mha_io_checkpoint_map(t, path, o.prefix, MHA_IO_ALLOW_NONFINITE);
    if (s) return s;
    if (o.layout == MHA_LAYOUT_AUTO && (s = mha_io_detect(&o.layout, *t, o.prefix))) return s;
    if (o.output_gate && o.layout != MHA_LAYOUT_HF) /* a native file says it itself */
        return mha_fail(MHA_E_ARG, "output_gate = 1 with the %s layout; expected the hf layout, whose q_proj holds "
                        "each head's query then its gate (Qwen3-Next)", mha_layout_name(o.layout));
    if ((s = mha_io_layer_path(&o, src->path, sizeof src->path, *t))) return s;
    if (o.layout != MHA_LAYOUT_NATIVE && (s = mha_io_refuse_unread_norms(*t, o.prefix))) return s;
    if ((s = describe(src, *t, &o))) return s;
    src->prefix = o.prefix;
    /* the variants as the loader reads them: a split must know them all
     * (and a shard of a default-slopes ALiBi layer its global slopes) */
    float *var[4] = {NULL};
    s = mha_io_variants_read(&src->c, var, *t, src->prefix, src->hf);
    for (int i = 0; i < 4; i++) free(var[i]);
    const char *gate = mha_tensors_meta(*t, "output_gate"); /* native: the shard's loader checks it against w_g */
    if (!s && gate && !src->hf_gate) src->c.output_gate = strcmp(gate, "0") != 0;
    return s;
}

static mha_status with_path(mha_status s, const char *path) {
    if (!s) return s;
    char msg[400];
    snprintf(msg, sizeof msg, "%s", mha_last_error());
    const size_t n = strlen(path);
    if (!strncmp(msg, path, n) && msg[n] == ':') return s; /* named already (an index's reader) */
    return mha_fail(s, "%s: %s", path, msg);
}

mha_status mha_layer_load_config(mha_config *out, const char *path, const mha_load_options *opt) {
    if (!out || !path) return mha_fail(MHA_E_ARG, "mha_layer_load_config: NULL argument");
    mha_tensors *t = NULL;
    source src;
    mha_status s = open_source(&t, &src, path, opt);
    if (!s) *out = src.c;
    mha_tensors_free(t);
    return with_path(s, path);
}

mha_status mha_layer_load_heads(mha_layer **out, const char *path, const mha_load_options *opt,
                                mha_head_range *range) {
    if (!out || !path || !range) return mha_fail(MHA_E_ARG, "mha_layer_load_heads: NULL argument");
    *out = NULL;
    mha_tensors *t = NULL, *nt = NULL;
    source src;
    mha_status s = open_source(&t, &src, path, opt);
    const int h = src.c.n_heads, hkv = src.c.n_kv_heads, group = s ? 1 : h / hkv;
    const int first = range->first, n = range->count;
    if (!s && (first < 0 || n < 1 || n > h || first > h - n || (first % group && (first + n - 1) / group != first / group) ||
               (n % group && (first + n - 1) / group != first / group)))
        s = mha_fail(MHA_E_ARG, "heads first=%d count=%d of h=%d with %d query heads per kv head; expected a range "
                     "inside 0..h-1 of whole kv groups, or heads inside one group", first, n, h, group);
    /* OLMo 2's norm spans every head's q (and k): a shard of some heads
     * would normalize over those alone, and the shards' sum is not Y */
    if (!s && src.c.qk_norm != MHA_QK_NORM_NONE && src.c.qk_norm_whole && n < h)
        s = mha_fail(MHA_E_UNSUPPORTED, "heads first=%d count=%d of h=%d: the layer's qk_norm_whole (one QK-norm "
                     "over all %d heads' q and k, OLMo 2) needs every head in one shard; expected count=%d, or a "
                     "layer with a per-head or shared (d_k) QK-norm", first, n, h, h, h);
    const int g0 = s ? 0 : first / group, g = s ? 0 : (first + n - 1) / group - g0 + 1;
    if (!s) s = narrow(&nt, &src, t, src.prefix, first, n, g0, g);
    mha_load_options native = {.layout = MHA_LAYOUT_NATIVE};
    if (!s && ((s = mha_layer_from_tensors(out, nt, &native)) == MHA_E_NONFINITE || s == MHA_E_FORMAT)) {
        char msg[300]; /* the shard's indices and shapes: say whose */
        snprintf(msg, sizeof msg, "%s", mha_last_error());
        s = mha_fail(s, "%s (indices and shapes are those of this shard of query heads %d..%d and kv heads %d..%d of the file)",
                     msg, first, first + n - 1, g0, g0 + g - 1);
    }
    if (!s && (range->labels || range->s_labels)) { /* the file's labels of these heads: W_Q, W_O, W_K, W_V, S */
        int *lab = malloc(sizeof(int) * 2 * (size_t)(h + hkv));
        static const char *const keys[5] = {"labels_q", "labels_o", "labels_k", "labels_v", "labels_s"};
        if (!lab) s = mha_fail(MHA_E_NOMEM, "no memory for %d labels", 2 * (h + hkv));
        for (int b = 0, at = 0; b < 5 && !s; b++) {
            const int kv = b == 2 || b == 3, cnt = kv ? g : n;
            int *dst = b == 4 ? range->s_labels : range->labels ? range->labels + at : NULL;
            if (dst && !(s = file_labels(lab, t, keys[b], kv ? hkv : h)))
                memcpy(dst, lab + (kv ? g0 : first), sizeof(int) * (size_t)cnt);
            at += cnt;
        }
        free(lab);
    }
    range->kv_first = g0, range->kv_count = g;
    mha_tensors_free(nt);
    mha_tensors_free(t); /* unmaps the file */
    if (s) mha_layer_free(*out), *out = NULL;
    return with_path(s, path);
}
