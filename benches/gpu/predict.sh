#!/usr/bin/env bash
# `burnpose predict` beside Ultralytics' predict on the same images and machine (docs/bench.md):
# the seed benchmark's 384 built-in training images (640 px PNG), batch 8, annotated copies saved.
# Here: `bash benches/gpu/pack.sh`, `bash benches/peer/stage.sh`. There, carrying ".gpu" and ".whl":
#   source .gpu/setup.sh && bash benches/gpu/predict.sh
# Our checkpoint comes from a 16-step fit (`configs/bench_small.toml`); the peer's model is
# untrained: both measure speed only. Each tool runs twice, alternating; whole-process seconds.
set -u
work=$OUT/predict; mkdir -p "$work"
if ! python3 -c 'import ultralytics' 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export YOLO_OFFLINE=1
python3 -c 'import polars' 2>/dev/null || export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD/benches/peer/stub
burnpose export-yolo configs/bench_seed.toml /tmp/pdata > "$work/export.log" 2>&1
timeout 150 burnpose fit configs/bench_small.toml --name predict_ckpt > "$work/fit.log" 2>&1
echo "fit rc=$?"
ckpt=runs/predict_ckpt/last.safetensors
imgs=/tmp/pdata/images/train
for i in 1 2; do
  t0=$(date +%s.%N)
  timeout 200 burnpose predict "$ckpt" "$imgs" --out "/tmp/ours$i" --batch 8 > "$work/ours$i.log" 2>&1
  rc=$?; t1=$(date +%s.%N)
  echo "burnpose predict rc=$rc process $(awk "BEGIN{printf \"%.1f\", $t1-$t0}") s: $(grep "images/s" "$work/ours$i.log" | cut -c1-160)"
  t0=$(date +%s.%N)
  timeout 200 python3 benches/peer/predict_peer.py "$imgs" "/tmp/peer$i" --batch 8 > "$work/peer$i.log" 2>&1
  rc=$?; t1=$(date +%s.%N)
  echo "ultralytics predict rc=$rc process $(awk "BEGIN{printf \"%.1f\", $t1-$t0}") s: $(tail -1 "$work/peer$i.log" | cut -c1-200)"
done
# A video, when one is carried (made here: `python benches/peer/make_clip.py IMAGES .gpu/clip.mp4`;
# PyAV is not on the GPU machine): the same alternation, frames instead of images.
if [ -f .gpu/clip.mp4 ]; then
  for i in 1 2; do
    t0=$(date +%s.%N)
    timeout 200 burnpose predict "$ckpt" .gpu/clip.mp4 --out "/tmp/oursv$i" --imgsz 640 --batch 8 > "$work/oursv$i.log" 2>&1
    rc=$?; t1=$(date +%s.%N)
    echo "burnpose predict video rc=$rc process $(awk "BEGIN{printf \"%.1f\", $t1-$t0}") s: $(grep 'images/s' "$work/oursv$i.log" | cut -c1-160)"
    t0=$(date +%s.%N)
    timeout 200 python3 benches/peer/predict_peer.py .gpu/clip.mp4 "/tmp/peerv$i" --batch 8 > "$work/peerv$i.log" 2>&1
    rc=$?; t1=$(date +%s.%N)
    echo "ultralytics predict video rc=$rc process $(awk "BEGIN{printf \"%.1f\", $t1-$t0}") s: $(tail -1 "$work/peerv$i.log" | cut -c1-200)"
  done
fi
nproc; tar czf "$OUT/predict.tgz" -C "$OUT" predict && rm -rf "$work"
