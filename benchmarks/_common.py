"""Pieces shared by the benchmark scripts (bench_rounds.py, suite.py): the machine, the
matmul rate that sets a FLOP floor, FLOP counting, peak memory, Markdown tables.

Not a library module: the scripts import it as ``_common`` (they run from
``benchmarks/``, which Python puts first on ``sys.path``).
"""

from __future__ import annotations

import os
import platform
import statistics
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, Callable, Optional

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

# ------------------------------------------------------------------------------------------
# machine
# ------------------------------------------------------------------------------------------


def cpu_model() -> str:
    """``lscpu``'s "Model name" (``/proc/cpuinfo`` as a fallback)."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        for line in out.splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def loadavg() -> Optional[tuple[float, float, float]]:
    try:
        return tuple(round(x, 2) for x in os.getloadavg())  # type: ignore[return-value]
    except OSError:
        return None


def runnable() -> Optional[str]:
    """``/proc/loadavg``'s "runnable/total" scheduling entities now (this process
    included): unlike the load average, it does not lag a minute behind a paused job."""
    try:
        return Path("/proc/loadavg").read_text().split()[3]
    except (OSError, IndexError):
        return None


def machine() -> dict[str, Any]:
    """What the numbers were taken on."""
    return {"cpu": cpu_model(), "logical_cpus": os.cpu_count(), "torch": torch.__version__,
            "torch_threads": torch.get_num_threads(), "python": platform.python_version(),
            "omp_num_threads": os.environ.get("OMP_NUM_THREADS")}


# ------------------------------------------------------------------------------------------
# timing and the matmul rate
# ------------------------------------------------------------------------------------------


def time_loop(fn: Callable[[], Any], budget_s: float, min_reps: int = 3) -> tuple[float, float, int]:
    """(best, median) seconds per call of ``fn`` over about ``budget_s`` seconds, and the
    number of calls (after one warm-up call: allocations, oneDNN primitive creation)."""
    fn()
    times: list[float] = []
    t_end = time.perf_counter() + budget_s
    while len(times) < min_reps or time.perf_counter() < t_end:
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
        if len(times) >= 100_000:
            break
    return min(times), statistics.median(times), len(times)


def big_matmul_rate(n: int, budget_s: float) -> dict[str, float]:
    """fp32 GFLOP/s of an n x n x n matmul with the current torch threads: best and median
    wall time of repeated calls, and from process CPU time (CPU seconds / threads). On a
    loaded machine a 0.1-1 s call is rarely left alone, so the wall rate under-reads; the
    CPU-time rate does not (it can only under-read, when idle threads spin). The floor
    uses the larger of the two (``gflops_floor``)."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    c = torch.empty(n, n)
    cpu: list[float] = []

    def call() -> None:
        c0 = time.process_time()
        torch.mm(a, b, out=c)
        cpu.append(time.process_time() - c0)

    best, med, reps = time_loop(call, budget_s)
    flops = 2.0 * n**3
    threads = torch.get_num_threads()
    out = {"n": n, "threads": threads, "gflops_best": flops / best / 1e9, "gflops_median": flops / med / 1e9,
           "gflops_cpu": flops / (min(cpu) / threads) / 1e9, "reps": reps}
    out["gflops_floor"] = max(out["gflops_best"], out["gflops_cpu"])
    return out


# ------------------------------------------------------------------------------------------
# FLOPs
# ------------------------------------------------------------------------------------------


def step_flops(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> int:
    """FLOPs FlopCounterMode sees in one forward + backward of ``(x, y)`` (train mode)."""
    model.train()
    model.zero_grad(set_to_none=True)
    with FlopCounterMode(display=False) as fc:
        F.cross_entropy(model(x), y).backward()
    model.zero_grad(set_to_none=True)
    return int(fc.get_total_flops())


@torch.no_grad()
def forward_flops(model: nn.Module, x: torch.Tensor) -> int:
    """FLOPs FlopCounterMode sees in one eval-mode forward pass of ``x``."""
    model.eval()
    with FlopCounterMode(display=False) as fc:
        model(x)
    return int(fc.get_total_flops())


def analytic_flops(model: nn.Module, x: torch.Tensor) -> int:
    """Independent count: 2*MACs of every Linear/Conv2d forward (hooks read the shapes);
    backward = weight gradient (same as forward) + input gradient (same as forward, except
    for the first layer, whose input needs no gradient): total = 3*fwd - fwd(first)."""
    fwd: list[int] = []

    def hook(mod: nn.Module, inp: tuple[torch.Tensor, ...], out: torch.Tensor) -> None:
        if isinstance(mod, nn.Linear):
            fwd.append(2 * out.numel() * mod.in_features)
        elif isinstance(mod, nn.Conv2d):
            kh, kw = mod.kernel_size
            fwd.append(2 * out.numel() * (mod.in_channels // mod.groups) * kh * kw)

    handles = [m.register_forward_hook(hook) for m in model.modules() if isinstance(m, (nn.Linear, nn.Conv2d))]
    try:
        with torch.no_grad():
            model(x)
    finally:
        for h in handles:
            h.remove()
    return 3 * sum(fwd) - (fwd[0] if fwd else 0)


# ------------------------------------------------------------------------------------------
# memory: peak RSS of this process and of the processes it starts
# ------------------------------------------------------------------------------------------


def _rss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _children(pid: int) -> Optional[list[int]]:
    """Direct children of ``pid`` from ``/proc/PID/task/*/children`` (None: not supported)."""
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return []
    out: list[int] = []
    for t in tasks:
        try:
            out += [int(c) for c in (t / "children").read_text().split()]
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            continue
    return out


def _descendants(pid: int) -> list[int]:
    """Process ids below ``pid`` (Linux: ``/proc/PID/task/*/children``, else a scan of
    every process's parent id)."""
    out, todo = [], [pid]
    while todo:
        kids = _children(todo.pop())
        if kids is None:
            return _descendants_scan(pid)
        out += kids
        todo += kids
    return out


def _descendants_scan(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(d.name))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def _pss_kib(pid: int) -> int:
    """Proportional set size (shared pages divided among their users), 0 if unreadable."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


class TreeRSS:
    """Samples, in a thread, the memory of this process and all its descendants (worker
    pools, Ray): the peak is what the run occupies.

    - ``peak_kib``: summed RSS, every ``interval`` seconds (cheap, ~0.1 ms). Pages a forked
      worker shares with its parent are counted in both, so with workers it over-reads.
    - ``peak_pss_kib``: summed PSS (shared pages divided among the processes sharing them:
      the honest total of a process tree), every ``pss_every`` seconds while there are
      descendants (reading ``smaps_rollup`` costs ~3 ms per GB of process: ~1% of a core).
    - the main process's own peak is :func:`self_peak_rss_kib` (``ru_maxrss``, exact).

    A peak shorter than the interval can be missed."""

    def __init__(self, interval: float = 0.2, pss_every: float = 1.0) -> None:
        self.interval = interval
        self.pss_every = pss_every
        self.peak_kib = 0
        self.peak_pss_kib = 0
        self.peak_workers = 0
        self._last_pss = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self, force_pss: bool = False) -> None:
        pid = os.getpid()
        kids = _descendants(pid)
        procs = [pid, *kids]
        self.peak_kib = max(self.peak_kib, sum(_rss_kib(p) for p in procs))
        self.peak_workers = max(self.peak_workers, len(kids))
        now = time.perf_counter()
        if kids and (force_pss or now - self._last_pss >= self.pss_every):
            self._last_pss = now
            self.peak_pss_kib = max(self.peak_pss_kib, sum(_pss_kib(p) for p in procs))

    def _run(self) -> None:
        while not self._stop.is_set():
            self._sample()
            self._stop.wait(self.interval)

    def __enter__(self) -> "TreeRSS":
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()
        self._sample(force_pss=True)


def self_peak_rss_kib() -> int:
    """Peak resident memory of this process so far (``ru_maxrss``, KiB on Linux)."""
    import resource

    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)


# ------------------------------------------------------------------------------------------
# report helpers
# ------------------------------------------------------------------------------------------


def fmt_flops(f: float) -> str:
    for unit, scale in (("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6)):
        if abs(f) >= scale:
            return f"{f / scale:.3g} {unit}"
    return f"{f:.3g} FLOP"


def table(headers: list[str], rows: list[list[str]]) -> str:
    """A Markdown table."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)
