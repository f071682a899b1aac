/* decode.c — KV-cache prefill and decode, head-parallel: each rank keeps
 * the cache of its own kv heads (mha_cache_create on its shard), runs
 * mha_forward_cached on its heads, and one MPI_Allreduce(SUM) of the
 * partial Y per call gives every rank Y; b_O is added once, after it.
 * Legend: B, T new tokens per call, h, hl = h/P heads per rank, D = d_model. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>

#include "mpi_internal.h"

mha_status mha_mpi_forward_cached_heads(const mha_layer *local, mha_cache *cache, const mha_mpi_heads *hd,
                                        const float *b_o, float *y, const float *x, int B, int T,
                                        const mha_options *opt, MPI_Comm comm, mha_mpi_stats *stats) {
    int rank, P;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &P);
    double t0 = MPI_Wtime();
    const int bad = !local || !cache || !hd || !x || !y;
    mha_status s = mha_mpi_agree(comm, bad ? MHA_E_ARG : MHA_OK,
                                 "mha_mpi_forward_cached_heads: NULL argument; expected local, cache, heads, x and y");
    if (s) return s;
    const mha_config *c = mha_layer_config(local);
    const int D = c->d_model;
    char why[400] = "";
    mha_mpi_shard_mismatch(why, sizeof why, "mha_mpi_forward_cached_heads", local, hd, rank);
    s = *why ? MHA_E_ARG : MHA_OK;
    if (!s && (B < 1 || T < 1)) /* the cache's own batch is checked by mha_forward_cached */
        s = MHA_E_SHAPE, snprintf(why, sizeof why, "mha_mpi_forward_cached_heads: B=%d T=%d; expected both >= 1", B, T);
    else if (!s && (double)B * T * D > INT_MAX)
        s = MHA_E_SHAPE, snprintf(why, sizeof why, "mha_mpi_forward_cached_heads: B=%d T=%d give %.0f floats of y in one "
                                  "message; expected at most %d (MPI's int count)", B, T, (double)B * T * D, INT_MAX);
    if (!s && opt) /* by global head: a shard named its own index */
        s = mha_mpi_check_interventions(why, sizeof why, opt->interventions, hd->count * P, (size_t)B * T, c->d_v);
    if ((s = mha_mpi_agree(comm, s, why))) return s;
    const long long same[] = {B, T, D, hd->count, mha_cache_length(cache, 0),
                              mha_mpi_call_checksum(c, mha_layer_weights_dtype(local), opt, hd->count * P),
                              mha_mpi_bytes_checksum(x, sizeof(float) * B * T * D)};
    const char *names[] = {"B", "T (new tokens)", "d_model", "heads per rank", "cached tokens",
                           MHA_MPI_CALL_CHECKSUM_NAME, "checksum of x"};
    if ((s = mha_mpi_check_same(comm, same, 7, names))) return s;
    mha_options o = opt ? *opt : mha_options_default();
    if (o.interventions) o.interventions += hd->first; /* this rank's heads */
    const size_t rows = (size_t)B * T;
    float *yl = mha_mpi_alloc_fault(comm) ? NULL : malloc(sizeof(float) * rows * D); // (B,T,D) partial
    char msg[512] = "";
    if (!yl) {
        s = MHA_E_NOMEM, snprintf(msg, sizeof msg, "no memory for this rank's partial Y (B=%d T=%d d_model=%d)", B, T, D);
    } else {
        double tc = MPI_Wtime();
        s = mha_forward_cached(local, cache, yl, NULL, x, T, NULL, &o);
        if (stats) stats->compute_s = MPI_Wtime() - tc;
        if (s) snprintf(msg, sizeof msg, "%s", mha_last_error());
    }
    if (!(s = mha_mpi_agree(comm, s, msg))) {
        mha_mpi_sum_partials(y, yl, rows, D, b_o, comm); /* Y = sum_r Y_r + b_O */
        if (stats) stats->sent_bytes = stats->formula_bytes = P > 1 ? (double)rows * D * sizeof(float) : 0.0;
        if (stats) stats->cache_bytes = (double)mha_cache_bytes(cache);
    }
    free(yl);
    if (stats) stats->total_s = MPI_Wtime() - t0;
    return s;
}
