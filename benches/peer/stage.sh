#!/usr/bin/env bash
# Download, here, the wheels Ultralytics needs on the GPU machine beyond what its image holds
# (torch, torchvision, opencv-python-headless, matplotlib, numpy, pyyaml, requests, psutil,
# pillow, nvidia-ml-py, httpx are there: ../.library/device/KINDS.md). polars is replaced by
# benches/peer/stub (see its docstring). Output: .whl/ in the project root (git-ignored through
# .git/info/exclude), ~1.6 MB, to be carried with ".whl".
set -euo pipefail
cd "$(dirname "$0")/../.."
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo /.whl/ >> .git/info/exclude
python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d .whl ultralytics==8.4.190 ultralytics-thop==2.2.3 ultralytics-platform==0.1.99
ls -la .whl
