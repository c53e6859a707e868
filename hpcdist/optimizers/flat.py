"""Flat buffers: the optimizer keeps the variables of one dtype in one array per device.

An optimizer *adopts* the arrays of its variables: every component (one per
local replica) of every variable of a dtype is copied into one flat 1-D
buffer per (local replica, dtype) and the component's ``_value`` is rebound
to a view into it. Slot variables (momentum, moments) live in flat buffers
of the same layout. One fused kernel call then updates all the variables of
a dtype on a device.

Two rules keep the variables' promises:

* A user ``assign`` rebinds a component's ``_value`` to a new array; the
  optimizer sees ``component._value is not view`` at its next step and
  adopts again (into a fresh buffer).
* ``Variable.value()`` promises a read-only *snapshot*. Snapshots are views
  of the flat buffer, so they hold references to it: when
  ``sys.getrefcount(flat)`` shows more than the optimizer's own reference and
  its views, the update writes out of place into a fresh buffer and rebinds
  the views, so old snapshots keep their values. Without snapshots the
  update is in place.

Example:
    >>> import numpy as np, hpcdist as hd
    >>> a, b = hd.Variable(np.ones(2)), hd.Variable(np.zeros(3))
    >>> buf = FlatBuffer([a, b])
    >>> buf.flat, a.raw_value().base is buf.flat
    (array([1., 1., 0., 0., 0.]), True)
    >>> snap = a.value()
    >>> buf.shared()
    True
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from hpcdist.arrays import array_module


@contextlib.contextmanager
def on_device_of(x: Any) -> Iterator[None]:
    """Make ``x``'s GPU current for CuPy and for Numba's kernels (nothing for NumPy arrays).

    Example: ``with on_device_of(flat): kernels_for(flat).sgd(flat, flat, g, hyper)``.
    """
    xp = array_module(x)
    if xp is np:
        yield
        return
    # lazy: optional GPU dependency (numba.cuda)
    from hpcdist.kernels.optim_cuda import device_context

    with xp.cuda.Device(x.device.id), device_context(x.device.id):
        yield


class _Probe:
    """Measures what ``sys.getrefcount`` reports for an array held by one attribute only."""

    def __init__(self) -> None:
        self.flat = np.empty(0)

    def count(self) -> int:
        return sys.getrefcount(self.flat)


# 2 on CPython 3.11 (the attribute and getrefcount's argument); measured, not assumed, since
# newer interpreters may not count the argument
_ONE_HOLDER = _Probe().count()


def empty_like(proto: Any, n: int) -> Any:
    """A new 1-D array of ``n`` elements of ``proto``'s dtype, on ``proto``'s device."""
    xp = array_module(proto)
    if xp is np:
        return np.empty(n, proto.dtype)
    with on_device_of(proto):
        return xp.empty(n, proto.dtype)


class FlatBuffer:
    """One flat array holding the values of ``components`` (variables with a ``_value``).

    Example: ``buf = FlatBuffer([w, b]); buf.flat`` holds ``w`` then ``b``.
    """

    def __init__(self, components: Sequence[Any]) -> None:
        self.components = list(components)
        if not self.components:
            raise ValueError("FlatBuffer needs at least one variable component")
        self.shapes = [tuple(c._value.shape) for c in self.components]
        sizes = [int(c._value.size) for c in self.components]
        self.offsets = [0]
        for n in sizes:
            self.offsets.append(self.offsets[-1] + n)
        self.total = self.offsets[-1]
        self.dtype = self.components[0]._value.dtype
        self.flat: Any = None
        self.views: list[Any] = []
        self._baseline = 0
        self.adopt()

    # -- adoption ---------------------------------------------------------------------
    def adopt(self) -> None:
        """Copy the components' current values into a fresh buffer and rebind them to views."""
        proto = self.components[0]._value
        xp = array_module(proto)
        new = empty_like(proto, self.total)
        pieces = [c._value.reshape(-1) for c in self.components]
        with on_device_of(new):
            xp.concatenate(pieces, out=new)
        del pieces, proto
        self.rebind(new)

    def rebind(self, new: Any) -> None:
        """Make ``new`` (a filled buffer of the same layout) the buffer; rebind every view."""
        self.flat = new
        views = []
        for c, shape, lo, hi in zip(
            self.components, self.shapes, self.offsets, self.offsets[1:], strict=False
        ):
            view = new[lo:hi].reshape(shape)
            c._value = view
            views.append(view)
        self.views = views
        del new, views, view
        # the count with no snapshot: our attribute (as measured by _Probe) plus each view's
        # base (views whose base is an intermediate array count through it)
        self._baseline = _ONE_HOLDER + sum(1 for v in self.views if v.base is self.flat)
        self._baseline += len({id(v.base) for v in self.views if v.base is not self.flat})

    def intact(self) -> bool:
        """Whether every component still holds its view (no ``assign`` since adoption)."""
        return all(c._value is v for c, v in zip(self.components, self.views, strict=True))

    def ensure(self) -> bool:
        """Adopt again if a component was rebound; returns whether it did."""
        if self.intact():
            return False
        self.adopt()
        return True

    # -- snapshots -------------------------------------------------------------------
    def shared(self) -> bool:
        """Whether something besides the optimizer and the views references the buffer."""
        return sys.getrefcount(self.flat) > self._baseline

    def make_private(self) -> bool:
        """Copy-on-write: move to a fresh copy if the buffer is shared; returns whether it did."""
        if not self.shared():
            return False
        self.adopt()
        return True

    # -- access ----------------------------------------------------------------------
    def segment(self, start: int, stop: int) -> tuple[int, int]:
        """The element range ``[lo, hi)`` of components ``start .. stop - 1``."""
        return self.offsets[start], self.offsets[stop]
