/* api_test.c — libmha_mpi's C API given hostile or unsupported arguments
 * (run as `mpirun -np 2 build/mpi_api_test` by tests/mpi_test.sh): every
 * call returns the same status on every rank, with a message, and none
 * crashes or hangs. Legend: B, T, h, d_k, d_v, D = d_model. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mha_mpi.h"

static int fails = 0, checks = 0, rank = 0;

/* got == want, and on failure the call's line and message */
static void expect(mha_status got, mha_status want, const char *mention, int line) {
    checks++;
    const char *msg = mha_mpi_last_error();
    if (got != want || (mention && !strstr(msg, mention))) {
        fprintf(stderr, "FAIL rank %d line %d: status %d, want %d; message '%s', want it to mention '%s'\n", rank,
                line, (int)got, (int)want, msg, mention ? mention : "");
        fails++;
    }
}
#define EXPECT(call, want, mention) expect((call), (want), (mention), __LINE__)

/* max |y - want| over rank 0's y (B,T,D) above 1e-5: one failure naming what */
static void expect_close(const float *y, const float *want, size_t n, const char *what) {
    double err = 0.0;
    for (size_t i = 0; rank == 0 && i < n; i++) err = fmax(err, fabs((double)y[i] - want[i]));
    checks++;
    if (!(err <= 1e-5)) fprintf(stderr, "FAIL rank %d: %s: max |y - mha_forward| = %g\n", rank, what, err), fails++;
}

/* A gated GQA layer with biases (d_model D, h heads, g kv heads, d_k = D /
 * h): W_Q, W_K, W_V, W_O, W_G and the five biases, then x (nx floats),
 * filled in that order with ((k * mul % mod) - mod / 2) / div; bo (D) gets
 * b_O (mha_mpi_forward_heads adds it once). NULL after a failed create
 * (counted). */
static mha_layer *gated_layer(int D, int h, int g, float *x, size_t nx, float *bo, int mul, int mod, float div) {
    mha_config c = mha_config_default(D, h);
    c.n_kv_heads = g, c.output_gate = 1; /* bias on: b_G too */
    const size_t dk = (size_t)(D / h); /* W_Q, W_K, W_V, W_O, W_G, b_Q, b_K, b_V, b_O, b_G */
    const size_t n[10] = {D * h * dk, D * g * dk, D * g * dk, h * dk * D, D * h * dk, h * dk, g * dk, g * dk, D, h * dk};
    size_t total = 0;
    for (int a = 0; a < 10; a++) total += n[a];
    float *buf = malloc(sizeof(float) * total), *m[10];
    if (!buf) return NULL;
    long k = 0;
    for (int a = 0, at = 0; a < 10; at += (int)n[a], a++)
        for (size_t i = 0; i < n[a]; i++, k++) (m[a] = buf + at)[i] = (float)((k * mul % mod) - mod / 2) / div;
    for (size_t i = 0; i < nx; i++, k++) x[i] = (float)((k * mul % mod) - mod / 2) / div;
    mha_weights w = {.w_q = m[0], .w_k = m[1], .w_v = m[2], .w_o = m[3], .w_g = m[4], .b_q = m[5], .b_k = m[6],
                     .b_v = m[7], .b_o = m[8], .b_g = m[9]};
    memcpy(bo, w.b_o, sizeof(float) * (size_t)D);
    mha_layer *L = NULL;
    EXPECT(mha_layer_create(&L, &c, &w), MHA_OK, NULL);
    free(buf);
    return L;
}

/* Gated attention (config.output_gate), GQA with biases: the head split
 * of a layer in memory (mha_mpi_shard_heads: each shard takes W_G's and
 * b_G's column blocks of its heads), with its heads permuted first (W_G
 * moves with W_Q), and the ring (each rank gates its own rows), against
 * the single-process mha_forward of the unpermuted layer. */
static void gated(MPI_Comm comm) {
    enum { D = 8, H = 4, G = 2, B = 2, T = 8 };
    static float x[B * T * D], y[B * T * D], want[B * T * D], bo[D];
    mha_layer *L = gated_layer(D, H, G, x, B * T * D, bo, 37, 23, 17.0f), *local = NULL;
    mha_options o = mha_options_default();
    o.causal = 1;
    if (!L) return;
    EXPECT(mha_forward(L, want, NULL, x, NULL, B, T, T, &o), MHA_OK, NULL);
    const int perm[H] = {2, 3, 0, 1}; /* the kv groups swapped, whole */
    EXPECT(mha_layer_permute_heads(L, perm), MHA_OK, NULL);
    mha_mpi_heads hd;
    EXPECT(mha_mpi_shard_heads(&local, &hd, L, comm), MHA_OK, NULL);
    memset(y, 0, sizeof y);
    EXPECT(mha_mpi_forward_heads(local, &hd, bo, y, NULL, x, NULL, B, T, T, &o, comm, NULL), MHA_OK, NULL);
    expect_close(y, want, B * T * D, "gated layer, permuted heads, split by heads");
    memset(y, 0, sizeof y);
    EXPECT(mha_mpi_forward_sequence(L, y, NULL, x, NULL, B, T, T, &o, comm, NULL), MHA_OK, NULL);
    expect_close(y, want, B * T * D, "gated layer split by sequence");
    mha_layer_free(local), mha_layer_free(L);
}

/* A bf16 / int8 layer (gated, GQA, biases) split by heads in memory: each
 * shard keeps the layer's storage type (mha_mpi_shard_heads once gave an
 * fp32 shard: the same values, twice or four times the bytes), and the
 * heads' sum is mha_forward of the converted layer. */
static void compact(MPI_Comm comm) {
    enum { D = 48, H = 4, G = 2, DK = 12, B = 1, T = 6 }; /* DK = d_k = D / H */
    static float x[B * T * D], y[B * T * D], want[B * T * D], bo[D];
    const mha_weight_dtype types[2] = {MHA_W_BF16, MHA_W_I8};
    for (int t = 0; t < 2; t++) {
        mha_layer *L = gated_layer(D, H, G, x, B * T * D, bo, 41, 29, 23.0f), *local = NULL;
        if (!L) return;
        EXPECT(mha_layer_convert_weights(L, types[t]), MHA_OK, NULL);
        EXPECT(mha_forward(L, want, NULL, x, NULL, B, T, T, NULL), MHA_OK, NULL);
        mha_mpi_heads hd;
        EXPECT(mha_mpi_shard_heads(&local, &hd, L, comm), MHA_OK, NULL);
        checks++;
        if (!local || mha_layer_weights_dtype(local) != types[t])
            fprintf(stderr, "FAIL rank %d: the %s layer's shard is stored as %s\n", rank,
                    mha_weight_dtype_name(types[t]), local ? mha_weight_dtype_name(mha_layer_weights_dtype(local)) : "-"),
                fails++;
        /* the shard's stored values are the full layer's, bit for bit:
         * W_Q's and W_G's columns, W_O's rows of this rank's heads */
        mha_weights fw, lw;
        mha_layer_get_weights(L, &fw);
        int same = local != NULL;
        if (local) mha_layer_get_weights(local, &lw);
        for (int r = 0; same && r < D; r++)
            same = !memcmp(lw.w_q + (size_t)r * hd.count * DK, fw.w_q + (size_t)r * H * DK + (size_t)hd.first * DK,
                           sizeof(float) * hd.count * DK) &&
                   !memcmp(lw.w_g + (size_t)r * hd.count * DK, fw.w_g + (size_t)r * H * DK + (size_t)hd.first * DK,
                           sizeof(float) * hd.count * DK);
        same = same && !memcmp(lw.w_o, fw.w_o + (size_t)hd.first * DK * D, sizeof(float) * hd.count * DK * D);
        checks++;
        if (!same) fprintf(stderr, "FAIL rank %d: the %s shard's W_Q / W_G / W_O are not the layer's stored values\n",
                           rank, mha_weight_dtype_name(types[t])), fails++;
        memset(y, 0, sizeof y);
        EXPECT(mha_mpi_forward_heads(local, &hd, bo, y, NULL, x, NULL, B, T, T, NULL, comm, NULL), MHA_OK, NULL);
        expect_close(y, want, B * T * D, types[t] == MHA_W_I8 ? "int8 layer split by heads" : "bf16 layer split by heads");
        mha_layer_free(local), mha_layer_free(L);
    }
}

/* Ranks given layers or options that differ beyond the shapes: one agreed
 * MHA_E_SHAPE naming the configuration's checksum (P > 1). Before, the
 * head split's captures were gathered with counts that differ (an MPI
 * abort: a rank with add_zero_attn has one more key), the ring's ranks
 * ran another sequence of collectives (a hang: the extra keys' agreement
 * on one rank only), and a score scale or a bf16_matmul of one rank alone
 * gave a wrong y, silently; shard_heads of layers with other head counts
 * gathered labels with counts that differ (an abort). */
static void mismatched(MPI_Comm comm, int P) {
    enum { D = 8, H = 4, B = 1, T = 8 };
    static float x[B * T * D], y[B * T * D], probs[B * H * T * (T + 1)];
    for (int i = 0; i < B * T * D; i++) x[i] = (float)((i * 5 % 11) - 5) / 11.0f;
    const mha_status want = P > 1 ? MHA_E_SHAPE : MHA_OK;
    const char *named = P > 1 ? "checksum of the layer's configuration" : NULL;
    mha_config c = mha_config_default(D, H);
    c.add_zero_attn = rank == P - 1; /* the last rank's layer appends a zero key */
    mha_layer *L = NULL, *local = NULL;
    EXPECT(mha_layer_create(&L, &c, NULL), MHA_OK, NULL);
    mha_mpi_heads hd;
    EXPECT(mha_mpi_shard_heads(&local, &hd, L, comm), want, named);
    mha_layer_free(local), local = NULL;
    mha_config c1 = mha_config_default(D, H); /* the same layer everywhere, shards of it */
    mha_layer *L1 = NULL;
    EXPECT(mha_layer_create(&L1, &c1, NULL), MHA_OK, NULL);
    EXPECT(mha_mpi_shard_heads(&local, &hd, L1, comm), MHA_OK, NULL);
    mha_options o = mha_options_default();
    o.scale = rank == P - 1 ? 0.5f : 0.0f;
    mha_capture cap = {.probs = probs};
    if (local) EXPECT(mha_mpi_forward_heads(local, &hd, NULL, y, &cap, x, NULL, B, T, T, &o, comm, NULL), want, named);
    EXPECT(mha_mpi_forward_sequence(L1, y, NULL, x, NULL, B, T, T, &o, comm, NULL), want, named);
    EXPECT(mha_mpi_forward_sequence(L, y, NULL, x, NULL, B, T, T, NULL, comm, NULL), want, named);
    mha_cache *cache = NULL;
    if (local) EXPECT(mha_cache_create(&cache, local, B, 2 * T, MHA_CACHE_F32, 0), MHA_OK, NULL);
    mha_intervention iv[H] = {{0}};
    iv[1].op = rank == P - 1 ? MHA_HEAD_ZERO : MHA_HEAD_KEEP; /* the ablation of one rank only */
    o = mha_options_default();
    o.interventions = iv;
    if (cache) EXPECT(mha_mpi_forward_cached_heads(local, cache, &hd, NULL, y, x, B, T, &o, comm, NULL), want, named);
    /* x that differs on the last rank: each rank's heads read another input (y the sum of both, silently) */
    x[3] += rank == P - 1 ? 0.5f : 0.0f;
    if (local) EXPECT(mha_mpi_forward_heads(local, &hd, NULL, y, NULL, x, NULL, B, T, T, NULL, comm, NULL), want,
                      P > 1 ? "checksum of x" : NULL);
    if (cache) EXPECT(mha_mpi_forward_cached_heads(local, cache, &hd, NULL, y, x, B, T, NULL, comm, NULL), want,
                      P > 1 ? "checksum of x" : NULL);
    mha_cache_free(cache), mha_layer_free(local), mha_layer_free(L1), mha_layer_free(L);
    /* whole layers with other head counts: named by the count */
    mha_config c2 = mha_config_default(D, rank == P - 1 ? 2 * H : H);
    mha_layer *L2 = NULL;
    local = NULL;
    EXPECT(mha_layer_create(&L2, &c2, NULL), MHA_OK, NULL);
    EXPECT(mha_mpi_shard_heads(&local, &hd, L2, comm), want, P > 1 ? "h = " : NULL);
    mha_layer_free(local), mha_layer_free(L2);
}

/* Heads that are not the shard's, and shapes no call can take: refused by
 * name before any allocation. Before, the whole layer passed as the shard
 * ran (each rank summed every head: y P times too large, and a Z capture
 * overran its buffer), a first head out of range read the interventions
 * past their end (a crash), B = -1 asked malloc for 2^64 bytes ("no
 * memory"), and 2^31 floats of y were one MPI message whose int count
 * wraps. */
static void hostile_heads(MPI_Comm comm, const mha_layer *L, const float *x, float *y) {
    enum { D = 8, H = 4, T = 8 };
    mha_layer *local = NULL;
    mha_mpi_heads hd;
    EXPECT(mha_mpi_shard_heads(&local, &hd, L, comm), MHA_OK, NULL);
    if (!local) return;
    int P;
    MPI_Comm_size(comm, &P);
    static float z[T * H * 2];
    mha_capture cap = {.z = z};
    /* the whole layer with this rank's heads: P = 1's shard is the layer itself */
    EXPECT(mha_mpi_forward_heads(L, &hd, NULL, y, &cap, x, NULL, 1, T, T, NULL, comm, NULL),
           P > 1 ? MHA_E_ARG : MHA_OK, P > 1 ? "but the local layer has 4 heads" : NULL);
    mha_mpi_heads far = hd;
    far.first = 1000;
    mha_intervention iv[H] = {{0}};
    mha_options o = mha_options_default();
    o.interventions = iv;
    EXPECT(mha_mpi_forward_heads(local, &far, NULL, y, NULL, x, NULL, 1, T, T, &o, comm, NULL), MHA_E_ARG,
           "heads [1000, ");
    /* a mask of 2 heads of the 4: refused on any P (P = 2's shards, of 2 heads each, took it as theirs) */
    static float planes[2 * T * T]; /* 2 (T,T) planes: zero floats, or zero bytes (all masked) */
    o = mha_options_default();
    o.keep_mask = (mha_mask){planes, 1, 2};
    EXPECT(mha_mpi_forward_heads(local, &hd, NULL, y, NULL, x, NULL, 1, T, T, &o, comm, NULL), MHA_E_SHAPE,
           "keep_mask.heads=2; expected 1 (broadcast) or the whole layer's h=4");
    o.keep_mask = (mha_mask){0};
    o.additive_mask = (mha_mask){planes, 1, 2};
    EXPECT(mha_mpi_forward_heads(local, &hd, NULL, y, NULL, x, NULL, 1, T, T, &o, comm, NULL), MHA_E_SHAPE,
           "additive_mask.heads=2; expected 1 (broadcast) or the whole layer's h=4");
    o = mha_options_default();
    o.interventions = iv;
    mha_cache *cache = NULL;
    EXPECT(mha_cache_create(&cache, local, 1, T, MHA_CACHE_F32, 0), MHA_OK, NULL);
    EXPECT(mha_mpi_forward_cached_heads(local, cache, &far, NULL, y, x, 1, T, &o, comm, NULL), MHA_E_ARG,
           "heads [1000, ");
    EXPECT(mha_mpi_forward_cached_heads(local, cache, &hd, NULL, y, x, -1, T, NULL, comm, NULL), MHA_E_SHAPE,
           "B=-1 T=8; expected both >= 1");
    mha_cache_free(cache);
    EXPECT(mha_mpi_forward_heads(local, &hd, NULL, y, NULL, x, NULL, -1, T, T, NULL, comm, NULL), MHA_E_SHAPE,
           "B=-1 T=8 S=8; expected all >= 1");
    EXPECT(mha_mpi_forward_sequence(L, y, NULL, x, NULL, -1, T, T, NULL, comm, NULL), MHA_E_SHAPE,
           "B=-1; expected >= 1");
    /* 2^16 x 2^12 rows of d_model 8: 2^31 floats of y (x is never read) */
    EXPECT(mha_mpi_forward_heads(local, &hd, NULL, y, NULL, x, NULL, 1 << 16, 1 << 12, 1 << 12, NULL, comm, NULL),
           MHA_E_SHAPE, "expected at most 2147483647 (MPI's int count)");
    EXPECT(mha_mpi_forward_sequence(L, y, NULL, x, NULL, 1 << 16, 1 << 12, 1 << 12, NULL, comm, NULL), MHA_E_SHAPE,
           "expected at most 2147483647 (MPI's int count)");
    mha_layer_free(local);
}

/* Interventions of the whole layer checked as mha_forward checks them, by
 * global head, on both splits and decode, before any work. Before, the
 * ring applied them after its work: a REPLACE without value crashed it
 * (NULL read), a NaN value ran with MHA_OK; a shard named its local head
 * ("interventions[0]" for head 2 on rank 1 of 2). */
static void hostile_interventions(MPI_Comm comm, const mha_layer *L, const float *x, float *y) {
    enum { H = 4, T = 8, DV = 2 };
    mha_layer *local = NULL;
    mha_mpi_heads hd;
    EXPECT(mha_mpi_shard_heads(&local, &hd, L, comm), MHA_OK, NULL);
    mha_cache *cache = NULL;
    if (local) EXPECT(mha_cache_create(&cache, local, 1, T, MHA_CACHE_F32, 0), MHA_OK, NULL);
    static float value[T * DV];
    value[13] = NAN;
    const mha_intervention bad[4] = {{MHA_HEAD_REPLACE, 0.0f, NULL}, {(mha_head_op)99, 0.0f, NULL},
                                     {MHA_HEAD_SCALE, NAN, NULL}, {MHA_HEAD_REPLACE, 0.0f, value}};
    const mha_status want[4] = {MHA_E_ARG, MHA_E_ARG, MHA_E_NONFINITE, MHA_E_NONFINITE};
    const char *named[4] = {"interventions[2]: REPLACE needs value (B,T,d_v); got NULL",
                            "interventions[2].op=99; expected MHA_HEAD_KEEP..MHA_HEAD_REPLACE",
                            "interventions[2].scale=nan; expected finite",
                            "interventions[2].value[13] = nan; expected a finite number"};
    for (int k = 0; k < 4; k++) {
        mha_intervention iv[H] = {{0}};
        iv[2] = bad[k];
        mha_options o = mha_options_default();
        o.interventions = iv;
        EXPECT(mha_mpi_forward_sequence(L, y, NULL, x, NULL, 1, T, T, &o, comm, NULL), want[k], named[k]);
        if (local) EXPECT(mha_mpi_forward_heads(local, &hd, NULL, y, NULL, x, NULL, 1, T, T, &o, comm, NULL), want[k],
                          named[k]);
        if (cache) EXPECT(mha_mpi_forward_cached_heads(local, cache, &hd, NULL, y, x, 1, T, &o, comm, NULL), want[k],
                          named[k]);
    }
    mha_cache_free(cache), mha_layer_free(local);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    MPI_Comm comm = MPI_COMM_WORLD;
    MPI_Comm_rank(comm, &rank);
    enum { D = 8, H = 4, DK = 2, B = 1, T = 8 };
    mha_config c = mha_config_default(D, H);
    c.bias = 0;
    float wq[D * H * DK], wk[D * H * DK], wv[D * H * DK], wo[H * DK * D], x[B * T * D], y[B * T * D];
    for (int i = 0; i < D * H * DK; i++) wq[i] = wk[i] = wv[i] = wo[i] = (float)((i * 7 % 13) - 6) / 13.0f;
    for (int i = 0; i < B * T * D; i++) x[i] = (float)((i * 5 % 11) - 5) / 11.0f;
    mha_weights w = {.w_q = wq, .w_k = wk, .w_v = wv, .w_o = wo};
    mha_layer *L = NULL, *local = NULL;
    if (mha_layer_create(&L, &c, &w)) {
        fprintf(stderr, "mpi_api_test: mha_layer_create: %s\n", mha_last_error());
        MPI_Abort(comm, 1);
    }
    mha_mpi_heads hd;
    // --- NULL pointers and impossible counts
    EXPECT(mha_mpi_heads_of(&hd, &c, 0, 0), MHA_E_ARG, "P=0");
    /* chunks of P = 0 ranks, or of a rank outside 0..P-1: none (P = 0 divided by zero: SIGFPE) */
    int cs[2] = {7, 7}, cl[2] = {7, 7};
    mha_mpi_chunks_of(cs, cl, 8, 0, 0);
    mha_mpi_chunks_of(NULL, NULL, 8, 0, 2);
    checks++;
    if (cs[0] || cs[1] || cl[0] || cl[1]) fprintf(stderr, "FAIL rank %d: chunks of P = 0: %d+%d, %d+%d\n", rank, cs[0], cl[0], cs[1], cl[1]), fails++;
    mha_mpi_chunks_of(cs, cl, 8, 3, 2);
    checks++;
    if (cl[0] || cl[1]) fprintf(stderr, "FAIL rank %d: chunks of rank 3 of 2: %d, %d rows\n", rank, cl[0], cl[1]), fails++;
    mha_mpi_chunks_of(cs, cl, 10, 1, 2); /* chunks 1 and 2 of 4 of 10 rows: [2, 5), [5, 7) */
    checks++;
    if (cs[0] != 2 || cl[0] != 3 || cs[1] != 5 || cl[1] != 2) fprintf(stderr, "FAIL rank %d: chunks of rank 1 of 2\n", rank), fails++;
    EXPECT(mha_mpi_heads_of(NULL, &c, 0, 2), MHA_E_ARG, "NULL");
    EXPECT(mha_mpi_shard_heads(&local, &hd, NULL, comm), MHA_E_ARG, "NULL");
    mha_config lc; /* NULL outputs of the shard loader: refused (it wrote through them first: a segfault) */
    float *lbo = NULL;
    EXPECT(mha_mpi_load_heads(NULL, &hd, &lc, &lbo, "none.safetensors", NULL, comm), MHA_E_ARG, "NULL argument");
    EXPECT(mha_mpi_load_heads(&local, &hd, &lc, NULL, "none.safetensors", NULL, comm), MHA_E_ARG, "NULL argument");
    EXPECT(mha_mpi_load_heads(&local, &hd, &lc, &lbo, NULL, NULL, comm), MHA_E_ARG, "NULL argument");
    EXPECT(mha_mpi_shard_heads(&local, &hd, L, comm), MHA_OK, NULL);
    EXPECT(mha_mpi_forward_heads(NULL, &hd, NULL, y, NULL, x, NULL, B, T, T, NULL, comm, NULL), MHA_E_ARG, "NULL");
    EXPECT(mha_mpi_forward_heads(local, NULL, NULL, y, NULL, x, NULL, B, T, T, NULL, comm, NULL), MHA_E_ARG, "NULL");
    EXPECT(mha_mpi_forward_heads(local, &hd, NULL, y, NULL, x, NULL, B, T, T, NULL, comm, NULL), MHA_OK, NULL);
    EXPECT(mha_mpi_forward_sequence(NULL, y, NULL, x, NULL, B, T, T, NULL, comm, NULL), MHA_E_ARG, "NULL");
    EXPECT(mha_mpi_forward_sequence(L, y, NULL, NULL, NULL, B, T, T, NULL, comm, NULL), MHA_E_ARG, "NULL");
    EXPECT(mha_mpi_forward_sequence(L, NULL, NULL, x, NULL, B, T, T, NULL, comm, NULL), MHA_E_ARG, "NULL");
    long long v[33] = {0};
    const char *names[33] = {0};
    EXPECT(mha_mpi_check_same(comm, v, 33, names), MHA_E_ARG, "expected 0..32");
    int P;
    MPI_Comm_size(comm, &P);
    EXPECT(mha_mpi_check_same(comm, v, rank ? 2 : 3, names), P > 1 ? MHA_E_ARG : MHA_OK, P > 1 ? "the same n" : NULL);
    // --- a window with a sink key on the ring: rank 0's y is mha_forward's
    // (query 7 sees keys 5..7 and key 0, whose chunk is otherwise skipped)
    mha_options o = mha_options_default();
    o.causal = 1, o.window_left = 2, o.sink_tokens = 1;
    float want[B * T * D];
    EXPECT(mha_forward(L, want, NULL, x, NULL, B, T, T, &o), MHA_OK, NULL);
    EXPECT(mha_mpi_forward_sequence(L, y, NULL, x, NULL, B, T, T, &o, comm, NULL), MHA_OK, NULL);
    double err = 0.0;
    for (int i = 0; rank == 0 && i < B * T * D; i++) err = fmax(err, fabs((double)y[i] - want[i]));
    checks++;
    if (err > 1e-5) fprintf(stderr, "FAIL rank %d: sink keys on the ring: max |y - mha_forward| = %g\n", rank, err), fails++;
    o.window_left = -1; /* sink keys without a window: refused as mha_forward refuses them */
    EXPECT(mha_mpi_forward_sequence(L, y, NULL, x, NULL, B, T, T, &o, comm, NULL), MHA_E_ARG, "sink_tokens=1");
    o.window_left = rank ? 3 : 2; /* options differ between ranks: refused on every rank */
    EXPECT(mha_mpi_forward_sequence(L, y, NULL, x, NULL, B, T, T, &o, comm, NULL), P > 1 ? MHA_E_SHAPE : MHA_OK,
           P > 1 ? "window_left" : NULL);
    // --- what the ring does not do: refused, not ignored
    o = mha_options_default();
    o.bf16_matmul = 1;
    EXPECT(mha_mpi_forward_sequence(L, y, NULL, x, NULL, B, T, T, &o, comm, NULL), MHA_E_UNSUPPORTED, "bf16_matmul");
    const int cu[3] = {0, 3, T}; /* packed sequences: the ring cuts rows by position */
    o = mha_options_default();
    o.cu_seqlens = cu, o.n_seqs = 2;
    EXPECT(mha_mpi_forward_sequence(L, y, NULL, x, NULL, B, T, T, &o, comm, NULL), MHA_E_UNSUPPORTED, "cu_seqlens");
    o = mha_options_default(); /* training's dropout: its draw is by the whole layer's head and row */
    o.dropout_p = 0.1f;
    EXPECT(mha_mpi_forward_sequence(L, y, NULL, x, NULL, B, T, T, &o, comm, NULL), MHA_E_UNSUPPORTED, "dropout_p");
    EXPECT(mha_mpi_forward_heads(local, &hd, NULL, y, NULL, x, NULL, B, T, T, &o, comm, NULL), MHA_E_UNSUPPORTED,
           "dropout_p");
    hostile_heads(comm, L, x, y);
    hostile_interventions(comm, L, x, y);
    /* the ring checks the masks whole, as mha_forward: a NaN in a tile the causal mask skips (query 0,
     * key 7) ran with MHA_OK, an error named the tile's index, a batch of 3 was read as 3 (T,S) planes */
    static float am[T * T], ka[T];
    static uint8_t km[3 * T * T];
    o = mha_options_default();
    o.causal = 1;
    am[7] = NAN;
    o.additive_mask = (mha_mask){am, 1, 1};
    EXPECT(mha_mpi_forward_sequence(L, y, NULL, x, NULL, B, T, T, &o, comm, NULL), MHA_E_NONFINITE,
           "additive_mask[7] = nan; expected a finite number or -inf");
    o.additive_mask = (mha_mask){0};
    ka[7] = INFINITY;
    o.key_additive = ka;
    EXPECT(mha_mpi_forward_sequence(L, y, NULL, x, NULL, B, T, T, &o, comm, NULL), MHA_E_NONFINITE,
           "key_additive[7] = inf");
    o.key_additive = NULL;
    o.keep_mask = (mha_mask){km, 3, 1};
    EXPECT(mha_mpi_forward_sequence(L, y, NULL, x, NULL, B, T, T, &o, comm, NULL), MHA_E_SHAPE,
           "keep_mask.batch=3; expected 1 (broadcast) or B=1");
    x[5 * D + 3] = NAN; /* row 5: rank 1's chunk for P = 2, rank 0's for P = 1 */
    EXPECT(mha_mpi_forward_sequence(L, y, NULL, x, NULL, B, T, T, NULL, comm, NULL), MHA_E_NONFINITE, "x[0][5][3]");
    mha_layer_free(local), mha_layer_free(L);
    gated(comm);
    compact(comm);
    mismatched(comm, P);
    if (rank == 0) printf("mpi_api_test: %d checks, %d failed\n", checks, fails);
    int any = fails;
    MPI_Allreduce(MPI_IN_PLACE, &any, 1, MPI_INT, MPI_MAX, comm);
    MPI_Finalize();
    return any ? 1 : 0;
}
