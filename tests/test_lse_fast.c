/* test_lse_fast.c — mha_attend_lse's fast path (the fast backward's tiled
 * online softmax) against its double reference: z and lse within the
 * tolerance rule (fast error <= 2 x naive fp32 error + 1e-6, the naive
 * fp32 attention written here), across tiles (T, S > 96), GQA, causal,
 * windows, padding, (T,S) masks, fully masked rows and softcap;
 * bit-identical for 1 and 2 threads; out-of-range scores go to the
 * reference.
 * Legend: B, T, S, h, h_kv, d_k, d_v (see mha.h). */
#include <stdlib.h>
#include <string.h>

#include "naive.h"
#include "tests.h"

enum { B_ = 2, T_ = 130, S_ = 200, H_ = 4, HKV_ = 2, DK_ = 16, DV_ = 8 };

/* z (B,T,h*d_v), lse (B,h,T) in fp32: two-pass softmax per row with the
 * tests' own mask rule (naive_key_allowed); -inf lse (z 0) when no key;
 * scores cap tanh(s / cap) when cap != 0 (Gemma 2's soft-capping). */
static void naive32_attend(float *z, float *lse, const float *q, const float *k, const float *v, float cap,
                           const mha_options *o) {
    const float scale = 1.0f / sqrtf((float)DK_);
    float s[S_];
    for (int b = 0; b < B_; b++)
        for (int r = 0; r < H_; r++)
            for (int i = 0; i < T_; i++) {
                const int g = r / (H_ / HKV_);
                const float *qi = q + ((size_t)b * T_ + i) * H_ * DK_ + r * DK_;
                float *zi = z + ((size_t)b * T_ + i) * H_ * DV_ + r * DV_, m = -INFINITY, sum = 0.0f;
                for (int j = 0; j < S_; j++) {
                    double add = 0.0;
                    s[j] = -INFINITY;
                    if (!naive_key_allowed(o, b, r, i, j, T_, S_, &add)) continue;
                    const float *kj = k + ((size_t)b * S_ + j) * HKV_ * DK_ + g * DK_;
                    float dot = 0.0f;
                    for (int e = 0; e < DK_; e++) dot += qi[e] * kj[e];
                    s[j] = scale * dot;
                    if (cap != 0.0f) s[j] = cap * tanhf(s[j] / cap);
                    s[j] += (float)add;
                    if (s[j] > m) m = s[j];
                }
                for (int e = 0; e < DV_; e++) zi[e] = 0.0f;
                float *li = lse + ((size_t)b * H_ + r) * T_ + i;
                if (m == -INFINITY) {
                    *li = -INFINITY;
                    continue;
                }
                for (int j = 0; j < S_; j++) sum += s[j] = s[j] == -INFINITY ? 0.0f : expf(s[j] - m);
                *li = m + logf(sum);
                for (int j = 0; j < S_; j++)
                    for (int e = 0; s[j] != 0.0f && e < DV_; e++)
                        zi[e] += s[j] / sum * v[((size_t)b * S_ + j) * HKV_ * DV_ + g * DV_ + e];
            }
}

/* max |a - b|; equal values (infinities, NaNs in both) count 0, a NaN or
 * an infinity in one only counts INFINITY. */
static double diff(const float *a, const float *b, size_t n) {
    double m = 0.0;
    for (size_t i = 0; i < n; i++) {
        if (a[i] == b[i] || (isnan(a[i]) && isnan(b[i]))) continue;
        double d = fabs((double)a[i] - (double)b[i]);
        if (!(d <= m)) m = d;
    }
    return isnan(m) ? INFINITY : m;
}

typedef struct {
    mha_config c;
    float *q, *k, *v;                  /* (B,T,h*d_k), (B,S,h_kv*d_k), (B,S,h_kv*d_v) */
    uint8_t keep[B_ * S_];             /* key padding: batch 1 keys 10..19 only      */
    float *add;                        /* (1,1,T,S) additive mask                   */
} fixture;

static void fixture_make(fixture *f, uint64_t seed) {
    f->c = mha_config_default(H_ * DK_, H_);
    f->c.n_kv_heads = HKV_, f->c.d_k = DK_, f->c.d_v = DV_;
    f->q = naive_random_floats((size_t)B_ * T_ * H_ * DK_, &seed, -1.0f, 1.0f);
    f->k = naive_random_floats((size_t)B_ * S_ * HKV_ * DK_, &seed, -1.0f, 1.0f);
    f->v = naive_random_floats((size_t)B_ * S_ * HKV_ * DV_, &seed, -1.0f, 1.0f);
    f->add = naive_random_floats((size_t)T_ * S_, &seed, -2.0f, 2.0f);
    for (int i = 0; i < T_; i++) f->add[(size_t)i * S_ + (i * 7) % S_] = -INFINITY;
    for (int j = 0; j < B_ * S_; j++) f->keep[j] = j < S_ ? (j % 5 != 3) : (j - S_ >= 10 && j - S_ < 20);
}

static void fixture_free(fixture *f) { free(f->q), free(f->k), free(f->v), free(f->add); }

/* One option set: FAST vs REFERENCE vs naive fp32, z and lse. */
static void check_case(const fixture *f, const char *what, mha_options o) {
    const size_t nz = (size_t)B_ * T_ * H_ * DV_, nl = (size_t)B_ * H_ * T_;
    float *zf = naive_alloc_floats(nz), *zr = naive_alloc_floats(nz), *zn = naive_alloc_floats(nz);
    float *lf = naive_alloc_floats(nl), *lr = naive_alloc_floats(nl), *ln = naive_alloc_floats(nl);
    o.path = MHA_PATH_FAST;
    CHECK_OK(mha_attend_lse(&f->c, zf, lf, f->q, f->k, f->v, B_, T_, S_, &o));
    o.path = MHA_PATH_REFERENCE;
    CHECK_OK(mha_attend_lse(&f->c, zr, lr, f->q, f->k, f->v, B_, T_, S_, &o));
    naive32_attend(zn, ln, f->q, f->k, f->v, f->c.softcap, &o);
    if (o.masked_row == MHA_MASKED_ROW_NAN) /* the naive one writes 0: compare z where a key exists */
        for (size_t i = 0; i < nz; i++)
            if (isnan(zr[i])) zn[i] = NAN;
    const double ezf = diff(zf, zr, nz), ezn = diff(zn, zr, nz), elf = diff(lf, lr, nl), eln = diff(ln, lr, nl);
    if (!(ezn <= 1e-5 && eln <= 1e-5))
        test_report(__FILE__, __LINE__, "%s: the naive fp32 attention is off (z %.3g, lse %.3g)", what, ezn, eln);
    if (!(ezf <= 2.0 * ezn + 1e-6 && elf <= 2.0 * eln + 1e-6))
        test_report(__FILE__, __LINE__, "%s: fast vs reference z %.3g (naive %.3g), lse %.3g (naive %.3g)", what,
                    ezf, ezn, elf, eln);
    /* masked rows: -inf in both (diff counts an infinity on one side only) */
    size_t masked = 0;
    for (size_t i = 0; i < nl; i++) masked += lr[i] == -INFINITY;
    if (o.key_keep) CHECK(masked >= (size_t)H_ * 10); /* batch 1, causal: rows 0..9 see no key */
    free(zf), free(zr), free(zn), free(lf), free(lr), free(ln);
}

static void lse_fast_matches_reference(void) {
    fixture f;
    fixture_make(&f, 1501);
    mha_options o = mha_options_default();
    check_case(&f, "no mask", o);
    o.causal = 1, o.align = MHA_ALIGN_BOTTOM_RIGHT;
    check_case(&f, "causal bottom-right", o);
    o = mha_options_default();
    o.causal = 1, o.key_keep = f.keep;
    check_case(&f, "causal top-left + padding (masked rows)", o);
    o.masked_row = MHA_MASKED_ROW_NAN;
    check_case(&f, "the same, NaN rows", o);
    o = mha_options_default();
    o.window_left = 20, o.window_right = 5, o.additive_mask = (mha_mask){f.add, 1, 1};
    check_case(&f, "window + additive (T,S) mask", o);
    f.c.softcap = 0.3f; /* scores reach ~1.5: well into tanh's curve */
    o = mha_options_default();
    o.causal = 1, o.key_keep = f.keep;
    check_case(&f, "softcap, causal + padding", o);
    fixture_free(&f);
}

/* Two outputs of one call shape: z[i] (B,T,h*d_v), l[i] (B,h,T). */
enum { NZ = B_ * T_ * H_ * DV_, NL = B_ * H_ * T_ };
typedef struct {
    float *z[2], *l[2];
} two_outputs;

static two_outputs two_alloc(void) {
    return (two_outputs){{naive_alloc_floats(NZ), naive_alloc_floats(NZ)}, {naive_alloc_floats(NL), naive_alloc_floats(NL)}};
}

/* Both outputs hold the same bits. */
static void two_check_same(const two_outputs *t) {
    CHECK(memcmp(t->z[0], t->z[1], sizeof(float) * NZ) == 0);
    CHECK(memcmp(t->l[0], t->l[1], sizeof(float) * NL) == 0);
}

static void two_free(two_outputs *t) { free(t->z[0]), free(t->z[1]), free(t->l[0]), free(t->l[1]); }

/* 1 and 2 threads: the same bits (each row one task, fixed order). */
static void lse_fast_thread_count_free(void) {
    fixture f;
    fixture_make(&f, 1502);
    two_outputs t = two_alloc();
    mha_options o = mha_options_default();
    o.path = MHA_PATH_FAST, o.causal = 1, o.key_keep = f.keep;
    const int saved = mha_get_num_threads();
    for (int i = 0; i < 2; i++) {
        mha_set_num_threads(i + 1);
        CHECK_OK(mha_attend_lse(&f.c, t.z[i], t.l[i], f.q, f.k, f.v, B_, T_, S_, &o));
    }
    mha_set_num_threads(saved);
    two_check_same(&t);
    two_free(&t);
    fixture_free(&f);
}

/* scores beyond the fast range: FAST refuses, AUTO gives the reference's
 * bits. */
static void lse_fast_falls_back(void) {
    fixture f;
    fixture_make(&f, 1503);
    two_outputs t = two_alloc();
    mha_options o = mha_options_default();
    for (int round = 0; round < 2; round++) {
        f.c.softcap = round == 0 ? 0.0f : 5.0f; /* softcap is no way around the range rule */
        f.q[0] = 3e5f;                           /* one row's scores beyond MHA_FAST_SCORE_LIMIT */
        o.path = MHA_PATH_FAST;
        CHECK_STATUS(mha_attend_lse(&f.c, t.z[0], t.l[0], f.q, f.k, f.v, B_, T_, S_, &o), MHA_E_UNSUPPORTED);
        CHECK_ERROR_MENTIONS("beyond");
        o.path = MHA_PATH_AUTO;
        CHECK_OK(mha_attend_lse(&f.c, t.z[0], t.l[0], f.q, f.k, f.v, B_, T_, S_, &o));
        o.path = MHA_PATH_REFERENCE;
        CHECK_OK(mha_attend_lse(&f.c, t.z[1], t.l[1], f.q, f.k, f.v, B_, T_, S_, &o));
        two_check_same(&t);
    }
    two_free(&t);
    fixture_free(&f);
}

static const test_case cases[] = {
    {"lse_fast_matches_reference", lse_fast_matches_reference},
    {"lse_fast_thread_count_free", lse_fast_thread_count_free},
    {"lse_fast_falls_back", lse_fast_falls_back},
};

const test_case *tests_lse_fast(size_t *count) {
    *count = sizeof cases / sizeof cases[0];
    return cases;
}
