"""The client side of the parameter servers: one :class:`PSClient` per strategy on each client rank.

Every method sends one request (a fixed int64 header, then its payloads) to
one ps task and, if it is synchronous, waits for the reply. A lock makes a
request and its reply one unit, so the client can be shared between threads.
Asynchronous requests (``update``, ``apply``, ``apply_sparse``) return as
soon as their data is handed to MPI (the arrays may be reused at once); the
ps handles a client's requests in the order they were sent, and reports an
error of an asynchronous request in the reply of that client's next
synchronous one (``pull``, ``stats``, ``close``, ...).

Example: ``client = PSClient(ps_comm, roles.ps_ranks, initializer=roles.is_chief)``, then
``client.create(0, 0, np.zeros(3), "w")``, ``client.pull(0, [0], [out])``, ``client.close()``.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from hpcdist.arrays import to_host
from hpcdist.distribute.ps import protocol as P
from hpcdist.distribute.ps.protocol import PSError, PSTypeError
from hpcdist.runtime import mpi

_OPT_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def _host(value: Any, what: str) -> np.ndarray:
    """``value`` as a C-contiguous NumPy array of a dtype the ps holds."""
    arr = value if isinstance(value, np.ndarray) else np.asarray(to_host(value))
    if not arr.flags.c_contiguous:
        arr = arr.copy(order="C")  # (np.ascontiguousarray would make a 0-d array 1-d)
    P.dtype_code(arr.dtype)  # PSTypeError with the supported dtypes
    if arr.dtype.kind == "V" or arr.dtype.hasobject:
        raise PSTypeError(f"{what} has dtype {arr.dtype}; expected a numeric array")
    return arr


def _rows(rows: Any) -> np.ndarray:
    arr = np.asarray(to_host(rows))
    if arr.dtype.kind not in "iu":
        raise PSTypeError(f"row indices must be integers, got dtype {arr.dtype}")
    return np.ascontiguousarray(arr.reshape(-1), dtype=np.int64)


class PSClient:
    """Requests to the parameter servers ``ps_ranks`` (ranks of ``comm``) from this rank.

    ``initializer`` is true on the one client that creates the variables (the
    chief, or worker 0 without a chief); the other clients declare them.

    Example: ``PSClient(extended._ps_comm, roles.ps_ranks, initializer=True).stats(0)``.
    """

    def __init__(self, comm: Any, ps_ranks: Sequence[int], *, initializer: bool) -> None:
        self._MPI = mpi()
        self._comm = comm
        self._ps_ranks = tuple(int(r) for r in ps_ranks)
        if not self._ps_ranks:
            raise PSError("PSClient needs at least one parameter-server rank; got none")
        self._initializer = bool(initializer)
        comm.Set_errhandler(self._MPI.ERRORS_RETURN)
        self._lock = threading.Lock()
        self._closed = False
        self._reply = np.zeros(P.HEADER_WORDS, np.int64)

    @property
    def num_ps(self) -> int:
        """The number of ps tasks."""
        return len(self._ps_ranks)

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    # -- transport ------------------------------------------------------------------------------
    def _rank(self, ps: int) -> int:
        if self._closed:
            raise PSError("closed: this PSClient was closed (strategy.shutdown() or exit)")
        if not 0 <= int(ps) < len(self._ps_ranks):
            raise PSError(
                f"ps task {ps} does not exist; there are {len(self._ps_ranks)} ps tasks "
                f"(0..{len(self._ps_ranks) - 1})"
            )
        return self._ps_ranks[int(ps)]

    def _mpi_error(self, ps: int, e: Exception) -> PSError:
        cls = e.Get_error_class() if isinstance(e, self._MPI.Exception) else None
        dead = cls in (self._MPI.ERR_PROC_FAILED, self._MPI.ERR_PROC_FAILED_PENDING)
        why = "failed (the process died)" if dead else f"could not be reached: {e}"
        return PSError(f"parameter server task {ps} (rank {self._ps_ranks[ps]}) {why}", cls)

    def _send(self, dest: int, h: np.ndarray, *payloads: np.ndarray) -> None:
        comm, MPI = self._comm, self._MPI
        h[P.LENGTH] = sum(int(p.nbytes) for p in payloads)
        comm.Send([h, MPI.INT64_T], dest, P.TAG_HEADER)
        for p in payloads:
            comm.Send([p, MPI.BYTE], dest, P.TAG_PAYLOAD)

    def _recv_reply(self, src: int) -> np.ndarray:
        """The reply header from ``src``; a PSError with the server's message if it failed."""
        r = self._reply
        self._comm.Recv([r, self._MPI.INT64_T], src, P.TAG_REPLY)
        P.check_reply(r)
        if r[P.STATUS] != P.STATUS_OK:
            text = np.empty(int(r[P.MSGLEN]), np.uint8)
            self._comm.Recv([text, self._MPI.BYTE], src, P.TAG_REPLY)
            raise P.error_of_status(int(r[P.STATUS]), str(P.from_json_bytes(text)))
        return r

    def _recv(self, src: int, buf: np.ndarray) -> None:
        self._comm.Recv([buf, self._MPI.BYTE], src, P.TAG_REPLY)

    def _call(self, ps: int, fn: Any) -> Any:
        """Run ``fn(rank)`` under the lock, turning MPI failures into PSError."""
        with self._lock:
            dest = self._rank(ps)
            try:
                return fn(dest)
            except self._MPI.Exception as e:
                raise self._mpi_error(int(ps), e) from e

    # -- variables ------------------------------------------------------------------------------
    def create(self, ps: int, var_id: int, value: np.ndarray, name: str) -> None:
        """Create variable ``var_id`` on ps task ``ps`` with ``value`` (initializer), or declare
        it and wait until the initializer created it (other clients; shape, dtype and name
        checked: a mismatch raises :class:`PSError` naming both views).

        Example: ``client.create(0, 5, np.zeros((10, 4), np.float32), "dense/kernel")``.
        """
        arr = _host(value, f"the initial value of {name!r}")
        meta = P.to_json_bytes({"name": str(name), "shape": list(arr.shape)})
        op = P.OP_CREATE if self._initializer else P.OP_DECLARE
        h = P.encode_header(op, int(var_id), value=arr)

        def go(dest: int) -> None:
            if op == P.OP_CREATE:
                self._send(dest, h, meta, P.as_bytes(arr))
            else:
                self._send(dest, h, meta)
            self._recv_reply(dest)

        self._call(ps, go)

    def pull(self, ps: int, var_ids: Sequence[int], outs: Sequence[np.ndarray]) -> list[int]:
        """Fill each of ``outs`` with the current value of the matching variable; returns the
        versions. Each out must be a writable C-contiguous NumPy array of its variable's shape
        and dtype (the data is received straight into it).
        """
        ids = [int(i) for i in var_ids]
        if len(ids) != len(outs):
            raise PSError(f"pull got {len(ids)} variable ids but {len(outs)} outputs")
        for out in outs:
            if not (isinstance(out, np.ndarray) and out.flags.c_contiguous and out.flags.writeable):
                raise PSTypeError(
                    f"pull outputs must be writable C-contiguous NumPy arrays; got "
                    f"{type(out).__name__}. Allocate with np.empty(shape, dtype)"
                )
        if not ids:
            return []
        n = len(ids)
        table = None
        if n == 1:
            h = P.encode_header(P.OP_PULL, ids[0], count=1, value=outs[0])
        else:
            h = P.encode_header(P.OP_PULL, count=n)
            table = np.array(
                [ids, [P.dtype_code(o.dtype) for o in outs], [o.nbytes for o in outs]], np.int64
            )

        def go(dest: int) -> list[int]:
            if table is None:
                self._send(dest, h)
            else:
                self._send(dest, h, table.view(np.uint8).reshape(-1))
            r = self._recv_reply(dest)
            if n == 1:
                versions = [int(r[P.VERSION])]
            else:
                vers = np.empty(n, np.int64)
                self._recv(dest, vers.view(np.uint8))
                versions = vers.tolist()
            for out in outs:
                self._recv(dest, P.as_bytes(out))
            return versions

        return self._call(ps, go)

    def update(self, ps: int, var_id: int, op: str, value: np.ndarray) -> None:
        """``assign``, ``add`` or ``sub`` ``value`` (the variable's shape) to variable ``var_id``;
        asynchronous, ordered after this client's earlier requests to that ps.

        Example: ``client.update(0, 5, "add", np.ones((10, 4), np.float32))``.
        """
        mode = P.UPDATE_OPS.get(op)
        if mode is None:
            raise PSError(f"update op must be one of {sorted(P.UPDATE_OPS)}, got {op!r}")
        arr = _host(value, f"the value for variable {var_id}")
        h = P.encode_header(P.OP_UPDATE, int(var_id), value=arr, a=mode)
        self._call(ps, lambda dest: self._send(dest, h, P.as_bytes(arr)))

    def add_fetch(self, ps: int, var_id: int, delta: np.ndarray) -> np.ndarray:
        """Atomically add ``delta`` to variable ``var_id`` and return its new value.

        Example: ``step = int(client.add_fetch(0, 0, np.int64(1)))``.
        """
        arr = _host(delta, f"the delta for variable {var_id}")
        h = P.encode_header(P.OP_ADD_FETCH, int(var_id), value=arr)

        def go(dest: int) -> np.ndarray:
            self._send(dest, h, P.as_bytes(arr))
            r = self._recv_reply(dest)
            shape = P.get_shape(r)
            out = np.empty(arr.shape if shape is None else shape, P.dtype_of(int(r[P.DTYPE])))
            self._recv(dest, P.as_bytes(out))
            return out

        return self._call(ps, go)

    # -- optimizers -----------------------------------------------------------------------------
    def register_optimizer(self, opt_id: int, class_name: str, config: dict) -> None:
        """Register optimizer ``opt_id`` (``"SGD"``, ``"Adam"``, ``"AdamW"``, ``"RMSprop"`` and its
        ``get_config()``) on every ps; the same registration from several clients is fine.

        Example: ``client.register_optimizer(0, "Adam", Adam(1e-3).get_config())``.
        """
        if class_name not in P.OPTIMIZER_CLASSES:
            raise PSError(
                f"the parameter server cannot run optimizer class {class_name!r}; expected one "
                f"of {', '.join(P.OPTIMIZER_CLASSES)}"
            )
        body = P.to_json_bytes({"class_name": class_name, "config": config})
        h = P.encode_header(P.OP_REGISTER, int(opt_id))

        def go(dest: int) -> None:
            self._send(dest, h, body)
            self._recv_reply(dest)

        for ps in range(len(self._ps_ranks)):
            self._call(ps, go)

    def apply(
        self,
        ps: int,
        opt_id: int,
        var_ids: Sequence[int],
        grads: Sequence[np.ndarray],
        lr: float,
        versions: Sequence[int],
    ) -> None:
        """Asynchronously apply optimizer ``opt_id`` with learning rate ``lr`` to each variable
        with its dense gradient; ``versions[i]`` is the version of variable ``i`` the gradient
        was computed from (for the staleness stats).
        """
        n = len(var_ids)
        if not n == len(grads) == len(versions):
            raise PSError(
                f"apply got {n} variable ids, {len(grads)} gradients and {len(versions)} versions;"
                " expected one of each per variable"
            )
        arrs = [
            _host(g, f"the gradient for variable {i}") for i, g in zip(var_ids, grads, strict=True)
        ]
        for i, g in zip(var_ids, arrs, strict=True):
            if g.dtype not in _OPT_DTYPES:
                raise PSTypeError(
                    f"the gradient for variable {i} has dtype {g.dtype}; the parameter server "
                    "optimizes float32 and float64 values only"
                )
        if n == 0:
            return
        table = np.array(
            [list(var_ids), list(versions), [P.dtype_code(g.dtype) for g in arrs],
             [g.nbytes for g in arrs]],
            np.int64,
        )  # fmt: skip
        h = P.encode_header(P.OP_APPLY, int(opt_id), count=n, a=P.float_word(lr))
        payloads = [table.view(np.uint8).reshape(-1)] + [P.as_bytes(g) for g in arrs]
        self._call(ps, lambda dest: self._send(dest, h, *payloads))

    def gather(self, ps: int, var_id: int, rows: np.ndarray, out: np.ndarray) -> int:
        """``out[i] = value[rows[i]]`` for the local rows ``rows`` of variable ``var_id``;
        returns its version.

        Example: ``client.gather(0, 5, np.array([3, 3, 0]), np.empty((3, 4), np.float32))``.
        """
        idx = _rows(rows)
        if not (isinstance(out, np.ndarray) and out.flags.c_contiguous and out.flags.writeable):
            raise PSTypeError("gather's out must be a writable C-contiguous NumPy array")
        h = P.encode_header(P.OP_GATHER, int(var_id), count=idx.size, value=out)

        def go(dest: int) -> int:
            self._send(dest, h, idx.view(np.uint8))
            version = int(self._recv_reply(dest)[P.VERSION])
            self._recv(dest, P.as_bytes(out))
            return version

        return self._call(ps, go)

    def apply_sparse(
        self,
        ps: int,
        opt_id: int,
        var_id: int,
        rows: np.ndarray,
        values: np.ndarray,
        lr: float,
        version: int,
    ) -> None:
        """Asynchronously apply optimizer ``opt_id`` to rows ``rows`` of variable ``var_id``
        with ``values`` (one row each; duplicate rows are summed on the ps).

        Example: ``client.apply_sparse(0, 0, 5, np.array([1, 1]), g_2x4, 0.1, version)``.
        """
        idx = _rows(rows)
        vals = _host(values, f"the sparse gradient for variable {var_id}")
        if vals.dtype not in _OPT_DTYPES:
            raise PSTypeError(
                f"the sparse gradient for variable {var_id} has dtype {vals.dtype}; the "
                "parameter server optimizes float32 and float64 values only"
            )
        if vals.ndim == 0 or vals.shape[0] != idx.size:
            raise PSError(
                f"apply_sparse: {idx.size} row indices but values of shape {vals.shape}; expected "
                "one row of values per index"
            )
        h = P.encode_header(P.OP_APPLY_SPARSE, int(var_id), count=idx.size, value=vals,
                        a=int(opt_id), b=P.float_word(lr), c=int(version))  # fmt: skip
        self._call(ps, lambda dest: self._send(dest, h, idx.view(np.uint8), P.as_bytes(vals)))

    # -- control requests (checkpoints) -------------------------------------------------------
    def request_json(self, requests: dict[int, tuple[int, Any]]) -> dict[int, Any]:
        """Send ps task ``ps`` the request ``(op, body)`` for each entry (``body``: JSON-able, or
        ``None`` for no payload), all before waiting, then collect the replies: ``{ps: the
        reply's JSON data (None if it has none) or the exception}`` (:class:`PSError`, or a
        :class:`~hpcdist.errors.CheckpointError` the ps raised). The ps tasks work in parallel.

        Example: ``client.request_json({0: (P.OP_SYNC, None), 1: (P.OP_SYNC, None)})``.
        """
        out: dict[int, Any] = {}
        with self._lock:
            dests = {ps: self._rank(ps) for ps in requests}
            sent = []
            for ps, (op, body) in requests.items():
                h = P.encode_header(op)
                try:
                    if body is None:
                        self._send(dests[ps], h)
                    else:
                        self._send(dests[ps], h, P.to_json_bytes(body))
                    sent.append(ps)
                except self._MPI.Exception as e:
                    out[ps] = self._mpi_error(ps, e)
            for ps in sent:
                try:
                    r = self._recv_reply(dests[ps])
                    n = int(r[P.NBYTES])
                    text = np.empty(n, np.uint8)
                    if n:
                        self._recv(dests[ps], text)
                    out[ps] = P.from_json_bytes(text) if n else None
                except self._MPI.Exception as e:
                    out[ps] = self._mpi_error(ps, e)
                except Exception as e:  # the ps's error reply, typed
                    out[ps] = e
        return out

    def sync(self) -> None:
        """Return when every ps has handled every request this client sent before (one small
        round trip per ps, in parallel); raises the first error a ps reports, e.g. of an
        earlier asynchronous update.

        Example: ``client.update(0, 5, "add", g); client.sync()  # the add is applied``.
        """
        replies = self.request_json({ps: (P.OP_SYNC, None) for ps in range(self.num_ps)})
        for ps in sorted(replies):
            if isinstance(replies[ps], Exception):
                raise replies[ps]

    # -- stats and shutdown ---------------------------------------------------------------------
    def stats(self, ps: int) -> dict:
        """The counters of ps task ``ps`` (``updates``, ``applies``, ``staleness_count``,
        ``staleness_sum``, ``staleness_max``, ``staleness_hist``, ...).

        Example: ``client.stats(0)["staleness_max"]``.
        """
        h = P.encode_header(P.OP_STATS)

        def go(dest: int) -> dict:
            self._send(dest, h)
            r = self._recv_reply(dest)
            text = np.empty(int(r[P.NBYTES]), np.uint8)
            self._recv(dest, text)
            return P.from_json_bytes(text)

        return self._call(ps, go)

    def close(self) -> None:
        """Tell every ps this client is done (DONE); idempotent. Raises :class:`PSError`
        afterwards if a ps reported an error of an earlier asynchronous request or failed.

        Example: ``client.close(); client.close()  # the second call does nothing``.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
            problems = []
            for ps, dest in enumerate(self._ps_ranks):
                h = P.encode_header(P.OP_DONE)
                try:
                    self._send(dest, h)
                    self._recv_reply(dest)
                except PSError as e:
                    problems.append(f"ps task {ps}: {e}")
                except self._MPI.Exception as e:
                    problems.append(str(self._mpi_error(ps, e)))
            if problems:
                raise PSError("closing the parameter-server client: " + "; ".join(problems))


__all__ = ["PSClient", "PSError"]
