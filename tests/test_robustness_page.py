"""docs/results/robustness.md's tables are rendered from the results store (the records
under docs/results/records/robustness/, by experiments/robustness/render.py): every table
the store gives is on the page verbatim, and the page has no table row the store does not
give."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _render() -> str:
    spec = importlib.util.spec_from_file_location("robustness_render", ROOT / "experiments/robustness/render.py")
    mod = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(mod)
    return mod.tables(ROOT / "docs/results/records")


def test_the_pages_tables_are_the_stores() -> None:
    rendered = _render()
    page = (ROOT / "docs/results/robustness.md").read_text()
    blocks = [b.strip() for b in rendered.split("\n\n\n")] if "\n\n\n" in rendered else None
    # one block per table: its caption line, a blank line, the table
    lines = rendered.splitlines()
    starts = [i for i, x in enumerate(lines) if x and not x.startswith("|") and i + 2 < len(lines)
              and lines[i + 2].startswith("| attack")]
    blocks = ["\n".join(lines[s:(starts[j + 1] - 1 if j + 1 < len(starts) else len(lines))]).strip()
              for j, s in enumerate(starts)]
    assert len(blocks) >= 2
    for b in blocks:
        assert b in page, b.splitlines()[0]
    store_rows = {x for x in lines if x.startswith("|")}
    page_rows = [x for x in page.splitlines() if x.startswith("| ")]
    assert page_rows and all(x in store_rows for x in page_rows), [x for x in page_rows if x not in store_rows][:3]


def _records() -> list:
    from lowband.results.record import read_record

    spec = importlib.util.spec_from_file_location("robustness_render", ROOT / "experiments/robustness/render.py")
    mod = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(mod)
    out = []
    for folder in sorted((ROOT / "docs/results/records/robustness").iterdir()):
        rec = read_record(next(folder.glob("seed-*.jsonl*")))
        out.append((mod.parse(folder.name), rec.metrics[-1], rec.header["summary"]))
    return out


def _acc(m: dict) -> float:
    return m.get("global/acc", m.get("honest/consensus/acc", m.get("consensus/acc")))


def test_issue_40s_attacks_are_each_defended_and_named() -> None:
    """The digits re-try (experiments/robustness/retry.py): every attack is brought to within
    5 points of its algorithm's clean run by at least one rule (its backdoor, if any, below
    5%), and every undefended attacked run's summary names the attack it suffered."""
    recs = [r for r in _records() if r[0]["set"] == "digits"]
    for alg in ("fedavg", "dfedavg"):
        mine = [r for r in recs if r[0]["algorithm"] == alg]
        clean = next(_acc(m) for p, m, _ in mine if p["attack"] == "none" and p["defence"] == "none")
        attacks = {p["attack"] for p, _, _ in mine if p["attack"] != "none"}
        assert len(attacks) == 7, attacks
        for a in attacks:
            best = [m for p, m, _ in mine if p["attack"] == a and p["defence"] != "none"
                    and _acc(m) >= clean - 0.05 and m.get("attack/backdoor_acc", 0.0) < 0.05]
            assert best, (alg, a)
            (summary,) = [s for p, _, s in mine if p["attack"] == a and p["defence"] == "none"]
            assert summary["attack"]["kind"] == a.split("_scale")[0].split("_on")[0] and summary["attack"]["nodes"] == [3]
            assert summary["aggregation"] == "none"
