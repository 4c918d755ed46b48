"""SecAgg+ with real arithmetic: the server's sum equals the plain sum of the quantised
inputs; masks do not cancel for any strict subset; dropout recovery; every protocol
message encoded, counted, and of the size the formulas give."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from lowband.comm.ledger import Ledger
from lowband.comm.message import SERVER, Message
from lowband.comm.network import CodecConfig, Network
from lowband.comm.wire import encode_message, header_size
from lowband.comm.codecs import parse_codec
from lowband.privacy import secagg as sa
from lowband.privacy.secagg import SecAggAbort, SecAggParams, run_secagg

BITS = 32


def inputs(n: int, length: int, seed: int = 0, first: int = 0) -> dict[int, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {first + u: rng.integers(0, 2**BITS, size=length, dtype=np.uint64) for u in range(n)}


def plain_sum(xs: dict[int, np.ndarray], who) -> np.ndarray:
    tot = np.zeros_like(next(iter(xs.values())))
    for u in who:
        tot = (tot + xs[u]) & np.uint64(2**BITS - 1)
    return tot


class Wire:
    """The network as SecAgg's send: encode, count, decode; keeps what the server saw."""

    def __init__(self, lose: set[tuple[int, int, str]] = frozenset()) -> None:
        self.net = Network(CodecConfig(), Ledger(), seed=5)
        self.seen: list[tuple[int, int, Message, bytes]] = []
        self.lose = lose

    def __call__(self, msg: Message, src: int, dst: int, direction: str):
        data = self.net.encode(msg, src, dst, round=1, direction=direction)
        self.seen.append((src, dst, msg, data))
        if (src, dst, msg.kind) in self.lose:
            self.net.ledger.record(1, src, dst, direction, msg.kind, len(data))  # sent, then lost
            return None
        return self.net.deliver(data, src, dst, round=1, direction=direction)


@pytest.mark.parametrize("degree", [None, 4])
def test_sum_equals_the_plain_sum(degree) -> None:
    xs = inputs(9, 1000, first=3)
    res = run_secagg(xs, SecAggParams(degree=degree), seed=1, round=1, send=Wire())
    assert res.survivors == sorted(xs) and res.dropped == []
    np.testing.assert_array_equal(res.total, plain_sum(xs, xs))


def _pairwise_only(res_y: dict[int, np.ndarray], seed: int, n_len: int) -> dict[int, np.ndarray]:
    """The masked inputs with each client's self mask removed (as if every b were known)."""
    return {u: (y - sa.prg(sa.secret(seed, 1, u, "b"), n_len, BITS)) & np.uint64(2**BITS - 1)
            for u, y in res_y.items()}


@pytest.mark.parametrize("degree", [None, 2])
def test_masks_cancel_only_in_the_full_sum(degree) -> None:
    n, length = 7, 400
    xs = inputs(n, length)
    wire = Wire()
    run_secagg(xs, SecAggParams(degree=degree), seed=2, round=1, send=wire)
    ys = {src: sa.unpack(m.tensors["y"].numpy(), BITS, length) for src, _, m, _ in wire.seen
          if m.kind == "secagg_masked"}
    pair = _pairwise_only(ys, 2, length)
    full = plain_sum(pair, range(n))
    np.testing.assert_array_equal(full, plain_sum(xs, range(n)))  # pairwise masks cancel in the full sum
    for r in range(1, n):
        for sub in itertools.combinations(range(n), r):
            for view in (ys, pair):  # with and without the self masks
                resid = (plain_sum(view, sub) - plain_sum(xs, sub)) & np.uint64(2**BITS - 1)
                assert np.count_nonzero(resid == 0) <= 2, (sub, view is pair)  # ~uniform: P(0) = 2**-32


@pytest.mark.parametrize("phase", ["advertise", "shares", "masked", "unmask"])
def test_dropout_recovery(phase) -> None:
    xs = inputs(10, 500, seed=4)
    drop = {phase: {2, 7}}
    res = run_secagg(xs, SecAggParams(degree=6), seed=3, round=1, send=Wire(), drop=drop)
    survivors = [u for u in xs if phase == "unmask" or u not in (2, 7)]
    assert res.survivors == survivors
    np.testing.assert_array_equal(res.total, plain_sum(xs, survivors))
    if phase == "masked":
        assert res.counters["secagg/recovered"] == 2


def test_a_lost_message_is_a_dropout_and_too_many_abort() -> None:
    xs = inputs(8, 100, seed=6)
    wire = Wire(lose={(5, SERVER, "secagg_masked")})
    res = run_secagg(xs, SecAggParams(), seed=3, round=1, send=wire)
    assert 5 in res.dropped
    np.testing.assert_array_equal(res.total, plain_sum(xs, [u for u in xs if u != 5]))
    with pytest.raises(SecAggAbort):
        run_secagg(xs, SecAggParams(degree=4), seed=3, round=1, send=Wire(), drop={"masked": {0, 1, 2, 3, 4, 5}})
    # a neighbourhood that cannot provide t shares of a dropped client's key aborts
    with pytest.raises(SecAggAbort, match="shares"):
        run_secagg(xs, SecAggParams(degree=2), seed=3, round=1, send=Wire(),
                   drop={"masked": {1}, "unmask": set(range(8)) - {1}})


def test_a_client_never_reveals_both_shares_of_one_neighbour() -> None:
    c = sa._Client(0, np.zeros(3, dtype=np.uint64), SecAggParams(), 1, 1)
    with pytest.raises(SecAggAbort, match="both"):
        c.unmask(Message("secagg_unmask", {"alive": torch.tensor([1], dtype=torch.int32),
                                           "dropped": torch.tensor([1], dtype=torch.int32)}))


def test_shamir_and_key_agreement() -> None:
    sh = sa.shamir_share(123456789, range(1, 8), 4, b"x")
    assert sa.shamir_reconstruct({x: sh[x] for x in (2, 5, 6, 7)}, 4) == 123456789
    assert sa.shamir_reconstruct({x: sh[x] for x in (1, 3, 4)}, 3) != 123456789  # t-1 shares say nothing
    a, b = sa.secret(1, 1, 0, "s"), sa.secret(1, 1, 1, "s")
    assert sa.agree(a, sa.public(b)) == sa.agree(b, sa.public(a))
    v = np.random.default_rng(0).integers(0, 2**20, 37, dtype=np.uint64)
    packed = sa.pack(v, 20)
    assert packed.size == (37 * 20 + 7) // 8
    np.testing.assert_array_equal(sa.unpack(packed, 20, 37), v)


@pytest.mark.parametrize("degree,drop", [(None, {}), (4, {"masked": {3}}), (4, {"shares": {1}})])
def test_every_message_is_counted_at_the_formula_size(degree, drop) -> None:
    n, length, bits = 12, 1001, 20
    xs = {u: v & np.uint64(2**bits - 1) for u, v in inputs(n, length, seed=7).items()}
    wire = Wire()
    params = SecAggParams(modulus_bits=bits, degree=degree)
    run_secagg(xs, params, seed=8, round=1, send=wire, drop=drop)
    k = params.k_for(n)
    total_by_kind: dict[str, int] = {}
    for src, dst, msg, data in wire.seen:
        kind = msg.kind
        t = msg.tensors
        if kind == "secagg_unmask" and src == SERVER:
            want = sa.payload_bytes("secagg_unmask_request", count=len(t["alive"]) + len(t["dropped"]))
            assert len(t["alive"]) + len(t["dropped"]) <= k
        elif kind in ("secagg_keys", "secagg_shares", "secagg_unmask"):
            want = sa.payload_bytes(kind, count=len(t["ids"]))
            assert len(t["ids"]) <= k
        else:
            want = sa.payload_bytes(kind, length=length, modulus_bits=bits)
        assert len(data) - header_size(data) == want, kind
        total_by_kind[kind] = total_by_kind.get(kind, 0) + len(data)
    ledger = wire.net.ledger
    for kind, nbytes in total_by_kind.items():
        assert ledger.by_kind()[kind]["encoded"] == nbytes
    # the masked input is ceil(l * bits / 8) bytes of buffer: 1001 x 20 bits
    assert sa.payload_bytes("secagg_masked", length=length, modulus_bits=bits) == 2503
    # without drops and with the complete graph, each client's messages carry exactly n - 1 entries
    if not drop and degree is None:
        shares_up = [m for s, d, m, _ in wire.seen if m.kind == "secagg_shares" and d == SERVER]
        assert all(len(m.tensors["ids"]) == n - 1 for m in shares_up) and len(shares_up) == n


def test_quantisation_roundtrip_and_room() -> None:
    g = torch.Generator().manual_seed(0)
    xs = [torch.randn(20000, generator=g) for _ in range(5)]
    qs = [sa.quantise(x, 8.0, 22, torch.Generator().manual_seed(i)) for i, x in enumerate(xs)]
    tot = np.zeros(20000, dtype=np.uint64)
    for q in qs:
        tot += q
    got = sa.dequantise_sum(tot, 5, 8.0, 22)
    want = sum(xs)
    step = 16.0 / (2**22 - 1)
    assert (got - want).abs().max().item() <= 5 * step + 1e-4
    assert abs((got - want).mean().item()) < step  # unbiased rounding
    sa.check_room(1024, 22, 32)
    with pytest.raises(ValueError, match="overflow"):
        sa.check_room(1025, 22, 32)


def test_key_agreement_is_x25519_with_hkdf_and_the_cipher_aes_gcm() -> None:
    """RFC 7748, section 6.1: Alice's and Bob's X25519 keys; the agreed seed is HKDF-SHA256 of
    the shared secret (so the mask seed and the cipher key differ); a tampered share fails."""
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import x25519
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF

    le = lambda h: int.from_bytes(bytes.fromhex(h), "little")  # noqa: E731
    a = le("77076d0a7318a57d3c16c17251b26645df4c2f87ebc0992ab177fba51db92c2a")
    b = le("5dab087e624a8a4b79e17f8b83800ee66f3bb1292618b6fd1c2f8b27ff88e0eb")
    assert sa.public(a) == le("8520f0098930a754748b7ddcb43ef75a0dbf3a0d26381af4eba4a98eaa9b4e6a")
    assert sa.public(b) == le("de9edb7d7b7dc1b4d35b61c2ece435373f8343c85b78674dadfc7e146f882b4f")
    shared = x25519.X25519PrivateKey.from_private_bytes(sa.to_bytes(a)).exchange(
        x25519.X25519PublicKey.from_public_bytes(sa.to_bytes(sa.public(b))))
    want = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=b"lowband-secagg/mask").derive(shared)
    assert sa.agree(a, sa.public(b)) == sa.agree(b, sa.public(a)) == sa.from_bytes(want)
    assert sa.agree(a, sa.public(b), "enc") != sa.agree(a, sa.public(b))
    # addressed keys: the same (seed, round, node, purpose) gives the same key, another node another
    assert sa.public(sa.secret(5, 2, 3, "s_sk")) == sa.public(sa.secret(5, 2, 3, "s_sk")) != \
        sa.public(sa.secret(5, 2, 4, "s_sk"))
    key = sa.agree(a, sa.public(b), "enc")
    blob = sa.encrypt(key, b"\x01" * sa.NONCE_BYTES, b"p" * sa.PLAINTEXT_BYTES)
    assert len(blob) == sa.CIPHERTEXT_BYTES and sa.decrypt(key, blob) == b"p" * sa.PLAINTEXT_BYTES
    with pytest.raises(SecAggAbort, match="authentication"):
        sa.decrypt(key, blob[:-1] + bytes([blob[-1] ^ 1]))
