"""One writer per run folder: an advisory lock held for the life of a run.

Without it two processes could write one run folder: ``lowband run --resume`` started
while the run still goes on, or two ``lowband reproduce`` (one per core) that both meet
the same unfinished cell, one resuming it while the other restarts it from round 0. Their
metrics, checkpoints and summaries would interleave into a run that neither made, and
nothing would say so.

A run holds an exclusive ``flock`` on ``RUN/.lowband.lock`` from before it writes its
first file to its end (:class:`RunLock`); a second writer is refused before it writes
anything (:func:`lock_holder`, read by :meth:`~lowband.engine.runlog.RunLog.check`), and
``lowband reproduce`` skips such a run and goes on with the next one, so two of them
share a paper's runs between two cores. The kernel drops the lock when its process ends,
however it ends (a crash, ``kill -9``), so a lock file left behind blocks nobody; the file
stays (removing it while another process waits to lock it would let two hold a lock each).
The file says which process holds it (pid, host, since when) for the refusal's message.

Where ``fcntl`` does not exist (Windows), or the file system refuses locks (some network
mounts), runs are not locked.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path
from typing import Optional

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

#: the lock file's name in a run folder (a dot file: listings and exports pass it by)
LOCK_NAME = ".lowband.lock"


def lock_holder(run_dir: Path) -> Optional[str]:
    """Who holds ``run_dir``'s lock (``"pid 123 on host since 2026-11-27 23:12:01"``), or
    None when no process does (no lock file, or one whose process has ended). Writes nothing."""
    path = Path(run_dir) / LOCK_NAME
    if fcntl is None or not path.is_file():
        return None
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return _who(path)
        except OSError:  # a file system without locks (some network mounts): nobody can hold one
            return None
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def _who(path: Path) -> str:
    try:
        text = path.read_text(errors="replace").strip()
    except OSError:
        text = ""
    return text or "a process that has not said which"


class RunLock:
    """The exclusive lock of one run folder, taken by :meth:`acquire` and given back by
    :meth:`release` (or when the process ends)."""

    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / LOCK_NAME
        self._fd: Optional[int] = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> Optional[str]:
        """Take the lock (the folder must exist). Returns None when taken (or when locks do
        not exist here), else who holds it (:func:`lock_holder`'s text)."""
        if fcntl is None or self._fd is not None:
            return None
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return _who(self.path)
        except OSError:  # a file system without locks (some network mounts): the run goes on unlocked
            os.close(fd)
            return None
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()} on {socket.gethostname()} since {time.strftime('%Y-%m-%d %H:%M:%S')}\n"
                 .encode())
        self._fd = fd
        return None

    def release(self) -> None:
        """Give the lock back (unlocked first: a worker process forked while it was held
        shares the descriptor, and closing ours alone would leave the folder locked)."""
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)
