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

/* A checksum of what the ranks of one call must share besides its shapes:
 * the layer's configuration c (every field; a shard's under the head
 * split, whose ranks hold as many heads each), its weights' storage dt,
 * and the options o (NULL: the defaults; scalars, which masks and arrays
 * are given, the ops of the h interventions). Ranks that differed there
 * gave wrong sums silently, or called MPI with counts that do not match
 * (an abort) or another sequence of collectives (a hang). */
long long mha_mpi_call_checksum(const mha_config *c, mha_weight_dtype dt, const mha_options *o, int h);
#define MHA_MPI_CALL_CHECKSUM_NAME                                                                          \
    "checksum of the layer's configuration and the call's options (variants, scale, masks given, "         \
    "interventions, weight storage)"

/* A message into msg (cap bytes, named by who) when hd is not what the
 * head split gave rank for the shard local (its head counts; heads
 * [rank count, (rank + 1) count)); msg untouched otherwise. The gathers
 * and the interventions' offset read hd: another layer (the whole one)
 * or other heads overran buffers or summed wrong heads, silently. */
void mha_mpi_shard_mismatch(char *msg, size_t cap, const char *who, const mha_layer *local,
                            const mha_mpi_heads *hd, int rank);

/* The h interventions of the whole layer (global head indices) as
 * mha_forward checks them: op in range, SCALE finite, REPLACE's value
 * given and finite over rows x d_v; the same wording, into msg (cap
 * bytes). The ring applied them only after its work (a NULL REPLACE value
 * crashed it, a NaN one ran), and a shard named its local index. */
mha_status mha_mpi_check_interventions(char *msg, size_t cap, const mha_intervention *ivs, int h, size_t rows,
                                       int d_v);

/* A checksum of n bytes at p (-1 for NULL): the inputs every rank of the
 * head split must pass alike (each computes its heads from the whole x;
 * ranks given other x summed partials of different inputs, silently). */
long long mha_mpi_bytes_checksum(const void *p, size_t n);

/* Test hook: nonzero when MHA_MPI_FAIL_ALLOC names this rank, so that the
 * fault tests can make one rank's allocation fail. */
int mha_mpi_alloc_fault(MPI_Comm comm);

#endif
