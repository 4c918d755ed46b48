"""Convert a FedScale-style availability trace (JSON) to lowband's CSV (node,start_s,end_s).

    python experiments/devices/convert_fedscale.py client_behave_trace.json out.csv [--clients N]

The input layout and the mapping (clients in ascending id order become nodes 0..n-1; each
client's cycle repeated up to the longest finish_time, which is printed as the period to
set in ``[devices.availability] period_s``) are in :mod:`lowband.devices.traces`.
"""

from __future__ import annotations

import argparse
import sys

from lowband.devices.traces import from_fedscale, read_fedscale_json, write_availability_trace


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace", help="FedScale client_behave_trace as JSON {client_id: {active, inactive, finish_time}}")
    ap.add_argument("out", help="the CSV to write (node,start_s,end_s)")
    ap.add_argument("--clients", type=int, default=None, help="keep the first N clients (by id)")
    args = ap.parse_args(argv)
    try:
        windows, period = from_fedscale(read_fedscale_json(args.trace), args.clients)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    write_availability_trace(args.out, windows)
    print(f"{len(windows)} nodes, period_s = {period:g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
