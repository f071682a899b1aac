"""_owner.py — lifetime of one C object owned by a Python object, safe
across threads.

ctypes releases the GIL during every C call, so another thread may call
close() (or a mutating method) while a forward runs in C on the same
object. Each call therefore borrows the pointer: shared borrows (calls that
only read the object, e.g. a layer's forward) run together; an exclusive
borrow (close, set_weights, permute, a cache append) waits until the
shared ones in flight have returned and keeps new ones out until it is
done. close() thus waits for in-flight calls and then frees; calls that
start after it raise ArgumentError("the layer was closed").
"""
import threading
from contextlib import contextmanager

from . import _lib
from .errors import ArgumentError


class COwner:
    """Owns the C object at self._ptr: freed by close(), when the Python
    object is collected, or at the end of a `with` block. Subclasses name
    the C function that frees it (_free_name) and what it is (_kind), and
    reach the pointer only inside `with self._borrow() as ptr:`."""

    _free_name = ""
    _kind = "object"

    def __new__(cls, *args, **kwargs):
        obj = super().__new__(cls)
        obj._ptr = None
        obj._cond = threading.Condition(threading.Lock())
        obj._shared = {}           # thread id -> shared borrows that thread holds
        obj._exclusive = None      # thread id holding the exclusive borrow
        obj._exclusive_depth = 0
        obj._exclusive_waiting = 0  # waiting writers keep new readers out (no starvation)
        return obj

    def _closed_error(self):
        return ArgumentError(f"the {self._kind} was closed")

    @contextmanager
    def _borrow(self, exclusive=False):
        """The live pointer for the duration of one C call (or a few);
        raises ArgumentError once the object is closed. Re-entrant within a
        thread (a shared borrow inside an exclusive one of the same thread
        is fine)."""
        me = threading.get_ident()
        with self._cond:
            if exclusive:
                self._acquire_exclusive(me)
            else:
                self._acquire_shared(me)
            ptr = self._ptr
        try:
            if not ptr:
                raise self._closed_error()
            yield ptr
        finally:
            with self._cond:
                self._release(me, exclusive)

    def _acquire_shared(self, me):
        if self._exclusive == me or me in self._shared:
            self._shared[me] = self._shared.get(me, 0) + 1  # re-entry: never wait on ourselves
            return
        while self._exclusive is not None or self._exclusive_waiting:
            self._cond.wait()
        self._shared[me] = 1

    def _acquire_exclusive(self, me):
        if self._exclusive == me:
            self._exclusive_depth += 1
            return
        if me in self._shared:
            raise ArgumentError(f"a call that changes or closes the {self._kind} was made while this "
                                f"thread is inside another call on it; expected it after that call")
        self._exclusive_waiting += 1
        try:
            while self._exclusive is not None or self._shared:
                self._cond.wait()
        finally:
            self._exclusive_waiting -= 1
        self._exclusive, self._exclusive_depth = me, 1

    def _release(self, me, exclusive):
        if exclusive:
            self._exclusive_depth -= 1
            if self._exclusive_depth == 0:
                self._exclusive = None
        else:
            self._shared[me] -= 1
            if self._shared[me] == 0:
                del self._shared[me]
        self._cond.notify_all()

    def close(self):
        """Frees the C object once the calls in flight on other threads have
        returned (also done when this object is collected); calls after it
        raise ArgumentError. Closing twice is fine."""
        try:
            with self._borrow(exclusive=True) as ptr:
                getattr(_lib.lib, self._free_name)(ptr)
                self._ptr = None
        except ArgumentError:
            if self._ptr:
                raise  # not "closed": closing from inside a call on this object

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def __reduce__(self):
        # a copy would share the pointer and free it twice
        raise TypeError(f"a {self._kind} owns C memory and cannot be copied or pickled")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @property
    def closed(self):
        return not self._ptr
