"""The numbers quoted in the results pages' prose, traced to the store.

Every decimal number a results page quotes outside code blocks (:func:`quoted_numbers`) must
be one of the store's: a number of a table rendered from the store (``*_table.md``), or one
the store holds for that page as imported (``records/pages/<page>.jsonl``: the numbers the
page quoted when the store was made, with the commit they were read at, for the measurements
whose run folders are gone). A number added to a page that is in neither is not published:
:func:`unsourced` lists it."""

from __future__ import annotations

import json
import re
from pathlib import Path

#: a decimal number as prose quotes it (``81.33``, ``25,044.5``), not part of a name or path
NUMBER = re.compile(r"(?<![\w.\-/])\d[\d,]*\.\d+(?![\w.])")
_CODE = re.compile(r"```.*?```", re.S)


def quoted_numbers(text: str) -> list[str]:
    """The decimal numbers of ``text`` outside fenced code blocks."""
    return NUMBER.findall(_CODE.sub("", text))


def table_numbers(results: Path) -> set[str]:
    """The numbers of the tables rendered from the store (``results/*_table.md``)."""
    return {n for p in results.glob("*_table.md") for n in quoted_numbers(p.read_text())}


def page_record_path(results: Path, page: str) -> Path:
    return results / "records" / "pages" / f"{Path(page).stem}.jsonl"


def imported_numbers(results: Path, page: str) -> set[str]:
    """The numbers the store holds for ``page`` as imported (empty: none)."""
    path = page_record_path(results, page)
    if not path.is_file():
        return set()
    lines = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    return {x["number"] for x in lines[1:] if "number" in x}


def unsourced(results: Path, page: str) -> list[str]:
    """The numbers ``results/page`` quotes that the store does not hold."""
    known = table_numbers(results) | imported_numbers(results, page)
    return sorted({n for n in quoted_numbers((results / page).read_text()) if n not in known})


def import_page(results: Path, page: str, commit: str, date: str) -> Path:
    """Record the numbers ``page`` quotes that no table holds, as imported at ``commit``."""
    nums = sorted(set(quoted_numbers((results / page).read_text())) - table_numbers(results))
    head = {"record": 1, "kind": "imported", "page": f"docs/results/{page}",
            "provenance": {"page": f"docs/results/{page}", "commit": commit, "date": date,
                           "why": "numbers the page quoted from runs whose folders were lost with the machines that "
                                  "made them; kept as the page printed them"}}
    path = page_record_path(results, page)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(x) + "\n" for x in [head, *({"number": n} for n in nums)]))
    return path
