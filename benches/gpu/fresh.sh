#!/usr/bin/env bash
# Fits one config in fresh processes, one per entry of ARMS (each `--replay true|false`), and
# compares the state hashes each prints (model, EMA, optimizer, scheduler, scaler): every arm
# must print the same. Exit status 1 when any differs, a fit fails or a replay arm turned
# replay off.
# There, carrying ".gpu":  source .gpu/setup.sh && bash benches/gpu/fresh.sh
# Here (CPU, native only):  ARMS="false false" DEVICE=cpu bash benches/gpu/fresh.sh
set -u
CONFIG=${CONFIG:-configs/check_coco_odd.toml}; ARMS=${ARMS:-"true true false"}; LIMIT=${LIMIT:-300}
BIN=${BIN:-burnpose}
first=""; status=0
for r in $ARMS; do
  start=$(date +%s)
  out=$(timeout "$LIMIT" "$BIN" fit "$CONFIG" --replay "$r" ${DEVICE:+--device "$DEVICE"} 2>&1)
  rc=$?
  hashes=$(echo "$out" | grep -o "state hashes: .*")
  echo "replay=$r rc=$rc $(( $(date +%s) - start )) s: ${hashes:-no hashes}"
  if [ "$rc" -ne 0 ] || [ -z "$hashes" ]; then
    # The panic's message and its causes (a backtrace's tail says nothing), else the last lines.
    if echo "$out" | grep -q "panicked"; then
      echo "$out" | grep -v "^\s*$" | grep -A10 "panicked" | grep -v "acktrace" | head -12
    else
      echo "$out" | tail -5
    fi
    status=1; continue
  fi
  # What the recorder said (recordings again, retries for room); a replay arm that fell back
  # to native proves nothing about replay, though its hashes match.
  echo "$out" | grep -E "^step replay: no room|^feature replay off" | head -3
  if [ "$r" = true ] && echo "$out" | grep -q "^feature replay off"; then
    echo "replay=$r ran natively"; status=1; continue
  fi
  if [ -z "$first" ]; then first=$hashes
  elif [ "$hashes" != "$first" ]; then echo "DIFFERS from the first arm"; status=1; fi
done
[ "$status" -eq 0 ] && echo "all arms equal"
exit "$status"
