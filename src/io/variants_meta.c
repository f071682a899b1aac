/* variants_meta.c — today's attention variants in checkpoints: the
 * settings as metadata keys (native and hf read the same keys) and the
 * per-head tensors (native: alibi_slopes, sinks, q_norm, k_norm; hf:
 * q_norm.weight, k_norm.weight as Qwen 3 stores them, (d_k), or as
 * OLMo 2 does, (h*d_k) and (h_kv*d_k): a norm over the whole width; as
 * Cohere does, (h, d_k) and (h_kv, d_k): a LayerNorm of each head;
 * StableLM's q_layernorm.norms.N.weight, a LayerNorm of each head; and
 * LFM2's q_layernorm.weight / k_layernorm.weight and Ling's
 * query_layernorm.weight / key_layernorm.weight, Qwen 3's RMSNorm under
 * other names).
 * Legend: h heads, h_kv kv heads, d_k. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/io_internal.h"
#include "io/tensors_internal.h"

static const char *const pairing_names[] = {"none", "halves", "interleaved"};
static const char *const scaling_names[] = {"none", "linear", "llama3", "yarn", "dynamic", "longrope"};
static const char *const norm_names[] = {"none", "rms", "layer"};
static const char *const temperature_rule_names[] = {"llama4", "ministral3"};

/* index of value v among names (n), or -1 */
static int pick_name(const char *v, const char *const *names, int n) {
    for (int i = 0; i < n; i++)
        if (strcmp(v, names[i]) == 0) return i;
    return -1;
}

static mha_status meta_choice(int *out, const mha_tensors *t, const char *key, const char *const *names, int n,
                              const char *expected) {
    const char *v = mha_tensors_meta(t, key);
    if (!v) return MHA_OK;
    if ((*out = pick_name(v, names, n)) < 0)
        return mha_fail(MHA_E_FORMAT, "metadata %s = '%.40s'; expected %s", key, v, expected);
    return MHA_OK;
}

/* A finite double from the metadata (absent: *out unchanged). */
static mha_status meta_double(double *out, const mha_tensors *t, const char *key) {
    const char *v = mha_tensors_meta(t, key);
    if (!v) return MHA_OK;
    char *end;
    errno = 0;
    double x = mha_c_strtod(v, &end);
    if (end == v || *end || errno || !isfinite(x))
        return mha_fail(MHA_E_FORMAT, "metadata %s = '%.40s'; expected a finite number", key, v);
    *out = x;
    return MHA_OK;
}

static mha_status meta_flag(int *out, const mha_tensors *t, const char *key) {
    double x = *out;
    mha_status s = meta_double(&x, t, key);
    if (!s && x != 0 && x != 1)
        return mha_fail(MHA_E_FORMAT, "metadata %s = '%.40s'; expected 0 or 1", key, mha_tensors_meta(t, key));
    *out = (int)x;
    return s;
}

/* A comma-separated list of at most n finite floats (absent: out unchanged;
 * shorter: the rest 0): LongRoPE's factors per rotated pair. */
static mha_status meta_floats(float *out, int n, const mha_tensors *t, const char *key) {
    const char *v = mha_tensors_meta(t, key);
    if (!v) return MHA_OK;
    memset(out, 0, sizeof(float) * (size_t)n);
    for (int i = 0;; i++) {
        char *end;
        errno = 0;
        const double x = mha_c_strtod(v, &end);
        if (i == n || end == v || errno || !isfinite(x) || fabs(x) > 3e38 || (*end && *end != ','))
            return mha_fail(MHA_E_FORMAT, "metadata %s: item %d %s; expected at most %d finite numbers separated "
                            "by commas", key, i, i == n ? "is one too many" : "is not a finite number", n);
        out[i] = (float)x;
        if (!*end) return MHA_OK;
        v = end + 1;
    }
}

/* A copy of tensor a (count floats) checked against n1 (or n2 when > 0). */
static mha_status take(float **dst, const mha_array *a, const char *name, size_t n1, size_t n2, const char *want) {
    mha_status s = mha_io_want_real(a, name);
    if (s) return s;
    if ((a->count != n1 && (n2 == 0 || a->count != n2)) || a->rank < 1 || a->rank > 2)
        return mha_fail(MHA_E_SHAPE, "tensor %s has %zu elements of rank %d; expected %s", name, a->count, a->rank,
                        want);
    if (!(*dst = malloc(sizeof(float) * a->count))) return mha_fail(MHA_E_NOMEM, "no memory for %s", name);
    memcpy(*dst, a->f, sizeof(float) * a->count);
    return MHA_OK;
}

mha_status mha_io_refuse_unread_norms(const mha_tensors *t, const char *prefix) {
    /* the first 8 are read when no bias is beside them (LFM2's and Ling's RMSNorm); a bias under Ling's
     * names went unread, the layer running without it (before, query_/key_layernorm.bias were not listed) */
    static const char *const names[] = {"q_layernorm.weight", "q_layernorm.bias", "k_layernorm.weight",
                                        "k_layernorm.bias", "query_layernorm.weight", "query_layernorm.bias",
                                        "key_layernorm.weight", "key_layernorm.bias", "q_norm.bias", "k_norm.bias",
                                        "q_ln.weight", "q_ln.bias", "k_ln.weight", "k_ln.bias"};
    enum { READ = 8, N = sizeof names / sizeof *names };
    int biased = 0; /* a bias beside the weights: Phi's, Persimmon's, MPT's LayerNorm */
    for (int i = 0; i < mha_tensors_count(t); i++)
        for (int k = 0; k < N; k++)
            biased |= strstr(names[k], ".bias") && mha_io_name_fits(mha_tensors_name(t, i), prefix, names[k]);
    for (int i = 0; i < mha_tensors_count(t); i++)
        for (int k = biased ? 0 : READ; k < N; k++) /* unbiased q/k_layernorm.weight: LFM2's, read */
            if (mha_io_name_fits(mha_tensors_name(t, i), prefix, names[k]))
                return biased ? mha_fail(MHA_E_FORMAT, "tensor %.80s: a q/k LayerNorm %s (Phi's qk_layernorm, "
                                         "Persimmon, MPT's qk_ln); expected none: a norm of q and k with a bias "
                                         "is not implemented, and the layer would run without it",
                                         mha_tensors_name(t, i), strstr(names[k], ".bias") ? "with a bias"
                                                                                           : "of one weight and bias")
                              : mha_fail(MHA_E_FORMAT, "tensor %.80s: a q/k norm weight without a bias under a "
                                         "name whose kind this layout does not know; expected q_norm.weight / "
                                         "k_norm.weight (Qwen 3's RMSNorm), q_layernorm.weight / "
                                         "k_layernorm.weight (LFM2's), query_layernorm.weight / "
                                         "key_layernorm.weight (Ling's) or none: it is not read, and the layer "
                                         "would run without it", mha_tensors_name(t, i));
    return MHA_OK;
}

mha_status mha_io_per_head_norms(float **out, const mha_tensors *t, const char *prefix, const char *which, int heads,
                                 int dk) {
    *out = NULL;
    char name[64];
    int found = 0; /* how many norms.N of this module exist, N counted from 0 */
    for (;; found++) {
        snprintf(name, sizeof name, "%s_layernorm.norms.%d.weight", which, found);
        const mha_array *a = mha_io_find(t, prefix, name);
        if (!a) break;
        mha_status s = mha_io_want_real(a, name);
        if (!s && (a->count != (size_t)dk || a->rank != 1))
            s = mha_fail(MHA_E_SHAPE, "tensor %s has %zu elements of rank %d; expected (d_k) = (%d,)", name,
                         a->count, a->rank, dk);
        if (!s && found < heads && !*out && !(*out = malloc(sizeof(float) * (size_t)heads * dk)))
            s = mha_fail(MHA_E_NOMEM, "no memory for %s_layernorm", which);
        if (s) {
            free(*out), *out = NULL;
            return s;
        }
        if (found < heads) memcpy(*out + (size_t)found * dk, a->f, sizeof(float) * (size_t)dk);
    }
    if (found && found != heads) {
        free(*out), *out = NULL;
        return mha_fail(MHA_E_SHAPE, "%s_layernorm.norms holds %d per-head norms; expected one per %s head (%d)",
                        which, found, *which == 'q' ? "query" : "kv", heads);
    }
    return MHA_OK;
}

mha_status mha_io_variants_read(mha_config *c, float *w[4], const mha_tensors *t, const char *prefix, int hf) {
    mha_rope *r = &c->rope;
    int pairing = 0, scaling = 0, norm = 0, omp = r->original_max_positions, rule = 0;
    double dim = 0, sc = 0, eps = 0, per_head = 0, clip = 0, tfloor = 0, tscale = 0;
    mha_status s;
    if ((s = meta_choice(&pairing, t, "rope", pairing_names, 3, "halves or interleaved")) ||
        (s = meta_choice(&scaling, t, "rope_scaling", scaling_names, 6,
                         "none, linear, llama3, yarn, dynamic or longrope")) ||
        (s = meta_floats(r->short_factor, MHA_ROPE_MAX_PAIRS, t, "rope_short_factor")) ||
        (s = meta_floats(r->long_factor, MHA_ROPE_MAX_PAIRS, t, "rope_long_factor")) ||
        (s = meta_choice(&norm, t, "qk_norm", norm_names, 3, "none, rms or layer")) ||
        (s = meta_choice(&rule, t, "temperature_rule", temperature_rule_names, 2, "llama4 or ministral3")) ||
        (s = meta_double(&dim, t, "rope_dim")) || (s = meta_double(&r->theta, t, "rope_theta")) ||
        (s = meta_double(&r->factor, t, "rope_factor")) ||
        (s = meta_double(&r->low_freq_factor, t, "rope_low_freq_factor")) ||
        (s = meta_double(&r->high_freq_factor, t, "rope_high_freq_factor")) ||
        (s = meta_double(&r->beta_fast, t, "rope_beta_fast")) || (s = meta_double(&r->beta_slow, t, "rope_beta_slow")) ||
        (s = meta_double(&r->attn_factor, t, "rope_attn_factor")) || (s = meta_double(&sc, t, "softcap")) ||
        (s = meta_double(&eps, t, "qk_norm_eps")) || (s = meta_double(&per_head, t, "qk_norm_per_head")) ||
        (s = meta_double(&clip, t, "clip_qkv")) || (s = meta_double(&tfloor, t, "temperature_floor")) ||
        (s = meta_double(&tscale, t, "temperature_scale")) ||
        (s = meta_flag(&c->alibi, t, "alibi")) || (s = meta_flag(&c->sinks, t, "sinks")) ||
        (s = meta_flag(&c->qk_norm_whole, t, "qk_norm_whole")))
        return s;
    double o = omp;
    if ((s = meta_double(&o, t, "rope_original_max_positions"))) return s;
    if (dim < 0 || dim > 1e6 || o < 0 || o > 1e9 || sc < 0 || eps < 0)
        return mha_fail(MHA_E_FORMAT, "metadata rope_dim, rope_original_max_positions, softcap or qk_norm_eps "
                        "is negative or too large; expected the values mha_config takes");
    if (dim != floor(dim) || o != floor(o)) /* an int field: 4096.7 is no context length */
        return mha_fail(MHA_E_FORMAT, "metadata %s = '%.40s' is not a whole number; expected an integer",
                        dim != floor(dim) ? "rope_dim" : "rope_original_max_positions",
                        mha_tensors_meta(t, dim != floor(dim) ? "rope_dim" : "rope_original_max_positions"));
    /* float fields: a value below float's smallest would become 0, read as none or the default */
    if ((sc > 0 && (float)sc == 0.0f) || (eps > 0 && (float)eps == 0.0f))
        return mha_fail(MHA_E_FORMAT, "metadata softcap or qk_norm_eps is > 0 but rounds to 0 in float; expected "
                        "0 (none, the default) or a value >= 1.4e-45");
    if (clip < 0 || clip > 3.40282347e38 || (clip > 0 && (float)clip == 0.0f)) /* float's largest as %.9g prints it */
        return mha_fail(MHA_E_FORMAT, "metadata clip_qkv = '%.40s'; expected 0 (none) or the bound c > 0 "
                        "(at least float's 1.4e-45) Q, K and V are clamped to", mha_tensors_meta(t, "clip_qkv"));
    c->clip_qkv = (float)clip;
    /* Llama 4's query temperature: both or neither, a whole floor, a scale float keeps; the
       config's whole range (floor up to INT_MAX, scale up to float's largest, 3.40282347e38 as
       "%.9g" writes it), so that every layer mha_layer_save writes loads */
    if (tfloor < 0 || tfloor > INT_MAX || tfloor != floor(tfloor) || (tfloor > 0) != (tscale != 0) ||
        !(tscale >= 0 && tscale <= 3.40282347e38) || (tscale > 0 && (float)tscale == 0.0f))
        return mha_fail(MHA_E_FORMAT, "metadata temperature_floor = '%.40s', temperature_scale = '%.40s'; expected "
                        "both absent (none), or a whole floor in 1..2147483647 with a scale > 0 (Llama 4: 8192 and 0.1)",
                        mha_tensors_meta(t, "temperature_floor") ? mha_tensors_meta(t, "temperature_floor") : "",
                        mha_tensors_meta(t, "temperature_scale") ? mha_tensors_meta(t, "temperature_scale") : "");
    c->temperature_floor = (int)tfloor, c->temperature_scale = (float)tscale;
    c->temperature_rule = (mha_temperature_rule)rule; /* without a floor: the library's rule names it */
    r->pairing = (mha_rope_pairing)pairing, r->scaling = (mha_rope_scaling)scaling, r->dim = (int)dim;
    r->original_max_positions = (int)o, c->softcap = (float)sc, c->qk_norm_eps = (float)eps;
    c->qk_norm = (mha_qk_norm)norm, c->qk_norm_per_head = per_head != 0;
    const int h = c->n_heads, hkv = c->n_kv_heads ? c->n_kv_heads : h, dk = c->d_k;
    const char *names[4] = {"alibi_slopes", "sinks", hf ? "q_norm.weight" : "q_norm", hf ? "k_norm.weight" : "k_norm"};
    for (int i = 2; hf && i < 4; i++) { /* StableLM: a LayerNorm (d_k, no bias) per head */
        if ((s = mha_io_per_head_norms(&w[i], t, prefix, i == 2 ? "q" : "k", i == 2 ? h : hkv, dk))) return s;
        if (!w[i]) continue;
        if (!c->qk_norm) c->qk_norm = MHA_QK_NORM_LAYER;
        c->qk_norm_per_head = 1;
        if (!mha_tensors_meta(t, "qk_norm_eps") && c->qk_norm_eps == 0)
            c->qk_norm_eps = 1e-5f; /* StableLmConfig's layer_norm_eps */
        names[i] = i == 2 ? "q_layernorm.norms" : "k_layernorm.norms";
    }
    const mha_array *found[4] = {NULL, NULL, NULL, NULL};
    int family = -1; /* the alias names a norm was found under (LFM2's 0, Ling's 1), for the message below */
    for (int i = 0; i < 4; i++) {
        const mha_array *a = mha_io_find(t, prefix, names[i]);
        /* LFM2: q_layernorm.weight / k_layernorm.weight, and Ling (Bailing): query_layernorm.weight /
         * key_layernorm.weight: an RMSNorm of each head without a bias, before the rotary (a biased
         * one, Phi's LayerNorm, is refused before: mha_io_refuse_unread_norms; Hunyuan's, after the
         * rotary, by `mha run` from its config.json) */
        const char *const alias[2][2] = {{"q_layernorm.weight", "query_layernorm.weight"},
                                         {"k_layernorm.weight", "key_layernorm.weight"}};
        for (int k = 0; hf && i >= 2 && !a && !w[i] && k < 2; k++)
            if ((a = mha_io_find(t, prefix, alias[i - 2][k]))) names[i] = alias[i - 2][k], family = k;
        if (!a || w[i]) continue;
        /* Qwen 3 / Gemma 3: RMSNorm; Cohere's (h, d_k) of rank 2: its LayerNorm of each head */
        const int cohere = i == 2 && a->rank == 2 && h > 1 && a->shape[0] == h && a->shape[1] == dk;
        if (hf && i >= 2 && !c->qk_norm) c->qk_norm = cohere ? MHA_QK_NORM_LAYER : MHA_QK_NORM_RMS;
        if (hf && cohere && c->qk_norm == MHA_QK_NORM_LAYER && !mha_tensors_meta(t, "qk_norm_eps"))
            c->qk_norm_eps = 1e-5f; /* CohereConfig's layer_norm_eps */
        /* OLMo 2: one norm over the whole projection, (h*d_k) weights of rank 1 */
        if (i == 2 && hf && a->count == (size_t)h * dk && dk != 0 && h > 1 && a->rank == 1) c->qk_norm_whole = 1;
        if (i >= 2 && a->count == (size_t)(i == 2 ? h : hkv) * dk && (i == 2 ? h : hkv) > 1) c->qk_norm_per_head = 1;
        found[i] = a;
    }
    /* taken once both norms had their say on qk_norm_per_head: k's (h_kv*d_k) makes q's (h, d_k) too (before,
     * a (d_k) q norm taken first was then read as h*d_k floats) */
    for (int i = 0; i < 4; i++) {
        const mha_array *a = found[i];
        if (!a || (i == 0 && !c->alibi) || (i == 1 && !c->sinks) || (i >= 2 && !c->qk_norm)) continue;
        size_t per = (size_t)(i == 2 ? h : hkv) * dk;
        s = i < 2 ? take(&w[i], a, names[i], (size_t)h, 0, "(h) per head")
                  : take(&w[i], a, names[i], c->qk_norm_per_head ? per : (size_t)dk, 0,
                         c->qk_norm_per_head ? "(heads, d_k)" : "(d_k)");
        if (s) return s;
    }
    if (c->sinks && !w[1])
        return mha_fail(MHA_E_FORMAT, "metadata sinks = 1 but the checkpoint has no sinks tensor; expected (h) "
                        "sink logits");
    if (c->qk_norm && (!w[2] || !w[3])) {
        /* named as the norm that was found is: k_layernorm.weight beside LFM2's q_layernorm.weight */
        static const char *const missing[2][2] = {{"q_layernorm.weight", "k_layernorm.weight"},
                                                  {"query_layernorm.weight", "key_layernorm.weight"}};
        return mha_fail(MHA_E_FORMAT, "qk_norm is set but the checkpoint lacks %s; expected both norm weights",
                        family >= 0 ? missing[family][!w[2] ? 0 : 1] : !w[2] ? names[2] : names[3]);
    }
    return MHA_OK;
}

mha_status mha_io_gate_read(mha_config *c, float *g[2], const mha_tensors *t, const char *prefix, int i8_codes) {
    mha_status s = meta_flag(&c->output_gate, t, "output_gate");
    if (s) return s;
    const size_t zw = (size_t)c->n_heads * c->d_v;
    static const char *const names[2] = {"w_g", "b_g"};
    for (int i = 0; i < 2; i++) {
        const mha_array *a = mha_io_find(t, prefix, names[i]);
        const int wanted = c->output_gate && (i == 0 || c->bias);
        if (!a && wanted)
            return mha_fail(MHA_E_FORMAT, "metadata output_gate = 1 but the checkpoint has no %s; expected %s",
                            names[i], i ? "b_g (h*d_v): the layer has biases" : "w_g (d_model, h*d_v)");
        if (a && !wanted)
            return mha_fail(MHA_E_FORMAT, "tensor %s %s; expected it absent (or metadata output_gate = 1%s)", names[i],
                            c->output_gate ? "beside a layer without biases" : "without metadata output_gate = 1",
                            i ? " with biases" : "");
        const mha_array codes = a && i == 0 && i8_codes && a->dtype == MHA_DTYPE_I8 ? (mha_array){.dtype = MHA_DTYPE_F32,
                                .rank = a->rank, .shape = {a->shape[0], a->shape[1], 1, 1}, .count = a->count, .f = a->f}
                                                                                  : (mha_array){0};
        if (a && (s = take(&g[i], codes.f ? &codes : a, names[i], i ? zw : (size_t)c->d_model * zw, 0,
                           i ? "(h*d_v)" : "(d_model, h*d_v)")))
            return s;
        if (a && i == 0 && (a->rank != 2 || a->shape[0] != c->d_model))
            return mha_fail(MHA_E_SHAPE, "tensor w_g is (%d, %d) of rank %d; expected (d_model=%d, h*d_v=%zu)",
                            a->shape[0], a->shape[1], a->rank, c->d_model, zw);
    }
    return MHA_OK;
}

static mha_status put(mha_tensors *t, const char *key, const char *fmt, double v) {
    char buf[40];
    mha_c_snprintf(buf, sizeof buf, fmt, v);
    return mha_tensors_set_meta(t, key, buf);
}

/* n floats as "%.9g" items separated by commas (each reads back exactly) */
static mha_status put_floats(mha_tensors *t, const char *key, const float *v, int n) {
    char *buf = malloc(24 * (size_t)n + 1);
    if (!buf) return mha_fail(MHA_E_NOMEM, "no memory for metadata %s", key);
    size_t len = 0;
    for (int i = 0; i < n; i++) len += (size_t)mha_c_snprintf(buf + len, 24, "%s%.9g", i ? "," : "", (double)v[i]);
    buf[len] = '\0';
    mha_status s = mha_tensors_set_meta(t, key, buf);
    free(buf);
    return s;
}

mha_status mha_io_variants_write(mha_tensors *t, const mha_layer *L) {
    const mha_config *c = mha_layer_config(L);
    const mha_rope *r = &c->rope;
    mha_weights w;
    mha_layer_get_weights(L, &w);
    mha_status s = MHA_OK;
    if (r->pairing) {
        s = mha_tensors_set_meta(t, "rope", pairing_names[r->pairing]);
        if (!s) s = put(t, "rope_dim", "%.0f", r->dim);
        if (!s) s = put(t, "rope_theta", "%.17g", r->theta);
        if (!s) s = mha_tensors_set_meta(t, "rope_scaling", scaling_names[r->scaling]);
        const char *keys[7] = {"rope_factor", "rope_low_freq_factor", "rope_high_freq_factor",
                               "rope_original_max_positions", "rope_beta_fast", "rope_beta_slow", "rope_attn_factor"};
        const double vals[7] = {r->factor, r->low_freq_factor, r->high_freq_factor, r->original_max_positions,
                                r->beta_fast, r->beta_slow, r->attn_factor};
        for (int i = 0; i < 7 && !s && r->scaling; i++) s = put(t, keys[i], "%.17g", vals[i]);
        if (!s && r->scaling == MHA_ROPE_SCALE_LONGROPE) s = put_floats(t, "rope_short_factor", r->short_factor, r->dim / 2);
        if (!s && r->scaling == MHA_ROPE_SCALE_LONGROPE) s = put_floats(t, "rope_long_factor", r->long_factor, r->dim / 2);
    }
    const int h = c->n_heads, hkv = c->n_kv_heads, dk = c->d_k;
    if (!s && c->alibi) s = put(t, "alibi", "%.0f", 1);
    if (!s && c->alibi) s = mha_tensors_add_f32(t, "alibi_slopes", w.alibi_slopes, 1, &h);
    if (!s && c->sinks) s = put(t, "sinks", "%.0f", 1);
    if (!s && c->sinks) s = mha_tensors_add_f32(t, "sinks", w.sinks, 1, &h);
    if (!s && c->softcap != 0.0f) s = put(t, "softcap", "%.9g", c->softcap);
    if (!s && c->clip_qkv != 0.0f) s = put(t, "clip_qkv", "%.9g", c->clip_qkv);
    if (!s && c->temperature_floor) s = put(t, "temperature_floor", "%.0f", c->temperature_floor);
    if (!s && c->temperature_floor) s = put(t, "temperature_scale", "%.9g", c->temperature_scale);
    if (!s && c->temperature_rule) s = mha_tensors_set_meta(t, "temperature_rule", temperature_rule_names[c->temperature_rule]);
    if (!s && c->output_gate) { /* gated attention: W_G (d_model, h*d_v) and, with biases, b_G */
        const int sg[2] = {c->d_model, c->n_heads * c->d_v};
        s = put(t, "output_gate", "%.0f", 1);
        if (!s && c->bias) s = mha_tensors_add_f32(t, "b_g", w.b_g, 1, sg + 1); /* w_g: weights_meta.c, in its dtype */
    }
    if (!s && c->qk_norm) {
        s = mha_tensors_set_meta(t, "qk_norm", norm_names[c->qk_norm]);
        if (!s) s = put(t, "qk_norm_per_head", "%.0f", c->qk_norm_per_head);
        if (!s) s = put(t, "qk_norm_eps", "%.9g", c->qk_norm_eps);
        if (!s && c->qk_norm_whole) s = put(t, "qk_norm_whole", "%.0f", 1);
        const int sq[2] = {h, dk}, sk[2] = {hkv, dk};
        if (!s) s = mha_tensors_add_f32(t, "q_norm", w.q_norm, c->qk_norm_per_head ? 2 : 1, c->qk_norm_per_head ? sq : sq + 1);
        if (!s) s = mha_tensors_add_f32(t, "k_norm", w.k_norm, c->qk_norm_per_head ? 2 : 1, c->qk_norm_per_head ? sk : sk + 1);
    }
    return s;
}
