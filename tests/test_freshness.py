"""Freshness (lowband.comm.validate, ``freshness``): every message is bound to the (round,
step) it was sent in; a replayed or re-ordered message is refused with the counted reason
``stale``; the stamp's bytes are counted; a fresh run learns exactly what it learned
without the stamp."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from conftest import digits_config
from lowband.comm.ledger import Ledger
from lowband.comm.message import Message
from lowband.comm.network import CodecConfig, Network
from lowband.comm.validate import FRESH_KEY, ValidationPolicy, Validator
from lowband.config import validate


def _net(fresh: bool) -> Network:
    return Network(CodecConfig(), Ledger(), seed=0, validator=Validator(ValidationPolicy(freshness=fresh)))


def _send(net: Network, round: int, step: int) -> bytes:
    net.step_tag = (round, step)
    (t,) = net.encode_outbox(round, 1, [((-1,), Message("delta", {"w": torch.ones(3)}, meta={"num_examples": 4}))])
    return t.data


def test_fresh_message_accepted_replay_and_reorder_refused() -> None:
    net = _net(True)
    data = _send(net, 3, 0)
    net.step_tag = (3, 1)  # delivered in the next step of the same round
    got = net.receive(data, 1, (-1,), round=3)
    assert FRESH_KEY not in got[-1].meta and got[-1].meta == {"num_examples": 4} and not net.rejections
    net.step_tag = (4, 1)  # the same bytes replayed a round later
    assert net.receive(data, 1, (-1,), round=4) == {}
    net.step_tag = (3, 2)  # ... or a step later (out of order)
    assert net.receive(data, 1, (-1,), round=3) == {}
    unstamped = _send(_net(False), 3, 0)  # bytes that carry no stamp
    net.step_tag = (3, 1)
    assert net.receive(unstamped, 1, (-1,), round=3) == {}
    assert [r.reason for r in net.rejections] == ["stale"] * 3
    assert "round 3, step 0; expected round 4" in net.rejections[0].detail


def test_the_stamp_is_counted() -> None:
    assert len(_send(_net(True), 3, 0)) > len(_send(_net(False), 3, 0))


def test_a_fresh_run_learns_the_same(tmp_path: Path) -> None:
    from lowband.engine.simulator import Simulation

    runs = {}
    for fresh in (False, True):
        sim = Simulation(validate(digits_config(tmp_path / str(fresh), "scaffold", rounds=2)))
        v = sim.network.validator
        sim.network.validator = Validator(dataclasses.replace(v.policy, freshness=fresh), v.expected)
        runs[fresh] = sim.run()
    a, b = runs[False].metrics[-1], runs[True].metrics[-1]
    assert a["global/acc"] == b["global/acc"] and not any(k.startswith("rejected/") for k in b)
    assert b["bytes/total"] > a["bytes/total"]


def test_the_config_key_turns_freshness_on(tmp_path: Path) -> None:
    from lowband.engine.simulator import Simulation

    cfg = digits_config(tmp_path / "on", "fedavg", rounds=2)
    cfg["comm"] = {**cfg.get("comm", {}), "freshness": True}
    sim = Simulation(validate(cfg))
    assert sim.network.validator.policy.freshness
    on = sim.run().metrics[-1]
    off = Simulation(validate(digits_config(tmp_path / "off", "fedavg", rounds=2))).run().metrics[-1]
    assert on["global/acc"] == off["global/acc"] and not any(k.startswith("rejected/") for k in on)
    assert on["bytes/total"] > off["bytes/total"]
