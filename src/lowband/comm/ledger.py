"""The Ledger: one record per transfer, with the bytes that really crossed the link.

Each record is ``(round, src, dst, direction, kind, encoded_bytes, declared_bytes)``:
``encoded`` is ``len(bytes)`` of the encoded message, ``declared`` the size of payloads
counted but never built (design rule 2), kept apart so nobody mistakes one for the other.

Runs reach ~1e6 records (300 nodes x 5 neighbours x a few kinds x hundreds of rounds),
so records live in growable numpy columns (kinds and directions interned as small ints),
never as one Python object per record; queries are vectorised masks.
"""

from __future__ import annotations

from typing import Iterable

import numpy as np
import torch

from .message import DIRECTIONS

_COLUMNS: dict[str, np.dtype] = {
    "round": np.dtype(np.int64),
    "src": np.dtype(np.int64),
    "dst": np.dtype(np.int64),
    "direction": np.dtype(np.uint8),
    "kind": np.dtype(np.int32),
    "encoded": np.dtype(np.int64),
    "declared": np.dtype(np.int64),
}
_DIR_CODE = {d: i for i, d in enumerate(DIRECTIONS)}
_STATE_VERSION = 1

Bytes = dict[str, int]


class Ledger:
    """Append-only table of transfers with filtered totals (see the module docstring)."""

    def __init__(self, capacity: int = 1024) -> None:
        self._n = 0
        self._cols = {k: np.zeros(max(1, capacity), dtype=dt) for k, dt in _COLUMNS.items()}
        self._kinds: list[str] = []
        self._kind_code: dict[str, int] = {}

    # ------------------------------------------------------------------ writing

    def __len__(self) -> int:
        return self._n

    def _kind(self, kind: str) -> int:
        code = self._kind_code.get(kind)
        if code is None:
            if not isinstance(kind, str):
                raise TypeError(f"ledger kind must be a str, got {type(kind).__name__}")
            code = self._kind_code[kind] = len(self._kinds)
            self._kinds.append(kind)
        return code

    @staticmethod
    def _direction(direction: str) -> int:
        try:
            return _DIR_CODE[direction]
        except KeyError:
            raise ValueError(f"direction must be one of {list(DIRECTIONS)}, got {direction!r}") \
                from None

    def _reserve(self, extra: int) -> None:
        cap = len(self._cols["round"])
        if self._n + extra <= cap:
            return
        new = max(2 * cap, self._n + extra)
        for k, col in self._cols.items():
            grown = np.zeros(new, dtype=col.dtype)
            grown[: self._n] = col[: self._n]
            self._cols[k] = grown

    def record(self, round: int, src: int, dst: int, direction: str, kind: str, nbytes: int,
               declared: int = 0) -> None:
        """Append one transfer of ``nbytes`` encoded (and ``declared``) bytes."""
        if nbytes < 0 or declared < 0:
            raise ValueError(f"byte counts must be >= 0, got {nbytes} and {declared}")
        d, k = self._direction(direction), self._kind(kind)
        self._reserve(1)
        i, c = self._n, self._cols
        c["round"][i], c["src"][i], c["dst"][i] = round, src, dst
        c["direction"][i], c["kind"][i] = d, k
        c["encoded"][i], c["declared"][i] = nbytes, declared
        self._n += 1

    def record_many(self, round: int, src: int, dsts: Iterable[int], direction: str, kind: str,
                    nbytes: int, declared: int = 0) -> None:
        """Append one identical transfer from ``src`` to each of ``dsts`` (a broadcast)."""
        dst = np.fromiter(dsts, dtype=np.int64)
        if nbytes < 0 or declared < 0:
            raise ValueError(f"byte counts must be >= 0, got {nbytes} and {declared}")
        d, k = self._direction(direction), self._kind(kind)
        m = len(dst)
        self._reserve(m)
        sl, c = slice(self._n, self._n + m), self._cols
        c["round"][sl], c["src"][sl], c["dst"][sl] = round, src, dst
        c["direction"][sl], c["kind"][sl] = d, k
        c["encoded"][sl], c["declared"][sl] = nbytes, declared
        self._n += m

    def truncate(self, after_round: int) -> None:
        """Drop the records of rounds ``> after_round`` (a resumed run replays them)."""
        keep = self._cols["round"][: self._n] <= after_round
        m = int(keep.sum())
        for k, col in self._cols.items():
            col[:m] = col[: self._n][keep]
        self._n = m

    # ------------------------------------------------------------------ reading

    def columns(self) -> dict[str, np.ndarray]:
        """Read-only views of the columns (``direction``/``kind`` as codes; see ``kinds``)."""
        out = {}
        for k, col in self._cols.items():
            v = col[: self._n]
            v.flags.writeable = False
            out[k] = v
        return out

    @property
    def kinds(self) -> list[str]:
        """Interned kind names; ``columns()["kind"]`` indexes this list."""
        return list(self._kinds)

    def _mask(self, round: int | None = None, direction: str | None = None,
              kind: str | None = None, src: int | None = None, dst: int | None = None,
              upto_round: int | None = None) -> np.ndarray | None:
        """Boolean mask of matching records, ``None`` for "all", or an empty mask."""
        n, c = self._n, self._cols
        mask = None

        def _and(m: np.ndarray) -> None:
            nonlocal mask
            mask = m if mask is None else (mask & m)

        if round is not None:
            _and(c["round"][:n] == round)
        if upto_round is not None:
            _and(c["round"][:n] <= upto_round)
        if direction is not None:
            _and(c["direction"][:n] == self._direction(direction))
        if kind is not None:
            code = self._kind_code.get(kind)
            _and(np.zeros(n, dtype=bool) if code is None else c["kind"][:n] == code)
        if src is not None:
            _and(c["src"][:n] == src)
        if dst is not None:
            _and(c["dst"][:n] == dst)
        return mask

    def _sum(self, mask: np.ndarray | None) -> Bytes:
        n, c = self._n, self._cols
        if mask is None:
            enc, dec, cnt = c["encoded"][:n].sum(), c["declared"][:n].sum(), n
        else:
            enc, dec = c["encoded"][:n][mask].sum(), c["declared"][:n][mask].sum()
            cnt = int(mask.sum())
        return {"encoded": int(enc), "declared": int(dec), "messages": int(cnt)}

    def totals(self, *, round: int | None = None, direction: str | None = None,
               kind: str | None = None, src: int | None = None,
               dst: int | None = None) -> tuple[int, int]:
        """``(encoded, declared)`` bytes of the records matching every given filter."""
        s = self._sum(self._mask(round, direction, kind, src, dst))
        return s["encoded"], s["declared"]

    def _by_direction(self, mask: np.ndarray | None) -> dict[str, Bytes]:
        dirs = self._cols["direction"][: self._n]
        out: dict[str, Bytes] = {}
        for name, code in _DIR_CODE.items():
            m = dirs == code
            out[name] = self._sum(m if mask is None else (m & mask))
        out["total"] = self._sum(mask)
        return out

    def per_round(self, round: int) -> dict[str, Bytes]:
        """Bytes of one round: ``{"up"|"down"|"peer"|"total": {"encoded", "declared", "messages"}}``."""
        return self._by_direction(self._mask(round=round))

    def cumulative(self, upto_round: int) -> dict[str, Bytes]:
        """As :meth:`per_round`, summed over every round ``<= upto_round``."""
        return self._by_direction(self._mask(upto_round=upto_round))

    def by_kind(self, *, round: int | None = None, direction: str | None = None,
                src: int | None = None, dst: int | None = None,
                upto_round: int | None = None) -> dict[str, Bytes]:
        """``{kind: {"encoded", "declared", "messages"}}`` over the matching records."""
        mask = self._mask(round, direction, None, src, dst, upto_round)
        kinds = self._cols["kind"][: self._n]
        out: dict[str, Bytes] = {}
        for code, name in enumerate(self._kinds):
            m = kinds == code
            s = self._sum(m if mask is None else (m & mask))
            if s["messages"]:
                out[name] = s
        return out

    # ------------------------------------------------------------------ checkpointing

    def state_dict(self) -> dict:
        """Plain dict of int64/uint8/int32 tensors, ints and a str list.

        Loadable with ``torch.load(..., weights_only=True)``.
        """
        state: dict = {"version": _STATE_VERSION, "n": self._n, "kinds": list(self._kinds)}
        for k, col in self._cols.items():
            state[k] = torch.from_numpy(col[: self._n].copy())
        return state

    def load_state_dict(self, state: dict) -> None:
        """Replace the contents with ``state`` (from :meth:`state_dict`)."""
        missing = [k for k in ("version", "n", "kinds", *_COLUMNS) if k not in state]
        if missing:
            raise ValueError(f"ledger state is missing keys {missing}")
        if state["version"] != _STATE_VERSION:
            raise ValueError(f"ledger state version {state['version']} is not {_STATE_VERSION}")
        n = int(state["n"])
        cols = {}
        for k, dt in _COLUMNS.items():
            t = state[k]
            arr = t.numpy() if isinstance(t, torch.Tensor) else np.asarray(t)
            if arr.shape != (n,):
                raise ValueError(f"ledger state column {k!r} has shape {arr.shape}, expected ({n},)")
            col = np.zeros(max(1, n), dtype=dt)
            col[:n] = arr
            cols[k] = col
        kinds = [str(s) for s in state["kinds"]]
        if n and (cols["kind"][:n].max() >= len(kinds) or cols["kind"][:n].min() < 0):
            raise ValueError("ledger state has kind codes outside its kinds list")
        if n and cols["direction"][:n].max() >= len(DIRECTIONS):
            raise ValueError("ledger state has unknown direction codes")
        self._cols, self._n = cols, n
        self._kinds = kinds
        self._kind_code = {s: i for i, s in enumerate(kinds)}
