/* audit_rope.h — `mha audit`'s rotary check: does the other RoPE pairing
 * (halves <-> interleaved) reproduce the reference? */
#ifndef MHA_TOOLS_AUDIT_ROPE_H
#define MHA_TOOLS_AUDIT_ROPE_H

#include "io_cli.h"

/* For a layer with RoPE: runs L with the other pairing on f's input and
 * compares with y_ref (ny floats) under tol, printing the finding. Returns
 * 1 when the other pairing reproduces the reference (the fix is printed),
 * 0 when it does not (or the layer has no RoPE), -1 after a library error
 * (reported). */
int audit_rope_pairing(const mha_layer *L, const cli_fwd *f, const float *y_ref, size_t ny, double tol,
                       const char *weights);

#endif /* MHA_TOOLS_AUDIT_ROPE_H */
