"""Codecs with sender state on messages whose tensors change between rounds (issue 17).

An ``ef`` residual or a PowerSGD warm start belongs to the coordinates of the tensor it was
kept for. FedCSPACK's packs change size every round (the stateful codec crashed mid-run),
DisPFL's masked values, FedSPU's sub-models, FedMD's alignment logits and NTK-DFL's
per-example payloads keep a shape but change coordinates (the state would be silently
added to the wrong entries). Such pairs are refused before the run
(``Algorithm.unaligned_kinds``, lowband.engine.checks)."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from conftest import digits_config
from lowband.algorithms import ALGORITHMS
from lowband.config import ConfigError, validate
from lowband.engine.simulator import Simulation


def _config(tmp_path: Path, name: str, comm: dict, rounds: int = 2) -> dict:
    cfg = digits_config(tmp_path, name, rounds=rounds)
    cfg["data"]["public_size"] = 100
    if ALGORITHMS[name].family == "peer":
        cfg["topology"] = {"kind": "kregular", "k": 3}
    cfg["comm"] = comm
    return cfg


CASES = [("fedcspack", "packs", "up"), ("dispfl", "sparse_weights", "peer"), ("fedspu", "weights", "up"),
         ("fedspu", "weights", "down"), ("fedmd", "logits", "up"), ("fedmd", "consensus", "down"),
         ("ntk_dfl", "jacobian", "peer")]


@pytest.mark.parametrize("name,kind,direction", CASES)
@pytest.mark.parametrize("spec", ["ef(topk(0.01))", "powersgd(2)", "int8+ef(sign)"])
def test_stateful_codec_on_unaligned_messages_is_refused(tmp_path: Path, name: str, kind: str, direction: str,
                                                         spec: str) -> None:
    for comm, key in (({"by_direction": {direction: spec}}, f"comm.by_direction.{direction}"),
                      ({"codec": spec}, "comm.codec"), ({"by_kind": {kind: spec}}, f"comm.by_kind.{kind}")):
        with pytest.raises(ConfigError) as exc:
            validate(_config(tmp_path, name, comm))
        msg = str(exc.value)
        assert "\n" not in msg and msg.startswith(f"{key}: {spec!r}"), msg
        named = f"{name}'s " if not key.startswith("comm.by_kind") else f"{name}'s {kind!r}"  # codec: the first such kind
        assert named in msg and "stateless codec" in msg, msg


def test_fedcspack_with_error_feedback_is_refused_by_the_cli_before_anything_is_written(tmp_path: Path,
                                                                                        capsys) -> None:
    import tomli_w

    from lowband.cli import main

    cfg = _config(tmp_path, "fedcspack", {"by_direction": {"up": "ef(topk(0.01))"}})
    path = tmp_path / "exp.toml"
    path.write_text(tomli_w.dumps(cfg))
    assert main(["run", str(path), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "fedcspack's 'packs'" in err[0] and "e.g. topk(0.01)" in err[0], err
    assert not Path(cfg["out_dir"]).exists()


def test_the_suggested_fix_runs_and_the_stateful_codec_still_works_on_the_other_kinds(tmp_path: Path) -> None:
    """FedCSPACK with ef(int8) by default and a stateless codec on its packs: the run
    finishes, and the downlink weights kept an ef residual at the server."""
    cfg = _config(tmp_path, "fedcspack", {"codec": "ef(int8)", "by_kind": {"packs": "int8"}})
    sim = Simulation(validate(cfg))
    sim.run()
    states = sim.network.codec_state_dict()
    assert set(states) == {"-1"}, states.keys()  # only the server's broadcast kept state
    assert all(k.endswith(":weights") for k in states["-1"])


@pytest.mark.parametrize("name", sorted(n for n, a in ALGORITHMS.items()
                                        if a.family in ("server", "peer", "local")
                                        and n not in ("spark", "coboost", "dense", "oneshot_fedavg")))
def test_every_other_message_keeps_its_shapes_under_error_feedback(tmp_path: Path, name: str) -> None:
    """Every round-based algorithm (SPARK shares NTK-DFL's messages; the one-shot methods send
    once, so no state outlives a message) runs 3 rounds with
    ``ef(topk(0.3))`` on every message kind it does not list as unaligned: a kind whose
    tensors change shape between rounds and is not listed would crash here."""
    un = ALGORITHMS[name].unaligned_kinds
    cfg = _config(tmp_path, name, {"codec": "ef(topk(0.3))", "by_kind": {k: "topk(0.3)" for k in un}}, rounds=3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the sparsifier-on-weights warning
        sim = Simulation(validate(cfg))
        sim.run()
    # the state was really kept (DisPFL, FedSPU send only unaligned tensors; local sends nothing)
    assert bool(sim.network.codec_states) == (name not in ("dispfl", "fedspu", "local")), name


@pytest.mark.parametrize("spec", ["ef21", "topk(0.01)+ef21(sign)"])
def test_ef21_is_refused_unless_it_wraps_the_whole_codec(tmp_path: Path, spec: str) -> None:
    """EF21's receiver adds its estimate to what the whole spec decodes, so it must be the
    whole spec and wrap a codec (tests/test_ef21.py has the rest)."""
    cfg = digits_config(tmp_path, "fedavg", upload="delta")
    cfg["comm"] = {"by_kind": {"delta": spec}}
    with pytest.raises(ConfigError) as exc:
        validate(cfg)
    msg = str(exc.value)
    assert "\n" not in msg and msg.startswith("comm.by_kind.delta: ") and "ef21(" in msg, msg
