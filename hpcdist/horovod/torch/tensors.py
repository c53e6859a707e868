"""Tensors to the NumPy arrays the runner moves, and back (views where possible).

Example:
    >>> import torch
    >>> from_host(to_host(torch.ones(2, dtype=torch.bfloat16))).dtype
    torch.bfloat16
"""

from __future__ import annotations

import numpy as np
import torch

from hpcdist import arrays as interop


def to_host(t: torch.Tensor, reduce: bool = False) -> np.ndarray:
    """The tensor's values as a NumPy array (a view where possible; bfloat16 as the
    engine's bfloat16 dtype, which it reduces in float32 with one rounding)."""
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.contiguous()
    if t.dtype == torch.bfloat16:
        return np.asarray(interop.import_array(t))
    return t.numpy()


def from_host(a: np.ndarray) -> torch.Tensor:
    """A NumPy result as a tensor (no copy; the engine's bfloat16 as torch's)."""
    a = np.ascontiguousarray(a)
    if a.dtype.name == "bfloat16":
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)
