"""Caches that make a SPARK round cost what the paper claims, without changing a number.

- :class:`XPCache` keeps each node's weight-independent product ``Q = X P1`` (plus ``P_b1``
  in the paper's ``sum`` layout: :meth:`~lowband.algorithms.decentralised.ntk.Projection.xp`)
  (``n x hidden x k``; 79 MB in float32 per node at the paper's size, 31 GFLOP to compute)
  across rounds: a node's data and ``P`` never change, so ``Q`` is computed once per node
  and run, not once per round (or once per requester group). Storage is tiered by a stated
  budget: RAM up to ``ram_mb``, then memory-mapped files in a scratch folder up to
  ``disk_mb``, then nothing (recomputed on demand, as without a cache). ``float32`` (the
  default) stores the exact bytes the uncached path computes, so results are identical
  whichever tier a node lands in; ``float16`` halves the bytes and rounds ``Q`` (a relative
  error of up to 5e-4 per entry; the projected Jacobians differ by 2e-4 relative (Frobenius)
  and the projected kernel by 1e-5 at the paper's size).
- :class:`LiftCache` keeps ``w0 + P theta`` for the coordinates of the current round: the
  five neighbours that answer requester i all lift i's ``theta_bar`` (a 313 MB read of
  ``P`` each at the paper's size); a pure function of ``theta``, computed once per process.

- :func:`keep_freed_heap` asks glibc's allocator to keep the memory a step frees for the
  next step instead of returning it to the system: a SPARK step moves hundreds of MB of
  7.9 MB Jacobian messages (tensors, their encoded bytes, the decoded copies), which the
  default policy hands back at the end of the step and page-faults afresh in the next
  (about 400,000 faults per 30-node round, 0.8 s of an 11 s round at 2 threads).

Both caches are performance only: never part of a node's state, never checkpointed, and they pickle
as empty caches (a worker process or a resumed run rebuilds them). The process that owns
the files of :class:`XPCache` removes them when the cache is garbage collected or the
interpreter exits; files left by a killed process are swept by the next run using the
folder (:func:`sweep_stale_scratch`).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import sys
import uuid
import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Hashable, Optional

import numpy as np
import torch

#: file name prefix of the scratch files: ``spark-xp-<pid>-<token>-<node>.<dtype>``
PREFIX = "spark-xp-"
#: products being written to their files at once, each held in RAM until its file is complete
#: (a writer thread overlaps the writes with the next nodes' products: SPARK's first round at
#: 100 nodes writes 6 GB, about 0.18 s per 80 MB product on this project's machines)
MAX_PENDING_WRITES = 2


def fingerprint(x: torch.Tensor) -> bytes:
    """A digest of ``x``'s shape and bytes (the cache's check that a node's data is the data
    its entry was computed from)."""
    h = hashlib.blake2b(digest_size=16)
    h.update(repr((tuple(x.shape), str(x.dtype))).encode())
    h.update(x.detach().cpu().contiguous().numpy().tobytes())
    return h.digest()


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, someone else's
        return True
    return True


def sweep_stale_scratch(folder: str) -> list[str]:
    """Remove ``spark-xp-<pid>-*`` files in ``folder`` whose process is gone (a run killed
    mid-way leaves its ``X P`` products behind: 80 MB per node at the paper's size). Files
    of live processes are left alone. Returns the removed paths."""
    removed = []
    for name in os.listdir(folder):
        parts = name.split("-")
        if not (name.startswith(PREFIX) and len(parts) >= 4 and parts[2].isdigit()):
            continue
        if not _pid_alive(int(parts[2])):
            path = os.path.join(folder, name)
            try:
                os.remove(path)
                removed.append(path)
            except FileNotFoundError:
                pass
    return removed


def _remove_all(paths: list[str], owner: Optional[int] = None) -> None:
    """Remove ``paths`` (only in the process ``owner`` that wrote them: a forked worker that
    inherited the list must not remove its parent's files when it exits)."""
    if owner is not None and os.getpid() != owner:
        return
    for p in paths:
        try:
            os.remove(p)
        except FileNotFoundError:
            pass


class XPCache:
    """Per-node ``X P1`` products, kept across rounds within a RAM and a disk budget.

    ``get(key, x, compute)`` returns ``Q`` for ``x`` (``compute(x)`` builds it, float32):
    from RAM, from a memory-mapped file, or freshly computed; a new entry goes to RAM while
    the RAM budget lasts, then to a file in ``folder`` while the disk budget lasts, else it
    is not kept. With ``dtype = "float16"`` stored entries are rounded to half precision and
    a fresh product is rounded the same way before use, so a node's numbers do not depend on
    whether its entry was cached. ``stats`` counts hits and misses per tier.
    """

    def __init__(self, ram_mb: float, disk_mb: float = 0.0, folder: Optional[str] = None,
                 dtype: str = "float32") -> None:
        if dtype not in ("float32", "float16"):
            raise ValueError(f"dtype {dtype!r}: use 'float32' or 'float16'")
        self.ram_mb, self.disk_mb, self.folder, self.dtype = float(ram_mb), float(disk_mb), folder, dtype
        self._tdtype = torch.float32 if dtype == "float32" else torch.float16
        self._ndtype = np.float32 if dtype == "float32" else np.float16
        self.ram: dict[Hashable, tuple[bytes, torch.Tensor]] = {}
        self.disk: dict[Hashable, tuple[bytes, str, tuple[int, ...]]] = {}
        self.ram_bytes = 0
        self.disk_bytes = 0
        self.stats = {"ram": 0, "disk": 0, "computed": 0, "kept_ram": 0, "kept_disk": 0}
        self._token = uuid.uuid4().hex[:8]
        self._paths: list[str] = []
        #: key -> (fingerprint, file, the product, its write): written by one thread, in order
        self._pending: dict[Hashable, tuple[bytes, str, torch.Tensor, Future]] = {}
        self._writer: Optional[ThreadPoolExecutor] = None
        self._writer_pid = os.getpid()
        self._finalizer = weakref.finalize(self, _remove_all, self._paths, os.getpid())
        self._swept = False

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickles (e.g. to a worker process) as an empty cache with the same budget."""
        return (XPCache, (self.ram_mb, self.disk_mb, self.folder, self.dtype))

    def close(self) -> None:
        """Drop every entry and remove this cache's files."""
        self.flush()
        if self._writer is not None:
            self._writer.shutdown(wait=True)
            self._writer = None
        self.ram.clear()
        self.disk.clear()
        self.ram_bytes = self.disk_bytes = 0
        _remove_all(self._paths)
        self._paths.clear()

    def get(self, key: Hashable, x: torch.Tensor, compute: Callable[[torch.Tensor], torch.Tensor]) -> Any:
        """``Q`` for ``x`` under ``key``: a float32 or float16 tensor, or a read-only
        ``numpy.memmap`` (rows indexable, converted chunk by chunk by the caller)."""
        fp = fingerprint(x)
        self._reap()
        hit = self.ram.get(key)
        if hit is not None and hit[0] == fp:
            self.stats["ram"] += 1
            return hit[1]
        pending = self._pending.get(key)
        if pending is not None and pending[0] == fp:  # its file is being written: the same bytes
            self.stats["disk"] += 1
            return pending[2]
        on_disk = self.disk.get(key)
        if on_disk is not None and on_disk[0] == fp:
            self.stats["disk"] += 1
            # copy-on-write: torch wraps it without a copy (nothing writes to it)
            return np.memmap(on_disk[1], dtype=self._ndtype, mode="c", shape=on_disk[2])
        self.stats["computed"] += 1
        q = compute(x)
        if self._tdtype != torch.float32:
            q = q.to(self._tdtype)
        size = q.numel() * q.element_size()
        if self.ram_bytes + size <= self.ram_mb * 1e6:
            self.ram[key] = (fp, q)
            self.ram_bytes += size
            self.stats["kept_ram"] += 1
        elif self.folder is not None and self.disk_bytes + size <= self.disk_mb * 1e6:
            self._write(key, fp, q)
            self.stats["kept_disk"] += 1
        return q

    def _write(self, key: Hashable, fp: bytes, q: torch.Tensor) -> None:
        """Write ``q`` to its file on the writer thread (at most :data:`MAX_PENDING_WRITES` at
        once; the entry joins the disk tier when its file is complete)."""
        assert self.folder is not None
        if not self._swept:
            os.makedirs(self.folder, exist_ok=True)
            sweep_stale_scratch(self.folder)
            self._swept = True
        while len(self._pending) >= MAX_PENDING_WRITES:
            next(iter(self._pending.values()))[3].result()
            self._reap()
        tag = hashlib.blake2b(repr(key).encode(), digest_size=6).hexdigest()
        path = os.path.join(self.folder, f"{PREFIX}{os.getpid()}-{self._token}-{tag}.{self.dtype}")
        self._paths.append(path)
        self.disk_bytes += q.numel() * q.element_size()
        data = q.detach().cpu().contiguous()
        if self._writer is None:
            self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="spark-xp-writer")
        self._pending[key] = (fp, path, data, self._writer.submit(_write_file, path, data))

    def _reap(self) -> None:
        """Move the products whose files are complete to the disk tier (a failed write raises).
        A forked copy of the cache (a worker process) has no writer thread: it forgets the
        writes its parent had under way (their files are the parent's) and starts its own."""
        if self._writer_pid != os.getpid():
            self._pending, self._writer, self._writer_pid = {}, None, os.getpid()
        for key in [k for k, v in self._pending.items() if v[3].done()]:
            fp, path, data, fut = self._pending.pop(key)
            fut.result()
            self.disk[key] = (fp, path, tuple(data.shape))

    def flush(self) -> None:
        """Wait for every pending write."""
        for v in list(self._pending.values()):
            v[3].result()
        self._reap()


def _write_file(path: str, data: torch.Tensor) -> None:
    """``data``'s own buffer to ``path`` (no second copy of it)."""
    with open(path, "wb") as fh:
        fh.write(memoryview(data.numpy()).cast("B"))


class LiftCache:
    """``w0 + P theta`` for the coordinates seen this round (a pure function of ``theta``:
    every responder of requester i lifts the same ``theta_bar_i``). Entries are read-only
    parameter dicts; the cache is emptied when the round changes and holds at most
    ``max_entries``."""

    def __init__(self, max_entries: int = 4096) -> None:
        self.max_entries = int(max_entries)
        self.round: Optional[int] = None
        self.items: dict[tuple, dict[str, torch.Tensor]] = {}
        self.hits = 0

    def __reduce__(self) -> tuple[Any, ...]:
        return (LiftCache, (self.max_entries,))

    def get(self, round: int, key: Hashable, theta: torch.Tensor,
            lift: Callable[[torch.Tensor], dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        if round != self.round:
            self.items.clear()
            self.round = round
        k = (key, fingerprint(theta))
        got = self.items.get(k)
        if got is not None:
            self.hits += 1
            return got
        got = lift(theta)
        if len(self.items) < self.max_entries:
            self.items[k] = got
        return got


#: glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
#: blocks from this size up are mapped (and unmapped when freed) on their own: glibc's own
#: ceiling for its dynamic threshold, so long-lived big arrays (``X P``, ``P``) never pin the heap
HEAP_MMAP_BYTES = 32 << 20
_heap_kept = False


def keep_freed_heap() -> bool:
    """Keep freed heap memory in the process for reuse (performance only; Linux with glibc,
    elsewhere nothing happens and False is returned).

    Sets glibc's ``M_TRIM_THRESHOLD`` to -1 (the heap is never trimmed: memory a step frees
    serves the next step's allocations instead of being returned and page-faulted again) and
    pins ``M_MMAP_THRESHOLD`` at 32 MB (the ceiling of glibc's dynamic threshold: smaller
    blocks come from the heap, larger ones are still mapped and unmapped on their own).
    The peak memory does not change (the heap grows only as far as it did without this);
    the process keeps it between steps. Once per process; idempotent. Changes no number."""
    global _heap_kept
    if _heap_kept:
        return True
    if not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc":
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # pragma: no cover - glibc always has it
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    _heap_kept = mallopt(_M_MMAP_THRESHOLD, HEAP_MMAP_BYTES) == 1 and mallopt(_M_TRIM_THRESHOLD, -1) == 1
    return _heap_kept


__all__ = ["HEAP_MMAP_BYTES", "LiftCache", "XPCache", "fingerprint", "keep_freed_heap", "sweep_stale_scratch"]
