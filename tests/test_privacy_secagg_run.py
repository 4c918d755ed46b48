"""SecAgg+ inside real runs: FedAvg's round gains the protocol's phases as steps; the run
learns as plain FedAvg does; the ledger holds every protocol message at the formula's size;
dropout is recovered and costs its unmasking traffic."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import digits_config
from lowband.algorithms import ALGORITHMS
from lowband.config import validate
from lowband.engine.simulator import Simulation
from lowband.privacy import secagg as sa
from lowband.privacy.secagg_steps import SecAggRun, check_secagg, with_secagg


def _run(cfg: dict) -> Simulation:
    sim = Simulation(validate(cfg))
    sim.result = sim.run()
    return sim


def _last(sim: Simulation) -> dict:
    lines = (Path(sim.result.run_dir) / "metrics.jsonl").read_text().splitlines()
    return json.loads(lines[-1])


def test_refusals_are_one_line() -> None:
    for alg, words in [("scaffold", "two secure sums"), ("fednova", "step count"), ("fedcspack", "individual")]:
        with pytest.raises(ValueError, match=words) as e:
            check_secagg(alg)
        assert "\n" not in str(e.value)


@pytest.mark.parametrize("faults", [None, {"dropout": 0.25}])
def test_fedavg_under_secagg_learns_and_counts_the_protocol(tmp_path: Path, monkeypatch, faults) -> None:
    run = SecAggRun(sa.SecAggParams(degree=2))
    cfg = digits_config(tmp_path / "plain", "fedavg", rounds=4, upload="delta")
    if faults:
        cfg["faults"] = faults
    plain = _run(cfg)
    monkeypatch.setitem(ALGORITHMS, "fedavg", with_secagg(ALGORITHMS["fedavg"], run))
    cfg = digits_config(tmp_path / "secure", "fedavg", rounds=4, upload="delta")
    if faults:
        cfg["faults"] = faults
    sim = _run(cfg)
    acc, acc0 = _last(sim), _last(plain)
    key = "global/acc"
    assert key in acc and acc[key] > 0.4 and abs(acc[key] - acc0[key]) < 0.1
    led = sim.ledger
    kinds = led.by_kind()
    for k in ("secagg_advertise", "secagg_keys", "secagg_shares", "secagg_masked", "secagg_unmask"):
        assert kinds[k]["messages"] > 0, k
    assert "delta" not in kinds  # no update travels in the clear
    # the masked input of each client is ceil(l * 32 / 8) bytes of buffer: l = the model's float coordinates
    n_masked = kinds["secagg_masked"]["messages"]
    l = sim.model_size  # the MLP's float coordinates (it has no buffers)
    per = sa.payload_bytes("secagg_masked", length=l, modulus_bits=32)
    header = (kinds["secagg_masked"]["encoded"] - n_masked * per) / n_masked
    assert header == int(header) and 0 < header < 200
    # advertise: 64 bytes of keys a message, plus a fixed header
    adv = kinds["secagg_advertise"]
    assert (adv["encoded"] - adv["messages"] * 64) % adv["messages"] == 0


def test_distributed_dp_inside_secagg_runs_and_pays_bits_per_coordinate(tmp_path: Path, monkeypatch) -> None:
    from lowband.privacy.distributed import Skellam

    cfg = digits_config(tmp_path / "probe", "fedavg", rounds=1, upload="delta")
    d = Simulation(validate(cfg)).model_size
    results = {}
    for bits in (12, 20):
        sk = Skellam(clip=5.0, noise_multiplier=0.05, bits=bits, n=4, d=d)
        run = SecAggRun(sa.SecAggParams(modulus_bits=bits, degree=2), skellam=sk)
        monkeypatch.setitem(ALGORITHMS, "fedavg", with_secagg(ALGORITHMS["fedavg"], run))
        sim = _run(digits_config(tmp_path / f"b{bits}", "fedavg", rounds=4, upload="delta"))
        kinds = sim.ledger.by_kind()["secagg_masked"]
        per = sa.payload_bytes("secagg_masked", length=sk.D, modulus_bits=bits)
        assert per == -(-sk.D * bits // 8)
        header = (kinds["encoded"] - kinds["messages"] * per) / kinds["messages"]
        assert header == int(header) and 0 < header < 200
        results[bits] = (_last(sim)["global/acc"], kinds["encoded"])
        monkeypatch.undo()
    assert results[12][1] < results[20][1] * 0.7  # fewer bits, fewer bytes
    assert results[20][0] > 0.4  # learns with light noise at 20 bits
    with pytest.raises(ValueError, match="must equal secagg.modulus_bits"):
        SecAggRun(sa.SecAggParams(modulus_bits=32), skellam=Skellam(clip=1.0, noise_multiplier=1.0, bits=16, n=4, d=10))
