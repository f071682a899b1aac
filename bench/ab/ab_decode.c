/* ab_decode.c — interleaved A/B of two builds of the decode attention
 * (issue 11/15 measurement tool, built by bench/ab/ab_decode.sh, not by
 * make): "old" is src/cache/decode.c and the AVX-512 decode table of a
 * given git revision, "new" the working tree's, linked into one process.
 * For each case (cache type, h_kv, L, threads) the same cache is attended
 * by old and new in turn, ABAB..., and the best of N runs of each is kept.
 *
 * Shapes as bench_decode.c: d_model 2048, h 32, d_head 64, B 1, a cache of
 * L tokens of random K/V in [-1, 1), one query per head (mha_cache_attend).
 * Arguments: REPS, cache types (fp32,fp16,int8,int8/fp16), h_kv list
 * (default 32,8,1), L list (default 1024,16384).
 * Output: one line per case: wall-clock ms old, new, new/old, max|z_old -
 * z_new| (rounding: the grouped path's softmax sums in another order),
 * then the same best-of-N by process CPU time (meaningful on 1 thread:
 * the time the call held a core, whatever else ran). `kernels` as the only
 * argument times the grouped kernels alone instead (kernels_ceiling).
 *
 * `cold REPS TYPES H_KV L` (cold_mode): each call timed with the last-level
 * cache evicted first (bench_evict: a 2-thread pass over 1 GiB), as a
 * decode step in a multi-layer model sees its cache; its roofline is a
 * cold read of the same number of bytes from a buffer of its own, evicted
 * the same way (bench_read_pass, the roofline of bench_decode.c). Rounds
 * of (evict, read), (evict, old), (evict, new) in rotating order; best-of
 * and median of REPS; % = read time / call time. A last argument THREADS
 * (default 2) runs the calls and the read on that many threads (1: per
 * core, on a shared machine). The last field: the median over rounds of
 * new/old in one round (CPU time on one thread, else wall).
 * `loop TYPE H_KV L THREADS CALLS [cold]` runs the new build alone (perf).
 * AB_POLICY=0 / 1 in the environment forces the new build's decode
 * prefetch tuning to the Intel / the Zen one (round 8). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench.h"
#include "cache/cache_internal.h"
#include "compute/exec.h"
#include "kernels/kernels.h"
#include "mha.h"

#include "ab_switch.h"

static double cpu_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* Wall-clock ms of one call; *cpu_ms its process CPU time (all threads:
 * on one thread, the time the call held a core, whatever else ran). */
static double attend_ms(mha_cache *c, float *z, const float *q, double *cpu_ms) {
    double t0 = bench_now(), c0 = cpu_now();
    if (mha_cache_attend(c, z, q, 1, NULL, 0.0f) != MHA_OK) {
        printf("error: %s\n", mha_last_error());
        exit(1);
    }
    *cpu_ms = (cpu_now() - c0) * 1e3;
    return (bench_now() - t0) * 1e3;
}

/* `ab_decode kernels`: the decode kernels of the new table on one
 * L1-resident 128-key chunk (d 64, random data), best of 2000 calls per
 * kernel, three rounds, microseconds: the grouped kernels (32 query rows,
 * MQA) on fp32 / fp16 / int8 storage, and the row-major ones for 4 rows
 * (GQA h/h_kv = 4) on int8 and fp16. The ceiling a chunk reaches with no
 * memory traffic and no bookkeeping (bench/LIMITS.md, round 5). */
static int kernels_ceiling(void) {
    if (!mha_cpu_has_avx512()) /* the grouped kernels are the AVX-512 table's: an illegal instruction elsewhere */
        return printf("error: `kernels` times the AVX-512 grouped kernels; this CPU has no AVX-512\n"), 1;
    const mha_decode_kernels *g = &mha_decode_kernels_avx512;
    enum { N = MHA_DECODE_CHUNK, D = 64, DV = 64, LDT = 32, NT = 11 };
    uint64_t seed = 7;
    float *qt = bench_alloc((size_t)D * LDT), *k = bench_alloc((size_t)N * D), *v = bench_alloc((size_t)N * DV);
    float *st = bench_alloc((size_t)N * LDT), *acc = bench_alloc((size_t)32 * (DV + 2)), *buf = bench_alloc((size_t)N * DV);
    float *ks = bench_alloc((size_t)N * 2), *vs = bench_alloc((size_t)N * 2), mx[32], sm[32];
    int8_t *kq = malloc((size_t)N * D), *vq = malloc((size_t)N * DV);
    uint16_t *kh = malloc(2 * (size_t)N * D), *vh = malloc(2 * (size_t)N * DV);
    bench_fill(qt, (size_t)D * LDT, &seed, -1.0f, 1.0f), bench_fill(k, (size_t)N * D, &seed, -1.0f, 1.0f);
    bench_fill(v, (size_t)N * DV, &seed, -1.0f, 1.0f), bench_fill(ks, (size_t)N * 2, &seed, 0.001f, 0.01f);
    bench_fill(vs, (size_t)N * 2, &seed, 0.001f, 0.01f);
    for (int i = 0; i < N * D; i++) kq[i] = (int8_t)(k[i] * 127.0f), vq[i] = (int8_t)(v[i] * 127.0f);
    g->to_f16(kh, k, (size_t)N * D), g->to_f16(vh, v, (size_t)N * DV);
    const char *names[NT] = {"grouped scores fp32", "grouped scores fp16", "grouped scores int8", "grouped softmax",
                             "grouped P.V fp32", "grouped P.V fp16", "grouped P.V int8", "4-row scores int8",
                             "4-row scores fp16", "4-row softmax", "4-row P.V int8"};
    const double flops[NT] = {2.0 * 32 * N * D, 2.0 * 32 * N * D, 2.0 * 32 * N * D, 0, 2.0 * 32 * N * DV,
                              2.0 * 32 * N * DV, 2.0 * 32 * N * DV, 2.0 * 4 * N * D, 2.0 * 4 * N * D, 0,
                              2.0 * 4 * N * DV};
    for (int round = 0; round < 3; round++) {
        double b[NT];
        for (int i = 0; i < NT; i++) b[i] = 1e30;
        for (int r = 0; r < 2000; r++)
            for (int i = 0; i < NT; i++) {
                double t0 = bench_now();
                switch (i) {
                case 0: g->scores_t(st, LDT, qt, LDT, k, NULL, MHA_DK_F32, NULL, 32, N, D); break;
                case 1: g->scores_t(st, LDT, qt, LDT, kh, NULL, MHA_DK_F16, buf, 32, N, D); break;
                case 2: g->scores_t(st, LDT, qt, LDT, kq, ks, MHA_DK_I8, buf, 32, N, D); break;
                case 3: g->softmax_t(st, LDT, mx, sm, 32, N); break;
                case 4: g->accumulate_t(acc, DV + 2, st, LDT, v, NULL, MHA_DK_F32, NULL, 32, N, DV); break;
                case 5: g->accumulate_t(acc, DV + 2, st, LDT, vh, NULL, MHA_DK_F16, buf, 32, N, DV); break;
                case 6: g->accumulate_t(acc, DV + 2, st, LDT, vq, vs, MHA_DK_I8, buf, 32, N, DV); break;
                case 7: g->scores_q8(st, N, qt, D, kq, ks, 4, N, D); break;
                case 8: g->scores_h(st, N, qt, D, kh, 4, N, D); break;
                case 9: g->softmax(st, N, mx, sm, 4, N); break;
                default: g->accumulate_q8(acc, DV + 2, st, N, vq, vs, 4, N, DV); break;
                }
                b[i] = fmin(b[i], bench_now() - t0);
            }
        double med, peak = bench_fma_peak_avx512(1, 5000000, 7, &med); /* one core, this minute */
        printf("round %d: AVX-512 FMA peak, one thread: %.0f GFLOP/s\n", round, peak);
        for (int i = 0; i < NT; i++) {
            printf("%s %.2f us", names[i], b[i] * 1e6);
            if (flops[i] > 0) printf(" (%.0f GFLOP/s, %.0f%%)", flops[i] / b[i] * 1e-9, 100.0 * flops[i] / b[i] * 1e-9 / peak);
            printf(i == NT - 1 ? "\n" : "; ");
        }
    }
    free(qt), free(k), free(v), free(st), free(acc), free(buf), free(ks), free(vs), free(kq), free(vq), free(kh), free(vh);
    return 0;
}

/* ------------------------------------------------------------ cold mode */

static double thread_cpu_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec * 1e-6;
}

static int case_make(ab_case *k, int hk, int L, mha_cache_dtype kt, mha_cache_dtype vt) {
    const int D = 2048, h = 32, dh = 64;
    uint64_t seed = 5;
    mha_config cfg = mha_config_default(D, h);
    cfg.n_kv_heads = hk, cfg.d_k = dh, cfg.d_v = dh, cfg.bias = 0;
    memset(k, 0, sizeof *k);
    k->w[0] = bench_alloc((size_t)D * h * dh), k->w[1] = bench_alloc((size_t)D * hk * dh);
    k->w[2] = bench_alloc((size_t)D * hk * dh), k->w[3] = bench_alloc((size_t)h * dh * D);
    mha_weights w = {.w_q = k->w[0], .w_k = k->w[1], .w_v = k->w[2], .w_o = k->w[3]};
    if (mha_layer_create(&k->layer, &cfg, &w) || mha_cache_create_kv(&k->c, k->layer, 1, L, kt, vt, 0)) return 0;
    float *kk = bench_alloc((size_t)1024 * hk * dh), *v = bench_alloc((size_t)1024 * hk * dh);
    int ok = 1;
    for (int t = 0; ok && t < L; t += 1024) {
        bench_fill(kk, (size_t)1024 * hk * dh, &seed, -1.0f, 1.0f);
        bench_fill(v, (size_t)1024 * hk * dh, &seed, -1.0f, 1.0f);
        ok = mha_cache_append(k->c, kk, v, L - t < 1024 ? L - t : 1024, NULL) == MHA_OK;
    }
    free(kk), free(v);
    k->q = bench_alloc((size_t)h * dh);
    bench_fill(k->q, (size_t)h * dh, &seed, -1.0f, 1.0f);
    return ok;
}

static void case_free(ab_case *k) {
    mha_cache_free(k->c), mha_layer_free(k->layer);
    for (int i = 0; i < 4; i++) free(k->w[i]);
    free(k->q);
}

static double pct(double read, double call) { return 100.0 * read / call; }

static int cold_mode(int reps, const char *types, const int *hkvs, int nh, const int *Ls, int nl, int nth) {
    bench_evict(2); /* makes the eviction buffer (bench.h), untimed */
    if (reps > 999) reps = 999;
    mha_set_num_threads(nth);
    printf("cold, %d threads, best of / median of %d; %% = cold read of the cache's bytes / cold call\n", nth, reps);
    printf("cache h_kv L MiB | best ms: read old new | best %%: old new | median ms: read old new | median %%: old new "
           "| new/old median max|dz|\n");
    for (int ty = 0; ty < 4; ty++) {
        char want[32], have[128];
        snprintf(want, sizeof want, ",%s,", ab_type_names[ty]);
        snprintf(have, sizeof have, ",%s,", types);
        if (!strstr(have, want)) continue;
        for (int a = 0; a < nh; a++)
            for (int b = 0; b < nl; b++) {
                ab_case k;
                if (!case_make(&k, hkvs[a], Ls[b], ab_kts[ty], ab_vts[ty])) return printf("error: %s\n", mha_last_error()), 1;
                size_t n, bytes = mha_cache_bytes(k.c);
                float *rb = bench_read_buffer(bytes, nth, &n);
                float *z[2] = {bench_alloc((size_t)32 * 64), bench_alloc((size_t)32 * 64)};
                double t[3][999], tc[3][999], cpu;
                for (int r = 0; r < reps; r++)
                    for (int s0 = 0; s0 < 3; s0++) {
                        const int s = (s0 + r) % 3; /* 0 read, 1 old, 2 new */
                        bench_evict(2);
                        const double c0 = thread_cpu_ms();
                        if (s == 0) t[0][r] = bench_read_pass(rb, n, nth) * 1e3;
                        else ab_use_new = s == 2, t[s][r] = attend_ms(k.c, z[s - 1], k.q, &cpu);
                        tc[s][r] = thread_cpu_ms() - c0;
                    }
                double best[3], med[3], cbest[3], cmed[3];
                for (int s = 0; s < 3; s++) {
                    best[s] = t[s][0], cbest[s] = tc[s][0];
                    for (int r = 1; r < reps; r++) best[s] = fmin(best[s], t[s][r]), cbest[s] = fmin(cbest[s], tc[s][r]);
                    med[s] = bench_median(t[s], reps), cmed[s] = bench_median(tc[s], reps);
                }
                double dz = 0.0;
                for (int i = 0; i < 32 * 64; i++) dz = fmax(dz, fabs((double)z[0][i] - z[1][i]));
                printf("%s %d %d %.1f | %.4f %.4f %.4f | %.0f %.0f | %.4f %.4f %.4f | %.0f %.0f | %.3f %.2g",
                       ab_type_names[ty], hkvs[a], Ls[b], (double)bytes / (1 << 20), best[0], best[1], best[2], pct(best[0], best[1]),
                       pct(best[0], best[2]), med[0], med[1], med[2], pct(med[0], med[1]), pct(med[0], med[2]),
                       med[2] / med[1], dz);
                double pr[999]; /* new/old of each round's pair: the load changes less within a round */
                for (int r = 0; r < reps; r++) pr[r] = (nth == 1 ? tc[2][r] / tc[1][r] : t[2][r] / t[1][r]);
                if (nth == 1) /* the calling thread's CPU time: what other processes take does not count */
                    printf(" | cpu best %%: %.0f %.0f median %%: %.0f %.0f new/old %.3f", pct(cbest[0], cbest[1]),
                           pct(cbest[0], cbest[2]), pct(cmed[0], cmed[1]), pct(cmed[0], cmed[2]), cmed[2] / cmed[1]);
                printf(" | paired new/old median %.3f", bench_median(pr, reps));
                printf("\n");
                fflush(stdout);
                free(rb), free(z[0]), free(z[1]);
                case_free(&k);
            }
    }
    return 0;
}

/* `loop TYPE H_KV L THREADS CALLS [cold]`: the new build alone, CALLS
 * calls (for perf), cold: the LLC evicted before each; prints the mean
 * and best ms of a call. */
static int loop_mode(const char *type, int hk, int L, int nth, int calls, int cold) {
    int ty = 0;
    while (ty < 3 && strcmp(type, ab_type_names[ty])) ty++;
    ab_case k;
    if (!case_make(&k, hk, L, ab_kts[ty], ab_vts[ty])) return printf("error: %s\n", mha_last_error()), 1;
    float *z = bench_alloc((size_t)32 * 64);
    double sum = 0.0, best = 1e30, cpu;
    mha_set_num_threads(nth);
    ab_use_new = 1;
    for (int i = 0; i < calls; i++) {
        if (cold) bench_evict(2);
        double t = attend_ms(k.c, z, k.q, &cpu);
        sum += t, best = fmin(best, t);
    }
    printf("%s h_kv %d L %d threads %d: mean %.4f best %.4f ms\n", type, hk, L, nth, sum / calls, best);
    free(z), case_free(&k);
    return 0;
}

int main(int argc, char **argv) {
    /* AB_POLICY=0 / 1 (environment): the new build's decode prefetch tuning
     * forced to the Intel / the Zen one (decode_kernels.h) */
    if (getenv("AB_POLICY")) mha_decode_force_prefetch_policy(atoi(getenv("AB_POLICY")));
    if (argc > 1 && !strcmp(argv[1], "kernels")) return kernels_ceiling();
    if (argc > 6 && !strcmp(argv[1], "loop"))
        return loop_mode(argv[2], atoi(argv[3]), atoi(argv[4]), atoi(argv[5]), atoi(argv[6]), argc > 7);
    if (argc > 1 && !strcmp(argv[1], "cold")) {
        int hk[3] = {32, 8, 1}, Ls[3] = {1024, 4096, 16384}, nh = 2, nl = 3;
        if (argc > 4) nh = sscanf(argv[4], "%d,%d,%d", &hk[0], &hk[1], &hk[2]);
        if (argc > 5) nl = sscanf(argv[5], "%d,%d,%d", &Ls[0], &Ls[1], &Ls[2]);
        return cold_mode(argc > 2 ? atoi(argv[2]) : 15, argc > 3 ? argv[3] : "fp32,fp16,int8,int8/fp16", hk, nh, Ls,
                         nl, argc > 6 ? atoi(argv[6]) : 2);
    }
    int reps = argc > 1 ? atoi(argv[1]) : 15;
    const char *types = argc > 2 ? argv[2] : "fp32,fp16,int8,int8/fp16";
    const int h = 32, dh = 64;
    int hkvs[3] = {32, 8, 1}, Ls[3] = {1024, 16384, 0}, nh = 3, nl = 2;
    if (argc > 3) nh = sscanf(argv[3], "%d,%d,%d", &hkvs[0], &hkvs[1], &hkvs[2]);
    if (argc > 4) nl = sscanf(argv[4], "%d,%d,%d", &Ls[0], &Ls[1], &Ls[2]);
    printf("cache h_kv L threads old_ms new_ms new/old max|dz| old_cpu_ms new_cpu_ms new/old(cpu)\n");
    for (int ty = 0; ty < 4; ty++) {
        char want[32];
        snprintf(want, sizeof want, ",%s,", ab_type_names[ty]);
        char have[128];
        snprintf(have, sizeof have, ",%s,", types);
        if (!strstr(have, want)) continue;
        for (int a = 0; a < nh; a++)
            for (int b = 0; b < nl; b++) {
                const int hk = hkvs[a], L = Ls[b];
                ab_case k;
                if (!case_make(&k, hk, L, ab_kts[ty], ab_vts[ty])) return printf("error: %s\n", mha_last_error()), 1;
                mha_cache *c = k.c;
                const float *q = k.q;
                float *z0 = bench_alloc((size_t)h * dh), *z1 = bench_alloc((size_t)h * dh);
                for (int th = 1; th <= 2; th++) {
                    mha_set_num_threads(th);
                    double best[2] = {1e30, 1e30}, cbest[2] = {1e30, 1e30}, cpu;
                    for (int r = 0; r < reps; r++)
                        for (int s = 0; s < 2; s++) {
                            ab_use_new = s;
                            double t = attend_ms(c, s ? z1 : z0, q, &cpu);
                            if (t < best[s]) best[s] = t;
                            if (cpu < cbest[s]) cbest[s] = cpu;
                        }
                    double dz = 0.0;
                    for (int i = 0; i < h * dh; i++) dz = fmax(dz, fabs((double)z0[i] - z1[i]));
                    printf("%s %d %d %d %.4f %.4f %.3f %.2g %.4f %.4f %.3f\n", ab_type_names[ty], hk, L, th, best[0],
                           best[1], best[1] / best[0], dz, cbest[0], cbest[1], cbest[1] / cbest[0]);
                    fflush(stdout);
                }
                case_free(&k);
                free(z0), free(z1);
            }
    }
    return 0;
}
