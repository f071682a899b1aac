/* mpi_internal.h — helpers shared by the files of libmha_mpi. */
#ifndef MHA_MPI_INTERNAL_H
#define MHA_MPI_INTERNAL_H

#include "mha_mpi.h"

/* Most entries mha_mpi_check_same compares. */
#define MHA_MPI_MAX_SAME 32

/* Records a printf-style message for mha_mpi_last_error() and returns s. */
mha_status mha_mpi_fail(mha_status s, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* y (rows, D) on every rank = the sum of every rank's partial yl
 * (rows, D) (one MPI_Allreduce), plus b_o (D) once when not NULL:
 * Megatron's row-parallel W_O with its bias after the sum. */
void mha_mpi_sum_partials(float *y, const float *yl, size_t rows, int D, const float *b_o, MPI_Comm comm);

/* Test hook: nonzero when MHA_MPI_FAIL_ALLOC names this rank, so that the
 * fault tests can make one rank's allocation fail. */
int mha_mpi_alloc_fault(MPI_Comm comm);

#endif
