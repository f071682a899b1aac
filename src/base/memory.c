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
 * A zeroed block (mha_calloc_large: the KV cache) of HUGE_MIN or more
 * is a mapping of its own (mmap): zero pages faulted lazily, 2 MiB
 * aligned and marked before anything touches them. calloc could not
 * promise that: it hands back heap memory an earlier free() left
 * touched (and clears it, touching it again), whose 4 KiB pages a
 * later madvise does not turn into huge ones; a 34 MiB calloc in the
 * test suite came back from the heap with no huge page. */
#include <stdatomic.h>
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

_Atomic int mha_alloc_large_fail_in;

void *mha_alloc_large(size_t bytes) {
    if (atomic_load_explicit(&mha_alloc_large_fail_in, memory_order_relaxed) > 0 &&
        atomic_fetch_sub(&mha_alloc_large_fail_in, 1) == 1)
        return NULL; /* the test hook's turn */
    if (bytes < HUGE_MIN) return aligned_alloc(64, mha_round_up(bytes ? bytes : 1, 64));
    /* whole huge pages: the tail of a block would fault per 4 KiB page */
    const size_t whole = mha_round_up(bytes, HUGE_PAGE);
    void *p = NULL;
    if (whole < bytes || posix_memalign(&p, HUGE_PAGE, whole) != 0) return NULL;
    mha_advise_huge(p, whole);
    return p;
}

/* The 64 bytes before a zeroed block: how to release it. */
typedef struct {
    void *base;   /* the mapping, or calloc's block (mapped 0)     */
    size_t bytes; /* the mapping's length                          */
    int mapped;
} zeroed_head;

#define ZEROED_HEAD 64 /* keeps the block 64-byte aligned */
_Static_assert(sizeof(zeroed_head) <= ZEROED_HEAD, "the header fits before the block");

void *mha_calloc_large(size_t n, size_t size) {
    if (size && n > (SIZE_MAX - 2 * HUGE_PAGE) / size) return NULL;
    const size_t bytes = n * size + ZEROED_HEAD;
    zeroed_head *h;
    if (bytes < HUGE_MIN) {
        char *b = calloc(1, bytes + ZEROED_HEAD); /* room to align the header to 64 */
        if (!b) return NULL;
        h = (zeroed_head *)mha_round_up((uintptr_t)b, ZEROED_HEAD);
        *h = (zeroed_head){b, 0, 0};
        return (char *)h + ZEROED_HEAD;
    }
    /* whole 2 MiB pages at a 2 MiB boundary: map one huge page more and
     * give back what lies before the boundary and after the block */
    const size_t span = mha_round_up(bytes, HUGE_PAGE);
    char *m = mmap(NULL, span + HUGE_PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return NULL;
    char *a = (char *)mha_round_up((uintptr_t)m, HUGE_PAGE);
    if (a > m) munmap(m, (size_t)(a - m));
    if (a + span < m + span + HUGE_PAGE) munmap(a + span, (size_t)(m + span + HUGE_PAGE - (a + span)));
    mha_advise_huge(a, span);
    h = (zeroed_head *)a;
    *h = (zeroed_head){a, span, 1};
    return a + ZEROED_HEAD;
}

void mha_calloc_large_free(void *p) {
    if (!p) return;
    const zeroed_head *h = (const zeroed_head *)((char *)p - ZEROED_HEAD);
    if (h->mapped) munmap(h->base, h->bytes);
    else free(h->base);
}
