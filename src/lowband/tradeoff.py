"""``lowband frontier``: methods x codecs (x seeds) on one federation, and the
accuracy-vs-bytes trade-off (issue 17 part 4).

Each cell is the base config with ``algorithm.name = <method>`` (plus the method's own
options, ``fedavg(server_opt=adam)``) and the codec on the uplink
(``comm.by_direction.up``). Where the codec is lossy (anything but ``fp32``) and the method
has an ``upload`` knob, the cell sends deltas (``algorithm.upload = "delta"``): sparsifying
whole weights zeroes most of them (lowband.engine.checks). The base config's algorithm
options go to every method that has them (``lr``, ``batch_size``...) and are dropped for the
others. A cell that does not validate (an option its method lacks, a protocol it cannot
serve, a public set it needs) is *skipped* with the one-line reason; the others run.

The runs go through the sweep/seeds runner (:mod:`lowband.batch`): resumable cells (a
second invocation redoes nothing), a process pool, one progress bar. Then, in the out folder:

- ``frontier.csv``: one row per cell: method, codec, status (``ok`` / ``skipped`` /
  ``refused`` (a ``[dp]``/``[secagg]`` setting the cell cannot serve, or over
  ``dp.target_epsilon``) / ``failed``) and reason, the epsilon spent (with ``[dp]``), seeds, the final main metric (mean, std), cumulative uplink and
  total bytes, rounds- and bytes-to-target, simulated time and time-to-target (with a
  link), and whether the cell is Pareto-optimal by bytes and by time;
- ``frontier.md``: the same as a Markdown table, Pareto-optimal cells marked ``*``;
- ``frontier.png``: the main metric against cumulative bytes per cell (log x), the Pareto
  front marked; a second panel against simulated time when a link is given.

Pareto-optimal (:func:`pareto_mask`): no other cell reaches at least its accuracy with
fewer bytes (or the same bytes and a higher accuracy); a main metric where lower is better
(a loss) is minimised instead (:func:`higher_is_better`). Bytes are encoded plus declared
(a declared payload is counted, never built, and the link model times it too).

(The module is ``tradeoff``, not ``frontier``, so that ``lowband.frontier`` stays the Python
API's function, :func:`lowband.api.frontier`.)
"""

from __future__ import annotations

import copy
import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

from lowband.batch import (BatchError, Cell, Job, cell_dirname, parse_seeds, raw_config, run_jobs, seed_jobs,
                           split_values, stats, write_aggregate)
from lowband.config.schema import ConfigError
from lowband.config.loading import parse_override
from lowband.config.resolve import validate
from lowband.metricdir import higher_is_better

FILES = ("frontier.csv", "frontier.md", "frontier.png")


# --------------------------------------------------------------------------- parsing


def parse_methods(text: str) -> list[tuple[str, dict[str, Any]]]:
    """``"fedavg,fedavg(server_opt=adam),kta"`` -> ``[(label, algorithm options), ...]``.
    Unknown method names are an error; an option a method lacks makes its cells skipped."""
    from lowband.algorithms import ALGORITHMS

    out: list[tuple[str, dict[str, Any]]] = []
    for item in split_values(text or ""):
        name, paren, rest = item.partition("(")
        name = name.strip()
        if not name:
            raise ConfigError(f"--methods {text!r}: an empty method; write e.g. fedavg,fedcspack")
        if name not in ALGORITHMS:
            raise ConfigError(f"--methods: unknown method {name!r}; available: {', '.join(sorted(ALGORITHMS))}")
        opts: dict[str, Any] = {}
        if paren:
            if not rest.endswith(")"):
                raise ConfigError(f"--methods: {item!r} lacks its closing ')'; write e.g. fedavg(server_opt=adam)")
            for kv in split_values(rest[:-1]):
                if "=" not in kv:
                    raise ConfigError(f"--methods: {item!r}: options are key=value, e.g. fedavg(server_opt=adam)")
                key, val = kv.split("=", 1)
                opts[key.strip()] = parse_override(f"algorithm.{key.strip()}={val.strip()}")[1]
        label = name + (f"({','.join(f'{k}={v}' for k, v in opts.items())})" if opts else "")
        if label in (m for m, _ in out):
            raise ConfigError(f"--methods: {label!r} is given twice")
        out.append((label, {"name": name, **opts}))
    return out


def parse_codecs(text: str) -> list[str]:
    """``'fp32,ef(topk(0.01)),qsgd(4)'`` -> the codec specs (each parsed once, so a bad one
    is a one-line error before anything runs)."""
    from lowband.comm.codecs import parse_codec

    codecs = split_values(text or "")
    for c in codecs:
        try:
            parse_codec(c)
        except ValueError as exc:
            raise ConfigError(f"--codecs {c!r}: {str(exc).splitlines()[0]}") from None
    if len(set(codecs)) != len(codecs):
        raise ConfigError(f"--codecs {text!r}: a codec is repeated")
    return codecs


def is_lossy(spec: str) -> bool:
    """Whether a codec spec changes what it carries (anything but fp32)."""
    from lowband.engine.checks import codec_terms

    return any(t != "fp32" for t in codec_terms(spec))


# --------------------------------------------------------------------------- Pareto


def pareto_mask(points: Sequence[tuple[Optional[float], Optional[float]]], *, maximise: bool = True) -> list[bool]:
    """``points``: (accuracy, cost) per cell (None: not measured). A cell is Pareto-optimal
    when no other cell has accuracy >= its accuracy and cost <= its cost with one of the two
    strictly better. Cells with a missing value are never optimal. ``maximise=False``: the
    first value is a loss, lower is better (its sign is flipped)."""
    if not maximise:
        points = [(None if a is None else -a, c) for a, c in points]
    ok = [a is not None and c is not None and not (math.isnan(a) or math.isnan(c)) for a, c in points]
    out = []
    for i, (a, c) in enumerate(points):
        if not ok[i]:
            out.append(False)
            continue
        dominated = any(ok[j] and j != i and b >= a and d <= c and (b > a or d < c)  # type: ignore[operator]
                        for j, (b, d) in enumerate(points))
        out.append(not dominated)
    return out


# --------------------------------------------------------------------------- cells


@dataclass
class FrontierCell:
    """One (method, codec) cell: its sweep cell when it runs, or why it was skipped."""

    method: str
    codec: str
    cell: Optional[Cell] = None
    reason: str = ""
    notes: list[str] = field(default_factory=list)
    status: str = "ok"  # ok | skipped | refused | failed


def cell_raw(base: dict[str, Any], method: dict[str, Any], codec: str) -> tuple[dict[str, Any], list[str]]:
    """The base config with the method and the uplink codec (see the module docstring)."""
    from lowband.algorithms import ALGORITHMS

    r = copy.deepcopy(base)
    fields = ALGORITHMS[method["name"]].Hyperparams.model_fields
    alg = {k: v for k, v in (r.get("algorithm") or {}).items() if k != "name" and k in fields}
    alg.update({k: v for k, v in method.items() if k != "name"})
    notes = []
    if is_lossy(codec) and "upload" in fields and "upload" not in method:
        alg["upload"] = "delta"
        notes.append("upload=delta")
    r["algorithm"] = {"name": method["name"], **alg}
    comm = r.setdefault("comm", {})
    comm["by_direction"] = {**(comm.get("by_direction") or {}), "up": codec}
    return r, notes


def _not_run(exc: ConfigError) -> str:
    """``refused`` for a privacy setting the cell's method or codec cannot serve (``[dp]``,
    ``[secagg]``: lowband.privacy.config.PrivacyRefused), else ``skipped``."""
    from lowband.privacy.config import PrivacyRefused

    return "refused" if isinstance(exc, PrivacyRefused) else "skipped"


def precheck_privacy(exp: Any) -> None:
    """A cell over ``dp.target_epsilon`` refused before it runs: central DP's schedule planned
    from the config (population ``data.num_clients``, the star's cohort), as the run plans it.
    Distributed DP's schedule needs the model's size and is planned by the run itself."""
    dp = getattr(exp, "dp", None)
    if dp is None or dp.mechanism != "central" or dp.target_epsilon is None:
        return
    from lowband.privacy.build import plan_central
    from lowband.privacy.config import run_sampling

    n, t = exp.data.num_clients, exp.topology
    cohort = {"count": t.count or 0, "fraction": max(1, int(round(t.fraction * n)))}.get(t.sampling, n)
    plan_central(dp, n, min(max(cohort, 1), n), run_sampling(exp), exp.rounds)


def frontier_cells(base: dict[str, Any], methods: Sequence[tuple[str, dict[str, Any]]], codecs: Sequence[str],
                   out: Path, seeds: Optional[Sequence[int]]) -> list[FrontierCell]:
    """Every (method, codec) cell, validated: runnable ones carry their jobs."""
    from lowband import plugins

    cells: list[FrontierCell] = []
    index = 0
    base_name = base.get("name", "experiment")
    for label, method in methods:
        for codec in codecs:
            fc = FrontierCell(label, codec)
            raw, fc.notes = cell_raw(base, method, codec)
            params = {"method": label, "codec": codec}
            raw["name"] = f"{base_name}[{label}, {codec}]"
            try:
                precheck_privacy(validate(raw))
            except ConfigError as exc:
                fc.status, fc.reason = _not_run(exc), str(exc).splitlines()[0]
                cells.append(fc)
                continue
            d = out / cell_dirname(params)
            c = Cell(params, d, raw, list(seeds) if seeds else None)
            if seeds:
                c.jobs = seed_jobs(raw, seeds, d, f"{label} x {codec}", start=index)
            else:
                r = copy.deepcopy(raw)
                r["out_dir"] = str(d)
                c.jobs = [Job(index, r, f"{label} x {codec}", tuple(plugins.LOADED))]
            index += len(c.jobs)
            fc.cell = c
            cells.append(fc)
    return cells


# --------------------------------------------------------------------------- rows


def _curve(run_dirs: Sequence[Path], main: str, x_key: str) -> tuple[list[float], list[float]]:
    """Mean over seeds of (x, main metric) per evaluated round that every seed has; ``x_key``
    ``"bytes"`` is cumulative encoded + declared bytes (as ``bytes_total``)."""
    from lowband.engine.runlog import RunLog
    from lowband.report import _x

    per = []
    for d in run_dirs:
        per.append({int(r["round"]): r for r in RunLog.read_jsonl(Path(d) / "metrics.jsonl")
                    if r.get(main) is not None and _x(r, x_key) is not None})
    rounds = sorted(set.intersection(*(set(p) for p in per))) if per else []
    xs = [math.fsum(float(_x(p[r], x_key)) for p in per) / len(per) for r in rounds]  # type: ignore[arg-type]
    ys = [math.fsum(float(p[r][main]) for p in per) / len(per) for r in rounds]
    return xs, ys


def _with_declared(encoded: Optional[float], declared: Optional[float]) -> Optional[float]:
    """Encoded plus declared bytes (None when the encoded count is: e.g. a target not reached)."""
    return None if encoded is None else float(encoded) + float(declared or 0)


def frontier_rows(cells: Sequence[FrontierCell], seeds: Optional[Sequence[int]]) -> list[dict[str, Any]]:
    """One row per cell (skipped and failed ones too), with the Pareto marks. Bytes are
    encoded plus declared (``bytes_total``, ``bytes_to_target``), as retime.csv and the
    link model count them; ``bytes_up`` too."""
    from lowband.batch import flat_summary

    rows = []
    for fc in cells:
        row: dict[str, Any] = {"method": fc.method, "codec": fc.codec, "status": fc.status,
                               "reason": fc.reason, "notes": ";".join(fc.notes),
                               "seeds": ";".join(str(s) for s in seeds) if seeds else ""}
        if fc.status == "ok" and fc.cell is not None:
            sums = [json.loads((d / "summary.json").read_text()) for d in fc.cell.run_dirs()]
            flat = [flat_summary(s) for s in sums]
            main = sums[0].get("main_metric")
            fin = stats(f.get(f"final/{main}") for f in flat)
            rtt = stats(f.get("rounds_to_target") for f in flat)
            ttt = stats(f.get("time_to_target_s") for f in flat)
            row.update({
                "metric": main, "n": len(sums), "final": fin["mean"], "final_std": fin["std"],
                "bytes_up": stats(_with_declared(f.get("bytes_up"), f.get("declared_bytes_up"))
                                  for f in flat)["mean"],
                "bytes_total": stats(sum((f.get(f"bytes_{d}") or 0) + (f.get(f"declared_bytes_{d}") or 0)
                                         for d in ("up", "down", "peer")) for f in flat)["mean"],
                "target": sums[0].get("target"), "rounds_to_target": rtt["mean"], "reached": rtt["n"],
                "bytes_to_target": stats(_with_declared(f.get("bytes_to_target"), f.get("declared_bytes_to_target"))
                                         for f in flat)["mean"],
                "sim_time_s": stats(f.get("sim_time_s") for f in flat)["mean"],
                "time_to_target_s": ttt["mean"], "dir": fc.cell.dir.name,
                "epsilon": stats(_epsilon(s) for s in sums)["mean"],
                "secagg_bytes": stats(s.get("secagg/bytes") for s in sums)["mean"]})
        rows.append(row)
    up = higher_is_better(next((r["metric"] for r in rows if r.get("metric")), None))
    by_bytes = pareto_mask([(r.get("final"), r.get("bytes_total")) for r in rows], maximise=up)
    by_time = pareto_mask([(r.get("final"), r.get("sim_time_s")) for r in rows], maximise=up)
    for r, b, t in zip(rows, by_bytes, by_time):
        r["pareto_bytes"] = b
        r["pareto_time"] = t if r.get("sim_time_s") is not None else None
    # the cells ranked by what reaching the target cost (1: cheapest; None: not reached):
    # on the link and event clocks the order by time can differ from the order by bytes
    for key, cost in (("rank_bytes", "bytes_to_target"), ("rank_time", "time_to_target_s")):
        for r, k in zip(rows, _rank([r.get(cost) for r in rows])):
            r[key] = k
    return rows


def _epsilon(summary: dict[str, Any]) -> Optional[float]:
    """The epsilon a run spent (central or distributed DP; local DP: its worst node), None without DP."""
    v = summary.get("dp/epsilon", summary.get("dp/local_epsilon"))
    return None if v is None else float(v)


CSV_COLUMNS = ["method", "codec", "status", "reason", "notes", "seeds", "n", "metric", "final", "final_std",
               "bytes_up", "bytes_total", "target", "rounds_to_target", "reached", "bytes_to_target",
               "sim_time_s", "time_to_target_s", "epsilon", "secagg_bytes", "pareto_bytes", "pareto_time", "rank_bytes",
               "rank_time", "dir"]


def _fmt_s(v: Optional[float]) -> str:
    if v is None:
        return "-"
    if v >= 3600:
        return f"{v / 3600:.2f} h"
    return f"{v:.1f} s" if v >= 1 else f"{v * 1000:.1f} ms"


def frontier_markdown(rows: Sequence[dict[str, Any]]) -> str:
    """The rows as a Markdown table; ``*`` marks the Pareto-optimal cells (by total bytes,
    and by simulated time when a link was given), skipped cells say why below."""
    from lowband.report import fmt_bytes, fmt_mean_std

    timed = any(r.get("sim_time_s") is not None for r in rows)
    metric = next((r["metric"] for r in rows if r.get("metric")), "main metric")
    head = ["method", "codec", "final" + (" %" if "acc" in str(metric) else "") + " (mean ± std)", "uplink", "total", "rounds to target", "bytes to target"]
    if timed:
        head += ["sim time", "time to target"]
    private = any(r.get("epsilon") is not None for r in rows)
    if private:
        head += ["epsilon"]
    head += ["Pareto (bytes)"] + (["Pareto (time)", "rank (bytes to target)", "rank (time to target)"]
                                  if timed else []) + ["n"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    skipped = []
    for r in rows:
        if r["status"] != "ok":
            skipped.append(f"- {r['method']} x {r['codec']}: {r['status']}: {r['reason']}")
            continue
        pct = "acc" in str(r["metric"])
        if r["target"] is None:
            rtt = "-"
        elif r["reached"]:
            rtt = f"{r['rounds_to_target']:.1f}" + (f" ({r['reached']}/{r['n']})" if r["n"] > 1 else "")
        else:
            rtt = "not reached"
        codec = r["codec"] + (f" ({r['notes']})" if r["notes"] else "")
        cells = [r["method"], f"`{codec}`", fmt_mean_std(r["final"], r["final_std"], pct=pct),
                 fmt_bytes(r["bytes_up"]), fmt_bytes(r["bytes_total"]), rtt, fmt_bytes(r["bytes_to_target"])]
        if timed:
            cells += [_fmt_s(r["sim_time_s"]), _fmt_s(r["time_to_target_s"])]
        if private:
            cells += ["-" if r.get("epsilon") is None else f"{r['epsilon']:.3g}"]
        cells += ["*" if r["pareto_bytes"] else ""]
        if timed:
            cells += ["*" if r["pareto_time"] else "", *("-" if r.get(k) is None else str(r[k])
                                                          for k in ("rank_bytes", "rank_time"))]
        cells.append(str(r["n"]))
        lines.append("| " + " | ".join(cells) + " |")
    bound = "at least" if higher_is_better(metric) else "at most"
    text = (f"Final {metric}; `*`: Pareto-optimal (no other cell reaches {bound} its {metric} with fewer "
            f"total bytes (encoded + declared)" + (" / less simulated time" if timed else "") + ")"
            + ("; epsilon: spent by the end, at the run's dp.delta" if private else "") + ".\n\n"
            + "\n".join(lines) + "\n")
    if skipped:
        text += "\nNot run:\n\n" + "\n".join(skipped) + "\n"
    return text


def plot_frontier(path: Path, cells: Sequence[FrontierCell], rows: Sequence[dict[str, Any]]) -> None:
    """Main metric vs cumulative bytes (log x) per cell, Pareto cells starred and joined; a
    second panel vs simulated time when the runs have it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    done = [(fc, r) for fc, r in zip(cells, rows) if r["status"] == "ok" and fc.cell is not None]
    timed = any(r.get("sim_time_s") is not None for _, r in done)
    panels = [("bytes", "cumulative bytes (all directions, encoded + declared)", "bytes_total", "pareto_bytes")]
    if timed:
        panels.append(("time/sim_s", "simulated time (s)", "sim_time_s", "pareto_time"))
    fig, axes = plt.subplots(1, len(panels), figsize=(6.5 * len(panels), 4.8), squeeze=False)
    metric = done[0][1]["metric"] if done else "main metric"
    colours = distinct_colours(len(done))
    for ax, (x_key, x_label, cost, mark) in zip(axes[0], panels):
        for (fc, r), colour in zip(done, colours):
            pts = [(x, y) for x, y in zip(*_curve(fc.cell.run_dirs(), r["metric"], x_key))  # type: ignore[union-attr]
                   if x > 0]  # round 0 (nothing sent yet) has no place on a log axis
            xs, ys = [p[0] for p in pts], [p[1] for p in pts]
            if xs:
                ax.plot(xs, ys, marker=".", lw=1, alpha=0.8, color=colour, label=f"{fc.method} / {fc.codec}")
        front = sorted((r[cost], r["final"]) for _, r in done if r.get(mark))
        if front:
            ax.plot([p[0] for p in front], [p[1] for p in front], "k*--", ms=12, lw=1, label="Pareto front")
        ax.set_xscale("log")  # matplotlib labels minor ticks itself when the range spans under a decade
        ax.set_xlabel(x_label + ", log scale")
        ax.set_ylabel(str(metric))
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].legend(fontsize=7, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def distinct_colours(n: int) -> list[Any]:
    """``n`` colours no two alike: tab10 up to 10 cells, tab20 up to 20, else evenly spaced hues
    (matplotlib's default cycle repeats after 10, so an 11-cell frontier drew two cells alike)."""
    from matplotlib import colormaps

    if n <= 10:
        return [colormaps["tab10"](i) for i in range(n)]
    if n <= 20:
        return [colormaps["tab20"](i) for i in range(n)]
    return [colormaps["hsv"](i / n) for i in range(n)]


def write_frontier(out: Path, cells: Sequence[FrontierCell], seeds: Optional[Sequence[int]]) -> list[dict[str, Any]]:
    """``frontier.csv``, ``frontier.md``, ``frontier.png`` in ``out``; returns the rows."""
    from lowband.engine.runlog import atomic_write_text
    from lowband.export import records_csv_text

    rows = frontier_rows(cells, seeds)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "frontier.csv", records_csv_text(rows, CSV_COLUMNS))
    atomic_write_text(out / "frontier.md", frontier_markdown(rows))
    plot_frontier(out / "frontier.png", cells, rows)
    return rows


# --------------------------------------------------------------------------- running


@dataclass
class FrontierResult:
    out: Path
    cells: list[FrontierCell]
    rows: list[dict[str, Any]]
    ran: list[dict[str, Any]]  # what the runner did (empty when every cell was finished)


def run_frontier(raw: dict[str, Any], methods: str | Sequence[tuple[str, dict[str, Any]]],
                 codecs: str | Sequence[str], *, seeds: Optional[str | Sequence[int]] = None,
                 link: Optional[str] = None, target: Optional[float] = None, out: Optional[str | Path] = None,
                 workers: Optional[int] = None, backend: str = "process",
                 progress: Optional[bool] = None) -> FrontierResult:
    """Run every runnable (method, codec) cell (resumable), then write the three files.
    Raises ConfigError on bad input before anything is written, BatchError (after writing
    the files for the cells that finished) when runs failed."""
    if isinstance(methods, str):
        methods = parse_methods(methods)
    if isinstance(codecs, str):
        codecs = parse_codecs(codecs)
    if not methods or not codecs:
        raise ConfigError("frontier: give at least one method (--methods) and one codec (--codecs)")
    if workers is not None and workers < 1:
        raise ConfigError(f"--workers {workers}: give at least 1")
    base = copy.deepcopy(raw)
    if link is not None:
        base["links"] = {**(base.get("links") or {}), "preset": link}
    if target is not None:
        base.setdefault("eval", {})["target"] = target
    exp = validate(base)  # a bad link, target or base config: one line, nothing written
    if exp.comm.by_kind:  # by_kind wins over by_direction: it would silently replace the cells' codecs
        kind = next(iter(exp.comm.by_kind))
        raise ConfigError(f"comm.by_kind.{kind}: the frontier puts each codec on the uplink (comm.by_direction.up), "
                          f"and a by_kind codec would override it for {kind!r} messages; remove comm.by_kind "
                          f"from the base config")
    seed_list = parse_seeds(seeds) if seeds is not None and seeds != "" else None
    out_dir = Path(out) if out is not None else Path("runs") / f"{exp.name}-frontier"
    cells = frontier_cells(base, methods, codecs, out_dir, seed_list)
    runnable = [fc for fc in cells if fc.cell is not None]
    if not runnable:
        first = cells[0]
        raise ConfigError(f"frontier: every cell was skipped ({first.method} x {first.codec}: {first.reason})")
    jobs = [j for fc in runnable for j in fc.cell.jobs]  # type: ignore[union-attr]
    failure: Optional[BatchError] = None
    ran: list[dict[str, Any]] = []
    try:
        ran = run_jobs(jobs, workers=workers, backend=backend, progress=progress,
                       title=f"frontier {exp.name}: {len(runnable)} cells" + (
                           f" x {len(seed_list)} seeds" if seed_list else ""))
    except BatchError as exc:
        failure = exc
    for fc in runnable:
        dirs = fc.cell.run_dirs()  # type: ignore[union-attr]
        if not all((d / "summary.json").exists() for d in dirs):
            fc.status, fc.reason = "failed", "a run did not finish (see the error above; run again to retry)"
        elif seed_list:
            write_aggregate(fc.cell.dir, dirs)  # type: ignore[union-attr]
    rows = write_frontier(out_dir, cells, seed_list)
    if failure is not None:
        raise failure
    return FrontierResult(out_dir, cells, rows, ran)


# --------------------------------------------------------------------------- re-timing


def _read_ledger(path: Path) -> Any:
    """A :class:`~lowband.comm.ledger.Ledger` with the rows of a run's ``ledger.csv``, in order."""
    import csv

    from lowband.comm.ledger import Ledger

    led = Ledger()
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            led.record(int(row["round"]), int(row["src"]), int(row["dst"]), row["direction"], row["kind"],
                       int(row["bytes"]), int(row["declared"] or 0))
    return led


def retime_run(run_dir: str | Path, presets: Sequence[str], data_dir: Optional[str] = None
               ) -> dict[str, list[dict[str, float]]]:
    """Simulated time of a finished run on other links, without training again: the run's
    ``ledger.csv`` replayed under each preset (every node on it), with each node's local
    compute seconds from the run's config (``links.device_flops``, ``links.compute_s``; the
    federation is built for the sample counts, nothing is trained). Returns, per preset, one
    ``{"round", "time/round_s", "time/sim_s"[, "energy/round_j", "energy/j"]}`` per round.

    A run with ``links.deadline_s`` is refused: its ledger depends on its own link. One run
    folder: a seeds folder's runs are ``lowband.report.find_runs(path).dirs``, each re-timed
    on its own (as :func:`retime_frontier` does)."""
    import tempfile

    import tomllib

    from lowband.comm import links as lk
    from lowband.engine.simulator import Simulation

    d = Path(run_dir)
    for f in ("config.toml", "ledger.csv", "summary.json"):
        if not (d / f).exists():
            raise ConfigError(f"retime: {d} has no {f} (not a finished lowband run folder)")
    bad = [p for p in presets if p not in lk.PRESETS]
    if bad or not presets:
        raise ConfigError(f"retime: unknown link preset {bad[0] if bad else ''!r}; available: {', '.join(lk.PRESETS)}")
    raw = tomllib.loads((d / "config.toml").read_text())
    old = raw.get("links") or {}
    from lowband.algorithms import ALGORITHMS

    alg = ALGORITHMS.get(str((raw.get("algorithm") or {}).get("name", "")))
    if alg is not None and getattr(alg, "event_clock", False):
        raise ConfigError(f"retime: {d} is an asynchronous run: which update arrived when depends on its own link "
                          f"and devices (the event clock), so its ledger cannot be re-timed on another link; "
                          f"run it again with that link")
    if old.get("deadline_s") is not None:
        raise ConfigError(f"retime: {d} ran with links.deadline_s, which dropped replies by its own link's "
                          f"timing; its ledger cannot be re-timed on another link")
    raw["links"] = {k: v for k, v in old.items() if k in ("device_flops", "compute_s")} | {"preset": presets[0]}
    if data_dir:
        raw.setdefault("data", {})["data_dir"] = str(data_dir)
    rounds = int(raw.get("rounds", 0))
    led = _read_ledger(d / "ledger.csv")
    with tempfile.TemporaryDirectory() as tmp:
        raw["out_dir"] = str(Path(tmp) / "run")
        sim = Simulation(validate(raw))  # builds the federation and the compute times; trains nothing
        from lowband.engine.observers import LinkClock

        base = sim.observer(LinkClock).timer.model
    out: dict[str, list[dict[str, float]]] = {}
    for name in presets:
        model = lk.LinkModel(lk.PRESETS[name], {}, list(base.compute_s), None, base.retransmissions, base.seed)
        timer = lk.LinkTimer(model)
        recs = []
        for r in range(1, rounds + 1):
            timer.finish(led, r)
            recs.append({"round": r, **timer.record(r)})
        out[name] = recs
    return out


RETIME_FILES = ("retime.csv", "retime.md")


def _rank(values: Sequence[Optional[float]]) -> list[Optional[int]]:
    """1-based rank of each value (smallest first; ties share the rank); None stays None."""
    got = sorted(v for v in values if v is not None)
    return [None if v is None else got.index(v) + 1 for v in values]


def _csv_number(text: Optional[str]) -> Optional[float]:
    """A number read back from ``frontier.csv``; None for an empty field, which is how
    :func:`lowband.export.records_csv_text` writes None and NaN (e.g. the final metric of a
    cell whose runs never measured it)."""
    if text is None or not text.strip():
        return None
    v = float(text)
    return None if math.isnan(v) else v


def _cell_runs(d: Path) -> list[Path]:
    """A frontier cell's finished runs: the cell folder, or its ``seed-<s>/`` folders (``--seeds``)."""
    from lowband.report import ReportError, find_runs

    try:
        return find_runs(d).dirs
    except ReportError as exc:
        raise ConfigError(f"retime: {exc}") from None


def _retime_one(d: Path, presets: Sequence[str], data_dir: Optional[str]) -> dict[str, Any]:
    """One run's numbers for the re-timed table: bytes (and to target) and, per preset, the
    simulated time (and to target, and energy)."""
    from lowband.engine.runlog import RunLog

    summary = json.loads((d / "summary.json").read_text())
    hit = summary.get("rounds_to_target")
    metrics = RunLog.read_jsonl(d / "metrics.jsonl")
    last = max(metrics, key=lambda m: int(m["round"]))
    row: dict[str, Any] = {"bytes_up": float(last.get("bytes/up", 0)) + float(last.get("declared/up", 0)),
                           "bytes_total": float(last.get("bytes/total", 0)) + float(last.get("declared/total", 0)),
                           "bytes_to_target": _with_declared(summary.get("bytes_to_target"),
                                                             summary.get("declared_bytes_to_target"))}
    for name, recs in retime_run(d, presets, data_dir).items():
        row[f"{name}_s"] = recs[-1]["time/sim_s"]
        # round 0 (the initial model already at the target) costs no time; recs[k] is round k + 1
        row[f"{name}_to_target_s"] = (None if hit is None else 0.0 if hit == 0 else recs[hit - 1]["time/sim_s"])
        if "energy/j" in recs[-1]:
            row[f"{name}_j"] = recs[-1]["energy/j"]
    return row


def _seed_mean(values: Sequence[Any]) -> Any:
    """The value of a one-seed cell as it is; over seeds the mean of those that have one
    (``*_to_target``: the seeds that reached the target, as frontier.csv), None if none has."""
    got = [v for v in values if v is not None]
    if len(values) == 1 or not got:
        return values[0] if len(values) == 1 else None
    return math.fsum(float(v) for v in got) / len(got)


def retime_frontier(frontier_dir: str | Path, presets: Sequence[str], data_dir: Optional[str] = None
                    ) -> list[dict[str, Any]]:
    """Re-time every finished cell of a frontier folder (``frontier.csv``) under each preset
    (:func:`retime_run`) and write ``retime.csv`` and ``retime.md`` there: per cell the final
    metric, total bytes and bytes-to-target with their rank, then per preset the simulated
    time, time-to-target, their ranks and the Pareto marks; the Markdown lists where the
    ranking by time differs from the ranking by bytes. A frontier run with ``--seeds`` is
    re-timed seed by seed; its numbers are the means over the seeds (to target: over the
    seeds that reached it). A cell without a final metric (an empty ``final`` in
    frontier.csv: no run measured it) is re-timed too but gets no rank and no Pareto mark
    (None in retime.csv) and reads "not measured" in retime.md."""
    import csv

    from lowband.engine.runlog import atomic_write_text
    from lowband.export import records_csv_text

    out = Path(frontier_dir)
    if not (out / "frontier.csv").exists():
        raise ConfigError(f"retime: {out} has no frontier.csv (run `lowband frontier` first)")
    with open(out / "frontier.csv", newline="") as f:
        cells = [r for r in csv.DictReader(f) if r["status"] == "ok" and r.get("dir")]
    if not cells:
        raise ConfigError(f"retime: {out}/frontier.csv lists no finished cell")
    rows: list[dict[str, Any]] = []
    for c in cells:
        per_seed = [_retime_one(d, presets, data_dir) for d in _cell_runs(out / c["dir"])]
        row: dict[str, Any] = {"method": c["method"], "codec": c["codec"], "metric": c.get("metric") or "",
                               "final": _csv_number(c.get("final"))}
        for key in per_seed[0]:
            row[key] = _seed_mean([r.get(key) for r in per_seed])
        rows.append(row)
    cols = ["method", "codec", "final", "bytes_up", "bytes_total", "rank_bytes", "pareto_bytes", "bytes_to_target",
            "rank_bytes_to_target"]
    # a cell whose runs never measured the final metric has no place in a trade-off: no
    # rank, no Pareto mark (None, not False: it was not compared), "not measured" in the table
    measured = [r["final"] is not None for r in rows]
    up = higher_is_better(rows[0]["metric"])

    def rank(key: str) -> list[Optional[int]]:
        return _rank([r[key] if m else None for r, m in zip(rows, measured)])

    def pareto(cost: str) -> list[Optional[bool]]:
        marks = pareto_mask([(r["final"], r[cost]) for r in rows], maximise=up)
        return [mark if m else None for mark, m in zip(marks, measured)]

    for r, k in zip(rows, rank("bytes_total")):
        r["rank_bytes"] = k
    for r, k in zip(rows, rank("bytes_to_target")):
        r["rank_bytes_to_target"] = k
    for r, m in zip(rows, pareto("bytes_total")):
        r["pareto_bytes"] = m
    for name in presets:
        for r, k in zip(rows, rank(f"{name}_s")):
            r[f"rank_{name}"] = k
        for r, k in zip(rows, rank(f"{name}_to_target_s")):
            r[f"rank_{name}_to_target"] = k
        for r, m in zip(rows, pareto(f"{name}_s")):
            r[f"pareto_{name}"] = m
        cols += [f"{name}_s", f"rank_{name}", f"pareto_{name}", f"{name}_to_target_s", f"rank_{name}_to_target"]
        if any(f"{name}_j" in r for r in rows):
            cols.append(f"{name}_j")
    atomic_write_text(out / "retime.csv", records_csv_text(rows, cols))
    atomic_write_text(out / "retime.md", retime_markdown(rows, presets))
    return rows


def retime_markdown(rows: Sequence[dict[str, Any]], presets: Sequence[str]) -> str:
    """The re-timed table (ranks 1 = cheapest; ``*`` Pareto-optimal: no other cell reaches
    at least its final metric for less) and the cells whose rank by time differs from their
    rank by bytes."""
    from lowband.comm.links import format_seconds
    from lowband.report import fmt_bytes

    def t(v: Optional[float]) -> str:
        return "-" if v is None else format_seconds(float(v))

    def ranked(text: str, rank: Optional[int]) -> str:
        return text if rank is None else f"{text} ({rank})"

    metric = str(rows[0].get("metric") or "") if rows else ""
    pct = not metric or "acc" in metric  # a frontier.csv without the metric column: accuracies, as before
    head = ["method", "codec", "final %" if pct else "final", "total bytes", "Pareto bytes", "bytes to target"]
    for name in presets:
        head += [f"{name}: sim time", f"Pareto {name}", f"{name}: time to target"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        btt = r["bytes_to_target"]
        final = ("not measured" if r["final"] is None else f"{100 * r['final']:.2f}" if pct
                 else f"{r['final']:.4g}")
        cells = [r["method"], f"`{r['codec']}`", final, ranked(fmt_bytes(r["bytes_total"]), r["rank_bytes"]),
                 "*" if r["pareto_bytes"] else "", ranked(fmt_bytes(btt) if btt is not None else "-", r["rank_bytes_to_target"])]
        for name in presets:
            cells += [ranked(t(r[f"{name}_s"]), r[f"rank_{name}"]), "*" if r[f"pareto_{name}"] else "",
                      ranked(t(r[f"{name}_to_target_s"]), r[f"rank_{name}_to_target"])]
        lines.append("| " + " | ".join(cells) + " |")

    def order(key: str) -> str:
        got = sorted((r[key], f"{r['method']}/{r['codec']}") for r in rows if r[key] is not None)
        return " < ".join(c for _, c in got) or "(none)"

    diffs = [f"- to target, by bytes: {order('rank_bytes_to_target')}"]
    for name in presets:
        same = all(r[f"rank_{name}_to_target"] == r["rank_bytes_to_target"] for r in rows)
        diffs.append(f"- to target, by time on `{name}`: {order(f'rank_{name}_to_target')}"
                     + (" (the same)" if same else " (differs)"))
    for name in presets:
        moved = [f"{r['method']}/{r['codec']} {r['rank_bytes']} -> {r[f'rank_{name}']}" for r in rows
                 if r[f"rank_{name}"] != r["rank_bytes"]]
        front = {f"{r['method']}/{r['codec']}" for r in rows if r[f"pareto_{name}"]}
        fb = {f"{r['method']}/{r['codec']}" for r in rows if r["pareto_bytes"]}
        line = f"- whole run on `{name}`: " + ("rank by time = rank by total bytes" if not moved else
                                               "rank by total bytes -> by time: " + ", ".join(moved))
        if front != fb:
            line += "; Pareto set " + ", ".join([f"+{c}" for c in sorted(front - fb)] + [f"-{c}" for c in sorted(fb - front)])
        diffs.append(line)
    bound = "at least" if higher_is_better(metric) else "at most"
    unmeasured = [f"{r['method']}/{r['codec']}" for r in rows if r["final"] is None]
    note = ("\n\nNot measured (no run of the cell has a final " + (metric or "main metric") + "; left out of the "
            "ranks and the Pareto marks): " + ", ".join(unmeasured)) if unmeasured else ""
    return ("Ranks in parentheses (1 = fewest bytes / least simulated time; to target: among the cells that "
            f"reach it); `*`: Pareto-optimal (no other cell reaches {bound} its final metric for less).\n\n"
            + "\n".join(lines) + note + "\n\nRankings by bytes and by time:\n\n" + "\n".join(diffs) + "\n")


def cmd_retime(args: Any) -> int:
    """``lowband retime FRONTIER_DIR --links lte,lorawan_sf12 [--data-dir]``."""
    presets = [p.strip() for p in args.links.split(",") if p.strip()]
    retime_frontier(args.frontier, presets, args.data_dir)
    out = Path(args.frontier)
    print((out / "retime.md").read_text())
    print("wrote " + ", ".join(str(out / f) for f in RETIME_FILES))
    return 0


def cmd_frontier(args: Any) -> int:
    """``lowband frontier CONFIG --methods ... --codecs ... [--seeds] [--link] [--target] [--out] [--workers]``."""
    from lowband.config.resolve import load_experiment

    fixed = list(args.overrides or [])
    if args.data_dir:
        fixed.append('data.data_dir="' + str(args.data_dir).replace("\\", "\\\\").replace('"', '\\"') + '"')
    methods = parse_methods(args.methods)
    codecs = parse_codecs(args.codecs)
    exp = load_experiment(args.config, fixed, needs_algorithm=False)  # each cell sets its own method
    try:
        res = run_frontier(raw_config(exp), methods, codecs, seeds=args.seeds, link=args.link, target=args.target,
                           out=args.out, workers=args.workers, backend=args.backend,
                           progress=False if args.quiet else None)
    except BatchError as exc:
        print(f"lowband: error: {exc}", file=sys.stderr)
        return 1
    for fc in res.cells:
        if fc.status == "skipped":
            print(f"lowband: skipped {fc.method} x {fc.codec}: {fc.reason}", file=sys.stderr)
    print((res.out / "frontier.md").read_text())
    print("wrote " + ", ".join(str(res.out / f) for f in FILES))
    return 0


def add_parser(sub: Any) -> None:
    """Register ``lowband frontier`` on the CLI's subparsers."""
    p = sub.add_parser("frontier", help="methods x codecs (x seeds) on one federation: accuracy vs bytes (and "
                                         "simulated time), Pareto-optimal cells marked; resumable")
    p.add_argument("config", help="path of the experiment's .toml file (the federation and base settings)")
    p.add_argument("overrides", nargs="*", help="key=value overrides of the base config")
    p.add_argument("--methods", required=True,
                   help="comma-separated algorithms, with options in parentheses: fedavg,fedavg(server_opt=adam),kta")
    p.add_argument("--codecs", required=True, help="comma-separated uplink codecs: fp32,ef(topk(0.01)),qsgd(4)")
    p.add_argument("--seeds", help="run every cell once per seed (e.g. 0,1,2); the table shows mean ± std")
    p.add_argument("--link", help="a link preset (lowband list links): adds simulated time and time-to-target")
    p.add_argument("--target", type=float, help="target of the main metric for rounds/bytes/time-to-target")
    p.add_argument("--out", help="frontier folder (default runs/<name>-frontier)")
    p.add_argument("--workers", type=int, help="worker processes (default: min(cores, runs))")
    p.add_argument("--backend", choices=["process", "ray", "serial"], default="process",
                   help="where the runs go (default process pool)")
    p.add_argument("--data-dir", help="dataset folder (else $LOWBAND_DATA, else the user cache)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(fn=cmd_frontier)
    r = sub.add_parser("retime", help="a finished frontier's runs re-timed on other link presets from their "
                                      "ledgers (no training): ranks by bytes vs by simulated time")
    r.add_argument("frontier", help="the frontier folder (with frontier.csv)")
    r.add_argument("--links", required=True, help="comma-separated link presets, e.g. lte,lorawan_sf12")
    r.add_argument("--data-dir", help="dataset folder (to build the federation for compute times)")
    r.set_defaults(fn=cmd_retime)


__all__ = ["FrontierCell", "FrontierResult", "add_parser", "cmd_frontier", "cmd_retime", "retime_frontier",
           "retime_run", "frontier_markdown", "frontier_rows",
           "is_lossy", "pareto_mask", "parse_codecs", "parse_methods", "run_frontier"]
