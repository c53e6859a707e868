"""The algorithm registry's order, registration rules and the MPI band setting."""

from __future__ import annotations

import pytest

from hpcdist.collectives import CommunicationOptions, choice, registry
from hpcdist.collectives.options import CommunicationImplementation as CI


class _Never:
    name = "never"

    def applies(self, where):
        return False

    def allreduce(self, engine, items, layout, opts):
        raise AssertionError("never runs")


def _where(device, operation="allreduce", implementation=CI.AUTO, size=2, nccl=False):
    return registry.Where(
        None, CommunicationOptions(), implementation, size, nodes=1, largest_node=1,
        device=device, nccl=nccl, operation=operation,
    )


def test_default_order_each_kind_ending_with_a_fallback():
    names = [a.name for a in registry.registered()]
    assert names == [
        "copy", "nccl", "small", "mpi-direct", "shm", "hierarchical", "mpi-device", "staged",
        "mpi",
    ]
    algorithms = {a.name: a for a in registry.registered()}
    assert algorithms["mpi"].applies(_where(False))  # mpi: whatever the host call
    assert not algorithms["mpi"].applies(_where(True))
    assert algorithms["staged"].applies(_where(True, nccl=True))  # whatever the device call
    assert not algorithms["staged"].applies(_where(False))
    assert registry.pick(_where(False)).name == "mpi"
    assert registry.pick(_where(True, nccl=True)).name == "nccl"  # facts decide, in order
    assert registry.pick(_where(False, size=1)).name == "copy"  # a world of one, host
    assert registry.pick(_where(True, size=1)).name == "copy"  # and device
    assert registry.pick(_where(True, size=1, implementation=CI.NCCL)).name == "nccl"


def test_reduce_scatter_asks_only_algorithms_that_have_one():
    class _Always:
        name = "always"

        def applies(self, where):
            return not where.device

        def allreduce(self, engine, items, layout, opts):
            raise AssertionError("not run here")

    registry.register(_Always())
    try:
        assert registry.pick(_where(False)).name == "always"
        assert registry.pick(_where(False, operation="reduce_scatter")).name == "mpi"
    finally:
        registry.unregister("always")


def test_register_before_a_name_and_unregister_restore_the_order():
    before = [a.name for a in registry.registered()]
    generation = registry.generation()
    registry.register(_Never(), before="shm")
    try:
        names = [a.name for a in registry.registered()]
        assert names.index("never") == names.index("shm") - 1
        assert registry.generation() != generation
    finally:
        removed = registry.unregister("never")
    assert removed.name == "never"
    assert [a.name for a in registry.registered()] == before
    with pytest.raises(ValueError, match="no algorithm named 'never'"):
        registry.unregister("never")


def test_mpi_band_reads_the_variable_and_rejects_nonsense():
    assert choice.mpi_band({}) == choice.MPI_BAND
    assert choice.mpi_band({"HPCDIST_MPI_BAND": "0:0"}) == (0, 0)
    assert choice.mpi_band({"HPCDIST_MPI_BAND": "4096:65536"}) == (4096, 65536)
    with pytest.raises(ValueError, match="HPCDIST_MPI_BAND='1M:2M'"):
        choice.mpi_band({"HPCDIST_MPI_BAND": "1M:2M"})
