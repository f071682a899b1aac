/* task_ranges.h — hands out tasks 0..n-1 to the threads of a parallel
 * region so that each thread runs a contiguous run of them: thread i owns
 * the i-th of n_threads consecutive runs and takes it from the front; a
 * thread whose run is empty takes the last task of the run with the most
 * tasks left (so a thread that loses its core for a while is relieved,
 * as under a dynamic schedule). Which thread runs a task decides nothing
 * the task computes. Runs differ by at most one task in length. */
#ifndef MHA_TASK_RANGES_H
#define MHA_TASK_RANGES_H

typedef struct mha_task_ranges mha_task_ranges;

/* n >= 0 tasks for n_threads >= 1 runs; NULL when out of memory. */
mha_task_ranges *mha_task_ranges_new(long n, int n_threads);

/* The next task for thread `thread` (its own run first, then the others'
 * last tasks), or -1 when every task has been handed out. Safe to call
 * from all threads at once; a thread id >= n_threads only takes others'. */
long mha_task_ranges_next(mha_task_ranges *q, int thread);

void mha_task_ranges_free(mha_task_ranges *q);

#endif /* MHA_TASK_RANGES_H */
