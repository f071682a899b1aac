/* ab_mqa.c — interleaved A/B of two builds of the decode attention on the
 * MQA cases alone, against their roofline (issue 11/15 measurement tool,
 * built by bench/ab/ab_mqa.sh on top of ab_decode.sh's objects, not by
 * make): "old" is src/cache/decode.c and the AVX-512 decode table of a git
 * revision, "new" the working tree's, linked into one process.
 *
 * Cases: d_model 2048, h 32, h_kv 1, d_head 64, B 1, one query per head
 * (mha_cache_attend), a cache of L tokens of random K/V in [-1, 1). For
 * each (cache type, L, threads, hot|cold) old and new run in turn, ABAB...,
 * best and median of REPS each. "cold": before every call a 1 GiB buffer
 * is read, so the cache's bytes come from memory, not from the LLC.
 * Roofline of a case = max(4 h L d FLOPs at the AVX-512 FMA peak of the
 * threads used, cache bytes at the 1 GiB read bandwidth), both measured in
 * this process at the start; % = roofline / time.
 *
 * Usage: ab_mqa REPS [TYPES] [L,..] [THREADS,..]
 *        ab_mqa loop TYPE L THREADS CALLS   (new only, for perf record) */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "cache/cache_internal.h"
#include "compute/exec.h"
#include "mha.h"

#include "ab_switch.h"

enum { D_MODEL = 2048, H = 32, DH = 64 };

static void die(void) {
    printf("error: %s\n", mha_last_error());
    exit(1);
}

/* An MQA layer and a cache of L random tokens of type ty. */
static void case_make(ab_case *m, int ty, int L) {
    uint64_t seed = 5;
    mha_config cfg = mha_config_default(D_MODEL, H);
    cfg.n_kv_heads = 1, cfg.d_k = DH, cfg.d_v = DH, cfg.bias = 0;
    for (int i = 0; i < 4; i++) m->w[i] = bench_alloc((size_t)D_MODEL * H * DH);
    mha_weights w = {.w_q = m->w[0], .w_k = m->w[1], .w_v = m->w[2], .w_o = m->w[3]};
    m->layer = NULL, m->c = NULL;
    if (mha_layer_create(&m->layer, &cfg, &w) || mha_cache_create_kv(&m->c, m->layer, 1, L, ab_kts[ty], ab_vts[ty], 0))
        die();
    float *k = bench_alloc((size_t)1024 * DH), *v = bench_alloc((size_t)1024 * DH);
    for (int t = 0; t < L; t += 1024) {
        bench_fill(k, (size_t)1024 * DH, &seed, -1.0f, 1.0f);
        bench_fill(v, (size_t)1024 * DH, &seed, -1.0f, 1.0f);
        if (mha_cache_append(m->c, k, v, L - t < 1024 ? L - t : 1024, NULL)) die();
    }
    m->q = bench_alloc((size_t)H * DH);
    bench_fill(m->q, (size_t)H * DH, &seed, -1.0f, 1.0f);
    free(k), free(v);
}

static void case_free(ab_case *m) {
    mha_cache_free(m->c), mha_layer_free(m->layer);
    for (int i = 0; i < 4; i++) free(m->w[i]);
    free(m->q);
}

/* Reads every cache line of the eviction buffer (the sum keeps the loads). */
static volatile float evict_sink;
static void evict(const float *buf, size_t n) {
    float s = 0.0f;
    for (size_t i = 0; i < n; i += 16) s += buf[i];
    evict_sink = s;
}

static double attend_ms(const ab_case *m, float *z) {
    double t0 = bench_now();
    if (mha_cache_attend(m->c, z, m->q, 1, NULL, 0.0f) != MHA_OK) die();
    return (bench_now() - t0) * 1e3;
}

static int type_index(const char *name) {
    for (int i = 0; i < 4; i++)
        if (!strcmp(name, ab_type_names[i])) return i;
    printf("unknown cache type %s; expected fp32, fp16, int8 or int8/fp16\n", name);
    exit(1);
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "loop")) { /* loop TYPE L THREADS CALLS */
        if (argc < 6) return printf("usage: ab_mqa loop TYPE L THREADS CALLS\n"), 1;
        ab_case m;
        case_make(&m, type_index(argv[2]), atoi(argv[3]));
        mha_set_num_threads(atoi(argv[4]));
        ab_use_new = 1;
        float *z = bench_alloc((size_t)H * DH);
        const int calls = atoi(argv[5]);
        double best = 1e30;
        for (int i = 0; i < calls; i++) best = fmin(best, attend_ms(&m, z));
        printf("%s L=%s threads=%s best %.4f ms of %d calls\n", argv[2], argv[3], argv[4], best, calls);
        case_free(&m), free(z);
        return 0;
    }
    const int reps = argc > 1 ? atoi(argv[1]) : 15;
    const char *types = argc > 2 ? argv[2] : "fp32,fp16,int8,int8/fp16";
    int Ls[3] = {1024, 4096, 16384}, ths[2] = {1, 2}, nl = 3, nt = 2;
    if (argc > 3) nl = sscanf(argv[3], "%d,%d,%d", &Ls[0], &Ls[1], &Ls[2]);
    if (argc > 4) nt = sscanf(argv[4], "%d,%d", &ths[0], &ths[1]);
    const size_t evict_n = (size_t)1 << 28; /* 1 GiB of floats */
    float *ebuf = bench_alloc(evict_n);
    for (size_t i = 0; i < evict_n; i++) ebuf[i] = (float)(i & 7);
    double peak[3] = {0}, med, bw_best;
    for (int t = 0; t < nt; t++) peak[ths[t]] = bench_fma_peak_avx512(ths[t], 5000000, 7, &med);
    const double bw = bench_stream_read(2, (size_t)1 << 30, 5, &bw_best);
    printf("AVX-512 FMA peak: 1 thread %.0f, 2 threads %.0f GFLOP/s; read 1 GiB, 2 threads: median %.1f GB/s\n",
           peak[1], peak[2], bw);
    printf("cache L threads mode roof_ms old_best new_best new/old old_med new_med old%% new%% max|dz|\n");
    for (int ty = 0; ty < 4; ty++) {
        char want[32], have[128];
        snprintf(want, sizeof want, ",%s,", ab_type_names[ty]);
        snprintf(have, sizeof have, ",%s,", types);
        if (!strstr(have, want)) continue;
        for (int b = 0; b < nl; b++) {
            ab_case m;
            case_make(&m, ty, Ls[b]);
            float *z[2] = {bench_alloc((size_t)H * DH), bench_alloc((size_t)H * DH)};
            const double flops = 4.0 * H * Ls[b] * DH, bytes = (double)mha_cache_bytes(m.c);
            for (int t = 0; t < nt; t++)
                for (int cold = 0; cold < 2; cold++) {
                    mha_set_num_threads(ths[t]);
                    const double roof = fmax(flops / (peak[ths[t]] * 1e9), bytes / (bw * 1e9)) * 1e3;
                    double *times = malloc(sizeof(double) * 2 * (size_t)reps), best[2] = {1e30, 1e30};
                    for (int r = 0; r < reps; r++)
                        for (int s = 0; s < 2; s++) {
                            ab_use_new = s;
                            if (cold) evict(ebuf, evict_n);
                            else attend_ms(&m, z[s]); /* hot: its own bytes last */
                            times[s * reps + r] = attend_ms(&m, z[s]);
                            best[s] = fmin(best[s], times[s * reps + r]);
                        }
                    double dz = 0.0;
                    for (int i = 0; i < H * DH; i++) dz = fmax(dz, fabs((double)z[0][i] - z[1][i]));
                    const double mo = bench_median(times, reps), mn = bench_median(times + reps, reps);
                    printf("%s %d %d %s %.4f %.4f %.4f %.3f %.4f %.4f %.0f%% %.0f%% %.2g\n", ab_type_names[ty], Ls[b],
                           ths[t], cold ? "cold" : "hot", roof, best[0], best[1], best[1] / best[0], mo, mn,
                           100.0 * roof / best[0], 100.0 * roof / best[1], dz);
                    fflush(stdout);
                    free(times);
                }
            case_free(&m), free(z[0]), free(z[1]);
        }
    }
    free(ebuf);
    return 0;
}
