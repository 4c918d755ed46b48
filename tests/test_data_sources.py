"""Dataset sources: canonical counts and normalisation on the shared offline data, and
one-line errors for missing / corrupt / mis-shaped files (on small files written here)."""

from __future__ import annotations

import csv
import gzip
import io
import pickle
import struct
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch

from lowband.data import DATASETS, DatasetError, load_dataset, resolve_data_dir
from lowband.data.agnews import tokenize
from lowband.data.sources import clear_cache, missing_files

def _one_line_error(fn, *args, **kw) -> str:
    with pytest.raises(DatasetError) as e:
        fn(*args, **kw)
    msg = str(e.value)
    assert "\n" not in msg, msg
    return msg


# -- shared, real files ----------------------------------------------------------------
@pytest.mark.parametrize("name", ["mnist", "fashion_mnist"])
def test_idx_datasets_are_canonical_and_normalised(shared_data: Path, name: str) -> None:
    ds = load_dataset(name, shared_data)
    assert ds.train_x.shape == (60000, 1, 28, 28) and ds.test_x.shape == (10000, 1, 28, 28)
    assert ds.train_x.dtype == torch.float32 and ds.train_y.dtype == torch.int64
    assert ds.input_shape == (1, 28, 28) and ds.num_classes == 10 and len(ds.meta["classes"]) == 10
    for y, n in ((ds.train_y, 60000), (ds.test_y, 10000)):
        counts = torch.bincount(y, minlength=10)
        assert int(y.min()) == 0 and int(y.max()) == 9
        assert (counts > 0.85 * n / 10).all() and (counts < 1.15 * n / 10).all()  # balanced-ish
    assert abs(float(ds.train_x.mean())) < 0.01 and abs(float(ds.train_x.std()) - 1) < 0.01
    assert abs(float(ds.test_x.mean())) < 0.05 and abs(float(ds.test_x.std()) - 1) < 0.05


def test_cifar10_offline_copy_counts_and_channels(shared_data: Path) -> None:
    ds = load_dataset("cifar10", shared_data)
    assert ds.train_x.shape == (9976 + 9992 + 9986 + 9961 + 9958, 3, 32, 32)
    assert ds.test_x.shape == (9966, 3, 32, 32) and ds.input_shape == (3, 32, 32)
    # missing: 127 train (118 ship, 7 horse, 1 deer, 1 dog), 34 test (33 ship, 1 horse)
    train = torch.bincount(ds.train_y, minlength=10).tolist()
    assert train == [5000, 5000, 5000, 5000, 4999, 4999, 5000, 4993, 4882, 5000]
    assert torch.bincount(ds.test_y, minlength=10).tolist() == [1000] * 7 + [999, 967, 1000]
    sample = ds.train_x[::10]  # every 10th image: enough for the statistics, 10x cheaper
    mean, std = sample.mean(dim=(0, 2, 3)), sample.std(dim=(0, 2, 3))
    assert mean.abs().max() < 0.02 and (std - 1).abs().max() < 0.02
    assert ds.meta["classes"][8] == "ship"


def test_ag_news_vocab_from_train_only(shared_data: Path) -> None:
    ds = load_dataset("ag_news", shared_data, vocab_size=1_000_000)
    assert ds.num_classes == 4 and ds.input_shape == (64,) and ds.train_x.dtype == torch.int64
    assert (len(ds.train_y), len(ds.test_y)) == (6000, 1600)
    assert torch.bincount(ds.test_y).tolist() == [400] * 4
    # an uncapped vocabulary built on train covers every train word but not every test word
    assert int((ds.train_x == 1).sum()) == 0
    assert int((ds.test_x == 1).sum()) > 0
    assert ds.meta["vocab_size"] == len(ds.meta["itos"]) and int(ds.test_x.max()) < ds.meta["vocab_size"]
    capped = load_dataset("ag_news", shared_data, vocab_size=500, max_len=16)
    assert capped.meta["vocab_size"] == 500 and capped.train_x.shape == (6000, 16)
    assert int(capped.train_x.max()) == 499 and capped.meta["itos"][:2] == ["<pad>", "<unk>"]
    other = load_dataset("ag_news", shared_data, seed=1)
    assert not torch.equal(other.train_y, load_dataset("ag_news", shared_data).train_y)


# -- files written by the tests --------------------------------------------------------
def _write_agnews(path: Path, rows: list[tuple[int, str, str]]) -> None:
    with open(path, "w", newline="", encoding="utf-8") as f:
        csv.writer(f, quoting=csv.QUOTE_ALL).writerows(rows)


def test_ag_news_uses_official_split_when_train_csv_exists(tmp_path: Path) -> None:
    d = tmp_path / "ag_news"
    d.mkdir()
    _write_agnews(d / "train.csv", [(k % 4 + 1, f"Title {k}", "Markets rose\\sharply today") for k in range(8)])
    _write_agnews(d / "test.csv", [(2, "Zebraword wins", "markets")])
    ds = load_dataset("ag_news", tmp_path, max_len=6)
    assert len(ds.train_y) == 8 and ds.train_y.tolist() == [0, 1, 2, 3] * 2
    itos = ds.meta["itos"]
    assert "zebraword" not in itos and "sharply" in itos  # backslash = line break
    row = ds.test_x[0].tolist()
    assert row[0] == 1 and row[2] == itos.index("markets") and row[3:] == [0, 0, 0]
    assert "official" in ds.meta["split"]
    assert tokenize("Don't STOP\\me") == ["don't", "stop", "me"]


def test_ag_news_bad_row_is_reported(tmp_path: Path) -> None:
    d = tmp_path / "ag_news"
    d.mkdir()
    (d / "test.csv").write_text('"9","title","text"\n')
    msg = _one_line_error(load_dataset, "ag_news", tmp_path)
    assert "test.csv" in msg and "row 1" in msg


def _link_fmnist(shared_data: Path, tmp: Path) -> Path:
    d = tmp / "fashion-mnist"
    d.mkdir()
    for f in (shared_data / "fashion-mnist").iterdir():
        (d / f.name).symlink_to(f)
    return d


def test_missing_file_names_the_file_and_the_fix(tmp_path: Path) -> None:
    clear_cache()
    msg = _one_line_error(load_dataset, "fashion_mnist", tmp_path)
    assert f"missing {tmp_path / 'fashion-mnist' / 'train-images-idx3-ubyte.gz'}" in msg
    assert "60000 28x28" in msg and f"lowband download fashion_mnist --data-dir {tmp_path}" in msg
    assert "LOWBAND_DATA" in msg
    assert len(missing_files("fashion_mnist", tmp_path)) == 4 and missing_files("digits", tmp_path) == []


@pytest.mark.parametrize(
    "content, expect",
    [
        (b"not gzip at all", "gzip"),
        (gzip.compress(struct.pack(">I", 0x803) + b"\0" * 8), "magic"),  # images magic in a label file
        (gzip.compress(struct.pack(">II", 0x801, 100) + bytes(100)), "shape (100,)"),
        (gzip.compress(struct.pack(">II", 0x801, 10000) + bytes(9000)), "9000 data bytes"),
        (gzip.compress(struct.pack(">II", 0x801, 10000) + bytes(10000))[:-20], "gzip"),  # truncated
    ],
)
def test_corrupt_idx_files_are_one_line_errors(shared_data: Path, tmp_path: Path, content: bytes, expect: str) -> None:
    d = _link_fmnist(shared_data, tmp_path)
    target = d / "t10k-labels-idx1-ubyte.gz"
    target.unlink()
    target.write_bytes(content)
    clear_cache()
    msg = _one_line_error(load_dataset, "fashion_mnist", tmp_path)
    assert str(target) in msg and expect in msg and "--force" in msg


def _cifar_batch(n: int, seed: int, overrides: dict | None = None) -> bytes:
    rng = np.random.default_rng(seed)
    d = {b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
         b"labels": rng.integers(0, 10, n).tolist(), b"batch_label": b"x"}
    d.update(overrides or {})
    return pickle.dumps(d, protocol=2)


def _cifar_tar(path: Path, members: dict[str, bytes]) -> None:
    with tarfile.open(path, "w:gz") as tf:
        for name, raw in members.items():
            info = tarfile.TarInfo(f"cifar-10-batches-py/{name}")
            info.size = len(raw)
            tf.addfile(info, io.BytesIO(raw))


def _cifar_members(**extra: bytes) -> dict[str, bytes]:
    m = {f"data_batch_{i}": _cifar_batch(4, i) for i in range(1, 6)}
    m["test_batch"] = _cifar_batch(3, 9)
    m.update(extra)
    return m


def test_cifar10_small_archive_and_extracted_folder_agree(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    _cifar_tar(a / "cifar-10-python.tar.gz", _cifar_members())
    (b / "cifar-10-batches-py").mkdir(parents=True)
    for name, raw in _cifar_members().items():
        (b / "cifar-10-batches-py" / name).write_bytes(raw)
    da, db = load_dataset("cifar10", a), load_dataset("cifar10", b)
    assert da.train_x.shape == (20, 3, 32, 32) and da.test_x.shape == (3, 3, 32, 32)
    assert torch.equal(da.train_x, db.train_x) and torch.equal(da.test_y, db.test_y)
    raw = pickle.loads(_cifar_batch(4, 1), encoding="bytes")[b"data"][0]
    want = (raw.reshape(3, 32, 32)[0, 0, 0] / 255 - 0.4914) / 0.2470  # red channel, pixel (0, 0)
    assert abs(float(da.train_x[0, 0, 0, 0]) - want) < 1e-5


@pytest.mark.parametrize(
    "members, expect",
    [
        ({k: v for k, v in _cifar_members().items() if k != "test_batch"}, "bad tar layout"),
        (_cifar_members(data_batch_3=_cifar_batch(4, 3, {b"data": np.zeros((4, 100), np.uint8)})), "(n, 3072)"),
        (_cifar_members(data_batch_2=_cifar_batch(4, 2, {b"labels": [0, 1]})), "labels"),
        (_cifar_members(data_batch_1=pickle.dumps({b"data": tarfile.TarInfo()}, protocol=2)), "not allowed"),
    ],
)
def test_cifar10_bad_archives_are_one_line_errors(tmp_path: Path, members: dict, expect: str) -> None:
    _cifar_tar(tmp_path / "cifar-10-python.tar.gz", members)
    msg = _one_line_error(load_dataset, "cifar10", tmp_path)
    assert "cifar-10-python.tar.gz" in msg and expect in msg


def test_cifar10_truncated_archive(tmp_path: Path) -> None:
    _cifar_tar(tmp_path / "whole.tar.gz", _cifar_members())
    raw = (tmp_path / "whole.tar.gz").read_bytes()
    (tmp_path / "cifar-10-python.tar.gz").write_bytes(raw[: len(raw) // 2])
    msg = _one_line_error(load_dataset, "cifar10", tmp_path)
    assert "corrupt" in msg and "cifar-10-python.tar.gz" in msg


# -- file-free sources, registry, cache -------------------------------------------------
def test_digits_seeded_stratified_split(tmp_path: Path) -> None:
    d = load_dataset("digits")
    assert (len(d.train_y), len(d.test_y)) == (1438, 359) and d.input_shape == (1, 8, 8)
    assert abs(float(d.train_x.mean())) < 1e-4 and abs(float(d.train_x.std()) - 1) < 1e-3
    test_counts = torch.bincount(d.test_y, minlength=10)
    assert (test_counts >= 34).all() and (test_counts <= 37).all()
    assert not torch.equal(load_dataset("digits", seed=1).test_y, d.test_y)
    assert len(load_dataset("digits", test_fraction=0.5).test_y) in (898, 899)


def test_synthetic_fedprox_generator() -> None:
    s = load_dataset("synthetic", num_clients=10, seed=3)
    again = load_dataset("synthetic", num_clients=10, seed=3)
    clear_cache()
    fresh = load_dataset("synthetic", num_clients=10, seed=3)
    assert s is again and fresh is not s and torch.equal(fresh.train_x, s.train_x)
    sizes = s.meta["samples_per_client"]
    assert len(sizes) == 10 and min(sizes) >= 50
    parts = s.natural_partition
    assert [len(p) for p in parts] == [int(0.8 * n) for n in sizes]
    assert np.array_equal(np.concatenate(parts), np.arange(len(s.train_y)))
    assert len(s.train_y) + len(s.test_y) == sum(sizes) and s.train_x.shape[1:] == (60,)
    # non-IID: per-client label distributions differ a lot
    y = s.train_y.numpy()
    dominant = {int(np.bincount(y[p], minlength=10).argmax()) for p in parts}
    assert len(dominant) >= 3
    iid = load_dataset("synthetic", iid=True, num_clients=4, dim=20, num_classes=5)
    assert iid.train_x.shape[1] == 20 and int(iid.train_y.max()) <= 4
    assert not torch.equal(load_dataset("synthetic", num_clients=10, seed=4).train_y[:50], s.train_y[:50])


def test_registry_options_and_names_are_validated() -> None:
    assert set(DATASETS) == {"mnist", "fashion_mnist", "cifar10", "ag_news", "digits", "synthetic", "npz", "csv",
                             "shakespeare", "leaf_femnist", "leaf_shakespeare", "leaf_sent140"}
    assert DATASETS["ag_news"].options["vocab_size"] == 20000 and DATASETS["digits"].needs_files == ()
    for call, expect in [
        (lambda: load_dataset("imagenet"), "unknown dataset 'imagenet'"),
        (lambda: load_dataset("npz"), "read from a path"),  # the user's data: lowband.data.userdata
        (lambda: load_dataset("digits", test_fraction=0.2, seeds=1), "unknown option 'seeds'"),
        (lambda: load_dataset("synthetic", num_clients=2.5), "'num_clients' must be int"),
        (lambda: load_dataset("synthetic", iid=1), "'iid' must be bool"),
    ]:
        with pytest.raises(ValueError, match=expect):
            call()


def test_resolve_data_dir_precedence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOWBAND_DATA", str(tmp_path / "env"))
    assert resolve_data_dir(tmp_path / "arg") == tmp_path / "arg"
    assert resolve_data_dir(None) == tmp_path / "env"
    monkeypatch.delenv("LOWBAND_DATA")
    default = resolve_data_dir(None)
    assert default.name == "data" and "lowband" in str(default)
