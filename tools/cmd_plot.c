/* cmd_plot.c — `mha plot`: two PNG figures of one forward pass, for one
 * batch element:
 *   1. a grid of attention heatmaps P^(r) (T, S_total), one per head,
 *      titled with the head's position and its label (head id in the
 *      original checkpoint);
 *   2. each head's direct contribution norm ||Z^(r) W_O[r]|| per query
 *      position, (h, T), rows labelled the same way.
 * Legend: B, T, S, h, d_model (see mha.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "canvas.h"
#include "commands.h"
#include "io_cli.h"

#define CMD "plot"
static const uint8_t BLACK[3] = {0, 0, 0}, GREY[3] = {150, 150, 150}, DARK[3] = {70, 70, 70};

static int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

/* A horizontal colour bar with its end values written under it. */
static void colorbar(canvas *cv, int x, int y, int w, const char *lo, const char *hi) {
    uint8_t rgb[3];
    for (int i = 0; i < w; i++) {
        canvas_colormap((double)i / (w - 1), rgb);
        canvas_rect(cv, x + i, y, 1, 10, rgb);
    }
    canvas_text(cv, x, y + 14, 1, lo, DARK);
    canvas_text(cv, x + w - canvas_text_width(hi, 1), y + 14, 1, hi, DARK);
}

/* Writes the PNG to the temporary of the output registered under flag. */
static int save(canvas *cv, const cli_outputs *outs, const char *flag) {
    char err[256];
    if (canvas_write_png(cv, cli_outputs_tmp(outs, flag), err, sizeof err))
        return mha_cmd_error(CMD, MHA_EXIT_RUNTIME, "cannot write %s '%s': %s; the file is unchanged", flag,
                             cli_outputs_path(outs, flag), err);
    return MHA_EXIT_OK;
}

/* The default --contrib-out: <out without extension>_contrib.png. */
typedef struct {
    const char *const *out;
    const char **contrib_out;
    char *buf; /* as long as the name needs: a cut name would be another file */
} default_name;

static void derive_contrib_out(void *ctx) {
    default_name *d = ctx;
    if (*d->contrib_out || !*d->out) return;
    const char *out = *d->out, *dot = strrchr(out, '.'), *slash = strrchr(out, '/');
    if (!dot || (slash && dot < slash)) dot = out + strlen(out);
    const size_t cap = (size_t)(dot - out) + sizeof "_contrib.png";
    if (!(d->buf = malloc(cap))) return; /* no name: reported after the parse */
    snprintf(d->buf, cap, "%.*s_contrib.png", (int)(dot - out), out);
    *d->contrib_out = d->buf;
}

/* Where plot_probs draws: the size of each heatmap pixel, the grid of h
 * cells, the canvas W x H. Computed before the forward too, so that the
 * canvas counts against --max-output-gib with the captures. */
typedef struct {
    int px, hw, hh, cols, rows, cell_w, cell_h, top, pad;
    long long W, H; /* the canvas; long long: a grid of long rows passes int */
} probs_layout;

static probs_layout probs_layout_of(int h, int T, int St, const char *title) {
    probs_layout l;
    l.px = clampi(160 / (T > St ? T : St), 1, 24), l.hw = St * l.px, l.hh = T * l.px;
    l.cols = (int)ceil(sqrt((double)h)), l.rows = (h + l.cols - 1) / l.cols;
    l.cell_w = l.hw;
    const int lab_w = canvas_text_width("head 0000 label 0000", 1);
    if (lab_w > l.cell_w) l.cell_w = lab_w;
    l.cell_w += 16;
    l.cell_h = l.hh + 12 + 14, l.top = 12 + 14 + 6 + 7 + 12, l.pad = 12;
    l.W = l.pad * 2 + (long long)l.cols * l.cell_w;
    const long long min_w = canvas_text_width(title, 2) + 3 * l.pad;
    if (l.W < min_w) l.W = min_w;
    if (l.W < 260) l.W = 260;
    l.H = l.top + (long long)l.rows * l.cell_h + 40;
    return l;
}

static void probs_title(char *title, size_t cap, int b) {
    snprintf(title, cap, "attention probabilities, batch %d", b);
}

/* probs (h, T, St) of one batch element. */
static int plot_probs(const cli_outputs *outs, const float *probs, const int *labels, int h, int T, int St,
                      int b) {
    char title[128];
    probs_title(title, sizeof title, b);
    const probs_layout l = probs_layout_of(h, T, St, title);
    const int px = l.px, hw = l.hw, hh = l.hh, cols = l.cols, cell_w = l.cell_w, cell_h = l.cell_h, top = l.top,
              pad = l.pad, W = (int)l.W, H = (int)l.H;
    canvas cv;
    if (canvas_init(&cv, W, H)) return mha_cmd_error(CMD, MHA_EXIT_RUNTIME, "out of memory");
    canvas_text(&cv, pad, 12, 2, title, BLACK);
    canvas_text(&cv, pad, 12 + 14 + 6, 1, "rows: query positions, columns: key positions", DARK);
    uint8_t rgb[3];
    for (int r = 0; r < h; r++) {
        int x0 = pad + (r % cols) * cell_w, y0 = top + (r / cols) * cell_h;
        char lab[48];
        snprintf(lab, sizeof lab, "head %d label %d", r, labels[r]);
        canvas_text(&cv, x0, y0, 1, lab, BLACK);
        int hy = y0 + 12;
        canvas_rect(&cv, x0 - 1, hy - 1, hw + 2, hh + 2, GREY);
        for (int i = 0; i < T; i++)
            for (int j = 0; j < St; j++) {
                canvas_colormap(probs[((size_t)r * T + i) * St + j], rgb);
                canvas_rect(&cv, x0 + j * px, hy + i * px, px, px, rgb);
            }
    }
    colorbar(&cv, pad, H - 32, 200, "p = 0", "1");
    int rc = save(&cv, outs, "--out");
    canvas_free(&cv);
    return rc;
}

/* Where plot_norms draws (as probs_layout). */
typedef struct {
    int pw, ph, pad, left, top;
    long long W, H;
} norms_layout;

static norms_layout norms_layout_of(int h, int T, const char *title) {
    norms_layout l;
    l.pw = clampi(480 / T, 2, 32), l.ph = 16, l.pad = 12;
    l.left = l.pad + canvas_text_width("head 0000 label 0000", 1) + 8;
    l.W = l.left + (long long)T * l.pw + l.pad;
    const long long min_w = canvas_text_width(title, 1) + 3 * l.pad;
    if (l.W < min_w) l.W = min_w;
    if (l.W < 260) l.W = 260;
    l.top = 12 + 7 + 6 + 7 + 10, l.H = l.top + (long long)h * l.ph + 12 + 7 + 48;
    return l;
}

static void norms_title(char *title, size_t cap, int b) {
    snprintf(title, cap, "head contribution norm |z_r w_o[r]| per position, batch %d", b);
}

/* norms (h, T) of one batch element. */
static int plot_norms(const cli_outputs *outs, const float *norms, const int *labels, int h, int T, int b) {
    float mx = 0;
    for (size_t i = 0; i < (size_t)h * T; i++) mx = fmaxf(mx, norms[i]);
    char title[128];
    norms_title(title, sizeof title, b);
    const norms_layout l = norms_layout_of(h, T, title);
    const int pw = l.pw, ph = l.ph, pad = l.pad, left = l.left, top = l.top, W = (int)l.W, H = (int)l.H;
    canvas cv;
    if (canvas_init(&cv, W, H)) return mha_cmd_error(CMD, MHA_EXIT_RUNTIME, "out of memory");
    canvas_text(&cv, pad, 12, 1, title, BLACK);
    canvas_text(&cv, pad, 12 + 7 + 6, 1, "rows: heads, columns: query positions", DARK);
    uint8_t rgb[3];
    canvas_rect(&cv, left - 1, top - 1, T * pw + 2, h * ph + 2, GREY);
    for (int r = 0; r < h; r++) {
        char lab[48];
        snprintf(lab, sizeof lab, "head %d label %d", r, labels[r]);
        canvas_text(&cv, pad, top + r * ph + (ph - 7) / 2, 1, lab, BLACK);
        for (int t = 0; t < T; t++) {
            canvas_colormap(mx > 0 ? norms[(size_t)r * T + t] / mx : 0, rgb);
            canvas_rect(&cv, left + t * pw, top + r * ph, pw, ph, rgb);
        }
    }
    /* position ticks: first and last */
    int ty = top + h * ph + 4;
    canvas_text(&cv, left, ty, 1, "0", DARK);
    char last[16];
    snprintf(last, sizeof last, "%d", T - 1);
    canvas_text(&cv, left + (T - 1) * pw, ty, 1, last, DARK);
    char hi[32];
    snprintf(hi, sizeof hi, "%.3g", (double)mx);
    colorbar(&cv, pad, H - 32, 200, "norm = 0", hi);
    int rc = save(&cv, outs, "--contrib-out");
    canvas_free(&cv);
    return rc;
}

int cmd_plot(int argc, char **argv) {
    cli_ckpt ck = {0};
    cli_fwd_flags ff = {0};
    const char *out = NULL, *contrib_out = NULL;
    long long batch = 0;
    double max_gib = 0;
    mha_arg args[] = {
        CLI_CKPT_ARGS(ck, 1),
        CLI_FWD_ARGS(ff),
        {.name = "--out", .kind = MHA_ARG_STRING, .dest = &out, .metavar = "attn.png",
         .help = "attention heatmaps, one per head", .required = 1},
        {.name = "--contrib-out", .kind = MHA_ARG_STRING, .dest = &contrib_out, .metavar = "C.png",
         .help = "contribution norms per head and position; default <out>_contrib.png"},
        {.name = "--batch", .kind = MHA_ARG_INT, .dest = &batch, .metavar = "b",
         .help = "batch element to draw; default 0", .min = 0, .max = 1 << 24},
        CLI_MAX_OUTPUT_ARG(max_gib),
    };
    mha_command_spec spec = {
        .name = "plot",
        .summary = "Draw a checkpoint's attention on an input: a PNG grid of attention\n"
                   "heatmaps (one per head, titled with its label) and a PNG of each head's\n"
                   "contribution norm ||Z^(r) W_O[r]|| per query position.",
        .details = "Both PNGs are written to temporary files and renamed over their targets\n"
                   "only when both are complete: a failed plot leaves existing files as they\n"
                   "were. --max-output-gib bounds what is held in memory: the captures\n"
                   "(probabilities and contributions of every batch element) and each\n"
                   "PNG's canvas (3 bytes a pixel), refused before the forward.\n\n"
                   "example: mha plot --weights attn.safetensors --input x.npy --causal --out attn.png\n",
        .args = args,
        .n_args = (int)(sizeof args / sizeof args[0]),
    };
    default_name dn = {.out = &out, .contrib_out = &contrib_out};
    cli_outputs outs;
    cli_outputs_init(&outs, CMD);
    outs.stdin_ok = 1; /* one array input may be "-" */
    cli_register_inputs(&outs, &ck, &ff);
    cli_outputs_output(&outs, "--out", &out);
    cli_outputs_output(&outs, "--contrib-out", &contrib_out);
    outs.after_parse = derive_contrib_out;
    outs.ctx = &dn;
    mha_layer *L;
    cli_fwd f;
    int rc = cli_fwd_open(&L, &f, &spec, &ck, &ff, &outs, argc, argv);
    if (rc != MHA_ARGS_CONTINUE) {
        free(dn.buf);
        return rc;
    }

    float *y = NULL, *norms = NULL;
    mha_capture cap = {0};
    int *labels = NULL;
    const mha_config *c = mha_layer_config(L);
    int h = c->n_heads, dm = c->d_model;
    if (batch >= f.B) {
        rc = mha_cmd_error(CMD, MHA_EXIT_USAGE, "--batch %lld is out of range; the input has B = %d",
                           batch, f.B);
        goto done;
    }
    int B = f.B, T = f.T, St = f.S + c->add_bias_kv + c->add_zero_attn, b = (int)batch;
    size_t rows = (size_t)B * T;
    double limit = max_gib > 0 ? max_gib : cli_default_output_limit_gib();
    double np = (double)h * rows * St, nc = (double)h * rows * dm;
    /* the canvases (RGB, 3 bytes a pixel), one at a time beside the captures */
    char title[128], what_p[96], what_c[96];
    probs_title(title, sizeof title, b);
    const probs_layout lp = probs_layout_of(h, T, St, title);
    norms_title(title, sizeof title, b);
    const norms_layout ln = norms_layout_of(h, T, title);
    const double cp = 3.0 * (double)lp.W * (double)lp.H, cn = 3.0 * (double)ln.W * (double)ln.H;
    snprintf(what_p, sizeof what_p, "--out's canvas (%lld x %lld RGB pixels)", lp.W, lp.H);
    snprintf(what_c, sizeof what_c, "--contrib-out's canvas (%lld x %lld RGB pixels)", ln.W, ln.H);
    if ((rc = cli_check_output_size(CMD, "the attention probabilities (B,h,T,S)", np, limit)) ||
        (rc = cli_check_output_size(CMD, "the contributions (h,B,T,d_model)", nc, limit)) ||
        (rc = cli_check_output_bytes(CMD, what_p, cp, limit)) || (rc = cli_check_output_bytes(CMD, what_c, cn, limit)) ||
        (rc = cli_check_output_bytes(CMD, "the captures and a canvas together",
                                     4.0 * (np + nc + (double)rows * dm) + (cp > cn ? cp : cn), limit)))
        goto done;
    rc = MHA_EXIT_RUNTIME;
    if (!contrib_out) {
        rc = mha_cmd_error(CMD, MHA_EXIT_RUNTIME, "out of memory");
        goto done;
    }
    if (!(y = cli_alloc(CMD, rows * dm)) || !(cap.probs = cli_alloc(CMD, (size_t)h * rows * St)) ||
        !(cap.contributions = cli_alloc(CMD, (size_t)h * rows * dm)) ||
        !(norms = cli_alloc(CMD, (size_t)h * T)) || !(labels = malloc((size_t)h * sizeof *labels)))
        goto done;
    if ((rc = cli_fwd_run(CMD, &f, L, y, &cap))) goto done;
    mha_layer_labels(L, MHA_BLOCK_Q, labels);
    /* probs (B,h,T,St): batch b is contiguous (h,T,St) */
    if ((rc = plot_probs(&outs, cap.probs + (size_t)b * h * T * St, labels, h, T, St, b))) goto done;
    /* contributions (h,B,T,d_model) -> norms (h,T) */
    for (int r = 0; r < h; r++)
        for (int t = 0; t < T; t++) {
            const float *v = cap.contributions + (((size_t)r * B + b) * T + t) * dm;
            double acc = 0;
            for (int k = 0; k < dm; k++) acc += (double)v[k] * v[k];
            norms[(size_t)r * T + t] = (float)sqrt(acc);
        }
    if ((rc = plot_norms(&outs, norms, labels, h, T, b))) goto done;
    if ((rc = cli_outputs_finish(&outs, MHA_EXIT_OK))) goto done;
    printf("wrote %s (%d heads, %d x %d) and %s\n", out, h, T, St, contrib_out);
done:
    free(y);
    free(norms);
    free(labels);
    free(cap.probs);
    free(cap.contributions);
    cli_fwd_free(&f);
    mha_layer_free(L);
    rc = cli_outputs_finish(&outs, rc);
    free(dn.buf);
    return rc;
}
