"""benchmarks/suite.py (issue 18 part 7): its pieces do the work they claim, and the
``--quick`` run prints every workload's serial / default / plain seconds per round, its
FLOP floor and peak memory. Timings themselves are not asserted (a benchmark, not a
timed test)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from lowband.config import Experiment, load_experiment

from conftest import digits_config

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"
sys.path.insert(0, str(BENCH))

import _common  # noqa: E402
import _plain  # noqa: E402
import suite  # noqa: E402


def _write(tmp_path: Path, cfg: dict) -> Path:
    import tomli_w

    p = tmp_path / "exp.toml"
    p.write_text(tomli_w.dumps(cfg))
    return p


def _setting(tmp_path: Path, algorithm: str, rounds: int):
    from lowband.algorithms import ALGORITHMS
    from lowband.config import hyperparams
    from lowband.engine.simulator import make_federation, make_topology, model_options
    from lowband.models import build_model

    exp = load_experiment(_write(tmp_path, digits_config(tmp_path, algorithm, rounds=rounds)))
    fed = make_federation(exp)
    alg = ALGORITHMS[exp.algorithm.name](hyperparams(exp))
    plans = [make_topology(exp, alg.family, len(fed.nodes), alg.default_topology).plan(r) for r in range(rounds)]
    model = build_model(exp.model.name, num_classes=fed.num_classes, input_shape=tuple(fed.input_shape), seed=0,
                        **model_options(exp, fed))
    return exp, fed, alg.hp, plans, model


@pytest.mark.parametrize("algorithm", ["fedavg", "dfedavg"])
def test_plain_loop_learns_like_the_engine(tmp_path: Path, algorithm: str) -> None:
    """The hand-written loop (column c) trains the same clients to the engine's accuracy:
    it does the workload's work, not less."""
    from lowband.engine.simulator import Simulation

    rounds = 4
    exp, fed, hp, plans, model = _setting(tmp_path, algorithm, rounds)
    init = {k: v.clone() for k, v in model.state_dict().items()}
    seen: list[dict[str, float]] = []
    kw = dict(epochs=hp.local_epochs, batch_size=hp.batch_size, lr=hp.lr, eval_batch_size=500,
              on_round=lambda r, m: seen.append(dict(m)))
    if algorithm == "fedavg":
        _plain.fedavg(model, init, fed, [p.participants for p in plans], protocols=["personal", "global"], **kw)
        keys = ("global/acc", "personal/acc_weighted")
    else:
        _plain.dfedavg(model, init, fed, [p.neighbors for p in plans], protocols=["consensus", "node_global"], **kw)
        keys = ("consensus/acc", "node_global/acc")
    assert len(seen) == rounds and all(set(keys) <= set(m) for m in seen)
    engine = Simulation(exp).run().metrics[-1]  # the algorithm's default protocols: the same two
    for k in keys:
        assert seen[-1][k] > 0.5, (k, seen[-1][k])  # 10 classes: chance is 0.1
        assert abs(seen[-1][k] - engine[k]) < 0.15, (k, seen[-1][k], engine[k])
    assert seen[-1][keys[0]] > seen[0][keys[0]] - 0.05  # training goes on across rounds


def test_flop_counts_agree_with_the_layer_shapes() -> None:
    """The floor's FLOP count (FlopCounterMode) equals the analytic count from the
    Linear/Conv2d shapes, for the two models of the suite."""
    from lowband.models import build_model

    for name in ("mlp", "cnn_fmnist"):
        m = build_model(name, num_classes=10, input_shape=(1, 28, 28), seed=0)
        x, y = torch.randn(16, 1, 28, 28), torch.randint(0, 10, (16,))
        train = _common.step_flops(m, x, y)
        assert train == _common.analytic_flops(m, x) > 0
        fwd = _common.forward_flops(m, x)
        assert train > 2 * fwd  # backward: weight and input gradients
        if name == "mlp":  # forward = 2 x batch x the Linear weights
            assert fwd == 2 * 16 * sum(p.numel() for n, p in m.named_parameters() if n.endswith("weight"))


def test_config_keys_the_installed_lowband_lacks_are_reported_not_set() -> None:
    assert suite.key_available("eval.every") and suite.key_available("algorithm.name")
    assert not suite.key_available("eval.no_such_key") and not suite.key_available("no_section.key")
    engine = Experiment.model_fields.get("engine")
    assert suite.key_available("engine.workers") == (engine is not None and "workers" in engine.annotation.model_fields)
    keys = suite.mode_keys("default", ["eval.no_such_key=3", "eval.every=2"])
    assert keys["eval.no_such_key"] is None and keys["eval.every"] == "2"
    assert suite.mode_keys("plain", []) == {}


def test_tree_rss_counts_the_processes_a_run_starts() -> None:
    """Peak memory includes worker processes (a pool's memory is the run's memory)."""
    code = textwrap.dedent("""
        import time
        x = bytearray(200 * 2**20)
        for i in range(0, len(x), 4096):
            x[i] = 1
        time.sleep(1.5)
    """)
    with _common.TreeRSS(interval=0.05, pss_every=0.05) as mem:
        base, base_pss = _common._rss_kib(os.getpid()), _common._pss_kib(os.getpid())
        subprocess.run([sys.executable, "-c", code], check=True)
    assert mem.peak_workers >= 1
    assert mem.peak_kib - base > 180 * 1024
    assert mem.peak_pss_kib - base_pss > 180 * 1024  # PSS is sampled while there are children


@pytest.mark.slow  # 30-50 s on one core: four workloads x three runs x two rounds, a fresh interpreter per workload
def test_suite_quick_prints_every_column(shared_data: Path, tmp_path: Path) -> None:
    out = tmp_path / "suite.json"
    env = {**os.environ, "LOWBAND_DATA": str(shared_data),
           "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    p = subprocess.run([sys.executable, str(BENCH / "suite.py"), "--quick", "--json", str(out)], cwd=ROOT, env=env,
                       capture_output=True, text=True)  # no wall-clock limit: CI bounds the job
    assert p.returncode == 0, p.stderr[-3000:]
    text = p.stdout
    for needle in ("load average at start", "load average at end", "machine:", "torch", "(a) serial s/round",
                   "(c) plain PyTorch s/round", "FLOP floor s/round", "default / serial", "engine.workers"):
        assert needle in text, needle
    res = json.loads(out.read_text())
    assert res["loadavg_start"] and res["big_matmul"]["gflops_best"] > 0
    for key in ("fedavg", "dfedavg", "ntk_dfl", "spark"):
        r = res["results"][key]
        for mode in ("serial", "default", "plain"):
            assert "error" not in r[mode], (key, mode, r[mode])
            assert r[mode]["s_per_round"] > 0 and r[mode]["rss_tree_kib"] > 100 * 1024, (key, mode)
        assert r["plain"]["flops"]["train"] > 0
        for k, v in r["serial"]["metrics"].items():  # same engine, same numbers (float tolerance)
            assert abs(v - r["default"]["metrics"][k]) < 0.01, (key, k)
    for key in ("fedavg", "dfedavg"):
        assert res["results"][key]["plain"]["flops"]["eval"] > 0
    assert res["results"]["spark"]["serial"]["extrapolated_x"] == 10.0


def test_baseline_src_adds_a_column_and_its_ratio(tmp_path: Path) -> None:
    """--baseline-src DIR: mode (a) once more on another lowband (PYTHONPATH=DIR), shown
    as its own column with default / that; a DIR without lowband is refused."""
    with pytest.raises(SystemExit):
        suite.main(["--baseline-src", str(tmp_path), "--workloads", "fedavg"])
    run = {"s_per_round": 2.0, "train_s": 1.5, "eval_s": 0.5, "keys": {}, "rss_self_kib": 2**20, "metrics": {}}
    res = {"fedavg": {"baseline": {**run, "s_per_round": 4.0, "notes": ["lowband from X"]}, "serial": run,
                      "default": {**run, "s_per_round": 1.0}, "plain": {**run, "s_per_round": 3.0}}}
    args = suite.argparse.Namespace(quick=False, baseline_src="/old/src")
    text = suite.report(res, {"gflops_floor": 100.0}, args)
    assert "(a0) serial at /old/src s/round" in text and "default / serial at baseline" in text
    assert "| fedavg | 0.25x | 0.50x | 0.33x |" in text
    assert "fedavg/baseline: 4.00 s/round" in text and "lowband from X" in text
    plain = suite.report({"fedavg": {k: v for k, v in res["fedavg"].items() if k != "baseline"}},
                         {"gflops_floor": 100.0}, suite.argparse.Namespace(quick=False, baseline_src=None))
    assert "(a0)" not in plain and "| fedavg | 0.50x | 0.33x |" in plain
