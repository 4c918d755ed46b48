"""NTK-DFL's math and its fast paths against naive materialised implementations.

- the closed-form MLP trace kernel (biases and the 1/C factor included) and the
  torch.func fallback equal (1/C) sum_c J_c J_c^T from the full Jacobian;
- J^T R by a backward pass equals the materialised contraction;
- fixed-step RK4 matches scipy's dopri5 at tight tolerance on a real kernel;
- a whole simulated NTK-DFL round (declared Jacobians, stand-ins, RK4, tau selection)
  gives the weights a naive implementation with materialised Jacobians computes.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from lowband.algorithms.decentralised import ntk
from lowband.config import validate
from lowband.engine.simulator import Simulation
from lowband.models import build_model


def _mlp(hidden: int = 7, classes: int = 4, seed: int = 0, deep: bool = False) -> torch.nn.Module:
    torch.manual_seed(seed)
    m = build_model("mlp", num_classes=classes, input_shape=(1, 5, 5), hidden=[hidden, 5] if deep else hidden)
    for p in m.parameters():  # non-zero biases, so that the bias terms of the kernel matter
        torch.nn.init.normal_(p, std=0.5)
    return m.eval()


def _params(m: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in m.named_parameters()}


def _full_jacobian(m: torch.nn.Module, params: dict, x: torch.Tensor) -> torch.Tensor:
    """Independent naive Jacobian: autograd row by row, N x C x d."""
    names = list(params)
    rows = []
    for n in range(x.shape[0]):
        def f(*ps):
            return torch.func.functional_call(m, dict(zip(names, ps)), (x[n:n + 1],))[0]
        jac = torch.autograd.functional.jacobian(f, tuple(params[k] for k in names))
        rows.append(torch.cat([j.reshape(j.shape[0], -1) for j in jac], 1))
    return torch.stack(rows)


def test_closed_form_kernel_equals_materialised() -> None:
    m = _mlp()
    p = _params(m)
    x = torch.randn(11, 1, 5, 5)
    j = _full_jacobian(m, p, x)
    naive = torch.einsum("ncd,mcd->nm", j, j) / j.shape[1]
    torch.testing.assert_close(ntk.trace_kernel_mlp(p, x), naive, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(ntk.trace_kernel(m, p, x), naive, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(ntk.trace_kernel_generic(m, p, x, chunk=4), naive, rtol=1e-5, atol=1e-4)
    # without the recomputation cache, too
    torch.testing.assert_close(ntk.trace_kernel_generic(m, p, x, chunk=4, max_cache_bytes=0), naive,
                               rtol=1e-5, atol=1e-4)


def test_gram_by_strips_is_the_product_and_symmetric() -> None:
    """``gram`` (one GEMM per strip of rows, from its diagonal block on, mirrored) is
    ``a @ a.T`` to float rounding, exactly symmetric, for any number of strips; small
    inputs take the plain product."""
    g = torch.Generator().manual_seed(0)
    a = torch.randn(601, 300, generator=g)
    ref = a.double() @ a.double().t()
    for blocks in (1, 2, 5, 7):
        k = ntk.gram(a, blocks)
        assert torch.equal(k, k.t())
        torch.testing.assert_close(k.double(), ref, rtol=1e-5, atol=1e-3)
    small = a[:100]
    assert torch.equal(ntk.gram(small), small @ small.t())
    jt = torch.randn(300, 4, 50, generator=g)
    torch.testing.assert_close(ntk.projected_kernel(jt), torch.einsum("nck,mck->nm", jt, jt) / 4, rtol=1e-5, atol=1e-4)


def test_generic_kernel_on_a_deeper_model() -> None:
    m = _mlp(deep=True)
    p = _params(m)
    x = torch.randn(9, 1, 5, 5)
    assert not ntk.is_plain_mlp(m)
    j = _full_jacobian(m, p, x)
    torch.testing.assert_close(ntk.trace_kernel(m, p, x), torch.einsum("ncd,mcd->nm", j, j) / j.shape[1],
                               rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("deep", [False, True])
def test_jt_r_is_one_backward_pass(deep: bool) -> None:
    m = _mlp(deep=deep)
    p = _params(m)
    x = torch.randn(13, 1, 5, 5)
    r = torch.randn(13, 4)
    g = ntk.jt_r(m, p, x, r)
    flat = torch.cat([g[k].reshape(-1) for k in p])
    torch.testing.assert_close(flat, ntk.jt_r_naive(_full_jacobian(m, p, x), r), rtol=1e-5, atol=1e-5)
    v = {k: torch.randn_like(t) for k, t in p.items()}
    jv = torch.einsum("ncd,d->nc", _full_jacobian(m, p, x), torch.cat([v[k].reshape(-1) for k in p]))
    torch.testing.assert_close(ntk.j_v(m, p, x, v), jv, rtol=1e-5, atol=1e-5)


def test_rk4_matches_dopri5_on_a_real_kernel() -> None:
    from sklearn.datasets import load_digits

    d = load_digits()
    x = torch.tensor(d.data[:300], dtype=torch.float32).view(-1, 1, 8, 8) / 8.0 - 1.0
    y = torch.nn.functional.one_hot(torch.tensor(d.target[:300]), 10).float()
    torch.manual_seed(0)
    m = build_model("mlp", num_classes=10, input_shape=(1, 8, 8), hidden=32).eval()
    p = _params(m)
    k = ntk.trace_kernel(m, p, x)
    f0 = ntk.logits(m, p, x)
    lr = 0.05
    lam = ntk.power_lambda_max(k) / 300
    assert lr * lam / 2 > 0.3  # a stiff enough problem for the check to mean something
    ref = ntk.evolve_ce_reference(k, f0, y, lr, 60)
    fast = ntk.evolve_ce(k, f0, y, lr, 60)
    assert float((fast - ref).abs().max() / ref.abs().max()) < 1e-4
    r_fast, r_ref = ntk.residuals(fast, y, [60])[60], ntk.residuals(ref, y, [60])[60]
    assert float((r_fast - r_ref).abs().max() / r_ref.abs().max()) < 1e-4


def test_residuals_match_the_reference_code() -> None:
    fs = torch.randn(6, 4, 3)
    y = torch.nn.functional.one_hot(torch.tensor([0, 2, 1, 1]), 3).float()
    r = ntk.residuals(fs, y, [1, 5])
    torch.testing.assert_close(r[1], torch.softmax(fs[0], 1) - y)
    torch.testing.assert_close(r[5], torch.softmax(fs[:5], 2).sum(0) - 5 * y)


# --------------------------------------------------------------------------- a whole round


def _cfg(tmp: Path, alg: str, rounds: int, **hp) -> dict:
    return {
        "name": f"n-{alg}", "seed": 3, "rounds": rounds, "out_dir": str(tmp / f"{alg}-{rounds}"), "threads": 1,
        "data": {"dataset": "digits", "num_clients": 6, "partition": "iid", "split": [0.25, 0.0, 0.75]},
        "model": {"name": "mlp", "hidden": 8},
        "algorithm": {"name": alg, **hp},
        "topology": {"kind": "kregular", "k": 2},
        "eval": {"protocols": ["consensus"]},
        "checkpoint_every": 0,
    }


def naive_round(states: dict, sim: Simulation, r: int, hp, *, projected: bool = False,
                p_dense: torch.Tensor | None = None, w0: dict | None = None, full_update: bool = False,
                sequential: bool = False) -> dict:
    """One NTK-DFL / SPARK round from materialised Jacobians (no fast path anywhere).

    ``full_update`` (SPARK's ``update = "full"``): the kernel from ``J P``, the update from
    the full ``J``, weights (not coordinates) averaged. ``sequential``: Gauss-Seidel, as the
    reference code's loop: nodes in id order, each one's new state written back at once, so
    later nodes average (and distil from) the already updated neighbours."""
    states = dict(states)
    coords = projected and not full_update
    plan = sim.topology.plan(r - 1)
    model = sim.executor.model_for(0).eval()
    names = list(dict(model.named_parameters()))
    c = sim.fed.num_classes
    lr = hp.lr * math.exp(-hp.lr_decay * (r - 1))
    out = {}

    def flat(p):
        return torch.cat([p[k].reshape(-1) for k in names])

    def unflat(v, like):
        o, i = {}, 0
        for k in names:
            o[k] = v[i:i + like[k].numel()].view_as(like[k])
            i += like[k].numel()
        return o

    for i in sorted(plan.participants):
        mem = [i] + sorted(plan.neighbors[i])
        if coords:
            tbar = torch.stack([states[j]["theta"] for j in mem]).mean(0)
            wbar = unflat(flat(w0) + p_dense @ tbar, w0)
        else:
            wbar = unflat(torch.stack([flat(states[j]["params"]) for j in mem]).mean(0), states[i]["params"])
        xs = torch.cat([sim.fed.nodes[j].train_x for j in mem])
        yh = torch.nn.functional.one_hot(torch.cat([sim.fed.nodes[j].train_y for j in mem]), c).float()
        n = xs.shape[0]
        jac = _full_jacobian(model, wbar, xs)
        full_jac = jac
        if projected:
            jac = jac @ p_dense
        kern = torch.einsum("ncd,mcd->nm", jac, jac) / c
        if full_update:
            jac = full_jac
        with torch.no_grad():
            f0 = torch.func.functional_call(model, wbar, (xs,))
        yt = yh
        if hp.distill:
            with torch.no_grad():
                z = torch.cat([torch.func.functional_call(model, states[j]["params"], (sim.fed.nodes[j].train_x,))
                               for j in mem])
            a, t = ntk.distill_schedule(r, hp.distill_warmup, hp.distill_rounds, hp.alpha_init, hp.alpha_final,
                                        hp.temp_init, hp.temp_final)
            yt = a * yh + (1 - a) * torch.softmax(z / t, 1)
        fs = ntk.evolve_ce_reference(kern, f0, yt, lr, max(hp.taus))
        best = None
        for tau in hp.taus:
            res = torch.softmax(fs[:tau], 2).sum(0) - tau * yt
            delta = -(lr / n) * torch.einsum("ncd,nc->d", jac, res)
            if hp.tau_select == "evolved":
                loss = ntk.cross_entropy_soft(fs[tau], yh)
            elif hp.tau_select == "linear":
                loss = ntk.cross_entropy_soft(f0 + torch.einsum("ncd,d->nc", jac, delta), yh)
            else:
                cand = unflat(flat(wbar) + delta, wbar)
                with torch.no_grad():
                    loss = ntk.cross_entropy_soft(torch.func.functional_call(model, cand, (xs,)), yh)
            if best is None or loss < best[0]:
                best = (loss, delta)
        delta = best[1]
        mu = hp.momentum
        st = {}
        if mu > 0:
            v_old = states[i]["v"] if coords else flat(states[i]["v"])
            v = mu * v_old + delta
            step = mu * v + delta
            st["v"] = v
        else:
            step = delta
        if coords:
            st["theta"] = tbar + step
            st["params"] = unflat(flat(w0) + p_dense @ st["theta"], w0)
        else:
            st["params"] = unflat(flat(wbar) + step, wbar)
            if "v" in st:
                st["v"] = unflat(st["v"], wbar)
        out[i] = st
        if sequential:
            states[i] = {**states[i], **st}
    return out


@pytest.mark.parametrize("hp", [
    {"taus": [3, 8], "tau_select": "true", "lr": 0.05},
    {"taus": [2, 6], "tau_select": "linear", "lr": 0.05, "momentum": 0.5, "distill": True, "distill_warmup": 0,
     "distill_rounds": 4, "sample_fraction": 1.0},
])
def test_ntk_dfl_round_equals_naive_materialised(tmp_path: Path, hp: dict) -> None:
    one = Simulation(validate(_cfg(tmp_path, "ntk_dfl", 1, **hp)))
    one.run()
    two = Simulation(validate(_cfg(tmp_path, "ntk_dfl", 2, **hp)))
    two.run()
    expect = naive_round(one.executor.states, one, 2, two.alg.hp)
    for i, st in expect.items():
        got = two.executor.states[i]
        for k, v in st["params"].items():
            torch.testing.assert_close(got["params"][k], v, rtol=2e-4, atol=2e-5)
    # the ledger: every directed edge carried weights, a request, logits and a declared Jacobian
    byk = two.ledger.by_kind(round=2)
    edges = sum(len(v) for v in two.topology.plan(1).neighbors.values())
    assert {k: byk[k]["messages"] for k in byk} == {"weights": edges, "request": edges, "logits": edges,
                                                    "jacobian": edges}
    d = sum(p.numel() for p in two.executor.model_for(0).parameters())
    n_rows = sum(two.fed.nodes[j].n_train * len(two.topology.plan(1).neighbors[j]) for j in range(6))
    assert byk["jacobian"]["declared"] == n_rows * 10 * d * 4
    assert byk["jacobian"]["encoded"] < 200 * edges  # headers only: the stand-in X is not counted


def test_sequential_order_is_gauss_seidel(tmp_path: Path) -> None:
    """``order = "sequential"`` equals a hand-written Gauss-Seidel round (nodes in id order,
    each averaging, and distilling from, its neighbours' current weights), differs from the
    synchronous round, and sends exactly the synchronous round's messages and bytes."""
    hp = {"taus": [2, 6], "tau_select": "linear", "lr": 0.05, "momentum": 0.5, "distill": True,
          "distill_warmup": 0, "distill_rounds": 4}
    seq = {**hp, "order": "sequential"}
    one = Simulation(validate(_cfg(tmp_path, "ntk_dfl", 1, **seq)))
    one.run()
    two = Simulation(validate(_cfg(tmp_path, "ntk_dfl", 2, **seq)))
    two.run()
    expect = naive_round(one.executor.states, one, 2, two.alg.hp, sequential=True)
    jacobi = naive_round(one.executor.states, one, 2, two.alg.hp)
    gap = 0.0
    for i, st in expect.items():
        got = two.executor.states[i]
        for k, v in st["params"].items():
            torch.testing.assert_close(got["params"][k], v, rtol=2e-4, atol=2e-5)
            gap = max(gap, float((jacobi[i]["params"][k] - v).abs().max()))
    assert gap > 1e-2  # the order matters: a synchronous round lands elsewhere
    sync_cfg = _cfg(tmp_path, "ntk_dfl", 2, **hp)
    sync_cfg["out_dir"] += "-sync"
    sync = Simulation(validate(sync_cfg))
    sync.run()
    assert two.ledger.by_kind(round=2) == sync.ledger.by_kind(round=2)
    assert two.ledger.by_kind(round=1) == sync.ledger.by_kind(round=1)


def test_sequential_order_refuses_reply_groups() -> None:
    from lowband.config import ConfigError

    cfg = _cfg(Path("/tmp"), "ntk_dfl", 1, order="sequential", reply_groups=2)
    with pytest.raises((ConfigError, ValueError), match="reply_groups"):
        Simulation(validate(cfg))
