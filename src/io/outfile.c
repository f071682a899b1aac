/* outfile.c — atomic file output for every writer in src/io. The bytes go
 * to a temporary file in the target's directory (so the final rename never
 * crosses a file system); commit flushes, fsyncs and renames it over the
 * target; any failure removes the temporary, so an existing target is
 * either replaced whole or left byte-identical, never truncated. */
#define _GNU_SOURCE /* sync_file_range (Linux); without it, no early writeback */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/io_internal.h"

/* Temporary names differ by process and by call, so concurrent writers of
 * one target never share a temporary. */
static unsigned long next_serial(void) {
    static unsigned long serial;
    return __atomic_fetch_add(&serial, 1, __ATOMIC_RELAXED);
}

/* "<dir>/.<base><suffix>" for dest into out (cap >= strlen(dest) + 64),
 * base cut short so that a legal name with the suffix stays a legal name. */
static void temp_name(char *out, size_t cap, const char *dest, const char *suffix) {
    const char *slash = strrchr(dest, '/');
    size_t dir = slash ? (size_t)(slash - dest + 1) : 0, base = strlen(dest + dir);
    const size_t room = NAME_MAX - 1 - strlen(suffix);
    if (base > room) base = room;
    snprintf(out, cap, "%.*s.%.*s%s", (int)dir, dest, (int)base, dest + dir, suffix);
}

mha_status mha_out_open(mha_out_file *o, const char *path) {
    memset(o, 0, sizeof *o);
    o->fd = -1;
    o->path = path;
    if (!*path) /* else the temporary would go to the working directory and the rename fail */
        return mha_fail(MHA_E_ARG, "cannot write '': an empty file name; expected a path");
    struct stat st;
    /* a rename over a link would replace the link: write over what it names */
    if (lstat(path, &st) == 0 && S_ISLNK(st.st_mode) && !(o->target = realpath(path, NULL)))
        return mha_fail(MHA_E_IO, "cannot write '%s': it is a symbolic link whose target cannot be "
                        "resolved (%s); expected a link to an existing file", path, strerror(errno));
    const char *dest = o->target ? o->target : path;
    mha_status s = MHA_OK;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode))
        s = mha_fail(MHA_E_IO, "cannot write '%s': it is a directory; expected a file path", path);
    /* the rename would replace a device or a pipe with a regular file */
    else if (stat(path, &st) == 0 && !S_ISREG(st.st_mode))
        s = mha_fail(MHA_E_IO,
                     "cannot write '%s': it exists and is not a regular file (a device or a "
                     "pipe); expected a file path",
                     path);
    size_t n = strlen(dest);
    if (!s && !(o->tmp = malloc(n + 64)))
        s = mha_fail(MHA_E_NOMEM, "cannot allocate a file name for '%s'", path);
    for (int attempt = 0; !s && attempt < 100; attempt++) {
        /* "<dir>/.<base>.<pid>-<serial>.tmp": hidden, next to the target */
        char suffix[64];
        snprintf(suffix, sizeof suffix, ".%ld-%lu.tmp", (long)getpid(), next_serial());
        temp_name(o->tmp, n + 64, dest, suffix);
        o->fd = open(o->tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
        if (o->fd >= 0 || errno != EEXIST) break;
    }
    if (!s && o->fd < 0) s = mha_fail(MHA_E_IO, "cannot write '%s': %s", path, strerror(errno));
    /* a replaced file keeps its owner and permissions (a private 0600 file
     * would otherwise come back readable by all, a user's file run over by
     * root owned by root); best effort */
    if (!s && stat(dest, &st) == 0 && S_ISREG(st.st_mode)) {
        /* only root gives files away: EPERM leaves the file ours, nothing to
         * report; glibc marks fchown warn_unused_result, which a (void) cast
         * does not silence under _FORTIFY_SOURCE */
        const int owner_kept = fchown(o->fd, st.st_uid, st.st_gid) == 0;
        (void)owner_kept;
        (void)fchmod(o->fd, st.st_mode & 0777);
    }
    if (s) {
        free(o->tmp);
        free(o->target);
        o->tmp = o->target = NULL;
        return s;
    }
    o->f = fdopen(o->fd, "wb");
    if (!o->f) {
        int e = errno;
        mha_out_abort(o);
        return mha_fail(MHA_E_IO, "cannot write '%s': %s", path, strerror(e));
    }
    return MHA_OK;
}

/* Bytes after which the written part of a large array is handed to the
 * device while the rest is still being copied (a hint: commit's fsync
 * waits for the rest). */
#define MHA_OUT_STREAM ((size_t)1 << 20)

mha_status mha_out_write(mha_out_file *o, const void *p, size_t n) {
    const char *c = p;
    for (size_t done = 0; done < n;) {
        size_t m = n - done < MHA_OUT_STREAM ? n - done : MHA_OUT_STREAM;
        if (fwrite(c + done, 1, m, o->f) != m)
            return mha_fail(MHA_E_IO, "cannot write %zu bytes to '%s': %s", n, o->path,
                            strerror(errno));
        done += m;
#ifdef SYNC_FILE_RANGE_WRITE
        /* start writing back what is in the page cache so far, without
         * waiting: the device works while the next chunk is copied */
        if (m == MHA_OUT_STREAM && fflush(o->f) == 0)
            (void)sync_file_range(o->fd, 0, 0, SYNC_FILE_RANGE_WRITE);
#endif
    }
    return MHA_OK;
}

void mha_out_abort(mha_out_file *o) {
    if (o->f) fclose(o->f);
    else if (o->fd >= 0) close(o->fd);
    if (o->tmp) unlink(o->tmp);
    free(o->tmp);
    free(o->target);
    memset(o, 0, sizeof *o);
    o->fd = -1;
}

/* Makes the rename itself durable; best effort (some file systems refuse
 * fsync on a directory, and the data is already safe). */
static void sync_dir(const char *path) {
    const char *slash = strrchr(path, '/');
    char dir[4096];
    if (!slash) snprintf(dir, sizeof dir, ".");
    else if (slash == path) snprintf(dir, sizeof dir, "/");
    else if ((size_t)(slash - path) < sizeof dir) snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
    else return;
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return;
    (void)fsync(fd);
    close(fd);
}

mha_status mha_out_commit(mha_out_file *o) {
    const char *step = "flush";
    int ok = fflush(o->f) == 0;
    if (ok) step = "sync", ok = fsync(o->fd) == 0;
    int e = errno;
    FILE *f = o->f;
    o->f = NULL; /* closed here, whatever happens */
    o->fd = -1;
    if (fclose(f) != 0 && ok) step = "close", ok = 0, e = errno;
    const char *dest = o->target ? o->target : o->path;
    if (ok && rename(o->tmp, dest) != 0) step = "rename", ok = 0, e = errno;
    if (ok) sync_dir(dest);
    if (!ok) {
        const char *path = o->path;
        mha_out_abort(o);
        return mha_fail(MHA_E_IO, "cannot write '%s' (%s failed): %s; the file is unchanged",
                        path, step, strerror(e));
    }
    free(o->tmp);
    free(o->target);
    memset(o, 0, sizeof *o);
    o->fd = -1;
    return MHA_OK;
}
