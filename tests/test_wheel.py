"""``lowband reproduce PAPER`` from a built wheel (issue 15 item 8): the wheel, not the source
checkout, must carry every paper's reproduce.toml and every config its cells name
(package data through the ``src/lowband/experiments`` link). The other reproduce tests run
from the checkout, where a config left out of the wheel would still be found; this one
builds the wheel, unpacks it beside no checkout, and plans and tabulates each paper from a
foreign folder."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAPERS = ("spark", "fedcspack", "fol", "kta")


@pytest.fixture(scope="module")
def wheel_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    # pyproject's build backend wants setuptools >= 77: build with the installed one when it
    # is new enough (no download), else in pip's isolated build environment
    try:
        from importlib.metadata import version
        local = int(version("setuptools").split(".")[0]) >= 77
    except Exception:  # not installed, or an odd version string
        local = False
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", *(["--no-build-isolation"] if local else []),
         "-q", "-w", str(out)], capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stderr[-2000:]
    (whl,) = out.glob("lowband-*.whl")
    site = out / "site"
    with zipfile.ZipFile(whl) as z:
        z.extractall(site)
    return site


def _lowband(site: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import lowband; "
            "assert lowband.__file__.startswith(sys.argv[1]), lowband.__file__; "
            "from lowband.cli import main; sys.exit(main(sys.argv[2:]))")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([sys.executable, "-c", code, str(site), *args], cwd=cwd, capture_output=True,
                          text=True, timeout=300, env=env)


@pytest.mark.parametrize("paper", PAPERS)
def test_reproduce_plans_and_collects_from_an_installed_wheel(wheel_site: Path, tmp_path: Path, paper: str) -> None:
    shipped = wheel_site / "lowband" / "experiments" / paper
    assert (shipped / "reproduce.toml").is_file() and not (shipped / "reproduce.toml").is_symlink()
    dry = _lowband(wheel_site, tmp_path, "reproduce", paper, "--dry-run")
    assert dry.returncode == 0, dry.stderr[-2000:]
    assert f"({shipped / 'reproduce.toml'})" in dry.stdout  # the wheel's copy, not a checkout's
    planned = [ln.split("would run ", 1)[1].split()[0] for ln in dry.stdout.splitlines() if "would run " in ln]
    assert planned, dry.stdout
    shipped_tomls = [f.as_posix() for f in (wheel_site / "lowband" / "experiments").rglob("*.toml")]
    for cfg in planned:  # every config a cell names is in the wheel (printed as its last two parts)
        assert any(f.endswith("/" + cfg) for f in shipped_tomls), cfg
    got = _lowband(wheel_site, tmp_path, "reproduce", paper, "--collect")
    assert got.returncode == 0, got.stderr[-2000:]
    table = tmp_path / "results" / f"{paper}_table.md"  # in the user's folder, nothing elsewhere
    assert table.is_file() and "| cell | row | metric | paper | ours | rounds | run |" in table.read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results"]
