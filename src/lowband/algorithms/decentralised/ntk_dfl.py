"""NTK-DFL (Thompson et al., ICML 2025): the method, its round and its reading choices.

One round ``r`` (specs/ntk_dfl_spark.md, "NTK-DFL round r"; every step below runs on one
node with its own state, data and inbox):

1. ``share``: node i sends its weights ``w_i`` to its neighbours.
2. ``request``: node i averages uniformly over its closed neighbourhood,
   ``w_bar_i = (w_i + sum_j w_j) / (deg + 1)``, keeps it, and sends it to every neighbour
   as a Jacobian request.
3. ``reply``: each neighbour j answers each requester i with the Jacobian of its logits on
   its data at ``w_bar_i`` (``n_j x C x d``), the logits ``f(X_j; w_bar_i)`` and its labels.
   The full Jacobian is a *declared* tensor (628 MB per edge at the paper's size: counted,
   never built) whose equivalent input ``X_j`` travels as an uncounted stand-in; the
   receiver recomputes the declared content ``J(X_j; w_bar_i)`` implicitly.
4. ``update``: node i stacks the ``N`` samples of its neighbourhood, builds the trace
   kernel ``K = (1/C) sum_c J_c J_c^T`` (``N x N``; closed form for the MLP), evolves
   ``df/dt = -(1/N) K (softmax(f) - Y)`` from ``f_0 = f(X; w_bar_i)`` on ``t_s = s lr_r``
   (RK4), forms ``R_tau = sum_{s<tau} softmax(f_{t_s}) - tau Y`` and
   ``dw_tau = -(lr_r / N) J^T R_tau`` (a backward pass), and keeps the candidate ``tau``
   with the smallest cross-entropy on the pooled data.
   ``lr_r = lr * exp(-lr_decay * (r - 1))`` (1-based rounds).
5. ``commit``: synchronous: ``w_i <- w_bar_i + dw`` for every node at once.

``order = "sequential"`` runs the loop of the reference's ``random_graph*.py`` instead
(Gauss-Seidel; its ``main.py``, which the reference numbers come from, is synchronous): nodes take
their turn in id order, and node i's turn is steps 1-5 with i as the only requester (its
neighbours send i their current weights, already updated ones included; i commits at once).
Same messages per directed edge as a synchronous round; see
:meth:`~lowband.algorithms.decentralised.kernel_round.KernelDFL.sequential_steps`.

Steps 3 and 4 may be split into groups of requesters (``reply_groups``) so that at most a
fraction of the round's Jacobian messages is in memory at once. The split changes nothing
in the result (a test checks it).

The round is written once, in :mod:`~lowband.algorithms.decentralised.kernel_round`, over
six parts (``exchange``, ``payload``, ``targets``, ``momentum``, ``sample``, ``finish``); the
parts of NTK-DFL above (weights, declared Jacobians with the trace kernel and ``J^T R`` by a
backward pass, hard labels, no momentum, all data, the best tau) are that module's
:func:`~lowband.algorithms.decentralised.kernel_round.ntk_dfl_operations`.

Hyperparameters: :class:`KernelDFLHP` declares NTK-DFL's knobs and, off (NTK-DFL's values),
SPARK's switches (``projection``, ``distill``, ``momentum``, ``sample_fraction``, ``update``
and what they read). ``ntk_dfl`` has always accepted them (docs/algorithms/spark.md: "available
on ``ntk_dfl`` too"; tests/test_ntk.py runs them on the declared Jacobians), and a run folder's
hyperparams.json, which ``--resume`` compares, holds every one of them. A ``ntk_dfl``
configuration that turns a switch on runs SPARK's parts in place of NTK-DFL's, switch by
switch (:func:`~lowband.algorithms.decentralised.spark.with_switches`), under NTK-DFL's name
and defaults.

Deliberate choices (docs/algorithms/spark.md): Jacobians at ``w_bar_i`` (reference code);
the candidate loss of ``tau_select = "true"`` evaluates the network at ``w_bar_i + dw`` on
the pooled inputs as the reference does (those inputs are the stand-ins of the declared
Jacobians: the reference's own simplification), ``"evolved"`` uses the evolved
predictions ``f_tau`` and ``"linear"`` the linearised ones ``f_0 + J dw`` (both
protocol-faithful); with the default single candidate ``[100]`` the choice does not
matter. The declared path cannot model a lossy codec's rounding of the Jacobian (the
receiver computes it in float32): figure 4's codecs are measured with SPARK.
"""

from __future__ import annotations

from lowband.algorithms.base import Hyperparams, register
from lowband.algorithms.decentralised import spark
from lowband.algorithms.decentralised.kernel_round import (  # noqa: F401 (the names this module always had)
    KernelDFL, KernelDFLHP, Operations, Pooled, ntk_dfl_operations, requester_groups,
)


@register
class NTKDFL(KernelDFL):
    """NTK-DFL: full Jacobians (declared), trace kernel, CE evolution, tau selection; SPARK's
    switches, when a configuration turns one on (module docstring)."""

    name = "ntk_dfl"
    paper = "Thompson et al., NTK-DFL: Enhancing Decentralized Federated Learning in Heterogeneous Settings via NTK, ICML 2025"
    Hyperparams = KernelDFLHP

    def __init__(self, hp: Hyperparams) -> None:
        super().__init__(hp)
        if spark.switched_on(hp):  # update = "full" may send residuals, as SPARK's does
            self.unaligned_kinds = spark.Spark.unaligned_kinds

    def operations(self) -> Operations:
        return spark.with_switches(self, ntk_dfl_operations(self))
