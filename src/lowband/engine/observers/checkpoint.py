"""Checkpoints and ``resume=True``: a killed run continues to the identical result.

:class:`Checkpoint` (the last observer) writes ``checkpoint.pt`` every
``checkpoint_every`` rounds and at the last: the round, the node states made so far (from
where they live; a node never read is remade from its seed), the ledger's row count (its
records go to ``ledger.bin``, appended since the previous checkpoint:
:mod:`lowband.ledgerfile`), the senders' codec states (error-feedback residuals, warm starts) and
each observer's :meth:`~lowband.engine.observers.base.Observer.checkpoint_state`.
:class:`Resume` (the first observer) reads it back when the run starts: states, ledger,
codec states, every observer's :meth:`~lowband.engine.observers.base.Observer.restore`;
the run folder's logs are cut back to the checkpoint's round (to nothing for a fresh run
or a resume without a checkpoint) and ``run.start`` / ``run.metrics`` say where the run
stands, for the observers after it.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Union

from lowband.device import is_cpu, to_device
from lowband.engine.observers.base import Observer, Round, Run
from lowband.ledgerfile import LEDGER_LOG, append_ledger_log, read_ledger_log

__all__ = ["Resume", "Checkpoint", "AUTO_FACTOR"]

#: ``checkpoint_every = "auto"``: the rounds between two checkpoints take at least this many
#: times the last checkpoint's cost, so checkpoints stay under 1/AUTO_FACTOR (5%) of the run
AUTO_FACTOR = 20


def codec_states(sim: Any) -> dict[str, Any]:
    """The senders' codec states, from where they live (a distributed executor's workers,
    else this process's network)."""
    get = getattr(sim.executor, "codec_state_dict", None)
    return get() if get is not None else sim.network.codec_state_dict()


def load_codec_states(sim: Any, sd: dict[str, Any]) -> None:
    load = getattr(sim.executor, "load_codec_state_dict", None)
    if load is not None:
        load(sd)
    else:
        sim.network.load_codec_state_dict(sd)


class Resume(Observer):
    def on_run_start(self, run: Run) -> None:
        log, sim = run.log, run.sim
        if log is None:
            return
        ckpt = None
        if sim.resume:
            # no longer a finished run (a restart rewrites its rounds, an extension adds some):
            # a summary left from before would call it finished, and its rounds lost while it runs
            log.remove(log.summary_path)  # (and its record in the manifest)
            ckpt = log.load_checkpoint()
        if ckpt is not None:
            run.start = int(ckpt["round"])
            log.check_no_hole(run.start)  # metrics.jsonl holds every evaluated round up to it
            # the initial states first (lazy: only the server's is made now), so a node the
            # checkpoint does not hold (never read before it) gets its initial state when read
            sim.backend.init_states(sim.topology.plan(0) if sim.num_nodes else None)
            sim.executor.load_state_dict(ckpt["states"] if is_cpu(sim.device) else to_device(ckpt["states"], sim.device))
            if "ledger" in ckpt:  # a checkpoint written before ledger.bin
                sim.ledger.load_state_dict(ckpt["ledger"])
            else:
                info = ckpt["ledger_file"]
                sim.ledger.load_state_dict(read_ledger_log(log.dir / LEDGER_LOG, int(info["rows"]), info["kinds"],
                                                           info.get("crc32")))
            load_codec_states(sim, ckpt.get("codecs", {}))
            for o in run.observers:
                o.restore(ckpt)
        log.truncate_after(run.start if ckpt is not None else -1)
        run.metrics = log.metrics()


class Checkpoint(Observer):
    """Writes ``checkpoint.pt`` after the rounds :meth:`due` names (module docstring).

    ``every``: a round count (every that many rounds and after the last; 0: never), or
    ``"auto"``: after the first round this process plays (which measures a checkpoint's
    cost), after the last, and between them once the time since the last checkpoint ended
    is at least :data:`AUTO_FACTOR` times what that checkpoint took: a costly checkpoint
    (every node of a 10,000-peer run changes every round, 3.2 GB) is written every few
    rounds, a cheap one every round. Which rounds get one depends on the clock; a resume
    is byte-identical from any of them. ``clock``: seconds (``time.monotonic``; tests
    pass their own)."""

    def __init__(self, every: Union[int, str], clock: Callable[[], float] = time.monotonic):
        self.every: Union[int, str] = every if every == "auto" else int(every)
        self._clock = clock
        self._ended: Union[float, None] = None  # clock when the last checkpoint of this process ended
        self._cost = 0.0  # what it took, seconds
        #: the rounds checkpointed by this process, in order
        self.rounds: list[int] = []
        self._rows = 0  # ledger records already in ledger.bin
        self._crc = 0  # the CRC-32 of those records' bytes
        self._legacy = False  # resumed from a checkpoint that holds its ledger: keep that format

    def restore(self, ckpt: dict[str, Any]) -> None:
        self._legacy = "ledger" in ckpt
        self._rows = 0 if self._legacy else int(ckpt["ledger_file"]["rows"])
        self._crc = 0 if self._legacy else int(ckpt["ledger_file"].get("crc32", 0))

    def on_run_start(self, run: Run) -> None:
        self._ended, self.rounds = None, []
        if run.start == 0:
            self._rows, self._crc, self._legacy = 0, 0, False
            if run.log is not None:
                (run.log.dir / LEDGER_LOG).unlink(missing_ok=True)

    def due(self, r: int, rounds: int) -> bool:
        """Whether round ``r`` (of ``rounds``) ends with a checkpoint."""
        if self.every == "auto":
            return r == rounds or self._ended is None or self._clock() - self._ended >= AUTO_FACTOR * self._cost
        return bool(self.every) and (r % int(self.every) == 0 or r == rounds)

    def on_round_end(self, run: Run, rnd: Round) -> None:
        r, log = rnd.number, run.log
        if log is None or not self.due(r, run.exp.rounds):
            return
        start = self._clock()
        self._save(run, r)
        self._ended = self._clock()
        self._cost = self._ended - start
        self.rounds.append(r)

    def _save(self, run: Run, r: int) -> None:
        log = run.log
        assert log is not None
        sim = run.sim
        codecs = codec_states(sim)
        if self._legacy:
            ledger: dict[str, Any] = {"ledger": sim.ledger.state_dict()}
        else:
            self._rows, self._crc = append_ledger_log(log.dir / LEDGER_LOG, sim.ledger, self._rows, self._crc)
            ledger = {"ledger_file": {"rows": self._rows, "kinds": list(sim.ledger.kinds), "crc32": self._crc}}
        ckpt: dict[str, Any] = {"round": r, "states": sim.executor.state_dict(), **ledger,
                                **({"codecs": codecs} if codecs else {})}
        for o in run.observers:
            ckpt.update(o.checkpoint_state())
        log.save_checkpoint(ckpt)
