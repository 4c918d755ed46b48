"""The local worker pool ([engine] workers) runs the one round loop with the step calls in
worker processes: byte-identical metrics.jsonl, ledger, node states and codec states to
the serial path (workers = 1) for the same config, seed and threads; "auto" stays serial
for small federations. Two workers on the embedded digits data: a second per run."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch

from conftest import digits_config
from lowband.config import ConfigError, validate
from lowband.engine.executor import SerialExecutor
from lowband.engine.pool import AUTO_MIN_WORK, PoolExecutor, resolve_workers, usable_cores
from lowband.engine.simulator import Simulation


def _run(cfg: dict, workers: Any, **kw: Any) -> Simulation:
    cfg = {**cfg, "engine": {"workers": workers}}
    sim = Simulation(validate(cfg), **kw)
    sim.result = sim.run()
    return sim


def _metrics(sim: Simulation) -> str:
    return (Path(sim.result.run_dir) / "metrics.jsonl").read_text()


def _same_ledger(a: Simulation, b: Simulation) -> None:
    sa, sb = a.ledger.state_dict(), b.ledger.state_dict()
    assert sa["n"] == sb["n"] > 0 and sa["kinds"] == sb["kinds"]
    for k in ("round", "src", "dst", "direction", "kind", "encoded", "declared"):
        assert torch.equal(sa[k], sb[k]), k


def _same(v: Any, w: Any, where: Any) -> None:
    if isinstance(v, torch.Tensor):
        assert isinstance(w, torch.Tensor) and torch.equal(v, w), where
    elif isinstance(v, dict):
        assert isinstance(w, dict) and list(v) == list(w), where
        for k in v:
            _same(v[k], w[k], (where, k))
    elif isinstance(v, (list, tuple)):
        assert type(v) is type(w) and len(v) == len(w), where
        for i, (x, y) in enumerate(zip(v, w)):
            _same(x, y, (where, i))
    else:
        assert v == w or (v != v and w != w), where


def _same_states(a: dict, b: dict, init: Any = None) -> None:
    """The same state for every node; with ``init`` (an executor), a node whose state was
    never made on one side (lazy states: never read there) counts with its initial state."""
    init = init if init is not None else getattr(a, "_ex", None)  # a serial run's LazyStates
    if init is not None:
        order = sorted(set(a) | set(b), key=lambda k: (k < 0, k))
        a = {k: a[k] if k in a else init.init_state(k) for k in order}
        b = {k: b[k] if k in b else init.init_state(k) for k in order}
    assert list(a) == list(b)
    _same(a, b, "states")


@pytest.mark.parametrize("algorithm", ["fedavg", "dfedavg", "fedcspack", "fedala"])
def test_pool_matches_serial(tmp_path: Path, algorithm: str) -> None:
    """A server method, a peer method, FedCSPACK (variable-shape packs, masks) and FedALA
    (personal models and aggregation weights in the client states): the same bytes in
    metrics.jsonl, the same ledger rows in the same order, the same final state of every
    node, with the nodes living in two worker processes and some of each round's actors
    visiting the other worker (balanced placement: their states move there and back)."""
    serial = _run(digits_config(tmp_path / "serial", algorithm, rounds=2), 1)
    par = _run(digits_config(tmp_path / "pool", algorithm, rounds=2), 2)
    assert isinstance(serial.executor, SerialExecutor)
    assert isinstance(par.executor, PoolExecutor) and par.executor.num_workers == 2
    assert par.executor.visits > 0  # the digits cohorts are uneven: nodes did move
    assert len(_metrics(serial).splitlines()) == 3 and _metrics(serial) == _metrics(par)
    _same_ledger(serial, par)
    _same_states(serial.executor.states, par.executor.states)


def test_visitors_carry_their_data_to_spawned_workers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Spawned workers hold only their own nodes' data: a visiting node's data travels
    with its state (and leaves with it), and the run is still the serial run."""
    monkeypatch.setattr("lowband.engine.pool.mp.get_all_start_methods", lambda: ["spawn"])
    serial = _run(digits_config(tmp_path / "serial", "fedala", rounds=2), 1)
    par = _run(digits_config(tmp_path / "pool", "fedala", rounds=2), 2)
    assert not par.executor.data_everywhere and par.executor.visits > 0
    assert _metrics(serial) == _metrics(par)
    _same_ledger(serial, par)
    _same_states(serial.executor.states, par.executor.states)


def test_pool_faults_stateful_codec_and_resume(tmp_path: Path) -> None:
    """Dropout, late clients and an error-feedback top-k uplink (codec state kept on the
    senders' workers): the serial results; a serial checkpoint resumes on the pool."""
    def cfg(name: str, rounds: int) -> dict:
        c = digits_config(tmp_path / name, "fedavg", rounds=rounds)
        c["algorithm"]["upload"] = "delta"
        c["comm"] = {"by_kind": {"delta": "ef(topk(0.05))"}}
        c["faults"] = {"dropout": 0.2, "straggler": 0.3, "deadline": 1.5}
        return c

    serial = _run(cfg("serial", 3), 1)
    par = _run(cfg("pool", 3), 2)
    ms = _metrics(serial)
    assert ms == _metrics(par) and '"faults/dropped"' in ms
    assert par.executor.visits > 0  # codec states travelled with visiting senders
    _same_ledger(serial, par)
    a, b = serial.network.codec_state_dict(), par.executor.codec_state_dict()
    assert list(a) == list(b) and len(a) >= 4
    for src in a:
        for link in a[src]:
            for t, st in a[src][link].items():
                assert torch.equal(st["e"], b[src][link][t]["e"]), (src, link, t)
    _run(cfg("split", 2), 1)
    resumed = _run(cfg("split", 3), 2, resume=True)
    assert isinstance(resumed.executor, PoolExecutor)
    assert _metrics(resumed) == ms


def test_pool_link_deadline_matches_serial(tmp_path: Path) -> None:
    """The [links] deadline (late replies not delivered) is played by the one round loop,
    so the pool drops the same messages as the serial path."""
    def cfg(name: str) -> dict:
        c = digits_config(tmp_path / name, "fedavg", rounds=2)
        # clients 0-3 on LTE, the others on LoRa SF12, whose uploads miss a 1-hour deadline
        c["links"] = {"preset": "lorawan_sf12", "nodes": {"lte": [0, 1, 2, 3]}, "deadline_s": 3600}
        return c

    serial, par = _run(cfg("serial"), 1), _run(cfg("pool"), 2)
    assert _metrics(serial) == _metrics(par)
    recs = serial.result.metrics
    assert sum(r["links/late"] for r in recs) > 0 and recs[2]["global/acc"] != recs[0]["global/acc"]


def test_worker_errors_reach_the_parent(tmp_path: Path) -> None:
    sim = Simulation(validate({**digits_config(tmp_path, "fedavg", rounds=1), "engine": {"workers": 2}}))
    sim.executor.init_states(sim.topology.plan(0))

    plan = sim.topology.plan(0)
    with pytest.raises(ValueError, match="node 0 refuses"):
        sim.executor.map_nodes(_boom, [0, 7], 1, plan)
    # the pool is still in step after an error
    assert sim.executor.map_nodes(_node_id, [7, 0], 1, plan) == {7: 7, 0: 0}
    with pytest.raises(ValueError, match="cannot be pickled.*engine.workers = 1"):
        sim.executor.map_nodes(lambda ctx, s: 0, [0], 1, plan)
    sim.executor.close()
    assert {0, 7, -1} <= set(sim.executor.states) <= set(range(8)) | {-1}  # the states made (lazily) so far
    with pytest.raises(RuntimeError, match="closed"):
        sim.executor.map_nodes(_node_id, [0], 1, plan)


def _boom(ctx: Any, state: Any) -> None:
    raise ValueError(f"node {ctx.node} refuses")


def _node_id(ctx: Any, state: Any) -> int:
    return ctx.node


def test_auto_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("lowband.engine.pool.usable_cores", lambda: 4)
    big = int(AUTO_MIN_WORK)
    assert resolve_workers("auto", None, 100, big, 1) == 4
    assert resolve_workers("auto", 2, 100, big, 1) == 2  # workers x threads <= cores
    assert resolve_workers("auto", None, 3, big, 1) == 3  # at most one per node
    assert resolve_workers("auto", None, 100, big - 1, 1) == 1  # too small to pay
    assert resolve_workers(1, None, 100, big, 1) == 1
    assert resolve_workers(8, None, 5, 1, 1) == 5
    monkeypatch.setattr("lowband.engine.pool.usable_cores", lambda: 1)
    assert resolve_workers("auto", None, 100, big, 1) == 1


def test_cores_respect_omp_num_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert usable_cores() == 1
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert usable_cores() == len(os.sched_getaffinity(0))


def test_small_federations_stay_serial_by_default(tmp_path: Path) -> None:
    exp = validate(digits_config(tmp_path, "fedavg", rounds=1))
    assert exp.engine.workers == "auto"
    assert isinstance(Simulation(exp).executor, SerialExecutor)


def test_workers_key_is_validated() -> None:
    assert validate({"engine": {"workers": 3}}).engine.workers == 3
    for bad in (0, -1, "many", 1.5, True):
        with pytest.raises(ConfigError, match="engine.workers"):
            validate({"engine": {"workers": bad}})


@pytest.mark.parametrize("algorithm,pooled", [("fedavg", True), ("spark", False)])
def test_auto_stays_serial_where_workers_were_measured_slower(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, algorithm: str, pooled: bool) -> None:
    """SPARK sets ``auto_workers = False`` (its pool round was 1.35x slower than serial):
    with two cores and a federation big enough, "auto" starts the pool for FedAvg only;
    an explicit ``workers = 2`` still starts it for SPARK."""
    monkeypatch.setattr("lowband.engine.pool.usable_cores", lambda: 2)
    monkeypatch.setattr("lowband.engine.pool.AUTO_MIN_WORK", 0)
    def cfg(path: Path) -> dict:
        if algorithm == "spark":
            from test_ntk import _cfg as ntk_config
            return ntk_config(path, algorithm, 1)
        return digits_config(path, algorithm, rounds=1)

    sim = Simulation(validate(cfg(tmp_path / "auto")))
    try:
        assert isinstance(sim.executor, PoolExecutor) is pooled
    finally:
        getattr(sim.executor, "close", lambda: None)()
    raw = cfg(tmp_path / "two")
    raw["engine"] = {"workers": 2}
    sim = Simulation(validate(raw))
    try:
        assert isinstance(sim.executor, PoolExecutor)
    finally:
        getattr(sim.executor, "close", lambda: None)()


def test_workers_die_quietly_on_sigterm_under_lowband_run(tmp_path: Path) -> None:
    """Under ``lowband run`` SIGTERM raises an interrupt (cli._sigterm_as_interrupt); a
    forked worker inherits that handler and resets it, so the parent's ``terminate()``
    ends it by the signal (exit -15), not by a traceback (exit 1)."""
    import signal

    from lowband import cli

    original = signal.signal(signal.SIGTERM, signal.SIG_DFL)  # an earlier test (Ray) may own it
    try:
        assert cli._sigterm_as_interrupt() is signal.SIG_DFL  # installed: lowband owns the process
        sim = Simulation(validate({**digits_config(tmp_path, "fedavg", rounds=1), "engine": {"workers": 2}}))
        sim.executor.init_states(sim.topology.plan(0))
        assert sim.executor.map_nodes(_node_id, [0, 7], 1, sim.topology.plan(0)) == {0: 0, 7: 7}
        procs = list(sim.executor._procs)
        for p in procs:
            p.terminate()
            p.join(timeout=30)
        assert [p.exitcode for p in procs] == [-signal.SIGTERM] * len(procs)
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL if original is None else original)
