"""``data.partition = "index_map"`` (issue 45): a partition read from a JSON map client id ->
training indices (the NTK-DFL authors' format), validated with one-line errors, the first M
clients of the map for a run of M nodes, its sha256 in the run's identity, and nothing but
the partition changed against lowband's own recipe."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tomli_w
import torch

import lowband as lb
from lowband.cli import main
from lowband.config import ConfigError, load_experiment
from lowband.data import build_federation, load_dataset, ntk_fl
from lowband.data.indexmap import IndexMapError, read_index_map, select, stats
from lowband.engine.simulator import make_federation
from lowband.seeding import np_gen


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def write_map(path: Path, obj: Any, compress: bool = True) -> Path:
    text = json.dumps(obj).encode()
    path.write_bytes(gzip.compress(text, mtime=0) if compress else text)
    return path


def digits_map(n_clients: int = 12, size: int = 40, overlap: int = 5) -> dict[str, list[int]]:
    """Clients 0..n-1 of the digits training set, consecutive blocks that share ``overlap``
    indices with the next client (as the NTK-FL recipe shares samples across clients)."""
    step = size - overlap
    return {str(c): list(range(c * step, c * step + size)) for c in range(n_clients)}


BASE: dict[str, Any] = {
    "name": "imap", "seed": 2, "rounds": 2, "threads": 1,
    "model": {"name": "mlp", "hidden": 16},
    "algorithm": {"name": "dfedavg", "local_epochs": 1, "batch_size": 16, "lr": 0.05},
    "topology": {"kind": "kregular", "k": 3},
    "eval": {"protocols": ["consensus", "node_global"]},
}


def config(tmp_path: Path, imap: Path, **data: Any) -> dict[str, Any]:
    return {**BASE, "out_dir": str(tmp_path / "run"),
            "data": {"dataset": "digits", "num_clients": 8, "partition": "index_map", "index_map": str(imap), **data}}


def cli(capsys: pytest.CaptureFixture[str], *argv: Any) -> tuple[int, str, str]:
    capsys.readouterr()
    try:
        rc = main([str(a) for a in argv])
    except SystemExit as exc:
        rc = int(exc.code or 0)
    out, err = capsys.readouterr()
    return rc, out, err


# --------------------------------------------------------------------------- the partition


def test_first_m_clients_in_id_order_and_only_the_partition_changes(tmp_path: Path) -> None:
    """A run of M nodes holds exactly the map's clients 0..M-1 (ids in numeric order, "10"
    after "9"), each with its own indices; local splits, the global test set and every
    other part of the federation are built as for lowband's own partitions: the map of
    lowband's ntk_fl draw gives the identical federation."""
    ds = load_dataset("digits")
    labels = ds.train_y.numpy()
    m = digits_map(12)
    shuffled = {k: m[k] for k in sorted(m, key=lambda k: -int(k))}  # file order must not matter
    p = write_map(tmp_path / "m.json.gz", shuffled)
    imap = read_index_map(str(p))
    assert imap.ids == tuple(range(12))
    fed = build_federation(ds, num_clients=11, partition="index_map", index_map=imap, seed=0,
                           split=(0.75, 0.0, 0.25))
    assert fed.num_clients == 11
    for i in range(11):
        assert fed.partition[i].tolist() == m[str(i)]
        nd = fed.nodes[i]
        assert nd.n_train + nd.n_test == 40 and nd.n_test == 10
    assert fed.meta["federation"]["index_map"] == {
        "path": str(p.resolve()), "sha256": imap.sha256, "clients": 11, "of": 12, "indices": 440,
        "distinct": 440 - 10 * 5, "shared": 50, "min_size": 40, "max_size": 40}

    # lowband's own NTK-FL draw, written as a map, is the same federation to the byte
    kw = dict(seed=3, split=(0.8, 0.0, 0.2))
    own = build_federation(ds, num_clients=9, partition="ntk_fl", alpha=0.3, samples_per_client=60, **kw)
    again = ntk_fl(labels, 9, 0.3, np_gen(3, "partition", "ntk_fl"), samples_per_client=60)
    assert [a.tolist() for a in again] == [p.tolist() for p in own.partition]
    q = write_map(tmp_path / "own.json", {str(i): p.tolist() for i, p in enumerate(own.partition)}, compress=False)
    fed2 = build_federation(ds, num_clients=9, partition="index_map", index_map=read_index_map(str(q)), **kw)
    for a, b in zip(own.nodes, fed2.nodes):
        for part in ("train_x", "train_y", "val_y", "test_x", "test_y"):
            assert torch.equal(getattr(a, part), getattr(b, part)), part
    assert torch.equal(own.global_test_x, fed2.global_test_x) and torch.equal(own.global_test_y, fed2.global_test_y)


def test_public_samples_leave_the_clients_as_with_natural_partitions(tmp_path: Path) -> None:
    from lowband.data.federation import _public_indices

    ds = load_dataset("digits")
    m = digits_map(12)
    imap = read_index_map(str(write_map(tmp_path / "m.json.gz", m)))
    fed = build_federation(ds, num_clients=12, partition="index_map", index_map=imap, seed=0, public_size=300)
    public = set(_public_indices(ds.train_y.numpy(), 300, "train", ds.num_classes, 0).tolist())
    assert fed.public_y.shape[0] == 300
    for i, p in enumerate(fed.partition):
        assert set(p.tolist()) == set(m[str(i)]) - public
    assert sum(40 - p.size for p in fed.partition) > 0  # some mapped samples went to the public set


# --------------------------------------------------------------------------- the run's identity


def test_a_run_records_the_map_and_refuses_a_changed_file_on_resume(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    p = write_map(tmp_path / "m.json.gz", digits_map(12))
    cfg = tmp_path / "c.toml"
    cfg.write_text(tomli_w.dumps(config(tmp_path, p)))
    rc, _, err = cli(capsys, "run", cfg, "--quiet")
    assert rc == 0, err
    run = tmp_path / "run"
    sha = read_index_map(str(p)).sha256
    saved = (run / "config.toml").read_text()
    assert f'index_map_sha256 = "{sha}"' in saved
    summary = json.loads((run / "summary.json").read_text())
    assert summary["index_map"]["sha256"] == sha and summary["index_map"]["clients"] == 8
    assert summary["index_map"]["shared"] == 7 * 5
    metrics = (run / "metrics.jsonl").read_text()

    # the same config again is the same run, to the byte (the map is read, nothing drawn)
    rc, _, err = cli(capsys, "run", cfg, "--out", tmp_path / "again", "--quiet")
    assert rc == 0, err
    assert (tmp_path / "again" / "metrics.jsonl").read_text() == metrics

    # another map under the same name: --resume refuses to mix the two in one run
    changed = digits_map(12)
    changed["3"] = changed["3"][:-1]
    write_map(p, changed)
    rc, _, err = cli(capsys, "run", cfg, "--resume", "rounds=3", "--quiet")
    assert rc == 2 and "index_map_sha256" in err and len(err.strip().splitlines()) == 1, err
    # a config that names the sha256 refuses a file with another
    with pytest.raises(ConfigError, match="the file changed since"):
        lb.experiment(config(tmp_path, p, index_map_sha256=sha))


# --------------------------------------------------------------------------- bad maps


def _bad(tmp: Path, obj: Any, raw: bytes | None = None) -> Path:
    if raw is not None:
        (tmp / "bad.json.gz").write_bytes(raw)
        return tmp / "bad.json.gz"
    return write_map(tmp / "bad.json.gz", obj)


BAD: list[tuple[str, Any, dict[str, Any], str]] = [
    ("not json", b"\x1f\x8bnot gzip at all", {}, "cannot read"),
    ("plain garbage", b"{0: [1]", {}, "is not JSON"),
    ("a list", [[1, 2]], {}, "holds list; expected an object client id"),
    ("empty object", {}, {}, "holds an empty object"),
    ("empty client", {**digits_map(12), "4": []}, {}, "client 4 holds an empty list"),
    ("float index", {**digits_map(12), "2": [1, 2.5]}, {}, "client 2 holds 2.5; indices are integers"),
    ("bool index", {**digits_map(12), "2": [1, True]}, {}, "client 2 holds True"),
    ("negative index", {**digits_map(12), "5": [3, -1]}, {}, "negative index -1"),
    ("duplicate in a client", {**digits_map(12), "1": [7, 8, 7]}, {}, "client 1 holds 1 index twice"),
    ("bad id", {**digits_map(12), "x1": [1]}, {}, "client id 'x1' is not a non-negative integer"),
    ("padded id", {**digits_map(12), "01": [1]}, {}, "client id '01'"),
    ("index out of range", {**digits_map(12), "6": [5, 10**6]}, {}, "client 6 holds index 1000000, and the "
                                                                    "training set has"),
    ("more nodes than clients", digits_map(5), {}, "8 nodes, and"),
    ("missing file", None, {"index_map": "nowhere/m.json.gz"}, "data.index_map: no file nowhere/m.json.gz"),
    ("no path", None, {"index_map": None}, "partition 'index_map' needs data.index_map"),
    ("map with another partition", digits_map(12), {"partition": "iid"}, "index_map: read only with partition"),
    ("alpha is not read", digits_map(12), {"alpha": 0.1}, "data.alpha: not read with partition = 'index_map'"),
    ("bad sha", digits_map(12), {"index_map_sha256": "ab"}, "index_map_sha256"),
]


@pytest.mark.parametrize("case_id,obj,extra,expect", BAD, ids=[c[0] for c in BAD])
def test_bad_maps_are_one_line_exit_2_and_write_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str], case_id: str, obj: Any,
                                                        extra: dict[str, Any], expect: str) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LOWBAND_DATA", str(tmp_path / "data"))
    if isinstance(obj, bytes):
        p = _bad(tmp_path, None, obj)
    elif obj is not None:
        p = _bad(tmp_path, obj)
    else:
        p = tmp_path / "unused.json.gz"
    cfg = config(tmp_path, p, **extra)
    cfg["data"] = {k: v for k, v in cfg["data"].items() if v is not None}
    path = tmp_path / "c.toml"
    path.write_text(tomli_w.dumps(cfg))
    rc, out, err = cli(capsys, "run", path, "--quiet")
    lines = err.strip().splitlines()
    assert rc == 2, f"exit {rc}: {err}"
    assert len(lines) == 1 and lines[0].startswith("lowband: error: "), err
    assert expect in lines[0], lines[0]
    assert out == "" and not (tmp_path / "run").exists()


def test_a_relative_path_is_read_from_the_data_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "data" / "maps"
    folder.mkdir(parents=True)
    write_map(folder / "m.json.gz", digits_map(12))
    monkeypatch.chdir(tmp_path)
    exp = lb.experiment(config(tmp_path, Path("maps/m.json.gz"), data_dir=str(tmp_path / "data")))
    assert exp.data.index_map_sha256 == read_index_map(str(folder / "m.json.gz")).sha256
    monkeypatch.setenv("LOWBAND_DATA", str(tmp_path / "data"))
    assert lb.experiment(config(tmp_path, Path("maps/m.json.gz"))).data.index_map == "maps/m.json.gz"


# --------------------------------------------------------------------------- the authors' partitions


REFERENCE = "ntk_dfl_partitions/reference_recipe_a0.1_seed0.json.gz"


@pytest.mark.parametrize("m,indices,distinct", [(10, 1977, 1952), (30, 5926, 5654), (300, 59247, 37725)])
def test_the_reference_partition_has_the_recorded_statistics(shared_data: Path, m: int, indices: int,
                                                             distinct: int) -> None:
    """shared/data/README.md: the partition behind the authors' NTK-DFL and DFedAvg numbers."""
    p = shared_data / REFERENCE
    if not p.is_file():
        pytest.skip(f"{p} not found")
    imap = read_index_map(str(p))
    parts = select(imap, m, 60000)
    s = stats(imap, parts)
    assert (s["clients"], s["of"], s["indices"], s["distinct"]) == (m, 300, indices, distinct)
    assert s["shared"] == indices - distinct and 195 <= s["min_size"] <= s["max_size"] <= 199


def test_the_refpart_configs_take_the_reference_partition(shared_data: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """experiments/spark/*refpart*: the NTK-DFL reference runs with only the partition changed."""
    if not (shared_data / REFERENCE).is_file():
        pytest.skip("the reference partition is not in the data folder")
    monkeypatch.setenv("LOWBAND_DATA", str(shared_data))
    root = Path(__file__).resolve().parents[1] / "experiments" / "spark"
    for m in (10, 30):
        for tail in ("", "_seq"):
            ref = load_experiment(root / f"ntkdfl_ref_m{m}{tail}.toml")
            ours = load_experiment(root / f"ntkdfl_refpart_m{m}{tail}.toml")
            assert ours.data.partition == "index_map" and ours.data.index_map == REFERENCE
            assert ours.data.num_clients == m and ours.algorithm == ref.algorithm
            assert ours.topology == ref.topology and ours.eval == ref.eval and ours.rounds == ref.rounds
            fed = make_federation(ours)
            assert fed.meta["federation"]["index_map"]["clients"] == m


def test_lowband_partition_says_what_the_map_gave(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = write_map(tmp_path / "m.json.gz", digits_map(12))
    cfg = tmp_path / "c.toml"
    cfg.write_text(tomli_w.dumps(config(tmp_path, p)))
    rc, out, err = cli(capsys, "partition", cfg, "--out", tmp_path / "p.png")
    assert rc == 0, err
    sha = read_index_map(str(p)).sha256
    assert (f"(sha256 {sha[:12]}): its first 8 of 12 clients, 320 indices, 285 distinct "
            f"(35 held by more than one client)") in out
    assert (tmp_path / "p.png").is_file()


def test_a_map_is_read_within_its_budget(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A small file that inflates past the budget (a gzip bomb) is refused before it is parsed."""
    import lowband.data.indexmap as im

    p = tmp_path / "bomb.json.gz"
    p.write_bytes(gzip.compress(b'{"0": [' + b"1, " * 200_000 + b"1]}"))
    assert p.stat().st_size < 10_000
    monkeypatch.setattr(im, "MAX_BYTES", 100_000)
    with pytest.raises(IndexMapError, match="holds more than"):
        read_index_map(str(p))
