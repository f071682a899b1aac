/* mha_mpi.h — libmha_mpi: the attention layer of libmha split across MPI
 * ranks (built only where MPI is installed; libmha itself knows nothing of
 * MPI). Legend as in mha.h: B batch, T queries, S keys, h heads, h_kv kv
 * heads, d_k, d_v, d_model, d_kv_in; P ranks of the communicator, r this
 * rank.
 *
 * Head parallel (Megatron-style): rank r owns query heads
 * [r*h/P, (r+1)*h/P): column blocks of W_Q, W_K, W_V (and biases) and row
 * blocks of W_O. It computes its partial Y_r = sum over its heads of
 * Z^(i) W_O[i]; one MPI_Allreduce(SUM) gives Y = sum_r Y_r, and b_O is
 * added once, after it. kv heads move in whole groups: P must divide h_kv,
 * or (MQA-like) h_kv must divide P and P divide h, each rank then keeping
 * a copy of the one kv head its query heads read.
 *
 * Sequence parallel (ring attention): the T query rows (and the S key
 * rows) are cut into 2P chunks; rank r owns chunks r and 2P-1-r (zigzag,
 * so every rank has as much causal work as any other). Each rank projects
 * its rows; the K/V blocks travel around the ring (MPI_Isend/MPI_Irecv
 * overlapped with the attention of the block in hand), and partial results
 * are merged with mha_attention_merge (mha.h).
 *
 * KV-cache decode runs head-parallel: each rank caches only its kv heads
 * (mha_mpi_forward_cached_heads).
 *
 * Errors: every function here is collective. A failure on any rank (bad
 * input, allocation, shapes that differ between ranks) makes every rank
 * return the same status with the failing rank's message in
 * mha_mpi_last_error(); no rank is left waiting. Besides the shapes, the
 * ranks of every call compare a checksum of the layer's configuration
 * (every field, the weights' storage type) and of the options (their
 * scalars, which masks and arrays are given, the interventions' ops):
 * MHA_E_SHAPE naming it when they differ; the head split's calls compare
 * x (and kv) too, which every rank must pass alike. Weights and the other
 * arrays' contents are not compared (mha-mpi compares the files). */
#ifndef MHA_MPI_H
#define MHA_MPI_H

#include <mpi.h>

#include "mha.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Message of the last failing call on this rank ("" when none); after a
 * collective failure, the same text on every rank. */
const char *mha_mpi_last_error(void);

/* Bytes this rank sent in the last call, and what the formula predicts. */
typedef struct {
    double sent_bytes;     /* payload handed to MPI (allreduce, ring sends)   */
    double formula_bytes;  /* heads: B*T*d_model*4 (one allreduce of Y);
                              sequence: (P-1) * this rank's K/V block bytes   */
    double compute_s;      /* seconds in local computation                    */
    double total_s;        /* seconds for the whole call                      */
    double cache_bytes;    /* decode: this rank's KV cache (its kv heads only) */
} mha_mpi_stats;

/* Agrees on a status across comm: returns the first failing rank's status
 * (MHA_OK when none failed) on every rank, and on every rank sets
 * mha_mpi_last_error() to that rank's message (msg, or mha_last_error()
 * when msg is NULL), prefixed with "rank F: ". */
mha_status mha_mpi_agree(MPI_Comm comm, mha_status local, const char *msg);

/* Checks that every rank passed the same n integers (shapes, flags, a
 * checksum of the weights); MHA_E_SHAPE naming the first rank and entry
 * that differ from rank 0, on every rank. n is 0..32 and the same on
 * every rank, v and names are given when n > 0: else MHA_E_ARG. */
mha_status mha_mpi_check_same(MPI_Comm comm, const long long *v, int n, const char *const *names);

/* ------------------------------------------------------- head parallel */

/* The query heads [first, first + count) and kv heads [kv_first,
 * kv_first + kv_count) rank r of P owns for config c; on this rank only
 * (not collective): MHA_E_SHAPE when P cannot split h and h_kv,
 * MHA_E_UNSUPPORTED for a QK-norm over the whole width (qk_norm_whole)
 * with P > 1 (each rank would normalize over its own heads only),
 * MHA_E_ARG for a NULL pointer, P < 1 or rank outside 0..P-1. */
typedef struct {
    int first, count, kv_first, kv_count;
} mha_mpi_heads;
mha_status mha_mpi_heads_of(mha_mpi_heads *out, const mha_config *c, int rank, int P);

/* Builds this rank's shard of full: its heads' column blocks of W_Q, W_K,
 * W_V, biases and bias_k/bias_v (and of W_G, b_G: a gated layer's gate of
 * head i is computed with its W_Q block), its row blocks of W_O and a zero b_O (the
 * caller adds b_O once after the sum). Checks the shard's labels with the
 * contract's rule (Q and O labels equal, K and V equal, query label q in
 * kv label q / (h/h_kv)), then the gathered labels across ranks. A
 * bf16 / int8 layer's shard keeps that storage, its stored values the
 * layer's bit for bit. Collective. */
mha_status mha_mpi_shard_heads(mha_layer **local, mha_mpi_heads *heads, const mha_layer *full,
                               MPI_Comm comm);

/* Loads this rank's shard straight from the checkpoint file
 * (mha_layer_load_heads: only its heads' blocks are read and copied; no
 * rank holds the whole layer): cfg gets the whole layer's dims, heads its
 * heads, *b_o a malloc'd copy of b_O (NULL when the file has none; free
 * it) and *local the shard with b_O = 0. Labels are checked as
 * mha_mpi_shard_heads does, from the file's metadata. NULL local, heads,
 * cfg, b_o or path: MHA_E_ARG. Collective. */
mha_status mha_mpi_load_heads(mha_layer **local, mha_mpi_heads *heads, mha_config *cfg, float **b_o,
                              const char *path, const mha_load_options *opt, MPI_Comm comm);

/* y (B,T,d_model) on every rank = the full layer's forward, from this
 * rank's shard (mha_mpi_shard_heads) plus b_o (d_model, may be NULL).
 * x, kv, B, T, S as mha_forward; opt's interventions are indexed by global
 * head (h entries) and its masks by global head (heads 1 or h, else
 * MHA_E_SHAPE). cap (may be NULL; read on
 * rank 0 only) gets Z (B,T,h*d_v), contributions (h,B,T,d_model) and
 * probs (B,h,T,S_total), assembled on rank 0; every rank must pass the
 * same non-NULL pattern (its own pointers are ignored off rank 0).
 * stats may be NULL; local, heads, x, y NULL, or heads that are not this
 * rank's of the shard local (its head counts, first = rank * count):
 * MHA_E_ARG; B, T or S < 1, or y or a capture of more than 2^31-1 floats
 * (one MPI message): MHA_E_SHAPE. Collective. */
mha_status mha_mpi_forward_heads(const mha_layer *local, const mha_mpi_heads *heads,
                                 const float *b_o, float *y, const mha_capture *cap,
                                 const float *x, const float *kv, int B, int T, int S,
                                 const mha_options *opt, MPI_Comm comm, mha_mpi_stats *stats);

/* Prefill or decode with a KV cache, head-parallel: y (B,T,d_model) on
 * every rank for x (B,T,d_model), T new tokens per sequence, as
 * mha_forward_cached of the whole layer (plus b_o, may be NULL). cache
 * was made with mha_cache_create(&cache, local, B, capacity, ...) on this
 * rank's shard, so it holds only this rank's kv heads (h_kv/P of them, or
 * the one copied kv head). opt as mha_forward_cached, interventions
 * indexed by global head. stats: this call's bytes (one all-reduce of
 * B*T*d_model floats) and times. heads not this rank's of local:
 * MHA_E_ARG; B or T < 1, or y over 2^31-1 floats: MHA_E_SHAPE. Collective. */
mha_status mha_mpi_forward_cached_heads(const mha_layer *local, mha_cache *cache, const mha_mpi_heads *heads,
                                        const float *b_o, float *y, const float *x, int B, int T,
                                        const mha_options *opt, MPI_Comm comm, mha_mpi_stats *stats);

/* --------------------------------------------------- sequence parallel */

/* Chunk c of 2P of n rows is [c*n/(2P), (c+1)*n/(2P)); rank r owns chunks
 * r and 2P-1-r. Writes their starts and lengths: all 0 for P < 1, a rank
 * outside 0..P-1 or n < 0; nothing when start or len is NULL. */
void mha_mpi_chunks_of(int start[2], int len[2], int n, int rank, int P);

/* y (B,T,d_model) on rank 0 (others may pass NULL) = the layer's forward
 * of x (B,T,d_model) against kv (B,S,d_kv_in) (NULL: self-attention),
 * computed with ring attention: this rank reads only its own chunks' rows
 * of x and kv. Every rank holds the whole layer. Supported options:
 * scale, causal (both alignments), key padding (key_keep, key_additive),
 * keep/additive masks, masked_row, interventions (MEAN is averaged over
 * all ranks' rows); a gated layer (config.output_gate) gates each rank's
 * rows with its rows of x. cap: z (B,T,h*d_v) and contributions (h,B,T,d_model)
 * assembled on rank 0; probs are MHA_E_UNSUPPORTED (use heads). Needs
 * T >= 2P and S >= 2P. MHA_E_UNSUPPORTED, before any work, for a layer
 * with RoPE, ALiBi, sinks or QK-norm (the ring attends projected q and
 * k) and for options.sink_tokens or bf16_matmul; MHA_E_NONFINITE naming
 * x[b][t][e] (or kv) for a NaN/Inf in this rank's rows; MHA_E_ARG for a
 * NULL layer or x, or y on rank 0; MHA_E_SHAPE for B < 1 or a K/V block
 * or gather over 2^31-1 floats (one MPI message). Collective. */
mha_status mha_mpi_forward_sequence(const mha_layer *layer, float *y, const mha_capture *cap,
                                    const float *x, const float *kv, int B, int T, int S,
                                    const mha_options *opt, MPI_Comm comm, mha_mpi_stats *stats);

#ifdef __cplusplus
}
#endif
#endif /* MHA_MPI_H */
