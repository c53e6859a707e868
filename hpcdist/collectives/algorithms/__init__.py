"""Allreduce algorithms, one module each, in the registry's default order.

* :mod:`~hpcdist.collectives.algorithms.small`: one node, one bucket of at
  most 4 KiB, unchecked: pack, one barrier, fold, with no plan machinery;
* :mod:`~hpcdist.collectives.algorithms.mpi_direct`: AUTO on one node of two
  ranks in the size band where the MPI library beats the shared window;
* :mod:`~hpcdist.collectives.algorithms.shm`: the node's shared window;
* :mod:`~hpcdist.collectives.algorithms.hierarchical`: shared windows in the
  nodes, MPI between their leaders;
* :mod:`~hpcdist.collectives.algorithms.mpi`: buffer-mode MPI (always applies).

Each module has an ``ALGORITHM`` object that follows
:class:`hpcdist.collectives.registry.Algorithm`. Device arrays (CuPy) take
their own routes: :mod:`hpcdist.collectives.device_path` (NCCL, CUDA-aware
MPI, pinned staging), which reaches the host algorithms through the engine.

Example:
    >>> from hpcdist.collectives.algorithms import mpi
    >>> mpi.ALGORITHM.name
    'mpi'
"""
