"""The ledger file of a run folder, ``ledger.csv``: one row per ledger record (one per
message and receiver), columns :data:`LEDGER_COLUMNS`. Written by the run log when a run
finishes (:meth:`lowband.engine.runlog.RunLog.write_ledger`) and read back by
``lowband export`` (:mod:`lowband.export`); imports nothing of lowband but the message
directions, so both can use it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

LEDGER_FILE = "ledger.csv"
LEDGER_COLUMNS = ("round", "src", "dst", "direction", "kind", "bytes", "declared")


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
