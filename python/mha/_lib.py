"""ctypes declarations of include/mha.h and the loaded libmha.so.

The structures mirror the C header field for field; ctypes lays them out
with the platform's C rules, so a field added to the header must be added
here in the same place. Enums are C ints. Only public symbols of mha.h are
bound.
"""
import ctypes
import ctypes.util
import glob
import os
from ctypes import (POINTER, Structure, c_char_p, c_double, c_float, c_int, c_size_t, c_uint8,
                    c_void_p)

_here = os.path.dirname(os.path.abspath(__file__))        # .../mha
_repo = os.path.dirname(os.path.dirname(_here))           # the checkout, when run from python/


def _next_to_package(package_dir):
    """libmha.so in <prefix>/lib when this package is installed under
    <prefix>/lib/pythonX.Y/site-packages (or Debian's
    <prefix>/lib/python3/dist-packages): two levels above the package's
    parent. Debian's pip puts `pip install --prefix P` under
    P/local/lib/python3.Y/dist-packages, so P/lib is tried after P/local/lib.
    Nothing for any other layout (e.g. python/ of a checkout)."""
    parent = os.path.dirname(package_dir)
    if os.path.basename(parent) not in ("site-packages", "dist-packages"):
        return []
    libdirs = [os.path.normpath(os.path.join(parent, "..", ".."))]
    if os.path.basename(os.path.dirname(libdirs[0])) == "local":
        libdirs.append(os.path.join(os.path.dirname(os.path.dirname(libdirs[0])), "lib"))
    paths = []
    for libdir in libdirs:
        versioned = sorted(glob.glob(os.path.join(libdir, "libmha.so.[0-9]*")), key=len)
        paths += [os.path.join(libdir, "libmha.so")] + versioned[:1]
    return paths


def _system_names():
    """Names for dlopen to find through the system's search path."""
    found = ctypes.util.find_library("mha")
    return ([found] if found else []) + ["libmha.so.0", "libmha.so"]


def find_library(env=None, package_dir=_here, repo=_repo):
    """(path or name to load, where it came from), first found in this order:
    1. $MHA_LIBRARY (set but missing: an error, never a silent fallback);
    2. <prefix>/lib next to the installed package;
    3. the system loader (ctypes.util.find_library("mha"), libmha.so.0);
    4. build/libmha.so of the repository this package sits in."""
    env = os.environ if env is None else env
    explicit = env.get("MHA_LIBRARY")
    if explicit:
        if not os.path.exists(explicit):
            raise ImportError(f"mha: MHA_LIBRARY={explicit} does not exist; expected the path of libmha.so")
        return explicit, "MHA_LIBRARY"
    for path in _next_to_package(package_dir):
        if os.path.exists(path):
            return path, "installed prefix"
    for name in _system_names():
        try:
            ctypes.CDLL(name)
            return name, "system loader"
        except OSError:
            pass
    build = os.path.join(repo, "build", "libmha.so")
    if os.path.exists(build):
        return build, "build tree"
    tried = _next_to_package(package_dir) + _system_names() + [build]
    raise ImportError("mha: libmha.so not found; tried " + ", ".join(tried) +
                      f". Run `make lib` (or `make install PREFIX=...`) or set MHA_LIBRARY")


path, found_by = find_library()
lib = ctypes.CDLL(path)
F32P = POINTER(c_float)
INTP = POINTER(c_int)

# --------------------------------------------------------------- status
OK, E_ARG, E_SHAPE, E_NOMEM, E_CONTRACT, E_NONFINITE, E_IO, E_FORMAT, E_UNSUPPORTED = (
    0, -1, -2, -3, -4, -5, -6, -7, -8)

BLOCKS = {"q": 0, "k": 1, "v": 2, "o": 3, "s": 4}
ROPE_PAIRING = {"none": 0, "halves": 1, "interleaved": 2}
ROPE_SCALING = {"none": 0, "linear": 1, "llama3": 2, "yarn": 3, "dynamic": 4, "longrope": 5}
ROPE_MAX_PAIRS = 128  # MHA_ROPE_MAX_PAIRS
TEMPERATURE_RULE = {"llama4": 0, "ministral3": 1}
QK_NORM = {"none": 0, "rms": 1, "layer": 2}
ALIGN = {"top_left": 0, "bottom_right": 1}
MASKED_ROW = {"zero": 0, "nan": 1}
HEAD_OP = {"keep": 0, "zero": 1, "scale": 2, "mean": 3, "replace": 4}
PATHS = {"auto": 0, "reference": 1, "fast": 2}


class Rope(Structure):
    _fields_ = [("pairing", c_int), ("dim", c_int), ("theta", c_double), ("scaling", c_int),
                ("factor", c_double), ("low_freq_factor", c_double), ("high_freq_factor", c_double),
                ("original_max_positions", c_int), ("beta_fast", c_double), ("beta_slow", c_double),
                ("attn_factor", c_double), ("short_factor", c_float * ROPE_MAX_PAIRS),
                ("long_factor", c_float * ROPE_MAX_PAIRS)]


class Config(Structure):
    _fields_ = [("d_model", c_int), ("n_heads", c_int), ("n_kv_heads", c_int),
                ("d_k", c_int), ("d_v", c_int), ("d_kv_in", c_int), ("bias", c_int),
                ("add_bias_kv", c_int), ("add_zero_attn", c_int), ("d_v_in", c_int),
                ("rope", Rope), ("alibi", c_int), ("softcap", c_float), ("sinks", c_int),
                ("qk_norm", c_int), ("qk_norm_per_head", c_int), ("qk_norm_eps", c_float),
                ("qk_norm_whole", c_int), ("clip_qkv", c_float), ("temperature_floor", c_int),
                ("temperature_scale", c_float), ("temperature_rule", c_int), ("output_gate", c_int)]


# the config fields of the plain layer's shape (the rest are today's variants)
SHAPE_FIELDS = ("d_model", "n_heads", "n_kv_heads", "d_k", "d_v", "d_kv_in", "bias", "add_bias_kv",
                "add_zero_attn", "d_v_in")

WEIGHT_NAMES = ("w_q", "w_k", "w_v", "w_o", "b_q", "b_k", "b_v", "b_o", "bias_k", "bias_v",
                "alibi_slopes", "sinks", "q_norm", "k_norm", "w_g", "b_g")


class Weights(Structure):
    _fields_ = [(n, F32P) for n in WEIGHT_NAMES]


class Intervention(Structure):
    _fields_ = [("op", c_int), ("scale", c_float), ("value", F32P)]


class Mask(Structure):
    _fields_ = [("data", c_void_p), ("batch", c_int), ("heads", c_int)]


class Options(Structure):
    _fields_ = [("scale", c_float), ("causal", c_int), ("align", c_int),
                ("window_left", c_int), ("window_right", c_int),
                ("keep_mask", Mask), ("additive_mask", Mask),
                ("key_keep", POINTER(c_uint8)), ("key_additive", F32P),
                ("masked_row", c_int), ("interventions", POINTER(Intervention)),
                ("path", c_int), ("positions", POINTER(c_int)), ("key_positions", POINTER(c_int)),
                ("sink_tokens", c_int), ("bf16_matmul", c_int), ("chunk_size", c_int),
                ("cu_seqlens", POINTER(c_int)), ("n_seqs", c_int),
                ("dropout_p", c_float), ("dropout_seed", ctypes.c_ulonglong)]


class Capture(Structure):
    _fields_ = [("z", F32P), ("contributions", F32P), ("probs", F32P)]


class CacheInfo(Structure):
    _fields_ = [("batch", c_int), ("capacity", c_int), ("window", c_int), ("sink_tokens", c_int),
                ("cross", c_int), ("k_dtype", c_int), ("v_dtype", c_int)]


class ContractReport(Structure):
    _fields_ = [("labels_ok", c_int), ("bad_block", c_int), ("bad_position", c_int),
                ("expected_label", c_int), ("found_label", c_int),
                ("residual_checked", c_int), ("max_residual", c_double)]


TORCH_FIELDS = ("in_proj_weight", "in_proj_bias", "q_proj_weight", "k_proj_weight",
                "v_proj_weight", "out_proj_weight", "out_proj_bias", "bias_k", "bias_v")


class TorchWeights(Structure):
    _fields_ = ([("embed_dim", c_int), ("num_heads", c_int), ("kdim", c_int),
                 ("vdim", c_int), ("add_zero_attn", c_int)]
                + [(n, F32P) for n in TORCH_FIELDS])


missing = []  # C functions this libmha.so lacks (an older or partial build)


LAYOUTS = {"auto": 0, "native": 1, "torch": 2, "hf": 3, "gpt2": 4, "megatron": 5, "codegen": 6}


class LoadOptions(Structure):
    _fields_ = [("layout", c_int), ("n_heads", c_int), ("n_kv_heads", c_int), ("prefix", c_char_p),
                ("add_zero_attn", c_int), ("output_gate", c_int)]


def _sig(name, restype, *argtypes):
    try:
        fn = getattr(lib, name)
    except AttributeError:
        # Bind what exists; calling a missing function explains itself.
        missing.append(name)

        def fn(*args, _name=name):
            raise NotImplementedError(f"{_name} is not in {lib._name}; rebuild it with `make lib`")
        setattr(lib, name, fn)
        return fn
    fn.restype = restype
    fn.argtypes = list(argtypes)
    return fn


LayerP = c_void_p
_sig("mha_status_str", c_char_p, c_int)
_sig("mha_last_error", c_char_p)
_sig("mha_config_default", Config, c_int, c_int)
_sig("mha_config_resolve", c_int, POINTER(Config), POINTER(Config))
_sig("mha_layer_create", c_int, POINTER(LayerP), POINTER(Config), POINTER(Weights))
_sig("mha_layer_free", None, LayerP)
_sig("mha_layer_set_weights", c_int, LayerP, POINTER(Weights))
_sig("mha_layer_get_weights", None, LayerP, POINTER(Weights))
_sig("mha_layer_config", POINTER(Config), LayerP)
_sig("mha_layer_labels", c_int, LayerP, c_int, INTP)
_sig("mha_layer_set_labels", c_int, LayerP, c_int, INTP)
_sig("mha_layer_permute_heads", c_int, LayerP, INTP)
_sig("mha_layer_permute_block", c_int, LayerP, c_int, INTP)
_sig("mha_layer_convert_weights", c_int, LayerP, c_int)
_sig("mha_layer_weights_dtype", c_int, LayerP)
_sig("mha_options_default", Options)
_sig("mha_forward", c_int, LayerP, F32P, POINTER(Capture), F32P, F32P, c_int, c_int, c_int,
     POINTER(Options))
_sig("mha_forward_kv", c_int, LayerP, F32P, POINTER(Capture), F32P, F32P, F32P, c_int, c_int, c_int,
     POINTER(Options))
_sig("mha_set_num_threads", None, c_int)
_sig("mha_get_num_threads", c_int)
_sig("mha_layer_check_contract", c_int, LayerP, F32P, F32P, c_int, c_int, c_int,
     POINTER(Options), POINTER(ContractReport))
_sig("mha_concat_heads", c_int, F32P, POINTER(F32P), INTP, c_int, c_int, c_int)
_sig("mha_split_heads", c_int, POINTER(F32P), F32P, c_int, c_int, c_int)
_sig("mha_project_out", c_int, F32P, F32P, F32P, F32P, c_int, c_int, c_int)
_sig("mha_head_contributions", c_int, F32P, F32P, F32P, c_int, c_int, c_int, c_int)
_sig("mha_alibi_slopes", c_int, F32P, c_int)
_sig("mha_head_intervene", c_int, F32P, POINTER(Intervention), c_int, c_int, c_int, c_int)
_sig("mha_layer_from_torch", c_int, POINTER(LayerP), POINTER(TorchWeights))
_sig("mha_layer_load", c_int, POINTER(LayerP), c_char_p, POINTER(LoadOptions))
_sig("mha_layer_save", c_int, LayerP, c_char_p)
_sig("mha_checkpoint_resolve", c_int, c_char_p, c_size_t, c_char_p)

# projection weight storage (mha_weight_dtype)
WEIGHT_DTYPES = {"f32": 0, "bf16": 1, "int8": 2}

# ---------------------------------------------- KV cache (src/cache/cache.c)
CACHE_F32, CACHE_F16, CACHE_I8 = 0, 1, 2  # mha_cache_dtype
CacheP = c_void_p
_sig("mha_cache_create", c_int, POINTER(CacheP), LayerP, c_int, c_int, c_int, c_int)
_sig("mha_cache_free", None, CacheP)
_sig("mha_cache_bytes", c_size_t, CacheP)
_sig("mha_cache_bytes_for", c_size_t, POINTER(Config), c_int, c_int, c_int)
_sig("mha_cache_create_kv", c_int, POINTER(CacheP), LayerP, c_int, c_int, c_int, c_int, c_int)
_sig("mha_cache_bytes_for_kv", c_size_t, POINTER(Config), c_int, c_int, c_int, c_int)
_sig("mha_cache_length", c_int, CacheP, c_int)
_sig("mha_cache_reset", c_int, CacheP, c_int)
_sig("mha_cache_truncate", c_int, CacheP, c_int, c_int)
_sig("mha_cache_compact", c_int, CacheP, c_int, c_int, INTP, c_int)
_sig("mha_cache_set_sink_tokens", c_int, CacheP, c_int)
_sig("mha_cache_permute_heads", c_int, CacheP, INTP)
_sig("mha_cache_reorder", c_int, CacheP, INTP)
_sig("mha_cache_clone", c_int, POINTER(CacheP), CacheP)
_sig("mha_cache_save", c_int, CacheP, c_char_p)
_sig("mha_cache_get_info", c_int, CacheP, POINTER(CacheInfo))
_sig("mha_cache_load", c_int, POINTER(CacheP), LayerP, c_char_p)
_sig("mha_cache_create_cross", c_int, POINTER(CacheP), LayerP, c_int, c_int, c_int, c_int)
_sig("mha_cache_set_memory", c_int, CacheP, LayerP, F32P, F32P, c_int, INTP)
_sig("mha_forward_cached", c_int, LayerP, CacheP, F32P, POINTER(Capture), F32P, c_int, INTP,
     POINTER(Options))
_sig("mha_cache_append", c_int, CacheP, F32P, F32P, c_int, INTP)
_sig("mha_cache_attend", c_int, CacheP, F32P, F32P, c_int, INTP, c_float)

# ------------------------------- backward and attribution (mha.h; mha.nn)
GRAD_NAMES = ("dx", "dk_src", "dv_src", "dw_q", "dw_k", "dw_v", "dw_o", "db_q", "db_k", "db_v",
              "db_o", "dbias_k", "dbias_v", "d_sinks", "d_q_norm", "d_k_norm", "dw_g", "db_g")


class Gradients(Structure):
    _fields_ = [(n, F32P) for n in GRAD_NAMES]


_sig("mha_backward_kv", c_int, LayerP, POINTER(Gradients), F32P, F32P, F32P, F32P, c_int, c_int,
     c_int, POINTER(Options))
# training: a forward that keeps a tape for its backward (mha.nn)
TapeP = c_void_p
_sig("mha_forward_train", c_int, LayerP, F32P, POINTER(TapeP), F32P, F32P, F32P, c_int, c_int, c_int,
     POINTER(Options))
_sig("mha_backward_tape", c_int, LayerP, TapeP, POINTER(Gradients), F32P, F32P, F32P, F32P, c_int, c_int,
     c_int, POINTER(Options))
_sig("mha_tape_free", None, TapeP)
_sig("mha_head_attribution", c_int, LayerP, F32P, F32P, F32P, F32P, F32P, F32P, c_int, c_int, c_int,
     POINTER(Options))

# ------------------------------------------- the structs, against the library's
_sig("mha_struct_size", c_size_t, c_char_p)
STRUCTS = {"mha_rope": Rope, "mha_config": Config, "mha_weights": Weights, "mha_intervention": Intervention,
           "mha_mask": Mask, "mha_options": Options, "mha_capture": Capture, "mha_cache_info": CacheInfo,
           "mha_contract_report": ContractReport, "mha_torch_weights": TorchWeights,
           "mha_load_options": LoadOptions, "mha_gradients": Gradients}


def check_struct_sizes(size_of):
    """ImportError naming the first struct whose size differs between these
    declarations and the library (size_of: name -> its sizeof there, 0 for
    a name it does not know): a library of another version, whose calls
    would read or write past the binding's structs."""
    for name, cls in STRUCTS.items():
        theirs = size_of(name)
        if theirs != ctypes.sizeof(cls):
            raise ImportError(f"mha: {lib._name} declares {name} as {theirs} bytes, this binding as "
                              f"{ctypes.sizeof(cls)}: the library is of another version; expected the "
                              "libmha.so built from this source (`make lib`, or MHA_LIBRARY=its path)")


if "mha_struct_size" not in missing:  # an older build lacks it: its missing calls name themselves
    check_struct_sizes(lambda name: lib.mha_struct_size(name.encode()))
