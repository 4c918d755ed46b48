"""Markdown tables of docs/results/privacy.md from a grid's run folders (``grid.jsonl`` and
each cell's metrics), and the committed records: copies each cell's ``record.jsonl`` into
``docs/results/records/privacy/<cell>/``.

    python experiments/privacy/render.py RUNS_DIR [--targets 0.5,0.6,0.7] [--store docs/results/records/privacy]
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path


def bytes_to(curve: list, target: float):
    for rnd, acc, up, _ in curve:
        if acc is not None and acc >= target:
            return up, rnd
    return None, None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("runs", type=Path)
    ap.add_argument("--targets", default="0.5,0.6,0.7")
    ap.add_argument("--store", type=Path, default=None)
    a = ap.parse_args()
    targets = [float(t) for t in a.targets.split(",")]
    cells = [json.loads(x) for x in (a.runs / "grid.jsonl").read_text().splitlines()]
    head = "| epsilon | codec | aggregation | z | final acc % | best acc % | uplink bytes | epsilon spent | " + \
        " | ".join(f"bytes to {t:.0%}" for t in targets) + " |"
    print(head)
    print("|" + "---|" * (8 + len(targets)))
    for c in cells:
        eps = "inf" if c["epsilon_target"] is None else f"{c['epsilon_target']:g}"
        agg = "SecAgg" if c["secagg"] else "plain"
        if c["status"] != "ok":
            print(f"| {eps} | {c['codec']} | {agg} | {c.get('status')}: {c.get('reason', '')} |")
            continue
        z = "-" if c["z"] is None else f"{c['z']:g}"
        spent = "-" if c.get("epsilon") is None else f"{c['epsilon']:.2f}"
        btt = []
        for t in targets:
            b, r = bytes_to(c["curve"], t)
            btt.append("-" if b is None else f"{b:,} (r{r})")
        print(f"| {eps} | {c['codec']} | {agg} | {z} | {100 * c['acc']:.1f} | {100 * c['best']:.1f} | "
              f"{c['bytes_up']:,} | {spent} | " + " | ".join(btt) + " |")
        if a.store is not None:
            rec = a.runs / c["cell"] / "record.jsonl"
            for r in (rec, rec.with_suffix(".jsonl.gz")):
                if r.exists():
                    dst = a.store / c["cell"]
                    dst.mkdir(parents=True, exist_ok=True)
                    shutil.copy(r, dst / r.name)
    # epsilon per round (the accountant's track, the same for every codec of a target)
    print()
    for c in cells:
        if c["status"] == "ok" and c.get("epsilon") is not None and c["codec"] == "fp32":
            pts = [(r, e) for r, _, _, e in c["curve"] if e is not None]
            show = [p for p in pts if p[0] in (5, 10, 25, 50, 100)]
            print(f"{c['cell']}: " + ", ".join(f"r{r} {e:.3g}" for r, e in show))


if __name__ == "__main__":
    main()
