"""Render the robustness table (Markdown) from a results.jsonl of digits.py / grid.py.

Usage: python experiments/robustness/render.py docs/results/robustness-digits.jsonl
Server methods: global accuracy (%), and the backdoor accuracy after a slash where the
attack has one; peer methods: the honest nodes' consensus accuracy (the plain consensus,
which averages the attacker in, in brackets)."""

from __future__ import annotations

import json
import sys
from collections import defaultdict


def cell(m: dict) -> str:
    if "global/acc" in m:
        s = f"{100 * m['global/acc']:.1f}"
    elif "honest/consensus/acc" in m:
        s = f"{100 * m['honest/consensus/acc']:.1f} ({100 * m['consensus/acc']:.1f})"
    else:
        s = f"{100 * m['consensus/acc']:.1f}"
    if "attack/backdoor_acc" in m:
        s += f" / bd {100 * m['attack/backdoor_acc']:.1f}"
    return s


def main() -> None:
    rows = [json.loads(line) for line in open(sys.argv[1])]
    by_alg: dict[str, dict] = defaultdict(lambda: defaultdict(dict))
    defences: dict[str, list[str]] = defaultdict(list)
    for r in rows:
        by_alg[r["algorithm"]][r["attack"]][r["defence"]] = r["metrics"]
        if r["defence"] not in defences[r["algorithm"]]:
            defences[r["algorithm"]].append(r["defence"])
    for alg, table in by_alg.items():
        ds = defences[alg]
        print(f"\n{alg}\n")
        print("| attack | " + " | ".join(ds) + " |")
        print("|---" * (len(ds) + 1) + "|")
        for attack, per in table.items():
            print(f"| {attack} | " + " | ".join(cell(per[d]) if d in per else "" for d in ds) + " |")


if __name__ == "__main__":
    main()
