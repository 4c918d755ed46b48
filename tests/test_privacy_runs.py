"""[dp] and [secagg] in real runs from a config: the epsilon written per round is the
accountant's; a run over dp.target_epsilon is refused before anything is written; local DP
changes what peers receive and counts its releases; SecAgg's ledger holds the protocol's
messages at the sizes of its formulas; refused combinations say why in one line; a killed
DP run resumes to the byte."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import tomli_w

from conftest import digits_config
from lowband.cli import main
from lowband.comm.ledger import Ledger
from lowband.comm.message import SERVER, Message
from lowband.comm.network import CodecConfig, Network
from lowband.config import ConfigError, validate
from lowband.engine.simulator import Simulation
from lowband.privacy import secagg as sa
from lowband.privacy.accountant import SampledGaussian, final_epsilon
from lowband.privacy.config import PrivacyRefused

pytest.importorskip("dp_accounting")

CENTRAL = {"mechanism": "central", "clip": 0.5, "noise_multiplier": 1.0}


def _cfg(tmp: Path, alg: str = "fedavg", rounds: int = 3, **sections) -> dict:
    cfg = digits_config(tmp, alg, rounds=rounds, **({"upload": "delta"} if alg == "fedavg" else {}))
    cfg.update(sections)
    return cfg


def _metrics(run_dir: str | Path) -> list[dict]:
    return [json.loads(x) for x in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]


def test_central_dp_epsilon_per_round_is_the_planned_track_and_the_accountant(tmp_path: Path) -> None:
    sim = Simulation(validate(_cfg(tmp_path, dp=CENTRAL, eval={"at_round0": True})))
    res = sim.run()
    recs = _metrics(res.run_dir)
    assert [r["round"] for r in recs] == [0, 1, 2, 3]
    track = sim.privacy.track
    mech = SampledGaussian(1.0, population=8, cohort=4, sampling="fixed")  # 4 of 8 clients, without replacement
    for r in recs:
        assert r["dp/epsilon"] == track.epsilon(r["round"])  # the planned track, exactly
        assert r["dp/epsilon"] == pytest.approx(final_epsilon(mech, r["round"], 1e-5), rel=1e-9)  # the accountant
        assert r["dp/delta"] == 1e-5
    assert recs[0]["dp/epsilon"] == 0 and 0 < recs[1]["dp/epsilon"] < recs[3]["dp/epsilon"]
    assert res.summary["dp/epsilon"] == recs[-1]["dp/epsilon"] and res.summary["dp/mechanism"] == "central"
    # the mechanism really ran: every update clipped to S = 0.5, noise of std z * S on the sum
    assert all(r["alg/dp/clip"] == 0.5 and r["alg/dp/noise_std"] == 0.5 for r in recs[1:])
    plain = Simulation(validate(_cfg(tmp_path / "plain"))).run()
    assert plain.metrics[-1]["global/acc"] != recs[-1]["global/acc"] and "dp/epsilon" not in plain.metrics[-1]


def test_target_epsilon_too_low_refuses_before_writing(tmp_path: Path, capsys) -> None:
    cfg = _cfg(tmp_path, dp={**CENTRAL, "target_epsilon": 1.0})
    path = tmp_path / "dp.toml"
    path.write_text(tomli_w.dumps(cfg))
    assert main(["run", str(path), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "dp.target_epsilon = 1 would be exceeded" in err
    assert "dp.noise_multiplier >=" in err
    assert not Path(cfg["out_dir"]).exists()
    # within the budget it runs
    ok = _cfg(tmp_path / "ok", dp={**CENTRAL, "target_epsilon": 100.0})
    assert Simulation(validate(ok)).run().summary["dp/target_epsilon"] == 100.0


def test_local_dp_on_a_peer_method_changes_messages_and_counts_releases(tmp_path: Path) -> None:
    plain = Simulation(validate(_cfg(tmp_path / "plain", "dfedavg")))
    plain_res = plain.run()
    sim = Simulation(validate(_cfg(tmp_path / "ldp", "dfedavg", dp={"mechanism": "local", "clip": 1.0,
                                                                    "noise_multiplier": 0.5})))
    res = sim.run()
    assert sim.network.sender_transform is not None and sim.network.sender_transform.spec == "clip(1)+gauss(0.5)"
    # the same messages cross the same links (fp32: the same bytes), but what arrives differs
    assert res.summary["bytes_peer"] == plain_res.summary["bytes_peer"] > 0
    assert res.metrics[-1]["consensus/acc"] != plain_res.metrics[-1]["consensus/acc"]
    # releases: every message a node sent (k = 3 neighbours a round), composed per node
    cols = sim.ledger.columns()
    assert res.metrics[0]["round"] == 0 and res.metrics[0]["dp/local_epsilon"] == 0
    for rec in res.metrics[1:]:
        r = rec["round"]
        sent = int(((cols["round"] == r) & (cols["src"] != SERVER)).sum())
        assert rec["dp/releases"] == sent == 8 * 3
        assert rec["dp/local_releases"] == 3 * r
    from lowband.privacy.transforms import local_epsilon

    assert res.summary["dp/local_epsilon"] == pytest.approx(local_epsilon(0.5, 9, 1e-5))
    assert res.summary["incidents"]["dp/releases"] == 72
    import torch

    got = sim.network.send(Message("weights", {"w": torch.ones(10_000)}), 2, 3, round=9, direction="peer")
    # clipped to norm 1, then N(0, 0.5^2) per coordinate: the norm is about 0.5 * sqrt(10000) = 50
    assert float(got.tensors["w"].norm()) == pytest.approx(50.0, rel=0.05)


def _synthetic(kind: str, direction: str, count: int, length: int, bits: int) -> Message:
    """A protocol message whose buffers are exactly ``payload_bytes`` long (ids int32, bytes uint8)."""
    import torch

    ids = torch.zeros(count, dtype=torch.int32)
    u8 = lambda *s: torch.zeros(s, dtype=torch.uint8)  # noqa: E731
    if kind == "secagg_advertise":
        return Message(kind, {"pk": u8(2, sa.KEY_BYTES)})
    if kind == "secagg_keys":
        return Message(kind, {"ids": ids, "pk": u8(count, 2, sa.KEY_BYTES)})
    if kind == "secagg_shares":
        return Message(kind, {"ids": ids, "ct": u8(count, sa.CIPHERTEXT_BYTES)})
    if kind == "secagg_masked":
        return Message(kind, {"y": u8(sa.payload_bytes(kind, length=length, modulus_bits=bits))})
    if direction == "down":  # the unmask request: who survived, who dropped
        return Message(kind, {"alive": ids, "dropped": torch.zeros(0, dtype=torch.int32)})
    return Message(kind, {"ids": ids, "share": u8(count, sa.SHARE_BYTES)})


def test_secagg_ledger_holds_the_protocol_at_its_formula_sizes(tmp_path: Path) -> None:
    sim = Simulation(validate(_cfg(tmp_path, rounds=2, secagg={"enabled": True})))
    res = sim.run()
    assert res.metrics[-1]["global/acc"] > 0.3
    led, cols = sim.ledger, sim.ledger.columns()
    kinds = led.by_kind()
    assert "delta" not in kinds  # no update travels in the clear
    m, k, l, bits = 4, 3, sim.model_size, 32  # 4 clients a round, complete graph: 3 neighbours
    per_msg = {  # (kind, direction) -> (messages a round, entries per message)
        ("secagg_advertise", "up"): (m, 0), ("secagg_keys", "down"): (m, k), ("secagg_shares", "up"): (m, k),
        ("secagg_shares", "down"): (m, k), ("secagg_masked", "up"): (m, 0), ("secagg_unmask", "down"): (m, k),
        ("secagg_unmask", "up"): (m, k)}
    net = Network(CodecConfig(), Ledger(), seed=0)
    names = list(led.kinds)
    from lowband.comm.ledger import DIRECTIONS as dirs
    for (kind, direction), (n, count) in per_msg.items():
        want = len(net.encode(_synthetic(kind, direction, count, l, bits), 1, SERVER, round=1, direction=direction))
        payload = sa.payload_bytes("secagg_unmask_request" if (kind, direction) == ("secagg_unmask", "down")
                                   else kind, count=count, length=l, modulus_bits=bits)
        assert want > payload  # the wire header (names, dtypes, shapes) on top of the formula's payload
        sel = (cols["kind"] == names.index(kind)) & (cols["direction"] == dirs.index(direction))
        got = cols["encoded"][sel]
        assert len(got) == n * 2, (kind, direction)  # two rounds
        assert set(got.tolist()) == {want}, (kind, direction)
    assert res.summary["secagg/bytes"] == sum(v["encoded"] for kk, v in kinds.items() if kk.startswith("secagg_"))


@pytest.mark.parametrize("alg,sections,words", [
    ("fedcspack", {"secagg": {"enabled": True}}, "fedcspack"),
    ("dfedavg", {"dp": CENTRAL}, "no server"),
    ("fedavg", {"secagg": {"enabled": True}, "comm": {"by_direction": {"up": "qsgd(4)"}}}, "qsgd"),
    ("fedavg", {"secagg": {"enabled": True}, "dp": CENTRAL}, "distributed"),
    ("fedavg", {"dp": {"mechanism": "distributed", "clip": 1.0}}, "secagg.enabled"),
    ("fedavg", {"dp": {"mechanism": "local", "clip": 1.0, "target_epsilon": 4.0}}, "local_epsilon"),
    ("fedavg", {"secagg": {"enabled": True}, "comm": {"norm_factor": 10.0}}, "norm screen"),
])
def test_refused_combinations_say_why_in_one_line(tmp_path: Path, alg: str, sections: dict, words: str) -> None:
    cfg = _cfg(tmp_path, alg)
    for key, v in sections.items():
        cfg[key] = {**cfg.get(key, {}), **v} if isinstance(v, dict) else v
    with pytest.raises(PrivacyRefused, match=words) as e:
        validate(cfg)
    assert "\n" not in str(e.value) and isinstance(e.value, ConfigError)


def test_secagg_with_a_robust_rule_is_refused_where_the_section_exists(tmp_path: Path) -> None:
    from lowband.config.schema import Experiment

    if "aggregation" not in Experiment.model_fields:
        pytest.skip("no [aggregation] section in this build")
    cfg = _cfg(tmp_path, secagg={"enabled": True}, aggregation={"rule": "median"})
    with pytest.raises(PrivacyRefused, match="median"):
        validate(cfg)


class _Kill(Exception):
    pass


@pytest.mark.parametrize("alg,section", [("fedavg", {"dp": {**CENTRAL, "adaptive_clip": True, "clip": None, "bit_noise": 1.0}}),
                                         ("dfedavg", {"dp": {"mechanism": "local", "clip": 1.0}}),
                                         ("fedavg", {"secagg": {"enabled": True, "degree": 2}}),
                                         ("fedavg", {"dp": CENTRAL, "topology": {"kind": "star", "sampling": "poisson",
                                                                                 "fraction": 0.4}})])
def test_a_killed_privacy_run_resumes_to_the_byte(tmp_path: Path, alg: str, section: dict) -> None:
    sec = {k: {kk: vv for kk, vv in v.items() if vv is not None} for k, v in section.items()}
    full = validate({**_cfg(tmp_path / "full", alg, rounds=4, **sec), "checkpoint_every": 1})
    Simulation(full).run()
    want = (Path(full.run_dir()) / "metrics.jsonl").read_text()
    cut = validate({**_cfg(tmp_path / "cut", alg, rounds=4, **sec), "checkpoint_every": 1})

    def boom(r: int, total: int, rec: dict) -> None:
        if r == 2:
            raise _Kill

    with pytest.raises(_Kill):
        Simulation(cut, progress=boom).run()
    res = Simulation(cut, resume=True).run()
    assert (Path(cut.run_dir()) / "metrics.jsonl").read_text() == want
    assert any(k.startswith(("dp/", "secagg/")) for k in res.metrics[-1])


def test_adaptive_clip_moves_in_a_real_run(tmp_path: Path) -> None:
    res = Simulation(validate(_cfg(tmp_path, dp={"mechanism": "central", "adaptive_clip": True,
                                                 "noise_multiplier": 0.5, "bit_noise": 1.0}))).run()
    clips = [r["alg/dp/clip"] for r in res.metrics[1:]]
    assert clips[0] == pytest.approx(0.1) and len(set(clips)) == len(clips)  # the clip follows the norms
    assert math.isfinite(res.summary["dp/epsilon"])


def test_frontier_takes_dp_and_secagg_keys_and_marks_refused_cells(tmp_path: Path, capsys) -> None:
    """The issue's command: `lowband frontier CONFIG --methods fedavg,fedcspack --codecs "fp32,qsgd(4)"
    dp.target_epsilon=8 secagg.enabled=true` (distributed DP in the base config): the served cell
    runs and reports its epsilon; every other cell is refused with its one-line reason."""
    import csv

    cfg = _cfg(tmp_path, rounds=2, dp={"mechanism": "distributed", "clip": 1.0, "noise_multiplier": 2.0, "bits": 20})
    path = tmp_path / "base.toml"
    path.write_text(tomli_w.dumps(cfg))
    out = tmp_path / "front"
    rc = main(["frontier", str(path), "--methods", "fedavg,fedcspack", "--codecs", "fp32,qsgd(4),sharedmask(0.1)",
               "dp.target_epsilon=8", "secagg.enabled=true", "--backend", "serial", "--quiet", "--out", str(out)])
    assert rc == 0, capsys.readouterr().err
    rows = {(r["method"], r["codec"]): r for r in csv.DictReader(open(out / "frontier.csv"))}
    ok = rows[("fedavg", "fp32")]
    assert ok["status"] == "ok" and 0 < float(ok["epsilon"]) <= 8 and float(ok["secagg_bytes"]) > 0
    assert rows[("fedavg", "qsgd(4)")]["status"] == "refused" and "qsgd" in rows[("fedavg", "qsgd(4)")]["reason"]
    sparse = rows[("fedavg", "sharedmask(0.1)")]  # the summable sparsifier is served, at a fraction of the bytes
    assert sparse["status"] == "ok" and 0 < float(sparse["epsilon"]) <= 8
    assert float(sparse["secagg_bytes"]) < 0.5 * float(ok["secagg_bytes"])
    for codec in ("fp32", "qsgd(4)", "sharedmask(0.1)"):
        r = rows[("fedcspack", codec)]
        assert r["status"] == "refused" and "fedcspack" in r["reason"] and "\n" not in r["reason"]
    md = (out / "frontier.md").read_text()
    assert "| epsilon |" in md.replace("epsilon | Pareto", "epsilon |") and "fedcspack x fp32: refused:" in md
    # a central-DP frontier over its budget: the cell is refused before it runs, with the fix
    cfg = _cfg(tmp_path / "c", rounds=2, dp={**CENTRAL, "target_epsilon": 1.0})
    from lowband.tradeoff import frontier_cells, parse_methods

    cells = frontier_cells(cfg, parse_methods("fedavg"), ["fp32"], tmp_path / "c-front", None)
    assert cells[0].status == "refused" and "dp.noise_multiplier >=" in cells[0].reason


def test_a_sweep_over_dp_keys_reports_epsilon(tmp_path: Path) -> None:
    from lowband.batch import run_sweep

    cfg = _cfg(tmp_path, rounds=2, dp=CENTRAL)
    out, cells = run_sweep(cfg, {"dp.noise_multiplier": [0.5, 2.0]}, out=tmp_path / "sw", backend="serial",
                           progress=False)
    md = (out / "sweep.md").read_text()
    assert "| epsilon |" in md
    eps = [json.loads((c.dir / "summary.json").read_text())["dp/epsilon"] for c in cells]
    assert eps[0] > eps[1] > 0  # more noise, less epsilon
    assert f"{eps[0]:.3g}" in md and f"{eps[1]:.3g}" in md


def test_lowband_list_shows_the_mechanisms_and_their_parameters(capsys) -> None:
    assert main(["list", "privacy"]) == 0
    out = capsys.readouterr().out
    for words in ("central", "local", "distributed", "secagg", "dp.noise_multiplier = 1.0", "dp.delta = 1e-05",
                  "secagg.modulus_bits = 32", "dp.target_epsilon"):
        assert words in out, words
