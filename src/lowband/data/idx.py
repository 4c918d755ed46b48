"""MNIST-family loader: gzip-compressed IDX files (LeCun's format).

An IDX file is a 4-byte magic ``00 00 <dtype> <ndim>``, then ``ndim`` big-endian uint32
sizes, then the raw array. We read only unsigned-byte files (dtype 0x08): labels are 1-D,
images 3-D. Every structural problem (missing file, bad gzip, wrong magic, wrong counts,
truncation) becomes a one-line :class:`DatasetError` that names the file.
"""

from __future__ import annotations

import gzip
import struct
import zlib
from pathlib import Path

import numpy as np
import torch

from .errors import DatasetError, corrupt_file, missing_file
from .files import FILES

__all__ = ["read_idx_gz", "load_idx_dataset", "IDX_STATS"]

# (mean, std) of the training pixels after x/255; the values used across the FL literature.
IDX_STATS: dict[str, tuple[float, float]] = {
    "mnist": (0.1307, 0.3081),
    "fashion_mnist": (0.2860, 0.3530),
}

_CLASSES = {
    "mnist": [str(i) for i in range(10)],
    "fashion_mnist": [
        "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
        "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot",
    ],
}


def read_idx_gz(
    path: Path,
    *,
    dataset: str,
    data_dir: Path,
    expected_shape: tuple[int, ...],
    description: str,
) -> np.ndarray:
    """Read one ``.gz`` IDX file of unsigned bytes and check it has ``expected_shape``.

    Returns a uint8 array. Raises DatasetError (one line) naming ``path`` on any problem.
    """
    if not path.is_file():
        raise missing_file(dataset, path, description, data_dir)

    def bad(problem: str) -> DatasetError:
        return corrupt_file(dataset, path, problem, description, data_dir)

    try:
        with gzip.open(path, "rb") as f:
            raw = f.read()
    except (EOFError, gzip.BadGzipFile, zlib.error, OSError) as e:
        raise bad(f"unreadable gzip: {e.__class__.__name__}: {e}") from None
    if len(raw) < 4:
        raise bad(f"only {len(raw)} bytes after decompression")
    zero, dtype_code, ndim = struct.unpack(">HBB", raw[:4])
    want_ndim = len(expected_shape)
    if zero != 0 or dtype_code != 0x08 or ndim != want_ndim:
        magic = int.from_bytes(raw[:4], "big")
        raise bad(f"magic number 0x{magic:08x}, not 0x{0x800 + want_ndim:08x}")
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise bad("header cut short")
    shape = struct.unpack(f">{ndim}I", raw[4:header])
    if tuple(shape) != tuple(expected_shape):
        raise bad(f"header says shape {tuple(shape)}, not {tuple(expected_shape)}")
    n = int(np.prod(shape))
    if len(raw) - header != n:
        raise bad(f"{len(raw) - header} data bytes, header promises {n}")
    return np.frombuffer(raw, dtype=np.uint8, count=n, offset=header).reshape(shape)


def load_idx_dataset(name: str, data_dir: Path) -> dict:
    """Load ``mnist`` or ``fashion_mnist`` from ``data_dir`` into normalised tensors.

    Images become float32 ``(N, 1, 28, 28)``: ``(x/255 - mean) / std`` with the standard
    constants in :data:`IDX_STATS`. Returns the fields of a ``Dataset``.
    """
    specs = {s.relpath.rsplit("/", 1)[1]: s for s in FILES[name]}
    arrays = {}
    for split, n in (("train", 60000), ("t10k", 10000)):
        for kind, shape in (("images-idx3", (n, 28, 28)), ("labels-idx1", (n,))):
            s = specs[f"{split}-{kind}-ubyte.gz"]
            arrays[(split, kind[:6])] = read_idx_gz(
                data_dir / s.relpath,
                dataset=name,
                data_dir=data_dir,
                expected_shape=shape,
                description=s.description,
            )
    mean, std = IDX_STATS[name]
    scale, shift = 1.0 / (255.0 * std), -mean / std

    def images(a: np.ndarray) -> torch.Tensor:
        t = torch.from_numpy(a.copy()).to(torch.float32)  # copy: frombuffer is read-only
        return t.mul_(scale).add_(shift).unsqueeze(1)

    def labels(a: np.ndarray, split: str) -> torch.Tensor:
        if a.max(initial=0) > 9:
            s = specs[f"{split}-labels-idx1-ubyte.gz"]
            raise corrupt_file(name, data_dir / s.relpath, f"label {int(a.max())} > 9",
                               s.description, data_dir)
        return torch.from_numpy(a.astype(np.int64))

    return dict(
        train_x=images(arrays[("train", "images")]),
        train_y=labels(arrays[("train", "labels")], "train"),
        test_x=images(arrays[("t10k", "images")]),
        test_y=labels(arrays[("t10k", "labels")], "t10k"),
        num_classes=10,
        input_shape=(1, 28, 28),
        meta={"classes": list(_CLASSES[name]), "normalize": {"mean": [mean], "std": [std]}},
    )
