"""Python values -> C arguments, checked before ctypes sees them.

ctypes converts a Python int to c_int modulo 2^32 (2**32 + 4 arrives as 4)
and a float to c_float with overflow to inf, so every scalar is checked
here: the type first (a str, a float or a bool is not an int), then the
range the C parameter can hold. The library checks the finer limits (at
most 4096 heads, window <= capacity, ...) with its own messages.
"""
import numbers

import numpy as np

from .errors import ArgumentError

INT_MIN, INT_MAX = -2 ** 31, 2 ** 31 - 1
FLOAT32_MAX = float(np.finfo(np.float32).max)


def c_int(name, value, lo=INT_MIN, hi=INT_MAX):
    """value as a Python int in lo..hi (at most a C int's range); bools,
    floats (4.0 too) and strings are refused."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise ArgumentError(f"{name}={value!r} is a {type(value).__name__}; expected an integer "
                            f"in {lo}..{hi}")
    v = int(value)
    if not lo <= v <= hi:
        raise ArgumentError(f"{name}={v} is out of range; expected an integer in {lo}..{hi}")
    return v


def c_flag(name, value):
    """A C int flag from a bool or the ints 0 and 1 ("no" is not False)."""
    if isinstance(value, (bool, np.bool_)):
        return int(value)
    if isinstance(value, numbers.Integral) and int(value) in (0, 1):
        return int(value)
    raise ArgumentError(f"{name}={value!r}; expected True, False, 1 or 0")


def c_float(name, value):
    """A real number that float32 holds without overflow (a finite value
    beyond +-3.4e38 would become inf) or underflow (a non-zero value below
    float32's smallest would become 0, which the library reads as none or
    the default); NaN and inf pass through for the library to judge."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise ArgumentError(f"{name}={value!r} is a {type(value).__name__}; expected a real number")
    v = float(value)
    if np.isfinite(v) and abs(v) > FLOAT32_MAX:
        raise ArgumentError(f"{name}={v!r} is beyond float32's range; expected |{name}| <= "
                            f"{FLOAT32_MAX:.8g}")
    if v != 0 and np.float32(v) == 0:  # it would reach the library as 0: "none" or "the default"
        raise ArgumentError(f"{name}={v!r} rounds to 0 in float32; expected 0 or |{name}| >= "
                            f"{float(np.finfo(np.float32).smallest_subnormal):.3g}")
    return v


def names(name, value, known):
    """A tuple of names among `known` from True (all), False/None (none), one
    string, or an iterable of strings; a string is one name, never a
    sequence of letters."""
    if value is True:
        return tuple(known)
    if value is None or value is False:
        return ()
    items = [value] if isinstance(value, str) else value
    try:
        items = list(items)
    except TypeError:
        raise ArgumentError(f"{name}={value!r}; expected True, a name or a list of names among "
                            f"{list(known)}") from None
    bad = [n for n in items if not isinstance(n, str) or n not in known]
    if bad:
        raise ArgumentError(f"{name} {bad}; expected names among {list(known)}")
    return tuple(dict.fromkeys(items))
