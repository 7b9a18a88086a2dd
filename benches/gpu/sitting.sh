#!/usr/bin/env bash
# The seed benchmark in one sitting on the GPU machine: the Ultralytics peer, then `burnpose bench`
# (native/replay pairs) within a time budget, everything packed so that it comes back through the
# device tool (at most 8 files of 16 MiB each).
# Here: `bash benches/gpu/pack.sh` (stages .gpu), `bash benches/peer/stage.sh` (stages .whl).
# There, from the project root, carrying ".gpu" and ".whl" (and, to continue, the folder given as
# RESUME):
#   bash benches/gpu/sitting.sh                   # peer + 1 pair, 520 s budget
#   PAIRS=2 BUDGET=540 PEER=0 RESUME=seed bash benches/gpu/sitting.sh   # continue seed/ (copied back)
# Writes $OUT/sitting.tgz (peer json and logs, bench reports, logs, bench.md/csv when the pairs
# completed) and $OUT/kcache.tgz.part-aa, -ab, … (the kernel cache, split to pass the 16 MiB
# limit; here: `cat kcache.tgz.part-* > .gpu-cache/kcache.tgz`).
set -u
T0=$(date +%s)
BUDGET=${BUDGET:-520}; PAIRS=${PAIRS:-1}; PEER=${PEER:-1}; CONFIG=${CONFIG:-configs/bench_seed.toml}
left() { echo $((BUDGET - ($(date +%s) - T0))); }
work=$OUT/sitting; mkdir -p "$work"
if [ "$PEER" = 1 ]; then
  timeout 170 bash benches/peer/run.sh "$work/peer" > "$work/peer.log" 2>&1
  echo "peer rc=$? at $(($(date +%s) - T0)) s"; tail -2 "$work/peer.log"
  rm -rf "$work/peer/data" "$work/peer"/*/weights
fi
seed=$work/seed
args=()
mkdir -p "$seed"
if [ -n "${RESUME:-}" ]; then cp -r "$RESUME"/. "$seed"/; args+=(--resume); fi
peer_json=${PEER_JSON:-$work/peer/ultralytics.json}
[ -f "$peer_json" ] && args+=(--peer "$peer_json")
# UNSYNCED=1: the fits time their steps without device syncs (`bench --unsynced`: the pace).
[ "${UNSYNCED:-0}" = 1 ] && args+=(--unsynced)
# Leave ~40 s for packing; a cut bench keeps its completed fits (reports) for --resume.
timeout $(($(left) - 40)) burnpose bench "$CONFIG" --pairs "$PAIRS" --out "$seed" "${args[@]}" > "$work/bench.log" 2>&1
echo "bench rc=$? at $(($(date +%s) - T0)) s"
# Only bench's own children (they alone pass --report): a wider pattern would also match the
# device command that started this script, and end it.
pkill -f "burnpose fit .*--report" 2>/dev/null
grep -h "step median\|done:\|state hashes" "$seed"/logs/*.log 2>/dev/null | cut -c1-160
grep "^|" "$seed/bench.md" 2>/dev/null
tar czf "$OUT/sitting.tgz" -C "$OUT" sitting && rm -rf "$work"
tar czf - -C ~/.cache . | split -b 15m - "$OUT/kcache.tgz.part-"
ls -la "$OUT"
