"""Sender-side transforms: local differential privacy before the codec.

A transform spec such as ``"clip(1.0)+gauss(0.5)"`` is parsed like a codec chain and
applied by the sender to every outgoing message *before* the codec encodes it (design:
"sender-side transforms before the codec, composable like codecs"), for server, peer and
one-shot methods alike: the receiver, and the ledger, see the noised message after the
codec.

- ``clip(S)``: scale the message's floating tensors together so that their joint L2 norm
  (all float tensors of the message as one vector) is at most ``S``;
- ``gauss(z)``: add N(0, (z * S)^2) to every float coordinate, ``S`` the clip before it
  (a ``gauss`` without a preceding ``clip`` is refused: its sensitivity is unbounded).

Stateless; the randomness is addressed (design rule 4) by
``(seed, "ldp", round, step, sender, link, kind)`` with ``link`` the receiver or
``"bcast"``, as the codec's is: a broadcast is one release, separate messages are
separate releases. Integer tensors and metadata pass untouched (``num_examples`` is
not protected: say so where it matters). Messages from the server are not transformed
(they carry no user's data beyond the aggregates already released).

Accounting (:func:`local_epsilon`): the adversary sees each message, so there is no
amplification by sampling, and a message can move from any vector of norm ``<= S`` to any
other, so the L2 sensitivity is ``2 S`` and each message is a Gaussian release of
multiplier ``z / 2``; a node's releases compose. :func:`releases_from_ledger` counts a
node's messages of a round from the ledger (a broadcast counts once per receiver there,
so the count is an upper bound).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Union

import torch

from ..comm.message import SERVER, Message
from ..seeding import torch_gen

MAX_TRANSFORMS = 8


@dataclass(frozen=True)
class Clip:
    """Joint L2 clipping of a message's float tensors to ``bound``."""

    bound: float

    @property
    def spec(self) -> str:
        return f"clip({self.bound:g})"


@dataclass(frozen=True)
class Gauss:
    """Gaussian noise of std ``multiplier * S`` (``S`` the preceding clip)."""

    multiplier: float

    @property
    def spec(self) -> str:
        return f"gauss({self.multiplier:g})"


Term = Union[Clip, Gauss]
TRANSFORMS: dict[str, str] = {
    "clip": "clip(S): the message's float tensors scaled to joint L2 norm at most S",
    "gauss": "gauss(z): N(0, (z*S)^2) added to every float coordinate (S: the clip before it)",
}


def _number(text: str, term: str, spec: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise ValueError(f"bad argument {text!r} of {term!r} in transform {spec!r}: write a number") from None
    if not (v > 0 and math.isfinite(v)):
        raise ValueError(f"{term!r} in transform {spec!r}: the argument must be a positive number")
    return v


def parse_transform(spec: str) -> "SenderTransform":
    """The transform of a spec such as ``"clip(1.0)+gauss(0.5)"`` (one-line ValueError otherwise)."""
    from ..comm.codecs import split_top

    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"empty transform spec {spec!r}; known transforms: {', '.join(TRANSFORMS)}")
    terms: list[Term] = []
    parts = split_top(spec.replace(" ", ""), "+")
    if len(parts) > MAX_TRANSFORMS:
        raise ValueError(f"transform spec chains {len(parts)} terms; the limit is {MAX_TRANSFORMS}")
    for t in parts:
        name, _, rest = t.partition("(")
        if name not in TRANSFORMS or not rest.endswith(")"):
            raise ValueError(f"bad transform {t!r} in {spec!r}; known transforms: {'; '.join(TRANSFORMS.values())}")
        v = _number(rest[:-1], t, spec)
        if name == "clip":
            if terms:
                raise ValueError(f"transform {spec!r}: one clip(S), first (clip(S) or clip(S)+gauss(z))")
            terms.append(Clip(v))
        else:
            if not terms:
                raise ValueError(f"transform {spec!r}: gauss(z) needs a clip(S) before it (noise is z * S; "
                                 f"without a clip the sensitivity is unbounded), e.g. clip(1.0)+gauss({v:g})")
            terms.append(Gauss(v))
    return SenderTransform(tuple(terms))


@dataclass(frozen=True)
class SenderTransform:
    """A chain of :class:`Clip` / :class:`Gauss` applied to a message's float tensors."""

    terms: tuple[Term, ...]

    @property
    def spec(self) -> str:
        return "+".join(t.spec for t in self.terms)

    @property
    def noise_multiplier(self) -> float:
        """The Gaussian multiplier relative to the clip (sqrt of the sum of squares of the
        ``gauss`` terms); inf without noise (no privacy)."""
        z2 = sum(t.multiplier**2 for t in self.terms if isinstance(t, Gauss))
        return math.inf if z2 == 0 else math.sqrt(z2)

    @property
    def clip(self) -> float:
        return next(t.bound for t in self.terms if isinstance(t, Clip))

    def apply(self, tensors: dict[str, torch.Tensor], gen: torch.Generator) -> dict[str, torch.Tensor]:
        """New float tensors (others as given); draws noise from ``gen`` in the tensors' order."""
        out = dict(tensors)
        names = [k for k, v in tensors.items() if v.is_floating_point()]
        bound: Optional[float] = None
        for t in self.terms:
            if isinstance(t, Clip):
                norm = math.sqrt(sum(float(out[k].detach().double().pow(2).sum()) for k in names))
                if norm > t.bound:
                    f = t.bound / norm
                    out.update({k: out[k] * f for k in names})
                bound = t.bound
            else:
                std = t.multiplier * float(bound)  # type: ignore[arg-type]
                out.update({k: out[k] + torch.randn(out[k].shape, generator=gen, dtype=out[k].dtype).to(out[k].device)
                            * std for k in names})
        return out

    def __call__(self, msg: Message, *, seed: int, round: int, step: int, src: int,
                 link: Union[int, str]) -> Message:
        """``msg`` as ``src`` sends it on ``link`` in (``round``, ``step``): clipped and noised
        (a new message; ``msg`` is not changed). The server's messages pass unchanged."""
        if int(src) == SERVER:
            return msg
        gen = torch_gen(seed, "ldp", int(round), int(step), int(src),
                        link if isinstance(link, str) else int(link), msg.kind)
        return Message(kind=msg.kind, tensors=self.apply(msg.tensors, gen), meta=dict(msg.meta),
                       declared=dict(msg.declared), stand_in=dict(msg.stand_in))


def local_epsilon(multiplier: float, releases: int, delta: float, method: str = "rdp") -> float:
    """Epsilon at ``delta`` of ``releases`` messages through ``clip(S)+gauss(z)`` (multiplier
    ``z / 2`` each: a message moves by up to ``2 S``; no amplification by sampling)."""
    from .accountant import SampledGaussian, final_epsilon

    if releases <= 0:
        return 0.0
    if not math.isfinite(multiplier):
        return math.inf
    return final_epsilon(SampledGaussian(multiplier / 2, 1, 1, "all"), releases, delta, method)  # type: ignore[arg-type]


def releases_from_ledger(ledger, round: int) -> dict[int, int]:
    """Messages each non-server node sent in ``round`` (ledger records; a broadcast counts once
    per receiver there, so this is an upper bound on releases). SecAgg kinds are excluded."""
    cols = ledger.columns()
    kinds = list(ledger.kinds)
    keep = [i for i, k in enumerate(kinds) if not k.startswith("secagg_")]
    m = (cols["round"] == round) & (cols["src"] != SERVER)
    if len(keep) < len(kinds):
        import numpy as np

        m &= np.isin(cols["kind"], keep)
    out: dict[int, int] = {}
    for s in cols["src"][m].tolist():
        out[int(s)] = out.get(int(s), 0) + 1
    return out


class LocalDPTrack:
    """Epsilon of local DP per round, from the releases each node really made (the worst node).

    The run's observer calls :meth:`observe` at the end of each round with
    :func:`releases_from_ledger` and then :meth:`metrics`; :meth:`summary` at the end."""

    def __init__(self, multiplier: float, delta: float, method: str = "rdp") -> None:
        self.multiplier, self.delta, self.method = float(multiplier), float(delta), method
        self.releases: dict[int, int] = {}
        self._eps: dict[int, float] = {}

    def observe(self, round: int, releases_by_node: dict[int, int]) -> None:
        for n, c in releases_by_node.items():
            self.releases[n] = self.releases.get(n, 0) + int(c)
        worst = max(self.releases.values(), default=0)
        if worst not in self._eps:
            self._eps[worst] = local_epsilon(self.multiplier, worst, self.delta, self.method)
        self._last = (worst, self._eps[worst])

    def metrics(self, round: int) -> dict[str, float]:
        worst, eps = getattr(self, "_last", (0, 0.0))
        return {"dp/local_epsilon": eps, "dp/delta": self.delta, "dp/local_releases": float(worst)}

    def summary(self) -> dict[str, object]:
        return {**self.metrics(-1), "dp/accountant": self.method}
