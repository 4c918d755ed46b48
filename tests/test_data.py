"""Datasets, download with checksums, partitions and federations: real properties."""

from __future__ import annotations

import gzip
import http.server
import shutil
import threading
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import torch

from lowband.data import (
    DatasetError,
    PartitionError,
    build_federation,
    class_counts,
    dirichlet,
    download,
    iid,
    load_dataset,
    ntk_fl,
    shards,
    split_local,
)
from lowband.data.sources import clear_cache


def _labels(n_per_class: int = 100, c: int = 10) -> np.ndarray:
    return np.repeat(np.arange(c), n_per_class)


# -- sources --------------------------------------------------------------------------
def test_fashion_mnist_is_canonical_and_normalised(shared_data: Path) -> None:
    ds = load_dataset("fashion_mnist", shared_data)
    assert ds.train_x.shape == (60000, 1, 28, 28) and ds.test_x.shape == (10000, 1, 28, 28)
    assert torch.bincount(ds.train_y).tolist() == [6000] * 10
    assert torch.bincount(ds.test_y).tolist() == [1000] * 10
    assert abs(float(ds.train_x.mean())) < 0.01 and abs(float(ds.train_x.std()) - 1) < 0.01


def test_mnist_counts(shared_data: Path) -> None:
    ds = load_dataset("mnist", shared_data)
    assert len(ds.train_y) == 60000 and len(ds.test_y) == 10000 and ds.num_classes == 10


def test_cifar10_structure(shared_data: Path) -> None:
    """The offline copy lacks 161 images (shared/data/README.md): exact counts."""
    ds = load_dataset("cifar10", shared_data)
    assert ds.train_x.shape == (9976 + 9992 + 9986 + 9961 + 9958, 3, 32, 32)
    assert len(ds.test_y) == 9966 and ds.num_classes == 10
    assert int((ds.train_y == 8).sum()) == 5000 - 118  # ships are the missing ones


def test_ag_news_split_from_test_csv(shared_data: Path) -> None:
    ds = load_dataset("ag_news", shared_data)
    assert ds.num_classes == 4 and len(ds.train_y) == 6000 and len(ds.test_y) == 1600
    assert torch.bincount(ds.train_y).tolist() == [1500] * 4  # stratified
    assert ds.train_x.dtype == torch.int64 and int(ds.train_x.max()) < ds.meta["vocab_size"]


def test_embedded_sources_need_no_files(tmp_path: Path) -> None:
    d = load_dataset("digits", tmp_path)
    assert d.train_x.shape[1:] == (1, 8, 8) and len(d.train_y) + len(d.test_y) == 1797
    s = load_dataset("synthetic", tmp_path, num_clients=5)
    assert s.natural_partition is not None and len(s.natural_partition) == 5
    fed = build_federation(s, num_clients=5, partition="natural")
    assert sum(n.n_train for n in fed.nodes) == len(s.train_y)


def test_missing_file_is_one_clear_line(tmp_path: Path) -> None:
    with pytest.raises(DatasetError) as e:
        load_dataset("fashion_mnist", tmp_path)
    msg = str(e.value)
    assert "\n" not in msg and "train-images-idx3-ubyte.gz" in msg and "lowband download" in msg


def test_corrupt_gzip_is_reported(tmp_path: Path, shared_data: Path) -> None:
    clear_cache()
    d = tmp_path / "fashion-mnist"
    d.mkdir()
    for f in (shared_data / "fashion-mnist").iterdir():
        shutil.copy(f, d / f.name)
    raw = (d / "t10k-labels-idx1-ubyte.gz").read_bytes()
    (d / "t10k-labels-idx1-ubyte.gz").write_bytes(raw[: len(raw) // 2])
    with pytest.raises(DatasetError) as e:
        load_dataset("fashion_mnist", tmp_path)
    assert "t10k-labels" in str(e.value) and "\n" not in str(e.value)


# -- download -------------------------------------------------------------------------
class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass


def _serve(root: Path) -> tuple[http.server.ThreadingHTTPServer, str]:
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), partial(_Quiet, directory=str(root)))
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, f"http://127.0.0.1:{srv.server_address[1]}"


def test_download_verifies_checksums_over_http(tmp_path: Path, shared_data: Path) -> None:
    srv, url = _serve(shared_data)
    try:
        paths = download("fashion_mnist", tmp_path / "dl", base_url=url)
        assert len(paths) == 4 and all(p.exists() for p in paths)
        ds = load_dataset("fashion_mnist", tmp_path / "dl")
        assert len(ds.train_y) == 60000
    finally:
        srv.shutdown()


def test_download_rejects_a_corrupted_file(tmp_path: Path, shared_data: Path) -> None:
    mirror = tmp_path / "mirror" / "fashion-mnist"
    mirror.mkdir(parents=True)
    for f in (shared_data / "fashion-mnist").iterdir():
        shutil.copy(f, mirror / f.name)
    bad = mirror / "t10k-labels-idx1-ubyte.gz"
    data = bytearray(bad.read_bytes())
    data[100] ^= 0xFF
    bad.write_bytes(bytes(data))
    srv, url = _serve(tmp_path / "mirror")
    try:
        with pytest.raises(DatasetError) as e:
            download("fashion_mnist", tmp_path / "dl", base_url=url)
    finally:
        srv.shutdown()
    assert "t10k-labels-idx1-ubyte.gz" in str(e.value) and "md5" in str(e.value).lower()
    left = list((tmp_path / "dl").rglob("t10k-labels*"))
    assert left == [], f"a corrupt download was left behind: {left}"


# -- partitions -----------------------------------------------------------------------
def test_iid_is_disjoint_and_covers() -> None:
    parts = iid(1000, 7, np.random.default_rng(0))
    allidx = np.concatenate(parts)
    assert sorted(allidx.tolist()) == list(range(1000)) and max(map(len, parts)) - min(map(len, parts)) <= 1


def test_dirichlet_min_size_disjoint_and_skew_grows_as_alpha_shrinks() -> None:
    labels = _labels(300)

    def mean_entropy(alpha: float) -> float:
        parts = dirichlet(labels, 20, alpha, np.random.default_rng(1), min_size=10)
        assert min(map(len, parts)) >= 10
        allidx = np.concatenate(parts)
        assert len(allidx) == len(set(allidx.tolist())) == len(labels)
        c = class_counts(parts, labels, 10).astype(float)
        p = c / c.sum(1, keepdims=True)
        return float(np.mean(-(p * np.log(np.where(p > 0, p, 1.0))).sum(1)))

    assert mean_entropy(0.1) < mean_entropy(1.0) < mean_entropy(100.0)


def test_dirichlet_impossible_request_fails_clearly() -> None:
    with pytest.raises(PartitionError) as e:
        # feasible by size (40 x 12 <= 500) but hopeless at alpha 0.01: the retry cap must end it
        dirichlet(_labels(50), 40, 0.01, np.random.default_rng(0), min_size=12, max_retries=20)
    assert "\n" not in str(e.value) and "alpha" in str(e.value) and "20" in str(e.value)


def test_shards_limit_classes_per_client() -> None:
    labels = _labels(120)
    parts = shards(labels, 30, 2, np.random.default_rng(0))
    c = class_counts(parts, labels, 10)
    assert ((c > 0).sum(1) <= 2).all()
    allidx = np.concatenate(parts)
    assert len(allidx) == len(set(allidx.tolist()))


def test_ntk_fl_recipe() -> None:
    labels = _labels(6000)
    parts = ntk_fl(labels, 300, 0.1, np.random.default_rng(0), samples_per_client=200)
    sizes = np.array([len(p) for p in parts])
    assert sizes.min() >= 190 and sizes.max() <= 200
    assert all(len(set(p.tolist())) == len(p) for p in parts)
    again = ntk_fl(labels, 300, 0.1, np.random.default_rng(0), samples_per_client=200)
    assert all((a == b).all() for a, b in zip(parts, again))
    c = class_counts(parts, labels, 10)
    assert np.mean((c > 0).sum(1)) < 5  # alpha = 0.1: few classes per node
    iid_parts = ntk_fl(labels, 300, None, np.random.default_rng(0), samples_per_client=200)
    assert all(len(p) == 200 for p in iid_parts)
    flat = np.concatenate(iid_parts)
    assert len(flat) == len(set(flat.tolist()))


def test_split_local_is_stratified() -> None:
    labels = _labels(40, 5)
    idx = np.arange(len(labels))
    tr, va, te = split_local(idx, labels, (0.7, 0.15, 0.15), np.random.default_rng(0))
    assert len(tr) + len(va) + len(te) == len(idx)
    for part, r in ((tr, 0.7), (va, 0.15), (te, 0.15)):
        counts = np.bincount(labels[part], minlength=5)
        assert np.all(np.abs(counts - 40 * r) <= 1)


def test_federation_public_set_and_global_test_are_held_out(tmp_path: Path) -> None:
    ds = load_dataset("digits", tmp_path)
    fed = build_federation(ds, num_clients=6, partition="dirichlet", alpha=0.5, min_size=10,
                           split=(0.75, 0.0, 0.25), public_size=100, seed=3)
    assert len(fed.public_y) == 100
    assert torch.equal(fed.global_test_y, ds.test_y)
    pub = {tuple(r.tolist()) for r in fed.public_x.reshape(100, -1)}
    for nd in fed.nodes:
        for x in torch.cat([nd.train_x, nd.test_x]).reshape(-1, 64):
            assert tuple(x.tolist()) not in pub
    again = build_federation(ds, num_clients=6, partition="dirichlet", alpha=0.5, min_size=10,
                             split=(0.75, 0.0, 0.25), public_size=100, seed=3)
    assert all(torch.equal(a.train_y, b.train_y) for a, b in zip(fed.nodes, again.nodes))
