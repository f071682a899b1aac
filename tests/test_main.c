/* test_main.c — the one runner: every area registered in one list. Prints
 * "N passed, N failed" and exits non-zero on any failure. An optional
 * argument runs only the tests whose name contains it. */
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "test_util.h"
#include "tests.h"

static const test_area_fn areas[] = {
    tests_seed,
    tests_config,
    tests_permute,
    tests_heads,
    tests_masks,
    tests_variants,
    tests_modern,
    tests_errors,
    tests_fast,
    tests_kernels,
    tests_torch_layout,
    tests_io,
    tests_cache,
    tests_cache_i8,
    tests_concurrency,
    tests_overflow,
    tests_backward,
    tests_merge,
    tests_backward_fast,
};

const char *test_current = "";
int test_failures_current = 0;

void test_report(const char *file, int line, const char *fmt, ...) {
    va_list ap;
    fprintf(stderr, "FAIL %s (%s:%d): ", test_current, file, line);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    test_failures_current++;
}

/* Peak resident set of this process in bytes: VmHWM, which writing "5" to
 * /proc/self/clear_refs resets (so earlier tests' peaks do not count);
 * getrusage's lifetime maximum where /proc is not available. */
double test_peak_rss_bytes(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    double kib = -1.0;
    while (f && fgets(line, sizeof line, f))
        if (strncmp(line, "VmHWM:", 6) == 0) kib = atof(line + 6);
    if (f) fclose(f);
    if (kib < 0) {
        struct rusage ru;
        getrusage(RUSAGE_SELF, &ru);
        kib = (double)ru.ru_maxrss;
    }
    return kib * 1024.0;
}

void test_reset_peak_rss(void) {
    FILE *f = fopen("/proc/self/clear_refs", "w");
    if (f) fputs("5", f), fclose(f);
}

double test_max_abs_diff(const float *a, const float *b, size_t n) {
    double m = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (d != d) return INFINITY;
        if (d > m) m = d;
    }
    return m;
}

void test_fill_uniform(float *p, size_t n, uint64_t *seed, float lo, float hi) {
    for (size_t i = 0; i < n; i++) {
        /* splitmix64: small, deterministic, good enough for test data */
        uint64_t z = (*seed += 0x9E3779B97F4A7C15ull);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        z ^= z >> 31;
        double u = (double)(z >> 11) / 9007199254740992.0;
        p[i] = lo + (float)(u * (double)(hi - lo));
    }
}

int main(int argc, char **argv) {
    const char *filter = argc > 1 ? argv[1] : NULL;
    int passed = 0, failed = 0;
    for (size_t a = 0; a < sizeof areas / sizeof areas[0]; a++) {
        size_t n = 0;
        const test_case *cases = areas[a](&n);
        for (size_t i = 0; i < n; i++) {
            if (filter && !strstr(cases[i].name, filter)) continue;
            test_current = cases[i].name;
            test_failures_current = 0;
            cases[i].fn();
            if (test_failures_current) {
                failed++;
                fprintf(stderr, "not ok %s\n", cases[i].name);
            } else {
                passed++;
            }
        }
    }
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
