/* layouts.c — checkpoint layouts, converted at the boundary into the
 * layer's (in, out), head-ordered weights (legend: h, h_kv, d_k, d_v,
 * d_model, d_kv_in, d_v_in; see mha.h). Each reader checks every tensor's
 * shape against the layout before copying, and names the tensor and the
 * expected shape when it does not fit. */
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/weight_store.h"
#include "io/io_internal.h"
#include "io/tensors_internal.h"

static const char *const layout_names[] = {"auto", "native", "torch", "hf", "gpt2", "megatron", "codegen"};
#define N_LAYOUTS 7

const char *mha_layout_name(mha_layout l) {
    return (l >= 0 && (int)l < N_LAYOUTS) ? layout_names[l] : "unknown";
}

mha_status mha_layout_parse(mha_layout *out, const char *name) {
    for (int i = 0; name && i < N_LAYOUTS; i++)
        if (strcmp(name, layout_names[i]) == 0) {
            *out = (mha_layout)i;
            return MHA_OK;
        }
    return mha_fail(MHA_E_ARG, "unknown layout '%.40s'; expected auto, native, torch, hf, gpt2, "
                    "megatron or codegen", name ? name : "(null)");
}

/* ------------------------------------------------------------ name lookup */

/* Whether name is prefix+suffix (prefix given, "" included: a layer at the
 * top level), or suffix itself or ends in "." suffix (prefix NULL). */
int mha_io_name_fits(const char *name, const char *prefix, const char *suffix) {
    size_t n = strlen(name), s = strlen(suffix);
    if (prefix) {
        size_t p = strlen(prefix);
        return n == p + s && memcmp(name, prefix, p) == 0 && strcmp(name + p, suffix) == 0;
    }
    if (n < s || strcmp(name + n - s, suffix) != 0) return 0;
    return n == s || name[n - s - 1] == '.';
}

const mha_array *mha_io_find(const mha_tensors *t, const char *prefix, const char *suffix) {
    for (int j = 0; j < mha_tensors_count(t); j++)
        if (mha_io_name_fits(mha_tensors_name(t, j), prefix, suffix)) return mha_tensors_get(t, mha_tensors_name(t, j));
    return NULL;
}

int mha_io_name_inside(const char *name, const char *prefix, const char *suffix, size_t *path_len) {
    if (!mha_io_name_fits(name, NULL, suffix)) return 0;
    const size_t len = strlen(name) - strlen(suffix);
    *path_len = len;
    if (!prefix || !*prefix) return 1;
    size_t p = strlen(prefix);
    if (prefix[p - 1] == '.') p--;
    return len > p && memcmp(name, prefix, p) == 0 && name[p] == '.';
}

/* How many tensors fit suffix inside the module prefix (mha_io_name_inside). */
static int count_under(const mha_tensors *t, const char *prefix, const char *suffix) {
    int c = 0;
    size_t len;
    for (int i = 0; i < t->n; i++) c += mha_io_name_inside(t->items[i].name, prefix, suffix, &len);
    return c;
}

/* The hf naming schemes: the module names of Q, K, V and O (+ .weight,
 * .bias) in the attention layer. */
static const mha_hf_names hf_schemes[] = {
    {"q_proj", "k_proj", "v_proj", "o_proj"},                               /* Llama, Mistral, Qwen, Gemma */
    {"q_proj", "k_proj", "v_proj", "out_proj"},                             /* OPT, BART, Whisper, GPT-J, CLIP */
    {"self.query", "self.key", "self.value", "output.dense"},               /* BERT, RoBERTa, ELECTRA */
    {"attention.query", "attention.key", "attention.value", "output.dense"}, /* ViT, DeiT */
    {"q_lin", "k_lin", "v_lin", "out_lin"},                                 /* DistilBERT */
    {"q_proj", "k_proj", "v_proj", "dense"},                                /* Phi-1.5, Phi-2 */
};
#define N_HF_SCHEMES ((int)(sizeof hf_schemes / sizeof hf_schemes[0]))

static const mha_hf_fused_names hf_fused[] = {
    {"qkv_proj", "o_proj"},        /* Phi-3 (CodeGen's qkv_proj with out_proj: the codegen layout) */
    {"W_pack", "o_proj"},          /* Baichuan */
    {"Wqkv", "out_proj"},          /* MPT, DBRX */
    /* Named only (--layout hf; auto reads these names as gpt2's and megatron's rows): */
    {"c_attn", "c_proj"},          /* Qwen 1 (nn.Linear c_attn) */
    {"query_key_value", "dense"},  /* ChatGLM 2 / 3, GLM-4 (model_type chatglm) */
};
#define N_HF_FUSED ((int)(sizeof hf_fused / sizeof hf_fused[0]))

const mha_hf_fused_names *mha_io_hf_fused(const mha_tensors *t, const char *prefix) {
    char q[48];
    for (int k = 0; k < N_HF_FUSED; k++) {
        snprintf(q, sizeof q, "%s.weight", hf_fused[k].qkv);
        for (int i = 0; i < t->n; i++)
            if (mha_io_name_fits(t->items[i].name, prefix, q)) return &hf_fused[k];
    }
    return NULL;
}

const mha_hf_names *mha_io_hf_names(const mha_tensors *t, const char *prefix) {
    char q[48], o[48];
    for (int k = 0; k < N_HF_SCHEMES; k++) {
        snprintf(q, sizeof q, "%s.weight", hf_schemes[k].q), snprintf(o, sizeof o, "%s.weight", hf_schemes[k].o);
        int has_q = 0, has_o = 0;
        for (int i = 0; i < t->n; i++)
            has_q |= mha_io_name_fits(t->items[i].name, prefix, q), has_o |= mha_io_name_fits(t->items[i].name, prefix, o);
        if (has_q && has_o) return &hf_schemes[k];
    }
    return &hf_schemes[0]; /* its names then appear in the errors */
}

/* The one tensor fitting suffix; NULL when absent (an error if required);
 * several fits are an error that lists them and asks for a prefix. */
static mha_status find(const mha_array **out, const mha_tensors *t, const char *prefix,
                       const char *suffix, int required, const char *layout) {
    *out = NULL;
    int hits = 0;
    char list[256] = "";
    size_t used = 0;
    for (int i = 0; i < t->n; i++) {
        if (!mha_io_name_fits(t->items[i].name, prefix, suffix)) continue;
        if (!hits) *out = &t->items[i].a;
        if (used < sizeof list)
            used += (size_t)snprintf(list + used, sizeof list - used, "%s'%.60s'", hits ? ", " : "",
                                     t->items[i].name);
        hits++;
    }
    if (hits > 1) {
        *out = NULL;
        return mha_fail(MHA_E_FORMAT, "%s layout: %d tensors end in '%s' (%s); pass a prefix "
                        "(--prefix) to choose one layer", layout, hits, suffix, list);
    }
    if (!hits && required)
        return mha_fail(MHA_E_FORMAT, "%s layout: no tensor named '%s%s'", layout,
                        (prefix && *prefix) ? prefix : "[prefix.]", suffix);
    return MHA_OK;
}

/* ---------------------------------------------------------------- detect */

/* Tensors whose presence identifies each layout (any one alternative). */
typedef struct {
    mha_layout layout;
    const char *sig[7][4]; /* alternatives, each a NULL-terminated list */
    const char *describe;
} signature;

static const signature signatures[] = {
    {MHA_LAYOUT_NATIVE, {{"w_q", "w_k", "w_v", "w_o"}, {NULL}}, "w_q, w_k, w_v, w_o"},
    {MHA_LAYOUT_TORCH,
     {{"in_proj_weight", "out_proj.weight", NULL}, {"q_proj_weight", "k_proj_weight", "v_proj_weight", "out_proj.weight"}},
     "in_proj_weight or q/k/v_proj_weight, out_proj.weight"},
    {MHA_LAYOUT_HF, /* the schemes of hf_schemes, and Phi-3's fused qkv_proj */
     {{"q_proj.weight", "k_proj.weight", "v_proj.weight", NULL},
      {"qkv_proj.weight", "o_proj.weight", NULL},
      {"self.query.weight", "self.key.weight", "self.value.weight", "output.dense.weight"},
      {"attention.query.weight", "attention.key.weight", "attention.value.weight", "output.dense.weight"},
      {"q_lin.weight", "k_lin.weight", "v_lin.weight", "out_lin.weight"},
      {"W_pack.weight", "o_proj.weight", NULL},
      {"Wqkv.weight", "out_proj.weight", NULL}},
     /* (Phi's q_proj .. dense is the first alternative's) */
     "q/k/v/o projections under Hugging Face's names, or a fused qkv_proj, W_pack, Wqkv with o_proj, out_proj"},
    {MHA_LAYOUT_GPT2, {{"c_attn.weight", "c_proj.weight", NULL}, {NULL}}, "c_attn.weight, c_proj.weight"},
    {MHA_LAYOUT_MEGATRON, {{"query_key_value.weight", "dense.weight", NULL}, {"wqkv.weight", "wo.weight", NULL}},
     "query_key_value.weight, dense.weight (InternLM2: wqkv, wo)"},
};
#define N_SIGNATURES ((int)(sizeof signatures / sizeof signatures[0]))

static int fits_signature(const mha_tensors *t, const char *prefix, const signature *s) {
    for (int alt = 0; alt < 7; alt++) {
        if (!s->sig[alt][0]) continue;
        int ok = 1;
        for (int k = 0; k < 4 && s->sig[alt][k]; k++) ok &= count_under(t, prefix, s->sig[alt][k]) > 0;
        if (ok) return 1;
    }
    return 0;
}

mha_status mha_io_detect(mha_layout *out, const mha_tensors *t, const char *prefix) {
    int n = 0;
    mha_layout found = MHA_LAYOUT_AUTO;
    char list[256] = "";
    size_t used = 0;
    for (int i = 0; i < N_SIGNATURES; i++) {
        if (!fits_signature(t, prefix, &signatures[i])) continue;
        found = signatures[i].layout;
        used += (size_t)snprintf(list + used, sizeof list - used, "%s%s", n ? ", " : "",
                                 mha_layout_name(found));
        n++;
    }
    if (n == 1) {
        *out = found;
        return MHA_OK;
    }
    if (n > 1)
        return mha_fail(MHA_E_FORMAT, "the tensor names fit several layouts (candidates: %s); "
                        "pass --layout to choose", list);
    if (count_under(t, prefix, "qkv_proj.weight") && count_under(t, prefix, "out_proj.weight"))
        return mha_fail(MHA_E_FORMAT, "qkv_proj.weight with out_proj.weight fit no layout by their names (CodeGen's "
                        "mp_num blocks of [q; v; k], OpenELM's [q; k; v]); expected --layout codegen for CodeGen");
    char names[200] = "";
    used = 0;
    for (int i = 0; i < t->n && used < sizeof names; i++)
        used += (size_t)snprintf(names + used, sizeof names - used, "%s%.40s", i ? ", " : "",
                                 t->items[i].name);
    char inside[96] = ""; /* a prefix that matched nothing is the likelier mistake */
    if (prefix && *prefix) snprintf(inside, sizeof inside, " inside prefix '%.60s'", prefix);
    return mha_fail(MHA_E_FORMAT, "no layout fits the tensor names%s (%s); expected native (w_q, "
                    "w_k, w_v, w_o), torch (in_proj_weight, out_proj.weight), hf "
                    "(q_proj.weight, ..., qkv_proj.weight, W_pack.weight, Wqkv.weight, self.query.weight, ...), "
                    "gpt2 (c_attn.weight, "
                    "c_proj.weight) or megatron (query_key_value.weight, dense.weight; wqkv.weight, wo.weight)",
                    inside, names);
}

mha_status mha_layout_detect(mha_layout *out, const mha_tensors *t) {
    if (!out || !t) return mha_fail(MHA_E_ARG, "mha_layout_detect: NULL argument");
    return mha_io_detect(out, t, NULL);
}

/* One tensor per attention layer in each layout: its path names the layer. */
static const char *anchor_of(mha_layout l) {
    switch (l) {
    case MHA_LAYOUT_NATIVE: return "w_q";
    case MHA_LAYOUT_TORCH: return "out_proj.weight";
    case MHA_LAYOUT_HF: return "q_proj.weight";
    case MHA_LAYOUT_GPT2: return "c_attn.weight";
    case MHA_LAYOUT_MEGATRON: return "query_key_value.weight";
    case MHA_LAYOUT_CODEGEN: return "qkv_proj.weight";
    default: return NULL;
    }
}

mha_status mha_io_layer_path(mha_load_options *o, char *buf, size_t cap, const mha_tensors *t) {
    const char *prefix = o->prefix && *o->prefix ? o->prefix : NULL, *anchor = anchor_of(o->layout);
    o->prefix = prefix;
    if (!anchor) return MHA_OK;
    char hf_q[48]; /* hf: the first naming scheme's Q weight, else a fused one (Phi-3, Baichuan, MPT), present */
    for (int k = 0; o->layout == MHA_LAYOUT_HF && k < N_HF_SCHEMES + N_HF_FUSED && !count_under(t, prefix, anchor);
         k++) {
        snprintf(hf_q, sizeof hf_q, "%s.weight", k < N_HF_SCHEMES ? hf_schemes[k].q : hf_fused[k - N_HF_SCHEMES].qkv);
        anchor = hf_q;
    }
    if (o->layout == MHA_LAYOUT_MEGATRON && !count_under(t, prefix, anchor)) anchor = "wqkv.weight"; /* InternLM2 */
    if (!count_under(t, prefix, anchor)) anchor = anchor_of(o->layout); /* none: the loader names what is missing */
    int hits = 0;
    char list[256] = "";
    size_t used = 0, len, first = 0;
    const char *first_name = NULL;
    for (int i = 0; i < t->n; i++) {
        const char *name = t->items[i].name;
        if (!mha_io_name_inside(name, prefix, anchor, &len)) continue;
        if (!hits) first_name = name, first = len;
        if (used < sizeof list)
            used += (size_t)snprintf(list + used, sizeof list - used, "%s'%.*s'", hits ? ", " : "",
                                     (int)(len < 60 ? len : 60), name);
        hits++;
    }
    if (hits == 1 && first < cap) { /* exactly this layer's tensors from here on */
        memcpy(buf, first_name, first);
        buf[first] = 0;
        o->prefix = buf;
    }
    size_t p = prefix ? strlen(prefix) : 0;
    if (!hits && p && prefix[p - 1] != '.' && p + 1 < cap) { /* a module: its tensors are prefix "." name */
        memcpy(buf, prefix, p);
        memcpy(buf + p, ".", 2);
        o->prefix = buf;
    }
    if (hits > 1 && prefix) /* without a prefix, the layout's lookups list the tensors */
        return mha_fail(MHA_E_FORMAT, "%s layout: %d layers lie inside prefix '%.60s' (%s); expected one: pass "
                        "the prefix of one of them (--prefix)", mha_layout_name(o->layout), hits, prefix, list);
    return MHA_OK;
}

/* --------------------------------------------------------- shape checks */

mha_status mha_io_want_real(const mha_array *a, const char *name) {
    if (mha_io_real(a)) return MHA_OK;
    if (a->dtype == MHA_DTYPE_I8)
        return mha_fail(MHA_E_FORMAT, "tensor '%s' is int8; expected a floating dtype (only a native file's "
                        "w_q, w_k, w_v, w_o, w_g may be int8, with weights_dtype = int8 in its metadata and their "
                        "w_*_scale tensors: docs/WEIGHTS.md)", name);
    return mha_fail(MHA_E_FORMAT, "tensor '%s' is %s; expected a floating dtype (F32, F16 or BF16)", name,
                    mha_dtype_name(a->dtype));
}

/* "(d0, d1)" of a into got (64 bytes). */
static const char *shape_str(const mha_array *a, char *got) {
    size_t u = (size_t)snprintf(got, 64, "(");
    for (int i = 0; i < a->rank; i++) u += (size_t)snprintf(got + u, 64 - u, "%s%d", i ? ", " : "", a->shape[i]);
    snprintf(got + u, 64 - u, "%s)", a->rank == 1 ? "," : "");
    return got;
}

/* i8: the tensor may be I8 (a native file's declared int8 weights, whose
 * scales weights_meta.c reads); otherwise it must hold real numbers. */
static mha_status want_shape_of(const mha_array *a, const char *name, int rank, int d0, int d1, const char *what,
                                int i8) {
    int ok = a->rank == rank && a->shape[0] == d0 && (rank < 2 || a->shape[1] == d1);
    if (ok) return i8 && a->f ? MHA_OK : mha_io_want_real(a, name);
    char got[64];
    shape_str(a, got);
    if (rank == 1)
        return mha_fail(MHA_E_SHAPE, "tensor '%s' has shape %s; expected %s = (%d,)", name, got,
                        what, d0);
    return mha_fail(MHA_E_SHAPE, "tensor '%s' has shape %s; expected %s = (%d, %d)", name, got,
                    what, d0, d1);
}

static mha_status want_shape(const mha_array *a, const char *name, int rank, int d0, int d1,
                             const char *what) {
    return want_shape_of(a, name, rank, d0, d1, what, 0);
}

static mha_status want_matrix_of(const mha_array *a, const char *name, int i8) {
    char got[64];
    if (a->rank != 2 || a->shape[0] < 1 || a->shape[1] < 1)
        return mha_fail(MHA_E_SHAPE, "tensor '%s' has shape %s; expected a non-empty matrix", name,
                        shape_str(a, got));
    return i8 && a->f ? MHA_OK : mha_io_want_real(a, name); /* the dtype, named */
}

static mha_status want_matrix(const mha_array *a, const char *name) { return want_matrix_of(a, name, 0); }

mha_status mha_io_meta_int(int *out, const mha_tensors *t, const char *key) {
    *out = 0;
    const char *v = mha_tensors_meta(t, key);
    if (!v) return MHA_OK;
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    /* digits only: strtol alone would take " 4" and "+4" */
    if (!isdigit((unsigned char)v[0]) || errno || *end || x > INT_MAX)
        return mha_fail(MHA_E_FORMAT, "metadata %s = '%.40s'; expected a non-negative integer (digits only)",
                        key, v);
    *out = (int)x;
    return MHA_OK;
}


mha_status mha_io_meta_count(int *out, const mha_tensors *t, const char *key) {
    mha_status s = mha_io_meta_int(out, t, key);
    if (!s && !*out && mha_tensors_meta(t, key)) /* a "0" is a bad value, not a missing one */
        return mha_fail(MHA_E_FORMAT, "metadata %s = '%.40s'; expected a positive integer (or no %s at all)", key,
                        mha_tensors_meta(t, key), key);
    return s;
}

/* A count from the load option opt, else the metadata, else 0; both given must agree. */
static mha_status pick(int *out, int opt, const mha_tensors *t, const char *key) {
    int m;
    mha_status s = mha_io_meta_count(&m, t, key);
    if (s) return s;
    if (opt && m && opt != m)
        return mha_fail(MHA_E_ARG, "%s = %d was requested but the checkpoint metadata says %d",
                        key, opt, m);
    *out = opt ? opt : m;
    return MHA_OK;
}

mha_status mha_io_pick_heads(int *h, int *hkv, const mha_load_options *o, const mha_tensors *t) {
    mha_status s = pick(h, o->n_heads, t, "n_heads");
    if (!s) s = pick(hkv, o->n_kv_heads, t, "n_kv_heads");
    /* before the layouts multiply it by a head width: a metadata n_kv_heads of 2^30 overflowed int
     * (undefined; a message about (d_kv_in, 0) columns) */
    if (!s && *h && *hkv && *h % *hkv) /* (kv heads above h leave a remainder too) */
        return mha_fail(MHA_E_SHAPE, "n_heads = %d do not split into n_kv_heads = %d groups; expected n_kv_heads "
                        "dividing n_heads (each kv head serves n_heads / n_kv_heads query heads)", *h, *hkv);
    return s;
}

static mha_status divide(int *q, int total, int by, const char *what, const char *tensor) {
    if (by <= 0 || total % by)
        return mha_fail(MHA_E_SHAPE, "tensor '%s': %d columns do not split into %s of %d", tensor,
                        total, what, by);
    *q = total / by;
    return MHA_OK;
}

/* ---------------------------------------------------- staging and copies */

/* Weights being assembled in (in, out) layout before the layer is made. */
typedef struct {
    mha_config cfg;
    float *w[10]; /* w_q w_k w_v w_o b_q b_k b_v b_o bias_k bias_v */
    float *var[4]; /* alibi_slopes sinks q_norm k_norm, or NULL (variants_meta.c) */
    float *gate[2]; /* w_g b_g of a gated layer, or NULL */
    mha_weight_dtype wdtype; /* native: the stored weights' dtype (weights_meta.c) */
    float *scale[MHA_N_MATS]; /* int8: per-column scales of w_q..w_o, w_g; w[], gate[0] hold q */
} staged;
enum { S_WQ, S_WK, S_WV, S_WO, S_BQ, S_BK, S_BV, S_BO, S_BIASK, S_BIASV };

static void staged_free(staged *s) {
    for (int i = 0; i < 10; i++) free(s->w[i]);
    for (int i = 0; i < 4; i++) free(s->var[i]);
    for (int i = 0; i < MHA_N_MATS; i++) free(s->scale[i]);
    free(s->gate[0]), free(s->gate[1]);
}

static mha_status staged_alloc(staged *s) {
    const mha_config *c = &s->cfg;
    size_t qk = (size_t)c->n_heads * c->d_k, kk = (size_t)c->n_kv_heads * c->d_k,
           vv = (size_t)c->n_kv_heads * c->d_v, ov = (size_t)c->n_heads * c->d_v;
    /* d_v_in is 0 (= d_kv_in) in every layout but native */
    size_t vin = (size_t)(c->d_v_in ? c->d_v_in : c->d_kv_in);
    size_t n[10] = {(size_t)c->d_model * qk, (size_t)c->d_kv_in * kk, vin * vv,
                    ov * c->d_model, qk, kk, vv, (size_t)c->d_model, kk, vv};
    for (int i = 0; i < 10; i++) {
        s->w[i] = calloc(n[i] ? n[i] : 1, sizeof(float));
        if (!s->w[i]) return mha_fail(MHA_E_NOMEM, "cannot allocate checkpoint weights");
    }
    return MHA_OK;
}

/* dst (cols_src, dst_cols) at column c0 <- rows [r0, r0+n) of src
 * (rows, cols_src) transposed: nn.Linear (out, in) -> (in, out). In
 * 16x16 blocks, each thread its own block rows of dst: element by element
 * along a source row, every write went to another dst row, and a dst cache
 * line came back 16 times (35% of an hf load of P1's size, on one thread). */
static void put_rows_t(float *dst, int dst_cols, int c0, const float *src, int cols_src, int r0,
                       int n) {
    enum { BLK = 16 };
    /* OpenMP's team, as array.c's decodes (io/ does not reach compute/'s thread count) */
    const int big = (size_t)n * cols_src >= ((size_t)1 << 16);
#pragma omp parallel for schedule(static) if (big)
    for (int cb = 0; cb < cols_src; cb += BLK) /* dst rows cb .. cb+15 */
        for (int ib = 0; ib < n; ib += BLK) {
            const int c1 = cb + BLK < cols_src ? cb + BLK : cols_src, i1 = ib + BLK < n ? ib + BLK : n;
            for (int c = cb; c < c1; c++)
                for (int i = ib; i < i1; i++)
                    dst[(size_t)c * dst_cols + c0 + i] = src[(size_t)(r0 + i) * cols_src + c];
        }
}

/* dst (rows, dst_cols) at column c0 <- columns [s0, s0+n) of src (rows, src_cols). */
static void put_cols(float *dst, int dst_cols, int c0, const float *src, int src_cols, int s0,
                     int n, int rows) {
    for (int r = 0; r < rows; r++)
        memcpy(dst + (size_t)r * dst_cols + c0, src + (size_t)r * src_cols + s0,
               (size_t)n * sizeof(float));
}

static mha_status labels_from_meta(mha_layer *L, const mha_tensors *t) {
    static const char *const keys[5] = {"labels_q", "labels_k", "labels_v", "labels_o", "labels_s"};
    const mha_config *c = mha_layer_config(L);
    for (int b = 0; b < 5; b++) {
        const char *v = mha_tensors_meta(t, keys[b]);
        if (!v) continue;
        int n = (b == MHA_BLOCK_K || b == MHA_BLOCK_V) ? c->n_kv_heads : c->n_heads;
        int *lab = malloc((size_t)n * sizeof *lab);
        if (!lab) return mha_fail(MHA_E_NOMEM, "cannot allocate labels");
        const char *p = v;
        int k = 0;
        mha_status s = MHA_OK;
        for (; k < n && !s; k++) {
            char *end;
            errno = 0;
            long x = strtol(p, &end, 10);
            if (end == p || errno || x < 0 || x > INT_MAX || (*end != ',' && *end != '\0') ||
                (*end == '\0' && k + 1 < n) || (*end == ',' && k + 1 == n))
                s = mha_fail(MHA_E_FORMAT, "metadata %s = '%.60s'; expected %d comma-separated "
                             "head labels", keys[b], v, n);
            lab[k] = (int)x;
            p = end + (*end == ',');
        }
        if (!s) s = mha_layer_set_labels(L, (mha_block)b, lab);
        free(lab);
        if (s) return s;
    }
    return MHA_OK;
}

static mha_status staged_create(mha_layer **out, staged *st, const mha_tensors *t) {
    mha_config c;
    mha_status s = mha_config_resolve(&c, &st->cfg);
    if (s) return s;
    mha_weights w = {.w_q = st->w[S_WQ], .w_k = st->w[S_WK], .w_v = st->w[S_WV], .w_o = st->w[S_WO],
                     .b_q = st->w[S_BQ], .b_k = st->w[S_BK], .b_v = st->w[S_BV], .b_o = st->w[S_BO],
                     .bias_k = st->w[S_BIASK], .bias_v = st->w[S_BIASV], .alibi_slopes = st->var[0],
                     .sinks = st->var[1], .q_norm = st->var[2], .k_norm = st->var[3], .w_g = st->gate[0],
                     .b_g = st->gate[1]};
    if (!c.bias) w.b_q = w.b_k = w.b_v = w.b_o = NULL;
    if (!c.add_bias_kv) w.bias_k = w.bias_v = NULL;
    /* int8: the stored q and scales become the layer's store as they are */
    mha_wstore *store = NULL;
    if (st->wdtype == MHA_W_I8) {
        /* w_q..w_o, w_g: the codes q, then (dequantized in place) the values q * scale */
        float *const val[MHA_N_MATS] = {st->w[S_WQ], st->w[S_WK], st->w[S_WV], st->w[S_WO], st->gate[0]};
        if ((s = mha_wstore_from_i8(&store, &c, (const float *const *)val, (const float *const *)st->scale))) return s;
        mha_wstore_dequantize(store, &c, val);
    }
    if ((s = mha_layer_create(out, &c, &w))) {
        mha_wstore_free(store);
        return s;
    }
    if (store) s = mha_layer_adopt_wstore(*out, store);
    else if (st->wdtype == MHA_W_BF16) s = mha_layer_convert_weights(*out, MHA_W_BF16); /* exact */
    if (s || (s = labels_from_meta(*out, t))) {
        mha_layer_free(*out);
        *out = NULL;
    }
    return s;
}

/* An optional bias: copies it (shape (n,)) or leaves zeros; sets *any. */
static mha_status opt_bias(float *dst, int *any, const mha_tensors *t, const char *prefix,
                           const char *suffix, int n, const char *layout, const char *what) {
    const mha_array *a;
    mha_status s = find(&a, t, prefix, suffix, 0, layout);
    if (s || !a) return s;
    if ((s = want_shape(a, suffix, 1, n, 0, what))) return s;
    memcpy(dst, a->f, (size_t)n * sizeof(float));
    *any = 1;
    return MHA_OK;
}

/* --------------------------------------------------------------- native */

static mha_status load_native(staged *st, const mha_tensors *t, const mha_load_options *o) {
    const char *P = o->prefix, *L = "native";
    const mha_array *wq, *wk, *wv, *wo, *wg;
    mha_status s;
    if ((s = find(&wq, t, P, "w_q", 1, L)) || (s = find(&wk, t, P, "w_k", 1, L)) ||
        (s = find(&wv, t, P, "w_v", 1, L)) || (s = find(&wo, t, P, "w_o", 1, L)) ||
        (s = find(&wg, t, P, "w_g", 0, L)))
        return s;
    /* int8 matrices only in a file whose metadata declares its weights'
     * dtype: weights_meta.c then checks each matrix against it and reads
     * the int8 scales */
    const int i8 = mha_tensors_meta(t, "weights_dtype") != NULL;
    if ((s = want_matrix_of(wq, "w_q", i8)) || (s = want_matrix_of(wk, "w_k", i8)) ||
        (s = want_matrix_of(wv, "w_v", i8)) || (s = want_matrix_of(wo, "w_o", i8)))
        return s;
    mha_config *c = &st->cfg;
    int h, hkv, dk, dv;
    if ((s = mha_io_pick_heads(&h, &hkv, o, t)) || (s = mha_io_meta_count(&dk, t, "d_k")) ||
        (s = mha_io_meta_count(&dv, t, "d_v")))
        return s;
    if (!h) return mha_fail(MHA_E_FORMAT, "native layout: metadata n_heads is missing; pass --heads");
    c->d_model = wq->shape[0];
    c->n_heads = h;
    c->d_kv_in = wk->shape[0];
    c->d_v_in = wv->shape[0]; /* the value source's width (PyTorch's vdim) */
    int dk_cols;
    if ((s = divide(&dk_cols, wq->shape[1], h, "heads", "w_q"))) return s;
    if (dk && dk != dk_cols)
        return mha_fail(MHA_E_SHAPE, "metadata d_k = %d but w_q has %d columns per head", dk, dk_cols);
    c->d_k = dk_cols;
    if (!hkv && (s = divide(&hkv, wk->shape[1], c->d_k, "d_k-wide kv heads", "w_k"))) return s;
    c->n_kv_heads = hkv;
    if ((s = divide(&c->d_v, wo->shape[0], h, "heads", "w_o rows"))) return s;
    if (dv && dv != c->d_v)
        return mha_fail(MHA_E_SHAPE, "metadata d_v = %d but w_o has %d rows per head", dv, c->d_v);
    int zero_attn;
    if ((s = mha_io_meta_int(&zero_attn, t, "add_zero_attn"))) return s;
    c->add_zero_attn = zero_attn;
    if ((s = want_shape_of(wk, "w_k", 2, c->d_kv_in, hkv * c->d_k, "(d_kv_in, h_kv*d_k)", i8)) ||
        (s = want_shape_of(wv, "w_v", 2, c->d_v_in, hkv * c->d_v, "(d_v_in, h_kv*d_v)", i8)) ||
        (s = want_shape_of(wo, "w_o", 2, h * c->d_v, c->d_model, "(h*d_v, d_model)", i8)))
        return s;
    /* w_g's shape before weights_meta.c reads its int8 codes by the config's groups */
    if (wg && (s = want_shape_of(wg, "w_g", 2, c->d_model, h * c->d_v, "(d_model, h*d_v)", i8))) return s;
    const mha_array *const mats[MHA_N_MATS] = {wq, wk, wv, wo, wg}; /* wg: a gated layer's, or NULL */
    if ((s = mha_io_weights_read(&st->wdtype, st->scale, t, P, mats, c))) return s;
    const mha_array *bk, *bv;
    if ((s = find(&bk, t, P, "bias_k", 0, L)) || (s = find(&bv, t, P, "bias_v", 0, L))) return s;
    if (!bk != !bv)
        return mha_fail(MHA_E_FORMAT, "native layout: bias_k and bias_v must come together");
    c->add_bias_kv = bk != NULL;
    if ((s = staged_alloc(st))) return s;
    memcpy(st->w[S_WQ], wq->f, wq->count * sizeof(float));
    memcpy(st->w[S_WK], wk->f, wk->count * sizeof(float));
    memcpy(st->w[S_WV], wv->f, wv->count * sizeof(float));
    memcpy(st->w[S_WO], wo->f, wo->count * sizeof(float));
    int any = 0;
    if ((s = opt_bias(st->w[S_BQ], &any, t, P, "b_q", h * c->d_k, L, "(h*d_k)")) ||
        (s = opt_bias(st->w[S_BK], &any, t, P, "b_k", hkv * c->d_k, L, "(h_kv*d_k)")) ||
        (s = opt_bias(st->w[S_BV], &any, t, P, "b_v", hkv * c->d_v, L, "(h_kv*d_v)")) ||
        (s = opt_bias(st->w[S_BO], &any, t, P, "b_o", c->d_model, L, "(d_model)")))
        return s;
    if (bk && ((s = opt_bias(st->w[S_BIASK], &any, t, P, "bias_k", hkv * c->d_k, L, "(h_kv*d_k)")) ||
               (s = opt_bias(st->w[S_BIASV], &any, t, P, "bias_v", hkv * c->d_v, L, "(h_kv*d_v)"))))
        return s;
    c->bias = any;
    if ((s = mha_io_variants_read(c, st->var, t, P, 0))) return s;
    return mha_io_gate_read(c, st->gate, t, P, st->wdtype == MHA_W_I8);
}

/* ------------------------------------------------------------------- hf */

/* A fused qkv weight ((h + 2*h_kv)*d, d_model) (out, in) (Phi-3's
 * qkv_proj, Baichuan's W_pack, MPT's Wqkv): the rows of every query head,
 * then every kv head's K, then V (not interleaved per group as
 * megatron's), [+ its bias]; d_k = d_v. */
static mha_status load_hf_fused(staged *st, const mha_tensors *t, const mha_load_options *o,
                                const mha_hf_fused_names *fn) {
    const char *P = o->prefix, *L = "hf";
    const mha_array *qkv, *out, *bqkv;
    mha_status s;
    char wq[48], bq[48], wo[48], bo[48];
    snprintf(wq, sizeof wq, "%s.weight", fn->qkv), snprintf(bq, sizeof bq, "%s.bias", fn->qkv);
    snprintf(wo, sizeof wo, "%s.weight", fn->o), snprintf(bo, sizeof bo, "%s.bias", fn->o);
    if ((s = find(&qkv, t, P, wq, 1, L)) || (s = find(&out, t, P, wo, 1, L)) || (s = find(&bqkv, t, P, bq, 0, L)))
        return s;
    if ((s = want_matrix(qkv, wq)) || (s = want_matrix(out, wo))) return s;
    mha_config *c = &st->cfg;
    int h, hkv, d = 0;
    if ((s = mha_io_pick_heads(&h, &hkv, o, t))) return s;
    if (!h) return mha_fail(MHA_E_ARG, "hf layout: the number of heads is not in the file; pass --heads");
    if ((s = divide(&d, out->shape[1], h, "heads", wo))) return s;
    const int rows = qkv->shape[0];
    if (!hkv && rows % d == 0 && rows / d > h && (rows / d - h) % 2 == 0) hkv = (rows / d - h) / 2;
    if (hkv <= 0 || h % hkv)
        return mha_fail(MHA_E_SHAPE, "tensor '%s' has %d rows; expected (h + 2*h_kv)*d with h = %d, "
                        "d = %d and h_kv dividing h", wq, rows, h, d);
    c->n_heads = h, c->n_kv_heads = hkv, c->d_k = c->d_v = d;
    c->d_model = c->d_kv_in = qkv->shape[1];
    const int nq = h * d, nk = hkv * d;
    if ((s = want_shape(qkv, wq, 2, nq + 2 * nk, c->d_model, "((h + 2*h_kv)*d, d_model)")) ||
        (s = want_shape(out, wo, 2, c->d_model, nq, "(d_model, h*d)")) ||
        (bqkv && (s = want_shape(bqkv, bq, 1, nq + 2 * nk, 0, "((h + 2*h_kv)*d)"))))
        return s;
    if ((s = staged_alloc(st))) return s;
    put_rows_t(st->w[S_WQ], nq, 0, qkv->f, c->d_model, 0, nq);
    put_rows_t(st->w[S_WK], nk, 0, qkv->f, c->d_model, nq, nk);
    put_rows_t(st->w[S_WV], nk, 0, qkv->f, c->d_model, nq + nk, nk);
    put_rows_t(st->w[S_WO], c->d_model, 0, out->f, nq, 0, c->d_model);
    int any = bqkv != NULL;
    if (bqkv) {
        memcpy(st->w[S_BQ], bqkv->f, sizeof(float) * (size_t)nq);
        memcpy(st->w[S_BK], bqkv->f + nq, sizeof(float) * (size_t)nk);
        memcpy(st->w[S_BV], bqkv->f + nq + nk, sizeof(float) * (size_t)nk);
    }
    if ((s = opt_bias(st->w[S_BO], &any, t, P, bo, c->d_model, L, "(d_model)"))) return s;
    c->bias = any;
    return mha_io_variants_read(c, st->var, t, P, 1);
}

/* A gated q_proj (Qwen3-Next's attn_output_gate) into the staged W_Q and
 * W_G: rows [r*2d, r*2d + d) are head r's query, the next d its gate (d =
 * d_k = d_v), and its bias, when there is one, split alike (*any set). */
static mha_status put_gated_q(staged *st, int *any, const mha_tensors *t, const char *P, const mha_array *q,
                              const char *bias_name) {
    mha_config *c = &st->cfg;
    const int h = c->n_heads, d = c->d_k, D = c->d_model;
    c->output_gate = 1;
    if (!(st->gate[0] = malloc(sizeof(float) * (size_t)D * h * d)))
        return mha_fail(MHA_E_NOMEM, "hf layout: no memory for the output gate");
    for (int r = 0; r < h; r++) {
        put_rows_t(st->w[S_WQ], h * d, r * d, q->f, D, 2 * r * d, d);
        put_rows_t(st->gate[0], h * d, r * d, q->f, D, 2 * r * d + d, d);
    }
    const mha_array *bq;
    mha_status s = find(&bq, t, P, bias_name, 0, "hf");
    if (s || (bq && (s = want_shape(bq, bias_name, 1, 2 * h * d, 0, "(h*2*d_k): each head's query then gate bias"))))
        return s;
    if (bq && !(st->gate[1] = malloc(sizeof(float) * (size_t)h * d)))
        return mha_fail(MHA_E_NOMEM, "hf layout: no memory for the gate's bias");
    for (int r = 0; bq && r < h; r++) {
        memcpy(st->w[S_BQ] + (size_t)r * d, bq->f + (size_t)2 * r * d, sizeof(float) * (size_t)d);
        memcpy(st->gate[1] + (size_t)r * d, bq->f + (size_t)(2 * r + 1) * d, sizeof(float) * (size_t)d);
    }
    *any |= bq != NULL;
    return MHA_OK;
}

static mha_status load_hf(staged *st, const mha_tensors *t, const mha_load_options *o) {
    const char *P = o->prefix, *L = "hf";
    const mha_array *q, *k, *v, *out;
    mha_status s;
    const mha_hf_names *hn = mha_io_hf_names(t, P);
    char w[4][48], b[4][48]; /* q, k, v, o: .weight and .bias */
    const char *const base[4] = {hn->q, hn->k, hn->v, hn->o};
    for (int m = 0; m < 4; m++) snprintf(w[m], sizeof w[m], "%s.weight", base[m]), snprintf(b[m], sizeof b[m], "%s.bias", base[m]);
    if ((s = find(&q, t, P, w[0], 0, L))) return s;
    const mha_hf_fused_names *fn = q ? NULL : mha_io_hf_fused(t, P);
    if (fn && o->output_gate)
        return mha_fail(MHA_E_UNSUPPORTED, "hf layout: output_gate with a fused %s.weight; expected q_proj holding "
                        "each head's query then its gate (Qwen3-Next)", fn->qkv);
    if (fn) return load_hf_fused(st, t, o, fn);
    if ((s = find(&q, t, P, w[0], 1, L)) || (s = find(&k, t, P, w[1], 1, L)) || (s = find(&v, t, P, w[2], 1, L)) ||
        (s = find(&out, t, P, w[3], 1, L)))
        return s;
    if ((s = want_matrix(q, w[0])) || (s = want_matrix(k, w[1])) || (s = want_matrix(v, w[2])) ||
        (s = want_matrix(out, w[3])))
        return s;
    mha_config *c = &st->cfg;
    int h, hkv;
    if ((s = mha_io_pick_heads(&h, &hkv, o, t)))
        return s;
    if (!h) return mha_fail(MHA_E_ARG, "hf layout: the number of heads is not in the file; pass --heads");
    c->n_heads = h;
    c->d_model = q->shape[1];
    c->d_kv_in = k->shape[1];
    const int gated = o->output_gate; /* Qwen3-Next: q_proj rows per head [query d_k; gate d_k] */
    if ((s = divide(&c->d_k, q->shape[0], gated ? 2 * h : h, gated ? "heads' query and gate" : "heads", w[0])))
        return s;
    if (!hkv && (s = divide(&hkv, k->shape[0], c->d_k, "d_k-wide kv heads", w[1])))
        return s;
    c->n_kv_heads = hkv;
    if (gated && k->shape[0] != hkv * c->d_k)
        return mha_fail(MHA_E_SHAPE, "hf layout: %s's %d rows read as %d heads' query and gate give d_k = %d, but %s "
                        "has %d rows for %d kv heads; expected q_proj of h*2*head_dim rows (each head's query, then "
                        "its gate: attn_output_gate)", w[0], q->shape[0], h, c->d_k, w[1], k->shape[0], hkv);
    if ((s = divide(&c->d_v, v->shape[0], hkv, "kv heads", w[2]))) return s;
    if ((s = want_shape(k, w[1], 2, hkv * c->d_k, c->d_kv_in, "(h_kv*d_k, d_kv_in)")) ||
        (s = want_shape(v, w[2], 2, hkv * c->d_v, c->d_kv_in, "(h_kv*d_v, d_kv_in)")) ||
        (s = want_shape(out, w[3], 2, c->d_model, h * c->d_v, "(d_model, h*d_v)")))
        return s;
    if (gated && c->d_v != c->d_k)
        return mha_fail(MHA_E_SHAPE, "hf layout: a gated q_proj of d_k = %d per head with d_v = %d; expected the "
                        "gate as wide as each head's output (d_v = d_k)", c->d_k, c->d_v);
    if ((s = staged_alloc(st))) return s;
    int any = 0;
    if (gated) s = put_gated_q(st, &any, t, P, q, b[0]);
    else put_rows_t(st->w[S_WQ], h * c->d_k, 0, q->f, c->d_model, 0, h * c->d_k);
    put_rows_t(st->w[S_WK], hkv * c->d_k, 0, k->f, c->d_kv_in, 0, hkv * c->d_k);
    put_rows_t(st->w[S_WV], hkv * c->d_v, 0, v->f, c->d_kv_in, 0, hkv * c->d_v);
    put_rows_t(st->w[S_WO], c->d_model, 0, out->f, h * c->d_v, 0, c->d_model);
    if (s || (!gated && (s = opt_bias(st->w[S_BQ], &any, t, P, b[0], h * c->d_k, L, "(h*d_k)"))) ||
        (s = opt_bias(st->w[S_BK], &any, t, P, b[1], hkv * c->d_k, L, "(h_kv*d_k)")) ||
        (s = opt_bias(st->w[S_BV], &any, t, P, b[2], hkv * c->d_v, L, "(h_kv*d_v)")) ||
        (s = opt_bias(st->w[S_BO], &any, t, P, b[3], c->d_model, L, "(d_model)")))
        return s;
    c->bias = any;
    /* a bias elsewhere and none in a gated q_proj: b_G = 0 */
    if (gated && any && !st->gate[1] && !(st->gate[1] = calloc((size_t)h * c->d_k, sizeof(float))))
        return mha_fail(MHA_E_NOMEM, "hf layout: no memory for the gate's bias");
    return mha_io_variants_read(c, st->var, t, P, 1);
}

/* ------------------------------------------------------------- megatron */

/* Megatron's fused ((h + 2 h_kv) d, d_model) rows per kv group g: [q heads
 * g*n_rep .. (g+1)*n_rep-1, k_g, v_g], each d rows (out, in), under the
 * names qkv (query_key_value) and out (dense);
 * GPT-BigCode's nn.Linear c_attn / c_proj are the same rows (MQA: all q
 * heads, k, v; else per head q, k, v). */
static mha_status load_fused_groups(staged *st, const mha_tensors *t, const mha_load_options *o, const char *qkv_name,
                                    const char *out_name, const char *L) {
    const char *P = o->prefix;
    const mha_array *qkv, *dense, *bqkv;
    mha_status s;
    char wq[48], bq[48], wo[48], bo[48];
    snprintf(wq, sizeof wq, "%s.weight", qkv_name), snprintf(bq, sizeof bq, "%s.bias", qkv_name);
    snprintf(wo, sizeof wo, "%s.weight", out_name), snprintf(bo, sizeof bo, "%s.bias", out_name);
    if ((s = find(&qkv, t, P, wq, 1, L)) || (s = find(&dense, t, P, wo, 1, L)) || (s = find(&bqkv, t, P, bq, 0, L)))
        return s;
    if ((s = want_matrix(qkv, wq)) || (s = want_matrix(dense, wo))) return s;
    mha_config *c = &st->cfg;
    int h, hkv, d = 0;
    if ((s = mha_io_pick_heads(&h, &hkv, o, t)))
        return s;
    if (!h) return mha_fail(MHA_E_ARG, "%s layout: the number of heads is not in the file; pass --heads", L);
    c->d_model = qkv->shape[1];
    c->d_kv_in = c->d_model;
    if ((s = divide(&d, dense->shape[1], h, "heads", wo))) return s;
    int rows = qkv->shape[0];
    if (!hkv) {
        if (rows % d || (rows / d - h) <= 0 || (rows / d - h) % 2)
            return mha_fail(MHA_E_SHAPE, "tensor '%s' has %d rows; expected "
                            "(h + 2*h_kv)*d with h = %d, d = %d", wq, rows, h, d);
        hkv = (rows / d - h) / 2;
    }
    if (hkv <= 0 || h % hkv)
        return mha_fail(MHA_E_SHAPE, "%s layout: %d kv heads do not divide %d heads", L, hkv, h);
    c->n_heads = h;
    c->n_kv_heads = hkv;
    c->d_k = c->d_v = d;
    if ((s = want_shape(qkv, wq, 2, (h + 2 * hkv) * d, c->d_model,
                        "((h + 2*h_kv)*d, d_model)")) ||
        (s = want_shape(dense, wo, 2, c->d_model, h * d, "(d_model, h*d)")))
        return s;
    if (bqkv && (s = want_shape(bqkv, bq, 1, (h + 2 * hkv) * d, 0,
                                "((h + 2*h_kv)*d)")))
        return s;
    if ((s = staged_alloc(st))) return s;
    int rep = h / hkv, group_rows = (rep + 2) * d;
    for (int g = 0; g < hkv; g++) {
        int r0 = g * group_rows;
        put_rows_t(st->w[S_WQ], h * d, g * rep * d, qkv->f, c->d_model, r0, rep * d);
        put_rows_t(st->w[S_WK], hkv * d, g * d, qkv->f, c->d_model, r0 + rep * d, d);
        put_rows_t(st->w[S_WV], hkv * d, g * d, qkv->f, c->d_model, r0 + (rep + 1) * d, d);
        if (bqkv) {
            memcpy(st->w[S_BQ] + (size_t)g * rep * d, bqkv->f + r0, (size_t)rep * d * sizeof(float));
            memcpy(st->w[S_BK] + (size_t)g * d, bqkv->f + r0 + rep * d, (size_t)d * sizeof(float));
            memcpy(st->w[S_BV] + (size_t)g * d, bqkv->f + r0 + (rep + 1) * d, (size_t)d * sizeof(float));
        }
    }
    put_rows_t(st->w[S_WO], c->d_model, 0, dense->f, h * d, 0, c->d_model);
    int any = bqkv != NULL;
    s = opt_bias(st->w[S_BO], &any, t, P, bo, c->d_model, L, "(d_model)");
    c->bias = any;
    return s;
}

const char *mha_io_megatron_qkv(const mha_tensors *t, const char *prefix) {
    for (int i = 0; i < t->n; i++)
        if (mha_io_name_fits(t->items[i].name, prefix, "query_key_value.weight")) return "query_key_value";
    for (int i = 0; i < t->n; i++)
        if (mha_io_name_fits(t->items[i].name, prefix, "wqkv.weight")) return "wqkv";
    return "query_key_value"; /* its names then appear in the errors */
}

static mha_status load_megatron(staged *st, const mha_tensors *t, const mha_load_options *o) {
    const char *qkv = mha_io_megatron_qkv(t, o->prefix);
    return load_fused_groups(st, t, o, qkv, strcmp(qkv, "wqkv") ? "dense" : "wo", "megatron");
}

/* -------------------------------------------------------------- codegen */

/* CodeGen's qkv_proj ((3E, E), (out, in)): its rows are mp_num = 4 blocks
 * (the TPU cores it was trained on), block b = [q; v; k] of the heads
 * b*h/4 .. (b+1)*h/4 - 1, each part E/4 rows; out_proj (E, E). Neither has
 * a bias. Only by name (--layout codegen): OpenELM keeps the same two
 * names for rows [every q head; every k; every v]. */
static mha_status load_codegen(staged *st, const mha_tensors *t, const mha_load_options *o) {
    enum { MP = 4 }; /* CodeGenAttention's mp_num, fixed in its code */
    const char *P = o->prefix, *L = "codegen";
    const mha_array *qkv, *out, *bias[2];
    mha_status s;
    if ((s = find(&qkv, t, P, "qkv_proj.weight", 1, L)) || (s = find(&out, t, P, "out_proj.weight", 1, L)) ||
        (s = find(&bias[0], t, P, "qkv_proj.bias", 0, L)) || (s = find(&bias[1], t, P, "out_proj.bias", 0, L)))
        return s;
    if (bias[0] || bias[1]) /* its blocks would have to be guessed */
        return mha_fail(MHA_E_FORMAT, "codegen layout: tensor '%s' is present; expected none: CodeGen's qkv_proj "
                        "and out_proj have no bias", bias[0] ? "qkv_proj.bias" : "out_proj.bias");
    if ((s = want_matrix(qkv, "qkv_proj.weight")) || (s = want_matrix(out, "out_proj.weight"))) return s;
    mha_config *c = &st->cfg;
    int h, hkv, d = 0;
    if ((s = mha_io_pick_heads(&h, &hkv, o, t))) return s;
    if (!h) return mha_fail(MHA_E_ARG, "codegen layout: the number of heads is not in the file; pass --heads");
    if (hkv && hkv != h)
        return mha_fail(MHA_E_ARG, "codegen layout has one kv head per head; got n_kv_heads = %d", hkv);
    if (h % MP)
        return mha_fail(MHA_E_SHAPE, "codegen layout: %d heads do not split into qkv_proj's mp_num = %d blocks; "
                        "expected a multiple of %d heads", h, MP, MP);
    const int E = qkv->shape[1];
    if ((s = divide(&d, E, h, "heads", "qkv_proj.weight"))) return s;
    if ((s = want_shape(qkv, "qkv_proj.weight", 2, 3 * E, E, "(3E, E)")) ||
        (s = want_shape(out, "out_proj.weight", 2, E, E, "(E, E)")))
        return s;
    c->d_model = c->d_kv_in = E;
    c->n_heads = c->n_kv_heads = h;
    c->d_k = c->d_v = d;
    if ((s = staged_alloc(st))) return s;
    const int part = E / MP; /* rows of one block's q (v, k): its h/4 heads */
    for (int b = 0; b < MP; b++) {
        const int r0 = b * 3 * part;
        put_rows_t(st->w[S_WQ], E, b * part, qkv->f, E, r0, part);
        put_rows_t(st->w[S_WV], E, b * part, qkv->f, E, r0 + part, part);
        put_rows_t(st->w[S_WK], E, b * part, qkv->f, E, r0 + 2 * part, part);
    }
    put_rows_t(st->w[S_WO], E, 0, out->f, E, 0, E);
    return MHA_OK;
}

/* ----------------------------------------------------------------- gpt2 */

static mha_status load_gpt2(staged *st, const mha_tensors *t, const mha_load_options *o) {
    const char *P = o->prefix, *L = "gpt2";
    const mha_array *ca, *cp, *ba, *bp;
    mha_status s;
    if ((s = find(&ca, t, P, "c_attn.weight", 1, L)) || (s = find(&cp, t, P, "c_proj.weight", 1, L)) ||
        (s = find(&ba, t, P, "c_attn.bias", 0, L)) || (s = find(&bp, t, P, "c_proj.bias", 0, L)))
        return s;
    if ((s = want_matrix(ca, "c_attn.weight")) || (s = want_matrix(cp, "c_proj.weight"))) return s;
    if (ca->shape[0] > ca->shape[1]) /* nn.Linear (out, in), GPT-BigCode: Conv1D's (D, 3E) has more columns */
        return load_fused_groups(st, t, o, "c_attn", "c_proj", "gpt2 (GPT-BigCode)");
    mha_config *c = &st->cfg;
    int h, hkv;
    if ((s = mha_io_pick_heads(&h, &hkv, o, t)))
        return s;
    if (!h) return mha_fail(MHA_E_ARG, "gpt2 layout: the number of heads is not in the file; pass --heads");
    if (hkv && hkv != h)
        return mha_fail(MHA_E_ARG, "gpt2 layout has one kv head per head; got n_kv_heads = %d", hkv);
    int E = 0;
    if ((s = divide(&E, ca->shape[1], 3, "q, k, v parts", "c_attn.weight"))) return s;
    c->d_model = ca->shape[0];
    c->n_heads = c->n_kv_heads = h;
    c->d_kv_in = c->d_model;
    if ((s = divide(&c->d_k, E, h, "heads", "c_attn.weight (one third)"))) return s;
    c->d_v = c->d_k;
    if ((s = want_shape(cp, "c_proj.weight", 2, E, c->d_model, "(E, d_model), Conv1D (in, out)")))
        return s;
    if ((s = staged_alloc(st))) return s;
    /* Conv1D is already (in, out): Q, K, V are column thirds */
    for (int part = 0; part < 3; part++)
        put_cols(st->w[part], E, 0, ca->f, 3 * E, part * E, E, c->d_model);
    memcpy(st->w[S_WO], cp->f, cp->count * sizeof(float));
    if (ba) {
        if ((s = want_shape(ba, "c_attn.bias", 1, 3 * E, 0, "(3E)"))) return s;
        for (int part = 0; part < 3; part++)
            memcpy(st->w[S_BQ + part], ba->f + (size_t)part * E, (size_t)E * sizeof(float));
    }
    if (bp) {
        if ((s = want_shape(bp, "c_proj.bias", 1, c->d_model, 0, "(d_model)"))) return s;
        memcpy(st->w[S_BO], bp->f, (size_t)c->d_model * sizeof(float));
    }
    c->bias = ba || bp;
    return MHA_OK;
}

/* ---------------------------------------------------------------- torch */

/* Shapes are checked here; the conversion itself is convert_torch.c's. */
static mha_status load_torch(mha_layer **out, const mha_tensors *t, const mha_load_options *o) {
    const char *P = o->prefix, *L = "torch";
    const mha_array *in_w, *in_b, *qw, *kw, *vw, *ow, *ob, *bk, *bv;
    mha_status s;
    if ((s = find(&in_w, t, P, "in_proj_weight", 0, L)) || (s = find(&in_b, t, P, "in_proj_bias", 0, L)) ||
        (s = find(&qw, t, P, "q_proj_weight", 0, L)) || (s = find(&kw, t, P, "k_proj_weight", 0, L)) ||
        (s = find(&vw, t, P, "v_proj_weight", 0, L)) || (s = find(&ow, t, P, "out_proj.weight", 1, L)) ||
        (s = find(&ob, t, P, "out_proj.bias", 0, L)) || (s = find(&bk, t, P, "bias_k", 0, L)) ||
        (s = find(&bv, t, P, "bias_v", 0, L)))
        return s;
    if ((s = want_matrix(ow, "out_proj.weight"))) return s;
    int E = ow->shape[0], h, hkv, zero_attn;
    if ((s = want_shape(ow, "out_proj.weight", 2, E, E, "(E, E)"))) return s;
    if ((s = mha_io_pick_heads(&h, &hkv, o, t)) ||
        (s = mha_io_meta_int(&zero_attn, t, "add_zero_attn")))
        return s;
    if (!h) return mha_fail(MHA_E_ARG, "torch layout: the number of heads is not in the file; pass --heads");
    if (hkv && hkv != h)
        return mha_fail(MHA_E_ARG, "torch layout (nn.MultiheadAttention) has no GQA; got n_kv_heads = %d", hkv);
    mha_torch_weights tw = {.embed_dim = E, .num_heads = h, .add_zero_attn = zero_attn || o->add_zero_attn,
                            .out_proj_weight = ow->f};
    if (in_w) {
        if ((s = want_shape(in_w, "in_proj_weight", 2, 3 * E, E, "(3E, E)"))) return s;
        tw.in_proj_weight = in_w->f;
    } else {
        if (!qw || !kw || !vw)
            return mha_fail(MHA_E_FORMAT, "torch layout: need in_proj_weight or all of "
                            "q_proj_weight, k_proj_weight, v_proj_weight");
        if ((s = want_matrix(kw, "k_proj_weight")) || (s = want_matrix(vw, "v_proj_weight")))
            return s;
        tw.kdim = kw->shape[1];
        tw.vdim = vw->shape[1];
        if ((s = want_shape(qw, "q_proj_weight", 2, E, E, "(E, E)")) ||
            (s = want_shape(kw, "k_proj_weight", 2, E, tw.kdim, "(E, kdim)")) ||
            (s = want_shape(vw, "v_proj_weight", 2, E, tw.vdim, "(E, vdim)")))
            return s;
        tw.q_proj_weight = qw->f;
        tw.k_proj_weight = kw->f;
        tw.v_proj_weight = vw->f;
    }
    if (in_b) {
        if ((s = want_shape(in_b, "in_proj_bias", 1, 3 * E, 0, "(3E)"))) return s;
        tw.in_proj_bias = in_b->f;
    }
    if (ob) {
        if ((s = want_shape(ob, "out_proj.bias", 1, E, 0, "(E)"))) return s;
        tw.out_proj_bias = ob->f;
    }
    if (!bk != !bv) return mha_fail(MHA_E_FORMAT, "torch layout: bias_k and bias_v must come together");
    if (bk) {
        if (bk->count != (size_t)E || !bk->f || bv->count != (size_t)E || !bv->f)
            return mha_fail(MHA_E_SHAPE, "torch layout: bias_k and bias_v must hold E = %d floats "
                            "(shape (1, 1, E))", E);
        tw.bias_k = bk->f;
        tw.bias_v = bv->f;
    }
    if ((s = mha_layer_from_torch(out, &tw))) return s;
    if ((s = labels_from_meta(*out, t))) {
        mha_layer_free(*out);
        *out = NULL;
    }
    return s;
}

/* ------------------------------------------------------------ front door */

mha_status mha_layer_from_tensors(mha_layer **out, const mha_tensors *t,
                                  const mha_load_options *opt) {
    if (!out || !t) return mha_fail(MHA_E_ARG, "mha_layer_from_tensors: NULL argument");
    *out = NULL;
    mha_load_options o = {0};
    if (opt) o = *opt;
    if (o.n_heads < 0 || o.n_kv_heads < 0)
        return mha_fail(MHA_E_ARG, "n_heads = %d, n_kv_heads = %d; expected >= 0 (0: from the file)",
                        o.n_heads, o.n_kv_heads);
    if (o.add_zero_attn != 0 && o.add_zero_attn != 1)
        return mha_fail(MHA_E_ARG, "add_zero_attn = %d; expected 0 (as the file says) or 1", o.add_zero_attn);
    if (o.output_gate != 0 && o.output_gate != 1)
        return mha_fail(MHA_E_ARG, "output_gate = %d; expected 0 or 1 (the hf q_proj holds each head's gate)",
                        o.output_gate);
    mha_status s;
    char path[4096];
    if (o.layout == MHA_LAYOUT_AUTO && (s = mha_io_detect(&o.layout, t, o.prefix))) return s;
    if ((s = mha_io_layer_path(&o, path, sizeof path, t))) return s;
    if (o.layout != MHA_LAYOUT_NATIVE && (s = mha_io_refuse_unread_norms(t, o.prefix))) return s;
    if (o.output_gate && o.layout != MHA_LAYOUT_HF) /* a native file says it itself */
        return mha_fail(MHA_E_ARG, "output_gate = 1 with the %s layout; expected the hf layout, whose q_proj holds "
                        "each head's query then its gate (Qwen3-Next)", mha_layout_name(o.layout));
    if (o.layout == MHA_LAYOUT_TORCH) return load_torch(out, t, &o);
    staged st;
    memset(&st, 0, sizeof st);
    switch (o.layout) {
    case MHA_LAYOUT_NATIVE: s = load_native(&st, t, &o); break;
    case MHA_LAYOUT_HF: s = load_hf(&st, t, &o); break;
    case MHA_LAYOUT_GPT2: s = load_gpt2(&st, t, &o); break;
    case MHA_LAYOUT_MEGATRON: s = load_megatron(&st, t, &o); break;
    case MHA_LAYOUT_CODEGEN: s = load_codegen(&st, t, &o); break;
    default: s = mha_fail(MHA_E_ARG, "layout %d is not one of mha_layout", (int)o.layout);
    }
    if (!s && o.add_zero_attn) st.cfg.add_zero_attn = 1;
    if (!s) s = staged_create(out, &st, t);
    staged_free(&st);
    return s;
}

static mha_status put_int(mha_tensors *t, const char *key, int v) {
    char buf[16];
    snprintf(buf, sizeof buf, "%d", v);
    return mha_tensors_set_meta(t, key, buf);
}

/* mha_layer_to_tensors with the layer held as a reader. */
static mha_status layer_to_tensors_held(mha_tensors **out, const mha_layer *L) {
    const mha_config *c = mha_layer_config(L);
    mha_weights w;
    mha_layer_get_weights(L, &w);
    int h = c->n_heads, hkv = c->n_kv_heads;
    mha_tensors *t;
    mha_status s = mha_tensors_create(&t);
    if (s) return s;
    int sq[2] = {c->d_model, h * c->d_k}, sk[2] = {c->d_kv_in, hkv * c->d_k},
        sv[2] = {c->d_v_in, hkv * c->d_v}, so[2] = {h * c->d_v, c->d_model};
    if (!s) s = mha_io_weights_write(t, L); /* w_q..w_o in the layer's dtype */
    if (c->bias) {
        if (!s) s = mha_tensors_add_f32(t, "b_q", w.b_q, 1, sq + 1);
        if (!s) s = mha_tensors_add_f32(t, "b_k", w.b_k, 1, sk + 1);
        if (!s) s = mha_tensors_add_f32(t, "b_v", w.b_v, 1, sv + 1);
        if (!s) s = mha_tensors_add_f32(t, "b_o", w.b_o, 1, so + 1);
    }
    if (c->add_bias_kv) {
        if (!s) s = mha_tensors_add_f32(t, "bias_k", w.bias_k, 1, sk + 1);
        if (!s) s = mha_tensors_add_f32(t, "bias_v", w.bias_v, 1, sv + 1);
    }
    if (!s) s = mha_tensors_set_meta(t, "format", "mha-native");
    if (!s) s = put_int(t, "n_heads", h);
    if (!s) s = put_int(t, "n_kv_heads", hkv);
    if (!s) s = put_int(t, "d_k", c->d_k);
    if (!s) s = put_int(t, "d_v", c->d_v);
    if (!s) s = put_int(t, "add_zero_attn", c->add_zero_attn);
    if (!s) s = mha_io_variants_write(t, L);
    static const char *const keys[5] = {"labels_q", "labels_k", "labels_v", "labels_o", "labels_s"};
    int *lab = malloc((size_t)h * sizeof *lab);
    char *txt = malloc((size_t)h * 12 + 1);
    if (!lab || !txt) s = s ? s : mha_fail(MHA_E_NOMEM, "cannot allocate labels");
    for (int b = 0; b < 4 + (c->alibi || c->sinks) && !s; b++) {
        int n = (b == MHA_BLOCK_K || b == MHA_BLOCK_V) ? hkv : h;
        if ((s = mha_layer_labels(L, (mha_block)b, lab))) break;
        size_t u = 0;
        txt[0] = '\0';
        for (int i = 0; i < n; i++) u += (size_t)sprintf(txt + u, "%s%d", i ? "," : "", lab[i]);
        s = mha_tensors_set_meta(t, keys[b], txt);
    }
    free(lab);
    free(txt);
    if (s) {
        mha_tensors_free(t);
        return s;
    }
    *out = t;
    return MHA_OK;
}

/* A reader of the layer (mha_layer_begin): a change made meanwhile (set
 * weights, a permutation, a conversion) would be copied half done, its
 * labels and weights from different layers, into a file that loads. */
mha_status mha_layer_to_tensors(mha_tensors **out, const mha_layer *L) {
    if (!out || !L) return mha_fail(MHA_E_ARG, "mha_layer_to_tensors: NULL argument");
    *out = NULL;
    mha_status s = mha_layer_begin(L, 0, "mha_layer_to_tensors");
    return s ? s : mha_layer_end(L, 0, layer_to_tensors_held(out, L));
}

mha_status mha_layer_load(mha_layer **out, const char *path, const mha_load_options *opt) {
    if (!out || !path) return mha_fail(MHA_E_ARG, "mha_layer_load: NULL argument");
    *out = NULL;
    /* The float32 tensors borrow the file's mapping: the layouts read the
     * file's bytes directly, and the mapping is gone when this returns. */
    mha_tensors *t;
    mha_status s = mha_io_checkpoint_map(&t, path, opt ? opt->prefix : NULL, MHA_IO_UNCHECKED_FILL);
    if (s) return s;
    s = mha_layer_from_tensors(out, t, opt);
    mha_tensors_free(t);
    if (s) {
        /* prefix the file name once, keeping the reader's detail */
        char msg[400];
        snprintf(msg, sizeof msg, "%s", mha_last_error());
        return mha_fail(s, "%s: %s", path, msg);
    }
    return MHA_OK;
}

mha_status mha_layer_save(const mha_layer *L, const char *path) {
    mha_tensors *t;
    mha_status s = mha_layer_to_tensors(&t, L);
    if (s) return s;
    s = mha_safetensors_write(path, t);
    mha_tensors_free(t);
    return s;
}
