/* test_packed.c — packed sequences (options.cu_seqlens, FlashAttention's
 * varlen): rows cu[s] .. cu[s+1]-1 form sequence s and attend only each
 * other. Two oracles that need no second statement of the rule's code:
 * the same layer with the block-diagonal mask written out by hand as a
 * (T,T) keep mask, and each sequence run alone as a batch of its own. The
 * reference and the fast path on every ISA, forward and backward (and the
 * tape), then the refusals.
 * Legend: B batch rows (each packed the same way), T packed rows, h, h_kv,
 * D = d_model; n sequences. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"
#include "naive.h"
#include "tests.h"

enum { D = 32, H = 4, HKV = 2, B = 2 };

typedef struct {
    int T, n, cu[8];
    int causal, window, variant; /* variant: 0 plain, 1 RoPE + GQA, 2 ALiBi + softcap, 3 sinks + QK-norm */
} packed_case;

static const packed_case cases_[] = {
    {10, 3, {0, 3, 7, 10}, 1, -1, 0},
    {10, 3, {0, 3, 7, 10}, 0, -1, 1},
    {70, 4, {0, 1, 30, 31, 70}, 1, -1, 2},  /* one-row sequences, tiles across boundaries */
    {70, 4, {0, 1, 30, 31, 70}, 0, 5, 3},   /* a window inside each */
    {130, 2, {0, 65, 130}, 1, 7, 1},
    {9, 1, {0, 9}, 1, -1, 0},               /* one sequence: the plain layer */
};

static mha_layer *packed_layer(int variant, uint64_t seed) {
    mha_config c = naive_config(D, H, variant == 1 ? HKV : H, 0, 0, 1);
    if (variant == 1) c.rope.pairing = MHA_ROPE_HALVES, c.rope.theta = 100.0;
    if (variant == 2) c.alibi = 1, c.softcap = 3.0f;
    if (variant == 3) c.sinks = 1, c.qk_norm = MHA_QK_NORM_RMS, c.qk_norm_per_head = 1;
    mha_config r = naive_resolve(c);
    naive_weights w;
    naive_weights_random(&w, &r, &seed, 0.5f);
    mha_layer *L = naive_make_layer(&w);
    naive_weights_free(&w);
    return L;
}

/* (T,T) keep mask: 1 where query i and key j are in one sequence. */
static uint8_t *block_keep(const packed_case *k) {
    uint8_t *m = calloc((size_t)k->T * k->T, 1);
    for (int s = 0; m && s < k->n; s++)
        for (int i = k->cu[s]; i < k->cu[s + 1]; i++)
            for (int j = k->cu[s]; j < k->cu[s + 1]; j++) m[(size_t)i * k->T + j] = 1;
    return m;
}

static mha_options case_options(const packed_case *k) {
    mha_options o = mha_options_default();
    o.causal = k->causal, o.window_left = k->window;
    return o;
}

/* Both paths with cu_seqlens against the reference with the hand mask;
 * and against each sequence run alone (positions restarting, as the
 * packed call is given them). */
static void packed_matches_hand_mask_and_alone(void) {
    for (size_t n = 0; n < sizeof cases_ / sizeof cases_[0]; n++) {
        const packed_case *k = &cases_[n];
        mha_layer *L = packed_layer(k->variant, 40 + n);
        const size_t ny = (size_t)B * k->T * D;
        uint64_t seed = 50 + n;
        float *x = naive_random_floats(ny, &seed, -1, 1), *want = naive_alloc_floats(ny), *got = naive_alloc_floats(ny);
        float *alone = naive_alloc_floats(ny);
        uint8_t *keep = block_keep(k);
        int *pos = malloc(sizeof(int) * B * k->T); /* (B,T) each sequence from 0 */
        for (int b = 0; b < B; b++)
            for (int s = 0; s < k->n; s++)
                for (int i = k->cu[s]; i < k->cu[s + 1]; i++) pos[b * k->T + i] = i - k->cu[s];
        const int positioned = k->variant == 1 || k->variant == 2;
        mha_options o = case_options(k);
        if (positioned) o.positions = pos;
        if (L && keep) {
            mha_options m = o;
            m.keep_mask = (mha_mask){keep, 1, 1}, m.path = MHA_PATH_REFERENCE;
            CHECK_OK(mha_forward(L, want, NULL, x, NULL, B, k->T, k->T, &m));
            o.cu_seqlens = k->cu, o.n_seqs = k->n;
            for (int path = 0; path < 2; path++) {
                o.path = path ? MHA_PATH_FAST : MHA_PATH_REFERENCE;
                CHECK_OK(mha_forward(L, got, NULL, x, NULL, B, k->T, k->T, &o));
                const double e = test_max_rel_diff(got, want, ny);
                if (!(e <= 2e-6))
                    test_report(__FILE__, __LINE__, "case %zu %s: %.3g from the hand mask (kernels=%s)", n,
                                path ? "fast" : "reference", e, mha_kernels_get()->name);
            }
            /* each sequence alone (fast path), rows copied into place */
            for (int b = 0; b < B; b++)
                for (int s = 0; s < k->n; s++) {
                    const int len = k->cu[s + 1] - k->cu[s];
                    const size_t at = ((size_t)b * k->T + k->cu[s]) * D;
                    mha_options a = case_options(k);
                    if (positioned) a.positions = pos + b * k->T + k->cu[s];
                    CHECK_OK(mha_forward(L, alone + at, NULL, x + at, NULL, 1, len, len, &a));
                }
            const double e = test_max_rel_diff(got, alone, ny);
            if (!(e <= 2e-6)) test_report(__FILE__, __LINE__, "case %zu: %.3g from the sequences run alone", n, e);
            /* mha_forward_lse: the same y, and each row's log-sum-exp that of its sequence alone */
            float *lse = naive_alloc_floats((size_t)B * H * k->T), *lse1 = naive_alloc_floats((size_t)B * H * k->T);
            o.path = MHA_PATH_AUTO;
            CHECK_OK(mha_forward_lse(L, got, NULL, lse, x, NULL, NULL, B, k->T, k->T, &o));
            CHECK(test_max_rel_diff(got, alone, ny) <= 2e-6);
            for (int b = 0; b < B; b++)
                for (int s = 0; s < k->n; s++) {
                    const int len = k->cu[s + 1] - k->cu[s];
                    float part[H * 130];
                    mha_options a = case_options(k);
                    if (positioned) a.positions = pos + b * k->T + k->cu[s];
                    CHECK_OK(mha_forward_lse(L, alone, NULL, part, x + ((size_t)b * k->T + k->cu[s]) * D, NULL, NULL, 1,
                                             len, len, &a));
                    for (int r = 0; r < H; r++)
                        for (int i = 0; i < len; i++)
                            lse1[((size_t)b * H + r) * k->T + k->cu[s] + i] = part[(size_t)r * len + i];
                }
            CHECK(test_max_rel_diff(lse, lse1, (size_t)B * H * k->T) <= 2e-6);
            free(lse), free(lse1);
            if (k->n > 1) { /* the packing matters */
                o.cu_seqlens = NULL, o.n_seqs = 0;
                CHECK_OK(mha_forward(L, got, NULL, x, NULL, B, k->T, k->T, &o));
                CHECK(test_max_abs_diff(got, want, ny) > 1e-3);
            }
        }
        free(x), free(want), free(got), free(alone), free(keep), free(pos);
        mha_layer_free(L);
    }
}

/* Gradients with cu_seqlens (the reference and fast backward, and the
 * tape) against the reference backward with the hand mask. */
static void packed_backward_matches_hand_mask(void) {
    for (size_t n = 0; n < sizeof cases_ / sizeof cases_[0]; n += 2) {
        const packed_case *k = &cases_[n];
        mha_layer *L = packed_layer(k->variant, 80 + n);
        const mha_config *c = L ? mha_layer_config(L) : NULL;
        const size_t ny = (size_t)B * k->T * D;
        uint64_t seed = 90 + n;
        float *x = naive_random_floats(ny, &seed, -1, 1), *dy = naive_random_floats(ny, &seed, -1, 1);
        float *y = naive_alloc_floats(ny);
        uint8_t *keep = block_keep(k);
        float *dx[4], *dwq[4];
        for (int v = 0; v < 4; v++) dx[v] = naive_alloc_floats(ny), dwq[v] = naive_alloc_floats((size_t)D * D);
        if (L && c && keep) {
            mha_options m = case_options(k);
            m.keep_mask = (mha_mask){keep, 1, 1}, m.path = MHA_PATH_REFERENCE;
            mha_gradients g;
            memset(&g, 0, sizeof g);
            g.dx = dx[0], g.dw_q = dwq[0];
            CHECK_OK(mha_backward(L, &g, dy, x, NULL, B, k->T, k->T, &m));
            mha_options o = case_options(k);
            o.cu_seqlens = k->cu, o.n_seqs = k->n;
            for (int v = 1; v < 3; v++) {
                o.path = v == 1 ? MHA_PATH_REFERENCE : MHA_PATH_FAST;
                g.dx = dx[v], g.dw_q = dwq[v];
                CHECK_OK(mha_backward(L, &g, dy, x, NULL, B, k->T, k->T, &o));
            }
            mha_tape *tape = NULL;
            o.path = MHA_PATH_AUTO;
            CHECK_OK(mha_forward_train(L, y, &tape, x, NULL, NULL, B, k->T, k->T, &o));
            g.dx = dx[3], g.dw_q = dwq[3];
            if (tape) CHECK_OK(mha_backward_tape(L, tape, &g, dy, x, NULL, NULL, B, k->T, k->T, &o));
            mha_options other = o;
            other.cu_seqlens = NULL, other.n_seqs = 0;
            if (tape) CHECK_STATUS(mha_backward_tape(L, tape, &g, dy, x, NULL, NULL, B, k->T, k->T, &other), MHA_E_ARG);
            CHECK_ERROR_MENTIONS("cu_seqlens");
            mha_tape_free(tape);
            for (int v = 1; v < 4; v++) {
                const double ex = test_max_rel_diff(dx[v], dx[0], ny), ew = test_max_rel_diff(dwq[v], dwq[0], (size_t)D * D);
                if (!(ex <= 1e-5 && ew <= 1e-5))
                    test_report(__FILE__, __LINE__, "case %zu %s: dx %.3g, dW_Q %.3g from the hand mask (kernels=%s)",
                                n, v == 1 ? "reference" : v == 2 ? "fast" : "tape", ex, ew, mha_kernels_get()->name);
            }
        }
        for (int v = 0; v < 4; v++) free(dx[v]), free(dwq[v]);
        free(x), free(dy), free(y), free(keep);
        mha_layer_free(L);
    }
}

static void packed_refusals(void) {
    mha_layer *L = packed_layer(0, 5);
    float x[2 * 4 * D] = {0}, y[2 * 4 * D], kv[2 * 5 * D] = {0};
    mha_options o = mha_options_default();
    struct {
        int cu[4], n, T, S;
        const char *says;
    } bad[] = {
        {{0, 2, 4}, 0, 4, 4, "cu_seqlens is given with n_seqs=0"},
        {{1, 2, 4}, 2, 4, 4, "cu_seqlens[0]=1, [n_seqs=2]=4; expected 0 and T=4"},
        {{0, 2, 3}, 2, 4, 4, "[n_seqs=2]=3; expected 0 and T=4"},
        {{0, 2, 2, 4}, 3, 4, 4, "cu_seqlens[2]=2 after [1]=2; expected strictly increasing"},
        {{0, 2, 4}, 2, 4, 5, "with T=4 queries and S=5 keys; expected packed self-attention"},
    };
    for (size_t i = 0; L && i < sizeof bad / sizeof bad[0]; i++) {
        o.cu_seqlens = bad[i].cu, o.n_seqs = bad[i].n;
        CHECK_STATUS(mha_forward(L, y, NULL, x, bad[i].S != bad[i].T ? kv : NULL, 2, bad[i].T, bad[i].S, &o), MHA_E_ARG);
        CHECK_ERROR_MENTIONS(bad[i].says);
    }
    const int cu[3] = {0, 2, 4};
    o = mha_options_default();
    o.n_seqs = 2;
    if (L) CHECK_STATUS(mha_forward(L, y, NULL, x, NULL, 2, 4, 4, &o), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("cu_seqlens is NULL with n_seqs=2");
    o.cu_seqlens = cu, o.chunk_size = 2;
    if (L) CHECK_STATUS(mha_forward(L, y, NULL, x, NULL, 2, 4, 4, &o), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("cu_seqlens with chunk_size");
    o.chunk_size = 0, o.window_left = 1, o.sink_tokens = 1;
    if (L) CHECK_STATUS(mha_forward(L, y, NULL, x, NULL, 2, 4, 4, &o), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("cu_seqlens with sink_tokens");
    mha_cache *cache = NULL;
    if (L) CHECK_OK(mha_cache_create(&cache, L, 2, 8, MHA_CACHE_F32, 0));
    o.window_left = -1, o.sink_tokens = 0;
    if (cache) CHECK_STATUS(mha_forward_cached(L, cache, y, NULL, x, 4, NULL, &o), MHA_E_UNSUPPORTED);
    CHECK_ERROR_MENTIONS("options.cu_seqlens is not supported with a KV cache");
    if (cache) CHECK_INT(mha_cache_length(cache, 0), 0);
    mha_cache_free(cache);
    mha_layer_free(L);
}

static const test_case cases[] = {
    {"packed_refusals", packed_refusals},
};

static const test_case isa_cases[] = {
    {"packed_matches_hand_mask_and_alone", packed_matches_hand_mask_and_alone},
    {"packed_backward_matches_hand_mask", packed_backward_matches_hand_mask},
};

const test_case *tests_packed(size_t *count) {
    *count = sizeof cases / sizeof cases[0];
    return cases;
}

const test_case *tests_packed_isa(size_t *count) {
    *count = sizeof isa_cases / sizeof isa_cases[0];
    return isa_cases;
}
