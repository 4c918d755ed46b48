#!/usr/bin/env python
"""Real devices on scarce links: FMNIST, 100 devices on NB-IoT and on LoRaWAN SF7, a
heterogeneous compute mix and a diurnal availability trace (docs/results/devices.md).

The experiment is a list of named cells (:data:`CELLS`): each is a link and a method on
the same federation, devices and availability trace. Another method is one more
:class:`Cell` (a name, an algorithm section, and any keys it adds), e.g. an asynchronous
one on the same clock::

    CELLS.append(Cell("nbiot/fedbuff", "nbiot", {"name": "fedbuff", ...}))

Usage (from the repository root)::

    python experiments/devices/run.py configs         # write experiments/devices/configs/*.toml
    python experiments/devices/run.py run [CELL ...]  # run them (resumable), record them
    python experiments/devices/run.py render          # docs/results/devices.md's tables, from the store
    python experiments/devices/run.py render-async    # the asynchronous cells' table (staleness, lost jobs)
    python experiments/devices/run.py pages COMMIT DATE  # the page's quoted numbers into the store

Runs go to ``runs/devices/<cell>`` (``LOWBAND_RUNS`` to move them); their records to
``docs/results/records/devices/``.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import tomli_w

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
CONFIGS = HERE / "configs"
TRACE = HERE / "diurnal_100.csv"
RUNS = Path(os.environ.get("LOWBAND_RUNS", "runs")) / "devices"
PAPER = "devices"

SEED = 1
DEVICES = 100
ROUNDS = 100
EVAL_EVERY = 5
TARGET = 0.80

#: compute mix (lowband.devices.compute.CLASSES): half microcontrollers, a quarter Raspberry
#: Pi class, a fifth phones, the rest edge GPUs; each unit +-30% (lognormal) around its class
MIX = {"mcu_m4": 0.5, "rpi4": 0.25, "phone": 0.2, "jetson_nano": 0.05}
SPREAD = 0.3
#: NB-IoT has no radio power in its preset; these are a typical NB-IoT module's figures at
#: 3.6 V (u-blox SARA-N2 class: ~220 mA transmitting at 23 dBm, ~46 mA receiving), an
#: assumption of this study, not a datasheet of the preset
NBIOT_POWER = {"up": {"power_w": 3.6 * 0.220}, "down": {"power_w": 3.6 * 0.046}}
#: frame loss on both links, each frame re-sent until it arrives, transmissions drawn per
#: frame (seeded): 10% is LTE/NB-IoT link adaptation's usual first-transmission block error
#: target, and within the packet loss measured on busy LoRaWAN networks; it is what makes
#: one device's transfer slower than another's on the same preset
LOSS = 0.1
#: the per-round deadline of the "deadline" cells: the 70th percentile of the reply arrival
#: times in the first rounds of the cells without one (measured; see the page)
DEADLINE_S = {"nbiot": 55.0, "lorawan_sf7": 37900.0}
#: arrivals of the asynchronous cells (one round = one update from one device): FedAvg's 100
#: rounds train 1,000 client updates, and so do the asynchronous cells
ASYNC_ROUNDS = 1000
#: methods on the event clock: no [topology] (the clock starts the devices), eval every 25 arrivals
ASYNC = ("fedasync", "fedbuff")
ASYNC_EVAL_EVERY = 25
#: HierFAVG's five gateways reach the cloud over LTE (its preset has radio power figures)
GATEWAY_LINK = "lte"


@dataclass
class Cell:
    """One run of the experiment: ``link`` (the devices' preset) and ``algorithm`` (its
    section); ``extra`` adds or replaces top-level sections (e.g. a deadline in links)."""

    name: str
    link: str
    algorithm: dict[str, Any]
    extra: dict[str, Any] = field(default_factory=dict)
    #: nodes that are gateways, not devices (HierFAVG's), added after the devices
    gateways: int = 0


def _cells() -> list[Cell]:
    out = []
    for link in ("nbiot", "lorawan_sf7"):
        out.append(Cell(f"{link}/fedavg", link, {"name": "fedavg"}))
        out.append(Cell(f"{link}/fedavg_deadline", link, {"name": "fedavg"},
                        {"links": {"deadline_s": DEADLINE_S[link]}}))
        # the paper's setting: every device takes part in every cloud round (absent ones excepted)
        out.append(Cell(f"{link}/hierfavg", link, {"name": "hierfavg", "edges": 5},
                        {"topology": {"kind": "star", "sampling": "all"}}, gateways=5))
        # asynchronous on the event clock (docs/async.md): ten devices training at once, as
        # FedAvg's ten per round; one round = one arrival, so ASYNC_ROUNDS arrivals
        for alg in ({"name": "fedasync", "concurrency": 10},
                    {"name": "fedbuff", "concurrency": 10, "buffer_size": 10}):
            out.append(Cell(f"{link}/{alg['name']}", link, alg, {"rounds": ASYNC_ROUNDS}))
    return out


CELLS: list[Cell] = _cells()


def diurnal_trace(path: Path, n: int, seed: int = SEED, on_fraction: float = 0.5, day: float = 86400.0) -> None:
    """The availability trace of every cell: device i is on ``on_fraction`` of each day from
    its own phase (time zone), phases uniform from a seeded generator; written in lowband's
    CSV format with a one-day period (a window crossing midnight is written as two)."""
    from lowband.devices.traces import write_availability_trace

    phase = np.random.default_rng(seed).random(n) * day
    on = on_fraction * day
    windows = {}
    for i in range(n):
        start = (day - phase[i]) % day  # local time 0 (the window's start) in trace time
        end = start + on
        windows[i] = [(start, min(end, day))] + ([(0.0, end - day)] if end > day else [])
    write_availability_trace(path, windows)


def config(cell: Cell) -> dict[str, Any]:
    n = DEVICES + cell.gateways
    links: dict[str, Any] = {"preset": cell.link, "retransmissions": "sampled",
                             "up": {"loss": LOSS}, "down": {"loss": LOSS}}
    if cell.link == "nbiot":
        links["up"].update(NBIOT_POWER["up"])
        links["down"].update(NBIOT_POWER["down"])
    if cell.gateways:
        links["nodes"] = {GATEWAY_LINK: list(range(DEVICES, n))}
    links.update(cell.extra.get("links", {}))
    cfg: dict[str, Any] = {
        "name": f"devices-{cell.name.replace('/', '-')}",
        "seed": SEED, "rounds": ROUNDS, "threads": 1, "checkpoint_every": 5,
        "out_dir": str(RUNS / cell.name.replace("/", "_")),
        "data": {"dataset": "fashion_mnist", "num_clients": n, "partition": "dirichlet", "alpha": 0.5,
                 "min_size": 20, "split": [0.75, 0.0, 0.25]},
        "model": {"name": "mlp", "hidden": 32},
        "algorithm": dict(cell.algorithm),
        **({} if cell.algorithm["name"] in ASYNC else {"topology": {"kind": "star", "sampling": "count", "count": 10}}),
        "eval": {"protocols": ["global"], "main": "global/acc", "every": EVAL_EVERY, "target": TARGET},
        "links": links,
        "devices": {"mix": dict(MIX), "spread": SPREAD,
                    "availability": {"kind": "trace", "path": str(TRACE.relative_to(ROOT)), "period_s": 86400.0}},
    }
    for k, v in cell.extra.items():
        if k != "links":
            cfg[k] = v
    if cell.algorithm["name"] in ASYNC:
        cfg["eval"]["every"] = ASYNC_EVAL_EVERY
        cfg["checkpoint_every"] = ASYNC_EVAL_EVERY
    return cfg


def config_path(cell: Cell) -> Path:
    return CONFIGS / f"{cell.name.replace('/', '_')}.toml"


def write_configs() -> None:
    CONFIGS.mkdir(parents=True, exist_ok=True)
    diurnal_trace(TRACE, DEVICES)
    for cell in CELLS:
        config_path(cell).write_text(f"# docs/results/devices.md, cell {cell.name} (written by experiments/devices/run.py)\n"
                                     + tomli_w.dumps(config(cell)))


def run(names: list[str]) -> int:
    from lowband.config import load_experiment
    from lowband.engine.simulator import Simulation
    from lowband.results.store import Store

    store = Store(ROOT / "docs" / "results" / "records", PAPER)
    todo = [c for c in CELLS if not names or c.name in names]
    for cell in todo:
        path = config_path(cell)
        exp = load_experiment(path)
        done = (Path(exp.run_dir()) / "summary.json").is_file()
        resume = (Path(exp.run_dir()) / "checkpoint.pt").exists() and not done
        print(f"== {cell.name}: {'done' if done else 'resume' if resume else 'run'}", flush=True)
        if not done:
            Simulation(exp, resume=resume).run()
        store.put(str(path.relative_to(ROOT)), Path(exp.run_dir()))
    return 0


# --------------------------------------------------------------------------- render
def _records() -> dict[str, Any]:
    from lowband.results.store import Store

    store = Store(ROOT / "docs" / "results" / "records", PAPER)
    out = {}
    for cell in CELLS:
        recs = store.records(str(config_path(cell).relative_to(ROOT)))
        if SEED in recs:
            out[cell.name] = recs[SEED]
    return out


def _fmt_h(s: float | None) -> str:
    return "not reached" if s is None else f"{s / 3600:.2f} h"


def render() -> str:
    """The page's tables from the records alone."""
    recs = _records()
    lines = ["| cell | rounds | final acc | best acc | simulated time | time to {:.0f}% | bytes (MB) | bytes to {:.0f}% (MB) "
             "| energy per device, mean / max (J) | compute share of energy |".format(100 * TARGET, 100 * TARGET),
             "|---|---|---|---|---|---|---|---|---|---|"]
    for cell in CELLS:
        rec = recs.get(cell.name)
        if rec is None:
            lines.append(f"| {cell.name} | not run | | | | | | | | |")
            continue
        s = rec.header["summary"]
        final = s["final"]
        best = s["best"]["global/acc"]["value"]
        btt = s.get("bytes_to_target")
        e = s.get("energy_per_device_j") or {}
        comp = s.get("energy_compute_j")
        total = sum(s.get("energy_by_device_j") or [])
        share = f"{100 * comp / total:.1f}%" if comp is not None and total else "-"
        lines.append(
            f"| {cell.name} | {s['rounds_completed']} | {100 * final['global/acc']:.2f}% | {100 * best:.2f}% | "
            f"{_fmt_h(s.get('sim_time_s'))} | {_fmt_h(s.get('time_to_target_s'))} | "
            f"{final['bytes/total'] / 1e6:.2f} | {'not reached' if btt is None else f'{btt / 1e6:.2f}'} | "
            f"{e.get('mean', float('nan')):.1f} / {e.get('max', float('nan')):.1f} | {share} |")
    tiers = ["", "| cell | device links (MB) | gateway-cloud links (MB) | device-rounds lost to departures | replies past the "
             "deadline | devices on at a round's start (mean of 100) | compute per upload, mean / max (s) |",
             "|---|---|---|---|---|---|---|"]
    for cell in CELLS:
        rec = recs.get(cell.name)
        if rec is None:
            continue
        s = rec.header["summary"]
        inc = s.get("incidents") or {}
        cloud = s["bytes_up"] + s["bytes_down"]
        dev, gw = (s["bytes_peer"], cloud) if cell.gateways else (cloud, 0)
        c = s.get("compute_s_per_upload") or {}
        tiers.append(f"| {cell.name} | {dev / 1e6:.2f} | {gw / 1e6:.2f} | {inc.get('devices/departed', 0)} | "
                     f"{inc.get('links/late', 0) if 'deadline' in cell.name else '-'} | "
                     f"{s.get('devices_available_mean', float('nan')):.1f} | "
                     f"{c.get('mean', float('nan')):.2f} / {c.get('max', float('nan')):.2f} |")
    curve = ["", "| cell | round | simulated time | bytes (MB) | global acc | devices on at round start |",
             "|---|---|---|---|---|---|"]
    for cell in CELLS:
        rec = recs.get(cell.name)
        if rec is None:
            continue
        for m in rec.metrics:
            if m["round"] % 20 == 0 or m["round"] == ROUNDS:
                curve.append(f"| {cell.name} | {m['round']} | {m.get('time/sim_s', 0.0) / 3600:.2f} h | "
                             f"{m['bytes/total'] / 1e6:.2f} | {100 * m['global/acc']:.2f}% | "
                             f"{m.get('devices/available', '-')} |")
    return "\n".join(lines + tiers + curve)


def page_numbers(commit: str, date: str) -> Path:
    """``docs/results/records/pages/devices.jsonl``: the numbers docs/results/devices.md
    quotes, each read from the records by :func:`render` (tables) or from the setup above
    (the constants of this script), with where they were read."""
    from lowband.results.pages import page_record_path, quoted_numbers

    results = ROOT / "docs" / "results"
    page = results / "devices.md"
    nums = sorted(set(quoted_numbers(page.read_text())))
    why = ("rendered from the run records in docs/results/records/devices/ by experiments/devices/run.py render; "
           "the setup's constants are experiments/devices/run.py's")
    head = {"record": 1, "kind": "imported", "page": "docs/results/devices.md",
            "provenance": {"page": "docs/results/devices.md", "commit": commit, "date": date, "why": why}}
    path = page_record_path(results, "devices.md")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(x) + "\n" for x in [head, *({"number": n} for n in nums)]))
    return path


def render_async() -> str:
    """The asynchronous cells' own table (event clock: staleness, lost jobs), from the records."""
    recs = _records()
    lines = ["| cell | arrivals | server updates | final acc | time to {:.0f}% | bytes to {:.0f}% (MB) | simulated time "
             "| bytes (MB) | staleness median / max | jobs lost | energy per device, mean / max (J) |"
             .format(100 * TARGET, 100 * TARGET), "|---|---|---|---|---|---|---|---|---|---|---|"]
    for cell in CELLS:
        rec = recs.get(cell.name)
        if cell.algorithm["name"] not in ASYNC:
            continue
        if rec is None:
            lines.append(f"| {cell.name} | not run | | | | | | | | | |")
            continue
        s = rec.header["summary"]
        hist = {int(k): v for k, v in s["staleness_histogram"].items()}
        seq = [k for k in sorted(hist) for _ in range(hist[k])]
        btt = s.get("bytes_to_target")
        e = s.get("energy_per_device_j") or {}
        lines.append(
            f"| {cell.name} | {s['async']['arrivals']} | {s['async']['server_updates']} | "
            f"{100 * s['final']['global/acc']:.2f}% | {_fmt_h(s.get('time_to_target_s'))} | "
            f"{'not reached' if btt is None else f'{btt / 1e6:.2f}'} | {_fmt_h(s.get('sim_time_s'))} | "
            f"{s['final']['bytes/total'] / 1e6:.2f} | {seq[len(seq) // 2]} / {max(seq)} | {s['async']['lost']} | "
            f"{e.get('mean', float('nan')):.1f} / {e.get('max', float('nan')):.1f} |")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if argv and argv[0] == "render-async":
        print(render_async())
        return 0
    if argv and argv[0] == "pages":
        print(page_numbers(*argv[1:3]))
        return 0
    if not argv or argv[0] not in ("configs", "run", "render"):
        print(__doc__)
        return 2
    if argv[0] == "configs":
        write_configs()
        return 0
    if argv[0] == "run":
        return run(argv[1:])
    print(render())
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
