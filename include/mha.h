/* mha.h — the whole public API of libmha, a multi-head attention layer.
 *
 * Legend (used in every shape comment):
 *   B batch, T query tokens, S key/value tokens, h query heads,
 *   h_kv key/value heads (h for MHA, 1 for MQA, a divisor of h for GQA),
 *   d_k query/key width per head, d_v value width per head,
 *   d_model model width, d_kv_in width of the key/value source, d_v_in
 *   width of the value source when it differs from the key source.
 *
 * Row-vector convention; every weight is stored row-major as (in, out):
 *   Q = X   W_Q + b_Q     W_Q (d_model, h*d_k)     column block r -> query head r
 *   K = Xkv W_K + b_K     W_K (d_kv_in, h_kv*d_k)  column block g -> kv head g
 *   V = Xv  W_V + b_V     W_V (d_v_in, h_kv*d_v)   (Xv = Xkv unless given apart)
 *   Z^(r) = softmax(scale * Q^(r) K^(g)^T + mask) V^(g),   g = r / (h / h_kv)
 *   Z = Concat(Z^(0..h-1))   (B,T,h*d_v), head r at columns [r*d_v, (r+1)*d_v)
 *   Y = Z W_O + b_O       W_O (h*d_v, d_model)     row block r <- head r
 *
 * The head-order contract: column block r of W_Q and row block r of W_O
 * belong to the same head. Each block carries a label (its head id in the
 * original checkpoint); labels travel with permutations and
 * mha_layer_check_contract() verifies them.
 *
 * Errors: every function returning mha_status returns MHA_OK (0) or a
 * negative code; mha_last_error() then holds a message (per thread) naming
 * what was wrong and what was expected. The library never prints or exits.
 *
 * Thread safety (tested in tests/test_concurrency.c, under ThreadSanitizer):
 * - May run concurrently on one layer: mha_forward, mha_forward_kv,
 *   mha_forward_ctx, mha_layer_check_contract*, mha_forward_cached* (each
 *   on its own cache), and the read-only getters (mha_layer_config,
 *   mha_layer_get_weights, mha_layer_labels, mha_layer_to_tensors,
 *   mha_layer_save). Results are the bits one thread gets doing the calls
 *   in turn. A layer keeps scratch memory for its forwards (a few blocks
 *   behind a lock, at most 256 MiB in all), released by mha_layer_free.
 * - Need exclusive access to the layer (no call on it may be running):
 *   mha_layer_set_weights, mha_layer_set_labels, mha_layer_permute_heads,
 *   mha_layer_permute_block, mha_layer_convert_weights, mha_layer_free.
 *   Each of these but mha_layer_free fails with MHA_E_ARG ("another call
 *   is using this layer") while a forward, backward, contract check,
 *   cached forward or mha_layer_labels runs on the layer, and those fail
 *   ("another call is changing this layer") while a change runs; nothing
 *   is done. The getters without a status (mha_layer_get_weights, _config,
 *   _to_tensors, _save) are not checked, nor is mha_layer_free.
 * - A cache is used by one call at a time: mha_forward_cached*,
 *   mha_cache_append, mha_cache_reset, mha_cache_truncate, mha_cache_compact,
 *   mha_cache_permute_heads, mha_cache_reorder, mha_cache_set_memory,
 *   mha_cache_set_sink_tokens and mha_cache_free mutate it;
 *   mha_cache_attend, mha_cache_length, mha_cache_bytes, mha_cache_get_info,
 *   mha_cache_save and mha_cache_clone
 *   only read it and may run concurrently with each other. A call that
 *   breaks this (a mutating call while another call is on the cache, or a
 *   reader while one mutates it) fails with MHA_E_ARG ("another call is
 *   changing this cache") and does nothing, all but mha_cache_free,
 *   mha_cache_length and mha_cache_bytes, which cannot report it.
 * - Process-wide settings are atomics read once at a call's start
 *   (mha_set_num_threads) or per call (MHA_KERNELS: do not setenv while
 *   other threads run); an mha_context (below) chooses per call instead.
 *
 * Numbers: the fast path and the cached forward compute in fp32. A call
 * whose scaled scores may exceed MHA_FAST_SCORE_LIMIT = 131072 in magnitude
 * (bounded by |scale| |q| |k|, L2 norms; with ALiBi also each row's
 * largest score, which a query far from every key it may attend pushes
 * far below zero), whose V is too large to sum, whose query against an
 * int8 K exceeds FLT_MAX / (254 sqrt(min(d_k, 32))) in norm (the int8
 * kernels sum q times codes before a block's scale), or
 * whose output overflows fp32 is never answered with a silently wrong
 * number: MHA_PATH_AUTO recomputes it with the reference (double),
 * MHA_PATH_FAST, mha_forward_cached and mha_cache_attend return MHA_E_NONFINITE naming the
 * batch, head and row (the cached forward before appending anything,
 * except for an overflowing output). Additive masks are added in fp32 as
 * PyTorch adds them: a row whose every allowed key carries a large finite
 * term (-1e9; Hugging Face's finfo.min) gets fp32's result, near-uniform
 * weights as in torch, where the double reference keeps the scores'
 * differences; give such keys -inf or a false keep bit to mask them.
 */
#ifndef MHA_H
#define MHA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The library is built with hidden visibility: only the functions declared
 * here with MHA_API are exported from libmha.so. */
#if defined(__GNUC__)
#define MHA_API __attribute__((visibility("default")))
#else
#define MHA_API
#endif

/* ---------------------------------------------------------------- status */

typedef enum {
    MHA_OK = 0,
    MHA_E_ARG = -1,       /* NULL pointer or out-of-range argument */
    MHA_E_SHAPE = -2,     /* a dimension disagrees with the layer or another tensor */
    MHA_E_NOMEM = -3,     /* allocation failed */
    MHA_E_CONTRACT = -4,  /* head-order contract violated (labels or residual) */
    MHA_E_NONFINITE = -5, /* NaN or Inf where a finite number is required */
    MHA_E_IO = -6,        /* a file could not be opened, read or written */
    MHA_E_FORMAT = -7,    /* a file's contents are malformed */
    MHA_E_UNSUPPORTED = -8 /* valid request this build/path cannot serve */
} mha_status;

/* Short constant description of a status code ("shape mismatch", ...). */
MHA_API const char *mha_status_str(mha_status s);
/* Message of the last failing call on this thread ("" when none). */
MHA_API const char *mha_last_error(void);
/* sizeof(type) of a public struct as this library was built ("mha_options",
 * "mha_config", "mha_gradients", ... by its type name), 0 for a name it does
 * not know: a binding that declares the structs itself checks them against
 * the library it loaded (a library of another version may have grown one). */
MHA_API size_t mha_struct_size(const char *name);

/* ---------------------------------------------------------- configuration */

/* Today's attention variants (docs/VARIANTS.md gives each formula). With
 * them the scores of head r, query i (position p_i) and key j (p_j) are
 *   q_i = RoPE(norm_q(Q_i^(r)), p_i),  k_j = RoPE(norm_k(K_j^(g)), p_j)
 *   s_ij = scale q_i . k_j;  s_ij = cap tanh(s_ij / cap)   (softcap)
 *   s_ij += -slope_r |p_i - p_j|                          (ALiBi) + masks
 *   Z_i = sum_j exp(s_ij) V_j / (sum_j exp(s_ij) + exp(sink_r))  (sinks)
 * The per-head parameters (ALiBi slopes, sink logits, per-head norm
 * weights) are layer weights: they move with mha_layer_permute_heads and
 * carry labels (MHA_BLOCK_S; per-head q/k norms move with Q and K). */

typedef enum {
    MHA_ROPE_NONE = 0,       /* no rotary embedding                                */
    MHA_ROPE_HALVES = 1,     /* GPT-NeoX / HF Llama: dims i and i + dim/2 pair      */
    MHA_ROPE_INTERLEAVED = 2 /* GPT-J / Meta Llama: dims 2i and 2i+1 pair           */
} mha_rope_pairing;

typedef enum {
    MHA_ROPE_SCALE_NONE = 0,   /* inv_freq_i = theta^(-2i/dim)                       */
    MHA_ROPE_SCALE_LINEAR = 1, /* positions divided by factor                        */
    MHA_ROPE_SCALE_LLAMA3 = 2, /* Llama 3.1: low frequencies / factor, high kept,
                                  a linear blend between                            */
    MHA_ROPE_SCALE_YARN = 3,   /* YaRN: ramp between interpolation and extrapolation
                                  by wavelength, cos/sin times attn_factor          */
    MHA_ROPE_SCALE_DYNAMIC = 4, /* dynamic NTK: a call whose positions reach past
                                  original_max_positions L (seq = largest + 1)
                                  rotates with theta (factor seq/L - factor + 1)^(r/(r-2)) */
    MHA_ROPE_SCALE_LONGROPE = 5 /* LongRoPE (Phi-3 128k, Phi-3.5, Phi-4-mini):
                                  inv_freq_i = theta^(-2i/r) / ext_i, ext the
                                  long_factor when the call's positions reach
                                  past L, else short_factor; cos/sin times
                                  attn_factor in every call                      */
} mha_rope_scaling;

/* The most rotated pairs (rope.dim / 2) a LongRoPE layer may have. */
#define MHA_ROPE_MAX_PAIRS 128

/* Rotary position embedding of q and k (after QK-norm, before the scores).
 * Dynamic and LongRoPE scaling depend on the call, as in Hugging Face:
 * seq = 1 + the largest position among its queries and keys (options.
 * positions / key_positions, else 0..T-1 and 0..S-1; a cached call: its new
 * rows, whose positions continue the cache) picks the frequencies of every
 * row of that call, and the KV cache keeps keys rotated as their own call
 * rotated them. */
typedef struct {
    mha_rope_pairing pairing;
    int dim;                  /* rotated dims per head (partial rotary): even,
                                 <= d_k; 0 means d_k; the rest pass unchanged */
    double theta;             /* base; 0 means 10000                          */
    mha_rope_scaling scaling;
    double factor;            /* >= 1: linear, llama3, yarn, dynamic;
                                 longrope: the context's growth
                                 (max_position_embeddings / L; 0 means 1),
                                 only for attn_factor's default            */
    double low_freq_factor;   /* llama3; 0 means 1                            */
    double high_freq_factor;  /* llama3; 0 means 4 (> low_freq_factor)        */
    int original_max_positions; /* llama3, yarn, longrope: the pre-training
                                 context L; dynamic: the context beyond
                                 which it scales (max_position_embeddings) */
    double beta_fast;         /* yarn; 0 means 32                             */
    double beta_slow;         /* yarn; 0 means 1                              */
    double attn_factor;       /* yarn; 0 means 0.1 ln(factor) + 1;
                                 longrope: 0 means sqrt(1 + ln(factor) / ln(L))
                                 (1 when factor is 1)                      */
    float short_factor[MHA_ROPE_MAX_PAIRS]; /* longrope: ext_i of pairs i < dim/2
                                 when every position of the call is < L    */
    float long_factor[MHA_ROPE_MAX_PAIRS];  /* longrope: ext_i otherwise     */
} mha_rope;

typedef enum {
    MHA_QK_NORM_NONE = 0,
    MHA_QK_NORM_RMS = 1,  /* x / sqrt(mean(x^2) + eps) * w  (OLMo 2, Qwen 3, Gemma 3) */
    MHA_QK_NORM_LAYER = 2 /* (x - mean) / sqrt(var + eps) * w   (no bias)           */
} mha_qk_norm;

typedef enum {
    MHA_TEMPERATURE_LLAMA4 = 0,    /* floor((p + 1) / F): Llama 4's attn_temperature_tuning  */
    MHA_TEMPERATURE_MINISTRAL3 = 1 /* floor(p / F): Ministral 3's llama_4_scaling_beta       */
} mha_temperature_rule;

typedef struct {
    int d_model;       /* model width (input X and output Y)                 */
    int n_heads;       /* h                                                  */
    int n_kv_heads;    /* h_kv; 0 means h (MHA); must divide h               */
    int d_k;           /* per-head query/key width; 0 means d_model / h      */
    int d_v;           /* per-head value width; 0 means d_k                  */
    int d_kv_in;       /* key/value source width; 0 means d_model            */
    int bias;          /* 1: b_Q, b_K, b_V, b_O exist; 0: all are zero       */
    int add_bias_kv;   /* 1: a learned key/value row (bias_k, bias_v) is
                          appended after the S keys (PyTorch add_bias_kv)    */
    int add_zero_attn; /* 1: a zero key/value row is appended last
                          (PyTorch add_zero_attn)                            */
    int d_v_in;        /* value source width; 0 means d_kv_in (PyTorch vdim) */
    /* today's variants: all zero = the 2017 layer. None combines with
       add_bias_kv / add_zero_attn (MHA_E_ARG).                             */
    mha_rope rope;     /* rotary embedding of q and k                        */
    int alibi;         /* 1: ALiBi, slopes in weights.alibi_slopes (h)       */
    float softcap;     /* 0: none; > 0: scores -> softcap tanh(scores/softcap) */
    int sinks;         /* 1: a learned sink logit per head, weights.sinks (h) */
    mha_qk_norm qk_norm; /* normalization of each head's q and k             */
    int qk_norm_per_head; /* 0: q_norm, k_norm are (d_k), shared by the heads;
                             1: (h, d_k) and (h_kv, d_k), one row per head   */
    float qk_norm_eps; /* 0 means 1e-6                                       */
    int qk_norm_whole; /* 1: one norm over a token's whole q (h*d_k) and
                          whole k (h_kv*d_k), all heads together (OLMo 2),
                          with per-head weights (qk_norm_per_head = 1)  */
    float clip_qkv;    /* 0: none; > 0: every element of Q, K and V (after
                          the projections and their biases, before QK-norm
                          and RoPE) clamped to [-clip_qkv, clip_qkv] (OLMo 1,
                          DBRX, MPT); a KV cache stores the clamped K, V.
                          Negative, NaN or inf: MHA_E_ARG. Like the other
                          variants, not with add_bias_kv / add_zero_attn */
    /* Llama 4's attention temperature (attn_temperature_tuning, on its
       layers without RoPE): the query at position p is multiplied by
       1 + temperature_scale * ln(1 + floor((p + 1) / temperature_floor)),
       after QK-norm and RoPE (its scores grow with the context; keys and
       values untouched); with temperature_rule MHA_TEMPERATURE_MINISTRAL3
       floor(p / temperature_floor) instead (Ministral 3, every layer).
       Positions as RoPE's: options.positions, else 0..T-1; the cache's
       positions in a cached forward. temperature_floor 0: none (then
       temperature_scale 0 and the rule LLAMA4); else >= 1 (Llama 4: 8192,
       its floor_scale; Ministral 3: original_max_position_embeddings)
       with a finite temperature_scale > 0 (Llama 4: 0.1; Ministral 3:
       llama_4_scaling_beta). */
    int temperature_floor;
    float temperature_scale;
    mha_temperature_rule temperature_rule;
    /* 1: gated attention (Qwen3-Next, Qwen 3.5: "attn_output_gate"): each
       head's output is multiplied, element by element, by sigmoid(x W_G +
       b_G) before W_O reads it — Z'^(r) = Z^(r) * sigmoid(G^(r)), G = x W_G
       + b_G (h*d_v) from the query's input, W_G in weights.w_g; the
       interventions, captures and contributions see Z'. Self-attention
       forwards, the KV cache and training (the backward and the tape:
       grad.dw_g, db_g), bf16 / int8 weights (W_G stored like
       W_Q), mha-mpi (heads, sequence, decode) and
       mha_layer_load_heads; options.bf16_matmul refuses it
       (MHA_E_UNSUPPORTED). 0: none. */
    int output_gate;
} mha_config;

/* A config for d_model and h with every other field at its default. */
MHA_API mha_config mha_config_default(int d_model, int n_heads);
/* Fills the defaults (0 fields) into *out and validates; out may equal in. */
MHA_API mha_status mha_config_resolve(mha_config *out, const mha_config *in);

/* --------------------------------------------------------------- weights */

/* Borrowed pointers, row-major (in, out). Biases must be NULL when
 * config.bias == 0 and given when it is 1; likewise bias_k/bias_v with
 * add_bias_kv (a mismatch is MHA_E_ARG, so a forgotten flag is caught). */
typedef struct {
    const float *w_q;    /* (d_model, h*d_k)       */
    const float *w_k;    /* (d_kv_in, h_kv*d_k)    */
    const float *w_v;    /* (d_v_in, h_kv*d_v)     */
    const float *w_o;    /* (h*d_v, d_model)       */
    const float *b_q;    /* (h*d_k)                */
    const float *b_k;    /* (h_kv*d_k)             */
    const float *b_v;    /* (h_kv*d_v)             */
    const float *b_o;    /* (d_model)              */
    const float *bias_k; /* (h_kv*d_k) extra key row, add_bias_kv only   */
    const float *bias_v; /* (h_kv*d_v) extra value row, add_bias_kv only */
    const float *alibi_slopes; /* (h), config.alibi only; NULL: the paper's
                                  default, 2^(-8(r+1)/n) for n = h a power of
                                  two, else those of the next power 2n
                                  interleaved (as BLOOM, MPT)            */
    const float *sinks;  /* (h) sink logits, config.sinks only             */
    const float *q_norm; /* (d_k) or (h, d_k) per head, config.qk_norm only */
    const float *k_norm; /* (d_k) or (h_kv, d_k) per head                  */
    const float *w_g;    /* (d_model, h*d_v) output gate, config.output_gate only */
    const float *b_g;    /* (h*d_v), output_gate with bias only              */
} mha_weights;

/* slopes (n_heads) = the paper's ALiBi slopes for a layer of n_heads
 * heads, the default of weights.alibi_slopes. A layer split by heads
 * (a shard of heads first..first+n-1) takes slopes + first of the whole
 * layer's, not those of an n-head layer. MHA_E_ARG for NULL or n_heads < 1. */
MHA_API mha_status mha_alibi_slopes(float *slopes, int n_heads);

typedef struct mha_layer mha_layer;

/* Creates a layer and copies the weights; w == NULL gives all-zero weights.
 * Head labels start as 0..h-1 (Q, O) and 0..h_kv-1 (K, V).
 * Weights must be finite (MHA_E_NONFINITE names the tensor and index). */
MHA_API mha_status mha_layer_create(mha_layer **out, const mha_config *cfg, const mha_weights *w);
MHA_API void mha_layer_free(mha_layer *layer);
/* Replaces all weights (copied); same rules as create. */
MHA_API mha_status mha_layer_set_weights(mha_layer *layer, const mha_weights *w);
/* Read-only view of the layer's weights; valid until the layer changes. */
MHA_API void mha_layer_get_weights(const mha_layer *layer, mha_weights *view);
/* The resolved configuration. */
MHA_API const mha_config *mha_layer_config(const mha_layer *layer);

/* ------------------------------------------- projection weight storage */

/* How W_Q, W_K, W_V and W_O are stored (biases, norms and the other
 * per-head tensors stay fp32). Arithmetic is fp32 in every case: the
 * stored values are widened, and the layer behaves exactly as an fp32
 * layer whose projection weights are the dequantized values.
 *   BF16: each weight rounded to bfloat16, to nearest, ties to even.
 *   I8:   symmetric int8 with one fp32 scale per output column j and
 *         group g of 32 consecutive inputs (rows) of each matrix (K, N):
 *         scale[g][j] = max over the group of |w[k][j]| / 127, q =
 *         round(w / scale) half away from zero in [-127, 127], the value
 *         (float)q * scale[g][j]; an all-zero group has scale 0, q = 0.
 *         Groups run along d_model for W_Q, W_K, W_V (and a gated
 *         layer's W_G) and restart at each
 *         head's d_v rows of W_O (so they move with the heads); a
 *         segment's last group may be shorter.
 * A weight the type cannot hold is MHA_E_ARG: bf16 |w| >= 0x1.ffp127
 * (rounds to infinity), int8 |w| = FLT_MAX (127 * (FLT_MAX / 127) rounds
 * to infinity). */
typedef enum {
    MHA_W_F32 = 0,  /* the default: fp32, unchanged                      */
    MHA_W_BF16 = 1, /* 2 bytes a weight                                  */
    MHA_W_I8 = 2    /* 1 byte a weight + 4 bytes per 32 weights          */
} mha_weight_dtype;

/* Converts the layer's projection weights to dtype, in place: they keep
 * their dtype through mha_layer_set_weights (new weights are converted),
 * permutations, save and load. Converting rounds the current values, so
 * BF16 -> I8 quantizes the bf16 values, and MHA_W_F32 keeps the rounded
 * values in fp32 (a conversion cannot be undone). mha_layer_get_weights
 * then shows the dequantized values. On error (unknown dtype: MHA_E_ARG;
 * no memory) the layer is as it was. */
MHA_API mha_status mha_layer_convert_weights(mha_layer *layer, mha_weight_dtype dtype);
/* The storage of the layer's projection weights (MHA_W_F32 for NULL). */
MHA_API mha_weight_dtype mha_layer_weights_dtype(const mha_layer *layer);
/* "f32", "bf16" or "int8"; and back (MHA_E_ARG naming the known names). */
MHA_API const char *mha_weight_dtype_name(mha_weight_dtype dtype);
MHA_API mha_status mha_weight_dtype_parse(mha_weight_dtype *out, const char *name);

/* ------------------------------------------------ head labels, permutation */

typedef enum {
    MHA_BLOCK_Q = 0, /* column blocks of W_Q and b_Q: h labels            */
    MHA_BLOCK_K = 1, /* column blocks of W_K, b_K, bias_k: h_kv labels    */
    MHA_BLOCK_V = 2, /* column blocks of W_V, b_V, bias_v: h_kv labels    */
    MHA_BLOCK_O = 3, /* row blocks of W_O: h labels                       */
    MHA_BLOCK_S = 4  /* score parameters of each head (ALiBi slope, sink
                        logit): h labels, equal to Q's when consistent    */
} mha_block;

/* Copies the labels of one block kind into labels (h or h_kv ints). */
MHA_API mha_status mha_layer_labels(const mha_layer *layer, mha_block block, int *labels);
/* Sets the labels of one block kind (e.g. from checkpoint metadata); the
 * labels must be a permutation of 0..n-1 (n = h or h_kv). */
MHA_API mha_status mha_layer_set_labels(mha_layer *layer, mha_block block, const int *labels);

/* Consistent permutation: new head i is old head perm[i] (perm has h
 * entries, a permutation of 0..h-1). Moves W_Q/W_K/W_V column blocks, their
 * biases, W_O row blocks and all labels together, so Y is unchanged.
 * Under GQA, the heads of each new kv group must come from one old kv group;
 * the kv heads then move by the induced permutation. Others: MHA_E_ARG.
 * All or nothing: out of memory (MHA_E_NOMEM; it needs one row of scratch
 * and room to repack the weights beside the old packing) leaves the layer
 * exactly as it was, weights, labels and outputs. */
MHA_API mha_status mha_layer_permute_heads(mha_layer *layer, const int *perm);
/* One-sided permutation of a single block kind (h or h_kv entries): the
 * mistake a broken checkpoint conversion makes. Y changes and the contract
 * check reports the disagreeing labels. All or nothing, as above. */
MHA_API mha_status mha_layer_permute_block(mha_layer *layer, mha_block block, const int *perm);

/* --------------------------------------------------------- forward options */

typedef enum {
    MHA_ALIGN_TOP_LEFT = 0,    /* query i sits at key position i           */
    MHA_ALIGN_BOTTOM_RIGHT = 1 /* query i sits at key position i + S - T   */
} mha_align;

typedef enum {
    MHA_MASKED_ROW_ZERO = 0, /* a query that may attend to no key gets Z = 0 */
    MHA_MASKED_ROW_NAN = 1   /* ... gets NaN, as PyTorch's softmax does; with
                                config.sinks Z = 0 in both modes (the sink
                                takes all the weight: PyTorch's softmax over
                                the scores and the sink logit, as gpt-oss) */
} mha_masked_row;

typedef enum {
    MHA_HEAD_KEEP = 0,   /* Z^(r) unchanged                                  */
    MHA_HEAD_ZERO = 1,   /* Z^(r) = 0: Y loses exactly head r's contribution */
    MHA_HEAD_SCALE = 2,  /* Z^(r) *= scale                                   */
    MHA_HEAD_MEAN = 3,   /* Z^(r) = its mean over batch and positions        */
    MHA_HEAD_REPLACE = 4 /* Z^(r) = value, (B,T,d_v)                         */
} mha_head_op;

typedef struct {
    mha_head_op op;
    float scale;        /* MHA_HEAD_SCALE */
    const float *value; /* MHA_HEAD_REPLACE: (B,T,d_v) */
} mha_intervention;

/* A (batch, heads, T, S) mask, contiguous, broadcast over batch when
 * batch == 1 and over heads when heads == 1. data == NULL: no mask. */
typedef struct {
    const void *data; /* uint8_t (keep mask) or float (additive mask) */
    int batch;        /* 1 or B */
    int heads;        /* 1 or h */
} mha_mask;

typedef enum {
    MHA_PATH_AUTO = 0,      /* fast path where available; MHA_KERNELS=reference
                               in the environment forces the reference      */
    MHA_PATH_REFERENCE = 1, /* the double-accumulating oracle                */
    MHA_PATH_FAST = 2       /* the optimized path                            */
} mha_path;

/* Options of one forward pass. Start from mha_options_default(). The
 * masks combine: a key is attended when every mask allows it. The extra
 * add_bias_kv / add_zero_attn keys are never masked (as in PyTorch). */
typedef struct {
    float scale;            /* 0: 1/sqrt(d_k)                                */
    int causal;             /* 1: key j allowed only when j <= aligned i     */
    mha_align align;        /* alignment of causal and window when S != T    */
    int window_left;        /* <0: unbounded; else keys j >= aligned i - left */
    int window_right;       /* <0: unbounded; else keys j <= aligned i + right */
    mha_mask keep_mask;     /* uint8 (B|1,h|1,T,S): nonzero = may attend      */
    mha_mask additive_mask; /* float (B|1,h|1,T,S): added to scaled scores;
                               -INFINITY forbids; NaN is rejected            */
    const uint8_t *key_keep;  /* (B,S) nonzero = real key (padding mask)     */
    const float *key_additive;/* (B,S) added to the scores of key j; with
                                 additive_mask their sum is taken in float:
                                 below -FLT_MAX it forbids (as -INFINITY),
                                 beyond +FLT_MAX it is MHA_E_ARG            */
    mha_masked_row masked_row;
    const mha_intervention *interventions; /* h entries, by head position r;
                                              NULL: keep every head         */
    mha_path path;
    const int *positions;     /* (B,T) position of each query token (RoPE,
                                 ALiBi), >= 0; NULL: 0..T-1 (cached
                                 forward: each token's position in the
                                 cache). Masks stay by index.             */
    const int *key_positions; /* (B,S) position of each key; NULL: positions
                                 when the keys come from x, else 0..S-1   */
    int sink_tokens;          /* >= 0; with window_left >= 0, keys j <
                                 sink_tokens are attended as well (still
                                 causal and window_right): StreamingLLM's
                                 attention sinks. 0: none. The cached
                                 forward takes the cache's own count (0 or
                                 that count here)                        */
    int bf16_matmul;          /* 1: the four projections multiply in bf16
                                 (torch's autocast, or its float32 matmul
                                 precision "medium"): their inputs (x, the
                                 key and value sources, and the
                                 concatenated heads Z after interventions)
                                 are rounded to bfloat16, to nearest even;
                                 the products (exact) are summed in fp32;
                                 attention itself stays fp32. Needs a layer
                                 with bf16 weights (mha_layer_convert_weights
                                 (layer, MHA_W_BF16)), else MHA_E_ARG; an
                                 input at or beyond bf16's range (|v| >=
                                 0x1.ffp127) is MHA_E_NONFINITE. Runs on AMX
                                 tiles (TDPBF16PS) where the CPU and the OS
                                 allow them, else on the fp32 kernels with
                                 the rounded inputs (the same sums up to
                                 their order). mha_forward, _kv, _ctx,
                                 mha_forward_lse and the cached forward
                                 (prefill and decode steps); the backward,
                                 training and mha_attend_lse refuse it
                                 (MHA_E_UNSUPPORTED).
                                 0: fp32 (default)                       */
    int chunk_size;           /* 0: none; C > 0: chunked attention (Llama 4's
                                 attention_chunk_size): query i and key j
                                 attend each other only inside one chunk
                                 of C, floor(aligned i / C) = floor(j / C)
                                 (the cached forward: the tokens' cache
                                 positions); combines with causal and the
                                 windows, not with sink_tokens            */
    const int *cu_seqlens;    /* NULL: none; else (n_seqs + 1) ints 0 =
                                 cu[0] < cu[1] < ... < cu[n_seqs] = T:
                                 packed sequences (FlashAttention's
                                 varlen cu_seqlens, training on packed
                                 documents): rows cu[s] .. cu[s+1]-1 of
                                 every batch row are sequence s, and query
                                 i attends key j only when both are in one
                                 sequence. Self-attention lengths (S = T);
                                 combines with causal (within each
                                 sequence), the windows and every variant,
                                 not with sink_tokens or chunk_size.
                                 RoPE and ALiBi read position differences,
                                 the same whether positions restart per
                                 sequence or not; give options.positions
                                 restarting at each cu[s] where absolute
                                 positions matter (the query temperature,
                                 dynamic NTK / LongRoPE's call length).
                                 The cached forward and the ring refuse it */
    int n_seqs;               /* entries of cu_seqlens minus one (>= 1)   */
    float dropout_p;          /* 0: none; 0 < p < 1: attention dropout for
                                 training (torch's nn.MultiheadAttention
                                 dropout, Hugging Face's attention_dropout):
                                 each probability P[b,r,i,j] (after the
                                 softmax, before V) is zeroed with
                                 probability p and the kept ones scaled by
                                 1 / (1 - p); captured probabilities are
                                 the dropped ones, as torch returns them.
                                 The draw is a function of dropout_seed and
                                 (b, r, i, j) alone (a counter-based hash,
                                 docs/BACKWARD.md), so the reference, the
                                 fast path on any ISA and thread count, the
                                 tape and the backward drop the same
                                 entries. The KV cache's forwards,
                                 mha_forward_lse and mha_attend_lse refuse
                                 it (MHA_E_UNSUPPORTED)                  */
    unsigned long long dropout_seed; /* the draw's seed: a new one for each
                                 training step (the same for a forward
                                 and its backward)                        */
} mha_options;

MHA_API mha_options mha_options_default(void);

/* Optional outputs; NULL members are not computed. */
typedef struct {
    float *z;             /* (B,T,h*d_v): Z after interventions, before W_O  */
    float *contributions; /* (h,B,T,d_model): Z^(r) W_O[r]; sum over r
                             plus b_O equals Y                               */
    float *probs;         /* (B,h,T,S_total): attention probabilities, where
                             S_total = S + add_bias_kv + add_zero_attn       */
} mha_capture;

/* ----------------------------------------------------------------- forward */

/* y (B,T,d_model) = layer(x (B,T,d_model), kv (B,S,d_kv_in)).
 * kv == NULL means self-attention (kv = x; then S must equal T and
 * d_kv_in must equal d_model). cap and opt may be NULL. Inputs must be
 * finite. */
MHA_API mha_status mha_forward(const mha_layer *layer, float *y, const mha_capture *cap,
                       const float *x, const float *kv, int B, int T, int S,
                       const mha_options *opt);

/* The same with separate key and value sources, as PyTorch's key and value:
 * k_src (B,S,d_kv_in) feeds W_K, v_src (B,S,d_v_in) feeds W_V. k_src NULL
 * means x (then S == T); v_src NULL means k_src. */
MHA_API mha_status mha_forward_kv(const mha_layer *layer, float *y, const mha_capture *cap,
                          const float *x, const float *k_src, const float *v_src,
                          int B, int T, int S, const mha_options *opt);

/* The process default of the number of threads of every forward (0:
 * OpenMP's default, OMP_NUM_THREADS). An atomic: it may be set while other
 * threads compute; a call reads it once, at its start. Results never
 * depend on the thread count. n above 4 per processor (at least 64) is
 * taken as that many: libgomp exit()s the process when it cannot create
 * the threads. */
MHA_API void mha_set_num_threads(int n);
MHA_API int mha_get_num_threads(void);

/* ------------------------ log-sum-exp and merging partial attention */
/* Attention over disjoint key sets K_1, K_2, ... combines exactly: with
 * each part's output Z_i and log-sum-exp lse_i of its scores,
 *   lse = log sum_i exp(lse_i),   Z = sum_i exp(lse_i - lse) Z_i.
 * That is how ring attention, split KV caches and cascade attention are
 * built (src/forward/lse.c, src/forward/merge.c). mha_forward_lse and
 * mha_attention_merge run in double (the reference); mha_attend_lse
 * follows options.path: AUTO and FAST run the fast path's tiled online
 * softmax in fp32 (the fast backward's first pass, softcap included), AUTO
 * falling back to the reference for scores beyond the fast range (FAST
 * then returns MHA_E_UNSUPPORTED); MHA_KERNELS=reference and REFERENCE run
 * the double reference. */

/* mha_forward_kv (y, cap, sources and options as there) that also writes
 * lse (B,h,T): lse[b,r,i] = log sum_j exp(scale q_i . k_j + additive_ij)
 * over the keys query i of head r may attend (extra keys included), taken
 * before interventions; -INFINITY for a row with no allowed key. The
 * scores are the layer's (soft-cap, ALiBi). A sink logit (config.sinks) is
 * no key: lse leaves it out, while y and Z include its share of the
 * softmax. To merge parts of such a layer, take each part's Z over its
 * keys alone, Z_i (1 + exp(sink_r - lse_i)), merge, and apply the sink
 * once: Z = Z_m / (1 + exp(sink_r - lse_m)). */
MHA_API mha_status mha_forward_lse(const mha_layer *layer, float *y, const mha_capture *cap,
                                   float *lse, const float *x, const float *k_src,
                                   const float *v_src, int B, int T, int S,
                                   const mha_options *opt);

/* Attention alone on projected heads, for the config's h, h_kv, d_k, d_v:
 * z (B,T,h*d_v) and lse (B,h,T) (may be NULL) from q (B,T,h*d_k),
 * k (B,S,h_kv*d_k), v (B,S,h_kv*d_v). opt (may be NULL) gives scale, the
 * masks (with this call's T and S) and masked_row; interventions must be
 * NULL and the config must not ask for extra keys (add_bias_kv,
 * add_zero_attn: pass those rows in k and v). */
MHA_API mha_status mha_attend_lse(const mha_config *cfg, float *z, float *lse, const float *q,
                                  const float *k, const float *v, int B, int T, int S,
                                  const mha_options *opt);

/* z (B,T,h*d_v), lse (B,h,T) = the exact merge of n >= 1 partial results
 * z_parts[i] (B,T,h*d_v), lse_parts[i] (B,h,T) over disjoint key sets. A
 * part with lse = -inf (no allowed key) has weight 0 whatever its z holds
 * (0 or NaN); a row whose every part is -inf gets z = 0 and lse = -inf. z
 * and lse may be one of the parts (in place); lse may be NULL. A NaN or
 * +inf lse, or a non-finite z in a row whose lse is finite, is
 * MHA_E_NONFINITE (nothing written). */
MHA_API mha_status mha_attention_merge(float *z, float *lse, const float *const *z_parts,
                                       const float *const *lse_parts, int n, int B, int T,
                                       int h, int d_v);

/* ---------------------------------------------------- execution context */

/* How calls run, chosen per call instead of per process: the thread count
 * and the kernels ("avx512", "avx2", "scalar", "reference" = the oracle under
 * MHA_PATH_AUTO; NULL = the default). Without a context (the plain entry
 * points, or ctx NULL) the defaults apply: mha_set_num_threads, then
 * MHA_KERNELS in the environment (read at every call), then the best
 * kernels this CPU and OS run (CPUID and XCR0, probed once). A context's
 * kernels win over MHA_KERNELS.
 * Thread safety: a context may be shared by concurrent calls; its setters
 * and mha_context_free need exclusive access. */
typedef struct mha_context mha_context;
MHA_API mha_status mha_context_create(mha_context **out);
MHA_API void mha_context_free(mha_context *ctx);
/* n threads (1 .. 4 per processor, at least 64; more: MHA_E_ARG), or 0
 * for the process default. */
MHA_API mha_status mha_context_set_num_threads(mha_context *ctx, int n);
/* MHA_E_ARG for an unknown name or kernels this machine cannot run. */
MHA_API mha_status mha_context_set_kernels(mha_context *ctx, const char *name);
/* The kernels calls with ctx (NULL: the defaults) run now: "avx512", "avx2",
 * "scalar", "reference"; NULL when MHA_KERNELS holds an invalid value. */
MHA_API const char *mha_context_kernels(const mha_context *ctx);
/* mha_forward_kv run as ctx says (ctx may be NULL: the defaults). */
MHA_API mha_status mha_forward_ctx(const mha_context *ctx, const mha_layer *layer, float *y,
                                   const mha_capture *cap, const float *x, const float *k_src,
                                   const float *v_src, int B, int T, int S, const mha_options *opt);

/* -------------------------------------------------- the head contract */

typedef struct {
    int labels_ok;        /* 1 when every block's labels agree              */
    mha_block bad_block;  /* first block whose label disagrees with Q's     */
    int bad_position;     /* head (or kv head) position of that block       */
    int expected_label;   /* label the contract requires there              */
    int found_label;      /* label found there                              */
    int residual_checked; /* 1 when x was given and the sum was verified    */
    double max_residual;  /* max |sum_r contributions + b_O - Y|            */
} mha_contract_report;

/* Verifies that the labels of W_Q/W_K/W_V column blocks and W_O row blocks
 * agree (Q and O labels equal at each position, K and V labels equal, and
 * query head label q belongs to kv head label q / (h/h_kv)), and, when x is
 * not NULL, that the head contributions plus b_O reproduce Y within
 * 1e-4 * (1 + max|Y|). Returns MHA_E_CONTRACT with a message when either
 * fails; the report (may be NULL) is filled either way. */
MHA_API mha_status mha_layer_check_contract(const mha_layer *layer, const float *x, const float *kv,
                                    int B, int T, int S, const mha_options *opt,
                                    mha_contract_report *report);
/* The same for a layer with separate key and value sources (as
 * mha_forward_kv takes them). */
MHA_API mha_status mha_layer_check_contract_kv(const mha_layer *layer, const float *x, const float *k_src,
                                       const float *v_src, int B, int T, int S,
                                       const mha_options *opt, mha_contract_report *report);

/* ------------------------------------------- the seed steps, standalone */

/* z (rows, n*d) = Concat(heads[order[0]], ..., heads[order[n-1]]),
 * each heads[i] (rows, d). order == NULL means 0..n-1. */
MHA_API mha_status mha_concat_heads(float *z, const float *const *heads, const int *order,
                            int n, int rows, int d);
/* heads[i] (rows, d) = block i of z (rows, n*d). */
MHA_API mha_status mha_split_heads(float *const *heads, const float *z, int n, int rows, int d);
/* y (rows, d_out) = z (rows, d_in) w (d_in, d_out) + b (d_out, may be NULL). */
MHA_API mha_status mha_project_out(float *y, const float *z, const float *w, const float *b,
                           int rows, int d_in, int d_out);
/* contributions (n, rows, d_out): block r = z[:, r*d:(r+1)*d] w[r*d:(r+1)*d, :]. */
MHA_API mha_status mha_head_contributions(float *contributions, const float *z, const float *w,
                                  int n, int rows, int d, int d_out);
/* Applies one intervention to head r's block of z (rows, n*d) in place;
 * rows = B*T (MEAN averages over all rows; REPLACE reads (rows, d)). */
MHA_API mha_status mha_head_intervene(float *z, const mha_intervention *iv, int r, int n, int rows, int d);

/* ---------------------------------------------------------------- backward */
/* The gradients of a scalar loss l with respect to the forward's inputs and
 * the layer's weights, given dy = dl/dY (B,T,d_model). Each member is an
 * output: NULL = not wanted; a given array is overwritten (not added to).
 * The interventions of opt are differentiated as the functions they are
 * (ZERO and REPLACE pass no gradient to head r, SCALE multiplies it, MEAN
 * spreads the mean of dZ^(r) over all rows); masks are constants. A fully
 * masked query row passes zero gradient (MHA_MASKED_ROW_ZERO) or NaN into
 * everything its NaN output reaches (MHA_MASKED_ROW_NAN, as PyTorch). */
typedef struct {
    float *dx;      /* (B,T,d_model); includes the key/value paths of the
                       sources that are x (k_src / v_src NULL)            */
    float *dk_src;  /* (B,S,d_kv_in); only when k_src is given; includes
                       the value path when v_src is NULL (= k_src)        */
    float *dv_src;  /* (B,S,d_v_in); only when v_src is given apart       */
    float *dw_q;    /* (d_model, h*d_k)                                   */
    float *dw_k;    /* (d_kv_in, h_kv*d_k): summed over the heads of each
                       kv group                                           */
    float *dw_v;    /* (d_v_in, h_kv*d_v)                                 */
    float *dw_o;    /* (h*d_v, d_model)                                   */
    float *db_q;    /* (h*d_k); only when config.bias                     */
    float *db_k;    /* (h_kv*d_k); only when config.bias                  */
    float *db_v;    /* (h_kv*d_v); only when config.bias                  */
    float *db_o;    /* (d_model); only when config.bias                   */
    float *dbias_k; /* (h_kv*d_k); only when config.add_bias_kv           */
    float *dbias_v; /* (h_kv*d_v); only when config.add_bias_kv           */
    float *d_sinks;  /* (h); only when config.sinks                      */
    float *d_q_norm; /* as weights.q_norm: (d_k), or (h*d_k) per head;
                        only when config.qk_norm                          */
    float *d_k_norm; /* as weights.k_norm: (d_k), or (h_kv*d_k) per head  */
    float *dw_g;     /* (d_model, h*d_v); only when config.output_gate     */
    float *db_g;     /* (h*d_v); only when config.output_gate and bias     */
} mha_gradients;

/* Backward of mha_forward_kv with the same x, k_src, v_src, B, T, S and
 * opt (NULL sources mean what they mean there). dy (B,T,d_model) must be
 * finite. opt->path: AUTO and FAST run the fast fp32 backward
 * (FlashAttention-2 tiles, no (T,S) buffer, thread-count independent);
 * REFERENCE the double-accumulating reference backward. Both serve the
 * variants (rope, alibi, softcap, sinks, qk_norm: the fast one applies
 * QK-norm and RoPE to its recomputed Q, K and their transposes to dQ, dK,
 * ALiBi, softcap and the sinks inside its tiles), and the output gate
 * (dl/dG = dl/dZ' * Z * sigmoid'(G), whose path adds to dx). FAST returns
 * MHA_E_UNSUPPORTED for MHA_MASKED_ROW_NAN with a fully masked query row
 * (AUTO then runs the reference), and MHA_E_NONFINITE naming the gradient
 * when its fp32 sums overflowed (dy near FLT_MAX; AUTO then runs the reference,
 * whose gradients are Inf only where the exact value exceeds fp32).
 * Asking for a gradient the layer or the call has no tensor for (db_* of
 * a layer without bias, dk_src when k_src is NULL, ...) is MHA_E_ARG, and
 * so is a gradient array that overlaps another one or anything the call
 * reads (x, k_src, v_src, dy, the masks, positions and REPLACE values:
 * no in-place dx = x), named with what it overlaps. */
MHA_API mha_status mha_backward_kv(const mha_layer *layer, const mha_gradients *grad, const float *dy,
                                   const float *x, const float *k_src, const float *v_src,
                                   int B, int T, int S, const mha_options *opt);
/* The same for mha_forward's single key/value source kv (NULL: x). */
MHA_API mha_status mha_backward(const mha_layer *layer, const mha_gradients *grad, const float *dy,
                                const float *x, const float *kv, int B, int T, int S,
                                const mha_options *opt);

/* ---- training: a forward that keeps what its backward needs (the tape)
 * FlashAttention-2's split: the forward saves each query row's
 * log-sum-exp, so the backward skips the recomputation that
 * mha_backward_kv does (the projections, Z and lse: 2 of its 7 attention
 * products). A tape holds the projected Q (B,T,h*d_k), K (B,S',h_kv*d_k)
 * and V (B,S',h_kv*d_v) (S' = S + extra keys), Z (B,T,h*d_v) before the
 * interventions and lse (B,h,T): about (2*h*d_k + h*d_v) * B*T + S' kv
 * floats. It belongs to the layer, shapes and options of its forward and
 * reads nothing of them later: the backward takes the layer, sources and
 * options again and checks they are the forward's. Sources and weights
 * must hold the same values as at the forward (not checked, as in
 * PyTorch's saved tensors). */
typedef struct mha_tape mha_tape;

/* y (B,T,d_model) as mha_forward_kv with the same arguments, on the fast
 * path, plus *tape (free it with mha_tape_free; one tape serves any
 * number of mha_backward_tape calls). y is the fast path's within its
 * tolerance but not always its bits: the attention runs the fast
 * backward's own tiles, so that the tape backward is mha_backward_kv's
 * bit for bit. MHA_E_UNSUPPORTED (nothing written, *tape NULL) where the
 * fast backward does not serve the request: opt->path REFERENCE (or AUTO
 * under MHA_KERNELS=reference), MHA_MASKED_ROW_NAN with a fully masked
 * row, scores beyond MHA_FAST_SCORE_LIMIT; the caller then runs
 * mha_forward_kv and mha_backward_kv (which fall back themselves). Layers
 * with variants keep a tape too (and the Q, K before QK-norm when they
 * have it).
 * MHA_E_NONFINITE when y overflows fp32 (*tape NULL). */
MHA_API mha_status mha_forward_train(const mha_layer *layer, float *y, mha_tape **tape, const float *x,
                                     const float *k_src, const float *v_src, int B, int T, int S,
                                     const mha_options *opt);

/* mha_backward_kv's gradients (the fast backward's bits) from a tape of
 * mha_forward_train, without recomputing the forward: dy (B,T,d_model)
 * finite; layer, x, k_src, v_src, B, T, S and opt as given to that
 * forward. MHA_E_ARG naming the difference for a tape of another layer
 * (or a layer of another config, or whose weights changed since the
 * forward: set, permuted or converted), another B, T or S, sources shared
 * differently (keys from x vs k_src, values from the key source vs
 * v_src) or options that differ from the forward's (masks and
 * interventions compared by pointer); gradient members as
 * mha_backward_kv (NULL = not wanted). The tape is not changed. */
MHA_API mha_status mha_backward_tape(const mha_layer *layer, const mha_tape *tape, const mha_gradients *grad,
                                     const float *dy, const float *x, const float *k_src,
                                     const float *v_src, int B, int T, int S, const mha_options *opt);

/* Frees a tape; NULL is a no-op. */
MHA_API void mha_tape_free(mha_tape *tape);

/* Per-head attribution for the linear metric m = <dy, Y>:
 * attribution (h,B,T)[r,b,t] = sum_e Z^(r)[b,t,e] dZ^(r)[b,t,e], where Z is
 * what W_O reads (after interventions) and dZ = dy W_O^T is dm/dZ. It is
 * the first-order estimate of the change of m when head r is removed, and
 * exactly the change of the direct path: m(Y) - m(Y with head r zeroed).
 * dz (B,T,h*d_v) receives dZ when not NULL. Arguments as mha_forward_kv;
 * the forward runs on opt->path. */
MHA_API mha_status mha_head_attribution(const mha_layer *layer, float *attribution, float *dz,
                                        const float *dy, const float *x, const float *k_src,
                                        const float *v_src, int B, int T, int S,
                                        const mha_options *opt);

/* ---- files (src/io) ---- */
/* Readers and writers for .npy arrays and safetensors checkpoints, and the
 * checkpoint layouts converted at the boundary into the layer's (in, out),
 * head-ordered weights. Every size, offset and shape in a file is checked
 * before its data is touched; a bad file gives MHA_E_FORMAT (or MHA_E_IO,
 * MHA_E_NONFINITE, MHA_E_UNSUPPORTED) and a message naming the file, the
 * tensor and what was expected. */

#define MHA_ARRAY_MAX_RANK 4

typedef enum {
    MHA_DTYPE_F32 = 0,  /* npy '<f4', safetensors F32                       */
    MHA_DTYPE_F16 = 1,  /* npy '<f2', safetensors F16: widened to float      */
    MHA_DTYPE_BF16 = 2, /* safetensors BF16 only: widened to float           */
    MHA_DTYPE_BOOL = 3, /* npy '|b1', safetensors BOOL: bytes 0 or 1         */
    MHA_DTYPE_U8 = 4,   /* npy '|u1', safetensors U8                         */
    MHA_DTYPE_I32 = 5,  /* npy '<i4', with MHA_IO_INTEGERS: held as int64_t  */
    MHA_DTYPE_I64 = 6,  /* npy '<i8', with MHA_IO_INTEGERS                   */
    MHA_DTYPE_I8 = 7    /* safetensors I8 only: widened to float (exact)     */
} mha_dtype;

/* An owned, C-order array. Floating dtypes are held as float (f != NULL,
 * u8 == NULL); BOOL and U8 as bytes (u8 != NULL, f == NULL); I32 and I64
 * as int64_t (i64 != NULL, the others NULL). */
typedef struct {
    mha_dtype dtype;                /* dtype in the file                   */
    int rank;                       /* 0..MHA_ARRAY_MAX_RANK               */
    int shape[MHA_ARRAY_MAX_RANK];  /* entries past rank are 1             */
    size_t count;                   /* product of shape (1 for rank 0)     */
    float *f;
    uint8_t *u8;
    int64_t *i64;
} mha_array;

/* Reader flags. By default NaN and +-Inf in floating data are refused
 * (MHA_E_NONFINITE naming the file, tensor and index). */
enum {
    MHA_IO_ALLOW_NEG_INF = 1,  /* accept -Inf (additive masks); NaN, +Inf refused */
    MHA_IO_ALLOW_NONFINITE = 2, /* accept anything                              */
    MHA_IO_INTEGERS = 4        /* npy: accept '<i4' / '<i8' too (positions)    */
};

/* Frees a->f / a->u8 and zeroes *a (a may be NULL). */
MHA_API void mha_array_free(mha_array *a);
MHA_API const char *mha_dtype_name(mha_dtype dt); /* "float32", "float16", ... */

/* Reads a .npy file: versions 1-3, little-endian float32/float16, bool or
 * uint8 (and int32/int64 with MHA_IO_INTEGERS), C order, rank <= 4. Anything else is refused with MHA_E_FORMAT or
 * MHA_E_UNSUPPORTED. */
MHA_API mha_status mha_npy_read(mha_array *out, const char *path, unsigned flags);
/* The same from memory; name is used in messages. */
MHA_API mha_status mha_npy_parse(mha_array *out, const void *buf, size_t len, const char *name,
                         unsigned flags);
/* Writes a.npy in a->dtype (F32, F16, BOOL or U8; BF16 has no .npy form). */
MHA_API mha_status mha_npy_write(const char *path, const mha_array *a);
/* Writes float data (rank <= 4, shape[rank]) as float32. */
MHA_API mha_status mha_npy_write_f32(const char *path, const float *data, int rank, const int *shape);

/* A set of named arrays plus string metadata: the contents of one
 * safetensors file. Names are unique; order is insertion order. */
typedef struct mha_tensors mha_tensors;

MHA_API mha_status mha_tensors_create(mha_tensors **out);
MHA_API void mha_tensors_free(mha_tensors *t);
MHA_API int mha_tensors_count(const mha_tensors *t);
MHA_API const char *mha_tensors_name(const mha_tensors *t, int i);
/* The array named name, or NULL. */
MHA_API const mha_array *mha_tensors_get(const mha_tensors *t, const char *name);
/* Adds a copy of float data under a new name (MHA_E_ARG if taken). */
MHA_API mha_status mha_tensors_add_f32(mha_tensors *t, const char *name, const float *data, int rank,
                               const int *shape);
/* Adds a copy of any array (e.g. one read from another file). */
MHA_API mha_status mha_tensors_add(mha_tensors *t, const char *name, const mha_array *a);
/* String metadata (safetensors "__metadata__"); set replaces. get: NULL if absent. */
MHA_API mha_status mha_tensors_set_meta(mha_tensors *t, const char *key, const char *value);
MHA_API const char *mha_tensors_meta(const mha_tensors *t, const char *key);
MHA_API int mha_tensors_meta_count(const mha_tensors *t);
MHA_API const char *mha_tensors_meta_key(const mha_tensors *t, int i);

/* Reads a safetensors file (F32, F16, BF16 widened to float; BOOL, U8).
 * The JSON header is parsed with jansson; header length, offsets (in range,
 * no overlap, no holes), dtypes, shapes and duplicate names are validated
 * before any data is read. */
MHA_API mha_status mha_safetensors_read(mha_tensors **out, const char *path, unsigned flags);
MHA_API mha_status mha_safetensors_parse(mha_tensors **out, const void *buf, size_t len,
                                 const char *name, unsigned flags);
/* Writes every tensor (floating ones as F32) with the metadata. */
MHA_API mha_status mha_safetensors_write(const char *path, const mha_tensors *t);
/* The tensors of a checkpoint path: a safetensors file (as
 * mha_safetensors_read; with a prefix, only the tensors whose names start
 * with it are decoded and kept), or a Hugging Face sharded checkpoint's index
 * ("*.safetensors.index.json", {"weight_map": {tensor: shard file}}, the
 * shards beside it). From an index only the one attention layer inside
 * prefix is read (prefix as mha_load_options.prefix; NULL: the only
 * layer), from the shards that hold its tensors, with the first one's
 * metadata; several layers inside prefix, a shard outside the index's
 * directory or lacking a tensor the index places there: MHA_E_FORMAT.
 * mha_layer_load and mha_layer_load_heads accept an index too. */
MHA_API mha_status mha_checkpoint_read(mha_tensors **out, const char *path, const char *prefix, unsigned flags);
/* The checkpoint file a path names: the path itself, or for a directory
 * (Hugging Face's save_pretrained) its model.safetensors, else its
 * model.safetensors.index.json (MHA_E_IO when it holds neither). Written
 * to out (cap bytes). mha_checkpoint_read, mha_layer_load,
 * mha_layer_load_config and mha_layer_load_heads resolve their path so. */
MHA_API mha_status mha_checkpoint_resolve(char *out, size_t cap, const char *path);

/* Checkpoint layouts (tensor names matched on their suffix, so a prefix such
 * as "model.layers.0.self_attn." is allowed when it is unique):
 *   native   w_q (d_model,h*d_k) w_k w_v w_o (h*d_v,d_model), b_q b_k b_v b_o,
 *            bias_k bias_v; metadata n_heads n_kv_heads d_k d_v add_zero_attn
 *            and labels_q/labels_k/labels_v/labels_o ("3,1,2,0").
 *   torch    nn.MultiheadAttention state dict (converted by convert_torch.c).
 *   hf       q_proj/k_proj/v_proj/o_proj.weight (out,in) [+ .bias], GQA (or
 *            out_proj for o_proj: OPT, BART, Whisper, GPT-J; BERT's
 *            self.query/key/value + output.dense, ViT's attention.query ...,
 *            DistilBERT's q_lin ... out_lin); or
 *            Phi-3's qkv_proj.weight ((h+2*h_kv)*d, d_model) = rows [Q; K; V]
 *            [+ qkv_proj.bias] with o_proj.weight (d_k = d_v).
 *   gpt2     c_attn.weight (d_model,3E) Conv1D (in,out) + c_attn.bias,
 *            c_proj.weight (E,d_model) + c_proj.bias; GPT-BigCode's
 *            nn.Linear c_attn ((h+2*h_kv)*d, d_model) (more rows than
 *            columns) holds megatron's rows, c_proj (d_model, E).
 *   megatron query_key_value.weight ((h+2*h_kv)*d_k, d_model) (out,in), rows
 *            per kv group g: [q heads of g, k_g, v_g]; dense.weight (out,in).
 *   codegen  CodeGen's qkv_proj.weight (3E, E) (out,in): 4 row blocks (its
 *            mp_num), block b = [q; v; k] of heads b*h/4 .. (b+1)*h/4-1;
 *            out_proj.weight (E, E); no biases. Never detected (OpenELM
 *            keeps the same names for other rows): named only.
 * hf also reads Qwen 1's nn.Linear c_attn / c_proj and ChatGLM's
 * query_key_value / dense as rows [Q; K; V] when named (auto detects
 * these names as gpt2's and megatron's rows). */
typedef enum {
    MHA_LAYOUT_AUTO = 0, /* detect from the tensor names                 */
    MHA_LAYOUT_NATIVE = 1,
    MHA_LAYOUT_TORCH = 2,
    MHA_LAYOUT_HF = 3,
    MHA_LAYOUT_GPT2 = 4,
    MHA_LAYOUT_MEGATRON = 5,
    MHA_LAYOUT_CODEGEN = 6
} mha_layout;

MHA_API const char *mha_layout_name(mha_layout l); /* "native", ... */
/* Parses "auto", "native", "torch", "hf", "gpt2", "megatron", "codegen". */
MHA_API mha_status mha_layout_parse(mha_layout *out, const char *name);
/* Detects the layout from the tensor names; when several or none fit, fails
 * with MHA_E_FORMAT and a message listing the candidates. */
MHA_API mha_status mha_layout_detect(mha_layout *out, const mha_tensors *t);

/* What the file does not say. n_heads / n_kv_heads: 0 = from the metadata
 * (or, for n_kv_heads, from the shapes); add_zero_attn: 1 = the layer
 * appends a zero key/value row (torch's add_zero_attn=True, which a
 * state_dict does not record), 0 = as the file's metadata says; prefix: NULL or "" = any unique
 * layer; else the module holding the one layer: its own path
 * ("model.layers.0.self_attn.") or an enclosing one, final dot optional
 * ("model.layers.0"); the layer's tensors are then read from its path only
 * (a GPT-2 block's mlp.c_proj.weight is not its attn.c_proj.weight). */
typedef struct {
    mha_layout layout;
    int n_heads;
    int n_kv_heads;
    const char *prefix;
    int add_zero_attn;
    int output_gate; /* 1: the hf layout's q_proj holds each head's query rows
                        then its gate rows ((h*2*d, d_model): Qwen3-Next's
                        attn_output_gate, which the names do not say):
                        a gated layer (config.output_gate); 0: none */
} mha_load_options;

/* Builds a layer from tensors in the given layout (AUTO detects). Shapes are
 * checked against the layout; labels come from native metadata. */
MHA_API mha_status mha_layer_from_tensors(mha_layer **out, const mha_tensors *t,
                                  const mha_load_options *opt);
/* The layer as native tensors with its labels and dims in the metadata. */
MHA_API mha_status mha_layer_to_tensors(mha_tensors **out, const mha_layer *layer);
/* File wrappers of the two above. */
MHA_API mha_status mha_layer_load(mha_layer **out, const char *path, const mha_load_options *opt);
MHA_API mha_status mha_layer_save(const mha_layer *layer, const char *path);

/* ---- A shard of a checkpoint (src/io/load_heads.c) ---- */
/* Query heads [first, first + count) of a checkpoint and the kv heads
 * they read: whole kv groups (count and first multiples of h/h_kv), or
 * heads inside one group (its one kv head). */
typedef struct {
    int first, count;       /* in                                            */
    int kv_first, kv_count; /* out: the kv heads of the shard                */
    int *labels;            /* out, may be NULL: 2*count + 2*kv_count ints,
                               the file's labels (metadata labels_*; i when
                               absent) of the shard's W_Q and W_O blocks
                               (count each), then W_K and W_V (kv_count)  */
    int *s_labels;          /* out, may be NULL: count ints, the file's
                               labels_s of the shard's heads (the labels of
                               their ALiBi slopes and sinks; i when absent) */
} mha_head_range;

/* The layer of those heads alone (h = count, h_kv = kv_count, identity
 * labels): their column blocks of W_Q, W_K, W_V and biases (and of a
 * gated layer's W_G and b_G: native w_g / b_g, or the gate rows of an hf
 * q_proj with opt->output_gate), row blocks of W_O, per-head variant tensors, and b_O, bias_k, bias_v as the file has
 * them (bias_k, bias_v: the shard's kv heads), for every layout
 * mha_layer_load reads. Only those blocks are copied out of the mapped
 * file, and only they are checked: another head's NaN does not stop the
 * load (F32 tensors; other dtypes are decoded whole while mapped).
 * A bf16 or int8 native file's shard keeps that dtype (int8: with its
 * heads' scales), as mha_layer_load keeps it for the whole layer.
 * Y of the full layer = sum over a partition of the heads of each shard's
 * Y without b_O, plus b_O. A layer with qk_norm_whole (one norm over all
 * heads) loads only whole (count = h; else MHA_E_UNSUPPORTED). */
MHA_API mha_status mha_layer_load_heads(mha_layer **out, const char *path, const mha_load_options *opt,
                                        mha_head_range *range);
/* The layer's config (h, h_kv, d_k, d_v, d_model, d_kv_in, d_v_in, bias,
 * add_bias_kv, add_zero_attn, and the variants: rope, alibi, softcap,
 * sinks, qk_norm as mha_layer_load reads them) from the shapes, metadata
 * and the small per-head variant tensors, without copying or checking any
 * projection weight. */
MHA_API mha_status mha_layer_load_config(mha_config *out, const char *path, const mha_load_options *opt);

/* ---- PyTorch layout (src/convert_torch.c) ---- */

/* Borrowed pointers to the tensors of a torch.nn.MultiheadAttention, in
 * PyTorch's own layout: weights are (out, in), as nn.Linear stores them.
 * E = embed_dim; d_k = d_v = E / num_heads; head r owns rows
 * [r*d_k, (r+1)*d_k) of each q/k/v weight and columns [r*d_v, (r+1)*d_v) of
 * out_proj.weight. Give either in_proj_weight (when kdim == vdim == E) or
 * all three q/k/v_proj_weight. A NULL in_proj_bias and out_proj_bias mean
 * bias=False (one NULL alone reads as zeros). bias_k and bias_v, given
 * together, mean add_bias_kv=True. kdim becomes d_kv_in and vdim d_v_in:
 * PyTorch projects K from `key` and V from `value`, as mha_forward_kv does
 * from k_src and v_src (mha_forward, one source, needs kdim == vdim). */
typedef struct {
    int embed_dim;     /* E = d_model                                       */
    int num_heads;     /* h; must divide E                                  */
    int kdim;          /* width of the key source; 0 means E (= d_kv_in)    */
    int vdim;          /* width of the value source; 0 means E (= d_v_in)   */
    int add_zero_attn; /* 0 or 1, the module flag                           */
    const float *in_proj_weight;  /* (3E, E): W_q; W_k; W_v along dim 0     */
    const float *in_proj_bias;    /* (3E): b_q; b_k; b_v (also with separate
                                     weights), or NULL                      */
    const float *q_proj_weight;   /* (E, E)     when in_proj_weight is NULL  */
    const float *k_proj_weight;   /* (E, kdim)                              */
    const float *v_proj_weight;   /* (E, vdim)                              */
    const float *out_proj_weight; /* (E, E) out_proj.weight                  */
    const float *out_proj_bias;   /* (E) out_proj.bias, or NULL              */
    const float *bias_k;          /* (1, 1, E), or NULL                      */
    const float *bias_v;          /* (1, 1, E), or NULL                      */
} mha_torch_weights;

/* Creates a layer equal to the PyTorch module (d_model = E, n_heads = h,
 * d_kv_in = kdim, d_v_in = vdim, bias, add_bias_kv, add_zero_attn),
 * transposing every weight to (in, out). The inputs are only read. Errors
 * name PyTorch's tensor (e.g. "out_proj.weight[12] = nan"). */
MHA_API mha_status mha_layer_from_torch(mha_layer **out, const mha_torch_weights *tw);

/* ---- KV cache (src/cache.c) ---- */
/* A KV cache keeps the keys and values of the tokens a causal
 * self-attention layer has seen, for B sequences, so new tokens (a prompt:
 * prefill; one or a few: decode) are processed without recomputing the
 * past. Only the h_kv kv heads are stored: GQA and MQA shrink it by h/h_kv.
 *
 * Layout (per sequence b and kv head g, contiguous): chunks of 128 slots,
 * each holding K in panels of 8 keys, (16, d_k, 8), so the decode kernel's
 * 8-wide loads read one dim of 8 keys, then V as (128, d_v); a kv head is
 * one sequential stream. slots = capacity rounded up to a multiple of 128.
 * Storage fp32 or fp16 (IEEE binary16, round to nearest even; an element
 * of K or V of 65520 or more, which it would store as infinity, is refused
 * with MHA_E_NONFINITE), or int8; arithmetic is always fp32.
 *
 * Positions: sequence b's tokens are numbered 0, 1, ... in the order they
 * were appended; mha_cache_length(cache, b) is the next position. Without a
 * window, position p lives in slot p and at most `capacity` tokens fit.
 * With a window W, the cache is a ring of `capacity` slots (p in slot
 * p % capacity) and every query attends only the keys of the last W
 * positions including its own (as window_left = W - 1).
 *
 * Attention is always causal, bottom-right aligned: the new token at
 * position p attends cached positions <= p. The cache is not bound to one
 * layer object: any layer of the same shape may be passed, but the cache
 * remembers the K/V head labels it was filled with and refuses a layer
 * whose labels differ (MHA_E_CONTRACT) - after mha_layer_permute_heads on
 * a layer with a live cache, apply the same perm with
 * mha_cache_permute_heads and decoding continues with the same outputs
 * (up to rounding: W_O's rows are then summed in another order, as in
 * mha_forward after a permutation). */

typedef enum {
    MHA_CACHE_F32 = 0, /* 4 bytes per element */
    MHA_CACHE_F16 = 1, /* 2 bytes per element, widened on load */
    /* 1 byte per element plus one fp32 scale per block of 32 values of a
     * key or value row (along d_k / d_v; a shorter last block when d is
     * not a multiple of 32): 1.125 bytes per element. Symmetric: scale =
     * max|x| / 127 over the block, q = x / scale rounded to nearest, ties
     * away from zero (roundf), clamped to +-127; an all-zero block has
     * scale 0 and q = 0. Dequantized (q * scale) on load, arithmetic in
     * fp32; an element of FLT_MAX, which would read back as infinity, is
     * refused (MHA_E_NONFINITE). Error: docs/CACHE.md. */
    MHA_CACHE_I8 = 2
} mha_cache_dtype;

typedef struct mha_cache mha_cache;

/* Creates an empty cache for `batch` sequences of up to `capacity` tokens
 * (window == 0) or a ring of `capacity` slots keeping the last `window`
 * tokens (1 <= window <= capacity). The layer must be self-attention
 * (d_kv_in == d_v_in == d_model). */
MHA_API mha_status mha_cache_create(mha_cache **out, const mha_layer *layer, int batch, int capacity,
                            mha_cache_dtype dtype, int window);
/* The same with K and V stored in types of their own (e.g. K MHA_CACHE_I8,
 * V MHA_CACHE_F16); mha_cache_create(.., dtype, ..) is k_dtype = v_dtype =
 * dtype. Each side keeps its type's error bound (docs/CACHE.md). */
MHA_API mha_status mha_cache_create_kv(mha_cache **out, const mha_layer *layer, int batch, int capacity,
                                       mha_cache_dtype k_dtype, mha_cache_dtype v_dtype, int window);
/* Cross-attention (encoder-decoder decoding: Whisper, BART, Marian): a
 * cache holding the K and V of an encoder's output (the "memory"), which
 * mha_cache_set_memory projects once per input; then every
 * mha_forward_cached call on it attends each of its T queries per
 * sequence to all of that sequence's memory keys (not causal; nothing is
 * appended), as mha_forward(layer, .., kv, v_src, B, T, S, opt) with
 * options.key_keep marking each sequence's first s_len[b] keys, and
 * add_bias_kv / add_zero_attn keys after them. The layer may read kv of
 * its own width (d_kv_in, d_v_in); it may not have RoPE, ALiBi or a query
 * temperature (MHA_E_UNSUPPORTED: they need positions), and calls on the
 * memory refuse window_left, chunk_size and positions. mha_cache_append
 * is refused; mha_cache_attend attends the whole memory; reorder (beam
 * search), permute_heads, reset, length and bytes work as on any cache. */
MHA_API mha_status mha_cache_create_cross(mha_cache **out, const mha_layer *layer, int batch, int capacity,
                                          mha_cache_dtype k_dtype, mha_cache_dtype v_dtype);
/* Projects kv (B, S, d_kv_in) and v_src (B, S, d_v_in; NULL: kv) with the
 * layer's W_K, W_V and biases (clip_qkv and the key norm as its forward
 * applies them) and stores sequence b's first s_len[b] rows (s_len NULL:
 * all S; 1 <= s_len[b] <= S <= capacity), replacing what the memory held
 * and adopting the layer's K/V head labels. Errors leave it as it was; a
 * non-finite kv element, or a row whose K or V the storage cannot hold
 * (fp32 overflow, float16's 65520, V beyond FLT_MAX / (capacity + 2)), is
 * MHA_E_NONFINITE naming its sequence and memory row.
 * The projections run in fp32 (options.bf16_matmul of later calls rounds
 * their queries' inputs only). */
MHA_API mha_status mha_cache_set_memory(mha_cache *cache, const mha_layer *layer, const float *kv,
                                        const float *v_src, int S, const int *s_len);
/* StreamingLLM: the first n_sink positions of every sequence of a
 * windowed cache are never evicted, and every query attends them besides
 * its window (as options.sink_tokens = n_sink with window_left = W - 1).
 * They keep slots 0..n_sink-1 and the positions they were stored with
 * (their K is stored rotated at those positions); the other positions
 * share a ring of capacity - n_sink slots, which must hold the window:
 * 0 <= n_sink <= capacity - window. Only on a windowed cache holding no
 * tokens (MHA_E_ARG otherwise). */
MHA_API mha_status mha_cache_set_sink_tokens(mha_cache *cache, int n_sink);
MHA_API void mha_cache_free(mha_cache *cache);

/* Bytes of K/V storage: B * h_kv * slots * (d_k + d_v) * (4 or 2) (int8:
 * B * h_kv * slots * (d_k + d_v + 4 * (ceil(d_k/32) + ceil(d_v/32))), the
 * fp32 block scales included), i.e.
 * 2 * B * capacity * h_kv * d_head * bytes when d_k = d_v = d_head and
 * capacity is a multiple of 128; the constant bookkeeping (a few hundred
 * bytes) is not counted. */
MHA_API size_t mha_cache_bytes(const mha_cache *cache);
/* What a cache was made with (one mha_cache_load returned, say). */
typedef struct {
    int batch, capacity, window, sink_tokens, cross;
    mha_cache_dtype k_dtype, v_dtype;
} mha_cache_info;
MHA_API mha_status mha_cache_get_info(const mha_cache *cache, mha_cache_info *info);
/* The same number for a config without creating a cache (0 when the
 * config, batch or capacity is invalid): for `mha shapes` and planning. */
MHA_API size_t mha_cache_bytes_for(const mha_config *cfg, int batch, int capacity, mha_cache_dtype dtype);
/* The same for K stored as k_dtype and V as v_dtype: B * h_kv * slots *
 * (d_k * bytes(k_dtype) + d_v * bytes(v_dtype) + the scales of an int8 side). */
MHA_API size_t mha_cache_bytes_for_kv(const mha_config *cfg, int batch, int capacity, mha_cache_dtype k_dtype,
                                      mha_cache_dtype v_dtype);

/* Next position of sequence b (tokens appended since the last reset,
 * minus truncations); -1 when cache is NULL or b is out of range. */
MHA_API int mha_cache_length(const mha_cache *cache, int b);
/* Empties sequence b, or every sequence when b == -1. */
MHA_API mha_status mha_cache_reset(mha_cache *cache, int b);
/* Rolls sequence b back to new_len tokens (0 <= new_len <= length), e.g.
 * to drop rejected speculative tokens. A windowed cache refuses to go back
 * so far that the window of the next token would need overwritten slots. */
MHA_API mha_status mha_cache_truncate(mha_cache *cache, int b, int new_len);
/* Tree speculative decoding (Medusa, EAGLE, SpecInfer): after a tree of
 * draft tokens was verified in one mha_forward_cached call (a keep_mask
 * over its new tokens, see there), keeps the accepted path. Positions
 * first + keep[i] (i < n_keep; keep strictly increasing, each in 0 ..
 * length - first - 1) of sequence b move to positions first + i with
 * their keys, values, int8 scales and the positions they were stored with
 * (RoPE is already in a stored key; ALiBi reads the stored position);
 * every other position >= first is dropped: the length becomes first +
 * n_keep. n_keep = 0 is mha_cache_truncate(cache, b, first). Refused
 * (MHA_E_ARG, nothing moved): a cross-attention memory, positions >= first
 * no longer stored (the window evicted them), or a length whose next
 * token's window needs evicted slots (mha_cache_truncate's rule). */
MHA_API mha_status mha_cache_compact(mha_cache *cache, int b, int first, const int *keep, int n_keep);
/* Moves the cache's kv heads as mha_layer_permute_heads(layer, perm) moves
 * the layer's (perm: h entries, new head i = old head perm[i], groups kept
 * whole under GQA). O(h_kv): the storage is addressed through an index. */
MHA_API mha_status mha_cache_permute_heads(mha_cache *cache, const int *perm);
/* Beam search: sequence b of the cache becomes what sequence src[b] was
 * (src: B entries in 0..B-1, repeats allowed: a beam kept twice, another
 * dropped), with its keys, values, length and positions, as Hugging
 * Face's reorder_cache(beam_idx) does. Copies the moved sequences' K/V
 * storage (O(bytes of those sequences)); MHA_E_NOMEM leaves the cache as
 * it was. */
MHA_API mha_status mha_cache_reorder(mha_cache *cache, const int *src);
/* A new cache holding what src holds (every sequence's keys, values,
 * positions and length; its shape, types, window, sink tokens, head order
 * and cross-attention memory), independent of it from then on: a prompt's
 * cache computed once and continued by several requests. Free it with
 * mha_cache_free. */
MHA_API mha_status mha_cache_clone(mha_cache **out, const mha_cache *src);
/* Saves what the cache holds (every sequence's keys and values in their
 * storage type, int8 scales, stored positions, lengths; its shape, types,
 * window, sink tokens, head order, cross-attention memory) to a
 * safetensors file at path, written whole or not at all (docs/CACHE.md
 * "Saving a cache"): a prompt's cache computed once and loaded by later
 * processes. Only reads the cache. */
MHA_API mha_status mha_cache_save(const mha_cache *cache, const char *path);
/* A new cache for layer holding what the file mha_cache_save wrote holds:
 * decoding goes on as with the saved cache, to the bit. The layer must
 * have the saved cache's shape (MHA_E_SHAPE otherwise) and variants a
 * cross-attention memory allows; its head order is checked at the next
 * call, as for any cache. A file that is not such a cache, or whose
 * lengths, codes, scales or positions no cache could hold, is MHA_E_FORMAT
 * naming the entry; a later format_version MHA_E_UNSUPPORTED. *out is
 * NULL on error. */
MHA_API mha_status mha_cache_load(mha_cache **out, const mha_layer *layer, const char *path);

/* Prefill and decode in one entry. x (B, T, d_model) holds up to T new
 * tokens per sequence: sequence b uses rows 0 .. n_new[b]-1 (n_new may be
 * NULL: all T; 0 <= n_new[b] <= T, so sequences may differ in length).
 * Appends their K/V and computes y (B, T, d_model) for those rows, each
 * new token attending every cached position <= its own (and the layer's
 * bias_k / zero rows when add_bias_kv / add_zero_attn). Rows past n_new[b]
 * of y and of the captures are set to 0. A windowed cache processes long
 * prompts in pieces internally.
 * opt (may be NULL): scale, window_left (combined with the cache window),
 * masked_row and interventions apply as in mha_forward (MEAN averages over
 * the new rows of this call); causal, align and window_right are implied
 * (ignored); additive_mask, key_keep and key_additive give
 * MHA_E_UNSUPPORTED; path is ignored (one implementation, fp32).
 * keep_mask (batch 1 or B, heads 1, T, T) masks the call's new tokens
 * among themselves (tree attention, to verify a tree of draft tokens in
 * one call): new token i attends new token j <= i only where
 * mask[b][i][j] is nonzero; the tokens cached before the call stay visible
 * to all (within the windows; a window, window_left and chunk_size count
 * positions along each new token's own sequence: the cached tokens, then
 * the new tokens its mask row keeps, so a draft after its siblings sees
 * the prefix it would see on its path). On a ring, a call longer than
 * capacity - sink tokens - window + 1 whose later tokens' windows need
 * prefix keys that storing it overwrites is MHA_E_ARG, naming the token.
 * Order the tree's tokens parents first: a nonzero entry above the
 * diagonal (j > i) is MHA_E_ARG, naming it; rows and columns past
 * n_new[b] are not read. Give each token its depth as
 * its position (positions: base + depth) for RoPE / ALiBi, and keep the
 * accepted path with mha_cache_compact. Refused on a cross-attention
 * memory.
 * cap (may be NULL): z (B,T,h*d_v) and contributions (h,B,T,d_model) as in
 * mha_forward; probs (B,h,T,capacity+extra): column s is cache slot s
 * (= position s without a window), the add_bias_kv / add_zero_attn keys
 * at columns capacity, capacity+1.
 * Errors: MHA_E_SHAPE for a cache made for another layer shape, MHA_E_ARG
 * for n_new out of range or more tokens than the capacity (without a
 * window) or an invalid MHA_KERNELS, MHA_E_CONTRACT when the layer's K/V
 * labels differ from the cache's, MHA_E_NONFINITE for non-finite x or
 * scores beyond the fp32 limit (see "Numbers" at the top); after any of
 * these nothing has been appended, except after an output y that
 * overflows fp32 (MHA_E_NONFINITE too): its tokens' K/V are stored by
 * then. */
MHA_API mha_status mha_forward_cached(const mha_layer *layer, mha_cache *cache, float *y,
                              const mha_capture *cap, const float *x, int T, const int *n_new,
                              const mha_options *opt);
/* mha_forward_cached run as ctx says (ctx may be NULL: the defaults;
 * kernels "reference" runs the fast kernels: the cache has one path). */
MHA_API mha_status mha_forward_cached_ctx(const mha_context *ctx, const mha_layer *layer,
                                          mha_cache *cache, float *y, const mha_capture *cap,
                                          const float *x, int T, const int *n_new,
                                          const mha_options *opt);

/* The two halves of a step, for callers that project themselves (and for
 * the benchmark of attention alone). append: k (B,T,h_kv*d_k) and
 * v (B,T,h_kv*d_v), rows 0 .. n_new[b]-1 of each sequence (n_new NULL:
 * all T); a windowed cache accepts at most capacity - window + 1 rows per
 * call. attend: z (B,T,h*d_v) for queries q (B,T,h*d_k) of the last
 * n_new[b] appended positions of each sequence (rows past n_new[b] of z
 * untouched), scale 0 meaning 1/sqrt(d_k); no extra keys, no options;
 * the cached forward's range rule ("Numbers" above): MHA_E_NONFINITE
 * naming the sequence and kv head, z untouched. */
MHA_API mha_status mha_cache_append(mha_cache *cache, const float *k, const float *v, int T,
                            const int *n_new);
MHA_API mha_status mha_cache_attend(const mha_cache *cache, float *z, const float *q, int T,
                            const int *n_new, float scale);

#ifdef __cplusplus
}
#endif
#endif /* MHA_H */
