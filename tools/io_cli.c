/* io_cli.c — checkpoint loading, input arrays and PyTorch-style masks for
 * the file commands. Masks follow nn.MultiheadAttention: a bool mask says
 * where attention is NOT allowed, so it is inverted here, at the boundary,
 * into the library's keep masks; a float mask is added to the scores. */
#include "io_cli.h"

#include "hf_config.h"
#include "stdin_npy.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

int cli_fail(const char *cmd, mha_status s) {
    const char *msg = mha_last_error();
    return mha_cmd_error(cmd, MHA_EXIT_RUNTIME, "%s", msg[0] ? msg : mha_status_str(s));
}

float *cli_alloc(const char *cmd, size_t n) {
    float *p = calloc(n ? n : 1, sizeof(float));
    if (!p) mha_cmd_error(cmd, MHA_EXIT_RUNTIME, "cannot allocate %zu floats", n);
    return p;
}

float *cli_alloc_out(const char *cmd, size_t n) {
    const size_t huge = (size_t)2 << 20, bytes = (n ? n : 1) * sizeof(float);
    void *p = NULL;
    if (n > SIZE_MAX / sizeof(float)) p = NULL;
    else if (bytes < huge) p = malloc(bytes);
    else if (posix_memalign(&p, huge, bytes) == 0) /* as the library's mha_alloc_large */
        (void)madvise(p, bytes / huge * huge, MADV_HUGEPAGE);
    else p = NULL;
    if (!p) mha_cmd_error(cmd, MHA_EXIT_RUNTIME, "cannot allocate %zu floats", n);
    return p;
}

mha_status cli_load_options(mha_load_options *o, const cli_ckpt *ck) {
    *o = (mha_load_options){.n_heads = (int)ck->heads, .n_kv_heads = (int)ck->kv_heads, .prefix = ck->prefix,
                            .add_zero_attn = ck->zero_attn};
    mha_status s = mha_layout_parse(&o->layout, ck->layout ? ck->layout : "auto");
    /* Qwen 1, ChatGLM, CodeGen: config.json names the layout (a --layout naming another: cli_hf_config_read) */
    const char *family = s || o->layout != MHA_LAYOUT_AUTO ? NULL : cli_hf_config_layout(ck, ck->weights);
    return family ? mha_layout_parse(&o->layout, family) : s;
}

int cli_load_layer(const char *cmd, mha_layer **L, const cli_ckpt *ck, const char *path) {
    mha_load_options o;
    mha_status s = cli_load_options(&o, ck);
    cli_hf_config hc;
    int rc = s ? 0 : cli_hf_config_read(&hc, cmd, ck, path);
    if (rc) return rc;
    const int from_config = !s && hc.found && ((!o.n_heads && hc.heads) || (!o.n_kv_heads && hc.kv_heads));
    if (!s && hc.found && !o.n_heads) o.n_heads = (int)hc.heads; /* --heads wins over config.json */
    if (!s && hc.found && !o.n_kv_heads) o.n_kv_heads = (int)hc.kv_heads;
    if (!s && hc.found) o.output_gate = hc.output_gate; /* Qwen3-Next: q_proj holds the gate */
    if (!s && hc.found && hc.layout) s = mha_layout_parse(&o.layout, hc.layout); /* Qwen 1, ChatGLM, CodeGen */
    if (!s) s = mha_layer_load(L, path ? path : ck->weights, &o);
    /* the shapes refuse head counts the user never typed: say where they came from (only then: a malformed
     * tensor is refused as before) */
    if (s == MHA_E_SHAPE && from_config && strstr(mha_last_error(), "do not split into")) {
        char kv[48] = "";
        if (o.n_kv_heads) snprintf(kv, sizeof kv, ", %d kv heads", o.n_kv_heads);
        return mha_cmd_error(cmd, MHA_EXIT_RUNTIME, "%s (%d heads%s from the config.json beside the checkpoint: is "
                             "it the config of another model? --heads and --kv-heads override it)", mha_last_error(),
                             o.n_heads, kv);
    }
    if (s) return cli_fail(cmd, s);
    if ((rc = cli_hf_config_check(&hc, cmd, mha_layer_config(*L)))) mha_layer_free(*L), *L = NULL;
    return rc;
}

int cli_parse_load(mha_layer **L, const char **pos, mha_command_spec *spec, const cli_ckpt *ck,
                   cli_outputs *outs, int argc, char **argv) {
    int npos = 0;
    *L = NULL;
    int rc = mha_args_parse(spec, argc, argv, pos, &npos);
    if (rc != MHA_ARGS_CONTINUE) return rc;
    if (outs && (rc = cli_outputs_check(outs))) return rc;
    rc = cli_load_layer(spec->name, L, ck, pos && npos > 0 ? pos[0] : NULL);
    if (rc && outs) cli_outputs_finish(outs, rc);
    return rc ? rc : MHA_ARGS_CONTINUE;
}

void cli_register_inputs(cli_outputs *outs, const cli_ckpt *ck, const cli_fwd_flags *ff) {
    cli_outputs_checkpoint(outs, "--weights", &ck->weights);
    if (!ff) return;
    cli_outputs_input(outs, "--input", &ff->input);
    cli_outputs_input(outs, "--kv-input", &ff->kv_input);
    cli_outputs_input(outs, "--attn-mask", &ff->attn_mask);
    cli_outputs_input(outs, "--key-padding-mask", &ff->key_padding_mask);
}

char **cli_expand_causal(int *argc, char **argv) {
    static char *out[512];
    static char buf[64];
    if (*argc >= 511) return argv; /* too long to rewrite: the parser reports it */
    int n = 0;
    for (int i = 0; i < *argc && n < 511; i++) {
        if (strcmp(argv[i], "--causal") == 0) {
            const char *v = "top-left";
            if (i + 1 < *argc &&
                (strcmp(argv[i + 1], "top-left") == 0 || strcmp(argv[i + 1], "bottom-right") == 0))
                v = argv[++i];
            snprintf(buf, sizeof buf, "--causal=%s", v);
            out[n++] = buf;
        } else {
            out[n++] = argv[i];
        }
    }
    out[n] = NULL;
    *argc = n;
    return out;
}

typedef struct {
    const float *data;
    int rank;
    const int *shape;
} npy_f32;

static mha_status write_npy_f32(const char *path, const void *ctx) {
    const npy_f32 *a = ctx;
    return mha_npy_write_f32(path, a->data, a->rank, a->shape);
}

mha_status cli_write_layer(const char *path, const void *layer) { return mha_layer_save(layer, path); }

int cli_save(cli_outputs *outs, const char *flag, const float *data, int rank, const int *shape) {
    return cli_outputs_write(outs, flag, write_npy_f32, &(npy_f32){data, rank, shape});
}

/* Reads a (rows, width) or (B, rows, width) float array. */
static int read_tokens(const char *cmd, mha_array *a, const char *path, const char *what,
                       int width, const char *width_name, int *B, int *rows, int *batched) {
    int rc = cli_npy_read(cmd, a, path, 0);
    if (rc) return rc;
    path = cli_input_name(path); /* "-": messages name standard input */
    if (!a->f || (a->rank != 2 && a->rank != 3))
        return mha_cmd_error(cmd, MHA_EXIT_RUNTIME,
                             "%s: %s is %s of rank %d; expected float (T, %s) or (B, T, %s)", path,
                             what, mha_dtype_name(a->dtype), a->rank, width_name, width_name);
    *batched = a->rank == 3;
    *B = *batched ? a->shape[0] : 1;
    *rows = a->shape[a->rank - 2];
    int w = a->shape[a->rank - 1];
    if (w != width)
        return mha_cmd_error(cmd, MHA_EXIT_RUNTIME,
                             "%s: %s has width %d; the layer expects %s = %d", path, what, w,
                             width_name, width);
    if (*rows < 1 || *B < 1)
        return mha_cmd_error(cmd, MHA_EXIT_RUNTIME, "%s: %s is empty", path, what);
    return MHA_EXIT_OK;
}

const char *cli_shape_str(const mha_array *m, char *buf, size_t cap) {
    size_t n = (size_t)snprintf(buf, cap, "(");
    for (int i = 0; i < m->rank && n < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%d", i ? ", " : "", m->shape[i]);
    if (n < cap) snprintf(buf + n, cap - n, "%s)", m->rank == 1 ? "," : "");
    return buf;
}

/* nn.MultiheadAttention attn_mask: (T,S) or (B*h,T,S) [(h,T,S) unbatched]. */
static int attn_mask(const char *cmd, cli_fwd *f, const mha_config *c, const char *path) {
    int rc = cli_npy_read(cmd, &f->am, path, MHA_IO_ALLOW_NEG_INF);
    if (rc) return rc;
    path = cli_input_name(path);
    mha_array *m = &f->am;
    int T = f->T, S = f->S, batch = 1, heads = 1;
    const long long bh = (long long)f->B * c->n_heads; /* in int it can wrap to a legal size */
    if (m->rank == 2 && m->shape[0] == T && m->shape[1] == S) {
        /* broadcast over batch and heads */
    } else if (m->rank == 3 && m->shape[0] == bh && m->shape[1] == T &&
               m->shape[2] == S) {
        batch = f->B;
        heads = c->n_heads;
    } else {
        char got[96];
        return mha_cmd_error(cmd, MHA_EXIT_RUNTIME,
                             "%s: attn_mask has shape %s; expected (T, S) = (%d, %d) or "
                             "(B*h, T, S) = (%lld, %d, %d)",
                             path, cli_shape_str(m, got, sizeof got), T, S, bh, T, S);
    }
    if (m->f) {
        f->opt.additive_mask = (mha_mask){m->f, batch, heads};
    } else { /* bool (or deprecated uint8): nonzero = NOT allowed */
        f->keep = malloc(m->count);
        if (!f->keep) return mha_cmd_error(cmd, MHA_EXIT_RUNTIME, "out of memory");
        for (size_t i = 0; i < m->count; i++) f->keep[i] = m->u8[i] == 0;
        f->opt.keep_mask = (mha_mask){f->keep, batch, heads};
    }
    return MHA_EXIT_OK;
}

/* nn.MultiheadAttention key_padding_mask: (B,S), or (S,) for unbatched X. */
static int key_padding(const char *cmd, cli_fwd *f, const char *path) {
    int rc = cli_npy_read(cmd, &f->kp, path, MHA_IO_ALLOW_NEG_INF);
    if (rc) return rc;
    path = cli_input_name(path);
    mha_array *m = &f->kp;
    int ok = (m->rank == 2 && m->shape[0] == f->B && m->shape[1] == f->S) ||
             (m->rank == 1 && f->B == 1 && m->shape[0] == f->S);
    char got[96];
    if (!ok)
        return mha_cmd_error(cmd, MHA_EXIT_RUNTIME,
                             "%s: key_padding_mask has shape %s; expected (B, S) = (%d, %d)%s",
                             path, cli_shape_str(m, got, sizeof got), f->B, f->S,
                             f->B == 1 ? " or (S,)" : "");
    if (m->f) {
        f->opt.key_additive = m->f;
    } else {
        f->key_keep = malloc(m->count);
        if (!f->key_keep) return mha_cmd_error(cmd, MHA_EXIT_RUNTIME, "out of memory");
        for (size_t i = 0; i < m->count; i++) f->key_keep[i] = m->u8[i] == 0;
        f->opt.key_keep = f->key_keep;
    }
    return MHA_EXIT_OK;
}

int cli_fwd_prepare(const char *cmd, cli_fwd *f, const mha_layer *L, const cli_fwd_flags *ff) {
    return cli_fwd_prepare_config(cmd, f, mha_layer_config(L), ff);
}

int cli_fwd_prepare_config(const char *cmd, cli_fwd *f, const mha_config *c, const cli_fwd_flags *ff) {
    memset(f, 0, sizeof *f);
    f->opt = mha_options_default();
    int rc = read_tokens(cmd, &f->x, ff->input, "the input X", c->d_model, "d_model", &f->B,
                         &f->T, &f->batched);
    if (rc) return rc;
    f->S = f->T;
    if (ff->kv_input) {
        int B2, batched2;
        rc = read_tokens(cmd, &f->kv, ff->kv_input, "the key/value input", c->d_kv_in, "d_kv_in",
                         &B2, &f->S, &batched2);
        if (rc) return rc;
        if (B2 != f->B || batched2 != f->batched)
            return mha_cmd_error(cmd, MHA_EXIT_RUNTIME,
                                 "%s: key/value input has batch %d%s; expected the input's batch %d%s",
                                 cli_input_name(ff->kv_input), B2, batched2 ? "" : " (unbatched)", f->B,
                                 f->batched ? "" : " (unbatched)");
    } else if (c->d_kv_in != c->d_model) {
        return mha_cmd_error(cmd, MHA_EXIT_USAGE,
                             "the layer's d_kv_in = %d differs from d_model = %d; pass --kv-input",
                             c->d_kv_in, c->d_model);
    }
    if (ff->causal) {
        f->opt.causal = 1;
        f->opt.align = strcmp(ff->causal, "bottom-right") == 0 ? MHA_ALIGN_BOTTOM_RIGHT
                                                                : MHA_ALIGN_TOP_LEFT;
    }
    if (ff->attn_mask && (rc = attn_mask(cmd, f, c, ff->attn_mask))) return rc;
    if (ff->key_padding_mask && (rc = key_padding(cmd, f, ff->key_padding_mask))) return rc;
    return MHA_EXIT_OK;
}

void cli_fwd_free(cli_fwd *f) {
    mha_array_free(&f->x);
    mha_array_free(&f->kv);
    mha_array_free(&f->am);
    mha_array_free(&f->kp);
    free(f->keep);
    free(f->key_keep);
    memset(f, 0, sizeof *f);
}

int cli_fwd_run(const char *cmd, const cli_fwd *f, const mha_layer *L, float *y,
                const mha_capture *cap) {
    mha_status s = mha_forward(L, y, cap, f->x.f, f->kv.f, f->B, f->T, f->S, &f->opt);
    return s ? cli_fail(cmd, s) : MHA_EXIT_OK;
}

int cli_fwd_open(mha_layer **L, cli_fwd *f, mha_command_spec *spec, const cli_ckpt *ck,
                 const cli_fwd_flags *ff, cli_outputs *outs, int argc, char **argv) {
    memset(f, 0, sizeof *f);
    argv = cli_expand_causal(&argc, argv);
    int rc = cli_parse_load(L, NULL, spec, ck, outs, argc, argv);
    if (rc != MHA_ARGS_CONTINUE) return rc;
    if ((rc = cli_fwd_prepare(spec->name, f, *L, ff))) {
        cli_fwd_free(f);
        mha_layer_free(*L);
        *L = NULL;
        if (outs) cli_outputs_finish(outs, rc);
        return rc;
    }
    return MHA_ARGS_CONTINUE;
}
