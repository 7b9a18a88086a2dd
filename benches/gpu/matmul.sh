#!/usr/bin/env bash
# The weight gradients' matmul routines (docs/kernels.md, "Matmul routines"), then the step:
# `bench-conv --matmul-routines` times MATMUL_ROUTINES on the heaviest TOP weight gradients of
# CONFIG; the routine with the lowest total per step among those that declined no product is then
# timed against the default in whole recorded steps, alternating (census, replay arm, ROUNDS
# rounds of default / best). STAGE=conv or STAGE=census runs one half (BEST names the routine).
# Here: `bash benches/gpu/pack.sh`. There, carrying ".gpu":
#   source .gpu/setup.sh && bash benches/gpu/matmul.sh
# Writes $OUT/matmul_routines.md, $OUT/matmul_census.md (the census tables of every run) and
# the first round's census archives ($OUT/census_<arm>.tgz: logs and per-kernel CSVs).
set -u
CONFIG=${CONFIG:-configs/bench_seed_step.toml}
here=$(dirname "$0")
best=${BEST:-}
if [ "${STAGE:-all}" != census ]; then
  CONV=0 WARMUP=0 REPS=${REPS:-10} LIMIT=${LIMIT:-300} EXTRA="--top ${TOP:-10} ${EXTRA:-}" \
    CONFIG=$CONFIG bash "$here/conv.sh"
  best=$(python3 - "$OUT/matmul_routines.md" <<'PY'
import sys
declined, names, totals = {}, [], []
for line in open(sys.argv[1]):
    if line.startswith("routine ") and ": done;" in line:
        declined[line.split()[1].rstrip(":")] = int(line.rsplit(":", 1)[1])
    cells = [c.strip() for c in line.strip().strip("|").split("|")]
    if line.startswith("| # |"):
        names = cells[6:-1]
    elif "ms per step" in cells:
        totals = [float(c) for c in cells[cells.index("ms per step") + 1:-1]]
# The first column is the routine in use; the best is another that ran every product itself.
rows = [(t, n) for n, t in zip(names, totals) if declined.get(n, 1) == 0]
if rows and names:
    t, n = min(rows)
    print(n if n != names[0] and t < totals[0] else "")
PY
)
  echo "best matmul routine: ${best:-none better than the default}"
fi
[ "${STAGE:-all}" = conv ] && exit 0
[ -z "$best" ] && exit 0
md=$OUT/matmul_census.md; : > "$md"
for round in $(seq "${ROUNDS:-2}"); do
  for arm in default "$best"; do
    extra=""; [ "$arm" != default ] && extra="--matmul-routine $arm"
    OUT=$OUT/m WARMUP=0 LAUNCH=0 SKIP=${SKIP:-8} STEPS=${STEPS:-12} CENSUS=${CENSUS:-2} ARMS=replay \
      CONFIG=$CONFIG EXTRA="$extra" bash "$here/census.sh" > "$OUT/m.log" 2>&1
    { echo "## round $round: $arm"; grep -E "rc=|^\| |^bench-step|rror|panick" "$OUT/m.log" | grep -v "^| phase"; } | tee -a "$md"
    # The per-kernel CSVs, for the next cut (at most 8 files come back).
    [ "$round" = 1 ] && mv "$OUT/m/census.tgz" "$OUT/census_${arm}.tgz" 2>/dev/null
  done
done
rm -rf "$OUT/m" "$OUT/m.log"
