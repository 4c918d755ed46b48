"""HierFAVG (lowband.algorithms.server.hierfavg): the hierarchy's bytes per tier equal the
formula, gateways are nodes (their own state) on their own link preset, and device-gateway
messages travel on the devices' links."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import digits_config
from lowband.comm.codecs import parse_codec
from lowband.comm.links import PRESETS, transmit
from lowband.comm.message import DIRECTIONS, SERVER, Message
from lowband.comm.wire import encode_message
from lowband.config import ConfigError, validate
from lowband.engine.observers import LinkClock
from lowband.engine.simulator import Simulation
from lowband.seeding import torch_gen


def _cfg(tmp_path: Path, rounds: int = 2, **alg: object) -> dict:
    cfg = digits_config(tmp_path, "hierfavg", rounds=rounds, kappa1=3, kappa2=3, edges=2, **alg)
    cfg["data"]["num_clients"] = 10  # devices 0-7, gateways 8 (devices 0-3) and 9 (devices 4-7)
    cfg["topology"] = {"kind": "star", "sampling": "count", "count": 6}
    return cfg


def _size(params: dict, meta: dict | None = None, kind: str = "weights") -> int:
    return len(encode_message(Message(kind, dict(params), meta or {}), parse_codec("fp32"), torch_gen(0, "size")))


def test_bytes_per_tier_equal_the_formula(tmp_path: Path) -> None:
    """Per cloud round, with D sampled devices, E gateways, kappa2 edge rounds and S(m) the
    encoded size of message m: down = E x S(global); up = sum over gateways with devices of
    S(edge_weights with their devices' example count); peer = kappa2 x sum over devices of
    (S(edge) + S(weights with its example count))."""
    sim = Simulation(validate(_cfg(tmp_path)))
    sim.run()
    alg, fed = sim.alg, sim.fed
    assert alg.gateways == (8, 9) and [alg.gateway_of(d) for d in range(8)] == [8] * 4 + [9] * 4
    p = sim.builder.init_params(0)
    cols = sim.ledger.columns()
    for r in (1, 2):
        plan = sim.topology.plan(r - 1)
        devices = [d for d in plan.participants if d not in alg.gateways]
        m = cols["round"] == r
        by_dir = {d: int(cols["encoded"][m & (cols["direction"] == DIRECTIONS.index(d))].sum())
                  for d in ("down", "up", "peer")}
        assert by_dir["down"] == 2 * _size(p, kind="global")
        groups = {g: [d for d in devices if alg.gateway_of(d) == g] for g in alg.gateways}
        assert by_dir["up"] == sum(_size(p, {"num_examples": sum(int(fed.nodes[d].n_train) for d in ds)}, "edge_weights")
                                   for ds in groups.values() if ds)
        per_device = [_size(p, {"k": 1}, "edge") + _size(p, {"num_examples": int(fed.nodes[d].n_train)}) for d in devices]
        assert by_dir["peer"] == 3 * sum(per_device)
        # the device tier is gateway <-> its own devices only; the cloud tier the server <-> gateways
        peer = m & (cols["direction"] == DIRECTIONS.index("peer"))
        for s, d in zip(cols["src"][peer].tolist(), cols["dst"][peer].tolist()):
            dev, gw = (s, d) if d in alg.gateways else (d, s)
            assert gw == alg.gateway_of(dev) and dev in devices
        cloud = m & (cols["direction"] != DIRECTIONS.index("peer"))
        assert set(cols["src"][cloud].tolist()) | set(cols["dst"][cloud].tolist()) <= {SERVER, 8, 9}


def test_gateways_are_nodes_with_their_own_state_and_link(tmp_path: Path) -> None:
    """The gateways hold the last edge model; the cloud tier runs on the gateways' LTE, the
    device tier on the devices' NB-IoT: a round lasts the formula's time."""
    cfg = _cfg(tmp_path, rounds=1)
    cfg["topology"] = {"kind": "star", "sampling": "all"}
    cfg["algorithm"]["kappa2"] = 1
    cfg["links"] = {"preset": "nbiot", "nodes": {"lte": [8, 9]}, "device_flops": 0}
    sim = Simulation(validate(cfg))
    res = sim.run()
    states = sim.executor.states
    assert set(states[8]) == {"params", "n"} and "params" not in states[0]
    assert any((states[8]["params"][k] != states[9]["params"][k]).any() for k in states[8]["params"])
    nb, lte = PRESETS["nbiot"], PRESETS["lte"]
    cols = sim.ledger.columns()
    size = {(s, d): b for s, d, b in zip(cols["src"].tolist(), cols["dst"].tolist(), cols["encoded"].tolist())}
    expect = 0.0
    for g in (8, 9):
        at_gw = transmit(lte.down, size[(SERVER, g)]).arrival
        ds = [d for d in range(8) if sim.alg.gateway_of(d) == g]
        # each device has its own downlink: the gateway reaches its devices in parallel
        ups = [at_gw + transmit(nb.down, size[(g, d)]).arrival + transmit(nb.up, size[(d, g)]).arrival for d in ds]
        expect = max(expect, max(ups) + transmit(lte.up, size[(g, SERVER)]).arrival)
    rec = res.metrics[-1]
    assert rec["time/round_s"] == pytest.approx(expect, rel=1e-12)
    assert sim.observer(LinkClock).timer.model.relays == frozenset({8, 9})


def test_hierfavg_refuses_too_few_nodes_for_its_gateways(tmp_path: Path) -> None:
    cfg = digits_config(tmp_path, "hierfavg", rounds=1, edges=5)
    with pytest.raises(ConfigError, match="8 nodes cannot hold 5 gateways"):
        Simulation(validate(cfg))


def test_a_gateway_whose_devices_left_sends_its_last_edge_model(tmp_path: Path) -> None:
    """Devices 0-3 (gateway 8) are on only for the round's first edge aggregation: their
    later replies are lost, yet gateway 8 still sends the edge model they made to the cloud
    (weighted by their examples); devices 4-7 stay on throughout."""
    from lowband.devices.traces import write_availability_trace

    def run(name: str, windows: dict) -> Simulation:
        cfg = _cfg(tmp_path / name, rounds=1)
        cfg["topology"] = {"kind": "star", "sampling": "all"}
        cfg["links"] = {"preset": "nbiot", "nodes": {"lte": [8, 9]}}
        (tmp_path / name).mkdir(parents=True, exist_ok=True)
        write_availability_trace(tmp_path / name / "a.csv", windows)
        cfg["devices"] = {"availability": {"kind": "trace", "path": str(tmp_path / name / "a.csv")}}
        sim = Simulation(validate(cfg))
        sim.run()
        return sim

    on = {i: [(0.0, 1e9)] for i in range(8)}
    full = run("full", on)
    cols = full.ledger.columns()
    model = full.observer(LinkClock).timer.model
    clock = model.clock(0.0, 1)
    first_reply = {}
    for s, d, di, b in zip(cols["src"].tolist(), cols["dst"].tolist(), cols["direction"].tolist(),
                           cols["encoded"].tolist()):
        t = clock.transfer(s, d, DIRECTIONS[di], b)
        if d == 8 and s in range(4) and s not in first_reply:
            first_reply[s] = t
    leave = max(first_reply.values()) + 1.0  # after their first replies, before their second
    gone = run("gone", {**on, **{i: [(0.0, leave)] for i in range(4)}})
    gcols = gone.ledger.columns()
    up8 = (gcols["src"] == 8) & (gcols["dst"] == SERVER)
    assert int(up8.sum()) == 1  # gateway 8 still reports to the cloud
    last = json.loads((Path(gone.exp.run_dir()) / "metrics.jsonl").read_text().splitlines()[-1])
    assert last["devices/departed"] == 4
    assert gone.executor.states[8]["n"] == 0  # reset after the round
