/* bench.h — shared pieces of the benchmark binary build/bench_mha.
 * Legend: B batch, T query tokens, S key tokens, h heads, h_kv kv heads,
 * d_k, d_v per-head widths, d_model model width.
 *
 * Every measurement is printed as one machine-readable line
 *   RESULT kind=<kind> impl=<impl> key=value ...
 * that bench/report.py collects (together with bench/peer_torch.py's lines)
 * into the tables of bench/RESULTS.md. */
#ifndef MHA_BENCH_H
#define MHA_BENCH_H

#include <stddef.h>
#include <stdint.h>

#include "mha.h"

/* ------------------------------------------------------------ timing */

double bench_now(void);                 /* monotonic seconds */
double bench_cpu_now(void);             /* CPU seconds of the process, all threads */
double bench_median(double *v, int n);  /* sorts v in place */
double bench_min(const double *v, int n);
/* Prints " median_s=.. min_s=.. runs=N times_s=t1,t2,.." (all runs, so
 * report.py can merge the rounds of one configuration). */
void bench_print_times(const double *t, int n);
/* The same with every key prefixed ("step_median_s=..."). */
void bench_print_times_as(const char *prefix, const double *t, int n);

/* Repeats fn(arg) and fills times[] (at most max_runs): one untimed warm-up
 * unless the warm-up alone took longer than budget_s / 4 (then it counts as
 * a measurement: a slow path is not made slower to measure), then timed
 * runs until max_runs or the budget (seconds) is spent, at least one.
 * Returns the number of timed runs, or -1 when fn failed (nonzero). */
int bench_repeat(int (*fn)(void *), void *arg, double *times, int max_runs, double budget_s);

/* bench_repeat for k functions interleaved: rounds of one run of each
 * (A B A B ..., so that the machine's load changes hit all alike) after
 * one warm-up each (counted as round 0 when the warm-ups took longer than
 * budget_s / 4), until max_runs rounds or budget_s. times[i*max_runs + r]
 * is fn[i]'s run in round r. Returns the rounds, or -1 when one failed. */
int bench_rounds(int (*const *fn)(void *), void *const *arg, int k, double *times, int max_runs,
                 double budget_s);

/* Deterministic uniform [lo, hi) fill (splitmix64). */
void bench_fill(float *p, size_t n, uint64_t *seed, float lo, float hi);
/* 64-byte aligned allocation of n floats (aborts the program on failure:
 * the bench binary is a tool, not the library). */
float *bench_alloc(size_t n);

/* ------------------------------------ machine ceilings (machine_*.c) */

/* AVX2 FMA throughput (GFLOP/s) of `threads` threads, each running
 * independent FMA chains for `iters` iterations; best of `reps`. */
double bench_fma_peak_avx2(int threads, long iters, int reps, double *median_out);
/* Same with AVX-512 (informational: libmha's kernels are AVX2); returns 0
 * when the CPU lacks AVX-512F. */
double bench_fma_peak_avx512(int threads, long iters, int reps, double *median_out);
/* The AVX-512 loop timed by CPU time (the A/B harnesses of bench/ab/):
 * GFLOP/s per CPU-second of each of `threads` threads, times threads, so
 * that time other processes take from the cores does not count. */
double bench_fma_peak_avx512_cpu(int threads);
/* machine_amx.c: GFLOP/s of TDPBF16PS (AMX-BF16) on that many threads;
 * 0 where the CPU or the OS has no AMX. */
double bench_amx_peak_bf16(int threads, long iters, int reps, double *median_out);
/* The timing loop both share (bench_util.c, built without ISA flags, so the
 * chains come as a pointer from the file built with them): GFLOP/s of
 * `threads` threads each running chains(iters), flops_per_iter flops per
 * iteration per thread; best of `reps` (at most 64), median in *median_out. */
double bench_fma_rate(float (*chains)(long iters), double flops_per_iter, int threads, long iters,
                      int reps, double *median_out);
/* Streaming read bandwidth (GB/s, 1e9 bytes) of `threads` threads reading
 * a buffer of `bytes`; median of `reps` passes (best in *best_out). */
double bench_stream_read(int threads, size_t bytes, int reps, double *best_out);
/* Cold reads (decode's roofline): a buffer of `bytes` filled by `threads`
 * threads (n floats in *n_out; free() it; huge pages where the kernel
 * allows, as the library's large blocks), the seconds one pass of
 * `threads` threads takes to read its n floats, and an eviction of the
 * last-level cache: one pass over a buffer of BENCH_EVICT_MIB MiB (default
 * 1024, over 3x this host's 300 MiB L3), made on first use. */
float *bench_read_buffer(size_t bytes, int threads, size_t *n_out);
double bench_read_pass(const float *buf, size_t n, int threads);
void bench_evict(int threads);
/* The AVX2 FMA rate (GFLOP/s, `threads` threads) of a ~0.1 ms burst right
 * after bench_evict and of one ~3 ms later, medians of `reps` rounds. */
void bench_fma_after_evict(int threads, int reps, double *first_out, double *steady_out);
long bench_evict_mib(void); /* the eviction buffer's size in MiB */

/* ------------------------------------------------- sections (bench_*.c) */

typedef struct {
    const char *name;
    int B, T, S, d_model, h, causal, cross;
    int reps;       /* most timed runs per measurement */
    double budget;  /* seconds per measurement */
    int threads;
    int blas;       /* 1: mha_gemm paired with OpenBLAS sgemm (bench_gemm.c)  */
    int mha;        /* 1: time mha_forward and the fast path's parts         */
    const char *dump; /* non-NULL: write weights, inputs and mha_forward's
                         output there as raw float32 (for the ORT peer)  */
    int bf16;         /* 1: bf16 weights and options.bf16_matmul (AMX where
                         the CPU has it), mha_forward alone: impl=mha_bf16 */
} bench_prefill_cfg;

int bench_prefill(const bench_prefill_cfg *c);

/* bench_internal.c: the fast path's projection GEMMs and attention kernel
 * timed apart through src/compute/gemm.h and src/forward/attention.h. w holds the layer's
 * weights, x (B,T,d_model), kv (B,S,d_model) or NULL. */
int bench_fast_parts(const bench_prefill_cfg *c, const mha_weights *w, const float *x,
                     const float *kv);

/* bench_gemm.c: the same projection GEMMs, mha_gemm and OpenBLAS's
 * cblas_sgemm (row-major, the weights side by side) paired in this process,
 * round by round with the FMA peak (RESULT kind=gemm_pair). */
int bench_gemm_paired(const bench_prefill_cfg *c, const mha_weights *w, const float *x,
                      const float *kv);

/* bench_backward.c: mha_backward, forward + backward, and the fast
 * backward's attention passes, self-attention with c's shape. */
int bench_backward(const bench_prefill_cfg *c);

/* bench_variants.c: mha_forward with each attention variant (RoPE, ALiBi,
 * softcap, sinks) against the plain layer, interleaved, c's shape. */
int bench_variants(const bench_prefill_cfg *c);

/* The same for mha_backward (every gradient the layer has), with RMS
 * QK-norm as a sixth variant (RESULT kind=variant_backward). */
int bench_variants_backward(const bench_prefill_cfg *c);

typedef struct {
    int d_model, h, h_kv, d_head, L, B;
    int fp16;       /* cache storage: 0 fp32, 1 fp16 */
    int steps;      /* timed decode steps */
    int threads;
    int int8;       /* 1: int8 cache (overrides fp16) */
    int v_fp16;     /* 1: V stored as fp16 whatever K's type (mixed cache) */
    int weights;    /* W_Q..W_O storage, mha_weight_dtype: 0 fp32, 1 bf16, 2 int8 */
    int cold_rounds; /* cold calls of the step and of attention (0: 9) */
} bench_decode_cfg;

int bench_decode(const bench_decode_cfg *c);

#endif /* MHA_BENCH_H */
