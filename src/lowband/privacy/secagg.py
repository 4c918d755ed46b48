"""SecAgg+ (Bell, Bonawitz, Gascon, Lepoint and Raykova, "Secure Single-Server Aggregation
with (Poly)Logarithmic Overhead", CCS 2020), simulated with real arithmetic and with every
protocol message encoded by the wire format and counted.

The semi-honest protocol is Bonawitz et al.'s (CCS 2017) four message rounds, run on a
``k``-regular communication graph instead of the complete graph (Bell et al.'s change,
which makes a client's cost logarithmic in the cohort):

0. **advertise** (client -> server, kind ``secagg_advertise``): two public keys, ``c_pk``
   (to encrypt shares) and ``s_pk`` (to agree pairwise mask seeds). The server sends each
   client its neighbours' keys (``secagg_keys``, with their ids).
1. **shares** (``secagg_shares``): client ``u`` draws its self-mask seed ``b_u``, splits
   ``b_u`` and its mask key ``s_sk`` into ``t``-out-of-``k`` Shamir shares, and sends each
   neighbour ``v`` one authenticated ciphertext of ``(u, v, share of s_sk, share of b_u)``
   under the key agreed from ``c_sk_u`` and ``c_pk_v``, through the server, which forwards
   each client the ciphertexts addressed to it.
2. **masked input** (``secagg_masked``): ``y_u = x_u + PRG(b_u) + sum_v +-PRG(s_uv) mod R``
   over the neighbours ``v`` that sent shares (``+`` if ``u < v``), ``s_uv`` agreed from
   ``s_sk_u`` and ``s_pk_v``; ``x_u`` is a vector of integers mod ``R = 2**modulus_bits``,
   packed at ``modulus_bits`` bits a coordinate.
3. **unmasking** (``secagg_unmask``): the server tells each survivor which of its
   neighbours survived and which dropped; each survivor answers with its share of ``b_v``
   for a surviving neighbour and of ``s_sk_v`` for a dropped one (never both for one
   ``v``). With ``t`` shares the server rebuilds every survivor's ``b`` and every dropped
   client's ``s_sk``, removes the self masks and the dropped clients' dangling pairwise
   masks, and learns only ``sum_{u in U3} x_u mod R``. Fewer than ``t`` shares for a
   needed secret aborts the round (:class:`SecAggAbort`): its traffic is still counted.

Arithmetic: key agreement is X25519 (RFC 7748, from the ``cryptography`` package: ``pip
install 'lowband[secagg]'``), 32-byte keys; each shared secret goes through HKDF-SHA256 with
a purpose label (``mask`` for the pairwise mask seeds, ``enc`` for the share cipher's key).
Shamir shares live in GF(p), ``p = 2**255 - 19`` (32 bytes; a private key is an element of
GF(p), so it is shared and rebuilt exactly). Ciphertexts are AES-256-GCM (12-byte nonce,
16-byte tag). Masks are a PCG64 stream, seeded by the agreed seed, reduced mod ``R`` (a
simulation's PRG: fast, not a cryptographic one). Private keys and self-mask seeds are
addressed by ``(seed, round, node, purpose)`` (design rule 4), so a run is reproducible;
the cryptography is real, the secrecy of the keys is not (anyone with the run seed has them).

Message sizes (payload bytes, :func:`payload_bytes`; the wire header adds names, dtypes and
shapes, and the ledger counts ``len(bytes)`` of the whole message). For a client ``u`` with
``k_u`` neighbours, ``a`` advertising neighbours, ``l`` coordinates:

- advertise: ``2 * 32``; keys (down): ``a * (4 + 64)``;
- shares (up, and down to each receiver): ``(4 + 100)`` per ciphertext, ``100 = 12 + (4 +
  4 + 32 + 32) + 16``;
- masked input: ``ceil(l * modulus_bits / 8)``;
- unmask request (down): ``4`` per neighbour id named; unmask reply: ``4 + 32`` per share.

So a client sends ``64 + 104 k + ceil(l log2 R / 8) + 36 k`` bytes and receives ``68 k +
104 k + 4 k``: ``O(k + l)``, Bell et al.'s per-client cost with ``k = O(log n)``, where
Bonawitz et al.'s complete graph has ``k = n - 1``.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from typing import Callable, Iterable, Optional

import numpy as np
import torch

from ..comm.message import SERVER, Message
from ..seeding import derive_seed

P = 2**255 - 19
"""Modulus of the Shamir field (X25519's base field: a private key fits in one element)."""
KEY_BYTES = 32
SHARE_BYTES = 32
ID_BYTES = 4
NONCE_BYTES = 12
TAG_BYTES = 16
PLAINTEXT_BYTES = 2 * ID_BYTES + 2 * SHARE_BYTES
CIPHERTEXT_BYTES = NONCE_BYTES + PLAINTEXT_BYTES + TAG_BYTES

KINDS = ("secagg_advertise", "secagg_keys", "secagg_shares", "secagg_masked", "secagg_unmask")
PHASES = ("advertise", "shares", "masked", "unmask")


class SecAggAbort(RuntimeError):
    """The server cannot finish the round (too few survivors or shares)."""


@dataclass(frozen=True)
class SecAggParams:
    """``modulus_bits``: R = 2**modulus_bits; ``degree``: neighbours per client (None: all
    others, Bonawitz et al. 2017); ``threshold``: shares needed (None: ``k // 2 + 1``)."""

    modulus_bits: int = 32
    degree: Optional[int] = None
    threshold: Optional[int] = None

    def __post_init__(self) -> None:
        if not 1 <= self.modulus_bits <= 62:
            raise ValueError(f"secagg.modulus_bits must be in 1..62, got {self.modulus_bits}")
        if self.degree is not None and (self.degree < 2 or self.degree % 2):
            raise ValueError(f"secagg.degree must be an even number >= 2 (a k-regular graph), got {self.degree}")
        if self.threshold is not None and self.threshold < 1:
            raise ValueError(f"secagg.threshold must be >= 1, got {self.threshold}")

    def k_for(self, n: int) -> int:
        return n - 1 if self.degree is None or self.degree >= n - 1 else self.degree

    def t_for(self, n: int) -> int:
        k = self.k_for(n)
        t = self.threshold if self.threshold is not None else k // 2 + 1
        if t > k:
            raise ValueError(f"secagg.threshold {t} exceeds the {k} neighbours a client has")
        return t


# --------------------------------------------------------------------------- primitives


def _h(*parts: object, size: int = 32) -> bytes:
    return hashlib.blake2b(repr(parts).encode(), digest_size=size).digest()


def secret(seed: int, round: int, node: int, purpose: str) -> int:
    """An addressed secret in [2, p - 2]."""
    return 2 + int.from_bytes(_h(derive_seed(seed, "secagg", round, node, purpose), purpose), "little") % (P - 4)


def _x25519():
    """cryptography's X25519, imported on use: SecAgg's optional extra."""
    try:
        from cryptography.hazmat.primitives.asymmetric import x25519
    except ImportError as e:  # pragma: no cover - exercised only without the extra
        raise ImportError("secure aggregation needs cryptography (X25519, AES-GCM): pip install 'lowband[secagg]' "
                          "(or pip install cryptography)") from e
    return x25519


def public(sk: int) -> int:
    """The X25519 public key (as an integer of its 32 little-endian bytes) of private key ``sk``."""
    x = _x25519()
    return from_bytes(x.X25519PrivateKey.from_private_bytes(to_bytes(sk)).public_key().public_bytes_raw())


def agree(sk: int, pk: int, purpose: str = "mask") -> int:
    """X25519 then HKDF-SHA256 (info ``lowband-secagg/<purpose>``), as an integer of 32 bytes:
    ``agree(a, public(b)) == agree(b, public(a))``."""
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF

    x = _x25519()
    shared = x.X25519PrivateKey.from_private_bytes(to_bytes(sk)).exchange(
        x.X25519PublicKey.from_public_bytes(to_bytes(pk)))
    key = HKDF(algorithm=hashes.SHA256(), length=32, salt=None,
               info=f"lowband-secagg/{purpose}".encode()).derive(shared)
    return from_bytes(key)


def to_bytes(v: int) -> bytes:
    return int(v).to_bytes(32, "little")


def from_bytes(b: bytes) -> int:
    return int.from_bytes(bytes(b), "little")


def shamir_share(secret_value: int, xs: Iterable[int], t: int, coeff_seed: bytes) -> dict[int, int]:
    """Shares ``f(x)`` of a degree ``t - 1`` polynomial with ``f(0) = secret`` over GF(p)."""
    coeffs = [secret_value % P] + [from_bytes(_h(coeff_seed, i)) % P for i in range(1, t)]
    out = {}
    for x in xs:
        acc = 0
        for c in reversed(coeffs):
            acc = (acc * x + c) % P
        out[int(x)] = acc
    return out


def shamir_reconstruct(shares: dict[int, int], t: int) -> int:
    """``f(0)`` from at least ``t`` shares ``{x: f(x)}`` (Lagrange interpolation)."""
    if len(shares) < t:
        raise SecAggAbort(f"{len(shares)} shares, {t} needed")
    pts = sorted(shares.items())[:t]
    total = 0
    for j, (xj, yj) in enumerate(pts):
        num, den = 1, 1
        for m, (xm, _) in enumerate(pts):
            if m != j:
                num = num * (-xm) % P
                den = den * (xj - xm) % P
        total = (total + yj * num * pow(den, P - 2, P)) % P
    return total


def encrypt(key: int, nonce: bytes, plaintext: bytes) -> bytes:
    """nonce || AES-256-GCM ciphertext || tag, under the 32-byte ``key``."""
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    return nonce + AESGCM(to_bytes(key)).encrypt(nonce, plaintext, None)


def decrypt(key: int, blob: bytes) -> bytes:
    """The plaintext of :func:`encrypt`'s ``blob``; :class:`SecAggAbort` when authentication fails."""
    from cryptography.exceptions import InvalidTag
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    try:
        return AESGCM(to_bytes(key)).decrypt(blob[:NONCE_BYTES], blob[NONCE_BYTES:], None)
    except InvalidTag:
        raise SecAggAbort("a share ciphertext failed authentication") from None


def prg(seed_value: int, length: int, modulus_bits: int) -> np.ndarray:
    """``length`` pseudo-random integers mod ``2**modulus_bits`` (uint64) from ``seed_value``."""
    bg = np.random.PCG64(np.random.SeedSequence(int(seed_value)))
    return bg.random_raw(length).astype(np.uint64) & np.uint64((1 << modulus_bits) - 1)


def pack(values: np.ndarray, bits: int) -> np.ndarray:
    """Little-endian bit packing of ``values`` (< 2**bits) into ``ceil(len * bits / 8)`` bytes."""
    v = np.asarray(values, dtype=np.uint64)
    b = ((v[:, None] >> np.arange(bits, dtype=np.uint64)) & np.uint64(1)).astype(np.uint8)
    return np.packbits(b.reshape(-1), bitorder="little")


def unpack(data: np.ndarray, bits: int, length: int) -> np.ndarray:
    b = np.unpackbits(np.asarray(data, dtype=np.uint8), bitorder="little")[: length * bits]
    if b.size != length * bits:
        raise SecAggAbort(f"masked input of {data.size} bytes; {math.ceil(length * bits / 8)} expected")
    w = (np.uint64(1) << np.arange(bits, dtype=np.uint64))
    return (b.reshape(length, bits).astype(np.uint64) * w).sum(axis=1, dtype=np.uint64)


def neighbours(cohort: list[int], params: SecAggParams, seed: int, round: int) -> dict[int, list[int]]:
    """The round's k-regular graph on the cohort: a Harary ring over an addressed random
    permutation (each client linked to the k/2 nearest on each side); complete when k = n - 1."""
    cohort = sorted(int(c) for c in cohort)
    n = len(cohort)
    k = params.k_for(n)
    if k >= n - 1:
        return {u: [v for v in cohort if v != u] for u in cohort}
    perm = np.random.default_rng(derive_seed(seed, "secagg", round, "graph")).permutation(n)
    ring = [cohort[i] for i in perm]
    out: dict[int, set[int]] = {u: set() for u in cohort}
    for i, u in enumerate(ring):
        for j in range(1, k // 2 + 1):
            v = ring[(i + j) % n]
            out[u].add(v)
            out[v].add(u)
    return {u: sorted(vs) for u, vs in out.items()}


def payload_bytes(kind: str, *, count: int = 0, length: int = 0, modulus_bits: int = 32) -> int:
    """Bytes of the buffers of one protocol message (the formulas of the module docstring):
    ``count`` keys/ciphertexts/ids/shares it carries, ``length`` coordinates."""
    if kind == "secagg_advertise":
        return 2 * KEY_BYTES
    if kind == "secagg_keys":
        return count * (ID_BYTES + 2 * KEY_BYTES)
    if kind == "secagg_shares":
        return count * (ID_BYTES + CIPHERTEXT_BYTES)
    if kind == "secagg_masked":
        return math.ceil(length * modulus_bits / 8)
    if kind == "secagg_unmask_request":
        return count * ID_BYTES
    if kind == "secagg_unmask":
        return count * (ID_BYTES + SHARE_BYTES)
    raise ValueError(f"unknown SecAgg message kind {kind!r}; known: {KINDS}")


# --------------------------------------------------------------------------- protocol

Send = Callable[[Message, int, int, str], Optional[Message]]
"""``send(msg, src, dst, direction) -> what dst receives`` (None: lost): the network."""


def _ids(xs: Iterable[int]) -> torch.Tensor:
    return torch.tensor(sorted(int(x) for x in xs), dtype=torch.int32)


def _u8(rows: list[bytes], width: int) -> torch.Tensor:
    if not rows:
        return torch.zeros((0, width), dtype=torch.uint8)
    return torch.from_numpy(np.frombuffer(b"".join(rows), dtype=np.uint8).reshape(len(rows), width).copy())


@dataclass
class SecAggResult:
    """What the server learns: the sum mod R of the survivors' inputs, and who they are."""

    total: np.ndarray
    survivors: list[int]
    dropped: list[int]
    counters: dict[str, float] = field(default_factory=dict)


class _Client:
    """One client's side; it sees only its own input, keys and inbox."""

    def __init__(self, u: int, x: np.ndarray, params: SecAggParams, seed: int, round: int) -> None:
        self.u, self.x, self.p, self.seed, self.round = u, x, params, seed, round
        self.c_sk = secret(seed, round, u, "c_sk")
        self.s_sk = secret(seed, round, u, "s_sk")
        self.b = secret(seed, round, u, "b")
        self.keys: dict[int, tuple[int, int]] = {}  # neighbour -> (c_pk, s_pk)
        self.held: dict[int, tuple[int, int]] = {}  # neighbour -> (share of its s_sk, share of its b)

    def advertise(self) -> Message:
        pk = [to_bytes(public(self.c_sk)), to_bytes(public(self.s_sk))]
        return Message("secagg_advertise", {"pk": _u8(pk, KEY_BYTES)})

    def take_keys(self, msg: Message) -> None:
        ids = msg.tensors["ids"].tolist()
        pk = msg.tensors["pk"].numpy()
        for i, v in enumerate(ids):
            self.keys[int(v)] = (from_bytes(pk[i, 0].tobytes()), from_bytes(pk[i, 1].tobytes()))

    def shares(self, t: int) -> Message:
        xs = [v + 1 for v in sorted(self.keys)]
        sk_sh = shamir_share(self.s_sk, xs, t, _h(self.seed, self.round, self.u, "poly_s"))
        b_sh = shamir_share(self.b, xs, t, _h(self.seed, self.round, self.u, "poly_b"))
        rows = []
        for v in sorted(self.keys):
            plain = (self.u.to_bytes(4, "little", signed=True) + v.to_bytes(4, "little", signed=True)
                     + to_bytes(sk_sh[v + 1]) + to_bytes(b_sh[v + 1]))
            nonce = _h(self.seed, self.round, self.u, v, "nonce", size=NONCE_BYTES)
            rows.append(encrypt(agree(self.c_sk, self.keys[v][0], "enc"), nonce, plain))
        return Message("secagg_shares", {"ids": _ids(self.keys), "ct": _u8(rows, CIPHERTEXT_BYTES)})

    def take_shares(self, msg: Message) -> None:
        for v, blob in zip(msg.tensors["ids"].tolist(), msg.tensors["ct"].numpy()):
            plain = decrypt(agree(self.c_sk, self.keys[int(v)][0], "enc"), blob.tobytes())
            src = int.from_bytes(plain[:4], "little", signed=True)
            dst = int.from_bytes(plain[4:8], "little", signed=True)
            if src != v or dst != self.u:
                raise SecAggAbort(f"client {self.u}: a share from {v} names {src}->{dst}")
            self.held[int(v)] = (from_bytes(plain[8:40]), from_bytes(plain[40:72]))

    def masked(self) -> Message:
        bits = self.p.modulus_bits
        mask = np.uint64((1 << bits) - 1)
        y = (self.x.astype(np.uint64) + prg(self.b, self.x.size, bits)) & mask
        for v in sorted(self.held):  # the neighbours that shared with u: they hold u's shares too
            m = prg(agree(self.s_sk, self.keys[v][1]), self.x.size, bits)
            y = (y + m) & mask if self.u < v else (y - m) & mask
        return Message("secagg_masked", {"y": torch.from_numpy(pack(y, bits))})

    def unmask(self, msg: Message) -> Message:
        alive = set(msg.tensors["alive"].tolist())
        gone = set(msg.tensors["dropped"].tolist())
        if alive & gone:
            raise SecAggAbort(f"client {self.u}: the server asked for both shares of {sorted(alive & gone)}")
        ids, rows = [], []
        for v in sorted(alive | gone):
            if v not in self.held:
                continue
            ids.append(v)
            rows.append(to_bytes(self.held[v][1] if v in alive else self.held[v][0]))
        return Message("secagg_unmask", {"ids": _ids(ids), "share": _u8(rows, SHARE_BYTES)})


def run_secagg(inputs: dict[int, np.ndarray], params: SecAggParams, *, seed: int, round: int, send: Send,
               drop: Optional[dict[str, set[int]]] = None) -> SecAggResult:
    """One SecAgg+ round over ``inputs`` (each a vector of integers mod ``2**modulus_bits``).

    ``drop[phase]``: clients that drop out before sending in ``phase`` (one of
    :data:`PHASES`) and stay out. Every message goes through ``send`` (encoded, counted,
    decoded); a message ``send`` loses (None) makes its sender a dropout of that phase.
    Raises :class:`SecAggAbort` when the sum cannot be recovered."""
    drop = {k: set(v) for k, v in (drop or {}).items()}
    bad = set(drop) - set(PHASES)
    if bad:
        raise ValueError(f"secagg drop phases {sorted(bad)}; known: {PHASES}")
    cohort = sorted(int(u) for u in inputs)
    lengths = {int(np.asarray(x).size) for x in inputs.values()}
    if len(lengths) != 1:
        raise ValueError(f"secagg inputs have different lengths {sorted(lengths)}")
    (length,) = lengths
    bits = params.modulus_bits
    if any(int(np.asarray(x).max(initial=0)) >> bits for x in inputs.values()):
        raise ValueError(f"secagg inputs must be integers in [0, 2**{bits})")
    graph = neighbours(cohort, params, seed, round)
    t = params.t_for(len(cohort))
    clients = {u: _Client(u, np.asarray(inputs[u], dtype=np.uint64), params, seed, round) for u in cohort}
    gone: set[int] = set()

    def up(u: int, msg: Message, phase: str) -> Optional[Message]:
        if u in gone or u in drop.get(phase, set()):
            gone.add(u)
            return None
        got = send(msg, u, SERVER, "up")
        if got is None:
            gone.add(u)
        return got

    # 0. advertise keys
    adv = {u: m for u in cohort if (m := up(u, clients[u].advertise(), "advertise")) is not None}
    u1 = sorted(adv)
    if len(u1) < t + 1:
        raise SecAggAbort(f"{len(u1)} clients advertised keys; at least {t + 1} needed (threshold {t})")
    for u in u1:
        nb = [v for v in graph[u] if v in adv]
        pk = torch.stack([adv[v].tensors["pk"] for v in nb]) if nb else torch.zeros((0, 2, KEY_BYTES), dtype=torch.uint8)
        got = send(Message("secagg_keys", {"ids": _ids(nb), "pk": pk}), SERVER, u, "down")
        if got is not None:
            clients[u].take_keys(got)
        else:
            gone.add(u)
    # 1. encrypted shares, relayed by the server
    sent = {u: m for u in u1 if (m := up(u, clients[u].shares(t), "shares")) is not None}
    u2 = sorted(sent)
    inbox: dict[int, list[tuple[int, bytes]]] = {u: [] for u in u2}
    delivered: dict[int, set[int]] = {}  # w -> senders whose shares reached w (w masks with them)
    for u, m in sent.items():
        for v, blob in zip(m.tensors["ids"].tolist(), m.tensors["ct"].numpy()):
            if v in inbox:
                inbox[v].append((u, blob.tobytes()))
    for v in u2:
        rows = sorted(inbox[v])
        got = send(Message("secagg_shares", {"ids": _ids(u for u, _ in rows),
                                             "ct": _u8([b for _, b in rows], CIPHERTEXT_BYTES)}), SERVER, v, "down")
        if got is not None:
            clients[v].take_shares(got)
            delivered[v] = {u for u, _ in rows}
        else:
            gone.add(v)
    # 2. masked inputs
    ys = {u: m for u in u2 if (m := up(u, clients[u].masked(), "masked")) is not None}
    u3 = sorted(ys)
    if len(u3) < t:
        raise SecAggAbort(f"{len(u3)} masked inputs arrived; at least {t} needed")
    # 3. unmasking: each survivor names, among the neighbours it holds shares of, who survived
    shares_b: dict[int, dict[int, int]] = {}
    shares_s: dict[int, dict[int, int]] = {}
    dropped_after_sharing = [v for v in u2 if v not in ys]
    for w in u3:
        held = [v for v in graph[w] if v in sent]
        alive = [v for v in held if v in ys]
        dead = [v for v in held if v not in ys]
        req = send(Message("secagg_unmask", {"alive": _ids(alive), "dropped": _ids(dead)}), SERVER, w, "down")
        if req is None:
            continue
        got = up(w, clients[w].unmask(req), "unmask")
        if got is None:
            continue
        for v, sh in zip(got.tensors["ids"].tolist(), got.tensors["share"].numpy()):
            (shares_b if v in ys else shares_s).setdefault(int(v), {})[int(w) + 1] = from_bytes(sh.tobytes())
    mask = np.uint64((1 << bits) - 1)
    total = np.zeros(length, dtype=np.uint64)
    for u in u3:
        total = (total + unpack(ys[u].tensors["y"].numpy(), bits, length)) & mask
    for u in u3:  # remove the self masks
        b = shamir_reconstruct(shares_b.get(u, {}), t)
        total = (total - prg(b, length, bits)) & mask
    for v in dropped_after_sharing:  # remove the dropped clients' dangling pairwise masks
        s_sk = shamir_reconstruct(shares_s.get(v, {}), t)
        for w in graph[v]:
            if w in ys and v in delivered.get(w, ()):  # w masked with v
                s_pk_w = from_bytes(adv[w].tensors["pk"][1].numpy().tobytes())
                m = prg(agree(s_sk, s_pk_w), length, bits)
                total = (total - m) & mask if w < v else (total + m) & mask
    return SecAggResult(total, u3, sorted(set(cohort) - set(u3)),
                        {"secagg/survivors": float(len(u3)), "secagg/dropped": float(len(cohort) - len(u3)),
                         "secagg/recovered": float(len(dropped_after_sharing)), "secagg/degree": float(params.k_for(len(cohort))),
                         "secagg/threshold": float(t)})


# --------------------------------------------------------------------------- quantisation


def quantise(x: torch.Tensor, clip_range: float, levels_bits: int, gen: torch.Generator) -> np.ndarray:
    """``x`` clipped to [-c, c] and stochastically rounded to integers in [0, 2**levels_bits - 1]
    (unbiased inside the range)."""
    top = (1 << levels_bits) - 1
    v = (x.detach().double().clamp(-clip_range, clip_range) + clip_range) / (2 * clip_range) * top
    lo = torch.floor(v)
    q = lo + (torch.rand(v.shape, generator=gen, dtype=torch.float64) < (v - lo)).double()
    return q.clamp(0, top).to(torch.int64).numpy().astype(np.uint64)


def dequantise_sum(total: np.ndarray, n: int, clip_range: float, levels_bits: int) -> torch.Tensor:
    """The float sum of ``n`` quantised vectors from their integer sum."""
    top = (1 << levels_bits) - 1
    return torch.from_numpy(total.astype(np.float64) / top * (2 * clip_range) - n * clip_range).float()


def check_room(n: int, levels_bits: int, modulus_bits: int) -> None:
    """Refuse a cohort whose quantised sum could wrap around the modulus."""
    if n * ((1 << levels_bits) - 1) >= 1 << modulus_bits:
        raise ValueError(f"secagg: {n} clients x 2**{levels_bits} quantisation levels overflow the modulus "
                         f"2**{modulus_bits}: lower secagg.levels_bits to {modulus_bits - math.ceil(math.log2(n + 1))} "
                         f"or raise secagg.modulus_bits")
