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

#endif /* MHA_TOOLS_COMMANDS_H */
