"""A SuperNode that dies mid-run is recorded as dead, not as a hostile sender, and only
the bytes it may have received are counted.

Flower answers a message to a node that is gone with an error reply of its own: code
NODE_UNAVAILABLE, and the SuperLink's id (0) as its sender. The adapter used to match replies
by sender only, so it counted a reply "from a node that was not asked" (hostile) plus a
missing reply. Now the reply is matched by the message it answers and counted as
``rejected/dead``, and nothing else.

Flower's error reply does not say whether the node pulled the message before it went (it
carries none of the instruction's ``delivered_at``). What the ServerApp knows: a node the
SuperLink no longer listed as online when the message was pushed never pulled it; those
bytes are left out of ``bytes/down`` and the ledger. A node still listed may have pulled
it: counted as delivered.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

pytest.importorskip("flwr", reason="the Flower adapter needs the extra: pip install 'lowband[flower]'")

from flwr.app import Error, Message  # noqa: E402
from flwr.common.constant import ErrorCode  # noqa: E402

from lowband.config import validate  # noqa: E402
from lowband.engine.runfiles import check_folder  # noqa: E402
from lowband.flower import FlowerRun, client_app  # noqa: E402
from lowband.flower.adapter import RECORD  # noqa: E402
from test_flower import InProcessGrid, _config, task_identity  # noqa: E402,F401


class DyingGrid(InProcessGrid):
    """Messages get ids as a SuperLink gives them; partition ``dead`` is gone from round 1 on
    (it answers the claim, never a ``train`` message). ``listed``: whether the SuperLink
    still lists it as online once the clients are claimed (a node that died before its
    heartbeat ran out)."""

    def __init__(self, app, num_nodes: int, dead: int, listed: bool = False):
        super().__init__(app, num_nodes)
        self.dead, self.n, self.listed, self.claimed = dead, 0, listed, False
        self.lost = 0  # wire bytes of the train messages sent to the dead node

    def get_node_ids(self):
        gone = self.claimed and not self.listed
        return [nid for nid in self.contexts if not (gone and nid - 100 == self.dead)]

    def send_and_receive(self, messages, *, timeout=None):
        out = []
        for m in messages:
            self.n += 1
            m.metadata.__dict__["_message_id"] = f"msg-{self.n}"
            nid = m.metadata.dst_node_id
            if nid - 100 == self.dead and m.metadata.message_type == "train":
                self.lost += sum(len(b) for b in m.content[RECORD].get("in", []) or [])
                rep = Message(Error(ErrorCode.NODE_UNAVAILABLE, "node unavailable"), reply_to=m)
                rep.metadata.__dict__["_src_node_id"] = 0  # the SuperLink's id, as Flower sends it
                out.append(rep)
            else:
                out.append(self.app(m, self.contexts[nid]))
        self.claimed = self.claimed or any(m.metadata.message_type == "query" for m in messages)
        return out


def _run(tmp_path: Path, name: str, grid_of) -> tuple[FlowerRun, Path, object]:
    cfg = _config(tmp_path, "fedavg", name, 2)
    cfg["topology"] = {"kind": "star", "sampling": "all"}
    exp = validate(cfg)
    grid = grid_of(client_app(exp))
    run = FlowerRun(exp, grid)
    run.run()
    return run, exp.run_dir(), grid


def _down(folder: Path) -> tuple[list[int], dict[tuple[int, int], int]]:
    """bytes/down after each round (metrics.jsonl: the run's total so far) and the ledger's
    down bytes per (round, receiver)."""
    metrics = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines() if line.strip()]
    per = {}
    with open(folder / "ledger.csv", newline="") as f:
        for row in csv.DictReader(f):
            if row["direction"] == "down":
                key = (int(row["round"]), int(row["dst"]))
                per[key] = per.get(key, 0) + int(row["bytes"])
    return [int(m["bytes/down"]) for m in metrics if m["round"] > 0], per


def test_a_dead_supernode_is_dead_not_hostile(tmp_path: Path, task_identity) -> None:
    run, _, _ = _run(tmp_path, "dead", lambda app: DyingGrid(app, 10, dead=3))
    counts = {k: v for k, v in run.sim.counters.record(-1, 1).items() if k.startswith("rejected/") and v}
    assert counts == {"rejected/dead": 1}, counts


def test_only_delivered_bytes_are_counted(tmp_path: Path, task_identity) -> None:
    _, alive, _ = _run(tmp_path, "alive", lambda app: InProcessGrid(app, 10))
    _, gone, grid = _run(tmp_path, "gone", lambda app: DyingGrid(app, 10, dead=3))
    _, pulled, _ = _run(tmp_path, "pulled", lambda app: DyingGrid(app, 10, dead=3, listed=True))
    for folder in (alive, gone, pulled):
        assert check_folder(folder) is not None  # every file matches the run folder's manifest
    down_a, led_a = _down(alive)
    down_g, led_g = _down(gone)
    down_p, led_p = _down(pulled)
    # the dead node's train messages (round 1 and 2), as Flower would have carried them
    sizes = [led_a[(r, 3)] for r in (1, 2)]
    assert grid.lost == sum(sizes) > 0
    # never pulled: bytes/down smaller by exactly those messages' encoded sizes, round by round
    assert down_g == [down_a[0] - sizes[0], down_a[1] - sizes[0] - sizes[1]]
    assert (1, 3) not in led_g and (2, 3) not in led_g
    assert {k: v for k, v in led_a.items() if k[1] != 3} == led_g
    # may have been pulled before the node went: counted as delivered
    assert down_p == down_a and led_p == led_a
    # the ledger agrees with metrics.jsonl, round by round
    for down, led in ((down_a, led_a), (down_g, led_g), (down_p, led_p)):
        assert down == [sum(v for (r, _), v in led.items() if r <= q) for q in (1, 2)]
