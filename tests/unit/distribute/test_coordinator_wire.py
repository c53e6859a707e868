"""The coordinator's wire format (no pickle), rebuilt errors, per-worker values (one process)."""

from __future__ import annotations

import functools
from collections import namedtuple

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpcdist.distribute.coordinator import wire
from hpcdist.distribute.coordinator.remote_value import (
    PerWorkerDataset,
    PerWorkerValues,
    RemoteValue,
    check_arguments,
    check_dataset_fn,
    resolve_per_worker,
)
from hpcdist.distribute.values import Mirrored, PerReplica

Point = namedtuple("Point", ["x", "y"])


class CustomError(Exception):
    """A user error type the chief can make again (both sides run the same program)."""


class KeywordOnlyError(Exception):
    def __init__(self, *, code: int) -> None:
        super().__init__(f"code {code}")


def roundtrip(value):
    ok, out = wire.decode_message(wire.encode_message(True, value))
    assert ok is True
    return out


def same(a, b) -> bool:
    """Equal in value AND type, recursively (arrays: dtype, shape and bytes)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
    if isinstance(a, (PerReplica, Mirrored)):
        return same(a.values, b.values)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, float) and a != a:
        return b != b
    return a == b


@pytest.mark.parametrize(
    "dtype",
    [
        "float16",
        "float32",
        "float64",
        "int32",
        "int64",
        "uint8",
        "bool",
        "complex64",
        ">f8",
        "<U5",
        "S3",
        "datetime64[s]",
    ],
)
@pytest.mark.parametrize("shape", [(), (0,), (3,), (2, 3), (4, 0, 2)])
def test_arrays_keep_dtype_shape_and_bytes(dtype, shape):
    rng = np.random.default_rng(0)
    raw = rng.integers(0, 100, size=shape)
    x = raw.astype(dtype) if np.dtype(dtype).kind not in "US" else raw.astype(str).astype(dtype)
    out = roundtrip(x)
    assert out.dtype == np.dtype(dtype) and out.shape == shape
    assert out.tobytes() == x.tobytes() and out.flags.writeable


def test_non_contiguous_views_and_numpy_scalars():
    base = np.arange(24, dtype=np.float64).reshape(4, 6)
    view = base[::2, 1::3]
    out = roundtrip(view)
    np.testing.assert_array_equal(out, view)
    assert out.flags.c_contiguous
    for s in (
        np.float32(1.5),
        np.float64(2),
        np.int64(-3),
        np.bool_(True),
        np.complex128(1 - 2j),
        np.str_("u"),
    ):
        got = roundtrip(s)
        assert type(got) is type(s) and got == s


def test_nests_python_scalars_and_distributed_values_roundtrip():
    value = {
        "a": [1, 2.5, True, None, "s", b"\x00\xffbytes", 3 + 4j],
        "t": (np.arange(3), {"inner": np.float32(2)}),
        7: Point(x=np.ones(2), y="why"),
        ("k", 1): PerReplica((np.float32(1), np.float32(2))),
        "m": Mirrored([np.zeros(1)]),
        "big": 2**80,
        "nan": float("nan"),
    }
    out = roundtrip(value)
    assert same(out, value)
    assert isinstance(out[7], Point) and isinstance(out[("k", 1)], PerReplica)


def test_cupy_like_arrays_come_back_as_numpy(monkeypatch):
    # a stand-in whose type lives in a module named cupy.*: to_host calls .get()
    fake_type = type("ndarray", (), {"__module__": "cupy._core", "get": lambda self: np.ones(2)})
    out = roundtrip({"g": fake_type()})
    np.testing.assert_array_equal(out["g"], np.ones(2))


leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False),
    st.text(max_size=5),
    st.lists(st.floats(allow_nan=False, width=32), max_size=4).map(
        lambda v: np.asarray(v, np.float32)
    ),
    st.integers(-5, 5).map(np.int32),
)
nests = st.recursive(
    leaves,
    lambda kids: st.one_of(
        st.lists(kids, max_size=3),
        st.lists(kids, max_size=3).map(tuple),
        st.dictionaries(st.text(max_size=3), kids, max_size=3),
    ),
    max_leaves=12,
)


@settings(max_examples=60, deadline=None)
@given(nests)
def test_any_nest_of_supported_leaves_roundtrips(value):
    assert same(roundtrip(value), value)


class Opaque:
    pass


@pytest.mark.parametrize(
    ("value", "where"),
    [
        (Opaque(), "the result is a"),
        ({"a": [1, Opaque()]}, "the result['a'][1] is a"),
        (np.array([object()]), "dtype object"),
        (np.zeros(2, dtype=[("a", "i4")]), "cannot travel without pickle"),
        ({1, 2}, "is a builtins.set"),
    ],
)
def test_unsupported_values_raise_type_error_naming_the_part(value, where):
    with pytest.raises(TypeError, match="cannot|dtype") as info:
        wire.encode_message(True, value)
    assert where in str(info.value)


def test_a_structure_that_contains_itself_is_refused():
    loop: list = [1]
    loop.append(loop)
    with pytest.raises(TypeError, match="contains itself"):
        wire.encode_message(True, loop)


def test_a_buffer_that_is_no_message_is_refused():
    with pytest.raises(ValueError, match="not a coordinator message"):
        wire.decode_message(np.frombuffer(b"garbage-garbage", np.uint8))


def _raised(exc: BaseException) -> BaseException:
    try:
        raise exc
    except BaseException as e:
        return e


def test_errors_come_back_with_type_arguments_and_remote_traceback():
    info = wire.error_info(_raised(ValueError("boom", 7)), closure=4, worker=1, name="step")
    ok, back = wire.decode_message(wire.encode_message(False, info))
    assert ok is False and back == info
    exc = wire.rebuild_error(back)
    assert type(exc) is ValueError and exc.args == ("boom", 7)
    assert exc.closure == 4 and exc.worker == 1
    assert "test_coordinator_wire.py" in exc.remote_traceback and "boom" in exc.remote_traceback
    if hasattr(exc, "__notes__"):
        assert "closure 4" in exc.__notes__[0] and "worker 1" in exc.__notes__[0]
    # each rebuild is a fresh exception (raising one twice would stack tracebacks)
    assert wire.rebuild_error(back) is not exc


def test_user_error_types_are_rebuilt_and_unknown_ones_become_remote_errors():
    exc = wire.rebuild_error(wire.error_info(CustomError("mine")))
    assert type(exc) is CustomError and str(exc) == "mine"
    exc = wire.rebuild_error(wire.error_info(KeywordOnlyError(code=3)))
    assert type(exc) is wire.RemoteError and "KeywordOnlyError: code 3" in str(exc)
    info = wire.error_info(RuntimeError("x"))
    info["module"] = "no_such_module_here"
    assert type(wire.rebuild_error(info)) is wire.RemoteError
    info = wire.error_info(RuntimeError("x"))
    info["qualname"] = "SystemExit"  # never made again: not an Exception subclass
    assert type(wire.rebuild_error(info)) is wire.RemoteError


def test_stop_iteration_becomes_out_of_range():
    exc = wire.rebuild_error(wire.error_info(_raised(StopIteration()), name="take"))
    assert type(exc) is wire.OutOfRangeError
    assert "take called next() on an exhausted iterator" in str(exc)


def test_name_hash_follows_the_qualified_name():
    def f():
        return 1

    def g():
        return 1

    assert wire.name_hash(f) == wire.name_hash(f) != wire.name_hash(g)
    assert wire.qualname_of(f).endswith("test_name_hash_follows_the_qualified_name.<locals>.f")
    assert wire.qualname_of(functools.partial(f)) == "partial"
    assert 0 <= wire.name_hash(f) < 2**32


def test_backoff_sleeps_only_after_the_spins(monkeypatch):
    slept: list[float] = []
    monkeypatch.setattr(wire.time, "sleep", slept.append)
    b = wire.Backoff(spins=5, first=0.002, cap=0.004)
    for _ in range(5):
        b.idle()
    assert slept == []  # the spins never sleep
    for _ in range(3):
        b.idle()
    assert slept == [0.002, 0.004, 0.004]  # then doubling, capped
    b.reset()
    for _ in range(6):
        b.idle()
    assert slept[3:] == [0.002]  # after an event: spin again, then sleep from the start


class _Req:
    def __init__(self, polls: int) -> None:
        self.polls = polls

    def Test(self) -> bool:
        self.polls -= 1
        return self.polls <= 0


def test_wait_polls_until_the_request_completes():
    req = _Req(40)
    wire.wait(req)
    assert req.polls == 0


def test_per_worker_values_resolve_to_the_workers_component():
    pw = PerWorkerValues(("w0", "w1", "w2"))
    args = (pw, [1, {"k": pw}], Point(pw, 2))
    assert resolve_per_worker(args, 2) == ("w2", [1, {"k": "w2"}], Point("w2", 2))
    check_arguments(args, {"kw": pw}, 3)
    with pytest.raises(ValueError, match="of 3 values was passed to schedule; expected one"):
        check_arguments(args, {}, 2)
    rv = RemoteValue(owner=None, index=0, name="f")
    with pytest.raises(TypeError, match="cannot take a RemoteValue"):
        check_arguments(([rv],), {}, 3)


def test_per_worker_dataset_builds_lazily_on_its_worker_only():
    calls = []

    def dataset_fn():
        calls.append(1)
        return [10, 11, 12]

    chief = PerWorkerDataset(2, None, dataset_fn)
    it = iter(chief)
    with pytest.raises(TypeError, match="inside a function given to coordinator.schedule"):
        next(it)
    assert calls == []

    worker = PerWorkerDataset(2, 1, dataset_fn)
    it = iter(worker)
    assert calls == []  # nothing built until a scheduled function reads it
    local = resolve_per_worker(it, 1)
    assert [next(local), local.get_next()] == [10, 11]
    assert calls == [1]
    again = resolve_per_worker(iter(worker), 1)
    assert next(again) == 10 and calls == [1]  # a new epoch, the same dataset
    assert next(local) == 12
    with pytest.raises(StopIteration):
        next(local)
    with pytest.raises(TypeError, match="no get_next_as_optional"):
        again.get_next_as_optional()
    assert "held by that worker" in repr(it.values[0])


def test_dataset_fn_must_be_callable_or_a_dataset():
    check_dataset_fn(lambda: [1])
    check_dataset_fn([1, 2])
    with pytest.raises(TypeError, match="function of no arguments"):
        check_dataset_fn(3)
    bad = iter(PerWorkerDataset(1, 0, lambda: 5)).values[0]
    with pytest.raises(TypeError, match="dataset_fn returned a int"):
        next(bad)


def test_a_cancelled_value_raises_cancelled_error_when_rebuilt():
    rv = RemoteValue(owner=None, index=3, name="step")
    rv._cancel("an earlier scheduled function failed")
    exc = wire.rebuild_error(rv._error)
    assert type(exc) is wire.CancelledError
    assert "'step' (closure 3) was cancelled: an earlier" in str(exc)
    assert "cancelled" in repr(rv)
