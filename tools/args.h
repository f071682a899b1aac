/* args.h — strict flag parsing shared by every mha command.
 *
 * A command describes its flags in a table of mha_arg and calls
 * mha_args_parse(). Accepted forms: `--flag value` and `--flag=value`
 * (switches take no value). Anything else — an unknown flag, a missing or
 * empty value, a value that is not a number, a number out of range or not
 * among the allowed choices, a flag given twice, a missing required flag,
 * an unexpected positional argument — is reported as one line on stderr,
 * "mha <cmd>: <what> (<what was expected>)", and the caller exits with 2.
 *
 * `-h` / `--help` anywhere prints the command's help (generated from the
 * table) on stdout.
 */
#ifndef MHA_TOOLS_ARGS_H
#define MHA_TOOLS_ARGS_H

/* Exit codes of every command: 0 ok, 1 runtime failure, 2 usage error. */
enum { MHA_EXIT_OK = 0, MHA_EXIT_RUNTIME = 1, MHA_EXIT_USAGE = 2 };

typedef enum {
    MHA_ARG_INT,    /* long long, within [min, max]; `choices` ("4|2") may
                       restrict it further                                  */
    MHA_ARG_DOUBLE, /* finite double within [dmin, dmax]                    */
    MHA_ARG_STRING, /* const char *; `choices` ("auto|fast") may restrict it */
    MHA_ARG_SWITCH  /* int set to 1 when present; takes no value            */
} mha_arg_kind;

typedef struct {
    const char *name;    /* with dashes: "--d-model"                        */
    mha_arg_kind kind;
    void *dest;          /* long long *, double *, const char **, int *     */
    const char *metavar; /* shown in help: "D"                              */
    const char *help;    /* one line                                        */
    int required;        /* 1: must be given                                */
    long long min, max;  /* MHA_ARG_INT range (inclusive)                   */
    double dmin, dmax;   /* MHA_ARG_DOUBLE range (inclusive)                */
    const char *choices; /* "a|b|c" or NULL                                 */
    int seen;            /* set by the parser: 1 when the flag was given    */
} mha_arg;

/* What a command looks like to the parser and in its help text. */
typedef struct {
    const char *name;        /* "shapes"                                    */
    const char *summary;     /* one line, also shown by `mha --help`        */
    const char *details;     /* paragraphs after the flag list, or NULL     */
    mha_arg *args;           /* flag table (may be NULL when n_args == 0)   */
    int n_args;
    const char *positional;  /* e.g. "FILE", or NULL: no positional args    */
    int min_positional;      /* how many positional args are required      */
    int max_positional;      /* how many are allowed                        */
    const char *program;     /* the executable in the usage line; NULL: "mha" */
} mha_command_spec;

/* Result of mha_args_parse: continue, or stop and exit with the code. */
enum { MHA_ARGS_CONTINUE = -1 };

/* Parses argv[1..argc-1] (argv[0] is the command name). Positional
 * arguments are stored in positional[] (at most max_positional) and
 * counted in *n_positional (both may be NULL when none are allowed).
 * Returns MHA_ARGS_CONTINUE to go on, MHA_EXIT_OK after printing help, or
 * MHA_EXIT_USAGE after printing a one-line error. */
int mha_args_parse(mha_command_spec *spec, int argc, char **argv,
                   const char **positional, int *n_positional);

/* Prints the help of a command on stdout. */
void mha_args_print_help(const mha_command_spec *spec);

/* Replaces every control character of msg (newline, escape, DEL) with
 * '?' in place, so that a message quoting a file name stays one line and
 * sends the terminal nothing; returns msg. mha_cmd_error applies it. */
char *mha_one_line(char *msg);

/* Prints "mha <cmd>: <message>\n" on stderr and returns code — for errors
 * found after parsing (e.g. a library validation message). */
int mha_cmd_error(const char *cmd, int code, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

#endif /* MHA_TOOLS_ARGS_H */
