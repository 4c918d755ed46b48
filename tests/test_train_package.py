"""All local training lives in lowband.train: no optimiser loop elsewhere in the package.

An AST scan of every module of src/lowband outside train/ for what an optimiser loop is
made of: an optimiser's ``.step()``, torch's in-place ``_foreach_`` updates, and a
hand-written gradient step (``w - lr * grad``, ``w -= ...``, ``w.sub_(...)``,
``w.add_(..., alpha=-lr)`` whose step involves a gradient). Such code belongs in a named
function of lowband.train (a SAM step, masked SGD, a distillation loop, ...), written once.
"""

from __future__ import annotations

import ast
from pathlib import Path

import lowband

ROOT = Path(lowband.__file__).resolve().parent
GRAD_NAMES = {"grad", "grads", "gradient", "gradients"}


def _mentions_grad(node: ast.AST) -> bool:
    """Whether the expression reads a gradient: ``x.grad`` or a variable named like one."""
    for n in ast.walk(node):
        if isinstance(n, ast.Attribute) and n.attr in GRAD_NAMES:
            return True
        if isinstance(n, ast.Name) and n.id in GRAD_NAMES:
            return True
    return False


def offences(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, what) of every optimiser step or hand-written gradient update in ``tree``."""
    out: list[tuple[int, str]] = []
    for n in ast.walk(tree):
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute):
            name = n.func.attr
            if name == "step" and not n.args and not n.keywords:
                out.append((n.lineno, "an optimiser's .step()"))
            elif name.startswith("_foreach_") and name.endswith("_"):
                out.append((n.lineno, f"torch.{name} (an in-place multi-tensor update)"))
            elif name == "sub_" and any(_mentions_grad(a) for a in n.args):
                out.append((n.lineno, "w.sub_(... grad ...)"))
            elif name == "add_" and any(_mentions_grad(a) for a in n.args) and any(
                    k.arg == "alpha" for k in n.keywords):
                out.append((n.lineno, "w.add_(grad, alpha=...)"))
        elif isinstance(n, ast.AugAssign) and isinstance(n.op, ast.Sub) and _mentions_grad(n.value):
            out.append((n.lineno, "w -= ... grad ..."))
        elif isinstance(n, ast.BinOp) and isinstance(n.op, ast.Sub) and isinstance(n.right, ast.BinOp) \
                and isinstance(n.right.op, ast.Mult) and _mentions_grad(n.right):
            out.append((n.lineno, "w - lr * grad"))
    return out


def test_no_optimiser_loop_outside_the_training_package() -> None:
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT)
        if rel.parts[0] == "train":
            continue
        for line, what in offences(ast.parse(path.read_text(), str(path))):
            found.append(f"{rel}:{line}: {what}")
    assert not found, "optimiser loops outside lowband.train (move them into a named function there):\n" + \
        "\n".join(found)


def test_the_scan_has_teeth() -> None:
    """Each form the scan looks for is found in a sample, and lowband.train itself has them."""
    sample = ast.parse("opt.step()\ntorch._foreach_add_(ps, gs, alpha=-lr)\np.sub_(lr * p.grad)\n"
                       "p.add_(p.grad, alpha=-lr)\nw -= lr * grad\nnew = v - lr * grad[k]\n"
                       "w = (w - mu * torch.sign(w.grad)).clamp(0, 1)\n")
    assert sorted(line for line, _ in offences(sample)) == [1, 2, 3, 4, 5, 6, 7]
    harmless = ast.parse("x.sub_(mean)\nsched.step(3)\ny = a - b * c\nstep = 0\n")
    assert offences(harmless) == []
    inside = [o for p in sorted((ROOT / "train").rglob("*.py")) for o in offences(ast.parse(p.read_text()))]
    assert len(inside) >= 5  # the loops are there, in one package


def test_lr_schedule_written_once() -> None:
    """``lr * lr_decay ** ...`` appears in lowband.train.schedule only."""
    hits = []
    for path in sorted(ROOT.rglob("*.py")):
        for n in ast.walk(ast.parse(path.read_text())):
            if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Pow) and "lr_decay" in ast.unparse(n.left):
                hits.append(str(path.relative_to(ROOT)))
    assert hits == ["train/schedule.py"], hits
