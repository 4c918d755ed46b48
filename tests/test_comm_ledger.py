"""Ledger and Network: the ledger counts exactly the bytes that were encoded."""

from __future__ import annotations

import io
import time

import pytest
import torch

from lowband.comm import (
    SERVER,
    CodecConfig,
    DeclaredTensor,
    Ledger,
    Message,
    Network,
    declared_bytes,
    decode_message,
    encode_message,
    parse_codec,
)
from lowband.seeding import torch_gen


def weights(seed: int = 0) -> Message:
    g = torch_gen(seed, "w")
    return Message("weights", {"fc1.weight": torch.randn(64, 32, generator=g),
                               "fc1.bias": torch.randn(64, generator=g),
                               "bn.num_batches_tracked": torch.tensor(3)},
                   {"num_examples": 100 + seed})


# ----------------------------------------------------------------------------- ledger


def filled_ledger() -> Ledger:
    led = Ledger(capacity=2)  # forces growth
    led.record(0, SERVER, 0, "down", "weights", 100)
    led.record(0, SERVER, 1, "down", "weights", 100)
    led.record(0, 0, SERVER, "up", "delta", 30, declared=7)
    led.record(0, 1, SERVER, "up", "delta", 40)
    led.record(1, 0, 1, "peer", "weights", 55)
    led.record(1, 1, 0, "peer", "jacobian", 5, declared=1000)
    led.record(2, 0, 1, "peer", "weights", 60)
    return led


def test_totals_and_filters() -> None:
    led = filled_ledger()
    assert len(led) == 7
    assert led.totals() == (390, 1007)
    assert led.totals(round=0) == (270, 7)
    assert led.totals(direction="up") == (70, 7)
    assert led.totals(kind="weights") == (315, 0)
    assert led.totals(kind="never") == (0, 0)
    assert led.totals(src=0) == (145, 7)
    assert led.totals(dst=SERVER) == (70, 7)
    assert led.totals(round=1, src=1, kind="jacobian") == (5, 1000)
    with pytest.raises(ValueError, match="direction must be one of"):
        led.totals(direction="sideways")
    with pytest.raises(ValueError, match="direction must be one of"):
        led.record(0, 0, 1, "sideways", "x", 1)


def test_per_round_cumulative_by_kind() -> None:
    led = filled_ledger()
    r0 = led.per_round(0)
    assert r0["down"] == {"encoded": 200, "declared": 0, "messages": 2}
    assert r0["up"] == {"encoded": 70, "declared": 7, "messages": 2}
    assert r0["peer"]["messages"] == 0 and r0["total"]["encoded"] == 270
    c1 = led.cumulative(1)
    assert c1["total"] == {"encoded": 330, "declared": 1007, "messages": 6}
    assert c1["peer"]["encoded"] == 60
    assert led.cumulative(99)["total"]["encoded"] == 390
    assert led.by_kind() == {
        "weights": {"encoded": 315, "declared": 0, "messages": 4},
        "delta": {"encoded": 70, "declared": 7, "messages": 2},
        "jacobian": {"encoded": 5, "declared": 1000, "messages": 1},
    }
    assert set(led.by_kind(round=2)) == {"weights"}


def test_state_dict_roundtrip_with_weights_only_load() -> None:
    led = filled_ledger()
    buf = io.BytesIO()
    torch.save(led.state_dict(), buf)
    buf.seek(0)
    state = torch.load(buf, weights_only=True)
    new = Ledger()
    new.load_state_dict(state)
    assert len(new) == len(led) and new.kinds == led.kinds
    assert new.by_kind() == led.by_kind() and new.per_round(1) == led.per_round(1)
    new.record(3, 0, 1, "peer", "logits", 9)  # still writable after loading
    assert new.totals(kind="logits") == (9, 0)
    with pytest.raises(ValueError, match="missing keys"):
        Ledger().load_state_dict({"n": 0})


def test_truncate_drops_later_rounds() -> None:
    led = filled_ledger()
    led.truncate(after_round=0)
    assert len(led) == 4 and led.totals() == (270, 7)
    led.record(1, 0, 1, "peer", "weights", 1)
    assert led.totals(round=1) == (1, 0)
    led.truncate(after_round=-1)
    assert len(led) == 0 and led.totals() == (0, 0)


def test_scales_to_a_million_records() -> None:
    led = Ledger()
    t0 = time.process_time()  # CPU time: a busy machine does not slow it
    for r in range(200):  # 200 rounds x 300 nodes x 5 neighbours x 3 kinds
        for kind, nbytes in (("weights", 1000), ("request", 10), ("logits", 50)):
            for src in range(300):
                led.record_many(r, src, range(src + 1, src + 6), "peer", kind, nbytes)
    assert len(led) == 900_000
    assert led.totals(kind="request") == (200 * 300 * 5 * 10, 0)
    assert led.cumulative(99)["peer"]["encoded"] == 100 * 1500 * 1060
    assert time.process_time() - t0 < 10
    t0 = time.process_time()  # CPU time: a busy machine does not slow it
    for i in range(20_000):
        led.record(201, i % 300, SERVER, "up", "delta", 7)
    assert time.process_time() - t0 < 2  # ~ a few microseconds per record
    assert led.totals(round=201) == (140_000, 0)


# ----------------------------------------------------------------------------- network


def test_ledger_counts_exactly_the_encoded_bytes() -> None:
    """The core honesty property: ledger totals == sum of len(bytes) that were encoded."""
    cfg = CodecConfig(default="fp32", by_kind={"jacobian": "fp16"},
                      by_direction={"up": "topk(0.1)+int8"})
    led = Ledger()
    net = Network(cfg, led, seed=7)
    expected = 0
    decl = 0
    for r in range(3):
        for node in range(4):
            for src, dst, direction in ((SERVER, node, "down"), (node, SERVER, "up"),
                                        (node, (node + 1) % 4, "peer")):
                msg = weights(node)
                data = net.encode(msg, src, dst, round=r, direction=direction)
                got = net.send(msg, src, dst, round=r, direction=direction)
                expected += len(data)
                # the receiver gets what the bytes say, nothing else
                assert all(torch.equal(got.tensors[k], v)
                           for k, v in decode_message(data).tensors.items())
        jac = Message("jacobian", {"logits": torch.randn(8, 10)},
                      declared={"J": DeclaredTensor((80, 2080))})
        data = net.encode(jac, 0, 1, round=r, direction="peer")
        net.send(jac, 0, 1, round=r, direction="peer")
        expected += len(data)
        decl += 2 * 80 * 2080
    assert led.totals() == (expected, decl)
    assert led.totals(kind="jacobian")[1] == decl


def test_codec_precedence_kind_over_direction_over_default() -> None:
    cfg = CodecConfig(default="fp32", by_kind={"logits": "bf16"}, by_direction={"up": "int8"})
    net = Network(cfg, Ledger(), seed=0)
    assert net.codec_for("logits", "up").spec == "bf16"
    assert net.codec_for("weights", "up").spec == "int8"
    assert net.codec_for("weights", "down").spec == "fp32"
    m = weights()
    got = net.send(m, 0, SERVER, round=0, direction="up")
    assert not torch.equal(got.tensors["fc1.weight"], m.tensors["fc1.weight"])  # int8 noise
    assert torch.equal(got.tensors["bn.num_batches_tracked"], torch.tensor(3))
    assert got.meta == {"num_examples": 100}
    with pytest.raises(ValueError, match="codecs.by_kind"):
        CodecConfig(by_kind={"x": "zip"})
    with pytest.raises(ValueError, match="unknown direction"):
        CodecConfig(by_direction={"left": "fp16"})


def test_broadcast_encodes_once_and_counts_per_receiver() -> None:
    led = Ledger()
    net = Network(CodecConfig(default="int8"), led, seed=3)
    m = weights()
    out = net.broadcast(m, SERVER, [0, 1, 2, 5], round=4, direction="down")
    data = encode_message(m, parse_codec("int8"), torch_gen(3, "codec", 4, SERVER, "bcast",
                                                            "weights"))
    assert led.totals() == (4 * len(data), 0)
    assert [led.totals(dst=d)[0] for d in (0, 1, 2, 5)] == [len(data)] * 4
    first = out[0].tensors["fc1.weight"]
    assert all(torch.equal(out[d].tensors["fc1.weight"], first) for d in out)
    out[0].tensors["fc1.weight"].add_(1.0)  # each receiver owns its copy
    assert not torch.equal(out[1].tensors["fc1.weight"], out[0].tensors["fc1.weight"])
    assert net.broadcast(m, SERVER, [], round=4, direction="down") == {} and len(led) == 4


def test_send_is_deterministic_and_order_independent() -> None:
    cfg = CodecConfig(default="randmask(0.3)+int8")

    def run(order: list[int]) -> dict[int, torch.Tensor]:
        net = Network(cfg, Ledger(), seed=11)
        return {i: net.send(weights(i), i, (i + 1) % 3, round=2, direction="peer")
                .tensors["fc1.weight"] for i in order}

    a, b = run([0, 1, 2]), run([2, 0, 1])
    assert all(torch.equal(a[i], b[i]) for i in range(3))
    net = Network(cfg, Ledger(), seed=11)
    m = weights()
    assert net.encode(m, 0, 1, round=2) == net.encode(m, 0, 1, round=2)
    assert net.encode(m, 0, 1, round=2) != net.encode(m, 0, 1, round=3)
    assert net.encode(m, 0, 1, round=2) != net.encode(m, 0, 2, round=2)
    assert net.encode(m, 0, 1, round=2) != Network(cfg, Ledger(), seed=12).encode(m, 0, 1, round=2)


def test_encode_deliver_halves_match_send() -> None:
    led_a, led_b = Ledger(), Ledger()
    cfg = CodecConfig(default="topk(0.2)+fp16")
    jac = Message("jacobian", {"w": torch.randn(10)}, declared={"J": DeclaredTensor((5, 7))})
    a = Network(cfg, led_a, seed=1).send(jac, 2, 3, round=1, direction="peer")
    net_b = Network(cfg, led_b, seed=1)
    data = net_b.encode(jac, 2, 3, round=1, direction="peer")
    b = net_b.deliver(data, 2, 3, round=1, direction="peer")
    assert torch.equal(a.tensors["w"], b.tensors["w"]) and b.declared == jac.declared
    assert led_a.totals() == led_b.totals() == (len(data),
                                                declared_bytes(jac, parse_codec(cfg.default)))
    assert led_b.per_round(1)["peer"]["messages"] == 1
