/* stdin_npy.c — standard input as one .npy array input (stdin_npy.h). */
#include "stdin_npy.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "args.h"
#include "io_cli.h"
#include "outputs.h"

static const char *claimed; /* the flag whose path is "-", or NULL */
static char name[96];        /* "standard input (--input -)" */
static int consumed;         /* the stream was read (it can be read once) */

void cli_stdin_claim(const char *flag) {
    claimed = flag;
    snprintf(name, sizeof name, "standard input (%s -)", flag);
}

const char *cli_input_name(const char *path) {
    return claimed && path && strcmp(path, "-") == 0 ? name : path;
}

/* The whole stream into *buf (n bytes, malloc'ed; NULL when empty), at
 * most `max` bytes; 0 or the exit code. A stream that does not open with
 * .npy's magic is cut short there: the parser refuses it all the same,
 * and `yes | mha run --input -` must not read forever. */
static int read_stream(const char *cmd, unsigned char **buf, size_t *n, size_t max) {
    unsigned char *b = NULL;
    size_t cap = 0, len = 0, first = (size_t)1 << 16;
    struct stat st; /* a redirected file (< x.npy): one buffer of its size (+1 to see the end) */
    if (fstat(STDIN_FILENO, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0 &&
        (unsigned long long)st.st_size < max)
        first = (size_t)st.st_size + 1;
    for (;;) {
        if (len == cap) {
            if (len > max) {
                free(b);
                return mha_cmd_error(cmd, MHA_EXIT_RUNTIME,
                                     "%s holds more than %zu bytes (half the physical memory, what a stream "
                                     "may hold); expected a .npy array that fits, or pass it as a file",
                                     name, max);
            }
            size_t grown = cap ? (cap < max / 2 ? 2 * cap : max + 1) : first;
            if (grown > max + 1) grown = max + 1;
            unsigned char *nb = realloc(b, grown);
            if (!nb) {
                free(b);
                return mha_cmd_error(cmd, MHA_EXIT_RUNTIME,
                                     "%s: out of memory after %zu bytes; expected a .npy array that fits in "
                                     "memory, or pass it as a file",
                                     name, len);
            }
            b = nb;
            cap = grown;
        }
        ssize_t r = read(STDIN_FILENO, b + len, cap - len);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            const int e = errno;
            free(b);
            return mha_cmd_error(cmd, MHA_EXIT_RUNTIME, "cannot read %s: %s; expected a .npy array piped or "
                                 "redirected there", name, strerror(e));
        }
        if (r == 0) break;
        len += (size_t)r;
        if (len >= 6 && memcmp(b, "\x93NUMPY", 6) != 0) break;
    }
    *buf = b;
    *n = len;
    return MHA_EXIT_OK;
}

int cli_npy_read(const char *cmd, mha_array *out, const char *path, unsigned flags) {
    memset(out, 0, sizeof *out);
    if (!claimed || strcmp(path, "-") != 0) {
        mha_status s = mha_npy_read(out, path, flags);
        return s ? cli_fail(cmd, s) : MHA_EXIT_OK;
    }
    if (consumed)
        return mha_cmd_error(cmd, MHA_EXIT_USAGE, "%s was read already; expected one input there", name);
    consumed = 1;
    const double limit = cli_default_output_limit_gib() * 1073741824.0;
    const size_t max = limit < (double)(SIZE_MAX / 2) ? (size_t)limit : SIZE_MAX / 2;
    unsigned char *buf = NULL;
    size_t len = 0;
    int rc = read_stream(cmd, &buf, &len, max);
    if (rc) return rc;
    if (len == 0)
        rc = mha_cmd_error(cmd, MHA_EXIT_RUNTIME, "%s is empty; expected a .npy array piped or redirected "
                           "there (%s - < x.npy)", name, claimed);
    else {
        mha_status s = mha_npy_parse(out, buf, len, name, flags);
        if (s) rc = cli_fail(cmd, s);
    }
    free(buf);
    return rc;
}
