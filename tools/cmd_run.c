/* cmd_run.c — `mha run`: one forward pass of a checkpoint on a .npy input,
 * with PyTorch-style masks, head ablations and optional captures (Z, each
 * head's contribution, attention probabilities), and optionally a value
 * source apart from the key source (PyTorch's `value`). Legend: B, T, S, h,
 * d_v, d_model, d_kv_in, d_v_in (see mha.h); an unbatched X (T, d_model)
 * gives outputs without the B axis. */
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "io_cli.h"
#include "run_variants.h"
#include "run_attribution.h"
#include "stdin_npy.h"

/* The HEAD=OP items of spec into iv; seen marks the heads given. */
static int parse_ablate_ops(const char *p, mha_intervention *iv, int h, unsigned char *seen) {
    while (*p) {
        char *end;
        errno = 0;
        long r = strtol(p, &end, 10);
        if (!isdigit((unsigned char)*p) || end == p || errno || *end != '=') /* not " 2" or "+2" */
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
            /* strtod reads the whole number in place, however many digits
             * it is written with; it must end exactly at the ',' or end */
            const char *num = p + 6;
            char *e2;
            errno = 0;
            double s = strtod(num, &e2);
            if (e2 != p + n || isspace((unsigned char)*num) || errno || s != s || s > 3e38 ||
                s < -3e38)
                return mha_cmd_error("run", MHA_EXIT_USAGE,
                                     "--ablate: scale '%.*s' is not a finite float32 number",
                                     (int)(n - 6 < 60 ? n - 6 : 60), num);
            v.op = MHA_HEAD_SCALE;
            v.scale = (float)s;
        } else {
            return mha_cmd_error("run", MHA_EXIT_USAGE,
                                 "--ablate: unknown operation '%.*s' for head %ld; expected zero, mean, "
                                 "scale:F or keep", (int)(n < 20 ? n : 20), p, r);
        }
        if (seen[r]++)
            return mha_cmd_error("run", MHA_EXIT_USAGE, "--ablate: head %ld is given twice", r);
        iv[r] = v;
        p += n;
        if (*p == ',' && !*++p)
            return mha_cmd_error("run", MHA_EXIT_USAGE, "--ablate: a ',' ends the list; expected HEAD=OP after it");
    }
    return MHA_EXIT_OK;
}

/* "2=zero,5=scale:0.5,7=mean" -> iv[h] (head positions, 0-based). */
int cli_parse_ablate(const char *spec, mha_intervention *iv, int h) {
    unsigned char *seen = calloc((size_t)h, 1); /* (h): heads given so far, keep included */
    if (!seen) return mha_cmd_error("run", MHA_EXIT_RUNTIME, "out of memory");
    int rc = parse_ablate_ops(spec, iv, h, seen);
    free(seen);
    return rc;
}

/* --cu-seqlens "0,5,12" -> *cu (malloc'ed, *n_seqs + 1 ints): whole numbers
 * (digits only: strtol alone would take " 5" and "+5") up to INT_MAX, at
 * least two. Their rule (0 = cu[0] < ... < cu[n] = T, S = T, no
 * sink_tokens or chunk_size) is the library's: its refusal names it. */
static int parse_cu_seqlens(const char *spec, int **cu, int *n_seqs) {
    size_t n = 1;
    for (const char *q = spec; *q; q++) n += *q == ',';
    if (n < 2)
        return mha_cmd_error("run", MHA_EXIT_USAGE,
                             "--cu-seqlens '%.60s': one boundary; expected at least two, 0 and T (0,T: one sequence; "
                             "0,5,12: rows 0..4 and 5..11)", spec);
    if (n > (size_t)INT_MAX / 2 || !(*cu = malloc(n * sizeof **cu)))
        return mha_cmd_error("run", MHA_EXIT_RUNTIME, "--cu-seqlens: out of memory for %zu boundaries", n);
    const char *p = spec;
    for (size_t i = 0; i < n; i++) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (!isdigit((unsigned char)*p) || end == p || errno || v > INT_MAX || (i + 1 < n ? *end != ',' : *end != '\0')) {
            size_t len = strcspn(p, ",");
            free(*cu);
            *cu = NULL;
            return mha_cmd_error("run", MHA_EXIT_USAGE,
                                 "--cu-seqlens: boundary %zu is '%.*s'; expected comma-separated whole numbers "
                                 "0 = cu[0] < ... < cu[n] = T (e.g. 0,5,12)",
                                 i, (int)(len < 20 ? len : 20), p);
        }
        (*cu)[i] = (int)v;
        p = end + 1;
    }
    *n_seqs = (int)n - 1;
    return MHA_EXIT_OK;
}

/* --v-input: (S, d_v_in) or (B, S, d_v_in), batched like X, S rows as the
 * key source. */
static int read_values(mha_array *v, const char *path, const cli_fwd *f, const mha_config *c) {
    int rc = cli_npy_read("run", v, path, 0);
    if (rc) return rc;
    path = cli_input_name(path);
    int rank = f->batched ? 3 : 2;
    if (!v->f || v->rank != rank)
        return mha_cmd_error("run", MHA_EXIT_RUNTIME,
                             "%s: the value input is %s of rank %d; expected float %s", path,
                             mha_dtype_name(v->dtype), v->rank,
                             f->batched ? "(B, S, d_v_in), batched like the input"
                                        : "(S, d_v_in), unbatched like the input");
    int B = f->batched ? v->shape[0] : 1, S = v->shape[rank - 2], w = v->shape[rank - 1];
    if (B != f->B || S != f->S || w != c->d_v_in)
        return mha_cmd_error("run", MHA_EXIT_RUNTIME,
                             "%s: the value input is (%d, %d, %d) as (B, S, d_v_in); expected "
                             "(%d, %d, %d): the input's batch, the key source's S and the layer's "
                             "d_v_in", path, B, S, w, f->B, f->S, c->d_v_in);
    return MHA_EXIT_OK;
}

int cmd_run(int argc, char **argv) {
#if defined(__GLIBC__)
    /* One short process that frees the load path's buffers (the converted
     * weights, ~4 floats per weight) before the forward allocates as much:
     * keep freed memory for reuse instead of returning it to the kernel and
     * faulting fresh zeroed pages in again (bench/LOAD.md). */
    mallopt(M_MMAP_THRESHOLD, 256 << 20);
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
#endif
    cli_ckpt ck = {0};
    cli_fwd_flags ff = {0};
    cli_variant_flags vf = {0};
    const char *output = NULL, *ablate = NULL, *save_z = NULL, *save_c = NULL, *save_p = NULL,
               *path = NULL, *masked = NULL, *v_input = NULL, *grad_output = NULL, *save_a = NULL,
               *wdtype = NULL, *cu_spec = NULL;
    double max_gib = 0;
    int bf16_matmul = 0;
    mha_arg args[] = {
        CLI_CKPT_ARGS(ck, 1),
        CLI_FWD_ARGS(ff),
        {.name = "--v-input", .kind = MHA_ARG_STRING, .dest = &v_input, .metavar = "V.npy",
         .help = "value source apart from the keys (PyTorch's value), (S, d_v_in) or "
                 "(B, S, d_v_in); default the key/value input"},
        {.name = "--output", .kind = MHA_ARG_STRING, .dest = &output, .metavar = "Y.npy",
         .help = "output Y, same rank as X", .required = 1},
        CLI_RUN_OUTPUT_ARGS(ablate, save_z, save_c, save_p, masked),
        {.name = "--grad-output", .kind = MHA_ARG_STRING, .dest = &grad_output, .metavar = "dY.npy",
         .help = "dY, shaped like Y: the metric <dY, Y> for --save-attribution"},
        {.name = "--save-attribution", .kind = MHA_ARG_STRING, .dest = &save_a, .metavar = "A.npy",
         .help = "save each head's attribution Z^(r).dZ^(r) of <dY, Y>, (h,B,T) (docs/BACKWARD.md)"},
        {.name = "--cu-seqlens", .kind = MHA_ARG_STRING, .dest = &cu_spec, .metavar = "0,T1,...,T",
         .help = "packed sequences (FlashAttention's varlen cu_seqlens): rows cu[s]..cu[s+1]-1 of every "
                 "batch row attend only each other; self-attention (docs/FILES.md)"},
        {.name = "--path", .kind = MHA_ARG_STRING, .dest = &path, .metavar = "P",
         .help = "auto (default), reference or fast", .choices = "auto|reference|fast"},
        {.name = "--weights-dtype", .kind = MHA_ARG_STRING, .dest = &wdtype, .metavar = "T",
         .help = "run with W_Q, W_K, W_V, W_O rounded to bf16 or int8 (docs/WEIGHTS.md); "
                 "default: as loaded", .choices = "f32|bf16|int8"},
        {.name = "--bf16-matmul", .kind = MHA_ARG_SWITCH, .dest = &bf16_matmul,
         .help = "multiply the projections in bf16 (inputs rounded, fp32 sums; AMX tiles where the "
                 "CPU has them): needs bf16 weights (--weights-dtype bf16; docs/WEIGHTS.md)"},
        CLI_VARIANT_ARGS(vf),
        CLI_MAX_OUTPUT_ARG(max_gib),
    };
    mha_command_spec spec = {
        .name = "run",
        .summary = "Run one attention layer from a checkpoint on a .npy input and write Y\n"
                   "(and optionally Z, per-head contributions and attention probabilities).",
        .details = "Masks follow torch.nn.MultiheadAttention: a bool mask is True where\n"
                   "attention is NOT allowed; a float mask is added to the scaled scores.\n"
                   "Heads in --ablate are positions 0..h-1 of the loaded layer.\n"
                   "--v-input feeds W_V while --kv-input (or X) feeds W_K, as PyTorch's\n"
                   "key and value; a layer whose d_v_in differs from d_kv_in needs it.\n"
                   "--cu-seqlens 0,5,12 packs sequences: rows 0..4 and 5..11 of every batch\n"
                   "row attend only each other, as if each were run alone.\n\n"
                   "Every output is written to a temporary file next to it and renamed over\n"
                   "the target only when the whole command succeeded: a failed run leaves\n"
                   "every existing file as it was. An output may not be an input or another\n"
                   "output. One output may be '-', standard output (not a terminal): written\n"
                   "there only when the command succeeded; the summary line goes to stderr.\n"
                   "One input array (--input, --kv-input, --v-input, a mask, --positions,\n"
                   "--grad-output) may be '-', standard input, read whole before the run;\n"
                   "--weights may not (a checkpoint is mapped from its file).\n\n"
                   "example: mha run --weights attn.safetensors --input x.npy --output y.npy \\\n"
                   "           --causal --ablate 1=zero --save-contributions c.npy\n",
        .args = args,
        .n_args = (int)(sizeof args / sizeof args[0]),
    };
    cli_outputs outs;
    cli_outputs_init(&outs, "run");
    outs.stdin_ok = 1; /* one array input may be "-" (stdin_npy.h) */
    cli_register_inputs(&outs, &ck, &ff);
    cli_outputs_input(&outs, "--v-input", &v_input);
    cli_outputs_array(&outs, "--output", &output);
    cli_outputs_array(&outs, "--save-z", &save_z);
    cli_outputs_array(&outs, "--save-contributions", &save_c);
    cli_outputs_array(&outs, "--save-probs", &save_p);
    cli_outputs_input(&outs, "--grad-output", &grad_output);
    cli_outputs_array(&outs, "--save-attribution", &save_a);
    cli_outputs_input(&outs, "--positions", &vf.positions);
    mha_layer *L;
    cli_fwd f;
    int rc = cli_fwd_open(&L, &f, &spec, &ck, &ff, &outs, argc, argv);
    if (rc != MHA_ARGS_CONTINUE) return rc;

    float *y = NULL, *attr = NULL; /* (B,T,d_model), (h,B,T) */
    mha_capture cap = {0};
    mha_intervention *iv = NULL;
    int *cu = NULL; /* (n_seqs + 1) boundaries of --cu-seqlens */
    mha_array v = {0};
    if ((rc = cli_apply_variants("run", &L, &f, &vf, &ck))) goto done;
    mha_weight_dtype wd;
    if (wdtype && (mha_weight_dtype_parse(&wd, wdtype) || mha_layer_convert_weights(L, wd))) {
        rc = mha_cmd_error("run", MHA_EXIT_RUNTIME, "--weights-dtype %s: %s", wdtype, mha_last_error());
        goto done;
    }
    const mha_config *c = mha_layer_config(L);
    int h = c->n_heads;
    if (v_input && (rc = read_values(&v, v_input, &f, c))) goto done;
    if (!v_input && c->d_v_in != (ff.kv_input ? c->d_kv_in : c->d_model)) {
        rc = mha_cmd_error("run", MHA_EXIT_USAGE,
                           "the layer's d_v_in = %d differs from the key source's width %d; pass "
                           "--v-input", c->d_v_in, ff.kv_input ? c->d_kv_in : c->d_model);
        goto done;
    }
    if (path) f.opt.path = strcmp(path, "reference") == 0 ? MHA_PATH_REFERENCE
                           : strcmp(path, "fast") == 0    ? MHA_PATH_FAST
                                                          : MHA_PATH_AUTO;
    if (masked && strcmp(masked, "nan") == 0) f.opt.masked_row = MHA_MASKED_ROW_NAN;
    f.opt.bf16_matmul = bf16_matmul;
    if (cu_spec) {
        if ((rc = parse_cu_seqlens(cu_spec, &cu, &f.opt.n_seqs))) goto done;
        f.opt.cu_seqlens = cu;
    }
    if (ablate) {
        iv = calloc((size_t)h, sizeof *iv);
        rc = iv ? cli_parse_ablate(ablate, iv, h) : mha_cmd_error("run", 1, "out of memory");
        if (rc) goto done;
        f.opt.interventions = iv;
    }
    int B = f.B, T = f.T, St = f.S + c->add_bias_kv + c->add_zero_attn, dm = c->d_model;
    size_t rows = (size_t)B * T;
    /* every output is held in memory at once: each, and their sum, must fit */
    double limit = max_gib > 0 ? max_gib : cli_default_output_limit_gib();
    double ny = (double)rows * dm, nz = save_z ? (double)rows * h * c->d_v : 0,
           nc = save_c ? (double)h * rows * dm : 0, np = save_p ? (double)h * rows * St : 0,
           na = save_a ? (double)h * rows : 0;
    if ((rc = cli_check_output_size("run", "--output", ny, limit)) ||
        (rc = cli_check_output_size("run", "--save-z", nz, limit)) ||
        (rc = cli_check_output_size("run", "--save-contributions", nc, limit)) ||
        (rc = cli_check_output_size("run", "--save-probs", np, limit)) ||
        (rc = cli_check_output_size("run", "the outputs together", ny + nz + nc + np + na, limit)))
        goto done;
    rc = MHA_EXIT_RUNTIME;
    /* the forward overwrites each whole: no zeroing pass first */
    if (!(y = cli_alloc_out("run", rows * dm))) goto done;
    if (save_z && !(cap.z = cli_alloc_out("run", rows * h * c->d_v))) goto done;
    if (save_c && !(cap.contributions = cli_alloc_out("run", (size_t)h * rows * dm))) goto done;
    if (save_p && !(cap.probs = cli_alloc_out("run", (size_t)h * rows * St))) goto done;
    if (v.f) { /* keys from KV (or X), values from V */
        mha_status s = mha_forward_kv(L, y, &cap, f.x.f, f.kv.f, v.f, B, T, f.S, &f.opt);
        if (s) {
            rc = cli_fail("run", s);
            goto done;
        }
    } else if ((rc = cli_fwd_run("run", &f, L, y, &cap))) {
        goto done;
    }

    if ((rc = run_attribution(&attr, grad_output, save_a, L, &f, v.f))) goto done;

    /* unbatched input: drop the B axis from every output */
    int k = f.batched ? 0 : 1;
    int sy[3] = {B, T, dm}, sz[3] = {B, T, h * c->d_v};
    int sc[4] = {h, B, T, dm}, sp[4] = {B, h, T, St};
    if ((rc = cli_save(&outs, "--output", y, 3 - k, sy + k))) goto done;
    if (save_z && (rc = cli_save(&outs, "--save-z", cap.z, 3 - k, sz + k))) goto done;
    if (save_c) {
        if (k) { sc[1] = T; sc[2] = dm; }
        if ((rc = cli_save(&outs, "--save-contributions", cap.contributions, 4 - k, sc))) goto done;
    }
    if (save_p && (rc = cli_save(&outs, "--save-probs", cap.probs, 4 - k, sp + k))) goto done;
    int sa[3] = {h, B, T};
    if (k) sa[1] = T;
    if (attr && (rc = cli_save(&outs, "--save-attribution", attr, 3 - k, sa))) goto done;
    if ((rc = cli_outputs_finish(&outs, MHA_EXIT_OK))) goto done;
    fprintf(cli_outputs_report(&outs), "wrote %s: %s%d x %d x %d (h=%d, h_kv=%d, d_k=%d, d_v=%d)\n",
            strcmp(output, "-") ? output : "standard output",
           f.batched ? "" : "unbatched ", B, T, dm, h, c->n_kv_heads, c->d_k, c->d_v);
done:
    free(y);
    free(attr);
    free(cap.z);
    free(cap.contributions);
    free(cap.probs);
    free(iv);
    free(cu);
    mha_array_free(&v);
    cli_variants_free(&vf);
    cli_fwd_free(&f);
    mha_layer_free(L);
    return cli_outputs_finish(&outs, rc);
}
