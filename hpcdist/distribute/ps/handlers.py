"""The request handlers of a parameter server, one method per operation.

:class:`Handlers` is a mixin of :class:`~hpcdist.distribute.ps.server.Server`:
the server's loop receives a request header and its payload reader and calls
the handler of its operation, which reads the payloads, changes the state
(``vars``, ``host``) and replies. A handler raises :class:`OpError` (or a
:class:`~hpcdist.errors.CheckpointError`) for a request it cannot do; the loop
sends the message back to the client and goes on.

Checkpoint requests (SAVE, RESTORE, LIST, SYNC) are handled here too, with the
file work in :mod:`~hpcdist.distribute.ps.shard_file`.

Example: ``Server(comm, clients)._handlers[P.OP_PULL](src, header, payloads)``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from hpcdist.distribute.ps import protocol as P
from hpcdist.distribute.ps import shard_file
from hpcdist.errors import PSRequestError

#: A request that cannot be done; the message goes back to the client.
OpError = PSRequestError


class Var:
    """A variable held by a parameter server: its value (updated in place), name, creating
    client rank and version (the number of updates so far).

    Example:
        >>> Var(np.zeros(2), "w", creator=1).describe()
        "name 'w', shape (2,), dtype float64"
    """

    __slots__ = ("creator", "name", "value", "version")

    def __init__(self, value: np.ndarray, name: str, creator: int) -> None:
        self.value = value
        self.name = name
        self.creator = creator
        self.version = 0

    def describe(self) -> str:
        return f"name {self.name!r}, shape {self.value.shape}, dtype {self.value.dtype}"


class Handlers:
    """The handlers of every request; mixed into :class:`~hpcdist.distribute.ps.server.Server`,
    which provides the state and the reply/send helpers used here.

    Example: ``class Server(Handlers): ...``.
    """

    vars: dict[int, Var]
    host: Any
    counts: dict[str, int]
    staleness: Any
    _staged: dict[int, Any]

    if TYPE_CHECKING:  # provided by Server

        def send(self, buf: np.ndarray, dest: int, tag: int = P.TAG_REPLY) -> None: ...
        def scratch(self, nbytes: int) -> np.ndarray: ...
        def _reply_ok(
            self,
            src: int,
            version: int = 0,
            value: np.ndarray | None = None,
            count: int = 0,
            nbytes: int = 0,
        ) -> None: ...
        def _reply_json(self, src: int, obj: Any) -> None: ...
        def stats(self) -> dict[str, Any]: ...
        def _finish(self, src: int) -> None: ...
        def _maybe_force(self) -> None: ...

    def _handler_table(self) -> dict[int, Any]:
        """Operation code -> handler method."""
        return {
            P.OP_CREATE: self._create,
            P.OP_DECLARE: self._declare,
            P.OP_PULL: self._pull,
            P.OP_UPDATE: self._update,
            P.OP_ADD_FETCH: self._add_fetch,
            P.OP_REGISTER: self._register,
            P.OP_APPLY: self._apply,
            P.OP_GATHER: self._gather,
            P.OP_APPLY_SPARSE: self._apply_sparse,
            P.OP_STATS: self._stats,
            P.OP_DONE: self._done,
            P.OP_SYNC: self._sync,
            P.OP_LIST: self._list,
            P.OP_SAVE: self._save,
            P.OP_RESTORE: self._restore,
        }

    def _var(self, var_id: int) -> Var:
        var = self.vars.get(var_id)
        if var is None:
            raise OpError(f"no variable with id {var_id} exists on this parameter server")
        return var

    def _create(self, src: int, h: np.ndarray, pay: Any) -> None:
        vid = int(h[P.ID])
        meta = P.from_json_bytes(pay.next_bytes())
        old = self.vars.get(vid)
        if old is not None:
            raise OpError(
                f"variable id {vid} already exists ({old.describe()}, created by rank "
                f"{old.creator}); only one client (the chief, or worker 0) creates each "
                "variable, the others declare it"
            )
        dtype = P.dtype_of(int(h[P.DTYPE]))
        value = np.empty(tuple(int(x) for x in meta["shape"]), dtype)
        if value.nbytes != int(h[P.NBYTES]):
            raise OpError("the value size does not match its shape")
        pay.into(P.as_bytes(value))
        self.vars[vid] = Var(value, str(meta["name"]), src)
        self.host.forget(vid)
        self._reply_ok(src)

    def _declare(self, src: int, h: np.ndarray, pay: Any) -> None:
        var = self._var(int(h[P.ID]))
        meta = P.from_json_bytes(pay.next_bytes())
        mine = (str(meta["name"]), tuple(int(x) for x in meta["shape"]), P.dtype_of(h[P.DTYPE]))
        theirs = (var.name, var.value.shape, var.value.dtype)
        if mine != theirs:
            raise OpError(
                f"variable id {int(h[P.ID])} mismatch: client rank {src} declares name "
                f"{mine[0]!r}, shape {mine[1]}, dtype {mine[2]}, but the initializer (rank "
                f"{var.creator}) created {var.describe()}. Every client must create the same "
                "variables in the same order"
            )
        self._reply_ok(src, var.version)

    def _pull(self, src: int, h: np.ndarray, pay: Any) -> None:
        n = int(h[P.COUNT])
        if n == 1:
            table = [(int(h[P.ID]), int(h[P.DTYPE]), int(h[P.NBYTES]))]
        else:
            table = pay.next_bytes().view(np.int64).reshape(3, n).T.tolist()
        chosen = []
        for vid, code, nbytes in table:
            var = self._var(int(vid))
            want = P.dtype_of(int(code))
            if not (want == var.value.dtype and int(nbytes) == var.value.nbytes):
                raise OpError(
                    f"pull of variable {int(vid)} ({var.describe()}) into a {want} buffer of "
                    f"{int(nbytes)} bytes; pass an output of the variable's shape and dtype"
                )
            chosen.append(var)
        if n == 1:
            shape = P.get_shape(h)
            if shape is not None and shape != chosen[0].value.shape:
                raise OpError(
                    f"pull of variable {int(h[P.ID])} ({chosen[0].describe()}) into an output of "
                    f"shape {shape}"
                )
        self._reply_ok(src, chosen[0].version, count=n)
        if n != 1:
            self.send(np.array([v.version for v in chosen], np.int64).view(np.uint8), src)
        for var in chosen:
            self.send(P.as_bytes(var.value), src)
        self.counts["pulls"] += n

    def _incoming(self, h: np.ndarray, pay: Any, var: Var, direct: bool) -> np.ndarray:
        """The value of an update/apply payload, shaped like ``var`` (received in place if
        ``direct`` and the dtype matches)."""
        dtype = P.dtype_of(int(h[P.DTYPE]))
        nbytes = int(h[P.NBYTES])
        shape = P.get_shape(h)
        size = var.value.size
        if not (nbytes == size * dtype.itemsize and (shape is None or shape == var.value.shape)):
            raise OpError(
                f"a value of shape {shape} and dtype {dtype} ({nbytes} bytes) for "
                f"{var.describe()}; the shapes must match"
            )
        if direct and dtype == var.value.dtype:
            pay.into(P.as_bytes(var.value))
            return var.value
        val = self.scratch(nbytes).view(dtype).reshape(var.value.shape)
        pay.into(P.as_bytes(val))
        return val

    def _update(self, src: int, h: np.ndarray, pay: Any) -> None:
        var = self._var(int(h[P.ID]))
        mode = int(h[P.A])
        if mode not in P.UPDATE_OPS.values():
            raise OpError(f"unknown update mode {mode}")
        val = self._incoming(h, pay, var, direct=mode == P.UPDATE_OPS["assign"])
        if mode == P.UPDATE_OPS["assign"]:
            if val is not var.value:
                np.copyto(var.value, val, casting="same_kind")
        elif mode == P.UPDATE_OPS["add"]:
            np.add(var.value, val, out=var.value, casting="same_kind")
        else:
            np.subtract(var.value, val, out=var.value, casting="same_kind")
        var.version += 1
        self.counts["updates"] += 1

    def _add_fetch(self, src: int, h: np.ndarray, pay: Any) -> None:
        var = self._var(int(h[P.ID]))
        val = self._incoming(h, pay, var, direct=False)
        np.add(var.value, val, out=var.value, casting="same_kind")
        var.version += 1
        self.counts["updates"] += 1
        self._reply_ok(src, var.version, value=var.value)
        self.send(P.as_bytes(var.value), src)

    def _register(self, src: int, h: np.ndarray, pay: Any) -> None:
        meta = P.from_json_bytes(pay.next_bytes())
        self.host.register(int(h[P.ID]), str(meta["class_name"]), meta["config"])
        self._reply_ok(src)

    def _apply(self, src: int, h: np.ndarray, pay: Any) -> None:
        opt_id, n, lr = int(h[P.ID]), int(h[P.COUNT]), P.word_float(int(h[P.A]))
        ids, versions, codes, sizes = pay.next_bytes().view(np.int64).reshape(4, n)
        problems = []
        try:
            self.host.optimizer(opt_id)
        except P.PSError as e:
            raise OpError(str(e)) from None
        for vid, version, code, nbytes in zip(ids, versions, codes, sizes, strict=True):
            var = self.vars[int(vid)]
            buf = self.scratch(int(nbytes))
            pay.into(buf)  # always consumed, so that the next gradient lines up
            try:
                dtype = P.dtype_of(int(code))
                if int(nbytes) != var.value.size * dtype.itemsize:
                    raise OpError(
                        f"a gradient of {int(nbytes)} bytes ({dtype}) for {var.describe()}"
                    )
                self.staleness.record(var.version - int(version))
                self.host.apply_dense(opt_id, int(vid), var.value, buf.view(dtype), lr, var.name)
            except (OpError, P.PSError, TypeError, ValueError) as e:
                problems.append(f"variable {int(vid)}: {e}")
                continue
            var.version += 1
            self.counts["updates"] += 1
            self.counts["applies"] += 1
        if problems:
            raise OpError("; ".join(problems))

    def _gather(self, src: int, h: np.ndarray, pay: Any) -> None:
        var = self._var(int(h[P.ID]))
        rows = pay.next_bytes().view(np.int64)
        table = var.value
        if table.ndim == 0:
            raise OpError(f"gather needs a variable with rows; {var.describe()}")
        dtype = P.dtype_of(int(h[P.DTYPE]))
        out_shape = (rows.size, *table.shape[1:])
        nbytes = int(np.prod(out_shape, dtype=np.int64)) * table.dtype.itemsize
        if not (dtype == table.dtype and int(h[P.NBYTES]) == nbytes):
            raise OpError(
                f"gather of {rows.size} rows of {var.describe()} into a {dtype} buffer of "
                f"{int(h[P.NBYTES])} bytes; expected {table.dtype}, shape {out_shape}"
            )
        if rows.size:
            lo, hi = int(rows.min()), int(rows.max())
            if not (lo >= 0 and hi < table.shape[0]):
                raise OpError(
                    f"gather rows must lie in [0, {table.shape[0]}) for {var.describe()}; got rows "
                    f"from {lo} to {hi}"
                )
        out = self.scratch(nbytes).view(table.dtype).reshape(out_shape)
        np.take(table, rows, axis=0, out=out)
        self._reply_ok(src, var.version)
        self.send(P.as_bytes(out), src)

    def _apply_sparse(self, src: int, h: np.ndarray, pay: Any) -> None:
        var = self._var(int(h[P.ID]))
        rows = pay.next_bytes().view(np.int64)
        dtype = P.dtype_of(int(h[P.DTYPE]))
        nbytes = int(h[P.NBYTES])
        if nbytes % dtype.itemsize:
            raise OpError(f"{nbytes} bytes of {dtype} values")
        values = self.scratch(nbytes).view(dtype)
        pay.into(values.view(np.uint8))
        self.staleness.record(var.version - int(h[P.C]))
        lr = P.word_float(int(h[P.B]))
        self.host.apply_sparse(int(h[P.A]), int(h[P.ID]), var.value, rows, values, lr, var.name)
        var.version += 1
        self.counts["updates"] += 1
        self.counts["applies"] += 1

    def _stats(self, src: int, h: np.ndarray, pay: Any) -> None:
        self._reply_json(src, self.stats())

    def _done(self, src: int, h: np.ndarray, pay: Any) -> None:
        self._finish(src)
        self._reply_ok(src)
        self._maybe_force()

    # -- checkpoints --------------------------------------------------------------------------
    def _sync(self, src: int, h: np.ndarray, pay: Any) -> None:
        """Reply at once: every earlier request of ``src`` has been handled."""
        self._reply_ok(src)

    def _list(self, src: int, h: np.ndarray, pay: Any) -> None:
        """The variables held (id, name, shape, dtype, version) and the optimizers registered."""
        self._reply_json(src, shard_file.listing(self.vars, self.host))

    def _save(self, src: int, h: np.ndarray, pay: Any) -> None:
        """Write the shard file the request names (atomically); reply with its digest."""
        req = P.from_json_bytes(pay.next_bytes())
        info = shard_file.write_shard(
            str(req["path"]), int(req["ps"]), self.vars, self.host, [int(i) for i in req["ids"]]
        )
        self._reply_json(src, info)

    def _restore(self, src: int, h: np.ndarray, pay: Any) -> None:
        """Phase ``stage`` (verify and load the files), ``commit`` (apply what ``src`` staged)
        or ``abort`` (drop it)."""
        req = P.from_json_bytes(pay.next_bytes())
        phase = req.get("phase")
        if phase == "stage":
            self._staged.pop(src, None)
            self._staged[src] = shard_file.stage_restore(
                req["files"], req["items"], self.vars, self.host
            )
            self._reply_json(src, {"staged": len(self._staged[src])})
        elif phase == "commit":
            staged = self._staged.pop(src, None)
            if staged is None:
                raise OpError("restore commit without a staged restore from this client")
            self._reply_json(
                src, {"restored": shard_file.commit_restore(staged, self.vars, self.host)}
            )
        elif phase == "abort":
            self._staged.pop(src, None)
            self._reply_ok(src)
        else:
            raise OpError(f"restore phase must be stage, commit or abort; got {phase!r}")


__all__ = ["Handlers", "OpError", "Var"]
