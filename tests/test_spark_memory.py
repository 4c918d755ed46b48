"""SPARK within its memory budgets (issue 43 item 4): what keeps a round's memory bounded.

- each requester's own reply is dropped once its update has used it (not held to the commit
  while the later groups' replies are in memory);
- the engine frees each sender's outbox as it encodes it (``send(consume=True)``), with the
  same bytes and records as without;
- the requester groups are planned from every reply (the own ones included) with half of
  ``max_inflight_mb`` left for the steps' working memory;
- the ``X P`` cache writes its disk tier on a writer thread, at most ``MAX_PENDING_WRITES``
  products held while they are written, and serves the same bytes from every tier.

The measured peaks are in benchmarks/README.md ("SPARK within its memory budgets").
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from lowband.algorithms.decentralised import ntk_cache
from lowband.algorithms.decentralised.spark import SparkHP
from lowband.algorithms.decentralised.spark_cache import WORKING_SHARE, inflight_bytes, memory_groups
from lowband.comm.message import Message
from lowband.config import validate
from lowband.engine.rounds import send
from lowband.engine.simulator import Simulation
from lowband.topology import RoundPlan
from test_ntk import _cfg
from test_spark import SPARK_HP


def test_the_own_reply_is_dropped_after_the_update(tmp_path: Path) -> None:
    """With two requester groups, every update step returns a state without ``self_reply``
    (SPARK's own ``J P``), so the first group's are gone while the second's are computed."""
    sim = Simulation(validate(_cfg(tmp_path, "spark", 1, **SPARK_HP, reply_groups=2)))
    seen: list[bool] = []
    update = sim.alg.update

    def checked(ctx, state, inbox):  # type: ignore[no-untyped-def]
        assert "self_reply" in state  # the reply step left it for this update
        new, out = update(ctx, state, inbox)
        seen.append("self_reply" in new)
        return new, out

    sim.alg.update = checked  # the round's steps take the instance's method
    sim.run()
    assert len(seen) == 6 and not any(seen)


def test_send_consume_frees_each_outbox_with_the_same_bytes(tmp_path: Path) -> None:
    sim = Simulation(validate(_cfg(tmp_path, "spark", 1, **SPARK_HP)))
    net = sim.network

    def outboxes() -> dict:
        from lowband.algorithms.base import Outbox
        boxes = {}
        for src in (2, 0, 1):
            box = Outbox()
            box.send((src + 1) % 3, Message("jacobian", {"jac": torch.full((4, 3, 5), float(src))}))
            boxes[src] = box
        return boxes

    kept = outboxes()
    a = send(net, 1, kept)
    gone = outboxes()
    b = send(net, 1, gone, consume=True)
    assert gone == {} and len(kept) == 3  # consumed; the default leaves the caller's dict alone
    assert a[0] == b[0]  # the same records
    assert [(it.key, it.dsts, it.data) for it in a[1]] == [(it.key, it.dsts, it.data) for it in b[1]]


def test_groups_count_every_reply_and_leave_room_for_the_working_memory() -> None:
    plan = RoundPlan(round=0, participants=tuple(range(100)),
                     neighbors={i: tuple(sorted((i + d) % 100 for d in (1, 2, 3, 97, 98))) for i in range(100)})
    hp = SparkHP()
    # 500 directed edges and 100 own replies of 200 x 10 x 1000 float32 = 4.8 GB
    assert inflight_bytes(hp, plan) == 600 * 200 * 10 * 1000 * 4
    assert WORKING_SHARE == 0.5
    assert memory_groups(hp, plan) == 5  # 4.8 GB in 1.0 GB of room
    assert memory_groups(hp.model_copy(update={"max_inflight_mb": 4000.0}), plan) == 3
    assert memory_groups(hp.model_copy(update={"max_inflight_mb": 1.0}), plan) == 100  # at most one per node
    assert memory_groups(hp.model_copy(update={"sample_fraction": 0.5}), plan) == 3


def test_disk_tier_is_written_behind_with_at_most_two_products_held(tmp_path: Path, monkeypatch) -> None:
    cache = ntk_cache.XPCache(ram_mb=0.0, disk_mb=100.0, folder=str(tmp_path))
    held: list[int] = []
    write = ntk_cache._write_file

    def slow_write(path: str, data: torch.Tensor) -> None:
        held.append(len(cache._pending))
        write(path, data)

    monkeypatch.setattr(ntk_cache, "_write_file", slow_write)
    xs = [torch.randn(6, 4, generator=torch.Generator().manual_seed(i)) for i in range(5)]
    products = [(x @ torch.ones(4, 7)).reshape(6, 7) for x in xs]
    for i, x in enumerate(xs):
        got = cache.get(i, x, lambda _x, i=i: products[i].clone())
        assert torch.equal(got, products[i])
        again = cache.get(i, x, lambda _x: (_ for _ in ()).throw(AssertionError("recomputed")))
        assert torch.equal(torch.as_tensor(np.asarray(again)), products[i])  # pending or on disk: same bytes
        assert len(cache._pending) <= ntk_cache.MAX_PENDING_WRITES
    cache.flush()
    assert cache._pending == {} and len(cache.disk) == 5 and max(held) <= ntk_cache.MAX_PENDING_WRITES
    for i, x in enumerate(xs):
        mm = cache.get(i, x, lambda _x: (_ for _ in ()).throw(AssertionError("recomputed")))
        assert isinstance(mm, np.memmap) and np.array_equal(np.asarray(mm), products[i].numpy())
    assert cache.stats["computed"] == 5 and cache.stats["kept_disk"] == 5
    paths = list(cache._paths)
    cache.close()
    assert not any(Path(p).exists() for p in paths)


def test_a_forked_copy_forgets_its_parents_writes(tmp_path: Path) -> None:
    """A worker forked while a write was under way has no writer thread: it must not wait on
    the parent's write (it would wait for ever), and it writes its own products."""
    from concurrent.futures import Future

    cache = ntk_cache.XPCache(ram_mb=0.0, disk_mb=100.0, folder=str(tmp_path))
    never: Future = Future()  # the parent's write, which never completes in the child
    cache._pending = {"old": (b"", str(tmp_path / "parent"), torch.zeros(1), never)}
    cache._writer_pid = -1  # as seen from a forked process
    x = torch.ones(3, 2)
    q = cache.get("new", x, lambda _x: torch.full((3, 4), 2.0))
    cache.flush()
    assert "old" not in cache._pending and "new" in cache.disk and torch.equal(q, torch.full((3, 4), 2.0))
    cache.close()
