/* run_attribution.h — `mha run --grad-output dY.npy --save-attribution A.npy`:
 * per-head attribution of the linear metric <dY, Y> (mha_head_attribution).
 * Legend: B, T, h, d_model (see mha.h). */
#ifndef MHA_TOOLS_RUN_ATTRIBUTION_H
#define MHA_TOOLS_RUN_ATTRIBUTION_H

#include "io_cli.h"

/* Reads dY (shaped like Y: (T, d_model) or (B, T, d_model), as X is batched)
 * from grad_path and computes *attribution (h, B, T), malloc'ed, for the
 * forward that f describes (v_src: the --v-input values or NULL). Both
 * paths must be given together; with neither, *attribution stays NULL.
 * Writes no file. Returns an exit code. */
int run_attribution(float **attribution, const char *grad_path, const char *save_path,
                    const mha_layer *L, const cli_fwd *f, const float *v_src);

#endif
