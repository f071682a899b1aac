/* exec.h — how one call runs: the ISA (both kernel tables), the thread
 * count and the decode path's threading threshold, resolved once at the
 * public entry (threads.c) and passed down to every driver, so one call
 * never mixes two choices and nothing below reads process-wide state. */
#ifndef MHA_COMPUTE_EXEC_H
#define MHA_COMPUTE_EXEC_H

#include "base/internal.h"
#include "kernels/kernels.h"

/* Which tables a call handed out (tests ask; NULL when unused). */
typedef struct {
    const mha_kernels *prefill;
    const mha_decode_kernels *decode;
    const mha_backward_kernels *backward;
} mha_exec_trace;

typedef struct mha_exec {
    const mha_isa *isa;       /* the kernels of every path of this call      */
    int reference;            /* 1: MHA_KERNELS=reference (AUTO runs the oracle) */
    int n_threads;            /* >= 1                                         */
    double min_parallel_work; /* decode steps below this many multiply-adds
                                 run on one thread (a barrier costs more)     */
    mha_exec_trace *trace;    /* NULL, or where the tables used are recorded  */
} mha_exec;

/* Resolves ex for one call: ctx's choices where it has them (ctx may be
 * NULL), else the defaults (mha_set_num_threads, MHA_KERNELS, the CPU).
 * MHA_E_ARG for an unknown or unavailable MHA_KERNELS value. */
mha_status mha_exec_resolve(mha_exec *ex, const mha_context *ctx);

/* The tables of ex's ISA; the only way drivers obtain kernels. Call them
 * from the calling thread (outside parallel regions): they record in
 * ex->trace. */
static inline const mha_kernels *mha_exec_prefill(const mha_exec *ex) {
    if (ex->trace) ex->trace->prefill = ex->isa->prefill;
    return ex->isa->prefill;
}
static inline const mha_decode_kernels *mha_exec_decode(const mha_exec *ex) {
    if (ex->trace) ex->trace->decode = ex->isa->decode;
    return ex->isa->decode;
}

static inline const mha_backward_kernels *mha_exec_backward(const mha_exec *ex) {
    if (ex->trace) ex->trace->backward = ex->isa->backward;
    return ex->isa->backward;
}

/* Threads for work of `madds` multiply-adds on the decode path: 1 below
 * ex->min_parallel_work, else ex->n_threads. Depends on the work alone,
 * and the results never depend on it. */
static inline int mha_exec_threads_for(const mha_exec *ex, double madds) {
    return madds < ex->min_parallel_work ? 1 : ex->n_threads;
}

/* Test-only: the default decode threshold (multiply-adds; 262144 ~ 30 us
 * unless set). Atomic, but it changes what later calls do. */
void mha_decode_set_min_parallel_work(double madds);
/* Test-only: 1 forces the scalar ISA for every path (as
 * mha_kernels_force(&mha_kernels_scalar)), 0 restores the normal choice. */
void mha_decode_force_scalar(int force);

#endif /* MHA_COMPUTE_EXEC_H */
