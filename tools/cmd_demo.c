/* cmd_demo.c — `mha demo`: the seeds' worked examples, step by step.
 *
 * Sections 1-5 replay the lesson's small vectors (two heads of width
 * d_v = 2, one query position, so every Z and Y here is (1, h*d_v) or
 * (1, d_model)). Sections 6-7 (demo_layer.c) run a real layer. Only the
 * inputs are constants; every printed result is computed by libmha and
 * the claims of the lesson are checked, so the demo exits 1 if the
 * library disagrees with them.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "args.h"
#include "commands.h"
#include "demo.h"

/* ------------------------------------------------------------ helpers */

void mha_demo_banner(const char *title) { printf("\n=== %s ===\n", title); }

/* 3 decimals like the seeds; a tiny negative prints as 0.000, not -0.000 */
static void put(float x) { printf("%.3f", fabsf(x) < 0.0005f ? 0.0f : x); }

void mha_demo_vec(const char *label, const float *v, int n) {
    printf("  %s = [", label);
    for (int i = 0; i < n; i++) {
        if (i) printf(", ");
        put(v[i]);
    }
    printf("]\n");
}

void mha_demo_mat(const char *label, const float *m, int rows, int cols) {
    printf("  %s =\n", label);
    for (int i = 0; i < rows; i++) {
        printf("    [");
        for (int j = 0; j < cols; j++) {
            if (j) printf(", ");
            float x = m[(size_t)i * cols + j];
            if (!(x < 0)) printf(" "); /* align signs */
            put(x);
        }
        printf("]\n");
    }
}

void mha_demo_shape(const char *name, const char *sym, int nd, const int *dims) {
    printf("  %-30s %-22s (", name, sym);
    for (int i = 0; i < nd; i++) printf("%s%d", i ? ", " : "", dims[i]);
    printf(")\n");
}

void mha_demo_labels(const char *label, const int *labels, int n) {
    printf("  %-22s [", label);
    for (int i = 0; i < n; i++) printf("%s%d", i ? ", " : "", labels[i]);
    printf("]\n");
}

double mha_demo_max_diff(const float *a, const float *b, int n) {
    double m = 0.0;
    for (int i = 0; i < n; i++) {
        double e = fabs((double)a[i] - (double)b[i]);
        if (e != e) return INFINITY;
        if (e > m) m = e;
    }
    return m;
}

void mha_demo_check(mha_demo *d, const char *what, double diff, double tol, int want_equal) {
    int ok = want_equal ? diff <= tol : diff > tol;
    d->checks++;
    if (!ok) d->failed++;
    printf("  check: %s: max |diff| = %.1e %s\n", what, diff, ok ? "ok" : "FAILED");
}

void mha_demo_check_that(mha_demo *d, const char *what, int holds) {
    d->checks++;
    if (!holds) d->failed++;
    printf("  check: %s: %s\n", what, holds ? "ok" : "FAILED");
}

int mha_demo_lib_error(const char *call, mha_status s) {
    return mha_cmd_error("demo", MHA_EXIT_RUNTIME, "%s failed: %s: %s", call, mha_status_str(s),
                         mha_last_error());
}

/* Row block r of a (n*d, cols) matrix is rows [r*d, (r+1)*d): swapping the
 * two blocks of W_O is P^T W_O for the head-swap permutation P. */
static void swap_row_blocks(float *out, const float *w, int d, int cols) {
    size_t block = (size_t)d * cols;
    memcpy(out, w + block, block * sizeof *w);
    memcpy(out + block, w, block * sizeof *w);
}

/* The seed's mixing W_O (h*d_v, d_model) = (4, 4): each output keeps its
 * own head's feature and adds half of the other head's same feature. */
static const float seed_w_o[16] = {
    1, 0, 0.5f, 0,
    0, 1, 0, 0.5f,
    0.5f, 0, 1, 0,
    0, 0.5f, 0, 1,
};
static const float identity4[16] = {1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1};

/* ------------------------------------- 1. the two-head trace (seed 000) */

static int section_trace(mha_demo *d, float *z, float *y) {
    mha_demo_banner("1. Concatenate the head outputs, then project once");
    printf("After attention, the final query position (token 3) has one result per head,\n"
           "each of width d_v = 2:\n");
    const float head1[2] = {0.752f, 0.752f};  /* z_3^(1) (1, d_v) */
    const float head2[2] = {-0.546f, 0.926f}; /* z_3^(2) (1, d_v) */
    const float *heads[2] = {head1, head2};
    mha_demo_vec("z_3^(1)", head1, 2);
    mha_demo_vec("z_3^(2)", head2, 2);

    printf("\nConcatenation keeps each head as its own block of features (head 1 first):\n");
    MHA_DEMO_TRY(mha_concat_heads(z, heads, NULL, 2, 1, 2)); /* z (1, h*d_v) */
    mha_demo_vec("z_3 = Concat(z_3^(1), z_3^(2))", z, 4);

    float y_id[4]; /* (1, d_model) */
    MHA_DEMO_TRY(mha_project_out(y_id, z, identity4, NULL, 1, 4, 4));
    printf("\nWith W_O = I the layer returns the concatenation unchanged:\n");
    mha_demo_vec("z_3 I", y_id, 4);
    mha_demo_check(d, "z_3 I equals z_3", mha_demo_max_diff(y_id, z, 4), 0.0, 1);

    printf("\nA W_O that mixes the heads (rows = input features, columns = outputs):\n");
    mha_demo_mat("W_O", seed_w_o, 4, 4);
    MHA_DEMO_TRY(mha_project_out(y, z, seed_w_o, NULL, 1, 4, 4)); /* y (1, d_model) */
    mha_demo_vec("y_3 = z_3 W_O", y, 4);
    printf("  y_3[0] = head 1's first feature + 0.5 * head 2's first feature;\n"
           "  y_3[3] = 0.5 * head 1's second feature + head 2's second feature.\n"
           "  Attention weights stay per head; W_O mixes the features they produced.\n");
    return 0;
}

/* ----------------------------- 2. head order is a coordinate convention */

static int section_order(mha_demo *d, const float *z, const float *y) {
    mha_demo_banner("2. Head order is a coordinate convention");
    printf("Swap the head blocks: Z' = Z P. Swap W_O's row blocks the same way: W_O' = P^T W_O.\n"
           "Then Z' W_O' = Z P P^T W_O = Z W_O.\n");
    const float *heads[2] = {z, z + 2};
    const int swap[2] = {1, 0};
    float z_sw[4], w_sw[16], y_both[4], y_z_only[4];
    MHA_DEMO_TRY(mha_concat_heads(z_sw, heads, swap, 2, 1, 2)); /* z_sw (1, h*d_v) */
    swap_row_blocks(w_sw, seed_w_o, 2, 4);
    mha_demo_vec("z_3'  (blocks swapped)", z_sw, 4);
    mha_demo_mat("W_O'  (row blocks swapped)", w_sw, 4, 4);

    MHA_DEMO_TRY(mha_project_out(y_both, z_sw, w_sw, NULL, 1, 4, 4));
    mha_demo_vec("z_3' W_O'  (both swapped)", y_both, 4);
    mha_demo_vec("z_3  W_O   (original)    ", y, 4);
    mha_demo_check(d, "swapping both sides leaves y_3 unchanged", mha_demo_max_diff(y_both, y, 4), 1e-6, 1);

    MHA_DEMO_TRY(mha_project_out(y_z_only, z_sw, seed_w_o, NULL, 1, 4, 4));
    printf("\nSwapping only the blocks of z_3 feeds head 2's features into rows trained for head 1:\n");
    mha_demo_vec("z_3' W_O   (only Z swapped)", y_z_only, 4);
    mha_demo_check(d, "swapping one side changes y_3", mha_demo_max_diff(y_z_only, y, 4), 1e-3, 0);
    printf("  (This W_O treats both heads alike, so the damage here is a swap of output\n"
           "  halves; a trained W_O scrambles them, as section 7 shows.)\n");
    printf("  So \"head 1\" has no meaning across independently trained checkpoints; the\n"
           "  order of Z's blocks and W_O's row blocks is one contract.\n");
    return 0;
}

/* ------------------------------------------------ 3. ablating head 2 */

static int section_ablate(mha_demo *d, const float *z, const float *y) {
    mha_demo_banner("3. Zeroing a head happens before the projection");
    float z_abl[4], y_abl[4], delta[4], contrib[8];
    memcpy(z_abl, z, sizeof z_abl);
    const mha_intervention zero = {MHA_HEAD_ZERO, 0.0f, NULL};
    MHA_DEMO_TRY(mha_head_intervene(z_abl, &zero, 1, 2, 1, 2)); /* head 2 = position 1 */
    mha_demo_vec("z_3 with head 2 zeroed", z_abl, 4);
    MHA_DEMO_TRY(mha_project_out(y_abl, z_abl, seed_w_o, NULL, 1, 4, 4));
    mha_demo_vec("y_3 ablated", y_abl, 4);
    for (int i = 0; i < 4; i++) delta[i] = y[i] - y_abl[i];
    mha_demo_vec("y_3 - y_3 ablated", delta, 4);

    printf("\nEach head's direct contribution is its block times its row block of W_O:\n");
    MHA_DEMO_TRY(mha_head_contributions(contrib, z, seed_w_o, 2, 1, 2, 4)); /* contrib (h, 1, d_model) */
    mha_demo_vec("head 1: z_3^(1) W_O[1]", contrib, 4);
    mha_demo_vec("head 2: z_3^(2) W_O[2]", contrib + 4, 4);
    mha_demo_check(d, "y_3 - y_3 ablated equals head 2's contribution", mha_demo_max_diff(delta, contrib + 4, 4),
                   1e-6, 1);
    float sum[4];
    for (int i = 0; i < 4; i++) sum[i] = contrib[i] + contrib[4 + i];
    mha_demo_check(d, "head 1 + head 2 contributions equal y_3", mha_demo_max_diff(sum, y, 4), 1e-6, 1);
    printf("  This is the direct effect through this W_O only; in a full network later\n"
           "  layers and the residual stream can change the final effect.\n");
    return 0;
}

/* ------------------------------------------------- 4. the exercise (Q1) */

static int section_exercise(mha_demo *d) {
    mha_demo_banner("4. Exercise: join two head readings");
    const float a[2] = {1, -2}, b[2] = {3, 4}; /* two heads, (1, d_v) each */
    const float *heads[2] = {a, b};
    float z[4], y[4];
    MHA_DEMO_TRY(mha_concat_heads(z, heads, NULL, 2, 1, 2));
    MHA_DEMO_TRY(mha_project_out(y, z, identity4, NULL, 1, 4, 4));
    mha_demo_vec("head 1", a, 2);
    mha_demo_vec("head 2", b, 2);
    mha_demo_vec("concatenation", z, 4);
    mha_demo_vec("y = z I", y, 4);
    printf("  third coordinate of the output: %.3f\n", y[2]);
    mha_demo_check(d, "third output coordinate is head 2's first feature", fabs((double)y[2] - b[0]), 0.0, 1);
    return 0;
}

/* ------------------------- 5. the lesson example; concatenate != average */

static int section_lesson(mha_demo *d) {
    mha_demo_banner("5. Lesson example, and why concatenation is not averaging");
    /* W (h*d_v, d_model): columns 0-1 add the heads, columns 2-3 subtract them */
    const float w[16] = {1, 0, 1, 0, 0, 1, 0, 1, 1, 0, -1, 0, 0, 1, 0, -1};
    /* averaging is itself a fixed projection: W_avg (h*d_v, d_v) = [I/2; I/2] */
    const float w_avg[8] = {0.5f, 0, 0, 0.5f, 0.5f, 0, 0, 0.5f};
    /* three head pairs with the same average [2, 3] */
    const float pairs[3][2][2] = {{{1, 2}, {3, 4}}, {{3, 4}, {1, 2}}, {{2, 3}, {2, 3}}};
    float z[3][4], y[3][4], avg[3][2];

    mha_demo_mat("W", w, 4, 4);
    for (int p = 0; p < 3; p++) {
        const float *heads[2] = {pairs[p][0], pairs[p][1]};
        MHA_DEMO_TRY(mha_concat_heads(z[p], heads, NULL, 2, 1, 2));
        MHA_DEMO_TRY(mha_project_out(y[p], z[p], w, NULL, 1, 4, 4));
        MHA_DEMO_TRY(mha_project_out(avg[p], z[p], w_avg, NULL, 1, 4, 2));
    }
    printf("\nhead_a = [1, 2], head_b = [3, 4]:\n");
    mha_demo_vec("Concatenated", z[0], 4);
    mha_demo_vec("Projected   ", y[0], 4);
    float y_id[4];
    MHA_DEMO_TRY(mha_project_out(y_id, z[0], identity4, NULL, 1, 4, 4));
    mha_demo_vec("with W = I  ", y_id, 4);
    printf("  The projection combines features of both heads (columns 0-1 add them,\n"
           "  columns 2-3 take their difference); with W = I it returns the concatenation.\n");

    printf("\nAveraging is a fixed projection, [I/2; I/2], applied to the concatenation.\n"
           "Three head pairs with the same average:\n");
    const char *names[3] = {"pair A", "pair B", "pair C"};
    for (int p = 0; p < 3; p++) {
        printf("  %s: heads [%g, %g] and [%g, %g]\n", names[p], pairs[p][0][0], pairs[p][0][1], pairs[p][1][0],
               pairs[p][1][1]);
        mha_demo_vec("  average          ", avg[p], 2);
        mha_demo_vec("  concatenation W  ", y[p], 4);
    }
    mha_demo_check(d, "pairs A, B, C have the same average",
                   fmax(mha_demo_max_diff(avg[0], avg[1], 2), mha_demo_max_diff(avg[0], avg[2], 2)), 0.0, 1);
    mha_demo_check(d, "concatenation then W tells A and B apart", mha_demo_max_diff(y[0], y[1], 4), 1e-3, 0);
    mha_demo_check(d, "concatenation then W tells A and C apart", mha_demo_max_diff(y[0], y[2], 4), 1e-3, 0);
    printf("  Anything computed from the average is the same for A, B and C: it no longer\n"
           "  knows which head said what. Concatenation keeps every head's block, and a\n"
           "  learned W_O decides how to mix them (here: sums and differences).\n");
    return 0;
}

/* ------------------------------------------------------------- command */

int cmd_demo(int argc, char **argv) {
    mha_command_spec spec = {
        .name = "demo",
        .summary = "Walk through the seeds' worked examples step by step: concatenating head\n"
                   "outputs, projecting with W_O, the head-order contract, ablation, the\n"
                   "exercises, shape bookkeeping, and a full causal layer with its contract\n"
                   "check. Every number is computed by libmha; no arguments, no files.",
        .details = "Exit status: 0 when every printed check holds, 1 when the library\n"
                   "disagrees with one of the lesson's claims or fails, 2 on bad usage.\n",
    };
    int rc = mha_args_parse(&spec, argc, argv, NULL, NULL);
    if (rc != MHA_ARGS_CONTINUE) return rc;

    mha_demo d = {0, 0};
    float z[4], y[4]; /* the trace's z_3 (1, h*d_v) and y_3 (1, d_model) */
    printf("mha demo: multi-head attention, concatenate heads and project once.\n"
           "Row-vector convention: Y = Concat(Z^(1), ..., Z^(h)) W_O, W_O stored (in, out).\n"
           "Heads are numbered from 1 in the text, as in the lesson, and from 0 in labels.\n");
    if (section_trace(&d, z, y) || section_order(&d, z, y) || section_ablate(&d, z, y) ||
        section_exercise(&d) || section_lesson(&d) || mha_demo_shapes(&d) || mha_demo_full_layer(&d) ||
        mha_demo_variants(&d))
        return MHA_EXIT_RUNTIME;

    mha_demo_banner("Summary");
    if (d.failed) {
        printf("  %d of %d checks FAILED\n", d.failed, d.checks);
        fflush(stdout);
        return mha_cmd_error("demo", MHA_EXIT_RUNTIME, "%d of %d checks failed", d.failed, d.checks);
    }
    printf("  all %d checks passed\n", d.checks);
    return MHA_EXIT_OK;
}
