/* error.c — status strings and the per-thread last-error message. */
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "base/internal.h"

static _Thread_local char last_error[512];

const char *mha_status_str(mha_status s) {
    switch (s) {
    case MHA_OK: return "ok";
    case MHA_E_ARG: return "invalid argument";
    case MHA_E_SHAPE: return "shape mismatch";
    case MHA_E_NOMEM: return "out of memory";
    case MHA_E_CONTRACT: return "head-order contract violated";
    case MHA_E_NONFINITE: return "non-finite value";
    case MHA_E_IO: return "i/o error";
    case MHA_E_FORMAT: return "malformed file";
    case MHA_E_UNSUPPORTED: return "unsupported";
    }
    return "unknown status";
}

const char *mha_last_error(void) { return last_error; }

void mha_clear_error(void) { last_error[0] = '\0'; }

/* A message longer than the buffer (a long path, a long kernels name) is
 * cut and ends in "...". vsnprintf cuts at a byte: inside a multi-byte
 * UTF-8 character (a path of 'é') that left an invalid string, which the
 * Python binding's decode() turned into a UnicodeDecodeError instead of
 * the error the call reported. So the cut backs off to the start of the
 * character it split (a lead byte 11xxxxxx and its 10xxxxxx
 * continuations). */
static void cut_long_message(void) {
    static const char tail[] = "...";
    size_t end = sizeof last_error - sizeof tail; /* where "..." starts */
    size_t lead = end;
    while (lead > 0 && ((unsigned char)last_error[lead - 1] & 0xc0) == 0x80 && end - lead < 3) lead--;
    if (lead > 0 && ((unsigned char)last_error[lead - 1] & 0xc0) == 0xc0) {
        const unsigned char b = (unsigned char)last_error[lead - 1];
        const size_t need = b >= 0xf0 ? 4 : b >= 0xe0 ? 3 : 2; /* bytes of the character */
        if (end - (lead - 1) < need) end = lead - 1;            /* split: drop it whole */
    }
    memcpy(last_error + end, tail, sizeof tail);
}

mha_status mha_fail(mha_status s, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    const int n = vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    if (n >= (int)sizeof last_error) cut_long_message();
    return s;
}

static int let_through(float v, unsigned allow) {
    return isfinite(v) || ((allow & MHA_SCAN_ALLOW_NAN) && isnan(v)) ||
           ((allow & MHA_SCAN_ALLOW_NEG_INF) && v == -INFINITY);
}

/* Blocks of 4096 are scanned for any Inf or NaN without a branch (the
 * flag's OR vectorizes; an early exit per element kept the scan scalar:
 * 1-2% of a P1 forward per tensor), and only a flagged block is searched
 * element by element for one that `allow` refuses. */
#define SCAN_BLOCK ((size_t)4096)
size_t mha_first_nonfinite(const float *p, size_t n, unsigned allow) {
    for (size_t b0 = 0; b0 < n; b0 += SCAN_BLOCK) {
        const size_t b1 = n - b0 < SCAN_BLOCK ? n : b0 + SCAN_BLOCK;
        int bad = 0;
#pragma omp simd reduction(| : bad)
        for (size_t i = b0; i < b1; i++) bad |= !(fabsf(p[i]) <= FLT_MAX); /* NaN fails the compare */
        for (size_t i = b0; bad && i < b1; i++)
            if (!let_through(p[i], allow)) return i;
    }
    return n;
}

mha_status mha_check_finite(const float *p, size_t n, const char *name) {
    const size_t i = mha_first_nonfinite(p, n, 0);
    if (i < n)
        return mha_fail(MHA_E_NONFINITE, "%s[%zu] = %g; expected a finite number", name, i, (double)p[i]);
    return MHA_OK;
}
