"""Statistics over the runs of one experiment: the seed folders of a batch, their mean,
std and 95% confidence interval per round and of the summary (``aggregate.json``,
``aggregate.csv``).

Written by :mod:`lowband.batch` after its runs, read by :mod:`lowband.report` and
:mod:`lowband.export`; it reads run folders and imports no runner, so the three stay
free of import circles.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence

SEED_PREFIX = "seed-"
AGGREGATE_JSON = "aggregate.json"
AGGREGATE_CSV = "aggregate.csv"
#: the statistics of a metric per round besides its count (:func:`aggregate`)
ROUND_STATS = ("mean", "std", "ci_low", "ci_high")


class BatchError(RuntimeError):
    """Some runs of a batch failed (one line naming them)."""


def value_text(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (list, dict)):
        return json.dumps(v, separators=(",", ":"))
    return str(v)


def _read_json(path: Path) -> Optional[dict[str, Any]]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def seed_dir(base: Path, seed: int) -> Path:
    return Path(base) / f"{SEED_PREFIX}{seed}"


def seed_runs(root: str | Path, *, finished: bool = False) -> list[Path]:
    """The ``seed-<s>/`` run folders under ``root`` (sorted by seed); with ``finished``,
    only those with a summary.json. Empty when ``root`` is not a seeds folder."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = []
    for p in root.iterdir():
        m = re.fullmatch(re.escape(SEED_PREFIX) + r"(\d+)", p.name)
        if m and p.is_dir() and ((p / "summary.json").exists() if finished else (p / "config.toml").exists()):
            found.append((int(m.group(1)), p))
    return [p for _, p in sorted(found)]


#: a metric whose last part is ``acc`` or ``acc_...`` / ``..._acc`` is an accuracy, a fraction in [0, 1]
_ACCURACY = re.compile(r"(^|_)acc(_|$)")


def metric_bounds(key: str) -> Optional[tuple[float, float]]:
    """The range a metric cannot leave: [0, 1] for an accuracy (``global/acc``,
    ``final/personal/acc_weighted``), None for an unbounded one (a loss, bytes, rounds)."""
    return (0.0, 1.0) if _ACCURACY.search(key.rsplit("/", 1)[-1]) else None


def stats(values: Iterable[Optional[float]], bounds: Optional[tuple[float, float]] = None) -> dict[str, Any]:
    """n, mean, std (ddof=1) and the 95% t confidence interval of the non-missing values
    (std and interval are None for fewer than two values).

    With ``bounds`` (a bounded metric, :func:`metric_bounds`), the interval is clipped to
    them and ``ci_clipped`` (present for a bounded metric only) says whether it was: with two
    seeds the t-interval's half-width is
    12.7 standard errors, and an accuracy's interval of -37% to 134% says nothing a clipped one
    does not, while it breaks the plots' axes."""
    vals = [float(v) for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    n = len(vals)
    if n == 0:
        return _with_clip({"n": 0, "mean": None, "std": None, "ci_low": None, "ci_high": None}, bounds, False)
    mean = math.fsum(vals) / n
    if n < 2:
        return _with_clip({"n": 1, "mean": mean, "std": None, "ci_low": None, "ci_high": None}, bounds, False)
    from scipy import stats as st

    std = math.sqrt(math.fsum((v - mean) ** 2 for v in vals) / (n - 1))
    half = float(st.t.ppf(0.975, n - 1)) * std / math.sqrt(n)
    lo, hi = mean - half, mean + half
    clipped = bounds is not None and (lo < bounds[0] or hi > bounds[1])
    if bounds is not None:
        lo, hi = max(lo, bounds[0]), min(hi, bounds[1])
    return _with_clip({"n": n, "mean": mean, "std": std, "ci_low": lo, "ci_high": hi}, bounds, clipped)


def _with_clip(s: dict[str, Any], bounds: Optional[tuple[float, float]], clipped: bool) -> dict[str, Any]:
    """``ci_clipped`` is part of a bounded metric's statistics only (unbounded ones keep their keys)."""
    return {**s, "ci_clipped": clipped} if bounds is not None else s


def _numeric(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def flat_summary(summary: dict[str, Any]) -> dict[str, Any]:
    """The summary's numbers as flat keys: ``final/<metric>``, ``best/<metric>``,
    ``rounds_to_target``, ``bytes_up``, ..."""
    out: dict[str, Any] = {}
    for k, v in summary.items():
        if k == "final" and isinstance(v, dict):
            out.update({f"final/{m}": x for m, x in v.items() if _numeric(x) or x is None})
        elif k == "best" and isinstance(v, dict):
            out.update({f"best/{m}": (x or {}).get("value") for m, x in v.items()})
        elif k in ("seed",):
            continue
        elif _numeric(v) or (v is None and k.endswith("_to_target")):
            out[k] = v
    return out


def aggregate(runs: Sequence[tuple[dict[str, Any], list[dict[str, Any]]]]) -> dict[str, Any]:
    """Mean/std/CI over runs (``(summary, metrics)`` pairs) per round (rounds all runs
    evaluated) and of the summary's numbers.

    Each round's row: ``n``, the runs with a record at that round (every run: a round some
    run did not evaluate is left out, not averaged over fewer runs), and per metric
    ``count`` (the values averaged: a null or missing value in a run's record is not
    counted), ``mean``, ``std``, ``ci_low``, ``ci_high`` over those values only. A metric's
    own count is what its statistics rest on; the row's ``n`` alone would overstate it
    where a run did not measure that metric at that round."""
    rounds = None
    for _, metrics in runs:
        rs = [int(r["round"]) for r in metrics]
        rounds = rs if rounds is None else [r for r in rounds if r in set(rs)]
    keys: dict[str, None] = {}
    for _, metrics in runs:
        for rec in metrics:
            for k, v in rec.items():
                if k != "round" and (_numeric(v) or v is None):
                    keys.setdefault(k, None)
    per_round = []
    for r in rounds or []:
        recs = [next(m for m in metrics if int(m["round"]) == r) for _, metrics in runs]
        row: dict[str, Any] = {"round": r, "n": len(recs)}
        for part in ("count", *ROUND_STATS):
            row[part] = {}
        for k in keys:
            s = stats((rec.get(k) for rec in recs), metric_bounds(k))
            row["count"][k] = s["n"]
            for part in ROUND_STATS:
                row[part][k] = s[part]
        per_round.append(row)
    flat = [flat_summary(s) for s, _ in runs]
    skeys: dict[str, None] = {}
    for f in flat:
        for k in f:
            skeys.setdefault(k, None)
    summary = {k: stats((f.get(k) for f in flat), metric_bounds(k)) for k in skeys}
    first = runs[0][0] if runs else {}
    return {"n": len(runs), "name": first.get("name"), "algorithm": first.get("algorithm"),
            "main_metric": first.get("main_metric"), "target": first.get("target"),
            "summary": summary, "rounds": per_round}


def rounds_mismatch(dirs: Sequence[Path], summaries: Sequence[dict[str, Any]]) -> Optional[str]:
    """None when every run completed the same number of rounds, else one line naming each
    run's rounds and the remedy. A run that finished more rounds than its config now asks
    counts as done (:func:`lowband.batch.run_state`), so one seeds folder can hold seeds of different
    lengths; a mean of their finals would mix rounds under one "mean over n seeds"."""
    done = [s.get("rounds_completed") for s in summaries]
    if len(set(done)) <= 1:
        return None
    most = max((int(r) for r in done if r is not None), default=0)
    return ("seed runs completed different numbers of rounds ("
            + ", ".join(f"{Path(d).name}: {r}" for d, r in zip(dirs, done))
            + f"), so their mean would mix finals of different rounds; run them all to the same rounds "
              f"(e.g. again with rounds={most}: the shorter ones resume) or leave the odd ones out")


def aggregate_dirs(dirs: Sequence[Path]) -> dict[str, Any]:
    """:func:`aggregate` of finished run folders; raises BatchError for an unfinished run or
    runs of different lengths (:func:`rounds_mismatch`)."""
    from lowband.engine.runlog import RunLog

    runs = []
    for d in dirs:
        s = _read_json(Path(d) / "summary.json")
        if s is None:
            raise BatchError(f"{d}: no summary.json (the run did not finish); run the batch again to finish it")
        runs.append((s, RunLog.read_jsonl(Path(d) / "metrics.jsonl")))
    odd = rounds_mismatch(dirs, [s for s, _ in runs])
    if odd:
        raise BatchError(f"{Path(dirs[0]).parent}: {odd}")
    agg = aggregate(runs)
    agg["seeds"] = [r[0].get("seed") for r in runs]
    agg["runs"] = [str(d) for d in dirs]
    return agg


def aggregate_round_records(agg: dict[str, Any]) -> list[dict[str, Any]]:
    """The rows of ``aggregate.csv`` (and of ``lowband export``'s aggregate table): per
    round ``round, n`` (runs with a record at that round), then per metric ``<metric>.n``
    (the values averaged), ``.mean``, ``.std``, ``.ci_low``, ``.ci_high``. An
    ``aggregate.json`` written before the per-metric counts existed gives an empty
    ``<metric>.n`` (unknown), never the run count in its place."""
    rows = []
    for row in agg["rounds"]:
        rec: dict[str, Any] = {"round": row["round"], "n": row["n"]}
        count = row.get("count") or {}
        for k in row["mean"]:
            rec[f"{k}.n"] = count.get(k)
            for part in ROUND_STATS:
                rec[f"{k}.{part}"] = row[part][k]
        rows.append(rec)
    return rows
