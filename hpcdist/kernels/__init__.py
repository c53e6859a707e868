"""Numba kernels for the collectives engine (CPU here; CUDA in :mod:`hpcdist.kernels.cuda`).

Only NumPy and Numba are imported; ``numba.cuda`` is imported only by
:mod:`hpcdist.kernels.cuda`. No MPI.

Example:
    >>> import numpy as np
    >>> from hpcdist import kernels
    >>> x = np.array([2.0, 4.0])
    >>> kernels.scale(x, 2)
    >>> x
    array([1., 2.])
"""

import os

# With colorama installed (the docs extra brings it), Numba's error highlighting makes
# colorama write an ANSI reset at exit: a stray ESC[0m after the output of every job under
# mpirun. Off unless the user set the variable; every Numba import of hpcdist is in this
# package, so this runs before Numba reads it.
os.environ.setdefault("NUMBA_DISABLE_ERROR_MESSAGE_HIGHLIGHTING", "1")

from hpcdist.kernels.cpu import (  # noqa: E402  (after the Numba setting above)
    MAX,
    MEAN,
    MIN,
    SUM,
    gather_bytes,
    reduce_slots,
    scale,
    scatter_bytes,
)
from hpcdist.kernels.half import float_to_half, half_to_float  # noqa: E402
from hpcdist.kernels.pack import address_of, pack_pieces  # noqa: E402
from hpcdist.kernels.sync import (  # noqa: E402
    arrive_and_wait,
    atomic_load,
    atomic_store,
    cpu_pause,
    wait_all,
    wait_equal,
)

__all__ = [
    "address_of",
    "pack_pieces",
    "arrive_and_wait",
    "MAX",
    "MEAN",
    "MIN",
    "SUM",
    "atomic_load",
    "atomic_store",
    "cpu_pause",
    "float_to_half",
    "gather_bytes",
    "half_to_float",
    "reduce_slots",
    "scale",
    "scatter_bytes",
    "wait_all",
    "wait_equal",
]
