/* run_variants.h — `mha run` flags for today's attention variants: RoPE,
 * positions, ALiBi, soft-capping, sinks, QK-norm, clip_qkv and Llama 4's query
 * temperature on top of what the
 * checkpoint's metadata already declares (docs/VARIANTS.md). */
#ifndef MHA_TOOLS_RUN_VARIANTS_H
#define MHA_TOOLS_RUN_VARIANTS_H

#include "io_cli.h"

typedef struct {
    const char *rope, *positions, *sinks, *qk_norm, *rope_scale, *temperature;
    double rope_theta, softcap, scale, clip_qkv;
    long long rope_dim, window, sink_tokens, chunk;
    int alibi;
    int *pos; /* (B,T) read from --positions, owned */
    /* a layer split by heads (mha-mpi --split heads): the shard's first
       global head and the whole layer's h, whose default ALiBi slopes the
       shard's heads take; 0 0: the whole layer */
    int shard_first, shard_of_heads;
} cli_variant_flags;

/* Flags that make the layer (kept by a native file); `mha permute` takes these. */
#define CLI_LAYER_VARIANT_ARGS(vf)                                                                  \
    {.name = "--rope", .kind = MHA_ARG_STRING, .dest = &(vf).rope, .metavar = "PAIRING",            \
     .help = "rotary embedding of q and k: halves (HF Llama, GPT-NeoX) or interleaved (GPT-J)",     \
     .choices = "halves|interleaved"},                                                              \
    {.name = "--rope-theta", .kind = MHA_ARG_DOUBLE, .dest = &(vf).rope_theta, .metavar = "THETA",  \
     .help = "rotary base (default 10000)", .dmin = 1, .dmax = 1e12},                               \
    {.name = "--rope-dim", .kind = MHA_ARG_INT, .dest = &(vf).rope_dim, .metavar = "R",             \
     .help = "rotated dims per head, even, <= d_k (default d_k)", .min = 2, .max = 65536},          \
    {.name = "--rope-scale", .kind = MHA_ARG_STRING, .dest = &(vf).rope_scale, .metavar = "SCALING", \
     .help = "position scaling as checkpoints declare it (rope_scaling of config.json): F or "      \
             "linear:factor=F (positions / F); llama3:factor=F,low_freq_factor=L,high_freq_factor=H," \
             "original_max_position_embeddings=N; yarn:factor=F,original_max_position_embeddings=N" \
             "[,beta_fast=B,beta_slow=B,attention_factor=A]; dynamic:factor=F,"                      \
             "original_max_position_embeddings=N (NTK, N = max_position_embeddings); longrope:"     \
             "short_factor=A:B:...,long_factor=A:B:...,original_max_position_embeddings=N"          \
             "[,factor=F,attention_factor=A] (Phi-3)"},                                             \
    {.name = "--alibi", .kind = MHA_ARG_SWITCH, .dest = &(vf).alibi,                                \
     .help = "ALiBi biases with the paper's slopes (or the checkpoint's alibi_slopes)"},            \
    {.name = "--softcap", .kind = MHA_ARG_DOUBLE, .dest = &(vf).softcap, .metavar = "C",            \
     .help = "soft-cap the scores: C tanh(s / C) (Gemma 2)", .dmin = 1e-6, .dmax = 1e30},           \
    {.name = "--clip-qkv", .kind = MHA_ARG_DOUBLE, .dest = &(vf).clip_qkv, .metavar = "C",          \
     .help = "clamp Q, K and V to [-C, C] after the projections (OLMo 1, DBRX, MPT: clip_qkv)",     \
     .dmin = 1e-30, .dmax = 1e30},                                                                  \
    {.name = "--attn-temperature", .kind = MHA_ARG_STRING, .dest = &(vf).temperature,              \
     .metavar = "FLOOR,SCALE[,RULE]", .help = "scale the query at position p by 1 + SCALE ln(1 + "  \
     "floor((p + 1) / FLOOR)) (Llama 4's attn_temperature_tuning: floor_scale, attn_scale); RULE "  \
     "ministral3: floor(p / FLOOR) (Ministral 3's llama_4_scaling_beta)"},                          \
    {.name = "--sinks", .kind = MHA_ARG_STRING, .dest = &(vf).sinks, .metavar = "NAME",             \
     .help = "tensor of the checkpoint holding (h) sink logits (gpt-oss)"},                         \
    {.name = "--qk-norm", .kind = MHA_ARG_STRING, .dest = &(vf).qk_norm, .metavar = "KIND",         \
     .help = "normalize each head's q and k (weights q_norm[.weight], k_norm[.weight] of the "      \
             "checkpoint)", .choices = "rms|layer"}

/* Flags of one forward pass. */
#define CLI_FWD_VARIANT_ARGS(vf)                                                                    \
    {.name = "--positions", .kind = MHA_ARG_STRING, .dest = &(vf).positions, .metavar = "P.npy",    \
     .help = "position of each query token, (B, T), or (T,) / (1, T) for every sequence; integers " \
             "(int32/int64, or whole numbers as float32), 0..2^30 (RoPE, ALiBi)"},                  \
    {.name = "--window", .kind = MHA_ARG_INT, .dest = &(vf).window, .metavar = "W",                 \
     .help = "each query attends the last W key positions up to its own (window_left = W - 1)",     \
     .min = 1, .max = 1 << 30},                                                                     \
    {.name = "--chunk", .kind = MHA_ARG_INT, .dest = &(vf).chunk, .metavar = "C",                   \
     .help = "chunked attention (Llama 4's attention_chunk_size): query and key only inside one "  \
             "chunk of C positions", .min = 1, .max = 1 << 30},                                      \
    {.name = "--sink-tokens", .kind = MHA_ARG_INT, .dest = &(vf).sink_tokens, .metavar = "N",       \
     .help = "with --window: the first N keys are attended as well (StreamingLLM)", .min = 1,       \
     .max = 1 << 30},                                                                               \
    {.name = "--scale", .kind = MHA_ARG_DOUBLE, .dest = &(vf).scale, .metavar = "S",                \
     .help = "the scores' scale, q.k * S (default 1/sqrt(d_k); Gemma 2: query_pre_attn_scalar^-1/2)", \
     .dmin = 1e-30, .dmax = 1e30}

#define CLI_VARIANT_ARGS(vf) CLI_LAYER_VARIANT_ARGS(vf), CLI_FWD_VARIANT_ARGS(vf)

/* Rebuilds *L with the flags' variants (the checkpoint ck for --sinks
 * and the norm weights; for an hf checkpoint, the rotary settings, the
 * soft-cap and the scale of the config.json beside it where no flag gives
 * them), reads --positions and sets --window, --chunk, --sink-tokens and --scale
 * in f->opt. Returns an exit code, errors named as `mha cmd`; *L is
 * unchanged on failure. */
int cli_apply_variants(const char *cmd, mha_layer **L, cli_fwd *f, cli_variant_flags *vf, const cli_ckpt *ck);
void cli_variants_free(cli_variant_flags *vf);

#endif /* MHA_TOOLS_RUN_VARIANTS_H */
