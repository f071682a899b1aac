/* demo_variants.c — section 8 of `mha demo`: today's attention variants
 * and the head contract. ALiBi slopes and sink logits are parameters of a
 * head: they move with mha_layer_permute_heads (Y unchanged), and moving
 * them alone changes Y and is caught by the contract check. RoPE's two
 * pairings are two functions, and they differ by one permutation of each
 * head's q/k dims: the same weights stored in the other order give the
 * other pairing's result, which is what `mha audit` recognizes.
 * Legend: T tokens, h heads, d_k, d_model (see mha.h). */
#include <stdio.h>
#include <stdlib.h>

#include "demo.h"

enum { T = 6, D = 8, H = 4, DK = 2 };

/* A causal forward of x (T, D) through L into y. */
static mha_status run(const mha_layer *L, float *y, const float *x) {
    mha_options o = mha_options_default();
    o.causal = 1;
    return mha_forward(L, y, NULL, x, NULL, 1, T, T, &o);
}

static int section_alibi_sinks(mha_demo *d, const float *w, const float *x) {
    mha_config c = mha_config_default(D, H);
    c.bias = 0, c.alibi = 1, c.sinks = 1;
    const float sinks[H] = {0.5f, -1.0f, 1.5f, 0.0f};
    mha_weights wt = {.w_q = w, .w_k = w + D * D, .w_v = w + 2 * D * D, .w_o = w + 3 * D * D, .sinks = sinks};
    mha_layer *L = NULL;
    MHA_DEMO_TRY(mha_layer_create(&L, &c, &wt));
    float y[T * D], yp[T * D], slopes[H];
    const int perm[H] = {2, 0, 3, 1};
    mha_weights view;
    mha_status s = run(L, y, x);
    if (!s) mha_layer_get_weights(L, &view);
    if (!s) {
        for (int r = 0; r < H; r++) slopes[r] = view.alibi_slopes[r];
        printf("ALiBi adds -slope_r * |i - j| to head r's scores; the paper's slopes for 4 heads\n"
               "and a learned sink logit per head (gpt-oss) belong to their heads:\n");
        mha_demo_vec("slopes", slopes, H);
        mha_demo_vec("sinks ", sinks, H);
        s = mha_layer_permute_heads(L, perm);
    }
    if (!s) s = run(L, yp, x);
    if (!s) {
        mha_layer_get_weights(L, &view);
        printf("\nmha_layer_permute_heads(L, [2, 0, 3, 1]) moves them with W_Q, W_K, W_V and W_O:\n");
        mha_demo_vec("slopes", view.alibi_slopes, H);
        mha_demo_vec("sinks ", view.sinks, H);
        mha_demo_check(d, "Y after permuting the heads equals Y before", mha_demo_max_diff(y, yp, T * D), 1e-5, 1);
        s = mha_layer_permute_block(L, MHA_BLOCK_S, perm); /* the slopes and sinks alone */
    }
    if (!s) s = run(L, yp, x);
    if (!s) {
        printf("\nMoving the slopes and sinks alone pairs each head's projections with another's:\n");
        mha_demo_check(d, "Y changes", mha_demo_max_diff(y, yp, T * D), 1e-3, 0);
        mha_contract_report rep;
        mha_status cs = mha_layer_check_contract(L, NULL, NULL, 0, 0, 0, NULL, &rep);
        printf("  contract check: %s\n", cs == MHA_E_CONTRACT ? mha_last_error() : "passed");
        mha_demo_check_that(d, "the contract check reports the score-parameter block", cs == MHA_E_CONTRACT);
    }
    mha_layer_free(L);
    return s ? mha_demo_lib_error("section 8 (ALiBi, sinks)", s) : 0;
}

/* out (D, heads*dk) = w with each head's columns reordered as Hugging
 * Face's Llama conversion does: dim 2i goes to i, 2i+1 to i + dk/2. */
static void hf_order(float *out, const float *w, int heads, int dk) {
    for (int i = 0; i < D; i++)
        for (int r = 0; r < heads; r++)
            for (int e = 0; e < dk; e++) {
                const int src = e % 2 == 0 ? e / 2 : dk / 2 + e / 2; /* interleaved dim e sits at src in halves */
                out[(size_t)i * heads * dk + r * dk + src] = w[(size_t)i * heads * dk + r * dk + e];
            }
}

static int section_rope(mha_demo *d, const float *w, const float *x) {
    mha_config c = mha_config_default(D, 2); /* d_k = 4: two rotated pairs per head */
    c.bias = 0, c.rope.pairing = MHA_ROPE_INTERLEAVED;
    float wq[D * D], wk[D * D], y_int[T * D], y_half[T * D], y_perm[T * D];
    hf_order(wq, w, 2, 4);
    hf_order(wk, w + D * D, 2, 4);
    mha_weights meta = {.w_q = w, .w_k = w + D * D, .w_v = w + 2 * D * D, .w_o = w + 3 * D * D};
    mha_weights hf = meta;
    hf.w_q = wq, hf.w_k = wk;
    mha_layer *A = NULL, *B = NULL, *C = NULL;
    mha_status s = mha_layer_create(&A, &c, &meta);
    c.rope.pairing = MHA_ROPE_HALVES;
    if (!s) s = mha_layer_create(&B, &c, &meta);
    if (!s) s = mha_layer_create(&C, &c, &hf);
    if (!s) s = run(A, y_int, x);
    if (!s) s = run(B, y_half, x);
    if (!s) s = run(C, y_perm, x);
    if (!s) {
        printf("\nRoPE rotates pairs of each head's q and k dims by position * frequency:\n"
               "interleaved pairs (2i, 2i+1) (GPT-J, Meta's Llama), halves pairs (i, i + d/2)\n"
               "(GPT-NeoX, Hugging Face Llama). The same weights give another layer:\n");
        mha_demo_check(d, "Y(interleaved) differs from Y(halves)", mha_demo_max_diff(y_int, y_half, T * D), 1e-3, 0);
        printf("\nHugging Face's conversion moves W_Q/W_K dim 2i to i and 2i+1 to i + d/2 in each head.\n"
               "Rotations and dot products do not see that move, so halves on the moved weights\n"
               "is interleaved on the original ones:\n");
        mha_demo_check(d, "Y(halves, moved W_Q/W_K) equals Y(interleaved)", mha_demo_max_diff(y_int, y_perm, T * D),
                       1e-5, 1);
        printf("  So a checkpoint that reproduces its reference only with the other pairing was\n"
               "  written for it, or with its columns in the other order: `mha audit` reports\n"
               "  \"rotary convention mismatch\" and one flag, --rope, repairs either.\n");
    }
    mha_layer_free(A), mha_layer_free(B), mha_layer_free(C);
    return s ? mha_demo_lib_error("section 8 (RoPE)", s) : 0;
}

int mha_demo_variants(mha_demo *d) {
    mha_demo_banner("8. Today's variants keep the head contract");
    float *w = malloc(sizeof(float) * 4 * D * D), x[T * D];
    if (!w) return mha_demo_lib_error("malloc", MHA_E_NOMEM);
    uint64_t seed = 13;
    mha_demo_fill_uniform(w, 4 * D * D, &seed, -0.8f, 0.8f);
    mha_demo_fill_uniform(x, T * D, &seed, -1.0f, 1.0f);
    int rc = section_alibi_sinks(d, w, x) || section_rope(d, w, x);
    free(w);
    return rc;
}
