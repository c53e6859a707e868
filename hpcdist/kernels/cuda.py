"""CUDA kernels of the fused all-reduce: pack, k-way reduce and unpack, one launch each.

Importing this module imports ``numba.cuda`` (nothing else in
:mod:`hpcdist.kernels` does). Arguments are Numba device arrays or any object
with ``__cuda_array_interface__`` (CuPy arrays), taken without copies.

Design (one launch per bucket, any number of tensors, no recompilation when
the bucket changes): a bucket's tensors are described by a
:class:`TensorTable`, two small ``int64`` device arrays: the data address of
each C-contiguous tensor and the element offset of each tensor in the flat
buffer (a prefix sum, one entry more than tensors). The pack and unpack
kernels run a grid-stride loop over the flat buffer's elements; a thread finds
the tensor of element ``j`` by binary search in the offsets (resuming from the
tensor of its previous element) and reads or writes that tensor through its
raw address (an ``inttoptr`` in device code). All tensors of one bucket share
one dtype, the flat buffer's. Build a table once per bucket layout with
:func:`tensor_table` and pass it instead of the tensors to skip the small
host-to-device copy of the table on later calls (the tensors must then stay
allocated at the same addresses). Given a list instead, :func:`pack_cuda` and
:func:`unpack_cuda` look the table up by layout (:func:`cached_table`): it is
built, and copied to the device, once per layout; tables of CuPy tensors live
in CuPy's memory pool.

Under Numba's CUDA simulator (``NUMBA_ENABLE_CUDASIM=1`` set before
``numba.cuda`` is first imported) the same kernels run on the host and the
raw-address access is done with ``ctypes`` on the simulated arrays' host
memory, so the indexing logic is tested without a GPU.

``reduce_slots_cuda`` has the semantics of the CPU
:func:`hpcdist.kernels.cpu.reduce_slots`: a left fold in row order over a
2-D device array (rows may be strided views), ``float16`` accumulated in
``float32``, ``out`` may be a row of ``slots``.

Example (needs a GPU or the simulator)::

    table = tensor_table(grads)                  # once per bucket layout
    pack_cuda(table, flat, scale=1 / world_size)  # one launch
    ...                                           # all-reduce flat
    unpack_cuda(flat, table)                      # one launch
"""

from __future__ import annotations

import ctypes
import math
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numba import config, cuda

from hpcdist.arrays import is_c_contiguous_device
from hpcdist.kernels.cpu import MAX, MEAN, MIN, SUM

__all__ = [
    "TensorTable",
    "cached_table",
    "pack_cuda",
    "reduce_slots_cuda",
    "simulator_enabled",
    "tensor_table",
    "unpack_cuda",
]

_SUPPORTED_CHARS = frozenset("efdbhilqBHILQ")
_FLOAT_CHARS = frozenset("efd")


def simulator_enabled() -> bool:
    """True when Numba's CUDA simulator is on (``NUMBA_ENABLE_CUDASIM=1``).

    Example: ``simulator_enabled()`` is ``False`` on a normal GPU run.
    """
    return bool(config.ENABLE_CUDASIM)


# ------------------------------------------------------------ raw device memory access

if simulator_enabled():

    def _raw_view(addr: int, index: int, like: Any) -> np.ndarray:
        dtype = np.dtype(like.dtype)
        buf = (ctypes.c_char * dtype.itemsize).from_address(int(addr) + int(index) * dtype.itemsize)
        return np.frombuffer(buf, dtype=dtype)

    def _load(
        addr: int, index: int, like: Any
    ) -> float:  # a plain function the simulated kernel calls
        return _raw_view(addr, index, like)[0]

    def _store(addr: int, index: int, value: float, like: Any) -> None:
        _raw_view(addr, index, like)[0] = value

else:
    from numba import types
    from numba.cuda.extending import intrinsic

    @intrinsic
    def _load(
        typingctx: Any, addr: types.Type, index: types.Type, like: types.Type
    ) -> tuple[Any, Callable[..., Any]]:
        """``((like.dtype*) addr)[index]``: a load through a raw device address."""
        sig = like.dtype(types.int64, types.int64, like)

        def codegen(context: Any, builder: Any, signature: Any, args: list[Any]) -> Any:
            elem = context.get_data_type(signature.return_type)
            ptr = builder.inttoptr(args[0], elem.as_pointer())
            return builder.load(builder.gep(ptr, [args[1]]))

        return sig, codegen

    @intrinsic
    def _store(
        typingctx: Any, addr: types.Type, index: types.Type, value: types.Type, like: types.Type
    ) -> tuple[Any, Callable[..., Any]]:
        """``((like.dtype*) addr)[index] = value``: a store through a raw device address."""
        sig = types.void(types.int64, types.int64, like.dtype, like)

        def codegen(context: Any, builder: Any, signature: Any, args: list[Any]) -> Any:
            elem = context.get_data_type(signature.args[2])
            ptr = builder.inttoptr(args[0], elem.as_pointer())
            builder.store(args[2], builder.gep(ptr, [args[1]]))
            return context.get_dummy_value()

        return sig, codegen


# --------------------------------------------------------------------------- kernels


@cuda.jit(device=True)
def _find_tensor(offsets: Any, j: int, start: int) -> int:
    # the largest t >= start with offsets[t] <= j; zero-size tensors are skipped
    lo = start
    hi = offsets.shape[0] - 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if offsets[mid] <= j:
            lo = mid
        else:
            hi = mid
    return lo


@cuda.jit
def _pack_kernel(
    flat: Any, addrs: Any, offsets: Any, total: int, scale: float, use_scale: bool
) -> None:
    t = 0
    for j in range(cuda.grid(1), total, cuda.gridsize(1)):
        t = _find_tensor(offsets, j, t)
        v = _load(addrs[t], j - offsets[t], flat)
        if use_scale:
            flat[j] = v * scale
        else:
            flat[j] = v


@cuda.jit
def _unpack_kernel(
    flat: Any, addrs: Any, offsets: Any, total: int, scale: float, use_scale: bool
) -> None:
    t = 0
    for j in range(cuda.grid(1), total, cuda.gridsize(1)):
        t = _find_tensor(offsets, j, t)
        if use_scale:
            _store(addrs[t], j - offsets[t], flat[j] * scale, flat)
        else:
            _store(addrs[t], j - offsets[t], flat[j], flat)


@cuda.jit(device=True)
def _min(a: float, b: float) -> float:
    if a != a:
        return a
    return a if a <= b else b


@cuda.jit(device=True)
def _max(a: float, b: float) -> float:
    if a != a:
        return a
    return a if a >= b else b


@cuda.jit(device=True)
def _fold(slots: Any, nrows: int, j: int, op: int, zero: float) -> float:
    # the left fold of column j in row order, in the type of ``zero`` (the accumulator's)
    acc = zero + slots[0, j]
    for k in range(1, nrows):
        v = zero + slots[k, j]
        if op == MIN:
            acc = _min(acc, v)
        elif op == MAX:
            acc = _max(acc, v)
        else:
            acc = acc + v
    return acc


@cuda.jit
def _reduce_kernel(
    slots: Any, lo: int, count: int, out: Any, out_lo: int, op: int, zero: float
) -> None:
    # SUM, MIN, MAX for every dtype: no division here, so integer rows never pass
    # through float64 (a ``/`` would make Numba unify the accumulator with float64)
    nrows = slots.shape[0]
    for i in range(cuda.grid(1), count, cuda.gridsize(1)):
        out[out_lo + i] = _fold(slots, nrows, lo + i, op, zero)


@cuda.jit
def _mean_kernel(
    slots: Any, lo: int, count: int, out: Any, out_lo: int, divisor: float, zero: float
) -> None:
    # MEAN, float dtypes only: the sum divided once, in the accumulator's type
    nrows = slots.shape[0]
    for i in range(cuda.grid(1), count, cuda.gridsize(1)):
        out[out_lo + i] = _fold(slots, nrows, lo + i, SUM, zero) / divisor


# ------------------------------------------------------------------------- host side


def _is_device_array(x: Any) -> bool:
    if simulator_enabled():
        return bool(getattr(x, "__cuda_ndarray__", False))
    return hasattr(x, "__cuda_array_interface__")


def as_device(x: Any, what: str) -> Any:
    """A Numba device array for ``x`` (itself, or a zero-copy view of a CuPy array)."""
    if not _is_device_array(x):
        raise TypeError(
            f"{what} is {type(x).__name__}; expected a device array (a Numba device array or "
            "an object with __cuda_array_interface__ such as a CuPy array)"
        )
    # (numba.cuda has no is_cuda_ndarray; a Numba device array says so with this attribute)
    if simulator_enabled() or getattr(x, "__cuda_ndarray__", False):
        return x
    # No sync on the array's stream: callers launch on the stream that orders the work.
    return cuda.as_cuda_array(x, sync=False)


def _address(x: Any) -> int:
    if simulator_enabled():
        return int(x._ary.__array_interface__["data"][0])
    return int(x.__cuda_array_interface__["data"][0])


def is_c_contiguous(x: Any) -> bool:
    if simulator_enabled():
        return bool(x._ary.flags.c_contiguous)
    return is_c_contiguous_device(x)


def launch_config(n: int) -> tuple[int, int]:
    """(blocks, threads) for a grid-stride loop over ``n`` elements."""
    if simulator_enabled():
        threads, max_blocks = 16, 2  # every simulated thread is a Python thread
    else:
        threads, max_blocks = 256, 4096
    return max(1, min(max_blocks, math.ceil(n / threads))), threads


def _acc_dtype(dtype: np.dtype) -> np.dtype:
    return np.dtype(np.float32) if dtype.char == "e" else dtype


def _scale_args(scale: float | None, dtype: np.dtype, what: str) -> tuple[Any, bool]:
    if scale is None:
        return _acc_dtype(dtype).type(1), False
    if dtype.char not in _FLOAT_CHARS:
        raise TypeError(
            f"{what}: scale={scale!r} needs a float dtype, found {dtype}; pass scale=None"
        )
    return _acc_dtype(dtype).type(scale), True


@dataclass(frozen=True)
class TensorTable:
    """The device-side description of a bucket's tensors (see the module docstring).

    ``addrs`` and ``offsets`` are ``int64`` device arrays (``len(sizes)`` and
    ``len(sizes) + 1`` entries), ``sizes`` the element counts, ``total`` their
    sum, ``dtype`` the common dtype. ``tensors`` keeps the tensors alive.

    Example: ``tensor_table([a, b]).total == a.size + b.size``.
    """

    addrs: Any
    offsets: Any
    sizes: tuple[int, ...]
    total: int
    dtype: np.dtype
    tensors: tuple[Any, ...]


def tensor_table(tensors: Sequence[Any], stream: Any = 0) -> TensorTable:
    """A :class:`TensorTable` for C-contiguous device arrays of one dtype.

    Example: ``table = tensor_table(grads)`` then ``pack_cuda(table, flat)``.
    """
    return _build_table(tensors, stream, keep=True)


def _build_table(tensors: Sequence[Any], stream: Any, keep: bool) -> TensorTable:
    arrays = tuple(as_device(t, f"tensor {i}") for i, t in enumerate(tensors))
    if not arrays:
        raise ValueError("tensor_table: no tensors; expected at least one device array")
    dtype = np.dtype(arrays[0].dtype)
    for i, a in enumerate(arrays):
        if np.dtype(a.dtype) != dtype:
            raise TypeError(
                f"tensor_table: tensor {i} is {np.dtype(a.dtype)} but tensor 0 is {dtype}; "
                "put tensors of one dtype in one bucket"
            )
        if not is_c_contiguous(a):
            raise ValueError(
                f"tensor_table: tensor {i} of shape {tuple(a.shape)} is not C-contiguous; "
                "pass a contiguous copy"
            )
    if dtype.char not in _SUPPORTED_CHARS:
        raise TypeError(
            f"tensor_table: dtype {dtype} is not supported; expected float16/32/64 or "
            "(u)int8/16/32/64"
        )
    sizes = tuple(int(np.prod(a.shape, dtype=np.int64)) for a in arrays)
    offsets = np.zeros(len(arrays) + 1, np.int64)
    np.cumsum(sizes, out=offsets[1:])
    addrs = np.array([_address(a) for a in arrays], np.int64)
    cupy_owned = any(type(t).__module__.split(".", 1)[0] == "cupy" for t in tensors)
    return TensorTable(
        addrs=_upload(addrs, stream, cupy_owned),
        offsets=_upload(offsets, stream, cupy_owned),
        sizes=sizes,
        total=int(offsets[-1]),
        dtype=dtype,
        tensors=arrays if keep else (),
    )


def _upload(host: np.ndarray, stream: Any, cupy_owned: bool) -> Any:
    """A device copy of a small host table; from CuPy's memory pool when the tensors are CuPy's.

    Runs once per bucket layout (tables are cached): CuPy's pool returns the memory
    without ``cudaFree`` (Numba's deferred frees would block the host), and the copy is
    waited for here so that a kernel on any stream sees the table. The table is handed
    to the kernels as a Numba view made once without sync: a CuPy array passed as it is
    would make Numba wait on the array's stream at every launch.
    """
    if cupy_owned and not simulator_enabled():
        import cupy  # lazy: optional GPU dependency (CuPy; the tensors are CuPy arrays)

        # on the current device, from CuPy's pool, on a stream of its own: the caller's
        # stream may hold queued work that this one-time copy need not wait for
        with cupy.cuda.Stream(non_blocking=True) as upload:
            device = cupy.asarray(host)
        upload.synchronize()
        return cuda.as_cuda_array(device, sync=False)  # (the view keeps `device` alive)
    return cuda.to_device(host, stream=stream)


#: Tables built by :func:`pack_cuda` / :func:`unpack_cuda` for lists of tensors, by layout.
TABLE_CACHE_SIZE = 256
_TABLES: OrderedDict[tuple[Any, ...], TensorTable] = OrderedDict()
_TABLES_LOCK = threading.Lock()


def _layout_key(tensors: Sequence[Any]) -> tuple[Any, ...] | None:
    """What a table encodes, per tensor: address, shape, dtype, contiguity (None: no key)."""
    key = []
    for t in tensors:
        if not _is_device_array(t):
            return None  # _build_table raises the error
        key.append((_address(t), tuple(t.shape), np.dtype(t.dtype).str, is_c_contiguous(t)))
    return tuple(key)


def cached_table(tensors: Sequence[Any], stream: Any = 0) -> TensorTable:
    """The :class:`TensorTable` of ``tensors``, built once per layout and kept.

    A layout is the tensors' addresses, shapes and dtype, so a hit describes exactly
    these tensors; up to :data:`TABLE_CACHE_SIZE` layouts are kept (least recently
    used dropped). Cached tables do not keep the tensors alive.

    Example: ``cached_table(grads) is cached_table(grads)``.
    """
    key = _layout_key(tensors)
    if key is not None:
        with _TABLES_LOCK:
            table = _TABLES.get(key)
            if table is not None:
                _TABLES.move_to_end(key)
                return table
    table = _build_table(tensors, stream, keep=key is None)
    if key is not None:
        with _TABLES_LOCK:
            _TABLES[key] = table
            while len(_TABLES) > TABLE_CACHE_SIZE:
                _TABLES.popitem(last=False)
    return table


def _table_and_flat(tensors: Any, flat: Any, what: str, stream: Any) -> tuple[TensorTable, Any]:
    table = tensors if isinstance(tensors, TensorTable) else cached_table(tensors, stream)
    flat = as_device(flat, f"{what}: flat")
    if len(flat.shape) != 1 or np.dtype(flat.dtype) != table.dtype:
        raise TypeError(
            f"{what}: flat is {np.dtype(flat.dtype)} of shape {tuple(flat.shape)}; expected a "
            f"1-D {table.dtype} device array"
        )
    if flat.shape[0] < table.total:
        raise ValueError(
            f"{what}: flat has {flat.shape[0]} elements but the tensors hold {table.total}; "
            "pass a flat buffer at least that large"
        )
    return table, flat


def pack_cuda(
    tensors: Sequence[Any] | TensorTable, flat: Any, scale: float | None = None, stream: Any = 0
) -> Any:
    """Copy the tensors (times ``scale``) into ``flat[:total]`` in one kernel launch.

    ``scale`` multiplies in the tensors' float dtype (``float32`` for
    ``float16``, rounded once); integers take no scale. Returns ``flat``.

    Example: ``pack_cuda(grads, flat, scale=1 / world_size)``.
    """
    table, flat = _table_and_flat(tensors, flat, "pack_cuda", stream)
    scale_value, use_scale = _scale_args(scale, table.dtype, "pack_cuda")
    if table.total:
        blocks, threads = launch_config(table.total)
        _pack_kernel[blocks, threads, stream](
            flat, table.addrs, table.offsets, table.total, scale_value, use_scale
        )
    return flat


def unpack_cuda(
    flat: Any, tensors: Sequence[Any] | TensorTable, scale: float | None = None, stream: Any = 0
) -> None:
    """Copy ``flat[:total]`` (times ``scale``) back into the tensors in one kernel launch.

    The inverse of :func:`pack_cuda`, with the same scale rules.

    Example: ``unpack_cuda(flat, table)`` after the all-reduce of ``flat``.
    """
    table, flat = _table_and_flat(tensors, flat, "unpack_cuda", stream)
    scale_value, use_scale = _scale_args(scale, table.dtype, "unpack_cuda")
    if table.total:
        blocks, threads = launch_config(table.total)
        _unpack_kernel[blocks, threads, stream](
            flat, table.addrs, table.offsets, table.total, scale_value, use_scale
        )


def reduce_slots_cuda(
    slots: Any,
    lo: int,
    hi: int,
    out: Any,
    out_lo: int,
    op: int,
    divisor: int,
    stream: Any = 0,
) -> None:
    """``out[out_lo + i - lo] = slots[0, i] OP ... OP slots[n-1, i]`` on the GPU, one launch.

    The semantics of :func:`hpcdist.kernels.cpu.reduce_slots` (left fold in
    row order, ``SUM``/``MEAN``/``MIN``/``MAX``, ``float16`` accumulated in
    ``float32``, ``out`` may be a row of ``slots`` with ``out_lo == lo``);
    each element is folded by one thread, so any row stride works.

    Example: ``reduce_slots_cuda(window, 0, m, window[0], 0, SUM, 1)``.
    """
    slots = as_device(slots, "reduce_slots_cuda: slots")
    out = as_device(out, "reduce_slots_cuda: out")
    dtype = np.dtype(slots.dtype)
    if len(slots.shape) != 2 or len(out.shape) != 1 or np.dtype(out.dtype) != dtype:
        raise TypeError(
            f"reduce_slots_cuda: slots is {dtype} of shape {tuple(slots.shape)} and out is "
            f"{np.dtype(out.dtype)} of shape {tuple(out.shape)}; expected 2-D slots and 1-D out "
            "of one dtype"
        )
    if dtype.char not in _SUPPORTED_CHARS:
        raise TypeError(
            f"reduce_slots_cuda: dtype {dtype} is not supported; expected float16/32/64 or "
            "(u)int8/16/32/64"
        )
    if op not in (SUM, MEAN, MIN, MAX):
        raise ValueError(f"reduce_slots_cuda: op is {op!r}; expected SUM=0, MEAN=1, MIN=2, MAX=3")
    if op == MEAN and (dtype.char not in _FLOAT_CHARS or divisor <= 0):
        raise ValueError(
            f"reduce_slots_cuda: MEAN with divisor {divisor} on {dtype}; expected a float dtype "
            "and a positive divisor"
        )
    nrows, m = slots.shape
    if nrows < 1:
        raise ValueError("reduce_slots_cuda: slots has no rows; expected at least one row")
    if not 0 <= lo <= hi <= m:
        raise ValueError(
            f"reduce_slots_cuda: lo={lo}, hi={hi} is not a range of the {m} elements of a slot; "
            "expected 0 <= lo <= hi <= slots.shape[1]"
        )
    count = hi - lo
    if out_lo < 0 or out_lo + count > out.shape[0]:
        raise ValueError(
            f"reduce_slots_cuda: writing {count} elements at out_lo={out_lo} overruns out of "
            f"{out.shape[0]} elements; pass a larger out"
        )
    if count == 0:
        return
    acc = _acc_dtype(dtype)
    blocks, threads = launch_config(count)
    if op == MEAN:
        _mean_kernel[blocks, threads, stream](
            slots, lo, count, out, out_lo, acc.type(divisor), acc.type(0)
        )
    else:
        _reduce_kernel[blocks, threads, stream](slots, lo, count, out, out_lo, op, acc.type(0))
