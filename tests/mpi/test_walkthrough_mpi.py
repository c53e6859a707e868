"""The docs' "Adding a collective algorithm" walk-through, run as written.

The module block of ``docs/collectives_engine.md`` is saved as a module,
imported, registered with the one registry line, and checked: AUTO picks it
for the calls it applies to (and its results are right), an explicit
implementation or another shape does not, and unregistering restores the order.
Run under ``mpirun -n 2`` and ``-n 4``.
"""

from __future__ import annotations

import importlib.util
import re
import tempfile
from pathlib import Path

import numpy as np
import pytest

from hpcdist.collectives import Collectives, CommunicationOptions, registry
from hpcdist.runtime import mpi

pytestmark = [pytest.mark.mpi(min_size=2), pytest.mark.timeout(300)]

PAGE = Path(__file__).resolve().parents[2] / "docs" / "collectives_engine.md"


def _walkthrough_module(folder: Path):
    text = PAGE.read_text(encoding="utf-8")
    section = text[text.index("### Adding a collective algorithm") :]
    code = re.search(r"```python\n(.*?)```", section, re.S)
    assert code is not None, "the walk-through has no python block"
    path = folder / "three_doubles.py"
    path.write_text(code.group(1), encoding="utf-8")
    spec = importlib.util.spec_from_file_location("three_doubles", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_walkthrough_algorithm_is_picked_where_it_applies():
    with tempfile.TemporaryDirectory() as folder:  # (one per rank)
        module = _walkthrough_module(Path(folder))
    before = [a.name for a in registry.registered()]
    engine = Collectives(mpi().COMM_WORLD)
    registry.register(module.ALGORITHM, before="small")  # the one registry line
    try:
        names = [a.name for a in registry.registered()]
        assert names.index("three-doubles") == names.index("small") - 1
        x = np.arange(3.0) * (engine.rank + 1)
        (total,) = engine.allreduce([x], "SUM")
        assert engine.last_algorithm == "three-doubles"
        factor = engine.size * (engine.size + 1) / 2
        np.testing.assert_array_equal(total, np.arange(3.0) * factor)
        (mean,) = engine.allreduce([x], "MEAN")
        assert engine.last_algorithm == "three-doubles"
        np.testing.assert_allclose(mean, np.arange(3.0) * factor / engine.size)
        engine.allreduce([x], "SUM", CommunicationOptions(implementation="mpi"))  # not AUTO
        assert engine.last_algorithm == "mpi"
        engine.allreduce([np.ones(4)], "SUM")  # another shape
        assert engine.last_algorithm != "three-doubles"
    finally:
        registry.unregister("three-doubles")
        engine.close()
    assert [a.name for a in registry.registered()] == before


def test_a_change_of_the_steering_variables_takes_effect_at_the_next_call(monkeypatch):
    """Picks are remembered per call, yet HPCDIST_COLLECTIVES is read on every AUTO call."""
    engine = Collectives(mpi().COMM_WORLD)
    x = [np.ones(1, np.float32)]
    monkeypatch.delenv("HPCDIST_COLLECTIVES", raising=False)
    engine.allreduce(x, "SUM")
    auto = engine.last_algorithm
    monkeypatch.setenv("HPCDIST_COLLECTIVES", "mpi")
    (out,) = engine.allreduce(x, "SUM")
    assert engine.last_algorithm == "mpi"
    np.testing.assert_array_equal(out, [engine.size])
    monkeypatch.delenv("HPCDIST_COLLECTIVES")
    engine.allreduce(x, "SUM")
    assert engine.last_algorithm == auto
    if engine.session.topology().largest_node > 1:
        assert auto != "mpi"
    engine.close()
