"""The engine front's input and output handling: host arrays in, results placed back."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from hpcdist.arrays import BFLOAT16, asarray, device_of, is_array, to_device, to_host
from hpcdist.collectives.fusion import Layout
from hpcdist.collectives.metadata import check_dtype

#: Dtypes whose NumPy arrays need no check nor conversion on the way in (native order).
PLAIN_DTYPES = frozenset(
    np.dtype(c) for c in "?bBhHiIlLqQefdgFDG" if np.dtype(c).isnative
) | {BFLOAT16}
_CPU = ("CPU", 0)


def host_arrays(tensors: Any, operation: str) -> tuple[list[np.ndarray], list[tuple[str, int]]]:
    """C-contiguous host (NumPy) arrays of ``tensors`` and the device each came from."""
    if is_array(tensors) or isinstance(tensors, (str, bytes)) or not hasattr(tensors, "__iter__"):
        raise TypeError(
            f"{operation} takes a list of arrays; got {type(tensors).__name__}. "
            f"Wrap a single array in a list: {operation}([x], ...)"
        )
    items: list[np.ndarray] = []
    places: list[tuple[str, int]] = []
    for i, tensor in enumerate(tensors):
        if type(tensor) is np.ndarray:
            host = tensor
            places.append(_CPU)
        else:
            x = asarray(tensor)
            places.append(device_of(x))
            host = to_host(x)
        check_dtype(host.dtype, operation, i)
        if not host.dtype.isnative:
            host = host.astype(host.dtype.newbyteorder("="))
        elif not host.flags.c_contiguous:
            host = np.ascontiguousarray(host)
        items.append(host)
    return items, places


def plain_host_arrays(tensors: Any) -> list[tuple[str, int]] | None:
    """The places of a plain list of C-contiguous NumPy arrays of native numeric dtypes
    (the common case, checked without the general path's conversions); ``None`` otherwise."""
    if tensors.__class__ is not list:
        return None
    for a in tensors:
        if a.__class__ is not np.ndarray or a.dtype not in PLAIN_DTYPES or not (
            a.flags.c_contiguous
        ):
            return None
    return [_CPU] * len(tensors)


def place(result: np.ndarray, where: tuple[str, int]) -> Any:
    """``result`` on the device ``where`` (kind, index) it came from."""
    kind, index = where
    return result if kind == "CPU" else to_device(result, kind, index)


def deliver(results: list[Any], places: list[tuple[str, int]], out: Any) -> list[Any]:
    """The results as asked: copied into ``out``, or on the inputs' devices."""
    if out is not None:
        for target, result in zip(out, results, strict=True):
            if target is not result:
                np.copyto(target, result)
        return list(out)
    if all(p[0] == "CPU" for p in places):
        return results
    return [place(r, p) for r, p in zip(results, places, strict=True)]


def check_out(out: Sequence[np.ndarray], layout: Layout) -> list[np.ndarray]:
    """``out`` as a list, checked against the results ``layout`` gives (shapes, dtypes)."""
    out = list(out)
    if len(out) != len(layout.shapes):
        raise ValueError(
            f"out has {len(out)} arrays for {len(layout.shapes)} tensors; pass one per tensor"
        )
    dtypes = {}
    for g in layout.groups:
        for index, _, _ in g.members:
            dtypes[index] = g.result
    for i, target in enumerate(out):
        if (
            not isinstance(target, np.ndarray)
            or target.shape != layout.shapes[i]
            or target.dtype != dtypes[i]
            or not target.flags.writeable
        ):
            raise ValueError(
                f"out[{i}] must be a writeable NumPy array of shape {layout.shapes[i]} and "
                f"dtype {dtypes[i]}; got {type(target).__name__} "
                f"{getattr(target, 'shape', '')} {getattr(target, 'dtype', '')}"
            )
    return out


def split_bounds(rows: int, size: int, row_elems: int) -> list[int]:
    """Element bounds of ``np.array_split``'s ``size`` blocks of ``rows`` rows."""
    base, extra = divmod(rows, size)
    bounds = [0]
    for r in range(size):
        bounds.append(bounds[-1] + (base + (1 if r < extra else 0)) * row_elems)
    return bounds


def check_axis(axis: Any, ndim: int | None = None, shape: Any = None) -> None:
    """Raise unless ``axis`` is an int (and, given ``ndim``, a valid axis of ``shape``)."""
    if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)):
        raise TypeError(f"axis is {axis!r}; expected an int")
    if ndim is not None and not -ndim <= axis < ndim:
        raise ValueError(
            f"axis is {axis} for a tensor of shape {shape}; expected {-ndim} <= axis < {ndim}"
        )
