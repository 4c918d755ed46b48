"""The numbers quoted in the results pages' prose, traced to the store.

Every decimal number a results page quotes outside code blocks (:func:`quoted_numbers`) must
be one of the store's (:func:`unsourced` lists those that are not):

* a number of a table rendered from the store (``*_table.md``);
* a number *derived* from a measured record: a line of ``records/pages/<page>.jsonl`` such as
  ``{"number": "19.35", "derived": {"expr": "100 * a", "a": ["natural/shakespeare_fedavg/seed-0.jsonl",
  "global/acc", 20], "digits": 2}}`` says how: each name of ``expr`` is a (record, metric, round)
  of the store, ``expr`` is arithmetic over them and ``digits`` the decimals printed.
  :func:`misderived` recomputes each one from its record: a page number or a record edited
  without the other no longer agree;
* a number the store holds for that page as *imported* (a ``{"number": ...}`` line alone: the
  numbers the page quoted when the store was made, with the commit they were read at, under
  the file's header, for measurements whose run folders are gone); kept as printed, checked
  only for being there."""

from __future__ import annotations

import ast
import json
import operator
import re
from pathlib import Path
from typing import Any

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


def _lines(results: Path, page: str) -> list[dict[str, Any]]:
    path = page_record_path(results, page)
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()][1:] if path.is_file() else []


def imported_numbers(results: Path, page: str) -> set[str]:
    """The numbers the store holds for ``page`` as imported (empty: none)."""
    return {x["number"] for x in _lines(results, page) if "number" in x and "derived" not in x}


def derived_numbers(results: Path, page: str) -> list[tuple[str, dict[str, Any]]]:
    """(number, how ``page``'s records derive it) for each derived number (see the module's
    docstring; a number quoted for two measurements has a line for each)."""
    return [(x["number"], x["derived"]) for x in _lines(results, page) if "derived" in x]


_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
        ast.Pow: operator.pow}


def _eval(node: ast.AST, names: dict[str, float]) -> float:
    """``node`` of an arithmetic expression over ``names`` (+ - * / **, numbers, parentheses)."""
    if isinstance(node, ast.Expression):
        return _eval(node.body, names)
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_eval(node.left, names), _eval(node.right, names))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_eval(node.operand, names)
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
        return float(node.value)
    if isinstance(node, ast.Name) and node.id in names:
        return names[node.id]
    raise ValueError(f"not allowed in a derived number's expr: {ast.dump(node)}")


def derive(results: Path, how: dict[str, Any]) -> str:
    """The text of a derived number, recomputed from the store's records."""
    from lowband.results.record import read_record

    names = {}
    for k, v in how.items():
        if k in ("expr", "digits"):
            continue
        rec, metric, rnd = v
        line = next((m for m in read_record(results / "records" / rec).metrics if m["round"] == rnd), None)
        if line is None or line.get(metric) is None:
            raise ValueError(f"{rec}: no {metric} at round {rnd}")
        names[k] = float(line[metric])
    return f"{_eval(ast.parse(how['expr'], mode='eval'), names):,.{int(how['digits'])}f}"


def misderived(results: Path, page: str) -> list[str]:
    """The derived numbers of ``page`` that its records do not give, or that the page no
    longer quotes, each as one line saying why."""
    quoted = set(quoted_numbers((results / page).read_text()))
    out = []
    for number, how in derived_numbers(results, page):
        now = derive(results, how)
        if now != number:
            out.append(f"{page}: {number} is {how['expr']} = {now} by its records")
        if number not in quoted:
            out.append(f"{page}: {number} is derived from records but the page does not quote it")
    return out


def unsourced(results: Path, page: str) -> list[str]:
    """The numbers ``results/page`` quotes that the store does not hold."""
    known = table_numbers(results) | imported_numbers(results, page) | {n for n, _ in derived_numbers(results, page)}
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
