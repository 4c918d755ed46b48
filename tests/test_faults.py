"""Faults as a feature (lowband.faults): dropout and stragglers with a round deadline,
seeded by (seed, round, node), applied by the round loop for every algorithm, reported
per round, and resumable to byte-identical metrics; the same under the Ray executor."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from conftest import digits_config
from lowband.comm.message import SERVER
from lowband.config import ConfigError, validate
from lowband.engine.simulator import Simulation, make_federation
from lowband.faults import FaultModel, RoundFaults
from lowband.topology import build_topology

try:
    import ray
except ImportError:  # pragma: no cover - depends on the optional extra
    ray = None


def _run(cfg: dict, **kw) -> Simulation:
    sim = Simulation(validate(cfg), **kw)
    sim.result = sim.run()
    return sim


def _text(sim: Simulation) -> str:
    return (Path(sim.result.run_dir) / "metrics.jsonl").read_text()


def _metrics(sim: Simulation) -> list[dict]:
    return [json.loads(line) for line in _text(sim).splitlines()]


FAULTS = {"dropout": 0.3, "straggler": 0.3, "slowdown": 3.0, "deadline": 2.0}


def _fedavg(tmp_path: Path, name: str, rounds: int = 6, faults: dict | None = None, **over) -> dict:
    cfg = digits_config(tmp_path / name, "fedavg", rounds=rounds)
    cfg["topology"] = {"kind": "star", "sampling": "all"}
    cfg["faults"] = dict(FAULTS if faults is None else faults)
    cfg.update(over)
    return cfg


# --------------------------------------------------------------------------- the model


def test_decisions_are_functions_of_seed_round_node() -> None:
    a = FaultModel(20, seed=4, **FAULTS)
    rounds = [a.round(r) for r in range(1, 41)]
    b = FaultModel(20, seed=4, **FAULTS)
    assert [b.round(r) for r in reversed(range(1, 41))][::-1] == rounds  # any order, any instance
    assert FaultModel(20, seed=5, **FAULTS).round(3) != rounds[2]
    drop = sum(len(f.dropped) for f in rounds) / (40 * 20)
    late = sum(len(f.late) for f in rounds) / (40 * 20)
    assert 0.22 < drop < 0.38
    # late: straggler (0.3) and not dropped (0.7) and 1 + 2v > 2 (0.5): about 0.105
    assert 0.06 < late < 0.16
    assert all(not (f.dropped & f.late) and SERVER not in f.dropped for f in rounds)
    sched = FaultModel(5, seed=0, dropout_schedule=[[2, 1], [2, 4], [3, 0]])
    assert sched.round(2).dropped == {1, 4} and sched.round(3).dropped == {0} and not sched.round(1).any


def test_dropout_removes_nodes_from_the_plan() -> None:
    plan = build_topology("kregular", 8, 0, k=3).plan(0)
    f = RoundFaults(1, dropped=frozenset({2, 5}))
    p = f.apply(plan)
    assert p.participants == (0, 1, 3, 4, 6, 7)
    assert p.neighbors[2] == p.neighbors[5] == ()
    assert all(2 not in nb and 5 not in nb for nb in p.neighbors.values())
    contact = build_topology("contact_plan", 6, 0, per_round=[2]).plan(0)
    assert all(0 not in pair for pair in RoundFaults(1, dropped=frozenset({0})).apply(contact).contacts)
    assert f.deliverable(1, [2, 3, 5]) == [3] and RoundFaults(1, late=frozenset({1})).deliverable(1, [3]) == []


@pytest.mark.parametrize("faults, match", [
    ({"straggler": 0.2}, "straggler and deadline go together"),
    ({"deadline": 2.0}, "straggler and deadline go together"),
    ({"straggler": 0.2, "deadline": 3.0, "slowdown": 3.0}, "no reply would ever be late"),
    ({"dropout": 1.5}, "faults.dropout"),
    ({"dropout_schedule": [[1, 2, 3]]}, "faults.dropout_schedule"),
    ({"slowdown": 1.0}, "faults.slowdown"),
    ({"deadline": 0.5, "straggler": 0.1}, "faults.deadline"),
])
def test_bad_fault_configs_are_one_line_errors(faults: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match) as info:
        validate({"faults": faults})
    assert "\n" not in str(info.value)


def test_schedule_node_out_of_range_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"faults: dropout_schedule\[0\] = \[1, 99\]"):
        Simulation(validate(_fedavg(tmp_path, "x", faults={"dropout_schedule": [[1, 99]]})))


# --------------------------------------------------------------------------- runs


def test_fedavg_with_dropout_and_deadline_reports_and_counts_honestly(tmp_path: Path) -> None:
    sim = _run(_fedavg(tmp_path, "faulty"))
    recs = _metrics(sim)
    model = FaultModel(8, seed=1, **FAULTS)
    for rec in recs[1:]:
        f = model.round(rec["round"])
        assert rec["faults/dropped"] == len(f.dropped) and rec["faults/late"] == len(f.late)
    assert sum(r["faults/dropped"] for r in recs) > 0 and sum(r["faults/late"] for r in recs) > 0
    cols = sim.ledger.columns()
    for r in range(1, 7):
        f = model.round(r)
        on = set(range(8)) - f.dropped
        mask = cols["round"] == r
        # a dropped client gets nothing and sends nothing; a late one was sent the model and
        # its reply crossed the link (counted), it just arrived after the deadline
        assert set(cols["dst"][mask & (cols["src"] == SERVER)].tolist()) == on
        assert set(cols["src"][mask & (cols["dst"] == SERVER)].tolist()) == on

    # the server's model is that of a run whose late clients were also absent
    absent = [[r, n] for r in range(1, 7) for n in sorted(model.round(r).dropped | model.round(r).late)]
    ref = _run(_fedavg(tmp_path, "ref", faults={"dropout_schedule": absent}))
    assert [r["global/acc"] for r in recs] == [r["global/acc"] for r in _metrics(ref)]
    assert _metrics(ref)[-1]["bytes/up"] < recs[-1]["bytes/up"]


class _Kill(Exception):
    pass


@pytest.mark.parametrize("checkpoint_every", [1, 2])
def test_interrupted_faulty_run_resumes_byte_identically(tmp_path: Path, checkpoint_every: int) -> None:
    full = _run(_fedavg(tmp_path, f"full{checkpoint_every}", checkpoint_every=checkpoint_every))
    cfg = _fedavg(tmp_path, f"cut{checkpoint_every}", checkpoint_every=checkpoint_every)

    def boom(r: int, total: int, rec: dict) -> None:
        if r == 5:  # round 5's metrics are written, its checkpoint is not: a torn state
            raise _Kill

    with pytest.raises(_Kill):
        Simulation(validate(cfg), progress=boom).run()
    resumed = _run(cfg, resume=True)
    assert _text(resumed) == _text(full)
    assert sum(r["faults/dropped"] + r["faults/late"] for r in _metrics(full)) > 0


def test_peer_dropout_skips_the_node_and_keeps_its_state(tmp_path: Path) -> None:
    one = _run(digits_config(tmp_path / "one", "dfedavg", rounds=1))
    cfg = digits_config(tmp_path / "two", "dfedavg", rounds=2)
    cfg["faults"] = {"dropout_schedule": [[2, 0]]}
    two = _run(cfg)
    a, b = one.executor.states[0]["params"], two.executor.states[0]["params"]
    assert all(torch.equal(a[k], b[k]) for k in a)  # it neither trained nor averaged in round 2
    cols = two.ledger.columns()
    r2 = cols["round"] == 2
    assert not ((cols["src"][r2] == 0) | (cols["dst"][r2] == 0)).any()
    assert int(r2.sum()) > 0 and _metrics(two)[-1]["faults/dropped"] == 1


@pytest.mark.slow  # starts a Ray runtime
def test_diverged_data_client_and_faults_under_ray_match_serial(tmp_path: Path) -> None:
    """Validation, faults and divergence counts through the Ray shards' delivery path: the
    same metrics.jsonl as the serial executor. Client 0's data is NaN, so its training
    diverges and its upload is refused; plus dropout and stragglers."""
    if ray is None:  # pragma: no cover
        pytest.skip("the Ray executor needs the extra: pip install 'lowband[ray]'")

    model = FaultModel(8, seed=1, **FAULTS)
    bad = min(n for n in range(8) if n not in model.round(1).dropped | model.round(1).late)

    def run(name: str, **over) -> Simulation:
        cfg = _fedavg(tmp_path, name, rounds=3, **over)
        exp = validate(cfg)
        fed = make_federation(exp)
        data = fed.nodes[bad].materialize() if hasattr(fed.nodes[bad], "materialize") else fed.nodes[bad]
        data.train_x = torch.full_like(data.train_x, float("nan"))  # a NodeView is read-only: edit a copy
        fed.nodes[bad] = data
        sim = Simulation(exp, federation=fed)
        sim.result = sim.run()
        return sim

    serial = run("serial")
    recs = _metrics(serial)
    # it diverges whenever it trains, and its upload is refused whenever it is on time
    acted = [r for r in (1, 2, 3) if bad not in model.round(r).dropped]
    on_time = [r for r in acted if bad not in model.round(r).late]
    assert [r for r in (1, 2, 3) if recs[r].get("faults/diverged")] == acted
    assert [r for r in (1, 2, 3) if recs[r].get("rejected/nonfinite")] == on_time and on_time
    started = not ray.is_initialized()
    if started:
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("RAY_memory_monitor_refresh_ms", "0")
            mp.setenv("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")
            ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        par = run("ray", executor="ray", ray_workers=2)
    finally:
        if started:
            ray.shutdown()
    assert _text(par) == _text(serial)


def test_user_guide_faults_example_is_valid() -> None:
    import re
    import tomllib

    guide = (Path(__file__).resolve().parents[1] / "docs" / "user-guide.md").read_text()
    section = guide.split("## Faults: dropout and stragglers", 1)[1].split("\n## ", 1)[0]
    (block,) = re.findall(r"```toml\n(.*?)```", section, re.S)
    exp = validate(tomllib.loads(block))
    assert exp.faults.dropout == 0.3 and exp.faults.deadline == 2.0
