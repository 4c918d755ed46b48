"""Freshness through Flower (issue 40, part 5): with ``comm.freshness`` every message a
ServerApp or ClientApp sends is stamped with its round and step; a client reply replayed
from an earlier round is refused with the counted reason ``stale`` and the global model is
the model of a run in which that client sent nothing; without the stamp the same replay is
accepted (what the issue found). A fresh run learns exactly what it learns unstamped."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import pytest

pytest.importorskip("flwr", reason="the Flower adapter needs the extra: pip install 'lowband[flower]'")

from flwr.app import ConfigRecord, Message, RecordDict  # noqa: E402

from lowband.config import validate  # noqa: E402
from lowband.flower import FlowerRun, client_app  # noqa: E402
from lowband.flower.adapter import RECORD  # noqa: E402
from test_flower import InProcessGrid, _config, task_identity  # noqa: E402,F401

REPLAYER = 3  # the partition whose round-2 reply is its round-1 reply again


class ReplayGrid(InProcessGrid):
    """The in-process Grid; partition :data:`REPLAYER`'s round-2 train reply is replaced by
    its round-1 reply's bytes (``mode = "replay"``) or by an empty reply (``"drop"``)."""

    def __init__(self, app, num_nodes: int, mode: Optional[str]):
        super().__init__(app, num_nodes)
        self.mode, self.saved = mode, None

    def send_and_receive(self, messages, *, timeout=None):
        out = []
        for m in messages:
            rep = self.app(m, self.contexts[m.metadata.dst_node_id])
            if m.metadata.dst_node_id - 100 == REPLAYER and m.metadata.message_type == "train" and self.mode:
                r = m.content[RECORD]["round"]
                if r == 1:
                    self.saved = list(rep.content[RECORD]["out"])
                elif r == 2:
                    data = self.saved if self.mode == "replay" else []
                    rec = {"n-out": len(data), **({"out": data} if data else {})}
                    rep = Message(RecordDict({RECORD: ConfigRecord(rec)}), reply_to=m)
            out.append(rep)
        return out


def _run(tmp_path: Path, name: str, fresh: bool, mode: Optional[str]) -> list[dict]:
    cfg = _config(tmp_path, "fedavg", name, rounds=2)
    cfg["topology"] = {"kind": "star", "sampling": "all"}  # the replayer takes part in both rounds
    cfg["comm"] = {"freshness": fresh}
    exp = validate(cfg)
    FlowerRun(exp, ReplayGrid(client_app(exp), 10, mode)).run()
    return [json.loads(x) for x in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]


def _model(rows: list[dict]) -> dict:
    return {k: v for k, v in rows[-1].items() if k.startswith("global/")}


def _rejected(rows: list[dict]) -> dict:
    out: dict = {}
    for r in rows:
        for k, v in r.items():
            if k.startswith("rejected/"):
                out[k] = out.get(k, 0) + v
    return out


def test_a_replayed_reply_is_refused_as_stale(tmp_path: Path, task_identity) -> None:
    replayed = _run(tmp_path, "replay", True, "replay")
    dropped = _run(tmp_path, "drop", True, "drop")
    assert _rejected(replayed) == {"rejected/stale": 1}  # counted, with its reason
    assert _rejected(dropped) == {}
    assert _model(replayed) == _model(dropped)  # nothing of the replay reached the model
    # the replayed bytes crossed the link: counted in the ledger all the same
    assert replayed[-1]["bytes/up"] > dropped[-1]["bytes/up"]


def test_without_the_stamp_the_replay_is_accepted(tmp_path: Path, task_identity) -> None:
    replayed = _run(tmp_path, "replay", False, "replay")
    dropped = _run(tmp_path, "drop", False, "drop")
    assert _rejected(replayed) == {}
    assert _model(replayed) != _model(dropped)  # the round-1 update was averaged into round 2


def test_a_fresh_flower_run_learns_the_same_and_counts_the_stamp(tmp_path: Path, task_identity) -> None:
    plain = _run(tmp_path, "plain", False, None)
    fresh = _run(tmp_path, "fresh", True, None)
    assert _rejected(fresh) == {}  # the clients' and the server's step numbers agree
    assert _model(fresh) == _model(plain)
    assert fresh[-1]["bytes/total"] > plain[-1]["bytes/total"]
