"""Local DP as a sender-side transform before the codec: parsing, joint clipping exact,
noise std exact, addressed randomness, and the Network hook (receiver and ledger see the
noised message after the codec)."""

from __future__ import annotations

import math

import pytest
import torch

from lowband.comm.ledger import Ledger
from lowband.comm.message import SERVER, Message
from lowband.comm.network import CodecConfig, Network
from lowband.privacy.transforms import LocalDPTrack, parse_transform, releases_from_ledger


def test_parse_and_refuse() -> None:
    t = parse_transform("clip(1.5)+gauss(0.8)")
    assert t.spec == "clip(1.5)+gauss(0.8)" and t.clip == 1.5 and t.noise_multiplier == pytest.approx(0.8)
    assert parse_transform("clip(2)").noise_multiplier == math.inf
    for bad, words in [("gauss(1)", "needs a clip"), ("clip(-1)", "positive"), ("clip(x)", "write a number"),
                       ("laplace(1)", "known transforms"), ("clip(1)+clip(2)", "one clip"), ("", "empty")]:
        with pytest.raises(ValueError, match=words) as e:
            parse_transform(bad)
        assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="codecs.*|needs a clip"):
        CodecConfig(transform="gauss(1)")


def test_joint_clip_is_exact_and_leaves_integers() -> None:
    g = torch.Generator().manual_seed(0)
    msg = {"a": torch.randn(30, 10, generator=g), "b": torch.randn(50, generator=g), "n": torch.arange(4)}
    out = parse_transform("clip(2.0)").apply(msg, torch.Generator().manual_seed(1))
    norm = math.sqrt(out["a"].pow(2).sum() + out["b"].pow(2).sum())
    assert norm == pytest.approx(2.0, rel=1e-6)
    before = math.sqrt(msg["a"].pow(2).sum() + msg["b"].pow(2).sum())
    torch.testing.assert_close(out["a"], msg["a"] * (2.0 / before))
    assert torch.equal(out["n"], msg["n"])
    small = {"a": torch.full((4,), 0.1)}
    assert torch.equal(parse_transform("clip(2.0)").apply(small, torch.Generator())["a"], small["a"])


def test_noise_std_is_z_times_clip() -> None:
    t = parse_transform("clip(0.5)+gauss(1.2)")
    x = {"w": torch.zeros(400_000)}
    noise = t.apply(x, torch.Generator().manual_seed(3))["w"]
    assert noise.std().item() == pytest.approx(0.6, rel=0.01)
    assert abs(noise.mean().item()) < 4 * 0.6 / math.sqrt(400_000)


def _net(transform: str, codec: str = "fp32") -> Network:
    return Network(CodecConfig(default=codec, transform=transform), Ledger(), seed=11)


def test_network_noises_what_clients_send_before_the_codec() -> None:
    w = {"w": torch.zeros(100_000)}
    net = _net("clip(1.0)+gauss(0.5)")
    got = net.send(Message("delta", dict(w)), 3, SERVER, round=1, direction="up")
    assert got is not None and got.tensors["w"].std().item() == pytest.approx(0.5, rel=0.02)
    # same address -> same noise (order-free); another round, sender or link -> other noise
    again = _net("clip(1.0)+gauss(0.5)").send(Message("delta", dict(w)), 3, SERVER, round=1, direction="up")
    other = _net("clip(1.0)+gauss(0.5)").send(Message("delta", dict(w)), 4, SERVER, round=1, direction="up")
    assert torch.equal(got.tensors["w"], again.tensors["w"]) and not torch.equal(got.tensors["w"], other.tensors["w"])
    # the codec encodes the noised values: fp16 of noise, not zeros
    half = _net("clip(1.0)+gauss(0.5)", "fp16").send(Message("delta", dict(w)), 3, SERVER, round=1, direction="up")
    torch.testing.assert_close(half.tensors["w"], got.tensors["w"].half().float())
    # the server's messages are not transformed
    down = net.broadcast(Message("weights", dict(w)), SERVER, [0, 1], round=1, direction="down")
    assert all(torch.equal(m.tensors["w"], w["w"]) for m in down.values())
    # a peer broadcast is one release: both receivers get the same noised vector
    peer = net.broadcast(Message("weights", dict(w)), 2, [0, 1], round=1, direction="peer")
    assert torch.equal(peer[0].tensors["w"], peer[1].tensors["w"]) and peer[0].tensors["w"].abs().sum() > 0
    # without a transform nothing changes
    plain = _net("").send(Message("delta", dict(w)), 3, SERVER, round=1, direction="up")
    assert torch.equal(plain.tensors["w"], w["w"])


def test_local_epsilon_counts_each_message_as_a_release_of_z_over_2() -> None:
    pytest.importorskip("dp_accounting")
    from tests.test_privacy_accountant import analytic_gaussian_epsilon

    net = _net("clip(1.0)+gauss(4.0)")
    for r in (1, 2):
        net.send(Message("delta", {"w": torch.ones(10)}), 0, SERVER, round=r, direction="up")
        net.send(Message("delta", {"w": torch.ones(10)}), 1, SERVER, round=r, direction="up")
        net.send(Message("control_delta", {"w": torch.ones(10)}), 1, SERVER, round=r, direction="up")
    net.broadcast(Message("weights", {"w": torch.ones(10)}), SERVER, [0, 1], round=2, direction="down")
    assert releases_from_ledger(net.ledger, 2) == {0: 1, 1: 2}
    track = LocalDPTrack(4.0, 1e-5, "pld")
    for r in (1, 2):
        track.observe(r, releases_from_ledger(net.ledger, r))
    # node 1: 4 releases of multiplier 2 = one of multiplier 1 (Gaussian composition)
    m = track.metrics(2)
    assert m["dp/local_releases"] == 4
    assert m["dp/local_epsilon"] == pytest.approx(analytic_gaussian_epsilon(1.0, 1e-5), rel=0.01)
