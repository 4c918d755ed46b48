"""Every receiver distrusts its inbox (design rule 8): one validation mechanism at delivery.

Unit tests of lowband.comm.validate and Network.receive, then whole runs: a client whose
uploads are NaN (FedAvg, DFedAvg), a client training with lr=1e6 (caught by the norm
screen), a diverging client, a wrong-shaped upload, the abort policy, and algorithms
left with empty inboxes. A poisoned run with validation must equal the clean run
without that client, which is what "the round continues with the remaining inputs" means.
"""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import lowband.algorithms.decentralised.gossip as decentralized
import lowband.algorithms.server.fedavg as fedavg
from conftest import digits_config, event_clock
from lowband.algorithms.decentralised.gossip import GossipAlgorithm
from lowband.algorithms.server.fedavg import FedAvg
from lowband.comm.ledger import Ledger
from lowband.algorithms.base import Outbox
from lowband.comm.message import SERVER, Message
from lowband.comm.network import CodecConfig, Network
from lowband.comm.validate import (InvalidMessageError, Rejection, ValidationPolicy, Validator, content_problem,
                                   message_norm, norm_outliers, shape_problem)
from lowband.config import ConfigError, validate
from lowband.engine.runlog import RunLog
from lowband.engine.simulator import Simulation


def _run(cfg: dict, **kw) -> Simulation:
    sim = Simulation(validate(cfg), **kw)
    sim.result = sim.run()
    return sim


def _metrics(sim: Simulation) -> list[dict]:
    text = (Path(sim.result.run_dir) / "metrics.jsonl").read_text()
    return [json.loads(line, parse_constant=_no_constant) for line in text.splitlines()]


def _no_constant(name: str) -> None:
    raise AssertionError(f"invalid JSON constant {name} in metrics.jsonl")


def _total(sim: Simulation, key: str) -> int:
    return sum(int(rec.get(key, 0)) for rec in _metrics(sim))


def _nan_like(tensors: dict) -> dict:
    return {k: torch.full_like(v, float("nan")) if v.is_floating_point() else v for k, v in tensors.items()}


def _finite(params: dict) -> bool:
    return all(bool(torch.isfinite(v).all()) for v in params.values() if v.is_floating_point())


# --------------------------------------------------------------------------- units


def test_content_problem_finds_nan_inf_and_bad_float_metadata() -> None:
    ok = Message("w", {"a": torch.ones(3), "i": torch.arange(3)}, meta={"num_examples": 5, "x": 0.5})
    assert content_problem(ok) is None
    assert content_problem(Message("w", {"a": torch.tensor([1.0, float("nan")])}))[0] == "nonfinite"
    assert content_problem(Message("w", {"a": torch.tensor([float("-inf")], dtype=torch.float16)}))[0] == "nonfinite"
    reason, detail = content_problem(Message("w", {"a": torch.ones(2)}, meta={"num_examples": float("inf")}))
    assert reason == "nonfinite" and "num_examples" in detail


def test_all_finite_finds_a_nonfinite_entry_anywhere() -> None:
    """The one-pass check (``aminmax``) sees a NaN or an Inf at any position, in every float
    dtype, large and non-contiguous tensors included; empty and complex tensors work."""
    from lowband.comm.validate import all_finite

    for dt in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
        for n in (1, 17, 4097, 1_000_003):
            assert all_finite(torch.randn(n).to(dt))
            for bad in (float("nan"), float("inf"), float("-inf")):
                for pos in (0, n // 2, n - 1):
                    t = torch.randn(n).to(dt)
                    t[pos] = bad
                    assert not all_finite(t), (dt, n, bad, pos)
                    assert not all_finite(t.view(1, -1).expand(3, -1).t())  # non-contiguous
    assert all_finite(torch.empty(0))
    assert not all_finite(torch.tensor([1 + 1j, complex(float("nan"), 0)]))
    assert all_finite(torch.tensor([1 + 1j, 2 - 1j]))


def test_message_norm_is_the_float64_norm_and_survives_float32_overflow() -> None:
    g = torch.Generator().manual_seed(0)
    t = torch.randn(2_000_000, generator=g)
    ref = float(t.double().norm())
    # squares summed in float32 (message_norm's docstring): 2M terms, a relative error of about 1e-5
    # whose size depends on the CPU's summation order (1.0004e-5 on an AMD EPYC); the screen compares
    # norms by a factor of 100, so 1e-4 is ample
    assert abs(message_norm(Message("jacobian", {"jac": t})) - ref) <= 1e-4 * ref
    big = torch.full((1000,), 1e30)  # squares overflow float32: redone in float64
    assert message_norm(Message("w", {"a": big})) == pytest.approx(float(big[0]) * math.sqrt(1000), rel=1e-12)
    half = torch.randn(100, generator=g).half()
    assert message_norm(Message("w", {"a": half, "i": torch.arange(3)})) == pytest.approx(float(half.double().norm()))


def test_shape_problem_checks_only_names_of_the_receivers_model() -> None:
    expected = {"fc.weight": ((4, 3), torch.float32), "bn.num_batches_tracked": ((), torch.int64)}
    assert shape_problem(Message("w", {"fc.weight": torch.zeros(4, 3), "logits": torch.zeros(9)}), expected) is None
    reason, detail = shape_problem(Message("w", {"fc.weight": torch.zeros(3, 4)}), expected)
    assert reason == "shape" and "[3, 4]" in detail and "[4, 3]" in detail
    assert shape_problem(Message("w", {"bn.num_batches_tracked": torch.zeros(())}), expected)[0] == "dtype"
    reason, detail = shape_problem(Message("w", {"fc.weight": torch.zeros(4, 3, dtype=torch.float16)}), expected)
    assert reason == "dtype" and "torch.float16" in detail
    # a declared sub-model: same rank and no larger dimension passes, anything else does not
    assert shape_problem(Message("w", {"fc.weight": torch.zeros(2, 3)}), expected, partial=True) is None
    assert shape_problem(Message("w", {"fc.weight": torch.zeros(5, 3)}), expected, partial=True)[0] == "shape"
    assert shape_problem(Message("w", {"fc.weight": torch.zeros(12)}), expected, partial=True)[0] == "shape"


def test_norm_outliers_rule() -> None:
    def m(scale: float, kind: str = "w") -> Message:
        return Message(kind, {"a": torch.full((4,), float(scale))})  # norm = 2 * scale

    # norms [2, 2, 2, 60]: 60 > 10 x median 2 is out; exactly factor x median stays
    assert list(norm_outliers([m(1), m(1), m(1), m(30)], 10.0)) == [3]
    assert norm_outliers([m(1), m(1), m(10)], 10.0) == {}
    # fewer than three of a kind are never screened; kinds are screened apart
    assert norm_outliers([m(1), m(1000)], 10.0) == {}
    assert norm_outliers([m(1, "a"), m(1, "a"), m(1000, "b"), m(1, "b")], 10.0) == {}
    # a zero median cannot scale a threshold: not screened
    assert norm_outliers([m(0), m(0), m(5)], 10.0) == {}
    with pytest.raises(ValueError, match="norm_factor"):
        ValidationPolicy(norm_factor=1.0)
    for bad in (0.5, 1.0, -3.0):
        with pytest.raises(ConfigError, match="norm_factor"):
            validate({"comm": {"norm_factor": bad}})
    assert validate({}).comm.norm_factor == 100.0 and validate({"comm": {"norm_factor": 0}}).comm.norm_factor == 0


def _net(policy: ValidationPolicy = ValidationPolicy(), codec: str = "fp32", expected=None) -> Network:
    return Network(CodecConfig(default=codec), Ledger(), 0, validator=Validator(policy, expected))


def test_network_refuses_but_counts_and_hands_out_the_rest() -> None:
    net = _net(expected=lambda node: {"w": ((3,), torch.float32)} if node != 2 else {"w": ((4,), torch.float32)})
    good = Message("weights", {"w": torch.ones(3)})
    got = net.broadcast(good, SERVER, [0, 1, 2], round=1, direction="down")
    assert sorted(got) == [0, 1]  # node 2's model has a (4,) entry "w": a shape refusal for it only
    assert [(r.dst, r.reason) for r in net.rejections] == [(2, "shape")]
    assert len(net.ledger) == 3  # the bytes crossed all three links
    bad = Message("weights", {"w": torch.tensor([1.0, float("nan"), 0.0])})
    assert net.send(bad, 0, SERVER, round=1, direction="up") is None
    assert net.rejections[-1] == Rejection(1, 0, SERVER, "weights", "nonfinite", net.rejections[-1].detail)
    assert len(net.ledger) == 4 and net.ledger.totals(direction="up")[0] > 0
    # bytes that do not decode: a "malformed" refusal, still counted
    assert net.deliver(b"\x00garbage", 3, SERVER, round=1) is None
    assert net.rejections[-1].reason == "malformed" and len(net.ledger) == 5


def test_without_a_validator_everything_is_delivered_as_before() -> None:
    net = Network(CodecConfig(), Ledger(), 0)
    bad = Message("weights", {"w": torch.tensor([float("nan")])})
    got = net.send(bad, 0, SERVER, round=1, direction="up")
    assert got is not None and torch.isnan(got.tensors["w"]).all() and net.rejections == []


def test_abort_policy_raises_a_clear_non_config_error() -> None:
    net = _net(ValidationPolicy(on_invalid="abort"))
    with pytest.raises(InvalidMessageError) as info:
        net.send(Message("delta", {"w": torch.tensor([float("inf")])}), 4, SERVER, round=7, direction="up")
    text = str(info.value)
    assert not isinstance(info.value, ValueError)  # never reported as a config/usage error
    for part in ("round 7", "node 4", "node -1", "'delta'", "nonfinite"):
        assert part in text


def test_int8_cannot_encode_nan_so_nothing_is_sent_and_it_is_a_refusal() -> None:
    net = _net(codec="int8")
    assert net.send(Message("weights", {"w": torch.tensor([1.0, float("nan")])}), 0, SERVER, round=2,
                    direction="up") is None
    assert len(net.ledger) == 0 and net.rejections[0].reason == "nonfinite"
    with pytest.raises(Exception, match="non-finite"):  # without a validator: the codec's error, as before
        Network(CodecConfig(default="int8"), Ledger(), 0).send(
            Message("weights", {"w": torch.tensor([float("nan")])}), 0, SERVER, round=2, direction="up")


def test_nested_nan_is_written_as_null_in_summary(tmp_path: Path) -> None:
    log = RunLog(tmp_path)
    log.write_summary({"final": {"loss": float("nan"), "acc": [0.5, float("inf")]}, "x": float("nan")})
    assert json.loads(log.summary_path.read_text(), parse_constant=_no_constant) == {
        "final": {"loss": None, "acc": [0.5, None]}, "x": None}


# --------------------------------------------------------------------------- whole runs


def _fedavg_cfg(tmp_path: Path, name: str, rounds: int = 3, **over) -> dict:
    cfg = digits_config(tmp_path / name, "fedavg", rounds=rounds)
    cfg["topology"] = {"kind": "star", "sampling": "all"}
    for k, v in over.items():
        cfg[k] = v
    return cfg


def _without(node: int, rounds: int) -> dict:
    """[faults] removing ``node`` from every round: the clean run minus that client."""
    return {"dropout_schedule": [[r, node] for r in range(1, rounds + 1)]}


def _nan_uploads_from(monkeypatch, cls, method: str, node: int) -> None:
    orig = getattr(cls, method)

    def poisoned(self, ctx, state, inbox, *trained):  # a step, or the reply half of a local-SGD step
        new, out = orig(self, ctx, state, inbox, *trained)
        if ctx.node == node:
            for _, msg in out.items:
                msg.tensors = _nan_like(msg.tensors)
        return new, out

    monkeypatch.setattr(cls, method, poisoned)


def test_fedavg_nan_client_is_rejected_and_equals_the_run_without_it(tmp_path: Path, monkeypatch) -> None:
    minus = _run(_fedavg_cfg(tmp_path, "minus", faults=_without(0, 3)))
    _nan_uploads_from(monkeypatch, FedAvg, "client_reply", 0)  # the reply: local SGD as in `minus` (cohorts)
    poisoned = _run(_fedavg_cfg(tmp_path, "nan"))
    mp, mm = _metrics(poisoned), _metrics(minus)
    assert [r.get("rejected/nonfinite", 0) for r in mp] == [0, 1, 1, 1]  # one refused upload per round
    assert _finite(poisoned.executor.states[SERVER]["params"])
    for a, b in zip(mp, mm):  # the server averaged exactly the other clients
        assert a["global/acc"] == b["global/acc"] and a["personal/acc_weighted"] == b["personal/acc_weighted"]
    assert mp[-1]["global/acc"] > 0.3


def test_dfedavg_nan_node_is_rejected_by_its_neighbours(tmp_path: Path, monkeypatch) -> None:
    minus_cfg = digits_config(tmp_path / "minus", "dfedavg", rounds=3)
    minus_cfg["faults"] = _without(0, 3)
    minus = _run(minus_cfg)
    _nan_uploads_from(monkeypatch, GossipAlgorithm, "send_trained", 0)  # the send: SGD as in `minus` (cohorts)
    poisoned = _run(digits_config(tmp_path / "nan", "dfedavg", rounds=3))
    # every neighbour of node 0 (k = 3) refuses its weights every round
    assert [r.get("rejected/nonfinite", 0) for r in _metrics(poisoned)] == [0, 3, 3, 3]
    for n in range(1, 8):  # the other nodes end exactly as in the run without node 0
        a, b = poisoned.executor.states[n]["params"], minus.executor.states[n]["params"]
        assert _finite(a) and all(torch.equal(a[k], b[k]) for k in a), n


def _huge_lr_for(monkeypatch, module, node: int) -> None:
    orig = module.local_job

    def local_job(ctx, params, *args, **kw):
        if ctx.node == node:
            kw["hp"] = ctx.hp.model_copy(update={"lr": 1e6})
        return orig(ctx, params, *args, **kw)

    monkeypatch.setattr(module, "local_job", local_job)


@pytest.mark.parametrize("algorithm", ["fedavg", "dfedavg"])
def test_lr_1e6_client_is_a_norm_outlier(tmp_path: Path, monkeypatch, algorithm: str) -> None:
    """lr=1e6 gives huge but finite weights (norm ~1e23 on digits): only the norm screen
    (comm.norm_factor) catches them, by default (100) as at 10; then the run equals the
    one without. With the screen off (0) the poisoned run differs (it is what's caught)."""
    def cfg(name: str, **over) -> dict:
        c = _fedavg_cfg(tmp_path, name) if algorithm == "fedavg" else digits_config(tmp_path / name, algorithm, rounds=3)
        c.update(over)
        return c

    minus = _run(cfg("minus", faults=_without(0, 3)))
    _huge_lr_for(monkeypatch, fedavg if algorithm == "fedavg" else decentralized, 0)
    nodes = [SERVER] if algorithm == "fedavg" else list(range(1, 8))
    for name, comm in (("default", {}), ("f10", {"norm_factor": 10.0})):
        guarded = _run(cfg(name, comm=comm))
        assert _total(guarded, "rejected/norm") == (3 if algorithm == "fedavg" else 9)
        assert _total(guarded, "rejected/nonfinite") == 0
        for n in nodes:
            a, b = guarded.executor.states[n]["params"], minus.executor.states[n]["params"]
            assert all(torch.equal(a[k], b[k]) for k in a), n
    with warnings.catch_warnings(record=True) as caught:  # the screen off: the warning names no factor
        warnings.simplefilter("always")
        off = _run(cfg("off", comm={"norm_factor": 0}))
    said = [str(w.message) for w in caught if "consensus leaves out" in str(w.message)]
    assert not any("None" in m or "norm over" in m for m in said), said
    if algorithm != "fedavg":  # node 0's weights overflow by round 2: left out for being non-finite
        assert said and "(non-finite weights)" in said[0]
    assert _total(off, "rejected/norm") == 0
    a, b = off.executor.states[nodes[0]]["params"], minus.executor.states[nodes[0]]["params"]
    assert not all(torch.equal(a[k], b[k]) for k in a)


def test_diverging_client_is_reported_and_its_update_rejected(tmp_path: Path, monkeypatch) -> None:
    orig = fedavg.local_job

    def local_job(ctx, params, *args, **kw):
        if ctx.node == 2:  # a loss that turns non-finite: NaN gradients, NaN weights
            return orig(ctx, params, lambda m, x, y: F.cross_entropy(m(x), y) * float("nan"))
        return orig(ctx, params, *args, **kw)

    monkeypatch.setattr(fedavg, "local_job", local_job)
    sim = _run(_fedavg_cfg(tmp_path, "div"))
    recs = _metrics(sim)  # parses strictly: no NaN/Infinity constants
    assert [r.get("faults/diverged", 0) for r in recs] == [0, 1, 1, 1]
    assert [r.get("rejected/nonfinite", 0) for r in recs] == [0, 1, 1, 1]
    assert _finite(sim.executor.states[SERVER]["params"])
    assert math.isnan(sim.executor.states[2]["loss"])
    json.loads((Path(sim.result.run_dir) / "summary.json").read_text(), parse_constant=_no_constant)


def test_wrong_shape_upload_is_rejected(tmp_path: Path, monkeypatch) -> None:
    orig = FedAvg.client_update

    def client_update(self, ctx, state, inbox):
        new, out = orig(self, ctx, state, inbox)
        if ctx.node == 1:
            for _, msg in out.items:
                msg.tensors = dict(msg.tensors)
                msg.tensors["fc1.weight"] = msg.tensors["fc1.weight"].t().contiguous()
        return new, out

    monkeypatch.setattr(FedAvg, "client_update", client_update)
    sim = _run(_fedavg_cfg(tmp_path, "shape"))
    assert _total(sim, "rejected/shape") == 3 and _total(sim, "rejected/nonfinite") == 0
    assert _finite(sim.executor.states[SERVER]["params"])


def test_abort_policy_stops_the_run_naming_the_message(tmp_path: Path, monkeypatch) -> None:
    _nan_uploads_from(monkeypatch, FedAvg, "client_update", 3)
    sim = Simulation(validate(_fedavg_cfg(tmp_path, "abort", comm={"on_invalid": "abort"})))
    with pytest.raises(InvalidMessageError, match=r"round 1: rejected a 'weights' message from node 3 to node -1: nonfinite"):
        sim.run()
    with pytest.raises(ConfigError, match="on_invalid"):
        validate(_fedavg_cfg(tmp_path, "bad", comm={"on_invalid": "ignore"}))


def test_all_uploads_rejected_keeps_the_previous_global_model(tmp_path: Path, monkeypatch) -> None:
    orig = FedAvg.client_update

    def client_update(self, ctx, state, inbox):
        new, out = orig(self, ctx, state, inbox)
        for _, msg in out.items:
            msg.tensors = _nan_like(msg.tensors)
        return new, out

    monkeypatch.setattr(FedAvg, "client_update", client_update)
    sim = _run(_fedavg_cfg(tmp_path, "none"))
    recs = _metrics(sim)
    assert [r.get("rejected/nonfinite", 0) for r in recs] == [0, 8, 8, 8]
    assert len({r["global/acc"] for r in recs}) == 1  # never moved from the initial model
    init = sim.executor.env.init_params(SERVER)
    assert all(torch.equal(v, init[k]) for k, v in sim.executor.states[SERVER]["params"].items())


def test_peers_with_empty_inboxes_keep_their_own_model(tmp_path: Path, monkeypatch) -> None:
    orig = GossipAlgorithm.train_send
    trained: dict[int, dict] = {}

    def train_send(self, ctx, state, inbox):
        new, out = orig(self, ctx, state, inbox)
        trained[ctx.node] = new["params"]
        for _, msg in out.items:
            msg.tensors = _nan_like(msg.tensors)
        return new, out

    monkeypatch.setattr(GossipAlgorithm, "train_send", train_send)
    sim = _run(digits_config(tmp_path / "empty", "dfedavg", rounds=1))
    assert _total(sim, "rejected/nonfinite") == 8 * 3
    for n in range(8):
        assert all(torch.equal(v, trained[n][k]) for k, v in sim.executor.states[n]["params"].items())


def test_clean_run_writes_no_validation_keys(tmp_path: Path) -> None:
    sim = _run(_fedavg_cfg(tmp_path, "clean", rounds=2))
    assert not any(k.startswith(("rejected/", "faults/")) for rec in _metrics(sim) for k in rec)
    assert "incidents" not in sim.result.summary


# --------------------------------------------------------------------------- every algorithm


def _tiny_config(tmp_path: Path, alg: str) -> dict:
    """Two quick rounds of ``alg`` on digits (the configs of the algorithms' own tests)."""
    from lowband.algorithms import ALGORITHMS
    from test_dense import dense_config
    from test_fol import fol_config
    from test_ntk import _cfg as ntk_config

    if alg in ("fol", "oneshot_fedavg"):
        return fol_config(tmp_path, alg)
    if alg in ("dense", "coboost"):
        return {**dense_config(tmp_path, alg), "rounds": 2}
    if alg in ("ntk_dfl", "spark"):
        return ntk_config(tmp_path, alg, 2)
    cfg = digits_config(tmp_path, alg, rounds=2)
    hp = ALGORITHMS[alg].Hyperparams.model_fields
    cfg["algorithm"] = {k: v for k, v in cfg["algorithm"].items() if k == "name" or k in hp}
    if ALGORITHMS[alg].family == "peer":
        cfg["topology"] = {"kind": "kregular", "k": 3}
    if alg in ("kta", "fedmd"):
        cfg["data"]["public_size"] = 100
    if alg == "local":
        cfg["topology"] = {"kind": "star", "sampling": "all"}
    return cfg


def _all_algorithms() -> list[str]:
    from lowband.algorithms import ALGORITHMS

    return sorted(ALGORITHMS)


@pytest.mark.parametrize("faults", [False, True], ids=["nan", "nan+faults"])
@pytest.mark.parametrize("algorithm", _all_algorithms())
def test_every_algorithm_survives_a_nan_node_with_dropout_and_stragglers(tmp_path: Path, monkeypatch,
                                                                         algorithm: str, faults: bool) -> None:
    """Node 0 sends NaN in every float tensor (and, with faults, 30% of the nodes drop out
    and stragglers miss the deadline): no algorithm crashes on its smaller inboxes, and no
    other node's model becomes non-finite (the refusals happen at the receivers, not in the
    algorithm). Without faults node 0 always takes part, so its messages are refused."""
    from lowband.engine.executor import SerialExecutor

    if faults and event_clock(algorithm):
        pytest.skip(f"{algorithm} runs on the event clock, which refuses [faults] (its devices' availability "
                    f"and link times decide who arrives): the nan variant covers it")
    orig = SerialExecutor.run_step

    def run_step(self, step, round, plan, inboxes):
        outs = orig(self, step, round, plan, inboxes)
        for _, msg in outs.get(0, Outbox()).items:
            msg.tensors = _nan_like(msg.tensors)
        return outs

    monkeypatch.setattr(SerialExecutor, "run_step", run_step)
    cfg = _tiny_config(tmp_path, algorithm)
    if faults:
        cfg["faults"] = {"dropout": 0.3, "straggler": 0.3, "deadline": 2.0}
    cfg["checkpoint_every"] = 0
    sim = _run(cfg)
    recs = _metrics(sim)
    assert all(("faults/dropped" in r) == faults for r in recs)
    if not faults and algorithm != "local":  # local sends nothing
        assert _total(sim, "rejected/nonfinite") > 0
    for node, state in sim.executor.states.items():
        params = state.get("params") if isinstance(state, dict) else None
        if node != 0 and isinstance(params, dict):
            assert _finite(params), (algorithm, node)


def test_consensus_leaves_out_a_poisoned_node_and_says_so(tmp_path: Path, monkeypatch) -> None:
    """One DFedAvg node with lr 1e6 (finite weights of norm ~1e23): its messages are
    refused by the norm screen and the other nodes learn, but an average over ALL nodes'
    weights scored 10% (chance) while they did. The consensus now leaves it out, counts it
    in consensus/excluded and lands near the nodes' own accuracy."""
    _huge_lr_for(monkeypatch, decentralized, 0)
    c = digits_config(tmp_path / "d", "dfedavg", rounds=3)
    c["eval"] = {"protocols": ["consensus", "node_global"]}
    with pytest.warns(UserWarning, match="consensus leaves out node"):
        recs = _metrics(_run(c))
    assert [r.get("consensus/excluded", 0) for r in recs] == [0, 1, 1, 1]
    assert recs[-1]["consensus/acc"] > 0.3 and recs[-1]["node_global/acc"] > 0.3
    c = digits_config(tmp_path / "off", "dfedavg", rounds=1)  # the screen off: nothing to leave it out by
    c.update(eval={"protocols": ["consensus"]}, comm={"norm_factor": 0})
    assert "consensus/excluded" not in _metrics(_run(c))[-1]


def test_node_global_summary_of_all_diverged_nodes_is_nan_without_numpy_warnings() -> None:
    from lowband.engine.evaluation import node_global_summary

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # numpy's "Mean of empty slice" fails the test
        out = node_global_summary([math.nan, math.nan], [math.nan, math.nan])
        assert all(math.isnan(v) for v in out.values())
        assert node_global_summary([0.5, math.nan], [1.0, math.nan])["node_global/acc"] == 0.5


def test_consensus_members_rule() -> None:
    from lowband.engine.evaluation import consensus_members

    ok = {n: {"w": torch.full((4,), 1.0 + n)} for n in range(5)}
    assert consensus_members(ok, 100.0) == [0, 1, 2, 3, 4]
    bad = {**ok, 5: {"w": torch.full((4,), float("nan"))}, 6: {"w": torch.full((4,), float("inf"))},
           7: {"w": torch.full((4,), 1e6)}}
    assert consensus_members(bad, 100.0) == [0, 1, 2, 3, 4]
    assert consensus_members(bad, None) == [0, 1, 2, 3, 4, 7]  # non-finite always out, the norm rule off
