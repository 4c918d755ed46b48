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
