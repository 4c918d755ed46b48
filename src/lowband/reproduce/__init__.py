"""``lowband reproduce PAPER``: run a paper's table cells and write paper-vs-ours tables.

A paper's cells are listed in ``experiments/PAPER/reproduce.toml``::

    paper = "spark"

    [[run]]
    id = "table1/a0.1/spark"          # unique cell id (``--only`` matches it)
    table = "table1"                  # section of the output
    row = "SPARK"                     # optional label
    config = "experiments/spark/spark_a0.1.toml"
    metric = "rounds_to_target"       # see below
    round = 50                        # optional: the value at this round, not the last one
    paper = 6                         # the paper's number (or text such as "200+")
    paper_unit = "rounds"             # optional: "%", "GB", "MB", "rounds", "s"
    reference = "experiments/..."     # comm_reduction only: the baseline config
    seeds = [0, 1, 2]                 # optional: run the config once per seed

Metrics: any key of ``metrics.jsonl`` (accuracies shown in %, cumulative ``bytes/...`` in GB
unless ``paper_unit`` says MB); ``rounds_to_target`` (first evaluated round whose main
metric reaches the config's ``eval.target``); ``bytes_per_round`` (encoded + declared bytes
per round, MB); ``comm_reduction`` (``100 (1 - bytes_per_round / reference's)``, %);
``time/elapsed_s`` and ``time/round_s`` (mean) from ``timing.jsonl``.

Seeds: ``seeds = [...]`` at the top of reproduce.toml (every cell) or in a ``[[run]]``
(that cell), or ``--seeds 0,1,2`` (every selected cell), runs the config once per seed.
The config's own seed (``seed``, default 0) runs in the config's run folder ``R`` as
before; seed ``s`` runs in ``R/seed-<s>/`` (as ``lowband run CONFIG seed=s
out_dir=R/seed-<s>``). A folder ``R`` made by ``lowband run CONFIG --seeds ...`` (every
seed in ``R/seed-<s>/``, nothing run in ``R`` itself) is read and extended the same way.
A cell's value is then ``mean ± std (n=...)`` over every seed run found for its config
(also seeds no cell asked for), and the per-seed values are listed below its table.

Where the papers are: ``--experiments DIR`` if given, else ``./experiments`` when it holds
``PAPER/reproduce.toml`` (a source checkout, or your own papers), else the copy shipped in
the package (``lowband/experiments``, package data), so an installed lowband reproduces in
any folder. A ``config`` path ``experiments/X/Y.toml`` is read from that folder.

Every config runs once however many cells use it, in its own run folder (the config's
``out_dir``, else ``runs/<name>``, relative to the current folder): a finished run is
reused, an interrupted one is resumed from its checkpoint (or restarted from round 0 when
it was killed before its first checkpoint), and ``--rounds N`` shortens (or extends) runs.
Each run made or reused is then recorded in the results store (``--store``, default
``docs/results/records`` in a checkout: ``STORE/PAPER/<config>/seed-<s>.jsonl``, see
:mod:`lowband.results.store`), and the table is rendered from the store alone
(:func:`table_markdown`): run folders may be deleted, the page stays the same.
``--render`` runs nothing and renders; ``--dry-run`` runs and writes nothing: for every run
it says what a real run would do with its folder (:func:`run_action`) and the CPU-hours it
still needs, timed on the store's records of its config (:func:`estimate`).
``--verify CELL`` re-runs a cell's config (its first ``--rounds`` rounds) in a scratch
folder and compares every metric of every round with the store's record, naming the
commits of both sides (:mod:`lowband.results.verify`). The table goes to ``--out`` (a
folder, or a ``.md`` file; default ``results/PAPER_table.md``; nothing is written under
``docs/`` unless ``--out`` says so).
"""

from __future__ import annotations

from lowband.reproduce.cells import (UNITS, Cell, _overrides, config_seed, experiment_roots, load_cells, locate,
                                     packaged_experiments, resolve_config, run_plan, seed_overrides, select,
                                     with_seeds)
from lowband.reproduce.cli import add_parser, cmd_reproduce, output_path
from lowband.reproduce.dryrun import Estimate, dry_run, dry_run_line, estimate, rounds_to_go
from lowband.reproduce.plan import Action, Planned, run_action, run_config, run_name, short
from lowband.reproduce.rundata import RunData, bytes_per_round, number_text, on_cpu, run_of_record, unlearned_text, value
from lowband.reproduce.table import Tabulator, cell_row, compute_line, config_fingerprint, seeds_value, table_markdown

__all__ = ["Cell", "add_parser", "cmd_reproduce", "load_cells", "locate", "packaged_experiments", "run_plan",
           "seed_overrides", "select", "table_markdown", "value", "with_seeds"]
