#!/usr/bin/env bash
# Variants of one config's post-warm-up step, alternating in fresh processes on one machine
# (docs/bench.md: compare variants in one sitting, never across days).
# VARIANTS: bench-step arguments of each variant, separated by '|'; ROUNDS: runs of each, in turn.
# Here: `bash benches/gpu/pack.sh`. There, carrying ".gpu":
#   source .gpu/setup.sh && burnpose warmup configs/bench_seed.toml &&
#   VARIANTS="--replay true|--replay true --wgrad-f32" bash benches/gpu/compare.sh
set -u
CONFIG=${CONFIG:-configs/bench_seed.toml}; ROUNDS=${ROUNDS:-2}; SKIP=${SKIP:-48}; STEPS=${STEPS:-64}
LIMIT=${LIMIT:-120}
IFS='|' read -ra variants <<< "${VARIANTS:?set VARIANTS}"
for r in $(seq 1 "$ROUNDS"); do
  for v in "${variants[@]}"; do
    echo "== round $r: $CONFIG $v"
    # shellcheck disable=SC2086 # a variant is a list of arguments
    timeout "$LIMIT" burnpose bench-step "$CONFIG" --skip "$SKIP" --steps "$STEPS" $v 2>&1 |
      grep -E "^bench-step|^peak in use within|^padding in use|^replay buffers|^recording, MiB|^recorded updates|accumulating only|rror|panick" | cut -c1-420
  done
done
