"""One writer per run folder (lowband.engine.runlock): a second process that would resume,
restart or start a run in a folder a live run writes is refused before it writes anything,
``lowband reproduce`` skips such a run and makes the next, and a lock left by a process
that has ended blocks nobody."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import tomli_w

from conftest import digits_config
from lowband.cli import main
from lowband.engine.runlock import LOCK_NAME, RunLock, lock_holder
from test_cli import cli, one_error_line, snapshot
from test_reproduce_seeds import _paper, _row


def _config(tmp_path: Path, rounds: int = 2) -> tuple[Path, Path]:
    cfg = digits_config(tmp_path, "fedavg", rounds=rounds)
    path = tmp_path / "c.toml"
    path.write_text(tomli_w.dumps(cfg))
    return path, Path(cfg["out_dir"])


def test_the_lock_says_who_holds_it_and_is_free_once_given_back(tmp_path: Path) -> None:
    assert lock_holder(tmp_path) is None  # no lock file
    lock = RunLock(tmp_path)
    assert lock.acquire() is None and lock.held
    holder = lock_holder(tmp_path)
    assert holder is not None and holder.startswith(f"pid {__import__('os').getpid()} on ")
    assert RunLock(tmp_path).acquire() == holder  # a second writer is told who writes
    lock.release()
    assert lock_holder(tmp_path) is None and (tmp_path / LOCK_NAME).is_file()
    again = RunLock(tmp_path)
    assert again.acquire() is None
    again.release()


def test_a_resume_while_the_run_goes_on_is_refused_and_changes_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg, run = _config(tmp_path)
    rc, _, _ = cli(capsys, "run", str(cfg), "rounds=1", "--quiet")
    assert rc == 0
    live = RunLock(run)  # the run, still going on (as another process would hold it)
    assert live.acquire() is None
    before = snapshot(run)
    for argv in (["--resume"], []):
        rc, _, err = cli(capsys, "run", str(cfg), *argv, "--quiet")
        line = one_error_line(err)
        assert rc == 2 and "is being written by another lowband process (pid " in line and "wait for it" in line, line
        assert snapshot(run) == before
    live.release()
    rc, _, _ = cli(capsys, "run", str(cfg), "--resume", "--quiet")  # the run has ended: it resumes
    assert rc == 0 and (run / "summary.json").is_file()


def test_a_new_run_into_a_folder_being_started_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The first seconds of a run (data loading: only the lock file in its folder yet) are
    covered too: without the lock a second run passed every check and both wrote."""
    cfg, run = _config(tmp_path)
    run.mkdir()
    live = RunLock(run)
    assert live.acquire() is None
    rc, _, err = cli(capsys, "run", str(cfg), "--quiet")
    assert rc == 2 and "being written by another lowband process" in one_error_line(err)
    assert sorted(p.name for p in run.iterdir()) == [LOCK_NAME]
    live.release()
    # a folder holding only the lock file of a run that ended before writing anything is usable
    rc, _, err = cli(capsys, "run", str(cfg), "--quiet")
    assert rc == 0, err


def test_a_lock_left_by_a_killed_process_blocks_nobody(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg, run = _config(tmp_path)
    run.mkdir()
    code = ("import sys, time; from lowband.engine.runlock import RunLock; "
            f"assert RunLock({str(run)!r}).acquire() is None; print('held', flush=True); time.sleep(120)")
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        assert lock_holder(run) == f"pid {holder.pid} on " + lock_holder(run).split(" on ", 1)[1]
        rc, _, err = cli(capsys, "run", str(cfg), "--quiet")
        assert rc == 2 and f"(pid {holder.pid} on " in one_error_line(err)
    finally:
        holder.kill()
        holder.wait()
    deadline = time.monotonic() + 30
    while lock_holder(run) is not None and time.monotonic() < deadline:
        time.sleep(0.05)
    rc, _, err = cli(capsys, "run", str(cfg), "--quiet")
    assert rc == 0, err


def test_reproduce_skips_a_run_another_process_makes_and_makes_the_next(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Two ``lowband reproduce`` at once (one per core): the second meets the run the first
    is making, skips it with the reason and goes on; without the lock it restarted that run
    from round 0 in the same folder while the first still wrote there."""
    papers = _paper(tmp_path, seeds=[0, 1, 2])
    monkeypatch.chdir(tmp_path)
    busy = tmp_path / "runs" / "toy" / "seed-1"
    busy.mkdir(parents=True)
    live = RunLock(busy)
    assert live.acquire() is None
    args = ["reproduce", "toy", "--experiments", str(papers), "--out", "out"]
    capsys.readouterr()
    assert main([*args, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "would skip" in out and "seed-1 is being written by another lowband process" in out, out
    assert main(args) == 0
    err = capsys.readouterr().err
    assert "skip    papers/toy/dfedavg.toml seed 1: run folder runs/toy/seed-1 is being written" in err, err
    assert sorted(p.name for p in busy.iterdir()) == [LOCK_NAME]  # left to its writer
    made = sorted(str(p.parent.relative_to(tmp_path)) for p in (tmp_path / "runs").rglob("summary.json"))
    assert made == ["runs/toy/seed-0", "runs/toy/seed-2"], (made, err)  # (seed 0 beside the seed folder)
    assert _row(tmp_path / "out" / "toy_table.md", "t/acc")[4].endswith("(n=2)")
    live.release()
    shutil.rmtree(busy)


def test_a_file_system_without_locks_runs_unlocked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """A mount that refuses ``flock`` (ENOLCK) must not stop runs: they go on unlocked."""
    import errno

    from lowband.engine import runlock

    def no_locks(fd: int, op: int) -> None:
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(runlock.fcntl, "flock", no_locks)
    lock = RunLock(tmp_path)
    assert lock.acquire() is None and not lock.held and lock_holder(tmp_path) is None
    cfg, run = _config(tmp_path, rounds=1)
    rc, _, err = cli(capsys, "run", str(cfg), "--quiet")
    assert rc == 0, err
