"""The aggregation hook and the robust rules (lowband.aggregation): each rule against a hand
computation on small vectors, each rule's breakdown point on a constructed case (f attackers
tolerated, f + 1 not), the refusals, and the hook: no rule = the algorithm's own average to
the byte; a rule = reference + rule(models - reference), its counters collected."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from conftest import digits_config
from lowband.aggregation.base import COLLECTOR, AggregationInput, aggregate_models, drain_place
from lowband.aggregation.config import AggregationConfig, build_rule
from lowband.aggregation.rules import (Bridge, Bulyan, CenteredClipping, GeoMed, Krum, Mean, Median, MultiKrum,
                                       SelfCenteredClipping, TrimmedMean, krum_scores)
from lowband.config import ConfigError, validate
from lowband.train import weighted_average

G = torch.Generator()


def inp(rows, weights=None, senders=None, node=-1) -> AggregationInput:
    x = torch.tensor(rows, dtype=torch.float32)
    n = x.shape[0]
    return AggregationInput(updates=x, weights=torch.tensor(weights or [1.0] * n), senders=tuple(senders or range(n)),
                            node=node, round=1, reference=torch.zeros(x.shape[1]))


def close(a: torch.Tensor, b) -> bool:
    return torch.allclose(a, torch.tensor(b, dtype=torch.float32), atol=1e-5)


# --------------------------------------------------------------------------- hand computations


def test_median_by_hand() -> None:
    out, c = Median(f=1)(inp([[1, 10], [2, -5], [100, 0]]), G)
    assert close(out, [2, 0])
    out, _ = Median(f=1)(inp([[1], [2], [4], [100]]), G)  # even n: mean of the two middle values
    assert close(out, [3])
    out, c = Median(f=1)(inp([[1, 3, 2], [2, 1, 3], [3, 2, 1], [-50, -50, -50]]), G)
    assert c == {"outliers": 1}  # the far row is trimmed in every coordinate, each honest row in one


def test_trimmed_mean_by_hand() -> None:
    out, _ = TrimmedMean(f=1)(inp([[1, 0], [2, 7], [3, 1], [100, -9]]), G)
    assert close(out, [(2 + 3) / 2, (0 + 1) / 2])


def test_krum_and_multikrum_by_hand() -> None:
    rows = [[0.0], [1.0], [2.0], [10.0], [11.0]]
    # n = 5, f = 1: each score sums the n - f - 2 = 2 smallest squared distances
    assert krum_scores(torch.tensor(rows), 1).tolist() == [1 + 4, 1 + 1, 1 + 4, 1 + 64, 1 + 81]
    out, c = Krum(f=1)(inp(rows), G)
    assert close(out, [1.0]) and c == {"discarded": 4}
    out, c = MultiKrum(f=1)(inp(rows, weights=[1, 1, 2, 1, 1]), G)  # m = n - f = 4: rows 0, 1, 2, 3
    assert close(out, [(0 + 1 + 2 * 2 + 10) / 5]) and c == {"discarded": 1}
    out, _ = MultiKrum(f=1, m=2)(inp(rows), G)  # rows 1 and then 0 (tie with 2: the lower index)
    assert close(out, [0.5])


def test_bulyan_by_hand() -> None:
    rows = [[0.0], [1.0], [2.0], [3.0], [4.0], [5.0], [50.0]]  # n = 7 = 4f + 3, f = 1
    # theta = n - 2f = 5 selected by repeated Krum: 2 (score 2), 3, then 1 ... the far row never
    out, c = Bulyan(f=1)(inp(rows), G)
    assert c == {"discarded": 2}
    # selection {0..4} or {1..5}; beta = theta - 2f = 3 values closest to the median: the middle three
    assert float(out) in (2.0, 3.0)
    sel_out, _ = Bulyan(f=1)(inp([[0.0], [1.0], [2.0], [3.0], [4.0], [40.0], [50.0]]), G)
    assert close(sel_out, [2.0])


def test_geomed_by_hand() -> None:
    # three collinear points: the geometric median is the middle one; Weiszfeld converges to it
    out, _ = GeoMed(iterations=200)(inp([[0.0, 0.0], [1.0, 0.0], [10.0, 0.0]]), G)
    assert abs(float(out[0]) - 1.0) < 1e-2 and abs(float(out[1])) < 1e-6
    # one iteration from the mean m = 11/3: b_i = 1/|m - x_i|
    m = 11 / 3
    b = [1 / m, 1 / abs(m - 1), 1 / abs(m - 10)]
    out, _ = GeoMed(iterations=1)(inp([[0.0], [1.0], [10.0]]), G)
    assert abs(float(out) - (b[1] * 1 + b[2] * 10) / sum(b)) < 1e-5


def test_centered_clipping_by_hand() -> None:
    # v = 0, tau = 1, one iteration: mean of the clipped rows
    out, c = CenteredClipping(tau=1.0, iterations=1)(inp([[0.5, 0.0], [0.0, 3.0], [-4.0, 0.0]]), G)
    assert close(out, [(0.5 + 0 - 1) / 3, (0 + 1 + 0) / 3]) and c == {"clipped": 2}
    # second iteration re-centres at v1
    out2, _ = CenteredClipping(tau=1.0, iterations=2)(inp([[0.5, 0.0], [0.0, 3.0], [-4.0, 0.0]]), G)
    v1 = torch.tensor([-0.5 / 3, 1 / 3])
    z = torch.tensor([[0.5, 0.0], [0.0, 3.0], [-4.0, 0.0]]) - v1
    z = z * torch.clamp(1.0 / z.norm(dim=1), max=1.0)[:, None]
    assert torch.allclose(out2, v1 + z.mean(0), atol=1e-6)


def test_bridge_by_hand() -> None:
    # node 5 (own update 0, first) with neighbours 1, 2, 3 at 1, 2, 100: trim one each side of
    # the neighbours (1 and 100), average the rest with its own: (0 + 2) / 2
    out, _ = Bridge(f=1)(inp([[0.0], [1.0], [2.0], [100.0]], senders=[5, 1, 2, 3], node=5), G)
    assert close(out, [1.0])


def test_self_clipping_by_hand() -> None:
    rows = [[0.0, 0.0], [1.0, 0.0], [0.0, 2.0], [0.0, -8.0]]  # own first (node 4)
    out, c = SelfCenteredClipping(f=1, tau=1.0)(inp(rows, senders=[4, 0, 1, 2], node=4), G)
    assert close(out, [(0 + 1 + 0 + 0) / 4, (0 + 0 + 1 - 1) / 4]) and c == {"clipped": 2}
    # adaptive: tau = the (f+1)-th largest neighbour distance = 2
    out, c = SelfCenteredClipping(f=1)(inp(rows, senders=[4, 0, 1, 2], node=4), G)
    assert close(out, [1 / 4, (2 - 2) / 4]) and c == {"clipped": 1}


def test_mean_is_the_weighted_mean() -> None:
    out, _ = Mean()(inp([[1.0], [4.0]], weights=[3, 1]), G)
    assert close(out, [7 / 4])


# --------------------------------------------------------------------------- breakdown points


def _attacked(n: int, bad: int, d: int = 4, scale: float = 1e3) -> AggregationInput:
    """n - bad honest rows near 1 (spread 0.1), ``bad`` rows at -scale."""
    g = torch.Generator().manual_seed(0)
    honest = 1.0 + 0.1 * torch.randn(n - bad, d, generator=g)
    rows = torch.cat([honest, torch.full((bad, d), -scale)])
    return AggregationInput(updates=rows, weights=torch.ones(n), senders=tuple(range(n)), node=-1, round=1,
                            reference=torch.zeros(d))


@pytest.mark.parametrize("make,n,f", [
    (lambda f: Median(f=f), 5, 2), (lambda f: TrimmedMean(f=f), 5, 2), (lambda f: GeoMed(iterations=50), 5, 2),
])
def test_breakdown_point(make, n: int, f: int) -> None:
    """f attackers tolerated (the aggregate stays among the honest values), f + 1 not."""
    rule = make(f)
    ok, _ = rule(_attacked(n, f), G)
    assert float(ok.min()) > 0.5 and float(ok.max()) < 1.5, ok
    broken, _ = rule(_attacked(n, f + 1), G)
    assert float(broken.min()) < -1.0, broken


def _spread(n: int, bad: int, at: float = -20.0) -> AggregationInput:
    """Honest updates spread out (0, 10, 20, ...), attackers agreeing on one value ``at``
    just outside: the case that makes a distance-based selection pick the attackers' cluster."""
    rows = [[10.0 * i] for i in range(n - bad)] + [[at]] * bad
    return inp(rows)


@pytest.mark.parametrize("rule,n", [(Krum(f=2), 7), (MultiKrum(f=2), 7)])
def test_krum_breakdown(rule, n: int) -> None:
    """n = 2f + 3: f clustered attackers leave the result inside the honest hull, f + 1 win
    the selection (their cluster's n - f - 2 nearest are themselves)."""
    ok, _ = rule(_spread(n, 2), G)
    assert 0.0 <= float(ok) <= 10.0 * (n - 3)
    broken, _ = rule(_spread(n, 3), G)
    assert float(broken) < 0.0


def test_bulyan_breakdown() -> None:
    """n = 4f + 3 = 11: f attackers tolerated. Bulyan's coordinate stage takes the values
    nearest the median of its theta = n - 2f selected updates, so in one dimension the result
    stays inside the honest hull while the attackers are a minority of the selection (up to
    f + 1 here); f + 2 clustered attackers are its majority and move the result outside."""
    rule = Bulyan(f=2)
    for bad in (2, 3):
        ok, _ = rule(_spread(11, bad), G)
        assert 0.0 <= float(ok) <= 10.0 * (11 - bad - 1)
    broken, _ = rule(_spread(11, 4, at=-5.0), G)
    assert float(broken) < 0.0


def test_centered_clipping_breakdown() -> None:
    """With tau fixed, each attacker moves the result by at most tau / n per iteration: f = 1
    attacker of 5 stays within the honest range's neighbourhood, a majority does not."""
    rule = CenteredClipping(tau=1.0, iterations=5)
    ok, _ = rule(_attacked(5, 1), G)
    assert float(ok.min()) > 0.4
    broken, _ = rule(_attacked(5, 3), G)
    assert float(broken.max()) < 0.0


def test_bridge_breakdown() -> None:
    """A node with 3 neighbours tolerates f = 1 far neighbour, not 2."""
    def case(bad: int) -> AggregationInput:
        rows = [[0.0]] + [[0.1]] * (3 - bad) + [[-1e3]] * bad
        return inp(rows, senders=[9, 0, 1, 2], node=9)
    ok, _ = Bridge(f=1)(case(1), G)
    assert abs(float(ok)) < 0.2
    broken, _ = Bridge(f=1)(case(2), G)
    assert float(broken) < -100


def test_self_clipping_bounds_each_neighbour() -> None:
    """Whatever the attackers send, each moves the node by at most W_ij tau."""
    rows = [[0.0], [0.1], [0.1], [-1e6]]
    out, _ = SelfCenteredClipping(f=1, tau=0.5)(inp(rows, senders=[3, 0, 1, 2], node=3), G)
    assert abs(float(out)) <= 0.5 / 4 + 1e-6


# --------------------------------------------------------------------------- config and refusals


def test_config_validates_rule_and_params() -> None:
    assert build_rule(AggregationConfig()) is None
    r = build_rule(AggregationConfig(rule="krum", f=2))
    assert isinstance(r, Krum) and r.f == 2 and r.min_inputs() == 7
    for bad, says in [({"rule": "nope"}, "unknown rule"), ({"rule": "median", "tau": 1.0}, "tau"),
                      ({"rule": "krum", "f": -1}, "f"), ({"f": 1}, "without a rule")]:
        with pytest.raises(ConfigError, match=says):
            validate({"aggregation": bad})


def test_refuses_an_algorithm_without_the_hook(tmp_path: Path) -> None:
    from lowband.engine.simulator import Simulation

    cfg = digits_config(tmp_path, "fedcspack", rounds=1)
    cfg["aggregation"] = {"rule": "median", "f": 1}
    with pytest.raises(ConfigError, match="fedcspack aggregates individual updates"):
        Simulation(validate(cfg))


def test_refuses_too_few_participants(tmp_path: Path) -> None:
    from lowband.aggregation.install import check
    from lowband.engine.simulator import Simulation

    cfg = digits_config(tmp_path, "fedavg", rounds=1)  # 4 clients per round
    cfg["aggregation"] = {"rule": "bulyan", "f": 1}  # needs 7
    exp = validate(cfg)
    sim = Simulation(exp)
    with pytest.raises(ConfigError, match="bulyan needs at least 7 inputs"):
        check(exp, sim.alg, sim.topology.plan(0))
    cfg = digits_config(tmp_path / "p", "dfedavg", rounds=1)  # k = 3 neighbours
    cfg["aggregation"] = {"rule": "bridge", "f": 2}
    exp = validate(cfg)
    sim = Simulation(exp)
    with pytest.raises(ConfigError, match="at least 5 neighbours"):
        check(exp, sim.alg, sim.topology.plan(0))


def test_hook_capability_of_the_algorithms() -> None:
    from lowband.algorithms import ALGORITHMS

    hooked = {n for n, c in ALGORITHMS.items() if c.aggregation_hook}
    assert {"fedavg", "fedprox", "scaffold", "dfedavg", "dfedavgm", "dpsgd", "dfedsam", "oneshot_fedavg"} <= hooked
    assert not hooked & {"fedcspack", "kta", "fol", "fedmd", "dispfl", "fednova", "fedspu", "fedpac", "fedas",
                         "feddbe"}


# --------------------------------------------------------------------------- the hook


def test_hook_without_rule_is_the_plain_average_and_with_rule_centres_on_the_reference() -> None:
    ref = {"w": torch.tensor([1.0, 1.0]), "n": torch.tensor(3)}
    models = [{"w": torch.tensor([2.0, 1.0]), "n": torch.tensor(4)}, {"w": torch.tensor([1.0, 3.0]), "n": torch.tensor(5)},
              {"w": torch.tensor([9.0, 9.0]), "n": torch.tensor(5)}]
    plain = aggregate_models(None, models, [1, 2, 3], ref, senders=[0, 1, 2], node=-1, round=1,
                             rng=lambda: G, plain=lambda: weighted_average(models, [1, 2, 3]))
    assert all(torch.equal(plain[k], weighted_average(models, [1, 2, 3])[k]) for k in ref)
    COLLECTOR.drain()
    out = aggregate_models(Median(f=1), models, [1, 2, 3], ref, senders=[0, 1, 2], node=-1, round=4,
                           rng=lambda: G, plain=lambda: {})
    assert torch.equal(out["w"], torch.tensor([2.0, 3.0])) and int(out["n"]) == 5  # ints: the max
    assert drain_place() == {4: {"robust/median/outliers": 1.0}}  # the third model, trimmed everywhere
    out = aggregate_models(Bulyan(f=1), models, [1, 2, 3], ref, senders=[0, 1, 2], node=-1, round=5,
                           rng=lambda: G, plain=lambda: {})
    assert torch.equal(out["w"], ref["w"])  # too few inputs: skipped, the model stays
    assert drain_place() == {5: {"robust/bulyan/skipped": 1.0}}


def test_a_rule_defends_fedavg_against_a_scaled_client(tmp_path: Path) -> None:
    """End to end: a rule installed on a run changes the aggregation (it is not silently
    ignored) and its counters reach metrics.jsonl (the driver's Robustness observer)."""
    from lowband.aggregation.install import check, install
    from lowband.engine.simulator import Simulation

    accs = {}
    for rule in (None, {"rule": "median", "f": 1}):
        cfg = digits_config(tmp_path / str(rule is None), "fedavg", rounds=2)
        if rule:
            cfg["aggregation"] = rule
        exp = validate(cfg)
        sim = Simulation(exp)
        check(exp, sim.alg, sim.topology.plan(0))
        install(exp, sim.alg)
        res = sim.run()
        accs[rule is None] = res.metrics[-1]["global/acc"]
        counted = {k for rec in res.metrics for k in rec if k.startswith("robust/")}
        assert (rule is None) == (not counted)
        if rule:
            assert counted and all(k.startswith("robust/median/") for k in counted)
    assert accs[True] != accs[False]
