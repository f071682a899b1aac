/* dispatch.c — the one kernel chooser: a table of instruction sets, best
 * first, each with its prefill and decode tables and a CPUID + XCR0 check.
 * The CPU is probed once (pthread_once); MHA_KERNELS and the test override
 * pick an entry by name for every path (prefill, cached prefill, decode). */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "base/internal.h"
#include "kernels/kernels.h"

const mha_kernels mha_kernels_avx2 = {
    "avx2", mha_sgemm_avx2_6x16, mha_attn_scores_avx2, mha_attn_softmax_avx2,
    mha_attn_pv_avx2, mha_vexp_avx2, mha_attn_softcap_avx2, mha_attn_alibi_avx2, mha_attn_pack_q_avx2,
    6, 1, NULL, /* the driver tiles with sgemm_6x16 */
    mha_pack_a6_avx2, mha_store_t16_avx2,
    mha_key_norm_max_avx2, mha_all_within_avx2,
    NULL, NULL, NULL, NULL, /* no AMX: bf16 projections round the fp32 kernels' input */
};

/* ------------------------------------------------------------ the CPU */

enum {
    CPU_AVX2 = 1 << 0,     /* AVX2 + FMA + F16C, ymm state saved (XCR0 bits 1, 2) */
    CPU_AVX512 = 1 << 1,   /* AVX-512 F, BW, VL, DQ, zmm/opmask saved (XCR0 5-7) */
};

static int cpu_features;
static pthread_once_t cpu_once = PTHREAD_ONCE_INIT;

static void cpu_probe(void) {
#if defined(__x86_64__) || defined(__i386__)
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return;
    const int osxsave = (c >> 27) & 1, avx = (c >> 28) & 1, fma = (c >> 12) & 1, f16c = (c >> 29) & 1;
    if (!osxsave || !avx) return;
    unsigned xlo, xhi; /* XCR0: which register state the OS saves */
    __asm__ volatile("xgetbv" : "=a"(xlo), "=d"(xhi) : "c"(0));
    if ((xlo & 0x6) != 0x6) return; /* xmm and ymm */
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return;
    if (((b >> 5) & 1) && fma && f16c) cpu_features |= CPU_AVX2;
    const unsigned avx512 = (1u << 16) | (1u << 17) | (1u << 30) | (1u << 31); /* F DQ BW VL */
    if ((cpu_features & CPU_AVX2) && (b & avx512) == avx512 && (xlo & 0xe0) == 0xe0)
        cpu_features |= CPU_AVX512;
#endif
}

static int cpu_has(int feature) {
    pthread_once(&cpu_once, cpu_probe);
    return (cpu_features & feature) != 0;
}

int mha_cpu_has_avx2(void) { return cpu_has(CPU_AVX2); }
int mha_cpu_has_avx512(void) { return cpu_has(CPU_AVX512); }

unsigned mha_cpu_amd_family(void) {
#if defined(__x86_64__) || defined(__i386__)
    unsigned a, b, c, d;
    if (!__get_cpuid(0, &a, &b, &c, &d)) return 0;
    const int amd = b == 0x68747541u && d == 0x69746e65u && c == 0x444d4163u; /* "AuthenticAMD" */
    if (!amd || !__get_cpuid(1, &a, &b, &c, &d)) return 0;
    return ((a >> 8) & 0xf) == 0xf ? 0xf + ((a >> 20) & 0xff) : (a >> 8) & 0xf;
#else
    return 0;
#endif
}

unsigned mha_cpu_l1d_kib(void) {
#if defined(__x86_64__) || defined(__i386__)
    unsigned a, b, c, d;
    if (mha_cpu_amd_family()) return __get_cpuid(0x80000005, &a, &b, &c, &d) ? c >> 24 : 0;
    if (!__get_cpuid(0, &a, &b, &c, &d) || a < 4) return 0;
    for (unsigned i = 0; i < 16; i++) { /* leaf 4: one cache per subleaf, type 0 ends the list */
        __cpuid_count(4, i, a, b, c, d);
        const unsigned type = a & 0x1f, level = (a >> 5) & 0x7;
        if (type == 0) break;
        if (type == 1 && level == 1) /* ways x partitions x line x sets */
            return (unsigned)(((b >> 22) + 1ull) * (((b >> 12) & 0x3ff) + 1) * ((b & 0xfff) + 1) * (c + 1ull) / 1024);
    }
#endif
    return 0;
}

int mha_probed_once(_Atomic int *forced, _Atomic int *probed, int (*probe)(void)) {
    const int f = atomic_load(forced);
    if (f >= 0) return f;
    int p = atomic_load_explicit(probed, memory_order_relaxed);
    if (p < 0) atomic_store_explicit(probed, p = probe(), memory_order_relaxed);
    return p;
}

/* AMD family 0x19 (Zen 3 and 4) with AVX-512 is Zen 4, whose 512-bit
 * datapaths are 256 bits wide; Zen 5 (0x1a) and Intel's are whole. */
static int cpu_splits_512(void) { return mha_cpu_has_avx512() && mha_cpu_amd_family() == 0x19; }

static _Atomic int forced_halves = -1, probed_halves = -1;

void mha_force_halves_512(int halves) { atomic_store(&forced_halves, halves); }

int mha_cpu_halves_512(void) { return mha_probed_once(&forced_halves, &probed_halves, cpu_splits_512); }

/* AMD Zen streams one weight row at a time fastest (Zen 5, round 8: 0.54-
 * 0.66x the tiles' cold time for bf16 / int8; Zen 4 likewise, round 16);
 * on an Intel Xeon the tiles with their requests ahead are 0.63-0.70x
 * (bf16) and 0.86-0.90x (int8) the sweep's cold time in two runs
 * (round 17). */
static int cpu_sweeps_rows(void) { return mha_cpu_amd_family() >= 0x17; }

static _Atomic int forced_sweep = -1, probed_sweep = -1;

void mha_force_row_sweep(int sweep) { atomic_store(&forced_sweep, sweep); }

int mha_cpu_row_sweep(void) { return mha_probed_once(&forced_sweep, &probed_sweep, cpu_sweeps_rows); }

/* AMX-BF16 for options.bf16_matmul: CPUID leaf 7 EDX bits 22 (AMX-BF16)
 * and 24 (AMX-TILE), XCR0 bits 17-18 (tile configuration and data saved),
 * then Linux's permission to use tile data (a process-wide request; the
 * instructions fault without it). */
static int cpu_amx_bf16(void) {
#if (defined(__x86_64__) || defined(__i386__)) && defined(__linux__)
    unsigned a, b, c, d;
    if (!mha_cpu_has_avx512() || !__get_cpuid_count(7, 0, &a, &b, &c, &d)) return 0;
    if (((d >> 22) & 1) == 0 || ((d >> 24) & 1) == 0) return 0;
    unsigned xlo, xhi;
    __asm__ volatile("xgetbv" : "=a"(xlo), "=d"(xhi) : "c"(0));
    if ((xlo & (3u << 17)) != (3u << 17)) return 0;
    return syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XFEATURE_XTILEDATA */) == 0;
#else
    return 0;
#endif
}

static _Atomic int forced_amx = -1, probed_amx = -1;

void mha_force_amx(int on) { atomic_store(&forced_amx, on > 0 ? -1 : on); }

int mha_cpu_has_amx_bf16(void) { return mha_probed_once(&forced_amx, &probed_amx, cpu_amx_bf16); }

static int always(void) { return 1; }

/* ------------------------------------------------------- the ISA table */

/* Best first. An ISA is one entry: its name, its check and its tables. */
static const mha_isa isas[] = {
    {"avx512", mha_cpu_has_avx512, &mha_kernels_avx512, &mha_decode_kernels_avx512, &mha_backward_kernels_avx512},
    {"avx2", mha_cpu_has_avx2, &mha_kernels_avx2, &mha_decode_kernels_avx2, &mha_backward_kernels_avx2},
    {"scalar", always, &mha_kernels_scalar, &mha_decode_kernels_scalar, &mha_backward_kernels_scalar},
};
#define N_ISAS (int)(sizeof isas / sizeof isas[0])

const mha_isa *mha_isa_best(void) {
    for (int i = 0; i < N_ISAS; i++)
        if (isas[i].available()) return &isas[i];
    return &isas[N_ISAS - 1];
}

/* "reference, scalar or avx2": the accepted MHA_KERNELS values, worst first. */
static void known_names(char *buf, size_t n) {
    size_t at = (size_t)snprintf(buf, n, "reference");
    for (int i = N_ISAS - 1; i >= 0 && at < n; i--)
        at += (size_t)snprintf(buf + at, n - at, "%s%s", i == 0 ? " or " : ", ", isas[i].name);
}

/* Index of the ISA called name, or -1. */
static int isa_index(const char *name) {
    for (int i = 0; i < N_ISAS; i++)
        if (strcmp(name, isas[i].name) == 0) return i;
    return -1;
}

mha_status mha_isa_by_name(const mha_isa **out, const char *name) {
    *out = mha_isa_best();
    if (!name) return MHA_OK;
    char known[160];
    known_names(known, sizeof known);
    int i = isa_index(name);
    if (i < 0) return mha_fail(MHA_E_ARG, "kernels '%s' unknown; expected %s", name, known);
    if (!isas[i].available())
        return mha_fail(MHA_E_ARG, "kernels %s: this CPU (or its OS) cannot run them; expected "
                        "reference or an ISA up to %s", name, mha_isa_best()->name);
    *out = &isas[i];
    return MHA_OK;
}

static _Atomic(const mha_isa *) forced;

void mha_kernels_force(const mha_kernels *k) {
    const mha_isa *isa = NULL;
    for (int i = 0; k && i < N_ISAS; i++)
        if (isas[i].prefill == k) isa = isas[i].available() ? &isas[i] : &isas[N_ISAS - 1];
    atomic_store(&forced, isa);
}

mha_status mha_isa_choose(const mha_isa **out, int *reference) {
    *reference = 0;
    const mha_isa *f = atomic_load(&forced);
    const char *env = getenv("MHA_KERNELS");
    if (env && *env && strcmp(env, "reference") == 0) *reference = 1, env = NULL;
    if (f) {
        *out = f;
        return MHA_OK;
    }
    if (env && !*env) env = NULL;
    if (!env || (isa_index(env) >= 0 && isas[isa_index(env)].available()))
        return mha_isa_by_name(out, env);
    char known[160];
    known_names(known, sizeof known);
    if (isa_index(env) < 0)
        return mha_fail(MHA_E_ARG, "MHA_KERNELS=%s in the environment; expected %s (or unset)", env, known);
    return mha_fail(MHA_E_ARG, "MHA_KERNELS=%s in the environment, but this CPU (or its OS) cannot run "
                    "those kernels; expected reference or an ISA up to %s (or unset)", env,
                    mha_isa_best()->name);
}

const mha_kernels *mha_kernels_get(void) {
    const mha_isa *isa;
    int reference;
    if (mha_isa_choose(&isa, &reference)) isa = mha_isa_best();
    return isa->prefill;
}
