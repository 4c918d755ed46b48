"""Vectorised cohorts (lowband.engine.cohort): equal to the per-node path within float
tolerance, a node's result independent of its cohort, the rule, and the engine option."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from conftest import digits_config
from lowband.config import ConfigError, validate
from lowband.engine import cohort
from lowband.train import cohort as tcohort
from lowband.train.cohort import SGDJob, train_cohort, unsupported
from lowband.engine.simulator import Simulation
from lowband.models import build_model
from lowband.seeding import torch_gen

torch.set_num_threads(1)


def _mlp() -> nn.Module:
    return build_model("mlp", num_classes=10, input_shape=(1, 8, 8), hidden=16, seed=0)


def _job(model: nn.Module, node: int, n: int, **kw) -> SGDJob:
    g = torch_gen(7, "data", node)  # the start: a fresh model's init (``model`` itself is trained in place)
    init = build_model("mlp", num_classes=10, input_shape=(1, 8, 8), hidden=16, seed=0).state_dict()
    params = {k: v.detach() + 0.01 * torch.randn(v.shape, generator=g) for k, v in init.items()}
    args = dict(epochs=2, batch_size=5, lr=0.1)
    args.update(kw)
    return SGDJob(params=params, x=torch.randn(n, 1, 8, 8, generator=g), y=torch.randint(0, 10, (n,), generator=g),
                  gen=torch_gen(3, "alg", 1, node, "local"), **args)


def _close(a: dict, b: dict, tol: float = 1e-5) -> bool:
    return list(a) == list(b) and all(torch.allclose(a[k], b[k], atol=tol, rtol=0) for k in a)


SETTINGS = [dict(), dict(momentum=0.9, weight_decay=1e-3), dict(momentum=0.9, nesterov=True, grad_clip=0.3),
            dict(drop_last=True, max_steps=5)]


def _seq() -> nn.Module:
    """The same layers as _mlp() in an nn.Sequential: the vmap path (not hand-written)."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, 10))


def _seq_job(model: nn.Module, node: int, n: int, **kw) -> SGDJob:
    job = _job(model, node, n, **kw)
    names = [k for k, _ in model.named_parameters()]
    job.params = dict(zip(names, job.params.values()))  # fc1.*, head.* -> 1.*, 3.*
    return job


@pytest.mark.parametrize("path", ["mlp", "vmap"])
@pytest.mark.parametrize("kw", SETTINGS, ids=["plain", "momentum-wd", "nesterov-clip", "droplast-maxsteps"])
def test_cohort_equals_per_node_sgd(kw: dict, path: str, monkeypatch) -> None:
    """Unequal data sizes (unequal step counts and last batches: 13 = 5+5+3, 3 < batch),
    unequal epochs, an empty node: each node's parameters and stats are sgd_train's, on
    the hand-written MLP step (lowband's MLP) and on the vmap step (any other model)."""
    model, job = (_mlp(), _job) if path == "mlp" else (_seq(), _seq_job)
    used: list[str] = []
    for name in ("_train_mlp", "_train_vmap"):
        spy = (lambda f, n: lambda *a: used.append(n) or f(*a))(getattr(tcohort, name), name)
        monkeypatch.setattr(tcohort, name, spy)
    specs = [(0, 13, {}), (1, 20, {}), (2, 3, {}), (3, 0, {}), (4, 11, {"epochs": 3}), (5, 7, {"epochs": 0})]
    ref = [job(model, i, n, **{**kw, **e}).run(model) for i, n, e in specs]
    got = train_cohort(model, [job(model, i, n, **{**kw, **e}) for i, n, e in specs])
    assert used == [f"_train_{path}"]  # the path under test ran (and only it)
    for (p_ref, s_ref), (p, s) in zip(ref, got):
        assert _close(p, p_ref), (kw, s_ref)
        assert (s.steps, s.samples) == (s_ref.steps, s_ref.samples)
        assert (math.isnan(s.loss) and math.isnan(s_ref.loss)) or abs(s.loss - s_ref.loss) < 1e-5
    # the check has teeth: training moved the parameters well beyond the tolerance
    moved = max(float((got[0][0][k] - job(model, 0, 13).params[k]).abs().max()) for k in got[0][0])
    assert moved > 1e-2


def test_a_nodes_result_does_not_depend_on_its_cohort() -> None:
    """Bit for bit: alone, with others, at another position (design rule 4: no dependence
    on processing order or on how a backend groups nodes)."""
    model = _mlp()
    alone = train_cohort(model, [_job(model, 2, 17)])[0][0]
    for others in ([0, 1], [5, 4, 3, 6, 7, 8, 9]):
        jobs = [_job(model, i, 9 + i) for i in others] + [_job(model, 2, 17)]
        mixed = train_cohort(model, jobs)[-1][0]
        assert all(torch.equal(alone[k], mixed[k]) for k in alone)


@pytest.mark.parametrize("arch", ["mlp", "cnn"])
def test_a_nodes_result_does_not_depend_on_its_cohort_on_several_threads(arch: str) -> None:
    """With two torch threads (a config without ``threads``, a pool worker's share of the
    cores), BLAS and oneDNN would split a cohort's batched kernels among the threads by the
    number of nodes stacked; the cohort trains on one thread, so a node's update is still a
    function of its own job only (what lets a Flower client, training its node alone, and a
    two-worker pool give the serial run's bytes)."""
    make = (lambda i, n: _job(_mlp(), i, n, batch_size=25)) if arch == "mlp" else (lambda i, n: _cnn_job(i, n, batch_size=32))
    model = _mlp() if arch == "mlp" else build_model("cnn_fmnist", num_classes=10, input_shape=(1, 28, 28), seed=0)
    sizes = {0: 13, 1: 30, 2: 1, 3: 45, 4: 17, 5: 60, 6: 7}

    def train(nodes: list[int]) -> dict:
        gens = [torch.Generator().manual_seed(n) for n in nodes]
        return train_cohort(model, [make(i, sizes[i]) for i in nodes], gens)[-1][0]

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        for target in (3, 5):
            alone = train([target])
            for others in ([0, 6], [1, 2, 4], [6, 4, 2, 1, 0]):
                mixed = train([o for o in others if o != target] + [target])
                assert all(torch.equal(alone[k], mixed[k]) for k in alone), (target, others)
        assert torch.get_num_threads() == 2  # the caller's setting is restored
    finally:
        torch.set_num_threads(before)


def test_a_diverging_node_stays_in_its_lane() -> None:
    model = _mlp()
    bad = _job(model, 1, 10)
    bad.x[0, 0, 0, 0] = float("nan")
    res = train_cohort(model, [_job(model, 0, 10), bad])
    assert math.isnan(res[1][1].loss) and math.isfinite(res[0][1].loss)
    alone = train_cohort(model, [_job(model, 0, 10)])[0][0]
    assert all(torch.equal(alone[k], res[0][0][k]) for k in alone)


def test_the_rule() -> None:
    mlp, cnn = _mlp(), build_model("cnn_fmnist", num_classes=10, input_shape=(1, 28, 28), seed=0)
    simple = build_model("simplecnn", num_classes=10, input_shape=(3, 32, 32), seed=0)
    job = _job(mlp, 0, 10)
    assert unsupported(mlp, job, "auto") is None and unsupported(mlp, job, "on") is None
    assert unsupported(mlp, job, "off") is not None
    cjob = _cnn_job(0, 10)
    assert unsupported(cnn, cjob, "auto") is None  # the FMNIST CNN: its hand-written step (measured to pay)
    cuda_like = SGDJob(**{**cjob.__dict__, "x": torch.empty(0, 1, 28, 28, device="meta")})
    assert "CPU" in unsupported(cnn, cuda_like, "auto")  # elsewhere its dropout masks cannot be reproduced
    assert "Linear" in unsupported(simple, job, "auto")  # other convolutional models: measured not to pay
    prox = _job(mlp, 0, 10, loss_fn=lambda m, x, y: F.cross_entropy(m(x), y))
    assert "loss" in unsupported(mlp, prox, "on")  # FedProx, FedNTD, MOON: per-node path
    bn = nn.Sequential(nn.Flatten(), nn.Linear(64, 8), nn.BatchNorm1d(8), nn.Linear(8, 10))
    assert "buffers" in unsupported(bn, job, "on")
    assert cohort.cohort_size(mlp, torch.device("cpu")) >= 8


def _run(tmp_path: Path, alg: str, mode: str, monkeypatch, **over) -> tuple[Simulation, int]:
    calls = [0]
    orig = cohort.train_cohort

    def counting(model, jobs, *rest):
        calls[0] += len(jobs)
        return orig(model, jobs, *rest)

    monkeypatch.setattr(cohort, "train_cohort", counting)
    c = digits_config(tmp_path / f"{alg}-{mode}", alg, rounds=2, **over)
    c["engine"] = {"vectorize": mode}
    if alg == "local":
        c["topology"] = {"kind": "star", "sampling": "all"}
    sim = Simulation(validate(c))
    sim.result = sim.run()
    return sim, calls[0]


@pytest.mark.parametrize("alg", ["dfedavg", "fedavg", "local"])
def test_run_with_cohorts_equals_the_per_node_run(tmp_path: Path, monkeypatch, alg: str) -> None:
    off, n_off = _run(tmp_path, alg, "off", monkeypatch)
    auto, n_auto = _run(tmp_path, alg, "auto", monkeypatch)
    assert n_off == 0 and n_auto == {"dfedavg": 16, "fedavg": 8, "local": 16}[alg]  # every local SGD vectorised
    for node, st in off.executor.states.items():
        if "params" in st:
            assert _close(st["params"], auto.executor.states[node]["params"], 1e-5), node
    for a, b in zip(off.result.metrics, auto.result.metrics):
        assert a.keys() == b.keys() and a["round"] == b["round"]
        for k, v in a.items():
            if k.startswith("bytes/") or k.startswith("declared/"):
                assert v == b[k], k  # the same messages, the same bytes
            elif isinstance(v, float):
                assert abs(v - b[k]) < 1e-4, k


def test_fedprox_keeps_the_per_node_path(tmp_path: Path, monkeypatch) -> None:
    _, calls = _run(tmp_path, "fedprox", "on", monkeypatch)
    assert calls == 0


def test_engine_option() -> None:
    assert validate({}).engine.vectorize == "auto"
    with pytest.raises(ConfigError, match="vectorize"):
        validate({"engine": {"vectorize": "yes"}})


def test_a_diverging_node_is_reported_as_on_the_per_node_path(tmp_path: Path, monkeypatch) -> None:
    from lowband.algorithms.decentralised import gossip

    orig = gossip.local_job

    def local_job(ctx, params, *args, **kw):
        job = orig(ctx, params, *args, **kw)
        if ctx.node == 3:  # a NaN input: NaN loss, NaN weights (default loss: still vectorised)
            job.x = job.x.clone()
            job.x[0] = float("nan")
        return job

    monkeypatch.setattr(gossip, "local_job", local_job)
    runs = {mode: _run(tmp_path, "dfedavg", mode, monkeypatch) for mode in ("off", "auto")}
    assert runs["off"][1] == 0 and runs["auto"][1] == 16
    per = {mode: [r.get("faults/diverged", 0) for r in sim.result.metrics] for mode, (sim, _) in runs.items()}
    assert per["off"] == per["auto"] == [0, 1, 1]
    assert math.isnan(runs["auto"][0].executor.states[3]["loss"])


# -- the FMNIST CNN's hand-written cohort step (lowband.engine.cohort_cnn) -------------------------
def _cnn_init() -> dict:
    return build_model("cnn_fmnist", num_classes=10, input_shape=(1, 28, 28), seed=0).state_dict()


def _cnn_job(node: int, n: int, **kw) -> SGDJob:
    g = torch_gen(7, "data", node)
    params = {k: v.detach() + 0.01 * torch.randn(v.shape, generator=g) for k, v in _cnn_init().items()}
    args = dict(epochs=2, batch_size=16, lr=0.05)
    args.update(kw)
    return SGDJob(params=params, x=torch.randn(n, 1, 28, 28, generator=g), y=torch.randint(0, 10, (n,), generator=g),
                  gen=torch_gen(3, "alg", 1, node, "local"), **args)


@pytest.mark.parametrize("kw", SETTINGS, ids=["plain", "momentum-wd", "nesterov-clip", "droplast-maxsteps"])
def test_cnn_cohort_equals_per_node_sgd(kw: dict) -> None:
    """Unequal sizes (unequal step counts, last batches), unequal epochs, an empty node:
    each node's parameters and stats are sgd_train's within float tolerance, and its dropout
    generator ends where the per-node path leaves the global RNG (the same masks drawn)."""
    model = build_model("cnn_fmnist", num_classes=10, input_shape=(1, 28, 28), seed=0)
    specs = [(0, 37, {}), (1, 50, {}), (2, 5, {}), (3, 0, {}), (4, 20, {"epochs": 3})]
    ref, after = [], []
    for i, n, e in specs:
        torch.manual_seed(1000 + i)
        ref.append(_cnn_job(i, n, **{**kw, **e}).run(model))
        after.append(torch.get_rng_state())
    gens = [torch.Generator().manual_seed(1000 + i) for i, _, _ in specs]
    got = train_cohort(model, [_cnn_job(i, n, **{**kw, **e}) for i, n, e in specs], gens)
    for (p_ref, s_ref), (p, s), g, a in zip(ref, got, gens, after):
        assert _close(p, p_ref, 1e-5), kw
        assert all(v.is_contiguous() and not v.requires_grad for v in p.values())
        assert (s.steps, s.samples) == (s_ref.steps, s_ref.samples)
        assert (math.isnan(s.loss) and math.isnan(s_ref.loss)) or abs(s.loss - s_ref.loss) < 1e-5
        assert torch.equal(g.get_state(), a)
    moved = max(float((got[1][0][k] - _cnn_job(1, 50).params[k]).abs().max()) for k in got[1][0])
    assert moved > 1e-2  # the check has teeth


def test_cnn_cohort_result_does_not_depend_on_its_cohort() -> None:
    """Bit for bit: alone (beside a dummy), with one other, with five at other positions."""
    model = build_model("cnn_fmnist", num_classes=10, input_shape=(1, 28, 28), seed=0)
    alone = train_cohort(model, [_cnn_job(1, 50)], [torch.Generator().manual_seed(1)])[0][0]
    for others in ([0], [2, 4, 0, 5, 6]):
        gens = [torch.Generator().manual_seed(n) for n in [*others, 1]]
        mixed = train_cohort(model, [_cnn_job(i, 9 + 13 * i) for i in others] + [_cnn_job(1, 50)], gens)[-1][0]
        assert all(torch.equal(alone[k], mixed[k]) for k in alone)


def _cnn_config(root: Path, **top) -> dict:
    """FedAvg with the FMNIST CNN on 16x16 random images (an npz user dataset): 6 clients."""
    import numpy as np

    g = np.random.default_rng(0)
    np.savez(root / "img.npz", x=g.standard_normal((240, 1, 16, 16)).astype(np.float32),
             y=g.integers(0, 4, 240).astype(np.int64))
    return {"name": "cnn", "seed": 2, "rounds": 2, "threads": 1, "out_dir": str(root / "run"),
            "data": {"dataset": "npz", "path": str(root / "img.npz"), "num_clients": 6, "partition": "dirichlet",
                     "alpha": 0.5, "split": [0.75, 0.0, 0.25]},
            "model": {"name": "cnn_fmnist"},
            "algorithm": {"name": "fedavg", "local_epochs": 2, "batch_size": 8, "lr": 0.05},
            "topology": {"kind": "star", "sampling": "count", "count": 4}, **top}


def test_cnn_run_with_cohorts(tmp_path: Path, monkeypatch) -> None:
    """FedAvg with the FMNIST CNN: "auto" trains in cohorts, within float tolerance of the
    per-node run, and a two-worker pool (its own cohorts, nodes visiting) gives the serial
    cohort run's bytes exactly."""
    runs = {}
    for name, engine in [("off", {"vectorize": "off", "workers": 1}), ("auto", {"vectorize": "auto", "workers": 1}),
                         ("pool", {"vectorize": "auto", "workers": 2})]:
        (tmp_path / name).mkdir()
        calls = [0]
        orig = cohort.train_cohort

        def counting(model, jobs, *rest, calls=calls, orig=orig):
            calls[0] += len(jobs)
            return orig(model, jobs, *rest)

        monkeypatch.setattr(cohort, "train_cohort", counting)
        sim = Simulation(validate(_cnn_config(tmp_path / name, engine=engine)))
        sim.result = sim.run()
        runs[name] = (sim, calls[0], (Path(sim.result.run_dir) / "metrics.jsonl").read_text())
        monkeypatch.setattr(cohort, "train_cohort", orig)
    off, auto, pool = runs["off"], runs["auto"], runs["pool"]
    assert off[1] == 0 and auto[1] == 8  # 4 clients x 2 rounds, all in cohorts
    assert pool[2] == auto[2]  # byte-identical across backends
    srv_off, srv_auto = off[0].executor.states[-1]["params"], auto[0].executor.states[-1]["params"]
    assert _close(srv_off, srv_auto, 1e-5)
    for a, b in zip(off[0].result.metrics, auto[0].result.metrics):
        for k, v in a.items():
            if k.startswith("bytes/"):
                assert v == b[k], k
            elif isinstance(v, float):
                assert abs(v - b[k]) < 1e-4, k


def test_local_sgd_step_marks_a_step_made_of_two_methods() -> None:
    """LocalSGDStep(prepare, finish): calling it runs finish(prepare().run()); the bound
    step is recognised as vectorisable; a subclass overriding ``finish`` keeps the mark
    (looked up by name), one overriding the step itself drops it."""
    from lowband.train import TrainStats
    from lowband.train.cohort import LocalSGDStep, vectorised

    model = _mlp()

    class Alg:
        def job(self, ctx, state, inbox) -> SGDJob:
            return _job(model, 0, 12)

        def reply(self, ctx, state, inbox, params, stats: TrainStats):
            return {"params": params, "steps": stats.steps}, "out"

        step = LocalSGDStep(job, reply)

    class Sub(Alg):
        def reply(self, ctx, state, inbox, params, stats):
            return {"sub": True}, "out"

    class Plain(Alg):
        def step(self, ctx, state, inbox):
            return {}, None

    ctx = type("Ctx", (), {"model": model})()
    state, out = Alg().step(ctx, {}, [])
    assert out == "out" and state["steps"] == 6  # 2 epochs of ceil(12 / 5) batches
    ref = _job(model, 0, 12).run(model)[0]
    assert all(torch.equal(state["params"][k], ref[k]) for k in ref)
    assert Alg.step.__name__ == "step" and vectorised(Alg().step) and not vectorised(Alg.step)
    assert vectorised(Sub().step) and Sub().step(ctx, {}, [])[0] == {"sub": True}
    assert not vectorised(Plain().step)


@pytest.mark.parametrize("batch", [1, 16])
def test_cnn_fc_leaf_layout_matches_gradients_and_bits(batch: int) -> None:
    """fc1/fc2 weights are trained in the layout baddbmm's backward gives their gradients
    (so the SGD add is not strided) where that leaves every product's bits as row-major
    weights give them; at batch 1 (other kernels) they stay row-major."""
    from lowband.train.cohort_cnn import _leaf

    with tcohort.one_thread():  # the cohort step's thread count, restored after
        gen = torch.Generator().manual_seed(0)
        for name, (o, i) in {"fc1.weight": (256, 320), "fc2.weight": (50, 256), "head.weight": (10, 50)}.items():
            for k in (2, 5, 10):
                w = torch.randn(k, o, i, generator=gen)
                z = torch.randn(k, batch, i, generator=gen)
                bias, go = torch.randn(k, o, generator=gen), torch.randn(k, batch, o, generator=gen)
                got = []
                for leaf in (w.clone(), _leaf(name, w, batch)):
                    leaf.requires_grad_()
                    zz = z.clone().requires_grad_()
                    f = torch.baddbmm(bias.unsqueeze(1), zz, leaf.transpose(1, 2))
                    gw, gz = torch.autograd.grad((f * go).sum(), [leaf, zz])
                    got.append((f.detach(), gw, gz, leaf.stride() == gw.stride()))
                (f0, gw0, gz0, _), (f1, gw1, gz1, matched) = got
                assert torch.equal(f0, f1) and torch.equal(gw0, gw1) and torch.equal(gz0, gz1), (name, k)
                assert matched == (name != "head.weight" and batch >= 2), (name, k)
