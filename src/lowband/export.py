"""Run-folder tables: the ledger file, and ``lowband export`` (CSV or Parquet).

Every run folder gets ``ledger.csv`` when the run finishes: one row per ledger record
(one per message and receiver; a broadcast is one row per receiver), with the columns
``round, src, dst, direction, kind, bytes, declared`` (``bytes``: encoded bytes that
crossed the link; ``declared``: bytes counted but never built, design rule 2). Its
``bytes`` column summed per direction equals the summary's ``bytes_up/down/peer``.

``lowband export RUN --format csv|parquet`` writes ``metrics`` and ``ledger`` (and
``timing``) tables of a finished run folder, or of a seeds folder in either layout
(:func:`lowband.report.find_runs`: every seed in ``RUN/seed-<s>/``, or a run in ``RUN``
plus ``RUN/seed-<s>/`` beside it): all seeds, with a ``seed`` column, plus ``aggregate``
(one row per round: mean, std and 95% CI of every metric over the seeds, as
``aggregate.csv`` of ``lowband run --seeds``). A run or seed without a ledger (no
ledger.csv, no checkpoint.pt: older runs) or timing.jsonl is exported with what it has, and
a warning line names it (:func:`export_run`). CSV needs nothing beyond the core dependencies; Parquet needs pyarrow
(``pip install 'lowband[analysis]'``). pandas is needed only for DataFrames
(:func:`require_pandas`).
"""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence

import numpy as np

from lowband.ledgerfile import LEDGER_COLUMNS, LEDGER_FILE, ledger_columns, ledger_csv_text  # noqa: F401 (re-exported)
from lowband.report import ReportError

FORMATS = ("csv", "parquet")


class ExportError(ReportError):
    """An export that cannot be made (one line: what and how to fix; the CLI exits with 2)."""


def require_pandas(feature: str = "DataFrames") -> Any:
    """Import pandas or raise one clear line saying how to get it."""
    try:
        import pandas as pd
    except ImportError:
        raise ImportError(f"{feature} need pandas, an optional dependency of lowband; install it with "
                          f"pip install 'lowband[analysis]' (or pip install pandas)") from None
    return pd


def require_pyarrow() -> Any:
    try:
        import pyarrow
        import pyarrow.parquet  # noqa: F401
    except ImportError:
        raise ExportError("--format parquet needs pyarrow, an optional dependency; install it with "
                          "pip install 'lowband[analysis]' (or pip install pyarrow), or use --format csv") from None
    return pyarrow


# --------------------------------------------------------------------------- the ledger file


def write_ledger(ledger: Any, path: Path) -> Path:
    """Write ``ledger`` as ``path`` (replaced atomically)."""
    from lowband.engine.runlog import atomic_write_text

    atomic_write_text(path, ledger_csv_text(ledger_columns(ledger)))
    return path


def read_ledger(path: Path) -> dict[str, np.ndarray]:
    """Columns of a ledger CSV written by :func:`write_ledger` (no pandas needed)."""
    cols: dict[str, list[Any]] = {k: [] for k in LEDGER_COLUMNS}
    with open(path, newline="") as f:
        reader = csv.reader(f)
        header = next(reader, None)
        if header is None or tuple(header) != LEDGER_COLUMNS:
            raise ExportError(f"{path}: not a lowband ledger (expected the header {','.join(LEDGER_COLUMNS)})")
        for row in reader:
            for k, v in zip(LEDGER_COLUMNS, row):
                cols[k].append(v)
    return _typed(cols)


def _typed(cols: dict[str, list[Any]]) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for k in LEDGER_COLUMNS:
        if k in ("direction", "kind"):
            out[k] = np.array(cols[k], dtype=object)
        else:
            out[k] = np.array(cols[k], dtype=np.int64)
    return out


def ledger_from_checkpoint(path: Path) -> Optional[dict[str, np.ndarray]]:
    """The ledger columns saved in a checkpoint (runs made before ledger.csv existed)."""
    import torch

    from lowband.comm.ledger import Ledger

    if not path.exists():
        return None
    ckpt = torch.load(path, map_location="cpu", weights_only=True)
    led = Ledger()
    if "ledger" in ckpt:
        led.load_state_dict(ckpt["ledger"])
    else:  # the records are in ledger.bin beside it (lowband.ledgerfile)
        from lowband.ledgerfile import LEDGER_LOG, read_ledger_log

        info = ckpt["ledger_file"]
        led.load_state_dict(read_ledger_log(path.parent / LEDGER_LOG, int(info["rows"]), info["kinds"], info.get("crc32")))
    return ledger_columns(led)


def run_ledger(run_dir: Path) -> Optional[dict[str, np.ndarray]]:
    """A run folder's ledger: ``ledger.csv``, else the one inside ``checkpoint.pt``."""
    p = Path(run_dir) / LEDGER_FILE
    if p.exists():
        return read_ledger(p)
    return ledger_from_checkpoint(Path(run_dir) / "checkpoint.pt")


# --------------------------------------------------------------------------- tables


def record_columns(records: Sequence[dict[str, Any]]) -> list[str]:
    """Union of the records' keys, in order of first appearance."""
    seen: dict[str, None] = {}
    for r in records:
        for k in r:
            seen.setdefault(k, None)
    return list(seen)


def _cell(v: Any) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    if isinstance(v, float):
        return repr(v)  # shortest round-trip representation
    return str(v)


def records_csv_text(records: Sequence[dict[str, Any]], columns: Optional[list[str]] = None) -> str:
    cols = columns or record_columns(records)
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(cols)
    for r in records:
        w.writerow([_cell(r.get(k)) for k in cols])
    return buf.getvalue()


def _write_table(rows: Sequence[dict[str, Any]] | dict[str, np.ndarray], path: Path, fmt: str) -> Path:
    if isinstance(rows, dict):  # columns
        cols = {k: (v.tolist() if isinstance(v, np.ndarray) else list(v)) for k, v in rows.items()}
        if fmt == "csv":
            n = len(next(iter(cols.values()), []))
            records = [{k: cols[k][i] for k in cols} for i in range(n)]
            path.write_text(records_csv_text(records, list(cols)))
        else:
            pa = require_pyarrow()
            pa.parquet.write_table(pa.table(cols), path)
        return path
    if fmt == "csv":
        path.write_text(records_csv_text(rows))
    else:
        pa = require_pyarrow()
        names = record_columns(rows)
        table = pa.table({k: [_none_nan(r.get(k)) for r in rows] for k in names})
        pa.parquet.write_table(table, path)
    return path


def _none_nan(v: Any) -> Any:
    return None if isinstance(v, float) and math.isnan(v) else v


def _with_seed(rows: Iterable[dict[str, Any]], seed: Any) -> list[dict[str, Any]]:
    return [{"seed": seed, **r} for r in rows]


def export_folders(run: str | Path) -> Optional[Any]:
    """What :func:`export_run` reads from ``run``: None for a single run folder (its
    tables as they are, no ``seed`` column; also a run still going), else the
    :class:`~lowband.report.RunFolders` of a seeds folder in either layout."""
    from lowband.aggregate import seed_runs
    from lowband.report import ReportError, find_runs

    root = Path(run)
    if (root / "metrics.jsonl").exists() and not seed_runs(root, finished=True):
        from lowband.engine.runlog import check_run

        check_run(root)  # every file as the run wrote it (lowband.engine.runfiles): a damage is one line
        return None
    try:
        folders = find_runs(root)
    except ReportError as exc:
        if "unfinished" in str(exc):
            raise ExportError(str(exc)) from None
        raise ExportError(f"{root}: no metrics.jsonl and no finished seed-*/ folders (not a lowband run folder)"
                          ) from None
    return None if folders.layout == "run" else folders


def aggregate_rows(dirs: Sequence[Path]) -> list[dict[str, Any]]:
    """One row per round over the runs in ``dirs``: ``round, n``, then
    ``<metric>.n/.mean/.std/.ci_low/.ci_high`` (as ``aggregate.csv`` of ``lowband run
    --seeds``, :func:`lowband.batch.aggregate_round_records`)."""
    from lowband.aggregate import aggregate_dirs, aggregate_round_records

    return aggregate_round_records(aggregate_dirs(dirs))


def missing_tables(run_dir: Path, has_ledger: bool, has_timing: bool) -> Optional[str]:
    """One line naming what a run folder lacks for the export, or None when it has it all:
    its ledger (no ledger.csv and no checkpoint.pt to read it from: a run from before
    ledger.csv was written) and its timing.jsonl."""
    lacks = []
    if not has_ledger:
        lacks.append(f"no {LEDGER_FILE} and no checkpoint.pt (a run from before {LEDGER_FILE} was written), so "
                     f"the export has no ledger rows for it")
    if not has_timing:
        lacks.append("no timing.jsonl, so the export has no timing rows for it")
    if not lacks:
        return None
    return (f"lowband export: {run_dir} has " + "; and ".join(lacks) + "; its metrics are exported "
            f"(re-run it into a new folder to record the missing tables)")


def export_run(run: str | Path, fmt: str = "csv", out: Optional[str | Path] = None) -> list[Path]:
    """Write metrics, ledger and timing tables of a finished run (or seeds) folder into
    ``out`` (default ``RUN/export``); returns the paths written. A seeds folder (either
    layout, :func:`export_folders`) gives every seed's rows with a ``seed`` column (the
    seed of each run's summary) and an ``aggregate`` table over the seeds.

    Missing files are treated as everywhere in the export (a run folder without a ledger
    gets no ledger table; an unfinished seed is left out and named): a run, or a seed,
    that lacks its ledger (no ledger.csv and no checkpoint.pt, e.g. a run from before
    ledger.csv was written) or its timing.jsonl is still exported with what it has (its
    metrics, and its rows in the aggregate), and one warning line per such folder
    (:func:`missing_tables`, on the ``lowband`` logger: stderr) names it and the tables
    that hold no rows for it, so an export that lacks a seed's ledger is never silent."""
    from lowband.console import log
    from lowband.engine.runlog import RunLog

    if fmt not in FORMATS:
        raise ExportError(f"--format {fmt!r}: choose one of {', '.join(FORMATS)}")
    if fmt == "parquet":
        require_pyarrow()
    root = Path(run)
    folders = export_folders(root)
    if folders is None:
        runs: list[tuple[Optional[int], Path]] = [(None, root)]
    else:
        runs = list(zip(folders.seeds, folders.dirs))
    metrics: list[dict[str, Any]] = []
    timing: list[dict[str, Any]] = []
    ledgers: list[dict[str, np.ndarray]] = []
    gaps: list[str] = []
    for seed, d in runs:
        m = RunLog.read_jsonl(d / "metrics.jsonl")
        t = RunLog.read_jsonl(d / "timing.jsonl")
        led = run_ledger(d)
        gap = missing_tables(d, led is not None, bool(t))
        if gap:
            gaps.append(gap)
        if seed is not None:
            m, t = _with_seed(m, seed), _with_seed(t, seed)
            if led is not None:
                led = {"seed": np.full(len(led["round"]), seed, dtype=np.int64), **led}
        metrics += m
        timing += t
        if led is not None:
            ledgers.append(led)
    for gap in gaps:  # every folder read without error: now say what the export lacks
        log.warning("%s", gap)
    dest = Path(out) if out else root / "export"
    dest.mkdir(parents=True, exist_ok=True)
    paths = [_write_table(metrics, dest / f"metrics.{fmt}", fmt)]
    if ledgers:
        cols = {k: np.concatenate([led[k] for led in ledgers]) for k in ledgers[0]}
        paths.append(_write_table(cols, dest / f"ledger.{fmt}", fmt))
    if timing:
        paths.append(_write_table(timing, dest / f"timing.{fmt}", fmt))
    if folders is not None:
        paths.append(_write_table(aggregate_rows(folders.dirs), dest / f"aggregate.{fmt}", fmt))
    return paths


def cmd_export(args: Any) -> int:
    """``lowband export RUN [--format csv|parquet] [--out DIR]``: says which layout it read."""
    folders = export_folders(args.run)
    paths = export_run(args.run, args.format, args.out)
    if folders is not None:
        print("read " + folders.describe())
    print("wrote " + ", ".join(str(p) for p in paths))
    return 0


__all__ = ["ExportError", "LEDGER_COLUMNS", "LEDGER_FILE", "aggregate_rows", "export_folders", "export_run", "ledger_columns", "read_ledger",
           "missing_tables", "require_pandas", "run_ledger", "write_ledger"]
