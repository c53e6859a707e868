"""``tf.nest``-like helpers over nested Python structures.

A structure is a list, a tuple (namedtuples included) or a mapping of
structures; anything else is a leaf: ``None``, numbers, strings, bytes, sets,
NumPy and CuPy arrays, and distributed values (which have a ``values``
attribute but are not containers). Mappings flatten in sorted-key order, as in
``tf.nest``, and are rebuilt with their own key order and type.

Example:
    >>> flatten({"b": [1, 2], "a": (3, None)})
    [3, None, 1, 2]
    >>> map_structure(lambda x, y: x + y, {"a": [1, 2]}, {"a": [10, 20]})
    {'a': [11, 22]}
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from hpcdist.cluster.envparse import short


def is_nested(x: Any) -> bool:
    """Whether ``x`` is a list, tuple or mapping (a structure rather than a leaf).

    Example:
        >>> is_nested([1]), is_nested({"a": 1}), is_nested("ab"), is_nested(None)
        (True, True, False, False)
    """
    return isinstance(x, (list, tuple, Mapping))


def _is_namedtuple(x: Any) -> bool:
    return isinstance(x, tuple) and isinstance(getattr(type(x), "_fields", None), tuple)


def _sorted_keys(m: Mapping[Any, Any]) -> list[Any]:
    try:
        return sorted(m)
    except TypeError as e:
        raise TypeError(
            f"nest flattens a mapping in sorted-key order, but the keys of {short(m)} cannot be "
            f"sorted ({e}); use keys of one sortable type, e.g. all strings"
        ) from None


def _children(x: Any) -> list[Any]:
    return [x[k] for k in _sorted_keys(x)] if isinstance(x, Mapping) else list(x)


def _rebuild(instance: Any, values: list[Any]) -> Any:
    """A container like ``instance`` holding ``values`` (in flattening order)."""
    if isinstance(instance, Mapping):
        by_key = dict(zip(_sorted_keys(instance), values, strict=True))
        pairs = [(k, by_key[k]) for k in instance]
        if isinstance(instance, defaultdict):
            dd_type: type[defaultdict[Any, Any]] = type(instance)
            return dd_type(instance.default_factory, pairs)
        mapping_type: Callable[[list[tuple[Any, Any]]], Any] = type(instance)  # dict-like
        return mapping_type(pairs)
    if _is_namedtuple(instance):
        return type(instance)(*values)
    return type(instance)(values)


def _flatten_into(x: Any, out: list[Any]) -> None:
    if is_nested(x):
        for child in _children(x):
            _flatten_into(child, out)
    else:
        out.append(x)


def flatten(structure: Any) -> list[Any]:
    """The leaves of ``structure``, depth first; a leaf flattens to ``[leaf]``.

    Example:
        >>> flatten([1, (2, {"y": 4, "x": 3})]), flatten(None)
        ([1, 2, 3, 4], [None])
    """
    out: list[Any] = []
    _flatten_into(structure, out)
    return out


def _pack(x: Any, leaves: Iterator[Any]) -> Any:
    if not is_nested(x):
        return next(leaves)
    return _rebuild(x, [_pack(child, leaves) for child in _children(x)])


def pack_sequence_as(structure: Any, flat_sequence: list[Any] | tuple[Any, ...]) -> Any:
    """``flat_sequence`` put back into the shape of ``structure`` (undoes :func:`flatten`).

    Example:
        >>> pack_sequence_as({"b": 0, "a": [0, 0]}, [1, 2, 3])
        {'b': 3, 'a': [1, 2]}
    """
    if not isinstance(flat_sequence, (list, tuple)):
        raise TypeError(
            f"flat_sequence must be a list or tuple of leaves (as flatten gives); found "
            f"{type(flat_sequence).__name__} {short(flat_sequence)}"
        )
    wanted = len(flatten(structure))
    if wanted != len(flat_sequence):
        raise ValueError(
            f"cannot pack {len(flat_sequence)} values into a structure of {wanted} leaves; "
            f"structure: {short(structure, 200)}, flat_sequence: {short(flat_sequence, 200)}"
        )
    return _pack(structure, iter(flat_sequence))


def _same_type(a: Any, b: Any) -> bool:
    if type(a) is type(b):
        return True
    if _is_namedtuple(a) and _is_namedtuple(b):  # same name and fields count as the same
        return type(a).__name__ == type(b).__name__ and a._fields == b._fields
    both = (isinstance(a, list) and isinstance(b, list)) or (
        isinstance(a, Mapping) and isinstance(b, Mapping)
    )
    return both


def _difference(a: Any, b: Any, path: str, check_types: bool) -> tuple[type, str] | None:
    """The first way ``a`` and ``b`` differ, as (error type, text), or ``None``."""
    where = f" at {path}" if path else ""
    if is_nested(a) != is_nested(b):
        kinds = ["a structure" if is_nested(x) else "a leaf" for x in (a, b)]
        text = f"{where[1:] or 'at the top'}, the first is {kinds[0]} ({short(a)})"
        return ValueError, f"{text} and the second {kinds[1]} ({short(b)})"
    if not is_nested(a):
        return None
    if check_types and not _same_type(a, b):
        text = f"the types differ{where}: {type(a).__name__} and {type(b).__name__}"
        return TypeError, text
    if check_types and isinstance(a, Mapping) and isinstance(b, Mapping) and a.keys() != b.keys():
        only = [
            ", ".join(sorted(map(repr, x - y)))[:100] or "none"
            for x, y in ((set(a), set(b)), (set(b), set(a)))
        ]
        text = f"the mappings{where} have different keys (only in the first: {only[0]}; "
        return ValueError, f"{text}only in the second: {only[1]})"
    if len(a) != len(b):
        return ValueError, f"the lengths differ{where}: {len(a)} and {len(b)}"
    keys = _sorted_keys(a) if isinstance(a, Mapping) else range(len(a))
    for key, x, y in zip(keys, _children(a), _children(b), strict=True):
        found = _difference(x, y, f"{path}[{key!r}]", check_types)
        if found is not None:
            return found
    return None


def assert_same_structure(a: Any, b: Any, check_types: bool = True) -> None:
    """Raise unless ``a`` and ``b`` nest alike (with ``check_types``, also container types
    and mapping keys; namedtuples of the same name and fields, any two lists and any two
    mappings count as the same type). ``ValueError`` for a different shape, ``TypeError``
    for different types; the message shows both structures and where they differ.

    Example:
        >>> assert_same_structure([1, (2, 3)], ["a", ("b", "c")])
        >>> assert_same_structure([1, 2], (1, 2), check_types=False)
    """
    found = _difference(a, b, "", check_types)
    if found is not None:
        error, text = found
        raise error(
            f"the two structures do not have the same nested structure: {text}. "
            f"First structure: {short(a, 200)}. Second structure: {short(b, 200)}"
        )


def map_structure(fn: Callable[..., Any], *structures: Any, check_types: bool = True) -> Any:
    """``fn`` applied to the leaves of ``structures`` in step, shaped like the first one.

    Example:
        >>> map_structure(lambda x: x * 2, (1, [2, 3]))
        (2, [4, 6])
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable; found {short(fn)}")
    if not structures:
        raise TypeError("map_structure needs at least one structure besides fn")
    for other in structures[1:]:
        assert_same_structure(structures[0], other, check_types=check_types)
    flats = [flatten(s) for s in structures]
    return pack_sequence_as(structures[0], [fn(*leaves) for leaves in zip(*flats, strict=True)])


__all__ = ["assert_same_structure", "flatten", "is_nested", "map_structure", "pack_sequence_as"]
