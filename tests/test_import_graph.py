"""lowband's import graph has no circle of more than two modules (issue 37, item 6).

The graph is built from the source with ``ast``: every ``import`` and ``from ... import``
anywhere in a module (module level, inside functions and methods, under ``if``), relative or
absolute, becomes an edge; ``from lowband.x import y`` points at ``lowband.x.y`` when that is
a module, else at ``lowband.x``. Imports under ``if TYPE_CHECKING:`` never run and are left
out. A package's ``__init__`` is the module named like the package; the implicit import of a
parent package when a submodule loads is not an edge (every submodule would otherwise form a
circle with a package that re-exports it).

Run as a script (``python tests/test_import_graph.py [SRC]``) it prints the largest strongly
connected components.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path
from typing import Iterator, Optional

SRC = Path(__file__).resolve().parents[1] / "src"
ROOT = "lowband"

#: circles in code that other changes of issue 37 rewrite; each entry must still exist (the
#: test fails when one disappears, so the list shrinks with the code). Empty: none allowed.
KNOWN: list[frozenset[str]] = []


def module_files(src: Path = SRC, root: str = ROOT) -> dict[str, Path]:
    """Dotted module name -> file, for every ``.py`` under ``src/root``."""
    out: dict[str, Path] = {}
    for f in sorted((src / root).rglob("*.py")):
        parts = list(f.relative_to(src).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = f
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement in ``tree`` except those under ``if TYPE_CHECKING:``."""
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        stack.extend(ast.iter_child_nodes(node))


def _resolve(name: str, modules: dict[str, Path]) -> Optional[str]:
    """The longest prefix of dotted ``name`` that is one of ``modules``."""
    parts = name.split(".")
    while parts:
        cand = ".".join(parts)
        if cand in modules:
            return cand
        parts.pop()
    return None


def import_graph(src: Path = SRC, root: str = ROOT) -> dict[str, set[str]]:
    """Module -> the modules of the package it imports (anywhere in its source)."""
    modules = module_files(src, root)
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for mod, path in modules.items():
        is_pkg = path.name == "__init__.py"
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in _imports(tree):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                if node.level:
                    base = mod.split(".") if is_pkg else mod.split(".")[:-1]
                    base = base[: len(base) - (node.level - 1)]
                    prefix = ".".join(base + ([node.module] if node.module else []))
                else:
                    prefix = node.module or ""
                for a in node.names:
                    sub = f"{prefix}.{a.name}"
                    targets.append(sub if sub in modules else prefix)
            for t in targets:
                hit = _resolve(t, modules)
                if hit is not None and hit != mod:
                    graph[mod].add(hit)
    return graph


def strongly_connected(graph: dict[str, set[str]]) -> list[set[str]]:
    """Tarjan's strongly connected components (iterative), largest first."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    comps: list[set[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp: set[str] = set()
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        comp.add(w)
                        if w == v:
                            break
                    comps.append(comp)
    return sorted(comps, key=lambda c: (-len(c), sorted(c)))


def _describe(comp: set[str], graph: dict[str, set[str]]) -> str:
    edges = [f"{a} -> {b}" for a in sorted(comp) for b in sorted(graph[a] & comp)]
    return f"{len(comp)} modules: {', '.join(sorted(comp))}\n  edges: " + "; ".join(edges)


def test_graph_sees_every_kind_of_import(tmp_path: Path) -> None:
    """The builder follows module- and function-level, relative and absolute imports, resolves
    ``from pkg import sub`` to the submodule, and skips TYPE_CHECKING blocks."""
    pkg = tmp_path / "demo"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from demo.sub import b\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "b.py").write_text("def f():\n    from .. import c\n")
    (pkg / "c.py").write_text("import demo.d as x\nfrom typing import TYPE_CHECKING\n"
                              "if TYPE_CHECKING:\n    from demo import a\n")
    (pkg / "d.py").write_text("class K:\n    def m(self):\n        from . import a\n")
    g = import_graph(tmp_path, "demo")
    assert g["demo.a"] == {"demo.sub.b"}
    assert g["demo.sub.b"] == {"demo.c"}
    assert g["demo.c"] == {"demo.d"}
    assert g["demo.d"] == {"demo.a"}
    assert strongly_connected(g)[0] == {"demo.a", "demo.sub.b", "demo.c", "demo.d"}


def test_no_import_circle_of_more_than_two_modules() -> None:
    """Every strongly connected component of lowband's import graph has at most 2 modules,
    except those listed in KNOWN, each of which must still be there exactly."""
    graph = import_graph()
    big = [c for c in strongly_connected(graph) if len(c) > 2]
    unexpected = [c for c in big if frozenset(c) not in KNOWN]
    assert not unexpected, "import circle of more than 2 modules (largest first):\n" + "\n".join(
        _describe(c, graph) for c in unexpected)
    gone = [sorted(k) for k in KNOWN if k not in {frozenset(c) for c in big}]
    assert not gone, f"a known circle is gone or changed; update KNOWN in this file: {gone}"


if __name__ == "__main__":  # pragma: no cover
    g = import_graph(Path(sys.argv[1]) if len(sys.argv) > 1 else SRC)
    comps = [c for c in strongly_connected(g) if len(c) > 1]
    for c in comps:
        print(_describe(c, g))
    if not comps:
        print("no circle")
