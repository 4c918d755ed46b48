"""Hostile bytes against the wire decoder (issue 14): a seeded fuzz run and one regression
test per escape the issue lists. Every failure must be a one-line WireError naming the
field, raised before anything over the receiver's budget is allocated."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from lowband.comm import DEFAULT_BUDGET, DecodeBudget, DeclaredTensor, Message, WireError, decode_message
from lowband.comm.wire import DTYPE_CODES, decode_with_codec, encode_message
from lowband.seeding import torch_gen

ROOT = Path(__file__).resolve().parents[1]
FUZZ = ROOT / "benchmarks" / "fuzz_wire.py"
_spec = importlib.util.spec_from_file_location("fuzz_wire", FUZZ)
F = importlib.util.module_from_spec(_spec)  # the fuzz script's message writer and corpus
_spec.loader.exec_module(F)  # type: ignore[union-attr]

FAST_S = 0.05
F32, F16, F64, I64 = (DTYPE_CODES[t] for t in (torch.float32, torch.float16, torch.float64, torch.int64))


def decode_fast(data: bytes, budget: DecodeBudget | None = None, match: str | None = None) -> WireError:
    """Decode must raise a one-line WireError matching ``match`` within 50 ms."""
    t0 = time.process_time()
    with pytest.raises(WireError, match=match) as e:
        decode_message(data, budget)
    elapsed = time.process_time() - t0
    if elapsed > FAST_S:  # a scheduler hiccup on a shared machine: judge by a second run
        t0 = time.process_time()
        with pytest.raises(WireError):
            decode_message(data, budget)
        elapsed = time.process_time() - t0
    assert elapsed < FAST_S, f"{elapsed * 1e3:.1f} ms"
    assert "\n" not in str(e.value)
    return e.value


def mlp_message(spec: str, meta: dict | None = None, seed: int = 0) -> bytes:
    g = torch_gen(seed, "mlp")
    params = {k: torch.randn(s, generator=g) for k, s in F.MLP.items()}
    return encode_message(Message("weights", params, meta or {"num_examples": 600}),
                          F.codec_from_spec(spec), torch_gen(seed, "enc"))


# ----------------------------------------------------------------------------- the fuzz run


def test_seeded_fuzz_only_wire_errors_fast_and_within_memory(tmp_path: Path) -> None:
    """6,000 inputs of every kind (benchmarks/fuzz_wire.py, fixed seed) in a fresh process:
    only WireError escapes, no decode over 50 ms of CPU time, none adds more than 2x the
    budget's nbytes of resident memory."""
    out = tmp_path / "fuzz.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, str(FUZZ), "--n", "6000", "--seed", "0", "--json", str(out)],
                          capture_output=True, text=True, env=env, timeout=300)
    assert out.exists(), proc.stderr[-3000:]
    s = json.loads(out.read_text())
    assert proc.returncode == 0 and s["ok"], proc.stdout[-3000:]
    assert s["escapes"] == [] and s["multiline"] == [] and s["n_slow"] == 0 and s["n_over_memory"] == 0
    assert s["max_cpu_s"] < FAST_S or s["n_slow"] == 0  # CPU time; over 50 ms only if re-runs agree
    # the run exercised what it claims: every kind of input, valid decodes and budget refusals
    assert set(s["by_kind"]) == set(F.Fuzzer(0, DecodeBudget()).weights)
    outcomes = s["outcomes"]
    assert outcomes.get("decoded OK", 0) > 100
    for reason in ("budget", "meta", "leaves vs codec", "truncated", "codec spec", "form / raw dtype"):
        assert outcomes.get(f"WireError: {reason}", 0) > 20, reason
    if sys.platform.startswith("linux") and os.access("/proc/self/clear_refs", os.W_OK):
        assert s["memory_measured"], "peak memory was not measured"
        assert s["max_peak_bytes"] <= 2 * s["budget_nbytes"]


def test_fuzz_corpus_covers_every_codec_family() -> None:
    specs = {spec for spec, _, _ in F.corpus(0)}
    for family in ("fp32", "fp16", "bf16", "int8", "topk(", "randmask(", "sketch(", "+", "qsgd(", "sign", "ef(",
                   "powersgd("):
        assert any(family in s for s in specs), family
    budget = DecodeBudget.for_elements(F.N_PARAMS, tensors=len(F.MLP))
    for spec, data, _ in F.corpus(0):  # and the valid corpus decodes within its budget
        assert decode_message(data, budget).kind in ("weights", "delta"), spec


# ----------------------------------------------------------------------------- the escapes


def topk_bomb(shape: tuple[int, ...]) -> bytes:
    """A top-k message that keeps one value (k = 1 by count) of a tensor of ``shape``."""
    leaves = F.coded_leaves("topk(1)", torch.ones(4), 0, shape)
    return F.write("topk(1)", [("w", 1, leaves)], meta=b"{}", kind="")


def test_96_byte_topk_bomb_is_refused_before_allocating() -> None:
    data = topk_bomb((2**15, 2**15))  # 2**30 float32 = 4 GiB from 96 bytes
    assert len(data) == 96
    e = decode_fast(data, match=r"tensor 'w' at offset \d+: codec topk\(1\) would decode 1073741824 elements")
    assert "DecodeBudget.max_elements=67108864" in str(e)
    decode_fast(topk_bomb((2**31 - 1,)), match="would decode 2147483647 elements")
    decode_fast(topk_bomb((2**16, 2**16)), match="invalid original shape")  # beyond any codec
    # the check is against the receiver's budget, not a fixed cap: the same claim decodes
    # when the budget allows it, and is refused one element past it
    small = topk_bomb((1000, 1000))
    got = decode_message(small, DecodeBudget(max_elements=10**6))
    assert got.tensors["w"].shape == (1000, 1000) and float(got.tensors["w"].abs().sum()) == 1.0
    decode_fast(small, DecodeBudget(max_elements=10**6 - 1), match="over the 999999 left")


def test_one_changed_byte_in_a_sketch_message_is_refused_quickly() -> None:
    x = torch.randn(40, generator=torch_gen(0, "sk"))
    data = encode_message(Message("weights", {"w": x}, {"num_examples": 3}), F.codec_from_spec("sketch(3,16)"),
                          torch_gen(0, "sk-enc"))
    decode_message(data)
    shape_at = next(f.offset for f in F.walk(data).fields if f.what == "shape_val")
    bad = bytearray(data)
    bad[shape_at + 3] = 0x7F  # 40 -> 40 + 127 * 2**24 elements
    decode_fast(bytes(bad), match=r"codec sketch\(3,16\) would decode 2130706472 elements")
    budget = DecodeBudget.for_elements(40)
    bad[shape_at + 3] = 0
    bad[shape_at + 2] = 0x10  # 40 + 2**20 elements: within the default budget, not the receiver's
    decode_fast(bytes(bad), budget, match="over the 65616 left in the receiver's budget")


@pytest.mark.parametrize("meta, match", [
    (b'{"x":' + b"[" * 100_000 + b"]" * 100_000 + b"}", "nests 100001 deep; the limit is 4"),
    (b"[" * 60_000, "nests 60000 deep"),
    (b'{"a":' * 30_000 + b"1" + b"}" * 30_000, "nests 30000 deep"),
    (b'{"x":' + b"[" * 1000 + b"]" * 1000 + b"}", "nests 1001 deep"),  # enough for json's RecursionError
    (b'{"x":' + b"7" * 4301 + b"}", "an integer of 4301 characters"),
    (b'{"x":' + b"7" * 20 + b"}", "does not fit in int64"),
    (b'{"x":1e999}', "overflows to inf"),
    (b'{"lr":NaN}', "NaN is not allowed"),
    (b'{"lr":-Infinity}', "-Infinity is not allowed"),
    (b'{"num_examples":NaN}', "NaN is not allowed"),
    (b'{"num_examples":-5}', r"meta\['num_examples'\] must be in 1\.\.1099511627776, got -5"),
    (b'{"num_examples":0}', r"num_examples'\] must be in 1\.\."),
    (b'{"num_examples":1e30}', r"num_examples'\] must be an int, got float"),
    (b'{"num_examples":600.0}', r"num_examples'\] must be an int, got float"),
    (b'{"num_examples":"600"}', r"num_examples'\] must be an int, got str"),
    (b'{"num_examples":true}', r"num_examples'\] must be an int, got bool"),
    (b'{"num_examples":1099511627777}', r"must be in 1\.\.1099511627776"),
    (b'{"num_examples":600,"num_examples":-1}', "duplicate key 'num_examples'"),
    (b'{"a":-1}', r"meta\['a'\] must be >= 0.0"),
    (b'{"fim_trace":"x"}', r"meta\['fim_trace'\] must be a number, got str"),
    (b'{"arch":5}', r"meta\['arch'\] must be a string"),
    (b'{"s":"' + b"x" * 5000 + b'"}', "string of 5000 characters"),
    (b'{"l":[' + b",".join([b"1"] * 300) + b"]}", "list of 300 items"),
    (b'{"l":[{"a":1}]}', r"meta\['l'\]\[0\] is a dict"),
    (b'{"o":{}}', r"meta\['o'\] is a dict"),
    (b"[1]", "is not a JSON object"),
    (b"\xff{}", "not valid UTF-8"),
])
def test_hostile_metadata_is_a_wire_error(meta: bytes, match: str) -> None:
    data = F.write("fp32", [], meta=meta)
    e = decode_fast(data, DecodeBudget(max_meta_bytes=2**20), match=match)  # room for the deepest
    assert str(e).startswith("meta at offset ")
    if len(meta) > DEFAULT_BUDGET.max_meta_bytes:
        decode_fast(data, match="exceeds the receiver's budget of 65536 bytes")


def test_metadata_the_algorithms_send_passes() -> None:
    from lowband.algorithms.oneshot.fol import wire_arch
    from lowband.algorithms.oneshot.fol_prune import trace_arch
    from lowband.models import build_model

    arch = wire_arch(trace_arch(build_model("resnet18", num_classes=10, input_shape=[3, 32, 32]), [3, 32, 32]))
    meta = {"num_examples": 600, "a": 0.0, "V": 1.5, "fim_trace": 12.25, "arch": arch, "lr": 0.1, "tag": "c3",
            "flag": True, "none": None, "big": -(2**63)}
    got = decode_message(encode_message(Message("weights", meta=meta), F.codec_from_spec("fp32"), torch_gen(0)))
    assert got.meta == meta
    # unknown keys may hold short lists (nested within the depth limit)
    data = F.write("fp32", [], meta=b'{"l":[1,2.5,"x",null,[true]]}')
    assert decode_message(data).meta == {"l": [1, 2.5, "x", None, [True]]}


def test_flipped_form_byte_is_refused_both_ways() -> None:
    raw = F.write("fp32", [("w", 0, [("", F32, (4,), bytes(16))])])  # a float tensor sent "raw"
    decode_fast(raw, match=r"raw tensor 'w' at offset \d+ must be one part '' of an integer or bool dtype, "
                           r"got part '' of torch.float32")
    coded = F.write("fp16", [("n", 1, [("", I64, (2,), bytes(16))])])  # an int64 tensor sent "coded"
    decode_fast(coded, match=r"leaves do not match codec fp16: fp16: part '' must be torch.float16, got torch.int64")
    # the real thing: flip the form byte of each tensor of a valid message
    data = encode_message(Message("w", {"x": torch.randn(3), "n": torch.tensor([1, 2])}),
                          F.codec_from_spec("fp32"), torch_gen(0))
    for f in (f for f in F.walk(data).fields if f.what == "form"):
        bad = bytearray(data)
        bad[f.offset] ^= 1
        decode_fast(bytes(bad), match="raw tensor|leaves do not match")


def test_dtype_codes_must_be_what_the_codec_produces() -> None:
    tensors = {"x": torch.randn(3), "n": torch.tensor([1, 2])}
    data = encode_message(Message("w", tensors), F.codec_from_spec("fp32"), torch_gen(0))
    dtypes = [f for f in F.walk(data).fields if f.what == "dtype"]
    for f, new, match in ((dtypes[1], F64, "raw tensor 'n'.*torch.float64"),  # int64 -> float64
                          (dtypes[0], DTYPE_CODES[torch.int32], "part '' must be torch.float32, got torch.int32")):
        bad = bytearray(data)
        bad[f.offset] = new
        decode_fast(bytes(bad), match=match)
    # an fp16 message whose form byte flips: float16 must not arrive where float32 is promised
    half = encode_message(Message("w", tensors), F.codec_from_spec("fp16"), torch_gen(0))
    bad = bytearray(half)
    bad[next(f.offset for f in F.walk(half).fields if f.what == "form")] ^= 1
    decode_fast(bytes(bad), match="raw tensor 'x' .* got part '' of torch.float16")
    # same for every part of a chained codec: a float16 top-k value list under "topk+int8"
    msg = mlp_message("topk(0.2)+int8")
    dt = [f for f in F.walk(msg).fields if f.what == "dtype"]
    for f in dt:
        bad = bytearray(msg)
        bad[f.offset] = F16 if bad[f.offset] != F16 else F32
        decode_fast(bytes(bad))


def test_absurd_dims_and_counts_name_the_field() -> None:
    decode_fast(F.write("fp32", [("r", 0, [("", I64, (0, 2**32 - 1), b"")])]),
                match=r"leaf 'r': dims \(0, 4294967295\) at offset \d+: a dim exceeds the receiver's budget")
    decode_fast(F.write("fp32", [("r", 0, [("", I64, (2**16, 2**16), b"")])]),
                match=r"leaf 'r': dims \(65536, 65536\) at offset \d+ need 34359738368 buffer bytes")
    decode_fast(F.write("fp32", [("r", 0, [("", I64, (1,) * 33, bytes(8))])]), match="ndim 33 at offset")
    decode_fast(F.write("fp32", [], declared=[("J", F32, (2**64 - 1, 2**64 - 1))]),
                match=r"declared 'J': dims .* would declare more than 2\*\*62 bytes")
    decode_fast(F.write("fp32", [], declared=[("J", F32, (0, 2**64 - 1))]), match="more than 2\\*\\*62")
    decode_fast(F.write("fp32", [], declared=[("J", F32, (1,) * 40)]), match="declared 'J': ndim 40")
    ok = decode_message(F.write("fp32", [], declared=[("J", F32, (600 * 10, 26_170))]))
    assert ok.declared == {"J": DeclaredTensor((6000, 26_170))}  # NTK-DFL's 628 MB Jacobian: fine
    many = F.write("fp32", [(f"t{i}", 0, [("", I64, (0,), b"")]) for i in range(20)])
    decode_message(many, DecodeBudget(max_tensors=20))
    decode_fast(many, DecodeBudget(max_tensors=19), match=r"tensor count 20 at offset \d+ exceeds .* 19")
    hdr = bytearray(F.write("fp32", []))
    struct.pack_into("<I", hdr, F.walk(bytes(hdr)).meta_span[0], 2**32 - 1)
    decode_fast(bytes(hdr), match=r"meta length 4294967295 at offset 20 .*DecodeBudget.max_meta_bytes")
    decode_fast(mlp_message("fp32"), DecodeBudget(max_bytes=1000), match="exceeds the receiver's budget of 1000 bytes")


def test_codec_parameters_are_bounded_on_the_wire() -> None:
    data = mlp_message("sketch(3,16)")
    w = F.walk(data)
    at, end = w.spec_span
    for spec, match in (("sketch(9,16)", "rows must be an int in 1..8"),
                        ("sketch(3,16777217)", "cols must be an int in 1..16777216"),
                        ("topk(2147483648)", "count must be in 1..2147483647"),
                        ("+".join(["fp16"] * 9), "chains 9 codecs; the limit is 8"),
                        ("sketch(3,17)", "part 'table' must have shape \\(3, 17\\), got \\(3, 16\\)"),
                        ("x" * 300, "codec spec at offset 14 is 300 bytes; the limit is 256")):
        decode_fast(data[:at] + F._s(spec) + data[end:], match=match)


def test_codec_contents_are_checked() -> None:
    x = torch.randn(64, generator=torch_gen(0, "x"))
    for idx, match in (([3, 1, 2, 0], "strictly increasing"), ([1, 1, 2, 3], "strictly increasing"),
                       ([0, 1, 2, 64], "index out of range"), ([-1, 0, 1, 2], "index out of range")):
        leaves = [(p, c, d, struct.pack("<4i", *idx) if p == "idx" else b)
                  for p, c, d, b in F.coded_leaves("topk(4)", x, 0, (64,))]
        decode_fast(F.write("topk(4)", [("w", 1, leaves)]), match=match)
    for scale in (float("nan"), -1.0, float("inf")):
        leaves = [(p, c, d, struct.pack("<f", scale) if p == "_scale" else b)
                  for p, c, d, b in F.coded_leaves("int8", x, 0)]
        decode_fast(F.write("int8", [("w", 1, leaves)]), match="_scale must be finite and >= 0")
    for spec in ("randmask(0.5)", "sketch(3,16)"):
        leaves = [(p, c, d, struct.pack("<q", -1) if p == "_seed" else b) for p, c, d, b in F.coded_leaves(spec, x, 0)]
        decode_fast(F.write(spec, [("w", 1, leaves)]), match=r"_seed must be one int64 in \[0, 2\*\*62\)")


def test_chained_codec_inner_shape_must_agree_with_the_head() -> None:
    """randmask + topk: the inner top-k's _shape must be the mask's value count, and no
    intermediate tensor may exceed the budget either."""
    x = torch.randn(64, generator=torch_gen(0, "x"))
    spec = "randmask(0.5)+topk(1)"
    good = F.coded_leaves(spec, x, 0)
    decode_message(F.write(spec, [("w", 1, good)]))
    inner = [(p, c, d, struct.pack("<q", 2**20) if p == "val/_shape" else b) for p, c, d, b in good]
    decode_fast(F.write(spec, [("w", 1, inner)]), DecodeBudget.for_elements(64),
                match=r"codec randmask\(0.5\)\+topk\(1\) would decode 1048576 elements")
    decode_fast(F.write(spec, [("w", 1, inner)]), match=r"part 'val' must have shape \(32,\), got \(1048576,\)")


def test_splices_and_truncations_of_every_codec_raise_wire_errors() -> None:
    corpus = F.corpus(1)
    for spec, data, w in corpus:
        for cut in range(0, w.header_end + 24):
            with pytest.raises(WireError):
                decode_message(data[:cut])
    for (_, a, wa), (_, b, wb) in zip(corpus, corpus[1:] + corpus[:1]):
        for fa, fb in zip(wa.fields[::3], wb.fields[::3]):
            try:
                decode_message(a[:fa.offset] + b[fb.offset:])
            except WireError as e:
                assert "\n" not in str(e)


# ----------------------------------------------------------------------------- the budget API


def test_decode_budget_api() -> None:
    assert DEFAULT_BUDGET == DecodeBudget()
    assert (DEFAULT_BUDGET.max_elements, DEFAULT_BUDGET.max_bytes) == (2**26, 2**29 + 2**20)
    assert (DEFAULT_BUDGET.max_meta_bytes, DEFAULT_BUDGET.max_meta_depth, DEFAULT_BUDGET.max_tensors) == (2**16, 4, 1024)
    b = DecodeBudget.for_elements(100_816)
    assert b.max_elements == 2 * 100_816 + 65536 and b.max_bytes == 8 * b.max_elements + 2**20
    assert b.max_tensors == 1024 and b.nbytes == b.max_bytes + 4 * b.max_elements
    b = DecodeBudget.for_elements(1000, slack=1.5, tensors=10, max_meta_depth=2)
    assert (b.max_elements, b.max_tensors, b.max_meta_depth) == (1500 + 65536, 31, 2)
    for bad in (dict(n=-1), dict(n=1.5), dict(n=10, slack=0.5), dict(n=10, slack=math.inf), dict(n=10, tensors=-1)):
        with pytest.raises(ValueError):
            DecodeBudget.for_elements(**bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_meta_depth must be an int >= 1"):
        DecodeBudget(max_meta_depth=0)
    with pytest.raises(ValueError, match="max_elements"):
        DecodeBudget(max_elements=True)
    with pytest.raises(TypeError, match="budget must be a DecodeBudget"):
        decode_message(mlp_message("fp32"), 10**6)  # type: ignore[arg-type]
    msg, codec = decode_with_codec(mlp_message("topk(0.1)+int8"), DecodeBudget.for_elements(F.N_PARAMS))
    assert codec.spec == "topk(0.1)+int8" and msg.tensors["fc1.weight"].shape == (32, 64)


def test_encoder_refuses_what_the_decoder_would() -> None:
    gen = torch_gen(0)
    with pytest.raises(WireError, match="complex tensors cannot travel"):
        encode_message(Message("w", {"c": torch.zeros(2, dtype=torch.complex64)}), F.codec_from_spec("fp32"), gen)
    with pytest.raises(WireError, match="33 dimensions; the limit is 32"):
        encode_message(Message("w", declared={"J": DeclaredTensor((1,) * 33)}), F.codec_from_spec("fp32"), gen)
    with pytest.raises(WireError, match="more than 2\\*\\*62 bytes"):
        encode_message(Message("w", declared={"J": DeclaredTensor((2**40, 2**40))}), F.codec_from_spec("fp32"), gen)
    with pytest.raises(WireError, match="does not fit the wire header"):
        encode_message(Message("w", {"x": torch.zeros((1,) * 33)}), F.codec_from_spec("fp32"), gen)
