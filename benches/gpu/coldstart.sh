#!/usr/bin/env bash
# Cold- and warm-cache time to first training step on CUDA (docs/perf_log.md, cold-start issue).
# Run on the GPU machine from the project root after `source .gpu/setup.sh`:
#   bash benches/gpu/coldstart.sh            # batch 4, 640 px, 6 steps
#   FIT="0 8" bash benches/gpu/coldstart.sh  # then `burnpose fit CONFIG` up to its first step on
#                                            # an empty cache, with device.compile_workers 0 and 8
# Env: B (batch), S (image size), STEPS, COLD_LIMIT (seconds allowed for the cold run), SMOKE=0
# (skip the smoke runs), FIT (compile_workers values), CONFIG (default configs/bench_seed.toml).
# Writes to $LOGS (default /tmp/coldstart): cold.txt / warm.txt (smoke output + /usr/bin/time), compile-*.log (one entry
# per kernel CubeCL compiled), cache sizes.
set -u
OUT=${LOGS:-/tmp/coldstart}; mkdir -p "$OUT"
B=${B:-4}; S=${S:-640}; STEPS=${STEPS:-6}; COLD_LIMIT=${COLD_LIMIT:-420}
run() { # name limit
  cat > cubecl.toml <<TOML
[compilation.logger]
level = "basic"
file = "$OUT/compile-$1.log"
append = false
TOML
  local t0; t0=$(date +%s%N)
  timeout "$2" /usr/bin/time -v burnpose smoke --device cuda --batch "$B" --imgsz "$S" \
    --steps "$STEPS" > "$OUT/$1.txt" 2>&1
  echo "exit $? process_wall_ms $(( ($(date +%s%N) - t0) / 1000000 ))" >> "$OUT/$1.txt"
  echo "cache_bytes $(du -sb ~/.cache/cubecl 2>/dev/null | cut -f1)" >> "$OUT/$1.txt"
  rm -f cubecl.toml
}
if [ "${SMOKE:-1}" = 1 ]; then
  rm -rf ~/.cache/cubecl
  run cold "$COLD_LIMIT"
  run warm 300
  for f in cold warm; do
    echo "== $f: $(grep -c . "$OUT/compile-$f.log" 2>/dev/null) log lines"
    grep -E "^device|^step|exit|Elapsed|Maximum resident|cache_bytes" "$OUT/$f.txt"
  done
fi
CONFIG=${CONFIG:-configs/bench_seed.toml}
for w in ${FIT:-}; do # a fit up to its first step, empty cache, w compile workers
  cfg=/tmp/coldstart-w$w.toml log=$OUT/fit-w$w.txt
  sed "s/^kind = \"cuda\"/kind = \"cuda\"\ncompile_workers = $w/" "$CONFIG" > "$cfg"
  rm -rf ~/.cache/cubecl ~/.cache/burnpose
  t0=$(date +%s)
  burnpose fit "$cfg" --name "coldstart-w$w" > "$log" 2>&1 &
  pid=$!
  until grep -q "first step done" "$log" || ! kill -0 "$pid" 2>/dev/null \
    || [ $(($(date +%s) - t0)) -gt "$COLD_LIMIT" ]; do sleep 0.5; done
  kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null
  echo "== fit, compile_workers $w:"
  tr '\r' '\n' < "$log" | grep -E "convolutions' kernels|kernels compiled in|stopped|first step done|rror"
done
