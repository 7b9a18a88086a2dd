#!/usr/bin/env bash
# `burnpose predict` beside Ultralytics' predict on this machine's CPU (docs/bench.md): real COCO
# photos (../shared/data/pose-real/pose_minicoco, its 30 train2017 images) and a 100-frame H.264 video made
# from them (benches/peer/make_clip.py: 640×360, 25 fps, High profile with B-frames), 640 px,
# batch 8, annotated copies written. Each tool twice per source, alternating, in fresh processes.
# Our checkpoint comes from a few-step CPU fit and the peer's model is untrained from its yaml:
# both measure speed, not accuracy.
# usage, from the project root (the venv as in docs/bench.md "On the CPU", plus `pip install av`):
#   PY=~/peer-venv/bin/python BIN=target/release/burnpose bash benches/peer/cpu_predict.sh
set -euo pipefail
PY=${PY:-python3}; BIN=${BIN:-target/release/burnpose}
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
images=../shared/data/pose-real/pose_minicoco/images/train2017
export YOLO_OFFLINE=1 YOLO_CONFIG_DIR=$work/yolo
mkdir -p "$YOLO_CONFIG_DIR/Ultralytics"
font=$(fc-list 2>/dev/null | head -1 | cut -d: -f1 || true)
[ -n "$font" ] && cp "$font" "$YOLO_CONFIG_DIR/Ultralytics/Arial.ttf"
"$PY" benches/peer/make_clip.py "$images" "$work/clip.mp4"
cat > "$work/tiny.toml" <<TOML
[data]
imgsz = 64
train_images = 6
val_images = 3
workers = 0
[train]
epochs = 1
batch = 2
nbs = 2
[device]
kind = "cpu"
[output]
dir = "$work/runs"
name = "fit"
TOML
"$BIN" fit "$work/tiny.toml" > "$work/fit.log" 2>&1
ckpt=$work/runs/fit/last.safetensors
echo "cores: $(nproc)"
for source in "$images" "$work/clip.mp4"; do
  for i in 1 2; do
    t0=$(date +%s.%N)
    "$BIN" predict "$ckpt" "$source" --out "$work/ours$i" --imgsz 640 --batch 8 --device cpu \
      > "$work/ours.log" 2>&1
    t1=$(date +%s.%N)
    echo "burnpose    $(basename "$source"): process $(awk "BEGIN{printf \"%.1f\", $t1-$t0}") s; $(grep -E 'images/s' "$work/ours.log" | cut -c1-150)"
    rm -rf "$work/ours$i"
    t0=$(date +%s.%N)
    "$PY" benches/peer/predict_peer.py "$source" "$work/peer$i" --batch 8 --imgsz 640 \
      --device cpu > "$work/peer.log" 2>&1
    t1=$(date +%s.%N)
    echo "ultralytics $(basename "$source"): process $(awk "BEGIN{printf \"%.1f\", $t1-$t0}") s; $(tail -1 "$work/peer.log")"
    rm -rf "$work/peer$i"
  done
done
