"""Ultralytics' own strict loader on a burnpose export (docs/weights.md, "Export").

Loads the safetensors state dict that `burnpose export --format ultralytics` (here: the test
`write_exported_fixture_model`, the fixture model) writes into Ultralytics' PoseModel with
`strict=True`, saves it as an Ultralytics checkpoint, loads that back through `YOLO(...)`, and
compares its float64 eval outputs on the fixtures' input with the committed fixtures:

    BURNPOSE_EXPORT=/tmp/export.safetensors \\
        cargo test --test ultralytics write_exported_fixture_model -- --ignored
    YOLO_OFFLINE=1 YOLO_CONFIG_DIR=DIR python benches/peer/weights_roundtrip.py \\
        /tmp/export.safetensors /tmp/input.safetensors tests/fixtures/ultralytics
"""

import argparse
import os
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("export", type=Path)
    ap.add_argument("input", type=Path)
    ap.add_argument("fixtures", type=Path)
    args = ap.parse_args()
    os.environ.setdefault("YOLO_OFFLINE", "1")
    from ultralytics import YOLO
    from ultralytics.nn.tasks import PoseModel

    yolo = YOLO("yolo26n-pose.yaml")
    yolo.model = PoseModel("yolo26n-pose.yaml", nc=1, verbose=False)
    yolo.model.load_state_dict(load_file(str(args.export)), strict=True)
    with tempfile.TemporaryDirectory() as tmp:
        pt = Path(tmp) / "model.pt"
        yolo.save(str(pt))
        model = YOLO(str(pt)).model.double().eval()
    x = load_file(str(args.input))["input"].double()
    fx = load_file(str(args.fixtures / "outputs.safetensors"))
    with torch.no_grad():
        _, preds = model(x)
    worst = 0.0
    for copy_name in ("one2many", "one2one"):
        for k in ("boxes", "scores", "kpts"):
            theirs = preds[copy_name][k].float()
            ref = fx[f"pose.eval.{copy_name}.{k}"]
            err = float(((theirs - ref).abs() / ref.abs().clamp(min=1)).max())
            print(f"{copy_name}.{k}: {err:.2e}")
            worst = max(worst, err)
    print(f"worst {worst:.2e}")
    assert worst <= 1e-4, worst


if __name__ == "__main__":
    main()
