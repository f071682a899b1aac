/* bench_decode.c — one decode configuration (issue 5): per-token time of a
 * decode step at context L, the whole layer and attention alone.
 *
 * The peer (PyTorch, bench/peer_torch.py decode) and the memory read
 * bandwidth (bench_mha machine) run separately; bench/report.py joins them.
 *
 * Shapes: x (B,1,d_model) per step; cache K, V of capacity L, h_kv heads of
 * d_head, fp32, fp16 or int8, or K int8 / V fp16 (cache=int8/fp16: K's type,
 * then V's; layout: the cache's own, include/mha.h). The cache
 * is filled with L-1 random tokens by mha_cache_append (untimed).
 *   step: mha_forward_cached on one token (projections, append at position
 *         L-1, attention over L keys, W_O), then mha_cache_truncate back to
 *         L-1 (O(1)) so every step sees the same context, as the peer
 *         overwrites slot L-1.
 *   attn: mha_cache_attend of one query per head over the L cached keys
 *         (token L-1 appended once beforehand) — the decode attention
 *         kernel itself, nothing subtracted (attn_method=mha_cache_attend).
 * Bytes read per step, which report.py divides by the time: the cache
 * (mha_cache_bytes) for attention alone, plus the weights W_Q, W_K, W_V,
 * W_O (weight_bytes) for the whole layer.
 * Both are timed twice: hot (repeated, as the peer is, so the cache and
 * weights may sit in the last-level cache between calls) and cold: before
 * each call the LLC is evicted (bench_evict), as the other layers of a
 * model evict this layer's weights and cache between its decode steps.
 * Each cold call alternates with a cold read of the same number of bytes
 * from a buffer of that size by the same threads (bench_read_pass): the
 * time those bytes take from memory on this machine, at that moment, the
 * roofline's memory term (report.py).
 * --weights bf16|int8 (weight_dtype_rows below): the same step with the
 * projections stored in bf16 or int8, reported as kind=decode_weights.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "mha.h"

typedef struct {
    const mha_layer *layer;
    mha_cache *cache;
    float *y;       /* (B,1,d_model) */
    const float *x; /* (B,1,d_model) */
    float *z;       /* (B,1,h*d_head) */
    const float *q; /* (B,1,h*d_head) */
    int B, L;
    mha_status st;
} decode_job;

static int run_step(void *arg) {
    decode_job *j = arg;
    j->st = mha_forward_cached(j->layer, j->cache, j->y, NULL, j->x, 1, NULL, NULL);
    for (int b = 0; j->st == MHA_OK && b < j->B; b++) j->st = mha_cache_truncate(j->cache, b, j->L - 1);
    return j->st != MHA_OK;
}

static int run_attend(void *arg) {
    decode_job *j = arg;
    j->st = mha_cache_attend(j->cache, j->z, j->q, 1, NULL, 0.0f);
    return j->st != MHA_OK;
}

/* Cold rounds: evict, read `n` floats of ref (the roofline's bytes),
 * evict, run fn; ref_t[r] and fn_t[r] are the two times of round r.
 * Returns 0, or 1 when fn failed. */
static int cold_rounds(int (*fn)(void *), void *arg, const float *ref, size_t n, int threads, double *ref_t,
                       double *fn_t, int rounds) {
    for (int r = 0; r < rounds; r++) {
        bench_evict(threads);
        ref_t[r] = bench_read_pass(ref, n, threads);
        bench_evict(threads);
        double t0 = bench_now();
        if (fn(arg)) return 1;
        fn_t[r] = bench_now() - t0;
    }
    return 0;
}

static size_t count_nonfinite(const float *p, size_t n) {
    size_t k = 0;
    for (size_t i = 0; i < n; i++) k += !isfinite(p[i]);
    return k;
}

static void print_error(const char *what, mha_status s) {
    printf(" status=error error=\"%s: %s: %s\"\n", what, mha_status_str(s), mha_last_error());
    fflush(stdout);
}

/* ---- bf16 / int8 weights (issue 15): the layer converted before the
 * cache is made; weight_bytes = the stored bytes (int8: 1 a weight + one
 * fp32 scale per 32 of them). 0 and nothing changed for fp32 weights. */
static mha_status weight_dtype_rows(const bench_decode_cfg *c, mha_layer *layer, size_t n_weights,
                                    size_t *weight_bytes) {
    if (!c->weights) return MHA_OK;
    mha_status s = mha_layer_convert_weights(layer, (mha_weight_dtype)c->weights);
    *weight_bytes = c->weights == MHA_W_BF16 ? 2 * n_weights : n_weights + n_weights / 32 * 4;
    return s;
}

static const char *dtype_name(mha_cache_dtype t) {
    return t == MHA_CACHE_I8 ? "int8" : t == MHA_CACHE_F16 ? "fp16" : "fp32";
}

/* "RESULT kind=decode[_weights]<suffix> ..." and the case's keys: one
 * line for the hot times, one for the cold ("_cold"). */
static void print_case(const bench_decode_cfg *c, const char *suffix, mha_cache_dtype kt, mha_cache_dtype vt) {
    printf("RESULT kind=%s%s impl=mha d_model=%d h=%d h_kv=%d d_head=%d L=%d B=%d cache=%s%s%s",
           c->weights ? "decode_weights" : "decode", suffix, c->d_model, c->h, c->h_kv, c->d_head, c->L, c->B,
           dtype_name(kt), kt == vt ? "" : "/", kt == vt ? "" : dtype_name(vt));
    if (c->weights) printf(" weights=%s", mha_weight_dtype_name((mha_weight_dtype)c->weights));
}

int bench_decode(const bench_decode_cfg *c) {
    mha_cache_dtype kt = c->int8 ? MHA_CACHE_I8 : c->fp16 ? MHA_CACHE_F16 : MHA_CACHE_F32;
    mha_cache_dtype vt = c->v_fp16 ? MHA_CACHE_F16 : kt;
    print_case(c, "", kt, vt);
    fflush(stdout);
    mha_set_num_threads(c->threads);
    int D = c->d_model, h = c->h, hk = c->h_kv, dh = c->d_head, B = c->B, L = c->L;
    uint64_t seed = 5;

    /* weights uniform in +-1/sqrt(d_model), biases too (as the peer) */
    mha_config cfg = mha_config_default(D, h);
    cfg.n_kv_heads = hk, cfg.d_k = dh, cfg.d_v = dh, cfg.bias = 1;
    float lim = 1.0f / sqrtf((float)D);
    float *wq = bench_alloc((size_t)D * h * dh), *wk = bench_alloc((size_t)D * hk * dh);
    float *wv = bench_alloc((size_t)D * hk * dh), *wo = bench_alloc((size_t)h * dh * D);
    float *bq = bench_alloc((size_t)h * dh), *bk = bench_alloc((size_t)hk * dh);
    float *bv = bench_alloc((size_t)hk * dh), *bo = bench_alloc((size_t)D);
    float *all[8] = {wq, wk, wv, wo, bq, bk, bv, bo};
    size_t sizes[8] = {(size_t)D * h * dh, (size_t)D * hk * dh, (size_t)D * hk * dh, (size_t)h * dh * D,
                       (size_t)h * dh, (size_t)hk * dh, (size_t)hk * dh, (size_t)D};
    for (int i = 0; i < 8; i++) bench_fill(all[i], sizes[i], &seed, -lim, lim);
    mha_weights w = {.w_q = wq, .w_k = wk, .w_v = wv, .w_o = wo, .b_q = bq, .b_k = bk, .b_v = bv, .b_o = bo};
    size_t weight_bytes = 4 * (sizes[0] + sizes[1] + sizes[2] + sizes[3]);

    mha_layer *layer = NULL;
    mha_cache *cache = NULL;
    mha_status s = mha_layer_create(&layer, &cfg, &w);
    if (!s && (s = weight_dtype_rows(c, layer, weight_bytes / 4, &weight_bytes))) mha_layer_free(layer);
    if (s) {
        print_error("mha_layer_create", s);
        return 1;
    }
    s = mha_cache_create_kv(&cache, layer, B, L, kt, vt, 0);
    if (s) {
        print_error("mha_cache_create", s);
        mha_layer_free(layer);
        return 1;
    }

    /* L-1 cached tokens of random K, V in [-1, 1), appended in blocks */
    int blk = 1024;
    float *k = bench_alloc((size_t)B * blk * hk * dh), *v = bench_alloc((size_t)B * blk * hk * dh);
    for (int t = 0; t < L - 1 && !s; t += blk) {
        int n = L - 1 - t < blk ? L - 1 - t : blk;
        bench_fill(k, (size_t)B * n * hk * dh, &seed, -1.0f, 1.0f);
        bench_fill(v, (size_t)B * n * hk * dh, &seed, -1.0f, 1.0f);
        s = mha_cache_append(cache, k, v, n, NULL);
    }
    if (s) print_error("mha_cache_append", s);

    float *x = bench_alloc((size_t)B * D), *y = bench_alloc((size_t)B * D);
    float *q = bench_alloc((size_t)B * h * dh), *z = bench_alloc((size_t)B * h * dh);
    bench_fill(x, (size_t)B * D, &seed, -1.0f, 1.0f);
    bench_fill(q, (size_t)B * h * dh, &seed, -1.0f, 1.0f);
    decode_job job = {layer, cache, y, x, z, q, B, L, MHA_OK};
    int steps = c->steps > 0 ? c->steps : 1;
    double *ts = malloc(sizeof(double) * (size_t)(steps + 1)), *ta = malloc(sizeof(double) * (size_t)(steps + 1));
    int ns = -1, na = -1;
    if (!s) {
        ns = bench_repeat(run_step, &job, ts, steps, 10.0);
        if (ns < 0) print_error("mha_forward_cached", job.st), s = job.st;
    }
    /* cold steps against a cold read of the cache and the weights' bytes */
    int nc = c->cold_rounds > 0 ? c->cold_rounds : 9;
    double *cold = malloc(sizeof(double) * 4 * (size_t)nc);
    size_t n_ref = 0;
    float *ref = NULL;
    if (!s) {
        ref = bench_read_buffer(mha_cache_bytes(cache) + weight_bytes, c->threads, &n_ref);
        if (cold_rounds(run_step, &job, ref, n_ref, c->threads, cold, cold + nc, nc))
            print_error("mha_forward_cached", job.st), s = job.st;
    }
    size_t nonfinite = s ? 0 : count_nonfinite(y, (size_t)B * D);
    if (!s) { /* token L-1 once, then attention alone over L keys */
        bench_fill(k, (size_t)B * hk * dh, &seed, -1.0f, 1.0f);
        bench_fill(v, (size_t)B * hk * dh, &seed, -1.0f, 1.0f);
        s = mha_cache_append(cache, k, v, 1, NULL);
        if (s) print_error("mha_cache_append", s);
    }
    if (!s) {
        na = bench_repeat(run_attend, &job, ta, steps, 10.0);
        if (na < 0) print_error("mha_cache_attend", job.st), s = job.st;
        else nonfinite += count_nonfinite(z, (size_t)B * h * dh);
    }
    if (!s && cold_rounds(run_attend, &job, ref, mha_cache_bytes(cache) / sizeof(float), c->threads, cold + 2 * nc,
                          cold + 3 * nc, nc))
        print_error("mha_cache_attend", job.st), s = job.st;
    if (!s) {
        double smin = bench_min(ts, ns), amin = bench_min(ta, na);
        double smed = bench_median(ts, ns), amed = bench_median(ta, na);
        printf(" step_median_s=%.6g step_min_s=%.6g attn_median_s=%.6g attn_min_s=%.6g steps=%d"
               " attn_runs=%d cache_bytes=%zu weight_bytes=%zu nonfinite=%zu threads=%d"
               " attn_method=mha_cache_attend status=ok\n",
               smed, smin, amed, amin, ns, na, mha_cache_bytes(cache), weight_bytes, nonfinite, c->threads);
        print_case(c, "_cold", kt, vt);
        bench_print_times_as("cold_read_step_", cold, nc);
        bench_print_times_as("cold_step_", cold + nc, nc);
        bench_print_times_as("cold_read_attn_", cold + 2 * nc, nc);
        bench_print_times_as("cold_attn_", cold + 3 * nc, nc);
        printf(" cold_rounds=%d evict_mib=%ld status=ok\n", nc, bench_evict_mib());
        fflush(stdout);
    }
    free(ts), free(ta), free(cold), free(ref);
    free(k), free(v), free(x), free(y), free(q), free(z);
    for (int i = 0; i < 8; i++) free(all[i]);
    mha_cache_free(cache);
    mha_layer_free(layer);
    return s != MHA_OK;
}
