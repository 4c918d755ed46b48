"""Bad configs (issue 14, part 5): each one, run through the CLI entry point, prints exactly
one line on stderr, exits with status 2, writes nothing and overwrites nothing.

Each case starts from a valid digits config (tmp/exp.toml, run folder tmp/x) and breaks it
with overrides, or replaces the file itself. The whole tmp folder (the working directory
of the call) is snapshotted before and after: same files, same bytes, same mtimes.
Most calls run in-process through ``lowband.cli.main`` (fast); two go through a
subprocess for the real exit status.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Callable

import pytest
import tomli_w

from lowband.cli import main

BASE = {
    "name": "bad", "seed": 1, "rounds": 1, "threads": 1,
    "data": {"dataset": "digits", "num_clients": 6, "partition": "dirichlet", "alpha": 0.5, "min_size": 20,
             "split": [0.75, 0.0, 0.25]},
    "model": {"name": "mlp", "hidden": 16},
    "algorithm": {"name": "fedavg", "local_epochs": 1},
    "topology": {"kind": "star", "sampling": "count", "count": 4},
}

Make = Callable[[Path], list[str]]


def _file(content: bytes | str, name: str = "bad.toml") -> Make:
    def make(tmp: Path) -> list[str]:
        p = tmp / name
        p.write_bytes(content if isinstance(content, bytes) else content.encode())
        return [str(p)]
    return make


def _over(*overrides: str, base: dict | None = None) -> Make:
    def make(tmp: Path) -> list[str]:
        cfg = dict(base or BASE)
        cfg["out_dir"] = str(tmp / "x")
        p = tmp / "exp.toml"
        p.write_text(tomli_w.dumps(cfg))
        return [str(p), *overrides]
    return make


def _with(make: Make, prepare: Callable[[Path], None]) -> Make:
    def wrapped(tmp: Path) -> list[str]:
        prepare(tmp)
        return make(tmp)
    return wrapped


IID = {**BASE, "data": {"dataset": "digits", "num_clients": 6, "split": [0.75, 0.0, 0.25]}}
STAR = {**BASE, "topology": {"kind": "star"}}
PEER = {**BASE, "algorithm": {"name": "dfedavg", "local_epochs": 1}, "topology": {"kind": "kregular", "k": 2}}
FOL = {**BASE, "algorithm": {"name": "fol"}, "topology": {"kind": "contact_plan"}}

# (id, how to make the argv, strings the one error line must contain)
CASES: list[tuple[str, Make, list[str]]] = [
    # the file itself
    ("binary garbage", _file(bytes(range(256)) * 4), ["not UTF-8", "bad.toml"]),
    ("png bytes", _file(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\xff\xfe"), ["not UTF-8"]),
    ("utf-16 text", _file('[algorithm]\nname = "fedavg"\n'.encode("utf-16")), ["not UTF-8"]),
    ("empty file", _file(""), ["is empty", "algorithm.name", "lowband demo"]),
    ("only comments", _file("# nothing here\n\n"), ["is empty"]),
    ("no algorithm", _file("rounds = 3\n[data]\nnum_clients = 4\n"), ["sets no algorithm.name"]),
    ("toml syntax error", _file('[algorithm]\nname = = "fedavg"\n'), ["not valid TOML", "line 2"]),
    ("nul byte", _file('[algorithm]\nname = "fed\x00avg"\n'), ["not valid TOML"]),
    ("unclosed table", _file('[algorithm\nname = "fedavg"\n'), ["not valid TOML"]),
    ("deep nesting", _file("a = " + "[" * 5000 + "]" * 5000 + '\n[algorithm]\nname = "fedavg"\n'),
     ["not valid TOML"]),
    ("huge file", _file("# pad\n" * 200_000 + '[algorithm]\nname = "fedavg"\n'), ["larger than"]),
    ("directory", lambda tmp: [str((tmp / "adir").mkdir() or tmp / "adir")], ["is a folder"]),
    ("missing file", lambda tmp: [str(tmp / "missing.toml")], ["missing.toml", "not found"]),
    ("algorithm is a string", _file('algorithm = "fedavg"\n'), ["algorithm", "dictionary"]),
    # non-finite numbers
    ("lr inf", _over("algorithm.lr=inf"), ["algorithm.lr", "inf", "finite"]),
    ("lr nan", _over("algorithm.lr=nan"), ["algorithm.lr", "nan", "finite"]),
    ("lr -inf", _over("algorithm.lr=-inf"), ["algorithm.lr", "finite"]),
    ("alpha inf", _over("data.alpha=inf"), ["data.alpha", "finite"]),
    ("fraction nan", _over("topology.fraction=nan"), ["topology.fraction", "finite"]),
    ("inf inside a list", _over("data.split=[0.5, 0.5, inf]"), ["data.split[2]", "finite"]),
    # types, ranges, huge numbers
    ("rounds a word", _over('rounds="ten"'), ["rounds", "integer"]),
    ("rounds a float", _over("rounds=1e30"), ["rounds"]),
    ("rounds huge", _over("rounds=99999999999999999999"), ["rounds", "less than or equal"]),
    ("seed negative", _over("seed=-1"), ["seed", "greater than or equal to 0"]),
    ("threads absurd", _over("threads=1000000"), ["threads", "less than or equal to 1024"]),
    ("threads zero", _over("threads=0"), ["threads"]),
    ("name a number", _over("name=5"), ["name", "string"]),
    ("executor gpu", _over('executor="gpu"'), ["executor", "serial"]),
    ("checkpoint_every negative", _over("checkpoint_every=-1"), ["checkpoint_every"]),
    ("unknown top-level key", _over("foo=1"), ["foo", "unknown key"]),
    ("unknown section", _over("bogus.x=1"), ["bogus", "unknown key"]),
    # data
    ("no clients", _over("data.num_clients=0"), ["data.num_clients"]),
    ("a million clients", _over("data.num_clients=1000000"), ["data.num_clients"]),
    ("more clients than samples", _over("data.num_clients=5000"), ["num_clients"]),
    ("negative public set", _over("data.public_size=-5"), ["data.public_size"]),
    ("split of two", _over("data.split=[0.5, 0.5]"), ["data.split"]),
    ("negative split", _over("data.split=[1.5, -0.5, 0.0]"), ["data.split"]),
    ("dirichlet without alpha", _over('data.partition="dirichlet"', base=IID), ["alpha", "dirichlet"]),
    ("alpha zero", _over("data.alpha=0"), ["data.alpha", "greater than 0"]),
    ("unknown partition", _over('data.partition="pathological"'), ["data.partition", "dirichlet"]),
    ("alpha with iid", _over('data.partition="iid"'), ["data.alpha", "'iid'"]),
    ("unknown dataset", _over('data.dataset="imagenet"'), ["imagenet", "digits"]),
    ("dataset files missing", _over('data.dataset="mnist"', 'data.data_dir="nowhere"'), ["mnist", "missing"]),
    # model
    ("unknown model", _over('model.name="gpt"'), ["model.name", "'gpt'"]),
    ("negative width", _over("model.hidden=-3"), ["hidden"]),
    ("unknown model option", _over("model.depth=3"), ["model.depth", "unknown key"]),
    ("mix with a weight method", _over('model.mix=["mlp", "logreg"]'), ["model.mix", "fedavg"]),
    # algorithm
    ("unknown algorithm", _over('algorithm.name="fedsgd"'), ["algorithm.name", "'fedsgd'", "fedavg"]),
    ("unknown hyperparameter", _over("algorithm.lrr=0.1"), ["algorithm.lrr", "unknown key", "lr"]),
    ("zero batch", _over("algorithm.batch_size=0"), ["algorithm.batch_size"]),
    ("negative epochs", _over("algorithm.local_epochs=-1"), ["algorithm.local_epochs"]),
    ("momentum above one", _over("algorithm.momentum=1.5"), ["algorithm.momentum"]),
    ("unknown upload", _over('algorithm.upload="gradients"'), ["algorithm.upload", "delta"]),
    ("ignored knob", _over('algorithm.name="fedas"', "algorithm.server_lr=2.0"), ["algorithm.server_lr", "fedas"]),
    ("public method without a public set", _over('algorithm.name="kta"'), ["data.public_size", "kta"]),
    # codecs
    ("unknown codec", _over('comm.codec="zip"'), ["comm.codec", "'zip'", "topk"]),
    ("topk zero", _over('comm.codec="topk(0)"'), ["comm.codec", "topk"]),
    ("topk overflow", _over('comm.codec="topk(1e400)"'), ["comm.codec"]),
    ("empty sketch", _over('comm.codec="sketch(0,0)"'), ["comm.codec", "sketch"]),
    ("empty codec", _over('comm.by_kind.weights=""'), ["comm.by_kind.weights"]),
    ("unknown direction", _over('comm.by_direction.sideways="fp16"'), ["comm.by_direction", "sideways"]),
    # topology
    ("unknown kind", _over('topology.kind="mesh"'), ["topology.kind", "kregular"]),
    ("zero sampled clients", _over("topology.count=0"), ["topology.count"]),
    ("count above clients", _over("topology.count=100"), ["count"]),
    ("list sampling without schedule", _over('topology.sampling="list"', base=STAR), ["schedule"]),
    ("schedule out of range", _over('topology.sampling="list"', "topology.schedule=[[99]]", base=STAR), ["99"]),
    ("count with fraction sampling", _over('topology.sampling="fraction"'), ["topology.count", "'fraction'"]),
    ("peer method on a star", _over('topology.kind="star"', "topology.k=5", base=PEER),
     ["topology.kind", "dfedavg", "'star'"]),
    ("server method on a graph", _over('topology.kind="kregular"'), ["topology.kind", "fedavg", "'kregular'"]),
    ("k on a star", _over("topology.k=3"), ["topology.k", "star"]),
    ("k-regular of degree 0", _over("topology.k=0", base=PEER), ["topology.k"]),
    ("k-regular denser than the clients", _over("topology.k=100", base=PEER), ["k"]),
    ("erdos-renyi p = 0", _over('topology.kind="erdos_renyi"', "topology.p=0", "topology.k=5", base=PEER),
     ["topology.p"]),
    ("ring wider than the clients", _over('topology.kind="ring"', "topology.k=10", base=PEER), ["k"]),
    ("contact plan missing", _over(base=FOL), ["topology.per_round", "topology.plan_file"]),
    ("contact plan twice", _over("topology.per_round=[1]", 'topology.plan_file="p.csv"', base=FOL),
     ["topology.per_round", "exactly one"]),
    ("contact plan file missing", _over('topology.plan_file="nope.csv"', base=FOL), ["nope.csv"]),
    # evaluation
    ("fedavg consensus", _over('eval.protocols=["consensus"]'), ["eval.protocols", "fedavg", "'consensus'"]),
    ("fedavg node_global", _over('eval.protocols=["node_global"]'), ["eval.protocols", "'node_global'"]),
    ("peer global", _over('eval.protocols=["global"]', base=PEER), ["eval.protocols", "dfedavg", "'global'"]),
    ("no protocols", _over("eval.protocols=[]"), ["eval.protocols", "empty"]),
    ("a protocol twice", _over('eval.protocols=["global", "global"]'), ["eval.protocols", "twice"]),
    ("unknown protocol", _over('eval.protocols=["globl"]'), ["eval.protocols", "consensus"]),
    ("eval every 0", _over("eval.every=0"), ["eval.every"]),
    ("target above 1", _over("eval.target=2"), ["eval.target"]),
    ("accuracy target in percent", _over("eval.target=85"), ["eval.target", "not a fraction", "0.85 for 85%"]),
    ("unknown main metric", _over('eval.main="global/f1"'), ["eval.main", "global/f1"]),
    # the run folder
    ("empty out_dir", _over('out_dir=""'), ["out_dir", "empty"]),
    ("out_dir is a file", _with(_over(), lambda tmp: (tmp / "x").write_text("my notes\n")), ["is a file"]),
    ("out_dir under a file", _over(), ["cannot write there"]),  # out_dir replaced below
    ("out_dir holds someone's files",
     _with(_over(), lambda tmp: ((tmp / "x").mkdir(), (tmp / "x" / "config.toml").write_text("# mine\n"))),
     ["not empty", "holds no lowband run"]),
    ("out_dir holds only seed runs (a seed started before the config's own)",
     _with(_over("seed=3"), lambda tmp: (tmp / "x" / "seed-1").mkdir(parents=True)),
     ["holds only seed runs", "seed-1", "/x/seed-3"]),
]
CASES[[c[0] for c in CASES].index("out_dir under a file")] = (
    "out_dir under a file",
    _with(_over(), lambda tmp: (tmp / "f").write_text("a file\n")),
    ["f/sub", "cannot write there"])


def _fix_under_a_file(case_id: str, argv: list[str], tmp: Path) -> list[str]:
    return argv + [f"out_dir={tmp / 'f' / 'sub'}"] if case_id == "out_dir under a file" else argv


def snapshot(folder: Path) -> dict[str, tuple[bytes, int]]:
    return {str(p.relative_to(folder)): (p.read_bytes(), p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*")) if p.is_file()} | \
           {str(p.relative_to(folder)) + "/": (b"", 0) for p in sorted(folder.rglob("*")) if p.is_dir()}


def test_there_are_at_least_fifty_bad_configs() -> None:
    assert len(CASES) >= 50 and len({c[0] for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case_id,make,expect", CASES, ids=[c[0] for c in CASES])
def test_bad_config_is_one_line_exit_2_and_writes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str], case_id: str,
                                                         make: Make, expect: list[str]) -> None:
    monkeypatch.chdir(tmp_path)  # anything written relative to the working folder is seen too
    argv = _fix_under_a_file(case_id, make(tmp_path), tmp_path)
    before = snapshot(tmp_path)
    capsys.readouterr()
    try:
        rc = main(["run", *argv, "--quiet"])
    except SystemExit as exc:  # pragma: no cover - argparse would exit 2 itself
        rc = int(exc.code or 0)
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert rc == 2, f"exit {rc}; stderr: {err}"
    assert len(lines) == 1 and lines[0].startswith("lowband: error: "), err
    for s in expect:
        assert s in lines[0], f"{s!r} not in {lines[0]!r}"
    assert out == ""
    assert snapshot(tmp_path) == before, "a failed run wrote or changed a file"


@pytest.mark.parametrize("case_id", ["binary garbage", "lr inf"])
def test_bad_config_exit_status_of_the_console_command(tmp_path: Path, case_id: str) -> None:
    make, expect = {c[0]: (c[1], c[2]) for c in CASES}[case_id]
    argv = make(tmp_path)
    before = snapshot(tmp_path)
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run([sys.executable, "-m", "lowband.cli", "run", *argv, "--quiet"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and all(s in lines[0] for s in expect), proc.stderr
    assert proc.stdout == "" and snapshot(tmp_path) == before
