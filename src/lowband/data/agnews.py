"""AG News loader (Zhang, Zhao & LeCun 2015 CSV distribution).

Files under ``<data_dir>/ag_news/``: rows ``"label","title","description"`` with label
1..4. With both ``train.csv`` and ``test.csv`` the official split is used; with only
``test.csv`` (the offline case: 7,600 texts) a seeded stratified split of it is made,
``train_size`` texts for training and the rest for testing.

Text = title + " " + description, lower-cased and tokenised by a word regex. The
vocabulary is built from the training portion only (no test leakage): ids 0 = pad,
1 = unk, then words by descending count (ties alphabetical), up to ``vocab_size`` ids
in total. Sequences are truncated / right-padded to ``max_len``.
"""

from __future__ import annotations

import csv
import re
from collections import Counter
from pathlib import Path

import numpy as np
import torch

from ..seeding import np_gen
from .errors import corrupt_file, missing_file
from .files import spec
from .partition import split_local

__all__ = ["load_ag_news", "tokenize", "build_vocab", "encode", "AG_NEWS_CLASSES"]

AG_NEWS_CLASSES = ["World", "Sports", "Business", "Sci/Tech"]
PAD, UNK = 0, 1
_WORD = re.compile(r"[a-z0-9]+(?:'[a-z0-9]+)*")


def tokenize(text: str) -> list[str]:
    """Lower-case word tokens. The CSVs escape newlines as a backslash; treat it as space."""
    return _WORD.findall(text.replace("\\", " ").lower())


def build_vocab(token_lists: list[list[str]], vocab_size: int) -> list[str]:
    """``itos`` list: ``["<pad>", "<unk>"]`` then the most frequent words (count desc,
    then alphabetical), at most ``vocab_size`` entries in total; min count 1."""
    counts = Counter(t for toks in token_lists for t in toks)
    words = sorted(counts, key=lambda w: (-counts[w], w))[: max(0, vocab_size - 2)]
    return ["<pad>", "<unk>"] + words


def encode(token_lists: list[list[str]], itos: list[str], max_len: int) -> torch.Tensor:
    """int64 ``(N, max_len)`` ids: truncate, unknown words -> 1, right-pad with 0."""
    stoi = {w: i for i, w in enumerate(itos)}
    out = np.zeros((len(token_lists), max_len), dtype=np.int64)
    for row, toks in enumerate(token_lists):
        ids = [stoi.get(t, UNK) for t in toks[:max_len]]
        out[row, : len(ids)] = ids
    return torch.from_numpy(out)


def _read_csv(path: Path, data_dir: Path, name: str) -> tuple[list[str], np.ndarray]:
    s = spec("ag_news", f"ag_news/{path.name}")
    if not path.is_file():
        raise missing_file(name, path, s.description, data_dir)
    texts: list[str] = []
    labels: list[int] = []
    try:
        with open(path, newline="", encoding="utf-8") as f:
            for lineno, row in enumerate(csv.reader(f), start=1):
                if not row:
                    continue
                if len(row) != 3 or row[0].strip() not in ("1", "2", "3", "4"):
                    raise corrupt_file(name, path, f"row {lineno} is {row[:1]}... with {len(row)} fields",
                                       s.description + " with label 1..4", data_dir)
                labels.append(int(row[0]) - 1)
                texts.append(row[1] + " " + row[2])
    except (UnicodeDecodeError, csv.Error) as e:
        raise corrupt_file(name, path, f"{e.__class__.__name__}: {e}", s.description, data_dir) from None
    if not texts:
        raise corrupt_file(name, path, "no rows", s.description, data_dir)
    return texts, np.asarray(labels, dtype=np.int64)


def load_ag_news(
    data_dir: Path,
    *,
    train_size: int = 6000,
    vocab_size: int = 20000,
    max_len: int = 64,
    seed: int = 0,
    name: str = "ag_news",
) -> dict:
    """Load AG News as token ids; fields of a ``Dataset``. ``train_size``/``seed`` only
    apply when ``train.csv`` is absent (split of ``test.csv``)."""
    if vocab_size < 3 or max_len < 1:
        raise ValueError(f"{name}: need vocab_size >= 3 and max_len >= 1, got {vocab_size}, {max_len}")
    folder = data_dir / "ag_news"
    test_texts, test_y = _read_csv(folder / "test.csv", data_dir, name)
    if (folder / "train.csv").is_file():
        train_texts, train_y = _read_csv(folder / "train.csv", data_dir, name)
        split = "official train.csv / test.csv"
    else:
        n = len(test_texts)
        if not 0 < train_size < n:
            raise ValueError(
                f"{name}: train_size must be in 1..{n - 1} when only test.csv is present, got {train_size}"
            )
        tr, _, te = split_local(np.arange(n), test_y, (train_size / n, 0.0, 1 - train_size / n),
                                np_gen(seed, "ag_news", "split"))
        train_texts = [test_texts[i] for i in tr]
        train_y = test_y[tr]
        test_texts = [test_texts[i] for i in te]
        test_y = test_y[te]
        split = f"stratified split of test.csv: {len(tr)} train / {len(te)} test (seed {seed})"
    train_tok = [tokenize(t) for t in train_texts]
    itos = build_vocab(train_tok, vocab_size)
    return dict(
        train_x=encode(train_tok, itos, max_len),
        train_y=torch.from_numpy(train_y),
        test_x=encode([tokenize(t) for t in test_texts], itos, max_len),
        test_y=torch.from_numpy(test_y),
        num_classes=4,
        input_shape=(max_len,),
        meta={
            "classes": list(AG_NEWS_CLASSES),
            "vocab_size": len(itos),
            "itos": itos,
            "pad_id": PAD,
            "unk_id": UNK,
            "max_len": max_len,
            "split": split,
        },
    )

