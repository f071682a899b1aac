/* packing.h — the layer's packed weights (packing.c), read by the fast
 * forward and the cached forward's many-row projections. */
#ifndef MHA_CORE_PACKING_H
#define MHA_CORE_PACKING_H

#include "base/internal.h"
#include "compute/gemm.h"

/* Packed weights, rebuilt whenever the layer's weights change. With
 * d_kv_in == d_v_in == d_model, W_Q | W_K | W_V are one matrix of three
 * sections so that self-attention projects Q, K and V in one pass over X;
 * with d_kv_in == d_v_in, W_K | W_V are one matrix of two sections. */
struct mha_fast_state {
    int fused;       /* 1: qkv holds Q, K, V; 0: q holds Q, kv holds K, V */
    int split_v;     /* 1 (d_v_in != d_kv_in): kv holds K only, v holds V */
    mha_packed qkv;  /* (d_model, h*d_k | h_kv*d_k | h_kv*d_v)           */
    mha_packed q;    /* (d_model, h*d_k)                                  */
    mha_packed kv;   /* (d_kv_in, h_kv*d_k | h_kv*d_v), or K alone        */
    mha_packed v;    /* (d_v_in, h_kv*d_v) when split_v                   */
    mha_packed o;    /* (h*d_v, d_model)                                  */
    mha_packed g;    /* (d_model, h*d_v) output gate W_G, b_G; empty without */
};

/* Called after the layer's weights change (create, set, permute) and on
 * free: packs the layer's own (in, out) weights. */
mha_status mha_fast_prepare(mha_layer *L);
/* The same packing read straight from the layout the weights arrive in
 * (a converter's source, e.g. nn.Linear's (out, in)): src = W_Q, W_K, W_V,
 * W_O with their biases, each holding the same numbers as the layer's
 * (in, out) copy, so the packed bits equal mha_fast_prepare's. */
mha_status mha_fast_prepare_from(mha_layer *L, const mha_pack_source src[4]);
/* mha_fast_prepare as a transaction (a permutation's last step): the new
 * panels are built beside the old ones, which stay, with the layer's
 * version, when that fails (out of memory: both at once must fit). */
mha_status mha_fast_replace(mha_layer *L);
void mha_fast_release(mha_layer *L);
/* The inverse, after mha_fast_prepare_from: the layer's (in, out) W_Q,
 * W_K, W_V, W_O copied out of its packed panels (a converter's weights
 * that arrived as (out, in): packing reads them as 16 sequential rows,
 * and this reads the panels sequentially, where a direct transpose walks
 * one side at a stride). Returns 1 when every weight is finite. */
int mha_fast_unpack(mha_layer *L);

/* The fused W_Q | W_K | W_V matrix (sections 0, 1, 2) exists when
 * d_kv_in == d_v_in == d_model, which every cache layer has; NULL when the
 * layer has no fast state or no fused packing. W_O: NULL without state. */
const mha_packed *mha_fast_packed_qkv(const mha_layer *L);
/* W_Q alone: section 0 of the fused matrix, or its own (NULL without
 * state); a cross-attention memory's queries. */
const mha_packed *mha_fast_packed_q(const mha_layer *L);
const mha_packed *mha_fast_packed_o(const mha_layer *L);
/* The packed output gate W_G (config.output_gate), or NULL. */
const mha_packed *mha_fast_packed_g(const mha_layer *L);

#endif /* MHA_CORE_PACKING_H */
