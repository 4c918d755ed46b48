"""The results store: the records behind a paper's published numbers, committed with the
pages (``docs/results/records/<paper>/``).

* ``<config>/seed-<s>.jsonl`` (or ``.jsonl.gz``): the measured record of the run of
  ``experiments/<paper>/<config>.toml`` with seed ``s`` (:mod:`lowband.results.record`);
  :meth:`Store.put` adds or replaces it, noting in its header (``code_change``) how the code
  that made it differs from the code of the config's other records in the store (commits,
  files and lines changed under ``src/``), so a table never mixes runs of different code
  without saying so.
* ``imported.jsonl``: values published before their run folders could be recorded, one line
  per table cell, under a header that names where they come from (``provenance``: the page
  and the commit it was read at). A table shows them as imported, never as measured.

Nothing here reads Markdown: pages are rendered from the store, not the other way round."""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from lowband.results.record import Record, build_record, read_record, save

IMPORTED = "imported.jsonl"


def default_root() -> Path:
    """``docs/results/records`` in a checkout (the current folder holds ``docs/results``),
    else ``results/records``."""
    return Path("docs/results/records") if Path("docs/results").is_dir() else Path("results/records")


@dataclass(frozen=True)
class Imported:
    """One published cell value whose run folders are gone: the text the page printed
    (``ours``, ``rounds``), the page's *run* column, its seeds' texts and the CPU-hours the
    page recorded for it (None: not recorded), with where it was read (``provenance``)."""

    cell: str
    config: str
    ours: str
    rounds: str
    run: str
    seeds: dict[str, str]
    cpu_h: Optional[float]
    provenance: dict[str, str]
    seeds_list: Optional[list[int]] = None
    fingerprint: Optional[str] = None


def _shortstat(a: str, b: str) -> Optional[str]:
    """``git diff --shortstat A B -- src`` of the lowband checkout (None: unknown here)."""
    src = Path(__file__).resolve().parents[2]
    try:
        out = subprocess.run(["git", "-C", str(src), "diff", "--shortstat", a.split("+")[0], b.split("+")[0], "--",
                              "."], capture_output=True, text=True, timeout=30, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return out or "no change under src/"


class Store:
    """The records of one paper under ``root/<paper>/``."""

    def __init__(self, root: Path | str, paper: str):
        self.root = Path(root)
        self.paper = paper
        self.dir = self.root / paper

    @staticmethod
    def key(config: str) -> str:
        """A config's folder in the store: its file's stem (``fmnist_dir0.3_fedavg``)."""
        return Path(config).stem

    def records(self, config: str, *, imported: bool = False) -> dict[int, Record]:
        """seed -> measured record of ``config`` in the store (with ``imported``, also the
        records imported from an earlier page, header ``kind = "imported"``: a table that
        shows them must say so)."""
        folder = self.dir / self.key(config)
        out: dict[int, Record] = {}
        for p in sorted(folder.glob("seed-*.jsonl*")) if folder.is_dir() else []:
            rec = read_record(p)
            if imported or rec.kind == "measured":
                out[rec.seed] = rec
        return dict(sorted(out.items()))

    def imported(self) -> dict[str, Imported]:
        """cell id -> its imported value (empty without ``imported.jsonl``)."""
        path = self.dir / IMPORTED
        if not path.is_file():
            return {}
        lines = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
        prov = lines[0]["provenance"]
        return {x["cell"]: Imported(x["cell"], x["config"], x["ours"], x["rounds"], x["run"], x.get("seeds") or {},
                                    x.get("cpu_h"), prov, x.get("seed_list"), x.get("fingerprint"))
                for x in lines[1:]}

    def put(self, config: str, run_dir: Path, *, machine_of: str = "run") -> Path:
        """Record the run in ``run_dir`` as ``config``'s record of its seed, replacing the one
        there; the header's ``code_change`` says, for each other commit among the config's
        records (and the one replaced), how much ``src/`` differs from this run's code."""
        lines = build_record(Path(run_dir), machine_of=machine_of)
        head = lines[0]
        mine = [c for c in head["commits"] if c]
        others = {c for r in self.records(config).values() for c in r.commits if c}
        change = {}
        for c in sorted(others - set(mine)):
            change[c] = _shortstat(c, mine[0]) if mine else None
        if change:
            head["code_change"] = change
        return save(lines, self.dir / self.key(config) / f"seed-{head['seed']}.jsonl")

    def put_record(self, config: str, lines: list[dict[str, Any]]) -> Path:
        """Store an already built record (a test's, or one read elsewhere) as ``config``'s."""
        return save(lines, self.dir / self.key(config) / f"seed-{lines[0]['seed']}.jsonl")
