/* mha.c — the `mha` command-line tool: dispatches to one command per
 * subcommand name. Commands live in tools/cmd_<name>.c. */
#include <stdio.h>
#include <string.h>

#include "args.h"
#include "commands.h"

typedef struct {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary; /* one line for `mha --help` */
} mha_command;

/* One row per command; `mha --help` lists them in this order. */
static const mha_command commands[] = {
    {"demo", cmd_demo, "walk through the seeds' worked examples, computed by the library"},
    {"shapes", cmd_shapes, "tensor shapes, parameter count, FLOPs and KV-cache size of a layer"},
    {"run", cmd_run, "run a checkpoint on a .npy input; masks, ablations, captures"},
    {"convert", cmd_convert, "convert a torch/hf/gpt2/megatron/codegen checkpoint to the native layout"},
    {"permute", cmd_permute, "permute the heads (or one block kind) of a checkpoint"},
    {"audit", cmd_audit, "check a checkpoint against a reference output; find head-order fixes"},
    {"plot", cmd_plot, "PNG heatmaps of attention per head and head contribution norms"},
};
static const int n_commands = (int)(sizeof commands / sizeof commands[0]);

static void print_help(FILE *f) {
    fprintf(f, "usage: mha <command> [flags]\n\n"
               "mha runs and explains the transformer multi-head attention layer.\n\n"
               "commands:\n");
    for (int i = 0; i < n_commands; i++) fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].summary);
    fprintf(f, "\n'mha <command> --help' describes a command's flags.\n");
}

static const mha_command *find(const char *name) {
    for (int i = 0; i < n_commands; i++)
        if (strcmp(commands[i].name, name) == 0) return &commands[i];
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "mha: missing command (one of");
        for (int i = 0; i < n_commands; i++) fprintf(stderr, "%s %s", i ? "," : "", commands[i].name);
        fprintf(stderr, "; see 'mha --help')\n");
        return MHA_EXIT_USAGE;
    }
    const char *name = argv[1];
    if (strcmp(name, "--help") == 0 || strcmp(name, "-h") == 0) {
        print_help(stdout);
        return MHA_EXIT_OK;
    }
    /* `mha help <cmd>` is the same as `mha <cmd> --help` */
    if (strcmp(name, "help") == 0) {
        if (argc < 3) { print_help(stdout); return MHA_EXIT_OK; }
        const mha_command *c = find(argv[2]);
        if (!c) {
            fprintf(stderr, "mha: unknown command '%.40s' (see 'mha --help')\n", argv[2]);
            return MHA_EXIT_USAGE;
        }
        char *sub[] = {argv[2], "--help", NULL};
        return c->run(2, sub);
    }
    const mha_command *c = find(name);
    if (!c) {
        fprintf(stderr, "mha: unknown command '%.40s' (one of", name);
        for (int i = 0; i < n_commands; i++) fprintf(stderr, "%s %s", i ? "," : "", commands[i].name);
        fprintf(stderr, "; see 'mha --help')\n");
        return MHA_EXIT_USAGE;
    }
    fflush(stdout);
    return c->run(argc - 1, argv + 1);
}
