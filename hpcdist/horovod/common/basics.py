"""Start-up and the shape of the job: ``init``, ``rank``, ``size``, ``local_rank`` and the
``*_built()`` / ``*_enabled()`` queries, as Horovod names them, answered by hpcdist.

``rank``/``size`` are those of the communicator ``init`` got (default: the
MPI world); ``local_*`` and ``cross_*`` describe nodes as hpcdist's runtime
finds them (``HPCDIST_VIRTUAL_NODES`` included): ``cross_rank`` is the
node's index, ``cross_size`` the number of nodes.

Example:
    >>> init(); (rank(), size()) == (rank(), size())
    True
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from typing import Any

from hpcdist.errors import HorovodNotInitializedError
from hpcdist.horovod.common import process_sets as _sets
from hpcdist.observe import timeline as _timeline
from hpcdist.observe.merge import merge_directory
from hpcdist.runtime import mpi, world
from hpcdist.runtime.mpi import thread_level_name

_state: dict[str, Any] = {}


def init(comm: Any = None, process_sets: Any = None) -> None:
    """Start hpcdist.horovod (idempotent): MPI, the global process set, optional sets.

    ``comm``: an mpi4py communicator or a list of world ranks to use instead
    of the world; ``process_sets``: a list of :class:`ProcessSet` to add (or
    ``"dynamic"``: sets may be added later, which is always allowed here).
    """
    if _state.get("initialized"):
        return
    w = world()
    if comm is None:
        comm = w.comm
    elif not hasattr(comm, "Get_rank"):  # a list of world ranks
        ranks = sorted(int(r) for r in comm)
        sub = w.comm.Split(0 if w.rank in ranks else mpi().UNDEFINED, w.rank)
        if w.rank not in ranks:
            raise HorovodNotInitializedError(
                f"hvd.init(comm={ranks}) on rank {w.rank}, which is not in it; call init with "
                "a list only on its ranks (the others must still take part in the split)"
            )
        comm = sub
    extra: Sequence[Any] = [] if process_sets in (None, "dynamic") else list(process_sets)
    sizes = comm.allgather(w.local_size) if comm.Get_size() > 1 else [w.local_size]
    _state.update(initialized=True, comm=comm, homogeneous=len(set(sizes)) == 1)
    _sets.setup(comm, extra)


def shutdown() -> None:
    """Stop the collective threads and free the process sets (``init`` may run again)."""
    if _state.get("initialized"):
        _sets.teardown()
    _state.clear()


def is_initialized() -> bool:
    """Whether :func:`init` ran (and :func:`shutdown` did not since)."""
    return bool(_state.get("initialized"))


def _comm() -> Any:
    if not _state.get("initialized"):
        raise HorovodNotInitializedError(
            "Horovod has not been initialized; use hvd.init() first"
        )
    return _state["comm"]


def rank() -> int:
    """This process's rank (0 .. size-1)."""
    return int(_comm().Get_rank())


def size() -> int:
    """The number of processes."""
    return int(_comm().Get_size())


def local_rank() -> int:
    """This process's rank on its node."""
    _comm()
    return world().local_rank


def local_size() -> int:
    """The number of processes on this node."""
    _comm()
    return world().local_size


def cross_rank() -> int:
    """The index of this process's node."""
    _comm()
    return world().node_index


def cross_size() -> int:
    """The number of nodes."""
    _comm()
    return world().node_count


def is_homogeneous() -> bool:
    """Whether every node runs the same number of processes."""
    _comm()
    return bool(_state["homogeneous"])


def mpi_threads_supported() -> bool:
    """Whether MPI runs with ``MPI_THREAD_MULTIPLE`` (hpcdist asks for it)."""
    _comm()
    return thread_level_name() == "multiple"


def mpi_built() -> bool:
    """True: hpcdist runs on MPI."""
    return True


def mpi_enabled() -> bool:
    """True: MPI carries every collective."""
    return True


def gloo_built() -> bool:
    """False: no Gloo in hpcdist."""
    return False


def gloo_enabled() -> bool:
    """False: no Gloo in hpcdist."""
    return False


def nccl_built() -> bool:
    """Whether NCCL is usable (through CuPy) on this machine."""
    from hpcdist.collectives.nccl import nccl_available  # lazy: probes CuPy/NCCL

    return bool(nccl_available()[0])


def cuda_built() -> bool:
    """Whether CuPy (hpcdist's GPU arrays) is installed."""
    return importlib.util.find_spec("cupy") is not None


def rocm_built() -> bool:
    """False: hpcdist has no ROCm path."""
    return False


def ddl_built() -> bool:
    """False: no IBM DDL in hpcdist."""
    return False


def ccl_built() -> bool:
    """False: no oneCCL in hpcdist."""
    return False


def start_timeline(file_path: str, mark_cycles: bool = False) -> None:
    """Start hpcdist's timeline (every rank of ``init``'s communicator calls it).

    Unlike Horovod, where rank 0 writes one file, every rank writes its own trace
    into ``file_path + ".ranks/"``; :func:`stop_timeline` merges them into
    ``file_path`` (one Chrome trace, one track per rank, clocks aligned).
    ``mark_cycles`` is accepted and ignored (hpcdist has no cycle thread).
    """
    comm = _comm()
    directory = f"{file_path}.ranks"
    _timeline.start(directory, int(comm.Get_rank()), int(comm.Get_size()), comm)
    _state["timeline"] = (file_path, directory)


def stop_timeline() -> None:
    """Stop the timeline and merge every rank's trace into the ``file_path`` given to
    :func:`start_timeline` (collective; rank 0 writes the merged file)."""
    comm = _comm()
    entry = _state.pop("timeline", None)
    _timeline.stop()
    if entry is None:
        return
    comm.Barrier()
    if comm.Get_rank() == 0:
        merge_directory(entry[1], entry[0])
    comm.Barrier()
