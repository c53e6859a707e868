"""The algorithm registry's order, registration rules and the MPI band setting."""

from __future__ import annotations

import pytest

from hpcdist.collectives import choice, registry


class _Never:
    name = "never"

    def applies(self, where):
        return False

    def allreduce(self, engine, items, layout, opts):
        raise AssertionError("never runs")


def test_default_order_ends_with_the_algorithm_that_always_applies():
    names = [a.name for a in registry.registered()]
    assert names == ["small", "mpi-direct", "shm", "hierarchical", "mpi"]
    assert registry.registered()[-1].applies(None)  # mpi: whatever the call


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
