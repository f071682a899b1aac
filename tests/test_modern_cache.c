/* test_modern_cache.c — today's attention variants (RoPE, ALiBi,
 * soft-capping, sinks, QK-norm) through the KV cache: the outputs of each
 * prefill and decode step equal the rows of one causal forward over the
 * whole sequence on the reference path (double).
 *
 * Tolerance: max|cached - ref| <= 4 * max|fast - ref| + 2e-6, where fast
 * is the fast path's full forward (itself held to the fp32 rule in
 * test_modern.c): the cache runs the same fp32 steps in another order.
 * Legend: B sequences, T tokens, D = d_model, h heads, h_kv kv heads. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "compute/exec.h"
#include "naive.h"
#include "test_util.h"
#include "tests.h"

/* A layer of config c with random weights, sinks and q/k norm weights
 * (the default ALiBi slopes). */
static mha_layer *variant_layer(mha_config c, uint64_t seed) {
    mha_config r;
    if (mha_config_resolve(&r, &c)) { CHECK(0); return NULL; }
    const int D = r.d_model, h = r.n_heads, hk = r.n_kv_heads, dk = r.d_k, dv = r.d_v;
    const int nq = r.qk_norm_per_head ? h * dk : dk, nk = r.qk_norm_per_head ? hk * dk : dk;
    float *wq = naive_random_floats((size_t)D * h * dk, &seed, -0.5f, 0.5f);
    float *wk = naive_random_floats((size_t)D * hk * dk, &seed, -0.5f, 0.5f);
    float *wv = naive_random_floats((size_t)D * hk * dv, &seed, -0.5f, 0.5f);
    float *wo = naive_random_floats((size_t)h * dv * D, &seed, -0.5f, 0.5f);
    float *sinks = naive_random_floats((size_t)h, &seed, -1.0f, 2.0f);
    float *qn = naive_random_floats((size_t)nq, &seed, 0.5f, 1.5f), *kn = naive_random_floats((size_t)nk, &seed, 0.5f, 1.5f);
    mha_weights w = {.w_q = wq, .w_k = wk, .w_v = wv, .w_o = wo, .sinks = r.sinks ? sinks : NULL,
                     .q_norm = r.qk_norm ? qn : NULL, .k_norm = r.qk_norm ? kn : NULL};
    mha_layer *L = NULL;
    CHECK_OK(mha_layer_create(&L, &c, &w));
    free(wq), free(wk), free(wv), free(wo), free(sinks), free(qn), free(kn);
    return L;
}

/* A run: x (B,T,D), positions pos (B,T) or NULL, sequence b's length
 * len[b] <= T. */
typedef struct {
    const mha_layer *L;
    int B, T, D;
    const float *x;
    const int *pos;
    const int *len;
} run_spec;

/* y (B,T,D) rows t < len[b] of sequence b = the reference causal forward
 * of that sequence alone (window_left W - 1 when W > 0, and n_sink sink
 * tokens); fast_err = the
 * fast path's max deviation from it. */
static void reference_rows(float *y, double *fast_err, const run_spec *r, int W, int n_sink) {
    const size_t rowf = (size_t)r->T * r->D;
    float *yf = naive_alloc_floats(rowf);
    *fast_err = 0;
    for (int b = 0; b < r->B; b++) {
        mha_options o = mha_options_default();
        o.causal = 1, o.window_left = W > 0 ? W - 1 : -1, o.sink_tokens = n_sink;
        o.positions = r->pos ? r->pos + (size_t)b * r->T : NULL;
        const float *xb = r->x + b * rowf;
        o.path = MHA_PATH_REFERENCE;
        CHECK_OK(mha_forward(r->L, y + b * rowf, NULL, xb, NULL, 1, r->len[b], r->len[b], &o));
        o.path = MHA_PATH_FAST;
        CHECK_OK(mha_forward(r->L, yf, NULL, xb, NULL, 1, r->len[b], r->len[b], &o));
        *fast_err = fmax(*fast_err, test_max_abs_diff(yf, y + b * rowf, (size_t)r->len[b] * r->D));
    }
    free(yf);
}

/* Storage error bound of a cache of type dt (0 for fp32) over the rows
 * x (rows, D): docs/CACHE.md's first-order bound with Cauchy-Schwarz,
 *   E_s = u_k * scale * max|q_head| * max|k_head|,
 *   |dy| <= 1.5 * max|v| (u_v + 2 E_s) * max_o sum_c |W_O[c,o]|,
 * where fp16 rounds each element by u = 2^-11 (u_k = u_v = u) and int8 by
 * half a step of its block, max|block| / 254 (|dk|_2 <= sqrt(d_k)
 * |k|_2 / 254: u_k = sqrt(d_k) / 254, u_v = 1/254). The head norms come
 * from the projections, or, after a QK-norm, sqrt(width) * max|weight|
 * (the normalized vector has RMS <= 1; width d_k, or the whole
 * projection for qk_norm_whole); RoPE keeps norms (YaRN: times
 * attn_factor); soft-cap, ALiBi and sinks do not enlarge the error. */
static double storage_bound(const mha_layer *L, const float *x, size_t rows, mha_cache_dtype dt) {
    if (dt == MHA_CACHE_F32) return 0.0;
    const mha_config *c = mha_layer_config(L);
    mha_weights w;
    mha_layer_get_weights(L, &w);
    const int D = c->d_model, h = c->n_heads, hk = c->n_kv_heads, dk = c->d_k, dv = c->d_v;
    const double u_k = dt == MHA_CACHE_F16 ? ldexp(1.0, -11) : sqrt((double)dk) / 254.0;
    const double u_v = dt == MHA_CACHE_F16 ? ldexp(1.0, -11) : 1.0 / 254.0;
    const double ms = c->rope.scaling == MHA_ROPE_SCALE_YARN ? c->rope.attn_factor : 1.0;
    double qmax = 0, kmax = 0, vmax = 0, wo = 0;
    for (size_t t = 0; t < rows; t++)
        for (int which = 0; which < 3; which++) {
            const int heads = which == 0 ? h : hk, d = which == 2 ? dv : dk, width = heads * d;
            const float *W = which == 0 ? w.w_q : which == 1 ? w.w_k : w.w_v;
            for (int r = 0; r < heads; r++) {
                double n2 = 0;
                for (int e = 0; e < d; e++) {
                    double a = 0;
                    for (int i = 0; i < D; i++) a += (double)x[t * D + i] * W[(size_t)i * width + r * d + e];
                    n2 += a * a;
                    if (which == 2) vmax = fmax(vmax, fabs(a));
                }
                if (which == 0) qmax = fmax(qmax, sqrt(n2));
                if (which == 1) kmax = fmax(kmax, sqrt(n2));
            }
        }
    if (c->qk_norm) { /* the normalized vectors, whatever the projections were */
        const float *nw[2] = {w.q_norm, w.k_norm};
        const int n[2] = {c->qk_norm_per_head ? h * dk : dk, c->qk_norm_per_head ? hk * dk : dk};
        double m[2] = {0, 0};
        for (int i = 0; i < 2; i++)
            for (int e = 0; e < n[i]; e++) m[i] = fmax(m[i], fabs(nw[i][e]));
        qmax = sqrt((double)(c->qk_norm_whole ? h * dk : dk)) * m[0];
        kmax = sqrt((double)(c->qk_norm_whole ? hk * dk : dk)) * m[1];
    }
    for (int o = 0; o < D; o++) {
        double col = 0;
        for (int cc = 0; cc < h * dv; cc++) col += fabs(w.w_o[(size_t)cc * D + o]);
        wo = fmax(wo, col);
    }
    const double e_s = u_k * (1.0 / sqrt((double)dk)) * qmax * ms * kmax * ms;
    return 1.5 * vmax * (u_v + 2 * e_s) * wo;
}

/* Feeds the run through cache c in calls of steps[s] tokens (sequence b
 * takes those of its len[b]: ragged n_new), from token t0 on, collecting
 * y (B,T,D). */
static void feed(float *y, mha_cache *c, const run_spec *r, int t0, const int *steps, int nsteps) {
    const int B = r->B, D = r->D;
    int t = t0, maxlen = 0;
    for (int b = 0; b < B; b++) maxlen = r->len[b] > maxlen ? r->len[b] : maxlen;
    for (int s = 0; s < nsteps && t < maxlen; s++) {
        const int n = steps[s] < maxlen - t ? steps[s] : maxlen - t;
        float *xs = naive_alloc_floats((size_t)B * n * D), *ys = naive_alloc_floats((size_t)B * n * D);
        int *ps = malloc(sizeof(int) * (size_t)B * n), nn[B];
        for (int b = 0; b < B; b++) {
            nn[b] = r->len[b] - t < 0 ? 0 : r->len[b] - t < n ? r->len[b] - t : n;
            memcpy(xs + (size_t)b * n * D, r->x + ((size_t)b * r->T + t) * D, sizeof(float) * nn[b] * D);
            for (int i = 0; i < n; i++) ps[b * n + i] = r->pos && i < nn[b] ? r->pos[b * r->T + t + i] : 0;
        }
        mha_options o = mha_options_default();
        o.positions = r->pos ? ps : NULL;
        CHECK_OK(mha_forward_cached(r->L, c, ys, NULL, xs, n, nn, &o));
        for (int b = 0; b < B; b++)
            memcpy(y + ((size_t)b * r->T + t) * D, ys + (size_t)b * n * D, sizeof(float) * nn[b] * D);
        free(xs), free(ys), free(ps);
        t += n;
    }
}

/* max over sequences of max|a - b| on rows [t0, len[b]) */
static double rows_diff(const float *a, const float *b, const run_spec *r, int t0) {
    double d = 0;
    for (int s = 0; s < r->B; s++) {
        size_t at = ((size_t)s * r->T + t0) * r->D;
        if (r->len[s] > t0) d = fmax(d, test_max_abs_diff(a + at, b + at, (size_t)(r->len[s] - t0) * r->D));
    }
    return d;
}

/* positions: none, or offsets and gaps per sequence (packed documents) */
static void make_positions(int *pos, int B, int T) {
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) pos[b * T + t] = 37 * b + t + (t >= T / 2 ? 5 : 0);
}

/* One variant config's layer and (B,T,D) arrays: x random in [-1, 1),
 * yr and yc zeroed. */
typedef struct {
    mha_config cfg;
    mha_layer *L;
    size_t n;             /* B*T*D */
    float *x, *yr, *yc;   /* (B,T,D) input, reference rows, cached rows */
} config_case;

static int config_case_open(config_case *k, int i, int B, int T, uint64_t layer_seed, uint64_t x_seed) {
    k->cfg = modern_variant_config(i);
    if (!(k->L = variant_layer(k->cfg, layer_seed))) return 0;
    k->n = (size_t)B * T * k->cfg.d_model;
    k->x = naive_random_floats(k->n, &x_seed, -1, 1), k->yr = naive_alloc_floats(k->n), k->yc = naive_alloc_floats(k->n);
    return 1;
}

static void config_case_close(config_case *k) {
    free(k->x), free(k->yr), free(k->yc);
    mha_layer_free(k->L);
}

/* Every variant config: prefill 9 tokens, then 20 decode steps, ragged
 * (the second sequence shorter), with and without explicit positions;
 * fp32, fp16 and int8 storage (within storage_bound). */
static void prefill_decode_all(void) {
    enum { B = 2, T = 29 };
    const int len[B] = {T, 22}, steps[] = {9, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
    int pos[B * T];
    make_positions(pos, B, T);
    for (int i = 0; i < MODERN_N_CONFIGS; i++) {
        config_case k;
        if (!config_case_open(&k, i, B, T, 900 + i, 300 + i)) return;
        const mha_config cfg = k.cfg;
        mha_layer *L = k.L;
        float *x = k.x, *yr = k.yr, *yc = k.yc;
        for (int with_pos = 0; with_pos < 2; with_pos++) {
            if (with_pos && !cfg.rope.pairing && !cfg.alibi) continue;
            run_spec r = {L, B, T, cfg.d_model, x, with_pos ? pos : NULL, len};
            double fast_err;
            reference_rows(yr, &fast_err, &r, 0, 0);
            for (int dt = MHA_CACHE_F32; dt <= MHA_CACHE_I8; dt++) { /* fp32, fp16, int8 storage */
                mha_cache *c = NULL;
                CHECK_OK(mha_cache_create(&c, L, B, T, (mha_cache_dtype)dt, 0));
                if (c) feed(yc, c, &r, 0, steps, 21);
                const double err = rows_diff(yc, yr, &r, 0), q = storage_bound(L, x, (size_t)B * T, dt);
                if (!(err <= 4 * fast_err + 2e-6 + q))
                    test_report(__FILE__, __LINE__, "config %d positions %d dtype %d: cached err %g, fast err %g, "
                                "storage bound %g", i, with_pos, dt, err, fast_err, q);
                mha_cache_free(c);
            }
        }
        config_case_close(&k);
    }
}

static void modern_cache_prefill_decode(void) { prefill_decode_all(); }

/* the portable kernels: scalar decode tables and scalar soft-cap */
static void modern_cache_scalar_kernels(void) {
    mha_decode_force_scalar(1);
    mha_kernels_force(&mha_kernels_scalar);
    prefill_decode_all();
    mha_kernels_force(NULL);
    mha_decode_force_scalar(0);
}

/* Prefill 14 tokens, truncate to 8, continue with other tokens (and other
 * positions): equal to the reference of the spliced sequence. */
static void modern_cache_truncate_continue(void) {
    enum { B = 1, T = 24, KEEP = 8 };
    const int len[B] = {T}, steps[] = {3, 1, 1, 2, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
    for (int i = 0; i < MODERN_N_CONFIGS; i++) {
        mha_config cfg = modern_variant_config(i);
        mha_layer *L = variant_layer(cfg, 940 + i);
        if (!L) return;
        const int D = cfg.d_model, explicit_pos = cfg.rope.pairing || cfg.alibi;
        uint64_t seed = 500 + i;
        float *x0 = naive_random_floats((size_t)T * D, &seed, -1, 1), *x1 = naive_random_floats((size_t)T * D, &seed, -1, 1);
        float *yr = naive_alloc_floats((size_t)T * D), *yc = naive_alloc_floats((size_t)T * D);
        int p0[T], p1[T];
        for (int t = 0; t < T; t++) p0[t] = 3 * t, p1[t] = t < KEEP ? p0[t] : 100 + t;
        memcpy(x1, x0, sizeof(float) * KEEP * D); /* the kept prefix */
        mha_cache *c = NULL;
        CHECK_OK(mha_cache_create(&c, L, B, T, MHA_CACHE_F32, 0));
        run_spec first = {L, B, T, D, x0, explicit_pos ? p0 : NULL, (const int[]){14}};
        run_spec spliced = {L, B, T, D, x1, explicit_pos ? p1 : NULL, len};
        if (c) {
            feed(yc, c, &first, 0, (const int[]){14}, 1);
            CHECK_OK(mha_cache_truncate(c, 0, KEEP));
            feed(yc, c, &spliced, KEEP, steps, 16);
        }
        double fast_err;
        reference_rows(yr, &fast_err, &spliced, 0, 0);
        double err = rows_diff(yc, yr, &spliced, KEEP);
        if (!(err <= 4 * fast_err + 2e-6))
            test_report(__FILE__, __LINE__, "config %d: cached err %g after truncate, fast err %g", i, err, fast_err);
        mha_cache_free(c);
        free(x0), free(x1), free(yr), free(yc);
        mha_layer_free(L);
    }
}

/* A ring of 21 slots keeping the last 16 tokens over 70 tokens (the
 * stored positions wrap): equal to the reference with window_left 15. */
static void modern_cache_ring_window(void) {
    enum { B = 2, T = 70, CAP = 21, W = 16 };
    const int len[B] = {T, 61};
    int steps[80], pos[B * T];
    steps[0] = 12;
    for (int s = 1; s < 80; s++) steps[s] = s % 7 == 0 ? 4 : 1;
    make_positions(pos, B, T);
    for (int i = 0; i < MODERN_N_CONFIGS; i++) {
        config_case k;
        if (!config_case_open(&k, i, B, T, 960 + i, 700 + i)) return;
        mha_layer *L = k.L;
        float *yr = k.yr, *yc = k.yc;
        run_spec r = {L, B, T, k.cfg.d_model, k.x, k.cfg.rope.pairing || k.cfg.alibi ? pos : NULL, len};
        double fast_err;
        reference_rows(yr, &fast_err, &r, W, 0);
        mha_cache *c = NULL;
        CHECK_OK(mha_cache_create(&c, L, B, CAP, MHA_CACHE_F32, W));
        if (c) feed(yc, c, &r, 0, steps, 80);
        double err = rows_diff(yc, yr, &r, 0);
        if (!(err <= 4 * fast_err + 2e-6))
            test_report(__FILE__, __LINE__, "config %d: ring err %g, fast err %g", i, err, fast_err);
        mha_cache_free(c);
        config_case_close(&k);
    }
}

/* StreamingLLM: a ring of 20 slots, 4 of them for the sink tokens,
 * keeping the last 12 tokens besides the sinks, over 64 tokens (prefill
 * 10, then decode far past the window, ragged, explicit positions): equal
 * to the reference with window_left 11 and sink_tokens 4. Then truncate
 * and continue with other tokens. Every variant config, fp32, fp16 and
 * int8 storage (within storage_bound). */
static void modern_cache_sink_tokens(void) {
    enum { B = 2, T = 64, CAP = 20, W = 12, NS = 4, KEEP = 57 };
    const int len[B] = {T, 55};
    int steps[80], pos[B * T];
    steps[0] = 10;
    for (int s = 1; s < 80; s++) steps[s] = s % 9 == 0 ? 3 : 1;
    make_positions(pos, B, T);
    for (int i = 0; i < MODERN_N_CONFIGS; i++)
        for (int dt = MHA_CACHE_F32; dt <= MHA_CACHE_I8; dt++) {
            config_case k;
            if (!config_case_open(&k, i, B, T, 970 + i, 710 + i)) return;
            const mha_config cfg = k.cfg;
            mha_layer *L = k.L;
            float *x = k.x, *yr = k.yr, *yc = k.yc;
            uint64_t seed = 720 + i;
            float *x1 = naive_random_floats(k.n, &seed, -1, 1);
            run_spec r = {L, B, T, cfg.d_model, x, cfg.rope.pairing || cfg.alibi ? pos : NULL, len};
            double fast_err;
            reference_rows(yr, &fast_err, &r, W, NS);
            mha_cache *c = NULL;
            CHECK_OK(mha_cache_create(&c, L, B, CAP, (mha_cache_dtype)dt, W));
            CHECK_OK(mha_cache_set_sink_tokens(c, NS));
            if (c) feed(yc, c, &r, 0, steps, 80);
            const double q = storage_bound(L, x, (size_t)B * T, (mha_cache_dtype)dt);
            double err = rows_diff(yc, yr, &r, 0);
            if (!(err <= 4 * fast_err + 2e-6 + q))
                test_report(__FILE__, __LINE__, "config %d dtype %d: sink ring err %g, fast err %g, bound %g", i, dt, err,
                            fast_err, q);
            // --- again to 60 / 58 tokens, truncate both to KEEP (the ring
            // of 16 keeps 16 - W + 1 = 5 positions to go back), continue
            // with x1's tokens to 64 / 62
            run_spec r0 = {L, B, T, cfg.d_model, x, r.pos, (const int[]){60, 58}};
            run_spec r1 = {L, B, T, cfg.d_model, x1, r.pos, (const int[]){64, 62}};
            CHECK_OK(mha_cache_reset(c, -1));
            if (c) feed(yc, c, &r0, 0, steps, 80);
            for (int b = 0; c && b < B; b++) {
                CHECK_OK(mha_cache_truncate(c, b, KEEP));
                memcpy(x1 + (size_t)b * T * cfg.d_model, x + (size_t)b * T * cfg.d_model, sizeof(float) * KEEP * cfg.d_model);
            }
            CHECK_STATUS(mha_cache_truncate(c, 0, KEEP - 4), MHA_E_ARG); /* evicted: refused */
            reference_rows(yr, &fast_err, &r1, W, NS);
            if (c) feed(yc, c, &r1, KEEP, steps + 1, 79);
            err = rows_diff(yc, yr, &r1, KEEP);
            const double q1 = storage_bound(L, x1, (size_t)B * T, (mha_cache_dtype)dt);
            if (!(err <= 4 * fast_err + 2e-6 + fmax(q, q1)))
                test_report(__FILE__, __LINE__, "config %d dtype %d: after truncate err %g, fast err %g", i, dt, err,
                            fast_err);
            mha_cache_free(c);
            free(x1);
            config_case_close(&k);
        }
}

/* Sinks in a ring not yet wrapped, with chunks of 128 slots filled: a
 * window of 100 over 300 tokens in 384 slots, so that rows past position
 * 228 attend chunk 0 for its 4 sink slots alone (decode.c reads a filled
 * chunk of consecutive positions without its per-slot loops; the sinks
 * must not take that path). Prefill 150, then one token per step; fp32
 * and int8 storage, config 0 (plain) and 9 (ALiBi, sinks, softcap). */
static void modern_cache_sinks_full_chunks(void) {
    enum { B = 1, T = 300, CAP = 384, W = 100, NS = 4, STEPS = 151 };
    const int len[B] = {T}, configs[2] = {0, 9};
    int steps[STEPS], pos[B * T];
    steps[0] = 150;
    for (int s = 1; s < STEPS; s++) steps[s] = 1;
    make_positions(pos, B, T);
    for (int ci = 0; ci < 2; ci++)
        for (int dt = MHA_CACHE_F32; dt <= MHA_CACHE_I8; dt += MHA_CACHE_I8 - MHA_CACHE_F32) {
            const int i = configs[ci];
            config_case k;
            if (!config_case_open(&k, i, B, T, 990 + i, 730 + i)) return;
            run_spec r = {k.L, B, T, k.cfg.d_model, k.x, k.cfg.rope.pairing || k.cfg.alibi ? pos : NULL, len};
            double fast_err;
            reference_rows(k.yr, &fast_err, &r, W, NS);
            mha_cache *c = NULL;
            CHECK_OK(mha_cache_create(&c, k.L, B, CAP, (mha_cache_dtype)dt, W));
            CHECK_OK(mha_cache_set_sink_tokens(c, NS));
            if (c) feed(k.yc, c, &r, 0, steps, STEPS);
            const double q = storage_bound(k.L, k.x, (size_t)B * T, (mha_cache_dtype)dt);
            const double err = rows_diff(k.yc, k.yr, &r, 0);
            if (!(err <= 4 * fast_err + 2e-6 + q))
                test_report(__FILE__, __LINE__, "config %d dtype %d: sinks, full chunks: err %g, fast err %g, bound %g",
                            i, dt, err, fast_err, q);
            mha_cache_free(c);
            config_case_close(&k);
        }
}

/* The sink-token mask of the reference equals an explicit keep mask
 * (causal, window, first keys) built here; the fast path follows it. */
static void modern_sink_tokens_mask(void) {
    enum { T = 40, W = 7, NS = 3 };
    mha_config cfg = modern_variant_config(9);
    mha_layer *L = variant_layer(cfg, 995);
    if (!L) return;
    const int D = cfg.d_model;
    uint64_t seed = 996;
    float *x = naive_random_floats((size_t)T * D, &seed, -1, 1), *ys = naive_alloc_floats((size_t)T * D);
    float *ym = naive_alloc_floats((size_t)T * D), *yf = naive_alloc_floats((size_t)T * D);
    uint8_t *keep = malloc((size_t)T * T);
    for (int i = 0; i < T; i++)
        for (int j = 0; j < T; j++) keep[i * T + j] = j <= i && (j >= i - (W - 1) || j < NS);
    mha_options o = mha_options_default();
    o.path = MHA_PATH_REFERENCE, o.keep_mask = (mha_mask){keep, 1, 1};
    CHECK_OK(mha_forward(L, ym, NULL, x, NULL, 1, T, T, &o));
    o.keep_mask.data = NULL, o.causal = 1, o.window_left = W - 1, o.sink_tokens = NS;
    CHECK_OK(mha_forward(L, ys, NULL, x, NULL, 1, T, T, &o));
    CHECK(test_max_abs_diff(ys, ym, (size_t)T * D) < 1e-6);
    o.sink_tokens = 0; /* and the sinks change the output */
    CHECK_OK(mha_forward(L, yf, NULL, x, NULL, 1, T, T, &o));
    CHECK(test_max_abs_diff(yf, ym, (size_t)T * D) > 1e-3);
    o.sink_tokens = NS, o.path = MHA_PATH_FAST;
    CHECK_OK(mha_forward(L, yf, NULL, x, NULL, 1, T, T, &o));
    CHECK(test_max_abs_diff(yf, ym, (size_t)T * D) < 1e-4);
    o.window_left = -1; /* sinks without a window: refused */
    CHECK_STATUS(mha_forward(L, yf, NULL, x, NULL, 1, T, T, &o), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("sink_tokens=3");
    free(x), free(ys), free(ym), free(yf), free(keep);
    mha_layer_free(L);
}

/* Probabilities captured during decode: softcap, ALiBi and the sink in
 * each row's weights (a row sums to 1 - its sink's share), equal to the
 * reference's. */
static void modern_cache_probs(void) {
    enum { B = 1, T = 12 };
    mha_config cfg = modern_variant_config(9); /* alibi, sinks, softcap, 6 heads */
    mha_layer *L = variant_layer(cfg, 990);
    if (!L) return;
    const int D = cfg.d_model, h = cfg.n_heads;
    uint64_t seed = 991;
    float *x = naive_random_floats((size_t)T * D, &seed, -1, 1), *y = naive_alloc_floats((size_t)T * D);
    float *pr = naive_alloc_floats((size_t)h * T * T), *pc = naive_alloc_floats((size_t)h * T), *yc = naive_alloc_floats((size_t)D);
    mha_options o = mha_options_default();
    o.causal = 1, o.path = MHA_PATH_REFERENCE;
    mha_capture cap = {.probs = pr};
    CHECK_OK(mha_forward(L, y, &cap, x, NULL, 1, T, T, &o));
    mha_cache *c = NULL;
    CHECK_OK(mha_cache_create(&c, L, B, T, MHA_CACHE_F32, 0));
    double err = 0;
    for (int t = 0; c && t < T; t++) {
        mha_capture cc = {.probs = pc}; /* (1, h, 1, T) */
        CHECK_OK(mha_forward_cached(L, c, yc, &cc, x + (size_t)t * D, 1, NULL, NULL));
        for (int r = 0; r < h; r++)
            for (int j = 0; j < T; j++) err = fmax(err, fabs(pc[r * T + j] - pr[((size_t)r * T + t) * T + j]));
    }
    CHECK(err < 1e-5);
    mha_cache_free(c);
    free(x), free(y), free(pr), free(pc), free(yc);
    mha_layer_free(L);
}

/* positions reach the checks: key_positions refused, a negative position
 * named, positions on a layer without rope or alibi refused */
static void modern_cache_errors(void) {
    mha_config cfg = modern_variant_config(0);
    mha_layer *L = variant_layer(cfg, 999);
    if (!L) return;
    mha_cache *c = NULL;
    CHECK_OK(mha_cache_create(&c, L, 1, 8, MHA_CACHE_F32, 0));
    float x[2 * 24] = {0}, y[2 * 24];
    int pos[2] = {0, -1};
    mha_options o = mha_options_default();
    o.positions = pos;
    CHECK_STATUS(mha_forward_cached(L, c, y, NULL, x, 2, NULL, &o), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("positions[1]=-1");
    CHECK_INT(mha_cache_length(c, 0), 0);
    o.positions = NULL, o.key_positions = pos;
    CHECK_STATUS(mha_forward_cached(L, c, y, NULL, x, 2, NULL, &o), MHA_E_UNSUPPORTED);
    CHECK_ERROR_MENTIONS("key_positions");
    mha_cache_free(c);
    mha_layer_free(L);
    cfg = modern_variant_config(5); /* softcap only */
    L = variant_layer(cfg, 998);
    if (!L) return;
    CHECK_OK(mha_cache_create(&c, L, 1, 8, MHA_CACHE_F32, 0));
    pos[1] = 1, o.key_positions = NULL, o.positions = pos;
    CHECK_STATUS(mha_forward_cached(L, c, y, NULL, x, 2, NULL, &o), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("neither rope");
    // --- sink tokens: a window needed, room for it, an empty cache, the same count
    CHECK_STATUS(mha_cache_set_sink_tokens(c, 2), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("no window");
    mha_cache_free(c);
    CHECK_OK(mha_cache_create(&c, L, 1, 8, MHA_CACHE_F32, 5));
    CHECK_STATUS(mha_cache_set_sink_tokens(c, 4), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("expected 0..capacity - window = 3");
    CHECK_OK(mha_cache_set_sink_tokens(c, 2));
    o.positions = NULL, o.sink_tokens = 3;
    CHECK_STATUS(mha_forward_cached(L, c, y, NULL, x, 2, NULL, &o), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("cache keeps 2");
    o.sink_tokens = 2;
    CHECK_OK(mha_forward_cached(L, c, y, NULL, x, 2, NULL, &o));
    CHECK_STATUS(mha_cache_set_sink_tokens(c, 1), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("holds 2 tokens");
    mha_cache_free(c);
    mha_layer_free(L);
}

static const test_case cases[] = {
    {"modern_cache_prefill_decode", modern_cache_prefill_decode},
    {"modern_cache_scalar_kernels", modern_cache_scalar_kernels},
    {"modern_cache_truncate_continue", modern_cache_truncate_continue},
    {"modern_cache_ring_window", modern_cache_ring_window},
    {"modern_cache_sink_tokens", modern_cache_sink_tokens},
    {"modern_cache_sinks_full_chunks", modern_cache_sinks_full_chunks},
    {"modern_sink_tokens_mask", modern_sink_tokens_mask},
    {"modern_cache_probs", modern_cache_probs},
    {"modern_cache_errors", modern_cache_errors},
};

const test_case *tests_modern_cache(size_t *count) {
    *count = sizeof cases / sizeof cases[0];
    return cases;
}
