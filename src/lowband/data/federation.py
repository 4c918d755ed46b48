"""From a Dataset to a Federation: public set, partition, per-node train/val/test.

Order of operations (each step seeded by its own address, so changing one knob does
not reshuffle the others):

1. carve the public reference set: ``public_size`` training indices, removed from the
   pool so that no client owns them. ``public_source`` says how they are drawn:
   ``train`` (default) uniformly from the training set (``np_gen(seed, "public")``);
   ``holdout`` as a class-stratified held-out validation split (equal class
   proportions, ``np_gen(seed, "public", "holdout")``); ``mismatched`` uniformly from a
   seeded half of the classes only (``np_gen(seed, "public", "mismatched")``), a
   deliberately class-skewed reference set. The official test split is never used;
2. partition the remaining pool among clients (``np_gen(seed, "partition", kind)``);
3. split each client's indices into local train/val/test with ``split_local``
   (``np_gen(seed, "split", client)``);
4. optionally (``augment="fol"``) give each client its own randomly transformed copy of
   its images (rotation, flip, crop/resize, noise; :mod:`lowband.data.augment`,
   ``torch_gen(seed, "augment", client, split)``), as the FOL paper does at partition time.

The official test split becomes the held-out global test set, never given to clients.
Nodes are :class:`NodeView` s (issue 43): a node keeps its indices into the dataset,
which every node shares read-only, and its local split is made when its data is first
read; each read of ``train_x`` and friends is a fresh index-selected copy (a few rows), so
a node may still modify what it reads freely. A node that never takes part costs its
index array and nothing else: no split, no RNG call, no copy of its rows. With
``augment`` the nodes hold transformed copies (:class:`NodeData`), as before.
``global_test_*`` share the (cached, read-only by convention) Dataset tensors.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ..seeding import np_gen
from . import partition as P
from .sources import Dataset

if TYPE_CHECKING:
    from .indexmap import IndexMap

__all__ = ["NodeData", "NodeView", "Federation", "build_federation", "PARTITIONS"]

PARTITIONS = ("iid", "dirichlet", "shards", "ntk_fl", "iid_replace", "natural", "given", "index_map")


@dataclass(repr=False)
class NodeData:
    """One node's local data; an empty split has shape ``(0, *input_shape)``."""

    train_x: torch.Tensor
    train_y: torch.Tensor
    val_x: torch.Tensor
    val_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor

    @property
    def n_train(self) -> int:
        return int(self.train_y.shape[0])

    @property
    def n_val(self) -> int:
        return int(self.val_y.shape[0])

    @property
    def n_test(self) -> int:
        return int(self.test_y.shape[0])

    def __repr__(self) -> str:
        return f"NodeData(train={self.n_train}, val={self.n_val}, test={self.n_test})"


class NodeView:
    """One node's local data as rows of the shared dataset (read-only, never copied per node).

    Holds the node's indices into the training set; the local train/val/test split
    (:func:`lowband.data.partition.split_local` with ``np_gen(seed, "split", node)``, the
    eager build's call) is made on the first read and kept (indices only). ``train_x`` etc.
    are fresh copies of the node's rows at every read: the same values, dtype and layout as
    :class:`NodeData`'s tensors, so everything computed from them is the same bits.
    ``n_train``/``n_val``/``n_test`` come from the split's sizes without making it (they do
    not depend on the labels). Pickled (a worker pool shipping a visiting node, Ray), a
    view travels as the :class:`NodeData` of its rows, never with the whole dataset."""

    __slots__ = ("_x", "_y", "_idx", "_labels", "_split", "_seed", "_node", "_parts", "_sizes")

    def __init__(self, x: torch.Tensor, y: torch.Tensor, idx: np.ndarray, labels: np.ndarray,
                 split: tuple[float, ...], seed: int, node: int):
        self._x, self._y, self._idx, self._labels = x, y, idx, labels
        self._split, self._seed, self._node = split, int(seed), int(node)
        self._parts: tuple[np.ndarray, ...] | None = None
        self._sizes = P.split_sizes(int(idx.size), split)

    def parts(self) -> tuple[np.ndarray, ...]:
        """The node's (train, val, test) indices into the training set (made once)."""
        if self._parts is None:
            self._parts = P.split_local(self._idx, self._labels, self._split, np_gen(self._seed, "split", self._node))
        return self._parts

    def _size(self, k: int) -> int:
        return int(self._sizes[k]) if self._sizes is not None else int(self.parts()[k].size)

    train_x = property(lambda self: _take(self._x, self.parts()[0]), doc="the node's training inputs (a copy)")
    train_y = property(lambda self: _take(self._y, self.parts()[0]), doc="the node's training labels (a copy)")
    val_x = property(lambda self: _take(self._x, self.parts()[1]))
    val_y = property(lambda self: _take(self._y, self.parts()[1]))
    test_x = property(lambda self: _take(self._x, self.parts()[2]))
    test_y = property(lambda self: _take(self._y, self.parts()[2]))
    n_train = property(lambda self: self._size(0))
    n_val = property(lambda self: self._size(1))
    n_test = property(lambda self: self._size(2))

    def materialize(self) -> NodeData:
        """The node's data as tensors of its own (:class:`NodeData`)."""
        tr, va, te = self.parts()
        return NodeData(_take(self._x, tr), _take(self._y, tr), _take(self._x, va), _take(self._y, va),
                        _take(self._x, te), _take(self._y, te))

    def __reduce__(self) -> Any:
        d = self.materialize()
        return (NodeData, (d.train_x, d.train_y, d.val_x, d.val_y, d.test_x, d.test_y))

    def __repr__(self) -> str:
        return f"NodeView(train={self.n_train}, val={self.n_val}, test={self.n_test})"


@dataclass(repr=False)
class Federation:
    """Everything a simulation needs about data. ``partition[i]`` holds client i's indices
    into the dataset's training set (before the local split), for reporting."""

    name: str
    num_classes: int
    input_shape: tuple[int, ...]
    meta: dict
    nodes: list[Any]  # NodeView (shared rows) or NodeData (own tensors)
    global_test_x: torch.Tensor
    global_test_y: torch.Tensor
    public_x: torch.Tensor
    public_y: torch.Tensor
    partition: list[np.ndarray] = field(default_factory=list)

    @property
    def num_clients(self) -> int:
        return len(self.nodes)

    def class_counts(self) -> np.ndarray:
        """(clients x classes) counts over each node's full local data (train+val+test)."""
        rows = []
        for nd in self.nodes:
            y = torch.cat([nd.train_y, nd.val_y, nd.test_y]).cpu().numpy()
            rows.append(np.bincount(y, minlength=self.num_classes)[: self.num_classes])
        return np.stack(rows) if rows else np.zeros((0, self.num_classes), np.int64)

    def materialize(self) -> "Federation":
        """This federation with every node's data as tensors of its own (:class:`NodeData`),
        e.g. before moving it to a GPU (the views share the CPU dataset)."""
        from dataclasses import replace

        return replace(self, nodes=[nd.materialize() if isinstance(nd, NodeView) else nd for nd in self.nodes])

    def __repr__(self) -> str:
        sizes = [nd.n_train + nd.n_val + nd.n_test for nd in self.nodes]
        return (
            f"Federation({self.name!r}, clients={len(self.nodes)}, samples/client "
            f"min={min(sizes, default=0)} max={max(sizes, default=0)}, "
            f"public={len(self.public_y)}, global_test={len(self.global_test_y)})"
        )


def _take(x: torch.Tensor, idx: np.ndarray) -> torch.Tensor:
    return x[torch.from_numpy(np.ascontiguousarray(idx, dtype=np.int64))]


PUBLIC_SOURCES = ("train", "holdout", "mismatched")


def _public_indices(labels: np.ndarray, size: int, source: str, num_classes: int, seed: int) -> np.ndarray:
    """Sorted training indices of the public reference set (see the module docstring)."""
    if source not in PUBLIC_SOURCES:
        raise ValueError(f"public_source must be one of {', '.join(PUBLIC_SOURCES)}; got {source!r}")
    n = labels.size
    if source == "train" or size == 0:
        return np.sort(np_gen(seed, "public").choice(n, size, replace=False)).astype(np.int64)
    if source == "holdout":
        rng = np_gen(seed, "public", "holdout")
        classes = np.unique(labels)
        share = np.full(classes.size, size // classes.size)
        share[rng.permutation(classes.size)[: size - int(share.sum())]] += 1
        out = []
        for c, k in zip(classes, share):
            idx = np.flatnonzero(labels == c)
            if k > idx.size:
                raise ValueError(f"public_source='holdout': class {c} has {idx.size} samples, "
                                 f"a balanced public set of {size} needs {k}")
            out.append(rng.choice(idx, int(k), replace=False))
        return np.sort(np.concatenate(out)).astype(np.int64)
    rng = np_gen(seed, "public", "mismatched")
    keep = np.sort(rng.choice(num_classes, max(1, num_classes // 2), replace=False))
    pool = np.flatnonzero(np.isin(labels, keep))
    if size > pool.size:
        raise ValueError(f"public_source='mismatched': classes {keep.tolist()} hold {pool.size} samples, "
                         f"fewer than public_size={size}")
    return np.sort(rng.choice(pool, size, replace=False)).astype(np.int64)


def _check_client_sizes(local: list[np.ndarray], split: tuple[float, ...], ids: list[int] | None) -> None:
    """A client of its own (natural/given partition) needs a sample for every non-zero
    part of ``split`` (else it has no training data, or an empty local test split)."""
    need = sum(1 for s in split if s > 0)
    for i, p in enumerate(local):
        if p.size < need:
            who = f"client id {ids[i]}" if ids is not None else f"client {i}"
            raise P.PartitionError(
                f"{who} has {p.size} training sample{'s' if p.size != 1 else ''} (after the global test and public "
                f"sets), and split = {list(split)} needs at least {need} per client; merge or drop small clients, "
                f"or change data.split")


def build_federation(
    dataset: Dataset,
    *,
    num_clients: int,
    partition: str = "iid",
    alpha: float | None = None,
    min_size: int = 10,
    classes_per_client: int = 2,
    samples_per_client: int = 200,
    split: tuple[float, float, float] = (1.0, 0.0, 0.0),
    public_size: int = 0,
    public_source: str = "train",
    seed: int = 0,
    max_retries: int = 1000,
    augment: str | None = None,
    index_map: "IndexMap | None" = None,
) -> Federation:
    """Deal ``dataset``'s training set out to ``num_clients`` nodes.

    ``partition``: ``iid`` (disjoint near-equal shards), ``dirichlet`` (needs ``alpha``;
    ``min_size``, ``max_retries``), ``shards`` (``classes_per_client``), ``ntk_fl``
    (``alpha``, None = IID; ``samples_per_client``; nodes may overlap) or ``natural``
    (the dataset's own clients, e.g. ``synthetic``) or ``index_map`` (the first
    ``num_clients`` clients of ``index_map``, a :class:`~lowband.data.indexmap.IndexMap`
    of indices into the training set; samples taken for the public set are dropped from
    them, as with ``natural``; ``meta["federation"]["index_map"]`` records what was taken).
    Local splits and the global test set are built as for every other partition, so only
    the partition changes. ``split`` = local (train, val, test)
    ratios. ``augment``: None, or a preset of :data:`lowband.data.augment.AUGMENTS`
    ("fol") applied to every client's train/val/test images (not to the global test set
    or the public set). Raises ValueError (PartitionError is one) for impossible requests.
    """
    if partition not in PARTITIONS:
        raise ValueError(f"partition must be one of {', '.join(PARTITIONS)}; got {partition!r}")
    if augment is not None:
        from .augment import augment_spec

        augment_spec(augment)  # one-line error for an unknown preset
        if dataset.is_text or len(dataset.input_shape) != 3:
            raise ValueError(f"augment={augment!r} needs image data (C, H, W); {dataset.name} is not")
    if int(num_clients) < 1:
        raise ValueError(f"num_clients must be >= 1, got {num_clients}")
    split = tuple(float(s) for s in split)  # type: ignore[assignment]
    if len(split) != 3 or min(split) < 0 or abs(sum(split) - 1.0) > 1e-6:
        raise ValueError(f"split must be 3 non-negative ratios (train, val, test) summing to 1, got {split}")
    labels = dataset.train_y.numpy()
    n = labels.size
    if not 0 <= public_size < n:
        raise ValueError(f"public_size must be in 0..{n - 1} ({dataset.name} has {n} training samples), got {public_size}")

    public = _public_indices(labels, public_size, public_source, dataset.num_classes, seed)
    pool = np.setdiff1d(np.arange(n, dtype=np.int64), public, assume_unique=True)
    if partition not in ("ntk_fl", "iid_replace", "index_map") and num_clients > pool.size:
        raise ValueError(f"num_clients={num_clients} exceeds the {pool.size} training samples left for clients")
    rng = np_gen(seed, "partition", partition)
    pool_y = labels[pool]
    pos = np.full(n, -1, dtype=np.int64)
    pos[pool] = np.arange(pool.size)
    taken = None

    if partition == "iid":
        local = P.iid(pool.size, num_clients, rng)
    elif partition == "dirichlet":
        if alpha is None:
            raise ValueError("partition='dirichlet' needs alpha (e.g. 0.1 strong skew, 1.0 mild, 100 ~ IID)")
        local = P.dirichlet(pool_y, num_clients, alpha, rng, min_size=min_size, max_retries=max_retries)
    elif partition == "shards":
        local = P.shards(pool_y, num_clients, classes_per_client, rng)
    elif partition == "ntk_fl":
        local = P.ntk_fl(pool_y, num_clients, alpha, rng, samples_per_client=samples_per_client)
    elif partition == "iid_replace":
        local = P.iid_replace(pool.size, num_clients, rng, samples_per_client)
    elif partition == "index_map":
        from .indexmap import select, stats

        if index_map is None:
            raise ValueError("partition='index_map' needs index_map (lowband.data.indexmap.read_index_map(path))")
        chosen = select(index_map, num_clients, n)
        taken = stats(index_map, chosen)
        local = [pos[p] for p in chosen]
        local = [p[p >= 0] for p in local]  # drop samples taken for the public set
        _check_client_sizes(local, split, list(index_map.ids))
    else:  # natural / given: the dataset's own clients (synthetic) or the user's client ids (npz)
        if dataset.natural_partition is None:
            what = "client ids (an npz with a client array)" if partition == "given" else "its own clients"
            raise ValueError(f"partition={partition!r} needs a dataset with {what}; {dataset.name} has none "
                             f"(use iid/dirichlet/shards/ntk_fl)")
        if num_clients != len(dataset.natural_partition):
            raise ValueError(
                f"partition={partition!r}: {dataset.name} defines {len(dataset.natural_partition)} clients, "
                f"num_clients={num_clients}; set num_clients to match"
            )
        local = [pos[np.asarray(p, dtype=np.int64)] for p in dataset.natural_partition]
        local = [p[p >= 0] for p in local]  # drop samples taken for the public set
        _check_client_sizes(local, split, dataset.meta.get("client_ids"))
    parts = [pool[p] for p in local]

    nodes: list[Any] = []
    if augment is None:  # rows of the shared dataset, split when first read (NodeView)
        nodes = [NodeView(dataset.train_x, dataset.train_y, idx, labels, split, seed, i) for i, idx in enumerate(parts)]
    for i, idx in enumerate(parts if augment is not None else ()):
        tr, va, te = P.split_local(idx, labels, split, np_gen(seed, "split", i))
        xs = [_take(dataset.train_x, part) for part in (tr, va, te)]
        if augment is not None:
            from .augment import augment_client

            xs = [augment_client(xp, augment, seed, i, name) for xp, name in zip(xs, ("train", "val", "test"))]
        nodes.append(NodeData(
            xs[0], _take(dataset.train_y, tr),
            xs[1], _take(dataset.train_y, va),
            xs[2], _take(dataset.train_y, te),
        ))
    meta = dict(dataset.meta)
    meta["federation"] = {
        "partition": partition, "alpha": alpha, "num_clients": num_clients, "split": list(split),
        "public_size": public_size, "public_source": public_source, "seed": seed,
        **({"index_map": taken} if taken is not None else {}),
    }
    return Federation(
        name=dataset.name,
        num_classes=dataset.num_classes,
        input_shape=tuple(dataset.input_shape),
        meta=meta,
        nodes=nodes,
        global_test_x=dataset.test_x,
        global_test_y=dataset.test_y,
        public_x=_take(dataset.train_x, public),
        public_y=_take(dataset.train_y, public),
        partition=parts,
    )
