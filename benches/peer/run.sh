#!/usr/bin/env bash
# Peer run on the GPU machine: Ultralytics YOLO26n-pose on the same images as `burnpose bench`.
# The GPU machine has torch and torchvision but no network: run benches/peer/stage.sh here first
# and carry ".whl" (and ".gpu" for burnpose). Then, from the project root on the GPU machine
# (after `source .gpu/setup.sh`):
#   bash benches/peer/run.sh OUT_DIR        (BATCH=16 for the batch-16 table; default 4)
set -euo pipefail
out=${1:-runs/peer}
mkdir -p "$out"
if ! python3 -c 'import ultralytics' 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export YOLO_OFFLINE=1  # no network there: skip downloads and online checks
python3 -c 'import polars' 2>/dev/null || export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD/benches/peer/stub
python3 -c 'import ultralytics; print("ultralytics", ultralytics.__version__)' 
burnpose export-yolo configs/bench_seed.toml "$out/data"
start=$(date +%s.%N)
python3 benches/peer/ultralytics_pose.py "$out/data/data.yaml" "$out/ultralytics.json" --project "$out" \
  --batch "${BATCH:-4}"
end=$(date +%s.%N)
python3 - "$out/ultralytics.json" "$start" "$end" <<'PY'
import json, sys
path, start, end = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
r = json.load(open(path)); r["process_s"] = end - start
json.dump(r, open(path, "w"), indent=1)
print(f"whole process {r['process_s']:.1f} s")
PY
