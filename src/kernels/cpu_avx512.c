/* cpu_avx512.c — may this process run AVX-512 code? CPUID for the
 * instructions, XCR0 for the OS: without opmask and zmm state saved on a
 * context switch, AVX-512 instructions fault or lose registers. Built
 * without ISA flags (it runs before anything is known about the CPU). */
#include "kernels/kernels.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>

static int check_avx512(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return 0;
    const int osxsave = (c >> 27) & 1, fma = (c >> 12) & 1, f16c = (c >> 29) & 1;
    if (!osxsave || !fma || !f16c) return 0;
    unsigned xlo, xhi;
    __asm__ volatile("xgetbv" : "=a"(xlo), "=d"(xhi) : "c"(0));
    (void)xhi;
    const unsigned want = (1u << 1) | (1u << 2) | (1u << 5) | (1u << 6) | (1u << 7);
    if ((xlo & want) != want) return 0;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return 0;
    const int f = (b >> 16) & 1, dq = (b >> 17) & 1, bw = (b >> 30) & 1, vl = (b >> 31) & 1;
    return f && dq && bw && vl;
}

int mha_cpu_has_avx512(void) {
    static int known = -1; /* a benign race: every thread computes the same */
    if (known < 0) known = check_avx512();
    return known;
}
#else
int mha_cpu_has_avx512(void) { return 0; }
#endif
