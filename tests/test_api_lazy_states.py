"""``Result.model(n)`` for a node the run never read (issue 43: states are made on first
use, so a loaded run's ``states`` lacks the clients never sampled): its initial state is
remade from the config, the same bits the run would have made."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import lowband.api as api
from conftest import digits_config
from lowband.config import validate


def test_model_of_a_node_never_read_is_its_initial_model(tmp_path: Path) -> None:
    cfg = digits_config(tmp_path, "fedpac", rounds=1)
    cfg["topology"] = {"kind": "star", "sampling": "count", "count": 2}
    cfg["eval"] = {"protocols": ["global"]}  # (a personal evaluation would read every node)
    exp = validate(cfg)
    res = api.run(exp)
    loaded = api.load_run(res.run_dir)
    took = sorted(n for n in loaded.states if n >= 0)
    never = [n for n in range(8) if n not in loaded.states]
    assert len(took) == 2 and len(never) == 6
    builder = loaded._builder()
    for node in never[:2]:
        got = loaded.model(node).state_dict()
        want = builder.init_params(node)
        assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
    trained = loaded.model(took[0]).state_dict()
    assert any(not torch.equal(trained[k], builder.init_params(took[0])[k]) for k in trained)
    with pytest.raises(ValueError, match="no node 8"):
        loaded.model(8)
