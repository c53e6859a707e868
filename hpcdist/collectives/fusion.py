"""Fusion: how a list of tensors is packed into per-dtype buffers and cut into buckets.

A reduction of many tensors runs on one flat buffer per dtype (a *group*).
Each group is cut into *buckets* of at most ``bucket_bytes``; a bucket is
what moves through a shared-memory slot or one MPI message. For every bucket
the layout keeps a copy table — which tensor, from which byte, how many
bytes, to which byte of the bucket — so packing a bucket is one call of
:func:`hpcdist.kernels.gather_bytes` over raw addresses, whatever the
number of tensors. Layouts are built once per tensor list (shapes, dtypes,
op, options) and cached by the engine.

Booleans travel as ``uint8`` (MIN/MAX are AND/OR), complex numbers as pairs
of floats (SUM/MEAN act on each part), ``float16`` and ``bfloat16`` as themselves
(the kernels accumulate them in ``float32`` and round once); buckets of 16-bit
floats hold half as many elements as their bytes allow, so that their
``float32`` partial sums fit a bucket too (the hierarchical path).

Example:
    >>> import numpy as np
    >>> from hpcdist.collectives.ops import ReduceOp
    >>> lay = build_layout([np.zeros(30, np.float32), np.zeros((2, 2), np.float32)],
    ...                    ReduceOp.SUM, bucket_bytes=64, text="demo")
    >>> [(g.wire.name, g.total, len(g.buckets)) for g in lay.groups]
    [('float32', 34, 3)]
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from hpcdist.arrays import BFLOAT16
from hpcdist.collectives.metadata import signature_hash
from hpcdist.collectives.ops import ReduceOp, divide_mean
from hpcdist.kernels import address_of

OP_CODES = {ReduceOp.SUM: 0, ReduceOp.MEAN: 1, ReduceOp.MIN: 2, ReduceOp.MAX: 3}
ALIGN = 64  # bucket boundaries fall on multiples of this many bytes


class Bucket(NamedTuple):
    """One bucket: elements ``[lo, hi)`` of its group and the copy table that fills it."""

    lo: int
    hi: int
    tensor: np.ndarray  # int64: index into the call's tensors of each piece
    src: np.ndarray  # int64: byte offset of the piece inside its tensor
    nbytes: np.ndarray  # int64: bytes of the piece
    dst: np.ndarray  # int64: byte offset of the piece inside the bucket


class Group(NamedTuple):
    """The tensors of one dtype, fused into ``total`` elements of ``wire`` dtype."""

    dtype: np.dtype  # the tensors' dtype
    wire: np.dtype  # the dtype the kernels and MPI see
    result: np.dtype  # the dtype of the results (MEAN of integers: float64)
    members: tuple[tuple[int, int, int], ...]  # (tensor index, first wire element, elements)
    total: int
    buckets: tuple[Bucket, ...]
    whole: Bucket  # the copy table of the whole group as one bucket
    ratio: int = 1  # wire elements per tensor element, 0 when the wire dtype is the dtype


class Layout(NamedTuple):
    """Everything about one call that does not change between steps."""

    text: str  # readable signature, compared across ranks on a mismatch
    digest: int  # its 63-bit hash
    op: ReduceOp
    groups: tuple[Group, ...]
    shapes: tuple[tuple[int, ...], ...]
    nbytes: int  # bytes of all tensors together


def wire_dtype(dtype: np.dtype, op: ReduceOp) -> np.dtype:
    """The dtype a tensor of ``dtype`` is reduced as; raises ``TypeError`` if ``op`` cannot apply.

    Example: ``wire_dtype(np.dtype(np.complex64), ReduceOp.SUM) == np.float32``.
    """
    kind, size = dtype.kind, dtype.itemsize
    if kind == "b":
        if op in (ReduceOp.SUM, ReduceOp.MEAN):
            raise TypeError(
                f"allreduce {op.name} of boolean arrays is not defined; cast to an integer "
                "dtype first, or use MIN (all) or MAX (any)"
            )
        return np.dtype(np.uint8)
    if kind == "c":
        if op in (ReduceOp.MIN, ReduceOp.MAX):
            raise TypeError(
                f"allreduce {op.name} of complex arrays is not defined; use SUM or MEAN"
            )
        if size in (8, 16):
            return np.dtype(f"f{size // 2}")
    if kind in "iu" and size in (1, 2, 4, 8):
        return dtype.newbyteorder("=")
    if kind == "f" and size in (2, 4, 8):
        return dtype.newbyteorder("=")
    if dtype == BFLOAT16:
        return dtype
    raise TypeError(
        f"allreduce of {dtype} arrays is not supported; use bool, (u)int8-64, bfloat16, "
        "float16, float32, float64, complex64 or complex128"
    )


def result_dtype(dtype: np.dtype, op: ReduceOp) -> np.dtype:
    """The inputs' dtype; for MEAN of integers float64 (as :func:`divide_mean`).

    Example: ``result_dtype(np.dtype(np.int32), ReduceOp.MEAN) == np.float64``.
    """
    if op is ReduceOp.MEAN:
        return divide_mean(np.zeros(0, dtype), 1).dtype
    return dtype


def _table(pieces: list[tuple[int, int, int, int]]) -> tuple[np.ndarray, ...]:
    if not pieces:
        empty = np.zeros(0, np.int64)
        return empty, empty, empty, empty
    cols = np.array(pieces, dtype=np.int64).T
    return cols[0].copy(), cols[1].copy(), cols[2].copy(), cols[3].copy()


def _buckets(
    members: Sequence[tuple[int, int, int]], total: int, itemsize: int, bucket_bytes: int,
    step_itemsize: int = 0,
) -> tuple[Bucket, ...]:
    """Cut ``[0, total)`` into buckets of at most ``bucket_bytes`` and split tensors across them
    (counting ``step_itemsize`` bytes per element, default ``itemsize``)."""
    per = step_itemsize or itemsize
    step = max(ALIGN, bucket_bytes // ALIGN * ALIGN) // per if bucket_bytes > 0 else total
    step = max(step, 1)
    out: list[Bucket] = []
    for lo in range(0, total, step):
        hi = min(lo + step, total)
        pieces = []
        for index, first, count in members:
            a, b = max(lo, first), min(hi, first + count)
            if a < b:
                pieces.append(
                    (index, (a - first) * itemsize, (b - a) * itemsize, (a - lo) * itemsize)
                )
        out.append(Bucket(lo, hi, *_table(pieces)))
    return tuple(out)


def build_layout(
    items: Sequence[np.ndarray], op: ReduceOp, bucket_bytes: int, text: str
) -> Layout:
    """The layout of reducing ``items`` with ``op`` in buckets of ``bucket_bytes`` (0: one).

    ``text`` is the call's signature line.
    """
    order: dict[np.dtype, list[tuple[int, int, int]]] = {}
    totals: dict[np.dtype, int] = {}
    wires: dict[np.dtype, np.dtype] = {}
    for index, a in enumerate(items):
        wire = wires.get(a.dtype)
        if wire is None:
            wire = wires[a.dtype] = wire_dtype(a.dtype, op)
        count = a.size * (a.dtype.itemsize // wire.itemsize)
        first = totals.get(a.dtype, 0)
        order.setdefault(a.dtype, []).append((index, first, count))
        totals[a.dtype] = first + count
    groups = []
    for dtype, members in order.items():
        wire, total = wires[dtype], totals[dtype]
        whole = _buckets(members, total, wire.itemsize, 0)
        groups.append(
            Group(
                dtype=dtype,
                wire=wire,
                result=result_dtype(dtype, op),
                members=tuple(members),
                total=total,
                buckets=_buckets(
                    members, total, wire.itemsize, bucket_bytes, 4 if _is_half(wire) else 0
                ),
                whole=whole[0] if whole else Bucket(0, 0, *_table([])),
                ratio=0 if wire == dtype else dtype.itemsize // wire.itemsize,
            )
        )
    return Layout(
        text=text,
        digest=signature_hash(text),
        op=op,
        groups=tuple(groups),
        shapes=tuple(a.shape for a in items),
        nbytes=sum(a.nbytes for a in items),
    )


def _is_half(dtype: np.dtype) -> bool:
    return dtype == BFLOAT16 or dtype == np.float16


def addresses(items: Sequence[np.ndarray]) -> np.ndarray:
    """The data address of each (C-contiguous) array, as int64.

    Example: ``addresses([x])[0] == x.ctypes.data`` (float16 arrays included,
    which compiled code only sees as ``uint16``).
    """
    return np.array([data_address(a) for a in items], dtype=np.int64)


def data_address(a: np.ndarray) -> int:
    """The data address of one array (float16 too, seen as ``uint16`` by compiled code).

    Example: ``data_address(x) == x.ctypes.data``.
    """
    return address_of(a.view(np.uint16) if a.dtype.char in "eE" else a)


def unfuse(group: Group, fused: np.ndarray, shapes: Sequence[tuple[int, ...]], out: list) -> None:
    """Put views of the reduced group buffer ``fused`` (wire dtype) into ``out`` by tensor index."""
    ratio = group.ratio
    if ratio == 0:  # (decided when the layout was built: no dtype comparison per call)
        view, ratio = fused, 1
    else:
        view = fused.view(group.dtype)
    members = group.members
    if len(members) == 1 and members[0][2] == view.shape[0] * ratio:  # the whole buffer
        out[members[0][0]] = view.reshape(shapes[members[0][0]])
        return
    for index, first, count in members:
        lo = first // ratio
        out[index] = view[lo : lo + count // ratio].reshape(shapes[index])


class BufferPool:
    """Result buffers reused across steps once the caller has let go of them.

    A fused result is handed out as views of one buffer. When the next call
    with the same layout comes and nothing outside the pool refers to that
    buffer any more (every view was dropped), it is reused: no allocation
    and no page faults per step in a training loop. A buffer still in use is
    left alone and a new one is made.

    Example:
        >>> pool = BufferPool()
        >>> a = pool.take("k", 4, np.dtype(np.float32))
        >>> pool.take("k", 4, np.dtype(np.float32)) is a  # still held: a new one
        False
    """

    LIMIT = 256  # layouts whose last buffer is kept

    def __init__(self) -> None:
        self._spare: dict[object, np.ndarray] = {}
        self._addresses: dict[object, tuple[np.ndarray, int]] = {}

    def take_with_address(self, key: object, count: int, dtype: np.dtype) -> tuple[np.ndarray, int]:
        """:meth:`take`, and the buffer's data address (looked up once per buffer)."""
        buf = self.take(key, count, dtype)
        known = self._addresses.get(key)
        if known is not None and known[0] is buf:
            return buf, known[1]
        address = data_address(buf)
        self._addresses.pop(key, None)
        _evict_oldest(self._addresses, self.LIMIT)
        self._addresses[key] = (buf, address)
        return buf, address

    def take(self, key: object, count: int, dtype: np.dtype) -> np.ndarray:
        """A 1-D buffer of ``count`` elements of ``dtype`` for ``key``, reused when free."""
        buf = self._spare.get(key)
        # References: the pool's dict, ``buf`` here and getrefcount's argument, and the
        # address cache's entry when there is one.
        if buf is not None:
            held = 4 if key in self._addresses and self._addresses[key][0] is buf else 3
            if sys.getrefcount(buf) == held:
                return buf
        buf = np.empty(count, dtype)
        self._spare.pop(key, None)  # a replaced buffer goes to the back of the queue
        _evict_oldest(self._spare, self.LIMIT)
        self._spare[key] = buf
        return buf


def _evict_oldest(entries: dict, limit: int) -> None:
    """Drop the longest-kept entry when ``entries`` is full (one at a time, never all:
    a run with more layouts than the limit keeps its recent ones)."""
    if len(entries) >= limit:
        del entries[next(iter(entries))]
