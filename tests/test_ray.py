"""The Ray executor gives the serial executor's results: the same metrics.jsonl, ledger and
node states for the same config and seed, on a local 2-CPU Ray runtime (one per module)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from conftest import digits_config
from lowband.config import ConfigError, validate
from lowband.engine.simulator import Simulation

try:
    import ray
except ImportError:  # pragma: no cover - depends on the optional extra
    ray = None

needs_ray = pytest.mark.skipif(ray is None, reason="the Ray executor needs the extra: pip install 'lowband[ray]'")


@pytest.fixture(scope="module")
def ray_runtime():
    if ray is None:  # pragma: no cover
        pytest.skip("the Ray executor needs the extra: pip install 'lowband[ray]'")
    started = not ray.is_initialized()
    if started:
        # CI machines are shared: Ray's memory monitor kills workers when the *machine* is
        # above 95% memory, whoever uses it; these workers need ~0.2 GB each
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("RAY_memory_monitor_refresh_ms", "0")
            mp.setenv("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")
            ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    if started:
        ray.shutdown()


def _run(cfg: dict, **kw) -> Simulation:
    sim = Simulation(validate(cfg), **kw)
    sim.result = sim.run()
    return sim


def _pair(tmp_path: Path, algorithm: str, **over) -> tuple[Simulation, Simulation]:
    serial = digits_config(tmp_path / "serial", algorithm, rounds=2)
    par = digits_config(tmp_path / "ray", algorithm, rounds=2)
    for cfg in (serial, par):
        cfg.update(over)
    par.update(executor="ray", ray_workers=2)
    return _run(serial), _run(par)


def _same_ledger(a: Simulation, b: Simulation) -> None:
    sa, sb = a.ledger.state_dict(), b.ledger.state_dict()
    assert sa["n"] == sb["n"] > 0 and sa["kinds"] == sb["kinds"]
    for k in ("round", "src", "dst", "direction", "kind", "encoded", "declared"):
        assert torch.equal(sa[k], sb[k]), k


def _same_states(a: dict, b: dict) -> None:
    init = getattr(a, "_ex", None)  # a serial run's LazyStates: a node never read has its initial state
    if init is not None:
        order = sorted(set(a) | set(b), key=lambda k: (k < 0, k))
        a = {k: a[k] if k in a else init.init_state(k) for k in order}
        b = {k: b[k] if k in b else init.init_state(k) for k in order}
    assert list(a) == list(b)
    for node in a:
        for key, v in a[node].items():
            w = b[node][key]
            if isinstance(v, dict):
                assert v.keys() == w.keys() and all(torch.equal(v[t], w[t]) for t in v), (node, key)
            elif isinstance(v, torch.Tensor):
                assert torch.equal(v, w), (node, key)
            else:
                assert v == w or (v != v and w != w), (node, key)


@needs_ray
@pytest.mark.parametrize("algorithm", ["fedavg", "dfedavg", "feddbe"])
def test_ray_matches_serial(tmp_path: Path, ray_runtime, algorithm: str) -> None:
    """A server algorithm and a peer algorithm: byte-identical metrics.jsonl, the same
    ledger records in the same order, the same final state of every node. FedDBE's round 1
    addresses every client, which the driver must know without a server state."""
    serial, par = _pair(tmp_path, algorithm)
    assert par.executor.num_workers == 2
    assert par.executor.visits > 0  # balanced placement moved nodes (and their data) between shards
    ms = (Path(serial.result.run_dir) / "metrics.jsonl").read_text()
    mr = (Path(par.result.run_dir) / "metrics.jsonl").read_text()
    assert len(ms.splitlines()) == 3 and ms == mr
    _same_ledger(serial, par)
    _same_states(serial.executor.states, par.executor.states)
    if algorithm != "fedavg":
        return
    # the actors' CPU is not readable here: the timing lines say so (no cpu_s), with the
    # worker count the tables then multiply the wall-clock by (lowband.engine.cputime)
    timing = [json.loads(x) for x in (Path(par.result.run_dir) / "timing.jsonl").read_text().splitlines()]
    assert [(t["workers"], "cpu_s" in t) for t in timing] == [(2, False), (2, False)]

    # checkpoints: gathered from the shards and scattered back (what --resume does)
    sd = par.executor.state_dict()
    assert list(sd) == list(serial.executor.state_dict())
    par.executor.load_state_dict(sd)
    _same_states(serial.executor.states, par.executor.states)

    # the plain protocol (run_step + map_nodes, messages routed by the caller): one more
    # round by hand on both executors gives the same outboxes and states
    r, plan = 3, serial.topology.plan(2)
    outs = []
    for sim in (serial, par):
        inboxes: dict = {}
        for step in sim.alg.steps(r, plan):
            out = sim.executor.run_step(step, r, plan, inboxes)
            outs.append(out)
            inboxes = sim.route(r, out)
    half = len(outs) // 2
    for x, y in zip(outs[:half], outs[half:]):
        assert list(x) == list(y)
        for node in x:
            assert len(x[node].items) == len(y[node].items)
            for (d1, m1), (d2, m2) in zip(x[node].items, y[node].items):
                assert d1 == d2 and m1.kind == m2.kind and m1.meta == m2.meta
                assert all(torch.equal(m1.tensors[k], m2.tensors[k]) for k in m1.tensors)
    _same_states(serial.executor.states, par.executor.states)
    assert serial.evaluator(r, plan) == par.evaluator(r, plan)


@needs_ray
def test_serial_run_resumes_on_ray(tmp_path: Path, ray_runtime) -> None:
    """The executor may change on --resume: 1 serial round, then round 2 on Ray, gives the
    metrics.jsonl of an uninterrupted serial 2-round run."""
    whole = _run(digits_config(tmp_path / "whole", "fedavg", rounds=2))
    cfg = digits_config(tmp_path / "split", "fedavg", rounds=1)
    _run(cfg)
    cfg.update(rounds=2, executor="ray", ray_workers=2)
    resumed = _run(cfg, resume=True)
    assert (Path(resumed.result.run_dir) / "metrics.jsonl").read_text() == \
        (Path(whole.result.run_dir) / "metrics.jsonl").read_text()


@needs_ray
@pytest.mark.parametrize("direction", ["up", "down"])
def test_ef21_on_ray_matches_serial_and_resumes(tmp_path: Path, ray_runtime, direction: str) -> None:
    """EF21 with the sender's estimate and the receiver's copy on different shards (acks
    carried by the round loop): FedAvg with top-k deltas up under dropout and stragglers,
    or an EF21 download; metrics.jsonl, the ledger, node states and every codec state (both
    ends) equal the serial run's. The upload case is also interrupted after round 2 on Ray
    and resumed there, to the same results."""
    from test_ef21 import _Kill, both_ends_equal, same_codec_states

    def cfg(name: str, ray_: bool) -> dict:
        c = digits_config(tmp_path / name, "fedavg", rounds=4, upload="delta")
        c["comm"] = {"by_direction": {direction: "ef21(topk(0.1))" if direction == "up" else "ef21(topk(0.5))"}}
        if direction == "up":
            c["faults"] = {"dropout": 0.2, "straggler": 0.3, "deadline": 1.5}
        if ray_:
            c.update(executor="ray", ray_workers=2)
        return c

    serial, par = _run(cfg("serial", False)), _run(cfg("ray", True))
    ms = (Path(serial.result.run_dir) / "metrics.jsonl").read_text()
    assert ms == (Path(par.result.run_dir) / "metrics.jsonl").read_text()
    _same_ledger(serial, par)
    _same_states(serial.executor.states, par.executor.states)
    codecs = par.executor.codec_state_dict()
    assert same_codec_states(serial.network.codec_state_dict(), codecs) >= 20
    assert both_ends_equal(codecs) >= 10
    par.executor.close()  # its shards hold the runtime's 2 CPUs
    if direction == "down":
        return
    assert sum(r.get("faults/dropped", 0) + r.get("faults/late", 0) for r in serial.result.metrics) >= 2
    cut = cfg("cut", True)

    def boom(r: int, total: int, rec: dict) -> None:
        if r == 2:
            raise _Kill

    sim = Simulation(validate(cut), progress=boom)
    try:
        with pytest.raises(_Kill):
            sim.run()
    finally:
        sim.executor.close()  # an interrupted run leaves its workers to the caller
    resumed = _run(cut, resume=True)
    assert (Path(resumed.result.run_dir) / "metrics.jsonl").read_text() == ms
    same_codec_states(serial.network.codec_state_dict(), resumed.executor.codec_state_dict())
    resumed.executor.close()


def test_ray_config_keys_are_validated() -> None:
    assert validate({"executor": "ray", "ray_address": "10.0.0.1:6379", "ray_workers": 4}).ray_workers == 4
    with pytest.raises(ConfigError, match="ray_address: must be 'auto'"):
        validate({"executor": "ray", "ray_address": "head-node"})
    with pytest.raises(ConfigError, match="ray_num_cpus: sizes a local Ray runtime only"):
        validate({"executor": "ray", "ray_address": "auto", "ray_num_cpus": 4})
    with pytest.raises(ConfigError, match="ray_workers"):
        validate({"executor": "ray", "ray_workers": 0})


@needs_ray
def test_an_interrupted_ray_run_stops_its_actors(tmp_path: Path, ray_runtime) -> None:
    """An error mid-run stops the run's Ray actors (they hold the runtime's CPUs: a second
    run in the same process would wait for them), and the checkpoint resumes."""
    class _Stop(Exception):
        pass

    def boom(r: int, total: int, rec: dict) -> None:
        if r == 1:
            raise _Stop

    cfg = digits_config(tmp_path / "cut", "fedavg", rounds=2)
    cfg.update(executor="ray", ray_workers=2)
    sim = Simulation(validate(cfg), progress=boom)
    assert len(sim.executor.workers) == 2
    with pytest.raises(_Stop):
        sim.run()
    assert sim.executor.workers == []
    resumed = _run(cfg, resume=True)  # would wait forever for the 2 CPUs if the actors lived
    assert len(resumed.result.metrics) >= 2
    resumed.executor.close()
