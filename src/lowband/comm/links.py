"""Link models: the ledger's bytes become simulated time (``[links]``).

A link model never changes what an algorithm computes; it reads the ledger after each
round and says how long the round would have taken on real links (design notes,
"One round loop"). The one exception is ``links.deadline_s``: a reply that would
arrive after the round deadline is not delivered (it is counted, as the faults
module's late replies are), see :meth:`RoundClock.transfer`.

**One direction of one link** (:class:`Direction`). A message of ``B`` bytes (encoded
plus declared, the bytes that would cross the link) is cut into
``n = ceil(B / frame_payload)`` frames; each frame carries ``frame_overhead`` header
bytes, so ``B + n * frame_overhead`` bytes go on the air. A frame of ``b`` payload
bytes occupies the channel for ``frame_time_s + 8 * (b + frame_overhead) / bps``
seconds (``frame_time_s``: what a nominal bit rate does not cover; for LoRa the preamble,
PHY header and coding, set so that a full frame lasts its exact time on air).
A frame is lost with probability ``loss`` and re-sent until it arrives, so it is sent
``1 / (1 - loss)`` times on average. By default (``retransmissions = "expected"``) that
expectation is used; ``"sampled"`` draws each frame's transmissions (geometric) from a
generator addressed by (seed, "links", round, the message's position in the round's
ledger rows), so both are deterministic: metrics stay byte-identical across runs,
executors and resumes. With a duty cycle ``d`` < 1 a transmitter that occupied the
channel ``t`` seconds stays silent ``t * (1/d - 1)`` seconds before its next
transmission (the LoRaWAN / ETSI EN 300 220 rule). The message arrives ``latency_s``
after its last transmission ends.

**Contact windows** (:class:`LinkProfile`). A link with ``contact_period_s`` is usable
only while ``(t - contact_offset_s) mod contact_period_s < contact_duration_s``
(absolute simulated time ``t``, counted from the start of round 1): a transfer
progresses inside windows and pauses outside them (a LEO satellite pass).

**A round** (:class:`RoundClock`), replayed from the round's ledger rows in the order
they were recorded. Each node's link is its own (no shared medium, no gateway
contention): a download to client ``c`` runs on ``c``'s downlink, transfers to the same
client one after another; a sender starts sending once its downloads of the round have
arrived and its local compute (:func:`compute_seconds`) is done, and sends its messages
one after another on its uplink (peer messages use the sender's uplink). The round lasts
until the last message arrives: the slowest participant for a star round, the slowest
edge (hence the slowest node) for a peer round. With ``deadline_s`` the round ends at
the deadline at the latest, and a reply (up or peer) arriving later is dropped.
One exchange per round is assumed (download, compute, upload); an algorithm with
several exchange phases in a round is timed as if they overlapped where the ledger
order allows it. Rounds without traffic take no time. The server's own compute is not
counted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Iterable, Mapping, Optional, Sequence

import numpy as np

from .message import DIRECTIONS

__all__ = ["Direction", "LinkProfile", "PRESETS", "LinkModel", "RoundClock", "LinkTimer", "frames", "transmit",
           "lora_time_on_air", "sample_attempts", "compute_seconds", "forward_flops", "build_link_model", "describe"]

@dataclass(frozen=True)
class Direction:
    """One direction of a link (see the module docstring for the arithmetic)."""

    bps: float
    latency_s: float = 0.0
    loss: float = 0.0
    frame_payload: int = 1460
    frame_overhead: int = 40
    frame_time_s: float = 0.0
    duty_cycle: float = 1.0
    #: the *node's* radio power (W) while this direction's frames are on the air: its
    #: transmit power for ``up`` (and peer sends), its receive power for ``down`` (and peer
    #: receptions); None where no datasheet figure exists (then no energy is reported)
    power_w: Optional[float] = None

    def __post_init__(self) -> None:
        if not (self.bps > 0 and math.isfinite(self.bps)):
            raise ValueError(f"bps must be a finite number > 0, got {self.bps!r}")
        if not 0.0 <= self.loss < 1.0:
            raise ValueError(f"loss must be in [0, 1) (a frame lost with probability 1 never arrives), got {self.loss!r}")
        if not 0.0 < self.duty_cycle <= 1.0:
            raise ValueError(f"duty_cycle must be in (0, 1], got {self.duty_cycle!r}")
        if int(self.frame_payload) < 1 or int(self.frame_overhead) < 0:
            raise ValueError("frame_payload must be >= 1 and frame_overhead >= 0")
        if self.latency_s < 0 or self.frame_time_s < 0:
            raise ValueError("latency_s and frame_time_s must be >= 0")
        if self.power_w is not None and not (self.power_w >= 0 and math.isfinite(self.power_w)):
            raise ValueError(f"power_w must be a finite number >= 0, got {self.power_w!r}")

    @property
    def joules_per_byte(self) -> Optional[float]:
        """Radio energy per payload byte of a long message (full frames, headers, per-frame
        time and expected retransmissions included): ``power_w x airtime / payload``."""
        if self.power_w is None:
            return None
        k = 1.0 / (1.0 - self.loss)
        return self.power_w * k * frame_airtime(int(self.frame_payload), self) / int(self.frame_payload)


@dataclass(frozen=True)
class LinkProfile:
    """A node's link: ``up`` (node -> server, and node -> peer) and ``down`` (server -> node),
    and optional contact windows shared by both directions."""

    name: str
    description: str
    up: Direction
    down: Direction
    contact_period_s: Optional[float] = None
    contact_duration_s: Optional[float] = None
    contact_offset_s: float = 0.0
    #: where each figure comes from (shown in docs and ``lowband list links``)
    source: str = ""

    def __post_init__(self) -> None:
        p, d = self.contact_period_s, self.contact_duration_s
        if (p is None) != (d is None):
            raise ValueError("contact_period_s and contact_duration_s go together (a window of "
                             "contact_duration_s every contact_period_s)")
        if p is not None and not (0 < d <= p):  # type: ignore[operator]
            raise ValueError(f"need 0 < contact_duration_s <= contact_period_s, got {d!r} and {p!r}")

    @property
    def windows(self) -> Optional[tuple[float, float, float]]:
        if self.contact_period_s is None or self.contact_duration_s is None:
            return None
        if self.contact_duration_s >= self.contact_period_s:
            return None  # always reachable
        return (float(self.contact_period_s), float(self.contact_duration_s), float(self.contact_offset_s))


# --------------------------------------------------------------------------- presets
# Figures and their sources are listed in docs/user-guide.md ("Link models").
_TCP_IP = dict(frame_payload=1460, frame_overhead=40)  # MTU 1500 (RFC 894) - IPv4 20 B (RFC 791) - TCP 20 B (RFC 793)
_UDP_IP = dict(frame_payload=1472, frame_overhead=28)  # MTU 1500 - IPv4 20 B - UDP 8 B (RFC 768)


def lora_time_on_air(phy_payload: int, sf: int, bw: float = 125e3, cr: int = 1, preamble: int = 8,
                     explicit_header: bool = True, crc: bool = True, ldro: Optional[bool] = None) -> float:
    """Seconds on air of one LoRa packet of ``phy_payload`` bytes (Semtech SX1276 datasheet
    section 4.1.1.7, AN1200.13): ``(preamble + 4.25) + 8 + max(ceil((8 PL - 4 SF + 28 + 16 CRC
    - 20 IH) / (4 (SF - 2 DE))) (CR + 4), 0)`` symbols of ``2^SF / BW`` seconds; low data rate
    optimisation ``DE`` on when a symbol lasts more than 16 ms (SF11, SF12 at 125 kHz)."""
    tsym = 2.0 ** sf / bw
    de = (tsym > 0.016) if ldro is None else ldro
    num = 8 * phy_payload - 4 * sf + 28 + 16 * int(crc) - 20 * int(not explicit_header)
    n_payload = 8 + max(math.ceil(num / (4 * (sf - 2 * int(de)))) * (cr + 4), 0)
    return (preamble + 4.25 + n_payload) * tsym


def _lora_frame_time(sf: int, bps: float, payload: int, overhead: int = 13) -> float:
    """``frame_time_s`` that makes a full frame's airtime equal the LoRa time on air: what the
    nominal bit rate does not cover (preamble, PHY header and CRC, coding granularity)."""
    return lora_time_on_air(payload + overhead, sf) - 8.0 * (payload + overhead) / bps


# Radio power of the node while its frames are on the air (W), where a figure exists; see
# docs/user-guide.md ("Energy"). LoRa: Semtech SX1276 datasheet, Table 6 (power consumption),
# VDD = 3.3 V: transmit at RFOP = +13 dBm on the RFO pin 29 mA (EU868 allows 14 dBm ERP),
# receive 10.8 mA. LTE: the measured power model of Huang et al., MobiSys 2012 (Table 4:
# P = alpha x throughput + beta; alpha_up 438.39 mW/Mbit/s, alpha_down 51.97 mW/Mbit/s,
# beta 1288.04 mW), at this preset's 5 / 20 Mbit/s.
_SX1276_TX_W = 3.3 * 0.029
_SX1276_RX_W = 3.3 * 0.0108
_LTE_UP_W = (438.39 * 5 + 1288.04) / 1000
_LTE_DOWN_W = (51.97 * 20 + 1288.04) / 1000

_SF12_FRAME = _lora_frame_time(12, 250, 51)  # 2.793472 s on air for 64 B, 2.048 s of it at 250 bit/s
_SF7_FRAME = _lora_frame_time(7, 5470, 222)  # 0.368896 s on air for 235 B

PRESETS: dict[str, LinkProfile] = {p.name: p for p in [
    LinkProfile(
        "lorawan_sf12", "LoRaWAN EU868 DR0 (SF12/125 kHz): 250 bit/s, 51 B per frame, 1% duty cycle up, 10% down",
        up=Direction(bps=250, frame_payload=51, frame_overhead=13, frame_time_s=_SF12_FRAME, duty_cycle=0.01,
                     power_w=_SX1276_TX_W),
        down=Direction(bps=250, latency_s=2.0, frame_payload=51, frame_overhead=13, frame_time_s=_SF12_FRAME,
                       duty_cycle=0.1, power_w=_SX1276_RX_W),
        source="LoRaWAN Regional Parameters RP002 (EU863-870: DR0 = SF12/125 kHz 250 bit/s, N = 51; RX2 869.525 MHz "
               "DR0, RECEIVE_DELAY2 2 s); LoRaWAN L2 TS001 (13 B: MHDR 1 + FHDR 7 + FPort 1 + MIC 4); ETSI EN 300 "
               "220-2 (g1 1%, g3 10%); Semtech SX1276 datasheet 4.1.1.7 (time on air of a full frame, which sets "
               "frame_time_s); power: SX1276 datasheet Table 6 (3.3 V; TX +13 dBm RFO 29 mA, RX 10.8 mA)"),
    LinkProfile(
        "lorawan_sf7", "LoRaWAN EU868 DR5 (SF7/125 kHz): 5.47 kbit/s, 222 B per frame, 1% duty cycle",
        up=Direction(bps=5470, frame_payload=222, frame_overhead=13, frame_time_s=_SF7_FRAME, duty_cycle=0.01,
                     power_w=_SX1276_TX_W),
        down=Direction(bps=5470, latency_s=1.0, frame_payload=222, frame_overhead=13, frame_time_s=_SF7_FRAME,
                       duty_cycle=0.01, power_w=_SX1276_RX_W),
        source="LoRaWAN Regional Parameters RP002 (EU863-870: DR5 = SF7/125 kHz 5470 bit/s, N = 222 repeater-"
               "compatible; RX1 on the uplink channel, RECEIVE_DELAY1 1 s); LoRaWAN L2 TS001 (13 B header); ETSI EN "
               "300 220-2 (g1 1%); Semtech SX1276 datasheet 4.1.1.7 (time on air of a full frame); power: SX1276 "
               "datasheet Table 6 (3.3 V; TX +13 dBm RFO 29 mA, RX 10.8 mA)"),
    LinkProfile(
        "nbiot", "NB-IoT Cat-NB1: ~62.5 kbit/s up, ~26 kbit/s down (peak), UDP/IPv4, ~1 s latency",
        up=Direction(bps=62.5e3, latency_s=1.0, **_UDP_IP), down=Direction(bps=26e3, latency_s=1.0, **_UDP_IP),
        source="3GPP Rel-13 Cat-NB1 peak rates (TS 36.306; ~26 kbit/s DL, ~62.5 kbit/s UL multi-tone); latency "
               "typical (3GPP TR 45.820 targets <= 10 s; field 0.3-10 s); UDP/IPv4 headers RFC 768/791"),
    LinkProfile(
        "ltem", "LTE-M Cat-M1 (half duplex): ~375 kbit/s up, ~300 kbit/s down, TCP/IPv4, ~50 ms",
        up=Direction(bps=375e3, latency_s=0.05, **_TCP_IP), down=Direction(bps=300e3, latency_s=0.05, **_TCP_IP),
        source="3GPP Rel-13 Cat-M1 HD-FDD peak rates (TS 36.306; 1 Mbit/s full duplex); latency typical "
               "(10-15 ms design target, 50-200 ms in the field); TCP/IPv4 headers RFC 791/793"),
    LinkProfile(
        "lte", "LTE (typical, not peak): 5 Mbit/s up, 20 Mbit/s down, TCP/IPv4, 50 ms",
        up=Direction(bps=5e6, latency_s=0.05, power_w=_LTE_UP_W, **_TCP_IP),
        down=Direction(bps=20e6, latency_s=0.05, power_w=_LTE_DOWN_W, **_TCP_IP),
        source="typical user throughput (Cat-4 peak is 50/150 Mbit/s, TS 36.306; measured medians 5-30 Mbit/s "
               "down, 2-10 Mbit/s up); latency typical 30-100 ms; TCP/IPv4 headers RFC 791/793; power: Huang et al., "
               "MobiSys 2012, LTE power model (alpha_u 438.39, alpha_d 51.97 mW per Mbit/s, beta 1288.04 mW) at 5 / 20 "
               "Mbit/s"),
    LinkProfile(
        "wifi", "Wi-Fi 802.11n (typical): 50 Mbit/s both ways, TCP/IPv4, 5 ms",
        up=Direction(bps=50e6, latency_s=0.005, **_TCP_IP), down=Direction(bps=50e6, latency_s=0.005, **_TCP_IP),
        source="typical TCP throughput of 802.11n (PHY up to 600 Mbit/s, IEEE 802.11-2009; a 20 MHz 2.4 GHz link "
               "gives 20-100 Mbit/s); latency typical 1-10 ms; TCP/IPv4 headers RFC 791/793"),
    LinkProfile(
        "leo_uhf", "LEO CubeSat UHF pass: 9.6 kbit/s, AX.25 frames of 256 B, a 10-minute contact every 95 minutes",
        up=Direction(bps=9600, latency_s=0.01, frame_payload=256, frame_overhead=20),
        down=Direction(bps=9600, latency_s=0.01, frame_payload=256, frame_overhead=20),
        contact_period_s=5700.0, contact_duration_s=600.0,
        source="9600 bit/s G3RUH GMSK, the common CubeSat UHF rate; AX.25 v2.2 (N1 = 256 B info field; 20 B: "
               "2 flags + 14 address + control + PID + 2 FCS); orbit period ~95 min at ~550 km (Kepler), a pass "
               "typical 5-10 min above 10 degrees elevation; propagation 2-7 ms (600-2000 km slant range)"),
]}


# --------------------------------------------------------------------------- one message
def frames(nbytes: int, d: Direction) -> tuple[int, int, int]:
    """``(frames, header bytes, payload bytes of the last frame)`` of a ``nbytes`` message
    (an empty message still takes one frame: a header)."""
    nbytes = int(nbytes)
    n = max(1, -(-nbytes // int(d.frame_payload)))
    last = nbytes - (n - 1) * int(d.frame_payload)
    return n, n * int(d.frame_overhead), last


def frame_airtime(payload: int, d: Direction) -> float:
    """Seconds one frame of ``payload`` bytes occupies the channel (one transmission)."""
    return d.frame_time_s + 8.0 * (payload + d.frame_overhead) / d.bps


def _advance(t: float, need: float, win: Optional[tuple[float, float, float]]) -> float:
    """The time at which ``need`` seconds of in-window channel time, starting at ``t``, are done."""
    if win is None or need <= 0:
        return t + need
    period, dur, off = win
    phase = (t - off) % period
    if phase >= dur:  # closed: wait for the next window
        t += period - phase
        phase = 0.0
    left = dur - phase
    if need <= left:
        return t + need
    need -= left
    t += left + (period - dur)  # the start of the next window
    full = math.floor(need / dur)
    rest = need - full * dur
    if rest <= 0:  # ends exactly at the end of a window
        return t + (full - 1) * period + dur
    return t + full * period + rest


@dataclass(frozen=True)
class Tx:
    """One message sent: ``end`` of its last frame, ``arrival`` (end + latency) and
    ``free`` (when the transmitter may send again, after the duty-cycle silence)."""

    start: float
    end: float
    arrival: float
    free: float
    frames: int
    header_bytes: int
    airtime: float  # channel time, retransmissions included


def transmit(d: Direction, nbytes: int, start: float = 0.0,
             windows: Optional[tuple[float, float, float]] = None,
             attempts: Optional[np.ndarray] = None) -> Tx:
    """Send ``nbytes`` over direction ``d`` from time ``start`` (see the module docstring).

    ``attempts``: how many times each frame is sent (a sampled draw, one entry per frame);
    None uses the expected ``1 / (1 - loss)``."""
    n, header, last = frames(nbytes, d)
    a_full1, a_last1 = frame_airtime(int(d.frame_payload), d), frame_airtime(last, d)
    if attempts is None:
        k = 1.0 / (1.0 - d.loss)  # expected transmissions per frame (geometric)
        k_full, k_last = k * (n - 1), k
    else:
        if len(attempts) != n:
            raise ValueError(f"attempts has {len(attempts)} entries for {n} frames")
        k_full, k_last = float(np.sum(attempts[:-1])), float(attempts[-1])
    off = 1.0 / d.duty_cycle - 1.0
    busy = a_full1 * k_full + a_last1 * k_last
    # every transmission but the very last one (of the last frame) is followed by a silence
    if windows is None:
        end = start + busy + (busy - a_last1) * off
    elif off == 0.0:
        end = _advance(start, busy, windows)
    else:  # frame by frame: transmissions pause outside windows, silences run in real time
        t = start
        for i in range(n):
            a = a_full1 if i < n - 1 else a_last1
            k = float(attempts[i]) if attempts is not None else 1.0 / (1.0 - d.loss)
            if i < n - 1:
                t = _advance(t, a * k, windows) + a * k * off
            else:  # the last frame's retransmissions, their silences, then its final transmission
                t = _advance(t, a * (k - 1), windows) + a * (k - 1) * off
                t = _advance(t, a, windows)
        end = t
    return Tx(start, end, end + d.latency_s, end + a_last1 * off, n, header, busy)


def sample_attempts(d: Direction, nbytes: int, rng: np.random.Generator) -> Optional[np.ndarray]:
    """Transmissions of each frame of a ``nbytes`` message, each geometric with success
    probability ``1 - loss`` (None when nothing is lost)."""
    if d.loss <= 0:
        return None
    return rng.geometric(1.0 - d.loss, size=frames(nbytes, d)[0])


# --------------------------------------------------------------------------- compute
def forward_flops(model: Any, input_shape: Sequence[int]) -> int:
    """FLOPs of one forward pass of one sample, counted by torch's FlopCounterMode (matmul
    and convolution FLOPs from shapes: deterministic); falls back to 2 x parameters."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    params = sum(p.numel() for p in model.parameters())
    device = next((p.device for p in model.parameters()), None)  # the run's device
    model.eval()  # batch norm on one sample
    for dtype in (torch.float32, torch.long):
        try:
            x = torch.zeros((1, *input_shape), dtype=dtype, device=device)
            counter = FlopCounterMode(display=False)
            with counter, torch.no_grad():
                model(x)
            flops = int(counter.get_total_flops())
            return flops if flops > 0 else 2 * params
        except Exception:  # noqa: BLE001 - a model that needs other inputs: use the estimate below
            continue
    return 2 * params


def samples_per_round(hp: Any, n_train: int) -> int:
    """Training samples a node processes between a download and its upload, estimated from
    the algorithm's hyperparameters: the hyperparameters' own ``samples_per_upload(n_train)``
    where they define it (an algorithm with several uploads per round, HierFAVG), else
    ``local_epochs x n_train``, else ``iterations x batch_size``, else one pass over ``n_train``."""
    own = getattr(hp, "samples_per_upload", None)
    if callable(own):
        return int(own(int(n_train)))
    if hasattr(hp, "local_epochs"):
        return int(hp.local_epochs) * int(n_train)
    if hasattr(hp, "iterations") and hasattr(hp, "batch_size"):
        return int(hp.iterations) * int(hp.batch_size)
    return int(n_train)


def compute_seconds(fwd_flops: int, samples: int, device_flops: Optional[float], fixed_s: float = 0.0) -> float:
    """Seconds of local compute in a round: ``fixed_s`` plus ``3 x forward FLOPs x samples /
    device_flops`` (backward ~ 2 x forward, the usual "6 N per sample" rule for N MACs)."""
    t = float(fixed_s)
    if device_flops:
        t += 3.0 * float(fwd_flops) * float(samples) / float(device_flops)
    return t


# --------------------------------------------------------------------------- rounds


@dataclass
class LinkModel:
    """Every node's link profile, its local compute time per round, and the deadline."""

    default: LinkProfile
    per_node: Mapping[int, LinkProfile] = field(default_factory=dict)
    compute_s: Sequence[float] = ()
    deadline_s: Optional[float] = None
    #: "expected" transmissions per frame, or "sampled" from (seed, "links", round, row)
    retransmissions: str = "expected"
    seed: int = 0
    #: relays (a hierarchy's gateways, ``alg.infrastructure``): their peer messages to and
    #: from devices travel on the devices' links, and they forward once what they received
    #: has arrived (see :meth:`RoundClock.transfer`)
    relays: frozenset = frozenset()

    def profile(self, node: int) -> LinkProfile:
        return self.per_node.get(int(node), self.default)

    @property
    def has_energy(self) -> bool:
        """Whether every profile in use has a power figure both ways (energy is reported)."""
        return all(p.up.power_w is not None and p.down.power_w is not None
                   for p in (self.default, *self.per_node.values()))

    def compute(self, node: int) -> float:
        return float(self.compute_s[node]) if 0 <= node < len(self.compute_s) else 0.0

    def clock(self, t0: float = 0.0, round: int = 0) -> "RoundClock":
        return RoundClock(self, t0, round)


class RoundClock:
    """Times the transfers of one round in the order they are recorded (module docstring).

    ``t0`` is the round's absolute start (contact windows are absolute); every time
    returned is relative to it."""

    def __init__(self, model: LinkModel, t0: float = 0.0, round: int = 0):
        self.model, self.t0, self.round = model, float(t0), int(round)
        self.rows = 0  # transfers timed so far (the position of the next one in the round's ledger rows)
        self.down_done: dict[int, float] = {}  # client -> when its downloads so far arrived
        self.free: dict[tuple[int, str], float] = {}  # (node, "up"/"down") -> transmitter free again
        self.end = 0.0
        self.late = 0  # (message, receiver) pairs past the deadline
        self.energy_j = 0.0  # the nodes' radio energy of the round (the server's is not counted)
        self.energy_by_node: dict[int, float] = {}  # the same, per node
        self.recv_done: dict[int, float] = {}  # relay -> when what it received so far arrived

    def transfer(self, src: int, dst: int, direction: str, nbytes: int) -> float:
        """Time the transfer ``src -> dst`` of ``nbytes``; returns its arrival time (seconds
        after the round start). With a deadline, a reply arriving later counts as late:
        :meth:`on_time` says whether to deliver it."""
        m = self.model
        relays = m.relays
        # a relay (a gateway) talks to its devices over *their* links: to a device on its
        # downlink, from a device on its uplink; it forwards what it received (store and forward)
        as_down = direction == "down" or (direction == "peer" and src in relays)
        if as_down:
            link, d = dst, m.profile(dst).down
            start = max(self.free.get((dst, "down"), 0.0), self.recv_done.get(src, 0.0) if src in relays else 0.0)
        elif src in relays:  # a relay's own uplink (to the cloud), once what it received has arrived
            link, d = src, m.profile(src).up
            start = max(self.recv_done.get(src, 0.0), self.free.get((src, "up"), 0.0))
        else:  # up, and peer on the sender's uplink
            link, d = src, m.profile(src).up
            ready = self.down_done.get(src, 0.0) + m.compute(src)
            start = max(ready, self.free.get((src, "up"), 0.0))
        attempts = None
        if m.retransmissions == "sampled" and d.loss > 0:
            from lowband.seeding import np_gen

            attempts = sample_attempts(d, nbytes, np_gen(m.seed, "links", self.round, self.rows))
        self.rows += 1
        tx = transmit(d, nbytes, self.t0 + start, m.profile(link).windows, attempts)
        if m.has_energy:  # the node's radio: sending (up, peer) or receiving (down, peer)
            e = float(d.power_w) * tx.airtime  # type: ignore[arg-type]
            self.energy_j += e
            self.energy_by_node[link] = self.energy_by_node.get(link, 0.0) + e
            if direction == "peer" and not as_down and dst not in relays:
                e = float(m.profile(dst).down.power_w) * tx.airtime  # type: ignore[arg-type]
                self.energy_j += e
                self.energy_by_node[dst] = self.energy_by_node.get(dst, 0.0) + e
        arrival = tx.arrival - self.t0
        self.free[(link, "down" if as_down else "up")] = tx.free - self.t0
        if dst in relays:
            self.recv_done[dst] = max(self.recv_done.get(dst, 0.0), arrival)
        if as_down:
            self.down_done[dst] = max(self.down_done.get(dst, 0.0), arrival)
            if direction == "peer" and not self.on_time(arrival):
                self.late += 1
        elif not self.on_time(arrival):
            self.late += 1
        self.end = max(self.end, arrival)
        return arrival

    def on_time(self, arrival: float) -> bool:
        return self.model.deadline_s is None or arrival <= self.model.deadline_s

    @property
    def round_s(self) -> float:
        """The round's length: the last arrival, cut at the deadline if there is one."""
        if self.model.deadline_s is not None:
            return min(self.end, float(self.model.deadline_s))
        return self.end


def replay_round(model: LinkModel, ledger: Any, round: int, t0: float = 0.0) -> RoundClock:
    """A :class:`RoundClock` fed with round ``round``'s ledger rows in recorded order."""
    cols = ledger.columns()
    idx = np.flatnonzero(cols["round"] == round)
    clock = model.clock(t0, round)
    src, dst, dirs = cols["src"][idx], cols["dst"][idx], cols["direction"][idx]
    nbytes = cols["encoded"][idx] + cols["declared"][idx]
    for s, t, d, b in zip(src.tolist(), dst.tolist(), dirs.tolist(), nbytes.tolist()):
        clock.transfer(s, t, DIRECTIONS[d], b)
    return clock


class LinkTimer:
    """Simulated time per round of a run: replays each finished round's ledger rows.

    Rounds are finished in order (1, 2, ...); finishing round ``r`` again (a resume)
    forgets the rounds after it. ``time/sim_s`` is a running sum in round order, so it is
    the same float in every run."""

    def __init__(self, model: LinkModel):
        self.model = model
        self._cum: list[float] = [0.0]  # _cum[r]: simulated seconds of rounds 1..r
        self._round: list[float] = [0.0]  # _round[r]: simulated seconds of round r
        self._energy: list[float] = [0.0]  # _energy[r]: radio joules of rounds 1..r (with power figures)
        #: the clock of the round finished last (per-node energy, ``lowband.engine.observers.devices``)
        self.last: Optional[RoundClock] = None

    def elapsed(self, upto: int) -> float:
        """Cumulative simulated seconds of rounds ``1..upto`` (finished ones)."""
        return self._cum[max(0, min(int(upto), len(self._cum) - 1))]

    def round_s(self, round: int) -> float:
        r = int(round)
        return self._round[r] if 1 <= r < len(self._round) else 0.0

    def live(self, round: int) -> RoundClock:
        """A clock for round ``round`` to feed while it runs (for the deadline)."""
        return self.model.clock(self.elapsed(round - 1), round)

    def finish(self, ledger: Any, round: int) -> float:
        """Time round ``round`` from the ledger (after it ran, or when resuming)."""
        r = int(round)
        if not 1 <= r <= len(self._cum):
            raise ValueError(f"round {r} finished before round {len(self._cum)}")
        del self._cum[r:], self._round[r:], self._energy[r:]
        clock = replay_round(self.model, ledger, r, self._cum[r - 1])
        self._round.append(clock.round_s)
        self._cum.append(self._cum[r - 1] + clock.round_s)
        self._energy.append(self._energy[r - 1] + clock.energy_j)
        self.last = clock
        return clock.round_s

    def energy(self, upto: int) -> Optional[float]:
        """Cumulative radio joules of the nodes in rounds ``1..upto``; None without power figures."""
        if not self.model.has_energy:
            return None
        return self._energy[max(0, min(int(upto), len(self._energy) - 1))]

    def record(self, round: int) -> dict[str, float]:
        """``time/round_s`` (round ``round`` alone) and ``time/sim_s`` (rounds 1..round); with
        power figures also ``energy/round_j`` and ``energy/j`` (the nodes' radios, cumulative)."""
        out = {"time/round_s": float(self.round_s(round)), "time/sim_s": float(self.elapsed(round))}
        total = self.energy(round)
        if total is not None:
            r = int(round)
            prev = self._energy[r - 1] if 1 <= r < len(self._energy) else total
            out["energy/round_j"] = float(total - prev)
            out["energy/j"] = float(total)
        return out


# --------------------------------------------------------------------------- from config
def _override(p: LinkProfile, cfg: Any) -> LinkProfile:
    up = replace(p.up, **cfg.up.model_dump(exclude_none=True))
    down = replace(p.down, **cfg.down.model_dump(exclude_none=True))
    kw: dict[str, Any] = {}
    for key in ("contact_period_s", "contact_duration_s", "contact_offset_s"):
        v = getattr(cfg, key)
        if v is not None:
            kw[key] = v
    return replace(p, up=up, down=down, **kw)


def configured_profiles(cfg: Any) -> tuple[LinkProfile, dict[int, LinkProfile]]:
    """The default profile (the preset with the overrides) and the per-node presets of a
    ``[links]`` config; raises ValueError naming the bad key."""
    default = _override(PRESETS[cfg.preset], cfg)
    per_node = {int(n): PRESETS[name] for name, nodes in cfg.nodes.items() for n in nodes}
    return default, per_node


def build_link_model(cfg: Any, *, compute_s: Iterable[float], seed: int = 0, relays: Iterable[int] = ()) -> LinkModel:
    """The :class:`LinkModel` of a ``[links]`` config with each node's compute seconds
    (``relays``: the algorithm's gateways)."""
    default, per_node = configured_profiles(cfg)
    return LinkModel(default, per_node, list(compute_s), cfg.deadline_s, cfg.retransmissions, int(seed),
                     frozenset(int(i) for i in relays))


def node_compute_seconds(cfg: Any, *, hp: Any, n_train: Sequence[int], model_key: Any, build: Any,
                         input_shape: Sequence[int], device_flops: Optional[Sequence[float]] = None) -> list[float]:
    """Each node's local compute seconds per upload (:func:`compute_seconds`): forward FLOPs of
    its architecture (counted once per architecture) x the samples it trains on, at
    ``cfg.device_flops`` or, per node, at ``device_flops[i]`` (``[devices]``)."""
    flops: dict[str, int] = {}
    out = []
    for i, n in enumerate(n_train):
        key = model_key(i)
        rate = cfg.device_flops if device_flops is None else float(device_flops[i])
        if rate and key not in flops:
            flops[key] = forward_flops(build(i), input_shape)
        out.append(compute_seconds(flops.get(key, 0), samples_per_round(hp, n), rate, cfg.compute_s))
    return out


def node_train_flops(*, hp: Any, n_train: Sequence[int], model_key: Any, build: Any,
                     input_shape: Sequence[int]) -> list[float]:
    """Each node's training FLOPs per upload: ``3 x forward FLOPs x samples`` (the FLOP term
    of :func:`compute_seconds`), for compute energy."""
    flops: dict[str, int] = {}
    out = []
    for i, n in enumerate(n_train):
        key = model_key(i)
        if key not in flops:
            flops[key] = forward_flops(build(i), input_shape)
        out.append(3.0 * float(flops[key]) * float(samples_per_round(hp, n)))
    return out


def format_seconds(t: float) -> str:
    """``t`` seconds for people: ``0.123 s``, ``52.9 min``, ``16.3 h``, ``4.2 days``."""
    if t < 120:
        return f"{t:.3g} s"
    if t < 7200:
        return f"{t / 60:.1f} min"
    if t < 172800:
        return f"{t / 3600:.1f} h"
    return f"{t / 86400:.1f} days"


def describe(p: LinkProfile) -> str:
    """One line of a profile's parameters (``lowband list links``)."""
    def d(x: Direction) -> str:
        s = (f"{x.bps:g} bit/s, latency {x.latency_s:g} s, frames {x.frame_payload}+{x.frame_overhead} B")
        if x.frame_time_s:
            s += f" +{x.frame_time_s * 1e3:.1f} ms"
        if x.loss:
            s += f", loss {x.loss:g}"
        if x.duty_cycle < 1:
            s += f", duty {x.duty_cycle:g}"
        if x.power_w is not None:
            s += f", radio {x.power_w:.4g} W ({x.joules_per_byte * 1e6:.4g} uJ/B)"  # type: ignore[operator]
        return s
    out = f"up: {d(p.up)}; down: {d(p.down)}"
    if p.windows:
        out += f"; contact {p.contact_duration_s:g} s every {p.contact_period_s:g} s"
    return out
