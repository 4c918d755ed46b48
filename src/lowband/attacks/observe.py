"""What a run measures of an attack and of the rules: honest metrics, backdoor accuracy,
counters, summary. The driver's :class:`~lowband.engine.observers.robustness.Robustness`
observer calls these (it is in a run's observers when a rule or an attack is configured).

Per evaluated round (metrics.jsonl):

- ``robust/<rule>/<counter>``: the rules' counters (lowband.aggregation), summed over the
  aggregating nodes and the rounds since the previous line (as incidents, checkpointed);
- peer methods under attack: ``honest/consensus/acc`` (uniform average of the honest nodes'
  models on the global test set), ``honest/node_global/acc`` (mean over honest nodes) and
  ``byzantine/node_global/acc`` (the attackers' own models, apart);
- ``attack/backdoor_acc`` (model replacement): the share of the global test inputs whose
  label is not the target that the global model (server methods) or the honest consensus
  (peer methods) classifies as the target once the trigger is added.

The summary gains ``attack`` (kind, nodes, parameters: what the run suffered) and
``aggregation`` (the rule and its parameters, or "none").
"""

from __future__ import annotations

from functools import partial
from typing import Any, Optional

import torch

from lowband.attacks.model import add_trigger
from lowband.engine.evaluation import _eval_params, _node_params, _server_params
from lowband.train import weighted_average


def backdoor_test(x: torch.Tensor, y: torch.Tensor, target: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The triggered global test inputs whose label is not ``target``, all labelled ``target``."""
    keep = y != target
    xs = add_trigger(x[keep], float(x.max()))
    return xs, torch.full((int(keep.sum()),), int(target), dtype=y.dtype, device=y.device)


def attack_metrics(sim: Any, r: int, plan: Any) -> dict[str, float]:
    """The evaluated round's attack metrics (see the module docstring)."""
    attack = getattr(sim.alg, "attack", None)
    if attack is None:
        return {}
    ex, alg, ev = sim.executor, sim.alg, sim.evaluator
    test, bs = (ev.test_x, ev.test_y), ev.batch_size
    out: dict[str, float] = {}
    model: Optional[dict[str, torch.Tensor]] = None
    if alg.has_server:
        model = ex.map_nodes(partial(_server_params, alg=alg), [-1], r, plan)[-1]
    else:
        honest = [i for i in range(sim.num_nodes) if i not in attack.attackers]
        got = ex.map_nodes(partial(_node_params, alg=alg), list(range(sim.num_nodes)), r, plan)
        hp = [got[i] for i in honest if got[i] is not None]
        if hp:
            model = weighted_average(hp)
            acc = ex.map_nodes(partial(_eval_params, params=model, test=test, bs=bs), [honest[0]], r, plan)
            out["honest/consensus/acc"] = acc[honest[0]][0]
        for label, nodes in (("honest", honest), ("byzantine", sorted(attack.attackers))):
            accs = [ex.map_nodes(partial(_eval_params, params=got[i], test=test, bs=bs), [i], r, plan)[i][0]
                    for i in nodes if got[i] is not None]
            if accs:
                out[f"{label}/node_global/acc"] = sum(accs) / len(accs)
    if attack.kind == "model_replacement" and model is not None:
        bx, by = backdoor_test(ev.test_x, ev.test_y, attack.cfg.target)
        at = -1 if alg.has_server else 0
        res = ex.map_nodes(partial(_eval_params, params=model, test=(bx, by), bs=bs), [at], r, plan)[at]
        out["attack/backdoor_acc"] = res[0]
    return out


__all__ = ["attack_metrics", "backdoor_test"]
