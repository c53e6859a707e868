"""All-to-all: each rank sends a slice of its array's rows to every rank.

Rank ``r`` splits its array along axis 0 into ``size`` consecutive blocks
of ``splits[0], splits[1], ...`` rows (default: equal blocks) and sends
block ``j`` to rank ``j``; it receives one block from every rank,
concatenated in rank order, and the row counts it received. The dtype and
the dimensions after the first must agree on every rank; arguments that
are wrong on some ranks only raise :class:`~hpcdist.errors.CollectiveMismatchError`
on every rank (one small agreement exchange, then ``Alltoall`` of the
counts and ``Alltoallv`` of the bytes).

Example:
    >>> import numpy as np
    >>> from hpcdist.runtime import mpi
    >>> from hpcdist.collectives import Collectives
    >>> out, got = alltoall(Collectives(mpi().COMM_SELF), np.arange(3))
    >>> out.tolist(), got.tolist()
    ([0, 1, 2], [3])
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from hpcdist.errors import CollectiveMismatchError
from hpcdist.runtime import mpi


def _check(x: np.ndarray, splits: Sequence[int] | None, size: int) -> np.ndarray:
    """The validated splits (int64, one per rank); ``ValueError`` says what is wrong."""
    if x.ndim == 0:
        raise ValueError("alltoall needs an array with at least one dimension; got a 0-d array")
    rows = x.shape[0]
    if splits is None:
        if rows % size:
            raise ValueError(
                f"alltoall without splits needs axis 0 ({rows} rows) divisible by {size} ranks; "
                "pass splits"
            )
        return np.full(size, rows // size, dtype=np.int64)
    s = np.asarray(splits, dtype=np.int64).reshape(-1)
    if s.shape[0] != size or (s < 0).any() or int(s.sum()) != rows:
        raise ValueError(
            f"alltoall splits are {s.tolist()}; expected {size} non-negative row counts "
            f"summing to the {rows} rows of the array"
        )
    return s


def alltoall(
    engine: Any, tensor: np.ndarray, splits: Sequence[int] | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """``(received rows in rank order, rows received from each rank)`` over ``engine``'s ranks.

    ``engine`` is a :class:`~hpcdist.collectives.Collectives`; see the module doc.
    """
    x = np.ascontiguousarray(tensor)
    size, comm = engine.size, engine.comm
    problem = ""
    counts = np.zeros(size, dtype=np.int64)
    try:
        counts = _check(x, splits, size)
    except (TypeError, ValueError) as err:
        problem = str(err)
    mine = (problem, x.dtype.str, tuple(x.shape[1:]))
    views = comm.allgather(mine) if size > 1 else [mine]
    if problem or any(v[0] for v in views) or len({v[1:] for v in views}) > 1:
        text = "; ".join(
            f"rank {r}: " + (v[0] or f"{np.dtype(v[1])}(*, {', '.join(map(str, v[2]))})")
            for r, v in enumerate(views)
        )
        raise CollectiveMismatchError(
            f"alltoall arguments disagree or are invalid: {text}. Every rank must pass the "
            "same dtype and trailing dimensions, and splits with one count per rank"
        )
    if size == 1:
        return x.copy(), counts.copy()
    received = np.empty(size, dtype=np.int64)
    comm.Alltoall(counts, received)
    row_bytes = int(np.prod(x.shape[1:], dtype=np.int64)) * x.dtype.itemsize
    out = np.empty((int(received.sum()), *x.shape[1:]), dtype=x.dtype)
    send_counts = (counts * row_bytes).tolist()
    recv_counts = (received * row_bytes).tolist()
    send_displs = [0, *np.cumsum(send_counts)[:-1].tolist()]
    recv_displs = [0, *np.cumsum(recv_counts)[:-1].tolist()]
    MPI = mpi()
    comm.Alltoallv(
        [x.reshape(-1).view(np.uint8), (send_counts, send_displs), MPI.BYTE],
        [out.reshape(-1).view(np.uint8), (recv_counts, recv_displs), MPI.BYTE],
    )
    return out, received
