"""The workers of one checkpoint operation: who writes, and the few messages they exchange.

A :class:`Group` is opened by every worker for each save or restore (a
``Dup`` of the strategy's communicator; under ParameterServerStrategy a
communicator of the client ranks made from its coordination communicator) and
freed afterwards. Its root is the worker whose ``extended.should_checkpoint``
is true (the chief). Every message is buffer-mode (``Bcast``, ``Gather``,
``Gatherv``, ``Allreduce`` of NumPy buffers): control data travels as JSON
bytes, never as pickles. With one worker there is no communicator and every
operation is local.

:meth:`Group.agree` ends each phase: if any worker failed, every worker
raises (the first failing worker's error, with its type kept for
``CheckpointCorruptError``), so no worker runs ahead into a collective the
others never join.

Example:
    >>> import hpcdist as hd
    >>> with Group.open(hd.distribute.get_strategy()) as g:
    ...     g.is_root, g.size, g.bcast_json({"ok": 1}), g.gather_json([1])
    (True, 1, {'ok': 1}, [[1]])
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from hpcdist.checkpoint.format import CheckpointNotFoundError
from hpcdist.distribute.ps.checkpoint import clients_comm, is_ps_strategy
from hpcdist.errors import CheckpointCorruptError, CheckpointError
from hpcdist.runtime import mpi

__all__ = ["Group", "is_ps_strategy"]

_CHUNK = 1 << 30  # bytes per Bcast (stays below MPI's int count limit)


def workers_communicator(strategy: Any) -> Any:
    """A new communicator of the strategy's workers (``None`` with one worker); collective."""
    ext = strategy.extended
    if is_ps_strategy(strategy):
        return clients_comm(strategy)
    collectives = getattr(ext, "collectives", None)
    if collectives is None or getattr(ext, "num_workers", 1) <= 1:
        return None
    comm = collectives.comm
    return None if comm is None or comm.Get_size() == 1 else comm.Dup()


def _raise_as(kind: str, message: str) -> None:
    cls = {"corrupt": CheckpointCorruptError, "notfound": CheckpointNotFoundError}
    raise cls.get(kind, CheckpointError)(message)


def _kind(error: BaseException) -> str:
    if isinstance(error, CheckpointCorruptError):
        return "corrupt"
    if isinstance(error, CheckpointNotFoundError):
        return "notfound"
    return "error"


def _text(error: BaseException) -> str:
    return str(error) if isinstance(error, CheckpointError) else f"{type(error).__name__}: {error}"


class Group:
    """The workers taking part in one checkpoint operation (see the module docstring).

    Example: ``with Group.open(strategy) as g: g.agree(error_or_None)``.
    """

    def __init__(self, comm: Any, should_write: bool) -> None:
        self.comm = comm
        self.rank = 0 if comm is None else comm.Get_rank()
        self.size = 1 if comm is None else comm.Get_size()
        self.root = 0
        if comm is not None:
            self.root = self._min(self.rank if should_write else self.size)
            if self.root == self.size:
                self.close()
                raise CheckpointError(
                    "no worker of this strategy writes checkpoints (extended.should_checkpoint "
                    "is false everywhere); the cluster has no chief"
                )

    @classmethod
    def open(cls, strategy: Any) -> Group:
        """The group of ``strategy``'s workers (collective: every worker calls it).

        Example: ``g = Group.open(hd.distribute.get_strategy()); g.close()``.
        """
        comm = workers_communicator(strategy)
        return cls(comm, bool(strategy.extended.should_checkpoint))

    @property
    def is_root(self) -> bool:
        """Whether this worker is the chief (it writes and reads the files)."""
        return self.rank == self.root

    def close(self) -> None:
        """Free the communicator (idempotent)."""
        if self.comm is not None:
            self.comm.Free()
            self.comm = None

    def __enter__(self) -> Group:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- messages ---------------------------------------------------------------------------
    def _min(self, value: int) -> int:
        out = np.zeros(1, np.int64)
        self.comm.Allreduce(np.array([value], np.int64), out, op=mpi().MIN)
        return int(out[0])

    def _bcast_bytes(self, data: bytes | None, root: int) -> bytes:
        sent = data if data is not None else b""  # (read on the root only)
        n = np.array([len(sent) if self.rank == root else 0], np.int64)
        self.comm.Bcast(n, root=root)
        buf = np.frombuffer(sent, np.uint8).copy() if self.rank == root else None
        if buf is None:
            buf = np.empty(int(n[0]), np.uint8)
        self._bcast_buffer(buf, root)
        return buf.tobytes()

    def _bcast_buffer(self, buf: np.ndarray, root: int) -> None:
        flat = buf.reshape(-1).view(np.uint8)
        for start in range(0, flat.size, _CHUNK):
            self.comm.Bcast([flat[start : start + _CHUNK], mpi().BYTE], root=root)

    def agree(self, error: BaseException | None) -> None:
        """Raise on every worker if ``error`` is set on any (collective).

        A worker re-raises its own ``CheckpointError``; the others raise the
        first failing worker's error with the same type (``CheckpointCorruptError``,
        ``CheckpointNotFoundError`` or ``CheckpointError``). Other exceptions
        become a ``CheckpointError`` chained to them.

        Example: ``g.agree(None)`` returns on every worker when none failed.
        """
        if self.comm is None:
            first = 0 if error is not None else 1
        else:
            first = self._min(self.rank if error is not None else self.size)
        if first == self.size:
            return
        if self.comm is None:
            assert error is not None  # first < size: this (only) worker failed
            text = {"kind": _kind(error), "message": _text(error)}
        else:
            mine = {"kind": _kind(error), "message": _text(error)} if error is not None else None
            payload = json.dumps(mine).encode() if self.rank == first else None
            text = json.loads(self._bcast_bytes(payload, first))
            if first != self.root:
                text["message"] = f"worker {first}: {text['message']}"
        if isinstance(error, CheckpointError):
            raise error
        try:
            _raise_as(text["kind"], text["message"])
        except CheckpointError as exc:
            if error is not None:
                raise exc from error
            raise

    def bcast_json(self, obj: Any) -> Any:
        """The root's JSON-able ``obj`` on every worker.

        Example: ``header = g.bcast_json(header if g.is_root else None)``.
        """
        if self.comm is None:
            return obj
        data = json.dumps(obj).encode() if self.is_root else None
        return json.loads(self._bcast_bytes(data, self.root))

    def gather_json(self, obj: Any) -> list | None:
        """Every worker's JSON-able ``obj``, in rank order, on the root (``None`` elsewhere)."""
        if self.comm is None:
            return [obj]

        MPI = mpi()
        data = np.frombuffer(json.dumps(obj).encode(), np.uint8).copy()
        sizes = np.zeros(self.size, np.int64) if self.is_root else None
        self.comm.Gather(np.array([data.size], np.int64), sizes, root=self.root)
        if not self.is_root:
            self.comm.Gatherv([data, MPI.BYTE], None, root=self.root)
            return None
        assert sizes is not None  # the root's
        counts = [int(c) for c in sizes]
        displs = [sum(counts[:i]) for i in range(self.size)]
        out = np.empty(sum(counts), np.uint8)
        self.comm.Gatherv([data, MPI.BYTE], [out, (counts, displs), MPI.BYTE], root=self.root)
        return [json.loads(out[d : d + c].tobytes()) for d, c in zip(displs, counts, strict=True)]

    def bcast_arrays(self, arrays: list[np.ndarray] | None, specs: list) -> list[np.ndarray]:
        """The root's ``arrays`` on every worker; ``specs`` = ``[(dtype str, shape), ...]``.

        Example: ``values = g.bcast_arrays(values if g.is_root else None, specs)``.
        """
        if self.comm is None:
            return list(arrays or [])
        out: list[np.ndarray] = []
        for i, (dtype, shape) in enumerate(specs):
            if self.is_root:
                assert arrays is not None  # the root passes its arrays
                a = np.asarray(arrays[i])
                if not (a.flags.c_contiguous and a.flags.writeable):  # MPI wants a plain buffer
                    a = np.array(a, order="C")
            else:
                a = np.empty(tuple(shape), np.dtype(dtype))
            if a.nbytes:
                self._bcast_buffer(a, self.root)
            out.append(a)
        return out
