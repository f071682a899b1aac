/* audit_rope.c — `mha audit`'s rotary convention check.
 *
 * RoPE pairs dims i and i + r/2 of each head (halves: GPT-NeoX, Hugging
 * Face Llama) or 2i and 2i+1 (interleaved: GPT-J, Meta's Llama). The two
 * differ by a permutation P of each head's first r dims, the same for q
 * and k: halves(P q) = P interleaved(q), and scores, being dot products,
 * do not see P. So "the reference used the other pairing" and "W_Q/W_K
 * columns are stored in the other order" (the permutation Hugging Face's
 * Llama conversion applies) give the same Y: one run with the other
 * pairing detects both, and the same flag repairs both.
 * Legend: B, T, h, d_k, r = rope.dim (see mha.h). */
#include "audit_rope.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

static const char *pairing_name(mha_rope_pairing p) { return p == MHA_ROPE_HALVES ? "halves" : "interleaved"; }

int audit_rope_pairing(const mha_layer *L, const cli_fwd *f, const float *y_ref, size_t ny, double tol,
                       const char *weights) {
    const mha_config *c = mha_layer_config(L);
    if (c->rope.pairing == MHA_ROPE_NONE) return 0;
    mha_config other = *c;
    other.rope.pairing = c->rope.pairing == MHA_ROPE_HALVES ? MHA_ROPE_INTERLEAVED : MHA_ROPE_HALVES;
    mha_weights w;
    mha_layer_get_weights(L, &w);
    mha_layer *O = NULL;
    float *y = cli_alloc("audit", ny);
    if (!y) return -1; /* reported */
    mha_status s = mha_layer_create(&O, &other, &w);
    if (!s) s = mha_forward(O, y, NULL, f->x.f, f->kv.f, f->B, f->T, f->S, &f->opt);
    double err = 0;
    for (size_t i = 0; !s && i < ny; i++) {
        const double d = fabs((double)y[i] - (double)y_ref[i]);
        if (!(d <= err)) err = d;
    }
    mha_layer_free(O);
    free(y);
    if (s) {
        cli_fail("audit", s);
        return -1;
    }
    const char *have = pairing_name(c->rope.pairing), *want = pairing_name(other.rope.pairing);
    if (!(err <= tol)) {
        printf("rotary pairing: the other pairing (%s) does not explain it either (max |Y - Y_ref| = %.3g)\n",
               want, err);
        return 0;
    }
    printf("rotary convention mismatch: with %s pairing max |Y - Y_ref| = %.3g: the reference rotates dims "
           "%s, the checkpoint declares %s pairing (%s) -- or each head's W_Q/W_K columns are stored in the "
           "other order (Hugging Face's Llama conversion permutes them from interleaved to halves)\n",
           want, err, other.rope.pairing == MHA_ROPE_HALVES ? "(i, i + r/2)" : "(2i, 2i+1)", have,
           c->rope.pairing == MHA_ROPE_HALVES ? "(i, i + r/2)" : "(2i, 2i+1)");
    printf("fix: mha run --weights %s --rope %s ... (the flag overrides the checkpoint's pairing; the same "
           "flag serves both causes)\n", weights, want);
    return 1;
}
