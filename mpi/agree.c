/* agree.c — how the ranks fail together: the error message of libmha_mpi,
 * one collective status agreement, and the check that every rank was
 * given the same shapes and weights. */
#include <math.h>
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
                     names[i] ? names[i] : "a value", v[i], ref[i]);
            s = MHA_E_SHAPE;
        }
    return mha_mpi_agree(comm, s, msg);
}

/* FNV-1a over n bytes */
static unsigned long long fnv(unsigned long long hsh, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) hsh = (hsh ^ b[i]) * 1099511628211ull;
    return hsh;
}

long long mha_mpi_call_checksum(const mha_config *c, mha_weight_dtype dt, const mha_options *o, int h) {
    const mha_options none = mha_options_default();
    if (!o) o = &none;
    const mha_rope *r = &c->rope;
    /* every field by value (a struct's padding bytes are not its value) */
    const double d[] = {r->theta, r->factor, r->low_freq_factor, r->high_freq_factor, r->beta_fast, r->beta_slow,
                        r->attn_factor, c->softcap, c->qk_norm_eps, c->clip_qkv, c->temperature_scale, o->scale,
                        o->dropout_p};
    const long long n[] = {c->d_model, c->n_heads, c->n_kv_heads, c->d_k, c->d_v, c->d_kv_in, c->d_v_in, c->bias,
                           c->add_bias_kv, c->add_zero_attn, r->pairing, r->dim, r->scaling,
                           r->original_max_positions, c->alibi, c->sinks, c->qk_norm, c->qk_norm_per_head,
                           c->qk_norm_whole, c->temperature_floor, c->temperature_rule, c->output_gate,
                           dt, o->causal, o->align, o->window_left, o->window_right,
                           o->keep_mask.data != NULL, o->keep_mask.batch, o->keep_mask.heads,
                           o->additive_mask.data != NULL, o->additive_mask.batch, o->additive_mask.heads,
                           o->key_keep != NULL, o->key_additive != NULL, o->masked_row, o->interventions != NULL,
                           o->positions != NULL, o->key_positions != NULL, o->sink_tokens, o->bf16_matmul,
                           o->chunk_size, o->cu_seqlens != NULL, o->n_seqs, (long long)o->dropout_seed};
    unsigned long long hsh = fnv(1469598103934665603ull, d, sizeof d);
    hsh = fnv(hsh, n, sizeof n);
    hsh = fnv(hsh, r->short_factor, sizeof r->short_factor), hsh = fnv(hsh, r->long_factor, sizeof r->long_factor);
    for (int i = 0; o->interventions && i < h; i++) { /* each head's op (and scale); REPLACE's values are not read */
        const long long op = o->interventions[i].op;
        const double sc = o->interventions[i].op == MHA_HEAD_SCALE ? o->interventions[i].scale : 0.0;
        hsh = fnv(hsh, &op, sizeof op), hsh = fnv(hsh, &sc, sizeof sc);
    }
    return (long long)(hsh >> 1);
}

mha_status mha_mpi_check_interventions(char *msg, size_t cap, const mha_intervention *ivs, int h, size_t rows,
                                       int d_v) {
    for (int r = 0; ivs && r < h; r++) {
        const mha_intervention *iv = &ivs[r];
        if ((int)iv->op < MHA_HEAD_KEEP || (int)iv->op > MHA_HEAD_REPLACE)
            return snprintf(msg, cap, "interventions[%d].op=%d; expected MHA_HEAD_KEEP..MHA_HEAD_REPLACE", r,
                            (int)iv->op), MHA_E_ARG;
        if (iv->op == MHA_HEAD_SCALE && !isfinite(iv->scale))
            return snprintf(msg, cap, "interventions[%d].scale=%g; expected finite", r, (double)iv->scale),
                   MHA_E_NONFINITE;
        if (iv->op == MHA_HEAD_REPLACE && !iv->value)
            return snprintf(msg, cap, "interventions[%d]: REPLACE needs value (B,T,d_v); got NULL", r), MHA_E_ARG;
        for (size_t i = 0; iv->op == MHA_HEAD_REPLACE && i < rows * (size_t)d_v; i++)
            if (!isfinite(iv->value[i]))
                return snprintf(msg, cap, "interventions[%d].value[%zu] = %g; expected a finite number", r, i,
                                (double)iv->value[i]), MHA_E_NONFINITE;
    }
    return MHA_OK;
}

long long mha_mpi_bytes_checksum(const void *p, size_t n) {
    unsigned long long hsh = 1469598103934665603ull;
    const unsigned char *b = p;
    size_t i = 0;
    for (; p && i + 8 <= n; i += 8) { /* a word at a time: inputs can be large */
        unsigned long long w;
        memcpy(&w, b + i, 8);
        hsh = (hsh ^ w) * 1099511628211ull;
    }
    if (p) hsh = fnv(hsh, b + i, n - i);
    return p ? (long long)(hsh >> 1) : -1;
}
