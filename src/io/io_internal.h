/* io_internal.h — helpers shared by the file readers and writers (src/io).
 * Files are little-endian; values are assembled byte by byte so the readers
 * do not depend on the host's byte order or on alignment. */
#ifndef MHA_IO_INTERNAL_H
#define MHA_IO_INTERNAL_H

#include <stdio.h>

#include "base/internal.h"
#include "core/weight_store.h"

/* Bytes of one element of dt in a file. */
size_t mha_dtype_size(mha_dtype dt);

/* IEEE half / bfloat16 bits <-> float. Narrowing rounds to nearest even. */
float mha_half_to_float(uint16_t h);
uint16_t mha_float_to_half(float f);
float mha_bf16_to_float(uint16_t b);

static inline uint16_t mha_le16(const unsigned char *p) {
    return (uint16_t)(p[0] | (p[1] << 8));
}
static inline uint32_t mha_le32(const unsigned char *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) |
           ((uint32_t)p[3] << 24);
}
static inline uint64_t mha_le64(const unsigned char *p) {
    return (uint64_t)mha_le32(p) | ((uint64_t)mha_le32(p + 4) << 32);
}

/* Allocates out->f or out->u8 for out->count elements of out->dtype. */
mha_status mha_array_alloc(mha_array *out);
/* count = product of shape[0..rank), checked against overflow of both the
 * element count and count * elem_size; the message names `what`. A bad
 * shape fails with `bad`: MHA_E_FORMAT where a file gave it, MHA_E_ARG where
 * the caller did. */
mha_status mha_shape_count(size_t *count, const int *shape, int rank, size_t elem_size,
                           const char *what, mha_status bad);
/* Decodes count little-endian elements of a->dtype from src into a. For
 * floating dtypes checks finiteness according to flags (MHA_IO_*); BOOL
 * bytes must be 0 or 1. what/tensor name the place in messages. Large
 * float16/bfloat16 arrays are widened by OpenMP threads in fixed chunks;
 * the error names the first bad element whatever the thread count. */
mha_status mha_array_decode(mha_array *a, const unsigned char *src, unsigned flags,
                            const char *what, const char *tensor);

/* Writes a's elements little-endian in file dtype dt (F32/F16 from float,
 * BOOL/U8 from bytes), encoded a chunk at a time: no copy of the array. */
typedef struct mha_out_file mha_out_file;
mha_status mha_array_write(mha_out_file *o, const mha_array *a, mha_dtype dt);

/* A regular file mapped read-only (map.c): p[0..len) with len = the size at
 * open (p NULL when the file is empty). check fails (MHA_E_IO) when the
 * file's size changed since open; close unmaps and closes. Readers check
 * every offset against len before touching p, check the size again after
 * decoding, and keep the mapping only while they need it. */
typedef struct {
    unsigned char *p;
    size_t len;
    int fd;
} mha_file_map;
mha_status mha_map_open(mha_file_map *m, const char *path);
/* The same without populating the mapping: pages are read as touched. */
mha_status mha_map_open_lazy(mha_file_map *m, const char *path);
mha_status mha_map_check(const mha_file_map *m, const char *path);
void mha_map_close(mha_file_map *m);

/* Whether the host stores float32 as the files do (IEEE, little-endian):
 * then F32 data is copied, written or borrowed as it is, without decoding. */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define MHA_HOST_LE_F32 1
#else
#define MHA_HOST_LE_F32 0
#endif

/* Checks a's float data in place (for arrays that borrow a file mapping):
 * the same finiteness rule and message as mha_array_decode. */
mha_status mha_array_check(const mha_array *a, unsigned flags, const char *what,
                           const char *tensor);

/* A safetensors file whose F32 tensors borrow the file's mapping instead of
 * being copied (safetensors.c): the set owns the mapping and unmaps it in
 * mha_tensors_free, so every borrowed pointer lives exactly as long as the
 * set. Other dtypes, and F32 data not 4-byte aligned in the file, are
 * decoded into owned arrays as mha_safetensors_read does. For short-lived
 * sets only (mha_layer_load): another process truncating the file while it
 * is mapped makes a read of a borrowed array fault. */
mha_status mha_safetensors_map(mha_tensors **out, const char *path, unsigned flags);

/* mha_safetensors_map / _read of only the tensors whose names start with
 * `only` without its final '.' (NULL or "": all): one layer of a larger
 * checkpoint ("model.layers.3") without decoding or checking the others
 * (a bf16 model is otherwise widened whole); when no name starts with
 * it, all of them (the caller's error then lists them). The header is
 * validated whole (safetensors.c). */
mha_status mha_io_map_only(mha_tensors **out, const char *path, unsigned flags, const char *only);
mha_status mha_io_read_only(mha_tensors **out, const char *path, unsigned flags, const char *only);

/* An output file written atomically (outfile.c): open creates a temporary
 * next to path; write appends; commit flushes, fsyncs and renames it over
 * path; abort (and a failed commit) removes it. Until commit succeeds an
 * existing file at path is untouched. A path that is a symbolic link is
 * written through: the link stays, the file it names gets the bytes. */
struct mha_out_file {
    FILE *f;
    int fd;
    char *tmp;        /* the temporary's path */
    const char *path; /* the target, as given (messages name it) */
    char *target;     /* the file a symbolic link path names, or NULL */
};
mha_status mha_out_open(mha_out_file *o, const char *path);
mha_status mha_out_write(mha_out_file *o, const void *p, size_t n);
mha_status mha_out_commit(mha_out_file *o);
void mha_out_abort(mha_out_file *o);

/* Whether a tensor holds real numbers (F32, F16, BF16, widened to float):
 * what weights, biases and per-head vectors must be. I8 tensors are held
 * as float too, but their values are quantized integers that mean
 * something only with their scales (a native file's int8 weights,
 * weights_meta.c); read as weights without them they would be about
 * 1 / scale times too large. */
static inline int mha_io_real(const mha_array *a) { return a->f && a->dtype != MHA_DTYPE_I8; }

/* MHA_OK when tensor `name` holds real numbers, else MHA_E_FORMAT naming
 * its dtype (for int8: where int8 weights do load) (layouts.c). */
mha_status mha_io_want_real(const mha_array *a, const char *name);
/* The metadata integer key (digits only, <= INT_MAX), 0 when absent;
 * MHA_E_FORMAT naming a bad value (layouts.c). */
mha_status mha_io_meta_int(int *out, const mha_tensors *t, const char *key);
/* The same for a size (n_heads, n_kv_heads, d_k, d_v): a "0" present is
 * MHA_E_FORMAT, not a missing value (layouts.c). */
mha_status mha_io_meta_count(int *out, const mha_tensors *t, const char *key);
/* n_heads and n_kv_heads: each from the load options, else the metadata
 * (mha_io_meta_count), else 0; option and metadata given must agree
 * (MHA_E_ARG) (layouts.c). */
mha_status mha_io_pick_heads(int *h, int *hkv, const mha_load_options *o, const mha_tensors *t);

/* Whether a tensor name is prefix+suffix (prefix given, "" too), or suffix
 * itself or ends in "." suffix (prefix NULL) (layouts.c). */
int mha_io_name_fits(const char *name, const char *prefix, const char *suffix);
/* The first tensor of t whose name fits prefix and suffix as above, or
 * NULL (layouts.c). */
const mha_array *mha_io_find(const mha_tensors *t, const char *prefix, const char *suffix);

/* Whether name is <path>suffix with path empty or ending in '.', and that
 * path inside the module prefix names (NULL or "": anywhere; "h.0" and
 * "h.0." both mean module h.0 and everything in it). *path_len: the
 * path's length (layouts.c). */
int mha_io_name_inside(const char *name, const char *prefix, const char *suffix, size_t *path_len);

/* A fused [Q; K; V] projection of the hf layout, rows [every q head;
 * every k head; every v head] (out, in), and its output projection:
 * Phi-3's qkv_proj / o_proj, Baichuan's W_pack / o_proj, MPT's and DBRX's
 * Wqkv / out_proj. mha_io_hf_fused: the one whose qkv weight lies inside
 * prefix, or NULL (layouts.c). */
typedef struct {
    const char *qkv, *o;
} mha_hf_fused_names;
const mha_hf_fused_names *mha_io_hf_fused(const mha_tensors *t, const char *prefix);

/* The megatron layout's fused projection inside prefix: "query_key_value"
 * (GPT-NeoX, Falcon, BLOOM; output "dense") or InternLM2's "wqkv" (output
 * "wo"), the same rows per kv group (layouts.c). */
const char *mha_io_megatron_qkv(const mha_tensors *t, const char *prefix);

/* The module names of an hf layer's Q, K, V and O projections, relative
 * to the layer's path (+ ".weight", ".bias"). */
typedef struct {
    const char *q, *k, *v, *o;
} mha_hf_names;

/* The naming scheme of the hf layer at prefix (exact, as
 * mha_io_name_fits): q_proj ... o_proj (Llama), ... out_proj (OPT, BART,
 * Whisper, GPT-J), self.query ... output.dense (BERT), attention.query ...
 * output.dense (ViT), q_lin ... out_lin (DistilBERT); the first whose Q
 * and O weights are there, else Llama's (for the errors) (layouts.c). */
const mha_hf_names *mha_io_hf_names(const mha_tensors *t, const char *prefix);

/* Whether path names a sharded checkpoint's index ("*.index.json";
 * mha_checkpoint_read reads it) (shards.c). */
int mha_io_is_index(const char *path);

/* Loader-only flag of the readers (above the public MHA_IO_* bits): a
 * tensor named *.masked_bias is not checked for finiteness. Older GPT-2,
 * GPT-J, GPT-Neo and GPT-NeoX checkpoints store that causal-mask fill
 * value (-1e9, -inf once saved in fp16) inside the attention module; no
 * layout reads it, and refusing it refused the whole layer. */
#define MHA_IO_UNCHECKED_FILL 0x100u

/* mha_checkpoint_read for the loaders: a file's tensors borrowed from its
 * lazy mapping (mha_io_map_only) instead of copied; a directory resolved,
 * an index's layer copied out of its shards (shards.c). */
mha_status mha_io_checkpoint_map(mha_tensors **out, const char *path, const char *prefix, unsigned flags);

/* The layout whose tensors lie inside the module prefix (NULL or "":
 * anywhere), as mha_layout_detect (layouts.c). */
mha_status mha_io_detect(mha_layout *out, const mha_tensors *t, const char *prefix);

/* o->prefix becomes the path of the one attention layer of o->layout
 * inside the module it names (NULL or "": anywhere), written to buf:
 * "h.0.attn." for "h.0" in a GPT-2 checkpoint, whose MLP's
 * "h.0.mlp.c_proj.weight" also ends in "c_proj.weight". When no layer
 * fits, o->prefix stays (NULL for ""; given without its final '.', it
 * gets one in buf) and the layout's lookups name what is missing; several layers inside a given prefix: MHA_E_FORMAT
 * listing them (without a prefix the lookups list the tensors). */
mha_status mha_io_layer_path(mha_load_options *o, char *buf, size_t cap, const mha_tensors *t);

/* Today's variants in a checkpoint (variants_meta.c). read: the settings
 * from the metadata into c (n_heads, n_kv_heads, d_k already set) and
 * copies of the per-head tensors into w = {alibi_slopes, sinks, q_norm,
 * k_norm} (NULL when absent; the caller frees them); hf: the norms are
 * q_norm.weight / k_norm.weight and their presence means RMS QK-norm.
 * write: the layer's settings and tensors into t. */
mha_status mha_io_variants_read(mha_config *c, float *w[4], const mha_tensors *t, const char *prefix, int hf);
/* The output gate of a native file (variants_meta.c): metadata output_gate
 * (0 or 1) into c, and w_g (d_model, h*d_v), b_g (h*d_v, with biases) into
 * g[0], g[1] (allocated); the config's shape and bias must be known. A
 * tensor without the flag, or the flag without its tensors: MHA_E_FORMAT.
 * i8_codes: an int8 file's w_g holds codes (weights_meta.c checked them
 * with their scales), copied as they are. */
mha_status mha_io_gate_read(mha_config *c, float *g[2], const mha_tensors *t, const char *prefix, int i8_codes);

/* StableLM's q/k LayerNorm, one nn.LayerNorm(d_k, bias=False) per head:
 * which = "q" or "k", tensors <which>_layernorm.norms.N.weight (d_k) for
 * N < heads inside prefix, gathered into a malloc'd (heads, d_k) in *out
 * (NULL when the module has none). A set of another size, a norm of
 * another width or any other q/k norm the loaders do not read (a LayerNorm
 * with bias: Phi, Persimmon) is MHA_E_FORMAT naming it, rather than a
 * layer that runs without it. */
mha_status mha_io_per_head_norms(float **out, const mha_tensors *t, const char *prefix, const char *which, int heads,
                                 int d_k);
/* MHA_E_FORMAT naming the first q/k norm tensor inside prefix that no
 * reader takes (q_layernorm.weight/.bias, q_norm.bias, their k ones): a
 * LayerNorm with bias (Phi's qk_layernorm, Persimmon, MPT's qk_ln). */
mha_status mha_io_refuse_unread_norms(const mha_tensors *t, const char *prefix);
mha_status mha_io_variants_write(mha_tensors *t, const mha_layer *L);

/* bf16 / int8 projection weights in a native checkpoint (weights_meta.c).
 * read: the dtype the metadata records (MHA_W_F32 without it), checked
 * against the dtypes of w (w_q..w_o, and w_g or NULL, as found), and for
 * int8 the scales (new arrays in scale[], the caller frees them); write:
 * w_q..w_o (and a gated layer's w_g) in the layer's dtype, the scales and
 * the metadata. */
mha_status mha_io_weights_read(mha_weight_dtype *dtype, float *scale[MHA_N_MATS], const mha_tensors *t,
                               const char *prefix, const mha_array *const w[MHA_N_MATS], const mha_config *c);
mha_status mha_io_weights_write(mha_tensors *t, const mha_layer *L);

#endif /* MHA_IO_INTERNAL_H */
