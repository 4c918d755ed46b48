"""A Flower deployment's data, claims and resume, checked in-process (no Flower runtime).

- Per-client data files (``lowband partition CONFIG --export DIR``): each ClientApp reads
  only its own file (the dataset is loaded once, by the ServerApp), and the run's
  metrics.jsonl is ``lowband run``'s, byte for byte. A missing, damaged or mismatched file
  is one line.
- Claims: a second SuperNode claiming a client, or a file the export's index does not
  vouch for, is refused in one line and never sent anything; the run goes on.
- Resume: a ServerApp killed after round 1's checkpoint is resumed (run config
  ``resume``) by a new Flower run (fresh contexts: each client's state comes from its
  SuperNode's ``state-dir``), ending with the metrics of an uninterrupted run.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("flwr", reason="the Flower adapter needs the extra: pip install 'lowband[flower]'")

from flwr.app import Context, RecordDict  # noqa: E402

from lowband.cli import main  # noqa: E402
from lowband.config import validate  # noqa: E402
from lowband.config.schema import ConfigError  # noqa: E402
from lowband.engine.simulator import Simulation  # noqa: E402
from lowband.flower import FlowerRun, client_app  # noqa: E402
from lowband.flower.datafile import DataFileError, export_clients, read_client_file  # noqa: E402
from test_flower import InProcessGrid, _cnn_config, _config, task_identity  # noqa: E402,F401


class FileGrid(InProcessGrid):
    """SuperNodes started with their own node configs (data-file, state-dir, ...)."""

    def __init__(self, app: Any, node_configs: list[dict[str, Any]]):
        self.app, self.sent = app, 0
        self.contexts = {100 + i: Context(run_id=1, node_id=100 + i, state=RecordDict(), run_config={},
                                          node_config=dict(nc)) for i, nc in enumerate(node_configs)}


def _export(tmp_path: Path, cfg: dict) -> Path:
    return export_clients(validate(cfg), tmp_path / "clients")


def _files(index: Path) -> list[str]:
    return [str(index.parent / f["file"]) for f in json.loads(index.read_text())["files"]]


def test_clients_fed_from_their_files_reproduce_lowband_run(tmp_path: Path, task_identity, monkeypatch) -> None:
    import lowband.engine.simulator as simulator

    cfg = _config(tmp_path, "fedavg", "flower")
    cfg["eval"] = {"protocols": ["global", "personal"]}  # the clients evaluate on their own test splits too
    ref = Simulation(validate({**cfg, "out_dir": str(tmp_path / "lowband")})).run()
    index = _export(tmp_path, cfg)
    built = []
    real = simulator.make_federation
    monkeypatch.setattr(simulator, "make_federation", lambda exp: built.append(exp) or real(exp))
    exp = validate(cfg)
    grid = FileGrid(client_app(exp), [{"data-file": f} for f in reversed(_files(index))])
    run = FlowerRun(exp, grid, data_index=str(index))
    run.run()
    assert len(built) == 1  # the ServerApp's; no ClientApp loaded or split the dataset
    assert sorted(run.backend.node_ids) == list(range(10)) and not run.backend.refused
    for name in ("metrics.jsonl", "ledger.csv"):
        assert (tmp_path / "flower" / name).read_text() == (Path(ref.run_dir) / name).read_text(), name


def test_a_client_file_holds_exactly_the_simulators_split(tmp_path: Path) -> None:
    from lowband.data.build import make_federation

    cfg = _config(tmp_path, "fedavg", "x")
    fed = make_federation(validate(cfg))
    index = _export(tmp_path, cfg)
    cf = read_client_file(_files(index)[3], validate(cfg))
    assert cf.client == 3
    nd = fed.nodes[3]
    for k in ("train_x", "train_y", "val_x", "val_y", "test_x", "test_y"):
        assert cf.arrays[k].tobytes() == getattr(nd, k).numpy().tobytes(), k
    assert "global_test_x" not in cf.arrays  # FedAvg's protocols here: global, on the ServerApp


def test_missing_damaged_and_foreign_files_are_one_line(tmp_path: Path) -> None:
    cfg = _config(tmp_path, "fedavg", "x")
    exp = validate(cfg)
    f = Path(_files(_export(tmp_path, cfg))[0])
    with pytest.raises(DataFileError, match="cannot read it") as e:
        read_client_file(tmp_path / "nowhere.npz", exp)
    assert "\n" not in str(e.value)
    data = bytearray(f.read_bytes())
    data[len(data) // 2] ^= 0xFF
    bad = tmp_path / "bad.npz"
    bad.write_bytes(bytes(data))
    with pytest.raises(DataFileError, match="bad.npz") as e:
        read_client_file(bad, exp)
    assert "\n" not in str(e.value)
    other = validate({**cfg, "seed": 4})
    with pytest.raises(DataFileError, match="exported from another config"):
        read_client_file(f, other)


def test_partition_export_command(tmp_path: Path, capsys) -> None:
    import tomli_w

    cfg = _config(tmp_path, "fedavg", "x")
    path = tmp_path / "c.toml"
    path.write_text(tomli_w.dumps(cfg))
    assert main(["partition", str(path), "--export", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert "wrote 10 client files" in out and "data-file=" in out
    index = json.loads((tmp_path / "out" / "index.json").read_text())
    assert [f["client"] for f in index["files"]] == list(range(10)) and all(len(f["sha256"]) == 64 for f in index["files"])
    (tmp_path / "afile").write_text("")
    assert main(["partition", str(path), "--export", str(tmp_path / "afile" / "x")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cannot write the client files" in err[0]


def test_a_second_claim_and_an_unvouched_file_are_refused_and_the_run_goes_on(tmp_path: Path, task_identity) -> None:
    cfg = _config(tmp_path, "fedavg", "flower", rounds=1)
    ref = Simulation(validate({**cfg, "out_dir": str(tmp_path / "lowband")})).run()
    index = _export(tmp_path, cfg)
    files = _files(index)
    # client 2's arrays re-saved compressed: the same data, another file (not the one the index lists)
    import numpy as np

    with np.load(files[2]) as z:
        arrays = {k: z[k] for k in z.files}
    np.savez_compressed(tmp_path / "copy.npz", **arrays)
    exp = validate(cfg)
    configs = [{"data-file": files[0]}, {"data-file": str(tmp_path / "copy.npz")}, *({"data-file": f} for f in files),
               {"data-file": files[5]}]
    grid = FileGrid(client_app(exp), configs)
    run = FlowerRun(exp, grid, data_index=str(index), timeout=5)
    run.run()
    refused = dict(run.backend.refused)
    assert len(refused) == 3, refused  # the copy, and the second claims of clients 0 and 5
    assert sum("already held by SuperNode" in r for r in refused.values()) == 2
    assert sum("the index's is" in r for r in refused.values()) == 1
    assert all("\n" not in r for r in refused.values())
    assert (tmp_path / "flower" / "metrics.jsonl").read_text() == (Path(ref.run_dir) / "metrics.jsonl").read_text()


def test_an_unclaimed_client_stops_the_run_in_one_line(tmp_path: Path, task_identity) -> None:
    cfg = _config(tmp_path, "fedavg", "flower", rounds=1)
    index = _export(tmp_path, cfg)
    files = _files(index)
    exp = validate(cfg)
    grid = FileGrid(client_app(exp), [{"data-file": f} for f in files[:9]] + [{"data-file": files[8]}])
    with pytest.raises(RuntimeError, match=r"no SuperNode holds clients \[9\] after 1 s.*already held") as e:
        FlowerRun(exp, grid, data_index=str(index), timeout=1).run()
    assert "\n" not in str(e.value)


class KilledGrid(FileGrid):
    """The ServerApp dies (as by SIGKILL) at the first message of round ``at``."""

    def __init__(self, app: Any, node_configs: list[dict[str, Any]], at: int):
        super().__init__(app, node_configs)
        self.at = at

    def send_and_receive(self, messages, *, timeout=None):
        messages = list(messages)
        if any(m.metadata.message_type == "train" and m.content["lowband"]["round"] == self.at for m in messages):
            raise SystemExit("killed")
        return super().send_and_receive(messages, timeout=timeout)


def _scaffold_killed_at_3(tmp_path: Path) -> tuple[Any, Path, Any, list[dict[str, str]]]:
    """SCAFFOLD on 6 clients, 4 rounds: the uninterrupted `lowband run`, and the Flower run
    from the clients' data files killed at round 3 (its SuperNodes keep states in
    ``tmp_path/states``). Returns (reference result, index, experiment, node configs)."""
    cfgs = {}
    for name in ("lowband", "flower"):
        cfgs[name] = _cnn_config(tmp_path, name, "scaffold")
        cfgs[name].update(rounds=4, checkpoint_every=1)
    ref = Simulation(validate(cfgs["lowband"])).run()
    index = _export(tmp_path, cfgs["flower"])
    exp = validate(cfgs["flower"])
    nodes = [{"data-file": f, "state-dir": str(tmp_path / "states")} for f in _files(index)]
    with pytest.raises(SystemExit):
        FlowerRun(exp, KilledGrid(client_app(exp), nodes, at=3), data_index=str(index)).run()
    return ref, index, exp, nodes


def test_a_killed_serverapp_resumes_exactly(tmp_path: Path, task_identity) -> None:
    """SCAFFOLD (each client keeps its control variate between rounds) on 6 clients, 3 a
    round, 4 rounds, killed at round 3; the resumed Flower run's contexts start empty."""
    ref, index, exp, nodes = _scaffold_killed_at_3(tmp_path)
    metrics = tmp_path / "flower" / "metrics.jsonl"
    assert [json.loads(x)["round"] for x in metrics.read_text().splitlines()] == [0, 1, 2]
    # no state-dir on the SuperNodes: the clients could not continue exactly, and it says so
    bare = [{"data-file": f} for f in _files(index)]
    with pytest.raises(ConfigError, match="keep no states .*state-dir") as e:
        FlowerRun(exp, FileGrid(client_app(exp), bare), data_index=str(index), resume=True).run()
    assert "\n" not in str(e.value)
    FlowerRun(exp, FileGrid(client_app(exp), nodes), data_index=str(index), resume=True).run()
    for name in ("metrics.jsonl", "ledger.csv", "summary.json"):
        assert (tmp_path / "flower" / name).read_text() == (Path(ref.run_dir) / name).read_text(), name
    saved = sorted(p.name for p in (tmp_path / "states").rglob("r*.pt"))
    assert saved and len(saved) <= 2 * 6  # pruned: at most the last two rounds' states per client


def test_resuming_without_the_saved_states_differs(tmp_path: Path, task_identity) -> None:
    """The check that the resume test's state-dir is what makes it exact: a resumed run whose
    clients start from their initial states (a fresh state-dir) ends elsewhere."""
    ref, index, exp, nodes = _scaffold_killed_at_3(tmp_path)
    fresh = [{"data-file": f, "state-dir": str(tmp_path / "elsewhere")} for f in _files(index)]
    FlowerRun(exp, FileGrid(client_app(exp), fresh), data_index=str(index), resume=True).run()
    assert (tmp_path / "flower" / "metrics.jsonl").read_text() != (Path(ref.run_dir) / "metrics.jsonl").read_text()
