"""Fetch dataset files with checksums, and verify files already on disk.

``download`` streams each file to ``<file>.part``, checks size and md5, then renames it
into place atomically, so an interrupted or corrupt transfer never leaves a file that
looks complete. A file already present with the right checksum is not fetched again.

A mirror (``base_url=`` or ``$LOWBAND_MIRROR``) is any HTTP(S) server holding the same
layout as a data folder, e.g. ``<mirror>/fashion-mnist/train-images-idx3-ubyte.gz``;
serving a copy of a data folder is enough.
"""

from __future__ import annotations

import hashlib
import os
import urllib.error
import urllib.request
import warnings
from dataclasses import dataclass
from pathlib import Path

from .errors import DatasetError
from .files import FILES, FileSpec

__all__ = ["download", "verify", "FileCheck", "file_md5", "url_for"]

_CHUNK = 1 << 20


def file_md5(path: Path) -> str:
    """Hex md5 of a file, read in 1 MiB chunks."""
    h = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(_CHUNK), b""):
            h.update(block)
    return h.hexdigest()


def url_for(spec: FileSpec, base_url: str | None = None) -> str:
    """The official URL, or ``<base_url>/<relpath>`` when a mirror is given (arg or env)."""
    base = base_url if base_url is not None else os.environ.get("LOWBAND_MIRROR") or None
    return spec.url if not base else base.rstrip("/") + "/" + spec.relpath


def _known_md5(spec: FileSpec, md5: str) -> str | None:
    """Which variant ``md5`` is ("official" or an alt label), or None if unknown."""
    if md5 == spec.md5:
        return "official"
    return next((label for label, m in spec.alt_md5 if m == md5), None)


def _check_name(name: str) -> tuple[FileSpec, ...]:
    if name not in FILES:
        from .sources import DATASETS

        if name in DATASETS:
            raise ValueError(f"{name}: needs no files (it is generated or bundled); nothing to download")
        raise ValueError(f"unknown dataset {name!r}; downloadable: {', '.join(FILES)}")
    return FILES[name]


def _fetch(name: str, spec: FileSpec, dest: Path, url: str, timeout: float) -> None:
    """Stream ``url`` to ``dest.part``, verify, rename to ``dest``. Never leaves a .part."""
    part = dest.with_name(dest.name + ".part")
    dest.parent.mkdir(parents=True, exist_ok=True)
    h = hashlib.md5(usedforsecurity=False)
    h256 = hashlib.sha256()
    size = 0
    try:
        req = urllib.request.Request(url, headers={"User-Agent": "lowband"})
        with urllib.request.urlopen(req, timeout=timeout) as resp, open(part, "wb") as out:
            for block in iter(lambda: resp.read(_CHUNK), b""):
                out.write(block)
                h.update(block)
                h256.update(block)
                size += len(block)
    except BaseException:
        part.unlink(missing_ok=True)
        raise
    md5 = h.hexdigest()
    if spec.size is not None and size != spec.size and _known_md5(spec, md5) is None:
        part.unlink(missing_ok=True)
        raise DatasetError(
            f"{name}: downloaded {dest} from {url} has {size} bytes, expected {spec.size} "
            "(truncated or wrong file; deleted). Retry, or use another mirror with --mirror/LOWBAND_MIRROR."
        )
    if _known_md5(spec, md5) is None:
        part.unlink(missing_ok=True)
        raise DatasetError(
            f"{name}: downloaded {dest} from {url} has md5 {md5}, expected {spec.md5} "
            "(corrupt or altered; deleted). Retry, or use another mirror with --mirror/LOWBAND_MIRROR."
        )
    if spec.sha256 is not None and h256.hexdigest() != spec.sha256:
        part.unlink(missing_ok=True)
        raise DatasetError(
            f"{name}: downloaded {dest} from {url} has sha256 {h256.hexdigest()}, expected {spec.sha256} "
            "(corrupt or altered; deleted). Retry, or use another mirror with --mirror/LOWBAND_MIRROR."
        )
    os.replace(part, dest)


def download(
    name: str,
    data_dir: str | Path | None,
    *,
    base_url: str | None = None,
    force: bool = False,
    timeout: float = 60.0,
) -> list[Path]:
    """Download the files of dataset ``name`` into ``data_dir``; return their paths.

    Files already present with a known-good md5 are kept unless ``force``. A present file
    with a wrong md5 is replaced. Optional files (AG News ``train.csv``, ``classes.txt``)
    that the server lacks (HTTP 404) are skipped with a warning. Any other failure raises
    a one-line DatasetError naming the file and URL; nothing partial is left behind.
    """
    from .sources import resolve_data_dir

    specs = _check_name(name)
    root = resolve_data_dir(data_dir)
    got: list[Path] = []
    for spec in specs:
        dest = root / spec.relpath
        if dest.is_file() and not force and _known_md5(spec, file_md5(dest)) is not None:
            got.append(dest)
            continue
        url = url_for(spec, base_url)
        try:
            _fetch(name, spec, dest, url, timeout)
        except urllib.error.HTTPError as e:
            if spec.optional and e.code == 404:
                warnings.warn(f"{name}: optional file {spec.relpath} not found at {url}; skipped", stacklevel=2)
                continue
            raise DatasetError(
                f"{name}: could not download {spec.relpath} from {url} (HTTP {e.code} {e.reason}). "
                "Check the URL/mirror (--mirror/LOWBAND_MIRROR) or place the file in "
                f"{root} by hand."
            ) from None
        except (urllib.error.URLError, OSError, TimeoutError) as e:
            reason = getattr(e, "reason", e)
            raise DatasetError(
                f"{name}: could not download {spec.relpath} from {url} ({reason}). Check the network "
                f"or use a mirror (--mirror/LOWBAND_MIRROR), or place the file in {root} by hand."
            ) from None
        got.append(dest)
    return got


@dataclass(frozen=True)
class FileCheck:
    """Result of checking one file: ``status`` is "ok", "missing" or "bad"."""

    path: Path
    status: str
    detail: str

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def verify(name: str, data_dir: str | Path | None = None) -> list[FileCheck]:
    """Check the files of ``name`` in ``data_dir``, one :class:`FileCheck` per file.

    MNIST, Fashion-MNIST, AG News: md5 against the official files (an absent optional
    file is reported "missing" but is not an error for loading). CIFAR-10: structure
    (all six batches readable, uint8 (n, 3072) data, labels 0..9), because the offline
    copy has images missing and cannot match the official md5; an extracted
    ``cifar-10-batches-py/`` folder is checked instead of the archive when present.
    """
    from .sources import resolve_data_dir

    specs = _check_name(name)
    root = resolve_data_dir(data_dir)
    if name == "cifar10":
        from .cifar import FOLDER, read_cifar_batches

        folder = root / FOLDER
        target = folder if folder.is_dir() else root / specs[0].relpath
        if not target.exists():
            return [FileCheck(target, "missing", specs[0].description)]
        try:
            batches = read_cifar_batches(root)
        except DatasetError as e:
            return [FileCheck(target, "bad", str(e))]
        n_train = sum(len(batches[f"data_batch_{i}"][1]) for i in range(1, 6))
        detail = f"structure ok: {n_train} train / {len(batches['test_batch'][1])} test images"
        if target.is_file():
            variant = _known_md5(specs[0], file_md5(target))
            detail += f"; md5 matches {variant}" if variant else "; md5 differs from the official archive"
        return [FileCheck(target, "ok", detail)]
    out = []
    for spec in specs:
        path = root / spec.relpath
        if not path.is_file():
            out.append(FileCheck(path, "missing", ("optional; " if spec.optional else "") + spec.description))
            continue
        md5 = file_md5(path)
        variant = _known_md5(spec, md5)
        if variant is None:
            out.append(FileCheck(path, "bad", f"md5 {md5}, expected {spec.md5}"))
        else:
            out.append(FileCheck(path, "ok", f"md5 {md5} ({variant})"))
    return out
