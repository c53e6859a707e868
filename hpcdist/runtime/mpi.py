"""Lazy MPI bootstrap and facts about the MPI library.

Importing hpcdist does not start MPI. The first call of :func:`mpi` imports
``mpi4py.MPI``, which initialises MPI: under a launcher that joins the job, and
under a plain ``python script.py`` it is a world of one (an MPI singleton).

Environment:
    ``HPCDIST_MPI_THREAD_LEVEL``: ``single``, ``funneled``, ``serialized`` or
    ``multiple`` (default), the thread level asked of ``MPI_Init_thread``.
    ``HPCDIST_CUDA_AWARE_MPI``: ``1``/``0`` overrides the CUDA-awareness query.
    ``HPCDIST_MPI_DEFAULTS``: ``0`` keeps Open MPI's own defaults where hpcdist
    would choose others (:mod:`hpcdist.runtime.mpi_defaults`).
    ``HPCDIST_START_FENCE``: ``0`` skips the fence that keeps every rank from
    sending before all have finished ``MPI_Init`` (:mod:`hpcdist.runtime.pmix`).

Example:
    >>> MPI = mpi()
    >>> MPI.COMM_WORLD.Get_size() >= 1
    True
"""

from __future__ import annotations

import ctypes
import os
import sys
from collections.abc import Mapping
from types import ModuleType

from hpcdist.cluster.envparse import env_flag, environ_or_default
from hpcdist.cluster.mpi import set_mpi_provider
from hpcdist.errors import ClusterConfigError
from hpcdist.runtime.libraries import mapped_libraries
from hpcdist.runtime.mpi_defaults import apply_mpi_defaults
from hpcdist.runtime.pmix import start_fence

THREAD_LEVELS = ("single", "funneled", "serialized", "multiple")


def mpi() -> ModuleType:
    """Return ``mpi4py.MPI``, initialising MPI on the first call."""
    module = sys.modules.get("mpi4py.MPI")
    if module is not None:
        return module
    import mpi4py  # lazy: MPI start-up (rc must be set before mpi4py.MPI)

    level = os.environ.get("HPCDIST_MPI_THREAD_LEVEL", "multiple").strip().lower()
    if level not in THREAD_LEVELS:
        raise ClusterConfigError(
            f"HPCDIST_MPI_THREAD_LEVEL is {level!r}; expected one of {', '.join(THREAD_LEVELS)}"
        )
    mpi4py.rc.thread_level = level
    apply_mpi_defaults()  # Open MPI reads its parameters from the environment at MPI_Init
    from mpi4py import MPI  # lazy: MPI start-up (importing mpi4py.MPI initialises MPI)

    start_fence(MPI.COMM_WORLD.Get_size())  # before any rank's first message
    return MPI


# The cluster layer's MPIClusterResolver starts MPI through this bootstrap (it cannot
# import the runtime layer above it): register it.
set_mpi_provider(mpi)


def is_initialized() -> bool:
    """Whether MPI has been initialised in this process (never initialises it)."""
    module = sys.modules.get("mpi4py.MPI")
    return bool(module is not None and module.Is_initialized() and not module.Is_finalized())


def thread_level_name(level: int | None = None) -> str:
    """Name of an MPI thread level (the provided one by default), e.g. ``"multiple"``."""
    MPI = mpi()
    if level is None:
        level = MPI.Query_thread()
    names = {
        MPI.THREAD_SINGLE: "single",
        MPI.THREAD_FUNNELED: "funneled",
        MPI.THREAD_SERIALIZED: "serialized",
        MPI.THREAD_MULTIPLE: "multiple",
    }
    return names.get(level, str(level))


def library_version() -> str:
    """First line of ``MPI_Get_library_version``, e.g. ``"Open MPI v5.0.11, ..."``."""
    text = mpi().Get_library_version().replace("\x00", "").strip()
    return " ".join(text.splitlines()[0].split()) if text else "unknown"


def loaded_mpi_libraries() -> list[str]:
    """Paths of the MPI shared libraries mapped into this process (Linux only)."""
    mpi()
    return mapped_libraries(("libmpi.", "libmpi_", "libmpich", "libmpi-"))


def cuda_aware_support(environ: Mapping[str, str] | None = None) -> bool | None:
    """Whether the MPI library accepts CUDA device pointers; ``None`` when unknown.

    ``HPCDIST_CUDA_AWARE_MPI=1``/``0`` decides when set. Otherwise the library's
    ``MPIX_Query_cuda_support`` (Open MPI) or ``MPIX_GPU_query_support``
    (MPICH) is called through ctypes when it exists.

    Example: ``cuda_aware_support({"HPCDIST_CUDA_AWARE_MPI": "0"}) is False``.
    """
    override = env_flag(environ_or_default(environ), "HPCDIST_CUDA_AWARE_MPI")
    if override is not None:
        return override
    for path in loaded_mpi_libraries():
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        query = getattr(lib, "MPIX_Query_cuda_support", None)
        if query is not None:
            query.restype = ctypes.c_int
            return bool(query())
        gpu_query = getattr(lib, "MPIX_GPU_query_support", None)
        if gpu_query is not None:
            gpu_query.restype = ctypes.c_int
            gpu_query.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_int)]
            flag = ctypes.c_int(0)
            if gpu_query(0, ctypes.byref(flag)) == 0:  # MPIX_GPU_SUPPORT_CUDA is type id 0
                return bool(flag.value)
    return None
