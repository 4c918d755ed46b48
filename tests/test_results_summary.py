"""docs/results/README.md quotes the generated tables, not numbers typed from memory.

The summary page's "Headline cells" table is what a reviewer reads first; its `lowband`
column must be the value a results table holds (rendered from the store by `lowband
reproduce PAPER --render`, or KTA's ``experiments/kta/write_table.py``), with the seed count
the table records. A headline retyped by hand drifts from the table when a seed lands (an
audit on 2026-11-28 found such drift in the prose of the pages); this test fails when a
mean ± std, or a single-seed value, has no matching cell.
"""

from __future__ import annotations

import re
from pathlib import Path

RESULTS = Path(__file__).resolve().parent.parent / "docs" / "results"

MEAN_STD = re.compile(r"^(\d+\.\d+) ± (\d+\.\d+)$")
SINGLE = re.compile(r"^(\d+\.\d+)$")


def _tables_text() -> str:
    """Every generated table on the results pages, with KTA's ``+-`` written as ``±``."""
    files = sorted(RESULTS.glob("*_table.md")) + [RESULTS / "kta_vs_summary.md"]
    return "\n".join(f.read_text() for f in files).replace(" +- ", " ± ")


def headline_rows(text: str) -> list[dict[str, str]]:
    """The rows of the page's "Headline cells" table as {column: cell}."""
    section = text.split("## Headline cells", 1)[1].split("\n## ", 1)[0]
    lines = [ln for ln in section.splitlines() if ln.startswith("|")]
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    rows = []
    for ln in lines[2:]:
        cells = [c.strip() for c in ln.strip("|").split("|")]
        rows.append(dict(zip(head, cells)))
    return rows


def quoted_values(row: dict[str, str]) -> list[tuple[str, int]]:
    """(the text a table must hold, the seeds) for each checkable part of the row's
    ``lowband`` cell: ``m ± s`` must appear as ``m ± s (n=K`` (``(n=K)``, or ``(n=K of N)``
    while seeds are missing), a single value of a 1-seed row as ``v (n=1``. Other parts
    (``> 30``, a byte percentage) are not table values."""
    parts = [p.strip() for p in row["lowband"].split(" / ")]
    seeds = [s.strip() for s in row["seeds"].split(" / ")]
    out = []
    for i, part in enumerate(parts):
        n = int(seeds[min(i, len(seeds) - 1)])
        if m := MEAN_STD.match(part):
            out.append((f"{m.group(1)} ± {m.group(2)} (n={n}", n))
        elif (m := SINGLE.match(part)) and n == 1:
            out.append((f"{m.group(1)} (n=1", n))
    return out


def test_headline_numbers_are_the_tables_numbers() -> None:
    rows = headline_rows((RESULTS / "README.md").read_text())
    assert len(rows) >= 8, "the Headline cells table was not found"
    tables = _tables_text()
    checked, missing = 0, []
    for row in rows:
        for text, _ in quoted_values(row):
            checked += 1
            if text not in tables:
                missing.append(f"{row['cell']}: {text!r}")
    assert not missing, "headline values with no matching table cell: " + "; ".join(missing)
    assert checked >= 10  # the check reads the numbers, not an empty table


def test_a_retyped_headline_is_caught() -> None:
    """The check fails on a value or a seed count that no table holds."""
    tables = _tables_text()
    good = {"cell": "x", "lowband": "79.95 ± 0.49 / > 30", "seeds": "3"}
    assert [t for t, _ in quoted_values(good)] == ["79.95 ± 0.49 (n=3"]
    assert all(t in tables for t, _ in quoted_values(good))
    for bad in ({"cell": "x", "lowband": "79.95 ± 0.48", "seeds": "3"},
                {"cell": "x", "lowband": "79.95 ± 0.49", "seeds": "2"}):
        assert not all(t in tables for t, _ in quoted_values(bad))
