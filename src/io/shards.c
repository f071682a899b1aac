/* shards.c — a Hugging Face sharded checkpoint: "*.safetensors.index.json"
 * maps each tensor name to the shard file holding it ({"weight_map":
 * {name: "model-00001-of-00004.safetensors", ...}}). One attention layer
 * is read from it: the layer is found in the index by one tensor per
 * layer (as mha_io_layer_path does in a file), and only its tensors are
 * copied out of the shards that hold them, so a layer split across two
 * shards loads and the other layers' bytes are never decoded beyond what
 * mapping a shard costs. */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "io/io_internal.h"

/* An index is a few hundred bytes per tensor; anything far larger is not one. */
#define INDEX_MAX_BYTES ((long long)64 << 20)

int mha_io_is_index(const char *path) {
    const size_t n = strlen(path), s = strlen(".index.json");
    return n > s && strcmp(path + n - s, ".index.json") == 0;
}

/* One tensor per attention layer, in every layout. */
static const char *const anchors[] = {"w_q",           "out_proj.weight",   "q_proj.weight",          "qkv_proj.weight",
                                      "c_attn.weight", "self.query.weight", "attention.query.weight", "q_lin.weight",
                                      "query_key_value.weight", "wqkv.weight", "W_pack.weight", "Wqkv.weight"};
#define N_ANCHORS ((int)(sizeof anchors / sizeof anchors[0]))

/* The path of the one layer inside prefix among the index's names, into
 * path (cap bytes). */
static mha_status find_layer(char *path, size_t cap, json_t *map, const char *prefix) {
    int layers = 0;
    char list[256] = "";
    size_t used = 0, len, seen_len[16];
    const char *name, *seen[16]; /* the first layers' paths (name, length): one layer may hold two anchors */
    json_t *v;
    json_object_foreach(map, name, v) {
        for (int a = 0; a < N_ANCHORS; a++) {
            if (!mha_io_name_inside(name, prefix, anchors[a], &len)) continue;
            int known = 0;
            for (int i = 0; i < layers && i < 16; i++) known |= seen_len[i] == len && !strncmp(seen[i], name, len);
            if (known) continue;
            if (layers < 16) seen[layers] = name, seen_len[layers] = len;
            if (!layers++) {
                if (len >= cap) return mha_fail(MHA_E_FORMAT, "tensor name '%.60s...' is too long", name);
                memcpy(path, name, len), path[len] = 0;
            }
            if (used < sizeof list)
                used += (size_t)snprintf(list + used, sizeof list - used, "%s'%.*s'", used ? ", " : "",
                                         (int)(len < 60 ? len : 60), name);
        }
    }
    if (layers == 1) return MHA_OK;
    const char *in = prefix && *prefix ? prefix : "";
    if (!layers)
        return mha_fail(MHA_E_FORMAT, "weight_map has no attention layer%s%.60s%s; expected a tensor ending in "
                        "w_q, out_proj.weight, q_proj.weight, qkv_proj.weight, c_attn.weight, self.query.weight, "
                        "attention.query.weight, q_lin.weight, query_key_value.weight, wqkv.weight, W_pack.weight "
                        "or Wqkv.weight",
                        *in ? " inside prefix '" : "", in, *in ? "'" : "");
    return mha_fail(MHA_E_FORMAT, "weight_map has %d attention layers%s%.60s%s (%s); expected one: pass the "
                    "prefix of one of them (--prefix)", layers, *in ? " inside prefix '" : "", in, *in ? "'" : "", list);
}

/* Copies the tensors of layer `path` that map to shard `file` from it. */
static mha_status copy_shard(mha_tensors *out, json_t *map, const char *dir, const char *file, const char *path,
                             unsigned flags, int first) {
    char full[4096];
    if ((size_t)snprintf(full, sizeof full, "%s%s", dir, file) >= sizeof full)
        return mha_fail(MHA_E_ARG, "shard path '%.60s...' is too long", full);
    mha_tensors *shard = NULL;
    mha_status s = mha_io_map_only(&shard, full, flags, path); /* the layer's tensors alone */
    const char *name;
    json_t *v;
    json_object_foreach(map, name, v) {
        if (s) break;
        if (strncmp(name, path, strlen(path)) != 0 || strcmp(json_string_value(v), file) != 0) continue;
        const mha_array *a = mha_tensors_get(shard, name);
        s = a ? mha_tensors_add(out, name, a)
              : mha_fail(MHA_E_FORMAT, "%s has no tensor '%.80s', which the index places there", file, name);
    }
    for (int i = 0; !s && first && i < mha_tensors_meta_count(shard); i++) /* the shards' metadata agree */
        s = mha_tensors_set_meta(out, mha_tensors_meta_key(shard, i), mha_tensors_meta(shard, mha_tensors_meta_key(shard, i)));
    mha_tensors_free(shard);
    return s;
}

/* Every shard name the layer's tensors use must be a file beside the index. */
static mha_status check_files(json_t *map, const char *path) {
    const char *name;
    json_t *v;
    json_object_foreach(map, name, v) {
        if (strncmp(name, path, strlen(path)) != 0) continue;
        const char *f = json_string_value(v);
        if (!f || !*f || strchr(f, '/') || f[0] == '.')
            return mha_fail(MHA_E_FORMAT, "weight_map['%.80s'] is %s%.60s%s; expected the name of a shard file "
                            "beside the index", name, f ? "'" : "not a string", f ? f : "", f ? "'" : "");
    }
    return MHA_OK;
}

static mha_status read_index(mha_tensors *out, const char *index, const char *prefix, unsigned flags) {
    struct stat st;
    if (stat(index, &st) != 0) return mha_fail(MHA_E_IO, "cannot open '%s': %s", index, strerror(errno));
    if (!S_ISREG(st.st_mode)) /* a pipe would block the read below */
        return mha_fail(MHA_E_IO, "cannot read '%s': not a regular file; expected a regular file", index);
    if ((long long)st.st_size > INDEX_MAX_BYTES)
        return mha_fail(MHA_E_FORMAT, "index of %lld bytes; expected at most %lld", (long long)st.st_size,
                        INDEX_MAX_BYTES);
    json_error_t jerr;
    json_t *root = json_load_file(index, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) return mha_fail(MHA_E_FORMAT, "line %d: %s; expected a sharded checkpoint's JSON index", jerr.line, jerr.text);
    json_t *map = json_object_get(root, "weight_map");
    char path[4096], dir[4096] = "";
    const char *slash = strrchr(index, '/');
    if (slash && (size_t)(slash - index + 1) < sizeof dir) memcpy(dir, index, (size_t)(slash - index + 1));
    mha_status s = json_is_object(map) ? MHA_OK
                                       : mha_fail(MHA_E_FORMAT, "no \"weight_map\" object; expected {\"weight_map\": "
                                                  "{tensor name: shard file, ...}}");
    if (!s) s = find_layer(path, sizeof path, map, prefix);
    if (!s) s = check_files(map, path);
    /* each shard once, in the order the layer's names first use them */
    const char *name, *done[64];
    int n_done = 0;
    json_t *v;
    json_object_foreach(map, name, v) {
        if (s) break;
        if (strncmp(name, path, strlen(path)) != 0) continue;
        const char *f = json_string_value(v);
        int seen = 0;
        for (int i = 0; i < n_done; i++) seen |= strcmp(done[i], f) == 0;
        if (seen) continue;
        if (n_done == 64) s = mha_fail(MHA_E_FORMAT, "one layer's tensors in more than 64 shards");
        else s = copy_shard(out, map, dir, f, path, flags, n_done == 0), done[n_done++] = f;
    }
    json_decref(root);
    return s;
}

mha_status mha_checkpoint_resolve(char *out, size_t cap, const char *path) {
    if (!out || !cap || !path) return mha_fail(MHA_E_ARG, "mha_checkpoint_resolve: NULL argument");
    struct stat st;
    const char *name = NULL;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) { /* save_pretrained's directory */
        static const char *const inside[2] = {"model.safetensors", "model.safetensors.index.json"};
        char file[4096];
        const size_t n = strlen(path);
        for (int i = 0; i < 2 && !name; i++) {
            snprintf(file, sizeof file, "%s%s%s", path, n && path[n - 1] == '/' ? "" : "/", inside[i]);
            if (stat(file, &st) == 0 && S_ISREG(st.st_mode)) name = file;
        }
        if (!name)
            return mha_fail(MHA_E_IO, "directory '%.200s' holds neither model.safetensors nor "
                            "model.safetensors.index.json; expected a checkpoint file or such a directory", path);
        if (strlen(name) >= cap) return mha_fail(MHA_E_ARG, "path '%.60s...' is too long", name);
        memcpy(out, name, strlen(name) + 1);
        return MHA_OK;
    }
    if (strlen(path) >= cap) return mha_fail(MHA_E_ARG, "path '%.60s...' is too long", path);
    memcpy(out, path, strlen(path) + 1);
    return MHA_OK;
}

/* The tensors of checkpoint path (a file, an index or a directory): a
 * file's are borrowed from its mapping (borrow) or copied, an index's
 * layer is always copied out of its shards. */
static mha_status open_checkpoint(mha_tensors **out, const char *path, const char *prefix, unsigned flags,
                                  int borrow) {
    char file[4096];
    mha_status s = mha_checkpoint_resolve(file, sizeof file, path);
    if (s) return s;
    if (!mha_io_is_index(file))
        return borrow ? mha_io_map_only(out, file, flags, prefix) : mha_io_read_only(out, file, flags, prefix);
    s = mha_tensors_create(out);
    if (!s) s = read_index(*out, file, prefix, flags);
    if (s) {
        mha_tensors_free(*out);
        *out = NULL;
        char msg[400];
        snprintf(msg, sizeof msg, "%s", mha_last_error());
        return mha_fail(s, "%s: %s", file, msg);
    }
    return MHA_OK;
}

mha_status mha_checkpoint_read(mha_tensors **out, const char *path, const char *prefix, unsigned flags) {
    if (!out || !path) return mha_fail(MHA_E_ARG, "mha_checkpoint_read: NULL argument");
    *out = NULL;
    return open_checkpoint(out, path, prefix, flags, 0);
}

mha_status mha_io_checkpoint_map(mha_tensors **out, const char *path, const char *prefix, unsigned flags) {
    *out = NULL;
    return open_checkpoint(out, path, prefix, flags, 1);
}
