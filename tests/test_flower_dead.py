"""A SuperNode that dies mid-run is recorded as dead, not as a hostile sender.

Flower answers a message to a node that is gone with an error reply of its own: code
NODE_UNAVAILABLE, and the SuperLink's id (0) as its sender. The adapter used to match replies
by sender only, so it counted a reply "from a node that was not asked" (hostile) plus a
missing reply. Now the reply is matched by the message it answers and counted as
``rejected/dead``, and nothing else.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("flwr", reason="the Flower adapter needs the extra: pip install 'lowband[flower]'")

from flwr.app import Error, Message  # noqa: E402
from flwr.common.constant import ErrorCode  # noqa: E402

from lowband.config import validate  # noqa: E402
from lowband.flower import FlowerRun, client_app  # noqa: E402
from test_flower import InProcessGrid, _config, task_identity  # noqa: E402,F401


class DyingGrid(InProcessGrid):
    """Messages get ids as a SuperLink gives them; partition ``dead`` is gone from round 1 on."""

    def __init__(self, app, num_nodes: int, dead: int):
        super().__init__(app, num_nodes)
        self.dead, self.n = dead, 0

    def send_and_receive(self, messages, *, timeout=None):
        out = []
        for m in messages:
            self.n += 1
            m.metadata.__dict__["_message_id"] = f"msg-{self.n}"
            nid = m.metadata.dst_node_id
            if nid - 100 == self.dead and m.metadata.message_type == "train":
                rep = Message(Error(ErrorCode.NODE_UNAVAILABLE, "node unavailable"), reply_to=m)
                rep.metadata.__dict__["_src_node_id"] = 0  # the SuperLink's id, as Flower sends it
                out.append(rep)
            else:
                out.append(self.app(m, self.contexts[nid]))
        return out


def test_a_dead_supernode_is_dead_not_hostile(tmp_path: Path, task_identity) -> None:
    cfg = _config(tmp_path, "fedavg", "dead", 1)
    cfg["topology"] = {"kind": "star", "sampling": "all"}
    exp = validate(cfg)
    run = FlowerRun(exp, DyingGrid(client_app(exp), 10, dead=3))
    run.run()
    counts = {k: v for k, v in run.sim.counters.record(-1, 1).items() if k.startswith("rejected/") and v}
    assert counts == {"rejected/dead": 1}, counts
