"""Compressed reductions: which tensors travel as 16-bit floats between nodes.

``CommunicationOptions(compression="bf16" | "fp16")`` makes float32 SUM and
MEAN reductions send bfloat16 or float16 over MPI and accumulate in float32
(the transport: :mod:`hpcdist.collectives.wire16`). With a
``compression_filter`` the engine hands the call to :func:`split_allreduce`,
which reduces the tensors the filter picks (float32 ones) compressed and the
others exactly, in two fused calls, in a fixed order on every rank.

Example:
    >>> import numpy as np
    >>> from hpcdist.collectives import Collectives
    >>> from hpcdist.collectives.options import CommunicationOptions
    >>> from hpcdist.runtime import mpi
    >>> opts = CommunicationOptions(compression="bf16", compression_filter=lambda a: a.ndim > 1)
    >>> w, b = Collectives(mpi().COMM_SELF).allreduce([np.ones((2, 2)), np.ones(2)], "SUM", opts)
    >>> w.shape, b.shape
    ((2, 2), (2,))
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from hpcdist.collectives.ops import ReduceOp
from hpcdist.collectives.options import CommunicationOptions


def compressible(tensor: Any, opts: CommunicationOptions) -> bool:
    """Whether ``tensor`` travels compressed under ``opts``: float32 and picked by the filter.

    Example: ``compressible(np.ones(2, np.float64), opts)`` is ``False``.
    """
    if opts.compression is None or np.dtype(tensor.dtype) != np.float32:
        return False
    pick = opts.compression_filter
    return True if pick is None else bool(pick(tensor))


def split_allreduce(
    engine: Any,  # the engine's front (hpcdist.collectives.Collectives)
    tensors: Sequence[Any],
    op: ReduceOp,
    opts: CommunicationOptions,
    out: Sequence[Any] | None,
) -> list[Any]:
    """``engine.allreduce`` of ``tensors``: the compressible ones compressed, then the others.

    Every rank must pick the same tensors (the filter sees shapes and dtypes;
    the engine's agreement check catches ranks that differ). Example: see the
    module docstring.
    """
    tensors = list(tensors)
    picked = [compressible(t, opts) for t in tensors]
    results: list[Any] = [None] * len(tensors)
    for compressed in (True, False):
        index = [i for i, p in enumerate(picked) if p is compressed]
        if not index:
            continue
        part = engine.allreduce(
            [tensors[i] for i in index],
            op,
            opts.without_filter(compressed),
            out=None if out is None else [out[i] for i in index],
        )
        for i, r in zip(index, part, strict=True):
            results[i] = r
    return results if out is None else list(out)
