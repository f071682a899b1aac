"""_owner.py — lifetime of one C object owned by a Python object."""
from . import _lib
from .errors import ArgumentError


class COwner:
    """Owns the C object at self._ptr: freed by close(), when the Python
    object is collected, or at the end of a `with` block. Subclasses name
    the C function that frees it (_free_name) and what it is (_kind)."""

    _ptr = None
    _free_name = ""
    _kind = "object"

    def close(self):
        """Frees the C object now (also done when this object is collected)."""
        if self._ptr:
            getattr(_lib.lib, self._free_name)(self._ptr)
            self._ptr = None

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _handle(self):
        if not self._ptr:
            raise ArgumentError(f"the {self._kind} was closed")
        return self._ptr
