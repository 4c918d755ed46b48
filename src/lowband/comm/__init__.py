"""Communication: messages, the wire format, codecs, the byte ledger and the network.

Every message between nodes is encoded to ``bytes`` with its link's codec, counted in
the :class:`Ledger`, and decoded for the receiver (design rules 2 and 3).
"""

from .codecs import (
    CODECS,
    Codec,
    bf16,
    chain,
    ef,
    fp16,
    fp32,
    int8,
    parse_codec,
    powersgd,
    qsgd,
    randmask,
    sign,
    sketch,
    topk,
)
from .ledger import Ledger
from .message import DIRECTIONS, SERVER, DeclaredTensor, Message
from .network import CodecConfig, Network, infer_direction
from .wire import (
    DEFAULT_BUDGET,
    DecodeBudget,
    WireError,
    declared_bytes,
    decode_message,
    decode_with_codec,
    encode_message,
)

__all__ = [
    "CODECS", "Codec", "bf16", "chain", "ef", "fp16", "fp32", "int8", "parse_codec", "powersgd",
    "qsgd", "randmask", "sign", "sketch", "topk", "Ledger", "DIRECTIONS", "SERVER", "DeclaredTensor", "Message",
    "CodecConfig", "Network", "infer_direction", "DEFAULT_BUDGET", "DecodeBudget", "WireError",
    "declared_bytes", "decode_message", "decode_with_codec", "encode_message",
]
