"""Typed point-to-point messages over MPI: fixed int64 headers and a pickle-free value encoding.

The parameter-server transport and the ClusterCoordinator both talk through this module.

**Header.** Every message starts with one header of :data:`HEADER_WORDS` int64 words:
``MAGIC, VERSION, TYPE, FLAGS, LENGTH, REQUEST, 0, 0`` then :data:`ARG_WORDS` words the
protocol using the message defines (ids, shapes, status codes). ``LENGTH`` is how many
payload bytes follow the header, in one or more payload messages from the same rank.
:func:`check_header` validates a received header (magic, version, known type, flags,
reserved words, length within the limit) before any payload buffer is allocated.

**Values.** :func:`encode_value` turns a nest of ``None``, ``bool``, ``int``, ``float``,
``complex``, ``str``, ``bytes``, NumPy arrays and scalars (dtype and shape kept; no
``object`` or structured dtypes), ``list``, ``tuple`` and ``dict`` into one ``uint8``
buffer: a one-byte tag per value, little-endian fixed-size numbers, length-prefixed
strings, array data aligned to 8 bytes. An extension node (a name and one value) lets a
protocol carry its own types (the coordinator's ``PerReplica``). :func:`decode_value`
reads it back and raises only :class:`~hpcdist.errors.MessageError` (a ``ValueError``)
for bytes that are not such a value; it never allocates more than the buffer holds.

Large arrays do not go through :func:`encode_value`: a protocol sends them as raw payload
messages straight from (and into) the array's own memory, so they are never copied.

Example:
    >>> import numpy as np
    >>> buf = encode_value({"name": "w", "shape": [2, 3], "x": np.arange(3, dtype=np.int32)})
    >>> out = decode_value(buf)
    >>> out["name"], out["shape"], out["x"].dtype, out["x"].tolist()
    ('w', [2, 3], dtype('int32'), [0, 1, 2])
    >>> h = new_header(5, length=buf.nbytes, args=(7,))
    >>> check_header(h, types={5}).type, int(h[ARGS])
    (5, 7)
"""

from __future__ import annotations

import math
import os
import struct
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from hpcdist.errors import (
    MessageEncodeError,
    MessageError,
    MessageHeaderError,
    MessageSizeError,
    MessageTruncatedError,
    MessageVersionError,
    UnknownMessageTypeError,
)
from hpcdist.runtime.mpi import mpi

# -- header ---------------------------------------------------------------------------------
MAGIC = 0x4850_4443_4D53_4731  # b"HPDCMSG1" read as a big-endian int64
VERSION = 1
MAGIC_WORD, VERSION_WORD, TYPE, FLAGS, LENGTH, REQUEST = 0, 1, 2, 3, 4, 5
ARGS = 8  # first protocol word; words 6 and 7 are reserved (zero)
ARG_WORDS = 16
HEADER_WORDS = ARGS + ARG_WORDS
HEADER_BYTES = HEADER_WORDS * 8

#: Default largest payload (bytes) one message may announce; ``HPCDIST_MAX_MESSAGE_BYTES`` sets it.
DEFAULT_LIMIT = 1 << 34


def max_message_bytes() -> int:
    """The payload size limit: ``HPCDIST_MAX_MESSAGE_BYTES`` if set, else :data:`DEFAULT_LIMIT`.

    Example:
        >>> max_message_bytes() > 0
        True
    """
    text = os.environ.get("HPCDIST_MAX_MESSAGE_BYTES", "")
    try:
        value = int(text) if text else DEFAULT_LIMIT
    except ValueError:
        raise MessageSizeError(
            f"HPCDIST_MAX_MESSAGE_BYTES is {text!r}; expected a positive integer (bytes)"
        ) from None
    if value <= 0:
        raise MessageSizeError(f"HPCDIST_MAX_MESSAGE_BYTES is {value}; expected a positive integer")
    return value


class Header(NamedTuple):
    """The decoded fixed words of a header (``args`` are the protocol's words).

    Example:
        >>> Header(type=3, flags=0, length=8, request=1, args=(0,) * ARG_WORDS).length
        8
    """

    type: int
    flags: int
    length: int
    request: int
    args: tuple[int, ...]


def new_header(
    msg_type: int,
    *,
    length: int = 0,
    request: int = 0,
    flags: int = 0,
    args: Sequence[int] = (),
    out: np.ndarray | None = None,
) -> np.ndarray:
    """An int64 header array (``out`` is reused when given) for a message of ``msg_type``.

    Example:
        >>> h = new_header(2, length=16, args=(4, 5))
        >>> int(h[TYPE]), int(h[LENGTH]), h[ARGS : ARGS + 3].tolist()
        (2, 16, [4, 5, 0])
    """
    if len(args) > ARG_WORDS:
        raise MessageEncodeError(f"a header holds {ARG_WORDS} protocol words; got {len(args)}")
    h = np.zeros(HEADER_WORDS, np.int64) if out is None else out
    if out is not None:
        h[:] = 0
    h[MAGIC_WORD], h[VERSION_WORD] = MAGIC, VERSION
    h[TYPE], h[FLAGS], h[LENGTH], h[REQUEST] = msg_type, flags, length, request
    h[ARGS : ARGS + len(args)] = args
    return h


def check_header(
    h: Any,
    *,
    types: Collection[int] | None = None,
    flags: int = 0,
    limit: int | None = None,
    what: str = "a message",
) -> Header:
    """Validate a received header and return its fields.

    Raises :class:`~hpcdist.errors.MessageHeaderError` (wrong size, bad magic, reserved words
    or unknown flag bits set, negative length), :class:`~hpcdist.errors.MessageVersionError`,
    :class:`~hpcdist.errors.UnknownMessageTypeError` (``TYPE`` not in ``types``) or
    :class:`~hpcdist.errors.MessageSizeError` (``LENGTH`` over ``limit``, default
    :func:`max_message_bytes`). ``flags`` are the flag bits the protocol knows.

    Example:
        >>> check_header(new_header(1), types={1}).type
        1
    """
    words = h if isinstance(h, np.ndarray) else np.asarray(h)
    if words.dtype != np.int64 or words.shape != (HEADER_WORDS,):
        raise MessageHeaderError(
            f"{what} has a header of dtype {words.dtype} and shape {words.shape}; expected "
            f"{HEADER_WORDS} int64 words"
        )
    w = words.tolist()  # one conversion to Python ints
    if w[MAGIC_WORD] != MAGIC:
        raise MessageHeaderError(
            f"{what} has magic word {w[MAGIC_WORD]:#x}; expected {MAGIC:#x}. Another "
            "program or an older hpcdist sent it: start every rank from the same hpcdist"
        )
    if w[VERSION_WORD] != VERSION:
        raise MessageVersionError(
            f"{what} uses message version {w[VERSION_WORD]}; this hpcdist speaks "
            f"version {VERSION}. Start every rank from the same hpcdist installation"
        )
    if w[6] or w[7]:
        raise MessageHeaderError(f"{what} has reserved header words set; expected zeros")
    msg_type = w[TYPE]
    if types is not None and msg_type not in types:
        raise UnknownMessageTypeError(
            f"{what} has type {msg_type}; expected one of {sorted(types)}. Are both sides "
            "running the same hpcdist?"
        )
    got_flags = w[FLAGS]
    if got_flags & ~flags:
        raise MessageHeaderError(
            f"{what} has flag bits {got_flags:#x}; this protocol knows only {flags:#x}"
        )
    length = w[LENGTH]
    if length < 0:
        raise MessageHeaderError(f"{what} announces {length} payload bytes; expected >= 0")
    cap = max_message_bytes() if limit is None else limit
    if length > cap:
        raise MessageSizeError(
            f"{what} announces {length} payload bytes; the limit is {cap}. Send less per "
            "message or raise HPCDIST_MAX_MESSAGE_BYTES on every rank"
        )
    return Header(msg_type, got_flags, length, w[REQUEST], tuple(w[ARGS:]))


def check_payload(nbytes: int, left: int, what: str = "a message") -> None:
    """Check that a payload message of ``nbytes`` fits in the ``left`` bytes a header announced.

    Raises :class:`~hpcdist.errors.MessageSizeError` when it does not.

    Example:
        >>> check_payload(8, 16)
    """
    if nbytes > left:
        raise MessageSizeError(
            f"{what} carries a payload of {nbytes} bytes but its header announced only {left} "
            "more; the sender and the receiver disagree on the protocol"
        )


# -- MPI helpers (buffer mode) -----------------------------------------------------------------
def send(comm: Any, dest: int, tag: int, header: np.ndarray, *payloads: np.ndarray) -> None:
    """Send ``header`` (tag ``tag``) then each uint8 payload (tag ``tag + 1``) to ``dest``.

    Buffer-mode ``Send``: the payload arrays go out from their own memory. ``LENGTH`` is set
    to the payloads' total size.

    Example: ``send(comm, 0, 40, new_header(1), encode_value({"a": 1}))``.
    """
    header[LENGTH] = sum(int(p.nbytes) for p in payloads)
    comm.Send([header, _mpi().INT64_T], dest, tag)
    for p in payloads:
        comm.Send([p, _mpi().BYTE], dest, tag + 1)


def recv(
    comm: Any,
    source: int,
    tag: int,
    *,
    types: Collection[int] | None = None,
    limit: int | None = None,
    what: str = "a message",
) -> tuple[Header, np.ndarray]:
    """Receive a header (tag ``tag``) and its payload (tag ``tag + 1``, from the same rank).

    The header is checked (:func:`check_header`) before the payload buffer is allocated and
    the payload's probed size is checked against the header. Returns the header's fields and
    the payload bytes (uint8; empty when ``LENGTH`` is 0).

    Example: ``head, data = recv(comm, 1, 40, types={1}); decode_value(data)``.
    """
    MPI = _mpi()
    h = np.empty(HEADER_WORDS, np.int64)
    st = MPI.Status()
    comm.Recv([h, MPI.INT64_T], source, tag, st)
    head = check_header(h, types=types, limit=limit, what=what)
    if head.length == 0:
        return head, np.zeros(0, np.uint8)
    src = st.Get_source()
    comm.Probe(src, tag + 1, st)
    n = st.Get_count(MPI.BYTE)
    check_payload(n, head.length, what)
    data = np.empty(n, np.uint8)
    comm.Recv([data, MPI.BYTE], src, tag + 1)
    if n != head.length:
        raise MessageTruncatedError(
            f"{what} announced {head.length} payload bytes but carried {n}; the sender and "
            "the receiver disagree on the protocol"
        )
    return head, data


def _mpi() -> Any:
    return mpi()


# -- values ------------------------------------------------------------------------------------
VALUE_MAGIC = b"HMV\x01"
MAX_DEPTH = 64
_ALIGN = 8
_I64 = struct.Struct("<q")
_U64 = struct.Struct("<Q")
_F64 = struct.Struct("<d")
_C128 = struct.Struct("<dd")
_ARRAY_KINDS = "biufcmMSU"
_MAX_NDIM = 32  # NumPy's limit (before 2.0)

#: An extension encoder: ``(name, value)`` for an object it carries (name ``""``: encode
#: ``value`` in its place, e.g. a device array as a NumPy one), else ``None``.
Extend = Callable[[Any], "tuple[str, Any] | None"]


class _Writer:
    def __init__(self, extend: Extend | None, hint: str, limit: int) -> None:
        self.parts: list[bytes | memoryview] = []
        self.size = 0
        self.extend = extend
        self.hint = hint
        self.limit = limit
        self.path: list[int] = []

    def put(self, b: bytes | memoryview) -> None:
        self.parts.append(b)
        self.size += len(b)
        if self.size > self.limit:
            raise MessageSizeError(
                f"an encoded value has grown past the limit of {self.limit} bytes; send large "
                "arrays as raw payloads or raise HPCDIST_MAX_MESSAGE_BYTES on every rank"
            )

    def text(self, tag: bytes, s: str | bytes) -> None:
        data = s.encode("utf-8", "surrogatepass") if isinstance(s, str) else s
        self.put(tag + _U64.pack(len(data)))
        self.put(data)

    def array(self, tag: bytes, x: np.ndarray, where: str) -> None:
        dt = x.dtype
        if dt.kind not in _ARRAY_KINDS or dt.fields is not None or dt.subdtype is not None:
            raise MessageEncodeError(
                f"{where} is an array of dtype {dt}, which cannot travel without pickle; "
                "send arrays of numbers, booleans, strings or dates"
            )
        code = dt.str.encode("ascii")
        self.put(tag + bytes([len(code)]) + code + bytes([x.ndim]))
        self.put(b"".join(_U64.pack(n) for n in x.shape))
        pad = -self.size % _ALIGN
        self.put(b"\0" * pad)
        data = np.ascontiguousarray(x)
        self.put(_U64.pack(data.nbytes))
        pad = -self.size % _ALIGN
        self.put(b"\0" * pad)
        self.put(data.reshape(-1).view(np.uint8).data)

    def value(self, x: Any, where: str) -> None:
        if x is None:
            self.put(b"N")
        elif isinstance(x, np.generic):  # before float/complex/str: np.float64 is a float
            self.array(b"g", np.asarray(x), where)
        elif isinstance(x, bool):
            self.put(b"T" if x else b"F")
        elif isinstance(x, int):
            if -(1 << 63) <= x < (1 << 63):
                self.put(b"i" + _I64.pack(x))
            else:
                self.text(b"I", x.to_bytes((x.bit_length() + 8) // 8, "little", signed=True))
        elif isinstance(x, float):
            self.put(b"f" + _F64.pack(x))
        elif isinstance(x, complex):
            self.put(b"c" + _C128.pack(x.real, x.imag))
        elif isinstance(x, str):
            self.text(b"s", x)
        elif isinstance(x, (bytes, bytearray, memoryview)):
            self.text(b"y", bytes(x))
        elif isinstance(x, np.ndarray):
            self.array(b"a", x, where)
        else:
            self.nest(x, where)

    def nest(self, x: Any, where: str) -> None:
        if id(x) in self.path:
            raise MessageEncodeError(f"{where} contains itself; send a structure without cycles")
        if len(self.path) >= MAX_DEPTH:
            raise MessageEncodeError(f"{where} is nested deeper than {MAX_DEPTH} levels")
        self.path.append(id(x))
        try:
            ext = self.extend(x) if self.extend is not None else None
            if ext is not None and not ext[0]:  # a substitute, encoded in place
                self.value(ext[1], where)
            elif ext is not None:
                self.text(b"x", ext[0])
                self.value(ext[1], where)
            elif isinstance(x, (list, tuple)):
                self.put((b"l" if isinstance(x, list) else b"t") + _U64.pack(len(x)))
                for i, v in enumerate(x):
                    self.value(v, f"{where}[{i}]")
            elif isinstance(x, dict):
                self.put(b"d" + _U64.pack(len(x)))
                for k, v in x.items():
                    self.value(k, f"{where} key")
                    self.value(v, f"{where}[{k!r}]")
            else:
                cls = type(x)
                raise MessageEncodeError(
                    f"{where} is a {cls.__module__}.{cls.__qualname__}, which cannot travel "
                    f"in a message; {self.hint}"
                )
        finally:
            self.path.pop()


def encode_value(
    value: Any,
    *,
    extend: Extend | None = None,
    what: str = "the value",
    hint: str = "send NumPy arrays, numbers, strings, None, or lists/tuples/dicts of them",
    limit: int | None = None,
) -> np.ndarray:
    """``value`` as one ``uint8`` buffer (see the module docstring for what it may hold).

    ``extend`` carries other types as a named extension node; ``what`` names the value and
    ``hint`` says what to do in the :class:`~hpcdist.errors.MessageEncodeError` (a
    ``TypeError``) raised for a part that cannot travel. Raises
    :class:`~hpcdist.errors.MessageSizeError` past ``limit`` bytes.

    Example:
        >>> decode_value(encode_value([1, "a", None, 2.5, b"z"]))
        [1, 'a', None, 2.5, b'z']
    """
    w = _Writer(extend, hint, max_message_bytes() if limit is None else limit)
    w.put(VALUE_MAGIC)
    w.value(value, what)
    out = np.empty(w.size, np.uint8)
    at = 0
    for part in w.parts:
        out[at : at + len(part)] = np.frombuffer(part, np.uint8)
        at += len(part)
    return out


class _Reader:
    def __init__(
        self, data: memoryview, extensions: Mapping[str, Callable[[Any], Any]], copy: bool
    ) -> None:
        self.data = data
        self.at = 0
        self.extensions = extensions
        self.copy = copy

    def take(self, n: int, what: str) -> memoryview:
        if n < 0 or self.at + n > len(self.data):
            raise MessageTruncatedError(
                f"a message value is truncated: {what} needs {n} bytes at offset {self.at} "
                f"but the buffer has {len(self.data)}"
            )
        out = self.data[self.at : self.at + n]
        self.at += n
        return out

    def u64(self, what: str) -> int:
        return int(_U64.unpack(self.take(8, what))[0])

    def count(self, what: str) -> int:
        n = self.u64(what)
        left = len(self.data) - self.at
        if n > left:  # every item takes at least one byte
            raise MessageTruncatedError(
                f"a message value announces {n} {what} but only {left} bytes remain"
            )
        return n

    def text(self) -> str:
        raw = self.take(self.count("string bytes"), "a string")
        try:
            return str(bytes(raw), "utf-8", "surrogatepass")
        except UnicodeDecodeError as e:
            raise MessageError(f"a message string is not valid UTF-8 ({e})") from None

    def array(self) -> np.ndarray:
        n = self.take(1, "a dtype length")[0]
        code = bytes(self.take(n, "a dtype"))
        dt = _dtype(code)
        ndim = self.take(1, "an array rank")[0]
        if ndim > _MAX_NDIM:
            raise MessageError(f"a message array has {ndim} dimensions; at most {_MAX_NDIM}")
        shape = tuple(self.u64("an array dimension") for _ in range(ndim))
        if math.prod(max(d, 1) for d in shape) * dt.itemsize >= 1 << 62:
            raise MessageError(f"a message array has shape {shape}, too large for any array")
        self.take(-self.at % _ALIGN, "padding")
        nbytes = self.u64("an array size")
        self.take(-self.at % _ALIGN, "padding")
        expect = math.prod(shape) * dt.itemsize
        if nbytes != expect:
            raise MessageError(
                f"a message array of dtype {dt} and shape {shape} carries {nbytes} bytes; "
                f"expected {expect}"
            )
        raw = self.take(nbytes, "array data")
        if expect == 0:
            return np.empty(shape, dt)
        arr = np.frombuffer(raw, dt).reshape(shape)
        return arr.copy() if self.copy else arr

    def value(self, depth: int) -> Any:
        if depth > MAX_DEPTH:
            raise MessageError(f"a message value is nested deeper than {MAX_DEPTH} levels")
        tag = bytes(self.take(1, "a value tag"))
        if tag == b"N":
            return None
        if tag in (b"T", b"F"):
            return tag == b"T"
        if tag == b"i":
            return int(_I64.unpack(self.take(8, "an int"))[0])
        if tag == b"I":
            return int.from_bytes(
                self.take(self.count("int bytes"), "an int"), "little", signed=True
            )
        if tag == b"f":
            return float(_F64.unpack(self.take(8, "a float"))[0])
        if tag == b"c":
            re, im = _C128.unpack(self.take(16, "a complex"))
            return complex(re, im)
        if tag == b"s":
            return self.text()
        if tag == b"y":
            return bytes(self.take(self.count("bytes"), "bytes"))
        if tag == b"a":
            return self.array()
        if tag == b"g":
            arr = self.array()
            if arr.ndim != 0:
                raise MessageError(f"a message scalar has shape {arr.shape}; expected ()")
            return arr[()]
        if tag in (b"l", b"t"):
            items = [self.value(depth + 1) for _ in range(self.count("items"))]
            return items if tag == b"l" else tuple(items)
        if tag == b"d":
            out: dict[Any, Any] = {}
            for _ in range(self.count("entries")):
                k = self.value(depth + 1)
                v = self.value(depth + 1)
                try:
                    out[k] = v
                except TypeError:
                    raise MessageError(
                        f"a message map has a key of type {type(k).__name__}, which is not hashable"
                    ) from None
            return out
        if tag == b"x":
            name = self.text()
            inner = self.value(depth + 1)
            make = self.extensions.get(name)
            if make is None:
                raise UnknownMessageTypeError(
                    f"a message value has extension {name!r}; this receiver knows "
                    f"{sorted(self.extensions) or 'none'}"
                )
            try:
                return make(inner)
            except MessageError:
                raise
            except Exception as e:
                raise MessageError(
                    f"a message value's {name!r} extension is malformed ({e})"
                ) from e
        raise MessageError(f"a message value has unknown tag {tag!r}")


def _dtype(code: bytes) -> np.dtype:
    ok = (
        2 <= len(code) <= 16 and code[:1] in b"<>|=" and code[1:2].decode("latin-1") in _ARRAY_KINDS
    )
    if ok and code[1:2] in b"mM":
        ok = code[2:].replace(b"[", b"").replace(b"]", b"").isalnum()
    elif ok:
        ok = code[2:].isdigit()
    if ok:
        try:
            dt = np.dtype(code.decode("ascii"))
        except (TypeError, ValueError):
            ok = False
        else:
            ok = dt.itemsize > 0 and dt.fields is None and dt.str.encode() == code
    if not ok:
        raise MessageError(
            f"a message array has dtype code {code!r}; expected a plain NumPy dtype such as '<f4'"
        )
    return dt


def decode_value(
    buf: Any,
    *,
    extensions: Mapping[str, Callable[[Any], Any]] | None = None,
    copy: bool = True,
) -> Any:
    """The value :func:`encode_value` wrote into ``buf`` (bytes or a uint8 array).

    ``extensions`` rebuild extension nodes by name. With ``copy=False`` arrays are read-only
    views into ``buf``. Raises :class:`~hpcdist.errors.MessageError` (a ``ValueError``) for
    anything that is not such a value: a wrong magic, a truncated or trailing part, an
    unknown tag, dtype or extension.

    Example:
        >>> decode_value(encode_value({"a": (1, 2)}))
        {'a': (1, 2)}
    """
    if isinstance(buf, np.ndarray):
        if buf.dtype != np.uint8 or buf.ndim != 1:
            raise MessageError(
                f"a message value must be a 1-d uint8 buffer; got dtype {buf.dtype}, shape "
                f"{buf.shape}"
            )
        data = np.ascontiguousarray(buf).data.cast("B")
    elif isinstance(buf, (bytes, bytearray, memoryview)):
        data = memoryview(bytes(buf)).cast("B")
    else:
        raise MessageError(
            f"a message value must be bytes or a uint8 array; got {type(buf).__name__}"
        )
    if bytes(data[: len(VALUE_MAGIC)]) != VALUE_MAGIC:
        raise MessageError(
            f"not an hpcdist message value (expected {VALUE_MAGIC!r}, found "
            f"{bytes(data[:4])!r}); were both sides started from the same hpcdist?"
        )
    r = _Reader(data, extensions or {}, copy)
    r.at = len(VALUE_MAGIC)
    out = r.value(0)
    if r.at != len(data):
        raise MessageError(
            f"a message value has {len(data) - r.at} bytes after its end; expected none"
        )
    return out


__all__ = [
    "ARGS",
    "ARG_WORDS",
    "DEFAULT_LIMIT",
    "FLAGS",
    "HEADER_BYTES",
    "HEADER_WORDS",
    "LENGTH",
    "MAGIC",
    "MAX_DEPTH",
    "REQUEST",
    "TYPE",
    "VERSION",
    "Header",
    "check_header",
    "check_payload",
    "decode_value",
    "encode_value",
    "max_message_bytes",
    "new_header",
    "recv",
    "send",
]
