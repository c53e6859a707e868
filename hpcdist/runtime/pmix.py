"""The start-up fence: no rank sends before every rank has finished ``MPI_Init``.

Open MPI 5 can crash a rank inside ``MPI_Init`` (a segmentation fault in
``mca_pml_ob1_recv_frag_callback_match``, at address ``0xe0``). Its last step is a
PMIx fence, and the launcher does not tell every node at once that the fence is
complete: a rank that hears first returns from ``MPI_Init`` and may send at once,
while a rank that hears later still waits in the fence, lets its TCP transport
take the message, and reads it on a ``MPI_COMM_WORLD`` its message layer does not
know yet. Measured on the SLURM cluster across the namespace hosts
(``tests/multihost/slurm.sh``), a bare ``mpi4py`` ``allreduce`` right after start-up
crashed 1 job in 80 launched by ``srun --mpi=pmix`` on two busy hosts.

So when hpcdist starts MPI itself it calls :func:`start_fence`: one more PMIx fence
over the job, which a rank leaves only once every rank has entered it, that is
after every rank's ``MPI_Init`` has returned. It waits on the launcher alone (no
MPI message), costs one round trip to the launcher, and runs only where the
process is a PMIx client in a job of more than one process (``mpirun`` of Open
MPI 5, ``srun --mpi=pmix``); a singleton, or an MPI without PMIx, skips it.

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
    fence = lib.PMIx_Fence
    fence.restype = ctypes.c_int
    fence.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t]
    status = fence(None, 0, None, 0)  # no processes named: all of this process's job
    if status != PMIX_SUCCESS:
        log.warning("hpcdist: the PMIx start-up fence failed with PMIx status %d", status)
    return True


__all__ = ["pmix_client", "start_fence"]
