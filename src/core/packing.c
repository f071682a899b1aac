/* packing.c — the layer's weights packed for the fast GEMM (compute/gemm.c),
 * rebuilt whenever the weights change (create, set, permute) and released
 * with the layer. The fast forward and the cached forward read them.
 * Legend: h, h_kv, d_k, d_v, d_model, d_kv_in, d_v_in (see mha.h). */
#include <stdlib.h>

#include "core/packing.h"

void mha_fast_release(mha_layer *L) {
    if (!L || !L->fast) return;
    mha_packed_free(&L->fast->qkv);
    mha_packed_free(&L->fast->q);
    mha_packed_free(&L->fast->kv);
    mha_packed_free(&L->fast->v);
    mha_packed_free(&L->fast->o);
    free(L->fast);
    L->fast = NULL;
}

mha_status mha_fast_prepare(mha_layer *L) {
    mha_fast_release(L);
    const mha_config *c = &L->cfg;
    struct mha_fast_state *f = calloc(1, sizeof *f);
    if (!f) return mha_fail(MHA_E_NOMEM, "fast path: cannot allocate its state");
    const int nq = c->n_heads * c->d_k, nk = c->n_kv_heads * c->d_k, nv = c->n_kv_heads * c->d_v;
    mha_status s;
    f->fused = c->d_kv_in == c->d_model && c->d_v_in == c->d_model;
    f->split_v = c->d_v_in != c->d_kv_in;
    if (f->fused) {
        const float *const w[3] = {L->w_q, L->w_k, L->w_v}, *const b[3] = {L->b_q, L->b_k, L->b_v};
        const int cols[3] = {nq, nk, nv};
        s = mha_pack(&f->qkv, c->d_model, 3, w, b, cols);
    } else {
        const float *const w[2] = {L->w_k, L->w_v}, *const b[2] = {L->b_k, L->b_v};
        const float *const wq[1] = {L->w_q}, *const bq[1] = {L->b_q};
        const int cols[2] = {nk, nv};
        s = mha_pack(&f->q, c->d_model, 1, wq, bq, &nq);
        if (!s) s = mha_pack(&f->kv, c->d_kv_in, f->split_v ? 1 : 2, w, b, cols);
        if (!s && f->split_v) s = mha_pack(&f->v, c->d_v_in, 1, w + 1, b + 1, cols + 1);
    }
    const float *const wo[1] = {L->w_o}, *const bo[1] = {L->b_o};
    if (!s) s = mha_pack(&f->o, c->n_heads * c->d_v, 1, wo, bo, &c->d_model);
    L->fast = f;
    if (s) mha_fast_release(L);
    return s;
}

const mha_packed *mha_fast_packed_qkv(const mha_layer *L) {
    return L->fast && L->fast->fused ? &L->fast->qkv : NULL;
}

const mha_packed *mha_fast_packed_o(const mha_layer *L) {
    return L->fast ? &L->fast->o : NULL;
}
