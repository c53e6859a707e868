"""Flat buffers: adoption, in-place updates, snapshots (out of place) and re-adoption."""

from __future__ import annotations

import numpy as np
import pytest

import hpcdist as hd
from hpcdist.optimizers import SGD, Adam
from hpcdist.optimizers.flat import FlatBuffer


def _vars():
    return hd.Variable(np.ones((2, 3)), name="w"), hd.Variable(np.zeros(4), name="b")


def test_variables_are_adopted_into_one_flat_buffer_per_dtype():
    w, b = _vars()
    opt = SGD(0.5)
    opt.apply_gradients([(np.ones((2, 3)), w), (np.ones(4), b)])
    flat = w.raw_value().base
    assert flat is b.raw_value().base and flat.ndim == 1 and flat.size == 10
    np.testing.assert_array_equal(flat, np.r_[np.full(6, 0.5), np.full(4, -0.5)])
    assert w.raw_value().shape == (2, 3) and w.raw_value().flags.writeable


def test_without_snapshots_the_update_is_in_place():
    w, b = _vars()
    opt = Adam(0.1)
    opt.apply_gradients([(np.ones((2, 3)), w), (np.ones(4), b)])
    view, flat_id = w.raw_value(), id(w.raw_value().base)
    m_view = opt.get_slot(w, "m").raw_value()
    for _ in range(3):
        opt.apply_gradients([(np.ones((2, 3)), w), (np.ones(4), b)])
        assert w.raw_value() is view and id(w.raw_value().base) == flat_id  # same buffer, same view
        assert opt.get_slot(w, "m").raw_value() is m_view
    np.testing.assert_allclose(view, w.numpy())


def test_a_snapshot_keeps_its_value_after_a_step():
    w, b = _vars()
    opt = SGD(0.5, momentum=0.9)
    opt.apply_gradients([(np.ones((2, 3)), w), (np.ones(4), b)])
    snap_w, snap_b = w.value(), b.value()
    kept_w, kept_b = snap_w.copy(), snap_b.copy()
    old_base = w.raw_value().base
    opt.apply_gradients([(np.ones((2, 3)), w), (np.ones(4), b)])
    np.testing.assert_array_equal(snap_w, kept_w)  # the snapshot did not change
    np.testing.assert_array_equal(snap_b, kept_b)
    assert not snap_w.flags.writeable
    assert w.raw_value().base is not old_base  # written out of place into a fresh buffer
    np.testing.assert_allclose(w.numpy(), kept_w - 0.5 - 0.5 * 0.9)  # and still correct
    np.testing.assert_allclose(b.numpy(), kept_b - 0.5 - 0.5 * 0.9)
    del snap_w, snap_b
    view = w.raw_value()
    opt.apply_gradients([(np.ones((2, 3)), w), (np.ones(4), b)])
    assert w.raw_value() is view  # no snapshot left: in place again


def test_np_asarray_of_a_variable_is_a_snapshot_too():
    w = hd.Variable(np.arange(3.0))
    opt = SGD(1.0)
    opt.apply_gradients([(np.ones(3), w)])
    held = np.asarray(w)
    opt.apply_gradients([(np.ones(3), w)])
    np.testing.assert_array_equal(held, [-1.0, 0.0, 1.0])
    np.testing.assert_array_equal(w.numpy(), [-2.0, -1.0, 0.0])


def test_snapshot_with_missing_gradients_copies_the_untouched_ranges():
    a, b, c = (hd.Variable(np.full(2, float(i)), name=f"v{i}") for i in range(3))
    opt = SGD(1.0)
    opt.apply_gradients([(np.ones(2), a), (np.ones(2), b), (np.ones(2), c)])
    snap = b.value()
    with pytest.warns(UserWarning, match="do not exist"):
        opt.apply_gradients([(np.ones(2), a), (None, b), (np.ones(2), c)])
    np.testing.assert_array_equal(snap, [0.0, 0.0])
    np.testing.assert_array_equal(b.numpy(), [0.0, 0.0])  # copied over to the new buffer
    np.testing.assert_array_equal(a.numpy(), [-2.0, -2.0])
    np.testing.assert_array_equal(c.numpy(), [0.0, 0.0])


def test_a_slot_snapshot_keeps_its_value():
    w = hd.Variable(np.zeros(3))
    opt = Adam(0.1)
    opt.apply_gradients([(np.ones(3), w)])
    m = opt.get_slot(w, "m")
    snap = m.value()
    kept = snap.copy()
    opt.apply_gradients([(np.ones(3), w)])
    np.testing.assert_array_equal(snap, kept)
    np.testing.assert_allclose(m.numpy(), kept + (1 - kept) * 0.1)


def test_a_user_assign_is_adopted_again():
    w, b = _vars()
    opt = SGD(0.5)
    opt.apply_gradients([(np.ones((2, 3)), w), (np.ones(4), b)])
    w.assign(np.full((2, 3), 10.0))  # rebinds the component to a new array
    b.assign_add(np.ones(4))
    opt.apply_gradients([(np.ones((2, 3)), w), (np.ones(4), b)])
    np.testing.assert_array_equal(w.numpy(), np.full((2, 3), 9.5))
    np.testing.assert_array_equal(b.numpy(), np.full(4, 0.0))
    assert w.raw_value().base is b.raw_value().base  # back in one flat buffer


def test_a_slot_assign_is_adopted_again():
    w = hd.Variable(np.zeros(2))
    opt = SGD(1.0, momentum=0.5)
    opt.apply_gradients([(np.ones(2), w)])  # velocity -1
    opt.get_slot(w, "momentum").assign([10.0, 0.0])
    opt.apply_gradients([(np.ones(2), w)])
    np.testing.assert_array_equal(opt.get_slot(w, "momentum").numpy(), [4.0, -1.0])
    np.testing.assert_array_equal(w.numpy(), [-1.0 + 4.0, -1.0 - 1.0])


def test_new_variables_extend_the_layout_and_keep_the_state():
    w, b = _vars()
    opt = SGD(1.0, momentum=0.5)
    opt.apply_gradients([(np.ones((2, 3)), w)])
    opt.apply_gradients([(np.ones((2, 3)), w), (np.ones(4), b)])
    np.testing.assert_array_equal(w.numpy(), np.full((2, 3), 1.0 - 1.0 - 1.5))
    np.testing.assert_array_equal(b.numpy(), np.full(4, -1.0))
    assert w.raw_value().base is b.raw_value().base
    assert opt.get_slot(w, "m").raw_value().base is opt.get_slot(b, "m").raw_value().base


def test_flat_buffer_directly():
    a, b = hd.Variable(np.ones(2)), hd.Variable(np.full((1, 2), 2.0))
    buf = FlatBuffer([a, b])
    assert not buf.shared() and buf.intact()
    np.testing.assert_array_equal(buf.flat, [1, 1, 2, 2])
    assert buf.segment(1, 2) == (2, 4)
    snap = a.value()
    assert buf.shared()
    old_id = id(buf.flat)
    assert buf.make_private()
    moved = id(buf.flat) != old_id
    assert moved
    assert not buf.shared()
    np.testing.assert_array_equal(snap, [1, 1])
    del snap
    b.assign(np.zeros((1, 2)))
    assert not buf.intact() and buf.ensure() and buf.intact()
    np.testing.assert_array_equal(buf.flat, [1, 1, 0, 0])
    with pytest.raises(ValueError, match="at least one"):
        FlatBuffer([])
