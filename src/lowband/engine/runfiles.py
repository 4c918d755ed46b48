"""A run folder that tells the truth: every file a run writes is checked when it is read.

A run keeps ``manifest.json`` beside its files: for each file it wrote (config.toml,
hyperparams.json, metrics.jsonl, timing.jsonl, summary.json, ledger.csv, checkpoint.pt and
any other it writes through :class:`~lowband.engine.runlog.RunLog`) the length and SHA-256
of its content. Every reader of a run folder (``--resume``, ``export``, ``compare``,
``lowband.load_run``, ``reproduce --collect``, ``frontier``) calls :func:`check_folder`
first, so a truncated, emptied, deleted, replaced or bit-flipped file is one line naming the
file and what to do (:class:`DamagedFileError`, exit 2), never a traceback, and never a
shorter run read as if it were whole (a ``--resume`` that continued across a hole).

Crash safety: the manifest is itself replaced atomically, and a file is replaced in three
steps (the manifest first accepts the old *and* the new content, then the file is renamed
into place, then the manifest keeps only the new), so a kill at any instant leaves a folder
that checks. Appended logs (metrics.jsonl, timing.jsonl) are recorded as a checked prefix:
a kill between an append and the manifest's update leaves whole lines after the prefix,
which the strict log reader (:meth:`RunLog.read_jsonl`) still validates.

A folder saved before manifests existed (its config.toml lacks :data:`MANIFEST_MARK`) is
read as before, with the structural checks only (strict logs, summary against metrics,
ledger totals against summary). A full disk while a run writes is one line naming the file
system, its free space and what the file needed (:class:`DiskFullError`); what was written
before stays whole (atomic replaces; an append that failed is cut back to its last whole line).
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any, Callable, Iterable, Optional

__all__ = ["RunDirError", "DamagedFileError", "DiskFullError", "Manifest", "MANIFEST_NAME", "MANIFEST_MARK",
           "check_folder", "checked_read", "disk_write"]

MANIFEST_NAME = "manifest.json"
#: the second line of every config.toml written since manifests exist: a folder whose
#: config.toml carries it and has no manifest.json has lost it (a damage, not an old run)
MANIFEST_MARK = "# its files are checked on every read against manifest.json (lengths and SHA-256)\n"
#: files a run appends to: the manifest checks a prefix of them
APPENDED = frozenset({"metrics.jsonl", "timing.jsonl"})
#: files of a run folder a reader relies on; one of them present but absent from the
#: manifest was not written by this run (copied in from another)
KNOWN = ("config.toml", "hyperparams.json", "metrics.jsonl", "timing.jsonl", "summary.json", "ledger.csv",
         "checkpoint.pt")
_CHUNK = 1 << 20


class RunDirError(RuntimeError):
    """The run folder cannot be used as asked (one line: what and how to fix)."""


class DamagedFileError(RunDirError, ValueError):
    """A file of a run folder is damaged: ``path`` and ``problem``. A :class:`RunDirError`
    (the CLI says it in one line, exit 2) and a ValueError (readers that catch bad input)."""

    def __init__(self, path: Path, problem: str, todo: Optional[str] = None):
        self.path, self.problem = Path(path), problem
        todo = todo or ("restore the file from a copy, or move the run folder away and run the config again "
                        "(a new out_dir)")
        super().__init__(f"{path} is damaged ({problem}): {todo}")


class DiskFullError(RunDirError, OSError):
    """The disk is full while a run writes: where, how much is free, what the file needed."""


# --------------------------------------------------------------------------- writing


def disk_write(f: Any, data: bytes) -> None:
    """Write ``data`` to the open file ``f``: the one place run files are written (a test
    patches it to simulate a full disk)."""
    f.write(data)


def _mount(path: Path) -> Path:
    p = Path(os.path.abspath(path))
    while not os.path.ismount(p) and p != p.parent:
        p = p.parent
    return p


def _mb(n: float) -> str:
    return f"{n / 1e6:.1f} MB" if n >= 1e5 else f"{int(n)} bytes"


def disk_full(path: Path, need: Optional[int]) -> DiskFullError:
    """The one-line error of a full disk while writing ``path`` (``need``: its bytes, if known)."""
    folder = Path(path).parent
    try:
        free = shutil.disk_usage(folder if folder.exists() else _mount(folder)).free
    except OSError:
        free = None
    text = (f"disk full: the file system at {_mount(folder)} has {_mb(free) if free is not None else 'no'} free "
            f"and {path.name} needs {'about ' + _mb(need) if need else 'more'}; free space there (or choose "
            f"another out_dir), then continue with --resume: the files already written are intact")
    err = DiskFullError(text)
    err.errno = errno.ENOSPC
    return err


def _is_full(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)


class _HashingWriter:
    """A file-like object that hashes and counts what goes through it (torch.save's target)."""

    def __init__(self, f: Any):
        self.f, self.sha, self.n, self.error = f, hashlib.sha256(), 0, None

    def write(self, b: Any) -> int:
        data = bytes(b)
        try:
            disk_write(self.f, data)
        except OSError as exc:
            self.error = exc
            raise
        self.sha.update(data)
        self.n += len(data)
        return len(data)

    def flush(self) -> None:
        self.f.flush()


def write_file(path: Path, fill: Callable[[Any], None], need: Callable[[], Optional[int]]) -> tuple[int, str]:
    """Write a temporary ``path.tmp`` through ``fill(writer)``, fsync it; returns (length,
    sha256). A full disk removes the temporary file and raises :class:`DiskFullError`."""
    tmp = path.with_name(path.name + ".tmp")
    w = None
    try:
        with open(tmp, "wb") as f:
            w = _HashingWriter(f)
            fill(w)
            f.flush()
            os.fsync(f.fileno())
    except BaseException as exc:
        tmp.unlink(missing_ok=True)
        cause = w.error if w is not None and w.error is not None else exc
        if _is_full(cause):
            raise disk_full(path, need()) from None
        raise
    return w.n, w.sha.hexdigest()


def fsync_dir(path: Path) -> None:
    """Make a rename inside ``path`` durable (POSIX; a no-op where folders cannot be opened)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


# --------------------------------------------------------------------------- the manifest


def _entry(n: int, sha: str) -> dict[str, Any]:
    return {"bytes": int(n), "sha256": sha}


class Manifest:
    """The manifest of one run folder being written: ``files[name] = {"bytes", "sha256"[, "also"]}``.
    ``also``: other contents accepted while a replace is under way (a kill mid-replace)."""

    def __init__(self, folder: Path, files: Optional[dict[str, Any]] = None):
        self.dir = Path(folder)
        self.path = self.dir / MANIFEST_NAME
        self.files: dict[str, Any] = dict(files or {})
        self._running: dict[str, Any] = {}  # name -> (hasher, length) of an appended file

    @classmethod
    def open(cls, folder: Path) -> "Manifest":
        """The folder's manifest to continue (a resume: checked by :func:`check_folder`
        before), else an empty one."""
        m = read_manifest(Path(folder))
        return cls(folder, m or {})

    def save(self, durable: bool = True) -> None:
        """Replace manifest.json atomically; ``durable``: fsynced too (not after an append,
        whose line is not fsynced either: a rename is atomic against a kill all the same)."""
        data = (json.dumps({"format": 1, "files": self.files}, indent=1, sort_keys=True) + "\n").encode()
        tmp = self.path.with_name(self.path.name + ".tmp")
        try:
            with open(tmp, "wb") as f:
                disk_write(f, data)
                f.flush()
                if durable:
                    os.fsync(f.fileno())
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            if _is_full(exc):
                raise disk_full(self.path, len(data)) from None
            raise
        os.replace(tmp, self.path)
        if durable:
            fsync_dir(self.dir)

    # -- replacing a whole file ----------------------------------------------------
    def replace(self, path: Path, fill: Callable[[Any], None], need: Callable[[], Optional[int]]) -> None:
        """Write ``path`` whole (``fill(writer)``) and record it: temporary file, manifest
        accepting old and new, rename, manifest with the new only."""
        name = path.name
        n, sha = write_file(path, fill, need)
        tmp = path.with_name(path.name + ".tmp")
        old = self.files.get(name)
        try:
            self.files[name] = {**_entry(n, sha), **({"also": [_plain(old)]} if old else {})}
            self.save()
        except BaseException:
            tmp.unlink(missing_ok=True)
            if old is not None:
                self.files[name] = old
            raise
        os.replace(tmp, path)
        fsync_dir(self.dir)
        self.files[name] = _entry(n, sha)
        self._running.pop(name, None)
        self.save(durable=False)  # (lost to a power cut, the manifest before still accepts the new content)

    def write_bytes(self, path: Path, data: bytes) -> None:
        self.replace(path, lambda w: w.write(data), lambda: len(data))

    def remove(self, path: Path) -> None:
        """Delete ``path``, then its record (a kill between leaves a record of a missing file:
        the reader says so in one line, and nothing is read as whole that is not)."""
        path.unlink(missing_ok=True)
        if self.files.pop(path.name, None) is not None:
            self.save()

    # -- appending ------------------------------------------------------------------
    def append(self, path: Path, data: bytes) -> None:
        """Append ``data`` to ``path`` and record the new prefix. A failed write (a full
        disk) cuts the file back to its length before, so no torn line stays in the middle."""
        name = path.name
        h, n = self._hasher(path)
        try:
            with open(path, "ab") as f:
                disk_write(f, data)
                f.flush()
        except OSError as exc:
            try:
                os.truncate(path, n)
            except OSError:
                pass
            if _is_full(exc):
                raise disk_full(path, len(data)) from None
            raise
        h.update(data)
        self._running[name] = (h, n + len(data))
        self.files[name] = _entry(n + len(data), h.hexdigest())
        self.save(durable=False)

    def _hasher(self, path: Path) -> tuple[Any, int]:
        got = self._running.get(path.name)
        if got is not None:
            return got
        h, n = hashlib.sha256(), 0
        if path.is_file():  # a resumed run: start from the file as it is (checked before)
            with open(path, "rb") as f:
                while chunk := f.read(_CHUNK):
                    h.update(chunk)
                    n += len(chunk)
        return h, n


def _plain(entry: dict[str, Any]) -> dict[str, Any]:
    return {"bytes": entry["bytes"], "sha256": entry["sha256"]}


# --------------------------------------------------------------------------- checking


def read_manifest(folder: Path) -> Optional[dict[str, Any]]:
    """The files recorded in ``folder``'s manifest (None: no manifest, an older run), or
    :class:`DamagedFileError` when it cannot be read or has gone missing."""
    path = Path(folder) / MANIFEST_NAME
    if not path.exists():
        if _marked(Path(folder)):
            raise DamagedFileError(path, "missing, while config.toml says the run keeps one",
                                   "restore it from a copy, or move the run folder away and run the config again "
                                   "(a new out_dir)")
        return None
    try:
        if path.is_dir():
            raise ValueError("a folder, not a file")
        raw = json.loads(path.read_bytes())
        files = raw["files"]
        if not isinstance(files, dict):
            raise ValueError
        for e in files.values():
            for alt in [e, *e.get("also", [])]:
                if not isinstance(alt["bytes"], int) or not isinstance(alt["sha256"], str):
                    raise ValueError
    except ValueError as exc:
        raise DamagedFileError(path, str(exc) or "not the manifest lowband writes",
                               "restore it from a copy, or move the run folder away and run the config again "
                               "(a new out_dir)") from None
    except (OSError, KeyError, TypeError, AttributeError):
        raise DamagedFileError(path, "not the manifest lowband writes",
                               "restore it from a copy, or move the run folder away and run the config again "
                               "(a new out_dir)") from None
    return files


def _marked(folder: Path) -> bool:
    try:
        with open(folder / "config.toml", "rb") as f:
            head = f.read(400)
    except OSError:
        return False
    return MANIFEST_MARK.encode() in head


def _prefix_sha(path: Path, n: int) -> Optional[str]:
    h, left = hashlib.sha256(), n
    with open(path, "rb") as f:
        while left > 0:
            chunk = f.read(min(_CHUNK, left))
            if not chunk:
                return None
            h.update(chunk)
            left -= len(chunk)
    return h.hexdigest()


def _check_entry(path: Path, entry: dict[str, Any]) -> None:
    name = path.name
    if not path.exists() and not path.is_symlink():
        raise DamagedFileError(path, "missing: the run wrote it and it has been removed")
    if not path.is_file():
        raise DamagedFileError(path, "a folder or special file where the run wrote a file")
    size = path.stat().st_size
    options = [entry, *entry.get("also", [])]
    for alt in options:
        n = alt["bytes"]
        if size == n or (name in APPENDED and size > n):
            if _prefix_sha(path, n) == alt["sha256"]:
                return
    want = entry["bytes"]
    if size < want and all(size < a["bytes"] for a in options):
        raise DamagedFileError(path, f"truncated: {size} bytes of the {want} the run wrote")
    if size > want and name not in APPENDED and all(size != a["bytes"] for a in options):
        raise DamagedFileError(path, f"{size} bytes where the run wrote {want}")
    raise DamagedFileError(path, "its content differs from what the run wrote (checksum mismatch)")


def check_folder(folder: Path, *, names: Optional[Iterable[str]] = None) -> Optional[dict[str, Any]]:
    """Check ``folder``'s files against its manifest (all of them, or ``names``); returns the
    manifest's entries (None: a folder from before manifests, not checked here). A file of
    :data:`KNOWN` that is present but not recorded is refused too (not this run's)."""
    folder = Path(folder)
    for name in KNOWN + (MANIFEST_NAME,):
        p = folder / name
        if p.exists() and not p.is_file():
            raise DamagedFileError(p, "a folder or special file where the run wrote a file")
    files = read_manifest(folder)
    if files is None:
        return None
    wanted = set(files) if names is None else set(names)
    for name in sorted(wanted):
        if name in files:
            _check_entry(folder / name, files[name])
        elif name in KNOWN and (folder / name).exists():
            raise DamagedFileError(folder / name, "not recorded in manifest.json: not a file this run wrote")
    if names is None:
        for name in KNOWN:
            if name not in files and (folder / name).exists():
                raise DamagedFileError(folder / name, "not recorded in manifest.json: not a file this run wrote")
    return files


def checked_read(path: Path) -> bytes:
    """The bytes of a run folder's file, checked against the folder's manifest."""
    path = Path(path)
    check_folder(path.parent, names=[path.name])
    try:
        return path.read_bytes()
    except OSError as exc:
        raise DamagedFileError(path, f"cannot be read ({exc.strerror or type(exc).__name__})") from None
