/* error.c — status strings and the per-thread last-error message. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>

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

mha_status mha_fail(mha_status s, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return s;
}

mha_status mha_check_finite(const float *p, size_t n, const char *name) {
    for (size_t i = 0; i < n; i++)
        if (!isfinite(p[i]))
            return mha_fail(MHA_E_NONFINITE, "%s[%zu] = %g; expected a finite number",
                            name, i, (double)p[i]);
    return MHA_OK;
}
