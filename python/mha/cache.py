"""Cache: an mha_cache (KV cache, src/cache/cache.c) with numpy in and out.

Legend: B sequences, T new rows per sequence and call, h heads, h_kv kv
heads, d_k, d_v, d_model. The cache stores only the h_kv kv heads' K and V
of the tokens a causal self-attention layer has seen; forward() runs the
layer over new tokens (a prompt: prefill; one or a few: decode) against it.
See docs/CACHE.md for the semantics and docs/PYTHON.md for examples.
"""
import ctypes

import numpy as np

from . import _lib
from ._owner import COwner
from ._arrays import _shape_str, bools, floats, fptr, ints
from ._check import INT_MAX, c_flag, c_float, c_int, names as capture_names
from .errors import ArgumentError, ShapeError, check
from .layer import Layer, _c_path, _enum, _positions, window as window_arg

_L = _lib.lib

DTYPES = {"float32": _lib.CACHE_F32, "float16": _lib.CACHE_F16, "int8": _lib.CACHE_I8}
_NAMES = {v: k for k, v in DTYPES.items()}


def _dtype(dtype, arg="dtype"):
    """'float32' | 'float16' | 'int8' (or the numpy dtypes) -> mha_cache_dtype.
    int8: per-32 blocks with an fp32 scale each (docs/CACHE.md). arg: the
    argument's name for the error (dtype or v_dtype)."""
    try:
        name = np.dtype(dtype).name
    except TypeError:
        name = None
    if name not in DTYPES:
        raise ArgumentError(f"{arg}={dtype!r}; expected 'float32', 'float16' or 'int8'")
    return DTYPES[name]


def _config_of(layer_or_config):
    """An mha_config from a Layer or a dict of mha_config fields (missing
    fields 0: the library's defaults)."""
    if isinstance(layer_or_config, Layer):
        c = layer_or_config.config  # sizes need only the shape fields
        return _lib.Config(*[c[n] for n in _lib.SHAPE_FIELDS])
    if isinstance(layer_or_config, dict):
        names = list(_lib.SHAPE_FIELDS)
        unknown = set(layer_or_config) - set(names)
        if unknown:
            raise ArgumentError(f"unknown config fields {sorted(unknown)}; expected among {names}")
        cfg = _lib.Config(*[c_int(n, layer_or_config.get(n, 0), 0) for n in names])
        if "bias" not in layer_or_config:
            cfg.bias = 1  # as Layer's default
        return cfg
    raise ArgumentError(f"{type(layer_or_config).__name__}; expected a mha.Layer or a config dict")


def cache_bytes_for(layer_or_config, batch, capacity, dtype="float32", v_dtype=None):
    """mha_cache_bytes_for_kv: K/V bytes a Cache(layer, batch, capacity,
    dtype, v_dtype=v_dtype) would allocate, without creating it (2 * B *
    capacity * h_kv * d_head * bytes when d_k = d_v = d_head, both sides of
    one type, and capacity is a multiple of 128)."""
    cfg = _config_of(layer_or_config)
    kt = _dtype(dtype)
    vt = kt if v_dtype is None else _dtype(v_dtype, "v_dtype")
    n = _L.mha_cache_bytes_for_kv(ctypes.byref(cfg), c_int("batch", batch, 0), c_int("capacity", capacity, 0),
                                  kt, vt)
    if n == 0:
        # 0 also means a cache larger than mha_cache_create allows (batch * h_kv * slots * bytes
        # per slot beyond 2^40)
        raise ArgumentError(f"mha_cache_bytes_for: batch={batch}, capacity={capacity} or the config is "
                            "invalid, or the cache would exceed the size mha_cache_create allows "
                            "(2^40 bytes); expected batch >= 1, capacity >= 1, a valid config and "
                            "a smaller cache")
    return n


def _batch_replace(spec):
    """interventions with every ('replace', (T,d_v)) value given a batch axis."""
    def one(it):
        if isinstance(it, tuple) and len(it) == 2 and it[0] == "replace" and np.ndim(it[1]) == 2:
            return ("replace", np.asarray(it[1])[None])
        return it
    if isinstance(spec, dict):
        return {r: one(it) for r, it in spec.items()}
    return [one(it) for it in spec]


class Cache(COwner):
    """A KV cache for `batch` sequences of a causal self-attention layer.

    Cache(layer, batch=1, capacity=..., dtype="float32"|"float16"|"int8", window=0,
          v_dtype=None, sink_tokens=0)
    dtype: the storage of K and V; v_dtype (None: dtype) gives V a type of
    its own (e.g. dtype="int8", v_dtype="float16": mha_cache_create_kv).
    window 0: at most `capacity` tokens per sequence; window W >= 1: a ring
    of `capacity` slots keeping the last W tokens (each query attends the
    last W positions including its own). sink_tokens N (with a window,
    N <= capacity - W): the first N positions are never evicted and every
    query attends them too (StreamingLLM). The cache keeps a reference to
    `layer` (forward's default); any layer of the same shape and K/V head
    labels may be passed to forward instead.
    """

    _free_name = "mha_cache_free"
    _kind = "cache"

    def __init__(self, layer, batch=1, capacity=1024, dtype="float32", window=0, v_dtype=None, sink_tokens=0,
                 cross=False):
        if not isinstance(layer, Layer):
            raise ArgumentError(f"layer is a {type(layer).__name__}; expected a mha.Layer")
        kt = _dtype(dtype)
        vt = kt if v_dtype is None else _dtype(v_dtype, "v_dtype")
        batch, capacity = c_int("batch", batch, 0), c_int("capacity", capacity, 0)
        window = c_int("window", window, 0)
        sink_tokens = c_int("sink_tokens", sink_tokens, 0)
        cross = c_flag("cross", cross)
        if cross and (window or sink_tokens):
            raise ArgumentError(f"cross=True with window={window}, sink_tokens={sink_tokens}; expected 0 for both "
                                "(every query attends the whole memory)")
        handle = ctypes.c_void_p()
        with layer._borrow() as layer_ptr:
            if cross:
                check(_L.mha_cache_create_cross(ctypes.byref(handle), layer_ptr, batch, capacity, kt, vt),
                      "mha_cache_create_cross")
            else:
                check(_L.mha_cache_create_kv(ctypes.byref(handle), layer_ptr, batch, capacity, kt, vt, window),
                      "mha_cache_create_kv")
        if sink_tokens:
            status = _L.mha_cache_set_sink_tokens(handle, sink_tokens)
            if status:
                _L.mha_cache_free(handle)
                check(status, "mha_cache_set_sink_tokens")
        self._ptr = handle
        self.layer = layer
        self.batch, self.capacity, self.window, self.sink_tokens = batch, capacity, window, sink_tokens
        self.cross = bool(cross)
        self.dtype, self.v_dtype = _NAMES[kt], _NAMES[vt]  # K's type (and V's unless v_dtype), V's
        c = layer.config
        self._shape = {k: c[k] for k in ("d_model", "n_heads", "n_kv_heads", "d_k", "d_v",
                                         "add_bias_kv", "add_zero_attn", "d_kv_in", "d_v_in")}

    bytes_for = staticmethod(cache_bytes_for)

    # ---------------------------------------------------------- lifetime

    def __repr__(self):
        if not self._ptr:
            return "Cache(closed)"
        vt = "" if self.v_dtype == self.dtype else f", v_dtype={self.v_dtype!r}"
        kind = ", cross=True" if self.cross else f", window={self.window}"
        return (f"Cache(batch={self.batch}, capacity={self.capacity}, dtype={self.dtype!r}{vt}"
                f"{kind}, lengths={self.lengths()}, bytes={self.bytes})")

    # ------------------------------------------------------------- state
    @property
    def bytes(self):
        """mha_cache_bytes: K/V storage in bytes (bookkeeping not counted)."""
        with self._borrow() as ptr:
            return _L.mha_cache_bytes(ptr)

    def length(self, b):
        """Next position of sequence b (tokens held, counting those a window dropped)."""
        b = c_int("b", b)
        with self._borrow() as ptr:
            n = _L.mha_cache_length(ptr, b)
        if n < 0:
            check(_lib.E_ARG, "mha_cache_length")
        return n

    def lengths(self):
        return [self.length(b) for b in range(self.batch)]

    def reset(self, b=-1):
        """Empties sequence b, or every sequence when b == -1."""
        b = c_int("b", b)
        with self._borrow(exclusive=True) as ptr:
            check(_L.mha_cache_reset(ptr, b), "mha_cache_reset")

    def truncate(self, b, n):
        """Rolls sequence b back to n tokens (0 <= n <= length(b))."""
        b, n = c_int("b", b), c_int("n", n)
        with self._borrow(exclusive=True) as ptr:
            check(_L.mha_cache_truncate(ptr, b, n), "mha_cache_truncate")

    def compact(self, b, first, keep):
        """Tree speculative decoding: keeps the accepted path of a tree
        verified with forward(..., keep_mask=): positions first + keep[i]
        (keep strictly increasing, indices from first) of sequence b move
        to positions first + i with their keys, values and stored
        positions; every other position >= first is dropped, so the length
        becomes first + len(keep) (mha_cache_compact)."""
        b, first = c_int("b", b), c_int("first", first)
        arr = np.asarray(keep)
        if arr.ndim != 1 or (arr.size and not np.issubdtype(arr.dtype, np.integer)):
            raise ShapeError(f"keep is {np.shape(keep)} of {arr.dtype}; expected a list of integer indices")
        n = int(arr.size)
        a = ints("keep", arr, n) if n else None
        with self._borrow(exclusive=True) as ptr:
            check(_L.mha_cache_compact(ptr, b, first, a, n), "mha_cache_compact")

    def permute_heads(self, perm):
        """The same perm as Layer.permute_heads (h entries, new head i = old
        head perm[i]); call it after permuting a layer with a live cache."""
        arr = ints("perm", perm, self._shape["n_heads"])
        with self._borrow(exclusive=True) as ptr:
            check(_L.mha_cache_permute_heads(ptr, arr), "mha_cache_permute_heads")

    def copy(self):
        """A new Cache holding what this one holds (mha_cache_clone),
        independent of it from then on: a prompt's cache computed once and
        continued by several requests. copy.copy and copy.deepcopy give the
        same (the layer is shared, not copied)."""
        handle = ctypes.c_void_p()
        with self._borrow() as ptr:
            check(_L.mha_cache_clone(ctypes.byref(handle), ptr), "mha_cache_clone")
        other = Cache.__new__(Cache)
        other.__dict__.update({k: v for k, v in self.__dict__.items() if not k.startswith("_")})
        other._shape = dict(self._shape)
        other._ptr = handle
        return other

    __copy__ = copy

    def __deepcopy__(self, memo):
        return self.copy()

    def save(self, path):
        """Writes what the cache holds (keys and values in their storage type,
        positions, lengths, shape, window, sinks, head order, cross memory) to
        a safetensors file, whole or not at all (mha_cache_save): a prompt's
        cache computed once and loaded by later processes with Cache.load."""
        with self._borrow() as ptr:
            check(_L.mha_cache_save(ptr, _c_path("path", path)), "mha_cache_save")

    @classmethod
    def load(cls, path, layer):
        """A Cache for layer holding what Cache.save wrote to path
        (mha_cache_load): decoding continues as with the saved cache, to the
        bit. The layer must have the saved cache's shape; a file that is not
        such a cache raises FormatError naming the entry."""
        if not isinstance(layer, Layer):
            raise ArgumentError(f"layer is a {type(layer).__name__}; expected a mha.Layer")
        handle = ctypes.c_void_p()
        with layer._borrow() as layer_ptr:
            check(_L.mha_cache_load(ctypes.byref(handle), layer_ptr, _c_path("path", path)), "mha_cache_load")
        info = _lib.CacheInfo()
        check(_L.mha_cache_get_info(handle, ctypes.byref(info)), "mha_cache_get_info")
        self = cls.__new__(cls)
        self._ptr = handle
        self.layer = layer
        self.batch, self.capacity, self.window, self.sink_tokens = (info.batch, info.capacity, info.window,
                                                                    info.sink_tokens)
        self.cross = bool(info.cross)
        self.dtype, self.v_dtype = _NAMES[info.k_dtype], _NAMES[info.v_dtype]
        c = layer.config
        self._shape = {k: c[k] for k in ("d_model", "n_heads", "n_kv_heads", "d_k", "d_v",
                                         "add_bias_kv", "add_zero_attn", "d_kv_in", "d_v_in")}
        return self

    def reorder(self, beam_idx):
        """Beam search: sequence b becomes what sequence beam_idx[b] was (its
        keys, values, length and positions; batch entries in 0..batch-1,
        repeats allowed), as Hugging Face's reorder_cache(beam_idx)."""
        arr = ints("beam_idx", beam_idx, self.batch)
        with self._borrow(exclusive=True) as ptr:
            check(_L.mha_cache_reorder(ptr, arr), "mha_cache_reorder")

    # ------------------------------------------------------------ inputs
    def _rows(self, name, a, width, width_name):
        """a (B,T,width), or (T,width) when batch is 1 -> (array (B,T,width), T, squeezed)."""
        a = floats(name, a)
        B, shape = self.batch, a.shape
        squeezed = a.ndim == 2 and B == 1
        if squeezed:
            a = a.reshape(1, *shape)
        if a.ndim != 3 or a.shape[0] != B or a.shape[2] != width or not 1 <= a.shape[1] <= INT_MAX:
            alt = f" or (T,{width_name}={width})" if B == 1 else ""
            raise ShapeError(f"{name} has shape {_shape_str(shape)}; "
                             f"expected (B={B},T>=1,{width_name}={width}){alt}")
        return a, a.shape[1], squeezed

    def _n_new(self, n_new, T):
        """None -> NULL (all T rows); an int -> the same count for every sequence."""
        if n_new is None:
            return None
        if np.ndim(n_new) == 0:
            n_new = [c_int("n_new", n_new, 0, INT_MAX)] * self.batch
        if isinstance(n_new, (list, tuple)):  # numpy would make [True, 1] the counts [1, 1]
            for b, v in enumerate(n_new):
                c_int(f"n_new[{b}]", v, 0, INT_MAX)
        arr = np.asarray(n_new)
        if arr.ndim != 1 or arr.shape[0] != self.batch or not np.issubdtype(arr.dtype, np.integer):
            raise ShapeError(f"n_new is {arr.tolist()!r}; expected an int or "
                             f"B={self.batch} integers in 0..T={T}")
        return ints("n_new", arr, self.batch)

    # ---------------------------------------------------------- forward
    def forward(self, layer=None, x=None, n_new=None, *, capture=(), interventions=None,
                window_left=None, scale=0.0, masked_row="zero", positions=None, bf16_matmul=False, chunk_size=0,
                keep_mask=None):
        """y (B,T,d_model) for x (B,T,d_model) of up to T new tokens per
        sequence (mha_forward_cached); (T,d_model) in and out when batch is 1.

        layer: a Layer of the cache's shape (None: the cache's own).
        n_new: None (all T rows), an int, or B ints; sequence b uses rows
        0..n_new[b]-1 and its other rows of y and the captures are 0.
        Each new token attends every cached position <= its own (causal,
        bottom-right aligned; on a cross=True cache: every memory row of its
        sequence, nothing appended); chunk_size C > 0 keeps it inside its chunk
        of C cache positions (Llama 4); window_left further limits it (combined with
        the cache's window). scale (0: 1/sqrt(d_k)), masked_row and
        interventions as in Layer.forward ('mean' averages over this
        call's new rows; ('replace', value) takes value (B,T,d_v)).
        positions: None (each token at its cache position) or (B,T) ints
        ((T,) when x is (T,d_model)): each new token's position for RoPE
        and ALiBi (the cache keeps it with the token's K).
        bf16_matmul: the projections multiply bf16-rounded inputs, as in
        Layer.forward (the layer's weights must be bf16).
        keep_mask: None, or bool (T,T) / (B,T,T) over this call's new tokens
        (tree attention: verify a tree of draft tokens in one call): new
        token i attends new token j <= i only where keep_mask[.., i, j];
        the tokens cached before stay visible (windows and chunk_size
        count along each token's own sequence: the cached tokens, then
        the new ones its row keeps). Parents before children
        (nothing above the diagonal); give each token base + depth as its
        position, then keep the accepted path with compact().
        capture: names among 'z' (B,T,h*d_v), 'contributions'
        (h,B,T,d_model), 'probs' (B,h,T,capacity+extra: column s is cache
        slot s, then the add_bias_kv / add_zero_attn keys), or True for
        all; with it, returns (y, dict). The batch axis is dropped from
        every result when x is (T,d_model).
        """
        if x is None:
            if layer is None or isinstance(layer, Layer):
                raise ArgumentError("forward: x is missing; expected forward(layer, x) or forward(x=x)")
            layer, x = None, layer  # forward(x): the cache's own layer
        layer = self.layer if layer is None else layer
        if not isinstance(layer, Layer):
            raise ArgumentError(f"layer is a {type(layer).__name__}; expected a mha.Layer")
        s = layer.config  # the C side checks it against the cache's shape before writing
        x, T, squeezed = self._rows("x", x, s["d_model"], "d_model")
        B, h = self.batch, s["n_heads"]
        keep = [x]
        o = _L.mha_options_default()
        o.scale = c_float("scale", scale)
        o.causal = 1
        o.align = _lib.ALIGN["bottom_right"]
        o.window_left = window_arg("window_left", window_left)
        o.chunk_size = c_int("chunk_size", chunk_size, 0)
        o.masked_row = _enum("masked_row", masked_row, _lib.MASKED_ROW)
        o.bf16_matmul = c_flag("bf16_matmul", bf16_matmul)
        if interventions is not None:
            if squeezed:  # ('replace', (T,d_v)) rows like x's
                interventions = _batch_replace(interventions)
            ivs = Layer._interventions(interventions, h, B, T, s["d_v"], keep)
            keep.append(ivs)
            o.interventions = ivs
        if positions is not None:
            pa = _positions("positions", np.reshape(positions, (1, -1)) if squeezed else positions, (B, T))
            keep.append(pa)
            o.positions = pa.ctypes.data_as(ctypes.POINTER(ctypes.c_int))
        if keep_mask is not None:
            km = bools("keep_mask", keep_mask)
            if km.ndim == 2:
                km = km.reshape(1, *km.shape)
            if km.ndim != 3 or km.shape[0] not in (1, B) or km.shape[1:] != (T, T):
                raise ShapeError(f"keep_mask has shape {_shape_str(np.shape(keep_mask))}; expected (T={T},T={T}) "
                                 f"or (B={B} or 1,T={T},T={T}) over the new tokens")
            keep.append(km)
            o.keep_mask = _lib.Mask(km.ctypes.data_as(ctypes.c_void_p), km.shape[0], 1)
        n = self._n_new(n_new, T)
        extra = s["add_bias_kv"] + s["add_zero_attn"]
        shapes = {"z": (B, T, h * s["d_v"]), "contributions": (h, B, T, s["d_model"]),
                  "probs": (B, h, T, self.capacity + extra)}
        names = capture_names("capture", capture, shapes)
        caps = {nm: np.empty(shapes[nm], dtype=np.float32) for nm in names}
        cap = _lib.Capture(*(fptr(caps.get(nm)) for nm in ("z", "contributions", "probs")))
        y = np.empty((B, T, s["d_model"]), dtype=np.float32)
        # the layer is only read; the cache takes the new K and V: exclusive
        with layer._borrow() as layer_ptr, self._borrow(exclusive=True) as ptr:
            st = _L.mha_forward_cached(layer_ptr, ptr, fptr(y), ctypes.byref(cap), fptr(x), T, n,
                                       ctypes.byref(o))
        check(st, "mha_forward_cached")
        del keep
        if squeezed:
            y = y[0]
            caps = {nm: (a[:, 0] if nm == "contributions" else a[0]) for nm, a in caps.items()}
        return (y, caps) if names else y

    __call__ = forward

    # ------------------------------------------ cross-attention memory
    def set_memory(self, kv, v=None, lengths=None, layer=None):
        """A cross-attention cache (cross=True) takes the encoder's output
        kv (B,S,d_kv_in) (and v (B,S,d_v_in) when values come from another
        source) projected by the layer's W_K, W_V (mha_cache_set_memory);
        lengths: None (all S rows) or B ints in 1..S, sequence b's first
        lengths[b] rows (the rest is padding). It replaces what the memory
        held; then forward(x) attends each query to all of its sequence's
        memory (not causal; nothing is appended), as
        Layer.forward(x, kv, v, key_padding_mask=...) would. (S,d_kv_in)
        is accepted when batch is 1."""
        layer = self.layer if layer is None else layer
        if not isinstance(layer, Layer):
            raise ArgumentError(f"layer is a {type(layer).__name__}; expected a mha.Layer")
        s = layer.config
        kv, S, _ = self._rows("kv", kv, s["d_kv_in"], "d_kv_in")
        if v is not None:
            v, Sv, _ = self._rows("v", v, s["d_v_in"], "d_v_in")
            if Sv != S:
                raise ShapeError(f"v has {Sv} rows per sequence; expected S={S} like kv")
        n = None if lengths is None else ints("lengths", lengths, self.batch)
        with layer._borrow() as layer_ptr, self._borrow(exclusive=True) as ptr:
            check(_L.mha_cache_set_memory(ptr, layer_ptr, fptr(kv), fptr(v), S, n), "mha_cache_set_memory")

    # ------------------------------------------------- the two halves
    def append(self, k, v, n_new=None):
        """Stores k (B,T,h_kv*d_k) and v (B,T,h_kv*d_v) (rows 0..n_new[b]-1
        of sequence b) as the next positions (mha_cache_append); for callers
        that project Q, K, V themselves."""
        s = self._shape
        k, T, _ = self._rows("k", k, s["n_kv_heads"] * s["d_k"], "h_kv*d_k")
        v, Tv, _ = self._rows("v", v, s["n_kv_heads"] * s["d_v"], "h_kv*d_v")
        if Tv != T:
            raise ShapeError(f"v has {Tv} rows per sequence; expected T={T} like k")
        n = self._n_new(n_new, T)
        with self._borrow(exclusive=True) as ptr:
            check(_L.mha_cache_append(ptr, fptr(k), fptr(v), T, n), "mha_cache_append")

    def attend(self, q, n_new=None, scale=0.0):
        """z (B,T,h*d_v) of queries q (B,T,h*d_k) at the last n_new[b]
        appended positions of each sequence (mha_cache_attend; causal, the
        cache's window, no extra keys; on a cross=True cache every query
        attends its sequence's whole memory); scale 0 means 1/sqrt(d_k). Rows
        past n_new[b] of z are 0. (T,..) in and out when batch is 1."""
        s = self._shape
        q, T, squeezed = self._rows("q", q, s["n_heads"] * s["d_k"], "h*d_k")
        z = np.zeros((self.batch, T, s["n_heads"] * s["d_v"]), dtype=np.float32)
        n, scale = self._n_new(n_new, T), c_float("scale", scale)
        with self._borrow() as ptr:
            check(_L.mha_cache_attend(ptr, fptr(z), fptr(q), T, n, scale), "mha_cache_attend")
        return z[0] if squeezed else z
