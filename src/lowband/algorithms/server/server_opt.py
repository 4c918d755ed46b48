"""Server optimisers on the averaged client update (Reddi et al., "Adaptive Federated
Optimization", ICLR 2021, Algorithm 2; FedAvgM: Hsu, Qi and Brown, 2019).

The server treats the averaged client delta Delta_t = sum_i p_i (w_i - x_t) as a
pseudo-gradient (a step direction, so it is *added*) and keeps the optimiser's moments in
its own state (checkpointed with it, so a resumed run continues identically):

- ``sgd``      x <- x + eta Delta                                   (FedAvg; eta = 1: averaging)
- ``avgm``     m <- beta m + Delta;  x <- x + eta m                 (FedAvgM, server momentum)
- ``adagrad``  m <- b1 m + (1 - b1) Delta;  v <- v + Delta^2
- ``adam``     m as adagrad;  v <- b2 v + (1 - b2) Delta^2
- ``yogi``     m as adagrad;  v <- v - (1 - b2) Delta^2 sign(v - Delta^2)
  and for the three adaptive ones x <- x + eta m / (sqrt(v) + tau).

As in the paper's Algorithm 2 there is no bias correction, m starts at 0 and v at tau^2
(the paper asks v_{-1} >= tau^2). Defaults (:data:`DEFAULT_SERVER_LR` and the knobs of
``FedAvgHP``): b1 = 0.9, b2 = 0.99, tau = 1e-3 (the paper's experiments);
server learning rates from the paper's table of best learning rates (its CIFAR-10 row:
10^-2 for FedAdam and FedYogi, 10^-1 for FedAdagrad, 10^0 for FedAvgM with momentum 0.9).
The adaptive optimisers step the model's trainable parameters only; floating buffers
(BatchNorm running statistics) follow the averaged models (x + Delta), as in the paper's
TFF code where non-trainable weights are not part of the server optimiser's update.
"""

from __future__ import annotations

from typing import Any, Literal, Optional

import torch

from lowband.train import Params, add_scaled, is_float

ServerOpt = Literal["sgd", "avgm", "adam", "yogi", "adagrad"]
SERVER_OPTS: tuple[str, ...] = ("sgd", "avgm", "adam", "yogi", "adagrad")
#: server learning rate when ``server_lr`` is unset (Reddi et al. 2021, best-rate table, CIFAR-10)
DEFAULT_SERVER_LR: dict[str, float] = {"sgd": 1.0, "avgm": 1.0, "adam": 1e-2, "yogi": 1e-2, "adagrad": 1e-1}
#: what each optimiser is (``lowband list server_opts``)
SERVER_OPT_INFO: dict[str, str] = {
    "sgd": "x <- x + eta Delta: plain FedAvg (eta = 1: the average of the client models)",
    "avgm": "FedAvgM (Hsu, Qi and Brown 2019): server momentum m <- beta m + Delta; x <- x + eta m",
    "adam": "FedAdam (Reddi et al. 2021): v <- b2 v + (1 - b2) Delta^2; x <- x + eta m / (sqrt(v) + tau)",
    "yogi": "FedYogi (Reddi et al. 2021): v <- v - (1 - b2) Delta^2 sign(v - Delta^2); x <- x + eta m / (sqrt(v) + tau)",
    "adagrad": "FedAdagrad (Reddi et al. 2021): v <- v + Delta^2; x <- x + eta m / (sqrt(v) + tau)",
}


def server_opt_params(opt: str, hp_fields: dict[str, Any]) -> dict[str, Any]:
    """The knobs ``opt`` reads with their defaults (``server_lr`` by optimiser), from the
    FedAvg hyperparameter fields ``hp_fields`` (pydantic ``model_fields``)."""
    out: dict[str, Any] = {"server_lr": DEFAULT_SERVER_LR[opt]}
    for knob, readers in KNOB_READERS.items():
        if opt in readers:
            out[knob] = hp_fields[knob].default
    return out


#: which optimisers read each knob (a knob set for another optimiser is refused)
KNOB_READERS: dict[str, tuple[str, ...]] = {
    "server_momentum": ("avgm",),
    "beta1": ("adam", "yogi", "adagrad"),
    "beta2": ("adam", "yogi"),
    "tau": ("adam", "yogi", "adagrad"),
}


def init_state(opt: str, params: Params, trainable: set[str], tau: float) -> dict[str, Params]:
    """The optimiser's initial moments: m = 0 (avgm, adaptive), v = tau^2 (adaptive)."""
    if opt == "sgd":
        return {}
    names = [k for k, v in params.items() if is_float(v) and (opt == "avgm" or k in trainable)]
    state: dict[str, Params] = {"m": {k: torch.zeros_like(params[k]) for k in names}}
    if opt != "avgm":
        state["v"] = {k: torch.full_like(params[k], tau * tau) for k in names}
    return state


def second_moment(opt: str, v: torch.Tensor, d2: torch.Tensor, beta2: float) -> torch.Tensor:
    """v_t from v_{t-1} and Delta_t^2 (the one line where FedAdagrad, FedAdam and FedYogi differ)."""
    if opt == "adagrad":
        return v + d2
    if opt == "adam":
        return beta2 * v + (1 - beta2) * d2
    if opt == "yogi":
        return v - (1 - beta2) * d2 * torch.sign(v - d2)
    raise ValueError(f"no second moment for server_opt {opt!r}")


def server_step(hp: Any, x: Params, delta: Params, state: Optional[dict[str, Params]],
                trainable: set[str]) -> tuple[Params, dict[str, Params]]:
    """One server step of ``hp.server_opt`` from model ``x`` along pseudo-gradient ``delta``.

    ``state`` is the optimiser state of the previous step (None or empty: initial);
    returns the new model and state. ``trainable`` names the model's parameters."""
    opt, eta = hp.server_opt, float(hp.server_lr)
    if opt == "sgd":
        return add_scaled(x, delta, eta), {}
    state = state or init_state(opt, x, trainable, hp.tau)
    if opt == "avgm":
        m = {k: hp.server_momentum * state["m"][k] + delta[k] for k in state["m"]}
        return add_scaled(x, {**delta, **m}, eta), {"m": m}
    b1 = hp.beta1
    m = {k: b1 * state["m"][k] + (1 - b1) * delta[k] for k in state["m"]}
    v = {k: second_moment(opt, state["v"][k], delta[k] * delta[k], hp.beta2) for k in state["v"]}
    new = {}
    for k, t in x.items():
        if k in m:
            new[k] = t + eta * m[k] / (torch.sqrt(v[k]) + hp.tau)
        elif is_float(t):
            new[k] = t + delta[k]  # buffers follow the averaged models
        else:
            new[k] = t.clone()
    return new, {"m": m, "v": v}


def trainable_names(model: torch.nn.Module) -> set[str]:
    """The names of ``model``'s parameters (the entries the adaptive optimisers step)."""
    return {k for k, _ in model.named_parameters()}
