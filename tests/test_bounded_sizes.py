"""Every size bounded before it is allocated (issue 44, item 2): over 100 bad configs, each
one small valid digits config plus overrides, give one ``lowband: error:`` line naming the
key, exit status 2 and no traceback, having used little CPU time and memory.

Most cases run in-process through ``lowband.cli.main`` (fast); a handful of the worst
(an 8 GB batch, a 25.6 GB model, 10^9 epochs, an overflowing learning rate, a run folder
outside runs/) run as ``python -m lowband.cli`` subprocesses for the real exit status and
their peak memory. Time is measured as CPU time, which does not grow with the machine's
load; the subprocess's CPU time is mostly the interpreter and torch starting, so its bound
is the refusal's own CPU time (in-process) plus one start measured beside it.
"""

from __future__ import annotations

import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest
import tomli_w

from lowband.cli import main

BASE = {
    "name": "bounds", "seed": 1, "rounds": 1, "threads": 1,
    "data": {"dataset": "digits", "num_clients": 6, "split": [0.75, 0.0, 0.25]},
    "model": {"name": "mlp", "hidden": 16},
    "algorithm": {"name": "fedavg", "local_epochs": 1},
    "topology": {"kind": "star", "sampling": "count", "count": 4},
}
STRAGGLE = ("faults.deadline=2.0",)

# (overrides, a string the error line must contain: usually the key)
CASES: list[tuple[tuple[str, ...], str]] = []


def _add(key: str, *values: str, extra: tuple[str, ...] = (), expect: str = "") -> None:
    for v in values:
        CASES.append(((f"{key}={v}", *extra), expect or key))


# whole numbers written as floats (1e3 is not read as 1000) or as booleans
for key in ("rounds", "seed", "threads", "checkpoint_every", "data.num_clients", "data.min_size",
            "data.samples_per_client", "data.public_size", "topology.count", "eval.every", "eval.batch_size",
            "algorithm.batch_size", "algorithm.local_epochs", "model.hidden"):
    _add(key, "1e3", "true")
_add("rounds", "1.0", "2.5", "false")
_add("algorithm.batch_size", "1e9", "32.0")
_add("algorithm.local_epochs", "1e9")
_add("model.hidden", "1e8", "[16.0]")
_add("data.split", "[true, 0.0, 0.0]")
_add("algorithm.lr", "true")
_add("algorithm.momentum", "false")
# booleans written as numbers
for key in ("data.download", "eval.at_round0", "log.tensorboard", "allow_huge"):
    _add(key, "1", "0")
# sizes beyond the limits, refused without allow_huge = true
_add("rounds", "100001", "1000000", expect="allow_huge")
_add("algorithm.local_epochs", "10001", "1000000000", expect="allow_huge")
_add("algorithm.batch_size", "1000001", "1000000000", expect="allow_huge")
_add("model.hidden", "1000001", "100000000", "[16, 100000000]", expect="allow_huge")
_add("eval.batch_size", "10000000", expect="allow_huge")
_add("data.samples_per_client", "100000000", expect="allow_huge")
_add("data.public_size", "100000000", expect="allow_huge")
_add("algorithm.lr", "1e7", "1e30", expect="allow_huge")
_add("algorithm.weight_decay", "1e9", expect="allow_huge")
_add("algorithm.grad_clip", "1e12", expect="allow_huge")
# numbers beyond any limit
_add("rounds", "99999999999999999999", "1000001")
_add("algorithm.batch_size", "99999999999999999999", expect="allow_huge")
_add("model.hidden", "99999999999999999999", expect="allow_huge")
_add("data.num_clients", "1000000")
_add("threads", "100000")
# floats that overflow a float32 tensor (inf after the first update)
_add("algorithm.lr", "1e308", "1e39", expect="float32")
_add("algorithm.weight_decay", "1e300", expect="float32")
_add("algorithm.grad_clip", "1e300", expect="float32")
_add("algorithm.momentum", "1e308")
_add("algorithm.lr", "-1e308", "0")
# models whose copies exceed the free memory (estimated on the meta device, nothing built)
# (a million-wide pair of layers is 10^12 parameters, 4 TB a copy)
for clients in (1, 10, 100, 1000):
    CASES.append((("model.hidden=[1000000, 1000000]", f"data.num_clients={clients}"), "GiB"))
# (FedAvg's clients keep no model: the round's 1,000 participants hold the copies)
CASES.append((("model.hidden=1000000", "data.num_clients=1000", "topology.count=1000"), "GiB"))
# run names: confined to runs/, printable, of a sensible length
for name in ("../../x", "../x", "a/../../b", "x/..", "./x", "a//b", "/tmp/x", "~/x", "C:/x", "", " ",
             "a\\tb", "a" * 129, "a" * 1000, "b/" + "c" * 300):
    CASES.append(((f'name="{name}"',), "name"))
CASES.append(((f'out_dir="runs/{"d" * 300}"',), "out_dir"))
# values a run accepts silently but that make it meaningless
_add("faults.dropout", "1.0", "1")
_add("faults.straggler", "1.0", extra=STRAGGLE)
_add("topology.fraction", "0")
_add("eval.target", "85", "0")
# wrong types
_add("rounds", '"10"')
_add("name", "5")
_add("seed", '"0"')
_add("algorithm.lr", '"fast"')
_add("data.split", '"abc"')


def _write_base(tmp: Path) -> Path:
    p = tmp / "base.toml"
    p.write_text(tomli_w.dumps({**BASE, "out_dir": str(tmp / "x")}))
    return p


def test_over_a_hundred_distinct_cases() -> None:
    keys = [c[0] for c in CASES]
    assert len(CASES) >= 100 and len(set(keys)) == len(keys)


def _run_in_process(cfg: Path, overrides: tuple[str, ...], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, float]:
    capsys.readouterr()
    t0 = time.process_time()
    try:
        rc = main(["run", str(cfg), *overrides, "--quiet"])
    except SystemExit as exc:  # argparse's own usage errors
        rc = int(exc.code or 0)
    cpu = time.process_time() - t0
    out, err = capsys.readouterr()
    return rc, err + out, cpu


def test_bad_sizes_are_one_line_exit_2_quickly_and_small(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    cfg = _write_base(tmp_path)
    _run_in_process(cfg, ("rounds=1e3",), capsys)  # first call imports the registries: not timed
    peak0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    failures = []
    for overrides, expect in CASES:
        rc, err, cpu = _run_in_process(cfg, overrides, capsys)
        lines = err.strip().splitlines()
        ok = (rc == 2 and len(lines) == 1 and lines[0].startswith("lowband: error: ") and expect in lines[0]
              and "Traceback" not in err and cpu < 2.0)
        if not ok:
            failures.append(f"{overrides}: rc={rc} cpu={cpu:.2f}s stderr={err!r}")
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak0
    assert not failures, "\n".join(failures)
    assert grown < 1 << 20, f"peak memory grew by {grown / 2**20:.2f} GiB over the bad configs"
    assert not (tmp_path / "x").exists() and not (tmp_path / "runs").exists()


#: measured in a subprocess of its own: exit status, peak RSS and CPU time of the child
_PROBE = """
import resource, subprocess, sys
r = subprocess.run([sys.executable, "-m", "lowband.cli", *sys.argv[1:]], capture_output=True, text=True)
u = resource.getrusage(resource.RUSAGE_CHILDREN)
sys.stdout.write(f"{r.returncode} {u.ru_maxrss} {u.ru_utime + u.ru_stime}\\n")
sys.stdout.write(r.stderr)
"""


def _probe(tmp: Path, *argv: str) -> tuple[int, int, float, str]:
    proc = subprocess.run([sys.executable, "-c", _PROBE, *argv], cwd=tmp, capture_output=True, text=True,
                          timeout=600)
    head, _, err = proc.stdout.partition("\n")
    rc, rss_kib, cpu = head.split()
    return int(rc), int(rss_kib), float(cpu), err


@pytest.mark.slow  # five fresh interpreters (torch imported in each)
@pytest.mark.parametrize("overrides", [("algorithm.batch_size=1000000000",), ("model.hidden=1e8",),
                                       ("algorithm.local_epochs=1000000000",), ("algorithm.lr=1e308",),
                                       ('name="../../x"',)], ids=lambda o: o[0])
def test_console_command_refuses_without_allocating(tmp_path: Path, overrides: tuple[str, ...]) -> None:
    cfg = _write_base(tmp_path)
    rc, rss_kib, cpu, err = _probe(tmp_path, "run", str(cfg), *overrides, "--quiet")
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1 and lines[0].startswith("lowband: error: "), err
    assert "Traceback" not in err
    assert rss_kib < 1 << 20, f"peak RSS {rss_kib / 2**20:.2f} GiB"
    # CPU time beyond starting the command (importing torch and the registries) stays under 2 s
    _, _, start_cpu, _ = _probe(tmp_path, "list", "codecs")
    assert cpu - start_cpu < 2.0, f"refusal took {cpu:.2f} s CPU, starting the command {start_cpu:.2f} s"
    assert not (tmp_path / "x").exists() and not (tmp_path.parent / "x").exists()


def test_allow_huge_lets_a_big_value_through(tmp_path: Path) -> None:
    from lowband.config.resolve import validate

    cfg = {**BASE, "out_dir": str(tmp_path / "x"), "rounds": 200_000}
    with pytest.raises(Exception, match="allow_huge"):
        validate(cfg)
    assert validate({**cfg, "allow_huge": True}).rounds == 200_000


def test_memory_estimate_counts_the_model_without_building_it() -> None:
    from lowband.config.bounds import memory_estimate
    from lowband.config.resolve import validate

    exp = validate({**BASE, "model": {"name": "mlp", "hidden": 16}})
    need, n = memory_estimate(exp)
    assert n == 64 * 16 + 16 + 16 * 10 + 10  # digits: 64 inputs, 10 classes
    assert need == 4 * n * (4 + 8)  # FedAvg's clients keep no model: the round's 4 participants' copies


def test_names_inside_runs_are_still_accepted() -> None:
    from lowband.config.resolve import validate

    exp = validate({**BASE, "name": "fol/cifar10_psi0.7_fedavg"})
    assert exp.run_dir() == Path("runs/fol/cifar10_psi0.7_fedavg")
