"""Optional TensorBoard logging of a run's metrics (``log.tensorboard = true`` or
``lowband run --tensorboard``; extra ``lowband[tensorboard]``).

Every evaluated round's metrics line (metrics.jsonl) becomes TensorBoard scalars in
``RUN/tb/``: one tag per metric key (``global/acc``, ``bytes/total``, ...), the round as
the step. Only finite numbers are written (a ``null`` in metrics.jsonl is skipped). The
folder is derived from metrics.jsonl and rebuilt from it when a run is resumed, so it holds
each round once. metrics.jsonl stays the record; TensorBoard is a view of it:
``tensorboard --logdir RUN/tb`` (or ``--logdir runs`` to compare runs).
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path
from typing import Any, Iterable

TB_DIR = "tb"
INSTALL_HINT = "pip install 'lowband[tensorboard]'"


def require_tensorboard() -> Any:
    """torch's ``SummaryWriter``, or a one-line ValueError saying how to install it."""
    try:
        import tensorboard  # noqa: F401  (torch.utils.tensorboard needs it; its own error is longer)
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as exc:
        raise ValueError(f"log.tensorboard needs the tensorboard package, which is not installed ({exc}); "
                         f"install it with {INSTALL_HINT}, or drop --tensorboard / log.tensorboard") from None
    return SummaryWriter


def scalars(rec: dict[str, Any]) -> dict[str, float]:
    """The finite numeric metrics of one metrics.jsonl record (``round`` excluded)."""
    out: dict[str, float] = {}
    for k, v in rec.items():
        if k == "round" or isinstance(v, bool) or not isinstance(v, (int, float)):
            continue
        if math.isfinite(float(v)):
            out[k] = float(v)
    return out


class TensorBoardLog:
    """Writes metrics records to ``folder`` as TensorBoard scalars.

    Opening it replaces whatever ``folder`` held by ``records`` (the run's metrics so far),
    so a resumed run's event log matches its metrics.jsonl."""

    def __init__(self, folder: Path, records: Iterable[dict[str, Any]] = ()):
        writer = require_tensorboard()
        self.folder = Path(folder)
        if self.folder.exists():
            shutil.rmtree(self.folder)
        self._w = writer(log_dir=str(self.folder))
        for rec in records:
            self.add(rec, flush=False)
        self._w.flush()

    def add(self, rec: dict[str, Any], flush: bool = True) -> None:
        step = int(rec.get("round", 0))
        for tag, v in scalars(rec).items():
            self._w.add_scalar(tag, v, global_step=step)
        if flush:
            self._w.flush()

    def close(self) -> None:
        self._w.close()


def read_scalars(folder: Path) -> dict[str, list[tuple[int, float]]]:
    """The scalars of the event files under ``folder``: ``{tag: [(step, value), ...]}``
    (tensorboard's own reader; for tests and notebooks)."""
    require_tensorboard()
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(int(e.step), float(e.value)) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
