/* permute_proj.c — see permute_proj.h. */
#include <stdlib.h>
#include <string.h>

#include "permute_proj.h"

mha_status cli_permute_proj(mha_layer **L, mha_block block, const int *perm) {
    const mha_config *c = mha_layer_config(*L);
    if (c->qk_norm == MHA_QK_NORM_NONE || !c->qk_norm_per_head || (block != MHA_BLOCK_Q && block != MHA_BLOCK_K))
        return mha_layer_permute_block(*L, block, perm);
    const int q = block == MHA_BLOCK_Q, nb = q ? c->n_heads : c->n_kv_heads;
    const size_t n = (size_t)nb * c->d_k; /* the norm: (h or h_kv, d_k) */
    float *keep = malloc(n * sizeof *keep);
    int *lab = malloc((size_t)c->n_heads * sizeof *lab), *inv = malloc((size_t)nb * sizeof *inv);
    mha_status s = keep && lab && inv ? MHA_OK : MHA_E_NOMEM;
    mha_weights w;
    mha_layer_get_weights(*L, &w);
    if (!s) memcpy(keep, q ? w.q_norm : w.k_norm, n * sizeof *keep);
    /* the whole block (norm rows included), then a copy with the norm rows as they were */
    if (!s) s = mha_layer_permute_block(*L, block, perm);
    const int moved = !s;
    mha_layer *N = NULL;
    if (!s) {
        mha_layer_get_weights(*L, &w);
        if (q) w.q_norm = keep;
        else w.k_norm = keep;
        s = mha_layer_create(&N, c, &w);
    }
    for (int b = 0; b <= MHA_BLOCK_S && !s; b++)
        if (!(s = mha_layer_labels(*L, (mha_block)b, lab))) s = mha_layer_set_labels(N, (mha_block)b, lab);
    const mha_weight_dtype dt = mha_layer_weights_dtype(*L);
    if (!s && dt != MHA_W_F32) s = mha_layer_convert_weights(N, dt);
    if (s && moved) { /* leave *L as it was */
        const mha_status failed = s;
        for (int i = 0; i < nb; i++) inv[perm[i]] = i;
        mha_layer_permute_block(*L, block, inv);
        s = failed;
    }
    free(keep), free(lab), free(inv);
    if (s) {
        mha_layer_free(N);
        return s;
    }
    mha_layer_free(*L);
    *L = N;
    return MHA_OK;
}
