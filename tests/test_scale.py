"""Issue 43: a population costs nothing until it takes part.

Node states and local splits are made on first read (no tensor, no RNG call for a client
that never takes part), nodes are views of the shared dataset, the pooled ``personal``
pass wastes no rows on padding, the ledger goes to ``ledger.bin`` beside a checkpoint that
no longer carries it, and all of it leaves every metric the same bits.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import digits_config
from lowband.config import validate
from lowband.data import partition as P
from lowband.data.federation import NodeData, NodeView, build_federation
from lowband.data.sources import load_dataset
from lowband.engine.runlog import RunLog
from lowband.engine.simulator import Simulation
from lowband.seeding import np_gen


def test_split_sizes_are_split_local_sizes() -> None:
    rng = np.random.default_rng(0)
    for _ in range(300):
        n = int(rng.integers(0, 60))
        labels = rng.integers(0, int(rng.integers(1, 11)), size=200)
        idx = rng.choice(200, size=n, replace=False)
        ratios = rng.dirichlet(np.ones(3)) if rng.random() < 0.5 else np.array([0.75, 0.0, 0.25])
        ratios = ratios / ratios.sum()
        got = P.split_sizes(n, ratios)
        want = tuple(int(p.size) for p in P.split_local(idx, labels, ratios, rng))
        if got is not None:
            assert got == want, (n, ratios)
        else:
            assert ratios[0] > 0 and n > 0


def test_iid_replace_deals_the_pool_in_passes() -> None:
    parts = P.iid_replace(100, 23, np_gen(0, "p"), samples_per_client=30)  # 3 clients a pass, 8 passes
    assert len(parts) == 23 and all(p.size == 30 and np.unique(p).size == 30 for p in parts)
    assert all(np.intersect1d(parts[0], p).size == 0 for p in parts[1:3])  # one pass: disjoint
    assert any(np.intersect1d(parts[0], p).size > 0 for p in parts[3:])  # later passes share samples
    with pytest.raises(P.PartitionError, match="samples_per_client"):
        P.iid_replace(100, 3, np_gen(0), samples_per_client=101)


def test_node_views_hold_the_eager_split_and_copy_on_read() -> None:
    ds = load_dataset("digits")
    fed = build_federation(ds, num_clients=12, partition="dirichlet", alpha=0.5, min_size=20,
                           split=(0.6, 0.2, 0.2), seed=3)
    labels = ds.train_y.numpy()
    for i, nd in enumerate(fed.nodes):
        assert isinstance(nd, NodeView) and nd._parts is None  # nothing split yet
        sizes = (nd.n_train, nd.n_val, nd.n_test)
        assert nd._parts is None  # the sizes need no split
        tr, va, te = P.split_local(fed.partition[i], labels, (0.6, 0.2, 0.2), np_gen(3, "split", i))
        for got, idx in ((nd.train_x, tr), (nd.val_x, va), (nd.test_x, te)):
            assert torch.equal(got, ds.train_x[torch.from_numpy(idx)]) and got.is_contiguous()
        assert torch.equal(nd.test_y, ds.train_y[torch.from_numpy(te)])
        assert sizes == (tr.size, va.size, te.size)
    nd = fed.nodes[0]
    x = nd.train_x
    x.zero_()  # a node's reads are its own copies
    assert not torch.equal(nd.train_x, x) and float(ds.train_x.abs().sum()) > 0
    back = pickle.loads(pickle.dumps(nd))  # travels as its rows, not with the dataset
    assert isinstance(back, NodeData) and torch.equal(back.test_x, nd.test_x)
    assert len(pickle.dumps(nd)) < ds.train_x.numel()


def _fedavg(tmp_path: Path, name: str, clients: int, rounds: int = 3, **over: object) -> dict:
    cfg = digits_config(tmp_path / name, "fedavg", rounds=rounds)
    cfg["data"] = {"dataset": "digits", "num_clients": clients, "partition": "iid_replace",
                   "samples_per_client": 8, "split": [0.75, 0.0, 0.25]}
    cfg["topology"] = {"kind": "star", "sampling": "count", "count": 5}
    cfg["checkpoint_every"] = 1
    cfg.update(over)
    return cfg


def test_a_client_that_never_takes_part_costs_no_state_split_or_seeding(tmp_path: Path, monkeypatch) -> None:
    import lowband.engine.executor as executor_mod

    seeded: list[int] = []
    real = executor_mod.seed_torch
    monkeypatch.setattr(executor_mod, "seed_torch", lambda s: (seeded.append(s), real(s)))
    exp = validate(_fedavg(tmp_path, "lazy", 2000, rounds=2, eval={"protocols": ["global"]}))
    sim = Simulation(exp)
    res = sim.run()
    took = {int(n) for r in range(2) for n in sim.topology.plan(r).participants}
    made = {n for n in sim.executor.states if n >= 0}
    assert made == took and len(made) <= 10
    split = {i for i, nd in enumerate(sim.fed.nodes) if nd._parts is not None}
    assert split == took  # nobody else's local split was made
    # the server's init, one init per participant, each round's two server steps (the clients'
    # steps train in cohorts, seeded in lowband.engine.cohort): none for the other 1,990 clients
    assert len(seeded) == 1 + len(took) + 2 * 2
    ckpt = torch.load(Path(res.run_dir) / "checkpoint.pt", weights_only=True)
    assert {int(k) for k in ckpt["states"]} == made | {-1}


def test_resume_at_many_clients_is_byte_identical_with_the_ledger_in_its_own_file(tmp_path: Path) -> None:
    class Kill(Exception):
        pass

    full = validate(_fedavg(tmp_path, "full", 3000, rounds=4, eval={"protocols": ["global", "personal"], "nodes": 300}))
    Simulation(full).run()
    cut = validate(_fedavg(tmp_path, "cut", 3000, rounds=4, eval={"protocols": ["global", "personal"], "nodes": 300}))

    def boom(r: int, total: int, rec: dict) -> None:
        if r == 3:
            raise Kill

    with pytest.raises(Kill):
        Simulation(cut, progress=boom).run()
    d = Path(cut.run_dir())
    ckpt = torch.load(d / "checkpoint.pt", weights_only=True)
    assert "ledger" not in ckpt and ckpt["round"] == 2
    rows = ckpt["ledger_file"]["rows"]
    assert (d / "ledger.bin").stat().st_size == rows * 45 and rows > 0  # round 1-2 records only
    Simulation(cut, resume=True).run()
    for f in ("metrics.jsonl", "ledger.csv", "summary.json"):
        a, b = (Path(full.run_dir()) / f).read_text(), (d / f).read_text()
        if f == "summary.json":
            a, b = a.replace(str(full.run_dir()), ""), b.replace(str(cut.run_dir()), "")
        assert a == b, f


def test_a_checkpoint_that_holds_its_ledger_still_resumes(tmp_path: Path) -> None:
    """Checkpoints written before ledger.bin carried the whole ledger: still resumable."""
    cfg = _fedavg(tmp_path, "old", 50, rounds=3)
    full = validate({**cfg, "out_dir": str(tmp_path / "full")})
    Simulation(full).run()
    old = validate({**cfg, "rounds": 2})
    sim = Simulation(old)
    sim.run()
    d = Path(old.run_dir())
    ckpt = torch.load(d / "checkpoint.pt", weights_only=True)
    ckpt.pop("ledger_file")
    ckpt["ledger"] = sim.ledger.state_dict()
    RunLog(d).save_checkpoint(ckpt)  # as an older lowband wrote it (the manifest updated)
    (d / "ledger.bin").unlink()
    Simulation(validate(cfg), resume=True).run()
    assert (d / "metrics.jsonl").read_text() == (Path(full.run_dir()) / "metrics.jsonl").read_text()
    assert (d / "ledger.csv").read_text() == (Path(full.run_dir()) / "ledger.csv").read_text()


def test_pooled_personal_of_tiny_splits_wastes_no_conv_rows_and_keeps_the_bits() -> None:
    from lowband.engine.evaluation import _PooledTests
    from lowband.models import build_model
    from lowband.train import evaluate, get_params

    g = torch.Generator().manual_seed(0)
    sizes = [1, 2, 3, 0, 17, 5, 1, 40, 2, 33]
    nodes = [NodeData(torch.empty(0, 1, 28, 28), torch.empty(0, dtype=torch.long), torch.empty(0, 1, 28, 28),
                      torch.empty(0, dtype=torch.long), torch.rand(n, 1, 28, 28, generator=g),
                      torch.randint(0, 10, (n,), generator=g)) for n in sizes]
    model = build_model("cnn_fmnist", num_classes=10, input_shape=(1, 28, 28), seed=1)
    params = get_params(model)
    pooled = _PooledTests(nodes, range(len(nodes)))
    assert pooled.x.shape[0] == sum(sizes)  # the inputs are kept unpadded
    rows: list[int] = []
    trunk = model.row_trunk
    model.row_trunk = lambda x: (rows.append(int(x.shape[0])), trunk(x))[1]  # type: ignore[method-assign]
    got = pooled.evaluate(model, params, 48)
    assert sum(rows) == sum(sizes)  # the convolutions ran on the real rows only
    del model.row_trunk
    plain = _PooledTests(nodes, range(len(nodes)))  # a model without the trunk/tail split: the aligned rows
    model.row_tail = None  # type: ignore[assignment]
    plain_got = plain.evaluate(model, params, 48)
    del model.row_tail
    for i, nd in enumerate(nodes):
        want = evaluate(model, params, nd.test_x, nd.test_y, 48) if sizes[i] else (float("nan"), float("nan"), 0)
        for a, b in ((got[i], want), (plain_got[i], want)):
            assert a[2] == b[2] and (a[2] == 0 or (a[0] == b[0] and a[1] == b[1])), (i, a, b)


def test_a_damaged_ledger_file_stops_the_resume_in_one_line(tmp_path: Path) -> None:
    """ledger.bin is appended outside the manifest's whole-file digest: the checkpoint keeps the
    CRC-32 of the rows it counts, so a flipped byte is refused, not resumed across."""
    from lowband.engine.runfiles import DamagedFileError

    cfg = _fedavg(tmp_path, "crc", 50, rounds=2)
    Simulation(validate(cfg)).run()
    d = Path(validate(cfg).run_dir())
    raw = bytearray((d / "ledger.bin").read_bytes())
    raw[len(raw) // 2] ^= 0x40
    (d / "ledger.bin").write_bytes(bytes(raw))
    with pytest.raises(DamagedFileError, match="ledger.bin is damaged .*CRC-32"):
        Simulation(validate({**cfg, "rounds": 3}), resume=True).run()
