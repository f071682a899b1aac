/* test_concurrency_errors.c — mha_last_error() from many threads at once
 * (mha.h: "a message (per thread)"): each thread reads the message of its
 * own last failure while the others fail with theirs, and a thread that
 * never failed reads "". And a message longer than its buffer is cut at a
 * character boundary, ending in "...": a cut inside a UTF-8 character made
 * an invalid string, which the Python binding raised as UnicodeDecodeError
 * instead of the call's error (found probing error reporting from
 * concurrent callers). The threads run no OpenMP region: `make test-tsan`
 * runs these (name "concurrency_...") under ThreadSanitizer. */
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests.h"

#define N_THREADS 4
#define ITERS 2000

typedef struct {
    int id, fresh_empty, wrong, failed;
    char seen[160], want[64];
} error_job;

/* A unique refused kernels name per thread and iteration; between the
 * failure and the read the thread yields, so that the others fail in
 * between: a message shared between threads would then name theirs. */
static void *fail_in_turn(void *arg) {
    error_job *j = arg;
    j->fresh_empty = mha_last_error()[0] == '\0';
    mha_context *ctx = NULL;
    if (mha_context_create(&ctx) != MHA_OK) {
        j->failed = 1;
        return NULL;
    }
    for (int it = 0; it < ITERS && !j->wrong; it++) {
        snprintf(j->want, sizeof j->want, "'isa_%d_%d'", j->id, it);
        char name[64];
        snprintf(name, sizeof name, "isa_%d_%d", j->id, it);
        if (mha_context_set_kernels(ctx, name) != MHA_E_ARG) j->failed = 1;
        sched_yield();
        if (!strstr(mha_last_error(), j->want)) {
            j->wrong = 1;
            snprintf(j->seen, sizeof j->seen, "%s", mha_last_error());
        }
    }
    mha_context_free(ctx);
    return NULL;
}

static void test_concurrency_errors_per_thread(void) {
    error_job jobs[N_THREADS];
    pthread_t th[N_THREADS];
    /* this thread's own failure: never what a new thread reads */
    CHECK_STATUS(mha_context_set_kernels(NULL, "main"), MHA_E_ARG);
    char mine[512];
    snprintf(mine, sizeof mine, "%s", mha_last_error());
    for (int i = 0; i < N_THREADS; i++) {
        memset(&jobs[i], 0, sizeof jobs[i]);
        jobs[i].id = i;
        CHECK_INT(pthread_create(&th[i], NULL, fail_in_turn, &jobs[i]), 0);
    }
    for (int i = 0; i < N_THREADS; i++) pthread_join(th[i], NULL);
    if (strcmp(mha_last_error(), mine) != 0)
        test_report(__FILE__, __LINE__, "the main thread's message changed to '%s'", mha_last_error());
    for (int i = 0; i < N_THREADS; i++) {
        CHECK(!jobs[i].failed);
        if (!jobs[i].fresh_empty) test_report(__FILE__, __LINE__, "thread %d: a new thread's message is not empty", i);
        if (jobs[i].wrong)
            test_report(__FILE__, __LINE__, "thread %d: wanted its own %s, read '%s'", i, jobs[i].want, jobs[i].seen);
    }
}

/* Length of the valid UTF-8 prefix of s (strlen(s) when all of it is). */
static size_t utf8_valid_prefix(const char *s) {
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0;
    while (p[i]) {
        const unsigned char b = p[i];
        const size_t n = b < 0x80 ? 1 : (b & 0xe0) == 0xc0 ? 2 : (b & 0xf0) == 0xe0 ? 3 : (b & 0xf8) == 0xf0 ? 4 : 0;
        if (!n) return i;
        for (size_t k = 1; k < n; k++)
            if ((p[i + k] & 0xc0) != 0x80) return i;
        i += n;
    }
    return i;
}

/* Names of 2-, 3- and 4-byte characters after 0..3 ASCII letters put the
 * cut at every place inside a character: the message stays valid UTF-8,
 * within its 512 bytes, ends in "..." and keeps what fitted. */
static void test_concurrency_errors_long_message_cut(void) {
    static const char *chars[] = {"\xc3\xa9", "\xe2\x82\xac", "\xf0\x9d\x84\x9e"}; /* é € 𝄞 */
    mha_context *ctx = NULL;
    CHECK_OK(mha_context_create(&ctx));
    for (int c = 0; ctx && c < 3; c++) {
        for (int shift = 0; shift < 4; shift++) {
            char name[2000] = "";
            for (int k = 0; k < shift; k++) strcat(name, "a");
            while (strlen(name) + 5 < 1200) strcat(name, chars[c]);
            CHECK_STATUS(mha_context_set_kernels(ctx, name), MHA_E_ARG);
            const char *e = mha_last_error();
            const size_t n = strlen(e), valid = utf8_valid_prefix(e);
            if (valid != n)
                test_report(__FILE__, __LINE__, "%zu-byte characters after %d letters: the message is invalid UTF-8 "
                            "from byte %zu of %zu", strlen(chars[c]), shift, valid, n);
            CHECK(n < 512 && n >= 500);
            CHECK(n >= 3 && strcmp(e + n - 3, "...") == 0);
            CHECK(strncmp(e, "kernels '", 9) == 0);
        }
    }
    /* a message that fits is not touched */
    CHECK_STATUS(mha_context_set_kernels(ctx, "short\xc3\xa9"), MHA_E_ARG);
    CHECK(strstr(mha_last_error(), "'short\xc3\xa9' unknown") != NULL);
    CHECK(strstr(mha_last_error(), "...") == NULL);
    mha_context_free(ctx);
}

static const test_case cases[] = {
    {"concurrency_errors_per_thread", test_concurrency_errors_per_thread},
    {"concurrency_errors_long_message_cut", test_concurrency_errors_long_message_cut},
};

const test_case *tests_concurrency_errors(size_t *count) {
    *count = sizeof cases / sizeof cases[0];
    return cases;
}
