"""Which clients a Flower run's evaluation asks, and what the ServerApp makes of their numbers.

``lowband run`` scores ``personal`` and ``node_global`` on the evaluator's nodes (every
client, or the ``eval.nodes`` sample drawn once from the seed) and ``personal_joined`` on
the clients that have been a round's participant so far; ``global`` needs no client at
all. The ServerApp asks exactly those clients, each once per evaluation and only for the
per-client numbers some protocol will use: a ``global``-only run sends no ``evaluate``
message, a run with ``eval.nodes = 10`` sends 10 whatever the population. Every message
the Flower runtime carries costs it a few milliseconds (its message store, serialisation,
the ClientApp call), so a protocol over every client costs a message to every client:
that part of a Flower round is the protocol's, not the adapter's.

On the client, a ``personal`` score of an algorithm whose clients keep no model of their
own reads the server's model only, so the client's state is not loaded; the server's model
arrives as the same bytes in every message of a round, so a ClientApp process decodes it
once per round (:class:`ParamsCache`) and compares the bytes of the next message with them.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Optional, Sequence

import torch

from lowband.engine.evaluation import Evaluator, node_global_summary, personal_summary

__all__ = ["CLIENT_PROTOCOLS", "asked", "summaries", "needs_state", "ParamsCache"]

#: the protocols the ServerApp scores from its clients' numbers
CLIENT_PROTOCOLS = ("personal", "personal_joined", "node_global")


def _scored_by(protocols: Sequence[str], evaluator: Evaluator, r: int) -> dict[str, list[int]]:
    """Each client protocol of ``protocols`` -> the clients it scores in round ``r`` (as
    :class:`~lowband.engine.evaluation.Evaluator` does: its ``nodes``; ``joined(r)``)."""
    out: dict[str, list[int]] = {}
    for p in CLIENT_PROTOCOLS:  # the evaluator's order, whatever the config's
        if p not in protocols:
            continue
        if p in ("personal", "node_global"):
            out[p] = list(evaluator.nodes)
        elif p == "personal_joined":
            out[p] = evaluator.joined(r)
    return out


def asked(protocols: Sequence[str], evaluator: Evaluator, r: int) -> dict[int, list[str]]:
    """Client -> the per-client numbers it is asked for in round ``r`` (``"personal"``,
    ``"node_global"``; ``personal_joined`` is ``personal`` numbers on other clients),
    in client order. Empty when no protocol needs a client (``global`` only)."""
    want: dict[int, set[str]] = {}
    for p, nodes in _scored_by(protocols, evaluator, r).items():
        numbers = "node_global" if p == "node_global" else "personal"
        for c in nodes:
            want.setdefault(int(c), set()).add(numbers)
    return {c: [n for n in ("personal", "node_global") if n in want[c]] for c in sorted(want)}


def summaries(protocols: Sequence[str], evaluator: Evaluator, r: int,
              got: Mapping[int, Mapping[str, Any]]) -> dict[str, Any]:
    """The protocols' metrics from the clients' checked numbers ``got`` (client -> numbers),
    in :class:`~lowband.engine.evaluation.Evaluator`'s order and with its aggregation.
    A client whose reply was refused or missing is left out; a protocol no client answered
    writes nothing (``personal_joined/n`` is written always: 0 before anyone joined)."""
    rec: dict[str, Any] = {}
    for p, nodes in _scored_by(protocols, evaluator, r).items():
        have = [c for c in nodes if c in got]
        if p == "node_global":
            if have:
                rec.update(node_global_summary([got[c]["node_global/acc"] for c in have],
                                               [got[c]["node_global/loss"] for c in have]))
            continue
        ns = [got[c]["personal/n"] for c in have]
        if have:
            rec.update(personal_summary(p, [got[c]["personal/acc"] for c in have],
                                        [got[c]["personal/loss"] for c in have], ns))
        if p == "personal_joined":
            rec[f"{p}/n"] = float(sum(1 for x in ns if x > 0))
    return rec


def needs_state(numbers: Sequence[str], personalized: bool) -> bool:
    """Whether a client's own state enters the numbers it is asked for: ``node_global``
    scores its model, ``personal`` its model only for a personalised algorithm (else the
    server's model, which the message carries)."""
    return "node_global" in numbers or ("personal" in numbers and personalized)


class ParamsCache:
    """The server's model of the latest ``evaluate`` message, decoded once: a message
    carrying the same bytes gets the same (read-only) tensors without decoding again;
    other bytes are decoded (and checked) by ``decode`` and replace them."""

    def __init__(self) -> None:
        self._data: Optional[bytes] = None
        self._tensors: Optional[dict[str, torch.Tensor]] = None
        self.decoded = 0  # how many times bytes were decoded (a test reads it)

    def get(self, data: Any, decode: Callable[[Any], dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        if self._tensors is not None and isinstance(data, (bytes, bytearray)) and data == self._data:
            return self._tensors
        tensors = decode(data)  # raises on bytes it refuses: nothing is kept
        self._data, self._tensors = bytes(data), tensors
        self.decoded += 1
        return tensors
