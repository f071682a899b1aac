/* fuzz_args.c — libFuzzer target for the CLI flag parser (tools/args.c):
 * the input, split at NUL bytes, is argv. Every outcome must be help
 * (exit 0), a usage error (exit 2) or MHA_ARGS_CONTINUE with every value
 * inside its declared range and choices and every required flag seen;
 * never a crash or an out-of-bounds read. run.sh passes -close_fd_mask=3
 * so the parser's messages do not flood the log (libFuzzer keeps its own). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "args.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > 4096) return 0;
    char *buf = malloc(size + 1);
    if (!buf) return 0;
    memcpy(buf, data, size);
    buf[size] = '\0';
    char *argv[130];
    int argc = 0;
    argv[argc++] = "fuzz";
    for (size_t i = 0; i <= size && argc < 129;) {
        argv[argc++] = buf + i;
        i += strlen(buf + i) + 1;
    }
    argv[argc] = NULL;
    long long heads = 0, bytes = 4;
    double scale = 1;
    const char *layout = NULL, *path = NULL;
    int sw = 0;
    mha_arg args[] = {
        {.name = "--heads", .kind = MHA_ARG_INT, .dest = &heads, .metavar = "H", .help = "h",
         .required = 1, .min = 1, .max = 4096},
        {.name = "--bytes", .kind = MHA_ARG_INT, .dest = &bytes, .choices = "4|2"},
        {.name = "--scale", .kind = MHA_ARG_DOUBLE, .dest = &scale, .dmin = -1e30, .dmax = 1e30},
        {.name = "--layout", .kind = MHA_ARG_STRING, .dest = &layout, .choices = "auto|native|hf"},
        {.name = "--path", .kind = MHA_ARG_STRING, .dest = &path},
        {.name = "--switch", .kind = MHA_ARG_SWITCH, .dest = &sw},
    };
    mha_command_spec spec = {.name = "fuzz", .summary = "fuzz", .args = args, .n_args = 6,
                             .positional = "IN OUT", .min_positional = 0, .max_positional = 2};
    const char *pos[2] = {NULL, NULL};
    int npos = -1;
    int rc = mha_args_parse(&spec, argc, argv, pos, &npos);
    if (rc == MHA_ARGS_CONTINUE) {
        if (heads < 1 || heads > 4096 || !args[0].seen) abort();
        if (bytes != 4 && bytes != 2) abort();
        if (!(scale >= -1e30 && scale <= 1e30)) abort();
        if (layout && strcmp(layout, "auto") && strcmp(layout, "native") && strcmp(layout, "hf")) abort();
        if (path && !path[0]) abort();
        if (npos < 0 || npos > 2 || (npos >= 1 && !pos[0]) || (npos == 2 && !pos[1])) abort();
    } else if (rc != MHA_EXIT_OK && rc != MHA_EXIT_USAGE) {
        abort();
    }
    free(buf);
    return 0;
}
