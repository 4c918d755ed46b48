"""Message.stand_in: the uncounted equivalent inputs of a declared payload.

The ledger counts the declared bytes (after the link codec), the encoded bytes do not
change when a stand-in is attached, the receiver gets a clone of it, and a stand-in with
no declared entry is refused.
"""

from __future__ import annotations

import pytest
import torch

from lowband.comm import CodecConfig, DeclaredTensor, Ledger, Message, Network, encode_message, parse_codec
from lowband.seeding import torch_gen


def _reply(with_stand_in: bool = True) -> Message:
    g = torch_gen(0, "standin")
    x = torch.randn(20, 12, generator=g)
    return Message("jacobian", {"logits": torch.randn(20, 3, generator=g)},
                   declared={"J": DeclaredTensor((20, 3, 500))},
                   stand_in={"x": x} if with_stand_in else {})


@pytest.mark.parametrize("codec,per", [("fp32", 4), ("fp16", 2)])
def test_send_counts_declared_and_excludes_stand_in(codec: str, per: int) -> None:
    led = Ledger()
    net = Network(CodecConfig(default="fp32", by_kind={"jacobian": codec}), led, seed=0)
    msg = _reply()
    got = net.send(msg, 1, 2, round=3, direction="peer")
    enc, dec = led.totals(round=3)
    plain = encode_message(_reply(with_stand_in=False), parse_codec(codec), torch_gen(0))
    assert enc == len(plain)  # the stand-in adds nothing to the wire bytes
    assert dec == 20 * 3 * 500 * per  # the declared Jacobian, under the link codec
    assert torch.equal(got.stand_in["x"], msg.stand_in["x"])
    assert got.stand_in["x"].data_ptr() != msg.stand_in["x"].data_ptr()  # a clone
    assert got.declared == msg.declared


def test_broadcast_gives_each_receiver_its_own_clone() -> None:
    led = Ledger()
    net = Network(CodecConfig(), led, seed=0)
    msg = _reply()
    out = net.broadcast(msg, 0, [1, 2, 3], round=0, direction="peer")
    ptrs = {m.stand_in["x"].data_ptr() for m in out.values()}
    assert len(ptrs) == 3 and msg.stand_in["x"].data_ptr() not in ptrs
    for m in out.values():
        assert torch.equal(m.stand_in["x"], msg.stand_in["x"])
    enc, dec = led.totals()
    assert dec == 3 * 20 * 3 * 500 * 4
    assert enc == 3 * len(encode_message(_reply(False), parse_codec("fp32"), torch_gen(0)))


def test_encode_deliver_halves_carry_the_stand_in() -> None:
    led = Ledger()
    net = Network(CodecConfig(), led, seed=0)
    msg = _reply()
    data = net.encode(msg, 4, 5, round=1)
    got = net.deliver(data, 4, 5, round=1, stand_in=msg.stand_in)
    assert torch.equal(got.stand_in["x"], msg.stand_in["x"])
    assert net.deliver(net.encode(msg, 4, 5, round=1), 4, 5, round=1).stand_in == {}


def test_stand_in_without_declared_is_refused() -> None:
    led = Ledger()
    net = Network(CodecConfig(), led, seed=0)
    bad = Message("jacobian", {"logits": torch.zeros(2, 2)}, stand_in={"x": torch.zeros(2, 3)})
    with pytest.raises(ValueError, match="no declared"):
        net.send(bad, 0, 1, round=0, direction="peer")
    with pytest.raises(ValueError, match="no declared"):
        net.broadcast(bad, 0, [1, 2], round=0, direction="peer")
    with pytest.raises(ValueError, match="declares no tensor"):
        plain = net.encode(Message("x", {"a": torch.zeros(1)}), 0, 1, round=0)
        net.deliver(plain, 0, 1, round=0, stand_in={"x": torch.zeros(1)})
    assert len(led) == 0


def test_clone_copies_stand_in() -> None:
    msg = _reply()
    c = msg.clone()
    assert torch.equal(c.stand_in["x"], msg.stand_in["x"])
    assert c.stand_in["x"].data_ptr() != msg.stand_in["x"].data_ptr()
