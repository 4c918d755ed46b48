"""Partitioners, local splits and federations: the properties each recipe promises."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
import torch

from lowband.data import (
    PartitionError,
    build_federation,
    class_counts,
    dirichlet,
    iid,
    load_dataset,
    ntk_fl,
    plot_partition,
    shards,
    split_local,
)
from lowband.seeding import np_gen

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
# MNIST's real (unequal) class sizes, so shards cannot rely on equal classes
MNIST_TRAIN_COUNTS = [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949]


def _labels(counts: list[int]) -> np.ndarray:
    return np.repeat(np.arange(len(counts)), counts)


def _mean_entropy(parts: list[np.ndarray], labels: np.ndarray, c: int) -> float:
    m = class_counts(parts, labels, c).astype(float)
    p = m / m.sum(1, keepdims=True)
    return float(np.mean(-(p * np.log(np.where(p > 0, p, 1.0))).sum(1)))


def _disjoint_cover(parts: list[np.ndarray], n: int) -> None:
    flat = np.concatenate(parts)
    assert flat.dtype == np.int64 and len(flat) == n and np.array_equal(np.sort(flat), np.arange(n))


# -- iid / dirichlet -------------------------------------------------------------------
def test_iid_shards_are_near_equal_and_seeded() -> None:
    parts = iid(1003, 10, np_gen(0, "p"))
    _disjoint_cover(parts, 1003)
    assert {len(p) for p in parts} == {100, 101}
    again = iid(1003, 10, np_gen(0, "p"))
    assert all(np.array_equal(a, b) for a, b in zip(parts, again))
    with pytest.raises(PartitionError, match="num_clients=11"):
        iid(10, 11, np_gen(0))


def test_dirichlet_min_size_cover_and_skew_on_real_labels() -> None:
    if (SHARED_DATA / "fashion-mnist").is_dir():
        labels = load_dataset("fashion_mnist", SHARED_DATA).train_y.numpy()
    else:
        labels = _labels([6000] * 10)
    ent = {}
    for alpha in (0.1, 1.0, 10.0):
        parts = dirichlet(labels, 20, alpha, np_gen(0, "dir", str(alpha)), min_size=10)
        _disjoint_cover(parts, len(labels))
        assert min(map(len, parts)) >= 10
        ent[alpha] = _mean_entropy(parts, labels, 10)
    assert ent[0.1] < ent[1.0] < ent[10.0] and ent[10.0] > 2.0 and ent[0.1] < 1.2


def test_dirichlet_same_seed_same_partition_and_odd_label_values() -> None:
    labels = np.repeat([3, 7, 11], 200)  # non-contiguous label values
    a = dirichlet(labels, 5, 0.5, np_gen(4, "x"), min_size=5)
    b = dirichlet(labels, 5, 0.5, np_gen(4, "x"), min_size=5)
    c = dirichlet(labels, 5, 0.5, np_gen(5, "x"), min_size=5)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c))
    _disjoint_cover(a, 600)


def test_dirichlet_impossible_requests_fail_fast_with_advice() -> None:
    labels = _labels([100] * 10)
    with pytest.raises(PartitionError) as e:  # impossible by size: immediate
        dirichlet(labels, 50, 1.0, np_gen(0), min_size=30)
    assert "min_size" in str(e.value) and "\n" not in str(e.value)
    t = time.process_time()  # CPU time, not wall: the same on a loaded machine
    with pytest.raises(PartitionError) as e:  # possible by size, hopeless in practice: the cap ends it
        dirichlet(labels, 40, 0.01, np_gen(0), min_size=20, max_retries=50)
    assert time.process_time() - t < 5
    msg = str(e.value)
    assert "after 50 tries" in msg and "larger alpha" in msg and "fewer clients" in msg and "\n" not in msg
    with pytest.raises(ValueError, match="alpha must be > 0"):
        dirichlet(labels, 4, 0.0, np_gen(0))


# -- shards / ntk_fl -------------------------------------------------------------------
@pytest.mark.parametrize("clients, per_client", [(100, 2), (30, 3), (7, 1)])
def test_shards_respect_classes_per_client_with_unequal_classes(clients: int, per_client: int) -> None:
    labels = _labels(MNIST_TRAIN_COUNTS)
    parts = shards(labels, clients, per_client, np_gen(1, "shards"))
    counts = class_counts(parts, labels, 10)
    assert ((counts > 0).sum(1) <= per_client).all()
    flat = np.concatenate(parts)
    assert len(flat) == len(np.unique(flat))  # disjoint
    if clients * per_client >= 10:
        assert len(flat) == len(labels)  # and covering, when every class gets a shard
    sizes = [len(p) for p in parts]
    assert max(sizes) < 2.5 * min(sizes)


def test_ntk_fl_recipe_sizes_overlap_and_reproducibility() -> None:
    labels = _labels(MNIST_TRAIN_COUNTS)
    parts = ntk_fl(labels, 300, 0.5, np_gen(7, "ntk"), samples_per_client=200)
    sizes = np.array([len(p) for p in parts])
    assert sizes.min() >= 200 - 10 and sizes.max() <= 200
    assert all(len(np.unique(p)) == len(p) for p in parts)  # no duplicate within a node
    flat = np.concatenate(parts)
    assert len(np.unique(flat)) < len(flat)  # overlap across nodes is allowed and happens
    assert all(np.array_equal(a, b) for a, b in zip(parts, ntk_fl(labels, 300, 0.5, np_gen(7, "ntk"))))
    assert not all(np.array_equal(a, b) for a, b in zip(parts, ntk_fl(labels, 300, 0.5, np_gen(8, "ntk"))))
    skewed = ntk_fl(labels, 100, 0.05, np_gen(7, "ntk"))
    assert _mean_entropy(skewed, labels, 10) < _mean_entropy(parts[:100], labels, 10)


def test_ntk_fl_iid_is_disjoint_blocks() -> None:
    labels = _labels([50] * 4)
    parts = ntk_fl(labels, 4, None, np_gen(0), samples_per_client=50)
    _disjoint_cover(parts, 200)
    assert all(len(p) == 50 for p in parts)
    with pytest.raises(PartitionError, match="samples_per_client"):
        ntk_fl(labels, 5, None, np_gen(0), samples_per_client=50)


# -- split_local / class_counts / plot -------------------------------------------------
def test_split_local_within_one_per_class_and_totals_exact() -> None:
    labels = _labels([37, 5, 120, 1, 64])
    idx = np.flatnonzero(labels >= 0)
    ratios = (0.6, 0.25, 0.15)
    parts = split_local(idx, labels, ratios, np_gen(2, "split"))
    _disjoint_cover(list(parts), len(idx))
    for part, r in zip(parts, ratios):
        got = np.bincount(labels[part], minlength=5)
        assert (np.abs(got - r * np.bincount(labels, minlength=5)) <= 1).all()
        assert abs(len(part) - r * len(idx)) <= 1


def test_split_local_many_tiny_classes_still_fill_every_part() -> None:
    labels = _labels([3] * 10)  # each class alone would round test/val to 0
    tr, va, te = split_local(np.arange(30), labels, (0.8, 0.1, 0.1), np_gen(0))
    assert (len(tr), len(va), len(te)) == (24, 3, 3)


def test_split_local_tiny_client_keeps_a_train_sample() -> None:
    labels = _labels([1, 1, 1])
    for idx in (np.array([0]), np.array([1, 2])):
        tr, va, te = split_local(idx, labels, (0.2, 0.4, 0.4), np_gen(0))
        assert len(tr) >= 1 and len(tr) + len(va) + len(te) == len(idx)
    empty = split_local(np.array([], dtype=np.int64), labels, (0.5, 0.25, 0.25), np_gen(0))
    assert all(len(p) == 0 for p in empty)
    with pytest.raises(ValueError, match="sum to 1"):
        split_local(np.arange(3), labels, (0.5, 0.3, 0.3), np_gen(0))
    tr, va, te = split_local(np.arange(3), labels, (0.34, 0.33, 0.33), np_gen(0), stratified=False)
    assert (len(tr), len(va), len(te)) == (1, 1, 1)


def test_class_counts_and_plot(tmp_path: Path) -> None:
    labels = _labels([4, 6])
    counts = class_counts([np.array([0, 1, 4]), np.array([5, 9])], labels, 3)
    assert counts.tolist() == [[2, 1, 0], [0, 2, 0]]
    small = plot_partition(counts, tmp_path / "bars.png", title="two")
    big = plot_partition(np.random.default_rng(0).integers(0, 50, (120, 10)), tmp_path / "sub" / "heat.png")
    for p in (small, big):
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# -- federation ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def synth():
    return load_dataset("synthetic", num_clients=12, seed=2)


def _rows(x: torch.Tensor) -> set[bytes]:
    return {r.numpy().tobytes() for r in x.reshape(len(x), -1)}


@pytest.mark.parametrize("partition, kw", [
    ("iid", {}), ("dirichlet", {"alpha": 0.3, "min_size": 5}), ("shards", {"classes_per_client": 2}),
    ("ntk_fl", {"alpha": 1.0, "samples_per_client": 40}), ("natural", {}),
])
def test_public_set_is_disjoint_from_every_client(synth, partition: str, kw: dict) -> None:
    fed = build_federation(synth, num_clients=12, partition=partition, public_size=150,
                           split=(0.7, 0.1, 0.2), seed=5, **kw)
    assert len(fed.public_y) == 150 and fed.public_x.shape == (150, 60)
    public = _rows(fed.public_x)
    for nd in fed.nodes:
        assert not public & _rows(torch.cat([nd.train_x, nd.val_x, nd.test_x]))
    assert fed.global_test_y is synth.test_y  # the official test split, untouched
    counts = fed.class_counts()
    assert counts.shape == (12, 10)
    assert counts.sum(1).tolist() == [len(p) for p in fed.partition]
    if partition != "ntk_fl":
        assert counts.sum() + 150 == len(synth.train_y)  # disjoint and covering


def test_federation_is_deterministic_and_seed_sensitive(synth) -> None:
    kw = dict(num_clients=12, partition="dirichlet", alpha=0.5, min_size=5, split=(0.8, 0.1, 0.1), public_size=20)
    a, b = build_federation(synth, seed=1, **kw), build_federation(synth, seed=1, **kw)
    c = build_federation(synth, seed=2, **kw)
    assert all(np.array_equal(x, y) for x, y in zip(a.partition, b.partition))
    assert all(torch.equal(x.val_x, y.val_x) for x, y in zip(a.nodes, b.nodes))
    assert torch.equal(a.public_x, b.public_x)
    assert not all(np.array_equal(x, y) for x, y in zip(a.partition, c.partition))


def test_federation_nodes_are_copies_with_shaped_empty_splits(synth) -> None:
    fed = build_federation(synth, num_clients=3, partition="iid", seed=0)
    nd = fed.nodes[0]
    assert nd.val_x.shape == (0, 60) and nd.test_y.shape == (0,) and nd.n_val == 0 and nd.n_test == 0
    assert nd.n_train == len(fed.partition[0]) and fed.public_x.shape == (0, 60)
    before = synth.train_x.clone()
    nd.train_x.zero_()
    assert torch.equal(synth.train_x, before)


def test_natural_partition_drops_public_samples(synth) -> None:
    fed = build_federation(synth, num_clients=12, partition="natural", public_size=100, seed=0)
    for own, part in zip(synth.natural_partition, fed.partition):
        assert set(part.tolist()) <= set(own.tolist())
    assert sum(map(len, fed.partition)) == len(synth.train_y) - 100


@pytest.mark.parametrize("kw, expect", [
    ({"partition": "random"}, "partition must be one of"),
    ({"partition": "dirichlet"}, "needs alpha"),
    ({"public_size": 10**6}, "public_size must be in"),
    ({"split": (0.5, 0.2, 0.2)}, "summing to 1"),
    ({"num_clients": 10**6}, "num_clients=1000000"),
    ({"num_clients": 0}, "num_clients must be >= 1"),
    ({"partition": "natural", "num_clients": 5}, "defines 12 clients"),
    ({"partition": "dirichlet", "alpha": 0.01, "min_size": 200, "max_retries": 5}, "min_size"),
])
def test_impossible_federations_raise_clear_value_errors(synth, kw: dict, expect: str) -> None:
    kw = {"num_clients": 12, **kw}
    with pytest.raises(ValueError, match=expect) as e:
        build_federation(synth, **kw)
    assert "\n" not in str(e.value)


def test_natural_needs_a_dataset_with_clients() -> None:
    with pytest.raises(ValueError, match="has none"):
        build_federation(load_dataset("digits"), num_clients=3, partition="natural")
