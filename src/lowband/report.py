"""Compare finished runs: a Markdown table and PNG curves (accuracy vs round and vs bytes).

A seeds folder (``seed-<s>/`` run folders, from ``lowband run --seeds``; or a run folder
with ``seed-<s>/`` folders beside its own run, as ``lowband reproduce`` lays out seeds)
counts as one run whose table cells are ``mean ± std`` over the seeds and whose curves are
the mean with a 95% confidence band. :func:`write_sweep_report` writes a sweep's table and plots.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

from lowband.engine.runlog import RunLog, rounds_to_target


class ReportError(ValueError):
    """A run folder that cannot be read (one line)."""


@dataclass
class RunRecord:
    path: Path
    summary: dict[str, Any]
    metrics: list[dict[str, Any]]
    #: the seeds' runs when this is a seeds folder (two or more seeds)
    seeds: list["RunRecord"] = field(default_factory=list)
    #: the folder tail that tells this run from others of the same name (:func:`distinct_labels`)
    tag: Optional[str] = None

    @property
    def label(self) -> str:
        name = str(self.summary.get("name") or self.path.name)
        name = f"{name} ({len(self.seeds)} seeds)" if self.seeds else name
        return f"{name} [{self.tag}]" if self.tag else name


def distinct_labels(runs: Sequence[RunRecord]) -> None:
    """Give runs that would share a label (two runs of one config, in different folders) a
    tag: the shortest tail of their folder paths that tells them apart, so the table's rows
    and the plots' legends name each run once."""
    labels = [r.label for r in runs]
    for lab in set(labels):
        same = [r for r, l in zip(runs, labels) if l == lab]
        if len(same) < 2:
            continue
        paths = [r.path.resolve() for r in same]
        for k in range(1, max(len(p.parts) for p in paths) + 1):
            tails = ["/".join(p.parts[-k:]) for p in paths]
            if len(set(tails)) == len(tails):
                break
        for r, t in zip(same, tails):
            r.tag = t


#: the folder layouts :func:`find_runs` reads, and how they are described
LAYOUTS = {
    "run": "a run folder",
    "seeds": "a seeds folder (every seed in seed-<s>/, as `lowband run --seeds` writes)",
    "run+seeds": "a run folder with seed folders beside its run (the config's seed in the folder itself, "
                 "seed s in seed-<s>/, as `lowband reproduce` writes)",
}


@dataclass
class RunFolders:
    """The finished runs a folder holds (:func:`find_runs`): which layout, which folders."""

    path: Path
    #: one of :data:`LAYOUTS`: ``"run"``, ``"seeds"`` or ``"run+seeds"``
    layout: str
    #: the finished run folders, sorted by seed (a seed found twice counts once)
    dirs: list[Path]
    #: each folder's seed (from its summary.json)
    seeds: list[Optional[int]]
    #: (folder, why) of the folders that were not read: unfinished, or a seed already found
    left_out: list[tuple[Path, str]] = field(default_factory=list)

    def describe(self) -> str:
        """One line: the layout, the seeds read and any folder left out."""
        seeds = ", ".join("?" if s is None else str(s) for s in self.seeds)
        text = f"{self.path}: {LAYOUTS[self.layout]}; {len(self.dirs)} run{'s' if len(self.dirs) != 1 else ''}"
        text += f" (seed {seeds})" if len(self.dirs) == 1 else f" (seeds {seeds})"
        if self.left_out:
            text += "; left out: " + "; ".join(f"{d} ({why})" for d, why in self.left_out)
        return text


def _summary_seed(d: Path) -> Optional[int]:
    from lowband.engine.runlog import check_run

    check_run(d)  # every file as the run wrote it (lowband.engine.runfiles): a damage is one line
    try:
        seed = json.loads((d / "summary.json").read_text()).get("seed")
    except json.JSONDecodeError as exc:
        raise ReportError(f"{d / 'summary.json'}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
    return None if seed is None else int(seed)


def find_runs(path: str | Path) -> RunFolders:
    """The finished runs of ``path``, in either seeds layout, for every reader of run folders
    (:func:`load_run`, ``lowband.load_run``, ``lowband export``):

    - ``"run"``: ``path`` holds a finished run (summary.json) and no finished ``seed-<s>/``;
    - ``"seeds"``: finished ``seed-<s>/`` folders and no finished run in ``path`` itself
      (``lowband run CONFIG --seeds``);
    - ``"run+seeds"``: both (``lowband reproduce``: the config's own seed in ``path``, seed
      ``s`` in ``path/seed-<s>/``).

    A seed found twice counts once (the folder's own run first); unfinished runs are left
    out (listed in ``left_out``). Raises ReportError when there is no finished run."""
    from lowband.aggregate import seed_runs

    p = Path(path)
    if any((p / n).exists() for n in ("config.toml", "manifest.json", "metrics.jsonl", "checkpoint.pt")):
        from lowband.engine.runlog import check_run

        check_run(p)  # a run's own files, deleted summary.json included, as the run wrote them
    own = (p / "summary.json").exists()
    found: list[tuple[Optional[int], Path]] = [(_summary_seed(p), p)] if own else []
    left_out: list[tuple[Path, str]] = []
    for d in seed_runs(p):
        if not (d / "summary.json").exists():
            left_out.append((d, "unfinished: no summary.json"))
            continue
        s = _summary_seed(d)
        first = next((f for seed, f in found if seed is not None and seed == s), None)
        if first is not None:
            left_out.append((d, f"repeats seed {s} of {first}"))
            continue
        found.append((s, d))
    if not found:
        unfinished = f" and its {len(left_out)} seed-*/ runs are unfinished" if left_out else ""
        raise ReportError(f"{p}: no summary.json{unfinished} (not a finished lowband run folder); run it with "
                          f"`lowband run` first")
    if not own and (p / "config.toml").exists():
        left_out.insert(0, (p, "unfinished: no summary.json"))
    layout = "run" if own and len(found) == 1 else "run+seeds" if own else "seeds"
    found.sort(key=lambda sf: (sf[0] is None, sf[0] if sf[0] is not None else 0))
    if len(found) > 1:  # one row / one aggregate over seeds needs seeds of one length
        from lowband.aggregate import rounds_mismatch

        odd = rounds_mismatch([d for _, d in found], [json.loads((d / "summary.json").read_text()) for _, d in found])
        if odd:
            raise ReportError(f"{p}: {odd}")
    return RunFolders(p, layout, [d for _, d in found], [s for s, _ in found], left_out)


def load_run(path: str | Path) -> RunRecord:
    """A finished run folder, or a seeds folder in either layout (:func:`find_runs`): its
    finished ``seed-*/`` runs, plus the folder's own run when it has one (the layout
    ``lowband reproduce`` uses: the config's seed in ``R``, seed ``s`` in ``R/seed-<s>/``).
    A seed found twice counts once."""
    folders = find_runs(path)
    runs = [_load_single(d) for d in folders.dirs]
    if len(runs) == 1:
        return runs[0]
    return RunRecord(folders.path, runs[0].summary, runs[0].metrics, seeds=runs)


def _load_single(p: Path) -> RunRecord:
    from lowband.engine.runlog import check_run

    check_run(p)
    log = RunLog(p)
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


def fmt_mean_std(mean: Optional[float], std: Optional[float], *, pct: bool = False, digits: int = 2) -> str:
    """``"81.23 ± 1.20"`` (``pct``: values are fractions shown in %); ``"-"`` without a mean,
    the mean alone without a std (one seed)."""
    if mean is None:
        return "-"
    k = 100.0 if pct else 1.0
    if std is None:
        return f"{k * mean:.{digits}f}"
    return f"{k * mean:.{digits}f} ± {k * std:.{digits}f}"


def mean_std_text(values: Sequence[Optional[float]], *, pct: bool = False, digits: int = 2) -> str:
    """``mean ± std`` of the non-missing ``values`` (for tables over seeds; lowband.reproduce
    can call it with one value per seed); ``"-"`` when none."""
    from lowband.aggregate import stats

    s = stats(values)
    return fmt_mean_std(s["mean"], s["std"], pct=pct, digits=digits)


def _bytes_mean_std(values: Sequence[Optional[float]]) -> str:
    from lowband.aggregate import stats

    s = stats(values)
    if s["mean"] is None:
        return "-"
    if not s["std"]:
        return fmt_bytes(s["mean"])
    return f"{fmt_bytes(s['mean'])} ± {fmt_bytes(s['std'])}"


def _pct_heading(keys: Sequence[str]) -> str:
    """The unit of a final/best column whose rows show ``keys``: accuracies in %, other
    metrics (a loss) as they are."""
    acc = ["acc" in k for k in keys]
    return " %" if all(acc) else " (accuracies in %)" if any(acc) else ""


def markdown_table(runs: Sequence[RunRecord], metric: Optional[str] = None) -> str:
    """One row per run: final and best of the metric, rounds/bytes to target, traffic.
    Accuracies are in %, other metrics (a loss) as they are, in single and seeds rows alike."""
    unit = _pct_heading([metric or str(r.summary.get("main_metric", "")) for r in runs])
    header = (f"| run | algorithm | metric | final{unit} | best{unit} (round) | rounds to target | bytes to target "
              "| up | down | peer | declared |")
    lines = [header, "|" + "---|" * (header.count("|") - 1)]
    for run in runs:
        if run.seeds:
            lines.append(_group_row(run, metric))
            continue
        s = run.summary
        key = metric or s.get("main_metric", "")
        final = (s.get("final") or {}).get(key)
        best = (s.get("best") or {}).get(key) or {}
        rtt = s.get("rounds_to_target") if key == s.get("main_metric") else _rounds_to(run.metrics, key, s.get("target"))
        btt = s.get("bytes_to_target") if key == s.get("main_metric") else None
        declared = sum(int(s.get(f"declared_bytes_{d}", 0) or 0) for d in ("up", "down", "peer"))
        pct = "acc" in key
        best_s = f"{fmt_mean_std(best.get('value'), None, pct=pct)} ({best.get('round')})" if best else "-"
        target_s = "-" if s.get("target") is None else (str(rtt) if rtt is not None else "not reached")
        lines.append(
            f"| {run.label} | {s.get('algorithm', '?')} | {key} | {fmt_mean_std(final, None, pct=pct)} | {best_s} | "
            f"{target_s} | "
            f"{fmt_bytes(btt) if btt is not None else '-'} | {fmt_bytes(s.get('bytes_up'))} | "
            f"{fmt_bytes(s.get('bytes_down'))} | {fmt_bytes(s.get('bytes_peer'))} | "
            f"{fmt_bytes(declared) if declared else '-'} |"
        )
    return "\n".join(lines) + "\n"


def _group_row(run: RunRecord, metric: Optional[str]) -> str:
    """A seeds folder's table row: mean ± std over the seeds."""
    ss = [r.summary for r in run.seeds]
    s = ss[0]
    key = metric or s.get("main_metric", "")
    pct = "acc" in key
    final = mean_std_text([(x.get("final") or {}).get(key) for x in ss], pct=pct)
    best = mean_std_text([((x.get("best") or {}).get(key) or {}).get("value") for x in ss], pct=pct)
    if s.get("target") is None:
        rtt_s, btt_s = "-", "-"
    else:
        main = key == s.get("main_metric")
        rtts = [x.get("rounds_to_target") if main else _rounds_to(r.metrics, key, x.get("target"))
                for x, r in zip(ss, run.seeds)]
        reached = [v for v in rtts if v is not None]
        rtt_s = (mean_std_text(reached, digits=1) if reached else "not reached") + f" ({len(reached)}/{len(ss)})"
        btt_s = _bytes_mean_std([x.get("bytes_to_target") for x in ss]) if main else "-"
    declared = [sum(int(x.get(f"declared_bytes_{d}", 0) or 0) for d in ("up", "down", "peer")) for x in ss]
    return (f"| {run.label} | {s.get('algorithm', '?')} | {key} | {final} | {best} | {rtt_s} | {btt_s} | "
            + " | ".join(_bytes_mean_std([x.get(f"bytes_{d}") for x in ss]) for d in ("up", "down", "peer"))
            + f" | {_bytes_mean_std(declared) if any(declared) else '-'} |")


def _rounds_to(metrics: list[dict[str, Any]], key: str, target: Optional[float]) -> Optional[int]:
    hit = rounds_to_target(metrics, key, target)
    return None if hit is None else int(hit["round"])


def plot_curves(runs: Sequence[RunRecord], out_dir: Path, metric: Optional[str] = None) -> list[Path]:
    """accuracy_vs_round.png and accuracy_vs_bytes.png in ``out_dir``, and accuracy_vs_time.png
    (against cumulative simulated link time, ``time/sim_s``) when a run has ``[links]``.
    Accuracies are drawn in %, another metric (a loss) as it is."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    panels = [("round", "accuracy_vs_round.png", "round"),
              ("bytes", "accuracy_vs_bytes.png", "cumulative bytes sent (encoded + declared)")]
    if any("time/sim_s" in rec for run in runs for r in (run.seeds or [run]) for rec in r.metrics):
        panels.append(("time/sim_s", "accuracy_vs_time.png", "cumulative simulated link time (s, [links])"))
    for xkey, fname, xlabel in panels:
        fig, ax = plt.subplots(figsize=(6.4, 4.2))
        for run in runs:
            key = metric or run.summary.get("main_metric", "")
            if run.seeds:
                band = mean_band([r.metrics for r in run.seeds], key, xkey)
                if band:
                    plot_band(ax, *band, label=f"{run.label} ({key})", scale=100 if "acc" in key else 1,
                              logx_positive=xkey != "round")
                continue
            pts = [(r, m) for r, m in ((_x(rec, xkey), rec.get(key)) for rec in run.metrics) if m is not None and r is not None]
            if xkey != "round":  # log axes: round 0 (nothing sent, no time) has no place
                pts = [(x, y) for x, y in pts if x > 0]
            if not pts:
                continue
            xs, ys = zip(*pts)
            ax.plot(xs, [(100 if "acc" in key else 1) * y for y in ys], marker="o" if len(xs) < 30 else None, ms=3,
                    label=f"{run.label} ({key})")
        if xkey != "round":
            ax.set_xscale("log")
        ax.set_xlabel(xlabel)
        keys = list(dict.fromkeys(metric or str(r.summary.get("main_metric", "")) for r in runs))
        ax.set_ylabel("accuracy (%)" if all("acc" in k for k in keys) else  # a loss as it is, not x100
                      ", ".join(keys) + (" (accuracies in %)" if any("acc" in k for k in keys) else ""))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        fig.tight_layout()
        p = out_dir / fname
        fig.savefig(p, dpi=120)
        plt.close(fig)
        paths.append(p)
    return paths


def mean_band(runs_metrics: Sequence[list[dict[str, Any]]], key: str, xkey: str = "round"
              ) -> Optional[tuple[list[float], list[float], list[float], list[float]]]:
    """(x, mean, ci_low, ci_high) over runs at the rounds every run evaluated; x is the round
    or the mean cumulative bytes (``xkey="bytes"``: encoded + declared; or any metric key). The
    band of an accuracy is clipped to [0, 1] (:func:`lowband.aggregate.stats`)."""
    from lowband.aggregate import metric_bounds, stats

    by_round = [{int(r["round"]): r for r in m} for m in runs_metrics]
    rounds = sorted(set.intersection(*(set(b) for b in by_round))) if by_round else []
    xs, mean, lo, hi = [], [], [], []
    for r in rounds:
        recs = [b[r] for b in by_round]
        y = stats((rec.get(key) for rec in recs), metric_bounds(key))
        if y["mean"] is None:
            continue
        xv = stats(_x(rec, xkey) if xkey in ("round", "bytes") else rec.get(xkey) for rec in recs)["mean"]
        if xv is None:
            continue
        xs.append(xv)
        mean.append(y["mean"])
        lo.append(y["ci_low"] if y["ci_low"] is not None else y["mean"])
        hi.append(y["ci_high"] if y["ci_high"] is not None else y["mean"])
    return (xs, mean, lo, hi) if xs else None


def plot_band(ax: Any, xs: Sequence[float], mean: Sequence[float], lo: Sequence[float], hi: Sequence[float], *,
              label: str, scale: float = 1.0, logx_positive: bool = False) -> None:
    """A mean curve with its shaded 95% confidence band on matplotlib axes ``ax``."""
    pts = [(x, m, a, b) for x, m, a, b in zip(xs, mean, lo, hi) if not (logx_positive and x <= 0)]
    if not pts:
        return
    x, m, a, b = (list(t) for t in zip(*pts))
    (line,) = ax.plot(x, [scale * v for v in m], marker="o" if len(x) < 30 else None, ms=3, label=label)
    ax.fill_between(x, [scale * v for v in a], [scale * v for v in b], color=line.get_color(), alpha=0.2, lw=0)


def _x(rec: dict[str, Any], xkey: str) -> Optional[float]:
    if xkey == "round":
        return rec.get("round")
    if xkey != "bytes":  # a metric, e.g. time/sim_s (runs without [links] have none)
        v = rec.get(xkey)
        return None if v is None else float(v)
    return float(rec.get("bytes/total", 0) or 0) + float(rec.get("declared/total", 0) or 0)


def compare(run_dirs: Sequence[str | Path], out_dir: str | Path, metric: Optional[str] = None) -> tuple[str, list[Path]]:
    """Write ``compare.md`` and the two plots into ``out_dir``; return the table and paths."""
    runs = [load_run(p) for p in run_dirs]
    distinct_labels(runs)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    table = markdown_table(runs, metric)
    (out / "compare.md").write_text(table)
    return table, plot_curves(runs, out, metric)


# --------------------------------------------------------------------------- sweeps


def sweep_rows(cells: Sequence[Any]) -> list[dict[str, Any]]:
    """One row per sweep cell (see :func:`lowband.batch.run_sweep`): the swept values, then
    the main metric's final value over seeds (mean, std, 95% CI), best, rounds and bytes to
    target and the traffic (means)."""
    from lowband.aggregate import flat_summary, metric_bounds, stats, value_text

    rows = []
    for c in cells:
        sums = [json.loads((d / "summary.json").read_text()) for d in c.run_dirs()]
        flat = [flat_summary(x) for x in sums]
        main = sums[0].get("main_metric")
        row: dict[str, Any] = {k: value_text(v) for k, v in c.params.items()}
        fin = stats((f.get(f"final/{main}") for f in flat), metric_bounds(f"final/{main}"))
        best = stats(f.get(f"best/{main}") for f in flat)
        rtt = stats(f.get("rounds_to_target") for f in flat)
        row.update({"metric": main, "n": len(sums), "final": fin["mean"], "final_std": fin["std"],
                    "final_ci_low": fin["ci_low"], "final_ci_high": fin["ci_high"],
                    "final_ci_clipped": fin.get("ci_clipped", False), "best": best["mean"],
                    "best_std": best["std"], "target": sums[0].get("target"),
                    "rounds_to_target": rtt["mean"], "reached": rtt["n"],
                    "bytes_to_target": stats(f.get("bytes_to_target") for f in flat)["mean"]})
        for d in ("up", "down", "peer"):
            row[f"bytes_{d}"] = stats(f.get(f"bytes_{d}") for f in flat)["mean"]
        row["declared_bytes"] = stats(sum(f.get(f"declared_bytes_{d}") or 0 for d in ("up", "down", "peer"))
                                      for f in flat)["mean"]
        eps = [x.get("dp/epsilon", x.get("dp/local_epsilon")) for x in sums]
        if any(e is not None for e in eps):  # a [dp] run: the epsilon it spent beside its bytes
            row["epsilon"] = stats(eps)["mean"]
        if any(x.get("sim_time_s") is not None for x in sums):  # [links] or the event clock: time beside bytes
            row["sim_time_s"] = stats(x.get("sim_time_s") for x in sums)["mean"]
            row["time_to_target_s"] = stats(x.get("time_to_target_s") for x in sums)["mean"]
        row["dir"] = c.dir.name
        rows.append(row)
    if any("time_to_target_s" in r for r in rows):  # ranked by what reaching the target cost (1: cheapest)
        for key, cost in (("rank_bytes", "bytes_to_target"), ("rank_time", "time_to_target_s")):
            got = sorted(r[cost] for r in rows if r.get(cost) is not None)
            for r in rows:
                r[key] = None if r.get(cost) is None else got.index(r[cost]) + 1
    return rows


def sweep_markdown(rows: Sequence[dict[str, Any]], keys: Sequence[str]) -> str:
    multi = any(r["n"] > 1 for r in rows)
    unit = _pct_heading([str(r["metric"]) for r in rows])
    head = [*keys, "metric", f"final{unit}" + (" (mean ± std)" if multi else ""), "95% CI" if multi else None,
            f"best{unit}", "rounds to target", "bytes to target", "up", "down", "peer", "n"]
    private = any("epsilon" in r for r in rows)
    if private:
        head.insert(-1, "epsilon")
    timed = any("time_to_target_s" in r for r in rows)
    if timed:
        head[-1:-1] = ["sim time", "time to target", "rank (bytes to target)", "rank (time to target)"]
    head = [h for h in head if h is not None]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        pct = "acc" in str(r["metric"])
        ci = ("-" if r["final_ci_low"] is None else
              f"{fmt_mean_std(r['final_ci_low'], None, pct=pct)} - {fmt_mean_std(r['final_ci_high'], None, pct=pct)}")
        if r["target"] is None:
            rtt = "-"
        elif r["reached"]:
            rtt = f"{r['rounds_to_target']:.1f}" + (f" ({r['reached']}/{r['n']})" if r["n"] > 1 else "")
        else:
            rtt = "not reached"
        cells = [*(str(r[k]) for k in keys), str(r["metric"]), fmt_mean_std(r["final"], r["final_std"], pct=pct),
                 ci if multi else None, fmt_mean_std(r["best"], r["best_std"], pct=pct), rtt,
                 fmt_bytes(r["bytes_to_target"]), fmt_bytes(r["bytes_up"]), fmt_bytes(r["bytes_down"]),
                 fmt_bytes(r["bytes_peer"]), str(r["n"])]
        if private:
            cells.insert(-1, "-" if r.get("epsilon") is None else f"{r['epsilon']:.3g}")
        if timed:
            from lowband.comm.links import format_seconds

            cells[-1:-1] = [*("-" if r.get(k) is None else format_seconds(r[k]) for k in ("sim_time_s", "time_to_target_s")),
                            *("-" if r.get(k) is None else str(r[k]) for k in ("rank_bytes", "rank_time"))]
        lines.append("| " + " | ".join(c for c in cells if c is not None) + " |")
    if multi and any(r.get("final_ci_clipped") for r in rows):
        lines.append("")
        lines.append("95% CI: Student t-interval, clipped to the accuracy's range [0, 100%] where it overflows it.")
    return "\n".join(lines) + "\n"


def write_sweep_report(out: Path, cells: Sequence[Any]) -> tuple[str, list[Path]]:
    """``sweep.md``, ``sweep.csv``, ``sweep_curves.png`` (main metric vs cumulative bytes, one
    curve per cell, 95% band over seeds) and ``sweep_final.png`` (final main metric per cell)."""
    from lowband.engine.runlog import RunLog, atomic_write_text
    from lowband.export import records_csv_text

    keys = list(cells[0].params) if cells else []
    rows = sweep_rows(cells)
    md = sweep_markdown(rows, keys)
    atomic_write_text(out / "sweep.md", md)
    atomic_write_text(out / "sweep.csv", records_csv_text(rows))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metric = str(rows[0]["metric"]) if rows else ""
    scale, unit = (100.0, " (%)") if "acc" in metric else (1.0, "")
    fig, ax = plt.subplots(figsize=(7.0, 4.4))
    for c, r in zip(cells, rows):
        band = mean_band([RunLog.read_jsonl(d / "metrics.jsonl") for d in c.run_dirs()], r["metric"], "bytes")
        if band:
            plot_band(ax, *band, label=c.label, scale=scale, logx_positive=True)
    ax.set_xscale("log")
    ax.set_xlabel("cumulative bytes sent (encoded + declared)")
    ax.set_ylabel(metric + unit)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    curves = out / "sweep_curves.png"
    fig.savefig(curves, dpi=120)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7.0, 4.4))
    first = keys[0] if keys else ""
    xcats = list(dict.fromkeys(r[first] for r in rows))
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault(", ".join(f"{k}={r[k]}" for k in keys[1:]), []).append(r)
    for name, rs in groups.items():
        xs = [xcats.index(r[first]) for r in rs if r["final"] is not None]
        ys = [scale * r["final"] for r in rs if r["final"] is not None]
        err = [[scale * (r["final"] - r["final_ci_low"]) if r["final_ci_low"] is not None else 0 for r in rs
                if r["final"] is not None],
               [scale * (r["final_ci_high"] - r["final"]) if r["final_ci_high"] is not None else 0 for r in rs
                if r["final"] is not None]]
        numeric = all(isinstance(c.params.get(first), (int, float)) for c in cells)
        ax.errorbar(xs, ys, yerr=err, marker="o", capsize=3, ls="-" if numeric else "none", label=name or None)
    ax.set_xticks(range(len(xcats)), xcats)
    ax.set_xlabel(first)
    ax.set_ylabel(f"final {metric}{unit}" + (" with 95% CI" if any(r["n"] > 1 for r in rows) else ""))
    ax.grid(alpha=0.3)
    if len(groups) > 1:
        ax.legend(fontsize=7)
    fig.tight_layout()
    final = out / "sweep_final.png"
    fig.savefig(final, dpi=120)
    plt.close(fig)
    return md, [curves, final]
