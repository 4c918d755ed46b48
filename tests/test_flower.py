"""The Flower adapter computes what lowband computes.

- In-process: the adapter's ServerApp loop driving its ClientApp through a minimal
  in-process Grid (no Flower runtime) gives lowband's own metrics.jsonl, byte for byte,
  for FedAvg, FedProx, FedCSPACK and KTA v2 (quick; checks the adapter's logic).
- Flower's simulation runtime (Ray backend, 10 virtual SuperNodes): FedAvg matches
  lowband's FedAvg on the same partition within tolerance, with identical byte counts.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Iterable

import pytest

pytest.importorskip("flwr", reason="the Flower adapter needs the extra: pip install 'lowband[flower]'")

from flwr.app import Context, Message, RecordDict  # noqa: E402
from flwr.serverapp import Grid  # noqa: E402

from lowband.algorithms import ALGORITHMS  # noqa: E402
from lowband.config import validate  # noqa: E402
from lowband.engine.simulator import Simulation  # noqa: E402
from lowband.flower import FlowerRun, client_app, server_app  # noqa: E402


def _config(tmp_path: Path, algorithm: str, name: str, rounds: int = 2, **alg: object) -> dict:
    cfg = {
        "name": f"fl-{algorithm}-{name}", "seed": 3, "rounds": rounds, "out_dir": str(tmp_path / name),
        "threads": 1,  # float reductions depend on the thread count: pin it so the two paths compare
        "data": {"dataset": "digits", "num_clients": 10, "partition": "dirichlet", "alpha": 0.5, "min_size": 20,
                 "split": [0.75, 0.0, 0.25]},
        "model": {"name": "mlp", "hidden": 32},
        "algorithm": {"name": algorithm, "local_epochs": 1, "batch_size": 16, "lr": 0.05, **alg},
        "topology": {"kind": "star", "sampling": "count", "count": 5},
    }
    if algorithm == "kta":
        cfg["data"]["public_size"] = 100
        cfg["algorithm"].update(distill_epochs=1, k=2)
    return cfg


def _lowband_metrics(cfg: dict) -> str:
    res = Simulation(validate(cfg)).run()
    return (Path(res.run_dir) / "metrics.jsonl").read_text()


@pytest.fixture
def task_identity(monkeypatch):
    """What Flower's runtime sets in a ServerApp process before Messages can be created."""
    from flwr.supercore.task_identity import TaskIdentity

    for attr, value in (("_run_id", 1), ("_node_id", 0), ("_task_id", 0)):
        monkeypatch.setattr(TaskIdentity, attr, value)


class InProcessGrid(Grid):
    """Delivers each message to a ClientApp in this process, one Context per SuperNode."""

    def __init__(self, app, num_nodes: int):
        self.app = app
        self.contexts = {100 + i: Context(run_id=1, node_id=100 + i, state=RecordDict(), run_config={},
                                          node_config={"partition-id": i, "num-partitions": num_nodes})
                         for i in range(num_nodes)}
        self.sent = 0

    def set_run(self, run):  # pragma: no cover - not used
        pass

    @property
    def run(self):  # pragma: no cover - not used
        return None

    def create_message(self, content, message_type, dst_node_id, group_id, ttl=None):  # pragma: no cover
        return Message(content=content, dst_node_id=dst_node_id, message_type=message_type, group_id=group_id)

    def get_node_ids(self) -> Iterable[int]:
        return list(self.contexts)

    def push_messages(self, messages):  # pragma: no cover - not used
        raise NotImplementedError

    def pull_messages(self, message_ids):  # pragma: no cover - not used
        raise NotImplementedError

    def send_and_receive(self, messages, *, timeout=None):
        out = []
        for m in reversed(list(messages)):  # any order: the server must not depend on it
            self.sent += 1
            out.append(self.app(m, self.contexts[m.metadata.dst_node_id]))
        return out


@pytest.mark.parametrize("algorithm", ["fedavg", "fedprox", "fedcspack", "kta"])
def test_adapter_reproduces_lowband(tmp_path: Path, algorithm: str, task_identity) -> None:
    if algorithm not in ALGORITHMS:  # pragma: no cover - algorithms written in parallel
        pytest.skip(f"{algorithm} is not in this tree yet")
    over = {"pack": 64} if algorithm == "fedcspack" else {}
    rounds = 1 if algorithm == "kta" else 2  # KTA evaluates two protocols on every client: keep it short
    ref = _lowband_metrics(_config(tmp_path, algorithm, "lowband", rounds, **over))
    exp = validate(_config(tmp_path, algorithm, "flower", rounds, **over))
    grid = InProcessGrid(client_app(exp), 10)
    FlowerRun(exp, grid).run()
    got = (tmp_path / "flower" / "metrics.jsonl").read_text()
    assert got == ref
    assert grid.sent > 0
    from lowband.engine.runlock import lock_holder
    assert lock_holder(tmp_path / "flower") is None  # the run folder's lock is given back at the end


def test_peer_algorithms_are_refused(tmp_path: Path, task_identity) -> None:
    cfg = _config(tmp_path, "dfedavg", "peer")
    cfg["topology"] = {"kind": "kregular", "k": 3}
    exp = validate(cfg)
    with pytest.raises(ValueError, match="peer-to-peer methods are not expressible"):
        FlowerRun(exp, InProcessGrid(client_app(exp), 10))


def test_flower_simulation_fedavg_matches_lowband(tmp_path: Path, monkeypatch) -> None:
    """FedAvg through Flower's simulation runtime (10 virtual clients, Ray backend)."""
    pytest.importorskip("ray", reason="Flower's simulation runtime needs flwr[simulation]")
    from flwr.simulation import run_simulation

    monkeypatch.setenv("FLWR_TELEMETRY_ENABLED", "0")
    monkeypatch.setenv("RAY_memory_monitor_refresh_ms", "0")  # shared CI machines: see test_ray.py
    monkeypatch.setenv("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")
    ref = [json.loads(x) for x in _lowband_metrics(_config(tmp_path, "fedavg", "lowband")).splitlines()]
    exp = validate(_config(tmp_path, "fedavg", "flower"))
    run_simulation(server_app=server_app(exp), client_app=client_app(exp), num_supernodes=10,
                   backend_config={"client_resources": {"num_cpus": 1}, "init_args": {"num_cpus": 2}})
    got = [json.loads(x) for x in (tmp_path / "flower" / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in got] == [r["round"] for r in ref] == [0, 1, 2]
    for a, b in zip(got, ref):
        assert a.keys() == b.keys()
        for k in a:
            if k.startswith(("bytes/", "declared/")) or k == "round":
                assert a[k] == b[k], k  # the same wire bytes
            else:
                assert math.isclose(a[k], b[k], rel_tol=1e-4, abs_tol=1e-4), (k, a[k], b[k])


def test_a_flower_run_that_unlearns_warns(tmp_path: Path, task_identity, monkeypatch) -> None:
    """A Flower run is played by lowband's driver, so its watches are lowband's: it warns
    as `lowband run` does when the main accuracy falls from what the run reached and
    stays there (checks.DecayWatch)."""
    import warnings

    from lowband.engine.checks import LowbandWarning

    orig = Simulation._evaluate

    def unlearning(self, r, plan):  # the real metrics, the main accuracy forced down from round 8
        rec = orig(self, r, plan)
        if r >= 8:
            rec[self.main_metric] = 0.0
        return rec

    exp = validate(_config(tmp_path, "fedavg", "flower", rounds=12))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        FlowerRun(exp, InProcessGrid(client_app(exp), 10)).run()
    assert not [w for w in caught if "unlearning" in str(w.message)]
    monkeypatch.setattr(Simulation, "_evaluate", unlearning)
    exp = validate(_config(tmp_path, "fedavg", "bad", rounds=12))
    with pytest.warns(LowbandWarning, match=r"round 11: \S+ has fallen from what the run reached"):  # 4 of 7
        FlowerRun(exp, InProcessGrid(client_app(exp), 10)).run()


def test_a_flower_run_that_learns_nothing_warns_and_records_it(tmp_path: Path, task_identity) -> None:
    """The driver watches for a main accuracy that never leaves chance too
    (checks.ChanceWatch), and its summary.json records it: FedAvg at lr = 1e-9."""
    import json
    import warnings

    exp = validate(_config(tmp_path, "fedavg", "dead", rounds=2, lr=1e-9))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        FlowerRun(exp, InProcessGrid(client_app(exp), 10)).run()
    assert [w for w in caught if "has never been above chance" in str(w.message)]
    summary = json.loads((exp.run_dir() / "summary.json").read_text())
    assert summary["learned_nothing"]["chance"] == 0.1 and summary["num_classes"] == 10


# --------------------------------------------------------------------------- one driver, two transports


def _cnn_config(root: Path, name: str, algorithm: str, vectorize: str = "off", **alg: object) -> dict:
    """A small `cnn_fmnist` federation: the FedCSPACK paper's FMNIST CNN on 16x16 random
    images (an npz user dataset), 6 clients, 3 a round, 2 rounds."""
    import numpy as np

    path = root / "img.npz"
    if not path.exists():
        g = np.random.default_rng(0)
        np.savez(path, x=g.standard_normal((180, 1, 16, 16)).astype(np.float32),
                 y=g.integers(0, 4, 180).astype(np.int64))
    codec = alg.pop("codec", None)
    cfg = {"name": f"eq-{algorithm}", "seed": 2, "rounds": 2, "threads": 1, "out_dir": str(root / name),
           "data": {"dataset": "npz", "path": str(path), "num_clients": 6, "partition": "dirichlet", "alpha": 0.5,
                    "split": [0.75, 0.0, 0.25]},
           "model": {"name": "cnn_fmnist"},
           "algorithm": {"name": algorithm, "local_epochs": 1, "batch_size": 8, "lr": 0.05, **alg},
           "topology": {"kind": "star", "sampling": "count", "count": 3},
           "eval": {"protocols": ["global", "personal"]},
           "engine": {"vectorize": vectorize}}
    if codec:
        cfg["comm"] = {"codec": codec}
    return cfg


RUN_FILES = ("metrics.jsonl", "ledger.csv", "summary.json")
CASES = [("fedavg", {}), ("fedcspack", {"pack": 64}), ("scaffold", {}), ("fedavg", {"codec": "int8"})]


def test_flower_run_with_faults_equals_lowband_run(tmp_path: Path, task_identity) -> None:
    """``[faults]`` drive a Flower run as they drive `lowband run`: dropped clients are not
    asked, late ones' replies cross the link (counted) and are not delivered."""
    for name in ("lowband", "flower"):
        cfg = _cnn_config(tmp_path, name, "fedavg")
        cfg["topology"]["count"] = 5
        cfg["faults"] = {"dropout": 0.3, "straggler": 0.4, "deadline": 1.5}
        exp = validate(cfg)
        if name == "lowband":
            Simulation(exp).run()
        else:
            FlowerRun(exp, InProcessGrid(client_app(exp), 6)).run()
    lines = [json.loads(x) for x in (tmp_path / "lowband" / "metrics.jsonl").read_text().splitlines()]
    assert sum(m["faults/dropped"] for m in lines) > 0 and sum(m["faults/late"] for m in lines) > 0
    for name in RUN_FILES:
        assert (tmp_path / "flower" / name).read_text() == (tmp_path / "lowband" / name).read_text(), name


def _same_run_files(tmp_path: Path, algorithm: str, over: dict, vectorize: str) -> None:
    ref = Simulation(validate(_cnn_config(tmp_path, "lowband", algorithm, vectorize, **dict(over)))).run()
    exp = validate(_cnn_config(tmp_path, "flower", algorithm, vectorize, **dict(over)))
    grid = InProcessGrid(client_app(exp), 6)
    FlowerRun(exp, grid).run()
    assert grid.sent > 0
    for name in RUN_FILES:
        assert (tmp_path / "flower" / name).read_text() == (Path(ref.run_dir) / name).read_text(), name


@pytest.mark.parametrize("algorithm,over", CASES, ids=["fedavg", "fedcspack", "scaffold", "fedavg-int8"])
def test_flower_run_folder_equals_lowband_run(tmp_path: Path, algorithm: str, over: dict, task_identity) -> None:
    """metrics.jsonl, ledger.csv and summary.json of a Flower run are those of `lowband run`
    of the same config, byte for byte (one driver; Flower only moves the messages)."""
    _same_run_files(tmp_path, algorithm, over, "off")


# at the default vectorize the simulator trains clients in cohorts and a Flower client alone:
# equal since a cohort trains on one thread (lowband.train.cohort; tests/test_cohort.py
# checks a node alone against the same node in three cohorts at two threads)
@pytest.mark.parametrize("algorithm,over", CASES, ids=["fedavg", "fedcspack", "scaffold", "fedavg-int8"])
def test_flower_run_folder_equals_lowband_run_default_vectorize(tmp_path: Path, algorithm: str, over: dict,
                                                                task_identity) -> None:
    _same_run_files(tmp_path, algorithm, over, "auto")
