/* cmd_permute.c — `mha permute --order 3,1,2,0 [--block B] IN OUT`.
 * Default (--block all): a consistent head permutation, moving W_Q/W_K/W_V
 * column blocks, biases, W_O row blocks and labels together, so Y is
 * unchanged. --block q|k|v|kv|o|s moves one kind of block only: the repair
 * (or the mistake) of a broken conversion, printed by `mha audit`;
 * q-proj|k-proj|kv-proj the same without the per-head QK-norm rows, which
 * q, k and kv move with their blocks. */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "io_cli.h"
#include "permute_proj.h"
#include "run_variants.h"

/* "3,1,2,0" -> perm[n]; exactly n entries, digits only (strtol alone
 * would also take " 1" and "+1"). */
static int parse_order(const char *s, int *perm, int n) {
    const char *p = s;
    for (int i = 0; i < n; i++) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (!isdigit((unsigned char)*p) || end == p || errno || v < 0 || v >= n || (i + 1 < n ? *end != ',' : *end != '\0'))
            return mha_cmd_error("permute", MHA_EXIT_USAGE,
                                 "--order '%.60s': expected %d comma-separated head indices 0..%d",
                                 s, n, n - 1);
        perm[i] = (int)v;
        p = end + 1;
    }
    return MHA_EXIT_OK;
}

/* After a one-sided move, gives the moved kind the labels of the blocks it
 * now pairs with (taken from the kinds that did not move), so a repaired
 * checkpoint passes the label check. */
static mha_status relabel(mha_layer *L, const char *block) {
    const mha_config *c = mha_layer_config(L);
    int h = c->n_heads, rep = c->n_heads / c->n_kv_heads;
    int *lab = malloc((size_t)h * sizeof *lab), *kv = malloc((size_t)h * sizeof *kv);
    mha_status s = (lab && kv) ? MHA_OK : MHA_E_NOMEM;
    if (!s && strcmp(block, "o") == 0) {
        if (!(s = mha_layer_labels(L, MHA_BLOCK_Q, lab))) s = mha_layer_set_labels(L, MHA_BLOCK_O, lab);
    } else if (!s && strcmp(block, "q") == 0) {
        if (!(s = mha_layer_labels(L, MHA_BLOCK_O, lab))) s = mha_layer_set_labels(L, MHA_BLOCK_Q, lab);
    } else if (!s && strcmp(block, "k") == 0) {
        if (!(s = mha_layer_labels(L, MHA_BLOCK_V, lab))) s = mha_layer_set_labels(L, MHA_BLOCK_K, lab);
    } else if (!s && strcmp(block, "v") == 0) {
        if (!(s = mha_layer_labels(L, MHA_BLOCK_K, lab))) s = mha_layer_set_labels(L, MHA_BLOCK_V, lab);
    } else if (!s && strcmp(block, "s") == 0) {
        if (!(s = mha_layer_labels(L, MHA_BLOCK_Q, lab))) s = mha_layer_set_labels(L, MHA_BLOCK_S, lab);
    } else if (!s && strcmp(block, "kv") == 0) {
        /* kv head g pairs with query heads g*rep..: label = their label / rep */
        if (!(s = mha_layer_labels(L, MHA_BLOCK_Q, lab))) {
            for (int g = 0; g < c->n_kv_heads; g++) kv[g] = lab[g * rep] / rep;
            s = mha_layer_set_labels(L, MHA_BLOCK_K, kv);
            if (!s) s = mha_layer_set_labels(L, MHA_BLOCK_V, kv);
        }
    }
    free(lab);
    free(kv);
    return s;
}

int cmd_permute(int argc, char **argv) {
    cli_ckpt ck = {0};
    const char *order = NULL, *block = NULL;
    int do_relabel = 0;
    cli_variant_flags vf = {0};
    mha_arg args[] = {
        CLI_LAYOUT_ARGS(ck, "--layout"),
        CLI_LAYER_VARIANT_ARGS(vf),
        {.name = "--order", .kind = MHA_ARG_STRING, .dest = &order, .metavar = "P",
         .help = "new head i is old head P[i], e.g. 3,1,2,0", .required = 1},
        {.name = "--block", .kind = MHA_ARG_STRING, .dest = &block, .metavar = "B",
         .help = "all (default, Y unchanged) or one side only: q, k, v, kv, o, s (ALiBi slopes and sinks); "
                 "q-proj, k-proj, kv-proj: as q, k, kv but the per-head QK-norm weights stay",
         .choices = "all|q|k|v|kv|o|s|q-proj|k-proj|kv-proj"},
        {.name = "--relabel", .kind = MHA_ARG_SWITCH, .dest = &do_relabel,
         .help = "after a one-sided move, give the moved blocks the labels of the blocks they now pair with"},
    };
    mha_command_spec spec = {
        .name = "permute",
        .summary = "Permute the heads of a checkpoint and write it in the native layout, with\n"
                   "the head labels moved along.",
        .details = "--block all (default) moves every block of a head together: the output Y is\n"
                   "unchanged. --block q|k|v|kv|o|s moves one kind only (h entries for q, o and s,\n"
                   "h_kv for k, v and kv): it changes Y, and is how `mha audit` repairs a\n"
                   "checkpoint whose blocks were written out of order. q, k and kv move a\n"
                   "layer's per-head QK-norm weights with their blocks; q-proj, k-proj and\n"
                   "kv-proj leave them (a q_proj written out of order, its q_norm right).\n\n"
                   "example: mha permute --order 1,0,2,3 attn.safetensors attn_perm.safetensors\n",
        .args = args,
        .n_args = (int)(sizeof args / sizeof args[0]),
        .positional = "IN OUT",
        .min_positional = 2,
        .max_positional = 2,
    };
    const char *pos[2] = {NULL, NULL};
    cli_outputs outs;
    cli_outputs_init(&outs, "permute");
    cli_outputs_checkpoint(&outs, "IN", &pos[0]);
    cli_outputs_output(&outs, "OUT", &pos[1]);
    mha_layer *L;
    int rc = cli_parse_load(&L, pos, &spec, &ck, &outs, argc, argv);
    if (rc != MHA_ARGS_CONTINUE) return rc;
    /* the variants a state dict does not record (--sinks, --qk-norm tensors,
       --alibi, RoPE), so the native file written is the layer that runs;
       only when asked, as config.json's forward settings (a per-layer
       sliding window) are no concern of a permutation */
    const int variants = vf.rope || vf.rope_theta || vf.rope_dim || vf.rope_scale || vf.alibi ||
                         vf.softcap || vf.sinks || vf.qk_norm || vf.clip_qkv || vf.temperature;
    cli_fwd unused = {0};
    cli_ckpt in = ck;
    in.weights = pos[0]; /* the checkpoint is IN, not --weights */
    if (variants && (rc = cli_apply_variants("permute", &L, &unused, &vf, &in))) {
        mha_layer_free(L);
        return cli_outputs_finish(&outs, rc);
    }
    const mha_config *c = mha_layer_config(L);
    if (!block) block = "all";
    /* q-proj, k-proj, kv-proj: q, k, kv with the per-head norms kept */
    const size_t bl = strlen(block);
    const int proj = bl > 5 && strcmp(block + bl - 5, "-proj") == 0;
    char kind[8];
    snprintf(kind, sizeof kind, "%.*s", (int)(proj ? bl - 5 : bl), block);
    int kv = strcmp(kind, "k") == 0 || strcmp(kind, "v") == 0 || strcmp(kind, "kv") == 0;
    int n = kv ? c->n_kv_heads : c->n_heads;
    int *perm = malloc((size_t)n * sizeof *perm);
    if (!perm) {
        mha_layer_free(L);
        return cli_outputs_finish(&outs, mha_cmd_error("permute", MHA_EXIT_RUNTIME, "out of memory"));
    }
    rc = parse_order(order, perm, n);
    /* every layer has S labels, but only ALiBi slopes and sinks move with them */
    if (!rc && strcmp(block, "s") == 0 && !c->alibi && !c->sinks)
        rc = mha_cmd_error("permute", MHA_EXIT_USAGE, "--block s: %s has no ALiBi slopes or sinks; "
                           "expected a layer with them (--block s moves only those)", pos[0]);
    mha_status s = MHA_OK;
    if (!rc) {
        if (strcmp(kind, "all") == 0) s = mha_layer_permute_heads(L, perm);
        else if (strcmp(kind, "q") == 0)
            s = proj ? cli_permute_proj(&L, MHA_BLOCK_Q, perm) : mha_layer_permute_block(L, MHA_BLOCK_Q, perm);
        else if (strcmp(kind, "o") == 0) s = mha_layer_permute_block(L, MHA_BLOCK_O, perm);
        else if (strcmp(kind, "s") == 0) s = mha_layer_permute_block(L, MHA_BLOCK_S, perm);
        else {
            if (strcmp(kind, "v") != 0)
                s = proj ? cli_permute_proj(&L, MHA_BLOCK_K, perm) : mha_layer_permute_block(L, MHA_BLOCK_K, perm);
            if (!s && strcmp(kind, "k") != 0) s = mha_layer_permute_block(L, MHA_BLOCK_V, perm);
        }
        if (!s && do_relabel) s = relabel(L, kind);
        if (s) {
            /* a bad permutation is the user's argument: exit 2 */
            rc = s == MHA_E_ARG ? mha_cmd_error("permute", MHA_EXIT_USAGE, "%s", mha_last_error())
                                : cli_fail("permute", s);
        } else if (!(rc = cli_outputs_write(&outs, "OUT", cli_write_layer, L)) &&
                   !(rc = cli_outputs_finish(&outs, MHA_EXIT_OK))) {
            printf("wrote %s: block %s permuted by %s\n", pos[1], block, order);
        }
    }
    free(perm);
    mha_layer_free(L);
    return cli_outputs_finish(&outs, rc);
}
