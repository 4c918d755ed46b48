"""A Flower deployment as real processes on the loopback (slow): a SuperLink and two
SuperNodes (``flower-superlink``, ``flower-supernode``, ``--insecure``, free ports), each
SuperNode with its own client data file (``lowband partition CONFIG --export DIR``) and
state folder; ``flwr run`` of ``examples/flower-fedavg`` for 3 rounds.

1. The run folder's metrics.jsonl is ``lowband run``'s of the same config, byte for byte.
2. A second run whose ServerApp process (``flwr-serverapp``, the SuperLink's child) is
   killed with SIGKILL as soon as round 1's checkpoint is written, then continued with
   ``flwr run --run-config "... resume=true"``, ends with the same bytes.

Every process is started in its own session and the whole session is killed at the end,
pass or fail; the test then checks that none is left.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

import pytest

pytest.importorskip("flwr", reason="the Flower adapter needs the extra: pip install 'lowband[flower]'")

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
CONFIG = """\
name = "deploy"
seed = 0
rounds = 3
threads = 1
checkpoint_every = 1

[data]
dataset = "digits"
num_clients = 2
partition = "dirichlet"
alpha = 0.5
min_size = 20
split = [0.75, 0.0, 0.25]

[model]
name = "mlp"
hidden = 32

[algorithm]
name = "fedavg"
local_epochs = 1
batch_size = 16
lr = 0.05

[topology]
kind = "star"
sampling = "all"

[eval]
protocols = ["global"]
"""


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


class Deployment:
    """The processes of one deployment; :meth:`close` kills each one's whole session."""

    def __init__(self, tmp: Path):
        self.tmp, self.procs, self.logs = tmp, [], []
        self.env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
                    "FLWR_HOME": str(tmp / "flwr"), "FLWR_TELEMETRY_ENABLED": "0", "PYTHONUNBUFFERED": "1",
                    "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}  # flower-superexec, flwr-serverapp, ...
        self.services: list[subprocess.Popen] = []  # the SuperLink and the SuperNodes: must stay up
        self.seen: set[tuple[int, str]] = set()  # (pid, start time) of every process of ours seen

    def start(self, name: str, *cmd: str) -> subprocess.Popen:
        log = open(self.tmp / f"{name}.log", "wb")
        self.logs.append(log)
        p = subprocess.Popen([str(c) for c in cmd], stdout=log, stderr=subprocess.STDOUT, env=self.env,
                             cwd=self.tmp, start_new_session=True)
        self.procs.append(p)
        return p

    def close(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for pid in _alive_in(self):
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.time() + 10
            while time.time() < deadline and _alive_in(self):
                time.sleep(0.2)
        for p in self.procs:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:  # pragma: no cover
                pass
        for log in self.logs:
            log.close()


def _procs() -> dict[int, tuple[str, int, int, str]]:
    """Every live process (not a zombie): pid -> (name, ppid, session, start time)."""
    out = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2:].split()  # state, ppid, pgrp, session, ..., starttime (field 22)
        if fields[0] != "Z":
            out[int(d.name)] = (name, int(fields[1]), int(fields[3]), fields[19])
    return out


def _ours(dep: "Deployment") -> dict[int, tuple[str, int, int, str]]:
    """The live processes the deployment started, in their sessions or below them (a process
    Flower starts in a session of its own is still a descendant while its parent lives);
    remembered, so one whose parent died is still found (:attr:`Deployment.seen`)."""
    procs = _procs()
    roots = {p.pid for p in dep.procs}
    ours = {}
    for pid, info in procs.items():
        q, hops = pid, 0
        while q in procs and hops < 64:
            if q in roots or procs[q][2] in roots:
                ours[pid] = info
                break
            q, hops = procs[q][1], hops + 1
    dep.seen.update((pid, info[3]) for pid, info in ours.items())
    ours.update({pid: procs[pid] for pid, start in dep.seen if pid in procs and procs[pid][3] == start})
    return ours


def _alive_in(dep: "Deployment") -> list[int]:
    return sorted(_ours(dep))


def _serverapps(dep: "Deployment") -> list[int]:
    """The ServerApp processes (``flwr-serverapp``, started by the SuperLink), found by name
    (/proc/<pid>/stat: Flower makes them non-dumpable, which hides their cmdline)."""
    return [pid for pid, info in _ours(dep).items() if info[0].startswith("flwr-serverapp")]


def _wait(cond, timeout: float, what: str, dep: Deployment, also: Optional[subprocess.Popen] = None) -> None:
    """Wait for ``cond()``; fail at once when a service (or ``also``, e.g. `flwr run`) has exited."""
    deadline = time.time() + timeout
    while not cond():
        _ours(dep)  # remember every process of ours seen
        down = [p.args[0] for p in [*dep.services, *([also] if also is not None else [])] if p.poll() is not None]
        if down or time.time() > deadline:
            tails = {p.name: p.read_text(errors="replace")[-1500:] for p in dep.tmp.glob("*.log")}
            why = f"{down} exited" if down else f"timed out after {timeout:.0f} s"
            raise AssertionError(f"{why} waiting for {what}; logs: {tails}")
        time.sleep(0.5)


def _rounds(path: Path) -> list[int]:
    try:
        return [json.loads(x)["round"] for x in path.read_text().splitlines() if x.strip()]
    except (OSError, ValueError):
        return []


def _flwr_run(dep: Deployment, app: Path, run_config: str, name: str) -> subprocess.Popen:
    return dep.start(name, BIN / "flwr", "run", app, "test", "--stream", "--run-config", run_config)


def test_superlink_and_two_supernodes_match_lowband_and_resume_exactly(tmp_path: Path) -> None:
    from lowband.config import load_experiment
    from lowband.engine.simulator import Simulation

    app = tmp_path / "app"
    shutil.copytree(ROOT / "examples" / "flower-fedavg", app, ignore=shutil.ignore_patterns("__pycache__", "runs"))
    (app / "lowband_app" / "deploy.toml").write_text(CONFIG)
    ref = Simulation(load_experiment(app / "lowband_app" / "deploy.toml", [f"out_dir={json.dumps(str(tmp_path / 'ref'))}"])).run()
    expected = (Path(ref.run_dir) / "metrics.jsonl").read_bytes()

    dep = Deployment(tmp_path)
    try:
        # the clients' files, written where the dataset is (here: the same machine)
        export = subprocess.run([sys.executable, "-c", "import sys; from lowband.cli import main; sys.exit(main())",
                                 "partition", app / "lowband_app" / "deploy.toml", "--export", tmp_path / "clients"],
                                env=dep.env, capture_output=True, text=True, timeout=300)
        assert export.returncode == 0, export.stderr
        link, sn0, sn1 = _free_ports(3)
        (tmp_path / "flwr").mkdir()
        (tmp_path / "flwr" / "config.toml").write_text(
            f'[superlink]\ndefault = "test"\n\n[superlink.test]\naddress = "127.0.0.1:{link}"\ninsecure = true\n')
        dep.services.append(dep.start("superlink", BIN / "flower-superlink", "--insecure", "--host", "127.0.0.1", "--port", link,
                  "--disable-runtime-dependency-installation"))
        for i, port in enumerate((sn0, sn1)):
            dep.services.append(dep.start(
                f"supernode{i}", BIN / "flower-supernode", "--insecure", "--superlink", f"127.0.0.1:{link}",
                "--port", port, "--node-config",
                f"data-file='{tmp_path / 'clients' / f'client-{i:04d}.npz'}' state-dir='{tmp_path / f'states{i}'}'"))
        _wait(lambda: (tmp_path / "superlink.log").read_text(errors="replace").count("Activated node_id") >= 2,
              120, "both SuperNodes to register", dep)
        common = (f"config='deploy.toml' data-index='{tmp_path / 'clients' / 'index.json'}' reply-timeout=600.0 ")

        # 1. an uninterrupted run
        out1 = tmp_path / "run1"
        t0 = time.time()
        run = _flwr_run(dep, app, common + f"out-dir='{out1}'", "flwr-run1")
        times: dict[int, float] = {}

        def progressed() -> bool:
            for r in _rounds(out1 / "metrics.jsonl"):
                times.setdefault(r, time.time() - t0)
            return (out1 / "summary.json").exists()

        _wait(progressed, 600, "the first run's summary.json", dep, also=run)
        print(f"\nround times since `flwr run` (s): {json.dumps({r: round(t, 1) for r, t in times.items()})}; "
              f"load average {os.getloadavg()}")
        assert (out1 / "metrics.jsonl").read_bytes() == expected
        _wait(lambda: run.poll() is not None, 120, "`flwr run --stream` to end", dep)

        # 2. the ServerApp killed after round 1's checkpoint, then resumed
        out2 = tmp_path / "run2"
        before = set(_serverapps(dep))
        run = _flwr_run(dep, app, common + f"out-dir='{out2}'", "flwr-run2")
        _wait(lambda: (out2 / "checkpoint.pt").exists(), 600, "round 1's checkpoint", dep, also=run)
        victims = [p for p in _serverapps(dep) if p not in before]
        assert len(victims) == 1, victims
        os.kill(victims[0], signal.SIGKILL)
        _wait(lambda: victims[0] not in _alive_in(dep), 30, "the ServerApp to die", dep)
        assert not (out2 / "summary.json").exists() and max(_rounds(out2 / "metrics.jsonl")) < 3
        run = _flwr_run(dep, app, common + f"out-dir='{out2}' resume=true", "flwr-run3")
        _wait(lambda: (out2 / "summary.json").exists(), 600, "the resumed run's summary.json", dep, also=run)
        assert (out2 / "metrics.jsonl").read_bytes() == expected
    finally:
        dep.close()
        left: Optional[list[int]] = _alive_in(dep)
        assert not left, f"processes left behind: {left}"
