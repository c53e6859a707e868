"""Element nests and specs: the helpers every dataset node uses, and ``TensorSpec``.

Elements are nests of tuples (namedtuples) and dicts whose leaves are NumPy
arrays, NumPy scalars or CuPy arrays. The helpers here walk, convert, stack and
describe such nests; ``TensorSpec`` describes one leaf, and the spec helpers
trace ``map`` functions on zero-filled examples. Example:
``map_structure(lambda a: a * 2, (x, {"y": y}))`` doubles every leaf.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from hpcdist.arrays import array_module, import_array, is_cupy

# --------------------------------------------------------------------------- element structures


def map_structure(fn: Callable[[Any], Any], x: Any) -> Any:
    """``fn`` applied to every leaf of a nest of tuples (namedtuples) and dicts."""
    if isinstance(x, tuple):
        values = [map_structure(fn, v) for v in x]
        return type(x)(*values) if hasattr(x, "_fields") else tuple(values)
    if isinstance(x, Mapping):
        return {k: map_structure(fn, v) for k, v in x.items()}
    return fn(x)


def flatten_with_paths(x: Any, path: str = "") -> list[tuple[str, Any]]:
    """(path, leaf) pairs of a nest, e.g. ``[("[0]", a), ("[1]['y']", b)]``."""
    if isinstance(x, tuple):
        return [p for i, v in enumerate(x) for p in flatten_with_paths(v, f"{path}[{i}]")]
    if isinstance(x, Mapping):
        return [p for k, v in x.items() for p in flatten_with_paths(v, f"{path}[{k!r}]")]
    return [(path or "element", x)]


def same_structure(a: Any, b: Any) -> bool:
    if isinstance(a, tuple) or isinstance(b, tuple):
        return (
            isinstance(a, tuple)
            and isinstance(b, tuple)
            and len(a) == len(b)
            and all(same_structure(x, y) for x, y in zip(a, b, strict=True))
        )
    if isinstance(a, Mapping) or isinstance(b, Mapping):
        return (
            isinstance(a, Mapping)
            and isinstance(b, Mapping)
            and set(a) == set(b)
            and all(same_structure(a[k], b[k]) for k in a)
        )
    return True


def _to_leaf(v: Any) -> Any:
    """A NumPy array, NumPy scalar (0-d) or CuPy array for any value (lists become arrays)."""
    if isinstance(v, (np.ndarray, np.generic)) or is_cupy(v):
        return v
    a = np.asarray(v)
    return a[()] if a.ndim == 0 else a


def normalize_structure(x: Any) -> Any:
    return map_structure(_to_leaf, x)


def to_arrays(x: Any) -> Any:
    """Leaves as arrays (never copied): TF's conversion of nested inputs to tensors.

    Tensors of torch, JAX or TF become NumPy/CuPy views of their memory.
    """
    return map_structure(
        lambda v: v if isinstance(v, np.ndarray) or is_cupy(v) else np.asarray(import_array(v)),
        x,
    )


def row_of(a: Any, i: Any) -> Any:
    """Row ``i`` of ``a`` as a copy (a NumPy scalar for 1-d arrays)."""
    r = a[i]
    if isinstance(r, np.ndarray):
        return np.array(r)
    return r.copy() if is_cupy(r) else r


def call_element(fn: Callable[..., Any], element: Any) -> Any:
    """TF's calling convention: a tuple element is spread over positional arguments."""
    return fn(*element) if isinstance(element, tuple) else fn(element)


def stack_elements(elements: list[Any], what: str = "batch") -> Any:
    first = elements[0]
    try:
        if isinstance(first, tuple):
            parts = [stack_elements([e[i] for e in elements], what) for i in range(len(first))]
            return type(first)(*parts) if hasattr(first, "_fields") else tuple(parts)
        if isinstance(first, Mapping):
            return {k: stack_elements([e[k] for e in elements], what) for k in first}
    except (KeyError, IndexError, TypeError) as err:
        raise ValueError(
            f"{what}: the elements do not all have the same structure as the first one "
            f"({structure_text(first)}); make every element the same nest of arrays"
        ) from err
    try:
        return array_module(first).stack(elements)
    except ValueError as err:
        shapes = sorted({tuple(np.shape(e)) for e in elements})
        raise ValueError(
            f"{what}: cannot stack elements of different shapes {shapes[:4]}; batch needs "
            "equal shapes, so map the elements to a common shape first"
        ) from err


def structure_text(x: Any) -> str:
    return ", ".join(path for path, _ in flatten_with_paths(x))


def count_rows(x: Any, what: str) -> int:
    sizes = {}
    for path, a in flatten_with_paths(x):
        shape = np.shape(a)
        if len(shape) == 0:
            raise ValueError(
                f"{what}: component {path} is a scalar; it needs a first dimension to be "
                "split into rows"
            )
        sizes[path] = shape[0]
    if len(set(sizes.values())) > 1:
        found = ", ".join(f"{p}: {n}" for p, n in sizes.items())
        raise ValueError(
            f"{what}: the components have different sizes in their first dimension ({found}); "
            "every component must have the same number of rows"
        )
    if not sizes:
        raise ValueError(f"{what}: the structure has no arrays; give at least one array")
    return next(iter(sizes.values()))


# ------------------------------------------------------------------------------------ TensorSpec


@dataclass(frozen=True)
class TensorSpec:
    """Shape and dtype of one component of an element; ``None`` marks an unknown dimension.

    Example:
        >>> TensorSpec((None, 3), "float32")
        TensorSpec(shape=(None, 3), dtype=dtype('float32'))
        >>> TensorSpec((None, 3), "float32").is_compatible_with(np.zeros((5, 3), np.float32))
        True
    """

    shape: tuple[int | None, ...]
    dtype: np.dtype = np.dtype(np.float32)

    def __post_init__(self) -> None:
        try:
            shape = tuple(None if d is None else operator.index(d) for d in self.shape)
        except TypeError as err:
            raise TypeError(
                f"TensorSpec shape is {self.shape!r}; expected a sequence of ints or None"
            ) from err
        dtype = np.dtype(self.dtype)
        if dtype.kind in "US":  # strings: the length is not part of the type (TF's tf.string)
            dtype = np.dtype(dtype.kind)
        object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "dtype", dtype)

    @classmethod
    def from_value(cls, value: Any) -> TensorSpec:
        """The spec of an array or scalar.

        Example: ``TensorSpec.from_value(np.int64(3)) == TensorSpec((), np.int64)``.
        """
        if not hasattr(value, "shape") or not hasattr(value, "dtype"):
            value = np.asarray(value)
        return cls(tuple(value.shape), value.dtype)

    def is_compatible_with(self, value: Any) -> bool:
        """Whether ``value`` (an array or a spec) has this dtype and a matching shape.

        Example: ``TensorSpec((None,), "int64").is_compatible_with(np.arange(4))`` is ``True``.
        """
        other = value if isinstance(value, TensorSpec) else TensorSpec.from_value(value)
        if other.dtype != self.dtype or len(other.shape) != len(self.shape):
            return False
        return all(
            a is None or b is None or a == b for a, b in zip(self.shape, other.shape, strict=True)
        )


def spec_of(element: Any) -> Any:
    return map_structure(TensorSpec.from_value, element)


def unify_specs(a: Any, b: Any) -> Any:
    """The spec of two traced outputs: dimensions that differ become None."""
    if not same_structure(a, b):
        raise _TraceFailed("the structure depends on the input shape")
    flat_b = iter([s for _, s in flatten_with_paths(b)])

    def unify(sa: TensorSpec) -> TensorSpec:
        sb = next(flat_b)
        if len(sa.shape) != len(sb.shape) or sa.dtype != sb.dtype:
            raise _TraceFailed("the rank or dtype depends on the input shape")
        return TensorSpec(
            tuple(x if x == y else None for x, y in zip(sa.shape, sb.shape, strict=True)), sa.dtype
        )

    return map_structure(unify, a)


class _TraceFailed(Exception):
    pass


def example_element(spec: Any, fill: int) -> Any:
    def zeros(s: TensorSpec) -> Any:
        a = np.zeros(tuple(fill if d is None else d for d in s.shape), dtype=s.dtype)
        return a[()] if a.ndim == 0 else a

    return map_structure(zeros, spec)


# ------------------------------------------------------------------------------- small helpers


#: The largest count, size or seed a dataset takes: tf.data's arguments are int64 scalars.
INT64_MAX = 2**63 - 1


def _short(value: Any, limit: int = 80) -> str:
    """``repr(value)`` cut to about ``limit`` characters, for error messages; never raises."""
    try:
        text = repr(value)
    except Exception:  # an int too long to print, a broken __repr__
        return f"<a {type(value).__name__}>"
    return text if len(text) <= limit else f"{text[: limit - 5]}...{text[-2:]}"


def check_int(
    value: Any, what: str, name: str, minimum: int, hint: str, maximum: int = INT64_MAX
) -> int:
    """``value`` as an int in ``minimum .. maximum``: an int or NumPy integer, never a bool.

    ``TypeError`` for another type, ``ValueError`` out of range; both name the
    argument. Example: ``check_int(np.int32(4), "batch", "batch_size", 1, "...") == 4``.
    """
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(
            f"{what}: {name} is {_short(value)} ({type(value).__name__}); expected {hint}"
        )
    number = int(value)
    if number < minimum:
        raise ValueError(f"{what}: {name} is {_short(number)}; expected {hint}")
    if number > maximum:
        raise ValueError(
            f"{what}: {name} is {_short(number)}, larger than {maximum} (2**63 - 1: tf.data "
            f"takes int64 values); expected {hint}"
        )
    return number


def check_seed(seed: Any, what: str) -> int | None:
    if seed is None:
        return None
    return check_int(seed, what, "seed", 0, "seed >= 0 (or None for a random order)")
