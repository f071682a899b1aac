/* test_compute_edges.c — the kernel chooser's every input (MHA_KERNELS
 * values, the test override, names) and the workspace's reuse rules
 * (smallest block that fits, too-small blocks replaced, the slot and byte
 * limits, concurrent take/give never sharing a block), and the large
 * zeroed blocks of the KV cache (zeroed, huge pages where allowed). */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "base/internal.h"
#include "compute/workspace.h"
#include "kernels/kernels.h"
#include "tests.h"

/* Runs mha_isa_choose under MHA_KERNELS=env (NULL: unset). */
static mha_status choose_under(const char *env, const mha_isa **isa, int *reference) {
    if (env) setenv("MHA_KERNELS", env, 1);
    else unsetenv("MHA_KERNELS");
    *isa = NULL;
    *reference = -1;
    return mha_isa_choose(isa, reference);
}

static void test_dispatch_every_env_value(void) {
    const char *old = getenv("MHA_KERNELS");
    char *saved = old ? strdup(old) : NULL;
    const mha_isa *best = mha_isa_best(), *isa;
    int ref;
    CHECK(best && strcmp(best->name, mha_cpu_has_avx512() ? "avx512" : mha_cpu_has_avx2() ? "avx2" : "scalar") == 0);
    CHECK_OK(choose_under(NULL, &isa, &ref));
    CHECK(isa == best && ref == 0);
    CHECK_OK(choose_under("", &isa, &ref));
    CHECK(isa == best && ref == 0);
    CHECK_OK(choose_under("reference", &isa, &ref));
    CHECK(isa == best && ref == 1);
    CHECK_OK(choose_under("scalar", &isa, &ref));
    CHECK(isa && isa->prefill == &mha_kernels_scalar && isa->decode == &mha_decode_kernels_scalar && ref == 0);
    CHECK(mha_kernels_get() == &mha_kernels_scalar);
    if (mha_cpu_has_avx2()) {
        CHECK_OK(choose_under("avx2", &isa, &ref));
        CHECK(isa && isa->prefill == &mha_kernels_avx2 && ref == 0);
    }
    if (mha_cpu_has_avx512()) {
        CHECK_OK(choose_under("avx512", &isa, &ref));
        CHECK(isa && isa->prefill == &mha_kernels_avx512 && isa->decode == &mha_decode_kernels_avx512 && ref == 0);
    }
    CHECK_STATUS(choose_under("AVX2", &isa, &ref), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("MHA_KERNELS=AVX2 in the environment; expected reference, scalar, avx2 or avx512 (or unset)");
    /* an invalid value: mha_kernels_get falls back to the best */
    CHECK(mha_kernels_get() == best->prefill);

    /* the test override wins over every value but still reports reference */
    mha_kernels_force(&mha_kernels_scalar);
    CHECK_OK(choose_under("AVX2", &isa, &ref));
    CHECK(isa && isa->prefill == &mha_kernels_scalar && ref == 0);
    CHECK_OK(choose_under("reference", &isa, &ref));
    CHECK(isa && isa->prefill == &mha_kernels_scalar && ref == 1);
    /* a table that is no ISA's prefill table clears the override */
    mha_kernels fake = mha_kernels_scalar;
    mha_kernels_force(&fake);
    CHECK_OK(choose_under(NULL, &isa, &ref));
    CHECK(isa == best);
    mha_kernels_force(NULL);
    CHECK_OK(choose_under(NULL, &isa, &ref));
    CHECK(isa == best);

    /* by name */
    CHECK_OK(mha_isa_by_name(&isa, NULL));
    CHECK(isa == best);
    CHECK_OK(mha_isa_by_name(&isa, "scalar"));
    CHECK(isa && strcmp(isa->name, "scalar") == 0);
    CHECK_STATUS(mha_isa_by_name(&isa, "reference"), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("kernels 'reference' unknown; expected reference, scalar, avx2 or avx512");
    CHECK(isa == best); /* a refusal leaves the best */

    if (saved) setenv("MHA_KERNELS", saved, 1);
    else unsetenv("MHA_KERNELS");
    free(saved);
}

/* Fills a block with a marker and checks it is still there. */
static void fill(float *p, size_t n, float v) {
    for (size_t i = 0; i < n; i++) p[i] = v;
}
static int all_equal(const float *p, size_t n, float v) {
    for (size_t i = 0; i < n; i++)
        if (p[i] != v) return 0;
    return 1;
}

static void test_workspace_reuse_rules(void) {
    mha_workspace *w = mha_workspace_create();
    CHECK(w != NULL);
    if (!w) return;
    mha_workspace_give(w, NULL); /* no-op */
    /* 16, 64 and 256 floats (capacities round up to 64 bytes = 16 floats) */
    float *a = mha_workspace_take(w, 16), *b = mha_workspace_take(w, 64), *c = mha_workspace_take(w, 250);
    CHECK(a && b && c && a != b && b != c);
    if (!a || !b || !c) return;
    CHECK(((uintptr_t)a % 64) == 0 && ((uintptr_t)c % 64) == 0);
    fill(a, 16, 1), fill(b, 64, 2), fill(c, 256, 3); /* 250 rounds up to 256 */
    mha_workspace_give(w, c);
    mha_workspace_give(w, a);
    mha_workspace_give(w, b);
    /* the smallest kept block that fits, whatever the slot order */
    float *g = mha_workspace_take(w, 20);
    CHECK(g == b && all_equal(g, 64, 2));
    float *h = mha_workspace_take(w, 1);
    CHECK(h == a);
    float *k = mha_workspace_take(w, 256);
    CHECK(k == c && all_equal(k, 256, 3));
    /* empty again: a fresh block */
    float *fresh = mha_workspace_take(w, 8);
    CHECK(fresh && fresh != a && fresh != b && fresh != c);
    mha_workspace_give(w, fresh);
    mha_workspace_give(w, g);
    mha_workspace_give(w, h);
    mha_workspace_give(w, k);
    /* four slots are full: a fifth block is freed, not kept; taking five
     * then returns the four kept ones and one new one */
    float *fifth = mha_workspace_take(w, 4096);
    CHECK(fifth != NULL);
    float *fifth_new = NULL;
    float *got[4];
    /* nothing kept fits 4096: the largest (k, 256) is taken and replaced */
    CHECK(fifth != g && fifth != h && fifth != fresh); /* those three stay kept */
    if (fifth) fill(fifth, 4096, 5);
    mha_workspace_give(w, fifth); /* kept in k's slot */
    for (int i = 0; i < 4; i++) got[i] = mha_workspace_take(w, 1);
    fifth_new = mha_workspace_take(w, 1);
    int kept_fifth = 0, kept_small = 0;
    for (int i = 0; i < 4; i++) {
        kept_fifth += got[i] == fifth;
        kept_small += got[i] == g || got[i] == h || got[i] == fresh;
    }
    CHECK(kept_fifth == 1 && kept_small == 3);
    /* smallest first: the 4096-float block is handed out last */
    CHECK(got[3] == fifth);
    for (int i = 0; i < 4; i++) mha_workspace_give(w, got[i]);
    mha_workspace_give(w, fifth_new); /* all four slots taken: freed */
    /* none of the four kept blocks fits 8192: the largest is replaced */
    float *bigger = mha_workspace_take(w, 8192);
    CHECK(bigger != NULL);
    for (int i = 0; i < 3; i++) CHECK(bigger != got[i]); /* the three small ones stay kept */
    if (bigger) {
        fill(bigger, 8192, 6);
        CHECK(all_equal(bigger, 8192, 6));
    }
    mha_workspace_give(w, bigger);
    mha_workspace_free(w);
    mha_workspace_free(NULL);
}

/* A block over MHA_WORKSPACE_KEEP_MAX is freed on give, not kept. */
static void test_workspace_over_limit(void) {
    mha_workspace *w = mha_workspace_create();
    if (!w) return;
    size_t over = MHA_WORKSPACE_KEEP_MAX / sizeof(float) + 16;
    float *big = mha_workspace_take(w, over);
    CHECK(big != NULL);
    if (!big) { mha_workspace_free(w); return; }
    big[0] = 7, big[over - 1] = 8;
    float *small = mha_workspace_take(w, 16);
    mha_workspace_give(w, small);
    mha_workspace_give(w, big); /* over the byte limit: freed */
    float *first = mha_workspace_take(w, 1), *second = mha_workspace_take(w, 1);
    CHECK(first == small);      /* the small one was kept */
    CHECK(second != big);       /* the big one was not */
    mha_workspace_give(w, first);
    mha_workspace_give(w, second);
    mha_workspace_free(w);
}

typedef struct {
    mha_workspace *w;
    int id;
    int bad;
} ws_worker;

static void *ws_work(void *arg) {
    ws_worker *me = arg;
    for (int it = 0; it < 400; it++) {
        size_t n = (size_t)(16 + (it * 37 + me->id * 11) % 200);
        float *p = mha_workspace_take(me->w, n);
        if (!p) { me->bad++; continue; }
        fill(p, n, (float)me->id);
        if (!all_equal(p, n, (float)me->id)) me->bad++;
        mha_workspace_give(me->w, p);
    }
    return NULL;
}

/* Eight threads borrow and return blocks of varying size from one
 * workspace: no block is ever in two threads' hands (a shared block would
 * show another thread's marker). Runs under TSan in `make test-tsan`. */
static void test_workspace_concurrent(void) {
    mha_workspace *w = mha_workspace_create();
    if (!w) return;
    enum { N = 8 };
    pthread_t th[N];
    ws_worker wk[N];
    for (int i = 0; i < N; i++) {
        wk[i] = (ws_worker){w, i + 1, 0};
        CHECK(pthread_create(&th[i], NULL, ws_work, &wk[i]) == 0);
    }
    for (int i = 0; i < N; i++) {
        pthread_join(th[i], NULL);
        CHECK_INT(wk[i].bad, 0);
    }
    mha_workspace_free(w);
}

#if !TEST_SANITIZED /* ASan's allocator places and touches its blocks its own way */
/* The line starting with key in /proc/self/smaps for the mapping holding
 * addr, into line (n bytes); 0 where the file, the mapping or the line is
 * not found. */
static int smaps_line_at(uintptr_t addr, const char *key, char *line, size_t n) {
    FILE *f = fopen("/proc/self/smaps", "r");
    if (!f) return 0;
    int inside = 0, found = 0;
    while (!found && fgets(line, (int)n, f)) {
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2) inside = lo <= addr && addr < hi; /* a mapping's first line */
        else found = inside && strncmp(line, key, strlen(key)) == 0;
    }
    fclose(f);
    return found;
}

/* kB of AnonHugePages for the mapping holding addr; -1 where not found. */
static long huge_kb_at(uintptr_t addr) {
    char line[512];
    unsigned long v;
    return smaps_line_at(addr, "AnonHugePages:", line, sizeof line) &&
                   sscanf(line, "AnonHugePages: %lu kB", &v) == 1
               ? (long)v
               : -1;
}

/* 1 when the mapping holding addr is advised for huge pages (VmFlags
 * "hg"), 0 when not, -1 when smaps cannot say. Unlike a fault count this
 * does not depend on whether the block was touched before (the allocator
 * may hand back heap memory) or on what the kernel grants. */
static int huge_advised_at(uintptr_t addr) {
    char line[512];
    return smaps_line_at(addr, "VmFlags:", line, sizeof line) ? strstr(line, " hg") != NULL : -1;
}

/* Whether the machine has free memory in blocks of at least 2 MiB now
 * (/proc/buddyinfo: order 9 or above in any zone), where a huge page can
 * be had without compaction. */
static int huge_pages_free(void) {
    FILE *f = fopen("/proc/buddyinfo", "r");
    if (!f) return 1; /* unknown: check */
    char line[512];
    int any = 0;
    while (fgets(line, sizeof line, f)) {
        const char *z = strstr(line, "zone");
        if (!z) continue;
        z += 4;
        while (*z == ' ') z++;
        while (*z && *z != ' ') z++; /* the zone's name */
        long cnt[16] = {0};
        int n = 0, used = 0;
        while (n < 16 && sscanf(z, "%ld%n", &cnt[n], &used) == 1) z += used, n++;
        for (int o = 9; o < n; o++) any |= cnt[o] > 0;
    }
    fclose(f);
    return any;
}

/* Whether the kernel gives huge pages to a madvise(MADV_HUGEPAGE) range. */
static int thp_on_request(void) {
    FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
    char buf[128] = {0};
    if (!f) return 0;
    int ok = fgets(buf, sizeof buf, f) && (strstr(buf, "[madvise]") || strstr(buf, "[always]"));
    fclose(f);
    return ok;
}
#endif

/* mha_calloc_large: zeroed even where the allocator hands back memory
 * just freed dirty, 64-byte aligned, and (where the kernel allows on
 * request) backed by huge pages once touched: a cold decode step walks a
 * page table per 2 MiB of cache, not per 4 KiB. A block from the heap
 * could not promise the last (pages an earlier test touched stay 4 KiB:
 * the whole suite failed this check 2 runs in 3 while the block was
 * calloc's), so a large block is a mapping of its own. */
static void test_calloc_large_zeroed_huge(void) {
    const size_t bytes = ((size_t)8 << 20) + 123;
    for (int round = 0; round < 2; round++) { /* the second block may land where the first was */
        unsigned char *dirty = malloc(bytes);
        if (dirty) memset(dirty, 0xab, bytes);
        free(dirty);
        unsigned char *p = mha_calloc_large(bytes, 1);
        CHECK(p != NULL);
        if (!p) return;
        CHECK_INT((long)((uintptr_t)p % 64), 0);
        size_t nonzero = 0;
        for (size_t i = 0; i < bytes; i++) nonzero += p[i] != 0;
        CHECK_INT((long)nonzero, 0);
        memset(p, 1, bytes); /* touch every page */
#if !TEST_SANITIZED
        if (thp_on_request() && huge_pages_free()) {
            long kb = huge_kb_at((uintptr_t)p + ((size_t)4 << 20));
            CHECK(kb >= 2048); /* at least one of the whole 2 MiB ranges */
        }
#endif
        mha_calloc_large_free(p);
    }
    /* small blocks (a calloc inside) and empty ones, zeroed and aligned */
    for (size_t n = 0; n < 5000; n = n * 3 + 1) {
        unsigned char *p = mha_calloc_large(n, 3);
        CHECK(p != NULL);
        if (!p) return;
        CHECK_INT((long)((uintptr_t)p % 64), 0);
        size_t nonzero = 0;
        for (size_t i = 0; i < n * 3; i++) nonzero += p[i] != 0;
        CHECK_INT((long)nonzero, 0);
        mha_calloc_large_free(p);
    }
    CHECK(mha_calloc_large(SIZE_MAX / 2, 4) == NULL); /* n * size overflows */
    mha_calloc_large_free(NULL);
}

/* mha_alloc_large from HUGE_MIN (512 KiB) on: 2 MiB aligned and rounded
 * up to whole huge pages, so that no part of a fresh block faults per 4
 * KiB page (~40 us a fault in one of this project's VMs; a 663 KiB GEMM
 * packing block was 160 of them). A block above glibc's largest mmap
 * threshold (32 MiB) is a fresh mapping: touching all of 34.5 MiB then
 * costs 18 faults of 2 MiB, where a tail left to 4 KiB pages adds 128. */
static void test_alloc_large_whole_huge_pages(void) {
    unsigned char *p = mha_alloc_large((size_t)600 << 10);
    CHECK(p != NULL && (uintptr_t)p % ((size_t)2 << 20) == 0);
    free(p);
    const size_t bytes = ((size_t)69 << 20) / 2;
    p = mha_alloc_large(bytes);
    CHECK(p != NULL);
    if (!p) return;
#if !TEST_SANITIZED
    /* the whole block is advised, its last partial 2 MiB too */
    const int advised = huge_advised_at((uintptr_t)p);
    if (thp_on_request() && advised >= 0) { /* madvise sets no flag without THP */
        CHECK_INT(advised, 1);
        CHECK_INT(huge_advised_at((uintptr_t)p + bytes - 1), 1);
    }
    struct rusage before, after;
    getrusage(RUSAGE_SELF, &before);
    memset(p, 1, bytes);
    getrusage(RUSAGE_SELF, &after);
    /* where the kernel granted a huge page for every whole 2 MiB of the
       block (fewer when memory is too fragmented to compact: then those
       ranges fault per 4 KiB and the count says nothing; a block whose
       tail stays on 4 KiB pages still has all its whole ranges huge) */
    const long whole_kb = (long)(bytes >> 21) * 2048;
    if (thp_on_request() && huge_kb_at((uintptr_t)p) >= whole_kb)
        CHECK(after.ru_minflt - before.ru_minflt <= 40);
#endif
    free(p);
    unsigned char *small = mha_alloc_large((size_t)100 << 10);
    CHECK(small != NULL && (uintptr_t)small % 64 == 0);
    free(small);
}

static const test_case cases[] = {
    {"dispatch_every_env_value", test_dispatch_every_env_value},
    {"workspace_reuse_rules", test_workspace_reuse_rules},
    {"workspace_over_limit", test_workspace_over_limit},
    {"workspace_concurrent", test_workspace_concurrent},
    {"calloc_large_zeroed_huge", test_calloc_large_zeroed_huge},
    {"alloc_large_whole_huge_pages", test_alloc_large_whole_huge_pages},
};

const test_case *tests_compute_edges(size_t *count) {
    *count = sizeof cases / sizeof cases[0];
    return cases;
}
