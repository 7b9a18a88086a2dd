#!/usr/bin/env bash
# Stage burnpose and the GPU test binary for one device call, small enough to carry together with
# the kernel cache: ../shared/tools/gpu-pack --tests, keep only the `gpu` test binary, then
# re-compress every staged binary stripped (27 + 26 MB gzip'd as built, 23 + 22 MB stripped; with
# the ~15 MB kernel cache only the stripped pair fits the 64 MiB carry).
# usage, from the project root:  bash benches/gpu/pack.sh [gpu-pack options]
# then carry ".gpu" and start the device command with `source .gpu/setup.sh`.
set -euo pipefail
../shared/tools/gpu-pack --tests "$@"
find .gpu/tests -type f ! -name 'gpu-*' -delete
tmp=$(mktemp)
trap 'rm -f "$tmp"' EXIT
for gz in .gpu/bin/*.gz .gpu/tests/*.gz; do
  [ -e "$gz" ] || continue
  name=$(basename "$gz" .gz)
  case "$gz" in
    .gpu/bin/*) exe=${CARGO_TARGET_DIR:-target}/release/$name ;;
    *) exe=${CARGO_TARGET_DIR:-target}/release/deps/$name ;;
  esac
  strip -o "$tmp" "$exe"
  gzip -9 -c "$tmp" > "$gz"
done
du -sh .gpu
