"""Reduction algorithms, one module each, in the registry's default order.

Device (GPU) arrays, see :mod:`hpcdist.collectives.device_path`:

* :mod:`~hpcdist.collectives.algorithms.device_copy`: a world of one rank: copies;
* :mod:`~hpcdist.collectives.algorithms.nccl`: NCCL over the whole communicator;
* :mod:`~hpcdist.collectives.algorithms.nccl_hierarchical`: NCCL in the nodes,
  MPI between node leaders;
* :mod:`~hpcdist.collectives.algorithms.device_mpi`: CUDA-aware MPI on device pointers;
* :mod:`~hpcdist.collectives.algorithms.device_staged`: pinned host copies and the
  host algorithms below (every other device call).

Host (NumPy) arrays:

* :mod:`~hpcdist.collectives.algorithms.small`: one node, one bucket of at
  most 4 KiB, unchecked: pack, one barrier, fold, with no plan machinery;
* :mod:`~hpcdist.collectives.algorithms.mpi_direct`: AUTO on one node of two
  ranks in the size band where the MPI library beats the shared window;
* :mod:`~hpcdist.collectives.algorithms.shm`: the node's shared window;
* :mod:`~hpcdist.collectives.algorithms.hierarchical`: shared windows in the
  nodes, MPI between their leaders;
* :mod:`~hpcdist.collectives.algorithms.mpi`: buffer-mode MPI (every other host call).

Each module has an ``ALGORITHM`` object that follows
:class:`hpcdist.collectives.registry.Algorithm`.

Example:
    >>> from hpcdist.collectives.algorithms import mpi
    >>> mpi.ALGORITHM.name
    'mpi'
"""
