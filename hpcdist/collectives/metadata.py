"""What ranks must agree on before a collective, and how a disagreement reads.

A collective's *signature* is a readable line (operation, op, shapes, dtypes,
root, mode). Ranks compare a stable 63-bit hash of it; when the hashes differ
they exchange the lines and :func:`mismatch_message` says which ranks passed
what.

Example:
    >>> import numpy as np
    >>> describe_arrays([np.zeros((3, 4), np.float32), np.zeros(5, np.int64)])
    '[float32(3, 4), int64(5,)]'
    >>> signature_hash("x") == signature_hash("x") and 0 <= signature_hash("x") < 2**63
    True
    >>> rank_ranges([0, 1, 2, 5])
    '0-2, 5'
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from hpcdist.arrays import BFLOAT16

SHOWN = 300  # characters of a signature shown in an error


def describe_array(shape: tuple[int, ...], dtype: Any) -> str:
    """``float32(3, 4)``: dtype and shape of one array (``float32()`` for a 0-d one).

    Example: ``describe_array((5,), np.dtype("int64")) == "int64(5,)"``.
    """
    dims = ", ".join(str(d) for d in shape) + ("," if len(shape) == 1 else "")
    return f"{dtype}({dims})"


def describe_arrays(arrays: Iterable[Any]) -> str:
    """``[float32(3, 4), int64(5,)]`` for a list of arrays.

    Example: ``describe_arrays([np.ones(2)]) == "[float64(2,)]"``.
    """
    return "[" + ", ".join(describe_array(a.shape, a.dtype) for a in arrays) + "]"


def signature_hash(text: str) -> int:
    """A stable hash of ``text`` in ``[0, 2**63)``, the same in every process."""
    digest = hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def rank_ranges(ranks: Iterable[int]) -> str:
    """Ranks as ranges: ``[0, 1, 2, 5]`` gives ``"0-2, 5"``.

    Example: ``rank_ranges([3]) == "3"``.
    """
    parts: list[str] = []
    run: list[int] = []
    for rank in sorted(ranks):
        if run and rank == run[-1] + 1:
            run.append(rank)
            continue
        if run:
            parts.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
        run = [rank]
    if run:
        parts.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ", ".join(parts)


def _first_difference(a: str, b: str) -> int:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return min(len(a), len(b))


def _excerpt(text: str, at: int) -> str:
    """``text``, or a window of it around position ``at`` when it is long."""
    if len(text) <= SHOWN:
        return text
    start = max(0, at - SHOWN // 3)
    end = start + SHOWN
    return ("…" if start else "") + text[start:end] + ("…" if end < len(text) else "")


def mismatch_message(operation: str, signatures: Sequence[str]) -> str:
    """The error text when ``signatures[r]`` (rank ``r``'s signature) are not all equal.

    Example:
        >>> print(mismatch_message("allreduce", ["a(4,)", "a(3,)", "a(3,)"]))
        ... # doctest: +NORMALIZE_WHITESPACE
        allreduce: the ranks called this collective with different arguments:
          rank 0 passed a(4,);
          ranks 1-2 passed a(3,).
        Every rank must call the same collectives in the same order, with the
        same operation, reduce op, number of tensors, shapes, dtypes, root and
        options (timeout set or not, bytes_per_pack); fix the ranks that differ.
    """
    groups: dict[str, list[int]] = {}
    for rank, text in enumerate(signatures):
        groups.setdefault(text, []).append(rank)
    texts = list(groups)
    lines = []
    for i, text in enumerate(texts):
        other = texts[1] if i == 0 and len(texts) > 1 else texts[0]
        ranks = groups[text]
        label = "rank" if len(ranks) == 1 else "ranks"
        shown = _excerpt(text, _first_difference(text, other))
        lines.append(f"  {label} {rank_ranges(ranks)} passed {shown}")
    return (
        f"{operation}: the ranks called this collective with different arguments:\n"
        + ";\n".join(lines)
        + ".\nEvery rank must call the same collectives in the same order, with the\n"
        "same operation, reduce op, number of tensors, shapes, dtypes, root and\n"
        "options (timeout set or not, bytes_per_pack); fix the ranks that differ."
    )


def check_dtype(dtype: np.dtype, operation: str, index: int | None = None) -> None:
    """Raise a clear ``TypeError`` unless ``dtype`` is one the collectives reduce and move.

    Booleans, integers, floats (bfloat16 too) and complex numbers pass; objects,
    strings and structured dtypes do not.
    """
    if dtype == BFLOAT16:
        return
    if dtype.hasobject or dtype.kind not in "biufc" or dtype.fields is not None:
        where = "" if index is None else f" (tensor {index})"
        raise TypeError(
            f"{operation} got an array of dtype {dtype}{where}; expected a boolean, integer, "
            "floating (bfloat16 included) or complex dtype. Convert it with .astype(...) first"
        )
