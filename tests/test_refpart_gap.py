"""Issue 45: NTK-DFL on the authors' own partition against the authors' per-round numbers.

docs/algorithms/spark.md ("NTK-DFL on the authors' own partition") compares lowband's
synchronous runs on ``reference_recipe_a0.1_seed0`` (20 seeds, records in
``docs/results/records/refpart/``) with one run of the authors' ``main.py``. Every cause the
issue names was read in their code and found equal; these tests pin the property each of
those exclusions relies on, so that a change that broke one would show:

- the evaluation (``consensus`` = the uniform average of *all* nodes' weights on the test
  set, as their ``average_neighbor_weights(0, user_ids[1:])``; ``node_global`` = the plain
  mean over nodes of each node's test accuracy, as their ``np.mean(client_accs)``);
- the initial model (one Kaiming-normal fan-in draw, zero biases, the same for every node:
  their ``init_weights`` with ``same_init: true``);
- the averaging (uniform over the closed neighbourhood, self-weight ``1/(deg+1)``, before the
  evolution, every node from the round's start state), the trace kernel over all parameters
  divided by C, the residual ``sum_{s<tau} softmax(f_s) - tau Y`` and the update
  ``-(lr/N) J^T R`` are pinned by ``tests/test_ntk.py`` (``naive_round``, materialised
  Jacobians and a float64 dopri5, against a whole engine round);

and what is left, the offset of a single run of theirs from our mean, is checked to be the
size of the spread of single runs (the records), not a systematic shift beyond it.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from lowband.config import validate
from lowband.engine.simulator import Simulation
from lowband.results.record import read_record

ROOT = Path(__file__).resolve().parents[1]
RECORDS = ROOT / "docs" / "results" / "records" / "refpart"

#: the authors' main.py, one run each (docs/algorithms/spark.md): round -> (client, aggregated), %
AUTHORS_M10 = {1: (43.66, 46.24), 2: (53.44, 59.72), 3: (54.41, 58.72), 4: (59.98, 63.77)}
AUTHORS_M30 = {1: (48.79, 58.63)}


def _runs(*folders: str) -> list[dict[int, tuple[float, float]]]:
    out = []
    for folder in folders:
        for path in sorted((RECORDS / folder).glob("seed-*.jsonl*")):
            rows = read_record(path).metrics
            out.append({r["round"]: (100 * r["node_global/acc"], 100 * r["consensus/acc"]) for r in rows})
    return out


@pytest.mark.parametrize("size,folders,authors", [
    (10, ("m10_sync",), AUTHORS_M10),
    (30, ("m30_sync", "m30_sync_r1"), AUTHORS_M30),
])
def test_the_authors_single_run_lies_within_the_spread_of_single_runs(size, folders, authors) -> None:
    """One run of theirs against 20 of ours (synchronous, their partition): in every round and
    for both measures their number lies within two standard deviations of our runs (a single
    run's 95% band), and the average over rounds and measures (which the rounds' correlation
    makes the strictest single check) within 1.5. A systematic offset of the 2-3 points the
    issue asks about would still pass; one of 5 points (the gap on lowband's own draw) would
    not."""
    runs = _runs(*folders)
    assert len(runs) == 20
    zs = []
    for r, pair in authors.items():
        for j in range(2):
            v = np.array([x[r][j] for x in runs])
            z = (pair[j] - v.mean()) / v.std(ddof=1)
            zs.append(z)
            assert abs(z) < 2.0, (size, r, j, round(float(z), 2))
    if len(authors) > 1:
        keys = [(r, j) for r in authors for j in range(2)]
        ours = np.array([np.mean([x[r][j] for r, j in keys]) for x in runs])
        theirs = np.mean([authors[r][j] for r, j in keys])
        assert abs(theirs - ours.mean()) / ours.std(ddof=1) < 1.5


def _tiny(tmp_path: Path) -> Simulation:
    cfg = {"name": "refpart-eval", "seed": 4, "rounds": 1, "out_dir": str(tmp_path / "run"), "threads": 1,
           "data": {"dataset": "digits", "num_clients": 6, "partition": "iid", "split": [0.5, 0.0, 0.5]},
           "model": {"name": "mlp", "hidden": 16},
           "algorithm": {"name": "ntk_dfl", "taus": [5], "lr": 0.05},
           "topology": {"kind": "kregular", "k": 2},
           "eval": {"protocols": ["consensus", "node_global"]},
           "checkpoint_every": 0}
    sim = Simulation(validate(cfg))
    return sim


def test_evaluation_is_the_authors_uniform_average_and_plain_client_mean(tmp_path: Path) -> None:
    """``consensus/acc`` is the test accuracy of the uniform average of every node's weights;
    ``node_global/acc`` the plain mean over nodes of each node's test accuracy (main.py)."""
    sim = _tiny(tmp_path)
    result = sim.run()
    last = result.metrics[-1]
    model = sim.executor.model_for(0).eval()
    tx, ty = sim.fed.global_test_x, sim.fed.global_test_y
    states = [sim.executor.states[i]["params"] for i in range(6)]

    def acc(p: dict) -> float:
        with torch.no_grad():
            return float((torch.func.functional_call(model, p, (tx,)).argmax(1) == ty).float().mean())

    avg = {k: torch.stack([s[k] for s in states]).mean(0) for k in states[0]}
    assert last["consensus/acc"] == pytest.approx(acc(avg), abs=1e-6)
    assert last["node_global/acc"] == pytest.approx(float(np.mean([acc(s) for s in states])), abs=1e-6)
    # the models differ, so the two protocols measure different things
    assert max(float((states[0][k] - states[3][k]).abs().max()) for k in avg) > 1e-4


def test_initial_model_is_one_kaiming_fan_in_draw_with_zero_biases(tmp_path: Path) -> None:
    """Every node starts from the same weights: Kaiming-normal with fan-in (std sqrt(2 / fan_in))
    and zero biases (the authors' init_weights with same_init: true)."""
    sim = _tiny(tmp_path)
    inits = [sim.builder.init_params(i) for i in range(6)]
    for k in inits[0]:
        for other in inits[1:]:
            assert torch.equal(inits[0][k], other[k])
    for name, v in inits[0].items():
        if name.endswith("bias"):
            assert torch.count_nonzero(v) == 0, name
        else:
            fan_in = v.shape[1]
            std = float(v.std())
            want = math.sqrt(2.0 / fan_in)
            # the sample std of n Gaussian entries is within ~4 / sqrt(2n) of the truth
            assert abs(std / want - 1) < 4 / math.sqrt(2 * v.numel()), (name, std, want)
