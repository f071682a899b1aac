/* commands.h — one entry point per `mha` subcommand.
 *
 * Each command gets argv with argv[0] = its own name ("shapes", ...) and
 * returns the process exit code: 0 ok, 1 runtime failure, 2 usage error
 * (see args.h). Errors are one line on stderr starting "mha <cmd>: ".
 * To add a command: declare it here, write tools/cmd_<name>.c, and add one
 * row to the table in tools/mha.c.
 */
#ifndef MHA_TOOLS_COMMANDS_H
#define MHA_TOOLS_COMMANDS_H

int cmd_demo(int argc, char **argv);   /* the seeds' worked examples, step by step */
int cmd_shapes(int argc, char **argv); /* tensor shapes, parameters, FLOPs, KV cache */
int cmd_run(int argc, char **argv);     /* a checkpoint on a .npy input (files, src/io) */
int cmd_convert(int argc, char **argv); /* any checkpoint layout -> native */
int cmd_permute(int argc, char **argv); /* permute heads (or one block kind) of a checkpoint */
int cmd_audit(int argc, char **argv);   /* does a checkpoint reproduce Y_ref; find head-order fixes */
int cmd_plot(int argc, char **argv);    /* attention heatmaps and contribution norms as PNG */

#endif /* MHA_TOOLS_COMMANDS_H */
