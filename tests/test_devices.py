"""Devices (lowband.devices, docs/devices.md): compute per device, availability processes and
traces, and the ``[devices]`` observer on real runs: sampling only among available devices,
absent peers, a device leaving mid-round, compute time in the round time, and the
equal-and-always-on configuration reproducing a run without ``[devices]`` byte for byte."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import digits_config
from lowband.comm.links import PRESETS, forward_flops, replay_round, transmit
from lowband.comm.message import DIRECTIONS, SERVER
from lowband.config import ConfigError, validate
from lowband.devices.availability import Availability
from lowband.devices.compute import CLASSES, draw_devices, read_compute_trace
from lowband.devices.processes import Churn, Diurnal, Windows
from lowband.devices.traces import from_fedscale, read_availability_trace, read_fedscale_json, write_availability_trace
from lowband.engine.observers import LinkClock
from lowband.engine.simulator import Simulation

ROOT = Path(__file__).resolve().parents[1]
FEDSCALE_SAMPLE = Path(__file__).parent / "data" / "fedscale_behave_trace_sample.json"


# --------------------------------------------------------------------------- processes
def _coherent(av: Availability, node: int, times: list[float]) -> None:
    """available / next_on / next_off agree with each other at every time."""
    for t in times:
        on = av.available(node, t)
        if on:
            assert av.next_on(node, t) == t
            off = av.next_off(node, t)
            assert off > t
            if math.isfinite(off):
                assert not av.available(node, off) and av.available(node, (t + off) / 2)
        else:
            assert av.next_off(node, t) == t
            nxt = av.next_on(node, t)
            assert nxt > t
            if math.isfinite(nxt):
                assert av.available(node, nxt) and not av.available(node, (t + nxt) / 2)


def test_diurnal_is_on_its_fraction_of_each_day_from_its_phase() -> None:
    d = Diurnal(50, seed=3, on_fraction=0.25, period_s=86400.0)
    assert len(set(np.round(d.phase, 6))) == 50 and (d.phase >= 0).all() and (d.phase < 86400).all()
    ts = np.arange(0, 3 * 86400, 60.0)
    for node in (0, 7, 49):
        share = np.mean([d.available(node, float(t)) for t in ts])
        assert share == pytest.approx(0.25, abs=0.002)
        _coherent(d, node, [float(t) for t in ts[::97]])
    eq = Diurnal(3, seed=3, on_fraction=0.5, period_s=100.0, phases="equal")
    assert [eq.available(0, t) for t in (0.0, 49.9, 50.0, 99.9, 100.0)] == [True, True, False, False, True]
    assert eq.next_off(1, 10.0) == 50.0 and eq.next_on(1, 60.0) == 100.0


def test_churn_is_a_pure_function_of_the_seed_with_the_stationary_on_share() -> None:
    a = Churn(20, seed=5, mean_on_s=300.0, mean_off_s=100.0)
    b = Churn(20, seed=5, mean_on_s=300.0, mean_off_s=100.0)
    ts = [float(t) for t in np.arange(0, 200000, 37.0)]
    # b is asked in another order (late times first): the windows do not depend on it
    late = [b.available(3, t) for t in reversed(ts)][::-1]
    assert [a.available(3, t) for t in ts] == late
    share = np.mean([a.available(i, t) for i in range(20) for t in ts[::10]])
    assert share == pytest.approx(0.75, abs=0.05)
    _coherent(a, 3, ts[::50])
    assert Churn(20, seed=6, mean_on_s=300.0, mean_off_s=100.0).available(3, 5000.0) in (True, False)


def test_windows_with_and_without_a_period(tmp_path: Path) -> None:
    w = Windows({0: [(10.0, 20.0), (15.0, 30.0)], 1: [(0.0, 5.0)]})
    assert w.windows(0) == [(10.0, 30.0)]  # overlapping windows joined
    assert [w.available(0, t) for t in (9.9, 10.0, 29.9, 30.0)] == [False, True, True, False]
    assert w.next_on(0, 0.0) == 10.0 and w.next_off(0, 12.0) == 30.0 and w.next_on(0, 31.0) == math.inf
    assert not w.available(2, 0.0) and w.next_on(2, 0.0) == math.inf  # a node without windows: never on
    p = Windows({0: [(10.0, 20.0)], 1: [(80.0, 100.0), (0.0, 10.0)]}, period_s=100.0)
    assert p.available(0, 215.0) and not p.available(0, 225.0)
    assert p.next_on(0, 25.0) == 110.0 and p.next_off(0, 212.0) == 220.0
    assert p.next_off(1, 90.0) == 110.0  # a window wrapping over the period's end continues
    _coherent(p, 0, [float(t) for t in range(0, 400, 7)])
    path = tmp_path / "trace.csv"
    write_availability_trace(path, {0: [(10.0, 20.0)], 3: [(0.0, 1.5), (4.0, 5.0)]})
    assert path.read_text().splitlines()[0] == "node,start_s,end_s"
    back = read_availability_trace(path, 4)
    assert back.windows(3) == [(0.0, 1.5), (4.0, 5.0)] and back.windows(1) == []


@pytest.mark.parametrize("text, message", [
    ("node,start\n0,1\n", "header must be node,start_s,end_s"),
    ("node,start_s,end_s\n9,0,1\n", "line 2: node 9 does not exist"),
    ("node,start_s,end_s\n0,5,1\n", "line 2: need 0 <= start_s < end_s"),
    ("node,start_s,end_s\nzero,0,1\n", "line 2: node must be an integer"),
])
def test_a_bad_availability_trace_is_refused_with_its_line(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.csv"
    path.write_text(text)
    with pytest.raises(ValueError, match=message):
        read_availability_trace(path, 4)


def test_fedscale_trace_converts_to_windows_with_a_common_period(tmp_path: Path) -> None:
    """The synthetic sample in FedScale's layout: client 1002's 3600 s cycle is repeated
    once to fill the longest finish_time (7200 s); clients map to nodes by ascending id."""
    windows, period = from_fedscale(read_fedscale_json(FEDSCALE_SAMPLE))
    assert period == 7200.0
    assert windows == {0: [(0.0, 900.0), (3600.0, 5000.0)], 1: [(1200.0, 2000.0), (4800.0, 5600.0)],
                       2: [(6000.0, 7200.0)]}
    out = tmp_path / "out.csv"
    proc = subprocess.run([sys.executable, str(ROOT / "experiments/devices/convert_fedscale.py"), str(FEDSCALE_SAMPLE),
                           str(out), "--clients", "2"], capture_output=True, text=True,
                          env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr
    assert "2 nodes, period_s = 7200" in proc.stdout
    av = read_availability_trace(out, 2, period_s=7200.0)
    assert av.available(0, 7200.0 + 100.0) and not av.available(0, 7200.0 + 1000.0)
    assert av.next_on(1, 2500.0) == 4800.0
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"1": {"active": [0, 5], "inactive": [3], "finish_time": 10}}))
    with pytest.raises(ValueError, match="client 1 has 2 active and 1 inactive"):
        from_fedscale(read_fedscale_json(bad))


# --------------------------------------------------------------------------- compute
def test_a_mix_gives_each_class_its_share_and_a_lognormal_spread_around_its_figure() -> None:
    d = draw_devices(10, {"mcu_m4": 0.3, "rpi4": 0.7}, seed=1)
    assert sorted(d.classes).count("mcu_m4") == 3 and sorted(d.classes).count("rpi4") == 7
    for c, f, j in zip(d.classes, d.flops, d.joules_per_flop):
        assert f == CLASSES[c].flops and j == CLASSES[c].power_w / CLASSES[c].flops
    assert draw_devices(10, {"mcu_m4": 0.3, "rpi4": 0.7}, seed=1) == d  # addressed by the seed
    wide = draw_devices(4000, {"phone": 1.0}, seed=2, spread=0.5)
    assert np.mean(wide.flops) == pytest.approx(CLASSES["phone"].flops, rel=0.03)
    assert np.std(np.log(wide.flops)) == pytest.approx(0.5, rel=0.05)
    with pytest.raises(ValueError, match="unknown device class 'tpu'"):
        draw_devices(3, {"tpu": 1.0}, seed=0)


def test_compute_trace_reads_every_node_once(tmp_path: Path) -> None:
    p = tmp_path / "c.csv"
    p.write_text("node,flops,joules_per_flop,class\n1,2e9,1e-9,pi\n0,1e8,,mcu\n")
    d = read_compute_trace(p, 2)
    assert d.flops == (1e8, 2e9) and d.joules_per_flop == (None, 1e-9) and d.classes == ("mcu", "pi")
    assert not d.has_energy
    p.write_text("node,flops\n0,1e8\n")
    with pytest.raises(ValueError, match="no row for node 1"):
        read_compute_trace(p, 2)


# --------------------------------------------------------------------------- config
@pytest.mark.parametrize("devices, message", [
    ({"mix": {"tpu": 1.0}}, "devices.mix: unknown device class 'tpu'"),
    ({"mix": {"rpi4": 1.0}, "flops": 1e9}, "mix and flops both set"),
    ({"spread": 0.2}, "spread applies to a mix"),
    ({"joules_per_flop": 1e-9}, "joules_per_flop goes with flops"),
    ({"availability": {"kind": "churn", "mean_on_s": 10.0}}, "needs mean_on_s and mean_off_s"),
    ({"availability": {"kind": "diurnal", "mean_on_s": 10.0}}, "mean_on_s is read only with kind = churn"),
    ({"availability": {"kind": "trace", "path": "/nonexistent.csv"}}, "devices.availability.path: no such file"),
    ({"availability": {"kind": "sometimes"}}, "devices.availability.kind"),
])
def test_bad_devices_sections_are_refused_in_one_line(tmp_path: Path, devices: dict, message: str) -> None:
    cfg = digits_config(tmp_path, "fedavg", rounds=1)
    cfg["links"] = {"preset": "nbiot"}
    cfg["devices"] = devices
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")) as e:
        validate(cfg)
    assert len(str(e.value).splitlines()) == 1


def test_devices_need_the_link_clock(tmp_path: Path) -> None:
    cfg = digits_config(tmp_path, "fedavg", rounds=1)
    cfg["devices"] = {"mix": {"rpi4": 1.0}}
    with pytest.raises(ConfigError, match="devices: device compute and availability live on the simulated clock"):
        validate(cfg)


# --------------------------------------------------------------------------- runs
def _run(cfg: dict) -> Simulation:
    sim = Simulation(validate(cfg))
    sim.run()
    return sim


def _metrics(sim: Simulation) -> list[dict]:
    return [json.loads(x) for x in (Path(sim.exp.run_dir()) / "metrics.jsonl").read_text().splitlines()]


def _trace(tmp_path: Path, windows: dict[int, list[tuple[float, float]]]) -> str:
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "avail.csv"
    write_availability_trace(path, windows)
    return str(path)


def test_same_experiment_with_equal_always_on_devices_reproduces_todays_run(tmp_path: Path) -> None:
    """[devices] with every device at links.device_flops and always on: metrics.jsonl and the
    ledger byte-identical to the run without [devices] (the new clock changes nothing it
    should not); with an energy figure only the energy keys are added."""
    base = digits_config(tmp_path / "a", "fedavg", rounds=3)
    base["links"] = {"preset": "nbiot"}
    plain = _run(base)
    d_plain = Path(plain.exp.run_dir())
    for i, devices in enumerate([{"flops": 1e9}, {}, {"flops": 1e9, "availability": {"kind": "always"}}]):
        cfg = digits_config(tmp_path / f"b{i}", "fedavg", rounds=3)
        cfg["links"] = {"preset": "nbiot"}
        cfg["devices"] = devices
        d = Path(_run(cfg).exp.run_dir())
        assert (d / "metrics.jsonl").read_bytes() == (d_plain / "metrics.jsonl").read_bytes()
        assert (d / "ledger.csv").read_bytes() == (d_plain / "ledger.csv").read_bytes()
    cfg = digits_config(tmp_path / "c", "fedavg", rounds=3)
    cfg["links"] = {"preset": "nbiot"}
    cfg["devices"] = {"flops": 1e9, "joules_per_flop": 2e-9}
    energy = _run(cfg)
    recs = _metrics(energy)
    assert [{k: v for k, v in r.items() if not k.startswith("energy/compute")} for r in recs] == _metrics(plain)
    assert recs[-1]["energy/compute_j"] > 0


def test_compute_time_enters_the_round_time_by_the_formula(tmp_path: Path) -> None:
    """Each client's compute is 3 x forward FLOPs x samples / its device's rate, and the round
    lasts max over the sampled clients of download + compute + upload."""
    cfg = digits_config(tmp_path, "fedavg", rounds=2)
    cfg["links"] = {"preset": "nbiot"}
    cfg["devices"] = {"mix": {"mcu_m4": 0.5, "jetson_nano": 0.5}}
    sim = _run(cfg)
    model = sim.observer(LinkClock).timer.model
    fwd = forward_flops(sim.builder(0), tuple(sim.fed.input_shape))
    classes = sim.observer(__import__("lowband.engine.observers", fromlist=["Devices"]).Devices).devices.classes
    for i, nd in enumerate(sim.fed.nodes):
        expect = 3.0 * fwd * (1 * nd.n_train) / CLASSES[classes[i]].flops
        assert model.compute(i) == pytest.approx(expect, rel=1e-12)
    assert {classes.count("mcu_m4"), classes.count("jetson_nano")} == {4}
    assert max(model.compute_s) > 50 * min(model.compute_s)
    nb = PRESETS["nbiot"]
    cols = sim.ledger.columns()
    for rec in _metrics(sim)[1:]:
        r, m = rec["round"], cols["round"] == rec["round"]
        per = []
        for c in sorted(set(cols["dst"][m & (cols["src"] == SERVER)].tolist())):
            down = int(cols["encoded"][m & (cols["dst"] == c)].sum())
            up = int(cols["encoded"][m & (cols["src"] == c)].sum())
            per.append(transmit(nb.down, down).arrival + model.compute(c) + transmit(nb.up, up).arrival)
        assert rec["time/round_s"] == pytest.approx(max(per), rel=1e-12)


def test_only_available_devices_are_sampled_and_send(tmp_path: Path) -> None:
    """A hand-built trace: devices 0-3 are never on, 4-7 always. A star sampling 4 of 8 draws
    4-7 every round (absent ones replaced by present ones); nothing goes to or comes from 0-3."""
    cfg = digits_config(tmp_path, "fedavg", rounds=3)
    cfg["links"] = {"preset": "nbiot"}
    cfg["devices"] = {"availability": {"kind": "trace", "path": _trace(tmp_path, {i: [(0.0, 1e9)] for i in range(4, 8)})}}
    sim = _run(cfg)
    cols = sim.ledger.columns()
    for r in range(1, 4):
        m = cols["round"] == r
        assert set(cols["dst"][m & (cols["src"] == SERVER)].tolist()) == {4, 5, 6, 7}
        assert set(cols["src"][m & (cols["dst"] == SERVER)].tolist()) == {4, 5, 6, 7}
    assert all(r["devices/available"] == 4 for r in _metrics(sim)[1:])
    # without the trace the same seed samples some of 0-3: the trace is what kept them out
    plain = digits_config(tmp_path / "p", "fedavg", rounds=3)
    plain["links"] = {"preset": "nbiot"}
    pcols = _run(plain).ledger.columns()
    assert set(pcols["dst"][pcols["src"] == SERVER].tolist()) & {0, 1, 2, 3}


def test_an_absent_peer_neither_sends_nor_receives(tmp_path: Path) -> None:
    cfg = digits_config(tmp_path, "dfedavg", rounds=2)
    cfg["links"] = {"preset": "nbiot"}
    cfg["devices"] = {"availability": {"kind": "trace", "path": _trace(tmp_path, {i: [(0.0, 1e9)] for i in range(1, 8)})}}
    sim = _run(cfg)
    cols = sim.ledger.columns()
    assert len(cols["src"]) > 0
    assert not ((cols["src"] == 0) | (cols["dst"] == 0)).any()
    init = sim.builder.init_params(0)
    state = sim.executor.states[0]["params"]
    assert all(np.array_equal(state[k].numpy(), init[k].numpy()) for k in init)  # it never trained


def test_a_device_leaving_mid_round_loses_its_work_and_its_bytes_stay(tmp_path: Path) -> None:
    """Device 5 goes off after its download arrived and before its upload arrives: the server
    averages without it (the same model as a run where 5 was absent), while the ledger holds
    every byte of the round, its download and its upload included."""
    def cfg_for(name: str, windows: dict) -> dict:
        cfg = digits_config(tmp_path / name, "fedavg", rounds=1)
        cfg["topology"] = {"kind": "star", "sampling": "all"}
        cfg["links"] = {"preset": "nbiot"}
        cfg["devices"] = {"availability": {"kind": "trace", "path": _trace(tmp_path / name, windows)}}
        return cfg

    on = {i: [(0.0, 1e9)] for i in range(8)}
    full = _run(cfg_for("full", on))
    model = full.observer(LinkClock).timer.model
    clock = model.clock(0.0, 1)
    cols = full.ledger.columns()
    down_at = up_at = None
    for s, d, di, b in zip(cols["src"].tolist(), cols["dst"].tolist(), cols["direction"].tolist(),
                           (cols["encoded"] + cols["declared"]).tolist()):
        t = clock.transfer(s, d, DIRECTIONS[di], b)
        if d == 5:
            down_at = t
        if s == 5:
            up_at = t
    assert down_at is not None and up_at is not None and down_at < up_at
    leave = (down_at + up_at) / 2
    gone = _run(cfg_for("gone", {**on, 5: [(0.0, leave)]}))
    rec = _metrics(gone)[-1]
    assert rec["devices/departed"] == 1
    assert (Path(gone.exp.run_dir()) / "ledger.csv").read_bytes() == (Path(full.exp.run_dir()) / "ledger.csv").read_bytes()
    ref = digits_config(tmp_path / "ref", "fedavg", rounds=1)
    ref["topology"] = {"kind": "star", "sampling": "all"}
    ref["faults"] = {"dropout_schedule": [[1, 5]]}
    absent = _run(ref)
    assert rec["global/acc"] == _metrics(absent)[-1]["global/acc"]
    assert rec["global/acc"] != _metrics(full)[-1]["global/acc"] or rec["global/loss"] != _metrics(full)[-1]["global/loss"]


def test_energy_per_device_is_radio_plus_compute(tmp_path: Path) -> None:
    cfg = digits_config(tmp_path, "fedavg", rounds=2)
    cfg["links"] = {"preset": "lorawan_sf7"}
    cfg["model"] = {"name": "mlp", "hidden": 4}
    cfg["devices"] = {"mix": {"rpi4": 1.0}}
    sim = _run(cfg)
    s = json.loads((Path(sim.exp.run_dir()) / "summary.json").read_text())
    per = s["energy_by_device_j"]
    comp = _metrics(sim)[-1]["energy/compute_j"]
    assert sum(per) == pytest.approx(s["energy_j"] + comp, rel=1e-9)
    assert s["energy_per_device_j"]["max"] == pytest.approx(max(per))
    assert s["devices"] == {"rpi4": 8}


def test_a_killed_run_with_devices_resumes_identically(tmp_path: Path) -> None:
    def cfg_for(name: str) -> dict:
        cfg = digits_config(tmp_path / name, "fedavg", rounds=4)
        cfg["links"] = {"preset": "nbiot"}
        cfg["devices"] = {"mix": {"rpi4": 0.5, "mcu_m4": 0.5}, "spread": 0.3,
                          "availability": {"kind": "churn", "mean_on_s": 40.0, "mean_off_s": 20.0}}
        return cfg

    full = _run(cfg_for("full"))

    class Kill(Exception):
        pass

    def boom(r: int, total: int, rec: dict) -> None:
        if r == 3:
            raise Kill

    cut = cfg_for("cut")
    with pytest.raises(Kill):
        Simulation(validate(cut), progress=boom).run()
    resumed = Simulation(validate(cut), resume=True)
    resumed.run()
    a = (Path(full.exp.run_dir()) / "metrics.jsonl").read_text()
    b = (Path(resumed.exp.run_dir()) / "metrics.jsonl").read_text()
    assert a == b
    sa = json.loads((Path(full.exp.run_dir()) / "summary.json").read_text())
    sb = json.loads((Path(resumed.exp.run_dir()) / "summary.json").read_text())
    assert sa["energy_by_device_j"] == sb["energy_by_device_j"]
    assert sa["devices_available_mean"] == sb["devices_available_mean"]
