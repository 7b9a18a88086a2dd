"""Ultralytics YOLO26n-pose trained from scratch on the images burnpose benchmarks, reporting the
same metrics as `burnpose bench` (a FitReport-like JSON): complete fit seconds, every training
step's wall time between two CUDA synchronisations, peak allocated/reserved memory, final mAP.

usage: python ultralytics_pose.py DATA_YAML REPORT_JSON [--epochs 5] [--batch 4] [--imgsz 640]
       [--device 0|cpu] [--nbs 64] [--workers 4] [--warmup-epochs 3.0] [--seed 123]
DATA_YAML comes from `burnpose export-yolo CONFIG DIR` (see run.sh and cpu_side_by_side.py). On
the CPU (`--device cpu`) AMP is off and steps are timed without synchronisation; the report adds
the process's CPU seconds and the final mAP50s.
"""
import argparse
import json
import resource
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
    ap.add_argument("--device", default="0")
    ap.add_argument("--nbs", type=int, default=64)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--warmup-epochs", type=float, default=3.0)
    a = ap.parse_args()
    cuda = a.device != "cpu"

    def sync():
        if cuda:
            torch.cuda.synchronize()

    model = YOLO("yolo26n-pose.yaml")  # architecture only: trained from scratch, like burnpose
    steps = []
    state = {}

    def batch_start(_trainer):
        sync()
        state["t"] = time.perf_counter()

    def batch_end(_trainer):
        sync()
        steps.append((time.perf_counter() - state["t"]) * 1e3)

    model.add_callback("on_train_batch_start", batch_start)
    model.add_callback("on_train_batch_end", batch_end)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    sync()
    cpu_start = resource.getrusage(resource.RUSAGE_SELF)
    start = time.perf_counter()
    results = model.train(
        data=a.data,
        epochs=a.epochs,
        batch=a.batch,
        imgsz=a.imgsz,
        seed=a.seed,
        amp=cuda,
        cache="ram",
        workers=a.workers,
        device=int(a.device) if cuda else "cpu",
        nbs=a.nbs,
        warmup_epochs=a.warmup_epochs,
        project=a.project,
        name="ultralytics",
        exist_ok=True,
        pretrained=False,
        plots=False,
    )
    sync()
    fit_s = time.perf_counter() - start
    cpu_end = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    metrics = getattr(results, "results_dict", {}) or {}
    report = {
        "tool": "ultralytics",
        "version": ultralytics.__version__,
        "fit_s": fit_s,
        "step_ms": steps,
        "peak_allocated_mib": torch.cuda.max_memory_allocated() / 2**20 if cuda else None,
        "peak_reserved_mib": torch.cuda.max_memory_reserved() / 2**20 if cuda else None,
        "box_map": metrics.get("metrics/mAP50-95(B)"),
        "pose_map": metrics.get("metrics/mAP50-95(P)"),
        "box_map50": metrics.get("metrics/mAP50(B)"),
        "pose_map50": metrics.get("metrics/mAP50(P)"),
        # This process's CPU during the fit (dataloader workers are children, counted at exit).
        "cpu_s": (cpu_end.ru_utime + cpu_end.ru_stime) - (cpu_start.ru_utime + cpu_start.ru_stime),
        "children_cpu_s": children.ru_utime + children.ru_stime,
    }
    with open(a.report, "w") as f:
        json.dump(report, f, indent=1)
    post = sorted(steps[64:])
    median = post[len(post) // 2] if post else float("nan")
    print(f"ultralytics: fit {fit_s:.1f} s, post-warm-up step median {median:.1f} ms over {len(post)} steps")


if __name__ == "__main__":
    main()
