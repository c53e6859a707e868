"""The flat sharded layout of ZeRO-1/ZeRO-2: which elements of the parameters each rank owns.

The parameters are laid end to end in *bucket order* (the order their
gradients are reduced in) into one flat space. Each bucket is padded to a
multiple of the world size ``N`` and cut into ``N`` equal contiguous slices;
rank ``r`` owns slice ``r`` of every bucket. Its *shard* is the
concatenation of its slices, bucket after bucket (padding included, so that
a bucket's reduce-scatter writes one block of the shard, and the
all-gather of the shards rebuilds every bucket). The padding is never
part of an optimizer's state.

A rank's shard is described by *segments* ``(param, start, length, at)``:
elements ``start .. start + length`` of the flattened parameter ``param``
lie at ``at .. at + length`` of the shard. Segments are what the sharded
checkpoints record, so that a checkpoint written by ``N`` ranks loads on
any other number (each new segment reads the old segments it overlaps).

Example:
    >>> layout = FlatShardLayout([3, 4, 2], [[0, 1], [2]], world_size=2)
    >>> layout.slice_sizes, layout.shard_size
    ([4, 1], 5)
    >>> [tuple(s) for s in layout.segments(1)]
    [(1, 1, 3, 0), (2, 1, 1, 4)]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from hpcdist.errors import ShardingError

#: The values ``shard=`` / ``experimental_sharding=`` take: None (off), ZeRO-1, ZeRO-2.
SHARDING_STAGES = (None, "optimizer", "gradients")


def check_sharding(value: object, where: str = "shard") -> str | None:
    """``value`` if it names a sharding stage (``None``, ``"optimizer"``, ``"gradients"``).

    Example:
        >>> check_sharding("optimizer")
        'optimizer'
    """
    if value is None or (isinstance(value, str) and value in SHARDING_STAGES):
        return value
    raise ShardingError(
        f"{where}={value!r} is not a sharding stage; expected None (every rank holds everything), "
        "'optimizer' (ZeRO-1: optimizer state sharded) or 'gradients' (ZeRO-2: optimizer "
        "state and gradients sharded)"
    )


class Segment(NamedTuple):
    """Elements ``start .. start + length`` of parameter ``param`` at ``at`` in the shard."""

    param: int
    start: int
    length: int
    at: int


class FlatShardLayout:
    """Parameters of ``sizes`` elements, in ``buckets`` (lists of indices), over N ranks."""

    def __init__(
        self, sizes: Sequence[int], buckets: Sequence[Sequence[int]], world_size: int
    ) -> None:
        if world_size < 1:
            raise ShardingError(f"world_size is {world_size}; expected >= 1")
        self.sizes = [int(n) for n in sizes]
        self.buckets = [[int(i) for i in b] for b in buckets]
        self.world_size = int(world_size)
        order = [i for b in self.buckets for i in b]
        if sorted(order) != list(range(len(self.sizes))):
            raise ShardingError(
                f"the buckets {self.buckets} must hold each of the {len(self.sizes)} parameters "
                "exactly once"
            )
        self.bucket_sizes = [sum(self.sizes[i] for i in b) for b in self.buckets]
        n = self.world_size
        self.slice_sizes = [-(-total // n) for total in self.bucket_sizes]
        self.slice_offsets = [0]
        for s in self.slice_sizes:
            self.slice_offsets.append(self.slice_offsets[-1] + s)
        self.shard_size = self.slice_offsets[-1]

    def segments(self, rank: int) -> list[Segment]:
        """The pieces of parameters that rank ``rank``'s shard holds, in shard order."""
        out = []
        for b, members in enumerate(self.buckets):
            s = self.slice_sizes[b]
            lo, hi = rank * s, (rank + 1) * s  # this rank's slice, in bucket coordinates
            pos = 0
            for i in members:
                n = self.sizes[i]
                a, z = max(lo, pos), min(hi, pos + n)
                if a < z:
                    out.append(Segment(i, a - pos, z - a, self.slice_offsets[b] + a - lo))
                pos += n
        return out

    def bucket_of_shard(self, b: int) -> tuple[int, int]:
        """``[start, stop)`` of bucket ``b``'s slice within every shard."""
        return self.slice_offsets[b], self.slice_offsets[b + 1]

    def describe(self) -> dict:
        """The layout as JSON-able data (the sharded checkpoint's manifest records it)."""
        return {
            "world_size": self.world_size,
            "sizes": self.sizes,
            "buckets": self.buckets,
            "shard_size": self.shard_size,
            "segments": [[list(s) for s in self.segments(r)] for r in range(self.world_size)],
        }


def overlaps(
    wanted: Sequence[Segment], saved: Sequence[Segment]
) -> list[tuple[int, int, int]]:
    """``(at_saved, at_wanted, length)`` copies that fill ``wanted`` from ``saved`` where they meet.

    Example:
        >>> overlaps([Segment(0, 2, 4, 0)], [Segment(0, 0, 3, 10), Segment(0, 3, 9, 20)])
        [(12, 0, 1), (20, 1, 3)]
    """
    by_param: dict[int, list[Segment]] = {}
    for s in saved:
        by_param.setdefault(s.param, []).append(s)
    out = []
    for w in wanted:
        for s in by_param.get(w.param, ()):
            a = max(w.start, s.start)
            z = min(w.start + w.length, s.start + s.length)
            if a < z:
                out.append((s.at + a - s.start, w.at + a - w.start, z - a))
    return out
