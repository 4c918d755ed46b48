"""Compare finished runs: a Markdown table and PNG curves (accuracy vs round and vs bytes)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

from lowband.engine.runlog import RunLog


class ReportError(ValueError):
    """A run folder that cannot be read (one line)."""


@dataclass
class RunRecord:
    path: Path
    summary: dict[str, Any]
    metrics: list[dict[str, Any]]

    @property
    def label(self) -> str:
        return str(self.summary.get("name") or self.path.name)


def load_run(path: str | Path) -> RunRecord:
    p = Path(path)
    log = RunLog(p)
    if not log.summary_path.exists():
        raise ReportError(f"{p}: no summary.json (not a finished lowband run folder); run it with `lowband run` first")
    try:
        summary = json.loads(log.summary_path.read_text())
    except json.JSONDecodeError as exc:
        raise ReportError(f"{log.summary_path}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
    return RunRecord(p, summary, log.metrics())


def fmt_bytes(n: Optional[float]) -> str:
    if n is None:
        return "-"
    n = float(n)
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{int(n)} B"


def fmt_acc(v: Optional[float]) -> str:
    return "-" if v is None else f"{100 * v:.2f}"


def markdown_table(runs: Sequence[RunRecord], metric: Optional[str] = None) -> str:
    """One row per run: final and best of the metric, rounds/bytes to target, traffic."""
    header = ("| run | algorithm | metric | final % | best % (round) | rounds to target | bytes to target "
              "| up | down | peer | declared |")
    lines = [header, "|" + "---|" * (header.count("|") - 1)]
    for run in runs:
        s = run.summary
        key = metric or s.get("main_metric", "")
        final = (s.get("final") or {}).get(key)
        best = (s.get("best") or {}).get(key) or {}
        rtt = s.get("rounds_to_target") if key == s.get("main_metric") else _rounds_to(run.metrics, key, s.get("target"))
        btt = s.get("bytes_to_target") if key == s.get("main_metric") else None
        declared = sum(int(s.get(f"declared_bytes_{d}", 0) or 0) for d in ("up", "down", "peer"))
        best_s = f"{fmt_acc(best.get('value'))} ({best.get('round')})" if best else "-"
        target_s = "-" if s.get("target") is None else (str(rtt) if rtt is not None else "not reached")
        lines.append(
            f"| {run.label} | {s.get('algorithm', '?')} | {key} | {fmt_acc(final)} | {best_s} | {target_s} | "
            f"{fmt_bytes(btt) if btt is not None else '-'} | {fmt_bytes(s.get('bytes_up'))} | "
            f"{fmt_bytes(s.get('bytes_down'))} | {fmt_bytes(s.get('bytes_peer'))} | "
            f"{fmt_bytes(declared) if declared else '-'} |"
        )
    return "\n".join(lines) + "\n"


def _rounds_to(metrics: list[dict[str, Any]], key: str, target: Optional[float]) -> Optional[int]:
    if target is None:
        return None
    for rec in metrics:
        if rec.get(key) is not None and rec[key] >= target:
            return int(rec["round"])
    return None


def plot_curves(runs: Sequence[RunRecord], out_dir: Path, metric: Optional[str] = None) -> list[Path]:
    """accuracy_vs_round.png and accuracy_vs_bytes.png in ``out_dir``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for xkey, fname, xlabel in (("round", "accuracy_vs_round.png", "round"),
                                ("bytes", "accuracy_vs_bytes.png", "cumulative bytes sent (encoded + declared)")):
        fig, ax = plt.subplots(figsize=(6.4, 4.2))
        for run in runs:
            key = metric or run.summary.get("main_metric", "")
            pts = [(r, m) for r, m in ((_x(rec, xkey), rec.get(key)) for rec in run.metrics) if m is not None and r is not None]
            if xkey == "bytes":
                pts = [(x, y) for x, y in pts if x > 0]
            if not pts:
                continue
            xs, ys = zip(*pts)
            ax.plot(xs, [100 * y for y in ys], marker="o" if len(xs) < 30 else None, ms=3,
                    label=f"{run.label} ({key})")
        if xkey == "bytes":
            ax.set_xscale("log")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("accuracy (%)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        fig.tight_layout()
        p = out_dir / fname
        fig.savefig(p, dpi=120)
        plt.close(fig)
        paths.append(p)
    return paths


def _x(rec: dict[str, Any], xkey: str) -> Optional[float]:
    if xkey == "round":
        return rec.get("round")
    return float(rec.get("bytes/total", 0) or 0) + float(rec.get("declared/total", 0) or 0)


def compare(run_dirs: Sequence[str | Path], out_dir: str | Path, metric: Optional[str] = None) -> tuple[str, list[Path]]:
    """Write ``compare.md`` and the two plots into ``out_dir``; return the table and paths."""
    runs = [load_run(p) for p in run_dirs]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    table = markdown_table(runs, metric)
    (out / "compare.md").write_text(table)
    return table, plot_curves(runs, out, metric)
