/* demo.h — printing and checking helpers shared by the parts of `mha demo`
 * (cmd_demo.c: the seeds' small vectors; demo_layer.c: a whole layer).
 * Every number the demo prints comes from a library call; these helpers
 * only format it and compare results that must agree. */
#ifndef MHA_TOOLS_DEMO_H
#define MHA_TOOLS_DEMO_H

#include <stdint.h>

#include "mha.h"

typedef struct {
    int checks; /* comparisons made                        */
    int failed; /* comparisons that disagreed              */
} mha_demo;

/* "=== title ===" with a blank line before it. */
void mha_demo_banner(const char *title);
/* "  label = [a, b, c]" with 3 decimals. */
void mha_demo_vec(const char *label, const float *v, int n);
/* A (rows, cols) matrix, one bracketed row per line, indented. */
void mha_demo_mat(const char *label, const float *m, int rows, int cols);
/* "  name  (sym)  (d0, d1, ...)" for a tensor of nd dims. */
void mha_demo_shape(const char *name, const char *sym, int nd, const int *dims);
/* Labels of one block kind: "  W_Q column blocks: [0, 1]". */
void mha_demo_labels(const char *label, const int *labels, int n);

/* Deterministic uniform numbers in [lo, hi) (splitmix64), so the demo's
 * output is the same on every machine and run. */
void mha_demo_fill_uniform(float *p, size_t n, uint64_t *state, float lo, float hi);

/* max |a - b| over n entries (NaN counts as infinite). */
double mha_demo_max_diff(const float *a, const float *b, int n);
/* Prints "check: what: max |diff| = ... ok|FAILED" and counts it. want_equal
 * 1: diff must be <= tol; 0: diff must be > tol (the result must change). */
void mha_demo_check(mha_demo *d, const char *what, double diff, double tol, int want_equal);
/* Prints "check: what: ok|FAILED" for a yes/no claim and counts it. */
void mha_demo_check_that(mha_demo *d, const char *what, int holds);
/* Prints "mha demo: <call> failed: <status>: <message>" on stderr; returns 1. */
int mha_demo_lib_error(const char *call, mha_status s);

/* Sections 6 and 7 (demo_layer.c): shapes of a real layer, and a full
 * causal layer with labels, permutations and the contract check.
 * Return 0, or 1 after a library error was reported. */
int mha_demo_shapes(mha_demo *d);
int mha_demo_full_layer(mha_demo *d);
/* Section 8 (demo_variants.c): ALiBi slopes and sinks travel with their
 * heads; RoPE's two pairings, and why one flag repairs a mismatch. */
int mha_demo_variants(mha_demo *d);

/* Calls a library function; on failure reports it and returns 1 from the
 * calling function (use only where nothing needs freeing). */
#define MHA_DEMO_TRY(call)                                                     \
    do {                                                                       \
        mha_status s_ = (call);                                                \
        if (s_ != MHA_OK) return mha_demo_lib_error(#call, s_);                \
    } while (0)

#endif /* MHA_TOOLS_DEMO_H */
