"""CommunicationOptions and CommunicationImplementation: validation, merge, repr, equality."""

from __future__ import annotations

import pytest

from hpcdist.collectives import (
    CollectiveCommunication,
    CommunicationImplementation,
    CommunicationOptions,
)

Impl = CommunicationImplementation


def test_defaults_are_tf_defaults():
    opts = CommunicationOptions()
    assert opts.bytes_per_pack == 0
    assert opts.timeout_seconds is None
    assert opts.implementation is Impl.AUTO


def test_old_tf_name_is_the_same_enum():
    assert CollectiveCommunication is CommunicationImplementation
    assert CollectiveCommunication.RING is Impl.RING


@pytest.mark.parametrize("name", ["auto", "RING", "Nccl", " mpi ", "shm"])
def test_implementation_from_name_in_any_case(name):
    impl = Impl.from_any(name)
    assert impl.name == name.strip().upper()
    assert Impl.from_any(impl) is impl
    assert CommunicationOptions(implementation=name).implementation is impl


@pytest.mark.parametrize("bad", ["gloo", "", 3, None, "RING_X"])
def test_implementation_rejects_unknown_values(bad):
    with pytest.raises(ValueError, match="expected one of AUTO, RING, NCCL, MPI, SHM"):
        Impl.from_any(bad)
    with pytest.raises(ValueError):
        CommunicationOptions(implementation=bad)


def test_bytes_per_pack_validation():
    assert CommunicationOptions(bytes_per_pack=4096).bytes_per_pack == 4096
    with pytest.raises(ValueError, match=">= 0"):
        CommunicationOptions(bytes_per_pack=-1)
    for bad in (1.5, "10", True, None):
        with pytest.raises(TypeError, match="bytes_per_pack"):
            CommunicationOptions(bytes_per_pack=bad)


def test_timeout_validation():
    assert CommunicationOptions(timeout_seconds=2).timeout_seconds == 2
    assert CommunicationOptions(timeout_seconds=0.25).timeout_seconds == 0.25
    for bad in (0, -1, float("nan"), float("inf"), True, "5"):
        with pytest.raises(ValueError, match="timeout_seconds"):
            CommunicationOptions(timeout_seconds=bad)


def test_options_are_read_only_and_hashable():
    opts = CommunicationOptions(bytes_per_pack=8, timeout_seconds=1.0, implementation="ring")
    with pytest.raises(AttributeError):
        opts.timeout_seconds = 5  # type: ignore[misc]
    same = CommunicationOptions(8, 1.0, Impl.RING)
    assert opts == same and hash(opts) == hash(same)
    assert opts != CommunicationOptions(8, 1.0, Impl.MPI)
    assert opts != "CommunicationOptions"
    assert len({opts, same, CommunicationOptions()}) == 2


def test_repr_names_every_field():
    opts = CommunicationOptions(bytes_per_pack=1024, timeout_seconds=3.5, implementation="nccl")
    assert repr(opts) == (
        "CommunicationOptions(bytes_per_pack=1024, timeout_seconds=3.5, implementation=NCCL)"
    )


def test_merge_non_default_fields_of_other_win():
    strategy = CommunicationOptions(bytes_per_pack=1024, timeout_seconds=30, implementation="ring")
    call = CommunicationOptions(timeout_seconds=2)
    merged = strategy.merge(call)
    assert merged == CommunicationOptions(1024, 2, Impl.RING)
    assert strategy.merge(CommunicationOptions(implementation="nccl")).implementation is Impl.NCCL
    assert strategy.merge(CommunicationOptions(bytes_per_pack=7)).bytes_per_pack == 7
    # Default fields of the call leave the strategy's values alone.
    assert strategy.merge(CommunicationOptions()) == strategy
    assert CommunicationOptions().merge(strategy) == strategy
    assert strategy.merge(None) is strategy
    # merge never changes either side
    assert strategy == CommunicationOptions(1024, 30, Impl.RING)
    assert call == CommunicationOptions(timeout_seconds=2)


def test_merge_rejects_other_types():
    with pytest.raises(TypeError, match="CommunicationOptions"):
        CommunicationOptions().merge({"timeout_seconds": 3})


def test_mpi_message_bytes_is_its_own_option():
    opts = CommunicationOptions(bytes_per_pack=1024, mpi_message_bytes=4096)
    assert (opts.bytes_per_pack, opts.mpi_message_bytes) == (1024, 4096)
    assert CommunicationOptions().mpi_message_bytes == 0
    assert repr(opts).endswith("implementation=AUTO, mpi_message_bytes=4096)")
    assert opts != CommunicationOptions(bytes_per_pack=1024)
    base = CommunicationOptions(mpi_message_bytes=64)
    merged = base.merge(CommunicationOptions(timeout_seconds=3))
    assert merged.mpi_message_bytes == 64 and merged.timeout_seconds == 3
    assert opts.with_timeout(5) == CommunicationOptions(1024, 5, "auto", 4096)
    with pytest.raises(ValueError, match="mpi_message_bytes is -1"):
        CommunicationOptions(mpi_message_bytes=-1)
    with pytest.raises(TypeError, match="mpi_message_bytes"):
        CommunicationOptions(mpi_message_bytes=1.5)  # type: ignore[arg-type]
