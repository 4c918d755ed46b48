"""A node's view of its inbox (used by every executor and by the cohort path)."""

from __future__ import annotations

from lowband.algorithms.base import Envelope


def own_inbox(inboxes: dict[int, list[Envelope]], node: int) -> list[Envelope]:
    """``node``'s inbox with a private copy of every shared (broadcast) message: a broadcast's
    decoded message is held once for all its receivers (memory), and each receiver gets its
    own copy only when its step runs, so the copies do not pile up and no receiver's writes
    reach another's."""
    return [Envelope(e.src, e.msg.clone()) if e.shared else e for e in inboxes.get(node, [])]
