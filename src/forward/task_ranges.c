/* task_ranges.c — the runs of task_ranges.h, one lock each (a task is tens
 * of microseconds or more; a lock taken without contention is tens of
 * nanoseconds). */
#include <omp.h>
#include <stdlib.h>

#include "forward/task_ranges.h"

typedef struct {
    omp_lock_t lock;
    long first, end; /* tasks [first, end) not handed out yet */
    char pad[64];    /* runs on separate cache lines */
} run;

struct mha_task_ranges {
    int n_runs;
    run *runs; /* (n_runs) */
};

mha_task_ranges *mha_task_ranges_new(long n, int n_threads) {
    mha_task_ranges *q = malloc(sizeof *q);
    if (!q) return NULL;
    q->n_runs = n_threads > 0 ? n_threads : 1;
    q->runs = malloc(sizeof(run) * (size_t)q->n_runs);
    if (!q->runs) {
        free(q);
        return NULL;
    }
    const long each = n / q->n_runs, extra = n % q->n_runs; /* the first `extra` runs get one more */
    for (int i = 0; i < q->n_runs; i++) {
        omp_init_lock(&q->runs[i].lock);
        q->runs[i].first = i * each + (i < extra ? i : extra);
        q->runs[i].end = q->runs[i].first + each + (i < extra);
    }
    return q;
}

/* Tasks left in run r (taken under its lock). */
static long left(run *r) {
    omp_set_lock(&r->lock);
    const long n = r->end - r->first;
    omp_unset_lock(&r->lock);
    return n;
}

long mha_task_ranges_next(mha_task_ranges *q, int thread) {
    if (thread >= 0 && thread < q->n_runs) {
        run *own = &q->runs[thread];
        omp_set_lock(&own->lock);
        const long t = own->first < own->end ? own->first++ : -1;
        omp_unset_lock(&own->lock);
        if (t >= 0) return t;
    }
    for (;;) { /* the last task of the fullest run; again if it emptied meanwhile */
        int best = -1;
        long most = 0;
        for (int i = 0; i < q->n_runs; i++) {
            const long n = left(&q->runs[i]);
            if (n > most) most = n, best = i;
        }
        if (best < 0) return -1;
        run *r = &q->runs[best];
        omp_set_lock(&r->lock);
        const long t = r->first < r->end ? --r->end : -1;
        omp_unset_lock(&r->lock);
        if (t >= 0) return t;
    }
}

void mha_task_ranges_free(mha_task_ranges *q) {
    if (!q) return;
    for (int i = 0; i < q->n_runs; i++) omp_destroy_lock(&q->runs[i].lock);
    free(q->runs);
    free(q);
}
