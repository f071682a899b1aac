/* stdin_npy.h — '-' as an array input: standard input read whole into
 * memory and parsed as one .npy array.
 *
 * cli_outputs_check accepts '-' for at most one array input of a command
 * that reads standard input (cli_outputs.stdin_ok) and names its flag here
 * (cli_stdin_claim); cli_npy_read then reads that input from the stream
 * and every other path as a file. The stream is bounded as a file's
 * decoded array is, by memory: at most half the physical memory (the
 * default --max-output-gib) is held, and more is refused, naming standard
 * input and the flag, as is an empty stream or one that is not a .npy
 * array (refused after its first bytes, without reading the rest). */
#ifndef MHA_TOOLS_STDIN_NPY_H
#define MHA_TOOLS_STDIN_NPY_H

#include "mha.h"

/* flag's path is "-": standard input (called by cli_outputs_check). */
void cli_stdin_claim(const char *flag);
/* How messages name an input: "standard input (--input -)" for the claimed
 * "-", else path itself. */
const char *cli_input_name(const char *path);
/* mha_npy_read, or the stream for the claimed "-"; 0 or the exit code
 * after printing "mha <cmd>: ..." (1: a bad or unreadable array). */
int cli_npy_read(const char *cmd, mha_array *out, const char *path, unsigned flags);

#endif /* MHA_TOOLS_STDIN_NPY_H */
