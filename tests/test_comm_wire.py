"""Wire format: exact round trips, honest sizes, and a WireError for every malformed input."""

from __future__ import annotations

import math
import struct

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lowband.comm import (
    DeclaredTensor,
    Message,
    WireError,
    declared_bytes,
    decode_message,
    encode_message,
    parse_codec,
)
from lowband.comm.meta import META_SCHEMA
from lowband.comm.wire import DTYPE_CODES, MAGIC, header_size
from lowband.seeding import torch_gen

FP32 = parse_codec("fp32")


def cnn_state() -> dict[str, torch.Tensor]:
    """The FedCSPACK FMNIST CNN's state dict shapes: 100,816 params in 10 tensors."""
    g = torch_gen(0, "cnn")
    shapes = {
        "conv1.weight": (10, 1, 5, 5), "conv1.bias": (10,),
        "conv2.weight": (20, 10, 5, 5), "conv2.bias": (20,),
        "fc1.weight": (256, 320), "fc1.bias": (256,),
        "fc2.weight": (50, 256), "fc2.bias": (50,),
        "fc3.weight": (10, 50), "fc3.bias": (10,),
    }
    return {k: torch.randn(s, generator=g) for k, s in shapes.items()}


def roundtrip(msg: Message, spec: str = "fp32", seed: int = 0) -> tuple[bytes, Message]:
    data = encode_message(msg, parse_codec(spec), torch_gen(seed, "test"))
    return data, decode_message(data)


def test_fp32_roundtrip_is_bitwise() -> None:
    sd = cnn_state()
    sd["special"] = torch.tensor([0.0, -0.0, float("inf"), -float("inf"), float("nan"), 1e-45])
    _, got = roundtrip(Message("weights", sd, {"num_examples": 123, "lr": 0.1, "tag": "x",
                                               "ok": True, "none": None}))
    assert got.kind == "weights"
    assert got.meta == {"num_examples": 123, "lr": 0.1, "tag": "x", "ok": True, "none": None}
    assert list(got.tensors) == list(sd)
    for k, t in sd.items():
        assert got.tensors[k].dtype == torch.float32 and got.tensors[k].shape == t.shape
        assert torch.equal(got.tensors[k].view(torch.int32), t.view(torch.int32)), k


def test_int_and_bool_tensors_travel_raw_even_under_lossy_codecs() -> None:
    g = torch_gen(1, "ints")
    ints = {
        "i64": torch.randint(-2**62, 2**62, (7, 3), generator=g),
        "i32": torch.randint(-2**31, 2**31 - 1, (5,), generator=g, dtype=torch.int32),
        "i8": torch.randint(-128, 127, (4, 4), generator=g, dtype=torch.int8),
        "u8": torch.randint(0, 255, (9,), generator=g, dtype=torch.uint8),
        "i16": torch.randint(-3000, 3000, (2, 2, 2), generator=g, dtype=torch.int16),
        "b": torch.rand(11, generator=g) > 0.5,
        "scalar": torch.tensor(42),
        "empty": torch.zeros(0, 3, dtype=torch.int64),
    }
    for spec in ("fp32", "int8", "topk(0.1)+fp16", "sketch(2,8)"):
        _, got = roundtrip(Message("x", ints), spec)
        for k, t in ints.items():
            assert got.tensors[k].dtype == t.dtype and torch.equal(got.tensors[k], t), (spec, k)


def test_other_float_dtypes_arrive_as_float32() -> None:
    x = torch.randn(5, 4, dtype=torch.float64)
    h = torch.randn(3).half()
    b = torch.randn(3).bfloat16()
    _, got = roundtrip(Message("w", {"x": x, "h": h, "b": b}))
    assert torch.equal(got.tensors["x"], x.float())
    assert torch.equal(got.tensors["h"], h.float())
    assert torch.equal(got.tensors["b"], b.float())


def test_size_is_header_plus_buffers_and_header_is_small() -> None:
    sd = cnn_state()
    numel = sum(t.numel() for t in sd.values())
    assert numel == 100_816 and len(sd) == 10
    data, _ = roundtrip(Message("weights", sd, {"num_examples": 600}))
    hdr = header_size(data)
    assert len(data) == hdr + 4 * numel
    # 10 tensors: about 30 bytes each plus a fixed part; well under 0.1% of the payload.
    assert hdr < 400, hdr
    assert (len(data) - 4 * numel) / (4 * numel) < 1e-3


@pytest.mark.parametrize("spec", ["fp16", "bf16", "int8", "topk(0.05)", "topk(100)+fp16",
                                  "randmask(0.2)+int8", "sketch(3,50)"])
def test_size_of_matches_encoded_buffers(spec: str) -> None:
    sd = cnn_state()
    codec = parse_codec(spec)
    data, _ = roundtrip(Message("weights", sd), spec)
    assert len(data) - header_size(data) == sum(codec.size_of(tuple(t.shape)) for t in sd.values())


def test_declared_tensors_are_counted_not_built() -> None:
    # NTK-DFL's Jacobian: about 628 MB in fp32. It must cost nothing to send.
    jac = DeclaredTensor((600 * 10, 26_170), torch.float32)
    msg = Message("jacobian", {"logits": torch.randn(600, 10)}, declared={"J": jac})
    for spec, per in (("fp32", 4), ("fp16", 2), ("bf16", 2)):
        data, got = roundtrip(msg, spec)
        assert len(data) < 600 * 10 * 4 + 200
        assert got.declared == {"J": jac}
        assert declared_bytes(msg, parse_codec(spec)) == per * jac.numel
    assert declared_bytes(msg, parse_codec("int8")) == jac.numel + 4
    ints = Message("x", declared={"idx": DeclaredTensor((1000,), torch.int64)})
    assert declared_bytes(ints, parse_codec("fp16")) == 8000  # integers travel raw


@st.composite
def messages(draw: st.DrawFn) -> Message:
    dtypes = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8,
              torch.uint8, torch.int16, torch.int32, torch.int64, torch.bool]
    names = st.text(min_size=0, max_size=12)
    tensors = {}
    for name in draw(st.lists(names, max_size=5, unique=True)):
        shape = tuple(draw(st.lists(st.integers(0, 4), max_size=4)))
        dt = draw(st.sampled_from(dtypes))
        seed = draw(st.integers(0, 2**31))
        g = torch_gen(seed, "t")
        if dt == torch.bool:
            t = torch.rand(shape, generator=g) > 0.5
        elif dt.is_floating_point:
            t = (torch.randn(shape, generator=g) * 100).to(dt)
        else:
            t = torch.randint(0, 100, shape, generator=g).to(dt)
        tensors[name] = t
    # keys outside META_SCHEMA (whose values have rules of their own), finite numbers
    meta = draw(st.dictionaries(names.filter(lambda k: k not in META_SCHEMA), st.one_of(
        st.none(), st.booleans(), st.integers(-2**63, 2**63 - 1),
        st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=8)), max_size=4))
    declared = {n: DeclaredTensor(tuple(draw(st.lists(st.integers(0, 10**6), max_size=3))),
                                  draw(st.sampled_from(dtypes)))
                for n in draw(st.lists(names, max_size=2, unique=True))}
    return Message(draw(st.text(max_size=10)), tensors, meta, declared)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(messages())
def test_roundtrip_property(msg: Message) -> None:
    data, got = roundtrip(msg)
    assert got.kind == msg.kind and got.meta == msg.meta and got.declared == msg.declared
    assert list(got.tensors) == list(msg.tensors)
    for k, t in msg.tensors.items():
        want = t.float() if t.is_floating_point() else t
        assert got.tensors[k].dtype == want.dtype and got.tensors[k].shape == want.shape
        assert torch.equal(got.tensors[k], want)
    assert len(data) - header_size(data) == sum(
        t.numel() * (4 if t.is_floating_point() else t.element_size()) for t in msg.tensors.values())


# ----------------------------------------------------------------------------- malformed input


def small_message() -> bytes:
    msg = Message("weights", {"fc.weight": torch.randn(3, 4), "fc.bias": torch.randn(3),
                              "steps": torch.tensor([5, 6])}, {"num_examples": 12},
                  {"J": DeclaredTensor((2, 3))})
    return encode_message(msg, parse_codec("topk(0.5)+int8"), torch_gen(0, "m"))


def test_every_truncation_raises_wire_error() -> None:
    data = small_message()
    decode_message(data)
    for n in range(len(data)):
        with pytest.raises(WireError):
            decode_message(data[:n])


def test_bad_magic_version_and_trailing_garbage() -> None:
    data = small_message()
    with pytest.raises(WireError, match="bad magic at offset 0"):
        decode_message(b"XBW1" + data[4:])
    with pytest.raises(WireError, match="version"):
        decode_message(data[:4] + b"\x09" + data[5:])
    with pytest.raises(WireError, match="trailing garbage"):
        decode_message(data + b"\x00")
    with pytest.raises(WireError):
        decode_message(b"")
    with pytest.raises(WireError):
        decode_message("not bytes")  # type: ignore[arg-type]


def _header_fields(kind: str, spec: str, meta: bytes = b"{}") -> bytes:
    def s(x: bytes) -> bytes:
        return struct.pack("<H", len(x)) + x
    return MAGIC + b"\x01" + s(kind.encode()) + s(spec.encode()) + struct.pack("<I", len(meta)) + meta


def test_specific_header_errors_name_what_and_where() -> None:
    # unknown codec
    with pytest.raises(WireError, match="unknown codec at offset 8"):
        decode_message(_header_fields("w", "zip9") + struct.pack("<II", 0, 0))
    # bad UTF-8 in the kind
    with pytest.raises(WireError, match="UTF-8 at offset 7"):
        decode_message(MAGIC + b"\x01" + b"\x02\x00\xff\xfe")
    # meta not JSON / not an object
    with pytest.raises(WireError, match="meta at offset"):
        decode_message(_header_fields("w", "fp32", b"{nope") + struct.pack("<II", 0, 0))
    with pytest.raises(WireError, match="not a JSON object"):
        decode_message(_header_fields("w", "fp32", b"[1]") + struct.pack("<II", 0, 0))
    # unknown dtype code 99 for a raw leaf
    body = struct.pack("<I", 1) + b"\x01\x00t" + struct.pack("<BH", 0, 1) + b"\x00\x00"
    with pytest.raises(WireError, match="unknown dtype code 99"):
        decode_message(_header_fields("w", "fp32") + body + bytes([99, 0]))
    # a valid raw int64 scalar, then buffer size mismatches
    good = _header_fields("w", "fp32") + body + bytes([DTYPE_CODES[torch.int64], 0]) \
        + struct.pack("<I", 0)
    assert decode_message(good + struct.pack("<q", 7)).tensors["t"].item() == 7
    with pytest.raises(WireError, match="promises 8 buffer bytes, only 4 left"):
        decode_message(good + b"\x00" * 4)
    with pytest.raises(WireError, match="4 bytes of trailing garbage"):
        decode_message(good + b"\x00" * 12)


def test_codec_part_mismatch_is_wire_error() -> None:
    data = bytearray(small_message())
    i = data.index(b"idx")
    data[i:i + 3] = b"idy"
    with pytest.raises(WireError, match=r"tensor 'fc.weight' at offset \d+: leaves do not match "
                                        r"codec topk\(0.5\)\+int8: .*got \['_shape', 'idy'"):
        decode_message(bytes(data))


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_random_corruption_never_escapes_as_another_exception(data: st.DataObject) -> None:
    raw = bytearray(small_message())
    for _ in range(data.draw(st.integers(1, 3))):
        i = data.draw(st.integers(0, len(raw) - 1))
        raw[i] = data.draw(st.integers(0, 255))
    try:
        decode_message(bytes(raw))
    except WireError as e:
        assert "\n" not in str(e)


def test_encode_rejects_bad_meta_and_non_tensors() -> None:
    with pytest.raises(WireError, match="meta"):
        encode_message(Message("w", meta={"x": [1, 2]}), FP32, torch_gen(0))  # type: ignore[dict-item]
    with pytest.raises(WireError, match="not a torch.Tensor"):
        encode_message(Message("w", {"x": [1.0]}), FP32, torch_gen(0))  # type: ignore[dict-item]


def test_encode_fast_enough_for_a_big_model() -> None:
    import time

    sd = {f"l{i}": torch.randn(1000, 1000) for i in range(4)}  # 4M params, 16 MB
    t0 = time.process_time()  # CPU time, not wall: the same on a loaded machine
    data = encode_message(Message("weights", sd), FP32, torch_gen(0))
    got = decode_message(data)
    assert time.process_time() - t0 < 2.0
    assert len(data) - header_size(data) == 16_000_000 and math.isclose(
        float(got.tensors["l3"].sum()), float(sd["l3"].sum()), rel_tol=1e-6)


def test_parameters_views_and_independent_copies() -> None:
    w = torch.nn.Parameter(torch.randn(4, 6))
    view = torch.randn(6, 4).t()  # non-contiguous
    data, got = roundtrip(Message("weights", {"w": w, "v": view}))
    assert torch.equal(got.tensors["w"], w.detach()) and torch.equal(got.tensors["v"], view)
    assert not got.tensors["w"].requires_grad
    got.tensors["w"].add_(1.0)  # decoded tensors own their memory
    assert torch.equal(decode_message(data).tensors["w"], w.detach())
