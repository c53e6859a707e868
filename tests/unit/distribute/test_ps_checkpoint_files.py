"""The ps shard files without MPI: write, verify, stage, commit; the client-side matching.

The server's state is built directly (``Var`` objects and an ``OptimizerHost``)
and changed by the real optimizer kernels, so a restore is checked against
values and slots that the saving state really had.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from hpcdist.distribute.ps import protocol as P
from hpcdist.distribute.ps import shard_file as S
from hpcdist.distribute.ps.checkpoint import fragment_of, match_variables
from hpcdist.distribute.ps.handlers import Var
from hpcdist.distribute.ps.optimizer_host import OptimizerHost
from hpcdist.distribute.ps.protocol import PSError
from hpcdist.errors import CheckpointCorruptError, CheckpointError
from hpcdist.optimizers import SGD, Adam


def state(seed: int = 0) -> tuple[dict[int, Var], OptimizerHost]:
    """Three variables on one ps, two of them trained by Adam (opt 0), one by SGD+momentum."""
    rng = np.random.default_rng(seed)
    variables = {
        0: Var(rng.normal(size=(3, 2)), "w", 1),
        1: Var(rng.normal(size=4).astype(np.float32), "b", 1),
        2: Var(np.array(7, np.int64), "count", 1),
    }
    host = OptimizerHost()
    host.register(0, "Adam", Adam(0.1).get_config())
    host.register(1, "SGD", SGD(0.1, momentum=0.9).get_config())
    for _ in range(3):
        for vid in (0, 1):
            v = variables[vid]
            host.apply_dense(0, vid, v.value, rng.normal(size=v.value.shape), lr=0.1)
            v.version += 1
    host.apply_dense(1, 0, variables[0].value, np.ones((3, 2)), lr=0.5)
    return variables, host


def snapshot(variables, host):
    values = {k: (v.value.copy(), v.version) for k, v in variables.items()}
    opt = {
        (o["id"], vid): (step, {n: a.copy() for n, a in slots.items()})
        for o in host.export_states(set(variables))
        for vid, (step, slots) in o["states"].items()
    }
    return values, opt


def assert_same(a, b):
    (va, oa), (vb, ob) = a, b
    assert va.keys() == vb.keys() and oa.keys() == ob.keys()
    for k in va:
        np.testing.assert_array_equal(va[k][0], vb[k][0])
        assert va[k][1] == vb[k][1]
    for k in oa:
        assert oa[k][0] == ob[k][0]
        for n in oa[k][1]:
            np.testing.assert_array_equal(oa[k][1][n], ob[k][1][n])


def save(tmp_path, variables, host, ids=(0, 1, 2)):
    path = str(tmp_path / "ckpt-1.ps-0.npz")
    info = S.write_shard(path, 0, variables, host, list(ids))
    files = {info["file"]: {"path": path, "sha256": info["sha256"], "bytes": info["bytes"]}}
    items = [{"file": info["file"], "saved_id": i, "var": i} for i in ids]
    return path, info, files, items


def train_more(variables, host):
    for vid in (0, 1):
        v = variables[vid]
        host.apply_dense(0, vid, v.value, np.full(v.value.shape, 3.0), lr=0.2)
        v.version += 5
    variables[2].value[...] = 99
    host.forget(0)  # also drops opt 1's state of variable 0
    host.apply_dense(0, 0, variables[0].value, np.ones((3, 2)), lr=0.2)
    host.apply_dense(1, 1, variables[1].value, np.ones(4), lr=0.2)  # state the save did not have


def test_save_then_restore_brings_back_values_versions_slots_and_steps(tmp_path):
    variables, host = state()
    before = snapshot(variables, host)
    path, info, files, items = save(tmp_path, variables, host)
    assert os.listdir(tmp_path) == ["ckpt-1.ps-0.npz"]  # no temporary file left
    from hpcdist.runtime.atomic import sha256_of

    assert (info["sha256"], info["bytes"]) == sha256_of(path)  # the digest of the file itself
    with np.load(path, allow_pickle=False) as npz:  # a plain npz, no pickle
        np.testing.assert_array_equal(npz["var0.value"], before[0][0][0])
        np.testing.assert_array_equal(npz["opt0.var1.v"].reshape(-1), before[1][(0, 1)][1]["v"])
    train_more(variables, host)
    changed = snapshot(variables, host)
    with pytest.raises(AssertionError):
        assert_same(before, changed)
    staged = S.stage_restore(files, items, variables, host)
    assert_same(snapshot(variables, host), changed)  # staging changes nothing
    assert S.commit_restore(staged, variables, host) == 3
    assert_same(snapshot(variables, host), before)
    # the restored state trains on exactly as the saved one would
    ref_vars, ref_host = state()
    for vs, h in ((variables, host), (ref_vars, ref_host)):
        h.apply_dense(0, 0, vs[0].value, np.full((3, 2), 0.5), lr=0.1)
    np.testing.assert_array_equal(variables[0].value, ref_vars[0].value)


@pytest.mark.parametrize("damage", ["flip", "truncate", "delete"])
def test_a_damaged_file_is_refused_and_nothing_changes(tmp_path, damage):
    variables, host = state()
    path, _, files, items = save(tmp_path, variables, host)
    train_more(variables, host)
    changed = snapshot(variables, host)
    if damage == "flip":
        data = bytearray(open(path, "rb").read())
        data[len(data) // 2] ^= 0x01
        open(path, "wb").write(bytes(data))
        match = "is corrupt: its sha256 is"
    elif damage == "truncate":
        os.truncate(path, os.path.getsize(path) - 1)
        match = "bytes but the manifest records"
    else:
        os.remove(path)
        match = "is missing"
    with pytest.raises(CheckpointCorruptError, match=match) as e:
        S.stage_restore(files, items, variables, host)
    assert path in str(e.value)
    assert_same(snapshot(variables, host), changed)


def test_a_file_that_matches_its_digest_but_is_not_a_shard_is_corrupt(tmp_path):
    from hpcdist.runtime.atomic import sha256_of

    path = str(tmp_path / "x.ps-0.npz")
    np.savez(path, a=np.zeros(2))
    digest, size = sha256_of(path)
    files = {"x.ps-0.npz": {"path": path, "sha256": digest, "bytes": size}}
    variables, host = state()
    items = [{"file": "x.ps-0.npz", "saved_id": 0, "var": 0}]
    with pytest.raises(CheckpointCorruptError, match="not a readable ps shard file"):
        S.stage_restore(files, items, variables, host)


def test_layout_mismatches_are_checkpoint_errors(tmp_path):
    variables, host = state()
    _, _, files, items = save(tmp_path, variables, host)
    other = {0: Var(np.zeros((2, 3)), "w", 1), 1: variables[1], 2: variables[2]}
    with pytest.raises(CheckpointError, match=r"has shape \(3, 2\), dtype float64, but the live"):
        S.stage_restore(files, items[:1], other, host)
    sgd = OptimizerHost()
    sgd.register(0, "SGD", SGD(0.1).get_config())
    with pytest.raises(CheckpointError, match="runs a SGD under that id"):
        S.stage_restore(files, items, variables, sgd)
    with pytest.raises(CheckpointError, match="holds no variables with ids"):
        S.write_shard(str(tmp_path / "y.npz"), 0, variables, host, [0, 9])


def test_restored_slots_wait_for_the_optimizer_registration(tmp_path):
    variables, host = state()
    before = snapshot(variables, host)
    _, _, files, items = save(tmp_path, variables, host)
    fresh = OptimizerHost()  # a new ps: no optimizer registered yet
    S.commit_restore(S.stage_restore(files, items, variables, fresh), variables, fresh)
    with pytest.raises(PSError, match="restored Adam slots for optimizer id 0"):
        fresh.register(0, "SGD", SGD(0.1).get_config())
    fresh.register(0, "Adam", Adam(0.1).get_config())
    fresh.register(1, "SGD", SGD(0.1, momentum=0.9).get_config())
    assert_same(snapshot(variables, fresh), before)
    other = OptimizerHost()
    other.import_state(1, "SGD", 0, 1, {"momentum": np.ones(6)})
    with pytest.raises(PSError, match="uses slots"):
        other.register(1, "SGD", SGD(0.1).get_config())  # no momentum: no slots


def test_error_status_carries_the_checkpoint_error_types():
    for err in (CheckpointCorruptError("a"), CheckpointError("b"), PSError("c"), KeyError("d")):
        back = P.error_of_status(P.error_status(err), "msg")
        expected = type(err) if isinstance(err, CheckpointError) else PSError
        assert type(back) is expected and str(back) == "msg"


def test_fragment_and_matching(tmp_path):
    variables, host = state()
    variables[3] = Var(np.zeros(2), "w", 1)  # a second "w"
    _, info, _, _ = save(tmp_path, variables, host, ids=(0, 1, 3))
    frag = fragment_of({0: info})
    assert sorted(frag["ps_variables"]) == ["b", "w", "w#1"]
    w = frag["ps_variables"]["w"]
    assert (w["id"], w["ps"], w["file"], w["shape"]) == (0, 0, "ckpt-1.ps-0.npz", [3, 2])
    assert set(w["keys"]["slots"]) == {"0", "1"} and w["steps"] == {"0": 3, "1": 1}
    assert frag["ps_optimizers"] == {"0": "Adam", "1": "SGD"}
    saved = list(frag["ps_variables"].values())
    live = [dict(e, ps=0) for e in saved]
    shifted = [dict(e, id=e["id"] + 10) for e in live]  # created later: matched by name, order
    pairs = match_variables(saved, shifted)
    assert sorted((s["id"], c["id"]) for s, c in pairs) == [(0, 10), (1, 11), (3, 13)]
    with pytest.raises(CheckpointError, match="2 parameter-server variables named 'w'"):
        match_variables(saved, [e for e in shifted if e["id"] != 13])
    with pytest.raises(CheckpointError, match="no ps variable of that name"):
        match_variables(saved, [e for e in live if e["name"] != "b"])
    bad = [dict(e, dtype="float16") if e["name"] == "b" else e for e in live]
    with pytest.raises(CheckpointError, match="'b': the checkpoint has shape"):
        match_variables(saved, bad)
