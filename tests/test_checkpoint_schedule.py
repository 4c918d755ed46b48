"""``checkpoint_every = "auto"`` (issue 43): a costly checkpoint is written every few rounds,
a cheap one every round, never none, and a resume from whichever round it chose is
byte-identical."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from conftest import digits_config
from lowband.config import ConfigError, validate
from lowband.engine.observers.checkpoint import AUTO_FACTOR, Checkpoint
from lowband.engine.simulator import Simulation


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _schedule(rounds: int, round_s: float, cost_s: float) -> tuple[list[int], float]:
    """The rounds an "auto" checkpoint observer writes when each round takes ``round_s``
    and each checkpoint ``cost_s`` (fake clock), and the checkpoints' share of the time."""
    clock = Clock()
    ck = Checkpoint("auto", clock=clock)
    ck._save = lambda run, r: setattr(clock, "now", clock.now + cost_s)  # type: ignore[method-assign]
    run = SimpleNamespace(log=object(), exp=SimpleNamespace(rounds=rounds))
    for r in range(1, rounds + 1):
        clock.now += round_s
        ck.on_round_end(run, SimpleNamespace(number=r))  # type: ignore[arg-type]
    return ck.rounds, len(ck.rounds) * cost_s / clock.now


def test_auto_checkpoints_every_round_when_cheap() -> None:
    rounds, share = _schedule(30, round_s=1.0, cost_s=0.01)
    assert rounds == list(range(1, 31))
    assert share < 0.05


def test_auto_spaces_a_costly_checkpoint_to_a_twentieth_of_the_time() -> None:
    rounds, share = _schedule(30, round_s=1.0, cost_s=0.5)  # 0.5 s: every 10 rounds of 1 s
    assert rounds == [1, 11, 21, 30]
    assert share <= 1 / AUTO_FACTOR + 0.5 / 30  # (the last round's checkpoint is always written)
    rounds, _ = _schedule(12, round_s=1.0, cost_s=100.0)  # dearer than the whole run
    assert rounds == [1, 12]  # the first (its cost measured) and the last: never none


def test_a_number_keeps_its_fixed_schedule() -> None:
    ck = Checkpoint(3)
    assert [r for r in range(1, 11) if ck.due(r, 10)] == [3, 6, 9, 10]
    assert not any(Checkpoint(0).due(r, 10) for r in range(1, 11))


@pytest.mark.parametrize("bad", [-1, "sometimes", 1.5, True])
def test_checkpoint_every_refuses_anything_else(tmp_path: Path, bad: object) -> None:
    with pytest.raises(ConfigError, match="checkpoint_every"):
        validate({**digits_config(tmp_path, "dfedavg"), "checkpoint_every": bad})


def test_auto_resume_from_the_round_it_chose_is_byte_identical(tmp_path: Path) -> None:
    class Kill(Exception):
        pass

    def cfg(name: str) -> dict:
        return {**digits_config(tmp_path / name, "dfedavg", rounds=8), "checkpoint_every": "auto"}

    full = validate(cfg("full"))
    Simulation(full).run()
    cut = validate(cfg("cut"))
    clock = Clock()
    sim = Simulation(cut)
    ck = sim.observer(Checkpoint)
    ck._clock = clock
    save = ck._save

    def dear_save(run: object, r: int) -> None:  # each checkpoint "costs" 0.25 s, each round 1 s
        save(run, r)
        clock.now += 0.25

    def tick(r: int, total: int, rec: dict) -> None:
        clock.now += 1.0
        if r == 7:
            raise Kill

    ck._save = dear_save
    sim.progress = tick
    with pytest.raises(Kill):
        sim.run()
    assert ck.rounds == [1, 6]  # 5 rounds of 1 s after a 0.25 s checkpoint, not every round
    d = Path(cut.run_dir())
    assert torch.load(d / "checkpoint.pt", weights_only=True)["round"] == 6
    Simulation(cut, resume=True).run()
    for f in ("metrics.jsonl", "ledger.csv"):
        assert (Path(full.run_dir()) / f).read_bytes() == (d / f).read_bytes(), f
