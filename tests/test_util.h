/* test_util.h — the tiny test framework: checks print both operands and the
 * failing test's name; the runner (test_main.c) counts and exits non-zero. */
#ifndef MHA_TEST_UTIL_H
#define MHA_TEST_UTIL_H

#include <math.h>
#include <stdio.h>
#include <stddef.h>
#include <stdint.h>

#include "mha.h"

/* 1 in a sanitizer build, whose shadow memory and allocator are not the
 * library's (peak-memory tests skip): gcc defines __SANITIZE_*__, clang
 * answers __has_feature. */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define TEST_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define TEST_SANITIZED 1
#endif
#endif
#ifndef TEST_SANITIZED
#define TEST_SANITIZED 0
#endif

typedef void (*test_fn)(void);
typedef struct {
    const char *name;
    test_fn fn;
} test_case;

/* One area = one file; it returns its table and count. */
typedef const test_case *(*test_area_fn)(size_t *count);

extern const char *test_current;  /* name of the running test */
extern int test_failures_current; /* failed checks in the running test */

/* Why a test could not run here. The runner prints each skip with its
 * reason and counts it in "N passed, N failed, N skipped". Under CI=true
 * (the CI machine is set up to run everything) a skip fails the run unless
 * it is TEST_SKIP_ALLOWED_IN_CI:
 *  TEST_SKIP_ISA: the library reports that the CPU lacks an ISA. Under CI
 *    it fails when the compiler's own CPUID check (__builtin_cpu_supports
 *    of `isa`) says the machine has it: then the library's check is wrong.
 *  TEST_SKIP_DEPENDENCY: a tool or file the test needs is missing.
 *  TEST_SKIP_ALLOWED_IN_CI: the test cannot measure what it measures in
 *    this build (e.g. peak RSS under AddressSanitizer's shadow memory). */
typedef enum { TEST_SKIP_ISA, TEST_SKIP_DEPENDENCY, TEST_SKIP_ALLOWED_IN_CI } test_skip_kind;
/* Marks the running test skipped; `isa` is a __builtin_cpu_supports name
 * (TEST_SKIP_ISA only, else NULL). The test then returns. */
void test_skip(test_skip_kind kind, const char *isa, const char *reason);
/* Whether the compiler's CPUID check finds `isa` (avx2, fma, f16c, avx512f). */
int test_machine_has(const char *isa);
#define SKIP(kind, isa, reason)                                                \
    do {                                                                       \
        test_skip((kind), (isa), (reason));                                    \
        return;                                                                \
    } while (0)

void test_report(const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#define CHECK(cond)                                                            \
    do {                                                                       \
        if (!(cond)) test_report(__FILE__, __LINE__, "CHECK(%s)", #cond);      \
    } while (0)

/* Status equality; prints the library's message on mismatch. */
#define CHECK_STATUS(expr, want)                                               \
    do {                                                                       \
        mha_status got_ = (expr);                                              \
        if (got_ != (want))                                                    \
            test_report(__FILE__, __LINE__, "%s = %d (%s), want %d; error: %s", \
                        #expr, (int)got_, mha_status_str(got_), (int)(want),   \
                        mha_last_error());                                     \
    } while (0)

#define CHECK_OK(expr) CHECK_STATUS(expr, MHA_OK)

#define CHECK_INT(a, b)                                                        \
    do {                                                                       \
        long long a_ = (long long)(a), b_ = (long long)(b);                    \
        if (a_ != b_)                                                          \
            test_report(__FILE__, __LINE__, "%s = %lld, want %s = %lld", #a,   \
                        a_, #b, b_);                                           \
    } while (0)

#define CHECK_NEAR(a, b, tol)                                                  \
    do {                                                                       \
        double a_ = (double)(a), b_ = (double)(b), t_ = (double)(tol);         \
        if (!(fabs(a_ - b_) <= t_))                                            \
            test_report(__FILE__, __LINE__, "%s = %.9g, want %s = %.9g (tol %g)", \
                        #a, a_, #b, b_, t_);                                   \
    } while (0)

/* Checks that the error message contains a substring. */
#define CHECK_ERROR_MENTIONS(substr)                                           \
    do {                                                                       \
        if (!strstr(mha_last_error(), (substr)))                               \
            test_report(__FILE__, __LINE__, "error \"%s\" does not mention \"%s\"", \
                        mha_last_error(), (substr));                           \
    } while (0)

/* Max |a - b| over n entries; NaN in either gives INFINITY. */
double test_max_abs_diff(const float *a, const float *b, size_t n);
/* test_max_abs_diff(got, want) / max |want| (INFINITY for a NaN, or for a
 * difference from an all-zero want). */
double test_max_rel_diff(const float *got, const float *want, size_t n);
/* The CPU's family on AMD (CPUID leaf 1 with the extended family), 0 on
 * any other vendor: read here, independently of the library's probes. */
unsigned test_amd_family(void);
/* Deterministic uniform floats in [lo, hi) from a 64-bit seed. */
void test_fill_uniform(float *p, size_t n, uint64_t *seed, float lo, float hi);
/* Peak resident set of this process in bytes since the last reset
 * (VmHWM; getrusage's lifetime maximum where /proc is missing). */
double test_peak_rss_bytes(void);
void test_reset_peak_rss(void);
/* y (B, T, d_model), malloc'd: L's causal forward of x (B, T, d_model)
 * on `path`; a failing call is reported (CHECK_OK) and y left zero. */
float *test_causal_forward(const mha_layer *L, const float *x, int B, int T, mha_path path);
/* The first of n entries where a and b differ in their bits (n if none). */
size_t test_first_bit_difference(const float *a, const float *b, size_t n);
/* Checks that a and b hold the same bits over n entries, naming what and
 * the first element that differs. */
#define CHECK_SAME_BITS(a, b, n, what)                                         \
    do {                                                                       \
        const float *a_ = (a), *b_ = (b);                                      \
        size_t n_ = (n), i_ = test_first_bit_difference(a_, b_, n_);           \
        if (i_ < n_)                                                           \
            test_report(__FILE__, __LINE__, "%s: element %zu differs: %a vs %a", \
                        (what), i_, (double)a_[i_], (double)b_[i_]);           \
    } while (0)
/* Checks max|a-b| <= tol over n entries, naming the arrays. */
#define CHECK_ARRAY_NEAR(a, b, n, tol)                                         \
    do {                                                                       \
        double d_ = test_max_abs_diff((a), (b), (n));                          \
        if (!(d_ <= (double)(tol)))                                            \
            test_report(__FILE__, __LINE__, "max|%s - %s| = %.3g > tol %g", #a,  \
                        #b, d_, (double)(tol));                                \
    } while (0)

#endif
