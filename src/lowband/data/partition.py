"""Partitioners: how a training pool is dealt out to clients.

Every function returns index arrays (``np.int64``, sorted) into the label array it was
given and takes an explicit ``np.random.Generator`` (derive it with
``lowband.seeding.np_gen``), never global random state. Recipes follow the reference
code they are named after, so results are comparable with the papers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from .errors import PartitionError

__all__ = [
    "PartitionError",
    "iid",
    "dirichlet",
    "shards",
    "ntk_fl",
    "iid_replace",
    "split_local",
    "split_sizes",
    "class_counts",
    "plot_partition",
]


def _as_labels(labels: np.ndarray | Sequence[int]) -> np.ndarray:
    y = np.asarray(labels)
    if y.ndim != 1:
        raise ValueError(f"labels must be 1-D, got shape {y.shape}")
    if y.size and not np.issubdtype(y.dtype, np.integer):
        raise ValueError(f"labels must be integers, got dtype {y.dtype}")
    return y.astype(np.int64, copy=False)


def _check_clients(num_clients: int, n: int) -> None:
    if int(num_clients) < 1:
        raise ValueError(f"num_clients must be >= 1, got {num_clients}")
    if num_clients > n:
        raise PartitionError(
            f"num_clients={num_clients} exceeds the {n} samples to partition; use fewer clients"
        )


def _sorted(parts: list[np.ndarray]) -> list[np.ndarray]:
    return [np.sort(np.asarray(p, dtype=np.int64)) for p in parts]


def iid(num_items: int, num_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Shuffle ``range(num_items)`` and cut it into ``num_clients`` disjoint near-equal shards."""
    _check_clients(num_clients, num_items)
    return _sorted(np.array_split(rng.permutation(num_items), num_clients))


def dirichlet(
    labels: np.ndarray,
    num_clients: int,
    alpha: float,
    rng: np.random.Generator,
    min_size: int = 10,
    max_retries: int = 1000,
) -> list[np.ndarray]:
    """Label-skewed split with per-class client proportions ~ Dir(alpha) (PFLlib recipe).

    For each class: shuffle its indices, draw proportions over clients from
    ``Dir(alpha * 1)``, give 0 to clients already holding >= N/num_clients samples,
    renormalise and cut. The whole draw is repeated until every client has at least
    ``min_size`` samples; after ``max_retries`` draws a PartitionError is raised.
    Small ``alpha`` = strong skew. The result is disjoint and covers every index.
    """
    y = _as_labels(labels)
    n = y.size
    _check_clients(num_clients, n)
    if not alpha > 0:
        raise ValueError(f"dirichlet alpha must be > 0, got {alpha}")
    if num_clients * min_size > n:
        raise PartitionError(
            f"dirichlet: {num_clients} clients x min_size {min_size} > {n} samples; "
            "use a smaller min_size or fewer clients"
        )
    by_class = [np.flatnonzero(y == c) for c in np.unique(y)]
    cap = n / num_clients
    for _ in range(max(1, int(max_retries))):
        batches: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
        sizes = np.zeros(num_clients, dtype=np.int64)
        for idx_k in by_class:
            idx_k = rng.permutation(idx_k)
            p = rng.dirichlet(np.full(num_clients, float(alpha)))
            p = p * (sizes < cap)
            total = p.sum()
            if total <= 0:  # every client at the cap: only possible through rounding
                p, total = np.ones(num_clients), float(num_clients)
            cuts = (np.cumsum(p / total) * len(idx_k)).astype(int)[:-1]
            for j, part in enumerate(np.split(idx_k, cuts)):
                batches[j].append(part)
                sizes[j] += len(part)
        if sizes.min() >= min_size:
            return _sorted([np.concatenate(b) if b else np.empty(0, np.int64) for b in batches])
    raise PartitionError(
        f"dirichlet: no draw with every one of {num_clients} clients holding >= {min_size} "
        f"samples after {max_retries} tries (alpha={alpha}); use a larger alpha, a smaller "
        "min_size or fewer clients"
    )


def _dhondt(counts: np.ndarray, seats: int) -> np.ndarray:
    """Seats per class, at least one each, proportional to ``counts`` (D'Hondt rule)."""
    alloc = np.ones(len(counts), dtype=np.int64)
    for _ in range(seats - len(counts)):
        alloc[np.argmax(counts / (alloc + 1) * (alloc < counts))] += 1
    return alloc


def shards(
    labels: np.ndarray, num_clients: int, classes_per_client: int, rng: np.random.Generator
) -> list[np.ndarray]:
    """Pathological non-IID (McMahan et al.): ``num_clients * classes_per_client`` label-
    sorted shards, ``classes_per_client`` random shards per client, all disjoint.

    Shards are cut within classes (each class gets shards in proportion to its size), so
    a shard never straddles two classes and every client holds at most
    ``classes_per_client`` classes even when class sizes are unequal. If there are fewer
    shards than classes, a random subset of classes is used and the others are left out.
    """
    y = _as_labels(labels)
    _check_clients(num_clients, y.size)
    if classes_per_client < 1:
        raise ValueError(f"classes_per_client must be >= 1, got {classes_per_client}")
    num_shards = num_clients * classes_per_client
    if num_shards > y.size:
        raise PartitionError(
            f"shards: {num_clients} clients x {classes_per_client} shards = {num_shards} shards "
            f"> {y.size} samples; use fewer clients or classes_per_client"
        )
    classes, counts = np.unique(y, return_counts=True)
    if num_shards < len(classes):
        keep = np.sort(rng.choice(len(classes), num_shards, replace=False))
        classes, counts = classes[keep], counts[keep]
    alloc = _dhondt(counts, num_shards)
    pieces: list[np.ndarray] = []
    for c, k in zip(classes, alloc):
        pieces.extend(np.array_split(rng.permutation(np.flatnonzero(y == c)), k))
    order = rng.permutation(num_shards)
    return _sorted(
        [np.concatenate([pieces[s] for s in order[i::num_clients]]) for i in range(num_clients)]
    )


def ntk_fl(
    labels: np.ndarray,
    num_clients: int,
    alpha: float | None,
    rng: np.random.Generator,
    samples_per_client: int = 200,
) -> list[np.ndarray]:
    """The NTK-FL / NTK-DFL sampler: fixed-size nodes, overlap across nodes allowed.

    Train indices are grouped by class and each class list shuffled. For each node,
    ``q ~ Dir(alpha * 1_C)`` and ``floor(samples_per_client * q_c)`` indices are taken
    from the front of class list ``c`` (capped at the class size), then that class list
    is reshuffled. A node never holds a duplicate; two nodes may share samples. Node
    sizes are in ``[samples_per_client - C, samples_per_client]``.

    ``alpha=None`` is the IID case: disjoint consecutive blocks of ``samples_per_client``
    from one shuffled index list (needs ``num_clients * samples_per_client <= N``).
    """
    y = _as_labels(labels)
    if int(num_clients) < 1:
        raise ValueError(f"num_clients must be >= 1, got {num_clients}")
    if samples_per_client < 1:
        raise ValueError(f"samples_per_client must be >= 1, got {samples_per_client}")
    if alpha is None:
        need = num_clients * samples_per_client
        if need > y.size:
            raise PartitionError(
                f"ntk_fl (IID): {num_clients} clients x {samples_per_client} samples = {need} "
                f"> {y.size} samples; use fewer clients or a smaller samples_per_client"
            )
        perm = rng.permutation(y.size)
        return _sorted([perm[i * samples_per_client:(i + 1) * samples_per_client]
                        for i in range(num_clients)])
    if not alpha > 0:
        raise ValueError(f"ntk_fl alpha must be > 0 (or None for IID), got {alpha}")
    lists = [rng.permutation(np.flatnonzero(y == c)) for c in np.unique(y)]
    parts = []
    for _ in range(num_clients):
        q = rng.dirichlet(np.full(len(lists), float(alpha)))
        counts = np.floor(samples_per_client * q).astype(np.int64)
        take = []
        for c, k in enumerate(counts):
            if k > 0:
                take.append(lists[c][:k])
                lists[c] = rng.permutation(lists[c])
        parts.append(np.concatenate(take) if take else np.empty(0, np.int64))
    return _sorted(parts)


def iid_replace(num_items: int, num_clients: int, rng: np.random.Generator,
                samples_per_client: int) -> list[np.ndarray]:
    """IID sampling with replacement across clients, for populations larger than the data.

    The pool is dealt out in passes: each pass is a fresh permutation of ``range(num_items)``
    cut into ``num_items // samples_per_client`` consecutive blocks of ``samples_per_client``,
    one per client, until every client has one. Clients of one pass are disjoint, clients of
    different passes may share samples, a client never holds a duplicate; every client has
    exactly ``samples_per_client`` samples. One permutation per pass: 100,000 clients of 20
    Fashion-MNIST samples take 34 permutations of 60,000 (a fraction of a second)."""
    if int(num_clients) < 1:
        raise ValueError(f"num_clients must be >= 1, got {num_clients}")
    if not 1 <= samples_per_client <= num_items:
        raise PartitionError(f"iid_replace: samples_per_client must be in 1..{num_items} (the pool's size), "
                             f"got {samples_per_client}")
    per_pass = num_items // samples_per_client
    passes = -(-int(num_clients) // per_pass)
    blocks = np.concatenate([rng.permutation(num_items)[: per_pass * samples_per_client].reshape(per_pass, -1)
                             for _ in range(passes)])[: int(num_clients)]
    return list(np.sort(blocks, axis=1).astype(np.int64))


def split_sizes(n: int, ratios: Sequence[float]) -> tuple[int, ...] | None:
    """The part sizes :func:`split_local` gives a client of ``n`` samples (they do not depend
    on its labels or its generator: the apportionment of ``n``), without splitting; None in
    the one case where they would depend on the labels (a client whose apportioned training
    part is empty, which then takes a sample from another part)."""
    r = np.asarray(ratios, dtype=np.float64)
    if n == 0:
        return tuple(0 for _ in range(r.size))
    sizes = _largest_remainder(int(n), r)
    if r[0] > 0 and sizes[0] == 0:
        return None
    return tuple(int(v) for v in sizes)


def _largest_remainder(total: int, ratios: np.ndarray) -> np.ndarray:
    """Integers summing to ``total``, each within 1 of ``total * ratio``."""
    exact = total * ratios
    out = np.floor(exact + 1e-9).astype(np.int64)
    order = np.argsort(-(exact - out), kind="stable")
    out[order[: total - out.sum()]] += 1
    return out


def split_local(
    indices: np.ndarray,
    labels: np.ndarray,
    ratios: Sequence[float],
    rng: np.random.Generator,
    stratified: bool = True,
) -> tuple[np.ndarray, ...]:
    """Split one client's ``indices`` into (train, val, test) — or as many parts as ratios.

    ``ratios`` must be non-negative and sum to 1. Stratified: each class's count in each
    part is within 1 of ``n_c * ratio`` and the part totals are the apportionment of the
    client's size (so many tiny classes do not all round the same way). A client with any
    sample gets at least one train sample when ``ratios[0] > 0``.
    """
    r = np.asarray(ratios, dtype=np.float64)
    if r.ndim != 1 or r.size < 1 or (r < 0).any() or abs(r.sum() - 1.0) > 1e-6:
        raise ValueError(f"split ratios must be >= 0 and sum to 1, got {tuple(ratios)}")
    idx = np.asarray(indices, dtype=np.int64)
    n, k = idx.size, r.size
    if n == 0:
        return tuple(np.empty(0, np.int64) for _ in range(k))
    y = _as_labels(labels)[idx] if stratified else np.zeros(n, np.int64)
    classes = np.unique(y)
    members = [rng.permutation(idx[y == c]) for c in classes]
    n_c = np.array([len(m) for m in members], dtype=np.float64)

    exact = n_c[:, None] * r[None, :]
    cells = np.floor(exact + 1e-9).astype(np.int64)
    frac = exact - cells
    demand = _largest_remainder(n, r) - cells.sum(axis=0)  # >= 0 by construction
    rem = n_c.astype(np.int64) - cells.sum(axis=1)
    # Hand out each class's leftover units to distinct parts, always to the parts with the
    # largest remaining demand (Ryser's greedy), so part totals match the apportionment;
    # ties go to the larger fractional part. rem[c] < k, so a free part always exists.
    for c in np.argsort(-rem, kind="stable"):
        for _ in range(rem[c]):
            free = np.flatnonzero(frac[c] >= 0)
            s = free[np.lexsort((-frac[c, free], -demand[free]))[0]]
            cells[c, s] += 1
            demand[s] -= 1
            frac[c, s] = -1.0
    if r[0] > 0 and cells[:, 0].sum() == 0:
        c, s = np.unravel_index(np.argmax(cells), cells.shape)
        cells[c, s] -= 1
        cells[c, 0] += 1
    out = [[] for _ in range(k)]
    for m, row in zip(members, cells):
        bounds = np.concatenate([[0], np.cumsum(row)])
        for s in range(k):
            out[s].append(m[bounds[s]:bounds[s + 1]])
    return tuple(np.sort(np.concatenate(p)).astype(np.int64) for p in out)


def class_counts(parts: Sequence[np.ndarray], labels: np.ndarray, num_classes: int) -> np.ndarray:
    """Matrix (clients x classes) of how many samples of each class every part holds."""
    y = _as_labels(labels)
    return np.stack(
        [np.bincount(y[np.asarray(p, dtype=np.int64)], minlength=num_classes)[:num_classes]
         for p in parts]
    ) if len(parts) else np.zeros((0, num_classes), dtype=np.int64)


def plot_partition(counts: np.ndarray, path: str | Path, title: str = "") -> Path:
    """Save a PNG of per-client class counts: stacked horizontal bars (<= 50 clients) or a
    clients x classes heatmap. Uses the Agg canvas directly, leaving pyplot state alone."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    counts = np.asarray(counts)
    if counts.ndim != 2:
        raise ValueError(f"counts must be a (clients x classes) matrix, got shape {counts.shape}")
    n_clients, n_classes = counts.shape
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig = Figure(figsize=(8, max(3.0, min(12.0, 0.25 * n_clients + 1.5))))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    if n_clients <= 50:
        import matplotlib

        colors = matplotlib.colormaps["tab20" if n_classes > 10 else "tab10"]
        left = np.zeros(n_clients)
        for c in range(n_classes):
            ax.barh(np.arange(n_clients), counts[:, c], left=left, color=colors(c % colors.N),
                    label=str(c), height=0.8)
            left += counts[:, c]
        ax.set_yticks(np.arange(n_clients))
        ax.invert_yaxis()
        ax.set_xlabel("samples")
        ax.set_ylabel("client")
        if n_classes <= 20:
            ax.legend(title="class", fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    else:
        im = ax.imshow(counts, aspect="auto", interpolation="nearest", cmap="viridis")
        fig.colorbar(im, ax=ax, label="samples")
        ax.set_xlabel("class")
        ax.set_ylabel("client")
    ax.set_title(title or f"{n_clients} clients x {n_classes} classes")
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=100)
    return path
