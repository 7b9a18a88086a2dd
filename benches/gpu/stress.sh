#!/usr/bin/env bash
# Runs GPU tests again and again in fresh processes and counts failures: for parity that fails
# once in many runs (docs/perf_log.md AM2). With TESTS_OLD set (a second test binary, e.g. the
# main branch's, unpacked from .gpu/old), the two binaries alternate, so a failure rate can be
# pinned on a change. Each argument of TESTS is one `--exact` test name.
# There, carrying ".gpu":  source .gpu/setup.sh && N=20 TESTS="step::detection_step_replay_matches_native_fp32" bash benches/gpu/stress.sh
# Failed runs' output goes to $OUT/stress/.
set -u
N=${N:-10}; LIMIT=${LIMIT:-120}
mkdir -p "$OUT/stress"
declare -A runs fails
for i in $(seq 1 "$N"); do
  for arm in new ${TESTS_OLD:+old}; do
    bin=$T; [ "$arm" = old ] && bin=$TESTS_OLD
    for t in $TESTS; do
      log=$OUT/stress/$arm-$i-${t//:/_}.log
      if timeout "$LIMIT" "$bin" --ignored --exact "$t" > "$log" 2>&1; then rm -f "$log"
      else fails[$arm $t]=$(( ${fails[$arm $t]:-0} + 1 )); fi
      runs[$arm $t]=$(( ${runs[$arm $t]:-0} + 1 ))
    done
  done
done
for k in "${!runs[@]}"; do echo "$k: ${fails[$k]:-0} failed of ${runs[$k]}"; done | sort
