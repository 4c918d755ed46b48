"""Poisson client sampling (``topology.sampling = "poisson"``) and the accountant's sampling
event: the epsilon a run reports is dp-accounting's for the sampling the run really used."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from conftest import digits_config
from lowband.config import validate
from lowband.engine.simulator import Simulation
from lowband.topology import build_topology

dpa = pytest.importorskip("dp_accounting")

CENTRAL = {"mechanism": "central", "clip": 0.5, "noise_multiplier": 1.0}


def _metrics(run_dir: str | Path) -> list[dict]:
    return [json.loads(x) for x in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]


def test_poisson_sampling_is_independent_addressed_and_varies() -> None:
    top = build_topology("star", 200, 7, sampling="poisson", fraction=0.1)
    again = build_topology("star", 200, 7, sampling="poisson", fraction=0.1)
    plans = [top.plan(r).participants for r in range(400)]
    # addressed: the same (seed, round) gives the same cohort, in any order of asking
    assert [again.plan(r).participants for r in reversed(range(400))] == plans[::-1]
    assert build_topology("star", 200, 8, sampling="poisson", fraction=0.1).plan(3).participants != plans[3]
    sizes = np.array([len(p) for p in plans])
    assert len(set(sizes.tolist())) > 5  # the cohort size varies (fixed-size sampling would not)
    assert abs(sizes.mean() - 20) < 1.0  # E|cohort| = q N
    # each client independently: inclusion frequency ~ q for every client, pairs ~ q^2
    inc = np.zeros((400, 200), bool)
    for r, p in enumerate(plans):
        inc[r, list(p)] = True
    assert abs(inc.mean(0) - 0.1).max() < 0.06
    assert abs((inc[:, 0] & inc[:, 1]).mean() - 0.01) < 0.015
    assert top.per_round == 20 and "Poisson" in top.describe()
    with pytest.raises(ValueError, match="fraction"):
        build_topology("star", 10, 0, sampling="poisson", fraction=0.0)


def _cfg(tmp: Path, sampling: dict, rounds: int = 3, **sections) -> dict:
    cfg = digits_config(tmp, "fedavg", rounds=rounds, upload="delta")
    cfg["topology"] = {"kind": "star", **sampling}
    cfg.update(sections)
    return cfg


def _direct_epsilon(event, rounds: int, relation) -> float:
    acc = dpa.rdp.RdpAccountant(neighboring_relation=relation)
    acc.compose(event, rounds)
    return acc.get_epsilon(1e-5)


@pytest.mark.parametrize("sampling", ["poisson", "fixed"])
def test_the_reported_epsilon_is_dp_accountings_for_the_runs_real_sampling(tmp_path: Path, sampling: str) -> None:
    topo = {"sampling": "poisson", "fraction": 0.5} if sampling == "poisson" else {"sampling": "count", "count": 4}
    res = Simulation(validate(_cfg(tmp_path, topo, dp=CENTRAL))).run()
    recs = _metrics(res.run_dir)
    rel = dpa.NeighboringRelation
    assert [r["round"] for r in recs][-3:] == [1, 2, 3]
    for r in (r for r in recs if r["round"] > 0):
        if sampling == "poisson":  # q = 0.5 of 8, add-or-remove, sensitivity S: multiplier z
            want = _direct_epsilon(dpa.PoissonSampledDpEvent(0.5, dpa.GaussianDpEvent(1.0)), r["round"],
                                   rel.ADD_OR_REMOVE_ONE)
        else:  # 4 of 8 without replacement, replace-one, sensitivity 2S: multiplier z / 2
            want = _direct_epsilon(dpa.SampledWithoutReplacementDpEvent(8, 4, dpa.GaussianDpEvent(0.5)),
                                   r["round"], rel.REPLACE_ONE)
        assert r["dp/epsilon"] == pytest.approx(want, rel=1e-9)
    # the two samplings really are accounted differently (Poisson's bound is the smaller here)
    assert recs[-1]["dp/epsilon"] > 0
    other = "fixed" if sampling == "poisson" else "poisson"
    ev = (dpa.SampledWithoutReplacementDpEvent(8, 4, dpa.GaussianDpEvent(0.5)) if other == "fixed"
          else dpa.PoissonSampledDpEvent(0.5, dpa.GaussianDpEvent(1.0)))
    rel_o = rel.REPLACE_ONE if other == "fixed" else rel.ADD_OR_REMOVE_ONE
    assert abs(_direct_epsilon(ev, 3, rel_o) - recs[-1]["dp/epsilon"]) > 0.05


def test_a_poisson_run_uses_varying_cohorts_noises_empty_rounds_and_resumes(tmp_path: Path) -> None:
    """q = 0.15 of 8 clients: some rounds sample nobody; the DP noise is still released."""
    cfg = _cfg(tmp_path, {"sampling": "poisson", "fraction": 0.15}, rounds=6, dp=CENTRAL, checkpoint_every=1)
    top = build_topology("star", 8, 1, sampling="poisson", fraction=0.15)
    sizes = [len(top.plan(r).participants) for r in range(6)]
    assert 0 in sizes and len(set(sizes)) > 1
    sim = Simulation(validate(cfg))
    res = sim.run()
    recs = _metrics(res.run_dir)
    assert [r.get("alg/dp/senders", 0) for r in recs if r["round"] > 0] == sizes
    # the expected cohort is the fixed denominator and the sampling rate the accountant sees
    assert sim.privacy.track.method == "rdp"
    # an empty round still moves the model (noise only): the global accuracy is a fresh value
    empty = [r for r, s in enumerate(sizes, 1) if s == 0]
    assert all(recs[r]["alg/dp/update_norm"] > 0 for r in empty)


def test_distributed_dp_refuses_poisson_sampling(tmp_path: Path) -> None:
    from lowband.config import ConfigError

    cfg = _cfg(tmp_path, {"sampling": "poisson", "fraction": 0.5}, secagg={"enabled": True},
               dp={"mechanism": "distributed", "clip": 1.0, "noise_multiplier": 1.0, "bits": 20})
    with pytest.raises(ConfigError, match="poisson"):
        Simulation(validate(cfg))
