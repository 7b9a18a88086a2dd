#!/usr/bin/env bash
# Cold- and warm-cache time to first training step on CUDA (docs/perf_log.md, cold-start issue).
# Run on the GPU machine from the project root after `source .gpu/setup.sh`:
#   bash benches/gpu/coldstart.sh            # batch 4, 640 px, 6 steps
# Env: B (batch), S (image size), STEPS, COLD_LIMIT (seconds allowed for the cold run).
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
rm -rf ~/.cache/cubecl
run cold "$COLD_LIMIT"
run warm 300
for f in cold warm; do
  echo "== $f: $(grep -c . "$OUT/compile-$f.log" 2>/dev/null) log lines"
  grep -E "^device|^step|exit|Elapsed|Maximum resident|cache_bytes" "$OUT/$f.txt"
done
