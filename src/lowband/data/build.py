"""A federation from a config: the dataset the ``[data]`` section names, split as it says.

The data layer's one entry from an :class:`~lowband.config.schema.Experiment`: the
simulator builds its federation here, and so does an algorithm that evaluates on another
config's split (DENSE's ``eval_reference``) without loading configs or building a
simulation itself. Only the schema and the config loader are imported from lowband.config
(both below this module).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lowband.config.loading import load_toml
from lowband.config.schema import Experiment, parse_experiment
from lowband.data.federation import Federation, build_federation
from lowband.data.sources import Dataset, load_dataset

_BY_PATH: dict[str, Federation] = {}


def load_data(exp: Experiment) -> Dataset:
    """The experiment's dataset: a built-in or plugin one by name, or the user's npz
    (``data.dataset = "npz"``, :mod:`lowband.data.userdata`)."""
    d = exp.data
    if d.dataset in ("npz", "csv"):
        from lowband.data.userdata import check_model_input, load_user_dataset

        ds = load_user_dataset(d.path, d.dataset, **d.options)
        check_model_input(exp, ds)
        return ds
    return load_dataset(d.dataset, d.data_dir, download=d.download, **d.options)


def make_federation(exp: Experiment) -> Federation:
    """Load the dataset and split it among the nodes as the config says."""
    d = exp.data
    ds = load_data(exp)
    return build_federation(
        ds, num_clients=d.num_clients, partition=d.partition, alpha=d.alpha, min_size=d.min_size,
        classes_per_client=d.classes_per_client, samples_per_client=d.samples_per_client,
        split=tuple(d.split), public_size=d.public_size, public_source=d.public_source,
        seed=exp.seed if d.seed is None else d.seed,
        augment=d.augment, index_map=_index_map(d),
    )


def _index_map(d: Any) -> Any:
    """The validated index map of ``partition = "index_map"`` (None for every other partition)."""
    if d.partition != "index_map":
        return None
    from lowband.data.indexmap import read_index_map

    return read_index_map(d.index_map, d.data_dir)


def federation_of_config(path: str | Path) -> Any:
    """The federation of the config file ``path``, built once per process: its ``[data]``
    section and seed as the schema reads them, with the user's data file resolved as
    validation resolves it (:func:`lowband.data.userdata.resolve_user_data`), so it is the
    federation a run of that config trains on. For evaluation on another config's split."""
    key = str(path)
    if key not in _BY_PATH:
        from lowband.data.userdata import resolve_user_data

        exp = parse_experiment(load_toml(path))
        resolve_user_data(exp.data)
        _BY_PATH[key] = make_federation(exp)
    return _BY_PATH[key]
