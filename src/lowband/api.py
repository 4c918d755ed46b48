"""The Python API: ``import lowband as lb`` (see docs/python-api.md).

- :func:`experiment` builds a validated :class:`~lowband.config.Experiment` from a TOML
  path, a dict, another Experiment or nothing (the defaults), plus keyword overrides
  (``rounds=5``, ``algorithm={"lr": 0.1}`` merged into the section, or dotted keys
  ``**{"algorithm.lr": 0.1}``) and CLI-style ``overrides=["algorithm.lr=0.1"]``.
- :func:`run` runs it, in memory (``write=False``: nothing touches the disk) or into its
  run folder, and returns a :class:`Result`.
- :func:`run_seeds` runs it once per seed (in parallel worker processes) and returns a
  :class:`SeedResults` with mean, std and 95% confidence intervals.
- :func:`sweep` runs a grid of config values (optionally times seeds) and returns a
  :class:`SweepResult` with one table row per cell.
- :func:`load_run` reads any of the three back from its folder.
- :func:`load_plugin` registers algorithms, models, datasets or codecs from a module or a
  ``.py`` file outside the package.

``Result.metrics`` and ``.ledger`` are pandas DataFrames: pandas is an optional extra
(``pip install 'lowband[analysis]'``); without it they raise one line saying so, while
``.records``, ``.ledger_columns``, ``.summary`` and everything else work.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any, Iterator, Mapping, Optional, Sequence

from lowband.config.schema import ConfigError, Experiment
from lowband.config.loading import apply_overrides, load_toml
from lowband.config.resolve import validate

SERVER = -1


def _ensure_plugins() -> None:
    from lowband.plugins import load_entry_points

    load_entry_points()


def _plain(v: Any) -> Any:
    from lowband.data.userdata import ArrayData

    if isinstance(v, ArrayData):
        return v.ref
    if isinstance(v, Path):
        return str(v)
    if isinstance(v, Mapping):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    return v


def _use_arrays(raw: dict[str, Any], data: Any) -> None:
    """``data=lb.arrays(...)``: the data section reads those arrays (``dataset = "npz"``,
    ``path = "memory:..."``); options of another dataset are dropped, the arrays'
    ``num_classes`` (if given) becomes ``options.num_classes``, and arrays with client ids
    replace the section's partition keys (their partition is ``"given"``)."""
    section = raw.get("data") if isinstance(raw.get("data"), dict) else {}
    if section.get("dataset", "digits") != "npz":
        section.pop("options", None)
    section.update({"dataset": "npz", "path": data.ref})
    if data.client is not None:  # the arrays' client ids are the partition (pass none to re-deal the rows)
        for key in ("partition", "num_clients", "alpha", "min_size", "classes_per_client", "samples_per_client"):
            section.pop(key, None)
    if data.num_classes:
        section["options"] = {**section.get("options", {}), "num_classes": int(data.num_classes)}
    raw["data"] = section


def _merge(raw: dict[str, Any], key: str, value: Any) -> None:
    from lowband.batch import set_key
    from lowband.data.userdata import ArrayData

    if key == "data" and isinstance(value, ArrayData):
        _use_arrays(raw, value)
    elif "." in key:
        set_key(raw, key, value)
    elif isinstance(value, dict) and isinstance(raw.get(key), dict):
        for k, v in value.items():
            _merge(raw[key], k, v)
    else:
        raw[key] = value


def experiment(source: str | Path | Mapping[str, Any] | Experiment | None = None, /, *,
               overrides: Sequence[str] = (), **options: Any) -> Experiment:
    """A validated experiment.

    ``source``: a TOML path, a dict shaped like the TOML, an :class:`Experiment` (copied)
    or None (the defaults). ``options``: top-level keys (``rounds=5``), sections merged
    key by key (``algorithm={"lr": 0.1}``) or dotted keys (``**{"comm.codec": "fp16"}``).
    ``overrides``: ``key=value`` strings as on the command line, applied last. Raises
    :class:`~lowband.config.ConfigError` (one line naming the key) on a bad value.
    """
    _ensure_plugins()
    from lowband.batch import raw_config

    if source is None:
        raw: dict[str, Any] = {}
    elif isinstance(source, Experiment):
        raw = raw_config(source)
    elif isinstance(source, (str, Path)):
        raw = load_toml(source)
    elif isinstance(source, Mapping):
        raw = copy.deepcopy(_plain(source))
    else:
        raise ConfigError(f"experiment(): expected a TOML path, a dict or an Experiment, got {type(source).__name__}")
    for key, value in options.items():
        _merge(raw, key, value if key == "data" and _is_arrays(value) else _plain(value))
    raw = apply_overrides(raw, list(overrides))
    data = raw.get("data")
    if isinstance(data, dict) and str(data.get("path", "")).startswith("memory:") and "dataset" not in data:
        data["dataset"] = "npz"  # {"data": {"path": lb.arrays(...)}}
    return validate(raw)


def _is_arrays(v: Any) -> bool:
    from lowband.data.userdata import ArrayData

    return isinstance(v, ArrayData)


def arrays(x: Any, y: Any, *, client: Any = None, x_test: Any = None, y_test: Any = None,
           num_classes: Optional[int] = None, name: str = "arrays") -> Any:
    """Your own data from arrays, for ``experiment(..., data=lb.arrays(x, y))``: ``x`` (N x ...
    float features/images or uint8 images), ``y`` (N int labels), optional ``client`` (N int
    client ids: the partition becomes ``"given"``), ``x_test``/``y_test`` (the global test
    set; else ``data.options.test_fraction`` of the rows is held out) and ``num_classes``
    (to keep label ids with gaps). Checked at once (one-line ``ConfigError``); see
    :mod:`lowband.data.userdata`."""
    from lowband.data.userdata import arrays as _arrays

    return _arrays(x, y, client=client, x_test=x_test, y_test=y_test, num_classes=num_classes, name=name)


def from_torch(dataset: Any, *, test: Any = None, client: Any = None, num_classes: Optional[int] = None,
               name: str = "torch") -> Any:
    """Your own data from a map-style torch ``Dataset`` of (input, label) pairs (and ``test``,
    the global test set), read once into arrays: like :func:`arrays`."""
    from lowband.data.userdata import from_torch as _from_torch

    return _from_torch(dataset, test=test, client=client, num_classes=num_classes, name=name)


def _materialise(e: Experiment, folder: Path) -> tuple[Experiment, Any, Optional[Path]]:
    """For a written run of in-memory arrays: the experiment whose ``data.path`` is
    ``folder/data.npz``, the arrays, and that path (``(e, None, None)`` for file data)."""
    from lowband.data.userdata import MEMORY_PREFIX, RUN_DATA_FILE, load_arrays

    path = e.data.path
    if e.data.dataset != "npz" or not path or not path.startswith(MEMORY_PREFIX):
        return e, None, None
    data = load_arrays(path)
    target = folder / RUN_DATA_FILE
    out = e.model_copy(deep=True)
    out.data.path = str(target)
    if data.num_classes and "num_classes" not in out.data.options:  # an npz does not keep it
        out.data.options = {**out.data.options, "num_classes": int(data.num_classes)}
    return out, data, target


def _write_arrays(data: Any, target: Path) -> None:
    """Keep the arrays in ``target`` (an existing file must hold the same arrays)."""
    from lowband.data.userdata import load_arrays
    from lowband.engine.runlog import RunDirError

    if target.exists():
        if load_arrays(str(target)).digest != data.digest:
            raise RunDirError(f"{target} holds other data than the arrays given; choose another out_dir")
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    data.save(target)


def _as_experiment(exp: Any, options: dict[str, Any]) -> Experiment:
    if isinstance(exp, Experiment) and not options:
        return exp
    return experiment(exp, **options)


# --------------------------------------------------------------------------- results


class Result:
    """One finished run: metrics, ledger, summary, final states and models.

    From :func:`run` (in memory or written) or :func:`load_run` (a run folder).
    """

    #: the folder layout read (see :data:`lowband.report.LAYOUTS`); a Result is always one run
    layout = "run"

    def __init__(self, config: Experiment, summary: dict[str, Any], records: list[dict[str, Any]],
                 ledger_columns: Optional[dict[str, Any]], *, run_dir: Optional[Path] = None,
                 states: Optional[dict[int, Any]] = None, timing: Optional[list[dict[str, Any]]] = None,
                 data_shape: Optional[tuple[int, tuple[int, ...], dict[str, Any]]] = None):
        self.config = config
        self.summary = summary
        #: metrics.jsonl's rows as dicts (no pandas needed)
        self.records = records
        self.timing = timing or []
        self.run_dir = Path(run_dir) if run_dir else None
        self._ledger_columns = ledger_columns
        self._states = states
        self._data_shape = data_shape
        self._sim: Any = None  # a simulation that remakes initial states (initial_state)

    def __repr__(self) -> str:
        final = (self.summary.get("final") or {}).get(self.main_metric)
        acc = f", {self.main_metric}={final:.4f}" if isinstance(final, float) else ""
        where = f", run_dir={str(self.run_dir)!r}" if self.run_dir else ", in memory"
        return (f"Result({self.config.name!r}, {self.config.algorithm.name}, seed={self.config.seed}, "
                f"rounds={self.summary.get('rounds_completed')}{acc}{where})")

    # -- tables ----------------------------------------------------------------------
    @property
    def main_metric(self) -> str:
        return str(self.summary.get("main_metric", ""))

    @property
    def metrics(self) -> Any:
        """pandas DataFrame, one row per evaluated round (the columns of metrics.jsonl)."""
        from lowband.export import record_columns, require_pandas

        pd = require_pandas("Result.metrics")
        return pd.DataFrame.from_records(self.records, columns=record_columns(self.records) or ["round"])

    @property
    def ledger_columns(self) -> dict[str, Any]:
        """The ledger as numpy columns: round, src, dst, direction, kind, bytes, declared."""
        if self._ledger_columns is None:
            raise ValueError(f"{self.run_dir}: no ledger.csv and no checkpoint.pt (the ledger was not kept)")
        return self._ledger_columns

    @property
    def ledger(self) -> Any:
        """pandas DataFrame, one row per ledger record (per message and receiver): round,
        src, dst (-1 = the server), direction (up/down/peer), kind, bytes (encoded, as sent),
        declared (counted but never built)."""
        from lowband.export import LEDGER_COLUMNS, require_pandas

        pd = require_pandas("Result.ledger")
        return pd.DataFrame({k: self.ledger_columns[k] for k in LEDGER_COLUMNS})

    # -- states and models ---------------------------------------------------------------
    @property
    def states(self) -> dict[int, Any]:
        """The final node states (node id -> state dict; -1 is the server)."""
        if self._states is None:
            import torch

            ck = (self.run_dir or Path(".")) / "checkpoint.pt"
            if not ck.exists():
                raise ValueError(f"{self.run_dir}: no checkpoint.pt (checkpoint_every = 0?): the final states were "
                                 f"not kept")
            data = torch.load(ck, map_location="cpu", weights_only=True)
            if int(data["round"]) != int(self.summary.get("rounds_completed") or -1):
                raise ValueError(f"{ck} is from round {data['round']}, not the final round "
                                 f"{self.summary.get('rounds_completed')}")
            self._states = {int(k): v for k, v in data["states"].items()}
        return self._states

    def initial_state(self, node: int) -> Any:
        """Node ``node``'s initial state, as the run made it when the node was first read:
        :attr:`states` lacks the nodes a run never read (node states are made on first use,
        so a client never sampled has none), and their state is still the initial one. It is
        remade from the config (the federation and the round-0 plan it may read, the seed
        ``(seed, "torch", "init", node)``): the same bits. Needs the run's dataset."""
        if self._sim is None:
            from lowband.engine.simulator import Simulation

            exp = self.config
            exp = exp.model_copy(update={
                "executor": "serial", "device": "cpu", "engine": exp.engine.model_copy(update={"workers": 1}),
                "data": exp.data.model_copy(update={"download": False})})
            sim = Simulation(exp, write=False)
            sim.backend.init_states(sim.topology.plan(0) if sim.num_nodes else None)
            self._sim = sim
        return self._sim.executor.init_state(int(node))

    def _builder(self) -> Any:
        from types import SimpleNamespace

        from lowband.engine.simulator import ModelBuilder, model_options

        exp = self.config
        if self._data_shape is None:
            from lowband.data.build import load_data

            ds = load_data(exp.model_copy(update={"data": exp.data.model_copy(update={"download": False})}))
            self._data_shape = (ds.num_classes, tuple(ds.input_shape), dict(ds.meta))
        num_classes, shape, meta = self._data_shape
        mix = list(exp.model.mix or [])
        fed = SimpleNamespace(meta=meta)
        return ModelBuilder(exp.model.name, mix, num_classes, shape,
                            {a: model_options(exp, fed, a) for a in {exp.model.name, *mix}}, exp.seed)  # type: ignore[arg-type]

    def model(self, node: Optional[int] = None) -> Any:
        """The final model of ``node`` as a torch module (default: the server's global model
        where the algorithm has a server). Raises ValueError when that node holds none."""
        from lowband.algorithms import ALGORITHMS
        from lowband.config.resolve import hyperparams
        from lowband.train import load_params

        alg = ALGORITHMS[self.config.algorithm.name](hyperparams(self.config))
        if node is None:
            if not alg.has_server:
                raise ValueError(f"{alg.name} has no server: pass a node id, e.g. model(0)")
            node = SERVER
        states = self.states
        num_nodes = int(self.summary.get("num_nodes") or self.config.data.num_clients)
        if node not in states and not 0 <= node < num_nodes:
            raise ValueError(f"no node {node}; nodes are 0..{num_nodes - 1}"
                             + (" and -1 (the server)" if SERVER in states else ""))
        state = states[node] if node in states else self.initial_state(node)
        params = alg.server_params(state) if node == SERVER else alg.node_params(state)
        if params is None:
            raise ValueError(f"{alg.name}: node {node} holds no model of its own"
                             + (" (clients are stateless: use model() for the server's)" if alg.has_server else ""))
        module = self._builder()(node)
        load_params(module, params)
        module.eval()
        return module

    # -- plotting -----------------------------------------------------------------------
    def plot(self, x: str = "bytes/total", y: Optional[str] = None, *, ax: Any = None, label: Optional[str] = None,
             path: Optional[str | Path] = None) -> Any:
        """Plot metric ``y`` (default: the main metric; accuracies in %) against ``x`` (a
        metrics column such as ``bytes/total`` (cumulative encoded bytes) or ``round``, or
        ``bytes`` = encoded + declared). Returns the matplotlib axes; ``path`` saves a PNG."""
        return _plot([self.records], x, y or self.main_metric, ax=ax, path=path,
                     label=label or f"{self.config.name} ({self.config.algorithm.name})")


def _xy_label(key: str) -> str:
    return {"bytes/total": "cumulative bytes (encoded)", "bytes": "cumulative bytes (encoded + declared)"}.get(key, key)


def _plot(runs_records: Sequence[list[dict[str, Any]]], x: str, y: str, *, ax: Any, path: Any, label: str,
          band: bool = True) -> Any:
    import matplotlib.pyplot as plt

    from lowband.report import mean_band, plot_band

    if ax is None:
        _, ax = plt.subplots(figsize=(6.4, 4.2))
    data = mean_band(runs_records, y, x)
    if data is None:
        raise ValueError(f"no values of {y!r} against {x!r} in these metrics")
    xs, mean, lo, hi = data
    scale = 100.0 if "acc" in y else 1.0
    if band and len(runs_records) > 1:
        plot_band(ax, xs, mean, lo, hi, label=label, scale=scale)
    else:
        ax.plot(xs, [scale * v for v in mean], marker="o" if len(xs) < 30 else None, ms=3, label=label)
    ax.set_xlabel(_xy_label(x))
    ax.set_ylabel(y + (" (%)" if scale == 100.0 else "") + (", mean and 95% CI" if len(runs_records) > 1 else ""))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    if path is not None:
        ax.figure.tight_layout()
        ax.figure.savefig(path, dpi=120)
    return ax


class SeedResults:
    """Several seeds of one experiment: each seed's :class:`Result`, plus mean, std and
    95% confidence intervals (Student t) per round and of the summary.

    ``layout`` says which folder layout was read: ``"seeds"`` (every seed in
    ``run_dir/seed-<s>/``, as :func:`run_seeds` and ``lowband run --seeds`` write) or
    ``"run+seeds"`` (the config's own seed in ``run_dir`` itself and seed ``s`` in
    ``run_dir/seed-<s>/``, as ``lowband reproduce`` writes); ``left_out`` lists the folders
    not read (unfinished, or a seed already found) with the reason."""

    def __init__(self, runs: list[Result], run_dir: Path, aggregate: dict[str, Any], layout: str = "seeds",
                 left_out: Sequence[tuple[Path, str]] = ()):
        self.runs = runs
        self.run_dir = Path(run_dir)
        self._agg = aggregate
        self.layout = layout
        self.left_out = list(left_out)

    def __repr__(self) -> str:
        return (f"SeedResults({self.config.name!r}, seeds={self.seeds}, layout={self.layout!r}, "
                f"run_dir={str(self.run_dir)!r})")

    def __len__(self) -> int:
        return len(self.runs)

    def __iter__(self) -> Iterator[Result]:
        return iter(self.runs)

    def __getitem__(self, i: int) -> Result:
        return self.runs[i]

    @property
    def config(self) -> Experiment:
        return self.runs[0].config

    @property
    def seeds(self) -> list[int]:
        return [r.config.seed for r in self.runs]

    @property
    def main_metric(self) -> str:
        return self.runs[0].main_metric

    @property
    def summary(self) -> dict[str, Any]:
        """``{key: {"n", "mean", "std", "ci_low", "ci_high"}}`` over the seeds for every number
        of the summaries (``final/<metric>``, ``best/<metric>``, ``rounds_to_target``,
        ``bytes_up``, ...), plus ``name``, ``algorithm``, ``main_metric``, ``seeds``."""
        agg = self._agg
        return {"name": agg.get("name"), "algorithm": agg.get("algorithm"), "main_metric": agg.get("main_metric"),
                "seeds": self.seeds, **agg["summary"]}

    @property
    def metrics(self) -> Any:
        """All seeds' metrics in one DataFrame, with a ``seed`` column first."""
        from lowband.export import require_pandas

        pd = require_pandas("SeedResults.metrics")
        return pd.concat([r.metrics.assign(seed=r.config.seed) for r in self.runs], ignore_index=True)[
            ["seed", *self.runs[0].metrics.columns]]

    @property
    def ledger(self) -> Any:
        from lowband.export import require_pandas

        pd = require_pandas("SeedResults.ledger")
        frames = [r.ledger.assign(seed=r.config.seed) for r in self.runs]
        df = pd.concat(frames, ignore_index=True)
        return df[["seed", *(c for c in df.columns if c != "seed")]]

    @property
    def aggregate(self) -> Any:
        """DataFrame, one row per round: ``round``, ``n`` (the seeds with a record at that
        round), then ``<metric>.n`` (the values averaged: a seed that did not measure the
        metric there is not counted), ``.mean``, ``.std``, ``.ci_low``, ``.ci_high`` (the
        95% t interval) of every metric."""
        import io

        from lowband.batch import aggregate_csv_text
        from lowband.export import require_pandas

        pd = require_pandas("SeedResults.aggregate")
        return pd.read_csv(io.StringIO(aggregate_csv_text(self._agg)))

    def plot(self, x: str = "bytes/total", y: Optional[str] = None, *, ax: Any = None, label: Optional[str] = None,
             band: bool = True, path: Optional[str | Path] = None) -> Any:
        """Mean of ``y`` over the seeds against ``x`` with a shaded 95% confidence band."""
        return _plot([r.records for r in self.runs], x, y or self.main_metric, ax=ax, path=path, band=band,
                     label=label or f"{self.config.name} ({self.config.algorithm.name}, {len(self.runs)} seeds)")


class SweepResult:
    """A finished sweep: one row per cell in :attr:`table` and each cell's result."""

    def __init__(self, run_dir: Path, cells: list[tuple[dict[str, Any], Any]]):
        self.run_dir = Path(run_dir)
        #: (swept values, Result or SeedResults) per cell, in grid order
        self.cells = cells

    def __repr__(self) -> str:
        return f"SweepResult({len(self.cells)} cells, run_dir={str(self.run_dir)!r})"

    @property
    def table(self) -> Any:
        """sweep.csv as a DataFrame: swept keys, final main metric (mean, std, 95% CI over
        seeds), best, rounds and bytes to target, traffic."""
        from lowband.export import require_pandas

        pd = require_pandas("SweepResult.table")
        return pd.read_csv(self.run_dir / "sweep.csv")

    @property
    def markdown(self) -> str:
        return (self.run_dir / "sweep.md").read_text()


# --------------------------------------------------------------------------- running


def run(exp: Any = None, /, *, out: Optional[str | Path] = None, write: bool = True, resume: bool = False,
        progress: bool = False, observers: Sequence[Any] = (), **options: Any) -> Result:
    """Run an experiment and return its :class:`Result`.

    ``exp``: anything :func:`experiment` takes (options are applied the same way).
    ``write=False`` runs in memory and writes nothing; otherwise the run goes to ``out``
    (default: the config's ``out_dir``, else ``runs/<name>``), which must not already
    hold results unless ``resume=True`` continues them. ``progress`` draws a bar.
    ``observers``: :class:`lowband.engine.observers.Observer` s of the run (docs/engine.md).
    """
    from lowband.engine.simulator import Simulation

    if out is not None:
        options["out_dir"] = str(out)
    e = _as_experiment(exp, options)
    if not write and e.log.tensorboard:
        from lowband.config.schema import ConfigError

        raise ConfigError("log.tensorboard writes RUN/tb/ in the run folder, and write=False writes nothing; "
                          "run with write=True (and out=...) or drop log.tensorboard")
    data = target = None
    if write:  # in-memory arrays go to the run folder's data.npz, and the config points there
        e_mem = e
        e, data, target = _materialise(e, e.run_dir())
    if data is not None:
        from lowband.engine.runlog import RunLog
        from lowband.engine.simulator import config_errors, make_federation

        RunLog.check(e, resume=resume)
        with config_errors("data"):
            fed = make_federation(e_mem)
        sim = Simulation(e, resume=resume, write=write, federation=fed, observers=observers)
        _write_arrays(data, target)  # type: ignore[arg-type]
    else:
        sim = Simulation(e, resume=resume, write=write, observers=observers)
    bar = None
    if progress:
        from lowband.console import RunProgress

        bar = RunProgress(e.name, sim.main_metric, e.rounds)
        sim.progress = bar
    from lowband.engine.retry import run_retrying

    made = [sim]

    def remake() -> Simulation:  # a lost Ray machine with engine.retries: the run resumed on what is left
        again = Simulation(e, resume=True, write=write, observers=observers,
                           **({"federation": sim.fed} if data is not None else {}))
        again.progress = sim.progress
        made.append(again)
        return again

    try:
        res = run_retrying(sim, lambda s: s.run(), remake)
    finally:
        if bar is not None:
            bar.close()
    sim = made[-1]
    from lowband.export import ledger_columns

    fed = sim.fed
    return Result(e, res.summary, list(res.metrics), ledger_columns(sim.ledger),
                  run_dir=Path(res.run_dir) if res.run_dir else None,
                  states={int(k): v for k, v in sim.executor.state_dict().items()},
                  data_shape=(fed.num_classes, tuple(fed.input_shape), dict(fed.meta)))


def run_seeds(exp: Any = None, /, seeds: Sequence[int] | str = (0, 1, 2), *, out: Optional[str | Path] = None,
              workers: Optional[int] = None, backend: str = "process", progress: Optional[bool] = False,
              **options: Any) -> SeedResults:
    """Run the experiment once per seed into ``out/seed-<s>/`` (default: its run folder),
    in ``min(cores, seeds)`` worker processes (``workers`` to choose; 1 = in this
    process), resuming unfinished seeds and skipping finished ones; then write
    ``aggregate.json``/``aggregate.csv`` and return the :class:`SeedResults`."""
    from lowband.batch import raw_config, run_seeds as _run

    e = _as_experiment(exp, options)
    e, data, target = _materialise(e, Path(out) if out is not None else e.run_dir())
    if data is not None:  # the worker processes read the arrays from out/data.npz
        _write_arrays(data, target)  # type: ignore[arg-type]
    base = _run(raw_config(e), seeds, out=out, workers=workers, backend=backend, progress=progress)
    return _load_seeds(base)


def sweep(exp: Any = None, /, grid: Optional[Mapping[str, Sequence[Any]]] = None, *,
          seeds: Optional[Sequence[int] | str] = None, out: Optional[str | Path] = None, workers: Optional[int] = None,
          backend: str = "process", progress: Optional[bool] = False, **options: Any) -> SweepResult:
    """Run every combination of ``grid`` (``{"comm.codec": ["fp32", "fp16"], ...}``), each
    over ``seeds`` if given, into ``out`` (default ``runs/<name>-sweep``); resumable.
    Writes sweep.md, sweep.csv and plots; returns the :class:`SweepResult`."""
    from lowband.batch import raw_config, run_sweep

    e = _as_experiment(exp, options)
    e, data, target = _materialise(e, Path(out) if out is not None else Path("runs") / f"{e.name}-sweep")
    if data is not None:  # the worker processes read the arrays from out/data.npz
        _write_arrays(data, target)  # type: ignore[arg-type]
    g = {str(k): [_plain(v) for v in vs] for k, vs in (grid or {}).items()}
    for k, vs in g.items():
        if len(vs) < 1:
            raise ConfigError(f"sweep grid: {k!r} has no values")
    out_dir, _ = run_sweep(raw_config(e), g, out=out, seeds=seeds, workers=workers, backend=backend,
                           progress=progress)
    return _load_sweep(out_dir)


def frontier(exp: Any = None, /, methods: str | Sequence[str] = "fedavg", codecs: str | Sequence[str] = "fp32", *,
             seeds: Optional[Sequence[int] | str] = None, link: Optional[str] = None, target: Optional[float] = None,
             out: Optional[str | Path] = None, workers: Optional[int] = None, backend: str = "process",
             progress: Optional[bool] = False, **options: Any) -> Any:
    """``lowband frontier`` from Python: every (method, codec) cell on ``exp``'s federation
    (lowband.tradeoff), resumable; writes frontier.csv/.md/.png into ``out`` (default
    ``runs/<name>-frontier``) and returns a :class:`lowband.tradeoff.FrontierResult`
    (``.rows``: one dict per cell, with the Pareto marks)."""
    from lowband.batch import raw_config
    from lowband.tradeoff import run_frontier

    e = _as_experiment(exp, options)
    e, data, target_path = _materialise(e, Path(out) if out is not None else Path("runs") / f"{e.name}-frontier")
    if data is not None:  # the worker processes read the arrays from out/data.npz
        _write_arrays(data, target_path)  # type: ignore[arg-type]
    m = methods if isinstance(methods, str) else ",".join(methods)
    c = codecs if isinstance(codecs, str) else ",".join(codecs)
    return run_frontier(raw_config(e), m, c, seeds=seeds, link=link, target=target, out=out, workers=workers,
                        backend=backend, progress=progress)


# --------------------------------------------------------------------------- loading


def load_run(path: str | Path) -> Result | SeedResults | SweepResult:
    """Read a finished run folder (a :class:`Result`), a seeds folder (:class:`SeedResults`)
    or a sweep folder (:class:`SweepResult`).

    Seeds come in two layouts (:func:`lowband.report.find_runs`), both read as a
    :class:`SeedResults` whose ``layout`` says which: every seed in ``path/seed-<s>/``
    (``"seeds"``, from :func:`run_seeds` or ``lowband run --seeds``), or a run in ``path``
    plus ``path/seed-<s>/`` beside it (``"run+seeds"``, from ``lowband reproduce``). A run
    folder without finished seed folders is a :class:`Result`, as before."""
    _ensure_plugins()
    from lowband.report import ReportError, find_runs

    p = Path(path)
    if (p / "sweep.json").exists() and not (p / "summary.json").exists():
        return _load_sweep(p)
    try:
        folders = find_runs(p)
    except ReportError as exc:
        if (p / "summary.json").exists():
            raise
        raise ReportError(f"{p}: no summary.json, finished seed-*/ runs or sweep.json (not a finished lowband run "
                          f"folder)" + (f"; {exc}" if "unfinished" in str(exc) else "")) from None
    if folders.layout == "run":
        return _load_one(folders.dirs[0])
    return _load_seeds(p, folders)


def _load_one(p: Path) -> Result:
    from lowband.config.resolve import load_experiment
    from lowband.engine.runlog import RunLog
    from lowband.export import run_ledger
    from lowband.report import load_run as load_record

    rec = load_record(p)
    overrides = []
    from lowband.data.userdata import RUN_DATA_FILE

    if (p / RUN_DATA_FILE).is_file() and load_toml(p / "config.toml").get("data", {}).get("dataset") == "npz":
        overrides.append(f"data.path={json.dumps(str(p / RUN_DATA_FILE))}")  # the run keeps its arrays
    exp = load_experiment(p / "config.toml", overrides)
    return Result(exp, rec.summary, rec.metrics, run_ledger(p), run_dir=p,
                  timing=RunLog.read_jsonl(p / "timing.jsonl"))


def _load_seeds(base: Path, folders: Any = None) -> SeedResults:
    """A seeds folder in either layout (``folders``: its :class:`~lowband.report.RunFolders`,
    found here if not given). The aggregate is ``aggregate.json`` when it covers exactly
    these runs, else computed from them (e.g. the ``lowband reproduce`` layout, which
    writes none)."""
    from lowband.batch import AGGREGATE_JSON, aggregate_dirs
    from lowband.report import find_runs

    folders = folders or find_runs(base)
    dirs = folders.dirs
    agg_path = base / AGGREGATE_JSON
    agg = json.loads(agg_path.read_text()) if agg_path.exists() else aggregate_dirs(dirs)
    if [str(Path(d)) for d in agg.get("runs", [])] != [str(d) for d in dirs]:
        agg = aggregate_dirs(dirs)  # seeds added or moved since the aggregate was written
    elif any("count" not in row for row in agg.get("rounds", [])):
        agg = aggregate_dirs(dirs)  # written before the per-metric counts: recount, never show the run count
    return SeedResults([_load_one(d) for d in dirs], base, agg, layout=folders.layout, left_out=folders.left_out)


def _load_sweep(out: Path) -> SweepResult:
    spec = json.loads((out / "sweep.json").read_text())
    cells = []
    for c in spec["cells"]:
        d = out / c["dir"]
        cells.append((c["params"], _load_one(d) if (d / "summary.json").exists() else _load_seeds(d)))
    return SweepResult(out, cells)


def load_plugin(spec: str | Path) -> Any:
    """Import a plugin module or ``.py`` file that registers algorithms, models, datasets or
    codecs (see :mod:`lowband.plugins`); returns the module."""
    from lowband.plugins import load_plugin as _load

    return _load(spec)


__all__ = ["Result", "SeedResults", "SweepResult", "arrays", "experiment", "from_torch", "frontier", "load_plugin",
           "load_run", "run", "run_seeds", "sweep"]
