"""Co-Boosting (Dai et al., ICLR 2024): DENSE with mutually boosted data and ensemble.

Differences from :mod:`lowband.algorithms.oneshot.dense` (official code,
``datafree/synthesis/coboost.py`` and ``datafree_kd.py``; specs/fol.md):

- **Hard-sample synthesis**: the one-hot term is focal-style,
  ``mean((1 - p_y)^hs * CE(A(x), y))`` with ``hs = 1`` (``p_y`` not differentiated), and
  the adversarial term is unmasked, ``-T^2 KL(softmax(A/T) || softmax(S/T))`` at ``T = 3``.
  The teachers see the generated batch without augmentation, the BatchNorm term is divided
  by the number of teachers and the generator's gradient norm is clipped at 10.
- **Ensemble re-weighting**: ``A(x) = sum_i w_i f_i(x) / sum_i w_i`` with ``w_i = 1/n`` at
  the start; from the second epoch on, after each synthesis, one signed step per pool
  batch (``kd_batch`` images, the pool in a random order, at most ``reweight_steps``
  batches), ``w <- clip(w - mu_e sign(grad_w CE(A(x), y)), 0, 1)`` with
  ``mu_e = mu * mu_decay^epoch`` (0.01, 0.99), ``y`` the labels the images were made for.
- **Diversified inputs at distillation**: each (normalised) pool batch is moved by
  ``odseta`` (8/255) along the sign of the gradient of ``sum(r * softmax(A(x)/4))`` for a
  random ``r ~ U(-1, 1)`` (output-diversified sampling) before the student and the
  ensemble see it; distillation at ``T = 4`` with SGD weight decay 1e-4 and the student's
  gradient norm clipped at 10.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from pydantic import Field

from lowband.algorithms.base import NodeContext, State, register
from lowband.algorithms.oneshot.dense import DENSE, DenseHP, kldiv
from lowband.algorithms.oneshot.generator import normalise
from lowband.train import batches
from lowband.train.steps import projected_step


class CoBoostHP(DenseHP):
    kd_T: float = Field(4.0, gt=0, description="distillation temperature (Co-Boosting: 4)")
    kd_weight_decay: float = Field(1e-4, ge=0, description="student SGD weight decay (Co-Boosting: 1e-4)")
    kd_clip: Optional[float] = Field(10.0, gt=0, description="clip the student's gradient norm (Co-Boosting: 10)")
    g_clip: Optional[float] = Field(10.0, gt=0, description="clip the generator's gradient norm (Co-Boosting: 10)")
    synth_augment: bool = Field(False, description="augment the synthetic batch before the teachers see it "
                                "during synthesis (Co-Boosting: false)")
    hs: float = Field(1.0, ge=0, description="exponent of the hard-sample weight (1 - p_y)^hs")
    adv_T: float = Field(3.0, gt=0, description="temperature of the unmasked adversarial term")
    mu: float = Field(0.01, ge=0, description="step of the signed ensemble-weight update")
    mu_decay: float = Field(0.99, gt=0, le=1, description="per-epoch decay of mu")
    odseta: float = Field(8 / 255, ge=0, description="size of the input perturbation (normalised input units)")
    reweight_steps: Optional[int] = Field(None, ge=1, description="ensemble-weight steps per epoch, one per pool "
                                          "batch of kd_batch images (None: the whole pool)")


@register
class CoBoosting(DENSE):
    """Co-Boosting: hard-sample synthesis, re-weighted ensemble, diversified distillation."""

    name = "coboost"
    paper = "Dai et al., Enhancing One-Shot Federated Learning Through Data and Ensemble Co-Boosting, ICLR 2024"
    Hyperparams = CoBoostHP
    bn_per_teacher = True

    def init_teachers(self, state: State) -> State:
        n = len(state["teachers"])
        dev = next(iter(state["teachers"][0].values())).device
        return {**state, "ens_w": torch.full((n,), 1.0 / n, device=dev)}

    @staticmethod
    def _mix(w: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        """``sum_i w_i logits_i / sum_i w_i`` (the reference's WEnsemble)."""
        return torch.einsum("k,knc->nc", w, logits) / w.sum().clamp_min(1e-12)

    def ensemble_logits(self, nets, x, state):  # type: ignore[override]
        return self._mix(state["ens_w"], torch.stack([n(x) for n in nets]))

    def synthesis_loss(self, t_out: torch.Tensor, s_out: torch.Tensor, y: torch.Tensor,
                       loss_bn: torch.Tensor) -> torch.Tensor:
        hp = self.hp
        ce = F.cross_entropy(t_out, y, reduction="none")
        p_y = F.softmax(t_out, dim=1).gather(1, y[:, None]).squeeze(1).detach()
        loss_oh = ((1.0 - p_y).pow(hp.hs) * ce).mean()
        loss_adv = -kldiv(s_out, t_out, hp.adv_T)
        return hp.bn * loss_bn + hp.oh * loss_oh + hp.adv * loss_adv

    def after_synthesis(self, ctx: NodeContext, state: State, nets, pool_x, pool_y, shape) -> State:
        hp = self.hp
        if state["epoch"] == 0:  # the reference re-weights from the second epoch on
            return state
        mean, std = self._stats(ctx, shape)
        mu = hp.mu * hp.mu_decay ** state["epoch"]
        w = state["ens_w"].clone()
        gen = ctx.rng("reweight", state["epoch"])
        for step, idx in enumerate(batches(int(pool_x.shape[0]), hp.kd_batch, gen)):
            if hp.reweight_steps is not None and step >= hp.reweight_steps:
                break
            x = normalise(pool_x[idx].float(), mean, std)
            with torch.no_grad():
                logits = torch.stack([n(x) for n in nets])
            w = w.detach().requires_grad_()
            F.cross_entropy(self._mix(w, logits), pool_y[idx]).backward()
            w = projected_step(w.detach(), torch.sign(w.grad), mu)
        return {**state, "ens_w": w.detach()}

    def kd_inputs(self, ctx, x, nets, state, mean, std, gen):  # type: ignore[override]
        hp = self.hp
        xn = normalise(x, mean, std)
        if hp.odseta <= 0:
            return xn
        xn = xn.detach().clone().requires_grad_()
        out = self.ensemble_logits(nets, xn, state)
        r = torch.rand(out.shape, generator=gen).to(out.device) * 2 - 1
        (r * F.softmax(out / 4.0, dim=1)).sum().backward()
        return (xn + hp.odseta * torch.sign(xn.grad)).detach()

    def round_metrics(self, server_state: State) -> dict[str, float]:
        out = super().round_metrics(server_state)
        if "ens_w" in server_state:
            for i, v in enumerate(server_state["ens_w"].tolist()):
                out[f"{self.name}/w{i}"] = float(v)
        return out
