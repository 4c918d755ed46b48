"""Per-client data files: a SuperNode reads its own client's data, never the whole dataset.

``lowband partition CONFIG --export DIR`` (:func:`export_clients`) builds the config's
federation once, on the machine that holds the dataset, and writes one npz per client
(``client-0003.npz``: that client's train/val/test arrays, the public reference set, the
global test set when the run evaluates ``node_global``, the client's id and the
federation's key) plus ``index.json`` (every file's sha256 and split sizes). A SuperNode
started with ``--node-config "data-file='/path/client-0003.npz'"`` reads only that file
(:func:`read_client_file`): the split is not re-derived, the arrays are those the simulator
trains on, bit for bit, so a Flower run fed from these files writes the metrics of
``lowband run``.

Checks, each a one-line :class:`DataFileError` (a ConfigError: exit 2 on the command line):
a missing or unreadable file, an npz whose arrays do not hash to the digest it carries
(damage), a file exported from another config (the federation key: the ``[data]`` keys
and the seed), a client id outside the federation. The ServerApp checks each SuperNode's
claim (client id + the file's sha256) against the index: :func:`check_claim`.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import numpy as np

from lowband.config.schema import ConfigError, Experiment

__all__ = ["DataFileError", "ClientFile", "federation_key", "export_clients", "export_for_run", "run_protocols",
           "read_client_file", "read_index", "check_claim", "client_federation", "INDEX", "FORMAT"]

INDEX = "index.json"
FORMAT = "lowband-client-data/1"
ARRAYS = ("train_x", "train_y", "val_x", "val_y", "test_x", "test_y", "public_x", "public_y",
          "global_test_x", "global_test_y")


class DataFileError(ConfigError):
    """A client data file or index that cannot be used, said in one line (exit 2)."""


def federation_key(exp: Experiment) -> str:
    """What makes two configs split the same data the same way: the ``[data]`` keys that
    choose and split the samples (not where the files lie) and the seed. A file exported
    from another config has another key and is refused."""
    data = exp.data.model_dump(mode="json")
    for k in ("data_dir", "path", "download"):
        data.pop(k, None)
    blob = json.dumps({"data": data, "seed": exp.seed}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def _digest(arrays: dict[str, np.ndarray]) -> str:
    """sha256 over every array's name, dtype, shape and bytes (in name order)."""
    h = hashlib.sha256()
    for k in sorted(arrays):
        a = np.ascontiguousarray(arrays[k])
        h.update(f"{k}|{a.dtype.str}|{a.shape}|".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def _np(t: Any) -> np.ndarray:
    return t.detach().cpu().contiguous().numpy()


def _json_meta(meta: dict[str, Any]) -> dict[str, Any]:
    """The federation metadata a client needs that JSON can carry (normalisation, vocabulary size, ...)."""
    out: dict[str, Any] = {}
    for k, v in meta.items():
        try:
            json.dumps(v)
        except (TypeError, ValueError):
            continue
        out[k] = v
    return out


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".part")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def run_protocols(exp: Experiment, has_local_test: bool) -> list[str]:
    """The protocols a run of ``exp`` evaluates (:func:`lowband.engine.checks.resolve_protocols`)
    on a federation with (or without) local test splits."""
    from types import SimpleNamespace

    from lowband.algorithms import ALGORITHMS
    from lowband.config.resolve import hyperparams
    from lowband.engine.checks import resolve_protocols

    fed = SimpleNamespace(nodes=[SimpleNamespace(n_test=int(has_local_test))])
    return resolve_protocols(ALGORITHMS[exp.algorithm.name](hyperparams(exp)), fed, exp.eval.protocols)


def export_clients(exp: Experiment, out: Path) -> Path:
    """Write one npz per client of ``exp``'s federation and ``index.json`` into ``out``;
    returns the index path. The global test set goes into each file only when a run of
    ``exp`` evaluates ``node_global`` (each client's model on it)."""
    from lowband.data.build import make_federation

    fed = make_federation(exp)
    out = Path(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
        return _export(exp, fed, out)
    except OSError as e:
        raise DataFileError(f"--export {out}: cannot write the client files there ({e.strerror or e}); "
                            f"name a folder you can write to") from None


def _export(exp: Experiment, fed: Any, out: Path) -> Path:
    key = federation_key(exp)
    has_local_test = any(int(nd.n_test) > 0 for nd in fed.nodes)
    with_global = "node_global" in run_protocols(exp, has_local_test)
    files = []
    for i, nd in enumerate(fed.nodes):
        arrays = {"train_x": _np(nd.train_x), "train_y": _np(nd.train_y), "val_x": _np(nd.val_x),
                  "val_y": _np(nd.val_y), "test_x": _np(nd.test_x), "test_y": _np(nd.test_y),
                  "public_x": _np(fed.public_x), "public_y": _np(fed.public_y)}
        if with_global:
            arrays.update(global_test_x=_np(fed.global_test_x), global_test_y=_np(fed.global_test_y))
        head = {"format": FORMAT, "client": i, "num_clients": len(fed.nodes), "key": key, "name": fed.name,
                "num_classes": int(fed.num_classes), "input_shape": list(fed.input_shape),
                "meta": _json_meta(fed.meta), "has_local_test": has_local_test, "digest": _digest(arrays)}
        buf = io.BytesIO()
        np.savez(buf, head=np.array(json.dumps(head, sort_keys=True)), **arrays)
        name = f"client-{i:04d}.npz"
        data = buf.getvalue()
        _write_atomic(out / name, data)
        files.append({"client": i, "file": name, "sha256": hashlib.sha256(data).hexdigest(),
                      "n_train": int(nd.n_train), "n_val": int(nd.n_val), "n_test": int(nd.n_test)})
    index = {"format": FORMAT, "key": key, "name": exp.name, "num_clients": len(fed.nodes),
             "global_test": with_global, "files": files}
    _write_atomic(out / INDEX, (json.dumps(index, indent=1, sort_keys=True) + "\n").encode())
    return out / INDEX


def export_for_run(exp: Experiment, out: Path) -> str:
    """:func:`export_clients`, and the line the command prints."""
    index = export_clients(exp, out)
    info = json.loads(index.read_text())
    size = sum((index.parent / f["file"]).stat().st_size for f in info["files"])
    return (f"wrote {info['num_clients']} client files ({size / 1e6:.1f} MB"
            f"{', each with the global test set' if info['global_test'] else ''}) and {index}; start the SuperNode "
            f"of client i with --node-config \"data-file='{index.parent}/client-<i, 4 digits>.npz'\", the "
            f"ServerApp with run config data-index='{index}'")


@dataclass
class ClientFile:
    """One client's data as read from its file."""

    client: int
    num_clients: int
    sha256: str  # of the whole file (what the ServerApp checks against the index)
    head: dict[str, Any]
    arrays: dict[str, np.ndarray]


def read_client_file(path: Any, exp: Optional[Experiment] = None) -> ClientFile:
    """Read and check one client's file (and, given ``exp``, that it was exported from
    that experiment's data keys). Raises :class:`DataFileError`."""
    p = Path(str(path)).expanduser()
    try:
        data = p.read_bytes()
    except OSError as e:
        raise DataFileError(f"data-file {p}: cannot read it ({e.strerror or e}); export the clients' files with "
                            f"`lowband partition CONFIG --export DIR` and give each SuperNode its own") from None
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as z:
            head = json.loads(str(z["head"]))
            arrays = {k: np.array(z[k]) for k in z.files if k != "head"}
    except Exception as e:  # noqa: BLE001 - a damaged zip raises many kinds of errors
        raise DataFileError(f"data-file {p}: not a readable client data file ({type(e).__name__}: "
                            f"{str(e)[:80]}); export it again with `lowband partition CONFIG --export DIR`") from None
    if not isinstance(head, dict) or head.get("format") != FORMAT:
        raise DataFileError(f"data-file {p}: not a {FORMAT} file; export it with `lowband partition CONFIG --export DIR`")
    missing = [k for k in ARRAYS[:8] if k not in arrays]
    if missing or _digest(arrays) != head.get("digest"):
        raise DataFileError(f"data-file {p}: its arrays do not match the digest it carries (damaged"
                            f"{', missing ' + ', '.join(missing) if missing else ''}); export it again")
    cf = ClientFile(int(head["client"]), int(head["num_clients"]), hashlib.sha256(data).hexdigest(), head, arrays)
    if exp is not None:
        if head.get("key") != federation_key(exp):
            raise DataFileError(f"data-file {p}: exported from another config (its [data] keys or seed differ from "
                                f"this run's); export this run's config with `lowband partition CONFIG --export DIR`")
        if cf.num_clients != exp.data.num_clients or not 0 <= cf.client < cf.num_clients:
            raise DataFileError(f"data-file {p}: client {cf.client} of {cf.num_clients}, the run has "
                                f"data.num_clients = {exp.data.num_clients}")
    return cf


def read_index(path: Any, exp: Optional[Experiment] = None) -> dict[str, Any]:
    """The export's ``index.json`` (a folder holding it, or the file), checked."""
    p = Path(str(path)).expanduser()
    if p.is_dir():
        p = p / INDEX
    try:
        index = json.loads(p.read_text())
        files = {int(f["client"]): f for f in index["files"]}
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise DataFileError(f"data-index {p}: not a readable index of client files ({type(e).__name__}); export "
                            f"them with `lowband partition CONFIG --export DIR`") from None
    if index.get("format") != FORMAT or sorted(files) != list(range(int(index.get("num_clients", -1)))):
        raise DataFileError(f"data-index {p}: not a {FORMAT} index of clients 0..n-1; export it again")
    if exp is not None and index.get("key") != federation_key(exp):
        raise DataFileError(f"data-index {p}: exported from another config (its [data] keys or seed differ from "
                            f"this run's); export this run's config with `lowband partition CONFIG --export DIR`")
    index["by_client"] = files
    return index


def check_claim(index: dict[str, Any], client: Any, sha256: Any) -> Optional[str]:
    """Why a SuperNode's claim to hold ``client`` with a file of ``sha256`` is refused
    (None: it is the index's file of that client)."""
    f = index["by_client"].get(client) if type(client) is int else None
    if f is None:
        return f"claims client {str(client)[:20]}, which the index does not list"
    if sha256 != f["sha256"]:
        return (f"claims client {client} with a file of sha256 {str(sha256)[:12]}, the index's is "
                f"{f['sha256'][:12]} (a damaged file or another export)")
    return None


def client_federation(cf: ClientFile) -> Any:
    """A :class:`~lowband.data.federation.Federation` holding this client's data only: the
    other clients are empty (a ClientApp never reads them), the public set and (when
    exported) the global test set as the simulator has them."""
    import torch

    from lowband.data.federation import Federation, NodeData

    a = {k: torch.from_numpy(v) for k, v in cf.arrays.items()}
    x, y = a["train_x"], a["train_y"]
    empty_x, empty_y = x.new_zeros((0, *x.shape[1:])), y.new_zeros((0,))
    nodes: list[Any] = []
    for i in range(cf.num_clients):
        if i == cf.client:
            nodes.append(NodeData(a["train_x"], a["train_y"], a["val_x"], a["val_y"], a["test_x"], a["test_y"]))
        else:
            nodes.append(NodeData(empty_x, empty_y, empty_x, empty_y, empty_x, empty_y))
    head = cf.head
    return Federation(name=head["name"], num_classes=int(head["num_classes"]),
                      input_shape=tuple(head["input_shape"]), meta=dict(head["meta"]), nodes=nodes,
                      global_test_x=a.get("global_test_x", empty_x), global_test_y=a.get("global_test_y", empty_y),
                      public_x=a["public_x"], public_y=a["public_y"])
