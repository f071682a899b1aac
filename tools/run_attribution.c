/* run_attribution.c — the attribution part of `mha run`: reads dY, checks
 * its shape against Y, and asks the library for each head's Z^(r) . dZ^(r)
 * per position. Legend: B, T, h, d_model (see mha.h). */
#include <stdlib.h>

#include "commands.h"
#include "run_attribution.h"
#include "stdin_npy.h"

int run_attribution(float **attribution, const char *grad_path, const char *save_path,
                    const mha_layer *L, const cli_fwd *f, const float *v_src) {
    *attribution = NULL;
    if (!grad_path && !save_path) return MHA_EXIT_OK;
    if (!grad_path || !save_path)
        return mha_cmd_error("run", MHA_EXIT_USAGE, "--%s needs --%s: the attribution is that of the metric <dY, Y>",
                             grad_path ? "grad-output" : "save-attribution",
                             grad_path ? "save-attribution" : "grad-output");
    const mha_config *c = mha_layer_config(L);
    mha_array dy = {0};
    int rc = cli_npy_read("run", &dy, grad_path, 0);
    if (rc) return rc;
    grad_path = cli_input_name(grad_path);
    mha_status s;
    int rank = f->batched ? 3 : 2;
    if (!dy.f || dy.rank != rank || (f->batched && dy.shape[0] != f->B) || dy.shape[rank - 2] != f->T ||
        dy.shape[rank - 1] != c->d_model) {
        char got[96];
        cli_shape_str(&dy, got, sizeof got);
        rc = f->batched
                 ? mha_cmd_error("run", MHA_EXIT_RUNTIME, "%s: dY is %s of shape %s; expected float (B, T, d_model) = (%d, %d, %d), Y's shape",
                                 grad_path, mha_dtype_name(dy.dtype), got, f->B, f->T, c->d_model)
                 : mha_cmd_error("run", MHA_EXIT_RUNTIME, "%s: dY is %s of shape %s; expected float (T, d_model) = (%d, %d), Y's shape",
                                 grad_path, mha_dtype_name(dy.dtype), got, f->T, c->d_model);
        goto done;
    }
    if (!(*attribution = cli_alloc("run", (size_t)c->n_heads * f->B * f->T))) {
        rc = MHA_EXIT_RUNTIME;
        goto done;
    }
    /* kv.f NULL is self-attention; v_src NULL means the key source. */
    if ((s = mha_head_attribution(L, *attribution, NULL, dy.f, f->x.f, f->kv.f, v_src, f->B, f->T, f->S, &f->opt))) {
        free(*attribution);
        *attribution = NULL;
        rc = cli_fail("run", s);
    }
done:
    mha_array_free(&dy);
    return rc;
}
