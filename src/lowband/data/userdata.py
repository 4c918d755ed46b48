"""The user's own data: an ``.npz`` file (``data.dataset = "npz"``, ``data.path``), a CSV table
(``data.dataset = "csv"``, see :func:`read_csv`) or arrays given through the Python API
(:func:`arrays`, :func:`from_torch`).

What a file (or :func:`arrays`) holds, by array name:

- ``x`` (required): ``N`` rows; float (any width) or ``uint8`` (divided by 255). ``(N, D)``
  is a feature vector per row; ``(N, H, W)`` grayscale images (a channel axis is added);
  ``(N, C, H, W)`` images, or ``(N, H, W, C)`` when the last axis is 1, 3 or 4 and the
  second is not (then transposed to channels-first, recorded in ``meta["layout"]``);
- ``y`` (required): ``N`` integer class ids ``0..C-1`` (whole-valued floats are accepted);
- ``client`` (optional): ``N`` non-negative integer client ids. Their distinct values, in
  increasing order, become clients ``0..K-1`` (``meta["client_ids"]`` keeps the user's ids)
  and the partition is the user's: ``data.partition = "given"``, which the config takes
  automatically (with ``data.num_clients = K``) when it leaves the partition out;
- ``x_test``, ``y_test`` (optional, together): the global test set. Without them a seeded,
  class-stratified ``options.test_fraction`` (0.2) of the rows is held out as the global
  test set (``options.seed``, by ``np_gen(seed, "npz", "split")``).

Any other array is refused (a misspelt ``clients`` must not be ignored silently). With
``options.normalize`` (default true) inputs are standardised with statistics of the
training rows only, per channel for images and per feature for vectors; they are recorded
as ``meta["normalize"]`` like the built-in datasets'. ``num_classes`` is ``max(y) + 1``
over the training and test labels; ids with gaps (some class in ``0..max`` never used) are
refused unless ``options.num_classes`` (or ``arrays(num_classes=...)``) says so.

Hostile files cost no more than their budget: the zip directory and every member's
``.npy`` header are read first, each member's size must match its header, and the arrays
together may hold at most ``options.max_gb`` GB (4) before anything is loaded. Every
problem is a one-line :class:`UserDataError` (a :class:`~lowband.config.ConfigError`: the
CLI exits with 2 before writing anything).

In-memory data (the API) is registered under a ``memory:<name>-<digest>`` path that
validates like a file path in this process; a written run stores the arrays as
``data.npz`` in its run folder and its config points there, so ``--resume`` and
``lowband.load_run`` find them.
"""

from __future__ import annotations

import functools
import hashlib
import io
import math
import re
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch

from lowband.config.schema import ConfigError, DataConfig

from ..seeding import np_gen
from .dataset import Dataset
from .partition import split_local

__all__ = ["USER_DATASETS", "read_csv", "ArrayData", "UserDataError", "NPZ_KEYS", "NPZ_OPTIONS", "arrays", "from_torch", "inspect_npz",
           "load_arrays", "load_user_dataset", "client_count", "check_model_input", "MEMORY_PREFIX"]

#: the dataset names of the user's files: ``npz`` (arrays) and ``csv`` (a table)
USER_DATASETS = ("npz", "csv")
#: the arrays an npz may hold
NPZ_KEYS = ("x", "y", "client", "x_test", "y_test")
#: ``data.options`` of ``dataset = "npz"`` with their defaults (0 num_classes: inferred)
NPZ_OPTIONS: dict[str, Any] = {"test_fraction": 0.2, "seed": 0, "normalize": True, "num_classes": 0,
                               "max_gb": 4.0}
MEMORY_PREFIX = "memory:"
#: the file a written run keeps in-memory data in (its config's data.path points there)
RUN_DATA_FILE = "data.npz"
_MAX_MEMBERS = 16


class UserDataError(ConfigError):
    """The user's data cannot be used as given (one line: what, where, how to fix it)."""


# --------------------------------------------------------------------------- arrays


@dataclass(repr=False, eq=False)
class ArrayData:
    """Validated user arrays (numpy, as given: not yet normalised or converted).

    Build it with :func:`arrays` or :func:`from_torch`; pass it as ``data=`` to
    ``lowband.experiment``. ``ref`` is the ``memory:`` path the config carries.
    """

    x: np.ndarray
    y: np.ndarray
    client: Optional[np.ndarray] = None
    x_test: Optional[np.ndarray] = None
    y_test: Optional[np.ndarray] = None
    num_classes: Optional[int] = None
    name: str = "arrays"

    def __repr__(self) -> str:
        extra = "" if self.client is None else f", clients={np.unique(self.client).size}"
        test = "" if self.x_test is None else f", test={self.x_test.shape[0]}"
        return f"ArrayData({self.name!r}, x={self.x.shape} {self.x.dtype}{test}{extra})"

    def npz_dict(self) -> dict[str, np.ndarray]:
        """The arrays as :func:`numpy.savez` takes them (None left out)."""
        return {k: getattr(self, k) for k in NPZ_KEYS if getattr(self, k) is not None}

    def to_npz_bytes(self) -> bytes:
        buf = io.BytesIO()
        np.savez(buf, **self.npz_dict())
        return buf.getvalue()

    @functools.cached_property
    def digest(self) -> str:
        """sha256 over every array's name, dtype, shape and bytes (what an npz keeps)."""
        h = hashlib.sha256()
        for k, a in self.npz_dict().items():
            h.update(f"{k}|{a.dtype.str}|{a.shape}|".encode())
            h.update(np.ascontiguousarray(a).tobytes())
        return h.hexdigest()

    @property
    def ref(self) -> str:
        """The ``memory:`` path of these arrays (registered in this process)."""
        ref = f"{MEMORY_PREFIX}{self.name}-{self.digest[:16]}" + (f"-c{self.num_classes}" if self.num_classes else "")
        _MEMORY[ref] = self
        return ref

    def save(self, path: str | Path) -> Path:
        """Write the arrays as an npz (atomically: a temporary file renamed into place)."""
        p = Path(path)
        tmp = p.with_name(p.name + ".part")
        tmp.write_bytes(self.to_npz_bytes())
        tmp.replace(p)
        return p


#: memory: path -> arrays, for in-process (API) runs
_MEMORY: dict[str, ArrayData] = {}


def _name_ok(name: str) -> str:
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", name):
        raise UserDataError(f"arrays(name={name!r}): use 1-64 letters, digits, '_', '.' or '-'")
    return name


def arrays(x: Any, y: Any, *, client: Any = None, x_test: Any = None, y_test: Any = None,
           num_classes: Optional[int] = None, name: str = "arrays") -> ArrayData:
    """User data from arrays (numpy, torch tensors or anything ``np.asarray`` takes), checked
    as a file's would be (see the module docstring); one-line :class:`UserDataError` otherwise.
    ``num_classes``: set it to keep label ids with gaps (classes without samples)."""
    def arr(v: Any, what: str) -> Optional[np.ndarray]:
        if v is None:
            return None
        if isinstance(v, torch.Tensor):
            v = v.detach().cpu().numpy()
        try:
            a = np.asarray(v)
        except Exception as exc:  # noqa: BLE001 - whatever the object, one line
            raise UserDataError(f"arrays(): {what} is not an array ({type(exc).__name__})") from None
        if a.dtype.hasobject:
            raise UserDataError(f"arrays(): {what} holds Python objects (dtype object); pass numeric arrays")
        return a

    if num_classes is not None and (isinstance(num_classes, bool) or not isinstance(num_classes, (int, np.integer))
                                    or num_classes < 2):
        raise UserDataError(f"arrays(num_classes={num_classes!r}): an int >= 2, or None to infer it")
    data = ArrayData(arr(x, "x"), arr(y, "y"), arr(client, "client"), arr(x_test, "x_test"),  # type: ignore[arg-type]
                     arr(y_test, "y_test"), None if num_classes is None else int(num_classes), _name_ok(name))
    check_arrays(data, "arrays()")
    return data


def from_torch(dataset: Any, *, test: Any = None, client: Any = None, num_classes: Optional[int] = None,
               name: str = "torch", batch_size: int = 1024) -> ArrayData:
    """Materialise a map-style torch ``Dataset`` of ``(input, label)`` pairs once (and
    ``test``, the global test set, if given) into :class:`ArrayData`. Inputs must be
    tensors (or arrays) of one shape: apply ``transforms.ToTensor()`` to PIL images."""
    from torch.utils.data import DataLoader

    def take(ds: Any, what: str) -> tuple[np.ndarray, np.ndarray]:
        try:
            n = len(ds)
        except TypeError:
            raise UserDataError(f"from_torch(): {what} has no len(); pass a map-style torch Dataset") from None
        if n == 0:
            raise UserDataError(f"from_torch(): {what} is empty")
        xs, ys = [], []
        try:
            for batch in DataLoader(ds, batch_size=batch_size, shuffle=False):
                if not isinstance(batch, (list, tuple)) or len(batch) != 2:
                    raise UserDataError(f"from_torch(): {what} items must be (input, label) pairs")
                xs.append(torch.as_tensor(batch[0]).numpy())
                ys.append(torch.as_tensor(batch[1]).numpy())
        except UserDataError:
            raise
        except (TypeError, RuntimeError, ValueError) as exc:
            msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise UserDataError(f"from_torch(): cannot stack the items of {what} ({msg}); items must be "
                                f"(tensor, int) pairs of one shape (e.g. transforms.ToTensor() for PIL images)") \
                from None
        return np.concatenate(xs), np.concatenate(ys)

    x, y = take(dataset, "dataset")
    xt, yt = take(test, "test") if test is not None else (None, None)
    return arrays(x, y, client=client, x_test=xt, y_test=yt, num_classes=num_classes, name=name)


# --------------------------------------------------------------------------- checks


def _rows(a: np.ndarray, what: str, where: str) -> None:
    if a.ndim < 1 or a.shape[0] < 1:
        raise UserDataError(f"{where}: {what} has no rows (shape {a.shape})")


def _labels(y: np.ndarray, what: str, where: str, n: int, xname: str) -> np.ndarray:
    if y.ndim != 1:
        raise UserDataError(f"{where}: {what} must be 1-D (one class id per row), got shape {y.shape}")
    if y.shape[0] != n:
        raise UserDataError(f"{where}: {what} has {y.shape[0]} labels but {xname} has {n} rows; they must match")
    if y.dtype == np.bool_ or not (np.issubdtype(y.dtype, np.integer) or np.issubdtype(y.dtype, np.floating)):
        raise UserDataError(f"{where}: {what} must hold integer class ids, got dtype {y.dtype}")
    if np.issubdtype(y.dtype, np.floating):
        bad = ~np.isfinite(y) | (y != np.round(y))
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise UserDataError(f"{where}: {what} must hold integer class ids; row {i} is {y[i].item()!r}")
    if (y < 0).any():
        i = int(np.flatnonzero(y < 0)[0])
        raise UserDataError(f"{where}: {what} has a negative class id {y[i].item()!r} (row {i}); ids are 0..C-1")
    if y.size and y.max() > 1_000_000:
        raise UserDataError(f"{where}: {what} has class id {y.max().item()!r}; ids are 0..C-1 (relabel with "
                            f"np.unique(y, return_inverse=True))")
    return y.astype(np.int64)


def _inputs(x: np.ndarray, what: str, where: str) -> None:
    _rows(x, what, where)
    if x.ndim < 2 or x.ndim > 4 or min(x.shape[1:]) < 1:
        raise UserDataError(f"{where}: {what} has shape {x.shape}; expected (N, D) features, (N, H, W) or "
                            f"(N, C, H, W) images")
    if not (x.dtype == np.uint8 or np.issubdtype(x.dtype, np.floating)):
        raise UserDataError(f"{where}: {what} has dtype {x.dtype}; lowband reads float features/images or uint8 "
                            f"images (0..255); convert it, e.g. x.astype(np.float32)")
    if np.issubdtype(x.dtype, np.floating):
        bad = ~np.isfinite(x.reshape(x.shape[0], -1)).all(axis=1)
        if bad.any():
            rows = np.flatnonzero(bad)
            raise UserDataError(f"{where}: {what} has non-finite values (NaN or Inf) in {rows.size} rows, first "
                                f"row {int(rows[0])}; clean or drop those rows")
        if np.abs(x).max(initial=0) > 3e38:
            raise UserDataError(f"{where}: {what} has values beyond float32's range (|x| > 3e38); rescale it")


def check_arrays(d: ArrayData, where: str, key: str = "num_classes") -> None:
    """Check user arrays in place of a run (see the module docstring); fixes nothing,
    converts nothing: one-line :class:`UserDataError` on the first problem."""
    if d.x is None or d.y is None:
        raise UserDataError(f"{where}: needs x and y")
    _inputs(d.x, "x", where)
    n = d.x.shape[0]
    y = _labels(d.y, "y", where, n, "x")
    labels = [y]
    if (d.x_test is None) != (d.y_test is None):
        raise UserDataError(f"{where}: x_test and y_test go together (the global test set); give both or neither")
    if d.x_test is not None:
        _inputs(d.x_test, "x_test", where)
        if d.x_test.shape[1:] != d.x.shape[1:]:
            raise UserDataError(f"{where}: x_test rows are {d.x_test.shape[1:]} but x rows are {d.x.shape[1:]}")
        if (d.x_test.dtype == np.uint8) != (d.x.dtype == np.uint8):
            raise UserDataError(f"{where}: x is {d.x.dtype} and x_test {d.x_test.dtype}; give both as uint8 images "
                                f"or both as floats (uint8 is scaled by 1/255)")
        labels.append(_labels(d.y_test, "y_test", where, d.x_test.shape[0], "x_test"))  # type: ignore[arg-type]
    if d.client is not None:
        c = d.client
        if c.ndim != 1 or c.shape[0] != n:
            raise UserDataError(f"{where}: client must be 1-D with one id per row of x ({n}), got shape {c.shape}")
        if not np.issubdtype(c.dtype, np.integer) or c.dtype == np.bool_:
            raise UserDataError(f"{where}: client must hold integer client ids, got dtype {c.dtype}")
        if (c < 0).any():
            i = int(np.flatnonzero(c < 0)[0])
            raise UserDataError(f"{where}: client has a negative id {c[i].item()!r} (row {i}); ids are >= 0")
    num_classes_of(labels, d.num_classes, where, key)


def num_classes_of(labels: list[np.ndarray], given: Optional[int], where: str, key: str = "num_classes") -> int:
    """``max(label) + 1`` over all labels; gaps refused unless ``given``; labels >= ``given`` refused."""
    top = max(int(a.max()) for a in labels if a.size) + 1
    if given:
        if top > given:
            raise UserDataError(f"{where}: class id {top - 1} >= {key} = {given}; ids are 0..{given - 1}")
        return int(given)
    if top < 2:
        raise UserDataError(f"{where}: every label is 0; a classifier needs at least 2 classes")
    present = np.zeros(top, bool)
    for a in labels:
        present[a] = True
    missing = np.flatnonzero(~present)
    if missing.size:
        shown = ", ".join(str(int(m)) for m in missing[:5]) + (", ..." if missing.size > 5 else "")
        raise UserDataError(
            f"{where}: labels use ids 0..{top - 1} but never {shown}, so num_classes would be {top} with "
            f"{missing.size} empty classes; relabel to 0..{top - missing.size - 1} (np.unique(y, return_inverse=True))"
            f" or set {key} = {top} to keep the ids")
    return top


# --------------------------------------------------------------------------- npz files


def _npy_header(f: Any) -> tuple[tuple[int, ...], np.dtype, int]:
    """(shape, dtype, header length) of one ``.npy`` stream, reading only its header."""
    fmt = np.lib.format
    version = fmt.read_magic(f)
    if version == (1, 0):
        shape, _, dtype = fmt.read_array_header_1_0(f)
    elif version == (2, 0):
        shape, _, dtype = fmt.read_array_header_2_0(f)
    else:
        raise ValueError(f"unsupported .npy format version {version}")
    return tuple(int(s) for s in shape), np.dtype(dtype), int(f.tell())


def inspect_npz(path: Path, max_gb: float = NPZ_OPTIONS["max_gb"]) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """``{name: (shape, dtype)}`` of an npz, from its zip directory and ``.npy`` headers only.

    Refuses (one line) a missing file, a file that is not an npz, a member whose size does
    not match its header (or is larger than the file for a stored member), object arrays,
    arrays lowband does not read, a missing ``x``/``y``, and arrays that would need more than
    ``max_gb`` GB in memory."""
    where = f"data.path: {path}"
    if not path.exists():
        raise UserDataError(f"{where} not found; pass an .npz file holding arrays x and y "
                            f"(numpy.savez('my.npz', x=x, y=y))")
    if not path.is_file():
        raise UserDataError(f"{where} is not a file; pass an .npz file holding arrays x and y")
    if not zipfile.is_zipfile(path):
        raise UserDataError(f"{where} is not an .npz file (not a zip archive); write it with numpy.savez('my.npz', "
                            f"x=x, y=y)")
    size_on_disk = path.stat().st_size
    out: dict[str, tuple[tuple[int, ...], np.dtype]] = {}
    total = 0
    try:
        with zipfile.ZipFile(path) as zf:
            infos = zf.infolist()
            if len(infos) > _MAX_MEMBERS:
                raise UserDataError(f"{where} holds {len(infos)} members; an npz for lowband holds at most "
                                    f"{', '.join(NPZ_KEYS)}")
            for info in infos:
                key = info.filename[:-4] if info.filename.endswith(".npy") else info.filename
                if key not in NPZ_KEYS:
                    raise UserDataError(f"{where} holds {info.filename!r}, which lowband does not read (it reads "
                                        f"{', '.join(NPZ_KEYS)}); rename or drop it")
                if info.compress_type == zipfile.ZIP_STORED and info.file_size > size_on_disk:
                    raise UserDataError(f"{where}: member {key!r} claims {info.file_size} bytes in a file of "
                                        f"{size_on_disk}; the file is corrupt")
                with zf.open(info) as f:
                    shape, dtype, head = _npy_header(f)
                if dtype.hasobject:
                    raise UserDataError(f"{where}: {key} holds Python objects (dtype object); save numeric arrays")
                nbytes = math.prod(shape) * dtype.itemsize
                if info.file_size != head + nbytes:
                    raise UserDataError(f"{where}: {key}'s header says {shape} {dtype} ({nbytes} bytes) but the member "
                                        f"holds {info.file_size - head}; the file is corrupt")
                total += nbytes
                out[key] = (shape, dtype)
    except UserDataError:
        raise
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, ValueError, EOFError) as exc:
        msg = " ".join(str(exc).split()) or type(exc).__name__
        raise UserDataError(f"{where} is not a readable .npz ({msg}); write it with numpy.savez") from None
    if total > max_gb * 1e9:
        raise UserDataError(f"{where}: its arrays need {total / 1e9:.1f} GB in memory, more than data.options.max_gb "
                            f"= {max_gb:g}; raise max_gb if you mean it")
    for key in ("x", "y"):
        if key not in out:
            raise UserDataError(f"{where} has no array {key!r} (it has {', '.join(out) or 'none'}); an npz for "
                                f"lowband holds x (inputs) and y (labels), optionally client, x_test, y_test")
    return out


def _resolve(path: str) -> Path:
    return Path(path).expanduser()


def read_csv(path: Path, max_gb: float = NPZ_OPTIONS["max_gb"]) -> ArrayData:
    """A CSV table (``dataset = "csv"``): a header row naming the columns, then one row per
    sample; column ``y`` holds the labels, an optional column ``client`` the client ids,
    every other column is a float feature. No test table: ``test_fraction`` is held out."""
    import csv

    where = f"data.path: {path}"
    if not path.is_file():
        raise UserDataError(f"{where} not found; pass a CSV file with a header row, a y column (labels) and "
                            f"feature columns" if not path.exists() else f"{where} is not a file")
    size = path.stat().st_size
    if size * 4 > max_gb * 1e9:  # >= 2 characters per value, 8 bytes per parsed value
        raise UserDataError(f"{where}: {size / 1e9:.1f} GB of text may need {4 * size / 1e9:.1f} GB in memory, more "
                            f"than data.options.max_gb = {max_gb:g}; raise max_gb if you mean it")
    try:
        with open(path, newline="", encoding="utf-8") as f:
            header = next(csv.reader(f), None)
            if not header:
                raise UserDataError(f"{where} is empty; expected a header row naming the columns (y, features...)")
            cols = [h.strip() for h in header]
            if "y" not in cols:
                raise UserDataError(f"{where}: no column 'y' in the header ({', '.join(cols[:6])}"
                                    f"{', ...' if len(cols) > 6 else ''}); name the label column y")
            if len(set(cols)) != len(cols):
                raise UserDataError(f"{where}: the header names a column twice")
            import warnings

            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # "input contained no data": refused below, in one line
                table = np.loadtxt(f, delimiter=",", dtype=np.float64, ndmin=2)
    except UserDataError:
        raise
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        msg = " ".join(str(exc).split()) or type(exc).__name__
        raise UserDataError(f"{where} is not a numeric CSV table ({msg})") from None
    if table.shape[0] == 0:
        raise UserDataError(f"{where} has no rows under its header")
    if table.shape[1] != len(cols):
        raise UserDataError(f"{where}: rows have {table.shape[1]} values, the header names {len(cols)} columns")
    feats = [i for i, c in enumerate(cols) if c not in ("y", "client")]
    if not feats:
        raise UserDataError(f"{where}: no feature columns (every column but y and client is a feature)")
    client = None
    if "client" in cols:
        c = table[:, cols.index("client")]
        if not (np.isfinite(c) & (c == np.round(c))).all():
            raise UserDataError(f"{where}: column client must hold integer client ids")
        client = c.astype(np.int64)
    return ArrayData(table[:, feats], table[:, cols.index("y")], client, None, None, None, path.stem)


def load_arrays(path: str, max_gb: float = NPZ_OPTIONS["max_gb"], num_classes: int = 0,
                kind: str = "npz") -> ArrayData:
    """The checked arrays of ``data.path`` (an npz or CSV file, or a ``memory:`` reference)."""
    if path.startswith(MEMORY_PREFIX):
        if path not in _MEMORY:
            raise UserDataError(f"data.path: {path} names arrays given to lowband.experiment() in another process; "
                                f"run with lowband.run(..., out=...) (it writes them to the run folder's data.npz) "
                                f"or save them with numpy.savez and point data.path at the file")
        d = _MEMORY[path]
        return d if not num_classes else ArrayData(d.x, d.y, d.client, d.x_test, d.y_test, num_classes, d.name)
    p = _resolve(path)
    if kind == "csv":
        d = read_csv(p, max_gb)
        d.num_classes = num_classes or None
        check_arrays(d, f"data.path: {p}", "data.options.num_classes")
        return d
    inspect_npz(p, max_gb)
    try:
        with np.load(p, allow_pickle=False) as z:
            got = {k: z[k] for k in z.files}
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as exc:
        msg = " ".join(str(exc).split()) or type(exc).__name__
        raise UserDataError(f"data.path: {p} is not a readable .npz ({msg}); write it with numpy.savez") from None
    d = ArrayData(got["x"], got["y"], got.get("client"), got.get("x_test"), got.get("y_test"),
                  num_classes or None, p.stem)
    check_arrays(d, f"data.path: {p}", "data.options.num_classes")
    return d


def client_count(path: str, max_gb: float = NPZ_OPTIONS["max_gb"], kind: str = "npz") -> Optional[int]:
    """The number of distinct client ids of ``data.path`` (None: no ``client`` array). Reads
    only the headers and the ``client`` array of an npz (a CSV is read whole)."""
    if path.startswith(MEMORY_PREFIX) or kind == "csv":
        d = load_arrays(path, max_gb, kind=kind)
        return None if d.client is None else int(np.unique(d.client).size)
    p = _resolve(path)
    info = inspect_npz(p, max_gb)
    if "client" not in info:
        return None
    try:
        with np.load(p, allow_pickle=False) as z:
            c = z["client"]
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as exc:
        raise UserDataError(f"data.path: {p}: cannot read client ({' '.join(str(exc).split())})") from None
    if c.ndim != 1 or not np.issubdtype(c.dtype, np.integer) or c.dtype == np.bool_ or c.size == 0:
        raise UserDataError(f"data.path: {p}: client must be a 1-D array of integer client ids, got {c.shape} "
                            f"{c.dtype}")
    return int(np.unique(c).size)


# --------------------------------------------------------------------------- dataset


def _layout(x: np.ndarray) -> tuple[np.ndarray, str]:
    if x.ndim == 2:
        return x, "features"
    if x.ndim == 3:
        return x[:, None], "NHW->NCHW"
    if x.shape[-1] in (1, 3, 4) and x.shape[1] not in (1, 3, 4):
        return np.moveaxis(x, -1, 1), "NHWC->NCHW"
    return x, "NCHW"


def _as_float(x: np.ndarray) -> np.ndarray:
    if x.dtype == np.uint8:
        return x.astype(np.float32) / np.float32(255.0)
    return x.astype(np.float32)


def to_dataset_fields(d: ArrayData, *, test_fraction: float, seed: int, normalize: bool,
                      num_classes: int = 0, source: str = "") -> dict[str, Any]:
    """The :class:`~lowband.data.sources.Dataset` fields of user arrays (already checked)."""
    where = f"data.path: {source or d.name}"
    y = d.y.astype(np.int64)
    x, layout = _layout(d.x)
    if d.x_test is not None:
        xt, _ = _layout(d.x_test)
        yt = d.y_test.astype(np.int64)  # type: ignore[union-attr]
        tr = np.arange(y.size)
        train_x, test_x = _as_float(x), _as_float(xt)
    else:
        if not 0 < test_fraction < 1:
            raise UserDataError(f"data.options.test_fraction: must be in (0, 1) when the data has no x_test/y_test "
                                f"(the global test set is carved out of x), got {test_fraction}")
        tr, _, te = split_local(np.arange(y.size), y, (1 - test_fraction, 0.0, test_fraction),
                                np_gen(seed, "npz", "split"))
        if tr.size == 0 or te.size == 0:
            raise UserDataError(f"{where}: {y.size} rows are too few to hold out test_fraction = {test_fraction:g} "
                                f"as the global test set; give x_test/y_test or more rows")
        xf = _as_float(x)
        train_x, test_x, yt = xf[tr], xf[te], y[te]
    train_y = y[tr]
    ncls = num_classes_of([train_y, yt], num_classes or d.num_classes, where,
                          key="data.options.num_classes")
    meta: dict[str, Any] = {"source": "npz", "name": d.name, "layout": layout, "sha256": d.digest,
                            "classes": [str(i) for i in range(ncls)]}
    if normalize:
        axes = (0, 2, 3) if train_x.ndim == 4 else (0,)
        mean = train_x.mean(axis=axes, dtype=np.float64)
        std = train_x.std(axis=axes, dtype=np.float64)
        std = np.where(std < 1e-12, 1.0, std)
        shape = (1, -1, 1, 1) if train_x.ndim == 4 else (1, -1)
        m, s = mean.reshape(shape).astype(np.float32), std.reshape(shape).astype(np.float32)
        train_x, test_x = (train_x - m) / s, (test_x - m) / s
        meta["normalize"] = {"mean": [float(v) for v in mean], "std": [float(v) for v in std]}
    natural = None
    if d.client is not None:
        ids, inv = np.unique(d.client, return_inverse=True)
        inv_tr = inv[tr]
        natural = [np.flatnonzero(inv_tr == k).astype(np.int64) for k in range(ids.size)]
        meta["client_ids"] = [int(i) for i in ids]
    return dict(
        train_x=torch.from_numpy(np.ascontiguousarray(train_x)), train_y=torch.from_numpy(train_y),
        test_x=torch.from_numpy(np.ascontiguousarray(test_x)), test_y=torch.from_numpy(yt.astype(np.int64)),
        num_classes=ncls, input_shape=tuple(int(s) for s in train_x.shape[1:]), meta=meta,
        natural_partition=natural,
    )


@functools.lru_cache(maxsize=4)
def _cached(path: str, kind: str, stamp: tuple[int, int], options: tuple[tuple[str, Any], ...]) -> Any:
    o = dict(options)
    d = load_arrays(path, o["max_gb"], o["num_classes"], kind)
    fields = to_dataset_fields(d, test_fraction=o["test_fraction"], seed=o["seed"], normalize=o["normalize"],
                               num_classes=o["num_classes"], source=path)
    return Dataset(name=kind, **fields)


def load_user_dataset(path: Optional[str], kind: str = "npz", **options: Any) -> Any:
    """The :class:`~lowband.data.sources.Dataset` of ``data.path`` (``kind``: ``npz`` or
    ``csv``) with ``data.options`` (defaults :data:`NPZ_OPTIONS`); cached in-process while
    the file is unchanged."""
    if not path:
        raise UserDataError(f"data.path: dataset {kind!r} needs data.path, the file holding the data")
    o = {**NPZ_OPTIONS, **options}
    if path.startswith(MEMORY_PREFIX):
        stamp = (0, 0)
    else:
        p = _resolve(path)
        if kind == "npz":
            inspect_npz(p, o["max_gb"])  # one-line errors before anything is read (and a changed file re-checked)
        elif not p.is_file():
            read_csv(p, o["max_gb"])  # its one-line error
        st = p.stat()
        stamp = (int(st.st_mtime_ns), int(st.st_size))
        path = str(p.resolve())
    return _cached(path, kind, stamp, tuple(sorted(o.items())))


def check_model_input(exp: Any, ds: Any) -> None:
    """Refuse (one line) a model that cannot read the user's inputs: a token model (text) on
    float data, an image model (a CNN) on feature vectors. Sizes too small for a CNN are
    refused by the model builder itself."""
    from lowband.models import MODELS

    shape = tuple(ds.input_shape)
    images = len(shape) == 3
    what = f"images {shape}" if images else f"feature vectors {shape}"
    for key, name in [("model.name", exp.model.name)] + [("model.mix", m) for m in (exp.model.mix or [])]:
        inputs = getattr(MODELS.get(name), "inputs", "any")
        if inputs == "tokens":
            raise UserDataError(f"{key}: {name} reads token ids (text) and {exp.data.path} holds {what}; use mlp or "
                                f"logreg (any shape)" + (" or a CNN such as cnn_fmnist or simplecnn" if images else ""))
        if inputs == "image" and not images:
            raise UserDataError(f"{key}: {name} is a CNN for images (C, H, W) and {exp.data.path} holds {what}; use "
                                f"mlp or logreg, or give x as (N, C, H, W) images")


def resolve_user_data(d: DataConfig) -> None:
    """``dataset = "npz"``: check the file's headers (cheap, nothing loaded but the client
    ids) and resolve the partition: a file with client ids and no ``data.partition`` in the
    config takes ``partition = "given"`` and ``num_clients`` = its number of clients (written
    into the resolved config, so a resumed run reads the same). Part of the config's
    validation (:func:`lowband.config.resolve.validate`)."""
    if d.dataset not in ("npz", "csv"):
        if d.path is not None:
            raise ConfigError(f"data.path: read only with data.dataset = 'npz' or 'csv' (the user's file); dataset "
                              f"{d.dataset!r} is found under data.data_dir: drop data.path or set dataset = 'npz'")
        if d.partition == "given":
            raise ConfigError("data.partition: 'given' takes the client ids of the user's data (dataset = 'npz' "
                              "with a client array); use 'natural' for a dataset's own clients")
        return
    if not d.path:
        raise ConfigError(f"data.path: dataset {d.dataset!r} needs data.path, the file holding your data (an .npz "
                          f"with arrays x and y: numpy.savez('my.npz', x=x, y=y); or a CSV with a y column)")
    o = {**NPZ_OPTIONS, **d.options}
    if o["num_classes"] != 0 and o["num_classes"] < 2:
        raise ConfigError(f"data.options.num_classes: 0 (max(y) + 1) or a count >= 2, got {o['num_classes']}")
    if not o["max_gb"] > 0:
        raise ConfigError(f"data.options.max_gb: the most memory (GB) the arrays may need, > 0; got {o['max_gb']}")
    if not 0 < o["test_fraction"] < 1:
        raise ConfigError(f"data.options.test_fraction: the share of the rows held out as the global test set when "
                          f"the data has no x_test/y_test, in (0, 1); got {o['test_fraction']}")
    max_gb = float(o["max_gb"])
    clients = client_count(d.path, max_gb, d.dataset)
    if "test_fraction" in d.options and d.dataset == "npz":
        has_test = (load_arrays(d.path).x_test is not None if d.path.startswith(MEMORY_PREFIX)
                    else "x_test" in inspect_npz(Path(d.path).expanduser(), max_gb))
        if has_test:
            raise ConfigError(f"data.options.test_fraction: {d.path} has x_test/y_test, the global test set, so "
                              f"nothing is carved out of x; drop test_fraction")
    if clients is None:
        if d.partition == "given":
            raise ConfigError(f"data.partition: 'given' needs client ids in {d.path} (an array named client, one "
                              f"int per row of x); or choose iid, dirichlet, shards or ntk_fl")
        return
    if "partition" not in d.model_fields_set:
        d.partition = "given"
    if d.partition == "given":
        if "num_clients" not in d.model_fields_set:
            d.num_clients = clients
        elif d.num_clients != clients:
            raise ConfigError(f"data.num_clients: {d.path} gives {clients} distinct client ids and num_clients is "
                              f"{d.num_clients}; drop num_clients (it follows the file) or set it to {clients}")
