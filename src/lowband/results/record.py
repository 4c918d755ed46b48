"""The run record: the small, durable essence of a run folder, in JSON lines.

A run folder (config.toml, metrics.jsonl, timing.jsonl, ledger.csv, summary.json,
checkpoint.pt) is large and lives on one machine. Its record keeps what a published number
needs, and what it takes to tell whether another run is the same one:

* line 1, the header: ``{"record": 1, "kind": "measured", ...}`` with the resolved config
  (as saved, and the algorithm's hyperparameters with their defaults), its fingerprint (the
  digest :func:`fingerprint` of what makes two runs comparable), the seed, the lowband
  version, the commits that made its rounds, the machine, the CPU and wall-clock seconds and
  the summary;
* then one line per round that logged anything: ``{"round": r, "commit": ..., "metrics":
  {...}, "ledger": {"up/model": [bytes, declared], ...}, "cpu_s": ..., "round_s": ...,
  "eval_s": ...}``: the evaluation's metrics where the round was evaluated, the ledger's
  totals of the round by direction and kind, and the round's timing.

:func:`write_record` builds it from a finished or partial run folder's files and writes
``record.jsonl`` beside metrics.jsonl (``record.jsonl.gz`` when compressing pays, above
:data:`GZIP_ABOVE` bytes); :func:`read_record` reads either. ``lowband record import RUN``
does the same from the command line. The per-round commit comes from timing.jsonl
(:func:`code_commit`, logged with each round since the record exists); a round logged
before has none, and the header's ``commits`` says so (``null``)."""

from __future__ import annotations

import csv
import functools
import gzip
import hashlib
import json
import os
import platform
import subprocess
import typing
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

#: the record format's version (the header's ``record``)
FORMAT = 1
RECORD_NAME = "record.jsonl"
#: a record larger than this is written gzip-compressed (``record.jsonl.gz``)
GZIP_ABOVE = 256 * 1024


@functools.lru_cache(maxsize=None)
def code_commit() -> Optional[str]:
    """The git commit of the lowband source this process runs (``HASH``, or ``HASH+dirty``
    when its ``src/`` has uncommitted changes), None for an installed package outside a
    checkout. Read once a process: a run's rounds are computed by the code it started with."""
    src = Path(__file__).resolve().parents[2]  # .../src
    try:
        head = subprocess.run(["git", "-C", str(src), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(src), "status", "--porcelain", "--untracked-files=no", "--", "."],
                               capture_output=True, text=True, timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return f"{head}+dirty" if dirty else head or None


def machine() -> dict[str, Any]:
    """The machine this process runs on: CPU model, logical CPUs, torch version and threads,
    Python, OS."""
    import torch

    model = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": model, "cpus": os.cpu_count(), "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
            "python": platform.python_version(), "os": platform.system()}


def fingerprint(config_toml: str, hyperparams: Optional[dict[str, Any]] = None) -> str:
    """A short digest of what makes runs of a config comparable: the config with every
    hyperparameter resolved, less what a resume may change (rounds, device, where it runs;
    :func:`lowband.engine.runlog._comparable`), the seed and the output folder."""
    from lowband.engine.runlog import _comparable

    d = json.loads(_comparable(config_toml, hyperparams))
    for key in ("seed", "out_dir", "name"):
        d.pop(key, None)
    algorithm = d.pop("algorithm", None)  # the resolved hyperparameters: compared whole
    d = _without_defaults(d, _schema_defaults())
    if algorithm is not None:
        d["algorithm"] = algorithm
    return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:12]


def _model_class(annotation: Any) -> Optional[type]:
    """The pydantic model a config field holds (through Optional/Union), else None."""
    from pydantic import BaseModel

    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _model_class(arg)
        if found is not None:
            return found
    return None


def _defaults_of(model: type) -> dict[str, Any]:
    """field -> its default as JSON (a nested section: a dict of its own fields' defaults)."""
    out: dict[str, Any] = {}
    for name, field in model.model_fields.items():  # type: ignore[attr-defined]
        sub = _model_class(field.annotation)
        if sub is not None:
            out[name] = _Section(_defaults_of(sub))
        elif not field.is_required():
            try:
                out[name] = json.loads(json.dumps(field.get_default(call_default_factory=True)))
            except TypeError:  # a default JSON cannot hold: never equal to a saved value
                continue
    return out


@functools.lru_cache(maxsize=1)
def _schema_defaults() -> dict[str, Any]:
    from lowband.config.schema import Experiment

    return _defaults_of(Experiment)


def _without_defaults(d: dict[str, Any], defaults: dict[str, Any]) -> dict[str, Any]:
    """``d`` less every key whose value is today's schema default, recursively: a key added to
    the schema later (written with its default by newer code, absent from older configs)
    leaves the fingerprint as it was, so records made before it still compare equal."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        dv = defaults.get(k, _MISSING)
        if isinstance(v, dict) and isinstance(dv, _Section):
            v = _without_defaults(v, dv)
            if not v:
                continue
        elif dv is not _MISSING and v == dv:
            continue
        out[k] = v
    return out


_MISSING = object()


class _Section(dict):  # type: ignore[type-arg]
    """The defaults of a config section (a model): compared key by key, unlike a dict value."""


def _ledger_rounds(path: Path) -> dict[int, dict[str, list[int]]]:
    """round -> {"direction/kind": [bytes, declared]} summed over ``ledger.csv``'s rows."""
    out: dict[int, dict[str, list[int]]] = defaultdict(dict)
    if not path.is_file():
        return out
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            key = f"{row['direction']}/{row['kind']}"
            tot = out[int(row["round"])].setdefault(key, [0, 0])
            tot[0] += int(row["bytes"])
            tot[1] += int(row["declared"])
    return out


def ledger_rounds(ledger: Any) -> dict[int, dict[str, list[int]]]:
    """:func:`_ledger_rounds` of a ledger in memory (what ledger.csv will hold)."""
    from lowband.ledgerfile import ledger_columns

    c = ledger_columns(ledger)
    out: dict[int, dict[str, list[int]]] = defaultdict(dict)
    for r, di, k, b, de in zip(*(c[x].tolist() for x in ("round", "direction", "kind", "bytes", "declared"))):
        tot = out[int(r)].setdefault(f"{di}/{k}", [0, 0])
        tot[0] += int(b)
        tot[1] += int(de)
    return out


def _round_lines(metrics: dict[int, dict], timing: dict[int, dict],
                 ledger: dict[int, dict[str, list[int]]]) -> list[dict[str, Any]]:
    """One line per round that logged anything: its commit, metrics, ledger totals, timing."""
    rounds = []
    for r in sorted(set(metrics) | set(timing) | set(ledger)):
        t = timing.get(r, {})
        line: dict[str, Any] = {"round": r, "commit": t.get("commit")}
        if r in metrics:
            line["metrics"] = {k: v for k, v in metrics[r].items() if k != "round"}
        if ledger.get(r):
            line["ledger"] = dict(sorted(ledger[r].items()))
        line.update({k: t[k] for k in ("cpu_s", "round_s", "eval_s", "workers") if k in t})
        rounds.append(line)
    return rounds


def build_record(run_dir: Path, *, kind: str = "measured", machine_of: str = "run",
                 ledger: Optional[dict[int, dict[str, list[int]]]] = None,
                 summary: Optional[dict[str, Any]] = None) -> list[dict[str, Any]]:
    """The record of ``run_dir`` as a list of JSON objects (header first). ``machine_of``:
    ``"run"`` when the process that made the run writes it (the machine is the run's), else
    ``"import"`` (the machine is the importer's; the run's own is not known). ``ledger``
    (:func:`ledger_rounds`) and ``summary``: what the run holds in memory and has not written
    yet (a run's own record, written before ledger.csv and summary.json), instead of the files."""
    import tomllib

    from lowband.version import __version__
    from lowband.engine.runlog import RunLog, saved_hyperparams

    rd = Path(run_dir)
    cfg_path = rd / "config.toml"
    if not cfg_path.is_file():
        raise FileNotFoundError(f"{cfg_path}: not a run folder (no config.toml); give the folder a run wrote")
    toml_text = cfg_path.read_text()
    config = tomllib.loads(toml_text)
    hyper = saved_hyperparams(rd)
    metrics = {int(m["round"]): m for m in RunLog.read_jsonl(rd / "metrics.jsonl")}
    timing = {int(t["round"]): t for t in RunLog.read_jsonl(rd / "timing.jsonl")}
    if ledger is None:
        ledger = _ledger_rounds(rd / "ledger.csv")
    if summary is None:
        summary = json.loads((rd / "summary.json").read_text()) if (rd / "summary.json").is_file() else {}
    rounds = _round_lines(metrics, timing, ledger)
    cpu = [t.get("cpu_s") for t in timing.values()]
    header = {
        "record": FORMAT, "kind": kind, "name": config.get("name"), "seed": int(config.get("seed", 0)),
        "fingerprint": fingerprint(toml_text, hyper), "lowband": __version__,
        "commits": sorted({str(x["commit"]) for x in rounds if x.get("commit")}) + (
            [None] if any(not x.get("commit") for x in rounds if x["round"] in timing) else []),
        "machine": {**machine(), "of": machine_of}, "device": str(config.get("device", "cpu")),
        "threads": config.get("threads"),
        "rounds_planned": int(config.get("rounds", 0)), "rounds_done": max(metrics, default=0),
        "cpu_s": round(sum(c for c in cpu if c is not None), 3) if cpu and None not in cpu else None,
        "wall_s": round(sum((t.get("round_s") or 0) + (t.get("eval_s") or 0) for t in timing.values()), 3),
        "config": config, "hyperparams": hyper, "summary": summary,
    }
    return [header, *rounds]


def dumps(lines: list[dict[str, Any]]) -> str:
    """The record's text: one strict JSON object a line."""
    from lowband.engine.runlog import dumps_record

    return "".join(dumps_record(x) + "\n" for x in lines)


def save(lines: list[dict[str, Any]], path: Path) -> Path:
    """Write a record to ``path`` (``.gz`` appended when it is larger than
    :data:`GZIP_ABOVE`; an older copy under the other name is removed), atomically."""
    from lowband.engine.runlog import _atomic_write_bytes

    data = dumps(lines).encode()
    path = Path(str(path).removesuffix(".gz"))
    gz = Path(f"{path}.gz")
    final, other = (gz, path) if len(data) > GZIP_ABOVE else (path, gz)
    path.parent.mkdir(parents=True, exist_ok=True)
    _atomic_write_bytes(final, gzip.compress(data, mtime=0) if final is gz else data)
    if other.exists():
        other.unlink()
    return final


def write_record(run_dir: Path | str, *, machine_of: str = "run", **state: Any) -> Path:
    """Build ``run_dir``'s record from its files (and ``state``: the ``ledger`` and ``summary``
    of :func:`build_record`) and write it there as ``record.jsonl`` (or ``record.jsonl.gz``);
    returns the path. What every run does at its end and, for a partial record, now and then
    after a checkpoint (:class:`lowband.engine.observers.record.RecordWriter`)."""
    return save(build_record(Path(run_dir), machine_of=machine_of, **state), Path(run_dir) / RECORD_NAME)


@dataclass
class Record:
    """A record read back: its header and its round lines."""

    header: dict[str, Any]
    rounds: list[dict[str, Any]] = field(default_factory=list)
    path: Optional[Path] = None

    @property
    def kind(self) -> str:
        return str(self.header.get("kind", "measured"))

    @property
    def seed(self) -> int:
        return int(self.header.get("seed", 0))

    @property
    def metrics(self) -> list[dict[str, Any]]:
        """metrics.jsonl as it was: the evaluated rounds' metrics with their ``round``."""
        return [{"round": x["round"], **x["metrics"]} for x in self.rounds if "metrics" in x]

    @property
    def timing(self) -> list[dict[str, Any]]:
        """timing.jsonl as far as the record keeps it (the rounds with a time)."""
        keys = ("cpu_s", "round_s", "eval_s", "workers")
        return [{"round": x["round"], **{k: x[k] for k in keys if k in x}} for x in self.rounds
                if "round_s" in x or "cpu_s" in x]

    def commit_of(self, round: int) -> Optional[str]:
        """The commit that made ``round`` (None: not recorded)."""
        return next((x.get("commit") for x in self.rounds if x["round"] == round), None)

    @property
    def commits(self) -> list[Optional[str]]:
        return list(self.header.get("commits") or [])


def loads(text: str, path: Optional[Path] = None) -> Record:
    """A record from its text (ValueError naming what is wrong)."""
    lines = [json.loads(x) for x in text.splitlines() if x.strip()]
    if not lines or not isinstance(lines[0], dict) or lines[0].get("record") != FORMAT:
        raise ValueError(f"{path or 'text'}: not a lowband record (format {FORMAT}): its first line must be the header")
    return Record(lines[0], lines[1:], path)


def read_record(path: Path | str) -> Record:
    """The record at ``path`` (``.jsonl`` or ``.jsonl.gz``)."""
    p = Path(path)
    data = p.read_bytes()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    return loads(data.decode(), p)
