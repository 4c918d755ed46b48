"""The config's layers (issue 37, item 3): the schema at the bottom of the import graph, the
registry cross-checks in the resolver that every front door calls, no algorithm above them."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import lowband.config as config
from lowband.config import ConfigError, validate
from lowband.config.schema import RING_DEFAULT_K, parse_experiment
from test_import_graph import SRC, import_graph


def test_schema_runs_no_other_lowband_module() -> None:
    """Importing the schema (and ConfigError through ``lowband.config``) runs no registry, no
    engine, no data module: any module may import it without a circle."""
    code = ("import sys; import lowband.config.schema; from lowband.config import ConfigError, Experiment; "
            "print(sorted(m for m in sys.modules if m.startswith('lowband')))")
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env).stdout
    # lowband.version: the package's version string, which lowband/__init__ names
    assert out.strip() == "['lowband', 'lowband.config', 'lowband.config.schema', 'lowband.version']"


def test_schema_imports_nothing_of_lowband() -> None:
    """Not even inside a function: the schema's module has no lowband import at all."""
    assert import_graph()["lowband.config.schema"] == set()


def test_every_reexported_name_resolves() -> None:
    """``from lowband.config import X`` keeps working for every name it offered before the split."""
    for name in config.__all__:
        assert getattr(config, name) is not None, name
    with pytest.raises(AttributeError):
        config.no_such_name  # noqa: B018


def test_the_resolver_supplies_the_facts_the_schema_checks() -> None:
    """Link presets, device names and the target's direction are checked through validate()
    (the schema gets them from the resolver); the schema alone skips them."""
    bad = [({"links": {"preset": "nope"}}, "links.preset: unknown link preset 'nope'"),
           ({"device": "tpu"}, "device: unknown device 'tpu'"),
           ({"eval": {"target": 85}}, "eval.target: 85 is not a fraction")]
    for raw, line in bad:
        with pytest.raises(ConfigError, match=line.replace("(", r"\(")):
            validate({"algorithm": {"name": "fedavg"}, **raw})
        parse_experiment({"algorithm": {"name": "fedavg"}, **raw})  # schema only: no registry, no refusal


def test_the_registry_checks_are_the_resolvers() -> None:
    """Algorithm names are the resolver's check, not the schema's."""
    parse_experiment({"algorithm": {"name": "nope"}})
    with pytest.raises(ConfigError, match="algorithm.name: unknown algorithm 'nope'"):
        validate({"algorithm": {"name": "nope"}})


def test_ring_default_is_the_builders() -> None:
    """The schema's written-out ring ``k`` is the ring builder's default (a re-run of the
    written config.toml builds the same ring)."""
    from lowband.topology import TOPOLOGIES

    assert RING_DEFAULT_K == TOPOLOGIES["ring"]["params"]["k"]


def test_no_algorithm_reaches_config_loading_or_the_simulator() -> None:
    """No algorithm module imports (even through other modules) the resolver, the front
    doors or the simulator: an algorithm never builds a run."""
    graph = import_graph()
    forbidden = {"lowband.config", "lowband.config.resolve", "lowband.engine.simulator", "lowband.api",
                 "lowband.cli", "lowband.batch"}
    for mod in (m for m in graph if m.startswith("lowband.algorithms")):
        seen, todo = set(), [mod]
        while todo:
            for nxt in graph[todo.pop()] - seen:
                seen.add(nxt)
                todo.append(nxt)
        assert not seen & forbidden, f"{mod} reaches {sorted(seen & forbidden)}"
