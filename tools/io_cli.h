/* io_cli.h — pieces shared by the file commands (run, convert, permute,
 * audit, plot): checkpoint flags, input arrays, PyTorch-style masks, and
 * one forward pass with its captures. Legend: B batch, T query tokens,
 * S key tokens, h heads, d_v, d_model (see mha.h). Every function returns
 * an exit code (args.h) after printing "mha <cmd>: ..." on failure. */
#ifndef MHA_TOOLS_IO_CLI_H
#define MHA_TOOLS_IO_CLI_H

#include "args.h"
#include "mha.h"
#include "outputs.h"

/* --- checkpoint flags: --weights --layout --heads --kv-heads --prefix --- */
typedef struct {
    const char *weights;
    const char *layout;
    const char *prefix;
    long long heads, kv_heads;
    int zero_attn;
} cli_ckpt;

#define CLI_LAYOUT_CHOICES "auto|native|torch|hf|gpt2|megatron|codegen"
#define CLI_CKPT_ARGS(ck, weights_required)                                                   \
    {.name = "--weights", .kind = MHA_ARG_STRING, .dest = &(ck).weights, .metavar = "W",        \
     .help = "checkpoint: .safetensors, a sharded one's .index.json, or a save_pretrained directory",\
     .required = (weights_required)},                                                            \
    CLI_LAYOUT_ARGS(ck, "--layout")
#define CLI_LAYOUT_ARGS(ck, layout_flag)                                                      \
    {.name = layout_flag, .kind = MHA_ARG_STRING, .dest = &(ck).layout, .metavar = "L",          \
     .help = "checkpoint layout; default auto (detected from the tensor names)",               \
     .choices = CLI_LAYOUT_CHOICES},                                                           \
    {.name = "--heads", .kind = MHA_ARG_INT, .dest = &(ck).heads, .metavar = "H",               \
     .help = "query heads h (needed unless the file's metadata has n_heads)", .min = 1,         \
     .max = 4096},                                                                             \
    {.name = "--kv-heads", .kind = MHA_ARG_INT, .dest = &(ck).kv_heads, .metavar = "G",         \
     .help = "key/value heads h_kv; default from the metadata or the shapes", .min = 1,         \
     .max = 4096},                                                                             \
    {.name = "--prefix", .kind = MHA_ARG_STRING, .dest = &(ck).prefix, .metavar = "P",          \
     .help = "the layer's module: its path or one holding only it, e.g. model.layers.0 or h.0.attn."}, \
    {.name = "--zero-attn", .kind = MHA_ARG_SWITCH, .dest = &(ck).zero_attn,                     \
     .help = "the layer appends a zero key/value row (torch's add_zero_attn=True, which a state_dict does not record)"}

/* Loads path (ck->weights unless path is given) as a layer. */
int cli_load_layer(const char *cmd, mha_layer **L, const cli_ckpt *ck, const char *path);
/* The load options the checkpoint flags give (MHA_E_ARG: a bad --layout); with
 * --layout auto, the layout config.json's model_type names (Qwen 1, ChatGLM,
 * CodeGen: cli_hf_config_layout). */
mha_status cli_load_options(mha_load_options *o, const cli_ckpt *ck);

/* The opening of every checkpoint command: parses argv against spec
 * (positional arguments into pos, which may be NULL when the spec takes
 * none), checks the command's files (cli_outputs_check; outs may be NULL
 * for a command that writes nothing), then loads the layer from pos[0]
 * when one was given, else from ck->weights. Returns MHA_ARGS_CONTINUE
 * with *L loaded, or the exit code (0 after --help) with *L left NULL and
 * no temporary left. */
int cli_parse_load(mha_layer **L, const char **pos, mha_command_spec *spec, const cli_ckpt *ck,
                   cli_outputs *outs, int argc, char **argv);
/* Registers the checkpoint and forward-pass input flags with outs. */
struct cli_fwd_flags;
void cli_register_inputs(cli_outputs *outs, const cli_ckpt *ck, const struct cli_fwd_flags *ff);

/* --- forward-pass flags shared by run, audit and plot --- */
typedef struct cli_fwd_flags {
    const char *input, *kv_input;
    const char *causal;   /* NULL, "top-left" or "bottom-right" */
    const char *attn_mask, *key_padding_mask;
} cli_fwd_flags;

#define CLI_FWD_ARGS(ff)                                                                       \
    {.name = "--input", .kind = MHA_ARG_STRING, .dest = &(ff).input, .metavar = "X.npy",       \
     .help = "queries X, (T, d_model) or (B, T, d_model), float32/float16", .required = 1},      \
    {.name = "--kv-input", .kind = MHA_ARG_STRING, .dest = &(ff).kv_input, .metavar = "KV.npy", \
     .help = "key/value source, (S, d_kv_in) or (B, S, d_kv_in); default X"},                   \
    {.name = "--causal", .kind = MHA_ARG_STRING, .dest = &(ff).causal, .metavar = "ALIGN",      \
     .help = "causal mask; bare --causal means top-left", .choices = "top-left|bottom-right"},    \
    {.name = "--attn-mask", .kind = MHA_ARG_STRING, .dest = &(ff).attn_mask, .metavar = "M.npy", \
     .help = "PyTorch attn_mask (T,S) or (B*h,T,S): bool True = may NOT attend; float = added"}, \
    {.name = "--key-padding-mask", .kind = MHA_ARG_STRING, .dest = &(ff).key_padding_mask,      \
     .metavar = "P.npy",                                                                       \
     .help = "PyTorch key_padding_mask (B,S) or (S,): bool True = padding (ignored); float = added"}

/* --ablate, --save-z, --save-contributions, --save-probs, --masked-rows:
 * the outputs of `mha run` and `mha-mpi run` (const char * destinations). */
#define CLI_RUN_OUTPUT_ARGS(ablate, save_z, save_c, save_p, masked)                           \
    {.name = "--ablate", .kind = MHA_ARG_STRING, .dest = &(ablate), .metavar = "SPEC",         \
     .help = "head interventions before W_O, e.g. 2=zero,5=scale:0.5,7=mean"},                  \
    {.name = "--save-z", .kind = MHA_ARG_STRING, .dest = &(save_z), .metavar = "Z.npy",        \
     .help = "save Z (B,T,h*d_v), after the ablations"},                                       \
    {.name = "--save-contributions", .kind = MHA_ARG_STRING, .dest = &(save_c),                \
     .metavar = "C.npy", .help = "save each head's Z^(r) W_O[r], (h,B,T,d_model)"},           \
    {.name = "--save-probs", .kind = MHA_ARG_STRING, .dest = &(save_p), .metavar = "P.npy",    \
     .help = "save attention probabilities (B,h,T,S_total)"},                                  \
    {.name = "--masked-rows", .kind = MHA_ARG_STRING, .dest = &(masked), .metavar = "M",       \
     .help = "a query row with no allowed key gives zero (default) or nan (PyTorch)",          \
     .choices = "zero|nan"}

/* Rewrites a bare "--causal" (optionally followed by its value as the next
 * word) to "--causal=VALUE" so the strict parser sees one form. Returns a
 * new argv (static storage, argc updated). */
char **cli_expand_causal(int *argc, char **argv);

/* Inputs, masks and options of one forward pass, ready for mha_forward. */
typedef struct {
    int B, T, S;     /* S = T for self-attention                        */
    int batched;     /* X was (B,T,d_model) rather than (T,d_model)      */
    mha_array x, kv; /* kv.f == NULL: self-attention                    */
    mha_array am, kp; /* masks as read                                  */
    uint8_t *keep, *key_keep;   /* converted PyTorch bool masks          */
    mha_options opt;
} cli_fwd;

/* Reads X (and KV, masks) and fills f->opt for layer L. */
/* cli_fwd_prepare from the layer's config alone (mha-mpi: no rank holds
 * the whole layer). */
int cli_fwd_prepare_config(const char *cmd, cli_fwd *f, const mha_config *c, const cli_fwd_flags *ff);
int cli_fwd_prepare(const char *cmd, cli_fwd *f, const mha_layer *L, const cli_fwd_flags *ff);
void cli_fwd_free(cli_fwd *f);

/* The opening of run, audit and plot: rewrites a bare --causal, parses,
 * loads the layer (cli_parse_load) and reads the inputs (cli_fwd_prepare).
 * Returns MHA_ARGS_CONTINUE with *L and *f ready (the caller frees them
 * with mha_layer_free and cli_fwd_free), or the exit code with *L NULL and
 * *f zeroed: nothing left to free. */
int cli_fwd_open(mha_layer **L, cli_fwd *f, mha_command_spec *spec, const cli_ckpt *ck,
                 const cli_fwd_flags *ff, cli_outputs *outs, int argc, char **argv);

/* Runs the forward; y (B,T,d_model) must be allocated; cap may be NULL. */
int cli_fwd_run(const char *cmd, const cli_fwd *f, const mha_layer *L, float *y,
                const mha_capture *cap);

/* Writes float data as .npy for the output registered under flag
 * (cli_outputs_write); shape has rank entries. */
int cli_save(cli_outputs *outs, const char *flag, const float *data, int rank, const int *shape);
/* mha_layer_save(layer, path) as a cli_atomic_writer. */
mha_status cli_write_layer(const char *path, const void *layer);

/* A library failure as "mha <cmd>: <message>", exit code 1. */
int cli_fail(const char *cmd, mha_status s);

/* "(9,)", "(2, 7)": an array's shape as NumPy prints it, in buf. */
const char *cli_shape_str(const mha_array *m, char *buf, size_t cap);

/* --ablate "2=zero,5=scale:0.5,7=mean" -> iv (h entries, zeroed by the
 * caller), for run and mha-mpi run (defined in cmd_run.c). */
int cli_parse_ablate(const char *spec, mha_intervention *iv, int h);

/* Allocates n floats (zeroed) or prints an error and returns NULL. */
float *cli_alloc(const char *cmd, size_t n);
/* The same, not zeroed: for outputs the library overwrites whole (Y and
 * the captures of mha_forward), so their pages are touched once, by the
 * forward, not first by a memset; 2 MiB and more on huge pages where the
 * kernel allows (one fault per 2 MiB instead of 512). */
float *cli_alloc_out(const char *cmd, size_t n);

#endif /* MHA_TOOLS_IO_CLI_H */
