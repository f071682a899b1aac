"""Exceptions of the binding: one class per mha_status code.

Errors reported by the library carry mha_last_error() as their message.
Errors the binding finds itself (a numpy array whose shape or dtype the C
side cannot see) use the same classes, with a message in the same style:
what was wrong and what was expected.
"""
import re

from . import _lib

# "mha_forward: ..." -- a library message that already names a function of
# the library (not always `call`: mha_forward_kv's checks speak as
# mha_forward, mha_backward_kv's as mha_backward)
_NAMED = re.compile(r"mha_[a-z0-9_]+: ")


class MhaError(Exception):
    """Base class; .status is the mha_status code, .message the text."""

    status = -1

    def __init__(self, message, status=None):
        if status is not None:
            self.status = status
        self.message = message
        super().__init__(message)

    @property
    def status_name(self):
        return status_str(self.status)


class ArgumentError(MhaError, ValueError):
    status = _lib.E_ARG


class ShapeError(MhaError, ValueError):
    status = _lib.E_SHAPE


class DTypeError(MhaError, TypeError):
    status = _lib.E_ARG


class OutOfMemoryError(MhaError, MemoryError):
    status = _lib.E_NOMEM


class ConfigNotAppliedWarning(UserWarning):
    """Layer.load found a Hugging Face config.json beside the checkpoint,
    whose settings (RoPE, windows, ...) it does not apply."""


class ContractError(MhaError):
    status = _lib.E_CONTRACT


class NonFiniteError(MhaError, ValueError):
    status = _lib.E_NONFINITE


class FileError(MhaError, OSError):
    status = _lib.E_IO


class FormatError(MhaError, ValueError):
    status = _lib.E_FORMAT


class UnsupportedError(MhaError, NotImplementedError):
    status = _lib.E_UNSUPPORTED


_BY_STATUS = {c.status: c for c in (ArgumentError, ShapeError, OutOfMemoryError, ContractError,
                                    NonFiniteError, FileError, FormatError, UnsupportedError)}


def status_str(status):
    """The library's short description of a status code."""
    return _lib.lib.mha_status_str(status).decode()


def last_error():
    """mha_last_error(): the message of the last failing call on this thread.
    A message quotes what the caller gave (a path is bytes: os.fsencode of a
    name that is not UTF-8, such as one os.listdir returned with surrogate
    escapes): bytes that are not UTF-8 show as \\xNN, so the call's own
    error is raised, never a UnicodeDecodeError."""
    return _lib.lib.mha_last_error().decode(errors="backslashreplace")


def check(status, call):
    """Raises the exception for a non-zero status, carrying mha_last_error()."""
    if status == _lib.OK:
        return
    cls = _BY_STATUS.get(status, MhaError)
    msg = last_error() or status_str(status)
    if not _NAMED.match(msg):  # most library messages already name their function
        msg = f"{call}: {msg}"
    raise cls(f"{msg} ({status_str(status)})", status)
