"""The summable sparsifier ``sharedmask(frac)``: one coordinate set per round for every
sender, so SecAgg's masked sum of sparse updates is the sparse sum; counted at its true bytes;
per-client patterns (top-k, randmask) still refused under SecAgg in one line."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from conftest import digits_config
from lowband.comm.codecs import parse_codec
from lowband.comm.ledger import Ledger
from lowband.comm.message import SERVER, Message
from lowband.comm.network import CodecConfig, Network
from lowband.comm.wire import decode_message
from lowband.config import ConfigError, validate
from lowband.engine.simulator import Simulation
from lowband.privacy import secagg as sa
from lowband.privacy.sparsify import message_support, support_size

SHAPES = {"w": (30, 20), "b": (20,)}


def _msg(node: int) -> Message:
    g = torch.Generator().manual_seed(100 + node)
    return Message("delta", {k: torch.randn(s, generator=g) for k, s in SHAPES.items()})


def _decoded(net: Network, node: int, round: int) -> dict[str, torch.Tensor]:
    return decode_message(net.encode(_msg(node), node, SERVER, round=round, direction="up")).tensors


def test_one_support_per_round_for_every_sender_and_the_sum_is_the_sparse_sum() -> None:
    net = Network(CodecConfig(by_direction={"up": "sharedmask(0.1)"}), Ledger(), seed=3)
    got = {u: _decoded(net, u, 5) for u in range(4)}
    sup = {k: got[0][k] != 0 for k in SHAPES}
    for u in range(4):
        for k, s in SHAPES.items():
            assert torch.equal(got[u][k] != 0, sup[k])  # the same coordinates for every client
            assert int(sup[k].sum()) == math.ceil(0.1 * math.prod(s))
    # the sum of the sparse vectors is the sparse vector of the sum
    for k in SHAPES:
        dense_sum = sum(_msg(u).tensors[k] for u in range(4))
        assert torch.allclose(sum(got[u][k] for u in range(4)), dense_sum * sup[k], atol=1e-5)
    # the support is public: derived from (seed, round, kind) alone, as the server recomputes it
    flat = torch.cat([sup[k].reshape(-1) for k in sorted(SHAPES)])
    assert torch.equal(message_support(0.1, 3, 5, "delta", [(k, SHAPES[k]) for k in sorted(SHAPES)]), flat)
    # another round draws other coordinates; a per-client randmask draws one set per client
    assert not torch.equal(_decoded(net, 0, 6)["w"] != 0, sup["w"])
    per = Network(CodecConfig(by_direction={"up": "randmask(0.1)"}), Ledger(), seed=3)
    assert not torch.equal(_decoded(per, 0, 5)["w"] != 0, _decoded(per, 1, 5)["w"] != 0)


def test_sharedmask_bytes_are_the_formula() -> None:
    codec = parse_codec("sharedmask(0.1)")
    for shape in SHAPES.values():  # k float32 values, the 8-byte seed, the int64 shape
        assert codec.size_of(shape) == 4 * math.ceil(0.1 * math.prod(shape)) + 8 + 8 * len(shape)
    fp32 = Network(CodecConfig(), Ledger(), seed=3).encode(_msg(0), 0, SERVER, round=1, direction="up")
    sm = Network(CodecConfig(by_direction={"up": "sharedmask(0.1)"}), Ledger(), seed=3).encode(
        _msg(0), 0, SERVER, round=1, direction="up")
    buf = sum(codec.size_of(s) for s in SHAPES.values())
    fbuf = sum(parse_codec("fp32").size_of(s) for s in SHAPES.values())
    assert fbuf - buf == 4 * sum(math.prod(s) - math.ceil(0.1 * math.prod(s)) for s in SHAPES.values()) - 2 * 8 - 8 * 3
    assert 0 < len(sm) - buf < 400 and 0 < len(fp32) - fbuf < 400  # the rest is the wire header
    assert len(sm) < len(fp32) * 0.2


def _cfg(tmp: Path, codec: str, rounds: int = 2, **sections) -> dict:
    cfg = digits_config(tmp, "fedavg", rounds=rounds, upload="delta")
    cfg["comm"] = {"by_direction": {"up": codec}}
    cfg.update(sections)
    return cfg


def test_secagg_sum_of_sparsified_updates_is_the_plain_sparse_sum(tmp_path: Path, monkeypatch) -> None:
    """One round of FedAvg over sharedmask(0.1): the server's update under SecAgg is the plain
    (uniform) mean of the clients' decoded sparse updates, up to one level of the field, and
    moves exactly the round's shared coordinates."""
    from lowband.algorithms import ALGORITHMS

    seen: list = []

    class Recording(ALGORITHMS["fedavg"]):  # type: ignore[misc, valid-type]
        def server_aggregate(self, ctx, state, inbox):
            seen.extend(inbox)
            return super().server_aggregate(ctx, state, inbox)

    monkeypatch.setitem(ALGORITHMS, "fedavg", Recording)
    plain = Simulation(validate(_cfg(tmp_path / "p", "sharedmask(0.1)", rounds=1)))
    plain.run()
    monkeypatch.undo()
    secure = Simulation(validate(_cfg(tmp_path / "s", "sharedmask(0.1)", rounds=1, secagg={"enabled": True})))
    secure.run()
    shapes = _shapes(secure)
    names = [n for n, _ in shapes]
    assert len(seen) == 4
    rows = torch.stack([torch.cat([e.msg.tensors[n].reshape(-1).double() for n in names]) for e in seen])
    sup = message_support(0.1, secure.exp.seed, 1, "delta", shapes)
    assert bool((rows[:, ~sup] == 0).all())  # every client's decoded update lives on the shared support
    moved = secure_delta(secure, tmp_path)
    levels = 32 - math.ceil(math.log2(4 + 1))  # 4 clients a round, 32-bit ring
    step = 2 * 8.0 / (2**levels - 1)  # clip_range 8: one quantisation level
    assert float((moved - rows.mean(0)).abs().max()) <= step  # the masked sum is the plain sum
    assert bool((moved[~sup] == 0).all()) and int((moved[sup] != 0).sum()) > 0.9 * int(sup.sum())


def _flat(sim: Simulation) -> torch.Tensor:
    params = sim.executor.states[SERVER]["params"]
    return torch.cat([params[n].reshape(-1).double() for n in sorted(params) if params[n].is_floating_point()])


def secure_delta(sim: Simulation, tmp: Path) -> torch.Tensor:
    return _flat(sim) - _initial(sim)


def _initial(sim: Simulation) -> torch.Tensor:
    """The server's model before round 1 (the run's seed-addressed init)."""
    init = sim.builder.init_params(0)
    return torch.cat([init[n].reshape(-1).double() for n in sorted(init) if init[n].is_floating_point()])


def _masked_bytes(codec: str, length: int) -> int:
    """A secagg_masked message of ``length`` coordinates at 32 bits, encoded on a ``codec`` uplink."""
    net = Network(CodecConfig(by_direction={"up": codec}), Ledger(), seed=0)
    y = torch.zeros(sa.payload_bytes("secagg_masked", length=length), dtype=torch.uint8)
    return len(net.encode(Message("secagg_masked", {"y": y}), 1, SERVER, round=1, direction="up"))


def _masked_counts(sim: Simulation) -> list[int]:
    cols = sim.ledger.columns()
    return cols["encoded"][cols["kind"] == list(sim.ledger.kinds).index("secagg_masked")].tolist()


def test_secagg_masked_input_carries_k_coordinates_at_the_formula(tmp_path: Path) -> None:
    sim = Simulation(validate(_cfg(tmp_path, "sharedmask(0.1)", secagg={"enabled": True})))
    sim.run()
    k = support_size(0.1, [s for _, s in _shapes(sim)])
    assert 0 < k < 0.2 * sim.model_size
    got = _masked_counts(sim)
    assert len(got) == 8 and set(got) == {_masked_bytes("sharedmask(0.1)", k)}  # ceil(k * 32 / 8) + header
    full = Simulation(validate(_cfg(tmp_path / "f", "fp32", secagg={"enabled": True})))
    full.run()
    assert set(_masked_counts(full)) == {_masked_bytes("fp32", sim.model_size)}


@pytest.mark.parametrize("codec,words", [("topk(0.01)", "top-k"), ("ef(topk(0.01))", "top-k"),
                                         ("randmask(0.1)", "random masks"), ("ef(sharedmask(0.1))", "error feedback")])
def test_secagg_refuses_per_client_patterns_in_one_line(tmp_path: Path, codec: str, words: str) -> None:
    with pytest.raises(ConfigError, match=re_escape(words)) as e:
        validate(_cfg(tmp_path, codec, secagg={"enabled": True}))
    assert "\n" not in str(e.value) and "sharedmask" in str(e.value)


def re_escape(s: str) -> str:
    import re

    return re.escape(s)


def test_distributed_dp_over_sharedmask_runs_skellam_in_k_dimensions(tmp_path: Path) -> None:
    sim = Simulation(validate(_cfg(tmp_path, "sharedmask(0.1)", secagg={"enabled": True},
                                  dp={"mechanism": "distributed", "clip": 1.0, "noise_multiplier": 1.0, "bits": 20})))
    res = sim.run()
    sk = sim.privacy.algorithm.secagg.skellam
    assert sk.d == support_size(0.1, [s for _, s in _shapes(sim)]) < 0.2 * sim.model_size and math.isfinite(res.summary["dp/epsilon"])


def test_central_dp_over_sharedmask_noises_only_the_public_support(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, "sharedmask(0.1)", rounds=1, dp={"mechanism": "central", "clip": 0.5, "noise_multiplier": 1.0})
    sim = Simulation(validate(cfg))
    sim.run()
    moved = secure_delta(sim, tmp_path)
    d = moved.numel()
    sup = message_support(0.1, sim.exp.seed, 1, "delta", [(n, tuple(s)) for n, s in _shapes(sim)])
    assert bool((moved[~sup] == 0).all()) and int((moved[sup] != 0).sum()) == int(sup.sum())
    assert int(sup.sum()) < 0.2 * d


def _shapes(sim: Simulation) -> list[tuple[str, tuple[int, ...]]]:
    st = sim.executor.states[SERVER]["params"]
    return [(n, tuple(st[n].shape)) for n in sorted(st) if st[n].is_floating_point()]
