"""Availability trace files: lowband's CSV format, and conversion from a FedScale-style trace.

**lowband's format** (``[devices.availability] kind = "trace"``): a CSV file with the header
``node,start_s,end_s``, one row per on-window of a node: the node (0-based) is reachable
from ``start_s`` (included) to ``end_s`` (excluded), seconds on the simulated clock since
the run began. Rows may come in any order; overlapping windows of a node are joined; a
node without rows is never reachable. With ``period_s`` set in the config the windows
repeat every ``period_s`` seconds (they must then lie within ``[0, period_s]``).

**FedScale's layout** (what :func:`from_fedscale` reads): FedScale ships its client
availability as a Python pickle (``client_behave_trace``) of a dict ``{client_id:
{"active": [t0, t1, ...], "inactive": [u0, u1, ...], "finish_time": T, ...}}``: client
``client_id`` becomes active at ``active[k]`` and inactive at ``inactive[k]`` (seconds),
and its trace repeats with period ``finish_time`` (FedScale reads it at ``t mod
finish_time``). Other keys (``duration``, ``model``) are ignored. lowband reads the same
structure from JSON (keys as strings), never a pickle: a pickle runs code when loaded.
Convert one with ``json.dump(pickle.load(f), g)`` where you trust the file, then
``python experiments/devices/convert_fedscale.py trace.json out.csv``. Clients are mapped
to nodes ``0..n-1`` in ascending client id order (``--clients`` keeps the first ``n``).
Because lowband's windows repeat with one period for all nodes, the conversion repeats
each client's windows up to the longest ``finish_time`` and writes that as the period.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

from lowband.devices.processes import Windows, merge_windows

__all__ = ["AVAILABILITY_COLUMNS", "read_availability_trace", "write_availability_trace", "from_fedscale",
           "read_fedscale_json"]

AVAILABILITY_COLUMNS = ("node", "start_s", "end_s")


def read_availability_trace(path: str | Path, num_nodes: int, period_s: Optional[float] = None) -> Windows:
    """The :class:`~lowband.devices.processes.Windows` of a trace CSV (module docstring);
    raises ValueError naming the file, the line and what is wrong."""
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"availability trace {p}: no such file (a CSV with header node,start_s,end_s)")
    windows: dict[int, list[tuple[float, float]]] = {}
    with p.open(newline="") as f:
        reader = csv.DictReader(f)
        cols = reader.fieldnames or []
        if any(c not in cols for c in AVAILABILITY_COLUMNS):
            raise ValueError(f"availability trace {p}: the header must be node,start_s,end_s (got {', '.join(cols) or 'none'})")
        for line, row in enumerate(reader, start=2):
            try:
                node, s, e = int(row["node"]), float(row["start_s"]), float(row["end_s"])
            except (TypeError, ValueError):
                raise ValueError(f"availability trace {p}, line {line}: node must be an integer and start_s, end_s "
                                 f"numbers, got {dict(row)}") from None
            if not 0 <= node < num_nodes:
                raise ValueError(f"availability trace {p}, line {line}: node {node} does not exist "
                                 f"(nodes are 0..{num_nodes - 1})")
            if not (math.isfinite(s) and 0 <= s < e):
                raise ValueError(f"availability trace {p}, line {line}: need 0 <= start_s < end_s, got {s}, {e}")
            windows.setdefault(node, []).append((s, e))
    try:
        return Windows(windows, period_s)
    except ValueError as exc:
        raise ValueError(f"availability trace {p}: {exc}") from None


def write_availability_trace(path: str | Path, windows: Mapping[int, Sequence[tuple[float, float]]]) -> None:
    """Write on-windows per node in lowband's CSV format (rows sorted by node, then start)."""
    with Path(path).open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(AVAILABILITY_COLUMNS)
        for node in sorted(windows):
            for s, e in merge_windows(windows[node]):
                w.writerow([int(node), repr(float(s)), repr(float(e))])


def read_fedscale_json(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    try:
        data = json.loads(p.read_text())
    except FileNotFoundError:
        raise ValueError(f"FedScale trace {p}: no such file") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"FedScale trace {p}: not JSON ({exc}); convert FedScale's pickle with "
                         f"json.dump(pickle.load(f), g) first") from None
    if not isinstance(data, dict) or not data:
        raise ValueError(f"FedScale trace {p}: expected a non-empty object {{client_id: {{active, inactive, finish_time}}}}")
    return data


def from_fedscale(trace: Mapping[str, Any], clients: Optional[int] = None) -> tuple[dict[int, list[tuple[float, float]]], float]:
    """On-windows per node and their common period from a FedScale-style trace dict
    (module docstring). Raises ValueError naming the client and what is wrong."""
    ids = sorted(trace, key=lambda k: (int(k) if str(k).lstrip("-").isdigit() else math.inf, str(k)))
    if clients is not None:
        if clients < 1 or clients > len(ids):
            raise ValueError(f"clients must be in 1..{len(ids)} (the trace has {len(ids)} clients), got {clients}")
        ids = ids[:clients]
    per: list[tuple[list[tuple[float, float]], float]] = []
    for cid in ids:
        rec = trace[cid]
        try:
            act = [float(x) for x in rec["active"]]
            ina = [float(x) for x in rec["inactive"]]
            fin = float(rec["finish_time"])
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"FedScale trace: client {cid} needs lists 'active', 'inactive' and a number "
                             f"'finish_time'") from None
        if len(act) != len(ina):
            raise ValueError(f"FedScale trace: client {cid} has {len(act)} active and {len(ina)} inactive times; "
                             f"they pair up")
        if not (fin > 0 and math.isfinite(fin)):
            raise ValueError(f"FedScale trace: client {cid} has finish_time {fin!r}; need a number > 0")
        ws = [(max(0.0, a), min(b, fin)) for a, b in zip(act, ina) if min(b, fin) > max(0.0, a)]
        per.append((ws, fin))
    period = max(fin for _, fin in per)
    out: dict[int, list[tuple[float, float]]] = {}
    for node, (ws, fin) in enumerate(per):
        rep: list[tuple[float, float]] = []
        k = 0
        while k * fin < period:  # repeat the client's own cycle up to the common period
            rep.extend((min(s + k * fin, period), min(e + k * fin, period)) for s, e in ws)
            k += 1
        out[node] = merge_windows(rep)
    return out, period
