/* floor.c — build/bench_load_floor: what any fresh `mha run` process on
 * the P1 checkpoint pays before and after the forward, with no
 * arithmetic, so bench/load/run.py can compare it with the 0.4 x forward
 * the 1.4x target leaves for everything but the forward.
 *
 *   bench_load_floor CKPT X.npy OUT.npy OUT_BYTES FRESH_BYTES
 *
 * Steps, each timed (wall), in the order a process needs them:
 *   team       the first OpenMP parallel region (OMP_NUM_THREADS threads,
 *              empty): the worker threads the forward needs must start and
 *              run on the other CPUs; Linux may start a worker on the
 *              master's CPU, where it waits for the load balancer while the
 *              master spins at the barrier (bench/LOAD.md); only a
 *              process's first region pays it
 *   map_read   map the checkpoint and X read-only (MAP_POPULATE) and read
 *              one byte per 4 KiB page: the bytes must enter the process
 *   fresh      FRESH_BYTES of new memory on 2 MiB pages (as
 *              mha_alloc_large), one write per 4 KiB page: what the
 *              forward writes (workspace, Y) starts as fresh pages in a new
 *              process, and the kernel zeroes every page it hands out
 *   write      OUT_BYTES written to a temporary file in one write()
 *   fsync      that file made durable (outputs appear whole or not at all)
 *   rename     the temporary renamed over OUT
 * Prints one line: RESULT kind=load_floor <step>_s=... total_s=...
 * Only the standard C library, POSIX, OpenMP and bench_util.c's clock:
 * no libmha. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bench.h"

#define PAGE 4096
#define HUGE_PAGE ((size_t)2 << 20)

static int fail(const char *what, const char *path) {
    fprintf(stderr, "bench_load_floor: %s %s failed\n", what, path);
    return 1;
}

/* Maps path and reads one byte per page; adds the bytes into *sum. */
static int map_and_read(const char *path, unsigned *sum) {
    const int fd = open(path, O_RDONLY);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0 || st.st_size == 0) return fail("open", path);
    const unsigned char *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE | MAP_POPULATE, fd, 0);
    close(fd);
    if (p == MAP_FAILED) return fail("mmap", path);
    for (size_t i = 0; i < (size_t)st.st_size; i += PAGE) *sum += p[i];
    munmap((void *)p, (size_t)st.st_size);
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 6) {
        fprintf(stderr, "usage: bench_load_floor CKPT X.npy OUT.npy OUT_BYTES FRESH_BYTES\n");
        return 2;
    }
    const size_t out_bytes = strtoull(argv[4], NULL, 10), fresh_bytes = strtoull(argv[5], NULL, 10);
    if (out_bytes == 0 || fresh_bytes < out_bytes) return fail("sizes", argv[4]);
    unsigned sum = 0;
    double t[7];
    t[0] = bench_now();
    int team = 0;
#pragma omp parallel reduction(+ : team)
    team += 1;
    t[1] = bench_now();
    if (map_and_read(argv[1], &sum) || map_and_read(argv[2], &sum)) return 1;
    t[2] = bench_now();
    const size_t whole = (fresh_bytes + HUGE_PAGE - 1) / HUGE_PAGE * HUGE_PAGE;
    unsigned char *fresh = NULL;
    if (posix_memalign((void **)&fresh, HUGE_PAGE, whole) != 0) return fail("alloc", argv[5]);
    madvise(fresh, whole, MADV_HUGEPAGE);
    for (size_t i = 0; i < fresh_bytes; i += PAGE) fresh[i] = (unsigned char)(i >> 12);
    t[3] = bench_now();
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s.floor.%ld", argv[3], (long)getpid()) >= (int)sizeof tmp)
        return fail("name", argv[3]);
    const int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) return fail("create", tmp);
    if (write(fd, fresh, out_bytes) != (ssize_t)out_bytes) return close(fd), unlink(tmp), fail("write", tmp);
    t[4] = bench_now();
    if (fsync(fd) != 0) return close(fd), unlink(tmp), fail("fsync", tmp);
    close(fd);
    t[5] = bench_now();
    if (rename(tmp, argv[3]) != 0) return unlink(tmp), fail("rename", tmp);
    t[6] = bench_now();
    static const char *const step[] = {"team", "map_read", "fresh", "write", "fsync", "rename"};
    printf("RESULT kind=load_floor");
    for (int i = 0; i < 6; i++) printf(" %s_s=%.6f", step[i], t[i + 1] - t[i]);
    printf(" total_s=%.6f threads=%d fresh_bytes=%zu out_bytes=%zu check=%u\n", t[6] - t[0], team, fresh_bytes,
           out_bytes, sum);
    free(fresh);
    return 0;
}
