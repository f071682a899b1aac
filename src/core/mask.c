/* mask.c — which keys a query may attend: the one statement of the mask
 * semantics, shared by the reference and the fast path's general tiles;
 * and attention dropout's draw, which keys of a row it drops. */
#include <math.h>
#include <stdint.h>

#include "core/core.h"

/* The keys [*a, *z] that causal, the windows and the chunk allow for query i. */
static void window_interval(const mha_options *o, int i, int T, int S, long *lo, long *hi) {
    /* aligned position of query i on the key axis */
    long p = (long)i + (o->align == MHA_ALIGN_BOTTOM_RIGHT ? (long)S - T : 0);
    long a = 0, z = (long)S - 1;
    if (o->causal && p < z) z = p;
    if (o->window_left >= 0 && p - o->window_left > a) a = p - o->window_left;
    if (o->window_right >= 0 && p + o->window_right < z) z = p + o->window_right;
    if (o->chunk_size > 0) { /* the aligned query's chunk [c0, c0 + C) (floor: p may be < 0) */
        const long C = o->chunk_size, c0 = (p >= 0 ? p / C : -((-p + C - 1) / C)) * C;
        if (c0 > a) a = c0;
        if (c0 + C - 1 < z) z = c0 + C - 1;
    }
    if (o->cu_seqlens) { /* packed sequences (S = T): the query's own, [cu[s], cu[s+1]) */
        int lo_s = 0, hi_s = o->n_seqs - 1; /* the last s with cu[s] <= i */
        while (lo_s < hi_s) {
            const int mid = (lo_s + hi_s + 1) / 2;
            if (o->cu_seqlens[mid] <= i) lo_s = mid;
            else hi_s = mid - 1;
        }
        if (o->cu_seqlens[lo_s] > a) a = o->cu_seqlens[lo_s];
        if (o->cu_seqlens[lo_s + 1] - 1 < z) z = o->cu_seqlens[lo_s + 1] - 1;
    }
    *lo = a > S ? S : a, *hi = z < -1 ? -1 : z;
}

/* Sink keys (StreamingLLM) widen the interval to its hull from key 0;
 * mha_mask_key drops the keys between the sinks and the window. */
void mha_mask_interval(const mha_options *o, int i, int T, int S, int *lo, int *hi) {
    long a, z;
    window_interval(o, i, T, S, &a, &z);
    if (o->sink_tokens > 0 && o->window_left >= 0 && z >= 0) a = 0;
    *lo = (int)a, *hi = (int)z;
}

int mha_mask_key(const mha_options *o, int b, int r, int i, int j, int T, int S, double *additive) {
    *additive = 0.0;
    long lo, hi;
    window_interval(o, i, T, S, &lo, &hi);
    const int sink = o->window_left >= 0 && j < o->sink_tokens; /* kept besides the window */
    if ((j < lo && !sink) || j > hi) return 0;
    size_t ts = (size_t)T * S, ij = (size_t)i * S + j;
    if (o->keep_mask.data) {
        const uint8_t *m = o->keep_mask.data;
        size_t bh = (size_t)(o->keep_mask.batch == 1 ? 0 : b) * o->keep_mask.heads +
                    (o->keep_mask.heads == 1 ? 0 : r);
        if (!m[bh * ts + ij]) return 0;
    }
    if (o->key_keep && !o->key_keep[(size_t)b * S + j]) return 0;
    if (o->additive_mask.data) {
        const float *m = o->additive_mask.data;
        size_t bh = (size_t)(o->additive_mask.batch == 1 ? 0 : b) * o->additive_mask.heads +
                    (o->additive_mask.heads == 1 ? 0 : r);
        *additive += m[bh * ts + ij];
    }
    if (o->key_additive) *additive += o->key_additive[(size_t)b * S + j];
    /* -inf forbids exactly like a false keep bit, so fully masked rows are
     * detected the same way for both kinds of mask. The terms are summed in
     * double, but a score takes their sum in float (the fast path adds
     * (float)add, as PyTorch adds its fp32 masks): two finite terms whose sum
     * is below -FLT_MAX (HF's finfo.min in both masks) round to -inf there,
     * so they forbid the key here too. Judged in double, the reference kept
     * such a key and gave a fully masked row uniform weights where the fast
     * path gave zeros or NaN. (A sum beyond +FLT_MAX is refused by
     * mha_check_options.) */
    return isinf((float)*additive) ? 0 : 1;
}

/* The draw of one query row (b, r, i): splitmix64's finalizer at step
 * row + 1 of the Weyl sequence from seed (row = (b h + r) T + i); its top
 * 32 bits start the row's own Weyl sequence, its low 32 bits (made odd)
 * step it, and key j draws murmur3's 32-bit finalizer of start + j step:
 * counter-based, so the same whoever asks and in whatever order (tiles,
 * threads, ISAs); 32-bit lanes, so a row's keys vectorize. A step per
 * row: with one constant step each row's draw was a window of one
 * 2^32-long sequence, and rows starting fewer than S steps apart dropped
 * the same keys, shifted. */
typedef struct {
    uint32_t start, step;
} dropout_key;

static dropout_key dropout_row_key(unsigned long long seed, uint64_t row) {
    uint64_t x = seed + (row + 1) * 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    x ^= x >> 31;
    return (dropout_key){(uint32_t)(x >> 32), (uint32_t)x | 1u};
}

static inline uint32_t dropout_bits(dropout_key key, uint32_t j) {
    uint32_t x = key.start + j * key.step;
    x = (x ^ (x >> 16)) * 0x85EBCA6Bu;
    x = (x ^ (x >> 13)) * 0xC2B2AE35u;
    return x ^ (x >> 16);
}

/* p 2^32 rounded down: the draws below it are dropped (0 < p < 1). */
static uint32_t dropout_threshold(float p) { return (uint32_t)((double)p * 4294967296.0); }

double mha_dropout_factor(const mha_options *o, int h, int T, int b, int r, int i, int j) {
    if (o->dropout_p <= 0.0f) return 1.0;
    const dropout_key key = dropout_row_key(o->dropout_seed, ((uint64_t)b * h + r) * T + i);
    return dropout_bits(key, (uint32_t)j) >= dropout_threshold(o->dropout_p) ? 1.0 / (1.0 - (double)o->dropout_p) : 0.0;
}

void mha_dropout_row(float *p, int n, const mha_options *o, int h, int T, int b, int r, int i, int j0) {
    const dropout_key key = dropout_row_key(o->dropout_seed, ((uint64_t)b * h + r) * T + i);
    const uint32_t cut = dropout_threshold(o->dropout_p);
    const float keep = 1.0f / (1.0f - o->dropout_p);
#pragma omp simd
    for (int j = 0; j < n; j++) p[j] *= dropout_bits(key, (uint32_t)(j0 + j)) >= cut ? keep : 0.0f;
}
