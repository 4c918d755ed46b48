"""The event clock of asynchronous federations (FedAsync, FedBuff): one driver round per arrival.

Synchronous rounds wait for their slowest participant. Here the server never waits: it keeps
``concurrency`` clients training at once, and each client's update reaches the server at
the time its download, local compute and upload take on that client's link and device.
:class:`EventClock` is the scheduler that decides, before each driver round, which event
comes next; the driver stays the synchronous loop it always was (plan -> steps -> play ->
evaluate -> record), because **one driver round is one arrival**:

1. *dispatch*: from the time of the previous arrival ``T_{r-1}`` on, every free slot (fewer
   than ``concurrency`` jobs in flight) goes to an idle client that is on, drawn uniformly by
   ``np_gen(seed, "async", "dispatch", r, k)`` (``k``: the k-th dispatch time of the round).
   A job's times are fixed when it starts: its download starts when the client's downlink
   is free, its compute (``LinkModel.compute``) when the download has arrived, its upload
   when the compute is done and its uplink is free (:func:`lowband.comm.links.transmit`:
   frames, duty-cycle silences, contact windows, retransmissions: expected, or with
   ``links.retransmissions = "sampled"`` drawn per frame from ``np_gen(seed, "links",
   "async", dispatch number, direction)``);
2. *loss*: a device that goes off (``Availability.next_off``) before its upload has arrived
   loses its work: the download it received stays in the ledger, its upload is never
   made, its slot frees at the moment it went off, and it is not dispatched again within
   the same round (so every dispatch of a round is one download in the ledger);
3. *arrival*: the in-flight job that arrives first, in the total order ``(time, dispatch
   sequence number)`` (simultaneous arrivals in dispatch order), is the round's arrival; if no job can arrive before a slot
   frees or an idle device comes on, the clock moves to that time and dispatches again.

The round's plan (:class:`~lowband.asynchronous.plan.AsyncPlan`) names the dispatched
clients, the arriving one and the lost ones; the algorithm's steps send the model to the
first, train and upload on the second (from the model version it downloaded, which the
client holds in its own state until then) and let the third discard their copy. Every
message is encoded and counted in the ledger by the ordinary round loop, in the round of
the arrival it precedes: a download in the round in which it was sent, an upload in the
round in which it arrives. Memory: a client holds the model it downloaded while its job
is in flight (at most ``concurrency`` copies, dropped at upload or loss); the server holds
its model (and FedBuff its one buffer sum), never old versions.

**Sizes before encoding.** A job's upload is timed when the job starts, before it is
encoded, with the size the run's codecs give a message of that shape (a probe: the
algorithm's :meth:`probe_messages` encoded once per architecture and training-set size on
a scratch network); after each round the clock checks every download and upload in the
ledger against the size it timed and stops the run with one line if a codec wrote another
size (codecs whose size depends on values, or the freshness stamp, are refused up front).

**Records.** ``time/sim_s`` (the arrival's time), ``time/round_s`` (since the previous
arrival), ``async/staleness`` (server updates since the arriving client downloaded),
``async/in_flight``, ``async/lost`` and, with radio power figures, ``energy/j`` in every
metrics record; summary.json gets ``sim_time_s``, ``time_to_target_s``, ``energy_j``,
``staleness_histogram`` ({staleness: arrivals}) and ``async`` (concurrency, server updates,
arrivals, lost jobs). Without ``[links]`` every transfer and computation takes no time:
simultaneous arrivals are then served in dispatch order. The clock's state is checkpointed, so a resumed
run plays the same events.
"""

from __future__ import annotations

import math
from dataclasses import astuple, dataclass
from typing import Any, Callable, Optional

import numpy as np

from lowband.asynchronous.plan import AsyncPlan
from lowband.comm.links import LinkModel, sample_attempts, transmit
from lowband.comm.message import DIRECTIONS
from lowband.devices.availability import ALWAYS_ON, AlwaysOn, Availability
from lowband.devices.compute import class_counts, summary_stats
from lowband.engine.observers.base import Observer, Round, Run
from lowband.seeding import np_gen

__all__ = ["Job", "EventClock"]

INF = math.inf


@dataclass
class Job:
    """One client's job: the model version it downloaded and the times of its events."""

    node: int
    seq: int  #: dispatch sequence number (the last key of the total order)
    version: int  #: the server's model version the client downloaded
    start: float  #: dispatch (the download starts when the client's downlink is free)
    downloaded: float  #: the download has arrived
    computed: float  #: local training done
    arrival: float  #: the upload has arrived at the server (``inf`` when lost)
    lost_at: float = INF  #: the device went off before its upload arrived
    energy_down: float = 0.0  #: the client's radio energy receiving its download (J)
    energy_up: float = 0.0  #: the client's radio energy sending its upload (J; 0 when lost)
    compute_j: float = 0.0  #: the device's compute energy of the job (J; a lost job: what it computed)

    @property
    def key(self) -> tuple[float, int, int]:
        # simultaneous arrivals in dispatch order (first started, first served): a key of
        # (time, node) would let the lowest node id win every tie, and with zero-time jobs
        # (no [links]) it would be the only client the server ever heard
        return (self.arrival, self.seq, self.node)


class EventClock(Observer):
    """The scheduler of an asynchronous run (module docstring).

    ``sizes(node) -> (download bytes, upload bytes)`` as the link sees them (encoded plus
    declared); needed only with ``links``. ``buffer_size``: arrivals per server update
    (1 for FedAsync, K for FedBuff)."""

    def __init__(self, num_nodes: int, concurrency: int, *, buffer_size: int = 1, seed: int = 0,
                 links: Optional[LinkModel] = None, availability: Availability = ALWAYS_ON,
                 sizes: Optional[Callable[[int], tuple[int, int]]] = None,
                 compute_j: Optional[list[float]] = None, devices: Any = None):
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {concurrency}")
        if links is not None and sizes is None:
            raise ValueError("an event clock with a link model needs the message sizes (sizes=)")
        self.num_nodes, self.concurrency = int(num_nodes), min(int(concurrency), int(num_nodes))
        self.buffer_size, self.seed = int(buffer_size), int(seed)
        self.links, self.availability, self.sizes = links, availability, sizes
        #: each device's compute joules per job (None: no energy figure); its device set (summary)
        self.compute_j, self.devices = compute_j, devices
        self._reset()

    def _reset(self) -> None:
        self.now = 0.0  #: time of the last arrival
        self.version = 0  #: server updates so far (arrivals // buffer_size)
        self.arrived = 0
        self.seq = 0
        self.jobs: dict[int, Job] = {}
        self.free: dict[tuple[int, str], float] = {}  #: (node, "up"/"down") -> transmitter free again
        self.times: list[float] = [0.0]  #: times[r]: the time of round r's arrival
        self.energy: list[float] = [0.0]  #: energy[r]: radio joules of rounds 1..r
        self.staleness: list[int] = [-1]  #: staleness[r]: of round r's arrival (-1: none)
        self.histogram: dict[int, int] = {}
        self.lost = 0
        self.node_j: dict[int, float] = {}  #: radio + compute joules per device (jobs that started)
        self.compute_total = [0.0]  #: compute_total[r]: compute joules of rounds 1..r
        self._pending: Optional[AsyncPlan] = None
        self._spent: tuple[float, float, dict[int, float]] = (0.0, 0.0, {})  #: the planned round's joules so far

    # -- building ----------------------------------------------------------------------------
    @classmethod
    def from_sim(cls, sim: Any, builder: Any) -> "EventClock":
        """The clock of ``sim``'s asynchronous algorithm (refuses, with one line, what it
        cannot time: see :func:`lowband.asynchronous.build.check`)."""
        from lowband.asynchronous.build import clock_for

        return clock_for(sim, builder)

    # -- one job ----------------------------------------------------------------------------
    def _start(self, node: int, t: float) -> Job:
        """Time the job of ``node`` dispatched at ``t`` (module docstring, step 1)."""
        self.seq += 1
        m = self.links
        if m is None:  # no link model: transfers and compute take no time
            job = Job(node, self.seq, self.version, t, t, t, t)
        else:
            prof = m.profile(node)
            down_b, up_b = self.sizes(node)  # type: ignore[misc]
            tx = transmit(prof.down, down_b, max(t, self.free.get((node, "down"), 0.0)), prof.windows,
                          self._attempts(prof.down, down_b, "down"))
            self.free[(node, "down")] = tx.free
            computed = tx.arrival + m.compute(node)
            ux = transmit(prof.up, up_b, max(computed, self.free.get((node, "up"), 0.0)), prof.windows,
                          self._attempts(prof.up, up_b, "up"))
            job = Job(node, self.seq, self.version, t, tx.arrival, computed, ux.arrival)
            if m.has_energy:
                job.energy_down = float(prof.down.power_w) * tx.airtime  # type: ignore[arg-type]
            off = self.availability.next_off(node, t)
            if self.compute_j is not None:  # a lost job spent what it computed before the device left
                span = job.computed - job.downloaded
                done = 1.0 if off >= job.computed else max(0.0, off - job.downloaded) / span if span > 0 else 0.0
                job.compute_j = float(self.compute_j[node]) * done
            if off < job.arrival:  # the device leaves before its upload is through: the work is lost
                job.lost_at, job.arrival = float(off), INF
            else:
                self.free[(node, "up")] = ux.free
                if m.has_energy:
                    job.energy_up = float(prof.up.power_w) * ux.airtime  # type: ignore[arg-type]
        return job

    def _attempts(self, d: Any, nbytes: int, direction: str) -> Optional[np.ndarray]:
        """Each frame's transmissions with ``links.retransmissions = "sampled"`` (geometric,
        from a generator addressed by the job's dispatch number and direction); None: the
        expectation."""
        m = self.links
        if m is None or m.retransmissions != "sampled" or d.loss <= 0:
            return None
        return sample_attempts(d, nbytes, np_gen(m.seed, "links", "async", self.seq, direction))

    # -- one round ---------------------------------------------------------------------------
    def plan(self, r: int) -> AsyncPlan:
        """Dispatch, lose and pick the arrival of round ``r`` (module docstring); the
        clock's state moves to the round's end only in :meth:`finish`."""
        t, k = self.now, 0
        dispatch: list[int] = []
        lost: list[int] = []
        radio = compute = 0.0  # the round's joules: downloads started, what lost jobs computed
        spent: dict[int, float] = {}  # the same per device
        while True:
            for job in sorted((j for j in self.jobs.values() if j.lost_at <= t),
                              key=lambda j: (j.lost_at, j.node, j.seq)):
                lost.append(job.node)
                compute += job.compute_j
                spent[job.node] = spent.get(job.node, 0.0) + job.compute_j
                del self.jobs[job.node]
            slots = self.concurrency - len(self.jobs)
            barred = set(dispatch) | set(lost)
            idle = [c for c in range(self.num_nodes) if c not in self.jobs and c not in barred]
            on = [c for c in idle if self.availability.available(c, t)]
            if slots > 0 and on:
                if slots < len(on):
                    pick = np_gen(self.seed, "async", "dispatch", r, k).choice(len(on), size=slots, replace=False)
                    on = [on[i] for i in sorted(pick.tolist())]
                k += 1
                for c in on:
                    job = self._start(c, t)
                    self.jobs[c] = job
                    dispatch.append(c)
                    radio += job.energy_down
                    spent[c] = spent.get(c, 0.0) + job.energy_down
            arriving = [j for j in self.jobs.values() if j.lost_at == INF]
            nxt = min(arriving, key=lambda j: j.key, default=None)
            change = min((j.lost_at for j in self.jobs.values() if j.lost_at < INF), default=INF)
            if self.concurrency > len(self.jobs):  # an idle device that comes on takes a free slot
                waits = [self.availability.next_on(c, t) for c in idle
                         if c not in self.jobs and not self.availability.available(c, t)]
                change = min([change, *(w for w in waits if w > t)])
            if nxt is not None and nxt.arrival <= change:
                break
            if change == INF:
                raise RuntimeError(f"async round {r}: no update can arrive any more (every device in flight was "
                                   f"lost and none comes on again at or after t = {t:g} s)")
            t = change
        self._spent = (radio, compute, spent)
        self.lost += len(lost)
        arrivals = (nxt.node,)
        members = sorted(set(dispatch) | set(arrivals) | set(lost))
        plan = AsyncPlan(r - 1, tuple(members), {}, (), dispatch=tuple(sorted(dispatch)), arrivals=arrivals,
                         lost=tuple(sorted(set(lost))))
        self._pending = plan
        return plan

    def finish(self, r: int) -> int:
        """Round ``r`` was played: its arrival reaches the server. Returns its staleness."""
        plan, self._pending = self._pending, None
        assert plan is not None and len(self.times) == r, "EventClock.finish without plan"
        job = self.jobs.pop(plan.arrivals[0])
        s = self.version - job.version
        self.histogram[s] = self.histogram.get(s, 0) + 1
        self.arrived += 1
        if self.arrived % self.buffer_size == 0:
            self.version += 1
        self.now = job.arrival
        self.times.append(job.arrival)
        # the round's energy: the downloads it started (lost ones too), what its lost jobs
        # computed, and the arrived job's compute and upload
        radio, compute, spent = self._spent
        spent = {**spent, job.node: spent.get(job.node, 0.0) + job.energy_up + job.compute_j}
        for node, e in spent.items():
            self.node_j[node] = self.node_j.get(node, 0.0) + e
        self.energy.append(self.energy[-1] + radio + job.energy_up)
        self.compute_total.append(self.compute_total[-1] + compute + job.compute_j)
        self.staleness.append(s)
        return s

    # -- checks ------------------------------------------------------------------------------
    def check_sizes(self, ledger: Any, r: int, plan: AsyncPlan) -> None:
        """Every download and upload of round ``r`` has the size the clock timed it with."""
        if self.links is None:
            return
        cols = ledger.columns()
        idx = np.flatnonzero(cols["round"] == r)
        nbytes = (cols["encoded"][idx] + cols["declared"][idx]).tolist()
        for s, d, di, b in zip(cols["src"][idx].tolist(), cols["dst"][idx].tolist(),
                               cols["direction"][idx].tolist(), nbytes):
            direction = DIRECTIONS[di]
            node = d if direction == "down" else s
            want = self.sizes(node)[0 if direction == "down" else 1]  # type: ignore[misc]
            if int(b) != int(want):
                raise RuntimeError(f"async round {r}: node {node}'s {direction}load has {b} bytes, but the event "
                                   f"clock timed it with {want}; the run's codecs must give every message of a "
                                   f"shape the same size (fp32, fp16, bf16, int8, topk, ...)")

    # -- records -----------------------------------------------------------------------------
    def elapsed(self, upto: int) -> float:
        return self.times[max(0, min(int(upto), len(self.times) - 1))]

    def record(self, r: int) -> dict[str, Any]:
        r = int(r)
        out: dict[str, Any] = {"time/round_s": float(self.times[r] - self.times[r - 1]) if r >= 1 else 0.0,
                               "time/sim_s": float(self.elapsed(r))}
        if self.links is not None and self.links.has_energy:
            out["energy/round_j"] = float(self.energy[r] - self.energy[r - 1]) if r >= 1 else 0.0
            out["energy/j"] = float(self.energy[min(r, len(self.energy) - 1)])
        if self.compute_j is not None:
            out["energy/compute_round_j"] = float(self.compute_total[r] - self.compute_total[r - 1]) if r >= 1 else 0.0
            out["energy/compute_j"] = float(self.compute_total[r])
        if r >= 1:
            out["async/staleness"] = int(self.staleness[r])
        out["async/in_flight"] = len(self.jobs)
        if not isinstance(self.availability, AlwaysOn):
            out["devices/available"] = sum(self.availability.available(i, self.times[r]) for i in range(self.num_nodes))
        return out

    def summary(self, rounds: int, hit: Optional[int]) -> dict[str, Any]:
        out: dict[str, Any] = {"sim_time_s": self.elapsed(rounds),
                               "time_to_target_s": self.elapsed(hit) if hit is not None else None}
        if self.links is not None and self.links.has_energy:
            out["energy_j"] = float(self.energy[-1])
            out["energy_to_target_j"] = float(self.energy[hit]) if hit is not None else None
        if self.compute_j is not None:
            out["energy_compute_j"] = float(self.compute_total[-1])
        if self.devices is not None:
            out["devices"] = class_counts(self.devices)
        if self.links is not None:
            out["compute_s_per_upload"] = summary_stats([self.links.compute(i) for i in range(self.num_nodes)])
        if self.node_j:
            per = [self.node_j.get(i, 0.0) for i in range(self.num_nodes)]
            out["energy_per_device_j"] = summary_stats(per)
            out["energy_by_device_j"] = per
        out["staleness_histogram"] = {str(s): n for s, n in sorted(self.histogram.items())}
        out["async"] = {"concurrency": self.concurrency, "buffer_size": self.buffer_size,
                        "server_updates": self.version, "arrivals": self.arrived, "lost": self.lost}
        return out

    # -- observer hooks ----------------------------------------------------------------------
    def on_run_start(self, run: Run) -> None:
        run.counters.declare("async/lost")

    def on_round_start(self, run: Run, rnd: Round) -> None:
        before = self.lost
        rnd.played = self.plan(rnd.number)
        run.counters.add(rnd.number, "async/lost", self.lost - before)

    def on_deliver(self, run: Run, rnd: Round) -> None:
        plan = rnd.played
        assert isinstance(plan, AsyncPlan)
        self.check_sizes(run.sim.ledger, rnd.number, plan)
        self.finish(rnd.number)

    def on_eval(self, run: Run, rnd: Round, rec: dict[str, Any]) -> None:
        rec.update(self.record(rnd.number))

    def on_run_end(self, run: Run, summary: dict[str, Any]) -> None:
        summary.update(self.summary(run.exp.rounds, summary.get("rounds_to_target")))

    # -- checkpoints -------------------------------------------------------------------------
    def checkpoint_state(self) -> dict[str, Any]:
        return {"async_clock": {
            "now": self.now, "version": self.version, "arrived": self.arrived, "seq": self.seq, "lost": self.lost,
            "jobs": [list(astuple(j)) for j in sorted(self.jobs.values(), key=lambda j: j.node)],
            "free": [[n, d, t] for (n, d), t in sorted(self.free.items())],
            "times": list(self.times), "energy": list(self.energy), "staleness": list(self.staleness),
            "compute": list(self.compute_total), "node_j": [[n, e] for n, e in sorted(self.node_j.items())],
            "histogram": {str(s): n for s, n in sorted(self.histogram.items())}}}

    def restore(self, ckpt: dict[str, Any]) -> None:
        st = ckpt.get("async_clock")
        self._reset()
        if st is None:
            return
        self.now, self.version, self.arrived = float(st["now"]), int(st["version"]), int(st["arrived"])
        self.seq, self.lost = int(st["seq"]), int(st["lost"])
        for row in st["jobs"]:
            j = Job(int(row[0]), int(row[1]), int(row[2]), *(float(x) for x in row[3:]))
            self.jobs[j.node] = j
        self.free = {(int(n), str(d)): float(t) for n, d, t in st["free"]}
        self.times = [float(x) for x in st["times"]]
        self.energy = [float(x) for x in st["energy"]]
        self.staleness = [int(x) for x in st["staleness"]]
        self.compute_total = [float(x) for x in st["compute"]]
        self.node_j = {int(n): float(e) for n, e in st["node_j"]}
        self.histogram = {int(s): int(n) for s, n in st["histogram"].items()}
