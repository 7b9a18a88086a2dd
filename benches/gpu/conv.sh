#!/usr/bin/env bash
# Every convolution pass of a config's training step on the GPU, worst first (`burnpose
# bench-conv`, docs/bench.md): GPU busy time per pass through CUPTI, TFLOP/s and GB/s.
# Here: `bash benches/gpu/pack.sh`. There, carrying ".gpu":
#   source .gpu/setup.sh && bash benches/gpu/conv.sh
# CONFIG (default the seed), BATCH, REPS; writes $OUT/conv${BATCH:+_b$BATCH}.md; ROUTINES (a list or "all") adds
# the comparison of CubeCL's implicit-GEMM routines ($OUT/routines.md).
set -u
. "$(dirname "$0")/cupti.sh"
CONFIG=${CONFIG:-configs/bench_seed.toml}
[ "${WARMUP:-1}" = 1 ] && timeout 200 burnpose warmup "$CONFIG" > "$OUT/conv_warmup.log" 2>&1; tail -1 "$OUT/conv_warmup.log"
md=$OUT/conv${BATCH:+_b$BATCH}.md
timeout "${LIMIT:-200}" burnpose bench-conv "$CONFIG" --reps "${REPS:-20}" ${BATCH:+--batch "$BATCH"} \
  > "$md" 2>&1
echo "bench-conv rc=$?"; cat "$md"
if [ -n "${ROUTINES:-}" ]; then
  timeout "${LIMIT:-300}" burnpose bench-conv "$CONFIG" --reps "${REPS:-20}" ${BATCH:+--batch "$BATCH"} \
    --routines "$ROUTINES" > "$OUT/routines.md" 2>&1
  echo "bench-conv --routines rc=$?"; cat "$OUT/routines.md"
fi
