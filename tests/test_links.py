"""Link models (issue 17 part 3): bytes become simulated time.

Hand-computed arithmetic of one message (frames, headers, airtime, duty cycle,
retransmissions, contact windows), the round rules (slowest participant, per edge), the
preset table, ``[links]`` config errors, and end-to-end runs: without ``[links]``
nothing changes, with it ``time/sim_s`` follows the ledger and a deadline drops replies.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from conftest import digits_config
from lowband.engine.observers import LinkClock
from lowband.cli import main
from lowband.comm.ledger import Ledger
from lowband.comm.links import (PRESETS, Direction, LinkModel, LinkProfile, LinkTimer, compute_seconds, frames,
                                lora_time_on_air, replay_round, sample_attempts, transmit)
from lowband.comm.message import SERVER
from lowband.config import ConfigError, validate
from lowband.engine.simulator import Simulation

SF12 = PRESETS["lorawan_sf12"]


# ------------------------------------------------------------------ one message
def test_lora_time_on_air_is_semtechs_formula() -> None:
    # SX1276 datasheet 4.1.1.7, by hand: SF12/125 kHz, CR 4/5, 8-symbol preamble, explicit header, CRC, LDRO on:
    # T_sym = 4096/125000 = 32.768 ms; payload symbols 8 + ceil((512 - 48 + 28 + 16) / 40) * 5 = 73;
    # (8 + 4.25 + 73) * 32.768 ms = 2.793472 s for a 64-byte PHY payload (51 B + 13 B header)
    assert lora_time_on_air(64, 12) == pytest.approx(2.793472, abs=1e-12)
    # SF7: T_sym 1.024 ms, LDRO off: 8 + ceil((1880 - 28 + 28 + 16) / 28) * 5 = 348 symbols -> 360.25 * 1.024 ms
    assert lora_time_on_air(235, 7) == pytest.approx(0.368896, abs=1e-12)


def test_1000_bytes_over_lorawan_sf12_by_hand() -> None:
    """1,000 bytes on the SF12 uplink: 20 frames (19 x 51 B + 31 B), 260 header bytes, a full
    frame lasts its LoRa time on air (2.793472 s), the last one 0.745472 + 8 x 44 / 250 s,
    and the 1% duty cycle keeps the radio silent 99 x each frame's airtime between frames."""
    up = SF12.up
    assert frames(1000, up) == (20, 260, 31)
    full = 2.793472
    last = (2.793472 - 8 * 64 / 250) + 8 * 44 / 250  # the frame's fixed time + 44 B at 250 bit/s
    airtime = 19 * full + last
    wait = 99 * 19 * full  # after each of the first 19 frames
    tx = transmit(up, 1000)
    assert tx.frames == 20 and tx.header_bytes == 260
    assert tx.airtime == pytest.approx(airtime, rel=1e-12) and airtime == pytest.approx(55.22944, abs=1e-9)
    assert tx.end == pytest.approx(airtime + wait, rel=1e-12) == pytest.approx(5309.750272, abs=1e-6)
    assert tx.arrival == tx.end  # no uplink latency in the preset
    assert tx.free == pytest.approx(tx.end + 99 * last, rel=1e-12)  # silence after the last frame too
    # the same bytes without a duty cycle: airtime only
    assert transmit(Direction(**{**up.__dict__, "duty_cycle": 1.0}), 1000).end == pytest.approx(airtime, rel=1e-12)


def test_empty_and_exact_multiple_messages() -> None:
    d = Direction(bps=8000, frame_payload=100, frame_overhead=10)
    assert frames(0, d) == (1, 10, 0)  # a header alone still takes a frame
    assert frames(300, d) == (3, 30, 100)
    assert transmit(d, 300).end == pytest.approx(3 * 110 * 8 / 8000)


def test_retransmissions_are_the_expected_count() -> None:
    """A frame lost with probability p is sent 1 / (1 - p) times on average (geometric);
    the expectation is used, so the time is deterministic."""
    base = Direction(bps=1000, frame_payload=50, frame_overhead=0, latency_s=0.5)
    t0 = transmit(base, 500).end
    for p, factor in [(0.5, 2.0), (0.2, 1.25), (0.9, 10.0)]:
        lossy = Direction(bps=1000, frame_payload=50, frame_overhead=0, latency_s=0.5, loss=p)
        tx = transmit(lossy, 500)
        assert tx.end == pytest.approx(factor * t0, rel=1e-12)
        assert tx.arrival == pytest.approx(factor * t0 + 0.5, rel=1e-12)
    # the expectation matches a simulation of the geometric retransmissions
    rng = np.random.default_rng(0)
    sampled = rng.geometric(1 - 0.2, size=(20000, 10)).sum(axis=1).mean() * 0.4  # 10 frames of 0.4 s
    assert sampled == pytest.approx(transmit(Direction(bps=1000, frame_payload=50, frame_overhead=0, loss=0.2),
                                             500).end, rel=0.01)


def test_sampled_retransmissions() -> None:
    """``attempts`` per frame: all ones is the lossless time; seeded geometric draws average
    to the expected time; the frame-by-frame path (windows) agrees with the closed form when
    no window closes."""
    d = Direction(bps=1000, frame_payload=50, frame_overhead=0, loss=0.3, duty_cycle=0.1, latency_s=0.2)
    ones = np.ones(10, dtype=np.int64)
    lossless = Direction(**{**d.__dict__, "loss": 0.0})
    assert transmit(d, 500, attempts=ones).end == pytest.approx(transmit(lossless, 500).end, rel=1e-12)
    rng = np.random.default_rng(1)
    draws = [transmit(d, 500, attempts=sample_attempts(d, 500, rng)).end for _ in range(20000)]
    assert np.mean(draws) == pytest.approx(transmit(d, 500).end, rel=0.01)
    assert np.std(draws) > 0
    open_sky = (1e12, 1e12 - 1, 0.0)  # a window that does not close during the message
    k = np.array([1, 3, 1, 2, 1, 1, 1, 4, 1, 2])
    for attempts in (None, k):
        assert transmit(d, 500, windows=open_sky, attempts=attempts).end == pytest.approx(
            transmit(d, 500, attempts=attempts).end, rel=1e-12)
    # the last frame's retransmissions are each followed by a silence, its final transmission is not
    one = Direction(bps=8, frame_payload=1, frame_overhead=0, duty_cycle=0.5)  # 1 s per frame
    assert transmit(one, 1, attempts=np.array([3])).end == pytest.approx(3 + 2)
    assert sample_attempts(lossless, 500, rng) is None


def test_contact_windows_wait_and_pause() -> None:
    """A 600 s window every 5700 s: a transfer waits for the window, pauses outside it."""
    leo = PRESETS["leo_uhf"]
    win = leo.windows
    assert win == (5700.0, 600.0, 0.0)
    d = Direction(bps=8000, frame_payload=1000, frame_overhead=0)  # 1 s per 1000 B
    assert transmit(d, 100_000, start=0.0, windows=win).end == pytest.approx(100.0)  # inside the first window
    assert transmit(d, 100_000, start=1000.0, windows=win).end == pytest.approx(5700.0 + 100.0)  # waits
    assert transmit(d, 100_000, start=550.0, windows=win).end == pytest.approx(5700.0 + 50.0)  # 50 s, pause, 50 s
    # 1300 s of airtime from t = 0: two full windows, then 100 s of the third
    assert transmit(d, 1_300_000, start=0.0, windows=win).end == pytest.approx(2 * 5700.0 + 100.0)
    # ending exactly at a window's end
    assert transmit(d, 600_000, start=0.0, windows=win).end == pytest.approx(600.0)
    assert transmit(d, 1_200_000, start=0.0, windows=win).end == pytest.approx(5700.0 + 600.0)
    # with a duty cycle too (frame by frame): 2 frames of 1 s, silence 1 s (duty 0.5), from 599 s
    dd = Direction(bps=8000, frame_payload=1000, frame_overhead=0, duty_cycle=0.5)
    # frame 1 599-600; silence to 601 (outside the window); frame 2 waits for 5700 -> 5701
    assert transmit(dd, 2000, start=599.0, windows=win).end == pytest.approx(5701.0)


def test_compute_seconds_from_flops() -> None:
    assert compute_seconds(4736, 100, 1e9) == pytest.approx(3 * 4736 * 100 / 1e9)
    assert compute_seconds(4736, 100, 0, fixed_s=2.5) == 2.5
    from lowband.comm.links import forward_flops
    from lowband.models import build_model

    m = build_model("mlp", num_classes=10, input_shape=(1, 8, 8), hidden=32)
    assert forward_flops(m, (1, 8, 8)) == 2 * (64 * 32 + 32 * 10)  # two matmuls, 2 FLOPs per multiply-add


# ------------------------------------------------------------------ rounds
def _ledger(rows: list[tuple[int, int, str, int]]) -> Ledger:
    led = Ledger()
    for src, dst, direction, n in rows:
        led.record(1, src, dst, direction, "model", n)
    return led


def test_star_round_is_the_slowest_participant() -> None:
    """Client 0 on LTE, client 1 on LoRa SF12: the round lasts client 1's download + compute
    + upload; client 0's chain is much shorter."""
    lte = PRESETS["lte"]
    model = LinkModel(lte, {1: SF12}, compute_s=[0.5, 2.0])
    led = _ledger([(SERVER, 0, "down", 5000), (SERVER, 1, "down", 5000), (0, SERVER, "up", 4000),
                   (1, SERVER, "up", 4000)])
    c0 = transmit(lte.down, 5000).arrival + 0.5 + transmit(lte.up, 4000).arrival
    c1 = transmit(SF12.down, 5000).arrival + 2.0 + transmit(SF12.up, 4000).arrival
    assert c0 < 1 < 1000 < c1
    assert replay_round(model, led, 1).round_s == pytest.approx(c1, rel=1e-12)
    everyone_lte = LinkModel(lte, {}, compute_s=[0.5, 2.0])
    c1_lte = transmit(lte.down, 5000).arrival + 2.0 + transmit(lte.up, 4000).arrival
    assert replay_round(everyone_lte, led, 1).round_s == pytest.approx(c1_lte, rel=1e-12)


def test_peer_round_is_the_slowest_edge() -> None:
    """Each node computes, then sends its messages one after another on its uplink; the
    round ends with the last arrival."""
    d = Direction(bps=8000, frame_payload=1000, frame_overhead=0, latency_s=0.1)  # 1 ms per byte
    prof = LinkProfile("t", "test", up=d, down=d)
    model = LinkModel(prof, {}, compute_s=[1.0, 3.0, 0.0])
    led = _ledger([(0, 1, "peer", 1000), (0, 2, "peer", 1000), (1, 0, "peer", 500), (2, 0, "peer", 200)])
    clock = replay_round(model, led, 1)
    # node 0: 1 s compute, 1 s + 1 s of sending -> arrives 3.1; node 1: 3 s + 0.5 s -> 3.6; node 2: 0.3
    assert clock.round_s == pytest.approx(3.6)


def test_deadline_marks_late_replies_and_caps_the_round() -> None:
    lte = PRESETS["lte"]
    model = LinkModel(lte, {1: SF12}, compute_s=[0.0, 0.0], deadline_s=60.0)
    clock = model.clock()
    assert clock.on_time(clock.transfer(SERVER, 0, "down", 5000))
    clock.transfer(SERVER, 1, "down", 5000)  # downloads are never dropped; they make the reply late
    assert clock.on_time(clock.transfer(0, SERVER, "up", 4000))
    assert not clock.on_time(clock.transfer(1, SERVER, "up", 4000))
    assert clock.late == 1 and clock.round_s == 60.0 < clock.end


def test_timer_accumulates_and_replays() -> None:
    led = Ledger()
    for r in (1, 2, 3):
        led.record(r, SERVER, 0, "down", "model", 1000 * r)
        led.record(r, 0, SERVER, "up", "model", 1000 * r)
    timer = LinkTimer(LinkModel(PRESETS["nbiot"], {}, [0.0]))
    times = [timer.finish(led, r) for r in (1, 2, 3)]
    assert times[0] < times[1] < times[2]
    assert timer.record(3) == {"time/round_s": times[2], "time/sim_s": times[0] + times[1] + times[2]}
    again = LinkTimer(timer.model)
    for r in (1, 2, 3):
        again.finish(led, r)
    assert again.record(3) == timer.record(3)
    with pytest.raises(ValueError):
        again.finish(led, 5)


# ------------------------------------------------------------------ presets
def test_preset_table() -> None:
    assert set(PRESETS) >= {"lorawan_sf12", "lorawan_sf7", "nbiot", "ltem", "lte", "wifi", "leo_uhf"}
    sf7 = PRESETS["lorawan_sf7"]
    for p, bps, payload in [(SF12, 250, 51), (sf7, 5470, 222)]:  # LoRaWAN RP002 EU863-870: DR0 / DR5
        assert (p.up.bps, p.up.frame_payload, p.up.frame_overhead, p.up.duty_cycle) == (bps, payload, 13, 0.01)
        assert p.up.frame_time_s + 8 * (payload + 13) / bps == pytest.approx(
            lora_time_on_air(payload + 13, 12 if p is SF12 else 7), rel=1e-12)
    for name, p in PRESETS.items():
        assert p.source and p.description, name
        for d in (p.up, p.down):
            assert d.bps > 0 and 0 <= d.loss < 1 and 0 < d.duty_cycle <= 1 and d.frame_payload >= 1
    # ordered by speed: a 100 kB upload
    t = {n: transmit(PRESETS[n].up, 100_000).arrival for n in ("lorawan_sf12", "lorawan_sf7", "nbiot", "ltem",
                                                                 "lte", "wifi")}
    assert list(t) == sorted(t, key=t.get, reverse=True)
    assert PRESETS["leo_uhf"].windows is not None


def test_lowband_list_links(capsys) -> None:
    assert main(["list", "links"]) == 0
    out = capsys.readouterr().out
    for name in PRESETS:
        assert name in out
    assert "250 bit/s" in out and "duty 0.01" in out and "contact 600 s every 5700 s" in out


# ------------------------------------------------------------------ config
BAD = [
    ({"links": {"preset": "lora"}}, "links.preset: unknown link preset 'lora'; available: lorawan_sf12"),
    ({"links": {}}, "links.preset"),
    ({"links": {"preset": "lte", "up": {"loss": 1.0}}}, "links.up.loss"),
    ({"links": {"preset": "lte", "down": {"duty_cycle": 0}}}, "links.down.duty_cycle"),
    ({"links": {"preset": "lte", "up": {"bps": -1}}}, "links.up.bps"),
    ({"links": {"preset": "lte", "up": {"speed": 1}}}, "links.up.speed: unknown key"),
    ({"links": {"preset": "lte", "contact_period_s": 10}}, "contact_period_s and contact_duration_s go together"),
    ({"links": {"preset": "lte", "contact_period_s": 10, "contact_duration_s": 20}}, "contact_duration_s <= "),
    ({"links": {"preset": "lte", "nodes": {"wifi": [20]}}}, "links.nodes.wifi: node 20 does not exist"),
    ({"links": {"preset": "lte", "nodes": {"wifi": [1], "nbiot": [1]}}}, "node 1 is given two presets"),
    ({"links": {"preset": "lte", "nodes": {"wlan": [1]}}}, "unknown link preset 'wlan'"),
    ({"links": {"preset": "lte", "deadline_s": 0}}, "links.deadline_s"),
    ({"links": {"preset": "lte", "retransmissions": "random"}}, "links.retransmissions"),
    ({"links": {"preset": "lte", "deadline_s": 5}, "executor": "ray"}, "links.deadline_s: drops late replies"),
]


@pytest.mark.parametrize("raw,expect", BAD, ids=[e for _, e in BAD])
def test_config_errors_are_one_line(raw: dict, expect: str) -> None:
    with pytest.raises(ConfigError) as exc:
        validate(raw)
    msg = str(exc.value)
    assert "\n" not in msg and expect in msg, msg


def test_cli_exits_2_on_a_bad_links_key(capsys, tmp_path: Path) -> None:
    import tomli_w

    cfg = digits_config(tmp_path, "fedavg", rounds=1)
    cfg["links"] = {"preset": "lorawan_sf13"}
    path = tmp_path / "exp.toml"
    path.write_text(tomli_w.dumps(cfg))
    assert main(["run", str(path), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "links.preset" in err
    assert not Path(cfg["out_dir"]).exists()


# ------------------------------------------------------------------ runs
def _run(cfg: dict) -> tuple[list[dict], dict, Path]:
    res = Simulation(validate(cfg)).run()
    d = Path(res.run_dir)
    return [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()], res.summary, d


def _strip_time(recs: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith(("time/", "energy/"))} for r in recs]


def test_without_links_nothing_changes_and_links_only_add_time(tmp_path: Path) -> None:
    """Without [links]: no time key, no [links] in config.toml, no summary key. With [links]
    (no deadline) every other number is identical: link models only read the ledger."""
    plain, s_plain, d_plain = _run(digits_config(tmp_path / "plain", "fedavg", rounds=3))
    assert not any(k.startswith("time/") for r in plain for k in r)
    assert "[links" not in (d_plain / "config.toml").read_text()
    assert "sim_time_s" not in s_plain and "time_to_target_s" not in s_plain
    cfg = digits_config(tmp_path / "timed", "fedavg", rounds=3)
    cfg["links"] = {"preset": "lorawan_sf12"}
    timed, s_timed, d_timed = _run(cfg)
    assert all("time/sim_s" in r and "time/round_s" in r for r in timed)
    assert _strip_time(timed) == plain
    assert (d_timed / "ledger.csv").read_bytes() == (d_plain / "ledger.csv").read_bytes()
    assert s_timed["final"]["time/sim_s"] == timed[-1]["time/sim_s"] == s_timed["sim_time_s"]
    assert not any(k.startswith("energy") for r in plain for k in r) and "energy_j" not in s_plain
    s_timed["final"] = {k: v for k, v in s_timed["final"].items() if not k.startswith(("time/", "energy/"))}
    added = ("sim_time_s", "time_to_target_s", "energy_j", "energy_to_target_j")
    assert {k: v for k, v in s_timed.items() if k not in added} == s_plain


def test_fedavg_digits_over_lorawan_sf12_time_follows_the_ledger(tmp_path: Path) -> None:
    """time/sim_s is increasing, and each round's time is recomputed here from the ledger's
    bytes with the rule written out: max over the sampled clients of download + compute +
    upload (4 sampled clients of 8)."""
    cfg = digits_config(tmp_path, "fedavg", rounds=4)
    cfg["links"] = {"preset": "lorawan_sf12"}
    cfg["eval"] = {"target": 0.3}
    sim = Simulation(validate(cfg))
    res = sim.run()
    recs = res.metrics
    sims = [r["time/sim_s"] for r in recs]
    assert sims[0] == 0.0 and all(b > a for a, b in zip(sims, sims[1:]))
    cols = sim.ledger.columns()
    comp = _timer(sim).model.compute_s
    total = 0.0
    for r in range(1, 5):
        m = cols["round"] == r
        per_client = []
        for c in sorted(set(cols["dst"][m & (cols["src"] == SERVER)].tolist())):
            down = int(cols["encoded"][m & (cols["dst"] == c)].sum())
            up = int(cols["encoded"][m & (cols["src"] == c)].sum())
            per_client.append(transmit(SF12.down, down).arrival + comp[c] + transmit(SF12.up, up).arrival)
        assert len(per_client) == 4
        rec = next(x for x in recs if x["round"] == r)
        assert rec["time/round_s"] == pytest.approx(max(per_client), rel=1e-12)
        total += max(per_client)
        assert rec["time/sim_s"] == pytest.approx(total, rel=1e-12)
    assert 0 < comp[0] < 0.1  # local compute at 1 GFLOP/s is small next to hours of LoRa airtime
    assert res.summary["sim_time_s"] == pytest.approx(total, rel=1e-12)
    hit = res.summary["rounds_to_target"]
    assert hit is not None
    assert res.summary["time_to_target_s"] == next(x["time/sim_s"] for x in recs if x["round"] == hit)


def test_deadline_drops_replies_the_link_cannot_carry(tmp_path: Path) -> None:
    """Every client on LoRa SF12 with a 1-hour deadline: no upload of a ~10 kB model fits
    (it takes ~13 h at 1% duty cycle), every reply is dropped, and the global model never
    moves; the same run on LTE learns. The dropped replies are counted in the ledger."""
    cfg = digits_config(tmp_path / "lora", "fedavg", rounds=2)
    cfg["links"] = {"preset": "lorawan_sf12", "deadline_s": 3600}
    sim = Simulation(validate(cfg))
    lora = sim.run().metrics
    assert [r["links/late"] for r in lora] == [0, 4, 4]
    for r in (1, 2):  # the clock fed while routing and the replay of the ledger agree
        replay = replay_round(_timer(sim).model, sim.ledger, r, _timer(sim).elapsed(r - 1))
        assert replay.late == 4 and replay.round_s == _timer(sim).round_s(r) == 3600.0
    assert lora[1]["global/acc"] == lora[0]["global/acc"] == lora[2]["global/acc"]
    assert [r["time/round_s"] for r in lora[1:]] == [3600.0, 3600.0]
    assert lora[2]["bytes/up"] > 0  # sent, counted, not delivered
    cfg = digits_config(tmp_path / "lte", "fedavg", rounds=2)
    cfg["links"] = {"preset": "lte", "deadline_s": 3600}
    lte, _, _ = _run(cfg)
    assert [r["links/late"] for r in lte] == [0, 0, 0]
    assert lte[2]["global/acc"] > lte[0]["global/acc"]


def test_per_node_presets_and_resume(tmp_path: Path) -> None:
    """Nodes 0-3 on Wi-Fi, the rest on NB-IoT; a run cut after round 2 and resumed writes the
    same metrics.jsonl (times are replayed from the checkpointed ledger)."""
    def cfg(root: Path) -> dict:
        c = digits_config(root, "fedavg", rounds=4)
        c["links"] = {"preset": "nbiot", "nodes": {"wifi": [0, 1, 2, 3]}, "up": {"loss": 0.1}}
        return c

    full, _, d_full = _run(cfg(tmp_path / "full"))

    class Stop(Exception):
        pass

    def boom(r: int, total: int, rec: dict) -> None:
        if r == 2:
            raise Stop

    c = cfg(tmp_path / "cut")
    with pytest.raises(Stop):
        Simulation(validate(c), progress=boom).run()
    Simulation(validate(c), resume=True).run()
    assert (Path(c["out_dir"]) / "metrics.jsonl").read_text() == (d_full / "metrics.jsonl").read_text()
    # sampled retransmissions: deterministic for a seed, not the expectation
    a = cfg(tmp_path / "s1")
    a["links"]["retransmissions"] = "sampled"
    b = cfg(tmp_path / "s2")
    b["links"]["retransmissions"] = "sampled"
    sa, sb = _run(a)[0], _run(b)[0]
    assert sa == sb
    assert _strip_time(sa) == _strip_time(full)
    assert [r["time/sim_s"] for r in sa] != [r["time/sim_s"] for r in full]
    sim = Simulation(validate(cfg(tmp_path / "x")))
    model = _timer(sim).model
    assert model.profile(0).name == "wifi" and model.profile(5).name == "nbiot"
    assert model.profile(5).up.loss == 0.1 and model.profile(0).up.loss == 0.0  # overrides: the default preset
    assert math.isfinite(full[-1]["time/sim_s"]) and full[-1]["time/sim_s"] > 0


def test_peer_run_is_timed_per_edge(tmp_path: Path) -> None:
    """DFedAvg on a 3-regular graph over LTE-M: each round lasts max over nodes of compute +
    its messages sent one after another, recomputed here from the ledger."""
    cfg = digits_config(tmp_path, "dfedavg", rounds=2)
    cfg["links"] = {"preset": "ltem", "compute_s": 0.25}
    sim = Simulation(validate(cfg))
    recs = sim.run().metrics
    up = PRESETS["ltem"].up
    cols = sim.ledger.columns()
    for r in (1, 2):
        m = cols["round"] == r
        ends = []
        for node in sorted(set(cols["src"][m].tolist())):
            t = _timer(sim).model.compute(node)
            assert t > 0.25  # the fixed part plus the FLOP estimate
            for n in cols["encoded"][m & (cols["src"] == node)].tolist():
                tx = transmit(up, n, start=t)
                ends.append(tx.arrival)
                t = tx.free
        assert len(ends) == 8 * 3
        rec = next(x for x in recs if x["round"] == r)
        assert rec["time/round_s"] == pytest.approx(max(ends), rel=1e-12)


def test_flower_adapter_refuses_links(tmp_path: Path) -> None:
    """The Flower adapter does not time its rounds: a config with [links] is refused there
    rather than run without the times it asks for."""
    pytest.importorskip("flwr")
    from lowband.flower.adapter import _setup

    cfg = digits_config(tmp_path, "fedavg", rounds=1)
    cfg["links"] = {"preset": "lte"}
    with pytest.raises(ValueError, match="links: simulated link time"):
        _setup(validate(cfg))


def test_cli_run_prints_the_simulated_time(capsys, tmp_path: Path) -> None:
    import tomli_w

    cfg = digits_config(tmp_path, "fedavg", rounds=1)
    path = tmp_path / "exp.toml"
    path.write_text(tomli_w.dumps(cfg))
    assert main(["run", str(path), "links.preset=lorawan_sf12", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "; simulated link time 16.3 h ->" in out, out
    assert main(["run", str(path), "--out", str(tmp_path / "plain"), "--quiet"]) == 0
    assert "simulated" not in capsys.readouterr().out


# ------------------------------------------------------------------ energy
def test_energy_per_byte_figures() -> None:
    """SX1276 (3.3 V, 29 mA TX / 10.8 mA RX) over a full SF12 frame; LTE by the Huang et al.
    model at the preset's rates; no figure: no energy."""
    assert SF12.up.power_w == pytest.approx(0.0957) and SF12.down.power_w == pytest.approx(0.03564)
    full = transmit(SF12.up, 51)  # one full frame: 2.793 s on the air
    assert SF12.up.joules_per_byte == pytest.approx(0.0957 * full.airtime / 51)
    assert PRESETS["lte"].up.power_w == pytest.approx(3.47999) and PRESETS["lte"].down.power_w == pytest.approx(2.32744)
    for name in ("nbiot", "ltem", "wifi", "leo_uhf"):
        assert PRESETS[name].up.power_w is None and PRESETS[name].down.joules_per_byte is None
    assert not LinkModel(PRESETS["lte"], {3: PRESETS["wifi"]}).has_energy


def test_energy_follows_the_ledger_and_resumes(tmp_path: Path) -> None:
    """energy/round_j is the nodes' radio power x airtime of every ledger row (TX for
    uploads, RX for downloads), energy/j its running sum, energy_j in the summary; a
    preset without figures writes no energy key; a cut and resumed run writes the same."""
    def cfg(root: Path, preset: str = "lorawan_sf12") -> dict:
        c = digits_config(root, "fedavg", rounds=3)
        c["links"] = {"preset": preset}
        return c

    sim = Simulation(validate(cfg(tmp_path / "a")))
    res = sim.run()
    cols = sim.ledger.columns()
    total = 0.0
    for rec in res.metrics[1:]:
        m = np.flatnonzero(cols["round"] == rec["round"])
        want = 0.0
        for i in m:
            b = int(cols["encoded"][i] + cols["declared"][i])
            d = SF12.down if int(cols["src"][i]) == SERVER else SF12.up
            want += float(d.power_w) * transmit(d, b).airtime
        assert want > 0 and rec["energy/round_j"] == pytest.approx(want, rel=1e-12)
        total += want
        assert rec["energy/j"] == pytest.approx(total, rel=1e-12)
    assert res.summary["energy_j"] == pytest.approx(total, rel=1e-12)
    wifi = _run(cfg(tmp_path / "w", "wifi"))
    assert not any(k.startswith("energy") for r in wifi[0] for k in r) and "energy_j" not in wifi[1]
    own = cfg(tmp_path / "o", "wifi")  # a figure of one's own radio: links.up.power_w / down.power_w
    own["links"].update(up={"power_w": 1.0}, down={"power_w": 0.5})
    assert _run(own)[0][-1]["energy/j"] > 0

    class Stop(Exception):
        pass

    def boom(r: int, total: int, rec: dict) -> None:
        if r == 2:
            raise Stop

    c = cfg(tmp_path / "cut")
    with pytest.raises(Stop):
        Simulation(validate(c), progress=boom).run()
    Simulation(validate(c), resume=True).run()
    assert (Path(c["out_dir"]) / "metrics.jsonl").read_text() == (Path(res.run_dir) / "metrics.jsonl").read_text()


def test_compare_plots_against_simulated_time(tmp_path: Path) -> None:
    """`lowband compare` draws accuracy vs cumulative simulated time (time/sim_s) beside the
    bytes plot when the runs have [links], and only then."""
    from lowband.report import _x, compare

    runs = []
    for preset in ("lte", "lorawan_sf12"):
        c = digits_config(tmp_path / preset, "fedavg", rounds=2)
        c["links"] = {"preset": preset}
        runs.append(_run(c)[2])
    _, paths = compare(runs, tmp_path / "cmp")
    assert [p.name for p in paths] == ["accuracy_vs_round.png", "accuracy_vs_bytes.png", "accuracy_vs_time.png"]
    assert paths[2].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    last = _run(digits_config(tmp_path / "plain", "fedavg", rounds=2))[0][-1]
    assert _x(last, "time/sim_s") is None and _x({"time/sim_s": 3}, "time/sim_s") == 3.0
    _, plain = compare([tmp_path / "plain" / "run-fedavg"], tmp_path / "cmp2")
    assert [p.name for p in plain] == ["accuracy_vs_round.png", "accuracy_vs_bytes.png"]


def _timer(sim):
    """The run's link timer (the [links] observer's)."""
    return sim.observer(LinkClock).timer
