/* bench_main.c — build/bench_mha: one subcommand per section, RESULT lines
 * on stdout (see bench.h). bench/run.sh calls it once per configuration and
 * bench/report.py turns the lines into bench/RESULTS.md.
 *
 *   bench_mha machine [--threads N] [--fma-iters N] [--stream-mib A,B,..]
 *   bench_mha prefill --name P1 --B 4 --T 512 [--S 2048 (cross-attention)]
 *                     --d 768 --h 12 [--causal] [--reps 7] [--budget 20]
 *                     [--mha-only | --gemm-only (mha_gemm paired with OpenBLAS
 *                     sgemm; --reps: rounds)]
 *                     [--dump DIR (weights, inputs, output as raw float32)]
 *                     [--bf16 (bf16 weights, options.bf16_matmul: the layer
 *                     alone, impl=mha_bf16)]
 *
 * OpenBLAS's thread pool starts when the binary loads and its idle threads
 * compete with libmha's OpenMP threads on 2 cores (a 5-step decode ran
 * 100x slower), so run.sh runs the mha parts with OPENBLAS_NUM_THREADS=1
 * and the GEMM comparison in processes of their own (--gemm-only: both
 * libraries' pools told to sleep between calls, see run.sh; one process
 * per OPENBLAS_CORETYPE).
 *   bench_mha backward --name P1 --B 4 --T 512 --d 768 --h 12 [--causal]
 *                     (bench_backward.c; prefill's options, self-attention)
 *   bench_mha variants --name P2 --B 1 --T 4096 --d 768 --h 12 --causal
 *                     (bench_variants.c: RoPE, ALiBi, softcap, sinks vs
 *                     plain, interleaved; prefill's options, self-attention)
 *   bench_mha variants-backward --name P2 ... (the same for mha_backward,
 *                     QK-norm too)
 *   bench_mha decode  --d 2048 --h 32 --h-kv 8 --d-head 64 --L 4096
 *                     [--fp16 | --int8] [--v-fp16] [--steps 20] [--cold-rounds 9]
 */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"

static void usage(void) {
    fprintf(stderr,
            "usage: bench_mha machine|prefill|backward|variants|variants-backward|decode [options]\n"
            "  common:  --threads N (default 2)\n"
            "  machine: --fma-iters N --stream-mib 64,256,1024\n"
            "  prefill: --name NAME --B --T [--S] --d --h [--causal] [--reps] [--budget]\n"
            "           [--mha-only | --gemm-only] [--dump DIR] [--bf16]\n"
            "  decode:  --d --h --h-kv --d-head --L [--B] [--fp16|--int8] [--v-fp16] [--weights f32|bf16|int8] [--steps] [--cold-rounds]\n");
    exit(2);
}

/* Value of option argv[*i] (advancing *i), or usage() when missing. */
static const char *opt_value(int argc, char **argv, int *i) {
    if (*i + 1 >= argc) usage();
    return argv[++*i];
}

static int opt_int(int argc, char **argv, int *i) {
    const char *s = opt_value(argc, argv, i);
    char *end;
    long v = strtol(s, &end, 10);
    if (*end || v < 0 || v > 1000000000L) {
        fprintf(stderr, "bench_mha: %s expects a non-negative integer, got '%s'\n", argv[*i - 1], s);
        exit(2);
    }
    return (int)v;
}

static int cmd_machine(int argc, char **argv, int threads) {
    long iters = 20000000;
    const char *mibs = "64,256,1024";
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "--threads")) threads = opt_int(argc, argv, &i);
        else if (!strcmp(argv[i], "--fma-iters")) iters = opt_int(argc, argv, &i);
        else if (!strcmp(argv[i], "--stream-mib")) mibs = opt_value(argc, argv, &i);
        else usage();
    }
    double med;
    double best = bench_fma_peak_avx2(threads, iters, 7, &med);
    printf("RESULT kind=machine key=fma_avx2 threads=%d best_gflops=%.2f median_gflops=%.2f\n",
           threads, best, med);
    fflush(stdout);
    double first, steady;
    bench_fma_after_evict(threads, 7, &first, &steady);
    printf("RESULT kind=machine key=fma_after_evict threads=%d evict_mib=%ld first_gflops=%.2f steady_gflops=%.2f\n",
           threads, bench_evict_mib(), first, steady);
    fflush(stdout);
    best = bench_fma_peak_avx512(threads, iters, 7, &med);
    if (best > 0)
        printf("RESULT kind=machine key=fma_avx512 threads=%d best_gflops=%.2f median_gflops=%.2f\n",
               threads, best, med);
    fflush(stdout);
    best = bench_amx_peak_bf16(threads, iters / 32, 7, &med); /* one iteration: 64x the FMA loop's flops */
    if (best > 0)
        printf("RESULT kind=machine key=amx_bf16 threads=%d best_gflops=%.2f median_gflops=%.2f\n",
               threads, best, med);
    fflush(stdout);
    char buf[256];
    snprintf(buf, sizeof buf, "%s", mibs);
    for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
        long mib = strtol(tok, NULL, 10);
        if (mib <= 0) continue;
        double bw_best;
        double bw = bench_stream_read(threads, (size_t)mib << 20, 7, &bw_best);
        printf("RESULT kind=machine key=stream_read threads=%d mib=%ld median_gbs=%.2f best_gbs=%.2f\n",
               threads, mib, bw, bw_best);
        fflush(stdout);
    }
    return 0;
}

static int cmd_prefill(int argc, char **argv, int threads) {
    bench_prefill_cfg c = {"custom", 1, 0, 0, 0, 0, 0, 0, 7, 20.0, threads, 1, 1, NULL, 0};
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "--threads")) c.threads = opt_int(argc, argv, &i);
        else if (!strcmp(argv[i], "--name")) c.name = opt_value(argc, argv, &i);
        else if (!strcmp(argv[i], "--B")) c.B = opt_int(argc, argv, &i);
        else if (!strcmp(argv[i], "--T")) c.T = opt_int(argc, argv, &i);
        else if (!strcmp(argv[i], "--S")) c.S = opt_int(argc, argv, &i), c.cross = 1;
        else if (!strcmp(argv[i], "--d")) c.d_model = opt_int(argc, argv, &i);
        else if (!strcmp(argv[i], "--h")) c.h = opt_int(argc, argv, &i);
        else if (!strcmp(argv[i], "--causal")) c.causal = 1;
        else if (!strcmp(argv[i], "--reps")) c.reps = opt_int(argc, argv, &i);
        else if (!strcmp(argv[i], "--budget")) c.budget = opt_int(argc, argv, &i);
        else if (!strcmp(argv[i], "--gemm-only")) c.mha = 0;
        else if (!strcmp(argv[i], "--mha-only")) c.blas = 0;
        else if (!strcmp(argv[i], "--dump")) c.dump = opt_value(argc, argv, &i);
        else if (!strcmp(argv[i], "--bf16")) c.bf16 = 1, c.blas = 0;
        else usage();
    }
    if (c.B < 1 || c.T < 1 || c.d_model < 1 || c.h < 1 || (c.cross && c.S < 1)) usage();
    if (c.reps < 1) c.reps = 1;
    if (c.reps > 256) c.reps = 256;
    if (c.blas) {
        openblas_set_num_threads(c.threads);
        if (!getenv("OPENBLAS_CORETYPE"))
            printf("RESULT kind=machine key=openblas corename=%s threads=%d config=\"%s\"\n",
                   openblas_get_corename(), openblas_get_num_threads(), openblas_get_config());
    }
    if (!strcmp(argv[1], "backward")) return c.cross ? (usage(), 2) : bench_backward(&c);
    if (!strcmp(argv[1], "variants")) return c.cross ? (usage(), 2) : bench_variants(&c);
    if (!strcmp(argv[1], "variants-backward")) return c.cross ? (usage(), 2) : bench_variants_backward(&c);
    return bench_prefill(&c);
}

static int cmd_decode(int argc, char **argv, int threads) {
    bench_decode_cfg c = {2048, 32, 32, 64, 1024, 1, 0, 20, threads, 0, 0, 0, 9};
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "--threads")) c.threads = opt_int(argc, argv, &i);
        else if (!strcmp(argv[i], "--d")) c.d_model = opt_int(argc, argv, &i);
        else if (!strcmp(argv[i], "--h")) c.h = opt_int(argc, argv, &i);
        else if (!strcmp(argv[i], "--h-kv")) c.h_kv = opt_int(argc, argv, &i);
        else if (!strcmp(argv[i], "--d-head")) c.d_head = opt_int(argc, argv, &i);
        else if (!strcmp(argv[i], "--L")) c.L = opt_int(argc, argv, &i);
        else if (!strcmp(argv[i], "--B")) c.B = opt_int(argc, argv, &i);
        else if (!strcmp(argv[i], "--fp16")) c.fp16 = 1;
        else if (!strcmp(argv[i], "--int8")) c.int8 = 1;
        else if (!strcmp(argv[i], "--v-fp16")) c.v_fp16 = 1;
        else if (!strcmp(argv[i], "--weights")) {
            mha_weight_dtype wd;
            if (mha_weight_dtype_parse(&wd, opt_value(argc, argv, &i))) usage();
            c.weights = (int)wd;
        }
        else if (!strcmp(argv[i], "--steps")) c.steps = opt_int(argc, argv, &i);
        else if (!strcmp(argv[i], "--cold-rounds")) c.cold_rounds = opt_int(argc, argv, &i);
        else usage();
    }
    if (c.h < 1 || c.h_kv < 1 || c.h % c.h_kv || c.L < 1 || c.B < 1) usage();
    return bench_decode(&c);
}

int main(int argc, char **argv) {
    int threads = 2;
    const char *env = getenv("OMP_NUM_THREADS");
    if (env && atoi(env) > 0) threads = atoi(env);
    if (argc < 2) usage();
    if (!strcmp(argv[1], "machine")) return cmd_machine(argc, argv, threads);
    if (!strcmp(argv[1], "prefill") || !strcmp(argv[1], "backward") || !strcmp(argv[1], "variants") ||
        !strcmp(argv[1], "variants-backward"))
        return cmd_prefill(argc, argv, threads);
    if (!strcmp(argv[1], "decode")) return cmd_decode(argc, argv, threads);
    usage();
    return 2;
}
