/* outputs.h — the files one command writes, all or none.
 *
 * A command registers its input and output flags (by the address of the
 * variable the parser fills) before parsing. Right after parsing, before
 * any file is read or any number computed, cli_outputs_check refuses an
 * output that is the same file as an input or as another output (device
 * and inode when the file exists, the resolved path otherwise), a
 * directory, a device, or a path whose directory is missing, and reserves
 * one temporary file next to each output (next to the file it names, for a
 * symbolic link: the link stays). The command writes each output
 * to its temporary (cli_outputs_tmp); cli_outputs_finish renames them all
 * over their targets when the command succeeded, and removes them all
 * when it failed, so a failed command leaves every existing file as it was.
 * An output registered with cli_outputs_array may be "-", standard output:
 * it is written to a temporary file (in $TMPDIR, else /tmp) like the others
 * and copied to standard output by cli_outputs_finish, before the renames,
 * only when the command succeeded, so a failed command writes nothing
 * there either. At most one output may be "-", and not when standard
 * output is a terminal; any other output refuses "-" (a file named "-"
 * is "./-").
 * An input may be "-", standard input, when the command sets stdin_ok:
 * one .npy array input at most (stdin_npy.h reads it whole), and not when
 * standard input is a terminal or closed; a checkpoint input refuses "-"
 * (it is mapped from its file), and so does every input of a command
 * without stdin_ok, by name (a file named "-" is "./-").
 * A signal that ends the process (SIGINT, SIGTERM, SIGHUP, SIGQUIT) removes
 * the temporaries first; once the outputs are being written (the first
 * cli_outputs_tmp or cli_outputs_write) it is held until cli_outputs_finish,
 * which then removes them all instead of renaming (an only output already
 * written straight to its target stays, whole, and the message says so)
 * and ends the process with it. SIGXFSZ is
 * ignored, so a file size limit is an error (EFBIG) like any other.
 */
#ifndef MHA_TOOLS_OUTPUTS_H
#define MHA_TOOLS_OUTPUTS_H

#include <stddef.h>
#include <stdio.h>

#include "mha.h"

#define CLI_MAX_FILES 12

typedef struct {
    const char *flag;         /* "--output", or "OUT" for a positional   */
    const char *const *path;  /* where the parser puts the path          */
    char *tmp;                /* the reserved temporary (outputs only)   */
    char *target;             /* what a symbolic link output names, or NULL */
    int checkpoint;           /* an input read as a checkpoint (below)   */
    int may_stream;           /* an output that may be "-" (an array)    */
    int stream;               /* it is "-": standard output (input: in)  */
    int direct;               /* written straight to its target (cli_outputs_write) */
} cli_file;

typedef struct {
    const char *cmd;
    cli_file in[CLI_MAX_FILES], out[CLI_MAX_FILES];
    int n_in, n_out;
    /* The command reads an array input from standard input ("-"): run,
     * audit and plot set it; mha-mpi's ranks do not (mpirun gives standard
     * input to rank 0 alone). */
    int stdin_ok;
    /* Called by cli_outputs_check before anything else, e.g. to derive a
     * default output name from a parsed flag. */
    void (*after_parse)(void *ctx);
    void *ctx;
} cli_outputs;

void cli_outputs_init(cli_outputs *o, const char *cmd);
/* Register a flag (a NULL *path after parsing means "not given"). */
void cli_outputs_input(cli_outputs *o, const char *flag, const char *const *path);
void cli_outputs_output(cli_outputs *o, const char *flag, const char *const *path);
/* An output of one .npy array: "-" writes it to standard output. */
void cli_outputs_array(cli_outputs *o, const char *flag, const char *const *path);
/* An input that names a checkpoint: besides the path itself, the files it
 * is read from count as inputs too (a directory's model.safetensors or
 * index, an index's shards, the config.json beside them), so that no
 * output replaces one of them. */
void cli_outputs_checkpoint(cli_outputs *o, const char *flag, const char *const *path);

/* The checks and reservations above; returns 0 or an exit code after
 * printing one line (2 for a conflict between flags, 1 for a file
 * problem), with nothing left on disk. An input that exists but is
 * neither a regular file nor a directory (a pipe, a device) is refused
 * too (1): opening a pipe to read it would wait for a writer forever. */
int cli_outputs_check(cli_outputs *o);
/* The temporary to write for the output registered under flag. */
const char *cli_outputs_tmp(const cli_outputs *o, const char *flag);
/* An atomic writer: writes one whole file at path (the library's writers
 * do: a temporary of their own, fsync, rename, the directory synced) and
 * returns its status. */
typedef mha_status (*cli_atomic_writer)(const char *path, const void *ctx);
/* Writes the output registered under flag with write(path, ctx). The
 * command's only file output goes straight to its target (its reserved
 * temporary removed first): the writer's own rename already replaces it
 * whole or not at all, and a second rename and directory sync would cost
 * as much again (~8 ms of `mha run`'s ~115 on ext4). Any other output,
 * or "-", goes to its reserved temporary for cli_outputs_finish to
 * rename with the others. Returns 0, or 1 after printing the write's
 * error as cli_outputs_write_error does. */
int cli_outputs_write(cli_outputs *o, const char *flag, cli_atomic_writer write, const void *ctx);
/* The path the user gave for that output (for messages). */
const char *cli_outputs_path(const cli_outputs *o, const char *flag);
/* Prints "mha <cmd>: cannot write FLAG: MESSAGE" for a failed write to
 * flag's temporary, naming the target where msg names the temporary;
 * returns exit code 1. */
int cli_outputs_write_error(const cli_outputs *o, const char *flag, const char *msg);
/* rc == 0: renames every temporary over its target (an error there is
 * reported and returned); otherwise removes every temporary. Returns the
 * command's exit code. */
int cli_outputs_finish(cli_outputs *o, int rc);
/* Where a command prints its summary ("wrote ..."): stdout, or stderr when
 * an output goes to standard output (the array alone is written there). */
FILE *cli_outputs_report(const cli_outputs *o);

/* --- sizes, checked before the work --- */

/* Half of the physical memory, in GiB: the default --max-output-gib. */
double cli_default_output_limit_gib(void);
/* Refuses (exit 2, naming --max-output-gib and the size in GiB) an output
 * of `floats` float32 values above limit_gib; what names the flag. */
int cli_check_output_size(const char *cmd, const char *what, double floats, double limit_gib);
/* The same for an output of `bytes` bytes (a PNG's canvas). */
int cli_check_output_bytes(const char *cmd, const char *what, double bytes, double limit_gib);

#define CLI_MAX_OUTPUT_ARG(var)                                                                \
    {.name = "--max-output-gib", .kind = MHA_ARG_DOUBLE, .dest = &(var), .metavar = "G",        \
     .help = "refuse, before computing, any output or capture above G GiB (and all of them "   \
             "together); default half the physical memory",                                    \
     .dmin = 1e-9, .dmax = 1e9}

#endif /* MHA_TOOLS_OUTPUTS_H */
