"""Signatures, their hash, and the text of a mismatch error."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from hpcdist.collectives.metadata import (
    describe_arrays,
    mismatch_message,
    rank_ranges,
    signature_hash,
)


def test_describe_arrays_names_dtype_and_shape():
    arrays = [np.zeros((3, 4), np.float32), np.zeros(0, np.int8), np.float16(1)]
    assert describe_arrays(arrays) == "[float32(3, 4), int8(0,), float16()]"


def test_hash_is_stable_across_processes():
    # Python's hash() of a str changes per process (PYTHONHASHSEED); this one must not.
    code = "from hpcdist.collectives.metadata import signature_hash as h; print(h('abc'))"
    runs = {
        subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONHASHSEED": seed},
        ).stdout
        for seed in ("1", "2")
    }
    assert runs == {f"{signature_hash('abc')}\n"}


@settings(deadline=None, max_examples=100)
@given(st.text(), st.text())
def test_hash_is_63_bits_and_separates_texts(a, b):
    assert 0 <= signature_hash(a) < 2**63
    if a != b:
        assert signature_hash(a) != signature_hash(b)  # 63 bits: no collision in practice


@settings(deadline=None, max_examples=100)
@given(st.sets(st.integers(0, 40)))
def test_rank_ranges_round_trip(ranks):
    text = rank_ranges(ranks)
    back: set[int] = set()
    for part in filter(None, text.split(", ")):
        lo, _, hi = part.partition("-")
        back.update(range(int(lo), int(hi or lo) + 1))
    assert back == ranks
    assert rank_ranges([0, 1, 2, 5, 7, 8]) == "0-2, 5, 7-8"


def test_mismatch_message_groups_ranks_and_shows_where_long_texts_differ():
    long = "allreduce(op=SUM, [" + ", ".join(["float32(4,)"] * 100)
    texts = [long + ", int8(1,)])", long + ", int8(2,)])", long + ", int8(2,)])"]
    message = mismatch_message("allreduce", texts)
    assert message.startswith("allreduce: the ranks called this collective")
    assert "rank 0 passed" in message and "ranks 1-2 passed" in message
    assert "int8(1,)" in message and "int8(2,)" in message  # the differing tail is shown
    assert len(message) < 1500
