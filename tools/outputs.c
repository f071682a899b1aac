/* outputs.c — all-or-none outputs and the same-file checks (outputs.h). */
#include "outputs.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "args.h"
#include "mha.h"
#include "stdin_npy.h"

void cli_outputs_init(cli_outputs *o, const char *cmd) {
    memset(o, 0, sizeof *o);
    o->cmd = cmd;
}

void cli_outputs_input(cli_outputs *o, const char *flag, const char *const *path) {
    if (o->n_in < CLI_MAX_FILES) o->in[o->n_in++] = (cli_file){.flag = flag, .path = path};
}

void cli_outputs_checkpoint(cli_outputs *o, const char *flag, const char *const *path) {
    if (o->n_in < CLI_MAX_FILES) o->in[o->n_in++] = (cli_file){.flag = flag, .path = path, .checkpoint = 1};
}

void cli_outputs_output(cli_outputs *o, const char *flag, const char *const *path) {
    if (o->n_out < CLI_MAX_FILES) o->out[o->n_out++] = (cli_file){.flag = flag, .path = path};
}

void cli_outputs_array(cli_outputs *o, const char *flag, const char *const *path) {
    if (o->n_out < CLI_MAX_FILES) o->out[o->n_out++] = (cli_file){.flag = flag, .path = path, .may_stream = 1};
}

/* The checks "-" takes on either side: one file there, not a closed
 * stream, not a terminal; then f takes fd. `dir` is "output" or "input",
 * `hint` where a redirection would put the data. 0 or the exit code. */
static int take_std_stream(const cli_outputs *o, cli_file *f, const cli_file **first, int fd, const char *dir,
                           const char *hint) {
    const char *name = fd == STDOUT_FILENO ? "standard output" : "standard input";
    if (*first)
        return mha_cmd_error(o->cmd, MHA_EXIT_USAGE, "%s '-' and %s '-' both name %s; expected at most one %s there",
                             (*first)->flag, f->flag, name, dir);
    if (fcntl(fd, F_GETFD) < 0) /* a file opened later would take its place */
        return mha_cmd_error(o->cmd, MHA_EXIT_USAGE, "%s '-': %s is closed; expected it open", f->flag, name);
    if (isatty(fd))
        return mha_cmd_error(o->cmd, MHA_EXIT_USAGE, "%s '-': %s is a terminal; expected %s, or a file path",
                             f->flag, name, hint);
    f->stream = 1;
    *first = f;
    return 0;
}

/* "-" as an output: standard output where the output allows it (one array,
 * once, not to a terminal or a closed stream); 0 or the exit code. *first:
 * the output that took it before, or NULL. */
static int check_stream(const cli_outputs *o, cli_file *f, const cli_file **first) {
    if (!f->may_stream)
        return mha_cmd_error(o->cmd, MHA_EXIT_USAGE,
                             "%s '-': standard output takes only a .npy array (the outputs of mha run); "
                             "expected a file path for %s (./- names a file called '-')",
                             f->flag, f->flag);
    return take_std_stream(o, f, first, STDOUT_FILENO, "output", "it redirected to a file or a pipe (> y.npy)");
}

/* "-" as an input: standard input, for one .npy array of a command that
 * reads it (stdin_ok), not a terminal or a closed stream; never a
 * checkpoint, which is mapped from its file. 0 or the exit code; *first:
 * the input that took it before, or NULL. */
static int check_stdin(const cli_outputs *o, cli_file *f, const cli_file **first) {
    if (f->checkpoint)
        return mha_cmd_error(o->cmd, MHA_EXIT_USAGE,
                             "%s '-': a checkpoint is mapped from its file, not read from standard input; "
                             "expected a file path (./- names a file called '-')",
                             f->flag);
    if (!o->stdin_ok)
        return mha_cmd_error(o->cmd, MHA_EXIT_USAGE,
                             "%s '-': this command reads no input from standard input; expected a file path "
                             "(./- names a file called '-')",
                             f->flag);
    const int rc = take_std_stream(o, f, first, STDIN_FILENO, "input", "a .npy array piped or redirected there (< x.npy)");
    if (!rc) cli_stdin_claim(f->flag);
    return rc;
}

/* What makes two paths one file: device and inode when it exists, else
 * the real path of its directory plus its own name. */
typedef struct {
    int exists;
    mode_t mode;
    dev_t dev;
    ino_t ino;
    char resolved[PATH_MAX + 256];
} file_id;

/* The directory part of path ("." when none) into dir. */
static void dir_of(const char *path, char *dir, size_t cap) {
    const char *slash = strrchr(path, '/');
    if (!slash) snprintf(dir, cap, ".");
    else if (slash == path) snprintf(dir, cap, "/");
    else snprintf(dir, cap, "%.*s", (int)(slash - path), path);
}

/* Fills id; for an output also refuses what cannot become a regular file
 * by a rename. Returns 0 or prints and returns an exit code. */
static int identify(const cli_outputs *o, const cli_file *f, file_id *id, int output) {
    const char *path = *f->path;
    struct stat st;
    memset(id, 0, sizeof *id);
    if (stat(path, &st) == 0) {
        id->exists = 1;
        id->mode = st.st_mode;
        id->dev = st.st_dev;
        id->ino = st.st_ino;
        if (output && S_ISDIR(st.st_mode))
            return mha_cmd_error(o->cmd, MHA_EXIT_RUNTIME,
                                 "cannot write %s '%s': it is a directory; expected a file path",
                                 f->flag, path);
        if (output && !S_ISREG(st.st_mode))
            return mha_cmd_error(o->cmd, MHA_EXIT_RUNTIME,
                                 "cannot write %s '%s': it exists and is not a regular file "
                                 "(a device or a pipe); expected a file path",
                                 f->flag, path);
        return 0;
    }
    int e = errno;
    if (output && e != ENOENT)
        return mha_cmd_error(o->cmd, MHA_EXIT_RUNTIME, "cannot write %s '%s': %s", f->flag, path,
                             strerror(e));
    char dir[PATH_MAX], real[PATH_MAX];
    dir_of(path, dir, sizeof dir);
    if (!realpath(dir, real)) {
        if (!output) return 0; /* the read reports it */
        return mha_cmd_error(o->cmd, MHA_EXIT_RUNTIME, "cannot write %s '%s': directory '%s': %s",
                             f->flag, path, dir, strerror(errno));
    }
    const char *slash = strrchr(path, '/');
    snprintf(id->resolved, sizeof id->resolved, "%s/%s", real, slash ? slash + 1 : path);
    return 0;
}

static int same_file(const file_id *a, const file_id *b) {
    if (a->exists || b->exists)
        return a->exists && b->exists && a->dev == b->dev && a->ino == b->ino;
    return a->resolved[0] && strcmp(a->resolved, b->resolved) == 0;
}

/* Where the output's rename goes: the path, or what a symbolic link names
 * (a rename over the link would replace the link itself). */
static const char *destination(const cli_file *f) { return f->target ? f->target : *f->path; }

/* Interruptions. A signal that ends the process (Ctrl-C, kill, a closed
 * terminal) would leave the reserved temporaries behind: the handler
 * removes them first. Once the outputs are being written (the first
 * cli_outputs_tmp) it only notes the signal: the library's writer has a
 * temporary of its own in flight, and the renames are all or none;
 * cli_outputs_finish then removes every temporary and ends the process
 * with that signal. The handler runs on whichever thread the kernel picks,
 * so it touches only these flags and unlink(). */
static char *volatile pending[CLI_MAX_FILES]; /* the temporaries on disk */
static volatile sig_atomic_t writing, deferred;
static const int ending_signals[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT};

static void on_ending_signal(int sig) {
    if (writing) {
        deferred = sig;
        return;
    }
    for (int i = 0; i < CLI_MAX_FILES; i++)
        if (pending[i]) unlink(pending[i]);
    signal(sig, SIG_DFL);
    raise(sig); /* delivered when the handler returns: the process ends as it would have */
}

static void catch_ending_signals(void) {
    static int done;
    if (done) return;
    done = 1;
    for (size_t k = 0; k < sizeof ending_signals / sizeof ending_signals[0]; k++) {
        struct sigaction old, sa;
        if (sigaction(ending_signals[k], NULL, &old) == 0 && old.sa_handler == SIG_IGN)
            continue; /* ignored by the caller (nohup): stays ignored */
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_ending_signal;
        sa.sa_flags = SA_RESTART;
        sigemptyset(&sa.sa_mask);
        sigaction(ending_signals[k], &sa, NULL);
    }
    /* over a file size limit a write fails with EFBIG (an error naming the
     * file, temporaries removed) instead of killing the process mid-write */
    signal(SIGXFSZ, SIG_IGN);
}

/* Temporary names differ by process and by call; the copied name is cut
 * short so that a legal output name gives a legal temporary name. */
static int reserve(const cli_outputs *o, cli_file *f) {
    static unsigned serial;
    const char *path = *f->path;
    struct stat st;
    if (f->stream) { /* beside nothing: in the temporary directory */
        const char *dir = getenv("TMPDIR");
        if (!dir || !*dir) dir = "/tmp";
        f->tmp = malloc(strlen(dir) + 32);
        if (!f->tmp) return mha_cmd_error(o->cmd, MHA_EXIT_RUNTIME, "out of memory");
        sprintf(f->tmp, "%s/mha-stdout-XXXXXX", dir);
        int fd = mkstemp(f->tmp);
        if (fd < 0) {
            const int e = errno;
            mha_cmd_error(o->cmd, MHA_EXIT_RUNTIME, "cannot write %s '-': a temporary file in '%s': %s", f->flag,
                          dir, strerror(e));
            free(f->tmp);
            f->tmp = NULL;
            return MHA_EXIT_RUNTIME;
        }
        close(fd);
        return 0;
    }
    if (lstat(path, &st) == 0 && S_ISLNK(st.st_mode) && !(f->target = realpath(path, NULL)))
        return mha_cmd_error(o->cmd, MHA_EXIT_RUNTIME,
                             "cannot write %s '%s': it is a symbolic link whose target cannot be "
                             "resolved (%s); expected a link to an existing file",
                             f->flag, path, strerror(errno));
    const char *dest = destination(f), *slash = strrchr(dest, '/');
    size_t n = strlen(dest), dir = slash ? (size_t)(slash - dest + 1) : 0, base = n - dir;
    f->tmp = malloc(n + 64);
    if (!f->tmp) return mha_cmd_error(o->cmd, MHA_EXIT_RUNTIME, "out of memory");
    int fd = -1;
    for (int attempt = 0; attempt < 100 && fd < 0; attempt++) {
        char suffix[64];
        snprintf(suffix, sizeof suffix, ".mha-%ld-%u.part", (long)getpid(), serial++);
        size_t room = NAME_MAX - 1 - strlen(suffix);
        snprintf(f->tmp, n + 64, "%.*s.%.*s%s", (int)dir, dest, (int)(base < room ? base : room),
                 dest + dir, suffix);
        fd = open(f->tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
        if (fd < 0 && errno != EEXIST) break;
    }
    if (fd < 0) {
        int e = errno;
        free(f->tmp);
        f->tmp = NULL;
        return mha_cmd_error(o->cmd, MHA_EXIT_RUNTIME, "cannot write %s '%s': %s", f->flag, path,
                             strerror(e));
    }
    /* a replaced file keeps its owner and permissions (the library's
     * writer copies them from this temporary); best effort */
    if (stat(dest, &st) == 0 && S_ISREG(st.st_mode)) {
        /* Only root gives files away: for anyone else fchown fails (EPERM)
         * and the temporary stays ours, as a new output would; nothing to
         * report. The result goes to a variable because glibc declares
         * fchown warn_unused_result, which a (void) cast does not silence
         * under _FORTIFY_SOURCE. */
        const int owner_kept = fchown(fd, st.st_uid, st.st_gid) == 0;
        (void)owner_kept;
        (void)fchmod(fd, st.st_mode & 0777);
    }
    close(fd);
    return 0;
}

static void remove_temporaries(cli_outputs *o) {
    for (int i = 0; i < o->n_out; i++) {
        pending[i] = NULL;
        if (o->out[i].tmp) unlink(o->out[i].tmp);
        free(o->out[i].tmp);
        free(o->out[i].target);
        o->out[i].tmp = o->out[i].target = NULL;
    }
}

/* A file a checkpoint input is read from besides its own path. */
typedef struct {
    file_id id;
    char *path;
    int from; /* the index of the checkpoint input in o->in */
} extra_file;

typedef struct {
    extra_file *v;
    int n, cap;
} extra_list;

static void extras_free(extra_list *x) {
    for (int i = 0; i < x->n; i++) free(x->v[i].path);
    free(x->v);
    memset(x, 0, sizeof *x);
}

/* Adds path when it exists and is not listed yet; 0, or -1 out of memory. */
static int extras_add(extra_list *x, const char *path, int from) {
    struct stat st;
    if (stat(path, &st) != 0) return 0; /* what is missing replaces nothing; the load reports it */
    for (int i = 0; i < x->n; i++)
        if (strcmp(x->v[i].path, path) == 0) return 0;
    if (x->n == x->cap) {
        int cap = x->cap ? 2 * x->cap : 8;
        extra_file *v = realloc(x->v, sizeof *v * (size_t)cap);
        if (!v) return -1;
        x->v = v, x->cap = cap;
    }
    extra_file *e = &x->v[x->n];
    memset(e, 0, sizeof *e);
    if (!(e->path = strdup(path))) return -1;
    e->from = from;
    x->n++;
    return 0;
}

/* The files checkpoint input j is read from: what a directory names (its
 * model.safetensors or index), the config.json beside that file, and the
 * shards an index names (each shard file once). What cannot be resolved
 * or parsed adds nothing: the load reports it. 0, or -1 out of memory. */
static int checkpoint_files(const cli_outputs *o, int j, extra_list *x) {
    const char *path = *o->in[j].path;
    char file[PATH_MAX], dir[PATH_MAX], name[2 * PATH_MAX];
    if (mha_checkpoint_resolve(file, sizeof file, path) != MHA_OK) return 0;
    if (strcmp(file, path) != 0 && extras_add(x, file, j)) return -1;
    const char *slash = strrchr(file, '/');
    snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - file + 1) : 0, file);
    snprintf(name, sizeof name, "%sconfig.json", dir);
    if (extras_add(x, name, j)) return -1;
    const size_t n = strlen(file), s = strlen(".index.json");
    struct stat st;
    if (n <= s || strcmp(file + n - s, ".index.json") != 0 || stat(file, &st) != 0 || !S_ISREG(st.st_mode) ||
        st.st_size > ((off_t)64 << 20)) /* the library's bound on an index */
        return 0;
    json_t *root = json_load_file(file, 0, NULL), *map = json_object_get(root, "weight_map"), *v;
    const char *key;
    int rc = 0;
    json_object_foreach(map, key, v) {
        const char *shard = json_string_value(v);
        if (!shard || !*shard || strchr(shard, '/')) continue; /* refused by the load */
        snprintf(name, sizeof name, "%s%s", dir, shard);
        if ((rc = extras_add(x, name, j))) break;
    }
    json_decref(root);
    return rc;
}

/* Refuses an input that exists but is not a regular file or a directory
 * (a pipe would block the read); 0 or the exit code. */
static int check_readable(const cli_outputs *o, const char *flag, const char *path, const file_id *id) {
    if (!id->exists || S_ISREG(id->mode) || S_ISDIR(id->mode)) return 0;
    return mha_cmd_error(o->cmd, MHA_EXIT_RUNTIME,
                         "cannot read %s '%s': it is not a regular file (a pipe or a device); expected "
                         "a file",
                         flag, path);
}

int cli_outputs_check(cli_outputs *o) {
    if (o->after_parse) o->after_parse(o->ctx);
    file_id in[CLI_MAX_FILES], out[CLI_MAX_FILES];
    extra_list x = {0};
    int rc = 0;
    const cli_file *from_stdin = NULL;
    for (int j = 0; j < o->n_in && !rc; j++) {
        in[j].exists = 0;
        in[j].resolved[0] = '\0';
        o->in[j].stream = 0;
        if (!*o->in[j].path) continue;
        if (strcmp(*o->in[j].path, "-") == 0) { /* no file: no output can be it */
            rc = check_stdin(o, &o->in[j], &from_stdin);
            continue;
        }
        identify(o, &o->in[j], &in[j], 0);
        rc = check_readable(o, o->in[j].flag, *o->in[j].path, &in[j]);
        if (!rc && o->in[j].checkpoint && checkpoint_files(o, j, &x))
            rc = mha_cmd_error(o->cmd, MHA_EXIT_RUNTIME, "out of memory");
    }
    for (int k = 0; k < x.n && !rc; k++) {
        identify(o, &(cli_file){.flag = o->in[x.v[k].from].flag, .path = (const char *const *)&x.v[k].path},
                 &x.v[k].id, 0);
        rc = check_readable(o, o->in[x.v[k].from].flag, x.v[k].path, &x.v[k].id);
    }
    const cli_file *stream = NULL;
    for (int i = 0; i < o->n_out && !rc; i++) {
        cli_file *f = &o->out[i];
        out[i].exists = 0;
        out[i].resolved[0] = '\0';
        f->stream = 0;
        if (!*f->path) continue;
        if (strcmp(*f->path, "-") == 0) { /* no file: nothing to compare */
            rc = check_stream(o, f, &stream);
            continue;
        }
        if ((rc = identify(o, f, &out[i], 1))) break;
        for (int j = 0; j < o->n_in && !rc; j++)
            if (*o->in[j].path && same_file(&out[i], &in[j]))
                rc = mha_cmd_error(o->cmd, MHA_EXIT_USAGE,
                                   "%s '%s' is the same file as %s '%s'; an output must not "
                                   "replace an input (choose another path)",
                                   f->flag, *f->path, o->in[j].flag, *o->in[j].path);
        /* a file the checkpoint is read from: a directory's model.safetensors, a shard, config.json */
        for (int k = 0; k < x.n && !rc; k++)
            if (same_file(&out[i], &x.v[k].id))
                rc = mha_cmd_error(o->cmd, MHA_EXIT_USAGE,
                                   "%s '%s' is the same file as '%s', read from %s '%s'; an output "
                                   "must not replace an input (choose another path)",
                                   f->flag, *f->path, x.v[k].path, o->in[x.v[k].from].flag,
                                   *o->in[x.v[k].from].path);
        for (int j = 0; j < i && !rc; j++)
            if (*o->out[j].path && same_file(&out[i], &out[j]))
                rc = mha_cmd_error(o->cmd, MHA_EXIT_USAGE,
                                   "%s '%s' is the same file as %s '%s'; each output needs "
                                   "its own path",
                                   f->flag, *f->path, o->out[j].flag, *o->out[j].path);
    }
    extras_free(&x);
    if (rc) return rc;
    if (o->n_out) catch_ending_signals();
    /* a reader that goes away (| head): EPIPE, an error with the temporaries removed, not a kill */
    if (stream) signal(SIGPIPE, SIG_IGN);
    for (int i = 0; i < o->n_out; i++) {
        if (!*o->out[i].path) continue;
        rc = reserve(o, &o->out[i]);
        if (rc) {
            remove_temporaries(o);
            return rc;
        }
        pending[i] = o->out[i].tmp;
    }
    return 0;
}

/* The index of the output registered under flag in o->out, or -1. */
static int output_index(const cli_outputs *o, const char *flag) {
    for (int i = 0; i < o->n_out; i++)
        if (strcmp(o->out[i].flag, flag) == 0) return i;
    return -1;
}

const char *cli_outputs_tmp(const cli_outputs *o, const char *flag) {
    writing = 1; /* from here an interruption is acted on in cli_outputs_finish */
    const int i = output_index(o, flag);
    return i < 0 ? NULL : o->out[i].tmp;
}

int cli_outputs_write(cli_outputs *o, const char *flag, cli_atomic_writer write, const void *ctx) {
    const char *path = cli_outputs_tmp(o, flag); /* from here a signal waits for cli_outputs_finish */
    const int at = output_index(o, flag);
    cli_file *f = at < 0 ? NULL : &o->out[at];
    int files = 0;
    for (int i = 0; i < o->n_out; i++) files += o->out[i].tmp != NULL;
    if (f && f->tmp && !f->stream && files == 1) {
        pending[at] = NULL; /* no temporary of ours to remove any more */
        unlink(f->tmp);
        free(f->tmp);
        f->tmp = NULL;
        f->direct = 1;
        path = destination(f);
    }
    mha_status s = write(path, ctx);
    if (!s) return 0;
    if (f && f->direct) f->direct = 0; /* the writer left the target as it was */
    return cli_outputs_write_error(o, flag, mha_last_error());
}

const char *cli_outputs_path(const cli_outputs *o, const char *flag) {
    const int i = output_index(o, flag);
    return i < 0 ? NULL : *o->out[i].path;
}

int cli_outputs_write_error(const cli_outputs *o, const char *flag, const char *msg) {
    const char *tmp = cli_outputs_tmp(o, flag), *path = cli_outputs_path(o, flag), *at = NULL;
    if (tmp && path) at = strstr(msg, tmp);
    if (!at) return mha_cmd_error(o->cmd, MHA_EXIT_RUNTIME, "cannot write %s: %s", flag, msg);
    return mha_cmd_error(o->cmd, MHA_EXIT_RUNTIME, "cannot write %s: %.*s%s%s", flag,
                         (int)(at - msg), msg, path, at + strlen(tmp));
}

/* Makes the renames durable; best effort. */
static void sync_dir_of(const char *path) {
    char dir[PATH_MAX];
    dir_of(path, dir, sizeof dir);
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return;
    (void)fsync(fd);
    close(fd);
}

/* The stream's temporary onto standard output, flushed; 0 or the exit code. */
static int copy_to_stdout(const cli_outputs *o, const cli_file *f) {
    FILE *in = fopen(f->tmp, "rb");
    char buf[1 << 16];
    size_t n;
    int e = in ? 0 : errno;
    while (!e && (n = fread(buf, 1, sizeof buf, in)) > 0)
        if (fwrite(buf, 1, n, stdout) != n) e = errno ? errno : EIO;
    if (!e && in && ferror(in)) e = errno ? errno : EIO;
    if (!e && fflush(stdout) != 0) e = errno ? errno : EIO;
    if (in) fclose(in);
    if (!e) return 0;
    return mha_cmd_error(o->cmd, MHA_EXIT_RUNTIME, "cannot write %s to standard output: %s; no file was replaced",
                         f->flag, strerror(e));
}

FILE *cli_outputs_report(const cli_outputs *o) {
    for (int i = 0; i < o->n_out; i++)
        if (o->out[i].stream) return stderr;
    return stdout;
}

int cli_outputs_finish(cli_outputs *o, int rc) {
    writing = 1; /* an interruption now waits until the renames are all done or none */
    /* interrupted while the outputs were written: a failed command, nothing replaced */
    if (deferred && rc == 0) rc = MHA_EXIT_RUNTIME;
    /* Every temporary is complete and fsync'ed before the first rename, so
     * only a rename itself can still fail (in one directory it does not
     * for lack of space). */
    /* standard output first: a reader that fails it leaves every file as it was */
    for (int i = 0; i < o->n_out && rc == 0; i++)
        if (o->out[i].stream && o->out[i].tmp) rc = copy_to_stdout(o, &o->out[i]);
    for (int i = 0; i < o->n_out && rc == 0; i++) {
        cli_file *f = &o->out[i];
        if (!f->tmp || f->stream) continue;
        if (rename(f->tmp, destination(f)) != 0)
            rc = mha_cmd_error(o->cmd, MHA_EXIT_RUNTIME, "cannot write %s '%s': %s", f->flag,
                               *f->path, strerror(errno));
        else {
            sync_dir_of(destination(f));
            pending[i] = NULL;
            free(f->tmp);
            f->tmp = NULL;
        }
    }
    remove_temporaries(o);
    writing = 0;
    if (deferred) {
        const int sig = deferred;
        const cli_file *done = NULL; /* written straight to its target before the signal was acted on */
        for (int i = 0; i < o->n_out; i++)
            if (o->out[i].direct) done = &o->out[i];
        if (done)
            mha_cmd_error(o->cmd, MHA_EXIT_RUNTIME, "interrupted (signal %d) while writing; %s '%s' was already "
                          "written whole",
                          sig, done->flag, *done->path);
        else
            mha_cmd_error(o->cmd, MHA_EXIT_RUNTIME, "interrupted (signal %d) while writing; no output was replaced",
                          sig);
        signal(sig, SIG_DFL);
        raise(sig);
    }
    return rc;
}

double cli_default_output_limit_gib(void) {
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    if (pages <= 0 || page <= 0) return 4.0; /* unknown: a modest default */
    return 0.5 * (double)pages * (double)page / (1024.0 * 1024.0 * 1024.0);
}

int cli_check_output_size(const char *cmd, const char *what, double floats, double limit_gib) {
    double gib = floats * 4.0 / (1024.0 * 1024.0 * 1024.0);
    if (gib <= limit_gib) return 0;
    return mha_cmd_error(cmd, MHA_EXIT_USAGE,
                         "%s would hold %.3g GiB (%.0f float32 values), above the limit of %.3g "
                         "GiB; raise it with --max-output-gib or use fewer tokens",
                         what, gib, floats, limit_gib);
}

int cli_check_output_bytes(const char *cmd, const char *what, double bytes, double limit_gib) {
    double gib = bytes / (1024.0 * 1024.0 * 1024.0);
    if (gib <= limit_gib) return 0;
    return mha_cmd_error(cmd, MHA_EXIT_USAGE,
                         "%s would hold %.3g GiB (%.0f bytes), above the limit of %.3g GiB; raise it with "
                         "--max-output-gib or use fewer tokens",
                         what, gib, bytes, limit_gib);
}
