"""A lost Ray machine: a two-node Ray cluster on the loopback, the second node's raylet
killed mid-run.

- ``engine.retries = 0``: ``lowband run`` stops with one line naming what was lost and
  saying that ``--resume`` continues it; ``--resume`` then finishes on the node left, to the
  metrics of an uninterrupted run, byte for byte.
- ``engine.retries = 1``: the run continues by itself on the node left (its shards placed
  there) and writes the same metrics.

Each node gets one CPU, so the run's two shards live one per node. Health checks are made
fast (half a second) so that the loss is seen in seconds, not Ray's default 30 s.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import tomli_w

from conftest import digits_config

ray = pytest.importorskip("ray")
RAY = Path(sys.executable).with_name("ray")
pytestmark = [pytest.mark.slow, pytest.mark.skipif(not RAY.exists(), reason="the `ray` command is not installed")]

ENV = {**os.environ, "RAY_health_check_period_ms": "500", "RAY_health_check_timeout_ms": "500",
       "RAY_health_check_failure_threshold": "3", "RAY_health_check_initial_delay_ms": "0",
       "RAY_memory_monitor_refresh_ms": "0", "RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": "0",
       "RAY_USAGE_STATS_ENABLED": "0"}


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Cluster:
    """``ray start --head`` plus worker nodes, each with its own node-manager port (to find
    its raylet), all on 127.0.0.1 with a private temp dir; stopped at the end."""

    def __init__(self) -> None:
        self.temp = tempfile.mkdtemp(prefix="lbray", dir="/tmp")  # unix socket paths must stay short
        self.port = _port()
        self.address = f"127.0.0.1:{self.port}"
        self._ray("start", "--head", f"--port={self.port}", "--num-cpus=1", "--include-dashboard=false",
                  "--node-ip-address=127.0.0.1", f"--temp-dir={self.temp}", "--disable-usage-stats")

    def _ray(self, *args: str) -> None:
        subprocess.run([str(RAY), *args], env=ENV, check=True, capture_output=True, timeout=120)

    def add_node(self) -> int:
        nm = _port()
        self._ray("start", f"--address={self.address}", "--num-cpus=1", f"--node-manager-port={nm}",
                  "--node-ip-address=127.0.0.1", "--disable-usage-stats")
        self.wait_nodes()
        return nm

    def alive(self) -> int:
        if not ray.is_initialized():  # this process joins the cluster (the run's executor then uses it)
            ray.init(address=self.address, logging_level="ERROR", log_to_driver=False)
        return sum(1 for n in ray.nodes() if n["Alive"])

    def wait_nodes(self, n: int = 2) -> None:
        for _ in range(60):
            if self.alive() >= n:
                return
            time.sleep(1)
        raise AssertionError(f"the cluster never had {n} live nodes")

    @staticmethod
    def kill_raylet(nm_port: int) -> None:
        """SIGKILL the raylet of the node started with ``nm_port`` (as a machine that vanishes)."""
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if "raylet" in cmd.split(" ")[0] and f"--node_manager_port={nm_port}" in cmd:
                os.kill(int(pid), signal.SIGKILL)
                return
        raise AssertionError(f"no raylet with node manager port {nm_port}")

    def stop(self) -> None:
        """End this cluster's processes (those whose command line names its temp dir), by pid."""
        for pid in os.listdir("/proc"):
            if not pid.isdigit() or int(pid) == os.getpid():
                continue
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if self.temp.encode() in cmd:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except OSError:
                    pass
        shutil.rmtree(self.temp, ignore_errors=True)


def _cfg(root: Path, out: Path, address: str, retries: int) -> dict:
    cfg = digits_config(root, "fedavg", rounds=4)
    cfg.update(out_dir=str(out), checkpoint_every=1, executor="ray", ray_address=address, ray_workers=2)
    cfg["engine"] = {"retries": retries}
    return cfg


@pytest.fixture(scope="module")
def want(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """metrics.jsonl of the uninterrupted run (serial: the Ray run's are identical, tests/test_ray.py)."""
    from lowband.config import validate
    from lowband.engine.simulator import Simulation

    root = tmp_path_factory.mktemp("want")
    cfg = digits_config(root, "fedavg", rounds=4)
    cfg.update(out_dir=str(root / "run"), checkpoint_every=1)
    Simulation(validate(cfg)).run()
    return (root / "run" / "metrics.jsonl").read_bytes()


def test_a_lost_node_is_one_line_then_resumes_or_retries_to_identical_metrics(
        tmp_path: Path, want: bytes, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    from lowband.cli import main
    from lowband.engine import simulator

    if ray.is_initialized():
        ray.shutdown()
    for k, v in ENV.items():
        monkeypatch.setenv(k, v)
    cluster = Cluster()
    try:
        victim = {"nm": cluster.add_node()}
        real_record = simulator.Simulation._record

        def record(self, run, rnd):  # after round 2 is logged, the second machine vanishes
            real_record(self, run, rnd)
            if rnd.number == 2 and victim.get("nm"):
                Cluster.kill_raylet(victim.pop("nm"))

        monkeypatch.setattr(simulator.Simulation, "_record", record)

        # 1. no retries: one line, exit 2; --resume on the node left finishes it exactly
        a = tmp_path / "a"
        cfg = tmp_path / "a.toml"
        cfg.write_text(tomli_w.dumps(_cfg(tmp_path, a, cluster.address, 0)))
        capsys.readouterr()
        rc = main(["run", str(cfg), "--quiet"])
        err = capsys.readouterr().err
        lines = [x for x in err.splitlines() if x.startswith("lowband: error:")]
        assert rc == 2 and len(lines) == 1 and "Traceback" not in err, err
        assert "Ray lost shard" in lines[0] and "--resume" in lines[0] and "continues it exactly" in lines[0]
        assert main(["run", str(cfg), "--resume", "--quiet"]) == 0
        assert (a / "metrics.jsonl").read_bytes() == want

        # 2. one retry: a fresh second node, killed at round 2 again; the run goes on by itself
        victim["nm"] = cluster.add_node()
        b = tmp_path / "b"
        cfg = tmp_path / "b.toml"
        cfg.write_text(tomli_w.dumps(_cfg(tmp_path, b, cluster.address, 1)))
        capsys.readouterr()
        assert main(["run", str(cfg), "--quiet"]) == 0
        assert "retrying" in capsys.readouterr().err
        assert (b / "metrics.jsonl").read_bytes() == want
    finally:
        if ray.is_initialized():
            ray.shutdown()
        cluster.stop()
