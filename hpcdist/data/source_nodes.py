"""Source nodes of a ``Dataset``: tensor slices, one tensor, ranges, generators, file names.

Sources have no input (``_input is None``). ``from_tensor_slices`` and
``range`` are indexed sources: the fast paths gather whole batches of their rows
by index. Example: ``RangeDataset(2, 9, 3).cardinality() == 3``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping, Sequence
from contextlib import closing
from typing import Any

import numpy as np
from numpy.typing import DTypeLike

from hpcdist.arrays import array_module, is_cupy
from hpcdist.data.dataset import Dataset, register_node
from hpcdist.data.shuffle import EpochCounter, epoch_rng, index_array
from hpcdist.data.sources import to_path
from hpcdist.data.structure import (
    TensorSpec,
    check_int,
    check_seed,
    count_rows,
    flatten_with_paths,
    map_structure,
    normalize_structure,
    row_of,
    same_structure,
    spec_of,
    structure_text,
    to_arrays,
)
from hpcdist.utils.seeding import get_random_seed, next_seed


@register_node
class IndexedSource(Dataset):
    """A source whose rows can be addressed by index (the fast paths gather from it)."""

    def _num_rows(self) -> int:
        raise NotImplementedError

    def _take(self, rows: range | np.ndarray) -> Any:
        """The batch of the given rows (a copy)."""
        raise NotImplementedError

    def _index_source(self) -> IndexedSource | None:
        return self

    def _index_stream(self) -> Iterator[range | np.ndarray]:
        n = self._num_rows()
        if n:
            yield range(n)

    def cardinality(self) -> int:
        return self._num_rows()


@register_node
class TensorSliceDataset(IndexedSource):
    """The source of ``Dataset.from_tensor_slices``: row ``i`` of every array is element ``i``.

    Example:
        >>> ds = TensorSliceDataset({"a": np.zeros((3, 2))})
        >>> ds.cardinality(), ds.element_spec["a"].shape
        (3, (2,))
    """

    releases_gil = False  # elements come from memory

    def __init__(self, tensors: Any) -> None:
        super().__init__(None)
        self._arrays = to_arrays(tensors)
        self._n = count_rows(self._arrays, "from_tensor_slices")

    def _num_rows(self) -> int:
        return self._n

    def _iter(self) -> Generator[Any, None, None]:
        arrays = self._arrays
        if not isinstance(arrays, (tuple, Mapping)):
            for i in range(self._n):
                yield row_of(arrays, i)
            return
        for i in range(self._n):
            yield map_structure(functools.partial(row_of, i=i), arrays)

    def _take(self, rows: range | np.ndarray) -> Any:
        arrays = self._arrays
        if type(arrays) is np.ndarray and type(rows) is np.ndarray:  # the hot case
            return arrays.take(rows, axis=0)
        if isinstance(rows, range):
            sl = slice(rows.start, rows.stop, rows.step)
            return map_structure(
                lambda a: a[sl].copy() if is_cupy(a) else np.array(a[sl]), self._arrays
            )

        def gather(a: Any) -> Any:
            if is_cupy(a):
                return a[array_module(a).asarray(rows)]
            return np.asarray(np.take(a, rows, axis=0))

        return map_structure(gather, self._arrays)

    def _compute_element_spec(self) -> Any:
        return map_structure(lambda a: TensorSpec(tuple(a.shape[1:]), a.dtype), self._arrays)

    def _describe(self) -> str:
        return f"rows={self._n}"


@register_node
class TensorDataset(Dataset):
    """The source of ``Dataset.from_tensors``: one element.

    Example:
        >>> [x.shape for x in TensorDataset(np.zeros((2, 3)))]
        [(2, 3)]
    """

    releases_gil = False  # elements come from memory

    def __init__(self, tensors: Any) -> None:
        super().__init__(None)
        self._value = normalize_structure(tensors)

    def _iter(self) -> Generator[Any, None, None]:
        yield self._value

    def cardinality(self) -> int:
        return 1

    def _compute_element_spec(self) -> Any:
        return spec_of(self._value)


@register_node
class RangeDataset(IndexedSource):
    """The source of ``Dataset.range``: NumPy int64 scalars (or ``output_type``).

    Example:
        >>> RangeDataset(2, 9, 3).cardinality()
        3
    """

    releases_gil = False  # elements come from memory

    def __init__(self, *args: int, output_type: DTypeLike = np.int64) -> None:
        super().__init__(None)
        if not 1 <= len(args) <= 3:
            raise TypeError(
                f"range takes 1 to 3 arguments (stop | start, stop | start, stop, step); "
                f"got {len(args)}"
            )
        values = [
            check_int(a, "range", "argument", -(2**63), "an integer (an int64)") for a in args
        ]
        if len(values) == 3 and values[2] == 0:
            raise ValueError("range: step is 0; expected a non-zero step")
        self._range = range(*values)
        self.output_type = _range_dtype(output_type)
        _check_range_fits(self._range, self.output_type)

    def _num_rows(self) -> int:
        return len(self._range)

    def _iter(self) -> Generator[Any, None, None]:
        make = self.output_type.type
        for v in self._range:
            yield make(v)

    def _take(self, rows: range | np.ndarray) -> Any:
        r = self._range
        return (r.start + index_array(rows) * r.step).astype(self.output_type)

    def _compute_element_spec(self) -> Any:
        return TensorSpec((), self.output_type)

    def _describe(self) -> str:
        r = self._range
        return f"{r.start}, {r.stop}, {r.step}"


def _range_dtype(output_type: DTypeLike) -> np.dtype:
    """The dtype of ``range``'s elements: an integer or floating-point type."""
    try:
        dtype = None if output_type is None else np.dtype(output_type)
    except (TypeError, ValueError):
        dtype = None
    if dtype is None or dtype.kind not in "iuf":
        raise TypeError(
            f"range: output_type is {output_type!r}; expected an integer or floating-point "
            f"dtype such as np.int64 (the default) or np.float32"
        )
    return dtype


def _check_range_fits(r: range, dtype: np.dtype) -> None:
    """Refuse a range whose values the dtype cannot hold, or with too many values to count."""
    if not r:
        return
    try:
        len(r)
    except OverflowError:
        raise ValueError(
            f"range: range({r.start}, {r.stop}, {r.step}) has more than 2**63 - 1 elements; "
            f"expected fewer (a dataset counts its elements in an int64)"
        ) from None
    info = np.iinfo(dtype) if dtype.kind in "iu" else np.finfo(dtype)
    cast = int if dtype.kind in "iu" else float  # Python numbers: exact comparisons
    smallest, largest = cast(info.min), cast(info.max)
    low, high = min(r[0], r[-1]), max(r[0], r[-1])
    if low < smallest or high > largest:  # integers would wrap around, floats become inf
        raise ValueError(
            f"range: the values run from {low} to {high}, outside {dtype.name}'s "
            f"{smallest} .. {largest}; choose a wider output_type or smaller bounds"
        )


@register_node
class GeneratorDataset(Dataset):
    """The source of ``Dataset.from_generator``: ``generator(*args)`` is called per iteration.

    Example:
        >>> ds = GeneratorDataset(lambda: iter([(1, 2.0)]))
        >>> ds.element_spec
        (TensorSpec(shape=(), dtype=dtype('int64')), TensorSpec(shape=(), dtype=dtype('float64')))
    """

    def __init__(
        self,
        generator: Callable[..., Iterable[Any]],
        output_types: Any = None,
        output_shapes: Any = None,
        args: Sequence[Any] | None = None,
        output_signature: Any = None,
    ) -> None:
        super().__init__(None)
        if not callable(generator):
            raise TypeError(
                f"from_generator: generator is a {type(generator).__name__}, not a callable; "
                "pass the generator function itself (from_generator(gen), not gen()) so that "
                "every iteration can start it again"
            )
        self.generator = generator
        self.args = tuple(args or ())
        self.output_signature = _signature(output_signature, output_types, output_shapes)

    def _iter(self) -> Generator[Any, None, None]:
        signature = self.output_signature
        source = self.generator(*self.args)
        try:
            for i, element in enumerate(source):
                if signature is None:
                    yield normalize_structure(element)
                else:
                    yield _conform(element, signature, i)
        finally:
            close = getattr(source, "close", None)
            if close is not None:
                close()

    def _compute_element_spec(self) -> Any:
        signature = self.output_signature
        if signature is not None and not any(
            isinstance(s, _AnyShapeSpec) for _, s in flatten_with_paths(signature)
        ):
            return signature
        with closing(self._iter()) as it:
            first = next(it, None)
        if first is None:
            raise ValueError(
                "from_generator: the generator yields nothing, so element_spec cannot be "
                "inferred; pass output_signature"
            )
        return spec_of(first)

    def _describe(self) -> str:
        return getattr(self.generator, "__name__", "generator")


def _signature(signature: Any, types: Any, shapes: Any) -> Any:
    """The signature as a nest of TensorSpec (``_AnyShapeSpec``: only the dtype is known)."""
    if signature is None and shapes is None and types is not None:
        leaves = [leaf for _, leaf in flatten_with_paths(types)]
        if leaves and all(isinstance(leaf, TensorSpec) for leaf in leaves):
            signature, types = types, None  # from_generator(gen, signature) given positionally
    if signature is not None:
        if types is not None or shapes is not None:
            raise TypeError(
                "from_generator: give output_signature, or output_types (with output_shapes), "
                "not both"
            )
        for path, leaf in flatten_with_paths(signature):
            if not isinstance(leaf, TensorSpec):
                raise TypeError(
                    f"from_generator: output_signature has {leaf!r} at {path}; expected a "
                    "TensorSpec (hpcdist.data.dataset.TensorSpec) for every component"
                )
        return signature
    if types is None:
        if shapes is not None:
            raise TypeError("from_generator: output_shapes needs output_types")
        return None
    if shapes is None:
        return map_structure(lambda t: _AnyShapeSpec((), t), types)
    it = iter(_shapes_like(types, shapes))
    return map_structure(lambda t: TensorSpec(next(it), t), types)


class _AnyShapeSpec(TensorSpec):
    """A dtype from ``output_types`` without ``output_shapes``: the shape is not checked."""


def _shapes_like(types: Any, shapes: Any) -> list[tuple[int | None, ...]]:
    """The shapes matched to the leaves of ``types`` (a shape is a tuple/list of dims)."""

    def is_shape(s: Any) -> bool:
        return isinstance(s, (list, tuple)) and all(d is None or isinstance(d, int) for d in s)

    out: list[tuple[int | None, ...]] = []

    def walk(t: Any, s: Any) -> None:
        if isinstance(t, (tuple, Mapping)):
            keys = list(t) if isinstance(t, Mapping) else range(len(t))
            try:
                for k in keys:
                    walk(t[k], s[k])
            except (KeyError, IndexError, TypeError) as err:
                raise TypeError(
                    f"from_generator: output_shapes {shapes!r} does not match the structure of "
                    f"output_types {types!r}"
                ) from err
            return
        if not is_shape(s):
            raise TypeError(f"from_generator: {s!r} in output_shapes is not a shape (ints/None)")
        out.append(tuple(s))

    walk(types, shapes)
    return out


def _conform(element: Any, signature: Any, index: int) -> Any:
    """``element`` converted to the signature's dtypes, its shapes checked."""
    if isinstance(signature, tuple) and isinstance(element, list):
        element = tuple(element)
    if not same_structure(signature, element):
        raise TypeError(
            f"from_generator: element {index} has structure {structure_text(element)!r}; "
            f"the output signature expects {structure_text(signature)!r}"
        )
    specs = iter([s for _, s in flatten_with_paths(signature)])

    def convert(v: Any) -> Any:
        spec = next(specs)
        try:
            a = np.asarray(v, dtype=spec.dtype)
        except (TypeError, ValueError) as err:
            raise TypeError(
                f"from_generator: element {index} has {v!r}, which cannot be converted to "
                f"{spec.dtype}"
            ) from err
        if not isinstance(spec, _AnyShapeSpec) and not spec.is_compatible_with(a):
            raise ValueError(
                f"from_generator: element {index} has shape {a.shape}; the output signature "
                f"expects {spec.shape}"
            )
        return a[()] if a.ndim == 0 else a

    return map_structure(convert, _pack_as(signature, element))


def _pack_as(signature: Any, element: Any) -> Any:
    if isinstance(signature, tuple):
        parts = [_pack_as(s, e) for s, e in zip(signature, element, strict=True)]
        return type(signature)(*parts) if hasattr(signature, "_fields") else tuple(parts)
    if isinstance(signature, Mapping):
        return {k: _pack_as(signature[k], element[k]) for k in signature}
    return element


@register_node
class FileListDataset(Dataset):
    """File names (str): the source of ``list_files`` and ``from_files``.

    ``files`` is the sorted (``list_files``) or given (``from_files``) order;
    with ``shuffle`` (kept as ``shuffle_files``: an attribute named ``shuffle``
    would hide the :meth:`Dataset.shuffle` method) every iteration yields them
    in a permutation drawn as for ``shuffle(len(files), seed)``.

    Example:
        >>> FileListDataset(("b.npy", "a.npy")).files
        ('b.npy', 'a.npy')
    """

    releases_gil = False  # file names only; the readers are FileReaderDataset

    def __init__(
        self, files: Sequence[str], shuffle: bool = False, seed: int | None = None
    ) -> None:
        super().__init__(None)
        self.files = tuple(to_path(f, "FileListDataset") for f in files)
        self.shuffle_files = bool(shuffle)
        self.seed = check_seed(seed, "list_files")
        # without a seed, hd.utils.set_random_seed's stream gives one (the same on every worker)
        self.seed_from_stream = (
            self.shuffle_files and self.seed is None and get_random_seed() is not None
        )
        self._seed_used = next_seed() if self.seed_from_stream else self.seed
        self._epochs = EpochCounter()

    def _iter(self) -> Generator[str, None, None]:
        if not self.shuffle_files:
            yield from self.files
            return
        rng = epoch_rng(self._seed_used, True, self._epochs)
        for i in rng.permutation(len(self.files)):
            yield self.files[i]

    def cardinality(self) -> int:
        return len(self.files)

    def _compute_element_spec(self) -> Any:
        return TensorSpec((), np.dtype(np.str_))

    def _describe(self) -> str:
        return f"files={len(self.files)}, shuffle={self.shuffle_files}, seed={self.seed}"
