"""A partition given as an index map: ``data.partition = "index_map"``, ``data.index_map = PATH``.

The file is a JSON object (gzip-compressed or plain) from client id to the list of that
client's indices into the dataset's **training set in its canonical order** (for
Fashion-MNIST, the order of ``train-images-idx3-ubyte.gz``)::

    {"0": [6, 8, 39, ...], "1": [...], ..., "299": [...]}

This is how the NTK-DFL authors' repository stores its partitions (``user_dataidx_map``),
and how ``shared/data/ntk_dfl_partitions/`` ships them, so a run can use *their* draw and
differ from their runs by nothing but what lowband itself does.

Rules (each broken one is a one-line :class:`IndexMapError`, a ConfigError: exit 2):

- ids are non-negative integers written in decimal (``"0"``, ``"17"``); clients are taken in
  increasing id order, and a run with ``M`` nodes takes the **first M** (the authors' code
  at M nodes used its clients ``0..M-1``); ``M`` larger than the map is refused;
- every client holds at least one index, every index is an integer (no bool, no float);
- no client holds an index twice (a node counting one sample twice is a broken map);
- indices lie in ``0..N-1`` for the training set's ``N`` (checked when the federation is
  built, where ``N`` is known: :func:`select`);
- the same index at **several clients is allowed**: the NTK-FL recipe overlaps clients by
  construction. The count is reported (:func:`stats`), in the run's
  ``summary.json`` under ``index_map``.

The file's sha256 is the map's identity: the config resolves it into
``data.index_map_sha256`` (written into the run's ``config.toml``, so its fingerprint and
``--resume`` see a changed file), and a config that states it refuses a file with another.
A relative path is read from the working directory, else from the data folder
(``data.data_dir``, ``$LOWBAND_DATA``): ``index_map = "ntk_dfl_partitions/<name>.json.gz"``.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import io
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import numpy as np

from lowband.config.schema import ConfigError

__all__ = ["IndexMap", "IndexMapError", "MAX_BYTES", "read_index_map", "resolve_index_map", "select", "stats"]

#: the most bytes a map may hold once decompressed (a 300-client map is about 0.4 MB)
MAX_BYTES = 256 * 2**20
_ID = re.compile(r"0|[1-9][0-9]{0,8}")


class IndexMapError(ConfigError):
    """An index map cannot be used as given (one line: which file, what is wrong, how to fix it)."""


@dataclass(frozen=True, repr=False, eq=False)
class IndexMap:
    """A validated index map: ``parts[j]`` holds client ``ids[j]``'s indices (as in the
    file, order kept), clients in increasing id order; ``sha256`` of the file's bytes."""

    path: str
    sha256: str
    ids: tuple[int, ...]
    parts: tuple[np.ndarray, ...]

    @property
    def num_clients(self) -> int:
        return len(self.ids)

    def __repr__(self) -> str:
        return f"IndexMap({self.path!r}, clients={self.num_clients}, sha256={self.sha256[:12]})"


def resolve_index_map(path: str, data_dir: Optional[str] = None) -> Path:
    """The file ``path`` names: as given (``~`` expanded) if it exists, else under the data
    folder (``data_dir``, ``$LOWBAND_DATA``, the user cache); a one-line error if neither."""
    from .sources import resolve_data_dir

    p = Path(path).expanduser()
    if p.is_file():
        return p
    folder = resolve_data_dir(data_dir)
    if not p.is_absolute() and (folder / p).is_file():
        return folder / p
    where = str(p) if p.is_absolute() else f"{p} (nor {folder / p})"
    raise IndexMapError(f"data.index_map: no file {where}; give the path of a JSON object client id -> "
                        f"training indices (.json or .json.gz), absolute or relative to the data folder")


def _read_bytes(p: Path) -> tuple[bytes, str]:
    """The file's JSON text (decompressed if gzip) and the sha256 of the file's own bytes;
    at most :data:`MAX_BYTES` of either is read."""
    try:
        if p.stat().st_size > MAX_BYTES:
            raise IndexMapError(f"data.index_map: {p} is over {MAX_BYTES // 2**20} MB; an index map of a few "
                                f"hundred clients is well under 1 MB")
        data = p.read_bytes()
        raw = data
        if data[:2] == b"\x1f\x8b":
            with gzip.GzipFile(fileobj=io.BytesIO(data)) as g:
                raw = g.read(MAX_BYTES + 1)
    except (OSError, EOFError, gzip.BadGzipFile) as exc:
        msg = " ".join(str(exc).split()) or type(exc).__name__
        raise IndexMapError(f"data.index_map: cannot read {p} ({msg}); expected a gzip or plain JSON file") from None
    if len(raw) > MAX_BYTES:
        raise IndexMapError(f"data.index_map: {p} holds more than {MAX_BYTES // 2**20} MB of JSON; "
                            f"an index map of a few hundred clients is well under 1 MB")
    return raw, hashlib.sha256(data).hexdigest()


def _client(p: Path, key: str, value: Any) -> np.ndarray:
    if not isinstance(value, list) or not value:
        what = "an empty list" if value == [] else type(value).__name__
        raise IndexMapError(f"data.index_map: {p}: client {key} holds {what}; every client needs a non-empty "
                            f"list of training indices (drop the client from the map)")
    if not all(type(v) is int for v in value):
        bad = next(v for v in value if type(v) is not int)
        raise IndexMapError(f"data.index_map: {p}: client {key} holds {bad!r}; indices are integers")
    a = np.asarray(value, dtype=np.int64)
    if a.min() < 0:
        raise IndexMapError(f"data.index_map: {p}: client {key} holds the negative index {int(a.min())}; "
                            f"indices count from 0 in the training set's order")
    dup = a.size - np.unique(a).size
    if dup:
        raise IndexMapError(f"data.index_map: {p}: client {key} holds {dup} index{'es' if dup > 1 else ''} "
                            f"twice; a client lists each of its samples once")
    a.setflags(write=False)
    return a


@functools.lru_cache(maxsize=8)
def _parsed(path: str, stamp: tuple[int, int]) -> IndexMap:
    p = Path(path)
    raw, sha = _read_bytes(p)
    try:
        obj = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise IndexMapError(f"data.index_map: {p} is not JSON ({msg}); expected an object client id -> "
                            f"list of training indices") from None
    if not isinstance(obj, dict) or not obj:
        raise IndexMapError(f"data.index_map: {p} holds {'an empty object' if obj == {} else type(obj).__name__}; "
                            f"expected an object client id -> list of training indices, e.g. {{\"0\": [4, 9]}}")
    clients: dict[int, np.ndarray] = {}
    for key, value in obj.items():
        if not _ID.fullmatch(key):
            raise IndexMapError(f"data.index_map: {p}: client id {key!r} is not a non-negative integer written "
                                f"in decimal (\"0\", \"17\"); clients are taken in increasing id order")
        clients[int(key)] = _client(p, key, value)
    ids = tuple(sorted(clients))
    return IndexMap(str(p), sha, ids, tuple(clients[i] for i in ids))


def read_index_map(path: str, data_dir: Optional[str] = None) -> IndexMap:
    """Read and validate the map at ``path`` (see the module docstring); cached in-process
    while the file is unchanged."""
    p = resolve_index_map(path, data_dir).resolve()
    st = p.stat()
    return _parsed(str(p), (int(st.st_mtime_ns), int(st.st_size)))


def select(imap: IndexMap, num_clients: int, num_train: int) -> list[np.ndarray]:
    """The first ``num_clients`` clients' indices (sorted, ``int64``), after checking that
    the map has that many and that every index is below ``num_train``."""
    if num_clients > imap.num_clients:
        raise IndexMapError(f"data.num_clients: {num_clients} nodes, and {imap.path} holds {imap.num_clients} "
                            f"clients; use at most {imap.num_clients} nodes (a run takes the map's first M)")
    out = []
    for cid, part in zip(imap.ids[:num_clients], imap.parts[:num_clients]):
        if part.max() >= num_train:
            raise IndexMapError(f"data.index_map: {imap.path}: client {cid} holds index {int(part.max())}, and the "
                                f"training set has {num_train} samples (0..{num_train - 1}); is it a map of "
                                f"another dataset?")
        out.append(np.sort(part))
    return out


def stats(imap: IndexMap, parts: list[np.ndarray]) -> dict[str, Any]:
    """What a run records of the map: its file and sha256, the clients taken (of how many),
    their indices in all and how many are distinct (``indices - distinct`` are held by more
    than one client), and the smallest and largest client."""
    sizes = [int(p.size) for p in parts]
    total = int(sum(sizes))
    distinct = int(np.unique(np.concatenate(parts)).size) if parts else 0
    return {"path": imap.path, "sha256": imap.sha256, "clients": len(parts), "of": imap.num_clients,
            "indices": total, "distinct": distinct, "shared": total - distinct,
            "min_size": min(sizes, default=0), "max_size": max(sizes, default=0)}
