"""Flower adapter (extra ``lowband[flower]``): run a lowband server-round algorithm as a
Flower ServerApp / ClientApp pair, in Flower's simulation runtime or on real machines
with a SuperLink and SuperNodes. See :mod:`lowband.flower.adapter` and docs/scale.md.

    from lowband.flower import client_app, server_app
    client = client_app(base_dir=Path(__file__).parent)   # reads run config "config", "overrides"
    server = server_app(base_dir=Path(__file__).parent)
"""

try:
    import flwr  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the optional extra
    raise ImportError(f"lowband.flower needs Flower ({exc}); install it with pip install 'lowband[flower]'") from None

from lowband.flower.adapter import EVAL_PROTOCOLS, FlowerRun, client_app, experiment_from_run_config, server_app

__all__ = ["EVAL_PROTOCOLS", "FlowerRun", "client_app", "experiment_from_run_config", "server_app"]
