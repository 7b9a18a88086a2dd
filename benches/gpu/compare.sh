#!/usr/bin/env bash
# Variants of one config's post-warm-up step, alternating in fresh processes on one machine
# (docs/bench.md: compare variants in one sitting, never across days).
# VARIANTS: bench-step arguments of each variant, separated by '|'; ROUNDS: runs of each, in turn.
# CENSUS=N (N > 0) then counts N steps of each variant once (`census.sh` with the variant, less
# its `--replay` and `--unsynced`, as EXTRA; ARMS=replay unless set; $OUT/census_<i>.tgz).
# BASE=1 runs every variant with the base binary too (`BASE_REV=<commit> DATA=0 bash
# benches/gpu/pack.sh` stages it in .gpu/base), base then new in each round.
# Here: `bash benches/gpu/pack.sh`. There, carrying ".gpu":
#   source .gpu/setup.sh && burnpose warmup configs/bench_seed.toml &&
#   VARIANTS="--replay true|--replay true --wgrad-f32" bash benches/gpu/compare.sh
set -u
CONFIG=${CONFIG:-configs/bench_seed.toml}; ROUNDS=${ROUNDS:-2}; SKIP=${SKIP:-48}; STEPS=${STEPS:-64}
LIMIT=${LIMIT:-120}
IFS='|' read -ra variants <<< "${VARIANTS:?set VARIANTS}"
bins=burnpose
if [ "${BASE:-0}" = 1 ]; then
  mkdir -p /tmp/base
  if command -v xz > /dev/null; then xz -dc .gpu/base/burnpose.xz > /tmp/base/burnpose; else
    python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' \
      .gpu/base/burnpose.xz /tmp/base/burnpose; fi
  chmod +x /tmp/base/burnpose
  bins="/tmp/base/burnpose burnpose"
fi
for r in $(seq 1 "$ROUNDS"); do
  for v in "${variants[@]}"; do
    for b in $bins; do
      echo "== round $r: $b $CONFIG $v"
      # shellcheck disable=SC2086 # a variant is a list of arguments
      timeout "$LIMIT" "$b" bench-step "$CONFIG" --skip "$SKIP" --steps "$STEPS" $v 2>&1 |
        grep -E "^bench-step|^unsynced|^peak in use within|^padding in use|^replay buffers|^recording, MiB|^recorded |^output-gradient|^input operands|accumulating only|rror|panick" | cut -c1-420
      # A run that timed out or failed says so (a fresh machine's first run compiles kernels).
      rc=${PIPESTATUS[0]}
      [ "$rc" -ne 0 ] && echo "bench-step rc=$rc$( [ "$rc" -eq 124 ] && echo " (LIMIT=$LIMIT s ran out)")"
    done
  done
done
if [ "${CENSUS:-0}" -gt 0 ]; then
  i=0
  for v in "${variants[@]}"; do
    i=$((i + 1)); mkdir -p "$OUT/c$i"
    extra=$(echo "$v" | sed -E 's/--replay (true|false)//; s/--unsynced [0-9]+//')
    echo "== census $i: $CONFIG $extra"
    OUT=$OUT/c$i WARMUP=0 LAUNCH=0 SKIP=${CSKIP:-8} STEPS=${CSTEPS:-12} CENSUS=$CENSUS \
      ARMS=${ARMS:-replay} CONFIG=$CONFIG EXTRA="$extra" bash "$(dirname "$0")/census.sh" |
      grep -E "^==|\*\*step|^\| (loss|features|feature backward) " | cut -c1-300
    [ -f "$OUT/c$i/census.tgz" ] && mv "$OUT/c$i/census.tgz" "$OUT/census_$i.tgz" && rmdir "$OUT/c$i" 2>/dev/null
  done
fi
