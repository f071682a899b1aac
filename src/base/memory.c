/* memory.c — the library's large blocks (weights, packed panels, inputs,
 * workspace). A fresh block costs one page fault per 4 KiB page on first
 * touch (measured here: ~1.5 us each in a VM, 12 ms of a P1 `mha run`'s
 * first forward); where the kernel allows transparent huge pages on
 * request (/sys/kernel/mm/transparent_hugepage/enabled = madvise, the
 * Debian default), a block of 2 MiB or more is 2 MiB aligned and marked
 * MADV_HUGEPAGE, so each aligned 2 MiB of it faults once. Only whole
 * 2 MiB ranges inside the block are huge: memory use does not grow beyond
 * the alignment's untouched slack. Elsewhere madvise fails harmlessly and
 * the block is an ordinary one.
 * A zeroed block (mha_calloc_large: the KV cache) stays calloc's, whose
 * large blocks are fresh mappings faulted lazily; only the whole 2 MiB
 * ranges inside it are marked, before anything touches them. */
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>

#include "base/internal.h"

#define HUGE_PAGE ((size_t)2 << 20)

void mha_advise_huge(void *p, size_t bytes) {
    const uintptr_t lo = ((uintptr_t)p + HUGE_PAGE - 1) / HUGE_PAGE * HUGE_PAGE;
    const uintptr_t hi = ((uintptr_t)p + bytes) / HUGE_PAGE * HUGE_PAGE;
#ifdef MADV_HUGEPAGE
    if (p && hi > lo) (void)madvise((void *)lo, hi - lo, MADV_HUGEPAGE); /* a hint: failure is fine */
#else
    (void)lo, (void)hi;
#endif
}

void *mha_alloc_large(size_t bytes) {
    if (bytes < HUGE_PAGE) return aligned_alloc(64, mha_round_up(bytes ? bytes : 1, 64));
    void *p = NULL;
    if (posix_memalign(&p, HUGE_PAGE, bytes) != 0) return NULL;
    mha_advise_huge(p, bytes);
    return p;
}

void *mha_calloc_large(size_t n, size_t size) {
    void *p = calloc(n, size);
    if (p) mha_advise_huge(p, n * size); /* calloc checked that n * size fits */
    return p;
}
