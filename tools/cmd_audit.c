/* cmd_audit.c — `mha audit`: does this checkpoint reproduce a reference
 * output, and if not, is a head-order mistake the reason?
 *
 * Y = sum_r Z^(r) W_O[r] + b_O. If one kind of block (W_O row blocks, W_Q
 * column blocks, or the K/V column blocks) was written out of order, the
 * reference is a sum of the same pieces paired differently. For each kind
 * X with n blocks we build the n*n terms
 *     T[p][b] = what position p contributes when its X block is old block b
 * (for X = O: Z^(p) W_O[b]), fit Y_ref - b_O = sum c[p][b] T[p][b] by least
 * squares, and read a permutation off c (c[p][b] = 1 where position p
 * needs block b). The permutation is verified by applying it and running
 * again; the command printed is the `mha permute` that repairs the file.
 * Legend: B, T, S, h, h_kv, d_model (see mha.h). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "audit_rope.h"
#include "commands.h"
#include "io_cli.h"
#include "permute_proj.h"
#include "run_variants.h"
#include "stdin_npy.h"

#define CMD "audit"
/* audit's exit codes: 0 the checkpoint reproduces the reference, 1 it does
 * not (a finding, not a failure), 2 the audit could not run (usage, a
 * missing or bad file, an error in the library). */
enum { AUDIT_MATCH = 0, AUDIT_MISMATCH = 1, AUDIT_ERROR = 2 };
/* Stored fit terms are capped (n*n terms x rows x d_model floats). */
#define MAX_TERM_FLOATS ((size_t)1 << 22)

typedef struct {
    const char *flag;   /* --block value of `mha permute` */
    const char *what;   /* words for the report */
    mha_block kinds[2]; /* block kinds moved together */
    int n_kinds;
    int per_kv;         /* positions are kv heads */
    int proj;           /* Q, K move without their per-head QK-norm rows
                           (only for layers that have them) */
} hypothesis;

/* q, k and kv move a per-head QK-norm with its blocks (a head's whole
 * query or key side); q-proj, k-proj and kv-proj leave it, as a
 * conversion that wrote q_proj out of order and q_norm right does. */
static const hypothesis hyps[] = {
    {"o", "W_O row blocks", {MHA_BLOCK_O}, 1, 0, 0},
    {"q", "W_Q column blocks (and b_Q)", {MHA_BLOCK_Q}, 1, 0, 0},
    {"q-proj", "W_Q column blocks alone (q_norm kept)", {MHA_BLOCK_Q}, 1, 0, 1},
    {"kv", "W_K and W_V column blocks (kv heads)", {MHA_BLOCK_K, MHA_BLOCK_V}, 2, 1, 0},
    {"kv-proj", "W_K, W_V column blocks alone (k_norm kept)", {MHA_BLOCK_K, MHA_BLOCK_V}, 2, 1, 1},
    {"k", "W_K column blocks", {MHA_BLOCK_K}, 1, 1, 0},
    {"k-proj", "W_K column blocks alone (k_norm kept)", {MHA_BLOCK_K}, 1, 1, 1},
    {"v", "W_V column blocks", {MHA_BLOCK_V}, 1, 1, 0},
    {"s", "score parameters (ALiBi slopes, sinks)", {MHA_BLOCK_S}, 1, 0, 0},
};
#define N_HYPS ((int)(sizeof hyps / sizeof hyps[0]))

static mha_status clone_layer(mha_layer **out, const mha_layer *L) {
    mha_weights w;
    mha_layer_get_weights(L, &w);
    mha_status s = mha_layer_create(out, mha_layer_config(L), &w);
    int lab[4096];
    for (int b = 0; b < 4 && !s; b++)
        if (!(s = mha_layer_labels(L, (mha_block)b, lab))) s = mha_layer_set_labels(*out, (mha_block)b, lab);
    return s;
}

/* A copy of L with the hypothesis' blocks permuted by perm (n entries). */
static mha_status permuted(mha_layer **out, const mha_layer *L, const hypothesis *H, const int *perm) {
    mha_status s = clone_layer(out, L);
    for (int k = 0; k < H->n_kinds && !s; k++)
        s = H->proj ? cli_permute_proj(out, H->kinds[k], perm) : mha_layer_permute_block(*out, H->kinds[k], perm);
    return s;
}

static double max_abs_diff(const float *a, const float *b, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (!(d <= m)) m = d; /* NaN propagates */
    }
    return m;
}

/* Solves A x = b (m x m, row-major, overwritten) with partial pivoting;
 * a tiny ridge keeps duplicated terms solvable. */
static void solve(double *A, double *b, double *x, int m) {
    double tr = 0;
    for (int i = 0; i < m; i++) tr += A[(size_t)i * m + i];
    for (int i = 0; i < m; i++) A[(size_t)i * m + i] += 1e-12 * (tr / m + 1e-300);
    for (int col = 0; col < m; col++) {
        int piv = col;
        for (int r = col + 1; r < m; r++)
            if (fabs(A[(size_t)r * m + col]) > fabs(A[(size_t)piv * m + col])) piv = r;
        if (piv != col) {
            for (int k = 0; k < m; k++) {
                double t = A[(size_t)col * m + k];
                A[(size_t)col * m + k] = A[(size_t)piv * m + k];
                A[(size_t)piv * m + k] = t;
            }
            double t = b[col];
            b[col] = b[piv];
            b[piv] = t;
        }
        double d = A[(size_t)col * m + col];
        if (d == 0) continue;
        for (int r = col + 1; r < m; r++) {
            double f = A[(size_t)r * m + col] / d;
            if (f == 0) continue;
            for (int k = col; k < m; k++) A[(size_t)r * m + k] -= f * A[(size_t)col * m + k];
            b[r] -= f * b[col];
        }
    }
    for (int r = m - 1; r >= 0; r--) {
        double acc = b[r];
        for (int k = r + 1; k < m; k++) acc -= A[(size_t)r * m + k] * x[k];
        double d = A[(size_t)r * m + r];
        x[r] = d != 0 ? acc / d : 0;
    }
}

typedef struct {
    double *coef;     /* (n, n): c[p][b] */
    double residual;  /* ||target - fit|| / ||target|| */
    int *perm;        /* read off coef, or NULL when not a permutation */
    int n_unclear;    /* positions whose row of c is not one 1 and zeros */
    int unclear[8];   /* the first of them */
    int completed;    /* the one unclear position given the block left, or -1 */
    int searched;     /* perm came from search_permutation, not from c */
} fit_result;

/* Reads a permutation off c (n, n): a row that is one 1 and zeros (within
 * 0.25) names its block. A position whose head contributes nothing on this
 * input (a zero head, or a zero W_O block) has a row of zeros: when it is
 * the only unclear one, the block no other position took is its block.
 * Rows shared by heads that are identical on this input split their
 * weight (0.5, 0.5): no single order can be read off, and perm stays NULL
 * with the unclear positions listed. */
static void read_permutation(fit_result *fr, int n) {
    int *perm = malloc((size_t)n * sizeof *perm), *used = calloc((size_t)n, sizeof *used);
    int ok = perm && used;
    fr->n_unclear = 0;
    fr->completed = -1;
    for (int p = 0; p < n && ok; p++) {
        const double *c = fr->coef + (size_t)p * n;
        int best = 0, clean = 1;
        for (int b = 1; b < n; b++)
            if (c[b] > c[best]) best = b;
        for (int b = 0; b < n; b++) clean &= fabs(c[b] - (b == best)) < 0.25;
        if (clean && !used[best]) {
            used[best] = 1;
            perm[p] = best;
            continue;
        }
        if (fr->n_unclear < 8) fr->unclear[fr->n_unclear] = p;
        fr->n_unclear++;
    }
    if (ok && fr->n_unclear == 1) {
        int p = fr->unclear[0];
        for (int b = 0; b < n; b++)
            if (!used[b]) perm[p] = b;
        fr->completed = p;
    }
    free(used);
    if (ok && fr->n_unclear <= 1) fr->perm = perm;
    else free(perm);
}

/* ||target - sum_p T[p][perm[p]]||^2 from the Gram matrix G (m, m) of the
 * terms (term i = p*n + b), rhs[i] = <T_i, target> and tt = ||target||^2. */
static double perm_cost(const double *G, const double *rhs, double tt, const int *perm, int n) {
    const int m = n * n;
    double c = tt;
    for (int p = 0; p < n; p++) {
        const int i = p * n + perm[p];
        c -= 2 * rhs[i];
        for (int q = 0; q < n; q++) c += G[(size_t)i * m + q * n + perm[q]];
    }
    return c;
}

/* Descends from perm by transpositions: each step applies the one that
 * lowers the cost most, until none does. Returns the cost reached. */
static double descend(int *perm, const double *G, const double *rhs, double tt, int n) {
    double cost = perm_cost(G, rhs, tt, perm, n);
    for (int step = 0; step < n * n; step++) {
        int ba = -1, bb = -1;
        double best = cost;
        for (int a = 0; a < n; a++)
            for (int b = a + 1; b < n; b++) {
                int t = perm[a];
                perm[a] = perm[b], perm[b] = t;
                double c = perm_cost(G, rhs, tt, perm, n);
                perm[b] = perm[a], perm[a] = t;
                if (c < best) best = c, ba = a, bb = b;
            }
        if (ba < 0) break;
        int t = perm[ba];
        perm[ba] = perm[bb], perm[bb] = t, cost = best;
    }
    return cost;
}

/* The start that pairs each position with the block whose term alone
 * explains most of the target (2 <T, target> - ||T||^2), greedily. */
static void greedy_start(int *perm, const double *G, const double *rhs, int n) {
    const int m = n * n;
    unsigned char *used_p = calloc((size_t)n, 1), *used_b = calloc((size_t)n, 1);
    for (int p = 0; p < n; p++) perm[p] = p;
    for (int k = 0; used_p && used_b && k < n; k++) {
        int bp = -1, bb = -1;
        double best = -INFINITY;
        for (int p = 0; p < n; p++)
            for (int b = 0; b < n; b++) {
                const int i = p * n + b;
                const double v = 2 * rhs[i] - G[(size_t)i * m + i];
                if (!used_p[p] && !used_b[b] && v > best) best = v, bp = p, bb = b;
            }
        used_p[bp] = used_b[bb] = 1, perm[bp] = bb;
    }
    free(used_p), free(used_b);
}

/* The terms of one position under different blocks can be nearly parallel
 * (a sink logit or an ALiBi slope rescales a head's output row by row), so
 * the fit spreads its weight over them and no permutation can be read off
 * c although one pairing reproduces the target exactly. Then search the
 * pairings themselves: descend by transpositions from the identity, from
 * the greedy start and from 16 fixed pseudo-random orders, and keep the
 * best. Accepted only when its relative residual is <= 1e-3 and every
 * single transposition of it fits 10x worse in residual (else heads
 * identical on this input make the order ambiguous, which the caller
 * reports as before). */
static void search_permutation(fit_result *fr, const double *G, const double *rhs, double tt, int n) {
    int *perm = malloc((size_t)n * sizeof *perm), *cand = malloc((size_t)n * sizeof *cand);
    if (!perm || !cand || !(tt > 0)) {
        free(perm), free(cand);
        return;
    }
    double cost = INFINITY;
    uint64_t state = 0x9e3779b97f4a7c15u; /* fixed: the audit's output does not vary run to run */
    for (int start = 0; start < 18; start++) {
        if (start == 0)
            for (int p = 0; p < n; p++) cand[p] = p;
        else if (start == 1)
            greedy_start(cand, G, rhs, n);
        else
            for (int p = 0; p < n; p++) { /* Fisher-Yates on an LCG */
                state = state * 6364136223846793005u + 1442695040888963407u;
                const int q = (int)((state >> 33) % (uint64_t)(p + 1));
                cand[p] = cand[q], cand[q] = p;
            }
        const double c = descend(cand, G, rhs, tt, n);
        if (c < cost) cost = c, memcpy(perm, cand, (size_t)n * sizeof *perm);
    }
    free(cand);
    const double limit = 100 * fmax(cost, 0) + 1e-14 * tt; /* squared residuals */
    int unique = cost <= 1e-6 * tt;
    for (int a = 0; unique && a < n; a++)
        for (int b = a + 1; unique && b < n; b++) {
            int t = perm[a];
            perm[a] = perm[b], perm[b] = t;
            unique = perm_cost(G, rhs, tt, perm, n) > limit;
            perm[b] = perm[a], perm[a] = t;
        }
    if (!unique) {
        free(perm);
        return;
    }
    free(fr->perm);
    fr->perm = perm;
    fr->residual = sqrt(fmax(cost, 0) / tt);
    fr->n_unclear = 0;
    fr->completed = -1;
    fr->searched = 1;
}

/* Builds T[p][b] from n forward passes (a cyclic shift k pairs every
 * position p with block (p+k) % n at once) and fits the target. */
static int fit_hypothesis(const hypothesis *H, const mha_layer *L, const cli_fwd *f,
                          const float *target, size_t rows, fit_result *out) {
    const mha_config *c = mha_layer_config(L);
    int h = c->n_heads, n = H->per_kv ? c->n_kv_heads : h, dm = c->d_model, m = n * n;
    size_t all_rows = (size_t)f->B * f->T, len = rows * dm;
    float *terms = cli_alloc(CMD, (size_t)m * len);
    float *contrib = cli_alloc(CMD, (size_t)h * all_rows * dm);
    float *y = cli_alloc(CMD, all_rows * dm);
    int *shift = malloc((size_t)n * sizeof *shift);
    double *A = calloc((size_t)m * m, sizeof *A), *rhs = calloc((size_t)m, sizeof *rhs);
    double *G = malloc((size_t)m * m * sizeof *G), *g = malloc((size_t)m * sizeof *g); /* A, rhs before solve */
    out->coef = calloc((size_t)m, sizeof *out->coef);
    out->perm = NULL;
    out->searched = 0;
    int rc = MHA_EXIT_RUNTIME;
    if (!terms || !contrib || !y || !shift || !A || !rhs || !G || !g || !out->coef) goto done;
    for (int k = 0; k < n; k++) {
        for (int p = 0; p < n; p++) shift[p] = (p + k) % n;
        mha_layer *Lk = NULL;
        mha_status s = permuted(&Lk, L, H, shift);
        mha_capture cap = {.contributions = contrib};
        if (!s) s = mha_forward(Lk, y, &cap, f->x.f, f->kv.f, f->B, f->T, f->S, &f->opt);
        mha_layer_free(Lk);
        if (s) {
            rc = cli_fail(CMD, s);
            goto done;
        }
        for (int r = 0; r < h; r++) { /* head r sits at position p */
            int p = H->per_kv ? r / (h / c->n_kv_heads) : r;
            float *t = terms + ((size_t)p * n + (size_t)shift[p]) * len;
            const float *src = contrib + (size_t)r * all_rows * dm;
            for (size_t i = 0; i < len; i++) t[i] += src[i];
        }
    }
    /* normal equations in double */
    for (int i = 0; i < m; i++) {
        const float *ti = terms + (size_t)i * len;
        double acc = 0;
        for (size_t e = 0; e < len; e++) acc += (double)ti[e] * target[e];
        rhs[i] = acc;
        for (int j = 0; j <= i; j++) {
            const float *tj = terms + (size_t)j * len;
            double g = 0;
            for (size_t e = 0; e < len; e++) g += (double)ti[e] * tj[e];
            A[(size_t)i * m + j] = A[(size_t)j * m + i] = g;
        }
    }
    memcpy(G, A, (size_t)m * m * sizeof *G);
    memcpy(g, rhs, (size_t)m * sizeof *g);
    solve(A, rhs, out->coef, m);
    double rr = 0, tt = 0;
    for (size_t e = 0; e < len; e++) {
        double fit = 0;
        for (int i = 0; i < m; i++) fit += out->coef[i] * terms[(size_t)i * len + e];
        rr += (fit - target[e]) * (fit - target[e]);
        tt += (double)target[e] * target[e];
    }
    out->residual = sqrt(rr / (tt > 0 ? tt : 1));
    read_permutation(out, n);
    if (out->residual <= 1e-3 && !out->perm) search_permutation(out, G, g, tt, n);
    rc = MHA_EXIT_OK;
done:
    free(G);
    free(g);
    free(terms);
    free(contrib);
    free(y);
    free(shift);
    free(A);
    free(rhs);
    return rc;
}

/* The fit is exact but no single permutation can be read off it. */
static void print_unclear(const fit_result *fr) {
    printf("fits, but not as one permutation: position%s", fr->n_unclear > 1 ? "s" : "");
    for (int i = 0; i < fr->n_unclear && i < 8; i++) printf("%s %d", i ? "," : "", fr->unclear[i]);
    printf("%s can hold several blocks (their terms are identical, or nearly, on this input)\n",
           fr->n_unclear > 8 ? ", ..." : "");
}

/* "w.safetensors" -> "w_fixed.safetensors" */
static void fixed_name(char *out, size_t cap, const char *path) {
    const char *slash = strrchr(path, '/'), *dot = strrchr(path, '.');
    if (!dot || (slash && dot < slash)) dot = path + strlen(path);
    snprintf(out, cap, "%.*s_fixed%s", (int)(dot - path), path, dot);
}

/* " FLAG VALUE" with VALUE as a POSIX shell word: as it is when it holds
 * only characters no shell treats specially, else in single quotes (a
 * quote inside as '\''), so that the printed line pastes into a shell
 * whatever the file is called. */
static void print_flag(const char *flag, const char *value) {
    printf(" %s%s", flag, *flag ? " " : "");
    const int plain = *value && strspn(value, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                              "0123456789_./:=,@%+-") == strlen(value);
    if (plain) {
        fputs(value, stdout);
        return;
    }
    putchar('\'');
    for (const char *c = value; *c; c++)
        if (*c == '\'') fputs("'\\''", stdout);
        else putchar(*c);
    putchar('\'');
}

/* The `mha permute` that repairs the file: the checkpoint flags the audit
 * loaded it with, so the native file written is the same layer. */
static void print_fix(const cli_ckpt *ck, const cli_variant_flags *vf, const hypothesis *H, const char *order) {
    char out[4096];
    fixed_name(out, sizeof out, ck->weights);
    printf("fix: mha permute");
    if (ck->layout) print_flag("--layout", ck->layout);
    if (ck->heads) printf(" --heads %lld", ck->heads);
    if (ck->kv_heads) printf(" --kv-heads %lld", ck->kv_heads);
    if (ck->prefix) print_flag("--prefix", ck->prefix);
    /* a state dict does not record add_zero_attn: without the flag the
       repaired native file would be another layer */
    if (ck->zero_attn) printf(" --zero-attn");
    /* and the variants that make the layer: --sinks and --qk-norm read
       tensors the native file keeps only when the layer has them */
    if (vf->rope) print_flag("--rope", vf->rope);
    if (vf->rope_theta) printf(" --rope-theta %.17g", vf->rope_theta);
    if (vf->rope_dim) printf(" --rope-dim %lld", vf->rope_dim);
    if (vf->rope_scale) print_flag("--rope-scale", vf->rope_scale);
    if (vf->alibi) printf(" --alibi");
    if (vf->softcap) printf(" --softcap %.17g", vf->softcap);
    if (vf->clip_qkv) printf(" --clip-qkv %.17g", vf->clip_qkv);
    if (vf->temperature) print_flag("--attn-temperature", vf->temperature);
    if (vf->sinks) print_flag("--sinks", vf->sinks);
    if (vf->qk_norm) print_flag("--qk-norm", vf->qk_norm);
    printf(" --block %s --order %s --relabel", H->flag, order);
    print_flag("", ck->weights), print_flag("", out), putchar('\n');
}

static void print_labels_check(const mha_layer *L) {
    mha_contract_report rep;
    mha_status s = mha_layer_check_contract(L, NULL, NULL, 0, 0, 0, NULL, &rep);
    /* one name per mha_block: a layer with ALiBi or sinks reports MHA_BLOCK_S */
    static const char *const kind[] = {"W_Q", "W_K", "W_V", "W_O", "score parameter (ALiBi slope, sink)"};
    if (s == MHA_OK) printf("labels: consistent (the file's head labels agree block by block)\n");
    else if (s == MHA_E_CONTRACT && (int)rep.bad_block >= 0 && (int)rep.bad_block < (int)(sizeof kind / sizeof *kind))
        printf("labels: disagree: %s block at position %d has label %d, expected %d\n",
               kind[rep.bad_block], rep.bad_position, rep.found_label, rep.expected_label);
    else printf("labels: not checked (%s)\n", mha_last_error());
}

int cmd_audit(int argc, char **argv) {
    cli_ckpt ck = {0};
    cli_fwd_flags ff = {0};
    const char *ref = NULL;
    double tol = 0;
    cli_variant_flags vf = {0};
    mha_arg args[] = {
        CLI_CKPT_ARGS(ck, 1),
        CLI_FWD_ARGS(ff),
        CLI_VARIANT_ARGS(vf),
        {.name = "--reference", .kind = MHA_ARG_STRING, .dest = &ref, .metavar = "Y_ref.npy",
         .help = "the output the checkpoint should give for X (same shape as Y)", .required = 1},
        {.name = "--tol", .kind = MHA_ARG_DOUBLE, .dest = &tol, .metavar = "E",
         .help = "max |Y - Y_ref| accepted; default 1e-4 * (1 + max|Y_ref|)", .dmin = 0, .dmax = 1e30},
    };
    mha_command_spec spec = {
        .name = "audit",
        .summary = "Check that a checkpoint reproduces a reference output; when it does not,\n"
                   "find whether blocks written out of order explain it, and print the\n"
                   "`mha permute` command that repairs the file.",
        .details = "The fit: Y_ref - b_O as a least-squares combination of the h*h terms\n"
                   "Z^(r) W_O[s] (and likewise with W_Q column blocks or kv blocks paired\n"
                   "differently); a permutation is read off the coefficients and verified\n"
                   "by running the repaired layer. A layer with RoPE is first run with the\n"
                   "other pairing (halves <-> interleaved): a match means the reference\n"
                   "used the other convention, or W_Q/W_K columns are stored in the other\n"
                   "order (as Hugging Face's Llama conversion permutes them); --rope fixes both.\n\n"
                   "exit status: 0 the checkpoint reproduces the reference; 1 it does not\n"
                   "(the repair is printed when one was found); 2 the audit could not run\n"
                   "(a usage error, a missing or unreadable file, a shape mismatch).\n\n"
                   "example: mha audit --weights attn.safetensors --input x.npy --reference y_ref.npy\n",
        .args = args,
        .n_args = (int)(sizeof args / sizeof args[0]),
    };
    mha_layer *L;
    cli_fwd f;
    /* no outputs: registered for the input checks only (a pipe would block the read) */
    cli_outputs ins;
    cli_outputs_init(&ins, CMD);
    ins.stdin_ok = 1; /* one array input may be "-" */
    cli_register_inputs(&ins, &ck, &ff);
    cli_outputs_input(&ins, "--reference", &ref);
    cli_outputs_input(&ins, "--positions", &vf.positions);
    int rc = cli_fwd_open(&L, &f, &spec, &ck, &ff, &ins, argc, argv);
    if (rc != MHA_ARGS_CONTINUE) return rc == MHA_EXIT_OK ? AUDIT_MATCH : AUDIT_ERROR;
    int reported = 0; /* the audit ran to its verdict */
    if ((rc = cli_apply_variants("audit", &L, &f, &vf, &ck))) {
        cli_variants_free(&vf);
        cli_fwd_free(&f);
        mha_layer_free(L);
        return AUDIT_ERROR;
    }

    mha_array yref = {0};
    float *y = NULL, *target = NULL;
    const mha_config *c = mha_layer_config(L);
    int dm = c->d_model;
    /* the oracle path: double accumulation for the fit, and no OpenMP
     * workers left spinning between the many small passes */
    f.opt.path = MHA_PATH_REFERENCE;
    size_t all_rows = (size_t)f.B * f.T, ny = all_rows * dm;
    if ((rc = cli_npy_read(CMD, &yref, ref, 0))) goto done;
    mha_status s;
    if (!yref.f || yref.count != ny || yref.shape[yref.rank ? yref.rank - 1 : 0] != dm) {
        char got[96];
        rc = mha_cmd_error(CMD, MHA_EXIT_RUNTIME, "%s: reference is %s of shape %s; expected Y's "
                           "shape (%s%d, %d, %d)", cli_input_name(ref), mha_dtype_name(yref.dtype),
                           cli_shape_str(&yref, got, sizeof got), f.batched ? "" : "1 x ", f.B, f.T, dm);
        goto done;
    }
    rc = MHA_EXIT_RUNTIME;
    if (!(y = cli_alloc(CMD, ny))) goto done;
    if ((rc = cli_fwd_run(CMD, &f, L, y, NULL))) goto done;
    double ymax = 0;
    for (size_t i = 0; i < ny; i++) ymax = fmax(ymax, fabs(yref.f[i]));
    if (tol == 0) tol = 1e-4 * (1 + ymax);
    double err = max_abs_diff(y, yref.f, ny);
    print_labels_check(L);
    if (err <= tol) {
        printf("ok: max |Y - Y_ref| = %.3g <= %.3g: the checkpoint reproduces the reference\n", err, tol);
        rc = AUDIT_MATCH;
        reported = 1;
        goto done;
    }
    printf("mismatch: max |Y - Y_ref| = %.3g > %.3g\n", err, tol);
    const int rope = audit_rope_pairing(L, &f, yref.f, ny, tol, ck.weights);
    if (rope != 0) {
        rc = rope > 0 ? AUDIT_MISMATCH : MHA_EXIT_RUNTIME;
        reported = rope > 0;
        goto done;
    }

    /* target = Y_ref - b_O over the rows used by the fit */
    mha_weights w;
    mha_layer_get_weights(L, &w);
    int h = c->n_heads;
    size_t rows = all_rows, cap_rows = MAX_TERM_FLOATS / ((size_t)h * h * dm);
    if (cap_rows < 1) cap_rows = 1;
    if (rows > cap_rows) rows = cap_rows;
    if (rows * dm < (size_t)h * h)
        printf("note: %zu values for %zu unknowns; the fit may be underdetermined (use more tokens)\n",
               rows * dm, (size_t)h * h);
    if (!(target = cli_alloc(CMD, rows * dm))) goto done;
    for (size_t i = 0; i < rows * dm; i++) target[i] = yref.f[i] - (w.b_o ? w.b_o[i % dm] : 0.0f);

    int found = 0, ambiguous = 0;
    for (int k = 0; k < N_HYPS && !found; k++) {
        const hypothesis *H = &hyps[k];
        int n = H->per_kv ? c->n_kv_heads : h;
        if (n < 2 || (H->kinds[0] == MHA_BLOCK_S && !c->alibi && !c->sinks)) continue;
        if (H->proj && (c->qk_norm == MHA_QK_NORM_NONE || !c->qk_norm_per_head)) continue; /* = q, kv, k */
        if (n > 32) { /* (n*n)^2 normal equations: keep the fit small */
            printf("fit %-36s skipped: %d blocks (the fit handles up to 32)\n", H->what, n);
            continue;
        }
        fit_result fr = {0};
        if ((rc = fit_hypothesis(H, L, &f, target, rows, &fr))) {
            free(fr.coef);
            goto done;
        }
        printf("fit %-36s relative residual %.2e: ", H->what, fr.residual);
        int identity = 1;
        for (int p = 0; fr.perm && p < n; p++) identity &= fr.perm[p] == p;
        if (fr.perm && identity && fr.residual <= 1e-3) {
            double lo = INFINITY, hi = -INFINITY;
            for (int p = 0; p < n; p++) lo = fmin(lo, fr.coef[p * n + p]), hi = fmax(hi, fr.coef[p * n + p]);
            printf("identity pairing, coefficients %.3g .. %.3g (%s)\n", lo, hi,
                   hi - lo < 1e-3 && fabs(lo - 1) > 1e-3 ? "a uniform rescaling, not an order mistake"
                                                         : "not an order mistake");
        } else if (!fr.perm && fr.residual <= 1e-3) {
            print_unclear(&fr);
            ambiguous = 1;
        } else if (!fr.perm || fr.residual > 1e-3) {
            printf("%s\n", !fr.perm ? "not a permutation" : "poor fit");
        } else {
            char order[4096] = "";
            size_t u = 0;
            for (int p = 0; p < n && u < sizeof order - 16; p++)
                u += (size_t)snprintf(order + u, sizeof order - u, "%s%d", p ? "," : "", fr.perm[p]);
            printf("permutation %s%s\n", order,
                   fr.searched ? " (searched: the pairing whose terms sum to the reference; the fit's "
                                 "coefficients spread over nearly parallel terms)" : "");
            if (fr.completed >= 0)
                printf("  (position %d contributes nothing on this input; it takes block %d, the one left)\n",
                       fr.completed, fr.perm[fr.completed]);
            mha_layer *F = NULL;
            s = permuted(&F, L, H, fr.perm);
            if (!s) s = mha_forward(F, y, NULL, f.x.f, f.kv.f, f.B, f.T, f.S, &f.opt);
            mha_layer_free(F);
            if (s) {
                rc = cli_fail(CMD, s);
                free(fr.coef);
                free(fr.perm);
                goto done;
            }
            double err2 = max_abs_diff(y, yref.f, ny);
            if (err2 <= tol) {
                found = 1;
                printf("verified: with the %s reordered, max |Y - Y_ref| = %.3g\n", H->what, err2);
                printf("out of order:");
                for (int p = 0; p < n; p++)
                    if (fr.perm[p] != p) printf(" position %d should hold block %d;", p, fr.perm[p]);
                printf("\n");
                if (n <= 8) {
                    printf("coefficients c[position][block]:\n");
                    for (int p = 0; p < n; p++) {
                        printf("  ");
                        for (int b = 0; b < n; b++) printf(" %6.3f", fr.coef[p * n + b]);
                        printf("\n");
                    }
                }
                print_fix(&ck, &vf, H, order);
            } else {
                printf("  rejected: with that order max |Y - Y_ref| = %.3g\n", err2);
            }
        }
        free(fr.coef);
        free(fr.perm);
    }
    if (!found && ambiguous)
        printf("cannot tell: a reordering fits the reference, but blocks whose terms are identical (or "
               "nearly) on this input make several orders fit; no repair is printed (audit with another "
               "input, or compare those heads' weights)\n");
    else if (!found)
        printf("not a permutation: no reordering of W_O, W_Q, K/V blocks or score parameters explains the "
               "mismatch (check the input, masks, scale and the weights themselves)\n");
    rc = AUDIT_MISMATCH;
    reported = 1;
done:
    free(y);
    free(target);
    mha_array_free(&yref);
    cli_variants_free(&vf);
    cli_fwd_free(&f);
    mha_layer_free(L);
    return reported ? rc : AUDIT_ERROR;
}
