"""Issue 17 part 1: QSGD, scaled sign, error feedback and PowerSGD.

Properties: QSGD is unbiased (stated statistically) and its bits are really packed; sign
costs ceil(n/8) + 4 bytes per tensor (+ its shape); error feedback loses nothing over
rounds (sent + residual = inputs); PowerSGD is exact on rank-r inputs; codec state is
the sender's, checkpointed (a resumed run is byte-identical) and the same under Ray;
hostile bytes for every new codec end in a one-line WireError."""

from __future__ import annotations

import math
import time
from pathlib import Path

import pytest
import torch

from conftest import digits_config
from lowband.comm import DecodeBudget, Ledger, Message, WireError, decode_message, encode_message, parse_codec
from lowband.comm.codecs import encode_with_state, is_stateful
from lowband.comm.codecs.memory import MAX_POWERSGD_RANK
from lowband.comm.network import CodecConfig, Network
from lowband.comm.codecs.quantizers import pack_codes, unpack_codes
from lowband.comm.wire import header_size
from lowband.config import validate
from lowband.engine.simulator import Simulation
from lowband.seeding import torch_gen


def randn(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(shape, generator=torch_gen(seed, "x"))


def buffer_bytes(data: bytes) -> int:
    return len(data) - header_size(data)


# ----------------------------------------------------------------------------- QSGD


@pytest.mark.parametrize("spec", ["qsgd(1)", "qsgd(4)", "qsgd(4,bucket=16)"])
def test_qsgd_is_unbiased(spec: str) -> None:
    """Mean of K decodes (independent generators) is within 3 (norm/s)/sqrt(K) of x in
    every coordinate. Each decoded coordinate takes two adjacent values (norm/s apart), so
    by Hoeffding P(|mean - x_i| > t) <= 2 exp(-2 K t^2 s^2 / norm^2) = 2 exp(-18) at that t:
    below 1e-5 for all 120 coordinates together."""
    c = parse_codec(spec)
    x = randn(12, 10, seed=3)
    K = 3000
    acc = torch.zeros_like(x, dtype=torch.float64)
    for k in range(K):
        acc += c.decode(c.encode(x, torch_gen(k, "qsgd-unbiased"))).to(torch.float64)
    mean = acc / K
    flat = x.reshape(-1)
    b = c.bucket or flat.numel()
    norms = torch.stack([flat[i:i + b].norm() for i in range(0, flat.numel(), b)])
    step = (norms / c.s).repeat_interleave(b)[:flat.numel()].reshape(x.shape).to(torch.float64)
    err = (mean - x.to(torch.float64)).abs()
    assert bool((err <= 3 * step / math.sqrt(K)).all()), float((err / step).max())
    # and it quantises: one decode is on the grid norm * l / s with |l| <= s, not x itself
    y = c.decode(c.encode(x, torch_gen(0, "one")))
    levels = (y / step).to(torch.float64)
    assert torch.allclose(levels, levels.round(), atol=1e-3) and float(levels.abs().max()) <= c.s + 1e-3
    assert not torch.allclose(y, x, atol=1e-3)


def test_qsgd_rounding_is_stochastic_not_nearest() -> None:
    """A value 30% of the way between levels decodes to the upper level about 30% of the
    time (a deterministic rounding would give 0% or 100%)."""
    c = parse_codec("qsgd(1)")
    x = torch.tensor([0.3, math.sqrt(1 - 0.09)])  # norm 1: x_0 / norm = 0.3
    ups = sum(float(c.decode(c.encode(x, torch_gen(k, "st")))[0]) > 0.5 for k in range(4000))
    assert abs(ups / 4000 - 0.3) < 0.03


@pytest.mark.parametrize("s,width", [(1, 2), (2, 3), (3, 3), (4, 4), (7, 4), (8, 5), (127, 8), (2**15, 17)])
def test_qsgd_bits_are_packed(s: int, width: int) -> None:
    c = parse_codec(f"qsgd({s})")
    assert c.width == width
    for shape in ((37, 5), (8,), (0,), ()):
        n = math.prod(shape)
        want = math.ceil(n * width / 8) + 4 * (n > 0) + 8 * len(shape)
        assert c.size_of(shape) == want
        x = randn(*shape, seed=s)
        data = encode_message(Message("delta", {"w": x}), c, torch_gen(1))
        assert buffer_bytes(data) == want  # the bytes counted are the bytes produced
        assert decode_message(data).tensors["w"].shape == x.shape


def test_pack_unpack_roundtrip_and_padding() -> None:
    g = torch.Generator().manual_seed(0)
    for width in (1, 2, 3, 5, 8, 13, 17):
        for n in (0, 1, 7, 8, 9, 1000, (1 << 18) + 3):
            codes = torch.randint(0, 2**width, (n,), generator=g).numpy()
            packed = pack_codes(codes, width)
            assert packed.size == math.ceil(n * width / 8)
            assert (unpack_codes(packed, n, width) == codes).all()
            if n * width % 8:
                packed[-1] |= 0x80
                with pytest.raises(ValueError, match="padding"):
                    unpack_codes(packed, n, width)


# ----------------------------------------------------------------------------- sign


def test_sign_bytes_and_values() -> None:
    c = parse_codec("sign")
    for shape in ((784, 200), (200,), (10, 3, 3, 3), (13,), ()):
        n = math.prod(shape)
        assert c.size_of(shape) == math.ceil(n / 8) + 4 + 8 * len(shape)
        x = randn(*shape, seed=n)
        data = encode_message(Message("delta", {"w": x}), c, torch_gen(0))
        assert buffer_bytes(data) == math.ceil(n / 8) + 4 + 8 * len(shape)
        y = decode_message(data).tensors["w"]
        scale = x.abs().mean()
        torch.testing.assert_close(y.abs(), torch.full_like(x, float(scale)))
        assert bool(((y >= 0) == (x >= 0)).all())


# ----------------------------------------------------------------------------- error feedback


@pytest.mark.parametrize("inner", ["topk(0.05)", "sign", "qsgd(8,bucket=16)", "topk(0.1)+fp16", "randmask(0.1)",
                                   "int8"])
def test_ef_sent_plus_residual_equals_inputs(inner: str) -> None:
    """Over 30 rounds, through the wire: sum of decoded messages + final residual == sum
    of inputs (float32 tolerance); plain ``inner`` loses far more."""
    ef = parse_codec(f"ef({inner})")
    plain = parse_codec(inner)
    assert is_stateful(ef) and ef.spec == f"ef({inner})"
    state: dict = {}
    total_in = torch.zeros(20, 30, dtype=torch.float64)
    sent_ef = torch.zeros_like(total_in)
    sent_plain = torch.zeros_like(total_in)
    for r in range(30):
        x = randn(20, 30, seed=100 + r)
        total_in += x.to(torch.float64)
        data = encode_message(Message("delta", {"w": x}), ef, torch_gen(r, "ef"), state)
        assert buffer_bytes(data) == plain.size_of((20, 30))  # EF costs no extra bytes
        sent_ef += decode_message(data).tensors["w"].to(torch.float64)
        sent_plain += plain.decode(plain.encode(x, torch_gen(r, "ef"))).to(torch.float64)
    residual = state["w"]["e"].to(torch.float64)
    torch.testing.assert_close(sent_ef + residual, total_in, rtol=0, atol=1e-4)
    lost_ef = float((sent_ef - total_in).norm())
    lost_plain = float((sent_plain - total_in).norm())
    assert lost_ef == pytest.approx(float(residual.norm()), rel=1e-4)
    if inner not in ("int8", "qsgd(8,bucket=16)", "randmask(0.1)"):  # biased codecs drift without EF
        assert lost_ef < 0.5 * lost_plain, (lost_ef, lost_plain)


def test_ef_refuses_non_finite_and_keeps_its_residual() -> None:
    ef = parse_codec("ef(topk(0.1))")
    state: dict = {}
    encode_message(Message("delta", {"w": randn(50)}), ef, torch_gen(0), state)
    before = state["w"]["e"].clone()
    bad = randn(50)
    bad[3] = float("nan")
    with pytest.raises(WireError, match="non-finite"):
        encode_message(Message("delta", {"a": randn(50), "w": bad}), ef, torch_gen(1), state)
    assert set(state) == {"w"} and torch.equal(state["w"]["e"], before)  # nothing committed


def test_ef_wraps_only_stateless_codecs_and_parses_nested_specs() -> None:
    assert parse_codec("ef(topk(0.01)+fp16)").spec == "ef(topk(0.01)+fp16)"
    assert parse_codec("ef(sign)+fp16").spec == "ef(sign)+fp16"
    for bad in ("ef(ef(topk(0.1)))", "ef(powersgd(2))", "ef", "ef()", "ef(topk(0.1)", "ef(zip)",
                "ef(topk(0.1)))", "powersgd(0)", f"powersgd({MAX_POWERSGD_RANK + 1})", "qsgd(0)", "qsgd(1.5)",
                "qsgd(4,bucket=-1)", "sign(1)", "ef(" * 100 + "fp16" + ")" * 100, "ef(" * 200):
        with pytest.raises(ValueError) as e:
            parse_codec(bad)
        assert "\n" not in str(e.value), bad


def test_network_keeps_state_per_sender_link_and_tensor() -> None:
    net = Network(CodecConfig(default="ef(topk(0.1))"), Ledger(), seed=0)
    x = {"a": randn(40), "b": randn(4, 5)}
    net.send(Message("delta", x), 3, -1, round=1, direction="up")
    net.send(Message("delta", x), 4, -1, round=1, direction="up")
    net.broadcast(Message("weights", x), -1, [3, 4], round=1, direction="down")
    assert sorted(net.codec_states) == [-1, 3, 4]
    assert list(net.codec_states[3]) == ["-1:delta"] and list(net.codec_states[-1]) == ["bcast:weights"]
    assert set(net.codec_states[3]["-1:delta"]) == {"a", "b"}
    sd = net.codec_state_dict()
    other = Network(CodecConfig(default="ef(topk(0.1))"), Ledger(), seed=0)
    other.load_codec_state_dict(sd)
    m1 = net.send(Message("delta", x), 3, -1, round=2, direction="up")
    m2 = other.send(Message("delta", x), 3, -1, round=2, direction="up")
    assert all(torch.equal(m1.tensors[k], m2.tensors[k]) for k in x)
    # stateless codecs keep nothing
    plain = Network(CodecConfig(default="topk(0.1)"), Ledger(), seed=0)
    plain.send(Message("delta", x), 3, -1, round=1, direction="up")
    assert plain.codec_states == {}


# ----------------------------------------------------------------------------- PowerSGD


@pytest.mark.parametrize("rank", [1, 2, 4])
def test_powersgd_is_exact_on_rank_r_inputs(rank: int) -> None:
    g = torch_gen(rank, "lowrank")
    m = torch.randn(64, rank, generator=g) @ torch.randn(rank, 3 * 5 * 5, generator=g)
    x = m.reshape(64, 3, 5, 5)  # a conv weight: rows = out channels
    c = parse_codec(f"powersgd({rank})")
    data = encode_message(Message("delta", {"w": x}), c, torch_gen(0), {})
    assert buffer_bytes(data) == 4 * rank * (64 + 75) + 8 * 4 == c.size_of(x.shape)
    y = decode_message(data).tensors["w"]
    torch.testing.assert_close(y, x, rtol=1e-4, atol=1e-4)
    # a rank above r is not exact: the codec does compress
    full = randn(64, 75)
    assert float((c.decode(c.encode(full, torch_gen(0))) - full).norm()) > 0.3 * float(full.norm())


def test_powersgd_warm_start_and_error_feedback() -> None:
    c = parse_codec("powersgd(2)")
    state: dict = {}
    total = torch.zeros(30, 40, dtype=torch.float64)
    sent = torch.zeros_like(total)
    qs = []
    for r in range(12):
        x = randn(30, 40, seed=r)
        total += x.to(torch.float64)
        parts = encode_with_state(c, x, torch_gen(r, "p"), state)
        sent += c.decode(parts).to(torch.float64)
        qs.append(state["q"])
    torch.testing.assert_close(sent + state["e"].to(torch.float64), total, rtol=0, atol=1e-3)
    # warm start: the kept Q is the last message's Q factor (not redrawn each time)
    assert torch.equal(qs[-1], parts["q"])
    # a fixed matrix sent repeatedly with warm start converges to its best rank-2 part
    # (power iteration); a fresh Q each time does not improve
    u, _ = torch.linalg.qr(randn(30, 30, seed=98))
    v, _ = torch.linalg.qr(randn(40, 30, seed=99))
    sv = torch.tensor([10.0, 8.0] + [6.0 * 0.9 ** i for i in range(28)])
    fixed = (u * sv) @ v.T  # singular values 10, 8, then 6 and below: a gap after rank 2
    best = (u[:, :2] * sv[:2]) @ v[:, :2].T
    st: dict = {}
    for r in range(30):
        parts = encode_with_state(c, fixed, torch_gen(r, "w"), st)
        st.pop("e")  # isolate the warm start from error feedback
    warm = float((c.decode(parts) - best).norm())
    cold = float((c.decode(c.encode(fixed, torch_gen(5, "w"))) - best).norm())
    assert warm < 0.05 * float(best.norm()) < cold


def test_powersgd_sends_vectors_and_small_matrices_as_they_are() -> None:
    c = parse_codec("powersgd(4)")
    for shape in ((200,), (), (3, 3), (4, 8)):  # r (n + m) >= n m for the matrices
        x = randn(*shape)
        n = math.prod(shape)
        assert c.size_of(shape) == 4 * n + 8 * len(shape)
        assert torch.equal(c.decode(c.encode(x, torch_gen(0))), x)
    assert c.factors((64, 784)) == (64, 784, 4)


# ----------------------------------------------------------------------------- hostile bytes


def _forge(spec: str, x: torch.Tensor, edit) -> bytes:
    c = parse_codec(spec)
    msg = Message("delta", {"w": x})
    parts = c.encode(x, torch_gen(0))
    edit(parts)

    class Fixed:  # a codec that returns the edited parts (the header still names ``spec``)
        def __init__(self) -> None:
            self.spec = spec

        def encode(self, t, gen):
            return parts

    return encode_message(msg, Fixed(), torch_gen(0))  # type: ignore[arg-type]


HOSTILE = {
    "qsgd code > 2s": ("qsgd(2)", lambda p: p["bits"].fill_(0xFF)),
    "qsgd padding": ("qsgd(4)", lambda p: p["bits"][-1:].fill_(0xF0)),
    "qsgd nan norm": ("qsgd(4)", lambda p: p["_norm"].fill_(float("nan"))),
    "qsgd negative norm": ("qsgd(4)", lambda p: p["_norm"].fill_(-1.0)),
    "qsgd shape bomb": ("qsgd(4)", lambda p: p.update(_shape=torch.tensor([2**15, 2**15]))),
    "qsgd short bits": ("qsgd(4)", lambda p: p.update(bits=p["bits"][:-1].clone())),
    "sign nan scale": ("sign", lambda p: p.update(_scale=torch.tensor(float("nan")))),
    "sign padding": ("sign", lambda p: p["bits"][-1:].fill_(0xFF)),
    "sign shape bomb": ("sign", lambda p: p.update(_shape=torch.tensor([2**31 - 1]))),
    "sign int scale": ("sign", lambda p: p.update(_scale=torch.tensor(1))),
    "powersgd shape bomb": ("powersgd(2)", lambda p: p.update(_shape=torch.tensor([2**20, 2**20]))),
    "powersgd wrong q": ("powersgd(2)", lambda p: p.update(q=torch.zeros(39, 2))),
    "powersgd extra part": ("powersgd(2)", lambda p: p.update(z=torch.zeros(1))),
    "powersgd float64": ("powersgd(2)", lambda p: p.update(p=p["p"].double())),
    "ef topk bad index": ("ef(topk(0.1))", lambda p: p["idx"].fill_(10**6)),
    "ef topk shape bomb": ("ef(topk(0.1))", lambda p: p.update(_shape=torch.tensor([2**30]))),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_bytes_are_one_line_wire_errors_within_budget(case: str) -> None:
    spec, edit = HOSTILE[case]
    data = _forge(spec, randn(30, 13 if "qsgd" in spec or "sign" in spec else 40), edit)
    budget = DecodeBudget.for_elements(10_000)
    t0 = time.process_time()
    with pytest.raises(WireError) as e:
        decode_message(data, budget)
    assert time.process_time() - t0 < 0.05
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("spec", ["qsgd(4)", "qsgd(3,bucket=5)", "sign", "ef(topk(0.1))", "powersgd(2)",
                                  "powersgd(1)+fp16", "ef(sign)+fp16", "ef(topk(0.2)+int8)"])
def test_truncations_and_bitflips_only_raise_wire_errors(spec: str) -> None:
    x = {"a": randn(30, 40), "b": randn(40), "c": randn(2, 3, 4, 5)}
    data = encode_message(Message("delta", x), parse_codec(spec), torch_gen(0), {})
    decode_message(data)  # the valid message decodes
    g = torch.Generator().manual_seed(1)
    for k in range(300):
        b = bytearray(data)
        if k % 3 == 0:
            b = b[:int(torch.randint(0, len(b), (1,), generator=g))]
        else:
            i = int(torch.randint(0, len(b), (1,), generator=g))
            b[i] ^= 1 << int(torch.randint(0, 8, (1,), generator=g))
        try:
            decode_message(bytes(b), DecodeBudget.for_elements(5000))
        except WireError as e:
            assert "\n" not in str(e)


# ----------------------------------------------------------------------------- runs: resume, Ray


def _cfg(root: Path, spec: str, rounds: int = 5) -> dict:
    cfg = digits_config(root, "fedavg", rounds=rounds, upload="delta")
    cfg["comm"] = {"by_kind": {"delta": spec}}
    return cfg


def _run(cfg: dict, **kw) -> Simulation:
    sim = Simulation(validate(cfg), **kw)
    sim.result = sim.run()
    return sim


class _Kill(Exception):
    pass


@pytest.mark.parametrize("spec", ["ef(topk(0.05))", "powersgd(2)"])
def test_stateful_codec_run_resumes_byte_identically(tmp_path: Path, spec: str) -> None:
    full = _run(_cfg(tmp_path / "full", spec))
    cfg = _cfg(tmp_path / "cut", spec)

    def boom(r: int, total: int, rec: dict) -> None:
        if r == 3:  # round 3's metrics written, its checkpoint not
            raise _Kill

    with pytest.raises(_Kill):
        Simulation(validate(cfg), progress=boom).run()
    ckpt = torch.load(Path(cfg["out_dir"]) / "checkpoint.pt", weights_only=True)
    assert ckpt["round"] == 2 and len(ckpt["codecs"]) >= 4  # the clients that sent in rounds 1-2
    saved = [st for links in ckpt["codecs"].values() for per in links.values() for st in per.values()]
    assert any("e" in st and float(st["e"].abs().sum()) > 0 for st in saved)  # real residuals were saved
    resumed = _run(cfg, resume=True)
    a = (Path(full.result.run_dir) / "metrics.jsonl").read_text()
    assert a == (Path(resumed.result.run_dir) / "metrics.jsonl").read_text()
    # a resume that forgot the state would differ: EF changes what is learnt
    plain = _run(_cfg(tmp_path / "plain", "topk(0.05)" if spec.startswith("ef") else "fp32"))
    assert (Path(plain.result.run_dir) / "metrics.jsonl").read_text() != a


@pytest.mark.slow
def test_kill_9_then_resume_with_codec_state(tmp_path: Path) -> None:
    """A real SIGKILL mid-run of `lowband run` with error feedback on the uploads and
    PowerSGD on the downlink, then `--resume`: the metrics.jsonl of an uninterrupted run.
    Slow (about 15 s): two 30-round runs in subprocesses, so the kill lands mid-run."""
    import signal
    import subprocess
    import sys

    import tomli_w

    def config(root: Path) -> dict:
        c = _cfg(root, "ef(topk(0.05))", rounds=30)
        c["comm"]["by_direction"] = {"down": "powersgd(4)"}
        return c

    cfg = config(tmp_path)
    cfg["out_dir"] = str(tmp_path / "killed")
    path = tmp_path / "exp.toml"
    path.write_text(tomli_w.dumps(cfg))
    cmd = [sys.executable, "-m", "lowband.cli", "run", str(path), "--quiet"]
    proc = subprocess.Popen(cmd)
    metrics = tmp_path / "killed" / "metrics.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= 8:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert len(metrics.read_text().splitlines()) < 31, "the run finished before it could be killed"
    ckpt = torch.load(tmp_path / "killed" / "checkpoint.pt", weights_only=True)
    assert {"-1"} < set(ckpt["codecs"])  # the server's warm starts and the clients' residuals
    subprocess.run(cmd + ["--resume"], check=True)
    ref = _run(config(tmp_path / "ref"))
    assert metrics.read_text() == (Path(ref.result.run_dir) / "metrics.jsonl").read_text()


try:
    import ray
except ImportError:  # pragma: no cover - depends on the optional extra
    ray = None


@pytest.mark.slow  # starts a Ray runtime
@pytest.mark.skipif(ray is None, reason="the Ray executor needs the extra: pip install 'lowband[ray]'")
def test_stateful_codec_serial_equals_ray_and_resumes_across(tmp_path: Path) -> None:
    """ef(topk) on FedAvg deltas: the Ray executor gives the serial metrics, ledger and
    codec states (kept on the senders' shards); a serial checkpoint resumes on Ray."""
    started = not ray.is_initialized()
    if started:
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("RAY_memory_monitor_refresh_ms", "0")
            mp.setenv("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")
            ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        spec = "ef(topk(0.05))"
        serial = _run(_cfg(tmp_path / "serial", spec, rounds=3))
        cfg = _cfg(tmp_path / "ray", spec, rounds=3)
        cfg.update(executor="ray", ray_workers=2)
        par = _run(cfg)
        ms = (Path(serial.result.run_dir) / "metrics.jsonl").read_text()
        assert ms == (Path(par.result.run_dir) / "metrics.jsonl").read_text()
        a, b = serial.network.codec_state_dict(), par.executor.codec_state_dict()
        assert list(a) == list(b) and len(a) >= 4
        for src in a:
            for link in a[src]:
                for t, st in a[src][link].items():
                    assert torch.equal(st["e"], b[src][link][t]["e"]), (src, link, t)
        par.executor.close()  # its workers hold both CPUs of the runtime
        # 2 serial rounds, then round 3 on Ray from the checkpoint (codec states scattered)
        split = _cfg(tmp_path / "split", spec, rounds=2)
        _run(split)
        split.update(rounds=3, executor="ray", ray_workers=2)
        resumed = _run(split, resume=True)
        resumed.executor.close()
        assert (Path(resumed.result.run_dir) / "metrics.jsonl").read_text() == ms
    finally:
        if started:
            ray.shutdown()


def test_lowband_list_shows_every_codec_with_its_state(capsys) -> None:
    import re

    from lowband.cli import main
    from lowband.comm.codecs import CODECS

    assert main(["list", "codecs"]) == 0
    out = capsys.readouterr().out
    for name in CODECS:
        assert re.search(rf"^  {re.escape(name)}\s.*\[state: [^\]]+\]$", out, re.M), name
    for name, state in (("ef(codec)", "residual e"), ("powersgd(r)", "warm-start Q"), ("qsgd(s[,bucket=0])", "none"),
                        ("sign", "none"), ("topk(k)", "none")):
        line = next(x for x in out.splitlines() if x.startswith(f"  {name} "))
        assert state in line.split("[state:")[1], line
