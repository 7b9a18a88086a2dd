#!/usr/bin/env bash
# Every convolution pass of a config's training step on the GPU, worst first (`burnpose
# bench-conv`, docs/bench.md): GPU busy time per pass through CUPTI, TFLOP/s and GB/s.
# Here: `bash benches/gpu/pack.sh`. There, carrying ".gpu":
#   source .gpu/setup.sh && bash benches/gpu/conv.sh
# CONFIG (default the seed), BATCH, REPS; writes $OUT/conv${BATCH:+_b$BATCH}.md; ROUTINES (a list or "all") adds
# the comparison of CubeCL's implicit-GEMM routines ($OUT/routines.md), MATMUL_ROUTINES that of its
# matmul routines on the weight gradients ($OUT/matmul_routines.md); CONV=0 skips the table;
# EXTRA (bench-conv options, e.g. "--wgrad-chunk 256") is passed to every run.
set -u
. "$(dirname "$0")/cupti.sh"
CONFIG=${CONFIG:-configs/bench_seed.toml}
[ "${WARMUP:-1}" = 1 ] && timeout 200 burnpose warmup "$CONFIG" > "$OUT/conv_warmup.log" 2>&1; tail -1 "$OUT/conv_warmup.log"
md=$OUT/conv${BATCH:+_b$BATCH}.md
if [ "${CONV:-1}" = 1 ]; then
  timeout "${LIMIT:-200}" burnpose bench-conv "$CONFIG" --reps "${REPS:-20}" ${BATCH:+--batch "$BATCH"} ${EXTRA:-} \
    > "$md" 2>&1
  echo "bench-conv rc=$?"; cat "$md"
fi
if [ -n "${ROUTINES:-}" ]; then
  timeout "${LIMIT:-300}" burnpose bench-conv "$CONFIG" --reps "${REPS:-20}" ${BATCH:+--batch "$BATCH"} \
    --routines "$ROUTINES" ${EXTRA:-} > "$OUT/routines.md" 2>&1
  echo "bench-conv --routines rc=$?"; cat "$OUT/routines.md"
fi
if [ -n "${MATMUL_ROUTINES:-}" ]; then
  timeout "${LIMIT:-300}" burnpose bench-conv "$CONFIG" --reps "${REPS:-20}" ${BATCH:+--batch "$BATCH"} \
    --matmul-routines "$MATMUL_ROUTINES" ${EXTRA:-} > "$OUT/matmul_routines.md" 2>&1
  echo "bench-conv --matmul-routines rc=$?"; cat "$OUT/matmul_routines.md"
fi
