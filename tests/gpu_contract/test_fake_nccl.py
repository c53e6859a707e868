"""The fake NCCL of the CPU tests (``tests/support/fake_nccl.py``) against the installed
``cupy.cuda.nccl``: same ids, constants, argument checks and method parameters, so the two
cannot drift apart unnoticed. Also hpcdist's unique-id encoding for CuPy 14 and 13."""

from __future__ import annotations

import inspect
import re

import numpy as np
import pytest

from hpcdist.collectives import nccl as hnccl
from tests.support import fake_nccl

real = pytest.importorskip("cupy.cuda.nccl", reason="CuPy with NCCL is the gpu extra")
if not getattr(real, "available", False):  # pragma: no cover - the gpu extra brings NCCL
    pytest.skip("cupy.cuda.nccl has no NCCL library (install nvidia-nccl-cu13)",
                allow_module_level=True)

METHODS = ["allReduce", "reduce", "broadcast", "bcast", "reduceScatter", "allGather", "destroy",
           "rank_id", "size"]


def test_unique_ids_have_the_real_type_and_size():
    uid = real.get_unique_id()
    assert type(fake_nccl.get_unique_id()) is type(uid) is bytes
    assert len(fake_nccl.get_unique_id()) == len(uid) == hnccl.UNIQUE_ID_BYTES


def test_constants_match_the_real_module():
    names = [n for n in dir(fake_nccl) if n.startswith("NCCL_")]
    assert len(names) >= 14
    for name in names:
        assert getattr(fake_nccl, name) == getattr(real, name), name
    for name in [*hnccl.NCCL_DTYPE_NAMES.values(), *hnccl.NCCL_OP_NAMES.values()]:
        assert getattr(real, name) == getattr(fake_nccl, name), name
    hnccl.set_nccl_provider(real)  # the real module passes hpcdist's own provider check
    hnccl.set_nccl_provider(None)


def _outcome(make, *args):
    try:
        make(*args)
    except Exception as exc:  # noqa: BLE001 - the exception's kind is what is compared
        if isinstance(exc, TypeError | ValueError):
            return type(exc).__name__
        return "accepted"  # passed the argument checks, failed later (no GPU / no MPI group)
    return "accepted"


@pytest.mark.parametrize("make_id", [
    lambda u: u, lambda u: tuple(u), lambda u: bytearray(u), lambda u: list(u),
    lambda u: u[:10], lambda u: u + b"x", lambda u: None, lambda u: np.frombuffer(u, np.uint8),
], ids=["bytes", "tuple", "bytearray", "list", "short", "long", "none", "ndarray"])
def test_communicator_arguments_are_checked_as_the_real_one_checks_them(make_id):
    uid = real.get_unique_id()
    commid = make_id(uid)
    want = _outcome(real.NcclCommunicator, 1, commid, 0)
    assert _outcome(fake_nccl.NcclCommunicator, 1, commid, 0) == want


def _real_parameters(method: str) -> list[str]:
    """Parameter names from the first line of CuPy's docstring, e.g.
    ``NcclCommunicator.allReduce(self, intptr_t sendbuf, ..., intptr_t stream)``."""
    doc = getattr(real.NcclCommunicator, method).__doc__ or ""
    m = re.match(rf"\s*NcclCommunicator\.{method}\((.*?)\)", doc)
    assert m, f"cannot read the signature of {method} from {doc[:80]!r}"
    return [p.split()[-1].split("=")[0] for p in m.group(1).split(",") if p.strip()]


@pytest.mark.parametrize("method", METHODS)
def test_communicator_methods_take_the_real_parameters(method):
    want = [p for p in _real_parameters(method) if p != "self"]
    for cls in (fake_nccl.NcclCommunicator, fake_nccl._LocalCommunicator):
        got = [p for p in inspect.signature(getattr(cls, method)).parameters if p != "self"]
        assert got == want, f"{cls.__name__}.{method}{got} != cupy's {want}"


def test_module_functions_exist_in_both():
    for name in ("get_unique_id", "get_version", "groupStart", "groupEnd", "NcclCommunicator"):
        assert callable(getattr(real, name)) and callable(getattr(fake_nccl, name)), name
    assert callable(real.NcclCommunicator.initAll) and callable(fake_nccl.NcclCommunicator.initAll)


@pytest.mark.parametrize("form", ["bytes", "tuple"])
def test_hpcdist_carries_both_id_forms_exactly(form):
    raw = real.get_unique_id()
    uid = raw if form == "bytes" else tuple(int(v) for v in np.frombuffer(raw, np.int8))
    encoded = hnccl.encode_unique_id(uid)
    assert encoded.dtype == np.uint8 and encoded.size == 1 + 128
    assert encoded[1:].tobytes() == raw  # the 128 bytes themselves, in order
    back = hnccl.decode_unique_id(encoded.copy())
    assert back == uid and type(back) is type(uid)
    with pytest.raises(ValueError, match="128"):
        hnccl.encode_unique_id(raw[:-1])
    with pytest.raises(TypeError, match="bytes"):
        hnccl.encode_unique_id(list(raw))
