/* c_locale.c — numbers in files, written and read in the C locale.
 *
 * printf's %g and strtod follow the calling thread's LC_NUMERIC: under a
 * decimal-comma locale (de_DE, fr_FR, ...) a save would write
 * "rope_theta = 500000,5", which no other process reads back, and a load
 * would refuse the "500000.5" every other writer produces. A file's bytes
 * must not depend on who wrote them, so both directions switch the calling
 * thread to the C locale for the one call (uselocale is per thread: other
 * threads and the caller's own locale are untouched). */
#include <errno.h>
#include <locale.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "internal.h"

static locale_t c_numeric = (locale_t)0;
static pthread_once_t c_once = PTHREAD_ONCE_INIT;

static void c_numeric_make(void) { c_numeric = newlocale(LC_NUMERIC_MASK, "C", (locale_t)0); }

/* The C locale for this thread, and the one it replaced (0: nothing
 * switched, newlocale found no memory; the caller's locale then stays, as
 * before this file existed). */
static locale_t c_enter(void) {
    pthread_once(&c_once, c_numeric_make);
    return c_numeric ? uselocale(c_numeric) : (locale_t)0;
}

static void c_leave(locale_t previous) {
    if (previous) uselocale(previous);
}

int mha_c_snprintf(char *buf, size_t size, const char *fmt, ...) {
    locale_t previous = c_enter();
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, size, fmt, ap);
    va_end(ap);
    c_leave(previous);
    return n;
}

double mha_c_strtod(const char *s, char **end) {
    locale_t previous = c_enter();
    errno = 0; /* strtod's alone, not the locale switch's */
    double x = strtod(s, end);
    int e = errno;
    c_leave(previous);
    errno = e;
    return x;
}
