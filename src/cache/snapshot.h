/* snapshot.h — a KV cache's state as plain arrays in slot order, the form
 * io/cache_file.c writes to and reads from a file (cache/ knows no files,
 * io/ knows no storage layout).
 * Legend: B sequences, R = capacity slots, h_kv kv heads (in the order of
 * the layer's K/V blocks the cache follows: logical, not storage order),
 * d_k, d_v; nbk / nbv int8 scale blocks per key / value (0 for other
 * types). */
#ifndef MHA_CACHE_SNAPSHOT_H
#define MHA_CACHE_SNAPSHOT_H

#include "mha.h"

/* What a cache holds, shape and state. Slots no live position holds are
 * zero (export) and not read (import). */
typedef struct {
    int B, cap, window, n_sink, cross;
    int d_model, h, h_kv, d_k, d_v, d_kv_in, d_v_in;
    mha_cache_dtype kt, vt;
    int nbk, nbv;
    float *k;       /* (B, h_kv, R, d_k): fp32 / fp16 values, or int8 codes */
    float *v;       /* (B, h_kv, R, d_v)                                    */
    float *k_scale; /* (B, h_kv, R, nbk) int8 K's block scales, else NULL   */
    float *v_scale; /* (B, h_kv, R, nbv)                                    */
    int *pos;       /* (B, R) the position each slot was stored with        */
    int *len, *lo;  /* (B) length, oldest position still stored            */
    int *labels_k, *labels_v; /* (h_kv) labels of the K/V blocks it holds   */
} mha_cache_state;

/* s's shape fields from c (the arrays untouched). */
void mha_cache_state_shape(mha_cache_state *s, const mha_cache *c);
/* s's arrays = c's state (the arrays allocated by the caller for s's
 * shape). Only reads c. MHA_E_NOMEM or MHA_OK. */
mha_status mha_cache_state_export(mha_cache_state *s, const mha_cache *c);
/* c (empty, made for s's shape: same B, capacity, window, sink tokens,
 * types) takes s's state: lengths and oldest positions that no cache could
 * reach, int8 codes outside [-127, 127], negative or non-finite scales,
 * values fp16 cannot hold and negative positions of live slots are
 * MHA_E_FORMAT naming `name` and the entry; c is left as it was on error
 * (empty). The key-norm bounds are computed from the keys. */
mha_status mha_cache_state_import(mha_cache *c, const mha_cache_state *s, const char *name);

#endif /* MHA_CACHE_SNAPSHOT_H */
