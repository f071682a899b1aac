/* prefetch_stream.h — the spread prefetch of the decode kernels (the
 * prefetch_stream entry of decode_kernels.h), for the ISA files that
 * include it (avx512_decode.c, avx2_decode.c), each with its own stream.
 * The lines this thread's kernels request as they run, a few per step of
 * their inner loops: a cold chunk's next chunk arrives while this one
 * computes, where the same requests in bursts between kernels filled the
 * core's miss buffers and stalled it for the burst (AMD Zen 5, one
 * thread, cold, round 8: time = read + compute). A kernel copies the
 * stream into a local at entry and back at exit (one thread-local access
 * per call, none per step). Only moves bytes between cache levels. */
#ifndef MHA_KERNELS_PREFETCH_STREAM_H
#define MHA_KERNELS_PREFETCH_STREAM_H

typedef struct {
    const char *cur, *end;
    int per, to_l2;
} pf_stream;

static _Thread_local pf_stream pf_tls;

/* The table's prefetch_stream: starts [p, end), per lines a step; returns
 * where the previous stream stopped. */
static inline const char *pf_stream_start(const char *p, const char *end, int per, int to_l2) {
    const char *was = pf_tls.cur;
    pf_tls.cur = p, pf_tls.end = end, pf_tls.per = per, pf_tls.to_l2 = to_l2;
    return was;
}

/* Up to ps->per lines of the stream, into L1 (t0) or L2 (t1, l2 a
 * constant in each inlined copy). */
static inline __attribute__((always_inline)) void pf_lines(pf_stream *ps, const int l2) {
    for (int i = 0; i < ps->per && ps->cur < ps->end; i++, ps->cur += 64)
        if (l2) __asm__ volatile("prefetcht1 %0" : : "m"(*ps->cur));
        else __asm__ volatile("prefetcht0 %0" : : "m"(*ps->cur));
}

/* One step of the stream (the branch is the same for a whole call); none
 * where ps is NULL, a constant in the copy of a kernel that runs without
 * a stream (PF_STREAMED): no instruction at all. */
static inline __attribute__((always_inline)) void pf_step(pf_stream *ps) {
    if (!ps) return;
    if (ps->to_l2) pf_lines(ps, 1);
    else pf_lines(ps, 0);
}

/* Runs `call`, which names pf, with pf the thread's stream where it has
 * lines left, else with pf NULL: the kernel is compiled twice, and the
 * copy without a stream pays nothing for it (on a Zen 3 the steps'
 * checks alone made the compute-bound AVX2 int8 kernels 10-20% slower). */
#define PF_STREAMED(call)                                                                                        \
    do {                                                                                                       \
        if (pf_tls.cur < pf_tls.end) {                                                                         \
            pf_stream pf_copy = pf_tls, *const pf = &pf_copy;                                                  \
            call;                                                                                              \
            pf_tls.cur = pf_copy.cur;                                                                          \
        } else {                                                                                               \
            pf_stream *const pf = NULL;                                                                        \
            call;                                                                                              \
        }                                                                                                      \
    } while (0)

#endif
