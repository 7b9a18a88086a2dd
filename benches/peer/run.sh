#!/usr/bin/env bash
# Peer run on the GPU machine: Ultralytics YOLO26n-pose on the same images as `burnpose bench`.
# The GPU machine has torch and torchvision but no network: download the wheels here first,
#   pip download ultralytics --no-deps -d benches/peer/wheels   (plus any missing dependency)
# and carry them. Then, from the project root on the GPU machine (after `source .gpu/setup.sh`):
#   bash benches/peer/run.sh OUT_DIR
set -euo pipefail
out=${1:-runs/peer}
mkdir -p "$out"
if ! python3 -c 'import ultralytics' 2>/dev/null; then
  pip install --no-index --find-links benches/peer/wheels ultralytics
fi
burnpose export-yolo configs/bench_seed.toml "$out/data"
start=$(date +%s.%N)
python3 benches/peer/ultralytics_pose.py "$out/data/data.yaml" "$out/ultralytics.json" --project "$out"
end=$(date +%s.%N)
python3 - "$out/ultralytics.json" "$start" "$end" <<'PY'
import json, sys
path, start, end = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
r = json.load(open(path)); r["process_s"] = end - start
json.dump(r, open(path, "w"), indent=1)
print(f"whole process {r['process_s']:.1f} s")
PY
