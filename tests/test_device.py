"""The ``device`` option (lowband.device): device-parametrised plumbing tests.

Every test that takes ``device`` runs on "cpu" here and is collected for "cuda" on a
machine where ``torch.cuda.is_available()`` (skipped otherwise); the ``@CUDA`` tests run
on a GPU only. What ran on a GPU, and what it found, is in docs/user-guide.md, "Devices"."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest
import torch

from conftest import digits_config
from lowband.algorithms import ALGORITHMS
from lowband.comm.ledger import Ledger
from lowband.comm.message import Message
from lowband.comm.network import CodecConfig, Network
from lowband.comm.wire import codec_from_spec, encode_message
from lowband.config import ConfigError, validate
from lowband.device import check_spec, resolve_device, to_device
from lowband.engine.simulator import Simulation
from lowband.seeding import torch_gen

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU on this machine")
DEVICES = ["cpu", pytest.param("cuda", marks=CUDA)]

#: one algorithm per family: server, peer, personalised packs, knowledge transfer, one-shot
FAMILIES: dict[str, dict[str, Any]] = {
    "fedavg": {},
    "dfedavg": {},
    "fedcspack": {},
    "kta": {"data": {"public_size": 100}},
    "oneshot_fedavg": {"topology": {"kind": "contact_plan", "per_round": [7]},
                       "algorithm": {"pretrain_epochs": 3, "patience": 2, "lr": 0.05, "batch_size": 32}},
}


def _config(tmp_path: Path, alg: str, rounds: int = 2, **top: Any) -> dict[str, Any]:
    cfg = digits_config(tmp_path, alg, rounds=rounds)
    for section, extra in FAMILIES[alg].items():
        cfg[section] = {**cfg.get(section, {}), **extra} if section != "topology" else dict(extra)
    cfg.update(top)
    return cfg


def _tensors(obj: Any) -> Iterator[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _tensors(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _tensors(v)


def test_device_spec_is_checked_in_the_config() -> None:
    assert check_spec("CUDA:1") == "cuda:1"
    for ok in ("cpu", "cuda", "mps", "auto"):
        assert validate({"device": ok}).device == ok
    with pytest.raises(ConfigError, match=r"^device: .*unknown device 'gpu'; allowed: cpu, cuda, cuda:N, mps, auto"):
        validate({"device": "gpu"})
    assert "device" not in validate({}).model_fields_set and validate({}).device == "cpu"


def test_auto_falls_back_to_cpu_and_missing_gpus_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    assert resolve_device("auto") == torch.device("cpu")
    for spec in ("cuda", "cuda:0", "mps"):
        with pytest.raises(ValueError, match="not available on this machine"):
            resolve_device(spec)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device("auto") == torch.device("cuda")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ValueError, match=r"'cuda:3' is not available: this machine has 1 CUDA device"):
        resolve_device("cuda:3")


def test_unavailable_device_is_a_one_line_cli_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    import tomli_w

    from lowband.cli import main

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    cfg = tmp_path / "c.toml"
    cfg.write_text(tomli_w.dumps(_config(tmp_path, "fedavg")))
    assert main(["run", str(cfg), 'device="cuda"', "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "device: 'cuda' is not available on this machine" in err[0], err
    assert not (tmp_path / "run-fedavg" / "metrics.jsonl").exists()  # refused before anything is written


def test_non_serial_executor_refuses_a_gpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ConfigError, match="runs on the serial executor only"):
        Simulation(validate(_config(tmp_path, "fedavg", device="cuda", executor="ray")), write=False)


def test_flower_adapter_refuses_a_device() -> None:
    """The Flower adapter decodes to CPU tensors: another device is refused, not ignored."""
    pytest.importorskip("flwr")
    from lowband.flower.adapter import experiment_from_run_config

    assert experiment_from_run_config({"overrides": "rounds=1"}).device == "cpu"
    with pytest.raises(ConfigError, match="the Flower adapter runs on the CPU only"):
        experiment_from_run_config({"overrides": 'device="cuda"'})


def test_to_device_rebuilds_nested_states() -> None:
    from lowband.data.federation import NodeData

    t = torch.arange(3)
    nd = NodeData(t, t, t, t, t, t)
    state = {"params": {"w": torch.ones(2)}, "list": [t, 1, "x"], "pair": (t, None), "node": nd}
    out = to_device(state, "cpu")
    assert out["list"][1:] == [1, "x"] and out["pair"][1] is None and isinstance(out["node"], NodeData)
    assert all(x.device.type == "cpu" for x in _tensors(out))


@pytest.mark.parametrize("device", DEVICES)
def test_wire_bytes_do_not_depend_on_the_device(device: str) -> None:
    """Encoding moves tensors to the CPU: the same bytes (codec randomness included) on any device."""
    x = torch.randn(64, 33, generator=torch_gen(0, "x"))
    for spec in ("fp32", "int8", "topk(0.05)", "topk(0.1)+fp16", "qsgd(4)"):
        codec = codec_from_spec(spec)
        ref = encode_message(Message("w", {"a": x}), codec, torch_gen(1, "c"))
        got = encode_message(Message("w", {"a": x.to(device)}), codec, torch_gen(1, "c"))
        assert got == ref, spec


@pytest.mark.parametrize("device", DEVICES)
def test_addressed_batches_are_the_same_on_every_device(device: str) -> None:
    """Batch indices come from the addressed CPU generator and are moved: the same batches."""
    from lowband.train import batches

    ref = [b.tolist() for b in batches(50, 8, torch_gen(3, "alg", 1, 0, "local"))]
    got = list(batches(50, 8, torch_gen(3, "alg", 1, 0, "local"), device=torch.device(device)))
    assert all(b.device.type == device for b in got) and [b.tolist() for b in got] == ref


@pytest.mark.parametrize("device", DEVICES)
def test_received_messages_live_on_the_run_device(device: str) -> None:
    dev = torch.device(device)
    net = Network(CodecConfig("fp16"), Ledger(), seed=0, device=dev)
    x = torch.randn(10, 4, generator=torch_gen(0, "x")).to(dev)
    got = net.send(Message("w", {"a": x, "n": torch.arange(3, device=dev)}), 1, 2, round=1, direction="peer")
    assert got is not None and all(t.device.type == dev.type for t in got.tensors.values())
    assert torch.allclose(got.tensors["a"], x, atol=1e-2)


@pytest.mark.parametrize("alg", sorted(FAMILIES))
@pytest.mark.parametrize("device", DEVICES)
def test_families_run_on_the_device(tmp_path: Path, device: str, alg: str) -> None:
    """Two rounds of one algorithm per family: data, models and every state tensor live on
    the device, the run learns something measurable and its bytes are counted."""
    sim = Simulation(validate(_config(tmp_path, alg, device=device)), write=False)
    dev = torch.device(device)
    assert sim.device.type == dev.type
    assert sim.fed.nodes[0].train_x.device.type == dev.type and sim.fed.global_test_x.device.type == dev.type
    res = sim.run()
    states = list(_tensors(sim.executor.states))
    assert states and all(t.device.type == dev.type for t in states)
    last = res.metrics[-1]
    assert last["round"] == 2 and last["bytes/total"] > 0
    main = res.summary["main_metric"] if "main_metric" in res.summary else sim.main_metric
    assert 0.0 <= float(last[main]) <= 1.0
    if device != "cpu":  # fp32 message sizes do not depend on the values: the same ledger totals as on the CPU
        cpu = Simulation(validate(_config(tmp_path / "cpu", alg)), write=False).run()
        if alg != "fedcspack":  # its packs are chosen by value
            assert last["bytes/total"] == cpu.metrics[-1]["bytes/total"]


#: the kernel family (NTK-DFL, SPARK) through each of its code paths: the closed-form MLP
#: kernel, SPARK's fast structured J P (sum layout) with X P1 kept in memory or read back
#: from a disk file, the general structured path (tensor layout), the Kronecker blocks,
#: and the second trip of update = "full"
KERNEL_VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "ntk_dfl": ("ntk_dfl", {"taus": [2, 6]}),
    "spark": ("spark", {"k": 40, "taus": [2, 6], "distill_warmup": 0, "distill_rounds": 4}),
    "spark-xp-on-disk": ("spark", {"k": 40, "taus": [2, 6], "xp_cache_mb": 0.0}),
    "spark-tensor": ("spark", {"k": 40, "taus": [2, 6], "projection_layout": "tensor"}),
    "spark-kron": ("spark", {"k": 36, "taus": [2, 6], "projection": "kron"}),
    "spark-full": ("spark", {"k": 40, "taus": [2, 6], "update": "full"}),
}


def _kernel_config(tmp_path: Path, variant: str, **top: Any) -> dict[str, Any]:
    alg, hp = KERNEL_VARIANTS[variant]
    cfg = digits_config(tmp_path, alg, rounds=2, **hp)
    cfg["topology"] = {"kind": "kregular", "k": 3}
    cfg["eval"] = {"protocols": ["consensus"]}
    if "xp_cache_mb" in hp:  # the products go to files under here and are read back as memmaps
        cfg["algorithm"]["scratch_dir"] = str(tmp_path / "scratch")
    cfg.update(top)
    return cfg


@pytest.mark.parametrize("variant", sorted(KERNEL_VARIANTS))
@pytest.mark.parametrize("device", DEVICES)
def test_kernel_family_runs_on_the_device(tmp_path: Path, device: str, variant: str) -> None:
    """NTK-DFL and SPARK (kernels, projections, the ODE, X P1 caches) on the device: every
    state tensor there, the same bytes as on the CPU (fp32 messages), and on a GPU the same
    accuracy as the CPU run up to float rounding (the first GPU run found a CPU-made tensor
    in each of these paths: a device mix raises, it does not pass silently)."""
    sim = Simulation(validate(_kernel_config(tmp_path, variant, device=device)), write=False)
    res = sim.run()
    dev = torch.device(device)
    states = list(_tensors(sim.executor.states))
    assert states and all(t.device.type == dev.type for t in states)
    last = res.metrics[-1]
    assert last["round"] == 2 and last["bytes/peer"] > 0 and 0.0 <= last["consensus/acc"] <= 1.0
    if variant == "spark-xp-on-disk":
        assert sim.alg.xp_cache().stats["disk"] > 0  # round 2 read X P1 back from its file
    if device != "cpu":
        cpu = Simulation(validate(_kernel_config(tmp_path / "cpu", variant)), write=False).run().metrics[-1]
        assert last["bytes/total"] == cpu["bytes/total"]
        assert abs(last["consensus/acc"] - cpu["consensus/acc"]) <= 0.03, (last, cpu)


@CUDA
@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_every_algorithm_runs_on_a_gpu(tmp_path: Path, name: str) -> None:
    """Every algorithm, two rounds on the GPU with the settings that make it run on the
    digits (tests/test_resume_every_algorithm.py): it finishes, keeps its states on the GPU
    and measures a finite main metric. The CPU runs of the same configs are that file's."""
    from test_resume_every_algorithm import _config as any_config

    cfg = {**any_config(tmp_path, name), "rounds": 2, "device": "cuda", "checkpoint_every": 0}
    sim = Simulation(validate(cfg), write=False)
    res = sim.run()
    assert all(t.device.type == "cuda" for t in _tensors(sim.executor.states))
    values = [float(m[sim.main_metric]) for m in res.metrics if m.get(sim.main_metric) is not None]
    assert res.metrics[-1]["round"] >= 1 and values and all(math.isfinite(v) for v in values)


def test_device_cpu_gives_byte_identical_metrics(tmp_path: Path) -> None:
    """``device = "cpu"`` is today's run: metrics.jsonl byte-identical to a config without the key."""
    a = _config(tmp_path / "a", "fedavg", rounds=3)
    b = {**_config(tmp_path / "b", "fedavg", rounds=3), "device": "cpu"}
    ra, rb = Simulation(validate(a)).run(), Simulation(validate(b)).run()
    ma, mb = (Path(r.run_dir) / "metrics.jsonl" for r in (ra, rb))
    assert ma.read_bytes() == mb.read_bytes() and len(ma.read_bytes().splitlines()) == 4  # rounds 0-3


@pytest.mark.parametrize("device", DEVICES)
def test_link_flops_count_on_the_model_device(device: str) -> None:
    """[links] compute time counts FLOPs with a sample on the model's device (not the 2 x
    parameters fallback a device mismatch would give)."""
    from lowband.comm.links import forward_flops
    from lowband.models import build_model

    model = build_model("mlp", num_classes=10, input_shape=(64,), hidden=32)
    cpu = forward_flops(model, (64,))
    assert cpu != 2 * sum(p.numel() for p in model.parameters())
    assert forward_flops(model.to(device), (64,)) == cpu


def test_resume_may_change_the_device_key(tmp_path: Path) -> None:
    """``device`` is not part of the config a resume must repeat (a run moves between machines);
    here "auto" is this machine's device, so the result equals an uninterrupted run."""
    cfg = _config(tmp_path / "a", "fedavg", rounds=2)
    Simulation(validate(cfg)).run()
    res = Simulation(validate({**cfg, "rounds": 3, "device": "auto"}), resume=True).run()
    whole = Simulation(validate({**_config(tmp_path / "b", "fedavg", rounds=3), "device": "auto"})).run()
    if resolve_device("auto").type == "cpu":
        assert (Path(res.run_dir) / "metrics.jsonl").read_bytes() == (Path(whole.run_dir) / "metrics.jsonl").read_bytes()
    assert [r["round"] for r in res.metrics] == [0, 1, 2, 3]


@CUDA
@pytest.mark.parametrize("first,second", [("cuda", "cpu"), ("cpu", "cuda")])
def test_resume_on_another_device(tmp_path: Path, first: str, second: str) -> None:
    """A run checkpointed on one device continues on the other (map_location + move)."""
    cfg = _config(tmp_path, "fedavg", rounds=2, device=first)
    Simulation(validate(cfg)).run()
    more = {**cfg, "rounds": 4, "device": second}
    res = Simulation(validate(more), resume=True).run()
    lines = (Path(res.run_dir) / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["round"] for x in lines] == [0, 1, 2, 3, 4]  # round 0: the initial model


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
