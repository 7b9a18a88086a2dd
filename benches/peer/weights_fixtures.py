"""Fixtures for the Ultralytics-weights parity tests (tests/ultralytics.rs, docs/weights.md).

Builds YOLO26n-pose (nc=1) from Ultralytics' own yaml with a fixed seed, gives it realistic
BatchNorm statistics (train-mode passes over real COCO images) and perturbed BatchNorm affine
parameters and conv biases (so that a swapped or missed tensor shows in the outputs), rounds every
weight to FP16 (the precision Ultralytics saves checkpoints in, so the saved file holds exactly the
weights the outputs were computed with), and writes into OUT:

- `yolo26n-pose.pt`: the model as Ultralytics' `Model.save` writes a checkpoint (pickled module,
  FP16);
- `outputs.safetensors` (FP32 values of a float64 forward): for the pose model and the detection model built from the same
  weights (`yolo26n.yaml`, nc=1, its head's keys being a subset of the pose head's), in eval and
  in train mode, the raw head outputs `{task}.{mode}.{one2many|one2one}.{boxes|scores|kpts|
  kpts_sigma}`, and in eval mode the end-to-end detections `{task}.eval.end2end`
  ([B, 300, 6 (+ nk)]: x1, y1, x2, y2, score, class, keypoints);
- the training loss (Ultralytics' E2ELoss at its initial one-to-many weight) of both models on
  fixed seeded targets (`meta.json`'s `targets`): `{task}.loss.total`, `{task}.loss.items` (the
  one-to-one terms, gain-weighted, as Ultralytics logs them) and every parameter's gradient norm
  `{task}.grad_norms` (names in `meta.json`'s `grad_norm_names`), all computed in float64;
- `meta.json`: versions, seed, the calibration images, the targets.

The input is two real COCO images letterboxed to 160 px by burnpose itself (the test builds the
same tensor from `../shared/data`, so no image is committed): write it first with
    BURNPOSE_FIXTURE_INPUT=/tmp/input.safetensors \
        cargo test --test ultralytics write_fixture_input -- --ignored
then, with the peer venv (docs/bench.md, "On the CPU"), offline:
    YOLO_OFFLINE=1 YOLO_CONFIG_DIR=DIR python benches/peer/weights_fixtures.py \
        ../shared/data/pose-real/pose_minicoco/images/train2017 /tmp/input.safetensors \
        tests/fixtures/ultralytics
"""

import argparse
import copy
import json
import os
import sys
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("images", type=Path, help="folder of real COCO images (BatchNorm statistics)")
    ap.add_argument("input", type=Path, help="the test input written by write_fixture_input")
    ap.add_argument("out", type=Path)
    ap.add_argument("--size", type=int, default=160, help="calibration image size")
    ap.add_argument("--batch", type=int, default=2, help="images skipped: the test's own")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    os.environ.setdefault("YOLO_OFFLINE", "1")

    import cv2
    import ultralytics
    from ultralytics import YOLO
    from ultralytics.data.augment import LetterBox
    from ultralytics.nn.tasks import DetectionModel, PoseModel

    torch.manual_seed(args.seed)
    np.random.seed(args.seed)
    torch.use_deterministic_algorithms(True)

    files = sorted(args.images.glob("*.jpg"))
    if len(files) < args.batch + 8:
        sys.exit(f"need at least {args.batch + 8} images in {args.images}")

    def load(paths):
        lb = LetterBox((args.size, args.size), auto=False, stride=32)
        ims = [lb(image=cv2.imread(str(p)))[..., ::-1] for p in paths]  # BGR -> RGB
        x = np.stack(ims).transpose(0, 3, 1, 2).astype(np.float32) / 255.0
        return torch.from_numpy(np.ascontiguousarray(x))

    # The yaml's nc is 80; our built-in data and COCO keypoints have one class (person).
    yolo = YOLO("yolo26n-pose.yaml")
    model = PoseModel("yolo26n-pose.yaml", nc=1, verbose=False).float()
    model.args = yolo.model.args

    # Realistic running statistics: a few train-mode passes over other images with momentum 1
    # (each BatchNorm keeps the last batch's statistics), then seeded perturbations of every
    # BatchNorm's affine parameters and every conv bias.
    bns = [m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    for m in bns:
        m.momentum = 1.0
    model.train()
    with torch.no_grad():
        calib = load(files[args.batch : args.batch + 8])
        model(calib)
    for m in bns:
        m.momentum = 0.03
    g = torch.Generator().manual_seed(args.seed)
    with torch.no_grad():
        for m in bns:
            m.weight.copy_(0.75 + 0.5 * torch.rand(m.weight.shape, generator=g))
            m.bias.copy_(0.2 * torch.rand(m.bias.shape, generator=g) - 0.1)
        for m in model.modules():
            if isinstance(m, torch.nn.Conv2d) and m.bias is not None:
                m.bias.add_(0.1 * torch.rand(m.bias.shape, generator=g) - 0.05)
        # Checkpoints hold FP16: the outputs are computed with the weights the file will hold.
        for t in model.state_dict().values():
            if t.is_floating_point():
                t.copy_(t.half().float())

    x = load_file(str(args.input))["input"]
    tensors = {}
    detect = DetectionModel("yolo26n.yaml", nc=1, verbose=False).float()
    dsd = detect.state_dict()
    detect.load_state_dict({k: v for k, v in model.state_dict().items() if k in dsd}, strict=True)

    targets = fixed_targets(args.seed + 1)
    for task, net in (("pose", model), ("detect", detect)):
        record(tensors, task, net, x)
    names = {}
    for task, net in (("pose", model), ("detect", detect)):
        names[task] = record_loss(tensors, task, net, x, targets)

    args.out.mkdir(parents=True, exist_ok=True)
    yolo.model = model
    yolo.save(str(args.out / "yolo26n-pose.pt"))
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(args.out / "outputs.safetensors"))
    meta = {
        "ultralytics": ultralytics.__version__,
        "torch": torch.__version__,
        "seed": args.seed,
        "size": args.size,
        "input_shape": list(x.shape),
        "calibration_images": [p.name for p in files[args.batch : args.batch + 8]],
        "targets": targets,
        "grad_norm_names": names,
        "script": "benches/peer/weights_fixtures.py",
    }
    (args.out / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    print(f"wrote {args.out}: {len(tensors)} output tensors")


def record(tensors, task, model, x):
    # The reference is the exact function of these weights: Ultralytics' forward in float64
    # (its float32 forward is itself 6e-6 (eval) and 8e-5 (train mode) from it; docs/weights.md).
    model = copy.deepcopy(model).double()
    x = x.double()
    head = model.model[-1]
    with torch.no_grad():
        model.eval()
        head.end2end = False
        _, preds = model(x)
        put(tensors, f"{task}.eval", preds)
        head.end2end = True
        tensors[f"{task}.eval.end2end"] = model(x)[0].float()
        head.end2end = False
        # Train mode normalises with the batch's statistics (and updates the running ones: a copy).
        train = copy.deepcopy(model).train()
        put(tensors, f"{task}.train", train(x))


def fixed_targets(seed, size=160):
    """Seeded people in the letterboxed images' pixels (multiples of 1/16 px, exact in both
    languages): per instance the image, class, xyxy box and 17 keypoints (x, y, visibility 0/1/2)."""
    g = torch.Generator().manual_seed(seed)
    rnd = lambda: torch.rand(1, generator=g).item()
    r = lambda v: round(v * 16) / 16
    targets = []
    for img in range(2):
        for _ in range(2 + img):
            w, h = 24 + 80 * rnd(), 40 + 90 * rnd()
            x1, y1 = (size - w) * rnd(), (size - h) * rnd()
            box = [r(x1), r(y1), r(x1 + w), r(y1 + h)]
            kpts = []
            for _ in range(17):
                v = int(torch.randint(0, 3, (1,), generator=g).item())
                if v == 0:
                    kpts.append([0.0, 0.0, 0])
                else:
                    kx = r(box[0] + (box[2] - box[0]) * rnd())
                    ky = r(box[1] + (box[3] - box[1]) * rnd())
                    kpts.append([kx, ky, v])
            targets.append({"image": img, "class": 0, "box": box, "keypoints": kpts})
    return targets


def record_loss(tensors, task, model, x, targets, size=160):
    """Ultralytics' training loss (E2ELoss at its initial one-to-many weight 0.8) on `targets`,
    in float64 (`torch.set_default_dtype`: the loss makes its own tensors), and every parameter's
    gradient norm after `loss.sum().backward()`; returns the parameter names in order."""
    from ultralytics.cfg import get_cfg

    torch.set_default_dtype(torch.float64)
    try:
        m = copy.deepcopy(model).double().train()
        m.args = get_cfg()
        m.criterion = None
        f = torch.float64
        batch = {
            "batch_idx": torch.tensor([t["image"] for t in targets], dtype=f),
            "cls": torch.tensor([[t["class"]] for t in targets], dtype=f),
            "bboxes": torch.tensor(
                [
                    [(b[0] + b[2]) / 2 / size, (b[1] + b[3]) / 2 / size, (b[2] - b[0]) / size, (b[3] - b[1]) / size]
                    for b in (t["box"] for t in targets)
                ],
                dtype=f,
            ),
        }
        if task == "pose":
            batch["keypoints"] = torch.tensor(
                [[[k[0] / size, k[1] / size, k[2]] for k in t["keypoints"]] for t in targets], dtype=f
            )
        loss, items = m.loss(batch, m(x.double()))
        loss.sum().backward()
        tensors[f"{task}.loss.total"] = loss.sum().detach().reshape(1).float()
        tensors[f"{task}.loss.items"] = torch.stack(list(items.values())).float()
        named = [(n, p) for n, p in m.named_parameters() if p.grad is not None]
        tensors[f"{task}.grad_norms"] = torch.tensor([float(p.grad.norm()) for _, p in named], dtype=torch.float32)
        return [n for n, _ in named]
    finally:
        torch.set_default_dtype(torch.float32)


def put(tensors, prefix, preds):
    for copy_name in ("one2many", "one2one"):
        for k in ("boxes", "scores", "kpts", "kpts_sigma"):
            if k in preds[copy_name]:
                tensors[f"{prefix}.{copy_name}.{k}"] = preds[copy_name][k].float()


if __name__ == "__main__":
    main()
