"""The ledger files of a run folder.

- ``ledger.csv``: one row per ledger record (one per message and receiver), columns
  :data:`LEDGER_COLUMNS`. Written by the run log when a run finishes
  (:meth:`lowband.engine.runlog.RunLog.write_ledger`) and read back by ``lowband export``
  (:mod:`lowband.export`).
- ``ledger.bin`` (:data:`LEDGER_LOG`): the records of a running run, appended at each
  checkpoint (only the records since the previous one: fixed-width binary rows,
  :data:`LEDGER_ROW`), so a checkpoint holds the ledger's row count and kind names instead
  of the whole ledger (issue 43: a 1,000-client run's checkpoint grew by 4.5 kB a round,
  rewritten every round). Resuming reads the checkpoint's rows back and cuts the file there.

Imports nothing of lowband but the message directions, so the run log, the checkpoint
observer and export can all use it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import numpy as np

LEDGER_FILE = "ledger.csv"
LEDGER_COLUMNS = ("round", "src", "dst", "direction", "kind", "bytes", "declared")
LEDGER_LOG = "ledger.bin"
#: one ledger record in ``ledger.bin`` (the Ledger's own column types, little-endian, packed)
LEDGER_ROW = np.dtype([("round", "<i8"), ("src", "<i8"), ("dst", "<i8"), ("direction", "u1"),
                       ("kind", "<i4"), ("encoded", "<i8"), ("declared", "<i8")])


def append_ledger_log(path: Any, ledger: Any, start: int, crc: int = 0) -> tuple[int, int]:
    """Append the ledger's records ``start:`` to the file ``path`` (cut to ``start`` rows
    first, so rows a killed run appended after its last checkpoint are dropped), flushed
    and fsynced; returns the rows now in the file (``len(ledger)``) and the CRC-32 of the
    file's bytes, continued from ``crc`` (that of its first ``start`` rows): the checkpoint
    keeps it, and :func:`read_ledger_log` refuses a file whose bytes no longer match."""
    import os
    import zlib

    n = len(ledger)
    c = ledger.columns()
    rows = np.empty(n - start, dtype=LEDGER_ROW)
    for k in LEDGER_ROW.names:
        rows[k] = c[k][start:n]
    with open(path, "r+b" if os.path.exists(path) else "wb") as f:
        f.truncate(start * LEDGER_ROW.itemsize)
        f.seek(start * LEDGER_ROW.itemsize)
        data = rows.tobytes()
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    return n, zlib.crc32(data, crc)


def read_ledger_log(path: Any, rows: int, kinds: list[str], crc: Optional[int] = None) -> dict[str, Any]:
    """The first ``rows`` records of ``ledger.bin`` as a :meth:`Ledger.state_dict`
    (``kinds``: the kind names the checkpoint saved); a file with fewer rows, or (``crc``
    given) whose bytes are not those the checkpoint counted, is a one-line error."""
    import zlib

    import torch

    from lowband.engine.runfiles import DamagedFileError

    try:
        data = np.fromfile(path, dtype=LEDGER_ROW, count=rows) if rows else np.empty(0, LEDGER_ROW)
    except OSError as exc:
        raise DamagedFileError(Path(path), f"cannot be read ({exc.strerror or exc})") from None
    if data.shape[0] != rows:
        raise DamagedFileError(Path(path), f"holds {data.shape[0]} ledger rows, the checkpoint counts {rows}")
    if crc is not None and zlib.crc32(data.tobytes()) != int(crc):
        raise DamagedFileError(Path(path), "its bytes differ from those the checkpoint counted (CRC-32)")
    state: dict[str, Any] = {"version": 1, "n": int(rows), "kinds": list(kinds)}
    for k in LEDGER_ROW.names:
        state[k] = torch.from_numpy(np.ascontiguousarray(data[k]))
    return state


def ledger_columns(ledger: Any) -> dict[str, np.ndarray]:
    """The ledger's records as named columns, directions and kinds as strings."""
    from lowband.comm.message import DIRECTIONS

    c = ledger.columns()
    kinds = np.array(ledger.kinds or [""], dtype=object)
    dirs = np.array(list(DIRECTIONS), dtype=object)
    return {"round": c["round"].copy(), "src": c["src"].copy(), "dst": c["dst"].copy(),
            "direction": dirs[c["direction"].astype(np.int64)], "kind": kinds[c["kind"].astype(np.int64)],
            "bytes": c["encoded"].copy(), "declared": c["declared"].copy()}


def ledger_csv_text(cols: dict[str, np.ndarray]) -> str:
    """CSV text of ledger columns (header first)."""
    lists = [cols[k].tolist() for k in LEDGER_COLUMNS]
    lines = [",".join(LEDGER_COLUMNS)]
    lines += [f"{r},{s},{d},{di},{_csv_str(k)},{b},{de}" for r, s, d, di, k, b, de in zip(*lists)]
    return "\n".join(lines) + "\n"


def _csv_str(s: str) -> str:
    return s if not any(ch in s for ch in ',"\n\r') else '"' + s.replace('"', '""') + '"'
