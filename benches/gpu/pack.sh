#!/usr/bin/env bash
# Stage burnpose, the GPU test binary, the kernel cache and the COCO images for one device call:
# ../shared/tools/gpu-pack --tests --data, keep only the `gpu` test binary, then re-compress every
# staged binary stripped with xz and the kernel cache too (gzip'd as built the two binaries and
# the cache came to ~65 MB, over the 64 MiB carry; stripped and xz'd ~16 + 15 + 4 MB, so one call
# carries all of them). setup.sh unpacks with xz, or Python's lzma where the machine has no xz.
# usage, from the project root:  bash benches/gpu/pack.sh [gpu-pack options]
# then carry ".gpu" and start the device command with `source .gpu/setup.sh`.
# BASE_REV=<commit> also stages that commit's burnpose as .gpu/base/burnpose.xz (built first,
# in a worktree), so that one device call can alternate the base and the new binary
# (compare.sh BASE=1). The base builds in a target directory of its own (BASE_TARGET_DIR,
# default CARGO_TARGET_DIR with "-base"): cargo hashes a path package by its place in the
# workspace, so a worktree sharing the target directory shares its units, and the next build
# here took the base's binary as fresh. DATA=0 leaves ../shared/data out: with a base binary
# the tree is over the 64 MiB carry otherwise.
set -euo pipefail
base_bin=
if [ -n "${BASE_REV:-}" ]; then
  base_target=$(realpath -m "${BASE_TARGET_DIR:-${CARGO_TARGET_DIR:-target}-base}")
  grep -qx '/target-base/' .git/info/exclude 2>/dev/null || echo '/target-base/' >> .git/info/exclude
  src=$(mktemp -d)/base
  git worktree add --detach "$src" "$BASE_REV" > /dev/null
  (cd "$src" && CARGO_TARGET_DIR=$base_target cargo build --release --locked --features cuda --bin burnpose)
  base_bin=$(mktemp)
  strip -o "$base_bin" "$base_target/release/burnpose"
  git worktree remove --force "$src"
fi
data=--data; [ "${DATA:-1}" = 0 ] && data=
../shared/tools/gpu-pack --tests $data "$@"
find .gpu/tests -type f ! -name 'gpu-*' -delete
for gz in .gpu/bin/*.gz .gpu/tests/*.gz; do
  [ -e "$gz" ] || continue
  name=$(basename "$gz" .gz)
  case "$gz" in
    .gpu/bin/*) exe=${CARGO_TARGET_DIR:-target}/release/$name ;;
    *) exe=${CARGO_TARGET_DIR:-target}/release/deps/$name ;;
  esac
  strip -o "${gz%.gz}" "$exe"
  xz -9 -T0 "${gz%.gz}"
  rm "$gz"
done
if [ -n "$base_bin" ]; then
  mkdir -p .gpu/base && xz -9 -T0 -c "$base_bin" > .gpu/base/burnpose.xz && rm "$base_bin"
fi
if [ -f .gpu/kcache.tgz ]; then
  gunzip -c .gpu/kcache.tgz | xz -9 -T0 > .gpu/kcache.tar.xz
  rm .gpu/kcache.tgz
fi
cat > .gpu/setup.sh <<'SETUP'
# sourced on the GPU machine from the project root
unxz_to() { if command -v xz > /dev/null; then xz -dc "$1" > "$2"; else
  python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' "$1" "$2"; fi; }
mkdir -p /tmp/gpu/bin /tmp/gpu/tests
for f in .gpu/bin/*.xz .gpu/tests/*.xz; do
  [ -e "$f" ] || continue
  d=/tmp/gpu/$(basename "$(dirname "$f")"); unxz_to "$f" "$d/$(basename "$f" .xz)"; chmod +x "$d/$(basename "$f" .xz)"
done
export PATH=/tmp/gpu/bin:$PATH CUDA_PATH=/usr/local/cuda
T=$(ls /tmp/gpu/tests/gpu-* 2>/dev/null | head -1); export T
if [ -f .gpu/kcache.tar.xz ]; then mkdir -p ~/.cache && unxz_to .gpu/kcache.tar.xz /tmp/kcache.tar && tar xf /tmp/kcache.tar -C ~/.cache; fi
if [ -d .gpu/data ] && [ ! -e ../shared/data ]; then mkdir -p ../shared && ln -s "$PWD/.gpu/data" ../shared/data; fi
SETUP
du -sh .gpu
