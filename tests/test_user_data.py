"""The user's own data (issue 16 part 7): ``data.dataset = "npz"`` files and
``lb.arrays`` / ``lb.from_torch`` from the Python API, partitioned by the partitioners or by
the user's client ids, checked with one-line errors (exit 2, nothing written)."""

from __future__ import annotations

import io
import json
import struct
import zipfile
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest
import tomli_w
import torch

import lowband as lb
from lowband.cli import main
from lowband.config import ConfigError
from lowband.data.errors import PartitionError


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """The 1,797 real 8x8 digits as uint8 images (0..255) and their labels."""
    from sklearn.datasets import load_digits

    d = load_digits()
    return (d.images * 16).clip(0, 255).astype(np.uint8), d.target.astype(np.int64)


BASE: dict[str, Any] = {
    "name": "mine", "seed": 3, "rounds": 3, "threads": 1,
    "model": {"name": "mlp", "hidden": 16},
    "algorithm": {"name": "fedavg", "local_epochs": 1, "batch_size": 16, "lr": 0.05},
    "topology": {"kind": "star", "sampling": "count", "count": 3},
}


def config(tmp_path: Path, data: dict[str, Any], name: str = "cfg.toml", **top: Any) -> Path:
    p = tmp_path / name
    p.write_text(tomli_w.dumps({**BASE, **top, "data": data}))
    return p


def cli(capsys: pytest.CaptureFixture[str], *argv: Any) -> tuple[int, str, str]:
    capsys.readouterr()
    try:
        rc = main([str(a) for a in argv])
    except SystemExit as exc:
        rc = int(exc.code or 0)
    out, err = capsys.readouterr()
    return rc, out, err


def records(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def snapshot(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*")}


# --------------------------------------------------------------------------- runs


def test_npz_through_the_cli_and_the_api_equals_the_same_arrays(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """One npz, three ways in (CLI, API with data.path, API with lb.arrays): identical
    metrics, and FedAvg learns on it (so the data really reached the clients)."""
    monkeypatch.chdir(tmp_path)
    x, y = digits_arrays()
    np.savez(tmp_path / "my.npz", x=x, y=y)
    data = {"dataset": "npz", "path": "my.npz", "num_clients": 6, "partition": "dirichlet", "alpha": 0.5}
    cfg = config(tmp_path, data)
    rc, out, err = cli(capsys, "run", cfg, "--out", tmp_path / "cli", "--quiet")
    assert rc == 0, err
    via_cli = records(tmp_path / "cli")

    via_path = lb.run(lb.experiment(cfg), write=False)
    mem = lb.arrays(x, y, name="digits")
    exp = lb.experiment({**BASE, "data": {k: v for k, v in data.items() if k not in ("dataset", "path")}}, data=mem)
    assert exp.data.dataset == "npz" and exp.data.path.startswith("memory:digits-")
    via_arrays = lb.run(exp, write=False)
    assert via_cli == via_path.records == via_arrays.records
    summary = json.loads((tmp_path / "cli" / "summary.json").read_text())
    assert summary["dataset"] == "npz" and summary["data_sha256"] == mem.digest == via_arrays.summary["data_sha256"]
    first, last = via_cli[0]["global/acc"], via_cli[-1]["global/acc"]
    assert last > first + 0.25 and last > 0.4, (first, last)  # 13% -> 50% measured

    # a written API run keeps the arrays in its folder: load_run and --resume read them there
    written = lb.run(exp, out="runs/api")
    assert written.records == via_arrays.records
    assert (tmp_path / "runs/api/data.npz").is_file()
    again = lb.load_run("runs/api")
    assert again.records == written.records and again.model()(torch.zeros(2, 1, 8, 8)).shape == (2, 10)
    rc, _, err = cli(capsys, "run", tmp_path / "runs/api/config.toml", "rounds=4", "--out", "runs/api", "--resume",
                     "--quiet")
    assert rc == 0, err
    resumed = records(tmp_path / "runs/api")
    assert [r["round"] for r in resumed] == [0, 1, 2, 3, 4] and resumed[:4] == written.records


def test_from_torch_equals_arrays(tmp_path: Path) -> None:
    from torch.utils.data import TensorDataset

    x, y = digits_arrays()
    xf = torch.from_numpy(x[:, None].astype(np.float32) / 255)
    ds = TensorDataset(xf[:1500], torch.from_numpy(y[:1500]))
    test = TensorDataset(xf[1500:], torch.from_numpy(y[1500:]))
    data = {"num_clients": 4, "partition": "iid"}
    a = lb.run(lb.experiment({**BASE, "rounds": 1, "data": data}, data=lb.from_torch(ds, test=test)), write=False)
    b = lb.run(lb.experiment({**BASE, "rounds": 1, "data": data},
                             data=lb.arrays(xf[:1500].numpy(), y[:1500], x_test=xf[1500:].numpy(), y_test=y[1500:])),
               write=False)
    assert a.records == b.records and len(a.config.data.path) > 7
    with pytest.raises(ConfigError, match="from_torch"):
        lb.from_torch(TensorDataset(torch.zeros(3, 2)))  # items are not (input, label) pairs


def _rows_of(node_x: torch.Tensor) -> set[int]:
    return {int(v) for v in node_x[:, 0].round().tolist()}


def test_user_client_ids_are_the_partition(tmp_path: Path) -> None:
    """Each client's data is exactly its ids' rows: train = those rows minus its held-out
    local split; ids need not be contiguous; partition and num_clients follow the file."""
    from lowband.engine.simulator import make_federation

    rng = np.random.default_rng(0)
    n = 300
    x = rng.normal(size=(n, 5)).astype(np.float32)
    x[:, 0] = np.arange(n)  # row ids, to recognise rows after the split (normalize = false)
    y = rng.integers(0, 3, n)
    client = rng.choice([3, 7, 11, 40], size=n)
    np.savez(tmp_path / "c.npz", x=x, y=y, client=client, x_test=x[:20], y_test=y[:20])
    exp = lb.experiment({**BASE, "data": {"dataset": "npz", "path": str(tmp_path / "c.npz"),
                                          "options": {"normalize": False}, "split": [0.75, 0.0, 0.25]}})
    assert (exp.data.partition, exp.data.num_clients) == ("given", 4)
    assert "partition = \"given\"" in exp.to_toml() and "num_clients = 4" in exp.to_toml()
    fed = make_federation(exp)
    assert fed.meta["client_ids"] == [3, 7, 11, 40] and fed.num_clients == 4
    for i, cid in enumerate([3, 7, 11, 40]):
        rows = set(np.flatnonzero(client == cid).tolist())
        nd = fed.nodes[i]
        train, val, test = _rows_of(nd.train_x), _rows_of(nd.val_x), _rows_of(nd.test_x)
        assert train | val | test == rows and not (train & test) and not (train & val)
        assert train == rows - val - test and len(test) > 0.15 * len(rows)
        assert set(fed.partition[i].tolist()) == rows
    assert fed.global_test_x[:, 0].tolist() == list(range(20))  # x_test is the global test set, as given

    # without x_test, the global test set is carved out; each client keeps the rest of its rows
    np.savez(tmp_path / "d.npz", x=x, y=y, client=client)
    exp = lb.experiment(exp, **{"data.path": str(tmp_path / "d.npz"), "data.split": [1.0, 0.0, 0.0]})
    fed = make_federation(exp)
    held = _rows_of(fed.global_test_x)
    assert len(held) == 60  # test_fraction 0.2
    for i, cid in enumerate([3, 7, 11, 40]):
        assert _rows_of(fed.nodes[i].train_x) == set(np.flatnonzero(client == cid).tolist()) - held

    # an explicit partitioner re-deals the rows instead (the file's ids are then not used)
    exp = lb.experiment(exp, **{"data.partition": "iid", "data.num_clients": 6})
    assert make_federation(exp).num_clients == 6


def test_layout_normalisation_and_shape_inference(tmp_path: Path) -> None:
    from lowband.data.userdata import load_user_dataset

    rng = np.random.default_rng(1)
    x = rng.integers(0, 256, size=(200, 6, 6, 3), dtype=np.uint8)  # channels last
    x[..., 2] //= 4
    y = np.arange(200) % 4
    np.savez(tmp_path / "img.npz", x=x, y=y)
    ds = load_user_dataset(str(tmp_path / "img.npz"))
    assert ds.input_shape == (3, 6, 6) and ds.num_classes == 4 and ds.meta["layout"] == "NHWC->NCHW"
    raw = torch.from_numpy(np.moveaxis(x, -1, 1).astype(np.float32) / 255)
    mean = raw.mean(dim=(0, 2, 3))
    norm = ds.meta["normalize"]
    assert len(norm["mean"]) == 3 and norm["mean"][2] < norm["mean"][0] / 2  # per channel, from the data
    # the statistics are the training rows' (not the test rows'): training inputs have mean 0, std 1
    assert torch.allclose(ds.train_x.mean(dim=(0, 2, 3)), torch.zeros(3), atol=1e-4)
    assert torch.allclose(ds.train_x.std(dim=(0, 2, 3)), torch.ones(3), atol=1e-2)
    assert torch.allclose(torch.tensor(norm["mean"], dtype=torch.float64), mean.double(), atol=0.02)  # ~ the mean of all rows
    # gaps in the label ids are kept when num_classes says so
    np.savez(tmp_path / "gap.npz", x=x[:, :, :, 0].astype(np.float32), y=np.where(y == 3, 5, y))
    ds = load_user_dataset(str(tmp_path / "gap.npz"), num_classes=6)
    assert ds.num_classes == 6 and ds.input_shape == (1, 6, 6) and ds.meta["layout"] == "NHW->NCHW"


# --------------------------------------------------------------------------- bad input


def _patch_uncompressed_size(path: Path, member: str, size: int) -> None:
    """Make ``member`` of a zip claim ``size`` uncompressed bytes (local and central headers)."""
    data = bytearray(path.read_bytes())
    name = member.encode()
    for sig, off in ((b"PK\x03\x04", 22), (b"PK\x01\x02", 24)):
        start = 0
        while (i := data.find(sig, start)) >= 0:
            name_len_off = 26 if sig == b"PK\x03\x04" else 28
            n_len = struct.unpack_from("<H", data, i + name_len_off)[0]
            head = 30 if sig == b"PK\x03\x04" else 46
            if bytes(data[i + head:i + head + n_len]) == name:
                struct.pack_into("<I", data, i + off, size)
            start = i + 4
    path.write_bytes(bytes(data))


def _hostile_gigabytes(tmp: Path) -> Path:
    """An npz whose x header and zip directory both claim 3 GB (750M float32) in a 1 kB file."""
    p = tmp / "huge.npz"
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": "<f4", "fortran_order": False, "shape": (750_000_000,)})
    head = buf.getvalue()
    ybuf = io.BytesIO()
    np.save(ybuf, np.zeros(750, np.int64))
    with zipfile.ZipFile(p, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("x.npy", head + b"\x00" * 256)
        zf.writestr("y.npy", ybuf.getvalue())
    _patch_uncompressed_size(p, "x.npy", len(head) + 3_000_000_000)
    return p


def _save(name: str, **arrays: Any) -> Callable[[Path], Path]:
    def make(tmp: Path) -> Path:
        p = tmp / name
        np.savez(p, **arrays)
        return p
    return make


_X = np.random.default_rng(0).normal(size=(40, 3)).astype(np.float32)
_Y = np.arange(40) % 2
_NAN = _X.copy()
_NAN[7, 1] = np.nan

#: (id, make file -> path, extra config, text the one line must hold)
BAD: list[tuple[str, Callable[[Path], Path], dict[str, Any], str]] = [
    ("missing file", lambda t: t / "nothere.npz", {}, "not found"),
    ("not an npz", lambda t: (t / "x.npz").write_text("a,b\n1,2\n") and t / "x.npz", {}, "not an .npz"),
    ("a folder", lambda t: (t / "d.npz").mkdir() or t / "d.npz", {}, "not a file"),
    ("truncated zip", lambda t: (t / "t.npz").write_bytes(_save("u.npz", x=_X, y=_Y)(t).read_bytes()[:300])
     and t / "t.npz", {}, "npz"),
    ("no y", _save("a.npz", x=_X), {}, "no array 'y'"),
    ("no x", _save("a.npz", y=_Y), {}, "no array 'x'"),
    ("misspelt clients", _save("a.npz", x=_X, y=_Y, clients=_Y), {}, "'clients.npy', which lowband does not read"),
    ("length mismatch", _save("a.npz", x=_X, y=_Y[:39]), {}, "y has 39 labels but x has 40 rows"),
    ("float labels", _save("a.npz", x=_X, y=_Y + 0.5), {}, "integer class ids; row 0 is"),
    ("negative labels", _save("a.npz", x=_X, y=_Y - 1), {}, "negative class id -1"),
    ("one class", _save("a.npz", x=_X, y=0 * _Y), {}, "at least 2 classes"),
    ("label gaps", _save("a.npz", x=_X, y=_Y * 3), {}, "never 1, 2, so num_classes would be 4"),
    ("gaps beyond num_classes", _save("a.npz", x=_X, y=_Y * 3), {"options": {"num_classes": 3}},
     "class id 3 >= data.options.num_classes = 3"),
    ("nan in x", _save("a.npz", x=_NAN, y=_Y), {}, "non-finite values (NaN or Inf) in 1 rows, first row 7"),
    ("int64 x", _save("a.npz", x=_Y[:, None].repeat(3, 1), y=_Y), {}, "dtype int64"),
    ("1-D x", _save("a.npz", x=_X[:, 0], y=_Y), {}, "expected (N, D) features"),
    ("x_test alone", _save("a.npz", x=_X, y=_Y, x_test=_X), {}, "x_test and y_test go together"),
    ("x_test shape", _save("a.npz", x=_X, y=_Y, x_test=_X[:, :2], y_test=_Y), {}, "x_test rows are (2,)"),
    ("object array", lambda t: (np.savez(t / "o.npz", x=np.array([[1], "a"], dtype=object), y=_Y), t / "o.npz")[1],
     {}, "dtype object"),
    ("claims gigabytes", _hostile_gigabytes, {"options": {"max_gb": 1.0}}, "need 3.0 GB in memory, more than"),
    ("header disagrees with size", lambda t: (_patch_uncompressed_size(_save("h.npz", x=_X, y=_Y)(t), "x.npy", 99),
                                              t / "h.npz")[1], {}, "npz"),
    ("tiny max_gb", _save("a.npz", x=_X, y=_Y), {"options": {"max_gb": 1e-7}}, "max_gb"),
    ("given without client ids", _save("a.npz", x=_X, y=_Y), {"partition": "given"}, "needs client ids"),
    ("client count differs", _save("a.npz", x=_X, y=_Y, client=_Y), {"num_clients": 3},
     "gives 2 distinct client ids and num_clients is 3"),
    ("negative client id", _save("a.npz", x=_X, y=_Y, client=_Y - 1), {}, "negative id -1"),
    ("too few samples for the split", _save("a.npz", x=_X, y=_Y, client=np.r_[np.zeros(39, int), 5],
                                            x_test=_X, y_test=_Y), {"split": [0.75, 0.0, 0.25]},
     "client id 5 has 1 training sample"),
    ("test_fraction with x_test", _save("a.npz", x=_X, y=_Y, x_test=_X, y_test=_Y),
     {"options": {"test_fraction": 0.3}}, "drop test_fraction"),
    ("cnn on features", _save("a.npz", x=_X, y=_Y), {"model": "simplecnn"}, "simplecnn is a CNN for images"),
    ("text model on images", _save("a.npz", x=_X.reshape(40, 1, 1, 3).repeat(12, 2).repeat(4, 3), y=_Y),
     {"model": "text_bag"}, "text_bag reads token ids"),
    ("cnn on too small images", _save("a.npz", x=np.zeros((40, 1, 6, 6), np.float32), y=_Y),
     {"model": "cnn_fmnist"}, "too small"),
    ("num_classes 1", _save("a.npz", x=_X, y=_Y), {"options": {"num_classes": 1}}, "or a count >= 2, got 1"),
    ("test_fraction 1", _save("a.npz", x=_X, y=_Y), {"options": {"test_fraction": 1.0}}, "in (0, 1); got 1.0"),
    ("max_gb 0", _save("a.npz", x=_X, y=_Y), {"options": {"max_gb": 0.0}}, "max_gb: the most memory"),
    ("path without npz", lambda t: t / "x.npz", {"dataset": "digits"}, "data.path: read only with data.dataset"),
]


@pytest.mark.parametrize("case_id,make,extra,expect", BAD, ids=[c[0] for c in BAD])
def test_bad_user_data_is_one_line_exit_2_and_writes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str], case_id: str,
                                                             make: Callable[[Path], Path], extra: dict[str, Any],
                                                             expect: str) -> None:
    monkeypatch.chdir(tmp_path)
    path = make(tmp_path)
    extra = dict(extra)
    model = extra.pop("model", None)
    data = {"dataset": "npz", "path": str(path), "num_clients": 4, "partition": "iid", **extra}
    if case_id in ("client count differs", "negative client id", "too few samples for the split"):
        data.pop("partition")
        if case_id != "client count differs":
            data.pop("num_clients")
    top: dict[str, Any] = {"model": {"name": model}} if model else {}
    cfg = config(tmp_path, data, **top)
    before = snapshot(tmp_path)
    rc, out, err = cli(capsys, "run", cfg, "--out", tmp_path / "run", "--quiet")
    lines = err.strip().splitlines()
    assert rc == 2, f"exit {rc}: {err}"
    assert len(lines) == 1 and lines[0].startswith("lowband: error: "), err
    assert expect in lines[0], lines[0]
    assert out == "" and snapshot(tmp_path) == before and not (tmp_path / "run").exists()
    with pytest.raises((ConfigError, PartitionError)):  # the API refuses the same, with the same line
        lb.run(lb.experiment(cfg), write=False)


def test_bad_arrays_are_refused_by_the_api_at_once() -> None:
    with pytest.raises(ConfigError, match="non-finite"):
        lb.arrays(_NAN, _Y)
    with pytest.raises(ConfigError, match="39 labels but x has 40 rows"):
        lb.arrays(_X, _Y[:39])
    with pytest.raises(ConfigError, match="num_classes would be 4"):
        lb.arrays(_X, _Y * 3)
    assert lb.arrays(_X, _Y * 3, num_classes=4).num_classes == 4
    with pytest.raises(ConfigError, match="client must be 1-D"):
        lb.arrays(_X, _Y, client=_Y[:5])


def test_seeds_of_in_memory_arrays_read_them_from_the_seeds_folder(tmp_path: Path) -> None:
    x, y = digits_arrays()
    exp = lb.experiment({**BASE, "rounds": 1, "data": {"num_clients": 4}}, data=lb.arrays(x, y, client=y % 4))
    seeds = lb.run_seeds(exp, seeds=[0, 1], out=tmp_path / "s", workers=1)
    assert (tmp_path / "s" / "data.npz").is_file() and len(seeds) == 2
    assert all(r.config.data.path == str(tmp_path / "s" / "data.npz") for r in seeds)
    one = lb.run(lb.experiment(exp, seed=1), write=False)
    assert seeds[1].records == one.records


def test_csv_table_equals_the_same_npz(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A CSV (header; y, client and feature columns) runs like the npz of the same values."""
    rng = np.random.default_rng(2)
    x = rng.normal(size=(240, 4)).astype(np.float32)
    y = (x[:, 0] + x[:, 1] > 0).astype(np.int64) + 2 * (x[:, 2] > 0.5)
    client = np.arange(240) % 3
    lines = ["f0,y,f1,client,f2,f3"] + [f"{r[0]:.9g},{c},{r[1]:.9g},{k},{r[2]:.9g},{r[3]:.9g}"
                                         for r, c, k in zip(x, y, client)]
    (tmp_path / "t.csv").write_text("\n".join(lines) + "\n")
    np.savez(tmp_path / "t.npz", x=x, y=y, client=client)
    a = lb.run(lb.experiment({**BASE, "rounds": 2, "data": {"dataset": "csv", "path": str(tmp_path / "t.csv")}}),
               write=False)
    b = lb.run(lb.experiment({**BASE, "rounds": 2, "data": {"dataset": "npz", "path": str(tmp_path / "t.npz")}}),
               write=False)
    assert a.config.data.partition == "given" and a.config.data.num_clients == 3
    assert a.records == b.records and a.records[-1]["global/acc"] > a.records[0]["global/acc"] + 0.1
    for text, expect in [("a,b\n1,2\n", "no column 'y'"), ("f,y\n1,0\nx,1\n", "not a numeric CSV"),
                         ("f,y\n", "no rows"), ("f,y\n1,0\n2,1,3\n", "not a numeric CSV"),
                         ("f,y\n0.5,1.5\n1,0\n", "integer class ids")]:
        (tmp_path / "bad.csv").write_text(text)
        cfg = config(tmp_path, {"dataset": "csv", "path": str(tmp_path / "bad.csv"), "num_clients": 1})
        rc, out, err = cli(capsys, "run", cfg, "--out", tmp_path / "nope", "--quiet")
        assert rc == 2 and len(err.strip().splitlines()) == 1 and expect in err, (text, err)
        assert not (tmp_path / "nope").exists()
