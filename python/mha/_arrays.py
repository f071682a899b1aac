"""numpy <-> C pointer helpers with the binding's shape and dtype checks.

The C side sees only pointers and the sizes it is told, so every array's
shape is checked here before its pointer is passed.
"""
import ctypes

import numpy as np

from . import _lib
from ._check import INT_MAX, INT_MIN, c_int
from .errors import ArgumentError, DTypeError, ShapeError


def _shape_str(shape):
    return "(" + ",".join(str(d) for d in shape) + ")"


def _array(name, a):
    """np.asarray(a), refusing a torch tensor that requires grad: the
    binding computes no gradients, so its results could not carry them."""
    if getattr(a, "requires_grad", False):
        raise ArgumentError(f"{name} is a tensor that requires grad; the binding computes no "
                            f"gradients: pass {name}.detach() (or numpy data)")
    return host(name, a)


def host(name, a):
    """A numpy array of a, where a may be a torch tensor (detached here;
    torch is not imported). numpy has no bfloat16, so such a tensor is
    widened to float32 (exact) rather than failing inside torch's .numpy();
    a tensor off the CPU (meta, cuda) is refused naming it, since its data
    is not in this process's memory."""
    if _is_torch_tensor(a):
        device = a.device.type
        if device != "cpu":
            raise ArgumentError(f"{name} is a tensor on device '{device}'; expected a CPU tensor "
                                f"({name}.cpu()) or numpy data")
        layout = str(getattr(a, "layout", "torch.strided"))
        if layout != "torch.strided":  # sparse, mkldnn: torch's .numpy() error names no argument
            raise ArgumentError(f"{name} is a tensor of layout {layout}; expected a dense (strided) tensor "
                                f"({name}.to_dense()) or numpy data")
        a = a.detach()
        if str(a.dtype) == "torch.bfloat16":
            a = a.float()
        return a.numpy()
    if isinstance(a, np.ma.MaskedArray) and np.ma.is_masked(a):
        # np.asarray keeps the data under the mask and drops the mask: the masked
        # entries would be computed with as if they were real
        raise ArgumentError(f"{name} is a numpy masked array with {int(np.ma.count_masked(a))} masked "
                            f"entries, whose mask would be ignored; expected plain data ({name}.filled(v)), "
                            "and a mask option (key_keep, keep_mask, key_padding_mask) for keys to hide")
    return np.asarray(a)


def _is_torch_tensor(a):
    return type(a).__module__.split(".")[0] == "torch" and hasattr(a, "device") and hasattr(a, "detach")


def floats(name, a, shape=None):
    """a as a C-contiguous float32 array, shape checked (None entries: any).

    Any real floating dtype is accepted and rounded to float32, the
    library's storage type; a finite value beyond float32's range (float64
    1e300) would become inf, so it is refused naming the element instead.
    Integers, booleans and complex are refused so a mask or an index array
    is not read as data by mistake. Python lists and numbers are converted
    (as float64, with the same range check)."""
    if isinstance(a, (list, tuple, int, float)):
        try:
            a = np.asarray(a, dtype=np.float64)  # plain Python numbers carry no dtype to check
        except (TypeError, ValueError) as e:  # strings, None, ragged nesting
            raise DTypeError(f"{name} is a {type(a).__name__} that is not a (nested) list of real "
                             f"numbers ({e}); expected a floating array") from None
    arr = _array(name, a)
    if not np.issubdtype(arr.dtype, np.floating):
        raise DTypeError(f"{name} {_what(a, arr)}; expected a floating dtype (float32)")
    if shape is not None:
        check_shape(name, arr.shape, shape)
    with np.errstate(over="ignore"):  # overflow is found and named below
        # asarray, not ascontiguousarray: that one makes a 0-d array 1-d, so
        # a scalar would be reported as shape (1,)
        out = np.asarray(arr, dtype=np.float32, order="C")
    if arr.dtype.itemsize > 4:
        _check_no_overflow(name, arr, out)
    return out


def _what(given, arr):
    """'has dtype D' for an array or tensor; for anything else (None, a
    dict, a string) its type, which says more than numpy's dtype object."""
    if hasattr(given, "dtype"):
        return f"has dtype {arr.dtype}"
    return f"is a {type(given).__name__} (numpy makes it dtype {arr.dtype})"


def _check_no_overflow(name, wide, narrow):
    """Raises naming the first element that was finite in `wide` and is
    infinite after rounding to float32 (`narrow`)."""
    bad = np.isinf(narrow) & np.isfinite(wide)
    if bad.any():
        idx = tuple(int(i) for i in np.argwhere(bad)[0])
        where = ",".join(str(i) for i in idx)
        raise ArgumentError(f"{name}[{where}] = {wide[idx]!r} is beyond float32's range; expected "
                            f"|value| <= {np.finfo(np.float32).max:.8g} (the library stores float32)")


def bools(name, a, shape=None):
    """a (bool or uint8) as a C-contiguous uint8 array of 0/1 values."""
    arr = _array(name, a)
    if arr.dtype != np.bool_ and arr.dtype != np.uint8:
        raise DTypeError(f"{name} {_what(a, arr)}; expected bool or uint8")
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
    """A ctypes int array of exactly n integers, each within a C int. A
    list or tuple's elements go through c_int one by one: numpy would turn
    [True, 0, 3, 2] into integers, but a bool is no head index."""
    if isinstance(seq, (list, tuple)):
        for i, v in enumerate(seq):
            c_int(f"{name}[{i}]", v, INT_MIN, INT_MAX)
    arr = _array(name, seq)
    if arr.ndim != 1 or arr.shape[0] != n or not np.issubdtype(arr.dtype, np.integer):
        raise ShapeError(f"{name} is {arr.tolist()!r}; expected {n} integers")
    return (ctypes.c_int * n)(*[c_int(f"{name}[{i}]", v, INT_MIN, INT_MAX) for i, v in enumerate(arr)])
