"""Devices: what a node can compute and when it is reachable (docs/devices.md).

- :mod:`lowband.devices.availability`: the availability interface that client sampling,
  peer topologies and the asynchronous event clock all read;
- :mod:`lowband.devices.processes`: diurnal, churn and explicit-window availability;
- :mod:`lowband.devices.traces`: the availability CSV format and FedScale conversion;
- :mod:`lowband.devices.compute`: device classes (cited figures), mixes and compute traces;
- :mod:`lowband.devices.build`: ``[devices]`` -> the run's devices and availability.
"""

from lowband.devices.availability import ALWAYS_ON, AlwaysOn, Availability
from lowband.devices.compute import CLASSES, DeviceClass, DeviceSet

__all__ = ["ALWAYS_ON", "AlwaysOn", "Availability", "CLASSES", "DeviceClass", "DeviceSet"]
