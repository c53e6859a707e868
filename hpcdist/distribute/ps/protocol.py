"""The parameter-server protocol, on the typed messages of :mod:`hpcdist.runtime.messages`.

Every request is one message header (:data:`HEADER_WORDS` int64 words: magic, version,
``TYPE`` = the operation, ``LENGTH`` = the payload bytes that follow, then the ps words
below) sent with :data:`TAG_HEADER`, followed by zero or more payload messages from the same
rank with :data:`TAG_PAYLOAD` (the server receives them with ``source=`` that rank, so a
header and its payloads stay paired). Synchronous requests get a reply header (same size,
type :data:`OP_REPLY`, :data:`TAG_REPLY`), an error message if the status is not zero, then
the reply data. Arrays travel as raw bytes, received straight into their destination;
control data (names, shapes, optimizer configs, stats) as typed message values
(:func:`~hpcdist.runtime.messages.encode_value`). Nothing is pickled.

A failed request's reply has STATUS :data:`STATUS_ERROR` (the client raises
:class:`PSError`), :data:`STATUS_CHECKPOINT_CORRUPT` or :data:`STATUS_CHECKPOINT`
(``CheckpointCorruptError`` / ``CheckpointError`` from :mod:`hpcdist.errors`).
Checkpoint operations (SYNC, LIST, SAVE, RESTORE) carry control values both ways.

Request ps words: ``ID, COUNT, NBYTES, DTYPE, NDIM, SHAPE[0..5], A, B, C, D``.
Reply ps words: ``VERSION, COUNT, NBYTES, DTYPE, NDIM, SHAPE[0..5], MSGLEN, .., STATUS``.

Example:
    >>> import numpy as np
    >>> value = np.zeros((2, 5), np.float32)
    >>> h = encode_header(OP_UPDATE, var_id=3, value=value, a=UPDATE_OPS["add"])
    >>> d = decode_header(h)
    >>> d["op"], d["id"], d["nbytes"], d["dtype"], d["shape"], d["a"]
    ('UPDATE', 3, 40, dtype('float32'), (2, 5), 1)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from hpcdist.errors import (  # noqa: F401 (re-exported: users met them here)
    CheckpointCorruptError,
    CheckpointError,
    MessageEncodeError,
    MessageError,
    PSError,
    PSTypeError,
)
from hpcdist.runtime import messages as M

# -- tags (on the ps communicator, a Dup used for nothing else) ------------------------------
TAG_HEADER = 71
TAG_PAYLOAD = 72
TAG_REPLY = 73

# -- header layout (a runtime.messages header; the ps words are its protocol words) -------------
HEADER_WORDS = M.HEADER_WORDS
MAX_NDIM = 6
OP, LENGTH = M.TYPE, M.LENGTH
ID, COUNT, NBYTES, DTYPE, NDIM = (M.ARGS + i for i in range(5))
SHAPE = M.ARGS + 5
A, B, C, D = (M.ARGS + 11 + i for i in range(4))
VERSION, MSGLEN, STATUS = ID, A, M.ARGS + 15  # reply words (COUNT..SHAPE as in a request)

# -- operations ----------------------------------------------------------------------------------
OP_CREATE = 1
OP_DECLARE = 2
OP_PULL = 3
OP_UPDATE = 4
OP_ADD_FETCH = 5
OP_REGISTER = 6
OP_APPLY = 7
OP_GATHER = 8
OP_APPLY_SPARSE = 9
OP_STATS = 10
OP_DONE = 11
OP_SYNC = 12
OP_LIST = 13
OP_SAVE = 14
OP_RESTORE = 15
OP_REPLY = 16

OP_NAMES = {
    OP_CREATE: "CREATE",
    OP_DECLARE: "DECLARE",
    OP_PULL: "PULL",
    OP_UPDATE: "UPDATE",
    OP_ADD_FETCH: "ADD_FETCH",
    OP_REGISTER: "REGISTER",
    OP_APPLY: "APPLY",
    OP_GATHER: "GATHER",
    OP_APPLY_SPARSE: "APPLY_SPARSE",
    OP_STATS: "STATS",
    OP_DONE: "DONE",
    OP_SYNC: "SYNC",
    OP_LIST: "LIST",
    OP_SAVE: "SAVE",
    OP_RESTORE: "RESTORE",
}
#: The request types a server accepts.
REQUEST_OPS = frozenset(OP_NAMES)


#: Requests without a reply; an error in one is reported by the client's next synchronous request.
ASYNC_OPS = frozenset({OP_UPDATE, OP_APPLY, OP_APPLY_SPARSE})

UPDATE_OPS = {"assign": 0, "add": 1, "sub": 2}

#: Reply STATUS words: 0 is success; the others say which exception the client raises.
STATUS_OK, STATUS_ERROR, STATUS_CHECKPOINT_CORRUPT, STATUS_CHECKPOINT = 0, 1, 2, 3

#: Optimizers the ps can run (``hpcdist.optimizers`` class names).
OPTIMIZER_CLASSES = ("SGD", "Adam", "AdamW", "RMSprop")

# -- dtypes ----------------------------------------------------------------------------------------
_DTYPES: dict[int, np.dtype] = {
    1: np.dtype(np.float16),
    2: np.dtype(np.float32),
    3: np.dtype(np.float64),
    4: np.dtype(np.int32),
    5: np.dtype(np.int64),
    6: np.dtype(np.bool_),
}
_CODES = {dt: code for code, dt in _DTYPES.items()}
SUPPORTED_DTYPES = tuple(_DTYPES.values())


def dtype_code(dtype: Any) -> int:
    """The wire code of ``dtype``; :class:`PSTypeError` for a dtype the ps does not support.

    Example:
        >>> dtype_code(np.float32), dtype_code("bool")
        (2, 6)
    """
    dt = np.dtype(dtype)
    code = _CODES.get(dt)
    if code is None:
        names = ", ".join(str(d) for d in SUPPORTED_DTYPES)
        raise PSTypeError(
            f"the parameter server cannot hold dtype {dt}; supported dtypes are {names}. "
            "Cast the value first (e.g. value.astype(np.float32))"
        )
    return code


def dtype_of(code: int) -> np.dtype:
    """The dtype of wire code ``code`` (:class:`PSError` for an unknown code).

    Example:
        >>> dtype_of(3)
        dtype('float64')
    """
    dt = _DTYPES.get(int(code))
    if dt is None:
        raise PSError(f"unknown dtype code {code} on the wire; expected one of {sorted(_DTYPES)}")
    return dt


def float_word(x: float) -> int:
    """The bits of float64 ``x`` as an int64 header word (a learning rate travels like this).

    Example:
        >>> word_float(float_word(0.125))
        0.125
    """
    return int(np.array(float(x), np.float64).view(np.int64))


def word_float(w: int) -> float:
    """Inverse of :func:`float_word`.

    Example:
        >>> word_float(float_word(-1.5e-3))
        -0.0015
    """
    return float(np.array(int(w), np.int64).view(np.float64))


def put_shape(h: np.ndarray, shape: Sequence[int]) -> None:
    """Write ``shape`` into the NDIM/SHAPE words of ``h`` (``NDIM = -1`` beyond 6 dimensions).

    Example:
        >>> h = np.zeros(HEADER_WORDS, np.int64); put_shape(h, (3, 4)); get_shape(h)
        (3, 4)
    """
    if len(shape) > MAX_NDIM:
        h[NDIM] = -1
        return
    h[NDIM] = len(shape)
    h[SHAPE : SHAPE + len(shape)] = shape


def get_shape(h: np.ndarray) -> tuple[int, ...] | None:
    """The shape in ``h``'s NDIM/SHAPE words, ``None`` when it was not sent (NDIM = -1).

    Example:
        >>> get_shape(encode_header(OP_PULL, value=np.zeros(7)))
        (7,)
    """
    n = int(h[NDIM])
    if n < 0:
        return None
    return tuple(int(x) for x in h[SHAPE : SHAPE + n])


def encode_header(
    op: int,
    var_id: int = 0,
    count: int = 0,
    value: np.ndarray | None = None,
    a: int = 0,
    b: int = 0,
    c: int = 0,
    d: int = 0,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """A request header; ``value`` (if given) fills NBYTES, DTYPE and the shape words.

    ``out`` (an int64 array of :data:`HEADER_WORDS`) is reused when given.

    Example:
        >>> h = encode_header(OP_STATS)
        >>> int(h[OP]), int(h[ID]), M.check_header(h).type
        (10, 0, 10)
    """
    h = M.new_header(op, out=out)
    h[ID], h[COUNT] = var_id, count
    if value is not None:
        h[NBYTES] = value.nbytes
        h[DTYPE] = dtype_code(value.dtype)
        put_shape(h, value.shape)
    h[A], h[B], h[C], h[D] = a, b, c, d
    return h


def decode_header(h: np.ndarray) -> dict[str, Any]:
    """A readable dict of a request header (for messages and tests).

    Example:
        >>> decode_header(encode_header(OP_DONE))["op"]
        'DONE'
    """
    code = int(h[DTYPE])
    return {
        "op": OP_NAMES.get(int(h[OP]), f"unknown op {int(h[OP])}"),
        "id": int(h[ID]),
        "count": int(h[COUNT]),
        "nbytes": int(h[NBYTES]),
        "dtype": _DTYPES.get(code) if code else None,
        "shape": get_shape(h),
        "a": int(h[A]),
        "b": int(h[B]),
        "c": int(h[C]),
        "d": int(h[D]),
    }


def check_request(h: np.ndarray) -> M.Header:
    """Validate a received request header (magic, version, a known operation, size limit).

    Raises a :class:`~hpcdist.errors.MessageError` subclass for a malformed header.

    Example:
        >>> check_request(encode_header(OP_STATS)).type == OP_STATS
        True
    """
    return M.check_header(h, types=REQUEST_OPS, what="a parameter-server request")


def check_reply(h: np.ndarray) -> M.Header:
    """Validate a received reply header; a malformed one raises :class:`PSError`.

    Example:
        >>> check_reply(M.new_header(OP_REPLY)).length
        0
    """
    try:
        return M.check_header(h, types=(OP_REPLY,), what="a parameter-server reply")
    except MessageError as e:
        raise PSError(f"{e}") from e


def num_payloads(h: np.ndarray) -> int:
    """How many payload messages follow request header ``h``.

    Example:
        >>> num_payloads(encode_header(OP_APPLY, count=3))  # the id table, then 3 gradients
        4
    """
    op = int(h[OP])
    if op == OP_CREATE:
        return 2  # JSON description, value
    if op == OP_PULL:
        return 0 if int(h[COUNT]) == 1 else 1  # one id travels in the header
    if op == OP_APPLY:
        return 1 + int(h[COUNT])
    if op == OP_APPLY_SPARSE:
        return 2  # rows, values
    if op in (OP_STATS, OP_DONE, OP_SYNC, OP_LIST):
        return 0
    return 1


def error_status(error: BaseException) -> int:
    """The reply STATUS word that carries ``error``'s type to the client.

    Example:
        >>> from hpcdist.errors import CheckpointCorruptError
        >>> error_status(CheckpointCorruptError("bad")), error_status(KeyError("x"))
        (2, 1)
    """
    if isinstance(error, CheckpointCorruptError):
        return STATUS_CHECKPOINT_CORRUPT
    if isinstance(error, CheckpointError):
        return STATUS_CHECKPOINT
    return STATUS_ERROR


def error_of_status(status: int, message: str) -> Exception:
    """The exception a client raises for an error reply (inverse of :func:`error_status`).

    Example:
        >>> type(error_of_status(2, "bad")).__name__, type(error_of_status(1, "x")).__name__
        ('CheckpointCorruptError', 'PSError')
    """
    if status == STATUS_CHECKPOINT_CORRUPT:
        return CheckpointCorruptError(message)
    if status == STATUS_CHECKPOINT:
        return CheckpointError(message)
    return PSError(message)


def to_json_bytes(obj: Any) -> np.ndarray:
    """``obj`` (control data) as a typed message value in a uint8 array, ready to send.

    The name is historical: the encoding is :func:`hpcdist.runtime.messages.encode_value`.

    Example:
        >>> from_json_bytes(to_json_bytes({"a": [1, 2]}))
        {'a': [1, 2]}
    """
    try:
        return M.encode_value(obj, what="the control data")
    except MessageEncodeError as e:
        raise PSTypeError(
            f"control data for the parameter server cannot travel: {e}. Pass plain numbers, "
            "strings, lists and dicts (e.g. optimizer.get_config())"
        ) from None


def from_json_bytes(data: Any) -> Any:
    """Inverse of :func:`to_json_bytes` (accepts bytes or a uint8 array).

    A malformed value raises :class:`PSError` (its cause is the typed message error).

    Example:
        >>> from_json_bytes(to_json_bytes([1, "x"]))
        [1, 'x']
    """
    try:
        return M.decode_value(data)
    except MessageError as e:
        raise PSError(f"malformed parameter-server control data: {e}") from e


def as_bytes(x: np.ndarray) -> np.ndarray:
    """A flat uint8 view of the C-contiguous array ``x`` (no copy).

    Example:
        >>> as_bytes(np.ones(2, np.int32)).shape
        (8,)
    """
    return x.reshape(-1).view(np.uint8)


# The payload readers live in their own module; re-exported here for older imports.
from hpcdist.distribute.ps.payloads import Live, Stored  # noqa: E402

__all__ = [
    "ASYNC_OPS",
    "HEADER_WORDS",
    "MAX_NDIM",
    "OPTIMIZER_CLASSES",
    "SUPPORTED_DTYPES",
    "TAG_HEADER",
    "TAG_PAYLOAD",
    "TAG_REPLY",
    "UPDATE_OPS",
    "Live",
    "Stored",
    "PSError",
    "PSTypeError",
    "as_bytes",
    "decode_header",
    "error_of_status",
    "error_status",
    "dtype_code",
    "dtype_of",
    "check_reply",
    "check_request",
    "encode_header",
    "float_word",
    "from_json_bytes",
    "get_shape",
    "num_payloads",
    "put_shape",
    "to_json_bytes",
    "word_float",
]
