"""Where a run computes: the ``device`` config key ("cpu", "cuda", "cuda:N", "mps", "auto").

Training and evaluation run on the device: the federation's tensors, the models and the
algorithm states live there. What stays on the CPU, and why:

- the wire (:mod:`lowband.comm.wire`): a tensor is moved to the CPU where it is encoded,
  so the bytes (and the codecs' seeded randomness, and the stateful codecs' residuals,
  which are the sender's private CPU state) are the same on every device; a receiver's
  decoded tensors are moved back to the device (:class:`lowband.comm.network.Network`);
- addressed randomness (design rule 4, :mod:`lowband.seeding`): generators are CPU
  generators, so a batch permutation or a sampled mask is the same on every device; what
  they draw is moved to the device where it is used;
- checkpoints are loaded onto the CPU (``map_location``) and moved to the run's device,
  so a run saved on one device resumes on another.

``device = "cpu"`` (the default) changes nothing: every move below is then a no-op.
"""

from __future__ import annotations

from dataclasses import fields, is_dataclass, replace
from typing import Any

import torch

DEVICE_CHOICES = ("cpu", "cuda", "cuda:N", "mps", "auto")


def _mps_available() -> bool:
    mps = getattr(torch.backends, "mps", None)
    return bool(mps is not None and mps.is_available())


def check_spec(spec: str) -> str:
    """``spec`` if it is a device name this key accepts (not whether it is present here);
    a ValueError naming the allowed forms otherwise."""
    s = str(spec).strip().lower()
    if s in ("cpu", "cuda", "mps", "auto"):
        return s
    if s.startswith("cuda:") and s[5:].isdigit():
        return s
    raise ValueError(f"unknown device {spec!r}; allowed: {', '.join(DEVICE_CHOICES)} (N a GPU index, e.g. cuda:0)")


def resolve_device(spec: str) -> torch.device:
    """The torch device of ``spec`` ("auto": cuda if available, else mps, else cpu).

    A device this machine does not have raises a one-line ValueError (the simulator turns
    it into a ConfigError, exit 2) rather than failing later inside training."""
    s = check_spec(spec)
    if s == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        return torch.device("mps") if _mps_available() else torch.device("cpu")
    if s == "cpu":
        return torch.device("cpu")
    if s.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ValueError(f"{s!r} is not available on this machine (torch {torch.__version__} sees no CUDA GPU); "
                             f"use device = \"cpu\" or \"auto\"")
        n = torch.cuda.device_count()
        if ":" in s and int(s[5:]) >= n:
            raise ValueError(f"{s!r} is not available: this machine has {n} CUDA device(s) (cuda:0..cuda:{n - 1})")
        return torch.device(s)
    if not _mps_available():
        raise ValueError("'mps' is not available on this machine (no Apple-silicon GPU seen by torch); "
                         "use device = \"cpu\" or \"auto\"")
    return torch.device("mps")


def to_device(obj: Any, device: torch.device | str) -> Any:
    """``obj`` with every tensor inside moved to ``device``: tensors, dicts, lists, tuples
    and dataclasses (rebuilt, not modified in place); anything else is returned as is.
    On the device a tensor already lives on, nothing is copied."""
    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if isinstance(obj, dict):
        return {k: to_device(v, device) for k, v in obj.items()}
    if isinstance(obj, list):
        return [to_device(v, device) for v in obj]
    if isinstance(obj, tuple) and not hasattr(obj, "_fields"):
        return tuple(to_device(v, device) for v in obj)
    if is_dataclass(obj) and not isinstance(obj, type):
        changes = {f.name: to_device(getattr(obj, f.name), device) for f in fields(obj) if f.init}
        return replace(obj, **changes)
    return obj


def is_cpu(device: torch.device | str | None) -> bool:
    """True for None or a CPU device (no move needed)."""
    return device is None or torch.device(device).type == "cpu"
