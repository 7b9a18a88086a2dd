"""Fixture for the Ultralytics-metric test (src/eval/ultralytics.rs, docs/training.md "Validation").

Draws seeded validation scenes (images with and without ground truth, ground truth tied for a detection, detections near the truth
with jittered boxes and keypoints, duplicates, wrong classes, false positives, a class with ground
truth and no detections and one with detections and no ground truth) and scores them with
Ultralytics' own code: `PoseValidator._process_batch` (box IoU, OKS with the 0.53 box-area scale,
`match_predictions`) per image, then `PoseMetrics` (`ap_per_class`) over all of them. Writes one
JSON file with the inputs, each image's IoU/OKS matrices and true-positive tables, the per-class
AP tables and the summary mAPs, for the nk = 17 (COCO sigmas) and nk = 4 (1/nk sigmas) cases.

Confidences are distinct (numpy's argsort is not stable: equal confidences would make the order,
and so the AP, depend on the sort's implementation).

With the peer venv (docs/bench.md, "On the CPU"), offline:
    YOLO_OFFLINE=1 YOLO_CONFIG_DIR=DIR python benches/peer/metric_fixtures.py \
        tests/fixtures/ultralytics_metric.json
"""

import json
import sys

import numpy as np
import torch
import ultralytics
from ultralytics.models.yolo.pose import PoseValidator
from ultralytics.utils import ops
from ultralytics.utils.metrics import OKS_SIGMA, PoseMetrics, box_iou, kpt_iou

W, H = 320.0, 256.0


def f32(a):
    return np.asarray(a, dtype=np.float32)


def scene(rng, nk, nc, n_images):
    images = []
    confs = rng.permutation(np.arange(1, 4000))[: n_images * 40] / 4000.0  # distinct
    ci = 0
    for im in range(n_images):
        n_gt = 0 if im in (1, 7) else int(rng.integers(1, 7))
        gt_boxes, gt_cls, gt_kpts = [], [], []
        for _ in range(n_gt):
            w, h = rng.uniform(12, 120), rng.uniform(12, 120)
            x1, y1 = rng.uniform(0, W - w), rng.uniform(0, H - h)
            gt_boxes.append([x1, y1, x1 + w, y1 + h])
            # class nc - 1 never has ground truth; class 0 most often
            gt_cls.append(int(rng.choice(nc - 1, p=None if nc < 3 else [0.6] + [0.4 / (nc - 2)] * (nc - 2))))
            k = np.stack([rng.uniform(x1, x1 + w, nk), rng.uniform(y1, y1 + h, nk), rng.choice([0, 1, 2], nk, p=[0.3, 0.2, 0.5])], 1)
            k[k[:, 2] == 0, :2] = 0.0
            gt_kpts.append(k)
        pred_boxes, pred_cls, pred_kpts, conf = [], [], [], []
        if im != 4:  # image 4: ground truth, no detections
            for g in range(n_gt):
                if gt_cls[g] == 1 and nc > 3:
                    continue  # class 1: ground truth never detected
                for _ in range(int(rng.integers(0, 3))):  # 0-2 detections per object
                    b = np.array(gt_boxes[g])
                    s = max(b[2] - b[0], b[3] - b[1])
                    b = b + rng.normal(0, 0.08 * s, 4)
                    b[2:] = np.maximum(b[2:], b[:2] + 1)
                    pred_boxes.append(b)
                    pred_cls.append(gt_cls[g] if rng.uniform() > 0.15 else int(rng.integers(0, nc)))
                    k = gt_kpts[g].copy()
                    k[:, :2] = np.where(k[:, 2:] > 0, k[:, :2], rng.uniform(0, W, (nk, 2)))
                    k[:, :2] += rng.normal(0, 0.05 * s, (nk, 2))
                    k[:, 2] = rng.uniform(0, 1, nk)
                    pred_kpts.append(k)
            for _ in range(int(rng.integers(0, 4))):  # false positives anywhere, some past the border
                w, h = rng.uniform(10, 100), rng.uniform(10, 100)
                x1, y1 = rng.uniform(-20, W - w + 20), rng.uniform(-20, H - h + 20)
                pred_boxes.append([x1, y1, x1 + w, y1 + h])
                pred_cls.append(int(rng.integers(0, nc)))
                pred_kpts.append(np.stack([rng.uniform(x1, x1 + w, nk), rng.uniform(y1, y1 + h, nk), rng.uniform(0, 1, nk)], 1))
        n = len(pred_boxes)
        conf = np.sort(confs[ci : ci + n])[::-1]  # detections in descending confidence, as NMS leaves them
        ci += n
        images.append(
            dict(
                gt_boxes=f32(gt_boxes).reshape(-1, 4),
                gt_cls=np.array(gt_cls, dtype=np.float32),
                gt_kpts=f32(gt_kpts).reshape(-1, nk, 3),
                pred_boxes=f32(pred_boxes).reshape(-1, 4),
                pred_cls=np.array(pred_cls, dtype=np.float32),
                pred_kpts=f32(pred_kpts).reshape(-1, nk, 3),
                conf=f32(conf),
            )
        )
    # Two ground truths tied for the first detection (IoU 0.6 each), the second detection
    # overlapping only the first of them: which one the tie goes to decides the second's match.
    gk = np.stack([np.linspace(6, 30, nk), np.full(nk, 10.0), np.full(nk, 2.0)], 1)
    images.append(
        dict(
            gt_boxes=f32([[5, 0, 25, 20], [15, 0, 35, 20]]),
            gt_cls=np.zeros(2, dtype=np.float32),
            gt_kpts=f32([gk, gk + [4, 0, 0]]),
            pred_boxes=f32([[10, 0, 30, 20], [4, 0, 24, 20]]),
            pred_cls=np.zeros(2, dtype=np.float32),
            pred_kpts=f32([gk + [2, 0, 0], gk + [0.5, 0, 0]]),
            conf=f32([0.9999, 0.9998]),
        )
    )
    # An exact duplicate of a detection at a lower confidence (an IoU tie between two detections).
    im = images[0]
    if len(im["pred_boxes"]):
        for key in ("pred_boxes", "pred_cls", "pred_kpts"):
            im[key] = np.concatenate([im[key], im[key][:1]])
        im["conf"] = np.concatenate([im["conf"], f32([im["conf"][-1] * 0.5])])
    return images


def score(images, nk, nc):
    v = PoseValidator()
    v.sigma = OKS_SIGMA if nk == 17 else np.ones(nk) / nk
    metrics = PoseMetrics(names={i: str(i) for i in range(nc)})
    out = []
    for im in images:
        preds = {
            "bboxes": torch.from_numpy(im["pred_boxes"]),
            "cls": torch.from_numpy(im["pred_cls"]),
            "conf": torch.from_numpy(im["conf"]),
            "keypoints": torch.from_numpy(im["pred_kpts"]),
        }
        batch = {
            "bboxes": torch.from_numpy(im["gt_boxes"]),
            "cls": torch.from_numpy(im["gt_cls"]),
            "keypoints": torch.from_numpy(im["gt_kpts"]),
        }
        tp = v._process_batch(preds, batch)
        record = {k: v2.tolist() for k, v2 in im.items()}
        record["tp"] = tp["tp"].astype(int).tolist()
        record["tp_p"] = tp["tp_p"].astype(int).tolist()
        if len(im["gt_boxes"]) and len(im["pred_boxes"]):
            record["iou"] = box_iou(batch["bboxes"], preds["bboxes"]).tolist()
            area = ops.xyxy2xywh(batch["bboxes"])[:, 2:].prod(1) * 0.53
            record["oks"] = kpt_iou(batch["keypoints"], preds["keypoints"], sigma=v.sigma, area=area).tolist()
        out.append(record)
        no_pred = len(im["pred_cls"]) == 0
        metrics.update_stats(
            {
                **tp,
                "target_cls": im["gt_cls"],
                "target_img": np.unique(im["gt_cls"]),
                "conf": np.zeros(0) if no_pred else im["conf"],
                "pred_cls": np.zeros(0) if no_pred else im["pred_cls"],
                "im_name": "x.jpg",
            }
        )
    metrics.process()
    summary = {
        "box": {
            "map50": float(metrics.box.map50),
            "map75": float(metrics.box.map75),
            "map": float(metrics.box.map),
            "ap": metrics.box.all_ap.tolist(),
            "classes": [int(c) for c in metrics.box.ap_class_index],
        },
        "pose": {
            "map50": float(metrics.pose.map50),
            "map75": float(metrics.pose.map75),
            "map": float(metrics.pose.map),
            "ap": metrics.pose.all_ap.tolist(),
            "classes": [int(c) for c in metrics.pose.ap_class_index],
        },
    }
    return out, summary, v.iouv.tolist()


def main():
    cases = []
    for seed, nk, nc, n_images in [(0, 17, 4, 14), (1, 4, 2, 9)]:
        rng = np.random.default_rng(seed)
        images = scene(rng, nk, nc, n_images)
        per_image, summary, iouv = score(images, nk, nc)
        cases.append({"seed": seed, "nk": nk, "nc": nc, "images": per_image, "summary": summary})
    meta = {"ultralytics": ultralytics.__version__, "torch": torch.__version__, "numpy": np.__version__}
    with open(sys.argv[1], "w") as f:
        json.dump({"meta": meta, "iouv": iouv, "cases": cases}, f)


if __name__ == "__main__":
    main()
