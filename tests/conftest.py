"""Shared fixtures: where the offline datasets are, and small configs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

SHARED_DATA = Path(os.environ.get("LOWBAND_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))


@pytest.fixture
def shared_data() -> Path:
    if not (SHARED_DATA / "fashion-mnist").exists():
        pytest.skip(f"offline datasets not found at {SHARED_DATA} (set LOWBAND_DATA)")
    return SHARED_DATA


def digits_config(tmp_path: Path, algorithm: str = "fedavg", rounds: int = 3, **alg: object) -> dict:
    """A tiny, fast experiment on the embedded digits data. The short local-SGD settings
    go only to algorithms that have them (D-PSGD has no local epochs)."""
    from lowband.algorithms import ALGORITHMS

    peer = algorithm in ("dfedavg", "dfedavgm", "dpsgd")
    short: dict[str, object] = {"local_epochs": 1, "batch_size": 16, "lr": 0.05}
    if algorithm == "hierfavg":
        short["edges"] = 2  # HierFAVG's gateways: 2 of the 8 nodes (its default 5 needs 10)
    if algorithm in ALGORITHMS:
        short = {k: v for k, v in short.items() if k in ALGORITHMS[algorithm].Hyperparams.model_fields}
    return without_round_sections({
        "name": f"t-{algorithm}",
        "seed": 1,
        "rounds": rounds,
        "threads": 1,  # float reductions depend on the thread count: pin it so runs compare
        "out_dir": str(tmp_path / f"run-{algorithm}"),
        "data": {"dataset": "digits", "num_clients": 8, "partition": "dirichlet", "alpha": 0.5, "min_size": 20,
                 "split": [0.75, 0.0, 0.25]},
        "model": {"name": "mlp", "hidden": 32},
        "algorithm": {"name": algorithm, **short, **alg},
        "topology": {"kind": "kregular", "k": 3} if peer else {"kind": "star", "sampling": "count", "count": 4},
    })


def event_clock(algorithm: str) -> bool:
    """Whether ``algorithm`` runs on the event clock (lowband.asynchronous: FedAsync, FedBuff):
    the clock, not a [topology], starts its clients, and it refuses [topology] and [faults]."""
    from lowband.algorithms import ALGORITHMS

    return bool(getattr(ALGORITHMS.get(algorithm), "event_clock", False))


def without_round_sections(cfg: dict) -> dict:
    """``cfg`` without [topology] and [faults] when its algorithm runs on the event clock
    (unchanged otherwise): the sections a generic every-algorithm config adds that such an
    algorithm refuses."""
    if event_clock(str(cfg.get("algorithm", {}).get("name", ""))):
        return {k: v for k, v in cfg.items() if k not in ("topology", "faults")}
    return cfg


#: modules whose tests train real models for several rounds, start interpreters, clusters or
#: builds, or reproduce paper cells: the slow tier. ``pytest -m "not slow"`` is the fast tier a
#: developer runs after a change (README, "Run the tests"); plain ``pytest`` (CI) runs both.
SLOW_MODULES = frozenset({
    "test_batch", "test_bench_suite", "test_cohort", "test_dense", "test_dfedsam", "test_dispfl", "test_docs",
    "test_ef21", "test_evaluation_speed", "test_fedcspack", "test_fedmd", "test_flower", "test_flower_hostile",
    "test_fol", "test_fol_scale", "test_frontier", "test_kta", "test_kta_table", "test_learning", "test_memory",
    "test_mixed_models", "test_ntk", "test_pfl_baselines", "test_plugins", "test_pool", "test_python_api",
    "test_ray", "test_reproduce", "test_reproduce_seeds", "test_resume_every_algorithm", "test_seed_layouts",
    "test_server_opt", "test_spark", "test_spark_reproduce", "test_tensorboard", "test_train_speed", "test_wheel",
})


def pytest_collection_modifyitems(config: "pytest.Config", items: list["pytest.Item"]) -> None:
    """Mark every test of :data:`SLOW_MODULES` ``slow`` (tests elsewhere mark themselves)."""
    import pytest as _pytest

    for item in items:
        if item.module is not None and item.module.__name__.rsplit(".", 1)[-1] in SLOW_MODULES:
            item.add_marker(_pytest.mark.slow)


def as_written(path: Path, text: "str | None") -> None:
    """Change a run folder's file as lowband itself would (its manifest.json updated; None
    removes the file): the state an older lowband, another device or a kill leaves, which
    a test sets up by hand; an edit behind the manifest's back is a damage (test_damage_matrix)."""
    from lowband.engine.runlog import RunLog

    log = RunLog(Path(path).parent)
    if text is None:
        log.remove(Path(path))
    else:
        log.write_file(Path(path), text)
