"""The ``lowband`` command line: run (one seed or several), sweep, frontier, compare, export, list,
demo, partition, download, reproduce. Global options (anywhere on the line): ``-v``, ``-q``,
``--log-level``, ``--plugin MODULE_OR_FILE``; ``lowband --version``.

Every user error (bad config, missing data file, occupied run folder) is printed as one
line on stderr and exits with status 2, before anything is written. A run that works but
probably not as meant (lowband.engine.checks.LowbandWarning) prints one
``lowband: warning: ...`` line on stderr, once per run.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Optional, Sequence

from lowband.console import RunProgress as _Progress

EXIT_USAGE = 2


def _user_errors() -> tuple[type[BaseException], ...]:
    from lowband.comm.wire import WireError
    from lowband.config.schema import ConfigError
    from lowband.data.errors import DatasetError, PartitionError
    from lowband.engine.retry import LostWorkerError
    from lowband.engine.runlog import RunDirError
    from lowband.report import ReportError

    return (ConfigError, DatasetError, PartitionError, RunDirError, ReportError, WireError, LostWorkerError)


def cmd_run(args: argparse.Namespace) -> int:
    from lowband.config.resolve import load_experiment
    from lowband.engine.runlog import RunLog
    from lowband.engine.simulator import Simulation

    overrides = list(args.overrides)
    if args.data_dir:
        overrides.append(f"data.data_dir={_toml_str(args.data_dir)}")
    if args.out:
        overrides.append(f"out_dir={_toml_str(args.out)}")
    if getattr(args, "tensorboard", False):
        overrides.append("log.tensorboard=true")
    if args.seeds:  # one run folder per seed plus the aggregate (lowband.batch)
        from lowband.batch import cmd_run_seeds

        return cmd_run_seeds(args, overrides)
    from lowband.comm.links import format_seconds

    exp = load_experiment(args.config, overrides)
    RunLog.check(exp, resume=args.resume)  # refuse an unusable run folder before building anything
    sim = Simulation(exp, resume=args.resume)
    bar = _Progress(exp.name, sim.main_metric, exp.rounds, quiet=args.quiet)
    try:
        from lowband.engine.retry import run_retrying  # a lost Ray machine: engine.retries

        res = run_retrying(sim, lambda s: s.run() if bar._bar is None else _run_with(s, bar),
                           lambda: Simulation(exp, resume=True))
    finally:
        bar.close()
    s = res.summary
    final = (s.get("final") or {}).get(s["main_metric"])
    value = f"{100 * final:.2f}%" if isinstance(final, (int, float)) else "n/a (not measured or not finite)"
    print(f"{exp.name}: {s['main_metric']} = {value} after {s.get('rounds_completed')} rounds; "
          f"up {s['bytes_up'] / 1e6:.2f} MB, down {s['bytes_down'] / 1e6:.2f} MB, peer {s['bytes_peer'] / 1e6:.2f} MB"
          + (f" (+{sum(s[f'declared_bytes_{d}'] for d in ('up', 'down', 'peer')) / 1e6:.1f} MB declared)"
             if any(s[f'declared_bytes_{d}'] for d in ('up', 'down', 'peer')) else "")
          + (f"; simulated link time {format_seconds(s['sim_time_s'])}" if s.get("sim_time_s") is not None else "")
          + f" -> {res.run_dir}")
    return 0


def _run_with(sim: Any, bar: _Progress) -> Any:
    sim.progress = bar
    return sim.run()


def _toml_str(s: str) -> str:
    return '"' + str(s).replace("\\", "\\\\").replace('"', '\\"') + '"'


def cmd_compare(args: argparse.Namespace) -> int:
    from lowband.report import compare

    out = Path(args.out) if args.out else Path(args.runs[0]).parent / "compare"
    table, plots = compare(args.runs, out, args.metric)
    print(table)
    print(f"wrote {out / 'compare.md'} and " + ", ".join(str(p) for p in plots))
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    from lowband.algorithms import ALGORITHMS
    from lowband.algorithms.base import describe_hyperparams
    from lowband.comm.codecs import CODEC_STATE, CODECS
    from lowband.data.sources import DATASETS
    from lowband.models import MODELS
    from lowband.topology import TOPOLOGIES

    what = args.what
    if what in (None, "datasets"):
        print("datasets:")
        for name, info in DATASETS.items():
            print(f"  {name:<14} {getattr(info, 'description', '')}")
    if what in (None, "models"):
        print("models:")
        for name, info in MODELS.items():
            kw = ", ".join(f"{k}={v!r}" for k, v in (getattr(info, "kwargs", {}) or {}).items())
            print(f"  {name:<16} {getattr(info, 'description', '')}" + (f"  [{kw}]" if kw else ""))
    if what in (None, "algorithms"):
        print("algorithms:")
        for name, cls in sorted(ALGORITHMS.items()):
            print(f"  {name:<12} ({cls.family}) {cls.paper}")
            for hp, (default, desc) in describe_hyperparams(cls).items():
                print(f"      {hp} = {default!r}  {desc}")
    if what in (None, "codecs"):
        print("codecs (combine with '+', e.g. topk(0.01)+fp16; state: what the sender keeps between messages):")
        for name, info in CODECS.items():
            state = CODEC_STATE.get(name.split("(", 1)[0], "none")
            print(f"  {name:<18} {info if isinstance(info, str) else getattr(info, 'description', '')}"
                  f"  [state: {state}]")
    if what in (None, "topologies"):
        from lowband.config.resolve import topology_defaults

        print("topologies: (the [topology] keys each kind reads, with the defaults a run uses)")
        for name, info in TOPOLOGIES.items():
            params = ", ".join(f"{k}={v!r}" for k, v in topology_defaults(name).items())
            print(f"  {name:<14} {info['description']}" + (f"  [{params}]" if params else ""))
    if what in (None, "server_opts"):
        from lowband.algorithms.server.fedavg import FedAvgHP
        from lowband.algorithms.server.server_opt import SERVER_OPT_INFO, server_opt_params

        print("server_opts: (algorithm.server_opt of fedavg and fedprox, keys with their defaults; state: the "
              "server's, checkpointed; SCAFFOLD is an algorithm)")
        for name, info in SERVER_OPT_INFO.items():
            params = ", ".join(f"{k}={v!r}" for k, v in server_opt_params(name, FedAvgHP.model_fields).items())
            state = {"sgd": "none", "avgm": "m"}.get(name, "m, v")
            print(f"  {name:<8} {info}  [{params}] [state: {state}]")
    if what in (None, "links"):
        from lowband.comm.links import PRESETS, describe

        print("links: ([links] preset = NAME; figures and sources in docs/user-guide.md, \"Link models\")")
        for name, p in PRESETS.items():
            print(f"  {name:<14} {p.description}\n      {describe(p)}")
    if what in (None, "devices"):
        from lowband.devices.compute import CLASSES

        print("devices: ([devices] mix = { NAME = share, ... }; figures and sources in docs/devices.md)")
        for name, c in CLASSES.items():
            print(f"  {name:<12} {c.description}\n      {c.flops:.4g} FLOP/s, {c.power_w:.4g} W, "
                  f"{c.joules_per_flop * 1e12:.4g} pJ/FLOP")
    if what in (None, "privacy"):
        from lowband.config.schema import DPConfig, SecAggConfig
        from lowband.privacy.central import CENTRAL_DP_RELEASES
        from lowband.privacy.secagg_steps import SECAGG_SERVES

        print("privacy: ([dp] mechanism = NAME, [secagg] enabled = true; docs/privacy.md)")
        print(f"  central      DP-FedAvg at the server (McMahan et al. 2018): {', '.join(sorted(a for a, n in CENTRAL_DP_RELEASES.items() if n == 1))}")
        print("  local        clip(S)+gauss(z) on every sender before the codec: any method")
        print("  distributed  Skellam noise inside secure aggregation (Agarwal et al. 2021): with [secagg]")
        print(f"  secagg       SecAgg+ (Bell et al. 2020), messages counted: {', '.join(SECAGG_SERVES)}; uplink fp32")
        for title, model in (("dp", DPConfig), ("secagg", SecAggConfig)):
            for key, f in model.model_fields.items():
                print(f"      {title}.{key} = {f.default!r}  {f.description or ''}")
    return 0


def cmd_partition(args: argparse.Namespace) -> int:
    from lowband.config.resolve import load_experiment
    from lowband.data.partition import plot_partition
    from lowband.data.build import make_federation

    overrides = list(args.overrides)
    if args.data_dir:
        overrides.append(f"data.data_dir={_toml_str(args.data_dir)}")
    exp = load_experiment(args.config, overrides, needs_algorithm=False)  # the data keys only
    if args.export:  # one data file per client, for SuperNodes (lowband.flower.datafile)
        from lowband.flower.datafile import export_for_run

        print(export_for_run(exp, Path(args.export)))
        return 0
    fed = make_federation(exp)
    counts = fed.class_counts()
    c = counts.shape[1]
    print(f"{exp.data.dataset}: {len(fed.nodes)} clients, partition={exp.data.partition}"
          + (f", alpha={exp.data.alpha}" if exp.data.alpha else "")
          + f"; global test {int(fed.global_test_y.shape[0])}; public {int(fed.public_y.shape[0])}")
    imap = fed.meta["federation"].get("index_map")
    if imap:
        print(f"index map {exp.data.index_map} (sha256 {imap['sha256'][:12]}): its first {imap['clients']} of "
              f"{imap['of']} clients, {imap['indices']} indices, {imap['distinct']} distinct ({imap['shared']} "
              f"held by more than one client)")
    sizes = counts.sum(axis=1)
    for line in fed.meta.get("stats_lines", []):  # a natural source's own statistics (shakespeare)
        print(line)
    shown = counts if c <= 20 else counts[:, :0]  # many classes (characters): totals only
    print("client " + " ".join(f"{j:>5}" for j in range(shown.shape[1])) + "   total  train   val  test")
    show = range(len(fed.nodes)) if args.all or len(fed.nodes) <= 40 else list(range(20)) + list(range(len(fed.nodes) - 5, len(fed.nodes)))
    prev = -1
    for i in show:
        if i != prev + 1:
            print("  ...")
        nd = fed.nodes[i]
        print(f"{i:>6} " + " ".join(f"{int(v):>5}" for v in shown[i])
              + f" {int(sizes[i]):>7} {nd.n_train:>6} {int(nd.val_y.shape[0]):>5} {int(nd.test_y.shape[0]):>5}")
        prev = i
    out = Path(args.out or f"partition_{exp.name}.png")
    plot_partition(counts, out, title=f"{exp.data.dataset} {exp.data.partition}"
                   + (f" alpha={exp.data.alpha}" if exp.data.alpha else ""))
    print(f"wrote {out}")
    return 0


def cmd_download(args: argparse.Namespace) -> int:
    from lowband.data.download import download
    from lowband.data.sources import resolve_data_dir

    from lowband.data.errors import DatasetError

    try:
        paths = download(args.dataset, resolve_data_dir(args.data_dir), base_url=args.mirror, force=args.force)
    except ValueError as exc:  # a bundled or unknown dataset name
        raise DatasetError(str(exc)) from None
    for p in paths:
        print(f"ok {p}")
    return 0


#: the demo's algorithms; local settings are shortened for speed (paper defaults elsewhere)
DEMO_ALGORITHMS: list[tuple[str, dict[str, Any]]] = [
    ("local", {"local_epochs": 1, "batch_size": 16, "lr": 0.05}),
    ("fedavg", {"local_epochs": 2, "batch_size": 16, "lr": 0.05}),
    ("fedprox", {"local_epochs": 2, "batch_size": 16, "lr": 0.05, "mu": 0.1}),
    ("dfedavg", {"local_epochs": 2, "batch_size": 16, "lr": 0.05}),
    ("dfedavgm", {"local_epochs": 2, "batch_size": 16, "lr": 0.01, "momentum": 0.9}),
    ("dpsgd", {"batch_size": 16, "lr": 0.1}),  # one minibatch step per round (Lian et al.)
]


def demo_config(algorithm: str, hp: dict[str, Any], out_root: Path, rounds: int) -> dict[str, Any]:
    """The embedded demo: scikit-learn's digits (real 8x8 images, shipped with the
    package), 20 clients with Dirichlet(0.5) label skew, an MLP, 75/25 local splits."""
    peer = {"kind": "kregular", "k": 3}
    family_topology = {"dfedavg": peer, "dfedavgm": peer, "dpsgd": peer}
    protocols = ["personal", "consensus"] if algorithm in family_topology else ["personal", "global"]
    if algorithm == "local":
        protocols = ["personal", "consensus"]
    return {
        "name": f"demo-{algorithm}", "seed": 0, "rounds": rounds, "out_dir": str(out_root / algorithm),
        "threads": 1,  # tiny models: one thread avoids OpenMP oversubscription
        "data": {"dataset": "digits", "num_clients": 20, "partition": "dirichlet", "alpha": 0.5, "min_size": 20,
                 "split": [0.75, 0.0, 0.25]},
        "model": {"name": "mlp", "hidden": 64},
        "algorithm": {"name": algorithm, **hp},
        "topology": family_topology.get(algorithm, {"kind": "star", "sampling": "fraction", "fraction": 0.5}),
        "eval": {"protocols": protocols, "main": "personal/acc_weighted", "target": 0.85},
    }


def cmd_demo(args: argparse.Namespace) -> int:
    from lowband.config.resolve import validate
    from lowband.engine.simulator import Simulation
    from lowband.report import compare

    out_root = Path(args.out or f"runs/demo-{time.strftime('%Y%m%d-%H%M%S')}")
    if out_root.exists() and any(out_root.iterdir()):
        from lowband.engine.runlog import RunDirError

        raise RunDirError(f"demo folder {out_root} already exists and is not empty; pass --out NEWDIR")
    t0 = time.perf_counter()
    dirs = []
    for alg, hp in DEMO_ALGORITHMS:
        exp = validate(demo_config(alg, hp, out_root, args.rounds))
        sim = Simulation(exp)
        bar = _Progress(f"{alg:<8}", sim.main_metric, exp.rounds, quiet=args.quiet)
        try:
            res = _run_with(sim, bar)
        finally:
            bar.close()
        dirs.append(res.run_dir)
    table, plots = compare(dirs, out_root, "personal/acc_weighted")
    print()
    print("lowband demo: digits (sklearn, 1797 real 8x8 images), 20 clients, Dirichlet 0.5, MLP, "
          f"{args.rounds} rounds; personal = each client's model (or the global one) on its local test split")
    print(table)
    print(f"wrote {out_root / 'compare.md'}, " + ", ".join(str(p) for p in plots)
          + f" in {time.perf_counter() - t0:.1f} s")
    return 0


def build_parser() -> argparse.ArgumentParser:
    from lowband import __version__

    p = argparse.ArgumentParser(prog="lowband", description="Communication-efficient federated learning, byte-exact.")
    p.add_argument("--version", action="version", version=f"lowband {__version__}")
    _add_global_options(p)
    sub = p.add_subparsers(dest="cmd", required=True)

    r = sub.add_parser("run", help="run an experiment from a TOML config")
    r.add_argument("config", help="path of the experiment's .toml file")
    r.add_argument("overrides", nargs="*", help="section.key=value overrides, e.g. algorithm.lr=0.05 rounds=20")
    r.add_argument("--resume", action="store_true", help="continue the run in its run folder from its checkpoint")
    r.add_argument("--data-dir", help="dataset folder (else $LOWBAND_DATA, else the user cache)")
    r.add_argument("--out", help="run folder (default runs/<name>)")
    r.add_argument("--quiet", action="store_true", help="no progress bar")
    r.add_argument("--tensorboard", action="store_true",
                   help="also write the metrics to RUN/tb/ for TensorBoard (log.tensorboard; extra lowband[tensorboard])")
    r.add_argument("--seeds", help="run once per seed (e.g. 0,1,2 or 0-4) into <out>/seed-<s>/, plus "
                                   "aggregate.json/.csv with mean, std and 95%% CI; resumable")
    r.add_argument("--workers", type=int, help="with --seeds: worker processes (default: min(cores, seeds))")
    r.add_argument("--backend", choices=["process", "ray", "serial"], default="process",
                   help="with --seeds: where the runs go (default process pool)")
    r.set_defaults(fn=cmd_run)

    sw = sub.add_parser("sweep", help="run a grid of config values (key=a,b,c ...), resumable; table and plots")
    sw.add_argument("config", help="path of the experiment's .toml file")
    sw.add_argument("overrides", nargs="*", help="key=a,b,c sweeps the key over the values; key=value fixes it")
    sw.add_argument("--seeds", help="run every cell once per seed (e.g. 0,1,2); tables show mean ± std")
    sw.add_argument("--out", help="sweep folder (default runs/<name>-sweep)")
    sw.add_argument("--workers", type=int, help="worker processes (default: min(cores, runs))")
    sw.add_argument("--backend", choices=["process", "ray", "serial"], default="process",
                    help="process pool (default), Ray tasks (extra lowband[ray]) or serial in this process")
    sw.add_argument("--data-dir", help="dataset folder (else $LOWBAND_DATA, else the user cache)")
    sw.add_argument("--quiet", action="store_true", help="no progress bar")
    sw.set_defaults(fn=cmd_sweep)

    ex = sub.add_parser("export", help="metrics, ledger and timing tables of a run (or seeds) folder as CSV or Parquet")
    ex.add_argument("run", help="a finished run folder or a seeds folder")
    ex.add_argument("--format", choices=["csv", "parquet"], default="csv",
                    help="csv (default) or parquet (needs pyarrow: pip install 'lowband[analysis]')")
    ex.add_argument("--out", help="output folder (default RUN/export)")
    ex.set_defaults(fn=cmd_export)

    c = sub.add_parser("compare", help="Markdown table and PNG curves of finished runs")
    c.add_argument("runs", nargs="+", help="run folders")
    c.add_argument("--out", help="output folder (default: <first run's parent>/compare)")
    c.add_argument("--metric", help="metric key to compare (default: each run's main metric)")
    c.set_defaults(fn=cmd_compare)

    ls = sub.add_parser("list", help="datasets, models, algorithms (with hyperparameters), codecs, topologies, "
                                     "link presets, device classes")
    ls.add_argument("what", nargs="?", choices=["datasets", "models", "algorithms", "codecs", "topologies", "server_opts",
                                                    "links", "devices", "privacy"])
    ls.set_defaults(fn=cmd_list)

    d = sub.add_parser("demo", help="several algorithms on the embedded digits data (no files needed)")
    d.add_argument("--out", help="output folder (default runs/demo-<time>)")
    d.add_argument("--rounds", type=int, default=20)
    d.add_argument("--quiet", action="store_true")
    d.set_defaults(fn=cmd_demo)

    pa = sub.add_parser("partition", help="per-client class counts of a config's federation, and a picture")
    pa.add_argument("config")
    pa.add_argument("overrides", nargs="*")
    pa.add_argument("--data-dir")
    pa.add_argument("--out", help="PNG path (default partition_<name>.png)")
    pa.add_argument("--all", action="store_true", help="print every client")
    pa.add_argument("--export", metavar="DIR", help="write one npz per client and index.json into DIR (each "
                    "Flower SuperNode reads its own: node config data-file)")
    pa.set_defaults(fn=cmd_partition)

    dl = sub.add_parser("download", help="download a dataset with checksum verification")
    dl.add_argument("dataset")
    dl.add_argument("--data-dir")
    dl.add_argument("--mirror", help="base URL of a mirror with the same layout")
    dl.add_argument("--force", action="store_true")
    dl.set_defaults(fn=cmd_download)

    from lowband.tradeoff import add_parser as add_frontier  # lowband frontier CONFIG --methods --codecs

    add_frontier(sub)
    from lowband.reproduce import add_parser as add_reproduce  # lowband reproduce PAPER

    add_reproduce(sub)
    from lowband.results.cli import add_parser as add_record  # lowband record import RUN

    add_record(sub)
    return p


def cmd_sweep(args: argparse.Namespace) -> int:
    from lowband.batch import cmd_sweep as run_sweep

    return run_sweep(args)


def cmd_export(args: argparse.Namespace) -> int:
    from lowband.export import cmd_export as export

    return export(args)


def _add_global_options(p: argparse.ArgumentParser) -> None:
    """Options accepted anywhere on the line (taken out by :func:`_global_options`)."""
    g = p.add_argument_group("global options (anywhere on the line)")
    g.add_argument("-v", "--verbose", action="store_true", help="debug messages (per-round lines, plugins)")
    g.add_argument("-q", action="store_true", help="warnings and errors only, no progress bars")
    g.add_argument("--log-level", choices=["debug", "info", "warning", "error"], help="message level (default info)")
    g.add_argument("--plugin", action="append", metavar="MODULE_OR_FILE",
                   help="import and EXECUTE a plugin's code (a module name or a .py file), with your permissions, "
                        "so it can register algorithms, models, datasets or codecs; only pass code you trust; "
                        "repeatable")


def _global_options(argv: Sequence[str]) -> tuple[list[str], str, list[str]]:
    """Take ``-v``, ``-q``, ``--log-level L`` and ``--plugin X`` out of ``argv`` wherever they
    are (``lowband run cfg.toml --plugin my.py -v``); returns (rest, level, plugins)."""
    rest: list[str] = []
    level, plugins = "info", []
    it = iter(argv)
    for a in it:
        if a == "--":
            rest += [a, *it]
            break
        if a in ("-v", "--verbose"):
            level = "debug"
        elif a == "-q":
            level = "warning"
        elif a in ("--log-level", "--plugin") or a.startswith(("--log-level=", "--plugin=")):
            name, eq, val = a.partition("=")
            if not eq:
                val = next(it, "")
                if not val or val.startswith("-"):
                    raise ValueError(f"{name} needs a value, e.g. {name} " + ("my_alg.py" if name == "--plugin" else "debug"))
            if name == "--plugin":
                plugins.append(val)
            else:
                level = val.lower()
        else:
            rest.append(a)
    return rest, level, plugins


def _show_warning(message: Any, category: type[Warning], filename: str, lineno: int,
                  file: Any = None, line: Optional[str] = None) -> None:
    """lowband's own warnings as one ``lowband: warning: ...`` line; others as Python shows them."""
    from lowband.engine.checks import LowbandWarning

    if issubclass(category, LowbandWarning):
        print(f"lowband: warning: {str(message).splitlines()[0]}", file=sys.stderr)
    else:
        sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised like Ctrl-C so that ``finally`` blocks and exit handlers run: a killed
    run keeps its last checkpoint as before, and also removes what it owns on disk (a SPARK
    run's ``X P`` scratch files, up to 21 GB at the paper's size), which the default SIGTERM
    action would leave behind."""


def _raise_terminated(signum: int, frame: Any) -> None:
    raise Terminated()


def _sigterm_as_interrupt() -> Any:
    """Install the SIGTERM handler where lowband owns the process (main thread, default
    action in place); returns the handler to restore, or None when nothing was installed."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        return None
    previous = signal.getsignal(signal.SIGTERM)
    if previous is not signal.SIG_DFL:  # an embedding program chose its own: leave it
        return None
    signal.signal(signal.SIGTERM, _raise_terminated)
    return previous


def main(argv: Optional[Sequence[str]] = None) -> int:
    previous = _sigterm_as_interrupt()
    try:
        with warnings.catch_warnings():
            from lowband.engine.checks import LowbandWarning

            warnings.simplefilter("always", LowbandWarning)  # a run warns once itself (checks.TrafficWatch)
            warnings.showwarning = _show_warning
            return _main(argv)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _main(argv: Optional[Sequence[str]] = None) -> int:
    from lowband.console import setup_logging

    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        argv, level, plugin_specs = _global_options(argv)
        lvl = setup_logging(level)
        from lowband import plugins

        plugins.load_entry_points()
        plugins.load_plugins(plugin_specs)
    except ValueError as exc:  # a bad --log-level or --plugin: one line, exit 2
        print(f"lowband: error: {str(exc).splitlines()[0]}", file=sys.stderr)
        return EXIT_USAGE
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if lvl > 20 and hasattr(args, "quiet"):  # -q: no progress bars either
        args.quiet = True
    if extra:  # key=value overrides after an --option land here (argparse stops at the option)
        if isinstance(getattr(args, "overrides", None), list) and all("=" in e and not e.startswith("-") for e in extra):
            args.overrides = args.overrides + extra
        else:
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        return int(args.fn(args) or 0)
    except _user_errors() as exc:
        msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        print(f"lowband: error: {msg}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt as exc:
        how, code = ("terminated (SIGTERM)", 143) if isinstance(exc, Terminated) else ("interrupted", 130)
        print(f"lowband: {how} (the last checkpoint is kept; continue with --resume)", file=sys.stderr)
        return code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
