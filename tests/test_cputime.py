"""A round's CPU time counts this process and its worker processes (lowband.engine.cputime),
and the results tables count it: a run on two engine workers is not half its compute, and
a run waiting for a shared core is not charged the wait."""

from __future__ import annotations

import multiprocessing as mp
import time
from pathlib import Path

import pytest

from lowband.engine.cputime import CpuMeter, process_cpu_s
from lowband.reproduce import RunData

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc (Linux)")


def _burn(seconds: float) -> None:
    """Spin on the CPU for ``seconds`` of CPU time (not wall time)."""
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


def test_the_meter_counts_this_process_and_its_workers() -> None:
    """A worker's CPU is counted when its pid is given and not otherwise; idle wall time is
    not CPU; workers whose time cannot be read (Ray's: None) make the round's CPU unknown."""
    ctx = mp.get_context("fork")
    worker = ctx.Process(target=_burn, args=(0.4,))
    worker.start()
    try:
        with_worker, alone = CpuMeter(lambda: [worker.pid]), CpuMeter(lambda: [])
        with_worker.start()
        alone.start()
        _burn(0.2)
        # wait (sleeping: not CPU) until the worker has burnt most of its 0.4 s, however long a
        # busy machine makes that take; its time so far is read at stop
        deadline = time.monotonic() + 300
        mid = process_cpu_s(worker.pid)
        while (mid is None or mid <= 0.3) and time.monotonic() < deadline:  # no is_alive(): it would reap
            time.sleep(0.02)
            mid = process_cpu_s(worker.pid)
        both, own = with_worker.stop(), alone.stop()
    finally:
        worker.join()
    assert own is not None and 0.15 < own < 0.45  # 0.2 s burnt; the 0.6 s sleep is not CPU
    assert mid is not None and mid > 0.3 and both is not None and both > own + 0.3
    unknown = CpuMeter(lambda: None)
    unknown.start()
    assert unknown.stop() is None


def test_tables_count_measured_cpu_else_wall_times_threads_times_workers() -> None:
    """RunData.cpu_hours: a line's measured cpu_s when it has one, else its wall-clock x
    threads x the engine workers it logged (1 when it logged none: older runs, flagged when
    their config allowed a pool)."""
    hour = 3600.0
    measured = RunData(Path("r"), [{"round": 2}], [{"round": 1, "round_s": hour, "cpu_s": 0.5 * hour},
                                                   {"round": 2, "round_s": hour, "workers": 2}], 2, None, "x", 1, 0)
    assert measured.cpu_hours == pytest.approx(0.5 + 2.0) and measured.unmetered == 1
    assert not measured.uncounted_workers  # a serial saved config (pooled=False)
    old = RunData(Path("r"), [{"round": 1}], [{"round": 1, "round_s": hour}], 1, None, "x", 2, 0, pooled=True)
    assert old.cpu_hours == pytest.approx(2.0) and old.uncounted_workers


def test_a_pool_run_logs_its_workers_and_their_cpu(tmp_path: Path) -> None:
    """Two engine workers: every timing line says so and carries the CPU the workers did,
    about the serial run's (the same training), not the driver's idle share of it."""
    from conftest import digits_config
    from lowband.config import validate
    from lowband.engine.runlog import RunLog
    from lowband.engine.simulator import Simulation

    def cpu(name: str, workers: int) -> list[dict]:
        cfg = {**digits_config(tmp_path / name, "fedavg", rounds=3), "engine": {"workers": workers}}
        cfg["algorithm"]["local_epochs"] = 10  # training dominates: the driver alone is ~15% of it
        sim = Simulation(validate(cfg))
        return RunLog.read_jsonl(Path(sim.run().run_dir) / "timing.jsonl")

    serial, pool = cpu("serial", 1), cpu("pool", 2)
    assert [t["workers"] for t in serial] == [1, 1, 1] and [t["workers"] for t in pool] == [2, 2, 2]
    s, p = sum(t["cpu_s"] for t in serial), sum(t["cpu_s"] for t in pool)
    assert s > 0 and p > 0.5 * s, (s, p)
