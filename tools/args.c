/* args.c — strict `--flag value` / `--flag=value` parsing and generated
 * help. Every error is one line naming the flag and what was expected,
 * because a silently ignored typo in a shape flag gives wrong numbers. */
#include "args.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A file name may hold a newline or an escape sequence: the message
 * stays one line, and the terminal's state untouched. */
char *mha_one_line(char *msg) {
    for (char *c = msg; *c; c++)
        if ((unsigned char)*c < 0x20 || *c == 0x7f) *c = '?';
    return msg;
}

int mha_cmd_error(const char *cmd, int code, const char *fmt, ...) {
    va_list ap;
    fprintf(stderr, "mha %s: ", cmd);
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    char *msg = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (msg) {
        va_start(ap, fmt);
        vsnprintf(msg, (size_t)n + 1, fmt, ap);
        va_end(ap);
        fputs(mha_one_line(msg), stderr);
        free(msg);
    } else {
        va_start(ap, fmt);
        vfprintf(stderr, fmt, ap);
        va_end(ap);
    }
    fputc('\n', stderr);
    return code;
}

/* A user value quoted in an error: at most 40 characters, control
 * characters replaced, so the message stays one line. */
static const char *quote(const char *s, char buf[48]) {
    size_t n = 0;
    for (; s[n] && n < 40; n++) buf[n] = isprint((unsigned char)s[n]) ? s[n] : '?';
    if (s[n]) { buf[n - 3] = buf[n - 2] = buf[n - 1] = '.'; }
    buf[n] = '\0';
    return buf;
}

/* "an integer in [1, 65536]", "one of 4|2", ... */
static void describe(const mha_arg *a, char *out, size_t cap) {
    switch (a->kind) {
    case MHA_ARG_INT:
        if (a->choices) snprintf(out, cap, "one of %s", a->choices);
        else snprintf(out, cap, "an integer in [%lld, %lld]", a->min, a->max);
        break;
    case MHA_ARG_DOUBLE:
        snprintf(out, cap, "a number in [%g, %g]", a->dmin, a->dmax);
        break;
    case MHA_ARG_STRING:
        if (a->choices) snprintf(out, cap, "one of %s", a->choices);
        else snprintf(out, cap, "a non-empty value");
        break;
    case MHA_ARG_SWITCH:
        snprintf(out, cap, "no value");
        break;
    }
}

/* Whether word is one of the '|'-separated entries of list. */
static int in_choices(const char *list, const char *word) {
    size_t n = strlen(word);
    for (const char *p = list;;) {
        const char *bar = strchr(p, '|');
        size_t len = bar ? (size_t)(bar - p) : strlen(p);
        if (len == n && strncmp(p, word, n) == 0) return 1;
        if (!bar) return 0;
        p = bar + 1;
    }
}

/* Parses and stores one value; returns 0 or prints the error and returns 2. */
static int store(const char *cmd, mha_arg *a, const char *v) {
    char want[96], q[48];
    describe(a, want, sizeof want);
    if (*v == '\0') return mha_cmd_error(cmd, MHA_EXIT_USAGE, "%s needs a value (%s)", a->name, want);
    switch (a->kind) {
    case MHA_ARG_INT: {
        char *end;
        errno = 0;
        long long x = strtoll(v, &end, 10);
        int ok = !isspace((unsigned char)*v) && *end == '\0' && errno == 0;
        if (ok && a->choices) ok = in_choices(a->choices, v) && v[0] != '+';
        if (ok && !a->choices) ok = x >= a->min && x <= a->max;
        if (!ok) return mha_cmd_error(cmd, MHA_EXIT_USAGE, "%s expects %s, got '%s'", a->name, want, quote(v, q));
        *(long long *)a->dest = x;
        break;
    }
    case MHA_ARG_DOUBLE: {
        char *end;
        errno = 0;
        double x = strtod(v, &end);
        int ok = !isspace((unsigned char)*v) && *end == '\0' && errno == 0 && isfinite(x) &&
                 x >= a->dmin && x <= a->dmax;
        if (!ok) return mha_cmd_error(cmd, MHA_EXIT_USAGE, "%s expects %s, got '%s'", a->name, want, quote(v, q));
        *(double *)a->dest = x;
        break;
    }
    case MHA_ARG_STRING:
        if (a->choices && !in_choices(a->choices, v))
            return mha_cmd_error(cmd, MHA_EXIT_USAGE, "%s expects %s, got '%s'", a->name, want, quote(v, q));
        *(const char **)a->dest = v;
        break;
    case MHA_ARG_SWITCH:
        *(int *)a->dest = 1;
        break;
    }
    return 0;
}

static mha_arg *find(mha_command_spec *spec, const char *name, size_t len) {
    for (int i = 0; i < spec->n_args; i++) {
        const char *n = spec->args[i].name;
        if (strlen(n) == len && strncmp(n, name, len) == 0) return &spec->args[i];
    }
    return NULL;
}

/* The name of positional argument k: word k of spec->positional ("IN OUT"
 * -> "IN", "OUT"), its last word beyond them. */
static const char *positional_name(const mha_command_spec *spec, int k, char *out, size_t cap) {
    const char *p = spec->positional ? spec->positional : "positional";
    for (int i = 0; i < k && strchr(p, ' '); i++) p = strchr(p, ' ') + 1;
    snprintf(out, cap, "%.*s", (int)strcspn(p, " "), p);
    return out;
}

/* argv[i + 1] is the value of the flag argv[i]: "--a --b" means --a's value
 * was forgotten, not "--b" (the help scan and the parse agree on this). */
static int value_follows(int argc, char **argv, int i) {
    return i + 1 < argc && strncmp(argv[i + 1], "--", 2) != 0;
}

int mha_args_parse(mha_command_spec *spec, int argc, char **argv,
                   const char **positional, int *n_positional) {
    const char *cmd = spec->name;
    char want[96], q[48];
    int npos = 0, flags_done = 0;
    for (int i = 0; i < spec->n_args; i++) spec->args[i].seen = 0;
    if (n_positional) *n_positional = 0;

    for (int i = 1; i < argc; i++) {
        const char *s = argv[i];
        if (strcmp(s, "--") == 0) break;
        if (strcmp(s, "--help") == 0 || strcmp(s, "-h") == 0) {
            mha_args_print_help(spec);
            return MHA_EXIT_OK;
        }
        /* a flag's value, "-h" included, is a value: skip it as the parse below takes it */
        const mha_arg *a = strncmp(s, "--", 2) == 0 && !strchr(s, '=') ? find(spec, s, strlen(s)) : NULL;
        if (a && a->kind != MHA_ARG_SWITCH && value_follows(argc, argv, i)) i++;
    }
    for (int i = 1; i < argc; i++) {
        const char *s = argv[i];
        if (!flags_done && strcmp(s, "--") == 0) { flags_done = 1; continue; }
        /* "-" alone and negative numbers are positional; any other dash word is a flag */
        int is_flag = !flags_done && s[0] == '-' && s[1] != '\0' && !isdigit((unsigned char)s[1]);
        if (!is_flag) {
            if (npos >= spec->max_positional) {
                if (spec->max_positional == 0)
                    return mha_cmd_error(cmd, MHA_EXIT_USAGE, "unexpected argument '%s' (%s takes no positional arguments)",
                                         quote(s, q), cmd);
                return mha_cmd_error(cmd, MHA_EXIT_USAGE, "unexpected argument '%s' (expected at most %d %s)",
                                     quote(s, q), spec->max_positional, spec->positional ? spec->positional : "arguments");
            }
            /* every positional argument names a file: "" would be an open's ENOENT */
            if (!*s) {
                char name[48];
                return mha_cmd_error(cmd, MHA_EXIT_USAGE, "the %s argument is empty (''); expected a file path",
                                     positional_name(spec, npos, name, sizeof name));
            }
            if (positional) positional[npos] = s;
            npos++;
            continue;
        }
        const char *eq = strchr(s, '=');
        size_t len = eq ? (size_t)(eq - s) : strlen(s);
        mha_arg *a = s[1] == '-' ? find(spec, s, len) : NULL;
        if (!a) {
            char name[48];
            quote(s, name);
            if (eq && len < 40) name[len] = '\0';
            return mha_cmd_error(cmd, MHA_EXIT_USAGE, "unknown flag '%s' (see 'mha %s --help')", name, cmd);
        }
        if (a->seen) return mha_cmd_error(cmd, MHA_EXIT_USAGE, "%s given twice (expected once)", a->name);
        a->seen = 1;
        describe(a, want, sizeof want);
        const char *v;
        if (a->kind == MHA_ARG_SWITCH) {
            if (eq) return mha_cmd_error(cmd, MHA_EXIT_USAGE, "%s takes no value, got '%s'", a->name, quote(eq + 1, q));
            v = "1";
        } else if (eq) {
            v = eq + 1;
        } else {
            if (!value_follows(argc, argv, i))
                return mha_cmd_error(cmd, MHA_EXIT_USAGE, "%s needs a value (%s)", a->name, want);
            v = argv[++i];
        }
        int rc = store(cmd, a, v);
        if (rc) return rc;
    }
    for (int i = 0; i < spec->n_args; i++) {
        const mha_arg *a = &spec->args[i];
        if (a->required && !a->seen) {
            describe(a, want, sizeof want);
            return mha_cmd_error(cmd, MHA_EXIT_USAGE, "missing required flag %s (%s)", a->name, want);
        }
    }
    if (npos < spec->min_positional)
        return mha_cmd_error(cmd, MHA_EXIT_USAGE, "missing %s argument (expected %d, got %d)",
                             spec->positional ? spec->positional : "positional", spec->min_positional, npos);
    if (n_positional) *n_positional = npos;
    return MHA_ARGS_CONTINUE;
}

void mha_args_print_help(const mha_command_spec *spec) {
    printf("usage: %s %s", spec->program ? spec->program : "mha", spec->name);
    for (int i = 0; i < spec->n_args; i++) {
        const mha_arg *a = &spec->args[i];
        const char *open = a->required ? "" : "[", *close = a->required ? "" : "]";
        if (a->kind == MHA_ARG_SWITCH) printf(" %s%s%s", open, a->name, close);
        else printf(" %s%s %s%s", open, a->name, a->metavar ? a->metavar : "VALUE", close);
    }
    if (spec->max_positional > 0) {
        const char *p = spec->positional ? spec->positional : "ARG";
        if (spec->min_positional > 0) printf(" %s", p);
        else printf(" [%s]", p);
        if (spec->max_positional > 1) printf("...");
    }
    printf("\n\n%s\n", spec->summary);
    printf("\nflags%s:\n", spec->n_args > 0 ? " (--flag VALUE or --flag=VALUE)" : "");
    for (int i = 0; i < spec->n_args; i++) {
        const mha_arg *a = &spec->args[i];
        char left[64], want[96];
        if (a->kind == MHA_ARG_SWITCH) snprintf(left, sizeof left, "%s", a->name);
        else snprintf(left, sizeof left, "%s %s", a->name, a->metavar ? a->metavar : "VALUE");
        describe(a, want, sizeof want);
        printf("  %-20s %s", left, a->help ? a->help : "");
        if (a->kind != MHA_ARG_SWITCH) printf(" (%s%s)", want, a->required ? ", required" : "");
        printf("\n");
    }
    printf("  %-20s %s\n", "-h, --help", "show this help");
    if (spec->details) printf("\n%s", spec->details);
}
