"""Memory properties (issue 18 part 6): a broadcast's decoded message is held once for all
its receivers, each receiver still gets a private copy for its step, results do not
change, and a large dataset is not kept alive next to the federation's copies of it."""

from __future__ import annotations

import gc
import weakref
from pathlib import Path

import pytest
import torch

from conftest import digits_config
from lowband.algorithms.base import Outbox, Step
from lowband.comm.network import Network
from lowband.config import validate
from lowband.data import sources
from lowband.engine.simulator import Simulation


def _inboxes_after_broadcast(tmp_path: Path) -> tuple[Simulation, dict, int]:
    sim = Simulation(validate(digits_config(tmp_path, "dfedavg", rounds=1)), write=False)
    plan = sim.topology.plan(0)
    sim.executor.init_states(plan)
    train_send = sim.alg.steps(1, plan)[0]
    inboxes = sim.route(1, sim.executor.run_step(train_send, 1, plan, {}))
    return sim, inboxes, len(plan.participants)


def test_broadcast_decoded_once_for_all_receivers(tmp_path: Path) -> None:
    sim, inboxes, senders = _inboxes_after_broadcast(tmp_path)
    envelopes = [e for box in inboxes.values() for e in box]
    assert len(envelopes) == 3 * senders  # 3-regular graph: every sender reaches 3 receivers
    held = {t.data_ptr() for e in envelopes for t in e.msg.tensors.values()}
    per_model = len(envelopes[0].msg.tensors)
    assert len(held) == senders * per_model  # one decoded copy per sender, not one per receiver
    assert all(e.shared for e in envelopes)


def test_each_receiver_gets_a_private_copy(tmp_path: Path) -> None:
    """A receiver that scribbles on its inbox must not change what another receiver reads."""
    sim, inboxes, _ = _inboxes_after_broadcast(tmp_path)
    before = {d: [{k: v.clone() for k, v in e.msg.tensors.items()} for e in box] for d, box in inboxes.items()}
    seen: list[torch.Tensor] = []  # kept alive, so addresses are not reused

    def scribble(ctx, state, inbox):
        for e in inbox:
            for t in e.msg.tensors.values():
                seen.append(t)
                t.add_(1.0)
        return state, Outbox()

    plan = sim.topology.plan(0)
    sim.executor.run_step(Step("scribble", sorted(inboxes), scribble), 1, plan, inboxes)
    ptrs = [t.data_ptr() for t in seen]
    shared = {t.data_ptr() for box in inboxes.values() for e in box for t in e.msg.tensors.values()}
    assert len(ptrs) == len(set(ptrs)) and not set(ptrs) & shared  # private copies, none the held one
    for d, box in inboxes.items():
        for e, ref in zip(box, before[d]):
            assert all(torch.equal(e.msg.tensors[k], ref[k]) for k in ref)


def test_sharing_changes_no_result(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """metrics.jsonl is byte-identical with the shared inbox and with a clone per receiver."""
    cfg = digits_config(tmp_path / "shared", "dfedavg", rounds=2)
    shared = Simulation(validate(cfg)).run()
    orig = Network.receive

    def cloning(self, *a, share=False, **k):
        return orig(self, *a, share=False, **k)

    monkeypatch.setattr(Network, "receive", cloning)
    cloned = Simulation(validate(digits_config(tmp_path / "cloned", "dfedavg", rounds=2))).run()
    a = (Path(shared.run_dir) / "metrics.jsonl").read_text()
    b = (Path(cloned.run_dir) / "metrics.jsonl").read_text()
    assert a == b and len(a.splitlines()) == 3


def test_large_dataset_cached_only_while_held(monkeypatch: pytest.MonkeyPatch) -> None:
    sources.clear_cache()
    small = sources.load_dataset("digits")
    small_id = id(small)
    del small
    gc.collect()
    assert id(sources.load_dataset("digits")) == small_id  # small: kept for the process

    sources.clear_cache()
    monkeypatch.setattr(sources, "STRONG_CACHE_BYTES", 0)  # digits now counts as large
    big = sources.load_dataset("digits")
    assert sources.load_dataset("digits") is big  # shared while someone holds it
    ref = weakref.ref(big)
    del big
    gc.collect()
    assert ref() is None  # nothing in lowband kept it (nor its 4 tensors) alive
    assert sources.load_dataset("digits").train_x.shape[0] > 0  # and it loads again
    sources.clear_cache()


# -- the worker pool's and the evaluator's memory (issue 18 part 6, 300-node DFedAvg) ----------------


def test_delivery_frees_the_bytes_as_it_decodes(tmp_path: Path) -> None:
    """deliver() empties the list it is given: each message's bytes are dropped once
    decoded (a worker does not hold a step's bytes and their decoded copies together)."""
    from lowband.engine.rounds import deliver, send

    sim = Simulation(validate(digits_config(tmp_path, "dfedavg", rounds=1)), write=False)
    plan = sim.topology.plan(0)
    sim.executor.init_states(plan)
    outboxes = sim.executor.run_step(sim.alg.steps(1, plan)[0], 1, plan, {})
    _, items, _ = send(sim.network, 1, outboxes)
    n = len(items)
    got = deliver(sim.network, 1, items)
    assert n > 0 and items == [] and sum(len(v) for v in got.values()) == 3 * n


def test_pool_frames_carry_large_bytes_beside_the_pickle() -> None:
    import multiprocessing as mp
    import threading

    from lowband.engine import pool

    big = bytes(range(256)) * 4096  # 1 MB
    obj = {"bundle": [((0, 0), (1, 2), big, None, "weights")], "small": b"x" * 10, "t": torch.arange(70000.0)}
    head, frames = pool._dumps(obj)
    assert any(f is big for f in frames) and len(head) < 10_000  # not copied into the pickle
    a, b = mp.Pipe()
    sender = threading.Thread(target=pool._send, args=(a, (head, frames)))  # a pipe holds ~64 KB
    sender.start()
    back = pool._recv(b)
    sender.join()
    assert back["bundle"] == obj["bundle"] and back["small"] == obj["small"] and torch.equal(back["t"], obj["t"])


def test_consensus_in_chunks_is_the_same_average(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The consensus weights are gathered a few nodes at a time, and the average has the
    bits of weighted_average over all nodes at once."""
    from lowband.engine import evaluation
    from lowband.train import evaluate, weighted_average

    sim = Simulation(validate(digits_config(tmp_path, "dfedavg", rounds=1)), write=False)
    sim.run()
    monkeypatch.setattr(evaluation, "CONSENSUS_CHUNK", 3)
    ex, plan = sim.executor, sim.topology.plan(0)
    calls = []
    orig = type(ex).map_nodes

    def counting(self, fn, nodes, round, plan):
        calls.append((getattr(fn, "func", fn).__name__, len(list(nodes))))
        return orig(self, fn, nodes, round, plan)

    monkeypatch.setattr(type(ex), "map_nodes", counting)
    sim.evaluator.protocols = ["consensus"]
    got = sim.evaluator(1, plan)
    gathers = [n for name, n in calls if name == "_node_params"]
    assert gathers == [3, 3, 2]  # 8 nodes, 3 at a time
    avg = weighted_average([ex.states[n]["params"] for n in range(8)])
    acc, loss, _ = evaluate(ex.model_for(0), avg, sim.evaluator.test_x, sim.evaluator.test_y, sim.evaluator.batch_size)
    assert (got["consensus/acc"], got["consensus/loss"]) == (acc, loss)


def test_malloc_trim_is_found_on_glibc() -> None:
    import platform

    from lowband.engine import pool

    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        pytest.skip("malloc_trim is glibc's")
    assert pool._libc() is not None
    pool.release_free_memory()
