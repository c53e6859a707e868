"""Gradient compression as Horovod defines it: ``compress(tensor) -> (tensor, ctx)`` before
the collective, ``decompress(tensor, ctx)`` after.

Example:
    >>> import torch
    >>> t, ctx = Compression.fp16.compress(torch.ones(2))
    >>> t.dtype, Compression.fp16.decompress(t, ctx).dtype
    (torch.float16, torch.float32)
"""

from __future__ import annotations

from typing import Any

import torch


class Compressor:
    """The interface: a compressor is a class with two static methods."""

    @staticmethod
    def compress(tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:
        """The tensor to send and what :meth:`decompress` needs."""
        return tensor, None

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        """The received tensor as the caller's."""
        return tensor


class NoneCompressor(Compressor):
    """Sends tensors as they are."""


class _CastCompressor(Compressor):
    wire: torch.dtype = torch.float16

    @classmethod
    def compress(cls, tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:
        if tensor.dtype.is_floating_point and tensor.dtype != cls.wire:
            return tensor.to(cls.wire), tensor.dtype
        return tensor, None

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        return tensor if ctx is None else tensor.to(ctx)


class FP16Compressor(_CastCompressor):
    """Floating tensors travel as float16 and come back in their own dtype."""

    wire = torch.float16


class BF16Compressor(_CastCompressor):
    """Floating tensors travel as bfloat16 and come back in their own dtype."""

    wire = torch.bfloat16


class Compression:
    """The compressors by name: ``none``, ``fp16``, ``bf16``."""

    none = NoneCompressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor
