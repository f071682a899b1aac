/* hf_config.c — reads the keys of Hugging Face's config.json that shape
 * one attention layer; everything else in the file is ignored. */
#include "hf_config.h"

#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The JSON object of a sharded checkpoint's index whose keys name its
 * tensors (weight_map), or NULL. */
static json_t *index_names(const char *path) {
    const size_t n = strlen(path), s = strlen(".index.json");
    json_t *root = n > s && strcmp(path + n - s, ".index.json") == 0 ? json_load_file(path, 0, NULL) : NULL;
    json_t *map = json_incref(json_object_get(root, "weight_map"));
    json_decref(root);
    return map;
}

/* The tensor names of the safetensors header of path (8-byte little-endian
 * length, then JSON), or of a sharded checkpoint's index, each with a
 * 1-float placeholder: all that layout detection reads, without reading
 * the weights. NULL when the header does not parse; the load then
 * reports why. */
static mha_tensors *header_names(const char *path) {
    json_t *root = index_names(path);
    FILE *f = root ? NULL : fopen(path, "rb");
    unsigned char len8[8];
    uint64_t n = 0;
    if (!f && !root) return NULL;
    if (f && fread(len8, 1, 8, f) == 8)
        for (int i = 7; i >= 0; i--) n = n << 8 | len8[i];
    char *buf = n && n <= ((uint64_t)100 << 20) ? malloc((size_t)n) : NULL;
    if (f) root = buf && fread(buf, 1, (size_t)n, f) == n ? json_loadb(buf, (size_t)n, 0, NULL) : NULL;
    if (f) fclose(f);
    free(buf);
    mha_tensors *t = NULL;
    const char *key;
    json_t *v;
    const float zero = 0;
    const int one = 1;
    if (json_is_object(root) && !mha_tensors_create(&t))
        json_object_foreach(root, key, v) {
            if (strcmp(key, "__metadata__") != 0 && mha_tensors_add_f32(t, key, &zero, 1, &one)) {
                mha_tensors_free(t), t = NULL;
                break;
            }
        }
    json_decref(root);
    return t;
}

/* Whether the checkpoint at path loads in a layout whose models keep a
 * config.json beside it: hf, or megatron (GPT-NeoX, Falcon, BLOOM save
 * query_key_value, and their rotary settings live only in config.json);
 * 2: gpt2; 3: no layout fits its names (the load will fail: config.json
 * may still name an unsupported family, e.g. DeepSeek's MLA). */
static int is_hf(const cli_ckpt *ck, const char *path) {
    mha_layout l;
    if (mha_layout_parse(&l, ck->layout ? ck->layout : "auto")) return 0;
    if (l == MHA_LAYOUT_AUTO) {
        mha_tensors *t = header_names(path);
        if (!t || mha_layout_detect(&l, t)) l = MHA_LAYOUT_AUTO;
        mha_tensors_free(t);
    }
    if (l == MHA_LAYOUT_AUTO) return 3;
    return l == MHA_LAYOUT_HF || l == MHA_LAYOUT_MEGATRON || l == MHA_LAYOUT_CODEGEN ? 1 : l == MHA_LAYOUT_GPT2 ? 2 : 0;
}

/* Whether model_type is one of names (a NULL-terminated list). */
static int type_in(const char *type, const char *const *names) {
    for (; type && *names; names++)
        if (strcmp(type, *names) == 0) return 1;
    return 0;
}

/* The families saved under GPT-2's names (c_attn, c_proj) whose config.json
 * a gpt2 checkpoint reads whole: Jais (ALiBi, its score scale) and Qwen 1
 * (whose c_attn the hf layout reads); of GPT-2's and GPT-BigCode's only the
 * score scale is read (gpt2_scale). */
static const char *const gpt2_named[] = {"jais", "qwen", NULL};
static const char *const ling[] = {"bailing_moe", "bailing_moe_v2", NULL}; /* Ling 1.x, Ling 2.0 */
static const char *const hunyuan[] = {"hunyuan_v1_dense", "hunyuan_v1_moe", NULL};

/* The layout a family's config.json names where its tensor names would be
 * read as another family's rows, or fit no layout: Qwen 1's nn.Linear
 * c_attn and ChatGLM 2/3's query_key_value (multi_query_attention) hold
 * [q; k; v] blocks, the hf layout's (auto reads GPT-BigCode's and
 * megatron's rows from these names); ChatGLM without multi-query keeps
 * megatron's [q, k, v] per head; CodeGen's qkv_proj its own blocks
 * (codegen). --layout naming another is refused. */
static const char *family_layout_name(json_t *root, const char *type) {
    if (type && strcmp(type, "chatglm") == 0)
        return json_is_true(json_object_get(root, "multi_query_attention")) ? "hf" : "megatron";
    /* Ling / Bailing (bailing_moe; Ling 2.0: bailing_moe_v2): query_key_value holds [h*d q; g*d k; g*d v]
     * blocks, ChatGLM's */
    if (type_in(type, ling)) return "hf";
    return type && strcmp(type, "qwen") == 0 ? "hf" : type && strcmp(type, "codegen") == 0 ? "codegen" : NULL;
}

static int family_layout(cli_hf_config *c, const char *cmd, json_t *root, const char *type, const char *flag) {
    const int glm = type && strcmp(type, "chatglm") == 0;
    const char *want = family_layout_name(root, type);
    if (glm && json_is_true(json_object_get(root, "position_encoding_2d"))) /* ChatGLM-6B, the first */
        return mha_cmd_error(cmd, MHA_EXIT_RUNTIME, "config.json: model_type chatglm with position_encoding_2d "
                             "(ChatGLM-6B: two rotary halves, by token and by block position); expected ChatGLM 2 / "
                             "3 (no position_encoding_2d): the 2-D rotary is not supported");
    if (want && flag && strcmp(flag, "auto") && strcmp(flag, want))
        return mha_cmd_error(cmd, MHA_EXIT_USAGE, "config.json: model_type %s keeps its attention in the %s layout's "
                             "rows, which --layout %s reads otherwise; expected --layout %s or auto", type, want, flag,
                             want);
    c->layout = want;
    return 0;
}

/* A number at key of obj into *dst when present: range lo..hi, whole
 * when asked. 0 or an exit code naming the key. */
static int number(const char *cmd, json_t *obj, const char *where, const char *key, double lo, double hi,
                  int whole, double *dst) {
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) return 0;
    const double x = json_is_number(v) ? json_number_value(v) : NAN;
    if (!(x >= lo && x <= hi) || (whole && x != floor(x)))
        return mha_cmd_error(cmd, MHA_EXIT_RUNTIME, "config.json: %s%s is %s; expected %s in %g..%g", where, key,
                             json_is_number(v) ? "out of range" : "not a number", whole ? "an integer" : "a number",
                             lo, hi);
    *dst = x;
    return 0;
}

/* LongRoPE's rope_scaling.short_factor and long_factor: lists of one
 * number > 0 per rotated pair, appended to spec as ",KEY=A:B:..." (the
 * library checks their length against the rotated dims). */
static int factor_lists(const char *cmd, json_t *s, const char *where, char *spec, size_t size, size_t *n) {
    static const char *const keys[] = {"short_factor", "long_factor"};
    for (int k = 0; k < 2; k++) {
        json_t *a = json_object_get(s, keys[k]);
        if (!json_is_array(a) || json_array_size(a) == 0 || json_array_size(a) > MHA_ROPE_MAX_PAIRS)
            return mha_cmd_error(cmd, MHA_EXIT_RUNTIME, "config.json: %s%s is %s; expected a list of "
                                 "1..%d numbers > 0, one per rotated pair (LongRoPE)", where, keys[k],
                                 !a ? "missing" : json_is_array(a) ? "of another length" : "not a list",
                                 MHA_ROPE_MAX_PAIRS);
        *n += (size_t)snprintf(spec + *n, size - *n, ",%s=", keys[k]);
        for (size_t i = 0; i < json_array_size(a); i++) {
            json_t *v = json_array_get(a, i);
            const double x = json_is_number(v) ? json_number_value(v) : NAN;
            if (!(x > 0 && x <= 1e9))
                return mha_cmd_error(cmd, MHA_EXIT_RUNTIME, "config.json: %s%s[%zu] is %s; expected a "
                                     "number in (0, 1e9]", where, keys[k], i, json_is_number(v) ? "out of range" :
                                     "not a number");
            *n += (size_t)snprintf(spec + *n, size - *n, "%s%.9g", i ? ":" : "", x);
        }
    }
    return 0;
}

/* LongRoPE's context: Phi-3 keeps the pre-training length L at the top
 * level as original_max_position_embeddings, and then the growth factor is
 * max_position_embeddings / L, as Hugging Face reads it; else L is
 * rope_scaling's original_max_position_embeddings or max_position_embeddings.
 * Transformers 5 (params: rope_parameters) keeps L there, and without a
 * factor takes max_position_embeddings / L as well. */
static int longrope_context(const char *cmd, json_t *root, double v[7], int params) {
    double top = 0, max_pos = 0;
    int rc = number(cmd, root, "", "original_max_position_embeddings", 1, 1 << 30, 1, &top);
    if (!rc) rc = number(cmd, root, "", "max_position_embeddings", 1, 1 << 30, 1, &max_pos);
    if (rc) return rc;
    if (top > 0) {
        v[3] = top;
        if (max_pos > 0) v[0] = max_pos > top ? max_pos / top : 1.0;
    } else if (v[3] == 0) {
        v[3] = max_pos;
    } else if (params && v[0] == 0 && max_pos > 0) {
        v[0] = max_pos > v[3] ? max_pos / v[3] : 1.0;
    }
    return 0;
}

/* rope_scaling: {"rope_type" (or "type"): linear|llama3|yarn|dynamic|
 * longrope (or Phi-3's first name, su)|default, factor, ...} as a
 * --rope-scale spec; the top-level max_position_embeddings is YaRN's
 * default original context and dynamic's (Hugging Face reads no other). */
static int rope_scaling(const char *cmd, json_t *root, json_t *s, const char *where, const char *model_type,
                        char *spec, size_t size) {
    if (!s || json_is_null(s)) return 0;
    if (!json_is_object(s))
        return mha_cmd_error(cmd, MHA_EXIT_RUNTIME, "config.json: %.*s is not an object; expected "
                             "{\"rope_type\": \"linear\"|\"llama3\"|\"yarn\"|\"dynamic\"|\"longrope\", \"factor\": F, "
                             "...} or null", (int)strlen(where) - 1, where);
    json_t *type = json_object_get(s, "rope_type");
    if (!type) type = json_object_get(s, "type");
    const char *kind = json_string_value(type);
    /* Qwen2-VL's multimodal rotary (Hugging Face reads it as default): one position per token, as every
     * input here has, rotates its three sections alike, i.e. plain RoPE */
    if (kind && (strcmp(kind, "default") == 0 || strcmp(kind, "mrope") == 0)) return 0;
    if (kind && strcmp(kind, "su") == 0) kind = "longrope"; /* Phi-3's first configs */
    static const char *const kinds[] = {"linear", "llama3", "yarn", "dynamic", "longrope", NULL};
    if (!type_in(kind, kinds))
        return mha_cmd_error(cmd, MHA_EXIT_RUNTIME, "config.json: %srope_type is %s%s%s; expected "
                             "\"linear\", \"llama3\", \"yarn\", \"dynamic\", \"longrope\" or \"default\"", where,
                             kind ? "\"" : "", kind ? kind : "missing or not a string", kind ? "\"" : "");
    if (json_is_false(json_object_get(s, "truncate"))) /* gpt-oss: the ramp ends stay unrounded */
        return mha_cmd_error(cmd, MHA_EXIT_RUNTIME, "config.json: %struncate is false; expected true "
                             "or absent: YaRN with unrounded ramp ends (gpt-oss) is not implemented, and the "
                             "rounded one differs by up to 5%% in the ramp's frequencies", where);
    static const char *const keys[] = {"factor", "low_freq_factor", "high_freq_factor",
                                       "original_max_position_embeddings", "beta_fast", "beta_slow",
                                       "attention_factor"};
    const int yarn = strcmp(kind, "yarn") == 0, dynamic = strcmp(kind, "dynamic") == 0;
    const int longrope = strcmp(kind, "longrope") == 0;
    double v[7] = {0};
    int rc = 0;
    for (int i = 0; !rc && i < 7; i++)
        rc = number(cmd, s, where, keys[i], i == 0 ? 1 : 1e-9, i == 3 ? 1 << 30 : 1e9, i == 3, &v[i]);
    if (!rc && dynamic) v[3] = 0; /* Hugging Face scales past max_position_embeddings only */
    if (!rc && v[3] == 0 && (yarn || dynamic)) /* as Hugging Face: the model's context */
        rc = number(cmd, root, "", "max_position_embeddings", 1, 1 << 30, 1, &v[3]);
    if (!rc && longrope) rc = longrope_context(cmd, root, v, strncmp(where, "rope_parameters", 15) == 0);
    if (!rc && yarn && v[6] == 0) { /* Hugging Face: mscale and mscale_all_dim (both set) give the ratio */
        double m = 0, all = 0;
        rc = number(cmd, s, where, "mscale", 0, 1e9, 0, &m); /* 0: unset, as None */
        if (!rc) rc = number(cmd, s, where, "mscale_all_dim", 0, 1e9, 0, &all);
        if (!rc && m > 0 && all > 0 && v[0] > 1) /* get_mscale(factor, m) / get_mscale(factor, all) */
            v[6] = (0.1 * m * log(v[0]) + 1.0) / (0.1 * all * log(v[0]) + 1.0);
        else if (!rc && m > 0 && all > 0) v[6] = 1.0; /* factor 1: both 1 */
    }
    if (!rc && longrope && model_type && strcmp(model_type, "phimoe") == 0) { /* Phi-3.5-MoE: cos, sin times its mscale */
        double ms[2] = {0, 0};
        rc = number(cmd, s, where, "short_mscale", 1e-9, 1e9, 0, &ms[0]);
        if (!rc) rc = number(cmd, s, where, "long_mscale", 1e-9, 1e9, 0, &ms[1]);
        if (!rc && ms[0] != ms[1])
            return mha_cmd_error(cmd, MHA_EXIT_RUNTIME, "config.json: %sshort_mscale = %g and "
                                 "long_mscale = %g differ (or one is missing); expected both equal or both "
                                 "absent: one attention factor per layer is implemented", where, ms[0], ms[1]);
        if (!rc && ms[0] > 0) v[6] = ms[0]; /* PhimoeRotaryEmbedding: the mscale wins over attention_factor */
    }
    if (rc) return rc;
    if (v[0] == 0 && !longrope)
        return mha_cmd_error(cmd, MHA_EXIT_RUNTIME, "config.json: %sfactor missing; expected a "
                             "number >= 1", where);
    if (strcmp(kind, "linear") && v[3] == 0)
        return mha_cmd_error(cmd, MHA_EXIT_RUNTIME, "config.json: %s%s missing; expected the %s",
                             dynamic || longrope ? "" : where,
                             dynamic || longrope ? "max_position_embeddings" : "original_max_position_embeddings",
                             dynamic ? "context beyond which dynamic NTK scales" : "pre-training context length");
    size_t n = (size_t)snprintf(spec, size, "%s:", kind);
    for (int i = 0; i < 7; i++)
        if (v[i] != 0) n += (size_t)snprintf(spec + n, size - n, "%s%s=%.17g", n > strlen(kind) + 1 ? "," : "",
                                             keys[i], v[i]);
    return longrope ? factor_lists(cmd, s, where, spec, size, &n) : 0;
}

static int slides(json_t *root, const char *type, long long n);

/* Gemma 3's text model_type (gemma3: the same keys, read at the top level) */
static const char *const gemma3_text[] = {"gemma3", "gemma3_text", NULL};
/* Families whose config class, without layer_types, makes every 4th layer global */
static const char *const every_fourth[] = {"cohere2", "olmo3", NULL};

/* The share of each head a family rotates when config.json names none
 * (partial_rotary_factor / rotary_pct absent): its config class's
 * default; 0: the whole head. */
static double default_share(const char *type) {
    static const char *const quarter[] = {"stablelm", "stablelm_epoch", "gpt_neox", NULL};
    /* GLM-4.5V's text model (glm4v_moe_text: Glm4vMoeTextConfig, a Glm4MoeConfig) too */
    static const char *const half[] = {"phi", "persimmon", "nemotron", "glm", "glm4", "glm4_moe",
                                       "glm4v_moe", "glm4v_moe_text", NULL};
    return type_in(type, quarter) ? 0.25 : type_in(type, half) ? 0.5 : 0;
}
static long long layer_index(const char *prefix);

/* Transformers 5 saves rope_theta, partial_rotary_factor and the scaling's
 * keys together in rope_parameters: one object, or one per layer type
 * ({"full_attention": {...}, "sliding_attention": {...}}: Gemma 3). *rp:
 * the layer's (NULL: none), where: its name for messages; *typed: per
 * layer type. Before, such a file's rope_theta was not read: Hugging
 * Face's 10000 (or no rotary at all) ran instead, silently. */
static int rope_parameters(const char *cmd, json_t *root, const char *type, const char *prefix, json_t **rp,
                           char *where, size_t size, int *typed) {
    json_t *a = json_object_get(root, "rope_parameters");
    *rp = NULL, *typed = 0;
    snprintf(where, size, "rope_parameters.");
    if (!a || json_is_null(a)) return 0;
    if (!json_is_object(a))
        return mha_cmd_error(cmd, MHA_EXIT_RUNTIME, "config.json: rope_parameters is not an object; expected "
                             "{\"rope_type\": ..., \"rope_theta\": ...}, one per layer type, or null");
    if (!json_is_object(json_object_get(a, "full_attention")) && !json_is_object(json_object_get(a, "sliding_attention"))) {
        *rp = a;
        return 0;
    }
    const int s = slides(root, type, layer_index(prefix));
    const char *kind = s ? "sliding_attention" : "full_attention";
    if (s < 0)
        return mha_cmd_error(cmd, MHA_EXIT_RUNTIME, "config.json: rope_parameters differ per layer type, and "
                             "--prefix names no layer; expected --prefix with the layer's number (model.layers.N)");
    if (!json_is_object(*rp = json_object_get(a, kind)))
        return mha_cmd_error(cmd, MHA_EXIT_RUNTIME, "config.json: rope_parameters has no object \"%s\" for this "
                             "layer; expected one per layer type", kind);
    snprintf(where, size, "rope_parameters.%s.", kind);
    *typed = 1;
    return 0;
}

/* Cohere (Command R) and Cohere 2 (Command R7B): interleaved rotary; Cohere
 * 2 rotates only its sliding layers (the global ones have no position
 * encoding) */
static const char *const cohere[] = {"cohere", "cohere2", NULL};
static const char *const llama4[] = {"llama4", "llama4_text", NULL};

/* Falcon's model_type, and those of its first custom-code configs */
static const char *const falcon[] = {"falcon", "RefinedWebModel", "RefinedWeb", NULL};

/* Families whose attention the layer cannot express, which would otherwise
 * load under Llama's names and run silently wrong: refused by model_type
 * or by the key that says so. Also read when no layout fits the tensor
 * names (MLA's), so that the refusal names the family. */
static int unsupported(const char *cmd, json_t *root, const char *type) {
    static const char *const mla[] = {"deepseek_v2", "deepseek_v3", "kimi_k2", "minicpm3", NULL};
    static const char *const gemma3n[] = {"gemma3n", "gemma3n_text", NULL};
    static const char *const zamba[] = {"zamba", "zamba2", NULL};
    static const char *const t5[] = {"t5", "mt5", "umt5", "longt5", "switch_transformers", NULL};
    const char *t = type ? type : "(none)";
    json_t *lora = json_object_get(root, "kv_lora_rank"), *s = json_object_get(root, "rope_scaling");
    if (type_in(type, mla) || json_is_number(lora))
        return mha_cmd_error(cmd, MHA_EXIT_RUNTIME, "config.json: model_type %s has kv_lora_rank: multi-head latent "
                             "attention (DeepSeek V2/V3's MLA: K and V from a shared latent, kv_b_proj, and a separate "
                             "rotary part of qk_rope_head_dim dims); expected q/k/v projections per head: MLA is not "
                             "supported", t);
    if (json_is_true(json_object_get(root, "headwise_attn_output_gate")))
        return mha_cmd_error(cmd, MHA_EXIT_RUNTIME, "config.json: model_type %s: headwise_attn_output_gate (one "
                             "gate per head, not per element); expected the elementwise attn_output_gate: the "
                             "headwise gate is not supported", t);
    /* Doge (DogeAttention): a per-key bias exp(A softplus(dt_proj(v))) added to the scores, and past
     * keep_window_size keys only the top-k keys kept; under q/k/v/o_proj it ran as Llama's layer, silently */
    if (type && strcmp(type, "doge") == 0)
        return mha_cmd_error(cmd, MHA_EXIT_RUNTIME, "config.json: model_type doge (Doge's dynamic mask attention: "
                             "a bias per key from dt_proj of the values and A, and the top keep_window_size keys "
                             "kept); expected softmax attention without a data-dependent mask: Doge is not supported");
    if (type && strcmp(type, "phi3small") == 0)
        return mha_cmd_error(cmd, MHA_EXIT_RUNTIME, "config.json: model_type phi3small (Phi-3-small): blocksparse "
                             "attention on most layers and muP's scores / head_dim; expected a dense layer: "
                             "Phi-3-small is not supported");
    if (type_in(type, gemma3n))
        return mha_cmd_error(cmd, MHA_EXIT_RUNTIME, "config.json: model_type %s (Gemma 3n): its v_norm (an RMSNorm "
                             "of v), unscaled scores and layers reusing another layer's K and V; expected none of "
                             "them: Gemma 3n is not supported", t);
    if (type_in(type, zamba))
        return mha_cmd_error(cmd, MHA_EXIT_RUNTIME, "config.json: model_type %s: its shared attention block reads "
                             "[hidden; embeddings] (twice the width) with LoRA adapters per use; expected a layer of "
                             "its own: %s is not supported", t, t);
    if (type_in(type, t5))
        return mha_cmd_error(cmd, MHA_EXIT_RUNTIME, "config.json: model_type %s: T5's learned relative position "
                             "bias (relative_attention_bias, bucketed) on unscaled scores; expected another "
                             "position encoding: %s is not supported", t, t);
    if (type && strcmp(type, "t5gemma") == 0) /* the layers' keys live in its encoder / decoder objects */
        return mha_cmd_error(cmd, MHA_EXIT_RUNTIME, "config.json: model_type t5gemma keeps each stack's settings "
                             "(rotary, window, soft-cap, scale) in \"encoder\" and \"decoder\", which are not read; "
                             "expected a decoder-only config: T5Gemma is not supported");
    if (type_in(type, hunyuan) && json_is_true(json_object_get(root, "use_qk_norm")))
        return mha_cmd_error(cmd, MHA_EXIT_RUNTIME, "config.json: use_qk_norm is true (Hunyuan's query_layernorm / "
                             "key_layernorm, applied after the rotary, whose per-dim weights do not commute with it); "
                             "expected false: a q/k norm after RoPE is not implemented");
    if (type && strcmp(type, "bitnet") == 0) /* BitNetAttention: Llama's, then attn_sub_norm before o_proj */
        return mha_cmd_error(cmd, MHA_EXIT_RUNTIME, "config.json: model_type bitnet (BitNet b1.58): its attn_sub_norm "
                             "(an RMSNorm of the heads' output before o_proj) and BitLinear's ternary weights and "
                             "8-bit activations; expected neither: BitNet is not supported (before, it ran as Llama's "
                             "layer without them)");
    json_t *p = json_object_get(root, "rope_parameters"); /* transformers 5 keeps it there */
    if ((json_is_object(s) && json_object_get(s, "alpha")) || (json_is_object(p) && json_object_get(p, "alpha")))
        return mha_cmd_error(cmd, MHA_EXIT_RUNTIME, "config.json: %s.alpha is set (Hunyuan's NTK-alpha scaling of "
                             "the rotary base); expected no alpha: it is not implemented",
                             json_is_object(s) && json_object_get(s, "alpha") ? "rope_scaling" : "rope_parameters");
    return 0;
}

/* Qwen 1 past seq_length: use_dynamic_ntk raises the rotary base by an
 * NTK alpha of the key count, use_logn_attn scales each query by
 * log_seq_length(position + 1) (QWenConfig: both on unless false, and
 * seq_length 2048); neither acts up to seq_length keys. c->long_context:
 * that length, which `run` does not exceed; 0: no such rule. */
static int qwen1_long(cli_hf_config *c, const char *cmd, json_t *root) {
    double len = 2048;
    int rc = number(cmd, root, "", "seq_length", 1, 1 << 30, 1, &len);
    if (!json_is_false(json_object_get(root, "use_dynamic_ntk")) || !json_is_false(json_object_get(root, "use_logn_attn")))
        c->long_context = (long long)len;
    return rc;
}

/* What model_type implies that no key of config.json says: these families
 * always rotate q and k (Hugging Face's rope_theta defaults to 10000, and
 * older Llama, Falcon and GPT-NeoX configs omit it), GPT-J rotates
 * interleaved pairs of its first rotary_dim dims, BLOOM and Falcon with
 * "alibi": true use ALiBi instead, and Gemma 3's q/k RMSNorm scales by
 * 1 + weight (its weights are stored centred on 0). Without this a
 * checkpoint ran silently without its position encoding. */
static int family(cli_hf_config *c, const char *cmd, json_t *root, const char *type) {
    static const char *const layer_norms[] = {"cohere", "cohere2", "stablelm", NULL};
    /* rotate_half on rotary_dim dims: Phi-1.5 / Phi-2 as first published (custom code: mixer.Wqkv) and
     * MiniMax M2 (rotary_dim 64 of head_dim 128; before, the whole head rotated, silently) */
    static const char *const phi_msft[] = {"phi-msft", "mixformer-sequential", "minimax_m2", NULL};
    const int bad = unsupported(cmd, root, type);
    if (bad) return bad;
    c->position_unknown = type && strcmp(type, "baichuan") == 0; /* 7B rotates, 13B uses ALiBi: not in config.json */
    static const char *const rotary[] = {"llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe",
                                         "gemma", "gemma2", "gemma3", "gemma3_text", "phi3", "phimoe", "olmo", "olmo2",
                                         "olmoe", "granite", "granitemoe", "starcoder2", "stablelm", "gpt_neox", "phi",
                                         "internlm2", "dbrx", "gpt_oss", "falcon", "RefinedWebModel", "RefinedWeb",
                                         "qwen3_next", "qwen", "nemotron", "persimmon", "glm", "glm4",
                                         "glm4_moe", "minimax", "stablelm_epoch", "bailing_moe", "bailing_moe_v2", "olmo3",
                                         "glm4v_moe_text", "glm4v_moe", NULL};
    /* (1 + weight) RMSNorms: Gemma 3's, and Qwen3-Next's zero-centred ones */
    static const char *const gemma3[] = {"gemma3", "gemma3_text", "qwen3_next", NULL};
    const int alibi = json_is_true(json_object_get(root, "alibi"));
    c->alibi = type && (strcmp(type, "bloom") == 0 || (type_in(type, falcon) && alibi));
    c->qk_norm_offset = type_in(type, gemma3);
    /* Qwen3-Next: every full-attention layer gates its output (no key says so; attn_output_gate where given) */
    json_t *gate = json_object_get(root, "attn_output_gate");
    c->output_gate = json_is_boolean(gate) ? json_is_true(gate) : type && strcmp(type, "qwen3_next") == 0;
    c->sinks = type && strcmp(type, "gpt_oss") == 0; /* every gpt-oss layer has them; ignored, Y was silently off */
    if (type && strcmp(type, "llama4_vision_model") == 0) /* its 2-D rotary over image patches */
        return mha_cmd_error(cmd, MHA_EXIT_RUNTIME, "config.json: model_type llama4_vision_model (Llama 4's vision "
                             "encoder) rotates q and k by the patches' 2-D positions; expected a text layer "
                             "(--prefix language_model.model.layers.N): the vision encoder is not supported");
    if (type && strcmp(type, "jais") == 0) {
        json_t *pe = json_object_get(root, "position_embedding_type"), *as = json_object_get(root, "alibi_scaling");
        if (as && !json_is_null(as))
            return mha_cmd_error(cmd, MHA_EXIT_RUNTIME, "config.json: alibi_scaling is set (Jais's ALiBi scaled "
                                 "past its training length); expected null: it is not implemented");
        c->alibi = pe && json_string_value(pe) && strcmp(json_string_value(pe), "alibi") == 0;
    }
    if (type && strcmp(type, "gpt_neo") == 0) c->scale = 1.0; /* GPT-Neo does not scale q.k */
    if (type_in(type, layer_norms)) { /* their q/k LayerNorm's eps */
        c->qk_norm_eps = 1e-5;
        int rc = number(cmd, root, "", "layer_norm_eps", 1e-30, 1, 0, &c->qk_norm_eps);
        if (rc) return rc;
    }
    c->qk_norm_layer = type_in(type, cohere) && json_is_true(json_object_get(root, "use_qk_norm"));
    /* Ling's use_qk_norm: query_layernorm / key_layernorm, an RMSNorm (d_k, eps rms_norm_eps) of each head
     * before the rotary, which the loader reads as Qwen 3's q_norm / k_norm (before: refused by name; Ling
     * 2.0 (bailing_moe_v2) ran without them, silently) */
    c->qk_norm_rms = type_in(type, ling) && json_is_true(json_object_get(root, "use_qk_norm"));
    /* Hunyuan: HunYuanDenseV1Attention / HunYuanMoEV1Attention apply query_layernorm / key_layernorm after
     * the rotary whatever config.json says (the classes have no use_qk_norm); without the key, the loader read
     * the tensors as Ling's norm before the rotary (0.6 off, silently): run refuses a layer that loaded them */
    c->qk_norm_after_rope = type_in(type, hunyuan);
    if (type_in(type, cohere) || type_in(type, llama4)) {
        c->rope = "interleaved"; /* Cohere's rotate_half, Llama 4's complex product: pairs 2i, 2i+1 as GPT-J's */
    } else if (type && (strcmp(type, "gptj") == 0 || strcmp(type, "codegen") == 0 || type_in(type, phi_msft))) {
        double r = 0; /* null or absent: the whole head */
        int rc = number(cmd, root, "", "rotary_dim", 2, 65536, 1, &r);
        if (rc) return rc;
        if ((long long)r % 2)
            return mha_cmd_error(cmd, MHA_EXIT_RUNTIME, "config.json: rotary_dim is %g; expected an even number", r);
        c->rope = type_in(type, phi_msft) ? "halves" : "interleaved", c->rope_dim = (long long)r; /* GPT-J, CodeGen */
    } else if (type_in(type, rotary) && !c->alibi)
        c->rope = "halves";
    /* GLM-4 (4V), ERNIE 4.5, Helium: cos, sin repeat_interleave'd, rotate_half of pairs (2i, 2i+1): GPT-J's */
    /* ChatGLM 2/3 (chatglm) too, on the first half of each head (its RotaryEmbedding(head_dim / 2)). Not
     * GLM-4.5V (glm4v_moe, glm4v_moe_text): Glm4vMoeTextAttention keeps rotate_half on cat(freqs, freqs), as
     * GLM-4.5 (before: interleaved, 0.8 off) */
    static const char *const glm_pairs[] = {"glm", "glm4", "glm4v", "glm4v_text", "ernie4_5", "ernie4_5_moe",
                                            "helium", "chatglm", NULL};
    if (type_in(type, glm_pairs)) c->rope = "interleaved";
    return 0;
}

/* The head counts under the names the older configs use: GPT-J, BLOOM and
 * the first Falcon configs say n_head (and GPT-J n_embd), DistilBERT
 * n_heads and dim, BART and Whisper encoder_/decoder_attention_heads (by
 * the module the prefix names) and d_model, Falcon num_kv_heads
 * (new_decoder_architecture) or multi_query (one kv head). */
static int head_aliases(const char *cmd, json_t *root, const char *type, const char *prefix, double *heads,
                        double *kv, double *hidden) {
    const char *side = prefix && strstr(prefix, "decoder") ? "decoder_attention_heads"
                       : prefix && strstr(prefix, "encoder") ? "encoder_attention_heads" : NULL;
    int rc = *heads ? 0 : number(cmd, root, "", "n_head", 1, 4096, 1, heads);
    if (!rc && !*heads) rc = number(cmd, root, "", "n_heads", 1, 4096, 1, heads);
    if (!rc && !*heads && type && strcmp(type, "gpt_neo") == 0)
        rc = number(cmd, root, "", "num_heads", 1, 4096, 1, heads);
    if (!rc && !*heads && side) rc = number(cmd, root, "", side, 1, 4096, 1, heads);
    if (!rc && !*hidden) rc = number(cmd, root, "", "n_embd", 1, 1 << 24, 1, hidden);
    if (!rc && !*hidden) rc = number(cmd, root, "", "d_model", 1, 1 << 24, 1, hidden);
    if (!rc && !*hidden && type && strcmp(type, "distilbert") == 0) rc = number(cmd, root, "", "dim", 1, 1 << 24, 1, hidden);
    if (!rc && !*kv) rc = number(cmd, root, "", "num_kv_heads", 1, 4096, 1, kv);
    if (!rc && !*kv && type_in(type, falcon) && json_is_true(json_object_get(root, "multi_query")) &&
        !json_is_true(json_object_get(root, "new_decoder_architecture")))
        *kv = 1;
    return rc;
}

/* MPT's and DBRX's attn_config: DBRX's kv_n_heads and rope_theta (into
 * *kv, *theta), MPT's alibi (with alibi_bias_max 8, whose slopes are the
 * paper's), softmax_scale, and either's clip_qkv; MPT's qk_ln (a LayerNorm
 * with bias of the whole q and k), another alibi_bias_max and llm-foundry's
 * rope are refused. */
static int attn_config(cli_hf_config *c, const char *cmd, json_t *root, const char *type, double *kv, double *theta) {
    json_t *a = json_object_get(root, "attn_config");
    const int mpt = type && strcmp(type, "mpt") == 0;
    if (!(mpt || (type && strcmp(type, "dbrx") == 0))) return 0;
    if (a && !json_is_null(a) && !json_is_object(a)) /* else its kv heads, ALiBi, clamp were silently dropped */
        return mha_cmd_error(cmd, MHA_EXIT_RUNTIME, "config.json: attn_config is not an object; expected %s's "
                             "{\"kv_n_heads\": G, \"clip_qkv\": C, ...} or null", type);
    if (!json_is_object(a)) return 0;
    double bias_max = 8;
    int rc = number(cmd, a, "attn_config.", "kv_n_heads", 1, 4096, 1, kv);
    if (!rc && !mpt) rc = number(cmd, a, "attn_config.", "rope_theta", 1, 1e12, 0, theta);
    if (!rc && !c->clip_qkv) rc = number(cmd, a, "attn_config.", "clip_qkv", 1e-30, 1e30, 0, &c->clip_qkv);
    if (!rc && mpt) rc = number(cmd, a, "attn_config.", "softmax_scale", 1e-30, 1e30, 0, &c->scale);
    if (!rc && mpt) rc = number(cmd, a, "attn_config.", "alibi_bias_max", 1e-9, 1e9, 0, &bias_max);
    if (rc || !mpt) return rc;
    if (json_is_true(json_object_get(a, "qk_ln")))
        return mha_cmd_error(cmd, MHA_EXIT_RUNTIME, "config.json: attn_config.qk_ln is true (MPT's LayerNorm with "
                             "bias of q and k); expected false: it is not implemented");
    if (json_is_true(json_object_get(a, "rope")))
        return mha_cmd_error(cmd, MHA_EXIT_RUNTIME, "config.json: attn_config.rope is true; expected false: "
                             "llm-foundry's rotary settings are not read");
    c->alibi = json_is_true(json_object_get(a, "alibi"));
    if (c->alibi && bias_max != 8)
        return mha_cmd_error(cmd, MHA_EXIT_RUNTIME, "config.json: attn_config.alibi_bias_max is %g; expected 8: "
                             "other ALiBi slopes than the paper's are not implemented", bias_max);
    return 0;
}

/* Llama 4 (iRoPE): the layers without rotary (no_rope_layers[n] = 0; an
 * absent or empty list: every no_rope_layer_interval-th, default 4) attend
 * globally, with attn_temperature_tuning (default true) scaling the query
 * at position p by 1 + attn_scale ln(1 + floor((p + 1) / floor_scale))
 * (defaults 0.1 and 8192: 1 below position 8191); the others rotate
 * (interleaved), divide q and k by their RMS when use_qk_norm (default
 * true) and attend inside chunks of attention_chunk_size (default 8192;
 * layer_types, when given, names the chunked_attention layers). n: the
 * layer's number, -1 when --prefix names none (then -1 where layers differ). */
static int llama4_layer(cli_hf_config *c, const char *cmd, json_t *root, long long n) {
    json_t *a = json_object_get(root, "no_rope_layers"), *types = json_object_get(root, "layer_types");
    double interval = 4, chunk = 8192, floor_scale = 8192, attn_scale = 0.1;
    int rc = number(cmd, root, "", "no_rope_layer_interval", 1, 1 << 20, 1, &interval);
    if (!rc) rc = number(cmd, root, "", "attention_chunk_size", 1, 1 << 30, 1, &chunk);
    if (!rc) rc = number(cmd, root, "", "floor_scale", 1, 1 << 30, 1, &floor_scale);
    if (!rc) rc = number(cmd, root, "", "attn_scale", 1e-30, 1e30, 0, &attn_scale);
    if (rc) return rc;
    if (!json_is_array(a) || json_array_size(a) == 0) /* Hugging Face's default list */
        c->no_rope = n < 0 ? (interval > 1 ? -1 : 1) : (n + 1) % (long long)interval == 0;
    json_t *cs = json_object_get(root, "attention_chunk_size");
    if (cs && json_is_null(cs)) chunk = 0; /* null: full attention everywhere */
    int chunked = c->no_rope < 0 ? -1 : !c->no_rope;
    if (json_is_array(types) && json_array_size(types)) {
        int any = 0, all = 1, mine = 0;
        for (size_t i = 0; i < json_array_size(types); i++) {
            const char *t = json_string_value(json_array_get(types, i));
            const int ch = t && strcmp(t, "chunked_attention") == 0;
            any |= ch, all &= ch;
            if ((long long)i == n) mine = ch;
        }
        chunked = n >= 0 ? mine : any == all ? all : -1;
    }
    c->chunk = !chunk || !chunked ? 0 : chunked < 0 ? -1 : (long long)chunk;
    json_t *qn = json_object_get(root, "use_qk_norm"), *tt = json_object_get(root, "attn_temperature_tuning");
    c->qk_l2_norm = c->no_rope == 0 && !json_is_false(qn) && !json_is_null(qn); /* default true */
    /* Hugging Face tests the value's truth: absent is true, false, null and 0 are off */
    if (tt && !json_is_boolean(tt) && !json_is_number(tt) && !json_is_null(tt)) /* "false" is true in Python */
        return mha_cmd_error(cmd, MHA_EXIT_RUNTIME, "config.json: attn_temperature_tuning is not a boolean; "
                             "expected true or false (absent: true, Llama 4's default)");
    const int tuning = !tt || json_is_true(tt) || (json_is_number(tt) && json_number_value(tt) != 0);
    if (c->no_rope == 1 && tuning) c->temperature_floor = floor_scale, c->temperature_scale = attn_scale;
    if (c->qk_l2_norm && !c->qk_norm_eps) c->qk_norm_eps = 1e-5; /* Llama4TextConfig's rms_norm_eps */
    return 0;
}

/* The layer number in a prefix: its last all-digit component
 * (model.layers.7.self_attn. -> 7), or -1 when it has none. */
static long long layer_index(const char *prefix) {
    long long n = -1;
    for (const char *p = prefix; p && *p;) {
        const size_t len = strcspn(p, ".");
        if (len && len < 10 && strspn(p, "0123456789") == len) n = strtoll(p, NULL, 10);
        p += len + (p[len] == '.');
    }
    return n;
}

/* Whether layer n attends through a sliding window, by the rule its family
 * writes into config.json: layer_types[n] ("sliding_attention"), Gemma 3's
 * sliding_window_pattern P (every P-th layer is global), Gemma 2 (even
 * layers slide), Qwen 2/3 (use_sliding_window, from max_window_layers on),
 * Mistral, Mixtral, Phi-3, Starcoder 2 (every layer); any other family
 * ignores sliding_window. 1, 0, or -1 when it depends on n and n < 0. */
/* GPT-Neo: whether layer n is "local" in attention_layers, else in
 * attention_types [[["global", "local"], repeats], ...] expanded; -1 when
 * the layers differ and n < 0. */
static int neo_local(json_t *root, long long n) {
    json_t *layers = json_object_get(root, "attention_layers"), *types = json_object_get(root, "attention_types");
    long long i = 0;
    int mine = 0, any = 0, all = 1;
    for (size_t k = 0; json_is_array(layers) && k < json_array_size(layers); k++, i++) {
        const char *s = json_string_value(json_array_get(layers, k));
        const int local = s && strcmp(s, "local") == 0;
        any |= local, all &= local, mine |= i == n && local;
    }
    for (size_t k = 0; !json_is_array(layers) && json_is_array(types) && k < json_array_size(types); k++) {
        json_t *pair = json_array_get(types, k), *kinds = json_array_get(pair, 0);
        json_t *count = json_array_get(pair, 1);
        const long long reps = json_is_integer(count) ? json_integer_value(count) : 0;
        for (long long r = 0; r < reps && r < 1 << 20; r++)
            for (size_t m = 0; json_is_array(kinds) && m < json_array_size(kinds); m++, i++) {
                const char *s = json_string_value(json_array_get(kinds, m));
                const int local = s && strcmp(s, "local") == 0;
                any |= local, all &= local, mine |= i == n && local;
            }
    }
    return n < 0 ? (any && !all ? -1 : any) : mine;
}

static int slides(json_t *root, const char *type, long long n) {
    static const char *const every[] = {"mistral", "mixtral", "phi3", "phimoe", "starcoder2", NULL};
    /* MiniMax: MiniMaxModel gives every full_attention layer (its layer_types say full_attention or
     * linear_attention, never sliding_attention) the sliding mask when sliding_window is set */
    if (type && strcmp(type, "minimax") == 0) return 1;
    static const char *const qwen[] = {"qwen2", "qwen2_moe", "qwen3", "qwen3_moe", NULL};
    json_t *types = json_object_get(root, "layer_types"), *pattern = json_object_get(root, "sliding_window_pattern");
    if (json_is_array(types) && json_array_size(types)) {
        const char *first = json_string_value(json_array_get(types, 0)), *mine = NULL;
        int same = 1;
        for (size_t i = 0; i < json_array_size(types); i++) {
            const char *t = json_string_value(json_array_get(types, i));
            same = same && t && first && strcmp(t, first) == 0;
            if ((long long)i == n) mine = t;
        }
        if (n < 0 && !same) return -1;
        if (n < 0) mine = first;
        return mine && strcmp(mine, "sliding_attention") == 0;
    }
    if (type && strcmp(type, "gpt_neo") == 0) return neo_local(root, n);
    /* dots.llm1 (Dots1Config, without layer_types): the layers from max_window_layers (default 62) on slide
     * whenever sliding_window is set; it has no use_sliding_window (before: every layer global, silently) */
    if (type && strcmp(type, "dots1") == 0) {
        json_t *m = json_object_get(root, "max_window_layers"), *l = json_object_get(root, "num_hidden_layers");
        const long long from = json_is_number(m) ? (long long)json_number_value(m) : 62; /* whole: layer_lists */
        const long long layers = json_is_integer(l) ? json_integer_value(l) : 62;
        return from >= layers ? 0 : from <= 0 ? 1 : n < 0 ? -1 : n >= from;
    }
    const char *letters = json_string_value(pattern); /* EXAONE 4: "LLLG", layer n slides at an L */
    if (letters && *letters && strspn(letters, "LG") == strlen(letters)) {
        const int uniform = !strchr(letters, 'G') || !strchr(letters, 'L');
        return n < 0 ? (uniform ? letters[0] == 'L' : -1) : letters[n % (long long)strlen(letters)] == 'L';
    }
    if (json_is_integer(pattern) && json_integer_value(pattern) > 0)
        return n < 0 ? -1 : (n + 1) % json_integer_value(pattern) != 0;
    if (type_in(type, gemma3_text) && !pattern) return n < 0 ? -1 : (n + 1) % 6 != 0; /* Gemma3TextConfig's 6 */
    /* Cohere2Config (sliding_window_pattern 4) and Olmo3Config: every 4th layer global by default */
    if (type_in(type, every_fourth) && !pattern) return n < 0 ? -1 : (n + 1) % 4 != 0;
    if (type && strcmp(type, "gemma2") == 0) return n < 0 ? -1 : n % 2 == 0;
    if (type_in(type, qwen)) {
        if (!json_is_true(json_object_get(root, "use_sliding_window"))) return 0;
        json_t *m = json_object_get(root, "max_window_layers");
        return !json_is_number(m) ? 1 : n < 0 ? -1 : n >= (long long)json_number_value(m);
    }
    return type_in(type, every);
}

/* The window of the layer the prefix names (c->window) and, for Gemma 3's
 * sliding layers, their own rotary base rope_local_base_freq (default
 * 10000, into *theta) without the global layers' rope_scaling. Before this, a Gemma 2/3,
 * Mistral or gpt-oss layer ran globally, and Gemma 3's local layers with
 * the global theta: a wrong Y even for short inputs. */
static int window(cli_hf_config *c, const char *cmd, json_t *root, const char *type, const char *prefix,
                  double *theta) {
    double w = 0;
    const int neo = type && strcmp(type, "gpt_neo") == 0; /* its local layers' window_size, default 256 */
    if (neo) w = 256;
    if ((type_in(type, gemma3_text) || type_in(type, every_fourth) || (type && strcmp(type, "gemma2") == 0)) &&
        !json_object_get(root, "sliding_window"))
        w = 4096; /* Gemma2Config's, Gemma3TextConfig's, Cohere2Config's, Olmo3Config's default; null: none */
    /* 0, like null: no window */
    int rc = number(cmd, root, "", neo ? "window_size" : "sliding_window", 0, 1 << 30, 1, &w);
    const int s = rc || !w ? 0 : slides(root, type, layer_index(prefix));
    if (rc || !s) return rc;
    c->window = s < 0 ? -1 : (long long)w;
    if (s > 0 && type && strcmp(type, "olmo3") == 0) c->rope_scale[0] = '\0'; /* OLMo 3: default RoPE there */
    if (s > 0 && c->qk_norm_offset && theta) { /* Gemma 3: the local layers' rotary (NULL: rope_parameters') */
        double local = 10000;
        if ((rc = number(cmd, root, "", "rope_local_base_freq", 1, 1e12, 0, &local))) return rc;
        *theta = local, c->rope_scale[0] = '\0';
    }
    return 0;
}

/* no_rope_layers (SmolLM 3, Llama 4): 1 where layer n rotates, 0 where it
 * has no position encoding (NoPE). c->no_rope = 1 for a NoPE layer, -1
 * when the entries differ and the prefix has no layer number. SmolLM 3
 * without the list: every no_rope_layer_interval-th layer (default 4,
 * counted from 1) is NoPE, the list its config class makes. */
/* An entry of no_rope_layers that turns the rotary off: 0 or false (Python's
 * truth; before, false rotated) */
static int off_entry(json_t *e) {
    return json_is_false(e) || (json_is_number(e) && json_number_value(e) == 0);
}

static int nope(cli_hf_config *c, const char *cmd, json_t *root, const char *type, const char *prefix) {
    json_t *a = json_object_get(root, "no_rope_layers");
    const long long n = layer_index(prefix);
    if (type && strcmp(type, "smollm3") == 0 && (!json_is_array(a) || !json_array_size(a))) {
        double interval = 4;
        int rc = number(cmd, root, "", "no_rope_layer_interval", 1, 1 << 20, 1, &interval);
        if (!rc) c->no_rope = n < 0 ? (interval > 1 ? -1 : 1) : (n + 1) % (long long)interval == 0;
        return rc;
    }
    int mixed = 0, off = 0;
    for (size_t i = 0; json_is_array(a) && i < json_array_size(a); i++) {
        const int zero = off_entry(json_array_get(a, i)); /* layer_lists checked: numbers or bools */
        mixed |= zero != off_entry(json_array_get(a, 0));
        if ((long long)i == n || (n < 0 && i == 0)) off = zero;
    }
    c->no_rope = n < 0 && mixed ? -1 : off;
    return 0;
}

/* GPT-Neo's attention_layers (one "global" / "local" per layer), or its
 * attention_types [[kinds, repeats], ...] expanded, under layer_lists' rule:
 * strings only, and the layer n (-1: none named) among them. */
static int neo_lists(const char *cmd, json_t *root, long long n) {
    json_t *al = json_object_get(root, "attention_layers"), *at = json_object_get(root, "attention_types");
    const char *key = json_is_array(al) ? "attention_layers" : "attention_types";
    long long len = 0;
    int bad = 0;
    for (size_t i = 0; json_is_array(al) && i < json_array_size(al); i++, len++)
        bad |= !json_is_string(json_array_get(al, i));
    for (size_t i = 0; !json_is_array(al) && json_is_array(at) && i < json_array_size(at); i++) {
        json_t *kinds = json_array_get(json_array_get(at, i), 0), *reps = json_array_get(json_array_get(at, i), 1);
        bad |= !json_is_array(kinds) || !json_is_integer(reps) || json_integer_value(reps) < 0;
        for (size_t j = 0; json_is_array(kinds) && j < json_array_size(kinds); j++)
            bad |= !json_is_string(json_array_get(kinds, j));
        const long long r = bad ? 0 : json_integer_value(reps);
        len += (long long)json_array_size(kinds) * (r < 1 << 20 ? r : 1 << 20);
    }
    if (bad)
        return mha_cmd_error(cmd, MHA_EXIT_RUNTIME, "config.json: GPT-Neo's %s holds an entry of another type; "
                             "expected %s", key, json_is_array(al) ? "one string (\"global\" or \"local\") per layer"
                                                                   : "[[[\"global\", \"local\"], repeats], ...]");
    if ((json_is_array(al) || json_is_array(at)) && len > 0 && n >= len)
        return mha_cmd_error(cmd, MHA_EXIT_RUNTIME, "config.json: GPT-Neo's %s gives %lld layers, and --prefix names "
                             "layer %lld; expected one entry per layer (is it the config of another model?)", key,
                             len, n);
    return 0;
}

/* The per-layer keys, checked before any is read: layer_types a list of
 * one string per layer, no_rope_layers one 1 (rotary) or 0 (none) per layer
 * (a bool as Python reads it), GPT-Neo's kinds (neo_lists), each holding
 * the layer --prefix names, and max_window_layers a whole number. Before, a
 * list shorter than the layer's number, an entry of another type or a
 * fractional max_window_layers read as some other layer kind, silently
 * (HF's configs index the lists by the layer, and compare the layer with
 * max_window_layers exactly). */
static int layer_lists(const char *cmd, json_t *root, const char *prefix) {
    static const char *const keys[2] = {"layer_types", "no_rope_layers"};
    static const char *const want[2] = {"string (\"full_attention\", \"sliding_attention\", ...)",
                                        "1 (rotary) or 0 (no position encoding)"};
    const long long n = layer_index(prefix);
    for (int k = 0; k < 2; k++) {
        json_t *a = json_object_get(root, keys[k]);
        if (!a || json_is_null(a)) continue;
        if (!json_is_array(a))
            return mha_cmd_error(cmd, MHA_EXIT_RUNTIME, "config.json: %s is not a list; expected one %s per layer, "
                                 "or null", keys[k], want[k]);
        for (size_t i = 0; i < json_array_size(a); i++) {
            json_t *e = json_array_get(a, i);
            if (k == 0 ? !json_is_string(e) : !json_is_number(e) && !json_is_boolean(e))
                return mha_cmd_error(cmd, MHA_EXIT_RUNTIME, "config.json: %s[%zu] is not %s; expected %s%s", keys[k],
                                     i, k == 0 ? "a string" : "a number", k == 0 ? "a " : "", want[k]);
        }
        if (json_array_size(a) && n >= (long long)json_array_size(a))
            return mha_cmd_error(cmd, MHA_EXIT_RUNTIME, "config.json: %s has %zu entries, and --prefix names layer "
                                 "%lld; expected one per layer (is it the config of another model?)", keys[k],
                                 json_array_size(a), n);
    }
    int rc = neo_lists(cmd, root, n);
    double m = 0;
    return rc ? rc : number(cmd, root, "", "max_window_layers", 0, 1 << 30, 1, &m);
}

/* A layer that layer_types names "linear_attention" (MiniMax's lightning
 * attention: a decayed linear attention with an RMSNorm and an output gate
 * under qkv_proj / out_proj; Qwen3-Next's Gated DeltaNet) is no softmax
 * attention: refused by name, whatever layout its names would fit. */
static int linear_layer(const char *cmd, json_t *root, const char *type, const char *prefix) {
    json_t *types = json_object_get(root, "layer_types");
    const long long n = layer_index(prefix);
    const char *t = n >= 0 && json_is_array(types) ? json_string_value(json_array_get(types, (size_t)n)) : NULL;
    if (!t || strcmp(t, "linear_attention") != 0) return 0;
    return mha_cmd_error(cmd, MHA_EXIT_RUNTIME, "config.json: layer_types[%lld] is \"linear_attention\" (model_type "
                         "%s: a linear attention without softmax, e.g. MiniMax's lightning attention); expected a "
                         "full_attention or sliding_attention layer: linear attention is not supported", n,
                         type ? type : "(none)");
}

/* GPT-2 (GPT2Attention) divides the scores by sqrt(head_dim) only with
 * scale_attn_weights (default true), and by layer_idx + 1 with
 * scale_attn_by_inverse_layer_idx (Stanford CRFM's GPT-2 runs write true);
 * GPT-BigCode (GPTBigCodeAttention) reads scale_attn_weights alike. Into
 * c->scale, head_dim being n_embd / n_head. Before, a gpt2 checkpoint's
 * config.json was not read: 1/sqrt(head_dim) always, silently. */
static int gpt2_scale(cli_hf_config *c, const char *cmd, json_t *root, const char *prefix) {
    const int weights = !json_is_false(json_object_get(root, "scale_attn_weights"));
    const int inverse = json_is_true(json_object_get(root, "scale_attn_by_inverse_layer_idx"));
    const long long n = layer_index(prefix);
    double heads = 0, width = 0;
    if (weights && !inverse) return 0;
    if (inverse && n < 0)
        return mha_cmd_error(cmd, MHA_EXIT_USAGE, "config.json: scale_attn_by_inverse_layer_idx is true (GPT-2 "
                             "divides the scores by the layer's number + 1), and --prefix names no layer; expected "
                             "--prefix with the layer's number (transformer.h.N)");
    int rc = number(cmd, root, "", "n_head", 1, 4096, 1, &heads);
    if (!rc) rc = number(cmd, root, "", "n_embd", 1, 1 << 24, 1, &width);
    if (!rc && weights && !(heads && width))
        rc = mha_cmd_error(cmd, MHA_EXIT_RUNTIME, "config.json: n_embd or n_head missing; expected both, whose "
                           "ratio is the head_dim that scale_attn_weights divides the scores by the root of");
    if (!rc) c->scale = (weights ? 1.0 / sqrt(width / heads) : 1.0) / (inverse ? (double)(n + 1) : 1.0);
    return rc;
}

/* The part of config.json that describes the layer. Multimodal models
 * (Gemma 3, LLaVA, Mistral 3, CLIP, SigLIP) keep their towers' settings
 * in text_config and vision_config, not at the top level: a prefix naming
 * a vision module (vision_model, vision_tower) reads vision_config, any
 * other text_config, when the top level has no num_attention_heads. Read
 * at the top level, a Gemma 3 checkpoint lost its theta, window and scale. */
static json_t *sub_config(json_t *root, const char *prefix) {
    if (json_object_get(root, "num_attention_heads")) return root;
    json_t *sub = json_object_get(root, prefix && strstr(prefix, "vision") ? "vision_config" : "text_config");
    return json_is_object(sub) ? sub : root;
}

int cli_hf_config_read(cli_hf_config *c, const char *cmd, const cli_ckpt *ck, const char *path) {
    memset(c, 0, sizeof *c);
    if (!path) path = ck->weights;
    char resolved[4096]; /* a directory: the model.safetensors (or index) inside, beside its config.json */
    if (!path || mha_checkpoint_resolve(resolved, sizeof resolved, path)) return 0; /* the load says why */
    path = resolved;
    char file[4096];
    const char *slash = path ? strrchr(path, '/') : NULL;
    const int dir = slash ? (int)(slash - path + 1) : 0;
    if (!path || snprintf(file, sizeof file, "%.*sconfig.json", dir, path) >= (int)sizeof file) return 0;
    const int kind = access(file, F_OK) != 0 ? 0 : is_hf(ck, path);
    if (!kind) return 0;
    json_error_t err;
    json_t *root = json_load_file(file, 0, &err);
    if (kind == 3 && !json_is_object(root)) { /* the load says why the checkpoint does not fit */
        json_decref(root);
        return 0;
    }
    if (!root || !json_is_object(root)) {
        json_decref(root);
        return root ? mha_cmd_error(cmd, MHA_EXIT_RUNTIME, "%s: not a JSON object; expected Hugging Face's "
                                    "config.json", file)
                    : mha_cmd_error(cmd, MHA_EXIT_RUNTIME, "%s: line %d: %s; expected Hugging Face's config.json "
                                    "(JSON)", file, err.line, err.text);
    }
    json_t *top = root;
    root = sub_config(top, ck->prefix);
    double heads = 0, kv = 0, hd = 0, hidden = 0, theta = 0, part = 0;
    const char *type = json_string_value(json_object_get(root, "model_type")); /* what the family implies */
    static const char *const unnamed[] = {"codegen", NULL}; /* no layout is detected from its names */
    int linear = layer_lists(cmd, root, ck->prefix);
    if (!linear) linear = linear_layer(cmd, root, type, ck->prefix);
    if (linear) {
        json_decref(top);
        return linear;
    }
    if ((kind == 2 && !type_in(type, gpt2_named)) || (kind == 3 && !type_in(type, unnamed))) {
        /* GPT-2, GPT-BigCode: only their score scale is read; no layout: name the family if refused */
        const int rc = kind == 3 ? unsupported(cmd, root, type) : gpt2_scale(c, cmd, root, ck->prefix);
        json_decref(top);
        return rc;
    }
    int rc = number(cmd, root, "", "num_attention_heads", 1, 4096, 1, &heads);
    if (!rc) rc = number(cmd, root, "", "num_key_value_heads", 1, 4096, 1, &kv);
    if (!rc) rc = number(cmd, root, "", "head_dim", 1, 65536, 1, &hd);
    if (!rc) rc = number(cmd, root, "", "hidden_size", 1, 1 << 24, 1, &hidden);
    if (!rc) rc = head_aliases(cmd, root, type, ck->prefix, &heads, &kv, &hidden);
    /* Gemma 2 / 3: Gemma 3's multimodal config.json (4B and up) writes into text_config only the keys
     * that differ from Gemma3TextConfig's defaults; Gemma2Config's are the same: 8 heads, 4 kv heads of
     * head_dim 256 (not hidden_size / heads), rope_theta (1e6 for Gemma 3), query_pre_attn_scalar 256,
     * sliding_window 4096, Gemma 3's sliding_window_pattern 6, Gemma 2's soft-cap 50. Before, a
     * Gemma 3 4B ran with rope_theta 10000, its local layers globally and with the global rotary. */
    const int gemma2 = type && strcmp(type, "gemma2") == 0, gemma3 = type_in(type, gemma3_text);
    if (!rc && (gemma2 || gemma3) && !heads && !json_object_get(root, "num_attention_heads")) heads = 8;
    if (!rc && (gemma2 || gemma3) && !kv && !json_object_get(root, "num_key_value_heads")) kv = 4;
    const int hd_default = !rc && (gemma2 || gemma3) && !hd && !json_object_get(root, "head_dim");
    if (hd_default) hd = 256;
    if (!rc) rc = family_layout(c, cmd, root, type, ck->layout);
    const int glm = type && strcmp(type, "chatglm") == 0, qwen1 = type && strcmp(type, "qwen") == 0;
    if (!rc && (glm || qwen1) && !hd) rc = number(cmd, root, "", "kv_channels", 1, 65536, 1, &hd); /* head dim */
    if (!rc && glm && json_is_true(json_object_get(root, "multi_query_attention")) && !kv)
        rc = number(cmd, root, "", "multi_query_group_num", 1, 4096, 1, &kv);
    if (!rc) rc = number(cmd, root, "", "rms_norm_eps", 1e-30, 1, 0, &c->qk_norm_eps);
    /* LFM2: its q/k_layernorm's eps (Lfm2Config's norm_eps); LFM2-MoE's Lfm2MoeAttention is LFM2's, eps
     * Lfm2MoeConfig's norm_eps (before: not read for lfm2_moe, the loader's eps ran) */
    static const char *const lfm2[] = {"lfm2", "lfm2_moe", NULL};
    if (!rc && type_in(type, lfm2))
        rc = number(cmd, root, "", "norm_eps", 1e-30, 1, 0, &c->qk_norm_eps);
    if (!rc) rc = family(c, cmd, root, type);
    if (!rc) rc = number(cmd, root, "", "rotary_emb_base", 1, 1e12, 0, &theta);
    if (!rc) rc = number(cmd, root, "", "rope_theta", 1, 1e12, 0, &theta);
    if (!rc) rc = number(cmd, root, "", "rotary_pct", 1e-9, 1, 0, &part);
    if (!rc) rc = number(cmd, root, "", "partial_rotary_factor", 1e-9, 1, 0, &part);
    /* StableLM's first custom code (stablelm_epoch: StableLM-3B-4E1T, Zephyr 3B, StableLM 2's first
     * configs) rotates rope_pct of each head (rotary_ndims); before, the whole head rotated */
    if (!rc && !part && type && strcmp(type, "stablelm_epoch") == 0)
        rc = number(cmd, root, "", "rope_pct", 1e-9, 1, 0, &part);
    if (!rc && glm) { /* ChatGLM 2/3: RotaryEmbedding(head_dim / 2), base 10000 * rope_ratio */
        double ratio = 1;
        rc = number(cmd, root, "", "rope_ratio", 1e-9, 1e8, 0, &ratio);
        theta = 10000.0 * ratio, part = 0.5;
    }
    if (!rc && qwen1) rc = qwen1_long(c, cmd, root);
    json_t *rp = NULL; /* transformers 5's rope_parameters win over the older keys */
    char where[64];
    int typed = 0;
    if (!rc) rc = rope_parameters(cmd, root, type, ck->prefix, &rp, where, sizeof where, &typed);
    if (!rc && rp) rc = number(cmd, rp, where, "rope_theta", 1, 1e12, 0, &theta);
    if (!rc && rp) rc = number(cmd, rp, where, "partial_rotary_factor", 1e-9, 1, 0, &part);
    /* Bamba: BambaConfig sets partial_rotary_factor to 0.5 whatever config.json says (its attn_rotary_emb
     * is half the head): before, a config.json without the key rotated the whole head */
    if (!rc && type && strcmp(type, "bamba") == 0) part = 0.5;
    /* Absent from config.json, the rotated share is the config class's default: StableLmConfig 0.25,
     * GPTNeoXConfig rotary_pct 0.25, PhiConfig, PersimmonConfig, NemotronConfig, GlmConfig, Glm4Config,
     * Glm4MoeConfig 0.5 (before: the whole head rotated, silently) */
    if (!rc && !part) part = default_share(type);
    if (!rc && !theta && type && strcmp(type, "persimmon") == 0) theta = 25000; /* PersimmonConfig's rope_theta */
    if (!rc && !theta && type && strcmp(type, "minimax") == 0) theta = 1e6; /* MiniMaxConfig's default_theta */
    if (!rc && !theta && !rp && type && strcmp(type, "olmo3") == 0) theta = 5e5; /* Olmo3Config's default_theta */
    double ling_dims = 0; /* Ling (bailing_moe, bailing_moe_v2): rotary_dim, else partial_rotary_factor of the head */
    if (!rc && type_in(type, ling) && !part)
        rc = number(cmd, root, "", "rotary_dim", 2, 65536, 1, &ling_dims);
    /* Ministral 3: q x (1 + beta ln(1 + floor(p / original_max_position_embeddings))), in rope_parameters
       or (transformers 4) rope_scaling */
    double beta = 0, orig = 0;
    json_t *rs = rp ? rp : json_object_get(root, "rope_scaling");
    const char *rs_where = rp ? where : "rope_scaling.";
    if (!json_is_object(rs)) rs = NULL;
    if (!rc && rs) rc = number(cmd, rs, rs_where, "llama_4_scaling_beta", 0, 1e9, 0, &beta);
    if (!rc && rs && beta > 0) rc = number(cmd, rs, rs_where, "original_max_position_embeddings", 1, 1 << 30, 1, &orig);
    if (!rc && beta > 0 && !orig)
        rc = mha_cmd_error(cmd, MHA_EXIT_RUNTIME, "config.json: %sllama_4_scaling_beta is %g but "
                           "original_max_position_embeddings is missing; expected the length from which Ministral 3 "
                           "scales the queries", rs_where, beta);
    if (!rc && beta > 0) c->temperature_floor = orig, c->temperature_scale = beta, c->temperature_rule = 1;
    if (!rc) rc = rope_scaling(cmd, root, rp ? rp : json_object_get(root, "rope_scaling"), rp ? where : "rope_scaling.",
                               type, c->rope_scale, sizeof c->rope_scale);
    /* Gemma 2: the scores are scaled by query_pre_attn_scalar^-1/2, not head_dim's (absent: 256) */
    double pre = (gemma2 || gemma3) && !json_object_get(root, "query_pre_attn_scalar") ? 256 : 0;
    if (gemma2 && !json_object_get(root, "attn_logit_softcapping")) c->softcap = 50; /* null: none */
    if (!rc && gemma3 && !theta && !rp) theta = 1e6; /* Gemma3TextConfig's rope_theta */
    if (!rc) rc = number(cmd, root, "", "attn_logit_softcapping", 1e-6, 1e30, 0, &c->softcap);
    if (!rc) rc = number(cmd, root, "", "query_pre_attn_scalar", 1e-30, 1e30, 0, &pre);
    if (!rc) rc = number(cmd, root, "", "attention_multiplier", 1e-30, 1e30, 0, &c->scale);
    /* Granite's attention scales q.k by attention_multiplier alone, whose config classes' default is 1.0:
     * absent, the scores are unscaled (before: 1/sqrt(head_dim), silently) */
    static const char *const granite[] = {"granite", "granitemoe", "granitemoeshared", "granitemoehybrid", NULL};
    if (!rc && type_in(type, granite) && !json_is_number(json_object_get(root, "attention_multiplier"))) c->scale = 1.0;
    if (pre) c->scale = 1.0 / sqrt(pre);
    if (!rc) rc = window(c, cmd, root, type, ck->prefix, typed ? NULL : &theta);
    if (!rc) rc = number(cmd, root, "", "clip_qkv", 1e-30, 1e30, 0, &c->clip_qkv); /* OLMo 1 */
    if (!rc) rc = attn_config(c, cmd, root, type, &kv, &theta); /* DBRX, MPT: attn_config.clip_qkv too */
    if (!rc) rc = nope(c, cmd, root, type, ck->prefix);
    if (!rc && type_in(type, llama4)) rc = llama4_layer(c, cmd, root, layer_index(ck->prefix));
    /* Llama 3.2 Vision (mllama_text_model): the layers of cross_attention_layers (MllamaTextConfig's default
     * 3, 8, ..., 38) are MllamaTextCrossAttention: k and v from the vision states (--kv-input), q_norm /
     * k_norm, and no rotary (before: rotated as the self-attention layers, silently) */
    if (!rc && type && strcmp(type, "mllama_text_model") == 0) {
        json_t *x = json_object_get(root, "cross_attention_layers");
        const long long n = layer_index(ck->prefix);
        int cross = 0;
        for (size_t i = 0; json_is_array(x) && i < json_array_size(x); i++)
            cross |= json_is_integer(json_array_get(x, i)) && json_integer_value(json_array_get(x, i)) == n;
        if (!json_is_array(x)) cross = n >= 3 && n <= 38 && (n - 3) % 5 == 0;
        if (cross || (n < 0 && (!json_is_array(x) || json_array_size(x)))) c->no_rope = n < 0 ? -1 : 1;
    }
    if (!rc && type && strcmp(type, "cohere2") == 0) { /* without either key, Cohere2Config's pattern 4 */
        /* NoPE on the global layers (-1: they differ and the prefix names no layer) */
        const int s = slides(root, type, layer_index(ck->prefix));
        c->no_rope = s < 0 ? -1 : !s;
    }
    /* EXAONE 4: with a sliding_window, only the sliding layers rotate (global NoPE, Exaone4Attention) */
    if (!rc && type && strcmp(type, "exaone4") == 0 && json_is_number(json_object_get(root, "sliding_window"))) {
        const int s = slides(root, type, layer_index(ck->prefix));
        c->no_rope = s < 0 ? -1 : !s;
    }
    json_t *pe = json_object_get(root, "position_embedding_type"); /* Granite 4's "nope": no rotary at all */
    if (!rc && json_is_string(pe) && strcmp(json_string_value(pe), "nope") == 0) c->no_rope = 1;
    /* GraniteMoeHybridModel builds its rotary only for position_embedding_type "rope"; null or absent (the
     * config class's default None) is NoPE, though rope_theta is written (before: rotated, silently) */
    if (!rc && type && strcmp(type, "granitemoehybrid") == 0 &&
        !(json_is_string(pe) && strcmp(json_string_value(pe), "rope") == 0))
        c->no_rope = 1;
    /* Nemotron-H (NemotronHAttention) and Jamba (JambaAttention, which it extends): GQA without
     * positional embeddings, their Mamba layers order the tokens; a rope_theta in config.json rotates
     * nothing (before: rotary applied, 1.7 off) */
    static const char *const nope_types[] = {"nemotron_h", "jamba", NULL};
    if (!rc && type_in(type, nope_types)) c->no_rope = 1;
    double key_mult = 0; /* Falcon-H1 multiplies k by it: the scores, RoPE being linear */
    if (!rc && type && strcmp(type, "falcon_h1") == 0)
        rc = number(cmd, root, "", "key_multiplier", 1e-30, 1e30, 0, &key_mult);
    const int jais = type && strcmp(type, "jais") == 0;
    const int jais_by_d = jais && json_is_true(json_object_get(root, "mup_scale_qk_dot_by_d"));
    if (jais && json_is_false(json_object_get(root, "scale_attn_weights"))) c->scale = 1.0; /* q.k unscaled */
    json_decref(top);
    if (rc) return rc;
    c->heads = (long long)heads, c->kv_heads = (long long)kv, c->hidden = (long long)hidden;
    c->head_dim = hd ? (long long)hd : heads && hidden ? (long long)(hidden / heads) : 0;
    c->head_dim_derived = hd_default ? 2 : !hd && c->head_dim;
    c->rope_theta = theta;
    if (jais_by_d && c->head_dim && c->scale != 1.0) c->scale = 1.0 / (double)c->head_dim; /* Jais (muP): q.k / d */
    if (key_mult && c->head_dim) c->scale = (c->scale ? c->scale : 1.0 / sqrt((double)c->head_dim)) * key_mult;
    if (ling_dims && !part && c->head_dim) part = ling_dims / (double)c->head_dim;
    if (part && part < 1) {
        const double r = part * (double)c->head_dim;
        if (!c->head_dim || r != floor(r) || (long long)r % 2 || r < 2)
            return mha_cmd_error(cmd, MHA_EXIT_RUNTIME, "config.json: %s %g of head_dim %lld gives %g rotated dims; "
                                 "expected an even whole number >= 2", glm ? "model_type chatglm's rotary share" :
                                 "partial_rotary_factor", part, c->head_dim, r);
        c->rope_dim = (long long)r;
    }
    c->found = 1;
    return 0;
}

const char *cli_hf_config_layout(const cli_ckpt *ck, const char *path) {
    char resolved[4096], file[4096];
    if (!path || mha_checkpoint_resolve(resolved, sizeof resolved, path)) return NULL;
    const char *slash = strrchr(resolved, '/');
    const int dir = slash ? (int)(slash - resolved + 1) : 0;
    if (snprintf(file, sizeof file, "%.*sconfig.json", dir, resolved) >= (int)sizeof file || access(file, F_OK) != 0 ||
        !is_hf(ck, resolved))
        return NULL;
    json_t *top = json_load_file(file, 0, NULL), *root = json_is_object(top) ? sub_config(top, ck->prefix) : NULL;
    const char *l = root ? family_layout_name(root, json_string_value(json_object_get(root, "model_type"))) : NULL;
    json_decref(top);
    return l; /* a static string */
}

int cli_hf_config_check(const cli_hf_config *hc, const char *cmd, const mha_config *c) {
    if (!hc->found) return 0;
    if (hc->hidden && hc->hidden != c->d_model)
        return mha_cmd_error(cmd, MHA_EXIT_RUNTIME, "config.json: hidden_size %lld; expected the checkpoint's "
                             "d_model = %d (is it the config of another model?)", hc->hidden, c->d_model);
    if (hc->head_dim && hc->head_dim != c->d_k)
        return mha_cmd_error(cmd, MHA_EXIT_RUNTIME, "config.json: %s %lld; expected the checkpoint's d_k = %d (is it "
                             "the config of another model?)",
                             hc->head_dim_derived == 2 ? "head_dim (absent: Gemma's default)" :
                             hc->head_dim_derived ? "hidden_size / num_attention_heads" : "head_dim", hc->head_dim,
                             c->d_k);
    return 0;
}
