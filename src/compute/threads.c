/* threads.c — resolving how one call runs (exec.h): the caller's context,
 * else the process defaults. The defaults are atomics, so setting them
 * never races with running calls; a call reads them once, at its start.
 * Also the public context object (mha.h). */
#include <limits.h>
#include <omp.h>

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "compute/exec.h"

struct mha_context {
    int n_threads;      /* 0: the process default                         */
    const mha_isa *isa; /* NULL: MHA_KERNELS or the best for this CPU      */
    int reference;      /* 1: kernels "reference" (AUTO runs the oracle)   */
};

static atomic_int num_threads;                      /* 0: OpenMP's default */
static _Atomic double min_parallel_work = 262144.0; /* multiply-adds (~30 us) */

/* The most threads a call asks OpenMP for: 4 per processor, at least 64.
 * Results never depend on the count, and a count far beyond the machine
 * makes libgomp print and exit() when it cannot create the threads. */
static int max_threads(void) {
    const int procs = omp_get_num_procs();
    return procs > 16 ? (procs < INT_MAX / 4 ? 4 * procs : INT_MAX) : 64;
}

void mha_set_num_threads(int n) {
    const int cap = max_threads();
    atomic_store(&num_threads, n > 0 ? (n < cap ? n : cap) : 0);
}

int mha_get_num_threads(void) {
    int n = atomic_load(&num_threads);
    return n > 0 ? n : omp_get_max_threads();
}

void mha_decode_set_min_parallel_work(double madds) { atomic_store(&min_parallel_work, madds); }

void mha_decode_force_scalar(int force) { mha_kernels_force(force ? &mha_kernels_scalar : NULL); }

mha_status mha_exec_resolve(mha_exec *ex, const mha_context *ctx) {
    ex->trace = NULL;
    ex->min_parallel_work = atomic_load(&min_parallel_work);
    ex->n_threads = ctx && ctx->n_threads > 0 ? ctx->n_threads : mha_get_num_threads();
    if (ex->n_threads < 1) ex->n_threads = 1;
    int env_reference = 0;
    mha_status s = mha_isa_choose(&ex->isa, &env_reference);
    if (ctx && (ctx->isa || ctx->reference)) { /* the context's choice wins over the environment */
        ex->reference = ctx->reference;
        if (ctx->isa) ex->isa = ctx->isa;
        else if (s) s = mha_isa_by_name(&ex->isa, NULL);
        return MHA_OK;
    }
    ex->reference = env_reference;
    return s;
}

/* ------------------------------------------------------- mha_context */

mha_status mha_context_create(mha_context **out) {
    if (!out) return mha_fail(MHA_E_ARG, "mha_context_create: out is NULL");
    *out = calloc(1, sizeof **out);
    return *out ? MHA_OK : mha_fail(MHA_E_NOMEM, "mha_context_create: no memory");
}

void mha_context_free(mha_context *ctx) { free(ctx); }

mha_status mha_context_set_num_threads(mha_context *ctx, int n) {
    if (!ctx) return mha_fail(MHA_E_ARG, "mha_context_set_num_threads: context is NULL");
    if (n < 0 || n > max_threads())
        return mha_fail(MHA_E_ARG, "mha_context_set_num_threads: n=%d; expected 1..%d (4 per processor, at least "
                        "64) or 0 (default)", n, max_threads());
    ctx->n_threads = n;
    return MHA_OK;
}

mha_status mha_context_set_kernels(mha_context *ctx, const char *name) {
    if (!ctx) return mha_fail(MHA_E_ARG, "mha_context_set_kernels: context is NULL");
    const int reference = name && strcmp(name, "reference") == 0;
    const mha_isa *isa = NULL;
    if (name && !reference) {
        mha_status s = mha_isa_by_name(&isa, name);
        if (s) return s;
    }
    ctx->isa = isa, ctx->reference = reference;
    return MHA_OK;
}

const char *mha_context_kernels(const mha_context *ctx) {
    mha_exec ex;
    if (mha_exec_resolve(&ex, ctx)) return NULL;
    return ex.reference ? "reference" : ex.isa->name;
}
