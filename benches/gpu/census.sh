#!/usr/bin/env bash
# Launch census of the seed shape on the GPU machine (docs/bench.md, `bench-step --census`):
# the launch micro-benchmark, then per arm (native, replay) one bench-step that times steps with
# phase syncs and counts the next CENSUS steps through CUPTI. Every step is an optimizer step
# (`--batch $BATCH` sets nbs = BATCH, default 4) so the optimizer and EMA rows are those of a
# step that runs them; ARMS="native replay" (the default) picks the arms;
# ACCUM=1 adds one run per arm at the config's nbs (mostly accumulation-only steps);
# CONV_BN_OPS="fast staged" runs each arm with each `--conv-bn-ops` value, alternating.
# EXTRA="--strided-by-gemm" (any bench-step options) is passed to every run.
# Here: `bash benches/gpu/pack.sh`. There, carrying ".gpu":
#   source .gpu/setup.sh && bash benches/gpu/census.sh
# Writes $OUT/census.tgz (logs, per-kernel CSVs, each arm's last census step launch by launch
# in NAME.trace.csv) and prints the tables.
set -u
CONFIG=${CONFIG:-configs/bench_seed.toml}; SKIP=${SKIP:-16}; STEPS=${STEPS:-24}; CENSUS=${CENSUS:-4}
LIMIT=${LIMIT:-150}
work=$OUT/census; mkdir -p "$work"
. "$(dirname "$0")/cupti.sh"
[ "${WARMUP:-1}" = 1 ] && timeout 200 burnpose warmup "$CONFIG" > "$work/warmup.log" 2>&1; tail -1 "$work/warmup.log"
[ "${LAUNCH:-1}" = 1 ] && timeout 60 burnpose bench-launch --rounds 2 2>&1 | tee "$work/launch.log"
run() { # name, extra args
  local name=$1; shift
  timeout "$LIMIT" burnpose bench-step "$CONFIG" --skip "$SKIP" --steps "$STEPS" --phases \
    --census "$CENSUS" --census-csv "$work/$name.csv" \
    --census-trace "$work/$name.trace.csv" "$@" ${EXTRA:-} > "$work/$name.log" 2>&1
  echo "== $name rc=$?"; grep -E "^\||^bench-step|^phases|^host CPU|rror|panick" "$work/$name.log" | grep -v "^|---" | cut -c1-240
}
B=${BATCH:-4}
for k in ${CONV_BN_OPS:-fast}; do
  for arm in ${ARMS:-native replay}; do
    replay=false; [ "$arm" = replay ] && replay=true
    run "${arm}_$k" --replay "$replay" --batch "$B" --conv-bn-ops "$k"
  done
  if [ "${ACCUM:-0}" = 1 ]; then
    run "native_accum_$k" --replay false --conv-bn-ops "$k"
    run "replay_accum_$k" --replay true --conv-bn-ops "$k"
  fi
done
tar czf "$OUT/census.tgz" -C "$OUT" census && rm -rf "$work"
