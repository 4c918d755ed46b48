"""LEAF's own JSON files (FEMNIST, Shakespeare, Sent140) as a natural partition.

For users who already ran LEAF's preprocessing (``./preprocess.sh ... -t sample``): point
the data folder at LEAF's ``data/`` directory. Dataset ``leaf_<name>`` reads
``<data_dir>/<name>/data/train/*.json`` and ``<data_dir>/<name>/data/test/*.json`` (files in
name order, users in file order). Each file is an object with ``users`` (list of ids),
``num_samples`` (one count per user) and ``user_data`` (``{user: {"x": [...], "y": [...]}}``);
``hierarchies`` is ignored. Every training user becomes one client; the test files' samples
form the global test set (``meta["natural_test"]`` keeps each client's own).

Samples:

- ``leaf_femnist``: x = 784 floats (a 28x28 image, as LEAF stores it), y in 0..61;
- ``leaf_shakespeare``: x = an 80-character string, y = the next character; ids into LEAF's
  80 symbols (:data:`lowband.data.shakespeare.LEAF_LETTERS`, unknown -> 79);
- ``leaf_sent140``: x = LEAF's tweet record (its 5th field, or a plain string, is the text),
  y = 0/1; LEAF's word splitter, a vocabulary of the training tweets (0 pad, 1 unknown),
  ``max_len`` words (LEAF: 25).

Anything malformed raises a one-line :class:`DatasetError` naming the file, the user and
what was expected.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .errors import DatasetError, corrupt_file
from .shakespeare import LEAF_LETTERS, SEQ_LEN, encode

__all__ = ["LEAF_FORMATS", "read_leaf_json", "load_leaf", "leaf_folder"]

#: dataset name -> LEAF's folder name
LEAF_FORMATS = {"leaf_femnist": "femnist", "leaf_shakespeare": "shakespeare", "leaf_sent140": "sent140"}
_WORDS = re.compile(r"[\w']+|[.,!?;]")  # LEAF's language_utils.split_line


def leaf_folder(name: str, data_dir: Path) -> Path:
    """Where ``leaf_<name>`` looks: ``<data_dir>/<name>/data`` (LEAF's own tree)."""
    return data_dir / LEAF_FORMATS[name] / "data"


def _expected(name: str) -> str:
    return (f"LEAF's JSON layout {{users, num_samples, user_data: {{user: {{x, y}}}}}} made by LEAF's "
            f"data/{LEAF_FORMATS[name]}/preprocess.sh -t sample")


def read_leaf_json(path: Path, name: str, data_dir: Path) -> list[tuple[str, list, list]]:
    """``[(user, x, y), ...]`` of one LEAF JSON file, its structure checked."""
    def bad(problem: str) -> DatasetError:
        return corrupt_file(name, path, problem, _expected(name), data_dir)

    try:
        with open(path, encoding="utf-8") as f:
            obj = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise bad(f"not readable JSON: {e.__class__.__name__}: {e}") from None
    if not isinstance(obj, dict):
        raise bad(f"top level is a {type(obj).__name__}, not an object")
    for key in ("users", "num_samples", "user_data"):
        if key not in obj:
            raise bad(f"no key {key!r}")
    users, counts, data = obj["users"], obj["num_samples"], obj["user_data"]
    if not isinstance(users, list) or not isinstance(counts, list) or not isinstance(data, dict):
        raise bad("users and num_samples must be lists and user_data an object")
    if len(users) != len(counts):
        raise bad(f"{len(users)} users but {len(counts)} num_samples")
    if len(set(map(str, users))) != len(users):
        raise bad("a user is listed twice")
    out = []
    for user, n in zip(users, counts):
        rec = data.get(user)
        if not isinstance(rec, dict) or "x" not in rec or "y" not in rec:
            raise bad(f"user_data has no {{x, y}} for user {user!r}")
        x, y = rec["x"], rec["y"]
        if not isinstance(x, list) or not isinstance(y, list) or len(x) != len(y):
            raise bad(f"user {user!r}: x and y must be lists of one length")
        if not isinstance(n, int) or n != len(y):
            raise bad(f"user {user!r}: num_samples says {n!r}, user_data holds {len(y)}")
        out.append((str(user), x, y))
    return out


def _read_split(name: str, folder: Path, split: str, data_dir: Path) -> list[tuple[str, Path, list, list]]:
    files = sorted((folder / split).glob("*.json"))
    if not files:
        raise DatasetError(
            f"{name}: no {folder / split}/*.json (LEAF's {split} files). Run LEAF's data/{LEAF_FORMATS[name]}/"
            f"preprocess.sh with -t sample and point --data-dir/LOWBAND_DATA at LEAF's data/ folder.")
    rows, seen = [], set()
    for path in files:
        for user, x, y in read_leaf_json(path, name, data_dir):
            if user in seen:
                raise corrupt_file(name, path, f"user {user!r} appears in two {split} files", _expected(name), data_dir)
            seen.add(user)
            rows.append((user, path, x, y))
    return rows


def _femnist(rows: list, name: str, data_dir: Path, **_: Any) -> tuple[list[np.ndarray], list[np.ndarray], dict]:
    xs, ys = [], []
    for user, path, x, y in rows:
        try:
            a = np.asarray(x, dtype=np.float32)
            b = np.asarray(y, dtype=np.int64)
        except (TypeError, ValueError):
            raise corrupt_file(name, path, f"user {user!r}: x must be lists of numbers and y ints", _expected(name),
                               data_dir) from None
        if a.ndim != 2 or a.shape[1] != 784 or b.ndim != 1 or (b.size and (b.min() < 0 or b.max() > 61)):
            raise corrupt_file(name, path, f"user {user!r}: x rows must be 784 pixels and y in 0..61, got x shape "
                               f"{a.shape}", _expected(name), data_dir)
        xs.append(a.reshape(-1, 1, 28, 28))
        ys.append(b)
    return xs, ys, {"num_classes": 62, "input_shape": (1, 28, 28)}


def _shakespeare(rows: list, name: str, data_dir: Path, **_: Any) -> tuple[list[np.ndarray], list[np.ndarray], dict]:
    xs, ys = [], []
    for user, path, x, y in rows:
        if not all(isinstance(s, str) and len(s) == SEQ_LEN for s in x) or not all(
                isinstance(c, str) and len(c) == 1 for c in y):
            raise corrupt_file(name, path, f"user {user!r}: x must be {SEQ_LEN}-character strings and y single "
                               "characters", _expected(name), data_dir)
        xs.append(encode("".join(x)).reshape(-1, SEQ_LEN))
        ys.append(encode("".join(y)).astype(np.int64))
    return xs, ys, {"num_classes": len(LEAF_LETTERS), "input_shape": (SEQ_LEN,),
                    "meta": {"vocab_size": len(LEAF_LETTERS), "itos": list(LEAF_LETTERS)}}


def _tweet(rec: Any) -> str | None:
    if isinstance(rec, str):
        return rec
    if isinstance(rec, list) and len(rec) >= 5 and isinstance(rec[4], str):
        return rec[4]
    return None


def _sent140(rows: list, name: str, data_dir: Path, *, vocab: list[str] | None = None, max_len: int = 25,
             vocab_size: int = 10000) -> tuple[list[np.ndarray], list[np.ndarray], dict]:
    toks, ys = [], []
    for user, path, x, y in rows:
        texts = [_tweet(r) for r in x]
        labels = [int(v) if isinstance(v, (int, str)) and str(v) in ("0", "1") else None for v in y]
        if any(t is None for t in texts) or any(v is None for v in labels):
            raise corrupt_file(name, path, f"user {user!r}: x must be LEAF tweet records (text 5th) or strings and "
                               "y 0 or 1", _expected(name), data_dir)
        toks.append([_WORDS.findall(str(t)) for t in texts])
        ys.append(np.asarray(labels, dtype=np.int64))
    if vocab is None:
        counts = Counter(w for user in toks for t in user for w in t)
        vocab = ["<pad>", "<unk>"] + sorted(counts, key=lambda w: (-counts[w], w))[: max(0, vocab_size - 2)]
    stoi = {w: i for i, w in enumerate(vocab)}
    xs = []
    for user in toks:
        a = np.zeros((len(user), max_len), dtype=np.int64)
        for i, t in enumerate(user):
            ids = [stoi.get(w, 1) for w in t[:max_len]]
            a[i, : len(ids)] = ids
        xs.append(a)
    return xs, ys, {"num_classes": 2, "input_shape": (max_len,),
                    "meta": {"vocab_size": len(vocab), "itos": vocab, "pad_id": 0, "unk_id": 1}}


_PARSERS = {"leaf_femnist": _femnist, "leaf_shakespeare": _shakespeare, "leaf_sent140": _sent140}


def load_leaf(name: str, data_dir: Path, **options: Any) -> dict:
    """Fields of a ``Dataset`` from LEAF's train/test JSON files; one natural client per training user."""
    folder = leaf_folder(name, data_dir)
    train = _read_split(name, folder, "train", data_dir)
    test = _read_split(name, folder, "test", data_dir)
    users = [u for u, *_ in train]
    index = {u: i for i, u in enumerate(users)}
    stray = next((u for u, *_ in test if u not in index), None)
    if stray is not None:
        raise DatasetError(f"{name}: test user {stray!r} has no training data in {folder / 'train'}; LEAF's "
                           f"-t sample split gives every user both (-t user splits by user: not a natural partition)")
    parse = _PARSERS[name]
    xs, ys, info = parse(train, name, data_dir, **options)
    if name == "leaf_sent140":
        options = {**options, "vocab": info["meta"]["itos"]}
    txs, tys, _ = parse(test, name, data_dir, **options)
    sizes = np.array([len(y) for y in ys], dtype=np.int64)
    if (sizes == 0).any():
        raise DatasetError(f"{name}: training user {users[int(np.argmin(sizes))]!r} has no samples; drop it "
                           f"(LEAF's -k filter) and rerun")
    starts = np.concatenate([[0], np.cumsum(sizes)])
    parts = [np.arange(starts[i], starts[i + 1], dtype=np.int64) for i in range(len(users))]
    test_parts: list[list[int]] = [[] for _ in users]
    pos = 0
    for (u, *_), y in zip(test, tys):
        test_parts[index[u]].extend(range(pos, pos + len(y)))
        pos += len(y)
    meta = dict(info.get("meta", {}))
    meta.update({"client_ids": users, "natural_test": [np.asarray(t, dtype=np.int64) for t in test_parts],
                 "split": f"LEAF's own train/test files under {folder}"})
    as_t = (lambda a: torch.from_numpy(a))
    return dict(
        train_x=as_t(np.concatenate(xs)), train_y=as_t(np.concatenate(ys)),
        test_x=as_t(np.concatenate(txs)) if txs else as_t(np.zeros((0, *info["input_shape"]), np.float32)),
        test_y=as_t(np.concatenate(tys)) if tys else as_t(np.zeros(0, np.int64)),
        num_classes=info["num_classes"], input_shape=tuple(info["input_shape"]),
        natural_partition=parts, meta=meta,
    )
