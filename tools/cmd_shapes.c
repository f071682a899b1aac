/* cmd_shapes.c — `mha shapes`: every tensor's shape, the parameter count,
 * matmul FLOPs and the KV-cache size of one attention layer, for the
 * given setting and for its MHA (h_kv = h) and MQA (h_kv = 1) variants.
 * Legend: B batch, T query tokens, S key/value tokens, h heads, h_kv kv
 * heads, d_k, d_v, d_model, d_kv_in (see mha.h). Validation is the
 * library's: mha_config_resolve decides what is a valid layer. */
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "args.h"
#include "commands.h"
#include "mha.h"

/* Products are checked: a silently wrapped count would be a wrong answer. */
static int overflow;
static uint64_t mul(uint64_t a, uint64_t b) {
    uint64_t r;
    if (__builtin_mul_overflow(a, b, &r)) overflow = 1;
    return r;
}
static uint64_t add(uint64_t a, uint64_t b) {
    uint64_t r;
    if (__builtin_add_overflow(a, b, &r)) overflow = 1;
    return r;
}
static uint64_t prod(int n, const uint64_t *f) {
    uint64_t r = 1;
    for (int i = 0; i < n; i++) r = mul(r, f[i]);
    return r;
}

/* "1.50 MiB" (binary, for bytes) or "12.90 GFLOP" (decimal) style. */
static const char *human(uint64_t v, int binary, const char *suffix, char buf[32]) {
    const char *unit[] = {"", "K", "M", "G", "T", "P", "E"};
    double base = binary ? 1024.0 : 1000.0, x = (double)v;
    int u = 0;
    while (x >= base && u < 6) { x /= base; u++; }
    if (u == 0) snprintf(buf, 32, "%llu %s", (unsigned long long)v, suffix);
    else snprintf(buf, 32, "%.2f %s%s%s", x, unit[u], binary ? "i" : "", suffix);
    return buf;
}

/* One table row: name, symbolic shape, concrete shape, element count. */
static void row(const char *name, const char *sym, int nd, const uint64_t *d, const char *note) {
    char shape[96];
    int off = snprintf(shape, sizeof shape, "(");
    for (int i = 0; i < nd; i++)
        off += snprintf(shape + off, sizeof shape - (size_t)off, "%s%llu", i ? ", " : "", (unsigned long long)d[i]);
    snprintf(shape + off, sizeof shape - (size_t)off, ")");
    printf("  %-11s %-19s %-26s %14llu%s%s\n", name, sym, shape, (unsigned long long)prod(nd, d), note ? "  " : "",
           note ? note : "");
}

/* K and V cache bytes for h_kv kv heads: B * S * h_kv * (d_k * kb + d_v * vb),
 * i.e. 2 * B * S * h_kv * d_head * bytes when d_k = d_v and kb = vb (int8:
 * 1 byte, its block scales counted by mha_cache bytes only). */
static uint64_t kv_bytes(uint64_t B, uint64_t S, uint64_t hkv, uint64_t dk, uint64_t dv, uint64_t kb, uint64_t vb) {
    return mul(mul(mul(B, S), hkv), add(mul(dk, kb), mul(dv, vb)));
}

/* --cache-dtype / --v-cache-dtype name -> type ("" : fallback). */
static mha_cache_dtype cache_dtype(const char *name, mha_cache_dtype fallback) {
    if (!name || !name[0]) return fallback;
    return !strcmp(name, "int8") ? MHA_CACHE_I8 : !strcmp(name, "fp16") ? MHA_CACHE_F16 : MHA_CACHE_F32;
}

static uint64_t cache_elt(mha_cache_dtype t) { return t == MHA_CACHE_I8 ? 1 : t == MHA_CACHE_F16 ? 2 : 4; }

int cmd_shapes(int argc, char **argv) {
    long long d_model = 0, heads = 0, kv_heads = 0, d_k = 0, d_v = 0, d_kv_in = 0, d_v_in = 0;
    long long batch = 1, tokens = 128, kv_tokens = 0, bytes = 4;
    const char *k_name = "", *v_name = "";
    int no_bias = 0;
    mha_arg args[] = {
        {.name = "--d-model", .kind = MHA_ARG_INT, .dest = &d_model, .metavar = "D", .help = "model width",
         .required = 1, .min = 1, .max = 1 << 20},
        {.name = "--heads", .kind = MHA_ARG_INT, .dest = &heads, .metavar = "H", .help = "query heads h",
         .required = 1, .min = 1, .max = 4096},
        {.name = "--kv-heads", .kind = MHA_ARG_INT, .dest = &kv_heads, .metavar = "G",
         .help = "key/value heads h_kv, divides h; default h", .min = 1, .max = 4096},
        {.name = "--d-k", .kind = MHA_ARG_INT, .dest = &d_k, .metavar = "K",
         .help = "query/key width per head; default d_model/h", .min = 1, .max = 1 << 20},
        {.name = "--d-v", .kind = MHA_ARG_INT, .dest = &d_v, .metavar = "V",
         .help = "value width per head; default d_k", .min = 1, .max = 1 << 20},
        {.name = "--d-kv-in", .kind = MHA_ARG_INT, .dest = &d_kv_in, .metavar = "N",
         .help = "width of the key/value source; default d_model", .min = 1, .max = 1 << 20},
        {.name = "--d-v-in", .kind = MHA_ARG_INT, .dest = &d_v_in, .metavar = "N",
         .help = "width of a separate value source (PyTorch vdim); default d_kv_in", .min = 1, .max = 1 << 20},
        {.name = "--batch", .kind = MHA_ARG_INT, .dest = &batch, .metavar = "B", .help = "batch size; default 1",
         .min = 1, .max = 1 << 24},
        {.name = "--tokens", .kind = MHA_ARG_INT, .dest = &tokens, .metavar = "T",
         .help = "query tokens; default 128", .min = 1, .max = 1 << 30},
        {.name = "--kv-tokens", .kind = MHA_ARG_INT, .dest = &kv_tokens, .metavar = "S",
         .help = "key/value tokens (cached); default T", .min = 1, .max = 1 << 30},
        {.name = "--bytes", .kind = MHA_ARG_INT, .dest = &bytes, .metavar = "4|2",
         .help = "bytes per cached element (fp32 or fp16); default 4", .choices = "4|2"},
        {.name = "--cache-dtype", .kind = MHA_ARG_STRING, .dest = &k_name, .metavar = "TYPE",
         .help = "cache storage of K and V (replaces --bytes); default from --bytes", .choices = "fp32|fp16|int8"},
        {.name = "--v-cache-dtype", .kind = MHA_ARG_STRING, .dest = &v_name, .metavar = "TYPE",
         .help = "V's own cache storage (e.g. K int8, V fp16); default --cache-dtype", .choices = "fp32|fp16|int8"},
        {.name = "--no-bias", .kind = MHA_ARG_SWITCH, .dest = &no_bias,
         .help = "the layer has no b_Q, b_K, b_V, b_O"},
    };
    mha_command_spec spec = {
        .name = "shapes",
        .summary = "Print the shape of every tensor of one multi-head attention layer, its\n"
                   "parameter count, matmul FLOPs of one forward pass, and the KV-cache size\n"
                   "for MHA (h_kv = h), the given setting, and MQA (h_kv = 1).",
        .details = "FLOPs count 2 per multiply-add of the six matrix products (Q, K, V and\n"
                   "output projections; Q K^T scores; P V); softmax and bias adds are not\n"
                   "counted. The KV cache holds K and V for S tokens:\n"
                   "B * S * h_kv * (d_k * K bytes + d_v * V bytes) (int8: 1 byte; the\n"
                   "mha_cache column adds its fp32 scales, one per 32 values).\n\n"
                   "example: mha shapes --d-model 4096 --heads 32 --kv-heads 8 --tokens 4096 --bytes 2\n"
                   "         mha shapes --d-model 4096 --heads 32 --kv-heads 8 --tokens 4096 \\\n"
                   "             --cache-dtype int8 --v-cache-dtype fp16\n",
        .args = args,
        .n_args = (int)(sizeof args / sizeof args[0]),
    };
    int rc = mha_args_parse(&spec, argc, argv, NULL, NULL);
    if (rc != MHA_ARGS_CONTINUE) return rc;

    mha_config c = mha_config_default((int)d_model, (int)heads);
    c.n_kv_heads = (int)kv_heads; /* 0 (not given) means the library's default */
    c.d_k = (int)d_k;
    c.d_v = (int)d_v;
    c.d_kv_in = (int)d_kv_in;
    c.d_v_in = (int)d_v_in;
    c.bias = !no_bias;
    mha_status s = mha_config_resolve(&c, &c);
    if (s != MHA_OK) {
        const char *msg = mha_last_error();
        return mha_cmd_error("shapes", MHA_EXIT_USAGE, "%s", msg[0] ? msg : mha_status_str(s));
    }
    if (!kv_tokens) kv_tokens = tokens;

    const uint64_t B = (uint64_t)batch, T = (uint64_t)tokens, S = (uint64_t)kv_tokens;
    const uint64_t h = (uint64_t)c.n_heads, hkv = (uint64_t)c.n_kv_heads, dk = (uint64_t)c.d_k,
                   dv = (uint64_t)c.d_v, dm = (uint64_t)c.d_model, din = (uint64_t)c.d_kv_in,
                   dvin = (uint64_t)c.d_v_in;
    const mha_cache_dtype kt = cache_dtype(k_name, bytes == 2 ? MHA_CACHE_F16 : MHA_CACHE_F32),
                          vt = cache_dtype(v_name, kt);
    const uint64_t kb = cache_elt(kt), vb = cache_elt(vt);
    const int self = din == dm && dvin == dm && S == T;
    const char *kind = hkv == h ? "MHA" : hkv == 1 ? "MQA" : "GQA";
    overflow = 0;

    /* --- parameters */
    const uint64_t p_wq = mul(dm, mul(h, dk)), p_wk = mul(din, mul(hkv, dk)), p_wv = mul(dvin, mul(hkv, dv)),
                   p_wo = mul(mul(h, dv), dm);
    const uint64_t p_b = c.bias ? add(add(mul(h, dk), mul(hkv, dk)), add(mul(hkv, dv), dm)) : 0;
    const uint64_t p_total = add(add(add(p_wq, p_wk), add(p_wv, p_wo)), p_b);

    /* --- FLOPs of one forward pass, 2 per multiply-add */
    const uint64_t f_q = mul(2, mul(mul(B, T), mul(dm, mul(h, dk))));
    const uint64_t f_k = mul(2, mul(mul(B, S), mul(din, mul(hkv, dk))));
    const uint64_t f_v = mul(2, mul(mul(B, S), mul(dvin, mul(hkv, dv))));
    const uint64_t f_s = mul(2, mul(mul(B, h), mul(mul(T, S), dk)));
    const uint64_t f_pv = mul(2, mul(mul(B, h), mul(mul(T, S), dv)));
    const uint64_t f_o = mul(2, mul(mul(B, T), mul(mul(h, dv), dm)));
    const uint64_t f_total = add(add(add(f_q, f_k), add(f_v, f_s)), add(f_pv, f_o));

    /* --- KV cache for h_kv = h, this setting, h_kv = 1 */
    const uint64_t kv_h[3] = {h, hkv, 1};
    uint64_t kvb[3], kvp[3];
    for (int i = 0; i < 3; i++) {
        kvb[i] = kv_bytes(B, S, kv_h[i], dk, dv, kb, vb);
        kvp[i] = add(add(mul(din, mul(kv_h[i], dk)), mul(dvin, mul(kv_h[i], dv))),
                     c.bias ? mul(kv_h[i], add(dk, dv)) : 0);
    }
    (void)prod(4, (uint64_t[]){B, h, T, S}); /* the scores tensor must be countable too */
    if (overflow)
        return mha_cmd_error("shapes", MHA_EXIT_RUNTIME,
                             "a count exceeds 64 bits (reduce --batch, --tokens or --kv-tokens)");

    char hb[32];
    printf("layer: d_model=%llu h=%llu h_kv=%llu (%s) d_k=%llu d_v=%llu d_kv_in=%llu d_v_in=%llu bias=%s\n",
           (unsigned long long)dm, (unsigned long long)h, (unsigned long long)hkv, kind, (unsigned long long)dk,
           (unsigned long long)dv, (unsigned long long)din, (unsigned long long)dvin, c.bias ? "on" : "off");
    printf("input: B=%llu T=%llu S=%llu (%s), cache element %llu bytes", (unsigned long long)B,
           (unsigned long long)T, (unsigned long long)S, self ? "self-attention" : "cross-attention / cached keys",
           (unsigned long long)kb);
    if (vb != kb) printf(" (K), %llu bytes (V)", (unsigned long long)vb);
    if (kt == MHA_CACHE_I8 || vt == MHA_CACHE_I8) printf(", int8 plus one fp32 scale per 32 values");
    printf("\n");
    if (dk * h != dm) printf("note: h*d_k = %llu differs from d_model = %llu\n", (unsigned long long)(h * dk),
                             (unsigned long long)dm);

    printf("\n  %-11s %-19s %-26s %14s\n", "tensor", "symbolic", "shape", "elements");
    row("X", "(B,T,d_model)", 3, (uint64_t[]){B, T, dm}, NULL);
    if (self) printf("  %-11s %-19s %s\n", "KV source", "(B,S,d_kv_in)", "= X (self-attention)");
    else row("KV source", "(B,S,d_kv_in)", 3, (uint64_t[]){B, S, din}, NULL);
    if (dvin != din) row("V source", "(B,S,d_v_in)", 3, (uint64_t[]){B, S, dvin}, "separate value input");
    row("W_Q", "(d_model,h*d_k)", 2, (uint64_t[]){dm, h * dk}, "column block r -> head r");
    row("W_K", "(d_kv_in,h_kv*d_k)", 2, (uint64_t[]){din, hkv * dk}, "column block g -> kv head g");
    row("W_V", "(d_v_in,h_kv*d_v)", 2, (uint64_t[]){dvin, hkv * dv}, NULL);
    row("W_O", "(h*d_v,d_model)", 2, (uint64_t[]){h * dv, dm}, "row block r <- head r");
    if (c.bias) {
        row("b_Q", "(h*d_k)", 1, (uint64_t[]){h * dk}, NULL);
        row("b_K", "(h_kv*d_k)", 1, (uint64_t[]){hkv * dk}, NULL);
        row("b_V", "(h_kv*d_v)", 1, (uint64_t[]){hkv * dv}, NULL);
        row("b_O", "(d_model)", 1, (uint64_t[]){dm}, NULL);
    }
    row("Q", "(B,T,h*d_k)", 3, (uint64_t[]){B, T, h * dk}, NULL);
    row("  Q^(r)", "(B,T,d_k)", 3, (uint64_t[]){B, T, dk}, "per head, h of them");
    row("K", "(B,S,h_kv*d_k)", 3, (uint64_t[]){B, S, hkv * dk}, NULL);
    row("  K^(g)", "(B,S,d_k)", 3, (uint64_t[]){B, S, dk}, "per kv head, shared by h/h_kv heads");
    row("V", "(B,S,h_kv*d_v)", 3, (uint64_t[]){B, S, hkv * dv}, NULL);
    row("  V^(g)", "(B,S,d_v)", 3, (uint64_t[]){B, S, dv}, "per kv head");
    row("scores", "(B,h,T,S)", 4, (uint64_t[]){B, h, T, S}, "= probabilities after softmax");
    row("  per head", "(B,T,S)", 3, (uint64_t[]){B, T, S}, NULL);
    row("Z", "(B,T,h*d_v)", 3, (uint64_t[]){B, T, h * dv}, "Concat(Z^(1..h))");
    row("  Z^(r)", "(B,T,d_v)", 3, (uint64_t[]){B, T, dv}, "per head, at columns r*d_v");
    row("Y", "(B,T,d_model)", 3, (uint64_t[]){B, T, dm}, "= Z W_O + b_O");

    printf("\nparameters\n");
    printf("  W_Q %llu, W_K %llu, W_V %llu, W_O %llu, biases %llu\n", (unsigned long long)p_wq,
           (unsigned long long)p_wk, (unsigned long long)p_wv, (unsigned long long)p_wo, (unsigned long long)p_b);
    printf("  total parameters %llu (%s)\n", (unsigned long long)p_total, human(p_total, 0, "", hb));

    printf("\nFLOPs of one forward pass (2 per multiply-add)\n");
    printf("  %-18s %-24s %20llu\n", "Q projection", "2*B*T*d_model*h*d_k", (unsigned long long)f_q);
    printf("  %-18s %-24s %20llu\n", "K projection", "2*B*S*d_kv_in*h_kv*d_k", (unsigned long long)f_k);
    printf("  %-18s %-24s %20llu\n", "V projection", "2*B*S*d_v_in*h_kv*d_v", (unsigned long long)f_v);
    printf("  %-18s %-24s %20llu\n", "scores Q K^T", "2*B*h*T*S*d_k", (unsigned long long)f_s);
    printf("  %-18s %-24s %20llu\n", "weighted sum P V", "2*B*h*T*S*d_v", (unsigned long long)f_pv);
    printf("  %-18s %-24s %20llu\n", "output projection", "2*B*T*h*d_v*d_model", (unsigned long long)f_o);
    printf("  %-18s %-24s %20llu  (%s)\n", "total FLOPs", "", (unsigned long long)f_total, human(f_total, 0, "FLOP", hb));

    if (kb == vb) {
        printf("\nKV cache for S=%llu tokens: B*S*h_kv*(d_k+d_v)*bytes", (unsigned long long)S);
        if (dk == dv) printf(" = 2*B*S*h_kv*d_head*bytes");
    } else {
        printf("\nKV cache for S=%llu tokens: B*S*h_kv*(d_k*%llu + d_v*%llu)", (unsigned long long)S,
               (unsigned long long)kb, (unsigned long long)vb);
    }
    printf("\n  %-22s %6s %20s %12s %10s %16s %20s\n", "variant", "h_kv", "bytes", "", "saving", "K/V params",
           "mha_cache bytes");
    char name[40];
    const char *names[3] = {"MHA (h_kv = h)", name, "MQA (h_kv = 1)"};
    snprintf(name, sizeof name, "this setting (%s)", kind);
    for (int i = 0; i < 3; i++) {
        double saving = (double)kvb[0] / (double)kvb[i];
        /* what mha_cache_create would allocate (capacity rounded to its chunk) */
        mha_config ci = c;
        ci.n_kv_heads = (int)kv_h[i];
        size_t alloc = B <= INT_MAX && S <= INT_MAX
                           ? mha_cache_bytes_for_kv(&ci, (int)B, (int)S, kt, vt)
                           : 0;
        printf("  %-22s %6llu %20llu %12s %9.2fx %16llu %20llu\n", names[i], (unsigned long long)kv_h[i],
               (unsigned long long)kvb[i], human(kvb[i], 1, "B", hb), saving, (unsigned long long)kvp[i],
               (unsigned long long)alloc);
    }
    printf("  (mha_cache bytes: what mha_cache_create_kv allocates; it rounds the capacity up to a\n"
           "   whole number of its 128-token chunks; 0 = not representable)\n");
    if (dk != dv)
        printf("  (K and V differ in width: K %llu + V %llu bytes per token per kv head)\n",
               (unsigned long long)(dk * kb), (unsigned long long)(dv * vb));
    return MHA_EXIT_OK;
}
