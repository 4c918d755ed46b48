"""``[devices]`` -> the run's :class:`~lowband.devices.compute.DeviceSet` and availability model.

What the link clock (compute seconds), the devices observer (sampling, departures,
energy) and the asynchronous event clock all read; a pure function of the config, the
number of nodes and the seed.
"""

from __future__ import annotations

from typing import Any, Optional

from lowband.devices.availability import ALWAYS_ON, Availability
from lowband.devices.compute import DeviceSet, draw_devices, read_compute_trace, uniform_devices
from lowband.devices.processes import Churn, Diurnal

__all__ = ["device_set", "availability_model"]


def device_set(exp: Any, num_nodes: int) -> Optional[DeviceSet]:
    """Each node's device from ``[devices]`` (None without the section, or when it names no
    compute source: then every node computes at ``links.device_flops``)."""
    d = exp.devices
    if d is None:
        return None
    if d.mix:
        return draw_devices(num_nodes, d.mix, exp.seed, spread=d.spread, efficiency=d.efficiency)
    if d.flops is not None:
        return uniform_devices(num_nodes, d.flops, d.joules_per_flop)
    if d.trace:
        return read_compute_trace(d.trace, num_nodes)
    return None


def availability_model(exp: Any, num_nodes: int) -> Availability:
    """The availability model of ``[devices.availability]`` (:data:`ALWAYS_ON` without it)."""
    d = exp.devices
    if d is None or d.availability.kind == "always":
        return ALWAYS_ON
    a = d.availability
    if a.kind == "diurnal":
        return Diurnal(num_nodes, exp.seed, on_fraction=a.on_fraction,
                       period_s=a.period_s if a.period_s is not None else 86400.0, phases=a.phases)
    if a.kind == "churn":
        return Churn(num_nodes, exp.seed, mean_on_s=float(a.mean_on_s), mean_off_s=float(a.mean_off_s))
    from lowband.devices.traces import read_availability_trace

    return read_availability_trace(str(a.path), num_nodes, a.period_s)
