/* agree.c — how the ranks fail together: the error message of libmha_mpi,
 * one collective status agreement, and the check that every rank was
 * given the same shapes and weights. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "mpi_internal.h"

static char last_error[1024];

const char *mha_mpi_last_error(void) { return last_error; }

mha_status mha_mpi_fail(mha_status s, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return s;
}

mha_status mha_mpi_agree(MPI_Comm comm, mha_status local, const char *msg) {
    int rank, P;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &P);
    /* the lowest failing rank speaks for all */
    int mine = local ? rank : P, first;
    MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, comm);
    if (first == P) return MHA_OK;
    struct {
        int status;
        char text[sizeof last_error - 16];
    } m;
    memset(&m, 0, sizeof m);
    if (rank == first) {
        m.status = (int)local;
        snprintf(m.text, sizeof m.text, "%s", msg ? msg : mha_last_error()[0] ? mha_last_error() : mha_status_str(local));
    }
    MPI_Bcast(&m, (int)sizeof m, MPI_BYTE, first, comm);
    snprintf(last_error, sizeof last_error, "rank %d: %s", first, m.text);
    return (mha_status)m.status;
}

mha_status mha_mpi_check_same(MPI_Comm comm, const long long *v, int n, const char *const *names) {
    int rank, P;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &P);
    const int bad = n < 0 || n > MHA_MPI_MAX_SAME || (n > 0 && (!v || !names));
    char msg[256] = "";
    if (bad)
        snprintf(msg, sizeof msg, "mha_mpi_check_same: n = %d entries (v %s, names %s); expected 0..%d and both given",
                 n, v ? "given" : "NULL", names ? "given" : "NULL", MHA_MPI_MAX_SAME);
    mha_status s = mha_mpi_agree(comm, bad ? MHA_E_ARG : MHA_OK, msg);
    if (s) return s;
    /* every rank must pass the same n, or the broadcast below would not match */
    int lo[2] = {n, -n}, got[2];
    MPI_Allreduce(lo, got, 2, MPI_INT, MPI_MIN, comm);
    if (got[0] != -got[1])
        snprintf(msg, sizeof msg, "mha_mpi_check_same: n = %d here, but the ranks pass %d to %d; expected the same n on every rank",
                 n, got[0], -got[1]);
    if ((s = mha_mpi_agree(comm, *msg ? MHA_E_ARG : MHA_OK, msg))) return s;
    long long ref[MHA_MPI_MAX_SAME];
    if (n) memcpy(ref, v, sizeof(long long) * (size_t)n);
    MPI_Bcast(ref, n, MPI_LONG_LONG, 0, comm);
    for (int i = 0; i < n && !s; i++)
        if (v[i] != ref[i]) {
            snprintf(msg, sizeof msg, "%s = %lld here but %lld on rank 0; expected every rank to be given the same checkpoint, inputs and flags",
                     names[i], v[i], ref[i]);
            s = MHA_E_SHAPE;
        }
    return mha_mpi_agree(comm, s, msg);
}
