"""The array boundary without any framework installed: DLPack and array-interface objects."""

from __future__ import annotations

import numpy as np

from hpcdist import arrays
from hpcdist.collectives import Collectives
from hpcdist.runtime import mpi


class Interface:
    """An array of another library, speaking only ``__array_interface__``."""

    def __init__(self, a: np.ndarray) -> None:
        self._a = a
        self.__array_interface__ = a.__array_interface__


class DLPackOnly:
    """An array of another library, speaking only DLPack."""

    def __init__(self, a: np.ndarray) -> None:
        self._a = a

    def __dlpack__(self, **kwargs):
        return self._a.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self._a.__dlpack_device__()


class FakeDevice:
    """Host memory posing as a GPU array: the engine's device path takes it, not the boundary."""

    @property
    def __cuda_array_interface__(self):
        return {"shape": (1,), "typestr": "<f4", "data": (0, False), "version": 3}


def test_what_counts_as_foreign() -> None:
    a = np.arange(3.0)
    assert not arrays.is_foreign(a) and not arrays.is_foreign(np.float32(1))
    assert not arrays.is_foreign(1.0) and not arrays.is_foreign([a]) and not arrays.is_foreign(None)
    assert arrays.is_foreign(Interface(a)) and arrays.is_foreign(DLPackOnly(a))
    assert not arrays.is_foreign(FakeDevice())
    assert arrays.has_foreign([a, DLPackOnly(a)]) and not arrays.has_foreign([a, a])


def test_imports_share_memory() -> None:
    a = np.arange(4.0)
    for wrapped in (Interface(a), DLPackOnly(a)):
        view = arrays.import_array(wrapped)
        assert isinstance(view, np.ndarray) and view.ctypes.data == a.ctypes.data
    assert arrays.import_array(a) is a
    assert arrays.export_like(Interface(a), a) is a  # unknown types: results stay NumPy


def test_engine_takes_them_and_writes_out_in_place() -> None:
    c = Collectives(mpi().COMM_SELF)
    a, b = np.arange(3.0), np.zeros(3)
    (out,) = c.allreduce([DLPackOnly(a)], "SUM")
    assert isinstance(out, np.ndarray) and out.tolist() == [0.0, 1.0, 2.0]
    assert out.ctypes.data != a.ctypes.data  # a new result, the input untouched
    c.allreduce([Interface(a)], "SUM", out=[Interface(b)])
    assert b.tolist() == [0.0, 1.0, 2.0]
