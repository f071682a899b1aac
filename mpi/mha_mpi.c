/* mha_mpi.c — `mha-mpi run`: `mha run` over MPI ranks, split by heads or by
 * sequence (libmha_mpi). Flag parsing, checkpoint and input loading are the
 * CLI's own (tools/args.c, tools/io_cli.c); each rank's messages from them
 * are captured so that a failure on one rank is reported, the same, by
 * every rank. Run as `mpirun -np P mha-mpi run --split heads ...`.
 * Legend: B, T, S, h, d_v, d_model (see mha.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "hf_config.h"
#include "io_cli.h"
#include "mha_mpi.h"
#include "outputs.h"
#include "run_variants.h"

/* Runs cli_fwd_open (and --ablate's parser) with stderr captured into
 * *text; off rank 0, help on stdout is dropped. */
typedef struct {
    FILE *mem, *saved_err, *saved_out;
    char *text;
    size_t len;
} capture;

static void capture_begin(capture *c, int rank) {
    memset(c, 0, sizeof *c);
    c->saved_err = stderr, c->saved_out = stdout;
    c->mem = open_memstream(&c->text, &c->len);
    if (c->mem) stderr = c->mem;
    if (rank != 0) {
        FILE *null = fopen("/dev/null", "w");
        if (null) stdout = null;
    }
}

static void capture_end(capture *c) {
    if (stdout != c->saved_out) fclose(stdout), stdout = c->saved_out;
    if (c->mem) fclose(c->mem), stderr = c->saved_err;
    /* one line without the "mha run: " prefix or the newline */
    char *t = c->text ? c->text : "";
    if (strncmp(t, "mha run: ", 9) == 0) memmove(t, t + 9, strlen(t + 9) + 1);
    size_t n = strlen(t);
    while (n && t[n - 1] == '\n') t[--n] = '\0';
}

/* FNV-1a over bytes: one number per rank that differs when the weights or
 * inputs do. */
static unsigned long long fnv(unsigned long long hsh, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; p && i < n; i++) hsh = (hsh ^ b[i]) * 1099511628211ull;
    return hsh;
}

static long long layer_checksum(const mha_layer *L) {
    const mha_config *c = mha_layer_config(L);
    mha_weights w;
    mha_layer_get_weights(L, &w);
    size_t q = (size_t)c->n_heads * c->d_k, k = (size_t)c->n_kv_heads * c->d_k, v = (size_t)c->n_kv_heads * c->d_v;
    unsigned long long hsh = 1469598103934665603ull;
    hsh = fnv(hsh, w.w_q, 4 * c->d_model * q), hsh = fnv(hsh, w.w_k, 4 * c->d_kv_in * k);
    hsh = fnv(hsh, w.w_v, 4 * c->d_v_in * v), hsh = fnv(hsh, w.w_o, 4 * (size_t)c->n_heads * c->d_v * c->d_model);
    hsh = fnv(hsh, w.b_q, 4 * q), hsh = fnv(hsh, w.b_k, 4 * k), hsh = fnv(hsh, w.b_v, 4 * v);
    hsh = fnv(hsh, w.b_o, 4 * (size_t)c->d_model);
    hsh = fnv(hsh, w.w_g, 4 * c->d_model * (size_t)c->n_heads * c->d_v), hsh = fnv(hsh, w.b_g, 4 * (size_t)c->n_heads * c->d_v);
    hsh = fnv(hsh, w.bias_k, 4 * k), hsh = fnv(hsh, w.bias_v, 4 * v); /* add_bias_kv's key row: the ring's extra part */
    return (long long)(hsh >> 1);
}

/* The settings that config.json (or the file's metadata) gives the layer and
 * the call besides the weights: RoPE, ALiBi, soft-cap, sinks, QK-norm, the output gate, clip_qkv,
 * the query temperature, extra keys, the score scale and the window; hc, config.json as read here.
 * Each rank reads its own config.json, and the weights' checksums do not
 * see it: a rank given another rope_theta, soft-cap or window ran silently
 * with it. The shard's per-head tensors (slopes, sinks, norms) are not
 * hashed: they differ between ranks by design, and come from the file. */
static long long variant_checksum(const mha_layer *L, const mha_options *o, const cli_hf_config *hc) {
    const mha_config *c = mha_layer_config(L);
    const mha_rope *r = &c->rope;
    const double d[] = {r->theta, r->factor, r->low_freq_factor, r->high_freq_factor, r->beta_fast, r->beta_slow,
                        r->attn_factor, c->softcap, c->qk_norm_eps, o->scale, hc->rope_theta, hc->softcap,
                        hc->scale, hc->qk_norm_eps, hc->clip_qkv, c->clip_qkv, c->temperature_scale};
    const long long n[] = {r->pairing, r->dim, r->scaling, r->original_max_positions, c->alibi, c->sinks,
                           c->temperature_floor, c->temperature_rule,
                           c->qk_norm, c->qk_norm_per_head, c->qk_norm_whole, c->add_bias_kv, c->add_zero_attn,
                           o->window_left, o->window_right, o->sink_tokens, o->chunk_size, o->align, hc->found, hc->heads,
                           hc->kv_heads, hc->head_dim, hc->hidden, hc->rope_dim, hc->alibi, hc->qk_norm_offset,
                           hc->window, hc->no_rope, c->output_gate, hc->output_gate};
    unsigned long long hsh = fnv(1469598103934665603ull, d, sizeof d);
    hsh = fnv(hsh, n, sizeof n);
    hsh = fnv(hsh, r->short_factor, sizeof r->short_factor); /* LongRoPE's lists (a --rope-scale flag's too) */
    hsh = fnv(hsh, r->long_factor, sizeof r->long_factor);
    hsh = fnv(hsh, hc->rope_scale, strlen(hc->rope_scale));
    hsh = fnv(hsh, hc->rope ? hc->rope : "-", strlen(hc->rope ? hc->rope : "-"));
    return (long long)(hsh >> 1);
}

static long long hash_str(const char *v) {
    return v ? (long long)(fnv(1469598103934665603ull, v, strlen(v)) >> 1) : -1;
}

/* The bytes of an input array (floats or bytes) as one checksum; -1: none. */
static long long array_checksum(const mha_array *a) {
    if (!a->f && !a->u8) return -1;
    const void *p = a->f ? (const void *)a->f : (const void *)a->u8;
    return (long long)(fnv(1469598103934665603ull, p, a->count * (a->f ? 4 : 1)) >> 1);
}

/* The bytes of the file at path into *hsh, read 1 MiB at a time; 0 when
 * it could not be read. */
static int hash_file(unsigned long long *hsh, const char *path) {
    FILE *fp = fopen(path, "rb");
    unsigned char *buf = fp ? malloc(1 << 20) : NULL;
    size_t n;
    while (buf && (n = fread(buf, 1, 1 << 20, fp)) > 0) {
        size_t i = 0;
        for (; i + 8 <= n; i += 8) { /* a word at a time: files are large */
            unsigned long long w;
            memcpy(&w, buf + i, 8);
            *hsh = (*hsh ^ w) * 1099511628211ull;
        }
        *hsh = fnv(*hsh, buf + i, n - i);
    }
    const int ok = buf && !ferror(fp);
    free(buf);
    if (fp) fclose(fp);
    return ok;
}

static int by_name(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* A checksum of the checkpoint file's bytes: under the head split each
 * rank reads only its heads' blocks, so only the whole file tells whether
 * every rank was given the same weights. An index (sharded checkpoint) is
 * hashed with every shard file its weight_map names, once each, in name
 * order (the index alone did not see a rank given other shard files: Y
 * silently off). -1: unreadable (the loader says why). */
static long long file_checksum(const char *path) {
    char file[4096];
    unsigned long long hsh = 1469598103934665603ull;
    if (mha_checkpoint_resolve(file, sizeof file, path) || !hash_file(&hsh, file)) return -1;
    const size_t n = strlen(file), s = strlen(".index.json");
    if (n <= s || strcmp(file + n - s, ".index.json") != 0) return (long long)(hsh >> 1);
    json_t *root = json_load_file(file, 0, NULL), *map = json_object_get(root, "weight_map"), *v;
    const char *key, **names = malloc(sizeof *names * (json_object_size(map) + 1));
    size_t k = 0;
    int ok = names != NULL;
    json_object_foreach(map, key, v) if (ok && json_is_string(v)) names[k++] = json_string_value(v);
    if (ok) qsort(names, k, sizeof *names, by_name);
    const char *slash = strrchr(file, '/');
    const int dir = slash ? (int)(slash - file + 1) : 0;
    for (size_t i = 0; ok && i < k; i++) {
        char shard[8192];
        if (i && strcmp(names[i], names[i - 1]) == 0) continue;
        ok = snprintf(shard, sizeof shard, "%.*s%s", dir, file, names[i]) < (int)sizeof shard &&
             hash_file(&hsh, shard);
    }
    free(names);
    json_decref(root);
    return ok ? (long long)(hsh >> 1) : -1;
}

/* --decode N, head-parallel: the first T-N tokens of every sequence in
 * one prefill call, then the last N one at a time, each rank caching its
 * kv heads; y (B,T,d_model) gets every call's rows. st sums the calls. */
static mha_status run_decode(const mha_layer *local, const mha_mpi_heads *hd, const float *b_o, float *y,
                             const cli_fwd *f, int n_dec, MPI_Comm comm, mha_mpi_stats *st) {
    const int B = f->B, T = f->T, D = mha_layer_config(local)->d_model, T0 = T - n_dec;
    const int most = T0 > 1 ? T0 : 1;
    double t0 = MPI_Wtime();
    mha_cache *cache = NULL;
    /* --sink-tokens n (with --window W): a cached call takes only the
     * cache's own sink count, which only a windowed cache keeps (a full
     * one refused every call, "options.sink_tokens=n but the cache keeps
     * 0"): a ring of the window's W slots plus the n sinks' (each at most
     * T: beyond, every key is kept either way) */
    const int W = f->opt.sink_tokens > 0 && f->opt.window_left >= 0 ? (f->opt.window_left < T ? f->opt.window_left + 1 : T) : 0;
    const int n_sink = W ? (f->opt.sink_tokens < T ? f->opt.sink_tokens : T) : 0;
    mha_status s = mha_cache_create(&cache, local, B, W ? W + n_sink : T, MHA_CACHE_F32, W);
    if (!s && n_sink) s = mha_cache_set_sink_tokens(cache, n_sink);
    if ((s = mha_mpi_agree(comm, s, s ? mha_last_error() : NULL))) return mha_cache_free(cache), s;
    float *xs = malloc(sizeof(float) * (size_t)B * most * D), *ys = malloc(sizeof(float) * (size_t)B * most * D);
    /* --positions (B,T): each call reads (B,n), its own columns [t, t+n) */
    int *ps = f->opt.positions ? malloc(sizeof(int) * (size_t)B * most) : NULL;
    s = mha_mpi_agree(comm, xs && ys && (ps || !f->opt.positions) ? MHA_OK : MHA_E_NOMEM,
                      "no memory for one decode step's rows");
    mha_options o = f->opt;
    o.positions = ps;
    o.sink_tokens = n_sink;
    for (int t = 0; !s && t < T;) {
        const int n = t == 0 && T0 > 0 ? T0 : 1; /* (B,n,D) rows [t, t+n) */
        for (int b = 0; b < B; b++) {
            memcpy(xs + (size_t)b * n * D, f->x.f + ((size_t)b * T + t) * D, sizeof(float) * (size_t)n * D);
            if (ps) memcpy(ps + (size_t)b * n, f->opt.positions + (size_t)b * T + t, sizeof(int) * (size_t)n);
        }
        mha_mpi_stats one = {0};
        s = mha_mpi_forward_cached_heads(local, cache, hd, b_o, ys, xs, B, n, &o, comm, &one);
        for (int b = 0; !s && b < B; b++)
            memcpy(y + ((size_t)b * T + t) * D, ys + (size_t)b * n * D, sizeof(float) * (size_t)n * D);
        st->sent_bytes += one.sent_bytes, st->formula_bytes += one.formula_bytes, st->compute_s += one.compute_s;
        st->cache_bytes = one.cache_bytes;
        t += n;
    }
    st->total_s = MPI_Wtime() - t0;
    free(xs), free(ys), free(ps);
    mha_cache_free(cache);
    return s;
}

/* Prints the agreed error on this rank and returns the exit code. */
static int report(int rank, int code) {
    char msg[1024]; /* as the CLI's errors: one line, whatever a file name holds */
    snprintf(msg, sizeof msg, "%s", mha_mpi_last_error());
    fprintf(stderr, "mha-mpi run: [rank %d] %s\n", rank, mha_one_line(msg));
    return code;
}

/* The flags of `mha-mpi run`. */
typedef struct {
    cli_ckpt ck;
    cli_fwd_flags ff;
    cli_variant_flags vf; /* mha run's variant flags; compared across ranks after they apply */
    const char *output, *ablate, *save_z, *save_c, *save_p, *split, *masked;
    int want_stats;
    long long decode;
    double max_gib; /* --max-output-gib: rank 0 holds every output at once */
} run_flags;

/* Every flag that changes the result or the sequence of MPI calls, the
 * same on every rank, agreed before any rank takes a branch on them (file
 * contents are compared once read). */
static mha_status agree_flags(const run_flags *r, MPI_Comm comm) {
    const cli_fwd_flags *ff = &r->ff;
    const long long same[] = {r->split && strcmp(r->split, "sequence") == 0, r->decode, r->want_stats,
                              r->save_z != NULL, r->save_c != NULL, r->save_p != NULL, hash_str(ff->causal),
                              hash_str(r->masked), hash_str(r->ablate), ff->kv_input != NULL,
                              ff->attn_mask != NULL, ff->key_padding_mask != NULL, r->ck.zero_attn,
                              r->ck.heads, r->ck.kv_heads, hash_str(r->ck.layout), hash_str(r->ck.prefix)};
    const char *names[] = {"--split sequence", "--decode", "--stats", "--save-z given", "--save-contributions given",
                           "--save-probs given", "checksum of --causal", "checksum of --masked-rows",
                           "checksum of --ablate", "--kv-input given", "--attn-mask given",
                           "--key-padding-mask given", "--zero-attn", "--heads", "--kv-heads",
                           "checksum of --layout", "checksum of --prefix"};
    return mha_mpi_check_same(comm, same, (int)(sizeof same / sizeof same[0]), names);
}

/* Parses argv on every rank (stderr captured, agreed). Returns -1 to go
 * on, else the exit code: help (given to every rank: rank 0 prints it),
 * or an agreed error already reported. */
static int parse(run_flags *r, mha_command_spec *spec, cli_outputs *outs, int argc, char **argv, MPI_Comm comm) {
    int rank;
    MPI_Comm_rank(comm, &rank);
    capture cap;
    capture_begin(&cap, rank);
    argv = cli_expand_causal(&argc, argv);
    int rc = mha_args_parse(spec, argc, argv, NULL, NULL);
    /* mha run writes an array to standard output ("-"); here that would be
     * mpirun's forwarding of rank 0's output, through a terminal of its own
     * (which turns each \n into \r\n): refused on every rank, by name */
    const char *const out_flags[4] = {"--output", "--save-z", "--save-contributions", "--save-probs"};
    const char *const out_paths[4] = {r->output, r->save_z, r->save_c, r->save_p};
    for (int i = 0; i < 4 && rc == MHA_ARGS_CONTINUE; i++)
        if (out_paths[i] && strcmp(out_paths[i], "-") == 0)
            rc = mha_cmd_error("run", MHA_EXIT_USAGE,
                               "%s '-': mha-mpi writes no output to standard output (mpirun passes rank 0's "
                               "through a terminal, which changes the bytes); expected a file path",
                               out_flags[i]);
    if (rc == MHA_ARGS_CONTINUE) { /* its own code, as mha run's: 1 a file problem, 2 a conflict of flags */
        const int c = cli_outputs_check(outs);
        if (c) rc = c;
    }
    capture_end(&cap);
    const int failed = rc != MHA_ARGS_CONTINUE && rc != MHA_EXIT_OK, help = rc == MHA_EXIT_OK;
    int code = failed ? rc : 0, all_help;
    MPI_Allreduce(MPI_IN_PLACE, &code, 1, MPI_INT, MPI_MAX, comm);
    MPI_Allreduce(&help, &all_help, 1, MPI_INT, MPI_MIN, comm);
    mha_status s = mha_mpi_agree(comm, failed ? MHA_E_ARG : MHA_OK, cap.text);
    free(cap.text);
    if (s) return report(rank, code ? code : MHA_EXIT_RUNTIME);
    if (all_help) return MHA_EXIT_OK; /* rank 0 printed it */
    /* --help on some ranks only: the others would go on alone */
    if (mha_mpi_agree(comm, help ? MHA_E_ARG : MHA_OK,
                      "--help was given here but not on every rank; expected the same flags on every rank"))
        return report(rank, MHA_EXIT_USAGE);
    if (agree_flags(r, comm)) return report(rank, MHA_EXIT_USAGE);
    /* a conflict of flags alone (agreed above: every rank finds it): a usage
     * error before any file is read, as mha run's (it was the ring's
     * MHA_E_UNSUPPORTED after the load: exit 1) */
    if (mha_mpi_agree(comm, r->split && strcmp(r->split, "sequence") == 0 && r->save_p ? MHA_E_ARG : MHA_OK,
                      "--save-probs with --split sequence: the ring captures no attention probabilities (each rank "
                      "sees one key block at a time); expected --split heads, or no --save-probs"))
        return report(rank, MHA_EXIT_USAGE);
    return -1;
}

/* The layer as `mha run` loads it: the head counts of a config.json
 * beside an hf checkpoint, then (after *f is read) its rotary settings,
 * soft-cap and scale, applied to this rank's shard (heads) or the whole
 * layer (sequence). The messages of the CLI's loaders land in stderr,
 * which the caller captures. */
static mha_status load_layer(mha_layer **layer, mha_mpi_heads *hd, mha_config *cfg, float **b_o,
                             const run_flags *r, int heads, MPI_Comm comm, int rank) {
    capture cap;
    capture_begin(&cap, rank);
    mha_load_options lo;
    cli_hf_config hc;
    mha_status s = cli_load_options(&lo, &r->ck);
    if (!s && cli_hf_config_read(&hc, "run", &r->ck, NULL)) s = MHA_E_ARG;
    if (!s && hc.found && !lo.n_heads) lo.n_heads = (int)hc.heads; /* --heads wins over config.json */
    if (!s && hc.found && !lo.n_kv_heads) lo.n_kv_heads = (int)hc.kv_heads;
    if (!s && hc.found) lo.output_gate = hc.output_gate; /* Qwen3-Next: q_proj holds each head's gate */
    capture_end(&cap);
    s = mha_mpi_agree(comm, s, s ? cap.text : NULL);
    free(cap.text);
    if (s) return s;
    if (heads) {
        s = mha_mpi_load_heads(layer, hd, cfg, b_o, r->ck.weights, &lo, comm);
    } else {
        s = mha_layer_load(layer, r->ck.weights, &lo);
        if (!s) *cfg = *mha_layer_config(*layer);
        s = mha_mpi_agree(comm, s, NULL);
    }
    if (s) return s;
    capture_begin(&cap, rank);
    s = cli_hf_config_check(&hc, "run", cfg) ? MHA_E_ARG : MHA_OK;
    capture_end(&cap);
    s = mha_mpi_agree(comm, s, s ? cap.text : NULL);
    free(cap.text);
    return s;
}

static int run(int argc, char **argv, MPI_Comm comm) {
    int rank, P;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &P);
    run_flags r;
    memset(&r, 0, sizeof r);
    cli_ckpt *ck = &r.ck;
    cli_fwd_flags *ffp = &r.ff;
    mha_arg args[] = {
        CLI_CKPT_ARGS(*ck, 1),
        CLI_FWD_ARGS(*ffp),
        {.name = "--output", .kind = MHA_ARG_STRING, .dest = &r.output, .metavar = "Y.npy",
         .help = "output Y, same rank as X (written by rank 0)", .required = 1},
        {.name = "--split", .kind = MHA_ARG_STRING, .dest = &r.split, .metavar = "heads|sequence",
         .help = "heads (each rank a block of heads; default) or sequence (ring attention)",
         .choices = "heads|sequence"},
        {.name = "--stats", .kind = MHA_ARG_SWITCH, .dest = &r.want_stats,
         .help = "print each rank's bytes sent (and the formula's) and times"},
        {.name = "--decode", .kind = MHA_ARG_INT, .dest = &r.decode, .metavar = "N",
         .help = "KV-cache decode: prefill the first T-N tokens, then the last N one at a time "
                 "(causal self-attention, --split heads; each rank caches its kv heads)",
         .min = 1, .max = 1 << 30},
        CLI_RUN_OUTPUT_ARGS(r.ablate, r.save_z, r.save_c, r.save_p, r.masked),
        CLI_VARIANT_ARGS(r.vf),
        CLI_MAX_OUTPUT_ARG(r.max_gib),
    };
    mha_command_spec spec = {
        .name = "run",
        .program = "mha-mpi",
        .summary = "mha run over MPI ranks: the layer split by heads or by sequence.",
        .details = "Every rank is given the same flags; rank 0 writes the files.\n\n"
                   "example: mpirun -np 4 mha-mpi run --split heads --weights attn.safetensors \\\n"
                   "           --input x.npy --output y.npy --causal --stats\n",
        .args = args,
        .n_args = (int)(sizeof args / sizeof args[0]),
    };

    // --- parse, agree on the flags, load, read inputs: on every rank, failures agreed
    mha_layer *L = NULL;
    cli_fwd f;
    memset(&f, 0, sizeof f);
    mha_intervention *iv = NULL;
    /* rank 0 writes the files: only it reserves their temporaries */
    cli_outputs outs;
    cli_outputs_init(&outs, "run");
    cli_register_inputs(&outs, ck, ffp);
    cli_outputs_input(&outs, "--positions", &r.vf.positions);
    if (rank == 0) {
        cli_outputs_output(&outs, "--output", &r.output);
        cli_outputs_output(&outs, "--save-z", &r.save_z);
        cli_outputs_output(&outs, "--save-contributions", &r.save_c);
        cli_outputs_output(&outs, "--save-probs", &r.save_p);
    }
    int code = parse(&r, &spec, &outs, argc, argv, comm);
    if (code >= 0) {
        if (rank == 0) cli_outputs_finish(&outs, MHA_EXIT_RUNTIME); /* no temporary left */
        return code;
    }
    const cli_fwd_flags ff = r.ff;
    const char *output = r.output, *ablate = r.ablate, *save_z = r.save_z, *save_c = r.save_c, *save_p = r.save_p,
               *masked = r.masked;
    const long long decode = r.decode;
    code = 0;

    // --- the layer: heads, this rank's shard straight from the file; sequence, all of it
    const int heads = !r.split || strcmp(r.split, "heads") == 0;
    mha_layer *local = NULL;
    mha_mpi_heads hd;
    mha_config cfg;
    float *b_o = NULL;
    mha_status s = load_layer(heads ? &local : &L, &hd, &cfg, &b_o, &r, heads, comm, rank);
    // --- inputs, masks, config.json's variants and --ablate against the layer's dims
    capture cap_text;
    capture_begin(&cap_text, rank);
    int rc = s ? MHA_EXIT_RUNTIME : cli_fwd_prepare_config("run", &f, &cfg, &ff);
    cli_variant_flags vf = r.vf; /* the flags, then config.json's, as mha run applies them */
    if (heads && !s) vf.shard_first = hd.first, vf.shard_of_heads = cfg.n_heads; /* ALiBi's slopes are global */
    if (!s && !rc) rc = cli_apply_variants("run", heads ? &local : &L, &f, &vf, ck);
    if (!s && !rc && ablate) {
        iv = calloc((size_t)cfg.n_heads, sizeof *iv);
        rc = iv ? cli_parse_ablate(ablate, iv, cfg.n_heads) : mha_cmd_error("run", MHA_EXIT_RUNTIME, "out of memory");
    }
    capture_end(&cap_text);
    if (!s) {
        code = rc;
        MPI_Allreduce(MPI_IN_PLACE, &code, 1, MPI_INT, MPI_MAX, comm);
        s = mha_mpi_agree(comm, rc ? MHA_E_ARG : MHA_OK, cap_text.text);
    }
    free(cap_text.text);
    if (s) {
        if (rank == 0) cli_outputs_finish(&outs, MHA_EXIT_RUNTIME);
        cli_fwd_free(&f), cli_variants_free(&vf), mha_layer_free(L), mha_layer_free(local), free(b_o), free(iv);
        return report(rank, code ? code : MHA_EXIT_RUNTIME);
    }
    if (L) cfg = *mha_layer_config(L);
    if (masked && strcmp(masked, "nan") == 0) f.opt.masked_row = MHA_MASKED_ROW_NAN;
    f.opt.interventions = iv;

    // --- the same checkpoint and inputs on every rank (heads: each rank
    //     read other weights, so the file's bytes are compared)
    const mha_config *c = &cfg;
    unsigned long long in_sum = fnv(1469598103934665603ull, f.x.f, 4 * f.x.count);
    if (f.kv.f) in_sum = fnv(in_sum, f.kv.f, 4 * f.kv.count);
    cli_hf_config hc; /* read once more (it succeeded in load_layer): its values, compared */
    if (cli_hf_config_read(&hc, "run", ck, NULL)) memset(&hc, 0, sizeof hc);
    const long long same[] = {c->d_model, c->n_heads, c->n_kv_heads, c->d_k, c->d_v, c->d_kv_in, c->bias,
                              f.B, f.T, f.S, L ? layer_checksum(L) : file_checksum(ck->weights),
                              (long long)(in_sum >> 1), array_checksum(&f.am), array_checksum(&f.kp),
                              variant_checksum(L ? L : local, &f.opt, &hc),
                              f.opt.positions ? (long long)(fnv(1469598103934665603ull, f.opt.positions,
                                                                sizeof(int) * (size_t)f.B * f.T) >> 1) : -1};
    const char *names[] = {"d_model", "h", "h_kv", "d_k", "d_v", "d_kv_in", "bias", "B", "T", "S",
                           heads ? "checksum of the checkpoint file" : "checksum of the weights",
                           "checksum of the inputs", "checksum of --attn-mask", "checksum of --key-padding-mask",
                           "checksum of the variants (config.json beside the checkpoint, or the file's metadata: "
                           "RoPE, ALiBi, soft-cap, QK-norm, scale, window)", "checksum of --positions"};
    s = mha_mpi_check_same(comm, same, (int)(sizeof same / sizeof same[0]), names);
    if (!s && decode) { /* the same flags on every rank: each finds the same answer */
        char why[200] = "";
        if (!heads) snprintf(why, sizeof why, "--decode runs head-parallel; expected --split heads");
        else if (!ff.causal || f.kv.f) snprintf(why, sizeof why, "--decode is causal self-attention; expected --causal and no --kv-input");
        else if (ff.attn_mask || ff.key_padding_mask || save_z || save_c || save_p)
            snprintf(why, sizeof why, "--decode takes no masks and saves only --output; expected no --attn-mask, --key-padding-mask or --save-*");
        else if (decode > f.T) snprintf(why, sizeof why, "--decode %lld > T=%d tokens of --input; expected 1..%d", decode, f.T, f.T);
        for (int i = 0; iv && !*why && i < cfg.n_heads; i++) /* a cached call sees only its new rows */
            if (iv[i].op == MHA_HEAD_MEAN)
                snprintf(why, sizeof why, "--decode with --ablate %d=mean: each call would average only its own new "
                         "rows, not the sequence's; expected zero, scale or replace, or no --decode", i);
        if (*why) code = MHA_EXIT_USAGE;
        s = mha_mpi_agree(comm, *why ? MHA_E_ARG : MHA_OK, why);
    }

    const int B = f.B, T = f.T, h = c->n_heads, D = c->d_model;
    const int St = f.S + c->add_bias_kv + c->add_zero_attn;
    const size_t rows = (size_t)B * T;
    float *y = NULL;
    mha_capture cap = {0};
    mha_mpi_stats st = {0};
    if (!s) { /* rank 0 holds every output at once: each, and their sum, within --max-output-gib (mha run's
                 limit; rank 0's memory was overcommitted, then its process killed in the gather) */
        int lim = 0;
        if (rank == 0) {
            capture_begin(&cap_text, rank);
            const double limit = r.max_gib > 0 ? r.max_gib : cli_default_output_limit_gib();
            const double ny = (double)rows * D, nz = save_z ? (double)rows * h * c->d_v : 0.0,
                         nc = save_c ? (double)h * rows * D : 0.0, np = save_p ? (double)h * rows * St : 0.0;
            if (!(lim = cli_check_output_size("run", "--output", ny, limit)) &&
                !(lim = cli_check_output_size("run", "--save-z", nz, limit)) &&
                !(lim = cli_check_output_size("run", "--save-contributions", nc, limit)) &&
                !(lim = cli_check_output_size("run", "--save-probs", np, limit)))
                lim = cli_check_output_size("run", "the outputs together", ny + nz + nc + np, limit);
            capture_end(&cap_text);
        }
        MPI_Allreduce(&lim, &code, 1, MPI_INT, MPI_MAX, comm);
        s = mha_mpi_agree(comm, lim ? MHA_E_ARG : MHA_OK, lim ? cap_text.text : NULL);
        if (rank == 0) free(cap_text.text);
    }
    if (!s) { /* rank 0 holds the outputs; the others only mark which are wanted */
        int ok = 1;
        if (rank == 0 || heads) ok = (y = malloc(sizeof(float) * rows * D)) != NULL;
        cap.z = !save_z ? NULL : rank == 0 ? malloc(sizeof(float) * rows * h * c->d_v) : (float *)&cap;
        cap.contributions = !save_c ? NULL : rank == 0 ? malloc(sizeof(float) * h * rows * D) : (float *)&cap;
        cap.probs = !save_p ? NULL : rank == 0 ? malloc(sizeof(float) * h * rows * St) : (float *)&cap;
        if (rank == 0 && ((save_z && !cap.z) || (save_c && !cap.contributions) || (save_p && !cap.probs))) ok = 0;
        s = mha_mpi_agree(comm, ok ? MHA_OK : MHA_E_NOMEM, ok ? NULL : "no memory for the outputs");
    }
    if (!s && heads) { /* this rank holds only its shard */
        s = decode ? run_decode(local, &hd, b_o, y, &f, (int)decode, comm, &st)
                   : mha_mpi_forward_heads(local, &hd, b_o, y, &cap, f.x.f, f.kv.f, B, T, f.S, &f.opt, comm, &st);
    } else if (!s) {
        s = mha_mpi_forward_sequence(L, y, &cap, f.x.f, f.kv.f, B, T, f.S, &f.opt, comm, &st);
    }

    // --- rank 0 writes the files (unbatched input: no B axis)
    if (!s) {
        int wr = 0;
        if (rank == 0) {
            capture_begin(&cap_text, rank);
            int k = f.batched ? 0 : 1;
            int sy[3] = {B, T, D}, sz[3] = {B, T, h * c->d_v}, sc[4] = {h, B, T, D}, sp[4] = {B, h, T, St};
            if (k) sc[1] = T, sc[2] = D;
            wr = cli_save(&outs, "--output", y, 3 - k, sy + k);
            if (!wr && save_z) wr = cli_save(&outs, "--save-z", cap.z, 3 - k, sz + k);
            if (!wr && save_c) wr = cli_save(&outs, "--save-contributions", cap.contributions, 4 - k, sc);
            if (!wr && save_p) wr = cli_save(&outs, "--save-probs", cap.probs, 4 - k, sp + k);
            wr = cli_outputs_finish(&outs, wr); /* all renamed, or all removed */
            capture_end(&cap_text);
        }
        s = mha_mpi_agree(comm, wr ? MHA_E_IO : MHA_OK, rank == 0 ? cap_text.text : NULL);
        if (rank == 0) free(cap_text.text);
    }
    if (!s && r.want_stats) { /* one line per rank, in rank order, from rank 0 */
        double mine[5] = {st.sent_bytes, st.formula_bytes, st.compute_s, st.total_s, st.cache_bytes}, *all = NULL;
        if (rank == 0) all = malloc(sizeof(double) * 5 * P);
        MPI_Gather(mine, 5, MPI_DOUBLE, all, 5, MPI_DOUBLE, 0, comm);
        for (int p = 0; rank == 0 && all && p < P; p++) {
            const double *a = all + 5 * p;
            printf("stats: split=%s rank=%d P=%d sent_bytes=%.0f formula_bytes=%.0f compute_s=%.6f total_s=%.6f",
                   heads ? "heads" : "sequence", p, P, a[0], a[1], a[2], a[3]);
            if (decode) printf(" cache_bytes=%.0f", a[4]);
            printf("\n");
        }
        free(all);
    }
    if (!s && rank == 0)
        printf("wrote %s: %s%d x %d x %d (h=%d, h_kv=%d, split=%s over %d ranks)\n", output,
               f.batched ? "" : "unbatched ", B, T, D, h, c->n_kv_heads, heads ? "heads" : "sequence", P);
    if (rank == 0) free(cap.z), free(cap.contributions), free(cap.probs);
    if (s && rank == 0) cli_outputs_finish(&outs, MHA_EXIT_RUNTIME); /* no temporary left */
    free(y), free(iv), free(b_o);
    cli_fwd_free(&f), cli_variants_free(&vf);
    mha_layer_free(L), mha_layer_free(local);
    return s ? report(rank, code ? code : MHA_EXIT_RUNTIME) : MHA_EXIT_OK;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rc;
    if (argc >= 2 && strcmp(argv[1], "run") == 0) {
        rc = run(argc - 1, argv + 1, MPI_COMM_WORLD);
    } else {
        int rank;
        MPI_Comm_rank(MPI_COMM_WORLD, &rank);
        if (rank == 0)
            fprintf(argc >= 2 && strcmp(argv[1], "--help") == 0 ? stdout : stderr,
                    "usage: mpirun -np P mha-mpi run --split heads|sequence [mha run flags] (see 'mha-mpi run --help')\n");
        rc = argc >= 2 && strcmp(argv[1], "--help") == 0 ? MHA_EXIT_OK : MHA_EXIT_USAGE;
    }
    MPI_Finalize();
    return rc;
}
