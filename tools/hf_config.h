/* hf_config.h — the config.json Hugging Face stores beside model.safetensors:
 * head counts, the rotary settings (rope_theta, rope_scaling,
 * partial_rotary_factor, head_dim), the soft-cap, the score scale, the
 * layer's sliding window and what model_type implies, as defaults of an
 * `hf` or `megatron` checkpoint's flags (docs/VARIANTS.md). Unknown keys
 * are ignored. */
#ifndef MHA_TOOLS_HF_CONFIG_H
#define MHA_TOOLS_HF_CONFIG_H

#include "io_cli.h"

typedef struct {
    int found;                 /* a config.json beside an hf checkpoint was read   */
    long long heads, kv_heads; /* num_attention_heads, num_key_value_heads; 0 = absent */
    long long head_dim;        /* head_dim, else hidden_size / heads; 0 = unknown  */
    long long hidden;          /* hidden_size; 0 = absent                          */
    int head_dim_derived;      /* head_dim is hidden_size / heads (no head_dim key);
                                  2: the family's default (Gemma 2 / 3: 256)      */
    double rope_theta;         /* rope_theta (rotary_emb_base); 0 = absent         */
    long long rope_dim;        /* partial_rotary_factor (rotary_pct) x head_dim; 0 = whole */
    char rope_scale[8192];     /* rope_scaling as a --rope-scale spec; "" = none
                                  (LongRoPE's two lists of up to 128 factors)     */
    double softcap;            /* attn_logit_softcapping (Gemma 2); 0 = absent     */
    double scale;              /* query_pre_attn_scalar^-1/2 (Gemma 2, 3), or
                                  attention_multiplier (Granite); 0 = 1/sqrt(d_k) */
    const char *rope;          /* "halves" or "interleaved" when model_type names a
                                  rotary family (GPT-J: interleaved) even without
                                  rope_theta; NULL = as rope_theta says          */
    int alibi;                 /* model_type bloom, or falcon with "alibi": true   */
    double qk_norm_eps;        /* rms_norm_eps: the eps of the q/k RMSNorm (Cohere,
                                  StableLM: layer_norm_eps of their LayerNorm); 0 = absent */
    int qk_norm_offset;        /* Gemma 3: its RMSNorm scales by (1 + weight)      */
    int output_gate;           /* Qwen3-Next (attn_output_gate): q_proj holds each
                                  head's query then its gate (a gated layer)      */
    int qk_norm_layer;         /* Cohere's use_qk_norm: the checkpoint must hold its
                                  (h, d_k) q/k norms (a LayerNorm of each head,
                                  eps layer_norm_eps, as the loader reads them)   */
    int qk_norm_rms;           /* Ling's use_qk_norm: the checkpoint must hold its
                                  query_layernorm / key_layernorm (d_k), an RMSNorm
                                  of each head before the rotary, as the loader
                                  reads them                                      */
    int qk_norm_after_rope;    /* Hunyuan: a q/k norm the checkpoint holds is applied
                                  after the rotary (refused when loaded)          */
    int sinks;                 /* gpt_oss: the module's "sinks" tensor, when it has
                                  one, holds the (h) sink logits (as --sinks sinks) */
    long long window;          /* sliding_window when this layer slides (layer_types,
                                  sliding_window_pattern, the family's rule); 0 =
                                  global; -1 = the layers differ and --prefix
                                  names none                                      */
    int no_rope;               /* no_rope_layers[n] = 0 (SmolLM 3, Llama 4): this
                                  layer has no rotary, whatever rope_theta says; -1 =
                                  the layers differ and --prefix names none       */
    int position_unknown;      /* Baichuan: 7B rotates, 13B uses ALiBi, and config.json
                                  does not say which: run asks for --rope or --alibi */
    double clip_qkv;           /* clip_qkv (OLMo 1; DBRX, MPT: attn_config's) = --clip-qkv; 0 = null */
    /* Llama 4 (model_type llama4, llama4_text) on the layer --prefix names: */
    long long chunk;           /* attention_chunk_size on a chunked_attention layer
                                  (= --chunk); 0 = none; -1 = the layers differ and
                                  --prefix names none                             */
    int qk_l2_norm;            /* use_qk_norm on a rotary layer: q and k divided by
                                  their RMS (no weight, eps rms_norm_eps)         */
    double temperature_floor;  /* attn_temperature_tuning on a NoPE layer: its
                                  floor_scale (the query temperature's floor,
                                  = --attn-temperature); 0 = none                 */
    double temperature_scale;  /* ... and its attn_scale                          */
    int temperature_rule;      /* 1: Ministral 3's llama_4_scaling_beta (its floor
                                  original_max_position_embeddings, floor(p / F)) */
    const char *layout;        /* the layout model_type implies where the names would
                                  be read as another's rows: "hf" (Qwen 1's c_attn,
                                  ChatGLM's multi-query query_key_value), "megatron"
                                  (ChatGLM without it), "codegen"; NULL = as detected */
    long long long_context;    /* Qwen 1: seq_length, past which its dynamic NTK and
                                  logn query scaling act (not implemented); 0 = none */
} cli_hf_config;

/* Reads config.json from the directory of path (ck->weights when NULL)
 * when the checkpoint is in the hf, megatron or codegen layout (--layout, or
 * auto detected: GPT-NeoX and Falcon keep query_key_value; a gpt2 one for
 * Jais and Qwen 1, and CodeGen's, whose names fit no layout, by model_type).
 * c->found = 0 when there is none or the layout is another. Returns an exit
 * code after printing "mha <cmd>: config.json: KEY ...; expected ..." for
 * malformed JSON or a value of the wrong type or range. */
int cli_hf_config_read(cli_hf_config *c, const char *cmd, const cli_ckpt *ck, const char *path);

/* The layout config.json's model_type names for the checkpoint at path
 * (c->layout of cli_hf_config_read, without its checks or messages: Qwen 1,
 * ChatGLM, CodeGen), or NULL. cli_load_options applies it, so that every
 * loader of a command (mha-mpi's head shards too) reads their rows. */
const char *cli_hf_config_layout(const cli_ckpt *ck, const char *path);

/* 0 when the config read agrees with the loaded layer c (hidden_size =
 * d_model, head_dim = d_k), else an exit code after printing which key
 * contradicts the checkpoint: the file belongs to another model. */
int cli_hf_config_check(const cli_hf_config *hc, const char *cmd, const mha_config *c);

#endif /* MHA_TOOLS_HF_CONFIG_H */
