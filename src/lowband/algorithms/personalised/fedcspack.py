"""FedCSPACK (Yang et al., "Tackling Resource-Constrained and Data-Heterogeneity in
Federated Learning with Double-Weight Sparse Pack", AAAI 2026; code NigeloYang/FedCSPACK).

Round t (read from the paper, algorithm 1, and the authors' code; specs/fedcspack.md):

server -> sampled clients: the global model W^t (``paper`` variant: and the global mask
M^t, one float32 per pack, sent dense: it is ~0.4% of the model and the client needs
every entry).

client i:
  1. merge: ``paper``: take global pack j where M^t[j] != 0, keep its own pack elsewhere;
     ``code``: overwrite the whole model with W^t (the authors' code).
  2. train E local epochs of SGD (cross-entropy).
  3. flatten parameters (registration order, no buffers) of W_i and W^t, zero-pad to a
     multiple of PACK, cut into packs (packs cross layer boundaries).
  4. theta_a = cos(FW_i, FW); theta_ij = cos(PW_ij, PW_j); beta_ij =
     KL(softmax(PW_j / T) || softmax(PW_ij / T)) (the code's ``F.kl_div`` direction, T = 1).
  5. select every pack with theta_ij < theta_a (strict); ``top_k_ratio`` optionally keeps
     only the ceil(ratio * n_packs) lowest-theta packs among those.
  6. mask M_ij = |theta_ij + beta_ij| (``mask="double"``), |theta_ij| (``"cosine"``) or
     |beta_ij| (``"kl"``) on the selected packs, 0 elsewhere.
  7. upload the selected packs of the delta W_i - W^t (float32, PACK values each) and the
     mask as (int32 index, float32 value) pairs: exactly these tensors are in the Message.

server: S_j = sum_i M_ij; for each pack j someone sent,
  W_j <- W_j + sum_{i sent j} (M_ij / S_j) delta_ij  (normalised over senders only, sample
  counts unused); packs nobody sent are unchanged; M^{t+1} = S.

Interpretation choices (docs/algorithms/fedcspack.md has the reasons):

- A selected pack whose mask value is exactly 0 carries no weight; it is not uploaded
  (the authors' server skips ``val == 0`` as well).
- ``paper`` variant, first participation: a client that has never trained holds the shared
  initial model and no "unique features", so by default (``first_merge="full"``) it takes
  the whole global model; ``first_merge="mask"`` applies the mask rule literally.
- ``paper`` variant clients are personalised (``personalized = True``): the ``personal``
  protocol evaluates the model each client holds (its last trained model; the initial
  model for a client never sampled). ``code`` variant clients are stateless like FedAvg's
  (``personalized = False``): ``personal`` evaluates the global model on every client's
  local test split (the authors' code evaluates the global model it just sent).
- BatchNorm running statistics are not packed and never travel (as in the authors' code):
  the global buffers stay at their initial values; ``paper`` clients keep their own.
"""

from __future__ import annotations

import math
from typing import Literal, Optional, Sequence

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from lowband.algorithms.base import SERVER, Envelope, NodeContext, Outbox, Params, State, register
from lowband.algorithms.common import LocalSGD, local_train
from lowband.algorithms.server.fedavg import FedAvg
from lowband.comm.message import Message

MASK_KEY = "global_mask"
"""Name of the global-mask tensor in the ``paper`` variant's download."""


class FedCSPACKHP(LocalSGD):
    lr: float = Field(0.05, gt=0, description="client learning rate (authors' main.py default)")
    batch_size: int = Field(16, ge=1, description="client minibatch size (authors' main.py default)")
    local_epochs: int = Field(3, ge=0, description="client epochs per round (authors' main.py default)")
    pack: int = Field(1024, ge=1, description="PACK: parameters per pack")
    variant: Literal["paper", "code"] = Field(
        "paper", description="paper: global mask broadcast + personalised merge; code: full overwrite, no mask down")
    mask: Literal["double", "cosine", "kl"] = Field(
        "double", description="mask value: |cos + KL| (double weight), |cos| or |KL| (ablations)")
    kl_temperature: float = Field(1.0, gt=0, description="softmax temperature of the per-pack KL (1 = the code)")
    top_k_ratio: Optional[float] = Field(
        None, gt=0, le=1, description="optional cap: keep at most ceil(ratio * n_packs) lowest-cosine selected packs")
    first_merge: Literal["full", "mask"] = Field(
        "full", description="paper variant, a client's first participation: take the whole global model, or apply the mask rule")


# --------------------------------------------------------------------------- pack maths


def param_names(model: nn.Module) -> list[str]:
    """Names of the model's parameters in registration order (no buffers)."""
    return [n for n, _ in model.named_parameters()]


def flatten_params(params: Params, names: Sequence[str]) -> torch.Tensor:
    """The named tensors concatenated into one float32 vector."""
    return torch.cat([params[n].reshape(-1).to(torch.float32) for n in names])


def unflatten_params(flat: torch.Tensor, like: Params, names: Sequence[str]) -> Params:
    """``like`` with the named tensors replaced by consecutive slices of ``flat`` (padding ignored)."""
    out = dict(like)
    at = 0
    for n in names:
        t = like[n]
        k = t.numel()
        out[n] = flat[at:at + k].reshape(t.shape).to(t.dtype).clone()
        at += k
    if at > flat.numel():
        raise ValueError(f"unflatten_params: vector of {flat.numel()} values, model needs {at}")
    return out


def num_packs(numel: int, pack: int) -> int:
    return max(1, math.ceil(numel / pack))


def cut_packs(flat: torch.Tensor, pack: int) -> torch.Tensor:
    """Zero-pad ``flat`` to a multiple of ``pack`` and reshape to ``(n_packs, pack)``."""
    n = num_packs(flat.numel(), pack)
    pad = n * pack - flat.numel()
    if pad:
        flat = torch.cat([flat, flat.new_zeros(pad)])
    return flat.reshape(n, pack)


def pack_scores(local: torch.Tensor, glob: torch.Tensor, temperature: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-pack cosine theta_j and KL beta_j = KL(softmax(glob_j/T) || softmax(local_j/T))."""
    theta = F.cosine_similarity(local, glob, dim=1)
    beta = F.kl_div(F.log_softmax(local / temperature, dim=1), F.softmax(glob / temperature, dim=1),
                    reduction="none").sum(dim=1)
    return theta, beta


def select_packs(theta: torch.Tensor, theta_a: float, top_k_ratio: Optional[float] = None) -> torch.Tensor:
    """Indices (sorted, int64) of the packs with theta_j < theta_a, optionally capped to the
    ceil(ratio * n) lowest-theta ones."""
    idx = torch.nonzero(theta < theta_a, as_tuple=False).flatten()
    if top_k_ratio is not None:
        k = math.ceil(top_k_ratio * theta.numel())
        if idx.numel() > k:
            order = torch.argsort(theta[idx], stable=True)[:k]
            idx = idx[order]
    return torch.sort(idx).values


def mask_values(theta: torch.Tensor, beta: torch.Tensor, kind: str) -> torch.Tensor:
    """The mask weight of every pack (before restricting to the selected ones)."""
    if kind == "double":
        return (theta + beta).abs()
    if kind == "cosine":
        return theta.abs()
    if kind == "kl":
        return beta.abs()
    raise ValueError(f"mask must be double, cosine or kl; got {kind!r}")


def client_packs(local: Params, glob: Params, names: Sequence[str], pack: int, mask: str = "double",
                 temperature: float = 1.0, top_k_ratio: Optional[float] = None
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, float]:
    """Steps 3-7 on a client: (indices int32, mask values float32, delta packs (k, pack), theta_a)."""
    fl, fg = flatten_params(local, names), flatten_params(glob, names)
    theta_a = float(F.cosine_similarity(fl, fg, dim=0))
    lp, gp = cut_packs(fl, pack), cut_packs(fg, pack)
    theta, beta = pack_scores(lp, gp, temperature)
    idx = select_packs(theta, theta_a, top_k_ratio)
    vals = mask_values(theta, beta, mask)[idx]
    keep = vals > 0
    idx, vals = idx[keep], vals[keep]
    delta = (lp - gp)[idx]
    return idx.to(torch.int32), vals.to(torch.float32), delta.contiguous(), theta_a


def aggregate_packs(glob_packs: torch.Tensor, uploads: Sequence[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """Mask-normalised aggregation: returns (new global packs, S = summed masks per pack).

    ``uploads``: (indices, mask values, delta packs) per sender. For each pack j with
    S_j > 0: ``glob_j + sum_i (M_ij / S_j) delta_ij``; other packs are unchanged.
    """
    n, pack = glob_packs.shape
    S = torch.zeros(n, dtype=torch.float32, device=glob_packs.device)
    num = torch.zeros(n, pack, dtype=torch.float32, device=glob_packs.device)
    for idx, vals, packs in uploads:
        idx = idx.to(torch.int64).flatten()
        vals = vals.to(torch.float32).flatten()
        if idx.numel() != vals.numel() or packs.shape != (idx.numel(), pack):
            raise ValueError(f"fedcspack upload: {idx.numel()} indices, {vals.numel()} mask values, "
                             f"packs of shape {tuple(packs.shape)} (expected ({idx.numel()}, {pack}))")
        if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= n):
            raise ValueError(f"fedcspack upload: pack index out of range 0..{n - 1}")
        if idx.unique().numel() != idx.numel():
            raise ValueError("fedcspack upload: a pack index appears twice")
        S.index_add_(0, idx, vals)
        num.index_add_(0, idx, vals[:, None] * packs.to(torch.float32))
    new = glob_packs.clone()
    hit = S > 0
    new[hit] += num[hit] / S[hit, None]
    return new, S


def merge_packs(local_packs: torch.Tensor, glob_packs: torch.Tensor, gmask: torch.Tensor) -> torch.Tensor:
    """``paper`` merge: the global pack where the global mask is non-zero, the local one elsewhere."""
    take = (gmask != 0)[:, None]
    return torch.where(take, glob_packs, local_packs)


# --------------------------------------------------------------------------- algorithm


@register
class FedCSPACK(FedAvg):
    """Cosine-selected parameter packs with double-weight mask aggregation."""

    name = "fedcspack"
    family = "server"
    paper = ("Yang et al., Tackling Resource-Constrained and Data-Heterogeneity in Federated Learning "
             "with Double-Weight Sparse Pack (FedCSPACK), AAAI 2026")
    Hyperparams = FedCSPACKHP
    default_protocols = ("global", "personal")
    default_main = "personal/acc_weighted"
    personalized = True  # per instance: False for the ``code`` variant (see __init__)

    def __init__(self, hp: FedCSPACKHP):
        super().__init__(hp)
        self.personalized = hp.variant == "paper"

    # -- state ------------------------------------------------------------------------
    def init_node(self, ctx: NodeContext) -> State:
        if self.hp.variant == "code":
            return {}
        return {"params": ctx.init_params(), "joined": False}

    def init_server(self, ctx: NodeContext) -> State:
        params = ctx.init_params()
        n = num_packs(sum(params[k].numel() for k in param_names(ctx.model)), self.hp.pack)
        dev = next(iter(params.values())).device
        return {"params": params, "mask": torch.zeros(n, dtype=torch.float32, device=dev)}

    def node_params(self, state: State) -> Optional[Params]:
        return state.get("params") if self.hp.variant == "paper" else None

    def round_metrics(self, server_state: State) -> dict[str, float]:
        """``alg/packs_per_client``: mean fraction of packs a client sent this round;
        ``alg/packs_updated``: fraction of packs someone sent (the global mask's support)."""
        return dict(server_state.get("stats", {}))

    # -- server -----------------------------------------------------------------------
    def server_broadcast(self, ctx: NodeContext, state: State, inbox: list[Envelope]) -> tuple[State, Outbox]:
        tensors = dict(state["params"])
        if self.hp.variant == "paper":
            tensors[MASK_KEY] = state["mask"]
        return state, Outbox().broadcast(ctx.participants, Message("weights", tensors))

    def server_aggregate(self, ctx: NodeContext, state: State, inbox: list[Envelope]) -> tuple[State, Outbox]:
        if not inbox:
            return {**state, "mask": torch.zeros_like(state["mask"]), "stats": {}}, Outbox()
        names = param_names(ctx.model)
        glob = state["params"]
        gp = cut_packs(flatten_params(glob, names), self.hp.pack)
        uploads = [(e.msg.tensors["idx"], e.msg.tensors["mask"], e.msg.tensors["packs"]) for e in inbox]
        new_packs, S = aggregate_packs(gp, uploads)
        new = unflatten_params(new_packs.reshape(-1), glob, names)
        n = float(gp.shape[0])
        stats = {"packs_per_client": sum(float(u[0].numel()) for u in uploads) / len(uploads) / n,
                 "packs_updated": float((S > 0).sum()) / n}
        return {**state, "params": new, "mask": S, "stats": stats}, Outbox()

    # -- client -----------------------------------------------------------------------
    def start_model(self, ctx: NodeContext, state: State, glob: Params, gmask: Optional[torch.Tensor]) -> Params:
        """Step 1: the model local training starts from."""
        if self.hp.variant == "code" or gmask is None:
            return dict(glob)
        if not state.get("joined", False) and self.hp.first_merge == "full":
            return dict(glob)
        names = param_names(ctx.model)
        own = state["params"]
        lp = cut_packs(flatten_params(own, names), self.hp.pack)
        gp = cut_packs(flatten_params(glob, names), self.hp.pack)
        if gmask.numel() != gp.shape[0]:
            raise ValueError(f"fedcspack: global mask has {gmask.numel()} entries, model has {gp.shape[0]} packs")
        merged = merge_packs(lp, gp, gmask)
        return unflatten_params(merged.reshape(-1), own, names)  # buffers: the client's own

    def client_update(self, ctx: NodeContext, state: State, inbox: list[Envelope]) -> tuple[State, Outbox]:
        received = inbox[0].msg.tensors
        gmask = received.get(MASK_KEY)
        glob = {k: v for k, v in received.items() if k != MASK_KEY}
        start = self.start_model(ctx, state, glob, gmask)
        local, _ = local_train(ctx, start)
        hp = self.hp
        idx, vals, delta, theta_a = client_packs(local, glob, param_names(ctx.model), hp.pack, hp.mask,
                                                 hp.kl_temperature, hp.top_k_ratio)
        # nothing else travels: the server uses neither sample counts nor losses
        msg = Message("packs", {"idx": idx, "mask": vals, "packs": delta})
        new_state = {"params": local, "joined": True} if hp.variant == "paper" else {}
        return new_state, Outbox().send(SERVER, msg)
