"""numpy <-> C pointer helpers with the binding's shape and dtype checks.

The C side sees only pointers and the sizes it is told, so every array's
shape is checked here before its pointer is passed.
"""
import ctypes

import numpy as np

from . import _lib
from .errors import DTypeError, ShapeError


def _shape_str(shape):
    return "(" + ",".join(str(d) for d in shape) + ")"


def floats(name, a, shape=None):
    """a as a C-contiguous float32 array, shape checked (None entries: any).

    Any real floating dtype is accepted (float64 is rounded to float32, the
    library's storage type); integers, booleans and complex are refused so a
    mask or an index array is not read as data by mistake. Python lists and
    numbers are converted."""
    if isinstance(a, (list, tuple, int, float)):
        a = np.asarray(a, dtype=np.float32)  # plain Python numbers carry no dtype to check
    arr = np.asarray(a)
    if not np.issubdtype(arr.dtype, np.floating):
        raise DTypeError(f"{name} has dtype {arr.dtype}; expected a floating dtype (float32)")
    if shape is not None:
        check_shape(name, arr.shape, shape)
    return np.ascontiguousarray(arr, dtype=np.float32)


def bools(name, a, shape=None):
    """a (bool or uint8) as a C-contiguous uint8 array of 0/1 values."""
    arr = np.asarray(a)
    if arr.dtype != np.bool_ and arr.dtype != np.uint8:
        raise DTypeError(f"{name} has dtype {arr.dtype}; expected bool or uint8")
    if shape is not None:
        check_shape(name, arr.shape, shape)
    return np.ascontiguousarray(arr != 0, dtype=np.uint8)


def check_shape(name, got, want):
    got = tuple(got)
    ok = len(got) == len(want) and all(w is None or g == w for g, w in zip(got, want))
    if not ok:
        want_s = "(" + ",".join("*" if w is None else str(w) for w in want) + ")"
        raise ShapeError(f"{name} has shape {_shape_str(got)}; expected {want_s}")


def fptr(a):
    """float* of a float32 array, or NULL for None."""
    if a is None:
        return ctypes.cast(None, _lib.F32P)
    return a.ctypes.data_as(_lib.F32P)


def u8ptr(a):
    if a is None:
        return ctypes.cast(None, ctypes.POINTER(ctypes.c_uint8))
    return a.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8))


def ints(name, seq, n):
    """A ctypes int array of exactly n entries."""
    arr = np.asarray(seq)
    if arr.ndim != 1 or arr.shape[0] != n or not np.issubdtype(arr.dtype, np.integer):
        raise ShapeError(f"{name} is {arr.tolist()!r}; expected {n} integers")
    return (ctypes.c_int * n)(*[int(v) for v in arr])
