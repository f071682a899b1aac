"""Layer: one mha_layer with numpy in and out.

Shapes follow mha.h (legend: B batch, T queries, S keys, h heads, h_kv kv
heads, d_k, d_v, d_model, d_kv_in key source width, d_v_in value source
width). Weights are (in, out), row-major.
"""
import ctypes
import inspect
import os

import numpy as np

from . import _lib
from ._arrays import bools, check_shape, floats, fptr, host, ints, u8ptr
from ._check import INT_MAX, c_flag, c_float, c_int, names as capture_names
from ._owner import COwner
from .errors import ArgumentError, ConfigNotAppliedWarning, ShapeError, check

_L = _lib.lib


def _enum(name, value, table):
    if isinstance(value, str) and value in table:
        return table[value]
    if isinstance(value, int) and not isinstance(value, bool) and value in table.values():
        return value
    raise ArgumentError(f"{name}={value!r}; expected one of {', '.join(table)}")


def window(name, value):
    """None (unbounded) or 0..INT_MAX; -1 also means unbounded, as in C."""
    return -1 if value is None else c_int(name, value, -1, INT_MAX)


def _c_path(name, value):
    """os.fsencode(value) for a C string: an embedded NUL would end the C
    string early, so 'out.st\\0x' would write 'out.st'. Refused, as
    Python's open() refuses it."""
    b = os.fsencode(value)
    if b"\0" in b:
        raise ArgumentError(f"{name}={value!r} holds a NUL character, where the C string would end; "
                            "expected none")
    return b


def _tensor_names(path):
    """The tensor names of a resolved checkpoint: a safetensors header
    (8-byte little-endian length, then JSON) or an index's weight_map; ()
    when they cannot be read (the load has already succeeded, so this
    only decides whether to warn)."""
    import json
    try:
        if path.endswith(".index.json"):
            with open(path, "rb") as f:
                return tuple(json.load(f).get("weight_map", {}))
        with open(path, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            return tuple(k for k in json.loads(f.read(min(n, 100 << 20))) if k != "__metadata__")
    except Exception:  # a hostile header of any shape: the library's own reader names what is wrong
        return ()


def _unapplied_config(path, layout):
    """The config.json beside a Hugging Face style checkpoint (hf, megatron,
    gpt2 names) that mha_layer_load does not read, or None: a native file
    holds its settings in its metadata, a torch state dict has none."""
    buf = ctypes.create_string_buffer(4096)
    if _L.mha_checkpoint_resolve(buf, len(buf), _c_path("path", path)):
        return None
    resolved = os.fsdecode(buf.value)
    config = os.path.join(os.path.dirname(resolved), "config.json")
    if layout in ("native", "torch") or not os.path.isfile(config):
        return None
    if layout == "auto":
        names = _tensor_names(resolved)
        if any(isinstance(n, str) and (n == "w_q" or n.endswith(".w_q") or n.endswith("in_proj_weight"))
               for n in names):
            return None
    return config


def _config_message(config, path):
    return (f"Layer.load: {config} lies beside this checkpoint and is not read here: the settings it "
            f"holds (rotary embedding, sliding window, soft-cap, QK-norm eps, clip_qkv, ...) are not in "
            f"the layer; expected `mha convert {path} OUT.safetensors --to native` (with --prefix for one "
            f"layer), which writes them into a native file Layer.load reads whole, or `mha run`, which "
            f"applies them (config_json='ignore' loads the weights alone without this warning)")


def _block(block):
    return _enum("block", block.lower() if isinstance(block, str) else block, _lib.BLOCKS)


class ContractReport:
    """mha_contract_report plus the library's message (\"\" when ok)."""

    def __init__(self, rep, message):
        names = {v: k.upper() for k, v in _lib.BLOCKS.items()}
        self.labels_ok = bool(rep.labels_ok)
        self.bad_block = names.get(rep.bad_block, rep.bad_block)
        self.bad_position = rep.bad_position
        self.expected_label = rep.expected_label
        self.found_label = rep.found_label
        self.residual_checked = bool(rep.residual_checked)
        self.max_residual = rep.max_residual
        self.message = message
        self.ok = not message

    def __repr__(self):
        return (f"ContractReport(ok={self.ok}, labels_ok={self.labels_ok}, "
                f"residual_checked={self.residual_checked}, max_residual={self.max_residual:.3g}, "
                f"message={self.message!r})")


def _temperature(temperature):
    """Llama 4's query temperature as (floor, scale, rule) C values: None
    is (0, 0.0, 0), none; else (floor_scale, attn_scale) or (floor, scale,
    rule) with rule 'llama4' (floor((p + 1) / F), the default) or
    'ministral3' (floor(p / F)), the library judging the values."""
    if temperature is None:
        return 0, 0.0, 0
    if not isinstance(temperature, (tuple, list)) or len(temperature) not in (2, 3):  # a dict, a set: no items
        raise ArgumentError(f"temperature={temperature!r}; expected None, (floor_scale, attn_scale), e.g. "
                            "(8192, 0.1) (Llama 4), or (floor, scale, 'llama4' | 'ministral3')")
    rule = _enum("temperature rule", temperature[2], _lib.TEMPERATURE_RULE) if len(temperature) == 3 else 0
    return (c_int("temperature floor_scale", temperature[0], 0), c_float("temperature attn_scale", temperature[1]),
            rule)


def _rope_struct(rope):
    """mha_rope from None or a dict: pairing ('halves'|'interleaved'), dim,
    theta, scaling ('none'|'linear'|'llama3'|'yarn'|'dynamic'|'longrope'),
    factor, low_freq_factor, high_freq_factor, original_max_positions,
    beta_fast, beta_slow, attn_factor (0 = the library's defaults);
    short_factor, long_factor: LongRoPE's lists, one factor per rotated pair."""
    r = _lib.Rope()
    if rope is None:
        return r
    if not isinstance(rope, dict):
        raise ArgumentError(f"rope={rope!r}; expected None or a dict with 'pairing' and optional parameters")
    known = {n for n, _ in _lib.Rope._fields_}
    unknown = set(rope) - known
    if unknown:
        raise ArgumentError(f"rope keys {sorted(unknown)}; expected among {sorted(known)}")
    for name, ctype in _lib.Rope._fields_:
        if name not in rope:
            continue
        v = rope[name]
        if name == "pairing":
            v = _enum("rope.pairing", v, _lib.ROPE_PAIRING)
        elif name == "scaling":
            v = _enum("rope.scaling", v, _lib.ROPE_SCALING)
        elif name in ("short_factor", "long_factor"):
            v = _factor_list(f"rope.{name}", v)
        elif ctype is ctypes.c_int:
            v = c_int(f"rope.{name}", v, 0)
        else:
            v = c_float(f"rope.{name}", v)
        setattr(r, name, v)
    return r


def _factor_list(name, v):
    """LongRoPE's factors: a list of up to ROPE_MAX_PAIRS numbers (the
    library checks that it has one per rotated pair and each is > 0; an
    empty list is the other scalings' none)."""
    bad = isinstance(v, (str, bytes)) or not hasattr(v, "__iter__")
    items = [] if bad else list(v)
    if bad or any(isinstance(x, (bool, str, bytes)) for x in items):
        raise ArgumentError(f"{name}={v!r}; expected a list of numbers, one per rotated pair")
    try:
        vals = [float(x) for x in items]
    except (TypeError, ValueError):
        raise ArgumentError(f"{name}={v!r}; expected a list of numbers, one per rotated pair") from None
    if len(vals) > _lib.ROPE_MAX_PAIRS:
        raise ArgumentError(f"{name} has {len(vals)} items; expected at most {_lib.ROPE_MAX_PAIRS}, "
                            "one per rotated pair")
    arr = (ctypes.c_float * _lib.ROPE_MAX_PAIRS)()
    arr[:len(vals)] = vals
    return arr


def _positions(name, arr, shape):
    """A C-int (shape) array of token positions; floats, bools and values
    beyond a C int are refused (the library checks the range)."""
    a = host(name, arr)  # torch tensors too; one off the CPU is refused naming it
    if not np.issubdtype(a.dtype, np.integer) or a.dtype == np.bool_:
        raise ArgumentError(f"{name} has dtype {a.dtype}; expected integers")
    if a.shape != shape:
        raise ShapeError(f"{name} has shape {a.shape}; expected {shape}")
    if a.size and (a.min() < -2 ** 31 or a.max() > INT_MAX):
        raise ArgumentError(f"{name} holds values beyond a C int; expected positions 0..2^30")
    return np.ascontiguousarray(a, dtype=np.intc)


def _cu_seqlens(cu_seqlens, T):
    """The ctypes int array of packed-sequence boundaries (a list, a tuple,
    an integer numpy array or torch tensor) of n + 1 >= 2 ints; ShapeError
    (naming cu_seqlens) otherwise. Their rule, 0 = cu[0] < ... < cu[n] = T,
    is the library's to check (mha.nn.Attention states it for an empty
    input, which the library never sees)."""
    # a list's elements are judged one by one by ints(); anything else is made an array
    # first: np.size of a torch tensor (FlashAttention's int32 cu_seqlens) is its .size method
    seq = list(cu_seqlens) if isinstance(cu_seqlens, (list, tuple)) else host("cu_seqlens", cu_seqlens)
    n = len(seq) if isinstance(seq, list) else seq.size
    if (not isinstance(seq, list) and seq.ndim != 1) or n < 2:
        shown = seq if isinstance(seq, list) else seq.tolist()
        raise ShapeError(f"cu_seqlens is {shown!r}; expected n + 1 >= 2 "
                         f"boundaries 0 = cu[0] < ... < cu[n] = T={T}")
    return ints("cu_seqlens", seq, n)


class Layer(COwner):
    """A multi-head attention layer (a copy of the weights lives in C).

    Layer(d_model, n_heads, n_kv_heads=0, d_k=0, d_v=0, d_kv_in=0, bias=True,
          add_bias_kv=False, add_zero_attn=False, weights=None, d_v_in=0)
    weights: dict with w_q (d_model,h*d_k), w_k (d_kv_in,h_kv*d_k),
    w_v (d_v_in,h_kv*d_v), w_o (h*d_v,d_model), b_q, b_k, b_v, b_o (when
    bias), bias_k, bias_v (when add_bias_kv); None gives zero weights.
    d_v_in: width of a value source apart from the keys (PyTorch's vdim);
    0 means d_kv_in.
    """

    _free_name = "mha_layer_free"
    _kind = "layer"

    # torch_forward's layout when not told otherwise: False, PyTorch's
    # default, (T,B,E); forward() is always (B,T,d_model).
    batch_first = False

    def __init__(self, d_model, n_heads, n_kv_heads=0, d_k=0, d_v=0, d_kv_in=0, bias=True,
                 add_bias_kv=False, add_zero_attn=False, weights=None, d_v_in=0, *, rope=None,
                 alibi=False, softcap=0.0, sinks=False, qk_norm="none", qk_norm_per_head=False,
                 qk_norm_eps=0.0, qk_norm_whole=False, clip_qkv=0.0, temperature=None, temperature_floor=0,
                 temperature_scale=0.0, temperature_rule="llama4", output_gate=False):
        if temperature_floor or temperature_scale or temperature_rule not in ("llama4", 0):
            # the fields of Layer.config, so that Layer(**other.config) makes the same layer
            if temperature is not None:
                raise ArgumentError("temperature= and temperature_floor/_scale/_rule given together; expected one "
                                    "of them")
            temperature = (temperature_floor, temperature_scale, temperature_rule)
        cfg = _lib.Config(c_int("d_model", d_model, 1), c_int("n_heads", n_heads, 1),
                          c_int("n_kv_heads", n_kv_heads, 0), c_int("d_k", d_k, 0), c_int("d_v", d_v, 0),
                          c_int("d_kv_in", d_kv_in, 0), c_flag("bias", bias),
                          c_flag("add_bias_kv", add_bias_kv), c_flag("add_zero_attn", add_zero_attn),
                          c_int("d_v_in", d_v_in, 0), _rope_struct(rope), c_flag("alibi", alibi),
                          c_float("softcap", softcap), c_flag("sinks", sinks),
                          _enum("qk_norm", qk_norm, _lib.QK_NORM),
                          c_flag("qk_norm_per_head", qk_norm_per_head or qk_norm_whole),
                          c_float("qk_norm_eps", qk_norm_eps), c_flag("qk_norm_whole", qk_norm_whole),
                          c_float("clip_qkv", 0.0 if clip_qkv is None else clip_qkv), *_temperature(temperature),
                          c_flag("output_gate", output_gate))
        resolved = _lib.Config()
        check(_L.mha_config_resolve(ctypes.byref(resolved), ctypes.byref(cfg)), "mha_config_resolve")
        handle = _lib.LayerP()
        if weights is None:
            check(_L.mha_layer_create(ctypes.byref(handle), ctypes.byref(cfg), None), "mha_layer_create")
        else:
            w, keep = self._weights_struct(resolved, weights)
            check(_L.mha_layer_create(ctypes.byref(handle), ctypes.byref(cfg), ctypes.byref(w)),
                  "mha_layer_create")
            del keep
        self._ptr = handle

    @classmethod
    def _adopt(cls, handle):
        obj = cls.__new__(cls)
        obj._ptr = handle
        return obj


    # ------------------------------------------------------------ config
    @property
    def config(self):
        """The resolved mha_config as a dict (no zero defaults left)."""
        with self._borrow() as ptr:
            c = _L.mha_layer_config(ptr).contents
            out = {n: getattr(c, n) for n, _ in _lib.Config._fields_}
            out["rope"] = {n: getattr(c.rope, n) for n, _ in _lib.Rope._fields_}
            for field, table in (("pairing", _lib.ROPE_PAIRING), ("scaling", _lib.ROPE_SCALING)):
                out["rope"][field] = {v: k for k, v in table.items()}[out["rope"][field]]
            pairs = c.rope.dim // 2 if out["rope"]["scaling"] == "longrope" else 0
            for field in ("short_factor", "long_factor"):  # the rotated pairs' factors
                out["rope"][field] = list(getattr(c.rope, field))[:pairs]
            out["qk_norm"] = {v: k for k, v in _lib.QK_NORM.items()}[out["qk_norm"]]
            out["temperature_rule"] = {v: k for k, v in _lib.TEMPERATURE_RULE.items()}[out["temperature_rule"]]
            return out

    def __getattr__(self, name):
        if name in {n for n, _ in _lib.Config._fields_}:
            return self.config[name]
        raise AttributeError(name)

    def __setattr__(self, name, value):
        # The config lives in C; an attribute of that name would only shadow
        # it here (layer.add_zero_attn = True, a torch module's habit, would
        # read back True and change nothing).
        if name in {n for n, _ in _lib.Config._fields_}:
            raise AttributeError(f"{name} is part of the layer's config, fixed at creation; expected a "
                                 f"new Layer (or from_torch_state_dict) with {name}={value!r}")
        super().__setattr__(name, value)

    def __repr__(self):
        if not self._ptr:
            return "Layer(closed)"
        c = self.config
        return "Layer(" + ", ".join(f"{k}={v}" for k, v in c.items()) + ")"

    # ----------------------------------------------------------- weights
    @staticmethod
    def _weight_shapes(c):
        h, g = c.n_heads, c.n_kv_heads
        shapes = {
            "w_q": (c.d_model, h * c.d_k), "w_k": (c.d_kv_in, g * c.d_k),
            "w_v": (c.d_v_in, g * c.d_v), "w_o": (h * c.d_v, c.d_model),
            "b_q": (h * c.d_k,), "b_k": (g * c.d_k,), "b_v": (g * c.d_v,), "b_o": (c.d_model,),
            "bias_k": (g * c.d_k,), "bias_v": (g * c.d_v,),
        }
        # the variants' tensors exist only when their switch is on
        if getattr(c, "alibi", 0):
            shapes["alibi_slopes"] = (h,)
        if getattr(c, "sinks", 0):
            shapes["sinks"] = (h,)
        if getattr(c, "qk_norm", 0) not in (0, "none"):
            per_head = c.qk_norm_per_head
            shapes["q_norm"] = (h * c.d_k,) if per_head else (c.d_k,)
            shapes["k_norm"] = (g * c.d_k,) if per_head else (c.d_k,)
        if getattr(c, "output_gate", 0):  # gated attention: Z * sigmoid(x W_G + b_G)
            shapes["w_g"] = (c.d_model, h * c.d_v)
            shapes["b_g"] = (h * c.d_v,)
        return shapes

    @classmethod
    def _weights_struct(cls, c, weights):
        # a dict (or any mapping): a list of pairs failed on .get (AttributeError), and a
        # string's letters were reported as unknown weight names
        if not hasattr(weights, "keys") or not hasattr(weights, "get"):
            raise ArgumentError(f"weights is a {type(weights).__name__}; expected a dict of arrays by name "
                                f"({', '.join(_lib.WEIGHT_NAMES[:4])}, ...)")
        unknown = set(weights) - set(_lib.WEIGHT_NAMES)
        if unknown:
            raise ArgumentError(f"unknown weight names {sorted(unknown)}; expected {list(_lib.WEIGHT_NAMES)}")
        shapes = cls._weight_shapes(c)
        w, keep = _lib.Weights(), []
        for name in _lib.WEIGHT_NAMES:
            if weights.get(name) is None:
                continue  # the library says which missing tensor it needs
            if name not in shapes:
                raise ArgumentError(f"weights[{name!r}] is given but the layer's config does not use it; "
                                    "expected it left out")
            a = floats(name, weights[name])
            if a.size != int(np.prod(shapes[name])) or a.ndim not in (1, len(shapes[name])):
                raise ShapeError(f"weights[{name!r}] has shape {a.shape}; expected {shapes[name]}")
            if a.ndim == 2:
                check_shape(f"weights[{name!r}]", a.shape, shapes[name])
            keep.append(a)
            setattr(w, name, fptr(a))
        return w, keep

    def weights(self):
        """Copies of the weights as a dict of numpy arrays ((in, out) layout);
        absent biases (bias=0, add_bias_kv=0) are left out."""
        v = _lib.Weights()
        with self._borrow() as ptr:
            _L.mha_layer_get_weights(ptr, ctypes.byref(v))
            c = _L.mha_layer_config(ptr).contents
            out = {}
            for name, shape in self._weight_shapes(c).items():
                p = getattr(v, name)
                if p:
                    out[name] = np.ctypeslib.as_array(p, shape=shape).copy()
            return out

    def set_weights(self, weights):
        """Replaces all weights (the same dict as the constructor's)."""
        with self._borrow(exclusive=True) as ptr:
            c = _L.mha_layer_config(ptr).contents
            w, keep = self._weights_struct(c, weights)
            check(_L.mha_layer_set_weights(ptr, ctypes.byref(w)), "mha_layer_set_weights")
            del keep

    # ------------------------------------------------ labels, permutation
    def _block_count(self, b):
        c = self.config
        return c["n_kv_heads"] if b in (1, 2) else c["n_heads"]

    def labels(self, block):
        """Head labels of one block kind: 'q', 'k', 'v', 'o' or 's' (ALiBi slopes, sinks)."""
        b = _block(block)
        n = self._block_count(b)
        arr = (ctypes.c_int * n)()
        with self._borrow() as ptr:
            check(_L.mha_layer_labels(ptr, b, arr), "mha_layer_labels")
        return list(arr)

    def set_labels(self, block, labels):
        b = _block(block)
        arr = ints("labels", labels, self._block_count(b))
        with self._borrow(exclusive=True) as ptr:
            check(_L.mha_layer_set_labels(ptr, b, arr), "mha_layer_set_labels")

    def permute_heads(self, perm):
        """New head i is old head perm[i]; Q/K/V columns, W_O rows, labels move together."""
        arr = ints("perm", perm, self.config["n_heads"])
        with self._borrow(exclusive=True) as ptr:
            check(_L.mha_layer_permute_heads(ptr, arr), "mha_layer_permute_heads")

    @property
    def weights_dtype(self):
        """How W_Q, W_K, W_V, W_O are stored: 'f32', 'bf16' or 'int8'."""
        with self._borrow() as ptr:
            code = _L.mha_layer_weights_dtype(ptr)
        return {v: k for k, v in _lib.WEIGHT_DTYPES.items()}[code]

    def convert_weights(self, dtype):
        """mha_layer_convert_weights: store the projections as 'bf16' (round
        to nearest even) or 'int8' (symmetric, one fp32 scale per output
        column and group of 32 inputs); 'f32' keeps the rounded values in
        fp32. weights() then shows the stored values; save/load keep the
        dtype (docs/WEIGHTS.md)."""
        code = _enum("dtype", dtype, _lib.WEIGHT_DTYPES)
        with self._borrow(exclusive=True) as ptr:
            check(_L.mha_layer_convert_weights(ptr, code), "mha_layer_convert_weights")

    def permute_block(self, block, perm):
        """One-sided permutation of one block kind (the broken-conversion mistake)."""
        b = _block(block)
        arr = ints("perm", perm, self._block_count(b))
        with self._borrow(exclusive=True) as ptr:
            check(_L.mha_layer_permute_block(ptr, b, arr), "mha_layer_permute_block")

    # ----------------------------------------------------------- forward
    def _inputs(self, x, kv, value=None):
        """c, x, kv, value, B, T, S with shapes checked; kv None: keys from
        x (S = T); value None: values from the key source."""
        c = self.config
        x = floats("x", x)
        if x.ndim != 3 or x.shape[2] != c["d_model"]:
            raise ShapeError(f"x has shape {x.shape}; expected (B,T,d_model={c['d_model']})")
        B, T = c_int("B (x.shape[0])", x.shape[0], 0), c_int("T (x.shape[1])", x.shape[1], 0)
        S = T
        if kv is not None:
            kv = floats("kv", kv)
            if kv.ndim != 3 or kv.shape[0] != B or kv.shape[2] != c["d_kv_in"]:
                raise ShapeError(f"kv has shape {kv.shape}; expected (B={B},S,d_kv_in={c['d_kv_in']})")
            S = c_int("S (kv.shape[1])", kv.shape[1], 0)
        if value is not None:
            value = floats("value", value)
            if value.shape != (B, S, c["d_v_in"]):
                raise ShapeError(f"value has shape {value.shape}; expected (B={B},S={S},"
                                 f"d_v_in={c['d_v_in']}) (S as the {'kv' if kv is not None else 'x'} rows)")
        return c, x, kv, value, B, T, S

    def _checked_options(self, c, B, T, S, keep, options):
        """_options for a public call's keywords: an unknown one is named (Python's TypeError
        named the private _options())."""
        unknown = sorted(set(options) - _OPTION_NAMES)
        if unknown:
            raise ArgumentError(f"unknown option {unknown[0]!r}; expected keyword arguments among "
                                f"{', '.join(sorted(_OPTION_NAMES))}")
        return self._options(c, B, T, S, keep, **options)

    def _options(self, c, B, T, S, keep, scale=0.0, causal=False, align="top_left",
                 window_left=None, window_right=None, keep_mask=None, additive_mask=None,
                 key_keep=None, key_additive=None, masked_row="zero", interventions=None,
                 path="auto", positions=None, key_positions=None, sink_tokens=0, bf16_matmul=False,
                 chunk_size=0, cu_seqlens=None, dropout_p=0.0, dropout_seed=0):
        """mha_options from keyword arguments; arrays are appended to keep."""
        o = _L.mha_options_default()
        o.scale = c_float("scale", scale)
        o.causal = c_flag("causal", causal)
        o.align = _enum("align", align, _lib.ALIGN)
        o.window_left = window("window_left", window_left)
        o.window_right = window("window_right", window_right)
        o.sink_tokens = c_int("sink_tokens", sink_tokens, 0)  # StreamingLLM: kept besides window_left
        o.bf16_matmul = c_flag("bf16_matmul", bf16_matmul)  # projections in bf16: needs bf16 weights
        o.chunk_size = c_int("chunk_size", chunk_size, 0)  # Llama 4: attention inside chunks of that many
        o.dropout_p = c_float("dropout_p", dropout_p)  # attention dropout (training); the library judges 0 <= p < 1
        o.dropout_seed = c_int("dropout_seed", dropout_seed, 0, 2 ** 64 - 1)
        h = c["n_heads"]
        for field, arr, conv in (("keep_mask", keep_mask, bools), ("additive_mask", additive_mask, floats)):
            if arr is None:
                continue
            a = conv(field, arr)
            if a.ndim == 2:
                a = a.reshape(1, 1, *a.shape)
            if (a.ndim != 4 or a.shape[0] not in (1, B) or a.shape[1] not in (1, h)
                    or a.shape[2:] != (T, S)):
                raise ShapeError(f"{field} has shape {np.shape(arr)}; expected (T={T},S={S}) or "
                                 f"(B={B} or 1, h={h} or 1, T={T}, S={S})")
            keep.append(a)
            setattr(o, field, _lib.Mask(a.ctypes.data_as(ctypes.c_void_p), a.shape[0], a.shape[1]))
        if key_keep is not None:
            a = bools("key_keep", key_keep, (B, S))
            keep.append(a)
            o.key_keep = u8ptr(a)
        if key_additive is not None:
            a = floats("key_additive", key_additive, (B, S))
            keep.append(a)
            o.key_additive = fptr(a)
        o.masked_row = _enum("masked_row", masked_row, _lib.MASKED_ROW)
        if interventions is not None:
            ivs = self._interventions(interventions, h, B, T, c["d_v"], keep)
            keep.append(ivs)
            o.interventions = ivs
        o.path = _enum("path", path, _lib.PATHS)
        for field, arr, shape in (("positions", positions, (B, T)), ("key_positions", key_positions, (B, S))):
            if arr is not None:
                a = _positions(field, arr, shape)
                keep.append(a)
                setattr(o, field, a.ctypes.data_as(ctypes.POINTER(ctypes.c_int)))
        if cu_seqlens is not None:  # packed sequences: boundaries 0 = cu[0] < ... < cu[n] = T
            a = _cu_seqlens(cu_seqlens, T)
            keep.append(a)
            o.cu_seqlens, o.n_seqs = a, len(a) - 1
        return o

    @staticmethod
    def _interventions(spec, h, B, T, d_v, keep):
        """h mha_intervention entries from a list (one per head) or a dict
        {head: op}; op is None/'keep', 'zero', 'mean', ('scale', s) or
        ('replace', array (B,T,d_v))."""
        if isinstance(spec, dict):
            bad = [r for r in spec if isinstance(r, (bool, np.bool_))  # True is not head 1
                   or not (isinstance(r, (int, np.integer)) and 0 <= r < h)]
            if bad:
                raise ArgumentError(f"interventions keys {bad}; expected head positions 0..{h - 1}")
            items = [spec.get(r) for r in range(h)]
        else:
            try:
                if isinstance(spec, str):  # list('zero') would be four one-letter ops
                    raise TypeError
                items = list(spec)
            except TypeError:
                raise ArgumentError(f"interventions={spec!r}; expected a list of h={h} ops or a dict "
                                    "{head: op}") from None
            if len(items) != h:
                raise ShapeError(f"interventions has {len(items)} entries; expected h={h}")
        arr = (_lib.Intervention * h)()
        for r, it in enumerate(items):
            if not (it is None or isinstance(it, str) or (isinstance(it, (tuple, list)) and len(it) == 2)):
                raise ArgumentError(f"interventions[{r}]={it!r}; expected None, 'keep', 'zero', 'mean', "
                                    "('scale', s) or ('replace', array)")
            op, arg = (it, None) if it is None or isinstance(it, str) else tuple(it)
            op = "keep" if op is None else op
            arr[r].op = _enum(f"interventions[{r}]", op, _lib.HEAD_OP)
            arr[r].scale = 1.0
            if op == "scale":
                arr[r].scale = c_float(f"interventions[{r}] scale", arg)
            elif op == "replace":
                v = floats(f"interventions[{r}] value", arg, (B, T, d_v))
                keep.append(v)
                arr[r].value = fptr(v)
            elif arg is not None:
                raise ArgumentError(f"interventions[{r}]=({op!r}, ...) takes no argument; "
                                    "expected ('scale', s) or ('replace', array)")
        return arr

    def forward(self, x, kv=None, value=None, *, capture=(), **options):
        """y (B,T,d_model) = layer(x (B,T,d_model), kv (B,S,d_kv_in) or None,
        value (B,S,d_v_in) or None).

        kv feeds W_K (and W_V unless value is given); None means x. value
        feeds W_V, as PyTorch's value apart from its key (mha_forward_kv);
        None means kv. A layer whose d_v_in differs from d_kv_in needs it.

        options: scale, causal, align ('top_left'|'bottom_right'),
        window_left, window_right, keep_mask (bool/uint8, (T,S) or
        (B|1,h|1,T,S), True = may attend), additive_mask (float, same shapes),
        key_keep (B,S) (True = real key), key_additive (B,S), masked_row
        ('zero'|'nan'), interventions, path ('auto'|'reference'|'fast'),
        bf16_matmul (True: the projections multiply bf16-rounded inputs,
        AMX tiles where the CPU has them; needs convert_weights("bf16")),
        cu_seqlens (packed sequences, FlashAttention's varlen: n + 1 ints
        0 = cu[0] < ... < cu[n] = T, a list, an integer numpy array or a CPU
        integer torch tensor; rows cu[s]..cu[s+1]-1 of every batch row
        attend only each other; self-attention).
        capture: names among 'z' (B,T,h*d_v), 'contributions' (h,B,T,d_model),
        'probs' (B,h,T,S_total), or True for all; with it, returns (y, dict).
        """
        c, x, kv, value, B, T, S = self._inputs(x, kv, value)
        keep = [x, kv, value]
        opt = self._checked_options(c, B, T, S, keep, options)
        h = c["n_heads"]
        shapes = {"z": (B, T, h * c["d_v"]), "contributions": (h, B, T, c["d_model"]),
                  "probs": (B, h, T, S + c["add_bias_kv"] + c["add_zero_attn"])}
        names = capture_names("capture", capture, shapes)
        caps = {n: np.empty(shapes[n], dtype=np.float32) for n in names}
        cap = _lib.Capture(*(fptr(caps.get(n)) for n in ("z", "contributions", "probs")))
        y = np.empty((B, T, c["d_model"]), dtype=np.float32)
        with self._borrow() as ptr:
            st = _L.mha_forward_kv(ptr, fptr(y), ctypes.byref(cap), fptr(x), fptr(kv), fptr(value),
                                   B, T, S, ctypes.byref(opt))
        check(st, "mha_forward" if value is None else "mha_forward_kv")
        return (y, caps) if names else y

    __call__ = forward

    def check_contract(self, x=None, kv=None, **options):
        """mha_layer_check_contract: labels always; with x, also that the head
        contributions plus b_O reproduce Y. Returns a ContractReport (its
        .message holds mha_last_error() when the contract is violated);
        other errors raise."""
        if x is None:
            if kv is not None or options:
                raise ArgumentError("check_contract: kv and forward options need x; "
                                    "expected x (B,T,d_model) or labels only")
            B = T = S = 0
            opt = None
        else:
            c, x, kv, _, B, T, S = self._inputs(x, kv)
            keep = [x, kv]
            opt = self._checked_options(c, B, T, S, keep, options)
        rep = _lib.ContractReport()
        with self._borrow() as ptr:
            st = _L.mha_layer_check_contract(ptr, fptr(x), fptr(kv), B, T, S,
                                             ctypes.byref(opt) if opt is not None else None,
                                             ctypes.byref(rep))
        if st == _lib.E_CONTRACT:
            return ContractReport(rep, _L.mha_last_error().decode())
        check(st, "mha_layer_check_contract")
        return ContractReport(rep, "")

    # ------------------------------------------------------------- files
    @classmethod
    def load(cls, path, layout="auto", n_heads=0, n_kv_heads=0, prefix=None, add_zero_attn=False,
             config_json="warn", output_gate=False):
        """mha_layer_load: a safetensors checkpoint in the native, torch, hf,
        gpt2, megatron or codegen layout ('auto' detects all but codegen,
        whose qkv_proj names OpenELM shares, from the tensor names),
        or a sharded checkpoint's *.safetensors.index.json; n_heads /
        n_kv_heads 0 = from the file; prefix: the layer's module
        ('model.layers.3' or its attention's own path); add_zero_attn: the
        layer appends a zero key/value row (torch's add_zero_attn=True,
        which a state_dict does not record). A config.json beside an hf
        checkpoint is not read: `mha convert` writes its settings (RoPE,
        soft-cap, clip_qkv, ...) into a native file this loads whole, and
        `mha run` applies them. config_json: what to do when such a file
        lies beside the checkpoint: 'warn' (a ConfigNotAppliedWarning),
        'error' (ArgumentError, nothing loaded) or 'ignore'. output_gate: the
        hf q_proj holds each head's query then its gate (Qwen3-Next's
        attn_output_gate): a gated layer (Layer(output_gate=True))."""
        if config_json not in ("warn", "error", "ignore"):
            raise ArgumentError(f"config_json={config_json!r}; expected 'warn', 'error' or 'ignore'")
        opt = _lib.LoadOptions(_enum("layout", layout, _lib.LAYOUTS), c_int("n_heads", n_heads, 0),
                               c_int("n_kv_heads", n_kv_heads, 0),
                               None if prefix is None else _c_path("prefix", str(prefix)),
                               c_flag("add_zero_attn", add_zero_attn), c_flag("output_gate", output_gate))
        handle = _lib.LayerP()
        check(_L.mha_layer_load(ctypes.byref(handle), _c_path("path", path), ctypes.byref(opt)),
              "mha_layer_load")  # first: a bad file is the loader's to name
        config = None if config_json == "ignore" else _unapplied_config(path, layout)
        if config and config_json == "error":
            _L.mha_layer_free(handle)
            raise ArgumentError(_config_message(config, path))
        if config:
            import warnings
            warnings.warn(_config_message(config, path), ConfigNotAppliedWarning, stacklevel=2)
        return cls._adopt(handle)

    def save(self, path):
        """mha_layer_save: native safetensors with labels and dims in the metadata."""
        with self._borrow() as ptr:
            check(_L.mha_layer_save(ptr, _c_path("path", path)), "mha_layer_save")

    # ------------------------------------------------------ PyTorch side
    @classmethod
    def from_torch_state_dict(cls, state_dict, num_heads, **kw):
        """See mha.from_torch_state_dict."""
        from .torch_compat import from_torch_state_dict
        return from_torch_state_dict(state_dict, num_heads, cls=cls, **kw)

    def torch_forward(self, query, key=None, value=None, key_padding_mask=None, need_weights=True,
                      attn_mask=None, average_attn_weights=True, is_causal=False, **kw):
        """torch.nn.MultiheadAttention.forward's arguments and results; see
        mha.torch_compat.torch_forward."""
        from .torch_compat import torch_forward
        return torch_forward(self, query, key, value, key_padding_mask=key_padding_mask,
                             need_weights=need_weights, attn_mask=attn_mask,
                             average_attn_weights=average_attn_weights, is_causal=is_causal, **kw)


# the keyword options Layer.forward and check_contract take (Layer._options' own parameters)
_OPTION_NAMES = frozenset(inspect.signature(Layer._options).parameters) - {"self", "c", "B", "T", "S", "keep"}
