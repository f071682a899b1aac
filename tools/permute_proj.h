/* permute_proj.h — moving a projection's head blocks without the per-head
 * QK-norm weights that mha_layer_permute_block moves with them. */
#ifndef MHA_TOOLS_PERMUTE_PROJ_H
#define MHA_TOOLS_PERMUTE_PROJ_H

#include "mha.h"

/* Block MHA_BLOCK_Q: W_Q and b_Q column blocks (and Q's labels) move by
 * perm, the per-head q_norm rows stay; MHA_BLOCK_K: W_K, b_K, bias_k and
 * K's labels, the per-head k_norm rows stay. That is the mistake of a
 * conversion that wrote q_proj (k_proj) out of order and its q_norm
 * (k_norm) tensor right. Without per-head norms it is
 * mha_layer_permute_block. *L may be replaced by a new layer (the norms
 * are set through mha_layer_create: an int8 layer's projections are
 * quantized again, which may move a scale by one ulp). */
mha_status cli_permute_proj(mha_layer **L, mha_block block, const int *perm);

#endif /* MHA_TOOLS_PERMUTE_PROJ_H */
