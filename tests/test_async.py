"""The event clock of asynchronous federations (lowband.asynchronous) and FedAsync / FedBuff.

What must hold: events in the exact order and with the exact staleness a hand-built trace
gives; a device that is off contributes nothing (and one that leaves mid-job loses its work
while its download stays in the ledger); a killed asynchronous run resumes to the same
metrics; FedAsync with alpha = 1 and one client at a time is sequential training; FedBuff
scales by 1 / sqrt(1 + staleness) and steps after K arrivals; and what the clock cannot
time is refused with one line."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from conftest import digits_config
from lowband.algorithms import ALGORITHMS
from lowband.asynchronous.clock import EventClock
from lowband.asynchronous.staleness import fedasync_alpha, fedbuff_scale, staleness_weight
from lowband.comm.links import Direction, LinkModel, LinkProfile
from lowband.config import validate
from lowband.config.schema import ConfigError
from lowband.engine.simulator import Simulation


# --------------------------------------------------------------------------- a hand-built trace
def _seconds_link() -> LinkProfile:
    """A link on which a message of ``b`` bytes takes exactly ``b`` seconds (1 byte/s, one
    frame, no header, no latency)."""
    d = Direction(bps=8.0, frame_payload=10**9, frame_overhead=0)
    return LinkProfile("seconds", "1 byte/s", up=d, down=d)


class Windows:
    """Availability from explicit off-intervals per node: ``{node: [(off_from, off_until), ...]}``."""

    def __init__(self, off: dict[int, list[tuple[float, float]]]):
        self.off = off

    def available(self, node: int, t: float) -> bool:
        return not any(a <= t < b for a, b in self.off.get(node, []))

    def next_on(self, node: int, t: float) -> float:
        for a, b in sorted(self.off.get(node, [])):
            if a <= t < b:
                return b
        return t

    def next_off(self, node: int, t: float) -> float:
        if not self.available(node, t):
            return t
        return min((a for a, _ in self.off.get(node, []) if a > t), default=math.inf)


#: node -> (download s, compute s, upload s)
TRACE = {0: (2.0, 5.0, 1.0), 1: (1.0, 1.0, 1.0), 2: (1.0, 2.0, 2.0)}


def _clock(concurrency: int = 3, availability=None, buffer_size: int = 1, trace=TRACE) -> EventClock:
    link = _seconds_link()
    model = LinkModel(link, compute_s=[trace[n][1] for n in sorted(trace)])
    kw = {"availability": availability} if availability is not None else {}
    return EventClock(len(trace), concurrency, buffer_size=buffer_size, links=model,
                      sizes=lambda n: (int(trace[n][0]), int(trace[n][2])), **kw)


def _play(clock: EventClock, rounds: int) -> list[tuple[int, float, int]]:
    out = []
    for r in range(1, rounds + 1):
        plan = clock.plan(r)
        s = clock.finish(r)
        out.append((plan.arrivals[0], clock.now, s))
    return out


def test_event_order_and_staleness_on_a_hand_built_trace() -> None:
    """Three devices, all started at t = 0 (jobs of 8, 3 and 5 s). By hand: node 1 arrives at 3
    (staleness 0) and restarts (download 3-4, compute 4-5, upload 5-6); node 2 at 5 (version 1
    now, it had 0: staleness 1) and restarts (5-6-8-10); node 1 at 6 (staleness 1) and restarts
    (6-7-8-9); node 0 at 8 (it downloaded version 0, the server is at 3: staleness 3) and
    restarts (8-10-15-16); node 1 at 9 (it had version 3, the server is at 4: 1); node 2 at 10
    (it had version 2, the server is at 5: 3)."""
    got = _play(_clock(), 6)
    assert got == [(1, 3.0, 0), (2, 5.0, 1), (1, 6.0, 1), (0, 8.0, 3), (1, 9.0, 1), (2, 10.0, 3)]


def test_simultaneous_arrivals_are_ordered_by_node_id() -> None:
    same = {n: (1.0, 1.0, 1.0) for n in range(4)}
    got = _play(_clock(concurrency=4, trace=same), 4)
    assert [a for a, _, _ in got] == [0, 1, 2, 3] and {t for _, t, _ in got} == {3.0}
    assert [s for _, _, s in got] == [0, 1, 2, 3]


def test_fedbuff_versions_count_buffers_not_arrivals() -> None:
    """With K = 2 the server's version moves after arrivals 2, 4, 6: same order as above,
    staleness in server updates: node 1's second job (version 0, arrives at version 1): 1;
    node 0 (version 0, arrives after 3 arrivals, version 1): 1; node 1's third job (version
    1 at t = 6, arrives at version 2): 1; node 2's second job (version 1, arrives at 2): 1."""
    got = _play(_clock(buffer_size=2), 6)
    assert [a for a, _, _ in got] == [1, 2, 1, 0, 1, 2]
    assert [s for _, _, s in got] == [0, 0, 1, 1, 1, 1]


def test_a_device_that_is_off_is_never_started_and_one_that_leaves_loses_its_work() -> None:
    """Node 2 is off until t = 100; node 0 goes off at t = 4 (its job would arrive at 8) and is
    back at t = 20. Node 0's job is lost at 4 (no arrival from it before it comes back), node 2
    never starts before 100: before t = 20 every arrival is node 1's."""
    clock = _clock(availability=Windows({0: [(4.0, 20.0)], 2: [(0.0, 100.0)]}))
    got = _play(clock, 6)
    assert all(a == 1 for a, t, _ in got if t < 20)
    assert clock.lost == 1
    first = clock.plan(7)
    assert 2 not in first.dispatch or clock.now >= 100
    # every arrival came from a device that was on for its whole job
    assert [a for a, _, _ in got[:5]] == [1, 1, 1, 1, 1] and [t for _, t, _ in got[:5]] == [3.0, 6.0, 9.0, 12.0, 15.0]


def test_a_round_waits_for_a_device_to_come_on() -> None:
    """Every device is off until t = 50: the first job starts at 50 (node 1 arrives at 53)."""
    clock = _clock(availability=Windows({n: [(0.0, 50.0)] for n in TRACE}))
    plan = clock.plan(1)
    assert plan.dispatch == (0, 1, 2)
    clock.finish(1)
    assert clock.now == 53.0


def test_no_link_model_serves_simultaneous_arrivals_in_dispatch_order() -> None:
    """Without [links] every job takes no time, so every arrival ties at t = 0: the job
    dispatched first arrives first, and every client is heard (a (time, node id) order let
    node 0 win every tie: the server heard it alone, and FedAsync froze on its data)."""
    clock = EventClock(5, 2, seed=3)
    heard = []
    for r in range(1, 21):
        plan = clock.plan(r)
        first = min(clock.jobs.values(), key=lambda j: j.seq)
        assert len(clock.jobs) == 2 and plan.arrivals == (first.node,)
        heard.append(plan.arrivals[0])
        clock.finish(r)
        assert clock.now == 0.0
    assert set(heard) == set(range(5))


# --------------------------------------------------------------------------- staleness weights
def test_staleness_functions_are_the_papers() -> None:
    assert staleness_weight("constant", 7) == 1.0
    assert staleness_weight("polynomial", 3, a=0.5) == pytest.approx(4 ** -0.5)
    assert staleness_weight("hinge", 4, a=10, b=4) == 1.0
    assert staleness_weight("hinge", 6, a=10, b=4) == pytest.approx(1 / 21)
    assert fedasync_alpha(0.6, "polynomial", 0, a=0.5) == pytest.approx(0.6)
    assert [fedbuff_scale(s) for s in (0, 1, 3, 8)] == pytest.approx([1.0, 2 ** -0.5, 0.5, 1 / 3])
    with pytest.raises(ValueError):
        staleness_weight("linear", 1)


def test_fedasync_defaults_are_the_papers_and_unread_knobs_refused() -> None:
    hp = ALGORITHMS["fedasync"].Hyperparams()
    assert (hp.alpha, hp.staleness, hp.a, hp.b, hp.rho) == (0.6, "polynomial", 0.5, 4, 0.005)
    assert ALGORITHMS["fedasync"].Hyperparams(staleness="hinge").a == 10.0
    with pytest.raises(ValueError, match="hinge"):
        ALGORITHMS["fedasync"].Hyperparams(staleness="polynomial", b=2)
    fb = ALGORITHMS["fedbuff"].Hyperparams()
    assert (fb.buffer_size, fb.server_lr) == (10, 1.0)


def test_fedbuff_server_scales_buffers_and_steps_after_k() -> None:
    """x + lr * (D1 / sqrt(1 + 0) + D2 / sqrt(1 + 3)) / K after K = 2 arrivals, nothing before."""
    alg = ALGORITHMS["fedbuff"](ALGORITHMS["fedbuff"].Hyperparams(buffer_size=2, server_lr=0.5))
    x = {"w": torch.tensor([1.0, 2.0]), "n": torch.tensor(3)}
    state = {"params": x, "version": 5, "buffer": {"w": torch.zeros(2)}, "count": 0}
    d1, d2 = {"w": torch.tensor([2.0, 0.0])}, {"w": torch.tensor([0.0, 4.0])}
    s1 = alg.apply(None, state, d1, 0)
    assert torch.equal(s1["params"]["w"], x["w"]) and s1["version"] == 5 and s1["count"] == 1
    s2 = alg.apply(None, s1, d2, 3)
    want = x["w"] + 0.5 * (d1["w"] * 1.0 + d2["w"] / math.sqrt(4)) / 2
    assert torch.allclose(s2["params"]["w"], want) and s2["version"] == 6 and s2["count"] == 0
    assert torch.equal(s2["buffer"]["w"], torch.zeros(2)) and torch.equal(s2["params"]["n"], x["n"])


def test_fedasync_server_mixes_with_alpha_t() -> None:
    alg = ALGORITHMS["fedasync"](ALGORITHMS["fedasync"].Hyperparams(alpha=0.8, staleness="polynomial", a=1.0))
    x = {"w": torch.tensor([0.0, 10.0])}
    new = {"w": torch.tensor([10.0, 0.0])}
    out = alg.apply(None, {"params": x, "version": 0}, new, 3)  # alpha_t = 0.8 / 4 = 0.2
    assert torch.allclose(out["params"]["w"], torch.tensor([2.0, 8.0])) and out["version"] == 1


# --------------------------------------------------------------------------- real runs
def _async_config(root: Path, name: str, rounds: int = 8, links: bool = True, **alg) -> dict:
    cfg = digits_config(root, name, rounds=rounds, **alg)
    cfg.pop("topology", None)  # digits_config leaves it out already (conftest.without_round_sections)
    cfg["algorithm"].setdefault("concurrency", 3)
    if name == "fedbuff":
        cfg["algorithm"].setdefault("buffer_size", 2)
    if links:
        cfg["links"] = {"preset": "nbiot", "nodes": {"lorawan_sf7": [0, 1]}}  # two slower devices
    return cfg


class OffFor(Windows):
    """Node 5 is off the whole run; every device is off from 20 to 40 s (every job then in
    flight is lost, and nothing starts before 40 s)."""

    def __init__(self) -> None:
        super().__init__({5: [(0.0, 1e9)], **{n: [(20.0, 40.0)] for n in range(8) if n != 5}})


def _sim(exp, **kw) -> Simulation:
    sim = Simulation(exp, **kw)
    sim.observer(EventClock).availability = OffFor()
    return sim


@pytest.mark.parametrize("name", ["fedasync", "fedbuff"])
def test_async_run_honours_availability_and_counts_every_message(tmp_path: Path, name: str) -> None:
    exp = validate(_async_config(tmp_path, name, rounds=10))
    sim = _sim(exp)
    res = sim.run()
    cols = sim.ledger.columns()
    up = cols["direction"] == 0  # DIRECTIONS[0] == "up"
    assert 5 not in set(cols["src"][up].tolist()) and 5 not in set(cols["dst"].tolist())
    clock = sim.observer(EventClock)
    ups = [int(s) for s in cols["src"][up].tolist()]
    assert len(ups) == 10 == clock.arrived  # one upload per arrival, nothing more
    assert clock.lost >= 3 and res.summary["async"]["lost"] == clock.lost
    assert not any(20.0 < r["time/sim_s"] < 40.0 for r in res.metrics)  # nothing arrives in the outage
    # a lost job's download is in the ledger: downloads = arrivals + lost + still in flight
    downs = int((cols["direction"] == 1).sum())
    assert downs == 10 + clock.lost + len(clock.jobs)
    m = res.metrics
    assert all(m[i]["time/sim_s"] <= m[i + 1]["time/sim_s"] for i in range(len(m) - 1))
    assert all(r["async/staleness"] == r["alg/staleness"] for r in m[1:])  # the server's count = the clock's
    hist = res.summary["staleness_histogram"]
    assert sum(hist.values()) == 10 and res.summary["sim_time_s"] == m[-1]["time/sim_s"] > 0


@pytest.mark.parametrize("name", ["fedasync", "fedbuff"])
def test_killed_async_run_resumes_to_identical_metrics(tmp_path: Path, name: str) -> None:
    class Kill(Exception):
        pass

    def cfg(sub: str) -> dict:
        c = {**_async_config(tmp_path / sub, name, rounds=8), "checkpoint_every": 3}
        c["links"].update(retransmissions="sampled", up={"loss": 0.2})  # drawn per job: must resume too
        return c

    full = validate(cfg("full"))
    _sim(full).run()
    want = (Path(full.run_dir()) / "metrics.jsonl").read_text()
    want_summary = (Path(full.run_dir()) / "summary.json").read_text()

    def boom(r: int, total: int, rec: dict) -> None:
        if r == 5:  # round 5's metrics written, its checkpoint (every 3) is round 3's
            raise Kill

    cut = validate(cfg("cut"))
    with pytest.raises(Kill):
        _sim(cut, progress=boom).run()
    _sim(cut, resume=True).run()
    assert (Path(cut.run_dir()) / "metrics.jsonl").read_text() == want
    import json
    a, b = json.loads(want_summary), json.loads((Path(cut.run_dir()) / "summary.json").read_text())
    for k in ("staleness_histogram", "async", "sim_time_s", "bytes_up", "bytes_down"):
        assert a[k] == b[k], k


def test_fedasync_alpha_one_one_client_is_sequential_fedavg(tmp_path: Path) -> None:
    """alpha = 1, one client at a time, rho = 0: every update has staleness 0 and replaces the
    model, i.e. sequential training through the clients in the clock's order, which is FedAvg
    with one client per round on that schedule (topology sampling "list")."""
    a = _async_config(tmp_path / "a", "fedasync", rounds=5, links=False, alpha=1.0, staleness="constant",
                      rho=0.0, concurrency=1)
    sim = Simulation(validate(a), write=False)
    ra = sim.run()
    cols = sim.ledger.columns()
    order = [int(s) for s, d in zip(cols["src"].tolist(), cols["direction"].tolist()) if d == 0]
    assert len(order) == 5 and all(r["async/staleness"] == 0 for r in ra.metrics[1:])
    b = digits_config(tmp_path / "b", "fedavg", rounds=5)
    b["topology"] = {"kind": "star", "sampling": "list", "schedule": [[c] for c in order]}
    fsim = Simulation(validate(b), write=False)
    rb = fsim.run()
    pa = sim.executor.states[-1]["params"] if hasattr(sim.executor, "states") else None
    pb = fsim.executor.states[-1]["params"] if hasattr(fsim.executor, "states") else None
    if pa is not None and pb is not None:
        for k in pa:
            assert torch.allclose(pa[k].float(), pb[k].float(), atol=1e-5), k
    for x, y in zip(ra.metrics, rb.metrics):
        assert x["global/acc"] == pytest.approx(y["global/acc"], abs=0.01)
        assert x["global/loss"] == pytest.approx(y["global/loss"], rel=1e-4)


# --------------------------------------------------------------------------- refusals
@pytest.mark.parametrize("extra,key", [
    ({"topology": {"kind": "star", "sampling": "count", "count": 4}}, "topology.kind"),
    ({"links": {"preset": "nbiot", "deadline_s": 60.0}}, "links.deadline_s"),
    ({"faults": {"dropout": 0.2}}, "faults"),
])
def test_what_the_clock_cannot_time_is_refused_with_one_line(tmp_path: Path, extra: dict, key: str) -> None:
    cfg = {**_async_config(tmp_path, "fedasync", links=False), **extra}
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")) as e:
        Simulation(validate(cfg), write=False)
    assert "\n" not in str(e.value)
    assert not Path(cfg["out_dir"]).exists()


def test_a_codec_size_the_clock_did_not_time_stops_the_run(tmp_path: Path) -> None:
    sim = Simulation(validate(_async_config(tmp_path, "fedasync", rounds=2)), write=False)
    clock = sim.observer(EventClock)
    clock.sizes = lambda n: (5, 5)
    with pytest.raises(RuntimeError, match="timed it with 5"):
        sim.run()


def test_the_algorithm_refuses_a_plain_round_plan() -> None:
    from lowband.topology import build_topology

    alg = ALGORITHMS["fedasync"](ALGORITHMS["fedasync"].Hyperparams())
    with pytest.raises(ValueError, match="event clock"):
        alg.steps(1, build_topology("star", 4, 0, sampling="all").plan(0))


def test_flower_export_refuses_the_event_clock(tmp_path: Path) -> None:
    pytest.importorskip("flwr")
    from lowband.flower.adapter import _check_exportable

    sim = Simulation(validate(_async_config(tmp_path, "fedbuff", links=False)), write=False)
    with pytest.raises(ValueError, match="event clock"):
        _check_exportable(sim)


# --------------------------------------------------------------------------- ranking by time
def test_frontier_and_sweep_rank_by_time_to_target(tmp_path: Path) -> None:
    """A sweep over FedAsync and FedBuff on the event clock: sweep.md and frontier rows carry
    time to target and ranks by bytes and by time (1: cheapest)."""
    from lowband.batch import run_sweep
    from lowband.tradeoff import frontier_markdown, frontier_rows, FrontierCell

    base = _async_config(tmp_path, "fedasync", rounds=6)
    base["eval"] = {"target": 0.2, "protocols": ["global"], "main": "global/acc"}
    base["algorithm"] = {k: v for k, v in base["algorithm"].items() if k != "buffer_size"}
    out, cells = run_sweep(base, {"algorithm.concurrency": [1, 3]}, out=tmp_path / "sw", workers=1, progress=False)
    md = (out / "sweep.md").read_text()
    assert "rank (time to target)" in md and "time to target" in md
    from lowband.report import sweep_rows

    rows = sweep_rows(cells)
    reached = [r for r in rows if r["time_to_target_s"] is not None]
    assert reached and sorted(r["rank_time"] for r in reached)[0] == 1
    fcells = [FrontierCell(f"c{i}", "fp32", cell=c) for i, c in enumerate(cells)]
    frows = frontier_rows(fcells, None)
    assert [r["rank_time"] for r in frows] == [r["rank_time"] for r in rows]
    assert "rank (time to target)" in frontier_markdown(frows)


def test_retime_refuses_an_asynchronous_run(tmp_path: Path) -> None:
    from lowband.tradeoff import retime_run

    res = Simulation(validate(_async_config(tmp_path, "fedasync", rounds=2))).run()
    with pytest.raises(ConfigError, match="asynchronous"):
        retime_run(res.run_dir, ["lte"])
