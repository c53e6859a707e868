"""Fuzzing the reader: random manifests, garbage bytes, truncations, flipped bytes.

Whatever is on disk, ``Checkpoint.restore`` either restores (when the damage
happens to leave a valid checkpoint) or raises a ``CheckpointError`` subclass;
never another exception, never a hang, never an unpickle. One process, no MPI.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hpcdist as hd
from hpcdist.checkpoint import Checkpoint
from hpcdist.errors import CheckpointError
from hpcdist.optimizers import SGD

SETTINGS = settings(
    max_examples=int(os.environ.get("HPCDIST_FUZZ_EXAMPLES", "100")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False)
    | st.text(max_size=12)
    | st.sampled_from(["<f8", "|O", "c.data.npz", "a0", "hpcdist-checkpoint", "../c.data.npz"]),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)


def objects():
    w = hd.Variable(np.arange(6.0).reshape(2, 3), name="w")
    opt = SGD(0.1, momentum=0.9)
    opt.apply_gradients([(np.ones((2, 3)), w)])
    return Checkpoint(w=w, opt=opt, rng=np.random.default_rng(0), n=hd.Variable(np.int64(3)))


@pytest.fixture(scope="module")
def original():
    directory = tempfile.mkdtemp(prefix="hpcdist-fuzz-")
    prefix = objects().write(os.path.join(directory, "c"))
    with open(prefix + ".index.json") as f:
        manifest = json.load(f)
    with open(prefix + ".data.npz", "rb") as f:
        data = f.read()
    yield manifest, data
    shutil.rmtree(directory, ignore_errors=True)


def restore_from(manifest_bytes: bytes, data: bytes | None) -> None:
    directory = tempfile.mkdtemp(prefix="hpcdist-fuzz-")
    try:
        prefix = os.path.join(directory, "c")
        with open(prefix + ".index.json", "wb") as f:
            f.write(manifest_bytes)
        if data is not None:
            with open(prefix + ".data.npz", "wb") as f:
                f.write(data)
        try:
            objects().restore(prefix)
        except CheckpointError as error:  # the only allowed failure, and raised on purpose:
            cause = error.__cause__  # not some other exception wrapped on its way out
            assert cause is None or isinstance(cause, CheckpointError), repr(cause)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def with_hash(manifest: dict, data: bytes) -> dict:
    m = json.loads(json.dumps(manifest))
    m["files"]["c.data.npz"] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    return m


@SETTINGS
@given(value=json_values)
def test_random_json_as_manifest(original, value):
    restore_from(json.dumps(value).encode(), original[1])


@SETTINGS
@given(raw=st.binary(max_size=300))
def test_garbage_manifest_bytes(original, raw):
    restore_from(raw, original[1])


def _paths(x, prefix=()):
    yield prefix
    if isinstance(x, dict):
        for k, v in x.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(x, list):
        for i, v in enumerate(x):
            yield from _paths(v, (*prefix, i))


@SETTINGS
@given(data=st.data(), value=json_values, delete=st.booleans())
def test_one_edited_entry_of_a_valid_manifest(original, data, value, delete):
    manifest = json.loads(json.dumps(original[0]))
    paths = [p for p in _paths(manifest) if p]
    path = data.draw(st.sampled_from(paths))
    parent = manifest
    for key in path[:-1]:
        parent = parent[key]
    if delete:
        del parent[path[-1]]
    else:
        parent[path[-1]] = value
    restore_from(json.dumps(manifest).encode(), original[1])


@SETTINGS
@given(garbage=st.binary(max_size=2000))
def test_garbage_data_with_a_matching_hash(original, garbage):
    restore_from(json.dumps(with_hash(original[0], garbage)).encode(), garbage)


@SETTINGS
@given(data=st.data())
def test_truncations(original, data):
    manifest_bytes = json.dumps(original[0]).encode()
    raw = original[1]
    cut = data.draw(st.integers(0, len(raw)))
    rehash = data.draw(st.booleans())  # also past the hash check, into the npz parser
    m = with_hash(original[0], raw[:cut]) if rehash else original[0]
    restore_from(json.dumps(m).encode(), raw[:cut])
    restore_from(manifest_bytes[: data.draw(st.integers(0, len(manifest_bytes)))], raw)


@SETTINGS
@given(data=st.data())
def test_flipped_bytes_past_the_hash_check(original, data):
    raw = bytearray(original[1])
    for _ in range(data.draw(st.integers(1, 4))):
        raw[data.draw(st.integers(0, len(raw) - 1))] ^= data.draw(st.integers(1, 255))
    restore_from(json.dumps(with_hash(original[0], bytes(raw))).encode(), bytes(raw))


def test_the_original_restores(original):
    restored = objects()
    restored.w.assign(np.zeros((2, 3)))
    directory = tempfile.mkdtemp(prefix="hpcdist-fuzz-")
    try:
        prefix = os.path.join(directory, "c")
        open(prefix + ".index.json", "w").write(json.dumps(original[0]))
        open(prefix + ".data.npz", "wb").write(original[1])
        restored.restore(prefix).assert_existing_objects_matched()
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    assert restored.w.numpy().sum() > 0
