"""tf.data options: AutoShardPolicy, DistributeOptions, Options (set-field tracking and merge)."""

from __future__ import annotations

import pytest

from hpcdist.data.dataset import Dataset
from hpcdist.data.options import AutoShardPolicy, DistributeOptions, Options


def test_policy_values_are_tfs():
    assert [(p.name, int(p)) for p in AutoShardPolicy] == [
        ("OFF", -1),
        ("AUTO", 0),
        ("FILE", 1),
        ("DATA", 2),
        ("HINT", 3),
    ]


@pytest.mark.parametrize("value", [AutoShardPolicy.FILE, 1, "file", " FILE "])
def test_policy_from_member_value_or_name(value):
    assert AutoShardPolicy.from_any(value) is AutoShardPolicy.FILE


@pytest.mark.parametrize("bad", ["shards", 7, None, True, 1.0])
def test_policy_rejects_others_and_names_the_choices(bad):
    with pytest.raises(ValueError, match=r"OFF \(-1\), AUTO \(0\), FILE \(1\), DATA \(2\), HINT"):
        AutoShardPolicy.from_any(bad)


def test_distribute_options_defaults_are_tfs():
    d = DistributeOptions()
    assert d.auto_shard_policy is AutoShardPolicy.AUTO
    assert d.num_devices is None
    assert Options().distribute == d
    assert Options().deterministic is None


def test_distribute_options_validate():
    d = DistributeOptions()
    d.auto_shard_policy = "data"
    assert d.auto_shard_policy is AutoShardPolicy.DATA
    with pytest.raises(ValueError, match="num_devices"):
        d.num_devices = 0
    with pytest.raises(ValueError, match="num_devices"):
        DistributeOptions(num_devices=True)
    with pytest.raises(AttributeError, match="auto_shard_policy, num_devices"):
        d.auto_shard = AutoShardPolicy.OFF


def test_options_reject_unknown_fields_and_bad_values():
    o = Options()
    with pytest.raises(AttributeError, match="no option 'threading'"):
        o.threading = 4
    with pytest.raises(AttributeError, match="no option 'threading'"):
        _ = o.threading
    with pytest.raises(TypeError, match="deterministic"):
        o.deterministic = "yes"
    with pytest.raises(TypeError, match="DistributeOptions"):
        o.distribute = AutoShardPolicy.DATA


def test_merge_other_set_fields_win_and_unset_fields_do_not():
    a = Options(deterministic=False)
    a.distribute.num_devices = 4
    b = Options()
    b.distribute.auto_shard_policy = AutoShardPolicy.FILE
    m = a.merge(b)
    assert m.deterministic is False, "b did not set deterministic: a's value stays"
    assert m.distribute.num_devices == 4
    assert m.distribute.auto_shard_policy is AutoShardPolicy.FILE
    # b explicitly setting a default value still wins
    c = Options()
    c.distribute.auto_shard_policy = AutoShardPolicy.AUTO
    assert m.merge(c).distribute.auto_shard_policy is AutoShardPolicy.AUTO
    # the inputs are unchanged and the result is a new object
    assert a.distribute.auto_shard_policy is AutoShardPolicy.AUTO
    assert m is not a and m is not b


def test_merge_keeps_explicit_fields_explicit():
    a = Options()
    a.distribute.auto_shard_policy = AutoShardPolicy.OFF
    merged = a.merge(Options())
    later = Options(deterministic=True)
    assert merged.merge(later).distribute.auto_shard_policy is AutoShardPolicy.OFF
    assert Options().merge(merged).distribute.auto_shard_policy is AutoShardPolicy.OFF


def test_merge_needs_options():
    with pytest.raises(TypeError, match="expected an Options"):
        Options().merge(DistributeOptions())
    with pytest.raises(TypeError, match="expected DistributeOptions"):
        DistributeOptions().merge(Options())


def test_assigned_distribute_options_count_as_set():
    o = Options()
    o.distribute = DistributeOptions(auto_shard_policy=AutoShardPolicy.HINT)
    assert Options().merge(o).distribute.auto_shard_policy is AutoShardPolicy.HINT


def test_tf_older_names_are_aliases():
    o = Options()
    o.experimental_distribute.auto_shard_policy = AutoShardPolicy.DATA
    o.experimental_deterministic = False
    assert o.distribute.auto_shard_policy is AutoShardPolicy.DATA
    assert o.deterministic is False


def test_copy_is_independent_and_equal():
    o = Options(deterministic=True)
    c = o.copy()
    assert c == o
    c.distribute.auto_shard_policy = AutoShardPolicy.OFF
    assert o.distribute.auto_shard_policy is AutoShardPolicy.AUTO
    assert c != o


def test_repr_names_every_field():
    text = repr(Options())
    assert "auto_shard_policy=<AutoShardPolicy.AUTO: 0>" in text and "deterministic=None" in text


def test_dataset_options_merge_along_the_chain_later_wins():
    first = Options(deterministic=False)
    first.distribute.auto_shard_policy = AutoShardPolicy.FILE
    second = Options()
    second.distribute.auto_shard_policy = AutoShardPolicy.DATA
    ds = Dataset.range(4).with_options(first).batch(2).with_options(second)
    got = ds.options()
    assert got.distribute.auto_shard_policy is AutoShardPolicy.DATA
    assert got.deterministic is False
    assert ds._input._input.options().distribute.auto_shard_policy is AutoShardPolicy.FILE
    assert Dataset.range(3).options() == Options()


def test_with_options_keeps_a_copy():
    o = Options()
    ds = Dataset.range(2).with_options(o)
    o.distribute.auto_shard_policy = AutoShardPolicy.OFF
    assert ds.options().distribute.auto_shard_policy is AutoShardPolicy.AUTO
    with pytest.raises(TypeError, match="with_options got a dict"):
        Dataset.range(2).with_options({"deterministic": True})
