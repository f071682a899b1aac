/* packing.c — the layer's weights packed for the fast GEMM (compute/gemm.c),
 * rebuilt whenever the weights change (create, set, permute) and released
 * with the layer. The fast forward and the cached forward read them.
 * Legend: h, h_kv, d_k, d_v, d_model, d_kv_in, d_v_in (see mha.h). */
#include <stdatomic.h>
#include <stdlib.h>

#include "core/packing.h"

/* the last layer version handed out (process-wide, so that a layer freed
 * and another made at the same address do not share one) */
static atomic_ullong last_version;

static void state_free(struct mha_fast_state *f) {
    if (!f) return;
    mha_packed_free(&f->qkv);
    mha_packed_free(&f->q);
    mha_packed_free(&f->kv);
    mha_packed_free(&f->v);
    mha_packed_free(&f->o);
    mha_packed_free(&f->g);
    free(f);
}

void mha_fast_release(mha_layer *L) {
    if (!L) return;
    state_free(L->fast);
    L->fast = NULL;
}

/* A new packed state of src for L's config, L left untouched. */
static mha_status build(struct mha_fast_state **out, const mha_layer *L, const mha_pack_source src[4]) {
    const mha_config *c = &L->cfg;
    struct mha_fast_state *f = calloc(1, sizeof *f);
    *out = NULL;
    if (!f) return mha_fail(MHA_E_NOMEM, "fast path: cannot allocate its state");
    const int nq = c->n_heads * c->d_k, nk = c->n_kv_heads * c->d_k, nv = c->n_kv_heads * c->d_v;
    mha_status s;
    f->fused = c->d_kv_in == c->d_model && c->d_v_in == c->d_model;
    f->split_v = c->d_v_in != c->d_kv_in;
    if (f->fused) {
        const int cols[3] = {nq, nk, nv};
        s = mha_pack_from(&f->qkv, c->d_model, 3, src, cols);
    } else {
        const int cols[2] = {nk, nv};
        s = mha_pack_from(&f->q, c->d_model, 1, src, &nq);
        if (!s) s = mha_pack_from(&f->kv, c->d_kv_in, f->split_v ? 1 : 2, src + 1, cols);
        if (!s && f->split_v) s = mha_pack_from(&f->v, c->d_v_in, 1, src + 2, cols + 1);
    }
    if (!s) s = mha_pack_from(&f->o, c->n_heads * c->d_v, 1, src + 3, &c->d_model);
    if (!s && c->output_gate) { /* the gate from the layer's own (in, out) W_G */
        const int ng = c->n_heads * c->d_v;
        const mha_pack_source g = {.w = L->w_g, .k_stride = (size_t)ng, .n_stride = 1, .b = L->b_g};
        s = mha_pack_from(&f->g, c->d_model, 1, &g, &ng);
    }
    /* bf16 weights on a CPU with AMX: their pair panels for
     * options.bf16_matmul (without them, out of memory, the GEMM rounds
     * its input and runs the fp32 kernels: the same sums) */
    if (!s && mha_layer_weights_dtype(L) == MHA_W_BF16 && mha_cpu_has_amx_bf16()) {
        mha_packed *all[5] = {&f->qkv, &f->q, &f->kv, &f->v, &f->o};
        for (int i = 0; i < 5; i++)
            if (all[i]->panels) (void)mha_pack_bf16_pairs(all[i]);
        mha_clear_error();
    }
    if (s) state_free(f);
    else *out = f;
    return s;
}

mha_status mha_fast_prepare_from(mha_layer *L, const mha_pack_source src[4]) {
    L->version = atomic_fetch_add(&last_version, 1) + 1; /* every change of the weights passes here */
    mha_fast_release(L); /* first: the old panels' memory is the new ones' */
    return build(&L->fast, L, src);
}

/* The layer's own (in, out) row-major weights as a packing source. */
static void own_source(const mha_layer *L, mha_pack_source src[4]) {
    const mha_config *c = &L->cfg;
    const size_t nq = (size_t)c->n_heads * c->d_k, nk = (size_t)c->n_kv_heads * c->d_k,
                 nv = (size_t)c->n_kv_heads * c->d_v;
    src[0] = (mha_pack_source){.w = L->w_q, .k_stride = nq, .n_stride = 1, .b = L->b_q};
    src[1] = (mha_pack_source){.w = L->w_k, .k_stride = nk, .n_stride = 1, .b = L->b_k};
    src[2] = (mha_pack_source){.w = L->w_v, .k_stride = nv, .n_stride = 1, .b = L->b_v};
    src[3] = (mha_pack_source){.w = L->w_o, .k_stride = (size_t)c->d_model, .n_stride = 1, .b = L->b_o};
}

mha_status mha_fast_prepare(mha_layer *L) {
    mha_pack_source src[4];
    own_source(L, src);
    return mha_fast_prepare_from(L, src);
}

mha_status mha_fast_replace(mha_layer *L) {
    mha_pack_source src[4];
    own_source(L, src);
    struct mha_fast_state *f;
    mha_status s = build(&f, L, src);
    if (s) return s; /* the old panels and version stay */
    mha_fast_release(L);
    L->fast = f;
    L->version = atomic_fetch_add(&last_version, 1) + 1;
    return MHA_OK;
}

int mha_fast_unpack(mha_layer *L) {
    const mha_config *c = &L->cfg;
    const struct mha_fast_state *f = L->fast;
    const size_t nq = (size_t)c->n_heads * c->d_k, nk = (size_t)c->n_kv_heads * c->d_k,
                 nv = (size_t)c->n_kv_heads * c->d_v;
    int finite = mha_packed_unpack(&f->o, 0, L->w_o, (size_t)c->d_model);
    if (f->fused)
        return finite & mha_packed_unpack(&f->qkv, 0, L->w_q, nq) & mha_packed_unpack(&f->qkv, 1, L->w_k, nk) &
               mha_packed_unpack(&f->qkv, 2, L->w_v, nv);
    finite &= mha_packed_unpack(&f->q, 0, L->w_q, nq) & mha_packed_unpack(&f->kv, 0, L->w_k, nk);
    return finite & (f->split_v ? mha_packed_unpack(&f->v, 0, L->w_v, nv) : mha_packed_unpack(&f->kv, 1, L->w_v, nv));
}

const mha_packed *mha_fast_packed_qkv(const mha_layer *L) {
    return L->fast && L->fast->fused ? &L->fast->qkv : NULL;
}

const mha_packed *mha_fast_packed_q(const mha_layer *L) {
    return !L->fast ? NULL : L->fast->fused ? &L->fast->qkv : &L->fast->q;
}

const mha_packed *mha_fast_packed_g(const mha_layer *L) {
    return L->fast && L->cfg.output_gate ? &L->fast->g : NULL;
}

const mha_packed *mha_fast_packed_o(const mha_layer *L) {
    return L->fast ? &L->fast->o : NULL;
}
