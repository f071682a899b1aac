/* ab_switch.h — the decode entry point of the A/B harnesses (ab_decode.c,
 * ab_mqa.c): the library calls mha_decode_attend, which runs the "old"
 * build (decode.c and the AVX-512 and AVX2 decode tables of a git revision, renamed
 * by ab_decode.sh) or the "new" one (the working tree's) as ab_use_new
 * says. Included once per harness: it defines the switch. */
#ifndef MHA_AB_SWITCH_H
#define MHA_AB_SWITCH_H

#include "cache/cache_internal.h"
#include "compute/exec.h"

extern const mha_decode_kernels mha_decode_kernels_avx512_old, mha_decode_kernels_avx2_old;
mha_status mha_decode_attend_old(const mha_exec *, float *, float *, const mha_cache *, const float *, const int *,
                                 int, const int *, const mha_decode_opts *);
mha_status mha_decode_attend_new(const mha_exec *, float *, float *, const mha_cache *, const float *, const int *,
                                 int, const int *, const mha_decode_opts *);

static int ab_use_new; /* 0: old, 1: new */

/* The decode table's cache types: names as on the command line, K's and
 * V's storage. */
static const char *const ab_type_names[4] = {"fp32", "fp16", "int8", "int8/fp16"};
static const mha_cache_dtype ab_kts[4] = {MHA_CACHE_F32, MHA_CACHE_F16, MHA_CACHE_I8, MHA_CACHE_I8};
static const mha_cache_dtype ab_vts[4] = {MHA_CACHE_F32, MHA_CACHE_F16, MHA_CACHE_I8, MHA_CACHE_F16};

/* One case: its layer, a cache of random tokens, the weights, one query. */
typedef struct {
    mha_layer *layer;
    mha_cache *c;
    float *w[4], *q;
} ab_case;

/* The library's entry point: old or new, the old one with the old table. */
mha_status mha_decode_attend(const mha_exec *ex, float *z, float *stats, const mha_cache *c, const float *q,
                             const int *row0, int t0, const int *n, const mha_decode_opts *o) {
    if (ab_use_new) return mha_decode_attend_new(ex, z, stats, c, q, row0, t0, n, o);
    mha_isa isa = *ex->isa;
    mha_exec e = *ex;
    if (isa.decode == &mha_decode_kernels_avx512) isa.decode = &mha_decode_kernels_avx512_old;
    if (isa.decode == &mha_decode_kernels_avx2) isa.decode = &mha_decode_kernels_avx2_old;
    e.isa = &isa;
    return mha_decode_attend_old(&e, z, stats, c, q, row0, t0, n, o);
}

#endif /* MHA_AB_SWITCH_H */
