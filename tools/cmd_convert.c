/* cmd_convert.c — `mha convert --from L --to native IN OUT`: reads a
 * checkpoint in any supported layout and writes the library's native
 * layout, (in, out) weights with n_heads, n_kv_heads, d_k, d_v, the head
 * labels and the variants (what a config.json beside an hf checkpoint
 * gives the layer: RoPE, ALiBi, soft-cap, sinks, QK-norm) in the metadata,
 * so later commands need no flags. */
#include <stdio.h>

#include "commands.h"
#include "io_cli.h"
#include "run_variants.h"

int cmd_convert(int argc, char **argv) {
    cli_ckpt ck = {0};
    cli_variant_flags vf = {0};
    const char *to = NULL, *to_dtype = NULL;
    mha_arg args[] = {
        CLI_LAYOUT_ARGS(ck, "--from"),
        CLI_LAYER_VARIANT_ARGS(vf),
        {.name = "--to", .kind = MHA_ARG_STRING, .dest = &to, .metavar = "L",
         .help = "layout written (native)", .required = 1, .choices = "native"},
        {.name = "--to-dtype", .kind = MHA_ARG_STRING, .dest = &to_dtype, .metavar = "T",
         .help = "store W_Q, W_K, W_V, W_O as bf16 or int8 (a scale per column and 32 inputs); default: as loaded "
                 "(docs/WEIGHTS.md)", .choices = "f32|bf16|int8"},
    };
    mha_command_spec spec = {
        .name = "convert",
        .summary = "Convert a checkpoint (torch, hf, gpt2, megatron, codegen or native) into the native\n"
                   "layout: (in, out) weights, head dimensions and labels in the metadata.",
        .details = "Running the converted file gives the same Y as running the source: the layer's\n"
                   "variants that a config.json beside an hf checkpoint gives (RoPE, ALiBi, soft-cap,\n"
                   "sinks, QK-norm) are written into it, and so are the variant flags' (as mha run and\n"
                   "mha permute take them); config.json's sliding window, chunk (Llama 4) and score scale\n"
                   "are options of a call, which convert prints to pass to mha run.\n\n"
                   "example: mha convert --from hf --heads 8 --kv-heads 2 llama_attn.safetensors "
                   "attn.safetensors\n",
        .args = args,
        .n_args = (int)(sizeof args / sizeof args[0]),
        .positional = "IN OUT",
        .min_positional = 2,
        .max_positional = 2,
    };
    const char *pos[2] = {NULL, NULL};
    cli_outputs outs;
    cli_outputs_init(&outs, "convert");
    cli_outputs_checkpoint(&outs, "IN", &pos[0]);
    cli_outputs_output(&outs, "OUT", &pos[1]);
    mha_layer *L;
    int rc = cli_parse_load(&L, pos, &spec, &ck, &outs, argc, argv);
    if (rc != MHA_ARGS_CONTINUE) return rc;
    // --- the variant flags and config.json's variants into the layer, as mha run applies them (else
    //     the file is another layer)
    cli_fwd call = {0}; /* the call options config.json gives: printed, a native file keeps none */
    call.opt = mha_options_default();
    cli_ckpt in = ck;
    in.weights = pos[0]; /* the checkpoint is IN, not --weights */
    if ((rc = cli_apply_variants("convert", &L, &call, &vf, &in))) {
        mha_layer_free(L);
        return cli_outputs_finish(&outs, rc);
    }
    mha_weight_dtype wd = MHA_W_F32;
    mha_status s = to_dtype ? mha_weight_dtype_parse(&wd, to_dtype) : MHA_OK;
    if (!s && to_dtype) s = mha_layer_convert_weights(L, wd);
    if (s) {
        rc = mha_cmd_error("convert", MHA_EXIT_RUNTIME, "--to-dtype %s: %s", to_dtype, mha_last_error());
        mha_layer_free(L);
        return cli_outputs_finish(&outs, rc);
    }
    rc = cli_outputs_write(&outs, "OUT", cli_write_layer, L);
    if (!rc) rc = cli_outputs_finish(&outs, MHA_EXIT_OK);
    if (!rc) {
        const mha_config *c = mha_layer_config(L);
        printf("wrote %s (native): d_model=%d h=%d h_kv=%d d_k=%d d_v=%d d_kv_in=%d bias=%d%s%s\n",
               pos[1], c->d_model, c->n_heads, c->n_kv_heads, c->d_k, c->d_v, c->d_kv_in, c->bias,
               mha_layer_weights_dtype(L) ? " weights=" : "",
               mha_layer_weights_dtype(L) ? mha_weight_dtype_name(mha_layer_weights_dtype(L)) : "");
        if (call.opt.window_left >= 0 || call.opt.chunk_size > 0 || call.opt.scale != 0.0f) {
            printf("note: config.json gives call options a native file does not keep; run it with");
            if (call.opt.window_left >= 0) printf(" --window %d", call.opt.window_left + 1);
            if (call.opt.chunk_size > 0) printf(" --chunk %d", call.opt.chunk_size);
            if (call.opt.scale != 0.0f) printf(" --scale %.9g", (double)call.opt.scale);
            printf(" for the source's Y\n");
        }
    }
    cli_variants_free(&vf);
    mha_layer_free(L);
    return cli_outputs_finish(&outs, rc);
}
