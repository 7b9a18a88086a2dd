#!/usr/bin/env bash
# `replay.defer_readback` (docs/replay.md, "Reading a step late") against reading at once, in
# unsynced steps: `bench-step CONFIG --replay true --skip SKIP --steps STEPS --unsynced UNSYNCED
# --defer-readback false|true`, alternating for ROUNDS rounds (default 2), each run in a fresh
# process; then one census of the recorded step for its GPU busy time (CENSUS=0 skips it).
# Here: `bash benches/gpu/pack.sh`. There, carrying ".gpu":
#   source .gpu/setup.sh && bash benches/gpu/late.sh
# Prints each run's summary and unsynced pace; writes $OUT/late.md and, with the census,
# $OUT/census.tgz.
set -u
CONFIG=${CONFIG:-configs/bench_seed_step.toml}
here=$(dirname "$0")
md=$OUT/late.md; : > "$md"
[ "${WARMUP:-1}" = 1 ] && timeout 200 burnpose warmup "$CONFIG" > "$OUT/late_warmup.log" 2>&1
for round in $(seq "${ROUNDS:-2}"); do
  for defer in false true; do
    timeout "${LIMIT:-150}" burnpose bench-step "$CONFIG" --replay true --skip "${SKIP:-8}" \
      --steps "${STEPS:-12}" --unsynced "${UNSYNCED:-48}" --defer-readback "$defer" ${EXTRA:-} \
      > "$OUT/late.log" 2>&1
    echo "== round $round, defer_readback=$defer rc=$?" | tee -a "$md"
    grep -E "^bench-step|^unsynced|^steps |rror|panick" "$OUT/late.log" | cut -c1-300 | tee -a "$md"
  done
done
rm -f "$OUT/late.log"
if [ "${CENSUS:-2}" != 0 ]; then
  WARMUP=0 LAUNCH=0 SKIP=${SKIP:-8} STEPS=${STEPS:-12} CENSUS=${CENSUS:-2} ARMS=replay \
    CONFIG=$CONFIG bash "$here/census.sh" | grep -E "^==|\*\*step|^\| loss" | tee -a "$md"
fi
