/* threads.c — the thread count of the fast path: the setter's value, or
 * OpenMP's default (OMP_NUM_THREADS) when 0. */
#include <omp.h>

#include "internal.h"

static int num_threads; /* 0: OpenMP's default */

void mha_set_num_threads(int n) { num_threads = n > 0 ? n : 0; }

int mha_get_num_threads(void) { return num_threads > 0 ? num_threads : omp_get_max_threads(); }
