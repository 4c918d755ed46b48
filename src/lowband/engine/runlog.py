"""The run folder: config.toml, metrics.jsonl, timing.jsonl, summary.json, ledger.csv, checkpoint.pt.

``metrics.jsonl`` holds only deterministic quantities (accuracies, losses, byte counts),
so a resumed run and an uninterrupted one give byte-identical files, as do two executors
on the same seed; wall-clock times go to ``timing.jsonl``. Files are replaced atomically
(write to a temporary name, fsync it, ``os.replace``, fsync the folder), and a run never
overwrites a folder that already holds results unless asked to resume it.

A run writes only into a new or empty folder, or into a lowband run folder (one whose
``config.toml`` starts with :data:`CONFIG_HEADER`), so it never overwrites a file
lowband did not write (``lowband run config.toml --out .`` in the folder holding the
user's own config.toml is refused). ``summary.json`` and ``metrics.jsonl`` are strict
JSON: a missing or non-finite value is written as ``null``, never ``NaN``.
"""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path
from typing import Any, Optional

import torch

from lowband.config.schema import Experiment
from lowband.engine.runfiles import (MANIFEST_MARK, MANIFEST_NAME, DamagedFileError, Manifest, RunDirError,
                                     disk_full, check_folder, fsync_dir)
from lowband.engine.runlock import LOCK_NAME, RunLock, lock_holder
from lowband.metricdir import reaches


class DamagedLogError(DamagedFileError):
    """A run's metrics.jsonl or timing.jsonl is damaged before its end (:meth:`RunLog.read_jsonl`):
    ``path`` and ``problem`` (which line, what is wrong with it). A :class:`RunDirError`, so
    the CLI says it in one line (exit 2) and a resume refuses before it writes anything."""


def _log_record(rec: Any) -> dict[str, Any]:
    """``rec`` if it is a log record (an object with an integer ``round`` whose values are
    numbers or null, but timing's ``commit``, a string), else ValueError saying what it is not."""
    if not isinstance(rec, dict) or isinstance(rec.get("round"), bool) or not isinstance(rec.get("round"), int):
        raise ValueError("not an object with an integer 'round'")
    for k, v in rec.items():
        if k == "commit" and isinstance(v, str):
            continue
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
            raise ValueError(f"{k} is {v!r}, not a number")
    return rec


#: the first line of every config.toml a run writes: what marks a folder as lowband's own
CONFIG_HEADER = "# lowband run folder: the resolved configuration of this run (written by lowband)\n"



def _atomic_write_bytes(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        if exc.errno in (28, 122):  # ENOSPC, EDQUOT: one line naming the disk (lowband.engine.runfiles)
            raise disk_full(path, len(data)) from None
        raise
    os.replace(tmp, path)
    fsync_dir(path.parent)


def atomic_write_text(path: Path, text: str) -> None:
    _atomic_write_bytes(path, text.encode())


def clean(v: Any) -> Any:
    """``v`` with every non-finite float (at any depth) replaced by None (JSON null)."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {k: clean(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [clean(x) for x in v]
    return v



def dumps_record(rec: dict[str, Any]) -> str:
    """One strict-JSON line (non-finite values as null), floats at full precision."""
    return json.dumps(clean(rec), sort_keys=False, allow_nan=False)


def is_run_folder(folder: Path) -> bool:
    """True when ``folder`` holds a lowband run: a config.toml lowband wrote (its header), or
    one saved before the header existed together with lowband's own results."""
    cfg = folder / "config.toml"
    if not cfg.is_file():
        return False
    head = CONFIG_HEADER.encode()
    try:
        with open(cfg, "rb") as f:
            if f.read(len(head)) == head:
                return True
    except OSError:
        return False
    return (folder / "metrics.jsonl").is_file() or (folder / "checkpoint.pt").is_file()


def _comparable(toml_text: str, hyperparams: Optional[dict[str, Any]] = None) -> str:
    """The saved config without the keys a resume may change: ``rounds`` and where the
    rounds execute (``executor``, ``ray_*``), which changes no number (tested in
    tests/test_ray.py), the ``device`` (a run saved on a GPU continues on the CPU and back;
    floating-point results may differ between devices), the extra outputs (``log``) and
    ``out_dir`` (the folder compared *is* the run's folder, however a config names it: a run
    made with ``out_dir=R`` and the same config run without it into its default folder ``R``
    are one run) and ``data.data_dir`` (where the dataset files are read from).
    ``[algorithm]`` compares as the hyperparameters resolved (defaults included):
    ``hyperparams`` (what a run saved in :data:`HYPERPARAMS_NAME`), else today's defaults."""
    import tomllib

    d = tomllib.loads(toml_text)
    try:  # fill keys added to the schema since the run was saved with their defaults
        from lowband.config.resolve import validate

        exp = validate(d)
        d = tomllib.loads(exp.to_toml())
        d["algorithm"] = hyperparams if hyperparams is not None else json.loads(
            json.dumps(resolved_hyperparams(exp)))
    except Exception:  # noqa: BLE001 - a config the current schema rejects compares as saved
        pass
    for key in ("rounds", "executor", "ray_address", "ray_workers", "ray_num_cpus", "device", "log", "out_dir"):
        d.pop(key, None)
    if isinstance(d.get("data"), dict):  # where the dataset files are read from, like $LOWBAND_DATA (not
        d["data"].pop("data_dir", None)  # recorded at all): a new machine keeps them elsewhere
    if isinstance(d.get("engine"), dict):  # where the step calls run (workers) changes no number
        d["engine"].pop("workers", None)
        d["engine"].pop("retries", None)  # what happens when a machine is lost changes no number
        if not d["engine"]:
            d.pop("engine")
    return json.dumps(d, sort_keys=True)


#: the algorithm's hyperparameters as the run resolved them, defaults included: config.toml
#: holds only the keys the config set, so a default that changes between lowband versions
#: would otherwise go unnoticed by ``--resume`` (half a run under each default) and by
#: ``lowband reproduce`` (a table cell from another default)
HYPERPARAMS_NAME = "hyperparams.json"


def resolved_hyperparams(exp: Experiment) -> dict[str, Any]:
    """``{"algorithm": name, **every hyperparameter}`` (defaults included) of ``exp``."""
    from lowband.config.resolve import hyperparams

    return {"algorithm": exp.algorithm.name, **hyperparams(exp).model_dump(mode="json")}


def saved_hyperparams(folder: Path) -> Optional[dict[str, Any]]:
    """What a run folder saved in :data:`HYPERPARAMS_NAME` (None: a run made before lowband
    saved them, whose defaults cannot be told)."""
    try:
        saved = json.loads((Path(folder) / HYPERPARAMS_NAME).read_text())
    except (OSError, ValueError):
        return None
    return saved if isinstance(saved, dict) else None


def config_diff(folder: Path, exp: Experiment, ignore: tuple[str, ...] = ()) -> dict[str, tuple[Any, Any]]:
    """``dotted key -> (then, now)`` for every setting in which the run saved in ``folder``
    differs from ``exp`` beyond what a resume may change (and ``ignore``, top-level keys);
    a key one side lacks reads ``"(absent)"`` there (a default). Empty: it is ``exp``'s run.
    The algorithm's keys compare the resolved hyperparameters (:data:`HYPERPARAMS_NAME`), so
    a default that changed since the run shows here; those that change no number
    (``Hyperparams.PERFORMANCE_ONLY``: SPARK's memory budgets) may differ."""
    saved = json.loads(_comparable((Path(folder) / "config.toml").read_text(), saved_hyperparams(folder)))
    now = json.loads(_comparable(exp.to_toml()))
    for d in (saved, now):
        for key in ignore:
            d.pop(key, None)
    out: dict[str, tuple[Any, Any]] = {}

    def walk(a: Any, b: Any, prefix: str) -> None:
        if isinstance(a, dict) and isinstance(b, dict):
            for k in sorted(set(a) | set(b)):
                walk(a.get(k, "(absent)"), b.get(k, "(absent)"), f"{prefix}{k}.")
        elif a != b:
            out[prefix[:-1]] = (a, b)

    walk(saved, now, "")
    for key in _performance_only(exp):  # memory and speed: the same run whatever they were
        out.pop(f"algorithm.{key}", None)
    return out


def _performance_only(exp: Experiment) -> frozenset[str]:
    """The algorithm's keys that change no number (``Hyperparams.PERFORMANCE_ONLY``)."""
    from lowband.config.resolve import hyperparams

    try:
        return type(hyperparams(exp)).PERFORMANCE_ONLY
    except Exception:  # noqa: BLE001 - an algorithm this version cannot build compares every key
        return frozenset()


def _short(v: Any, width: int = 60) -> str:
    text = repr(v)
    return text if len(text) <= width else text[:width - 3] + "..."


def config_change(folder: Path, exp: Experiment, ignore: tuple[str, ...] = ()) -> Optional[str]:
    """Why the run saved in ``folder`` is not a run of ``exp`` (None: it is): each setting
    that differs (:func:`config_diff`) as ``"KEY: THEN then, NOW now"``, so the user can
    see what to set to reuse or resume it (e.g. ``threads: 1 then, '(absent)' now``)."""
    diff = config_diff(folder, exp, ignore)
    return config_change_text(diff) if diff else None


def config_change_text(diff: dict[str, tuple[Any, Any]]) -> str:
    """:func:`config_diff` as one line: ``"KEY: THEN then, NOW now; ..."``."""
    return "; ".join(f"{k}: {_short(a)} then, {_short(b)} now" for k, (a, b) in diff.items())


class RunLog:
    """Owns one run folder."""

    def __init__(self, run_dir: Path):
        self.dir = Path(run_dir)
        self.config_path = self.dir / "config.toml"
        self.metrics_path = self.dir / "metrics.jsonl"
        self.timing_path = self.dir / "timing.jsonl"
        self.summary_path = self.dir / "summary.json"
        self.ckpt_path = self.dir / "checkpoint.pt"
        #: what the run wrote, to check on read (lowband.engine.runfiles); set by :meth:`open`
        self.manifest: Optional[Manifest] = None
        #: the folder's one-writer lock (lowband.engine.runlock), held from :meth:`open` to :meth:`release`
        self.lock = RunLock(self.dir)

    # -- opening -------------------------------------------------------------------
    @classmethod
    def open(cls, exp: Experiment, *, resume: bool = False, run_dir: Optional[Path] = None) -> "RunLog":
        """Create a fresh run folder, or reopen one to resume. Refuses to overwrite results
        or files lowband did not write, or a folder another process is writing (:meth:`check`).
        The returned log holds the folder's lock (:mod:`lowband.engine.runlock`) until
        :meth:`release`: checked again under it, the folder is as :meth:`check` found it."""
        log = cls.check(exp, resume=resume, run_dir=run_dir)
        d = log.dir
        try:
            d.mkdir(parents=True, exist_ok=True)
            holder = log.lock.acquire()
            if holder is not None:
                raise RunDirError(_busy(d, holder))
            try:  # another process may have written or finished a run here since the check
                cls.check(exp, resume=resume, run_dir=d, _locked=True)
            except BaseException:
                log.release()
                raise
            # a resume continues the manifest (checked by check()); a run saved before manifests
            # gets one now, recording its files as they are (checked structurally by check())
            log.manifest = Manifest.open(d) if resume else Manifest(d)
            if resume:
                for name in _UNRECORDED:
                    if name not in log.manifest.files and (d / name).is_file():
                        log.manifest.write_bytes(d / name, (d / name).read_bytes())
            log.write_file(log.config_path, CONFIG_HEADER + MANIFEST_MARK + exp.to_toml())
            if not resume:  # (a resumed run keeps what it started with; check() compared it)
                log.write_file(log.dir / HYPERPARAMS_NAME, json.dumps(resolved_hyperparams(exp), indent=1))
        except RunDirError:
            log.release()
            raise
        except OSError as exc:
            log.release()
            raise RunDirError(f"run folder {d}: cannot write there ({exc.strerror or type(exc).__name__}); "
                              f"choose another out_dir (or --out)") from None
        return log

    def release(self) -> None:
        """Give back the folder's lock (the run has ended); another run may then write here."""
        self.lock.release()

    @classmethod
    def check(cls, exp: Experiment, *, resume: bool = False, run_dir: Optional[Path] = None,
              _locked: bool = False) -> "RunLog":
        """Raise :class:`RunDirError` if the run folder cannot be used as asked (another
        process writes it, it holds results and this is no resume, ...); writes nothing (the
        CLI calls it before building the experiment, to refuse early). ``_locked``: the
        caller holds the folder's lock (:meth:`open`'s second look)."""
        log = cls(run_dir or exp.run_dir())
        d = log.dir
        if exp.log.tensorboard:  # a missing optional package is refused before anything is written
            from lowband.config.schema import ConfigError
            from lowband.tblog import require_tensorboard

            try:
                require_tensorboard()
            except ValueError as exc:
                raise ConfigError(str(exc)) from None
        if d.exists() and not d.is_dir():
            raise RunDirError(f"run folder {d} is a file, not a folder; choose another out_dir (or --out)")
        holder = None if _locked else lock_holder(d)
        if holder is not None:
            raise RunDirError(_busy(d, holder))
        has_results = log.metrics_path.exists() or log.ckpt_path.exists() or log.summary_path.exists()
        if resume:
            if not log.config_path.exists():
                if has_results:
                    raise DamagedFileError(log.config_path, "missing, while the folder holds a run's results")
                raise RunDirError(f"--resume: {d} holds no run (no config.toml); start it without --resume")
            check_run(d)  # every file as the run wrote it, no hole in its logs (lowband.engine.runfiles)
            if not is_run_folder(d):
                raise RunDirError(f"--resume: {log.config_path} was not written by lowband (no run there); "
                                  f"choose the run folder to resume with out_dir (or --out)")
            try:
                saved = log.config_path.read_text()
            except (OSError, UnicodeDecodeError) as exc:
                raise RunDirError(f"--resume: cannot read {log.config_path} ({type(exc).__name__})") from None
            hp = d / HYPERPARAMS_NAME
            if hp.exists() and saved_hyperparams(d) is None:  # absent = a run older than the file; damaged = unknown
                raise RunDirError(f"--resume: {hp} cannot be read as the run's hyperparameters, so whether this "
                                  f"config continues the same run cannot be told; restore the file, or start a new "
                                  f"run in another out_dir")
            changed = config_change(d, exp)
            if changed:
                raise RunDirError(
                    f"--resume: the config differs from the one saved in {log.config_path}: {changed} (only 'rounds', "
                    f"'executor', 'ray_*', 'device', 'log', 'data.data_dir', 'engine.workers' and the algorithm's "
                    f"memory-only keys (SPARK's reply_groups, xp_cache_mb, ...) may change; a value you did not set "
                    f"means a default changed since the run started: set the one it started with); resume with the "
                    f"same config or choose another out_dir"
                )
            done = log.completed_rounds()
            if exp.rounds < done:
                raise RunDirError(f"--resume: the run in {d} has completed {done} rounds and rounds = {exp.rounds} "
                                  f"would shrink it; a resume only extends a run (rounds >= {done})")
        elif has_results:
            raise RunDirError(
                f"run folder {d} already holds results; pass --resume to continue it, or set out_dir=... "
                f"(or name=...) to start a new one"
            )
        elif d.is_dir() and any(p.name not in ("data.npz", LOCK_NAME) for p in d.iterdir()) and not is_run_folder(d):
            # data.npz: the arrays a Python API run keeps beside its results (lowband.api.run);
            # the lock file: a run that stopped before it wrote anything
            names = sorted(p.name for p in d.iterdir() if p.name != LOCK_NAME)
            shown = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
            if all(re.fullmatch(r"seed-\d+", p.name) and p.is_dir() for p in d.iterdir()):
                # the seed layout (lowband reproduce, --seeds): seed N lives in d/seed-N, and a seed
                # started by hand before the config's own seed leaves d holding only seed folders
                raise RunDirError(f"run folder {d} holds only seed runs ({shown}), so this seed goes beside "
                                  f"them: add out_dir={d}/seed-{exp.seed} (what lowband reproduce does when "
                                  f"a config's folder holds seed folders and no run of its own)")
            raise RunDirError(f"run folder {d} is not empty and holds no lowband run ({shown}); lowband writes "
                              f"only into a new or empty folder, never over your files: choose another out_dir "
                              f"(or --out)")
        blocker = next((p for p in [d, *d.parents] if p.exists()), None)
        if blocker is not None and not blocker.is_dir():
            raise RunDirError(f"run folder {d}: cannot write there ({blocker} is a file); choose another out_dir "
                              f"(or --out)")
        return log

    def completed_rounds(self) -> int:
        """The last round this folder's metrics or timing record (0 when none)."""
        rounds = [int(r.get("round", 0)) for p in (self.metrics_path, self.timing_path)
                  for r in self.read_jsonl(p) if isinstance(r.get("round"), int)]
        return max(rounds, default=0)

    # -- writing (every file through the manifest) -----------------------------------
    def _manifest(self) -> Manifest:
        if self.manifest is None:  # a RunLog made without open(): writes into a folder it found
            self.manifest = Manifest.open(self.dir)
        return self.manifest

    def write_file(self, path: Path, text: str | bytes) -> None:
        """Replace ``path`` (a file of this run folder) atomically and record it in the manifest."""
        self._manifest().write_bytes(Path(path), text.encode() if isinstance(text, str) else text)

    def remove(self, path: Path) -> None:
        """Delete ``path`` (a file of this run folder) and its record."""
        self._manifest().remove(Path(path))

    # -- metrics -------------------------------------------------------------------
    def append(self, path: Path, rec: dict[str, Any]) -> None:
        self._manifest().append(Path(path), (dumps_record(rec) + "\n").encode())

    def log_metrics(self, rec: dict[str, Any]) -> None:
        self.append(self.metrics_path, rec)

    def log_timing(self, rec: dict[str, Any]) -> None:
        """A round's timing line, with the commit of the code that computed it (the run
        record's per-round commit, :func:`lowband.results.record.code_commit`)."""
        from lowband.results.record import code_commit

        self.append(self.timing_path, {**rec, "commit": code_commit()})

    @staticmethod
    def read_jsonl(path: Path) -> list[dict[str, Any]]:
        """The records of a run's JSON-lines log (metrics.jsonl, timing.jsonl; [] when absent)
        as lowband writes them: one object per line with an integer ``round``, rounds
        increasing, every value a number or null (``NaN``/``Infinity`` of older files read
        as null, as lowband writes them now). A torn last line (a kill mid-write: no newline
        after it) is left out, and a round logged twice with the same values counts once.
        Anything else raises :class:`DamagedLogError` naming the line: a bad line before the
        end must not make a run read as a shorter one (and a resume then cut the rounds
        after it), nor crash a report."""
        if not path.exists():
            return []
        try:
            text = path.read_bytes().decode()
        except IsADirectoryError:
            raise DamagedLogError(path, "a folder where the run wrote a file") from None
        except UnicodeDecodeError as exc:
            raise DamagedLogError(path, f"byte {exc.start} is not UTF-8") from None
        except OSError as exc:
            raise DamagedLogError(path, f"cannot be read: {exc.strerror or type(exc).__name__}") from None
        lines = text.splitlines()
        out: dict[int, dict[str, Any]] = {}
        for i, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                rec = _log_record(json.loads(line, parse_constant=lambda _: None))
            except json.JSONDecodeError:
                if i == len(lines) and not text.endswith("\n"):
                    break  # torn by a kill mid-write
                raise DamagedLogError(path, f"line {i} is not JSON") from None
            except ValueError as exc:
                raise DamagedLogError(path, f"line {i}: {exc}") from None
            r, last = rec["round"], next(reversed(out), None)
            if r in out and out[r] != rec:
                raise DamagedLogError(path, f"round {r} is logged twice with different values (line {i})")
            if r not in out and last is not None and r < last:
                raise DamagedLogError(path, f"round {r} comes after round {last} (line {i})")
            out.setdefault(r, rec)
        return list(out.values())

    def metrics(self) -> list[dict[str, Any]]:
        return self.read_jsonl(self.metrics_path)

    def truncate_after(self, round: int) -> None:
        """Drop metric/timing lines of rounds > ``round`` (used when resuming)."""
        for path in (self.metrics_path, self.timing_path):
            recs = [r for r in self.read_jsonl(path) if r.get("round", -1) <= round]
            self.write_file(path, "".join(dumps_record(r) + "\n" for r in recs))

    # -- checkpoint ----------------------------------------------------------------
    def save_checkpoint(self, state: dict[str, Any]) -> None:
        """Write the checkpoint durably: a temporary file, fsynced, renamed into place, and
        the folder fsynced, so a crash leaves either the old or the new checkpoint whole."""
        self._manifest().replace(self.ckpt_path, lambda w: torch.save(state, w), lambda: _tensor_bytes(state))

    def load_checkpoint(self) -> Optional[dict[str, Any]]:
        """The checkpoint (None: there is none), checked against the manifest first: a
        flipped byte that torch would still load is refused, not continued from."""
        if not self.ckpt_path.exists():
            return None
        check_folder(self.dir, names=["checkpoint.pt"])
        try:
            return torch.load(self.ckpt_path, map_location="cpu", weights_only=True)  # any device: moved by the run
        except Exception as exc:  # noqa: BLE001 - report any unreadable checkpoint in one line
            raise DamagedFileError(self.ckpt_path, f"unreadable checkpoint ({type(exc).__name__})",
                                   "restore it from a copy, or move the run folder away and run the config "
                                   "again (a new out_dir)") from None

    def check_no_hole(self, round: int) -> None:
        """Refuse a resume from a checkpoint of ``round`` when metrics.jsonl lacks an
        evaluated round up to it (its lines were cut): continuing would leave a hole."""
        want = _eval_rounds(self.dir, round)
        have = {int(r["round"]) for r in self.metrics()}
        missing = sorted(want - have)
        if missing:
            shown = ", ".join(map(str, missing[:5])) + (", ..." if len(missing) > 5 else "")
            raise DamagedLogError(self.metrics_path, f"the checkpoint is at round {round} and rounds {shown} are "
                                                     f"not logged")

    def write_summary(self, summary: dict[str, Any]) -> None:
        self.write_file(self.summary_path, json.dumps(clean(summary), indent=2, allow_nan=False) + "\n")

    def write_ledger(self, ledger: Any) -> None:
        """``ledger.csv``: every ledger record of the run (see :mod:`lowband.ledgerfile`)."""
        from lowband.ledgerfile import LEDGER_FILE, ledger_columns, ledger_csv_text

        self.write_file(self.dir / LEDGER_FILE, ledger_csv_text(ledger_columns(ledger)))


def _busy(d: Path, holder: str) -> str:
    return (f"run folder {d} is being written by another lowband process ({holder}); wait for it to end, "
            f"or choose another out_dir (or --out)")


def rounds_to_target(metrics: list[dict[str, Any]], key: str, target: Optional[float]) -> Optional[dict[str, Any]]:
    """First evaluated round whose ``key`` reaches ``target`` (:func:`reaches`), with the
    bytes spent by then."""
    if target is None:
        return None
    for rec in metrics:
        v = rec.get(key)
        if v is not None and reaches(key, v, target):
            return {"round": rec["round"], "bytes": rec.get("bytes/total"), "declared_bytes": rec.get("declared/total")}
    return None


def summarize(metrics: list[dict[str, Any]], *, main: str, target: Optional[float], extra: dict[str, Any]) -> dict[str, Any]:
    """final/best of every metric, rounds- and bytes-to-target of the main metric."""
    out: dict[str, Any] = dict(extra)
    out["main_metric"] = main
    out["target"] = target
    if metrics:
        last = metrics[-1]
        out["rounds_completed"] = last["round"]
        out["final"] = {k: v for k, v in last.items() if k != "round"}
        best: dict[str, Any] = {}
        for k in last:
            if "acc" in k and not k.endswith("_std"):
                vals = [(r.get(k), r["round"]) for r in metrics if r.get(k) is not None]
                if vals:
                    v, r = max(vals, key=lambda t: (t[0], -t[1]))
                    best[k] = {"value": v, "round": r}
        out["best"] = best
    hit = rounds_to_target(metrics, main, target)
    out["rounds_to_target"] = hit["round"] if hit else None
    out["bytes_to_target"] = hit["bytes"] if hit else None
    out["declared_bytes_to_target"] = hit["declared_bytes"] if hit else None
    return clean(out)


# --------------------------------------------------------------------------- checks on read

#: files a resume of a folder saved before manifests records as they are (checked structurally)
_UNRECORDED = ("hyperparams.json", "metrics.jsonl", "timing.jsonl", "summary.json", "ledger.csv", "checkpoint.pt")


def _tensor_bytes(state: Any) -> int:
    """About how many bytes ``state`` takes on disk (its tensors' sizes): the space a full disk lacked."""
    if isinstance(state, torch.Tensor):
        return state.numel() * state.element_size()
    if isinstance(state, dict):
        return sum(_tensor_bytes(v) for v in state.values())
    if isinstance(state, (list, tuple)):
        return sum(_tensor_bytes(v) for v in state)
    return 64


def _eval_settings(folder: Path) -> tuple[int, bool]:
    """(eval.every, eval.at_round0) of the run saved in ``folder`` (config.toml, defaults 1 and true)."""
    import tomllib

    ev = tomllib.loads((Path(folder) / "config.toml").read_text()).get("eval", {})
    every = ev.get("every", 1)
    return (every if isinstance(every, int) and every >= 1 else 1), bool(ev.get("at_round0", True))


def _eval_rounds(folder: Path, upto: int) -> set[int]:
    """The rounds up to ``upto`` a run logs whatever its length: every ``eval.every``-th (and 0)."""
    every, at0 = _eval_settings(folder)
    return set(range(every, upto + 1, every)) | ({0} if at0 else set())


def check_run(folder: Path) -> None:
    """Everything a reader of a run folder relies on, or :class:`DamagedFileError` (one line
    naming the file and what to do): the manifest's lengths and checksums
    (:func:`lowband.engine.runfiles.check_folder`), config.toml a TOML file, strict logs
    without a missing evaluated round, summary.json a JSON object whose last round is the
    log's, and ledger.csv's byte totals those of the summary. The structural checks also
    hold a folder saved before manifests existed to what it says of itself."""
    import tomllib

    d = Path(folder)
    # each file's own form first (the most precise line: "line 2 is not JSON"), then the
    # manifest (what only a checksum sees), then what the files say of each other
    cfg = d / "config.toml"
    if cfg.is_file():
        try:
            tomllib.loads(cfg.read_bytes().decode())
        except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
            raise DamagedFileError(cfg, f"not a TOML file: {str(exc).splitlines()[0][:80]}") from None
    elif any((d / n).exists() for n in ("metrics.jsonl", "summary.json", "checkpoint.pt")):
        raise DamagedFileError(cfg, "missing, while the folder holds a run's results")
    elif cfg.exists():
        raise DamagedFileError(cfg, "a folder or special file where the run wrote a file")
    hp = d / HYPERPARAMS_NAME
    if hp.exists() and saved_hyperparams(d) is None:
        raise DamagedFileError(hp, "it cannot be read as the run's hyperparameters, so whether a config continues "
                                   "the same run cannot be told")
    metrics = RunLog.read_jsonl(d / "metrics.jsonl")
    RunLog.read_jsonl(d / "timing.jsonl")
    check_folder(d)
    if metrics and cfg.is_file():
        every, _ = _eval_settings(d)
        rounds = [int(r["round"]) for r in metrics]
        for a, b in zip(rounds, rounds[1:]):
            if (b - 1) // every > a // every:  # a multiple of eval.every between them was not logged
                raise DamagedLogError(d / "metrics.jsonl", f"rounds {a} and {b} are logged and round "
                                                           f"{(a // every + 1) * every} between them is not")
    summary_path = d / "summary.json"
    if not summary_path.exists():
        return
    try:
        summary = json.loads(summary_path.read_bytes())
        if not isinstance(summary, dict):
            raise ValueError("not a JSON object")
    except (ValueError, UnicodeDecodeError) as exc:
        raise DamagedFileError(summary_path, f"not the JSON object lowband writes: {str(exc)[:80]}") from None
    done = summary.get("rounds_completed")
    if not metrics:
        raise DamagedFileError(d / "metrics.jsonl", "missing or empty, while summary.json says the run finished")
    if isinstance(done, int) and metrics[-1]["round"] != done:
        raise DamagedLogError(d / "metrics.jsonl", f"it ends at round {metrics[-1]['round']} while summary.json "
                                                   f"says the run completed round {done}")
    _check_ledger(d, summary)


def _check_ledger(d: Path, summary: dict[str, Any]) -> None:
    """ledger.csv parses and its totals per direction are those summary.json reports."""
    from lowband.ledgerfile import LEDGER_COLUMNS, LEDGER_FILE

    path = d / LEDGER_FILE
    if not path.exists():
        return
    import csv
    import io

    totals: dict[str, list[int]] = {}
    try:
        rows = csv.reader(io.StringIO(path.read_bytes().decode()))
        if tuple(next(rows, ())) != LEDGER_COLUMNS:
            raise ValueError("its header is not lowband's")
        for i, row in enumerate(rows, 2):
            if len(row) != len(LEDGER_COLUMNS):
                raise ValueError(f"line {i} has {len(row)} fields")
            t = totals.setdefault(row[3], [0, 0])
            t[0] += int(row[5])
            t[1] += int(row[6] or 0)
    except (ValueError, UnicodeDecodeError, csv.Error) as exc:
        raise DamagedFileError(path, str(exc)[:100]) from None
    for direction in ("up", "down", "peer"):
        want = summary.get(f"bytes_{direction}")
        got = totals.get(direction, [0, 0])[0]
        if isinstance(want, int) and want != got:
            raise DamagedFileError(path, f"its {direction} bytes add up to {got} and summary.json reports {want}")
