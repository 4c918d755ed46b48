"""lowband: federated learning when communication is the scarce resource.

The package simulates a federation on one machine, runs communication-efficient FL
methods and their baselines under one protocol, and counts every byte that crosses a
link (see docs/ and the design notes).

The Python API (docs/python-api.md)::

    import lowband as lb
    exp = lb.experiment("cfg.toml", rounds=5, algorithm={"lr": 0.1})
    res = lb.run(exp, write=False)          # Result: .metrics, .ledger, .summary, .model(), .plot()
    mine = lb.experiment(exp, data=lb.arrays(x, y))   # your own data (or lb.from_torch(dataset))
    seeds = lb.run_seeds(exp, seeds=[0, 1, 2], out="runs/x")   # mean, std, 95% CI
"""

from typing import Any

from lowband.version import __version__

_API = ("experiment", "run", "run_seeds", "sweep", "frontier", "load_run", "load_plugin", "arrays", "from_torch", "Result",
        "SeedResults", "SweepResult")


def __getattr__(name: str) -> Any:  # the API loads on first use: `import lowband.cli` stays light
    if name in _API:
        from lowband import api

        return getattr(api, name)
    if name == "Experiment":
        from lowband.config.schema import Experiment

        return Experiment
    raise AttributeError(f"module 'lowband' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_API, "Experiment"])


__all__ = ["__version__", *_API, "Experiment"]
