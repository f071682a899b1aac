/* variants.c — configuration rules, ALiBi default slopes, RoPE frequencies
 * and the fp32 q/k transform of today's attention variants (variants.h).
 * Legend: h heads, d_k, r = rope.dim rotated dims (pairs i < r/2). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/variants.h"

int mha_variants_any(const mha_config *c) {
    return c->rope.pairing != MHA_ROPE_NONE || c->alibi || c->softcap != 0.0f || c->sinks ||
           c->qk_norm != MHA_QK_NORM_NONE || c->clip_qkv != 0.0f || c->temperature_floor != 0;
}

double mha_query_temperature(const mha_config *c, int pos) {
    if (c->temperature_floor == 0) return 1.0;
    const double p = c->temperature_rule == MHA_TEMPERATURE_MINISTRAL3 ? (double)pos : (double)pos + 1.0;
    return 1.0 + c->temperature_scale * log1p(floor(p / c->temperature_floor));
}

static mha_status check_positive(const char *name, double v) {
    if (!(v > 0.0) || !isfinite(v))
        return mha_fail(MHA_E_ARG, "%s=%g; expected a finite number > 0", name, v);
    return MHA_OK;
}

/* LongRoPE: a factor per rotated pair in short_factor and long_factor
 * (finite, > 0; 0 beyond dim/2, so a list of another length is caught),
 * the pre-training context L, attn_factor's default from factor. */
static mha_status resolve_longrope(mha_rope *r) {
    const int half = r->dim / 2;
    if (half > MHA_ROPE_MAX_PAIRS)
        return mha_fail(MHA_E_ARG, "rope.dim=%d with longrope; expected at most %d rotated dims (MHA_ROPE_MAX_PAIRS "
                        "factors)", r->dim, 2 * MHA_ROPE_MAX_PAIRS);
    for (int k = 0; k < 2; k++) {
        const float *f = k ? r->long_factor : r->short_factor;
        const char *name = k ? "long_factor" : "short_factor";
        for (int i = 0; i < MHA_ROPE_MAX_PAIRS; i++) {
            if (i < half && (!(f[i] > 0.0f) || !isfinite(f[i])))
                return mha_fail(MHA_E_ARG, "rope.%s[%d]=%g; expected a finite factor > 0 for each of the dim/2=%d "
                                "rotated pairs", name, i, (double)f[i], half);
            if (i >= half && f[i] != 0.0f)
                return mha_fail(MHA_E_ARG, "rope.%s[%d]=%g; expected 0 beyond the dim/2=%d rotated pairs (a list "
                                "of %d factors for rope.dim=%d)", name, i, (double)f[i], half, half, r->dim);
        }
    }
    if (r->factor == 0.0) r->factor = 1.0;
    if (!(r->factor >= 1.0) || !isfinite(r->factor))
        return mha_fail(MHA_E_ARG, "rope.factor=%g; expected a finite number >= 1 (0 means 1) for longrope",
                        r->factor);
    if (r->original_max_positions < 1 || (r->factor > 1.0 && r->original_max_positions < 2))
        return mha_fail(MHA_E_ARG, "rope.original_max_positions=%d; expected the pre-training context length "
                        "(>= %d) for longrope", r->original_max_positions, r->factor > 1.0 ? 2 : 1);
    if (r->attn_factor == 0.0)
        r->attn_factor = r->factor > 1.0 ? sqrt(1.0 + log(r->factor) / log(r->original_max_positions)) : 1.0;
    return check_positive("rope.attn_factor", r->attn_factor);
}

static mha_status resolve_rope(mha_config *c) {
    mha_rope *r = &c->rope;
    if ((int)r->pairing < MHA_ROPE_NONE || (int)r->pairing > MHA_ROPE_INTERLEAVED)
        return mha_fail(MHA_E_ARG, "rope.pairing=%d; expected MHA_ROPE_NONE, _HALVES or _INTERLEAVED", (int)r->pairing);
    int ext_set = -1; /* the first pair with a LongRoPE factor set */
    for (int i = 0; i < MHA_ROPE_MAX_PAIRS && ext_set < 0; i++)
        if (r->short_factor[i] != 0.0f || r->long_factor[i] != 0.0f) ext_set = i;
    if (r->pairing == MHA_ROPE_NONE) {
        if (r->dim || r->theta != 0.0 || r->scaling || r->factor != 0.0 || r->low_freq_factor != 0.0 ||
            r->high_freq_factor != 0.0 || r->original_max_positions || r->beta_fast != 0.0 ||
            r->beta_slow != 0.0 || r->attn_factor != 0.0 || ext_set >= 0)
            return mha_fail(MHA_E_ARG, "rope parameters are set but rope.pairing is MHA_ROPE_NONE; "
                            "expected a pairing (halves or interleaved) or all rope fields 0");
        return MHA_OK;
    }
    if (r->dim == 0) r->dim = c->d_k;
    if (r->dim < 2 || r->dim > c->d_k || r->dim % 2)
        return mha_fail(MHA_E_ARG, "rope.dim=%d; expected an even number in 2..d_k=%d (0 means d_k)", r->dim, c->d_k);
    if (r->theta == 0.0) r->theta = 10000.0;
    mha_status s;
    if ((s = check_positive("rope.theta", r->theta))) return s;
    if ((int)r->scaling < MHA_ROPE_SCALE_NONE || (int)r->scaling > MHA_ROPE_SCALE_LONGROPE)
        return mha_fail(MHA_E_ARG, "rope.scaling=%d; expected none, linear, llama3, yarn, dynamic or longrope",
                        (int)r->scaling);
    if (r->scaling == MHA_ROPE_SCALE_LONGROPE) return resolve_longrope(r);
    if (ext_set >= 0)
        return mha_fail(MHA_E_ARG, "rope.short_factor/long_factor[%d] set with rope.scaling=%d; expected them only "
                        "with MHA_ROPE_SCALE_LONGROPE (all 0 otherwise)", ext_set, (int)r->scaling);
    if (r->scaling == MHA_ROPE_SCALE_NONE) {
        if (r->factor != 0.0 && r->factor != 1.0)
            return mha_fail(MHA_E_ARG, "rope.factor=%g without a rope.scaling; expected a scaling "
                            "(linear, llama3, yarn) or factor 0", r->factor);
        return MHA_OK;
    }
    if (!(r->factor >= 1.0) || !isfinite(r->factor))
        return mha_fail(MHA_E_ARG, "rope.factor=%g; expected a finite number >= 1 for the scaling", r->factor);
    if (r->scaling == MHA_ROPE_SCALE_LINEAR) return MHA_OK;
    if (r->original_max_positions < 1)
        return mha_fail(MHA_E_ARG, "rope.original_max_positions=%d; expected the pre-training context "
                        "length (>= 1) for llama3, yarn and dynamic scaling", r->original_max_positions);
    if (r->scaling == MHA_ROPE_SCALE_DYNAMIC) {
        if (r->dim < 4) /* the base's exponent r/(r-2) */
            return mha_fail(MHA_E_ARG, "rope.dim=%d with dynamic scaling; expected >= 4 (its base grows by a "
                            "power r/(r-2))", r->dim);
        return MHA_OK;
    }
    if (r->scaling == MHA_ROPE_SCALE_LLAMA3) {
        if (r->low_freq_factor == 0.0) r->low_freq_factor = 1.0;
        if (r->high_freq_factor == 0.0) r->high_freq_factor = 4.0;
        if ((s = check_positive("rope.low_freq_factor", r->low_freq_factor))) return s;
        if (!(r->high_freq_factor > r->low_freq_factor) || !isfinite(r->high_freq_factor))
            return mha_fail(MHA_E_ARG, "rope.high_freq_factor=%g; expected finite and > low_freq_factor=%g",
                            r->high_freq_factor, r->low_freq_factor);
        return MHA_OK;
    }
    if (r->beta_fast == 0.0) r->beta_fast = 32.0;
    if (r->beta_slow == 0.0) r->beta_slow = 1.0;
    if (r->attn_factor == 0.0) r->attn_factor = 0.1 * log(r->factor) + 1.0;
    if ((s = check_positive("rope.beta_slow", r->beta_slow)) || (s = check_positive("rope.attn_factor", r->attn_factor)))
        return s;
    if (!(r->beta_fast > r->beta_slow) || !isfinite(r->beta_fast))
        return mha_fail(MHA_E_ARG, "rope.beta_fast=%g; expected finite and > beta_slow=%g", r->beta_fast, r->beta_slow);
    return MHA_OK;
}

mha_status mha_variants_resolve(mha_config *c) {
    mha_status s = resolve_rope(c);
    if (s) return s;
    if (c->alibi != 0 && c->alibi != 1) return mha_fail(MHA_E_ARG, "alibi=%d; expected 0 or 1", c->alibi);
    if (c->sinks != 0 && c->sinks != 1) return mha_fail(MHA_E_ARG, "sinks=%d; expected 0 or 1", c->sinks);
    if (!(c->softcap >= 0.0f) || !isfinite(c->softcap))
        return mha_fail(MHA_E_ARG, "softcap=%g; expected 0 (none) or a finite cap > 0", (double)c->softcap);
    if (!(c->clip_qkv >= 0.0f) || !isfinite(c->clip_qkv))
        return mha_fail(MHA_E_ARG, "clip_qkv=%g; expected 0 (none) or a finite bound > 0", (double)c->clip_qkv);
    if (c->temperature_floor < 0 || (c->temperature_floor == 0 && c->temperature_scale != 0.0f) ||
        (c->temperature_floor > 0 && (!(c->temperature_scale > 0.0f) || !isfinite(c->temperature_scale))))
        return mha_fail(MHA_E_ARG, "temperature_floor=%d temperature_scale=%g; expected both 0 (none), or a floor "
                        ">= 1 with a finite scale > 0 (Llama 4: 8192 and 0.1)", c->temperature_floor,
                        (double)c->temperature_scale);
    if ((int)c->temperature_rule < MHA_TEMPERATURE_LLAMA4 || (int)c->temperature_rule > MHA_TEMPERATURE_MINISTRAL3 ||
        (c->temperature_rule != MHA_TEMPERATURE_LLAMA4 && c->temperature_floor == 0))
        return mha_fail(MHA_E_ARG, "temperature_rule=%d with temperature_floor=%d; expected MHA_TEMPERATURE_LLAMA4, "
                        "or _MINISTRAL3 with a floor", (int)c->temperature_rule, c->temperature_floor);
    if ((int)c->qk_norm < MHA_QK_NORM_NONE || (int)c->qk_norm > MHA_QK_NORM_LAYER)
        return mha_fail(MHA_E_ARG, "qk_norm=%d; expected MHA_QK_NORM_NONE, _RMS or _LAYER", (int)c->qk_norm);
    if (c->qk_norm_per_head != 0 && c->qk_norm_per_head != 1)
        return mha_fail(MHA_E_ARG, "qk_norm_per_head=%d; expected 0 or 1", c->qk_norm_per_head);
    if (c->qk_norm_whole != 0 && c->qk_norm_whole != 1)
        return mha_fail(MHA_E_ARG, "qk_norm_whole=%d; expected 0 or 1", c->qk_norm_whole);
    if (c->qk_norm == MHA_QK_NORM_NONE && (c->qk_norm_per_head || c->qk_norm_eps != 0.0f || c->qk_norm_whole))
        return mha_fail(MHA_E_ARG, "qk_norm_per_head/qk_norm_eps/qk_norm_whole set without qk_norm; expected "
                        "qk_norm RMS or LAYER");
    if (c->qk_norm_whole && !c->qk_norm_per_head)
        return mha_fail(MHA_E_ARG, "qk_norm_whole=1 with qk_norm_per_head=0; expected qk_norm_per_head=1 (the "
                        "whole-width norm has h*d_k and h_kv*d_k weights, one row per head)");
    if (c->qk_norm != MHA_QK_NORM_NONE) {
        if (c->qk_norm_eps == 0.0f) c->qk_norm_eps = 1e-6f;
        if ((s = check_positive("qk_norm_eps", c->qk_norm_eps))) return s;
    }
    if (mha_variants_any(c) && (c->add_bias_kv || c->add_zero_attn))
        return mha_fail(MHA_E_ARG, "add_bias_kv/add_zero_attn with rope, alibi, softcap, sinks, qk_norm, clip_qkv or a temperature; "
                        "expected PyTorch's extra keys only with the plain layer (they have no position)");
    return MHA_OK;
}

void mha_alibi_default_slopes(float *slopes, int n) {
    int p = 1;
    while (p * 2 <= n) p *= 2;
    for (int r = 0; r < p; r++) slopes[r] = (float)exp2(-8.0 * (r + 1) / p);
    /* the rest: slopes 1, 3, 5, ... (0-based odd) of the 2p-head sequence */
    for (int r = p; r < n; r++) slopes[r] = (float)exp2(-8.0 * (2 * (r - p) + 1) / (2 * p));
}

mha_status mha_alibi_slopes(float *slopes, int n_heads) {
    if (!slopes) return mha_fail(MHA_E_ARG, "mha_alibi_slopes: slopes is NULL; expected (n_heads) floats");
    if (n_heads < 1) return mha_fail(MHA_E_ARG, "mha_alibi_slopes: n_heads=%d; expected >= 1", n_heads);
    mha_alibi_default_slopes(slopes, n_heads);
    return MHA_OK;
}

void mha_rope_frequencies(double *inv_freq, double *mscale, const mha_config *c, long long seq) {
    const mha_rope *rp = &c->rope;
    const int r = rp->dim, half = r / 2;
    const long long L = rp->original_max_positions;
    double theta = rp->theta;
    if (rp->scaling == MHA_ROPE_SCALE_DYNAMIC && seq > L) /* NTK: a larger base for a longer call */
        theta *= pow(rp->factor * (double)seq / (double)L - (rp->factor - 1.0), r / (r - 2.0));
    *mscale = 1.0;
    for (int i = 0; i < half; i++) inv_freq[i] = pow(theta, -2.0 * i / r);
    switch (rp->scaling) {
    case MHA_ROPE_SCALE_DYNAMIC: break;
    case MHA_ROPE_SCALE_LONGROPE: { /* searched factors per pair, the long ones past L */
        const float *ext = seq > L ? rp->long_factor : rp->short_factor;
        for (int i = 0; i < half; i++) inv_freq[i] /= ext[i];
        *mscale = rp->attn_factor;
        break;
    }
    case MHA_ROPE_SCALE_NONE: break;
    case MHA_ROPE_SCALE_LINEAR: /* position / factor */
        for (int i = 0; i < half; i++) inv_freq[i] /= rp->factor;
        break;
    case MHA_ROPE_SCALE_LLAMA3: { /* by wavelength: short kept, long / factor, a blend between */
        const double L = rp->original_max_positions;
        const double lo_wl = L / rp->low_freq_factor, hi_wl = L / rp->high_freq_factor;
        for (int i = 0; i < half; i++) {
            const double wl = 2.0 * M_PI / inv_freq[i];
            if (wl < hi_wl) continue;
            if (wl > lo_wl) { inv_freq[i] /= rp->factor; continue; }
            const double smooth = (L / wl - rp->low_freq_factor) / (rp->high_freq_factor - rp->low_freq_factor);
            inv_freq[i] = (1.0 - smooth) * inv_freq[i] / rp->factor + smooth * inv_freq[i];
        }
        break;
    }
    case MHA_ROPE_SCALE_YARN: { /* ramp over the dims whose rotations in L fall in [beta_slow, beta_fast] */
        const double L = rp->original_max_positions;
        /* the dim index at which a frequency turns `rot` times over L */
        #define YARN_DIM(rot) (r * log(L / ((rot) * 2.0 * M_PI)) / (2.0 * log(rp->theta)))
        double lo = floor(YARN_DIM(rp->beta_fast)), hi = ceil(YARN_DIM(rp->beta_slow));
        #undef YARN_DIM
        if (lo < 0) lo = 0;
        if (hi > r - 1) hi = r - 1;
        if (lo == hi) hi += 0.001;
        for (int i = 0; i < half; i++) {
            double ramp = (i - lo) / (hi - lo);
            ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
            const double keep = 1.0 - ramp; /* 1: extrapolate (high frequency), 0: interpolate */
            inv_freq[i] = inv_freq[i] / rp->factor * (1.0 - keep) + inv_freq[i] * keep;
        }
        *mscale = rp->attn_factor;
        break;
    }
    }
}

long long mha_rope_call_length(const mha_options *opt, int keys_are_x, int B, int T, int S) {
    long long last = (T > S ? T : S) - 1;
    if (opt->positions || opt->key_positions) {
        last = -1;
        for (int b = 0; b < B; b++) {
            for (int t = 0; t < T; t++) {
                const int p = mha_query_position(opt, b, t, T);
                if (p > last) last = p;
            }
            for (int j = 0; j < S; j++) {
                const int p = mha_key_position(opt, keys_are_x, b, j, S);
                if (p > last) last = p;
            }
        }
    }
    return last + 1;
}

float *mha_rope_table(const mha_config *c, const int *pos, int n, long long seq) {
    const int half = c->rope.dim / 2;
    double inv_freq[half > 0 ? half : 1], mscale;
    mha_rope_frequencies(inv_freq, &mscale, c, seq);
    float *tab = malloc(sizeof(float) * 2 * (size_t)n * half + 1); /* cos (n, r/2) | sin (n, r/2) */
    if (!tab) return NULL;
    for (int t = 0; t < n; t++)
        for (int i = 0; i < half; i++) {
            const double a = (double)(pos ? pos[t] : t) * inv_freq[i];
            tab[(size_t)t * half + i] = (float)(cos(a) * mscale);
            tab[((size_t)n + t) * half + i] = (float)(sin(a) * mscale);
        }
    return tab;
}

mha_status mha_query_temperatures(float **scales, const mha_config *c, const mha_options *opt, int B, int T,
                                  const char *who) {
    *scales = NULL;
    if (c->temperature_floor == 0) return MHA_OK;
    float *s = malloc(sizeof(float) * (size_t)B * T + 1);
    if (!s) return mha_fail(MHA_E_NOMEM, "%s: no memory for the queries' temperatures (B=%d T=%d)", who, B, T);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) s[(size_t)b * T + t] = (float)mha_query_temperature(c, mha_query_position(opt, b, t, T));
    *scales = s;
    return MHA_OK;
}

void mha_rope_rows_free(mha_rope_rows *rr) {
    free(rr->tab), free(rr->qrow);
    rr->tab = NULL, rr->qrow = rr->krow = NULL;
}

mha_status mha_rope_rows_make(mha_rope_rows *rr, const mha_config *c, const mha_options *opt, int keys_are_x,
                              int B, int T, int S, const char *who) {
    memset(rr, 0, sizeof *rr);
    if (c->rope.pairing == MHA_ROPE_NONE) return MHA_OK;
    const int explicit_pos = opt->positions || opt->key_positions;
    const size_t nq = (size_t)B * T, nk = (size_t)B * S;
    rr->qrow = malloc(sizeof(int) * (nq + nk)); /* then the positions, when explicit */
    int *pos = explicit_pos ? malloc(sizeof(int) * (nq + nk)) : NULL;
    if (!rr->qrow || (explicit_pos && !pos)) {
        free(pos), mha_rope_rows_free(rr);
        return mha_fail(MHA_E_NOMEM, "%s: no memory for the rotary rows (B=%d T=%d S=%d)", who, B, T, S);
    }
    rr->krow = rr->qrow + nq;
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            const size_t i = (size_t)b * T + t;
            rr->qrow[i] = explicit_pos ? (int)i : t;
            if (pos) pos[i] = mha_query_position(opt, b, t, T);
        }
        for (int j = 0; j < S; j++) {
            const size_t i = (size_t)b * S + j;
            rr->krow[i] = explicit_pos ? (int)(nq + i) : j;
            if (pos) pos[nq + i] = mha_key_position(opt, keys_are_x, b, j, S);
        }
    }
    rr->n = explicit_pos ? (int)(nq + nk) : (T > S ? T : S);
    rr->tab = mha_rope_table(c, pos, rr->n, mha_rope_call_length(opt, keys_are_x, B, T, S));
    free(pos);
    if (!rr->tab) {
        mha_rope_rows_free(rr);
        return mha_fail(MHA_E_NOMEM, "%s: no memory for the rotary table (%d positions)", who, rr->n);
    }
    return MHA_OK;
}

void mha_rope_rotate_double(double *x, const mha_config *c, const double *inv_freq, double mscale, int pos,
                            int transpose) {
    const int half = c->rope.dim / 2;
    for (int i = 0; i < half; i++) {
        const int ia = c->rope.pairing == MHA_ROPE_HALVES ? i : 2 * i;
        const int ib = c->rope.pairing == MHA_ROPE_HALVES ? i + half : 2 * i + 1;
        const double a = x[ia], b = x[ib], ang = pos * inv_freq[i];
        const double cs = cos(ang), sn = transpose ? -sin(ang) : sin(ang); /* R^T: the angle negated */
        x[ia] = (a * cs - b * sn) * mscale;
        x[ib] = (b * cs + a * sn) * mscale;
    }
}

/* QK-norm of one head row x (d) with weight w: RMSNorm x / sqrt(mean x^2 + eps) w,
 * or LayerNorm (x - mean) / sqrt(var + eps) w. */
static void norm_double(double *x, int d, const float *w, mha_qk_norm kind, double eps) {
    double mean = 0.0, var = 0.0;
    if (kind == MHA_QK_NORM_LAYER) {
        for (int e = 0; e < d; e++) mean += x[e];
        mean /= d;
    }
    for (int e = 0; e < d; e++) var += (x[e] - mean) * (x[e] - mean);
    var /= d;
    for (int e = 0; e < d; e++) x[e] = (x[e] - mean) / sqrt(var + eps) * w[e];
}

void mha_qk_transform_double(double *m, const mha_config *c, int B, int n, int heads, const float *w,
                             const mha_options *opt, int keys, int keys_are_x, int T, long long seq) {
    const int d = c->d_k, half = c->rope.dim / 2;
    double inv_freq[half > 0 ? half : 1], mscale = 1.0;
    if (c->rope.pairing != MHA_ROPE_NONE) mha_rope_frequencies(inv_freq, &mscale, c, seq);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < n; t++) {
            if (c->qk_norm_whole) /* OLMo 2: one norm over all heads of the token, weights (heads*d) */
                norm_double(m + ((size_t)b * n + t) * heads * d, heads * d, w, c->qk_norm, c->qk_norm_eps);
            for (int r = 0; r < heads; r++) {
                double *x = m + (((size_t)b * n + t) * heads + r) * d;
                if (c->qk_norm != MHA_QK_NORM_NONE && !c->qk_norm_whole)
                    norm_double(x, d, w + (c->qk_norm_per_head ? (size_t)r * d : 0), c->qk_norm, c->qk_norm_eps);
                const int pos = keys ? mha_key_position(opt, keys_are_x, b, t, n) : mha_query_position(opt, b, t, T);
                if (c->rope.pairing != MHA_ROPE_NONE) mha_rope_rotate_double(x, c, inv_freq, mscale, pos, 0);
                if (keys || c->temperature_floor == 0) continue;
                const double s = mha_query_temperature(c, pos); /* Llama 4: last, on queries only */
                for (int e = 0; e < d; e++) x[e] *= s;
            }
        }
}

void mha_qk_norm_stats(double st[2], const mha_config *c, double sum, double sumsq, int width) {
    const double mean = c->qk_norm == MHA_QK_NORM_LAYER ? sum / width : 0.0;
    const double var = sumsq / width - mean * mean;
    st[0] = mean, st[1] = 1.0 / sqrt((var > 0.0 ? var : 0.0) + c->qk_norm_eps);
}

void mha_qk_norm_rows_stats(double *st, const float *m, size_t n, size_t w, const mha_config *c, int nt) {
#pragma omp parallel for schedule(static) num_threads(nt)
    for (long t = 0; t < (long)n; t++) {
        double sum = 0.0, sq = 0.0;
        for (size_t e = 0; e < w; e++) {
            const double x = m[(size_t)t * w + e];
            sum += x, sq += x * x;
        }
        mha_qk_norm_stats(st + 2 * t, c, sum, sq, (int)w);
    }
}

/* x (d_k, stride st) <- norm(x) * w, accumulating in double; st2 (mean,
 * 1/sqrt(var + eps)) of the whole row when given (qk_norm_whole). */
static void norm_row(float *x, size_t st, int d, const float *w, mha_qk_norm kind, float eps, const double *st2) {
    double mean = 0.0, sq = 0.0, inv;
    if (st2) {
        mean = st2[0], inv = st2[1];
    } else {
        if (kind == MHA_QK_NORM_LAYER) {
            for (int e = 0; e < d; e++) mean += x[e * st];
            mean /= d;
        }
        for (int e = 0; e < d; e++) sq += ((double)x[e * st] - mean) * ((double)x[e * st] - mean);
        inv = 1.0 / sqrt(sq / d + eps);
    }
    for (int e = 0; e < d; e++) x[e * st] = (float)(((double)x[e * st] - mean) * inv) * w[e];
}

void mha_qk_transform(const mha_config *c, mha_head_rows rows, int n, const float *w, const double *stats,
                      const float *table, int tab_n, const int *tab_row, const float *row_scale) {
    const int half = c->rope.dim / 2, d = c->d_k;
    const size_t st = rows.elt_stride;
    /* halves pair dims i and i + r/2; interleaved 2i and 2i+1 */
    const size_t a_step = c->rope.pairing == MHA_ROPE_INTERLEAVED ? 2 : 1;
    const size_t b_off = c->rope.pairing == MHA_ROPE_INTERLEAVED ? 1 : (size_t)half;
    for (int t = 0; t < n; t++) {
        float *x = rows.x + (size_t)t * rows.row_stride;
        if (w) norm_row(x, st, d, w, c->qk_norm, c->qk_norm_eps, stats ? stats + 2 * (size_t)t : NULL);
        if (table) {
            const size_t tr = (size_t)(tab_row ? tab_row[t] : t);
            const float *cs = table + tr * half, *sn = table + ((size_t)tab_n + tr) * half;
            for (int i = 0; i < half; i++) {
                float *pa = x + i * a_step * st, *pb = x + (i * a_step + b_off) * st;
                const float a = *pa, b = *pb;
                *pa = a * cs[i] - b * sn[i];
                *pb = b * cs[i] + a * sn[i];
            }
        }
        for (int e = 0; row_scale && e < d; e++) x[e * st] *= row_scale[t]; /* the query temperature, last */
    }
}

static mha_status check_position_array(const int *p, size_t n, const char *name) {
    for (size_t i = 0; i < n; i++)
        if (p[i] < 0 || p[i] > MHA_MAX_POSITION)
            return mha_fail(MHA_E_ARG, "options.%s[%zu]=%d; expected a position in 0..%d", name, i, p[i],
                            MHA_MAX_POSITION);
    return MHA_OK;
}

mha_status mha_check_positions(const mha_config *c, const mha_options *o, int B, int T, int S) {
    if (!o->positions && !o->key_positions) return MHA_OK;
    if (c->rope.pairing == MHA_ROPE_NONE && !c->alibi && c->temperature_floor == 0)
        return mha_fail(MHA_E_ARG, "options.positions/key_positions given but the layer has neither rope, "
                        "alibi nor a query temperature; expected NULL");
    mha_status s = MHA_OK;
    if (o->positions) s = check_position_array(o->positions, (size_t)B * T, "positions");
    if (!s && o->key_positions) s = check_position_array(o->key_positions, (size_t)B * S, "key_positions");
    return s;
}

void mha_clip_double(double *a, size_t n, double clip) {
    for (size_t i = 0; i < n; i++) a[i] = a[i] < -clip ? -clip : a[i] > clip ? clip : a[i];
}

void mha_clip(float *a, size_t n, float clip, int n_threads) {
    n_threads = n >= ((size_t)1 << 16) ? n_threads : 1;
#pragma omp parallel for schedule(static) num_threads(n_threads)
    for (size_t i = 0; i < n; i++) a[i] = a[i] < -clip ? -clip : a[i] > clip ? clip : a[i];
}

void mha_gate_sigmoid(float *g, size_t n, int n_threads) {
    n_threads = n >= ((size_t)1 << 16) ? n_threads : 1;
#pragma omp parallel for schedule(static) num_threads(n_threads)
    for (size_t i = 0; i < n; i++) g[i] = 1.0f / (1.0f + expf(-g[i]));
}

void mha_gate_apply(float *z, const float *g, size_t n, int n_threads) {
    n_threads = n >= ((size_t)1 << 16) ? n_threads : 1;
#pragma omp parallel for schedule(static) num_threads(n_threads)
    for (size_t i = 0; i < n; i++) z[i] *= 1.0f / (1.0f + expf(-g[i]));
}
