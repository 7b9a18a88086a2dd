#!/usr/bin/env bash
# Feature replay vs native step time (issue: feature replay, target replay ≤ 0.6× native at b4),
# fresh processes alternating, plus one phase breakdown of each arm. Run on the GPU machine from
# the project root after `source .gpu/setup.sh`:
#   bash benches/gpu/replay_ratio.sh            # bench_small, BF16, 640 px, batch 4
# Env: CONFIG, BATCH, PAIRS, SKIP, STEPS, LIMIT (seconds per process), PHASES (0: no phase runs). Writes to $LOGS (default
# /tmp/replay_ratio): one log per run and summary.txt (median lines, in run order).
set -u
LOGS=${LOGS:-/tmp/replay_ratio}; mkdir -p "$LOGS"
CONFIG=${CONFIG:-configs/bench_small.toml}; BATCH=${BATCH:-4}; PAIRS=${PAIRS:-3}
SKIP=${SKIP:-16}; STEPS=${STEPS:-32}; LIMIT=${LIMIT:-150}
run() { # name replay extra...
  local name=$1 replay=$2; shift 2
  timeout "$LIMIT" burnpose bench-step "$CONFIG" --replay "$replay" --batch "$BATCH" \
    --skip "$SKIP" --steps "$STEPS" "$@" > "$LOGS/$name.log" 2>&1
  echo "$name rc=$? $(grep -h -E '^bench-step|^phases|^feature stage' "$LOGS/$name.log" | tr '\n' ' ')" \
    | tee -a "$LOGS/summary.txt"
}
for i in $(seq 1 "$PAIRS"); do
  run "native-$i" false
  run "replay-$i" true
done
if [ "${PHASES:-1}" != 0 ]; then
  run native-phases false --phases
  run replay-phases true --phases
fi
