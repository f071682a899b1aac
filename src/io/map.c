/* map.c — a whole regular file mapped read-only, for the readers in src/io.
 * Mapping instead of reading saves one full copy of the file and the page
 * faults of a fresh buffer; MAP_POPULATE maps the page-cache pages in one
 * pass instead of one fault per 4 KiB page. A reader that needs a small
 * part of a large file (one layer of a model) maps it lazily instead:
 * populating would read every byte of the file.
 *
 * A mapping can fault (SIGBUS) when another process truncates the file while
 * it is mapped; no library can prevent that, so the readers shrink the
 * window: the size is taken once at open, every offset of the header is
 * checked against it before a data byte is touched, the size is checked
 * again after the data was decoded (mha_map_check), and the mapping lives
 * only as long as the reader (or mha_layer_load) needs it. */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/io_internal.h"

static mha_status map_open(mha_file_map *m, const char *path, int populate) {
    memset(m, 0, sizeof *m);
    m->fd = -1;
    /* O_NONBLOCK: opening a pipe would otherwise wait for a writer forever;
     * it changes nothing for a regular file, the only kind read below */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return mha_fail(MHA_E_IO, "cannot open '%s': %s", path, strerror(errno));
    struct stat st;
    int stat_ok = fstat(fd, &st) == 0;
    if (!stat_ok || !S_ISREG(st.st_mode)) {
        int dir = stat_ok && S_ISDIR(st.st_mode);
        close(fd);
        return mha_fail(MHA_E_IO, "cannot read '%s': %s; expected a regular file", path,
                        dir ? "it is a directory" : "not a regular file");
    }
    if ((unsigned long long)st.st_size > (unsigned long long)SIZE_MAX) {
        close(fd);
        return mha_fail(MHA_E_IO, "cannot read '%s': %lld bytes do not fit in memory", path,
                        (long long)st.st_size);
    }
    m->len = (size_t)st.st_size;
    m->fd = fd;
    if (m->len == 0) return MHA_OK; /* nothing to map; readers see len 0 */
    void *p = mmap(NULL, m->len, PROT_READ, MAP_PRIVATE | (populate ? MAP_POPULATE : 0), fd, 0);
    if (p == MAP_FAILED) {
        int e = errno;
        mha_map_close(m);
        return mha_fail(e == ENOMEM ? MHA_E_NOMEM : MHA_E_IO, "cannot map '%s' (%zu bytes): %s",
                        path, (size_t)st.st_size, strerror(e));
    }
    m->p = p;
    return MHA_OK;
}

mha_status mha_map_open(mha_file_map *m, const char *path) { return map_open(m, path, 1); }

mha_status mha_map_open_lazy(mha_file_map *m, const char *path) { return map_open(m, path, 0); }

mha_status mha_map_check(const mha_file_map *m, const char *path) {
    struct stat st;
    if (fstat(m->fd, &st) != 0)
        return mha_fail(MHA_E_IO, "cannot read '%s': %s", path, strerror(errno));
    if ((unsigned long long)st.st_size != (unsigned long long)m->len)
        return mha_fail(MHA_E_IO,
                        "'%s' changed size while being read (%zu bytes, now %lld); expected a "
                        "file nobody writes during the load",
                        path, m->len, (long long)st.st_size);
    return MHA_OK;
}

void mha_map_close(mha_file_map *m) {
    if (m->p) munmap(m->p, m->len);
    if (m->fd >= 0) close(m->fd);
    memset(m, 0, sizeof *m);
    m->fd = -1;
}
