"""Plugins: algorithms, models, datasets and codecs defined outside the package.

Two ways in, both without editing lowband:

- **A module or file**: ``lowband run cfg.toml --plugin my_alg.py`` (or ``--plugin
  mypkg.fl``), ``lb.load_plugin("my_alg.py")`` from Python. The module registers what it
  defines when imported (``@register`` on an Algorithm class, or the ``register_*``
  functions below).
- **Entry points** of an installed distribution, loaded by the CLI and the Python API on
  first use. Groups: ``lowband.algorithms``, ``lowband.models``, ``lowband.datasets``,
  ``lowband.codecs``. An entry point may name a module (importing it registers its
  contents) or an object: an Algorithm class (registered under its ``name``), a model
  builder, a dataset loader or a codec maker (registered under the entry point's name)::

      [project.entry-points."lowband.algorithms"]
      fedavgm = "my_fl.fedavgm:FedAvgM"
      [project.entry-points."lowband.models"]
      tiny_mlp = "my_fl.models:build_tiny_mlp"

The specs of loaded plugin files/modules are remembered (:data:`LOADED`) so that worker
processes (``--seeds``, ``lowband sweep``) load the same ones.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import logging
import sys
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Iterable, Optional

from lowband.config.schema import ConfigError

log = logging.getLogger("lowband")

GROUPS = {"algorithms": "lowband.algorithms", "models": "lowband.models", "datasets": "lowband.datasets",
          "codecs": "lowband.codecs"}

#: plugin specs loaded in this process (absolute file paths or module names), in order
LOADED: list[str] = []
_MODULES: dict[str, ModuleType] = {}
_ENTRY_POINTS_LOADED = False


class PluginError(ConfigError):
    """A plugin that cannot be loaded (one line; the CLI exits with 2)."""


# --------------------------------------------------------------------------- registering


def register_algorithm(cls: type) -> type:
    """Register an :class:`~lowband.algorithms.base.Algorithm` subclass under ``cls.name``
    (the same as the ``@register`` decorator)."""
    from lowband.algorithms.base import register

    return register(cls)


def register_model(name: str, builder: Callable[..., Any], *, description: str = "", inputs: str = "any") -> Any:
    """Register a model builder ``builder(num_classes, input_shape, **options) -> nn.Module``."""
    from lowband.models.registry import register_model as reg

    return reg(name, builder, description=description, inputs=inputs)  # type: ignore[arg-type]


def register_dataset(name: str, loader: Callable[..., Any], *, description: str = "",
                     options: Optional[dict[str, Any]] = None) -> Any:
    """Register a dataset loader ``loader(**options) -> dict`` of Dataset fields (see
    :func:`lowband.data.sources.register_dataset`)."""
    from lowband.data.sources import register_dataset as reg

    return reg(name, loader, description=description, options=options)


def register_codec(name: str, maker: Callable[..., Any], description: str = "") -> None:
    """Register a codec maker ``maker(*args) -> Codec`` under ``name`` (see
    :func:`lowband.comm.codecs.register_codec`)."""
    from lowband.comm.codecs import register_codec as reg

    reg(name, maker, description)


# --------------------------------------------------------------------------- loading


def load_plugin(spec: str | Path) -> ModuleType:
    """Import a plugin: a path to a ``.py`` file (or a package folder) or a module name.

    Idempotent: a file or module already loaded is not imported twice. Raises
    :class:`PluginError` (one line) when it cannot be found or fails to import.
    """
    key, module = _import(spec)
    if key not in LOADED:
        LOADED.append(key)
        log.debug("loaded plugin %s", key)
    return module


def _import(spec: str | Path) -> tuple[str, ModuleType]:
    s = str(spec)
    path = Path(s).expanduser()
    looks_like_path = s.endswith(".py") or "/" in s or "\\" in s or path.exists()
    if looks_like_path:
        if path.is_dir():
            path = path / "__init__.py"
        if not path.is_file():
            raise PluginError(f"plugin {s!r}: no such file; pass a .py file, a package folder or a module name")
        key = str(path.resolve())
        if key in _MODULES:
            return key, _MODULES[key]
        name = "lowband_plugin_" + path.stem + "_" + hashlib.sha1(key.encode()).hexdigest()[:8]
        if path.name == "__init__.py":
            name = path.parent.name
        mspec = importlib.util.spec_from_file_location(
            name, path, submodule_search_locations=[str(path.parent)] if path.name == "__init__.py" else None)
        if mspec is None or mspec.loader is None:
            raise PluginError(f"plugin {s!r}: cannot import {path}")
        module = importlib.util.module_from_spec(mspec)
        sys.modules[name] = module
        try:
            mspec.loader.exec_module(module)
        except Exception as exc:
            sys.modules.pop(name, None)
            raise PluginError(f"plugin {path}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}") \
                from exc
        _pickle_by_value(module)
    else:
        key = s
        if key in _MODULES:
            return key, _MODULES[key]
        try:
            module = importlib.import_module(s)
        except ModuleNotFoundError as exc:
            if exc.name and s.startswith(exc.name):
                raise PluginError(f"plugin {s!r}: no module named {exc.name!r} (is it installed, or on PYTHONPATH?); "
                                  f"or pass the path of a .py file") from None
            raise PluginError(f"plugin {s!r}: {exc}") from exc
        except Exception as exc:
            raise PluginError(f"plugin {s!r}: {type(exc).__name__}: {exc}") from exc
    _MODULES[key] = module
    return key, module


def _pickle_by_value(module: ModuleType) -> None:
    """A file plugin is not importable by name in other processes: let Ray's cloudpickle
    ship its classes by value (a Ray executor pickles the algorithm object)."""
    try:
        import cloudpickle
    except ImportError:
        return
    try:
        cloudpickle.register_pickle_by_value(module)
    except Exception:  # noqa: BLE001 - best effort; only matters for executor = "ray"
        pass


def load_plugins(specs: Iterable[str | Path]) -> None:
    for s in specs:
        load_plugin(s)


def load_entry_points(force: bool = False) -> list[str]:
    """Load every installed ``lowband.*`` entry point (once per process). A broken entry
    point is reported as a warning and skipped. Returns the names loaded."""
    global _ENTRY_POINTS_LOADED
    if _ENTRY_POINTS_LOADED and not force:
        return []
    _ENTRY_POINTS_LOADED = True
    from importlib.metadata import entry_points

    done = []
    for kind, group in GROUPS.items():
        for ep in entry_points(group=group):
            try:
                _register_entry_point(kind, ep.name, ep.load())
                done.append(f"{group}:{ep.name}")
            except Exception as exc:  # noqa: BLE001 - one bad plugin must not break every command
                log.warning("plugin entry point %s = %s not loaded: %s: %s", ep.name, ep.value,
                            type(exc).__name__, str(exc).splitlines()[0] if str(exc) else "")
    return done


def _register_entry_point(kind: str, name: str, obj: Any) -> None:
    if inspect.ismodule(obj):
        return  # importing it registered its contents
    if kind == "algorithms":
        from lowband.algorithms import ALGORITHMS

        if getattr(obj, "name", None) in ALGORITHMS and ALGORITHMS[obj.name] is obj:
            return
        register_algorithm(obj)
    elif kind == "models":
        register_model(name, obj)
    elif kind == "datasets":
        register_dataset(name, obj)
    elif kind == "codecs":
        register_codec(name, obj)


__all__ = ["GROUPS", "LOADED", "PluginError", "load_entry_points", "load_plugin", "load_plugins",
           "register_algorithm", "register_codec", "register_dataset", "register_model"]
