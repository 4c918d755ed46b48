"""Run folders that tell the truth: 17 damages x every command that reads a run folder.

Each damage is done to a copy of one finished run (4 rounds, checkpoints at rounds 2 and 4);
each command is then run on it: ``lowband run --resume`` (extending the run to 6 rounds),
``lowband export``, ``lowband compare``, ``lowband.load_run`` (the Python API) and
``lowband reproduce --collect``. Every one must end with exit 2 (for the Python API: a
:class:`RunDirError` or ``ReportError``) and one line that names the damaged file, never
a traceback, and never go on as if the run were whole: the resumed run writes nothing, the
store records nothing. Also: a full disk (a patched write raising ENOSPC) is one line naming
the file system and what the file needed, and the folder then resumes to the identical result.
"""

from __future__ import annotations

import errno
import json
import shutil
from pathlib import Path
from typing import Callable

import pytest
import tomli_w

from conftest import digits_config

ROUNDS = 4


def _cfg(root: Path, out: Path, rounds: int = ROUNDS) -> dict:
    cfg = digits_config(root, "fedavg", rounds=rounds)
    cfg["out_dir"] = str(out)
    cfg["checkpoint_every"] = 2
    return cfg


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, bytes]:
    """A finished run, and the checkpoint it wrote at round 2 (for the stale-checkpoint damage)."""
    from lowband.config import validate
    from lowband.engine.simulator import Simulation

    root = tmp_path_factory.mktemp("base")
    out = root / "run"
    stale: dict[str, bytes] = {}

    def keep(r: int, total: int, rec: dict) -> None:
        if r == 3:  # round 2's checkpoint is on disk, round 4's not yet
            stale["ckpt"] = (out / "checkpoint.pt").read_bytes()

    Simulation(validate(_cfg(root, out)), progress=keep).run()
    return out, stale["ckpt"]


def _flip_digit(path: Path) -> None:
    """Change one digit past the middle of the file (the text stays well-formed: only a checksum sees it)."""
    data = bytearray(path.read_bytes())
    i = next(i for i in range(len(data) // 2, len(data)) if chr(data[i]).isdigit())
    data[i] = ord("7") if data[i] != ord("7") else ord("3")
    path.write_bytes(bytes(data))


def _flip_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x10
    path.write_bytes(bytes(data))


def _cut(path: Path, frac: float, whole_lines: bool) -> None:
    data = path.read_bytes()
    n = int(len(data) * frac)
    if whole_lines:
        n = data.rfind(b"\n", 0, n) + 1
    path.write_bytes(data[:n])


def _garbage_line(path: Path) -> None:
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:2] + ["garbage\n"] + lines[2:]))


def _to_dir(path: Path) -> None:
    path.unlink()
    path.mkdir()
    (path / "x").write_text("x")


#: name -> (damage, the file the one line must name)
DAMAGES: dict[str, tuple[Callable[[Path, bytes], None], str]] = {
    "metrics-cut-at-a-line": (lambda d, s: _cut(d / "metrics.jsonl", 0.5, True), "metrics.jsonl"),
    "metrics-cut-mid-line": (lambda d, s: _cut(d / "metrics.jsonl", 0.6, False), "metrics.jsonl"),
    "metrics-garbage-line": (lambda d, s: _garbage_line(d / "metrics.jsonl"), "metrics.jsonl"),
    "metrics-digit-changed": (lambda d, s: _flip_digit(d / "metrics.jsonl"), "metrics.jsonl"),
    "metrics-emptied": (lambda d, s: (d / "metrics.jsonl").write_bytes(b""), "metrics.jsonl"),
    "metrics-deleted": (lambda d, s: (d / "metrics.jsonl").unlink(), "metrics.jsonl"),
    "metrics-a-folder": (lambda d, s: _to_dir(d / "metrics.jsonl"), "metrics.jsonl"),
    "checkpoint-byte-flipped": (lambda d, s: _flip_byte(d / "checkpoint.pt"), "checkpoint.pt"),
    "checkpoint-truncated": (lambda d, s: _cut(d / "checkpoint.pt", 0.5, False), "checkpoint.pt"),
    "checkpoint-deleted": (lambda d, s: (d / "checkpoint.pt").unlink(), "checkpoint.pt"),
    "checkpoint-stale": (lambda d, s: (d / "checkpoint.pt").write_bytes(s), "checkpoint.pt"),
    "summary-garbage": (lambda d, s: (d / "summary.json").write_text("{\"rounds_completed\": 4,"), "summary.json"),
    "summary-deleted": (lambda d, s: (d / "summary.json").unlink(), "summary.json"),
    "ledger-truncated": (lambda d, s: _cut(d / "ledger.csv", 0.5, True), "ledger.csv"),
    "ledger-digit-changed": (lambda d, s: _flip_digit(d / "ledger.csv"), "ledger.csv"),
    "config-emptied": (lambda d, s: (d / "config.toml").write_bytes(b""), "config.toml"),
    "manifest-deleted": (lambda d, s: (d / "manifest.json").unlink(), "manifest.json"),
}
assert len(DAMAGES) == 17


def _damaged(base: tuple[Path, bytes], tmp_path: Path, damage: str) -> Path:
    d = tmp_path / "run"
    shutil.copytree(base[0], d)
    DAMAGES[damage][0](d, base[1])
    return d


def _one_line(err: str, name: str) -> None:
    lines = [x for x in err.strip().splitlines() if x.strip()]
    assert len(lines) == 1, f"not one line: {err!r}"
    assert "Traceback" not in err
    assert name in lines[0] and "damaged" in lines[0], lines[0]


def _cli(args: list[str], capsys: pytest.CaptureFixture) -> tuple[int, str]:
    from lowband.cli import main

    capsys.readouterr()
    rc = main(args)
    return rc, capsys.readouterr().err


def _snapshot(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in d.iterdir() if p.is_file() and p.name != ".lowband.lock"}


@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_resume_refuses_a_damaged_folder_in_one_line(base, tmp_path, capsys, damage) -> None:
    d = _damaged(base, tmp_path, damage)
    cfg = tmp_path / "c.toml"
    cfg.write_text(tomli_w.dumps(_cfg(tmp_path, d)))
    before = _snapshot(d)
    rc, err = _cli(["run", str(cfg), "--resume", "rounds=6", "--quiet"], capsys)
    assert rc == 2
    _one_line(err, DAMAGES[damage][1])
    assert _snapshot(d) == before, "a refused resume wrote into the folder"


@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_export_refuses_a_damaged_folder_in_one_line(base, tmp_path, capsys, damage) -> None:
    d = _damaged(base, tmp_path, damage)
    rc, err = _cli(["export", str(d), "--out", str(tmp_path / "e")], capsys)
    assert rc == 2
    _one_line(err, DAMAGES[damage][1])


@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_compare_refuses_a_damaged_folder_in_one_line(base, tmp_path, capsys, damage) -> None:
    d = _damaged(base, tmp_path, damage)
    rc, err = _cli(["compare", str(base[0]), str(d), "--out", str(tmp_path / "c")], capsys)
    assert rc == 2
    _one_line(err, DAMAGES[damage][1])


@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_load_run_refuses_a_damaged_folder_in_one_line(base, tmp_path, damage) -> None:
    import lowband
    from lowband.engine.runlog import RunDirError
    from lowband.report import ReportError

    d = _damaged(base, tmp_path, damage)
    with pytest.raises((RunDirError, ReportError)) as info:
        lowband.load_run(d)
    _one_line(str(info.value), DAMAGES[damage][1])


@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_reproduce_collect_refuses_a_damaged_folder_in_one_line(base, tmp_path, capsys, monkeypatch, damage) -> None:
    d = _damaged(base, tmp_path, damage)
    paper = tmp_path / "papers" / "toy"
    paper.mkdir(parents=True)
    (paper / "c.toml").write_text(tomli_w.dumps(_cfg(tmp_path, d)))
    (paper / "reproduce.toml").write_text(tomli_w.dumps(
        {"paper": "toy", "run": [{"id": "t/acc", "table": "t", "config": "c.toml", "metric": "global/acc"}]}))
    monkeypatch.chdir(tmp_path)
    store = tmp_path / "store"
    rc, err = _cli(["reproduce", "toy", "--experiments", str(tmp_path / "papers"), "--out", "out/t.md",
                    "--collect", "--store", str(store)], capsys)
    assert rc == 2
    _one_line(err, DAMAGES[damage][1])
    assert not list(store.rglob("*.jsonl")), "a damaged run was recorded"


def test_the_undamaged_run_reads_everywhere(base, tmp_path, capsys) -> None:
    """The control: the same commands on the undamaged copy succeed (the matrix is not
    refusing everything), and a resume extends it."""
    import lowband

    d = tmp_path / "run"
    shutil.copytree(base[0], d)
    assert _cli(["export", str(d), "--out", str(tmp_path / "e")], capsys)[0] == 0
    assert _cli(["compare", str(d), "--out", str(tmp_path / "c")], capsys)[0] == 0
    assert lowband.load_run(d).summary["rounds_completed"] == ROUNDS
    cfg = tmp_path / "c.toml"
    cfg.write_text(tomli_w.dumps(_cfg(tmp_path, d)))
    assert _cli(["run", str(cfg), "--resume", "rounds=6", "--quiet"], capsys)[0] == 0
    assert json.loads((d / "summary.json").read_text())["rounds_completed"] == 6
    assert _cli(["export", str(d), "--out", str(tmp_path / "e2")], capsys)[0] == 0


def test_a_killed_run_still_resumes_exactly(tmp_path) -> None:
    """The manifest accepts what a kill leaves (metrics appended, checkpoint not yet written;
    a replace half done): a run killed after round 3's metrics resumes to the uninterrupted
    run's bytes."""
    from lowband.config import validate
    from lowband.engine.simulator import Simulation

    want_exp = validate(_cfg(tmp_path, tmp_path / "full"))
    Simulation(want_exp).run()

    class Kill(Exception):
        pass

    def boom(r: int, total: int, rec: dict) -> None:
        if r == 3:
            raise Kill

    exp = validate(_cfg(tmp_path, tmp_path / "cut"))
    with pytest.raises(Kill):
        Simulation(exp, progress=boom).run()
    Simulation(exp, resume=True).run()
    for name in ("metrics.jsonl", "ledger.csv", "summary.json"):
        a, b = (tmp_path / "full" / name).read_bytes(), (tmp_path / "cut" / name).read_bytes()
        if name == "summary.json":
            a, b = (json.loads(x) for x in (a, b))
            a.pop("out_dir", None), b.pop("out_dir", None)
        assert a == b, name


def test_a_kill_mid_replace_leaves_a_folder_that_checks(tmp_path) -> None:
    """Between the manifest that accepts both contents and the rename: old content checks."""
    from lowband.engine.runfiles import Manifest, check_folder

    m = Manifest(tmp_path)
    m.write_bytes(tmp_path / "summary.json", b"{}\n")
    real = __import__("os").replace

    def die(a, b):  # the process dies right before the rename
        raise KeyboardInterrupt

    import os
    os.replace = die
    try:
        with pytest.raises(KeyboardInterrupt):
            m.write_bytes(tmp_path / "summary.json", b'{"a": 1}\n')
    finally:
        os.replace = real
    check_folder(tmp_path)  # the old summary is still accepted


def test_a_full_disk_is_one_line_and_loses_nothing(tmp_path, capsys, monkeypatch) -> None:
    """A write that raises ENOSPC mid-run (at round 3's checkpoint) is one line naming the
    file system, its free space and what the file needed; the folder then resumes to the
    uninterrupted run's metrics."""
    from lowband.config import validate
    from lowband.engine import runfiles
    from lowband.engine.simulator import Simulation

    full = tmp_path / "full"
    Simulation(validate(_cfg(tmp_path, full))).run()
    d = tmp_path / "cut"
    cfg = tmp_path / "c.toml"
    cfg.write_text(tomli_w.dumps(_cfg(tmp_path, d)))
    real = runfiles.disk_write
    seen = {"n": 0}

    def full_disk(f, data):
        if getattr(f, "name", "").endswith("checkpoint.pt.tmp"):
            seen["n"] += 1
            if seen["n"] == 2:  # round 4's checkpoint (round 2's went through)
                raise OSError(errno.ENOSPC, "No space left on device")
        real(f, data)

    monkeypatch.setattr(runfiles, "disk_write", full_disk)
    rc, err = _cli(["run", str(cfg), "--quiet"], capsys)
    assert rc == 2
    lines = [x for x in err.strip().splitlines() if x.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert "disk full" in lines[0] and "checkpoint.pt needs about" in lines[0] and "free" in lines[0], lines[0]
    assert not (d / "checkpoint.pt.tmp").exists()
    monkeypatch.setattr(runfiles, "disk_write", real)
    assert _cli(["run", str(cfg), "--resume", "--quiet"], capsys)[0] == 0
    assert (d / "metrics.jsonl").read_bytes() == (full / "metrics.jsonl").read_bytes()


def test_a_full_disk_while_appending_leaves_no_torn_line(tmp_path, monkeypatch) -> None:
    from lowband.engine import runfiles

    m = runfiles.Manifest(tmp_path)
    log = tmp_path / "metrics.jsonl"
    m.append(log, b'{"round": 0}\n')

    def half(f, data):
        f.write(data[: len(data) // 2])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(runfiles, "disk_write", half)
    with pytest.raises(runfiles.DiskFullError, match="disk full"):
        m.append(log, b'{"round": 1}\n')
    assert log.read_bytes() == b'{"round": 0}\n'
    runfiles.check_folder(tmp_path)
