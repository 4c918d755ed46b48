"""``lowband reproduce PAPER``: run a paper's table cells, record each run in the results
store and render the paper-vs-lowband table from the store (:mod:`lowband.results.table`).

A paper's cells are the ``[[run]]`` entries of ``experiments/PAPER/reproduce.toml`` (keys
``id``, ``table``, ``row``, ``config``, ``metric``, ``round``, ``paper``, ``paper_unit``,
``reference``, ``seeds``; see :mod:`lowband.reproduce.cells` and docs/user-guide.md).
Papers are looked up in ``--experiments``, else ``./experiments``, else the copy shipped in
the package. Every (config, seed) runs once in its run folder (seed ``s`` other than the
config's own in ``R/seed-<s>/``): a finished run is reused, an interrupted one resumed
(:mod:`lowband.reproduce.plan`). ``--render`` only renders, ``--collect`` records the folders
present, ``--dry-run`` says what each run would do and cost (:mod:`lowband.reproduce.dryrun`),
``--verify CELL`` re-runs a cell against its record (:mod:`lowband.results.verify`).
"""

from __future__ import annotations

from lowband.reproduce.cells import (Cell, _overrides, load_cells, locate, packaged_experiments, run_plan,
                                     seed_overrides, select, with_seeds)
from lowband.reproduce.cli import add_parser, cmd_reproduce
from lowband.reproduce.dryrun import dry_run_line, estimate
from lowband.reproduce.plan import Planned, run_action, run_config
from lowband.results.rundata import RunData, bytes_per_round, value
from lowband.results.table import config_fingerprint, seeds_value, table_markdown

__all__ = ["Cell", "Planned", "RunData", "_overrides", "add_parser", "bytes_per_round", "cmd_reproduce",
           "config_fingerprint", "dry_run_line", "estimate", "load_cells", "locate", "packaged_experiments",
           "run_action", "run_config", "run_plan", "seed_overrides", "seeds_value", "select", "table_markdown",
           "value", "with_seeds"]
