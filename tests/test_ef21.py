"""EF21 (Richtarik, Sokolov, Fatkhullin 2021): ``ef21(c)`` (issue 17 part 1).

Properties: the receiver's estimate equals the sender's after every delivered message and
converges to a constant input (top-k: exactly, within numel/k messages); a message that is
dropped (not delivered, a straggler past the deadline) or refused (the validator) moves
neither copy; a run resumes byte-identically with both copies in the checkpoint; FedAvg on
digits with EF21 on its deltas learns at top-k's bytes, and a broadcast is encoded per
receiver; with the two ends in different places (worker processes, Ray shards) the
receiver's acknowledgement moves the sender's copy, and a pooled run equals the serial
one byte for byte (final codec states included, so an ack path that did nothing fails);
under Flower or where EF21 is not the whole spec, it is refused, one line."""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path

import pytest
import torch

from conftest import digits_config
from test_pool import _same_ledger, _same_states
from lowband.comm import Ledger, Message, WireError, parse_codec
from lowband.comm.network import CodecConfig, Network
from lowband.comm.validate import ValidationPolicy, Validator
from lowband.comm.wire import header_size
from lowband.config import validate
from lowband.engine.checks import LowbandWarning
from lowband.engine.pool import PoolExecutor
from lowband.engine.runlog import RunLog
from lowband.engine.simulator import Simulation
from lowband.seeding import torch_gen

SPEC = "ef21(topk(0.1))"


def randn(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(shape, generator=torch_gen(seed, "ef21-x"))


def copies(net: Network, src: int, dst: int, kind: str, name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(the sender's estimate, the receiver's) of one tensor on link src -> dst."""
    return (net.codec_states[src][f"{dst}:{kind}"][name]["g"],
            net.codec_states[dst][f"from:{src}:{kind}"][name]["g"])


# ----------------------------------------------------------------------------- the mechanism


def test_estimate_equals_the_senders_and_converges_to_a_constant_input() -> None:
    """600 entries, top-k 10% (60 per message): each message contracts ||x - g|| by at
    least sqrt(1 - k/n) (top-k's contraction), and after 10 messages every entry has been
    sent once, so the estimate is x exactly. Plain top-k would stay 10% of x."""
    net = Network(CodecConfig(by_direction={"up": SPEC}), Ledger(), seed=0)
    x = randn(20, 30, seed=1)
    bias = torch.arange(5)  # an int tensor travels raw, outside the estimate
    err = float(x.norm())
    plain = parse_codec("topk(0.1)")
    for r in range(1, 13):
        got = net.send(Message("delta", {"w": x, "i": bias}), 3, -1, round=r, direction="up")
        sent, mirror = copies(net, 3, -1, "delta", "w")
        assert torch.equal(sent, mirror) and torch.equal(got.tensors["w"], mirror)  # one estimate, two copies
        assert torch.equal(got.tensors["i"], bias) and "i" not in net.codec_states[-1]["from:3:delta"]
        new = float((x - got.tensors["w"]).norm())
        assert new <= math.sqrt(1 - 60 / 600) * err + 1e-6, (r, new, err)
        err = new
        if r >= 10:
            assert torch.equal(got.tensors["w"], x), r
    assert err == 0.0
    # the bytes are top-k's (the header names the codec: 6 characters more)
    data = net.encode(Message("delta", {"w": x}), 3, -1, round=99)
    assert len(data) - header_size(data) == plain.size_of((20, 30))
    one_plain = plain.decode(plain.encode(x, torch_gen(0)))
    assert float((x - one_plain).norm()) > 0.5 * float(x.norm())  # what "doing nothing" would leave


def test_tracks_a_moving_input_better_than_plain_topk() -> None:
    """x_t is a slow random walk: EF21's estimate stays close (it sends the change), while
    one top-k message of x_t keeps losing 90% of the coordinates."""
    net = Network(CodecConfig(default=SPEC), Ledger(), seed=0)
    plain = parse_codec("topk(0.1)")
    x, errs, plain_errs = randn(400, seed=2), [], []
    for r in range(1, 41):
        x = x + 0.02 * randn(400, seed=100 + r)
        got = net.send(Message("u", {"w": x}), 0, 1, round=r, direction="peer").tensors["w"]
        errs.append(float((x - got).norm() / x.norm()))
        plain_errs.append(float((x - plain.decode(plain.encode(x, torch_gen(r)))).norm() / x.norm()))
    assert max(errs[-10:]) < 0.25 < min(plain_errs[-10:]), (errs[-10:], plain_errs[-10:])


def test_dropped_or_refused_messages_move_neither_copy() -> None:
    """Encoded but never delivered (a dropped message), truncated bytes (refused: malformed),
    non-finite values (refused at the sender): both copies stay as they were, and the next
    delivered message decodes to exactly what the sender meant (g + C(x - g))."""
    net = Network(CodecConfig(default=SPEC), Ledger(), seed=0, validator=Validator(ValidationPolicy()))
    x1, x2, x3 = randn(50, seed=1), randn(50, seed=2), randn(50, seed=3)
    net.send(Message("delta", {"w": x1}), 2, -1, round=1, direction="up")
    before = [t.clone() for t in copies(net, 2, -1, "delta", "w")]

    def unchanged() -> None:
        now = copies(net, 2, -1, "delta", "w")
        assert torch.equal(now[0], before[0]) and torch.equal(now[1], before[1])

    (dropped,) = net.encode_outbox(2, 2, [((-1,), Message("delta", {"w": x2}))])  # never delivered
    assert dropped.data is not None
    unchanged()
    (cut,) = net.encode_outbox(3, 2, [((-1,), Message("delta", {"w": x2}))])
    assert net.receive(cut.data[:-4], 2, (-1,), round=3, kind="delta") == {}
    assert [r.reason for r in net.rejections] == ["malformed"]
    unchanged()
    bad = x2.clone()
    bad[7] = float("nan")
    assert net.send(Message("delta", {"w": bad}), 2, -1, round=4, direction="up") is None
    assert [r.reason for r in net.rejections] == ["malformed", "nonfinite"]
    unchanged()
    got = net.send(Message("delta", {"w": x3}), 2, -1, round=5, direction="up").tensors["w"]
    c = parse_codec("topk(0.1)")
    want = before[0] + c.decode(c.encode(x3 - before[0], torch_gen(0)))  # top-k draws nothing random
    assert torch.equal(got, want)
    sent, mirror = copies(net, 2, -1, "delta", "w")
    assert torch.equal(sent, mirror) and torch.equal(mirror, got)


def test_network_broadcast_keeps_one_estimate_per_receiver_and_one_message_per_link() -> None:
    net = Network(CodecConfig(default=SPEC), Ledger(), seed=0)
    x = randn(100, seed=4)
    net.broadcast(Message("weights", {"w": x}), -1, [1, 2], round=1, direction="down")
    got = net.broadcast(Message("weights", {"w": x}), -1, [2, 3], round=2, direction="down")
    assert sorted(net.codec_states[-1]) == ["1:weights", "2:weights", "3:weights"]
    for d in (1, 2, 3):
        sent, mirror = copies(net, -1, d, "weights", "w")
        assert torch.equal(sent, mirror)
    assert torch.equal(got[3].tensors["w"], copies(net, -1, 3, "weights", "w")[1])
    assert float((x - got[2].tensors["w"]).norm()) < float((x - got[3].tensors["w"]).norm())  # 2 heard twice
    assert net.ledger.totals(direction="down")[0] == 4 * len(net.encode(Message("weights", {"w": x}), -1, 1, round=3))
    with pytest.raises(WireError, match="one per step"):
        net.encode_outbox(4, 5, [((-1,), Message("delta", {"w": x})), ((-1,), Message("delta", {"w": x}))])


def test_ef21_bytes_that_no_sender_here_encoded_are_refused() -> None:
    """Bytes naming ef21 whose sender keeps no estimate for the link (crafted, or from
    another process) are refused as malformed, not decoded into a wrong estimate."""
    other = Network(CodecConfig(default=SPEC), Ledger(), seed=0)
    data = other.encode(Message("delta", {"w": randn(30)}), 4, -1, round=1)
    net = Network(CodecConfig(default="fp32"), Ledger(), seed=0, validator=Validator(ValidationPolicy()))
    assert net.receive(data, 4, (-1,), round=1, kind="delta") == {}
    assert [r.reason for r in net.rejections] == ["malformed"] and net.codec_states == {}
    with pytest.raises(ValueError, match="no estimate of node 4"):
        Network(CodecConfig(), Ledger(), seed=0).receive(data, 4, (-1,), round=1)


def _two_places(spec: str = SPEC) -> tuple[Network, Network]:
    """The networks of two places: node 2 lives in the first, the server (-1) in the second."""
    a = Network(CodecConfig(default=spec), Ledger(), seed=0, validator=Validator(ValidationPolicy()))
    b = Network(CodecConfig(default=spec), Ledger(), seed=0, validator=Validator(ValidationPolicy()))
    a.remote = lambda node: node != 2
    b.remote = lambda node: node == 2
    return a, b


def test_an_ack_moves_the_senders_copy_in_another_place_by_the_same_correction() -> None:
    """Sender and receiver in two networks: the receiver's acceptance moves its copy and
    yields an ack (not the tensor: a digest); the sender's copy moves only when the ack
    arrives, to the same bits; a dropped message (no ack) moves neither; a sender using the
    link again in the very next step (ack not yet back) is refused; a forged digest or an
    ack of nothing in flight is an error."""
    a, b = _two_places()
    x = [randn(40, seed=s) for s in range(5)]
    for r in (1, 2, 3):
        a.step_tag = (r, 0)
        (t,) = a.encode_outbox(r, 2, [((-1,), Message("delta", {"w": x[r]}))])
        assert (2, -1, "delta") in a.in_flight
        got = b.receive(t.data, 2, (-1,), round=r, kind="delta")[-1].tensors["w"]
        mirror = b.codec_states[-1]["from:2:delta"]["w"]["g"]
        assert torch.equal(got, mirror)
        (ack,) = b.acks
        assert ack[:3] == (2, -1, "delta") and isinstance(ack[3]["w"], bytes)
        before = a.codec_states[2]["-1:delta"]["w"].get("g")
        assert before is None or not torch.equal(before, mirror)  # not moved before the ack
        a.apply_acks(b.acks)
        b.acks = []
        assert torch.equal(a.codec_states[2]["-1:delta"]["w"]["g"], mirror) and not a.in_flight
    # dropped: encoded, never received, never acked; the next message still decodes right
    a.step_tag = (4, 0)
    a.encode_outbox(4, 2, [((-1,), Message("delta", {"w": x[4]}))])
    a.step_tag = (4, 1)
    with pytest.raises(RuntimeError, match="two consecutive steps"):
        a.encode_outbox(4, 2, [((-1,), Message("delta", {"w": x[4]}))])
    a.step_tag = (5, 0)
    (t,) = a.encode_outbox(5, 2, [((-1,), Message("delta", {"w": x[0]}))])
    b.receive(t.data, 2, (-1,), round=5, kind="delta")
    forged = [(2, -1, "delta", {"w": bytes(16)})]
    with pytest.raises(RuntimeError, match="differ at the sender and the receiver"):
        a.apply_acks(forged)
    with pytest.raises(RuntimeError, match="not in flight"):
        a.apply_acks(b.acks)  # its entry was consumed by the forged ack above


def test_ef21_bytes_from_a_remote_sender_on_a_link_without_ef21_are_refused() -> None:
    """A receiver accepts EF21 bytes from another place only on a link whose configured
    codec is that EF21 spec."""
    sender, _ = _two_places()
    (t,) = sender.encode_outbox(1, 2, [((-1,), Message("delta", {"w": randn(30)}))])
    net = Network(CodecConfig(default="fp32"), Ledger(), seed=0, validator=Validator(ValidationPolicy()))
    net.remote = lambda node: node == 2
    assert net.receive(t.data, 2, (-1,), round=1, kind="delta") == {}
    assert [r.reason for r in net.rejections] == ["malformed"] and net.acks == [] and net.codec_states == {}


# ----------------------------------------------------------------------------- runs


def _cfg(root: Path, rounds: int = 4, spec: str = SPEC, **extra: object) -> dict:
    cfg = digits_config(root, "fedavg", rounds=rounds, upload="delta")
    cfg["comm"] = {"by_direction": {"up": spec}}
    cfg.update(extra)
    return cfg


def _run(cfg: dict, **kw) -> Simulation:
    sim = Simulation(validate(cfg), **kw)
    sim.result = sim.run()
    return sim


def _metrics(sim: Simulation) -> list[dict]:
    return [json.loads(x) for x in (Path(sim.result.run_dir) / "metrics.jsonl").read_text().splitlines()]


def test_stragglers_past_the_deadline_leave_both_copies_equal(tmp_path: Path) -> None:
    """FedAvg with half the clients slow and a deadline: late uploads are counted but not
    delivered; every client's estimate still equals the server's copy of it."""
    sim = _run(_cfg(tmp_path, rounds=6, faults={"straggler": 0.5, "deadline": 2.0}))
    assert sum(m.get("faults/late", 0) for m in _metrics(sim)) >= 2
    states, checked = sim.network.codec_states, 0
    for client, links in states.items():
        if client == -1:
            continue
        sent = links["-1:delta"]
        mirror = states[-1].get(f"from:{client}:delta", {})
        for name, st in sent.items():
            assert ("g" in st) == ("g" in mirror.get(name, {})), (client, name)
            if "g" in st:
                assert torch.equal(st["g"], mirror[name]["g"]), (client, name)
                checked += 1
    assert checked >= 8


def test_fedavg_with_ef21_learns_at_topk_bytes(tmp_path: Path) -> None:
    """10 rounds, 4 of 8 clients: accuracy well above chance (10 classes), above plain
    top-k's, at top-k's uplink bytes (+6 header bytes per message for the longer name)."""
    ef21 = _run(_cfg(tmp_path / "a", rounds=10))
    topk = _run(_cfg(tmp_path / "b", rounds=10, spec="topk(0.1)"))
    a, b = _metrics(ef21)[-1], _metrics(topk)[-1]
    assert a["global/acc"] > 0.6 and a["global/acc"] > b["global/acc"], (a["global/acc"], b["global/acc"])
    up = ef21.network.ledger.cumulative(10)["up"]
    assert up == topk.network.ledger.cumulative(10)["up"] | {"encoded": up["encoded"]}  # same messages
    assert up["encoded"] - b["bytes/up"] == (len(SPEC) - len("topk(0.1)")) * up["messages"]
    assert a["bytes/up"] == up["encoded"]


class _Kill(Exception):
    pass


def test_run_resumes_byte_identically_with_both_copies(tmp_path: Path) -> None:
    full = _run(_cfg(tmp_path / "full", rounds=5))
    cfg = _cfg(tmp_path / "cut", rounds=5)

    def boom(r: int, total: int, rec: dict) -> None:
        if r == 3:  # round 3's metrics written, its checkpoint not
            raise _Kill

    with pytest.raises(_Kill):
        Simulation(validate(cfg), progress=boom).run()
    ckpt = torch.load(Path(cfg["out_dir"]) / "checkpoint.pt", weights_only=True)["codecs"]
    mirrors = [link for link in ckpt["-1"] if link.startswith("from:")]
    assert len(mirrors) >= 4 and all(float(st["g"].abs().sum()) > 0 for m in mirrors for st in ckpt["-1"][m].values())
    resumed = _run(cfg, resume=True)
    assert (Path(full.result.run_dir) / "metrics.jsonl").read_text() == \
        (Path(resumed.result.run_dir) / "metrics.jsonl").read_text()
    a, b = full.network.codec_state_dict(), resumed.network.codec_state_dict()
    assert a.keys() == b.keys() and all(
        torch.equal(st["g"], b[n][link][t]["g"]) for n in a for link in a[n] for t, st in a[n][link].items())
    # a resume that lost the receivers' copies would diverge: drop them and rerun round 4-5
    lost = _cfg(tmp_path / "lost", rounds=5)
    with pytest.raises(_Kill):
        Simulation(validate(lost), progress=boom).run()
    path = Path(lost["out_dir"]) / "checkpoint.pt"
    raw = torch.load(path, weights_only=True)
    raw["codecs"]["-1"] = {k: v for k, v in raw["codecs"]["-1"].items() if not k.startswith("from:")}
    RunLog(path.parent).save_checkpoint(raw)  # through the run log: its manifest records the edit
    with pytest.raises(RuntimeError, match="differ at the sender and the receiver"):
        _run(lost, resume=True)


# ----------------------------------------------------------------------------- refusals


def same_codec_states(a: dict, b: dict) -> int:
    """Assert two runs' codec states are equal, tensor for tensor; the number of estimates."""
    assert list(a) == list(b)
    n = 0
    for node in a:
        assert list(a[node]) == list(b[node]), node
        for link in a[node]:
            assert a[node][link].keys() == b[node][link].keys(), (node, link)
            for t, st in a[node][link].items():
                assert st.keys() == b[node][link][t].keys(), (node, link, t)
                for k, v in st.items():
                    assert torch.equal(v, b[node][link][t][k]), (node, link, t, k)
                    n += 1
    return n


def both_ends_equal(sd: dict) -> int:
    """Assert every sender's estimate equals its receiver's copy; the number checked."""
    n = 0
    for src, links in sd.items():
        for link, per in links.items():
            if link.startswith("from:"):
                continue
            dst, kind = link.split(":")
            mirror = sd.get(dst, {}).get(f"from:{src}:{kind}", {})
            for name, st in per.items():
                assert ("g" in st) == ("g" in mirror.get(name, {})), (src, link, name)
                if "g" in st:
                    assert torch.equal(st["g"], mirror[name]["g"]), (src, link, name)
                    n += 1
    return n


def _pool_cfg(root: Path, rounds: int, workers: int) -> dict:
    """FedAvg, EF21 top-k deltas up and an EF21 download, dropout and stragglers."""
    cfg = _cfg(root, rounds=rounds, faults={"dropout": 0.2, "straggler": 0.3, "deadline": 1.5},
               engine={"workers": workers})
    cfg["comm"] = {"by_direction": {"up": SPEC, "down": "ef21(topk(0.5))"}}
    return cfg


def test_worker_pool_matches_serial_with_faults_and_resumes(tmp_path: Path) -> None:
    """Two worker processes (clients 0-3 with the server, 4-7 apart): metrics.jsonl, the
    ledger, the node states and every codec state (both ends of every link, up and down)
    equal the serial run's, with dropped and late messages; a pooled run interrupted after
    round 2 resumes on the pool to the same results."""
    serial = _run(_pool_cfg(tmp_path / "serial", 4, 1))
    par = _run(_pool_cfg(tmp_path / "pool", 4, 2))
    assert isinstance(par.executor, PoolExecutor) and par.executor.num_workers == 2
    ms = (Path(serial.result.run_dir) / "metrics.jsonl").read_text()
    assert ms == (Path(par.result.run_dir) / "metrics.jsonl").read_text()
    recs = _metrics(serial)
    assert sum(m.get("faults/dropped", 0) for m in recs) >= 1 and sum(m.get("faults/late", 0) for m in recs) >= 1
    _same_ledger(serial, par)
    _same_states(serial.executor.states, par.executor.states)
    codecs = par.executor.codec_state_dict()
    assert same_codec_states(serial.network.codec_state_dict(), codecs) >= 40
    # both ends moved, for links across the two workers too (server -> client 5, 5 -> server)
    assert both_ends_equal(codecs) >= 20 and "5:weights" in codecs["-1"] and "from:5:delta" in codecs["-1"]

    cut = _pool_cfg(tmp_path / "cut", 4, 2)

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
    assert isinstance(resumed.executor, PoolExecutor)
    assert (Path(resumed.result.run_dir) / "metrics.jsonl").read_text() == ms
    same_codec_states(serial.network.codec_state_dict(), resumed.executor.codec_state_dict())


def test_auto_workers_may_pool_an_ef21_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("lowband.engine.pool.usable_cores", lambda: 2)
    monkeypatch.setattr("lowband.engine.pool.AUTO_MIN_WORK", 0)
    sim = Simulation(validate(_cfg(tmp_path, engine={"workers": "auto"})))
    try:
        assert sim.workers == 2 and isinstance(sim.executor, PoolExecutor)
    finally:
        sim.executor.close()


def test_a_broadcast_is_encoded_per_receiver_at_its_bytes(tmp_path: Path) -> None:
    """FedAvg's download (one message for the 4 sampled clients) under EF21: each client's
    copy equals the server's estimate for that client, clients sampled in different rounds
    hold different estimates, and the downlink costs top-k's bytes per receiver."""
    spec = "ef21(topk(0.5))"
    cfg = _cfg(tmp_path / "a", rounds=5, spec="fp32")
    cfg["comm"] = {"by_direction": {"down": spec}}
    with warnings.catch_warnings():
        warnings.simplefilter("error", LowbandWarning)  # no "sparsifies whole weights" warning
        sim = _run(cfg)
    ref = _cfg(tmp_path / "b", rounds=5, spec="fp32")
    ref["comm"] = {"by_direction": {"down": "topk(0.5)"}}
    with pytest.warns(LowbandWarning, match="sparsifies whole weights"):
        plain = _run(ref)
    states, ests = sim.network.codec_states, {}
    for link, per in states[-1].items():
        client, kind = link.split(":")
        assert kind == "weights" and client != "bcast", link
        for name, st in per.items():
            assert torch.equal(st["g"], states[int(client)]["from:-1:weights"][name]["g"]), (client, name)
        ests[int(client)] = torch.cat([st["g"].reshape(-1) for _, st in sorted(per.items())])
    assert len(ests) >= 6 and len({tuple(e[:50].tolist()) for e in ests.values()}) >= 2
    down, want = sim.network.ledger.cumulative(5)["down"], plain.network.ledger.cumulative(5)["down"]
    assert down["messages"] == want["messages"] == 20
    assert down["encoded"] - want["encoded"] == (len(spec) - len("topk(0.5)")) * 20
    # the clients get a dense estimate of the weights, not top-k's half of them (which warns)
    assert _metrics(sim)[-1]["global/acc"] > _metrics(plain)[-1]["global/acc"] + 0.05


@pytest.mark.parametrize("spec", ["ef21", "topk(0.01)+ef21(sign)", "ef21(sign)+fp16", "ef21(ef(sign))",
                                  "ef(ef21(sign))", "ef21(powersgd(2))"])
def test_bad_specs_are_refused(spec: str) -> None:
    with pytest.raises(ValueError) as exc:
        parse_codec(spec)
    assert "\n" not in str(exc.value) and "ef21" in str(exc.value)


def test_flower_refuses_it_as_a_codec_with_state(tmp_path: Path) -> None:
    """A ClientApp keeps no codec state between rounds (nor a mirror at the ServerApp)."""
    pytest.importorskip("flwr")
    from lowband.flower.adapter import _check_exportable

    sim = Simulation(validate(_cfg(tmp_path)), write=False)
    with pytest.raises(ValueError) as exc:
        _check_exportable(sim)
    assert "\n" not in str(exc.value) and SPEC in str(exc.value) and "stateless codec" in str(exc.value)
