"""Ultralytics' predict on a folder of images or a video, timed: the peer of `burnpose predict`
(docs/bench.md).

usage: python predict_peer.py SOURCE OUT_DIR [--batch 8] [--imgsz 640] [--device 0]

The model is YOLO26n-pose from its yaml (untrained: speed only). One blank image is predicted
first, outside the timing, so model setup and CUDA start are not counted; then every image (or
video frame) of SOURCE, annotated copies saved (as `burnpose predict` writes them; a video as
Ultralytics writes one on Linux, MJPG in .avi). Prints one JSON line.
"""

import argparse
import json
import time

import numpy as np
from ultralytics import YOLO


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("source")
    ap.add_argument("out")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--imgsz", type=int, default=640)
    ap.add_argument("--device", default="0")
    a = ap.parse_args()
    device = int(a.device) if a.device != "cpu" else "cpu"
    model = YOLO("yolo26n-pose.yaml")
    model.predict(np.zeros((a.imgsz, a.imgsz, 3), np.uint8), imgsz=a.imgsz, device=device,
                  verbose=False)
    images = detections = 0
    start = time.perf_counter()
    for r in model.predict(
        a.source,
        stream=True,
        save=True,
        batch=a.batch,
        imgsz=a.imgsz,
        device=device,
        project=a.out,
        name="peer",
        exist_ok=True,
        verbose=False,
    ):
        images += 1
        detections += len(r.boxes)
    seconds = time.perf_counter() - start
    print(json.dumps({"tool": "ultralytics", "images": images, "detections": detections,
                      "seconds": seconds, "images_per_s": images / seconds}))


if __name__ == "__main__":
    main()
