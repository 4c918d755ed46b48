"""Codecs: error bounds, unbiasedness, exact sizes, chains and spec parsing."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lowband.comm import (
    CODECS,
    Codec,
    bf16,
    chain,
    fp16,
    fp32,
    int8,
    parse_codec,
    randmask,
    sketch,
    topk,
)
from lowband.comm.codecs import (
    MAX_CHAIN,
    MAX_NDIM,
    MAX_SKETCH_COLS,
    MAX_SKETCH_ROWS,
    MAX_SPEC_CHARS,
    ShapeLimitError,
    Sketch,
)
from lowband.seeding import torch_gen

ALL_SPECS = ["fp32", "fp16", "bf16", "int8", "topk(0.1)", "topk(7)", "randmask(0.25)",
             "randmask(0.25,scale=true)", "sketch(3,16)", "topk(0.2)+fp16", "topk(0.2)+int8",
             "randmask(0.5)+bf16", "fp16+int8", "sketch(5,40)+fp16", "randmask(0.5)+topk(0.5)+int8",
             # issue 17: bit-level quantisers and codecs with sender state (their plain
             # encode is the stateless first message; tests/test_codecs_stateful.py has the rest)
             "qsgd(4)", "qsgd(1,bucket=7)", "sign", "ef(topk(0.1))", "ef(topk(0.2)+int8)", "ef(sign)+fp16",
             "powersgd(2)", "powersgd(1)+fp16", "ef21(topk(0.1))", "ef21(sign+fp16)"]


def rt(codec: Codec, x: torch.Tensor, seed: int = 0) -> torch.Tensor:
    return codec.decode(codec.encode(x, torch_gen(seed, "codec-test")))


def randn(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(shape, generator=torch_gen(seed, "x"))


@pytest.mark.parametrize("spec", ALL_SPECS)
def test_parse_spec_roundtrip_and_shape(spec: str) -> None:
    c = parse_codec(spec)
    assert c.spec == spec and parse_codec(c.spec).spec == spec
    x = randn(6, 5)
    y = rt(c, x)
    assert y.shape == x.shape and y.dtype == torch.float32


@settings(max_examples=60, deadline=None)
@given(spec=st.sampled_from(ALL_SPECS), shape=st.lists(st.integers(0, 9), max_size=3),
       seed=st.integers(0, 1000))
def test_size_of_and_leaves_are_exact(spec: str, shape: list[int], seed: int) -> None:
    c = parse_codec(spec)
    x = torch.randn(shape, generator=torch_gen(seed))
    parts = c.encode(x, torch_gen(seed, "enc"))
    leaves = c.leaves(tuple(shape))
    assert set(parts) == set(leaves)
    for name, (s, dt) in leaves.items():
        assert tuple(parts[name].shape) == s and parts[name].dtype == dt, name
    assert c.size_of(tuple(shape)) == sum(p.numel() * p.element_size() for p in parts.values())
    assert c.decode(parts).shape == x.shape


def test_fp32_identity_and_half_precision_error_bounds() -> None:
    x = randn(1000) * 10
    assert torch.equal(rt(fp32(), x), x)
    for codec, eps in ((fp16(), 2.0**-11), (bf16(), 2.0**-8)):
        err = (rt(codec, x) - x).abs()
        assert bool((err <= eps * x.abs() + 1e-7).all()), codec.spec
    assert fp16().size_of((10, 10)) == 200 and bf16().size_of((10,)) == 20


def test_int8_error_bound_and_stochastic_rounding() -> None:
    x = randn(50, 20)
    scale = float(x.abs().max()) / 127
    parts = int8().encode(x, torch_gen(0))
    assert parts["q"].dtype == torch.int8 and math.isclose(float(parts["_scale"]), scale,
                                                           rel_tol=1e-6)
    for seed in range(5):
        err = (rt(int8(), x, seed) - x).abs()
        assert float(err.max()) <= scale * (1 + 1e-5)
    # different seeds round differently, the same seed identically
    assert not torch.equal(rt(int8(), x, 1), rt(int8(), x, 2))
    assert torch.equal(rt(int8(), x, 3), rt(int8(), x, 3))
    assert int8().size_of((50, 20)) == 1000 + 4


def test_int8_is_unbiased() -> None:
    x = randn(64, seed=3)
    scale = float(x.abs().max()) / 127
    n = 3000
    mean = sum(rt(int8(), x, s) for s in range(n)) / n
    # per-element std of one draw <= scale/2, so the mean's std <= scale / (2 sqrt(n))
    assert float((mean - x).abs().max()) < 5 * scale / (2 * math.sqrt(n))


def test_int8_edge_cases() -> None:
    assert torch.equal(rt(int8(), torch.zeros(4, 3)), torch.zeros(4, 3))
    assert rt(int8(), torch.zeros(0)).shape == (0,)
    with pytest.raises(ValueError, match="non-finite"):
        int8().encode(torch.tensor([1.0, float("nan")]), torch_gen(0))
    with pytest.raises(TypeError, match="floating-point"):
        int8().encode(torch.arange(3), torch_gen(0))


def test_topk_keeps_exactly_the_largest_magnitudes() -> None:
    x = randn(40, 25)  # distinct magnitudes almost surely
    for codec, k in ((topk(0.01), 10), (topk(0.1), 100), (topk(37), 37), (topk(10**6), 1000)):
        y = rt(codec, x)
        kept = y != 0
        assert int(kept.sum()) == k
        assert torch.equal(y[kept], x[kept])
        if k < x.numel():
            assert float(x[kept].abs().min()) > float(x[~kept].abs().max())
        assert torch.equal(x.abs().flatten().sort(descending=True).values[:k].sort().values,
                           y[kept].abs().sort().values)
        assert codec.size_of(tuple(x.shape)) == k * (4 + 4) + 2 * 8
    parts = topk(0.1).encode(x, torch_gen(0))
    assert parts["idx"].dtype == torch.int32 and bool((parts["idx"].diff() > 0).all())


def test_topk_fraction_rounds_up_and_validates() -> None:
    assert topk(0.01).k_for(150) == 2 and topk(0.5).k_for(1) == 1 and topk(0.5).k_for(0) == 0
    for bad in (0, -3, 0.0, 1.5, True):
        with pytest.raises(ValueError):
            topk(bad)


def test_chain_composes_and_names_leaves() -> None:
    x = randn(30, 10)
    c = chain(topk(0.1), fp16())
    assert c.spec == "topk(0.1)+fp16"
    parts = c.encode(x, torch_gen(0))
    assert set(parts) == {"idx", "val", "_shape"} and parts["val"].dtype == torch.float16
    y = c.decode(parts)
    assert torch.equal(y, rt(topk(0.1), x).half().float())
    c8 = parse_codec("topk(0.1)+int8")
    assert set(c8.encode(x, torch_gen(0))) == {"idx", "val/q", "val/_scale", "_shape"}
    assert c8.size_of((30, 10)) == 30 * 4 + 30 + 4 + 16
    # nested chains flatten; chain of one is the codec itself
    assert chain(chain(topk(0.1), int8()), fp16()).spec == "topk(0.1)+int8+fp16"
    assert chain(fp16()).spec == "fp16"
    # aux parts are not re-encoded: int8's scale stays float32 under a trailing fp16
    p = parse_codec("int8+fp16").encode(x, torch_gen(0))
    assert p["_scale"].dtype == torch.float32 and p["q"].dtype == torch.int8


def test_randmask_selects_seeded_coordinates() -> None:
    x = randn(1000) + 5.0  # no zeros
    c = randmask(0.1)
    parts = c.encode(x, torch_gen(0))
    assert set(parts) == {"val", "_seed", "_shape"} and parts["val"].numel() == 100
    y = c.decode(parts)
    kept = y != 0
    assert int(kept.sum()) == 100 and torch.equal(y[kept], x[kept])
    # the receiver regenerates the indices from the seed alone: same seed, same mask
    assert torch.equal(rt(c, x, 4) != 0, rt(c, x, 4) != 0)
    assert not torch.equal(rt(c, x, 4) != 0, rt(c, x, 5) != 0)
    ys = rt(randmask(0.1, scale=True), x)
    assert torch.allclose(ys[ys != 0], 10 * x[ys != 0])
    assert c.size_of((1000,)) == 100 * 4 + 8 + 8


def test_randmask_scaled_is_unbiased() -> None:
    x = randn(50, seed=1)
    n = 2000
    mean = sum(rt(randmask(0.2, scale=True), x, s) for s in range(n)) / n
    # one draw: 5 x_i w.p. 0.2, else 0 -> std = 2 |x_i|
    assert bool(((mean - x).abs() <= 5 * 2 * x.abs() / math.sqrt(n) + 1e-6).all())


def test_sketch_exact_on_sparse_vectors() -> None:
    failures = 0
    for seed in range(20):
        g = torch_gen(seed, "sparse")
        x = torch.zeros(20_000)
        idx = torch.randperm(20_000, generator=g)[:10]
        x[idx] = torch.randn(10, generator=g) * 3
        y = rt(sketch(5, 2000), x, seed)
        failures += not torch.allclose(y, x, atol=1e-5)
    assert failures <= 1  # a collision in 3 of 5 rows is very unlikely (support << cols)


def test_sketch_recovers_heavy_hitters_of_dense_vectors() -> None:
    x = randn(5000, seed=2) * 0.01
    x[:5] = torch.tensor([10.0, -8.0, 6.0, 5.0, -4.0])
    y = rt(sketch(7, 500), x, 0)
    assert torch.allclose(y[:5], x[:5], atol=0.05)
    assert float((y - x).abs().median()) < 0.05
    assert sketch(5, 2000).size_of((100, 100)) == 5 * 2000 * 4 + 8 + 16


def test_codecs_are_deterministic_given_the_generator() -> None:
    x = randn(20, 20)
    for spec in ALL_SPECS:
        c = parse_codec(spec)
        a, b = c.encode(x, torch_gen(9, "d")), c.encode(x, torch_gen(9, "d"))
        assert all(torch.equal(a[k], b[k]) for k in a), spec


@pytest.mark.parametrize("bad", ["", "zip", "topk", "topk(", "topk(2.0)", "topk(0)",
                                 "sketch(5)", "randmask(0.1,bogus=1)", "fp16+", "int8(3)",
                                 "topk(abc)"])
def test_parse_errors_are_one_line_and_list_known_codecs(bad: str) -> None:
    with pytest.raises(ValueError) as e:
        parse_codec(bad)
    msg = str(e.value)
    assert "\n" not in msg
    assert "known codecs" in msg or "topk" in msg or "sketch" in msg or "randmask" in msg


def test_registry_lists_every_codec() -> None:
    names = {k.split("(")[0] for k in CODECS}
    assert {"fp32", "fp16", "bf16", "int8", "topk", "randmask", "sketch", "qsgd", "sign", "ef", "ef21", "powersgd"} <= names


# ----------------------------------------------------------------------------- hostile input (issue 14)


def _specs(parts: dict[str, torch.Tensor]) -> dict:
    return {k: (tuple(v.shape), v.dtype) for k, v in parts.items()}


@pytest.mark.parametrize("spec", ALL_SPECS + ["topk(20)+sketch(2,8)", "fp16+topk(0.3)"])
def test_check_leaves_recovers_the_shape_and_refuses_any_other_structure(spec: str) -> None:
    c = parse_codec(spec)
    for shape in ((6, 5), (0,), (3, 0, 2), ()):
        parts = c.encode(torch.randn(shape, generator=torch_gen(0)), torch_gen(1))
        assert c.check_leaves(_specs(parts), lambda p: parts[p].tolist()) == shape, shape
    parts = c.encode(randn(6, 5), torch_gen(1))
    read = lambda p: parts[p].tolist()  # noqa: E731
    with pytest.raises(ShapeLimitError, match="more than the 29 allowed"):
        c.check_leaves(_specs(parts), read, 29)
    # the limit also holds each tensor rebuilt on the way (a sketch table can exceed the input)
    need = max([30] + [math.prod(s) for s, _ in _specs(parts).values()])
    assert c.check_leaves(_specs(parts), read, need) == (6, 5)
    for name in parts:  # each part with the wrong dtype, another shape, missing, or renamed
        bad = _specs(parts)
        shape, dt = bad[name]
        bad[name] = (shape, torch.float64 if dt != torch.float64 else torch.float32)
        with pytest.raises(ValueError):
            c.check_leaves(bad, read)
        for other in {(*shape, 1), (2, *shape), (7,)} - {shape}:
            bad = _specs(parts)
            bad[name] = (other, dt)
            try:  # another shape passes only if it is exactly what some original shape gives
                got = c.check_leaves(bad, read)
            except ValueError:
                continue
            assert c.leaves(got) == bad, (name, other)
        bad = _specs(parts)
        del bad[name]
        with pytest.raises(ValueError):
            c.check_leaves(bad, read)
        bad = _specs(parts)
        bad[name + "x"] = bad.pop(name)
        with pytest.raises(ValueError):
            c.check_leaves(bad, read)


def test_check_leaves_reads_the_claimed_shape_before_comparing() -> None:
    c = parse_codec("topk(1)")  # one value whatever the size: only the budget can stop it
    parts = c.encode(randn(8), torch_gen(0))
    specs = _specs(parts)
    with pytest.raises(ShapeLimitError, match=r"\(32768, 32768\) has 1073741824 elements"):
        c.check_leaves(specs, lambda p: [2**15, 2**15], 2**26)
    for bad in ([-1], [2**31], [2**16, 2**16], [1] * (MAX_NDIM + 1)):
        with pytest.raises(ValueError, match="invalid original shape|at most 32 entries"):
            c.check_leaves({**specs, "_shape": ((len(bad),), torch.int64)}, lambda p, b=bad: b)


def test_codec_parameters_are_bounded() -> None:
    for bad in ("sketch(9,4)", "sketch(0,4)", "sketch(2,16777217)", "topk(2147483648)",
                "+".join(["fp16"] * (MAX_CHAIN + 1)), "fp16+" * 100 + "fp16", "x" * (MAX_SPEC_CHARS + 1)):
        with pytest.raises(ValueError) as e:
            parse_codec(bad)
        assert "\n" not in str(e.value)
    assert parse_codec(f"sketch({MAX_SKETCH_ROWS},{MAX_SKETCH_COLS})").rows == MAX_SKETCH_ROWS
    assert parse_codec("+".join(["fp16"] * MAX_CHAIN)).spec.count("fp16") == MAX_CHAIN


def _sketch_decode_reference(c: Sketch, parts: dict[str, torch.Tensor]) -> torch.Tensor:
    """The original row-by-row decode, kept to check the vectorised one bit for bit."""
    table, shape = parts["table"], tuple(parts["_shape"].tolist())
    coeffs = c._coeffs(int(parts["_seed"]))
    n = math.prod(shape)
    i = torch.arange(n, dtype=torch.int64)
    est = torch.empty(c.rows, n, dtype=torch.float32)
    for r in range(c.rows):
        h, s = c._hash(coeffs, r, i)
        est[r] = s * table[r][h]
    srt = torch.sort(est, dim=0).values
    return (0.5 * (srt[(c.rows - 1) // 2] + srt[c.rows // 2])).reshape(shape)


@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 8])
def test_sketch_decode_is_bitwise_the_row_by_row_median(rows: int) -> None:
    c = sketch(rows, 37)
    x = randn(123, 45, seed=rows)  # several decode chunks for every row count
    parts = c.encode(x, torch_gen(rows, "sk"))
    parts["table"][0, 3] = float("nan")
    parts["table"][-1, 5] = float("inf")
    got, want = c.decode(parts), _sketch_decode_reference(c, parts)
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))


def test_randmask_mask_selects_the_sorted_seeded_permutation() -> None:
    """The boolean mask (int32 permutation, no sort) keeps the coordinates that the former
    int64 ``sort(randperm(n)[:k])`` kept, in the same order."""
    for n, frac, seed in ((1000, 0.1, 3), (4097, 0.5, 2**61 + 5), (10, 1.0, 0), (1, 0.3, 7)):
        c = randmask(frac)
        k = c.k_for(n)
        g = torch.Generator()
        g.manual_seed(seed)
        want = torch.arange(n) if k == n else torch.sort(torch.randperm(n, generator=g)[:k]).values
        assert torch.equal(torch.nonzero(c._mask(seed, n)).reshape(-1), want)


def test_decode_checks_contents() -> None:
    x = randn(50)
    p = topk(5).encode(x, torch_gen(0))
    p["idx"] = p["idx"].flip(0)
    with pytest.raises(ValueError, match="strictly increasing"):
        topk(5).decode(p)
    p = int8().encode(x, torch_gen(0))
    p["_scale"] = torch.tensor(float("nan"))
    with pytest.raises(ValueError, match="_scale must be finite"):
        int8().decode(p)
    for c in (randmask(0.2), sketch(3, 8)):
        p = c.encode(x, torch_gen(0))
        p["_seed"] = torch.tensor(-1)
        with pytest.raises(ValueError, match="_seed must be one int64"):
            c.decode(p)
