"""File sources: list_files, from_files, .npy/.npz/HDF5 readers, batches across files."""

from __future__ import annotations

import sys

import numpy as np
import pytest

import hpcdist.data.dataset as dsmod
from hpcdist.data.dataset import (
    UNKNOWN,
    Dataset,
    FileListDataset,
    FileReaderDataset,
    ShardDataset,
    TensorSpec,
)
from hpcdist.data.sources import glob_files, import_h5py


@pytest.fixture
def npy_files(tmp_path):
    """Three .npy files with 4, 0 and 5 rows of shape (2,); rows are numbered 0..8."""
    sizes = [4, 0, 5]
    start = 0
    paths = []
    for i, n in enumerate(sizes):
        rows = np.arange(start, start + n, dtype=np.float32)[:, None] * np.array([1, -1], "f4")
        path = tmp_path / f"part-{i}.npy"
        np.save(path, rows.reshape(n, 2))
        paths.append(str(path))
        start += n
    return paths


@pytest.fixture
def generic(monkeypatch):
    """Switch the fast paths off, for comparing with the element-by-element path."""
    monkeypatch.setattr(dsmod, "_FAST_PATHS", False)


def _firsts(ds):
    return [float(x[0]) for x in ds]


def test_read_npy_yields_rows_in_file_order(npy_files):
    ds = Dataset.from_files(npy_files).read_npy()
    assert _firsts(ds) == list(map(float, range(9)))
    rows = list(ds)
    assert type(rows[0]) is np.ndarray, "rows are plain copies, not memory-mapped views"
    assert rows[0].flags.owndata and rows[0].dtype == np.float32
    assert ds.element_spec == TensorSpec((2,), np.float32)
    assert ds.cardinality() == UNKNOWN


def test_read_npy_uses_a_memory_map(npy_files, monkeypatch):
    calls = []
    real = np.load

    def spy(*args, **kwargs):
        calls.append(kwargs.get("mmap_mode"))
        return real(*args, **kwargs)

    monkeypatch.setattr(np, "load", spy)
    list(Dataset.from_files(npy_files).read_npy().batch(3))
    assert calls == ["r", "r", "r"], "one memory-mapped load per file, in turn"


def test_one_dimensional_files_give_numpy_scalars(tmp_path):
    np.save(tmp_path / "a.npy", np.arange(3))
    values = list(Dataset.from_files([tmp_path / "a.npy"]).read_npy())
    assert values == [0, 1, 2] and all(isinstance(v, np.int64) for v in values)


def test_batches_span_files_and_match_the_generic_path(npy_files, monkeypatch):
    for drop in (False, True):
        fast = [b[:, 0].tolist() for b in Dataset.from_files(npy_files).read_npy().batch(2, drop)]
        monkeypatch.setattr(dsmod, "_FAST_PATHS", False)
        slow = [b[:, 0].tolist() for b in Dataset.from_files(npy_files).read_npy().batch(2, drop)]
        monkeypatch.setattr(dsmod, "_FAST_PATHS", True)
        assert fast == slow
    assert fast == [[0, 1], [2, 3], [4, 5], [6, 7]]
    all_rows = [b[:, 0].tolist() for b in Dataset.from_files(npy_files).read_npy().batch(2)]
    assert all_rows[-1] == [8]


def test_list_files_sorted_shuffled_and_seeded(npy_files, tmp_path):
    pattern = str(tmp_path / "part-*.npy")
    assert Dataset.list_files(pattern, shuffle=False).files == tuple(npy_files)
    assert list(Dataset.list_files(pattern, shuffle=False)) == npy_files
    seeded = Dataset.list_files(pattern, seed=3)
    assert seeded.shuffle_files, "TF shuffles file names by default"
    first = list(seeded)
    assert sorted(first) == npy_files
    assert first == [npy_files[i] for i in np.random.default_rng(3).permutation(3)]
    assert list(Dataset.list_files(pattern, seed=3)) == first, "same seed, same order"
    assert sorted(Dataset.list_files(pattern)) == npy_files
    assert Dataset.list_files([pattern, pattern], shuffle=False).files == tuple(npy_files)


def test_file_names_can_be_shuffled_again(npy_files, tmp_path):
    # the shuffle flag once shadowed Dataset.shuffle: calling it raised "'bool' object is
    # not callable"
    for names in (Dataset.list_files(str(tmp_path / "part-*.npy")), Dataset.from_files(npy_files)):
        shuffled = list(names.shuffle(3, seed=5))
        assert sorted(shuffled) == npy_files


def test_list_files_without_match_names_the_pattern(tmp_path):
    with pytest.raises(ValueError, match=r"no files match .*nothing-\*\.npy"):
        Dataset.list_files(str(tmp_path / "nothing-*.npy"))
    with pytest.raises(ValueError, match="no pattern"):
        glob_files([])


def test_from_files_keeps_the_order_and_checks_existence(npy_files, tmp_path):
    order = [npy_files[2], npy_files[0]]
    ds = Dataset.from_files(order)
    assert isinstance(ds, FileListDataset) and ds.files == tuple(order) and ds._input is None
    assert ds.cardinality() == 2 and ds.element_spec.shape == ()
    assert _firsts(ds.read_npy()) == [4.0, 5.0, 6.0, 7.0, 8.0, 0.0, 1.0, 2.0, 3.0]
    with pytest.raises(FileNotFoundError, match="missing.npy"):
        Dataset.from_files([str(tmp_path / "missing.npy")])
    assert Dataset.from_files(npy_files[0]).files == (npy_files[0],)


def test_readers_need_file_names():
    with pytest.raises(TypeError, match="file name was expected"):
        list(Dataset.range(2).read_npy())


def test_npy_errors_name_the_file(tmp_path):
    np.savez(tmp_path / "z.npz", x=np.zeros(2))
    with pytest.raises(ValueError, match="not a .npy file.*read_npz"):
        list(Dataset.from_files([tmp_path / "z.npz"]).read_npy())
    np.save(tmp_path / "s.npy", np.float32(1))
    with pytest.raises(ValueError, match="s.npy.*scalar"):
        list(Dataset.from_files([tmp_path / "s.npy"]).read_npy())


@pytest.fixture
def npz_files(tmp_path):
    paths = []
    for i, n in enumerate([3, 2]):
        path = tmp_path / f"d{i}.npz"
        np.savez(path, x=np.arange(n * 2).reshape(n, 2) + 10 * i, y=np.arange(n) + 10 * i)
        paths.append(path)
    return paths


def test_read_npz_dict_tuple_and_single_key(npz_files):
    files = Dataset.from_files(npz_files)
    rows = list(files.read_npz())
    assert [list(r) for r in rows] == [["x", "y"]] * 5
    assert [int(r["y"]) for r in rows] == [0, 1, 2, 10, 11]
    assert rows[3]["x"].tolist() == [10, 11]
    pairs = list(files.read_npz(["y", "x"]))
    assert [(int(y), x.tolist()) for y, x in pairs][:2] == [(0, [0, 1]), (1, [2, 3])]
    assert [int(y) for y in files.read_npz("y")] == [0, 1, 2, 10, 11]
    spec = files.read_npz().element_spec
    assert spec == {"x": TensorSpec((2,), np.int64), "y": TensorSpec((), np.int64)}
    batches = list(files.read_npz(["x", "y"]).batch(4))
    assert batches[0][1].tolist() == [0, 1, 2, 10] and batches[1][0].shape == (1, 2)


def test_read_npz_errors(npz_files, tmp_path):
    with pytest.raises(ValueError, match="no array named 'z'.*'x', 'y'"):
        list(Dataset.from_files(npz_files).read_npz(["x", "z"]))
    with pytest.raises(TypeError, match="keys"):
        Dataset.from_files(npz_files).read_npz([1, 2])
    np.savez(tmp_path / "bad.npz", x=np.zeros((3, 2)), y=np.zeros(4))
    with pytest.raises(ValueError, match="different numbers of rows"):
        list(Dataset.from_files([tmp_path / "bad.npz"]).read_npz())
    np.save(tmp_path / "a.npy", np.zeros(2))
    with pytest.raises(ValueError, match="not a .npz archive"):
        list(Dataset.from_files([tmp_path / "a.npy"]).read_npz())


def test_element_spec_of_a_reader_without_files():
    with pytest.raises(ValueError, match="no files"):
        _ = Dataset.from_files([]).read_npy().element_spec


def test_file_sharding_goes_between_the_names_and_the_reader(npy_files):
    reader = Dataset.from_files(npy_files).read_npy().batch(2)
    read = reader._input
    assert isinstance(read, FileReaderDataset) and isinstance(read._input, FileListDataset)
    for index, expected in [(0, list(range(9))), (1, [])]:  # files 0 and 2 | file 1 (empty)
        sharded_read = read._with_input(ShardDataset(read._input, 2, index))
        rebuilt = reader._with_input(sharded_read)
        assert isinstance(rebuilt._input._input, ShardDataset)
        got = [v for b in rebuilt for v in b[:, 0].tolist()]
        assert got == expected
    three = read._with_input(ShardDataset(read._input, 3, 2))
    assert _firsts(three) == [4.0, 5.0, 6.0, 7.0, 8.0]
    assert _firsts(read) == list(map(float, range(9))), "the original is unchanged"


def test_missing_h5py_is_a_clear_import_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "h5py", None)
    with pytest.raises(ImportError, match="pip install h5py"):
        import_h5py()
    with pytest.raises(ImportError, match="read_hdf5 needs h5py"):
        Dataset.from_files([]).read_hdf5("x")


def test_read_hdf5(tmp_path):
    h5py = pytest.importorskip("h5py")
    paths = []
    for i, n in enumerate([2, 3]):
        path = tmp_path / f"h{i}.h5"
        with h5py.File(path, "w") as f:
            f["images"] = np.arange(n * 4, dtype="f4").reshape(n, 2, 2) + 100 * i
            f["labels"] = np.arange(n) + 100 * i
        paths.append(path)
    ds = Dataset.from_files(paths).read_hdf5(["images", "labels"])
    assert [int(label) for _, label in ds] == [0, 1, 100, 101, 102]
    assert ds.element_spec == (TensorSpec((2, 2), "f4"), TensorSpec((), np.int64))
    batches = list(ds.batch(2))
    assert [b[1].tolist() for b in batches] == [[0, 1], [100, 101], [102]]
    assert [int(v) for v in Dataset.from_files(paths).read_hdf5("labels")][-1] == 102
    with pytest.raises(ValueError, match="no array named 'masks'"):
        list(Dataset.from_files(paths).read_hdf5("masks"))
