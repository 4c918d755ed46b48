"""The ServerApp and ClientApp of this Flower App: lowband's adapter, reading the run
config keys ``config`` (a TOML next to this file), ``overrides`` and ``out-dir``."""

from pathlib import Path

from lowband.flower import client_app, server_app

HERE = Path(__file__).resolve().parent

server = server_app(base_dir=HERE)
client = client_app(base_dir=HERE)
