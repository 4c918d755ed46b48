"""Exceptions of the data layer.

Both carry one-line, user-facing messages: which file or request, what was expected,
and how to fix it (design rule 6). They live in their own module so every per-format
loader can raise them without importing the registry in ``sources``.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["DatasetError", "PartitionError", "missing_file", "corrupt_file"]


class DatasetError(Exception):
    """A dataset file is missing, corrupt or of the wrong layout; or a download failed.

    The message is one line naming the file, what was expected, and how to get it.
    """


class PartitionError(ValueError):
    """A partition request cannot be satisfied (e.g. Dirichlet ``min_size`` never met)."""


def _get_hint(dataset: str, data_dir: Path, force: bool) -> str:
    cmd = f"lowband download {dataset} --data-dir {data_dir}" + (" --force" if force else "")
    return f"Get it with `{cmd}` or point --data-dir/LOWBAND_DATA at a folder that has it."


def missing_file(dataset: str, path: Path, expected: str, data_dir: Path) -> DatasetError:
    """The standard one-line error for a file that is not there."""
    return DatasetError(
        f"{dataset}: missing {path} ({expected}). {_get_hint(dataset, data_dir, False)}"
    )


def corrupt_file(
    dataset: str, path: Path, problem: str, expected: str, data_dir: Path
) -> DatasetError:
    """The standard one-line error for a file that is present but unreadable or wrong."""
    problem = " ".join(str(problem).split())  # keep it on one line
    return DatasetError(
        f"{dataset}: corrupt {path} ({problem}; expected {expected}). "
        f"{_get_hint(dataset, data_dir, True).replace('Get it', 'Re-download it')}"
    )
