"""Ultralytics YOLO26n-pose trained from scratch on the images burnpose benchmarks, reporting the
same metrics as `burnpose bench` (a FitReport-like JSON): complete fit seconds, every training
step's wall time between two CUDA synchronisations, peak allocated/reserved memory, final mAP.

usage: python ultralytics_pose.py DATA_YAML REPORT_JSON [--epochs 5] [--batch 4] [--imgsz 640]
DATA_YAML comes from `burnpose export-yolo configs/bench_seed.toml DIR` (see run.sh).
"""
import argparse
import json
import time

import torch
import ultralytics
from ultralytics import YOLO


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("data")
    ap.add_argument("report")
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--imgsz", type=int, default=640)
    ap.add_argument("--seed", type=int, default=123)
    ap.add_argument("--project", default="runs/peer")
    a = ap.parse_args()

    model = YOLO("yolo26n-pose.yaml")  # architecture only: trained from scratch, like burnpose
    steps = []
    state = {}

    def batch_start(_trainer):
        torch.cuda.synchronize()
        state["t"] = time.perf_counter()

    def batch_end(_trainer):
        torch.cuda.synchronize()
        steps.append((time.perf_counter() - state["t"]) * 1e3)

    model.add_callback("on_train_batch_start", batch_start)
    model.add_callback("on_train_batch_end", batch_end)
    torch.cuda.reset_peak_memory_stats()
    torch.cuda.synchronize()
    start = time.perf_counter()
    results = model.train(
        data=a.data,
        epochs=a.epochs,
        batch=a.batch,
        imgsz=a.imgsz,
        seed=a.seed,
        amp=True,
        cache="ram",
        workers=4,
        device=0,
        project=a.project,
        name="ultralytics",
        exist_ok=True,
        pretrained=False,
        plots=False,
    )
    torch.cuda.synchronize()
    fit_s = time.perf_counter() - start
    metrics = getattr(results, "results_dict", {}) or {}
    report = {
        "tool": "ultralytics",
        "version": ultralytics.__version__,
        "fit_s": fit_s,
        "step_ms": steps,
        "peak_allocated_mib": torch.cuda.max_memory_allocated() / 2**20,
        "peak_reserved_mib": torch.cuda.max_memory_reserved() / 2**20,
        "box_map": metrics.get("metrics/mAP50-95(B)"),
        "pose_map": metrics.get("metrics/mAP50-95(P)"),
    }
    with open(a.report, "w") as f:
        json.dump(report, f, indent=1)
    post = sorted(steps[64:])
    median = post[len(post) // 2] if post else float("nan")
    print(f"ultralytics: fit {fit_s:.1f} s, post-warm-up step median {median:.1f} ms over {len(post)} steps")


if __name__ == "__main__":
    main()
