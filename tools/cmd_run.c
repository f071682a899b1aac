/* cmd_run.c — `mha run`: one forward pass of a checkpoint on a .npy input,
 * with PyTorch-style masks, head ablations and optional captures (Z, each
 * head's contribution, attention probabilities). Legend: B, T, S, h, d_v,
 * d_model (see mha.h); an unbatched X (T, d_model) gives outputs without
 * the B axis. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "io_cli.h"

/* "2=zero,5=scale:0.5,7=mean" -> iv[h] (head positions, 0-based). */
static int parse_ablate(const char *spec, mha_intervention *iv, int h) {
    const char *p = spec;
    while (*p) {
        char *end;
        errno = 0;
        long r = strtol(p, &end, 10);
        if (end == p || errno || *end != '=')
            return mha_cmd_error("run", MHA_EXIT_USAGE,
                                 "--ablate: expected HEAD=OP at '%.20s' (e.g. 2=zero,5=scale:0.5,7=mean)", p);
        if (r < 0 || r >= h)
            return mha_cmd_error("run", MHA_EXIT_USAGE, "--ablate: head %ld is out of range; expected 0..%d",
                                 r, h - 1);
        p = end + 1;
        size_t n = strcspn(p, ",");
        mha_intervention v = {.op = MHA_HEAD_KEEP, .scale = 1.0f};
        if (n == 4 && strncmp(p, "zero", 4) == 0) v.op = MHA_HEAD_ZERO;
        else if (n == 4 && strncmp(p, "mean", 4) == 0) v.op = MHA_HEAD_MEAN;
        else if (n == 4 && strncmp(p, "keep", 4) == 0) v.op = MHA_HEAD_KEEP;
        else if (n > 6 && strncmp(p, "scale:", 6) == 0) {
            char num[32];
            size_t m = n - 6 < sizeof num - 1 ? n - 6 : sizeof num - 1;
            memcpy(num, p + 6, m);
            num[m] = '\0';
            char *e2;
            errno = 0;
            double s = strtod(num, &e2);
            if (*e2 || errno || s != s || s > 3e38 || s < -3e38)
                return mha_cmd_error("run", MHA_EXIT_USAGE, "--ablate: scale '%s' is not a finite number", num);
            v.op = MHA_HEAD_SCALE;
            v.scale = (float)s;
        } else {
            return mha_cmd_error("run", MHA_EXIT_USAGE,
                                 "--ablate: unknown operation '%.*s' for head %ld; expected zero, mean, "
                                 "scale:F or keep", (int)(n < 20 ? n : 20), p, r);
        }
        if (iv[r].op != MHA_HEAD_KEEP)
            return mha_cmd_error("run", MHA_EXIT_USAGE, "--ablate: head %ld is given twice", r);
        iv[r] = v;
        p += n;
        if (*p == ',') p++;
    }
    return MHA_EXIT_OK;
}

int cmd_run(int argc, char **argv) {
    cli_ckpt ck = {0};
    cli_fwd_flags ff = {0};
    const char *output = NULL, *ablate = NULL, *save_z = NULL, *save_c = NULL, *save_p = NULL,
               *path = NULL, *masked = NULL;
    mha_arg args[] = {
        CLI_CKPT_ARGS(ck, 1),
        CLI_FWD_ARGS(ff),
        {.name = "--output", .kind = MHA_ARG_STRING, .dest = &output, .metavar = "Y.npy",
         .help = "output Y, same rank as X", .required = 1},
        {.name = "--ablate", .kind = MHA_ARG_STRING, .dest = &ablate, .metavar = "SPEC",
         .help = "head interventions before W_O, e.g. 2=zero,5=scale:0.5,7=mean"},
        {.name = "--save-z", .kind = MHA_ARG_STRING, .dest = &save_z, .metavar = "Z.npy",
         .help = "save Z (B,T,h*d_v), after the ablations"},
        {.name = "--save-contributions", .kind = MHA_ARG_STRING, .dest = &save_c,
         .metavar = "C.npy", .help = "save each head's Z^(r) W_O[r], (h,B,T,d_model)"},
        {.name = "--save-probs", .kind = MHA_ARG_STRING, .dest = &save_p, .metavar = "P.npy",
         .help = "save attention probabilities (B,h,T,S_total)"},
        {.name = "--masked-rows", .kind = MHA_ARG_STRING, .dest = &masked, .metavar = "M",
         .help = "a query row with no allowed key gives zero (default) or nan (PyTorch)",
         .choices = "zero|nan"},
        {.name = "--path", .kind = MHA_ARG_STRING, .dest = &path, .metavar = "P",
         .help = "auto (default), reference or fast", .choices = "auto|reference|fast"},
    };
    mha_command_spec spec = {
        .name = "run",
        .summary = "Run one attention layer from a checkpoint on a .npy input and write Y\n"
                   "(and optionally Z, per-head contributions and attention probabilities).",
        .details = "Masks follow torch.nn.MultiheadAttention: a bool mask is True where\n"
                   "attention is NOT allowed; a float mask is added to the scaled scores.\n"
                   "Heads in --ablate are positions 0..h-1 of the loaded layer.\n\n"
                   "example: mha run --weights attn.safetensors --input x.npy --output y.npy \\\n"
                   "           --causal --ablate 1=zero --save-contributions c.npy\n",
        .args = args,
        .n_args = (int)(sizeof args / sizeof args[0]),
    };
    argv = cli_expand_causal(&argc, argv);
    int rc = mha_args_parse(&spec, argc, argv, NULL, NULL);
    if (rc != MHA_ARGS_CONTINUE) return rc;

    mha_layer *L = NULL;
    cli_fwd f;
    memset(&f, 0, sizeof f);
    float *y = NULL;
    mha_capture cap = {0};
    mha_intervention *iv = NULL;
    if ((rc = cli_load_layer("run", &L, &ck, NULL))) return rc;
    const mha_config *c = mha_layer_config(L);
    int h = c->n_heads;
    if ((rc = cli_fwd_prepare("run", &f, L, &ff))) goto done;
    if (path) f.opt.path = strcmp(path, "reference") == 0 ? MHA_PATH_REFERENCE
                           : strcmp(path, "fast") == 0    ? MHA_PATH_FAST
                                                          : MHA_PATH_AUTO;
    if (masked && strcmp(masked, "nan") == 0) f.opt.masked_row = MHA_MASKED_ROW_NAN;
    if (ablate) {
        iv = calloc((size_t)h, sizeof *iv);
        rc = iv ? parse_ablate(ablate, iv, h) : mha_cmd_error("run", 1, "out of memory");
        if (rc) goto done;
        f.opt.interventions = iv;
    }
    int B = f.B, T = f.T, St = f.S + c->add_bias_kv + c->add_zero_attn, dm = c->d_model;
    size_t rows = (size_t)B * T;
    rc = MHA_EXIT_RUNTIME;
    if (!(y = cli_alloc("run", rows * dm))) goto done;
    if (save_z && !(cap.z = cli_alloc("run", rows * h * c->d_v))) goto done;
    if (save_c && !(cap.contributions = cli_alloc("run", (size_t)h * rows * dm))) goto done;
    if (save_p && !(cap.probs = cli_alloc("run", (size_t)h * rows * St))) goto done;
    if ((rc = cli_fwd_run("run", &f, L, y, &cap))) goto done;

    /* unbatched input: drop the B axis from every output */
    int k = f.batched ? 0 : 1;
    int sy[3] = {B, T, dm}, sz[3] = {B, T, h * c->d_v};
    int sc[4] = {h, B, T, dm}, sp[4] = {B, h, T, St};
    if ((rc = cli_save("run", output, y, 3 - k, sy + k))) goto done;
    if (save_z && (rc = cli_save("run", save_z, cap.z, 3 - k, sz + k))) goto done;
    if (save_c) {
        if (k) { sc[1] = T; sc[2] = dm; }
        if ((rc = cli_save("run", save_c, cap.contributions, 4 - k, sc))) goto done;
    }
    if (save_p && (rc = cli_save("run", save_p, cap.probs, 4 - k, sp + k))) goto done;
    printf("wrote %s: %s%d x %d x %d (h=%d, h_kv=%d, d_k=%d, d_v=%d)\n", output,
           f.batched ? "" : "unbatched ", B, T, dm, h, c->n_kv_heads, c->d_k, c->d_v);
done:
    free(y);
    free(cap.z);
    free(cap.contributions);
    free(cap.probs);
    free(iv);
    cli_fwd_free(&f);
    mha_layer_free(L);
    return rc;
}
