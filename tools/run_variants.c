/* run_variants.c — `mha run` flags for today's attention variants (also
 * taken by `mha audit` and `mha permute`, whose errors name them): the
 * loaded layer is rebuilt with its config changed and the per-head tensors
 * the flags name read from the checkpoint; --positions becomes
 * options.positions. */
#include "run_variants.h"

#include "hf_config.h"
#include "stdin_npy.h"

#include <stdio.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* The tensor `name` of the checkpoint t: prefix+name, else the first one
 * ending in "."name inside the module prefix names (NULL: anywhere; "a.b"
 * and "a.b." both mean module a.b), as the loader finds the layer; NULL
 * when absent. */
static const mha_array *tensor(const mha_tensors *t, const char *prefix, const char *name) {
    char full[512];
    snprintf(full, sizeof full, "%s%s", prefix ? prefix : "", name);
    const mha_array *a = mha_tensors_get(t, full);
    size_t lp = prefix ? strlen(prefix) : 0;
    const size_t ls = strlen(name);
    if (lp && prefix[lp - 1] == '.') lp--;
    for (int i = 0; !a && i < mha_tensors_count(t); i++) {
        const char *n = mha_tensors_name(t, i);
        const size_t ln = strlen(n);
        if (ln > ls && n[ln - ls - 1] == '.' && strcmp(n + ln - ls, name) == 0 &&
            (!lp || (ln > lp && memcmp(n, prefix, lp) == 0 && n[lp] == '.')))
            a = mha_tensors_get(t, n);
    }
    return a;
}

/* A float tensor of exactly n elements, or an error naming it. */
static int want(const char *cmd, const char *what, const mha_array *a, const char *name, size_t n) {
    if (!a) return mha_cmd_error(cmd, MHA_EXIT_RUNTIME, "%s: the checkpoint has no tensor %s", what, name);
    if (!a->f || a->dtype == MHA_DTYPE_I8) /* int8: quantized values, meaningless without scales */
        return mha_cmd_error(cmd, MHA_EXIT_RUNTIME, "%s: tensor %s is %s; expected %zu floats (F32, F16 or BF16)",
                             what, name, a->dtype == MHA_DTYPE_I8 ? "int8" : "not floating point", n);
    if (a->count != n)
        return mha_cmd_error(cmd, MHA_EXIT_RUNTIME, "%s: tensor %s has %zu elements; expected %zu floats", what,
                             name, a->count, n);
    return MHA_EXIT_OK;
}

/* The largest position --positions takes: the library's MHA_MAX_POSITION. */
#define CLI_MAX_POSITION (1 << 30)

/* --positions P.npy: (T,) or (1, T) — the same positions for every
 * sequence, as a position_ids row broadcasts — or (B, T), integers
 * (int32/int64) or whole numbers stored as float (float32/float16: exact
 * to 2^24), each in 0..2^30; anything else is refused naming the file,
 * index and value. */
static int read_positions(const char *cmd, cli_fwd *f, cli_variant_flags *vf) {
    mha_array a = {0};
    int rc = cli_npy_read(cmd, &a, vf->positions, MHA_IO_INTEGERS);
    if (rc) return rc;
    const char *name = cli_input_name(vf->positions); /* "-": standard input */
    const int shared = (a.rank == 1 && a.shape[0] == f->T) || (a.rank == 2 && a.shape[0] == 1 && a.shape[1] == f->T);
    const int ok = shared || (a.rank == 2 && a.shape[0] == f->B && a.shape[1] == f->T);
    if ((!a.f && !a.i64) || !ok) {
        char shape[64];
        rc = mha_cmd_error(cmd, MHA_EXIT_RUNTIME, "%s: positions are %s of shape %s; expected integers (int32, "
                           "int64) or whole numbers (float32) of shape (T,) = (%d,), (1, T) or (B, T) = (%d, %d)",
                           name, mha_dtype_name(a.dtype), cli_shape_str(&a, shape, sizeof shape), f->T, f->B,
                           f->T);
    }
    const size_t n = (size_t)f->B * f->T; /* a shared row is repeated for every sequence */
    if (!rc && !(vf->pos = malloc(sizeof(int) * n))) rc = mha_cmd_error(cmd, MHA_EXIT_RUNTIME, "out of memory");
    for (size_t i = 0; !rc && i < a.count; i++) {
        const double v = a.i64 ? (double)a.i64[i] : (double)a.f[i];
        const int whole = a.i64 || (v == (double)(long long)v && v <= (double)(1 << 24));
        if (!(v >= 0 && v <= CLI_MAX_POSITION) || !whole) {
            rc = a.i64 ? mha_cmd_error(cmd, MHA_EXIT_RUNTIME, "%s: position %lld at index %zu; expected an "
                                       "integer in 0..2^30", name, (long long)a.i64[i], i)
                       : mha_cmd_error(cmd, MHA_EXIT_RUNTIME, "%s: position %g at index %zu; expected a whole "
                                       "number in 0..2^24 (or save integers)", name, v, i);
            break;
        }
        for (size_t b = 0; b < (shared ? (size_t)f->B : 1); b++) vf->pos[b * (size_t)f->T + i] = (int)v;
    }
    mha_array_free(&a);
    if (!rc) f->opt.positions = vf->pos;
    return rc;
}

/* LongRoPE's short_factor=A:B:... or long_factor=... (one factor per
 * rotated pair, ':' between them) into r; -1 when kv is neither key,
 * else 0 or an exit code. */
static int scale_factors(const char *cmd, mha_rope *r, const char *kv, size_t len) {
    static const char *const keys[] = {"short_factor", "long_factor"};
    for (int k = 0; k < 2; k++) {
        const size_t kl = strlen(keys[k]);
        if (len <= kl || strncmp(kv, keys[k], kl) || kv[kl] != '=') continue;
        float *dst = k ? r->long_factor : r->short_factor;
        memset(dst, 0, sizeof(float) * MHA_ROPE_MAX_PAIRS);
        const char *p = kv + kl + 1, *stop = kv + len;
        for (int i = 0;; i++) {
            char num[64], *end;
            const char *sep = memchr(p, ':', (size_t)(stop - p));
            const size_t n = (size_t)((sep ? sep : stop) - p);
            if (i == MHA_ROPE_MAX_PAIRS || n == 0 || n >= sizeof num)
                return mha_cmd_error(cmd, MHA_EXIT_USAGE, "--rope-scale: %s item %d %s; expected 1..%d numbers "
                                     "> 0 separated by ':'", keys[k], i, i == MHA_ROPE_MAX_PAIRS ? "is one too many"
                                     : n ? "is too long" : "is empty", MHA_ROPE_MAX_PAIRS);
            memcpy(num, p, n), num[n] = '\0';
            const double v = strtod(num, &end);
            if (*end || !(v > 0 && v <= 1e9))
                return mha_cmd_error(cmd, MHA_EXIT_USAGE, "--rope-scale: %s item %d is %s; expected a number > 0",
                                     keys[k], i, num);
            dst[i] = (float)v;
            if (!sep) return 0;
            p = sep + 1;
        }
    }
    return -1;
}

/* One key=value of --rope-scale into r; 0 or an exit code. */
static int scale_param(const char *cmd, mha_rope *r, const char *kv, size_t len) {
    const int list = scale_factors(cmd, r, kv, len);
    if (list >= 0) return list;
    static const char *const keys[] = {"factor", "low_freq_factor", "high_freq_factor",
                                       "original_max_position_embeddings", "beta_fast", "beta_slow",
                                       "attention_factor"};
    double *dst[] = {&r->factor, &r->low_freq_factor, &r->high_freq_factor, NULL, &r->beta_fast, &r->beta_slow,
                     &r->attn_factor};
    const char *eq = memchr(kv, '=', len);
    for (int i = 0; eq && i < 7; i++) {
        if (strlen(keys[i]) != (size_t)(eq - kv) || strncmp(kv, keys[i], (size_t)(eq - kv)) != 0) continue;
        char num[64], *end;
        size_t n = len - (size_t)(eq + 1 - kv);
        if (n == 0 || n >= sizeof num) break;
        memcpy(num, eq + 1, n), num[n] = '\0';
        double v = strtod(num, &end);
        if (*end || !(v > 0 && v <= 1e9))
            return mha_cmd_error(cmd, MHA_EXIT_USAGE, "--rope-scale: %s=%s; expected a number > 0", keys[i], num);
        if (i == 3 && v != (double)(int)v)
            return mha_cmd_error(cmd, MHA_EXIT_USAGE, "--rope-scale: %s=%s; expected a whole number", keys[i], num);
        if (i == 3) r->original_max_positions = (int)v;
        else *dst[i] = v;
        return 0;
    }
    return mha_cmd_error(cmd, MHA_EXIT_USAGE, "--rope-scale: '%.*s'; expected KEY=NUMBER with KEY among factor, "
                         "low_freq_factor, high_freq_factor, original_max_position_embeddings, beta_fast, beta_slow, "
                         "attention_factor, or short_factor=A:B:..., long_factor=A:B:...", (int)len, kv);
}

/* --rope-scale: "F" (linear), or KIND:key=value,... with KIND linear,
 * llama3, yarn, dynamic or longrope and the keys of Hugging Face's
 * rope_scaling. */
static int parse_rope_scale(const char *cmd, mha_rope *r, const char *spec) {
    static const char *const kinds[] = {"linear", "llama3", "yarn", "dynamic", "longrope"};
    static const mha_rope_scaling kind_scaling[] = {MHA_ROPE_SCALE_LINEAR, MHA_ROPE_SCALE_LLAMA3, MHA_ROPE_SCALE_YARN,
                                                    MHA_ROPE_SCALE_DYNAMIC, MHA_ROPE_SCALE_LONGROPE};
    char *end;
    double f = strtod(spec, &end);
    if (end != spec && !*end) {
        if (!(f >= 1 && f <= 1e6))
            return mha_cmd_error(cmd, MHA_EXIT_USAGE, "--rope-scale %s; expected a factor in 1..1e6", spec);
        r->scaling = MHA_ROPE_SCALE_LINEAR, r->factor = f;
        return 0;
    }
    const char *colon = strchr(spec, ':');
    int kind = -1;
    for (int i = 0; i < 5 && colon; i++)
        if (strlen(kinds[i]) == (size_t)(colon - spec) && strncmp(spec, kinds[i], (size_t)(colon - spec)) == 0) kind = i;
    if (kind < 0)
        return mha_cmd_error(cmd, MHA_EXIT_USAGE, "--rope-scale '%.200s'; expected F, linear:factor=F, "
                             "llama3:factor=F,..., yarn:factor=F,..., dynamic:factor=F,... or "
                             "longrope:short_factor=...,long_factor=...,... (see --help)", spec);
    mha_rope z = {0};
    z.pairing = r->pairing, z.dim = r->dim, z.theta = r->theta;
    *r = z; /* the kind's defaults: 0 = the mha_rope documented default */
    r->scaling = kind_scaling[kind];
    char seen[16][40]; /* the keys given so far: a second one would silently win */
    int n_seen = 0;
    for (const char *p = colon + 1;;) { /* an empty item (",,", a trailing ",") is scale_param's error */
        const char *comma = strchr(p, ',');
        const size_t len = comma ? (size_t)(comma - p) : strlen(p);
        const char *eq = memchr(p, '=', len);
        const size_t kl = eq ? (size_t)(eq - p) : len;
        for (int i = 0; i < n_seen; i++)
            if (strlen(seen[i]) == kl && strncmp(seen[i], p, kl) == 0)
                return mha_cmd_error(cmd, MHA_EXIT_USAGE, "--rope-scale: %.*s is given twice; expected each key "
                                     "once", (int)kl, p);
        if (n_seen < 16 && kl < sizeof seen[0]) memcpy(seen[n_seen], p, kl), seen[n_seen++][kl] = '\0';
        int rc = scale_param(cmd, r, p, len);
        if (rc) return rc;
        if (!comma) break;
        p = comma + 1;
    }
    const int longrope = r->scaling == MHA_ROPE_SCALE_LONGROPE;
    if (r->factor == 0 && !longrope)
        return mha_cmd_error(cmd, MHA_EXIT_USAGE, "--rope-scale %.200s: factor missing; expected factor=F", spec);
    if (kind > 0 && r->original_max_positions == 0)
        return mha_cmd_error(cmd, MHA_EXIT_USAGE, "--rope-scale %.200s: original_max_position_embeddings missing; "
                             "expected the %s", spec, r->scaling == MHA_ROPE_SCALE_DYNAMIC ? "context beyond which it "
                             "scales (max_position_embeddings)" : "pre-training context length");
    if (longrope && (!r->short_factor[0] || !r->long_factor[0]))
        return mha_cmd_error(cmd, MHA_EXIT_USAGE, "--rope-scale %.200s: %s missing; expected one factor per rotated "
                             "pair, A:B:...", spec, r->short_factor[0] ? "long_factor" : "short_factor");
    return 0;
}

/* Gemma 3's q/k RMSNorm multiplies by (1 + weight): its stored weights
 * are centred on 0, so read as the layer's plain scales they would
 * shrink q and k towards 0. w's norm weights become copies plus one in
 * *buf (freed by the caller, after the layer is built); 0 or an exit code. */
static int offset_norms(const char *cmd, float **buf, const mha_config *c, mha_weights *w) {
    const size_t nq = (size_t)c->d_k * (c->qk_norm_per_head ? (size_t)c->n_heads : 1);
    const size_t hkv = (size_t)(c->n_kv_heads ? c->n_kv_heads : c->n_heads); /* 0 means h */
    const size_t nk = (size_t)c->d_k * (c->qk_norm_per_head ? hkv : 1);
    float *b = malloc(sizeof(float) * (nq + nk));
    if (!b) return mha_cmd_error(cmd, MHA_EXIT_RUNTIME, "out of memory");
    for (size_t i = 0; i < nq; i++) b[i] = 1.0f + w->q_norm[i];
    for (size_t i = 0; i < nk; i++) b[nq + i] = 1.0f + w->k_norm[i];
    w->q_norm = b, w->k_norm = b + nq, *buf = b;
    return 0;
}

/* --window, --chunk, --sink-tokens and --positions into f->opt */
static int apply_options(const char *cmd, cli_fwd *f, cli_variant_flags *vf) {
    if (vf->sink_tokens && !vf->window)
        return mha_cmd_error(cmd, MHA_EXIT_USAGE, "--sink-tokens needs --window W (the sinks are kept "
                             "besides a window)");
    if (vf->sink_tokens && vf->chunk)
        return mha_cmd_error(cmd, MHA_EXIT_USAGE, "--sink-tokens with --chunk; expected one of them (sink "
                             "tokens are kept besides a window, not a chunk)");
    if (vf->window) f->opt.window_left = (int)(vf->window - 1);
    if (vf->chunk) f->opt.chunk_size = (int)vf->chunk;
    f->opt.sink_tokens = (int)vf->sink_tokens;
    return vf->positions ? read_positions(cmd, f, vf) : MHA_EXIT_OK;
}

/* Llama 4's L2 norm of q and k on its rotary layers (Llama4TextL2Norm:
 * x / sqrt(mean x^2 + eps), no weight): RMS QK-norm with shared weights of
 * ones in *buf (freed by the caller, after the layer is built). */
static int unit_norms(const char *cmd, float **buf, mha_config *c, mha_weights *w) {
    if (!(*buf = malloc(sizeof(float) * (size_t)c->d_k))) return mha_cmd_error(cmd, MHA_EXIT_RUNTIME, "out of memory");
    for (int i = 0; i < c->d_k; i++) (*buf)[i] = 1.0f;
    c->qk_norm = MHA_QK_NORM_RMS, c->qk_norm_per_head = 0, c->qk_norm_whole = 0;
    w->q_norm = w->k_norm = *buf;
    return 0;
}

/* --attn-temperature FLOOR,SCALE[,RULE]: a whole floor in 1..2^30, a
 * scale > 0 that float keeps, the rule llama4 (the default) or ministral3
 * (Llama 4: 8192,0.1) into *floor_out, *scale_out, *rule_out. */
static int parse_temperature(const char *cmd, const char *spec, double *floor_out, double *scale_out,
                             int *rule_out) {
    char *end = NULL;
    const double fl = strtod(spec, &end);
    const char *comma = end;
    const double sc = *comma == ',' ? strtod(comma + 1, &end) : NAN;
    int rule = 0, ok = end != comma + 1;
    if (ok && *end == ',') { /* the rule's name, the last item */
        rule = strcmp(end + 1, "llama4") == 0 ? 0 : strcmp(end + 1, "ministral3") == 0 ? 1 : -1;
        end += strlen(end);
    }
    if (!ok || *end || rule < 0 || !(fl >= 1 && fl <= (1 << 30)) || fl != floor(fl) || !(sc > 0 && sc <= 1e30) ||
        (float)sc == 0.0f)
        return mha_cmd_error(cmd, MHA_EXIT_USAGE, "--attn-temperature '%.200s'; expected FLOOR,SCALE[,llama4|"
                             "ministral3] with a whole FLOOR in 1..2^30 and a SCALE > 0 (Llama 4: 8192,0.1)", spec);
    *floor_out = fl, *scale_out = sc, *rule_out = rule;
    return 0;
}

int cli_apply_variants(const char *cmd, mha_layer **L, cli_fwd *f, cli_variant_flags *vf, const cli_ckpt *ck) {
    const char *weights = ck->weights, *prefix = ck->prefix;
    cli_hf_config hc; /* the rotary settings of config.json, overridden by the flags */
    int rc = cli_hf_config_read(&hc, cmd, ck, NULL);
    if (rc) return rc;
    if (hc.long_context && f->S > hc.long_context) /* Qwen 1: nothing of it acts up to seq_length keys */
        return mha_cmd_error(cmd, MHA_EXIT_RUNTIME, "config.json: model_type qwen: %d keys exceed seq_length %lld, "
                             "past which Qwen 1 raises its rotary base (use_dynamic_ntk) and scales the queries by "
                             "log(position) (use_logn_attn); expected at most %lld keys, or both false: neither is "
                             "implemented", f->S, hc.long_context, hc.long_context);
    if (hc.window < 0 && !vf->window)
        return mha_cmd_error(cmd, MHA_EXIT_USAGE, "config.json: some layers attend through a sliding window of "
                             "sliding_window keys and others globally, and --prefix names no layer; expected --prefix "
                             "with the layer's number (model.layers.N), or --window W");
    if (!vf->window && hc.window > 0) vf->window = hc.window; /* the layer's sliding_window; a flag wins */
    if (hc.chunk < 0 && !vf->chunk)
        return mha_cmd_error(cmd, MHA_EXIT_USAGE, "config.json: some layers attend inside chunks of "
                             "attention_chunk_size keys and others globally (Llama 4), and --prefix names no layer; "
                             "expected --prefix with the layer's number (model.layers.N), or --chunk C");
    if (!vf->chunk && hc.chunk > 0) vf->chunk = hc.chunk; /* Llama 4's chunked layers; a flag wins */
    if (hc.no_rope < 0 && !vf->rope)
        return mha_cmd_error(cmd, MHA_EXIT_USAGE, "config.json: no_rope_layers gives some layers no rotary "
                             "embedding, and --prefix names no layer; expected --prefix with the layer's number "
                             "(model.layers.N)");
    if (hc.no_rope > 0) /* a NoPE layer: the file's rotary settings are not its own */
        hc.rope = NULL, hc.rope_theta = 0, hc.rope_dim = 0, hc.rope_scale[0] = '\0';
    const char *rope = vf->rope ? vf->rope : hc.rope ? hc.rope : hc.rope_theta ? "halves" : NULL; /* rotate_half */
    const double theta = vf->rope_theta ? vf->rope_theta : hc.rope_theta;
    const long long rope_dim = vf->rope_dim ? vf->rope_dim : hc.rope_dim;
    const char *rope_scale = vf->rope_scale ? vf->rope_scale : hc.rope_scale[0] ? hc.rope_scale : NULL;
    const double softcap = vf->softcap ? vf->softcap : hc.softcap;
    const double clip_qkv = vf->clip_qkv ? vf->clip_qkv : hc.clip_qkv; /* OLMo 1, DBRX, MPT */
    /* Llama 4's NoPE layers, Ministral 3's; a flag wins */
    double t_floor = hc.temperature_floor, t_scale = hc.temperature_scale;
    int t_rule = hc.temperature_rule;
    if (vf->temperature && (rc = parse_temperature(cmd, vf->temperature, &t_floor, &t_scale, &t_rule))) return rc;
    f->opt.scale = (float)(vf->scale ? vf->scale : hc.scale); /* 0: 1/sqrt(d_k) */
    if (hc.position_unknown && !vf->rope && !vf->alibi)
        return mha_cmd_error(cmd, MHA_EXIT_USAGE, "config.json: model_type baichuan does not say how the layer "
                             "encodes positions (Baichuan 7B rotates, 13B uses ALiBi); expected --rope halves or "
                             "--alibi");
    if (hc.qk_norm_layer && mha_layer_config(*L)->qk_norm != MHA_QK_NORM_LAYER) /* the loader reads Cohere's (h, d_k) */
        return mha_cmd_error(cmd, MHA_EXIT_RUNTIME, "config.json: use_qk_norm is true; expected the checkpoint's "
                             "q_norm.weight (h, d_k) and k_norm.weight (h_kv, d_k), Cohere's LayerNorm of each "
                             "head: not found");
    if (hc.qk_norm_rms && mha_layer_config(*L)->qk_norm != MHA_QK_NORM_RMS) /* the loader reads Ling's names */
        return mha_cmd_error(cmd, MHA_EXIT_RUNTIME, "config.json: use_qk_norm is true; expected the checkpoint's "
                             "query_layernorm.weight and key_layernorm.weight (d_k), Ling's RMSNorm of each head: "
                             "not found");
    if (hc.qk_norm_after_rope && mha_layer_config(*L)->qk_norm) /* Hunyuan: after the rotary, per-dim weights */
        return mha_cmd_error(cmd, MHA_EXIT_RUNTIME, "config.json: Hunyuan (hunyuan_v1_dense / _moe): the checkpoint holds "
                             "query_layernorm / key_layernorm, which Hunyuan applies after the rotary (whatever "
                             "use_qk_norm says); expected no q/k norm: a q/k norm after RoPE is not implemented");
    const int file_norm = mha_layer_config(*L)->qk_norm && (hc.qk_norm_eps || hc.qk_norm_offset);
    const int l2_norm = hc.qk_l2_norm && !vf->qk_norm && !mha_layer_config(*L)->qk_norm; /* Llama 4 */
    const int file_sinks = hc.sinks && !vf->sinks && !mha_layer_config(*L)->sinks; /* gpt-oss's, unless --sinks */
    if (!rope && !theta && !rope_dim && !rope_scale && !vf->alibi && !hc.alibi && !softcap && !vf->sinks &&
        !vf->qk_norm && !file_norm && !file_sinks && !clip_qkv && !l2_norm && !t_floor)
        return apply_options(cmd, f, vf);
    mha_config c = *mha_layer_config(*L);
    mha_weights w;
    mha_layer_get_weights(*L, &w);
    if (rope) c.rope.pairing = strcmp(rope, "halves") == 0 ? MHA_ROPE_HALVES : MHA_ROPE_INTERLEAVED;
    if ((theta || rope_dim || rope_scale) && !c.rope.pairing)
        return mha_cmd_error(cmd, MHA_EXIT_USAGE, "--rope-theta/--rope-dim/--rope-scale need --rope (or rotary "
                             "settings in the checkpoint)");
    if (vf->rope_dim && (vf->rope_dim % 2 || vf->rope_dim > c.d_k)) /* named as the flag, before any work */
        return mha_cmd_error(cmd, MHA_EXIT_USAGE, "--rope-dim is %lld; expected an even number in 2..%d (the "
                             "layer's d_k)", vf->rope_dim, c.d_k);
    if (theta) c.rope.theta = theta;
    if (rope_dim) c.rope.dim = (int)rope_dim;
    if (rope_scale && (rc = parse_rope_scale(cmd, &c.rope, rope_scale))) return rc;
    if (vf->alibi || hc.alibi) c.alibi = 1;
    if (softcap) c.softcap = (float)softcap;
    if (clip_qkv) c.clip_qkv = (float)clip_qkv;
    if (t_floor)
        c.temperature_floor = (int)t_floor, c.temperature_scale = (float)t_scale,
        c.temperature_rule = (mha_temperature_rule)t_rule;
    float *slopes = NULL; /* (shard_of_heads): a shard's heads take the whole layer's default slopes */
    if (c.alibi && !w.alibi_slopes && vf->shard_of_heads > c.n_heads) {
        if (!(slopes = malloc(sizeof(float) * (size_t)vf->shard_of_heads)))
            return mha_cmd_error(cmd, MHA_EXIT_RUNTIME, "out of memory");
        mha_alibi_slopes(slopes, vf->shard_of_heads);
        w.alibi_slopes = slopes + vf->shard_first;
    }
    mha_tensors *t = NULL;
    if (vf->sinks || file_sinks || (vf->qk_norm && !c.qk_norm)) {
        mha_status s = mha_checkpoint_read(&t, weights, prefix, 0);
        if (s) {
            free(slopes);
            return cli_fail(cmd, s);
        }
    }
    const char *sinks = vf->sinks ? vf->sinks : file_sinks && tensor(t, prefix, "sinks") ? "sinks" : NULL;
    if (sinks) { /* (shard_of_heads): a shard's heads take their entries of the whole layer's (h) */
        const mha_array *a = tensor(t, prefix, sinks);
        const int shard = vf->shard_of_heads > c.n_heads;
        const size_t n = (size_t)(shard ? vf->shard_of_heads : c.n_heads);
        if (!(rc = want(cmd, vf->sinks ? "--sinks" : "config.json (model_type gpt_oss)", a, sinks, n)))
            c.sinks = 1, w.sinks = a->f + (shard ? vf->shard_first : 0);
    }
    if (!rc && vf->qk_norm) {
        if (!c.qk_norm) { /* Qwen 3 names, then native ones; shared (d_k) weights */
            const mha_array *q = tensor(t, prefix, "q_norm.weight"), *k = tensor(t, prefix, "k_norm.weight");
            const char *qn = "q_norm.weight", *kn = "k_norm.weight";
            if (!q) q = tensor(t, prefix, "q_norm"), k = tensor(t, prefix, "k_norm"), qn = "q_norm", kn = "k_norm";
            if (!(rc = want(cmd, "--qk-norm", q, qn, (size_t)c.d_k)) && !(rc = want(cmd, "--qk-norm", k, kn, (size_t)c.d_k)))
                w.q_norm = q->f, w.k_norm = k->f, c.qk_norm_per_head = 0;
        }
        c.qk_norm = strcmp(vf->qk_norm, "rms") == 0 ? MHA_QK_NORM_RMS : MHA_QK_NORM_LAYER;
    }
    float *norms = NULL;
    if (!rc && l2_norm) rc = unit_norms(cmd, &norms, &c, &w);
    if (!rc && c.qk_norm && hc.qk_norm_eps) c.qk_norm_eps = (float)hc.qk_norm_eps; /* config.json's rms_norm_eps */
    if (!rc && c.qk_norm && hc.qk_norm_offset) rc = offset_norms(cmd, &norms, &c, &w);
    mha_layer *n = NULL;
    if (!rc) {
        mha_status s = mha_layer_create(&n, &c, &w);
        const mha_config *o = mha_layer_config(*L);
        const int last = (o->alibi || o->sinks) && (c.alibi || c.sinks) ? MHA_BLOCK_S : MHA_BLOCK_O;
        for (int b = 0; !s && b <= last; b++) { /* keep the file's head labels */
            int lab[4096];
            s = mha_layer_labels(*L, (mha_block)b, lab);
            if (!s) s = mha_layer_set_labels(n, (mha_block)b, lab);
        }
        if (s) rc = cli_fail(cmd, s), mha_layer_free(n);
    }
    mha_tensors_free(t);
    free(norms), free(slopes);
    if (rc) return rc;
    mha_layer_free(*L);
    *L = n;
    return apply_options(cmd, f, vf);
}

void cli_variants_free(cli_variant_flags *vf) {
    free(vf->pos);
    vf->pos = NULL;
}
