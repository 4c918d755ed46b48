"""What a device can compute: training speed (FLOP/s) and energy per FLOP, per device.

A device *class* (:class:`DeviceClass`) holds one figure of each, from a cited datasheet or
measurement (:data:`CLASSES`). A federation's devices are drawn from a mix of classes with
shares, each device's speed spread lognormally around its class's figure, or read from a
trace file (:func:`read_compute_trace`). All draws are addressed by ``(seed, "devices",
"class")`` and ``(seed, "devices", "speed")``: the same devices in every process and
after a resume.

The figures are *rates a device sustains on dense float32 arithmetic*; training reaches a
fraction of a peak rate, so where a class's figure is a peak (clock x FLOP per cycle from
the architecture's manual) it says so, and ``[devices] efficiency`` scales every class
(1.0: the figures as written). Energy per FLOP is the board's (or SoC's) power under load
over its rate: ``joules_per_flop = power_w / flops``, so a slower device pays more energy
per FLOP only where its power does not fall as fast as its speed.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Optional, Sequence

import numpy as np

from lowband.seeding import np_gen

__all__ = ["DeviceClass", "CLASSES", "DeviceSet", "draw_devices", "uniform_devices", "read_compute_trace",
           "COMPUTE_TRACE_COLUMNS"]


@dataclass(frozen=True)
class DeviceClass:
    """One kind of device: the float32 rate it sustains (FLOP/s) and its power under that load (W)."""

    name: str
    description: str
    flops: float
    power_w: float
    #: where each figure comes from
    source: str = ""

    def __post_init__(self) -> None:
        if not (self.flops > 0 and math.isfinite(self.flops)):
            raise ValueError(f"{self.name}: flops must be a finite number > 0, got {self.flops!r}")
        if not (self.power_w >= 0 and math.isfinite(self.power_w)):
            raise ValueError(f"{self.name}: power_w must be a finite number >= 0, got {self.power_w!r}")

    @property
    def joules_per_flop(self) -> float:
        return self.power_w / self.flops


# Figures, and where they come from (also in docs/devices.md).
CLASSES: dict[str, DeviceClass] = {c.name: c for c in [
    DeviceClass(
        "mcu_m4", "Cortex-M4F microcontroller (STM32F407, 168 MHz, single-precision FPU)",
        flops=168e6, power_w=3.3 * 0.040,
        source="peak: 168 MHz x 1 single-precision FPU operation per cycle (ARM Cortex-M4 Technical Reference "
               "Manual, FPU instruction timing: VADD/VMUL.F32 1 cycle); power: STM32F405/407 datasheet (DS8626), "
               "run mode ~238 uA/MHz from flash at 168 MHz, i.e. ~40 mA at 3.3 V"),
    DeviceClass(
        "rpi4", "Raspberry Pi 4 Model B (4x Cortex-A72, 1.5 GHz)",
        flops=8e9, power_w=6.4,
        source="rate: High Performance Linpack on a Raspberry Pi 4 under Raspberry Pi OS 64-bit, about 8 GFLOP/s "
               "measured (W. Feiereisen, 'Benchmarking the Raspberry Pi 4 with Raspberry Pi OS64', 2022); power: "
               "about 6.4 W for the board with all four cores loaded (R. Longbottom, 'Raspberry Pi 4B Stress Tests "
               "Including High Performance Linpack', 2019, reports 6-7 W; the official supply is 15 W)"),
    DeviceClass(
        "phone", "smartphone SoC CPU (4 big Cortex-A76-class cores, 2.4 GHz)",
        flops=20e9, power_w=4.0,
        source="rate: 4 cores x 2.4 GHz x 16 float32 FLOP per cycle (two 128-bit NEON FMA pipes, ARM Cortex-A76 "
               "Software Optimization Guide) = 154 GFLOP/s peak, taken at 13% (20 GFLOP/s), the fraction the "
               "Raspberry Pi class reaches of its own peak (8 of 96 GFLOP/s in Linpack); power: 4 W, the sustained "
               "budget of a phone SoC under full CPU load (an assumption: thermal limits of 3-5 W)"),
    DeviceClass(
        "jetson_nano", "NVIDIA Jetson Nano (128 Maxwell CUDA cores, 921.6 MHz, 10 W mode)",
        flops=236e9, power_w=10.0,
        source="peak: NVIDIA Jetson Nano module datasheet (DA_09366), 472 GFLOP/s FP16, i.e. 128 cores x 2 x "
               "921.6 MHz = 236 GFLOP/s FP32; power: the module's 10 W mode (datasheet power modes 5 W / 10 W)"),
]}


@dataclass(frozen=True)
class DeviceSet:
    """Every node's device: its class name, its rate (FLOP/s) and its energy per FLOP (J;
    None where no power figure exists: then no compute energy is reported)."""

    classes: tuple[str, ...]
    flops: tuple[float, ...]
    joules_per_flop: tuple[Optional[float], ...]

    def __len__(self) -> int:
        return len(self.flops)

    @property
    def has_energy(self) -> bool:
        return all(j is not None for j in self.joules_per_flop)

    def compute_seconds(self, node: int, flops: float) -> float:
        """Seconds ``node`` needs for ``flops`` floating-point operations."""
        return float(flops) / self.flops[node]

    def compute_joules(self, node: int, flops: float) -> float:
        """Joules ``node`` spends on ``flops`` operations (0.0 without a power figure)."""
        j = self.joules_per_flop[node]
        return float(flops) * j if j is not None else 0.0


def uniform_devices(num_nodes: int, flops: float, joules_per_flop: Optional[float] = None,
                    name: str = "uniform") -> DeviceSet:
    """``num_nodes`` equal devices."""
    return DeviceSet((name,) * num_nodes, (float(flops),) * num_nodes,
                     (None if joules_per_flop is None else float(joules_per_flop),) * num_nodes)


def draw_devices(num_nodes: int, mix: Mapping[str, float], seed: int, *, spread: float = 0.0,
                 efficiency: float = 1.0, classes: Mapping[str, DeviceClass] = CLASSES) -> DeviceSet:
    """Devices drawn from a mix of classes.

    ``mix``: class name -> share (normalised to sum 1). Class counts are the shares times
    ``num_nodes`` rounded by largest remainder (so a 30/70 mix of 10 devices is exactly
    3 and 7), assigned to nodes by a permutation from ``(seed, "devices", "class")``.
    Each device's rate is its class's ``flops x efficiency x exp(spread x z - spread^2/2)``
    with ``z`` standard normal from ``(seed, "devices", "speed")`` (a lognormal spread whose
    mean is the class's figure); its power is its class's, so a faster unit of a class
    spends less energy per FLOP."""
    if not mix:
        raise ValueError("mix is empty: name at least one device class with a share")
    for name, share in mix.items():
        if name not in classes:
            raise ValueError(f"unknown device class {name!r}; available: {', '.join(classes)}")
        if not (share >= 0 and math.isfinite(share)):
            raise ValueError(f"share of {name!r} must be a finite number >= 0, got {share!r}")
    total = float(sum(mix.values()))
    if total <= 0:
        raise ValueError("the shares of the mix sum to 0; give at least one class a share > 0")
    if spread < 0 or efficiency <= 0:
        raise ValueError("spread must be >= 0 and efficiency > 0")
    names = list(mix)
    exact = np.array([mix[k] / total * num_nodes for k in names])
    counts = np.floor(exact).astype(int)
    rest = num_nodes - int(counts.sum())
    order = sorted(range(len(names)), key=lambda i: (-(exact[i] - counts[i]), i))  # largest remainder, then order
    for i in order[:rest]:
        counts[i] += 1
    labels = [names[i] for i in range(len(names)) for _ in range(int(counts[i]))]
    perm = np_gen(seed, "devices", "class").permutation(num_nodes)
    assigned = [labels[int(p)] for p in perm]
    z = np_gen(seed, "devices", "speed").standard_normal(num_nodes)
    factor = np.exp(spread * z - 0.5 * spread * spread) if spread > 0 else np.ones(num_nodes)
    flops = [classes[c].flops * efficiency * float(f) for c, f in zip(assigned, factor)]
    jpf = [classes[c].power_w / f for c, f in zip(assigned, flops)]
    return DeviceSet(tuple(assigned), tuple(flops), tuple(jpf))


#: the compute trace's columns: ``node`` (0-based), ``flops`` (FLOP/s > 0), optional
#: ``joules_per_flop`` (>= 0; empty: no figure) and ``class`` (a label)
COMPUTE_TRACE_COLUMNS = ("node", "flops", "joules_per_flop", "class")


def read_compute_trace(path: str | Path, num_nodes: int) -> DeviceSet:
    """Per-device compute from a CSV file with a header row ``node,flops[,joules_per_flop][,class]``,
    one row per node ``0..num_nodes-1`` (each exactly once). Raises ValueError naming the
    file, the line and what is wrong."""
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"compute trace {p}: no such file (a CSV with header node,flops[,joules_per_flop][,class])")
    flops: dict[int, float] = {}
    jpf: dict[int, Optional[float]] = {}
    label: dict[int, str] = {}
    with p.open(newline="") as f:
        reader = csv.DictReader(f)
        cols = reader.fieldnames or []
        if "node" not in cols or "flops" not in cols:
            raise ValueError(f"compute trace {p}: the header must name node and flops (got {', '.join(cols) or 'none'})")
        for line, row in enumerate(reader, start=2):
            try:
                node, rate = int(row["node"]), float(row["flops"])
                j = row.get("joules_per_flop")
                joules = float(j) if j not in (None, "") else None
            except (TypeError, ValueError):
                raise ValueError(f"compute trace {p}, line {line}: node must be an integer and flops, "
                                 f"joules_per_flop numbers, got {dict(row)}") from None
            if not 0 <= node < num_nodes:
                raise ValueError(f"compute trace {p}, line {line}: node {node} does not exist (nodes are 0..{num_nodes - 1})")
            if node in flops:
                raise ValueError(f"compute trace {p}, line {line}: node {node} is listed twice")
            if not (rate > 0 and math.isfinite(rate)) or (joules is not None and not (joules >= 0 and math.isfinite(joules))):
                raise ValueError(f"compute trace {p}, line {line}: flops must be > 0 and joules_per_flop >= 0")
            flops[node], jpf[node], label[node] = rate, joules, (row.get("class") or "trace")
    missing = [i for i in range(num_nodes) if i not in flops]
    if missing:
        raise ValueError(f"compute trace {p}: no row for node {missing[0]} ({len(missing)} nodes missing); list every node")
    return DeviceSet(tuple(label[i] for i in range(num_nodes)), tuple(flops[i] for i in range(num_nodes)),
                     tuple(jpf[i] for i in range(num_nodes)))


def class_counts(devices: DeviceSet, nodes: Optional[Sequence[int]] = None) -> dict[str, int]:
    """How many devices of each class among ``nodes`` (all by default), for the summary."""
    out: dict[str, int] = {}
    for i in (range(len(devices)) if nodes is None else nodes):
        c = devices.classes[i]
        out[c] = out.get(c, 0) + 1
    return dict(sorted(out.items()))


def summary_stats(values: Sequence[float]) -> dict[str, float]:
    """mean, median, p90 and max of ``values`` (for per-device figures in summary.json)."""
    a = np.asarray(values, dtype=float)
    if a.size == 0:
        return {}
    return {"mean": float(a.mean()), "median": float(np.median(a)), "p90": float(np.quantile(a, 0.9)),
            "max": float(a.max())}
