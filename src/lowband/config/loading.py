"""Reading a config: a TOML file, and ``section.key=value`` overrides on top of it.

Only the schema (:mod:`lowband.config.schema`) below it: what is read here is a raw dict,
validated by :func:`lowband.config.resolve.validate`.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from lowband.config.schema import ConfigError


def parse_override(item: str) -> tuple[list[str], Any]:
    """Parse ``section.key=value``; the value is read as a TOML value, else as a string."""
    if "=" not in item:
        raise ConfigError(f"override {item!r}: expected key=value, e.g. algorithm.lr=0.05")
    key, raw = item.split("=", 1)
    key = key.strip()
    if not key or any(not p for p in key.split(".")):
        raise ConfigError(f"override {item!r}: empty key; expected e.g. data.alpha=0.3")
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    return key.split("."), value


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``a.b=value`` overrides to a raw config dict (copy)."""
    import copy

    out = copy.deepcopy(raw)
    for item in overrides:
        path, value = parse_override(item)
        node = out
        for p in path[:-1]:
            nxt = node.setdefault(p, {})
            if not isinstance(nxt, dict):
                raise ConfigError(f"override {item!r}: {p!r} is a value, not a section")
            node = nxt
        node[path[-1]] = value
    return out


#: a config is a small text file; anything larger is not one (and is not read whole)
MAX_CONFIG_BYTES = 1 << 20


def load_toml(path: str | Path) -> dict[str, Any]:
    """Read a TOML file into a dict; a missing, unreadable, binary or malformed file is a
    one-line :class:`ConfigError` naming the file."""
    p = Path(path)
    if p.is_dir():
        raise ConfigError(f"config {p} is a folder; pass the path of a .toml file (see experiments/)")
    if not p.is_file():
        what = "not found" if not p.exists() else "not a regular file"
        raise ConfigError(f"config file {p} {what}; pass the path of a .toml file (see experiments/)")
    try:
        with open(p, "rb") as f:
            data = f.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"config file {p}: cannot read it ({exc.strerror or type(exc).__name__})") from None
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(f"config file {p} is larger than {MAX_CONFIG_BYTES // 1024} KiB; a config is a "
                          f"short TOML text (see experiments/)")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"config file {p} is not UTF-8 text (byte 0x{data[exc.start]:02x} at offset "
                          f"{exc.start}); a config is a TOML text file (see experiments/)") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{p}: not valid TOML: {str(exc).splitlines()[0]}") from None
    except RecursionError:
        raise ConfigError(f"{p}: not valid TOML: nested too deeply") from None
