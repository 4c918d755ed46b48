#!/usr/bin/env bash
# The four Shakespeare runs of docs/results/natural.md, one after another; rerunning the script
# resumes an interrupted run from its checkpoint. Usage (from the repository root):
#   LOWBAND_DATA=../shared/data experiments/natural/run_shakespeare.sh [out_root] [suffix]
# A suffix of _e5 runs the four 5-local-epoch configs (shakespeare_*_e5.toml) instead.
set -euo pipefail
root="${1:-runs/natural}"
suffix="${2:-}"
lowband="${LOWBAND:-lowband}"
for base in shakespeare_fedavg shakespeare_fedavg_qsgd4 shakespeare_fedavg_ef_topk shakespeare_fedadam; do
  name="$base$suffix"
  out="$root/$name"
  resume=()
  [ -f "$out/config.toml" ] && resume=(--resume)
  [ -f "$out/summary.json" ] && { echo "done: $out"; continue; }
  echo "$(date -u +%FT%TZ) start $name"
  "$lowband" run "experiments/natural/$name.toml" "out_dir=\"$out\"" "${resume[@]}"
  echo "$(date -u +%FT%TZ) end $name"
done
