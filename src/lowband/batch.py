"""Several runs of one experiment: seeds (mean, std, 95% CI) and sweeps over config keys.

- **Seeds**: ``lowband run CONFIG --seeds 0,1,2`` (``lb.run_seeds``) runs the config once
  per seed into ``RUN/seed-<s>/`` and writes ``RUN/aggregate.json`` and
  ``RUN/aggregate.csv``: per evaluated round and for the summary, the mean, the standard
  deviation (ddof=1) and a 95% confidence interval (Student t, n-1 degrees of freedom) of
  every numeric metric over the seeds, with n the number of values averaged (a seed
  that did not measure a metric at a round is not counted for it).
- **Sweeps**: ``lowband sweep CONFIG key=a,b,c key2=x,y [--seeds ...]`` (``lb.sweep``)
  runs every cell of the grid into ``OUT/<key=value>__.../`` (with ``seed-<s>/`` inside
  when seeds are given), then writes ``OUT/sweep.md``, ``OUT/sweep.csv`` (one row per
  cell: the swept values, then the final main metric, mean ± std and CI over seeds,
  rounds and bytes to target, traffic) and two plots.

Every run is resumable: a finished run (its ``summary.json`` covers the config's
rounds) is skipped, an interrupted one resumes from its checkpoint, so a batch killed
midway and started again redoes nothing that finished. A folder that holds a run of a
*different* config is refused before anything runs. Runs go to a pool of
``min(cores, runs)`` worker processes (or ``--workers N``; ``--backend ray`` sends them
to Ray tasks instead); each worker uses ``cores // workers`` torch threads unless the
config sets ``threads``. Metrics equal a serial run's with the same thread count (set
``threads`` in the config to pin it).
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
import os
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

from lowband.config.schema import ConfigError, Experiment
from lowband.config.loading import parse_override
from lowband.config.resolve import validate
from lowband.aggregate import (  # noqa: F401 (re-exported: lowband.batch.stats, ...)
    AGGREGATE_CSV,
    AGGREGATE_JSON,
    ROUND_STATS,
    SEED_PREFIX,
    BatchError,
    _numeric,
    _read_json,
    aggregate,
    aggregate_dirs,
    aggregate_round_records,
    flat_summary,
    rounds_mismatch,
    seed_dir,
    seed_runs,
    stats,
    value_text,
)
from lowband.console import BatchProgress, log, quiet, round_info

BACKENDS = ("process", "ray", "serial")


# --------------------------------------------------------------------------- parsing


def parse_seeds(text: str | Sequence[int]) -> list[int]:
    """``"0,1,2"`` or ``"0-4"`` (inclusive) or a mix (``"0-2,7"``) -> distinct seeds in order."""
    if not isinstance(text, str):
        seeds = [int(s) for s in text]
    else:
        seeds = []
        for part in (p.strip() for p in text.split(",")):
            m = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
            if not m:
                raise ConfigError(f"--seeds {text!r}: expected comma-separated non-negative integers or ranges, "
                                  f"e.g. 0,1,2 or 0-4")
            a, b = int(m.group(1)), int(m.group(2) or m.group(1))
            if b < a:
                raise ConfigError(f"--seeds {text!r}: range {part} runs backwards")
            seeds += range(a, b + 1)
    if not seeds or any(s < 0 for s in seeds):
        raise ConfigError(f"--seeds {text!r}: give at least one seed >= 0")
    if len(set(seeds)) != len(seeds):
        raise ConfigError(f"--seeds {text!r}: a seed is repeated")
    return seeds


def split_values(text: str) -> list[str]:
    """Split ``a,b,c`` at commas outside brackets, parentheses and quotes
    (``topk(0.01)+fp16,sketch(5,2000)`` is two values)."""
    out, cur, depth, quote = [], "", 0, ""
    for ch in text:
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "\"'":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            out.append(cur)
            cur = ""
            continue
        cur += ch
    out.append(cur)
    return [v.strip() for v in out]


def parse_grid(items: Sequence[str]) -> tuple[dict[str, list[Any]], list[str]]:
    """``key=a,b,c`` items -> (grid of swept keys and their values, fixed ``key=value`` overrides)."""
    grid: dict[str, list[Any]] = {}
    fixed: list[str] = []
    for item in items:
        path, _ = parse_override(item)  # checks the key=value shape
        key = ".".join(path)
        raw = item.split("=", 1)[1]
        values = split_values(raw)
        if len(values) == 1:
            fixed.append(item)
            continue
        if any(v == "" for v in values):
            raise ConfigError(f"sweep {item!r}: an empty value; write key=a,b,c")
        parsed = [parse_override(f"{key}={v}")[1] for v in values]
        if len({json.dumps(v, sort_keys=True) for v in parsed}) != len(parsed):
            raise ConfigError(f"sweep {item!r}: a value is repeated")
        if key in grid:
            raise ConfigError(f"sweep: key {key!r} given twice")
        grid[key] = parsed
    return grid, fixed


def set_key(raw: dict[str, Any], key: str, value: Any) -> None:
    """Set dotted ``key`` in a raw config dict (in place)."""
    node = raw
    parts = key.split(".")
    for p in parts[:-1]:
        nxt = node.setdefault(p, {})
        if not isinstance(nxt, dict):
            raise ConfigError(f"{key}: {p!r} is a value, not a section")
        node = nxt
    node[parts[-1]] = value


def cell_label(params: dict[str, Any]) -> str:
    return ", ".join(f"{k}={value_text(v)}" for k, v in params.items())


def cell_dirname(params: dict[str, Any]) -> str:
    """A folder name for a cell: ``key=value`` joined by ``__``; characters other than
    letters, digits and ``._-`` become ``_`` and then a short hash of the exact value keeps
    names distinct."""
    parts = []
    for k, v in params.items():
        text = value_text(v)
        slug = re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_") or "_"
        if slug != text:
            slug += "-" + hashlib.sha1(text.encode()).hexdigest()[:6]
        parts.append(f"{k}={slug}")
    return "__".join(parts) or "base"


# --------------------------------------------------------------------------- jobs


@dataclass
class Job:
    """One run of a batch: a complete raw config (with ``out_dir`` and ``seed`` set)."""

    index: int
    raw: dict[str, Any]
    label: str
    plugins: tuple[str, ...] = ()
    status: str = "new"  # new | resume | done (set by :func:`plan_jobs`)
    done_rounds: int = 0
    rounds: int = 0

    @property
    def run_dir(self) -> Path:
        return Path(self.raw["out_dir"])


def raw_config(exp: Experiment) -> dict[str, Any]:
    """A raw dict that validates back to ``exp`` (only the keys that were set, so
    defaults that depend on whether a key was given stay as they were)."""
    return exp.model_dump(mode="json", exclude_unset=True)


def run_state(exp: Experiment) -> tuple[str, int]:
    """``("done" | "resume" | "new", rounds already done)`` of ``exp``'s run folder.
    Raises RunDirError when the folder holds a run of another config."""
    from lowband.engine.runlog import RunDirError, RunLog, config_change

    rd = exp.run_dir()
    cfg = rd / "config.toml"
    if not cfg.exists():
        if (rd / "metrics.jsonl").exists() or (rd / "summary.json").exists():
            raise RunDirError(f"{rd} holds results but no config.toml; move it away or choose another --out")
        return "new", 0
    changed = config_change(rd, exp)
    if changed:
        raise RunDirError(f"{rd} holds a run of a different config ({changed}; see its config.toml); delete it or "
                          f"choose another --out")
    summary = _read_json(rd / "summary.json")
    metrics = RunLog.read_jsonl(rd / "metrics.jsonl")
    done = int(metrics[-1]["round"]) if metrics else 0
    if summary is not None and int(summary.get("rounds_completed") or 0) >= exp.rounds:
        return "done", exp.rounds
    return "resume", done


def plan_jobs(jobs: Sequence[Job]) -> None:
    """Validate every job and find its state, before anything runs (one-line errors)."""
    from lowband import plugins

    plugins.load_plugins(j for job in jobs for j in job.plugins)
    dirs: dict[str, str] = {}
    for job in jobs:
        try:
            exp = validate(job.raw)
        except ConfigError as exc:
            raise ConfigError(f"{job.label}: {exc}") from None
        key = str(exp.run_dir().resolve())
        if key in dirs:
            raise ConfigError(f"{job.label} and {dirs[key]} would share the run folder {exp.run_dir()}")
        dirs[key] = job.label
        job.status, job.done_rounds = run_state(exp)
        job.rounds = exp.rounds


_QUEUE: Any = None


def _init_worker(queue: Any, threads: int, plugin_specs: Sequence[str]) -> None:
    """Process-pool initializer: progress queue, torch threads, plugins."""
    global _QUEUE
    _QUEUE = queue
    import torch

    torch.set_num_threads(max(1, threads))
    from lowband import plugins

    plugins.load_entry_points()
    plugins.load_plugins(plugin_specs)


def run_job(job: Job, progress: Any = None) -> dict[str, Any]:
    """Run (resume, or skip when finished) one job; returns what happened. Progress goes to
    ``progress(index, round, record, main)`` or, in a pool worker, to the pool's queue."""
    from lowband import plugins
    from lowband.engine.simulator import Simulation

    plugins.load_entry_points()
    plugins.load_plugins(job.plugins)
    t0 = time.perf_counter()
    try:
        exp = validate(job.raw)
        status, _ = run_state(exp)
        if status == "done":
            return {"index": job.index, "status": "skipped", "run_dir": str(exp.run_dir()), "seconds": 0.0}
        sim = Simulation(exp, resume=status == "resume")
        report = progress
        if report is None and _QUEUE is not None:
            queue = _QUEUE

            def report(index: int, r: int, rec: dict[str, Any], main: str) -> None:
                queue.put((index, r, {k: rec.get(k) for k in (main, "bytes/total", "declared/total")}, main))
        if report is not None:
            sim.progress = lambda r, total, rec: report(job.index, r, rec, sim.main_metric)
        sim.run()
    except KeyboardInterrupt:
        raise
    except Exception as exc:  # noqa: BLE001 - reported per run; the batch goes on
        msg = str(exc).splitlines()[0] if str(exc) else ""
        return {"index": job.index, "status": "failed", "error": f"{type(exc).__name__}: {msg}",
                "run_dir": job.raw.get("out_dir"), "seconds": time.perf_counter() - t0}
    return {"index": job.index, "status": "resumed" if status == "resume" else "ran",
            "run_dir": str(exp.run_dir()), "seconds": time.perf_counter() - t0}


def cpu_count() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def run_jobs(jobs: Sequence[Job], *, workers: Optional[int] = None, backend: str = "process",
             progress: Optional[bool] = None, title: str = "runs") -> list[dict[str, Any]]:
    """Run ``jobs`` (validated and planned first); skip finished ones. Raises
    :class:`BatchError` naming the runs that failed, after the others finished."""
    if backend not in BACKENDS:
        raise ConfigError(f"--backend {backend!r}: choose one of {', '.join(BACKENDS)}")
    if workers is not None and workers < 1:
        raise ConfigError(f"--workers {workers}: give at least 1")
    plan_jobs(jobs)
    pending = [j for j in jobs if j.status != "done"]
    for j in jobs:
        if j.status == "done":
            log.info("skip    %s: finished in %s", j.label, j.run_dir)
    show = (not quiet()) if progress is None else progress
    total = sum(max(0, j.rounds - j.done_rounds) for j in pending)
    n = min(workers or cpu_count(), len(pending)) if pending else 0
    results: list[dict[str, Any]] = []
    if pending:
        log.info("%s: %d of %d runs to do (%d rounds) on %d %s", title, len(pending), len(jobs), total,
                 max(n, 1), "worker" if max(n, 1) == 1 else "workers")
    bar = BatchProgress(title, total, len(pending), enabled=show)
    try:
        if not pending:
            pass
        elif backend == "ray":
            results = _run_ray(pending, n, bar)
        elif backend == "serial" or n <= 1:
            results = _run_serial(pending, bar)
        else:
            results = _run_pool(pending, n, bar)
    finally:
        bar.close()
    by_index = {j.index: j for j in jobs}
    failed = [r for r in results if r["status"] == "failed"]
    for r in results:
        j = by_index[r["index"]]
        if r["status"] != "failed":
            log.info("%-7s %s -> %s (%.1f s)", r["status"], j.label, r["run_dir"], r["seconds"])
    if failed:
        raise BatchError(f"{len(failed)} of {len(pending)} runs failed: "
                         + "; ".join(f"{by_index[r['index']].label}: {r['error']}" for r in failed[:3])
                         + (" ..." if len(failed) > 3 else "") + " (finished runs are kept; run again to retry)")
    return results


class _Tracker:
    """Turns (job, round) reports into bar advances."""

    def __init__(self, jobs: Sequence[Job], bar: BatchProgress):
        self.jobs = {j.index: j for j in jobs}
        self.at = {j.index: j.done_rounds for j in jobs}
        self.bar = bar

    def report(self, index: int, r: int, rec: dict[str, Any], main: str) -> None:
        step = max(0, r - self.at[index])
        self.at[index] = max(self.at[index], r)
        self.bar.advance(step, round_info(self.jobs[index].label, r, rec, main))
        log.debug("%s", round_info(self.jobs[index].label, r, rec, main))

    def finish(self, index: int) -> None:
        j = self.jobs[index]
        self.bar.advance(max(0, j.rounds - self.at[index]))
        self.at[index] = j.rounds
        self.bar.run_done()


def _run_serial(jobs: Sequence[Job], bar: BatchProgress) -> list[dict[str, Any]]:
    tr = _Tracker(jobs, bar)
    out = []
    for j in jobs:
        out.append(run_job(j, tr.report))
        tr.finish(j.index)
    return out


def _run_pool(jobs: Sequence[Job], n: int, bar: BatchProgress) -> list[dict[str, Any]]:
    import multiprocessing as mp
    import queue as queue_mod
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

    from lowband import plugins

    ctx = mp.get_context("spawn")  # no fork of a process with torch threads
    q = ctx.Queue()
    threads = max(1, cpu_count() // n)
    tr = _Tracker(jobs, bar)
    out: list[dict[str, Any]] = []
    pool = ProcessPoolExecutor(n, mp_context=ctx, initializer=_init_worker,
                               initargs=(q, threads, list(plugins.LOADED)))
    try:
        futures = {pool.submit(run_job, j): j for j in jobs}
        left = set(futures)
        while left:
            done, left = wait(left, timeout=0.2, return_when=FIRST_COMPLETED)
            _drain(q, tr, queue_mod)
            for f in done:
                res = f.result()
                out.append(res)
                tr.finish(res["index"])
        _drain(q, tr, queue_mod)
    except BaseException:
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown(wait=True)
    return sorted(out, key=lambda r: r["index"])


def _drain(q: Any, tr: _Tracker, queue_mod: Any) -> None:
    while True:
        try:
            index, r, rec, main = q.get_nowait()
        except queue_mod.Empty:
            return
        except (OSError, EOFError, ValueError):  # pragma: no cover - a worker died mid-message
            return
        tr.report(index, r, rec, main)


def _run_ray(jobs: Sequence[Job], n: int, bar: BatchProgress) -> list[dict[str, Any]]:
    """Each run is a Ray task of one CPU (a local runtime of ``n`` CPUs unless Ray is
    already initialised, e.g. connected to a cluster). Progress advances per finished run."""
    try:
        import ray
    except ImportError:
        raise ConfigError("--backend ray needs the ray extra: pip install 'lowband[ray]'") from None
    owns = not ray.is_initialized()
    if owns:
        ray.init(num_cpus=max(1, n), include_dashboard=False, log_to_driver=False)
    try:
        remote = ray.remote(num_cpus=1)(run_job)
        refs = {remote.remote(j): j for j in jobs}
        tr = _Tracker(jobs, bar)
        out = []
        while refs:
            ready, _ = ray.wait(list(refs), num_returns=1, timeout=0.5)
            for ref in ready:
                refs.pop(ref)
                res = ray.get(ref)
                out.append(res)
                tr.finish(res["index"])
        return sorted(out, key=lambda r: r["index"])
    finally:
        if owns:
            ray.shutdown()


# --------------------------------------------------------------------------- seeds


def seed_jobs(raw: dict[str, Any], seeds: Sequence[int], base: Path, label: str = "",
              start: int = 0) -> list[Job]:
    from lowband import plugins

    jobs = []
    for i, s in enumerate(seeds):
        r = copy.deepcopy(raw)
        r["seed"] = int(s)
        r["out_dir"] = str(seed_dir(base, s))
        jobs.append(Job(start + i, r, f"{label + ' ' if label else ''}seed {s}".strip(), tuple(plugins.LOADED)))
    return jobs


def run_seeds(raw: dict[str, Any] | Experiment, seeds: Sequence[int] | str, *, out: Optional[str | Path] = None,
              workers: Optional[int] = None, backend: str = "process", progress: Optional[bool] = None) -> Path:
    """Run ``raw`` once per seed into ``out/seed-<s>`` (default: the config's run folder),
    then write the aggregate; returns the seeds folder."""
    if isinstance(raw, Experiment):
        raw = raw_config(raw)
    seeds = parse_seeds(seeds)
    exp = validate(raw)
    base = Path(out) if out is not None else exp.run_dir()
    run_jobs(seed_jobs(raw, seeds, base), workers=workers, backend=backend, progress=progress,
             title=f"{exp.name} x {len(seeds)} seeds")
    write_aggregate(base, [seed_dir(base, s) for s in seeds])
    return base


def aggregate_csv_text(agg: dict[str, Any]) -> str:
    """``aggregate.csv``: :func:`aggregate_round_records` as CSV."""
    from lowband.export import records_csv_text

    rows = aggregate_round_records(agg)
    return records_csv_text(rows) if rows else "round,n\n"


def write_aggregate(base: Path, dirs: Sequence[Path]) -> dict[str, Any]:
    """``aggregate.json`` and ``aggregate.csv`` of the runs in ``dirs``, in ``base``."""
    from lowband.engine.runlog import atomic_write_text, clean as _clean

    agg = aggregate_dirs(dirs)
    base.mkdir(parents=True, exist_ok=True)
    atomic_write_text(base / AGGREGATE_JSON, json.dumps(_deep_clean(agg, _clean), indent=1) + "\n")
    atomic_write_text(base / AGGREGATE_CSV, aggregate_csv_text(agg))
    return agg


def _deep_clean(v: Any, clean: Any) -> Any:
    if isinstance(v, dict):
        return {k: _deep_clean(x, clean) for k, x in v.items()}
    if isinstance(v, list):
        return [_deep_clean(x, clean) for x in v]
    return clean(v)


# --------------------------------------------------------------------------- sweeps


@dataclass
class Cell:
    params: dict[str, Any]
    dir: Path
    raw: dict[str, Any]
    seeds: Optional[list[int]] = None
    jobs: list[Job] = field(default_factory=list)

    @property
    def label(self) -> str:
        return cell_label(self.params)

    def run_dirs(self) -> list[Path]:
        return [seed_dir(self.dir, s) for s in self.seeds] if self.seeds else [self.dir]


def sweep_cells(raw: dict[str, Any], grid: dict[str, list[Any]], out: Path,
                seeds: Optional[Sequence[int]] = None) -> list[Cell]:
    """The grid's cells, in order (the first key varies slowest), with their jobs."""
    from lowband import plugins

    if not grid:
        raise ConfigError("sweep: give at least one key with several values, e.g. comm.codec=fp32,fp16")
    cells = []
    index = 0
    base_name = raw.get("name", "experiment")
    for values in itertools.product(*grid.values()):
        params = dict(zip(grid, values))
        r = copy.deepcopy(raw)
        for k, v in params.items():
            set_key(r, k, v)
        d = out / cell_dirname(params)
        r["name"] = f"{base_name}[{cell_label(params)}]"
        cell = Cell(params, d, r, list(seeds) if seeds else None)
        if seeds:
            cell.jobs = seed_jobs(r, seeds, d, cell.label, start=index)
        else:
            r = copy.deepcopy(r)
            r["out_dir"] = str(d)
            cell.jobs = [Job(index, r, cell.label, tuple(plugins.LOADED))]
        index += len(cell.jobs)
        cells.append(cell)
    return cells


def run_sweep(raw: dict[str, Any] | Experiment, grid: dict[str, list[Any]], *, out: Optional[str | Path] = None,
              seeds: Optional[Sequence[int] | str] = None, workers: Optional[int] = None, backend: str = "process",
              progress: Optional[bool] = None) -> tuple[Path, list[Cell]]:
    """Run every cell (resumable), then write ``sweep.md``, ``sweep.csv`` and the plots."""
    from lowband.engine.runlog import atomic_write_text

    if isinstance(raw, Experiment):
        raw = raw_config(raw)
    exp = validate(raw)
    seeds = parse_seeds(seeds) if seeds is not None and seeds != "" else None
    out_dir = Path(out) if out is not None else Path("runs") / f"{exp.name}-sweep"
    cells = sweep_cells(raw, grid, out_dir, seeds)
    jobs = [j for c in cells for j in c.jobs]
    plan_jobs(jobs)  # every cell validated before the spec is written or anything runs
    out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out_dir / "sweep.json", json.dumps(
        {"name": exp.name, "grid": grid, "seeds": seeds, "base": raw,
         "cells": [{"params": c.params, "dir": c.dir.name} for c in cells]}, indent=1) + "\n")
    run_jobs(jobs, workers=workers, backend=backend, progress=progress,
             title=f"sweep {exp.name}: {len(cells)} cells" + (f" x {len(seeds)} seeds" if seeds else ""))
    for c in cells:
        if c.seeds:
            write_aggregate(c.dir, c.run_dirs())
    from lowband.report import write_sweep_report

    write_sweep_report(out_dir, cells)
    return out_dir, cells


def cmd_run_seeds(args: Any, overrides: list[str]) -> int:
    """``lowband run CONFIG --seeds ...``."""
    from lowband.config.resolve import load_experiment
    from lowband.report import fmt_mean_std

    exp = load_experiment(args.config, overrides)
    try:
        base = run_seeds(raw_config(exp), args.seeds, workers=args.workers,
                         backend=getattr(args, "backend", None) or "process",
                         progress=False if args.quiet else None)
    except BatchError as exc:
        print(f"lowband: error: {exc}", file=sys.stderr)
        return 1
    agg = json.loads((base / AGGREGATE_JSON).read_text())
    main = agg.get("main_metric")
    s = agg["summary"].get(f"final/{main}", {})
    tot = {d: (agg["summary"].get(f"bytes_{d}") or {}).get("mean") or 0 for d in ("up", "down", "peer")}
    k = 100.0 if "acc" in str(main) else 1.0  # the interval in the mean's unit
    ci = "" if s.get("ci_low") is None else (f" (95% CI {k * s['ci_low']:.2f}-{k * s['ci_high']:.2f}"
                                             + (f", t-interval clipped to [0, {k:g}]" if s.get("ci_clipped") else "")
                                             + ")")
    print(f"{exp.name}: {main} = {fmt_mean_std(s.get('mean'), s.get('std'), pct='acc' in str(main))}{ci} "
          f"over {agg['n']} seeds; "
          f"mean up {tot['up'] / 1e6:.2f} MB, down {tot['down'] / 1e6:.2f} MB, peer {tot['peer'] / 1e6:.2f} MB "
          f"-> {base} (aggregate.json, aggregate.csv)")
    return 0


def cmd_sweep(args: Any) -> int:
    """``lowband sweep CONFIG key=a,b,c ... [--seeds] [--out] [--workers] [--backend]``."""
    from lowband.config.resolve import load_experiment

    grid, fixed = parse_grid(args.overrides)
    if args.data_dir:
        fixed.append('data.data_dir="' + str(args.data_dir).replace("\\", "\\\\").replace('"', '\\"') + '"')
    exp = load_experiment(args.config, fixed)
    try:
        out, cells = run_sweep(raw_config(exp), grid, out=args.out, seeds=args.seeds, workers=args.workers,
                               backend=args.backend, progress=False if args.quiet else None)
    except BatchError as exc:
        print(f"lowband: error: {exc}", file=sys.stderr)
        return 1
    print((out / "sweep.md").read_text())
    print(f"wrote {out / 'sweep.md'}, {out / 'sweep.csv'}, {out / 'sweep_curves.png'}, {out / 'sweep_final.png'}")
    return 0


__all__ = ["AGGREGATE_CSV", "AGGREGATE_JSON", "BatchError", "Cell", "Job", "aggregate", "aggregate_dirs",
           "aggregate_round_records",
           "cmd_run_seeds", "cmd_sweep", "parse_grid", "parse_seeds", "run_jobs", "run_seeds", "run_state",
           "run_sweep", "seed_runs", "split_values", "stats", "write_aggregate"]
