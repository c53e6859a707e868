"""The start-up fence: no rank sends before every rank has finished ``MPI_Init``.

Open MPI 5 can crash a rank inside ``MPI_Init`` (a segmentation fault in
``mca_pml_ob1_recv_frag_callback_match``, at address ``0xe0``): a rank of another
host that has already returned from ``MPI_Init`` sends to it, and it reads the
message, in the wait of its last PMIx fence, on a ``MPI_COMM_WORLD`` its message
layer does not know yet. That last fence collects no data, and under SLURM's PMIx
(``srun --mpi=pmix``) such a fence does not wait for the other hosts: measured on
the namespace hosts of ``tests/multihost``, a rank whose host entered it a second
later did not hold up the other host's rank at all. So one host's ranks may start
sending while another host's are still inside ``MPI_Init``; a bare ``mpi4py``
``allreduce`` right after start-up crashed this way in about 1 job in 80 on two busy
hosts, and in every job where one rank was made to hear a second late
(``tests/multihost/late_fence.c``).

So when hpcdist starts MPI itself it calls :func:`start_fence`: one more PMIx fence
over the job, asking to collect data (``PMIX_COLLECT_DATA``, there is none new to
collect), which makes every host wait for every other's contribution. A rank leaves it
only once every rank has entered it, that is after every rank's ``MPI_Init`` has
returned. It waits on the launcher alone (no MPI message), costs one round trip
through the launcher, and runs only where the process is a PMIx client in a job of
more than one process (``mpirun`` of Open MPI 5, ``srun --mpi=pmix``); a singleton,
or an MPI without PMIx, skips it.

Environment:
    ``HPCDIST_START_FENCE=0`` skips it: for a job whose processes do not all start
    MPI through hpcdist (e.g. ``mpirun -n 1 python a.py : -n 3 ./solver``), where
    the fence would wait for processes that never enter it.

Example:
    >>> start_fence(world_size=1)
    False
"""

from __future__ import annotations

import ctypes
import logging
import os

from hpcdist.cluster.envparse import env_flag
from hpcdist.runtime.libraries import mapped_libraries

log = logging.getLogger("hpcdist")

#: PMIx's status for success.
PMIX_SUCCESS = 0
#: The fence attribute that asks it to collect data (``PMIX_COLLECT_DATA``), and the
#: type code of its value (``PMIX_BOOL``).
PMIX_COLLECT_DATA = b"pmix.collect"
PMIX_BOOL = 1


def pmix_client() -> ctypes.CDLL | None:
    """The PMIx client library this process has initialised, or ``None``."""
    for path in mapped_libraries(("libpmix.so",)):
        try:
            lib = ctypes.CDLL(path)  # mapped already: the same library, not a second copy
        except OSError:
            continue
        initialized = lib.PMIx_Initialized
        initialized.restype = ctypes.c_bool
        initialized.argtypes = []
        if initialized():
            return lib
    return None


def _collect_data(lib: ctypes.CDLL) -> ctypes.c_void_p | None:
    """A one-entry ``pmix_info_t`` array asking the fence to collect data, or ``None``
    where the PMIx library cannot build one (before PMIx 4)."""
    try:
        create, load = lib.PMIx_Info_create, lib.PMIx_Info_load
    except AttributeError:
        return None
    create.restype = ctypes.c_void_p
    create.argtypes = [ctypes.c_size_t]
    load.restype = ctypes.c_int
    load.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_uint16]
    info = create(1)
    flag = ctypes.c_bool(True)
    if not info or load(info, PMIX_COLLECT_DATA, ctypes.byref(flag), PMIX_BOOL) != PMIX_SUCCESS:
        return None
    return info


def start_fence(world_size: int) -> bool:
    """Wait until every process of this PMIx job has entered this fence; whether it ran.

    Call it right after ``MPI_Init``, before the first MPI message, in every process
    of the job (``world_size``: ``MPI_COMM_WORLD``'s size). A failed fence is logged
    and start-up goes on, as it would without the fence.
    """
    if world_size <= 1 or env_flag(os.environ, "HPCDIST_START_FENCE") is False:
        return False
    lib = pmix_client()
    if lib is None:
        return False
    info = _collect_data(lib)
    fence = lib.PMIx_Fence
    fence.restype = ctypes.c_int
    fence.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t]
    # No processes named: all of this process's job.
    status = fence(None, 0, info, 0 if info is None else 1)
    if info is not None:
        free = lib.PMIx_Info_free
        free.restype = None
        free.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        free(info, 1)
    if status != PMIX_SUCCESS:
        log.warning("hpcdist: the PMIx start-up fence failed with PMIx status %d", status)
    return True


__all__ = ["pmix_client", "start_fence"]
