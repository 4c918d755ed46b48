"""experiments/fol/local_scale.py: FOL's pretraining at another scale, without the cache."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_local_scale_trains_at_the_asked_scale_and_leaves_the_cache_alone(shared_data: Path, tmp_path: Path,
                                                                          monkeypatch) -> None:
    spec = importlib.util.spec_from_file_location("fol_local_scale", ROOT / "experiments" / "fol" / "local_scale.py")
    mod = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(mod)
    monkeypatch.chdir(tmp_path)  # the config's own cache path is relative: it must not appear here
    cfg = str(ROOT / "experiments" / "fol" / "cpu" / "cifar10_psi0.7_fol.toml")
    rows = mod.run_scale(cfg, [9], width=4, epochs=1, patience=1, extra=["threads=1"])
    (node, acc, epochs, seconds, n_params), = rows
    assert node == 9 and epochs == 1 and 0.0 <= acc <= 1.0
    assert not (tmp_path / "runs").exists()
    # the width override reaches the model that is trained
    wider = mod.run_scale(cfg, [9], width=8, epochs=1, patience=1, extra=["threads=1"])
    assert wider[0][4] > n_params
