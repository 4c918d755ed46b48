#!/usr/bin/env python
"""The tables of docs/results/natural.md from the Shakespeare run folders: accuracy at each
evaluated round against cumulative uplink bytes and against simulated time on LTE and on
NB-IoT, the link time replayed from each run's ledger.csv with lowband.comm.links (the
presets' rates, frames and latency; local compute not counted: the links alone).

Usage (from the repository root): python experiments/natural/summarise.py [runs/natural] [NAME ...]
(the run folders' names under the root; by default the four 1-epoch runs).
"""

from __future__ import annotations

import csv
import json
import sys
from collections import defaultdict
from pathlib import Path

from lowband.comm.links import PRESETS, LinkModel, format_seconds

RUNS = ("shakespeare_fedavg", "shakespeare_fedavg_qsgd4", "shakespeare_fedavg_ef_topk", "shakespeare_fedadam")
LINKS = ("lte", "nbiot")


def link_times(ledger: Path, preset: str) -> dict[int, float]:
    """Cumulative simulated seconds at the end of each round."""
    rows: dict[int, list[tuple[int, int, str, int]]] = defaultdict(list)
    with open(ledger, newline="") as f:
        for r in csv.DictReader(f):
            rows[int(r["round"])].append((int(r["src"]), int(r["dst"]), r["direction"],
                                          int(r["bytes"]) + int(r["declared"])))
    model, t, out = LinkModel(PRESETS[preset]), 0.0, {0: 0.0}
    for rnd in sorted(rows):
        clock = model.clock(t, rnd)
        for src, dst, direction, nbytes in rows[rnd]:
            clock.transfer(src, dst, direction, nbytes)
        t += clock.round_s
        out[rnd] = t
    return out


def uplink(ledger: Path) -> dict[int, int]:
    per: dict[int, int] = defaultdict(int)
    with open(ledger, newline="") as f:
        for r in csv.DictReader(f):
            if r["direction"] == "up":
                per[int(r["round"])] += int(r["bytes"]) + int(r["declared"])
    out, total = {0: 0}, 0
    for rnd in sorted(per):
        total += per[rnd]
        out[rnd] = total
    return out


def main() -> int:
    root = Path(sys.argv[1] if len(sys.argv) > 1 else "runs/natural")
    names = tuple(sys.argv[2:]) or RUNS
    print("| run | round | global acc | global loss | uplink (MB) | LTE time | NB-IoT time |")
    print("|---|---|---|---|---|---|---|")
    for name in names:
        run = root / name
        if not (run / "metrics.jsonl").is_file():
            print(f"| {name} | - | not run | | | | |")
            continue
        up = uplink(run / "ledger.csv")
        times = {p: link_times(run / "ledger.csv", p) for p in LINKS}
        for line in (run / "metrics.jsonl").read_text().splitlines():
            rec = json.loads(line)
            r = int(rec["round"])
            if "global/acc" not in rec or r not in up:
                continue
            print(f"| {name} | {r} | {100 * rec['global/acc']:.2f}% | {rec.get('global/loss', float('nan')):.3f} | {up[r] / 1e6:.2f} | "
                  f"{format_seconds(times['lte'].get(r, 0.0))} | {format_seconds(times['nbiot'].get(r, 0.0))} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
