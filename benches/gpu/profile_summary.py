#!/usr/bin/env python3
"""Sums the folded stacks of `burnpose bench-step --profile PATH` (PATH.folded) into tables:
samples per thread, self time per layer (the crate of the innermost frame), and inclusive time
of the functions that mark where a step spends its host time.

usage: python3 benches/gpu/profile_summary.py PATH.folded [--steps N]
"""
import re
import sys
from collections import Counter

# Innermost-frame prefixes, first match wins: which layer the CPU was in.
LAYERS = [
    ("burn-autodiff (tape, graph, checkpointing)", r"^<?burn_autodiff"),
    ("burn-cubecl (op dispatch to kernels)", r"^<?burn_cubecl"),
    ("cubecl-runtime / server (launch path, memory pool)", r"^<?cubecl_(runtime|server)"),
    ("cubecl-cuda (CUDA server, driver calls)", r"^<?cubecl_cuda"),
    ("cubecl-core / std / ir (kernel building, ids)", r"^<?cubecl_(core|std|ir|zspace|common|opt)"),
    ("burn tensor front end (burn_tensor/backend/dispatch/std)", r"^<?burn_(tensor|backend|dispatch|std|ir|core|nn|optim)"),
    ("burnpose (our code)", r"^<?burnpose"),
    ("cudarc", r"^<?cudarc"),
    ("allocation (malloc/free)", r"(malloc|free|realloc|alloc::|__rust_(alloc|dealloc|realloc)|_int_)"),
    ("hashing / maps", r"(hashbrown|core::hash|std::collections::hash|ahash|foldhash)"),
    ("sync (mutex, condvar, channels, futex)", r"(futex|parking_lot|std::sync|crossbeam|Mutex|Condvar|spin)"),
    ("std / core / alloc (other)", r"^<?(std|core|alloc)::"),
]
# Functions whose inclusive samples show what a step does.
MARKERS = [
    r"Trainer::train_step",
    r"FeatureStage::forward",
    r"Head::forward",
    r"E2eLoss::targets",
    r"E2eLoss::compute",
    r"autodiff::.*backward|burn_autodiff::runtime::.*execute|Tensor<.*>::backward",
    r"FeatureStage::backward",
    r"Trainer::optimizer_step",
    r"Trainer::accumulate",
    r"into_data|read_sync|sync",
    r"cubecl_runtime::.*launch|ComputeClient.*launch|launch_unchecked|execute",
    r"memory_management|MemoryPool|SlicedPool|MemoryManagement",
    r"cuLaunchKernel|cuMemcpy|cuStream|libcuda",
]


def main():
    path = sys.argv[1]
    steps = int(sys.argv[sys.argv.index("--steps") + 1]) if "--steps" in sys.argv else None
    threads, layers, markers = Counter(), Counter(), Counter()
    total = 0
    for line in open(path):
        stack, _, count = line.rstrip("\n").rpartition(" ")
        n = int(count)
        frames = stack.split(";")
        thread, frames = frames[0], frames[1:]
        total += n
        threads[thread] += n
        inner = frames[-1] if frames else ""
        for name, pat in LAYERS:
            if re.search(pat, inner):
                layers[name] += n
                break
        else:
            layers["other: " + (inner[:60] or "(no frames)")] += n
        whole = ";".join(frames)
        for m in MARKERS:
            if re.search(m, whole):
                markers[m] += n
    per = f" ({total / steps:.1f} samples ≈ ms per step)" if steps else ""
    print(f"{total} samples{per}\n")
    print("| thread | samples | share |\n|---|---|---|")
    for t, n in threads.most_common(8):
        print(f"| {t} | {n} | {100 * n / total:.1f} % |")
    print("\n| innermost layer (self time) | samples | share |\n|---|---|---|")
    shown = 0
    for name, n in layers.most_common():
        if shown >= 16:
            break
        shown += 1
        print(f"| {name} | {n} | {100 * n / total:.1f} % |")
    print("\n| stacks containing | samples | share |\n|---|---|---|")
    for m in MARKERS:
        print(f"| `{m}` | {markers[m]} | {100 * markers[m] / total:.1f} % |")


if __name__ == "__main__":
    main()
