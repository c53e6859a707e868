"""How collectives communicate: the implementation to use, bucket and message sizes, timeout.

:class:`CommunicationOptions` follows ``tf.distribute.experimental.CommunicationOptions``:
``bytes_per_pack`` (the fusion bucket size), ``timeout_seconds`` and
``implementation``; hpcdist adds ``mpi_message_bytes`` (the longest MPI message) and
``compression`` (float32 values sent between nodes as bfloat16 or float16). Options given
to one call are merged over the options of the strategy (or engine): a field
the call sets to a non-default value wins. When neither sets a timeout, the
process-wide default applies: :func:`set_default_timeout`, else the
environment variable ``HPCDIST_TIMEOUT_SECONDS``. With a timeout in effect
collectives are *checked* (see :mod:`hpcdist.collectives.arrivals`); a wait
longer than ``HPCDIST_STALL_WARNING_SECONDS`` (default: half the timeout)
raises a :class:`~hpcdist.errors.CollectiveStallWarning`.

Example:
    >>> base = CommunicationOptions(timeout_seconds=30)
    >>> base.merge(CommunicationOptions(implementation="ring"))
    CommunicationOptions(bytes_per_pack=0, timeout_seconds=30, implementation=RING)
"""

from __future__ import annotations

import enum
import math
import os
from collections.abc import Callable, Mapping
from numbers import Real
from typing import Any, cast

from hpcdist.cluster.envparse import short

#: Environment variable: the default collective timeout in seconds (unset, empty, 0: none).
TIMEOUT_VAR = "HPCDIST_TIMEOUT_SECONDS"
#: Environment variable: warn after a collective waited this many seconds (0: never).
STALL_VAR = "HPCDIST_STALL_WARNING_SECONDS"
_OFF = ("", "0", "none", "off")
#: The values of ``CommunicationOptions.compression``.
COMPRESSIONS = ("bf16", "fp16")
_COMPRESSION_NAMES = {
    "bf16": "bf16", "bfloat16": "bf16", "fp16": "fp16", "float16": "fp16", "none": "none",
    "off": "none",
}


def COMPRESS_ALL(tensor: Any) -> bool:
    """The compression filter that compresses every tensor (what ``None`` means).

    Example: ``COMPRESS_ALL(np.ones(2))`` is ``True``.
    """
    return True


class CommunicationImplementation(enum.Enum):
    """Which transport carries a collective.

    * ``AUTO``: hpcdist chooses by message size and topology (see
      :mod:`hpcdist.collectives.choice`); the environment variable
      ``HPCDIST_COLLECTIVES`` (``mpi``, ``shm``, ``hierarchical``) overrides
      the choice for every call that asks for AUTO.
    * ``RING``: MPI's own allreduce algorithms on the CPU (TF's name for its CPU path).
    * ``NCCL``: NCCL between GPUs, for CuPy arrays (host arrays run on MPI).
    * ``MPI``: MPI collectives, explicitly.
    * ``SHM``: an MPI-3 shared-memory window on each node; ranks on several
      nodes run it as ``HIERARCHICAL``.
    * ``HIERARCHICAL``: shared memory inside each node, MPI between one leader
      rank per node, then shared memory again to spread the result; for CuPy
      arrays NCCL inside each node and MPI between the node leaders.

    Example:
        >>> CommunicationImplementation.from_any("nccl") is CommunicationImplementation.NCCL
        True
    """

    AUTO = "AUTO"
    RING = "RING"
    NCCL = "NCCL"
    MPI = "MPI"
    SHM = "SHM"
    HIERARCHICAL = "HIERARCHICAL"

    @classmethod
    def from_any(cls, value: Any) -> CommunicationImplementation:
        """The member given itself or its name in any case (``"ring"``, ``"Nccl"``).

        Example: ``CommunicationImplementation.from_any("auto")`` is ``AUTO``.
        """
        if isinstance(value, cls):
            return value
        if isinstance(value, str) and value.strip().upper() in cls.__members__:
            return cls[value.strip().upper()]
        names = ", ".join(cls.__members__)
        raise ValueError(
            f"implementation is {value!r}; expected one of {names} "
            "(a hpcdist CommunicationImplementation or its name as a string)"
        )


#: The name TF used before ``CommunicationImplementation``.
CollectiveCommunication = CommunicationImplementation


def _check_bytes_per_pack(value: Any, name: str = "bytes_per_pack") -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(
            f"{name} is {value!r} of type {type(value).__name__}; expected an int "
            ">= 0 (0 lets hpcdist choose)"
        )
    if value < 0:
        raise ValueError(f"{name} is {value}; expected an int >= 0 (0 lets hpcdist choose)")
    return int(value)


def _check_compression(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, str) and value.strip().lower() in _COMPRESSION_NAMES:
        return _COMPRESSION_NAMES[value.strip().lower()]
    raise ValueError(
        f"compression is {value!r}; expected None, 'bf16' (bfloat16 on the wire), 'fp16' "
        "(float16 on the wire) or 'none' (off, also where the strategy's options set one)"
    )


def _check_filter(value: Any) -> Callable[[Any], bool] | None:
    if value is None or callable(value):
        return value
    raise TypeError(
        f"compression_filter is {value!r}; expected None or a function (array) -> bool that "
        "says which tensors to compress (e.g. lambda a: a.ndim > 1 keeps biases and norms "
        "in float32)"
    )


def _check_timeout(value: Any) -> float | int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value):
        raise ValueError(
            f"timeout_seconds is {value!r}; expected None (no timeout) or a finite number > 0"
        )
    if value <= 0:
        raise ValueError(
            f"timeout_seconds is {value!r}; expected None (no timeout) or a number > 0"
        )
    return cast("float | int", value)  # a finite Real > 0, as given


class CommunicationOptions:
    """Options of cross-rank collectives, like TF's ``CommunicationOptions``.

    Args:
        bytes_per_pack: the fusion bucket size, TF's meaning: the tensors of
            one call are fused per dtype and cut into buckets of at most this
            many bytes, each reduced through the node's shared window as one
            unit (0: hpcdist's default, 4 MiB, capped by the window's slot).
        mpi_message_bytes: the longest MPI message: a fused buffer reduced or
            broadcast over MPI is sent in messages of at most this many bytes
            (0: one message per fused buffer). An hpcdist addition.
        timeout_seconds: raise :class:`~hpcdist.errors.CollectiveTimeoutError`
            when a collective does not complete in this many seconds
            (``None``: wait for ever). Every rank must either set a timeout or
            not: with one the engine uses MPI's nonblocking calls, which do not
            match blocking ones.
        implementation: a :class:`CommunicationImplementation` or its name.
        compression: ``None``, ``"bf16"`` or ``"fp16"``: float32 SUM and MEAN
            reductions send their values between nodes (over MPI) as bfloat16
            or float16, half the bytes, and accumulate them in float32 in rank
            order (:mod:`hpcdist.collectives.wire16`); results are the rounded
            sums, widened back to float32, the same bits on every rank. Within
            a node the shared window reduces in float32 (nothing is on a wire).
            An hpcdist addition, like Horovod's ``Compression.fp16``.
            ``"none"`` turns compression off for a call whose strategy sets it.
        compression_filter: ``None`` (compress every float32 tensor) or a
            function of a tensor returning whether to compress it (the others
            are reduced in float32 in a second fused call), e.g.
            ``lambda a: a.ndim > 1`` keeps biases and norms exact.

    Options are immutable, comparable and hashable.

    Example:
        >>> opts = CommunicationOptions(bytes_per_pack=50 * 1024 * 1024, timeout_seconds=120)
        >>> opts.implementation
        <CommunicationImplementation.AUTO: 'AUTO'>
    """

    __slots__ = (
        "_bytes_per_pack", "_timeout_seconds", "_implementation", "_mpi_message_bytes",
        "_compression", "_compression_filter", "_hash", "_splits",
    )

    def __init__(
        self,
        bytes_per_pack: int = 0,
        timeout_seconds: float | None = None,
        implementation: CommunicationImplementation | str = CommunicationImplementation.AUTO,
        mpi_message_bytes: int = 0,
        compression: str | None = None,
        compression_filter: Callable[[Any], bool] | None = None,
    ) -> None:
        self._bytes_per_pack = _check_bytes_per_pack(bytes_per_pack)
        self._compression = _check_compression(compression)
        self._compression_filter = _check_filter(compression_filter)
        self._mpi_message_bytes = _check_bytes_per_pack(mpi_message_bytes, "mpi_message_bytes")
        self._timeout_seconds = _check_timeout(timeout_seconds)
        self._implementation = CommunicationImplementation.from_any(implementation)
        self._hash = hash(self._key())
        f = self._compression_filter
        self._splits = self.compression is not None and f is not None and f is not COMPRESS_ALL

    @property
    def bytes_per_pack(self) -> int:
        """The fusion bucket size in bytes (0: the default, 4 MiB)."""
        return self._bytes_per_pack

    @property
    def mpi_message_bytes(self) -> int:
        """The longest MPI message in bytes (0: one message per fused buffer)."""
        return self._mpi_message_bytes

    @property
    def timeout_seconds(self) -> float | None:
        """Seconds a collective may take before it raises (``None``: no limit)."""
        return self._timeout_seconds

    @property
    def implementation(self) -> CommunicationImplementation:
        """The transport asked for."""
        return self._implementation

    @property
    def compression(self) -> str | None:
        """``"bf16"``, ``"fp16"`` or ``None``: how float32 values travel between nodes."""
        return None if self._compression == "none" else self._compression

    def splits_by_filter(self) -> bool:
        """Whether a reduction with these options is split by :attr:`compression_filter`.

        Example: ``CommunicationOptions(compression="bf16").splits_by_filter()`` is ``False``.
        """
        return self._splits  # (decided once: options are immutable)

    @property
    def compression_filter(self) -> Callable[[Any], bool] | None:
        """Which tensors to compress (``None``: every float32 one)."""
        return self._compression_filter

    def without_filter(self, compressed: bool) -> CommunicationOptions:
        """These options with no filter, compressing (``compressed``) or not.

        Example: ``opts.without_filter(False).compression is None``.
        """
        return CommunicationOptions(
            self._bytes_per_pack, self._timeout_seconds, self._implementation,
            self._mpi_message_bytes, self._compression if compressed else "none",
            COMPRESS_ALL if compressed else None,
        )

    def merge(self, other: CommunicationOptions | None) -> CommunicationOptions:
        """New options: the fields ``other`` sets to non-default values win.

        Example:
            >>> a = CommunicationOptions(bytes_per_pack=1024, timeout_seconds=10)
            >>> a.merge(CommunicationOptions(timeout_seconds=2)).timeout_seconds
            2
        """
        if other is None:
            return self
        if not isinstance(other, CommunicationOptions):
            raise TypeError(
                f"options is {other!r} of type {type(other).__name__}; expected "
                "hpcdist.CommunicationOptions or None"
            )
        default = _DEFAULT
        return CommunicationOptions(
            bytes_per_pack=(
                other.bytes_per_pack
                if other.bytes_per_pack != default.bytes_per_pack
                else self.bytes_per_pack
            ),
            timeout_seconds=(
                other.timeout_seconds
                if other.timeout_seconds != default.timeout_seconds
                else self.timeout_seconds
            ),
            implementation=(
                other.implementation
                if other.implementation is not default.implementation
                else self.implementation
            ),
            mpi_message_bytes=(
                other.mpi_message_bytes
                if other.mpi_message_bytes != default.mpi_message_bytes
                else self.mpi_message_bytes
            ),
            compression=(
                other._compression if other._compression is not None else self._compression
            ),
            compression_filter=(
                other.compression_filter
                if other.compression_filter is not None
                else self.compression_filter
            ),
        )

    def with_timeout(self, timeout_seconds: float | None) -> CommunicationOptions:
        """These options with ``timeout_seconds`` replaced.

        Example: ``CommunicationOptions(bytes_per_pack=64).with_timeout(5).timeout_seconds == 5``.
        """
        return CommunicationOptions(
            self._bytes_per_pack, timeout_seconds, self._implementation, self._mpi_message_bytes,
            self._compression, self._compression_filter,
        )

    def _key(self) -> tuple[Any, ...]:
        return (
            self._bytes_per_pack, self._timeout_seconds, self._implementation,
            self._mpi_message_bytes, self._compression, self._compression_filter,
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, CommunicationOptions):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        return self._hash

    def __repr__(self) -> str:
        extra = (
            f", mpi_message_bytes={self._mpi_message_bytes}" if self._mpi_message_bytes else ""
        )
        if self._compression is not None:
            extra += f", compression={self._compression!r}"
        if self._compression_filter is not None:
            extra += f", compression_filter={self._compression_filter!r}"
        return (
            f"CommunicationOptions(bytes_per_pack={self._bytes_per_pack}, "
            f"timeout_seconds={self._timeout_seconds}, "
            f"implementation={self._implementation.name}{extra})"
        )


_DEFAULT = CommunicationOptions()


def _seconds_from(name: str, text: str) -> float | None:
    """``text`` (a variable's value) as seconds > 0, ``None`` for off values, else ValueError."""
    value = text.strip().lower()
    if value in _OFF:
        return None
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not math.isfinite(seconds) or seconds <= 0:
        raise ValueError(
            f"{name} is {short(text)}; expected a number of seconds > 0 "
            "(or empty, 0 or 'off' for none). Fix or unset the variable"
        )
    return seconds


def timeout_from_env(environ: Mapping[str, str] | None = None) -> float | None:
    """The timeout ``HPCDIST_TIMEOUT_SECONDS`` asks for (``None``: unset, empty, 0 or off).

    Example:
        >>> timeout_from_env({"HPCDIST_TIMEOUT_SECONDS": "30"})
        30.0
        >>> timeout_from_env({}) is None
        True
    """
    environ = os.environ if environ is None else environ
    return _seconds_from(TIMEOUT_VAR, environ.get(TIMEOUT_VAR, ""))


def stall_warning_seconds(
    timeout: float | None, environ: Mapping[str, str] | None = None
) -> float | None:
    """Seconds a checked collective waits before a stall warning (``None``: no warning).

    ``HPCDIST_STALL_WARNING_SECONDS`` when set (0 or ``off``: never warn),
    else half of ``timeout``.

    Example:
        >>> stall_warning_seconds(10.0, {})
        5.0
        >>> stall_warning_seconds(10.0, {"HPCDIST_STALL_WARNING_SECONDS": "2"})
        2.0
    """
    environ = os.environ if environ is None else environ
    text = environ.get(STALL_VAR)
    if text is None or not text.strip():
        return None if timeout is None else timeout / 2
    return _seconds_from(STALL_VAR, text)


class Default:
    """The process-wide default timeout; ``generation`` changes whenever it does."""

    unset = True  # not set yet: read HPCDIST_TIMEOUT_SECONDS on first use
    timeout: float | None = None
    generation = 0


def set_default_timeout(seconds: float | None) -> None:
    """Set the timeout of collectives whose call and strategy set none (``None``: no timeout).

    It overrides ``HPCDIST_TIMEOUT_SECONDS``. Every rank must use the same
    setting, since checked and unchecked collectives do not match.

    Example:
        >>> before = get_default_timeout()
        >>> set_default_timeout(120)
        >>> get_default_timeout()
        120
        >>> set_default_timeout(before)
    """
    value = _check_timeout(seconds)
    Default.timeout, Default.unset = value, False
    Default.generation += 1


def get_default_timeout() -> float | None:
    """The default collective timeout: :func:`set_default_timeout`'s, else the environment's.

    ``HPCDIST_TIMEOUT_SECONDS`` is read once, on first use.

    Example:
        >>> get_default_timeout() is None or get_default_timeout() > 0
        True
    """
    if Default.unset:
        Default.timeout, Default.unset = timeout_from_env(), False
        Default.generation += 1
    return Default.timeout
