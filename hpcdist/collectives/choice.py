"""Which host backend a collective comes to, the override variables and bucket sizes.

The algorithms decide from these (:attr:`hpcdist.collectives.where.Where.backend`).
AUTO, on the topology of the engine's communicator:

* one rank: no communication;
* all ranks on one node: ``shm`` (the shared window reads each rank's data
  once and folds it in place; measurements: ``docs/performance.md``);
* several nodes, some with more than one rank: ``hierarchical``;
* one rank per node: ``mpi`` (also when SHM or HIERARCHICAL is asked for).

``HPCDIST_COLLECTIVES=mpi|shm|hierarchical|auto`` replaces AUTO for every
call that asks for AUTO; an explicit ``CommunicationOptions(implementation=...)``
wins over it. ``RING`` is MPI's own algorithms; ``NCCL`` applies to GPU arrays
(:mod:`hpcdist.collectives.device_path`); host arrays asking for it run on MPI.
``HPCDIST_SHM_SLOT_BYTES`` sets the size of a shared slot.

On one node of two ranks AUTO sends calls in the size band :data:`MPI_BAND`
to the MPI library, which is faster there (the ``mpi-direct`` algorithm;
derived from ``hpcdist bench strategy`` results by ``benchmarks/mpi_band.py``;
``HPCDIST_MPI_BAND=lo:hi`` in bytes replaces it).

Example:
    >>> from hpcdist.collectives.options import CommunicationImplementation as CI
    >>> choose(CI.AUTO, nodes=1, ranks=2, largest_node=2, environ={}).name
    'SHM'
    >>> choose(CI.AUTO, nodes=1, ranks=2, largest_node=2,
    ...        environ={"HPCDIST_COLLECTIVES": "mpi"}).name
    'MPI'
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import Any

from hpcdist.collectives.options import CommunicationImplementation as CI

ENV_VAR = "HPCDIST_COLLECTIVES"
SLOT_VAR = "HPCDIST_SHM_SLOT_BYTES"
#: Default bucket (and shared slot) size, chosen with ``hpcdist bench allreduce``.
DEFAULT_BUCKET_BYTES = 4 * 1024 * 1024
#: Total shared memory the two sets of slots of one node may take by default.
WINDOW_BUDGET_BYTES = 512 * 1024 * 1024
MIN_SLOT_BYTES = 64 * 1024
BAND_VAR = "HPCDIST_MPI_BAND"
#: Sizes (bytes, ``[lo, hi)``) where, on one node of two ranks, MPI's allreduce
#: beats the shared window: 4 MiB to 32 MiB. Derived from the committed 2-rank
#: results of ``hpcdist bench strategy`` (``benchmarks/results/strategy_collectives.json``
#: and ``strategy_crossover.json``: per size the best ``engine-shm`` and ``engine-mpi``
#: times) by ``python benchmarks/mpi_band.py``, which prints this line; rerun the
#: benchmark and that script to regenerate it (docs/performance.md, "AUTO's MPI band").
MPI_BAND = (4 << 20, 32 << 20)
_band_cache: dict[str | None, tuple[int, int]] = {}


#: How many times this process has set or unset an environment variable since
#: :func:`watch_environment` ran (``os.environ[...] = ...``, ``del os.environ[...]``,
#: ``os.putenv``, ``os.unsetenv``: CPython raises the audit events ``os.putenv`` and
#: ``os.unsetenv`` for each). Engines remember their picks with this count and read the
#: steering variables again only when it changed: a change takes effect at the next call,
#: and an unchanged environment costs one comparison per call. ``-1`` never matches it.
ENV_CHANGES = [0]
_PROBE = "hpcdist.watch_environment"
_watch = {"asked": False, "seen": False}


def _on_audit(event: str, args: tuple[Any, ...]) -> None:
    """The audit hook: counts environment changes (every audited event passes here)."""
    if event == "os.putenv" or event == "os.unsetenv":
        ENV_CHANGES[0] += 1
    elif event == _PROBE:
        _watch["seen"] = True


def watch_environment() -> bool:
    """Start counting environment changes in :data:`ENV_CHANGES` (once per process, with
    an audit hook, :func:`sys.addaudithook`); whether they are counted. ``False`` where
    another hook refused this one: engines then read the variables on every call.

    With a hook installed, CPython passes every audited event of the process to it
    (``id()``, ``open()``, ``compile()``, ...: about 0.4 us each on a 2-core test machine),
    where reading the two variables on every engine call cost about 0.6 us per call.
    """
    if not _watch["asked"]:
        _watch["asked"] = True
        try:
            sys.addaudithook(_on_audit)
        except RuntimeError:  # pragma: no cover - another hook refused it
            return False
        sys.audit(_PROBE)  # (a hook that refuses others may do so silently: check it runs)
    return _watch["seen"]


def env_version() -> int:
    """What engines remember a pick with: :data:`ENV_CHANGES` while changes are counted,
    else ``-1`` (never current: the pick is checked against the variables every call)."""
    return ENV_CHANGES[0] if _watch["seen"] else -1


def steering_env() -> tuple[str | None, str | None]:
    """``HPCDIST_COLLECTIVES`` and ``HPCDIST_MPI_BAND`` as set now (``None``: unset)."""
    env = os.environ
    return env.get(ENV_VAR), env.get(BAND_VAR)


_band_reads = [0]


def band_reads() -> int:
    """How many times the process's :data:`MPI_BAND` setting was read (a pick that changes
    it depended on ``HPCDIST_MPI_BAND``)."""
    return _band_reads[0]


def env_implementation(environ: Mapping[str, str] | None = None) -> CI:
    """The implementation ``HPCDIST_COLLECTIVES`` asks for (AUTO when unset).

    Example: ``env_implementation({"HPCDIST_COLLECTIVES": "shm"})`` is ``SHM``.
    """
    env = os.environ if environ is None else environ
    text = env.get(ENV_VAR, "").strip()
    if not text:
        return CI.AUTO
    try:
        return CI.from_any(text)
    except ValueError:
        names = ", ".join(m.lower() for m in CI.__members__)
        raise ValueError(
            f"{ENV_VAR}={text!r} is not an implementation; expected one of {names}"
        ) from None


def slot_bytes(local_size: int, environ: Mapping[str, str] | None = None) -> int:
    """Bytes of one shared slot on a node of ``local_size`` ranks.

    ``DEFAULT_BUCKET_BYTES``, made smaller on nodes with many ranks so the
    window stays within ``WINDOW_BUDGET_BYTES``.
    """
    env = os.environ if environ is None else environ
    text = env.get(SLOT_VAR, "").strip()
    if text:
        if not text.isdigit() or int(text) < 4096:
            raise ValueError(f"{SLOT_VAR}={text!r}; expected a number of bytes >= 4096")
        return int(text)
    fit = WINDOW_BUDGET_BYTES // (2 * (local_size + 1))
    return max(MIN_SLOT_BYTES, min(DEFAULT_BUCKET_BYTES, fit))


def choose(
    asked: CI, nodes: int, ranks: int, largest_node: int, environ: Mapping[str, str] | None = None
) -> CI:
    """The backend for a call that asked for ``asked``: MPI, SHM or HIERARCHICAL.

    Example: ``choose(CI.AUTO, nodes=2, ranks=4, largest_node=2)`` is HIERARCHICAL.
    """
    if asked is CI.AUTO:
        asked = env_implementation(environ)
    if asked in (CI.MPI, CI.RING, CI.NCCL) or ranks == 1 or largest_node == 1:
        return CI.MPI  # (one rank per node: nothing to share memory with)
    if asked is CI.AUTO:
        if nodes == 1:
            return CI.SHM
        return CI.HIERARCHICAL if largest_node > 1 else CI.MPI
    if nodes > 1:
        return CI.HIERARCHICAL  # SHM across nodes means shm inside each node
    return CI.SHM


def mpi_band(environ: Mapping[str, str] | None = None) -> tuple[int, int]:
    """The ``[lo, hi)`` bytes where AUTO on one 2-rank node runs MPI (``HPCDIST_MPI_BAND``).

    Example:
        >>> mpi_band({"HPCDIST_MPI_BAND": "0:0"})
        (0, 0)
        >>> mpi_band({}) == MPI_BAND
        True
    """
    if environ is None:
        _band_reads[0] += 1
    env = os.environ if environ is None else environ
    text = env.get(BAND_VAR)
    band = _band_cache.get(text)
    if band is not None:
        return band
    if text is None or not text.strip():
        band = MPI_BAND
    else:
        lo, sep, hi = text.strip().partition(":")
        if not sep or not lo.isdigit() or not hi.isdigit():
            raise ValueError(
                f"{BAND_VAR}={text!r}; expected lo:hi in bytes, such as 1048576:16777216 "
                "(0:0 turns the MPI band off)"
            )
        band = (int(lo), int(hi))
    if len(_band_cache) < 16:
        _band_cache[text] = band
    return band
