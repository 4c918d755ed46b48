"""Turning a builder's ValueError into the one-line :class:`~lowband.config.ConfigError`
a user sees (``lowband run`` exits 2 with it)."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

from lowband.config.schema import ConfigError
from lowband.data.errors import PartitionError

__all__ = ["config_errors"]


@contextmanager
def config_errors(section: str) -> Iterator[None]:
    """Report a ValueError raised while building ``section`` as a one-line ConfigError."""
    try:
        yield
    except (ConfigError, PartitionError):
        raise
    except ValueError as exc:
        msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ConfigError(f"{section}: {msg}") from None
