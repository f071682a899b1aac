/* test_masks.c — every mask kind and alignment against the naive oracle and
 * against an equivalent formulation (causal == triangular keep mask, window
 * == band keep mask, key padding == broadcast keep mask, broadcast masks ==
 * expanded masks), and fully masked rows in both modes. */
#include <stdlib.h>
#include <string.h>

#include "naive.h"
#include "tests.h"

enum { B = 2, H = 2, DM = 8, DK = 4, DKV = 5 };

typedef struct {
    naive_weights w;
    mha_layer *L;
    float *x;  /* (B,T,DM)           */
    float *kv; /* (B,S,DKV) or NULL  */
    int T, S;
} fixture;

/* cross != 0: keys come from kv with d_kv_in = DKV; else self-attention. */
static int fixture_make(fixture *f, int T, int S, int cross, uint64_t seed) {
    mha_config c = mha_config_default(DM, H);
    c.bias = 1;
    if (cross) c.d_kv_in = DKV;
    c = naive_resolve(c);
    naive_weights_random(&f->w, &c, &seed, 0.8f);
    f->T = T, f->S = S;
    f->x = naive_random_floats((size_t)B * T * DM, &seed, -1.5f, 1.5f);
    f->kv = cross ? naive_random_floats((size_t)B * S * DKV, &seed, -1.5f, 1.5f) : NULL;
    f->L = naive_make_layer(&f->w);
    return f->L != NULL;
}

static void fixture_free(fixture *f) {
    mha_layer_free(f->L);
    naive_weights_free(&f->w);
    free(f->x), free(f->kv);
}

static size_t ny(const fixture *f) { return (size_t)B * f->T * DM; }
static size_t np(const fixture *f) { return (size_t)B * H * f->T * f->S; }

static void run(const fixture *f, const mha_options *o, float *y, float *z, float *probs) {
    mha_capture cap = {z, NULL, probs};
    CHECK_OK(mha_forward(f->L, y, &cap, f->x, f->kv, B, f->T, f->S, o));
}

/* max |difference| of y and probs between two option sets. */
static double diff_options(const fixture *f, const mha_options *a, const mha_options *b) {
    float *ya = naive_alloc_floats(ny(f)), *yb = naive_alloc_floats(ny(f));
    float *pa = naive_alloc_floats(np(f)), *pb = naive_alloc_floats(np(f));
    run(f, a, ya, NULL, pa);
    run(f, b, yb, NULL, pb);
    double d = test_max_abs_diff(ya, yb, ny(f)), dp = test_max_abs_diff(pa, pb, np(f));
    free(ya), free(yb), free(pa), free(pb);
    return d > dp ? d : dp;
}

static double vs_naive(const fixture *f, const mha_options *o) {
    return naive_compare(f->L, &f->w, f->x, f->kv, B, f->T, f->S, o);
}

/* keep (1,1,T,S) with keep[i][j] = lo <= j - i <= hi (bounds optional). */
static uint8_t *band_mask(int T, int S, int shift, int use_lo, int lo, int use_hi, int hi) {
    uint8_t *m = calloc((size_t)T * S, 1);
    for (int i = 0; i < T; i++)
        for (int j = 0; j < S; j++) {
            int d = j - (i + shift);
            m[i * S + j] = (!use_lo || d >= lo) && (!use_hi || d <= hi);
        }
    return m;
}

static void masks_causal_top_left_is_triangular(void) {
    fixture f;
    if (!fixture_make(&f, 6, 6, 0, 301)) return;
    mha_options causal = naive_ref_options(), keep = naive_ref_options();
    mha_options none = naive_ref_options();
    causal.causal = 1;
    uint8_t *m = band_mask(6, 6, 0, 0, 0, 1, 0); /* j <= i */
    keep.keep_mask = (mha_mask){m, 1, 1};
    CHECK(vs_naive(&f, &causal) <= 1e-5);
    CHECK(diff_options(&f, &causal, &keep) <= 1e-6);
    CHECK(diff_options(&f, &causal, &none) > 1e-3);
    free(m);
    fixture_free(&f);
}

static void masks_causal_alignments_cross(void) {
    fixture f;
    if (!fixture_make(&f, 3, 7, 1, 302)) return;
    mha_options tl = naive_ref_options(), br = naive_ref_options();
    mha_options ktl = naive_ref_options(), kbr = naive_ref_options();
    tl.causal = br.causal = 1;
    br.align = MHA_ALIGN_BOTTOM_RIGHT;
    uint8_t *mtl = band_mask(3, 7, 0, 0, 0, 1, 0), *mbr = band_mask(3, 7, 4, 0, 0, 1, 0);
    ktl.keep_mask = (mha_mask){mtl, 1, 1};
    kbr.keep_mask = (mha_mask){mbr, 1, 1};
    CHECK(vs_naive(&f, &tl) <= 1e-5);
    CHECK(vs_naive(&f, &br) <= 1e-5);
    CHECK(diff_options(&f, &tl, &ktl) <= 1e-6);
    CHECK(diff_options(&f, &br, &kbr) <= 1e-6);
    CHECK(diff_options(&f, &tl, &br) > 1e-3);
    /* bottom-right, last query sees every key: its probs equal the unmasked */
    float *p1 = naive_alloc_floats(np(&f)), *p2 = naive_alloc_floats(np(&f));
    float *y = naive_alloc_floats(ny(&f));
    mha_options none = naive_ref_options();
    run(&f, &br, y, NULL, p1);
    run(&f, &none, y, NULL, p2);
    for (int bh = 0; bh < B * H; bh++)
        CHECK_ARRAY_NEAR(p1 + (bh * 3 + 2) * 7, p2 + (bh * 3 + 2) * 7, 7, 1e-6);
    free(p1), free(p2), free(y), free(mtl), free(mbr);
    fixture_free(&f);
}

/* T > S, bottom-right: queries 0..T-S-1 sit before every key and get Z = 0. */
static void masks_causal_bottom_right_more_queries(void) {
    fixture f;
    if (!fixture_make(&f, 6, 3, 1, 303)) return;
    mha_options br = naive_ref_options();
    br.causal = 1;
    br.align = MHA_ALIGN_BOTTOM_RIGHT;
    CHECK(vs_naive(&f, &br) <= 1e-5);
    float *y = naive_alloc_floats(ny(&f)), *z = naive_alloc_floats((size_t)B * 6 * H * DK);
    run(&f, &br, y, z, NULL);
    for (int b = 0; b < B; b++)
        for (int i = 0; i < 3; i++) {
            for (int e = 0; e < H * DK; e++) CHECK_NEAR(z[(b * 6 + i) * H * DK + e], 0, 0);
            CHECK_ARRAY_NEAR(y + (b * 6 + i) * DM, f.w.b_o, DM, 1e-6);
        }
    free(y), free(z);
    fixture_free(&f);
}

/* A keep mask of each broadcast shape equals its expansion to (B,h,T,S). */
static void masks_keep_broadcasts(void) {
    fixture f;
    if (!fixture_make(&f, 5, 5, 0, 304)) return;
    const int T = 5, S = 5;
    uint64_t seed = 41;
    for (int mb = 1; mb <= B; mb += B - 1)
        for (int mh = 1; mh <= H; mh += H - 1) {
            size_t n = (size_t)mb * mh * T * S;
            float *u = naive_random_floats(n, &seed, 0, 1);
            uint8_t *m = malloc(n), *full = malloc((size_t)B * H * T * S);
            for (size_t i = 0; i < n; i++) m[i] = u[i] < 0.7f ? 1 : 0;
            for (int b = 0; b < B; b++)
                for (int r = 0; r < H; r++)
                    memcpy(full + ((size_t)b * H + r) * T * S,
                           m + ((size_t)(mb == 1 ? 0 : b) * mh + (mh == 1 ? 0 : r)) * T * S,
                           (size_t)T * S);
            mha_options a = naive_ref_options(), e = naive_ref_options();
            a.keep_mask = (mha_mask){m, mb, mh};
            e.keep_mask = (mha_mask){full, B, H};
            double dn = vs_naive(&f, &a), de = diff_options(&f, &a, &e);
            if (!(dn <= 1e-5) || !(de <= 1e-6))
                test_report(__FILE__, __LINE__, "keep mask (%d,%d): vs naive %.3g, vs expanded %.3g",
                            mb, mh, dn, de);
            free(u), free(m), free(full);
        }
    fixture_free(&f);
}

/* Additive masks with -INFINITY entries: each broadcast shape equals its
 * expansion, and -INF equals a keep-mask zero plus the finite remainder. */
static void masks_additive_broadcasts_and_neg_inf(void) {
    fixture f;
    if (!fixture_make(&f, 4, 6, 1, 305)) return;
    const int T = 4, S = 6;
    uint64_t seed = 42;
    for (int mb = 1; mb <= B; mb += B - 1)
        for (int mh = 1; mh <= H; mh += H - 1) {
            size_t n = (size_t)mb * mh * T * S, nf = (size_t)B * H * T * S;
            float *a = naive_random_floats(n, &seed, -2, 2);
            float *u = naive_random_floats(n, &seed, 0, 1);
            float *full = naive_alloc_floats(nf), *finite = naive_alloc_floats(n);
            uint8_t *keep = malloc(n);
            for (size_t i = 0; i < n; i++) {
                if (u[i] < 0.25f) a[i] = -INFINITY;
                keep[i] = u[i] >= 0.25f;
                finite[i] = keep[i] ? a[i] : 0.0f;
            }
            for (int b = 0; b < B; b++)
                for (int r = 0; r < H; r++)
                    memcpy(full + ((size_t)b * H + r) * T * S,
                           a + ((size_t)(mb == 1 ? 0 : b) * mh + (mh == 1 ? 0 : r)) * T * S,
                           (size_t)T * S * sizeof(float));
            mha_options o = naive_ref_options(), e = naive_ref_options(), k = naive_ref_options();
            o.additive_mask = (mha_mask){a, mb, mh};
            e.additive_mask = (mha_mask){full, B, H};
            k.keep_mask = (mha_mask){keep, mb, mh};
            k.additive_mask = (mha_mask){finite, mb, mh};
            double dn = vs_naive(&f, &o), de = diff_options(&f, &o, &e);
            double dk = diff_options(&f, &o, &k);
            if (!(dn <= 1e-5) || !(de <= 1e-6) || !(dk <= 1e-6))
                test_report(__FILE__, __LINE__,
                            "additive (%d,%d): vs naive %.3g, vs expanded %.3g, vs keep %.3g", mb,
                            mh, dn, de, dk);
            free(a), free(u), free(full), free(finite), free(keep);
        }
    fixture_free(&f);
}

/* Key padding: key_keep (B,S) equals a keep mask (B,1,T,S); key_additive
 * (B,S) equals an additive mask (B,1,T,S). */
static void masks_key_padding(void) {
    fixture f;
    if (!fixture_make(&f, 4, 6, 1, 306)) return;
    const int T = 4, S = 6;
    const uint8_t kk[B * 6] = {1, 1, 1, 1, 0, 0, 1, 0, 1, 1, 1, 0};
    uint8_t full[B * 4 * 6];
    float ka[B * 6], fa[B * 4 * 6];
    uint64_t seed = 43;
    test_fill_uniform(ka, B * S, &seed, -3, 3);
    ka[5] = -INFINITY;
    for (int b = 0; b < B; b++)
        for (int i = 0; i < T; i++)
            for (int j = 0; j < S; j++) {
                full[(b * T + i) * S + j] = kk[b * S + j];
                fa[(b * T + i) * S + j] = ka[b * S + j];
            }
    mha_options a = naive_ref_options(), e = naive_ref_options();
    a.key_keep = kk;
    e.keep_mask = (mha_mask){full, B, 1};
    CHECK(vs_naive(&f, &a) <= 1e-5);
    CHECK(diff_options(&f, &a, &e) <= 1e-6);
    float *y = naive_alloc_floats(ny(&f)), *p = naive_alloc_floats(np(&f));
    run(&f, &a, y, NULL, p);
    for (int b = 0; b < B; b++)
        for (int r = 0; r < H; r++)
            for (int i = 0; i < T; i++)
                for (int j = 0; j < S; j++)
                    if (!kk[b * S + j]) CHECK_NEAR(p[((b * H + r) * T + i) * S + j], 0, 0);
    a = naive_ref_options(), e = naive_ref_options();
    a.key_additive = ka;
    e.additive_mask = (mha_mask){fa, B, 1};
    CHECK(vs_naive(&f, &a) <= 1e-5);
    CHECK(diff_options(&f, &a, &e) <= 1e-6);
    free(y), free(p);
    fixture_free(&f);
}

/* Sliding windows (left, right) equal band keep masks, both alignments. */
static void masks_window_is_band(void) {
    const int lr[][2] = {{2, 0}, {1, 1}, {0, 2}, {-1, 1}, {2, -1}, {0, 0}, {3, 3}};
    const int shapes[][3] = {{7, 7, 0}, {3, 7, 1}, {7, 4, 1}}; /* T, S, cross */
    for (size_t s = 0; s < 3; s++) {
        fixture f;
        int T = shapes[s][0], S = shapes[s][1];
        if (!fixture_make(&f, T, S, shapes[s][2], 307 + s)) continue;
        for (int al = 0; al < 2; al++)
            for (size_t k = 0; k < sizeof lr / sizeof lr[0]; k++) {
                int l = lr[k][0], r = lr[k][1], shift = al ? S - T : 0;
                mha_options w = naive_ref_options(), e = naive_ref_options();
                w.window_left = l, w.window_right = r, w.align = (mha_align)al;
                uint8_t *m = band_mask(T, S, shift, l >= 0, -l, r >= 0, r);
                e.keep_mask = (mha_mask){m, 1, 1};
                double dn = vs_naive(&f, &w), de = diff_options(&f, &w, &e);
                if (!(dn <= 1e-5) || !(de <= 1e-6))
                    test_report(__FILE__, __LINE__,
                                "window (%d,%d) T=%d S=%d align=%d: vs naive %.3g, vs band %.3g",
                                l, r, T, S, al, dn, de);
                free(m);
            }
        fixture_free(&f);
    }
}

/* Every mask at once, GQA-free, against the oracle; masks combine by AND. */
static void masks_all_combined(void) {
    fixture f;
    if (!fixture_make(&f, 5, 8, 1, 310)) return;
    const int T = 5, S = 8;
    uint64_t seed = 44;
    float *u = naive_random_floats((size_t)B * H * T * S, &seed, 0, 1);
    float *add = naive_random_floats((size_t)H * T * S, &seed, -1, 1);
    float *kadd = naive_random_floats((size_t)B * S, &seed, -1, 1);
    uint8_t *keep = malloc((size_t)B * H * T * S), kk[B * 8];
    for (size_t i = 0; i < (size_t)B * H * T * S; i++) keep[i] = u[i] < 0.8f;
    for (int i = 0; i < B * S; i++) kk[i] = (i % 5) != 3;
    mha_options o = naive_ref_options();
    o.causal = 1, o.align = MHA_ALIGN_BOTTOM_RIGHT, o.window_left = 4, o.window_right = -1;
    o.keep_mask = (mha_mask){keep, B, H};
    o.additive_mask = (mha_mask){add, 1, H};
    o.key_keep = kk, o.key_additive = kadd;
    o.scale = 0.3f;
    CHECK(vs_naive(&f, &o) <= 1e-5);
    free(u), free(add), free(kadd), free(keep);
    fixture_free(&f);
}

/* One row with no allowed key: Z = 0 there (Y = b_O), probs 0; the other
 * rows are unaffected. Via a keep mask and via all -INF additive terms. */
static void masks_fully_masked_row_zero(void) {
    fixture f;
    if (!fixture_make(&f, 4, 4, 0, 311)) return;
    uint8_t keep[B * 4 * 4];
    float add[B * 4 * 4];
    memset(keep, 1, sizeof keep);
    for (int i = 0; i < B * 16; i++) add[i] = 0.0f;
    for (int j = 0; j < 4; j++) keep[(1 * 4 + 2) * 4 + j] = 0, add[(1 * 4 + 2) * 4 + j] = -INFINITY;
    for (int variant = 0; variant < 2; variant++) {
        mha_options o = naive_ref_options();
        if (variant == 0) o.keep_mask = (mha_mask){keep, B, 1};
        else o.additive_mask = (mha_mask){add, B, 1};
        CHECK(vs_naive(&f, &o) <= 1e-5);
        float y[B * 4 * DM], z[B * 4 * H * DK];
        run(&f, &o, y, z, NULL);
        for (int e = 0; e < H * DK; e++) CHECK_NEAR(z[(1 * 4 + 2) * H * DK + e], 0, 0);
        CHECK_ARRAY_NEAR(y + (1 * 4 + 2) * DM, f.w.b_o, DM, 1e-6);
        for (int i = 0; i < B * 4 * DM; i++) CHECK(isfinite(y[i]));
    }
    fixture_free(&f);
}

/* MHA_MASKED_ROW_NAN: that row is NaN (as PyTorch), the others unchanged. */
static void masks_fully_masked_row_nan(void) {
    fixture f;
    if (!fixture_make(&f, 4, 4, 0, 312)) return;
    uint8_t keep[B * 4 * 4];
    memset(keep, 1, sizeof keep);
    for (int j = 0; j < 4; j++) keep[(0 * 4 + 1) * 4 + j] = 0;
    mha_options o = naive_ref_options();
    o.keep_mask = (mha_mask){keep, B, 1};
    o.masked_row = MHA_MASKED_ROW_NAN;
    float y[B * 4 * DM], z[B * 4 * H * DK];
    double yd[B * 4 * DM];
    run(&f, &o, y, z, NULL);
    naive_forward(yd, NULL, NULL, &f.w, f.x, NULL, B, 4, 4, &o);
    for (int t = 0; t < B * 4; t++) {
        int masked = t == 1;
        for (int e = 0; e < DM; e++) {
            if (masked) CHECK(isnan(y[t * DM + e]));
            else CHECK_NEAR(y[t * DM + e], yd[t * DM + e], 1e-5);
        }
        for (int e = 0; e < H * DK; e++)
            if (masked) CHECK(isnan(z[t * H * DK + e]));
            else CHECK(isfinite(z[t * H * DK + e]));
    }
    fixture_free(&f);
}

static const test_case cases[] = {
    {"masks_causal_top_left_is_triangular", masks_causal_top_left_is_triangular},
    {"masks_causal_alignments_cross", masks_causal_alignments_cross},
    {"masks_causal_bottom_right_more_queries", masks_causal_bottom_right_more_queries},
    {"masks_keep_broadcasts", masks_keep_broadcasts},
    {"masks_additive_broadcasts_and_neg_inf", masks_additive_broadcasts_and_neg_inf},
    {"masks_key_padding", masks_key_padding},
    {"masks_window_is_band", masks_window_is_band},
    {"masks_all_combined", masks_all_combined},
    {"masks_fully_masked_row_zero", masks_fully_masked_row_zero},
    {"masks_fully_masked_row_nan", masks_fully_masked_row_nan},
};

const test_case *tests_masks(size_t *count) {
    *count = sizeof cases / sizeof cases[0];
    return cases;
}
