"""The project speaks of its history in its own terms: commits, dates and versions. Work
sessions and their numbering ("stop 25", "this session", "earlier stops") mean nothing to
a reader, so no page, config comment or code comment may use them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: "stop 25", "stops 31-33", "stop-35", "Stop\n36", "this session", "earlier stops", "a stop's"
PATTERN = re.compile(r"\b[Ss]tops?[\s-]+\d+\b|\b[Ss]essions?\b|\b(?:earlier|later|this|that|each|previous|next|"
                     r"an?)\s+stops?\b(?!\s+(?:it|the|them|a|when|at|with|learning|collecting|before))")


def hits(top: str) -> list[str]:
    """``file:line: text`` of every such reference under ``top`` (text files)."""
    out = []
    for p in sorted((ROOT / top).rglob("*")):
        if not p.is_file() or p.suffix not in (".md", ".py", ".toml", ".txt", ".rst") or "records" in p.parts:
            continue
        text = p.read_text(errors="replace")
        for m in PATTERN.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            out.append(f"{p.relative_to(ROOT)}:{line}: {m.group(0)!r}")
    return out


@pytest.mark.parametrize("top", ["docs", "experiments"])
def test_no_work_session_references(top: str) -> None:
    assert hits(top) == []


def test_no_work_session_references_in_src() -> None:
    assert hits("src") == []


def test_the_pattern_finds_what_it_must() -> None:
    for bad in ("stop 25", "stops 31-33", "Stop\n36", "its stop-35 folder", "this session", "earlier stops",
                "an earlier stop, the same"):
        assert PATTERN.search(bad), bad
    for fine in ("stops the run with exit status 2", "ray stop", "the model stops learning", "early-stops",
                 "commit 987e402 (2026-11-28)"):
        assert not PATTERN.search(fine), fine
