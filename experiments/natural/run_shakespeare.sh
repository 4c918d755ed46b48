#!/usr/bin/env bash
# The four Shakespeare runs of docs/results/natural.md, one after another; rerunning the script
# resumes an interrupted run from its checkpoint. Usage (from the repository root):
#   LOWBAND_DATA=../shared/data experiments/natural/run_shakespeare.sh [out_root]
set -euo pipefail
root="${1:-runs/natural}"
lowband="${LOWBAND:-lowband}"
for name in shakespeare_fedavg shakespeare_fedavg_qsgd4 shakespeare_fedavg_ef_topk shakespeare_fedadam; do
  out="$root/$name"
  resume=()
  [ -f "$out/config.toml" ] && resume=(--resume)
  [ -f "$out/summary.json" ] && { echo "done: $out"; continue; }
  echo "$(date -u +%FT%TZ) start $name"
  "$lowband" run "experiments/natural/$name.toml" "out_dir=\"$out\"" "${resume[@]}"
  echo "$(date -u +%FT%TZ) end $name"
done
