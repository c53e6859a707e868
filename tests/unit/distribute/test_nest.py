"""tf.nest-like helpers (hpcdist.distribute.nest): flatten, pack, map, structure checks."""

from __future__ import annotations

from collections import OrderedDict, defaultdict, namedtuple
from typing import Any, NamedTuple

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpcdist.distribute.nest import (
    assert_same_structure,
    flatten,
    is_nested,
    map_structure,
    pack_sequence_as,
)

Point = namedtuple("Point", ["x", "y"])


class Pair(NamedTuple):
    first: Any
    second: Any


class MyList(list):
    pass


class MyTuple(tuple):
    __slots__ = ()


class PerReplicaLike:
    """A distributed-value stand-in: has ``values`` and indexes like a sequence."""

    def __init__(self, values: tuple[Any, ...]) -> None:
        self.values = values

    def __getitem__(self, i: int) -> Any:
        return self.values[i]

    def __len__(self) -> int:
        return len(self.values)


def same(a: Any, b: Any) -> bool:
    """Equal values and equal container types all the way down (and the same key order)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def structures(leaves: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    keys = st.text(alphabet="abcdefgh", min_size=1, max_size=3)
    return st.recursive(
        leaves,
        lambda children: st.one_of(
            st.lists(children, max_size=4),
            st.lists(children, max_size=4).map(tuple),
            st.dictionaries(keys, children, max_size=4),
            st.dictionaries(st.integers(-5, 5), children, max_size=3).map(OrderedDict),
            st.builds(Point, children, children),
            st.builds(Pair, children, children),
        ),
        max_leaves=20,
    )


@settings(deadline=None, max_examples=100)
@given(structures(st.integers()))
def test_pack_undoes_flatten(s: Any) -> None:
    flat = flatten(s)
    assert all(isinstance(x, int) for x in flat)
    assert same(pack_sequence_as(s, flat), s)
    assert same(pack_sequence_as(s, tuple(flat)), s)


@settings(deadline=None, max_examples=100)
@given(structures(st.integers()))
def test_map_structure_identity_and_order(s: Any) -> None:
    assert same(map_structure(lambda x: x, s), s)
    doubled = map_structure(lambda x: 2 * x, s)
    assert flatten(doubled) == [2 * x for x in flatten(s)]
    assert_same_structure(s, doubled)
    assert same(map_structure(lambda a, b: a - b, doubled, s), s)


@settings(deadline=None, max_examples=100)
@given(structures(st.integers()))
def test_renumbered_leaves_land_where_they_came_from(s: Any) -> None:
    numbered = pack_sequence_as(s, list(range(len(flatten(s)))))
    assert flatten(numbered) == list(range(len(flatten(s))))
    assert_same_structure(s, numbered)


def test_flatten_order_and_leaves() -> None:
    assert flatten({"b": 1, "a": 2, "c": [3, (4, 5)]}) == [2, 1, 3, 4, 5]
    assert flatten(Point(x=[1, 2], y={"k": 3})) == [1, 2, 3]
    assert flatten(OrderedDict([(2, "b"), (1, "a")])) == ["a", "b"]  # sorted keys, as tf.nest
    assert flatten([]) == [] and flatten({}) == [] and flatten(()) == []
    assert flatten([[], {}, ()]) == []
    assert flatten(None) == [None] and flatten([None, (None,)]) == [None, None]
    assert flatten(7) == [7]


@pytest.mark.parametrize(
    "leaf",
    [
        "abc",
        b"abc",
        bytearray(b"ab"),
        {1, 2},
        frozenset(),
        np.arange(3),
        np.float32(1.5),
        range(3),
        PerReplicaLike((1, 2)),
        {1: 2}.keys(),
    ],
    ids=lambda x: type(x).__name__,
)
def test_leaves_are_not_nested(leaf: Any) -> None:
    assert not is_nested(leaf)
    assert flatten(leaf)[0] is leaf and len(flatten(leaf)) == 1
    assert pack_sequence_as(leaf, ["new"]) == "new"
    assert flatten([leaf, (leaf,)]) == [leaf, leaf]


def test_is_nested() -> None:
    for x in ([], (), {}, Point(1, 2), Pair(1, 2), OrderedDict(), MyList(), MyTuple()):
        assert is_nested(x)


def test_pack_restores_container_types() -> None:
    s = {"z": Point(1, [2, 3]), "a": Pair(MyList([4]), MyTuple((5, 6)))}
    packed = pack_sequence_as(s, [10, 20, 30, 40, 50, 60])
    assert list(packed) == ["z", "a"]  # the mapping keeps its own key order
    assert packed["a"] == Pair(MyList([10]), MyTuple((20, 30)))
    assert type(packed["a"]) is Pair and type(packed["a"].first) is MyList
    assert type(packed["a"].second) is MyTuple
    assert packed["z"] == Point(40, [50, 60]) and type(packed["z"]) is Point


def test_pack_keeps_defaultdict_factory_and_ordered_dict() -> None:
    d = defaultdict(list, {"b": 1, "a": 2})
    packed = pack_sequence_as(d, ["A", "B"])
    assert type(packed) is defaultdict and packed.default_factory is list
    assert dict(packed) == {"b": "B", "a": "A"} and list(packed) == ["b", "a"]
    od = OrderedDict([("y", 0), ("x", 0)])
    assert pack_sequence_as(od, [1, 2]) == OrderedDict([("y", 2), ("x", 1)])


def test_pack_errors() -> None:
    with pytest.raises(ValueError, match="cannot pack 2 values into a structure of 3 leaves"):
        pack_sequence_as([1, (2, 3)], [1, 2])
    with pytest.raises(ValueError, match="cannot pack 2 values into a structure of 1 leaves"):
        pack_sequence_as(5, [1, 2])
    with pytest.raises(ValueError, match="of 0 leaves"):
        pack_sequence_as([], [1])
    with pytest.raises(TypeError, match="list or tuple of leaves"):
        pack_sequence_as([1, 2], np.array([1, 2]))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="list or tuple of leaves"):
        pack_sequence_as(1, 1)  # type: ignore[arg-type]


def test_unsortable_keys() -> None:
    with pytest.raises(TypeError, match="sorted-key order"):
        flatten({1: "a", "b": 2})


@pytest.mark.parametrize(
    ("a", "b", "error", "text"),
    [
        ([1, [2]], [1, 2], ValueError, "at [1], the first is a structure"),
        (1, [1], ValueError, "at the top, the first is a leaf"),
        ([1, 2], [1, 2, 3], ValueError, "the lengths differ: 2 and 3"),
        ({"a": 1, "c": 2}, {"b": 1, "c": 2}, ValueError, "only in the first: 'a'"),
        ({"a": [1]}, {"a": (1,)}, TypeError, "the types differ at ['a']: list and tuple"),
        ([1, 2], (1, 2), TypeError, "list and tuple"),
        (Point(1, 2), (1, 2), TypeError, "Point and tuple"),
        (Point(1, 2), Pair(1, 2), TypeError, "Point and Pair"),
        ([1, {"k": [1, 2]}], [1, {"k": [1]}], ValueError, "at [1]['k']"),
    ],
)
def test_assert_same_structure_rejects(a: Any, b: Any, error: type, text: str) -> None:
    with pytest.raises(error) as info:
        assert_same_structure(a, b)
    message = str(info.value)
    assert text in message
    assert f"First structure: {a!r}" in message and f"Second structure: {b!r}" in message


def test_assert_same_structure_accepts() -> None:
    assert_same_structure([1, (2, {"a": 3})], ["x", ("y", {"a": None})])
    assert_same_structure(5, "leaf")
    assert_same_structure(Point(1, 2), namedtuple("Point", ["x", "y"])(3, 4))
    assert_same_structure([1], MyList([2]))  # any two lists
    assert_same_structure({"a": 1}, OrderedDict(a=2))  # any two mappings
    assert_same_structure([1, 2], (1, 2), check_types=False)
    assert_same_structure({"a": 1}, {"b": 2}, check_types=False)  # keys checked with the types
    with pytest.raises(ValueError):
        assert_same_structure([1, 2], (1,), check_types=False)


def test_leaf_against_array_is_a_leaf_comparison() -> None:
    with pytest.raises(ValueError, match="the first is a leaf"):
        assert_same_structure(np.zeros(3), [1, 2, 3], check_types=False)


def test_map_structure_several_structures() -> None:
    got = map_structure(lambda a, b, c: a + b + c, {"x": [1, 2]}, {"x": [10, 20]}, {"x": [5, 5]})
    assert got == {"x": [16, 27]}
    assert map_structure(lambda x: x, None) is None
    assert map_structure(str, []) == []
    # with check_types=False the result takes the first structure's types
    assert same(map_structure(lambda a, b: a * b, [2, 3], (4, 5), check_types=False), [8, 15])


def test_map_structure_errors() -> None:
    with pytest.raises(ValueError, match="the lengths differ"):
        map_structure(lambda a, b: a, [1, 2], [1])
    with pytest.raises(TypeError, match="list and tuple"):
        map_structure(lambda a, b: a, [1, 2], (1, 2))
    with pytest.raises(TypeError, match="at least one structure"):
        map_structure(lambda: 1)
    with pytest.raises(TypeError, match="fn must be callable"):
        map_structure(3, [1])  # type: ignore[arg-type]


def test_map_structure_calls_fn_in_flatten_order() -> None:
    seen: list[Any] = []
    map_structure(seen.append, {"b": 2, "a": [1, None]})
    assert seen == [1, None, 2]
