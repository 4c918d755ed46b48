"""Data layer: dataset sources, download/verify, partitioners and federations.

Typical use::

    ds = load_dataset("fashion_mnist", "../shared/data")
    fed = build_federation(ds, num_clients=20, partition="dirichlet", alpha=0.5, seed=0)
    mine = load_user_dataset("my.npz")   # your own data (x, y[, client, x_test, y_test]); see userdata
"""

from .download import FileCheck, download, verify
from .errors import DatasetError, PartitionError
from .federation import PARTITIONS, Federation, NodeData, build_federation
from .partition import class_counts, dirichlet, iid, ntk_fl, plot_partition, shards, split_local
from .sources import (
    DATASETS,
    Dataset,
    DatasetInfo,
    clear_cache,
    load_dataset,
    missing_files,
    resolve_data_dir,
)
from .userdata import ArrayData, UserDataError, load_user_dataset

__all__ = [
    "DATASETS", "Dataset", "DatasetError", "DatasetInfo", "FileCheck", "Federation", "NodeData",
    "PARTITIONS", "PartitionError", "build_federation", "class_counts", "clear_cache", "dirichlet",
    "download", "iid", "load_dataset", "missing_files", "ntk_fl", "plot_partition",
    "resolve_data_dir", "shards", "split_local", "verify", "ArrayData", "UserDataError", "load_user_dataset",
]
