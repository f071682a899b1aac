"""mha: a ctypes binding over build/libmha.so, numpy in and out.

Import from the repository without installing:  sys.path.insert(0, "python").
Set MHA_LIBRARY to use a libmha.so elsewhere.

    import mha
    layer = mha.from_torch_state_dict(sd, num_heads=4, batch_first=True)
    y, w = layer.torch_forward(x, need_weights=True)       # PyTorch's conventions
    y, cap = layer.forward(x, causal=True, capture=True)   # the library's own
    with mha.Cache(layer, batch=1, capacity=256) as cache:  # KV cache: prefill, decode
        y = cache.forward(layer, prompt); y1 = cache.forward(layer, next_token)

Legend: B batch, T queries, S keys, h heads, h_kv kv heads, d_k, d_v,
d_model, d_kv_in (key source), d_v_in (value source). Weights are (in, out).
See docs/PYTHON.md.
"""
import ctypes

import numpy as np

from . import _lib
from ._arrays import floats, fptr, ints
from ._check import c_int
from .errors import (ArgumentError, ConfigNotAppliedWarning, ContractError, DTypeError, FileError, FormatError, MhaError,
                     NonFiniteError, OutOfMemoryError, ShapeError, UnsupportedError, check,
                     last_error, status_str)
from .cache import Cache, cache_bytes_for
from .layer import ContractReport, Layer
from .torch_compat import from_torch_state_dict, torch_forward

__all__ = [
    "Layer", "ContractReport", "Cache", "cache_bytes_for", "from_torch_state_dict", "torch_forward",
    "concat_heads", "split_heads", "project_out", "head_contributions", "head_intervene",
    "set_num_threads", "get_num_threads", "status_str", "last_error", "alibi_slopes",
    "MhaError", "ArgumentError", "ShapeError", "DTypeError", "OutOfMemoryError", "ContractError",
    "NonFiniteError", "FileError", "FormatError", "UnsupportedError", "ConfigNotAppliedWarning",
]

_L = _lib.lib


def set_num_threads(n):
    """Threads of the fast path (0: OpenMP's default)."""
    _L.mha_set_num_threads(c_int("n", n, 0))


def get_num_threads():
    return _L.mha_get_num_threads()


def alibi_slopes(n_heads):
    """(n_heads,) float32: the ALiBi paper's slopes of an n_heads-head
    layer, the default of a layer's alibi_slopes (a shard of heads
    first..first+n takes alibi_slopes(h)[first:first+n], not
    alibi_slopes(n))."""
    n = c_int("n_heads", n_heads, 1)
    out = np.empty(n, dtype=np.float32)
    check(_L.mha_alibi_slopes(fptr(out), n), "mha_alibi_slopes")
    return out


# ------------------------------------------------- the seed steps, standalone

def concat_heads(heads, order=None):
    """z (rows, n*d) = Concat(heads[order[0]], ...), each head (rows, d)."""
    hs = [floats(f"heads[{i}]", a) for i, a in enumerate(heads)]
    if not hs or hs[0].ndim != 2:
        raise ShapeError("heads: expected a non-empty list of (rows, d) arrays")
    rows, d = hs[0].shape
    for i, a in enumerate(hs):
        if a.shape != (rows, d):
            raise ShapeError(f"heads[{i}] has shape {a.shape}; expected ({rows},{d}) like heads[0]")
    n = len(hs)
    ptrs = (_lib.F32P * n)(*[fptr(a) for a in hs])
    order_c = None if order is None else ints("order", order, n)
    z = np.empty((rows, n * d), dtype=np.float32)
    check(_L.mha_concat_heads(fptr(z), ptrs, order_c, n, rows, d), "mha_concat_heads")
    return z


def split_heads(z, n):
    """[head_0, ..., head_{n-1}], each (rows, d), from z (rows, n*d)."""
    z, n = floats("z", z), c_int("n", n, 1)
    if z.ndim != 2 or n <= 0 or z.shape[1] % n:
        raise ShapeError(f"z has shape {z.shape}; expected (rows, n*d) with n={n}")
    rows, d = z.shape[0], z.shape[1] // n
    heads = [np.empty((rows, d), dtype=np.float32) for _ in range(n)]
    ptrs = (_lib.F32P * n)(*[fptr(a) for a in heads])
    check(_L.mha_split_heads(ptrs, fptr(z), n, rows, d), "mha_split_heads")
    return heads


def project_out(z, w, b=None):
    """y (rows, d_out) = z (rows, d_in) w (d_in, d_out) + b (d_out)."""
    z = floats("z", z)
    if z.ndim != 2:
        raise ShapeError(f"z has shape {z.shape}; expected (rows, d_in)")
    rows, d_in = z.shape
    w = floats("w", w)
    if w.ndim != 2 or w.shape[0] != d_in:
        raise ShapeError(f"w has shape {w.shape}; expected (d_in={d_in}, d_out)")
    d_out = w.shape[1]
    b = None if b is None else floats("b", b, (d_out,))
    y = np.empty((rows, d_out), dtype=np.float32)
    check(_L.mha_project_out(fptr(y), fptr(z), fptr(w), fptr(b), rows, d_in, d_out), "mha_project_out")
    return y


def head_contributions(z, w, n):
    """(n, rows, d_out): block r = z[:, r*d:(r+1)*d] w[r*d:(r+1)*d, :]."""
    z, n = floats("z", z), c_int("n", n, 1)
    if z.ndim != 2 or n <= 0 or z.shape[1] % n:
        raise ShapeError(f"z has shape {z.shape}; expected (rows, n*d) with n={n}")
    rows, d = z.shape[0], z.shape[1] // n
    w = floats("w", w)
    if w.ndim != 2 or w.shape[0] != n * d:
        raise ShapeError(f"w has shape {w.shape}; expected (n*d={n * d}, d_out)")
    out = np.empty((n, rows, w.shape[1]), dtype=np.float32)
    check(_L.mha_head_contributions(fptr(out), fptr(z), fptr(w), n, rows, d, w.shape[1]),
          "mha_head_contributions")
    return out


def head_intervene(z, op, r, n):
    """A copy of z (rows, n*d) with one intervention applied to head r's block;
    op as in Layer.forward(interventions=...): 'zero', 'mean', ('scale', s),
    ('replace', array (rows, d))."""
    z, n = np.array(floats("z", z), copy=True), c_int("n", n, 1)
    r = c_int("r", r, 0, n - 1)
    if z.ndim != 2 or n <= 0 or z.shape[1] % n:
        raise ShapeError(f"z has shape {z.shape}; expected (rows, n*d) with n={n}")
    rows, d = z.shape[0], z.shape[1] // n
    keep = []
    spec = [None] * n
    spec[r] = op
    # replace values are (B,T,d) in a forward; here rows = B*T with B=1.
    # a list ["replace", a] too, as Layer.forward's interventions take it (it reached the
    # check unreshaped, refused as "expected (1,rows,d)", a shape the caller never sees)
    if isinstance(op, (tuple, list)) and op and isinstance(op[0], str) and op[0] == "replace" and len(op) == 2:
        v = floats("value", op[1], (rows, d))
        spec[r] = ("replace", v.reshape(1, rows, d))
    ivs = Layer._interventions(spec, n, 1, rows, d, keep)
    check(_L.mha_head_intervene(fptr(z), ctypes.byref(ivs[r]), r, n, rows, d), "mha_head_intervene")
    return z
