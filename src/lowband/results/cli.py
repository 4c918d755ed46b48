"""``lowband record``: a run folder's record (:mod:`lowband.results.record`).

``lowband record import RUN [--commit HASH] [--store DIR --paper P --config CFG]`` writes
RUN/record.jsonl from the folder's files (a run made before records existed, or by another
tool); with ``--store`` it also files the record in the results store as CFG's record of
its seed. ``--commit`` names the code that made a run whose timing.jsonl does not (rounds
logged before the per-round commit existed). ``lowband record show FILE`` prints a
record's header and round count."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from lowband.results.record import RECORD_NAME, build_record, read_record, save


def cmd_record(args: argparse.Namespace) -> int:
    from lowband.config.schema import ConfigError

    if args.action == "show":
        rec = read_record(args.path)
        head = {k: v for k, v in rec.header.items() if k not in ("config", "summary", "hyperparams")}
        print(json.dumps(head, indent=1))
        print(f"{len(rec.rounds)} round lines, {len(rec.metrics)} evaluated")
        return 0
    rd = Path(args.path)
    if not (rd / "config.toml").is_file():
        raise ConfigError(f"{rd}: not a run folder (no config.toml); give the folder a run wrote")
    lines = build_record(rd, machine_of="import")
    if args.commit:
        for x in lines[1:]:
            x["commit"] = x.get("commit") or args.commit
        lines[0]["commits"] = sorted({str(x["commit"]) for x in lines[1:] if x.get("commit")})
    path = save(lines, rd / RECORD_NAME)
    print(f"wrote {path} ({path.stat().st_size:,} bytes, {len(lines) - 1} rounds)")
    if args.store:
        from lowband.results.store import Store

        if not (args.paper and args.config):
            raise ConfigError("--store needs --paper and --config (the config whose record this is)")
        print(f"stored {Store(args.store, args.paper).put_record(args.config, lines)}")
    return 0


def add_parser(sub: Any) -> None:
    """Register ``lowband record`` on the CLI's subparsers."""
    p = sub.add_parser("record", help="a run folder's record (JSON lines): import one, or show one")
    p.add_argument("action", choices=("import", "show"), help="import: write RUN/record.jsonl; show: print a record")
    p.add_argument("path", help="the run folder (import) or the record file (show)")
    p.add_argument("--commit", help="the commit of the code that made the run, for rounds whose timing does not say")
    p.add_argument("--store", help="also file the record in this results store (with --paper and --config)")
    p.add_argument("--paper", help="the paper the record belongs to in the store")
    p.add_argument("--config", help="the config whose record it is (experiments/PAPER/NAME.toml)")
    p.set_defaults(fn=cmd_record)
