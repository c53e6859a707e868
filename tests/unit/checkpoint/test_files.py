"""The files: atomic writes, integrity checks naming the file, no pickle anywhere."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import hpcdist as hd
from hpcdist.checkpoint import Checkpoint, CheckpointNotFoundError, atomic_write
from hpcdist.errors import CheckpointCorruptError, CheckpointError
from hpcdist.runtime import atomic as atomic_module


def saved(tmp_path, name="c"):
    v = hd.Variable(np.arange(6.0).reshape(2, 3), name="w")
    ckpt = Checkpoint(w=v, i=hd.Variable(np.int64(7)))
    prefix = ckpt.write(str(tmp_path / name))
    return ckpt, prefix


def manifest_of(prefix):
    with open(prefix + ".index.json") as f:
        return json.load(f)


def rewrite_manifest(prefix, m):
    with open(prefix + ".index.json", "w") as f:
        json.dump(m, f)


def test_layout_on_disk(tmp_path):
    _, prefix = saved(tmp_path)
    assert sorted(os.listdir(tmp_path)) == ["c.data.npz", "c.index.json"]
    m = manifest_of(prefix)
    assert (m["format"], m["version"], m["num_workers"]) == ("hpcdist-checkpoint", 1, 1)
    data = open(prefix + ".data.npz", "rb").read()
    assert m["files"]["c.data.npz"] == {
        "sha256": hashlib.sha256(data).hexdigest(),
        "bytes": len(data),
    }
    entry = m["objects"]["w"]["arrays"]["value"]
    assert (entry["file"], entry["dtype"], entry["shape"]) == ("c.data.npz", "<f8", [2, 3])
    assert m["meta"] == {"per_worker": [{"w": {}, "i": {}}]}


def test_a_crash_between_temporary_write_and_rename_leaves_the_old_file(tmp_path):
    target = tmp_path / "state.json"
    atomic_write(target, lambda f: f.write(b"old"))
    script = textwrap.dedent(
        f"""
        import os
        from hpcdist.runtime.atomic import atomic_write
        def crash(f):
            f.write(b"new but not finished")
            f.flush()
            os._exit(3)  # killed before fsync and rename
        atomic_write({str(target)!r}, crash)
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=60)
    assert proc.returncode == 3, proc.stderr
    assert target.read_bytes() == b"old"
    leftovers = [p for p in os.listdir(tmp_path) if p != "state.json"]
    assert len(leftovers) == 1 and leftovers[0].startswith("state.json.tmp-")


def test_a_failed_rename_keeps_the_previous_checkpoint_valid(tmp_path, monkeypatch):
    ckpt, first = saved(tmp_path, "a")
    real_replace = os.replace

    def failing(src, dst):
        if str(dst).endswith("b.index.json"):
            raise OSError("no space left on device")
        return real_replace(src, dst)

    monkeypatch.setattr(atomic_module.os, "replace", failing)
    with pytest.raises(CheckpointError, match="no space left") as info:
        ckpt.write(str(tmp_path / "b"))
    assert isinstance(info.value.__cause__, OSError)
    monkeypatch.undo()
    assert not any(".tmp-" in p for p in os.listdir(tmp_path))
    with pytest.raises(CheckpointNotFoundError, match="b.index.json"):
        ckpt.read(str(tmp_path / "b"))  # incomplete: no manifest
    ckpt.read(first).assert_consumed()


@pytest.mark.parametrize(
    "damage, pattern",
    [
        ("truncate", r"c\.data\.npz' has \d+ bytes, but the manifest lists \d+"),
        ("flip", r"c\.data\.npz' has SHA-256 [0-9a-f]+, but the manifest lists"),
        ("delete", r"c\.data\.npz' is missing"),
        ("bad_json", r"c\.index\.json' is not valid JSON"),
        ("edit_shape", r"c\.data\.npz' holds array 'a0' with dtype <f8 and shape \(2, 3\), but"),
        ("edit_dtype", r"c\.data\.npz' holds array 'a0' with dtype <f8 .* dtype <f4"),
        ("edit_hash", r"c\.data\.npz' has SHA-256"),
        ("escape", r"lists a file '\.\./x\.npz'"),
        ("format", r"is not a hpcdist-checkpoint version 1 manifest"),
    ],
)
def test_damage_raises_a_typed_error_naming_the_file(tmp_path, damage, pattern):
    ckpt, prefix = saved(tmp_path)
    data = prefix + ".data.npz"
    m = manifest_of(prefix)
    if damage == "truncate":
        with open(data, "r+b") as f:
            f.truncate(os.path.getsize(data) - 10)
    elif damage == "flip":
        raw = bytearray(open(data, "rb").read())
        raw[len(raw) // 2] ^= 0x01
        open(data, "wb").write(bytes(raw))
    elif damage == "delete":
        os.unlink(data)
    elif damage == "bad_json":
        open(prefix + ".index.json", "w").write('{"format": "hpcdist-checkpoint", ')
    elif damage == "edit_shape":
        m["objects"]["w"]["arrays"]["value"]["shape"] = [3, 2]
    elif damage == "edit_dtype":
        m["objects"]["w"]["arrays"]["value"]["dtype"] = "<f4"
    elif damage == "edit_hash":
        m["files"]["c.data.npz"]["sha256"] = "0" * 64
    elif damage == "escape":
        m["files"]["../x.npz"] = {"sha256": "0" * 64, "bytes": 1}
    elif damage == "format":
        m["version"] = 2
    if damage.startswith(("edit", "escape", "format")):
        rewrite_manifest(prefix, m)
    before = ckpt.w.numpy()
    ckpt.w.assign(np.zeros((2, 3)))
    with pytest.raises(CheckpointCorruptError, match=pattern):
        ckpt.read(prefix)
    assert ckpt.w.numpy().tolist() == np.zeros((2, 3)).tolist()  # nothing assigned
    assert before.sum() == 15.0


def test_missing_checkpoint_is_not_found(tmp_path):
    with pytest.raises(CheckpointNotFoundError, match="nothing.index.json' does not exist"):
        Checkpoint(v=hd.Variable(1.0)).restore(str(tmp_path / "nothing"))
    assert issubclass(CheckpointNotFoundError, FileNotFoundError)


def _write_object_npz(prefix, manifest_dtype):
    """A checkpoint whose npz member holds a pickled object array (hash kept consistent)."""
    data = prefix + ".data.npz"
    np.savez(data, allow_pickle=True, a0=np.array([{"evil": 1}, None], dtype=object))
    m = manifest_of(prefix)
    raw = open(data, "rb").read()
    m["files"]["c.data.npz"] = {"sha256": hashlib.sha256(raw).hexdigest(), "bytes": len(raw)}
    m["objects"]["w"]["arrays"]["value"].update(dtype=manifest_dtype, shape=[2])
    rewrite_manifest(prefix, m)


@pytest.mark.parametrize(
    "manifest_dtype, pattern",
    [("|O", "gives the dtype '|O'"), ("<f8", "holds array 'a0' of Python objects; refused")],
)
def test_an_object_array_is_refused_without_unpickling(
    tmp_path, monkeypatch, manifest_dtype, pattern
):
    ckpt, prefix = saved(tmp_path)
    _write_object_npz(prefix, manifest_dtype)

    def no_pickle(*args, **kwargs):
        raise AssertionError("pickle was used")

    monkeypatch.setattr(pickle, "loads", no_pickle)
    monkeypatch.setattr(pickle, "load", no_pickle)
    monkeypatch.setattr(pickle, "Unpickler", no_pickle)
    with pytest.raises(CheckpointCorruptError, match=pattern):
        ckpt.read(prefix)


def test_saving_an_object_array_is_refused(tmp_path):
    class Bad:
        def _checkpoint_state(self):
            return {"x": np.array([object()], dtype=object)}, {}

        def _restore_checkpoint_state(self, arrays, meta):
            pass

    with pytest.raises(CheckpointError, match="array 'x' of dtype object"):
        Checkpoint(bad=Bad()).write(str(tmp_path / "bad"))
    assert not (tmp_path / "bad.index.json").exists()


def test_meta_must_be_json(tmp_path):
    class NotJson:
        def _checkpoint_state(self):
            return {}, {"when": object()}

        def _restore_checkpoint_state(self, arrays, meta):
            pass

    with pytest.raises(CheckpointError, match="TypeError: Object of type object"):
        Checkpoint(x=NotJson()).write(str(tmp_path / "nj"))
    assert os.listdir(tmp_path) == []
