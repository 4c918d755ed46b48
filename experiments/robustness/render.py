"""Render the robustness tables of docs/results/robustness.md from the results store.

Usage: python experiments/robustness/render.py [ROOT]   (ROOT: docs/results/records)

Reads every record under ROOT/robustness/ (one per cell, named by experiments/robustness/
grid.py: ``<set>-<algorithm>-<attack>[-f<percent>]-<defence>-<codec>``) and prints one
Markdown table per (set, algorithm, attackers' share, codec). Server methods: global
accuracy (%), peer methods: the honest nodes' consensus accuracy (the plain consensus,
which averages the attackers in, in brackets); ``bd``: backdoor accuracy; ``rej``:
messages the receivers' screen refused. The tables on the page are this output, checked by
tests/test_robustness_page.py.
"""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

from lowband.results.record import read_record

DEFENCE_ORDER = ["none", "median", "trimmed_mean", "multikrum", "centered_clipping", "bridge", "self_clipping"]
CODEC_NAMES = {"fp32": "fp32", "qsgd4": "qsgd(4)", "eftopk001": "ef(topk(0.01))"}


def parse(name: str) -> dict[str, Any]:
    """A cell's name as its parts (see the module docstring)."""
    parts = name.split("-")
    share = next((p for p in parts[3:-2] if p.startswith("f") and p[1:].isdigit()), None)
    return {"set": parts[0], "algorithm": parts[1], "attack": parts[2], "share": int(share[1:]) if share else None,
            "defence": parts[-2], "codec": CODEC_NAMES.get(parts[-1], parts[-1])}


def cell(m: dict[str, Any]) -> str:
    if "global/acc" in m:
        s = f"{100 * m['global/acc']:.1f}"
    elif "honest/consensus/acc" in m:
        s = f"{100 * m['honest/consensus/acc']:.1f} ({100 * m['consensus/acc']:.1f})"
    else:
        s = f"{100 * m['consensus/acc']:.1f}"
    if "attack/backdoor_acc" in m:
        s += f" / bd {100 * m['attack/backdoor_acc']:.1f}"
    rej = sum(int(v) for k, v in m.items() if k.startswith("rejected/"))
    if rej:
        s += f" (rej {rej})"
    return s


def load(root: Path) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    out = []
    for folder in sorted((root / "robustness").iterdir()):
        recs = sorted(folder.glob("seed-*.jsonl*"))
        if recs:
            out.append((parse(folder.name), read_record(recs[0]).metrics[-1]))
    return out


def tables(root: Path) -> str:
    """Every table, as Markdown, in a fixed order."""
    cells = load(root)
    groups: dict[tuple, dict[str, dict[str, dict]]] = defaultdict(lambda: defaultdict(dict))
    bytes_of: dict[tuple, int] = {}
    for p, m in cells:
        key = (p["set"], p["algorithm"], p["codec"])
        groups[key][p["attack"] + (f" ({p['share']}%)" if p["share"] else "")][p["defence"]] = m
        if p["defence"] == "none" and p["attack"] == "none":
            bytes_of[key] = int(m["bytes/total"])
    lines: list[str] = []
    codec_rank = {c: i for i, c in enumerate(CODEC_NAMES.values())}
    for key in sorted(groups, key=lambda k: (k[0], k[1], codec_rank.get(k[2], 9))):
        rows = groups[key]
        ds = [d for d in DEFENCE_ORDER if any(d in r for r in rows.values())]
        total = bytes_of.get(key)
        lines += ["", f"{key[0]}, {key[1]}, {key[2]}" + (f" ({total:,} bytes a run)" if total else ""), ""]
        lines += ["| attack | " + " | ".join(ds) + " |", "|---" * (len(ds) + 1) + "|"]
        order = sorted(rows, key=lambda a: (a != "none", a.split(" ")[0], a))
        for a in order:
            lines.append(f"| {a} | " + " | ".join(cell(rows[a][d]) if d in rows[a] else "" for d in ds) + " |")
    return "\n".join(lines).lstrip("\n") + "\n"


def main() -> None:
    print(tables(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("docs/results/records")), end="")


if __name__ == "__main__":
    main()
