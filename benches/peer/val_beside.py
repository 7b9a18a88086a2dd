"""`burnpose val` beside Ultralytics' own `val` on weights Ultralytics trained (docs/weights.md,
"Validation beside Ultralytics").

Converts `pose_minicoco`'s train2017 split to a YOLO dataset with Ultralytics' converter, trains
YOLO26n-pose on it with Ultralytics (CPU, no augmentation, validating on the same images: an
overfit model with non-trivial mAP), then validates `last.pt` with Ultralytics (its default
one-to-many head + NMS, and `nms=False`: the one-to-one head) and with `burnpose val` on the same
YOLO dataset (`train.val_nms` for the same two heads, each under `train.val_metric = "ultralytics"`
and `"coco"`), and prints one table. Every run validates at 320 px in batches of 4.

Run with the peer venv's Python (docs/bench.md, "On the CPU"); it sets YOLO_OFFLINE and its own
YOLO_CONFIG_DIR with matplotlib's DejaVu Sans as the font Ultralytics would download:
    VENV/bin/python benches/peer/val_beside.py --burnpose target/release/burnpose \
        --data ../shared/data/pose-real/pose_minicoco --out /tmp/val-beside [--epochs 80]
A second run with the same --out and --epochs reuses the trained weights.
"""

import argparse
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path


def setup(out: Path):
    cfg = out / "yolo-config"
    (cfg / "Ultralytics").mkdir(parents=True, exist_ok=True)
    import matplotlib

    font = Path(matplotlib.get_data_path()) / "fonts/ttf/DejaVuSans.ttf"
    shutil.copy(font, cfg / "Ultralytics/Arial.ttf")
    os.environ["YOLO_OFFLINE"] = "1"
    os.environ["YOLO_CONFIG_DIR"] = str(cfg)


def dataset(data: Path, out: Path) -> Path:
    from ultralytics.data.converter import convert_coco

    root = out / "yolo"
    yaml = root / "data.yaml"
    if yaml.exists():
        return yaml
    ann = out / "annotations"
    ann.mkdir(parents=True, exist_ok=True)
    shutil.copy(data / "annotations/person_keypoints_train2017.json", ann)
    convert_coco(str(ann), save_dir=str(out / "converted"), use_keypoints=True, cls91to80=False)
    shutil.copytree(data / "images/train2017", root / "images/train")
    shutil.copytree(out / "converted/labels/person_keypoints_train2017", root / "labels/train")
    flip = [0, 2, 1, 4, 3, 6, 5, 8, 7, 10, 9, 12, 11, 14, 13, 16, 15]
    yaml.write_text(
        f"path: {root}\ntrain: images/train\nval: images/train\nkpt_shape: [17, 3]\n"
        f"flip_idx: {flip}\nnames:\n  0: person\n"
    )
    return yaml


def train(yaml: Path, out: Path, epochs: int) -> Path:
    from ultralytics import YOLO

    name = f"train{epochs}"
    weights = out / name / "weights/last.pt"
    if weights.exists():
        return weights
    YOLO("yolo26n-pose.yaml").train(
        data=str(yaml), imgsz=320, batch=4, epochs=epochs, device="cpu", workers=2, seed=0,
        deterministic=True, amp=False, mosaic=0.0, fliplr=0.0, hsv_h=0, hsv_s=0, hsv_v=0,
        scale=0.0, translate=0.0, erasing=0.0, auto_augment=None, close_mosaic=0, plots=False,
        val=False, project=str(out), name=name, exist_ok=True,
    )
    return weights


def peer_val(yaml: Path, weights: Path, out: Path, nms) -> list:
    from ultralytics import YOLO

    r = YOLO(str(weights)).val(
        data=str(yaml), imgsz=320, batch=4, device="cpu", workers=0, plots=False, nms=nms,
        verbose=False, project=str(out), name="peer-val", exist_ok=True,
    )
    return [r.box.map50, r.box.map, r.pose.map50, r.pose.map]


def ours_val(burnpose: str, yaml: Path, weights: Path, out: Path, nms: bool, metric: str) -> list:
    config = out / f"val-{'nms' if nms else 'one2one'}-{metric}.toml"
    config.write_text(
        f'[data]\nsource = "yolo"\npath = "{yaml}"\nimgsz = 320\nworkers = 0\n'
        f'[train]\nbatch = 2\nval_nms = {str(nms).lower()}\nval_metric = "{metric}"\n'
    )
    text = subprocess.run(
        [burnpose, "val", str(config), "--checkpoint", str(weights)],
        check=True, capture_output=True, text=True,
    ).stdout
    m = re.search(r"box mAP50 ([\d.]+) mAP50-95 ([\d.]+) \| pose mAP50 ([\d.]+) mAP50-95 ([\d.]+)", text)
    return [float(v) for v in m.groups()]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--burnpose", required=True)
    ap.add_argument("--data", type=Path, required=True, help="pose_minicoco folder")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--epochs", type=int, default=80)
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    setup(a.out)
    yaml = dataset(a.data, a.out)
    weights = train(yaml, a.out, a.epochs)
    rows = []
    for nms, head in [(True, "one-to-many + NMS"), (False, "one-to-one")]:
        rows.append((head, "Ultralytics `val`", peer_val(yaml, weights, a.out, None if nms else False)))
        for metric in ("ultralytics", "coco"):
            rows.append((head, f"`burnpose val`, `val_metric = \"{metric}\"`", ours_val(a.burnpose, yaml, weights, a.out, nms, metric)))
    lines = [
        f"{weights} ({a.epochs} epochs), 320 px, batches of 4; mAP50 / mAP50-95",
        "",
        "| head | | box | pose |",
        "|---|---|---|---|",
    ]
    for head, who, v in rows:
        lines.append(f"| {head} | {who} | {v[0]:.4f} / {v[1]:.4f} | {v[2]:.4f} / {v[3]:.4f} |")
    text = "\n".join(lines) + "\n"
    (a.out / "val_beside.md").write_text(text)
    sys.stdout.write(text)


if __name__ == "__main__":
    main()
