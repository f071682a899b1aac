/* memory.c — the library's large blocks (weights, packed panels, inputs,
 * workspace). A fresh block costs one page fault per 4 KiB page on first
 * touch (measured: ~1.5 us each in one VM, ~40 us in another, where 64
 * MiB of fresh 4 KiB pages took 0.5-0.8 s); where the kernel allows
 * transparent huge pages on request
 * (/sys/kernel/mm/transparent_hugepage/enabled = madvise, the Debian
 * default), a block of HUGE_MIN or more is 2 MiB aligned, rounded up to
 * whole 2 MiB and marked MADV_HUGEPAGE, so each 2 MiB of it faults once
 * (a P1 `mha run`: 1,100 faults -> 270). The price: up to 2 MiB of
 * memory per block beyond its size, once its tail is touched. Elsewhere
 * madvise fails harmlessly and the block is an ordinary one.
 * A zeroed block (mha_calloc_large: the KV cache) stays calloc's, whose
 * large blocks are fresh mappings faulted lazily; only the whole 2 MiB
 * ranges inside it are marked, before anything touches them. */
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>

#include "base/internal.h"

#define HUGE_PAGE ((size_t)2 << 20)
#define HUGE_MIN ((size_t)512 << 10) /* from here a block is rounded up to whole huge pages */

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
    if (bytes < HUGE_MIN) return aligned_alloc(64, mha_round_up(bytes ? bytes : 1, 64));
    /* whole huge pages: the tail of a block would fault per 4 KiB page */
    const size_t whole = mha_round_up(bytes, HUGE_PAGE);
    void *p = NULL;
    if (whole < bytes || posix_memalign(&p, HUGE_PAGE, whole) != 0) return NULL;
    mha_advise_huge(p, whole);
    return p;
}

void *mha_calloc_large(size_t n, size_t size) {
    void *p = calloc(n, size);
    if (p) mha_advise_huge(p, n * size); /* calloc checked that n * size fits */
    return p;
}
