/* test_variants_io.c — today's attention variants in checkpoints
 * (src/io/variants_meta.c): every setting and per-head tensor survives a
 * native round trip (the reloaded layer has the same config, the same
 * per-head tensors and the same Y bit for bit), the hf layout finds
 * Qwen 3's q_norm.weight / k_norm.weight, every damaged metadata value
 * or tensor is refused with a message naming it, and the numbers read the
 * same under any locale.
 * Legend: d_model 8, h 4 heads, h_kv 2, d_k 4; B 1, T 5. */
#include <float.h>
#include <locale.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "naive.h"
#include "tests.h"

enum { D = 8, H = 4, HKV = 2, DK = 4, T = 5 };

/* The per-head tensors a variant layer needs, deterministic. */
typedef struct {
    float slopes[H], sinks[H], q_norm[H * DK], k_norm[HKV * DK];
} head_params;

static void head_params_fill(head_params *p, uint64_t *seed) {
    test_fill_uniform(p->slopes, H, seed, 0.05f, 0.5f);
    test_fill_uniform(p->sinks, H, seed, -1.0f, 1.0f);
    test_fill_uniform(p->q_norm, H * DK, seed, 0.5f, 1.5f);
    test_fill_uniform(p->k_norm, HKV * DK, seed, 0.5f, 1.5f);
}

/* A layer of config c (already holding its variant settings) with random
 * projections and p's per-head tensors where c asks for them. */
static mha_layer *variant_layer(const mha_config *c, const head_params *p, uint64_t *seed) {
    mha_config r = naive_resolve(*c);
    naive_weights w;
    naive_weights_random(&w, &r, seed, 0.5f);
    mha_weights v = naive_weights_view(&w);
    if (c->alibi) v.alibi_slopes = p->slopes;
    if (c->sinks) v.sinks = p->sinks;
    if (c->qk_norm) v.q_norm = p->q_norm, v.k_norm = p->k_norm;
    mha_layer *L = NULL;
    CHECK_OK(mha_layer_create(&L, c, &v));
    naive_weights_free(&w);
    return L;
}

static mha_config base_config(void) { return naive_config(D, H, HKV, DK, 0, 1); }

/* Y of L on a fixed input through the reference path. */
static void forward_ref(const mha_layer *L, float *y) {
    float x[T * D];
    uint64_t seed = 9;
    test_fill_uniform(x, T * D, &seed, -1.0f, 1.0f);
    mha_options o = naive_ref_options();
    o.causal = 1;
    CHECK_OK(mha_forward(L, y, NULL, x, NULL, 1, T, T, &o));
}

static int same_floats(const float *a, const float *b, size_t n) {
    if (!a || !b) return a == b;
    return memcmp(a, b, n * sizeof(float)) == 0;
}

/* t, read back as a native layer, is L: same config, same per-head
 * tensors, same Y bits */
static void check_reads_back(const mha_tensors *t, const mha_layer *L) {
    mha_layer *back = NULL;
    mha_load_options lo = {.layout = MHA_LAYOUT_NATIVE};
    CHECK_OK(mha_layer_from_tensors(&back, t, &lo));
    if (back) {
        const mha_config *a = mha_layer_config(L), *b = mha_layer_config(back);
        CHECK(a->rope.pairing == b->rope.pairing && a->rope.dim == b->rope.dim && a->rope.theta == b->rope.theta);
        CHECK(a->rope.scaling == b->rope.scaling && a->rope.factor == b->rope.factor);
        CHECK(a->rope.low_freq_factor == b->rope.low_freq_factor && a->rope.high_freq_factor == b->rope.high_freq_factor);
        CHECK(a->rope.original_max_positions == b->rope.original_max_positions);
        CHECK(a->rope.beta_fast == b->rope.beta_fast && a->rope.beta_slow == b->rope.beta_slow &&
              a->rope.attn_factor == b->rope.attn_factor);
        CHECK(memcmp(a->rope.short_factor, b->rope.short_factor, sizeof a->rope.short_factor) == 0 &&
              memcmp(a->rope.long_factor, b->rope.long_factor, sizeof a->rope.long_factor) == 0);
        CHECK(a->alibi == b->alibi && a->sinks == b->sinks && a->softcap == b->softcap);
        CHECK(a->clip_qkv == b->clip_qkv);
        CHECK(a->temperature_floor == b->temperature_floor && a->temperature_scale == b->temperature_scale &&
              a->temperature_rule == b->temperature_rule);
        CHECK(a->qk_norm == b->qk_norm && a->qk_norm_per_head == b->qk_norm_per_head &&
              a->qk_norm_eps == b->qk_norm_eps);
        mha_weights wa, wb;
        mha_layer_get_weights(L, &wa);
        mha_layer_get_weights(back, &wb);
        const size_t nq = (size_t)(a->qk_norm_per_head ? H : 1) * DK, nk = (size_t)(a->qk_norm_per_head ? HKV : 1) * DK;
        CHECK(same_floats(wa.alibi_slopes, wb.alibi_slopes, H) && same_floats(wa.sinks, wb.sinks, H));
        CHECK(same_floats(wa.q_norm, wb.q_norm, nq) && same_floats(wa.k_norm, wb.k_norm, nk));
        float y1[T * D], y2[T * D];
        forward_ref(L, y1);
        forward_ref(back, y2);
        CHECK(memcmp(y1, y2, sizeof y1) == 0);
    }
    mha_layer_free(back);
}

/* native round trip of L */
static void check_round_trip(const mha_layer *L) {
    mha_tensors *t = NULL;
    CHECK_OK(mha_layer_to_tensors(&t, L));
    if (t) check_reads_back(t, L);
    mha_tensors_free(t);
}

static void test_variants_native_round_trip(void) {
    uint64_t seed = 71;
    head_params p;
    head_params_fill(&p, &seed);
    mha_config c[11];
    for (int i = 0; i < 11; i++) c[i] = base_config();
    /* Llama 3.1-like: halves, theta 500000, llama3 scaling */
    c[0].rope = (mha_rope){MHA_ROPE_HALVES, 0, 500000.0, MHA_ROPE_SCALE_LLAMA3, 8.0, 1.0, 4.0, 64, 0, 0, 0, {0}, {0}};
    /* GPT-J-like partial interleaved with YaRN, shared RMS QK-norm */
    c[1].rope = (mha_rope){MHA_ROPE_INTERLEAVED, 2, 10000.0, MHA_ROPE_SCALE_YARN, 4.0, 0, 0, 32, 16.0, 2.0, 1.25, {0}, {0}};
    c[1].qk_norm = MHA_QK_NORM_RMS, c[1].qk_norm_eps = 1e-5f;
    /* BLOOM-like ALiBi with Gemma 2 soft-capping */
    c[2].alibi = 1, c[2].softcap = 30.0f;
    /* gpt-oss-like sinks with per-head LayerNorm QK-norm and linear RoPE */
    c[3].sinks = 1, c[3].qk_norm = MHA_QK_NORM_LAYER, c[3].qk_norm_per_head = 1;
    c[3].rope = (mha_rope){MHA_ROPE_HALVES, 0, 0.0, MHA_ROPE_SCALE_LINEAR, 2.0, 0, 0, 0, 0, 0, 0, {0}, {0}};
    /* everything at once (ALiBi and RoPE may coexist in the API) */
    c[4] = c[3], c[4].alibi = 1, c[4].softcap = 5.0f;
    /* Phi-3-like LongRoPE (factors that need all 9 digits) and dynamic NTK */
    c[5].rope = (mha_rope){MHA_ROPE_HALVES, 0, 10000.0, MHA_ROPE_SCALE_LONGROPE, 32.0, 0, 0, 4, 0, 0, 0, {0}, {0}};
    for (int i = 0; i < DK / 2; i++)
        c[5].rope.short_factor[i] = 1.0f + 0.1234567f * i, c[5].rope.long_factor[i] = 1.0f / 3.0f + 7.0f * i;
    c[6].rope = (mha_rope){MHA_ROPE_INTERLEAVED, 0, 500.0, MHA_ROPE_SCALE_DYNAMIC, 2.0, 0, 0, 4, 0, 0, 0, {0}, {0}};
    /* OLMo 1 / DBRX: clip_qkv with RoPE (a bound with no short decimal form) */
    c[7].clip_qkv = 0.3f, c[7].rope.pairing = MHA_ROPE_HALVES;
    /* Llama 4's NoPE layer: the query temperature (a floor of 2 so T's queries see three factors) */
    c[8].temperature_floor = 2, c[8].temperature_scale = 0.1f;
    /* Ministral 3's: every layer rotates, the rule floor(p / F) */
    c[9] = c[8], c[9].temperature_rule = MHA_TEMPERATURE_MINISTRAL3, c[9].rope.pairing = MHA_ROPE_HALVES;
    /* the largest bound float holds: written as 3.40282347e+38, read back (it was refused above 3e38) */
    c[10].clip_qkv = FLT_MAX;
    for (int i = 0; i < 11; i++) {
        mha_layer *L = variant_layer(&c[i], &p, &seed);
        if (L) check_round_trip(L);
        mha_layer_free(L);
    }
}

/* Numbers in files do not follow the caller's locale: a layer written
 * under a decimal-comma locale (de_DE, set for this thread alone) reads
 * back under the C locale, and one written under C reads back under
 * de_DE; the metadata says "1.25" either way. */
static void test_variants_locale_independent(void) {
    locale_t comma = newlocale(LC_NUMERIC_MASK, "de_DE.UTF-8", (locale_t)0);
    if (!comma) SKIP(TEST_SKIP_DEPENDENCY, NULL, "no de_DE.UTF-8 locale (scripts/setup.sh test makes it)");
    uint64_t seed = 73;
    head_params p;
    head_params_fill(&p, &seed);
    mha_config c = base_config(); /* fractional theta, YaRN factors, eps, soft-cap */
    c.rope = (mha_rope){MHA_ROPE_INTERLEAVED, 2, 10000.5, MHA_ROPE_SCALE_YARN, 4.0, 0, 0, 32, 16.0, 2.0, 1.25, {0}, {0}};
    c.qk_norm = MHA_QK_NORM_RMS, c.qk_norm_eps = 1e-5f, c.softcap = 30.5f;
    mha_layer *L = variant_layer(&c, &p, &seed);
    mha_tensors *in_de = NULL, *in_c = NULL;
    locale_t before = uselocale(comma);
    char probe[8];
    snprintf(probe, sizeof probe, "%.2f", 1.25);
    CHECK(strcmp(probe, "1,25") == 0); /* the comma locale is in force */
    if (L) CHECK_OK(mha_layer_to_tensors(&in_de, L));
    uselocale(before);
    if (L) CHECK_OK(mha_layer_to_tensors(&in_c, L));
    if (in_de && in_c) {
        const char *v = mha_tensors_meta(in_de, "rope_attn_factor");
        CHECK(v && strcmp(v, "1.25") == 0);
        check_reads_back(in_de, L); /* written under de_DE, read under C */
        uselocale(comma);
        check_reads_back(in_c, L); /* written under C, read under de_DE */
        uselocale(before);
    }
    mha_tensors_free(in_de);
    mha_tensors_free(in_c);
    mha_layer_free(L);
    freelocale(comma);
}

/* the native tensors of a layer with every variant, metadata entry `key`
 * set to `value` (NULL: removed by not copying), tensor `drop` left out */
static mha_tensors *spoiled(const mha_layer *L, const char *key, const char *value, const char *drop) {
    mha_tensors *t = NULL, *o = NULL;
    CHECK_OK(mha_layer_to_tensors(&t, L));
    CHECK_OK(mha_tensors_create(&o));
    for (int i = 0; t && o && i < mha_tensors_count(t); i++) {
        const char *name = mha_tensors_name(t, i);
        if (drop && !strcmp(name, drop)) continue;
        CHECK_OK(mha_tensors_add(o, name, mha_tensors_get(t, name)));
    }
    for (int i = 0; t && o && i < mha_tensors_meta_count(t); i++) {
        const char *k = mha_tensors_meta_key(t, i);
        CHECK_OK(mha_tensors_set_meta(o, k, !strcmp(k, key) ? value : mha_tensors_meta(t, k)));
    }
    if (key && !mha_tensors_meta(o, key)) CHECK_OK(mha_tensors_set_meta(o, key, value));
    mha_tensors_free(t);
    return o;
}

static void expect_refused(const mha_layer *L, const char *key, const char *value, const char *drop,
                           mha_status want, const char *mention) {
    mha_tensors *t = spoiled(L, key, value, drop);
    mha_layer *back = NULL;
    mha_load_options lo = {.layout = MHA_LAYOUT_NATIVE};
    CHECK_STATUS(mha_layer_from_tensors(&back, t, &lo), want);
    CHECK_ERROR_MENTIONS(mention);
    CHECK(back == NULL);
    mha_layer_free(back);
    mha_tensors_free(t);
}

static void test_variants_native_refusals(void) {
    uint64_t seed = 72;
    head_params p;
    head_params_fill(&p, &seed);
    mha_config c = base_config();
    c.rope = (mha_rope){MHA_ROPE_HALVES, 0, 10000.0, MHA_ROPE_SCALE_YARN, 4.0, 0, 0, 32, 0, 0, 0, {0}, {0}};
    c.alibi = 1, c.sinks = 1, c.qk_norm = MHA_QK_NORM_RMS, c.qk_norm_per_head = 1;
    mha_layer *L = variant_layer(&c, &p, &seed);
    if (!L) return;
    expect_refused(L, "rope", "sideways", NULL, MHA_E_FORMAT, "metadata rope = 'sideways'; expected halves or interleaved");
    expect_refused(L, "rope_scaling", "ntk", NULL, MHA_E_FORMAT, "expected none, linear, llama3, yarn, dynamic or "
                   "longrope");
    expect_refused(L, "rope_short_factor", "1,2,x", NULL, MHA_E_FORMAT, "metadata rope_short_factor: item 2 is not a "
                   "finite number");
    char many[4 * (MHA_ROPE_MAX_PAIRS + 1) + 1] = "";
    for (int i = 0; i <= MHA_ROPE_MAX_PAIRS; i++) strcat(many, i ? ",1.5" : "1.5");
    expect_refused(L, "rope_long_factor", many, NULL, MHA_E_FORMAT, "item 128 is one too many");
    expect_refused(L, "rope_long_factor", "1,,2", NULL, MHA_E_FORMAT, "rope_long_factor: item 1 is not a finite");
    /* factors with another scaling: the library's rule, named */
    expect_refused(L, "rope_short_factor", "1,2", NULL, MHA_E_ARG, "rope.short_factor/long_factor[0] set with "
                   "rope.scaling=3");
    expect_refused(L, "qk_norm", "batch", NULL, MHA_E_FORMAT, "expected none, rms or layer");
    expect_refused(L, "rope_theta", "1e5x", NULL, MHA_E_FORMAT, "metadata rope_theta = '1e5x'; expected a finite number");
    expect_refused(L, "rope_factor", "inf", NULL, MHA_E_FORMAT, "rope_factor = 'inf'; expected a finite number");
    expect_refused(L, "alibi", "2", NULL, MHA_E_FORMAT, "metadata alibi = '2'; expected 0 or 1");
    expect_refused(L, "rope_dim", "-2", NULL, MHA_E_FORMAT, "is negative or too large");
    expect_refused(L, "softcap", "-1", NULL, MHA_E_FORMAT, "is negative or too large");
    expect_refused(L, "clip_qkv", "-1", NULL, MHA_E_FORMAT, "metadata clip_qkv = '-1'; expected 0 (none) or the bound");
    expect_refused(L, "clip_qkv", "nan", NULL, MHA_E_FORMAT, "metadata clip_qkv = 'nan'; expected a finite number");
    expect_refused(L, "clip_qkv", "1e39", NULL, MHA_E_FORMAT, "metadata clip_qkv = '1e39'; expected 0 (none)");
    expect_refused(L, "temperature_floor", "8192", NULL, MHA_E_FORMAT, "metadata temperature_floor = '8192', "
                   "temperature_scale = ''; expected both absent (none)");
    expect_refused(L, "temperature_scale", "0.1", NULL, MHA_E_FORMAT, "temperature_floor = '', temperature_scale = '0.1'");
    expect_refused(L, "temperature_rule", "qwen", NULL, MHA_E_FORMAT, "metadata temperature_rule = 'qwen'; expected "
                   "llama4 or ministral3");
    mha_tensors *tt = spoiled(L, "temperature_floor", "8192.5", NULL);
    mha_layer *tback = NULL;
    mha_load_options nlo = {.layout = MHA_LAYOUT_NATIVE};
    if (tt) CHECK_OK(mha_tensors_set_meta(tt, "temperature_scale", "0.1"));
    CHECK_STATUS(mha_layer_from_tensors(&tback, tt, &nlo), MHA_E_FORMAT); /* a floor is a whole number */
    CHECK_ERROR_MENTIONS("temperature_floor = '8192.5'");
    mha_layer_free(tback), mha_tensors_free(tt);
    expect_refused(L, "sinks", "1", "sinks", MHA_E_FORMAT, "metadata sinks = 1 but the checkpoint has no sinks tensor");
    expect_refused(L, "qk_norm", "rms", "k_norm", MHA_E_FORMAT, "qk_norm is set but the checkpoint lacks k_norm");
    /* a per-head tensor of the wrong size */
    mha_tensors *t = spoiled(L, "alibi", "1", "sinks");
    float wrong[H + 1] = {0};
    int n = H + 1;
    CHECK_OK(mha_tensors_add_f32(t, "sinks", wrong, 1, &n));
    mha_layer *back = NULL;
    mha_load_options lo = {.layout = MHA_LAYOUT_NATIVE};
    CHECK_STATUS(mha_layer_from_tensors(&back, t, &lo), MHA_E_SHAPE);
    CHECK_ERROR_MENTIONS("tensor sinks has 5 elements of rank 1; expected (h) per head");
    mha_tensors_free(t);
    mha_layer_free(L);
}

/* hf (Llama / Qwen 3 names): q_norm.weight and k_norm.weight of (d_k)
 * switch RMS QK-norm on; (h*d_k) and (h_kv*d_k) ones (OLMo 2) a norm over
 * the whole width. Y matches the same layer built through the API. */
static void test_variants_hf_qk_norm(void) {
    uint64_t seed = 73;
    mha_config c = naive_config(D, H, HKV, DK, 0, 0);
    mha_config r = naive_resolve(c);
    naive_weights w;
    naive_weights_random(&w, &r, &seed, 0.5f);
    float qn[DK], kn[DK], big[H * DK];
    test_fill_uniform(qn, DK, &seed, 0.5f, 1.5f);
    test_fill_uniform(kn, DK, &seed, 0.5f, 1.5f);
    test_fill_uniform(big, H * DK, &seed, 0.5f, 1.5f);
    /* hf stores (out, in) */
    const int qd = H * DK, kd = HKV * DK;
    float *q = malloc(sizeof(float) * D * qd), *k = malloc(sizeof(float) * D * kd),
          *v = malloc(sizeof(float) * D * kd), *o = malloc(sizeof(float) * qd * D);
    for (int i = 0; i < D; i++) {
        for (int j = 0; j < qd; j++) q[j * D + i] = w.w_q[i * qd + j], o[i * qd + j] = w.w_o[j * D + i];
        for (int j = 0; j < kd; j++) k[j * D + i] = w.w_k[i * kd + j], v[j * D + i] = w.w_v[i * kd + j];
    }
    mha_tensors *t = NULL;
    CHECK_OK(mha_tensors_create(&t));
    const int sq[2] = {qd, D}, sk[2] = {kd, D}, so[2] = {D, qd}, sn = DK, sbig = H * DK;
    CHECK_OK(mha_tensors_add_f32(t, "self_attn.q_proj.weight", q, 2, sq));
    CHECK_OK(mha_tensors_add_f32(t, "self_attn.k_proj.weight", k, 2, sk));
    CHECK_OK(mha_tensors_add_f32(t, "self_attn.v_proj.weight", v, 2, sk));
    CHECK_OK(mha_tensors_add_f32(t, "self_attn.o_proj.weight", o, 2, so));
    CHECK_OK(mha_tensors_add_f32(t, "self_attn.q_norm.weight", qn, 1, &sn));
    CHECK_OK(mha_tensors_add_f32(t, "self_attn.k_norm.weight", kn, 1, &sn));
    CHECK_OK(mha_tensors_set_meta(t, "rope", "halves"));
    CHECK_OK(mha_tensors_set_meta(t, "rope_theta", "1000000"));
    mha_load_options lo = {.layout = MHA_LAYOUT_HF, .n_heads = H, .n_kv_heads = HKV, .prefix = "self_attn."};
    mha_layer *L = NULL;
    CHECK_OK(mha_layer_from_tensors(&L, t, &lo));
    if (L) {
        const mha_config *lc = mha_layer_config(L);
        CHECK(lc->qk_norm == MHA_QK_NORM_RMS && lc->qk_norm_per_head == 0);
        CHECK(lc->rope.pairing == MHA_ROPE_HALVES && lc->rope.theta == 1000000.0);
        /* the same layer through the API */
        mha_config api = c;
        api.qk_norm = MHA_QK_NORM_RMS, api.rope.pairing = MHA_ROPE_HALVES, api.rope.theta = 1000000.0;
        mha_weights view = naive_weights_view(&w);
        view.q_norm = qn, view.k_norm = kn;
        mha_layer *A = NULL;
        CHECK_OK(mha_layer_create(&A, &api, &view));
        float y1[T * D], y2[T * D];
        if (A) {
            forward_ref(L, y1);
            forward_ref(A, y2);
            CHECK(memcmp(y1, y2, sizeof y1) == 0);
        }
        mha_layer_free(A);
    }
    mha_layer_free(L);
    mha_tensors_free(t);
    /* OLMo 2: q_norm over the whole projection (h*d_k), k_norm (h_kv*d_k):
     * loads as qk_norm_whole; a (d_k) k_norm beside it is refused; a (d_k)
     * q_norm beside a per-kv-head k_norm is refused too (before, its d_k
     * floats were read as h*d_k: a heap over-read); Ling's names with a
     * bias are refused (before, the bias went unread) */
    float bigk[HKV * DK];
    test_fill_uniform(bigk, HKV * DK, &seed, 0.5f, 1.5f);
    const int sbigk = HKV * DK;
    for (int pass = 0; pass < 4; pass++) {
        CHECK_OK(mha_tensors_create(&t));
        CHECK_OK(mha_tensors_add_f32(t, "self_attn.q_proj.weight", q, 2, sq));
        CHECK_OK(mha_tensors_add_f32(t, "self_attn.k_proj.weight", k, 2, sk));
        CHECK_OK(mha_tensors_add_f32(t, "self_attn.v_proj.weight", v, 2, sk));
        CHECK_OK(mha_tensors_add_f32(t, "self_attn.o_proj.weight", o, 2, so));
        if (pass == 3) { /* Ling's names, a LayerNorm's bias beside them */
            CHECK_OK(mha_tensors_add_f32(t, "self_attn.query_layernorm.weight", qn, 1, &sn));
            CHECK_OK(mha_tensors_add_f32(t, "self_attn.key_layernorm.weight", kn, 1, &sn));
            CHECK_OK(mha_tensors_add_f32(t, "self_attn.key_layernorm.bias", kn, 1, &sn));
        } else {
            CHECK_OK(mha_tensors_add_f32(t, "self_attn.q_norm.weight", pass == 2 ? qn : big, 1, pass == 2 ? &sn : &sbig));
            CHECK_OK(mha_tensors_add_f32(t, "self_attn.k_norm.weight", pass == 1 ? kn : bigk, 1, pass == 1 ? &sn : &sbigk));
        }
        L = NULL;
        if (pass == 3) {
            CHECK_STATUS(mha_layer_from_tensors(&L, t, &lo), MHA_E_FORMAT);
            CHECK_ERROR_MENTIONS("a q/k LayerNorm of one weight and bias");
            CHECK(L == NULL);
        } else if (pass == 2) {
            CHECK_STATUS(mha_layer_from_tensors(&L, t, &lo), MHA_E_SHAPE);
            CHECK_ERROR_MENTIONS("q_norm.weight has 4 elements");
            CHECK(L == NULL);
        } else if (pass) {
            CHECK_STATUS(mha_layer_from_tensors(&L, t, &lo), MHA_E_SHAPE);
            CHECK_ERROR_MENTIONS("k_norm.weight");
            CHECK(L == NULL);
        } else {
            CHECK_OK(mha_layer_from_tensors(&L, t, &lo));
            const mha_config *lc = L ? mha_layer_config(L) : NULL;
            CHECK(lc && lc->qk_norm == MHA_QK_NORM_RMS && lc->qk_norm_whole == 1 && lc->qk_norm_per_head == 1);
        }
        mha_layer_free(L);
        mha_tensors_free(t);
    }
    free(q), free(k), free(v), free(o);
    naive_weights_free(&w);
}

static const test_case cases[] = {
    {"variants_native_round_trip", test_variants_native_round_trip},
    {"variants_native_refusals", test_variants_native_refusals},
    {"variants_hf_qk_norm", test_variants_hf_qk_norm},
    {"variants_locale_independent", test_variants_locale_independent},
};

const test_case *tests_variants_io(size_t *count) {
    *count = sizeof cases / sizeof cases[0];
    return cases;
}
