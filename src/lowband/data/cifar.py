"""CIFAR-10 loader for the canonical python distribution.

Reads ``<data_dir>/cifar-10-batches-py/`` when it is extracted there, else streams the
batches straight out of ``<data_dir>/cifar-10-python.tar.gz`` (no extraction needed).
Each batch is a pickled dict ``{b"data": uint8 (n, 3072) channel-major, b"labels": [...]}``.

The pickles are read with a restricted unpickler that only resolves the few numpy
globals an array needs, so a tampered file cannot run code. Validation is structural
(layout, keys, shapes, label range), not by checksum: the offline copy in shared/data
has 161 images missing, so batches hold fewer than 10000 rows.
"""

from __future__ import annotations

import io
import pickle
import tarfile
import warnings
import zlib
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from .errors import DatasetError, corrupt_file, missing_file
from .files import FILES

__all__ = ["load_cifar10", "read_cifar_batches", "CIFAR10_STATS", "CIFAR10_CLASSES"]

CIFAR10_STATS = ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616))
CIFAR10_CLASSES = [
    "airplane", "automobile", "bird", "cat", "deer",
    "dog", "frog", "horse", "ship", "truck",
]
FOLDER = "cifar-10-batches-py"
TRAIN_BATCHES = tuple(f"data_batch_{i}" for i in range(1, 6))
TEST_BATCH = "test_batch"
_EXPECTED = "the cifar-10-batches-py/ layout: data_batch_1..5 and test_batch, pickled dicts with uint8 data (n, 3072) and n labels 0..9"

_ALLOWED_GLOBALS = {
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
    ("numpy.core.multiarray", "scalar"),
    ("numpy._core.multiarray", "scalar"),
    ("_codecs", "encode"),  # how Python 3 writes bytes in a protocol-2 pickle; harmless
}


class _SafeUnpickler(pickle.Unpickler):
    """Unpickler that resolves only the numpy globals a plain ndarray needs."""

    def find_class(self, module: str, name: str):  # noqa: D102
        if (module, name) in _ALLOWED_GLOBALS:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                return super().find_class(module, name)
        raise pickle.UnpicklingError(f"global {module}.{name} not allowed in a CIFAR batch")


def _parse_batch(raw: bytes, where: str) -> tuple[np.ndarray, np.ndarray]:
    """Decode one pickled batch into (uint8 (n, 3072), int64 (n,)); ValueError if malformed."""
    try:
        d = _SafeUnpickler(io.BytesIO(raw), encoding="bytes").load()
    except Exception as e:  # any unpickling failure is "not a CIFAR batch"
        raise ValueError(f"{where} is not a readable pickle ({e.__class__.__name__}: {e})") from None
    if not isinstance(d, dict) or b"data" not in d or b"labels" not in d:
        raise ValueError(f"{where} is not a dict with b'data' and b'labels'")
    data, labels = d[b"data"], np.asarray(d[b"labels"])
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3072:
        shape = getattr(data, "shape", None)
        raise ValueError(f"{where} data is {type(data).__name__} {shape}, not uint8 (n, 3072)")
    if labels.shape != (data.shape[0],):
        raise ValueError(f"{where} has {labels.shape} labels for {data.shape[0]} images")
    if labels.size and (labels.min() < 0 or labels.max() > 9):
        raise ValueError(f"{where} has labels outside 0..9")
    return data, labels.astype(np.int64)


def read_cifar_batches(data_dir: Path, dataset: str = "cifar10") -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Read all six batches (``data_batch_1..5``, ``test_batch``) as raw arrays.

    Prefers an extracted ``cifar-10-batches-py/`` folder, else the ``.tar.gz``.
    Raises one-line DatasetError for a missing archive, bad gzip/tar or bad layout.
    """
    spec = FILES["cifar10"][0]
    folder, archive = data_dir / FOLDER, data_dir / spec.relpath
    names = TRAIN_BATCHES + (TEST_BATCH,)
    out: dict[str, tuple[np.ndarray, np.ndarray]] = {}

    if folder.is_dir():
        for n in names:
            p = folder / n
            if not p.is_file():
                raise missing_file(dataset, p, f"a pickled CIFAR-10 batch; {_EXPECTED}", data_dir)
            try:
                out[n] = _parse_batch(p.read_bytes(), n)
            except ValueError as e:
                raise corrupt_file(dataset, p, str(e), _EXPECTED, data_dir) from None
        return out

    if not archive.is_file():
        raise missing_file(dataset, archive, f"{spec.description}; or the extracted {FOLDER}/ folder", data_dir)
    bad: Callable[[str], DatasetError] = lambda problem: corrupt_file(  # noqa: E731
        dataset, archive, problem, spec.description, data_dir
    )
    try:
        with tarfile.open(archive, "r:gz") as tf:
            for member in tf:
                base = member.name.rsplit("/", 1)
                if len(base) == 2 and base[0].strip("./") == FOLDER and base[1] in names and member.isfile():
                    f = tf.extractfile(member)
                    assert f is not None
                    try:
                        out[base[1]] = _parse_batch(f.read(), f"{FOLDER}/{base[1]}")
                    except ValueError as e:
                        raise bad(str(e)) from None
    except (tarfile.TarError, EOFError, zlib.error, OSError) as e:
        raise bad(f"unreadable gzip tar: {e.__class__.__name__}: {e}") from None
    missing = [n for n in names if n not in out]
    if missing:
        raise bad(f"bad tar layout: no {FOLDER}/{missing[0]} inside" + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
    return out


def load_cifar10(data_dir: Path, name: str = "cifar10") -> dict:
    """Load CIFAR-10 as float32 ``(N, 3, 32, 32)`` normalised per channel; fields of a ``Dataset``."""
    batches = read_cifar_batches(data_dir, name)
    mean = torch.tensor(CIFAR10_STATS[0]).view(1, 3, 1, 1)
    std = torch.tensor(CIFAR10_STATS[1]).view(1, 3, 1, 1)

    def images(parts: list[np.ndarray]) -> torch.Tensor:
        x = torch.from_numpy(np.concatenate(parts)).view(-1, 3, 32, 32).to(torch.float32)
        return x.div_(255.0).sub_(mean).div_(std)

    train = [batches[n] for n in TRAIN_BATCHES]
    test = batches[TEST_BATCH]
    return dict(
        train_x=images([d for d, _ in train]),
        train_y=torch.from_numpy(np.concatenate([y for _, y in train])),
        test_x=images([test[0]]),
        test_y=torch.from_numpy(test[1]),
        num_classes=10,
        input_shape=(3, 32, 32),
        meta={
            "classes": list(CIFAR10_CLASSES),
            "normalize": {"mean": list(CIFAR10_STATS[0]), "std": list(CIFAR10_STATS[1])},
        },
    )
